"""Design-space exploration: the search finds the optimum brute force computes, the error model
is exact where it must be, studies resume after a kill, every front point converts to the
accuracy the front reports, and bad input gets one clear error."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest
from click.testing import CliRunner

import graphswap
from conftest import SAMPLE_DATA
from graphswap.cli import main
from graphswap.errors import GraphswapError
from graphswap.research import explore, load_library
from graphswap.research.exploration import design_space

CIRCUITS = ["mul8u_trunc4", "mul8u_drum4", "mul8u_drum3"]
POWER = {"exact": 0.40, "mul8u_trunc4": 0.33, "mul8u_drum4": 0.20, "mul8u_drum3": 0.12}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A small conv net trained on the shipped digits (3 swappable layers), its data and a
    metrics table with known power figures."""
    folder = tmp_path_factory.mktemp("explore")
    with np.load(SAMPLE_DATA) as archive:
        x_train, y_train = archive["x_train"], archive["y_train"]
        x_test, y_test = archive["x_test"][:200], archive["y_test"][:200]
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((32, 32, 1)), keras.layers.Rescaling(1 / 255.0),
        keras.layers.Conv2D(4, 5, strides=2, activation="relu", name="conv"),
        keras.layers.Flatten(), keras.layers.Dense(16, activation="relu", name="hidden"),
        keras.layers.Dense(10, activation="softmax", name="out")], name="small")
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    model.fit(x_train, y_train, epochs=6, batch_size=64, verbose=0)
    path = folder / "small.keras"
    model.save(path)
    data = folder / "val.npz"
    np.savez(data, x=x_test, y=y_test)
    table = folder / "power.csv"
    table.write_text("name,power\n" + "".join(f"{k},{v}\n" for k, v in POWER.items()))
    return {"model": keras.models.load_model(path), "path": path, "data": data, "table": table,
            "x": x_test, "y": y_test, "folder": folder}


def _accuracy(model, x, y) -> float:
    return float(np.mean(np.argmax(model.predict(x, batch_size=128, verbose=0), axis=1) == y))


def test_exhaustive_search_finds_the_brute_force_optimum(small):
    budget = 0.02
    result = explore(small["model"], small["data"], CIRCUITS, metrics=small["table"],
                     budget=budget, estimate_samples=None, progress=False)
    assert result.counts["space"] == 4 ** 3 and len(result.points) == 64
    macs = {entry["layer"]: entry["macs"] for entry in result.layers}
    # brute force, independently: every assignment rewritten, predicted, costed
    float_accuracy = _accuracy(small["model"], small["x"], small["y"])
    assert result.baseline["accuracy"] == pytest.approx(float_accuracy)
    best = None
    for combination in itertools.product(["exact", *CIRCUITS], repeat=3):
        assignment = dict(zip(["conv", "hidden", "out"], combination))
        kernel_map = {layer: ("mul8u_exact" if name == "exact" else name)
                      for layer, name in assignment.items()}
        swapped = graphswap.rewrite_model(small["model"], kernel=None, kernel_map=kernel_map)
        accuracy = _accuracy(swapped, small["x"], small["y"])
        cost = sum(macs[l] * POWER[n] for l, n in assignment.items()) / \
            sum(macs.values()) / POWER["exact"]
        if float_accuracy - accuracy <= budget + 1e-12 and (best is None or cost < best[0]):
            best = (cost, accuracy, assignment)
    assert result.best["assignment"] == best[2]
    assert result.best["relative_cost"] == pytest.approx(best[0])
    assert result.best["accuracy"] == pytest.approx(best[1])
    # the front is non-dominated
    for point in result.front:
        for other in result.points:
            assert not (other["accuracy_drop"] <= point["accuracy_drop"] + 1e-12
                        and other["relative_cost"] <= point["relative_cost"] + 1e-12
                        and (other["accuracy_drop"] < point["accuracy_drop"] - 1e-12
                             or other["relative_cost"] < point["relative_cost"] - 1e-12))


