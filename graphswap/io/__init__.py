"""Files in and out: loading models (Keras 3, legacy HDF5, Keras 2 SavedModels), output paths and
atomic writes, `convert`, and the exports (lowered and kept-kernel ONNX, inference SavedModel,
the onnxruntime custom ops).

Modules: paths (validation, default names, atomic writes, save_model), keras3 / keras2 / load
(reading), convert, lowering (swapped layers back to stock ones), signatures, export_result,
onnx_export, savedmodel, export (dispatch, reading metadata back), onnx_ops.
"""

from graphswap.io.convert import ConvertResult, convert
from graphswap.io.export import (export_model, export_onnx, export_saved_model, read_metadata)
from graphswap.io.export_result import ExportResult
from graphswap.io.load import load_model
from graphswap.io.lowering import kept_kernel_model, lower_model, swapped_layers
from graphswap.io.onnx_ops import session as onnx_session
from graphswap.io.paths import (MODEL_OUTPUT_SUFFIXES, atomic_output, check_output_path,
                                default_output_path, save_model)

__all__ = ["MODEL_OUTPUT_SUFFIXES", "ConvertResult", "ExportResult", "atomic_output", "check_output_path", "convert",
           "default_output_path", "export_model", "export_onnx", "export_saved_model",
           "kept_kernel_model", "load_model", "lower_model", "onnx_session", "read_metadata",
           "save_model", "swapped_layers"]
