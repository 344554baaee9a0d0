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
import tempfile
from pathlib import Path

from graphswap.errors import KernelSpecError
from graphswap.multipliers.evaluation import (EvaluationPlan, ResultType, evaluate_in_process,
                                              evaluate_isolated, table_from_raw)
from graphswap.multipliers.metrics import parse_header_metrics
from graphswap.multipliers.record import Multiplier
from graphswap.multipliers.widths import (NAMED_WIDTHS, WIDTH_DECLARATION, Widths, narrow_table,
                                         operand_widths)
from graphswap.native import (FileContent, cache_dir, compiler, owner_only_directory,
                              record_artefact, recorded_artefact, remove_stale,
                              write_atomically)
from graphswap.native.dependencies import check_source_reads

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


_WRAPPER_VERSION = "4"  # 2: portable (no -march=native); 3: 8xN; 4: from one checked .i


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


def compile_error(path: str, exc: Exception, copied: Path, what: str = "multiplier",
                   instead: str = "a prebuilt 'lib.so:symbol' or a .lut table") -> KernelSpecError:
    """The compiler's whole output, with the private copy's name replaced by the user's file."""
    output = re.sub(r"(\.c)\.\w+\.i\b", r"\1", str(exc))   # a unit: named by its source
    output = output.replace(str(copied), path)
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


def checked_unit(source_file: Path, workdir: Path, content: FileContent, copied: Path,
                 failed, what: str = "multiplier source") -> Path:
    """The translation unit (.i, in `workdir`; the caller compiles and removes it) of
    `source_file` - graphswap's wrapper, or the private copy itself - from one preprocessor run,
    after checking every file that run read: the private copy, the wrapper and the compiler's
    system headers only (native.dependencies: a KernelTrustError naming any other header, or one
    not found, before anything is compiled).  The unit is compiled without opening a header
    again, so what was checked is what is compiled.  `failed(exc)` is the error a compiler
    failure raises."""
    fd, name = tempfile.mkstemp(prefix=source_file.name + ".", suffix=".i", dir=workdir)
    os.close(fd)
    unit = Path(name)
    own = [source_file, copied]
    try:
        try:
            # portable: the table is filled once, and a cache shared by machines (a home
            # directory on a cluster) must not hold code another CPU cannot run
            read = compiler.preprocess(source_file, unit, include_dirs=[workdir], portable=True)
        except compiler.CompilerError as exc:
            try:   # a header that is not there (one beside the user's file): say so
                listed = compiler.list_dependencies(source_file, [workdir])
            except compiler.CompilerError:
                listed = []
            check_source_reads(listed, own, content.path, compiler.system_include_dirs(), what)
            raise failed(exc) from None
        check_source_reads(read, own, content.path, compiler.system_include_dirs(), what)
    except BaseException:
        unit.unlink(missing_ok=True)
        raise
    return unit


def compile_checked(unit: Path, output: Path, failed) -> None:
    """Compile a unit from checked_unit() into `output`, then remove the unit; `failed(exc)` is
    the error a compiler failure raises."""
    try:
        compiler.compile_unit(unit, output, portable=True)
    except compiler.CompilerError as exc:
        raise failed(exc) from None
    finally:
        unit.unlink(missing_ok=True)


def built_wrapper(workdir: Path, wrapper: str, wrapper_name: str, library_path: Path,
                  compile_error, content: FileContent, copied: Path,
                  what: str = "multiplier source"):
    """The recorded artefact of `wrapper` (which includes `copied`, the private copy of
    `content`) compiled into `library_path` (closed; its sha256 is what the evaluating process
    checks).  What the wrapper reads is checked first, every time (checked_unit); the artefact is
    reused only if it is the binary graphswap built (its hash matches graphswap's record in the
    cache; a planted file, or a `.sha256` file beside one, counts for nothing), else rebuilt;
    `compile_error(exc)` is the error a failed build raises."""
    wrapper_path = workdir / wrapper_name
    write_atomically(wrapper_path, wrapper.encode())
    unit = checked_unit(wrapper_path, workdir, content, copied, compile_error, what)
    checked = recorded_artefact(library_path)
    if checked is None:
        remove_stale(library_path)
        compile_checked(unit, library_path, compile_error)
        checked = record_artefact(library_path)
    unit.unlink(missing_ok=True)
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
    header, header_text = parse_header_metrics(source, path)   # refused before any compiling
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
                  or NAMED_WIDTHS.match(f.name)] or functions
    if not chosen:
        # Maybe the source does not even compile: the compiler's message is the useful one then.
        def failed(exc):
            return compile_error(path, exc, copied)

        compile_checked(checked_unit(copied, workdir, content, copied, failed),
                        workdir / "syntax-check.so", failed)
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
    key = hashlib.sha256((sha + fn.name + _WRAPPER_VERSION + wrapper).encode()).hexdigest()[:16]
    library_path = workdir / f"{fn.name}-{key}.so"
    checked = built_wrapper(workdir, wrapper, f"wrapper-{key}.c", library_path,
                            lambda exc: compile_error(path, exc, copied), content, copied)
    # the evaluating process loads it only with this hash, checked on the descriptor it loads from
    plan = EvaluationPlan(source=path, name=fn.name, library=str(library_path),
                          sha256=checked.sha256, mode="wrapper")
    if isolated:
        raw = evaluate_isolated(plan, sig.signed)
    else:
        raw = evaluate_in_process(plan, row_order)
    if widths is None:
        table = table_from_raw(raw, sig.result, path, fn.name)
    else:
        table = narrow_table(raw, sig.result, weight_bits, path, fn.name, activation_bits)
    absolute = path
    spec = absolute + (f":{function}" if function else f":{declared}" if declared else "")
    kind = "signed" if sig.signed else "unsigned"
    return Multiplier(spec=spec, name=fn.name, signed=sig.signed, table=table,
                      description=f"{kind} multiplier {fn.name} from {os.path.basename(path)} "
                                  f"({sig.generation})",
                      kind="c", path=absolute, sha256=sha, header_metrics=header,
                      header_metrics_text=header_text, notes=sig.notes, weight_bits=weight_bits,
                      activation_bits=activation_bits)
