"""Real models' files and exports: Keras 2 math and file layouts, two-output and augmented exports.

- A Keras 2 model whose math Keras 3 changed (`hard_sigmoid`: 0.2 x + 0.5 clipped in Keras 2,
  x / 6 + 0.5 in Keras 3) keeps Keras 2's formula (`graphswap>keras2_hard_sigmoid`, saved,
  reloaded, exported; without it the model would load silently with the new math and `evaluate`
  would score that changed model as "original"), Keras 2's defaults fill absent keys, and a
  Keras 2 file is compared with tf_keras' own load of it (a difference is refused, naming the
  layer).
- Keras 2 files older tf.keras wrote: a Bidirectional whose inner layer has no `module` key, a
  Sequential whose first layer holds `batch_input_shape` (no InputLayer entry).
- Exports: a two-output model's ONNX outputs are matched by name, not by position, against
  outputs ordered by name; a model holding RandomFlip exports as a SavedModel (its seed
  generator's variable reachable from the root).

Fixtures: tests/realmodels.py (FILE_AND_EXPORT_CASES), written by the Keras that users' tools used
- tf_keras for the Keras 2 files, with their configs edited only where older writers wrote them so.
"""

from __future__ import annotations

import json
import warnings
import zipfile

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf

import realmodels
from conftest import assert_close_to_roundoff, invoke_cli, json_report, run_python
from graphswap import io as gsio
from graphswap.errors import ModelLoadError
from graphswap.io import legacy_semantics
from graphswap.io.legacy_hdf5 import LegacyModelWarning
from graphswap.io.lowering import INFERENCE_IDENTITY

tf_keras = pytest.importorskip("tf_keras")  # installed with the test extras (legacy fixtures)

#: round-off terms of the recurrent models' outputs: 10 steps x (inputs + units) of two
#: recurrent layers, and the Dense sums
TERMS = 1024




def _load(path, **kwargs):
    """gsio.load_model, asserting the file was compared with tf_keras' own load of it."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LegacyModelWarning)
        model = gsio.load_model(path, **kwargs)
    unchecked = [str(w.message) for w in caught if "not compared" in str(w.message)]
    assert not unchecked, unchecked
    return model


def _save_keras2(model, path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "HDF5 is legacy": what users' files are
        if path.suffix == ".h5":
            model.save(str(path), save_format="h5")
        else:
            model.save(str(path))
    return path


def _edit_h5(source, target, edit, keras_version=None):
    """A copy of a Keras 2 .h5 file with `edit(config)` applied to its model config."""
    target.write_bytes(source.read_bytes())
    with h5py.File(target, "r+") as handle:
        config = json.loads(handle.attrs["model_config"])
        edit(config)
        handle.attrs["model_config"] = json.dumps(config)
        if keras_version is not None:
            handle.attrs["keras_version"] = keras_version
    return target


def _edit_archive(source, target, edit):
    """A copy of a Keras 2 .keras archive with `edit(config)` applied to its config.json."""
    with zipfile.ZipFile(source) as archive, zipfile.ZipFile(target, "w") as copy:
        for name in archive.namelist():
            data = archive.read(name)
            if name == "config.json":
                config = json.loads(data)
                edit(config)
                data = json.dumps(config).encode()
            copy.writestr(name, data)
    return target


def _layers(config):
    return config["config"]["layers"]


def _strip_inner_modules(config):
    """The wrappers' inner layers as tf.keras before 2.13 wrote them: no module key."""
    for layer in _layers(config):
        inner = layer["config"].get("layer")
        if isinstance(inner, dict):
            inner.pop("module", None)
            inner.pop("registered_name", None)


def _strip_input_layer(config):
    """A Sequential as older tf.keras (and Keras 2.2) wrote it: no InputLayer entry, the first
    layer holding batch_input_shape."""
    layers = _layers(config)
    assert layers[0]["class_name"] == "InputLayer"
    assert layers[1]["config"]["batch_input_shape"] == [None, 10, 3]
    del layers[0]


@pytest.fixture(scope="module")
def keras2(tmp_path_factory):
    """The Keras 2 fixtures trained and saved by tf_keras (.h5 and .keras), with their sample
    data and tf_keras' outputs on it."""
    root = tmp_path_factory.mktemp("keras2_files")
    files = {}
    for name in ("gru_sensor", "sequential_gru", "gru_text"):
        model = realmodels.trained(tf_keras, name)
        x, y = realmodels.sample_data(model)
        data = root / f"{name}_data.npz"
        np.savez(data, x=x, y=y)
        files[name] = {"h5": _save_keras2(model, root / f"{name}.h5"),
                       "keras": _save_keras2(model, root / f"{name}.keras"),
                       "data": data, "x": x, "y": y, "expected": model(x, training=False).numpy()}
    return root, files


