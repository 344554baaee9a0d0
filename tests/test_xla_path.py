"""The device path (graphswap/kernels/device_products.py, graphswap/swap/xla.py): the table-driven
products in keras.ops, compiled by XLA, against the C kernels bit for bit - every QuantScheme,
both signednesses, tables with nonzero T[a, 0], odd shapes, non-finite values, every swapped
layer type - forward and gradients under tf.function(jit_compile=True), one training step
against the C path's, the memory bound, and the errors where the path does not reach."""

from __future__ import annotations

import dataclasses
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import assert_close_to_roundoff, compile_library

import graphswap
from graphswap.errors import GraphswapError, KernelLoadError
from graphswap.kernels import LutKernel, QuantScheme, resolve_kernel
from graphswap.multipliers import builtin
from graphswap.native import conv_geometry
from graphswap.kernels import device_products as dp
from graphswap.swap import forward_op, xla
from graphswap.swap.xla import XlaCompilationError, model_runs_in_xla


def _random_table_kernel(signed: bool, seed: int = 3) -> LutKernel:
    """A multiplier whose table is random: nonzero T[a, 0] and T[0, b], negative entries - the
    cases the built-in tables never exercise."""
    base = builtin("mul8s_exact" if signed else "mul8u_exact")
    rng = np.random.default_rng(seed)
    table = rng.integers(-40000, 60000, 65536).astype(np.int32)
    return LutKernel(dataclasses.replace(base, table=table, spec=f"random_{int(signed)}",
                                         name=f"random_{int(signed)}"))


KERNELS = {"drum4": lambda: resolve_kernel("mul8u_drum4"),
           "trunc3s": lambda: resolve_kernel("mul8s_trunc3"),
           "random_u": lambda: _random_table_kernel(False),
           "random_s": lambda: _random_table_kernel(True)}
UNSIGNED_SCHEMES = [QuantScheme(), QuantScheme(granularity="per_tensor"),
                    QuantScheme(weights="asymmetric"),
                    QuantScheme(weights="asymmetric", granularity="per_tensor"),
                    QuantScheme().with_range(-0.7, 1.3),
                    QuantScheme(weights="asymmetric").with_range(0.25, 2.0)]
SIGNED_SCHEMES = [QuantScheme(), QuantScheme(granularity="per_tensor"),
                  QuantScheme().with_range(-0.7, 1.3)]


def _cases():
    for name in KERNELS:
        signed = name.endswith("s")
        for i, scheme in enumerate(SIGNED_SCHEMES if signed else UNSIGNED_SCHEMES):
            yield pytest.param(name, scheme, id=f"{name}-{i}")


def _operands(rng, shape, specials=False):
    t = rng.normal(size=shape).astype(np.float32) * 1.7
    if specials and t.size > 3:
        flat = t.reshape(-1)
        flat[1] = np.nan
        flat[-2] = np.inf
    return t


def _jit(fn):
    return tf.function(fn, jit_compile=True)


@pytest.mark.parametrize("name,scheme", list(_cases()))
def test_lut_matmul_bit_for_bit_with_the_c_kernels(name, scheme):
    kernel = KERNELS[name]()
    resolved = kernel.resolve_scheme(scheme)
    rng = np.random.default_rng(0)
    table = kernel.multiplier.table
    for m, k, n, specials in ((1, 1, 1, False), (9, 13, 3, True), (3, 70, 2, False)):
        a, b = _operands(rng, (m, k), specials), _operands(rng, (k, n), specials)
        expected = kernel.matmul(a, b, quant=resolved)
        np.testing.assert_array_equal(dp.lut_matmul(a, b, table, kernel.signed, resolved).numpy(),
                                      expected)
        if specials:
            assert np.isnan(expected).any() and np.isfinite(expected).any()
            # tiny blocks: several row blocks and K chunks, padded rows and taps
            small = dp.lut_matmul(a, b, table, kernel.signed, resolved, budget=7).numpy()
            np.testing.assert_array_equal(small, expected)


