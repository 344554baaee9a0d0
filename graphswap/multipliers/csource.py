"""Multipliers written in C (EvoApproxLib style): find the function and its signature by parsing
the source, generate a wrapper that fills the table, compile both into the per-user cache (keyed
by the source's hash; a cached binary is reused only if its hash matches the record graphswap wrote
when it built it, native.cache), evaluate.

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
import hashlib
import os
import re
from pathlib import Path

import numpy as np

from graphswap.errors import KernelSpecError
from graphswap.multipliers.evaluation import (EvaluationPlan, ResultType, evaluate_in_process,
                                              evaluate_isolated, table_from_raw)
from graphswap.multipliers.metrics import parse_header_metrics
from graphswap.multipliers.record import Multiplier, embed_weight_table
from graphswap.native import (FileContent, cache_dir, compiler, owner_only_directory,
                              record_artefact, recorded_artefact, remove_stale,
                              write_atomically)

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


#: a width declared in the spec: u8x4 = unsigned, 8-bit activation x 4-bit weight
WIDTH_DECLARATION = re.compile(r"^(?P<sign>[us])(?P<a>[1-8])x(?P<b>[1-8])$")
_NAMED_WIDTHS = re.compile(r"^mul(?P<a>[1-8])x(?P<b>[1-8])(?P<sign>[us])_")
_OPERAND_COMMENT = re.compile(r"(?P<bits>[1-8])-bit\s+(?P<sign>signed|unsigned)\s+operand",
                              re.IGNORECASE)
WIDTH_HELP = ("an 8xN multiplier (N = 1..7 bits of weight) is named mul8xNu_... / mul8xNs_... "
              "(EvoApproxLib), carries '/* N-bit unsigned operand */' comments on its operands, "
              "or is declared in the spec: 'FILE.c:u8x4' (unsigned) / 'FILE.c:s8x4' (signed), "
              "'LIB.so:SYMBOL:u8x4'")


@dataclasses.dataclass(frozen=True)
class _Widths:
    """Operand widths of an 8xN multiplier: its signedness, N, the parameter holding the weight."""

    signed: bool
    weight_bits: int
    weight_param: int   # 0 or 1: which C parameter is the N-bit weight
    how: str


def _check_widths(a_bits: int, b_bits: int, where: str) -> None:
    if a_bits == 8 and 1 <= b_bits <= 8:
        return
    if b_bits == 8:
        raise KernelSpecError(
            f"{where}: {a_bits}x{b_bits} multipliers (the activation narrower than the weight) are "
            f"not supported; graphswap runs 8xN multipliers whose weight (second operand) has "
            f"N = 1..8 bits: {WIDTH_HELP}")
    raise KernelSpecError(f"{where}: operand widths {a_bits}x{b_bits} are not supported; one "
                          f"operand must be the 8-bit activation: {WIDTH_HELP}")


def _operand_comments(source: str, fn_name: str) -> list:
    """[(bits, signed)] of the operands' '/* 4-bit unsigned operand */' comments, or []."""
    match = re.search(rf"\b{re.escape(fn_name)}\s*\((?P<params>[^(){{}};]*)\)\s*\{{", source)
    if not match:
        return []
    found = []
    for part in match.group("params").split(","):
        comment = _OPERAND_COMMENT.search(part)
        if comment is None:
            return []
        found.append((int(comment.group("bits")), comment.group("sign").lower() == "signed"))
    return found if len(found) == 2 else []


def operand_widths(fn_name: str, declared: str | None, source: str, where: str) -> _Widths | None:
    """The widths of an 8xN multiplier (None for an 8x8 one): from the spec's declaration, the
    EvoApproxLib name, or the operand comments, in that order; contradictions are errors."""
    comments = _operand_comments(source, fn_name)
    if declared is not None:
        m = WIDTH_DECLARATION.match(declared)
        a_bits, b_bits, signed, how = (int(m.group("a")), int(m.group("b")), m.group("sign") == "s",
                                       f"widths {declared} declared in the spec")
    elif _NAMED_WIDTHS.match(fn_name):
        m = _NAMED_WIDTHS.match(fn_name)
        a_bits, b_bits, signed, how = (int(m.group("a")), int(m.group("b")), m.group("sign") == "s",
                                       f"widths {m.group('a')}x{m.group('b')} from the name "
                                       f"{fn_name}")
    elif comments and {bits for bits, _ in comments} != {8}:
        bits = sorted(b for b, _ in comments)
        if len({s for _, s in comments}) != 1:
            raise KernelSpecError(f"{where}: {fn_name}'s operand comments mix signed and unsigned "
                                  f"operands; declare the widths in the spec: {WIDTH_HELP}")
        a_bits, b_bits, signed = bits[1], bits[0], comments[0][1]
        how = f"widths {a_bits}x{b_bits} from the operand comments"
    else:
        return None
    _check_widths(a_bits, b_bits, where)
    if b_bits == 8:
        return None
    if comments:
        comment_bits = [b for b, _ in comments]
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
    return _Widths(signed, b_bits, weight_param, how)


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


