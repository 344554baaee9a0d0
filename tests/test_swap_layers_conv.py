"""SwappedDepthwiseConv2D / SwappedSeparableConv2D / SwappedConv1D / SwappedConv2DTranspose against
the stock Keras layers: forward (exact kernel) and every weight's gradient in both backward modes
over a grid of options; LUT versions bit-exact against the independent numpy reference of the
quantized pipeline; refusals at construction time naming the layer and option."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import reference
from conftest import assert_close_to_roundoff
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


def assert_matches_stock(stock, swapped, x):
    """Forward and the gradients of the input and every weight, to float32 round-off of the
    longest sum behind any compared value (bounded by the element counts involved)."""
    y_ref = stock(x)
    dy = RNG.standard_normal(y_ref.shape).astype(np.float32)
    y_ref, g_ref = outputs_and_gradients(stock, x, dy)
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
