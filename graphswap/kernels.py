"""Kernel specifications: what a `kernel=` argument may name, and the objects that compute with it.

A kernel spec is one of
  - "exact"                      graphswap's shipped float32 GEMM/Conv2D (the reference);
  - "bf16", "fp32_m{m}"          float-level kernels: operands rounded, then exact float32 products;
  - a built-in multiplier name   e.g. "mul8u_drum4", "mul8s_trunc3" (see `graphswap kernels`);
  - "path/to/mul.c"              a scalar 8-bit multiplier in C (EvoApproxLib style), compiled on the fly;
  - "path/to/lib.so:symbol"      a scalar 8-bit multiplier exported by a user's shared library;
  - "path/to/table.lut" / ".bin" a 256x256 multiplier table file;
  - "path/to/lib.so"             an operation-level library implementing graphswap_kernels.h.
Multiplier-level specs run through the quantized table-driven kernels (graphswap.quantized).

Every kernel offers numpy-level `matmul(a, b)` and `conv2d(x, w, geometry)` on float32 arrays, and
`to_config()`, the JSON-serialisable record stored in a saved model's layer config.
"""

from __future__ import annotations

import abc
import dataclasses
import os
import re
import threading

import numpy as np

from graphswap import kernel_trust, multipliers, native
from graphswap.errors import KernelSpecError, KernelTrustError
from graphswap.geometry import ConvGeometry


class Kernel(abc.ABC):
    """Forward arithmetic of swapped layers, on float32 numpy arrays."""

    #: canonical spec string, accepted by resolve_kernel() to rebuild the same kernel
    spec: str = ""
    #: one-line description for reports and `graphswap kernels`
    description: str = ""

    @abc.abstractmethod
    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """(m,k) x (k,n) -> (m,n) float32."""

    @abc.abstractmethod
    def conv2d(self, x: np.ndarray, w: np.ndarray, geometry: ConvGeometry) -> np.ndarray:
        """NHWC input x HWIO filter -> NHWC output, float32, geometry fully explicit."""

    def to_config(self) -> dict:
        return {"spec": self.spec}

    @property
    def hardware_metrics(self) -> dict:
        """Hardware figures (e.g. PDK45_PWR) when the kernel's source carries them."""
        return {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.spec}>"


def im2col(x: np.ndarray, geometry: ConvGeometry, pad_value=0) -> np.ndarray:
    """Patches of an NHWC input: (batch*out_h*out_w, filter_h*filter_w*in_channels), HWC order.

    The column order matches an HWIO filter reshaped to (filter_h*filter_w*in_c/groups, out_c) per
    group when the channel axis is split by group afterwards (see conv_via_matmul).
    """
    g = geometry
    padded = np.pad(x, ((0, 0), (g.pad_top, g.pad_bottom), (g.pad_left, g.pad_right), (0, 0)),
                    constant_values=pad_value)
    rows = []
    for fh in range(g.filter_height):
        top = fh * g.dilation_height
        for fw in range(g.filter_width):
            left = fw * g.dilation_width
            rows.append(padded[:, top: top + (g.out_height - 1) * g.stride_height + 1: g.stride_height,
                               left: left + (g.out_width - 1) * g.stride_width + 1: g.stride_width, :])
    # (batch, out_h, out_w, fh*fw, in_c)
    patches = np.stack(rows, axis=3)
    return patches.reshape(g.batch * g.out_height * g.out_width,
                           g.filter_height * g.filter_width, g.in_channels)


def conv_via_matmul(x: np.ndarray, w: np.ndarray, geometry: ConvGeometry, matmul) -> np.ndarray:
    """Lower a (grouped) convolution to patches x matmul, one matmul call per group."""
    g = geometry
    if 0 in g.output_shape:
        return np.zeros(g.output_shape, dtype=np.float32)
    patches = im2col(x, g)
    group_in = g.in_channels // g.groups
    group_out = g.out_channels // g.groups
    outputs = []
    for group in range(g.groups):
        cols = patches[:, :, group * group_in:(group + 1) * group_in].reshape(patches.shape[0], -1)
        filt = w[:, :, :, group * group_out:(group + 1) * group_out].reshape(-1, group_out)
        outputs.append(matmul(np.ascontiguousarray(cols), np.ascontiguousarray(filt)))
    out = outputs[0] if len(outputs) == 1 else np.concatenate(outputs, axis=1)
    return out.reshape(g.output_shape).astype(np.float32, copy=False)