def test_products_compiled_by_xla_are_the_c_kernels_bit_for_bit():
    """One XLA program holding a matmul and a grouped, strided convolution of each signedness
    (XLA compiles are slow: one program for all), against the C kernels."""
    unsigned, signed = _random_table_kernel(False), KERNELS["trunc3s"]()
    schemes = {"u": unsigned.resolve_scheme(QuantScheme(weights="asymmetric").with_range(-1, 2)),
               "s": signed.resolve_scheme(QuantScheme(granularity="per_tensor"))}
    rng = np.random.default_rng(4)
    a, b = _operands(rng, (9, 21), True), _operands(rng, (21, 5))
    x, w = _operands(rng, (2, 9, 8, 6), True), _operands(rng, (3, 3, 3, 4))
    geometry = conv_geometry(x.shape, w.shape, (2, 1), (1, 1), "same", 2)

    @tf.function(jit_compile=True)
    def products(a, b, x, w):
        out = []
        for kernel, key in ((unsigned, "u"), (signed, "s")):
            table = kernel.multiplier.table
            out.append(dp.lut_matmul(a, b, table, kernel.signed, schemes[key], budget=40))
            out.append(dp.lut_conv2d(x, w, table, kernel.signed, schemes[key], geometry))
        return out

    got = [t.numpy() for t in products(a, b, x, w)]
    expected = [unsigned.matmul(a, b, quant=schemes["u"]),
                unsigned.conv2d(x, w, geometry, quant=schemes["u"]),
                signed.matmul(a, b, quant=schemes["s"]),
                signed.conv2d(x, w, geometry, quant=schemes["s"])]
    for g, e in zip(got, expected):
        assert np.isnan(e).any() and np.isfinite(e).any()
        np.testing.assert_array_equal(g, e)


def test_empty_operands_give_the_c_kernels_empty_or_zero_products():
    for name in ("drum4", "trunc3s"):
        kernel = KERNELS[name]()
        resolved = kernel.resolve_scheme(None)
        for m, k, n in ((0, 5, 3), (4, 0, 3)):
            a, b = np.ones((m, k), np.float32), np.ones((k, n), np.float32)
            got = dp.lut_matmul(a, b, kernel.multiplier.table, kernel.signed, resolved).numpy()
            np.testing.assert_array_equal(got, kernel.matmul(a, b, quant=resolved))
            assert got.shape == (m, n)
        got = dp.lut_matmul(np.ones((4, 5), np.float32), np.ones((5, 0), np.float32),
                            kernel.multiplier.table, kernel.signed, resolved)
        assert tuple(got.shape) == (4, 0)


CONVS = [  # input shape, filter shape, strides, dilations, padding, groups
    ((2, 9, 8, 6), (3, 3, 3, 4), (2, 1), (1, 1), "same", 2),
    ((1, 7, 7, 3), (2, 3, 3, 5), (1, 1), (2, 1), "valid", 1),
    ((2, 6, 5, 4), (3, 3, 1, 8), (1, 2), (1, 1), "same", 4),   # depthwise, multiplier 2
    ((1, 5, 5, 1), (5, 5, 1, 3), (1, 1), (1, 1), "same", 1),
]


@pytest.mark.parametrize("name,scheme", list(_cases()))
def test_lut_conv2d_bit_for_bit_with_the_c_kernels(name, scheme):
    kernel = KERNELS[name]()
    resolved = kernel.resolve_scheme(scheme)
    rng = np.random.default_rng(1)
    for i, (x_shape, w_shape, strides, dilations, padding, groups) in enumerate(CONVS):
        x, w = _operands(rng, x_shape, specials=i == 0), _operands(rng, w_shape)
        geometry = conv_geometry(x_shape, w_shape, strides, dilations, padding, groups)
        expected = kernel.conv2d(x, w, geometry, quant=resolved)
        got = dp.lut_conv2d(x, w, kernel.multiplier.table, kernel.signed, resolved, geometry)
        np.testing.assert_array_equal(got.numpy(), expected, err_msg=str(CONVS[i]))


