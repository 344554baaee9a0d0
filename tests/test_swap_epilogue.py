"""The swapped Dense/Conv2D apply their output correction (gain, offset), bias and plain ReLU
inside the op's numpy_function call, in one native pass (graphswap_channel_affine_f32): results and
gradients against the same model written in TensorFlow ops, the native pass against numpy (NaN
kept by the ReLU), its errors."""

import numpy as np
import pytest
import tensorflow as tf
import keras

import graphswap
from conftest import assert_close_to_roundoff
from graphswap import native
from graphswap.errors import GraphswapError


def test_channel_affine_matches_numpy():
    rng = np.random.default_rng(0)
    y = rng.normal(size=(5, 7, 3, 11)).astype(np.float32)
    gain = rng.normal(size=11).astype(np.float32)
    shift = rng.normal(size=11).astype(np.float32)
    lib = native.shipped_library()
    got = lib.channel_affine_(y.copy(), gain, shift)
    np.testing.assert_array_equal(got, y * gain + shift)   # one rounding each, no FMA
    np.testing.assert_array_equal(lib.channel_affine_(y.copy(), None, shift), y + shift)
    np.testing.assert_array_equal(lib.channel_affine_(y.copy(), gain, None), y * gain)
    with_nan = y.copy()
    with_nan[0, 0, 0, :3] = np.nan
    relu = lib.channel_affine_(with_nan.copy(), gain, shift, relu=True)
    np.testing.assert_array_equal(relu, tf.nn.relu(with_nan * gain + shift).numpy())
    assert np.isnan(relu[0, 0, 0, :3]).all() and (relu[1:] >= 0).all() and (relu == 0).any()
    strided = y[:, ::2]                      # not contiguous: worked on a copy
    np.testing.assert_array_equal(lib.channel_affine_(strided, None, shift), strided + shift)
    with pytest.raises(GraphswapError, match="shift has 4 values for 11 output channels"):
        lib.channel_affine_(y.copy(), None, shift[:4])


def _corrected_model(kernel, layer):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((9, 9, 2))
    x = keras.layers.Conv2D(5, 3, padding="same", activation="relu", name="conv")(inputs)
    x = keras.layers.Flatten()(x)
    outputs = keras.layers.Dense(4, name="dense")(x)
    model = keras.Model(inputs, outputs)
    for weights in (model.get_layer("conv"), model.get_layer("dense")):
        kernel_w, bias = weights.get_weights()
        weights.set_weights([kernel_w, np.linspace(-0.5, 0.5, bias.size).astype(np.float32)])
    swapped = graphswap.rewrite_model(model, kernel=kernel)
    target = swapped.get_layer(layer)
    channels = target.bias.shape[0]
    gain = np.linspace(0.8, 1.3, channels).astype(np.float32)
    offset = np.linspace(-0.2, 0.3, channels).astype(np.float32)
    target.set_output_correction(gain=gain, offset=offset)
    return model, swapped, gain, offset


@pytest.mark.parametrize("layer", ["conv", "dense"])
def test_correction_and_bias_in_the_call_match_tensorflow_ops(layer):
    model, swapped, gain, offset = _corrected_model("mul8u_drum4", layer)
    x = tf.constant(np.random.default_rng(2).uniform(0, 1, (6, 9, 9, 2)).astype(np.float32))
    target = swapped.get_layer(layer)
    inner = keras.Model(swapped.inputs, target.input)
    x_in = inner(x).numpy()
    product = target.numpy_product(x_in if layer == "conv" else x_in.reshape(6, -1))
    want = product * gain + offset + target.bias.numpy()
    if layer == "conv":
        want = np.maximum(want, 0)
    with tf.GradientTape() as tape:
        got = target(tf.constant(x_in))
    assert_close_to_roundoff(got.numpy(), want, terms=4)   # same product: two roundings apart
    # backward="native": the straight-through estimator of y = product * gain + offset + bias,
    # i.e. the float layer's gradients with dy scaled by the gain
    upstream = tf.constant(np.random.default_rng(3).normal(size=got.shape).astype(np.float32))
    grads = tape.gradient(got, [target.kernel, target.bias], output_gradients=upstream)
    float_layer = model.get_layer(layer)
    with tf.GradientTape() as ref_tape:
        if layer == "conv":
            pre = tf.nn.conv2d(x_in, float_layer.kernel, 1, "SAME")
        else:
            pre = tf.matmul(x_in.reshape(6, -1), float_layer.kernel)
        y_ref = pre * gain + offset + float_layer.bias
        if layer == "conv":
            # the ReLU mask of the swapped forward (approximate products): same mask here
            y_ref = y_ref * tf.cast(got > 0, tf.float32)
    ref = ref_tape.gradient(y_ref, [float_layer.kernel, float_layer.bias],
                            output_gradients=upstream)
    for g, r in zip(grads, ref):
        assert_close_to_roundoff(g.numpy(), r.numpy(), terms=6 * 81)
        assert np.abs(r.numpy()).max() > 0.1
