"""Multipliers written in C (EvoApproxLib style): find the function and its signature by parsing
the source, generate a wrapper that fills the table, compile and evaluate both in the sandbox
(graphswap.multipliers.c_tables: only the table comes back, cached by the source's hash).

Signature generations understood (see graphswap.multipliers for the rules):
  legacy   uint64_t mul8u_X(const uint64_t B, const uint64_t A)  (order B, A)
  newer    uint16_t f(uint8_t A, uint8_t B) / int16_t mul8s_X(int8_t A, int8_t B)
  upstream bug: a signed multiplier (mul8s_*) declared with unsigned types.
  8xN      uint64_t mul8x4u_X(const uint64_t A /* 8-bit unsigned operand */,
                              const uint64_t B /* 4-bit unsigned operand */)
           (EvoApproxLib's mixed-precision multipliers): the N-bit operand is the weight; the
           widths come from the name (mul8x4u_ / mul8x4s_), the operand comments, or a
           declaration in the spec ('mul.c:u8x4' / 'mul.c:s8x4'); the product is read at its own
           width, 8 + N bits (a signed one as an (8 + N)-bit two's-complement pattern when the
           return type is unsigned).
"""

from __future__ import annotations

import dataclasses
import os
import re

from graphswap.errors import KernelSpecError
from graphswap.multipliers.c_tables import compiled_tables, source_copy_name
from graphswap.multipliers.evaluation import ResultType, table_from_raw
from graphswap.multipliers.metrics import parse_header_metrics
from graphswap.multipliers.record import Multiplier
from graphswap.multipliers.widths import (NAMED_WIDTHS, WIDTH_DECLARATION, Widths, narrow_table,
                                         operand_widths)
from graphswap.native import FileContent

_C_TYPES = {
    "uint8_t": (8, False), "unsigned char": (8, False), "int8_t": (8, True), "signed char": (8, True),
    "uint16_t": (16, False), "unsigned short": (16, False), "int16_t": (16, True), "short": (16, True),
    "uint32_t": (32, False), "unsigned": (32, False), "unsigned int": (32, False),
    "int32_t": (32, True), "int": (32, True),
    "uint64_t": (64, False), "unsigned long": (64, False), "unsigned long long": (64, False),
    "int64_t": (64, True), "long": (64, True), "long long": (64, True),
}
_FUNCTION = re.compile(
    r"(?P<ret>\b(?:(?:const|static|inline|extern|unsigned|signed)\s+)*[A-Za-z_]\w*(?:\s+(?:int|char|short|long))*)"
    r"\s+(?P<name>[A-Za-z_]\w*)\s*\((?P<params>[^()]*)\)\s*\{")
ACCEPTED_SIGNATURES = (
    "uint64_t mul8u_NAME(const uint64_t B, const uint64_t A)  (EvoApproxLib legacy), "
    "uint16_t f(uint8_t A, uint8_t B), int16_t mul8s_NAME(int8_t A, int8_t B), or any integer "
    "return type with two 8/16/32/64-bit integer operands")


def _strip_comments(source: str) -> str:
    source = re.sub(r"/\*.*?\*/", " ", source, flags=re.DOTALL)
    return re.sub(r"//[^\n]*", " ", source)


def _normalise_type(text: str) -> str:
    words = [w for w in text.split() if w not in ("const", "static", "inline", "extern", "volatile",
                                                    "register")]
    if words[-1:] == ["int"] and len(words) > 1 and words[0] in ("unsigned", "signed", "short", "long"):
        words = words[:-1] if words != ["signed", "int"] else ["int"]
    if words[:1] == ["signed"] and words[1:] and words[1] != "char":
        words = words[1:]
    return " ".join(words)


@dataclasses.dataclass
class _CFunction:
    name: str
    ret: str
    params: list  # [(type, name)]


def _find_functions(source: str) -> list[_CFunction]:
    found = []
    for match in _FUNCTION.finditer(_strip_comments(source)):
        ret = _normalise_type(match.group("ret"))
        if ret in ("if", "while", "for", "switch", "return", "else"):
            continue
        params = []
        for part in match.group("params").split(","):
            words = part.replace("*", " * ").split()
            if not words:
                continue
            if "*" in words or len(words) < 2:
                params.append((" ".join(words), ""))
                continue
            params.append((_normalise_type(" ".join(words[:-1])), words[-1]))
        found.append(_CFunction(match.group("name"), ret, params))
    return found


@dataclasses.dataclass
class _Signature:
    """How to call a parsed multiplier: argument C types, order, and how to read the result."""

    signed: bool
    arg_type: str          # C type the operands are converted to
    swap: bool             # call f(second, first)
    result: ResultType     # the declared return type (how the raw results are read)
    generation: str
    notes: tuple


