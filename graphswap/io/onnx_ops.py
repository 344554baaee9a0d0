"""onnxruntime custom operators that run graphswap kernels, and `session(path)` to use them.

A kept-kernel ONNX file (``graphswap export --format onnx --keep-kernels``) replaces the product of
every swapped layer by a custom node in the domain ``ai.onnx.contrib``:

``GraphswapMatMul(A, B) -> Y``
    A: float32 (..., k) activations, B: float32 (k, n) weights; Y = kernel.matmul over the last axis.
    Attribute ``kernel``: JSON kernel config, as stored in the swapped layer's config
    (``{"spec": "mul8u_drum4"}``, or ``{"spec": ..., "path": ..., "sha256": ...}`` for files).
    Attribute ``quant``: JSON QuantScheme config of the layer (graphswap/kernels/scheme.py: weight
    encoding, granularity, activations "dynamic" or "static" with its ``activation_range`` - the
    static parameters, exact float64 decimal); "" for float kernels.  Files written before it
    existed run the scheme their layers had then (graphswap.swap.legacy_scheme).

``GraphswapConv2D(X, W) -> Y``
    X: float32 NHWC input, W: float32 HWIO filter, Y: NHWC output (TensorFlow's layouts, like the C
    ABI).  Attributes: ``kernel`` (JSON, as above), ``padding`` ("valid" or "same", TensorFlow's
    rules, resolved per call from the actual input size), ``stride_h``, ``stride_w``,
    ``dilation_h``, ``dilation_w``, ``groups`` (int64).

Bias, activation and everything else stay standard ONNX ops.  The custom nodes are executed by
onnxruntime-extensions' Python custom-op bridge: the operator bodies below are Python functions
(registered with ``onnxruntime_extensions.onnx_op`` when this module is imported) that call the same
``graphswap.kernels`` objects the Keras layers use, so a consumer needs graphswap (with its kernel
library, and any kernel file the spec names, at the recorded path with the recorded sha256 and
trusted: the ONNX file never adds trust), onnxruntime and onnxruntime-extensions.
:func:`session` (``graphswap.onnx_session``) reads the file once and checks it whole before
onnxruntime sees it (:func:`read_checked_model`): every node of the main graph, of every If/Loop/Scan
body at any depth and of every model-local function (called or not); every attribute a body reads
(type, UTF-8, size, JSON, the QuantScheme and whether the kernel runs it, padding, strides,
dilations, groups; no attribute passed by reference from a calling node; weights stored in the
file of the rank the body takes); every kernel through the
trust gate; no other operator in graphswap's domain.  onnxruntime then gets the checked bytes, not
the path.  The check matters twice: a refused kernel must never load, and onnxruntime-extensions'
Python bridge ends the process (SIGABRT) on any exception raised inside an operator body, so
nothing an attribute holds may be able to raise there.  (Inputs of shapes the weights do not fit
still raise there; graphswap's exports declare their input shapes, which onnxruntime checks first.)

Why not ``graphswap.io.onnx``: a module of that name could be imported as ``onnx`` whenever its
directory lands on ``sys.path``, hiding the real ``onnx`` package; ``onnx_ops`` avoids the trap.
"""

from __future__ import annotations

import json
import os
import threading

import numpy as np

from graphswap.errors import (GraphswapError, InputFileError, ModelLoadError,
                              QuantizationError)
from graphswap.input_files import load_json, read_regular
from graphswap.kernels import QuantScheme, open_record
from graphswap.native import conv_geometry
from graphswap.swap import legacy_scheme

DOMAIN = "ai.onnx.contrib"
MATMUL_OP = "GraphswapMatMul"
CONV2D_OP = "GraphswapConv2D"
CUSTOM_OPS = (MATMUL_OP, CONV2D_OP)

_kernels: dict[str, object] = {}
_kernels_lock = threading.Lock()


