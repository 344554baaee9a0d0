"""LutKernel runs every QuantScheme through the fused C entry points (one call per product); the
numpy pipeline it falls back to (empty operands, libraries without them) gives the same results bit
for bit, on every instruction-set path this CPU runs, factored tables with factoring on and off."""

import itertools

import numpy as np
import pytest

from conftest import table_paths
from graphswap import native
from graphswap.kernels import QuantScheme, resolve_kernel
from graphswap.native import conv_geometry

MODES = [m for m in itertools.product(["sign_magnitude", "asymmetric", "symmetric"],
                                      ["per_channel", "per_tensor"], ["dynamic", "static"])]


def _operands(rng, non_finite):
    a = rng.normal(size=(37, 29)).astype(np.float32)
    b = rng.normal(size=(29, 13)).astype(np.float32)
    x = rng.normal(size=(2, 9, 8, 6)).astype(np.float32)
    w = rng.normal(size=(3, 3, 3, 10)).astype(np.float32)
    if non_finite:
        a[3, 4] = np.nan
        b[5, 2] = np.inf
        x[0, 2, 3, 1] = np.nan
    return a, b, x, w


@pytest.mark.parametrize("spec", ["mul8u_drum4", "mul8s_drum4", "mul8u_mitchell"])
def test_fused_path_equals_the_numpy_pipeline_on_every_isa(spec, each_isa):
    kernel = resolve_kernel(spec)
    assert kernel._fused, "the shipped library has the fused LUT entry points"
    rng = np.random.default_rng(7)
    compared = 0
    for isa in table_paths(each_isa):
        for (weights, granularity, activations), non_finite in itertools.product(MODES,
                                                                                 [False, True]):
            if (weights == "symmetric") != kernel.signed:
                continue
            scheme = QuantScheme(weights=weights, granularity=granularity).resolve(kernel.signed)
            if activations == "static":
                scheme = scheme.with_range(-0.7, 2.3)
            a, b, x, w = _operands(rng, non_finite)
            geometry = conv_geometry(x.shape, w.shape, (1, 2), (1, 1), "same", 2)
            fused = (kernel.matmul(a, b, quant=scheme), kernel.conv2d(x, w, geometry, quant=scheme))
            kernel._fused = False
            try:
                pipeline = (kernel.matmul(a, b, quant=scheme),
                            kernel.conv2d(x, w, geometry, quant=scheme))
            finally:
                kernel._fused = True
            for got, expected in zip(fused, pipeline):
                np.testing.assert_array_equal(got, expected, err_msg=f"{isa} {scheme}")
                compared += 1
            assert not np.isnan(fused[0]).all()
            if non_finite:
                assert np.isnan(fused[0][3]).all() and np.isnan(fused[0][:, 2]).all()
    assert compared >= 2 * 4 * 2 * 2 * len(each_isa.supported_isas)


@pytest.mark.parametrize("spec", ["mul8u_drum4", "mul8s_drum4", "mul8u_mitchell"])
def test_weights_changed_in_place_between_calls_get_their_own_codes(spec):
    """The fused calls keep the last weights' quantization, keyed by the weights' contents
    (native_kernels/src/lut_wcache.c): the same weights again (a recurrent layer's timesteps),
    the same buffer rewritten in place (an optimizer step), the same weights under another
    scheme, and a weight turned non-finite each get tests/reference.py's result, bit for bit."""
    import reference

    kernel = resolve_kernel(spec)
    mult = kernel.multiplier
    rng = np.random.default_rng(17)
    a = np.maximum(rng.normal(size=(9, 40)), -0.2).astype(np.float32)
    b = rng.normal(size=(40, 24)).astype(np.float32)
    x = rng.normal(size=(2, 6, 5, 4)).astype(np.float32)
    w = rng.normal(size=(3, 3, 4, 8)).astype(np.float32)
    geometry = conv_geometry(x.shape, w.shape, (1, 1), (1, 1), "same")
    encodings = ["symmetric"] if kernel.signed else ["sign_magnitude", "asymmetric"]

    def check():
        for weights, granularity in itertools.product(encodings, ["per_channel", "per_tensor"]):
            mode = {"weights": weights, "granularity": granularity}
            scheme = QuantScheme(**mode).resolve(kernel.signed)
            for _ in range(2):   # the second call finds the weights cached
                np.testing.assert_array_equal(
                    kernel.matmul(a, b, quant=scheme),
                    reference.quantized_matmul(a, b, mult.table, mult.signed, mode))
                np.testing.assert_array_equal(
                    kernel.conv2d(x, w, geometry, quant=scheme),
                    reference.quantized_conv2d(x, w, mult.table, mult.signed, (1, 1), (1, 1),
                                               (1, 1, 1, 1), 1, mode))

    check()
    b[:, 3] *= -2.5            # in place: the same buffer, other values
    w[1, 1, 2, 5] = 7.0
    check()
    b[4, 7] = np.nan
    check()


def test_a_large_layer_is_cached_on_its_second_call_and_compared_in_full():
    """Layers of more than 256K weights are stored on the second call with the same weights (a
    fingerprint of sampled values says they were seen; lut_wcache.c), found on the third; a
    weight the fingerprint does not sample, changed in place, still gets its own codes: every
    call equals tests/reference.py bit for bit."""
    import reference

    kernel = resolve_kernel("mul8u_mitchell")
    mult = kernel.multiplier
    rng = np.random.default_rng(23)
    a = np.maximum(rng.normal(size=(4, 520)), 0).astype(np.float32)
    b = rng.normal(size=(520, 520)).astype(np.float32)      # 270,400 weights
    mode = {"weights": "sign_magnitude", "granularity": "per_channel"}
    scheme = QuantScheme(**mode).resolve(kernel.signed)
    for step in range(5):
        if step == 3:
            b[0, 1] = 3 * np.abs(b).max()   # index 1: between the fingerprint's samples
        np.testing.assert_array_equal(
            kernel.matmul(a, b, quant=scheme),
            reference.quantized_matmul(a, b, mult.table, mult.signed, mode), err_msg=str(step))
