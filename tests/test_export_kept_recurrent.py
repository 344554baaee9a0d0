"""Kept-kernel ONNX export (`--keep-kernels`) of recurrent layers (LSTM, GRU both reset_after
variants, SimpleRNN, RNN of a cell, Bidirectional) and of a custom transformer block holding
swapped layers: each product of a cell becomes a GraphswapMatMul node inside the body of the ONNX
Loop tf2onnx makes of the recurrence (never unrolled), with that product's own quantization
scheme; onnxruntime's outputs (the file reopened through graphswap.onnx_session, i.e. through the
whole-file check) equal the swapped Keras model's to float round-off, and are not the exact
kernel's; a loop-body node naming another kernel is refused before anything runs."""

import hashlib
import json
import re

import keras
import numpy as np
import onnx
import pytest

import realmodels
from conftest import assert_close_to_roundoff
from graphswap.errors import KernelTrustError
from graphswap.io import lower_model, onnx_ops
from graphswap.io.export import export_model
from graphswap.swap import rewrite_model

STEPS, FEATURES, UNITS, BATCH = 5, 4, 3, 6
PART = re.compile(r"graphswap_export_(\d+)_part(\d+)")


def _inputs(seed, batch=BATCH):
    return np.random.default_rng(seed).normal(size=(batch, STEPS, FEATURES)).astype(np.float32)


def _model(kind):
    keras.utils.set_random_seed(4)
    inputs = keras.Input((STEPS, FEATURES), name="series")
    layer = {
        "lstm": lambda: keras.layers.LSTM(UNITS, return_sequences=True),
        "gru_reset_after": lambda: keras.layers.GRU(UNITS, reset_after=True),
        "gru_reset_before": lambda: keras.layers.GRU(UNITS, reset_after=False),
        "simple_rnn": lambda: keras.layers.SimpleRNN(UNITS, go_backwards=True),
        "rnn_cell": lambda: keras.layers.RNN(keras.layers.SimpleRNNCell(UNITS)),
        "bidirectional": lambda: keras.layers.Bidirectional(keras.layers.LSTM(UNITS)),
    }[kind]()
    x = layer(keras.layers.Masking(0.0)(inputs) if kind == "lstm" else inputs)
    if kind == "lstm":
        x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, keras.layers.Dense(2, name="head")(x))


# (products per cell, cells) of each case's recurrent layer
PARTS = {"lstm": 2, "gru_reset_after": 2, "gru_reset_before": 3, "simple_rnn": 2, "rnn_cell": 2,
         "bidirectional": 4}


def _custom_nodes(path):
    """(location, node) of every graphswap node of the file, subgraphs included."""
    model = onnx.load(str(path))
    return [(where, node) for where, node in onnx_ops.walk_nodes(model)
            if node.domain == onnx_ops.DOMAIN]


@pytest.mark.parametrize("kind", sorted(PARTS))
def test_recurrent_products_run_the_kernel_inside_the_onnx_loop(kind, tmp_path):
    model = _model(kind)
    calibration = _inputs(1, 16)
    # static ranges per operand (input, recurrent state, GRU's r*h) and the bias correction
    swapped = rewrite_model(model, "mul8u_drum4", calibration_data=calibration,
                            bias_correction="mean" if kind != "simple_rnn" else None,
                            dynamic_fallback=False)   # static ranges per operand, whatever scores
    result = export_model(swapped, tmp_path / f"{kind}.onnx", "onnx", keep_kernels=True)
    recurrent, head = result.layers
    assert head.path == "head" and len(head.onnx_nodes) == 1

    nodes = [(where, node) for where, node in _custom_nodes(result.path)
             if PART.search(node.name)]
    in_loop = [node for where, node in nodes if "(Loop) attribute 'body'" in where]
    # every product of the cell(s) once in a Loop body; in the main graph only the masked LSTM's
    # step at time zero, which Keras' TensorFlow loop runs once before the loop for the shapes
    assert sorted(int(PART.search(n.name).group(2)) for n in in_loop) == \
        list(range(PARTS[kind]))
    outside = [node for where, node in nodes if where == "the main graph"]
    assert len(outside) == (PARTS[kind] if kind == "lstm" else 0)
    assert len(nodes) == len(in_loop) + len(outside)
    assert sorted(recurrent.onnx_nodes) == sorted(n.name for _, n in nodes)
    schemes = recurrent.part_quantizations
    assert len(schemes) == PARTS[kind]
    for _, node in nodes:
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert node.op_type == onnx_ops.MATMUL_OP
        assert json.loads(attributes["kernel"]) == {"spec": "mul8u_drum4"}
        part = int(PART.search(node.name).group(2))
        quant = json.loads(attributes["quant"])
        assert quant == schemes[part] and quant["activations"] == "static"
    # each operand its own calibrated range (the input's is not the state's)
    assert schemes[0]["activation_range"] != schemes[1]["activation_range"]

    x = _inputs(7)
    x[0, -2:] = 0.0   # masked steps (the LSTM case)
    session = onnx_ops.session(result.path)   # the whole-file check first
    (actual,) = session.run(None, {"series": x})
    desired = np.asarray(swapped(x))
    assert_close_to_roundoff(actual, desired, STEPS * (FEATURES + UNITS) + UNITS * STEPS)
    exact = np.asarray(lower_model(swapped)[0](x))   # the same weights, the exact product
    assert np.abs(actual - exact).max() > 100 * np.abs(actual - desired).max() + 1e-6


