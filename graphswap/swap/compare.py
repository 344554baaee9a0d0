"""Comparing a model's outputs with a reference's on a sample batch: the one place that runs two
models (or a model and an export) side by side - convert's check, the Keras 2 translation check
and every export's verification use it."""

from __future__ import annotations

import dataclasses
import re

import keras
import numpy as np
import tensorflow as tf

from graphswap.errors import GraphswapError, ShapeError
from graphswap.swap.text_inputs import is_string_tensor, sample_strings


def _input_range(model) -> tuple[float, float]:
    """Value range for synthetic inputs: [0, 255] if the model rescales its input itself."""
    for layer in model.layers[:3]:
        if isinstance(layer, keras.layers.Rescaling):
            return 0.0, 255.0
    return 0.0, 1.0


#: largest random sample batch an output comparison uses (`--check-batch`): it is a sanity check of
#: the rewrite, not an evaluation, and a batch of 100000 images would need gigabytes
MAX_CHECK_BATCH = 1024


def validate_check_batch(value, minimum: int = 0) -> int:
    """`value` as a sample batch size in minimum..MAX_CHECK_BATCH, or one clear GraphswapError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
            not minimum <= value <= MAX_CHECK_BATCH:
        raise GraphswapError(
            f"the check batch must be a whole number from {minimum} to {MAX_CHECK_BATCH}, got "
            f"{value!r}: it is a random sample batch comparing two models"
            + (" (0 skips the comparison)" if minimum == 0 else "") + "; to measure accuracy on "
            f"real data use 'graphswap evaluate'")
    return int(value)


def input_shapes(model) -> list[tuple]:
    """[(name, shape)] of the model's inputs; a subclassed model's from its build config."""
    try:
        return [(tensor.name, tuple(tensor.shape)) for tensor in model.inputs]
    except (AttributeError, ValueError):
        config = model.get_build_config() if getattr(model, "built", False) else None
        shape = (config or {}).get("input_shape")
        if shape is None:
            raise ShapeError(f"model {model.name!r} has no known input shape: call it on data "
                             f"(or build it) before saving or converting it") from None
        shapes = shape if shape and isinstance(shape[0], (list, tuple)) else [shape]
        return [(f"input_{i}", tuple(s)) for i, s in enumerate(shapes)]


#: the length a free dimension of a model's input (None beyond the batch: a sequence of any
#: length, an image of any size) takes in a sample batch and in the MAC count, when neither the
#: data nor `--sequence-length` says
DEFAULT_SEQUENCE_LENGTH = 16
#: the longest `--sequence-length`
MAX_SEQUENCE_LENGTH = 1 << 16


def validate_sequence_length(value) -> int:
    """`value` as the length of free dimensions (1..MAX_SEQUENCE_LENGTH), or a GraphswapError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
            not 1 <= value <= MAX_SEQUENCE_LENGTH:
        raise GraphswapError(
            f"the sequence length must be a whole number from 1 to {MAX_SEQUENCE_LENGTH}, got "
            f"{value!r}: the length the model's free (None) input dimensions take in a sample "
            f"batch and in the MAC count")
    return int(value)


def has_free_dimensions(model) -> bool:
    """Whether an input of `model` has a dimension beyond the batch of unknown size."""
    try:
        return any(None in dims[1:] for _, dims in input_shapes(model))
    except ShapeError:
        return False


def free_dimension_length(model, data=None, requested=None) -> int:
    """The length free input dimensions take: `requested`; else the data's size at the first free
    dimension (data: an array or a list of arrays in the order of the model's inputs); else
    DEFAULT_SEQUENCE_LENGTH."""
    if requested is not None:
        return validate_sequence_length(requested)
    if data is not None:
        if isinstance(data, tuple) and len(data) == 2 and len(input_shapes(model)) == 1:
            data = data[0]   # (x, y): the inputs
        arrays = list(data) if isinstance(data, (list, tuple)) else [data]
        for (_, dims), array in zip(input_shapes(model), arrays):
            shape = getattr(array, "shape", ())
            for axis, dim in enumerate(dims[1:], start=1):
                if dim is None and len(shape) > axis and int(shape[axis]) >= 1:
                    return int(shape[axis])
    return DEFAULT_SEQUENCE_LENGTH


def _token_limit(model, tensor):
    """The vocabulary size of an Embedding that reads the model input `tensor` directly (None when
    none does): its sample values are then token ids."""
    for layer in getattr(model, "layers", ()):
        if not isinstance(layer, keras.layers.Embedding):
            continue
        for node in getattr(layer, "_inbound_nodes", None) or ():
            if any(t is tensor for t in keras.tree.flatten(node.input_tensors)):
                return int(layer.input_dim)
    return None


