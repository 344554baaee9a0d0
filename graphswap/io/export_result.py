"""What every export records and how it is verified: the metadata document (which layer ran
which kernel), the result object, and the comparison with the Keras model on a sample batch."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from graphswap._version import __version__
from graphswap.errors import ExportError, GraphswapError
from graphswap.io import onnx_ops
from graphswap.swap import compare_outputs

FORMATS = ("onnx", "savedmodel")
METADATA_KEY = "graphswap"
ASSET_NAME = "graphswap_kernels.json"
METADATA_SCHEMA = 1
DEFAULT_OPSET = 17


@dataclasses.dataclass
class ExportResult:
    path: Path
    format: str           # "onnx-lowered", "onnx-kept-kernels" or "savedmodel"
    layers: list
    inputs: list
    outputs: list
    max_abs_difference: float | None
    reference: str        # what the export was checked against

    def to_dict(self) -> dict:
        return {"output": str(self.path), "format": self.format,
                "inputs": self.inputs, "outputs": self.outputs,
                "swapped_layers": [layer.to_dict() for layer in self.layers],
                "max_abs_difference": self.max_abs_difference, "checked_against": self.reference}



def precision_floor(model) -> float:
    """Smallest sensible relative tolerance for the model's compute dtype: a float16/bfloat16
    (mixed-precision) model's outputs carry ~1e-3..1e-2 relative rounding, which onnxruntime and
    TensorFlow accumulate differently; a float32 model needs no floor."""
    dtypes = {str(getattr(layer, "compute_dtype", "float32")) for layer in model.layers}
    if "bfloat16" in dtypes:
        return 3e-2
    if "float16" in dtypes:
        return 2e-2
    return 0.0


def allowed_difference(comparison, relative: float) -> float:
    """The largest |difference| an export may have: `relative` times the outputs' scale."""
    return relative * comparison.scale


def verify_export(reference: list, actual: list, relative: float, what: str) -> float:
    """The export's largest |difference| from the Keras model; ExportError (nothing written) if
    it exceeds `relative` times the outputs' scale."""
    try:
        comparison = compare_outputs(reference, [np.asarray(a) for a in actual], f"the {what}")
    except GraphswapError as exc:
        raise ExportError(f"verification failed: {exc}; nothing was written") from None
    difference = comparison.max_difference
    allowed = allowed_difference(comparison, relative)
    if not np.isfinite(difference) or difference > allowed:
        raise ExportError(
            f"verification failed: the exported {what} differs from the Keras model by "
            f"{difference:.3g} on a sample batch (allowed {allowed:.3g}); nothing was written")
    return difference


def metadata_document(records, fmt: str, model_name: str, inputs, outputs) -> dict:
    """The JSON document stored with every export (ONNX metadata_props / SavedModel asset)."""
    doc = {"schema": METADATA_SCHEMA, "producer": "graphswap", "graphswap_version": __version__,
           "format": fmt, "model": model_name, "inputs": list(inputs), "outputs": list(outputs),
           "swapped_layers": [r.to_dict() for r in records]}
    if fmt == "onnx-kept-kernels":
        doc["custom_domain"] = onnx_ops.DOMAIN
        doc["custom_ops"] = list(onnx_ops.CUSTOM_OPS)
        doc["note"] = ("custom nodes run graphswap kernels; open with "
                       "graphswap.onnx_session(path)")
    elif records:
        doc["note"] = ("swapped layers are lowered to standard float32 ops: this graph computes the "
                       "exact-kernel model; 'kernel' names the arithmetic each layer was trained "
                       "for")
    return doc

