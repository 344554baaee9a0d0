"""Output paths: validation before any work is done, default output names, and atomic writes.

Every output graphswap writes goes through `atomic_output`: a temporary file (or directory) beside
the destination, moved into place only when complete, so an interrupted command never leaves a
half-written output.  Without `force` the move is a no-replace rename (renameat2 RENAME_NOREPLACE,
else a hard link or an exclusive mkdir): of two commands writing the same output, exactly one
wins and the other gets a clear error - nothing is silently replaced.  With `force` an output is
replaced only if it is a file or a graphswap SavedModel directory (its manifest present, nothing
else in it) that holds no input: never a directory graphswap did not write.

The temporaries, the moves and the clean-up of what a killed run left: graphswap.io.atomic.

A model is written as `.keras`, `.h5` (lower case: Keras reopens no `.H5`) or - for a path without a
suffix or ending in `/` - a graphswap SavedModel directory (`model_output_format`; the writer is
graphswap.io.saving.save_model).
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from graphswap.errors import OutputPathError
from graphswap.io.atomic import (clean_stale_temporaries, fsync_tree, hdf5_errno, make_temporary,
                                 name_max, oserror_message, publish, remove_entry, write_failed)
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

#: what a SavedModel directory graphswap wrote holds at its top level (--force replaces only that)
SAVEDMODEL_ENTRIES = frozenset({"saved_model.pb", "variables", "assets", "fingerprint.pb",
                                "keras_metadata.pb"})


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


#: what a saved model may be written as (besides a graphswap SavedModel directory); lower case only:
#: Keras reopens model.H5 / model.KERAS as neither
MODEL_OUTPUT_SUFFIXES = (".keras", ".h5")
MODEL_OUTPUT_FORMATS = {".keras": "keras", ".h5": "h5"}


def _names_directory(text: str) -> bool:
    return text.endswith(("/", os.sep)) or (os.altsep is not None and text.endswith(os.altsep))


def model_output_format(path) -> str:
    """How a model is written to `path`: "keras" (.keras), "h5" (.h5) - lower case: Keras reopens
    no .H5 / .KERAS file, so those are refused with the name to use - or "savedmodel" (a
    graphswap SavedModel directory: a path ending in '/' - dots in the name
    are fine then, e.g. out/kws.ft_savedmodel/ -, a path without a suffix, or an existing
    directory).  OutputPathError for anything else (e.g. model.kera), so a typo never becomes a
    directory."""
    text = os.fspath(path)
    candidate = Path(text)
    if _names_directory(text) or os.path.isdir(text):
        return "savedmodel"
    suffix = candidate.suffix
    if suffix in MODEL_OUTPUT_FORMATS:
        return MODEL_OUTPUT_FORMATS[suffix]
    if suffix.lower() in MODEL_OUTPUT_FORMATS:
        raise OutputPathError(
            f"output (-o/--output) {text}: Keras recognises a model file only by the lower-case "
            f"ending {suffix.lower()} (a {suffix} file could not be reopened); write "
            f"{candidate.with_suffix(suffix.lower())} instead")
    if suffix == "":
        return "savedmodel"
    raise OutputPathError(
        f"output (-o/--output) {text} must end in .keras or .h5 (legacy HDF5), or name a SavedModel "
        f"directory (no suffix, or ending in '/': {text}/ writes a directory of that name)")


def check_model_output_path(path, force: bool = False, inputs=()):
    """check_output_path for a model output: also checks it names a format (model_output_format).
    Returns the path to pass on to save_model: a Path, or the text itself when it ends in '/'
    (a Path would drop the slash that makes out/kws.ft_savedmodel/ a directory)."""
    fmt = model_output_format(path)
    checked = check_output_path(path, force, inputs, directory=fmt == "savedmodel")
    text = os.fspath(path)
    return text if _names_directory(text) else checked


def _resolve(path) -> Path | None:
    """The absolute path with links resolved, or None for a symbolic link loop."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError):  # Python < 3.13 raises RuntimeError for a loop
        return None


