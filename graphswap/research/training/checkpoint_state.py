"""What a fine-tuning checkpoint directory holds, and which of it graphswap wrote.

A checkpoint graphswap writes (graphswap.research.training.checkpoints) is recognised by its marks,
never by its names alone: each epoch's `state.json` carries a format tag, the SHA-256 of
`last.keras` and `best.keras` and the SHA-256 of its own content (`seal`); `current` is a symbolic
link to an `epoch-N` directory, and `last.keras`/`best.keras`/`state.json` at the top are links
through it (or, in the layout of an older graphswap, plain files whose state records their
hashes).

`latest_checkpoint` refuses (CheckpointError) a directory holding what looks like a checkpoint
but was not written so - a user's own `best.keras`, `last.keras`, a `state.json` with an "epoch"
key, an `epoch-N` folder or a `current` of their own: graphswap would resume from it or replace
it.  Nothing of it is touched.  A `state.json` that graphswap wrote but that was edited since (its
content no longer matches the SHA-256 it records, or a field of the wrong type) is refused
naming the field, instead of failing later inside the training loop.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import stat
from pathlib import Path

from graphswap.errors import CheckpointError
from graphswap.input_files import MAX_JSON_DEPTH, json_depth

CHECKPOINT_STATE = "state.json"
CHECKPOINT_LAST = "last.keras"
CHECKPOINT_BEST = "best.keras"
CHECKPOINT_CURRENT = "current"
CHECKPOINT_LOCK = ".graphswap.lock"
FILES = (CHECKPOINT_LAST, CHECKPOINT_BEST, CHECKPOINT_STATE)
EPOCH = re.compile(r"epoch-(\d+)$")
STATE_FORMAT = "graphswap-checkpoint"
STATE_FORMAT_VERSION = 1
#: the state's fields (what CheckpointTracker writes) and the types each may have
_FIELDS = {"epoch": (int,), "monitor": (str, type(None)), "mode": (str, type(None)),
           "best_value": (int, float, type(None)), "best_epoch": (int, type(None)),
           "history": (dict,), "config": (dict, type(None)), "fingerprint": (dict, type(None)),
           "rng": (dict, type(None)), "files": (dict,), "format": (str,),
           "format_version": (int,), "state_sha256": (str,)}


def epoch_name(epoch: int) -> str:
    return f"epoch-{epoch:06d}"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def state_digest(state: dict) -> str:
    """SHA-256 of the state's content (every field but the digest itself, in canonical JSON)."""
    content = {key: value for key, value in state.items() if key != "state_sha256"}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":"))
                          .encode("utf-8")).hexdigest()


def seal(state: dict) -> dict:
    """`state` as written: with the format tag and the SHA-256 of its own content."""
    document = json.loads(json.dumps({**state, "format": STATE_FORMAT,
                                      "format_version": STATE_FORMAT_VERSION}))
    return {**document, "state_sha256": state_digest(document)}


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
                actual = file_sha256(path)
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


def _parse(path: Path):
    """The JSON object in `path`, or the reason it is none."""
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as handle:  # a FIFO: no wait
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                return None, "it is not a plain file"
            if info.st_size > 256 * 1024 * 1024:
                return None, "it is larger than any state graphswap writes"
            text = handle.read().decode("utf-8")
        depth = json_depth(text)   # 100,000 nested brackets: refused, not a RecursionError
        if depth > MAX_JSON_DEPTH:
            return None, (f"its JSON nests {depth:,} levels deep, more than the "
                          f"{MAX_JSON_DEPTH} graphswap reads")
        state = json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if not isinstance(state, dict):
        return None, f"it holds a JSON {type(state).__name__}, not an object"
    return state, None


def _edited(state: dict) -> str | None:
    """What is wrong with a state graphswap wrote, or None: its own SHA-256, then its fields."""
    if "state_sha256" in state and state["state_sha256"] != state_digest(state):
        return "its content does not match the SHA-256 it records"
    if state.get("format") == STATE_FORMAT and "state_sha256" not in state:
        return "it records no SHA-256 of its content"
    if "epoch" not in state:
        return "it has no 'epoch'"
    for key, kinds in _FIELDS.items():
        value = state.get(key)
        if key in state and (not isinstance(value, kinds) or isinstance(value, bool)):
            return f"its {key!r} is {json.dumps(value)[:60]}; expected {_names(kinds)}"
    if state["epoch"] < 0 or state.get("mode") not in ("max", "min", None):
        return f"its epoch {state['epoch']} or mode {state.get('mode')!r} is out of range"
    for key, values in state.get("history", {}).items():
        if not isinstance(values, list) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            return f"its history {key!r} is not a list of numbers"
    if not all(isinstance(v, str) for v in state.get("files", {}).values()):
        return "its 'files' are not SHA-256 digests"
    return None


def _names(kinds) -> str:
    return " or ".join({"NoneType": "null", "dict": "an object", "str": "text", "int": "a whole "
                        "number", "float": "a number", "list": "a list"}[k.__name__] for k in kinds)


