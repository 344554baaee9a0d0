"""Full-model HDF5 files, whatever their suffix: Keras 3's own, and Keras 2's translated.

HDF5 is recognised by its signature, not its name (older Keras saved HDF5 under any name, `.keras`
included).  A file written by Keras 3 is read by Keras 3's legacy-HDF5 reader unchanged.  A file
written by Keras 2 (tf.keras, tf_keras: `keras_version` 2.x) has its architecture translated first
(graphswap.io.legacy_config: renamed and dropped options, tensor keyword arguments, `TFOpLambda`
layers), is built by Keras 3 in safe mode, and gets its weights from the file.  With `compile`,
its training configuration is rebuilt for Keras 3 (`translate_training_config`); what cannot be
rebuilt is replaced by Keras 3's equivalent or left out, each with a `LegacyModelWarning` note.
Where tf_keras is installed, the translated model is compared with tf_keras' own load of the
file and refused when they differ (graphswap.io.legacy_reference).
"""

from __future__ import annotations

import inspect
import warnings

import keras

from graphswap.errors import ModelLoadError
from graphswap.input_files import MAX_MODEL_JSON_DEPTH, check_json_depth
from graphswap.io import legacy_config
from graphswap.io.keras3 import describe_load_failure, require_built
from graphswap.io.legacy_reference import check_against_tf_keras
from graphswap.io.stored_code import check_keras_configs
from graphswap.io.tf_op_layer import LAYER_CLASSES

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


class LegacyModelWarning(UserWarning):
    """Part of a Keras 2 file was replaced or left out when it was translated (a printed note)."""


def is_hdf5(path) -> bool:
    with open(path, "rb") as handle:
        return handle.read(8) == HDF5_SIGNATURE


def _attribute(handle, name):
    value = handle.attrs.get(name)
    return value.decode("utf-8") if hasattr(value, "decode") else value


def written_by_keras2(path) -> bool:
    import h5py

    with h5py.File(path, "r") as handle:
        version = str(_attribute(handle, "keras_version") or "")
    return not version.startswith("3")


def load_hdf5_model(path, custom_objects=None, safe_mode: bool = True,
                    compile: bool = True, reference: bool = True):  # noqa: A002
    """A full-model HDF5 file as a Keras 3 model; ModelLoadError (or graphswap's own) on failure.
    A Keras 2 file is compared with tf_keras' load of it unless `reference` is False."""
    import h5py
    from keras.src.legacy.saving import legacy_h5_format

    notes: list[str] = []
    try:
        with h5py.File(path, "r") as handle:
            version = str(_attribute(handle, "keras_version") or "")
            config = _attribute(handle, "model_config")   # Keras parses it: depth first
            if isinstance(config, str):
                check_json_depth(config, f"{path}: its model_config", ModelLoadError,
                                 MAX_MODEL_JSON_DEPTH)
            if version.startswith("3"):
                model = legacy_h5_format.load_model_from_hdf5(
                    handle, custom_objects=custom_objects, compile=compile, safe_mode=safe_mode)
            else:
                model = _load_keras2(handle, custom_objects, safe_mode, compile, version, notes)
    except Exception as exc:  # noqa: BLE001 - Keras and h5py raise many types
        raise describe_load_failure(path, exc) from None
    model = require_built(model, path)
    if not version.startswith("3") and reference:
        check_against_tf_keras(path, model, custom_objects, safe_mode, notes)
    emit(notes)
    return model


def _load_keras2(handle, custom_objects, safe_mode, compile, version, notes):  # noqa: A002
    from keras.src.legacy.saving import json_utils, legacy_h5_format, saving_options, \
        saving_utils
    from keras.src.saving import serialization_lib

    config = json_utils.decode(_attribute(handle, "model_config"))
    if safe_mode:  # stored Python code at any depth, before the translation touches it
        check_keras_configs([("model_config", config)], handle.filename)
    config = legacy_config.translate_model_config(config, notes, version or None)
    objects = {**LAYER_CLASSES, **(custom_objects or {})}
    with saving_options.keras_option_scope(use_legacy_config=True), \
            serialization_lib.SafeModeScope(safe_mode):
        model = saving_utils.model_from_config(config, custom_objects=objects)
        legacy_h5_format.load_weights_from_hdf5_group(handle["model_weights"], model)
    training = _attribute(handle, "training_config")
    if compile and training:
        compile_training_config(model, json_utils.decode(training), objects, notes)
        if _optimizer_arrays(handle) > 1:  # more than the step counter
            notes.append("the saved optimizer state (its slot variables) is not restored; "
                         "training starts with a fresh optimizer")
    return model