def _first_missing(parent: str) -> str:
    """The first component of `parent` (absolute, as written) that is not an existing directory."""
    parts = Path(parent).parts
    for i in range(1, len(parts) + 1):
        partial = os.path.join(*parts[:i])
        if not os.path.isdir(partial):
            return partial
    return parent


def _is_graphswap_saved_model(directory: Path) -> bool:
    # the manifest graphswap's SavedModel writer puts in assets/ (graphswap.io.dual_savedmodel)
    from graphswap.io.dual_savedmodel import MANIFEST_FILE, embedded_dir
    return (embedded_dir(directory) / MANIFEST_FILE).is_file()


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:   # bytes the file system gave that are no UTF-8 (surrogates)
        return False
    return True


def _first_undecodable(text: str) -> int:
    """The first byte of `text`'s file-system encoding that is no UTF-8."""
    raw = os.fsencode(text)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return raw[exc.start]
    return 0


def _within(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def _check_replaceable(path: Path, target: Path, directory: bool | None, inputs) -> None:
    """With --force: `target` (what `path` names, links followed) may be replaced only if it is a
    file, or a graphswap SavedModel directory holding nothing else and no input, replaced by a
    directory output."""
    if not target.is_dir():
        return
    shown = f"{path} (a link to {target})" if os.path.islink(path) else f"{path}"
    for source in inputs:
        resolved = _resolve(source) if source is not None else None
        if resolved is not None and _within(resolved, target):
            raise OutputPathError(
                f"output {shown} is a directory holding the input {source}; --force never "
                f"replaces a directory with an input in it; choose another -o/--output")
    if not _is_graphswap_saved_model(target):
        try:
            held = sorted(os.listdir(target))
        except OSError:
            held = []
        listed = ", ".join(held[:5]) + (", ..." if len(held) > 5 else "")
        raise OutputPathError(
            f"output {shown} is a directory graphswap did not write "
            f"({f'it holds {listed}' if held else 'an empty directory'}); --force replaces only a "
            f"file or a graphswap SavedModel directory; choose another -o/--output (or remove the "
            f"directory yourself)")
    if directory is False:
        raise OutputPathError(
            f"output {shown} is a graphswap SavedModel directory, and this output is a file; "
            f"choose another -o/--output")
    extra = sorted(set(os.listdir(target)) - SAVEDMODEL_ENTRIES)
    if extra:
        raise OutputPathError(
            f"output {shown} is a graphswap SavedModel directory that also holds "
            f"{', '.join(extra[:5])}{', ...' if len(extra) > 5 else ''}, which graphswap did not "
            f"write; --force will not delete them: move them out, or choose another -o/--output")


def check_output_path(path, force: bool = False, inputs=(), suffixes=None,
                      directory: bool | None = None) -> Path:
    """Validate an output path before any work is done; raise OutputPathError otherwise.

    `suffixes`, when given, are the allowed endings (e.g. (".json", ".csv")).  `directory`: the
    output is a directory (True), a file (False) or either (None; a path ending in '/' is a
    directory).  Checks: the name fits the file system (ENAMETOOLONG is
    said as such), the parent exists as written (dir/missing/../x.keras is refused here, not after
    the work), an existing output only with `force` and only if replaceable (a file, or a
    graphswap SavedModel directory without inputs or foreign files in it), a link's target
    directory exists.  What a killed earlier run left for this output is cleaned up first."""
    text = os.fspath(path)
    if directory is None and _names_directory(text):
        directory = True
    path = Path(text)
    if suffixes is not None and path.suffix.lower() not in suffixes:
        raise OutputPathError(f"output {path} must end in {' or '.join(suffixes)}")
    if not path.name or path.name in (".", ".."):
        raise OutputPathError(f"output {text} names no file or directory; give a name, e.g. "
                              f"{os.path.join(text, 'model_savedmodel')}")
    absolute = os.path.join(os.getcwd(), text.rstrip("/" + (os.altsep or "")) or "/")
    parent = os.path.dirname(absolute)
    if not os.path.isdir(parent):
        missing = _first_missing(parent)
        if os.path.lexists(missing) and not os.path.islink(missing):
            raise OutputPathError(f"output {text}: {missing} is a file, not a directory; choose "
                                  f"another -o/--output")
        directory = os.path.dirname(text) or "."
        reason = missing_reason(missing)
        if os.path.normpath(missing) == os.path.normpath(parent) and reason == "does not exist":
            raise OutputPathError(f"output directory {directory} does not exist; create it first "
                                  f"or choose another -o/--output")
        raise OutputPathError(
            f"output directory {directory} does not exist: {missing} {reason} (a path is "
            f"followed as written, '..' included); create it first or choose another -o/--output")
    limit = name_max(parent)
    if len(os.fsencode(path.name)) > limit or len(os.fsencode(absolute)) >= 4096:
        raise OutputPathError(
            f"output name is too long ({os.strerror(errno.ENAMETOOLONG)}): "
            f"{len(os.fsencode(path.name))} bytes in {path.name[:40]}..., this file system allows "
            f"{limit} per name; choose a shorter -o/--output")
    if directory and not _is_utf8(absolute):
        raise OutputPathError(
            f"output {text!r} is not UTF-8 text (a name with the byte "
            f"0x{_first_undecodable(absolute):02x}); TensorFlow writes a SavedModel directory "
            f"only under a UTF-8 path: name the output in UTF-8 (or write a .keras file)")
    resolved = _resolve(path)
    if resolved is None:
        raise OutputPathError(f"output {path} {missing_reason(path)}; remove it or choose another "
                              f"-o/--output")
    if not resolved.parent.is_dir():
        raise OutputPathError(f"output {path} is a symbolic link to {resolved}, whose directory "
                              f"{resolved.parent} does not exist; remove the link or choose "
                              f"another -o/--output")
    clean_stale_temporaries(resolved)
    for source in inputs:
        if source is not None and _resolve(source) == resolved and not force:
            raise OutputPathError(
                f"output {path} is the input file; refusing to overwrite it (pass --force, or "
                f"choose another -o/--output)")
    if os.path.lexists(path) or os.path.lexists(resolved):
        if not force:
            raise OutputPathError(f"output {path} already exists; pass --force to overwrite it, "
                                  f"or choose another -o/--output")
        _check_replaceable(path, resolved, directory, inputs)
    if not os.access(resolved.parent, os.W_OK):
        raise OutputPathError(f"output directory {resolved.parent} is not writable")
    try:   # what the write will do first (root passes os.access on a read-only file system)
        os.unlink(make_temporary(resolved, "", directory=False))
    except OSError as exc:
        raise OutputPathError(f"cannot write in {resolved.parent}: {oserror_message(exc)}; "
                              f"choose a writable -o/--output directory") from None
    return path


@contextlib.contextmanager
def atomic_output(path, force: bool = False, suffix: str | None = None):
    """Yield a temporary path beside `path`; on success move it into place, else remove it.

    Writers create the temporary themselves (it does not exist when yielded).  `suffix` is the
    temporary's ending (default: the output's, lower-cased - Keras decides the format by it);
    "" for a directory output.  Without `force` the move never replaces anything: an output
    that appeared meanwhile (another command) is an OutputPathError and stays as it is."""
    # the writer makes a directory only when told suffix="": a file never replaces a directory
    path = check_output_path(path, force, directory=suffix == "")
    target = _resolve(path)
    suffix = suffix if suffix is not None else path.suffix.lower()
    try:
        tmp_name = make_temporary(target, suffix, directory=False)
    except OSError as exc:
        raise OutputPathError(f"cannot write in {target.parent}: {oserror_message(exc)}; "
                              f"choose a writable -o/--output directory") from None
    os.unlink(tmp_name)  # writers create it themselves (Keras refuses some existing targets)
    try:
        yield Path(tmp_name)
        if not os.path.lexists(tmp_name):
            raise OutputPathError(f"nothing was written to {path}")
        fsync_tree(tmp_name)
        publish(tmp_name, target, replace=force, shown=path)
    except OSError as exc:
        raise write_failed(path, exc) from None
    except RuntimeError as exc:   # h5py says some failed writes of the HDF5 library so
        code = hdf5_errno(exc)
        if code is None:
            raise
        raise write_failed(path, OSError(code, os.strerror(code))) from None
    finally:
        with contextlib.suppress(OSError):
            remove_entry(tmp_name)
