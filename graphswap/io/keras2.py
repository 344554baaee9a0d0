"""Reading models that are not Keras 3 archives: Keras 2 (tf.keras) SavedModel directories.

A Keras 2 SavedModel (written by tf.keras / tf_keras `model.save("dir")`) carries its architecture
in `keras_metadata.pb` (TF 2.5 on) or, written by TF 2.0-2.4, in `saved_model.pb`'s object graph
(each Keras object's SavedUserObject.metadata).  It is loaded with `tf_keras` (the optional extra
`graphswap[legacy]`), written to a temporary full-model HDF5 file, read back with the Keras 2 -> 3
translation (graphswap.io.legacy_hdf5 and legacy_config), and the two models are compared on a
deterministic sample batch: the translation is accepted only if their outputs agree to float32
round-off.

A SavedModel is a program: before tf_keras sees it, the directory is copied to an owner-only
temporary directory and the copy is checked and loaded (graphswap.io.savedmodel_program): an op
that does more than compute anywhere in its graphs and functions, or a `Lambda` layer (stored
Python code) at any depth of its Keras configs, is refused unless `safe_mode=False` (CLI: --unsafe).

Custom classes: only their Keras 3 versions are needed.  tf_keras revives a custom layer it has no
class for from the SavedModel itself (its traced functions and its saved config), which is enough
to run the original and to write the HDF5 file; Keras 3 then rebuilds the layer from the config
with the class the user supplies (custom_objects= / --custom-objects module.py), and the sample
batch comparison checks the rebuilt layer against the original's traced computation.  tf_keras
classes in the mapping are given to tf_keras only, Keras 3 classes to Keras 3 only.

Directories that are SavedModels but have no Keras metadata (Keras 3 `model.export()`,
`tf.saved_model.save`) hold graphs, not architectures: they are refused with what would work.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path

from graphswap.errors import GraphswapError, ModelLoadError
from graphswap.input_files import MAX_MODEL_JSON_DEPTH, load_json
from graphswap.io.savedmodel_program import (check_keras2_saved_model, private_copy,
                                              shown_as)
from graphswap.io.legacy_hdf5 import compile_training_config, emit, load_hdf5_model
from graphswap.io.legacy_reference import (TRANSLATION_TOLERANCE,  # noqa: F401 - its old home
                                           first_line, sample_batch, split_custom_objects,
                                           tf_keras_module, verify_translation)

KERAS_METADATA = "keras_metadata.pb"


def is_saved_model(path) -> bool:
    path = Path(path)
    return path.is_dir() and ((path / "saved_model.pb").is_file()
                              or (path / "saved_model.pbtxt").is_file())


def is_keras2_saved_model(path) -> bool:
    return is_saved_model(path) and ((Path(path) / KERAS_METADATA).is_file()
                                     or bool(_object_graph_metadata(path)))


#: SavedUserObject identifiers of Keras objects (tf_keras' KERAS_OBJECT_IDENTIFIERS' prefix)
KERAS_IDENTIFIER_PREFIX = "_tf_keras_"


def _object_graph_metadata(path) -> list[str]:
    """The Keras metadata TF 2.0-2.4 kept inside saved_model.pb (SavedUserObject.metadata of
    each Keras object; keras_metadata.pb came with TF 2.5); [] when there is none."""
    from tensorflow.core.protobuf import saved_model_pb2

    pb = Path(path) / "saved_model.pb"
    if not pb.is_file():
        return []
    saved = saved_model_pb2.SavedModel()
    try:
        saved.ParseFromString(pb.read_bytes())
    except Exception:  # noqa: BLE001 - a corrupt protobuf: TensorFlow's loader says so later
        return []
    found = []
    for graph in saved.meta_graphs:
        for node in graph.object_graph_def.nodes:
            if node.WhichOneof("kind") == "user_object" and node.user_object.metadata and \
                    node.user_object.identifier.startswith(KERAS_IDENTIFIER_PREFIX):
                found.append(node.user_object.metadata)
    return found


def _metadata_records(path) -> list[dict]:
    """The JSON record of every saved Keras object: from keras_metadata.pb, or (TF <= 2.4) from
    saved_model.pb's object graph."""
    if not (Path(path) / KERAS_METADATA).is_file():
        documents = _object_graph_metadata(path)
    else:
        documents = [node.metadata for node in _keras_metadata(path).nodes]
    records = []
    for document in documents:
        try:
            record = load_json(document, f"{path}: a Keras object's metadata", ModelLoadError,
                               MAX_MODEL_JSON_DEPTH)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _metadata_class_names(path) -> list[str]:
    """Class names recorded in the Keras metadata (one JSON document per saved object)."""
    return [str(record["class_name"]) for record in _metadata_records(path)
            if record.get("class_name")]


def _training_config(path):
    """The model's training configuration from its metadata (the root object's), or None."""
    for record in _metadata_records(path):
        if isinstance(record.get("training_config"), dict):
            return record["training_config"]
    return None


