"""Fine-tuning never destroys the user's files nor writes a model that is not one.

Inputs inside the checkpoint directory (the model, the teacher, the data): `finetune ck/best.keras
--checkpoint-dir ck --force` cleared the folder before reading its input, deleting the user's best
model.  Such runs - and an output inside the checkpoint directory, or one holding it - are refused
up front now, the folder left byte for byte as it was.

A learning rate of inf or 1e30 wrote a model whose weights were all NaN as "best weights", exit 0.
Such rates are refused up front, and independently a run whose loss or weights become non-finite
stops with TrainingDivergedError: no output model, no checkpoint of the diverged epoch.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import keras
import numpy as np
import pytest
from click.testing import CliRunner

from conftest import one_error_line, tree_snapshot
from graphswap.cli import main
from graphswap.errors import GraphswapError, OutputPathError, TrainingDivergedError
from graphswap.research.training.finetuning import finetune

FAST = dict(epochs=1, batch_size=8, learning_rate=1e-2, verbose=0, seed=0)


def classifier():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((6,), name="x"),
                              keras.layers.Dense(8, activation="relu", name="hidden"),
                              keras.layers.Dense(3, activation="softmax", name="out")])
    model.compile(loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def regressor():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,), name="x"), keras.layers.Dense(1, name="y")])
    model.compile(loss="mse")
    return model


def classes(n=32):
    rng = np.random.default_rng(1)
    y = rng.integers(0, 3, n)
    return rng.normal(size=(n, 6)).astype(np.float32) + y[:, None], y


def cli(*args):
    return CliRunner().invoke(main, [os.fspath(a) for a in args])


@pytest.fixture
def checkpointed(tmp_path):
    """A model file, its training data and a checkpoint directory of a finished 1-epoch run."""
    x, y = classes()
    np.savez(tmp_path / "train.npz", x=x, y=y)
    classifier().save(tmp_path / "model.keras")
    finetune(tmp_path / "model.keras", tmp_path / "train.npz", checkpoint_dir=tmp_path / "ck",
             **FAST)
    assert (tmp_path / "ck" / "best.keras").is_file()
    return tmp_path


# ---------------------------------------------------------------------------------------------
# inputs, outputs and the checkpoint directory
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("role", ["model", "teacher"])
def test_a_model_inside_the_checkpoint_directory_is_refused_and_kept(checkpointed, role):
    work, ck = checkpointed, checkpointed / "ck"
    best = ck / "best.keras"
    weights = keras.saving.load_model(best).get_weights()
    before = tree_snapshot(ck)
    model, teacher = (best, None) if role == "model" else (work / "model.keras", best)
    with pytest.raises(OutputPathError, match=rf"the {role} {best} lies inside the checkpoint "
                                              rf"directory {ck}: .* Nothing was read or changed; "
                                              rf"copy it out of {ck} first"):
        finetune(model, work / "train.npz", checkpoint_dir=ck, force=True, teacher=teacher,
                 output=work / "out.keras", **FAST)
    args = ["finetune", model, "--data", work / "train.npz", "--checkpoint-dir", ck, "--force",
            "--epochs", "1", "--lr", "0.01", "-o", work / "out.keras"]
    line = one_error_line(cli(*args, *(["--teacher", teacher] if teacher else [])))
    assert f"the {role} {best} lies inside the checkpoint directory {ck}" in line
    assert tree_snapshot(ck) == before          # nothing deleted, replaced or added
    assert not (work / "out.keras").exists()
    for mine, kept in zip(keras.saving.load_model(best).get_weights(), weights):
        np.testing.assert_array_equal(mine, kept)
    # the same model copied out of the folder fine-tunes with --force as asked
    (work / "best.keras").write_bytes(best.read_bytes())
    if role == "model":
        result = finetune(work / "best.keras", work / "train.npz", checkpoint_dir=ck, force=True,
                          output=work / "out.keras", **FAST)
        assert result.epochs_run == [1] and (work / "out.keras").is_file()


def test_data_inside_the_checkpoint_directory_is_refused(checkpointed):
    work, ck = checkpointed, checkpointed / "ck"
    (ck / "train.npz").write_bytes((work / "train.npz").read_bytes())
    before = tree_snapshot(ck)
    inside = ck / "train.npz"
    for what, data, val_data in (("training data (--data)", inside, None),
                                 ("validation data (--val-data)", work / "train.npz", inside)):
        with pytest.raises(OutputPathError, match=re.escape(f"the {what} {inside} lies inside")):
            finetune(work / "model.keras", data, val_data=val_data, checkpoint_dir=ck,
                     force=True, output=work / "out.keras", **FAST)
    line = one_error_line(cli("finetune", work / "model.keras", "--data", ck / "train.npz",
                              "--checkpoint-dir", ck, "--force", "-o", work / "out.keras"))
    assert f"the training data (--data) {ck / 'train.npz'} lies inside the checkpoint" in line
    assert tree_snapshot(ck) == before and not (work / "out.keras").exists()


def test_a_link_into_the_checkpoint_directory_is_refused(checkpointed):
    work, ck = checkpointed, checkpointed / "ck"
    (work / "mine.keras").symlink_to(ck / "best.keras")
    before = tree_snapshot(ck)
    with pytest.raises(OutputPathError, match="the model .*mine.keras lies inside the checkpoint"):
        finetune(work / "mine.keras", work / "train.npz", checkpoint_dir=ck, force=True,
                 output=work / "out.keras", **FAST)
    assert tree_snapshot(ck) == before


def test_a_checkpoint_directory_inside_an_input_folder_is_refused(tmp_path):
    images = tmp_path / "images"
    (images / "cat").mkdir(parents=True)
    (images / "cat" / "a.png").write_bytes(b"not read")
    classifier().save(tmp_path / "model.keras")
    with pytest.raises(OutputPathError, match=rf"the checkpoint directory {images / 'ck'} lies "
                                              rf"inside the training data"):
        finetune(tmp_path / "model.keras", images, checkpoint_dir=images / "ck",
                 output=tmp_path / "out.keras", **FAST)
    assert sorted(os.listdir(images)) == ["cat"]


@pytest.mark.parametrize("output, checkpoint, where", [
    ("ck/out.keras", "ck", "lies inside the checkpoint directory"),
    ("out/", "out", "is the checkpoint directory"),
    ("out/", "out/ck", "holds the checkpoint directory"),
])
def test_an_output_overlapping_the_checkpoint_directory_is_refused_before_any_work(
        tmp_path, output, checkpoint, where):
    x, y = classes()
    np.savez(tmp_path / "train.npz", x=x, y=y)
    classifier().save(tmp_path / "model.keras")
    (tmp_path / "ck").mkdir()
    before = tree_snapshot(tmp_path)
    with pytest.raises(OutputPathError, match=rf"output \(-o/--output\) .*{output} {where}"):
        finetune(tmp_path / "model.keras", tmp_path / "train.npz",
                 checkpoint_dir=tmp_path / checkpoint, output=f"{tmp_path}/{output}", **FAST)
    result = cli("finetune", tmp_path / "model.keras", "--data", tmp_path / "train.npz",
                 "--checkpoint-dir", tmp_path / checkpoint, "-o", f"{tmp_path}/{output}")
    assert where in one_error_line(result)
    assert tree_snapshot(tmp_path) == before    # no checkpoint directory, lock or output made


# ---------------------------------------------------------------------------------------------
# learning rates and diverging runs
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rate", [float("inf"), "inf", 1e30, 10.5, "-inf", "nan"])
def test_a_non_finite_or_absurd_learning_rate_is_refused_up_front(tmp_path, monkeypatch, rate):
    def no_loading(*args, **kwargs):
        raise AssertionError("data was loaded before the learning rate was checked")

    monkeypatch.setattr("graphswap.research.training.finetuning.load_data", no_loading)
    with pytest.raises(GraphswapError, match=r"learning rate must be positive \(or 0 to freeze "
                                             r"the weights\) and at most 10, got "):
        finetune(classifier(), classes(), learning_rate=rate, output=tmp_path / "out.keras")
    assert not (tmp_path / "out.keras").exists()
    classifier().save(tmp_path / "model.keras")
    result = cli("finetune", tmp_path / "model.keras", "--data", tmp_path / "none.npz", "--lr",
                 str(rate), "-o", tmp_path / "out.keras")
    line = one_error_line(result)               # the option's check: before any work
    assert "Invalid value for '--lr'" in line and "at most 10" in line
    assert not (tmp_path / "out.keras").exists()


def test_the_largest_accepted_learning_rate_still_trains():
    result = finetune(classifier(), classes(), **{**FAST, "learning_rate": 10})
    assert result.epochs_run == [1]


def huge_regression(n=32):
    """Finite inputs whose squared error overflows float32: the loss is inf, the weights NaN."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype(np.float32) * np.float32(1e19)
    return x, rng.normal(size=(n, 1)).astype(np.float32)


