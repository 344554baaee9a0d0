"""Keras 2 files as people have them: tf_keras writes the MLPerf Tiny architectures (small),
a MultiHeadAttention transformer block, an LSTM/GRU text model, a Conv2DTranspose decoder and a
model of TFOpLambda ops as .h5, as SavedModel (TF 2.5+ and TF 2.0-2.4 layouts) and as Keras 2
.keras archives; graphswap loads each with no option and its outputs equal tf_keras'."""

from __future__ import annotations

import json
import shutil
import warnings

import h5py
import keras
import numpy as np
import pytest
import tf_keras
import tensorflow as tf
from click.testing import CliRunner

from graphswap import io as gsio
from graphswap.cli import main
from graphswap.errors import ModelLoadError
from graphswap.io import keras2 as legacy
from graphswap.io.legacy_hdf5 import LegacyModelWarning
from graphswap.io.tf_op_layer import TFOpLambda

from conftest import assert_close_to_roundoff

L = tf_keras.layers


def _randomize_batchnorm(model, rng):
    """Give every BatchNormalization layer non-trivial statistics (else it is the identity)."""
    for layer in model.layers:
        if isinstance(layer, L.BatchNormalization):
            gamma, beta, mean, var = layer.get_weights()
            layer.set_weights([rng.uniform(0.5, 1.5, gamma.shape), rng.normal(0, 0.1, beta.shape),
                               rng.normal(0, 0.1, mean.shape), rng.uniform(0.5, 2.0, var.shape)])


def resnet8():
    inputs = tf_keras.Input((8, 8, 3), name="image")
    x = L.Conv2D(4, 3, padding="same", name="stem")(inputs)
    x = L.ReLU()(L.BatchNormalization(name="stem_bn")(x))
    y = L.Conv2D(8, 3, strides=2, padding="same", name="block_conv1")(x)
    y = L.Activation("relu")(L.BatchNormalization(name="block_bn1")(y))
    y = L.Conv2D(8, 3, padding="same", name="block_conv2")(y)
    y = L.BatchNormalization(name="block_bn2")(y)
    shortcut = L.Conv2D(8, 1, strides=2, name="shortcut")(x)
    x = L.Activation("relu")(L.Add()([y, shortcut]))
    x = L.AveragePooling2D(pool_size=4)(x)
    outputs = L.Dense(10, activation="softmax", name="logits")(L.Flatten()(x))
    return tf_keras.Model(inputs, outputs, name="resnet8")


def mobilenet():
    inputs = tf_keras.Input((12, 12, 3))
    x = L.Conv2D(4, 3, strides=2, padding="same", use_bias=False)(inputs)
    x = L.ReLU(6.0)(L.BatchNormalization()(x))
    for filters in (8, 8):
        x = L.DepthwiseConv2D(3, padding="same", use_bias=False)(x)
        x = L.ReLU(6.0)(L.BatchNormalization()(x))
        x = L.Conv2D(filters, 1, use_bias=False)(x)
        x = L.ReLU(6.0)(L.BatchNormalization()(x))
    x = L.Dropout(0.1)(L.GlobalAveragePooling2D()(x))
    return tf_keras.Model(inputs, L.Dense(2, activation="softmax")(x), name="mobilenet_v1")


def ds_cnn():
    inputs = tf_keras.Input((10, 5, 1))
    x = L.Conv2D(8, (5, 3), strides=(2, 1), padding="same")(inputs)
    x = L.Activation("relu")(L.BatchNormalization()(x))
    x = L.DepthwiseConv2D(3, padding="same", depth_multiplier=1)(x)
    x = L.Activation("relu")(L.BatchNormalization()(x))
    x = L.Conv2D(8, 1)(x)
    x = L.SeparableConv2D(8, 3, padding="same", activation="relu")(x)
    x = L.Dropout(0.2)(x)
    x = L.Flatten()(L.AveragePooling2D(pool_size=(5, 5))(x))
    return tf_keras.Model(inputs, L.Dense(4, activation="softmax")(x), name="ds_cnn")


