"""graphswap.evaluate and graphswap.sweep: tables checked against direct computations on small
models, the JSON schemas, CSV, plots, the energy estimate, the kernel map that convert accepts, and
the CLI commands end to end on the sample."""

import json
import textwrap

import keras
import numpy as np
import pytest
from click.testing import CliRunner

from conftest import SAMPLE_DATA, SAMPLE_MODEL
from graphswap import io as gsio
from graphswap.cli import main
from graphswap.errors import GraphswapError, OutputPathError
from graphswap.research.analysis.evaluation import EVALUATE_SCHEMA, evaluate
from graphswap.kernels import resolve_kernel
from graphswap.swap import layer_macs, load_kernel_map, rewrite_model
from graphswap.research.analysis.sweeping import (EXACT_POWER_SIGNED_MW, EXACT_POWER_UNSIGNED_MW,
                                                  SWEEP_SCHEMA, kernel_power, parse_power_options,
                                                  reference_power_for, relative_energy, sweep)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

MULTIPLIER_C = """\
    // MAE% = 1.17 %
    // PDK45_PWR = 0.200 mW
    #include <stdint.h>
    uint16_t mul8u_TOP4(uint8_t a, uint8_t b)
    {
      return (uint16_t)((a & 0xF0) * b);  /* drops the low nibble of a */
    }
"""


def classifier(classes=3, seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((6, 6, 1)),
        keras.layers.Conv2D(4, 3, activation="relu", name="conv"),
        keras.layers.Flatten(name="flat"),
        keras.layers.Dense(8, activation="relu", name="hidden"),
        keras.layers.Dense(classes, activation="softmax", name="out"),
    ], name="clf")
    model.compile(loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def dataset(classes=3, n=40, seed=1):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 6, 6, 1)).astype(np.float32), rng.integers(0, classes, n)


def direct(model, x, y):
    outputs = np.asarray(model(x, training=False))
    loss = float(np.mean(keras.losses.sparse_categorical_crossentropy(y, outputs)))
    return outputs, float(np.mean(outputs.argmax(1) == y)), loss


def test_evaluate_table_matches_a_direct_computation():
    model = classifier()
    x, y = dataset()
    result = evaluate(model, (x, y), ["exact", "fp32_m1"])
    assert [row["name"] for row in result.rows] == ["original", "exact", "fp32_m1"]
    reference, accuracy, loss = direct(model, x, y)
    original = result.rows[0]
    assert original["accuracy"] == pytest.approx(accuracy)
    assert original["loss"] == pytest.approx(loss, rel=1e-5)
    assert original["agreement"] == 1.0 and original["top5_accuracy"] is None
    for row in result.rows[1:]:
        swapped = rewrite_model(model, kernel=row["name"])
        outputs, accuracy, loss = direct(swapped, x, y)
        assert row["swapped_layers"] == 3
        assert row["accuracy"] == pytest.approx(accuracy)
        assert row["loss"] == pytest.approx(loss, rel=1e-5)
        assert row["agreement"] == pytest.approx(np.mean(outputs.argmax(1) ==
                                                         reference.argmax(1)))
    assert result.rows[2]["loss"] != pytest.approx(result.rows[0]["loss"], rel=1e-4)
    table = result.format_table()
    assert "fp32_m1" in table and f"{100 * result.rows[2]['accuracy']:.2f}%" in table


def test_top5_is_reported_beyond_ten_classes():
    model = classifier(classes=12)
    x, y = dataset(classes=12, n=60)
    result = evaluate(model, (x, y), ["exact"])
    outputs = np.asarray(model(x, training=False))
    top5 = np.mean([label in np.argsort(-row)[:5] for row, label in zip(outputs, y)])
    assert result.rows[0]["top5_accuracy"] == pytest.approx(top5)
    assert result.to_dict()["top5"] is True and "top-5" in result.format_table()


