"""The device path's gradients that graphswap computes itself (graphswap/kernels/device_products.py
has the forward products): backward="lut_grad" - the table's own partial derivatives,
graphswap/kernels/derivatives.py's definition - for matmul and convolution, and the im2col /
col2im a convolution's backward="kernel" products need, all in `keras.ops`, so that they run
inside XLA and under Keras's JAX backend.

lut_grad: with the codes and scales of the forward (device_products' quantizers, bit for bit the
C kernels') and the derivative tables D1, D2 (computed once, by the C library, as constants),

    dL/da_ik = sum_j g_ij s_j (sigma_kj D1[qa_ik, qb_kj] - z_j)
    dL/db_kj = s_a sum_i g_ij (D2[qa_ik, qb_kj] - z_a)

looked up in blocks of rows x chunk x N (never M x K x N, as the forward), summed in float32;
the C kernels sum in another order, so the two agree within float32 round-off of those sums.
A convolution is the same over its windows; col2im adds each window's gradient back onto the
input (padding positions dropped).
"""

from __future__ import annotations

import numpy as np
from keras import ops

from graphswap.kernels import device_products as dp
from graphswap.kernels.derivatives import require_signed_codes

#: the codes of padded rows / taps: an index past the 65536 table entries, onto zeros
PAD_CODE = 256


def _extended(table) -> np.ndarray:
    """A derivative table (65536 float32) and 256 zeros that padded codes index."""
    return np.concatenate([np.asarray(table, np.float32).reshape(-1),
                           np.zeros(256, np.float32)])


