"""Kept-kernel ONNX files are checked whole before onnxruntime sees them.

onnxruntime-extensions' Python bridge ends the process (SIGABRT) on any exception raised inside a
custom operator, so every graphswap node - in the main graph, in If/Loop/Scan bodies, in every
model-local function - and every attribute its body reads must be checked by `onnx_ops.session`
before the session exists.  Each attack runs in a fresh interpreter that opens the file with
`graphswap.onnx_session` and, if a session comes back, runs it: a missed check shows up as a
negative return code (the abort) or as the canary library's marker file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphswap
from conftest import REPO, assert_close_to_roundoff, compile_library
from graphswap.errors import KernelTrustError, ModelLoadError
from graphswap.io import onnx_ops
from graphswap.kernels import QuantScheme, resolve_kernel

CANARY = r"""
    #include <stdio.h>
    #include <stdlib.h>
    #include <stdint.h>
    __attribute__((constructor)) static void graphswap_test_canary(void) {
        const char *path = getenv("GRAPHSWAP_TEST_CANARY");
        FILE *f = fopen(path ? path : "/tmp/graphswap-test-canary", "a");
        if (f) { fputs("attacker code ran\n", f); fclose(f); }
    }
    uint16_t mul8u_evil(uint8_t a, uint8_t b) { return (uint16_t)(a * b); }
"""

DOMAIN, MATMUL, CONV = onnx_ops.DOMAIN, onnx_ops.MATMUL_OP, onnx_ops.CONV2D_OP
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1),
          helper.make_opsetid("local", 1)]
X = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
W = np.random.default_rng(1).standard_normal((3, 2)).astype(np.float32)
XC = np.random.default_rng(2).standard_normal((1, 4, 4, 1)).astype(np.float32)
FILTERS = np.random.default_rng(3).standard_normal((2, 2, 1, 1)).astype(np.float32)
EXACT = json.dumps({"spec": "exact"})
DRUM = json.dumps({"spec": "mul8u_drum4"})
DYNAMIC = json.dumps(QuantScheme().to_config())

#: runs in the fresh interpreter: open each case with graphswap.onnx_session; run what opens
CHILD = """
import json, sys
import numpy as np
import graphswap
cases = json.loads(sys.argv[1])
for case in cases:
    try:
        session = graphswap.onnx_session(case["path"])
    except graphswap.GraphswapError as exc:
        print(json.dumps({"case": case["name"], "error": type(exc).__name__,
                          "message": str(exc)}), flush=True)
        continue
    feeds = {i.name: np.asarray(case["x"], np.float32) for i in session.get_inputs()}
    (out,) = session.run(None, feeds)
    print(json.dumps({"case": case["name"], "output": out.tolist()}), flush=True)
