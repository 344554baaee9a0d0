"""Output paths: validation before any work is done, default output names, and atomic writes.

Every output graphswap writes goes through `atomic_output`: a temporary file (or directory) beside
the destination, renamed over it only when complete, so an interrupted command never leaves a
half-written file, and an existing file is replaced only with `force`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from graphswap.errors import OutputPathError
from graphswap.native import missing_reason

#: what each command writes by default, beside its input: MODEL's stem + this
DEFAULT_SUFFIXES = {
    "convert": ".swapped.keras",
    "finetune": ".ft.keras",
    "sweep": ".kernel_map.json",
    "onnx": ".onnx",
    "onnx-kept-kernels": ".kept.onnx",
    "savedmodel": "_savedmodel",
}


def default_output_path(source, kind: str) -> Path:
    """The output a command writes when no -o/--output is given: beside `source`, named after it
    (e.g. model.keras -> model.swapped.keras for convert)."""
    source = Path(source)
    return source.with_name(f"{source.stem}{DEFAULT_SUFFIXES[kind]}")


#: what a saved model may be written as
MODEL_OUTPUT_SUFFIXES = (".keras", ".h5")


def _resolve(path) -> Path | None:
    """The absolute path with links resolved, or None for a symbolic link loop."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError):  # Python < 3.13 raises RuntimeError for a loop
        return None


def check_output_path(path, force: bool = False, inputs=(), suffixes=None) -> Path:
    """Validate an output path before any work is done; raise OutputPathError otherwise.

    `suffixes`, when given, are the allowed endings (e.g. (".json", ".csv"))."""
    path = Path(path)
    if suffixes is not None and path.suffix.lower() not in suffixes:
        raise OutputPathError(f"output {path} must end in {' or '.join(suffixes)}")
    resolved = _resolve(path)
    if resolved is None:
        raise OutputPathError(f"output {path} {missing_reason(path)}; remove it or choose another "
                              f"-o/--output")
    for source in inputs:
        if source is not None and _resolve(source) == resolved and not force:
            raise OutputPathError(
                f"output {path} is the input file; refusing to overwrite it (pass --force, or "
                f"choose another -o/--output)")
    if path.exists() and not force:
        raise OutputPathError(f"output {path} already exists; pass --force to overwrite it, or "
                              f"choose another -o/--output")
    parent = resolved.parent
    if parent.exists() and not parent.is_dir():
        raise OutputPathError(f"output {path}: {parent} is a file, not a directory; choose "
                              f"another -o/--output")
    if not parent.is_dir():
        raise OutputPathError(f"output directory {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK):
        raise OutputPathError(f"output directory {parent} is not writable")
    return path


@contextlib.contextmanager
def atomic_output(path, force: bool = False, suffix: str | None = None):
    """Yield a temporary path beside `path`; on success rename it over `path`, else remove it."""
    path = check_output_path(path, force)
    suffix = suffix if suffix is not None else "".join(path.suffixes[-1:])
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{suffix}",
                                        dir=path.resolve().parent)
    except OSError as exc:
        raise OutputPathError(
            f"cannot write in {path.resolve().parent}: {exc.strerror or exc}; choose a writable "
            f"-o/--output directory") from None
    os.close(fd)
    os.unlink(tmp_name)  # writers create it themselves (Keras refuses some existing targets)
    try:
        yield Path(tmp_name)
        if not os.path.exists(tmp_name):
            raise OutputPathError(f"nothing was written to {path}")
        os.replace(tmp_name, path)
    except OSError as exc:
        raise OutputPathError(f"writing {path} failed: {exc.strerror or exc}") from None
    finally:
        if os.path.isdir(tmp_name):
            shutil.rmtree(tmp_name, ignore_errors=True)
        elif os.path.exists(tmp_name):
            os.unlink(tmp_name)




def save_model(model, path, force: bool = False) -> Path:
    """Save a Keras model to `path` (.keras or .h5) atomically."""
    path = Path(path)
    if path.suffix not in MODEL_OUTPUT_SUFFIXES:
        raise OutputPathError(f"output {path} must end in .keras (or .h5 for legacy HDF5)")
    with atomic_output(path, force) as tmp:
        model.save(tmp)
    return path
