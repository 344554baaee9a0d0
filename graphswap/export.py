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
  onnxruntime-extensions; open it with `graphswap.onnx_ops.session(path)`.  Checked against the
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

import contextlib
import dataclasses
import json
import logging
import re
import tempfile
import warnings
from pathlib import Path

import numpy as np

from graphswap._version import __version__
from graphswap.errors import ExportError, GraphswapError, ModelLoadError

FORMATS = ("onnx", "savedmodel")
METADATA_KEY = "graphswap"
ASSET_NAME = "graphswap_kernels.json"
METADATA_SCHEMA = 1
DEFAULT_OPSET = 17
_MARKER = "graphswap_export_{index}"
_MARKER_RE = re.compile(r"graphswap_export_(\d+)(?![0-9])")
_PYTHON_OPS = ("PyFunc", "PyFuncStateless", "EagerPyFunc")


@dataclasses.dataclass
class SwappedLayer:
    """One swapped layer of an exported model, as recorded in the export's metadata."""

    index: int
    path: str             # nested path, "outer/inner/fc1"
    name: str
    layer_type: str       # "Dense" or "Conv2D" (the layer it stands for)
    kernel: dict          # the kernel config stored in the layer ({"spec": ...}, + path/sha256)
    description: str
    backward: str
    onnx_nodes: list = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict:
        record = {"layer": self.path, "name": self.name, "type": self.layer_type,
                  "kernel": self.kernel, "kernel_spec": self.kernel.get("spec"),
                  "description": self.description, "backward": self.backward}
        if self.onnx_nodes:
            record["onnx_nodes"] = list(self.onnx_nodes)
        return record


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


# --------------------------------------------------------------------------------------------
# lowering
# --------------------------------------------------------------------------------------------

def _plain_config(layer) -> dict:
    config = layer.get_config()
    config.pop("arithmetic", None)
    config.pop("swap_kernel", None)
    config.pop("backward", None)
    return config


def _lowered_classes():
    """Dense/Conv2D subclasses whose ops sit in a name scope that marks the swapped layer."""
    import keras
    import tensorflow as tf

    class MarkedDense(keras.layers.Dense):
        graphswap_marker = ""

        def call(self, inputs, training=None):
            with tf.name_scope(self.graphswap_marker):
                return super().call(inputs, training=training)

    class MarkedConv2D(keras.layers.Conv2D):
        graphswap_marker = ""

        def call(self, inputs):
            with tf.name_scope(self.graphswap_marker):
                return super().call(inputs)

        def convolution_op(self, inputs, kernel):
            # Keras runs grouped convolutions inside a jit_compile tf.function, which tf2onnx
            # cannot convert (a StatefulPartitionedCall is left), and NCHW Conv2D does not run on
            # CPU: compute those in NHWC, one plain Conv2D per group (what the kernels compute).
            if self.groups == 1 and self.data_format != "channels_first":
                return super().convolution_op(inputs, kernel)
            channels_first = self.data_format == "channels_first"
            x = tf.transpose(inputs, [0, 2, 3, 1]) if channels_first else inputs
            parts = [tf.nn.convolution(x_group, w_group, strides=list(self.strides),
                                       padding=str(self.padding).upper(),
                                       dilations=list(self.dilation_rate))
                     for x_group, w_group in zip(tf.split(x, self.groups, axis=3),
                                                 tf.split(kernel, self.groups, axis=3))]
            y = parts[0] if len(parts) == 1 else tf.concat(parts, axis=3)
            return tf.transpose(y, [0, 3, 1, 2]) if channels_first else y

    return MarkedDense, MarkedConv2D


