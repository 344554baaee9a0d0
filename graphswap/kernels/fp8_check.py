"""`graphswap kernels check` for 8-bit floating-point multipliers (graphswap/kernels/fp8.py).

Run inside the checking child process of graphswap/kernels/check.py.  An FP8 multiplier's
products are real numbers, so the integer checks (MAE% of 2^16, output widths, header agreement)
do not apply; what does:

  - it loads: the C source compiles and its table is evaluated (in a child process of its own:
    a crash there is one failed check naming the signal), or the .npy table is well formed;
  - products of finite codes are finite (a NaN or infinite product of two finite operands would
    poison every sum it enters; Fp8Kernel refuses such a table);
  - determinism (C sources): two more evaluations, in one process of their own, bit-identical;
  - commutativity: T[a, b] == T[b, a] over all finite code pairs - a failed check when the
    source's header claims it ("commutative" / "symmetric"), else reported;
  - error against the exact FP8 product decode(a) x decode(b), over every pair of finite codes:
    mean and max relative error (pairs whose exact product is nonzero), the share of exact
    pairs, and the pairs whose exact product is 0 but the table's is not;
  - NaN/Inf inputs through the kernel (reported by check.py, as for every multiplier).
"""

from __future__ import annotations

import os
import re

import numpy as np

from graphswap import native
from graphswap.errors import GraphswapError, KernelCrashError
from graphswap.kernels import trust
from graphswap.kernels.fp8 import Fp8Format, Fp8Kernel, parse_fp8_spec
from graphswap.multipliers import fp8_circuits

_CLAIMS_SYMMETRY = re.compile(r"\b(commutative|symmetric)\b", re.I)


def fp8_error_metrics(table, fmt: Fp8Format) -> dict:
    """Errors of a (256, 256) table against the exact products of `fmt`'s finite codes."""
    finite = fmt.finite_codes
    codes = np.flatnonzero(finite)
    values = fmt.values[finite].astype(np.float64)
    exact = np.multiply.outer(values, values)
    approx = np.asarray(table, np.float64).reshape(256, 256)[np.ix_(finite, finite)]
    error = np.abs(approx - exact)
    nonzero = exact != 0
    relative = np.where(nonzero, error / np.where(nonzero, np.abs(exact), 1.0), 0.0)
    worst = np.unravel_index(int(np.argmax(relative)), relative.shape)
    return {"pairs": int(exact.size),
            "mean_relative_error_percent": float(relative[nonzero].mean() * 100),
            "max_relative_error_percent": float(relative[worst] * 100),
            "worst_pair": [int(codes[worst[0]]), int(codes[worst[1]])],
            "exact_pairs_percent": float((error == 0).mean() * 100),
            "nonzero_for_zero_product": int(((~nonzero) & (approx != 0)).sum())}


def _table_anew(fp8_spec, content):
    if fp8_spec.kind == "c":
        table, _, header = fp8_circuits.table_from_c(content, fp8_spec.function)
        return table, header
    return fp8_circuits.table_from_npy(content), {}


def check_fp8(spec: str, add, stage) -> tuple[dict, Fp8Kernel | None]:
    """The checks of the FP8 spec `spec` (module docstring); `add(name, passed, detail)` records
    a check, `stage(name)` announces one.  Returns the result dict (its checks come from add)
    and the kernel (None when its table cannot run)."""
    fp8_spec = parse_fp8_spec(spec)
    fmt = fp8_spec.format
    if fp8_spec.kind is None:
        kernel = Fp8Kernel(fp8_spec)
        add("checks", None, f"{kernel.spec} is a built-in: the exact products of two "
                            f"{fmt.name.upper()} codes")
        return {"spec": kernel.spec, "name": kernel.spec, "description": kernel.description,
                "kind": "fp8"}, kernel
    stage("evaluating the FP8 multiplier table")
    path = os.path.abspath(fp8_spec.path)
    fp8_spec = fp8_spec.at(path)
    result = {"spec": fp8_spec.spec, "name": os.path.basename(path), "kind": "fp8",
              "description": f"8-bit float multiplier ({fmt.name.upper()} operands) from {path}"}
    try:
        content = native.read_file(path, fp8_spec.what)
        trust.approve(content)  # the user named it on the command line
        table, header = _table_anew(fp8_spec, content)
    except KernelCrashError as exc:
        add("runs without crashing (stage: evaluating the FP8 multiplier table)", False, str(exc))
        return {**result, "crashed": True}, None
    except GraphswapError as exc:
        add("loads (compiles, evaluates / reads the table)", False, str(exc))
        return result, None
    add("loads (compiles, evaluates / reads the table)", True,
        "a C source compiled and evaluated in a child process" if fp8_spec.kind == "c"
        else "a float32 (256, 256) .npy table")
    finite = fmt.finite_codes
    read = table[np.ix_(finite, finite)]
    bad = np.argwhere(~np.isfinite(read))
    codes = np.flatnonzero(finite)
    add("products of finite codes are finite", bad.size == 0,
        f"every product of two finite {fmt.name.upper()} codes is finite" if bad.size == 0 else
        f"{len(bad)} pairs are not, e.g. {codes[bad[0][0]]:#04x} x {codes[bad[0][1]]:#04x} = "
        f"{read[bad[0][0], bad[0][1]]}")
    if fp8_spec.kind == "c":
        stage("determinism")
        # two more, one after the other in one process: state kept between calls shows
        again, _, _ = fp8_circuits.tables_from_c(content, fp8_spec.function,
                                                 passes=[range(256)] * 2)
        same = all(np.array_equal(t.view(np.uint32), table.view(np.uint32)) for t in again)
        add("deterministic (table evaluated three times)", same,
            "bit-identical" if same else "evaluations of the same codes gave different "
                                         "products: the function has state or is random")
    stage("commutativity and error metrics")
    asymmetric = int((read.view(np.uint32) != read.T.view(np.uint32)).sum())
    claimed = fp8_spec.kind == "c" and bool(_CLAIMS_SYMMETRY.search(
        content.data.decode("utf-8", "replace")))
    add("commutative (T[a, b] == T[b, a])" + (" as the source claims" if claimed else ""),
        (asymmetric == 0) if claimed else None,
        "yes, over every finite code pair" if asymmetric == 0 else
        f"no: {asymmetric} of {read.size} finite code pairs differ from their swap")
    if bad.size == 0:
        metrics = fp8_error_metrics(table, fmt)
        result["fp8_metrics"] = metrics
        add("error vs the exact FP8 product", None,
            f"mean relative error {metrics['mean_relative_error_percent']:.4g}%, max "
            f"{metrics['max_relative_error_percent']:.4g}% (codes "
            f"{metrics['worst_pair'][0]:#04x} x {metrics['worst_pair'][1]:#04x}), exact on "
            f"{metrics['exact_pairs_percent']:.4g}% of {metrics['pairs']} finite code pairs, "
            f"{metrics['nonzero_for_zero_product']} nonzero products where the exact one is 0")
    if header:
        add("header figures", None, ", ".join(f"{k} = {v}" for k, v in header.items()))
    return result, (Fp8Kernel(fp8_spec, table, content.sha256) if bad.size == 0 else None)
