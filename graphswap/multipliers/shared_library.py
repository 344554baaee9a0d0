"""Scalar multipliers exported by a shared library (`LIB.so:SYMBOL[:OPTS]`).

The C signature of a compiled function is not visible, so it comes from OPTS or the name prefix;
return values are read through ctypes with exactly the declared width (a uint16_t return read
through a wider restype would pick up undefined upper register bits).  The library is loaded from
a private copy of the bytes that were checked.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

from graphswap.errors import KernelSpecError
from graphswap.multipliers.record import TABLE_SIZE, Multiplier, table_from_products
from graphswap.native import FileContent, private_copy

_SO_SIGNATURES = {
    # option: (ctypes argument type, ctypes return type, signed, result is a 16-bit pattern)
    "u8": (ctypes.c_uint8, ctypes.c_uint16, False, False),
    "s8": (ctypes.c_int8, ctypes.c_int16, True, False),
    "s8u": (ctypes.c_uint8, ctypes.c_uint16, True, True),
    "u64": (ctypes.c_uint64, ctypes.c_uint64, False, False),
}
SO_OPTIONS_HELP = ("options (comma-separated after a second ':'): u8 = uint16_t f(uint8_t, uint8_t), "
                   "s8 = int16_t f(int8_t, int8_t), s8u = signed product declared with uint8_t/uint16_t "
                   "types, u64 = uint64_t f(uint64_t B, uint64_t A) (EvoApproxLib legacy); ab / ba = "
                   "operand order")


def from_shared_library(content: FileContent, symbol: str, options: str | None) -> Multiplier:
    """Evaluate a scalar multiplier exported by a shared library whose bytes were checked once;
    the library is loaded from a private copy of exactly those bytes."""
    path = content.path
    opts = [o.strip() for o in options.split(",")] if options else []
    bad = [o for o in opts if o not in _SO_SIGNATURES and o not in ("ab", "ba")]
    if bad:
        raise KernelSpecError(f"{path}:{symbol}: unknown option(s) {', '.join(bad)}; {SO_OPTIONS_HELP}")
    sigs = [o for o in opts if o in _SO_SIGNATURES]
    orders = [o for o in opts if o in ("ab", "ba")]
    if len(sigs) > 1 or len(orders) > 1:
        raise KernelSpecError(f"{path}:{symbol}: give at most one signature and one order option; "
                              f"{SO_OPTIONS_HELP}")
    notes = []
    if sigs:
        signature = sigs[0]
        notes.append(f"signature {signature} given in the spec")
    elif symbol.startswith("mul8u"):
        signature = "u8"
        notes.append("signature u8 (uint16_t f(uint8_t, uint8_t)) assumed from the mul8u prefix")
    elif symbol.startswith("mul8s"):
        signature = "s8"
        notes.append("signature s8 (int16_t f(int8_t, int8_t)) assumed from the mul8s prefix")
    else:
        raise KernelSpecError(
            f"{path}:{symbol}: cannot tell the C signature of {symbol!r} from a compiled library; name "
            f"it mul8u_.../mul8s_... or say it in the spec, e.g. '{path}:{symbol}:u8'; {SO_OPTIONS_HELP}")
    if signature == "u64" and symbol.startswith("mul8s"):
        raise KernelSpecError(f"{path}:{symbol}: u64 is the unsigned legacy signature but the name says "
                              f"signed; use s8u for a signed multiplier with unsigned types")
    order = orders[0] if orders else ("ba" if signature == "u64" else "ab")
    notes.append(f"operand order {order}: called as {symbol}({'first, second' if order == 'ab' else 'second, first'})")
    try:
        library = ctypes.CDLL(str(private_copy(content.data, content.sha256,
                                               os.path.basename(path))))
    except OSError as exc:
        raise KernelSpecError(f"cannot load {path}: {exc}; it must be a shared library built for this "
                              f"machine (cc -O2 -shared -fPIC mul.c -o libmul.so)") from None
    try:
        function = getattr(library, symbol)
    except AttributeError:
        raise KernelSpecError(
            f"symbol {symbol!r} not found in {path}; check the exported names with 'nm -D {path}' (a "
            f"function compiled with -fvisibility=hidden or declared static is not exported)") from None
    arg_type, ret_type, signed, twos = _SO_SIGNATURES[signature]
    function.argtypes = [arg_type, arg_type]
    function.restype = ret_type
    values = np.empty(TABLE_SIZE, dtype=np.int64)
    codes = range(256)
    for x in codes:
        first = (x - 256 if x > 127 else x) if arg_type is ctypes.c_int8 else x
        row = values[x << 8:(x + 1) << 8]
        for y in codes:
            second = (y - 256 if y > 127 else y) if arg_type is ctypes.c_int8 else y
            row[y] = function(first, second) if order == "ab" else function(second, first)
    if twos:
        values = values.astype(np.uint16).view(np.int16).astype(np.int64)
    table = table_from_products(values, f"{path}:{symbol}")
    spec = f"{path}:{symbol}" + (f":{options}" if options else "")
    kind = "signed" if signed else "unsigned"
    return Multiplier(spec=spec, name=symbol, signed=signed, table=table,
                      description=f"{kind} multiplier {symbol} from {os.path.basename(path)}",
                      kind="so", path=path, sha256=content.sha256, notes=tuple(notes))

