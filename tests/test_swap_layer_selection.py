"""Selecting among every swappable type: rewrite_model(layer_types=...), `convert --layer-types`
(and its older name --type), the per-type MAC report, exports of a model holding every type, and
sweep's progress callback and plot labels over many layers."""

import json

import keras
import numpy as np
import pytest
from click.testing import CliRunner

import graphswap
from conftest import small_data, small_model
from graphswap.cli import main
from graphswap.errors import GraphswapError
from graphswap.io import export_onnx
from graphswap.research.analysis.sweeping import LABEL_TOP, labelled_layers
from graphswap.swap.catalog import RECURRENT_TYPES

RNG = np.random.default_rng(23)
#: the types of all_types_model (the recurrent ones: tests/test_swap_recurrent.py)
# TimeDistributed wraps the others (tests/test_realmodels_timedistributed.py): not one of them
NON_RECURRENT = set(graphswap.LAYER_TYPES) - set(RECURRENT_TYPES) - {"TimeDistributed"}


def all_types_model():
    keras.utils.set_random_seed(0)
    image = keras.Input((12, 12, 3), name="image")
    x = keras.layers.Conv2D(4, 3, padding="same", name="conv")(image)
    x = keras.layers.DepthwiseConv2D(3, strides=2, depth_multiplier=2, padding="same",
                                     name="dw")(x)
    x = keras.layers.SeparableConv2D(6, 3, activation="relu", name="sep")(x)
    x = keras.layers.Conv2DTranspose(5, 3, strides=2, padding="same", name="tconv")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    seq = keras.Input((10, 6), name="sequence")
    s = keras.layers.Conv1D(8, 3, padding="causal", dilation_rate=2, name="conv1d")(seq)
    s = keras.layers.MultiHeadAttention(2, 4, name="mha")(s, s)
    s = keras.layers.EinsumDense("abc,cd->abd", output_shape=(10, 5), bias_axes="d",
                                 name="einsum")(s)
    s = keras.layers.Flatten()(s)
    out = keras.layers.Dense(3, name="head")(keras.layers.Concatenate()([x, s]))
    return keras.Model([image, seq], out, name="all_types")


def inputs():
    return [RNG.uniform(0, 1, (2, 12, 12, 3)).astype(np.float32),
            RNG.uniform(0, 1, (2, 10, 6)).astype(np.float32)]


def test_default_swaps_every_type_and_reports_macs_per_type():
    model = all_types_model()
    swapped, report = graphswap.rewrite_model(model, return_report=True)
    by_type = report.by_type()
    assert set(by_type) == NON_RECURRENT
    assert all(row["swapped"] == row["layers"] == 1 for row in by_type.values())
    macs = {e.path: e.macs for e in report.layers if e.macs}
    # hand-counted MACs per sample
    assert macs["conv"] == 12 * 12 * 4 * 9 * 3
    assert macs["dw"] == 6 * 6 * 8 * 9
    assert macs["sep"] == 4 * 4 * (8 * 9 + 8 * 6)
    assert macs["tconv"] == 4 * 4 * 9 * 6 * 5
    assert macs["conv1d"] == 10 * 8 * 3 * 6
    assert macs["mha"] == 3 * (10 * 8 * 8) + 10 * 8 * 8          # q, k, v and output projections
    assert macs["einsum"] == 10 * 8 * 5
    mha = next(e for e in report.layers if e.path == "mha")
    assert mha.float_macs == 2 * (10 * 10 * 2 * 4)                 # QK^T and scores x V
    assert report.summary_line().startswith(f"100.0% of {sum(macs.values()):,} MACs")
    assert "attention-score MACs" in report.summary_line()
    x = inputs()
    np.testing.assert_allclose(swapped(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)


def test_layer_types_select_and_the_rest_is_reported_as_float():
    model = all_types_model()
    _, report = graphswap.rewrite_model(model, layer_types=("DepthwiseConv2D", "EinsumDense"),
                                        return_report=True)
    assert {e.path for e in report.swapped} == {"dw", "einsum"}
    by_type = report.by_type()
    assert by_type["Conv2D"]["float_macs"] == 12 * 12 * 4 * 9 * 3
    assert by_type["Conv2D"]["kernel_macs"] == 0
    with pytest.raises(GraphswapError, match=r"unknown layer type\(s\) 'Conv3D'; allowed: Dense"):
        graphswap.rewrite_model(model, layer_types=("Conv3D",))


def test_unswapped_weight_layers_are_counted():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4, 4, 4, 2)), keras.layers.Conv3D(3, 2, name="c3"),
                              keras.layers.Flatten(), keras.layers.Dense(2, name="d")])
    report = graphswap.plan(model)
    c3 = next(e for e in report.layers if e.path == "c3")
    assert c3.action == "kept" and c3.macs == 27 * 3 * 8 * 2
    assert report.summary_line().startswith(f"{100 * 162 / (162 + 1296):.1f}% of 1,458 MACs")


