"""The C ABI of kernel libraries (native_kernels/include/graphswap_kernels.h) as ctypes sees it:
its version, error codes, structures and constants, the pointer types of its arguments, and the
numpy buffers handed to it (inputs made C-contiguous, outputs aligned for TensorFlow).  Loading a
library (graphswap.native.library) and its table-driven calls (graphswap.native.lut_library) build
on it.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

from graphswap.native.geometry import ConvGeometry

ABI_VERSION = 1

ERROR_NAMES = {
    -1: "invalid argument",
    -2: "out of memory",
    -3: "overflow",
    -4: "unsupported",
    -5: "internal error",
}

# Idle OpenMP workers must sleep, not spin: spinning workers steal the cores TensorFlow's own pool
# needs for the rest of the training step (see docs/ARCHITECTURE.md).  Must be set before libgomp
# initialises, i.e. before the first kernel library is loaded.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# the C argument types the bindings declare
I64 = ctypes.c_int64
F32P = ctypes.POINTER(ctypes.c_float)
U8P = ctypes.POINTER(ctypes.c_uint8)
I8P = ctypes.POINTER(ctypes.c_int8)
I32P = ctypes.POINTER(ctypes.c_int32)
I64P = ctypes.POINTER(ctypes.c_int64)


class Conv2DParams(ctypes.Structure):
    """ctypes mirror of graphswap_conv2d_params (field order is the ABI)."""

    _fields_ = [(name, ctypes.c_int64) for name in (
        "batch", "in_height", "in_width", "in_channels",
        "filter_height", "filter_width", "out_channels",
        "out_height", "out_width",
        "stride_height", "stride_width",
        "dilation_height", "dilation_width",
        "pad_top", "pad_bottom", "pad_left", "pad_right",
        "groups")]

    @classmethod
    def from_geometry(cls, g: ConvGeometry) -> "Conv2DParams":
        return cls(*(getattr(g, name) for name, _ in cls._fields_))


def load_quietly(path: str):
    """ctypes.CDLL(path) with OPENBLAS_NUM_THREADS=1 while it loads: graphswap's library links
    OpenBLAS, whose own thread pool would otherwise be created - and spin - although graphswap
    only ever calls it single-threaded from its own (sleeping) OpenMP team."""
    previous = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        return ctypes.CDLL(path)
    finally:
        if previous is None:
            del os.environ["OPENBLAS_NUM_THREADS"]
        else:
            os.environ["OPENBLAS_NUM_THREADS"] = previous


#: TensorFlow wraps a numpy_function's result without copying it when the buffer is aligned to
#: EIGEN_MAX_ALIGN_BYTES (64 on x86-64 builds with AVX-512); numpy aligns to 16 only
OUTPUT_ALIGNMENT = 64


def empty_output(shape, dtype=np.float32) -> np.ndarray:
    """An uninitialised array whose data is 64-byte aligned (handed to TensorFlow zero-copy)."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    raw = np.empty(count * dtype.itemsize + OUTPUT_ALIGNMENT, dtype=np.uint8)
    offset = (-raw.ctypes.data) % OUTPUT_ALIGNMENT
    return raw[offset:offset + count * dtype.itemsize].view(dtype).reshape(shape)


def data_pointer(array: np.ndarray, ctype):
    """`array`'s buffer as a ctypes pointer of `ctype` (the array must outlive the call)."""
    return array.ctypes.data_as(ctype)


def as_input(array: np.ndarray, dtype) -> np.ndarray:
    """C-contiguous array of `dtype` (copies only when needed: strided views, other dtypes)."""
    return np.ascontiguousarray(array, dtype=dtype)


class LutQuant(ctypes.Structure):
    """ctypes mirror of graphswap_lut_quant (field order is the ABI; see the header)."""

    _fields_ = [("scheme", ctypes.c_int32), ("activation_mode", ctypes.c_int32),
                ("weight_mode", ctypes.c_int32), ("activation_zero_point", ctypes.c_int32),
                ("activation_scale", ctypes.c_double),
                ("observed_range", ctypes.POINTER(ctypes.c_double)),
                ("weight_encoding", ctypes.c_int32), ("weight_bits", ctypes.c_int32)]


# graphswap_lut_quant's constants (graphswap_kernels.h)
LUT_UNSIGNED, LUT_SIGNED, LUT_SIGNED_UNSIGNED_ACTIVATIONS = 0, 1, 2
QUANT_DYNAMIC, QUANT_STATIC = 0, 1
QUANT_PER_TENSOR, QUANT_PER_CHANNEL = 0, 1
WEIGHTS_DEFAULT, WEIGHTS_SIGN_MAGNITUDE = 0, 1
ISA_PATHS = ("scalar", "avx2", "avx512")
