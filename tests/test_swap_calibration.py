"""Static calibration: ranges equal what the float model's layers see (checked with Keras' own
probe model), calibrated predictions do not depend on the batch while dynamic ones do, the state
round-trips through save/load, the moving-average observer follows its formula, and bad input is
refused with one clear error."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import graphswap
from graphswap import swap
from graphswap.errors import QuantizationError
from graphswap.kernels import QuantScheme

CALIBRATION = 256


def predictions_in_batches(model, x, batch):
    return np.concatenate([np.asarray(model(x[i:i + batch], training=False))
                           for i in range(0, len(x), batch)])


def float_layer_inputs(model, names, x):
    """Each named layer's input in the float model, through a Keras probe model."""
    probe = keras.Model(model.inputs, [model.get_layer(n).input for n in names])
    outputs = probe(x, training=False)
    return [np.asarray(o) for o in outputs]


def test_minmax_ranges_are_the_float_inputs_extremes(lenet, digits):
    x = digits["x_train"][:CALIBRATION]
    swapped, report = graphswap.rewrite_model(lenet, kernel="mul8u_drum4", bias_correction=None, calibration_data=x,
                                              calibration_method="minmax", return_report=True,
                                              calibration_source="float")
    names = [layer.name for layer in swapped.layers if hasattr(layer, "arithmetic")]
    inputs = float_layer_inputs(lenet, names, x)
    for name, values in zip(names, inputs):
        lo, hi = swapped.get_layer(name).current_quantization().activation_range
        # the swapped model's float pass is the original to round-off; min/max of ReLU outputs
        np.testing.assert_allclose([lo, hi], [values.min(), values.max()], rtol=1e-5, atol=1e-6)
    assert any("calibrated static activation ranges of 5 layer(s) on 256 samples" in note
               for note in report.notes)


@pytest.mark.parametrize("method", ["percentile", "mse"])
def test_percentile_and_mse_clip_inside_the_minmax_range(lenet, digits, method):
    x = digits["x_train"][:CALIBRATION]
    minmax = graphswap.rewrite_model(lenet, kernel="mul8u_drum4", bias_correction=None, calibration_data=x,
                                     calibration_method="minmax")
    other = graphswap.rewrite_model(lenet, kernel="mul8u_drum4", bias_correction=None, calibration_data=x,
                                    calibration_method=method)
    narrower = 0
    for a, b in zip(minmax.layers, other.layers):
        if hasattr(a, "arithmetic"):
            (lo_a, hi_a), (lo_b, hi_b) = (a.current_quantization().activation_range,
                                          b.current_quantization().activation_range)
            assert lo_a <= lo_b <= 0 <= hi_b <= hi_a
            narrower += hi_b < hi_a
    assert narrower >= 3


def test_approximate_source_sees_the_approximate_activations(lenet, digits):
    x = digits["x_train"][:CALIBRATION]
    plain = graphswap.rewrite_model(lenet, kernel="mul8u_drum3", bias_correction=None, calibration_data=x,
                                    calibration_source="float")
    aware = graphswap.rewrite_model(lenet, kernel="mul8u_drum3", bias_correction=None, calibration_data=x,
                                    calibration_source="approximate")
    ranges = [(a.current_quantization().activation_range, b.current_quantization().activation_range)
              for a, b in zip(plain.layers, aware.layers) if hasattr(a, "arithmetic")]
    assert ranges[0][0] == ranges[0][1]          # the first layer sees the input either way
    assert any(p != q for p, q in ranges[1:])    # later ones see the approximate activations


@pytest.mark.parametrize("kernel", ["mul8u_drum4", "mul8s_drum3"])
def test_calibrated_predictions_do_not_depend_on_the_batch(lenet, digits, kernel):
    x = digits["x_test"][:200]
    static = graphswap.rewrite_model(lenet, kernel=kernel,
                                     bias_correction=None, calibration_data=digits["x_train"][:CALIBRATION])
    probabilities = predictions_in_batches(static, x, 200)
    # graphswap's part ends at the logits: bit for bit whatever the batch.  The softmax after it
    # is TensorFlow's, whose vectorised exp may round a row's value by one ulp differently
    # depending on where the row falls in the batch (seen on an AVX2-only EPYC), so the
    # probabilities are held to one float32 ulp of 1.
    static.layers[-1].activation = keras.activations.get("linear")
    whole = predictions_in_batches(static, x, 200)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(keras.ops.softmax(whole)),
                               probabilities, rtol=0, atol=np.finfo(np.float32).eps)
    for batch in (1, 7, 32):
        np.testing.assert_array_equal(predictions_in_batches(static, x, batch), whole)
    # the difference the dynamic (per-call) mode shows, and the reason static mode exists
    dynamic = graphswap.rewrite_model(lenet, kernel=kernel)
    difference = np.abs(predictions_in_batches(dynamic, x, 32)
                        - predictions_in_batches(dynamic, x, 200)).max()
    assert difference > 1e-3


def test_quantization_state_round_trips_through_save_and_load(lenet, digits, tmp_path):
    x = digits["x_train"][:CALIBRATION]
    swapped = graphswap.rewrite_model(lenet, kernel="mul8u_drum4", calibration_data=x,
                                      quantization={"weights": "asymmetric",
                                                    "granularity": "per_tensor"},
                                      calibration_method="percentile",
                                      bias_correction="moments")
    path = tmp_path / "static.keras"
    swapped.save(path)
    loaded = keras.models.load_model(path)
    for a, b in zip(swapped.layers, loaded.layers):
        if hasattr(a, "arithmetic"):
            assert b.current_quantization() == a.current_quantization()
            assert b.current_quantization().activations == "static"
            assert b.output_correction == a.output_correction is not None
    test = digits["x_test"][:64]
    np.testing.assert_array_equal(predictions_in_batches(loaded, test, 64),
                                  predictions_in_batches(swapped, test, 64))


