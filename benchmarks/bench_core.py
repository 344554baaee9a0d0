#!/usr/bin/env python
"""graphswap next to TensorFlow, measured side by side in one run, the way users run models.

    python benchmarks/bench_core.py [--multiplier mul8u_drum4] [--budget SECONDS] [--rounds N]
                                    [--skip-kernels] [--skip-fit]

Prints, after the CPU model, graphswap's ISA path and its BLAS:
  1. exact C GEMM vs TensorFlow's MatMul (inside a tf.function) at 256/512/1024 square and
     LeNet-5's Dense shapes (batch 256); exact C Conv2D vs tf.nn.conv2d at LeNet-5's conv shapes
     (batch 256) and 8x56x56x64 3x3 SAME;                        targets >= 1.0x / >= 0.9x
  2. the LeNet-5 training step, batch 256, inside a tf.function (forward, GradientTape, SGD
     apply: what fit runs per step): original, swapped-exact, swapped-LUT;
                                                                 targets <= 1.15x / <= 2.5x
     the LUT model also with backward="lut_grad" (the table's own derivatives, no target);
     and one epoch of model.fit on the 1,437 training digits for the same models;
  3. LeNet-5 inference over 10,000 images (the 360 test digits repeated), batch 256, through a
     tf.function forward loop and through model.predict;        target LUT/float <= 3x
  4. the fixed cost of one swapped op call on tiny shapes, through graphswap's compiled
     TensorFlow op (what swapped layers use) and through the tf.numpy_function bridge.
Each kernel result is also checked against a float64 reference (max error relative to
sum |a||b|).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from _timing import (REPO, machine_line, median_times, run_context,  # noqa: E402
                     use_repository_package)

use_repository_package()

from _models import train_step_fn  # noqa: E402  (benchmarks/ is on sys.path)


def kernel_section(args, rng) -> list[tuple[str, float]]:
    import tensorflow as tf

    from graphswap import native
    from graphswap.native import conv_geometry

    lib = native.shipped_library()
    tf_matmul = tf.function(lambda a, b: tf.linalg.matmul(a, b))
    header = (f"{'case':<44} {'ours GF/s':>10} {'TF GF/s':>10} {'ours/TF':>8} {'ours ms':>9} "
              f"{'TF ms':>9} {'max rel err':>12}")
    print("\n1. exact kernels (TF inside a tf.function)")
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
                                     lambda: tf_matmul(ta, tb).numpy()],
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
        tf_conv = tf.function(lambda a, b, p=padding.upper(): tf.nn.conv2d(a, b, 1, p))
        t_ours, t_tf = median_times([lambda: lib.conv2d_f32(x, f, geometry),
                                     lambda: tf_conv(tx, tfilt).numpy()],
                                    args.reps, args.budget, args.rounds)
        ref = tf.nn.conv2d(x.astype(np.float64), f.astype(np.float64), 1, padding.upper()).numpy()
        magnitude = tf.nn.conv2d(np.abs(x).astype(np.float64), np.abs(f).astype(np.float64), 1,
                                 padding.upper()).numpy()
        err = float(np.max(np.abs(lib.conv2d_f32(x, f, geometry) - ref)
                           / np.maximum(magnitude, 1e-30)))
        report(name, 2.0 * geometry.macs, t_ours, t_tf, err)
    worst = min(ratios, key=lambda item: item[1])
    print(f"lowest kernel ratio ours/TF: {worst[1]:.2f} ({worst[0]})")
    return ratios


def lenet_models(multiplier, compile_for_fit=False, lut_grad=False):
    """{label: model}: the original LeNet-5 and its exact and LUT rewrites (same weights); with
    `lut_grad`, also the LUT rewrite with backward="lut_grad" (its training cost)."""
    import keras

    import graphswap

    models = {}
    # the LUT model twice: graphswap's default sign-magnitude weights (two table columns per
    # output channel: twice the lookups) and TFApprox's asymmetric weights (one)
    variants = [("original", None, {}), ("swapped-exact", "exact", {}),
                (f"swapped-{multiplier}", multiplier, {}),
                ("  asymmetric weights", multiplier, {"quantization": {"weights": "asymmetric"}})]
    if lut_grad:
        variants.append(("  backward lut_grad", multiplier, {"backward": "lut_grad"}))
    for label, kernel, options in variants:
        keras.utils.set_random_seed(0)
        model = keras.models.load_model(REPO / "sample_models" / "lenet5.keras")
        if kernel is not None:
            model = graphswap.rewrite_model(model, kernel=kernel, **options)
        if compile_for_fit:
            model.compile(optimizer=keras.optimizers.SGD(1e-4),
                          loss="sparse_categorical_crossentropy")
        models[label] = model
    return models


def print_ratios(title, labels, times, unit="ms", scale=1e3, targets=None):
    print(title)
    base = times[0]
    for index, (label, value) in enumerate(zip(labels, times)):
        ratio = "" if index == 0 else f"   {value / base:5.2f}x the original"
        target = (targets or {}).get(index)
        verdict = "" if target is None else (
            f"   (target <= {target}x: {'MET' if value / base <= target else 'NOT MET'})")
        print(f"  {label:<24} {value * scale:9.2f} {unit}{ratio}{verdict}")


def training_section(args):
    import tensorflow as tf

    with np.load(REPO / "sample_models" / "digits.npz") as data:
        x_train, y_train = data["x_train"].astype(np.float32), data["y_train"]
    x, y = tf.constant(x_train[:256]), tf.constant(y_train[:256])
    models = lenet_models(args.multiplier, lut_grad=True)
    steps = [train_step_fn(m) for m in models.values()]
    times = median_times([lambda s=s: s(x, y).numpy() for s in steps], reps=40,
                         budget=max(args.budget * 3, 6.0), rounds=args.rounds)
    print_ratios("\n2. LeNet-5 training step, batch 256, inside a tf.function", list(models),
                 times, targets={1: 1.15, 2: 2.5, 3: 2.5})
    if args.skip_fit:
        return
    fit_models = lenet_models(args.multiplier, compile_for_fit=True, lut_grad=True)
    epochs = []
    for model in fit_models.values():
        model.fit(x_train, y_train, batch_size=256, epochs=1, verbose=0)  # traces
    best = {label: float("inf") for label in fit_models}
    for _ in range(args.rounds):
        for label, model in fit_models.items():
            start = time.perf_counter()
            model.fit(x_train, y_train, batch_size=256, epochs=1, verbose=0)
            best[label] = min(best[label], time.perf_counter() - start)
    epochs = [best[label] for label in fit_models]
    print_ratios("   one epoch of model.fit (1,437 digits, batch 256)", list(fit_models), epochs)


def inference_section(args, images=10_000, batch_size=256):
    import tensorflow as tf

    with np.load(REPO / "sample_models" / "digits.npz") as data:
        x = np.resize(data["x_test"], (images,) + data["x_test"].shape[1:]).astype(np.float32)
    batches = [tf.constant(x[i:i + batch_size]) for i in range(0, images, batch_size)]
    models = lenet_models(args.multiplier)
    forwards = [tf.function(lambda b, m=m: m(b, training=False)) for m in models.values()]

    def loop(forward):
        return lambda: [forward(b).numpy() for b in batches]

    times = median_times([loop(f) for f in forwards], reps=3, budget=0, rounds=args.rounds)
    print_ratios(f"\n3. LeNet-5 inference over {images:,} images, batch {batch_size}, "
                 f"tf.function forward loop", list(models), times, targets={2: 3, 3: 3})
    predict_times = median_times(
        [lambda m=m: m.predict(x, batch_size=batch_size, verbose=0) for m in models.values()],
        reps=3, budget=0, rounds=args.rounds)
    print_ratios("   the same through model.predict", list(models), predict_times,
                 targets={2: 3, 3: 3})


def overhead_section(args) -> None:
    import tensorflow as tf

    from graphswap.kernels import resolve_kernel
    from graphswap.swap import ops

    kernel = resolve_kernel("exact")
    x = tf.constant(np.ones((1, 4), np.float32))
    w = tf.constant(np.ones((4, 4), np.float32))
    xc = tf.constant(np.ones((1, 4, 4, 1), np.float32))
    wc = tf.constant(np.ones((3, 3, 1, 1), np.float32))

    def traced(bridge):
        """(swapped matmul, swapped conv) tf.functions traced with GRAPHSWAP_BRIDGE=bridge."""
        previous = os.environ.get("GRAPHSWAP_BRIDGE")
        os.environ["GRAPHSWAP_BRIDGE"] = bridge
        try:
            mm = tf.function(lambda a, b: ops.swapped_matmul(a, b, kernel))
            conv = tf.function(lambda a, b: ops.swapped_conv2d(a, b, kernel))
            mm(x, w), conv(xc, wc)
        finally:
            if previous is None:
                del os.environ["GRAPHSWAP_BRIDGE"]
            else:
                os.environ["GRAPHSWAP_BRIDGE"] = previous
        return mm, conv

    op_mm, op_conv = traced("auto")
    np_mm, np_conv = traced("numpy")
    native_mm = tf.function(lambda a, b: tf.linalg.matmul(a, b))
    native_conv = tf.function(lambda a, b: tf.nn.conv2d(a, b, 1, "VALID"))
    calls = [lambda: op_mm(x, w), lambda: np_mm(x, w), lambda: native_mm(x, w),
             lambda: op_conv(xc, wc), lambda: np_conv(xc, wc), lambda: native_conv(xc, wc)]
    times = [t * 1e6 for t in median_times(calls, reps=400, budget=args.budget,
                                           rounds=args.rounds)]
    print("\n4. fixed cost of one op call on tiny shapes (median, microseconds, tf.function);")
    print("   bridge = swapped - TF, through graphswap's compiled op and through tf.numpy_function")
    for label, (op_t, np_t, tf_t) in (("matmul (1,4)x(4,4):  ", times[0:3]),
                                      ("conv 4x4x1 * 3x3:    ", times[3:6])):
        print(f"  {label} TF {tf_t:7.1f}   swapped: op {op_t:7.1f} (bridge {op_t - tf_t:6.1f})"
              f"   numpy_function {np_t:7.1f} (bridge {np_t - tf_t:6.1f})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--multiplier", default="mul8u_drum4")
    parser.add_argument("--reps", type=int, default=50, help="max repetitions per block")
    parser.add_argument("--budget", type=float, default=3.0, help="seconds per case")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per case")
    parser.add_argument("--skip-kernels", action="store_true")
    parser.add_argument("--skip-fit", action="store_true")
    args = parser.parse_args()
    print(run_context())
    print(machine_line())
    if not args.skip_kernels:
        kernel_section(args, np.random.default_rng(0))
    training_section(args)
    inference_section(args)
    overhead_section(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
