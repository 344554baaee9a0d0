#!/usr/bin/env python
"""Would asymmetric (zero-point) int8 activations help a signed multiplier?  A measurement of the
multiplier error alone, before building it (mul8s_1L1G and mul8s_1KR3 on the MLPerf Tiny ResNet-8).

Symmetric int8 gives a ReLU layer's activations the codes 0..127 only; a zero point of -128 would
use all 256 codes (half the step) but moves the most common activation, 0, from code 0 (where an
approximate signed multiplier is usually exact) to code -128.  For each multiplier this prints
the RMS and mean |error| of one product in real units (activation scale x weight scale x table
error; the rounding of the operands left out) for ReLU-like activations (a normal clipped at 0:
half exact zeros, range at its 99.99th percentile) and normal weights (symmetric per tensor),
with the activation on operand A or on operand B.

Two zero-point terms are compared: TFLite's exact 128 * w (the "exact term" column: every zero
activation meets the circuit at -128), and the circuit's own product of the zero point with the
weight, T(-128, w), which graphswap builds (QuantScheme.activation_zero_point: a zero input adds
nothing; "circuit's term").

    python benchmarks/asymmetric_activations.py --multipliers DIR [NAME ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import run_context, use_repository_package  # noqa: E402

use_repository_package()


def table_errors(kernel) -> np.ndarray:
    """E[a + 128, b + 128] = T(a, b) - a b for the signed codes a, b in -128..127."""
    table = np.asarray(kernel.multiplier.table, np.float64).reshape(256, 256)
    codes = np.arange(-128, 128)
    return table[codes & 255][:, codes & 255] - np.outer(codes, codes)


def product_errors(errors, activation_first: bool, zero_point: bool, samples=200_000, seed=0,
                   circuit_term: bool = False):
    rng = np.random.default_rng(seed)
    a = np.maximum(rng.normal(size=samples), 0)
    w = rng.normal(size=samples)
    w_scale = np.abs(w).max() / 127
    qw = np.clip(np.rint(w / w_scale), -127, 127).astype(int)
    top = np.percentile(a, 99.99)
    if zero_point:
        a_scale = top / 255
        qa = np.clip(np.rint(a / a_scale) - 128, -128, 127).astype(int)
    else:
        a_scale = top / 127
        qa = np.clip(np.rint(a / a_scale), -127, 127).astype(int)
    e = errors[qa + 128, qw + 128] if activation_first else errors[qw + 128, qa + 128]
    if circuit_term:      # T(qa, w) - T(-128, w) against (qa + 128) w: less the zero code's error
        e = e - (errors[0, qw + 128] if activation_first else errors[qw + 128, 0])
    real = a_scale * w_scale * e
    return float(np.sqrt(np.mean(real ** 2))), float(np.mean(np.abs(real)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--multipliers", required=True, help="folder of the .c files")
    parser.add_argument("names", nargs="*", default=["mul8s_1L1G", "mul8s_1KR3"])
    args = parser.parse_args()
    from graphswap.kernels import resolve_kernel
    print(run_context())
    print("| multiplier | activation on | RMS error symmetric | zero point -128, exact term | "
          "ratio | zero point -128, circuit's term | ratio |")
    print("|---|---|---|---|---|---|---|")
    for name in args.names:
        errors = table_errors(resolve_kernel(str(Path(args.multipliers) / f"{name}.c")))
        for first in (True, False):
            sym, _ = product_errors(errors, first, False)
            asym, _ = product_errors(errors, first, True)
            own, _ = product_errors(errors, first, True, circuit_term=True)
            print(f"| {name} | operand {'A' if first else 'B'} | {sym:.4f} | {asym:.4f} | "
                  f"{asym / sym:.2f}x | {own:.4f} | {own / sym:.2f}x |")


if __name__ == "__main__":
    main()