def test_the_static_range_tensor_replaces_the_schemes_range_and_int64_sums_when_needed():
    kernel = _random_table_kernel(False)
    rng = np.random.default_rng(2)
    a, b = _operands(rng, (4, 40)), _operands(rng, (40, 3))
    scheme = kernel.resolve_scheme(QuantScheme(weights="asymmetric").with_range(-1.0, 2.5))
    placeholder = kernel.resolve_scheme(QuantScheme(weights="asymmetric").with_range(0.0, 1.0))
    got = dp.lut_matmul(a, b, kernel.multiplier.table, False, placeholder,
                        activation_range=np.array([-1.0, 2.5], np.float32))
    np.testing.assert_array_equal(got.numpy(), kernel.matmul(a, b, quant=scheme))
    assert dp.sum_dtype(kernel.multiplier.table, 4608, True) == "int32"
    assert dp.sum_dtype(kernel.multiplier.table, 40000, True) == "int64"
    # K large enough for int64 sums: still the C kernel's numbers
    a, b = _operands(rng, (2, 9000)), _operands(rng, (9000, 2))
    assert dp.sum_dtype(kernel.multiplier.table, 9000, True) == "int64"
    got = dp.lut_matmul(a, b, kernel.multiplier.table, False, scheme)
    np.testing.assert_array_equal(got.numpy(), kernel.matmul(a, b, quant=scheme))


@pytest.mark.parametrize("spec", ["bf16", "fp32_m7", "fp32_m1"])
def test_float_kernels_round_operands_bit_for_bit_and_multiply_within_roundoff(spec):
    from graphswap.kernels import round_to_bfloat16, truncate_mantissa
    rng = np.random.default_rng(3)
    values = np.concatenate([rng.normal(size=500).astype(np.float32) * 1e3,
                             np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 3.4e38],
                                      np.float32)])
    reference = (round_to_bfloat16(values) if spec == "bf16"
                 else truncate_mantissa(values, int(spec[6:])))
    rounded = _jit(dp.operand_rounding(spec))(values).numpy()
    np.testing.assert_array_equal(rounded.view(np.uint32), reference.view(np.uint32))
    kernel = resolve_kernel(spec)
    a, b = _operands(rng, (6, 33)), _operands(rng, (33, 4))
    got = _jit(lambda a, b: xla.device_matmul(kernel, a, b))(a, b).numpy()
    assert_close_to_roundoff(got, kernel.matmul(a, b), terms=33)
    x, w = _operands(rng, (2, 6, 6, 3)), _operands(rng, (3, 3, 3, 4))
    geometry = conv_geometry(x.shape, w.shape, (1, 1), (1, 1), "same", 1)
    got = _jit(lambda x, w: xla.device_conv2d(kernel, x, w, geometry))(x, w).numpy()
    assert_close_to_roundoff(got, kernel.conv2d(x, w, geometry), terms=27)


def _every_type_model(recurrent=True):
    keras.utils.set_random_seed(4)
    inputs = keras.Input((6, 6, 3), name="image")
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv")(inputs)
    x = keras.layers.DepthwiseConv2D(3, padding="same", name="depthwise")(x)
    x = keras.layers.SeparableConv2D(4, 3, padding="same", name="separable")(x)
    x = keras.layers.Conv2DTranspose(4, 3, strides=2, padding="same", name="transpose")(x)
    x = keras.layers.Reshape((36, 16), name="tokens")(x)
    x = keras.layers.Conv1D(4, 3, padding="same", name="conv1d")(x)
    x = keras.layers.MultiHeadAttention(2, 4, name="attention")(x, x)
    x = keras.layers.EinsumDense("btc,cd->btd", (36, 4), name="einsum")(x)
    if recurrent:
        x = keras.layers.GRU(3, return_sequences=True, name="gru")(x)
        x = keras.layers.SimpleRNN(3, name="rnn")(x)
    else:
        x = keras.layers.Flatten(name="flat")(x)
    return keras.Model(inputs, keras.layers.Dense(3, name="out")(x))


def test_every_swapped_layer_type_under_jit_equals_the_c_path():
    """One XLA program (compiles are slow) holding every swapped type, recurrent ones too."""
    model = _every_type_model()
    swapped = graphswap.rewrite_model(model, kernel="mul8u_drum4")
    assert all(xla.covers(xla.layer_arithmetic(layer)) for layer in swapped._flatten_layers()
               if xla.layer_arithmetic(layer) is not None)
    x = np.random.default_rng(5).uniform(-1, 1, (2, 6, 6, 3)).astype(np.float32)
    c_path = swapped(x, training=False).numpy()
    graph = tf.function(lambda batch: swapped(batch, training=False))
    compiled = tf.function(lambda batch: swapped(batch, training=False), jit_compile=True)
    np.testing.assert_array_equal(graph(x).numpy(), c_path)
    xla_out = compiled(x).numpy()
    # each layer's product and epilogue (correction, bias, ReLU) is the C path's bit for bit
    # (test_xla_bit_identity.py); the Keras float parts between them (attention's softmax,
    # recurrent gates) are XLA's code, so equal within round-off
    np.testing.assert_allclose(xla_out, c_path, rtol=2e-4, atol=2e-5)
    assert np.max(np.abs(xla_out - model(x).numpy())) > 1e-4   # the multiplier really ran
    ops_in_graph = {op.type for op in graph.get_concrete_function(x).graph.get_operations()}
    assert "GraphswapForward" in ops_in_graph or "PyFunc" in ops_in_graph