def test_an_unrolled_recurrence_has_each_product_once_per_step(tmp_path):
    """unroll=True: Keras' Python loop, so no ONNX Loop; every step's products in the main
    graph, each with its part's scheme."""
    keras.utils.set_random_seed(5)
    inputs = keras.Input((STEPS, FEATURES), name="series")
    x = keras.layers.GRU(UNITS, reset_after=False, unroll=True)(inputs)
    swapped = rewrite_model(keras.Model(inputs, keras.layers.Dense(2, name="head")(x)),
                            "mul8u_drum4")
    result = export_model(swapped, tmp_path / "unrolled.onnx", "onnx", keep_kernels=True)
    nodes = [(where, n) for where, n in _custom_nodes(result.path) if PART.search(n.name)]
    assert all(where == "the main graph" for where, _ in nodes)
    parts = sorted(int(PART.search(n.name).group(2)) for _, n in nodes)
    assert parts == sorted(list(range(3)) * STEPS)
    x = _inputs(8)
    (actual,) = onnx_ops.session(result.path).run(None, {"series": x})
    assert_close_to_roundoff(actual, np.asarray(swapped(x)), 2 * STEPS * (FEATURES + UNITS))


def test_transformer_block_layers_run_the_kernel(tmp_path):
    """The zoo's transformer_ecg: a Conv1D stem, the user's custom TransformerBlock (a
    MultiHeadAttention's four projections and two Dense inside it), a Dense head."""
    keras.utils.set_random_seed(2)
    model = realmodels.transformer_ecg(keras)
    x, _ = realmodels.sample_data(model, n=6, seed=3)
    swapped = rewrite_model(model, "mul8u_drum4")
    result = export_model(swapped, tmp_path / "ecg.onnx", "onnx", keep_kernels=True)
    assert [result.layers[0].layer_type, result.layers[-1].layer_type] == ["Conv1D", "Dense"]
    inside = [layer for layer in result.layers if layer.path.startswith("block/")]
    assert [layer.layer_type for layer in inside] == ["MultiHeadAttention", "Dense", "Dense"]
    assert [len(layer.onnx_nodes) for layer in inside] == [4, 1, 1]
    nodes = _custom_nodes(result.path)
    assert len(nodes) == 1 + 6 + 1
    assert {n.name for _, n in nodes} == {name for layer in result.layers
                                          for name in layer.onnx_nodes}
    session = onnx_ops.session(result.path)
    (actual,) = session.run(None, {session.get_inputs()[0].name: x})
    desired = np.asarray(swapped(x))
    assert_close_to_roundoff(actual, desired, 5 + 16 * 3 + 32 + 16)
    exact = np.asarray(lower_model(swapped)[0](x))
    assert np.abs(actual - exact).max() > 100 * np.abs(actual - desired).max() + 1e-6


def test_a_loop_body_node_naming_an_untrusted_kernel_is_refused(tmp_path):
    swapped = rewrite_model(_model("gru_reset_after"), "mul8u_drum4")
    result = export_model(swapped, tmp_path / "gru.onnx", "onnx", keep_kernels=True)
    model = onnx.load(str(result.path))
    planted = tmp_path / "planted.c"
    planted.write_text("unsigned short mul(unsigned char a, unsigned char b) { return 0; }\n")
    digest = hashlib.sha256(planted.read_bytes()).hexdigest()   # the file's own: only trust lacks
    record = json.dumps({"spec": str(planted), "path": str(planted), "sha256": digest})
    edited = 0
    for where, node in onnx_ops.walk_nodes(model):
        if node.domain == onnx_ops.DOMAIN and "(Loop)" in where:
            for attribute in node.attribute:
                if attribute.name == "kernel":
                    attribute.s = record.encode()
                    edited += 1
            break
    assert edited == 1
    onnx.save(model, str(tmp_path / "edited.onnx"))
    with pytest.raises(KernelTrustError, match=r"custom node '.*graphswap_export_0_part\d' "
                                             r"\(GraphswapMatMul\) in the main graph > node "
                                             r"'.*while_loop' \(Loop\) attribute 'body'.*trust"):
        onnx_ops.session(tmp_path / "edited.onnx")
