"""Running a model for a comparison (graphswap/swap/compare.py): one traced graph, not op by op,
and every input fed in the structure the model was built with - so neither convert, fine-tuning,
evaluation nor calibration triggers Keras's "The structure of `inputs` doesn't match" warning
on a model built on a dict of named inputs."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import tensorflow as tf

import graphswap
from graphswap.swap import model_inputs, run_model

STRUCTURE_WARNING = "structure of `inputs` doesn't match"


class _RecordsMode(keras.layers.Layer):
    """Records whether each call ran eagerly (identity otherwise)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.eager_calls = []

    def call(self, x):
        self.eager_calls.append(tf.executing_eagerly())
        return x


def _dict_model(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6,), name="features")
    x = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
    model = keras.Model({"features": inputs}, keras.layers.Dense(3, name="out")(x))
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), metrics=["accuracy"])
    return model


def _structure_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if STRUCTURE_WARNING in str(w.message)]


def test_run_model_runs_one_graph_and_matches_the_eager_call():
    recorder = _RecordsMode(name="recorder")
    inputs = keras.Input((5, 4), name="sequence")
    x = keras.layers.LSTM(6, name="lstm")(recorder(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2, name="out")(x))
    batch = np.random.default_rng(0).normal(size=(3, 5, 4)).astype(np.float32)
    recorder.eager_calls.clear()
    outputs = run_model(model, batch)
    assert recorder.eager_calls and not any(recorder.eager_calls)  # traced, never eager
    eager = model(batch, training=False).numpy()
    np.testing.assert_allclose(outputs[0], eager, rtol=1e-5, atol=1e-6)


def test_model_inputs_follow_the_models_structure():
    x = np.zeros((2, 6), np.float32)
    packed = model_inputs(_dict_model(), x)
    assert isinstance(packed, dict) and list(packed) == ["features"] and packed["features"] is x
    single = keras.Input((6,), name="plain")
    plain = keras.Model(single, keras.layers.Dense(2)(single))
    assert model_inputs(plain, x) is x
    listed = keras.Model([single], keras.layers.Dense(2)(single))
    assert isinstance(model_inputs(listed, x), list)
    sequential = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2)])
    assert model_inputs(sequential, x) is x  # never called on a symbolic input: as given
    two = [keras.Input((6,), name="a"), keras.Input((6,), name="b")]
    pair = keras.Model({"a": two[0], "b": two[1]}, keras.layers.Add()(two))
    fed = model_inputs(pair, [x, x + 1])
    assert sorted(fed) == ["a", "b"] and float(fed["b"][0, 0]) == 1.0


def test_no_input_structure_warning_in_convert_finetune_evaluate(tmp_path):
    model = _dict_model()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, 6)).astype(np.float32)
    y = rng.integers(0, 3, 48)
    path, data = tmp_path / "named.keras", tmp_path / "data.npz"
    model.save(path)
    np.savez(data, x=x, y=y)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(x, training=False)  # what the warning looks like: Keras does warn on this feed
    assert _structure_warnings(caught)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        converted = graphswap.convert(str(path), "mul8u_drum4", output=str(tmp_path / "s.keras"),
                                      rewrite_options={"calibration_data": x[:32]})
        assert converted.max_abs_difference is not None
        tuned = graphswap.finetune(str(tmp_path / "s.keras"), str(data), epochs=1,
                                   batch_size=16, learning_rate="auto", val_split=0.25,
                                   output=str(tmp_path / "ft.keras"), verbose=0)
        assert tuned.epochs_run == [1]
        result = graphswap.evaluate(str(path), str(data), ["exact"])
        assert len(result.rows) == 2
    assert not _structure_warnings(caught)


def test_run_model_does_not_print_tensorflows_retracing_warning(caplog):
    """convert's checks call run_model per batch, each with its own tf.function (a layer's
    arithmetic may change between calls); TensorFlow's retracing warning was printed into every
    `convert --calibrate` report."""
    import logging

    import keras
    import numpy as np

    from graphswap.swap.compare import run_model

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with caplog.at_level(logging.WARNING, logger="tensorflow"):
        outputs = [run_model(model, np.ones((3 + i, 4), np.float32)) for i in range(12)]
    assert not [r for r in caplog.records if "retracing" in r.getMessage()]
    np.testing.assert_allclose(outputs[-1][0], np.asarray(model(np.ones((14, 4), np.float32))),
                               rtol=1e-6)