def assert_no_checkpoint(directory: Path) -> None:
    names = set(os.listdir(directory)) - {".graphswap.lock"} if directory.exists() else set()
    assert names == set(), names


def test_a_loss_that_overflows_stops_the_run_and_writes_nothing(tmp_path):
    with pytest.raises(TrainingDivergedError,
                       match=r"fine-tuning diverged in epoch 1: the training loss is (inf|nan)"
                             r".* no model was written and no checkpoint of this epoch"):
        finetune(regressor(), huge_regression(), epochs=2, batch_size=8, learning_rate=1e-3,
                 verbose=0, checkpoint_dir=tmp_path / "ck", output=tmp_path / "out.keras")
    assert not (tmp_path / "out.keras").exists()
    assert_no_checkpoint(tmp_path / "ck")
    x, y = huge_regression()
    np.savez(tmp_path / "huge.npz", x=x, y=y)
    regressor().save(tmp_path / "model.keras")
    line = one_error_line(cli("finetune", tmp_path / "model.keras", "--data",
                              tmp_path / "huge.npz", "--epochs", "1", "--lr", "0.001",
                              "--checkpoint-dir", tmp_path / "ck2", "-o", tmp_path / "o.keras"))
    assert "fine-tuning diverged in epoch 1" in line and "Lower the learning rate" in line
    assert not (tmp_path / "o.keras").exists()
    assert_no_checkpoint(tmp_path / "ck2")