def test_evaluate_json_schema_csv_and_plot(tmp_path):
    x, y = dataset()
    result = evaluate(classifier(), (x, y), ["exact"], finetune_data=dataset(n=32, seed=2),
                      epochs=1, batch_size=8, learning_rate=1e-3)
    payload = json.loads(result.to_json())
    assert set(payload) == {"schema", "model", "data", "loss", "top5", "finetune", "rows",
                            "notes", "task", "score"}
    assert payload["task"] == "multiclass" and payload["score"] == "accuracy"
    assert payload["schema"] == EVALUATE_SCHEMA
    assert payload["data"] == {"source": "arrays", "examples": 40, "classes": 3}
    assert payload["finetune"] == {"data": "arrays", "examples": 32, "epochs": 1,
                                   "batch_size": 8, "learning_rate": 1e-3, "seed": 0}
    columns = ["name", "kernel", "swapped_layers", "accuracy", "top5_accuracy", "loss",
               "agreement", "finetuned_accuracy", "finetuned_top5_accuracy", "finetuned_loss",
               "finetuned_agreement"]
    assert all(list(row) == columns for row in payload["rows"])
    assert payload["rows"][0]["finetuned_accuracy"] is None
    assert 0.0 <= payload["rows"][1]["finetuned_accuracy"] <= 1.0
    result.write(tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text()) == payload
    result.write(tmp_path / "r.csv")
    lines = (tmp_path / "r.csv").read_text().splitlines()
    assert lines[0] == ",".join(columns) and len(lines) == 3
    assert lines[1].startswith("original,,0,")
    result.plot(tmp_path / "r.png")
    data = (tmp_path / "r.png").read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 5000
    with pytest.raises(OutputPathError, match="already exists; pass --force"):
        result.plot(tmp_path / "r.png")
    with pytest.raises(GraphswapError, match="must end in .json or .csv"):
        result.write(tmp_path / "r.txt")


def test_sweep_matches_single_layer_swaps_macs_and_energy(tmp_path):
    model = classifier()
    x, y = dataset()
    result = sweep(model, (x, y), "fp32_m1", power=0.2, max_accuracy_drop=0.05)
    assert [entry["layer"] for entry in result.layers] == ["conv", "hidden", "out"]
    macs = {layer.name: layer_macs(layer) for layer in model.layers if layer_macs(layer)}
    assert macs == {"conv": 4 * 4 * 4 * 9, "hidden": 64 * 8, "out": 8 * 3}
    total = sum(macs.values())
    _, baseline, _ = direct(model, x, y)
    assert result.baseline["accuracy"] == pytest.approx(baseline)
    for entry in result.layers:
        one = rewrite_model(model, kernel=None, kernel_map={entry["layer"]: "fp32_m1"})
        _, accuracy, loss = direct(one, x, y)
        assert entry["macs"] == macs[entry["layer"]]
        assert entry["mac_share"] == pytest.approx(macs[entry["layer"]] / total)
        assert entry["accuracy"] == pytest.approx(accuracy)
        assert entry["accuracy_drop"] == pytest.approx(baseline - accuracy)
        expected = ((total - entry["macs"]) * EXACT_POWER_UNSIGNED_MW + entry["macs"] * 0.2) / (
            total * EXACT_POWER_UNSIGNED_MW)
        assert entry["relative_energy"] == pytest.approx(expected)
    everything = result.configurations[-1]
    assert everything["layers"] and len(everything["layers"]) == 3
    assert everything["relative_energy"] == pytest.approx(0.2 / EXACT_POWER_UNSIGNED_MW)
    _, accuracy_all, _ = direct(rewrite_model(model, kernel="fp32_m1"), x, y)
    assert everything["accuracy"] == pytest.approx(accuracy_all)
    assert result.configurations[0]["relative_energy"] == 1.0
    assert result.configurations[0]["pareto"] or result.configurations[0]["accuracy"] < max(
        c["accuracy"] for c in result.configurations)
    rec = result.recommended
    assert baseline - rec["accuracy"] <= 0.05 + 1e-12
    cheaper = [c for c in result.configurations if c["relative_energy"] < rec["relative_energy"]]
    assert all(baseline - c["accuracy"] > 0.05 for c in cheaper)
    payload = result.to_dict()
    assert payload["schema"] == SWEEP_SCHEMA
    assert set(payload) == {"schema", "model", "kernel", "data", "baseline", "layers",
                            "configurations", "recommended", "kernel_map",
                            "max_accuracy_drop", "energy", "notes", "score"}
    assert payload["score"] == "accuracy"
    assert payload["energy"] == {"power_mw": 0.2, "power_source": "--power",
                                 "reference_power_mw": EXACT_POWER_UNSIGNED_MW,
                                 "reference_source": "EvoApproxLib mul8u_1JFF (exact 8x8 "
                                                     "unsigned), PDK45"}


