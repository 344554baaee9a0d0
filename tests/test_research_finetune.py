"""graphswap.train: fine-tuning rewritten models with their kernels in the loop, compile defaults,
best-epoch restore, early stopping, checkpoint/resume, and tf.distribute strategies
(MirroredStrategy on two logical CPUs, MultiWorkerMirroredStrategy with two local workers)."""

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest
from click.testing import CliRunner

from conftest import SAMPLE_DATA, SAMPLE_MODEL, run_python, small_data, small_model
from graphswap import io as gsio
from graphswap.cli import main
from graphswap.errors import DataError, GraphswapError, OutputPathError
from graphswap.research.data.scoring import classification_metrics, predict
from graphswap.research import load_data
from graphswap.swap import rewrite_model
from graphswap.research.training.finetuning import (compile_settings, finetune, format_history,
                                                    swapped_layers)

APPROXIMATE = "mul8u_drum4"  # costs the sample LeNet-5 about 15 points of accuracy


class Interrupt(keras.callbacks.Callback):
    """Simulates a killed run: raises after the checkpoint of epoch `after` was written."""

    def __init__(self, after):
        super().__init__()
        self.after = after

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == self.after:
            raise KeyboardInterrupt


def test_finetuning_with_an_approximate_multiplier_recovers_accuracy():
    """The point of the package: the sample loses accuracy to mul8u_drum4 under TFApprox's
    quantization (asymmetric per-tensor weights, per-call activation ranges); one epoch wins it
    back."""
    original = gsio.load_model(SAMPLE_MODEL)
    swapped = rewrite_model(original, kernel=APPROXIMATE, quantization="tfapprox")
    test = load_data(SAMPLE_DATA, original, split="test")
    labels = test.labels()
    accuracy_original = classification_metrics(predict(original, test), labels,
                                               "sparse")["accuracy"]
    before = classification_metrics(predict(swapped, test), labels, "sparse")["accuracy"]
    assert before < accuracy_original - 0.05  # the multiplier really costs accuracy
    result = finetune(swapped, SAMPLE_DATA, epochs=1, batch_size=128, learning_rate=1e-4, seed=0,
                      verbose=0)
    after = classification_metrics(predict(result.model, test), labels, "sparse")["accuracy"]
    assert after > before + 0.02
    # the kernels stayed in the loop: the fine-tuned model still runs the multiplier
    assert set(swapped_layers(result.model).values()) == {APPROXIMATE}
    assert result.epochs_run == [1]
    assert any("compiled with the loss/metrics saved in the model: "
               "sparse_categorical_crossentropy, accuracy" in note for note in result.notes)
    # the model passed in was not trained
    np.testing.assert_array_equal(swapped.get_weights()[0],
                                  rewrite_model(original, kernel=APPROXIMATE,
                                                quantization="tfapprox").get_weights()[0])


def test_compile_defaults_are_stated_for_models_saved_without_a_loss():
    plain = small_model(compiled=False)
    settings = compile_settings(plain, "sparse")
    assert type(settings.loss).__name__ == "SparseCategoricalCrossentropy"
    assert settings.loss.get_config()["from_logits"] is False
    assert "the model carries no loss" in settings.note and "softmax" in settings.note
    logits = compile_settings(small_model(compiled=False, softmax=False), "one_hot")
    assert type(logits.loss).__name__ == "CategoricalCrossentropy"
    assert logits.loss.get_config()["from_logits"] is True
    # the saved loss decides: one-hot labels are converted for it (graphswap.research.data.task),
    # not refused
    saved = compile_settings(small_model(), "one_hot")
    assert saved.loss_name == "sparse_categorical_crossentropy"


def test_finetune_trains_an_uncompiled_swapped_model_and_keeps_the_best_epoch():
    x, y = small_data()
    swapped = rewrite_model(small_model(compiled=False), kernel="exact")
    result = finetune(swapped, (x, y), val_split=0.25, epochs=3, batch_size=8,
                      learning_rate=1e-2, seed=0, verbose=0)
    assert result.monitor == "val_accuracy"
    assert result.history["epoch"] == [1, 2, 3]
    assert set(result.history) >= {"loss", "accuracy", "val_loss", "val_accuracy"}
    best = int(np.argmax(result.history["val_accuracy"])) + 1
    assert result.best_epoch == best
    assert result.best_value == pytest.approx(max(result.history["val_accuracy"]))
    assert result.history["loss"][-1] < result.history["loss"][0]
    assert "*" in format_history(result).splitlines()[1 + best]
    assert any("the model carries no loss" in note for note in result.notes)


