#!/usr/bin/env python
"""Table-driven (LUT) kernels next to float32, on every instruction-set path this CPU runs.

    python benchmarks/bench_approx.py [--multiplier mul8u_drum4] [--rounds 3] [--isa avx2]

Multiply-accumulates per second at the LeNet-5 Dense shapes (batch 256), 512-square and a
56x56x64 3x3 convolution, for
    codes    graphswap_lut_matmul / graphswap_lut_conv2d on uint8 codes (the table kernel alone),
    fused    graphswap_lut_*_f32: float in, quantize -> table -> corrections -> float out, one call,
    kernel   LutKernel.matmul / conv2d: what a swapped layer calls (Python around the C call),
    tf       tf.linalg.matmul / tf.nn.conv2d in a tf.function (float32),
with fused/tf; the table kernels on every path (factoring off), and a table that factors exactly
(T[a][b] = f(a) g(b): DRUM, operand truncation) once more through its float GEMMs ('+factored',
native_kernels/src/lut_factored.c).  TARGET (the table kernels) at 512-square: fused/tf >= 0.15 on the avx512 (VBMI) path, >= 0.25 on the
avx2 path of an AVX2-only CPU.  The paths are switched in one process (graphswap_set_isa); on an
AVX-512 machine the avx2 row shows what the avx2 path does here, not on an AVX2-only CPU.
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from _timing import machine_line, median_times, run_context, table_path_line, use_repository_package  # noqa: E402

use_repository_package()

import numpy as np  # noqa: E402

GEMM_SHAPES = [("LeNet dense1", 256, 400, 120), ("LeNet dense2", 256, 120, 84),
               ("LeNet dense3", 256, 84, 10), ("512-square", 512, 512, 512)]
TARGETS = {"avx512": 0.15, "avx2": 0.25}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--multiplier", default="mul8u_drum4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--isa", default=None, help="only this path (default: every one)")
    args = parser.parse_args(argv)

    import tensorflow as tf

    from graphswap import native
    from graphswap.kernels import LutKernel, resolve_multiplier
    from graphswap.native import conv_geometry

    print(run_context())
    print(machine_line())
    library = native.shipped_library()
    multiplier = resolve_multiplier(args.multiplier)
    kernel = LutKernel(multiplier)
    scheme = native.LUT_SIGNED if multiplier.signed else native.LUT_UNSIGNED
    quant = native.LutQuant(scheme, native.QUANT_DYNAMIC,
                            native.QUANT_PER_CHANNEL if multiplier.signed
                            else native.QUANT_PER_TENSOR, 0, 0.0, None)
    rng = np.random.default_rng(0)
    tf_matmul = tf.function(lambda a, b: tf.linalg.matmul(a, b))
    paths = [args.isa] if args.isa else list(library.supported_isas)
    print(table_path_line(multiplier.spec))
    # the table kernels on every path; a table that factors also through its float GEMMs
    runs = [(path, False) for path in paths]
    if library.table_factored(multiplier.table):
        runs.append((paths[-1], True))
    print(f"multiplier {multiplier.spec}; G = 1e9 multiply-accumulates per second; "
          f"'+factored': the factored table's float GEMMs")
    header = (f"{'path':<14} {'shape':<14} {'m x k x n':>15} {'codes':>8} {'fused':>8} "
              f"{'kernel':>8} {'tf':>8} {'fused/tf':>9}")
    print(header)
    print("-" * len(header))
    results = {}
    for path, factoring in runs:
        library.set_isa(path)
        library.set_table_factoring(factoring)
        name = f"{path}+factored" if factoring else path
        for label, m, k, n in GEMM_SHAPES:
            a = rng.random((m, k), dtype=np.float32)
            b = rng.normal(0, 0.1, (k, n)).astype(np.float32)
            qa = rng.integers(0, 256, (m, k), dtype=np.uint8)
            qb = rng.integers(0, 256, (k, n), dtype=np.uint8)
            ta, tb = tf.constant(a), tf.constant(b)
            times = median_times([lambda: library.lut_matmul(qa, qb, multiplier.table),
                                  lambda: library.lut_matmul_f32(a, b, multiplier.table, quant),
                                  lambda: kernel.matmul(a, b),
                                  lambda: tf_matmul(ta, tb).numpy()],
                                 reps=200, budget=4.8, rounds=args.rounds)
            rate = [m * k * n / t for t in times]
            results[(name, label)] = rate[1] / rate[3]
            print(f"{name:<14} {label:<14} {f'{m}x{k}x{n}':>15} " + " ".join(
                f"{r / 1e9:>7.2f}G" for r in rate) + f" {rate[1] / rate[3]:>9.3f}", flush=True)
        x = rng.random((8, 56, 56, 64), dtype=np.float32)
        w = rng.normal(0, 0.1, (3, 3, 64, 64)).astype(np.float32)
        g = conv_geometry(x.shape, w.shape, padding="same")
        qx = rng.integers(0, 256, x.shape, dtype=np.uint8)
        qw = rng.integers(0, 256, w.shape, dtype=np.uint8)
        tx, tw = tf.constant(x), tf.constant(w)
        tf_conv = tf.function(lambda a, b: tf.nn.conv2d(a, b, 1, "SAME"))
        times = median_times([lambda: library.lut_conv2d(qx, qw, multiplier.table, 0, g),
                              lambda: library.lut_conv2d_f32(x, w, multiplier.table, quant, g),
                              lambda: kernel.conv2d(x, w, g),
                              lambda: tf_conv(tx, tw).numpy()],
                             reps=50, budget=4.8, rounds=args.rounds)
        rate = [g.macs / t for t in times]
        print(f"{name:<14} {'conv 56x56x64':<14} {'3x3 SAME':>15} " + " ".join(
            f"{r / 1e9:>7.2f}G" for r in rate) + f" {rate[1] / rate[3]:>9.3f}", flush=True)
    library.set_isa("auto")
    library.set_table_factoring(None)
    for path in paths:
        if path in TARGETS and (path, "512-square") in results:
            ratio = results[(path, "512-square")]
            print(f"TARGET fused/tf at 512-square on {path} >= {TARGETS[path]}: {ratio:.3f} -> "
                  f"{'MET' if ratio >= TARGETS[path] else 'NOT MET'}")


if __name__ == "__main__":
    main()
