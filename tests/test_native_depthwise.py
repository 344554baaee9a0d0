"""graphswap_conv2d_f32's direct path for one input channel per group (DepthwiseConv2D), against
TensorFlow's depthwise convolution: every padding, stride, dilation and depth multiplier."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import assert_close_to_roundoff
from graphswap import native
from graphswap.native import conv_geometry


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
    want = tf.nn.depthwise_conv2d(x, w, [1, *strides, 1], padding.upper(),
                                  dilations=dilations if max(strides) == 1 else None).numpy()
    assert got.shape == want.shape
    assert_close_to_roundoff(got, want, terms=9)
    # a wrong tap, channel or padding would be of the order of the values themselves
    assert np.abs(want).max() > 1.0