def _kernel(kernel_json: str, where: str = "a graphswap custom node of the ONNX model"):
    """The graphswap Kernel a node's `kernel` attribute names (resolved once per spec)."""
    with _kernels_lock:
        kernel = _kernels.get(kernel_json)
        if kernel is None:
            try:
                config = json.loads(kernel_json)
            except json.JSONDecodeError as exc:
                raise GraphswapError(
                    f"custom node attribute 'kernel' is not JSON: {kernel_json!r} ({exc})") from None
            # named by the ONNX file: it passes the trust gate, and never adds trust
            kernel = open_record(config, where)
            _kernels[kernel_json] = kernel
        return kernel


def _scheme(kernel, quant: str):
    """The QuantScheme a node's `quant` attribute names (None for float kernels)."""
    if not getattr(kernel, "quantizes", False):
        return None
    if not quant:
        return legacy_scheme(bool(kernel.signed))
    try:
        return QuantScheme.from_config(json.loads(quant))
    except json.JSONDecodeError as exc:
        raise GraphswapError(f"custom node attribute 'quant' is not JSON: {quant!r} "
                             f"({exc})") from None


def _with_scheme(method, scheme, *arrays):
    return method(*arrays) if scheme is None else method(*arrays, quant=scheme)


def run_matmul(a: np.ndarray, b: np.ndarray, kernel: str, quant: str = "") -> np.ndarray:
    """Body of GraphswapMatMul (usable without onnxruntime, e.g. for testing)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    if b.ndim != 2 or a.ndim < 1 or a.shape[-1] != b.shape[0]:
        raise GraphswapError(f"{MATMUL_OP}: cannot multiply {a.shape} by {b.shape}")
    leading = a.shape[:-1]
    arithmetic = _kernel(kernel)
    out = _with_scheme(arithmetic.matmul, _scheme(arithmetic, quant), a.reshape(-1, b.shape[0]), b)
    return np.asarray(out, dtype=np.float32).reshape(*leading, b.shape[1])


def run_conv2d(x: np.ndarray, w: np.ndarray, kernel: str, padding: str, stride_h: int,
               stride_w: int, dilation_h: int, dilation_w: int, groups: int,
               quant: str = "") -> np.ndarray:
    """Body of GraphswapConv2D (usable without onnxruntime, e.g. for testing)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    w = np.ascontiguousarray(w, dtype=np.float32)
    geometry = conv_geometry(x.shape, w.shape, (stride_h, stride_w), (dilation_h, dilation_w),
                             padding, groups)
    arithmetic = _kernel(kernel)
    return np.asarray(_with_scheme(arithmetic.conv2d, _scheme(arithmetic, quant), x, w, geometry),
                      dtype=np.float32)


_registered = False
_register_lock = threading.Lock()


def register_custom_ops() -> None:
    """Register the Python bodies of the custom nodes with onnxruntime-extensions (idempotent)."""
    global _registered
    with _register_lock:
        if _registered:
            return
        try:
            from onnxruntime_extensions import PyCustomOpDef, onnx_op
        except ImportError as exc:
            raise GraphswapError(
                f"running a kept-kernel ONNX model needs onnxruntime-extensions "
                f"(pip install onnxruntime-extensions): {exc}") from None
        f32 = PyCustomOpDef.dt_float
        i64 = PyCustomOpDef.dt_int64
        text = PyCustomOpDef.dt_string

        @onnx_op(op_type=MATMUL_OP, inputs=[f32, f32], outputs=[f32],
                 attrs={"kernel": text, "quant": text})
        def graphswap_matmul(a, b, kernel, quant=""):  # noqa: ANN001 - onnxruntime-extensions
            return run_matmul(a, b, kernel, quant)

        @onnx_op(op_type=CONV2D_OP, inputs=[f32, f32], outputs=[f32],
                 attrs={"kernel": text, "padding": text, "stride_h": i64, "stride_w": i64,
                        "dilation_h": i64, "dilation_w": i64, "groups": i64, "quant": text})
        def graphswap_conv2d(x, w, kernel, padding, stride_h, stride_w, dilation_h, dilation_w,
                             groups, quant=""):  # noqa: ANN001
            return run_conv2d(x, w, kernel, padding, stride_h, stride_w, dilation_h, dilation_w,
                              groups, quant)

        _registered = True