def _optimizer_arrays(handle) -> int:
    import h5py

    group = handle.get("optimizer_weights")
    if group is None:
        return 0
    found = []
    group.visititems(lambda _, item: found.append(1) if isinstance(item, h5py.Dataset) else None)
    return len(found)


def emit(notes) -> None:
    for note in notes:
        warnings.warn(f"Keras 2 model: {note}", LegacyModelWarning, stacklevel=3)


# -- training configuration ----------------------------------------------------------------------

def compile_training_config(model, training: dict, custom_objects, notes) -> None:
    """Compile `model` with a Keras 2 training config translated for Keras 3 (notes appended);
    left uncompiled, with a note, when its loss cannot be rebuilt."""
    with keras.saving.custom_object_scope(custom_objects or {}):
        arguments = translate_training_config(training, notes)
        if arguments is None:
            return
        try:
            model.compile(**arguments)
        except Exception as exc:  # noqa: BLE001 - Keras' compile raises many types
            notes.append(f"its training configuration could not be rebuilt ({type(exc).__name__}: "
                         f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}); the "
                         f"model is loaded uncompiled")


def translate_training_config(training: dict, notes) -> dict | None:
    """model.compile arguments from a Keras 2 training config, or None (with a note)."""
    training = _function_names(training)
    try:
        loss = _nested(training.get("loss"), _loss)
    except _Untranslatable as exc:
        notes.append(f"its loss {exc} cannot be rebuilt in Keras 3; the model is loaded "
                     f"uncompiled (compile it, or give the loss to the command)")
        return None
    return {"optimizer": _optimizer(training.get("optimizer_config"), notes), "loss": loss,
            "metrics": _metrics(training.get("metrics"), notes),
            "weighted_metrics": _metrics(training.get("weighted_metrics"), notes),
            "loss_weights": training.get("loss_weights")}