def _outputs(model, x):
    return np.asarray(model(x, training=False))


# -- 1. Keras 2's hard_sigmoid and defaults ------------------------------------------------------

def test_keras2_hard_sigmoid_is_keras2s_formula():
    x = np.linspace(-4, 4, 801, dtype=np.float32)
    want = tf_keras.activations.hard_sigmoid(tf.constant(x)).numpy()
    np.testing.assert_array_equal(np.asarray(legacy_semantics.keras2_hard_sigmoid(x)), want)
    assert float(np.max(np.abs(np.asarray(keras.activations.hard_sigmoid(x)) - want))) > 0.08


@pytest.mark.parametrize("suffix", ["h5", "keras"])
def test_keras2_hard_sigmoid_model_loads_with_tf_keras_outputs(suffix, keras2):
    _, files = keras2
    entry = files["gru_sensor"]
    model = _load(entry[suffix])
    assert_close_to_roundoff(_outputs(model, entry["x"]), entry["expected"], TERMS)
    gru, squash = model.get_layer("gru"), model.get_layer("squash")
    assert gru.cell.recurrent_activation is legacy_semantics.keras2_hard_sigmoid
    assert squash.activation is legacy_semantics.keras2_hard_sigmoid
    assert gru.cell.reset_after is False


def test_cli_convert_exact_of_keras2_hard_sigmoid_equals_tf_keras_and_reloads(keras2, tmp_path):
    _, files = keras2
    entry = files["gru_sensor"]
    out = tmp_path / "gru_sensor.exact.keras"
    report = json_report(invoke_cli("convert", entry["h5"], "--kernel", "exact", "-o", out,
                                    "--json"))
    assert report["swapped"] >= 4
    for model in (gsio.load_model(out), keras.models.load_model(out)):
        assert_close_to_roundoff(_outputs(model, entry["x"]), entry["expected"], TERMS)
    config = json.dumps(json.loads(zipfile.ZipFile(out).read("config.json")))
    assert legacy_semantics.KERAS2_HARD_SIGMOID in config
    np.save(tmp_path / "x.npy", entry["x"])
    result = run_python(f"""
        import json
        import numpy as np
        import keras, graphswap
        model = keras.models.load_model({str(out)!r})
        print("RESULT" + json.dumps(model.predict(np.load({str(tmp_path / 'x.npy')!r}),
                                                  verbose=0).tolist()))
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    reloaded = np.asarray(json.loads(result.stdout.split("RESULT", 1)[1]))
    assert_close_to_roundoff(reloaded, entry["expected"], TERMS)


def test_cli_evaluate_scores_the_keras2_model_as_original(keras2):
    _, files = keras2
    entry = files["gru_sensor"]
    result = json_report(invoke_cli("evaluate", entry["h5"], "--data", entry["data"], "--json"))
    rows = {row["name"]: row for row in result["rows"]}
    probabilities = np.clip(entry["expected"].astype(np.float64), 1e-7, 1 - 1e-7)
    loss = float(-np.mean(np.log(probabilities[np.arange(len(entry["y"])), entry["y"]])))
    accuracy = float(np.mean(np.argmax(entry["expected"], axis=1) == entry["y"]))
    assert rows["original"]["loss"] == pytest.approx(loss, rel=1e-4)
    assert rows["original"]["accuracy"] == pytest.approx(accuracy)
    assert rows["exact"]["loss"] == pytest.approx(loss, rel=1e-4)


def test_cli_export_keras2_hard_sigmoid_onnx_and_savedmodel_equal_tf_keras(keras2, tmp_path):
    import onnxruntime

    _, files = keras2
    entry = files["gru_sensor"]
    converted = tmp_path / "gru_sensor.exact.keras"
    invoke_cli("convert", entry["h5"], "--kernel", "exact", "-o", converted)
    onnx_path = tmp_path / "gru_sensor.onnx"
    invoke_cli("export", converted, "--format", "onnx", "-o", onnx_path)
    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    (actual,) = session.run(None, {session.get_inputs()[0].name: entry["x"]})
    assert_close_to_roundoff(actual, entry["expected"], TERMS)
    saved = tmp_path / "gru_sensor_savedmodel"
    invoke_cli("export", converted, "--format", "savedmodel", "-o", saved)
    loaded = tf.saved_model.load(str(saved))  # held: the signature uses its variables
    serving = loaded.signatures["serving_default"]
    (name,) = serving.structured_input_signature[1]
    (served,) = serving(**{name: tf.constant(entry["x"])}).values()
    assert_close_to_roundoff(served.numpy(), entry["expected"], TERMS)
    assert_close_to_roundoff(_outputs(gsio.load_model(saved), entry["x"]), entry["expected"],
                             TERMS)


def test_absent_keras2_gate_keys_get_the_writing_versions_defaults(keras2, tmp_path):
    """A GRU / LSTM config as Keras 2.0-2.2 wrote it without the keys: Keras 2.2's defaults are
    reset_after=False and recurrent_activation='hard_sigmoid' (Keras 3's: True, 'sigmoid')."""
    _, files = keras2
    entry = files["gru_sensor"]

    def drop_gate_keys(config):
        for layer in _layers(config):
            if layer["class_name"] in ("GRU", "LSTM"):
                layer["config"].pop("reset_after", None)
                assert layer["config"].pop("recurrent_activation") == "hard_sigmoid"

    path = _edit_h5(entry["h5"], tmp_path / "keras22.h5", drop_gate_keys, keras_version="2.2.4")
    model = _load(path)
    assert model.get_layer("gru").cell.reset_after is False
    assert_close_to_roundoff(_outputs(model, entry["x"]), entry["expected"], TERMS)


def test_absent_keys_follow_the_version_table():
    new, old, conv = {}, {}, {}
    legacy_semantics.apply_semantics("GRU", new, (2, 15))
    legacy_semantics.apply_semantics("GRU", old, (2, 2))
    legacy_semantics.apply_semantics("ConvLSTM2D", conv, (2, 15))
    assert new == {}  # tf.keras 2's defaults are Keras 3's
    hard = keras.activations.serialize(legacy_semantics.keras2_hard_sigmoid)
    assert old == {"reset_after": False, "recurrent_activation": hard}
    assert conv == {"recurrent_activation": hard}


def test_a_translation_that_changes_the_math_is_refused_naming_the_layer(keras2, monkeypatch,
                                                                          tmp_path):
    """Without the hard_sigmoid translation (a change of meaning graphswap would not know of),
    the comparison with tf_keras' own load refuses the file: one line, the layer named."""
    _, files = keras2
    monkeypatch.setattr(legacy_semantics, "ACTIVATION_KEYS", ())
    for suffix in ("h5", "keras"):
        with pytest.raises(ModelLoadError, match=r"max \|difference\| .* layer 'gru' \(GRU\)"):
            gsio.load_model(files["gru_sensor"][suffix])
    out = tmp_path / "never.keras"
    output = invoke_cli("convert", files["gru_sensor"]["h5"], "--kernel", "exact", "-o", out,
                     code=1)
    assert output.startswith("Error: ") and output.count("\n") == 1 and "tf_keras" in output
    assert not out.exists()


def test_every_semantic_change_is_in_the_legacy_doc():
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "LEGACY.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    for change in legacy_semantics.SEMANTIC_CHANGES:
        assert any(f"| {change.name} |" in row for row in rows), change.name


# -- 5. Keras 2 files older tf.keras wrote ---------------------------------------------------------

@pytest.mark.parametrize("name,suffix", [("sequential_gru", "h5"), ("gru_text", "h5"),
                                         ("gru_text", "keras")])
def test_keras2_bidirectional_without_inner_module_loads(name, suffix, keras2, tmp_path):
    _, files = keras2
    entry = files[name]
    target = tmp_path / f"{name}_no_module.{suffix}"
    edit = _edit_h5 if suffix == "h5" else _edit_archive
    path = edit(entry[suffix], target, _strip_inner_modules)
    model = _load(path)
    assert_close_to_roundoff(_outputs(model, entry["x"]), entry["expected"], TERMS)


def test_keras2_sequential_with_batch_input_shape_converts(keras2, tmp_path):
    _, files = keras2
    entry = files["sequential_gru"]
    path = _edit_h5(entry["h5"], tmp_path / "sequential.h5", _strip_input_layer)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no "Do not pass an input_shape" either
        warnings.simplefilter("ignore", LegacyModelWarning)
        model = gsio.load_model(path)
    assert model.input_shape == (None, 10, 3)
    assert_close_to_roundoff(_outputs(model, entry["x"]), entry["expected"], TERMS)
    out = tmp_path / "sequential.exact.keras"
    invoke_cli("convert", path, "--kernel", "exact", "-o", out)
    assert_close_to_roundoff(_outputs(gsio.load_model(out), entry["x"]), entry["expected"], TERMS)


# -- 6. exports ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kernel,keep", [("exact", False), ("mul8u_drum4", True)],
                         ids=["lowered", "kept-kernels"])
def test_cli_export_onnx_of_two_heads_matches_outputs_by_name(kernel, keep, tmp_path):
    from graphswap.io import onnx_ops

    keras.utils.set_random_seed(0)
    model = realmodels.two_heads(keras)
    source = tmp_path / "two_heads.keras"
    model.save(source)
    converted = tmp_path / f"two_heads.{kernel}.keras"
    invoke_cli("convert", source, "--kernel", kernel, "-o", converted)
    out = tmp_path / "two_heads.onnx"
    invoke_cli("export", converted, "--format", "onnx", "-o", out, *(["--keep-kernels"] * keep))
    session = onnx_ops.session(out)
    assert [o.name for o in session.get_outputs()] == ["zeta", "alpha"]  # the model's order
    x = realmodels.sample_data(model)[0]
    zeta, alpha = session.run(None, {session.get_inputs()[0].name: x})
    assert zeta.shape == (32, 7) and alpha.shape == (32, 2)
    # lowered: the exact model, i.e. the original; kept: the converted model's own kernels
    reference = model if kernel == "exact" else gsio.load_model(converted)
    want_zeta, want_alpha = reference(x, training=False)
    assert_close_to_roundoff(zeta, np.asarray(want_zeta), 16)
    assert_close_to_roundoff(alpha, np.asarray(want_alpha), 16)


@keras.saving.register_keras_serializable(package="keras2_and_exports")
class UserFlip(keras.layers.RandomFlip):
    """A user's augmentation layer (a subclass: exports keep it, with its seed state)."""


@pytest.mark.parametrize("flip", [None, UserFlip], ids=["RandomFlip", "user-subclass"])
def test_cli_export_model_with_random_augmentation(flip, tmp_path):
    keras.utils.set_random_seed(0)
    model = realmodels.augmented_cnn(keras, flip=flip)
    source = tmp_path / "augmented.keras"
    model.save(source)
    converted = tmp_path / "augmented.exact.keras"
    invoke_cli("convert", source, "--kernel", "exact", "-o", converted)
    x = realmodels.sample_data(model)[0]
    want = np.asarray(model(x, training=False))
    saved = tmp_path / "augmented_savedmodel"
    invoke_cli("export", converted, "--format", "savedmodel", "-o", saved)
    loaded = tf.saved_model.load(str(saved))  # held: the signature uses its variables
    serving = loaded.signatures["serving_default"]
    (name,) = serving.structured_input_signature[1]
    (served,) = serving(**{name: tf.constant(x)}).values()
    assert_close_to_roundoff(served.numpy(), want, 27)
    # stock random layers are exported as the identity (no random state); a user's subclass is
    # kept, its seed generator's state tracked from the root
    states = [v.name for v in getattr(loaded, "model_states", [])]
    assert bool(states) == (flip is UserFlip) and all("seed" in name for name in states)
    assert_close_to_roundoff(_outputs(gsio.load_model(saved), x), want, 27)
    out = tmp_path / "augmented.onnx"
    invoke_cli("export", converted, "--format", "onnx", "-o", out)


ARGUMENTS = {"RandomRotation": (0.1,), "RandomZoom": (0.2,), "RandomTranslation": (0.1, 0.1),
             "RandomContrast": (0.2,), "RandomBrightness": (0.2,),
             "RandomColorDegeneration": (0.5,), "RandomHue": (0.5,), "RandomSaturation": (0.5,),
             "RandomSharpness": (0.5,), "RandomPosterization": (4,), "GaussianNoise": (0.1,),
             "GaussianDropout": (0.1,), "AlphaDropout": (0.1,), "Dropout": (0.1,),
             "SpatialDropout1D": (0.1,), "SpatialDropout2D": (0.1,), "SpatialDropout3D": (0.1,)}


@pytest.mark.parametrize("name", INFERENCE_IDENTITY)
def test_inference_identity_layers_are_the_identity_at_inference(name):
    cls = getattr(keras.layers, name, None)
    if cls is None:
        pytest.skip(f"this Keras has no {name}")
    x = np.random.default_rng(0).uniform(0, 1, (2, 8, 8, 3)).astype(np.float32)
    x = x[:, 0] if name == "SpatialDropout1D" else x[:, None] if name == "SpatialDropout3D" else x
    np.testing.assert_array_equal(np.asarray(cls(*ARGUMENTS.get(name, ()))(x, training=False)), x)
