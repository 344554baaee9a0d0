"""Fine-tuning checkpoints: one atomic unit per epoch, and a lock on the checkpoint directory.

After every epoch CheckpointTracker writes a new directory `.epoch-N.graphswap-tmp-<pid>-<rand>`
holding `last.keras` (weights and optimizer state), `best.keras` (best weights so far; a hard
link to the previous epoch's when it did not improve) and `state.json` (epochs done, monitor,
best value, history, the run's settings and fingerprint, the random-number state - see
graphswap.research.fingerprints - and the SHA-256 of both model files), flushes it to disk and
renames it to `epoch-N` in one step; then the symbolic link `current` is switched to it (one
atomic rename) and the older epoch directories are removed.  `last.keras`, `best.keras` and
`state.json` at the top of the directory are links through `current`, so they always belong to
one epoch.  A kill at any instant leaves `current` on a complete epoch (or, while it is being
switched, a complete `epoch-N` that `latest_checkpoint` finds): a resume is bit-identical to the
uninterrupted run.  A model file that does not match its recorded hash is refused.

`lock_checkpoint_directory` holds an exclusive flock on `.graphswap.lock` for the whole run: a
second fine-tune on the same directory is refused ("in use by pid N").  Under the lock, what a
killed run left (temporaries, directories being removed) is cleaned up.  A directory written by
an older graphswap (plain files at the top, no `current`) is still read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import functools
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path

import keras

from graphswap.errors import CheckpointError, GraphswapError, OutputPathError
from graphswap.io.atomic import (ASIDE_MARK, TEMPORARY_MARK, fsync_directory, fsync_tree,
                                 rename_no_replace, write_failed)
from graphswap.research.fingerprints import rng_state

CHECKPOINT_STATE = "state.json"
CHECKPOINT_LAST = "last.keras"
CHECKPOINT_BEST = "best.keras"
CHECKPOINT_CURRENT = "current"
CHECKPOINT_LOCK = ".graphswap.lock"
_FILES = (CHECKPOINT_LAST, CHECKPOINT_BEST, CHECKPOINT_STATE)
_EPOCH = re.compile(r"epoch-(\d+)$")
#: temporaries of the layout before one directory per epoch
_OLD_TEMPORARIES = (".last.tmp.keras", ".best.tmp.keras", ".state.json.tmp")


def _epoch_name(epoch: int) -> str:
    return f"epoch-{epoch:06d}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclasses.dataclass
class Checkpoint:
    """The newest complete checkpoint in `directory`; its files are in `folder` (an epoch
    directory, or `directory` itself for the layout of older graphswap versions)."""

    directory: Path
    folder: Path
    state: dict

    @property
    def epoch(self) -> int:
        return int(self.state["epoch"])

    @property
    def last(self) -> Path:
        return self.folder / CHECKPOINT_LAST

    @property
    def best(self) -> Path | None:
        path = self.folder / CHECKPOINT_BEST
        return path if path.is_file() else None

    def verify(self) -> None:
        """CheckpointError unless the model files have the SHA-256 recorded in state.json."""
        for name, recorded in (self.state.get("files") or {}).items():
            path = self.folder / name
            if name not in (CHECKPOINT_LAST, CHECKPOINT_BEST):
                continue
            try:
                actual = _sha256(path)
            except OSError as exc:
                raise CheckpointError(
                    f"checkpoint {self.directory}: {name} of epoch {self.epoch} cannot be read "
                    f"({exc.strerror or exc}); delete {self.directory} (or pass --force without "
                    f"--resume) to start over") from None
            if actual != recorded:
                raise CheckpointError(
                    f"checkpoint {self.directory}: {name} of epoch {self.epoch} does not match the "
                    f"hash its state.json records (the file was changed or damaged after it was "
                    f"written); delete {self.directory} (or pass --force without --resume) to "
                    f"start over")


def _read_state(folder: Path, directory: Path) -> dict:
    path = folder / CHECKPOINT_STATE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        int(state["epoch"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"checkpoint state {path} is unreadable ({exc}); delete "
                              f"{directory} to start over") from None
    return state


def _epoch_folders(directory: Path) -> list[tuple[int, Path]]:
    found = []
    try:
        names = os.listdir(directory)
    except OSError:
        return found
    for name in names:
        match = _EPOCH.match(name)
        if match and (directory / name).is_dir() and not (directory / name).is_symlink():
            found.append((int(match.group(1)), directory / name))
    return sorted(found)


def latest_checkpoint(directory) -> Checkpoint | None:
    """The newest complete checkpoint in `directory`, or None when it holds none.

    `current` (a link to an epoch directory) decides; without it, plain files at the top (an
    older graphswap's layout, or a copy that followed the links) are read; else the newest
    epoch directory (a run killed while `current` was being switched).  CheckpointError for a
    state that cannot be read or does not belong to its epoch directory."""
    directory = Path(directory)
    current = directory / CHECKPOINT_CURRENT
    folder = None
    if current.is_symlink():
        target = os.readlink(current)
        if _EPOCH.match(target) and (directory / target).is_dir():
            folder = directory / target
    if folder is None and (directory / CHECKPOINT_STATE).is_file() \
            and not (directory / CHECKPOINT_STATE).is_symlink():
        folder = directory
    if folder is None:
        complete = [path for _, path in _epoch_folders(directory)
                    if (path / CHECKPOINT_STATE).is_file()]
        folder = complete[-1] if complete else None
    if folder is None:
        return None
    state = _read_state(folder, directory)
    match = _EPOCH.match(folder.name) if folder != directory else None
    if match and int(match.group(1)) != int(state["epoch"]):
        raise CheckpointError(
            f"checkpoint {folder} holds the state of epoch {state['epoch']}: the directory was "
            f"edited; delete {directory} to start over")
    return Checkpoint(directory, folder, state)


def read_checkpoint_state(directory) -> dict | None:
    """The state of the newest complete checkpoint in `directory` (None: there is none)."""
    checkpoint = latest_checkpoint(directory)
    return checkpoint.state if checkpoint is not None else None


# --- the lock ------------------------------------------------------------------------------------

class CheckpointLock:
    """An exclusive flock on `directory`/.graphswap.lock, held until `release`."""

    def __init__(self, directory: Path, fd: int):
        self.directory = directory
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


_held = threading.local()


def releases_checkpoint_locks(function):
    """Decorator: the checkpoint locks taken (lock_checkpoint_directory) while `function` runs are
    released when it returns or raises."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        stack = getattr(_held, "stack", None)
        if stack is None:
            stack = _held.stack = []
        stack.append([])
        try:
            return function(*args, **kwargs)
        finally:
            for lock in stack.pop():
                lock.release()

    return wrapper


def lock_checkpoint_directory(directory) -> CheckpointLock:
    """Create `directory` if needed, take its lock (CheckpointError "in use by pid N" when another
    process holds it) and clean up what a killed run left there.  Inside a function decorated
    with releases_checkpoint_locks the lock is released when that function ends."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise OutputPathError(f"checkpoint directory {directory} is a file; choose another "
                              f"--checkpoint-dir")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / CHECKPOINT_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise OutputPathError(f"cannot use the checkpoint directory {directory}: "
                              f"{os.strerror(exc.errno) if exc.errno else exc}; choose another "
                              f"--checkpoint-dir") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = ""
        with contextlib.suppress(OSError, ValueError):
            holder = os.pread(fd, 32, 0).decode().strip()
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            who = f"pid {int(holder)}" if holder.isdigit() else "another process"
            raise CheckpointError(
                f"checkpoint directory {directory} is in use by {who} (another fine-tune writing "
                f"its checkpoints); wait for it to finish, or choose another --checkpoint-dir"
            ) from None
        raise OutputPathError(f"cannot lock the checkpoint directory {directory}: "
                              f"{os.strerror(exc.errno) if exc.errno else exc}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    lock = CheckpointLock(directory, fd)
    stack = getattr(_held, "stack", None)
    if stack:
        stack[-1].append(lock)
    _clean_leftovers(directory)
    return lock


def _trash(path: Path) -> None:
    """Rename `path` aside (one step) and remove it; a kill in between leaves only an entry that
    the next run recognises as a leftover."""
    aside = tempfile.mkdtemp(prefix=f".{path.name}{ASIDE_MARK}{os.getpid()}-", dir=path.parent)
    os.rmdir(aside)
    os.rename(path, aside)
    if os.path.isdir(aside) and not os.path.islink(aside):
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.unlink(aside)


def _clean_leftovers(directory: Path) -> None:
    """Under the lock: every temporary or set-aside entry is a leftover of a finished or killed
    run (only the lock holder writes here)."""
    for name in os.listdir(directory):
        if TEMPORARY_MARK in name or ASIDE_MARK in name or name in _OLD_TEMPORARIES:
            path = directory / name
            with contextlib.suppress(OSError):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()


def clear_checkpoint(directory) -> None:
    """Remove the checkpoint in `directory` (starting over with --force; under the lock): the
    epoch directories, `current` and the top-level files or links - nothing else."""
    directory = Path(directory)
    for _, path in _epoch_folders(directory):
        _trash(path)
    for name in (CHECKPOINT_CURRENT, *_FILES):
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
    link = tempfile.mktemp(prefix=f".{name}{TEMPORARY_MARK}{os.getpid()}-", dir=directory)
    os.symlink(target, link)
    os.replace(link, path)


def write_checkpoint(directory, epoch: int, model, state: dict, improved: bool,
                     previous_best: Path | None) -> Checkpoint:
    """Write the checkpoint of `epoch` as one unit (see the module docstring) and make it the
    current one.  `improved`: `model` holds the best weights so far (best.keras is a copy of
    last.keras), else best.keras links `previous_best` (if any).  OutputPathError when the disk
    refuses (nothing of this epoch is left behind; the previous checkpoint stays current)."""
    directory = Path(directory)
    final = directory / _epoch_name(epoch)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}{TEMPORARY_MARK}{os.getpid()}-",
                                    dir=directory))
    except OSError as exc:
        raise write_failed(directory, exc, "checkpoint directory") from None
    try:
        model.save(tmp / CHECKPOINT_LAST)
        if improved:
            shutil.copyfile(tmp / CHECKPOINT_LAST, tmp / CHECKPOINT_BEST)
        elif previous_best is not None:
            _link_or_copy(previous_best, tmp / CHECKPOINT_BEST)
        files = {name: _sha256(tmp / name) for name in (CHECKPOINT_LAST, CHECKPOINT_BEST)
                 if (tmp / name).is_file()}
        (tmp / CHECKPOINT_STATE).write_text(json.dumps({**state, "files": files}, indent=2),
                                            encoding="utf-8")
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
        for name in _FILES:
            if (final / name).is_file():
                _point(directory, name, f"{CHECKPOINT_CURRENT}/{name}")
            elif os.path.lexists(directory / name):
                _trash(directory / name)
        for number, path in _epoch_folders(directory):
            if number != epoch:
                _trash(path)
    except OSError as exc:
        raise OutputPathError(
            f"making the checkpoint of epoch {epoch} current in {directory} failed: "
            f"{os.strerror(exc.errno) if exc.errno else exc}; the newest complete epoch is "
            f"resumed from; free some space or choose another --checkpoint-dir") from None
    return Checkpoint(directory, final, {**state, "files": files})


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
