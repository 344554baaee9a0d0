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
import os
import re
import threading

import numpy as np

from graphswap import kernel_trust, native
from graphswap.errors import KernelSpecError
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
    """Float32 kernels from an operation-level library (graphswap's own "exact", or a user's .so)."""

    def __init__(self, library: native.KernelLibrary, spec: str, description: str):
        self.library = library
        self.spec = spec
        self.description = description

    def matmul(self, a, b):
        return self.library.matmul_f32(a, b)

    def conv2d(self, x, w, geometry):
        if self.library.has_conv2d:
            return self.library.conv2d_f32(x, w, geometry)
        return conv_via_matmul(x, w, geometry, self.library.matmul_f32)

    def to_config(self):
        if self.spec == "exact":
            return {"spec": "exact"}
        return {"spec": self.spec, "path": self.library.path, "sha256": self.library.sha256}


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

FLOAT_KERNELS = {
    "exact": "float32 GEMM/Conv2D in C (the reference every other kernel is compared with)",
    "bf16": "operands rounded to bfloat16 (round-to-nearest-even), float32 products and sums",
    "fp32_m{m}": "operand mantissas truncated to m bits (m = 1..23), float32 products and sums "
                 "(ApproxTrain-style reduced-precision multiply)",
}


def available_kernels() -> dict[str, str]:
    """Every built-in kernel name with a one-line description (family names use {k}-style)."""
    from graphswap import multipliers

    kernels = dict(FLOAT_KERNELS)
    kernels.update(multipliers.builtin_multipliers())
    return kernels


_cache: dict[tuple, Kernel] = {}
_cache_lock = threading.Lock()


def _file_key(path: str) -> tuple:
    try:
        return (os.path.realpath(path), native.file_sha256(path))
    except OSError:
        return (path, None)


def resolve_kernel(spec) -> Kernel:
    """Turn a kernel spec (string, config dict, or Kernel) into a Kernel; cached.

    Raises KernelSpecError with the list of accepted forms when the spec cannot be resolved.
    """
    if isinstance(spec, Kernel):
        return spec
    expected_sha = None
    from_config = isinstance(spec, dict)
    if from_config:
        _verify_config_files(spec)
        expected_sha = spec.get("sha256")
        spec = spec.get("spec")
    if not isinstance(spec, str) or not spec.strip():
        raise KernelSpecError(
            f"a kernel spec must be a non-empty string, got {spec!r}; use 'exact', a built-in name "
            f"(see 'graphswap kernels'), a .c/.lut/.bin file, 'lib.so:symbol' or an operation-level .so")
    spec = spec.strip()
    path_part = spec.split(":", 1)[0] if ":" in spec and not os.path.exists(spec) else spec
    key = (spec, _file_key(path_part) if os.path.exists(path_part) else None)
    with _cache_lock:
        kernel = _cache.get(key)
        if kernel is None:
            kernel = _build_kernel(spec)
            _cache[key] = kernel
    config = kernel.to_config()
    if not from_config and config.get("path") and config.get("sha256"):
        # The user named this kernel: it is approved for the session, with its current content.
        kernel_trust.trust(config["path"])
    if expected_sha is not None:
        actual = config.get("sha256")
        if actual is not None and actual != expected_sha:
            raise KernelSpecError(
                f"kernel {spec!r} has changed since the model was saved: recorded sha256 "
                f"{expected_sha}, file now has {actual}; restore the original file or re-convert")
    return kernel


DATA_SUFFIXES = (".lut", ".bin")


def _verify_config_files(config: dict) -> None:
    """Before a kernel named in a saved model loads: its file must be intact and, if it is native
    code (a library, or C source we would compile and run), trusted (see graphswap.kernel_trust)."""
    path = config.get("path")
    if not path and config.get("sha256") is None:
        return  # a built-in kernel: nothing external to load
    executable = not str(path).endswith(DATA_SUFFIXES)
    what = "kernel library" if executable else "multiplier table"
    if str(path).endswith(".c"):
        what = "multiplier source"
    kernel_trust.verify_recorded_file(path, config.get("sha256"), what, executable=executable)


def _build_kernel(spec: str) -> Kernel:
    from graphswap import multipliers, quantized

    if spec == "exact":
        return LibraryKernel(native.shipped_library(), "exact", FLOAT_KERNELS["exact"])
    if spec == "bf16":
        return OperandRoundingKernel("bf16", FLOAT_KERNELS["bf16"], round_to_bfloat16)
    match = _FP32_MANTISSA.match(spec)
    if match:
        bits = int(match.group(1))
        if not 1 <= bits <= 23:
            raise KernelSpecError(f"fp32_m{{m}} needs 1 <= m <= 23, got m = {bits}")
        return OperandRoundingKernel(
            spec, f"operand mantissas truncated to {bits} bits, float32 products and sums",
            lambda values: truncate_mantissa(values, bits))
    multiplier = multipliers.resolve_multiplier(spec)
    if multiplier is not None:
        return quantized.LutKernel(multiplier)
    if spec.endswith(".so") or spec.endswith(".dylib"):
        if not os.path.isfile(spec):
            raise KernelSpecError(f"kernel library not found: {spec}")
        library = native.load_library(spec)
        return LibraryKernel(library, os.path.abspath(spec),
                             f"operation-level library {os.path.basename(spec)}")
    raise KernelSpecError(
        f"unknown kernel {spec!r}; use 'exact', 'bf16', 'fp32_m{{m}}', a built-in multiplier "
        f"(list them with 'graphswap kernels'), a multiplier file (.c, .lut, .bin), "
        f"'lib.so:symbol' for a scalar multiplier, or an operation-level library (.so)")


def lut(spec):
    """The 256x256 table of a multiplier spec (rows = first operand; see graphswap.multipliers)."""
    from graphswap import multipliers

    return multipliers.lut(spec)


def metrics(spec) -> dict:
    """Error metrics of a multiplier spec computed from its table (MAE, MAE%, WCE%, EP%, ...)."""
    from graphswap import multipliers

    return multipliers.metrics(spec)