def test_error_model_is_exact_for_one_layer_and_reported(small):
    result = explore(small["model"], small["data"], CIRCUITS, metrics=small["table"],
                     budget=0.05, estimate_samples=None, progress=False)
    assert result.prediction["single_layer_max_abs_error"] < 1e-12  # exact up to float64 round-off
    assert result.prediction["points"] == 63
    assert result.prediction["mean_abs_error"] is not None
    singles = [p for p in result.points
               if sum(n != "exact" for n in p["assignment"].values()) == 1]
    assert len(singles) == 9
    for point in singles:
        assert point["predicted_drop"] == pytest.approx(point["accuracy_drop"], abs=1e-12)
    # the additive model too, on a subset: it predicts single layers of the subset exactly
    additive = design_space.ErrorModel(0.01, {"a": {"c": 0.02}, "b": {"c": 0.03}}, 0.9,
                                       "additive")
    assert additive.predict({"a": "c", "b": "exact"}) == pytest.approx(0.03)
    assert additive.predict({"a": "c", "b": "c"}) == pytest.approx(0.06)
    multiplicative = design_space.ErrorModel(0.0, {"a": {"c": 0.45}, "b": {"c": 0.45}}, 0.9)
    assert multiplicative.predict({"a": "c", "b": "c"}) == pytest.approx(0.9 - 0.9 * 0.5 * 0.5)


def test_nsga_search_measures_every_front_point(small):
    result = explore(small["model"], small["data"], CIRCUITS, metrics=small["table"],
                     budget=0.03, exhaustive_limit=0, trials=25, estimate_samples=100, seed=1,
                     progress=False)
    assert 4 + 1 <= len(result.points) <= 25 + 1
    assert result.best is not None and result.best["accuracy_drop"] <= 0.03 + 1e-12
    singles = [p for name, p in result.references.items() if name != "all exact"]
    cheapest_uniform = min((p for p in singles if p["accuracy_drop"] <= 0.03 + 1e-12),
                           key=lambda p: p["relative_cost"], default=None)
    if cheapest_uniform is not None:
        assert result.best["relative_cost"] <= cheapest_uniform["relative_cost"] + 1e-12
    point = result.front[len(result.front) // 2]
    swapped = graphswap.rewrite_model(small["model"], kernel=None, kernel_map=point["kernel_map"])
    assert _accuracy(swapped, small["x"], small["y"]) == pytest.approx(point["accuracy"])


def test_every_front_kernel_map_converts_to_its_accuracy(small, tmp_path):
    result = explore(small["model"], small["data"], CIRCUITS, metrics=small["table"],
                     budget=0.05, progress=False)
    front = tmp_path / "front.json"
    result.write(front)
    document = json.loads(front.read_text())
    assert len(document["front"]) == len(result.front) >= 2
    for index, point in enumerate(document["front"]):
        converted = graphswap.convert(small["path"], kernel_map=f"{front}#{index}",
                                      check_batch=0, output=tmp_path / f"p{index}.keras")
        loaded = graphswap.load_model(converted.output)
        assert _accuracy(loaded, small["x"], small["y"]) == pytest.approx(point["accuracy"])
    with pytest.raises(GraphswapError, match=r"exploration front of \d+ kernel maps; pick one"):
        graphswap.convert(small["path"], kernel_map=str(front), check_batch=0,
                          output=tmp_path / "x.keras")


def test_interrupted_study_resumes_without_measuring_again(small, tmp_path):
    study = tmp_path / "study.db"
    script = textwrap.dedent(f"""
        import os, signal
        import graphswap
        from graphswap.research.exploration import design_space
        calls = {{"n": 0}}
        measure = design_space.Evaluator.measure
        def killing_measure(self, assignment):
            calls["n"] += 1
            if calls["n"] > 30:
                os.kill(os.getpid(), signal.SIGKILL)
            return measure(self, assignment)
        design_space.Evaluator.measure = killing_measure
        graphswap.explore({str(small['path'])!r}, {str(small['data'])!r}, {CIRCUITS!r},
                          metrics={str(small['table'])!r}, budget=0.02, study={str(study)!r},
                          estimate_samples=None, progress=False)
    """)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",
           "PYTHONPATH": str(Path(graphswap.__file__).resolve().parent.parent)}
    killed = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, timeout=900)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    # the killed worker's claim on the assignment it was measuring is taken over once its
    # heartbeat is older than claim_timeout
    resumed = explore(small["path"], small["data"], CIRCUITS, metrics=small["table"],
                      budget=0.02, study=study, estimate_samples=None, progress=False,
                      claim_timeout=2)
    stored = resumed.counts["stored_before"]
    assert 10 <= stored < 64
    assert resumed.counts["full_evaluations_this_run"] == 64 - stored
    assert len(resumed.points) == 64
    # a finished study answers another budget without measuring anything
    again = explore(small["path"], small["data"], CIRCUITS, metrics=small["table"],
                    budget=0.05, study=study, estimate_samples=None, progress=False)
    assert again.counts["full_evaluations_this_run"] == 0
    assert again.counts["estimate_evaluations_this_run"] is None
    assert again.best["relative_cost"] <= resumed.best["relative_cost"] + 1e-12


