"""Quantized LUT execution: the C LUT GEMM / conv bit-exact against numpy, LutKernel
bit-exact against the independent reference pipeline, exact multipliers within a stated
quantization-error bound of float, and the awkward inputs (NaN, Inf, zeros, constants, empties)."""

from __future__ import annotations

import numpy as np
import pytest

from graphswap import native
from graphswap.native import conv_geometry
from graphswap.kernels import resolve_multiplier
from graphswap.errors import QuantizationError
from graphswap.kernels import LutKernel, QuantScheme
from graphswap.multipliers import Multiplier

import reference

RNG = np.random.default_rng(20240601)


@pytest.fixture(scope="module")
def lib():
    return native.shipped_library()


def exact_u8_table():
    i = np.arange(65536)
    return ((i >> 8) * (i & 255)).astype(np.int32)


def random_table(magnitude):
    return RNG.integers(-magnitude, magnitude, 65536, dtype=np.int64).astype(np.int32)


def numpy_lut_matmul(a, b, table):
    t = table.astype(np.int64)
    return t[(a.astype(np.int64)[:, :, None] << 8) | b.astype(np.int64)[None, :, :]].sum(axis=1)


def numpy_lut_conv(x, w, table, pad_code, g):
    """Integer sums and window sums by an explicit loop over filter taps."""
    t = table.astype(np.int64)
    xp = np.pad(x.astype(np.int64), ((0, 0), (g.pad_top, g.pad_bottom), (g.pad_left, g.pad_right), (0, 0)),
                constant_values=pad_code)
    acc = np.zeros(g.output_shape, np.int64)
    sums = np.zeros((g.batch, g.out_height, g.out_width, g.groups), np.int64)
    cin_g, cout_g = g.in_channels // g.groups, g.out_channels // g.groups
    for fh in range(g.filter_height):
        for fw in range(g.filter_width):
            top, left = fh * g.dilation_height, fw * g.dilation_width
            view = xp[:, top: top + (g.out_height - 1) * g.stride_height + 1: g.stride_height,
                      left: left + (g.out_width - 1) * g.stride_width + 1: g.stride_width, :]
            for grp in range(g.groups):
                xs = view[..., grp * cin_g:(grp + 1) * cin_g]
                sums[..., grp] += xs.sum(axis=-1)
                ws = w[fh, fw, :, grp * cout_g:(grp + 1) * cout_g].astype(np.int64)
                acc[..., grp * cout_g:(grp + 1) * cout_g] += t[(xs[..., :, None] << 8) | ws].sum(axis=-2)
    return acc, sums


# ---------------------------------------------------------------------------- C kernels, integer level

MATMUL_SHAPES = [(1, 1, 1), (1, 9, 17), (3, 5, 2), (7, 33, 8), (47, 20, 9),  # direct paths
                 (48, 13, 1), (64, 300, 64), (130, 70, 41), (256, 84, 10), (50, 1000, 33)]  # expanded


@pytest.mark.parametrize("m,k,n", MATMUL_SHAPES)
@pytest.mark.parametrize("magnitude", [2 ** 16, 2 ** 27])
def test_lut_matmul_bit_exact(lib, m, k, n, magnitude):
    """2^27-sized entries force int32 flushes every 15 terms, so K-blocking is exercised."""
    a = RNG.integers(0, 256, (m, k), dtype=np.uint8)
    b = RNG.integers(0, 256, (k, n), dtype=np.uint8)
    table = random_table(magnitude)
    np.testing.assert_array_equal(lib.lut_matmul(a, b, table), numpy_lut_matmul(a, b, table))


