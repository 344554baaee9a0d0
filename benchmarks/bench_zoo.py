#!/usr/bin/env python
"""The model zoo through graphswap, full size: convert report summaries and inference times.

    python benchmarks/bench_zoo.py [--models MobileNetV2,ResNet50,EfficientNetB0,ViT]
                                   [--multiplier mul8s_drum4] [--batch 8] [--size 224]

For each model (keras.applications with weights=None, nothing downloaded; the ViT is a ViT-Ti/16
style model built from MultiHeadAttention + Dense): the per-model `graphswap convert` report
summary line (share of the weight multiply-accumulates on the kernel), then inference time per
batch of the float model, the exact-kernel rewrite and the LUT-multiplier rewrite, measured side by
side in one process (median of repeated calls, best of rounds), with their ratios to float.
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from _timing import machine_line, median_times, run_context, use_repository_package  # noqa: E402

use_repository_package()

import numpy as np  # noqa: E402

from _models import build  # noqa: E402  (benchmarks/ is on sys.path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--models", default="MobileNetV2,ResNet50,EfficientNetB0,ViT")
    parser.add_argument("--multiplier", default="mul8s_drum4")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    import graphswap

    print(run_context())
    print(machine_line())
    print(f"input {args.size}x{args.size}x3, batch {args.batch}, multiplier {args.multiplier}")
    rows = []
    for name in args.models.split(","):
        model = build(name.strip(), args.size)
        exact, report = graphswap.rewrite_model(model, return_report=True)
        lut = graphswap.rewrite_model(model, kernel=args.multiplier)
        print(f"{name}: {len(report.swapped)} layers swapped; {report.summary_line()}")
        x = np.random.default_rng(0).uniform(0, 1, (args.batch, args.size, args.size, 3)).astype(
            np.float32)

        def runner(m):
            return lambda: m(x, training=False).numpy()

        times = median_times([runner(model), runner(exact), runner(lut)], reps=5, budget=20.0,
                             rounds=args.rounds)
        rows.append((name, *times))
    print()
    print(f"{'model':<16}{'float s/batch':>15}{'exact s/batch':>15}{'LUT s/batch':>13}"
          f"{'exact/float':>13}{'LUT/float':>11}")
    for name, t_float, t_exact, t_lut in rows:
        print(f"{name:<16}{t_float:>15.3f}{t_exact:>15.3f}{t_lut:>13.3f}"
              f"{t_exact / t_float:>13.2f}{t_lut / t_float:>11.2f}")


if __name__ == "__main__":
    main()
