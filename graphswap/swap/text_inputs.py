"""Inputs of models that take strings (a tf.string Input feeding a TextVectorization, StringLookup,
Hashing, ...): string arrays kept as strings where numeric inputs become float32 (calibration
data, check batches), and synthetic check batches of short texts made of the model's own
vocabulary, so that convert compares a string model with its original like any other."""

from __future__ import annotations

import keras
import numpy as np

from graphswap.errors import DataError

#: words of a synthetic text when no layer reading the input has a vocabulary
FALLBACK_WORDS = ("the", "a", "model", "graphswap", "text", "of", "and", "to")


def is_string_tensor(tensor) -> bool:
    """Whether a model input (a KerasTensor) takes strings."""
    return str(getattr(tensor, "dtype", "")) in ("string", "tf.string", "<dtype: 'string'>")


def input_array(array, tensor) -> np.ndarray:
    """`array` as the model input `tensor` takes it: strings (a unicode or bytes array; DataError
    when it holds anything else) for a string input, else float32 (numpy's ValueError/TypeError
    when it is not numeric)."""
    if not is_string_tensor(tensor):
        return np.asarray(array, dtype=np.float32)
    array = np.asarray(array)
    if array.dtype.kind in "US":
        return array
    if array.dtype.kind == "O" and all(isinstance(v, (str, bytes)) for v in array.reshape(-1)):
        return array
    raise DataError(f"the model's input {getattr(tensor, 'name', '')!r} takes strings, the data "
                    f"holds {array.dtype}")


def _readers(model, tensor) -> list:
    """The layers that read the model input `tensor` directly (in model order)."""
    found = []
    for layer in getattr(model, "layers", ()):
        for node in getattr(layer, "_inbound_nodes", None) or ():
            if any(t is tensor for t in keras.tree.flatten(node.input_tensors)):
                found.append(layer)
                break
    return found


def _vocabulary_layer(model, tensor):
    """The layer with a vocabulary (TextVectorization, StringLookup) that reads `tensor`; else the
    first such layer of the model; None when there is none."""
    def has_vocabulary(layer):
        return callable(getattr(layer, "get_vocabulary", None))

    for layer in _readers(model, tensor):
        if has_vocabulary(layer):
            return layer
    return next((layer for layer in getattr(model, "layers", ()) if has_vocabulary(layer)), None)


def sample_strings(model, tensor, shape, rng) -> np.ndarray:
    """A unicode array of `shape` for the string input `tensor`: texts of 2-8 words of the
    vocabulary of the layer reading it (a TextVectorization splits them), single tokens for a
    lookup layer, FALLBACK_WORDS where no layer has a vocabulary."""
    layer = _vocabulary_layer(model, tensor)
    words: list = []
    if layer is not None:
        try:
            words = [str(w) for w in layer.get_vocabulary(include_special_tokens=False)
                     if str(w).strip()]
        except Exception:  # noqa: BLE001 - an unadapted layer: no vocabulary yet
            words = []
    words = words or list(FALLBACK_WORDS)
    texts = isinstance(layer, keras.layers.TextVectorization) or layer is None
    count = int(np.prod(shape)) if shape else 1
    values = []
    for _ in range(count):
        size = int(rng.integers(2, 9)) if texts else 1
        values.append(" ".join(words[int(i)] for i in rng.integers(0, len(words), size=size)))
    return np.array(values, dtype=str).reshape(shape)


def string_layers(model) -> list[tuple[str, object]]:
    """(path, layer) of every layer of `model` that is called on strings (a TextVectorization,
    a StringLookup, a Hashing of text), nested models included."""
    from graphswap.swap.clone import iter_layers

    found = []
    for path, layer in iter_layers(model):
        if isinstance(layer, keras.Model):
            continue
        for node in getattr(layer, "_inbound_nodes", None) or ():
            if any(is_string_tensor(t) for t in keras.tree.flatten(node.input_tensors)):
                found.append((path, layer))
                break
    return found
