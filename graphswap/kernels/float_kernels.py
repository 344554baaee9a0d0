"""Float-level kernels: graphswap's exact float32 GEMM/Conv2D ("exact"), a user's operation-level
library, and reduced-precision float multipliers ("bf16", "fp32_m{m}": operands rounded, then
exact float32 products and sums)."""

from __future__ import annotations

import re

import numpy as np

from graphswap import native
from graphswap.kernels.base import Kernel

class LibraryKernel(Kernel):
    """Float32 kernels from an operation-level library (graphswap's own "exact", or a user's .so).

    A user's library is loaded from a private copy of the bytes that were checked (see
    graphswap.kernels.trust); `path` and `sha256` name the file the user or the model named."""

    def __init__(self, library: native.KernelLibrary, spec: str, description: str,
                 path: str | None = None, sha256: str | None = None):
        self.library = library
        self.spec = spec
        self.description = description
        self.path = path
        self.sha256 = sha256

    def matmul(self, a, b, quant=None):
        return self.library.matmul_f32(a, b)

    def conv2d(self, x, w, geometry, quant=None):
        if self.library.has_conv2d:
            return self.library.conv2d_f32(x, w, geometry)
        return native.conv_via_matmul(x, w, geometry, self.library.matmul_f32)

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

    def matmul(self, a, b, quant=None):
        return self._exact.matmul_f32(self._round(a), self._round(b))

    def conv2d(self, x, w, geometry, quant=None):
        return self._exact.conv2d_f32(self._round(x), self._round(w), geometry)


FP32_MANTISSA = re.compile(r"^fp32_m(\d+)$")
FP32_MANTISSA_RANGE = range(1, 24)

FLOAT_KERNELS = {
    "exact": "float32 GEMM/Conv2D in C (the reference every other kernel is compared with)",
    "bf16": "operands rounded to bfloat16 (round-to-nearest-even), float32 products and sums",
    "fp32_m{m}": "operand mantissas truncated to m bits (m = 1..23), float32 products and sums "
                 "(ApproxTrain-style reduced-precision multiply)",
}
