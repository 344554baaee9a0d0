"""Fine-tuning checkpoints are one atomic unit per epoch, under a lock.

A kill between the old checkpoint's two renames (last.keras, state.json) made `--resume` train an
epoch twice; two fine-tunes on one --checkpoint-dir mixed their files.  Here: fault injection at
every file-system call of every checkpoint write (the directory is snapshotted there - what a
kill at that instant leaves - and each snapshot is resumed: bit for bit the uninterrupted run),
a real process killed with os._exit at the rename of an epoch and resumed in a fresh process, a
second fine-tune on a directory in use (same process and another process), a damaged model file,
and a full disk in the middle of a checkpoint.
"""

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
from click.testing import CliRunner

from conftest import run_python
from graphswap.cli import main
from graphswap.errors import CheckpointError, OutputPathError
from graphswap.research.training import checkpoints
from graphswap.research.training.finetuning import finetune
from test_security_outputs import restore, snapshots_of_every_step

SETTINGS = dict(epochs=2, batch_size=8, learning_rate=1e-2, verbose=0, restore_best=False,
                seed=0)


def dropout_model():
    """Tiny, with Dropout: its random state must come back exactly for a bit-identical resume."""
    keras.utils.set_random_seed(3)
    model = keras.Sequential([
        keras.Input((6,), name="x"), keras.layers.Dense(8, activation="relu", name="hidden"),
        keras.layers.Dropout(0.3, name="drop"), keras.layers.Dense(3, activation="softmax",
                                                                   name="out")])
    model.compile(loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def data(n=32):
    rng = np.random.default_rng(1)
    y = rng.integers(0, 3, n)
    x = rng.normal(size=(n, 6)).astype(np.float32) + y[:, None]
    return x, y


class StopAfterEpoch1(keras.callbacks.Callback):
    """An interrupted run: stops after epoch 1 (its checkpoint written) of a 2-epoch run."""

    def on_epoch_end(self, epoch, logs=None):
        self.model.stop_training = True


def same_run(result, reference):
    assert result.history == reference.history      # every loss and metric of every epoch
    mine, theirs = result.model.get_weights(), reference.model.get_weights()
    assert len(mine) == len(theirs) > 0
    for a, b in zip(mine, theirs):
        np.testing.assert_array_equal(a, b)
    assert int(result.model.optimizer.iterations.numpy()) == \
        int(reference.model.optimizer.iterations.numpy())


def test_a_kill_at_any_step_of_any_checkpoint_resumes_bit_for_bit(tmp_path, monkeypatch):
    """Every state a kill can leave during the checkpoints of epochs 1 and 2 (before and after
    each rename, link, unlink, mkdir, rmdir, symlink, fsync, rmtree) is resumed with --resume:
    the weights, the optimizer step and every history value equal the uninterrupted run's."""
    model, arrays = dropout_model(), data()
    reference = finetune(model, arrays, checkpoint_dir=tmp_path / "straight", **SETTINGS)
    assert reference.epochs_run == [1, 2]
    layout = sorted(os.listdir(tmp_path / "straight"))
    assert layout == [".graphswap.lock", "best.keras", "current", "epoch-000002", "last.keras",
                      "state.json"], layout
    assert os.readlink(tmp_path / "straight" / "current") == "epoch-000002"
    watched = tmp_path / "killed"
    watched.mkdir()
    states = snapshots_of_every_step(monkeypatch, watched, lambda: finetune(
        model, arrays, checkpoint_dir=watched, force=True, **SETTINGS))
    epochs_seen = set()
    for state in states:
        restore(state, tmp_path / "replica")
        found = checkpoints.latest_checkpoint(tmp_path / "replica")
        epochs_seen.add(found.epoch if found else 0)
        resumed = finetune(model, arrays, checkpoint_dir=tmp_path / "replica", resume=True,
                           **SETTINGS)
        assert resumed.initial_epoch == (found.epoch if found else 0)
        same_run(resumed, reference)
    assert epochs_seen == {0, 1, 2}, epochs_seen
    assert len(states) >= 15, len(states)   # the kill points tried (distinct states)


KILL_SCRIPT = """
    import json, os, sys
    import numpy as np
    sys.path.insert(0, "tests")
    from test_security_checkpoints import SETTINGS, data, dropout_model
    from graphswap.research.training import checkpoints
    from graphswap.research.training.finetuning import finetune

    directory, mode, out = sys.argv[1:4]
    if mode == "kill":   # os._exit (no clean-up at all) at the rename of epoch 2's directory
        real = checkpoints.rename_no_replace

        def rename_then_die(source, destination):
            if str(destination).endswith("epoch-000002"):
                real(source, destination)
                os._exit(9)
            real(source, destination)

        checkpoints.rename_no_replace = rename_then_die
    result = finetune(dropout_model(), data(), checkpoint_dir=directory,
                      resume=mode == "resume", **SETTINGS)
    np.savez(out, *result.model.get_weights())
    print("RESULT", json.dumps({"history": result.history, "epochs_run": result.epochs_run}))
"""


def test_a_process_killed_at_an_epoch_rename_resumes_in_a_fresh_process(tmp_path):
    """A real process dies (os._exit) right after renaming epoch 2's directory, before `current`
    is switched; a fresh process resumes from it: the same weights as an uninterrupted run."""
    def run(mode, directory, out):
        code = KILL_SCRIPT.replace("sys.argv[1:4]", repr([str(directory), mode, str(out)]))
        return run_python(code, timeout=300)

    killed = run("kill", tmp_path / "ck", tmp_path / "unused.npz")
    assert killed.returncode == 9, killed.stderr[-2000:]
    assert os.readlink(tmp_path / "ck" / "current") == "epoch-000001"
    assert (tmp_path / "ck" / "epoch-000002" / "state.json").is_file()
    resumed = run("resume", tmp_path / "ck", tmp_path / "resumed.npz")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    result = json.loads(resumed.stdout.split("RESULT ")[-1])
    assert result["epochs_run"] == [2]   # epoch 2 done again from epoch 1's state: once
    assert sorted(os.listdir(tmp_path / "ck")) == [
        ".graphswap.lock", "best.keras", "current", "epoch-000002", "last.keras", "state.json"]
    reference = finetune(dropout_model(), data(), checkpoint_dir=tmp_path / "straight",
                         **SETTINGS)
    assert result["history"] == reference.history
    with np.load(tmp_path / "resumed.npz") as weights:
        for i, expected in enumerate(reference.model.get_weights()):
            np.testing.assert_array_equal(weights[f"arr_{i}"], expected)


def test_a_second_fine_tune_on_a_directory_in_use_is_refused(tmp_path):
    model, arrays = dropout_model(), data()
    directory = tmp_path / "ck"
    lock = checkpoints.lock_checkpoint_directory(directory)
    try:
        with pytest.raises(CheckpointError, match=f"{directory} is in use by pid {os.getpid()} "
                                                  f".another fine-tune writing its checkpoints.; "
                                                  f"wait for it to finish, or choose another"):
            finetune(model, arrays, checkpoint_dir=directory, **SETTINGS)
    finally:
        lock.release()
    assert os.listdir(directory) == [".graphswap.lock"]   # nothing written by the refused run
    first = finetune(model, arrays, checkpoint_dir=directory, **{**SETTINGS, "epochs": 1})
    assert first.epochs_run == [1]   # and the lock is released when finetune returns
    assert finetune(model, arrays, checkpoint_dir=directory, resume=True,
                    **SETTINGS).epochs_run == [2]
    # another process holds the lock: the CLI says so in one line, and writes nothing
    np.savez(tmp_path / "d.npz", x=arrays[0], y=arrays[1])
    model.save(tmp_path / "m.keras")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(directory / '.graphswap.lock')!r}, os.O_RDWR)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.ftruncate(fd, 0); os.pwrite(fd, str(os.getpid()).encode(), 0)\n"
        "print('held', flush=True)\n"
        "time.sleep(120)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = sorted(os.listdir(directory))
        result = CliRunner().invoke(main, [
            "finetune", str(tmp_path / "m.keras"), "--data", str(tmp_path / "d.npz"),
            "--epochs", "3", "--checkpoint-dir", str(directory), "--resume", "-o",
            str(tmp_path / "out.keras")])
        assert result.exit_code == 1, result.output
        last = [line for line in result.output.splitlines() if line.strip()][-1]
        assert last == (f"Error: checkpoint directory {directory} is in use by pid {holder.pid} "
                        f"(another fine-tune writing its checkpoints); wait for it to finish, or "
                        f"choose another --checkpoint-dir")
        assert sorted(os.listdir(directory)) == before
        assert not (tmp_path / "out.keras").exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_damaged_checkpoint_file_is_refused(tmp_path):
    model, arrays = dropout_model(), data()
    directory = tmp_path / "ck"
    finetune(model, arrays, checkpoint_dir=directory, **{**SETTINGS, "epochs": 1})
    # last.keras replaced by another valid model (a copy from another run, a disk error...)
    other = dropout_model()
    other.save(tmp_path / "other.keras")
    (directory / "current" / "last.keras").write_bytes((tmp_path / "other.keras").read_bytes())
    with pytest.raises(CheckpointError, match="last.keras of epoch 1 does not match the hash its "
                                              "state.json records"):
        finetune(model, arrays, checkpoint_dir=directory, resume=True, **SETTINGS)
    # a state moved into another epoch's directory
    os.rename(directory / "epoch-000001", directory / "epoch-000005")
    os.unlink(directory / "current")
    os.symlink("epoch-000005", directory / "current")
    with pytest.raises(CheckpointError, match="holds the state of epoch 1: the directory was "
                                              "edited"):
        finetune(model, arrays, checkpoint_dir=directory, resume=True, **SETTINGS)


