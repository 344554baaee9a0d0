"""The quantization options end to end on the command line: convert --calibrate (with bias
compensation, BN re-estimation and folding), evaluate/sweep with the same options, finetune
--recalibrate-bn, and every bad input as one `Error:` line."""

from __future__ import annotations

import json
from pathlib import Path

import keras
import numpy as np
from click.testing import CliRunner

from conftest import SAMPLE_DATA, SAMPLE_MODEL
from graphswap.cli import main

CNN_BN = Path(__file__).resolve().parent.parent / "sample_models" / "cnn_bn.keras"


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_convert_calibrates_compensates_and_saves_static_ranges(tmp_path, digits):
    out = tmp_path / "static.keras"
    result = invoke("convert", SAMPLE_MODEL, "-k", "mul8u_drum4", "--calibrate", SAMPLE_DATA,
                    "--calibration-samples", 100, "--bias-correction", "moments", "-o", out)
    assert result.exit_code == 0, result.output
    assert "calibrated static activation ranges of 5 layer(s) on 100 samples (output, " \
           "approximate forward)" in result.output   # the default method
    assert "output calibration: " in result.output and " layer(s) narrowed from the " \
           "percentile range by their output error through the multiplier" in result.output
    assert "bias compensation on 100 samples" in result.output
    model = keras.models.load_model(out)
    conv1 = model.get_layer("conv1")
    assert conv1.current_quantization().activations == "static"
    assert conv1.output_correction["gain"] is not None
    x = digits["x_test"][:40]
    whole = np.asarray(model(x, training=False))
    np.testing.assert_array_equal(np.concatenate([np.asarray(model(x[i:i + 8], training=False))
                                                  for i in range(0, 40, 8)]), whole)
    # the comparison with the original runs on real inputs: the first calibration examples
    printed = float(result.output.split("max |original - rewritten| on the first 8 calibration "
                                        "examples: ")[1].split()[0])
    calibration = digits["x_train"][:8]
    original = keras.models.load_model(SAMPLE_MODEL)
    want = float(np.abs(np.asarray(original(calibration, training=False))
                        - np.asarray(model(calibration, training=False))).max())
    assert abs(printed - want) <= 0.005 * want


def test_convert_with_batchnorm_folding_and_reestimation(tmp_path):
    out = tmp_path / "folded.keras"
    result = invoke("convert", CNN_BN, "-k", "mul8s_drum3", "--calibrate", SAMPLE_DATA,
                    "--calibration-samples", 64, "--fold-batchnorm", "--json", "-o", out)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert any("folded 3 BatchNormalization layer(s)" in note for note in report["notes"])
    assert not any(isinstance(layer, keras.layers.BatchNormalization)
                   for layer in keras.models.load_model(out).layers)
    result = invoke("convert", CNN_BN, "-k", "mul8s_drum3", "--calibrate", SAMPLE_DATA,
                    "--calibration-samples", 64, "--recalibrate-bn", "-o", tmp_path / "bn.keras")
    assert result.exit_code == 0, result.output
    assert "re-estimated the statistics of 3 BatchNormalization layer(s)" in result.output


def test_fold_batchnorm_without_a_pair_is_a_report_line(tmp_path):
    result = invoke("convert", SAMPLE_MODEL, "-k", "mul8u_drum4", "--fold-batchnorm", "-o",
                    tmp_path / "x.keras")
    assert result.exit_code == 0, result.output
    assert "--fold-batchnorm: no BatchNormalization layer in the model; nothing folded" in \
        result.output


def test_bad_calibration_input_is_one_error_line(tmp_path, digits):
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, x=digits["x_train"][:50, :28, :28, 0], y=digits["y_train"][:50])
    few = tmp_path / "few.npz"
    np.savez(few, x=digits["x_train"][:5], y=digits["y_train"][:5])
    cases = [
        (["--calibrate", wrong], "calibration data: images are 28x28x1 but the model expects 32x32x1"),
        (["--calibrate", few], "has 5 example(s); calibration needs at least 16"),
        (["--calibrate", tmp_path / "missing.npz"], "data not found"),
    ]
    for extra, message in cases:
        result = invoke("convert", SAMPLE_MODEL, "-k", "mul8u_drum4", "-o",
                        tmp_path / "out.keras", "--force", *extra)
        assert result.exit_code == 1, result.output
        lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
        assert len(lines) == 1 and message in lines[0], result.output
        assert not (tmp_path / "out.keras").exists()
    usage = [
        (["--calibrate", SAMPLE_DATA, "--calibration-method", "median"], "median"),
        (["--bias-correction", "mean"], "--bias-correction needs --calibrate DATA"),
        (["--calibration-samples", "64"], "--calibration-samples needs --calibrate DATA"),
        (["--quantization", "tfapprox", "--weights", "asymmetric"], "fixes the weight encoding"),
    ]
    for extra, message in usage:
        result = invoke("convert", SAMPLE_MODEL, "-k", "mul8u_drum4", "-o",
                        tmp_path / "out.keras", "--force", *extra)
        assert result.exit_code == 1 and message in result.output, result.output
    result = invoke("convert", SAMPLE_MODEL, "-k", "mul8s_drum4", "--weights", "asymmetric", "-o",
                    tmp_path / "out.keras", "--force")
    assert result.exit_code == 1 and "cannot run on a signed (mul8s) multiplier" in result.output


def test_evaluate_and_sweep_take_the_same_options(tmp_path):
    result = invoke("evaluate", SAMPLE_MODEL, "--data", SAMPLE_DATA, "-k", "mul8u_drum4",
                    "--calibrate", SAMPLE_DATA, "--calibration-samples", 64,
                    "--json", tmp_path / "e.json")
    assert result.exit_code == 0, result.output
    payload = json.loads((tmp_path / "e.json").read_text())
    assert any("static activations (calibrated)" in note for note in payload["notes"])
    assert any("calibrated static activation ranges" in note for note in payload["notes"])
    result = invoke("evaluate", SAMPLE_MODEL, "--data", SAMPLE_DATA, "-k", "mul8u_drum4")
    assert result.exit_code == 0
    assert "dynamic activations (range per call, as TFApprox)" in result.output
    result = invoke("sweep", SAMPLE_MODEL, "--data", SAMPLE_DATA, "-k", "mul8u_drum3",
                    "--calibrate", SAMPLE_DATA, "--calibration-samples", 32,
                    "--include", "fc", "-o", tmp_path / "map.json")
    assert result.exit_code == 0, result.output
    assert "static activations (calibrated)" in result.output


def test_finetune_recalibrate_bn_with_zero_epochs(tmp_path):
    converted = tmp_path / "bn.swapped.keras"
    assert invoke("convert", CNN_BN, "-k", "mul8s_drum3", "--calibrate", SAMPLE_DATA,
                  "--calibration-samples", 64, "-o", converted).exit_code == 0
    out = tmp_path / "bn.ft.keras"
    result = invoke("finetune", converted, "--data", SAMPLE_DATA, "--epochs", 0,
                    "--recalibrate-bn", "-o", out)
    assert result.exit_code == 0, result.output
    assert "re-estimated the statistics of 3 BatchNormalization layer(s)" in result.output
    before = keras.models.load_model(converted).get_layer("bn2").moving_mean.numpy()
    after = keras.models.load_model(out).get_layer("bn2").moving_mean.numpy()
    assert not np.array_equal(before, after)
    result = invoke("finetune", converted, "--data", SAMPLE_DATA, "--epochs", 0, "-o",
                    tmp_path / "nothing.keras")
    assert result.exit_code == 1 and "epochs must be at least 1 (0 only with" in result.output
