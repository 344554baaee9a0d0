"""Distillation mixed with the labels ("knowledge distillation from the float model as an option
on labelled data too"): finetune(..., teacher=..., teacher_weight=w) and
`finetune --teacher original --teacher-weight W` train on w x the teacher's targets + (1 - w) x the
labels - the same gradients as w x the distillation loss + (1 - w) x the label loss, checked here
against TensorFlow computing both losses separately."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner

from graphswap.cli import main
from graphswap.errors import GraphswapError
from graphswap.research import finetune, load_data
from graphswap.research.training.distillation import distillation_data, resolve_teacher
from graphswap.research.data.task import derive_task
from graphswap.swap import rewrite_model

COARSE = "fp32_m2"   # float products with a 2-bit mantissa: far from the teacher


def _classifier(seed, loss="sparse_categorical_crossentropy", softmax=True):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((6,), name="features"),
                              keras.layers.Dense(8, activation="relu", name="hidden"),
                              keras.layers.Dense(3, activation="softmax" if softmax else None,
                                                 name="out")], name="classifier")
    model.compile(loss=loss, metrics=["accuracy"])
    return model


def _data(seed, n=64):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype(np.float32) * 2
    return x, rng.integers(0, 3, n)


def _gradients(model, loss, x, y):
    with tf.GradientTape() as tape:
        value = loss(y, model(x, training=True))
    return [g.numpy() for g in tape.gradient(value, model.trainable_variables)]


@pytest.mark.parametrize("softmax", [True, False], ids=["probabilities", "logits"])
def test_mixed_targets_are_the_weighted_mixture_and_give_the_weighted_losses_gradients(softmax):
    model = _classifier(1, softmax=softmax,
                        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=not softmax))
    swapped = rewrite_model(model, kernel=COARSE)
    x, y = _data(1)
    teacher, _ = resolve_teacher("original", swapped)
    task = derive_task(swapped)
    data = load_data((x, y), swapped)
    mixed = distillation_data(data, teacher, task, teacher_weight=0.3).labels()
    logits_or_p = np.asarray(model(x), np.float64)
    p = logits_or_p if softmax else np.exp(logits_or_p) / np.exp(logits_or_p).sum(1, keepdims=True)
    np.testing.assert_allclose(mixed, 0.3 * p + 0.7 * np.eye(3)[y], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mixed.sum(axis=1), 1.0, rtol=1e-6)

    # the loss it trains with on the mixture has the gradients of the two losses, weighted
    distil = task.distillation_loss()
    labels_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=not softmax)
    together = _gradients(swapped, distil, x, mixed)
    apart = [0.3 * a + 0.7 * b for a, b in zip(_gradients(swapped, distil, x, p.astype(np.float32)),
                                               _gradients(swapped, labels_loss, x, y))]
    for got, want in zip(together, apart):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6 * np.abs(want).max())


def test_regression_mixture_is_the_weighted_mean_of_teacher_and_labels():
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3)])
    model.compile(loss="mse")
    swapped = rewrite_model(model, kernel=COARSE)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(40, 5)).astype(np.float32)
    y = rng.normal(size=(40, 3)).astype(np.float32)
    teacher, _ = resolve_teacher("original", swapped)
    mixed = distillation_data(load_data((x, y), swapped), teacher, derive_task(swapped),
                              teacher_weight=0.6).labels()
    np.testing.assert_allclose(mixed, 0.6 * np.asarray(model(x)) + 0.4 * y, rtol=1e-5,
                               atol=1e-6)


def test_finetune_mixed_reads_the_labels_and_scores_the_result_against_them():
    model = _classifier(3)
    swapped = rewrite_model(model, kernel=COARSE)
    x, y = _data(3)
    result = finetune(swapped, (x, y), epochs=2, batch_size=16, learning_rate=1e-2,
                      teacher="original", teacher_weight=0.5, verbose=0)
    assert any("mixed with the labels' (0.5 teacher, 0.5 labels)" in n for n in result.notes)
    assert any("0.5 x the teacher's outputs + 0.5 x the labels on its 64 examples" in n
               for n in result.notes)
    # the printed result is accuracy against the labels, as evaluate scores the saved model
    assert result.final_data == "training data"
    predicted = np.asarray(result.model(x)).argmax(axis=1)
    assert result.final["accuracy"] == pytest.approx(np.mean(predicted == y))
    assert derive_task(result.model).single.target == "indices"   # the task's loss, saved

    # pure distillation (weight 1) still scores agreement with the teacher
    pure = finetune(swapped, (x, y), epochs=1, batch_size=16, learning_rate=1e-2,
                    teacher="original", verbose=0)
    assert pure.final_data.endswith("against the teacher's outputs")


def test_teacher_weight_errors():
    model = _classifier(4)
    swapped = rewrite_model(model, kernel=COARSE)
    x, y = _data(4)
    with pytest.raises(GraphswapError, match=r"teacher's weight \(0.5\) was given without a "
                                             r"teacher; pass teacher='original'"):
        finetune(swapped, (x, y), epochs=1, teacher_weight=0.5, verbose=0)
    for bad in (0, 1.5, "half"):
        with pytest.raises(GraphswapError, match=r"teacher's weight must be a number in \(0, 1\]"):
            finetune(swapped, (x, y), epochs=1, teacher="original", teacher_weight=bad,
                     verbose=0)


def test_cli_teacher_weight_mixes_and_needs_labels(tmp_path):
    model = _classifier(5)
    swapped = rewrite_model(model, kernel=COARSE)
    path = tmp_path / "swapped.keras"
    swapped.save(path)
    x, y = _data(5)
    np.savez(tmp_path / "train.npz", x=x, y=y)
    np.savez(tmp_path / "inputs.npz", x=x)
    runner = CliRunner()
    out = runner.invoke(main, [str(a) for a in (
        "finetune", path, "--data", tmp_path / "train.npz", "--teacher", "original",
        "--teacher-weight", "0.25", "--epochs", "1", "--batch-size", "16",
        "-o", tmp_path / "mixed.keras")])
    assert out.exit_code == 0, out.output
    assert "0.25 x the teacher's outputs + 0.75 x the labels" in out.output
    assert keras.models.load_model(tmp_path / "mixed.keras").count_params() == \
        swapped.count_params()
    # mixing needs labels: an inputs-only file is refused in one line
    out = runner.invoke(main, [str(a) for a in (
        "finetune", path, "--data", tmp_path / "inputs.npz", "--teacher", "original",
        "--teacher-weight", "0.5", "--epochs", "1", "-o", tmp_path / "x.keras")])
    assert out.exit_code != 0 and out.output.startswith("Error:") and "label" in out.output
    assert "Traceback" not in out.output and not (tmp_path / "x.keras").exists()
    out = runner.invoke(main, [str(a) for a in (
        "finetune", path, "--data", tmp_path / "train.npz", "--teacher-weight", "0.5",
        "--epochs", "1", "-o", tmp_path / "y.keras")])
    assert out.exit_code == 1 and "given without a teacher" in out.output
    out = runner.invoke(main, [str(a) for a in (
        "finetune", path, "--data", tmp_path / "train.npz", "--teacher", "original",
        "--teacher-weight", "0", "-o", tmp_path / "z.keras")])
    assert out.exit_code == 1 and "--teacher-weight" in out.output