def test_dense_and_conv_outputs_under_jit_are_bit_for_bit():
    keras.utils.set_random_seed(6)
    inputs = keras.Input((7, 7, 2))
    x = keras.layers.Conv2D(5, 3, strides=2, name="conv")(inputs)
    x = keras.layers.Flatten()(x)
    model = keras.Model(inputs, keras.layers.Dense(4, use_bias=False, name="out")(x))
    swapped = graphswap.rewrite_model(model, kernel="mul8s_trunc3")
    x = np.random.default_rng(7).normal(size=(3, 7, 7, 2)).astype(np.float32)
    compiled = tf.function(lambda b: swapped(b, training=False), jit_compile=True)
    np.testing.assert_array_equal(compiled(x).numpy(), swapped(x, training=False).numpy())


def test_gradients_under_jit_equal_the_c_paths():
    keras.utils.set_random_seed(8)
    inputs = keras.Input((6, 6, 2))
    x = keras.layers.Conv2D(3, 3, activation="relu", name="conv")(inputs)
    x = keras.layers.DepthwiseConv2D(3, name="depthwise")(x)
    x = keras.layers.Flatten()(x)
    model = keras.Model(inputs, keras.layers.Dense(2, name="out")(x))
    swapped = graphswap.rewrite_model(model, kernel="mul8u_drum4")
    x = np.random.default_rng(9).normal(size=(4, 6, 6, 2)).astype(np.float32)

    def gradients(batch):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(swapped(batch, training=False)))
        return tape.gradient(loss, swapped.trainable_variables)

    c_path = [g.numpy() for g in tf.function(gradients)(x)]
    under_xla = [g.numpy() for g in tf.function(gradients, jit_compile=True)(x)]
    assert len(c_path) == len(under_xla) == 6
    for got, expected in zip(under_xla, c_path):
        assert np.abs(expected).max() > 0
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())


def test_one_training_step_under_xla_equals_the_c_paths(monkeypatch):
    keras.utils.set_random_seed(10)
    inputs = keras.Input((6, 6, 1))
    x = keras.layers.Conv2D(3, 3, activation="relu", name="conv")(inputs)
    x = keras.layers.Flatten()(x)
    model = keras.Model(inputs, keras.layers.Dense(3, name="out")(x))
    data = np.random.default_rng(11).uniform(0, 1, (8, 6, 6, 1)).astype(np.float32)
    labels = np.arange(8) % 3
    weights = []
    for jit in (False, True):
        if jit:  # Keras XLA-compiles swapped layers on a CPU-only machine only when asked
            monkeypatch.setenv("GRAPHSWAP_BRIDGE", "xla")
        swapped = graphswap.rewrite_model(model, kernel="mul8u_drum4")
        swapped.compile(optimizer=keras.optimizers.SGD(0.1),
                        loss="sparse_categorical_crossentropy", jit_compile=jit)
        assert swapped.jit_compile is jit
        swapped.train_on_batch(data, labels)
        weights.append([w.numpy() for w in swapped.trainable_variables])
    monkeypatch.delenv("GRAPHSWAP_BRIDGE")
    before = [w.numpy() for w in graphswap.rewrite_model(model, kernel="mul8u_drum4")
              .trainable_variables]
    for c_path, under_xla, start in zip(*weights, before):
        assert np.abs(c_path - start).max() > 1e-6       # the step changed the weights
        np.testing.assert_allclose(under_xla, c_path, rtol=1e-5, atol=1e-6)


