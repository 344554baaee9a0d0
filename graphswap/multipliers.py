"""Multiplier-level kernel specs: scalar 8-bit multipliers turned into 256x256 tables.

Most approximate-computing users hold one scalar multiplier, not a whole GEMM.  graphswap evaluates
it once into a table (graphswap_kernels.h layout: 65536 int32 entries, index (a_code << 8) | b_code,
a = first operand = activation / left matrix, b = second operand = weight / right matrix; a code is
the operand's 8-bit pattern: 0..255 unsigned, the two's-complement byte of -128..127 signed) and the
quantized LUT kernels (graphswap.quantized) run every product through it.

Spec forms accepted by resolve_multiplier():

  built-in name        mul8u_exact, mul8s_exact, mul8{u,s}_trunc{1..8}, mul8{u,s}_drum{3..6},
                       mul8{u,s}_mitchell (C in native_kernels/src/multipliers.c, cited there).
  PATH.c[:FUNCTION]    a C source with one scalar multiplier (EvoApproxLib style).  The function and
                       its signature are found by parsing the source; FUNCTION picks one when the file
                       has several.  It is compiled with the system C compiler into
                       <cache>/multipliers/, keyed by the source's sha256, together with a generated
                       wrapper that fills the table, so the compiler (not ctypes) does the type
                       conversions.  Signature generations understood:
                         legacy   uint64_t mul8u_X(const uint64_t B, const uint64_t A)  (order B, A)
                         newer    uint16_t f(uint8_t A, uint8_t B) / int16_t mul8s_X(int8_t A, int8_t B)
                         upstream bug: a signed multiplier (name mul8s_*) declared with unsigned types;
                                  handled as signed (operands passed as bit patterns, the 16-bit result
                                  read as two's complement) and reported in `notes`.
                       Operand order: when the parameters are named A and B (any case) the first
                       operand goes to A, whatever their position (this is what makes the legacy
                       (B, A) order right); otherwise positionally.  Signedness: from the parameter
                       types, cross-checked with the mul8s_/mul8u_ name prefix; a contradiction is an
                       error, never a guess.
  LIB.so:SYMBOL[:OPTS] a scalar multiplier exported by a shared library.  Its source is not visible,
                       so the C signature comes from OPTS (comma-separated), by default from the name:
                         u8   uint16_t f(uint8_t a, uint8_t b)         (default for mul8u_*)
                         s8   int16_t  f(int8_t a, int8_t b)           (default for mul8s_*)
                         s8u  uint16_t f(uint8_t a, uint8_t b) computing a signed product on
                              two's-complement bit patterns (EvoApproxLib's mis-declared mul8s files)
                         u64  uint64_t f(uint64_t B, uint64_t A)       (EvoApproxLib legacy)
                         ab / ba  operand order: f(first, second) / f(second, first); default ab,
                              except u64 whose default is ba (its first parameter is B).
                       Return values are read through ctypes with exactly the declared width
                       (c_uint16 / c_int16 / c_uint64): reading a uint16_t return through a wider
                       restype would pick up undefined upper register bits.
  PATH.lut             graphswap's table file (write_lut() writes it):
                         bytes 0..7   magic b"GSWAPLUT"
                         bytes 8..11  uint32 LE format version, 1
                         bytes 12..15 uint32 LE flags: bit 0 signed; bit 1 (signed only) rows/columns
                                      ordered by value -128..127 instead of by code 0..255
                         then 65536 int32 LE, row-major, row = first operand.  Size must be 262160.
  PATH.bin             TFApprox table: 65536 uint16 LE, row-major (a << 8) | b, unsigned.

Anything else (e.g. "exact", "bf16", an operation-level "lib.so") is not a multiplier spec and
resolve_multiplier() returns None.  Bad multiplier specs raise KernelSpecError saying what was wrong,
what is allowed and what to do.

Also here: lut(spec) / metrics(spec) (re-exported by graphswap.kernels), check(spec) and
format_check() for `graphswap kernels check`, plot_error_heatmap() for its --plot.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import os
import re
import struct
import threading
from pathlib import Path

import numpy as np

from graphswap import compiler, native
from graphswap.errors import KernelSpecError
from graphswap.kernel_trust import FileContent

# --------------------------------------------------------------------------------------------
# the Multiplier record
# --------------------------------------------------------------------------------------------

TABLE_SIZE = 65536


@dataclasses.dataclass(frozen=True, eq=False)
class Multiplier:
    """A scalar 8-bit multiplier evaluated into its table (see the module docstring for the layout)."""

    spec: str                   # canonical spec, accepted by resolve_multiplier()
    name: str                   # function / built-in / file stem
    signed: bool
    table: np.ndarray           # int32[65536], index (a_code << 8) | b_code
    description: str
    kind: str                   # "builtin", "c", "so", "lut", "bin"
    path: str | None = None     # absolute path of the file, if any
    sha256: str | None = None   # of that file
    header_metrics: dict = dataclasses.field(default_factory=dict)       # floats
    header_metrics_text: dict = dataclasses.field(default_factory=dict)  # as printed
    notes: tuple = ()           # how signature / order / signedness were determined

    def to_config(self) -> dict:
        config = {"spec": self.spec}
        if self.path is not None:
            config.update(path=self.path, sha256=self.sha256)
        return config

    def __repr__(self) -> str:
        return f"<Multiplier {self.spec} ({'signed' if self.signed else 'unsigned'})>"


# --------------------------------------------------------------------------------------------
# built-ins
# --------------------------------------------------------------------------------------------

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


def _builtin(spec: str) -> Multiplier:
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
    table = native.shipped_library().builtin_multiplier_table(spec)
    return Multiplier(spec=spec, name=spec, signed=signed, table=table,
                      description=_builtin_description(signed, design, k), kind="builtin")


# --------------------------------------------------------------------------------------------
# EvoApproxLib header metrics
# --------------------------------------------------------------------------------------------

HEADER_KEYS = ("MAE%", "MAE", "WCE%", "WCE", "WCRE%", "EP%", "MRE%", "MSE",
               "PDK45_PWR", "PDK45_AREA", "PDK45_DELAY")
_HEADER_LINE = re.compile(
    r"^\s*//\s*(MAE%|MAE|WCE%|WCE|WCRE%|EP%|MRE%|MSE|PDK45_PWR|PDK45_AREA|PDK45_DELAY)\s*=\s*"
    r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)", re.MULTILINE)


def parse_header_metrics(source: str) -> tuple[dict, dict]:
    """EvoApproxLib header metrics ("// MAE% = 0.0034 %") -> ({key: float}, {key: printed text})."""
    values, texts = {}, {}
    for key, text in _HEADER_LINE.findall(source):
        if key not in values:
            values[key] = float(text)
            texts[key] = text
    return values, texts


# --------------------------------------------------------------------------------------------
# C sources
# --------------------------------------------------------------------------------------------

# C type spelling -> (bits, is_signed)
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
    result_16bit_twos: bool  # signed result read from the low 16 bits as two's complement
    generation: str
    notes: tuple


def _classify(fn: _CFunction, path: str) -> _Signature:
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
    result_twos = signed and (ret_bits <= 16 or not ret_signed)
    if bits == 64 and not type_signed:
        generation = "EvoApproxLib legacy (uint64_t operands)"
    elif bits == 8:
        generation = "8-bit operands"
    else:
        generation = f"{bits}-bit operands"
    return _Signature(signed, arg_type, swap, result_twos, generation, tuple(notes))


_WRAPPER_VERSION = "1"


def _wrapper_source(fn: _CFunction, sig: _Signature, include_name: str) -> str:
    operand = {"int8_t": "(int8_t)(uint8_t)", "uint8_t": "(uint8_t)"}.get(sig.arg_type, None)
    if operand is None:
        # wider operand types: unsigned multipliers get 0..255, signed ones -128..127
        operand = f"({sig.arg_type})(int8_t)(uint8_t)" if sig.signed else f"({sig.arg_type})"
    first, second = f"{operand}x", f"{operand}y"
    args = f"{second}, {first}" if sig.swap else f"{first}, {second}"
    if sig.result_16bit_twos:
        value = f"(int64_t)(int16_t)(uint16_t)({fn.name}({args}))"
    else:
        value = f"(int64_t)({fn.name}({args}))"
    return (
        "/* generated by graphswap: evaluates the multiplier into a 256x256 table */\n"
        "#include <stdint.h>\n"
        f'#include "{include_name}"\n'
        "__attribute__((visibility(\"default\"))) void graphswap_fill_multiplier_table(int64_t *t)\n"
        "{\n"
        "    for (unsigned x = 0; x < 256; ++x)\n"
        "        for (unsigned y = 0; y < 256; ++y)\n"
        f"            t[(x << 8) | y] = {value};\n"
        "}\n")


def _check_table_range(values: np.ndarray, where: str) -> np.ndarray:
    if values.min() < -(2 ** 31) or values.max() > 2 ** 31 - 1:
        raise KernelSpecError(f"{where}: products outside the int32 range (min {values.min()}, "
                              f"max {values.max()}); an 8-bit multiplier's products must fit int32")
    return values.astype(np.int32)


def _compile_error(path: str, exc: Exception) -> KernelSpecError:
    return KernelSpecError(f"cannot compile multiplier {path}: {exc}\nFix the C source (it must "
                           f"compile with 'cc -c'), or pass a prebuilt 'lib.so:symbol' or a .lut table")


def _hash_record(library_path: Path) -> Path:
    return library_path.with_name(library_path.name + ".sha256")


def _record_binary_hash(library_path: Path) -> None:
    """Remember the hash of a binary we just built, to detect later tampering with the cache."""
    record = _hash_record(library_path)
    tmp = record.with_name(record.name + f".{os.getpid()}.tmp")
    tmp.write_text(native.file_sha256(library_path))
    os.replace(tmp, record)


def _cached_binary_intact(library_path: Path) -> bool:
    """A cached binary is reused only if it is the one we built (its recorded hash matches);
    anything else - missing record, modified or replaced file - is rebuilt, never trusted."""
    record = _hash_record(library_path)
    if not library_path.is_file() or not record.is_file():
        return False
    return record.read_text().strip() == native.file_sha256(library_path)


def from_c_source(content: FileContent, function: str | None) -> Multiplier:
    """Compile and evaluate the multiplier in a C source whose bytes were read (and checked) once.

    The compiler sees a copy of exactly `content.data` in the owner-only cache, never the file."""
    path = content.path
    raw = content.data
    sha = content.sha256
    source = raw.decode("utf-8", "replace")
    workdir = native.cache_dir() / "multipliers" / sha[:24]
    workdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(workdir.parent, 0o700)  # per-user cache: nobody else may plant binaries in it
    include_name = "source_" + re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.basename(path))
    copied = workdir / include_name
    if not copied.is_file() or copied.read_bytes() != raw:
        tmp = workdir / (include_name + f".{os.getpid()}.tmp")
        tmp.write_bytes(raw)
        os.replace(tmp, copied)

    functions = [f for f in _find_functions(source) if len(f.params) == 2]
    if function is not None:
        chosen = [f for f in functions if f.name == function]
        if not chosen:
            all_names = [f.name for f in _find_functions(source)]
            raise KernelSpecError(
                f"{path}: no two-operand function named {function!r}; functions found: "
                f"{', '.join(all_names) or 'none'}")
    else:
        chosen = [f for f in functions if f.name.startswith(("mul8u", "mul8s"))] or functions
    if not chosen:
        # Maybe the source does not even compile: the compiler's message is the useful one then.
        try:
            compiler.compile_shared([copied], workdir / "syntax-check.so")
        except compiler.CompilerError as exc:
            raise _compile_error(path, exc) from None
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
    sig = _classify(fn, path)
    wrapper = _wrapper_source(fn, sig, include_name)
    key = hashlib.sha256((sha + fn.name + _WRAPPER_VERSION + wrapper).encode()).hexdigest()[:16]
    library_path = workdir / f"{fn.name}-{key}.so"
    if not _cached_binary_intact(library_path):
        wrapper_path = workdir / f"wrapper-{key}.c"
        wrapper_path.write_text(wrapper)
        try:
            compiler.compile_shared([wrapper_path], library_path, include_dirs=[workdir])
        except compiler.CompilerError as exc:
            raise _compile_error(path, exc) from None
        _record_binary_hash(library_path)
    library = ctypes.CDLL(str(library_path))
    fill = library.graphswap_fill_multiplier_table
    fill.restype = None
    fill.argtypes = [ctypes.POINTER(ctypes.c_int64)]
    values = np.empty(TABLE_SIZE, dtype=np.int64)
    fill(values.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)))
    table = _check_table_range(values, path)
    header, header_text = parse_header_metrics(source)
    absolute = path
    spec = absolute + (f":{function}" if function else "")
    kind = "signed" if sig.signed else "unsigned"
    return Multiplier(spec=spec, name=fn.name, signed=sig.signed, table=table,
                      description=f"{kind} multiplier {fn.name} from {os.path.basename(path)} "
                                  f"({sig.generation})",
                      kind="c", path=absolute, sha256=sha, header_metrics=header,
                      header_metrics_text=header_text, notes=sig.notes)


# --------------------------------------------------------------------------------------------
# shared libraries
# --------------------------------------------------------------------------------------------

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
        library = ctypes.CDLL(str(native.private_copy(content.data, content.sha256,
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
    table = _check_table_range(values, f"{path}:{symbol}")
    spec = f"{path}:{symbol}" + (f":{options}" if options else "")
    kind = "signed" if signed else "unsigned"
    return Multiplier(spec=spec, name=symbol, signed=signed, table=table,
                      description=f"{kind} multiplier {symbol} from {os.path.basename(path)}",
                      kind="so", path=path, sha256=content.sha256, notes=tuple(notes))


# --------------------------------------------------------------------------------------------
# table files
# --------------------------------------------------------------------------------------------

LUT_MAGIC = b"GSWAPLUT"
LUT_VERSION = 1
LUT_HEADER = struct.Struct("<8sII")
LUT_FLAG_SIGNED = 1
LUT_FLAG_VALUE_ORDER = 2
LUT_FILE_SIZE = LUT_HEADER.size + 4 * TABLE_SIZE
BIN_FILE_SIZE = 2 * TABLE_SIZE


def _value_order_permutation() -> np.ndarray:
    """codes 0..255 -> position in the value order -128..127."""
    return (np.arange(256) + 128) % 256


def write_lut(path, table, signed: bool, value_order: bool = False,
              table_order: str | None = None) -> None:
    """Write a graphswap .lut file.

    `table` is either 65536 entries in code order (the Multiplier.table layout) or a 256x256 array.
    A signed 256x256 array is ambiguous - lut() returns rows/columns ordered by value -128..127,
    Multiplier.table.reshape(256, 256) is in code order - so it needs table_order="value" or
    "code"; for unsigned tables the two orders are the same.  With value_order=True (signed only)
    the file stores rows and columns ordered -128..127; the file's flags say which, so either file
    reads back as the same multiplier.
    """
    table = np.asarray(table)
    if table.shape == (256, 256) and signed:
        if table_order not in ("code", "value"):
            raise ValueError(
                "a signed 256x256 table is ambiguous: pass table_order='value' for a table from "
                "graphswap.kernels.lut() (rows/columns -128..127) or table_order='code' for "
                "Multiplier.table.reshape(256, 256) (rows/columns by two's-complement code)")
        if table_order == "value":
            perm = _value_order_permutation()  # code -> position in value order
            table = table[np.ix_(perm, perm)]
    elif table.size != TABLE_SIZE:
        raise ValueError(f"a multiplier table has 65536 entries (or 256x256), got shape "
                         f"{table.shape}")
    table = table.reshape(256, 256).astype(np.int64)
    if value_order:
        if not signed:
            raise ValueError("value_order applies to signed tables only")
        perm = np.argsort(_value_order_permutation())  # position -> code
        table = table[np.ix_(perm, perm)]
    flags = (LUT_FLAG_SIGNED if signed else 0) | (LUT_FLAG_VALUE_ORDER if value_order else 0)
    data = LUT_HEADER.pack(LUT_MAGIC, LUT_VERSION, flags) + _check_table_range(
        table.reshape(-1), str(path)).astype("<i4").tobytes()
    Path(path).write_bytes(data)


def from_lut_file(content: FileContent) -> Multiplier:
    """A multiplier from the bytes of a graphswap .lut file (see the module docstring)."""
    path, data = content.path, content.data
    layout = (f"a .lut file is the 16-byte header (b'GSWAPLUT', uint32 version 1, uint32 flags) and "
              f"65536 little-endian int32 entries: {LUT_FILE_SIZE} bytes; write one with "
              f"graphswap.multipliers.write_lut()")
    if len(data) != LUT_FILE_SIZE:
        raise KernelSpecError(f"{path}: wrong size for a multiplier table: {len(data)} bytes; {layout}"
                              + ("; this looks like a TFApprox table: rename it to .bin"
                                 if len(data) == BIN_FILE_SIZE else ""))
    magic, version, flags = LUT_HEADER.unpack_from(data)
    if magic != LUT_MAGIC or version != LUT_VERSION or flags & ~3:
        raise KernelSpecError(f"{path}: not a graphswap .lut file (magic {magic!r}, version {version}, "
                              f"flags {flags:#x}); {layout}")
    signed = bool(flags & LUT_FLAG_SIGNED)
    table = np.frombuffer(data, dtype="<i4", offset=LUT_HEADER.size).astype(np.int32).reshape(256, 256)
    if flags & LUT_FLAG_VALUE_ORDER:
        if not signed:
            raise KernelSpecError(f"{path}: flag 'value order' is set on an unsigned table; {layout}")
        perm = _value_order_permutation()  # code -> position
        table = table[np.ix_(perm, perm)]
    kind = "signed" if signed else "unsigned"
    return Multiplier(spec=path, name=Path(path).stem, signed=signed,
                      table=np.ascontiguousarray(table.reshape(-1)),
                      description=f"{kind} multiplier table {os.path.basename(path)}", kind="lut",
                      path=path, sha256=content.sha256)


def from_bin_file(content: FileContent) -> Multiplier:
    """A multiplier from the bytes of a TFApprox .bin table."""
    path, data = content.path, content.data
    if len(data) != BIN_FILE_SIZE:
        raise KernelSpecError(
            f"{path}: wrong size for a TFApprox multiplier table: {len(data)} bytes; a .bin table is "
            f"65536 little-endian uint16 products, row-major (a << 8) | b: {BIN_FILE_SIZE} bytes")
    table = np.frombuffer(data, dtype="<u2").astype(np.int32)
    return Multiplier(spec=path, name=Path(path).stem, signed=False, table=table,
                      description=f"unsigned multiplier table {os.path.basename(path)} (TFApprox .bin)",
                      kind="bin", path=path, sha256=content.sha256)


# --------------------------------------------------------------------------------------------
# resolving specs
# --------------------------------------------------------------------------------------------

_cache: dict[tuple, Multiplier] = {}
_cache_lock = threading.Lock()


def builtin(name: str) -> Multiplier:
    """The built-in multiplier `name` (cached)."""
    return _cached(("builtin", name), lambda: _builtin(name))


def from_file(kind: str, content: FileContent, extra: tuple = ()) -> Multiplier:
    """The multiplier in checked file `content` of `kind` ("c", "so", "lut", "bin"); cached by
    content hash, so a file is compiled or evaluated once per process."""
    builders = {"c": lambda: from_c_source(content, *extra),
                "so": lambda: from_shared_library(content, *extra),
                "lut": lambda: from_lut_file(content),
                "bin": lambda: from_bin_file(content)}
    return _cached((kind, content.path, content.sha256, tuple(extra)), builders[kind])


def _cached(key, build) -> Multiplier:
    with _cache_lock:
        multiplier = _cache.get(key)
    if multiplier is None:
        multiplier = build()
        with _cache_lock:
            _cache[key] = multiplier
    return multiplier


def clear_cache() -> None:
    """Forget the evaluated tables (the next resolution evaluates anew)."""
    with _cache_lock:
        _cache.clear()


def _require_multiplier(spec) -> Multiplier:
    if isinstance(spec, Multiplier):
        return spec
    from graphswap.kernels import require_multiplier  # a user-named spec: the registry resolves it

    return require_multiplier(spec)


# --------------------------------------------------------------------------------------------
# tables, metrics, checks
# --------------------------------------------------------------------------------------------

def operand_values(signed: bool) -> np.ndarray:
    """Operand value of each code 0..255."""
    codes = np.arange(256)
    return np.where(codes > 127, codes - 256, codes) if signed else codes


def lut(spec) -> np.ndarray:
    """The multiplier as a 256x256 int array: out[i, j] = product of the i-th and j-th operand values,
    rows = first operand (activation), columns = second operand (weight).  Unsigned: operands 0..255.
    Signed: rows and columns ordered by value -128..127 (so out[128, 128] = f(0, 0))."""
    multiplier = _require_multiplier(spec)
    table = multiplier.table.reshape(256, 256)
    if multiplier.signed:
        order = (np.arange(256) + 128) % 256  # position i holds the code of value i - 128
        table = table[np.ix_(order, order)]
    return np.array(table, dtype=np.int64)


def _errors(multiplier: Multiplier):
    values = operand_values(multiplier.signed)
    exact = values[:, None] * values[None, :]
    approx = multiplier.table.reshape(256, 256).astype(np.int64)
    return approx, exact, approx - exact


def metrics(spec) -> dict:
    """Error metrics of the multiplier over all 65536 operand pairs (EvoApproxLib conventions):
    MAE = mean|approx - exact|, MAE% = MAE / 2^16 * 100, WCE = max|approx - exact|,
    WCE% = WCE / 2^16 * 100, EP% = share of pairs with any error, MRE% = mean over pairs with a
    non-zero exact product of |error| / |exact| * 100, WCRE% = the maximum of that ratio * 100,
    MSE = mean error^2, bias = mean(approx - exact)."""
    multiplier = _require_multiplier(spec)
    _, exact, error = _errors(multiplier)
    abs_error = np.abs(error)
    nonzero = exact != 0
    relative = abs_error[nonzero] / np.abs(exact[nonzero])
    return {
        "MAE": float(abs_error.mean()),
        "MAE%": float(abs_error.mean() / 2 ** 16 * 100),
        "WCE": int(abs_error.max()),
        "WCE%": float(abs_error.max() / 2 ** 16 * 100),
        "MRE%": float(relative.mean() * 100),
        "WCRE%": float(relative.max() * 100),
        "EP%": float(np.count_nonzero(error) / error.size * 100),
        "MSE": float((error.astype(np.float64) ** 2).mean()),
        "bias": float(error.mean()),
    }


def _decimals(text: str) -> int:
    mantissa = text.lower().split("e")[0]
    return len(mantissa.split(".")[1]) if "." in mantissa else 0


def agrees_with_header(computed: float, printed: str) -> bool:
    """Is the header's printed value `computed`, rounded or truncated to the printed precision?

    EvoApproxLib's headers do both: mul8u_18UH prints MAE% 1.17966 as 1.18 (rounded), mul8s_1KVB
    prints 0.006485 as 0.0064 (truncated); both are agreement, anything further off is not.
    """
    exponent = int(printed.lower().split("e")[1]) if "e" in printed.lower() else 0
    step = 10.0 ** (exponent - _decimals(printed))
    value = float(printed)
    tolerance = 1e-9 * step + 1e-12
    rounded = abs(computed - value) <= step / 2 + tolerance
    truncated = 0 <= abs(computed) - abs(value) < step + tolerance and \
        (computed == 0 or value == 0 or (computed > 0) == (value > 0))
    return rounded or truncated


def check(spec) -> dict:
    """Sanity checks and metrics of a multiplier, for `graphswap kernels check`."""
    multiplier = _require_multiplier(spec)
    approx, exact, error = _errors(multiplier)
    values = operand_values(multiplier.signed)
    zero = int(np.flatnonzero(values == 0)[0])
    checks = []

    def add(name, passed, detail):
        checks.append({"check": name, "passed": passed, "detail": detail})

    bad_b0 = int(np.count_nonzero(approx[:, zero]))
    add("f(a, 0) = 0", bad_b0 == 0, "holds for every a" if bad_b0 == 0 else
        f"non-zero for {bad_b0} of 256 values of a (e.g. f({values[np.flatnonzero(approx[:, zero])[0]]}, 0)"
        f" = {approx[np.flatnonzero(approx[:, zero])[0], zero]})")
    bad_a0 = int(np.count_nonzero(approx[zero, :]))
    add("f(0, b) = 0", bad_a0 == 0, "holds for every b" if bad_a0 == 0 else
        f"non-zero for {bad_a0} of 256 values of b (e.g. f(0, {values[np.flatnonzero(approx[zero, :])[0]]})"
        f" = {approx[zero, np.flatnonzero(approx[zero, :])[0]]})")
    exact_pairs = int(np.count_nonzero(error == 0))
    add("comparison with the exact product", None,
        f"{exact_pairs} of 65536 operand pairs exact; largest error {int(np.abs(error).max())} "
        f"(at f({values[np.unravel_index(np.abs(error).argmax(), error.shape)[0]]}, "
        f"{values[np.unravel_index(np.abs(error).argmax(), error.shape)[1]]}))")
    asymmetric = int(np.count_nonzero(approx != approx.T)) // 2
    add("operand-order symmetry", None,
        "f(a, b) = f(b, a) for every pair: operand order does not matter" if asymmetric == 0 else
        f"f(a, b) != f(b, a) for {asymmetric} unordered pairs: operand order matters (first operand = "
        f"activation, second = weight)")
    # The other reading of the same bits: codes and 16-bit products as unsigned <-> two's complement.
    other_values = operand_values(not multiplier.signed)
    other_exact = other_values[:, None] * other_values[None, :]
    if multiplier.signed:
        other_table = approx & 0xFFFF
    else:
        other_table = np.where(approx > 32767, approx - 65536, approx)
    mae_declared = float(np.abs(error).mean())
    mae_other = float(np.abs(other_table - other_exact).mean())
    plausible = mae_declared <= mae_other
    kind = "signed" if multiplier.signed else "unsigned"
    other_kind = "unsigned" if multiplier.signed else "signed"
    add("signedness plausibility", plausible,
        f"treated as {kind}: MAE {mae_declared:.4g} vs the {kind} product; read as {other_kind} it "
        f"would be {mae_other:.4g}" + ("" if plausible else
                                       f" -- the table looks {other_kind}: check the declaration"))
    computed = metrics(multiplier)
    comparison = []
    for key in ("MAE%", "WCE%", "EP%", "MRE%", "MAE", "WCE", "MSE"):
        if key in multiplier.header_metrics_text:
            text = multiplier.header_metrics_text[key]
            ok = agrees_with_header(computed[key], text)
            comparison.append({"metric": key, "computed": computed[key], "header": text, "agrees": ok})
    for entry in comparison:
        if entry["metric"] in ("MAE%", "WCE%", "EP%"):
            add(f"header {entry['metric']} agrees", entry["agrees"],
                f"computed {entry['computed']:.6g}, header {entry['header']}")
    hardware = {k: v for k, v in multiplier.header_metrics.items() if k.startswith("PDK45")}
    return {
        "spec": multiplier.spec, "name": multiplier.name, "signed": multiplier.signed,
        "description": multiplier.description, "notes": list(multiplier.notes), "checks": checks,
        "metrics": computed, "header_comparison": comparison, "hardware": hardware,
        "passed": all(c["passed"] is not False for c in checks),
    }


def format_check_lines(checks: list[dict]) -> list[str]:
    """One line per check: [ok  ] / [FAIL] / [info], name, detail."""
    width = max((len(c["check"]) for c in checks), default=0)
    return [f"  [{ {True: 'ok  ', False: 'FAIL', None: 'info'}[c['passed']] }] "
            f"{c['check']:<{width}}  {c['detail']}" for c in checks]


def format_check(result: dict) -> str:
    """A readable report of check()'s result."""
    lines = [f"multiplier  {result['name']}  ({'signed' if result['signed'] else 'unsigned'})",
             f"spec        {result['spec']}", f"            {result['description']}"]
    for note in result["notes"]:
        lines.append(f"note        {note}")
    lines.append("")
    lines.extend(format_check_lines(result["checks"]))
    lines.append("")
    header = {e["metric"]: e for e in result["header_comparison"]}
    lines.append(f"  {'metric':<8} {'computed':>14} {'header':>12}")
    for key, value in result["metrics"].items():
        shown = f"{value:.6g}" if isinstance(value, float) else str(value)
        extra = ""
        if key in header:
            extra = f"{header[key]['header']:>12}  {'agrees' if header[key]['agrees'] else 'DIFFERS'}"
        lines.append(f"  {key:<8} {shown:>14} {extra}")
    for key, value in result["hardware"].items():
        lines.append(f"  {key:<12} {value:g} (from the file's header)")
    lines.append("")
    lines.append("all checks passed" if result["passed"] else "some checks FAILED")
    return "\n".join(lines)


