"""explore --calibrate and the zero-training options: every front point converts, with the
convert command the front file records, to a model whose score is the point's; the calibration
computed once gives the numbers calibrating every assignment gives; the options change what is
measured and belong to the study's fingerprint."""

from __future__ import annotations

import inspect
import json
import shlex

import keras
import numpy as np
import pytest
from click.testing import CliRunner

import graphswap
from conftest import SAMPLE_DATA
from graphswap.cli import main
from graphswap.errors import GraphswapError
from graphswap.research import explore
from graphswap.research.exploration import design_space

CIRCUITS = ["mul8u_drum4", "mul8u_drum3"]
POWER = {"exact": 0.40, "mul8u_drum4": 0.20, "mul8u_drum3": 0.12}


@pytest.fixture(scope="module")
def bn_model(tmp_path_factory):
    """A tiny conv net with BatchNormalization (2 swappable layers: 9 assignments), validation
    and calibration files and a power table."""
    folder = tmp_path_factory.mktemp("explore_calibration")
    with np.load(SAMPLE_DATA) as archive:
        x_train, y_train = archive["x_train"][:1500], archive["y_train"][:1500]
        x_test, y_test = archive["x_test"][:160], archive["y_test"][:160]
    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((32, 32, 1)), keras.layers.Rescaling(1 / 255.0),
        keras.layers.Conv2D(6, 5, strides=3, use_bias=False, name="conv"),
        keras.layers.BatchNormalization(name="bn"), keras.layers.ReLU(),
        keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax", name="out")],
        name="bnnet")
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    model.fit(x_train, y_train, epochs=3, batch_size=64, verbose=0)
    path = folder / "bnnet.keras"
    model.save(path)
    data = folder / "val.npz"
    np.savez(data, x=x_test, y=y_test)
    calibration = folder / "calib.npz"
    np.savez(calibration, x_train=x_train[:200], y_train=y_train[:200])
    table = folder / "power.csv"
    table.write_text("name,power\n" + "".join(f"{k},{v}\n" for k, v in POWER.items()))
    return {"path": path, "data": data, "calibration": calibration, "table": table,
            "x": x_test, "y": y_test, "folder": folder}


def _accuracy(model, x, y) -> float:
    return float(np.mean(np.argmax(model.predict(x, batch_size=128, verbose=0), axis=1) == y))


def _convert_every_point(front_path, document, model_path, folder, x, y):
    """Run the front file's own convert command for every point (graphswap convert through the
    CLI) and return the converted models' accuracies."""
    command = document["convert_command"]
    assert command[:5] == ["graphswap", "convert", "MODEL", "--kernel-map", "FRONT#INDEX"]
    accuracies = []
    for index in range(len(document["front"])):
        output = folder / f"point{index}.keras"
        args = ["convert", str(model_path), "--kernel-map", f"{front_path}#{index}",
                *command[5:], "--check-batch", "0", "-o", str(output), "-f"]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, (shlex.join(args), result.output)
        accuracies.append(_accuracy(graphswap.load_model(output), x, y))
    return accuracies


def test_calibrated_front_converts_to_every_points_accuracy(bn_model, tmp_path):
    options = {"calibration_data": str(bn_model["calibration"]), "calibration_samples": 128,
               "bias_correction": "moments", "recalibrate_bn": True}
    result = explore(bn_model["path"], bn_model["data"], CIRCUITS, metrics=bn_model["table"],
                     budget=0.5, estimate_samples=None, progress=False,
                     rewrite_options=options)
    assert result.counts["space"] == 9 and len(result.points) == 9
    assert result.counts["calibration_seconds"] > 0
    front = tmp_path / "front.json"
    result.write(front)
    document = json.loads(front.read_text())
    recorded = document["rewrite_options"]
    assert recorded["calibrate"] == str(bn_model["calibration"])
    assert recorded["calibration_samples"] == 128 and recorded["bias_correction"] == "moments"
    assert recorded["recalibrate_bn"] is True
    assert {"--calibrate", "--bias-correction", "--recalibrate-bn"} <= \
        set(document["convert_command"])
    # every point, converted by the command the file gives, scores exactly what it reports
    accuracies = _convert_every_point(front, document, bn_model["path"], tmp_path,
                                      bn_model["x"], bn_model["y"])
    assert len(accuracies) == len(document["front"]) >= 2
    for point, accuracy in zip(document["front"], accuracies):
        assert accuracy == pytest.approx(point["accuracy"], abs=1e-12), point["assignment"]