def test_memory_bound_of_a_resnet50_layer():
    """ResNet-50's conv4 3x3 layer (256 -> 256 channels on 14 x 14) at batch 32: M x K x N would
    be 6272 x 2304 x 256 = 3.7e9 elements (15 GB of int32).  Every buffer of the XLA program is
    read from its HLO and bounded by the block budget, the im2col codes (M x K) and the output."""
    kernel = resolve_kernel("mul8u_drum4")
    scheme = kernel.resolve_scheme(None)
    x_spec = tf.TensorSpec((32, 14, 14, 256), tf.float32)
    w_spec = tf.TensorSpec((3, 3, 256, 256), tf.float32)
    geometry = conv_geometry((32, 14, 14, 256), (3, 3, 256, 256), (1, 1), (1, 1), "same", 1)
    fn = tf.function(lambda x, w: dp.lut_conv2d(x, w, kernel.multiplier.table, False, scheme,
                                                geometry), jit_compile=True)
    hlo = fn.experimental_get_compiler_ir(x_spec, w_spec)(stage="hlo")
    sizes = [int(np.prod([int(d) for d in dims.split(",") if d]))
             for dims in re.findall(r"[suf](?:8|16|32|64)\[([0-9,]*)\]", hlo)]
    m, k, n = 32 * 14 * 14, 9 * 256, 256
    largest = max(sizes)
    assert largest <= max(dp.DEFAULT_BUDGET, m * k, m * n) < m * k * n // 100
    mb, kc = dp.block_shape(m, 1, k, n, dp.DEFAULT_BUDGET)
    assert mb * kc * n <= dp.DEFAULT_BUDGET
    assert f"{mb},1,{kc},{n}]" in hlo.replace(" ", "")   # the looked-up block is the budget's


def test_user_library_kernel_still_refuses_xla_with_graphswaps_error(tmp_path):
    source = """
    #include <stdint.h>
    #include "graphswap_kernels.h"
    GRAPHSWAP_EXPORT int32_t graphswap_abi_version(void) { return GRAPHSWAP_ABI_VERSION; }
    GRAPHSWAP_EXPORT int32_t graphswap_matmul_f32(const float *a, const float *b, float *c,
                                                 int64_t m, int64_t k, int64_t n) {
        for (int64_t i = 0; i < m; ++i) for (int64_t j = 0; j < n; ++j) {
            float s = 0; for (int64_t t = 0; t < k; ++t) s += a[i * k + t] * b[t * n + j];
            c[i * n + j] = s; }
        return 0; }
    """
    library = compile_library(tmp_path, "userlib", source)
    graphswap.kernels.trust_file(str(library))
    keras.utils.set_random_seed(12)
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(2, name="dense")(inputs))
    swapped = graphswap.rewrite_model(model, kernel=str(library))
    assert not model_runs_in_xla(swapped)
    compiled = tf.function(lambda b: swapped(b), jit_compile=True)
    with pytest.raises(XlaCompilationError, match=r"layer 'dense' cannot run inside "
                                                  r"tf.function\(jit_compile=True\).*XLA path "
                                                  r"covers multiplier tables"):
        compiled(np.ones((2, 4), np.float32))


def test_lut_grad_gradient_under_jit_runs_on_the_device_path():
    """backward="lut_grad" inside tf.function(jit_compile=True): forward and gradients on the
    device path (graphswap/kernels/device_gradients.py; tests/test_device_gradients.py holds
    them to the C path), where they used to raise."""
    keras.utils.set_random_seed(13)
    inputs = keras.Input((5,))
    model = keras.Model(inputs, keras.layers.Dense(2, name="dense")(inputs))
    swapped = graphswap.rewrite_model(model, kernel="mul8u_drum4", backward="lut_grad")
    # Keras XLA-compiles it where XLA is what the machine runs (an accelerator)
    assert model_runs_in_xla(swapped) is xla.accelerator_visible()
    x = np.random.default_rng(13).normal(size=(4, 5)).astype(np.float32)
    forward = tf.function(lambda b: swapped(b), jit_compile=True)
    np.testing.assert_array_equal(forward(x).numpy(), swapped(x).numpy())  # forward runs

    def step(batch):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(swapped(batch) * tf.constant([1.0, -1.0]))
        return tape.gradient(loss, swapped.trainable_variables)

    c_path = tf.function(step)(x)
    for want, got in zip(c_path, tf.function(step, jit_compile=True)(x)):
        assert_close_to_roundoff(got.numpy(), want.numpy(), terms=4)


