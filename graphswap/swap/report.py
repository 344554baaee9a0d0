"""What a rewrite did, layer by layer: the report rewrite_model returns and `convert` prints, and
the multiply-accumulates of a layer.

MACs are counted per sample for every layer with weights graphswap can count - swapped or not, so
a report shows what stays exact float arithmetic: Dense, EinsumDense, every Keras convolution
(1-D/2-D/3-D, depthwise, separable, transposed), recurrent layers (LSTM, GRU, SimpleRNN, RNN of
such cells, Bidirectional: timesteps x (input_dim + units) x gates x units per direction),
TimeDistributed (timesteps x its layer's; swapped with it) and MultiHeadAttention (its
projections; the attention-score products Q K^T and scores x V are counted apart as
`float_macs`, because they multiply activations by activations and no swapped layer runs them).
A transposed convolution counts input positions x taps x input channels x filters (the products
with inserted zeros that the kernel also computes are not counted).

A free dimension of a layer's input (None beyond the batch: a sequence of any length, an image of
any size) is counted at the length `counting_length(n)` sets around the count (convert: the
data's length, `--sequence-length`, else graphswap.swap.compare.DEFAULT_SEQUENCE_LENGTH); the
layer's line records it (`length`) and the summary says "at length n".
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json

import keras
import numpy as np
from keras.src.layers.convolutional.base_conv import BaseConv  # Keras 3 has no public bases
from keras.src.layers.convolutional.base_conv_transpose import BaseConvTranspose
from keras.src.layers.convolutional.base_depthwise_conv import BaseDepthwiseConv
from keras.src.layers.convolutional.base_separable_conv import BaseSeparableConv

from graphswap.errors import UnsupportedLayerError
from graphswap.native import einsum_plan
from graphswap.swap.compare import DEFAULT_SEQUENCE_LENGTH, validate_sequence_length
from graphswap.tables import format_table

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


def _fixed(shape):
    """`shape` with its free dimensions beyond the batch at the counting length."""
    if shape is None:
        return None
    length = current_counting_length()
    return (shape[0], *(length if d is None else d for d in shape[1:]))


@dataclasses.dataclass
class LayerReport:
    """One line of a rewrite report."""

    path: str            # "outer_model/inner_model/dense_1"
    layer_type: str      # class name of the original layer
    action: str          # "swapped", "kept" or a transform-specific verb
    reason: str = ""     # why it was kept / what was done
    kernel: str = ""     # kernel spec, for swapped layers
    macs: int = 0        # weight multiply-accumulates per sample, 0 if none/unknown
    float_macs: int = 0  # products inside the layer no kernel runs (attention scores)
    length: int | None = None   # the length its free input dimensions were counted at

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class RewriteReport:
    model_name: str
    layers: list[LayerReport]
    notes: list = dataclasses.field(default_factory=list)   # quantization, calibration, folding

    @property
    def swapped(self) -> list[LayerReport]:
        return [entry for entry in self.layers if entry.action == "swapped"]

    @property
    def kernel_macs(self) -> int:
        """Weight MACs per sample that run on a kernel."""
        return sum(e.macs for e in self.swapped)

    @property
    def total_macs(self) -> int:
        """Weight MACs per sample of every counted layer, swapped or not."""
        return sum(e.macs for e in self.layers)

    @property
    def attention_macs(self) -> int:
        return sum(e.float_macs for e in self.layers)

    @property
    def counted_length(self) -> int | None:
        """The length free input dimensions were counted at (None: the model has none)."""
        return max((e.length for e in self.layers if e.length), default=None)

    def by_type(self) -> dict:
        """{layer type: {"layers", "swapped", "kernel_macs", "float_macs"}} over counted layers."""
        summary: dict = {}
        for e in self.layers:
            if not e.macs and e.action != "swapped":
                continue
            row = summary.setdefault(e.layer_type, {"layers": 0, "swapped": 0, "kernel_macs": 0,
                                                    "float_macs": 0})
            row["layers"] += 1
            if e.action == "swapped":
                row["swapped"] += 1
                row["kernel_macs"] += e.macs
            else:
                row["float_macs"] += e.macs
        return summary

    def summary_line(self) -> str:
        total = self.total_macs
        share = 100.0 * self.kernel_macs / total if total else 0.0
        line = f"{share:.1f}% of {total:,} MACs per sample on the kernel"
        if self.counted_length:
            line = line.replace("per sample", f"per sample at length {self.counted_length}")
        if self.attention_macs:
            line += (f" (plus {self.attention_macs:,} attention-score MACs, activations x "
                     f"activations, in float)")
        return line

    def to_dict(self) -> dict:
        return {"model": self.model_name,
                "swapped": len(self.swapped),
                "macs": {"kernel": self.kernel_macs, "total": self.total_macs,
                         "attention_float": self.attention_macs, "by_type": self.by_type(),
                         "length": self.counted_length},
                "summary": self.summary_line(),
                "layers": [entry.to_dict() for entry in self.layers],
                "notes": list(self.notes)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def format_table(self) -> str:
        headers = ("layer", "type", "action", "kernel", "MACs/sample", "note")
        rows = [(e.path, e.layer_type, e.action, e.kernel, f"{e.macs:,}" if e.macs else "",
                 e.reason) for e in self.layers]
        out = format_table(headers, rows)
        by_type = self.by_type()
        if by_type:
            out.append("")
            out.extend(format_table(
                ("type", "layers", "swapped", "MACs/sample on kernel", "MACs/sample float"),
                [(name, str(row["layers"]), str(row["swapped"]), f"{row['kernel_macs']:,}",
                  f"{row['float_macs']:,}") for name, row in by_type.items()]))
        counted = sum(1 for e in self.layers if e.macs or e.action == "swapped")
        out.append(f"{len(self.swapped)} of {counted} layers with weights swapped; "
                   f"{self.summary_line()}")
        if self.counted_length:
            out.append(f"free (None) input dimensions - sequence lengths, image sizes - are "
                       f"counted at length {self.counted_length} (--sequence-length N)")
        out.extend(self.notes)
        return "\n".join(out)


def quantization_line(layer) -> str:
    """How a swapped layer quantizes, for the report (its static range left out: the
    calibration note lists ranges): the kernel's own words where it has them (an FP8
    multiplier names its format), else its QuantScheme's (int8 / uint8, an 8xN's N bits)."""
    scheme = dataclasses.replace(layer.quantization, activation_range=None)
    arithmetic = getattr(layer, "arithmetic", None)
    if hasattr(arithmetic, "describe_scheme"):
        return arithmetic.describe_scheme(scheme)
    return scheme.describe(getattr(arithmetic, "weight_bits", 8),
                           getattr(arithmetic, "activation_bits", 8))


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


def _prod(values) -> int:
    return int(np.prod([int(v) for v in values], dtype=np.int64)) if values else 1


def _spatial(shape, layer):
    return shape[2:] if getattr(layer, "data_format", "channels_last") == "channels_first" \
        else shape[1:-1]


def _channels(shape, layer):
    return shape[1] if getattr(layer, "data_format", "channels_last") == "channels_first" \
        else shape[-1]


def attention_macs(layer) -> tuple[int, int]:
    """(projection MACs, attention-score MACs) per sample of a built MultiHeadAttention."""
    query, value = getattr(layer, "_query_dense", None), getattr(layer, "_value_dense", None)
    output = getattr(layer, "_output_dense", None)
    inputs = [getattr(layer, a, None) for a in ("_query_dense", "_key_dense", "_gate_dense",
                                                "_value_dense")]
    projection_macs = sum(layer_macs(p) for p in inputs if p is not None)
    q_shape = _fixed(input_shape_of(query)) if query is not None else None
    v_shape = _fixed(input_shape_of(value)) if value is not None else None
    scores = 0
    if q_shape and None not in q_shape[1:]:
        targets = _prod(q_shape[1:-1])
        if output is not None:  # Keras builds it with the sequence length unknown
            projection_macs += targets * _prod(output.kernel.shape)
        if v_shape and None not in v_shape[1:]:
            scores = targets * _prod(v_shape[1:-1]) * layer.num_heads * (layer.key_dim
                                                                         + layer.value_dim)
    return projection_macs, scores


def layer_macs(layer) -> int:
    """Weight multiply-accumulates per sample of a layer (0 if not built, unknown or none)."""
    if isinstance(layer, keras.layers.MultiHeadAttention):
        return attention_macs(layer)[0] if layer.built else 0
    shape = _fixed(input_shape_of(layer))
    if not shape or not getattr(layer, "built", False):
        return 0
    try:
        return _weight_macs(layer, shape)
    except (TypeError, ValueError, AttributeError, UnsupportedLayerError):
        return 0


def assumed_length(layer) -> int | None:
    """The length `layer_macs` counted the layer's free input dimensions at (None: it has none,
    or no MACs)."""
    shapes = [input_shape_of(layer)]
    if isinstance(layer, keras.layers.MultiHeadAttention):
        shapes = [input_shape_of(part) for part in (getattr(layer, "_query_dense", None),
                                                    getattr(layer, "_value_dense", None))
                  if part is not None]
    if any(shape and None in shape[1:] for shape in shapes) and layer_macs(layer):
        return current_counting_length()
    return None


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
            total += _prod(weight.shape)
    return total


def recurrent_macs(layer, shape) -> int:
    """Weight MACs per sample of a built RNN layer (LSTM, GRU, SimpleRNN, RNN) or a
    Bidirectional around one: timesteps x (input_dim + units) x gates x units per direction
    (an unknown sequence length at the counting length)."""
    shape = _fixed(shape)
    if isinstance(layer, keras.layers.Bidirectional):
        return recurrent_macs(layer.forward_layer, shape) + \
            recurrent_macs(layer.backward_layer, shape)
    if len(shape) < 3 or not getattr(layer.cell, "built", False):
        return 0
    return int(shape[1]) * cell_step_macs(layer.cell)


def _weight_macs(layer, shape) -> int:
    layers = keras.layers
    if isinstance(layer, (layers.RNN, layers.Bidirectional)):
        return recurrent_macs(layer, shape)
    if isinstance(layer, layers.TimeDistributed):   # timesteps x the wrapped layer's
        if len(shape) < 3 or not layer.layer.built:
            return 0
        return int(shape[1]) * _weight_macs(layer.layer, (shape[0], *shape[2:]))
    if isinstance(layer, layers.EinsumDense):
        return einsum_plan(layer.equation, len(shape)).macs(shape, tuple(layer.kernel.shape))
    if isinstance(layer, layers.Dense):
        return _prod(shape[1:-1]) * int(shape[-1]) * int(layer.units)
    if isinstance(layer, (BaseConv, BaseDepthwiseConv, BaseSeparableConv, BaseConvTranspose)):
        in_c = int(_channels(shape, layer))
        taps = _prod(layer.kernel_size)
        if isinstance(layer, BaseConvTranspose):
            return _prod(_spatial(shape, layer)) * taps * in_c * int(layer.filters)
        out = layer.compute_output_shape(shape)
        positions = _prod(_spatial(out, layer))
        if isinstance(layer, BaseDepthwiseConv):
            return positions * in_c * int(layer.depth_multiplier) * taps
        if isinstance(layer, BaseSeparableConv):
            middle = in_c * int(layer.depth_multiplier)
            return positions * (middle * taps + middle * int(layer.filters))
        return positions * int(layer.filters) * taps * (in_c // int(layer.groups))
    return 0
