"""Fine-tuning rewritten models: the swapped kernels stay in the forward pass while TensorFlow's
gradients train the float weights (the straight-through estimator), so the network learns to live
with its arithmetic.

`finetune` compiles with the loss/metrics the model was saved with (or a stated default for a
classifier's output), trains on validated data (graphswap.data), keeps the best weights by a
validation metric, stops early on request, checkpoints every epoch and resumes from its own
checkpoint, and runs under tf.distribute strategies:

  - "mirrored":    MirroredStrategy over the local GPUs, or over the logical CPU devices when there
                   are several and no GPU;
  - "multiworker": MultiWorkerMirroredStrategy configured by the TF_CONFIG environment variable
                   (every worker runs the same command; worker 0 is the chief and writes files).

A checkpoint directory holds `last.keras` (weights and optimizer state after the latest epoch),
`best.keras` (best weights so far) and `state.json` (epochs done, monitor, best value, history).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

from graphswap.errors import DataError, GraphswapError, OutputPathError
from graphswap.tables import format_table

STRATEGIES = ("none", "mirrored", "multiworker")

CHECKPOINT_STATE = "state.json"
CHECKPOINT_LAST = "last.keras"
CHECKPOINT_BEST = "best.keras"


# --------------------------------------------------------------------------------------------
# strategies
# --------------------------------------------------------------------------------------------

def resolve_strategy(strategy):
    """A tf.distribute.Strategy from None/"none"/"mirrored"/"multiworker" or a Strategy."""
    import tensorflow as tf

    if strategy is None or strategy == "none":
        return tf.distribute.get_strategy()
    if isinstance(strategy, tf.distribute.Strategy):
        return strategy
    if strategy == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        if gpus:
            return tf.distribute.MirroredStrategy()
        cpus = [device.name for device in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices=cpus)
    if strategy == "multiworker":
        raw = os.environ.get("TF_CONFIG")
        if not raw:
            raise GraphswapError(
                "strategy 'multiworker' needs the TF_CONFIG environment variable on every worker, "
                'e.g. TF_CONFIG=\'{"cluster": {"worker": ["host1:12345", "host2:12345"]}, '
                '"task": {"type": "worker", "index": 0}}\' (index 1 on the second machine); '
                "see docs/WALKTHROUGH.md")
        try:
            config = json.loads(raw)
            workers = config["cluster"]["worker"]
            index = int(config["task"]["index"])
        except (ValueError, KeyError, TypeError) as exc:
            raise GraphswapError(
                f"TF_CONFIG is not a valid cluster description ({type(exc).__name__}: {exc}); "
                f'expected {{"cluster": {{"worker": ["host:port", ...]}}, "task": {{"type": '
                f'"worker", "index": N}}}}') from None
        if not 0 <= index < len(workers):
            raise GraphswapError(f"TF_CONFIG task index {index} is outside the {len(workers)} "
                                 f"workers listed in cluster.worker")
        return tf.distribute.MultiWorkerMirroredStrategy()
    raise GraphswapError(f"unknown strategy {strategy!r}; allowed: {', '.join(STRATEGIES)} or a "
                         f"tf.distribute.Strategy")


def is_chief(strategy) -> bool:
    """True unless this process is a non-chief worker of a multi-worker strategy."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "cluster_spec", None):
        return True
    spec = resolver.cluster_spec().as_dict()
    if not spec:
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type == "chief":
        return True
    return "chief" not in spec and task_type == "worker" and task_id == 0


# --------------------------------------------------------------------------------------------
# compile settings
# --------------------------------------------------------------------------------------------

def _output_activation(model) -> str | None:
    """Name of the activation the model applies last ('softmax', 'sigmoid', ...), if visible."""
    import keras

    try:
        layer = model.outputs[0]._keras_history.operation
    except (AttributeError, IndexError):
        layer = model.layers[-1] if model.layers else None
    while isinstance(layer, keras.Model) and layer.layers:
        layer = layer.layers[-1]
    if isinstance(layer, keras.layers.Softmax):
        return "softmax"
    if isinstance(layer, keras.layers.Activation):
        return getattr(layer.activation, "__name__", None)
    activation = getattr(layer, "activation", None)
    return getattr(activation, "__name__", None)


@dataclasses.dataclass
class CompileSettings:
    loss: object
    metrics: list
    note: str

    @property
    def loss_name(self) -> str:
        if isinstance(self.loss, str):
            return self.loss
        return getattr(self.loss, "name", None) or type(self.loss).__name__


