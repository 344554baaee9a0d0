"""Keras 2 files as people have them (issue 26): tf_keras writes the MLPerf Tiny architectures (small),
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