def test_a_large_finite_learning_rate_that_diverges_writes_nothing(tmp_path):
    """SGD at 1e8 (an optimizer object: used as given, beyond the learning-rate check)."""
    x = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32) * 100
    y = np.ones((32, 1), np.float32)
    with pytest.raises(TrainingDivergedError, match="fine-tuning diverged in epoch 1: .*NaN or "
                                                    "infinite|fine-tuning diverged in epoch 1: "
                                                    "the training loss"):
        finetune(regressor(), (x, y), optimizer=keras.optimizers.SGD(learning_rate=1e8),
                 epochs=1, batch_size=8, verbose=0, output=tmp_path / "out.keras")
    assert not (tmp_path / "out.keras").exists()


class Poison(keras.callbacks.Callback):
    """Makes one weight NaN at the start of epoch `at` (as a diverging step would)."""

    def __init__(self, at: int):
        super().__init__()
        self.at = at

    def on_epoch_begin(self, epoch, logs=None):
        if epoch + 1 == self.at:
            kernel = self.model.layers[0].kernel
            kernel.assign(np.full(kernel.shape, np.nan, np.float32))


def test_divergence_in_a_later_epoch_keeps_the_earlier_checkpoint_finite(tmp_path):
    ck = tmp_path / "ck"
    with pytest.raises(TrainingDivergedError,
                       match=rf"diverged in epoch 2: .*hidden/kernel, .* hold NaN or infinite "
                             rf"values.* the checkpoints of the earlier epochs in {ck} are kept"):
        finetune(classifier(), classes(), epochs=3, batch_size=8, learning_rate=1e-2,
                 verbose=0, seed=0, checkpoint_dir=ck, output=tmp_path / "out.keras",
                 callbacks=[Poison(at=2)])
    assert not (tmp_path / "out.keras").exists()
    assert sorted(n for n in os.listdir(ck) if n.startswith("epoch-")) == ["epoch-000001"]
    for name in ("best.keras", "last.keras"):
        weights = keras.saving.load_model(ck / name).get_weights()
        assert all(np.all(np.isfinite(w)) for w in weights)


def test_a_model_with_nan_weights_is_refused_before_training(tmp_path):
    model = classifier()
    model.layers[1].bias.assign(np.array([0, np.nan, 0], np.float32))
    with pytest.raises(TrainingDivergedError, match=r"weights hold NaN or infinite values before "
                                                    r"any training \(\S*out/bias\)"):
        finetune(model, classes(), output=tmp_path / "out.keras", **FAST)
    assert not (tmp_path / "out.keras").exists()
