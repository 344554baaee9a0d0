"""The "output" calibration method (graphswap.swap.output_calibration): each
layer's activation range narrowed from the percentile range where the layer's own output through
its multiplier errs less.  The residuals the search ranks by are re-derived here independently
(TensorFlow's float convolution, a per-channel least-squares fit in numpy), the choice is checked
to be their minimum, and a multiplier that keeps only the top bits of each operand (as
EvoApproxLib's mul8u_13QR does) is checked to come out closer to the float model."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner

import graphswap
from graphswap import multipliers
from graphswap.cli import main
from graphswap.swap import calibrate
from graphswap.swap.output_calibration import FACTORS, MARGIN, SEARCH_SAMPLES


@pytest.fixture(scope="module")
def top_bits(tmp_path_factory):
    """An unsigned 8x8 multiplier that keeps the top three bits of each operand."""
    codes = np.arange(256)
    table = np.outer(codes & 0xE0, codes & 0xE0)
    path = tmp_path_factory.mktemp("tables") / "top3.lut"
    multipliers.write_lut(path, table, signed=False)
    return str(path)


def _model():
    keras.utils.set_random_seed(3)
    inputs = keras.Input((8, 8, 3), name="pixels")
    x = keras.layers.Conv2D(8, 3, activation="relu", name="c1")(inputs)
    x = keras.layers.Conv2D(8, 3, activation="relu", name="c2")(x)
    x = keras.layers.Flatten()(x)
    return keras.Model(inputs, keras.layers.Dense(4, name="out")(x), name="small")


def _data(n=320):
    return np.random.default_rng(4).uniform(0, 1, (n, 8, 8, 3)).astype(np.float32)


def _affine_residual(y, reference):
    """Sum over channels of the variance of reference left after the least-squares fit
    reference ~ gain * y + offset (numpy's polyfit, per channel)."""
    y = np.asarray(y, np.float64).reshape(-1, y.shape[-1])
    r = np.asarray(reference, np.float64).reshape(-1, reference.shape[-1])
    total = 0.0
    for j in range(y.shape[1]):
        if np.var(y[:, j]) == 0:
            total += np.var(r[:, j])
            continue
        gain, offset = np.polyfit(y[:, j], r[:, j], 1)
        total += np.mean((r[:, j] - gain * y[:, j] - offset) ** 2)
    return total


def test_the_chosen_range_has_the_least_output_error_by_an_independent_count(top_bits):
    model = _model()
    x = _data()
    swapped = graphswap.rewrite_model(model, kernel=top_bits)
    percentile = calibrate(graphswap.rewrite_model(model, kernel=top_bits), x,
                           method="percentile", source="float")
    report = calibrate(swapped, x, method="output", source="float")
    assert set(report.narrowed) == {"c1", "c2", "out"}
    assert any(factor != 1.0 for factor, _ in report.narrowed.values())
    assert any(line.startswith("output calibration:") for line in report.lines())
    layer = swapped.get_layer("c2")
    c2_input = keras.Model(model.inputs, model.get_layer("c2").input)(x[:SEARCH_SAMPLES])
    reference = tf.nn.conv2d(c2_input, model.get_layer("c2").kernel, 1, "VALID").numpy()
    lo, hi = percentile.ranges["c2"]
    scheme = layer.current_quantization()
    residuals = [_affine_residual(layer.numpy_product(
        np.asarray(c2_input), quant=scheme.with_range(lo * f, hi * f)), reference)
        for f in FACTORS]
    best = int(np.argmin(residuals))
    if not residuals[best] < (1 - MARGIN) * residuals[0]:
        best = 0
    factor, ratio = report.narrowed["c2"]
    assert factor == FACTORS[best]
    assert ratio == pytest.approx(residuals[best] / residuals[0], rel=1e-3)
    # the stored range is the percentile range scaled by the factor, and the report says so
    stored = layer.current_quantization().activation_range
    np.testing.assert_allclose(stored, (lo * factor, hi * factor), rtol=1e-6)
    np.testing.assert_allclose(report.ranges["c2"], stored, rtol=1e-6)


def test_a_top_bits_multiplier_comes_out_closer_to_the_float_model(top_bits):
    model = _model()
    x = _data()
    errors = {}
    for method in ("percentile", "output"):
        swapped = graphswap.rewrite_model(
            model, kernel=top_bits, calibration_data=x[:256], calibration_method=method,
            calibration_source="float", bias_correction=None, weight_tuning=False,
            dynamic_fallback=False, operands="activation_first")
        held_out = x[256:]
        errors[method] = float(np.sqrt(np.mean((np.asarray(swapped(held_out))
                                                - np.asarray(model(held_out))) ** 2)))
    assert errors["output"] < 0.9 * errors["percentile"], errors


def test_layers_it_cannot_search_keep_the_percentile_range(top_bits):
    keras.utils.set_random_seed(5)
    inputs = keras.Input((6, 4))
    x = keras.layers.LSTM(5, return_sequences=True, name="lstm")(inputs)
    x = keras.layers.Reshape((6, 5, 1))(x)
    x = keras.layers.SeparableConv2D(3, 2, name="sep")(x)
    x = keras.layers.Flatten()(x)
    model = keras.Model(inputs, keras.layers.Dense(2, name="out")(x))
    data = np.random.default_rng(6).normal(size=(64, 6, 4)).astype(np.float32)
    percentile = calibrate(graphswap.rewrite_model(model, kernel=top_bits), data,
                           method="percentile", source="float")
    report = calibrate(graphswap.rewrite_model(model, kernel=top_bits), data,
                       method="output", source="float")
    assert set(report.narrowed) == {"out"}       # the recurrent cell and the separable conv: no
    for path, bounds in percentile.ranges.items():
        if not path.startswith("out"):
            assert report.ranges[path] == bounds


def test_cli_output_calibration_reports_and_saves_the_narrowed_ranges(top_bits, tmp_path):
    model = _model()
    model.save(tmp_path / "small.keras")
    np.savez(tmp_path / "calib.npz", x=_data(256))
    out = tmp_path / "small.top3.keras"
    result = CliRunner().invoke(main, [
        "convert", str(tmp_path / "small.keras"), "--kernel", top_bits, "--calibrate",
        str(tmp_path / "calib.npz"), "--calibration-method", "output", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "(output, approximate forward)" in result.output
    line = next(l for l in result.output.splitlines() if l.startswith("output calibration:"))
    assert "narrowed from the percentile range" in line
    reloaded = graphswap.load_model(out)
    ranges = result.output.split("approximate forward): ")[1].splitlines()[0]
    lo, hi = reloaded.get_layer("c2").current_quantization().activation_range
    assert f"c2 [{lo:.4g}, {hi:.4g}]" in ranges