def test_a_study_of_another_model_is_refused(small, tmp_path):
    study = tmp_path / "study.db"
    explore(small["model"], small["data"], CIRCUITS[:1], metrics=small["table"], budget=0.05,
            include=["out"], study=study, progress=False)
    other = keras.models.clone_model(small["model"])
    other.set_weights([w * 0.5 for w in small["model"].get_weights()])
    with pytest.raises(GraphswapError, match=r"belongs to another exploration: its model"):
        explore(other, small["data"], CIRCUITS[:1], metrics=small["table"], budget=0.05,
                include=["out"], study=study, progress=False)


def test_library_bad_input(small, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(GraphswapError, match="holds no multiplier files"):
        load_library([str(empty)])
    broken = tmp_path / "lib"
    broken.mkdir()
    (broken / "mul8u_broken.c").write_text("uint16_t mul8u_broken(uint8_t a, uint8_t b) { oops }")
    (broken / "mul8u_fine.c").write_text(
        "#include <stdint.h>\n// PDK45_PWR = 0.2\n"
        "uint16_t mul8u_fine(uint8_t a, uint8_t b) { return (uint16_t)((a * b) & ~3u); }\n")
    library = load_library([str(broken)])
    assert [c.name for c in library.circuits] == ["mul8u_fine"]
    assert library.circuits[0].metrics["power"] == 0.2
    assert library.skipped[0][0].endswith("mul8u_broken.c") and "compile" in library.skipped[0][1]
    result = explore(small["model"], small["data"], [str(broken)], budget=0.05,
                     include=["out"], progress=False)
    assert any("skipped circuit" in n and "mul8u_broken.c" in n for n in result.notes)
    with pytest.raises(GraphswapError, match="mixes signed .* and unsigned"):
        load_library(["mul8u_drum4", "mul8s_drum4"])
    with pytest.raises(GraphswapError, match="objective 'area' needs the area of every circuit"):
        explore(small["model"], small["data"], CIRCUITS, objective="area", progress=False)
    with pytest.raises(GraphswapError, match="budget is a score drop of at least 0"):
        explore(small["model"], small["data"], CIRCUITS, budget=-0.1, progress=False)
    with pytest.raises(GraphswapError, match="budget is an accuracy drop between 0 and 1"):
        explore(small["model"], small["data"], CIRCUITS, budget=1.5, progress=False)


def test_a_budget_below_the_all_exact_drop_is_refused(tmp_path):
    # one huge feature makes per-tensor 8-bit activations lose the small, informative ones
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 4)).astype(np.float32) * 0.5
    x[:, 0] = 1000.0
    y = (x[:, 1] > 0).astype(np.int64)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="d")])
    model.set_weights([np.array([[0, 0], [-1, 1], [0, 0], [0, 0]], np.float32),
                       np.zeros(2, np.float32)])
    with pytest.raises(GraphswapError, match=r"below the accuracy drop of the all-exact 8-bit"):
        explore(model, (x, y), ["mul8u_drum4"], metrics={"mul8u_drum4": {"power": 0.2}},
                budget=0.01, progress=False)


def test_cli_explore_writes_front_and_plot(small, tmp_path):
    front, plot = tmp_path / "front.json", tmp_path / "front.png"
    result = CliRunner().invoke(main, [
        "explore", str(small["path"]), "--data", str(small["data"]), "--library", CIRCUITS[1],
        "--library", CIRCUITS[2], "--metrics", str(small["table"]), "--budget", "3",
        "--include", "hidden", "--include", "out", "-o", str(front), "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    assert "best within budget" in result.output and f"wrote {front}" in result.output
    document = json.loads(front.read_text())
    assert document["schema"] == "graphswap.explore/1" and document["front"]
    assert plot.read_bytes().startswith(b"\x89PNG")
    bad = CliRunner().invoke(main, ["explore", str(small["path"]), "--data", str(small["data"]),
                                    "--library", str(tmp_path / "nowhere"), "-o",
                                    str(tmp_path / "f2.json")])
    assert bad.exit_code == 1 and bad.output.startswith("Error: ") and "Traceback" not in \
        bad.output