#: longest string attribute graphswap reads: a kernel record or a quantization config is well under
#: a kilobyte
MAX_ATTRIBUTE_BYTES = 64 * 1024
#: largest stride, dilation or group count a GraphswapConv2D node may carry
MAX_CONV_INTEGER = 2 ** 31 - 1
#: the attributes each custom node's body reads (what onnxruntime-extensions hands it), by type
STRING_ATTRIBUTES = {MATMUL_OP: ("kernel", "quant"), CONV2D_OP: ("kernel", "quant", "padding")}
INT_ATTRIBUTES = {MATMUL_OP: (),
                  CONV2D_OP: ("stride_h", "stride_w", "dilation_h", "dilation_w", "groups")}


def conv_attributes(padding, strides, dilations, groups) -> tuple[str, dict]:
    """(op type, attributes) of the GraphswapConv2D node of one convolution."""
    return CONV2D_OP, {"padding": str(padding).lower(), "stride_h": int(strides[0]),
                       "stride_w": int(strides[1]), "dilation_h": int(dilations[0]),
                       "dilation_w": int(dilations[1]), "groups": int(groups)}


_REEXPORT = "re-export the model with 'graphswap export MODEL --format onnx --keep-kernels'"


def _subgraphs(node, location: str):
    """(location, graph) of every graph a node holds in its attributes (If/Loop/Scan bodies)."""
    for attr in node.attribute:
        graphs = [attr.g] if attr.HasField("g") else []
        graphs.extend(attr.graphs)
        for i, graph in enumerate(graphs):
            where = f"{location} > node {node.name!r} ({node.op_type}) attribute {attr.name!r}"
            yield (where if len(graphs) == 1 else f"{where}[{i}]"), graph


def walk_nodes(model, constants: bool = False):
    """(location, node) of every node of `model`: the main graph, every subgraph at any depth,
    every model-local function (called or not) and the subgraphs inside them.  With `constants`,
    (location, node, {name: initializer} visible to the node) (a subgraph sees its own and the
    enclosing graphs'; a function's nodes see none)."""
    def named(graph, outer):
        return {**outer, **{tensor.name: tensor for tensor in graph.initializer}}

    pending = [("the main graph", model.graph.node, named(model.graph, {}))]
    pending.extend((f"model-local function {function.domain}:{function.name}", function.node, {})
                   for function in model.functions)
    while pending:
        location, nodes, visible = pending.pop(0)
        for node in nodes:
            yield (location, node, visible) if constants else (location, node)
            pending.extend((where, graph.node, named(graph, visible))
                           for where, graph in _subgraphs(node, location))


