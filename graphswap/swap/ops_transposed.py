"""The forward of a swapped Conv2DTranspose through graphswap's compiled op
(graphswap.swap.forward_op), for graphswap.swap.ops_layers.swapped_conv2d_transpose.

The sub-pixel formulation (graphswap.native.transpose.subpixel_plan): one stride-1 conv2d per
phase of the input itself, the phases interleaved into the output - none of the products with
the zeros the zero-inserted formulation puts between the samples (three quarters of its work at
stride 2).  Its sums are the zero-inserted formulation's exactly wherever the dropped products
are those of a real 0: a float kernel, or a multiplier table whose row of this call's
activation zero point is exact (`exact_zero_rows`; graphswap/kernels/quantized.py's spec), which
is checked per call where it depends on the range (`activation_zero_code`).  The weights of a
table-driven phase quantize over the whole filter: each phase carries its channel's weight
range on RANGE_TAPS extra input channels of zeros.  Elsewhere (a table whose zero-point row is
not exact, a cropped phase, dilations, a kernel smaller than its stride) the zero-inserted input
is built in TensorFlow and runs as one conv2d with the flipped filter.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from graphswap.swap import forward_op

#: extra input channels (of zeros) a table-driven phase carries its channel's weight range on
RANGE_TAPS = 3


def exact_zero_rows(arithmetic) -> np.ndarray:
    """bool (256,): the activation codes z whose products are those of a real 0 for every
    weight code - T[z, q] == z * q (unsigned codes; the zero-point terms then cancel them) or,
    signed (z is always 0), T[0, q] == 0 - so that dropping a product with an input 0 leaves
    the exact integer sum unchanged (graphswap/kernels/quantized.py's spec).  A float kernel's
    products with 0 are 0: every entry True."""
    kernel = getattr(arithmetic, "kernel", arithmetic)
    table = getattr(kernel, "fused_table", None)
    if table is None:
        return np.ones(256, bool)
    table = np.asarray(table, np.int64).reshape(256, 256)
    if kernel.signed:
        rows = np.zeros(256, bool)
        rows[0] = not table[0].any()
        return rows
    codes = np.arange(256, dtype=np.int64)
    return (table == codes[:, None] * codes[None, :]).all(axis=1)


def activation_zero_code(inputs, scheme, current_range):
    """tf: the two candidates (floor, ceil) of the asymmetric activation zero point the fused
    kernel computes for this call (quantized.py's spec: the call's finite range, or the static
    one), as int32 (2,) - both are checked, so float64 rounding here cannot pick a code the C
    does not."""
    if current_range is not None:
        lo, hi = current_range[0], current_range[1]
    elif scheme is not None and scheme.activations == "static" and \
            scheme.activation_range is not None:
        lo, hi = (tf.constant(float(v), tf.float32) for v in scheme.activation_range)
    else:
        finite = tf.where(tf.math.is_finite(inputs), inputs, tf.zeros_like(inputs))
        lo, hi = tf.reduce_min(finite), tf.reduce_max(finite)
    lo = tf.minimum(tf.cast(lo, tf.float64), 0.0)
    hi = tf.maximum(tf.cast(hi, tf.float64), 0.0)
    scale = tf.where(hi > lo, (hi - lo) / 255.0, 1.0)
    zero = tf.clip_by_value(-lo / scale, 0.0, 255.0)
    return tf.cast(tf.stack([tf.floor(zero), tf.math.ceil(zero)]), tf.int32)


def transposed_forward(arithmetic, quant, plan, subpixel):
    """forward_tf for _kernel_op of a transposed convolution through graphswap's compiled op:
    the sub-pixel formulation (graphswap.native.transpose.SubpixelPlan: one stride-1 conv2d per
    phase of the input itself, interleaved - none of the inserted zeros' products, a quarter of
    the work at stride 2) wherever its exact sums are the zero-inserted formulation's - a float
    kernel, or a table whose products with this call's activation zero point are those of a
    real 0 (exact_zero_rows; checked per call when it depends on the range) - else the
    zero-inserted input (built in TensorFlow) and the flipped filter, one conv2d."""
    rows = exact_zero_rows(arithmetic)
    kernel = getattr(arithmetic, "kernel", arithmetic)
    scheme = quant if quant is not None else getattr(arithmetic, "quant", None)
    signed = bool(getattr(kernel, "signed", True))
    s_h, s_w = plan.strides

    def zero_inserted(inputs, weights, current_range, g, s):
        shape = tf.shape(inputs)
        spread = tf.pad(inputs[:, :, None, :, None, :],
                        [[0, 0], [0, 0], [0, s_h - 1], [0, 0], [0, s_w - 1], [0, 0]])
        spread = tf.reshape(spread, [shape[0], shape[1] * s_h, shape[2] * s_w, shape[3]])
        z = spread[:, :plan.crop_height, :plan.crop_width, :]
        w = tf.transpose(tf.reverse(weights, [0, 1]), [0, 1, 3, 2])
        return forward_op.conv2d(arithmetic, z, w, plan.geometry, g, s, False, quant,
                                 current_range)

    def phases(inputs, weights, current_range, g, s):
        in_h, in_w, in_c = (int(d) for d in inputs.shape[1:])
        filters = int(weights.shape[2])
        blocks_h, blocks_w = subpixel.blocks
        if table_driven:
            # the weights quantize per output channel over the whole filter, not a phase's taps:
            # each phase's filter gets the channel's finite minimum and maximum (and a NaN where
            # the channel has a non-finite weight) as taps of extra input channels of zeros,
            # whose products are those of a real 0 (exact_zero_rows) - the same scales, the
            # same exact sums
            finite = tf.math.is_finite(weights)
            clean = tf.where(finite, weights, tf.zeros_like(weights))
            marks = tf.where(tf.reduce_all(finite, axis=[0, 1, 3]), 0.0, float("nan"))
            carried = tf.stack([tf.reduce_min(clean, axis=[0, 1, 3]),
                                tf.reduce_max(clean, axis=[0, 1, 3]), marks])   # (3, filters)
            inputs = tf.concat([inputs, tf.zeros(tf.concat([tf.shape(inputs)[:3], [RANGE_TAPS]], 0),
                                             inputs.dtype)], axis=-1)
        grid = []
        for row in subpixel.rows:
            line = []
            for column in subpixel.columns:
                top, left = max(-row.pad_before, 0), max(-column.pad_before, 0)
                bottom, right = in_h - max(-row.pad_after, 0), in_w - max(-column.pad_after, 0)
                taps = weights[row.first_tap::s_h, column.first_tap::s_w]
                w = tf.transpose(tf.reverse(taps, [0, 1]), [0, 1, 3, 2])
                if table_driven:
                    extra = tf.pad(carried[None, None],
                                   [[0, row.taps - 1], [0, column.taps - 1], [0, 0], [0, 0]])
                    w = tf.concat([w, extra], axis=2)
                if (top, left, bottom, right) != (0, 0, in_h, in_w):
                    part = inputs[:, top:bottom, left:right, :]
                else:
                    part = inputs
                geometry = subpixel.phase_geometry(1, int(part.shape[3]), filters, row, column,
                                                   bottom - top, right - left)
                y = forward_op.conv2d(arithmetic, part, w, geometry, g, s, False, quant,
                                      current_range)
                line.append(tf.pad(y, [[0, 0], [0, blocks_h - row.outputs],
                                       [0, blocks_w - column.outputs], [0, 0]]))
            grid.append(tf.stack(line, axis=3))        # (n, bh, bw, s_w, c)
        y = tf.stack(grid, axis=2)                      # (n, bh, s_h, bw, s_w, c)
        y = tf.reshape(y, [tf.shape(inputs)[0], blocks_h * s_h, blocks_w * s_w, filters])
        return y[:, :subpixel.output_height, :subpixel.output_width, :]

    table_driven = getattr(kernel, "fused_table", None) is not None
    if subpixel is None or not rows.any() or (table_driven and subpixel.crops):
        # (a cropped phase's input would leave values out of this call's activation range)
        return zero_inserted
    if rows.all() or (signed and rows[0]):
        return phases
    good = tf.constant(rows)

    def forward_tf(inputs, weights, current_range, g, s):
        codes = activation_zero_code(inputs, scheme, current_range)
        ok = tf.reduce_all(tf.gather(good, codes))
        return tf.cond(ok, lambda: phases(inputs, weights, current_range, g, s),
                       lambda: zero_inserted(inputs, weights, current_range, g, s))

    return forward_tf
