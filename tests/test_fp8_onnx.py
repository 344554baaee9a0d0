"""The lowered ONNX export of FP8 layers (graphswap/io/onnx_fp8.py): the exact built-ins become
float8 QuantizeLinear / DequantizeLinear (opset 19) whose weight codes are graphswap's and whose
outputs in onnxruntime equal the FP8 Keras model's within float32 round-off (and not the exact
float model's); users' FP8 tables stay exact float32 in the lowered export."""

from __future__ import annotations

import json

import keras
import numpy as np
import onnx
import pytest
from onnx import TensorProto

import graphswap
from graphswap.kernels import QuantScheme
from graphswap.kernels.fp8 import E4M3, E5M2, quantize_weights

FLOAT8 = {"e4m3": (E4M3, TensorProto.FLOAT8E4M3FN), "e5m2": (E5M2, TensorProto.FLOAT8E5M2)}


def _model():
    keras.utils.set_random_seed(3)
    inputs = keras.Input((8, 8, 2))
    x = keras.layers.Conv2D(4, 3, activation="relu", name="conv")(inputs)
    x = keras.layers.Flatten()(x)
    return keras.Model(inputs, keras.layers.Dense(3, name="out")(x))


def _run(path, x):
    session = graphswap.onnx_session(path)
    return session.run(None, {session.get_inputs()[0].name: x})[0]


@pytest.mark.parametrize("name,calibrated", [("e4m3", False), ("e5m2", True)])
def test_exact_fp8_layers_export_as_float8_qdq_that_onnxruntime_runs(tmp_path, name, calibrated):
    fmt, float8 = FLOAT8[name]
    model = _model()
    data = np.random.default_rng(4).normal(size=(32, 8, 8, 2)).astype(np.float32)
    swapped = graphswap.rewrite_model(model, kernel=f"fp8_{name}",
                                      calibration_data=data if calibrated else None)
    path = tmp_path / "model.onnx"
    result = graphswap.export_model(swapped, path)
    assert "float8 QDQ" in result.reference and result.max_abs_difference < 1e-5
    proto = onnx.load(path)
    assert max(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")) >= 19
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("QuantizeLinear") == 2 and ops.count("DequantizeLinear") == 4
    assert all(a.i == 1 for n in proto.graph.node if n.op_type == "QuantizeLinear"
               for a in n.attribute if a.name == "saturate")
    metadata = json.loads(proto.metadata_props[0].value)
    assert metadata["fp8_qdq_layers"] == ["conv", "out"]
    # the weights are stored as float8 codes: graphswap's own (the C path's), per output channel
    weights = {t.name: t for t in proto.graph.initializer if t.data_type == float8}
    assert len(weights) == 4    # two weights, two zero points
    dense = next(t for t in weights.values() if list(t.dims) == [36 * 4, 3])
    codes = np.frombuffer(dense.raw_data, np.uint8).reshape(36 * 4, 3)
    kernel = swapped.get_layer("out").kernel.numpy()
    expected, _, _ = quantize_weights(kernel, QuantScheme().resolve(True), fmt)
    np.testing.assert_array_equal(codes, expected)
    assert not any(t.data_type == TensorProto.FLOAT and list(t.dims) == [36 * 4, 3]
                   for t in proto.graph.initializer)      # no float32 copy left behind
    # onnxruntime: the FP8 model's outputs (within float32 round-off), not the exact float ones
    x = data[:6] * 1.3
    got, fp8, exact = _run(path, x), swapped(x).numpy(), model(x).numpy()
    scale = np.abs(fp8).max()
    np.testing.assert_allclose(got, fp8, rtol=1e-5, atol=1e-5 * scale)
    assert np.abs(got - exact).max() > 100 * np.abs(got - fp8).max() + 1e-3 * scale


def test_a_users_fp8_table_stays_exact_float_in_the_lowered_export(tmp_path):
    values = E4M3.values.astype(np.float64)
    with np.errstate(invalid="ignore"):
        table = (np.multiply.outer(values, values) * 1.03).astype(np.float32)
    np.save(tmp_path / "mine.npy", table)
    model = _model()
    swapped = graphswap.rewrite_model(model, kernel=f"fp8_e4m3:{tmp_path / 'mine.npy'}")
    path = tmp_path / "table.onnx"
    result = graphswap.export_model(swapped, path)
    assert "exact kernel" in result.reference and "float8" not in result.reference
    proto = onnx.load(path)
    assert not {"QuantizeLinear", "DequantizeLinear"} & {n.op_type for n in proto.graph.node}
    assert "fp8_qdq_layers" not in json.loads(proto.metadata_props[0].value)
    x = np.random.default_rng(5).normal(size=(4, 8, 8, 2)).astype(np.float32)
    exact = model(x).numpy()
    np.testing.assert_allclose(_run(path, x), exact, rtol=1e-4, atol=1e-5 * np.abs(exact).max())


def test_an_fp8_layer_with_an_output_correction_stays_exact_float(tmp_path):
    """The lowered model leaves output corrections out, so such a layer is not QDQ'd (the
    export still verifies against the exact-kernel model); the other FP8 layer is."""
    model = _model()
    swapped = graphswap.rewrite_model(model, kernel="fp8_e4m3")
    swapped.get_layer("out").set_output_correction(gain=[1.1, 0.9, 1.0], offset=[0.1, 0, 0])
    path = tmp_path / "corrected.onnx"
    graphswap.export_model(swapped, path)
    proto = onnx.load(path)
    assert json.loads(proto.metadata_props[0].value)["fp8_qdq_layers"] == ["conv"]
    assert [n.op_type for n in proto.graph.node].count("QuantizeLinear") == 1
