"""The Keras 2 reference: a model translated from a Keras 2 file is compared with tf_keras' own
model of the same file, on a small deterministic batch, and refused when they differ by more
than float32 round-off scaled to the outputs' magnitude.

The translation (graphswap.io.legacy_config, legacy_semantics) handles every Keras 2 -> 3 change
of meaning graphswap knows of; this check catches the ones it does not (a formula or default
that changed silently makes `evaluate` score a different model as "original").  Keras 2
SavedModels are always compared (tf_keras is needed to read them at all); `.h5` files and Keras 2
`.keras` archives are compared where tf_keras is installed (`graphswap[legacy]`).  tf_keras reads
the file only after Keras 3 has built the translated model from it: the stored-code check and
the TFOpLambda allow-list have run by then.  An HDF5 file's model is rebuilt by tf_keras from
its config with Keras 2's defaults of the writing version written out (a Keras 2.2 GRU without
`reset_after` meant False, where today's tf_keras would read True), then given the file's
weights.  When tf_keras cannot rebuild the file (a custom
class it has no Keras 2 version of) or its model does not run on the sample batch, the model is
loaded unchecked, with a note.

The error names the largest difference and, where the two models' layers can be lined up by
name, the first layer whose output differs.
"""

from __future__ import annotations

import inspect
import json
import warnings

import keras
import numpy as np

from graphswap.errors import GraphswapError, ModelLoadError
from graphswap.input_files import MAX_MODEL_JSON_DEPTH, load_json
from graphswap.io.legacy_semantics import keras_version, with_keras2_defaults
from graphswap.swap.compare import compare_outputs, model_inputs

#: largest |keras2 - keras3| accepted, relative to max(1, |output|) per output
TRANSLATION_TOLERANCE = 1e-5
#: the sample batch: its size, and the length given to dimensions the model leaves open
CHECK_BATCH = 4
OPEN_DIMENSION = 16


def first_line(exc) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def tf_keras_module():
    """tf_keras, or None where it is not installed."""
    try:
        import tf_keras
    except ImportError:
        return None
    return tf_keras


def split_custom_objects(custom_objects, tf_keras):
    """(objects for tf_keras, objects for Keras 3) from one user-supplied mapping."""
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


def sample_batch(model, batch_size: int = CHECK_BATCH, seed: int = 0):
    """A deterministic batch for `model`'s inputs (a list for several): floats in [0, 1),
    integers 0/1 (token ids any vocabulary holds), OPEN_DIMENSION for an open dimension."""
    rng = np.random.default_rng(seed)
    arrays = []
    for tensor in model.inputs:
        shape = [batch_size] + [OPEN_DIMENSION if d is None else int(d)
                                for d in tuple(tensor.shape)[1:]]
        dtype = np.dtype(keras.backend.standardize_dtype(tensor.dtype or "float32"))
        if np.issubdtype(dtype, np.integer) or dtype == np.bool_:
            arrays.append(rng.integers(0, 2, size=shape).astype(dtype))
        else:
            arrays.append(rng.uniform(0, 1, size=shape).astype(dtype))
    return arrays[0] if len(arrays) == 1 else arrays


def flatten(outputs):
    """A Keras 2 model's outputs as a list (dicts by sorted key, as Keras 3 flattens them)."""
    if isinstance(outputs, dict):
        return [item for key in sorted(outputs) for item in flatten(outputs[key])]
    if isinstance(outputs, (list, tuple)):
        return [item for entry in outputs for item in flatten(entry)]
    return [outputs]


def _run_keras3(model, batch) -> list[np.ndarray]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Keras' input-structure notice for list/array inputs
        return [np.asarray(t) for t in
                keras.tree.flatten(model(model_inputs(model, batch), training=False))]


def _run_keras2(original, batch) -> list[np.ndarray]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [np.asarray(t) for t in flatten(original(batch, training=False))]


def verify_translation(path, original, model, batch=None, reference: str = "the Keras 2 model"):
    """Compare the Keras 2 model `original` (tf_keras) with its Keras 3 translation `model` on a
    deterministic batch; ModelLoadError naming the largest difference and the first layer that
    differs when they are further apart than float32 round-off.  Returns the largest difference."""
    batch = sample_batch(model) if batch is None else batch
    try:
        expected = _run_keras2(original, batch)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"{path}: running the Keras 2 model on a sample batch failed: "
                             f"{type(exc).__name__}: {first_line(exc)}") from None
    return _compare(path, original, model, batch, expected, reference)


