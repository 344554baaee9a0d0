"""FP8 on the device path (graphswap/kernels/device_fp8.py, graphswap/swap/xla.py): the FP8 codes
bit for bit with the C path (kernels/fp8.py's encode) for every float32 class, the products of
the exact built-ins and of users' tables against Fp8Kernel's C path (bit for bit where the sums
are exact in float32, else within float32 summation round-off scaled to the summed terms), every
scheme, convolutions (groups, strides, dilations, padding), non-finite inputs, under
tf.function(jit_compile=True) forward and gradients, a Keras model compiled with
jit_compile=True running predict and fit, and the memory bound of the table formulation."""

from __future__ import annotations

import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import assert_close_to_roundoff
from test_fp8 import _float32_cases

import graphswap
from graphswap.kernels import QuantScheme, resolve_kernel
from graphswap.kernels.fp8 import (E4M3, E5M2, Fp8Kernel, Fp8Spec, decode, encode,
                                   quantize_activations, quantize_weights)
from graphswap.native import conv_geometry
from graphswap.kernels import device_fp8, device_products
from graphswap.swap import xla

FORMATS = {"e4m3": E4M3, "e5m2": E5M2}


def _table_kernel(fmt, table, name="mine"):
    """A user's FP8 multiplier given as a table (what fp8_FMT:FILE.npy resolves to)."""
    return Fp8Kernel(Fp8Spec(fmt, "npy", f"/nowhere/{name}.npy"), table, "0" * 64)


def _integer_table(seed=0):
    """Integer-valued products in [-50, 50], T[0, w] != 0: every float32 sum of a few thousand
    of them is exact, so the device path must equal the C path bit for bit - codes, padding
    taps (code 0x00) and groups included."""
    return np.random.default_rng(seed).integers(-50, 51, (256, 256)).astype(np.float32)


def _random_table(seed=1):
    return np.random.default_rng(seed).standard_normal((256, 256)).astype(np.float32)


def _noisy_table(fmt, seed):
    """An approximate multiplier: the exact products with a relative error of a few percent."""
    exact = Fp8Kernel(Fp8Spec(fmt)).products_table().astype(np.float64)
    exact[~np.isfinite(exact)] = 0.0
    noise = np.random.default_rng(seed).uniform(-0.05, 0.05, exact.shape)
    return (exact * (1 + noise)).astype(np.float32)


def _operands(rng, shape, specials=False):
    t = (rng.standard_normal(shape) * 1.7).astype(np.float32)
    if specials and t.size > 3:
        flat = t.reshape(-1)
        flat[1] = np.nan
        flat[-2] = -np.inf
    return t


def _matmul_magnitude(kernel, a, b, scheme):
    """sum_k |T[qa_ik, qb_kj]| * s_a * s_j: the size of the summed terms (the round-off scale)."""
    qa, sa, _ = quantize_activations(a, scheme, kernel.format)
    qb, sb, _ = quantize_weights(b, scheme, kernel.format)
    table = np.abs(kernel.products_table().astype(np.float64))
    table[~np.isfinite(table)] = 0.0
    return table[qa[:, :, None], qb[None, :, :]].sum(axis=1) * (sa * sb)[None, :]


@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
def test_codes_and_values_bit_for_bit_with_the_c_path_for_every_float32_class(name):
    fmt = FORMATS[name]
    x = _float32_cases(fmt)       # ~1.3 million values: every exponent, ties, NaN payloads
    want = encode(x, fmt)
    encode_jit = tf.function(lambda t: device_fp8.fp8_encode(t, fmt), jit_compile=True)
    for got in (device_fp8.fp8_encode(x, fmt), encode_jit(x)):
        got = np.asarray(got)
        wrong = np.flatnonzero(got != want)
        assert wrong.size == 0, f"{wrong.size} differ, e.g. {x[wrong[:4]]}: {got[wrong[:4]]}"
    values = np.asarray(device_fp8.fp8_values(x, fmt))
    reference = decode(want, fmt)
    assert np.array_equal(np.isnan(values), np.isnan(reference))
    finite = ~np.isnan(reference)
    assert np.array_equal(values[finite].view(np.uint32), reference[finite].view(np.uint32))


SCHEMES = [QuantScheme(), QuantScheme(granularity="per_tensor"), QuantScheme().with_range(-0.7, 1.3)]


