"""Convolution lowered to matrix products, in numpy: patches (im2col), their adjoint (col2im),
and a grouped convolution as one matmul per group.

Used where a kernel offers only a matmul (an operation-level library without conv2d) and for the
backward pass through a kernel (backward="kernel"); the geometry is the same explicit one the C
ABI receives.
"""

from __future__ import annotations

import numpy as np

from graphswap.native.geometry import ConvGeometry


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


def col2im(columns: np.ndarray, geometry: ConvGeometry) -> np.ndarray:
    """Adjoint of im2col: scatter-add patch columns back onto the (unpadded) input."""
    g = geometry
    patches = columns.reshape(g.batch, g.out_height, g.out_width, g.filter_height, g.filter_width,
                              g.in_channels)
    padded = np.zeros((g.batch, g.in_height + g.pad_top + g.pad_bottom,
                       g.in_width + g.pad_left + g.pad_right, g.in_channels), dtype=np.float32)
    for fh in range(g.filter_height):
        top = fh * g.dilation_height
        for fw in range(g.filter_width):
            left = fw * g.dilation_width
            padded[:, top: top + (g.out_height - 1) * g.stride_height + 1: g.stride_height,
                   left: left + (g.out_width - 1) * g.stride_width + 1: g.stride_width, :] += \
                patches[:, :, :, fh, fw, :]
    return padded[:, g.pad_top: g.pad_top + g.in_height, g.pad_left: g.pad_left + g.in_width, :]


def conv_gradients_via_matmul(x, w, dy, geometry: ConvGeometry, matmul):
    """(dx, dw) of a (grouped) convolution whose products all run through `matmul`
    (patches x matmul, one call per group and gradient)."""
    g = geometry
    patches = im2col(x, g)  # (M, fh*fw, in_c)
    rows = patches.shape[0]
    dy2d = dy.reshape(rows, g.out_channels)
    group_in = g.in_channels // g.groups
    group_out = g.out_channels // g.groups
    dx_cols = np.zeros((rows, g.filter_height * g.filter_width, g.in_channels), dtype=np.float32)
    dw = np.zeros_like(w, dtype=np.float32)
    for group in range(g.groups):
        in_slice = slice(group * group_in, (group + 1) * group_in)
        out_slice = slice(group * group_out, (group + 1) * group_out)
        cols = np.ascontiguousarray(patches[:, :, in_slice].reshape(rows, -1))
        filt = np.ascontiguousarray(w[:, :, :, out_slice].reshape(-1, group_out))
        dy_g = np.ascontiguousarray(dy2d[:, out_slice])
        dw[:, :, :, out_slice] = matmul(np.ascontiguousarray(cols.T), dy_g).reshape(
            g.filter_height, g.filter_width, group_in, group_out)
        dx_cols[:, :, in_slice] = matmul(dy_g, np.ascontiguousarray(filt.T)).reshape(
            rows, g.filter_height * g.filter_width, group_in)
    dx = col2im(dx_cols, g)
    return dx.astype(np.float32), dw
