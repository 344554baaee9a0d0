"""Counting weight multiply-accumulates per sample: `layer_macs` asks the layer's kind
(graphswap.swap.kinds.registry.counting_kind) for its count; here too is what the kinds' counts
share: the length free input dimensions are counted at, a layer's input shape, and the formulas
several kinds use (convolutions, recurrent layers).

A free dimension of a layer's input (None beyond the batch: a sequence of any length, an image of
any size) is counted at the length `counting_length(n)` sets around the count (None:
graphswap.swap.compare.DEFAULT_SEQUENCE_LENGTH).
"""

from __future__ import annotations

import contextlib
import contextvars

import keras
import numpy as np

from graphswap.errors import UnsupportedLayerError
from graphswap.swap.compare import DEFAULT_SEQUENCE_LENGTH, validate_sequence_length
from graphswap.swap.kinds.registry import counting_kind

_COUNTING_LENGTH = contextvars.ContextVar("graphswap_counting_length", default=None)


@contextlib.contextmanager
def counting_length(length):
    """Within: free input dimensions are counted at `length` (None: DEFAULT_SEQUENCE_LENGTH)."""
    token = _COUNTING_LENGTH.set(None if length is None else validate_sequence_length(length))
    try:
        yield
    finally:
        _COUNTING_LENGTH.reset(token)


def current_counting_length() -> int:
    length = _COUNTING_LENGTH.get()
    return DEFAULT_SEQUENCE_LENGTH if length is None else length


def fixed(shape):
    """`shape` with its free dimensions beyond the batch at the counting length."""
    if shape is None:
        return None
    length = current_counting_length()
    return (shape[0], *(length if d is None else d for d in shape[1:]))


def input_shape_of(layer):
    """The (first) input shape a layer was called or built with, or None."""
    try:
        inputs = layer.input
        if isinstance(inputs, (list, tuple)):
            inputs = inputs[0]
        return tuple(inputs.shape)
    except (AttributeError, ValueError, IndexError):
        pass
    shapes = getattr(layer, "_build_shapes_dict", None)
    if shapes:
        first = next(iter(shapes.values()))
        if isinstance(first, (list, tuple)) and first and isinstance(first[0], (list, tuple)):
            first = first[0]  # a list of input shapes
        if isinstance(first, (list, tuple)):
            return tuple(first)
    return None


def prod(values) -> int:
    return int(np.prod([int(v) for v in values], dtype=np.int64)) if values else 1


def spatial(shape, layer):
    return shape[2:] if getattr(layer, "data_format", "channels_last") == "channels_first" \
        else shape[1:-1]


def channels(shape, layer) -> int:
    return int(shape[1] if getattr(layer, "data_format", "channels_last") == "channels_first"
               else shape[-1])


def output_positions(layer, shape) -> int:
    """Output positions of a convolution (rows x columns, or steps)."""
    return prod(spatial(layer.compute_output_shape(shape), layer))


def conv_macs(layer, shape) -> int:
    """A plain convolution (1-D, 2-D, 3-D, grouped): positions x filters x taps x in/groups."""
    taps = prod(layer.kernel_size)
    return output_positions(layer, shape) * int(layer.filters) * taps * (
        channels(shape, layer) // int(layer.groups))


def cell_step_macs(cell) -> int:
    """Weight MACs of one step of a built recurrent cell: every 2-D kernel it holds (input and
    recurrent: LSTMCell, GRUCell, SimpleRNNCell and cells like them), the cells of a stack
    summed; 0 for cells without such kernels (convolutional cells)."""
    if isinstance(cell, keras.layers.StackedRNNCells):
        return sum(cell_step_macs(inner) for inner in cell.cells)
    total = 0
    for attribute in ("kernel", "recurrent_kernel"):
        weight = getattr(cell, attribute, None)
        if weight is not None and len(weight.shape) == 2:
            total += prod(weight.shape)
    return total


def recurrent_macs(layer, shape) -> int:
    """Weight MACs per sample of a built RNN layer (LSTM, GRU, SimpleRNN, RNN) or a
    Bidirectional around one: timesteps x (input_dim + units) x gates x units per direction
    (an unknown sequence length at the counting length)."""
    shape = fixed(shape)
    if isinstance(layer, keras.layers.Bidirectional):
        return recurrent_macs(layer.forward_layer, shape) + \
            recurrent_macs(layer.backward_layer, shape)
    if len(shape) < 3 or not getattr(layer.cell, "built", False):
        return 0
    return int(shape[1]) * cell_step_macs(layer.cell)


def weight_macs(layer, shape) -> int:
    """Weight MACs per sample of `layer` at input `shape` (free dimensions fixed) by its kind's
    count: 0 for a layer no kind counts, and for a kind that counts from shapes of its own
    (attention) when a wrapper passes one."""
    kind = counting_kind(layer)
    if kind is None or not kind.macs_need_shape or not shape:
        return 0
    return kind.macs(layer, shape)


def layer_macs(layer) -> int:
    """Weight multiply-accumulates per sample of a layer (0 if not built, unknown or none)."""
    kind = counting_kind(layer)
    if kind is None or not getattr(layer, "built", False):
        return 0
    try:
        if not kind.macs_need_shape:
            return kind.macs(layer, None)
        return weight_macs(layer, fixed(input_shape_of(layer)))
    except (TypeError, ValueError, AttributeError, UnsupportedLayerError):
        return 0
