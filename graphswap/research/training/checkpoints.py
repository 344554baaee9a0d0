"""Fine-tuning checkpoints: one atomic unit per epoch, and a lock on the checkpoint directory.

After every epoch CheckpointTracker writes a new directory `.epoch-N.graphswap-tmp-<pid>.<host>-*`
holding `last.keras` (weights and optimizer state), `best.keras` (best weights so far; a hard
link to the previous epoch's when it did not improve) and `state.json` (epochs done, monitor,
best value, history, the run's settings and fingerprint, the random-number state - see
graphswap.research.training.fingerprints - and the SHA-256 of both model files), flushes it to disk
and renames it to `epoch-N` in one step; then the symbolic link `current` is switched to it (one
atomic rename) and the older epoch directories are removed.  `last.keras`, `best.keras` and
`state.json` at the top of the directory are links through `current`, so they always belong to
one epoch.  A kill at any instant leaves `current` on a complete epoch (or, while it is being
switched, a complete `epoch-N` that `latest_checkpoint` finds): a resume is bit-identical to the
uninterrupted run.  A model file that does not match its recorded hash is refused.

`state.json` is sealed (graphswap.research.training.checkpoint_state: a format tag and the SHA-256
of its own content); what graphswap did not write is never resumed from, replaced or deleted, even
with --force (`latest_checkpoint` refuses the directory).  The lock and the clean-up of what
killed runs left: graphswap.research.training.checkpoint_lock.  A directory written by an older
graphswap (plain files at the top, no `current`) is still read.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import keras

from graphswap.errors import GraphswapError, OutputPathError
from graphswap.io.atomic import (ASIDE_MARK, TEMPORARY_MARK, fsync_directory, fsync_tree,
                                 owner_prefix, rename_no_replace, write_failed)
from graphswap.research.training.checkpoint_lock import (CheckpointLock, lock_checkpoint_directory,
                                                         releases_checkpoint_locks)
from graphswap.research.training.checkpoint_state import (CHECKPOINT_BEST, CHECKPOINT_CURRENT,
                                                          CHECKPOINT_LAST, CHECKPOINT_LOCK,
                                                          CHECKPOINT_STATE, FILES, Checkpoint,
                                                          epoch_folders, epoch_name, file_sha256,
                                                          latest_checkpoint, seal)
from graphswap.research.training.fingerprints import rng_state

__all__ = ["CHECKPOINT_BEST", "CHECKPOINT_CURRENT", "CHECKPOINT_LAST", "CHECKPOINT_LOCK",
           "CHECKPOINT_STATE", "Checkpoint", "CheckpointLock", "CheckpointTracker",
           "clear_checkpoint", "latest_checkpoint", "lock_checkpoint_directory",
           "read_checkpoint_state", "releases_checkpoint_locks", "write_checkpoint"]


def read_checkpoint_state(directory) -> dict | None:
    """The state of the newest complete checkpoint in `directory` (None: there is none)."""
    checkpoint = latest_checkpoint(directory)
    return checkpoint.state if checkpoint is not None else None


def _trash(path: Path) -> None:
    """Rename `path` aside (one step) and remove it; a kill in between leaves only an entry that
    the next run recognises as a leftover."""
    aside = tempfile.mkdtemp(prefix=owner_prefix(f".{path.name}", ASIDE_MARK), dir=path.parent)
    os.rmdir(aside)
    os.rename(path, aside)
    if os.path.isdir(aside) and not os.path.islink(aside):
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.unlink(aside)


def clear_checkpoint(directory) -> None:
    """Remove the checkpoint in `directory` (starting over with --force; under the lock, after
    latest_checkpoint found only what graphswap wrote): the epoch directories, `current` and the
    top-level files or links - nothing else."""
    directory = Path(directory)
    for _, path in epoch_folders(directory):
        _trash(path)
    for name in (CHECKPOINT_CURRENT, *FILES):
        path = directory / name
        if os.path.lexists(path):
            _trash(path)
    fsync_directory(directory)


# --- writing -------------------------------------------------------------------------------------

def _link_or_copy(source: Path, destination: Path) -> None:
    try:
        os.link(source, destination)
    except OSError:
        shutil.copyfile(source, destination)


def _point(directory: Path, name: str, target: str) -> None:
    """Make `directory`/`name` a symbolic link to `target` in one rename (a plain file there is
    replaced; a plain directory is first set aside)."""
    path = directory / name
    if path.is_symlink() and os.readlink(path) == target:
        return
    if path.is_dir() and not path.is_symlink():
        _trash(path)
    link = tempfile.mktemp(prefix=owner_prefix(f".{name}", TEMPORARY_MARK), dir=directory)
    os.symlink(target, link)
    os.replace(link, path)


def write_checkpoint(directory, epoch: int, model, state: dict, improved: bool,
                     previous_best: Path | None) -> Checkpoint:
    """Write the checkpoint of `epoch` as one unit (see the module docstring) and make it the
    current one.  `improved`: `model` holds the best weights so far (best.keras is a copy of
    last.keras), else best.keras links `previous_best` (if any).  OutputPathError when the disk
    refuses (nothing of this epoch is left behind; the previous checkpoint stays current)."""
    directory = Path(directory)
    final = directory / epoch_name(epoch)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=owner_prefix(f".{final.name}", TEMPORARY_MARK),
                                    dir=directory))
    except OSError as exc:
        raise write_failed(directory, exc, "checkpoint directory") from None
    try:
        model.save(tmp / CHECKPOINT_LAST)
        if improved:
            shutil.copyfile(tmp / CHECKPOINT_LAST, tmp / CHECKPOINT_BEST)
        elif previous_best is not None:
            _link_or_copy(previous_best, tmp / CHECKPOINT_BEST)
        files = {name: file_sha256(tmp / name) for name in (CHECKPOINT_LAST, CHECKPOINT_BEST)
                 if (tmp / name).is_file()}
        state = seal({**state, "files": files})   # the format tag and its own SHA-256
        (tmp / CHECKPOINT_STATE).write_text(json.dumps(state, indent=2), encoding="utf-8")
        fsync_tree(tmp)
        if os.path.lexists(final):   # an epoch a killed run wrote but never made current
            _trash(final)
        rename_no_replace(tmp, final)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OutputPathError(
            f"writing the checkpoint of epoch {epoch} in {directory} failed: "
            f"{os.strerror(exc.errno) if exc.errno else exc}; the checkpoint of the epoch before "
            f"is kept; free some space or choose another --checkpoint-dir") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        fsync_directory(directory)
        _point(directory, CHECKPOINT_CURRENT, final.name)
        fsync_directory(directory)
        for name in FILES:
            if (final / name).is_file():
                _point(directory, name, f"{CHECKPOINT_CURRENT}/{name}")
            elif os.path.lexists(directory / name):
                _trash(directory / name)
        for number, path in epoch_folders(directory):
            if number != epoch:
                _trash(path)
    except OSError as exc:
        raise OutputPathError(
            f"making the checkpoint of epoch {epoch} current in {directory} failed: "
            f"{os.strerror(exc.errno) if exc.errno else exc}; the newest complete epoch is "
            f"resumed from; free some space or choose another --checkpoint-dir") from None
    return Checkpoint(directory, final, state)


def _is_better(value, best, mode) -> bool:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    if best is None:
        return True
    return value > best if mode == "max" else value < best


class CheckpointTracker(keras.callbacks.Callback):
    """Tracks the monitor, keeps the best weights, stops early, and writes the checkpoints."""

    def __init__(self, monitor, patience, directory, chief, state, run_config, fingerprint=None,
                 best_file=None):
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
        self.best_file = Path(best_file) if best_file else None
        self.wait = 0
        self.stopped_early = False
        self.epochs_run: list[int] = []
        self.run_config = run_config
        self.fingerprint = fingerprint
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
        improved = _is_better(value, self.best, self.mode)
        if improved:
            self.best, self.best_epoch, self.wait = value, epoch + 1, 0
            self.best_weights = self.model.get_weights()
        else:
            self.wait += 1
        if self.directory and self.chief:
            written = write_checkpoint(self.directory, epoch + 1, self.model, {
                "epoch": epoch + 1, "monitor": self.monitor, "mode": self.mode,
                "best_value": self.best, "best_epoch": self.best_epoch,
                "history": self.history, "config": self.run_config,
                "fingerprint": self.fingerprint, "rng": rng_state(self.model)},
                improved, self.best_file)
            self.best_file = written.best
        if self.patience is not None and self.wait >= self.patience:
            self.stopped_early = True
            self.model.stop_training = True
