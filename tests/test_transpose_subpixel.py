"""Conv2DTranspose through graphswap's compiled op in the sub-pixel formulation
(graphswap.native.transpose.subpixel_plan, graphswap.swap.ops_layers): one stride-1 convolution
per phase of the input itself (merged into one convolution where the zero weights that takes are
exact), or the input gradient of the forward convolution (graphswap's exact kernel, factored
tables).  The plan is checked against Keras' own transposed convolution in
float64; the swapped layer's table-driven results against tests/reference.py's quantized
convolution of the zero-inserted input, bit for bit - on inputs whose activation zero point makes
the dropped products vanish (the sub-pixel path) and on inputs where it does not (the
zero-inserted fallback), with every weight encoding, a static range, and non-finite values."""

from __future__ import annotations

import itertools

import keras
import numpy as np
import pytest

import reference
from graphswap import SwappedConv2DTranspose
from graphswap.errors import ShapeError
from graphswap.kernels import resolve_multiplier
from graphswap.native import flipped_filter, insert_zeros, transposed_conv
from graphswap.native.transpose import (merged_filter, merged_subpixel, subpixel_filter,
                                        subpixel_plan)

RNG = np.random.default_rng(26)


def _valid_conv(x, f):
    """float64 stride-1 VALID NHWC x HWIO convolution, tap by tap."""
    _, h, w, _ = x.shape
    kh, kw = f.shape[:2]
    out = 0.0
    for i, j in itertools.product(range(kh), range(kw)):
        out = out + np.einsum("nhwc,co->nhwo", x[:, i:i + h - kh + 1, j:j + w - kw + 1], f[i, j])
    return out


def _small_geometries():
    """(x, kernel, stride, plan, Keras' transposed convolution of x) for every small geometry
    (sizes, kernels, strides, paddings, output paddings) with a sub-pixel plan."""
    for h, w, k, s, padding, extra in itertools.product((1, 2, 5), (1, 4), (1, 2, 3, 5),
                                                        (1, 2, 3), ("same", "valid"),
                                                        (None, 0, 1, 2)):
        if extra is not None and extra >= s:
            continue
        x = RNG.standard_normal((2, h, w, 3))
        kernel = RNG.standard_normal((k, k, 4, 3))
        output_padding = None if extra is None else (extra, extra)
        try:
            plan = subpixel_plan(x.shape, kernel.shape, (s, s), padding, output_padding)
        except ShapeError:   # not a transposed convolution (TensorFlow refuses it too)
            continue
        if plan is None:   # a phase without taps (k < s) or without outputs: zero-inserted
            assert k < s or min(h, w) < 3
            continue
        yield x, kernel, s, plan, keras.ops.conv_transpose(
            x.astype(np.float32), kernel.astype(np.float32), (s, s), padding,
            output_padding).numpy()


def test_subpixel_plan_is_keras_conv_transpose_for_every_small_geometry():
    checked = 0
    for x, kernel, s, plan, want in _small_geometries():
        h, w = x.shape[1:3]
        blocks_h, blocks_w = plan.blocks
        out = np.zeros((2, blocks_h, s, blocks_w, s, 4))
        for row, column in itertools.product(plan.rows, plan.columns):
            part = x[:, max(-row.pad_before, 0):h - max(-row.pad_after, 0),
                     max(-column.pad_before, 0):w - max(-column.pad_after, 0)]
            part = np.pad(part, [(0, 0), (max(row.pad_before, 0), max(row.pad_after, 0)),
                                 (max(column.pad_before, 0), max(column.pad_after, 0)), (0, 0)])
            y = _valid_conv(part, subpixel_filter(kernel, row, column, (s, s)))
            assert y.shape[1:3] == (row.outputs, column.outputs)
            out[:, :row.outputs, row.residue, :column.outputs, column.residue] = y
        out = out.reshape(2, blocks_h * s, blocks_w * s, 4)
        out = out[:, :plan.output_height, :plan.output_width]
        assert out.shape == want.shape
        np.testing.assert_allclose(out, want, atol=2e-4)
        checked += 1
    assert checked > 200
    # the decoder's layers have one
    assert subpixel_plan((16, 6, 6, 64), (3, 3, 64, 64), (2, 2), "same") is not None