def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch):
    """The disk fills up while epoch 2's checkpoint is written: one clear error, epoch 1's
    checkpoint stays current and whole, no partial or 0-byte temporary is left."""
    model, arrays = dropout_model(), data()
    directory = tmp_path / "ck"
    real_save = keras.Model.save
    calls = []

    def full_on_second(self, filepath, *args, **kwargs):
        calls.append(filepath)
        if len(calls) == 2:
            Path(filepath).write_bytes(b"")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(self, filepath, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "save", full_on_second)
    with pytest.raises(OutputPathError) as caught:
        finetune(model, arrays, checkpoint_dir=directory, **SETTINGS)
    assert str(caught.value) == (
        f"writing the checkpoint of epoch 2 in {directory} failed: No space left on device; the "
        f"checkpoint of the epoch before is kept; free some space or choose another "
        f"--checkpoint-dir")
    assert sorted(os.listdir(directory)) == [".graphswap.lock", "best.keras", "current",
                                             "epoch-000001", "last.keras", "state.json"]
    monkeypatch.undo()
    found = checkpoints.latest_checkpoint(directory)
    assert found.epoch == 1
    found.verify()
    assert finetune(model, arrays, checkpoint_dir=directory, resume=True,
                    **SETTINGS).epochs_run == [2]


def test_the_layout_of_older_versions_is_still_resumed(tmp_path):
    """Plain last.keras/best.keras/state.json at the top (graphswap before this layout, or a copy
    that followed the links): resumed, then rewritten in the new layout."""
    model, arrays = dropout_model(), data()
    reference = finetune(model, arrays, checkpoint_dir=tmp_path / "straight", **SETTINGS)
    finetune(model, arrays, checkpoint_dir=tmp_path / "ck", callbacks=[StopAfterEpoch1()],
             **SETTINGS)
    old = tmp_path / "old"
    old.mkdir()
    for name in ("last.keras", "best.keras", "state.json"):
        (old / name).write_bytes((tmp_path / "ck" / name).read_bytes())
    (old / ".state.json.tmp").write_text("{")   # the old layout's leftover temporary
    resumed = finetune(model, arrays, checkpoint_dir=old, resume=True, **SETTINGS)
    same_run(resumed, reference)
    assert sorted(os.listdir(old)) == [".graphswap.lock", "best.keras", "current", "epoch-000002",
                                       "last.keras", "state.json"]
    assert (old / "state.json").is_symlink()