def sample_inputs(model, batch_size: int = 8, seed: int = 0, sequence_length=None):
    """A deterministic random batch matching the model's input shapes (list for multi-input);
    at most MAX_CHECK_BATCH samples.  Free (None) dimensions beyond the batch take
    `sequence_length` (None: DEFAULT_SEQUENCE_LENGTH).  An input an Embedding reads gets token
    ids below its vocabulary size, an integer input integers (in the input's dtype), a string
    input short texts of its vocabulary (swap/text_inputs.py)."""
    batch_size = validate_check_batch(batch_size)
    length = DEFAULT_SEQUENCE_LENGTH if sequence_length is None else \
        validate_sequence_length(sequence_length)
    rng = np.random.default_rng(seed)
    low, high = _input_range(model)
    tensors = _input_tensors(model)
    batches = []
    for index, (name, dims) in enumerate(input_shapes(model)):
        shape = [batch_size] + [length if d is None else int(d) for d in dims[1:]]
        tensor = tensors[index] if index < len(tensors) else None
        if is_string_tensor(tensor):  # texts of the model's own vocabulary
            batches.append(sample_strings(model, tensor, shape, rng))
            continue
        dtype = np.dtype(getattr(tensor, "dtype", None) or "float32")
        tokens = _token_limit(model, tensor) if tensor is not None else None
        if tokens is not None or dtype.kind in "iu":
            values = rng.integers(0, max(tokens or 2, 1), size=shape)
            batches.append(values.astype(dtype if dtype.kind in "iuf" else np.float32))
        else:
            batches.append(rng.uniform(low, high, size=shape).astype(np.float32))
    return batches[0] if len(batches) == 1 else batches


def _input_tensors(model) -> list:
    try:
        return list(model.inputs)
    except (AttributeError, ValueError, TypeError):
        return []


class OriginalCannotRunError(GraphswapError):
    """The original model cannot run here (e.g. a channels_first Conv2D on a CPU), so there is
    nothing to compare the rewritten model with."""


def tensorflow_reason(exc: Exception) -> str:
    """The one informative line of a TensorFlow error message."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    match = re.search(r"\}\}\s*(.*?)\s*\[Op:", text, re.S)
    reason = match.group(1) if match else (text.strip().splitlines() or [type(exc).__name__])[0]
    return " ".join(reason.split())


def model_inputs(model, batch):
    """`batch` (an array, or a list of arrays in the order of `model.inputs`) in the structure
    the model was built with - a functional model built on a dict of named inputs takes a dict -
    so Keras has no input-structure mismatch to warn about."""
    if isinstance(batch, dict) or not isinstance(model, keras.Model):
        return batch
    try:
        structure = model.input  # a functional model's: the structure it was built with
    except (AttributeError, ValueError):  # Sequential/subclassed models never called on one
        return batch
    arrays = batch if isinstance(batch, (list, tuple)) else [batch]
    try:
        if len(keras.tree.flatten(structure)) != len(arrays):
            return batch
        return keras.tree.pack_sequence_as(structure, list(arrays))
    except (TypeError, ValueError):  # a structure Keras' tree cannot pack: the batch as given
        return batch


def run_model(model, batch) -> list[np.ndarray]:
    """Outputs of a Keras model on `batch` (inference mode), flattened, as numpy arrays.

    The forward pass runs inside one tf.function (traced once): an RNN's time loop or a large
    model runs as a graph, not op by op in Python (eagerly, convert's check of an LSTM model
    took 34-53 s)."""
    inputs = model_inputs(model, batch)
    forward = tf.function(lambda values: model(values, training=False), reduce_retracing=True)
    # a new function per call on purpose (a layer's arithmetic may change between calls, as in
    # calibration's float passes): TensorFlow's "N out of the last N calls ... retracing"
    # warning, printed by convert's checks, says nothing a user can act on
    logger = tf.get_logger()
    level = logger.level
    logger.setLevel("ERROR")
    try:
        outputs = forward(inputs)
    finally:
        logger.setLevel(level)
    return [np.asarray(o) for o in keras.tree.flatten(outputs)]


@dataclasses.dataclass
class OutputComparison:
    """Per output: the largest |reference - actual| and the output's scale max(1, max|reference|)."""

    differences: list
    scales: list

    @property
    def max_difference(self) -> float:
        return max(self.differences, default=0.0)

    @property
    def scale(self) -> float:
        return max(self.scales, default=1.0)

    def within(self, relative: float) -> bool:
        """Every output within `relative` of its own scale (NaN differences never are)."""
        return all(d <= relative * s for d, s in zip(self.differences, self.scales))


def compare_outputs(reference: list, actual: list, what: str = "the model") -> OutputComparison:
    """Compare two lists of output arrays; ShapeError when their number or shapes differ."""
    if len(reference) != len(actual):
        raise ShapeError(f"{what} has {len(actual)} outputs, the reference {len(reference)}")
    differences, scales = [], []
    for ref, got in zip(reference, actual):
        ref, got = np.asarray(ref), np.asarray(got)
        if ref.shape != got.shape:
            raise ShapeError(f"{what}'s output shape {got.shape} differs from the reference's "
                             f"{ref.shape}")
        if ref.size:
            differences.append(float(np.max(np.abs(ref.astype(np.float64)
                                                   - got.astype(np.float64)))))
            scales.append(max(1.0, float(np.max(np.abs(ref)))))
    return OutputComparison(differences, scales)


def max_output_difference(original, rewritten, inputs) -> float:
    """Largest absolute difference between the two models' outputs on `inputs` (all outputs).

    Raises OriginalCannotRunError when TensorFlow cannot run the original model on this machine
    (the rewritten one may well run: graphswap's kernels compute channels_first convolutions in
    NHWC on any device).
    """
    try:
        reference = run_model(original, inputs)
    except tf.errors.UnimplementedError as exc:
        raise OriginalCannotRunError(
            f"TensorFlow cannot run the original model on this machine "
            f"({tensorflow_reason(exc)})") from None
    return compare_outputs(reference, run_model(rewritten, inputs),
                           "the rewritten model").max_difference
