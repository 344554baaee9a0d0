"""The lowered ONNX export of FP8 layers: QuantizeLinear / DequantizeLinear with ONNX's float8
types (opset 19), so onnxruntime computes what the exact FP8 built-ins compute.

tf2onnx writes a lowered Dense / Conv2D as MatMul / Conv on float32 (graphswap/io/lowering.py);
for a layer whose kernel is `fp8_e4m3` / `fp8_e5m2` (graphswap/kernels/fp8.py) this module puts

    x -> QuantizeLinear(s_a, float8 zero, saturate=1) -> DequantizeLinear(s_a) -> MatMul / Conv
    w (float8 initializer, the FP8 codes)  -> DequantizeLinear(s_w, axis = output channel) ->

around the product.  The weight codes are graphswap's own (`kernels.fp8.quantize_weights`, the
C path's codes bit for bit); the activation scale is the calibrated range's (a constant) or, for
dynamic activations, max|finite x| / max finite computed in the graph (1 when 0).  The products
of dequantized operands are the FP8 products times the scales, rounded once in float32, so the
output equals the Keras model's within float32 summation round-off; onnxruntime divides x by a
float32 scale where graphswap divides in float64, which can move a value lying within a float32
ulp of a rounding boundary to the neighbouring code.  What stays exact float32 (documented in
docs/FP8.md): users' FP8 tables (no ONNX op multiplies through a table; the kept-kernel export
keeps them), FP8 layers other than Dense / Conv2D, layers with an output correction (the lowered
model leaves corrections out), and a weight the converter did not leave as one initializer.
"""

from __future__ import annotations

import numpy as np

from graphswap.kernels import QuantScheme
from graphswap.kernels.fp8 import parse_fp8_spec, quantize_weights

#: the first opset with float8 QuantizeLinear / DequantizeLinear; the IR version of float8 types
FP8_OPSET = 19
FP8_IR_VERSION = 9
PRODUCTS = {"Dense": ("MatMul", "Gemm"), "Conv2D": ("Conv",)}


def qdq_format(record):
    """The Fp8Format a lowered layer's record asks for (an exact FP8 built-in on a Dense /
    Conv2D layer without an output correction), else None."""
    parsed = parse_fp8_spec(record.kernel.get("spec"))
    if parsed is None or parsed.kind is not None or record.layer_type not in PRODUCTS \
            or record.corrected:
        return None
    return parsed.format


def _float8_type(fmt):
    from onnx import TensorProto
    return TensorProto.FLOAT8E4M3FN if fmt.name == "e4m3" else TensorProto.FLOAT8E5M2


def _weight_qdq(graph, node, fmt, scheme, prefix):
    """Replace the product's weight initializer by float8 codes and a DequantizeLinear; False
    when the weight is not one initializer of the expected layout."""
    from onnx import helper, numpy_helper
    initializers = {t.name: t for t in graph.initializer}
    if len(node.input) < 2 or node.input[1] not in initializers:
        return False
    tensor = initializers[node.input[1]]
    w = numpy_helper.to_array(tensor).astype(np.float32)
    transposed = node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute)
    if node.op_type in ("MatMul", "Gemm") and w.ndim == 2 and not transposed:
        axis, channels_last = 1, w                        # (K, N)
    elif node.op_type == "Gemm" and w.ndim == 2:
        axis, channels_last = 0, w.T                      # (N, K)
    elif node.op_type == "Conv" and w.ndim == 4:
        axis, channels_last = 0, np.moveaxis(w, 0, -1)    # (O, I, kh, kw)
    else:
        return False
    codes, scales, _ = quantize_weights(channels_last, scheme, fmt)
    if axis == 0:
        codes = np.ascontiguousarray(np.moveaxis(codes, -1, 0))
        codes = codes.reshape(w.shape)
    codes_name, scale_name, out = (f"{prefix}_w_fp8", f"{prefix}_w_scale", f"{prefix}_w_dq")
    graph.initializer.append(helper.make_tensor(codes_name, _float8_type(fmt), codes.shape,
                                                codes.tobytes(), raw=True))
    graph.initializer.append(numpy_helper.from_array(scales.astype(np.float32), scale_name))
    graph.node.append(helper.make_node("DequantizeLinear", [codes_name, scale_name], [out],
                                       name=f"{prefix}_w_dequantize", axis=axis))
    node.input[1] = out
    if not any(tensor.name in n.input for n in graph.node):   # the float32 weight, now unused
        graph.initializer.remove(tensor)
    return True