def test_files_without_a_scheme_reload_with_the_scheme_they_were_made_with(lenet):
    swapped = graphswap.rewrite_model(lenet, kernel="mul8u_drum4")
    config = swapped.get_layer("conv1").get_config()
    del config["quantization"], config["output_correction"]
    legacy = graphswap.SwappedConv2D.from_config(config)
    assert legacy.quantization == QuantScheme(weights="asymmetric", granularity="per_tensor")
    signed = graphswap.rewrite_model(lenet, kernel="mul8s_drum4").get_layer("conv1").get_config()
    del signed["quantization"]
    assert graphswap.SwappedConv2D.from_config(signed).quantization.weights == "symmetric"


def test_moving_average_observer_follows_its_formula(lenet, digits):
    x = digits["x_train"][:CALIBRATION]
    swapped = graphswap.rewrite_model(lenet, kernel="mul8u_drum4", bias_correction=None, calibration_data=x,
                                      quantization={"observer": "moving_average",
                                                    "momentum": 0.75})
    layer = swapped.get_layer("fc1")
    before = np.array(layer.current_quantization().activation_range)
    swapped(x[:32], training=False)
    assert np.array_equal(layer.current_quantization().activation_range, before)  # inference
    fc1_input = float_layer_inputs(lenet, ["fc1"], x[:32])[0]   # (close to) what fc1 sees
    swapped(x[:32], training=True)
    after = np.array(layer.current_quantization().activation_range)
    observed = np.array([fc1_input.min(), fc1_input.max()])
    np.testing.assert_allclose(after, 0.75 * before + 0.25 * observed, rtol=0.02, atol=1e-6)
    assert layer.get_config()["quantization"]["activation_range"] == [float(v) for v in after]
    fixed = graphswap.rewrite_model(lenet, kernel="mul8u_drum4", bias_correction=None, calibration_data=x)
    range_before = fixed.get_layer("fc1").current_quantization().activation_range
    fixed(x[:32], training=True)
    assert fixed.get_layer("fc1").current_quantization().activation_range == range_before


def test_calibrate_function_on_an_existing_model(lenet, digits):
    swapped = graphswap.rewrite_model(lenet, kernel="mul8u_drum4")
    report = swap.calibrate(swapped, digits["x_train"][:64], samples=64, layers=["fc1"])
    assert list(report.ranges) == ["fc1"]
    assert swapped.get_layer("fc1").quantization.activations == "static"
    assert swapped.get_layer("fc2").quantization.activations == "dynamic"


def test_bad_calibration_input_is_refused(lenet, digits):
    x = digits["x_train"]
    with pytest.raises(QuantizationError, match=r"shape \(40, 32, 32\).*takes \(N, 32, 32, 1\)"):
        graphswap.rewrite_model(lenet, kernel="mul8u_drum4", bias_correction=None, calibration_data=x[:40, :, :, 0])
    with pytest.raises(QuantizationError, match="has 5 example.*at least 16"):
        graphswap.rewrite_model(lenet, kernel="mul8u_drum4", bias_correction=None, calibration_data=x[:5])
    with pytest.raises(QuantizationError, match="unknown calibration method 'median'"):
        graphswap.rewrite_model(lenet, kernel="mul8u_drum4", bias_correction=None, calibration_data=x,
                                calibration_method="median")
    with pytest.raises(QuantizationError, match="unknown calibration source"):
        graphswap.rewrite_model(lenet, kernel="mul8u_drum4", bias_correction=None, calibration_data=x,
                                calibration_source="hardware")
    with pytest.raises(QuantizationError, match="samples must be a whole number >= 16"):
        graphswap.rewrite_model(lenet, kernel="mul8u_drum4", bias_correction=None, calibration_data=x,
                                calibration_samples=3)
    with pytest.raises(QuantizationError, match="static activations need calibration data"):
        graphswap.rewrite_model(lenet, kernel="mul8u_drum4",
                                quantization={"activations": "static"})
    with pytest.raises(QuantizationError, match="bias compensation is estimated on calibration"):
        graphswap.rewrite_model(lenet, kernel="mul8u_drum4", bias_correction="mean")
    with pytest.raises(QuantizationError, match="cannot run on a signed"):
        graphswap.rewrite_model(lenet, kernel="mul8s_drum4",
                                quantization={"weights": "asymmetric"})
    with pytest.raises(QuantizationError, match="unknown quantization preset"):
        graphswap.rewrite_model(lenet, kernel="mul8u_drum4", quantization="tflite")
    with pytest.raises(QuantizationError, match="nothing to calibrate"):
        swap.calibrate(graphswap.rewrite_model(lenet, kernel="exact"), x)


def test_static_layer_without_a_range_says_to_calibrate():
    layer = graphswap.SwappedDense(3, arithmetic="mul8u_drum4",
                                   quantization={"activations": "static"})
    with pytest.raises(QuantizationError, match="no calibrated range"):
        layer(np.ones((2, 4), np.float32))


def test_tfapprox_preset_keeps_signed_multipliers_symmetric(lenet):
    unsigned = graphswap.rewrite_model(lenet, kernel="mul8u_drum4", quantization="tfapprox")
    signed = graphswap.rewrite_model(lenet, kernel="mul8s_drum4", quantization="tfapprox")
    assert unsigned.get_layer("fc1").quantization.weights == "asymmetric"
    assert unsigned.get_layer("fc1").quantization.granularity == "per_tensor"
    assert signed.get_layer("fc1").quantization.weights == "symmetric"