class _NodeCheck:
    """The checks of one custom node's attributes, each failure one ModelLoadError naming the
    file, the node, where it sits and the attribute."""

    def __init__(self, path, location, node, constants=None):
        self.node = node
        self.constants = constants or {}
        name = repr(node.name) if node.name else "(unnamed)"
        self.where = (f"custom node {name} ({node.op_type}) in {location} of the ONNX "
                      f"model {path}")

    def fail(self, attribute, problem, allowed):
        name = f"attribute {attribute!r}" if attribute else "the node"
        return ModelLoadError(f"{self.where}: {name} {problem}; {allowed}; {_REEXPORT}")

    def attributes(self) -> dict:
        op = self.node.op_type
        wanted = {**{name: "STRING" for name in STRING_ATTRIBUTES[op]},
                  **{name: "INT" for name in INT_ATTRIBUTES[op]}}
        found = {}
        for attr in self.node.attribute:
            if attr.name not in wanted:
                continue  # not read by the operator body
            if attr.ref_attr_name:
                raise self.fail(attr.name, f"refers to the calling node's attribute "
                                f"{attr.ref_attr_name!r}", "graphswap writes every attribute "
                                "as a value, so that it can be checked before anything runs")
            if attr.name in found:
                raise self.fail(attr.name, "is given twice", "each attribute appears once")
            kind = attr.AttributeType.Name(attr.type)
            if kind != wanted[attr.name]:
                raise self.fail(attr.name, f"has type {kind}",
                                f"it is a{'n' if wanted[attr.name] == 'INT' else ''} "
                                f"{wanted[attr.name]}")
            found[attr.name] = self.string(attr) if kind == "STRING" else int(attr.i)
        missing = [name for name in wanted if name not in found and name != "quant"]
        if missing:
            raise self.fail(missing[0], "is missing", f"a {op} node has the attributes "
                            f"{', '.join(wanted)}")
        found.setdefault("quant", "")  # written before the attribute existed: legacy scheme
        return found

    def string(self, attr) -> str:
        if len(attr.s) > MAX_ATTRIBUTE_BYTES:
            raise self.fail(attr.name, f"is {len(attr.s):,} bytes long",
                            f"graphswap reads at most {MAX_ATTRIBUTE_BYTES:,} bytes")
        try:
            text = attr.s.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(attr.name, f"is not UTF-8 text ({exc.reason} at byte {exc.start})",
                            "it is JSON or a word, in UTF-8") from None
        if "\x00" in text:
            raise self.fail(attr.name, "holds a NUL character", "it is JSON or a word")
        return text

    def json(self, attribute, text):
        try:
            return load_json(text, "it")
        except (json.JSONDecodeError, RecursionError, InputFileError) as exc:
            raise self.fail(attribute, f"is not valid JSON ({exc}): {text[:80]!r}",
                            "it is the JSON graphswap wrote") from None

    def check(self):
        """The kernel (through the trust gate) and scheme the node runs, as its body will."""
        node = self.node
        if len(node.input) != 2 or len(node.output) != 1 or not all(node.input):
            raise self.fail(None, f"has {len(node.input)} input(s) and {len(node.output)} "
                            f"output(s)", f"a {node.op_type} node takes 2 inputs and gives 1 "
                            f"output")
        values = self.attributes()
        weights = self.constants.get(node.input[1])
        rank = 2 if node.op_type == MATMUL_OP else 4
        if weights is not None and len(weights.dims) != rank:
            raise self.fail(None, f"has weights {node.input[1]!r} of shape {tuple(weights.dims)}",
                            f"a {node.op_type} node's weights have {rank} dimensions")
        self.json("kernel", values["kernel"])  # a clear error before the gate's
        kernel = _kernel(values["kernel"], self.where)
        quant = values["quant"]
        if quant:
            config = self.json("quant", quant)
            try:
                scheme = QuantScheme.from_config(config)
            except (QuantizationError, TypeError, ValueError) as exc:
                raise self.fail("quant", f"is not a quantization config ({exc})",
                                "it is the JSON of a QuantScheme (weights, granularity, "
                                "activations, activation_range, observer, momentum)") from None
        else:
            scheme = None
        if getattr(kernel, "quantizes", False):
            scheme = _scheme(kernel, quant)
            try:
                kernel.resolve_scheme(scheme)
            except QuantizationError as exc:
                raise self.fail("quant", f"cannot run on {kernel.spec} ({exc})",
                                "a scheme the kernel runs") from None
        if node.op_type == CONV2D_OP:
            if str(values["padding"]).lower() not in ("valid", "same"):
                raise self.fail("padding", f"is {values['padding'][:40]!r}",
                                "allowed: 'valid' or 'same'")
            for name in INT_ATTRIBUTES[CONV2D_OP]:
                if not 1 <= values[name] <= MAX_CONV_INTEGER:
                    raise self.fail(name, f"is {values[name]}",
                                    f"allowed: 1..{MAX_CONV_INTEGER}")
        return kernel