@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
@pytest.mark.parametrize("which", ["exact", "integer_table", "random_table"])
def test_matmul_equals_the_c_path(name, which):
    fmt = FORMATS[name]
    kernel = (Fp8Kernel(Fp8Spec(fmt)) if which == "exact" else
              _table_kernel(fmt, _integer_table() if which == "integer_table" else _random_table()))
    rng = np.random.default_rng(2)
    for scheme in SCHEMES:
        resolved = kernel.resolve_scheme(scheme)
        for m, k, n, specials in ((1, 1, 1, False), (4, 1, 3, True), (9, 37, 5, True),
                                  (3, 300, 2, False)):
            a, b = _operands(rng, (m, k), specials), _operands(rng, (k, n), specials)
            expected = kernel.matmul(a, b, quant=resolved)
            got = np.asarray(device_fp8.fp8_matmul(a, b, fmt, kernel.table, resolved))
            results = [got]
            if specials and k > 1 and scheme is SCHEMES[0]:
                # tiny blocks: several row blocks and K chunks, padded rows and taps
                results.append(np.asarray(device_fp8.fp8_matmul(a, b, fmt, kernel.table,
                                                                resolved, budget=40)))
            for result in results:
                assert np.array_equal(np.isnan(result), np.isnan(expected))
                if k == 1 or which == "integer_table":   # one product, or exact sums
                    np.testing.assert_array_equal(result, expected)
                else:
                    keep = ~np.isnan(expected)
                    magnitude = _matmul_magnitude(kernel, a, b, resolved)
                    assert_close_to_roundoff(result[keep], expected[keep], terms=k,
                                             magnitude=magnitude[keep])
            if specials:
                assert np.isnan(expected).any() and np.isfinite(expected).any()
    # empty operands: the C path's empty or zero products
    for m, k, n in ((0, 5, 3), (4, 0, 3), (4, 5, 0)):
        a, b = np.ones((m, k), np.float32), np.ones((k, n), np.float32)
        got = np.asarray(device_fp8.fp8_matmul(a, b, fmt, kernel.table, kernel.resolve_scheme(None)))
        np.testing.assert_array_equal(got, kernel.matmul(a, b))


CONVS = [  # input shape, filter shape, strides, dilations, padding, groups
    ((2, 9, 8, 6), (3, 3, 3, 4), (2, 1), (1, 1), "same", 2),
    ((1, 7, 7, 3), (2, 3, 3, 5), (1, 1), (2, 1), "valid", 1),
    ((2, 6, 5, 4), (3, 3, 1, 8), (1, 2), (1, 1), "same", 4),   # depthwise, multiplier 2
    ((1, 5, 5, 1), (5, 5, 1, 3), (1, 1), (1, 1), "same", 1),
]


@pytest.mark.parametrize("which", ["exact_e4m3", "exact_e5m2", "integer_table"])
def test_conv2d_equals_the_c_path(which):
    fmt = E5M2 if which == "exact_e5m2" else E4M3
    kernel = _table_kernel(fmt, _integer_table(3)) if which == "integer_table" else \
        Fp8Kernel(Fp8Spec(fmt))
    rng = np.random.default_rng(4)
    for i, (x_shape, w_shape, strides, dilations, padding, groups) in enumerate(CONVS):
        scheme = kernel.resolve_scheme(SCHEMES[i % len(SCHEMES)])
        x, w = _operands(rng, x_shape, specials=i == 0), _operands(rng, w_shape)
        geometry = conv_geometry(x_shape, w_shape, strides, dilations, padding, groups)
        expected = kernel.conv2d(x, w, geometry, quant=scheme)
        got = np.asarray(device_fp8.fp8_conv2d(x, w, fmt, kernel.table, scheme, geometry))
        assert np.array_equal(np.isnan(got), np.isnan(expected)), CONVS[i]
        if i == 0:
            assert np.isnan(expected).any() and np.isfinite(expected).any()
        if kernel.table is not None:   # integer sums: exact, so bit for bit
            np.testing.assert_array_equal(got, expected, err_msg=str(CONVS[i]))
        else:   # exact products; sums in the backend's order
            keep = ~np.isnan(expected)
            _, sx, _ = quantize_activations(x, scheme, fmt)
            _, sw, _ = quantize_weights(w, scheme, fmt)
            vx = np.abs(decode(encode((x / sx).astype(np.float32), fmt), fmt))
            vw = np.abs(decode(encode((w / sw).astype(np.float32), fmt), fmt))
            vx[~np.isfinite(vx)] = 0
            terms = w_shape[0] * w_shape[1] * w_shape[2]
            magnitude = device_products.float_conv2d(vx, vw, geometry)   # sum |x||w| per output
            assert_close_to_roundoff(got[keep], expected[keep], terms=terms,
                                     magnitude=(np.asarray(magnitude) * sx * sw)[keep])