def _compare(path, original, model, batch, expected, reference) -> float:
    try:
        actual = _run_keras3(model, batch)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"{path}: running the translated model on a sample batch failed: "
                             f"{type(exc).__name__}: {first_line(exc)}") from None
    try:
        comparison = compare_outputs(expected, actual, "the translated model")
    except GraphswapError as exc:
        raise ModelLoadError(f"{path}: {exc} ({reference} is the reference)") from None
    if not comparison.within(TRANSLATION_TOLERANCE):
        where = differing_layer(original, model, batch)
        size = len(batch[0] if isinstance(batch, list) else batch)
        raise ModelLoadError(
            f"{path}: the model translated from Keras 2 to Keras 3 gives different outputs from "
            f"{reference} (max |difference| {comparison.max_difference:.3g} on a sample batch of "
            f"{size}, allowed {TRANSLATION_TOLERANCE:g} of each output's scale"
            f"{'; first at ' + where if where else ''}): a Keras 2 -> 3 change of meaning "
            f"graphswap does not translate, so it cannot be converted faithfully. Re-save the "
            f"model from Keras 3, or report the layer to graphswap")
    return comparison.max_difference


def differing_layer(original, model, batch) -> str | None:
    """"layer 'NAME' (CLASS), max |difference| D": the first layer (in the translated model's
    order) whose output differs from the same-named layer's in `original`; None if not found."""
    try:
        import tf_keras

        pairs, ours, theirs = [], [], []
        for layer in model.layers:
            if isinstance(layer, keras.layers.InputLayer):
                continue
            try:
                mine = keras.tree.flatten(layer.output)
                other = flatten(original.get_layer(layer.name).output)
            except (AttributeError, ValueError, RuntimeError):  # shared or nested-call layers
                continue
            if len(mine) == len(other):
                pairs.append((layer, len(ours), len(mine)))
                ours += mine
                theirs += other
        if not pairs:
            return None
        got = _run_keras3(keras.Model(model.inputs, ours), batch)
        want = _run_keras2(tf_keras.Model(original.inputs, theirs), batch)
    except Exception:  # noqa: BLE001 - locating the layer is a courtesy; the error stands
        return None
    for layer, start, count in pairs:
        for a, b in zip(got[start:start + count], want[start:start + count]):
            if a.shape != b.shape or not b.size:
                continue
            difference = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
            scale = max(1.0, float(np.max(np.abs(b))))
            if not difference <= TRANSLATION_TOLERANCE * scale:
                return f"layer {layer.name!r} ({type(layer).__name__}), max |difference| " \
                       f"{difference:.3g}"
    return None


def check_against_tf_keras(path, model, custom_objects, safe_mode: bool, notes: list,
                           archive: bool = False) -> None:
    """Compare `model`, translated from the Keras 2 HDF5 file (or, with `archive`, `.keras`
    archive) `path`, with tf_keras' own load of that file (nothing where tf_keras is not
    installed; a note where it cannot load or run the file); ModelLoadError when they differ
    (verify_translation)."""
    tf_keras = tf_keras_module()
    if tf_keras is None:
        return
    old_objects, _ = split_custom_objects(custom_objects, tf_keras)
    unchecked = "its outputs are not compared with tf_keras' own load of the file"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with tf_keras.utils.custom_object_scope(old_objects):
                original = _tf_keras_model(tf_keras, path, archive, safe_mode)
    except Exception as exc:  # noqa: BLE001 - e.g. a custom class tf_keras has no version of
        notes.append(f"{unchecked} (tf_keras cannot load it: {type(exc).__name__}: "
                     f"{first_line(exc)[:200]})")
        return
    batch = sample_batch(model)
    try:
        expected = _run_keras2(original, batch)
    except Exception as exc:  # noqa: BLE001 - open dimensions the sample cannot fill, ...
        notes.append(f"{unchecked} (tf_keras' model does not run on a sample batch: "
                     f"{type(exc).__name__}: {first_line(exc)[:200]})")
        return
    _compare(path, original, model, batch, expected, "tf_keras' own load of the file")


def _tf_keras_model(tf_keras, path, archive: bool, safe_mode: bool):
    """tf_keras' model of a Keras 2 file: an archive as tf_keras loads it; an HDF5 file built
    from its config with Keras 2's defaults of its version, and its weights."""
    if archive:
        return tf_keras.models.load_model(str(path), compile=False, safe_mode=safe_mode)
    import h5py

    with h5py.File(path, "r") as handle:
        text, version = (handle.attrs.get(name) for name in ("model_config", "keras_version"))
    text, version = (value.decode("utf-8") if hasattr(value, "decode") else value
                     for value in (text, version))
    config = with_keras2_defaults(load_json(text, f"{path}: its model_config", ModelLoadError,
                                            MAX_MODEL_JSON_DEPTH), keras_version(version))
    original = tf_keras.models.model_from_json(json.dumps(config))
    original.load_weights(str(path))
    return original