def _keras_metadata(path):
    try:
        from tf_keras.src.protobuf import saved_metadata_pb2
    except ImportError:  # pragma: no cover - older tf_keras layouts
        from tf_keras.protobuf import saved_metadata_pb2  # type: ignore
    metadata = saved_metadata_pb2.SavedMetadata()
    try:
        metadata.ParseFromString((Path(path) / KERAS_METADATA).read_bytes())
    except Exception as exc:  # noqa: BLE001 - a corrupt protobuf
        raise ModelLoadError(f"{path}: {KERAS_METADATA} is not readable ({exc})") from None
    return metadata


saved_model_layer_classes = _metadata_class_names


def _import_tf_keras():
    tf_keras = tf_keras_module()
    if tf_keras is None:
        raise ModelLoadError(
            "reading a Keras 2 SavedModel needs tf_keras, the Keras 2 package matching your "
            "TensorFlow: pip install 'graphswap[legacy]' (or pip install tf_keras)")
    return tf_keras


def load_keras2_saved_model(path, custom_objects=None, safe_mode: bool = True,
                            compile: bool = False, check_batch: int = 4):  # noqa: A002
    """Load a Keras 2 SavedModel directory as a Keras 3 model with the same weights.

    Raises ModelLoadError with what is wrong and what would work: not a SavedModel, an
    inference-only SavedModel (no Keras metadata), tf_keras missing, a Lambda layer in safe mode,
    custom classes not supplied, a model Keras 3 cannot rebuild, or a translation whose outputs
    differ from the original's.  With `compile`, the saved training configuration (loss,
    metrics, optimizer settings; not the optimizer's state) is rebuilt for Keras 3, what cannot
    be with a LegacyModelWarning note (graphswap.io.legacy_hdf5).
    """
    path = Path(path)
    if not is_saved_model(path):
        raise ModelLoadError(
            f"{path} is a directory but not a SavedModel (no saved_model.pb); expected a .keras or "
            f".h5 file, or a Keras 2 SavedModel directory")
    if not is_keras2_saved_model(path):
        raise ModelLoadError(
            f"{path} is an inference-only SavedModel (a TensorFlow graph with no Keras "
            f"architecture: {KERAS_METADATA} is missing), as written by Keras 3 model.export() or "
            f"tf.saved_model.save(); graphswap needs the layers. Convert the model it was exported "
            f"from (.keras or full-model .h5), a SavedModel written by graphswap export --format "
            f"savedmodel, or a Keras 2 SavedModel written by tf.keras model.save('dir')")
    tf_keras = _import_tf_keras()
    old_objects, new_objects = split_custom_objects(custom_objects, tf_keras)
    # a SavedModel is a program: its private copy is checked (ops, nested Keras configs) and
    # that copy, not the directory, is what tf_keras loads (graphswap.io.savedmodel_program)
    with private_copy(path) as copy:
        check_keras2_saved_model(copy, path, safe_mode)
        try:
            with tf_keras.utils.custom_object_scope(old_objects):
                original = tf_keras.models.load_model(str(copy), compile=False)
        except GraphswapError as exc:
            raise shown_as(exc, copy, path) from None
        except Exception as exc:  # noqa: BLE001 - tf_keras raises many types
            raise ModelLoadError(f"tf_keras cannot load the SavedModel {path}: "
                                 f"{type(exc).__name__}: "
                                 f"{first_line(exc).replace(str(copy), str(path))}") from None
    with tempfile.TemporaryDirectory(prefix="graphswap-keras2-") as scratch:
        h5_path = os.path.join(scratch, "model.h5")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "HDF5 is legacy": intended, temporary file
                original.save(h5_path, save_format="h5", include_optimizer=False)
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(
                f"{path}: the Keras 2 model cannot be written as full-model HDF5 for translation "
                f"({type(exc).__name__}: {first_line(exc)}); subclassed Keras 2 models cannot be "
                f"translated, rebuild them as Functional/Sequential models") from None
        try:
            model = load_keras_file(Path(h5_path), new_objects or None, safe_mode, False)
        except ModelLoadError as exc:
            raise ModelLoadError(str(exc).replace(h5_path, f"{path} (translated to Keras 3)")) \
                from None
    _verify_translation(path, original, model, check_batch)
    training = _training_config(path) if compile else None
    if training:
        notes: list[str] = []
        compile_training_config(model, training, new_objects, notes)
        emit(notes)
    return model


def load_keras_file(path, custom_objects=None, safe_mode: bool = True,
                    compile: bool = False):  # noqa: A002
    """The HDF5 file tf_keras wrote, read with the Keras 2 -> 3 translation (legacy_hdf5); the
    caller compares it with the SavedModel's own model, so not with tf_keras' load of the file."""
    return load_hdf5_model(path, custom_objects, safe_mode, compile, reference=False)


def _verify_translation(path, original, model, check_batch) -> float:
    """Compare the Keras 2 and Keras 3 models on a deterministic batch; ModelLoadError if apart."""
    return verify_translation(path, original, model, sample_batch(model, check_batch))
