"""lut_grad: the C derivative tables and gradient products against an independent numpy
computation of their definition (graphswap/kernels/derivatives.py), for every weight encoding,
static and dynamic activations, matmul and (grouped, padded) conv; and the layer's gradient
through GradientTape equal to it."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import graphswap
from conftest import assert_close_to_roundoff
from graphswap.errors import QuantizationError
from graphswap.kernels import (QuantScheme, derivative_tables, lut_conv2d_gradients,
                               lut_matmul_gradients, resolve_kernel, resolve_multiplier)
from graphswap.native import conv_geometry, shipped_library

import reference

RNG = np.random.default_rng(7)


def numpy_derivative_tables(table, signed, h):
    """The definition: central differences of half-width h in value order, clamped."""
    t = np.asarray(table, np.float64).reshape(256, 256)           # [code a, code b]
    values = np.arange(-128, 128) if signed else np.arange(256)   # value order
    codes = values % 256
    tv = t[np.ix_(codes, codes)]                                  # [value index a, value index b]
    index = np.arange(256)
    up, down = np.minimum(index + h, 255), np.maximum(index - h, 0)
    d1 = (tv[up, :] - tv[down, :]) / (up - down)[:, None]
    d2 = (tv[:, up] - tv[:, down]) / (up - down)[None, :]
    back = np.argsort(codes)                                      # code -> value index
    return d1[np.ix_(back, back)].reshape(-1), d2[np.ix_(back, back)].reshape(-1)


@pytest.mark.parametrize("name", ["mul8u_drum4", "mul8s_drum3", "mul8u_exact", "mul8s_mitchell"])
@pytest.mark.parametrize("h", [1, 4, 9])
def test_derivative_tables_match_their_definition(name, h):
    mult = resolve_multiplier(name)
    d1, d2 = derivative_tables(mult, h)
    want1, want2 = numpy_derivative_tables(mult.table, mult.signed, h)
    np.testing.assert_allclose(d1, want1.astype(np.float32), rtol=0, atol=0)
    np.testing.assert_allclose(d2, want2.astype(np.float32), rtol=0, atol=0)


def test_exact_multiplier_derivatives_are_the_other_operand_inside_the_range():
    d1, d2 = derivative_tables(resolve_multiplier("mul8u_exact"), 4)
    d1, d2 = d1.reshape(256, 256), d2.reshape(256, 256)
    b = np.arange(256)
    assert (d1[4:252, :] == b[None, :]).all() and (d2[:, 4:252] == b[:, None]).all()


def numpy_matmul_gradients(a, b, dy, table, signed, mode, h):
    """dL/da, dL/db by the definition, with the reference pipeline's quantization."""
    weights, granularity, static = reference.resolve_mode(mode, signed)
    d1, d2 = numpy_derivative_tables(table, signed, h)
    qa, sa, za = reference._activations(a, signed, static)
    k, n = b.shape
    da = np.zeros(a.shape)
    db = np.zeros(b.shape)
    g = np.asarray(dy, np.float64)
    for j in range(n):
        whole = b[:, j] if granularity == "per_channel" else b
        qw, sign, sw, zw = reference._weight_channel(b[:, j], whole, weights)
        index = ((qa % 256) << 8) | (qw % 256)[None, :]                  # (m, k)
        da += g[:, j:j + 1] * sw * (sign[None, :] * d1[index] - zw)
        db[:, j] = sa * (g[:, j:j + 1] * (d2[index] - za)).sum(axis=0)
    return da, db


MODES = {False: [{"weights": "sign_magnitude", "granularity": "per_channel"},
                 {"weights": "asymmetric", "granularity": "per_tensor"},
                 {"weights": "asymmetric", "granularity": "per_channel",
                  "activation_range": (-0.5, 1.25)}],
         True: [{"weights": "symmetric", "granularity": "per_channel"},
                {"weights": "symmetric", "granularity": "per_tensor",
                 "activation_range": (-1.0, 1.5)}]}


def scheme_of(mode):
    static = mode.get("activation_range")
    return QuantScheme(weights=mode["weights"], granularity=mode["granularity"],
                       activations="static" if static else "dynamic", activation_range=static)


@pytest.mark.parametrize("name", ["mul8u_drum4", "mul8s_drum3", "mul8u_mitchell"])
@pytest.mark.parametrize("m,k,n", [(1, 5, 3), (17, 40, 9), (64, 30, 33)])
def test_matmul_gradients_match_the_definition(name, m, k, n):
    kernel = resolve_kernel(name)
    a = RNG.normal(0.2, 1.0, (m, k)).astype(np.float32)
    b = RNG.normal(0, 0.3, (k, n)).astype(np.float32)
    dy = RNG.normal(0, 1.0, (m, n)).astype(np.float32)
    for mode in MODES[kernel.signed]:
        da, db = lut_matmul_gradients(kernel, a, b, dy, quant=scheme_of(mode))
        want_da, want_db = numpy_matmul_gradients(a, b, dy, kernel.multiplier.table,
                                                  kernel.signed, mode, 4)
        assert da.dtype == np.float32 and db.dtype == np.float32
        assert_close_to_roundoff(da, want_da, terms=n)
        assert_close_to_roundoff(db, want_db, terms=m)


