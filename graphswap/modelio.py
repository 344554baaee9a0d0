"""Loading models from disk with clear errors, and saving them atomically.

Loading recognises Keras 3 `.keras` archives, legacy full-model HDF5 files and Keras 2 SavedModel
directories (through graphswap.legacy and tf_keras); each way a file can
fail to be a usable model (missing, empty, not a model, weights-only HDF5, a directory) gets one
message that says what was wrong and what would work.  Saving writes to a temporary file beside the
destination and renames it, so an interrupted save never leaves a half-written model, and never
replaces an existing file unless `force` is set.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import zipfile
from pathlib import Path

from graphswap.errors import ModelLoadError, OutputPathError

MODEL_SUFFIXES = (".keras", ".h5", ".hdf5")


def _import_custom_objects(path) -> dict:
    """Classes from a user's Python module (for --custom-objects): every public class it defines."""
    import importlib.util
    import inspect

    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    if spec is None or not os.path.isfile(path):
        raise ModelLoadError(f"custom objects module not found: {path}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - report the user's module error in one line
        raise ModelLoadError(f"importing custom objects from {path} failed: "
                             f"{type(exc).__name__}: {exc}") from None
    return {name: obj for name, obj in vars(module).items()
            if not name.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj))}


def _is_hdf5(path: Path) -> bool:
    with open(path, "rb") as handle:
        return handle.read(8) == b"\x89HDF\r\n\x1a\n"


def _hdf5_has_architecture(path: Path) -> bool:
    import h5py

    with h5py.File(path, "r") as handle:
        return "model_config" in handle.attrs


def load_model(path, custom_objects=None, safe_mode: bool = True, compile: bool = True):
    """Load a Keras model (.keras or full-model .h5), raising ModelLoadError with a clear message."""
    import keras

    import graphswap.layers  # noqa: F401 - registers the swapped layers for deserialisation

    path = Path(path)
    if isinstance(custom_objects, (str, os.PathLike)):
        custom_objects = _import_custom_objects(custom_objects)
    if not path.exists():
        raise ModelLoadError(f"model file not found: {path}")
    if path.is_dir():
        return _load_directory(path, custom_objects, safe_mode, compile)
    if path.stat().st_size == 0:
        raise ModelLoadError(f"{path} is empty (0 bytes); expected a Keras model (.keras or .h5)")
    if _is_hdf5(path):
        if not _hdf5_has_architecture(path):
            raise ModelLoadError(
                f"{path} is a weights-only HDF5 file: it holds weights but no architecture. Save "
                f"the full model (model.save('model.keras') or model.save('model.h5')) and convert "
                f"that, or rebuild the architecture in Python and call model.load_weights()")
        return _keras_load(path, custom_objects, safe_mode, compile)
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
        if "config.json" not in names:
            raise ModelLoadError(
                f"{path} is a zip archive but not a Keras model (no config.json inside); expected a "
                f"file written by model.save('model.keras')")
        if path.suffix != ".keras":
            raise ModelLoadError(f"{path} looks like a Keras archive; rename it to end in .keras")
        return _keras_load(path, custom_objects, safe_mode, compile)
    if path.suffix == ".keras":
        raise ModelLoadError(
            f"{path} is not a valid Keras archive: the file is corrupt or truncated (a .keras file "
            f"is a zip archive written by model.save); re-save or re-copy the model")
    raise ModelLoadError(
        f"{path} is not a Keras model: expected a .keras archive (zip) or a full-model HDF5 (.h5) "
        f"file, or a Keras 2 SavedModel directory")


def _require_built(model, path: Path):
    """Refuse a Sequential model saved before it was built: it has no input shape, no weights."""
    import keras

    if not isinstance(model, keras.Sequential):
        return model  # Functional models always have inputs; subclassed ones are refused later
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        inputs = None
    if not inputs:
        raise ModelLoadError(
            f"{path} holds an unbuilt model ({model.name!r}: no input shape and no weights); it "
            f"was saved before it was built. Give it an input shape (keras.Input(shape) as the "
            f"first layer, model.build(input_shape), or call it on data), train it, and save it "
            f"again")
    return model


def _keras_load(path: Path, custom_objects, safe_mode, compile):
    import keras

    try:
        model = keras.models.load_model(path, custom_objects=custom_objects, safe_mode=safe_mode,
                                        compile=compile)
    except (ModelLoadError,) as exc:
        raise exc
    except Exception as exc:  # noqa: BLE001 - translate Keras' many failure types into one message
        cause = _graphswap_cause(exc)
        if cause is not None:
            raise cause from None
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = ""
        if "Lambda" in str(exc) or "safe_mode" in str(exc):
            hint = (" The model contains a Lambda layer (Python code); load it only if you trust "
                    "the file, with safe_mode=False (CLI: --unsafe).")
        elif "Could not locate" in str(exc) or "Unknown layer" in str(exc):
            hint = (" The model uses custom classes; pass them with custom_objects= "
                    "(CLI: --custom-objects module.py).")
        raise ModelLoadError(f"cannot load model {path}: {type(exc).__name__}: {message}.{hint}") \
            from None
    return _require_built(model, path)


def _graphswap_cause(exc: BaseException):
    """The GraphswapError behind an exception Keras wrapped (deserialisation re-raises as
    TypeError), so an untrusted kernel surfaces as KernelTrustError, not a generic load failure."""
    from graphswap.errors import GraphswapError

    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, GraphswapError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _load_directory(path: Path, custom_objects, safe_mode, compile):
    if not (path / "saved_model.pb").is_file():
        raise ModelLoadError(
            f"{path} is a directory but not a SavedModel (no saved_model.pb); expected a .keras or "
            f".h5 file, or a Keras 2 SavedModel directory")
    from graphswap import legacy

    return legacy.load_keras2_saved_model(path, custom_objects=custom_objects,
                                          safe_mode=safe_mode, compile=compile)


def check_output_path(path, force: bool = False, inputs=()) -> Path:
    """Validate an output path before any work is done; raise OutputPathError otherwise."""
    path = Path(path)
    resolved = path.resolve()
    for source in inputs:
        if source is not None and Path(source).resolve() == resolved and not force:
            raise OutputPathError(
                f"output {path} is the input file; refusing to overwrite it (pass --force, or "
                f"choose another -o/--output)")
    if path.exists() and not force:
        raise OutputPathError(f"output {path} already exists; pass --force to overwrite it, or "
                              f"choose another -o/--output")
    parent = resolved.parent
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
            import shutil

            shutil.rmtree(tmp_name, ignore_errors=True)
        elif os.path.exists(tmp_name):
            os.unlink(tmp_name)


def save_model(model, path, force: bool = False) -> Path:
    """Save a Keras model to `path` (.keras or .h5) atomically."""
    path = Path(path)
    if path.suffix not in (".keras", ".h5"):
        raise OutputPathError(f"output {path} must end in .keras (or .h5 for legacy HDF5)")
    with atomic_output(path, force) as tmp:
        model.save(tmp)
    return path
