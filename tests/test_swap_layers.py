"""SwappedDense / SwappedConv2D against the stock Keras layers: forward and GradientTape gradients."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import assert_close_to_roundoff
from graphswap import SwappedConv2D, SwappedDense
from graphswap.errors import UnsupportedLayerError

RNG = np.random.default_rng(7)


def _pair(stock_cls, swapped_cls, input_shape, *args, **kwargs):
    stock = stock_cls(*args, **kwargs)
    stock.build(input_shape)
    swapped = swapped_cls(*args, **kwargs)
    swapped.build(input_shape)
    swapped.set_weights([RNG.standard_normal(w.shape).astype(np.float32) * 0.3
                         for w in stock.get_weights()])
    stock.set_weights(swapped.get_weights())
    return stock, swapped


def _grads(layer, x, dy):
    x = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * dy)
    grads = tape.gradient(loss, [x, *layer.trainable_weights])
    return y, grads


def _assert_layer_matches(stock, swapped, x):
    y_ref = stock(x)
    dy = RNG.standard_normal(y_ref.shape).astype(np.float32)
    y_ref, g_ref = _grads(stock, x, dy)
    y, g = _grads(swapped, x, dy)
    # the longest sum behind any compared value: the forward's fan-in, or the weight gradient's
    # sum over every output position of the batch
    terms = max(int(np.prod(stock.kernel.shape[:-1])), int(np.prod(y_ref.shape[:-1])),
                int(y_ref.shape[-1]) * int(np.prod(stock.kernel.shape[:-2])))
    assert_close_to_roundoff(y.numpy(), y_ref.numpy(), terms)
    assert len(g) == len(g_ref)
    for a, b in zip(g, g_ref):
        assert_close_to_roundoff(a.numpy(), b.numpy(), terms)


@pytest.mark.parametrize("input_shape,units,activation,use_bias", [
    ((1, 5), 3, None, True),
    ((17, 400), 120, "relu", True),
    ((4, 6, 9), 5, "tanh", False),       # rank-3 input: matmul over the last axis
    ((2, 3, 4, 7), 2, "sigmoid", True),
])
def test_dense_forward_and_gradients_match_keras(input_shape, units, activation, use_bias):
    stock, swapped = _pair(keras.layers.Dense, SwappedDense, input_shape, units,
                           activation=activation, use_bias=use_bias)
    x = RNG.standard_normal(input_shape).astype(np.float32)
    _assert_layer_matches(stock, swapped, x)


@pytest.mark.parametrize("kwargs,input_shape", [
    (dict(filters=6, kernel_size=5), (3, 32, 32, 1)),
    (dict(filters=4, kernel_size=3, strides=2, padding="same"), (1, 9, 9, 3)),
    (dict(filters=5, kernel_size=(3, 2), dilation_rate=(2, 1), padding="same"), (2, 10, 7, 2)),
    (dict(filters=3, kernel_size=1, activation="relu", use_bias=False), (5, 4, 4, 6)),
    (dict(filters=6, kernel_size=3, strides=(1, 3), padding="valid"), (3, 11, 11, 4)),
])
def test_conv2d_forward_and_gradients_match_keras(kwargs, input_shape):
    stock, swapped = _pair(keras.layers.Conv2D, SwappedConv2D, input_shape, **kwargs)
    x = RNG.standard_normal(input_shape).astype(np.float32)
    _assert_layer_matches(stock, swapped, x)


def test_channels_first_conv_matches_keras_forward_and_gradients():
    # TensorFlow's CPU kernels do not run NCHW convolutions, so the reference is the same layer in
    # NHWC applied to the transposed input.
    stock, swapped = _pair(keras.layers.Conv2D, SwappedConv2D, (2, 8, 8, 3), 4, 3, padding="same")
    first = SwappedConv2D(4, 3, padding="same", data_format="channels_first")
    first.build((2, 3, 8, 8))
    first.set_weights(stock.get_weights())
    x = RNG.standard_normal((2, 8, 8, 3)).astype(np.float32)
    x_first = np.transpose(x, (0, 3, 1, 2))
    dy = RNG.standard_normal((2, 8, 8, 4)).astype(np.float32)
    y_ref, g_ref = _grads(stock, x, dy)
    y, g = _grads(first, x_first, np.transpose(dy, (0, 3, 1, 2)))
    assert_close_to_roundoff(np.transpose(y.numpy(), (0, 2, 3, 1)), y_ref.numpy(), 3 * 3 * 3)
    assert_close_to_roundoff(np.transpose(g[0].numpy(), (0, 2, 3, 1)), g_ref[0].numpy(),
                             3 * 3 * 4)
    for a, b in zip(g[1:], g_ref[1:]):  # kernel and bias: sums over the batch and 8x8 positions
        assert_close_to_roundoff(a.numpy(), b.numpy(), 2 * 8 * 8)


def test_grouped_conv_gradients_match_per_group_reference():
    # TensorFlow has no grouped-conv gradient on CPU; the reference is one Conv2D per group.
    swapped = SwappedConv2D(6, 3, groups=3, padding="same")
    swapped.build((2, 7, 7, 6))
    weights = [RNG.standard_normal(w.shape).astype(np.float32) for w in swapped.get_weights()]
    swapped.set_weights(weights)
    x = tf.constant(RNG.standard_normal((2, 7, 7, 6)).astype(np.float32))
    dy = RNG.standard_normal((2, 7, 7, 6)).astype(np.float32)
    y, grads = _grads(swapped, x, dy)
    kernel, bias = (tf.Variable(w) for w in weights)
    with tf.GradientTape() as tape:
        tape.watch(x)
        parts = [tf.nn.conv2d(x[..., 2 * i:2 * i + 2], kernel[..., 2 * i:2 * i + 2], 1, "SAME")
                 for i in range(3)]
        y_ref = tf.concat(parts, axis=-1) + bias
        loss = tf.reduce_sum(y_ref * dy)
    g_ref = tape.gradient(loss, [x, kernel, bias])
    assert_close_to_roundoff(y.numpy(), y_ref.numpy(), 3 * 3 * 2)
    for a, b, terms in zip(grads, g_ref, (3 * 3 * 2, 2 * 7 * 7, 2 * 7 * 7)):  # x, kernel, bias
        assert_close_to_roundoff(a.numpy(), b.numpy(), terms)


def test_works_inside_tf_function_with_unknown_batch():
    layer = SwappedDense(4)
    layer.build((None, 3))

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def forward(x):
        y = layer(x)
        assert y.shape.as_list() == [None, 4]  # static shape set despite numpy_function
        return y

    x = RNG.standard_normal((5, 3)).astype(np.float32)
    kernel, bias = layer.kernel.numpy(), layer.bias.numpy()
    assert_close_to_roundoff(forward(x).numpy(), x.astype(np.float64) @ kernel + bias, terms=4,
                             magnitude=np.abs(x) @ np.abs(kernel) + np.abs(bias))


def test_zero_size_batch():
    conv = SwappedConv2D(2, 3)
    conv.build((None, 5, 5, 1))
    assert conv(np.zeros((0, 5, 5, 1), np.float32)).shape == (0, 3, 3, 2)
    dense = SwappedDense(3)
    dense.build((None, 4))
    assert dense(np.zeros((0, 4), np.float32)).shape == (0, 3)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_other_float_dtypes_are_cast_for_the_kernel_and_back(dtype):
    stock, swapped = _pair(keras.layers.Dense, SwappedDense, (3, 8), 4, dtype=dtype)
    x = tf.cast(RNG.standard_normal((3, 8)), dtype)
    y = swapped(x)
    assert y.dtype == tf.as_dtype(dtype)
    np.testing.assert_allclose(tf.cast(y, tf.float32).numpy(),
                               tf.cast(stock(x), tf.float32).numpy(), rtol=2e-2, atol=2e-2)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.cast(swapped(x), tf.float32))
    grads = tape.gradient(loss, swapped.trainable_weights)
    assert all(g is not None and g.dtype == w.dtype for g, w in
               zip(grads, swapped.trainable_weights))


def test_mixed_precision_policy():
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        conv = SwappedConv2D(3, 3)
        conv.build((1, 6, 6, 2))
        y = conv(tf.ones((1, 6, 6, 2)))
        assert y.dtype == tf.float16 and conv.kernel.dtype == "float32"
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.cast(conv(tf.ones((1, 6, 6, 2))), tf.float32))
        grad = tape.gradient(loss, conv.kernel)
        assert grad.dtype == tf.float32 and np.all(np.isfinite(grad.numpy()))
    finally:
        keras.config.set_dtype_policy(previous)


def test_config_round_trip_keeps_kernel_and_backward():
    layer = SwappedConv2D(4, 3, strides=2, backward="kernel", name="c")
    config = layer.get_config()
    assert config["arithmetic"] == {"spec": "exact"} and config["backward"] == "kernel"
    clone = SwappedConv2D.from_config(config)
    assert clone.get_config() == config


def test_bad_arguments():
    with pytest.raises(ValueError, match="backward must be one of"):
        SwappedDense(3, backward="approximate")
    with pytest.raises(ValueError, match="strides > 1.*dilation_rate > 1|strides=.*dilation_rate"):
        SwappedConv2D(3, 3, strides=2, dilation_rate=2)
    with pytest.raises(Exception, match="unknown kernel 'nope'"):
        SwappedDense(3, swap_kernel="nope")
    assert issubclass(UnsupportedLayerError, ValueError)