def test_lut_matmul_int32_extremes_accumulate_in_int64(lib):
    """Entries of +-(2^31 - 1): every partial sum of two terms overflows int32."""
    table = np.full(65536, 2 ** 31 - 1, dtype=np.int32)
    table[::2] = -(2 ** 31 - 1)
    for m in (5, 60):
        a = RNG.integers(0, 256, (m, 300), dtype=np.uint8)
        b = RNG.integers(0, 256, (300, 12), dtype=np.uint8)
        np.testing.assert_array_equal(lib.lut_matmul(a, b, table), numpy_lut_matmul(a, b, table))
    a = np.full((60, 300), 1, np.uint8)
    b = np.full((300, 12), 1, np.uint8)  # index 257: odd -> +(2^31-1), summed 300 times
    assert (lib.lut_matmul(a, b, table) == 300 * (2 ** 31 - 1)).all()


def test_lut_matmul_empty_sizes(lib):
    table = exact_u8_table()
    assert lib.lut_matmul(np.zeros((0, 4), np.uint8), np.zeros((4, 3), np.uint8), table).shape == (0, 3)
    out = lib.lut_matmul(np.zeros((2, 0), np.uint8), np.zeros((0, 3), np.uint8), table)
    assert out.shape == (2, 3) and (out == 0).all()


CONV_CASES = [
    # input NHWC, filter HWIO, strides, dilations, padding, groups
    ((1, 28, 28, 1), (5, 5, 1, 6), (1, 1), (1, 1), "valid", 1),      # LeNet conv1 (6 channels)
    ((3, 14, 14, 6), (5, 5, 6, 16), (1, 1), (1, 1), "valid", 1),     # LeNet conv2, odd batch
    ((2, 9, 9, 3), (3, 3, 3, 8), (1, 1), (1, 1), "same", 1),
    ((3, 7, 8, 4), (2, 3, 2, 6), (2, 1), (1, 2), "same", 2),
    ((1, 5, 5, 2), (3, 3, 2, 40), (2, 2), (1, 1), "same", 1),        # few pixels: direct path
    ((2, 4, 4, 6), (1, 1, 2, 9), (1, 1), (1, 1), "valid", 3),
    ((2, 20, 20, 8), (3, 3, 8, 12), (3, 2), (2, 2), "same", 1),
    ((1, 12, 12, 64), (3, 3, 64, 128), (1, 1), (1, 1), "same", 1),   # big filter: blocked expansion
    ((0, 5, 5, 2), (3, 3, 2, 4), (1, 1), (1, 1), "same", 1),
    # one channel (the tap-by-tap gather): padding and height dilation; strides; output rows
    # wider than a 64-pixel group
    ((2, 11, 13, 1), (3, 5, 1, 7), (1, 1), (2, 1), "same", 1),
    ((2, 10, 9, 1), (3, 3, 1, 5), (2, 2), (1, 1), "same", 1),
    ((1, 4, 72, 1), (3, 3, 1, 4), (1, 1), (1, 1), "valid", 1),
    # depthwise (groups = channels: the gather reads channel planes): SAME borders, a channel
    # multiplier with strides, a row wider than 64 pixels, strides and dilations across a border
    ((2, 9, 11, 5), (3, 3, 1, 5), (1, 1), (1, 1), "same", 5),
    ((2, 10, 9, 6), (3, 3, 1, 12), (2, 2), (1, 1), "same", 6),
    ((1, 6, 70, 3), (3, 5, 1, 3), (1, 1), (2, 1), "same", 3),
    ((1, 7, 17, 4), (1, 3, 1, 4), (1, 3), (1, 2), "same", 4),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"{c[0]}x{c[1]}s{c[2]}d{c[3]}{c[4]}g{c[5]}")