def _kept_classes():
    """Swapped-layer subclasses whose kernel call is one numpy_function named by a marker.

    Only ever traced (never run for training, never saved): tf2onnx turns each marked PyFunc into a
    custom ONNX node, identified by the marker in its name.
    """
    import tensorflow as tf

    from graphswap.layers import SwappedConv2D, SwappedDense

    class KeptDense(SwappedDense):
        graphswap_marker = ""

        def call(self, inputs, training=None):
            dtype = inputs.dtype
            x = tf.cast(inputs, tf.float32)
            w = tf.cast(self.kernel, tf.float32)
            k, n = int(w.shape[0]), int(w.shape[1])
            x2d = tf.reshape(x, [-1, k]) if x.shape.rank != 2 else x
            kernel = self.arithmetic
            y = tf.numpy_function(lambda a, b: kernel.matmul(a, b), [x2d, w], tf.float32,
                                  stateful=False, name=self.graphswap_marker)
            # ensure_shape, not set_shape: tf2onnx re-infers shapes from the GraphDef, where a
            # PyFunc's output shape is unknown; ops needing it downstream (a Concat with axis -1)
            # would be left half-converted.  EnsureShape carries it and becomes an Identity.
            y = tf.ensure_shape(y, [x2d.shape[0], n])
            if x.shape.rank != 2:
                y = tf.reshape(y, tf.concat([tf.shape(x)[:-1], [n]], axis=0))
                y.set_shape(x.shape[:-1].concatenate([n]))
            if self.bias is not None:
                y = tf.add(y, tf.cast(self.bias, tf.float32))
            if self.activation is not None:
                y = self.activation(y)
            return tf.cast(y, dtype) if dtype != tf.float32 else y

    class KeptConv2D(SwappedConv2D):
        graphswap_marker = ""

        def convolution_op(self, inputs, kernel):
            from graphswap.geometry import conv_geometry

            channels_first = self.data_format == "channels_first"
            x = tf.cast(inputs, tf.float32)
            if channels_first:
                x = tf.transpose(x, [0, 2, 3, 1])
            w = tf.cast(kernel, tf.float32)
            filter_shape = tuple(int(d) for d in w.shape)
            strides, dilations = tuple(self.strides), tuple(self.dilation_rate)
            padding, groups, arithmetic = self.padding, self.groups, self.arithmetic

            def forward(x_array, w_array):
                geometry = conv_geometry(x_array.shape, filter_shape, strides, dilations, padding,
                                         groups)
                return arithmetic.conv2d(x_array, w_array, geometry)

            y = tf.numpy_function(forward, [x, w], tf.float32, stateful=False,
                                  name=self.graphswap_marker)
            static = x.shape
            if None not in static[1:]:
                g = conv_geometry((1, *static[1:]), filter_shape, strides, dilations, padding,
                                  groups)
                y = tf.ensure_shape(y, [static[0], g.out_height, g.out_width, filter_shape[3]])
            if channels_first:
                y = tf.transpose(y, [0, 3, 1, 2])
            return tf.cast(y, inputs.dtype) if inputs.dtype != tf.float32 else y

    return KeptDense, KeptConv2D


def swapped_layers(model) -> list[SwappedLayer]:
    """The swapped layers of `model` (nested models included), in traversal order."""
    from graphswap.layers import SwappedConv2D, SwappedDense
    from graphswap.rewrite import iter_layers

    records = []
    for path, layer in iter_layers(model):
        if isinstance(layer, (SwappedDense, SwappedConv2D)):
            records.append(_record(len(records), path, layer))
    return records


def _record(index, path, layer) -> SwappedLayer:
    from graphswap.layers import SwappedDense

    return SwappedLayer(index=index, path=path, name=layer.name,
                        layer_type="Dense" if isinstance(layer, SwappedDense) else "Conv2D",
                        kernel=dict(layer.swap_kernel),
                        description=getattr(layer.arithmetic, "description", ""),
                        backward=layer.backward)


def lower_model(model, marked: bool = False):
    """A copy of `model` with every swapped layer replaced by a plain Dense/Conv2D (same weights).

    Returns (lowered_model, [SwappedLayer, ...]).  The lowered model computes what `model` computes
    with the exact kernel.  With `marked=True` the replacements put their ops in a name scope
    "graphswap_export_<index>" (used to find them in the ONNX graph).
    """
    import keras

    dense_cls, conv_cls = _lowered_classes() if marked else (keras.layers.Dense,
                                                             keras.layers.Conv2D)
    return _replace_swapped(model, dense_cls, conv_cls, _plain_config)


def kept_kernel_model(model):
    """A copy of `model` whose swapped layers call their kernel through one marked PyFunc each."""
    dense_cls, conv_cls = _kept_classes()
    return _replace_swapped(model, dense_cls, conv_cls, lambda layer: layer.get_config())


