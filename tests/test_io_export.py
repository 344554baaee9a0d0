"""Export: lowered ONNX, kept-kernel ONNX, inference SavedModel, their metadata, the CLI,
the .h5 -> convert -> fine-tune -> export round trip, and every bad input's clear refusal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tensorflow as tf
from click.testing import CliRunner

import graphswap
from graphswap import io as gsio
from graphswap.io import export, onnx_ops
from graphswap.cli import main
from graphswap.errors import ModelLoadError
from graphswap.errors import ExportError
from graphswap.swap import SwappedConv2D, SwappedDense
from graphswap.swap import transform_model

from conftest import EPS32, SAMPLE_MODEL, assert_close_to_roundoff, reduction_terms
from conftest import tf_keras_lenet

LUT_KERNELS = ("mul8u_drum4", "mul8s_trunc4")
SWAPPED_NAMES = ["conv1", "conv2", "fc1", "fc2", "predictions"]


def with_kernel(model, spec):
    """The same swapped model with every swapped layer running `spec` (weights copied)."""

    def replace(path, layer):
        if isinstance(layer, (SwappedDense, SwappedConv2D)):
            return type(layer).from_config({**layer.get_config(), "arithmetic": spec})
        return None

    return transform_model(model, replace)[0]


def run(model, x) -> np.ndarray:
    return np.asarray(model(x, training=False))


def listing(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


@pytest.fixture(scope="module")
def test_batch():
    with np.load(Path(SAMPLE_MODEL).parent / "digits.npz") as data:
        return data["x_test"][:48].astype(np.float32), data["y_test"][:48]


@pytest.fixture(scope="module")
def lenet_model():
    return keras.models.load_model(SAMPLE_MODEL)


@pytest.fixture(scope="module")
def approx_model(lenet_model):
    """LeNet-5 with every Dense/Conv2D on a LUT multiplier (signed, truncated)."""
    return graphswap.rewrite_model(lenet_model, kernel="mul8s_trunc4")


@pytest.fixture(scope="module")
def exact_model(approx_model):
    return with_kernel(approx_model, "exact")


@pytest.fixture(scope="module")
def lowered_onnx(approx_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("lowered") / "model.onnx"
    result = export.export_onnx(approx_model, path)
    return path, result


@pytest.fixture(scope="module")
def saved_model(approx_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("savedmodel") / "served"
    result = export.export_saved_model(approx_model, path)
    return path, result


# ---------------------------------------------------------------------------------------------
# lowered ONNX
# ---------------------------------------------------------------------------------------------

def test_approximate_model_really_differs_from_exact(approx_model, exact_model, test_batch):
    # Precondition of the comparisons below: "equals the exact-kernel model" must be able to fail.
    x, _ = test_batch
    assert np.max(np.abs(run(approx_model, x) - run(exact_model, x))) > 1e-3


def test_lowered_onnx_equals_exact_kernel_keras_model(lowered_onnx, exact_model, approx_model,
                                                      test_batch):
    path, result = lowered_onnx
    model_proto = onnx.load(str(path))
    assert all(node.domain in ("", "ai.onnx") for node in model_proto.graph.node)
    # plain onnxruntime, no custom-op library: standard ops only
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["pixels"]
    assert [o.name for o in session.get_outputs()] == ["predictions"]
    x, _ = test_batch
    (onnx_out,) = session.run(None, {"pixels": x})
    assert_close_to_roundoff(onnx_out, run(exact_model, x), reduction_terms(exact_model))
    assert np.max(np.abs(onnx_out - run(approx_model, x))) > 1e-3
    assert result.format == "onnx-lowered"  # and its own check found round-off only:
    assert result.max_abs_difference <= 8 * np.sqrt(reduction_terms(exact_model)) * EPS32


def test_lowered_onnx_metadata_maps_layers_to_nodes(lowered_onnx, approx_model):
    path, _ = lowered_onnx
    model_proto = onnx.load(str(path))
    entries = {p.key: p.value for p in model_proto.metadata_props}
    doc = json.loads(entries["graphswap"])
    assert doc == export.read_metadata(path)
    assert doc["format"] == "onnx-lowered" and doc["producer"] == "graphswap"
    assert doc["inputs"] == ["pixels"] and doc["outputs"] == ["predictions"]
    layers = doc["swapped_layers"]
    assert [entry["layer"] for entry in layers] == SWAPPED_NAMES
    assert all(entry["kernel"] == {"spec": "mul8s_trunc4"} for entry in layers)
    assert [entry["type"] for entry in layers] == ["Conv2D", "Conv2D", "Dense", "Dense", "Dense"]
    nodes = {node.name: node for node in model_proto.graph.node}
    weights = {init.name: onnx.numpy_helper.to_array(init)
               for init in model_proto.graph.initializer}
    for entry in layers:
        (node_name,) = entry["onnx_nodes"]
        node = nodes[node_name]
        kernel = approx_model.get_layer(entry["name"]).kernel.numpy()
        if entry["type"] == "Conv2D":
            assert node.op_type == "Conv"
            expected = kernel.transpose(3, 2, 0, 1)  # HWIO -> OIHW
        else:
            assert node.op_type in ("MatMul", "Gemm")
            expected = kernel
        np.testing.assert_array_equal(weights[node.input[1]], expected)
        assert "mul8s_trunc4" in node.doc_string


# ---------------------------------------------------------------------------------------------
# kept-kernel ONNX
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kernel", LUT_KERNELS)
def test_kept_kernel_onnx_equals_swapped_keras_model(kernel, lenet_model, test_batch, tmp_path):
    swapped = graphswap.rewrite_model(lenet_model, kernel=kernel)
    path = tmp_path / "kept.onnx"
    result = export.export_onnx(swapped, path, keep_kernels=True)
    model_proto = onnx.load(str(path))
    custom = [n for n in model_proto.graph.node if n.domain == onnx_ops.DOMAIN]
    assert sorted(n.op_type for n in custom) == sorted(
        [onnx_ops.CONV2D_OP] * 2 + [onnx_ops.MATMUL_OP] * 3)
    for node in custom:
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert json.loads(attributes["kernel"]) == {"spec": kernel}
    doc = export.read_metadata(path)
    assert doc["format"] == "onnx-kept-kernels"
    assert {n for e in doc["swapped_layers"] for n in e["onnx_nodes"]} == {n.name for n in custom}

    x, _ = test_batch
    session = onnx_ops.session(path)
    (onnx_out,) = session.run(None, {"pixels": x})
    # same batch as one call: the LUT kernels quantize activations per call (per batch)
    assert_close_to_roundoff(onnx_out, run(swapped, x), reduction_terms(swapped))
    exact = run(with_kernel(swapped, "exact"), x)
    assert np.max(np.abs(onnx_out - exact)) > 1e-3  # the C multiplier really ran in onnxruntime
    assert result.max_abs_difference <= 8 * np.sqrt(reduction_terms(swapped)) * EPS32


def test_kept_kernel_onnx_needs_the_custom_ops(lenet_model, tmp_path):
    swapped = graphswap.rewrite_model(lenet_model, kernel="mul8u_drum4", include="fc2")
    path = tmp_path / "kept.onnx"
    export.export_onnx(swapped, path, keep_kernels=True)
    with pytest.raises(Exception, match="GraphswapMatMul"):
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with pytest.raises(ModelLoadError, match="not found"):
        onnx_ops.session(tmp_path / "missing.onnx")


def test_keep_kernels_needs_swapped_layers(lenet_model, tmp_path):
    with pytest.raises(ExportError, match="no swapped layers"):
        export.export_onnx(lenet_model, tmp_path / "x.onnx", keep_kernels=True)
    assert listing(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# SavedModel
# ---------------------------------------------------------------------------------------------

SERVE_WITHOUT_GRAPHSWAP = """
import importlib.abc, json, sys
import numpy as np

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "graphswap" or name.startswith("graphswap."):
            raise ImportError("graphswap is blocked in this process")
        return None

