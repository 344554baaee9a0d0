"""The avx512 path's direct convolution of at most 4 output channels
(native_kernels/src/conv_narrow_avx512.c: an image decoder's last Conv2D): the hand-written
GEMM's sums (gemm_f32.c, which the avx2 path still runs) bit for bit - FMA chains over blocks of
256 k, padding taps included - for every output count, padding, odd widths and a reduction of
several blocks."""

from __future__ import annotations

import numpy as np
import pytest

from graphswap.native import conv_geometry

RNG = np.random.default_rng(38)


@pytest.mark.parametrize("shape", [
    (2, 20, 40, 128, 3, 3, "same"), (2, 9, 17, 8, 1, 3, "valid"), (1, 7, 70, 33, 2, 5, "same"),
    (3, 6, 16, 64, 4, 1, "valid"), (1, 5, 23, 300, 3, 3, "same"), (2, 8, 19, 16, 4, (2, 4), "same")],
    ids=lambda s: "x".join(map(str, s)))
def test_narrow_direct_convolution_is_the_hand_written_gemm_bit_for_bit(each_isa, shape):
    if "avx512" not in each_isa.supported_isas:
        pytest.skip("the direct kernel runs on the avx512 path only")
    n, h, w, c, outs, size, padding = shape
    fh, fw = (size, size) if isinstance(size, int) else size
    x = RNG.standard_normal((n, h, w, c)).astype(np.float32)
    f = RNG.standard_normal((fh, fw, c, outs)).astype(np.float32)
    x[0, 1, 2, 3] = np.inf
    g = conv_geometry(x.shape, f.shape, padding=padding)
    each_isa.set_isa("avx2")
    want = each_isa.conv2d_f32(x, f, g)
    each_isa.set_isa("avx512")
    got = each_isa.conv2d_f32(x, f, g)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("name,mode", [("mul8u_drum4", None), ("mul8s_drum4", None),
                                       ("mul8u_drum4", {"granularity": "per_tensor"}),
                                       ("mul8u_drum4", {"weights": "asymmetric"})])
@pytest.mark.parametrize("inputs", ["relu", "signed"])
def test_factored_table_narrow_convolution_is_the_quantized_reference(name, mode, inputs):
    """A factored table's 3-output convolution whose reduction (3x3x150 terms) is longer than one
    exact float32 run: the narrow direct kernel's runs added in float64, then the factored
    epilogue - tests/reference.py's quantized convolution bit for bit (asymmetric weights, which
    need the window code sums, keep the table jobs)."""
    import reference
    from graphswap import SwappedConv2D
    from graphswap.kernels import resolve_multiplier

    mult = resolve_multiplier(name)
    x = (RNG.standard_normal((2, 6, 21, 150)) * 0.7).astype(np.float32)
    if inputs == "relu":
        x = np.maximum(x, 0)
    layer = SwappedConv2D(3, 3, padding="same", use_bias=False, arithmetic=name, quantization=mode)
    layer.build(x.shape)
    want = reference.quantized_conv2d(x, layer.kernel.numpy(), mult.table, mult.signed, (1, 1),
                                      (1, 1), (1, 1, 1, 1), 1, mode)
    np.testing.assert_array_equal(layer(x).numpy(), want)