def _replace_swapped(model, dense_cls, conv_cls, config_of):
    from graphswap.layers import SwappedConv2D, SwappedDense
    from graphswap.rewrite import transform_model

    records: list[SwappedLayer] = []

    def replace(path, layer):
        if not isinstance(layer, (SwappedDense, SwappedConv2D)):
            return None
        record = _record(len(records), path, layer)
        records.append(record)
        cls = dense_cls if isinstance(layer, SwappedDense) else conv_cls
        new_layer = cls.from_config(config_of(layer))
        if hasattr(cls, "graphswap_marker"):
            new_layer.graphswap_marker = _MARKER.format(index=record.index)
        return new_layer

    new_model, _ = transform_model(model, replace)
    return new_model, records


# --------------------------------------------------------------------------------------------
# signatures
# --------------------------------------------------------------------------------------------

def _sanitize(name: str, fallback: str) -> str:
    clean = re.sub(r"[^A-Za-z0-9_]", "_", str(name or ""))
    if not clean or not clean[0].isalpha():
        clean = f"{fallback}_{clean}".rstrip("_")
    return clean


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for name in names:
        if name in seen:
            seen[name] += 1
            name = f"{name}_{seen[name]}"
        seen.setdefault(name, 0)
        out.append(name)
    return out


def signature_names(model) -> tuple[list[str], list[str]]:
    """(input names, output names) used by the exports: the model's input names and the names of
    the layers producing its outputs, made valid identifiers."""
    inputs = _unique([_sanitize(t.name, "input") for t in model.inputs])
    outputs = []
    for tensor in model.outputs:
        history = getattr(tensor, "_keras_history", None)
        name = history.operation.name if history is not None else tensor.name
        outputs.append(_sanitize(name, "output"))
    return inputs, _unique(outputs)


def _input_specs(model, names):
    import tensorflow as tf

    specs = []
    for tensor, name in zip(model.inputs, names):
        dtype = tf.as_dtype(tensor.dtype or "float32")
        shape = [None if d is None else int(d) for d in tensor.shape]
        specs.append(tf.TensorSpec(shape, dtype, name=name))
    return specs


def _serving_function(model, specs, output_names):
    import keras
    import tensorflow as tf

    single = len(specs) == 1

    def serve(*args):
        outputs = keras.tree.flatten(model(args[0] if single else list(args), training=False))
        return {name: output for name, output in zip(output_names, outputs)}

    return tf.function(serve, input_signature=specs, autograph=False)


def _feeds(batch, names) -> dict:
    batches = batch if isinstance(batch, list) else [batch]
    return {name: np.asarray(b) for name, b in zip(names, batches)}


def _run_keras(model, batch) -> list:
    """Outputs of a Keras model on `batch`, flattened, as numpy arrays."""
    import keras

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Keras' input-structure notice for array/list inputs
        outputs = model(batch, training=False)
    return [np.asarray(o) for o in keras.tree.flatten(outputs)]


def _max_difference(reference: list, actual: list) -> float:
    if len(reference) != len(actual):
        raise ExportError(f"the export has {len(actual)} outputs, the model {len(reference)}")
    worst = 0.0
    for ref, got in zip(reference, actual):
        if ref.shape != got.shape:
            raise ExportError(f"export output shape {got.shape} != model output shape {ref.shape}")
        if ref.size:
            worst = max(worst, float(np.max(np.abs(ref.astype(np.float64) - got.astype(np.float64)))))
    return worst


def _precision_floor(model) -> float:
    """Smallest sensible relative tolerance for the model's compute dtype: a float16/bfloat16
    (mixed-precision) model's outputs carry ~1e-3..1e-2 relative rounding, which onnxruntime and
    TensorFlow accumulate differently; a float32 model needs no floor."""
    dtypes = {str(getattr(layer, "compute_dtype", "float32")) for layer in model.layers}
    if "bfloat16" in dtypes:
        return 3e-2
    if "float16" in dtypes:
        return 2e-2
    return 0.0


def _tolerance(reference: list, relative: float) -> float:
    scale = max([1.0] + [float(np.max(np.abs(r))) for r in reference if r.size])
    return relative * scale