def code_gradient_sums(a_codes, b_codes, d_first, d_second, g_a, g_b, sign=None,
                       budget: int = dp.DEFAULT_BUDGET):
    """(da (M, K), db (K, N)) float32: da_ik = sum_j g_a[i, j] sign[k, j] D1[a_ik, b_kj] and
    db_kj = sum_i g_b[i, j] D2[a_ik, b_kj] for int32 codes a (M, K), b (K, N) (sign: float32
    (K, N) of +-1, or None for all +1)."""
    k, n = (int(d) for d in b_codes.shape)
    rows_static = a_codes.shape[0]
    mb, kc = dp.block_shape(rows_static, 1, k, n, budget)
    chunks = -(-k // kc)
    d1, d2 = ops.convert_to_tensor(_extended(d_first)), ops.convert_to_tensor(_extended(d_second))
    sign = ops.ones((k, n), "float32") if sign is None else ops.cast(sign, "float32")
    if chunks * kc != k:   # padded taps: code 256 looks up zeros; their da is cut below
        a_codes = ops.pad(a_codes, [[0, 0], [0, chunks * kc - k]], constant_values=PAD_CODE)
        b_codes = ops.pad(b_codes, [[0, chunks * kc - k], [0, 0]])
        sign = ops.pad(sign, [[0, chunks * kc - k], [0, 0]])
    rows = ops.shape(a_codes)[0]
    blocks = (rows + mb - 1) // mb
    pad_rows = blocks * mb - rows   # padded rows: code 256 and a zero gradient
    a_blocks = ops.reshape(ops.pad(a_codes, [[0, pad_rows], [0, 0]], constant_values=PAD_CODE),
                           (blocks, mb, chunks, kc))
    ga_blocks = ops.reshape(ops.pad(g_a, [[0, pad_rows], [0, 0]]), (blocks, mb, n))
    gb_blocks = ops.reshape(ops.pad(g_b, [[0, pad_rows], [0, 0]]), (blocks, mb, n))
    b_chunks = ops.reshape(b_codes, (chunks, kc, n))
    s_chunks = ops.reshape(sign, (chunks, kc, n))

    def row_step(i, carry):
        da, db = carry
        a_block = ops.take(a_blocks, i, axis=0)                       # (mb, chunks, kc)
        ga, gb = ops.take(ga_blocks, i, axis=0), ops.take(gb_blocks, i, axis=0)

        def chunk_step(c, inner):
            da_block, db = inner
            index = (ops.expand_dims(ops.take(a_block, c, axis=1), -1) * 256
                     + ops.expand_dims(ops.take(b_chunks, c, axis=0), 0))   # (mb, kc, n)
            weighted = ops.expand_dims(ga, 1) * ops.expand_dims(ops.take(s_chunks, c, axis=0), 0)
            da_c = ops.sum(ops.take(d1, index) * weighted, axis=2)             # (mb, kc)
            db_c = ops.sum(ops.take(d2, index) * ops.expand_dims(gb, 1), axis=0)   # (kc, n)
            da_block = ops.slice_update(da_block, (0, c * kc), da_c)
            db = ops.slice_update(db, (c * kc, 0), ops.slice(db, (c * kc, 0), (kc, n)) + db_c)
            return da_block, db

        da_block, db = ops.fori_loop(0, chunks, chunk_step,
                                     (ops.zeros((mb, chunks * kc), "float32"), db))
        return ops.slice_update(da, (i * mb, 0), da_block), db

    da, db = ops.fori_loop(0, blocks, row_step,
                           (ops.zeros((blocks * mb, chunks * kc), "float32"),
                            ops.zeros((chunks * kc, n), "float32")))
    return da[:rows][:, :k], db[:k]


def _weight_gradient_terms(w2, signed, scheme, weight_bits):
    qb, negative, sb, zb, _ = dp.weight_codes(w2, signed, scheme, weight_bits)
    sign = None if negative is None else ops.where(negative, -1.0, 1.0)
    return qb, sign, sb, zb


def _scaled(dy, da_codes, db_codes, sa, za, sb, zb, scheme):
    """The scales and zero-point terms of the module docstring, in float64."""
    g64 = ops.cast(dy, "float64")
    da = da_codes
    if scheme.weights == "asymmetric":
        da = ops.cast(ops.cast(da, "float64")
                      - ops.expand_dims(ops.sum(g64 * (sb * zb)[None, :], axis=1), 1), "float32")
    db = sa * (ops.cast(db_codes, "float64") - za * ops.sum(g64, axis=0)[None, :])
    return da, ops.cast(db, "float32")


def lut_matmul_gradients(a, b, dy, table_derivatives, signed: bool, scheme,
                         activation_range=None, weight_bits: int = 8, activation_bits: int = 8,
                         budget: int = dp.DEFAULT_BUDGET):
    """(dL/da, dL/db) of device_products.lut_matmul(a, b, ...) for dL/dy = dy, through the
    derivative tables (D1, D2) (graphswap.kernels.derivatives.derivative_tables)."""
    dp.require_float64()
    require_signed_codes(scheme)
    a = ops.convert_to_tensor(a, "float32")
    b = ops.convert_to_tensor(b, "float32")
    dy = ops.convert_to_tensor(dy, "float32")
    sa, za = dp.activation_params(a, signed, scheme, activation_range, activation_bits)
    qa = dp.quantize(a, sa, za, signed, dp.activation_levels(signed, activation_bits))
    qb, sign, sb, zb = _weight_gradient_terms(b, signed, scheme, weight_bits)
    g_a = ops.cast(ops.cast(dy, "float64") * sb[None, :], "float32")
    da, db = code_gradient_sums(qa, qb, *table_derivatives, g_a, dy, sign, budget)
    return _scaled(dy, da, db, sa, za, sb, zb, scheme)


def col2im(columns, geometry, batch):
    """The adjoint of device_products.conv_windows for float32 `columns` (M, groups, taps * C /
    groups): each window's values added back onto an NHWC input of `geometry` (padding dropped)."""
    g = geometry
    taps = g.filter_height * g.filter_width
    per = g.in_channels // g.groups
    values = ops.reshape(columns, (batch, g.out_height, g.out_width, g.groups, taps, per))
    values = ops.reshape(ops.transpose(values, (0, 1, 2, 4, 3, 5)),
                         (batch, g.out_height, g.out_width, taps, g.in_channels))
    height = g.in_height + g.pad_top + g.pad_bottom
    width = g.in_width + g.pad_left + g.pad_right
    spread_h, spread_w = g.out_height * g.stride_height, g.out_width * g.stride_width
    total = None
    for tap in range(taps):
        dy_, dx_ = divmod(tap, g.filter_width)
        top, left = dy_ * g.dilation_height, dx_ * g.dilation_width
        v = values[:, :, :, tap, :]
        # stride: zeros inserted after each value, then the tap's offset
        v = ops.pad(v[:, :, None, :, None, :], [[0, 0], [0, 0], [0, g.stride_height - 1],
                                                 [0, 0], [0, g.stride_width - 1], [0, 0]])
        v = ops.reshape(v, (batch, spread_h, spread_w, g.in_channels))
        v = v[:, :height - top, :width - left, :]
        v = ops.pad(v, [[0, 0], [top, height - top - min(spread_h, height - top)],
                        [left, width - left - min(spread_w, width - left)], [0, 0]])
        total = v if total is None else total + v
    return total[:, g.pad_top:g.pad_top + g.in_height, g.pad_left:g.pad_left + g.in_width, :]


def lut_conv2d_gradients(x, w, dy, table_derivatives, signed: bool, scheme, geometry,
                         activation_range=None, weight_bits: int = 8, activation_bits: int = 8,
                         budget: int = dp.DEFAULT_BUDGET):
    """(dL/dx, dL/dw) of device_products.lut_conv2d(x, w, ...) for dL/dy = dy."""
    dp.require_float64()
    require_signed_codes(scheme)
    x = ops.convert_to_tensor(x, "float32")
    w = ops.convert_to_tensor(w, "float32")
    g = geometry
    sx, zx = dp.activation_params(x, signed, scheme, activation_range, activation_bits)
    qx = dp.quantize(x, sx, zx, signed, dp.activation_levels(signed, activation_bits))
    codes = dp.conv_windows(qx, g, ops.cast(zx, "int32"))            # (M, G, Kg)
    batch = ops.shape(x)[0]
    dy2d = ops.reshape(ops.convert_to_tensor(dy, "float32"), (-1, g.out_channels))
    w2 = ops.reshape(w, (-1, g.out_channels))
    per_out = g.out_channels // g.groups
    qb, sign, sb, zb = _weight_gradient_terms(w2, signed, scheme, weight_bits)
    dcols, dws = [], []
    for group in range(g.groups):
        outs = slice(group * per_out, (group + 1) * per_out)
        g_group = dy2d[:, outs]
        g_a = ops.cast(ops.cast(g_group, "float64") * sb[outs][None, :], "float32")
        da, db = code_gradient_sums(codes[:, group, :], qb[:, outs], *table_derivatives, g_a,
                                    g_group, None if sign is None else sign[:, outs], budget)
        da, db = _scaled(g_group, da, db, sx, zx, sb[outs], zb[outs], scheme)
        dcols.append(da)
        dws.append(db)
    dx = col2im(ops.stack(dcols, axis=1), g, batch)
    dw = ops.reshape(ops.concatenate(dws, axis=1), w.shape)
    return dx, dw


def conv2d_gradients_through(matmul, x, w, dy, geometry):
    """(dL/dx, dL/dw) of a (grouped) convolution whose products all run through `matmul`
    ((m, k) x (k, n) float32 -> float32): backward="kernel" on the device path, as
    graphswap.native.conv_gradients_via_matmul on the C path (one call per group and
    gradient)."""
    g = geometry
    x = ops.convert_to_tensor(x, "float32")
    patches = dp.conv_windows(x, g, 0.0)                                  # (M, G, Kg)
    dy2d = ops.reshape(ops.convert_to_tensor(dy, "float32"), (-1, g.out_channels))
    w2 = ops.reshape(ops.convert_to_tensor(w, "float32"), (-1, g.out_channels))
    per_out = g.out_channels // g.groups
    dcols, dws = [], []
    for group in range(g.groups):
        outs = slice(group * per_out, (group + 1) * per_out)
        dy_g = dy2d[:, outs]
        dws.append(matmul(ops.transpose(patches[:, group, :]), dy_g))
        dcols.append(matmul(dy_g, ops.transpose(w2[:, outs])))
    dx = col2im(ops.stack(dcols, axis=1), g, ops.shape(x)[0])
    return dx, ops.reshape(ops.concatenate(dws, axis=1), w.shape)