def compile_settings(model, label_format: str = "sparse") -> CompileSettings:
    """Loss and metrics for `model`: its saved compile settings, else a classifier default."""
    import keras

    config = None
    if getattr(model, "compiled", False):
        try:
            config = model.get_compile_config()
        except Exception:  # noqa: BLE001 - a model without a compile config gets the default
            config = None
    if config and config.get("loss") is not None:
        loss = config["loss"]
        if isinstance(loss, dict):
            loss = keras.saving.deserialize_keras_object(loss)
        if isinstance(loss, (list, tuple, dict)):
            raise GraphswapError("the model was compiled with several losses; graphswap fine-tunes "
                                 "single-output classifiers")
        metrics = [keras.saving.deserialize_keras_object(m) if isinstance(m, dict) else m
                   for m in (config.get("metrics") or [])]
        settings = CompileSettings(loss, metrics, "")
        name = settings.loss_name.lower()
        if label_format == "one_hot" and "sparse" in name:
            raise DataError(f"the labels are one-hot rows but the model's loss "
                            f"({settings.loss_name}) expects class indices; pass "
                            f"y.argmax(axis=1) as labels")
        if label_format == "sparse" and "categorical" in name and "sparse" not in name:
            raise DataError(f"the labels are class indices but the model's loss "
                            f"({settings.loss_name}) expects one-hot rows; pass one-hot labels")
        shown = ", ".join([settings.loss_name] + [m if isinstance(m, str) else
                                                  getattr(m, "name", str(m)) for m in metrics])
        settings.note = f"compiled with the loss/metrics saved in the model: {shown}"
        return settings
    activation = _output_activation(model)
    if label_format == "binary":
        from_logits = activation != "sigmoid"
        loss = keras.losses.BinaryCrossentropy(from_logits=from_logits)
        metrics = [keras.metrics.BinaryAccuracy(name="accuracy",
                                                threshold=0.0 if from_logits else 0.5)]
    else:
        from_logits = activation != "softmax"
        if label_format == "one_hot":
            loss = keras.losses.CategoricalCrossentropy(from_logits=from_logits)
        else:
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits)
        metrics = ["accuracy"]
    note = (f"the model carries no loss; using {type(loss).__name__}(from_logits={from_logits}) "
            f"and accuracy (output activation: {activation or 'none'})")
    return CompileSettings(loss, metrics, note)


# --------------------------------------------------------------------------------------------
# checkpoints
# --------------------------------------------------------------------------------------------

def _write_json_atomic(path: Path, payload: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=2), encoding="utf-8")
    os.replace(tmp, path)


def _save_model_atomic(model, path: Path) -> None:
    tmp = path.with_name(f".{path.stem}.tmp.keras")
    model.save(tmp)
    os.replace(tmp, path)


def read_checkpoint_state(directory) -> dict | None:
    path = Path(directory) / CHECKPOINT_STATE
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        int(state["epoch"])
    except (ValueError, KeyError, TypeError) as exc:
        raise GraphswapError(f"checkpoint state {path} is unreadable ({exc}); delete the "
                             f"directory to start over") from None
    return state


def _is_better(value, best, mode) -> bool:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    if best is None:
        return True
    return value > best if mode == "max" else value < best