sys.meta_path.insert(0, Block())
import tensorflow as tf

loaded = tf.saved_model.load(sys.argv[1])
serve = loaded.signatures["serving_default"]
_, inputs = serve.structured_input_signature
x = np.load(sys.argv[2])
out = serve(pixels=tf.constant(x))
np.save(sys.argv[3], out["predictions"].numpy())
with open(loaded.graphswap_metadata.asset_path.numpy().decode(), encoding="utf-8") as handle:
    metadata = json.load(handle)
print(json.dumps({"inputs": sorted(inputs), "outputs": sorted(serve.structured_outputs),
                  "layers": [e["layer"] for e in metadata["swapped_layers"]],
                  "graphswap_loaded": any(m.startswith("graphswap") for m in sys.modules)}))
"""


def test_saved_model_serves_in_fresh_process_without_graphswap(saved_model, exact_model,
                                                               approx_model, test_batch, tmp_path):
    path, result = saved_model
    x, _ = test_batch
    np.save(tmp_path / "x.npy", x)
    script = tmp_path / "serve.py"
    script.write_text(SERVE_WITHOUT_GRAPHSWAP)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    proc = subprocess.run([sys.executable, str(script), str(path), str(tmp_path / "x.npy"),
                           str(tmp_path / "y.npy")], capture_output=True, text=True, timeout=600,
                          env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {"inputs": ["pixels"], "outputs": ["predictions"], "layers": SWAPPED_NAMES,
                      "graphswap_loaded": False}
    served = np.load(tmp_path / "y.npy")
    assert_close_to_roundoff(served, run(exact_model, x), reduction_terms(exact_model))
    assert np.max(np.abs(served - run(approx_model, x))) > 1e-3
    assert result.format == "savedmodel"


def test_saved_model_metadata_asset(saved_model):
    path, _ = saved_model
    asset = path / "assets" / export.ASSET_NAME
    doc = json.loads(asset.read_text(encoding="utf-8"))
    assert doc == export.read_metadata(path)
    assert doc["format"] == "savedmodel"
    assert [(e["layer"], e["kernel"]["spec"]) for e in doc["swapped_layers"]] == [
        (name, "mul8s_trunc4") for name in SWAPPED_NAMES]
    assert "exact" in doc["note"]


def test_saved_model_refuses_keep_kernels(approx_model, tmp_path):
    with pytest.raises(ExportError, match="not serialized"):
        export.export_model(approx_model, tmp_path / "served", format="savedmodel",
                            keep_kernels=True)
    assert listing(tmp_path) == []


class NumpyScale(keras.layers.Layer):
    """A layer whose forward runs Python: cannot serve from a SavedModel, cannot go to ONNX."""

    def call(self, inputs):
        y = tf.numpy_function(lambda a: (a * 2).astype(np.float32), [inputs], tf.float32)
        y.set_shape(inputs.shape)
        return y


def python_op_model():
    inputs = keras.Input((6,), name="features")
    hidden = NumpyScale(name="numpy_scale")(inputs)
    outputs = keras.layers.Dense(3, name="head")(hidden)
    return graphswap.rewrite_model(keras.Model(inputs, outputs), kernel="bf16")


@pytest.mark.parametrize("fmt", ["savedmodel", "onnx"])
def test_python_ops_are_refused_and_nothing_is_written(fmt, tmp_path):
    model = python_op_model()
    with pytest.raises(ExportError, match="numpy_function") as info:
        export.export_model(model, tmp_path / "out", format=fmt)
    assert "numpy_scale" in str(info.value)
    assert listing(tmp_path) == []


def test_failed_verification_writes_nothing(approx_model, tmp_path, monkeypatch):
    from graphswap.io import export_result

    monkeypatch.setattr(export_result, "allowed_difference", lambda comparison, relative: -1.0)
    with pytest.raises(ExportError, match="verification failed"):
        export.export_saved_model(approx_model, tmp_path / "served")
    with pytest.raises(ExportError, match="verification failed"):
        export.export_onnx(approx_model, tmp_path / "model.onnx")
    assert listing(tmp_path) == []


def test_multi_input_multi_output_model_exports(nested_model, tmp_path):
    swapped = graphswap.rewrite_model(nested_model, kernel="bf16")
    exact = with_kernel(swapped, "exact")
    rng = np.random.default_rng(3)
    image = rng.normal(size=(5, 8, 8, 3)).astype(np.float32)
    vector = rng.normal(size=(5, 7)).astype(np.float32)
    expected = [np.asarray(t) for t in exact([image, vector], training=False)]
    result = export.export_onnx(swapped, tmp_path / "m.onnx")
    assert result.inputs == ["image", "vector"] and result.outputs == ["head_a", "head_b"]
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    outputs = session.run(["head_a", "head_b"], {"image": image, "vector": vector})
    for got, want in zip(outputs, expected):
        assert_close_to_roundoff(got, want, reduction_terms(swapped))
    swapped_paths = [e.path for e in result.layers]
    assert "inner_func/inner_seq/inner_conv" in swapped_paths and "shared_dense" in swapped_paths
    assert all(e.onnx_nodes for e in result.layers)
    export.export_saved_model(swapped, tmp_path / "served")
    serve = tf.saved_model.load(str(tmp_path / "served")).signatures["serving_default"]
    served = serve(image=tf.constant(image), vector=tf.constant(vector))
    for name, want in zip(["head_a", "head_b"], expected):
        assert_close_to_roundoff(served[name].numpy(), want, reduction_terms(swapped))


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def swapped_file(approx_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("swapped") / "lenet5.swapped.keras"
    gsio.save_model(approx_model, path)
    return path


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_cli_export_all_three_forms(swapped_file, exact_model, approx_model, test_batch,
                                    tmp_path):
    x, _ = test_batch
    lowered = invoke("export", swapped_file, "--format", "onnx", "-o", tmp_path / "m.onnx")
    assert lowered.exit_code == 0, lowered.output
    assert "wrote" in lowered.output and "mul8s_trunc4" in lowered.output
    kept = invoke("export", swapped_file, "--format", "onnx", "--keep-kernels", "-o",
                  tmp_path / "m.kept.onnx", "--json")
    assert kept.exit_code == 0, kept.output
    assert json.loads(kept.output)["format"] == "onnx-kept-kernels"
    served = invoke("export", swapped_file, "--format", "savedmodel", "-o", tmp_path / "served")
    assert served.exit_code == 0, served.output
    assert listing(tmp_path) == ["m.kept.onnx", "m.onnx", "served"]

    plain = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    assert_close_to_roundoff(plain.run(None, {"pixels": x})[0], run(exact_model, x),
                             reduction_terms(exact_model))
    kept_session = onnx_ops.session(tmp_path / "m.kept.onnx")
    assert_close_to_roundoff(kept_session.run(None, {"pixels": x})[0], run(approx_model, x),
                             reduction_terms(approx_model))
    serve = tf.saved_model.load(str(tmp_path / "served")).signatures["serving_default"]
    assert_close_to_roundoff(serve(pixels=tf.constant(x))["predictions"].numpy(),
                             run(exact_model, x), reduction_terms(exact_model))


def test_cli_export_refuses_existing_output_and_bad_combination(swapped_file, tmp_path):
    target = tmp_path / "m.onnx"
    target.write_bytes(b"keep me")
    result = invoke("export", swapped_file, "-o", target)
    assert result.exit_code == 1 and "already exists" in result.output
    assert target.read_bytes() == b"keep me"
    result = invoke("export", swapped_file, "--format", "savedmodel", "--keep-kernels", "-o",
                    tmp_path / "served")
    assert result.exit_code == 1 and "--keep-kernels needs --format onnx" in result.output
    assert listing(tmp_path) == ["m.onnx"]


def test_cli_export_help_states_what_runs_in_the_saved_model():
    result = invoke("export", "--help")
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "does NOT run in it" in text and "numpy_function body is not serialized" in text


# ---------------------------------------------------------------------------------------------
# bad inputs: clear error, exit 1, nothing written
# ---------------------------------------------------------------------------------------------

CUSTOM_LAYER_MODULE = """
import keras