def written_by_graphswap(folder: Path) -> tuple[dict | None, str]:
    """(state, "") when `folder` holds a checkpoint graphswap wrote: a state.json object with its
    format tag (whether its content and files are intact is for read_state and
    Checkpoint.verify to say), or one of an older graphswap, without the tag, recording the
    SHA-256 of last.keras - and of best.keras when there is one - that the files have; else
    (None, why not)."""
    state, problem = _parse(folder / CHECKPOINT_STATE)
    if state is None:
        return None, f"{CHECKPOINT_STATE} is no graphswap state ({problem})"
    if state.get("format") == STATE_FORMAT:
        return state, ""
    if "format" in state:
        return None, f"{CHECKPOINT_STATE} has the format {str(state.get('format'))[:40]!r}"
    files = state.get("files")
    if not isinstance(files, dict) or CHECKPOINT_LAST not in files:
        return None, f"{CHECKPOINT_STATE} records no SHA-256 of {CHECKPOINT_LAST}"
    for name in (CHECKPOINT_LAST, CHECKPOINT_BEST):
        path = folder / name
        if name not in files and not os.path.lexists(path):
            continue
        try:
            if name not in files or not path.is_file() or file_sha256(path) != files[name]:
                return None, f"{name} is not the file {CHECKPOINT_STATE} records"
        except OSError as exc:
            return None, f"{name} cannot be read ({exc.strerror or exc})"
    return state, ""


def read_state(folder: Path, directory: Path) -> dict:
    """The state of the checkpoint in `folder`; CheckpointError when it cannot be read or was
    edited since graphswap wrote it."""
    path = folder / CHECKPOINT_STATE
    state, problem = _parse(path)
    if state is None:
        raise CheckpointError(f"checkpoint state {path} is unreadable ({problem}); delete "
                              f"{directory} to start over")
    problem = _edited(state)
    if problem is not None:
        raise CheckpointError(
            f"checkpoint state {path} was edited after graphswap wrote it ({problem}); graphswap "
            f"resumes only the state it wrote: delete {directory} to start over")
    if state.get("format_version", STATE_FORMAT_VERSION) != STATE_FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint state {path} has format version {state['format_version']}; this "
            f"graphswap reads version {STATE_FORMAT_VERSION}: resume it with the graphswap that "
            f"wrote it, or delete {directory} to start over")
    return state


def epoch_folders(directory: Path) -> list[tuple[int, Path]]:
    found = []
    try:
        names = os.listdir(directory)
    except OSError:
        return found
    for name in names:
        match = EPOCH.match(name)
        if match and (directory / name).is_dir() and not (directory / name).is_symlink():
            found.append((int(match.group(1)), directory / name))
    return sorted(found)


def foreign_entries(directory: Path) -> list[str]:
    """What in `directory` has a checkpoint's name but was not written by graphswap (see the
    module docstring), each as "NAME (why)"."""
    found = []
    current = directory / CHECKPOINT_CURRENT
    linked = current.is_symlink() and EPOCH.match(os.readlink(current)) is not None
    if os.path.lexists(current) and not linked:
        found.append(f"{CHECKPOINT_CURRENT} (not graphswap's link to an epoch folder)")
    # a link current/NAME is graphswap's (dangling too: a clear-up killed after `current` went)
    plain = [name for name in FILES if os.path.lexists(directory / name) and not (
        (directory / name).is_symlink()
        and os.readlink(directory / name) == f"{CHECKPOINT_CURRENT}/{name}")]
    if plain and linked:
        found.extend(f"{name} (not graphswap's link through {CHECKPOINT_CURRENT})"
                     for name in plain)
    elif plain:   # the layout of an older graphswap: plain files whose state records them
        _, why = written_by_graphswap(directory)
        found.extend(f"{name} ({why})" for name in plain if why)
    folders = {folder.name for _, folder in epoch_folders(directory)}
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        names = []
    for name in names:
        if EPOCH.match(name) and name not in folders:
            found.append(f"{name} (not a folder graphswap wrote: a link or a file)")
    for _, folder in epoch_folders(directory):
        _, why = written_by_graphswap(folder)
        if why:
            found.append(f"{folder.name}/ ({why})")
    return found


def latest_checkpoint(directory) -> Checkpoint | None:
    """The newest complete checkpoint in `directory`, or None when it holds none.

    CheckpointError, leaving everything as it is, when the directory holds checkpoint names that
    graphswap did not write (foreign_entries).  `current` (a link to an epoch directory)
    decides; without it, plain files at the top (an older graphswap's layout, or a copy that
    followed the links) are read; else the newest epoch directory (a run killed while `current`
    was being switched).  CheckpointError for a state that cannot be read, was edited, or does
    not belong to its epoch directory."""
    directory = Path(directory)
    foreign = foreign_entries(directory)
    if foreign:
        raise CheckpointError(
            f"checkpoint directory {directory} holds {'; '.join(foreign[:4])}"
            f"{'; ...' if len(foreign) > 4 else ''}: graphswap did not write "
            f"{'them' if len(foreign) > 1 else 'it'}, so it neither resumes from nor replaces or "
            f"deletes {'them' if len(foreign) > 1 else 'it'} (not even with --force). Choose "
            f"another --checkpoint-dir, or move {'them' if len(foreign) > 1 else 'it'} out of "
            f"{directory}")
    current = directory / CHECKPOINT_CURRENT
    folder = None
    if current.is_symlink():
        target = os.readlink(current)
        if EPOCH.match(target) and (directory / target).is_dir():
            folder = directory / target
    if folder is None and (directory / CHECKPOINT_STATE).is_file() \
            and not (directory / CHECKPOINT_STATE).is_symlink():
        folder = directory
    if folder is None:
        complete = [path for _, path in epoch_folders(directory)
                    if (path / CHECKPOINT_STATE).is_file()]
        folder = complete[-1] if complete else None
    if folder is None:
        return None
    state = read_state(folder, directory)
    match = EPOCH.match(folder.name) if folder != directory else None
    if match and int(match.group(1)) != int(state["epoch"]):
        raise CheckpointError(
            f"checkpoint {folder} holds the state of epoch {state['epoch']}: the directory was "
            f"edited; delete {directory} to start over")
    return Checkpoint(directory, folder, state)