def _classify(fn: _CFunction, path: str, widths: _Widths | None = None) -> _Signature:
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
        if type_signed and not widths.signed:
            raise KernelSpecError(
                f"{path}: {fn.name} is an unsigned 8x{widths.weight_bits} multiplier ({widths.how}) "
                f"but takes signed {t1} operands; graphswap will not guess which is right: "
                f"declare its operands unsigned, or use mul8x{widths.weight_bits}s_ / "
                f"s8x{widths.weight_bits}")
        return _Signature(widths.signed, t1, widths.weight_param == 0,
                          ResultType(ret_bits, ret_signed, widths.signed, fn.ret),
                          f"8x{widths.weight_bits} ({bits}-bit operand types)",
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


_WRAPPER_VERSION = "3"  # 2: built portable (no -march=native); 3: 8xN operands


def _wrapper_source(fn: _CFunction, sig: _Signature, include_name: str,
                    weight_bits: int = 8) -> str:
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


def compile_error(path: str, exc: Exception, copied: Path, what: str = "multiplier",
                   instead: str = "a prebuilt 'lib.so:symbol' or a .lut table") -> KernelSpecError:
    """The compiler's whole output, with the private copy's name replaced by the user's file."""
    output = str(exc).replace(str(copied), path)
    output = re.sub(r"\S*/wrapper-(?:fp8-)?[0-9a-f]+\.c", "graphswap's generated wrapper", output)
    return KernelSpecError(f"cannot compile {what} {path}: {output}\nFix the C source (it "
                           f"must compile with 'cc -c'), or pass {instead}")


def private_source_copy(content: FileContent) -> tuple[Path, Path]:
    """(the owner-only cache folder of these source bytes, the private copy of exactly those
    bytes in it): the compiler sees the copy, never the user's file."""
    # per-user cache: nobody else may plant binaries in it
    workdir = owner_only_directory(owner_only_directory(cache_dir() / "multipliers")
                                   / content.sha256[:24])
    copied = workdir / ("source_" + re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.basename(content.path)))
    write_atomically(copied, content.data)  # a rename replaces whatever was there
    return workdir, copied


def built_wrapper(workdir: Path, wrapper: str, wrapper_name: str, library_path: Path,
                  compile_error):
    """The recorded artefact of `wrapper` compiled into `library_path` (closed; its sha256 is
    what the evaluating process checks): reused only if it is the binary graphswap built (its
    hash matches graphswap's record in the cache; a planted file, or a `.sha256` file beside
    one, counts for nothing), else rebuilt; `compile_error(exc)` is the error a failed build
    raises."""
    checked = recorded_artefact(library_path)
    if checked is None:
        remove_stale(library_path)
        wrapper_path = workdir / wrapper_name
        write_atomically(wrapper_path, wrapper.encode())
        try:
            # portable: the table is filled once, and a cache shared by machines (a home directory
            # on a cluster) must not hold code another CPU cannot run
            compiler.compile_shared([wrapper_path], library_path, include_dirs=[workdir],
                                    portable=True)
        except compiler.CompilerError as exc:
            raise compile_error(exc) from None
        checked = record_artefact(library_path)
    checked.close()
    return checked


def from_c_source(content: FileContent, function: str | None, isolated: bool = True,
                  row_order=None) -> Multiplier:
    """Compile and evaluate the multiplier in a C source whose bytes were read (and checked) once.

    The compiler sees a copy of exactly `content.data` in the owner-only cache, never the file.
    The table is evaluated in a child process (`isolated`, graphswap.multipliers.evaluation), or
    in this one with the rows in `row_order` (kernels check's re-entrancy check)."""
    path = content.path
    sha = content.sha256
    source = content.data.decode("utf-8", "replace")
    workdir, copied = private_source_copy(content)
    include_name = copied.name

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
                  or _NAMED_WIDTHS.match(f.name)] or functions
    if not chosen:
        # Maybe the source does not even compile: the compiler's message is the useful one then.
        try:
            compiler.compile_shared([copied], workdir / "syntax-check.so", portable=True)
        except compiler.CompilerError as exc:
            raise compile_error(path, exc, copied) from None
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
    sig = _classify(fn, path, widths)
    wrapper = _wrapper_source(fn, sig, include_name, weight_bits)
    key = hashlib.sha256((sha + fn.name + _WRAPPER_VERSION + wrapper).encode()).hexdigest()[:16]
    library_path = workdir / f"{fn.name}-{key}.so"
    checked = built_wrapper(workdir, wrapper, f"wrapper-{key}.c", library_path,
                            lambda exc: compile_error(path, exc, copied))
    # the evaluating process loads it only with this hash, checked on the descriptor it loads from
    plan = EvaluationPlan(source=path, name=fn.name, library=str(library_path),
                          sha256=checked.sha256, mode="wrapper")
    if isolated:
        raw = evaluate_isolated(plan, sig.signed)
    else:
        raw = evaluate_in_process(plan, row_order)
    if weight_bits == 8:
        table = table_from_raw(raw, sig.result, path, fn.name)
    else:
        table = narrow_table(raw, sig.result, weight_bits, path, fn.name)
    header, header_text = parse_header_metrics(source)
    absolute = path
    spec = absolute + (f":{function}" if function else f":{declared}" if declared else "")
    kind = "signed" if sig.signed else "unsigned"
    return Multiplier(spec=spec, name=fn.name, signed=sig.signed, table=table,
                      description=f"{kind} multiplier {fn.name} from {os.path.basename(path)} "
                                  f"({sig.generation})",
                      kind="c", path=absolute, sha256=sha, header_metrics=header,
                      header_metrics_text=header_text, notes=sig.notes, weight_bits=weight_bits)


def narrow_table(raw, result: ResultType, weight_bits: int, where: str, name: str):
    """The 65536-entry table of an 8xN multiplier from its raw results (columns y < 2^N hold the
    products of the N-bit weight codes): each product read at the circuit's width 8 + N (a signed
    product in an unsigned type as an (8 + N)-bit two's-complement pattern), range-checked."""
    bits = 8 + weight_bits
    raw = np.asarray(raw, dtype=np.uint64).reshape(256, 256)[:, :2 ** weight_bits]
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
            f"outside the {bits}-bit range of an 8x{weight_bits} product ({bad.shape[0]} such "
            f"results); check the declared widths and signedness: {WIDTH_HELP}")
    return embed_weight_table(products, result.multiplier_signed, weight_bits, f"{where}:{name}")

