"""Keras 2 inputs: SavedModel directories written by tf_keras and legacy full-model .h5,
translated to Keras 3 with the same weights and checked on real data; their refusals."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
import tf_keras
from click.testing import CliRunner

from graphswap import io as gsio
from graphswap.io import keras2 as legacy, keras3
from graphswap.cli import main
from graphswap.errors import ModelLoadError

from conftest import (EPS32, SAMPLE_DATA, SAMPLE_MODEL, assert_close_to_roundoff, reduction_terms,
                      tf_keras_lenet)


@pytest.fixture(scope="module")
def batch():
    with np.load(SAMPLE_DATA) as data:
        return data["x_test"][:32].astype(np.float32), data["y_test"][:32]


@pytest.fixture(scope="module")
def keras2_lenet():
    return tf_keras_lenet(keras.models.load_model(SAMPLE_MODEL))


@pytest.fixture(scope="module")
def keras2_saved_model(keras2_lenet, tmp_path_factory):
    path = tmp_path_factory.mktemp("keras2") / "lenet_savedmodel"
    keras2_lenet.save(str(path), save_format="tf")
    return path


def test_keras2_saved_model_is_translated_with_same_weights_and_outputs(
        keras2_saved_model, keras2_lenet, batch):
    assert (keras2_saved_model / "keras_metadata.pb").is_file()
    assert legacy.is_keras2_saved_model(keras2_saved_model)
    model = gsio.load_model(keras2_saved_model)
    assert isinstance(model, keras.Model)
    assert [layer.name for layer in model.layers] == [layer.name for layer in keras2_lenet.layers]
    for layer in keras2_lenet.layers:
        for got, want in zip(model.get_layer(layer.name).get_weights(), layer.get_weights()):
            np.testing.assert_array_equal(got, want)
    x, y = batch
    expected = keras2_lenet(x, training=False).numpy()
    assert_close_to_roundoff(np.asarray(model(x, training=False)), expected, reduction_terms(model))
    assert np.mean(expected.argmax(1) == y) > 0.8  # a trained model, not random weights


def test_cli_convert_keras2_saved_model(keras2_saved_model, keras2_lenet, batch, tmp_path):
    output = tmp_path / "lenet.swapped.keras"
    result = CliRunner().invoke(main, ["convert", str(keras2_saved_model), "--kernel", "exact",
                                       "-o", str(output), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["swapped"] == 5
    assert report["max_abs_difference"] <= 8 * np.sqrt(779) * EPS32  # LeNet-5's softmax outputs
    swapped = gsio.load_model(output)
    assert {type(layer).__name__ for layer in swapped.layers} >= {"SwappedDense", "SwappedConv2D"}
    x, _ = batch
    assert_close_to_roundoff(np.asarray(swapped(x, training=False)),
                             keras2_lenet(x, training=False).numpy(), reduction_terms(swapped))


def test_keras2_saved_model_with_lambda_respects_safe_mode(tmp_path):
    inputs = tf_keras.Input((4,), name="features")
    doubled = tf_keras.layers.Lambda(lambda t: t * 2.0, name="double")(inputs)
    original = tf_keras.Model(inputs, tf_keras.layers.Dense(3, name="head")(doubled))
    path = tmp_path / "lambda_savedmodel"
    original.save(str(path), save_format="tf")
    with pytest.raises(ModelLoadError, match="Lambda") as info:
        gsio.load_model(path)
    assert "--unsafe" in str(info.value)
    result = CliRunner().invoke(main, ["convert", str(path), "-o", str(tmp_path / "o.keras")])
    assert result.exit_code == 1 and "Lambda" in result.output
    assert not (tmp_path / "o.keras").exists()
    model = gsio.load_model(path, safe_mode=False)
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    assert_close_to_roundoff(np.asarray(model(x)), original(x).numpy(), reduction_terms(model))


class Offset(keras.layers.Layer):
    """Keras 3 version of a custom layer that a Keras 2 model was saved with."""

    def __init__(self, offset=1.0, **kwargs):
        super().__init__(**kwargs)
        self.offset = offset

    def build(self, input_shape):
        self.gain = self.add_weight(name="gain", shape=(input_shape[-1],), initializer="ones")

    def call(self, inputs):
        return inputs * self.gain + self.offset

    def get_config(self):
        return {**super().get_config(), "offset": self.offset}


def test_keras2_saved_model_with_custom_layer_needs_its_keras3_class(tmp_path):
    class Keras2Offset(tf_keras.layers.Layer):
        def __init__(self, offset=1.0, **kwargs):
            super().__init__(**kwargs)
            self.offset = offset

        def build(self, input_shape):
            self.gain = self.add_weight(name="gain", shape=(input_shape[-1],),
                                        initializer="ones")

        def call(self, inputs):
            return inputs * self.gain + self.offset

        def get_config(self):
            return {**super().get_config(), "offset": self.offset}

    Keras2Offset.__name__ = "Offset"
    inputs = tf_keras.Input((4,), name="features")
    shifted = Keras2Offset(0.5, name="offset")(inputs)
    original = tf_keras.Model(inputs, tf_keras.layers.Dense(2, name="head")(shifted))
    original.get_layer("offset").set_weights([np.array([1.0, 2.0, 3.0, 4.0], np.float32)])
    path = tmp_path / "custom_savedmodel"
    original.save(str(path), save_format="tf")

    with pytest.raises(ModelLoadError, match="custom") as info:
        gsio.load_model(path)
    assert "--custom-objects" in str(info.value)
    model = gsio.load_model(path, custom_objects={"Offset": Offset})
    np.testing.assert_array_equal(model.get_layer("offset").get_weights()[0], [1, 2, 3, 4])
    x = np.random.default_rng(1).normal(size=(6, 4)).astype(np.float32)
    assert_close_to_roundoff(np.asarray(model(x)), original(x).numpy(), reduction_terms(model))


def test_translation_that_changes_outputs_is_refused(keras2_saved_model, monkeypatch):
    original_load = keras3.load_keras_file

    def tampered(*args, **kwargs):
        model = original_load(*args, **kwargs)
        kernel = model.get_layer("fc2").kernel
        kernel.assign(kernel.numpy() * 1.5)
        return model

    monkeypatch.setattr(legacy, "load_keras_file", tampered)
    with pytest.raises(ModelLoadError, match="different outputs"):
        gsio.load_model(keras2_saved_model)


def test_legacy_full_model_h5_from_tf_keras(keras2_lenet, batch, tmp_path):
    path = tmp_path / "lenet.h5"
    keras2_lenet.save(str(path), save_format="h5")
    model = gsio.load_model(path)
    x, _ = batch
    assert_close_to_roundoff(np.asarray(model(x, training=False)),
                             keras2_lenet(x, training=False).numpy(), reduction_terms(model))


def test_keras2_weights_only_h5_is_refused(keras2_lenet, tmp_path):
    path = tmp_path / "lenet.weights.h5"
    keras2_lenet.save_weights(str(path))
    with pytest.raises(ModelLoadError, match="weights-only"):
        gsio.load_model(path)


def test_inference_only_and_non_saved_model_directories_are_refused(tmp_path):
    exported = tmp_path / "exported"
    keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]).export(str(exported),
                                                                        verbose=False)
    with pytest.raises(ModelLoadError, match="inference-only SavedModel") as info:
        gsio.load_model(exported)
    assert "keras_metadata.pb is missing" in str(info.value)
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(ModelLoadError, match="not a SavedModel"):
        gsio.load_model(plain)
    with pytest.raises(ModelLoadError, match="not a SavedModel"):
        legacy.load_keras2_saved_model(plain)
