"""What a rewrite did, layer by layer: the report rewrite_model returns and `convert` prints, and
the multiply-accumulates of a layer."""

from __future__ import annotations

import dataclasses
import json

import keras
import numpy as np

from graphswap.tables import format_table


@dataclasses.dataclass
class LayerReport:
    """One line of a rewrite report."""

    path: str            # "outer_model/inner_model/dense_1"
    layer_type: str      # class name of the original layer
    action: str          # "swapped", "kept" or a transform-specific verb
    reason: str = ""     # why it was kept / what was done
    kernel: str = ""     # kernel spec, for swapped layers
    macs: int = 0        # multiply-accumulates per sample (Dense/Conv2D), 0 if unknown

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

    def to_dict(self) -> dict:
        return {"model": self.model_name,
                "swapped": len(self.swapped),
                "layers": [entry.to_dict() for entry in self.layers],
                "notes": list(self.notes)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def format_table(self) -> str:
        headers = ("layer", "type", "action", "kernel", "MACs/sample", "note")
        rows = [(e.path, e.layer_type, e.action, e.kernel, f"{e.macs:,}" if e.macs else "",
                 e.reason) for e in self.layers]
        out = format_table(headers, rows)
        total = sum(e.macs for e in self.swapped)
        out.append(f"{len(self.swapped)} of {sum(1 for e in self.layers if e.macs)} Dense/Conv2D "
                   f"layers swapped, {total:,} swapped MACs per sample")
        out.extend(self.notes)
        return "\n".join(out)


def layer_macs(layer) -> int:
    """Multiply-accumulates per sample of a Dense or Conv2D layer (0 if not built/unknown)."""
    try:
        input_shape = layer.input.shape if not isinstance(layer.input, list) else None
    except (AttributeError, ValueError):
        input_shape = None
    if input_shape is None:
        try:
            input_shape = layer._build_shapes_dict and next(iter(layer._build_shapes_dict.values()))
        except (AttributeError, StopIteration, TypeError):
            input_shape = None
    if not input_shape:
        return 0
    if isinstance(layer, keras.layers.Dense):
        positions = int(np.prod([d for d in input_shape[1:-1]] or [1]))
        return positions * int(input_shape[-1]) * int(layer.units)
    if isinstance(layer, keras.layers.Conv2D):
        if not layer.built:
            return 0
        output_shape = layer.compute_output_shape(input_shape)
        if layer.data_format == "channels_first":
            out_h, out_w = output_shape[2], output_shape[3]
            in_c = input_shape[1]
        else:
            out_h, out_w = output_shape[1], output_shape[2]
            in_c = input_shape[3]
        kh, kw = layer.kernel_size
        if None in (out_h, out_w, in_c):
            return 0
        return int(out_h * out_w * layer.filters * kh * kw * (in_c // layer.groups))
    return 0