"""


def _attribute(name, value=None, *, kind=None, ref=None):
    """An AttributeProto, raw when the test needs a wrong type, bytes or a reference."""
    if ref is not None:
        attr = onnx.AttributeProto(name=name, ref_attr_name=ref, type=onnx.AttributeProto.STRING)
        return attr
    if kind == "bytes":
        return onnx.AttributeProto(name=name, s=value, type=onnx.AttributeProto.STRING)
    return helper.make_attribute(name, value)


def _custom(op, inputs, attrs, name="gs"):
    node = helper.make_node(op, inputs, ["y" if inputs[0] == "a" else "Y"], domain=DOMAIN,
                            name=name)
    node.attribute.extend(attrs)
    return node


def _matmul_attrs(kernel=EXACT, quant=""):
    return [_attribute("kernel", kernel), _attribute("quant", quant)]


def _model(nodes, functions=(), inputs=None, initializers=None):
    graph = helper.make_graph(
        nodes, "g", inputs or [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        initializers if initializers is not None else [onnx.numpy_helper.from_array(W, "W")])
    model = helper.make_model(graph, opset_imports=OPSETS, functions=list(functions))
    model.ir_version = 8
    return model


def main_graph(attrs, op=MATMUL):
    return _model([_custom(op, ["X", "W"], attrs)])


def in_function(attrs, called=True, caller_attrs=(), function_attrs=()):
    """The custom node inside the model-local function local:Wrap (called by the main graph, or
    defined and never called)."""
    body = _custom(MATMUL, ["a", "b"], attrs)
    function = helper.make_function("local", "Wrap", ["a", "b"], ["y"], [body], OPSETS,
                                    attributes=list(function_attrs))
    if called:
        caller = helper.make_node("Wrap", ["X", "W"], ["Y"], domain="local", name="call")
        caller.attribute.extend(caller_attrs)
        nodes = [caller]
    else:
        nodes = [helper.make_node("MatMul", ["X", "W"], ["Y"], name="plain")]
    return _model(nodes, [function])


def _if_node(inner, name="branch"):
    """An If whose then-branch holds `inner` (reading X and W from the outer scope)."""
    then = helper.make_graph([inner], "then", [],
                             [helper.make_tensor_value_info(inner.output[0], TensorProto.FLOAT,
                                                            None)])
    plain = helper.make_node("MatMul", ["X", "W"], ["Z"])
    other = helper.make_graph([plain], "else", [],
                              [helper.make_tensor_value_info("Z", TensorProto.FLOAT, None)])
    return helper.make_node("If", ["C"], ["Y"], then_branch=then, else_branch=other, name=name)


def in_if(attrs):
    node = _custom(MATMUL, ["X", "W"], attrs)
    node.output[0] = "T"
    return _model([_if_node(node)], initializers=[onnx.numpy_helper.from_array(W, "W"),
                                                  onnx.numpy_helper.from_array(np.array(True),
                                                                               "C")])


def in_if_in_function(attrs):
    """Two levels down: the custom node in an If branch inside a model-local function."""
    node = _custom(MATMUL, ["X", "W"], attrs)
    node.output[0] = "T"
    branch = _if_node(node)
    branch.output[0] = "y"
    function = helper.make_function("local", "Wrap", ["X", "W", "C"], ["y"], [branch], OPSETS)
    caller = helper.make_node("Wrap", ["X", "W", "C"], ["Y"], domain="local")
    return _model([caller], [function],
                  initializers=[onnx.numpy_helper.from_array(W, "W"),
                                onnx.numpy_helper.from_array(np.array(True), "C")])


def conv_model(**changes):
    attrs = {"kernel": EXACT, "quant": "", "padding": "same", "stride_h": 1, "stride_w": 1,
             "dilation_h": 1, "dilation_w": 1, "groups": 1}
    attrs.update(changes)
    protos = [value if isinstance(value, onnx.AttributeProto) else _attribute(key, value)
              for key, value in attrs.items() if value is not None]
    return _model([_custom(CONV, ["X", "W"], protos)],
                  inputs=[helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 4, 4, 1])],
                  initializers=[onnx.numpy_helper.from_array(FILTERS, "W")])


@pytest.fixture()
def canary(tmp_path, monkeypatch):
    """The attacker's multiplier library (its constructor writes the marker) and its records."""
    marker = tmp_path / "canary-ran"
    monkeypatch.setenv("GRAPHSWAP_TEST_CANARY", str(marker))
    library = compile_library(tmp_path / "evil", "canary", CANARY)
    sha = graphswap.native.read_file(str(library), "library").sha256
    spec = f"{library}:mul8u_evil:u8"

    class Canary:
        pass

    c = Canary()
    c.marker, c.library = marker, library
    c.record = json.dumps({"spec": spec, "path": str(library), "sha256": sha})
    c.plain = json.dumps({"spec": spec})
    yield c
    assert not marker.exists(), "the attacker's library was loaded"


def _run_cases(tmp_path, cases):
    """Every (name, model, expected) case opened (and run, if it opens) in one fresh
    interpreter; returns {name: outcome}.  The interpreter must exit normally: an abort inside
    onnxruntime would be a negative return code."""
    listed = []
    for name, model, _ in cases:
        path = tmp_path / f"{name}.onnx"
        path.write_bytes(model.SerializeToString())
        dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
        listed.append({"name": name, "path": str(path),
                       "x": (XC if dims == [1, 4, 4, 1] else X).tolist()})
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(listed)],
                          capture_output=True, text=True, timeout=300, env=_child_env(),
                          cwd=str(tmp_path))
    assert proc.returncode == 0, f"the child ended with {proc.returncode}:\n{proc.stderr[-3000:]}"
    outcomes = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            outcomes[record["case"]] = record
    assert set(outcomes) == {name for name, _, _ in cases}, proc.stderr[-3000:]
    return outcomes


def _child_env():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]]
                                                       if env.get("PYTHONPATH") else []))
    return env