class _Tracker:
    """Keras callback (built lazily, keras import) that tracks the monitor, keeps the best
    weights, stops early, and writes checkpoints."""

    def __new__(cls, *args, **kwargs):
        import keras

        class Tracker(keras.callbacks.Callback):
            def __init__(self, monitor, patience, directory, chief, state, run_config):
                super().__init__()
                self.requested_monitor = monitor
                self.monitor = monitor
                self.mode = None
                self.patience = patience
                self.directory = Path(directory) if directory else None
                self.chief = chief
                self.history = {k: list(v) for k, v in (state or {}).get("history", {}).items()}
                self.best = (state or {}).get("best_value")
                self.best_epoch = (state or {}).get("best_epoch")
                self.best_weights = None
                self.wait = 0
                self.stopped_early = False
                self.epochs_run: list[int] = []
                self.run_config = run_config
                if state and state.get("monitor"):
                    self.monitor = state["monitor"]

            def _resolve_monitor(self, logs):
                if self.monitor is not None:
                    if self.monitor not in logs:
                        raise GraphswapError(
                            f"monitor {self.monitor!r} is not among the training logs "
                            f"({', '.join(sorted(logs))})")
                else:
                    keys = sorted(logs)
                    accuracy = [k for k in keys if k.startswith("val_") and "acc" in k]
                    if accuracy:
                        self.monitor = accuracy[0]
                    elif "val_loss" in logs:
                        self.monitor = "val_loss"
                    else:
                        train_accuracy = [k for k in keys if "acc" in k]
                        self.monitor = train_accuracy[0] if train_accuracy else "loss"
                self.mode = "max" if "acc" in self.monitor else "min"

            def on_epoch_end(self, epoch, logs=None):
                logs = {k: float(v) for k, v in (logs or {}).items()}
                if self.mode is None:
                    self._resolve_monitor(logs)
                for key, value in logs.items():
                    self.history.setdefault(key, []).append(value)
                self.history.setdefault("epoch", []).append(epoch + 1)
                self.epochs_run.append(epoch + 1)
                value = logs.get(self.monitor)
                if _is_better(value, self.best, self.mode):
                    self.best, self.best_epoch, self.wait = value, epoch + 1, 0
                    self.best_weights = self.model.get_weights()
                    if self.directory and self.chief:
                        _save_model_atomic(self.model, self.directory / CHECKPOINT_BEST)
                else:
                    self.wait += 1
                if self.directory and self.chief:
                    _save_model_atomic(self.model, self.directory / CHECKPOINT_LAST)
                    _write_json_atomic(self.directory / CHECKPOINT_STATE, {
                        "epoch": epoch + 1, "monitor": self.monitor, "mode": self.mode,
                        "best_value": self.best, "best_epoch": self.best_epoch,
                        "history": self.history, "config": self.run_config})
                if self.patience is not None and self.wait >= self.patience:
                    self.stopped_early = True
                    self.model.stop_training = True

        return Tracker(*args, **kwargs)


# --------------------------------------------------------------------------------------------
# fine-tuning
# --------------------------------------------------------------------------------------------

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

    def to_dict(self) -> dict:
        return {"initial_epoch": self.initial_epoch, "epochs": self.epochs,
                "epochs_run": self.epochs_run, "monitor": self.monitor,
                "best_epoch": self.best_epoch, "best_value": self.best_value,
                "restored_best": self.restored_best, "stopped_early": self.stopped_early,
                "history": self.history, "notes": self.notes,
                "checkpoint_dir": self.checkpoint_dir}


def swapped_layers(model) -> dict:
    """{layer path: kernel spec} of the swapped layers in `model`."""
    from graphswap.rewrite import iter_layers

    return {path: layer.arithmetic.spec for path, layer in iter_layers(model)
            if hasattr(layer, "arithmetic")}


def _copy_in_scope(model):
    """A copy of `model` whose variables belong to the current distribution strategy."""
    import keras

    clone = keras.models.clone_model(model, recursive=True)
    clone.set_weights(model.get_weights())
    return clone


def _patch_multiworker_build(model) -> None:
    """Work around two failures of Keras 3's fit() under MultiWorkerMirroredStrategy
    (keras-team/keras#20585, tensorflow/tensorflow#72388: "Keras 3 + MWMS does not train").

    1. `_maybe_symbolic_build` takes the first distributed batch and calls
       strategy.reduce("MEAN", batch) on it only to learn its shapes; under MWMS that reduce fails
       ("Attempt to convert a value (PerReplica...)").  The build needs shapes and dtypes only,
       which this replica's local batch has, so this model builds from it instead.
    2. `reduce_per_replica` averages each step's logs across workers with
       strategy.reduce("MEAN", v, axis=0), which fails for the scalar losses and metrics
       ("Invalid reduction dimension 0 for input with 0 dimensions").  The module function is
       wrapped so that, on the multi-worker path only, scalars are reduced with axis=None (the
       cross-worker mean Keras intends); every other path calls Keras' own function unchanged.
    """
    import types

    import keras
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer as tf_trainer

    if not getattr(tf_trainer.reduce_per_replica, "_graphswap_patched", False):
        keras_reduce = tf_trainer.reduce_per_replica

        def reduce_per_replica(values, strategy, reduction):
            if reduction in ("auto", "mean") and \
                    tf_trainer._collective_all_reduce_multi_worker(strategy):
                def reduce(value):
                    local = strategy.experimental_local_results(value)[0] \
                        if isinstance(value, tf.distribute.DistributedValues) else value
                    rank = getattr(local.shape, "rank", None)
                    return strategy.reduce("MEAN", value, axis=0 if rank else None)

                return keras.tree.map_structure(reduce, values)
            return keras_reduce(values, strategy, reduction)

        reduce_per_replica._graphswap_patched = True
        tf_trainer.reduce_per_replica = reduce_per_replica

    def maybe_symbolic_build(self, iterator=None, data_batch=None):
        if self._distribute_strategy is None:
            return
        if iterator is not None:
            for _, _, batches in iterator:
                batch = next(batches)
                data_batch = keras.tree.map_structure(
                    lambda value: (self.distribute_strategy.experimental_local_results(value)[0]
                                   if isinstance(value, tf.distribute.DistributedValues)
                                   else value), batch)
                break
        with self.distribute_strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    model._maybe_symbolic_build = types.MethodType(maybe_symbolic_build, model)


