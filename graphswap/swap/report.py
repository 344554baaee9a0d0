"""What a rewrite did, layer by layer: the report rewrite_model returns and `convert` prints, and
the multiply-accumulates of a layer (each kind counts its own: its module of graphswap.swap.kinds,
through graphswap.swap.kinds.counting.layer_macs).

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

import dataclasses
import json

import keras

from graphswap.swap.kinds.counting import current_counting_length, input_shape_of, layer_macs
from graphswap.tables import format_table


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