def _check(outcomes, cases):
    for name, _, (error, pattern) in cases:
        got = outcomes[name]
        assert got.get("error") == error, f"{name}: {got}"
        message = got["message"]
        assert "\n" not in message, f"{name}: not one line: {message}"
        for part in pattern:
            assert part in message, f"{name}: {part!r} not in {message!r}"


def _trust_cases(c):
    evil = _matmul_attrs(c.record, "")
    where = "model-local function local:Wrap"
    refused = ("KernelTrustError", ("custom node", "not trusted", str(c.library)))
    return [
        ("untrusted_in_main_graph", main_graph(evil),
         ("KernelTrustError", ("custom node 'gs' (GraphswapMatMul) in the main graph",
                               "not trusted"))),
        ("untrusted_in_called_function", in_function(evil),
         ("KernelTrustError", (f"custom node 'gs' (GraphswapMatMul) in {where}", "not trusted"))),
        ("untrusted_in_function_never_called", in_function(evil, called=False),
         ("KernelTrustError", (where, "not trusted"))),
        ("untrusted_in_if_branch", in_if(evil),
         ("KernelTrustError", ("the main graph > node 'branch' (If) attribute 'then_branch'",
                               "not trusted"))),
        ("untrusted_in_if_inside_function", in_if_in_function(evil),
         ("KernelTrustError", (f"{where} > node 'branch' (If)", "not trusted"))),
        ("plain_spec_in_function", in_function(_matmul_attrs(c.plain, "")),
         ("KernelTrustError", (where, "without a recorded path and sha256"))),
        ("record_passed_by_reference", in_function(
            [_attribute("kernel", ref="k"), _attribute("quant", "")],
            caller_attrs=[_attribute("k", c.record)], function_attrs=["k"]),
         ("ModelLoadError", (where, "attribute 'kernel' refers to the calling node's attribute "
                                    "'k'"))),
        ("untrusted_in_conv_node", conv_model(kernel=c.record), refused),
    ]


def _domain_cases(c):
    shadow = helper.make_function(DOMAIN, MATMUL, ["a", "b"], ["y"],
                                  [helper.make_node("MatMul", ["a", "b"], ["y"])], OPSETS)
    other = helper.make_node("PyOp", ["X", "W"], ["Y"], domain=DOMAIN, name="foreign")
    return [
        ("function_shadowing_the_custom_op", _model(
            [_custom(MATMUL, ["X", "W"], _matmul_attrs(c.record))], [shadow]),
         ("ModelLoadError", ("defines the function 'GraphswapMatMul' in graphswap's domain",))),
        ("other_operator_in_graphswap_domain", _model([other]),
         ("ModelLoadError", ("node 'foreign' in the main graph", f"{DOMAIN}.PyOp",
                             "graphswap runs only GraphswapMatMul, GraphswapConv2D"))),
    ]