def _check(reference, actual, relative, what) -> float:
    difference = _max_difference(reference, actual)
    if not np.isfinite(difference) or difference > _tolerance(reference, relative):
        raise ExportError(
            f"verification failed: the exported {what} differs from the Keras model by "
            f"{difference:.3g} on a sample batch (allowed {_tolerance(reference, relative):.3g}); "
            f"nothing was written")
    return difference


def metadata_document(records, fmt: str, model_name: str, inputs, outputs) -> dict:
    """The JSON document stored with every export (ONNX metadata_props / SavedModel asset)."""
    doc = {"schema": METADATA_SCHEMA, "producer": "graphswap", "graphswap_version": __version__,
           "format": fmt, "model": model_name, "inputs": list(inputs), "outputs": list(outputs),
           "swapped_layers": [r.to_dict() for r in records]}
    if fmt == "onnx-kept-kernels":
        from graphswap import onnx_ops

        doc["custom_domain"] = onnx_ops.DOMAIN
        doc["custom_ops"] = list(onnx_ops.CUSTOM_OPS)
        doc["note"] = ("custom nodes run graphswap kernels; open with "
                       "graphswap.onnx_ops.session(path)")
    elif records:
        doc["note"] = ("swapped layers are lowered to standard float32 ops: this graph computes the "
                       "exact-kernel model; 'kernel' names the arithmetic each layer was trained "
                       "for")
    return doc


# --------------------------------------------------------------------------------------------
# ONNX
# --------------------------------------------------------------------------------------------

def _kept_node_handler(records, problems):
    from graphswap import onnx_ops

    def handler(ctx, node, name, args):  # noqa: ARG001 - tf2onnx's handler signature
        match = _MARKER_RE.search(node.name)
        if match is None or int(match.group(1)) >= len(records):
            problems.append(f"{node.name} ({node.type})")
            return node
        record = records[int(match.group(1))]
        for attribute in list(node.attr):
            del node.attr[attribute]
        node.domain = onnx_ops.DOMAIN
        node.set_attr("kernel", json.dumps(record.kernel, sort_keys=True))
        if record.layer_type == "Dense":
            node.type = onnx_ops.MATMUL_OP
        else:
            layer = record.layer
            node.type = onnx_ops.CONV2D_OP
            node.set_attr("padding", str(layer.padding).lower())
            node.set_attr("stride_h", int(layer.strides[0]))
            node.set_attr("stride_w", int(layer.strides[1]))
            node.set_attr("dilation_h", int(layer.dilation_rate[0]))
            node.set_attr("dilation_w", int(layer.dilation_rate[1]))
            node.set_attr("groups", int(layer.groups))
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

    from graphswap import onnx_ops

    extra = [onnx.helper.make_opsetid(onnx_ops.DOMAIN, 1)] if keep_kernels else None
    try:
        with _quiet_tf2onnx():
            model_proto, _ = tf2onnx.convert.from_function(
                fn, input_signature=specs, opset=opset,
                custom_op_handlers={op: (handler, []) for op in _PYTHON_OPS}, extra_opset=extra)
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

    from graphswap import onnx_ops

    bad = []
    for node in model_proto.graph.node:
        if node.domain == onnx_ops.DOMAIN and node.op_type in onnx_ops.CUSTOM_OPS:
            continue
        if not onnx.defs.has(node.op_type, node.domain or ""):
            bad.append(f"{node.name} ({node.domain + '.' if node.domain else ''}{node.op_type})")
    return bad


def _fill_output_shapes(model_proto, keras_model) -> None:
    """Give graph outputs without a recorded shape the Keras model's output shapes."""
    for output, tensor in zip(model_proto.graph.output, keras_model.outputs):
        tensor_type = output.type.tensor_type
        if tensor_type.HasField("shape"):
            continue
        for index, dim in enumerate(tensor.shape):
            entry = tensor_type.shape.dim.add()
            if dim is None:
                entry.dim_param = "N" if index == 0 else f"d{index}"
            else:
                entry.dim_value = int(dim)