class LibraryKernel(Kernel):
    """Float32 kernels from an operation-level library (graphswap's own "exact", or a user's .so).

    A user's library is loaded from a private copy of the bytes that were checked (see
    kernel_trust); `path` and `sha256` name the file the user or the model named."""

    def __init__(self, library: native.KernelLibrary, spec: str, description: str,
                 path: str | None = None, sha256: str | None = None):
        self.library = library
        self.spec = spec
        self.description = description
        self.path = path
        self.sha256 = sha256

    def matmul(self, a, b):
        return self.library.matmul_f32(a, b)

    def conv2d(self, x, w, geometry):
        if self.library.has_conv2d:
            return self.library.conv2d_f32(x, w, geometry)
        return conv_via_matmul(x, w, geometry, self.library.matmul_f32)

    def to_config(self):
        if self.path is None:
            return {"spec": self.spec}
        return {"spec": self.spec, "path": self.path, "sha256": self.sha256}


def round_to_bfloat16(values: np.ndarray) -> np.ndarray:
    """float32 -> nearest bfloat16 (round-to-nearest-even), returned as float32. NaN stays NaN."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    rounded = (bits + rounding) & np.uint32(0xFFFF0000)
    rounded = np.where(np.isnan(values), bits | np.uint32(0x00400000), rounded)
    return rounded.astype(np.uint32).view(np.float32)


def truncate_mantissa(values: np.ndarray, mantissa_bits: int) -> np.ndarray:
    """float32 with its mantissa truncated (toward zero) to `mantissa_bits` bits (1..23)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    mask = np.uint32((0xFFFFFFFF << (23 - mantissa_bits)) & 0xFFFFFFFF)
    truncated = bits & mask
    truncated = np.where(np.isnan(values), bits, truncated)  # keep NaN a NaN
    return truncated.astype(np.uint32).view(np.float32)


class OperandRoundingKernel(Kernel):
    """Reduced-precision float multiplier: both operands rounded, products/sums in float32.

    Rounding the operands elementwise before an exact GEMM is the same as rounding inside every
    multiplier, because each operand value is used unchanged by all the products it enters.
    """

    def __init__(self, spec: str, description: str, rounding):
        self.spec = spec
        self.description = description
        self._round = rounding
        self._exact = native.shipped_library()

    def matmul(self, a, b):
        return self._exact.matmul_f32(self._round(a), self._round(b))

    def conv2d(self, x, w, geometry):
        return self._exact.conv2d_f32(self._round(x), self._round(w), geometry)


_FP32_MANTISSA = re.compile(r"^fp32_m(\d+)$")
FP32_MANTISSA_RANGE = range(1, 24)

FLOAT_KERNELS = {
    "exact": "float32 GEMM/Conv2D in C (the reference every other kernel is compared with)",
    "bf16": "operands rounded to bfloat16 (round-to-nearest-even), float32 products and sums",
    "fp32_m{m}": "operand mantissas truncated to m bits (m = 1..23), float32 products and sums "
                 "(ApproxTrain-style reduced-precision multiply)",
}


def available_kernels() -> dict[str, str]:
    """Every built-in kernel name with a one-line description (family names use {k}-style)."""
    kernels = dict(FLOAT_KERNELS)
    kernels.update(multipliers.builtin_multipliers())
    return kernels


def builtin_names() -> frozenset:
    """The closed list of built-in kernel names: the only specs a file may name without a path."""
    names = {"exact", "bf16", *(f"fp32_m{m}" for m in FP32_MANTISSA_RANGE)}
    return frozenset(names | set(multipliers.builtin_multipliers()))


# --------------------------------------------------------------------------------------------
# spec strings that name files
# --------------------------------------------------------------------------------------------

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


def _record_file_spec(spec: str, path: str, where: str) -> FileSpec:
    """The FileSpec of a record, whose spec must refer to exactly the recorded path."""
    kernel_trust.check_record_path(path, where)
    parsed = parse_file_spec(spec) if isinstance(spec, str) else None
    if parsed is None or parsed.path != path:
        raise KernelTrustError(
            f"{where}: the kernel record's spec {spec!r} does not refer to its recorded path "
            f"{path!r}; a record must name one file. Re-convert the model")
    return parsed


# --------------------------------------------------------------------------------------------
# resolving
# --------------------------------------------------------------------------------------------

_cache: dict[tuple, Kernel] = {}
_cache_lock = threading.Lock()

ACCEPTED_FORMS = ("'exact', 'bf16', 'fp32_m{m}', a built-in multiplier (list them with "
                  "'graphswap kernels'), a multiplier file (.c, .lut, .bin), 'lib.so:symbol' for a "
                  "scalar multiplier, or an operation-level library (.so)")


def _cached(key, build) -> Kernel:
    with _cache_lock:
        kernel = _cache.get(key)
        if kernel is None:
            kernel = build()
            _cache[key] = kernel
        return kernel


