#!/usr/bin/env python
"""The "output" calibration method against "percentile" on the shipped digits models: zero-step
test accuracy (%) of `rewrite_model(model, kernel, calibration_data=x_train,
calibration_method=M)` with every other setting at its default, on the 360 test images of
sample_models/digits.npz (one image = 0.28 points).  docs/RECOVERY.md quotes its output.

    python benchmarks/calibration_output_digits.py        # about 15 minutes on 2 cores
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import REPO, run_context, use_repository_package  # noqa: E402

use_repository_package()

MULTIPLIERS = ("mul8u_drum4", "mul8s_trunc3", "mul8u_gsloa11.c", "mul8s_gsloa11.c",
               "mul8u_gsot45.c", "mul8s_gsot36.c")


def main():
    import graphswap

    print(run_context())
    digits = np.load(REPO / "sample_models" / "digits.npz")
    x_train, x_test = digits["x_train"], digits["x_test"]
    y_test = digits["y_test"].reshape(-1)
    print("| model | multiplier | percentile | output |")
    print("|---|---|---|---|")
    for name in ("lenet5", "cnn_bn"):
        model = graphswap.load_model(REPO / "sample_models" / f"{name}.keras")
        for multiplier in MULTIPLIERS:
            kernel = (str(REPO / "sample_models" / "multipliers" / multiplier)
                      if multiplier.endswith(".c") else multiplier)
            scores = []
            for method in ("percentile", "output"):
                swapped = graphswap.rewrite_model(model, kernel=kernel, calibration_data=x_train,
                                                  calibration_method=method)
                predicted = np.asarray(swapped.predict(x_test, batch_size=128, verbose=0))
                scores.append(100.0 * float(np.mean(predicted.argmax(axis=1) == y_test)))
            print(f"| {name} | {multiplier} | {scores[0]:.2f} | {scores[1]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