def test_sweep_kernel_map_is_accepted_by_convert_and_rewrite(tmp_path):
    model = classifier()
    x, y = dataset()
    result = sweep(model, (x, y), "fp32_m2", max_accuracy_drop=1.0)
    assert result.power is None and result.layers[0]["relative_energy"] is None
    assert result.recommended["name"] == "all swappable layers"  # any drop is within 100 points
    result.write_kernel_map(tmp_path / "map.json")
    document = json.loads((tmp_path / "map.json").read_text())
    assert document["kernel_map"] == {"conv": "fp32_m2", "hidden": "fp32_m2", "out": "fp32_m2"}
    assert load_kernel_map(tmp_path / "map.json") == document["kernel_map"]
    _, report = rewrite_model(model, kernel=None, kernel_map=tmp_path / "map.json",
                              return_report=True)
    assert [e.path for e in report.swapped] == ["conv", "hidden", "out"]
    strict = sweep(model, (x, y), "fp32_m1", max_accuracy_drop=0.0)
    assert strict.recommended["accuracy"] >= strict.baseline["accuracy"]
    assert {k for k, v in strict.kernel_map().items() if v} == set(
        strict.recommended["layers"])
    model.save(tmp_path / "clf.keras")
    convert = CliRunner().invoke(main, ["convert", str(tmp_path / "clf.keras"), "--kernel-map",
                                        str(tmp_path / "map.json"), "-o",
                                        str(tmp_path / "clf.map.keras")])
    assert convert.exit_code == 0, convert.output
    assert "3 of 3 layers with weights swapped" in convert.output
    result.plot(tmp_path / "pareto.png")
    assert (tmp_path / "pareto.png").read_bytes().startswith(PNG_SIGNATURE)


def test_power_from_the_multiplier_source_and_the_reference_powers(tmp_path):
    path = tmp_path / "mul8u_TOP4.c"
    path.write_text(textwrap.dedent(MULTIPLIER_C))
    kernel = resolve_kernel(str(path))
    assert kernel_power(kernel) == (0.2, "PDK45_PWR in the kernel's source")
    assert kernel_power(kernel, {str(path): 0.3}) == (0.3, "--power")
    assert kernel_power(kernel, {None: 0.25}) == (0.25, "--power")
    assert kernel_power(resolve_kernel("fp32_m3")) == (None, "")
    assert reference_power_for(kernel) == (EXACT_POWER_UNSIGNED_MW, "EvoApproxLib mul8u_1JFF "
                                           "(exact 8x8 unsigned), PDK45")
    assert reference_power_for(resolve_kernel("mul8s_drum4"))[0] == EXACT_POWER_SIGNED_MW
    assert reference_power_for(kernel, 0.5) == (0.5, "--reference-power")
    assert parse_power_options(["mul.c=0.25", "0.1", "a=b=0.3 mW"]) == {
        "mul.c": 0.25, None: 0.1, "a=b": 0.3}
    with pytest.raises(GraphswapError, match="expected a power in mW such as 0.25, got 'x'"):
        parse_power_options(["k=x"])
    assert relative_energy({"a": 100, "b": 300}, {"b"}, 0.2, 0.4) == pytest.approx(
        (100 * 0.4 + 300 * 0.2) / (400 * 0.4))
    model = classifier()
    result = sweep(model, dataset(), str(path))
    assert result.power == 0.2 and result.power_source == "PDK45_PWR in the kernel's source"
    assert result.configurations[-1]["relative_energy"] == pytest.approx(
        0.2 / EXACT_POWER_UNSIGNED_MW)


def test_sweep_and_evaluate_errors():
    model = classifier()
    with pytest.raises(GraphswapError, match="max accuracy drop is a fraction between 0 and 1"):
        sweep(model, dataset(), "exact", max_accuracy_drop=5)
    with pytest.raises(GraphswapError, match="no layer of 'clf' can be swapped"):
        sweep(model, dataset(), "exact", include="nothing_matches")
    with pytest.raises(GraphswapError, match="unknown kernel 'nope'"):
        evaluate(model, dataset(), ["nope"])