def test_calibration_once_gives_the_numbers_of_calibrating_every_assignment(bn_model):
    # ranges only (no step that observes the approximate forward - BatchNorm re-estimation,
    # the default for this BatchNorm model, left out too): calibrated once
    options = {"calibration_data": str(bn_model["calibration"]), "calibration_samples": 128,
               "calibration_method": "mse", "bias_correction": None, "recalibrate_bn": False,
               "calibration_source": "float", "dynamic_fallback": False}
    common = dict(metrics=bn_model["table"], budget=0.5, estimate_samples=None,
                  progress=False, exhaustive_limit=0, trials=5, seed=3)
    reused = explore(bn_model["path"], bn_model["data"], CIRCUITS, rewrite_options=options,
                     **common)
    fresh = explore(bn_model["path"], bn_model["data"], CIRCUITS, rewrite_options=options,
                    reuse_calibration=False, **common)
    # rewrite_model gaining a step the reuse does not know turns it off (correct, slower)
    known = not (set(inspect.signature(graphswap.rewrite_model).parameters)
                 - design_space.KNOWN_REWRITE_PARAMETERS)
    assert reused.counts["calibration_reused"] is known
    assert fresh.counts["calibration_reused"] is False
    scores = {tuple(p["assignment"].values()): (p["accuracy"], p["loss"]) for p in reused.points}
    assert len(scores) >= 4
    for point in fresh.points:
        assert scores[tuple(point["assignment"].values())] == (point["accuracy"], point["loss"])
    # with bias correction every assignment is calibrated by rewrite_model itself
    corrected = explore(bn_model["path"], bn_model["data"], CIRCUITS, **common,
                        rewrite_options={**options, "bias_correction": "mean"})
    assert corrected.counts["calibration_reused"] is False
    # and the calibration matters: dynamic ranges measure other numbers
    dynamic = explore(bn_model["path"], bn_model["data"], CIRCUITS, **common)
    losses = {tuple(p["assignment"].values()): p["loss"] for p in dynamic.points}
    assert any(losses[key] != value[1] for key, value in scores.items() if key in losses)


def test_cli_explore_calibrate_folded_front_converts_and_study_remembers_options(bn_model,
                                                                                  tmp_path):
    front, study = tmp_path / "front.json", tmp_path / "study.db"
    base = ["explore", str(bn_model["path"]), "--data", str(bn_model["data"]),
            "--library", CIRCUITS[0], "--metrics", str(bn_model["table"]), "--budget", "50",
            "--estimate-samples", "64", "--study", str(study), "-o", str(front), "-f"]
    result = CliRunner().invoke(main, [*base, "--calibrate", str(bn_model["calibration"]),
                                       "--calibration-samples", "64", "--fold-batchnorm",
                                       "--calibration-method", "minmax"])
    assert result.exit_code == 0, result.output
    assert "--fold-batchnorm" in result.output and "--calibrate" in result.output
    document = json.loads(front.read_text())
    assert document["rewrite_options"]["fold_batchnorm"] is True
    accuracies = _convert_every_point(front, document, bn_model["path"], tmp_path,
                                      bn_model["x"], bn_model["y"])
    for point, accuracy in zip(document["front"], accuracies):
        assert accuracy == pytest.approx(point["accuracy"], abs=1e-12)
    # the same study without the options belongs to another exploration
    again = CliRunner().invoke(main, base)
    assert again.exit_code == 1 and again.output.startswith("Error: ")
    assert "belongs to another exploration: its rewrite differ(s)" in again.output
    # zero-training options without --calibrate: one clear error, as convert gives
    bad = CliRunner().invoke(main, [*base, "--bias-correction", "mean"])
    assert bad.exit_code != 0 and "--bias-correction needs --calibrate DATA" in bad.output
    with pytest.raises(GraphswapError, match="unknown rewrite option"):
        explore(bn_model["path"], bn_model["data"], CIRCUITS, metrics=bn_model["table"],
                rewrite_options={"calibrate": 1}, progress=False)