def numpy_conv_gradients(x, w, dy, table, signed, mode, h, strides, pads, groups):
    """Convolution gradients by the definition, one window and output channel at a time."""
    weights, granularity, static = reference.resolve_mode(mode, signed)
    d1, d2 = numpy_derivative_tables(table, signed, h)
    qx, sx, zx = reference._activations(x, signed, static)
    n, height, width, cin = x.shape
    fh, fw, cin_g, cout = w.shape
    cout_g = cout // groups
    pt, pb, pl, pr = pads
    padded = np.full((n, height + pt + pb, width + pl + pr, cin), zx, np.int64)
    padded[:, pt:pt + height, pl:pl + width] = qx
    dpadded = np.zeros(padded.shape)
    dw = np.zeros(w.shape)
    channels = [reference._weight_channel(w[..., o], w[..., o] if granularity == "per_channel"
                                          else w, weights) for o in range(cout)]
    g = np.asarray(dy, np.float64)
    for y in range(dy.shape[1]):
        for xx in range(dy.shape[2]):
            rows = slice(y * strides[0], y * strides[0] + fh)
            cols = slice(xx * strides[1], xx * strides[1] + fw)
            for o in range(cout):
                group = o // cout_g
                chans = slice(group * cin_g, (group + 1) * cin_g)
                qw, sign, swo, zw = channels[o]
                patch = padded[:, rows, cols, chans]                  # (n, fh, fw, cin_g)
                index = ((patch % 256) << 8) | (qw % 256)[None]
                go = g[:, y, xx, o][:, None, None, None]
                dpadded[:, rows, cols, chans] += go * swo * (sign[None] * d1[index] - zw)
                dw[..., o] += sx * (go * (d2[index] - zx)).sum(axis=0)
    return dpadded[:, pt:pt + height, pl:pl + width], dw


@pytest.mark.parametrize("name", ["mul8u_drum4", "mul8s_drum3"])
@pytest.mark.parametrize("case", [((2, 7, 7, 2), (3, 3, 2, 4), (1, 1), "same", 1),
                                  ((1, 9, 8, 4), (3, 2, 2, 6), (2, 1), "valid", 2)],
                         ids=["same", "grouped-strided"])
def test_conv_gradients_match_the_definition(name, case):
    kernel = resolve_kernel(name)
    xs, ws, strides, padding, groups = case
    g = conv_geometry(xs, ws, strides, (1, 1), padding, groups)
    x = RNG.normal(0.3, 1.0, xs).astype(np.float32)
    w = RNG.normal(0, 0.3, ws).astype(np.float32)
    dy = RNG.normal(0, 1.0, g.output_shape).astype(np.float32)
    pads = (g.pad_top, g.pad_bottom, g.pad_left, g.pad_right)
    for mode in MODES[kernel.signed][:2]:
        dx, dw = lut_conv2d_gradients(kernel, x, w, dy, g, quant=scheme_of(mode))
        want_dx, want_dw = numpy_conv_gradients(x, w, dy, kernel.multiplier.table,
                                                kernel.signed, mode, 4, strides, pads, groups)
        assert_close_to_roundoff(dx, want_dx, terms=ws[0] * ws[1] * ws[3])
        assert_close_to_roundoff(dw, want_dw, terms=int(np.prod(g.output_shape[:3])))


