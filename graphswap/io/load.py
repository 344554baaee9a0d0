"""Loading models from disk: Keras 3 `.keras` archives, legacy full-model HDF5 files, graphswap
SavedModel directories (graphswap.io.dual_savedmodel: recognised first, by their assets) and
Keras 2 SavedModel directories (through graphswap.io.keras2 and tf_keras).

Each way a file can fail to be a usable model (missing, empty, not a model, weights-only HDF5, a
directory that is not a SavedModel) gets one message that says what was wrong and what would work.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from graphswap.errors import ModelLoadError
from graphswap.input_files import require_regular
from graphswap.io import dual_savedmodel, keras2, legacy_archive
from graphswap.io.keras3 import check_archive_members, load_keras_file
from graphswap.io.legacy_hdf5 import is_hdf5, load_hdf5_model
from graphswap.native import missing_reason

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


def _hdf5_has_architecture(path: Path) -> bool:
    import h5py

    with h5py.File(path, "r") as handle:
        return "model_config" in handle.attrs


def load_model(path, custom_objects=None, safe_mode: bool = True, compile: bool = True):
    """Load a Keras model (.keras, full-model .h5, a graphswap SavedModel directory or a Keras 2
    SavedModel), raising ModelLoadError with a clear message."""
    path = Path(path)
    if isinstance(custom_objects, (str, os.PathLike)):
        custom_objects = _import_custom_objects(custom_objects)
    if not path.exists():
        reason = missing_reason(path)
        raise ModelLoadError(f"model file not found: {path}" if reason == "does not exist" else
                             f"model file {path} {reason}; expected a .keras or .h5 file")
    if path.is_dir():
        return _load_directory(path, custom_objects, safe_mode, compile)
    require_regular(path, "model file", ModelLoadError)  # a FIFO, a device: never waited on
    if path.stat().st_size == 0:
        raise ModelLoadError(f"{path} is empty (0 bytes); expected a Keras model (.keras or .h5)")
    if is_hdf5(path):  # by the signature: older Keras wrote HDF5 under any name, .keras included
        if not _hdf5_has_architecture(path):
            raise ModelLoadError(
                f"{path} is a weights-only HDF5 file: it holds weights but no architecture. Save "
                f"the full model (model.save('model.keras') or model.save('model.h5')) and convert "
                f"that, or rebuild the architecture in Python and call model.load_weights()")
        return load_hdf5_model(path, custom_objects, safe_mode, compile)
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
        if "config.json" not in names:
            raise ModelLoadError(
                f"{path} is a zip archive but not a Keras model (no config.json inside); expected a "
                f"file written by model.save('model.keras')")
        if path.suffix != ".keras":
            raise ModelLoadError(f"{path} looks like a Keras archive; rename it to end in .keras")
        check_archive_members(path)
        if legacy_archive.written_by_keras2(path):
            return legacy_archive.load_keras2_archive(path, custom_objects, safe_mode, compile)
        return load_keras_file(path, custom_objects, safe_mode, compile)
    if path.suffix == ".keras":
        raise ModelLoadError(
            f"{path} is not a valid Keras archive: the file is corrupt or truncated (a .keras file "
            f"is a zip archive written by model.save); re-save or re-copy the model")
    raise ModelLoadError(
        f"{path} is not a Keras model: expected a .keras archive (zip) or a full-model HDF5 (.h5) "
        f"file, a graphswap SavedModel or a Keras 2 SavedModel directory")

def _load_directory(path: Path, custom_objects, safe_mode, compile):
    if dual_savedmodel.is_graphswap_saved_model(path):
        return dual_savedmodel.load_dual_saved_model(path, custom_objects=custom_objects,
                                                     safe_mode=safe_mode, compile=compile)
    if not (path / "saved_model.pb").is_file():
        raise ModelLoadError(
            f"{path} is a directory but not a SavedModel (no saved_model.pb); expected a .keras or "
            f".h5 file, a graphswap SavedModel or a Keras 2 SavedModel directory")
    return keras2.load_keras2_saved_model(path, custom_objects=custom_objects,
                                          safe_mode=safe_mode, compile=compile)