@pytest.mark.parametrize("magnitude", [2 ** 16, 2 ** 31 - 1])
def test_lut_conv2d_bit_exact(each_isa, case, magnitude):
    """2^31-1 entries leave no room for int32 runs: the direct path with per-term flushes.  Every
    instruction-set path this CPU runs gives the reference's sums."""
    xs, ws, strides, dilations, padding, groups = case
    g = conv_geometry(xs, ws, strides, dilations, padding, groups)
    x = RNG.integers(0, 256, xs, dtype=np.uint8)
    w = RNG.integers(0, 256, ws, dtype=np.uint8)
    table = random_table(magnitude)
    pad_code = int(RNG.integers(0, 256))
    ref_acc, ref_sums = numpy_lut_conv(x, w, table, pad_code, g)
    for isa in each_isa.supported_isas:
        each_isa.set_isa(isa)
        acc, sums = each_isa.lut_conv2d(x, w, table, pad_code, g, window_sums=True)
        np.testing.assert_array_equal(acc, ref_acc, err_msg=isa)
        np.testing.assert_array_equal(sums, ref_sums, err_msg=isa)


# ---------------------------------------------------------------------------- LutKernel vs reference

MULTIPLIERS = ["mul8u_exact", "mul8s_exact", "mul8u_drum4", "mul8s_drum3", "mul8u_mitchell",
               "mul8s_trunc5", "mul8u_trunc7"]


def activations(shape, relu=False):
    x = RNG.normal(0.3, 1.0, shape).astype(np.float32)
    return np.maximum(x, 0) if relu else x


UNSIGNED_MODES = [
    {"weights": "sign_magnitude", "granularity": "per_channel"},
    {"weights": "sign_magnitude", "granularity": "per_tensor"},
    {"weights": "asymmetric", "granularity": "per_tensor"},     # TFApprox
    {"weights": "asymmetric", "granularity": "per_channel"},
]
SIGNED_MODES = [{"weights": "symmetric", "granularity": "per_channel"},
                {"weights": "symmetric", "granularity": "per_tensor"}]
STATIC_RANGES = [None, (-0.75, 1.875), (0.0, 0.625)]  # dynamic; static, clipping (float32 values)


def modes_for(signed):
    for mode in (SIGNED_MODES if signed else UNSIGNED_MODES):
        for static in STATIC_RANGES:
            yield {**mode, "activation_range": static}


def scheme_of(mode):
    static = mode.get("activation_range")
    return QuantScheme(weights=mode["weights"], granularity=mode["granularity"],
                       activations="static" if static is not None else "dynamic",
                       activation_range=static)


def mode_id(mode):
    static = mode.get("activation_range")
    return f"{mode['weights']}-{mode['granularity']}-" + ("dynamic" if static is None
                                                        else f"static{static}")


def table_multiplier(table, signed, name="random"):
    return Multiplier(spec=name, name=name, signed=signed, table=table.astype(np.int32),
                      description="test table", kind="lut")


@pytest.mark.parametrize("name", MULTIPLIERS)
@pytest.mark.parametrize("m,k,n", [(1, 7, 3), (5, 16, 9), (64, 50, 12), (33, 120, 84)])
def test_kernel_matmul_matches_reference(name, m, k, n):
    mult = resolve_multiplier(name)
    a = activations((m, k), relu=(n % 2 == 0))
    b = (RNG.normal(0, 0.2, (k, n)) + 0.05).astype(np.float32)
    for mode in modes_for(mult.signed):
        got = LutKernel(mult).matmul(a, b, quant=scheme_of(mode))
        assert got.dtype == np.float32 and got.shape == (m, n)
        np.testing.assert_array_equal(got, reference.quantized_matmul(a, b, mult.table, mult.signed,
                                                                      mode), err_msg=mode_id(mode))


def test_default_scheme_is_sign_magnitude_or_symmetric_per_channel_dynamic():
    a = activations((9, 20))
    b = RNG.normal(0, 0.2, (20, 6)).astype(np.float32)
    for name in ("mul8u_drum4", "mul8s_drum4"):
        mult = resolve_multiplier(name)
        np.testing.assert_array_equal(LutKernel(mult).matmul(a, b),
                                      reference.quantized_matmul(a, b, mult.table, mult.signed))