def _activation_scale(graph, x, fmt, scheme, prefix) -> str:
    """The name of the activation scale: a constant for a static range, else computed from x."""
    from onnx import helper, numpy_helper
    name = f"{prefix}_a_scale"
    if scheme.activations == "static":
        lo, hi = scheme.activation_range
        amax = max(abs(lo), abs(hi))
        scale = amax / fmt.max_finite if amax > 0 else 1.0
        graph.initializer.append(numpy_helper.from_array(np.array(scale, np.float32), name))
        return name
    constants = {f"{prefix}_zero": 0.0, f"{prefix}_one": 1.0, f"{prefix}_max": fmt.max_finite}
    for key, value in constants.items():
        graph.initializer.append(numpy_helper.from_array(np.array(value, np.float32), key))
    p = prefix
    graph.node.extend([
        helper.make_node("Abs", [x], [f"{p}_abs"]),
        helper.make_node("IsInf", [f"{p}_abs"], [f"{p}_inf"]),
        helper.make_node("IsNaN", [f"{p}_abs"], [f"{p}_nan"]),
        helper.make_node("Or", [f"{p}_inf", f"{p}_nan"], [f"{p}_bad"]),
        helper.make_node("Where", [f"{p}_bad", f"{p}_zero", f"{p}_abs"], [f"{p}_finite"]),
        helper.make_node("ReduceMax", [f"{p}_finite"], [f"{p}_amax"], keepdims=0),
        helper.make_node("Greater", [f"{p}_amax", f"{p}_zero"], [f"{p}_positive"]),
        helper.make_node("Div", [f"{p}_amax", f"{p}_max"], [f"{p}_ratio"]),
        helper.make_node("Where", [f"{p}_positive", f"{p}_ratio", f"{p}_one"], [name]),
    ])
    return name


def add_fp8_qdq(model_proto, records) -> list[str]:
    """Put float8 QDQ around the products of the records' exact FP8 layers (module docstring);
    returns the paths of the layers it did.  The model then imports opset 19 (IR version 9)."""
    from onnx import helper
    graph = model_proto.graph
    done = []
    for record in records:
        fmt = qdq_format(record)
        if fmt is None:
            continue
        scheme = QuantScheme.from_config(record.quantization).resolve(True)
        if not scheme.calibrated:
            continue
        nodes = [n for n in graph.node if n.name in record.onnx_nodes
                 and n.op_type in PRODUCTS[record.layer_type]]
        if len(nodes) != 1:
            continue
        node = nodes[0]
        prefix = f"graphswap_fp8_{record.index}"
        if not _weight_qdq(graph, node, fmt, scheme, prefix):
            continue
        x = node.input[0]
        scale = _activation_scale(graph, x, fmt, scheme, prefix)
        zero = f"{prefix}_a_zero_point"
        graph.initializer.append(helper.make_tensor(zero, _float8_type(fmt), [], b"\x00",
                                                    raw=True))
        graph.node.extend([
            helper.make_node("QuantizeLinear", [x, scale, zero], [f"{prefix}_a_fp8"],
                             name=f"{prefix}_a_quantize", saturate=1),
            helper.make_node("DequantizeLinear", [f"{prefix}_a_fp8", scale],
                             [f"{prefix}_a_dq"], name=f"{prefix}_a_dequantize")])
        node.input[0] = f"{prefix}_a_dq"
        done.append(record.path)
    if done:
        _topological_sort(graph)
        for opset in model_proto.opset_import:
            if opset.domain in ("", "ai.onnx"):
                opset.version = max(opset.version, FP8_OPSET)
        model_proto.ir_version = max(model_proto.ir_version, FP8_IR_VERSION)
    return done


def _topological_sort(graph) -> None:
    """Reorder the main graph's nodes so each comes after the producers of its inputs."""
    import onnx
    available = {t.name for t in graph.initializer} | {i.name for i in graph.input} | {""}
    pending = []
    for node in graph.node:   # copies: the repeated field is cleared below
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        pending.append(copy)
    ordered = []
    while pending:
        ready = [n for n in pending if all(i in available for i in n.input)]
        if not ready:   # a cycle or an outer-scope name: leave the rest in their order
            ordered.extend(pending)
            break
        for n in ready:
            ordered.append(n)
            available.update(n.output)
        chosen = {id(n) for n in ready}
        pending = [n for n in pending if id(n) not in chosen]
    del graph.node[:]
    graph.node.extend(ordered)


__all__ = ["FP8_OPSET", "add_fp8_qdq", "qdq_format"]
