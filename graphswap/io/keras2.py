"""Reading models that are not Keras 3 archives: Keras 2 (tf.keras) SavedModel directories.

A Keras 2 SavedModel (written by tf.keras / tf_keras `model.save("dir")`) carries its architecture
in `keras_metadata.pb`.  It is loaded with `tf_keras` (the optional extra `graphswap[legacy]`),
written to a temporary full-model HDF5 file, read back with Keras 3's legacy-HDF5 loader (which
translates the Keras 2 config), and the two models are compared on a deterministic sample batch:
the translation is accepted only if their outputs agree to float32 round-off.

Keras safe mode is respected before any of the model's Python is deserialised: a SavedModel whose
metadata names a `Lambda` layer is refused unless `safe_mode=False` (CLI: --unsafe).

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

import keras
import numpy as np

from graphswap.errors import GraphswapError, ModelLoadError
from graphswap.io.keras3 import load_keras_file
from graphswap.swap.compare import compare_outputs, sample_inputs

KERAS_METADATA = "keras_metadata.pb"
#: largest |keras2 - keras3| accepted, relative to max(1, |output|)
TRANSLATION_TOLERANCE = 1e-5


def is_saved_model(path) -> bool:
    path = Path(path)
    return path.is_dir() and ((path / "saved_model.pb").is_file()
                              or (path / "saved_model.pbtxt").is_file())


def is_keras2_saved_model(path) -> bool:
    return is_saved_model(path) and (Path(path) / KERAS_METADATA).is_file()


def _metadata_class_names(path) -> list[str]:
    """Class names recorded in keras_metadata.pb (one JSON document per saved object)."""
    try:
        from tf_keras.src.protobuf import saved_metadata_pb2
    except ImportError:  # pragma: no cover - older tf_keras layouts
        from tf_keras.protobuf import saved_metadata_pb2  # type: ignore
    metadata = saved_metadata_pb2.SavedMetadata()
    try:
        metadata.ParseFromString((Path(path) / KERAS_METADATA).read_bytes())
    except Exception as exc:  # noqa: BLE001 - a corrupt protobuf
        raise ModelLoadError(f"{path}: {KERAS_METADATA} is not readable ({exc})") from None
    names = []
    for node in metadata.nodes:
        try:
            record = json.loads(node.metadata)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and record.get("class_name"):
            names.append(str(record["class_name"]))
    return names


saved_model_layer_classes = _metadata_class_names


def _import_tf_keras():
    try:
        import tf_keras
    except ImportError as exc:
        raise ModelLoadError(
            f"reading a Keras 2 SavedModel needs tf_keras, the Keras 2 package matching your "
            f"TensorFlow: pip install 'graphswap[legacy]' (or pip install tf_keras) ({exc})") \
            from None
    return tf_keras


def _split_custom_objects(custom_objects, tf_keras):
    """(objects for tf_keras, objects for Keras 3) from one user-supplied mapping."""
    import inspect

    if not custom_objects:
        return {}, {}
    old, new = {}, {}
    for name, obj in custom_objects.items():
        if inspect.isclass(obj):
            module = getattr(obj, "__module__", "") or ""
            if issubclass(obj, keras.layers.Layer) or issubclass(obj, keras.Model) \
                    or module.startswith("keras"):
                new[name] = obj
            elif issubclass(obj, tf_keras.layers.Layer) or module.startswith("tf_keras"):
                old[name] = obj
            else:
                old[name] = new[name] = obj
        else:
            old[name] = new[name] = obj
    return old, new


def _first_line(exc) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def load_keras2_saved_model(path, custom_objects=None, safe_mode: bool = True,
                            compile: bool = False, check_batch: int = 4):  # noqa: A002
    """Load a Keras 2 SavedModel directory as a Keras 3 model with the same weights.

    Raises ModelLoadError with what is wrong and what would work: not a SavedModel, an
    inference-only SavedModel (no Keras metadata), tf_keras missing, a Lambda layer in safe mode,
    custom classes not supplied, a model Keras 3 cannot rebuild, or a translation whose outputs
    differ from the original's.  Training configuration (optimizer, loss) is not carried over:
    compile the returned model before training it (`compile` is accepted for symmetry with
    keras.models.load_model and ignored).
    """
    path = Path(path)
    if not is_saved_model(path):
        raise ModelLoadError(
            f"{path} is a directory but not a SavedModel (no saved_model.pb); expected a .keras or "
            f".h5 file, or a Keras 2 SavedModel directory")
    if not (path / KERAS_METADATA).is_file():
        raise ModelLoadError(
            f"{path} is an inference-only SavedModel (a TensorFlow graph with no Keras "
            f"architecture: {KERAS_METADATA} is missing), as written by Keras 3 model.export() or "
            f"tf.saved_model.save(); graphswap needs the layers. Convert the model it was exported "
            f"from (.keras or full-model .h5), a SavedModel written by graphswap export --format "
            f"savedmodel, or a Keras 2 SavedModel written by tf.keras model.save('dir')")
    tf_keras = _import_tf_keras()
    classes = _metadata_class_names(path)
    if safe_mode and "Lambda" in classes:
        raise ModelLoadError(
            f"cannot load model {path}: it contains a Lambda layer, whose Python code would be "
            f"deserialised and run. Load it only if you trust the file, with safe_mode=False "
            f"(CLI: --unsafe)")
    old_objects, new_objects = _split_custom_objects(custom_objects, tf_keras)
    try:
        with tf_keras.utils.custom_object_scope(old_objects):
            original = tf_keras.models.load_model(str(path), compile=False)
    except GraphswapError:
        raise
    except Exception as exc:  # noqa: BLE001 - tf_keras raises many types
        raise ModelLoadError(f"tf_keras cannot load the SavedModel {path}: "
                             f"{type(exc).__name__}: {_first_line(exc)}") from None
    with tempfile.TemporaryDirectory(prefix="graphswap-keras2-") as scratch:
        h5_path = os.path.join(scratch, "model.h5")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "HDF5 is legacy": intended, temporary file
                original.save(h5_path, save_format="h5", include_optimizer=False)
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(
                f"{path}: the Keras 2 model cannot be written as full-model HDF5 for translation "
                f"({type(exc).__name__}: {_first_line(exc)}); subclassed Keras 2 models cannot be "
                f"translated, rebuild them as Functional/Sequential models") from None
        try:
            model = load_keras_file(Path(h5_path), new_objects or None, safe_mode, False)
        except ModelLoadError as exc:
            raise ModelLoadError(str(exc).replace(h5_path, f"{path} (translated to Keras 3)")) \
                from None
    _verify_translation(path, original, model, check_batch)
    return model


def _verify_translation(path, original, model, check_batch) -> float:
    """Compare the Keras 2 and Keras 3 models on a deterministic batch; ModelLoadError if apart."""
    batch = sample_inputs(model, check_batch)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Keras' input-structure notice for list/array inputs
            expected = [np.asarray(t) for t in _flatten(original(batch, training=False))]
            actual = [np.asarray(t) for t in keras.tree.flatten(model(batch, training=False))]
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"{path}: running the translated model on a sample batch failed: "
                             f"{type(exc).__name__}: {_first_line(exc)}") from None
    try:
        comparison = compare_outputs(expected, actual, "the translated model")
    except GraphswapError as exc:
        raise ModelLoadError(f"{path}: {exc} (the Keras 2 model is the reference)") from None
    if not comparison.within(TRANSLATION_TOLERANCE):
        raise ModelLoadError(
            f"{path}: the model translated from Keras 2 to Keras 3 gives different outputs "
            f"(max difference {comparison.max_difference:.3g} on a sample batch); it cannot be "
            f"converted faithfully")
    return comparison.max_difference


def _flatten(outputs):
    if isinstance(outputs, dict):
        return [outputs[k] for k in sorted(outputs)]
    if isinstance(outputs, (list, tuple)):
        return [item for entry in outputs for item in _flatten(entry)]
    return [outputs]