def test_sign_magnitude_with_a_table_whose_zero_column_is_not_zero():
    """T[a, 0] != 0 (a multiplier with an offset): the zero-column term is added back exactly."""
    table = RNG.integers(-3000, 3000, 65536)
    mult = table_multiplier(table, signed=False)
    assert (table.reshape(256, 256)[:, 0] != 0).any()
    a = activations((11, 30))
    b = RNG.normal(0, 0.2, (30, 7)).astype(np.float32)
    b[3, 2] = 0.0      # a zero weight counts as +T[a, 0]
    b[4, 1] = -1e-9    # a negative weight whose magnitude rounds to 0 counts as -T[a, 0]
    for granularity in ("per_channel", "per_tensor"):
        mode = {"weights": "sign_magnitude", "granularity": granularity,
                "activation_range": None}
        np.testing.assert_array_equal(LutKernel(mult).matmul(a, b, quant=scheme_of(mode)),
                                      reference.quantized_matmul(a, b, table, False, mode))
    g = conv_geometry((2, 7, 6, 4), (3, 3, 2, 6), (1, 1), (1, 1), "same", 2)
    x = activations((2, 7, 6, 4))
    w = RNG.normal(0, 0.3, (3, 3, 2, 6)).astype(np.float32)
    mode = {"weights": "sign_magnitude", "granularity": "per_channel",
            "activation_range": (-0.5, 1.0)}
    got = LutKernel(mult).conv2d(x, w, g, quant=scheme_of(mode))
    want = reference.quantized_conv2d(x, w, table, False, (1, 1), (1, 1),
                                      (g.pad_top, g.pad_bottom, g.pad_left, g.pad_right), 2, mode)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kind", ["one byte plane", "two byte planes", "full two planes"])
def test_sign_magnitude_pairs_over_long_reductions_on_every_isa(each_isa, kind):
    """The avx512 kernel subtracts each weight column's negative half itself (16-bit wrapping sums
    read back with an offset): reductions of several 256-term runs mixing both signs, full and
    partial row groups, 1- and 2-byte tables with T[a, 0] = 0; every path equals the reference."""
    a_codes, b_codes = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
    if kind == "one byte plane":
        table = (a_codes * b_codes) >> 8
    elif kind == "two byte planes":
        table = a_codes * b_codes
    else:  # bytes up to 255 in both planes: the widest per-term values the sums can see
        table = RNG.integers(0, 65536, (256, 256))
        table[:, 0] = 0
    table = table.reshape(-1)
    mult = table_multiplier(table, signed=False)
    a = np.abs(activations((300, 700)))
    b = RNG.normal(0, 0.2, (700, 11)).astype(np.float32)
    b[:, 3] = np.abs(b[:, 3])   # a column with positive weights only
    b[:, 4] = -np.abs(b[:, 4])  # and one with negative weights only
    mode = {"weights": "sign_magnitude", "granularity": "per_channel", "activation_range": None}
    want = reference.quantized_matmul(a, b, table, False, mode)
    for isa in each_isa.supported_isas:
        each_isa.set_isa(isa)
        np.testing.assert_array_equal(LutKernel(mult).matmul(a, b, quant=scheme_of(mode)), want,
                                      err_msg=isa)


def test_encodings_that_cannot_run_on_the_multiplier_are_refused():
    a = activations((3, 4))
    b = RNG.normal(0, 0.2, (4, 2)).astype(np.float32)
    with pytest.raises(QuantizationError, match="cannot run on a signed"):
        LutKernel(resolve_multiplier("mul8s_drum4")).matmul(
            a, b, quant=QuantScheme(weights="sign_magnitude"))
    with pytest.raises(QuantizationError, match="cannot run on a unsigned|cannot run on an"):
        LutKernel(resolve_multiplier("mul8u_drum4")).matmul(
            a, b, quant=QuantScheme(weights="symmetric"))