def _classify(fn: _CFunction, path: str, widths: Widths | None = None) -> _Signature:
    unsupported = (f"{path}: function {fn.name}({', '.join(' '.join(p) for p in fn.params)}) "
                   f"returning {fn.ret} has an unsupported signature; a multiplier takes two integer "
                   f"operands and returns an integer, e.g. {ACCEPTED_SIGNATURES}")
    if len(fn.params) != 2:
        raise KernelSpecError(unsupported)
    (t1, n1), (t2, n2) = fn.params
    if t1 not in _C_TYPES or t2 not in _C_TYPES or fn.ret not in _C_TYPES or t1 != t2 or not n1 or not n2:
        raise KernelSpecError(unsupported)
    bits, type_signed = _C_TYPES[t1]
    ret_bits, ret_signed = _C_TYPES[fn.ret]
    prefix = "s" if fn.name.startswith("mul8s") else "u" if fn.name.startswith("mul8u") else None
    notes = []
    if widths is not None:
        width = f"{widths.activation_bits}x{widths.weight_bits}"
        if type_signed and not widths.signed:
            raise KernelSpecError(
                f"{path}: {fn.name} is an unsigned {width} multiplier ({widths.how}) "
                f"but takes signed {t1} operands; graphswap will not guess which is right: "
                f"declare its operands unsigned, or use mul{width}s_ / s{width}")
        return _Signature(widths.signed, t1, widths.weight_param == 0,
                          ResultType(ret_bits, ret_signed, widths.signed, fn.ret),
                          f"{width} ({bits}-bit operand types)",
                          (widths.how,))
    if prefix == "s" and not type_signed:
        signed = True
        notes.append(f"{fn.name} is named as a signed multiplier (mul8s_) but declared with unsigned "
                     f"{t1} operands (a known EvoApproxLib upstream issue): operands are passed as "
                     f"two's-complement bit patterns and the result's low 16 bits are read as int16")
    elif prefix == "u" and type_signed:
        raise KernelSpecError(
            f"{path}: {fn.name} is named as an unsigned multiplier (mul8u_) but takes signed {t1} "
            f"operands; graphswap will not guess which is right: rename it mul8s_... if it is "
            f"signed, or declare its operands unsigned (uint8_t) if it is unsigned")
    elif bits == 8:
        signed = type_signed
        notes.append(f"signedness from the operand type {t1}")
    elif prefix is not None:
        signed = prefix == "s"
        notes.append(f"signedness from the name prefix mul8{prefix}_ ({t1} operands)")
    else:
        raise KernelSpecError(
            f"{path}: cannot tell whether {fn.name}({t1}, {t2}) multiplies signed or unsigned 8-bit "
            f"operands; use uint8_t / int8_t operands, or name it mul8u_... / mul8s_...")
    if bits == 8 and type_signed:
        arg_type = "int8_t"
    elif bits == 8:
        arg_type = "uint8_t"
    else:
        arg_type = t1
    names = (n1.lower(), n2.lower())
    if names == ("a", "b"):
        swap = False
        notes.append("operand order by parameter names: f(A = first, B = second)")
    elif names == ("b", "a"):
        swap = True
        notes.append("operand order by parameter names: f(B = second, A = first) (EvoApproxLib legacy)")
    else:
        swap = False
        notes.append(f"operand order positional: {fn.name}({n1} = first, {n2} = second)")
    # signed results narrower than int32, or delivered in an unsigned type, are 16-bit patterns
    result = ResultType(ret_bits, ret_signed, signed, fn.ret)
    if bits == 64 and not type_signed:
        generation = "EvoApproxLib legacy (uint64_t operands)"
    elif bits == 8:
        generation = "8-bit operands"
    else:
        generation = f"{bits}-bit operands"
    return _Signature(signed, arg_type, swap, result, generation, tuple(notes))


_WRAPPER_VERSION_COMMENT = "/* wrapper 5: compiled in the sandbox */\n"


def _wrapper_source(fn: _CFunction, sig: _Signature, include_name: str,
                    weight_bits: int = 8, activation_bits: int = 8) -> str:
    """C that fills one row of raw results: each return value at its declared width, zero- or
    sign-extended to 64 bits (graphswap.multipliers.evaluation reads and range-checks them).
    An 8xN multiplier's weight operand gets y's low N bits (sign-extended when signed): the
    columns y < 2^N are its products."""
    operand = {"int8_t": "(int8_t)(uint8_t)", "uint8_t": "(uint8_t)"}.get(sig.arg_type, None)
    if operand is None:
        # wider operand types: unsigned multipliers get 0..255, signed ones -128..127
        operand = f"({sig.arg_type})(int8_t)(uint8_t)" if sig.signed else f"({sig.arg_type})"
    first, second = f"{operand}x", f"{operand}y"
    if weight_bits != 8:
        mask, half = 2 ** weight_bits - 1, 2 ** (weight_bits - 1)
        second = (f"({sig.arg_type})(int64_t)((int)((y & {mask}u) ^ {half}u) - {half})"
                  if sig.signed else f"({sig.arg_type})(y & {mask}u)")
    if activation_bits != 8:   # an Nx8 multiplier: rows x < 2^N are its products
        mask, half = 2 ** activation_bits - 1, 2 ** (activation_bits - 1)
        first = (f"({sig.arg_type})(int64_t)((int)((x & {mask}u) ^ {half}u) - {half})"
                 if sig.signed else f"({sig.arg_type})(x & {mask}u)")
    args = f"{second}, {first}" if sig.swap else f"{first}, {second}"
    widen = "(uint64_t)(int64_t)" if sig.result.type_signed else "(uint64_t)"
    return (
        "/* generated by graphswap: evaluates one row of the multiplier's 256x256 table */\n"
        "#include <stdint.h>\n"
        f'#include "{include_name}"\n'
        "__attribute__((visibility(\"default\"))) void graphswap_fill_multiplier_row("
        "unsigned x, uint64_t *raw)\n"
        "{\n"
        "    for (unsigned y = 0; y < 256; ++y)\n"
        f"        raw[y] = {widen}({fn.name}({args}));\n"
        "}\n")