@keras.saving.register_keras_serializable(package="usercode")
class Offset(keras.layers.Layer):
    def __init__(self, offset=1.0, **kwargs):
        super().__init__(**kwargs)
        self.offset = offset

    def call(self, inputs):
        return inputs + self.offset

    def get_config(self):
        return {**super().get_config(), "offset": self.offset}
"""


def _bad_weights_only(tmp_path):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    path = tmp_path / "weights.weights.h5"
    model.save_weights(path)
    return path, [], "weights-only HDF5"


def _bad_inference_saved_model(tmp_path):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    path = tmp_path / "exported"
    model.export(str(path), verbose=False)
    return path, [], "inference-only SavedModel"


def _bad_plain_directory(tmp_path):
    path = tmp_path / "not_a_model"
    path.mkdir()
    (path / "notes.txt").write_text("hello")
    return path, [], "not a SavedModel"


def _bad_lambda(tmp_path):
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(2)(keras.layers.Lambda(lambda t: t * 2.0)(inputs))
    path = tmp_path / "lambda.keras"
    keras.Model(inputs, outputs).save(path)
    return path, ["--unsafe"], "--unsafe"


def _bad_custom_objects(tmp_path):
    module_path = tmp_path / "usercode.py"
    module_path.write_text(CUSTOM_LAYER_MODULE)
    namespace = {}
    exec(compile(CUSTOM_LAYER_MODULE, str(module_path), "exec"), namespace)  # noqa: S102
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(2)(namespace["Offset"](0.5)(inputs))
    path = tmp_path / "custom.keras"
    keras.Model(inputs, outputs).save(path)
    forget_usercode()  # a fresh process would not know the class
    return path, ["--custom-objects", module_path], "--custom-objects"


def forget_usercode():
    registry = keras.saving.get_custom_objects()
    for key in [k for k in registry if k.startswith("usercode>")]:
        del registry[key]


BAD_INPUTS = {"weights_only_h5": _bad_weights_only,
              "keras3_inference_savedmodel": _bad_inference_saved_model,
              "directory_not_savedmodel": _bad_plain_directory,
              "lambda_in_safe_mode": _bad_lambda,
              "missing_custom_objects": _bad_custom_objects}


@pytest.fixture()
def clean_registry():
    yield
    forget_usercode()


@pytest.mark.parametrize("command", ["export", "convert"])
@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_inputs_fail_clearly_and_write_nothing(case, command, tmp_path, clean_registry):
    inputs_dir = tmp_path / "inputs"
    inputs_dir.mkdir()
    source, remedy, fragment = BAD_INPUTS[case](inputs_dir)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    target = out_dir / ("served" if command == "export" else "model.swapped.keras")
    extra = ["--format", "savedmodel"] if command == "export" else []
    result = invoke(command, source, "-o", target, *extra)
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: ") and "Traceback" not in result.output
    assert fragment in result.output
    assert listing(out_dir) == []
    with pytest.raises(ModelLoadError):
        gsio.load_model(source)
    # and what the message recommends does work
    if remedy:
        fixed = invoke(command, source, "-o", target, *extra, *remedy)
        assert fixed.exit_code == 0, fixed.output
        assert listing(out_dir) == [target.name]


# ---------------------------------------------------------------------------------------------
# round trip: legacy .h5 -> convert -> fine-tune -> export ONNX -> onnxruntime
# ---------------------------------------------------------------------------------------------

def test_h5_convert_finetune_export_onnx_round_trip(tmp_path, test_batch):
    x, y = test_batch
    # 1. a legacy full-model HDF5 written by Keras 2 (tf_keras), with LeNet-5's trained weights
    lenet = keras.models.load_model(SAMPLE_MODEL)
    legacy = tf_keras_lenet(lenet)
    reference = legacy(x, training=False).numpy()
    assert_close_to_roundoff(reference, run(lenet, x), reduction_terms(lenet))
    h5_path = tmp_path / "lenet5.h5"
    legacy.save(h5_path, save_format="h5")

    # 2. load (Keras 3) and convert through the CLI
    loaded = gsio.load_model(h5_path)
    assert_close_to_roundoff(run(loaded, x), reference, reduction_terms(lenet))
    swapped_path = tmp_path / "lenet5.swapped.keras"
    result = invoke("convert", h5_path, "--kernel", "mul8s_trunc4", "-o", swapped_path, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["swapped"] == 5 and report["max_abs_difference"] > 0
    swapped = gsio.load_model(swapped_path)
    approx_out = run(swapped, x)
    assert_close_to_roundoff(run(with_kernel(swapped, "exact"), x), reference,
                             reduction_terms(lenet))
    assert np.max(np.abs(approx_out - reference)) > 1e-3
    assert np.mean(approx_out.argmax(1) == y) > 0.8

    # 3. a short fine-tune with model.fit: loss finite, weights move, saved model reloads equal
    before = [w.copy() for w in swapped.get_weights()]
    swapped.compile(optimizer=keras.optimizers.Adam(1e-4),
                    loss="sparse_categorical_crossentropy")
    history = swapped.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    assert np.isfinite(history.history["loss"][0])
    assert any(np.max(np.abs(a - b)) > 0 for a, b in zip(before, swapped.get_weights()))
    tuned_path = tmp_path / "lenet5.ft.keras"
    gsio.save_model(swapped, tuned_path)
    tuned = gsio.load_model(tuned_path)
    tuned_out = run(tuned, x)
    np.testing.assert_array_equal(tuned_out, run(swapped, x))  # same kernels, same weights
    assert np.max(np.abs(tuned_out - approx_out)) > 0

    # 4. export both ONNX forms and run them in onnxruntime
    lowered_path, kept_path = tmp_path / "ft.onnx", tmp_path / "ft.kept.onnx"
    assert invoke("export", tuned_path, "-o", lowered_path).exit_code == 0
    assert invoke("export", tuned_path, "--keep-kernels", "-o", kept_path).exit_code == 0
    plain = ort.InferenceSession(str(lowered_path), providers=["CPUExecutionProvider"])
    assert_close_to_roundoff(plain.run(None, {"pixels": x})[0],
                             run(with_kernel(tuned, "exact"), x), reduction_terms(tuned))
    kept = onnx_ops.session(kept_path)
    assert_close_to_roundoff(kept.run(None, {"pixels": x})[0], tuned_out, reduction_terms(tuned))
    assert export.read_metadata(lowered_path)["swapped_layers"][0]["kernel"] == {
        "spec": "mul8s_trunc4"}


# ---- regressions: graphs the LeNet-shaped tests do not reach --------------------------------------

def _two_branch_shared_dense():
    """A shared swapped Dense applied twice, its two outputs concatenated (axis -1)."""
    keras.utils.set_random_seed(0)
    shared = keras.layers.Dense(6, activation="relu", name="shared")
    a, b = keras.Input((5,), name="a"), keras.Input((5,), name="b")
    joined = keras.layers.Concatenate()([shared(a), shared(b)])
    return keras.Model([a, b], keras.layers.Dense(3, name="head")(joined))


def test_kept_kernel_onnx_keeps_shapes_after_custom_nodes(tmp_path):
    # The PyFunc's static shape used to be lost in tf2onnx's GraphDef round trip, so a Concat
    # (axis -1) fed by two custom nodes was left without its axis: an invalid ONNX model.
    swapped = graphswap.rewrite_model(_two_branch_shared_dense(), kernel="mul8s_drum4")
    path = tmp_path / "shared.kept.onnx"
    result = export.export_onnx(swapped, path, keep_kernels=True)
    assert path.is_file() and result.max_abs_difference < 1e-5
    concat = [n for n in onnx.load(str(path)).graph.node if n.op_type == "Concat"]
    assert concat and any(a.name == "axis" for a in concat[0].attribute)
    rng = np.random.default_rng(1)
    x = [rng.random((4, 5), dtype=np.float32), rng.random((4, 5), dtype=np.float32)]
    (got,) = onnx_ops.session(path).run(None, {"a": x[0], "b": x[1]})
    assert_close_to_roundoff(got, np.asarray(swapped(x)), reduction_terms(swapped))


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
def test_grouped_dilated_and_channels_first_conv_export(tmp_path, data_format):
    # Keras runs grouped convolutions in a jit_compile function tf2onnx cannot convert (a
    # StatefulPartitionedCall was left), and NCHW Conv2D does not run on CPU.
    keras.utils.set_random_seed(0)
    first = data_format == "channels_first"
    inputs = keras.Input((4, 10, 10) if first else (10, 10, 4))
    x = keras.layers.Conv2D(6, 3, groups=2, dilation_rate=2, padding="same",
                            data_format=data_format, name="grouped")(inputs)
    x = keras.layers.Conv2D(4, 3, strides=2, data_format=data_format, name="strided")(x)
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(keras.layers.Flatten()(x)))
    swapped = graphswap.rewrite_model(model, kernel="mul8u_drum4")
    batch = np.random.default_rng(2).random((5, *model.input_shape[1:]), dtype=np.float32)
    exact = np.asarray(with_kernel(swapped, "exact")(batch))  # runs NHWC inside, on any device

    lowered = export.export_onnx(swapped, tmp_path / "m.onnx")
    plain = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    assert_close_to_roundoff(plain.run(None, {lowered.inputs[0]: batch})[0], exact,
                             reduction_terms(swapped))
    grouped = [r for r in lowered.layers if r.path == "grouped"][0]
    assert grouped.onnx_nodes  # the product node(s) are found and named in the metadata

    export.export_onnx(swapped, tmp_path / "m.kept.onnx", keep_kernels=True)
    kept = onnx_ops.session(tmp_path / "m.kept.onnx")
    assert_close_to_roundoff(kept.run(None, {lowered.inputs[0]: batch})[0],
                             np.asarray(swapped(batch)), reduction_terms(swapped))

    export.export_saved_model(swapped, tmp_path / "served")
    serve = tf.saved_model.load(str(tmp_path / "served")).signatures["serving_default"]
    out = serve(**{lowered.inputs[0]: tf.constant(batch)})[lowered.outputs[0]]
    assert_close_to_roundoff(np.asarray(out), exact, reduction_terms(swapped))


def test_mixed_precision_model_kept_kernel_export_verifies(tmp_path):
    """float16 compute: the verification tolerance follows the model's precision."""
    import graphswap
    from graphswap.io import onnx_ops
    from graphswap.io import export_onnx

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3),
                                  keras.layers.Flatten(), keras.layers.Dense(3)])
    finally:
        keras.config.set_dtype_policy(previous)
    swapped = graphswap.rewrite_model(model, kernel="mul8s_drum4")
    path = tmp_path / "mixed.onnx"
    export_onnx(swapped, path, keep_kernels=True)
    x = np.random.default_rng(0).uniform(0, 1, (4, 8, 8, 1)).astype(np.float32)
    session = onnx_ops.session(path)
    (out,) = session.run(None, {session.get_inputs()[0].name: x})
    ref = np.asarray(swapped(x), np.float32)
    assert np.max(np.abs(out.astype(np.float32) - ref)) <= 2e-2 * max(1.0, np.abs(ref).max())