@pytest.mark.parametrize("name", ["mul8u_drum4", "mul8s_mitchell", "mul8u_exact", "mul8s_exact"])
@pytest.mark.parametrize("case", [
    ((1, 10, 10, 1), (5, 5, 1, 6), (1, 1), (1, 1), "same", 1),
    ((3, 9, 8, 4), (3, 2, 2, 6), (2, 1), (1, 2), "same", 2),
    ((2, 11, 11, 3), (3, 3, 3, 10), (2, 2), (2, 1), "valid", 1),
], ids=["lenet-like", "grouped-strided-dilated", "valid-strided"])
def test_kernel_conv2d_matches_reference(name, case):
    mult = resolve_multiplier(name)
    xs, ws, strides, dilations, padding, groups = case
    g = conv_geometry(xs, ws, strides, dilations, padding, groups)
    x = activations(xs)
    w = RNG.normal(0, 0.3, ws).astype(np.float32)
    pads = (g.pad_top, g.pad_bottom, g.pad_left, g.pad_right)
    for mode in modes_for(mult.signed):
        got = LutKernel(mult).conv2d(x, w, g, quant=scheme_of(mode))
        want = reference.quantized_conv2d(x, w, mult.table, mult.signed, strides, dilations, pads,
                                          groups, mode)
        np.testing.assert_array_equal(got, want, err_msg=mode_id(mode))


# ---------------------------------------------------------------------------- accuracy of exact multipliers

def quantization_bound(a, b, signed, weights):
    """Elementwise bound on |quantized - float| for the exact multiplier.

    Each operand is represented with error e, |e| <= s/2 for symmetric int8 and sign-magnitude
    weights (no clipping: |t| <= max|t| = 127 s, resp. 255 s); <= s for asymmetric uint8 (rounding
    the zero point can push the top of the range one step out and clip it).  Then
    |ab - (a+ea)(b+eb)| <= |a||eb| + |b||ea| + |ea||eb|, summed over k, plus float32 rounding of
    the result."""
    a64, b64 = np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64))
    if signed:
        ea = np.abs(a64).max() / 127 / 2
        eb = (b64.max(axis=0) / 127 / 2)[None, :]
    else:
        ea = (max(a.max(), 0) - min(a.min(), 0)) / 255.0
        if weights == "sign_magnitude":
            eb = (b64.max(axis=0) / 255 / 2)[None, :]
        else:
            eb = (max(b.max(), 0) - min(b.min(), 0)) / 255.0
    k = a.shape[1]
    bound = a64 @ (np.ones_like(b64) * eb) + (b64 * ea).sum(axis=0)[None, :] + k * ea * eb
    return bound * (1 + 1e-6) + 1e-6 * np.abs(a64 @ b64)


@pytest.mark.parametrize("name,weights", [("mul8u_exact", "sign_magnitude"),
                                          ("mul8u_exact", "asymmetric"),
                                          ("mul8s_exact", "symmetric")])
def test_exact_multipliers_within_quantization_bound(name, weights):
    mult = resolve_multiplier(name)
    granularity = "per_tensor" if weights == "asymmetric" else "per_channel"
    scheme = QuantScheme(weights=weights, granularity=granularity)
    for m, k, n in [(64, 400, 120), (3, 25, 6)]:
        a = activations((m, k), relu=True)
        b = RNG.normal(0, 0.1, (k, n)).astype(np.float32)
        got = LutKernel(mult).matmul(a, b, quant=scheme).astype(np.float64)
        exact = a.astype(np.float64) @ b.astype(np.float64)
        bound = quantization_bound(a, b, mult.signed, weights)
        assert (np.abs(got - exact) <= bound).all()
        # and the bound is meaningful: the error is small against the outputs' scale
        assert np.abs(got - exact).max() < 0.05 * np.abs(exact).max()


