"""The fused table-driven depthwise convolution (graphswap_lut_conv2d_f32 with one input channel
per group: native_kernels/src/lut_conv.c's depthwise_block, straight from the channel planes)
against tests/reference.py, bit for bit, on every instruction-set path this CPU runs (and, for
tables that factor, with factoring off, so the table kernels run them too): every
weight encoding and granularity, dynamic and static ranges, channel multipliers, strides,
dilations, borders, and non-finite inputs and weights."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import reference
from conftest import table_paths
from graphswap.kernels import LutKernel, QuantScheme, resolve_multiplier
from graphswap.native import conv_geometry

RNG = np.random.default_rng(2026)

CASES = [
    # input NHWC, filter HWIO (h, w, 1, channels * multiplier), strides, dilations, padding
    ((1, 9, 5, 7), (3, 3, 1, 7), (1, 1), (1, 1), "same"),      # narrow rows (DS-CNN-like)
    ((1, 10, 9, 3), (3, 3, 1, 6), (2, 2), (1, 1), "same"),    # multiplier 2, strides
    ((1, 4, 70, 2), (3, 5, 1, 2), (1, 1), (2, 1), "same"),     # rows wider than a block's group
    ((1, 7, 17, 4), (1, 3, 1, 4), (1, 3), (1, 2), "same"),     # strides, dilations over a border
    ((2, 6, 6, 2), (5, 5, 1, 10), (1, 1), (1, 1), "valid"),    # multiplier 5, no padding
    ((1, 34, 20, 3), (3, 3, 1, 3), (2, 2), (1, 1), "same"),  # several pixel blocks
]
MODES = {False: [("sign_magnitude", "per_channel"), ("sign_magnitude", "per_tensor"),
                 ("asymmetric", "per_tensor"), ("asymmetric", "per_channel")],
         True: [("symmetric", "per_channel"), ("symmetric", "per_tensor")]}


@pytest.mark.parametrize("spec", ["mul8u_drum4", "mul8s_drum4", "mul8u_mitchell"])
def test_fused_depthwise_is_the_reference_on_every_isa(spec, each_isa):
    mult = resolve_multiplier(spec)
    kernel = LutKernel(mult)
    compared = 0
    # static ranges of float32 values (the layer's range is a float32 tensor)
    for case, (weights, granularity), static, non_finite in itertools.product(
            CASES, MODES[bool(mult.signed)], [None, (-0.75, 1.875)], [False, True]):
        xs, ws, strides, dilations, padding = case
        g = conv_geometry(xs, ws, strides, dilations, padding, xs[3])
        x = RNG.normal(0.3, 1.0, xs).astype(np.float32)
        w = RNG.normal(0, 0.3, ws).astype(np.float32)
        if non_finite:
            x[0, 1, 2, 0] = np.nan
            w[0, 0, 0, ws[3] - 1] = np.inf
        mode = {"weights": weights, "granularity": granularity, "activation_range": static}
        scheme = QuantScheme(weights=weights, granularity=granularity,
                             activations="static" if static else "dynamic",
                             activation_range=static)
        want = reference.quantized_conv2d(x, w, mult.table, mult.signed, strides, dilations,
                                          (g.pad_top, g.pad_bottom, g.pad_left, g.pad_right),
                                          xs[3], mode)
        if non_finite:
            assert np.isnan(want[..., ws[3] - 1]).all() and np.isnan(want[0]).any()
        for path in table_paths(each_isa):
            got = kernel.conv2d(x, w, g, quant=scheme)
            np.testing.assert_array_equal(got, want, err_msg=f"{path} {case} {mode} {non_finite}")
            compared += 1
    assert compared >= len(CASES) * 2 * 2 * 2 * 2 * len(each_isa.supported_isas)
