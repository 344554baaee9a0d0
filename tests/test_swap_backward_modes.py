"""The two backward modes, checked against their definitions.

backward="native": the gradients are TensorFlow's MatMul/Conv2D gradients against the float
weights, whatever the forward kernel computed (straight-through):
    dx = dy @ w^T, dw = x^T @ dy          (Dense)
    dx = Conv2DBackpropInput(w, dy), dw = Conv2DBackpropFilter(x, dy)   (Conv2D)
backward="kernel": the same products go through the kernel:
    dx = K(dy, w^T), dw = K(x^T, dy)      (Dense; K = the kernel's matmul)
    dW = K(P^T, dy), dx = col2im(K(dy, W^T))  (Conv2D; P = the input's patches)
The references below use TensorFlow's ops and tests/reference.py's independent quantized matmul;
patches and their adjoint come from tf.image.extract_patches and its TensorFlow gradient.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import reference
from conftest import assert_close_to_roundoff
from graphswap import SwappedConv2D, SwappedDense
from graphswap.kernels import resolve_multiplier

RNG = np.random.default_rng(11)


def _layer_grads(layer, x, dy):
    x = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x)
    gx, gw = tape.gradient(y, [x, layer.kernel], output_gradients=tf.constant(dy))
    return y.numpy(), gx.numpy(), gw.numpy()


def _dense(kernel, backward, features=12, units=7):
    layer = SwappedDense(units, use_bias=False, swap_kernel=kernel, backward=backward)
    layer.build((None, features))
    layer.kernel.assign(RNG.normal(0, 0.3, (features, units)).astype(np.float32))
    return layer


@pytest.mark.parametrize("kernel", ["mul8u_drum4", "mul8s_trunc4", "bf16"])
def test_native_backward_is_tensorflows_matmul_gradient(kernel):
    layer = _dense(kernel, "native")
    x = RNG.normal(0.2, 1.0, (9, 12)).astype(np.float32)
    dy = RNG.normal(0, 1.0, (9, 7)).astype(np.float32)
    y, gx, gw = _layer_grads(layer, x, dy)
    w = layer.kernel.numpy()
    assert not np.allclose(y, x @ w, atol=1e-4)  # the forward really is approximate
    assert_close_to_roundoff(gx, tf.linalg.matmul(dy, w, transpose_b=True).numpy(), terms=7,
                             magnitude=np.abs(dy) @ np.abs(w).T)
    assert_close_to_roundoff(gw, tf.linalg.matmul(x, dy, transpose_a=True).numpy(), terms=9,
                             magnitude=np.abs(x).T @ np.abs(dy))


@pytest.mark.parametrize("name", ["mul8u_drum4", "mul8s_trunc4", "mul8s_mitchell"])
def test_kernel_backward_dense_runs_products_through_the_multiplier(name):
    layer = _dense(name, "kernel")
    multiplier = resolve_multiplier(name)
    x = RNG.normal(0.2, 1.0, (9, 12)).astype(np.float32)
    dy = RNG.normal(0, 1.0, (9, 7)).astype(np.float32)
    _, gx, gw = _layer_grads(layer, x, dy)
    w = layer.kernel.numpy()
    want_gx = reference.quantized_matmul(dy, w.T.copy(), multiplier.table, multiplier.signed)
    want_gw = reference.quantized_matmul(x.T.copy(), dy, multiplier.table, multiplier.signed)
    np.testing.assert_array_equal(gx, want_gx)
    np.testing.assert_array_equal(gw, want_gw)
    # and it is not the native gradient
    assert not np.allclose(gx, dy @ w.T, rtol=1e-3, atol=1e-3)


def _patches(x, kh, kw, stride, dilation, padding):
    return tf.image.extract_patches(x, [1, kh, kw, 1], [1, stride, stride, 1],
                                    [1, dilation, dilation, 1], padding.upper())


@pytest.mark.parametrize("name", ["mul8u_drum4", "mul8s_trunc3"])
@pytest.mark.parametrize("stride,dilation,padding", [(1, 1, "valid"), (2, 1, "same"),
                                                    (1, 2, "same")])
def test_kernel_backward_conv2d_matches_its_definition(name, stride, dilation, padding):
    multiplier = resolve_multiplier(name)
    kh, kw, cin, cout = 3, 2, 3, 5
    layer = SwappedConv2D(cout, (kh, kw), strides=stride, dilation_rate=dilation, padding=padding,
                          use_bias=False, swap_kernel=name, backward="kernel")
    layer.build((None, 9, 8, cin))
    layer.kernel.assign(RNG.normal(0, 0.3, (kh, kw, cin, cout)).astype(np.float32))
    x = tf.constant(RNG.normal(0.2, 1.0, (2, 9, 8, cin)).astype(np.float32))
    y = layer(x)
    dy = RNG.normal(0, 1.0, y.shape).astype(np.float32)
    _, gx, gw = _layer_grads(layer, x, dy)

    w2d = layer.kernel.numpy().reshape(kh * kw * cin, cout)
    with tf.GradientTape() as tape:
        tape.watch(x)
        patches = _patches(x, kh, kw, stride, dilation, padding)
    rows = int(np.prod(patches.shape[:3]))
    p2d = patches.numpy().reshape(rows, kh * kw * cin)
    dy2d = dy.reshape(rows, cout)
    want_gw = reference.quantized_matmul(p2d.T.copy(), dy2d, multiplier.table, multiplier.signed)
    dpatches = reference.quantized_matmul(dy2d, w2d.T.copy(), multiplier.table, multiplier.signed)
    want_gx = tape.gradient(patches, x, output_gradients=dpatches.reshape(patches.shape)).numpy()
    np.testing.assert_array_equal(gw, want_gw.reshape(kh, kw, cin, cout))
    assert_close_to_roundoff(gx, want_gx, terms=kh * kw)  # col2im: sums in another order


def test_kernel_backward_with_exact_kernel_equals_native_gradients():
    stock = keras.layers.Conv2D(4, 3, strides=2, padding="same")
    stock.build((None, 10, 10, 2))
    swapped = SwappedConv2D(4, 3, strides=2, padding="same", backward="kernel")
    swapped.build((None, 10, 10, 2))
    swapped.set_weights(stock.get_weights())
    x = RNG.normal(0, 1, (3, 10, 10, 2)).astype(np.float32)
    dy = RNG.normal(0, 1, (3, 5, 5, 4)).astype(np.float32)
    _, gx, gw = _layer_grads(swapped, x, dy)
    _, gx_ref, gw_ref = _layer_grads(stock, x, dy)
    assert_close_to_roundoff(gx, gx_ref, terms=3 * 3 * 4)
    assert_close_to_roundoff(gw, gw_ref, terms=3 * 5 * 5)