def test_cli_evaluate_and_sweep_on_the_sample(tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["evaluate", str(SAMPLE_MODEL), "--data", str(SAMPLE_DATA),
                                  "-k", "exact", "-k", "mul8u_drum4", "--quantization", "tfapprox",
                                  "-o", str(tmp_path / "e.json"), "--plot",
                                  str(tmp_path / "e.png")])
    assert result.exit_code == 0, result.output
    assert "dynamic activations (range per call, as TFApprox)" in result.output
    payload = json.loads((tmp_path / "e.json").read_text())
    rows = {row["name"]: row for row in payload["rows"]}
    assert rows["exact"]["accuracy"] == rows["original"]["accuracy"] > 0.99
    assert rows["mul8u_drum4"]["accuracy"] < rows["original"]["accuracy"] - 0.05
    assert f"{100 * rows['mul8u_drum4']['accuracy']:.2f}%" in result.output
    assert (tmp_path / "e.png").read_bytes().startswith(PNG_SIGNATURE)
    result = runner.invoke(main, ["sweep", str(SAMPLE_MODEL), "--data", str(SAMPLE_DATA),
                                  "-k", "mul8u_drum4", "--power", "mul8u_drum4=0.2",
                                  "-o", str(tmp_path / "map.json"), "--plot",
                                  str(tmp_path / "pareto.png")])
    assert result.exit_code == 0, result.output
    document = json.loads((tmp_path / "map.json").read_text())
    assert set(document["kernel_map"]) == {"conv1", "conv2", "fc1", "fc2", "predictions"}
    assert document["accuracy"] >= document["baseline_accuracy"] - 0.01
    assert "rel. energy" in result.output and "conv2" in result.output
    assert (tmp_path / "pareto.png").read_bytes().startswith(PNG_SIGNATURE)
    model = gsio.load_model(SAMPLE_MODEL)
    rewrite_model(model, kernel=None, kernel_map=tmp_path / "map.json")


def test_cli_checks_outputs_before_working(tmp_path):
    runner = CliRunner()
    (tmp_path / "exists.json").write_text("{}")
    result = runner.invoke(main, ["evaluate", str(SAMPLE_MODEL), "--data", str(SAMPLE_DATA),
                                  "-o", str(tmp_path / "exists.json")])
    assert result.exit_code == 1 and "already exists; pass --force" in result.output
    result = runner.invoke(main, ["evaluate", str(SAMPLE_MODEL), "--data", str(SAMPLE_DATA),
                                  "--plot", str(tmp_path / "x.jpg")])
    assert result.exit_code == 1 and "--plot" in result.output and "must end in .png" in \
        result.output
    result = runner.invoke(main, ["sweep", str(SAMPLE_MODEL), "--data",
                                  str(tmp_path / "missing.npz"), "-k", "exact", "-o",
                                  str(tmp_path / "m.json")])
    assert result.exit_code == 1
    assert "Error: data not found" in result.output
    assert not (tmp_path / "m.json").exists()


def test_cli_evaluate_json_option_prints_or_writes(tmp_path):
    """`--json` alone prints JSON; `--json out.json` writes the same document to a file."""
    import json as json_module

    from click.testing import CliRunner

    from conftest import SAMPLE_DATA, SAMPLE_MODEL
    from graphswap.cli import main

    runner = CliRunner()
    printed = runner.invoke(main, ["evaluate", str(SAMPLE_MODEL), "--data", str(SAMPLE_DATA),
                                   "--kernel", "exact", "--json"])
    assert printed.exit_code == 0, printed.output
    document = json_module.loads(printed.output)
    target = tmp_path / "out.json"
    written = runner.invoke(main, ["evaluate", str(SAMPLE_MODEL), "--data", str(SAMPLE_DATA),
                                   "--kernel", "exact", "--json", str(target)])
    assert written.exit_code == 0, written.output
    assert f"wrote {target}" in written.output
    assert json_module.loads(target.read_text())["rows"] == document["rows"]
    bad = runner.invoke(main, ["evaluate", str(SAMPLE_MODEL), "--data", str(SAMPLE_DATA),
                               "--json", str(tmp_path / "out.txt")])
    assert bad.exit_code == 1 and "must end in .json" in bad.output


def test_evaluate_checks_finetune_settings_before_evaluating(monkeypatch):
    from conftest import SAMPLE_DATA, SAMPLE_MODEL
    from graphswap.errors import GraphswapError
    from graphswap.research.analysis.evaluation import evaluate as evaluate_function

    def no_loading(*args, **kwargs):
        raise AssertionError("data was loaded before the settings were checked")

    monkeypatch.setattr("graphswap.research.analysis.evaluation.load_data", no_loading)
    with pytest.raises(GraphswapError, match="learning rate must be positive"):
        evaluate_function(str(SAMPLE_MODEL), str(SAMPLE_DATA), ["exact"],
                                 finetune_data=str(SAMPLE_DATA), learning_rate=-1.0)
