"""Fine-tuning rewritten models: the swapped kernels stay in the forward pass while TensorFlow's
gradients train the float weights (the straight-through estimator), so the network learns to live
with its arithmetic.

`finetune` compiles with the loss of the model's task (graphswap.research.data.task: the loss saved
with the model, --loss, or a stated default for its output) - or, with a teacher, the distillation
loss (graphswap.research.training.distillation) -, trains on validated data
(graphswap.research.data.data), keeps the best weights by a validation metric, stops early on
request, checkpoints every epoch and resumes from its own checkpoint, and runs under tf.distribute
strategies:

  - "mirrored":    MirroredStrategy over the local GPUs, or over the logical CPU devices when there
                   are several and no GPU;
  - "multiworker": MultiWorkerMirroredStrategy configured by the TF_CONFIG environment variable
                   (every worker runs the same command; worker 0 is the chief and writes files).

Checkpoints: graphswap.research.training.checkpoints; strategies:
graphswap.research.training.strategies.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import keras
import tensorflow as tf

from graphswap.errors import DataError, GraphswapError, OutputPathError
from graphswap.io import check_model_output_path, load_model, save_model
from graphswap.research.data.data import translate_errors
from graphswap.research.training.distillation import (check_teacher_weight, distillation_sets,
                                                      target_entropy)
from graphswap.research.data.loading import load_data
from graphswap.research.data.scoring import predict
from graphswap.research.data.task import derive_task, output_activation
from graphswap.research.training.recovery import (AUTO_LEARNING_RATE, DEFAULT_BATCH_SIZE,
                                                  DEFAULT_LEARNING_RATE, original_float_model,
                                                  DEFAULT_SCHEDULE, auto_learning_rate, loss_name,
                                                  make_optimizer, recalibrate_batchnorm)
from graphswap.research.training.finetune_checks import (DivergenceGuard, check_finite_weights,
                                                         check_learning_rate, check_run_paths,
                                                         check_start_weights)
from graphswap.research.training.checkpoints import (CheckpointTracker, clear_checkpoint,
                                                     latest_checkpoint, lock_checkpoint_directory,
                                                     releases_checkpoint_locks)
from graphswap.research.training.fingerprints import (check_same_run, iter_swapped_layers,
                                                      restore_rng_state, run_fingerprint,
                                                      settings_fingerprint)
from graphswap.research.training.strategies import (is_chief, patch_multiworker_build,
                                                    resolve_strategy)
from graphswap.swap import copy_model
from graphswap.swap.recipe import has_batchnorm
from graphswap.tables import format_table


@dataclasses.dataclass
class CompileSettings:
    loss: object
    metrics: list
    note: str

    @property
    def loss_name(self) -> str:
        return loss_name(self.loss)


def compile_settings(model, label_format: str = "sparse", task=None) -> CompileSettings:
    """Loss and metrics for `model` from its task (graphswap.research.data.task.derive_task: the
    loss saved with the model, else the one its output implies).  `label_format` is kept for older
    callers: the task converts labels to what its loss takes, so it no longer decides."""
    task = task if task is not None else derive_task(model)
    if len(task.outputs) == 1 and task.source == "the model's output" and \
            label_format == "one_hot" and task.single.kind == "multiclass":
        task = dataclasses.replace(task, outputs=(dataclasses.replace(
            task.single, loss=keras.losses.CategoricalCrossentropy(
                from_logits=task.single.from_logits), target="one_hot"),))
    loss, metrics = task.keras_loss(), task.keras_metrics()
    if task.source == "the model's output":
        output = task.single
        note = (f"the model carries no loss; using {type(output.loss).__name__}(from_logits="
                f"{output.from_logits}) and {'accuracy' if task.is_classifier else 'mae'} "
                f"(output activation: {output_activation(model) or 'none'}; {task.kind})")
    else:
        shown = ", ".join([task.loss_name()] + [m if isinstance(m, str) else
                                                getattr(m, "name", str(m))
                                                for m in (metrics if isinstance(metrics, list)
                                                          and metrics
                                                          and not isinstance(metrics[0], list)
                                                          else [])])
        where = ("the loss/metrics saved in the model" if task.source.startswith("the loss")
                 else "the loss given by --loss")
        note = f"compiled with {where}: {shown}"
    return CompileSettings(loss, metrics, note)


@dataclasses.dataclass
class FinetuneResult:
    """What `finetune` did. `model` holds the returned (best, when validated) weights."""

    model: object
    history: dict
    initial_epoch: int
    epochs: int
    epochs_run: list
    monitor: str | None
    best_epoch: int | None
    best_value: float | None
    restored_best: bool
    stopped_early: bool
    notes: list
    checkpoint_dir: str | None = None
    chief: bool = True              # False on non-chief workers of a multi-worker run
    output: str | None = None       # where the fine-tuned model was saved, if anywhere
    # the returned model's own metrics (best weights restored, BatchNorm re-estimated: what is
    # saved), scored as `evaluate` scores, on `final_data` ("validation data" / "training data")
    final: dict | None = None
    final_data: str | None = None

    def to_dict(self) -> dict:
        return {"initial_epoch": self.initial_epoch, "epochs": self.epochs,
                "epochs_run": self.epochs_run, "monitor": self.monitor,
                "best_epoch": self.best_epoch, "best_value": self.best_value,
                "restored_best": self.restored_best, "stopped_early": self.stopped_early,
                "history": self.history, "notes": self.notes,
                "checkpoint_dir": self.checkpoint_dir, "output": self.output,
                "final": self.final, "final_data": self.final_data}


def swapped_layers(model) -> dict:
    """{layer path: kernel spec} of the swapped layers in `model`, those held inside custom
    layers and wrappers (a transformer block, Bidirectional) included."""
    return {path: layer.arithmetic.spec for path, layer in iter_swapped_layers(model)}


SCORING_BATCH_SIZE = 128   # `graphswap evaluate`'s default --batch-size


class _Notes(list):
    """A list of notes that also hands each new note to `log` (the CLI prints them at once)."""

    def __init__(self, log=None):
        super().__init__()
        self._log = log

    def append(self, note):
        super().append(note)
        if self._log is not None:
            self._log(note)

    def extend(self, notes):
        for note in notes:
            self.append(note)


@releases_checkpoint_locks   # the lock on checkpoint_dir is held while finetune runs
def finetune(model, data, *, val_data=None, val_split: float | None = None, epochs: int = 1,
             batch_size: int = DEFAULT_BATCH_SIZE,
             learning_rate: float | str | None = DEFAULT_LEARNING_RATE,
             optimizer="adam", schedule: str = DEFAULT_SCHEDULE, recalibrate_bn=None,
             strategy=None, checkpoint_dir=None, resume: bool = False,
             patience: int | None = None, monitor: str | None = None,
             restore_best: bool = True, seed: int | None = 0, verbose="auto", callbacks=(),
             split: str | None = "train", val_split_name: str | None = "test",
             resize: bool = False, pad: bool = False, scale=None, custom_objects=None,
             safe_mode: bool = True, force: bool = False, output=None,
             log=None, loss=None, metrics=None, teacher=None, teacher_weight: float = 1.0,
             task=None) -> FinetuneResult:
    """Fine-tune `model` (a keras.Model or a .keras path) on `data`, swapped kernels in the loop.

    Args:
      model: a (rewritten) keras.Model - never modified, a copy is trained - or a model file.
      data / val_data: anything graphswap.research.load_data accepts (.npz, image directory,
        tf.data, (x, y) arrays); `split`/`val_split_name` pick the .npz arrays (x_train/y_train
        and x_test/y_test by default, x/y when those are absent).
      val_split: hold out this fraction of `data` (seeded) for validation instead of val_data.
      epochs: total epoch count (a resumed run continues up to it).
      learning_rate / optimizer / schedule: a fresh optimizer for an un-resumed run - the default
        recipe is Adam decayed by a cosine to 0 over the run (schedule "cosine"; or "constant"),
        learning rate "auto": 1e-4 when the start's training loss shows it still fits its
        training data, else 1e-3 (graphswap.research.auto_learning_rate; a number 0..10 fixes it);
        see graphswap.research.training.recovery and docs/RECOVERY.md.
      recalibrate_bn: re-estimate the BatchNormalization statistics with the approximate forward
        (no gradient steps) before and after training; None (default): after training, for
        models that have BatchNormalization.  With epochs=0 only the re-estimation runs.
      strategy: None, "mirrored", "multiworker" or a tf.distribute.Strategy.
      checkpoint_dir: write last/best checkpoints and state each epoch; `resume=True` continues
        from them (weights, optimizer state, epoch count, best value); inputs and output lie
        outside it (graphswap.research.training.finetune_checks).
      patience: stop when the monitor has not improved for this many epochs.
      monitor: metric deciding the best epoch [default: val accuracy, else val_loss, else the
        training accuracy/loss]; restore_best returns the best epoch's weights.
      seed: seeds Python, NumPy, TensorFlow and the shuffling (None: no seeding).
      output: save the fine-tuned model there (.keras, .h5, or a path without a suffix / ending
        in '/': a graphswap SavedModel directory that serves the fine-tuned weights and reopens
        in graphswap; atomically; checked before any training; `force` replaces an existing
        output).  Only the chief of a multi-worker run saves.
      log: called with each note (what was loaded, how it is compiled, ...) as it is made;
        the notes are also returned in the result.
      loss / metrics: override the task the saved loss implies (graphswap.research.data.task:
        a loss name such as "mse" or "binary_crossentropy", graphswap metric names).
      teacher: fine-tune by distillation instead of on labels: "original" (the float model
        this swapped model was made from, its swapped layers lowered to exact arithmetic), a
        model file or a keras.Model.  The model learns to reproduce the teacher's outputs on
        the data's inputs (labels are not read; an .npz with only `x` will do): cross-entropy
        against the teacher's probabilities for classifiers, MSE for regression outputs.
      teacher_weight: with a teacher, the weight of its outputs in the targets: 1 (default) the
        teacher alone; below 1 mixed with the labels (read then), w * teacher + (1 - w) *
        labels - the same gradients as w * distillation loss + (1 - w) * label loss.
      task: a graphswap.research.data.task.Task (derive_task) to use instead of deriving one from
        the model and loss/metrics (evaluate passes the one it evaluates with).

    Returns a FinetuneResult; raises DataError for data problems, GraphswapError otherwise.
    """
    if epochs < 0 or (epochs == 0 and not recalibrate_bn):
        raise GraphswapError(f"epochs must be at least 1 (0 only with BatchNorm re-estimation, "
                             f"recalibrate_bn=True / --recalibrate-bn), got {epochs}")
    if batch_size < 1:
        raise GraphswapError(f"batch size must be at least 1, got {batch_size}")
    learning_rate = check_learning_rate(learning_rate)
    teacher_weight = check_teacher_weight(teacher_weight, teacher)
    if val_data is not None and val_split is not None:
        raise GraphswapError("pass either validation data or a validation split, not both")
    if patience is not None and patience < 1:
        raise GraphswapError(f"patience must be at least 1 epoch, got {patience}")
    # inputs and output apart from the checkpoint directory, before anything is read or cleared
    check_run_paths(checkpoint_dir, output, model=model, teacher=teacher, data=data,
                    val_data=val_data)
    if output is not None:
        output = check_model_output_path(output, force, inputs=[model] if isinstance(
            model, (str, os.PathLike)) else [])
    notes = _Notes(log)
    strategy_obj = resolve_strategy(strategy)  # first: multi-worker must precede other TF work
    chief = is_chief(strategy_obj)
    if seed is not None:
        keras.utils.set_random_seed(seed)

    directory = Path(checkpoint_dir) if checkpoint_dir is not None else None
    state = checkpoint = None
    if directory is not None:
        if directory.exists() and not directory.is_dir():
            raise OutputPathError(f"checkpoint directory {directory} is a file")
        if chief:   # only the chief writes checkpoints; a second run on the directory is refused
            lock_checkpoint_directory(directory)
        checkpoint = latest_checkpoint(directory) if directory.exists() else None
        state = checkpoint.state if checkpoint is not None else None
        if state is not None and not resume:
            if not force:
                raise OutputPathError(
                    f"{directory} holds a checkpoint of an earlier run ({state['epoch']} "
                    f"epoch(s) done); pass resume=True (--resume) to continue it, force=True "
                    f"(--force) to start over, or choose another directory")
            if chief:
                clear_checkpoint(directory)
            state = checkpoint = None
        if resume and state is None:
            notes.append(f"no checkpoint in {directory}; starting from epoch 1")
    elif resume:
        raise GraphswapError("resume needs a checkpoint directory (checkpoint_dir= / "
                             "--checkpoint-dir)")

    with strategy_obj.scope():
        if isinstance(model, (str, os.PathLike)):
            user_model = load_model(model, custom_objects=custom_objects, safe_mode=safe_mode)
        else:
            user_model = model
        if state is not None:
            source_model = load_model(checkpoint.last,
                                              custom_objects=custom_objects, safe_mode=safe_mode)
            checkpoint.verify()   # after the load: a tampered kernel is the trust gate's to name
        else:
            source_model = user_model
        expectation_model = source_model
        if task is None:
            task = derive_task(user_model, loss, metrics)
        labels = "unused" if teacher is not None and teacher_weight == 1 else "required"
        train = load_data(data, expectation_model, split=split, resize=resize,
                                      pad=pad, scale=scale, name="training data", task=task,
                                      labels=labels)
        validation = None
        if val_data is not None:
            validation = load_data(val_data, expectation_model, split=val_split_name,
                                               resize=resize, pad=pad, scale=scale,
                                               name="validation data", task=task, labels=labels)
        elif val_split is not None:
            train, validation = train.split(val_split, seed=seed or 0)
        labelled = (validation if validation is not None else train) \
            if teacher is None or teacher_weight < 1 else None   # what the result is scored on
        if teacher is not None:
            train, validation, note = distillation_sets(
                teacher, teacher_weight, user_model, train, validation, task, batch_size,
                custom_objects, safe_mode)
            notes.append(note)
        notes.append(task.note)
        notes.extend(train.notes)
        if validation is not None:
            notes.extend(n for n in validation.notes if n not in train.notes)
        if state is not None:
            trained = source_model
            if not getattr(trained, "compiled", False):
                raise GraphswapError(f"checkpoint {checkpoint.last} has no compile "
                                     f"settings; delete {directory} to start over")
        else:
            if teacher is not None:
                settings = CompileSettings(task.distillation_loss(), task.distillation_metrics(),
                                           "")
            else:
                settings = compile_settings(source_model, task=task)
                notes.append(settings.note)
            trained = copy_model(source_model)
            rate = learning_rate   # the run's fingerprint keeps what was asked ("auto")
            allowed = check_start_weights(trained)  # NaN/inf trainable weights: refused
            if rate == AUTO_LEARNING_RATE:
                offset = target_entropy(task, train) if teacher is not None else 0.0
                # labels: the start's loss is judged against the original float model's
                reference = original_float_model(trained, train) if teacher is None else None
                rate, note = auto_learning_rate(trained, train, settings.loss, batch_size,
                                                offset=offset, reference=reference)
                notes.append(note)
            steps = -(-len(train) // batch_size) * epochs if len(train) else None
            trained.compile(optimizer=make_optimizer(optimizer, rate, schedule, steps),
                            loss=settings.loss, metrics=settings.metrics)
            if rate is not None:
                decay = (f", cosine decay to 0 over {steps} steps"
                         if schedule == "cosine" and steps else "")
                notes.append(f"optimizer {type(trained.optimizer).__name__}, learning rate "
                             f"{rate:g}{decay}")
    if state is not None:
        allowed, rate = check_start_weights(trained), learning_rate
    swapped = swapped_layers(trained)
    if swapped:
        kernels = sorted(set(swapped.values()))
        notes.append(f"{len(swapped)} swapped layer(s) in the loop, kernel(s): "
                     f"{', '.join(os.path.basename(k) for k in kernels)}")
    else:
        notes.append("the model has no swapped layers: fine-tuning plain TensorFlow arithmetic")
    if strategy_obj is not tf.distribute.get_strategy():
        notes.append(f"strategy {type(strategy_obj).__name__} with "
                     f"{strategy_obj.num_replicas_in_sync} replica(s) in sync")

    initial_epoch = int(state["epoch"]) if state else 0
    run_config = {"epochs": epochs, "batch_size": batch_size, "learning_rate": learning_rate,
                  "schedule": schedule, "seed": seed}
    fingerprint = run_fingerprint(user_model, train, validation, settings_fingerprint(
        epochs=epochs, batch_size=batch_size, learning_rate=learning_rate, optimizer=optimizer,
        seed=seed, val_split=val_split, schedule=schedule))
    if state is not None:
        notes.extend(check_same_run(state.get("fingerprint"), fingerprint, directory))
        notes.append(f"resumed from {checkpoint.last} after epoch {state['epoch']} "
                     f"of {epochs}")
    tracker = CheckpointTracker(monitor, patience, directory, chief, state, run_config,
                                fingerprint, checkpoint.best if checkpoint is not None else None)
    if state is not None and restore_best and checkpoint.best is not None:
        best_model = load_model(checkpoint.best, compile=False,
                                        custom_objects=custom_objects, safe_mode=safe_mode)
        tracker.best_weights = best_model.get_weights()
        tracker.mode = state.get("mode") or ("max" if "acc" in (tracker.monitor or "") else "min")
    if verbose == "auto":
        verbose = 1
    with_bn = has_batchnorm(trained)
    if recalibrate_bn and not with_bn:
        notes.append("--recalibrate-bn: the model has no BatchNormalization layer; nothing to "
                     "re-estimate")
    if recalibrate_bn and with_bn and initial_epoch == 0:
        notes.extend(recalibrate_batchnorm(trained, train).lines())
    if epochs == 0:
        pass
    elif initial_epoch >= epochs:
        notes.append(f"the checkpoint already has {initial_epoch} epoch(s); nothing to train "
                     f"for epochs={epochs}")
    else:
        if isinstance(strategy_obj, tf.distribute.MultiWorkerMirroredStrategy):
            patch_multiworker_build(trained)
        train_ds, steps = train.training_dataset(batch_size, seed, initial_epoch, epochs)
        val_ds = validation.as_dataset(batch_size, feed=True) if validation is not None else None
        if state is not None:  # last, so that nothing draws from it before training does
            notes.extend(restore_rng_state(trained, state.get("rng")))
        with translate_errors(train, validation):
            trained.fit(train_ds, validation_data=val_ds, epochs=epochs,
                        initial_epoch=initial_epoch, steps_per_epoch=steps,
                        callbacks=[DivergenceGuard(allowed, rate, directory), tracker,
                                   *callbacks], shuffle=False, verbose=verbose)
        if not tracker.epochs_run:
            raise DataError("training ran no epoch: the training data produced no batches")
    restored = False
    if restore_best and tracker.best_weights is not None and tracker.best_epoch is not None \
            and tracker.history.get("epoch") and tracker.best_epoch != tracker.history["epoch"][-1]:
        trained.set_weights(tracker.best_weights)
        restored = True
        notes.append(f"restored the weights of epoch {tracker.best_epoch} "
                     f"({tracker.monitor} = {tracker.best:.4f})")
    if tracker.stopped_early:
        notes.append(f"stopped early: {tracker.monitor} did not improve for {patience} epoch(s)")
    if epochs > 0 and with_bn and recalibrate_bn is not False and tracker.epochs_run:
        notes.extend(f"after training: {line}"
                     for line in recalibrate_batchnorm(trained, train).lines())
    if teacher is not None and getattr(trained, "compiled", False):
        # the saved model carries its task's loss, not the distillation loss it trained with
        trained.compile(optimizer=trained.optimizer, loss=task.keras_loss(),
                        metrics=task.keras_metrics())
    final, final_data = None, None
    if epochs > 0 and tracker.epochs_run:
        scored = validation if validation is not None else train
        final_data = "validation data" if validation is not None else "training data"
        # in evaluate's batches: a multiplier with dynamic ranges depends on the batch
        outputs = predict(trained, scored, SCORING_BATCH_SIZE)
        # pure distillation's targets are the teacher's outputs: scored as agreement with it
        final = task.evaluate(outputs, labelled.labels(), None) if labelled is not None else \
            task.evaluate(outputs, None, scored.labels())
        final_data += "" if labelled is not None else ", against the teacher's outputs"
    check_finite_weights(trained, allowed, rate)   # NaN/inf weights are never saved
    if output is not None and chief:
        save_model(trained, output, force=force)
    return FinetuneResult(
        model=trained, history=tracker.history, initial_epoch=initial_epoch, epochs=epochs,
        epochs_run=tracker.epochs_run, monitor=tracker.monitor, best_epoch=tracker.best_epoch,
        best_value=tracker.best, restored_best=restored, stopped_early=tracker.stopped_early,
        notes=list(notes), checkpoint_dir=str(directory) if directory is not None else None,
        chief=chief, output=str(output) if output is not None and chief else None,
        final=final, final_data=final_data)


def format_history(result: FinetuneResult) -> str:
    """A small table of the epochs recorded in `result.history`."""
    history = result.history
    epochs = history.get("epoch", [])
    keys = [k for k in history if k != "epoch"]
    if not epochs:
        return "(no epochs)"
    headers = ["epoch", *keys]
    rows = [[str(e), *(f"{history[k][i]:.4f}" if i < len(history[k]) else "" for k in keys)]
            for i, e in enumerate(epochs)]
    markers = ["  *" if result.best_epoch is not None and row[0] == str(result.best_epoch) else ""
               for row in rows]
    return "\n".join(format_table(headers, rows, markers))


def format_final(result: FinetuneResult) -> str | None:
    """The line naming the returned (saved) model's own metrics, or None without them."""
    if not result.final:
        return None
    shown = ", ".join(f"{key} {value:.2%}" if key.endswith("accuracy") else f"{key} {value:.4f}"
                      for key, value in result.final.items() if value is not None)
    return (f"the saved model (best weights, BatchNorm statistics as saved), scored as "
            f"evaluate scores it on the {result.final_data}: {shown}")
