"""The real-model zoo: small versions of the models people bring (tests/realmodels.py), each through the
README's pipeline from the file as saved - with no option beyond the README's and no reshaped
labels: the data files hold the labels in the form the model's saved loss expects.

Files: every kind saved by Keras 3 (.keras); every kind tf.keras has saved by tf_keras as .h5;
MobileNetV1 also as a tf_keras SavedModel (DepthwiseConv2D's Keras 2 config); ResNet-8 compiled
with jit_compile=True.  For each: `inspect`; `convert --kernel exact` (outputs equal to the
original's to float32 round-off; gradients too for a few); `convert --kernel mul8u_drum4` (100% of
the weight MACs on the kernel, attention scores reported apart); `evaluate` with the file's own
labels (the exact rewrite scores what the original scores); `finetune` with labels and with
`--teacher original`; `export --format onnx` / `savedmodel` (run by onnxruntime / plain
TensorFlow, equal to the Keras model); and one fresh process reloading every converted file,
equal to the outputs in this process.

The commands run in-process through click's runner (one TensorFlow start).  Fine-tuning and the
exports (tens of seconds each on a 2-core machine: tracing) run on the Keras 3 file of every kind;
the legacy files and the jit_compile model go through inspect, both converts, evaluate and the
fresh-process reload, and fine-tuning with labels for two .h5 files (the compiled metrics of a
legacy file are rebuilt) and the jit_compile model.
"""

from __future__ import annotations

import json
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import realmodels
from conftest import (assert_close_to_roundoff, assert_key_bias_gradients_vanish, gradient_terms,
                      invoke_cli, is_key_bias, json_report, reduction_terms, run_python)
from graphswap import io as gsio

tf_keras = pytest.importorskip("tf_keras")  # installed with the test extras (legacy fixtures)

KINDS = tuple(realmodels.BUILDERS)
KERAS2_KINDS = tuple(k for k in KINDS if k != "transformer_ecg")  # a Keras 3 custom layer

#: (kind, file): the Keras 3 archive of every kind, tf_keras .h5 of every Keras 2 kind, one
#: tf_keras SavedModel, one model compiled with jit_compile=True
CASES = ([(kind, "keras") for kind in KINDS] + [(kind, "h5") for kind in KERAS2_KINDS]
         + [("mobilenet_v1", "savedmodel"), ("resnet8", "jit")])
IDS = [f"{kind}-{file}" for kind, file in CASES]
KERAS3_CASES = [(kind, "keras") for kind in KINDS]

#: the task evaluate derives from the loss saved with each kind
TASKS = {"resnet8": "multiclass", "mobilenet_v1": "multiclass", "ds_cnn": "multiclass",
         "lstm_text": "multiclass", "gru_text": "multiclass", "transformer_ecg": "multiclass",
         "binary_mlp": "binary", "fc_autoencoder": "reconstruction", "conv_decoder": "regression",
         "regression_mlp": "regression"}
CLASSIFIERS = {kind for kind, task in TASKS.items() if task in ("multiclass", "binary")}




def _terms(model):
    """Round-off `terms` of a whole-model output: the Dense/Conv2D reduction lengths added up,
    plus timesteps x (input + units) per recurrent layer (every step adds its products)."""
    terms = reduction_terms(model)
    for layer in model.layers:
        inner = getattr(layer, "forward_layer", layer)
        if isinstance(inner, (keras.layers.LSTM, keras.layers.GRU, keras.layers.SimpleRNN)):
            steps, features = layer.input.shape[1:]
            terms += 2 * steps * (features + inner.units)
    return max(terms, 64)


