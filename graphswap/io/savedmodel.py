"""The SavedModel export: the lowered model behind a `serving_default` signature with named inputs
and outputs, only standard TensorFlow ops, so it serves without graphswap (the approximate
arithmetic does not run in it: a tf.numpy_function body is not serialized) - plus the rewritten
Keras model itself and a manifest in assets/graphswap/, so graphswap reopens the directory for
fine-tuning and re-saving (graphswap.io.dual_savedmodel)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf

from graphswap.errors import ExportError, ModelLoadError
from graphswap.io.dual_savedmodel import embed_model
from graphswap.io.export_result import ASSET_NAME, ExportResult, metadata_document, verify_export
from graphswap.io.onnx_export import PYTHON_OPS
from graphswap.io.paths import atomic_output, check_output_path
from graphswap.io.savedmodel_program import check_program
from graphswap.io.savedmodel_serving import save_serving_module, serving_module
from graphswap.io.signatures import feeds
from graphswap.swap import (free_dimension_length, has_free_dimensions, run_model,
                            sample_inputs)


#: ops whose work is not in the graph: Python callbacks, and graphswap's compiled forward op
#: (it calls kernel addresses registered in the tracing process)
PROCESS_LOCAL_OPS = (*PYTHON_OPS, "GraphswapForward")


def python_ops_in(concrete) -> list[str]:
    found = []
    graph_def = concrete.graph.as_graph_def()
    for node in graph_def.node:
        if node.op in PROCESS_LOCAL_OPS:
            found.append(node.name)
    for function in graph_def.library.function:
        for node in function.node_def:
            if node.op in PROCESS_LOCAL_OPS:
                found.append(f"{function.signature.name}/{node.name}")
    return found


def export_saved_model(model, path, force: bool = False, check_batch: int = 8,
                       sequence_length=None) -> ExportResult:
    """Export `model` as a graphswap SavedModel directory at `path`: the lowered model for serving,
    the model itself (assets/graphswap/model.keras) and the manifest tying them together.

    Signature `serving_default`: named inputs (the model's input names) -> dict of named outputs.
    The swapped layers run as standard float32 MatMul/Conv2D (exact arithmetic), so the SavedModel
    needs only TensorFlow.  Refuses (ExportError, nothing written) a model that would still contain
    Python ops.  Verified by loading the written SavedModel and comparing with the lowered Keras
    model on a sample batch (free input dimensions at `sequence_length`, None: the default); the
    serving graph must pass graphswap.io.savedmodel_program (so graphswap can reopen what it
    wrote).
    """
    path = Path(path)
    check_output_path(path, force)
    if check_batch < 1:
        raise ExportError("check_batch must be at least 1: every export is verified")
    # the module is built as graphswap rebuilds it to check the directory when it reopens it
    built = serving_module(model)
    module, concrete, lowered, records = built.module, built.concrete, built.lowered, built.records
    input_names, output_names, specs = built.input_names, built.output_names, built.specs
    python_ops = python_ops_in(concrete)
    if python_ops:
        raise ExportError(
            f"cannot export a SavedModel that serves: op(s) {', '.join(python_ops[:5])} run Python "
            f"code (tf.numpy_function / tf.py_function), whose body is not serialized into a "
            f"SavedModel, so it would fail when served. Replace that layer with TensorFlow ops, or "
            f"export ONNX instead")
    doc = metadata_document(records, "savedmodel", model.name, input_names, output_names)
    batch = sample_inputs(model, check_batch, sequence_length=sequence_length)
    reference = run_model(lowered, batch)
    with tempfile.TemporaryDirectory(prefix="graphswap-export-") as scratch:
        asset_file = Path(scratch) / ASSET_NAME
        asset_file.write_text(json.dumps(doc, indent=2, sort_keys=True), encoding="utf-8")
        module.graphswap_metadata = tf.saved_model.Asset(str(asset_file))
        with atomic_output(path, force, suffix="") as tmp:
            try:
                save_serving_module(built, tmp)
            except Exception as exc:  # noqa: BLE001 - one clear line
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                raise ExportError(f"writing the SavedModel failed: {type(exc).__name__}: "
                                  f"{first}") from None
            loaded = tf.saved_model.load(str(tmp))
            serving = loaded.signatures["serving_default"]
            inputs = {name: tf.constant(value, dtype=spec.dtype)
                      for (name, value), spec in zip(feeds(batch, input_names).items(), specs)}
            result = serving(**inputs)
            actual = [np.asarray(result[name]) for name in output_names]
            difference = verify_export(reference, actual, 1e-4, "SavedModel")
            try:
                check_program(tmp, own_export=True)
            except ModelLoadError as exc:
                raise ExportError(f"the SavedModel could not be reopened by graphswap: "
                                  f"{str(exc).replace(str(tmp), str(path))}; nothing was written") \
                    from None
            embed_model(model, tmp, records, input_names, output_names, check_batch,
                        free_dimension_length(model, requested=sequence_length)
                        if has_free_dimensions(model) else None)
    return ExportResult(path, "savedmodel", records, input_names, output_names, difference,
                        "Keras model with the swapped layers lowered (exact kernel)")

