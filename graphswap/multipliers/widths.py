"""Operand widths of mixed-precision multipliers (8xN: an N-bit weight; Nx8: an N-bit
activation; N = 1..7): recognised from a spec declaration ('FILE.c:u8x4', 'FILE.c:u4x8'),
EvoApproxLib's names (mul8x4u_..., mul4x8u_...) or the operands' '/* 4-bit unsigned operand */'
comments, and the circuit's raw results read at its own width into the 256x256 layout
(record.embed_weight_table).  Used by csource (C files) and shared_library (.so symbols).
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from graphswap.errors import KernelSpecError
from graphswap.multipliers.evaluation import ResultType
from graphswap.multipliers.record import embed_weight_table

#: a width declared in the spec: u8x4 = unsigned, 8-bit activation x 4-bit weight (u4x8: Nx8);
#: any number of bits matches, so that a width graphswap cannot run gets _check_widths' error
WIDTH_DECLARATION = re.compile(r"^(?P<sign>[us])(?P<a>\d{1,2})x(?P<b>\d{1,2})$")
NAMED_WIDTHS = re.compile(r"^mul(?P<a>[1-8])x(?P<b>[1-8])(?P<sign>[us])_")
_OPERAND_COMMENT = re.compile(r"(?P<bits>[1-8])-bit\s+(?P<sign>signed|unsigned)\s+operand",
                              re.IGNORECASE)
WIDTH_HELP = ("an 8xN multiplier (N = 1..7 bits of weight) is named mul8xNu_... / mul8xNs_... "
              "(EvoApproxLib), carries '/* N-bit unsigned operand */' comments on its operands, "
              "or is declared in the spec: 'FILE.c:u8x4' (unsigned) / 'FILE.c:s8x4' (signed), "
              "'LIB.so:SYMBOL:u8x4'; an Nx8 multiplier (N-bit activation, 8-bit weight) likewise: "
              "mul4x8u_... / mul4x8s_..., the N-bit comment on its operand A, or 'FILE.c:u4x8'")


@dataclasses.dataclass(frozen=True)
class Widths:
    """Operand widths of an 8xN multiplier: its signedness, N, the parameter holding the weight."""

    signed: bool
    weight_bits: int
    weight_param: int   # 0 or 1: which C parameter is the weight (the N-bit one of an 8xN)
    how: str
    activation_bits: int = 8   # N of an Nx8 multiplier (the activation is the narrow operand)


def _check_widths(a_bits: int, b_bits: int, where: str) -> None:
    if (a_bits == 8 and 1 <= b_bits <= 8) or (b_bits == 8 and 1 <= a_bits <= 8):
        return
    raise KernelSpecError(f"{where}: operand widths {a_bits}x{b_bits} are not supported; one "
                          f"operand must have 8 bits (8xN: N-bit weight, Nx8: N-bit activation, "
                          f"N = 1..7): {WIDTH_HELP}")


def _operand_comments(source: str, fn_name: str) -> list:
    """[(bits, signed, parameter name)] of the operands' '/* 4-bit unsigned operand */'
    comments, or []."""
    match = re.search(rf"\b{re.escape(fn_name)}\s*\((?P<params>[^(){{}};]*)\)\s*\{{", source)
    if not match:
        return []
    found = []
    for part in match.group("params").split(","):
        comment = _OPERAND_COMMENT.search(part)
        if comment is None:
            return []
        name = re.findall(r"[A-Za-z_]\w*", re.sub(r"/\*.*?\*/|//[^\n]*", " ", part,
                                                   flags=re.DOTALL))
        found.append((int(comment.group("bits")), comment.group("sign").lower() == "signed",
                      name[-1] if name else ""))
    return found if len(found) == 2 else []


def operand_widths(fn_name: str, declared: str | None, source: str, where: str) -> Widths | None:
    """The widths of an 8xN or Nx8 multiplier (None for an 8x8 one): from the spec's
    declaration, the EvoApproxLib name, or the operand comments, in that order; contradictions
    are errors.  From comments alone the narrow operand is the weight (8xN), unless it is the
    parameter named A (EvoApproxLib's first operand, the activation): then Nx8."""
    comments = _operand_comments(source, fn_name)
    if declared is not None:
        m = WIDTH_DECLARATION.match(declared)
        a_bits, b_bits, signed, how = (int(m.group("a")), int(m.group("b")), m.group("sign") == "s",
                                       f"widths {declared} declared in the spec")
    elif NAMED_WIDTHS.match(fn_name):
        m = NAMED_WIDTHS.match(fn_name)
        a_bits, b_bits, signed, how = (int(m.group("a")), int(m.group("b")), m.group("sign") == "s",
                                       f"widths {m.group('a')}x{m.group('b')} from the name "
                                       f"{fn_name}")
    elif comments and {c[0] for c in comments} != {8}:
        bits = sorted(c[0] for c in comments)
        if len({c[1] for c in comments}) != 1:
            raise KernelSpecError(f"{where}: {fn_name}'s operand comments mix signed and unsigned "
                                  f"operands; declare the widths in the spec: {WIDTH_HELP}")
        narrow = min(comments, key=lambda c: c[0])
        if narrow[2].upper() == "A" and bits[1] == 8 and bits[0] != 8:   # Nx8: A is narrow
            a_bits, b_bits = bits[0], bits[1]
        else:
            a_bits, b_bits = bits[1], bits[0]
        signed = comments[0][1]
        how = f"widths {a_bits}x{b_bits} from the operand comments"
    else:
        return None
    _check_widths(a_bits, b_bits, where)
    if a_bits == 8 and b_bits == 8:
        return None
    if comments:
        comment_bits = [c[0] for c in comments]
        if sorted(comment_bits) != sorted([a_bits, b_bits]) or comments[0][1] != signed:
            raise KernelSpecError(
                f"{where}: {fn_name}'s operand comments ({', '.join(f'{b}-bit' for b in comment_bits)}"
                f" {'signed' if comments[0][1] else 'unsigned'}) contradict the {how}; fix the "
                f"name or the spec: {WIDTH_HELP}")
        weight_param = comment_bits.index(b_bits)
        how += f"; the {b_bits}-bit weight is parameter {weight_param + 1} (operand comments)"
    else:
        weight_param = 1
        how += f"; the {b_bits}-bit weight is parameter 2 (no operand comments)"
    return Widths(signed, b_bits, weight_param, how, activation_bits=a_bits)


def narrow_table(raw, result: ResultType, weight_bits: int, where: str, name: str,
                 activation_bits: int = 8):
    """The 65536-entry table of an 8xN multiplier from its raw results (columns y < 2^N hold the
    products of the N-bit weight codes; rows x < 2^N the N-bit activation codes of an Nx8 one):
    each product read at the circuit's width 8 + N (a signed product in an unsigned type as an
    (8 + N)-bit two's-complement pattern), range-checked."""
    bits = activation_bits + weight_bits
    width = f"{activation_bits}x{weight_bits}"
    raw = np.asarray(raw, dtype=np.uint64).reshape(256, 256)[:2 ** activation_bits,
                                                             :2 ** weight_bits]
    if result.multiplier_signed and not result.type_signed:
        low = (raw & np.uint64(2 ** bits - 1)).astype(np.int64)
        products = np.where(low >= 2 ** (bits - 1), low - 2 ** bits, low)
        ok = (raw < 2 ** bits) | (raw >= np.uint64(2 ** 64 - 2 ** (bits - 1)))
    else:
        products = raw.view(np.int64) if result.type_signed else raw.astype(np.int64)
        lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if result.multiplier_signed \
            else (0, 2 ** bits - 1)
        ok = (products >= lo) & (products <= hi)
        if not result.type_signed:
            ok &= raw <= np.uint64(hi)
    bad = np.argwhere(~ok)
    if bad.size:
        a, b = (int(v) for v in bad[0])
        raise KernelSpecError(
            f"{where}: {name} returned {int(raw[a, b])} for activation code {a} and weight code {b}, "
            f"outside the {bits}-bit range of an {width} product ({bad.shape[0]} such "
            f"results); check the declared widths and signedness: {WIDTH_HELP}")
    return embed_weight_table(products, result.multiplier_signed, weight_bits, f"{where}:{name}",
                              activation_bits)
