"""`.keras` archives written by Keras 2 (tf.keras 2.13-2.15, tf_keras): translated for Keras 3.

Keras 2 wrote the same zip layout as Keras 3 (config.json, metadata.json, model.weights.h5), but
its config names Keras 2 modules (`keras.src.engine.functional`, `tf_keras.src.layers...`),
Keras 2 options and `TFOpLambda` layers, so Keras 3 cannot rebuild it ("Could not locate class
'Functional'").  The config is put in the legacy form Keras 3 reads for HDF5 files (the layers'
module names removed), translated like an HDF5 file's (graphswap.io.legacy_config), and written
with the archive's other members into a private temporary archive that Keras 3 loads in safe
mode, uncompiled; with `compile`, the saved compile config is rebuilt by
graphswap.io.legacy_hdf5.compile_training_config (notes for what cannot be).  Where tf_keras is
installed, the model is compared with tf_keras' own load of the archive
(graphswap.io.legacy_reference).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from graphswap.errors import ModelLoadError
from graphswap.io import legacy_config
from graphswap.io.keras3 import load_keras_file
from graphswap.io.legacy_hdf5 import compile_training_config, emit
from graphswap.io.legacy_reference import check_against_tf_keras
from graphswap.io.stored_code import check_keras_configs
from graphswap.io.tf_op_layer import LAYER_CLASSES

#: the top-level model classes: (module, class_name, registered_name) as Keras 3 writes them
TOP_LEVEL = {"Functional": ("keras.src.models.functional", "Functional", "Functional"),
             "Model": ("keras.src.models.functional", "Functional", "Functional"),
             "Sequential": ("keras", "Sequential", None)}


def _keras_version(archive: zipfile.ZipFile) -> str:
    """The `keras_version` the archive's metadata.json records ("" when it records none)."""
    if "metadata.json" not in archive.namelist():
        return ""
    try:
        metadata = json.loads(archive.read("metadata.json"))
    except ValueError:
        return ""
    return str(metadata.get("keras_version", "")) if isinstance(metadata, dict) else ""


def written_by_keras2(path) -> bool:
    """True for a .keras archive whose metadata.json says Keras 2 wrote it."""
    try:
        with zipfile.ZipFile(path) as archive:
            return _keras_version(archive).startswith("2")
    except (zipfile.BadZipFile, OSError):
        return False


def _legacy_form(entry):
    """An archive config in the legacy (HDF5) form: the graph's layers (nested models' too)
    without module / registered names, so Keras 3 reads them with its legacy reader.  Layers
    inside wrappers (Bidirectional, TimeDistributed) keep theirs: Keras 3 reads those with its
    current reader, which resolves Keras 2's `keras.layers` module names."""
    config = entry.get("config") if isinstance(entry, dict) else None
    if isinstance(config, dict) and isinstance(config.get("layers"), list):
        for child in config["layers"]:
            if isinstance(child, dict):
                child.pop("module", None)
                child.pop("registered_name", None)
                _legacy_form(child)
    return entry


def translate_archive_config(config: dict, notes, version: str | None = None) \
        -> tuple[dict, dict | None]:
    """(the translated config Keras 3 loads, the Keras 2 compile config or None); `version`: the
    archive's keras_version."""
    if not isinstance(config, dict) or config.get("class_name") not in TOP_LEVEL:
        raise ModelLoadError(
            f"a Keras 2 archive whose model is a {config.get('class_name') if isinstance(config, dict) else type(config).__name__} "
            f"cannot be translated: only Functional and Sequential models can; rebuild the model "
            f"in Keras 3")
    compile_config = config.pop("compile_config", None)
    config.pop("build_config", None)
    legacy = legacy_config.translate_model_config(_legacy_form(config), notes, version)
    legacy["module"], legacy["class_name"], legacy["registered_name"] = \
        TOP_LEVEL[config["class_name"]]
    return legacy, compile_config


def load_keras2_archive(path: Path, custom_objects=None, safe_mode: bool = True,
                        compile: bool = True):  # noqa: A002
    """A Keras 2 `.keras` archive as a Keras 3 model (ModelLoadError when it cannot be)."""
    notes: list[str] = []
    with zipfile.ZipFile(path) as archive:
        try:
            config = json.loads(archive.read("config.json"))
        except ValueError as exc:
            raise ModelLoadError(f"{path}: its config.json is not JSON ({exc}); re-save the "
                                 f"model") from None
        if safe_mode:  # stored Python code at any depth, before the translation touches it
            check_keras_configs([("config.json", config)], path)
        translated, compile_config = translate_archive_config(config, notes,
                                                              _keras_version(archive))
        objects = {**LAYER_CLASSES, **(custom_objects or {})}
        with tempfile.TemporaryDirectory(prefix="graphswap-keras2-archive-") as scratch:
            copy = Path(scratch) / "model.keras"
            with zipfile.ZipFile(copy, "w", zipfile.ZIP_STORED) as target:
                for info in archive.infolist():
                    if info.filename == "config.json":
                        continue
                    with archive.open(info) as source, target.open(info.filename, "w") as sink:
                        shutil.copyfileobj(source, sink, 1 << 20)
                target.writestr("config.json", json.dumps(translated))
            os.chmod(copy, 0o600)
            try:
                model = load_keras_file(copy, objects, safe_mode, False)
            except ModelLoadError as exc:
                raise ModelLoadError(str(exc).replace(str(copy), f"{path} (a Keras 2 archive)")) \
                    from None
    check_against_tf_keras(path, model, custom_objects, safe_mode, notes, archive=True)
    if compile and isinstance(compile_config, dict):
        training = dict(compile_config)
        training.setdefault("optimizer_config", training.pop("optimizer", None))
        compile_training_config(model, training, objects, notes)
    emit(notes)
    return model