def _malformed_cases():
    """(name, model, expected): one ModelLoadError naming the node and the attribute each."""
    def bad(name, attrs, attribute, *parts, model=main_graph, error="ModelLoadError"):
        return (name, model(attrs),
                (error, ("custom node 'gs'", f"attribute '{attribute}'", *parts,
                         "re-export the model")))

    deep = "[" * 20000 + "]" * 20000
    return [
        bad("quant_not_json", _matmul_attrs(DRUM, "{not json"), "quant", "is not valid JSON"),
        bad("quant_not_json_in_function", _matmul_attrs(DRUM, "{not json"), "quant",
            "model-local function local:Wrap", "is not valid JSON", model=in_function),
        bad("quant_not_json_in_if_branch", _matmul_attrs(DRUM, "nan nan"), "quant",
            "is not valid JSON", model=in_if),
        bad("quant_a_list", _matmul_attrs(DRUM, "[1, 2]"), "quant",
            "is not a quantization config", "got list"),
        bad("quant_unknown_key", _matmul_attrs(DRUM, '{"bits": 4}'), "quant",
            "unknown quantization setting(s) bits"),
        bad("quant_wrong_value_type", _matmul_attrs(DRUM, '{"weights": 3}'), "quant",
            "weight encoding must be one of"),
        bad("quant_range_a_number", _matmul_attrs(DRUM, '{"activation_range": 5}'), "quant",
            "is not a quantization config"),
        bad("quant_range_not_finite",
            _matmul_attrs(DRUM, '{"activations": "static", "activation_range": [0, Infinity]}'),
            "quant", "finite lo <= hi"),
        bad("quant_static_without_range",
            _matmul_attrs(DRUM, '{"activations": "static"}'), "quant",
            "cannot run on mul8u_drum4", "calibrated activation range"),
        bad("quant_encoding_of_the_other_signedness",
            _matmul_attrs(DRUM, '{"weights": "symmetric"}'), "quant",
            "cannot run on mul8u_drum4", "unsigned"),
        bad("quant_deeply_nested", _matmul_attrs(DRUM, deep), "quant", "is not valid JSON"),
        bad("quant_too_long", _matmul_attrs(DRUM, " " * 70000 + "{}"), "quant",
            "is 70,002 bytes long"),
        bad("quant_not_utf8",
            [_attribute("kernel", DRUM), _attribute("quant", b"{\xff}", kind="bytes")], "quant",
            "is not UTF-8 text"),
        bad("quant_with_nul", _matmul_attrs(DRUM, '{"weights": null}\x00junk'), "quant",
            "NUL character"),
        bad("quant_an_integer", [_attribute("kernel", DRUM), _attribute("quant", 7)], "quant",
            "has type INT", "it is a STRING"),
        bad("quant_given_twice", _matmul_attrs(DRUM, "") + [_attribute("quant", "{}")], "quant",
            "is given twice"),
        bad("quant_passed_by_reference",
            [_attribute("kernel", DRUM), _attribute("quant", ref="q")], "quant",
            "refers to the calling node's attribute 'q'",
            model=lambda attrs: in_function(attrs, caller_attrs=[_attribute("q", "{")],
                                            function_attrs=["q"])),
        bad("kernel_not_json", _matmul_attrs("{spec: exact}", ""), "kernel", "is not valid JSON"),
        bad("kernel_missing", [_attribute("quant", "")], "kernel", "is missing"),
        ("kernel_a_number", main_graph(_matmul_attrs("5", "")),
         ("KernelTrustError", ("custom node 'gs'", "is not a kernel record"))),
        ("matmul_with_three_inputs", _model([_custom(MATMUL, ["X", "W", "W"],
                                                     _matmul_attrs())]),
         ("ModelLoadError", ("custom node 'gs'", "has 3 input(s)", "takes 2 inputs"))),
        ("conv_padding_full", conv_model(padding="full"),
         ("ModelLoadError", ("attribute 'padding'", "allowed: 'valid' or 'same'"))),
        ("conv_stride_zero", conv_model(stride_h=0),
         ("ModelLoadError", ("attribute 'stride_h' is 0", "allowed: 1.."))),
        ("conv_stride_negative", conv_model(stride_w=-1),
         ("ModelLoadError", ("attribute 'stride_w' is -1",))),
        ("conv_dilation_huge", conv_model(dilation_h=2 ** 40),
         ("ModelLoadError", (f"attribute 'dilation_h' is {2 ** 40}",))),
        ("conv_groups_zero", conv_model(groups=0),
         ("ModelLoadError", ("attribute 'groups' is 0",))),
        ("conv_stride_a_string", conv_model(stride_h="2"),
         ("ModelLoadError", ("attribute 'stride_h' has type STRING", "it is an INT"))),
        ("conv_dilation_missing", conv_model(dilation_w=None),
         ("ModelLoadError", ("attribute 'dilation_w' is missing",))),
        ("conv_quant_not_json", conv_model(kernel=DRUM, quant="{"),
         ("ModelLoadError", ("GraphswapConv2D", "attribute 'quant' is not valid JSON"))),
        ("matmul_weights_of_rank_3", _model(
            [_custom(MATMUL, ["X", "W"], _matmul_attrs())],
            initializers=[onnx.numpy_helper.from_array(W[None], "W")]),
         ("ModelLoadError", ("custom node 'gs'", "has weights 'W' of shape (1, 3, 2)",
                             "have 2 dimensions"))),
        ("conv_weights_of_rank_2_in_if_branch", _conv_in_if_with_flat_filters(),
         ("ModelLoadError", ("attribute 'then_branch'", "has weights 'W' of shape (2, 2)",
                             "have 4 dimensions"))),
    ]


def _conv_in_if_with_flat_filters():
    """A Conv node in an If branch whose filters (an initializer of the enclosing graph) are 2-D."""
    attrs = [_attribute(k, v) for k, v in {"kernel": EXACT, "quant": "", "padding": "same",
                                           "stride_h": 1, "stride_w": 1, "dilation_h": 1,
                                           "dilation_w": 1, "groups": 1}.items()]
    node = _custom(CONV, ["X", "W"], attrs)
    node.output[0] = "T"
    return _model([_if_node(node)],
                  inputs=[helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 4, 4, 1])],
                  initializers=[onnx.numpy_helper.from_array(np.ones((2, 2), np.float32), "W"),
                                onnx.numpy_helper.from_array(np.array(True), "C")])