def autoencoder():
    model = tf_keras.Sequential([tf_keras.Input((16,))] + [
        layer for units in (8, 4, 8) for layer in (L.Dense(units), L.BatchNormalization(),
                                                   L.ReLU())] + [L.Dense(16)],
        name="fc_autoencoder")
    return model


def transformer():
    inputs = tf_keras.Input((6, 8))
    attended = L.MultiHeadAttention(num_heads=2, key_dim=4, name="attention")(inputs, inputs)
    x = L.LayerNormalization(epsilon=1e-6)(L.Add()([inputs, attended]))
    ffn = L.Dense(8)(L.Dense(16, activation="relu")(x))
    x = L.LayerNormalization(epsilon=1e-6)(L.Add()([x, ffn]))
    x = L.GlobalAveragePooling1D()(x)
    return tf_keras.Model(inputs, L.Dense(3, activation="softmax")(x), name="transformer")


def text_lstm():
    inputs = tf_keras.Input((7,), dtype="int32")
    x = L.Embedding(30, 6)(inputs)
    x = L.LSTM(5, return_sequences=True)(x)
    x = L.Bidirectional(L.GRU(3))(x)
    return tf_keras.Model(inputs, L.Dense(1, activation="sigmoid")(x), name="text_lstm")


def lstm():
    inputs = tf_keras.Input((7,), dtype="int32")
    x = L.LSTM(4)(L.Embedding(30, 6)(inputs))
    return tf_keras.Model(inputs, L.Dense(1, activation="sigmoid")(x), name="lstm")


def decoder():
    inputs = tf_keras.Input((4, 4, 3))
    x = L.Conv2DTranspose(4, 3, strides=2, padding="same", activation="relu")(inputs)
    x = L.LeakyReLU(alpha=0.2)(L.BatchNormalization()(x))
    return tf_keras.Model(inputs, L.Conv2DTranspose(3, 3, strides=2, padding="same")(x),
                          name="decoder")


def tf_ops():
    """tf.* functions and Python operators on symbolic tensors: tf_keras records TFOpLambda and
    SlicingOpLambda layers (constant arguments, tensor keyword arguments, a list argument)."""
    inputs = tf_keras.Input((6,))
    x = L.Dense(6)(inputs)
    grid = tf.reshape(x, (-1, 2, 3))
    row = grid[:, 0, :]
    other = grid[:, 1:, :]
    y = tf.math.add(row, 1.0) * 2.0
    z = tf.concat([y, tf.nn.relu(row)], axis=-1)
    w = tf.math.multiply(z, y=tf.math.reduce_mean(other, axis=1, keepdims=False)[:, :1])
    return tf_keras.Model(inputs, L.Dense(2)(w - 0.5), name="tf_ops")


MODELS = {"resnet8": resnet8, "mobilenet": mobilenet, "ds_cnn": ds_cnn,
          "autoencoder": autoencoder, "transformer": transformer, "text_lstm": text_lstm,
          "decoder": decoder, "tf_ops": tf_ops, "lstm": lstm}


def _sample(model, batch=4, seed=0):
    rng = np.random.default_rng(seed)
    shape = (batch,) + tuple(model.input_shape[1:])
    if model.inputs[0].dtype.is_integer:
        return rng.integers(0, 30, size=shape).astype(np.int32)
    return rng.normal(size=shape).astype(np.float32)


@pytest.fixture(scope="module")
def originals():
    built = {}
    rng = np.random.default_rng(26)
    for name, build in MODELS.items():
        tf_keras.utils.set_random_seed(1)
        model = build()
        _randomize_batchnorm(model, rng)
        built[name] = model
    return built


#: the models also saved as SavedModels (tf_keras traces every layer to save one: seconds each,
#: ~50 s for the bidirectional text model, so the text model saved that way has one LSTM)
SAVED_MODELS = ("mobilenet", "transformer", "lstm", "tf_ops", "decoder")


def _compile_as_keras2_users_did(name, model):
    loss = ("mse" if name in ("autoencoder", "decoder") else
            "binary_crossentropy" if name in ("text_lstm", "lstm") else
            "sparse_categorical_crossentropy")
    model.compile("adam", loss, metrics=["accuracy"])