def test_products_compiled_by_xla_with_a_static_range_tensor():
    """One XLA program (compiles are slow): exact E4M3 and a table E5M2 matmul and grouped
    convolution, the static range given as a tensor (the layer's state), against the C path."""
    exact, table = Fp8Kernel(Fp8Spec(E4M3)), _table_kernel(E5M2, _integer_table(5))
    scheme = QuantScheme().with_range(-1.5, 2.0)
    placeholder = exact.resolve_scheme(QuantScheme().with_range(0.0, 1.0))
    rng = np.random.default_rng(6)
    a, b = _operands(rng, (7, 21), True), _operands(rng, (21, 5))
    x, w = _operands(rng, (2, 9, 8, 6), True), _operands(rng, (3, 3, 3, 4))
    geometry = conv_geometry(x.shape, w.shape, (2, 1), (1, 1), "same", 2)
    bounds = np.array([-1.5, 2.0], np.float32)

    @tf.function(jit_compile=True)
    def products(a, b, x, w, bounds):
        return [device_fp8.fp8_matmul(a, b, E4M3, None, placeholder, bounds),
                device_fp8.fp8_conv2d(x, w, E4M3, None, placeholder, geometry, bounds),
                device_fp8.fp8_matmul(a, b, E5M2, table.table, placeholder, bounds, budget=40),
                device_fp8.fp8_conv2d(x, w, E5M2, table.table, placeholder, geometry, bounds)]

    got = [t.numpy() for t in products(a, b, x, w, bounds)]
    expected = [exact.matmul(a, b, quant=exact.resolve_scheme(scheme)),
                exact.conv2d(x, w, geometry, quant=exact.resolve_scheme(scheme)),
                table.matmul(a, b, quant=table.resolve_scheme(scheme)),
                table.conv2d(x, w, geometry, quant=table.resolve_scheme(scheme))]
    for i, (g, e) in enumerate(zip(got, expected)):
        assert np.isnan(e).any() and np.isfinite(e).any()
        assert np.array_equal(np.isnan(g), np.isnan(e))
        if i >= 2:
            np.testing.assert_array_equal(g, e)
        else:
            keep = ~np.isnan(e)
            np.testing.assert_allclose(g[keep], e[keep], rtol=1e-5,
                                       atol=1e-5 * np.abs(e[keep]).max())
    # the range tensor is read, not the scheme's placeholder: another range, other outputs
    wider = exact.matmul(a, b, quant=exact.resolve_scheme(QuantScheme().with_range(-8.0, 8.0)))
    again = device_fp8.fp8_matmul(a, b, E4M3, None, placeholder, np.array([-8, 8], np.float32))
    keep = ~np.isnan(wider)
    np.testing.assert_allclose(np.asarray(again)[keep], wider[keep], rtol=1e-5,
                               atol=1e-5 * np.abs(wider[keep]).max())
    assert not np.allclose(wider[keep], expected[0][keep])


def _small_model(seed, depthwise=True):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6, 6, 2))
    x = keras.layers.Conv2D(3, 3, activation="relu", name="conv")(inputs)
    if depthwise:
        x = keras.layers.DepthwiseConv2D(3, name="depthwise")(x)
    x = keras.layers.Flatten()(x)
    return keras.Model(inputs, keras.layers.Dense(3, name="out")(x))


@pytest.mark.parametrize("spec", ["fp8_e4m3", "table"])
def test_swapped_model_forward_and_gradients_under_jit_equal_the_c_path(spec, tmp_path):
    if spec == "table":
        np.save(tmp_path / "mine.npy", _noisy_table(E5M2, 7))
        spec = f"fp8_e5m2:{tmp_path / 'mine.npy'}"
    model = _small_model(8)
    swapped = graphswap.rewrite_model(model, kernel=spec)
    assert all(xla.covers(xla.layer_arithmetic(layer)) for layer in swapped._flatten_layers()
               if xla.layer_arithmetic(layer) is not None)
    x = np.random.default_rng(9).normal(size=(4, 6, 6, 2)).astype(np.float32)

    def forward_and_gradients(batch):
        with tf.GradientTape() as tape:
            y = swapped(batch, training=False)
            loss = tf.reduce_sum(tf.square(y))
        return [y, *tape.gradient(loss, swapped.trainable_variables)]

    graph = tf.function(forward_and_gradients)
    ops_in_graph = {op.type for op in graph.get_concrete_function(x).graph.get_operations()}
    assert ops_in_graph & {"PyFunc", "PyFuncStateless"}     # the C path, outside XLA
    c_path = [t.numpy() for t in graph(x)]
    under_xla = [t.numpy() for t in tf.function(forward_and_gradients, jit_compile=True)(x)]
    assert len(c_path) == len(under_xla) == 7
    for got, expected in zip(under_xla, c_path):
        assert np.abs(expected).max() > 0
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())
    float_out = model(x).numpy()
    assert np.max(np.abs(under_xla[0] - float_out)) > 1e-4 * np.abs(float_out).max()  # FP8 ran