def export_onnx(model, path, keep_kernels: bool = False, opset: int = DEFAULT_OPSET,
                force: bool = False, check_batch: int = 8) -> ExportResult:
    """Export `model` to ONNX at `path` (see the module docstring for the two variants).

    The export is run with onnxruntime on a deterministic sample batch of `check_batch` (>= 1) and
    compared with the lowered Keras model (lowered) or the swapped Keras model (keep_kernels);
    ExportError if they disagree, and then nothing is written.
    """
    import onnx

    from graphswap import checks, modelio, onnx_ops

    path = Path(path)
    modelio.check_output_path(path, force)
    if check_batch < 1:
        raise ExportError("check_batch must be at least 1: every export is verified")
    records = swapped_layers(model)
    if keep_kernels:
        if not records:
            raise ExportError(
                f"model {model.name!r} has no swapped layers: there is no kernel to keep; export "
                f"it without --keep-kernels")
        traced, records = kept_kernel_model(model)
        layers = _layers_by_index(traced)
        for record in records:
            record.layer = layers[record.index]
        fmt = "onnx-kept-kernels"
    else:
        traced, records = lower_model(model, marked=True)
        fmt = "onnx-lowered"
    input_names, output_names = signature_names(model)
    specs = _input_specs(model, input_names)
    fn = _serving_function(traced, specs, output_names)
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
                          f"{', '.join(unsupported[:10])}")
    _fill_output_shapes(model_proto, model)
    custom = {onnx_ops.MATMUL_OP, onnx_ops.CONV2D_OP}
    for node in model_proto.graph.node:
        match = _MARKER_RE.search(node.name)
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
    for record in records:
        if hasattr(record, "layer"):
            del record.layer
    doc = metadata_document(records, fmt, model.name, input_names, output_names)
    entry = model_proto.metadata_props.add()
    entry.key = METADATA_KEY
    entry.value = json.dumps(doc, sort_keys=True)

    batch = checks.sample_inputs(model, check_batch)
    if keep_kernels:
        reference = _run_keras(model, batch)
        reference_name = "swapped Keras model (same kernels)"
        relative = 1e-3
    else:
        reference = _run_keras(traced, batch)
        reference_name = "Keras model with the swapped layers lowered (exact kernel)"
        relative = 1e-4
    relative = max(relative, _precision_floor(model))
    with modelio.atomic_output(path, force) as tmp:
        onnx.save(model_proto, str(tmp))
        session = onnx_ops.session(tmp)
        actual = session.run(None, _feeds(batch, [i.name for i in session.get_inputs()]))
        difference = _check(reference, [np.asarray(a) for a in actual], relative, "ONNX model")
    return ExportResult(path, fmt, records, input_names, output_names, difference, reference_name)


def _layers_by_index(traced) -> dict:
    from graphswap.rewrite import iter_layers

    layers = {}
    for _, layer in iter_layers(traced):
        marker = getattr(layer, "graphswap_marker", "")
        match = _MARKER_RE.fullmatch(marker) if marker else None
        if match:
            layers[int(match.group(1))] = layer
    return layers


# --------------------------------------------------------------------------------------------
# SavedModel
# --------------------------------------------------------------------------------------------

def _python_ops_in(concrete) -> list[str]:
    found = []
    graph_def = concrete.graph.as_graph_def()
    for node in graph_def.node:
        if node.op in _PYTHON_OPS:
            found.append(node.name)
    for function in graph_def.library.function:
        for node in function.node_def:
            if node.op in _PYTHON_OPS:
                found.append(f"{function.signature.name}/{node.name}")
    return found


