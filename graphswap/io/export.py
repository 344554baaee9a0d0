"""Exporting swapped Keras models: lowered ONNX, kept-kernel ONNX, inference SavedModel.

Three products, all written atomically (temporary file/directory beside the target, renamed only
after the export has been verified):

* **Lowered ONNX** (`export_onnx(model, path)`): every SwappedDense/SwappedConv2D becomes a plain
  Dense/Conv2D with the same (fine-tuned) weights, so the ONNX graph holds only standard ops
  (MatMul, Conv, ...).  It computes what the model computes with the *exact* kernel.  Converted with
  tf2onnx's `from_function` (its `from_keras` fails on Keras 3) and checked with onnxruntime against
  the lowered Keras model on a sample batch.
* **Kept-kernel ONNX** (`export_onnx(model, path, keep_kernels=True)`): the product of every
  swapped layer becomes a custom node (domain `ai.onnx.contrib`, ops GraphswapMatMul /
  GraphswapConv2D, see graphswap.onnx_ops) that onnxruntime runs with the same C kernels through
  onnxruntime-extensions; open it with `graphswap.onnx_session(path)`.  Checked against the
  swapped Keras model.
* **SavedModel** (`export_saved_model(model, path)`): the lowered model behind a `serving_default`
  signature with named inputs (the model's input names) and named outputs (its output layers'
  names).  Only standard TensorFlow ops are serialized, so it serves in TF Serving or any Python
  with TensorFlow, without graphswap; the approximate arithmetic does NOT run in it (a
  `tf.numpy_function` body is not serialized).  A model that still contains Python ops after
  lowering (custom layers calling numpy_function/py_function) is refused.

Every export records which layers were swapped and with which kernel (the multiplier the model was
trained for): in ONNX as the JSON value of metadata_props key "graphswap", in the SavedModel as the
asset `assets/graphswap_kernels.json`.  Read them back with `read_metadata(path)`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from graphswap.errors import ExportError, ModelLoadError
from graphswap.input_files import load_json, read_regular, require_regular
from graphswap.io.keras3 import MAX_ARCHIVE_JSON_BYTES
from graphswap.io.export_result import (ASSET_NAME, DEFAULT_OPSET, FORMATS, METADATA_KEY,
                                        ExportResult)
from graphswap.io.onnx_export import export_onnx
from graphswap.io.savedmodel import export_saved_model


def export_model(model, path, format: str = "onnx", keep_kernels: bool = False,  # noqa: A002
                 opset: int = DEFAULT_OPSET, force: bool = False,
                 check_batch: int = 8, sequence_length=None) -> ExportResult:
    """Export `model` as `format` ("onnx" or "savedmodel"); see export_onnx / export_saved_model.
    `sequence_length`: the length free (None) input dimensions take in the verifying batch."""
    if format not in FORMATS:
        raise ExportError(f"unknown export format {format!r}; allowed: {', '.join(FORMATS)}")
    if format == "savedmodel":
        if keep_kernels:
            raise ExportError(
                "a SavedModel cannot keep the C kernels: they run inside tf.numpy_function, whose "
                "Python body is not serialized into a SavedModel, so it could not serve. Export "
                "the SavedModel lowered (without --keep-kernels: exact float32 arithmetic), or use "
                "--format onnx --keep-kernels to run the kernels in onnxruntime")
        return export_saved_model(model, path, force=force, check_batch=check_batch,
                                  sequence_length=sequence_length)
    return export_onnx(model, path, keep_kernels=keep_kernels, opset=opset, force=force,
                       check_batch=check_batch, sequence_length=sequence_length)


def read_metadata(path) -> dict:
    """The graphswap metadata document of an exported ONNX file or SavedModel directory."""
    path = Path(path)
    if path.is_dir():
        asset = path / "assets" / ASSET_NAME
        if not os.path.lexists(asset):
            raise ModelLoadError(f"{path} has no graphswap metadata ({asset} is missing)")
        return _metadata_json(read_regular(asset, "graphswap metadata", MAX_ARCHIVE_JSON_BYTES,
                                           ModelLoadError), asset)
    if not path.exists():
        raise ModelLoadError(f"exported model not found: {path}")
    require_regular(path, "exported ONNX model", ModelLoadError)  # a FIFO: refused, not waited on
    import onnx

    model_proto = onnx.load(str(path), load_external_data=False)
    for entry in model_proto.metadata_props:
        if entry.key == METADATA_KEY:
            return _metadata_json(entry.value, f"{path} (metadata_props {METADATA_KEY!r})")
    raise ModelLoadError(f"{path} has no graphswap metadata (metadata_props key "
                         f"{METADATA_KEY!r} is missing)")


def _metadata_json(text, where) -> dict:
    """The metadata document `text` (bytes or str) of `where`: ModelLoadError for text that is no
    JSON object, or nests deeper than graphswap writes."""
    try:
        document = load_json(text, f"the graphswap metadata {where}", ModelLoadError)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"the graphswap metadata {where} is not JSON ({exc}); it was edited "
                             f"or damaged: export the model again") from None
    if not isinstance(document, dict):
        raise ModelLoadError(f"the graphswap metadata {where} is a JSON "
                             f"{type(document).__name__}, not the object graphswap writes; it was "
                             f"edited: export the model again")
    return document