def test_merged_subpixel_is_keras_conv_transpose_for_every_small_geometry():
    """The phases merged into one stride-1 convolution (zero weights padding each phase's taps
    to the common window, phase-major output channels, depth to space after) against Keras'
    transposed convolution, cropping phases included."""
    checked = 0
    for x, kernel, s, plan, want in _small_geometries():
        merged = merged_subpixel(plan, *x.shape[1:3])
        rows, columns = merged.rows, merged.columns
        assert min(rows.pad_before, rows.pad_after, columns.pad_before, columns.pad_after) >= 0
        padded = np.pad(x, [(0, 0), (rows.pad_before, rows.pad_after),
                            (columns.pad_before, columns.pad_after), (0, 0)])
        y = _valid_conv(padded, merged_filter(kernel, merged))
        assert y.shape[1:] == (rows.outputs, columns.outputs, s * s * 4)
        blocks_h, blocks_w = plan.blocks
        y = y[:, rows.shift:rows.shift + blocks_h, columns.shift:columns.shift + blocks_w]
        y = y.reshape(2, blocks_h, blocks_w, s, s, 4).transpose(0, 1, 3, 2, 4, 5)
        y = y.reshape(2, blocks_h * s, blocks_w * s, 4)[:, :plan.output_height,
                                                        :plan.output_width]
        np.testing.assert_allclose(y, want, atol=2e-4)
        checked += 1
    assert checked > 200
    # the decoder's 3x3 stride-2 layers: a 2x2 window, no output shift or crop
    merged = merged_subpixel(subpixel_plan((16, 6, 6, 64), (3, 3, 64, 64), (2, 2), "same"), 6, 6)
    assert (merged.rows.taps, merged.rows.shift, merged.rows.outputs) == (2, 0, 6)


def test_zero_weight_exact_names_the_kernels_whose_merged_phases_keep_the_sums():
    from graphswap import native
    from graphswap.kernels import resolve_kernel
    from graphswap.kernels.float_kernels import LibraryKernel
    from graphswap.kernels.scheme import QuantScheme
    from graphswap.swap.ops_transposed import zero_weight_exact

    assert zero_weight_exact(resolve_kernel("exact"), None)
    # a user's operation-level library may do anything with a zero weight
    user = LibraryKernel(native.shipped_library(), "/x/mine.so", "mine", path="/x/mine.so",
                         sha256="0" * 64)
    assert not zero_weight_exact(user, None)
    asymmetric = QuantScheme(weights="asymmetric")
    drum = resolve_kernel("mul8u_drum4")
    assert not resolve_multiplier("mul8u_drum4").table.reshape(256, 256)[:, 0].any()
    assert zero_weight_exact(drum, None) and zero_weight_exact(drum, QuantScheme())
    # asymmetric weights: the zero point moves, so every column must be exact
    assert not zero_weight_exact(drum, asymmetric)
    assert zero_weight_exact(resolve_kernel("mul8u_exact"), asymmetric)


def _zero_inserted_reference(layer, x, mult, kwargs, mode=None):
    plan = transposed_conv(x.shape, layer.kernel.shape, layer.strides, kwargs.get("padding"),
                           layer.output_padding)
    g = plan.geometry
    return reference.quantized_conv2d(insert_zeros(x, plan), flipped_filter(layer.kernel.numpy()),
                                      mult.table, mult.signed, (1, 1), (1, 1),
                                      (g.pad_top, g.pad_bottom, g.pad_left, g.pad_right), 1, mode)


GEOMETRIES = [
    dict(kernel_size=3, strides=2, padding="same"),
    dict(kernel_size=4, strides=2, padding="same"),
    dict(kernel_size=3, strides=3, padding="valid", output_padding=2),
    dict(kernel_size=(3, 2), strides=(2, 1), padding="valid", output_padding=(1, 0)),
    dict(kernel_size=5, strides=2, padding="same"),
]
MODES = [None, {"weights": "asymmetric", "granularity": "per_tensor"},
         {"weights": "sign_magnitude", "granularity": "per_tensor"}]


