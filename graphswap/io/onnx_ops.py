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
:func:`session` (``graphswap.onnx_session``) checks every node's kernel, then registers the ops.

Why not ``graphswap.io.onnx``: a module of that name could be imported as ``onnx`` whenever its
directory lands on ``sys.path``, hiding the real ``onnx`` package; ``onnx_ops`` avoids the trap.
"""

from __future__ import annotations

import json
import os
import threading

import numpy as np

from graphswap.errors import GraphswapError, ModelLoadError
from graphswap.kernels import QuantScheme, open_record
from graphswap.native import conv_geometry
from graphswap.swap import legacy_scheme

DOMAIN = "ai.onnx.contrib"
MATMUL_OP = "GraphswapMatMul"
CONV2D_OP = "GraphswapConv2D"
CUSTOM_OPS = (MATMUL_OP, CONV2D_OP)

_kernels: dict[str, object] = {}
_kernels_lock = threading.Lock()


def _kernel(kernel_json: str):
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
            kernel = open_record(config, "a graphswap custom node of the ONNX model")
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


def open_kernels(path) -> list:
    """Resolve, through the trust gate, the kernel of every graphswap custom node in the ONNX
    file at `path` (so a refused kernel is one clear error before onnxruntime starts, not a
    failure inside an inference call).  Returns the kernels in node order."""
    import onnx

    try:
        model = onnx.load(os.fspath(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - onnx raises protobuf/OS errors
        raise ModelLoadError(f"cannot read the ONNX model {path}: {type(exc).__name__}: "
                             f"{exc}") from None
    found = []
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            graphs.extend(attr.g for attr in node.attribute if attr.type == attr.GRAPH)
            if node.domain != DOMAIN or node.op_type not in CUSTOM_OPS:
                continue
            kernel_attr = [a for a in node.attribute if a.name == "kernel"]
            if not kernel_attr:
                raise ModelLoadError(f"{path}: custom node {node.name!r} ({node.op_type}) has no "
                                     f"'kernel' attribute")
            found.append(_kernel(kernel_attr[0].s.decode("utf-8", "replace")))
    return found


def _add_missing_quant(path):
    """The serialized model with quant="" added to custom nodes written before the attribute
    existed (they then run their legacy scheme), or None when every node has it."""
    import onnx

    model = onnx.load(os.fspath(path), load_external_data=False)
    changed = False
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            graphs.extend(attr.g for attr in node.attribute if attr.type == attr.GRAPH)
            if node.domain == DOMAIN and node.op_type in CUSTOM_OPS and \
                    not any(a.name == "quant" for a in node.attribute):
                node.attribute.append(onnx.helper.make_attribute("quant", ""))
                changed = True
    return model.SerializeToString() if changed else None


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
    open_kernels(path)  # every kernel the file names passes the trust gate before anything runs
    options = session_options(options)
    try:
        patched = _add_missing_quant(path)
        return ort.InferenceSession(path if patched is None else patched, options,
                                    providers=list(providers))
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"onnxruntime cannot load {path}: {first}") from None