def resolve_kernel(spec) -> Kernel:
    """Turn a kernel spec the user names (a string, or a Kernel) into a Kernel; cached.

    A file the user names is read once, hashed, approved for this session (kernel_trust) and
    compiled or loaded from a private copy of those bytes.  A config dict (a kernel record, as a
    saved model stores it) is treated as named by a file: see open_record().  Raises
    KernelSpecError with the list of accepted forms when the spec cannot be resolved.
    """
    if isinstance(spec, Kernel):
        return spec
    if isinstance(spec, dict):
        return open_record(spec, "the kernel record")
    if not isinstance(spec, str) or not spec.strip():
        raise KernelSpecError(f"a kernel spec must be a non-empty string, got {spec!r}; use "
                              f"{ACCEPTED_FORMS}")
    spec = spec.strip()
    file_spec = parse_file_spec(spec)
    if file_spec is None:
        return _builtin_kernel(spec)
    path = os.path.abspath(file_spec.path)
    if not os.path.isfile(path):
        raise KernelSpecError(f"{file_spec.what} not found: {file_spec.path} (resolved to "
                              f"{path}); check the path")
    content = kernel_trust.read_file(path, file_spec.what)
    kernel_trust.approve(content)  # the user named it: approved for the session
    return _file_kernel(FileSpec(file_spec.kind, path, file_spec.extra), content)


def open_record(record, where: str = "the model") -> Kernel:
    """The Kernel a file names (a layer config, an ONNX node, a kernel map, a checkpoint).

    A file never adds trust.  Accepted: a built-in name (as a string or {"spec": name}), or a
    complete record {"spec", "path", "sha256"} whose spec refers to exactly that absolute path;
    the file is checked (kernel_trust.admit_recorded_file) before anything opens it.  Anything
    else raises KernelTrustError naming `where`, the file, its hash and how to trust it.
    """
    if isinstance(record, str):
        if record in builtin_names():
            return _builtin_kernel(record)
        raise KernelTrustError(
            f"{where} names the kernel {record!r} without a recorded path and sha256; only "
            f"built-in kernels may be named that way (see 'graphswap kernels'). Re-convert the "
            f"model with 'graphswap convert MODEL --kernel FILE'")
    if not isinstance(record, dict) or not isinstance(record.get("spec"), str):
        raise KernelTrustError(f"{where}: {record!r} is not a kernel record (a built-in name, or "
                               f'{{"spec", "path", "sha256"}}); re-convert the model')
    spec, path, sha256 = record["spec"], record.get("path"), record.get("sha256")
    if path is None and sha256 is None:
        if spec in builtin_names():
            return _builtin_kernel(spec)
        raise KernelTrustError(
            f"{where} names the kernel {spec!r} without a recorded path and sha256; only "
            f"built-in kernels may be named that way (see 'graphswap kernels'). Re-convert the "
            f"model with 'graphswap convert MODEL --kernel FILE'")
    if spec in builtin_names():
        raise KernelTrustError(f"{where}: the built-in kernel {spec!r} is recorded with a file "
                               f"({path!r}); built-ins name no file. Re-convert the model")
    file_spec = _record_file_spec(spec, path, where)
    content = kernel_trust.admit_recorded_file(path, sha256, file_spec.what, where,
                                               executable=file_spec.executable)
    return _file_kernel(file_spec, content)


def resolve_file_named(spec, base_dir, where: str) -> Kernel:
    """A kernel spec string written in a file (a kernel map): a built-in, or a file spec whose
    relative path is taken relative to `base_dir` (the map's folder, never the current directory)
    and whose content must already be trusted (native code) - a file never adds trust."""
    if isinstance(spec, dict):
        return open_record(spec, where)
    if not isinstance(spec, str) or not spec.strip():
        raise KernelSpecError(f"{where}: a kernel spec must be a non-empty string, got {spec!r}")
    spec = spec.strip()
    file_spec = parse_file_spec(spec)
    if file_spec is None:
        return _builtin_kernel(spec)  # a built-in, or the unknown-kernel error
    path = os.path.normpath(os.path.join(os.fspath(base_dir), file_spec.path))
    content = kernel_trust.read_file(path, file_spec.what) if os.path.isfile(path) else None
    if content is None:
        raise KernelSpecError(f"{where}: {file_spec.what} not found: {file_spec.path} (resolved "
                              f"to {path}, relative to the kernel map's folder)")
    if file_spec.executable:
        kernel_trust.require_trusted(content, file_spec.what, where)
    return _file_kernel(FileSpec(file_spec.kind, path, file_spec.extra), content)


