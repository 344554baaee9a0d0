#!/usr/bin/env python
"""Approximate (table-driven) kernels next to float32, measured in one run.

    python benchmarks/bench_approx.py [--multiplier mul8u_drum4] [--rounds 3]

Part 1 -- GEMM throughput in multiply-accumulates per second at the LeNet-5 Dense shapes (batch 256)
and 512-square, for
    lut      graphswap_lut_matmul on uint8 codes (the table-driven kernel alone),
    lut+q    LutKernel.matmul: float -> quantize -> lut -> exact corrections -> float,
    f32      graphswap_matmul_f32 (graphswap's exact float kernel),
    tf       tf.linalg.matmul, eager, on tf.Tensors,
with the ratios lut/tf and lut/f32.  TARGET: lut/tf >= 0.15 at 512-square.

Part 2 -- LeNet-5 (sample_models/lenet5.keras) inference over 10,000 images (the 360 test images
of sample_models/digits.npz repeated) with every Dense/Conv2D layer swapped to the multiplier by
graphswap.rewrite_model, against the original float model, both through model.predict with the
same batch size.  TARGET: lut/float <= 3.

Times are medians over repetitions after warm-up, the best of several rounds, ours and TF's back to
back in the same process (the machine may be shared; ratios from one run are what to compare).
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from _timing import REPO, median_times, use_repository_package  # noqa: E402

use_repository_package()

import numpy as np  # noqa: E402

GEMM_SHAPES = [("LeNet dense1", 256, 400, 120), ("LeNet dense2", 256, 120, 84),
               ("LeNet dense3", 256, 84, 10), ("512-square", 512, 512, 512)]


def gemm_part(multiplier_spec, rounds):
    import tensorflow as tf

    from graphswap import native
    from graphswap.kernels import resolve_multiplier
    from graphswap.kernels import LutKernel

    library = native.shipped_library()
    multiplier = resolve_multiplier(multiplier_spec)
    kernel = LutKernel(multiplier)
    rng = np.random.default_rng(0)
    print(f"Part 1: GEMM multiply-accumulates per second (G = 1e9), multiplier {multiplier.spec}")
    header = (f"{'shape':<14} {'m x k x n':>15} {'lut':>8} {'lut+q':>8} {'f32':>8} {'tf':>8} "
              f"{'lut/tf':>7} {'lut/f32':>8}")
    print(header)
    print("-" * len(header))
    results = {}
    for label, m, k, n in GEMM_SHAPES:
        a = rng.random((m, k), dtype=np.float32)
        b = rng.normal(0, 0.1, (k, n)).astype(np.float32)
        qa = rng.integers(0, 256, (m, k), dtype=np.uint8)
        qb = rng.integers(0, 256, (k, n), dtype=np.uint8)
        ta, tb = tf.constant(a), tf.constant(b)
        macs = m * k * n
        names = ("lut", "lut+q", "f32", "tf")
        times = median_times([lambda: library.lut_matmul(qa, qb, multiplier.table),
                              lambda: kernel.matmul(a, b),
                              lambda: library.matmul_f32(a, b),
                              lambda: tf.linalg.matmul(ta, tb)],
                             reps=200, budget=1.2 * len(names), rounds=rounds)
        rate = {name: macs / t for name, t in zip(names, times)}
        results[label] = rate
        print(f"{label:<14} {f'{m}x{k}x{n}':>15} " + " ".join(
            f"{rate[x] / 1e9:>7.2f}G" for x in ("lut", "lut+q", "f32", "tf"))
            + f" {rate['lut'] / rate['tf']:>7.3f} {rate['lut'] / rate['f32']:>8.3f}")
    ratio = results["512-square"]["lut"] / results["512-square"]["tf"]
    print(f"TARGET lut/tf at 512-square >= 0.15: {ratio:.3f} -> {'MET' if ratio >= 0.15 else 'NOT MET'}")
    return ratio


def lenet_part(multiplier_spec, rounds, images=10_000, batch_size=256):
    import keras

    import graphswap

    model_path = REPO / "sample_models" / "lenet5.keras"
    data = np.load(REPO / "sample_models" / "digits.npz")
    x = np.resize(data["x_test"], (images,) + data["x_test"].shape[1:])
    model = keras.models.load_model(model_path)
    swapped = graphswap.rewrite_model(model, kernel=multiplier_spec)
    print()
    print(f"Part 2: LeNet-5 inference over {images} images, batch {batch_size}, multiplier {multiplier_spec}")

    def run(net):
        return lambda: net.predict(x, batch_size=batch_size, verbose=0)

    float_time, lut_time = median_times([run(model), run(swapped)], reps=3, budget=0,
                                        rounds=rounds)
    labels = data["y_test"]
    n = len(labels)
    acc_float = float(np.mean(model.predict(x[:n], verbose=0).argmax(1) == labels))
    acc_lut = float(np.mean(swapped.predict(x[:n], verbose=0).argmax(1) == labels))
    print(f"float model      {float_time * 1e3:9.1f} ms   ({images / float_time:,.0f} images/s)  "
          f"test accuracy {acc_float:.3f}")
    print(f"{multiplier_spec:<16} {lut_time * 1e3:9.1f} ms   ({images / lut_time:,.0f} images/s)  "
          f"test accuracy {acc_lut:.3f}")
    ratio = lut_time / float_time
    print(f"TARGET lut/float <= 3: {ratio:.2f} -> {'MET' if ratio <= 3 else 'NOT MET'}")
    return ratio


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--multiplier", default="mul8u_drum4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-lenet", action="store_true")
    args = parser.parse_args(argv)
    gemm_part(args.multiplier, args.rounds)
    if not args.skip_lenet:
        lenet_part(args.multiplier, args.rounds)


if __name__ == "__main__":
    main()
