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

Where the products with a zero WEIGHT are those of a real 0 as well (graphswap's exact float
kernel; a table whose column of the zero weight's code is exact: `zero_weight_exact`), the phases
run merged into one convolution (graphswap.native.transpose.merged_subpixel: every phase's taps
padded with zero weights to one window, stride_h * stride_w * filters output channels,
depth-to-space after): one pass over the input, one quantization and one GEMM instead of one per
phase - the same exact sums.  A non-finite input would reach outputs through the zero weights
(inf * 0), so a call whose input is not all finite takes the separate phases.

graphswap's own exact kernel needs none of this: its library computes the transposed convolution
as the input gradient of the forward convolution (graphswap_conv2d_backprop_input_f32: one GEMM of
the input by every tap, then their scatter-add; `scatters`), the products of real values only, in
one op for every geometry.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from graphswap import native
from graphswap.kernels.float_kernels import LibraryKernel
from graphswap.native.transpose import merged_filter_gather, merged_subpixel
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


def _graphswap_exact(kernel) -> bool:
    """Whether `kernel` is graphswap's own exact float kernel (not a user's library)."""
    return isinstance(kernel, LibraryKernel) and kernel.path is None and kernel.spec == "exact"


def scatters(arithmetic) -> bool:
    """Whether the transposed convolution runs as the input gradient of its forward convolution
    (graphswap_conv2d_backprop_input_f32: one GEMM by every tap, then their scatter-add - only
    the products of real values, any geometry): graphswap's own exact kernel, whose library
    exports it."""
    kernel = getattr(arithmetic, "kernel", arithmetic)
    return _graphswap_exact(kernel) and kernel.library.function_address(
        "graphswap_conv2d_backprop_input_f32") is not None


def table_scatters(arithmetic, scheme) -> bool:
    """Whether a table-driven transposed convolution runs as the input gradient of its forward
    convolution (graphswap_lut_conv2d_backprop_input_f32: the zero-inserted convolution's sums
    from the products of real values only): a table that factors, T[a][b] = f(a) g(b), with
    sign-magnitude or symmetric 8-bit weights and 8-bit activations (the zero point's row must be
    exact as well, which transposed_forward checks per call)."""
    kernel = getattr(arithmetic, "kernel", arithmetic)
    table = getattr(kernel, "fused_table", None)
    if table is None or getattr(kernel, "weight_bits", 8) != 8 or \
            getattr(kernel, "activation_bits", 8) != 8:
        return False
    library = native.shipped_library()
    if library.function_address("graphswap_lut_conv2d_backprop_input_f32") is None or \
            not library.table_factored(table):
        return False
    return kernel.resolve_scheme(scheme).weights in ("sign_magnitude", "symmetric")


def zero_weight_exact(arithmetic, scheme) -> bool:
    """Whether a zero weight's products are those of a real 0 for every activation code, so
    that zero weights padding a phase's taps leave the exact sums unchanged: graphswap's own
    exact float kernel (a user's library may do anything with a zero), or a table whose column
    of the zero weight's code holds the exact products - T[a, 0] == 0 for sign-magnitude and
    symmetric weights; for asymmetric ones (the zero point moves with each channel's range)
    every column, T[a, q] == a * q (graphswap/kernels/quantized.py's spec)."""
    kernel = getattr(arithmetic, "kernel", arithmetic)
    if isinstance(kernel, LibraryKernel):
        return _graphswap_exact(kernel)
    table = getattr(kernel, "fused_table", None)
    if table is None:
        return False
    table = np.asarray(table, np.int64).reshape(256, 256)
    weights = getattr(scheme, "weights", None)
    if weights == "asymmetric":
        codes = np.arange(256, dtype=np.int64)
        return bool((table == codes[:, None] * codes[None, :]).all())
    return not table[:, 0].any()


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


def weight_range_taps(weights):
    """tf (RANGE_TAPS, filters): what a table-driven phase's filter carries on its extra input
    channels of zeros.  The weights quantize per output channel over the whole filter, not a
    phase's taps: each phase's filter gets the channel's finite minimum and maximum (and a NaN
    where the channel has a non-finite weight) as taps whose products are those of a real 0
    (exact_zero_rows) - the same scales, the same exact sums."""
    finite = tf.math.is_finite(weights)
    clean = tf.where(finite, weights, tf.zeros_like(weights))
    marks = tf.where(tf.reduce_all(finite, axis=[0, 1, 3]), 0.0, float("nan"))
    return tf.stack([tf.reduce_min(clean, axis=[0, 1, 3]),
                     tf.reduce_max(clean, axis=[0, 1, 3]), marks])


def with_range_channels(inputs):
    """tf: the NHWC input with RANGE_TAPS channels of zeros appended (weight_range_taps)."""
    return tf.concat([inputs, tf.zeros(tf.concat([tf.shape(inputs)[:3], [RANGE_TAPS]], 0),
                                       inputs.dtype)], axis=-1)


def transposed_forward(arithmetic, quant, plan, subpixel, relu=False):
    """forward_tf for _kernel_op of a transposed convolution through graphswap's compiled op:
    the sub-pixel formulation (graphswap.native.transpose.SubpixelPlan: one stride-1 conv2d per
    phase of the input itself, interleaved - none of the inserted zeros' products, a quarter of
    the work at stride 2) wherever its exact sums are the zero-inserted formulation's - a float
    kernel, or a table whose products with this call's activation zero point are those of a
    real 0 (exact_zero_rows; checked per call when it depends on the range) - else the
    zero-inserted input (built in TensorFlow) and the flipped filter, one conv2d.  `relu`: the
    op's epilogue applies a ReLU too (it commutes with the interleaving)."""
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
        return forward_op.conv2d(arithmetic, z, w, plan.geometry, g, s, relu, quant,
                                 current_range)

    def phases(inputs, weights, current_range, g, s):
        in_h, in_w, in_c = (int(d) for d in inputs.shape[1:])
        filters = int(weights.shape[2])
        blocks_h, blocks_w = subpixel.blocks
        if table_driven:
            carried = weight_range_taps(weights)
            inputs = with_range_channels(inputs)
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
                y = forward_op.conv2d(arithmetic, part, w, geometry, g, s, relu, quant,
                                      current_range)
                line.append(tf.pad(y, [[0, 0], [0, blocks_h - row.outputs],
                                       [0, blocks_w - column.outputs], [0, 0]]))
            grid.append(tf.stack(line, axis=3))        # (n, bh, bw, s_w, c)
        y = tf.stack(grid, axis=2)                      # (n, bh, s_h, bw, s_w, c)
        y = tf.reshape(y, [tf.shape(inputs)[0], blocks_h * s_h, blocks_w * s_w, filters])
        return y[:, :subpixel.output_height, :subpixel.output_width, :]

    def merged(inputs, weights, current_range, g, s):
        # one compiled op: the merged filter gathered from the kernel (with the weight-range
        # channels of a table-driven layer, as phases() carries them), one convolution, the
        # phases interleaved into the output (forward_op.MergedTransposed)
        in_h, in_w, in_c = (int(d) for d in inputs.shape[1:])
        filters = int(weights.shape[2])
        one = merged_subpixel(subpixel, in_h, in_w)
        extra = RANGE_TAPS if table_driven else 0
        spec = forward_op.MergedTransposed(
            merged_filter_gather(one, weights.shape, extra), int(np.prod(weights.shape)), extra,
            filters, plan.strides, (one.rows.shift, one.columns.shift),
            (subpixel.output_height, subpixel.output_width))
        y = forward_op.merged_conv2d_transpose(
            arithmetic, inputs, weights, one.geometry(in_h, in_w, in_c + extra, filters), spec,
            g, s, relu, quant, current_range)
        y.set_shape([None, subpixel.output_height, subpixel.output_width, filters])
        return y

    def merged_where_finite(inputs, weights, current_range, g, s):
        # one reduction: a non-finite value (or a finite sum that overflows) takes the phases
        finite = tf.math.is_finite(tf.reduce_sum(inputs))
        return tf.cond(finite, lambda: merged(inputs, weights, current_range, g, s),
                       lambda: phases(inputs, weights, current_range, g, s))

    def scatter(inputs, weights, current_range, g, s):
        y = forward_op.conv2d_backprop_input(arithmetic, inputs, weights, plan.forward, g, s,
                                             relu, quant, current_range)
        y.set_shape([None, *plan.output_shape[1:]])
        return y

    if scatters(arithmetic):
        return scatter
    table_driven = getattr(kernel, "fused_table", None) is not None
    if subpixel is None or not rows.any() or (table_driven and subpixel.crops):
        # (a cropped phase's input would leave values out of this call's activation range)
        return zero_inserted
    if table_scatters(arithmetic, scheme):
        sub_pixel = scatter
    elif zero_weight_exact(arithmetic, scheme):
        sub_pixel = merged_where_finite
    else:
        sub_pixel = phases
    if rows.all() or (signed and rows[0]):
        return sub_pixel
    good = tf.constant(rows)

    current_range_is_dynamic = scheme is None or scheme.activations != "static"

    def zero_row_exact(inputs, current_range):
        codes = activation_zero_code(inputs, scheme, current_range)
        return tf.reduce_all(tf.gather(good, codes))

    def forward_tf(inputs, weights, current_range, g, s):
        if current_range is None and current_range_is_dynamic and rows[0]:
            # one reduction where the input is non-negative (a ReLU's output): zero point 0,
            # whose row is exact (a NaN minimum compares false and takes the full check)
            ok = tf.cond(tf.reduce_min(inputs) >= 0.0, lambda: tf.constant(True),
                         lambda: zero_row_exact(inputs, None))
        else:
            ok = zero_row_exact(inputs, current_range)
        return tf.cond(ok, lambda: sub_pixel(inputs, weights, current_range, g, s),
                       lambda: zero_inserted(inputs, weights, current_range, g, s))

    return forward_tf
