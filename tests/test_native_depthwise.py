"""graphswap_conv2d_f32's direct path for one input channel per group (DepthwiseConv2D), against
TensorFlow's depthwise convolution: every padding, stride, dilation and depth multiplier.  Where
this TensorFlow build refuses unequal strides (DepthwiseConv2dNative without oneDNN, probed by
conftest.tensorflow_runs_on_cpu), against a float64 numpy depthwise convolution instead."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import assert_close_to_roundoff, tensorflow_runs_on_cpu
from graphswap import native
from graphswap.native import conv_geometry


def depthwise_float64(x, w, strides, padding):
    """NHWC depthwise convolution by the Keras kernel (h, w, in, multiplier), dilation 1, in
    float64 - TensorFlow's SAME rule (output ceil(n / s), the odd padding row after)."""
    pads, outs = [], []
    for n, k, s in zip(x.shape[1:3], w.shape[:2], strides):
        out = -(-n // s) if padding == "same" else (n - k) // s + 1
        total = max((out - 1) * s + k - n, 0) if padding == "same" else 0
        pads.append((total // 2, total - total // 2))
        outs.append(out)
    xp = np.pad(x.astype(np.float64), ((0, 0), *pads, (0, 0)))
    y = sum(xp[:, i:i + (outs[0] - 1) * strides[0] + 1:strides[0],
               j:j + (outs[1] - 1) * strides[1] + 1:strides[1], :, None] * w[i, j]
            for i in range(w.shape[0]) for j in range(w.shape[1]))
    return y.reshape(*y.shape[:3], -1)


@pytest.mark.parametrize("multiplier", [1, 2])
@pytest.mark.parametrize("padding,strides,dilations", [
    ("same", (1, 1), (1, 1)), ("valid", (2, 2), (1, 1)), ("same", (2, 1), (1, 1)),
    ("same", (1, 1), (2, 2)), ("valid", (1, 1), (3, 2))])
def test_depthwise_matches_tensorflow(multiplier, padding, strides, dilations):
    rng = np.random.default_rng(3)
    channels = 19   # not a multiple of any vector width
    x = rng.normal(size=(3, 11, 13, channels)).astype(np.float32)
    w = rng.normal(size=(3, 3, channels, multiplier)).astype(np.float32)
    hwio = w.reshape(3, 3, 1, channels * multiplier)
    geometry = conv_geometry(x.shape, hwio.shape, strides, dilations, padding, channels)
    got = native.shipped_library().conv2d_f32(x, hwio, geometry)
    if strides[0] != strides[1] and not tensorflow_runs_on_cpu("unequal-stride depthwise"):
        want = depthwise_float64(x, w, strides, padding)
    else:
        want = tf.nn.depthwise_conv2d(x, w, [1, *strides, 1], padding.upper(),
                                      dilations=dilations if max(strides) == 1 else None).numpy()
    assert got.shape == want.shape
    assert_close_to_roundoff(got, want, terms=9)
    # a wrong tap, channel or padding would be of the order of the values themselves
    assert np.abs(want).max() > 1.0


def test_float64_depthwise_matches_tensorflow():
    """The float64 reference above against TensorFlow's op where every build runs it (equal
    strides, both paddings, a depth multiplier)."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, 9, 8, 3)).astype(np.float32)
    w = rng.normal(size=(3, 2, 3, 2)).astype(np.float32)
    for padding, strides in (("same", (2, 2)), ("valid", (2, 2)), ("same", (1, 1))):
        want = tf.nn.depthwise_conv2d(x, w, [1, *strides, 1], padding.upper()).numpy()
        got = depthwise_float64(x, w, strides, padding)
        assert got.shape == want.shape
        assert_close_to_roundoff(got, want, terms=6)


def test_depthwise_is_bit_identical_on_every_isa_path(each_isa):
    """The depthwise loop adds each channel's taps in the same order on every ISA path (the
    avx512 one: 16 channels a register, interior pixels 4 a block), so the results are the same
    bits: channel counts with 16-, 8- and 1-wide remainders, rows with and without blocks of 4,
    strides, dilations and both paddings; the other paths' against the scalar one."""
    rng = np.random.default_rng(11)
    cases = []
    for channels, width, strides, dilations, padding in [
            (37, 13, (1, 1), (1, 1), "same"), (64, 17, (2, 2), (1, 1), "same"),
            (16, 9, (1, 2), (1, 1), "valid"), (24, 12, (1, 1), (2, 3), "same"),
            (5, 3, (1, 1), (1, 1), "valid"), (48, 1, (1, 1), (1, 1), "same")]:
        x = rng.normal(size=(2, 7, width, channels)).astype(np.float32)
        w = rng.normal(size=(3, 3, 1, channels)).astype(np.float32)
        cases.append((x, w, conv_geometry(x.shape, w.shape, strides, dilations, padding,
                                          channels)))
    results = {}
    for isa in each_isa.supported_isas:
        each_isa.set_isa(isa)
        results[isa] = [each_isa.conv2d_f32(x, w, g) for x, w, g in cases]
    assert "scalar" in results
    for isa, outputs in results.items():
        for got, want, (x, w, g) in zip(outputs, results["scalar"], cases):
            np.testing.assert_array_equal(got, want, err_msg=f"{isa} path, {g}")
    # and the scalar path is the convolution (TensorFlow's, equal strides)
    x, w, g = cases[0]
    assert_close_to_roundoff(results["scalar"][0], tf.nn.depthwise_conv2d(
        x, w.reshape(3, 3, -1, 1), [1, 1, 1, 1], "SAME").numpy(), terms=9)
