"""graphswap_conv2d_f32's direct path for a single-channel input (conv_single_channel.c), against
TensorFlow's conv2d and against the GEMM path: paddings, height strides, dilations, widths that are
no multiple of any vector length, channel counts around the 8-channel register block; the same
bits on every instruction-set path this CPU runs."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import assert_close_to_roundoff
from graphswap import native
from graphswap.native import conv_geometry

CASES = [  # (height, width, filter h, filter w, out channels, padding, strides, dilations)
    (32, 32, 5, 5, 6, "valid", (1, 1), (1, 1)),     # LeNet-5's first conv
    (11, 13, 3, 3, 1, "same", (1, 1), (1, 1)),
    (9, 37, 3, 2, 8, "same", (2, 1), (1, 1)),
    (12, 17, 3, 3, 13, "valid", (1, 1), (2, 3)),
    (7, 5, 5, 5, 20, "same", (1, 1), (1, 1)),       # filter wider than the image
    (6, 19, 1, 1, 3, "valid", (3, 1), (1, 1)),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}x{c[1]}-{c[2]}x{c[3]}x{c[4]}-{c[5]}"
                                             for c in CASES])
def test_single_channel_conv_matches_tensorflow_on_every_isa(case, each_isa):
    library = each_isa
    h, w, fh, fw, cout, padding, strides, dilations = case
    rng = np.random.default_rng(11)
    x = rng.normal(size=(3, h, w, 1)).astype(np.float32)
    k = rng.normal(size=(fh, fw, 1, cout)).astype(np.float32)
    geometry = conv_geometry(x.shape, k.shape, strides, dilations, padding, 1)
    want = tf.nn.conv2d(x, k, [1, *strides, 1], padding.upper(),
                        dilations=list(dilations)).numpy()
    assert np.abs(want).max() > 1.0   # a wrong tap or channel would show at this scale
    results = {}
    for isa in library.supported_isas:
        library.set_isa(isa)
        results[isa] = library.conv2d_f32(x, k, geometry)
        assert results[isa].shape == want.shape
        assert_close_to_roundoff(results[isa], want, terms=fh * fw)
    first = next(iter(results.values()))
    for isa, got in results.items():
        np.testing.assert_array_equal(got, first, err_msg=f"path {isa} differs")


def test_single_channel_path_agrees_with_the_gemm_path(monkeypatch):
    library = native.shipped_library()
    rng = np.random.default_rng(5)
    x = rng.normal(size=(4, 28, 30, 1)).astype(np.float32)
    k = rng.normal(size=(5, 5, 1, 6)).astype(np.float32)
    geometry = conv_geometry(x.shape, k.shape, (1, 1), (1, 1), "same", 1)
    direct = library.conv2d_f32(x, k, geometry)
    monkeypatch.setenv("GRAPHSWAP_CONV_F32", "blas")   # the GEMM path, forced
    gemm = library.conv2d_f32(x, k, geometry)
    assert_close_to_roundoff(direct, gemm, terms=25)
    assert not np.array_equal(direct, np.zeros_like(direct))
