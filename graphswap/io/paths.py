"""Output paths: validation before any work is done, default output names, and atomic writes.

Every output graphswap writes goes through `atomic_output`: a temporary file (or directory) beside
the destination, renamed over it only when complete, so an interrupted command never leaves a
half-written file, and an existing file is replaced only with `force`.  A model is written as
`.keras`, `.h5` or - for a path without a suffix or ending in `/` - a graphswap SavedModel
directory (`model_output_format`; the writer is graphswap.io.saving.save_model).
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
    "explore": ".front.json",
    "onnx": ".onnx",
    "onnx-kept-kernels": ".kept.onnx",
    "savedmodel": "_savedmodel",
}


#: what convert and finetune write by default when MODEL is a graphswap SavedModel directory: a
#: directory again, named after MODEL without its "_savedmodel" ending + this
DIRECTORY_SUFFIXES = {
    "convert": "_swapped_savedmodel",
    "finetune": "_ft_savedmodel",
}
SAVEDMODEL_ENDING = "_savedmodel"


def default_output_path(source, kind: str, directory: bool = False) -> Path:
    """The output a command writes when no -o/--output is given: beside `source`, named after it
    (e.g. model.keras -> model.swapped.keras for convert).  With `directory` (MODEL is a graphswap
    SavedModel directory) convert and finetune write a directory: lenet5_savedmodel ->
    lenet5_ft_savedmodel, l_sm -> l_sm_ft_savedmodel."""
    source = Path(source)
    if directory and kind in DIRECTORY_SUFFIXES:
        base = source.name
        if base.endswith(SAVEDMODEL_ENDING) and len(base) > len(SAVEDMODEL_ENDING):
            base = base[:-len(SAVEDMODEL_ENDING)]
        return source.with_name(f"{base}{DIRECTORY_SUFFIXES[kind]}")
    return source.with_name(f"{source.stem}{DEFAULT_SUFFIXES[kind]}")


#: what a saved model may be written as (besides a graphswap SavedModel directory)
MODEL_OUTPUT_SUFFIXES = (".keras", ".h5")
MODEL_OUTPUT_FORMATS = {".keras": "keras", ".h5": "h5"}


def model_output_format(path) -> str:
    """How a model is written to `path`: "keras" (.keras), "h5" (.h5) or "savedmodel" (a graphswap
    SavedModel directory: a path without a suffix, ending in '/', or an existing directory).
    OutputPathError for anything else (e.g. model.kera), so a typo never becomes a directory."""
    text = os.fspath(path)
    candidate = Path(text)
    if text.endswith(("/", os.sep)) or candidate.is_dir():
        return "savedmodel"
    suffix = candidate.suffix.lower()
    if suffix in MODEL_OUTPUT_FORMATS:
        return MODEL_OUTPUT_FORMATS[suffix]
    if suffix == "":
        return "savedmodel"
    raise OutputPathError(
        f"output (-o/--output) {text} must end in .keras or .h5 (legacy HDF5), or name a SavedModel "
        f"directory (no suffix, or ending in '/', e.g. {candidate.stem}_savedmodel/)")


def check_model_output_path(path, force: bool = False, inputs=()) -> Path:
    """check_output_path for a model output: also checks it names a format (model_output_format)."""
    model_output_format(path)
    return check_output_path(path, force, inputs)


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
        _rename_into_place(tmp_name, path)
    except OSError as exc:
        raise OutputPathError(f"writing {path} failed: {exc.strerror or exc}") from None
    finally:
        _remove(tmp_name)


def _remove(name) -> None:
    if os.path.isdir(name) and not os.path.islink(name):
        shutil.rmtree(name, ignore_errors=True)
    elif os.path.lexists(name):
        os.unlink(name)


def _rename_into_place(tmp_name: str, path: Path) -> None:
    """Rename the finished `tmp_name` to `path`.  A file replaces a file atomically; a directory
    (or anything replacing one) cannot be renamed over a non-empty directory, so the old output is
    first renamed aside and removed only once the new one is in place (restored if that fails)."""
    if not (os.path.isdir(tmp_name) or os.path.isdir(path)) or not os.path.lexists(path):
        os.replace(tmp_name, path)
        return
    aside = tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old",
                             dir=path.resolve().parent)
    os.rmdir(aside)
    os.replace(path, aside)
    try:
        os.replace(tmp_name, path)
    except OSError:
        os.replace(aside, path)
        raise
    _remove(aside)
