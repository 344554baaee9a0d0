"""The 8-bit floating-point rows of docs/RECOVERY.md ("8-bit floating point"): the sample models
with fp8_e4m3, fp8_e5m2 and the shipped approximate E4M3 multiplier, through the same zero-step
and fine-tuning protocol as benchmarks/recovery_table.py (static calibration on the first 512
training images, the default bias compensation, the default fine-tuning recipe, seed 0), plus
the seconds one forward pass over the 360 test images takes (the C kernels, this machine).

    python benchmarks/fp8_recovery.py            # prints the markdown table
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import graphswap  # noqa: E402
from graphswap import kernels  # noqa: E402

CALIBRATION_SAMPLES = 512
MITCHELL = REPO / "sample_models" / "multipliers" / "fp8_e4m3_mitchell.c"
SPECS = ("fp8_e4m3", "fp8_e5m2", f"fp8_e4m3:{MITCHELL}")
MODELS = ("lenet5", "cnn_bn")


def mean_relative_error(spec) -> float:
    """Mean |T - exact| / |exact| over the finite, non-zero exact products (percent)."""
    kernel = kernels.resolve_kernel(spec)
    exact = kernel.exact_products().products_table().astype(np.float64)
    table = kernel.products_table().astype(np.float64)
    use = np.isfinite(exact) & (exact != 0)
    return float(100 * np.mean(np.abs(table[use] - exact[use]) / np.abs(exact[use])))


def accuracy(model, x, y) -> float:
    predictions = np.concatenate([np.asarray(model(x[i:i + 128], training=False))
                                  for i in range(0, len(x), 128)])
    return round(100.0 * float(np.mean(predictions.argmax(axis=1) == y)), 2)


def main() -> None:
    with np.load(REPO / "sample_models" / "digits.npz") as data:
        data = {k: data[k] for k in data.files}
    x, y = data["x_test"], data["y_test"]
    calibration = data["x_train"][:CALIBRATION_SAMPLES]
    header = ["model", "multiplier", "MRE%", "float", "dynamic", "calibrated", "+ bias comp.",
              "STE 1", "STE 3", "forward s"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in MODELS:
        model = keras.models.load_model(REPO / "sample_models" / f"{name}.keras")
        bn = any(isinstance(layer, keras.layers.BatchNormalization) for layer in model.layers)
        for spec in SPECS:
            row = [name, os.path.basename(spec), f"{mean_relative_error(spec):.1f}",
                   f"{accuracy(model, x, y):.2f}"]
            row.append(f"{accuracy(graphswap.rewrite_model(model, kernel=spec), x, y):.2f}")
            # calibration alone: compensation is the default whenever calibration data is given
            calibrated = graphswap.rewrite_model(model, kernel=spec, calibration_data=calibration,
                                                 bias_correction=None)
            row.append(f"{accuracy(calibrated, x, y):.2f}")

            def start():
                return graphswap.rewrite_model(
                    model, kernel=spec, calibration_data=calibration,
                    bias_correction=graphswap.research.DEFAULT_BIAS_CORRECTION,
                    recalibrate_bn=bn)
            compensated = start()
            row.append(f"{accuracy(compensated, x, y):.2f}")
            for epochs in (1, 3):
                result = graphswap.finetune(start(), (data["x_train"], data["y_train"]),
                                            epochs=epochs, seed=0, verbose=0,
                                            restore_best=False)
                row.append(f"{accuracy(result.model, x, y):.2f}")
            started = time.perf_counter()
            accuracy(compensated, x, y)
            row.append(f"{time.perf_counter() - started:.2f}")
            lines.append("| " + " | ".join(row) + " |")
            print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
