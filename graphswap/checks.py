"""Comparing a rewritten model with its original on a sample batch."""

from __future__ import annotations

import numpy as np


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


def max_output_difference(original, rewritten, inputs) -> float:
    """Largest absolute difference between the two models' outputs on `inputs` (all outputs)."""
    import keras

    a = original(inputs, training=False)
    b = rewritten(inputs, training=False)
    flat_a = keras.tree.flatten(a)
    flat_b = keras.tree.flatten(b)
    return float(max((np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))
                      if np.size(x) else 0.0) for x, y in zip(flat_a, flat_b)))
