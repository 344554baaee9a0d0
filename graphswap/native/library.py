"""ctypes bridge to kernel libraries that follow native_kernels/include/graphswap_kernels.h.

Responsibilities: load a library (graphswap's own, or a user's .so), check its ABI version and
symbols, declare argument types, call it on numpy buffers (ctypes releases the GIL for the call), and
turn non-zero return codes into KernelExecutionError with the library's own message.  One C call per
layer call covers the whole batch.

It is longer than 450 lines because it is one binding per C entry point of the ABI (float, table,
fused and gradient kernels, ISA control), each a few lines of argument checks around one call, on
one class: splitting the class would hide which method binds which symbol.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
from pathlib import Path

import numpy as np

from graphswap.errors import GraphswapError, KernelExecutionError, KernelLoadError
from graphswap.native import compiler
from graphswap.native.cache import (cache_dir, owner_only_directory, record_artefact,
                                    recorded_artefact, remove_stale)
from graphswap.native.files import file_sha256, open_checked
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

_i64 = ctypes.c_int64
_f32p = ctypes.POINTER(ctypes.c_float)
_u8p = ctypes.POINTER(ctypes.c_uint8)
_i8p = ctypes.POINTER(ctypes.c_int8)
_i32p = ctypes.POINTER(ctypes.c_int32)
_i64p = ctypes.POINTER(ctypes.c_int64)


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


def _load_quietly(path: str):
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


def _ptr(array: np.ndarray, ctype):
    return array.ctypes.data_as(ctype)


def _as_input(array: np.ndarray, dtype) -> np.ndarray:
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


class KernelLibrary:
    """A loaded kernel library.  Construct through load_library() / shipped_library()."""

    REQUIRED = ("graphswap_abi_version", "graphswap_matmul_f32")

    def __init__(self, path: str | os.PathLike, sha256: str | None = None,
                 load_from: str | None = None):
        """`load_from`: what dlopen opens (the descriptor whose bytes hashed to `sha256`, see
        load_library); `path` names the library in messages."""
        self.path = str(Path(path).resolve())
        if load_from is None and not os.path.isfile(self.path):
            raise KernelLoadError(f"kernel library not found: {self.path}")
        self.sha256 = sha256 or file_sha256(self.path)
        try:
            self._lib = _load_quietly(load_from or self.path)
        except OSError as exc:
            reason = str(exc).replace(load_from, self.path) if load_from else exc
            raise KernelLoadError(
                f"cannot load kernel library {self.path}: {reason}. It must be a shared library "
                f"(.so) built for this machine, e.g. 'cc -O3 -shared -fPIC mykernel.c -o libmykernel.so'"
            ) from None
        missing = [name for name in self.REQUIRED if not hasattr(self._lib, name)]
        if missing:
            raise KernelLoadError(
                f"kernel library {self.path} does not export {', '.join(missing)}; an operation-level "
                f"kernel library must export graphswap_abi_version and graphswap_matmul_f32 as "
                f"declared in graphswap_kernels.h (for a scalar multiplier pass 'LIB.so:SYMBOL')")
        self._lib.graphswap_abi_version.restype = ctypes.c_int32
        self._lib.graphswap_abi_version.argtypes = []
        version = self._lib.graphswap_abi_version()
        if version != ABI_VERSION:
            raise KernelLoadError(
                f"kernel library {self.path} was built for graphswap ABI version {version}, but this "
                f"graphswap speaks version {ABI_VERSION}; rebuild it against this graphswap's "
                f"graphswap_kernels.h")
        self._declare()

    def _optional(self, name, restype, argtypes):
        function = getattr(self._lib, name, None)
        if function is not None:
            function.restype = restype
            function.argtypes = argtypes
        return function

    def _declare(self):
        i32 = ctypes.c_int32
        self._matmul = self._optional("graphswap_matmul_f32", i32,
                                      [_f32p, _f32p, _f32p, _i64, _i64, _i64])
        self._conv = self._optional("graphswap_conv2d_f32", i32,
                                    [_f32p, _f32p, _f32p, ctypes.POINTER(Conv2DParams)])
        self._last_error = self._optional("graphswap_last_error", ctypes.c_char_p, [])
        self._set_threads = self._optional("graphswap_set_num_threads", i32, [i32])
        self._lut_matmul = self._optional("graphswap_lut_matmul", i32,
                                          [_u8p, _u8p, _i32p, _i64p, _i64, _i64, _i64])
        self._lut_conv = self._optional("graphswap_lut_conv2d", i32,
                                        [_u8p, _u8p, _i32p, ctypes.c_uint8, _i64p, _i64p,
                                         ctypes.POINTER(Conv2DParams)])
        quant = ctypes.POINTER(LutQuant)
        self._lut_matmul_f32 = self._optional(
            "graphswap_lut_matmul_f32", i32,
            [_f32p, _f32p, _f32p, _f32p, _i64, _i64, _i64, _i32p, quant])
        self._lut_conv_f32 = self._optional(
            "graphswap_lut_conv2d_f32", i32,
            [_f32p, _f32p, _f32p, _f32p, _i32p, quant, ctypes.POINTER(Conv2DParams)])
        self._isa = self._optional("graphswap_isa", ctypes.c_char_p, [])
        self._isa_supported = self._optional("graphswap_isa_supported", ctypes.c_char_p, [])
        self._set_isa = self._optional("graphswap_set_isa", i32, [ctypes.c_char_p])
        self._blas_info = self._optional("graphswap_blas_info", ctypes.c_char_p, [])
        self._table_factored = self._optional("graphswap_lut_table_factored", i32, [_i32p])
        self._set_table_factoring = self._optional("graphswap_set_table_factoring", i32, [i32])
        self._lut_derivatives = self._optional("graphswap_lut_derivative_tables", i32,
                                               [_i32p, i32, i32, _f32p, _f32p])
        self._lut_matmul_grad = self._optional(
            "graphswap_lut_matmul_grad", i32,
            [_u8p, _u8p, _i8p, _f32p, _f32p, _f32p, _f32p, _f32p, _f32p, _i64, _i64, _i64])
        self._channel_affine = self._optional("graphswap_channel_affine_f32", i32,
                                              [_f32p, _i64, _i64, _f32p, _f32p, i32])
        self._lut_float_matmul = self._optional("graphswap_lut_float_matmul", i32,
                                                [_u8p, _u8p, _f32p, _f32p, _i64, _i64, _i64])

    # -- capabilities ------------------------------------------------------------------------
    def function_address(self, name: str) -> int | None:
        """The address of the exported function `name` in this process, or None if the library
        does not export it (for callers that call the library from native code)."""
        function = getattr(self._lib, name, None)
        return None if function is None else ctypes.cast(function, ctypes.c_void_p).value

    @property
    def has_conv2d(self) -> bool:
        return self._conv is not None

    @property
    def has_lut(self) -> bool:
        return self._lut_matmul is not None and self._lut_conv is not None

    def set_num_threads(self, n: int) -> None:
        if self._set_threads is not None:
            self._set_threads(int(n))

    # -- instruction-set paths (graphswap's own library) ----------------------------------------
    @property
    def isa(self) -> str | None:
        """The code path in use ("scalar", "avx2", "avx512"; "none" while a forced path is
        refused), or None for a library without run-time dispatch."""
        return self._isa().decode() if self._isa is not None else None

    @property
    def supported_isas(self) -> tuple:
        """The code paths this CPU can run."""
        return tuple(self._isa_supported().decode().split()) if self._isa_supported else ()

    def set_isa(self, name: str) -> None:
        """Switch the code path: "scalar", "avx2", "avx512" or "auto" (the best the CPU runs)."""
        if self._set_isa is None:
            raise KernelLoadError(f"{self.path} has no run-time instruction-set dispatch")
        self._check("graphswap_set_isa", self._set_isa(str(name).encode("ascii")))

    def table_factored(self, table) -> bool:
        """Whether a 256x256 table's products run as the float GEMM of its exact factors
        T[a][b] = f(a) g(b) (native_kernels/src/lut_factored.c) rather than the table kernels."""
        if self._table_factored is None:
            return False
        flat = np.ascontiguousarray(np.asarray(table, dtype=np.int32).reshape(-1))
        if flat.size != 65536:
            raise GraphswapError(f"a multiplier table has 65536 entries, got {flat.size}")
        code = self._table_factored(flat.ctypes.data_as(_i32p))
        if code < 0:
            self._check("graphswap_lut_table_factored", code)
        return code == 1

    def set_table_factoring(self, enabled: bool | None) -> None:
        """Factored tables through the float GEMM (True), through the table kernels (False), or
        as $GRAPHSWAP_TABLE_FACTORING says (None)."""
        if self._set_table_factoring is None:
            raise KernelLoadError(f"{self.path} has no factored-table path")
        self._set_table_factoring(-1 if enabled is None else int(bool(enabled)))

    @property
    def blas_info(self) -> str | None:
        return self._blas_info().decode() if self._blas_info is not None else None

    def check_isa(self) -> None:
        """Raise KernelLoadError when $GRAPHSWAP_ISA forced a path this CPU cannot run."""
        if self.isa == "none":
            raise KernelLoadError(
                f"GRAPHSWAP_ISA={os.environ.get('GRAPHSWAP_ISA')!r} cannot run here: this CPU runs "
                f"{', '.join(self.supported_isas) or 'scalar'}; unset GRAPHSWAP_ISA or choose one "
                f"of those (allowed: {', '.join(ISA_PATHS)}, auto)")

    # -- calls -------------------------------------------------------------------------------
    def _check(self, function_name: str, code: int) -> None:
        if code == 0:
            return
        message = ""
        if self._last_error is not None:
            raw = self._last_error()
            message = raw.decode("utf-8", "replace") if raw else ""
        raise KernelExecutionError(
            f"kernel {function_name} in {os.path.basename(self.path)} failed with code {code} "
            f"({ERROR_NAMES.get(code, 'unknown code')})" + (f": {message}" if message else ""))

    def matmul_f32_into(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> int:
        """Raw call: (m,k) x (k,n) into the C-contiguous float32 buffer `out` (m,n); returns the
        library's code (0 = ok) without raising.  For checks that watch the buffers themselves
        (`graphswap kernels check`'s guard regions)."""
        m, k = a.shape
        n = b.shape[1]
        return int(self._matmul(_ptr(a, _f32p), _ptr(b, _f32p), _ptr(out, _f32p), m, k, n))

    def conv2d_f32_into(self, x: np.ndarray, w: np.ndarray, out: np.ndarray,
                        geometry: ConvGeometry) -> int:
        """Raw call of graphswap_conv2d_f32 into `out`; returns the library's code."""
        params = Conv2DParams.from_geometry(geometry)
        return int(self._conv(_ptr(x, _f32p), _ptr(w, _f32p), _ptr(out, _f32p),
                              ctypes.byref(params)))

    def matmul_f32(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """(m,k) x (k,n) -> (m,n), float32."""
        a = _as_input(a, np.float32)
        b = _as_input(b, np.float32)
        m, k = a.shape
        k2, n = b.shape
        if k != k2:
            raise GraphswapError(f"matmul shapes do not agree: {a.shape} x {b.shape}; the inner "
                                 f"dimensions must be equal")
        c = empty_output((m, n))
        self._check("graphswap_matmul_f32",
                    self._matmul(_ptr(a, _f32p), _ptr(b, _f32p), _ptr(c, _f32p), m, k, n))
        return c

    def conv2d_f32(self, x: np.ndarray, w: np.ndarray, geometry: ConvGeometry) -> np.ndarray:
        if self._conv is None:
            raise KernelLoadError(f"{self.path} has no graphswap_conv2d_f32")
        x = _as_input(x, np.float32)
        w = _as_input(w, np.float32)
        out = empty_output(geometry.output_shape)
        params = Conv2DParams.from_geometry(geometry)
        self._check("graphswap_conv2d_f32",
                    self._conv(_ptr(x, _f32p), _ptr(w, _f32p), _ptr(out, _f32p), ctypes.byref(params)))
        return out

    def channel_affine_(self, y: np.ndarray, gain=None, shift=None, relu=False) -> np.ndarray:
        """y * gain + shift over the last axis (None: 1 / 0), then max(y, 0) with `relu`, in one
        pass: in place when y is a writable C-contiguous float32 array, else on a copy; returns
        the result."""
        if not (y.dtype == np.float32 and y.flags.c_contiguous and y.flags.writeable):
            y = np.array(y, dtype=np.float32, order="C")
        channels = y.shape[-1] if y.ndim else 1
        vectors = []
        for name, vector in (("gain", gain), ("shift", shift)):
            if vector is not None:
                vector = _as_input(vector, np.float32).reshape(-1)
                if vector.shape[0] != channels:
                    raise GraphswapError(f"{name} has {vector.shape[0]} values for {channels} "
                                         f"output channels; give one per channel")
            vectors.append(vector)
        gain, shift = vectors
        self._check("graphswap_channel_affine_f32",
                    self._channel_affine(_ptr(y, _f32p), y.size // max(channels, 1), channels,
                                         None if gain is None else _ptr(gain, _f32p),
                                         None if shift is None else _ptr(shift, _f32p),
                                         1 if relu else 0))
        return y

    def lut_matmul(self, a_codes: np.ndarray, b_codes: np.ndarray, table: np.ndarray) -> np.ndarray:
        """int64 sums of table[(a<<8)|b] over k; a (m,k) and b (k,n) are uint8 codes."""
        a = _as_input(a_codes, np.uint8)
        b = _as_input(b_codes, np.uint8)
        table = _as_input(table, np.int32)
        if table.size != 65536:
            raise GraphswapError(f"a multiplier table has 65536 entries, got {table.size}")
        m, k = a.shape
        n = b.shape[1]
        acc = np.empty((m, n), dtype=np.int64)
        self._check("graphswap_lut_matmul",
                    self._lut_matmul(_ptr(a, _u8p), _ptr(b, _u8p), _ptr(table, _i32p),
                                     _ptr(acc, _i64p), m, k, n))
        return acc

    def lut_float_matmul(self, a_codes: np.ndarray, b_codes: np.ndarray,
                         table: np.ndarray) -> np.ndarray:
        """float32 sums of table[(a<<8)|b] over k, in increasing k (8-bit float multipliers:
        graphswap/kernels/fp8.py); a (m,k) and b (k,n) uint8 codes, table 65536 float32."""
        if self._lut_float_matmul is None:
            raise KernelLoadError(f"{self.path} has no graphswap_lut_float_matmul (a library "
                                  f"built before 8-bit float multipliers); rebuild graphswap")
        a = _as_input(a_codes, np.uint8)
        b = _as_input(b_codes, np.uint8)
        table = _as_input(table, np.float32)
        if table.size != 65536:
            raise GraphswapError(f"a multiplier table has 65536 entries, got {table.size}")
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise GraphswapError(f"code matrices do not agree: {a.shape} x {b.shape}")
        m, k = a.shape
        n = b.shape[1]
        out = np.empty((m, n), dtype=np.float32)
        self._check("graphswap_lut_float_matmul",
                    self._lut_float_matmul(_ptr(a, _u8p), _ptr(b, _u8p), _ptr(table, _f32p),
                                           _ptr(out, _f32p), m, k, n))
        return out

    def lut_conv2d(self, x_codes: np.ndarray, w_codes: np.ndarray, table: np.ndarray, pad_code: int,
                   geometry: ConvGeometry, window_sums: bool = False):
        """Table-driven conv; returns (acc int64 NHWC, window sums [N,OH,OW,groups] or None)."""
        x = _as_input(x_codes, np.uint8)
        w = _as_input(w_codes, np.uint8)
        table = _as_input(table, np.int32)
        acc = np.empty(geometry.output_shape, dtype=np.int64)
        sums = None
        sums_ptr = None
        if window_sums:
            sums = np.empty((geometry.batch, geometry.out_height, geometry.out_width,
                             geometry.groups), dtype=np.int64)
            sums_ptr = _ptr(sums, _i64p)
        params = Conv2DParams.from_geometry(geometry)
        self._check("graphswap_lut_conv2d",
                    self._lut_conv(_ptr(x, _u8p), _ptr(w, _u8p), _ptr(table, _i32p), int(pad_code),
                                   _ptr(acc, _i64p), sums_ptr, ctypes.byref(params)))
        return acc, sums

    @property
    def has_fused_lut(self) -> bool:
        return self._lut_matmul_f32 is not None and self._lut_conv_f32 is not None

    def lut_matmul_f32(self, a, b, table, quant: LutQuant, bias=None) -> np.ndarray:
        """Quantize a (m,k) and b (k,n), sum table products exactly, correct, dequantize (+ bias):
        one call (graphswap_lut_matmul_f32)."""
        a = _as_input(a, np.float32)
        b = _as_input(b, np.float32)
        m, k = a.shape
        if b.ndim != 2 or b.shape[0] != k:
            raise GraphswapError(f"matmul shapes do not agree: {a.shape} x {b.shape}; the inner "
                                 f"dimensions must be equal")
        n = b.shape[1]
        out = empty_output((m, n))
        bias_ptr = None if bias is None else _ptr(_as_input(bias, np.float32), _f32p)
        self._check("graphswap_lut_matmul_f32",
                    self._lut_matmul_f32(_ptr(a, _f32p), _ptr(b, _f32p), bias_ptr,
                                         _ptr(out, _f32p), m, k, n, _ptr(table, _i32p),
                                         ctypes.byref(quant)))
        return out

    def lut_conv2d_f32(self, x, w, table, quant: LutQuant, geometry: ConvGeometry,
                       bias=None) -> np.ndarray:
        """The fused table-driven convolution (graphswap_lut_conv2d_f32)."""
        x = _as_input(x, np.float32)
        w = _as_input(w, np.float32)
        out = empty_output(geometry.output_shape)
        bias_ptr = None if bias is None else _ptr(_as_input(bias, np.float32), _f32p)
        params = Conv2DParams.from_geometry(geometry)
        self._check("graphswap_lut_conv2d_f32",
                    self._lut_conv_f32(_ptr(x, _f32p), _ptr(w, _f32p), bias_ptr,
                                       _ptr(out, _f32p), _ptr(table, _i32p),
                                       ctypes.byref(quant), ctypes.byref(params)))
        return out
    # -- approximation-aware gradients (native_kernels/src/lut_grad.c) ------------------------
    def lut_derivative_tables(self, table: np.ndarray, signed: bool, half_width: int):
        """(d_first, d_second): the table's smoothed finite-difference partial derivatives,
        65536 float32 each, indexed like the table (graphswap_kernels.h)."""
        if self._lut_derivatives is None:
            raise KernelLoadError(f"{self.path} has no graphswap_lut_derivative_tables")
        table = _as_input(table, np.int32)
        if table.size != 65536:
            raise GraphswapError(f"a multiplier table has 65536 entries, got {table.size}")
        d_first = np.empty(65536, dtype=np.float32)
        d_second = np.empty(65536, dtype=np.float32)
        self._check("graphswap_lut_derivative_tables",
                    self._lut_derivatives(_ptr(table, _i32p), int(bool(signed)), int(half_width),
                                          _ptr(d_first, _f32p), _ptr(d_second, _f32p)))
        return d_first, d_second

    def lut_matmul_grad(self, a_codes, b_codes, d_first, d_second, g_a=None, g_b=None,
                        sign=None):
        """(da or None, db or None): the gradient products of graphswap_lut_matmul_grad; pass
        g_a for da and g_b for db ((m, n) float32 each)."""
        if self._lut_matmul_grad is None:
            raise KernelLoadError(f"{self.path} has no graphswap_lut_matmul_grad")
        a = _as_input(a_codes, np.uint8)
        b = _as_input(b_codes, np.uint8)
        m, k = a.shape
        n = b.shape[1]
        d_first = _as_input(d_first, np.float32)
        d_second = _as_input(d_second, np.float32)
        sign_array = None if sign is None else _as_input(sign, np.int8)
        arrays = {}
        for name, g in (("g_a", g_a), ("g_b", g_b)):
            if g is not None:
                g = _as_input(g, np.float32)
                if g.shape != (m, n):
                    raise GraphswapError(f"{name} has shape {g.shape}; expected {(m, n)}")
            arrays[name] = g
        da = np.empty((m, k), dtype=np.float32) if g_a is not None else None
        db = np.empty((k, n), dtype=np.float32) if g_b is not None else None

        def pointer(array, ctype):
            return None if array is None else _ptr(array, ctype)

        self._check("graphswap_lut_matmul_grad",
                    self._lut_matmul_grad(_ptr(a, _u8p), _ptr(b, _u8p), pointer(sign_array, _i8p),
                                          _ptr(d_first, _f32p), _ptr(d_second, _f32p),
                                          pointer(arrays["g_a"], _f32p),
                                          pointer(arrays["g_b"], _f32p), pointer(da, _f32p),
                                          pointer(db, _f32p), m, k, n))
        return da, db

    # -- built-in multipliers (native_kernels/src/multipliers.c) --------------------------------
    def builtin_multiplier_table(self, name: str) -> np.ndarray:
        """The 65536-entry int32 table of built-in multiplier `name`, indexed (a_code << 8) | b_code."""
        function = getattr(self._lib, "graphswap_builtin_multiplier_table", None)
        if function is None:
            raise KernelLoadError(f"{self.path} has no graphswap_builtin_multiplier_table")
        function.restype = ctypes.c_int32
        function.argtypes = [ctypes.c_char_p, _i32p]
        table = np.empty(65536, dtype=np.int32)
        self._check("graphswap_builtin_multiplier_table", function(name.encode("ascii"), _ptr(table, _i32p)))
        return table


_libraries: dict[str, KernelLibrary] = {}
_lock = threading.Lock()


def load_library(path: str | os.PathLike, sha256: str | None = None) -> KernelLibrary:
    """Load (once per resolved path and content hash) an operation-level kernel library.

    The file is opened once (the last component not followed if it is a link: callers pass a real
    file), its bytes are hashed through that descriptor and the library is loaded through the same
    descriptor (/proc/self/fd/N), so what loads is what was hashed.  `sha256`, when given, is the
    hash the caller checked (a private copy made by private_copy(), a cache record): another hash
    is refused (KernelTrustError) and nothing is loaded.
    """
    resolved = str(Path(path).resolve())
    with _lock:
        library = _libraries.get(resolved)
        if library is not None and os.path.isfile(resolved) and \
                (sha256 or file_sha256(resolved)) == library.sha256:
            return library
        if not os.path.isfile(resolved):
            raise KernelLoadError(f"kernel library not found: {resolved}")
        checked = open_checked(resolved, sha256)
        # kept open even when a check after the load fails: the loader knows the loaded object
        # by its /proc/self/fd/N name, which must never name another file in this process
        checked.keep_open()
        library = KernelLibrary(resolved, checked.sha256, load_from=checked.load_path)
        _libraries[resolved] = library
        return library


_shipped: tuple[Path, str | None] | None = None


def shipped_library_path() -> Path:
    """Path of graphswap's own kernel library, building it from a source checkout if needed.

    An installed package carries the library built by `pip install`; a source checkout (tests run
    from the repository) builds native_kernels/ into the user cache, keyed by the sources' hash and
    the build's fingerprint (compiler, flags, OpenBLAS): a changed toolchain builds anew.  A cached
    build is reused only if its SHA-256 matches the record graphswap wrote when it built it
    (native.cache); anything else at its place is rebuilt, never loaded.  Found once per process
    (again only if the file went away): in a source checkout the lookup hashes every source and
    runs the compiler for its version, ~1.5 ms that every lut_grad gradient call paid.
    """
    return _shipped_location()[0]


def _shipped_location() -> tuple[Path, str | None]:
    """(path, the SHA-256 graphswap recorded when it built it - None for the installed one)."""
    global _shipped
    if _shipped is None or not _shipped[0].is_file():
        _shipped = _locate_shipped_library()
    return _shipped


def _locate_shipped_library() -> tuple[Path, str | None]:
    packaged = Path(__file__).resolve().parent.parent / compiler.LIBRARY_NAME
    if packaged.is_file():
        return packaged, None
    native_dir = compiler.native_source_dir()
    if native_dir is None:
        raise KernelLoadError(
            f"graphswap's kernel library {packaged} is missing and no native_kernels/ sources were "
            f"found to build it; reinstall graphswap with 'pip install .' from its source tree")
    digest = hashlib.sha256(compiler.build_fingerprint().encode())
    for source in sorted([*native_dir.glob("src/*.c"), *native_dir.glob("src/*.h"),
                          *native_dir.glob("include/*.h")]):
        digest.update(source.name.encode())
        digest.update(source.read_bytes())
    target = owner_only_directory(cache_dir() / "shipped") / \
        f"{digest.hexdigest()[:16]}-{compiler.LIBRARY_NAME}"
    checked = recorded_artefact(target)
    if checked is None:
        remove_stale(target)
        try:
            compiler.build_shipped_library(native_dir, target)
        except compiler.CompilerError as exc:
            raise KernelLoadError(f"building graphswap's kernel library from {native_dir} "
                                  f"failed: {exc}") from None
        checked = record_artefact(target)
    checked.close()
    return target, checked.sha256


_openblas_loaded = False


def _preload_openblas() -> None:
    """Load the scipy-openblas32 library the shipped kernels link, by its path in the installed
    wheel, before the kernels themselves.  They are loaded through /proc/self/fd/N (what loads is
    what was hashed), where their rpath's $ORIGIN no longer names the package folder - and the
    absolute rpath pip's isolated build recorded is gone - so the dynamic loader would not find
    libscipy_openblas.so; once loaded under its soname it is reused."""
    global _openblas_loaded
    if _openblas_loaded:
        return
    _, lib_dir, _ = compiler.openblas_location()
    for candidate in sorted(Path(lib_dir).glob("libscipy_openblas*.so*")):
        _load_quietly(str(candidate))
        break
    _openblas_loaded = True


def shipped_library() -> KernelLibrary:
    """graphswap's own kernel library (its forced instruction-set path checked on first load);
    a library built into the cache is loaded only with the hash graphswap recorded for it."""
    path, sha256 = _shipped_location()
    _preload_openblas()
    library = load_library(path, sha256)
    library.check_isa()
    return library