@pytest.mark.parametrize("kwargs", GEOMETRIES)
@pytest.mark.parametrize("name,mode", [("mul8s_drum4", None), ("mul8u_exact", None),
                                       ("mul8u_mitchell", None)]
                         + [("mul8u_drum4", m) for m in MODES])
@pytest.mark.parametrize("inputs", ["relu", "signed"])
def test_lut_conv2d_transpose_is_bit_identical_to_the_zero_inserted_convolution(
        kwargs, name, mode, inputs):
    mult = resolve_multiplier(name)
    layer = SwappedConv2DTranspose(3, use_bias=False, arithmetic=name, quantization=mode,
                                   **kwargs)
    x = (RNG.standard_normal((2, 5, 4, 3)) * 0.8).astype(np.float32)
    if inputs == "relu":   # activation zero point 0: the sub-pixel path for every table here
        x = np.maximum(x, 0)
    layer.build(x.shape)
    got = layer(x).numpy()
    np.testing.assert_array_equal(got, _zero_inserted_reference(layer, x, mult, kwargs, mode))
    # and inside a tf.function, as fit/predict run it
    import tensorflow as tf
    np.testing.assert_array_equal(tf.function(layer)(x).numpy(), got)


@pytest.mark.parametrize("name", ["mul8u_drum4", "mul8s_drum4"])
def test_lut_conv2d_transpose_non_finite_values_and_a_static_range(name):
    mult = resolve_multiplier(name)
    kwargs = dict(kernel_size=3, strides=2, padding="same")
    x = np.maximum(RNG.standard_normal((2, 4, 4, 2)), 0).astype(np.float32)
    layer = SwappedConv2DTranspose(4, use_bias=False, arithmetic=name, **kwargs)
    layer.build(x.shape)
    kernel = layer.kernel.numpy()
    kernel[1, 2, 3, 0] = np.nan          # output channel 3: NaN everywhere, per the spec
    layer.kernel.assign(kernel)
    x[1, 2, 1, 0] = np.inf               # the windows of sample 1 that read it: NaN
    got = layer(x).numpy()
    want = _zero_inserted_reference(layer, x, mult, kwargs)
    assert np.isnan(got[..., 3]).all() and np.isnan(got[1, ..., :3]).any()
    assert not np.isnan(got[0, ..., :3]).any()
    np.testing.assert_array_equal(got, want)
    # static ranges (a calibrated layer's): zero point 0 (sub-pixel) and not (zero-inserted)
    for lo in (0.0, -0.5):
        static = {"activations": "static", "activation_range": (lo, 2.0)}
        layer = SwappedConv2DTranspose(4, use_bias=False, arithmetic=name, quantization=static,
                                       **kwargs)
        layer.build(x.shape)
        assert layer.quantization.activations == "static"
        clipped = np.clip(np.nan_to_num(x), lo, 2.0)
        np.testing.assert_array_equal(
            layer(clipped).numpy(), _zero_inserted_reference(layer, clipped, mult, kwargs, static))


def _forward_ops(layer, x):
    """{function name ("" for the traced graph itself, else a cond branch): number of
    GraphswapForward ops} of the layer traced."""
    import tensorflow as tf

    graph = tf.function(layer).get_concrete_function(
        tf.TensorSpec(x.shape, tf.float32)).graph
    counts = {"": sum(op.type == "GraphswapForward" for op in graph.get_operations())}
    for name, function in graph._functions.items():
        ops = function.graph.get_operations() if hasattr(function, "graph") else []
        counts[name] = sum(op.type == "GraphswapForward" for op in ops)
    return counts


def _stock_and_swapped(name, x, **kwargs):
    stock = keras.layers.Conv2DTranspose(activation="relu", **kwargs)
    stock.build(x.shape)
    stock.bias.assign(RNG.standard_normal(stock.filters).astype(np.float32))
    layer = SwappedConv2DTranspose(activation="relu", arithmetic=name, **kwargs)
    layer.build(x.shape)
    layer.set_weights(stock.get_weights())
    return stock, layer