def read_checked_model(path):
    """The ONNX model at `path`, read once and checked before anything runs it: every node of the
    main graph, of every subgraph and of every model-local function.  Every graphswap custom node's
    attributes are well-formed and its kernel passes the trust gate; no other node uses graphswap's
    domain; no model-local function is defined in it.  Custom nodes written before the `quant`
    attribute existed get quant="" (their legacy scheme).  Returns (model, kernels in node order);
    raises ModelLoadError (KernelTrustError for a refused kernel) naming the node."""
    import onnx

    path = os.fspath(path)
    data = read_regular(path, "ONNX model", error=ModelLoadError)  # a FIFO: refused, not waited on
    try:
        model = onnx.load_model_from_string(data)
    except Exception as exc:  # noqa: BLE001 - onnx raises protobuf/OS errors
        raise ModelLoadError(f"cannot read the ONNX model {path}: {type(exc).__name__}: "
                             f"{exc}") from None
    for function in model.functions:
        if function.domain == DOMAIN:
            raise ModelLoadError(
                f"the ONNX model {path} defines the function {function.name!r} in graphswap's "
                f"domain {DOMAIN}, which holds only {', '.join(CUSTOM_OPS)}; {_REEXPORT}")
    found = []
    for location, node, constants in walk_nodes(model, constants=True):
        if node.domain != DOMAIN:
            continue
        if node.op_type not in CUSTOM_OPS:
            raise ModelLoadError(
                f"node {node.name!r} in {location} of the ONNX model {path} uses the operator "
                f"{DOMAIN}.{node.op_type}; graphswap runs only {', '.join(CUSTOM_OPS)} in that "
                f"domain; {_REEXPORT}")
        found.append(_NodeCheck(path, location, node, constants).check())
        if not any(a.name == "quant" for a in node.attribute):
            node.attribute.append(onnx.helper.make_attribute("quant", ""))
    return model, found


def open_kernels(path) -> list:
    """Resolve, through the trust gate, the kernel of every graphswap custom node in the ONNX
    file at `path`, after checking every node (read_checked_model).  Returns the kernels in node
    order."""
    return read_checked_model(path)[1]


def _uses_external_data(model) -> bool:
    """Whether some initializer of `model` (at any depth) is stored in a file of its own."""
    from onnx.external_data_helper import uses_external_data

    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        if any(uses_external_data(t) for t in graph.initializer):
            return True
        for node in graph.node:
            graphs.extend(g for _, g in _subgraphs(node, ""))
    return False


def session_options(options=None):
    """onnxruntime SessionOptions able to run graphswap's custom nodes (and any standard model)."""
    import onnxruntime as ort
    from onnxruntime_extensions import get_library_path

    register_custom_ops()
    options = options if options is not None else ort.SessionOptions()
    options.register_custom_ops_library(get_library_path())
    return options


def session(path, providers=("CPUExecutionProvider",), options=None):
    """An onnxruntime InferenceSession for a graphswap ONNX export (kept-kernel or lowered).

    Registers the custom operators first, so kept-kernel models run their C kernels; lowered models
    work the same way.  Raises ModelLoadError (a GraphswapError) with onnxruntime's message when the
    file cannot be opened.
    """
    import onnxruntime as ort

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ModelLoadError(f"ONNX model not found: {path}")
    # every node and attribute checked, every kernel through the trust gate, before anything runs;
    # onnxruntime gets the bytes that were checked, never the path again
    model, _ = read_checked_model(path)
    options = session_options(options)
    if _uses_external_data(model):
        options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                         os.path.dirname(os.path.abspath(path)))
    try:
        return ort.InferenceSession(model.SerializeToString(), options,
                                    providers=list(providers))
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"onnxruntime cannot load {path}: {first}") from None