class Zoo:
    """Each (kind, file) trained and saved once, converted once per kernel, on demand."""

    def __init__(self, root):
        self.root = root
        self.sources, self.converted = {}, {}

    def source(self, kind, file):
        """(path, data path, x, original outputs, the original model or None for tf_keras)."""
        key = (kind, file)
        if key not in self.sources:
            self.sources[key] = self._save(kind, file)
        return self.sources[key]

    def _save(self, kind, file):
        stem = self.root / f"{kind}_{file}"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if file in ("keras", "jit"):
                keras.utils.set_random_seed(0)
                model = realmodels.BUILDERS[kind](keras)
                if file == "jit":
                    model.compile("adam", model.loss, metrics=["accuracy"], jit_compile=True)
                x, y = realmodels.sample_data(model)
                model.fit(x, y, epochs=2, batch_size=16, verbose=0)
                path = stem.with_suffix(".keras")
                model.save(path)
            else:
                model = realmodels.trained(tf_keras, kind)
                x, y = realmodels.sample_data(model)
                if file == "h5":
                    path = stem.with_suffix(".h5")
                    model.save(str(path), save_format="h5")
                else:
                    path = stem
                    model.save(str(path), save_format="tf")
        data = stem.with_name(stem.name + "_data.npz")
        np.savez(data, x=x, y=y)
        expected = np.asarray(model(x, training=False))
        return path, data, x, expected, (model if file in ("keras", "jit") else None)

    def convert(self, kind, file, kernel):
        key = (kind, file, kernel)
        if key not in self.converted:
            path = self.source(kind, file)[0]
            out = self.root / f"{kind}_{file}.{kernel}.keras"
            report = json_report(invoke_cli("convert", path, "--kernel", kernel, "-o", out,
                                            "--json"))
            self.converted[key] = (out, report)
        return self.converted[key]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    realmodels.transformer_block_class()  # the user's class, registered as a user's would be
    return Zoo(tmp_path_factory.mktemp("zoo"))


@pytest.mark.parametrize("kind,file", CASES, ids=IDS)
def test_inspect_lists_every_weight_layer_for_swapping(kind, file, zoo):
    path = zoo.source(kind, file)[0]
    report = json_report(invoke_cli("inspect", path, "--json"))
    assert report["swapped"] >= 2
    assert report["macs"]["kernel"] == report["macs"]["total"] > 0
    assert all(entry["float_macs"] == 0 for entry in report["macs"]["by_type"].values())
    assert report["summary"].startswith("100.0% of")


@pytest.mark.parametrize("kind,file", CASES, ids=IDS)
def test_convert_exact_equals_the_original_to_roundoff(kind, file, zoo):
    path, _, x, expected, _ = zoo.source(kind, file)
    out, report = zoo.convert(kind, file, "exact")
    assert report["macs"]["kernel"] == report["macs"]["total"]
    swapped = gsio.load_model(out)
    assert sum(1 for _, layer in _all_layers(swapped) if type(layer).__name__.startswith("Swapped")
               ) >= 2
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no input-structure warning
        actual = np.asarray(swapped(x, training=False))
    assert_close_to_roundoff(actual, expected, _terms(swapped))


def _all_layers(model):
    from graphswap.swap import iter_layers
    return iter_layers(model)


@pytest.mark.parametrize("kind", ["resnet8", "mobilenet_v1", "lstm_text", "gru_text",
                                  "conv_decoder", "transformer_ecg"])
def test_convert_exact_gradients_equal_the_original(kind, zoo):
    _, _, x, _, original = zoo.source(kind, "keras")
    swapped = gsio.load_model(zoo.convert(kind, "keras", "exact")[0])
    weights = np.random.default_rng(1).normal(size=original.outputs[0].shape[1:])

    def gradients(model):
        with tf.GradientTape() as tape:
            y = model(x[:8], training=False)
            loss = tf.reduce_sum(y * tf.constant(weights, tf.float32))
        return [tf.convert_to_tensor(g).numpy()  # an Embedding's gradient: IndexedSlices
                for g in tape.gradient(loss, model.trainable_weights)]

    # matched by the order Keras tracks them in (the swapped layers take over the same weights)
    want, got = gradients(original), gradients(swapped)
    assert [g.shape for g in got] == [w.shape for w in want]
    terms = max(gradient_terms(original, 8)) + _terms(original)
    by_path = {w.path: g for w, g in zip(original.trainable_weights, want)}
    for weight, g, w in zip(original.trainable_weights, got, want):
        if is_key_bias(weight.path):  # zero analytically: two round-off noises
            assert_key_bias_gradients_vanish(weight.path, [g, w], by_path, terms)
        else:
            assert_close_to_roundoff(g, w, terms)