@pytest.mark.parametrize("name,branches", [("mul8u_drum4", [1, 1]), ("mul8u_mitchell", [1, 1, 4])])
def test_which_single_op_a_table_layer_takes(name, branches):
    """A factored table (mul8u_drum4) runs its transposed convolution as the input gradient of
    the forward convolution, one op - where its zero point's row is exact, else one on the
    zero-inserted input.  A table that does not factor but whose zero-weight column is exact
    (Mitchell's) runs the merged phases in one op for finite inputs and one op per phase for
    others."""
    x = np.maximum(RNG.standard_normal((2, 5, 4, 3)), 0).astype(np.float32)
    _, layer = _stock_and_swapped(name, x, filters=3, kernel_size=3, strides=2, padding="same")
    counts = _forward_ops(layer, x)
    assert counts.pop("") == 0
    assert sorted(c for c in counts.values() if c) == branches, counts


@pytest.mark.parametrize("kwargs", GEOMETRIES + [
    dict(kernel_size=3, strides=3, padding="same", output_padding=1),   # phases that crop
    dict(kernel_size=(5, 3), strides=(3, 2), padding="valid", output_padding=(1, 0)),
    dict(kernel_size=3, strides=1, padding="same", dilation_rate=2),
    dict(kernel_size=2, strides=3, padding="same")])                     # a kernel < its stride
def test_exact_transposed_convolution_is_keras_in_one_op(kwargs):
    """graphswap's exact kernel runs a Conv2DTranspose as the input gradient of its forward
    convolution (graphswap_conv2d_backprop_input_f32: one GEMM by every tap, their scatter-add,
    bias and ReLU in the op's epilogue) - one op, no branch - within float32 round-off of Keras'
    layer inside a tf.function, for every geometry; non-finite inputs reach exactly the outputs
    they reach in TensorFlow (only real products: no zero weight or inserted zero meets them)."""
    import tensorflow as tf

    from conftest import assert_close_to_roundoff

    x = RNG.standard_normal((3, 5, 4, 6)).astype(np.float32)
    stock, layer = _stock_and_swapped("exact", x, filters=5, **kwargs)
    assert _forward_ops(layer, x) == {"": 1}
    if kwargs.get("dilation_rate", 1) == 1:
        reference = stock
    else:
        # TensorFlow's CPU Conv2DBackpropInput refuses dilation without oneDNN ("Current CPU
        # implementations do not yet support dilation rates larger than 1"): at stride 1 the
        # same layer is the forward convolution with the kernel turned by 180 degrees
        assert kwargs["strides"] == 1 and kwargs["padding"] == "same"
        turned = tf.transpose(stock.kernel[::-1, ::-1], (0, 1, 3, 2))

        def reference(inputs):
            return tf.nn.relu(tf.nn.conv2d(inputs, turned, 1, "SAME",
                                           dilations=kwargs["dilation_rate"]) + stock.bias)

    got, want = tf.function(layer)(x).numpy(), reference(x).numpy()
    assert got.shape == want.shape
    assert_close_to_roundoff(got, want, terms=int(np.prod(stock.kernel.shape[:2])) * 6)
    x[1, 2, 1, 0] = np.inf
    got, want = tf.function(layer)(x).numpy(), reference(x).numpy()
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    assert not np.isfinite(got).all()
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], atol=1e-4)


def test_a_factored_table_over_more_channels_than_one_exact_float_run():
    """mul8u_drum4's float32 sums stay exact integers over 258 terms; 300 input channels take
    two runs per tap, added in float64: still the zero-inserted convolution's bits."""
    name = "mul8u_drum4"
    mult = resolve_multiplier(name)
    kwargs = dict(kernel_size=3, strides=2, padding="same")
    x = np.maximum(RNG.standard_normal((2, 3, 2, 300)), 0).astype(np.float32)
    layer = SwappedConv2DTranspose(4, use_bias=False, arithmetic=name, **kwargs)
    layer.build(x.shape)
    assert 1 in _forward_ops(layer, x).values()
    np.testing.assert_array_equal(layer(x).numpy(),
                                  _zero_inserted_reference(layer, x, mult, kwargs))