def remember_named_file(spec) -> tuple[kernel_trust.FileContent, bool] | None:
    """For a kernel spec the user names on the command line: record the file it names (its
    current content) in the trust store, so later commands on models that use it need no flag.

    Returns (content, newly recorded), or None for a spec that names no file.  Tables (.lut/.bin)
    are data and are not recorded."""
    file_spec = parse_file_spec(spec.strip()) if isinstance(spec, str) else None
    if file_spec is None or not file_spec.executable:
        return None
    path = os.path.abspath(file_spec.path)
    content = kernel_trust.read_file(path, file_spec.what)
    return content, kernel_trust.approve(content, persist=True)


def resolve_multiplier(spec) -> multipliers.Multiplier | None:
    """The Multiplier a user-named spec names, or None if it is not a multiplier spec."""
    if isinstance(spec, multipliers.Multiplier):
        return spec
    kernel = spec if isinstance(spec, Kernel) else None
    if kernel is None:
        if isinstance(spec, str):
            file_spec = parse_file_spec(spec.strip())
            name = spec.strip()
            if file_spec is None and not multipliers.looks_like_builtin(name):
                return None
            if file_spec is not None and file_spec.kind == "library":
                return None
        kernel = resolve_kernel(spec)
    return getattr(kernel, "multiplier", None)


def _builtin_kernel(spec: str) -> Kernel:
    from graphswap import quantized

    if spec == "exact":
        return _cached(("exact",), lambda: LibraryKernel(native.shipped_library(), "exact",
                                                         FLOAT_KERNELS["exact"]))
    if spec == "bf16":
        return _cached(("bf16",), lambda: OperandRoundingKernel(
            "bf16", FLOAT_KERNELS["bf16"], round_to_bfloat16))
    match = _FP32_MANTISSA.match(spec)
    if match:
        bits = int(match.group(1))
        if bits not in FP32_MANTISSA_RANGE:
            raise KernelSpecError(f"fp32_m{{m}} needs 1 <= m <= 23, got m = {bits}")
        return _cached((spec,), lambda: OperandRoundingKernel(
            spec, f"operand mantissas truncated to {bits} bits, float32 products and sums",
            lambda values: truncate_mantissa(values, bits)))
    if multipliers.looks_like_builtin(spec):
        return _cached((spec,), lambda: quantized.LutKernel(multipliers.builtin(spec)))
    raise KernelSpecError(f"unknown kernel {spec!r}; use {ACCEPTED_FORMS}")


def _file_kernel(file_spec: FileSpec, content: kernel_trust.FileContent) -> Kernel:
    """Build the kernel of a checked file (content = the bytes that were checked)."""
    from graphswap import quantized

    key = (file_spec.kind, content.path, content.sha256, file_spec.extra)
    if file_spec.kind == "library":
        def build():
            copy = native.private_copy(content.data, content.sha256,
                                       os.path.basename(content.path))
            library = native.load_library(copy, content.sha256)
            return LibraryKernel(library, content.path,
                                 f"operation-level library {os.path.basename(content.path)}",
                                 path=content.path, sha256=content.sha256)
        return _cached(key, build)
    return _cached(key, lambda: quantized.LutKernel(
        multipliers.from_file(file_spec.kind, content, file_spec.extra)))


def clear_cache() -> None:
    """Forget every resolved kernel and evaluated table: the next resolution loads anew."""
    with _cache_lock:
        _cache.clear()
    multipliers.clear_cache()


def evaluate_anew(spec) -> multipliers.Multiplier:
    """Evaluate the table of a user-named multiplier file (.c, lib.so:symbol) again, bypassing
    every cache: what `kernels check` compares to test determinism and re-entrancy."""
    file_spec = parse_file_spec(spec.strip())
    if file_spec is None or file_spec.kind not in ("c", "so"):
        raise KernelSpecError(f"{spec!r} is not a multiplier in C or in a shared library")
    content = kernel_trust.read_file(os.path.abspath(file_spec.path), file_spec.what)
    kernel_trust.approve(content)
    if file_spec.kind == "c":
        return multipliers.from_c_source(content, *file_spec.extra)
    return multipliers.from_shared_library(content, *file_spec.extra)


def lut(spec):
    """The 256x256 table of a multiplier spec (rows = first operand; see graphswap.multipliers)."""
    return multipliers.lut(require_multiplier(spec))


def metrics(spec) -> dict:
    """Error metrics of a multiplier spec computed from its table (MAE, MAE%, WCE%, EP%, ...)."""
    return multipliers.metrics(require_multiplier(spec))


def require_multiplier(spec) -> multipliers.Multiplier:
    """resolve_multiplier(), with a KernelSpecError for a spec that is no multiplier."""
    multiplier = resolve_multiplier(spec)
    if multiplier is None:
        raise KernelSpecError(
            f"{spec!r} is not a multiplier spec; use a built-in multiplier name (e.g. mul8u_drum4; "
            f"see 'graphswap kernels'), a .c file, 'lib.so:symbol', or a .lut/.bin table")
    return multiplier
