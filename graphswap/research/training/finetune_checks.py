"""What `finetune` checks before it trains and while it trains, so that a run never destroys or
replaces the user's files and never writes a model that is not one.

Before any work (`check_learning_rate`, `check_run_paths`):

  - the learning rate is "auto", None (the optimizer's own) or a finite number from 0 (frozen
    weights) to MAX_LEARNING_RATE: `inf`, NaN, 1e30 or a negative rate are refused up front;
  - no input - the model file, the teacher file, the training or validation data - lies inside the
    checkpoint directory (a fresh run with --force clears it, and every epoch replaces its
    best.keras/last.keras and removes the older epochs: `finetune ck/best.keras --checkpoint-dir
    ck --force` would delete the model it is about to read), and the checkpoint directory lies in
    no input directory (an image folder would grow a class, a SavedModel directory foreign files);
  - the output is neither inside the checkpoint directory nor holds it (--force replacing a
    SavedModel output directory would delete the checkpoint; a checkpoint clear-up never meets
    the output).

While it trains (`DivergenceGuard`, `check_finite_weights`): after every epoch - before that
epoch's checkpoint is written - the training loss and every weight must be finite; a run whose
loss or weights became NaN or infinite stops with TrainingDivergedError, writing no checkpoint of
that epoch and no output model.  A model whose trainable weights already hold NaN/inf is refused
before training.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import keras
import numpy as np

from graphswap.errors import GraphswapError, OutputPathError, TrainingDivergedError
from graphswap.research.training.recovery import AUTO_LEARNING_RATE as AUTO

#: the largest learning rate accepted: fine-tuning takes small steps (1e-4 to 1e-2 typically);
#: far above this every optimizer graphswap offers diverges to NaN in a step or two
MAX_LEARNING_RATE = 10.0


def check_learning_rate(value):
    """A learning rate argument: "auto", None (the optimizer's own), or a finite number from 0
    (0 freezes the weights) to MAX_LEARNING_RATE; numbers given as text (the CLI's) become
    floats.  GraphswapError otherwise (NaN, inf, 1e30, a negative rate)."""
    if value is None or value == AUTO:
        return value
    try:
        rate = float(value)
    except (TypeError, ValueError, OverflowError):
        raise GraphswapError(f"learning rate must be a number or {AUTO!r}, got {value!r}") \
            from None
    if not (math.isfinite(rate) and 0 <= rate <= MAX_LEARNING_RATE):
        raise GraphswapError(
            f"learning rate must be positive (or 0 to freeze the weights) and at most "
            f"{MAX_LEARNING_RATE:g}, got {value}: fine-tuning takes small steps (1e-4 to 1e-2 "
            f"typically; {AUTO!r} picks one), and a larger rate drives the weights to NaN")
    return rate


def _real(path) -> Path:
    """`path` made absolute with its links resolved (as far as they exist)."""
    try:
        return Path(os.path.realpath(os.fspath(path)))
    except (OSError, RuntimeError, ValueError):
        return Path(os.path.abspath(os.fspath(path)))


def _within(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def _is_path(value) -> bool:
    return isinstance(value, (str, os.PathLike))


def check_run_paths(checkpoint_dir, output=None, *, model=None, teacher=None, data=None,
                    val_data=None) -> None:
    """Refuse (OutputPathError), before anything is read or written, a run whose inputs or
    output overlap its checkpoint directory (module docstring).  Inputs that are no paths
    (arrays, a keras.Model, teacher "original") are not files and are not checked."""
    if checkpoint_dir is None:
        return
    directory = _real(checkpoint_dir)
    inputs = [("model", model), ("teacher", teacher), ("training data (--data)", data),
              ("validation data (--val-data)", val_data)]
    for what, value in inputs:
        if not _is_path(value) or (what == "teacher" and os.fspath(value) == "original"):
            continue
        place = _real(value)
        if _within(place, directory):
            raise OutputPathError(
                f"the {what} {os.fspath(value)} lies inside the checkpoint directory "
                f"{os.fspath(checkpoint_dir)}: fine-tuning replaces the checkpoint files there "
                f"every epoch and clears them with --force, so an input there could be gone "
                f"before or while it is read. Nothing was read or changed; copy it out of "
                f"{os.fspath(checkpoint_dir)} first (e.g. cp {os.fspath(value)} .), or choose "
                f"another --checkpoint-dir")
        if _within(directory, place):
            raise OutputPathError(
                f"the checkpoint directory {os.fspath(checkpoint_dir)} lies inside the {what} "
                f"{os.fspath(value)}: fine-tuning would write its checkpoints into an input. "
                f"Nothing was read or changed; choose a --checkpoint-dir outside "
                f"{os.fspath(value)}")
    if output is None:
        return
    target = _real(output)
    if _within(target, directory) or _within(directory, target):
        where = ("is the checkpoint directory" if target == directory else
                 f"lies inside the checkpoint directory {os.fspath(checkpoint_dir)}"
                 if _within(target, directory) else
                 f"holds the checkpoint directory {os.fspath(checkpoint_dir)}")
        raise OutputPathError(
            f"output (-o/--output) {os.fspath(output)} {where}: the checkpoint directory is "
            f"fine-tuning's own (cleared with --force, its files replaced every epoch), and "
            f"replacing the output would delete the checkpoint. Nothing was read or changed; "
            f"write the output outside the checkpoint directory, or choose another "
            f"--checkpoint-dir")


def nonfinite_weights(model) -> list[str]:
    """The paths of `model`'s floating-point variables holding NaN or an infinity."""
    found = []
    for variable in model.weights:
        if not keras.backend.is_float_dtype(variable.dtype):
            continue
        if not np.all(np.isfinite(keras.ops.convert_to_numpy(variable))):
            found.append(getattr(variable, "path", variable.name))
    return found


def _listed(names) -> str:
    names = list(names)
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def check_start_weights(model) -> set[str]:
    """Refuse (TrainingDivergedError) a model whose trainable weights hold NaN/inf before any
    training; returns the non-trainable variables that already did (the checks after each
    epoch leave those alone)."""
    bad = set(nonfinite_weights(model))
    trainable = {getattr(v, "path", v.name) for v in model.trainable_weights}
    if bad & trainable:
        raise TrainingDivergedError(
            f"the model's weights hold NaN or infinite values before any training "
            f"({_listed(sorted(bad & trainable))}): fine-tuning cannot recover them and nothing "
            f"was written. Use the model these weights came from (re-run convert on the "
            f"original)")
    return bad


def _advice(rate) -> str:
    shown = f"; now {rate:g}" if isinstance(rate, (int, float)) else ""
    return (f"Lower the learning rate (--lr / learning_rate{shown}), or check the data for "
            f"extreme values")


def check_finite_weights(model, allowed=(), rate=None, when: str = "after training") -> None:
    """TrainingDivergedError when `model` holds NaN/inf weights (other than `allowed`): nothing
    is saved then."""
    bad = [name for name in nonfinite_weights(model) if name not in allowed]
    if bad:
        raise TrainingDivergedError(
            f"fine-tuning diverged: {when} the weights {_listed(bad)} hold NaN or infinite "
            f"values; no model was written. {_advice(rate)}")


class DivergenceGuard(keras.callbacks.Callback):
    """Stops the run (TrainingDivergedError) at the end of an epoch whose training loss or
    weights are not finite - placed before the CheckpointTracker, so that epoch is never
    checkpointed nor taken as the best."""

    def __init__(self, allowed=(), rate=None, directory=None):
        super().__init__()
        self.allowed = set(allowed)
        self.rate = rate
        self.directory = directory

    def on_epoch_end(self, epoch, logs=None):
        loss = (logs or {}).get("loss")
        try:
            loss = float(loss) if loss is not None else None
        except (TypeError, ValueError):
            loss = None
        bad = [name for name in nonfinite_weights(self.model) if name not in self.allowed]
        if (loss is None or math.isfinite(loss)) and not bad:
            return
        what = []
        if loss is not None and not math.isfinite(loss):
            what.append(f"the training loss is {loss}")
        if bad:
            what.append(f"the weights {_listed(bad)} hold NaN or infinite values")
        kept = (f"; the checkpoints of the earlier epochs in {self.directory} are kept"
                if self.directory is not None and epoch > 0 else "")
        raise TrainingDivergedError(
            f"fine-tuning diverged in epoch {epoch + 1}: {' and '.join(what)}. The run was "
            f"stopped: no model was written and no checkpoint of this epoch{kept}. "
            f"{_advice(self.rate)}")
