"""The table-driven (LUT) calls of a kernel library: table GEMM / convolution on 8-bit codes, the
fused quantize -> table -> correct -> dequantize calls, 8-bit float tables, factored tables, the
tables' derivatives and gradient products, and the built-in multipliers' tables.

`TableKernels` is mixed into graphswap.native.library.KernelLibrary, which loads the library and
checks its ABI: `_declare_tables` binds the table entry points of the C ABI
(native_kernels/include/graphswap_kernels.h), each method a few lines of argument checks around
one call, errors through the library's `_check`.
"""

from __future__ import annotations

import ctypes

import numpy as np

from graphswap.errors import GraphswapError, KernelLoadError
from graphswap.native.abi import (F32P, I8P, I32P, I64, I64P, U8P, Conv2DParams, LutQuant,
                                  as_input, data_pointer, empty_output)
from graphswap.native.geometry import ConvGeometry


class TableKernels:
    """The table-driven entry points of a KernelLibrary (a mixin: the library supplies
    `_optional`, `_check`, `_lib` and `path`)."""

    def _declare_tables(self):
        i32 = ctypes.c_int32
        self._lut_matmul = self._optional("graphswap_lut_matmul", i32,
                                          [U8P, U8P, I32P, I64P, I64, I64, I64])
        self._lut_conv = self._optional("graphswap_lut_conv2d", i32,
                                        [U8P, U8P, I32P, ctypes.c_uint8, I64P, I64P,
                                         ctypes.POINTER(Conv2DParams)])
        quant = ctypes.POINTER(LutQuant)
        self._lut_matmul_f32 = self._optional(
            "graphswap_lut_matmul_f32", i32,
            [F32P, F32P, F32P, F32P, I64, I64, I64, I32P, quant])
        self._lut_conv_f32 = self._optional(
            "graphswap_lut_conv2d_f32", i32,
            [F32P, F32P, F32P, F32P, I32P, quant, ctypes.POINTER(Conv2DParams)])
        self._table_factored = self._optional("graphswap_lut_table_factored", i32, [I32P])
        self._set_table_factoring = self._optional("graphswap_set_table_factoring", i32, [i32])
        self._lut_derivatives = self._optional("graphswap_lut_derivative_tables", i32,
                                               [I32P, i32, i32, F32P, F32P])
        self._lut_matmul_grad = self._optional(
            "graphswap_lut_matmul_grad", i32,
            [U8P, U8P, I8P, F32P, F32P, F32P, F32P, F32P, F32P, I64, I64, I64])
        self._lut_float_matmul = self._optional("graphswap_lut_float_matmul", i32,
                                                [U8P, U8P, F32P, F32P, I64, I64, I64])

    @property
    def has_lut(self) -> bool:
        return self._lut_matmul is not None and self._lut_conv is not None

    def table_factored(self, table) -> bool:
        """Whether a 256x256 table's products run as the float GEMM of its exact factors
        T[a][b] = f(a) g(b) (native_kernels/src/lut_factored.c) rather than the table kernels."""
        if self._table_factored is None:
            return False
        flat = np.ascontiguousarray(np.asarray(table, dtype=np.int32).reshape(-1))
        if flat.size != 65536:
            raise GraphswapError(f"a multiplier table has 65536 entries, got {flat.size}")
        code = self._table_factored(flat.ctypes.data_as(I32P))
        if code < 0:
            self._check("graphswap_lut_table_factored", code)
        return code == 1

    def set_table_factoring(self, enabled: bool | None) -> None:
        """Factored tables through the float GEMM (True), through the table kernels (False), or
        as $GRAPHSWAP_TABLE_FACTORING says (None)."""
        if self._set_table_factoring is None:
            raise KernelLoadError(f"{self.path} has no factored-table path")
        self._set_table_factoring(-1 if enabled is None else int(bool(enabled)))

    # -- table calls -------------------------------------------------------------------------
    def lut_matmul(self, a_codes: np.ndarray, b_codes: np.ndarray, table: np.ndarray) -> np.ndarray:
        """int64 sums of table[(a<<8)|b] over k; a (m,k) and b (k,n) are uint8 codes."""
        a = as_input(a_codes, np.uint8)
        b = as_input(b_codes, np.uint8)
        table = as_input(table, np.int32)
        if table.size != 65536:
            raise GraphswapError(f"a multiplier table has 65536 entries, got {table.size}")
        m, k = a.shape
        n = b.shape[1]
        acc = np.empty((m, n), dtype=np.int64)
        self._check("graphswap_lut_matmul",
                    self._lut_matmul(data_pointer(a, U8P), data_pointer(b, U8P), data_pointer(table, I32P),
                                     data_pointer(acc, I64P), m, k, n))
        return acc

    def lut_float_matmul(self, a_codes: np.ndarray, b_codes: np.ndarray,
                         table: np.ndarray) -> np.ndarray:
        """float32 sums of table[(a<<8)|b] over k, in increasing k (8-bit float multipliers:
        graphswap/kernels/fp8.py); a (m,k) and b (k,n) uint8 codes, table 65536 float32."""
        if self._lut_float_matmul is None:
            raise KernelLoadError(f"{self.path} has no graphswap_lut_float_matmul (a library "
                                  f"built before 8-bit float multipliers); rebuild graphswap")
        a = as_input(a_codes, np.uint8)
        b = as_input(b_codes, np.uint8)
        table = as_input(table, np.float32)
        if table.size != 65536:
            raise GraphswapError(f"a multiplier table has 65536 entries, got {table.size}")
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise GraphswapError(f"code matrices do not agree: {a.shape} x {b.shape}")
        m, k = a.shape
        n = b.shape[1]
        out = np.empty((m, n), dtype=np.float32)
        self._check("graphswap_lut_float_matmul",
                    self._lut_float_matmul(data_pointer(a, U8P), data_pointer(b, U8P), data_pointer(table, F32P),
                                           data_pointer(out, F32P), m, k, n))
        return out

    def lut_conv2d(self, x_codes: np.ndarray, w_codes: np.ndarray, table: np.ndarray, pad_code: int,
                   geometry: ConvGeometry, window_sums: bool = False):
        """Table-driven conv; returns (acc int64 NHWC, window sums [N,OH,OW,groups] or None)."""
        x = as_input(x_codes, np.uint8)
        w = as_input(w_codes, np.uint8)
        table = as_input(table, np.int32)
        acc = np.empty(geometry.output_shape, dtype=np.int64)
        sums = None
        sums_ptr = None
        if window_sums:
            sums = np.empty((geometry.batch, geometry.out_height, geometry.out_width,
                             geometry.groups), dtype=np.int64)
            sums_ptr = data_pointer(sums, I64P)
        params = Conv2DParams.from_geometry(geometry)
        self._check("graphswap_lut_conv2d",
                    self._lut_conv(data_pointer(x, U8P), data_pointer(w, U8P), data_pointer(table, I32P), int(pad_code),
                                   data_pointer(acc, I64P), sums_ptr, ctypes.byref(params)))
        return acc, sums

    @property
    def has_fused_lut(self) -> bool:
        return self._lut_matmul_f32 is not None and self._lut_conv_f32 is not None

    def lut_matmul_f32(self, a, b, table, quant: LutQuant, bias=None) -> np.ndarray:
        """Quantize a (m,k) and b (k,n), sum table products exactly, correct, dequantize (+ bias):
        one call (graphswap_lut_matmul_f32)."""
        a = as_input(a, np.float32)
        b = as_input(b, np.float32)
        m, k = a.shape
        if b.ndim != 2 or b.shape[0] != k:
            raise GraphswapError(f"matmul shapes do not agree: {a.shape} x {b.shape}; the inner "
                                 f"dimensions must be equal")
        n = b.shape[1]
        out = empty_output((m, n))
        bias_ptr = None if bias is None else data_pointer(as_input(bias, np.float32), F32P)
        self._check("graphswap_lut_matmul_f32",
                    self._lut_matmul_f32(data_pointer(a, F32P), data_pointer(b, F32P), bias_ptr,
                                         data_pointer(out, F32P), m, k, n, data_pointer(table, I32P),
                                         ctypes.byref(quant)))
        return out

    def lut_conv2d_f32(self, x, w, table, quant: LutQuant, geometry: ConvGeometry,
                       bias=None) -> np.ndarray:
        """The fused table-driven convolution (graphswap_lut_conv2d_f32)."""
        x = as_input(x, np.float32)
        w = as_input(w, np.float32)
        out = empty_output(geometry.output_shape)
        bias_ptr = None if bias is None else data_pointer(as_input(bias, np.float32), F32P)
        params = Conv2DParams.from_geometry(geometry)
        self._check("graphswap_lut_conv2d_f32",
                    self._lut_conv_f32(data_pointer(x, F32P), data_pointer(w, F32P), bias_ptr,
                                       data_pointer(out, F32P), data_pointer(table, I32P),
                                       ctypes.byref(quant), ctypes.byref(params)))
        return out

    # -- approximation-aware gradients (native_kernels/src/lut_grad.c) ------------------------
    def lut_derivative_tables(self, table: np.ndarray, signed: bool, half_width: int):
        """(d_first, d_second): the table's smoothed finite-difference partial derivatives,
        65536 float32 each, indexed like the table (graphswap_kernels.h)."""
        if self._lut_derivatives is None:
            raise KernelLoadError(f"{self.path} has no graphswap_lut_derivative_tables")
        table = as_input(table, np.int32)
        if table.size != 65536:
            raise GraphswapError(f"a multiplier table has 65536 entries, got {table.size}")
        d_first = np.empty(65536, dtype=np.float32)
        d_second = np.empty(65536, dtype=np.float32)
        self._check("graphswap_lut_derivative_tables",
                    self._lut_derivatives(data_pointer(table, I32P), int(bool(signed)), int(half_width),
                                          data_pointer(d_first, F32P), data_pointer(d_second, F32P)))
        return d_first, d_second

    def lut_matmul_grad(self, a_codes, b_codes, d_first, d_second, g_a=None, g_b=None,
                        sign=None):
        """(da or None, db or None): the gradient products of graphswap_lut_matmul_grad; pass
        g_a for da and g_b for db ((m, n) float32 each)."""
        if self._lut_matmul_grad is None:
            raise KernelLoadError(f"{self.path} has no graphswap_lut_matmul_grad")
        a = as_input(a_codes, np.uint8)
        b = as_input(b_codes, np.uint8)
        m, k = a.shape
        n = b.shape[1]
        d_first = as_input(d_first, np.float32)
        d_second = as_input(d_second, np.float32)
        sign_array = None if sign is None else as_input(sign, np.int8)
        arrays = {}
        for name, g in (("g_a", g_a), ("g_b", g_b)):
            if g is not None:
                g = as_input(g, np.float32)
                if g.shape != (m, n):
                    raise GraphswapError(f"{name} has shape {g.shape}; expected {(m, n)}")
            arrays[name] = g
        da = np.empty((m, k), dtype=np.float32) if g_a is not None else None
        db = np.empty((k, n), dtype=np.float32) if g_b is not None else None

        def pointer(array, ctype):
            return None if array is None else data_pointer(array, ctype)

        self._check("graphswap_lut_matmul_grad",
                    self._lut_matmul_grad(data_pointer(a, U8P), data_pointer(b, U8P), pointer(sign_array, I8P),
                                          data_pointer(d_first, F32P), data_pointer(d_second, F32P),
                                          pointer(arrays["g_a"], F32P),
                                          pointer(arrays["g_b"], F32P), pointer(da, F32P),
                                          pointer(db, F32P), m, k, n))
        return da, db

    # -- built-in multipliers (native_kernels/src/multipliers.c) --------------------------------
    def builtin_multiplier_table(self, name: str) -> np.ndarray:
        """The 65536-entry int32 table of built-in multiplier `name`, indexed (a_code << 8) | b_code."""
        function = getattr(self._lib, "graphswap_builtin_multiplier_table", None)
        if function is None:
            raise KernelLoadError(f"{self.path} has no graphswap_builtin_multiplier_table")
        function.restype = ctypes.c_int32
        function.argtypes = [ctypes.c_char_p, I32P]
        table = np.empty(65536, dtype=np.int32)
        self._check("graphswap_builtin_multiplier_table", function(name.encode("ascii"), data_pointer(table, I32P)))
        return table
