"""The exports' signature: input names (the model's), output names (its output layers'), the
input specs, and the serving function traced for tf2onnx and the SavedModel."""

from __future__ import annotations

import re

import keras
import numpy as np
import tensorflow as tf


def _sanitize(name: str, fallback: str) -> str:
    clean = re.sub(r"[^A-Za-z0-9_]", "_", str(name or ""))
    if not clean or not clean[0].isalpha():
        clean = f"{fallback}_{clean}".rstrip("_")
    return clean


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for name in names:
        if name in seen:
            seen[name] += 1
            name = f"{name}_{seen[name]}"
        seen.setdefault(name, 0)
        out.append(name)
    return out


def signature_names(model) -> tuple[list[str], list[str]]:
    """(input names, output names) used by the exports: the model's input names and the names of
    the layers producing its outputs, made valid identifiers."""
    inputs = _unique([_sanitize(t.name, "input") for t in model.inputs])
    outputs = []
    for tensor in model.outputs:
        history = getattr(tensor, "_keras_history", None)
        name = history.operation.name if history is not None else tensor.name
        outputs.append(_sanitize(name, "output"))
    return inputs, _unique(outputs)


def input_specs(model, names):
    specs = []
    for tensor, name in zip(model.inputs, names):
        dtype = tf.as_dtype(tensor.dtype or "float32")
        shape = [None if d is None else int(d) for d in tensor.shape]
        specs.append(tf.TensorSpec(shape, dtype, name=name))
    return specs


def serving_function(model, specs, output_names):
    single = len(specs) == 1

    def serve(*args):
        outputs = keras.tree.flatten(model(args[0] if single else list(args), training=False))
        return {name: output for name, output in zip(output_names, outputs)}

    return tf.function(serve, input_signature=specs, autograph=False)


def feeds(batch, names) -> dict:
    batches = batch if isinstance(batch, list) else [batch]
    return {name: np.asarray(b) for name, b in zip(names, batches)}

