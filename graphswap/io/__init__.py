"""Files in and out: loading models (Keras 3, legacy HDF5, graphswap SavedModels, Keras 2
SavedModels), output paths and atomic writes, saving, `convert`, and the exports (lowered and
kept-kernel ONNX, the graphswap SavedModel, the onnxruntime custom ops).

Modules: paths (validation, default names, atomic writes), keras3 / keras2 / dual_savedmodel /
load (reading), saving (save_model: .keras, .h5 or a SavedModel directory), convert, lowering
(swapped layers back to stock ones), signatures, export_result, onnx_export, savedmodel_program
(a SavedModel is a program: checked, from a private copy, before TensorFlow reads it),
savedmodel, export (dispatch, reading metadata back), onnx_ops.
"""

from graphswap.io.convert import ConvertResult, convert
from graphswap.io.dual_savedmodel import is_graphswap_saved_model, read_manifest
from graphswap.io.export import (export_model, export_onnx, export_saved_model, read_metadata)
from graphswap.io.export_result import ExportResult
from graphswap.io.load import load_model
from graphswap.io.lowering import kept_kernel_model, lower_model, swapped_layers
from graphswap.io.onnx_ops import session as onnx_session
from graphswap.io.paths import (MODEL_OUTPUT_SUFFIXES, atomic_output, check_model_output_path,
                                check_output_path, default_output_path, model_output_format)
from graphswap.io.saving import save_model

__all__ = ["MODEL_OUTPUT_SUFFIXES", "ConvertResult", "ExportResult", "atomic_output",
           "check_model_output_path", "check_output_path", "convert", "default_output_path",
           "export_model", "export_onnx", "export_saved_model", "is_graphswap_saved_model",
           "kept_kernel_model", "load_model", "lower_model", "model_output_format",
           "onnx_session", "read_manifest", "read_metadata", "save_model", "swapped_layers"]