def _make_optimizer(optimizer, learning_rate):
    import keras

    if isinstance(optimizer, keras.optimizers.Optimizer):
        return optimizer
    try:
        opt = keras.optimizers.get(optimizer)
    except ValueError as exc:
        raise GraphswapError(f"unknown optimizer {optimizer!r}: {exc}") from None
    if learning_rate is not None:
        opt.learning_rate = learning_rate
    return opt


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


def finetune(model, data, *, val_data=None, val_split: float | None = None, epochs: int = 1,
             batch_size: int = 128, learning_rate: float | None = 1e-4, optimizer="adam",
             strategy=None, checkpoint_dir=None, resume: bool = False,
             patience: int | None = None, monitor: str | None = None,
             restore_best: bool = True, seed: int | None = 0, verbose="auto", callbacks=(),
             split: str | None = "train", val_split_name: str | None = "test",
             resize: bool = False, pad: bool = False, scale=None, custom_objects=None,
             safe_mode: bool = True, force: bool = False, log=None) -> FinetuneResult:
    """Fine-tune `model` (a keras.Model or a .keras path) on `data`, swapped kernels in the loop.

    Args:
      model: a (rewritten) keras.Model - never modified, a copy is trained - or a model file.
      data / val_data: anything graphswap.data.load_data accepts (.npz, image directory,
        tf.data, (x, y) arrays); `split`/`val_split_name` pick the .npz arrays (x_train/y_train
        and x_test/y_test by default, x/y when those are absent).
      val_split: hold out this fraction of `data` (seeded) for validation instead of val_data.
      epochs: total epoch count (a resumed run continues up to it).
      learning_rate / optimizer: a fresh optimizer (default Adam, 1e-4) for an un-resumed run.
      strategy: None, "mirrored", "multiworker" or a tf.distribute.Strategy.
      checkpoint_dir: write last/best checkpoints and state each epoch; `resume=True` continues
        from them (weights, optimizer state, epoch count, best value).
      patience: stop when the monitor has not improved for this many epochs.
      monitor: metric deciding the best epoch [default: val accuracy, else val_loss, else the
        training accuracy/loss]; restore_best returns the best epoch's weights.
      seed: seeds Python, NumPy, TensorFlow and the shuffling (None: no seeding).
      log: called with each note (what was loaded, how it is compiled, ...) as it is made;
        the notes are also returned in the result.

    Returns a FinetuneResult; raises DataError for data problems, GraphswapError otherwise.
    """
    import keras
    import tensorflow as tf

    from graphswap import data as data_module
    from graphswap import modelio

    if epochs < 1:
        raise GraphswapError(f"epochs must be at least 1, got {epochs}")
    if batch_size < 1:
        raise GraphswapError(f"batch size must be at least 1, got {batch_size}")
    if learning_rate is not None and not learning_rate >= 0:  # also refuses NaN; 0 freezes
        raise GraphswapError(f"learning rate must be positive (or 0 to freeze the weights), got "
                             f"{learning_rate}")
    if val_data is not None and val_split is not None:
        raise GraphswapError("pass either validation data or a validation split, not both")
    if patience is not None and patience < 1:
        raise GraphswapError(f"patience must be at least 1 epoch, got {patience}")
    notes = _Notes(log)
    strategy_obj = resolve_strategy(strategy)  # first: multi-worker must precede other TF work
    chief = is_chief(strategy_obj)
    if seed is not None:
        keras.utils.set_random_seed(seed)

    directory = Path(checkpoint_dir) if checkpoint_dir is not None else None
    state = None
    if directory is not None:
        if directory.exists() and not directory.is_dir():
            raise OutputPathError(f"checkpoint directory {directory} is a file")
        state = read_checkpoint_state(directory) if directory.exists() else None
        if state is not None and not resume:
            if not force:
                raise OutputPathError(
                    f"{directory} holds a checkpoint of an earlier run ({state['epoch']} "
                    f"epoch(s) done); pass resume=True (--resume) to continue it, force=True "
                    f"(--force) to start over, or choose another directory")
            state = None
        if resume and state is None:
            notes.append(f"no checkpoint in {directory}; starting from epoch 1")
        if chief:
            directory.mkdir(parents=True, exist_ok=True)
    elif resume:
        raise GraphswapError("resume needs a checkpoint directory (checkpoint_dir= / "
                             "--checkpoint-dir)")

    with strategy_obj.scope():
        if state is not None:
            source_model = modelio.load_model(directory / CHECKPOINT_LAST,
                                              custom_objects=custom_objects, safe_mode=safe_mode)
            notes.append(f"resumed from {directory / CHECKPOINT_LAST} after epoch "
                         f"{state['epoch']} of {epochs}")
        elif isinstance(model, (str, os.PathLike)):
            source_model = modelio.load_model(model, custom_objects=custom_objects,
                                              safe_mode=safe_mode)
        else:
            source_model = model
        expectation_model = source_model
        train = data_module.load_data(data, expectation_model, split=split, resize=resize,
                                      pad=pad, scale=scale, name="training data")
        validation = None
        if val_data is not None:
            validation = data_module.load_data(val_data, expectation_model, split=val_split_name,
                                               resize=resize, pad=pad, scale=scale,
                                               name="validation data")
        elif val_split is not None:
            train, validation = train.split(val_split, seed=seed or 0)
        notes.extend(train.notes)
        if validation is not None:
            notes.extend(n for n in validation.notes if n not in train.notes)
        if state is not None:
            trained = source_model
            if not getattr(trained, "compiled", False):
                raise GraphswapError(f"checkpoint {directory / CHECKPOINT_LAST} has no compile "
                                     f"settings; delete {directory} to start over")
        else:
            settings = compile_settings(source_model, train.label_format)
            notes.append(settings.note)
            trained = _copy_in_scope(source_model)
            trained.compile(optimizer=_make_optimizer(optimizer, learning_rate),
                            loss=settings.loss, metrics=settings.metrics)
            if learning_rate is not None:
                notes.append(f"optimizer {type(trained.optimizer).__name__}, learning rate "
                             f"{learning_rate:g}")
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
                  "seed": seed}
    tracker = _Tracker(monitor, patience, directory, chief, state, run_config)
    if state is not None and restore_best and directory is not None \
            and (directory / CHECKPOINT_BEST).is_file():
        best_model = modelio.load_model(directory / CHECKPOINT_BEST, compile=False,
                                        custom_objects=custom_objects, safe_mode=safe_mode)
        tracker.best_weights = best_model.get_weights()
        tracker.mode = state.get("mode") or ("max" if "acc" in (tracker.monitor or "") else "min")
    if verbose == "auto":
        verbose = 1
    if initial_epoch >= epochs:
        notes.append(f"the checkpoint already has {initial_epoch} epoch(s); nothing to train "
                     f"for epochs={epochs}")
    else:
        if isinstance(strategy_obj, tf.distribute.MultiWorkerMirroredStrategy):
            _patch_multiworker_build(trained)
        train_ds, steps = train.training_dataset(batch_size, seed, initial_epoch, epochs)
        val_ds = validation.as_dataset(batch_size) if validation is not None else None
        with data_module.translate_errors():
            trained.fit(train_ds, validation_data=val_ds, epochs=epochs,
                        initial_epoch=initial_epoch, steps_per_epoch=steps,
                        callbacks=[tracker, *callbacks], shuffle=False, verbose=verbose)
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
    return FinetuneResult(
        model=trained, history=tracker.history, initial_epoch=initial_epoch, epochs=epochs,
        epochs_run=tracker.epochs_run, monitor=tracker.monitor, best_epoch=tracker.best_epoch,
        best_value=tracker.best, restored_best=restored, stopped_early=tracker.stopped_early,
        notes=list(notes), checkpoint_dir=str(directory) if directory is not None else None,
        chief=chief)


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