@pytest.mark.parametrize("keep_kernels", [False, True])
def test_exports_of_every_type(tmp_path, keep_kernels):
    swapped = graphswap.rewrite_model(all_types_model(), kernel="mul8s_drum4")
    result = export_onnx(swapped, tmp_path / "all.onnx", keep_kernels=keep_kernels,
                         check_batch=2)
    assert {r.layer_type for r in result.layers} == NON_RECURRENT
    if keep_kernels:
        nodes = {r.layer_type: len(r.onnx_nodes) for r in result.layers}
        assert nodes["SeparableConv2D"] == 2 and nodes["MultiHeadAttention"] == 4
        assert result.max_abs_difference <= 1e-5


def test_convert_layer_types_option_and_its_older_name(tmp_path):
    path = tmp_path / "all.keras"
    all_types_model().save(path)
    runner = CliRunner()
    result = runner.invoke(main, ["convert", str(path), "--layer-types", "DepthwiseConv2D,Conv1D",
                                  "--layer-types", "MultiHeadAttention", "-o",
                                  str(tmp_path / "a.keras"), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert sorted(e["path"] for e in payload["layers"] if e["action"] == "swapped") == [
        "conv1d", "dw", "mha"]
    assert payload["macs"]["by_type"]["Dense"]["float_macs"] > 0
    result = runner.invoke(main, ["convert", str(path), "--type", "Dense", "-o",
                                  str(tmp_path / "b.keras")])
    assert result.exit_code == 0, result.output
    assert "1 of 8 layers with weights swapped" in result.output
    result = runner.invoke(main, ["convert", str(path), "--layer-types", "Conv3D"])
    assert result.exit_code == 1 and "unknown layer type(s) 'Conv3D'" in result.output
    assert not (tmp_path / "all.swapped.keras").exists()
    result = runner.invoke(main, ["convert", str(path), "-o", str(tmp_path / "c.keras")])
    assert "8 of 8 layers with weights swapped; 100.0% of" in result.output


def test_sweep_reports_progress_for_every_evaluated_model():
    x, y = small_data()
    calls = []
    graphswap.sweep(small_model(), (x, y), "mul8s_drum4",
                    progress=lambda done, total, label: calls.append((done, total, label)))
    assert calls == [(1, 3, "conv"), (2, 3, "out"), (3, 3, calls[2][2])]
    assert calls[2][2].startswith("+ ")


def test_pareto_plot_names_only_the_most_sensitive_of_many_layers(tmp_path):
    layers = [{"layer": f"block_{i}/conv", "score_drop": i / 100, "macs": 10} for i in range(60)]
    named = labelled_layers(layers)
    assert named == {f"block_{i}/conv" for i in range(60 - LABEL_TOP, 60)}
    assert labelled_layers(layers[:5]) == {e["layer"] for e in layers[:5]}
