"""QuantScheme.activation_zero_point = -128: a signed multiplier's non-negative inputs on all 256
codes (TFLite int8's zero point for a ReLU output; graphswap/kernels/scheme.py).  The definition
checked against an independent per-product reference; every path (the fused C kernels, numpy, the
XLA / device path, save and reload) runs the same sums; the exact reference counts q * w; the
measured wiring takes it where it cuts a layer's error; lut_grad refuses it clearly."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import graphswap
from conftest import SAMPLE_MODEL, table_paths
from graphswap.errors import QuantizationError
from graphswap.kernels import QuantScheme, device_products, resolve_kernel
from graphswap.kernels.derivatives import lut_matmul_gradients
from graphswap.kernels.scheme import wired_table
from graphswap.native import conv_geometry
from graphswap.swap.calibration import quantizing_layers
from test_activation_offset import SIGNED_VALUES, flooring, lut_file

HI = 1.7


def zero_point_scheme(**extra) -> QuantScheme:
    return QuantScheme(activations="static", activation_range=(0.0, HI),
                       activation_zero_point=-128, **extra).resolve(True)


def reference_matmul(a, b, table, offset=0):
    """The definition, product by product: q = clip(rint(a / s), 0, 255), s = hi / 255; symmetric
    per-channel weights; each product T[clip(q - 128 + o)][w] - T[clip(-128 + o)][w]."""
    table = np.asarray(table, np.int64).reshape(256, 256)
    sa = np.float64(np.float32(HI)) / 255
    qa = np.clip(np.rint(a.astype(np.float64) / sa), 0, 255).astype(np.int64)
    amax = np.abs(b.astype(np.float64)).max(axis=0)
    sb = np.where(amax > 0, amax / 127, 1.0)
    qb = np.clip(np.rint(b.astype(np.float64) / sb), -127, 127).astype(np.int64)
    out = np.zeros((a.shape[0], b.shape[1]))
    zero_row = min(127, max(-128, -128 + offset)) & 0xFF
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            total = 0
            for k in range(a.shape[1]):
                row = min(127, max(-128, int(qa[i, k]) - 128 + offset)) & 0xFF
                total += table[row, qb[k, j] & 0xFF] - table[zero_row, qb[k, j] & 0xFF]
            out[i, j] = total
    return (out * (sa * sb)[None, :]).astype(np.float32)


def test_the_scheme_is_checked_and_saved():
    scheme = zero_point_scheme()
    assert QuantScheme.from_config(scheme.to_config()) == scheme
    assert "activation_zero_point" not in QuantScheme().to_config()   # older files unchanged
    assert "activation zero point -128" in scheme.describe()
    assert scheme.dynamic().activation_zero_point == 0
    with pytest.raises(QuantizationError, match="must be 0 or -128"):
        QuantScheme(activations="static", activation_zero_point=-5)
    with pytest.raises(QuantizationError, match="needs static activations"):
        QuantScheme(activation_zero_point=-128)
    with pytest.raises(QuantizationError, match=r"for signed \(mul8s\) multipliers"):
        QuantScheme(activations="static", activation_zero_point=-128).resolve(False)


def test_the_wired_table_gives_every_code_a_level():
    exact = np.outer(SIGNED_VALUES, SIGNED_VALUES)
    weights = SIGNED_VALUES[None, :]
    # the exact table: q * w for unsigned q, so the exact reference counts the codes
    np.testing.assert_array_equal(wired_table(exact, "activation_first", 0, True, -128),
                                  np.arange(256)[:, None] * weights)
    # mul8s_1L1G's kind: 8 floor(a / 8) on 0..255 - 32 levels where codes 0..127 had 16
    floored = flooring(8, signed=True).reshape(256, 256)
    wired = wired_table(floored, "activation_first", 0, True, -128)
    np.testing.assert_array_equal(wired, (np.arange(256)[:, None] // 8 * 8) * (weights // 8 * 8))
    assert not wired[0].any()                                   # a zero input adds nothing


@pytest.mark.parametrize("offset", [0, 4])
def test_every_path_computes_the_definition(tmp_path, offset, each_isa):
    rng = np.random.default_rng(offset)
    table = flooring(8, signed=True) + rng.integers(-40, 40, 65536)
    kernel = resolve_kernel(lut_file(tmp_path, "floor8n", table, True))
    a = rng.uniform(-0.2, 2.0, (5, 19)).astype(np.float32)     # clipped below 0 and above HI
    a[a < 0.3] = 0.0
    b = rng.normal(size=(19, 4)).astype(np.float32)
    scheme = zero_point_scheme(activation_offset=offset)
    expected = reference_matmul(a, b, table, offset)
    for label in table_paths(each_isa):      # every ISA path this CPU runs, factored or not
        np.testing.assert_array_equal(kernel.matmul(a, b, scheme), expected, err_msg=label)
    kernel._fused = False                                        # the numpy pipeline
    try:
        np.testing.assert_array_equal(kernel.matmul(a, b, scheme), expected)
    finally:
        kernel._fused = True
    device = device_products.lut_matmul(a, b, kernel.wired(scheme).multiplier.table, True, scheme)
    np.testing.assert_array_equal(np.asarray(device), expected)
    # the exact reference counts the unsigned codes: q * w, within the codes' rounding of a @ b
    exact = kernel.exact_products().matmul(a, b, scheme)
    clipped = a.clip(0, HI)
    bound = (HI / 255 / 2) * np.abs(b).sum(axis=0)[None, :] + \
        clipped.sum(axis=1)[:, None] * (np.abs(b).max(axis=0) / 254)[None, :]
    assert (np.abs(exact - clipped @ b) <= bound + 1e-4).all()


def test_a_padded_convolution_agrees_on_every_path(tmp_path, each_isa):
    rng = np.random.default_rng(3)
    table = flooring(8, signed=True) + rng.integers(-40, 40, 65536)
    kernel = resolve_kernel(lut_file(tmp_path, "floor8c", table, True))
    x = np.maximum(rng.normal(0.5, 0.6, (2, 7, 7, 3)), 0).astype(np.float32)
    w = rng.normal(size=(3, 3, 3, 5)).astype(np.float32)
    g = conv_geometry(x.shape, w.shape, (1, 1), (1, 1), "same", 1)
    scheme = zero_point_scheme()
    fused = kernel.conv2d(x, w, g, scheme)
    for label in table_paths(each_isa):
        np.testing.assert_array_equal(kernel.conv2d(x, w, g, scheme), fused, err_msg=label)
    kernel._fused = False
    try:
        np.testing.assert_array_equal(kernel.conv2d(x, w, g, scheme), fused)
    finally:
        kernel._fused = True
    device = device_products.lut_conv2d(x, w, kernel.wired(scheme).multiplier.table, True,
                                        scheme, g)
    np.testing.assert_array_equal(np.asarray(device), fused)
    # the padding taps are zero inputs: through the exact table the sum is the convolution of
    # the codes' values, padding included as 0
    exact = kernel.exact_products().conv2d(x, w, g, scheme)
    want = tf.nn.conv2d(np.minimum(x, HI), w, 1, "SAME").numpy()
    assert np.abs(exact - want).max() <= 0.05 * np.abs(want).max()


def test_the_c_kernels_refuse_the_unsigned_codes_outside_their_mode():
    """GRAPHSWAP_LUT_SIGNED_UNSIGNED_ACTIVATIONS: static activations, zero point 0, 8 bits only."""
    from graphswap import native
    from graphswap.errors import GraphswapError
    from graphswap.kernels.quantized import fused_quant
    library = native.shipped_library()
    table = np.arange(65536, dtype=np.int32) % 7
    a, b = np.ones((2, 3), np.float32), np.ones((3, 2), np.float32)
    good = fused_quant(zero_point_scheme(), True)
    assert good.scheme == native.LUT_SIGNED_UNSIGNED_ACTIVATIONS
    assert good.activation_zero_point == 0 and good.activation_scale == float(np.float32(HI)) / 255
    library.lut_matmul_f32(a, b, table, good)
    for field, value in (("activation_mode", native.QUANT_DYNAMIC), ("activation_zero_point", 3),
                         ("weight_bits", 4)):
        bad = fused_quant(zero_point_scheme(), True)
        setattr(bad, field, value)
        with pytest.raises(GraphswapError, match="needs STATIC activations with zero point 0"):
            library.lut_matmul_f32(a, b, table, bad)


def test_lut_grad_refuses_the_zero_point(tmp_path):
    kernel = resolve_kernel("mul8s_trunc3")
    a = np.ones((2, 3), np.float32)
    b = np.ones((3, 2), np.float32)
    with pytest.raises(QuantizationError, match="lut_grad' does not run activation_zero_point"):
        lut_matmul_gradients(kernel, a, b, np.ones((2, 2), np.float32), quant=zero_point_scheme())


def test_swapped_layers_keep_it_through_xla_and_a_reload(tmp_path, digits):
    spec = lut_file(tmp_path, "floor8z", flooring(8, signed=True), True)
    model = keras.models.load_model(SAMPLE_MODEL)
    x = digits["x_test"][:24].astype(np.float32)
    swapped = graphswap.rewrite_model(model, kernel=spec, calibration_data=x,
                                      bias_correction=None, dynamic_fallback=False,
                                      operands="activation_first")
    before = np.asarray(swapped(x))
    for _, layer in quantizing_layers(swapped):
        scheme = layer.current_quantization()
        lo, hi = scheme.activation_range
        layer.set_quantization(QuantScheme.from_config(
            {**scheme.to_config(), "activation_range": [0.0, hi], "activation_zero_point": -128}))
    moved = np.asarray(swapped(x))
    assert not np.array_equal(moved, before)
    jitted = tf.function(lambda b: swapped(b, training=False), jit_compile=True)
    np.testing.assert_allclose(np.asarray(jitted(x)), moved, rtol=0, atol=1e-6)
    path = tmp_path / "zero_point.keras"
    swapped.save(path)
    reloaded = keras.models.load_model(path)
    np.testing.assert_array_equal(np.asarray(reloaded(x)), moved)
    assert {layer.current_quantization().activation_zero_point
            for _, layer in quantizing_layers(reloaded)} == {-128}


def test_the_measured_wiring_takes_it_for_a_flooring_signed_circuit(tmp_path, digits):
    model = keras.models.load_model(SAMPLE_MODEL)
    x = digits["x_train"][:160].astype(np.float32)
    spec = lut_file(tmp_path, "floor8w", flooring(8, signed=True), True)
    moved, report = graphswap.rewrite_model(model, kernel=spec, calibration_data=x,
                                            return_report=True, dynamic_fallback=False,
                                            weight_tuning=True)
    chosen = [layer.current_quantization().activation_zero_point
              for _, layer in quantizing_layers(moved)]
    line = next(note for note in report.notes if note.startswith("operand wiring"))
    assert chosen.count(-128) >= 2, line
    assert f"{chosen.count(-128)} take the activation zero point -128" in line
