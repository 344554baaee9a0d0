"""What `finetune` reports is the model it saves: the printed final metrics are the saved file's,
scored as `evaluate` scores it (after the best epoch's weights are restored and BatchNorm is
re-estimated, which the training history predates); and accuracy has one definition for soft
targets in fine-tuning and in `evaluate` (a U-Net's mask in [0, 1] scored 0.26 during fine-tuning
and 85% in evaluate)."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
from click.testing import CliRunner

import graphswap
from conftest import REPO, SAMPLE_DATA

CNN_BN = REPO / "sample_models" / "cnn_bn.keras"
from graphswap.cli import main
from graphswap.research.data.output_task import ThresholdedBinaryAccuracy
from graphswap.research.data.task import derive_task


def test_the_printed_final_metrics_are_the_saved_models(tmp_path):
    with np.load(SAMPLE_DATA) as data:
        x, y = data["x_train"][:300], data["y_train"][:300]
        xv, yv = data["x_test"][:120], data["y_test"][:120]
    np.savez(tmp_path / "train.npz", x=x, y=y)
    np.savez(tmp_path / "val.npz", x=xv, y=yv)
    model = keras.models.load_model(CNN_BN)   # BatchNorm: re-estimated after training
    swapped = graphswap.rewrite_model(model, kernel="mul8s_drum3")
    swapped.save(tmp_path / "m.keras")
    output = tmp_path / "m.ft.keras"
    result = CliRunner().invoke(main, ["finetune", str(tmp_path / "m.keras"), "--data",
                                       str(tmp_path / "train.npz"), "--val-data",
                                       str(tmp_path / "val.npz"), "--epochs", "2", "-o",
                                       str(output), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output[result.output.index("{"):])
    assert payload["final_data"] == "validation data"
    evaluated = CliRunner().invoke(main, ["evaluate", str(output), "--data",
                                          str(tmp_path / "val.npz"), "--json"])
    assert evaluated.exit_code == 0, evaluated.output
    row = json.loads(evaluated.output[evaluated.output.index("{"):])["rows"][0]
    assert payload["final"]["accuracy"] == pytest.approx(row["accuracy"], abs=1e-12)
    assert payload["final"]["loss"] == pytest.approx(row["loss"], rel=1e-5)
    printed = CliRunner().invoke(main, ["finetune", str(tmp_path / "m.keras"), "--data",
                                        str(tmp_path / "train.npz"), "--val-data",
                                        str(tmp_path / "val.npz"), "--epochs", "2", "-o",
                                        str(output), "--force"])
    assert printed.exit_code == 0, printed.output
    line = next(text for text in printed.output.splitlines() if text.startswith("the saved model"))
    assert f"accuracy {row['accuracy']:.2%}" in line and "on the validation data" in line


def test_without_validation_data_the_final_metrics_are_on_the_training_data(tmp_path):
    with np.load(SAMPLE_DATA) as data:
        x, y = data["x_train"][:200], data["y_train"][:200]
    swapped = graphswap.rewrite_model(keras.models.load_model(CNN_BN), kernel="mul8u_drum4")
    result = graphswap.finetune(swapped, (x, y), epochs=1, verbose=0)
    assert result.final_data == "training data"
    outputs = np.asarray(result.model.predict(x, verbose=0))
    assert result.final["accuracy"] == pytest.approx(
        float(np.mean(outputs.argmax(axis=1) == y)), abs=1e-12)


def test_soft_targets_score_the_same_in_finetuning_and_evaluate():
    rng = np.random.default_rng(0)
    labels = rng.uniform(0, 1, (64, 8, 8, 1)).astype(np.float32)     # a soft mask
    outputs = np.clip(labels + rng.normal(0, 0.3, labels.shape), 0, 1).astype(np.float32)
    inputs = keras.Input((8, 8, 1))
    model = keras.Model(inputs, keras.layers.Conv2D(1, 1, activation="sigmoid")(inputs))
    model.compile(loss="binary_crossentropy")
    task = derive_task(model)
    metric = task.keras_metrics()[0]
    assert isinstance(metric, ThresholdedBinaryAccuracy)
    metric.update_state(labels, outputs)
    expected = float(np.mean((labels > 0.5) == (outputs > 0.5)))
    assert float(metric.result()) == pytest.approx(expected, abs=1e-6)
    assert task.evaluate(outputs, labels)["accuracy"] == pytest.approx(expected, abs=1e-6)
    # Keras's own BinaryAccuracy gives 0 for every soft label: the definition this replaced
    keras_metric = keras.metrics.BinaryAccuracy()
    keras_metric.update_state(labels, outputs)
    assert float(keras_metric.result()) < 0.05 < expected
    # it saves and reloads with a model compiled with it
    restored = ThresholdedBinaryAccuracy.from_config(metric.get_config())
    assert restored.threshold == metric.threshold and restored.name == "accuracy"


def test_auto_learning_rate_judges_the_start_against_the_original_models_fit():
    """A model whose own training loss is far above 0.03 (the MLPerf ResNet-8's is 0.19 on
    CIFAR-10): a swapped start within FITTED_RATIO x the original's loss takes CLOSE_LEARNING_RATE,
    one beyond it the large rate; both losses are measured on the same examples, and the
    original is the swapped model lowered back to float."""
    from conftest import small_data, small_model
    from graphswap.research.training import recovery
    from graphswap.research.data.loading import load_data as read

    x, y = small_data(n=96)
    model = small_model(seed=1)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy")
    train = read((x, y), model)
    original = np.inf
    while original > 0.3:      # fitted, but its loss well above the absolute 0.03
        model.fit(x, y, epochs=1, batch_size=16, verbose=0)
        original, _ = recovery.start_training_loss(model, train,
                                                   "sparse_categorical_crossentropy")
    assert original > recovery.FITTED_LOSS
    close = graphswap.rewrite_model(model, kernel="exact")
    rate, note = recovery.auto_learning_rate(close, train, "sparse_categorical_crossentropy",
                                             reference=model)
    assert rate == recovery.CLOSE_LEARNING_RATE
    assert f"x the original float model's {original:.4f}" in note
    # a start far from the original's fit: the classifier's weights negated (the original
    # passed is the real one)
    far = graphswap.rewrite_model(model, kernel="exact")
    far.set_weights([-w if i >= len(far.get_weights()) - 2 else w
                     for i, w in enumerate(far.get_weights())])
    start, _ = recovery.start_training_loss(far, train, "sparse_categorical_crossentropy")
    assert start > recovery.FITTED_RATIO * original
    rate, note = recovery.auto_learning_rate(far, train, "sparse_categorical_crossentropy",
                                             reference=model)
    assert rate == recovery.UNFITTED_LEARNING_RATE and "cost the model its fit" in note
    # finetune passes the original lowered from the swapped model
    result = graphswap.finetune(close, (x, y), epochs=1, verbose=0)
    assert any("x the original float model's" in n for n in result.notes)
