#!/usr/bin/env python
"""graphswap's exact kernels and swapped models next to TensorFlow, measured side by side.

    python benchmarks/bench_core.py [--budget SECONDS] [--rounds N]

Prints, in one run:
  1. exact C GEMM vs tf.linalg.matmul at 256/512/1024 square and LeNet-5's Dense shapes (batch 256)
     (target >= 0.8x TensorFlow's throughput);
  2. exact C Conv2D vs tf.nn.conv2d at LeNet-5's conv shapes, batch 256 (target >= 0.8x), and one
     larger conv for reference;
  3. a full LeNet-5 training step (batch 256, train_on_batch), swapped-with-exact vs the original
     (target <= 1.3x the original's time);
  4. the fixed overhead of one swapped op call on tiny shapes, in microseconds.
Each kernel result is also checked against a float64 reference (max error relative to sum |a||b|).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from _timing import REPO, machine_line, median_times, use_repository_package  # noqa: E402

use_repository_package()


def kernel_section(args, rng) -> list[tuple[str, float]]:
    import tensorflow as tf

    from graphswap import native
    from graphswap.native import conv_geometry

    lib = native.shipped_library()
    print(f"library: {lib.path}")
    header = (f"{'case':<44} {'ours GF/s':>10} {'TF GF/s':>10} {'ours/TF':>8} {'ours ms':>9} "
              f"{'TF ms':>9} {'max rel err':>12}")
    print(header)
    print("-" * len(header))
    ratios = []

    def report(name, flops, t_ours, t_tf, err):
        ratio = t_tf / t_ours
        ratios.append((name, ratio))
        print(f"{name:<44} {flops / t_ours / 1e9:10.2f} {flops / t_tf / 1e9:10.2f} {ratio:8.2f} "
              f"{t_ours * 1e3:9.3f} {t_tf * 1e3:9.3f} {err:12.2e}", flush=True)

    for m, k, n in [(256, 256, 256), (512, 512, 512), (1024, 1024, 1024),
                    (256, 400, 120), (256, 120, 84), (256, 84, 10)]:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        ta, tb = tf.constant(a), tf.constant(b)
        t_ours, t_tf = median_times([lambda: lib.matmul_f32(a, b),
                                     lambda: tf.linalg.matmul(ta, tb)],
                                    args.reps, args.budget, args.rounds)
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        err = float(np.max(np.abs(lib.matmul_f32(a, b) - a64 @ b64) / (np.abs(a64) @ np.abs(b64))))
        report(f"matmul ({m},{k})x({k},{n})", 2.0 * m * k * n, t_ours, t_tf, err)

    for name, (batch, h, w, cin, fh, fw, cout, padding) in [
        ("conv LeNet C1 256x32x32x1 5x5x1x6 VALID", (256, 32, 32, 1, 5, 5, 6, "valid")),
        ("conv LeNet C3 256x14x14x6 5x5x6x16 VALID", (256, 14, 14, 6, 5, 5, 16, "valid")),
        ("conv 8x56x56x64 3x3x64x64 SAME", (8, 56, 56, 64, 3, 3, 64, "same")),
    ]:
        x = rng.standard_normal((batch, h, w, cin), dtype=np.float32)
        f = rng.standard_normal((fh, fw, cin, cout), dtype=np.float32)
        geometry = conv_geometry(x.shape, f.shape, padding=padding)
        tx, tfilt = tf.constant(x), tf.constant(f)
        t_ours, t_tf = median_times([lambda: lib.conv2d_f32(x, f, geometry),
                                     lambda: tf.nn.conv2d(tx, tfilt, 1, padding.upper())],
                                    args.reps, args.budget, args.rounds)
        ref = tf.nn.conv2d(x.astype(np.float64), f.astype(np.float64), 1, padding.upper()).numpy()
        magnitude = tf.nn.conv2d(np.abs(x).astype(np.float64), np.abs(f).astype(np.float64), 1,
                                 padding.upper()).numpy()
        err = float(np.max(np.abs(lib.conv2d_f32(x, f, geometry) - ref)
                           / np.maximum(magnitude, 1e-30)))
        report(name, 2.0 * geometry.macs, t_ours, t_tf, err)
    return ratios


def training_step_section(args) -> float:
    import keras

    import graphswap

    with np.load(REPO / "sample_models" / "digits.npz") as data:
        x = data["x_train"][:256].astype(np.float32)
        y = data["y_train"][:256]
    models = {}
    for label in ("original", "swapped-exact"):
        keras.utils.set_random_seed(0)
        model = keras.models.load_model(REPO / "sample_models" / "lenet5.keras")
        if label == "swapped-exact":
            model = graphswap.rewrite_model(model, kernel="exact")
        model.compile(optimizer=keras.optimizers.SGD(1e-4), loss="sparse_categorical_crossentropy")
        models[label] = model
    steps = {label: (lambda m=m: m.train_on_batch(x, y)) for label, m in models.items()}
    times = median_times(list(steps.values()), reps=40, budget=max(args.budget * 2, 4.0),
                         rounds=args.rounds)
    original, swapped = times
    print("\nLeNet-5 training step, batch 256 (train_on_batch)")
    print(f"  original        {original * 1e3:8.2f} ms")
    print(f"  swapped-exact   {swapped * 1e3:8.2f} ms")
    print(f"  ratio swapped/original = {swapped / original:.2f}x   (target <= 1.3x)")
    return swapped / original


def overhead_section(args) -> None:
    import tensorflow as tf

    from graphswap.swap import ops
    from graphswap.kernels import resolve_kernel

    kernel = resolve_kernel("exact")
    x = tf.constant(np.ones((1, 4), np.float32))
    w = tf.constant(np.ones((4, 4), np.float32))
    xc = tf.constant(np.ones((1, 4, 4, 1), np.float32))
    wc = tf.constant(np.ones((3, 3, 1, 1), np.float32))
    swapped_mm = tf.function(lambda a, b: ops.swapped_matmul(a, b, kernel))
    native_mm = tf.function(lambda a, b: tf.linalg.matmul(a, b))
    swapped_conv = tf.function(lambda a, b: ops.swapped_conv2d(a, b, kernel))
    native_conv = tf.function(lambda a, b: tf.nn.conv2d(a, b, 1, "VALID"))
    times = median_times([lambda: swapped_mm(x, w), lambda: native_mm(x, w),
                          lambda: swapped_conv(xc, wc), lambda: native_conv(xc, wc),
                          lambda: ops.swapped_matmul(x, w, kernel), lambda: tf.linalg.matmul(x, w)],
                         reps=400, budget=args.budget, rounds=args.rounds)
    print("\nFixed overhead of one op call on tiny shapes (median, microseconds)")
    print(f"  tf.function matmul (1,4)x(4,4):  swapped {times[0] * 1e6:7.1f}   TF {times[1] * 1e6:7.1f}"
          f"   overhead {(times[0] - times[1]) * 1e6:7.1f}")
    print(f"  tf.function conv 4x4x1 * 3x3:    swapped {times[2] * 1e6:7.1f}   TF {times[3] * 1e6:7.1f}"
          f"   overhead {(times[2] - times[3]) * 1e6:7.1f}")
    print(f"  eager matmul (1,4)x(4,4):        swapped {times[4] * 1e6:7.1f}   TF {times[5] * 1e6:7.1f}"
          f"   overhead {(times[4] - times[5]) * 1e6:7.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=50, help="max repetitions per block")
    parser.add_argument("--budget", type=float, default=3.0, help="seconds per case")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per case")
    args = parser.parse_args()
    print(machine_line())
    ratios = kernel_section(args, np.random.default_rng(0))
    worst = min(ratios, key=lambda item: item[1])
    print(f"lowest kernel ratio ours/TF: {worst[1]:.2f} ({worst[0]})")
    training_step_section(args)
    overhead_section(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
