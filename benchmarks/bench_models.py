#!/usr/bin/env python
"""Larger models through graphswap, against the float model in the same run, the way users run
them (inside a tf.function, as fit/predict do):

    ResNet-8 (32x32x3)  MobileNetV2 (224x224)  ResNet-50 (224x224)   keras.applications /
    benchmarks/_models.py, random weights (weights=None: nothing downloaded); also Xception
    (SeparableConv2D) and a ViT-Ti/16 (MultiHeadAttention) on request

For each model: inference per batch (tf.function forward) and one training step (tf.function:
forward, GradientTape, SGD apply) of the float model, the exact-kernel rewrite, the
LUT-multiplier rewrite (per-call ranges), the same multiplier calibrated (static ranges on 16
random inputs, --calibrate DATA's mode) and with TFApprox's asymmetric weights, with their ratios
to float.  Times are medians of repeated calls, the variants alternating in blocks, best of
`--rounds` (benchmarks/_timing.py).

    python benchmarks/bench_models.py [--models ResNet8,MobileNetV2,ResNet50,Xception,ViT]
        [--multiplier mul8u_drum4] [--batch 32] [--big-batch 8] [--rounds 2] [--no-train]
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from _timing import machine_line, median_times, run_context, use_repository_package  # noqa: E402

use_repository_package()

import numpy as np  # noqa: E402

from _models import build, train_step_fn  # noqa: E402  (benchmarks/ is on sys.path)


def inference_fn(model):
    import tensorflow as tf

    forward = tf.function(lambda x: model(x, training=False))
    return forward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--models", default="ResNet8,MobileNetV2,ResNet50")
    parser.add_argument("--multiplier", default="mul8u_drum4")
    parser.add_argument("--batch", type=int, default=32, help="batch for ResNet-8")
    parser.add_argument("--big-batch", type=int, default=8, help="batch for the 224x224 models")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-train", action="store_true")
    args = parser.parse_args()

    import graphswap

    print(run_context())
    print(machine_line())
    rows = []
    for name in args.models.split(","):
        name = name.strip()
        model = build(name, args.size)
        batch = args.batch if name == "ResNet8" else args.big_batch
        shape = model.inputs[0].shape[1:]
        rng = np.random.default_rng(0)
        x = rng.uniform(0, 1, (batch, *shape)).astype(np.float32)
        y = rng.integers(0, int(model.outputs[0].shape[-1]), batch)
        calibration = rng.uniform(0, 1, (16, *shape)).astype(np.float32)
        variants = {"float": model,
                    "exact": graphswap.rewrite_model(model, kernel="exact"),
                    args.multiplier: graphswap.rewrite_model(model, kernel=args.multiplier),
                    # static, calibrated ranges: no min/max pass over each call's activations
                    "static": graphswap.rewrite_model(model, kernel=args.multiplier,
                                                      calibration_data=calibration),
                    # TFApprox's asymmetric weights: one table column per output channel where
                    # the default sign-magnitude encoding needs two
                    "asymmetric": graphswap.rewrite_model(
                        model, kernel=args.multiplier,
                        quantization={"weights": "asymmetric"})}
        _, report = graphswap.rewrite_model(model, kernel="exact", return_report=True)
        print(f"{name}: {report.summary_line()}")
        forwards = [inference_fn(m) for m in variants.values()]
        times = median_times([lambda f=f: f(x).numpy() for f in forwards], reps=10,
                             budget=12.0, rounds=args.rounds)
        rows.append((name, "inference", batch, times))
        if not args.no_train:
            steps = [train_step_fn(m) for m in variants.values()]
            times = median_times([lambda s=s: s(x, y).numpy() for s in steps], reps=10,
                                 budget=12.0, rounds=args.rounds)
            rows.append((name, "train step", batch, times))
    print()
    header = (f"{'model':<13}{'measure':<12}{'batch':>6}{'float ms':>11}{'exact ms':>11}"
              f"{'LUT ms':>11}{'exact/float':>13}{'LUT/float':>11}{'LUT images/s':>14}"
              f"{'static/float':>14}{'asym/float':>12}")
    print(header)
    print("-" * len(header))
    for name, measure, batch, (t_float, t_exact, t_lut, t_static, t_asym) in rows:
        print(f"{name:<13}{measure:<12}{batch:>6}{t_float * 1e3:>11.1f}{t_exact * 1e3:>11.1f}"
              f"{t_lut * 1e3:>11.1f}{t_exact / t_float:>13.2f}{t_lut / t_float:>11.2f}"
              f"{batch / t_lut:>14.1f}{t_static / t_float:>14.2f}{t_asym / t_float:>12.2f}")
    print(f"LUT: {args.multiplier} with graphswap's default sign-magnitude weights, per-call "
          f"ranges; static: the same calibrated (static ranges); asym: the same multiplier with "
          f"TFApprox's asymmetric weights")


if __name__ == "__main__":
    main()
