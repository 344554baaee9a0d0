"""ONNX exports: lowered (standard ops, the exact-kernel model) and kept-kernel (custom
ai.onnx.contrib nodes running graphswap's kernels in onnxruntime).  Converted with tf2onnx's
`from_function` on a traced serving function (its `from_keras` fails on Keras 3), then run with
onnxruntime on a sample batch and compared with the Keras model before it is written."""

from __future__ import annotations

import contextlib
import json
import logging
import re
from pathlib import Path

from graphswap.errors import ExportError, GraphswapError
from graphswap.io import onnx_ops
from graphswap.io.export_result import (DEFAULT_OPSET, METADATA_KEY, ExportResult,
                                        metadata_document, precision_floor, verify_export)
from graphswap.io.lowering import MARKER_RE, kept_kernel_model, lower_model, swapped_layers
from graphswap.io.onnx_fp8 import add_fp8_qdq
from graphswap.io.paths import atomic_output, check_output_path
from graphswap.io.signatures import feeds, input_specs, serving_function, signature_names
from graphswap.swap import run_model, sample_inputs
from graphswap.swap.text_inputs import string_layers

PYTHON_OPS = ("PyFunc", "PyFuncStateless", "EagerPyFunc")
#: which product of a layer a PyFunc is (graphswap.io.kept_layers.part_name)
PART_RE = re.compile(r"graphswap_export_\d+_part(\d+)")


def _kept_node_handler(records, problems):
    def handler(ctx, node, name, args):  # noqa: ARG001 - tf2onnx's handler signature
        match = MARKER_RE.search(node.name)
        if match is None or int(match.group(1)) >= len(records):
            problems.append(f"{node.name} ({node.type})")
            return node
        record = records[int(match.group(1))]
        for attribute in list(node.attr):
            del node.attr[attribute]
        node.domain = onnx_ops.DOMAIN
        node.set_attr("kernel", json.dumps(record.kernel, sort_keys=True))
        part = PART_RE.search(node.name)
        part = int(part.group(1)) if part else 0
        quant = record.quantization
        if record.part_quantizations and part < len(record.part_quantizations):
            # each product its own scheme (SeparableConv2D's pointwise, attention's projections)
            quant = record.part_quantizations[part]
        node.set_attr("quant", json.dumps(quant, sort_keys=True) if quant is not None else "")
        node.type, attributes = record.layer.onnx_node(part)
        for key, value in attributes.items():
            node.set_attr(key, value)
        return node

    return handler


def _python_op_handler(problems):
    def handler(ctx, node, name, args):  # noqa: ARG001
        problems.append(f"{node.name} ({node.type})")
        return node

    return handler


def _convert_onnx(fn, specs, opset, handler, keep_kernels):
    import onnx
    import tf2onnx

    extra = [onnx.helper.make_opsetid(onnx_ops.DOMAIN, 1)] if keep_kernels else None
    try:
        with _quiet_tf2onnx():
            model_proto, _ = tf2onnx.convert.from_function(
                fn, input_signature=specs, opset=opset,
                custom_op_handlers={op: (handler, []) for op in PYTHON_OPS}, extra_opset=extra)
    except GraphswapError:
        raise
    except Exception as exc:  # noqa: BLE001 - tf2onnx raises many types; report in one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportError(f"tf2onnx could not convert the model: {type(exc).__name__}: {first}") \
            from None
    return model_proto


@contextlib.contextmanager
def _quiet_tf2onnx():
    """tf2onnx logs every PyFunc shape it cannot infer; problems are reported by us instead."""
    logger = logging.getLogger("tf2onnx")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _unsupported_nodes(model_proto) -> list[str]:
    import onnx

    bad = []
    for _, node in onnx_ops.walk_nodes(model_proto):   # Loop bodies (recurrences) included
        if node.domain == onnx_ops.DOMAIN and node.op_type in onnx_ops.CUSTOM_OPS:
            continue
        if not onnx.defs.has(node.op_type, node.domain or ""):
            bad.append(f"{node.name} ({node.domain + '.' if node.domain else ''}{node.op_type})")
    return bad


def _order_outputs(model_proto, output_names) -> None:
    """The graph's outputs in the model's order: tf2onnx lists a serving function's dict of
    outputs sorted by name, not in the order of model.outputs."""
    outputs = {output.name: output for output in model_proto.graph.output}
    if sorted(outputs) != sorted(output_names):
        return
    ordered = []
    for name in output_names:
        entry = type(outputs[name])()
        entry.CopyFrom(outputs[name])
        ordered.append(entry)
    del model_proto.graph.output[:]
    model_proto.graph.output.extend(ordered)


def _fill_output_shapes(model_proto, keras_model, output_names) -> None:
    """Give graph outputs without a recorded shape the Keras model's output shapes (by name)."""
    shapes = {name: tensor.shape for name, tensor in zip(output_names, keras_model.outputs)}
    for output in model_proto.graph.output:
        tensor_type = output.type.tensor_type
        if tensor_type.HasField("shape") or output.name not in shapes:
            continue
        for index, dim in enumerate(shapes[output.name]):
            entry = tensor_type.shape.dim.add()
            if dim is None:
                entry.dim_param = "N" if index == 0 else f"d{index}"
            else:
                entry.dim_value = int(dim)


def _fetch_names(session, output_names):
    """The session's outputs to fetch, in the model's order: by name where the graph names them
    as the export's signature does, else in the graph's order."""
    available = [output.name for output in session.get_outputs()]
    return list(output_names) if sorted(available) == sorted(output_names) else None


