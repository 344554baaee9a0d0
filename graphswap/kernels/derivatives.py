"""Approximation-aware gradients (backward="lut_grad"): the backward pass of a multiplier layer uses
the table's own partial derivatives instead of the exact product's.

Definition.  With the forward of graphswap/kernels/quantized.py, y_ij = s_a s_j c_ij, and
D1 = d f / d a, D2 = d f / d b the table's smoothed finite differences (graphswap_kernels.h:
central differences of half-width h, default DEFAULT_HALF_WIDTH, in operand-value order, computed
in C by graphswap_lut_derivative_tables), rounding is passed straight through (d qa / d a = 1 / s_a,
d qb / d b = 1 / s_j, d m / d b = sigma / s_j; scales and zero points are constants), so for an
upstream gradient g = dL/dy:

    dL/da_ik = sum_j g_ij s_j (sigma_kj D1[qa_ik, qb_kj] - z_j)        (sigma = 1, z_j = 0 unless
    dL/db_kj = s_a sum_i g_ij (D2[qa_ik, qb_kj] - z_a)                  sign-magnitude / asymmetric)

with qb the weight code (the magnitude m for sign-magnitude weights).  A convolution is the same
over its patches (im2col of the codes, padding = the zero-point code; the gradient of padding
positions is dropped).  The code-level sums run in C (graphswap_lut_matmul_grad); the scales and
zero-point terms are applied here in float64.  For the exact multiplier D1[a, b] = b and
D2[a, b] = a away from the range ends, i.e. the straight-through gradient of the quantized product.
"""

from __future__ import annotations

import hashlib
import threading

import numpy as np

from graphswap import native
from graphswap.errors import QuantizationError
from graphswap.kernels.base import oriented
from graphswap.kernels.quantized import LutKernel, activation_quantization, quantize_weights
from graphswap.native import ConvGeometry, col2im, im2col

DEFAULT_HALF_WIDTH = 4

_tables: dict = {}
_lock = threading.Lock()


def derivative_tables(multiplier, half_width: int = DEFAULT_HALF_WIDTH):
    """(D1, D2), 65536 float32 each, of a Multiplier's table (cached per table and width)."""
    if isinstance(half_width, bool) or not isinstance(half_width, (int, np.integer)) \
            or not 1 <= half_width <= 255:
        raise QuantizationError(f"the lut_grad finite-difference half width must be a whole "
                                f"number in 1..255; got {half_width!r}")
    table = np.asarray(multiplier.table, dtype=np.int32)
    key = (hashlib.sha256(table.tobytes()).hexdigest(), bool(multiplier.signed), int(half_width))
    with _lock:
        found = _tables.get(key)
    if found is None:
        found = native.shipped_library().lut_derivative_tables(table, multiplier.signed,
                                                               int(half_width))
        with _lock:
            _tables[key] = found
    return found


def _check_kernel(kernel) -> LutKernel:
    if not isinstance(kernel, LutKernel):
        raise QuantizationError(f"lut_grad gradients need an 8-bit multiplier kernel; "
                                f"{getattr(kernel, 'spec', kernel)!r} is not one")
    return kernel


def _code_gradients(kernel, qa, za, sa, qb, negative, sb, zb, scheme, g, half_width):
    """(da, db) of one (m, k) x (k, n) code product for upstream gradient g (m, n)."""
    d_first, d_second = derivative_tables(kernel.multiplier, half_width)
    g64 = np.asarray(g, dtype=np.float64)
    sign = None if negative is None else np.where(negative, -1, 1).astype(np.int8)
    g_a = (g64 * sb[None, :]).astype(np.float32)
    da, db = native.shipped_library().lut_matmul_grad(qa, qb, d_first, d_second, g_a=g_a,
                                                      g_b=np.asarray(g, np.float32), sign=sign)
    if scheme.weights == "asymmetric":   # subtract the zero-point term in float64; else da as is
        da = (da.astype(np.float64)
              - (g64 * (sb * zb)[None, :]).sum(axis=1)[:, None]).astype(np.float32)
    db = sa * (db.astype(np.float64) - za * g64.sum(axis=0)[None, :])
    return da, db.astype(np.float32)


def require_signed_codes(scheme):
    """`scheme`, unless its activation zero point is -128: the derivative tables difference a
    signed table's rows in two's-complement order, and those codes are unsigned."""
    if getattr(scheme, "activation_zero_point", 0):
        raise QuantizationError("backward='lut_grad' does not run activation_zero_point -128 (its "
                                "derivative tables read signed activation codes); use the "
                                "straight-through backward ('native'), or the zero point 0")
    return scheme


def lut_matmul_gradients(kernel, a, b, dy, quant=None, half_width: int = DEFAULT_HALF_WIDTH):
    """(dL/da, dL/db) of y = kernel.matmul(a, b, quant) for dL/dy = dy (module docstring)."""
    kernel = oriented(_check_kernel(kernel), quant)   # the table as the scheme wires it
    scheme = require_signed_codes(kernel.resolve_scheme(quant))
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    qa, sa, za, _ = activation_quantization(a, scheme, kernel.signed,
                                            getattr(kernel, "activation_bits", 8))
    qb, negative, sb, zb, _ = quantize_weights(b, scheme, kernel.weight_bits)
    return _code_gradients(kernel, qa, za, sa, qb, negative, sb, zb, scheme, dy, half_width)


def lut_conv2d_gradients(kernel, x, w, dy, geometry: ConvGeometry, quant=None,
                         half_width: int = DEFAULT_HALF_WIDTH):
    """(dL/dx, dL/dw) of y = kernel.conv2d(x, w, geometry, quant) for dL/dy = dy."""
    kernel = oriented(_check_kernel(kernel), quant)   # the table as the scheme wires it
    scheme = require_signed_codes(kernel.resolve_scheme(quant))
    g = geometry
    qx, sx, zx, _ = activation_quantization(np.asarray(x, np.float32), scheme, kernel.signed,
                                            getattr(kernel, "activation_bits", 8))
    qw, negative, sw, zw, _ = quantize_weights(np.asarray(w, np.float32), scheme,
                                                kernel.weight_bits)
    patches = im2col(qx, g, pad_value=zx)                    # (rows, taps, in_channels) codes
    rows, taps = patches.shape[0], patches.shape[1]
    dy2d = np.asarray(dy, np.float32).reshape(rows, g.out_channels)
    group_in, group_out = g.in_channels // g.groups, g.out_channels // g.groups
    dcols = np.empty((rows, taps, g.in_channels), np.float32)
    dw = np.empty(qw.shape, np.float32)
    for group in range(g.groups):
        ins = slice(group * group_in, (group + 1) * group_in)
        outs = slice(group * group_out, (group + 1) * group_out)
        cols = np.ascontiguousarray(patches[:, :, ins].reshape(rows, -1))
        filt = np.ascontiguousarray(qw[..., outs].reshape(-1, group_out))
        neg = None if negative is None else negative[..., outs].reshape(-1, group_out)
        da, db = _code_gradients(kernel, cols, zx, sx, filt, neg, sw[outs], zw[outs], scheme,
                                 np.ascontiguousarray(dy2d[:, outs]), half_width)
        dcols[:, :, ins] = da.reshape(rows, taps, group_in)
        dw[..., outs] = db.reshape(g.filter_height, g.filter_width, group_in, group_out)
    return col2im(dcols, g).astype(np.float32), dw
