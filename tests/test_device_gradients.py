"""The device path's own gradients (graphswap/kernels/device_gradients.py): backward="lut_grad"
for matmul and convolution against the C path's (graphswap/kernels/derivatives.py) within float32
round-off of their sums, col2im as the exact adjoint of the window gather, backward="kernel"
convolution gradients against the C path's, and both inside tf.function(jit_compile=True) on a
swapped model, against the same gradients taken on the C path."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import assert_close_to_roundoff, is_key_bias

import graphswap
from graphswap.kernels import QuantScheme, device_gradients, device_products, resolve_kernel
from graphswap.kernels.derivatives import (derivative_tables, lut_conv2d_gradients,
                                           lut_matmul_gradients)
from graphswap.native import col2im, conv_geometry, conv_gradients_via_matmul

MATMUL_CASES = [("mul8u_drum4", QuantScheme(), 1 << 22),
                ("mul8u_drum4", QuantScheme(weights="asymmetric", granularity="per_tensor"), 7),
                ("mul8u_drum3", QuantScheme(weights="asymmetric").with_range(-0.5, 2.0), 1 << 22),
                ("mul8s_trunc3", QuantScheme(granularity="per_tensor"), 5),
                ("mul8s_drum3", QuantScheme().with_range(-1.5, 1.0), 1 << 22)]


def _device_matmul_gradients(kernel, scheme, a, b, dy, budget):
    return device_gradients.lut_matmul_gradients(
        a, b, dy, derivative_tables(kernel.multiplier), kernel.signed, scheme, budget=budget)


@pytest.mark.parametrize("spec,scheme,budget", MATMUL_CASES)
def test_lut_grad_matmul_equals_the_c_path(spec, scheme, budget):
    kernel = resolve_kernel(spec)
    resolved = kernel.resolve_scheme(scheme)
    rng = np.random.default_rng(0)
    for m, k, n in ((1, 1, 1), (9, 13, 3), (6, 40, 5)):
        a = (rng.normal(size=(m, k)) * 1.3).astype(np.float32)
        b = rng.normal(size=(k, n)).astype(np.float32)
        dy = rng.normal(size=(m, n)).astype(np.float32)
        want_a, want_b = lut_matmul_gradients(kernel, a, b, dy, quant=resolved)
        got_a, got_b = (t.numpy() for t in _device_matmul_gradients(kernel, resolved, a, b, dy,
                                                                      budget))
        assert m == 1 or (np.abs(want_a).max() > 0 and np.abs(want_b).max() > 0)
        assert_close_to_roundoff(got_a, want_a, terms=n)
        assert_close_to_roundoff(got_b, want_b, terms=m)


CONV_CASES = [((2, 7, 6, 4), (3, 3, 2, 6), (2, 1), (1, 1), "same", 2),
              ((1, 8, 8, 3), (2, 3, 3, 4), (1, 1), (2, 1), "valid", 1),
              ((2, 5, 5, 2), (3, 3, 2, 3), (2, 2), (1, 1), "same", 1)]


@pytest.mark.parametrize("x_shape,w_shape,strides,dilations,padding,groups", CONV_CASES)
def test_lut_grad_conv2d_and_col2im_equal_the_c_path(x_shape, w_shape, strides, dilations,
                                                       padding, groups):
    rng = np.random.default_rng(1)
    x = rng.normal(size=x_shape).astype(np.float32)
    w = rng.normal(size=w_shape).astype(np.float32)
    g = conv_geometry(x_shape, w_shape, strides, dilations, padding, groups)
    dy = rng.normal(size=(x_shape[0], g.out_height, g.out_width, g.out_channels)).astype(
        np.float32)
    # col2im is the adjoint of the window gather, and equals the C path's col2im
    columns = rng.normal(size=(x_shape[0] * g.out_height * g.out_width, groups,
                               w_shape[0] * w_shape[1] * w_shape[2])).astype(np.float32)
    back = device_gradients.col2im(columns, g, x_shape[0]).numpy()
    windows = device_products.conv_windows(x, g, 0.0).numpy()
    np.testing.assert_allclose(np.vdot(windows.astype(np.float64), columns),
                               np.vdot(x.astype(np.float64), back), rtol=1e-5)
    per = x_shape[3] // groups
    c_columns = columns.reshape(columns.shape[0], groups, -1, per).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(back, col2im(np.ascontiguousarray(
        c_columns.reshape(columns.shape[0], -1, x_shape[3])), g), rtol=1e-5, atol=1e-5)
    for spec, scheme in (("mul8u_drum4", QuantScheme()),
                         ("mul8s_trunc3", QuantScheme().with_range(-2.0, 2.0))):
        kernel = resolve_kernel(spec)
        resolved = kernel.resolve_scheme(scheme)
        want_x, want_w = lut_conv2d_gradients(kernel, x, w, dy, g, quant=resolved)
        got_x, got_w = device_gradients.lut_conv2d_gradients(
            x, w, dy, derivative_tables(kernel.multiplier), kernel.signed, resolved, g)
        taps = w_shape[0] * w_shape[1]
        assert_close_to_roundoff(got_x.numpy(), want_x, terms=taps * w_shape[3])
        assert_close_to_roundoff(got_w.numpy(), want_w, terms=dy.size // w_shape[3])
    # backward="kernel": every product through the kernel's matmul, as the C path
    kernel = resolve_kernel("mul8u_drum4").resolve_scheme(None)
    bound = graphswap.kernels.base.bind_scheme(resolve_kernel("mul8u_drum4"), kernel)
    want_x, want_w = conv_gradients_via_matmul(x, w, dy, g, bound.matmul)
    got_x, got_w = device_gradients.conv2d_gradients_through(
        lambda p, q: device_products.lut_matmul(p, q, bound.kernel.multiplier.table, False,
                                                kernel), x, w, dy, g)
    assert_close_to_roundoff(got_w.numpy(), want_w, terms=1)      # one product each: exact
    assert_close_to_roundoff(got_x.numpy(), want_x, terms=w_shape[0] * w_shape[1])


def _swapped(backward, seed=3):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 2))
    x = keras.layers.Conv2D(4, 3, strides=2, padding="same", name="conv")(inputs)
    x = keras.layers.Flatten()(keras.layers.ReLU()(x))
    model = keras.Model(inputs, keras.layers.Dense(3, name="dense")(x))
    return graphswap.rewrite_model(model, kernel="mul8u_drum4", backward=backward)


@pytest.mark.parametrize("backward", ["lut_grad", "kernel"])
def test_gradients_under_jit_equal_the_c_path(backward):
    """A swapped Conv2D + Dense with backward="lut_grad" / "kernel": the gradients of every
    weight inside tf.function(jit_compile=True) (the device path) equal those of the C path."""
    swapped = _swapped(backward)
    x = np.random.default_rng(4).normal(size=(3, 8, 8, 2)).astype(np.float32)

    def gradients(batch):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(swapped(batch) * tf.constant([1.0, -2.0, 0.5]))
        return tape.gradient(loss, swapped.trainable_variables)

    c_path = [g.numpy() for g in tf.function(gradients)(x)]
    device = [g.numpy() for g in tf.function(gradients, jit_compile=True)(x)]
    for variable, want, got in zip(swapped.trainable_variables, c_path, device):
        assert np.abs(want).max() > 0, variable.path
        assert_close_to_roundoff(got, want, terms=128, factor=16.0)


def test_kernel_backward_of_every_swapped_type_under_jit_equals_the_c_path():
    """backward="kernel" through every swapped layer type (their backward products through the
    multiplier, dynamic ranges) inside one XLA program: each weight's gradient equals the C
    path's within round-off of the float parts between the products."""
    keras.utils.set_random_seed(6)
    inputs = keras.Input((6, 6, 3))
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv")(inputs)
    x = keras.layers.DepthwiseConv2D(3, strides=2, padding="same", name="depthwise")(x)
    x = keras.layers.SeparableConv2D(4, 3, padding="same", name="separable")(x)
    x = keras.layers.Conv2DTranspose(4, 3, strides=2, padding="same", name="transpose")(x)
    x = keras.layers.Reshape((36, 4), name="tokens")(x)
    x = keras.layers.Conv1D(4, 3, padding="same", name="conv1d")(x)
    x = keras.layers.MultiHeadAttention(2, 4, name="attention")(x, x)
    x = keras.layers.EinsumDense("btc,cd->btd", (36, 4), name="einsum")(x)
    x = keras.layers.Flatten()(x)
    model = keras.Model(inputs, keras.layers.Dense(3, name="out")(x))
    swapped = graphswap.rewrite_model(model, kernel="mul8u_drum4", backward="kernel")
    batch = np.random.default_rng(6).uniform(-1, 1, (2, 6, 6, 3)).astype(np.float32)

    def gradients(b):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(swapped(b, training=False) * tf.constant([1.0, -1.0, 0.5]))
        return tape.gradient(loss, swapped.trainable_variables)

    c_path = [g.numpy() for g in tf.function(gradients)(batch)]
    device = [g.numpy() for g in tf.function(gradients, jit_compile=True)(batch)]
    assert len(c_path) == len(swapped.trainable_variables) > 10
    for variable, want, got in zip(swapped.trainable_variables, c_path, device):
        if is_key_bias(variable.path):   # softmax ignores it: both are round-off noise
            continue
        assert np.abs(want).max() > 0, variable.path
        # a backward product's dynamic range follows its inputs, which carry the float parts'
        # round-off: a code may move by one step, so compare at the products' own resolution
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max(),
                                   err_msg=variable.path)