def test_keras_model_compiled_with_jit_compile_runs_predict_and_fit(monkeypatch):
    """A model holding FP8 layers, compiled with jit_compile=True: Keras keeps XLA (the device
    path covers them; on a CPU-only machine Keras XLA-compiles swapped layers only with
    GRAPHSWAP_BRIDGE=xla), predict and one fit step equal the C path's."""
    model = _small_model(10, depthwise=False)
    data = np.random.default_rng(11).uniform(0, 1, (8, 6, 6, 2)).astype(np.float32)
    labels = np.arange(8) % 3
    results = []
    for jit in (False, True):
        if jit:
            monkeypatch.setenv("GRAPHSWAP_BRIDGE", "xla")
        swapped = graphswap.rewrite_model(model, kernel="fp8_e4m3")
        assert xla.model_runs_in_xla(swapped) is jit or xla.accelerator_visible()
        swapped.compile(optimizer=keras.optimizers.SGD(0.1),
                        loss="sparse_categorical_crossentropy", jit_compile=jit)
        assert swapped.jit_compile is jit
        predicted = swapped.predict(data, verbose=0)
        swapped.fit(data, labels, batch_size=8, epochs=1, verbose=0, shuffle=False)
        results.append((predicted, [w.numpy() for w in swapped.trainable_variables]))
    monkeypatch.delenv("GRAPHSWAP_BRIDGE")
    (c_pred, c_weights), (x_pred, x_weights) = results
    np.testing.assert_allclose(x_pred, c_pred, rtol=1e-5, atol=1e-5 * np.abs(c_pred).max())
    start = [w.numpy() for w in graphswap.rewrite_model(model, kernel="fp8_e4m3")
             .trainable_variables]
    for c_w, x_w, s in zip(c_weights, x_weights, start):
        assert np.abs(c_w - s).max() > 1e-6                    # the step changed the weights
        np.testing.assert_allclose(x_w, c_w, rtol=1e-5, atol=1e-6)


def test_memory_bound_of_a_table_fp8_resnet50_layer():
    """ResNet-50's conv4 3x3 layer (256 -> 256 channels on 14 x 14) at batch 32 through a user's
    FP8 table: M x K x N would be 3.7e9 float32 (15 GB).  Every buffer of the XLA program is
    bounded by the block budget, the im2col codes (M x K) and the output (M x N)."""
    table = _random_table(12)
    scheme = Fp8Kernel(Fp8Spec(E4M3)).resolve_scheme(None)
    geometry = conv_geometry((32, 14, 14, 256), (3, 3, 256, 256), (1, 1), (1, 1), "same", 1)
    fn = tf.function(lambda x, w: device_fp8.fp8_conv2d(x, w, E4M3, table, scheme, geometry),
                     jit_compile=True)
    hlo = fn.experimental_get_compiler_ir(tf.TensorSpec((32, 14, 14, 256), tf.float32),
                                          tf.TensorSpec((3, 3, 256, 256), tf.float32))(stage="hlo")
    sizes = [int(np.prod([int(d) for d in dims.split(",") if d]))
             for dims in re.findall(r"(?:pred|[suf](?:8|16|32|64))\[([0-9,]*)\]", hlo)]
    m, k, n = 32 * 14 * 14, 9 * 256, 256
    assert max(sizes) <= max(device_products.DEFAULT_BUDGET, m * k, m * n) < m * k * n // 100
    mb, kc = device_products.block_shape(m, 1, k, n, device_products.DEFAULT_BUDGET)
    assert f"f32[{mb},1,{kc},{n}]" in hlo.replace(" ", "")   # the looked-up block: float32
