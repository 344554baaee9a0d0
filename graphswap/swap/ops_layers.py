"""TensorFlow ops for the depthwise, transposed and einsum layers: forward through a Kernel,
backward with TensorFlow's registered gradients of the stock op.

Each op is one `tf.custom_gradient` function of (input, weights), float32, plus - for a
calibrated layer - its static activation range and (the depthwise and transposed convolutions)
its epilogue (per-channel gain and shift: the output correction and the bias) as extra inputs, so
state changed after tracing applies; the epilogue's gradient is TensorFlow's (dy * gain for the
product, BiasAddGrad for the shift):

* forward: one `tf.numpy_function` calling the Kernel (for a depthwise convolution on a kernel
  graphswap's compiled op covers, that op: graphswap.swap.forward_op) - `conv2d` with groups =
  channels for a depthwise convolution (Keras' (h, w, in, multiplier) kernel is the HWIO filter
  (h, w, 1, in * multiplier)), `conv2d` of the zero-inserted input with the flipped filter for a
  transposed convolution (graphswap.native.transpose), one `matmul` between the transposes and
  reshapes an einsum equation resolves to (graphswap.native.einsum);
* backward="native": the vector-Jacobian product of the very op the stock Keras layer calls
  (keras.ops.depthwise_conv, keras.ops.conv_transpose, keras.ops.einsum on the TensorFlow
  backend), taken with a GradientTape on the same inputs - so the gradient functions are the ones
  TensorFlow registers for DepthwiseConv2dNative, Conv2DBackpropInput and Einsum, bit for bit.
  Those gradients do not read the forward's output, so in a traced step the float forward they
  are taken of is dead code and is pruned.  Two geometries TensorFlow's CPU builds without
  oneDNN refuse (its fused kernels have no such path; with oneDNN they run) take the same
  mathematical function through ops every build has instead, on every machine alike (the
  traced graph does not depend on the CPU that traced it): a depthwise convolution with unequal
  strides (`portable_depthwise_conv`: TensorFlow's padding made explicit, the stride-1 (dilated)
  VALID depthwise convolution, a strided slice) and a transposed convolution with dilations > 1
  (`portable_conv_transpose`: the vector-Jacobian product of the equivalent forward convolution,
  itself a stride-1 dilated VALID tf.nn.convolution - SpaceToBatch - of the explicitly padded
  output, strided).  Their gradients are the stock op's exactly, up to float32 round-off;
* backward="kernel": the backward products through the same Kernel (im2col/col2im lowering of
  the equivalent convolution; the two matmuls of the einsum).

Conv1D and the pointwise part of SeparableConv2D reuse graphswap.swap.ops.swapped_conv2d.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from graphswap import native
from graphswap.errors import UnsupportedLayerError
from graphswap.kernels import Kernel, bind_scheme
from graphswap.native import conv_geometry, einsum_plan, transposed_conv
from graphswap.native.transpose import subpixel_plan
from graphswap.swap import forward_op, xla
from graphswap.swap.ops_transposed import transposed_forward
from graphswap.swap.ops import (configure_threads, epilogue_gradients, epilogue_inputs,
                                gradient_kernel, kernel_call, split_epilogue)


def _static(shape, what: str) -> list:
    dims = list(shape)
    if None in dims[1:]:
        raise UnsupportedLayerError(f"swapped {what} needs a static input shape apart from the "
                                    f"batch, got {tuple(dims)}")
    return dims


@tf.autograph.experimental.do_not_convert
def _kernel_op(name, forward_np, stock, kernel_grads_np, out_static, backward, x, w,
               forward_tf=None, quant=None, activation_range=None, gain=None, shift=None,
               relu=False, kernel_grads_tf=None):
    """The custom-gradient op shared by the layers of this module (module docstring);
    `forward_tf(inputs, weights, activation_range, gain, shift)`, when given, builds the forward
    as graphswap's compiled op (graphswap.swap.forward_op) instead of calling `forward_np`
    through numpy_function.  `quant`, `activation_range`, `gain`, `shift`, `relu`: as for
    graphswap.swap.ops.swapped_matmul (forward_np then takes `quant=`; the range and the
    epilogue are extra inputs of the op, so a calibration or an observer update after tracing
    applies).  `kernel_grads_tf(inputs, weights, dy)`, when given (the device path), computes
    backward="kernel" in TensorFlow ops instead of `kernel_grads_np`."""
    with_range = quant is not None and activation_range is not None
    epilogue = (gain is not None, shift is not None, bool(relu))

    @tf.custom_gradient
    def op(inputs, weights, *extras):
        extras = list(extras)
        current_range = extras.pop(0) if with_range else None
        g, s = split_epilogue(extras, gain, shift)
        if forward_tf is not None:
            y = forward_tf(inputs, weights, current_range, g, s)
        else:
            call = kernel_call(forward_np, quant, with_range, epilogue)
            y = tf.numpy_function(call, [inputs, weights, *([current_range] if with_range else []),
                                         *epilogue_inputs(g, s)],
                                  tf.float32, stateful=False, name=f"graphswap_{name}")
        y.set_shape(out_static)

        def grad(dy):
            dy, extra = epilogue_gradients(dy, y, g, s, relu)
            if backward == "native":
                with tf.GradientTape() as tape:
                    tape.watch([inputs, weights])
                    reference = stock(inputs, weights)
                dx, dw = tape.gradient(reference, [inputs, weights], output_gradients=dy)
            elif kernel_grads_tf is not None:
                dx, dw = kernel_grads_tf(inputs, weights, dy)
            else:
                xla.check_gradient_not_in_xla(backward)
                dx, dw = tf.numpy_function(kernel_grads_np, [inputs, weights, dy],
                                           [tf.float32, tf.float32], stateful=False,
                                           name=f"graphswap_{name}_grad")
                dx.set_shape(inputs.shape)
                dw.set_shape(weights.shape)
            return (dx, dw, *([None] if with_range else []), *extra)

        return y, grad

    dtype = x.dtype
    extras = ([tf.cast(activation_range, tf.float32)] if with_range else []) + \
        epilogue_inputs(gain, shift)
    y = op(tf.cast(x, tf.float32), tf.cast(w, tf.float32), *extras)
    return tf.cast(y, dtype) if dtype != tf.float32 else y


# --------------------------------------------------------------------------------------------
# depthwise
# --------------------------------------------------------------------------------------------

def _strided_valid(geometry, strides, padded, stride_one_conv):
    """`stride_one_conv(padded)` (a stride-1 VALID convolution of the input padded by
    `geometry`'s explicit paddings), keeping every stride-th row and column: the strided
    convolution `geometry` describes."""
    full = stride_one_conv(tf.pad(padded, [[0, 0], [geometry.pad_top, geometry.pad_bottom],
                                           [geometry.pad_left, geometry.pad_right], [0, 0]]))
    return full[:, :(geometry.out_height - 1) * strides[0] + 1:strides[0],
                :(geometry.out_width - 1) * strides[1] + 1:strides[1], :]


def portable_depthwise_conv(inputs, weights, strides, padding, dilations):
    """tf: keras.ops.depthwise_conv(inputs, weights, strides, padding, dilation_rate=dilations)
    on NHWC inputs, through ops every TensorFlow CPU build has (DepthwiseConv2dNative refuses
    unequal strides without oneDNN): TensorFlow's SAME/VALID padding made explicit
    (graphswap.native.conv_geometry), the stride-1 (dilated: SpaceToBatch) VALID depthwise
    convolution, every stride-th row and column.  The same function, so its gradient (Pad's,
    the stride-1 depthwise op's, StridedSlice's) is the stock one's up to round-off."""
    strides = tuple(int(s) for s in strides)
    dilations = tuple(int(d) for d in dilations)
    geometry = depthwise_geometry((1, *_static(inputs.shape, "DepthwiseConv2D")[1:]),
                                  weights.shape, strides, padding, dilations)
    return _strided_valid(geometry, strides, inputs, lambda padded: tf.nn.depthwise_conv2d(
        padded, weights, [1, 1, 1, 1], "VALID", dilations=dilations))


def depthwise_filter(kernel_shape) -> tuple[int, int, int, int]:
    """The HWIO filter shape of a Keras depthwise kernel (h, w, in, multiplier)."""
    k_h, k_w, channels, multiplier = (int(d) for d in kernel_shape)
    return (k_h, k_w, 1, channels * multiplier)


def depthwise_geometry(input_shape, kernel_shape, strides, padding, dilations):
    return conv_geometry(input_shape, depthwise_filter(kernel_shape), strides, dilations, padding,
                         groups=int(kernel_shape[2]))


def depthwise_product(arithmetic: Kernel, x, kernel, strides, padding, dilations, quant=None):
    """numpy: the depthwise convolution of NHWC `x` by the Keras kernel (h, w, in, multiplier)
    through the arithmetic, with scheme `quant` (the op's forward, and a layer's numpy_product)."""
    geometry = depthwise_geometry(x.shape, kernel.shape, strides, padding, dilations)
    return bind_scheme(arithmetic, quant).conv2d(x, kernel.reshape(depthwise_filter(kernel.shape)),
                                                 geometry)


@tf.autograph.experimental.do_not_convert
def swapped_depthwise_conv2d(x, kernel, arithmetic: Kernel, strides=(1, 1), padding="valid",
                             dilations=(1, 1), backward: str = "native", quant=None,
                             activation_range=None, gain=None, shift=None, relu=False):
    """NHWC depthwise convolution (Keras kernel (h, w, in, multiplier)) through the arithmetic;
    `quant`, `activation_range`, `gain`, `shift`, `relu` as for ops.swapped_conv2d (a layer's
    static range and output correction)."""
    configure_threads(arithmetic)
    strides = tuple(int(s) for s in strides)
    dilations = tuple(int(d) for d in dilations)
    kernel_shape = tuple(int(d) for d in kernel.shape)
    static = _static(x.shape, "DepthwiseConv2D")
    g_static = depthwise_geometry((1, *static[1:]), kernel_shape, strides, padding, dilations)
    out_static = [static[0], g_static.out_height, g_static.out_width, g_static.out_channels]
    hwio = depthwise_filter(kernel_shape)
    backward_kernel = gradient_kernel(arithmetic, quant)

    def geometry_of(x_array):
        return depthwise_geometry(x_array.shape, kernel_shape, strides, padding, dilations)

    def forward_np(x_array, w_array, quant=None):
        return depthwise_product(arithmetic, x_array, w_array, strides, padding, dilations, quant)

    def kernel_grads_np(x_array, w_array, dy_array):
        dx, dw = native.conv_gradients_via_matmul(x_array, w_array.reshape(hwio), dy_array,
                                                  geometry_of(x_array), backward_kernel.matmul)
        return dx, dw.reshape(kernel_shape)

    def stock(inputs, weights):
        if strides[0] != strides[1]:
            return portable_depthwise_conv(inputs, weights, strides, padding, dilations)
        return keras.ops.depthwise_conv(inputs, weights, strides=strides, padding=padding,
                                        data_format="channels_last", dilation_rate=dilations)

    forward_tf = kernel_grads_tf = None
    if xla.use_device_path(arithmetic, x):  # inside XLA / on an accelerator (swap/xla.py)
        def forward_tf(inputs, weights, current_range, g, s):
            return xla.device_conv2d(arithmetic, inputs, tf.reshape(weights, hwio), g_static,
                                     quant, current_range, g, s, relu)

        def kernel_grads_tf(inputs, weights, dy):
            return xla.device_depthwise_gradients(backward_kernel, inputs, weights, dy, g_static)
    elif forward_op.supports(arithmetic, "conv2d"):
        def forward_tf(inputs, weights, current_range, g, s):
            return forward_op.conv2d(arithmetic, inputs, tf.reshape(weights, hwio), g_static,
                                     g, s, relu, quant, current_range)

    return _kernel_op("depthwise_conv2d", forward_np, stock, kernel_grads_np, out_static,
                      backward, x, kernel, forward_tf, quant, activation_range, gain, shift, relu,
                      kernel_grads_tf)


# --------------------------------------------------------------------------------------------
# transposed convolution
# --------------------------------------------------------------------------------------------

def transposed_product(arithmetic: Kernel, x, kernel, strides, padding, output_padding,
                       dilations, quant=None):
    """numpy: the transposed convolution of NHWC `x` by the Keras kernel (h, w, filters, in)
    through the arithmetic, with scheme `quant` - the stride-1 conv2d of the zero-inserted input
    with the flipped filter (the op's forward, and a layer's numpy_product)."""
    plan = transposed_conv(x.shape, kernel.shape, strides, padding, output_padding, dilations)
    return bind_scheme(arithmetic, quant).conv2d(native.insert_zeros(x, plan),
                                                 native.flipped_filter(kernel), plan.geometry)


def portable_conv_transpose(inputs, weights, output_hwc, strides, padding, dilations):
    """tf: keras.ops.conv_transpose(inputs, weights, strides, padding, dilation_rate=dilations)
    of NHWC inputs (Keras kernel (h, w, filters, in)) to an output of spatial shape and channels
    `output_hwc`, through ops every TensorFlow CPU build has (Conv2DBackpropInput refuses
    dilations > 1 without oneDNN).  A transposed convolution is the input-gradient of the
    forward convolution from its output to its input, with the same kernel as HWIO filter: here
    that convolution is the stride-1 dilated VALID tf.nn.convolution (SpaceToBatch) of the
    explicitly padded output, strided (as portable_depthwise_conv), and its vector-Jacobian
    product with `inputs` is taken with a GradientTape - so the gradients of the result (those
    of the convolution's gradients) are the stock op's up to round-off.  Meant for dilations
    > 1 (graphswap calls the stock op otherwise): with dilations 1 tf.nn.convolution is a plain
    Conv2D, whose second-order gradient TensorFlow 2.21 fails to take eagerly (a missing
    data_format attribute); inside tf.function it runs."""
    strides = tuple(int(s) for s in strides)
    dilations = tuple(int(d) for d in dilations)
    output_hwc = [int(d) for d in output_hwc]
    geometry = conv_geometry((1, *output_hwc), weights.shape, strides, dilations, padding)
    expected = [geometry.out_height, geometry.out_width, geometry.out_channels]
    if expected != _static(inputs.shape, "Conv2DTranspose")[1:]:
        raise UnsupportedLayerError(
            f"transposed convolution to {tuple(output_hwc)}: its forward convolution gives "
            f"{tuple(expected)}, not the input's {tuple(inputs.shape[1:])}")
    output = tf.zeros(tf.concat([tf.shape(inputs)[:1], output_hwc], 0), inputs.dtype)
    with tf.GradientTape() as tape:
        tape.watch(output)
        forward = _strided_valid(geometry, strides, output, lambda padded: tf.nn.convolution(
            padded, weights, strides=1, padding="VALID", dilations=dilations))
    return tape.gradient(forward, output, output_gradients=inputs)


@tf.autograph.experimental.do_not_convert
def swapped_conv2d_transpose(x, kernel, arithmetic: Kernel, strides=(1, 1), padding="valid",
                             output_padding=None, dilations=(1, 1), backward: str = "native",
                             quant=None, activation_range=None, gain=None, shift=None,
                             relu=False):
    """NHWC transposed convolution (Keras kernel (h, w, filters, in)) through the arithmetic;
    `quant`, `activation_range`, `gain`, `shift`, `relu` as for swapped_depthwise_conv2d (the
    inserted zeros are inside any range: ranges always contain 0)."""
    configure_threads(arithmetic)
    strides = tuple(int(s) for s in strides)
    dilations = tuple(int(d) for d in dilations)
    output_padding = None if output_padding is None else tuple(int(p) for p in output_padding)
    kernel_shape = tuple(int(d) for d in kernel.shape)
    static = _static(x.shape, "Conv2DTranspose")

    def plan_of(shape):
        return transposed_conv(shape, kernel_shape, strides, padding, output_padding, dilations)

    out_static = [static[0], *plan_of((1, *static[1:])).output_shape[1:]]
    backward_kernel = gradient_kernel(arithmetic, quant)

    def forward_np(x_array, w_array, quant=None):
        return transposed_product(arithmetic, x_array, w_array, strides, padding, output_padding,
                                  dilations, quant)

    def kernel_grads_np(x_array, w_array, dy_array):
        plan = plan_of(x_array.shape)
        dz, dw = native.conv_gradients_via_matmul(native.insert_zeros(x_array, plan),
                                                  native.flipped_filter(w_array), dy_array,
                                                  plan.geometry, backward_kernel.matmul)
        return (native.remove_zeros(dz, plan, x_array.shape), native.unflipped_filter(dw))

    def stock(inputs, weights):
        if max(dilations) > 1:
            return portable_conv_transpose(inputs, weights, out_static[1:], strides, padding,
                                           dilations)
        return keras.ops.conv_transpose(inputs, weights, strides=strides, padding=padding,
                                        output_padding=output_padding,
                                        data_format="channels_last", dilation_rate=dilations)

    forward_tf = None
    if forward_op.supports(arithmetic, "conv2d"):
        forward_tf = transposed_forward(arithmetic, quant, plan_of((1, *static[1:])),
                                         subpixel_plan((1, *static[1:]), kernel_shape, strides,
                                                       padding, output_padding, dilations),
                                         relu)
    kernel_grads_tf = None
    if xla.use_device_path(arithmetic, x):  # inside XLA / on an accelerator (swap/xla.py)
        device_plan = plan_of((1, *static[1:]))

        def forward_tf(inputs, weights, current_range, g, s):
            y = xla.device_conv2d_transpose(arithmetic, inputs, weights, device_plan, quant,
                                            current_range, g, s)
            return tf.nn.relu(y) if relu else y

        def kernel_grads_tf(inputs, weights, dy):
            return xla.device_conv2d_transpose_gradients(backward_kernel, inputs, weights, dy,
                                                         device_plan)
    return _kernel_op("conv2d_transpose", forward_np, stock, kernel_grads_np, out_static,
                      backward, x, kernel, forward_tf, quant, activation_range, gain, shift,
                      relu, kernel_grads_tf)


# --------------------------------------------------------------------------------------------
# einsum
# --------------------------------------------------------------------------------------------

def einsum_product(arithmetic: Kernel, plan, x, kernel, quant=None):
    """numpy: the (m, n) product matrix of an einsum through the arithmetic, with scheme
    `quant` - its columns are the layer's output channels (a layer's numpy_product)."""
    x2, w2 = plan.to_matrices(x, kernel)
    return bind_scheme(arithmetic, quant).matmul(x2, w2)


def einsum_channels(plan, kernel_shape, values):
    """Per product column values (n,) (an output correction) as a tensor that broadcasts over
    the einsum's output: the produced axes in the output's order, 1 for the others."""
    sizes = plan.sizes((), kernel_shape)
    produced = [c for c in plan.output_labels if c in plan.produced]
    grid = tf.reshape(values, [sizes[c] for c in plan.produced])
    grid = tf.transpose(grid, [plan.produced.index(c) for c in produced])
    return tf.reshape(grid, [sizes[c] if c in plan.produced else 1 for c in plan.output_labels])


@tf.autograph.experimental.do_not_convert
def swapped_einsum(equation: str, x, kernel, arithmetic: Kernel, backward: str = "native",
                   quant=None, activation_range=None):
    """keras.ops.einsum(equation, x, kernel) with its one matmul through the arithmetic;
    `quant`, `activation_range` as for swapped_depthwise_conv2d (a layer's static range)."""
    configure_threads(arithmetic)
    plan = einsum_plan(equation, x.shape.rank)
    kernel_shape = tuple(int(d) for d in kernel.shape)
    out_static = plan.output_shape(list(x.shape), kernel_shape)
    backward_kernel = gradient_kernel(arithmetic, quant)

    def forward_np(x_array, w_array, quant=None):
        return plan.from_product(einsum_product(arithmetic, plan, x_array, w_array, quant),
                                 x_array.shape, w_array.shape)

    def kernel_grads_np(x_array, w_array, dy_array):
        x2, w2 = plan.to_matrices(x_array, w_array)
        dy2 = plan.product_of_output(dy_array)
        dx2 = backward_kernel.matmul(dy2, np.ascontiguousarray(w2.T))
        dw2 = backward_kernel.matmul(np.ascontiguousarray(x2.T), dy2)
        return (plan.input_of_matrix(dx2, x_array.shape),
                plan.kernel_of_matrix(dw2, w_array.shape))

    def stock(inputs, weights):
        return keras.ops.einsum(equation, inputs, weights)

    forward_tf = kernel_grads_tf = None
    if xla.use_device_path(arithmetic, x):  # inside XLA / on an accelerator (swap/xla.py)
        def forward_tf(inputs, weights, current_range, g, s):
            return xla.device_einsum(arithmetic, plan, inputs, weights, quant, current_range)

        def kernel_grads_tf(inputs, weights, dy):
            return xla.device_einsum_gradients(backward_kernel, plan, inputs, weights, dy)
    return _kernel_op("einsum", forward_np, stock, kernel_grads_np, out_static, backward, x,
                      kernel, forward_tf, quant, activation_range,
                      kernel_grads_tf=kernel_grads_tf)
