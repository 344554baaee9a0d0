"""Tables that factor exactly, T[a][b] = f(a) g(b) (DRUM, operand truncation, the exact product):
their products run as float32 GEMMs / convolutions of the mapped operands
(native_kernels/src/lut_factored.c) and must give the table kernels' sums bit for bit.

Checked here: which tables factor (against an independent rank-1 test in numpy); the integer
entry points (exact int64 sums, reductions longer than one exact float32 run); the fused float
entry points against tests/reference.py and against the same call with factoring off, for every
weight encoding, granularity and range mode, padding whose code maps to a non-zero f (the shift),
grouped and depthwise convolutions, reductions too long for one float pass (the job kernel), and
non-finite inputs and weights - on every instruction-set path this CPU runs."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

import reference
from graphswap.kernels import LutKernel, QuantScheme, resolve_multiplier
from graphswap.multipliers.record import Multiplier
from graphswap.native import conv_geometry, shipped_library

RNG = np.random.default_rng(1203)


def _rank_one(table) -> bool:
    """Independent test: every 2x2 minor through one non-zero pivot vanishes (exact integers)."""
    t = np.asarray(table, np.int64).reshape(256, 256)
    nz = np.argwhere(t != 0)
    if len(nz) == 0:
        return True
    a0, b0 = nz[0]
    return bool((t * t[a0, b0] == np.outer(t[:, b0], t[a0, :])).all())


def _user_table(f, g) -> np.ndarray:
    return (np.asarray(f, np.int64)[:, None] * np.asarray(g, np.int64)[None, :]).reshape(-1).astype(np.int32)


def _multiplier(name, table, signed) -> Multiplier:
    return Multiplier(spec=name, name=name, signed=signed, table=table, description=name, kind="lut")


@pytest.fixture
def library():
    lib = shipped_library()
    isa = lib.isa
    yield lib
    lib.set_table_factoring(None)
    lib.set_isa(isa)


def _paths(lib):
    """(isa, factoring) for every path this CPU runs; factoring off is the table kernels."""
    for isa, factoring in itertools.product(lib.supported_isas, (True, False)):
        lib.set_isa(isa)
        lib.set_table_factoring(factoring)
        yield isa, factoring


BUILTINS = ["mul8u_exact", "mul8u_drum3", "mul8u_drum4", "mul8u_drum6", "mul8u_trunc4", "mul8u_mitchell",
            "mul8s_exact", "mul8s_drum4", "mul8s_trunc2", "mul8s_mitchell"]


@pytest.mark.parametrize("spec", BUILTINS)
def test_which_builtin_tables_factor(spec, library):
    table = resolve_multiplier(spec).table
    assert library.table_factored(table) == _rank_one(table)
    if "drum" in spec or "exact" in spec:
        assert library.table_factored(table), spec   # operand-wise approximations are rank 1
    if "mitchell" in spec:
        assert not library.table_factored(table), spec


def test_user_tables_factor_when_rank_one_and_exact_in_float32(library):
    f = RNG.integers(-300, 300, 256)
    g = RNG.integers(-200, 200, 256)
    table = _user_table(f, g)
    assert library.table_factored(table)
    broken = table.copy()
    broken[(17 << 8) | 3] += 1
    assert not library.table_factored(broken) and not _rank_one(broken)
    # rank 1, but products beyond 2^24 are not exact in float32: the table kernels keep it
    big = _user_table(np.full(256, 5000), np.full(256, 4000))
    assert _rank_one(big) and not library.table_factored(big)
    assert library.table_factored(np.zeros(65536, np.int32))
    library.set_table_factoring(False)
    assert not library.table_factored(table)


def test_environment_switch_keeps_tables_on_the_table_kernels():
    code = ("from graphswap.native import shipped_library; from graphswap.kernels import "
            "resolve_multiplier; print(shipped_library().table_factored("
            "resolve_multiplier('mul8u_drum4').table))")
    env = dict(os.environ, GRAPHSWAP_TABLE_FACTORING="off")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "False", out.stderr[-2000:]
    env["GRAPHSWAP_TABLE_FACTORING"] = "1"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "True", out.stderr[-2000:]


TABLES = {
    "mul8u_drum4": (resolve_multiplier("mul8u_drum4").table, False),
    "mul8s_drum4": (resolve_multiplier("mul8s_drum4").table, True),
    # negative factors and f(0) != 0: the padding shift and the g(0) != 0 sign-magnitude sums
    "user": (_user_table(np.arange(256) - 40, (np.arange(256) * 7) % 251 + 3), False),
}


@pytest.mark.parametrize("name", sorted(TABLES))
def test_integer_sums_equal_the_table_kernels_beyond_one_float_run(name, library):
    table, _ = TABLES[name]
    assert library.table_factored(table)
    full = np.asarray(table, np.int64).reshape(256, 256)
    top_a, top_b = np.unravel_index(np.abs(full).argmax(), full.shape)
    for m, k, n in [(1, 1, 1), (70, 300, 9), (5, 1100, 600)]:   # 1100 terms: several exact runs
        a = RNG.integers(0, 256, (m, k), dtype=np.uint8)
        b = RNG.integers(0, 256, (k, n), dtype=np.uint8)
        a[0], b[:, 0] = top_a, top_b                             # the largest sum the table allows
        want = full[a[:, :, None], b[None, :, :]].sum(axis=1)
        for isa, factoring in _paths(library):
            np.testing.assert_array_equal(library.lut_matmul(a, b, table), want,
                                          err_msg=f"{name} {isa} factoring={factoring} {m, k, n}")
    x = RNG.integers(0, 256, (2, 7, 6, 5), dtype=np.uint8)
    w = RNG.integers(0, 256, (3, 3, 5, 4), dtype=np.uint8)
    geometry = conv_geometry(x.shape, w.shape, (1, 1), (1, 1), "same", 1)
    got = {}
    for isa, factoring in _paths(library):
        got[isa, factoring] = library.lut_conv2d(x, w, table, 9, geometry)
    first = next(iter(got.values()))
    for key, value in got.items():
        for part, ref in zip(value, first):
            np.testing.assert_array_equal(part, ref, err_msg=f"{name} {key}")


MATMUL_CASES = [(37, 29, 13), (300, 200, 70), (9, 900, 5)]   # 900 terms: too long for one float pass
CONV_CASES = [
    # input NHWC, filter HWIO, strides, dilations, padding, groups
    ((2, 9, 8, 6), (3, 3, 6, 10), (1, 2), (1, 1), "same", 1),
    ((1, 10, 9, 4), (3, 3, 2, 6), (2, 1), (1, 1), "same", 2),    # grouped
    ((2, 8, 7, 5), (3, 3, 1, 10), (1, 1), (2, 2), "same", 5),    # depthwise, multiplier 2
    ((1, 6, 6, 64), (3, 3, 64, 4), (1, 1), (1, 1), "same", 1),   # 576 taps: the job kernel
    ((1, 5, 5, 3), (1, 1, 3, 8), (1, 1), (1, 1), "valid", 1),
]


def _modes(signed):
    encodings = [("symmetric",)] if signed else [("sign_magnitude",), ("asymmetric",)]
    for (weights,), granularity, static in itertools.product(encodings, ["per_channel", "per_tensor"],
                                                             [None, (-0.75, 1.875)]):
        yield {"weights": weights, "granularity": granularity, "activation_range": static}


def _scheme(mode):
    static = mode["activation_range"]
    return QuantScheme(weights=mode["weights"], granularity=mode["granularity"],
                       activations="static" if static else "dynamic", activation_range=static)


@pytest.mark.parametrize("name", sorted(TABLES))
def test_fused_products_are_the_reference_and_the_table_kernels(name, library):
    table, signed = TABLES[name]
    kernel = LutKernel(_multiplier(name, table, signed))
    compared = 0
    for mode, non_finite in itertools.product(list(_modes(signed)), [False, True]):
        scheme = _scheme(mode)
        for m, k, n in MATMUL_CASES:
            a = RNG.normal(0.4, 1.0, (m, k)).astype(np.float32)   # negative values: zero point > 0
            b = RNG.normal(0, 0.3, (k, n)).astype(np.float32)
            if non_finite:
                a[m // 2, 1], b[2, n - 1] = np.nan, np.inf
            want = reference.quantized_matmul(a, b, table, signed, mode)
            for isa, factoring in _paths(library):
                got = kernel.matmul(a, b, quant=scheme)
                np.testing.assert_array_equal(got, want, err_msg=f"{isa} {factoring} {mode} {m, k, n}")
                compared += 1
        for xs, ws, strides, dilations, padding, groups in CONV_CASES:
            x = RNG.normal(0.3, 1.0, xs).astype(np.float32)
            w = RNG.normal(0, 0.3, ws).astype(np.float32)
            if non_finite:
                x[0, 1, 2, 0], w[0, 0, 0, ws[3] - 1] = np.nan, np.inf
            g = conv_geometry(xs, ws, strides, dilations, padding, groups)
            want = reference.quantized_conv2d(x, w, table, signed, strides, dilations,
                                              (g.pad_top, g.pad_bottom, g.pad_left, g.pad_right),
                                              groups, mode)
            for isa, factoring in _paths(library):
                got = kernel.conv2d(x, w, g, quant=scheme)
                np.testing.assert_array_equal(got, want, err_msg=f"{isa} {factoring} {mode} {xs, ws}")
                compared += 1
    paths = 2 * len(library.supported_isas)
    assert compared == len(list(_modes(signed))) * 2 * (len(MATMUL_CASES) + len(CONV_CASES)) * paths



def test_bias_is_added_after_the_factored_sums(library):
    """The fused call's bias: float32(scale * sum) + bias, as the table kernels' epilogue."""
    from graphswap.native.abi import LutQuant
    table = resolve_multiplier("mul8u_drum4").table
    a = RNG.normal(0.2, 1.0, (50, 40)).astype(np.float32)
    b = RNG.normal(0, 0.3, (40, 11)).astype(np.float32)
    bias = RNG.normal(size=11).astype(np.float32)
    quant = LutQuant(scheme=0, activation_mode=0, weight_mode=1, weight_encoding=1)
    plain = reference.quantized_matmul(a, b, table, False, {"weights": "sign_magnitude",
                                                            "granularity": "per_channel"})
    for isa, factoring in _paths(library):
        got = library.lut_matmul_f32(a, b, table, quant, bias=bias)
        np.testing.assert_array_equal(got, plain + bias, err_msg=f"{isa} {factoring}")


@pytest.mark.parametrize("name", ["mul8u_drum4", "mul8s_drum4"])
def test_activations_next_to_a_rounding_boundary_get_the_float64_code(name, library):
    """The fused quantize-and-map pass rounds in float32 first; values within its error of a
    half-integer step (here: every activation sits on one, up to float32 rounding) must get the
    code of the float64 quotient, as tests/reference.py computes it."""
    table, signed = TABLES[name]
    kernel = LutKernel(_multiplier(name, table, signed))
    # a static range of float32 values (as a layer holds it): scale ~0.01, zero point 0
    top = float(np.float32(1.27 if signed else 2.55))
    static = (-top, top) if signed else (0.0, top)
    scale = top / 127.0 if signed else top / 255.0
    steps = np.arange(-127, 127) if signed else np.arange(0, 255)
    halves = ((steps + 0.5) * scale).astype(np.float32)
    a = np.resize(halves, (64, 40)).astype(np.float32)
    b = RNG.normal(0, 0.3, (40, 7)).astype(np.float32)
    x = np.resize(halves, (2, 8, 8, 4)).astype(np.float32)
    w = RNG.normal(0, 0.3, (3, 3, 4, 5)).astype(np.float32)
    g = conv_geometry(x.shape, w.shape, (1, 1), (1, 1), "same", 1)
    weights = "symmetric" if signed else "sign_magnitude"
    mode = {"weights": weights, "granularity": "per_channel", "activation_range": static}
    scheme = _scheme(mode)
    want_mm = reference.quantized_matmul(a, b, table, signed, mode)
    want_conv = reference.quantized_conv2d(x, w, table, signed, (1, 1), (1, 1),
                                           (g.pad_top, g.pad_bottom, g.pad_left, g.pad_right), 1, mode)
    for path in _paths(library):
        np.testing.assert_array_equal(kernel.matmul(a, b, quant=scheme), want_mm, err_msg=str(path))
        np.testing.assert_array_equal(kernel.conv2d(x, w, g, quant=scheme), want_conv, err_msg=str(path))
