"""Comparing a rewritten model with its original on a sample batch."""

from __future__ import annotations

import re

import numpy as np

from graphswap.errors import GraphswapError


def _input_range(model) -> tuple[float, float]:
    """Value range for synthetic inputs: [0, 255] if the model rescales its input itself."""
    import keras

    for layer in model.layers[:3]:
        if isinstance(layer, keras.layers.Rescaling):
            return 0.0, 255.0
    return 0.0, 1.0


def sample_inputs(model, batch_size: int = 8, seed: int = 0):
    """A deterministic random batch matching the model's input shapes (list for multi-input)."""
    rng = np.random.default_rng(seed)
    low, high = _input_range(model)
    batches = []
    for tensor in model.inputs:
        shape = [batch_size if d is None else int(d) for d in tensor.shape]
        if shape and shape[0] != batch_size and tensor.shape[0] is None:
            shape[0] = batch_size
        if None in tensor.shape[1:]:
            raise ValueError(f"input {tensor.name} has unknown dimensions {tensor.shape}")
        batches.append(rng.uniform(low, high, size=shape).astype(np.float32))
    return batches[0] if len(batches) == 1 else batches


class OriginalCannotRunError(GraphswapError):
    """The original model cannot run here (e.g. a channels_first Conv2D on a CPU), so there is
    nothing to compare the rewritten model with."""


def tensorflow_reason(exc: Exception) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    match = re.search(r"\}\}\s*(.*?)\s*\[Op:", text, re.S)
    reason = match.group(1) if match else (text.strip().splitlines() or [type(exc).__name__])[0]
    return " ".join(reason.split())


def max_output_difference(original, rewritten, inputs) -> float:
    """Largest absolute difference between the two models' outputs on `inputs` (all outputs).

    Raises OriginalCannotRunError when TensorFlow cannot run the original model on this machine
    (the rewritten one may well run: graphswap's kernels compute channels_first convolutions in
    NHWC on any device).
    """
    import keras
    import tensorflow as tf

    try:
        a = original(inputs, training=False)
    except tf.errors.UnimplementedError as exc:
        raise OriginalCannotRunError(
            f"TensorFlow cannot run the original model on this machine "
            f"({tensorflow_reason(exc)})") from None
    b = rewritten(inputs, training=False)
    flat_a = keras.tree.flatten(a)
    flat_b = keras.tree.flatten(b)
    return float(max((np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))
                      if np.size(x) else 0.0) for x, y in zip(flat_a, flat_b)))