@pytest.mark.parametrize("kind,file", CASES, ids=IDS)
def test_convert_mul8u_drum4_puts_every_weight_mac_on_the_kernel(kind, file, zoo):
    out, report = zoo.convert(kind, file, "mul8u_drum4")
    macs = report["macs"]
    assert macs["kernel"] == macs["total"] > 0
    assert all(entry["float_macs"] == 0 and entry["swapped"] == entry["layers"]
               for entry in macs["by_type"].values())
    assert report["summary"].startswith("100.0% of")
    if kind == "transformer_ecg":  # activations x activations, reported apart
        assert macs["attention_float"] > 0 and "attention-score MACs" in report["summary"]
    assert {entry["kernel"] for entry in report["layers"] if entry["action"] == "swapped"} == {
        "mul8u_drum4"}
    _, _, x, expected, _ = zoo.source(kind, file)
    actual = np.asarray(gsio.load_model(out)(x, training=False))
    assert np.all(np.isfinite(actual)) and not np.array_equal(actual, expected)


@pytest.mark.parametrize("kind,file", CASES, ids=IDS)
def test_evaluate_with_the_files_own_labels(kind, file, zoo):
    path, data, _, _, _ = zoo.source(kind, file)
    result = json_report(invoke_cli("evaluate", path, "--data", data, "--json"))
    assert result["task"] == TASKS[kind]
    rows = {row["name"]: row for row in result["rows"]}
    score = result["score"]
    assert score == ("accuracy" if kind in CLASSIFIERS else "r2")
    original, exact = rows["original"][score], rows["exact"][score]
    assert original is not None and abs(exact - original) <= 1e-4, (original, exact)
    assert abs(rows["exact"]["loss"] - rows["original"]["loss"]) <= 1e-4 * max(
        1.0, abs(rows["original"]["loss"]))


def _assert_finetuned(out, start, x):
    tuned = gsio.load_model(out)
    before = gsio.load_model(start)
    assert any(type(layer).__name__.startswith("Swapped") for _, layer in _all_layers(tuned))
    changed = [not np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(tuned.trainable_weights, before.trainable_weights)]
    assert any(changed), "fine-tuning moved no weight"
    assert np.all(np.isfinite(np.asarray(tuned(x, training=False))))


FINETUNE_CASES = KERAS3_CASES + [("mobilenet_v1", "h5"), ("binary_mlp", "h5"), ("resnet8", "jit")]


@pytest.mark.parametrize("kind,file", FINETUNE_CASES,
                         ids=[f"{kind}-{file}" for kind, file in FINETUNE_CASES])
def test_finetune_with_labels(kind, file, zoo):
    _, data, x, _, _ = zoo.source(kind, file)
    start, report = zoo.convert(kind, file, "mul8u_drum4")
    out = start.with_name(start.stem + ".ft.keras")
    output = invoke_cli("finetune", start, "--data", data, "--epochs", 1, "-o", out)
    assert "labels" in output and "wrote" in output
    # every swapped layer counted, those inside a custom layer or a Bidirectional too
    assert f"{report['swapped']} swapped layer(s) in the loop, kernel(s): mul8u_drum4" in output
    _assert_finetuned(out, start, x)


@pytest.mark.parametrize("kind", KINDS)
def test_finetune_by_distillation_from_the_original(kind, zoo):
    _, data, x, _, _ = zoo.source(kind, "keras")
    start = zoo.convert(kind, "keras", "mul8u_drum4")[0]
    out = start.with_name(start.stem + ".teacher.keras")
    output = invoke_cli("finetune", start, "--data", data, "--epochs", 1, "--teacher", "original",
                     "-o", out)
    assert "distillation" in output and "labels not read" in output
    _assert_finetuned(out, start, x)


