"""The avx512 path's direct transposed convolution (native_kernels/src/conv_backprop_avx512.c):
graphswap's exact kernel and the factored tables run a Conv2DTranspose output pixel by output
pixel instead of one GEMM by every tap and a scatter-add.  The exact kernel's results are the
GEMM + scatter's bit for bit (the avx2 path still runs that); a factored table's are the
zero-inserted convolution's of tests/reference.py bit for bit, the taps' sums added in float32
runs that stay exact and float64 across them."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import reference
from graphswap import SwappedConv2DTranspose
from graphswap.kernels import resolve_multiplier
from graphswap.native import conv_geometry, flipped_filter, insert_zeros, transposed_conv
from graphswap.native.abi import Conv2DParams

RNG = np.random.default_rng(37)

# (batch, dx height, width, filters C, dy channels K, kernel, stride, padding): the benchmarks'
# CodecDecoder's layers (shrunk), their Decoder's, odd channel counts (a 16-lane block, masked
# tails), strides 1 and 3, VALID, and dy channels past one OpenBLAS small-matrix GEMM
GEOMETRIES = [
    (2, 16, 16, 16, 16, 3, 2, "same"), (2, 16, 18, 32, 16, 5, 2, "same"),
    (2, 20, 22, 128, 32, 7, 2, "same"), (3, 12, 12, 64, 64, 3, 2, "same"),
    (2, 9, 11, 17, 24, 3, 2, "same"), (2, 10, 14, 40, 48, 4, 2, "same"),
    (2, 11, 9, 48, 33, 3, 1, "same"), (2, 15, 15, 16, 20, 5, 3, "valid"),
    (1, 12, 30, 24, 256, 3, 2, "same"), (2, 7, 7, 16, 8, 1, 2, "same"),
]


def _backprop(library, dy, f, g):
    fn = ctypes.cast(library.function_address("graphswap_conv2d_backprop_input_f32"),
                     ctypes.CFUNCTYPE(ctypes.c_int32, *[ctypes.c_void_p] * 4))
    dx = np.empty((g.batch, g.in_height, g.in_width, g.in_channels), np.float32)
    params = Conv2DParams.from_geometry(g)
    assert fn(dy.ctypes.data, f.ctypes.data, dx.ctypes.data, ctypes.addressof(params)) == 0
    return dx


@pytest.mark.parametrize("shape", GEOMETRIES, ids=lambda s: "x".join(map(str, s)))
def test_exact_direct_kernel_is_the_gemm_and_scatter_bit_for_bit(each_isa, shape):
    if "avx512" not in each_isa.supported_isas:
        pytest.skip("the direct kernel runs on the avx512 path only")
    n, h, w, c, k, size, stride, padding = shape
    g = conv_geometry((n, h, w, c), (size, size, c, k), (stride, stride), padding=padding)
    dy = RNG.standard_normal(g.output_shape).astype(np.float32)
    f = RNG.standard_normal((size, size, c, k)).astype(np.float32)
    dy[0, 0, 0, 0] = np.inf            # non-finite values reach what they reach in the GEMM
    for weights in (f, np.where(RNG.random(f.shape) < 0.02, np.inf, f).astype(np.float32)):
        # a non-finite weight: no zero padding (0 * inf), edge pixels one at a time
        each_isa.set_isa("avx2")
        want = _backprop(each_isa, dy, weights, g)
        each_isa.set_isa("avx512")
        got = _backprop(each_isa, dy, weights, g)
        np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("kwargs,shape", [
    (dict(filters=32, kernel_size=7, strides=2, padding="same"), (2, 6, 7, 24)),   # float64 runs
    (dict(filters=16, kernel_size=5, strides=2, padding="same"), (2, 5, 6, 16)),   # float32 sums
    (dict(filters=20, kernel_size=3, strides=2, padding="same"), (2, 8, 9, 20)),
    (dict(filters=24, kernel_size=4, strides=3, padding="valid"), (1, 5, 4, 12))])
def test_factored_table_direct_kernel_is_the_zero_inserted_convolution(kwargs, shape):
    mult = resolve_multiplier("mul8u_drum4")
    layer = SwappedConv2DTranspose(use_bias=False, arithmetic="mul8u_drum4", **kwargs)
    x = np.maximum(RNG.standard_normal(shape), 0).astype(np.float32)
    layer.build(x.shape)
    plan = transposed_conv(x.shape, layer.kernel.shape, layer.strides, kwargs["padding"],
                           layer.output_padding)
    g = plan.geometry
    want = reference.quantized_conv2d(insert_zeros(x, plan), flipped_filter(layer.kernel.numpy()),
                                      mult.table, mult.signed, (1, 1), (1, 1),
                                      (g.pad_top, g.pad_bottom, g.pad_left, g.pad_right), 1, None)
    np.testing.assert_array_equal(layer(x).numpy(), want)