def export_saved_model(model, path, force: bool = False, check_batch: int = 8) -> ExportResult:
    """Export the lowered `model` as an inference SavedModel directory at `path`.

    Signature `serving_default`: named inputs (the model's input names) -> dict of named outputs.
    The swapped layers run as standard float32 MatMul/Conv2D (exact arithmetic), so the SavedModel
    needs only TensorFlow.  Refuses (ExportError, nothing written) a model that would still contain
    Python ops.  Verified by loading the written SavedModel and comparing with the lowered Keras
    model on a sample batch.
    """
    import tensorflow as tf

    from graphswap import checks, modelio

    path = Path(path)
    modelio.check_output_path(path, force)
    if check_batch < 1:
        raise ExportError("check_batch must be at least 1: every export is verified")
    # marked: grouped / channels_first convolutions as plain NHWC Conv2D ops (no XLA function,
    # runs on CPU); the name scopes are harmless here
    lowered, records = lower_model(model, marked=True)
    input_names, output_names = signature_names(model)
    specs = _input_specs(model, input_names)
    fn = _serving_function(lowered, specs, output_names)
    concrete = fn.get_concrete_function()
    python_ops = _python_ops_in(concrete)
    if python_ops:
        raise ExportError(
            f"cannot export a SavedModel that serves: op(s) {', '.join(python_ops[:5])} run Python "
            f"code (tf.numpy_function / tf.py_function), whose body is not serialized into a "
            f"SavedModel, so it would fail when served. Replace that layer with TensorFlow ops, or "
            f"export ONNX instead")
    module = tf.Module()
    module.model = lowered
    module.serve = fn
    doc = metadata_document(records, "savedmodel", model.name, input_names, output_names)
    batch = checks.sample_inputs(model, check_batch)
    reference = _run_keras(lowered, batch)
    with tempfile.TemporaryDirectory(prefix="graphswap-export-") as scratch:
        asset_file = Path(scratch) / ASSET_NAME
        asset_file.write_text(json.dumps(doc, indent=2, sort_keys=True), encoding="utf-8")
        module.graphswap_metadata = tf.saved_model.Asset(str(asset_file))
        with modelio.atomic_output(path, force, suffix="") as tmp:
            try:
                tf.saved_model.save(module, str(tmp), signatures={"serving_default": concrete})
            except Exception as exc:  # noqa: BLE001 - one clear line
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                raise ExportError(f"writing the SavedModel failed: {type(exc).__name__}: "
                                  f"{first}") from None
            loaded = tf.saved_model.load(str(tmp))
            serving = loaded.signatures["serving_default"]
            feeds = {name: tf.constant(value, dtype=spec.dtype)
                     for (name, value), spec in zip(_feeds(batch, input_names).items(), specs)}
            result = serving(**feeds)
            actual = [np.asarray(result[name]) for name in output_names]
            difference = _check(reference, actual, 1e-4, "SavedModel")
    return ExportResult(path, "savedmodel", records, input_names, output_names, difference,
                        "Keras model with the swapped layers lowered (exact kernel)")


# --------------------------------------------------------------------------------------------
# dispatch and reading back
# --------------------------------------------------------------------------------------------

def export_model(model, path, format: str = "onnx", keep_kernels: bool = False,  # noqa: A002
                 opset: int = DEFAULT_OPSET, force: bool = False,
                 check_batch: int = 8) -> ExportResult:
    """Export `model` as `format` ("onnx" or "savedmodel"); see export_onnx / export_saved_model."""
    if format not in FORMATS:
        raise ExportError(f"unknown export format {format!r}; allowed: {', '.join(FORMATS)}")
    if format == "savedmodel":
        if keep_kernels:
            raise ExportError(
                "a SavedModel cannot keep the C kernels: they run inside tf.numpy_function, whose "
                "Python body is not serialized into a SavedModel, so it could not serve. Export "
                "the SavedModel lowered (without --keep-kernels: exact float32 arithmetic), or use "
                "--format onnx --keep-kernels to run the kernels in onnxruntime")
        return export_saved_model(model, path, force=force, check_batch=check_batch)
    return export_onnx(model, path, keep_kernels=keep_kernels, opset=opset, force=force,
                       check_batch=check_batch)


def read_metadata(path) -> dict:
    """The graphswap metadata document of an exported ONNX file or SavedModel directory."""
    path = Path(path)
    if path.is_dir():
        asset = path / "assets" / ASSET_NAME
        if not asset.is_file():
            raise ModelLoadError(f"{path} has no graphswap metadata ({asset} is missing)")
        return json.loads(asset.read_text(encoding="utf-8"))
    if not path.is_file():
        raise ModelLoadError(f"exported model not found: {path}")
    import onnx

    model_proto = onnx.load(str(path), load_external_data=False)
    for entry in model_proto.metadata_props:
        if entry.key == METADATA_KEY:
            return json.loads(entry.value)
    raise ModelLoadError(f"{path} has no graphswap metadata (metadata_props key "
                         f"{METADATA_KEY!r} is missing)")