def test_graphswap_bridge_xla_forces_the_device_path(monkeypatch):
    keras.utils.set_random_seed(14)
    inputs = keras.Input((6, 6, 2))
    x = keras.layers.Conv2D(3, 3, name="conv")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2, name="out")(x))
    swapped = graphswap.rewrite_model(model, kernel="mul8s_trunc3")
    x = np.random.default_rng(15).normal(size=(2, 6, 6, 2)).astype(np.float32)
    c_path = swapped(x, training=False).numpy()
    monkeypatch.setenv("GRAPHSWAP_BRIDGE", "xla")
    traced = tf.function(lambda b: swapped(b, training=False))
    graph_ops = {op.type for op in traced.get_concrete_function(x).graph.get_operations()}
    assert not graph_ops & {"GraphswapForward", "PyFunc", "EagerPyFunc"}
    np.testing.assert_array_equal(traced(x).numpy(), c_path)
    monkeypatch.setenv("GRAPHSWAP_BRIDGE", "gpu")
    with pytest.raises(KernelLoadError, match=r"GRAPHSWAP_BRIDGE='gpu' is not one of .*'xla' "
                                              r"the XLA-compilable device path"):
        forward_op.bridge_mode()


def test_saved_model_runs_on_either_path(tmp_path, monkeypatch):
    """Nothing of the path is saved: a file converted on the C path, and one converted with
    GRAPHSWAP_BRIDGE=xla (which keeps the original's jit_compile=True), give the same outputs,
    the second predicted by Keras under XLA."""
    keras.utils.set_random_seed(16)
    inputs = keras.Input((5, 5, 1))
    x = keras.layers.Conv2D(2, 3, name="conv")(inputs)
    x = keras.layers.Flatten()(x)
    model = keras.Model(inputs, keras.layers.Dense(2, name="out")(x))
    model.compile(loss="mse", jit_compile=True)
    path = tmp_path / "model.keras"
    model.save(path)
    x = np.random.default_rng(17).normal(size=(3, 5, 5, 1)).astype(np.float32)
    c_file = tmp_path / "c.keras"
    graphswap.convert(str(path), "mul8u_drum4", output=str(c_file))
    c_model = keras.models.load_model(c_file)
    expected = c_model(x, training=False).numpy()
    monkeypatch.setenv("GRAPHSWAP_BRIDGE", "xla")
    xla_file = tmp_path / "xla.keras"
    graphswap.convert(str(path), "mul8u_drum4", output=str(xla_file))
    reloaded = keras.models.load_model(xla_file)
    assert reloaded.jit_compile is True and c_model.jit_compile is xla.accelerator_visible()
    np.testing.assert_array_equal(reloaded.predict(x, verbose=0), expected)  # under XLA
    monkeypatch.delenv("GRAPHSWAP_BRIDGE")
    np.testing.assert_array_equal(reloaded(x, training=False).numpy(), expected)  # C path
    assert isinstance(XlaCompilationError("x"), GraphswapError)


@pytest.mark.parametrize("signed,bits", [(False, 4), (True, 4), (False, 2)])
def test_8xn_multipliers_bit_for_bit_with_the_c_kernels(signed, bits):
    """8xN multipliers (N-bit weight codes in the same 256 x 256 table) on the device path."""
    random = _random_table_kernel(signed).multiplier
    kernel = LutKernel(dataclasses.replace(random, weight_bits=bits, spec=f"{random.spec}:8x{bits}"))
    rng = np.random.default_rng(bits)
    schemes = [None] if signed else [None, QuantScheme(weights="asymmetric")]
    for scheme in schemes:
        resolved = kernel.resolve_scheme(scheme)
        a, b = _operands(rng, (5, 17), True), _operands(rng, (17, 4))
        got = dp.lut_matmul(a, b, kernel.multiplier.table, signed, resolved, weight_bits=bits)
        np.testing.assert_array_equal(got.numpy(), kernel.matmul(a, b, quant=resolved))
        x, w = _operands(rng, (1, 6, 5, 4)), _operands(rng, (3, 3, 2, 4))
        geometry = conv_geometry(x.shape, w.shape, (1, 1), (1, 1), "same", 2)
        got = dp.lut_conv2d(x, w, kernel.multiplier.table, signed, resolved, geometry,
                            weight_bits=bits)
        np.testing.assert_array_equal(got.numpy(), kernel.conv2d(x, w, geometry, quant=resolved))
