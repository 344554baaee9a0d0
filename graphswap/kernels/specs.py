"""Kernel spec strings: the closed list of built-in names, and specs that name files.

    "exact", "bf16", "fp32_m{m}"       float-level built-ins
    "mul8u_drum4", ...                 built-in multipliers (`graphswap kernels` lists them)
    "path/mul.c[:FUNCTION]"            a multiplier in C                      (kind "c")
    "path/lib.so:SYMBOL[:OPTS]"        a multiplier in a shared library       (kind "so")
    "path/table.lut", "path/t.bin"     a multiplier table                     (kinds "lut", "bin")
    "path/lib.so"                      an operation-level library             (kind "library")
"""

from __future__ import annotations

import dataclasses
import re

from graphswap import multipliers
from graphswap.errors import KernelTrustError
from graphswap.kernels import trust
from graphswap.kernels.float_kernels import FP32_MANTISSA_RANGE
from graphswap.kernels.fp8 import BUILTIN_FP8


def builtin_names() -> frozenset:
    """The closed list of built-in kernel names: the only specs a file may name without a path."""
    names = {"exact", "bf16", *(f"fp32_m{m}" for m in FP32_MANTISSA_RANGE), *BUILTIN_FP8}
    return frozenset(names | set(multipliers.builtin_multipliers()))


@dataclasses.dataclass(frozen=True)
class FileSpec:
    """A spec naming a file: what kind of file, the file part as written, and what follows it."""

    kind: str      # "c" (multiplier source), "so" (multiplier in a shared library), "lut", "bin",
                   # "library" (operation-level shared library)
    path: str
    extra: tuple   # ("FUNCTION",) or (None,) for "c"; (symbol, options) for "so"; () otherwise

    @property
    def executable(self) -> bool:
        return self.kind not in ("lut", "bin")

    @property
    def what(self) -> str:
        return {"c": "multiplier source", "so": "multiplier library", "lut": "multiplier table",
                "bin": "TFApprox multiplier table", "library": "kernel library"}[self.kind]

    def spec_at(self, path: str) -> str:
        """The same spec with the file part replaced by `path`."""
        if self.kind == "c" and self.extra[0]:
            return f"{path}:{self.extra[0]}"
        if self.kind == "so":
            symbol, options = self.extra
            return f"{path}:{symbol}" + (f":{options}" if options else "")
        return path


_SO_SPEC = re.compile(r"^(?P<path>.+?\.(?:so|dylib)(?:\.\d+)*):(?P<symbol>[A-Za-z_]\w*)"
                      r"(?::(?P<opts>[\w,]*))?$")
_C_SPEC = re.compile(r"^(?P<path>.+?\.c)(?::(?P<function>[A-Za-z_]\w*))?$")
_LIBRARY = re.compile(r"\.(?:so|dylib)(?:\.\d+)*$")


def parse_file_spec(spec: str) -> FileSpec | None:
    """The FileSpec a spec string names, or None for a name that is not a file spec."""
    so = _SO_SPEC.match(spec)
    if so:
        return FileSpec("so", so.group("path"), (so.group("symbol"), so.group("opts")))
    c = _C_SPEC.match(spec)
    if c:
        return FileSpec("c", c.group("path"), (c.group("function"),))
    lower = spec.lower()
    if lower.endswith(".lut"):
        return FileSpec("lut", spec, ())
    if lower.endswith(".bin"):
        return FileSpec("bin", spec, ())
    if _LIBRARY.search(spec):
        return FileSpec("library", spec, ())
    return None


def record_file_spec(spec: str, path: str, where: str) -> FileSpec:
    """The FileSpec of a record, whose spec must refer to exactly the recorded path."""
    trust.check_record_path(path, where)
    parsed = parse_file_spec(spec) if isinstance(spec, str) else None
    if parsed is None or parsed.path != path:
        raise KernelTrustError(
            f"{where}: the kernel record's spec {spec!r} does not refer to its recorded path "
            f"{path!r}; a record must name one file. Re-convert the model")
    return parsed
