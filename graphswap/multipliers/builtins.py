"""Built-in multipliers: mul8u_/mul8s_ exact, trunc1..8, drum3..6, mitchell.

Their C lives in native_kernels/src/multipliers.c (with citations); the table comes from the
shipped library.
"""

from __future__ import annotations

import re

from graphswap.errors import KernelSpecError
from graphswap.multipliers.record import Multiplier
from graphswap.native import shipped_library

_BUILTIN = re.compile(r"^mul8([us])_(exact|mitchell|trunc(\d+)|drum(\d+))$")
_BUILTIN_LIKE = re.compile(r"^mul8[us]_[A-Za-z0-9_]+$")
TRUNC_RANGE = range(1, 9)
DRUM_RANGE = range(3, 7)


def _builtin_description(signed: bool, design: str, k: int | None) -> str:
    kind = "signed int8" if signed else "unsigned uint8"
    if design == "exact":
        return f"exact {kind} product"
    if design == "trunc":
        extra = " (two's-complement bits, i.e. floor to a multiple of 2^k)" if signed else ""
        return f"{kind} product with its {k} least significant bits cleared{extra}"
    if design == "drum":
        sm = ", sign-magnitude" if signed else ""
        return (f"DRUM-{k} (Hashemi, Bahar, Reda, ICCAD 2015): operands cut to {k} bits from the leading "
                f"one, LSB set to 1 (unbiased){sm}")
    sm = ", sign-magnitude" if signed else ""
    return f"Mitchell's logarithmic multiplier (IRE Trans. EC-11, 1962){sm}, {kind}"


def builtin_multipliers() -> dict[str, str]:
    """Every concrete built-in multiplier name -> one-line description."""
    names = {}
    for s in "us":
        signed = s == "s"
        names[f"mul8{s}_exact"] = _builtin_description(signed, "exact", None)
        for k in TRUNC_RANGE:
            names[f"mul8{s}_trunc{k}"] = _builtin_description(signed, "trunc", k)
        for k in DRUM_RANGE:
            names[f"mul8{s}_drum{k}"] = _builtin_description(signed, "drum", k)
        names[f"mul8{s}_mitchell"] = _builtin_description(signed, "mitchell", None)
    return names


def looks_like_builtin(spec: str) -> bool:
    """Is `spec` shaped like a built-in multiplier name (mul8u_... / mul8s_...)?"""
    return bool(_BUILTIN_LIKE.match(spec))


def builtin_multiplier(spec: str) -> Multiplier:
    """The built-in multiplier `spec` (KernelSpecError naming the built-ins for an unknown one)."""
    match = _BUILTIN.match(spec)
    if match is None:
        raise KernelSpecError(
            f"unknown built-in multiplier {spec!r}; built-ins are mul8u_/mul8s_ followed by exact, "
            f"trunc1..trunc8, drum3..drum6 or mitchell (list them with 'graphswap kernels'); for your "
            f"own multiplier pass its .c file, 'lib.so:symbol' or a .lut/.bin table")
    signed = match.group(1) == "s"
    design = match.group(2)
    k = None
    if match.group(3) is not None:
        design, k = "trunc", int(match.group(3))
        if k not in TRUNC_RANGE:
            raise KernelSpecError(f"{spec}: trunc{{k}} needs 1 <= k <= 8, got k = {k}")
    elif match.group(4) is not None:
        design, k = "drum", int(match.group(4))
        if k not in DRUM_RANGE:
            raise KernelSpecError(f"{spec}: drum{{k}} needs 3 <= k <= 6, got k = {k}")
    table = shipped_library().builtin_multiplier_table(spec)
    return Multiplier(spec=spec, name=spec, signed=signed, table=table,
                      description=_builtin_description(signed, design, k), kind="builtin")