def test_every_node_and_attribute_is_checked_before_the_session(canary, tmp_path):
    """41 attacks, all in one fresh interpreter: each refused with one line naming the node (and
    where it sits) and the attribute; the interpreter never aborts, the canary never runs."""
    cases = _trust_cases(canary) + _domain_cases(canary) + _malformed_cases()
    outcomes = _run_cases(tmp_path, cases)
    _check(outcomes, cases)
    assert len(cases) == 41


def test_the_api_raises_graphswap_errors_naming_node_and_attribute(canary, tmp_path):
    """In this process too: the error classes, before onnxruntime is involved."""
    path = tmp_path / "m.onnx"
    onnx.save(in_function(_matmul_attrs(DRUM, "{not json")), str(path))
    with pytest.raises(ModelLoadError, match=r"custom node 'gs' \(GraphswapMatMul\) in "
                                             r"model-local function local:Wrap of the ONNX model "
                                             r".*attribute 'quant' is not valid JSON"):
        graphswap.onnx_session(path)
    onnx.save(in_function(_matmul_attrs(canary.record)), str(path))
    with pytest.raises(KernelTrustError, match="model-local function local:Wrap.*not trusted"):
        onnx_ops.session(path)
    with pytest.raises(KernelTrustError, match="not trusted"):
        onnx_ops.open_kernels(path)


def test_checked_models_run_the_kernel_wherever_the_node_sits(tmp_path):
    """The checks refuse nothing honest: the same node in the main graph, a function, an If
    branch and an If inside a function gives X @ W (exact kernel, against numpy) and the
    approximate kernel's own matmul (mul8u_drum4, against LutKernel.matmul) bit for bit; a node
    without the quant attribute (older files) still opens."""
    cases = []
    for kernel, quant in ((EXACT, ""), (DRUM, DYNAMIC)):
        tag = "exact" if kernel == EXACT else "drum"
        for where, build in (("main", main_graph), ("function", in_function), ("if", in_if),
                             ("if_in_function", in_if_in_function)):
            cases.append((f"{tag}_{where}", build(_matmul_attrs(kernel, quant)), None))
    cases.append(("exact_without_quant", main_graph([_attribute("kernel", EXACT)]), None))
    cases.append(("conv_exact", conv_model(), None))
    outcomes = _run_cases(tmp_path, cases)
    for name, _, _ in cases:
        assert "output" in outcomes[name], f"{name}: {outcomes[name]}"
    for name in ("exact_main", "exact_function", "exact_if", "exact_if_in_function",
                 "exact_without_quant"):
        assert_close_to_roundoff(np.array(outcomes[name]["output"]), X.astype(np.float64) @ W, 3)
    approx = resolve_kernel("mul8u_drum4").matmul(X, W, quant=QuantScheme())
    for name in ("drum_main", "drum_function", "drum_if", "drum_if_in_function"):
        np.testing.assert_array_equal(np.array(outcomes[name]["output"], np.float32), approx)
    assert not np.array_equal(approx, X @ W)  # the approximate kernel is what ran
    import tensorflow as tf

    reference = tf.nn.conv2d(XC, FILTERS, strides=1, padding="SAME").numpy()
    assert_close_to_roundoff(np.array(outcomes["conv_exact"]["output"]), reference, 4)


def test_a_model_with_external_weights_opens_from_the_checked_bytes(tmp_path, monkeypatch):
    """onnxruntime gets the checked bytes, not the path: weights stored beside the file are still
    found (from its folder, whatever the working directory)."""
    folder = tmp_path / "model"
    folder.mkdir()
    weights = np.random.default_rng(4).standard_normal((3, 2)).astype(np.float32)
    model = main_graph(_matmul_attrs())
    model.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(weights, "W"))
    onnx.save(model, str(folder / "m.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    assert (folder / "weights.bin").stat().st_size == weights.nbytes
    monkeypatch.chdir(tmp_path)
    session = onnx_ops.session(folder / "m.onnx")
    (out,) = session.run(None, {"X": X})
    assert_close_to_roundoff(out, X.astype(np.float64) @ weights, 3)