def _string_layers_note(model) -> str:
    """Why a model that takes strings has ops tf2onnx leaves: the layers that read text."""
    layers = string_layers(model)
    if not layers:
        return ""
    named = ", ".join(f"{path!r} ({type(layer).__name__})" for path, layer in layers[:5])
    return (f"; layer(s) {named} take the model's string input, and ONNX's standard ops cannot "
            f"standardize, split or look up text (string regex, split and lookup-table ops): "
            f"export a SavedModel instead (--format savedmodel), which serves strings, or "
            f"export the part of the model after those layers")


def export_onnx(model, path, keep_kernels: bool = False, opset: int = DEFAULT_OPSET,
                force: bool = False, check_batch: int = 8, sequence_length=None) -> ExportResult:
    """Export `model` to ONNX at `path` (see the module docstring for the two variants).

    The export is run with onnxruntime on a deterministic sample batch of `check_batch` (>= 1;
    free input dimensions at `sequence_length`, None: graphswap.swap.DEFAULT_SEQUENCE_LENGTH) and
    compared with the lowered Keras model (lowered) or the swapped Keras model (keep_kernels);
    ExportError if they disagree, and then nothing is written.
    """
    import onnx

    path = Path(path)
    check_output_path(path, force)
    if check_batch < 1:
        raise ExportError("check_batch must be at least 1: every export is verified")
    records = swapped_layers(model)
    if keep_kernels:
        if not records:
            raise ExportError(
                f"model {model.name!r} has no swapped layers: there is no kernel to keep; export "
                f"it without --keep-kernels")
        traced, records = kept_kernel_model(model)   # each record with its kept layer
        fmt = "onnx-kept-kernels"
    else:
        traced, records = lower_model(model, marked=True)
        fmt = "onnx-lowered"
    input_names, output_names = signature_names(model)
    specs = input_specs(model, input_names)
    fn = serving_function(traced, specs, output_names)
    problems: list[str] = []
    handler = _kept_node_handler(records, problems) if keep_kernels else \
        _python_op_handler(problems)
    model_proto = _convert_onnx(fn, specs, opset, handler, keep_kernels)
    if problems:
        raise ExportError(
            f"cannot export to ONNX: op(s) {', '.join(problems)} run Python code "
            f"(tf.numpy_function / tf.py_function in a layer that is not a graphswap swapped "
            f"layer), which ONNX cannot hold; replace that layer with TensorFlow ops")
    unsupported = _unsupported_nodes(model_proto)
    if unsupported:
        raise ExportError(f"cannot export to ONNX: tf2onnx left op(s) it could not convert: "
                          f"{', '.join(unsupported[:10])}{_string_layers_note(model)}")
    _order_outputs(model_proto, output_names)
    _fill_output_shapes(model_proto, model, output_names)
    custom = {onnx_ops.MATMUL_OP, onnx_ops.CONV2D_OP}
    # a recurrent layer's products sit in the body of the ONNX Loop of its recurrence
    for _, node in onnx_ops.walk_nodes(model_proto):
        match = MARKER_RE.search(node.name)
        if match is None:
            continue
        record = records[int(match.group(1))]
        product = node.op_type in custom if keep_kernels else node.op_type in (
            "MatMul", "Gemm", "Conv", "Einsum")
        if product:
            record.onnx_nodes.append(node.name)
            node.doc_string = (f"graphswap: layer {record.path}, kernel "
                               f"{record.kernel.get('spec')}")
    missing = [r.path for r in records if not r.onnx_nodes]
    if keep_kernels and missing:
        raise ExportError(f"internal error: no custom node found for swapped layer(s) "
                          f"{', '.join(missing)}")
    # exact FP8 layers: float8 QuantizeLinear / DequantizeLinear around their products
    fp8_qdq = [] if keep_kernels else add_fp8_qdq(model_proto, records)
    for record in records:
        if hasattr(record, "layer"):
            del record.layer
    doc = metadata_document(records, fmt, model.name, input_names, output_names)
    if fp8_qdq:
        doc["fp8_qdq_layers"] = fp8_qdq
    entry = model_proto.metadata_props.add()
    entry.key = METADATA_KEY
    entry.value = json.dumps(doc, sort_keys=True)

    batch = sample_inputs(model, check_batch, sequence_length=sequence_length)
    if keep_kernels:
        reference = run_model(model, batch)
        reference_name = "swapped Keras model (same kernels)"
        relative = 1e-3
    elif fp8_qdq:   # the FP8 layers compute in FP8, the others lowered
        reference = run_model(lower_model(model, keep=set(fp8_qdq))[0], batch)
        reference_name = ("Keras model with the swapped layers lowered (exact kernel), its "
                          "FP8 layers in FP8 (float8 QDQ)")
        relative = 1e-3
    else:
        reference = run_model(traced, batch)
        reference_name = "Keras model with the swapped layers lowered (exact kernel)"
        relative = 1e-4
    relative = max(relative, precision_floor(model))
    with atomic_output(path, force) as tmp:
        onnx.save(model_proto, str(tmp))
        session = onnx_ops.session(tmp)
        actual = session.run(_fetch_names(session, output_names),
                             feeds(batch, [i.name for i in session.get_inputs()]))
        difference = verify_export(reference, actual, relative, "ONNX model")
    return ExportResult(path, fmt, records, input_names, output_names, difference, reference_name)

