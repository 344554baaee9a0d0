"""SwappedDepthwiseConv2D / SwappedSeparableConv2D / SwappedConv1D / SwappedConv2DTranspose against
the stock Keras layers: forward (exact kernel) and every weight's gradient in both backward modes
over a grid of options; LUT versions bit-exact against the independent numpy reference of the
quantized pipeline; refusals at construction time naming the layer and option.

Where this TensorFlow build refuses the stock op (DepthwiseConv2dNative with unequal strides,
Conv2DBackpropInput with dilations > 1: CPU builds without oneDNN, probed once by
conftest.tensorflow_runs_on_cpu), the reference is the same layer computed in float64 numpy
(forward and vector-Jacobian product, `float64_op`) - checked against TensorFlow's op by
test_float64_references_match_tensorflow - so the comparison runs on every machine."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import reference
from conftest import assert_close_to_roundoff, tensorflow_runs_on_cpu
from graphswap import (SwappedConv1D, SwappedConv2DTranspose, SwappedDepthwiseConv2D,
                       SwappedSeparableConv2D)
from graphswap.errors import UnsupportedLayerError
from graphswap.kernels import resolve_multiplier
from graphswap.native import conv_geometry

RNG = np.random.default_rng(11)


def make_pair(stock_cls, swapped_cls, input_shape, *args, arithmetic="exact", backward="native",
              **kwargs):
    stock = stock_cls(*args, **kwargs)
    stock.build(input_shape)
    swapped = swapped_cls(*args, arithmetic=arithmetic, backward=backward, **kwargs)
    swapped.build(input_shape)
    weights = [RNG.standard_normal(w.shape).astype(np.float32) * 0.3 for w in stock.get_weights()]
    stock.set_weights(weights)
    swapped.set_weights(weights)
    return stock, swapped


def outputs_and_gradients(layer, x, dy):
    x = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x)
        loss = tf.reduce_sum(y * dy)
    return y, tape.gradient(loss, [x, *layer.trainable_weights])


# ------------------------------------------------------------------ float64 reference

def _axis(size, kernel, stride, dilation, padding):
    """TensorFlow's SAME/VALID rule on one spatial axis: (output size, padding before)."""
    effective = (kernel - 1) * dilation + 1
    if padding == "valid":
        return (size - effective) // stride + 1, 0
    out = -(-size // stride)
    return out, max((out - 1) * stride + effective - size, 0) // 2


def _taps(in_hw, kernel_hw, strides, dilations, padding):
    """The output size, the padding before, the padded input's size and, per kernel tap
    (i, j), the padded input's rows and columns it reads for every output position."""
    (oh, top), (ow, left) = (_axis(n, k, s, d, padding)
                             for n, k, s, d in zip(in_hw, kernel_hw, strides, dilations))
    padded = tuple(max(before + n, (o - 1) * s + (k - 1) * d + 1)
                   for before, n, o, k, s, d in zip((top, left), in_hw, (oh, ow), kernel_hw,
                                                     strides, dilations))
    taps = [(i, j, slice(i * dilations[0], i * dilations[0] + (oh - 1) * strides[0] + 1,
                         strides[0]),
             slice(j * dilations[1], j * dilations[1] + (ow - 1) * strides[1] + 1, strides[1]))
            for i in range(kernel_hw[0]) for j in range(kernel_hw[1])]
    return (oh, ow), (top, left), padded, taps


def depthwise64(x, w, dy=None, *, strides, padding, dilations):
    """float64: the depthwise convolution of NHWC `x` by the Keras kernel (h, w, in, multiplier)
    (output channel c * multiplier + m), or with `dy` its vector-Jacobian product (dx, dw)."""
    n, h, wd, c = x.shape
    (oh, ow), (top, left), (ph, pw), taps = _taps((h, wd), w.shape[:2], strides, dilations,
                                                  padding)
    xp = np.zeros((n, ph, pw, c))
    xp[:, top:top + h, left:left + wd] = x
    if dy is None:
        y = sum(xp[:, rs, cs, :, None] * w[i, j] for i, j, rs, cs in taps)
        return y.reshape(n, oh, ow, -1)
    dy = dy.reshape(n, oh, ow, c, -1)
    dxp, dw = np.zeros_like(xp), np.zeros_like(w)
    for i, j, rs, cs in taps:
        dxp[:, rs, cs] += (dy * w[i, j]).sum(-1)
        dw[i, j] = np.einsum("nhwc,nhwcm->cm", xp[:, rs, cs], dy)
    return dxp[:, top:top + h, left:left + wd], dw


def conv_transpose64(x, k, dy=None, *, out_hw, strides, padding, dilations):
    """float64: the transposed convolution of NHWC `x` by the Keras kernel (h, w, filters, in)
    to spatial size `out_hw` - the adjoint of the forward convolution out_hw -> x's size with
    that kernel as HWIO filter - or with `dy` its vector-Jacobian product (dx, dk)."""
    n, h, wd, _ = x.shape
    (ih, iw), (top, left), (ph, pw), taps = _taps(out_hw, k.shape[:2], strides, dilations,
                                                  padding)
    assert (ih, iw) == (h, wd)
    if dy is None:
        yp = np.zeros((n, ph, pw, k.shape[2]))
        for i, j, rs, cs in taps:
            yp[:, rs, cs] += np.einsum("nhwc,fc->nhwf", x, k[i, j])
        return yp[:, top:top + out_hw[0], left:left + out_hw[1]]
    dyp = np.zeros((n, ph, pw, k.shape[2]))
    dyp[:, top:top + out_hw[0], left:left + out_hw[1]] = dy
    dk = np.zeros_like(k)
    dx = sum(np.einsum("nhwf,fc->nhwc", dyp[:, rs, cs], k[i, j]) for i, j, rs, cs in taps)
    for i, j, rs, cs in taps:
        dk[i, j] = np.einsum("nhwc,nhwf->fc", x, dyp[:, rs, cs])
    return dx, dk


def float64_op(function, **options):
    """A TensorFlow op of (x, w): `function(x, w, **options)` in float64, its gradient
    `function(x, w, dy, **options)` - no TensorFlow kernel involved."""
    def run(*arrays):
        result = function(*(a.astype(np.float64) for a in arrays), **options)
        return [r.astype(np.float32) for r in result] if len(arrays) == 3 else \
            result.astype(np.float32)

    @tf.custom_gradient
    def op(x, w):
        def grad(dy):
            return tf.numpy_function(run, [x, w, dy], [tf.float32, tf.float32])
        return tf.numpy_function(run, [x, w], tf.float32), grad
    return lambda x, w: op(tf.convert_to_tensor(x), tf.convert_to_tensor(w))


def reference_outputs_and_gradients(stock, product, x, dy):
    """outputs_and_gradients of the stock layer with its convolution replaced by
    `product(x, layer)` (the bias and activation as the layer applies them)."""
    x = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = product(x, stock)
        if stock.use_bias:
            y = y + stock.bias
        y = stock.activation(y)
        loss = tf.reduce_sum(y * dy)
    return y, tape.gradient(loss, [x, *stock.trainable_weights])


def reference_product(stock):
    """None where this build runs the stock layer's op; otherwise its float64 product
    (x, layer) -> the convolution before bias and activation."""
    if not isinstance(stock, (keras.layers.DepthwiseConv2D, keras.layers.SeparableConv2D,
                              keras.layers.Conv2DTranspose)):
        return None   # the other layers' ops (EinsumDense's included) run on every build
    options = dict(strides=tuple(stock.strides), padding=stock.padding,
                   dilations=tuple(stock.dilation_rate))
    if isinstance(stock, (keras.layers.DepthwiseConv2D, keras.layers.SeparableConv2D)):
        if options["strides"][0] == options["strides"][1] or \
                tensorflow_runs_on_cpu("unequal-stride depthwise"):
            return None
        depthwise = float64_op(depthwise64, **options)
        if isinstance(stock, keras.layers.DepthwiseConv2D):
            return lambda x, layer: depthwise(x, layer.kernel)
        return lambda x, layer: tf.nn.conv2d(depthwise(x, layer.depthwise_kernel),
                                             layer.pointwise_kernel, 1, "VALID")
    if isinstance(stock, keras.layers.Conv2DTranspose):
        if max(options["dilations"]) == 1 or tensorflow_runs_on_cpu("dilated conv_transpose"):
            return None
        return lambda x, layer: float64_op(
            conv_transpose64, out_hw=tuple(layer.compute_output_shape(x.shape)[1:3]),
            **options)(x, layer.kernel)
    return None


@pytest.mark.parametrize("kind,padding,strides,dilations,output_padding", [
    ("depthwise", "valid", (2, 2), (1, 1), None), ("depthwise", "same", (1, 1), (2, 3), None),
    ("depthwise", "same", (2, 1), (1, 1), None), ("depthwise", "valid", (1, 3), (1, 1), None),
    ("transpose", "same", (2, 2), (1, 1), None), ("transpose", "valid", (3, 2), (1, 1), (2, 1)),
    ("transpose", "same", (1, 1), (2, 2), None), ("transpose", "valid", (1, 1), (2, 1), None),
])
def test_float64_references_match_tensorflow(kind, padding, strides, dilations, output_padding):
    """The float64 references against TensorFlow's op - forward and both gradients - or, for
    the geometries this build refuses, against graphswap's portable formulation of it (pad,
    stride-1 dilated convolution, strided slice; its VJP for the transposed one): two
    independent computations of the same function."""
    from graphswap.swap.ops_layers import portable_conv_transpose, portable_depthwise_conv

    x = RNG.standard_normal((2, 7, 8, 3)).astype(np.float32)
    options = dict(strides=strides, padding=padding, dilations=dilations)
    if kind == "depthwise":
        w = RNG.standard_normal((3, 2, 3, 2)).astype(np.float32)
        reference = float64_op(depthwise64, **options)
        if strides[0] == strides[1] or tensorflow_runs_on_cpu("unequal-stride depthwise"):
            def tensorflow(a, b):
                return keras.ops.depthwise_conv(a, b, strides, padding, dilation_rate=dilations)
        else:
            def tensorflow(a, b):
                return portable_depthwise_conv(a, b, strides, padding, dilations)
    else:
        w = RNG.standard_normal((3, 2, 4, 3)).astype(np.float32)
        out_shape = keras.layers.Conv2DTranspose(
            4, (3, 2), strides, padding, output_padding=output_padding,
            dilation_rate=dilations).compute_output_shape(x.shape)
        reference = float64_op(conv_transpose64, out_hw=out_shape[1:3], **options)
        if max(dilations) == 1 or tensorflow_runs_on_cpu("dilated conv_transpose"):
            def tensorflow(a, b):
                return keras.ops.conv_transpose(a, b, strides, padding, output_padding,
                                                dilation_rate=dilations)
        else:
            def tensorflow(a, b):
                return portable_conv_transpose(a, b, out_shape[1:], strides, padding, dilations)
    results = []
    for op in (reference, tensorflow):
        a, b = tf.constant(x), tf.constant(w)
        with tf.GradientTape() as tape:
            tape.watch([a, b])
            y = op(a, b)
        dy = np.cos(np.arange(np.prod(y.shape))).reshape(y.shape).astype(np.float32)
        results.append([y, *tape.gradient(y, [a, b], output_gradients=tf.constant(dy))])
    assert results[0][0].shape == results[1][0].shape
    for got, want in zip(*results):
        assert_close_to_roundoff(got.numpy(), want.numpy(), int(np.prod(y.shape)))
        assert np.abs(want.numpy()).max() > 1.0   # a wrong tap is of the order of the values


def assert_matches_stock(stock, swapped, x):
    """Forward and the gradients of the input and every weight, to float32 round-off of the
    longest sum behind any compared value (bounded by the element counts involved); against
    the float64 reference where this build refuses the stock layer's op."""
    product = reference_product(stock)
    # the stock layer's own output shape where its op runs (EinsumDense's compute_output_shape
    # is its built shape, not this input's), Keras' shape rule where it cannot run here
    shape = stock(x).shape if product is None else stock.compute_output_shape(x.shape)
    dy = RNG.standard_normal(shape).astype(np.float32)
    if product is None:
        y_ref, g_ref = outputs_and_gradients(stock, x, dy)
    else:
        y_ref, g_ref = reference_outputs_and_gradients(stock, product, x, dy)
    y, g = outputs_and_gradients(swapped, x, dy)
    weights = max(int(np.prod(w.shape)) for w in stock.get_weights())
    terms = max(weights, int(np.prod(y_ref.shape)), int(np.prod(x.shape)))
    assert_close_to_roundoff(y.numpy(), y_ref.numpy(), terms)
    assert len(g) == len(g_ref) == 1 + len(stock.trainable_weights)
    for a, b in zip(g, g_ref):
        assert_close_to_roundoff(a.numpy(), b.numpy(), terms)


@pytest.mark.parametrize("backward", ["native", "kernel"])
@pytest.mark.parametrize("kwargs,input_shape", [
    (dict(kernel_size=3), (1, 7, 7, 3)),
    (dict(kernel_size=3, strides=2, padding="same", depth_multiplier=2), (2, 9, 9, 4)),
    (dict(kernel_size=(3, 2), strides=(2, 1), padding="valid"), (3, 10, 7, 2)),  # MobileNetV2
    (dict(kernel_size=3, dilation_rate=2, padding="same", activation="relu"), (2, 11, 11, 3)),
    (dict(kernel_size=5, strides=2, dilation_rate=2, padding="same", use_bias=False),
     (1, 13, 13, 2)),
])
def test_depthwise_matches_keras(kwargs, input_shape, backward):
    stock, swapped = make_pair(keras.layers.DepthwiseConv2D, SwappedDepthwiseConv2D, input_shape,
                               backward=backward, **kwargs)
    assert_matches_stock(stock, swapped, RNG.standard_normal(input_shape).astype(np.float32))


@pytest.mark.parametrize("backward", ["native", "kernel"])
@pytest.mark.parametrize("kwargs,input_shape", [
    (dict(filters=5, kernel_size=3), (1, 8, 8, 3)),
    (dict(filters=4, kernel_size=3, strides=2, padding="same", depth_multiplier=3),
     (2, 9, 9, 2)),
    (dict(filters=6, kernel_size=3, dilation_rate=2, padding="same", activation="tanh"),
     (2, 10, 9, 4)),
    # a plain ReLU runs in the pointwise op's epilogue (its gradient: ReluGrad on the output)
    (dict(filters=4, kernel_size=3, padding="same", activation="relu",
          bias_initializer="random_normal"), (2, 6, 6, 3)),
    # unequal strides: the depthwise step some CPU builds refuse (ops_layers, portable)
    (dict(filters=3, kernel_size=(2, 3), strides=(1, 2), padding="same"), (2, 7, 9, 2)),
])
def test_separable_matches_keras(kwargs, input_shape, backward):
    stock, swapped = make_pair(keras.layers.SeparableConv2D, SwappedSeparableConv2D, input_shape,
                               backward=backward, **kwargs)
    assert_matches_stock(stock, swapped, RNG.standard_normal(input_shape).astype(np.float32))


@pytest.mark.parametrize("backward", ["native", "kernel"])
@pytest.mark.parametrize("kwargs,input_shape", [
    (dict(filters=4, kernel_size=3), (1, 9, 2)),
    (dict(filters=6, kernel_size=3, padding="causal", dilation_rate=2), (2, 11, 4)),
    (dict(filters=4, kernel_size=5, strides=2, padding="same", groups=2), (3, 13, 4)),
    (dict(filters=3, kernel_size=1, activation="relu"), (2, 5, 7)),
    (dict(filters=5, kernel_size=4, padding="causal", strides=3), (1, 17, 3)),
])
def test_conv1d_matches_keras(kwargs, input_shape, backward):
    stock, swapped = make_pair(keras.layers.Conv1D, SwappedConv1D, input_shape,
                               backward=backward, **kwargs)
    assert_matches_stock(stock, swapped, RNG.standard_normal(input_shape).astype(np.float32))


@pytest.mark.parametrize("backward", ["native", "kernel"])
@pytest.mark.parametrize("kwargs,input_shape", [
    (dict(filters=3, kernel_size=3), (1, 5, 5, 2)),
    (dict(filters=4, kernel_size=3, strides=2, padding="same"), (2, 5, 6, 3)),
    (dict(filters=4, kernel_size=3, strides=2, padding="same", activation="relu"),
     (2, 5, 6, 3)),   # the ReLU in the op's epilogue
    (dict(filters=2, kernel_size=4, strides=2, padding="same"), (1, 4, 4, 3)),   # even kernel
    (dict(filters=3, kernel_size=3, strides=3, padding="valid", output_padding=2),
     (2, 4, 3, 2)),
    (dict(filters=3, kernel_size=(3, 2), strides=(2, 1), padding="valid", output_padding=(1, 0)),
     (1, 5, 5, 2)),
    (dict(filters=4, kernel_size=3, dilation_rate=2, padding="same", activation="relu"),
     (2, 6, 6, 3)),
    (dict(filters=2, kernel_size=2, strides=2, use_bias=False), (3, 3, 3, 1)),
])
def test_conv2d_transpose_matches_keras(kwargs, input_shape, backward):
    stock, swapped = make_pair(keras.layers.Conv2DTranspose, SwappedConv2DTranspose, input_shape,
                               backward=backward, **kwargs)
    assert_matches_stock(stock, swapped, RNG.standard_normal(input_shape).astype(np.float32))


@pytest.mark.parametrize("stock_cls,swapped_cls,args,nhwc_shape", [
    (keras.layers.DepthwiseConv2D, SwappedDepthwiseConv2D, (3,), (2, 7, 7, 3)),
    (keras.layers.SeparableConv2D, SwappedSeparableConv2D, (4, 3), (2, 7, 7, 3)),
    (keras.layers.Conv2DTranspose, SwappedConv2DTranspose, (4, 3), (2, 5, 5, 3)),
])
def test_channels_first(stock_cls, swapped_cls, args, nhwc_shape):
    # the reference is the NHWC stock layer on the transposed input (CPUs may not run NCHW)
    stock, _ = make_pair(stock_cls, swapped_cls, nhwc_shape, *args, strides=2, padding="same")
    first = swapped_cls(*args, strides=2, padding="same", data_format="channels_first")
    first.build((nhwc_shape[0], nhwc_shape[3], *nhwc_shape[1:3]))
    first.set_weights(stock.get_weights())
    x = RNG.standard_normal(nhwc_shape).astype(np.float32)
    y_ref = stock(x)
    dy = RNG.standard_normal(y_ref.shape).astype(np.float32)
    y_ref, g_ref = outputs_and_gradients(stock, x, dy)
    y, g = outputs_and_gradients(first, np.transpose(x, (0, 3, 1, 2)),
                                 np.transpose(dy, (0, 3, 1, 2)))
    terms = int(np.prod(y_ref.shape))
    assert_close_to_roundoff(np.transpose(y.numpy(), (0, 2, 3, 1)), y_ref.numpy(), terms)
    assert_close_to_roundoff(np.transpose(g[0].numpy(), (0, 2, 3, 1)), g_ref[0].numpy(), terms)
    for a, b in zip(g[1:], g_ref[1:]):
        assert_close_to_roundoff(a.numpy(), b.numpy(), terms)


def test_conv1d_channels_first():
    stock, _ = make_pair(keras.layers.Conv1D, SwappedConv1D, (2, 9, 3), 4, 3, padding="causal")
    first = SwappedConv1D(4, 3, padding="causal", data_format="channels_first")
    first.build((2, 3, 9))
    first.set_weights(stock.get_weights())
    x = RNG.standard_normal((2, 9, 3)).astype(np.float32)
    assert_close_to_roundoff(np.transpose(first(np.transpose(x, (0, 2, 1))).numpy(), (0, 2, 1)),
                             stock(x).numpy(), 9)


# ------------------------------------------------------------------------------ LUT kernels

def activations(shape):
    return (RNG.standard_normal(shape) * 0.8).astype(np.float32)


def reference_conv(x, w_hwio, mult, strides, dilations, padding, groups):
    g = conv_geometry(x.shape, w_hwio.shape, strides, dilations, padding, groups)
    return reference.quantized_conv2d(x, w_hwio, mult.table, mult.signed, strides, dilations,
                                      (g.pad_top, g.pad_bottom, g.pad_left, g.pad_right), groups)


@pytest.mark.parametrize("name", ["mul8s_drum4", "mul8u_drum4"])
def test_depthwise_lut_is_the_grouped_quantized_conv(name):
    mult = resolve_multiplier(name)
    layer = SwappedDepthwiseConv2D(3, strides=2, padding="same", depth_multiplier=2,
                                   use_bias=False, arithmetic=name)
    x = activations((2, 7, 7, 3))
    layer.build(x.shape)
    w = layer.kernel.numpy()
    # Keras' (h, w, in, multiplier) kernel is the grouped HWIO filter (h, w, 1, in * multiplier),
    # output channel c * multiplier + m; signed multipliers scale each of those 6 channels apart
    hwio = w.reshape(3, 3, 1, 6)
    np.testing.assert_array_equal(hwio[..., 0, 3], w[..., 1, 1])
    want = reference_conv(x, hwio, mult, (2, 2), (1, 1), "same", groups=3)
    np.testing.assert_array_equal(layer(x).numpy(), want)


@pytest.mark.parametrize("name", ["mul8s_drum4", "mul8u_drum4"])
def test_separable_lut_is_two_quantized_convs(name):
    mult = resolve_multiplier(name)
    layer = SwappedSeparableConv2D(4, 3, padding="same", use_bias=False, arithmetic=name)
    x = activations((1, 6, 6, 2))
    layer.build(x.shape)
    depthwise = reference_conv(x, layer.depthwise_kernel.numpy().reshape(3, 3, 1, 2), mult,
                               (1, 1), (1, 1), "same", groups=2)
    want = reference_conv(depthwise, layer.pointwise_kernel.numpy(), mult, (1, 1), (1, 1),
                          "valid", groups=1)
    np.testing.assert_array_equal(layer(x).numpy(), want)


@pytest.mark.parametrize("name", ["mul8s_drum4", "mul8u_drum4"])
def test_conv1d_lut_is_a_height_one_quantized_conv(name):
    mult = resolve_multiplier(name)
    layer = SwappedConv1D(4, 3, padding="causal", dilation_rate=2, use_bias=False,
                          arithmetic=name)
    x = activations((2, 9, 3))
    layer.build(x.shape)
    padded = np.pad(x, ((0, 0), (4, 0), (0, 0)))  # causal: dilation * (kernel - 1) on the left
    want = reference_conv(padded[:, None], layer.kernel.numpy()[None], mult, (1, 1), (1, 2),
                          "valid", 1)[:, 0]
    np.testing.assert_array_equal(layer(x).numpy(), want)


@pytest.mark.parametrize("name", ["mul8s_drum4", "mul8u_drum4"])
def test_conv2d_transpose_lut_is_the_quantized_conv_of_the_zero_inserted_input(name):
    mult = resolve_multiplier(name)
    layer = SwappedConv2DTranspose(3, 3, strides=2, padding="same", use_bias=False,
                                   arithmetic=name)
    x = activations((2, 4, 5, 2))
    layer.build(x.shape)
    # stride 2: one zero between samples; output 8 x 10; TF's SAME padding of the forward conv
    # 8 -> 4 is 1 in total, 0 before; so the stride-1 conv pads 3 - 1 - 0 = 2 before and
    # completes the 8 rows after: 8 + 2 - 2 - 7 = 1
    z = np.zeros((2, 7, 9, 2), np.float32)
    z[:, ::2, ::2] = x
    flipped = np.transpose(layer.kernel.numpy()[::-1, ::-1], (0, 1, 3, 2))
    want = reference.quantized_conv2d(z, flipped, mult.table, mult.signed, (1, 1), (1, 1),
                                      (2, 1, 2, 1), 1)
    got = layer(x).numpy()
    assert got.shape == (2, 8, 10, 3)
    np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------------------ refusals

def test_options_that_cannot_be_mirrored_are_refused_naming_layer_and_option():
    for layer, what in ((SwappedDepthwiseConv2D(3), "DepthwiseConv2D"),
                        (SwappedConv2DTranspose(2, 3), "Conv2DTranspose")):
        layer.build((None, 5, 5, 3))
        traced = tf.function(layer.call, input_signature=[tf.TensorSpec((None, None, 5, 3))],
                             autograph=False)
        with pytest.raises(UnsupportedLayerError, match=f"{what} needs a static input shape"):
            traced.get_concrete_function()
    with pytest.raises(UnsupportedLayerError, match="backward must be one of"):
        SwappedDepthwiseConv2D(3, backward="approximate")


def test_config_round_trip_keeps_arithmetic_and_backward():
    for layer in (SwappedDepthwiseConv2D(3, depth_multiplier=2, backward="kernel", name="d"),
                  SwappedSeparableConv2D(4, 3, arithmetic="mul8s_drum4", name="s"),
                  SwappedConv1D(4, 3, padding="causal", name="c"),
                  SwappedConv2DTranspose(4, 3, strides=2, output_padding=1, name="t")):
        config = layer.get_config()
        assert config["arithmetic"]["spec"] in ("exact", "mul8s_drum4")
        clone = type(layer).from_config(config)
        assert clone.get_config() == config
        assert clone.arithmetic.spec == layer.arithmetic.spec and clone.backward == layer.backward