@pytest.fixture(scope="module")
def saved(originals, tmp_path_factory):
    """Each model as .h5 and as a Keras 2 .keras archive, compiled the usual Keras 2 way; the
    SAVED_MODELS as TF 2.5+ SavedModels too."""
    root = tmp_path_factory.mktemp("legacy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, model in originals.items():
            _compile_as_keras2_users_did(name, model)
            model.save(str(root / f"{name}.h5"), save_format="h5")
            model.save(str(root / f"{name}.keras"))
            if name in SAVED_MODELS:
                model.save(str(root / f"{name}_savedmodel"), save_format="tf")
    return root


def _assert_same_model(model, original, name):
    assert isinstance(model, keras.Model)
    for layer in original.layers:
        if layer.weights and not isinstance(layer, L.InputLayer):
            got = sorted((tuple(w.shape), float(np.sum(np.asarray(w, np.float64))))
                         for w in model.get_layer(layer.name).weights)
            want = sorted((tuple(w.shape), float(np.sum(w.numpy(), dtype=np.float64)))
                          for w in layer.weights)
            assert got == want, f"{name}: weights of {layer.name} differ"
    x = _sample(original)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no input-structure warning either
        actual = np.asarray(model(x, training=False))
    expected = original(x, training=False).numpy()
    assert_close_to_roundoff(actual, expected, terms=64)
    return x


def _load_quietly(path, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LegacyModelWarning)
        return gsio.load_model(path, **kwargs)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_keras2_h5_loads_with_equal_outputs(name, originals, saved):
    model = _load_quietly(saved / f"{name}.h5")
    _assert_same_model(model, originals[name], name)
    assert model.compiled and model.loss  # the saved loss came with it


@pytest.mark.parametrize("name", sorted(MODELS))
def test_keras2_archive_loads_with_equal_outputs(name, originals, saved):
    model = _load_quietly(saved / f"{name}.keras")
    _assert_same_model(model, originals[name], name)
    assert model.compiled and model.loss


@pytest.mark.parametrize("name", SAVED_MODELS)
def test_keras2_saved_model_loads_with_equal_outputs(name, originals, saved):
    path = saved / f"{name}_savedmodel"
    assert legacy.is_keras2_saved_model(path)
    model = _load_quietly(path)
    _assert_same_model(model, originals[name], name)
    assert model.compiled and model.loss


def _tf24_layout(saved_model, target):
    """The TF 2.0-2.4 layout of a tf_keras SavedModel: each Keras object's metadata inside
    saved_model.pb (SavedUserObject.metadata), no keras_metadata.pb."""
    from tensorflow.core.protobuf import saved_model_pb2
    from tf_keras.protobuf import saved_metadata_pb2

    shutil.copytree(saved_model, target)
    metadata = saved_metadata_pb2.SavedMetadata()
    metadata.ParseFromString((target / "keras_metadata.pb").read_bytes())
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((target / "saved_model.pb").read_bytes())
    nodes = proto.meta_graphs[0].object_graph_def.nodes
    for node in metadata.nodes:
        assert nodes[node.node_id].user_object.identifier == node.identifier
        nodes[node.node_id].user_object.metadata = node.metadata
    (target / "saved_model.pb").write_bytes(proto.SerializeToString())
    (target / "keras_metadata.pb").unlink()
    return target


def test_tf24_saved_model_with_metadata_in_the_object_graph_loads(originals, saved, tmp_path):
    path = _tf24_layout(saved / "mobilenet_savedmodel", tmp_path / "mobilenet_tf24")
    assert not (path / "keras_metadata.pb").exists()
    assert legacy.is_keras2_saved_model(path)
    assert "DepthwiseConv2D" in legacy.saved_model_layer_classes(path)
    _assert_same_model(_load_quietly(path), originals["mobilenet"], "mobilenet")
    result = CliRunner().invoke(main, ["inspect", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert "inference-only" not in result.output


def test_hdf5_named_keras_loads_as_hdf5(originals, saved, tmp_path):
    path = tmp_path / "resnet8.keras"
    shutil.copy(saved / "resnet8.h5", path)
    _assert_same_model(_load_quietly(path), originals["resnet8"], "resnet8")
    result = CliRunner().invoke(main, ["inspect", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert "not found" not in result.output


@pytest.mark.parametrize("name,file", [
    ("mobilenet", "mobilenet.h5"), ("transformer", "transformer.h5"), ("tf_ops", "tf_ops.h5"),
    ("ds_cnn", "ds_cnn.h5"), ("resnet8", "resnet8.keras"),
    ("transformer", "transformer_savedmodel"), ("tf_ops", "tf_ops_savedmodel"),
    ("decoder", "decoder.h5"), ("autoencoder", "autoencoder.keras"),
    ("text_lstm", "text_lstm.h5")])
def test_cli_convert_keras2_files_exact_equals_tf_keras(name, file, originals, saved, tmp_path):
    output = tmp_path / f"{name}.swapped.keras"
    result = CliRunner().invoke(main, ["convert", str(saved / file), "--kernel", "exact",
                                       "-o", str(output), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{"):])
    assert report["swapped"] >= 1
    swapped = gsio.load_model(output)
    assert any(type(layer).__name__.startswith("Swapped") for layer in swapped.layers)
    x = _sample(originals[name])
    assert_close_to_roundoff(np.asarray(swapped(x, training=False)),
                             originals[name](x, training=False).numpy(), terms=64)


# -- TFOpLambda: only allow-listed TensorFlow functions -------------------------------------------

def _with_function(source, target, function):
    """A copy of an .h5 file whose first TFOpLambda layer names `function`."""
    shutil.copy(source, target)
    with h5py.File(target, "r+") as handle:
        config = json.loads(handle.attrs["model_config"])
        for layer in config["config"]["layers"]:
            if layer["class_name"] == "TFOpLambda":
                layer["config"]["function"] = function
                break
        handle.attrs["model_config"] = json.dumps(config)
    return target


@pytest.mark.parametrize("function", [
    "io.write_file", "py_function", "numpy_function", "compat.v1.py_func", "print",
    "io.gfile.remove", "math.add.__globals__", "__builtins__.eval", "raw_ops.WriteFile",
    "saved_model.load", "", {"class_name": "py_function"}])
def test_tf_op_layer_refuses_functions_off_the_allow_list(function, saved, tmp_path):
    path = _with_function(saved / "tf_ops.h5", tmp_path / "attack.h5", function)
    with pytest.raises(ModelLoadError, match="not one of the .* pure TensorFlow functions"):
        gsio.load_model(path)
    result = CliRunner().invoke(main, ["convert", str(path), "-o", str(tmp_path / "out.keras")])
    assert result.exit_code == 1
    assert result.output.startswith("Error: ") and result.output.count("\n") == 1
    assert len(result.output) < 600 and "Traceback" not in result.output
    assert not (tmp_path / "out.keras").exists()


def test_tf_op_layer_refuses_a_tampered_function_in_a_saved_model(saved, tmp_path):
    """A model graphswap saved (a Keras 3 .keras holding TFOpLambda) whose config was edited."""
    model = _load_quietly(saved / "tf_ops.h5")
    path = tmp_path / "tf_ops.keras"
    model.save(path)
    assert isinstance(gsio.load_model(path).get_layer("tf.reshape"), TFOpLambda)
    import zipfile

    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    config = members["config.json"].decode().replace('"function": "reshape"',
                                                     '"function": "io.write_file"')
    members["config.json"] = config.encode()
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    with pytest.raises(ModelLoadError, match="tf.io.write_file"):
        gsio.load_model(path)
    with pytest.raises(ModelLoadError, match="not one of"):
        TFOpLambda(function="io.write_file")


def test_tf_op_layer_calls_the_function_with_its_saved_arguments():
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    layer = TFOpLambda(function="reshape", arguments={"shape": [-1, 3, 2]})
    np.testing.assert_array_equal(np.asarray(layer(x)), x.reshape(-1, 3, 2))
    rebuilt = TFOpLambda.from_config(layer.get_config())
    np.testing.assert_array_equal(np.asarray(rebuilt(x)), x.reshape(-1, 3, 2))


# -- options Keras 3 cannot express are refused by name ------------------------------------------

def _edited_layer(source, target, class_name, **options):
    shutil.copy(source, target)
    with h5py.File(target, "r+") as handle:
        config = json.loads(handle.attrs["model_config"])
        for layer in config["config"]["layers"]:
            if layer["class_name"] == class_name:
                layer["config"].update(options)
                break
        handle.attrs["model_config"] = json.dumps(config)
    return target


@pytest.mark.parametrize("model,class_name,option,value", [
    ("lstm", "LSTM", "time_major", True),
    ("mobilenet", "DepthwiseConv2D", "groups", 2),
    ("decoder", "Conv2DTranspose", "groups", 2),
    ("resnet8", "BatchNormalization", "renorm", True),
    ("resnet8", "BatchNormalization", "virtual_batch_size", 4),
    ("resnet8", "Conv2D", "keras2_only_option", "x"),
])
def test_untranslatable_options_are_named_in_one_line(model, class_name, option, value, saved,
                                                       tmp_path):
    path = _edited_layer(saved / f"{model}.h5", tmp_path / "edited.h5", class_name,
                         **{option: value})
    with pytest.raises(ModelLoadError, match=f"{option}={value!r}") as info:
        gsio.load_model(path)
    assert f"({class_name})" in str(info.value) and "Rebuild the layer" in str(info.value)
    result = CliRunner().invoke(main, ["inspect", str(path)])
    assert result.exit_code == 1 and result.output.startswith("Error: ")
    assert result.output.count("\n") == 1 and len(result.output) < 600


# -- legacy training configurations --------------------------------------------------------------

def test_legacy_training_configs_are_rebuilt(tmp_path):
    inputs = tf_keras.Input((5,), name="features")
    hidden = L.Dense(4, activation="relu")(inputs)
    classes = L.Dense(3, name="classes")(hidden)
    score = L.Dense(1, activation="sigmoid", name="score")(hidden)
    model = tf_keras.Model(inputs, [classes, score])
    model.compile(
        tf_keras.optimizers.legacy.SGD(learning_rate=0.05, decay=0.01, momentum=0.9),
        loss=[tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              "binary_crossentropy"],
        loss_weights=[1.0, 0.25],
        metrics=[["accuracy"], ["accuracy", tf_keras.metrics.AUC(name="auc")]])
    path = tmp_path / "two_heads.h5"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save(str(path), save_format="h5")
    loaded = _load_quietly(path)
    assert loaded.compiled
    losses = loaded.loss
    assert isinstance(losses[0], keras.losses.SparseCategoricalCrossentropy)
    assert losses[0].get_config()["from_logits"] is True
    assert losses[1] == "binary_crossentropy"
    assert list(loaded.get_compile_config()["loss_weights"]) == [1.0, 0.25]
    optimizer = loaded.optimizer
    assert isinstance(optimizer, keras.optimizers.SGD)
    assert optimizer.momentum == pytest.approx(0.9)
    schedule = keras.optimizers.schedules.deserialize(optimizer.get_config()["learning_rate"])
    for step in (0, 10, 1000):  # Keras 2's decay: lr / (1 + decay * iterations)
        assert float(schedule(step)) == pytest.approx(0.05 / (1 + 0.01 * step), rel=1e-6)
    x = np.random.default_rng(0).normal(size=(16, 5)).astype(np.float32)
    y = (np.arange(16) % 3, (np.arange(16) % 2).astype(np.float32))
    history = loaded.fit(x, y, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_metric_keras3_lacks_is_left_out_with_a_note(saved, tmp_path):
    path = tmp_path / "odd_metric.h5"
    shutil.copy(saved / "autoencoder.h5", path)
    with h5py.File(path, "r+") as handle:
        training = json.loads(handle.attrs["training_config"])
        training["metrics"] = [["mae", "keras2_only_metric"]]
        handle.attrs["training_config"] = json.dumps(training)
    with pytest.warns(LegacyModelWarning, match="'keras2_only_metric' does not exist in Keras 3"):
        model = gsio.load_model(path)
    assert model.compiled and model.loss == "mse"


def test_cli_finetune_legacy_h5_compiled_with_accuracy(saved, tmp_path):
    """metrics=['accuracy'] as Keras 2 saved it (a MeanMetricWrapper) used to stop finetune with
    "MeanMetricWrapper.__init__() missing ... 'fn'"."""
    rng = np.random.default_rng(3)
    data = tmp_path / "data.npz"
    np.savez(data, x_train=rng.normal(size=(32, 12, 12, 3)).astype(np.float32),
             y_train=rng.integers(0, 2, 32), x_test=rng.normal(size=(16, 12, 12, 3)).astype(
                 np.float32), y_test=rng.integers(0, 2, 16))
    output = tmp_path / "tuned.keras"
    result = CliRunner().invoke(main, ["finetune", str(saved / "mobilenet.h5"), "--data",
                                       str(data), "--epochs", "1", "--batch-size", "16",
                                       "--lr", "0.001", "-o", str(output)])
    assert result.exit_code == 0, result.output
    assert "MeanMetricWrapper" not in result.output
    assert output.is_file()


def test_ellipsis_and_newaxis_slices_survive_h5_and_a_keras3_resave(tmp_path):
    inputs = tf_keras.Input((3, 4))
    sliced = inputs[..., 1:][:, None, 0]
    original = tf_keras.Model(inputs, L.Dense(2)(sliced))
    path = tmp_path / "slices.h5"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        original.save(str(path), save_format="h5")
    x = np.random.default_rng(5).normal(size=(2, 3, 4)).astype(np.float32)
    model = _load_quietly(path)
    assert_close_to_roundoff(np.asarray(model(x)), original(x).numpy(), terms=3)
    model.save(tmp_path / "slices.keras")
    again = gsio.load_model(tmp_path / "slices.keras")
    assert_close_to_roundoff(np.asarray(again(x)), original(x).numpy(), terms=3)


@pytest.mark.parametrize("suffix", [".h5", ".keras"])
@pytest.mark.parametrize("base_kind", ["Functional", "Sequential"])
def test_nested_model_called_twice_keeps_its_calls_apart(base_kind, suffix, tmp_path):
    """A Keras 2 nested model numbers its calls from 1 (node 0 was its own); a model called
    twice, whose second call is also an output, must map each reference to the right call."""
    if base_kind == "Functional":
        inner = tf_keras.Input((6, 6, 3))
        hidden = L.DepthwiseConv2D(3, padding="same")(inner)
        flat = tf.reshape(hidden, (-1, 36, 3))
        base = tf_keras.Model(inner, L.MultiHeadAttention(2, 2)(flat, flat), name="base")
    else:
        base = tf_keras.Sequential([tf_keras.Input((6, 6, 3)), L.DepthwiseConv2D(3, padding="same"),
                                    L.Reshape((36, 3))], name="base")
    inputs = tf_keras.Input((6, 6, 3))
    first, second = base(inputs), base(L.Rescaling(2.0)(inputs))
    original = tf_keras.Model(inputs, [L.Add()([first, second]), second, first])
    path = tmp_path / f"nested{suffix}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        original.save(str(path))
    model = _load_quietly(path)
    x = np.random.default_rng(7).normal(size=(2, 6, 6, 3)).astype(np.float32)
    for got, want in zip(model(x), original(x)):
        assert_close_to_roundoff(np.asarray(got), want.numpy(), terms=64)


def test_tensor_method_layers_are_refused_by_name(saved, tmp_path):
    """tf_keras records x.shape-like calls as InstanceProperty/InstanceMethod layers: graphswap
    does not rebuild them, and says so (not "pass custom objects")."""
    path = tmp_path / "method.h5"
    shutil.copy(saved / "tf_ops.h5", path)
    with h5py.File(path, "r+") as handle:
        config = json.loads(handle.attrs["model_config"])
        for layer in config["config"]["layers"]:
            if layer["class_name"] == "TFOpLambda":
                layer["class_name"] = "InstanceMethod"
                break
        handle.attrs["model_config"] = json.dumps(config)
    with pytest.raises(ModelLoadError, match="Keras 2 InstanceMethod .* does not rebuild") as info:
        gsio.load_model(path)
    assert "--custom-objects" not in str(info.value)
