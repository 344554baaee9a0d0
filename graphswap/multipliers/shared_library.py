"""Scalar multipliers exported by a shared library (`LIB.so:SYMBOL[:OPTS]`).

The C signature of a compiled function is not visible, so it comes from OPTS or the name prefix;
return values are read through ctypes with exactly the declared width (a uint16_t return read
through a wider restype would pick up undefined upper register bits) and range-checked
(graphswap.multipliers.evaluation).  The library is loaded only once its ELF file passed the
allowlist of graphswap.native.elf_policy and every library it needs resolved to root's system
libraries (native.check_library_dependencies), from a private owner-only copy of the bytes that
were checked (native.private_copy, loaded through the descriptor it is hashed on), in a child
process (`kernels check`: in its own child process) - never from the user's file by its path.
"""

from __future__ import annotations

import os

from graphswap.errors import KernelSpecError
from graphswap.multipliers.evaluation import (EvaluationPlan, ResultType, evaluate_in_process,
                                              evaluate_isolated, table_from_raw)
from graphswap.multipliers.widths import WIDTH_DECLARATION, narrow_table, operand_widths
from graphswap.multipliers.record import Multiplier
from graphswap.native import FileContent, check_library_dependencies, private_copy

_SO_SIGNATURES = {
    # option: (argument type, return type, signed, C return type)  (table_child.CTYPES names)
    "u8": ("u8", "u16", False, "uint16_t"),
    "s8": ("s8", "s16", True, "int16_t"),
    "s8u": ("u8", "u16", True, "uint16_t"),
    "u64": ("u64", "u64", False, "uint64_t"),
}
SO_OPTIONS_HELP = ("options (comma-separated after a second ':'): u8x4 / s8x4 (N = 1..7) = an "
                   "8xN multiplier (8-bit activation, N-bit weight; signature u64, order ab unless "
                   "given), u4x8 / s4x8 = an Nx8 multiplier (N-bit activation, 8-bit weight), u8 = uint16_t f(uint8_t, uint8_t), "
                   "s8 = int16_t f(int8_t, int8_t), s8u = signed product declared with uint8_t/uint16_t "
                   "types, u64 = uint64_t f(uint64_t B, uint64_t A) (EvoApproxLib legacy); ab / ba = "
                   "operand order")


def from_shared_library(content: FileContent, symbol: str, options: str | None,
                        isolated: bool = True, row_order=None) -> Multiplier:
    """Evaluate a scalar multiplier exported by a shared library whose bytes were checked once;
    the library is loaded from a private copy of exactly those bytes - in a child process
    (`isolated`, graphswap.multipliers.evaluation), or in this one with the rows in `row_order`
    (kernels check's re-entrancy check)."""
    path = content.path
    opts = [o.strip() for o in options.split(",")] if options else []
    declared = [o for o in opts if WIDTH_DECLARATION.match(o)]
    opts = [o for o in opts if not WIDTH_DECLARATION.match(o)]
    if len(declared) > 1:
        raise KernelSpecError(f"{path}:{symbol}: give at most one width option; {SO_OPTIONS_HELP}")
    widths = operand_widths(symbol, declared[0] if declared else None, "", f"{path}:{symbol}")
    bad = [o for o in opts if o not in _SO_SIGNATURES and o not in ("ab", "ba")]
    if bad:
        raise KernelSpecError(f"{path}:{symbol}: unknown option(s) {', '.join(bad)}; {SO_OPTIONS_HELP}")
    sigs = [o for o in opts if o in _SO_SIGNATURES]
    orders = [o for o in opts if o in ("ab", "ba")]
    if len(sigs) > 1 or len(orders) > 1:
        raise KernelSpecError(f"{path}:{symbol}: give at most one signature and one order option; "
                              f"{SO_OPTIONS_HELP}")
    notes = [] if widths is None else [widths.how.split(";")[0]]
    if widths is not None and sigs and sigs[0] not in ("u64", "u8"):
        raise KernelSpecError(f"{path}:{symbol}: an 8xN multiplier from a shared library takes its "
                              f"operands as bit patterns: signature u64 (default) or u8; "
                              f"{SO_OPTIONS_HELP}")
    if widths is not None and not sigs:
        sigs = ["u64"]
        orders = orders or ["ab"]
        notes.append("signature u64 (uint64_t f(uint64_t A, uint64_t B), EvoApproxLib's 8xN "
                     "files) assumed for an 8xN multiplier")
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
    arg_type, ret_type, signed, c_return = _SO_SIGNATURES[signature]
    if widths is not None:
        signed = widths.signed
    # its ELF file must pass the allowlist and what the loader would load with it must be root's
    # system libraries: nothing unpinned runs (before the private copy is even made)
    check_library_dependencies(content, "multiplier library")
    copy = private_copy(content.data, content.sha256, os.path.basename(path))
    plan = EvaluationPlan(source=path, name=symbol, library=str(copy), sha256=content.sha256,
                          mode="symbol", symbol=symbol, arg=arg_type, ret=ret_type, order=order)
    raw = evaluate_isolated(plan, signed) if isolated else evaluate_in_process(plan, row_order)
    bits = 64 if ret_type == "u64" else 16
    result = ResultType(bits, ret_type.startswith("s"), signed, c_return)
    if widths is None:
        table = table_from_raw(raw, result, f"{path}:{symbol}", symbol)
    else:   # the weight's N-bit pattern is the low bits of codes 0..2^N-1
        result = ResultType(bits, False, signed, c_return)
        table = narrow_table(raw, result, widths.weight_bits, f"{path}:{symbol}", symbol,
                             widths.activation_bits)
    spec = f"{path}:{symbol}" + (f":{options}" if options else "")
    kind = "signed" if signed else "unsigned"
    return Multiplier(spec=spec, name=symbol, signed=signed, table=table,
                      description=f"{kind} multiplier {symbol} from {os.path.basename(path)}",
                      kind="so", path=path, sha256=content.sha256, notes=tuple(notes),
                      weight_bits=8 if widths is None else widths.weight_bits,
                      activation_bits=8 if widths is None else widths.activation_bits)
