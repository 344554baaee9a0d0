"""explore names the task's score and explores lower-is-better scores (mse): the budget is an
allowed increase, the best point is the cheapest measured within it (checked against every
measured point), each point's mse is what an independent numpy computation of the converted
model gives, and the table and JSON name the metric."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
from click.testing import CliRunner

import graphswap
from graphswap.cli import main
from graphswap.research import explore

CIRCUITS = ["mul8u_drum4", "mul8u_drum3"]
POWER = {"exact": 0.40, "mul8u_drum4": 0.20, "mul8u_drum3": 0.12}


@pytest.fixture(scope="module")
def regression(tmp_path_factory):
    folder = tmp_path_factory.mktemp("explore_scores")
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (400, 8)).astype(np.float32)
    y = (x @ rng.normal(0, 1, (8, 2)) + 0.1 * np.sin(6 * x[:, :2])).astype(np.float32)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu",
                                                                    name="hidden"),
                              keras.layers.Dense(2, name="out")], name="reg")
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    model.fit(x[:300], y[:300], epochs=30, batch_size=32, verbose=0)
    path = folder / "reg.keras"
    model.save(path)
    data = folder / "val.npz"
    np.savez(data, x=x[300:], y=y[300:])
    table = folder / "power.csv"
    table.write_text("name,power\n" + "".join(f"{k},{v}\n" for k, v in POWER.items()))
    return {"path": path, "data": data, "table": table, "x": x[300:], "y": y[300:],
            "folder": folder}


def test_lower_is_better_mse_budget_is_an_increase(regression, tmp_path):
    float_model = keras.models.load_model(regression["path"])
    float_mse = float(np.mean((float_model.predict(regression["x"], verbose=0) -
                               regression["y"]) ** 2))
    budget = 0.002
    result = explore(regression["path"], regression["data"], CIRCUITS,
                     metrics=regression["table"], budget=budget, estimate_samples=None,
                     task_metrics=["mse"], progress=False)
    assert result.score_metric == "mse" and result.higher_is_better is False
    assert result.baseline["accuracy"] == pytest.approx(float_mse, rel=1e-5)
    assert len(result.points) == 9
    for point in result.points:   # "drop" is the increase of the mse
        assert point["accuracy_drop"] == pytest.approx(point["accuracy"] - float_mse, abs=1e-9)
    within = [p for p in result.points if p["accuracy"] - float_mse <= budget + 1e-12]
    cheapest = min(within, key=lambda p: p["relative_cost"])
    assert result.best["relative_cost"] == pytest.approx(cheapest["relative_cost"])
    assert any(p["accuracy"] - float_mse > budget for p in result.points)  # the budget binds
    front = tmp_path / "front.json"
    result.write(front)
    document = json.loads(front.read_text())
    assert document["score"] == "mse" and document["higher_is_better"] is False
    for index, point in enumerate(document["front"]):
        converted = graphswap.convert(regression["path"], kernel_map=f"{front}#{index}",
                                      check_batch=0, output=tmp_path / f"p{index}.keras")
        outputs = graphswap.load_model(converted.output).predict(regression["x"], batch_size=128,
                                                                 verbose=0)
        assert float(np.mean((outputs - regression["y"]) ** 2)) == \
            pytest.approx(point["accuracy"], rel=1e-5)
    table = result.format_table()
    assert "| mse" in table.splitlines()[0] or " mse " in table.splitlines()[0]
    assert "increase" in table.splitlines()[0] and "budget mse +0.002" in table


def test_cli_explore_names_the_score_and_takes_an_mse_budget(regression, tmp_path):
    front = tmp_path / "front.json"
    result = CliRunner().invoke(main, [
        "explore", str(regression["path"]), "--data", str(regression["data"]),
        "--library", CIRCUITS[0], "--metrics", str(regression["table"]), "--budget", "0.2",
        "--task-metrics", "mse", "--estimate-samples", "50", "-o", str(front)])
    assert result.exit_code == 0, result.output
    table = result.output.split("exhaustive search: all 4 assignments measured\n")[1]
    assert table.split()[:3] == ["#", "mse", "increase"]
    assert "budget mse +0.002" in table and "accuracy" not in table
    assert json.loads(front.read_text())["budget"] == pytest.approx(0.002)