def compile_error(path: str, output: str, what: str = "multiplier",
                  instead: str = "a prebuilt 'lib.so:symbol' or a .lut table") -> KernelSpecError:
    """The compiler's whole output (the private copy already named by the user's file)."""
    return KernelSpecError(f"cannot compile {what} {path}: {output}\nFix the C source (it "
                           f"must compile with 'cc -c'), or pass {instead}")


def from_c_source(content: FileContent, function: str | None, passes=None,
                  concurrent=()) -> Multiplier | list[Multiplier]:
    """Compile and evaluate the multiplier in a C source whose bytes were read (and checked) once.

    Compiled and evaluated in the sandbox from a private copy of exactly `content.data`
    (graphswap.multipliers.c_tables); only the table comes back.  With `passes` / `concurrent`
    (row orders: kernels check's determinism and re-entrancy checks), every table evaluated in
    that one process, as a list of multipliers."""
    path = content.path
    sha = content.sha256
    source = content.data.decode("utf-8", "replace")
    header, header_text = parse_header_metrics(source, path)   # refused before any compiling
    include_name = source_copy_name(path)

    functions = [f for f in _find_functions(source) if len(f.params) == 2]
    declared = None
    if function is not None and WIDTH_DECLARATION.match(function):
        declared, function = function, None   # 'mul.c:u8x4' declares widths, names no function
    if function is not None:
        chosen = [f for f in functions if f.name == function]
        if not chosen:
            all_names = [f.name for f in _find_functions(source)]
            raise KernelSpecError(
                f"{path}: no two-operand function named {function!r}; functions found: "
                f"{', '.join(all_names) or 'none'}")
    else:
        chosen = [f for f in functions if f.name.startswith(("mul8u", "mul8s"))
                  or NAMED_WIDTHS.match(f.name)] or functions
    if not chosen:
        # Maybe the source does not even compile: the compiler's message is the useful one then.
        probe = (f'#include "{include_name}"\n__attribute__((visibility("default"))) void '
                 f'graphswap_fill_multiplier_row(unsigned x, unsigned long *raw) {{ (void)x; '
                 f'(void)raw; }}\n')
        compiled_tables(content, probe, "syntax check", False, "multiplier source",
                        lambda output: compile_error(path, output), passes=[[]])
        found = [f"{f.ret} {f.name}({', '.join(' '.join(p) for p in f.params)})"
                 for f in _find_functions(source)]
        raise KernelSpecError(
            f"{path}: no multiplier function found (functions seen: {'; '.join(found) or 'none'}); "
            f"expected one of: {ACCEPTED_SIGNATURES}")
    if len(chosen) > 1:
        raise KernelSpecError(
            f"{path} defines several candidate multipliers ({', '.join(f.name for f in chosen)}); "
            f"pick one with '{path}:FUNCTION'")
    fn = chosen[0]
    widths = operand_widths(fn.name, declared, source, path)
    weight_bits = 8 if widths is None else widths.weight_bits
    activation_bits = 8 if widths is None else widths.activation_bits
    sig = _classify(fn, path, widths)
    wrapper = _wrapper_source(fn, sig, include_name, weight_bits, activation_bits)
    raws = compiled_tables(content, wrapper + _WRAPPER_VERSION_COMMENT, fn.name, sig.signed,
                           "multiplier source", lambda output: compile_error(path, output),
                           passes=passes, concurrent=concurrent)

    def multiplier(raw):
        if widths is None:
            table = table_from_raw(raw, sig.result, path, fn.name)
        else:
            table = narrow_table(raw, sig.result, weight_bits, path, fn.name, activation_bits)
        spec = path + (f":{function}" if function else f":{declared}" if declared else "")
        kind = "signed" if sig.signed else "unsigned"
        return Multiplier(spec=spec, name=fn.name, signed=sig.signed, table=table,
                          description=f"{kind} multiplier {fn.name} from "
                                      f"{os.path.basename(path)} ({sig.generation})",
                          kind="c", path=path, sha256=sha, header_metrics=header,
                          header_metrics_text=header_text, notes=sig.notes,
                          weight_bits=weight_bits, activation_bits=activation_bits)

    if passes is None and not concurrent:
        return multiplier(raws[0])
    return [multiplier(raw) for raw in raws]
