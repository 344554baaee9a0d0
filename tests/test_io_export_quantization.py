"""Kept-kernel ONNX carries each layer's quantization scheme - static ranges included - as the
custom nodes' `quant` attribute: onnxruntime's output equals the Keras model's batch by batch,
for any batch size, and files written before the attribute existed still run (their old scheme)."""

from __future__ import annotations

import json
from pathlib import Path

import keras
import numpy as np
import pytest

import graphswap
from conftest import assert_close_to_roundoff

CNN_BN = Path(__file__).resolve().parent.parent / "sample_models" / "cnn_bn.keras"


def custom_nodes(path):
    import onnx

    model = onnx.load(str(path))
    return model, [node for node in model.graph.node if node.domain == "ai.onnx.contrib"]


@pytest.mark.parametrize("kernel", ["mul8u_drum4", "mul8s_drum3"])
def test_kept_kernel_onnx_runs_the_static_scheme_batch_by_batch(digits, tmp_path, kernel):
    model = keras.models.load_model(CNN_BN)
    swapped = graphswap.rewrite_model(model, kernel=kernel,
                                      calibration_data=digits["x_train"][:256],
                                      bias_correction="moments")
    path = tmp_path / "static.kept.onnx"
    graphswap.export_model(swapped, path, format="onnx", keep_kernels=True)
    _, nodes = custom_nodes(path)
    schemes = [json.loads(next(a.s for a in node.attribute if a.name == "quant"))
               for node in nodes]
    layers = [layer for layer in swapped.layers if hasattr(layer, "arithmetic")]
    assert schemes == [layer.current_quantization().to_config() for layer in layers]
    assert all(s["activations"] == "static" and s["activation_range"] for s in schemes)
    session = graphswap.onnx_session(path)
    name = session.get_inputs()[0].name
    x = digits["x_test"][:48].astype(np.float32)
    whole = session.run(None, {name: x})[0]
    start = 0
    for size in (1, 5, 17, 25):
        batch = x[start:start + size]
        got = session.run(None, {name: batch})[0]
        np.testing.assert_array_equal(got, whole[start:start + size])   # batch-independent
        assert_close_to_roundoff(got, np.asarray(swapped(batch, training=False)), terms=288)
        start += size


def test_kept_kernel_onnx_without_the_quant_attribute_runs_its_old_scheme(lenet, digits,
                                                                         tmp_path):
    old_style = graphswap.rewrite_model(lenet, kernel="mul8u_drum4", quantization="tfapprox")
    path = tmp_path / "old.kept.onnx"
    graphswap.export_model(old_style, path, format="onnx", keep_kernels=True)
    onnx_model, nodes = custom_nodes(path)
    for node in nodes:   # as written before the attribute existed
        kept = [a for a in node.attribute if a.name != "quant"]
        del node.attribute[:]
        node.attribute.extend(kept)
    import onnx

    stripped = tmp_path / "stripped.kept.onnx"
    onnx.save(onnx_model, str(stripped))
    x = digits["x_test"][:16].astype(np.float32)
    new = graphswap.onnx_session(path)
    old = graphswap.onnx_session(stripped)
    name = new.get_inputs()[0].name
    np.testing.assert_array_equal(old.run(None, {name: x})[0], new.run(None, {name: x})[0])


def test_export_metadata_records_the_quantization(lenet, digits, tmp_path):
    swapped = graphswap.rewrite_model(lenet, kernel="mul8u_drum4",
                                      bias_correction=None, calibration_data=digits["x_train"][:64])
    result = graphswap.export_model(swapped, tmp_path / "lowered.onnx", format="onnx")
    records = [layer.to_dict() for layer in result.layers]
    assert records[0]["quantization"]["activations"] == "static"
    assert records[0]["quantization"] == swapped.get_layer("conv1").current_quantization() \
        .to_config()