def test_swapped_layers_use_lut_grad_in_their_gradient(digits):
    """GradientTape through SwappedDense / SwappedConv2D with backward="lut_grad" gives exactly
    the kernel-level gradients of the layer's scheme (dynamic and static)."""
    dense = graphswap.SwappedDense(4, arithmetic="mul8s_drum4", backward="lut_grad",
                                   use_bias=False)
    hidden = tf.constant(RNG.normal(0, 1, (40, 12)).astype(np.float32))
    upstream = RNG.normal(0, 1, (40, 4)).astype(np.float32)
    with tf.GradientTape() as tape:
        tape.watch(hidden)
        loss = tf.reduce_sum(dense(hidden) * upstream)
    grad_h, grad_w = tape.gradient(loss, [hidden, dense.kernel])
    want_h, want_w = lut_matmul_gradients(dense.arithmetic, hidden.numpy(),
                                          dense.kernel.numpy(), upstream,
                                          quant=dense.current_quantization())
    np.testing.assert_array_equal(grad_h.numpy(), want_h)
    np.testing.assert_array_equal(grad_w.numpy(), want_w)

    conv = graphswap.SwappedConv2D(3, 3, arithmetic="mul8u_drum4", backward="lut_grad",
                                   padding="same", quantization={
                                       "activations": "static", "activation_range": (0.0, 0.75)})
    x = tf.constant(digits["x_train"][:6].astype(np.float32) / 255.0)
    upstream = RNG.normal(0, 1, (6, 32, 32, 3)).astype(np.float32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(conv(x) * upstream)
    grad_x, grad_k = tape.gradient(loss, [x, conv.kernel])
    g = conv_geometry(x.shape, conv.kernel.shape, (1, 1), (1, 1), "same", 1)
    want_x, want_k = lut_conv2d_gradients(conv.arithmetic, x.numpy(), conv.kernel.numpy(),
                                          upstream, g, quant=conv.current_quantization())
    np.testing.assert_array_equal(grad_x.numpy(), want_x)
    np.testing.assert_array_equal(grad_k.numpy(), want_k)


def test_lut_grad_on_a_float_kernel_is_the_native_gradient():
    layer = graphswap.SwappedDense(3, arithmetic="exact", backward="lut_grad")
    x = tf.constant(RNG.normal(size=(5, 4)).astype(np.float32))
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(layer(x) ** 2)
    grad = tape.gradient(y, layer.kernel).numpy()
    want = tf.linalg.matmul(x, 2 * layer(x), transpose_a=True).numpy()
    assert_close_to_roundoff(grad, want, terms=5)


def test_bad_half_width_is_refused():
    mult = resolve_multiplier("mul8u_drum4")
    for bad in (0, 256, 2.5, True):
        with pytest.raises(QuantizationError, match="half width"):
            derivative_tables(mult, bad)
    from graphswap.errors import KernelExecutionError
    with pytest.raises(KernelExecutionError, match="half_width"):
        shipped_library().lut_derivative_tables(mult.table, False, 0)


@pytest.mark.parametrize("m,k,n,signs", [(300, 37, 130, True), (513, 3, 6, False),
                                         (15, 70, 1, True)],
                         ids=["threads", "conv-like", "one-column"])
def test_gradient_products_match_their_definition(m, k, n, signs):
    """graphswap_lut_matmul_grad on raw codes against the formula in its header: long sums, work
    split over threads, signs, either output alone.  Random tables: every entry counts (a
    multiplier's derivative at activation code 0 is often 0, which would hide a misplaced row)."""
    d1, d2 = RNG.normal(0, 50.0, (2, 65536)).astype(np.float32)
    a = RNG.integers(0, 256, (m, k), dtype=np.uint8)
    b = RNG.integers(0, 256, (k, n), dtype=np.uint8)
    sign = RNG.choice(np.array([-1, 1], np.int8), (k, n)) if signs else None
    g_a = RNG.normal(0, 1.0, (m, n)).astype(np.float32)
    g_b = RNG.normal(0, 1.0, (m, n)).astype(np.float32)
    index = (a.astype(np.int64)[:, :, None] << 8) | b[None, :, :]          # (m, k, n)
    s = np.ones((k, n)) if sign is None else sign.astype(np.float64)
    want_da = np.einsum("ikj,kj,ij->ik", d1.astype(np.float64)[index], s, g_a.astype(np.float64))
    want_db = np.einsum("ikj,ij->kj", d2.astype(np.float64)[index], g_b.astype(np.float64))
    magnitude_da = np.einsum("ikj,ij->ik", np.abs(d1.astype(np.float64)[index]), np.abs(g_a))
    magnitude_db = np.einsum("ikj,ij->kj", np.abs(d2.astype(np.float64)[index]), np.abs(g_b))
    library = shipped_library()
    da, db = library.lut_matmul_grad(a, b, d1, d2, g_a=g_a, g_b=g_b, sign=sign)
    assert_close_to_roundoff(da, want_da, terms=n, magnitude=magnitude_da)
    assert_close_to_roundoff(db, want_db, terms=m, magnitude=magnitude_db)
    only_da, no_db = library.lut_matmul_grad(a, b, d1, d2, g_a=g_a, sign=sign)
    assert no_db is None
    np.testing.assert_array_equal(only_da, da)
    no_da, only_db = library.lut_matmul_grad(a, b, d1, d2, g_b=g_b)
    assert no_da is None
    np.testing.assert_array_equal(only_db, db)


def test_gradient_products_of_empty_sums_are_zero():
    d1, d2 = derivative_tables(resolve_multiplier("mul8u_drum4"))
    library = shipped_library()
    da, db = library.lut_matmul_grad(np.zeros((0, 4), np.uint8), np.ones((4, 3), np.uint8),
                                     d1, d2, g_a=np.zeros((0, 3), np.float32),
                                     g_b=np.zeros((0, 3), np.float32))
    assert da.shape == (0, 4) and (db == 0).all() and db.shape == (4, 3)
    da, db = library.lut_matmul_grad(np.ones((5, 4), np.uint8), np.zeros((4, 0), np.uint8),
                                     d1, d2, g_a=np.zeros((5, 0), np.float32),
                                     g_b=np.zeros((5, 0), np.float32))
    assert (da == 0).all() and da.shape == (5, 4) and db.shape == (4, 0)