def test_restore_best_puts_back_the_best_epochs_weights():
    x, y = small_data()
    model = rewrite_model(small_model(), kernel="exact")
    seen = []

    class Record(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(self.model.get_weights())

    result = finetune(model, (x, y), val_data=small_data(24, seed=5), epochs=3, batch_size=8,
                      learning_rate=0.5, seed=0, verbose=0, monitor="val_loss",
                      callbacks=[Record()])
    best = int(np.argmin(result.history["val_loss"]))
    for got, expected in zip(result.model.get_weights(), seen[best]):
        np.testing.assert_array_equal(got, expected)
    assert result.restored_best == (best != 2)


def test_early_stopping_stops_when_the_monitor_does_not_improve():
    x, y = small_data()
    result = finetune(rewrite_model(small_model(), kernel="exact"), (x, y), val_split=0.25,
                      epochs=6, batch_size=8, learning_rate=0.0, seed=0, verbose=0, patience=2)
    assert result.stopped_early
    assert result.epochs_run == [1, 2, 3]  # epoch 1 sets the best, 2 and 3 do not improve
    assert any("stopped early" in note for note in result.notes)


def test_checkpoint_resume_continues_the_epoch_count(tmp_path):
    x, y = small_data()
    checkpoints = tmp_path / "ckpt"
    model = rewrite_model(small_model(), kernel="fp32_m3")
    with pytest.raises(KeyboardInterrupt):
        finetune(model, (x, y), val_split=0.25, epochs=3, batch_size=8, learning_rate=1e-2,
                 checkpoint_dir=checkpoints, verbose=0, callbacks=[Interrupt(after=1)])
    state = json.loads((checkpoints / "state.json").read_text())
    assert state["epoch"] == 1 and state["history"]["epoch"] == [1]
    assert (checkpoints / "last.keras").is_file() and (checkpoints / "best.keras").is_file()
    saved = gsio.load_model(checkpoints / "last.keras")
    assert saved.optimizer.iterations.numpy() == 5  # 36 training examples / batch 8
    with pytest.raises(OutputPathError, match=r"holds a checkpoint of an earlier run \(1 "
                                              r"epoch\(s\) done\); pass resume=True"):
        finetune(model, (x, y), val_split=0.25, epochs=3, checkpoint_dir=checkpoints, verbose=0)
    resumed = finetune(model, (x, y), val_split=0.25, epochs=3, batch_size=8,
                       learning_rate=1e-2, checkpoint_dir=checkpoints, resume=True, verbose=0,
                       restore_best=False)
    assert resumed.initial_epoch == 1
    assert resumed.epochs_run == [2, 3]
    assert resumed.history["epoch"] == [1, 2, 3]
    assert resumed.model.optimizer.iterations.numpy() == 15
    assert set(swapped_layers(resumed.model).values()) == {"fp32_m3"}
    assert json.loads((checkpoints / "state.json").read_text())["epoch"] == 3
    # epoch e's batches depend on (seed, e) only, so the resumed run is the uninterrupted run
    straight = finetune(model, (x, y), val_split=0.25, epochs=3, batch_size=8,
                        learning_rate=1e-2, verbose=0, restore_best=False)
    for a, b in zip(resumed.model.get_weights(), straight.model.get_weights()):
        np.testing.assert_array_equal(a, b)  # bit for bit
    assert resumed.history == straight.history
    again = finetune(model, (x, y), val_split=0.25, epochs=3, batch_size=8, learning_rate=1e-2,
                     checkpoint_dir=checkpoints, resume=True, verbose=0)
    assert again.epochs_run == [] and any("nothing to train" in note for note in again.notes)


def test_argument_and_data_errors_are_clear():
    x, y = small_data()
    model = small_model()
    with pytest.raises(GraphswapError,
                       match=r"epochs must be at least 1 \(0 only with BatchNorm re-estimation"):
        finetune(model, (x, y), epochs=0)
    with pytest.raises(GraphswapError, match="either validation data or a validation split"):
        finetune(model, (x, y), val_data=(x, y), val_split=0.1)
    for rate in (-1.0, float("nan")):  # -1 used to train (ascend the loss) silently
        with pytest.raises(GraphswapError, match="learning rate must be positive"):
            finetune(model, (x, y), learning_rate=rate)
    with pytest.raises(GraphswapError, match="resume needs a checkpoint directory"):
        finetune(model, (x, y), resume=True)
    with pytest.raises(GraphswapError, match="unknown strategy 'tpu'; allowed: none, mirrored, "
                                             "multiworker"):
        finetune(model, (x, y), strategy="tpu")
    bad = y.copy()
    bad[3] = 7
    with pytest.raises(DataError, match="labels range from 0 to 7, but the model has 3 output "
                                        "classes"):
        finetune(model, (x, bad))


def test_multiworker_needs_tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(GraphswapError, match="strategy 'multiworker' needs the TF_CONFIG "
                                             "environment variable"):
        finetune(small_model(), small_data(), strategy="multiworker")
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(GraphswapError, match="TF_CONFIG is not a valid cluster description"):
        finetune(small_model(), small_data(), strategy="multiworker")


def test_cli_finetune_writes_the_model_and_resumes(tmp_path):
    x, y = small_data()
    np.savez(tmp_path / "train.npz", x_train=x, y_train=y, x_test=x[:12], y_test=y[:12])
    swapped = rewrite_model(small_model(), kernel="exact")
    swapped.save(tmp_path / "small.swapped.keras")
    runner = CliRunner()
    args = ["finetune", str(tmp_path / "small.swapped.keras"), "--data",
            str(tmp_path / "train.npz"), "--val-data", str(tmp_path / "train.npz"),
            "--batch-size", "8", "--lr", "0.01", "--checkpoint-dir", str(tmp_path / "ck")]
    result = runner.invoke(main, args + ["--epochs", "1"])
    assert result.exit_code == 0, result.output
    output = tmp_path / "small.swapped.ft.keras"
    assert output.is_file()
    assert "training data: 48 examples" in result.output
    assert "2 swapped layer(s) in the loop, kernel(s): exact" in result.output
    assert f"wrote {output}" in result.output
    reloaded = gsio.load_model(output)
    assert set(swapped_layers(reloaded).values()) == {"exact"}
    result = runner.invoke(main, args + ["--epochs", "2", "--resume", "--force", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output[result.output.index("{"):])
    assert payload["epochs_run"] == [2] and payload["history"]["epoch"] == [1, 2]
    # the output exists now: without --force nothing is trained or written
    result = runner.invoke(main, args + ["--epochs", "3", "--resume"])
    assert result.exit_code == 1
    assert "already exists; pass --force" in result.output


def test_cli_finetune_reports_data_errors_in_one_line(tmp_path):
    small_model().save(tmp_path / "m.keras")
    np.savez(tmp_path / "bad.npz", images=np.zeros((2, 6, 6, 1)))
    result = CliRunner().invoke(main, ["finetune", str(tmp_path / "m.keras"), "--data",
                                       str(tmp_path / "bad.npz")])
    assert result.exit_code == 1
    assert result.output.startswith("Error: ")
    assert "has arrays ['images']; expected 'x_train'/'y_train' or 'x'/'y'" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "m.ft.keras").exists()


MIRRORED_SCRIPT = """
    import json
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
    import numpy as np
    import sys
    sys.path.insert(0, "tests")
    from conftest import small_data, small_model
    from graphswap.swap import rewrite_model
    from graphswap.research.training.finetuning import finetune
    x, y = small_data()
    model = rewrite_model(small_model(), kernel="fp32_m3")
    mirrored = finetune(model, (x, y), epochs=2, batch_size=8, learning_rate=1e-2,
                        strategy="mirrored", verbose=0, seed=0)
    single = finetune(model, (x, y), epochs=2, batch_size=8, learning_rate=1e-2, verbose=0,
                      seed=0)
    difference = max(float(np.max(np.abs(a - b))) for a, b in
                     zip(mirrored.model.get_weights(), single.model.get_weights()))
    moved = max(float(np.max(np.abs(a - b))) for a, b in
                zip(mirrored.model.get_weights(), model.get_weights()))
    print("RESULT", json.dumps({
        "replicas": mirrored.model.distribute_strategy.num_replicas_in_sync,
        "strategy": type(mirrored.model.distribute_strategy).__name__,
        "epochs": mirrored.epochs_run, "difference": difference, "moved": moved,
        "kernels": sorted({l.swap_kernel["spec"] for l in mirrored.model.layers
                           if hasattr(l, "swap_kernel")})}))
"""


def test_mirrored_strategy_on_two_logical_cpus_matches_single_device_training():
    completed = run_python(MIRRORED_SCRIPT, timeout=240)
    assert completed.returncode == 0, completed.stderr[-3000:]
    line = [l for l in completed.stdout.splitlines() if l.startswith("RESULT ")][-1]
    result = json.loads(line[len("RESULT "):])
    assert result["strategy"] == "MirroredStrategy" and result["replicas"] == 2
    assert result["epochs"] == [1, 2]
    assert result["kernels"] == ["fp32_m3"]
    assert result["moved"] > 1e-3            # it trained
    assert result["difference"] < 1e-5       # the same steps as on one device


WORKER_SCRIPT = """
    import json, os, sys
    import numpy as np
    from graphswap import io as gsio
    from graphswap.research.training.finetuning import finetune
    model_path, data_path, output = sys.argv[1:4]
    result = finetune(model_path, data_path, epochs=2, batch_size=8, learning_rate=1e-2,
                      strategy="multiworker", verbose=0, seed=0)
    weights = np.concatenate([w.ravel() for w in result.model.get_weights()])
    if result.chief:
        gsio.save_model(result.model, output)
    print("RESULT", json.dumps({
        "chief": result.chief, "epochs": result.epochs_run,
        "replicas": result.model.distribute_strategy.num_replicas_in_sync,
        "weights": weights.tolist()}))
"""


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def test_multiworker_strategy_with_two_local_workers(tmp_path):
    x, y = small_data()
    np.savez(tmp_path / "train.npz", x=x, y=y)
    model = rewrite_model(small_model(), kernel="fp32_m3")
    model.save(tmp_path / "m.keras")
    ports = _free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    import graphswap

    root = str(Path(graphswap.__file__).resolve().parent.parent)
    processes = []
    for index in range(2):
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": root,
               "TF_CONFIG": json.dumps({"cluster": cluster,
                                        "task": {"type": "worker", "index": index}})}
        processes.append(subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(WORKER_SCRIPT), str(tmp_path / "m.keras"),
             str(tmp_path / "train.npz"), str(tmp_path / "out.keras")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    results = []
    try:
        for process in processes:
            stdout, stderr = process.communicate(timeout=240)
            assert process.returncode == 0, stderr[-3000:]
            line = [l for l in stdout.splitlines() if l.startswith("RESULT ")][-1]
            results.append(json.loads(line[len("RESULT "):]))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    assert [r["chief"] for r in results] == [True, False]
    assert all(r["epochs"] == [1, 2] and r["replicas"] == 2 for r in results)
    np.testing.assert_array_equal(results[0]["weights"], results[1]["weights"])  # in sync
    initial = np.concatenate([w.ravel() for w in model.get_weights()])
    assert np.max(np.abs(np.array(results[0]["weights"]) - initial)) > 1e-3  # it trained
    saved = gsio.load_model(tmp_path / "out.keras")
    np.testing.assert_array_equal(
        np.concatenate([w.ravel() for w in saved.get_weights()]), results[0]["weights"])
    assert set(swapped_layers(saved).values()) == {"fp32_m3"}


def test_resume_refuses_a_checkpoint_of_another_run(tmp_path):
    """--resume used to train the checkpoint's model whatever MODEL, data and --lr said, drop the
    validation data and merge the histories; now every difference is named, all at once."""
    from graphswap.errors import CheckpointError

    x, y = small_data()
    validation = small_data(24, seed=5)
    checkpoints = tmp_path / "ckpt"
    model = rewrite_model(small_model(), kernel="fp32_m3")
    same = dict(val_data=validation, batch_size=8, learning_rate=1e-2, checkpoint_dir=checkpoints,
                verbose=0)
    finetune(model, (x, y), epochs=1, **same)
    with pytest.raises(CheckpointError) as info:
        finetune(rewrite_model(small_model(), kernel="exact"), small_data(40, seed=9), epochs=2,
                 batch_size=8, learning_rate=0.5, checkpoint_dir=checkpoints, resume=True,
                 verbose=0)
    message = str(info.value)
    assert message.startswith(f"the checkpoint in {checkpoints} belongs to another run")
    assert "the kernels differ (checkpointed: fp32_m3; now: exact)" in message
    assert "the training data differ (checkpointed: 48 examples" in message
    assert "now: 40 examples, inputs (40, 6, 6, 1) float32" in message
    assert "the validation data differ (checkpointed: 24 examples" in message
    assert message.count("now: none") == 1
    assert "learning rate: checkpointed 0.01, now 0.5" in message
    assert "start over with --force (force=True) instead of --resume" in message
    with pytest.raises(CheckpointError, match=r"another run, .*: batch size: checkpointed 8, "
                                              r"now 16\. Resume with the arguments"):
        finetune(model, (x, y), epochs=2, resume=True, **{**same, "batch_size": 16})
    with pytest.raises(CheckpointError, match="the model's starting weights differ"):
        finetune(rewrite_model(small_model(seed=3), kernel="fp32_m3"), (x, y), epochs=2,
                 resume=True, **same)
    assert json.loads((checkpoints / "state.json").read_text())["epoch"] == 1  # untouched
    resumed = finetune(model, (x, y), epochs=2, resume=True, **same)  # the same run: resumes
    assert resumed.epochs_run == [2] and resumed.history["epoch"] == [1, 2]
    assert any("resumed from" in note for note in resumed.notes)
    started_over = finetune(rewrite_model(small_model(), kernel="exact"), (x, y), epochs=1,
                            force=True, **same)
    assert started_over.epochs_run == [1]


def test_cli_resume_of_another_run_is_one_clear_error(tmp_path):
    x, y = small_data()
    np.savez(tmp_path / "train.npz", x=x, y=y)
    rewrite_model(small_model(), kernel="fp32_m3").save(tmp_path / "a.keras")
    rewrite_model(small_model(), kernel="exact").save(tmp_path / "b.keras")
    runner = CliRunner()
    common = ["--data", str(tmp_path / "train.npz"), "--batch-size", "8", "--checkpoint-dir",
              str(tmp_path / "ck")]
    result = runner.invoke(main, ["finetune", str(tmp_path / "a.keras"), *common, "--epochs", "1"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["finetune", str(tmp_path / "b.keras"), *common, "--epochs", "2",
                                  "--lr", "0.5", "--resume", "-o", str(tmp_path / "b.ft.keras")])
    assert result.exit_code == 1
    error = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(error) == 1 and "belongs to another run" in error[0]
    assert "kernels differ" in error[0] and "learning rate: checkpointed auto, now 0.5" in error[0]
    assert not (tmp_path / "b.ft.keras").exists()


KILLED_RUN_SCRIPT = """
    import json, os, signal, sys
    import keras
    import numpy as np
    import tensorflow as tf
    from graphswap.research.training.finetuning import finetune

    model_path, data_path, checkpoint_dir, mode, kind, out = sys.argv[1:7]
    with np.load(data_path) as arrays:
        x, y = arrays["x"], arrays["y"]
    data = data_path if kind == "npz" else tf.data.Dataset.from_tensor_slices((x, y))

    class KillDuringEpoch2(keras.callbacks.Callback):
        # SIGKILL: no Python clean-up, no exception handlers - as a killed job or a power cut
        epoch = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if mode == "kill" and self.epoch == 1 and batch == 2:
                os.kill(os.getpid(), signal.SIGKILL)

    result = finetune(model_path, data, val_split=0.25 if kind == "npz" else None, epochs=3,
                      batch_size=8, learning_rate=1e-2, checkpoint_dir=checkpoint_dir,
                      resume=mode == "resume", verbose=0, restore_best=False,
                      callbacks=[KillDuringEpoch2()])
    np.savez(out, *result.model.get_weights())
    print("RESULT", json.dumps({"history": result.history, "epochs_run": result.epochs_run,
                                "iterations": int(result.model.optimizer.iterations.numpy()),
                                "notes": result.notes}))
"""


@pytest.mark.parametrize("kind", ["npz", "dataset"])
def test_a_run_killed_mid_epoch_resumes_to_the_uninterrupted_run_bit_for_bit(tmp_path, kind):
    """A real process is SIGKILLed during epoch 2 and resumed in a fresh process: weights and
    history equal an uninterrupted run exactly.  The model has Dropout (a Keras SeedGenerator whose
    state a .keras file does not hold) and an approximate multiplier; the data are arrays (shuffled
    by seeded permutations) or a tf.data dataset (shuffled by tf.data, seeded per epoch)."""
    keras.utils.set_random_seed(4)
    model = keras.Sequential([
        keras.Input((6, 6, 1)), keras.layers.Conv2D(4, 3, activation="relu", name="conv"),
        keras.layers.Flatten(), keras.layers.Dropout(0.5, name="drop"),
        keras.layers.Dense(3, activation="softmax", name="out")])
    model.compile(loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    rewrite_model(model, kernel="mul8s_drum4").save(tmp_path / "m.keras")
    x, y = small_data(64)
    np.savez(tmp_path / "data.npz", x=x, y=y)

    def run(mode, checkpoints, out):
        completed = run_python(KILLED_RUN_SCRIPT.replace("sys.argv[1:7]", repr(
            [str(tmp_path / "m.keras"), str(tmp_path / "data.npz"), str(checkpoints), mode, kind,
             str(out)])), timeout=300)
        return completed

    straight = run("straight", tmp_path / "ck_straight", tmp_path / "straight.npz")
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = run("kill", tmp_path / "ck", tmp_path / "unused.npz")
    assert killed.returncode == -9, killed.stderr[-3000:]  # killed by SIGKILL in epoch 2
    state = json.loads((tmp_path / "ck" / "state.json").read_text())
    assert state["epoch"] == 1 and state["rng"]["seed_generators"]  # the Dropout's state is kept
    import shutil

    from graphswap.research.training.checkpoint_state import seal

    # the copy keeps the checkpoint's own links (state.json -> current/state.json, current ->
    # epoch-N), as graphswap wrote them; the state is re-sealed as the writing version sealed it
    shutil.copytree(tmp_path / "ck", tmp_path / "ck_without_rng", symlinks=True)
    del state["rng"]  # as a checkpoint written before graphswap kept the random-number state
    state = seal({k: v for k, v in state.items() if k != "state_sha256"})
    epoch_state = (tmp_path / "ck_without_rng" / "current").resolve() / "state.json"
    epoch_state.write_text(json.dumps(state))
    resumed = run("resume", tmp_path / "ck", tmp_path / "resumed.npz")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = json.loads(straight.stdout.split("RESULT ")[-1])
    b = json.loads(resumed.stdout.split("RESULT ")[-1])
    assert b["epochs_run"] == [2, 3] and a["epochs_run"] == [1, 2, 3]
    assert b["history"] == a["history"]  # every loss and metric of every epoch, exactly
    assert b["iterations"] == a["iterations"]
    with np.load(tmp_path / "straight.npz") as w1, np.load(tmp_path / "resumed.npz") as w2:
        assert len(w1.files) == len(w2.files) > 0
        for name in w1.files:
            np.testing.assert_array_equal(w1[name], w2[name])
    # the random-number state is what makes it so: without it, epochs 2 and 3 differ
    without = run("resume", tmp_path / "ck_without_rng", tmp_path / "without.npz")
    assert without.returncode == 0, without.stderr[-3000:]
    c = json.loads(without.stdout.split("RESULT ")[-1])
    assert c["history"]["loss"][0] == a["history"]["loss"][0]
    assert c["history"]["loss"][1:] != a["history"]["loss"][1:]
    assert any("carries no random-number state" in note for note in c["notes"])


def test_resumed_dropout_state_does_not_depend_on_what_else_the_process_made(tmp_path):
    """Seed generators are matched by their place in the model: their names depend on how many
    were created before in the process ("seed_generator_7"), which must not matter."""
    keras.utils.set_random_seed(2)
    model = rewrite_model(keras.Sequential([
        keras.Input((6, 6, 1)), keras.layers.Flatten(), keras.layers.Dropout(0.3),
        keras.layers.Dense(3, activation="softmax")]), kernel="exact")
    x, y = small_data()
    settings = dict(epochs=2, batch_size=8, learning_rate=1e-2, verbose=0, restore_best=False)
    with pytest.raises(KeyboardInterrupt):
        finetune(model, (x, y), checkpoint_dir=tmp_path / "ck", callbacks=[Interrupt(after=1)],
                 **settings)
    unrelated = [keras.layers.Dropout(0.5) for _ in range(3)]  # more seed generators, other names
    assert unrelated
    resumed = finetune(model, (x, y), checkpoint_dir=tmp_path / "ck", resume=True, **settings)
    straight = finetune(model, (x, y), **settings)
    assert resumed.history == straight.history
    for a, b in zip(resumed.model.get_weights(), straight.model.get_weights()):
        np.testing.assert_array_equal(a, b)


def _adam_rate(result):
    """The learning rate the run's optimizer started from (its compile note, also checked
    against the optimizer's schedule)."""
    note = next(n for n in result.notes if n.startswith("optimizer Adam, learning rate "))
    rate = float(note.split("learning rate ")[1].split(",")[0])
    schedule = result.model.optimizer.get_config()["learning_rate"]
    if isinstance(schedule, dict):   # the cosine decay's config
        assert schedule["config"]["initial_learning_rate"] == pytest.approx(rate)
    return rate


def test_auto_learning_rate_reads_the_starts_training_loss():
    """learning_rate="auto" (the default): the shipped LeNet-5 fits its training data (loss about
    2e-4), so it gets the small rate; an untrained model (loss about ln 3) the large one; the
    measured loss is the mean over the training examples, computed independently here."""
    from graphswap.research.training import recovery

    fitted = gsio.load_model(SAMPLE_MODEL)
    train = load_data(SAMPLE_DATA, fitted, split="train")
    loss, count = recovery.start_training_loss(fitted, train, "sparse_categorical_crossentropy")
    with np.load(SAMPLE_DATA) as data:
        x, y = data["x_train"].astype(np.float32), data["y_train"]
    probabilities = np.asarray(fitted(x, training=False), dtype=np.float64)
    want = float(np.mean(-np.log(probabilities[np.arange(len(y)), y])))
    assert count == len(y)
    assert abs(loss - want) <= 1e-3 * want + 1e-7
    assert loss <= recovery.FITTED_LOSS
    result = finetune(fitted, SAMPLE_DATA, epochs=1, seed=0, verbose=0)
    assert _adam_rate(result) == pytest.approx(recovery.FITTED_LEARNING_RATE)
    assert any(n.startswith("learning rate auto: 0.0001 (training loss") and
               "the model still fits its training data" in n for n in result.notes)

    x_small, y_small = small_data()
    untrained = small_model(seed=3)
    result = finetune(untrained, (x_small, y_small), epochs=1, batch_size=8, seed=0, verbose=0)
    assert _adam_rate(result) == pytest.approx(recovery.UNFITTED_LEARNING_RATE)
    assert any("> 0.03: the products cost the model its fit" in n for n in result.notes)


def test_auto_learning_rate_outside_cross_entropy_and_fixed_rates():
    from graphswap.research.training import recovery

    x, y = small_data()
    model = small_model(compiled=False)
    model.compile(loss="mean_squared_error")   # a loss whose scale the threshold is not for
    result = finetune(model, (x, np.eye(3)[y]), epochs=1, batch_size=8, seed=0, verbose=0)
    assert _adam_rate(result) == pytest.approx(recovery.UNFITTED_LEARNING_RATE)
    assert any("is not a cross-entropy" in n for n in result.notes)
    fixed = finetune(small_model(), (x, y), epochs=1, batch_size=8, learning_rate="0.02",
                     seed=0, verbose=0)
    assert _adam_rate(fixed) == pytest.approx(0.02)
    assert not any(n.startswith("learning rate auto") for n in fixed.notes)
    with pytest.raises(GraphswapError, match="learning rate must be a number or 'auto', got 'fast'"):
        finetune(small_model(), (x, y), learning_rate="fast")