def _function_names(value):
    """Keras 2 archives wrote a function as {"class_name": "function", "config": NAME}: NAME."""
    if isinstance(value, dict):
        if value.get("class_name") == "function" and isinstance(value.get("config"), str):
            return value["config"]
        return {key: _function_names(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_function_names(item) for item in value]
    return value


class _Untranslatable(Exception):
    pass


def _nested(value, translate):
    if value is None:
        return None
    if isinstance(value, list):
        return [_nested(item, translate) for item in value]
    if isinstance(value, dict) and "class_name" not in value:
        return {key: _nested(item, translate) for key, item in value.items()}
    return translate(value)


def _accepted(cls, config: dict) -> dict:
    parameters = set()
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            parameters.update(inspect.signature(vars(klass)["__init__"]).parameters)
    parameters.discard("fn")  # LossFunctionWrapper's: a loss class sets its own
    return {key: value for key, value in config.items() if key in parameters}


def _loss(value):
    if isinstance(value, str):
        try:
            keras.losses.get(value)
        except (ValueError, TypeError):
            raise _Untranslatable(repr(value)) from None
        return value
    name = str(value.get("class_name", "")).split(">")[-1]
    if name == "LossFunctionWrapper":
        function = value.get("config", {}).get("fn")
        return _loss(function) if isinstance(function, str) else _unknown_loss(value)
    cls = getattr(keras.losses, name, None)
    if not inspect.isclass(cls):
        return _unknown_loss(value)
    config = dict(value.get("config") or {})
    if config.get("reduction") in ("auto", None):
        config.pop("reduction", None)
    try:
        return cls(**_accepted(cls, config))
    except Exception:  # noqa: BLE001 - any failure means this loss cannot be rebuilt
        return _unknown_loss(value)


def _unknown_loss(value):
    raise _Untranslatable(repr(value.get("class_name") if isinstance(value, dict) else value))


#: metric strings Keras 3's compile resolves itself (by the loss and the output shape)
_RESOLVED_METRICS = ("accuracy", "acc", "crossentropy", "ce")


def _metric(value, notes):
    if isinstance(value, str):
        if value in _RESOLVED_METRICS:
            return value
        try:
            keras.metrics.get(value)
            return value
        except (ValueError, TypeError):
            notes.append(f"its metric {value!r} does not exist in Keras 3 and is left out")
            return None
    config = dict(value.get("config") or {})
    name = str(value.get("class_name", "")).split(">")[-1]
    if name == "MeanMetricWrapper":  # metrics=['accuracy'], ['mae'], ... as Keras 2 saved them
        if _is_plain_accuracy(str(config.get("name", "")), config.get("fn")):
            return "accuracy"
        return _metric(config.get("fn") if isinstance(config.get("fn"), str)
                       else str(config.get("name")), notes)
    cls = getattr(keras.metrics, name, None)
    try:
        return cls(**_accepted(cls, config))
    except Exception:  # noqa: BLE001 - not a Keras 3 metric, or not with these settings
        notes.append(f"its metric {config.get('name') or name!r} ({name}) cannot be rebuilt in "
                     f"Keras 3 and is left out")
        return None


def _is_plain_accuracy(name: str, function) -> bool:
    """metrics=['accuracy'] as Keras 2 saved it: named "accuracy" (or "<output>_accuracy" in a
    multi-output model) with whatever function Keras 2 had guessed before training, which Keras 3
    resolves again from the loss and the output shape; not an explicit "categorical_accuracy"."""
    if name in _RESOLVED_METRICS:
        return True
    return (name.endswith("_accuracy") or name.endswith("_acc")) and not (
        isinstance(function, str) and name.endswith(function))


def _metrics(value, notes):
    if value is None:
        return None
    if isinstance(value, dict) and "class_name" not in value:
        return {key: _metrics(item, notes) for key, item in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(item, list) for item in value):
            if len(value) == 1:  # Keras 2 wrote one list per output; one output: a plain list
                return _metrics(value[0], notes)
            return [_metrics(item, notes) for item in value]
        return [metric for metric in (_metric(item, notes) for item in value)
                if metric is not None]
    metric = _metric(value, notes)
    return [] if metric is None else [metric]


def _optimizer(value, notes):
    if not isinstance(value, dict):
        return "rmsprop"  # Keras' own default
    name = str(value.get("class_name", "")).split(">")[-1]
    cls = {candidate.lower(): getattr(keras.optimizers, candidate)
           for candidate in dir(keras.optimizers)
           if inspect.isclass(getattr(keras.optimizers, candidate))}.get(name.lower())
    if cls is None or not issubclass(cls, keras.optimizers.Optimizer):
        notes.append(f"its optimizer {name!r} does not exist in Keras 3; Adam with its default "
                     f"settings replaces it")
        return keras.optimizers.Adam()
    config = dict(value.get("config") or {})
    if "lr" in config:
        config.setdefault("learning_rate", config.pop("lr"))
    rate = config.get("learning_rate")
    if isinstance(rate, dict):
        try:
            config["learning_rate"] = keras.optimizers.schedules.deserialize(rate)
        except Exception:  # noqa: BLE001 - a schedule Keras 3 does not have
            notes.append(f"its learning-rate schedule {rate.get('class_name')!r} cannot be "
                         f"rebuilt; the optimizer's default learning rate replaces it")
            config.pop("learning_rate")
    decay = config.pop("decay", 0) or 0
    if decay and not isinstance(config.get("learning_rate"), dict):
        # Keras 2's decay: lr / (1 + decay * iterations), exactly InverseTimeDecay with step 1
        config["learning_rate"] = keras.optimizers.schedules.InverseTimeDecay(
            float(config.get("learning_rate", 0.001)), decay_steps=1, decay_rate=float(decay))
    try:
        return cls(**_accepted(cls, config))
    except Exception as exc:  # noqa: BLE001 - settings Keras 3 refuses
        notes.append(f"its optimizer settings cannot be rebuilt ({type(exc).__name__}); {name} "
                     f"with its default settings replaces them")
        return cls()