def plot_error_heatmap(spec, path) -> str:
    """Write a PNG heatmap of approx - exact over all operand pairs; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    multiplier = _require_multiplier(spec)
    values = operand_values(multiplier.signed)
    order = np.argsort(values)
    error = (lut(multiplier) - (values[order][:, None] * values[order][None, :])).astype(np.float64)
    limit = max(float(np.abs(error).max()), 1.0)
    lo, hi = int(values.min()), int(values.max())
    fig, ax = plt.subplots(figsize=(6.4, 5.4), dpi=100)
    image = ax.imshow(error, cmap="RdBu_r", vmin=-limit, vmax=limit, origin="lower",
                      extent=(lo - 0.5, hi + 0.5, lo - 0.5, hi + 0.5), interpolation="nearest")
    ax.set_xlabel("second operand b (weight)")
    ax.set_ylabel("first operand a (activation)")
    ax.set_title(f"{multiplier.name}: approx - exact")
    fig.colorbar(image, ax=ax, label="error")
    fig.tight_layout()
    path = os.fspath(path)
    tmp = path + ".tmp.png"
    fig.savefig(tmp, format="png")
    plt.close(fig)
    os.replace(tmp, path)
    return path


__all__ = ["Multiplier", "builtin_multipliers", "builtin", "from_file", "lut", "metrics", "check",
           "format_check", "plot_error_heatmap", "write_lut", "parse_header_metrics"]