@pytest.mark.parametrize("kind", KINDS)
def test_export_onnx_runs_in_onnxruntime_equal_to_keras(kind, zoo):
    import onnxruntime

    _, _, x, _, _ = zoo.source(kind, "keras")
    start = zoo.convert(kind, "keras", "exact")[0]
    out = start.with_suffix(".onnx")
    invoke_cli("export", start, "--format", "onnx", "-o", out)
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (actual,) = session.run(None, {session.get_inputs()[0].name: x})
    model = gsio.load_model(start)
    assert_close_to_roundoff(actual, np.asarray(model(x, training=False)), _terms(model))


@pytest.mark.parametrize("kind", ["lstm_text", "gru_text", "transformer_ecg"])
def test_kept_kernel_onnx_of_recurrent_and_custom_layer_kinds_runs_the_kernel(kind, zoo):
    """`export --keep-kernels` of the mul8u_drum4 file: the recurrent cells' products inside
    the ONNX Loop, the transformer block's layers, all as graphswap nodes equal to Keras."""
    from graphswap.io import onnx_ops

    _, _, x, _, _ = zoo.source(kind, "keras")
    start = zoo.convert(kind, "keras", "mul8u_drum4")[0]
    out = start.with_name(start.stem + ".kept.onnx")
    invoke_cli("export", start, "--format", "onnx", "--keep-kernels", "-o", out)
    session = onnx_ops.session(out)
    (actual,) = session.run(None, {session.get_inputs()[0].name: x})
    model = gsio.load_model(start)
    assert_close_to_roundoff(actual, np.asarray(model(x, training=False)), _terms(model))
    doc = gsio.read_metadata(out)
    assert doc["format"] == "onnx-kept-kernels"
    assert all(entry["onnx_nodes"] for entry in doc["swapped_layers"])


@pytest.mark.parametrize("kind", KINDS)
def test_export_savedmodel_serves_equal_to_keras(kind, zoo):
    _, _, x, _, _ = zoo.source(kind, "keras")
    start = zoo.convert(kind, "keras", "exact")[0]
    out = start.with_name(start.stem + "_savedmodel")
    invoke_cli("export", start, "--format", "savedmodel", "-o", out)
    serving = tf.saved_model.load(str(out)).signatures["serving_default"]
    (name,) = serving.structured_input_signature[1]
    (actual,) = serving(**{name: tf.constant(x)}).values()
    model = gsio.load_model(start)
    assert_close_to_roundoff(actual.numpy(), np.asarray(model(x, training=False)), _terms(model))


def test_converted_files_reload_in_one_fresh_process(zoo, tmp_path):
    """Every converted file (exact and mul8u_drum4) reloaded by a new Python with graphswap
    imported: its predict() (with the compile settings saved with it, jit_compile included)
    equal to this process's outputs."""
    entries = []
    for kind, file in CASES:
        x = zoo.source(kind, file)[2]
        for kernel in ("exact", "mul8u_drum4"):
            path = zoo.convert(kind, file, kernel)[0]
            model = gsio.load_model(path)
            arrays = tmp_path / f"{kind}_{file}_{kernel}.npz"
            np.savez(arrays, x=x, y=np.asarray(model(x, training=False)))
            entries.append((f"{kind}-{file}-{kernel}", str(path), str(arrays), _terms(model)))
    (tmp_path / "entries.json").write_text(json.dumps(entries))
    result = run_python(f"""
        import json, sys
        import numpy as np
        sys.path.insert(0, "tests")
        import keras, graphswap, realmodels
        realmodels.transformer_block_class()
        out = {{}}
        for name, path, arrays, _ in json.load(open({str(tmp_path / "entries.json")!r})):
            x = np.load(arrays)["x"]
            # predict: the compile settings saved with the model (jit_compile) apply
            out[name] = keras.models.load_model(path).predict(x, verbose=0).tolist()
        print("RESULT" + json.dumps(out))
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    reloaded = json.loads(result.stdout.split("RESULT", 1)[1])
    assert sorted(reloaded) == sorted(name for name, *_ in entries)
    for name, _, arrays, terms in entries:
        assert_close_to_roundoff(np.asarray(reloaded[name]), np.load(arrays)["y"], terms)
