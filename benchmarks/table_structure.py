#!/usr/bin/env python
"""Is there a cheaper exact formulation of a full-rank multiplier's table GEMM?

A table whose products factor exactly, T[a][b] = f(a) g(b) (DRUM, operand truncation), already
runs as float32 GEMMs of the mapped operands (native_kernels/src/lut_factored.c).  For the other
tables - EvoApproxLib's evolved circuits, Mitchell's logarithmic multiplier - two exact
decompositions were proposed:

  exact product + sparse error    T = a*b + E: one float GEMM (exact in short runs) plus a table
                                  lookup only where E[a][b] != 0
  low rank + sparse residual      T = sum_{i<r} f_i(a) g_i(b) + S: r float GEMMs plus lookups where
                                  S != 0 (f_i, g_i from the SVD; S is what rounding leaves)

Either pays only when the residual is sparse: a residual on a fraction d of the code pairs still
costs d table lookups per product, on top of the GEMMs.  This prints, per table, d for each: the
fraction of the 65,536 code pairs, and the fraction weighted by a ReLU-like activation
distribution (half the activations code 0, the rest falling off like |N(0, 40)|) with weights
~ N(0, 30) - what a layer's products actually hit.

    python benchmarks/table_structure.py [--tables A.lut,B.lut] [--multipliers DIR]
"""
from __future__ import annotations

import argparse
from pathlib import Path

from _timing import run_context, use_repository_package

use_repository_package()

import numpy as np  # noqa: E402

BUILTINS = ["mul8u_mitchell", "mul8s_mitchell", "mul8u_drum4"]
RANKS = (1, 2, 4, 8, 16)


def code_values(signed: bool) -> np.ndarray:
    """The integer value of each of the 256 codes (two's complement when signed)."""
    codes = np.arange(256)
    return np.where(codes >= 128, codes - 256, codes) if signed else codes


def operand_weights(signed: bool) -> tuple[np.ndarray, np.ndarray]:
    """Probability of each activation code and each weight code in a typical layer."""
    values = code_values(signed).astype(float)
    activation = np.exp(-0.5 * (values / 40.0) ** 2) * (values >= 0)
    activation[values == 0] = activation.sum()          # half the activations are ReLU's zeros
    weight = np.exp(-0.5 * (values / 30.0) ** 2)
    return activation / activation.sum(), weight / weight.sum()


def residual_fractions(table: np.ndarray, signed: bool) -> dict[str, tuple[float, float]]:
    """(fraction of code pairs, fraction of weighted products) left to table lookups."""
    pa, pb = operand_weights(signed)
    mass = np.outer(pa, pb)
    values = code_values(signed).astype(np.int64)
    result = {"a*b + E": table != np.outer(values, values)}
    u, s, vt = np.linalg.svd(table.astype(np.float64))
    for r in RANKS:
        approx = np.rint((u[:, :r] * s[:r]) @ vt[:r])
        result[f"rank {r} + S"] = approx != table
    return {name: (float(mask.mean()), float(mass[mask].sum())) for name, mask in result.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", default="", help="comma-separated .lut files")
    parser.add_argument("--multipliers", default=None,
                        help="a folder of .lut files (e.g. EvoApproxLib circuits' tables)")
    args = parser.parse_args(argv)

    from graphswap.kernels import resolve_multiplier

    print(run_context())
    specs = list(BUILTINS) + [t for t in args.tables.split(",") if t]
    if args.multipliers:
        specs += [str(p) for p in sorted(Path(args.multipliers).glob("mul8*.lut"))
                  if not p.stem.endswith("_T")]
    names = ["a*b + E"] + [f"rank {r} + S" for r in RANKS]
    print("residual left to table lookups: fraction of code pairs / of a layer's products "
          "(ReLU activations, normal weights)")
    print(f"{'table':<16} {'rank':>5} " + " ".join(f"{n:>16}" for n in names))
    for spec in specs:
        multiplier = resolve_multiplier(spec)
        table = np.asarray(multiplier.table, dtype=np.int64).reshape(256, 256)
        rank = np.linalg.matrix_rank(table.astype(np.float64))
        fractions = residual_fractions(table, multiplier.signed)
        print(f"{Path(spec).stem:<16} {rank:>5} " + " ".join(
            f"{fractions[n][0]:>7.1%} /{fractions[n][1]:>7.1%}" for n in names), flush=True)


if __name__ == "__main__":
    main()