def test_exact_multiplier_conv_close_to_float():
    g = conv_geometry((2, 12, 12, 3), (3, 3, 3, 8), padding="same")
    x = activations((2, 12, 12, 3), relu=True)
    w = RNG.normal(0, 0.2, (3, 3, 3, 8)).astype(np.float32)
    want = native.shipped_library().conv2d_f32(x, w, g)
    for name in ("mul8u_exact", "mul8s_exact"):
        got = LutKernel(resolve_multiplier(name)).conv2d(x, w, g)
        # patches x filter: same bound as the matmul, with K = 27 taps (see quantization_bound)
        assert np.abs(got - want).max() < 0.03 * np.abs(want).max()


# ---------------------------------------------------------------------------- awkward inputs

@pytest.mark.parametrize("name", ["mul8u_drum4", "mul8s_drum4"])
def test_nan_and_inf_propagate_to_dependent_outputs_only(name):
    kernel = LutKernel(resolve_multiplier(name))
    a = activations((6, 10))
    b = RNG.normal(0, 0.2, (10, 5)).astype(np.float32)
    a[2, 3] = np.nan
    a[4, 0] = np.inf
    b[7, 1] = -np.inf
    out = kernel.matmul(a, b)
    nan = np.isnan(out)
    assert nan[2].all() and nan[4].all() and nan[:, 1].all()
    assert not nan[[0, 1, 3, 5]][:, [0, 2, 3, 4]].any()
    mult = resolve_multiplier(name)
    np.testing.assert_array_equal(out, reference.quantized_matmul(a, b, mult.table, mult.signed))
    # conv: NaN only in windows that contain the bad pixel
    g = conv_geometry((1, 8, 8, 2), (3, 3, 2, 4), padding="valid")
    x = activations((1, 8, 8, 2))
    x[0, 0, 0, 1] = np.nan
    w = RNG.normal(0, 0.2, (3, 3, 2, 4)).astype(np.float32)
    out = kernel.conv2d(x, w, g)
    assert np.isnan(out[0, 0, 0]).all() and not np.isnan(out[0, 1:, :]).any() and not np.isnan(out[0, :, 1:]).any()
    np.testing.assert_array_equal(out, reference.quantized_conv2d(x, w, mult.table, mult.signed, (1, 1), (1, 1),
                                                                  (0, 0, 0, 0), 1))


@pytest.mark.parametrize("name", ["mul8u_exact", "mul8s_exact", "mul8u_mitchell"])
def test_zero_constant_and_empty_tensors(name):
    kernel = LutKernel(resolve_multiplier(name))
    with np.errstate(all="raise"):
        zeros = kernel.matmul(np.zeros((4, 6), np.float32), np.zeros((6, 3), np.float32))
        assert (zeros == 0).all()
        const = kernel.matmul(np.full((4, 6), 2.0, np.float32), np.full((6, 3), -0.5, np.float32))
        np.testing.assert_allclose(const, -6.0, rtol=0.02)
        assert kernel.matmul(np.zeros((0, 6), np.float32), np.ones((6, 3), np.float32)).shape == (0, 3)
        empty_k = kernel.matmul(np.ones((4, 0), np.float32), np.ones((0, 3), np.float32))
        assert empty_k.shape == (4, 3) and (empty_k == 0).all()
        g = conv_geometry((2, 5, 5, 1), (3, 3, 1, 2), padding="same")
        conv = kernel.conv2d(np.zeros((2, 5, 5, 1), np.float32), np.zeros((3, 3, 1, 2), np.float32), g)
        assert (conv == 0).all()


def test_kernel_config_and_description():
    kernel = LutKernel(resolve_multiplier("mul8u_drum5"))
    assert kernel.spec == "mul8u_drum5" and kernel.to_config() == {"spec": "mul8u_drum5"}
    assert "sign-magnitude weights per-channel" in kernel.description
    assert "symmetric int8" in LutKernel(resolve_multiplier("mul8s_exact")).description
