"""The compiled GraphswapForward op (graphswap/swap/forward_op.py): operation-level libraries run
through it instead of tf.numpy_function, with results and gradients bit for bit those of the
numpy_function bridge; which kernels take it; errors from the library, from a handle of another
process and from a bad GRAPHSWAP_BRIDGE; the fallback when the op cannot be built."""

import numpy as np
import pytest
import tensorflow as tf

import graphswap
from conftest import (MATMUL_ONLY_LIBRARY, assert_close_to_roundoff, compile_library,
                      failing_matmul_library)
from graphswap.errors import KernelLoadError
from graphswap.io.savedmodel import python_ops_in
from graphswap.kernels import resolve_kernel
from graphswap.kernels.base import bind_scheme
from graphswap.kernels.scheme import QuantScheme
from graphswap.native import compiler
from graphswap.swap import forward_op, ops, ops_layers

CONV_CASES = [  # input shape, filter shape, strides, padding, dilations, groups
    ((3, 9, 8, 2), (3, 3, 2, 5), (1, 1), "valid", (1, 1), 1),
    ((2, 11, 10, 4), (5, 3, 4, 6), (2, 1), "same", (1, 1), 1),
    ((2, 12, 12, 3), (3, 3, 3, 4), (1, 1), "same", (2, 2), 1),
    ((2, 8, 8, 6), (3, 3, 2, 9), (1, 1), "same", (1, 1), 3),
    ((1, 14, 14, 32), (3, 3, 32, 32), (1, 1), "same", (1, 1), 1),
]


def _op_types(function, *args) -> set:
    graph = function.get_concrete_function(*args).graph
    types = {op.type for op in graph.get_operations()}
    for f in graph.as_graph_def().library.function:
        types |= {node.op for node in f.node_def}
    return types


def _forward_and_gradients(build, args, mode, monkeypatch):
    """(outputs, gradients wrt every argument, op types) with GRAPHSWAP_BRIDGE=mode; `build`
    creates the swapped computation (traced anew, so the mode applies)."""
    monkeypatch.setenv("GRAPHSWAP_BRIDGE", mode)

    @tf.function
    def run(*tensors):
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            y = build(*tensors)
            loss = tf.reduce_sum(y * tf.cos(y))
        return y, tape.gradient(loss, tensors)

    tensors = [tf.constant(a) for a in args]
    y, grads = run(*tensors)
    # the output gain is non-trainable state: no gradient (None on both bridges)
    return (y.numpy(), [None if g is None else g.numpy() for g in grads],
            _op_types(run, *tensors))


@pytest.mark.parametrize("epilogue", [(False, False, False), (False, True, True),
                                      (True, True, False)])
def test_matmul_through_the_op_equals_the_numpy_bridge(epilogue, monkeypatch):
    has_gain, has_shift, relu = epilogue
    rng = np.random.default_rng(0)
    args = [rng.normal(size=(37, 29)).astype(np.float32),
            rng.normal(size=(29, 13)).astype(np.float32)]
    if has_gain:
        args.append(rng.uniform(0.5, 2, size=13).astype(np.float32))
    if has_shift:
        args.append(rng.normal(size=13).astype(np.float32))
    kernel = resolve_kernel("exact")

    def build(x, w, *rest):
        rest = list(rest)
        gain = rest.pop(0) if has_gain else None
        shift = rest.pop(0) if has_shift else None
        return ops.swapped_matmul(x, w, kernel, gain=gain, shift=shift, relu=relu)

    y_op, g_op, types_op = _forward_and_gradients(build, args, "op", monkeypatch)
    y_np, g_np, types_np = _forward_and_gradients(build, args, "numpy", monkeypatch)
    assert "GraphswapForward" in types_op and "PyFuncStateless" not in types_op
    assert "GraphswapForward" not in types_np and "PyFuncStateless" in types_np
    np.testing.assert_array_equal(y_op, y_np)
    assert [g is None for g in g_op] == [g is None for g in g_np] == [False, False, *(
        [True] if has_gain else []), *([False] if has_shift else [])]
    for a, b in zip(g_op, g_np):
        if a is not None:
            np.testing.assert_array_equal(a, b)
    want = args[0] @ args[1]
    if has_gain:
        want = want * args[2]
    if has_shift:
        want = want + args[-1]
    if relu:
        want = np.maximum(want, 0)
    magnitude = np.abs(args[0]) @ np.abs(args[1]) * (args[2] if has_gain else 1) + 1
    assert_close_to_roundoff(y_op, want, 29, magnitude=magnitude)


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d_through_the_op_equals_the_numpy_bridge(case, monkeypatch):
    x_shape, w_shape, strides, padding, dilations, groups = case
    rng = np.random.default_rng(1)
    x = rng.normal(size=x_shape).astype(np.float32)
    w = rng.normal(size=w_shape).astype(np.float32)
    shift = rng.normal(size=w_shape[3]).astype(np.float32)
    kernel = resolve_kernel("exact")

    def build(a, b, s):
        return ops.swapped_conv2d(a, b, kernel, strides=strides, padding=padding,
                                  dilations=dilations, groups=groups, shift=s, relu=True)

    y_op, g_op, types_op = _forward_and_gradients(build, [x, w, shift], "op", monkeypatch)
    y_np, g_np, _ = _forward_and_gradients(build, [x, w, shift], "numpy", monkeypatch)
    assert "GraphswapForward" in types_op and "PyFuncStateless" not in types_op
    np.testing.assert_array_equal(y_op, y_np)
    for a, b in zip(g_op, g_np):
        np.testing.assert_array_equal(a, b)
    want = tf.nn.relu(tf.nn.conv2d(x, w, [1, *strides, 1], padding.upper(),
                                   dilations=list(dilations)) + shift).numpy()
    magnitude = tf.nn.conv2d(np.abs(x), np.abs(w), [1, *strides, 1], padding.upper(),
                             dilations=list(dilations)).numpy() + np.abs(shift)
    assert_close_to_roundoff(y_op, want, int(np.prod(w_shape[:3])), magnitude=magnitude)


LUT_CASES = [  # multiplier, weight encoding, granularity, static range (None: dynamic)
    ("mul8u_drum4", None, "per_channel", None),
    ("mul8u_drum4", "asymmetric", "per_tensor", (-0.7, 2.5)),
    ("mul8u_drum4", "sign_magnitude", "per_channel", (0.0, 1.5)),
    ("mul8s_drum4", None, "per_channel", (-1.9, 0.8)),
    ("mul8s_drum4", None, "per_tensor", None),
]


def _lut_build(kind, multiplier, weights, granularity, static_range, relu):
    kernel = resolve_kernel(multiplier)
    quant = QuantScheme(weights=weights, granularity=granularity,
                        activations="dynamic" if static_range is None else "static")

    def build(x, w, shift):
        activation_range = None if static_range is None else tf.constant(static_range, tf.float32)
        if kind == "matmul":
            return ops.swapped_matmul(x, w, kernel, quant=quant, shift=shift, relu=relu,
                                      activation_range=activation_range)
        return ops.swapped_conv2d(x, w, kernel, padding="same", quant=quant, shift=shift,
                                  relu=relu, activation_range=activation_range)

    return build


@pytest.mark.parametrize("case", LUT_CASES)
@pytest.mark.parametrize("kind", ["matmul", "conv2d"])
def test_table_kernels_through_the_op_equal_the_numpy_bridge(kind, case, monkeypatch):
    """The fused table path as one op: the same codes, corrections and scales as the
    numpy_function call of the same C kernel, including the static range's scale and zero point
    (computed in the op from the range tensor) and values outside the range (clipped)."""
    multiplier, weights, granularity, static_range = case
    rng = np.random.default_rng(4)
    if kind == "matmul":
        x = rng.normal(size=(33, 40)).astype(np.float32)
        w = rng.normal(size=(40, 7)).astype(np.float32)
    else:
        x = rng.normal(size=(2, 9, 9, 5)).astype(np.float32)
        w = rng.normal(size=(3, 3, 5, 7)).astype(np.float32)
    if multiplier.startswith("mul8u") and static_range is not None and static_range[0] >= 0:
        x = np.abs(x)
    shift = rng.normal(size=7).astype(np.float32)
    build = _lut_build(kind, multiplier, weights, granularity, static_range, relu=True)
    y_op, g_op, types_op = _forward_and_gradients(build, [x, w, shift], "op", monkeypatch)
    y_np, g_np, types_np = _forward_and_gradients(build, [x, w, shift], "numpy", monkeypatch)
    assert "GraphswapForward" in types_op and "PyFuncStateless" not in types_op
    assert "PyFuncStateless" in types_np
    np.testing.assert_array_equal(y_op, y_np)
    for a, b in zip(g_op, g_np):
        np.testing.assert_array_equal(a, b)
    assert (y_op > 0).mean() > 0.2  # not all clipped away


@pytest.mark.parametrize("signed, static_range", [
    (False, (0.0, 0.0)), (False, (0.3, 2.0)), (False, (-3.0, -1.0)), (False, (-1.0, 1.0)),
    (True, (0.0, 0.0)), (True, (-0.25, 0.125)), (False, (-1e-30, 1e-30)),
    (False, (-2.5, 252.5))])  # zero point exactly 2.5: rounds half to even, as np.rint
def test_static_scale_of_edge_ranges_matches_python(signed, static_range, monkeypatch):
    """The op computes a static range's scale and zero point itself: empty, all-positive,
    all-negative, tiny and half-way ranges give the numbers graphswap.kernels.quantized computes."""
    multiplier = "mul8s_drum4" if signed else "mul8u_drum4"
    x = np.linspace(-2, 2, 6 * 8, dtype=np.float32).reshape(6, 8)
    w = np.linspace(-1, 1, 8 * 3, dtype=np.float32).reshape(8, 3)
    build = _lut_build("matmul", multiplier, None, "per_tensor", static_range, relu=False)
    shift = np.zeros(3, np.float32)
    y_op, _, types = _forward_and_gradients(build, [x, w, shift], "op", monkeypatch)
    y_np, _, _ = _forward_and_gradients(build, [x, w, shift], "numpy", monkeypatch)
    assert "GraphswapForward" in types
    np.testing.assert_array_equal(y_op, y_np)


@pytest.mark.parametrize("kernel_name", ["exact", "mul8u_drum4", "mul8s_drum4"])
@pytest.mark.parametrize("strides, padding, multiplier", [((1, 1), "same", 1),
                                                          ((2, 2), "valid", 2)])
def test_depthwise_through_the_op_equals_the_numpy_bridge(kernel_name, strides, padding,
                                                          multiplier, monkeypatch):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, 10, 9, 6)).astype(np.float32)
    w = rng.normal(size=(3, 3, 6, multiplier)).astype(np.float32)
    kernel = resolve_kernel(kernel_name)
    if kernel_name != "exact":  # as a swapped layer hands it over: bound to its scheme
        kernel = bind_scheme(kernel, QuantScheme(granularity="per_tensor", activations="static",
                                                 activation_range=(0.0, 2.0)))

    def build(a, b):
        return ops_layers.swapped_depthwise_conv2d(a, b, kernel, strides=strides,
                                                   padding=padding)

    y_op, g_op, types_op = _forward_and_gradients(build, [x, w], "op", monkeypatch)
    y_np, g_np, types_np = _forward_and_gradients(build, [x, w], "numpy", monkeypatch)
    assert "GraphswapForward" in types_op and "PyFuncStateless" not in types_op
    assert "PyFuncStateless" in types_np
    np.testing.assert_array_equal(y_op, y_np)
    for a, b in zip(g_op, g_np):
        np.testing.assert_array_equal(a, b)
    if kernel_name == "exact":
        want = tf.nn.depthwise_conv2d(x, w, [1, *strides, 1], padding.upper()).numpy()
        magnitude = tf.nn.depthwise_conv2d(np.abs(x), np.abs(w), [1, *strides, 1],
                                           padding.upper()).numpy()
        assert_close_to_roundoff(y_op, want, 9, magnitude=magnitude)


@pytest.mark.parametrize("kernel_name", ["exact", "mul8u_drum4", "mul8s_drum4"])
def test_depthwise_with_static_range_and_epilogue_equals_the_numpy_bridge(kernel_name,
                                                                          monkeypatch):
    """What a calibrated, compensated SwappedDepthwiseConv2D passes: its scheme, its static
    range as a tensor and gain/shift (correction + bias), ReLU; gradients of input, weights and
    shift bit for bit on both bridges."""
    rng = np.random.default_rng(6)
    x = rng.normal(size=(2, 9, 9, 4)).astype(np.float32)
    w = rng.normal(size=(3, 3, 4, 2)).astype(np.float32)
    static_range = np.array([-1.5, 2.0], np.float32)
    gain = rng.uniform(0.8, 1.2, size=8).astype(np.float32)
    shift = rng.normal(size=8).astype(np.float32)
    kernel = resolve_kernel(kernel_name)
    quant = None if kernel_name == "exact" else QuantScheme(activations="static",
                                                            activation_range=(0.0, 1.0))

    def build(a, b, r, s):
        return ops_layers.swapped_depthwise_conv2d(
            a, b, kernel, padding="same", quant=quant,
            activation_range=None if quant is None else r, gain=tf.constant(gain), shift=s,
            relu=True)

    args = [x, w, static_range, shift]
    y_op, g_op, types_op = _forward_and_gradients(build, args, "op", monkeypatch)
    y_np, g_np, types_np = _forward_and_gradients(build, args, "numpy", monkeypatch)
    assert "GraphswapForward" in types_op and "PyFuncStateless" not in types_op
    assert "PyFuncStateless" in types_np
    np.testing.assert_array_equal(y_op, y_np)
    for a, b in zip(g_op, g_np):
        np.testing.assert_array_equal(a, b)
    if quant is not None:   # the range is the tensor's (another range, other outputs)
        y_other, _, _ = _forward_and_gradients(
            build, [x, w, static_range * 2, shift], "op", monkeypatch)
        assert not np.array_equal(y_other, y_op)
    else:
        want = tf.nn.relu(tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME") * gain
                          + shift).numpy()
        magnitude = tf.nn.depthwise_conv2d(np.abs(x), np.abs(w), [1, 1, 1, 1], "SAME").numpy()
        assert_close_to_roundoff(y_op, want, 9, magnitude=magnitude * gain + np.abs(shift))


def test_a_swapped_model_runs_the_op_for_every_exact_layer(lenet, monkeypatch):
    monkeypatch.setenv("GRAPHSWAP_BRIDGE", "auto")
    swapped = graphswap.rewrite_model(lenet, kernel="exact")
    x = np.random.default_rng(2).uniform(0, 1, size=(4, 32, 32, 1)).astype(np.float32)
    forward = tf.function(lambda t: swapped(t, training=False))
    types = _op_types(forward, tf.constant(x))
    assert "GraphswapForward" in types and "PyFuncStateless" not in types
    np.testing.assert_allclose(forward(tf.constant(x)).numpy(), lenet(x).numpy(),
                               rtol=1e-5, atol=1e-6)
    # a graph holding it cannot be served from another process: the SavedModel check finds it
    concrete = forward.get_concrete_function(tf.constant(x))
    assert sum("graphswap_forward" in name for name in python_ops_in(concrete)) == 5


def test_user_library_matmul_takes_the_op_and_conv_without_conv2d_keeps_numpy(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setenv("GRAPHSWAP_BRIDGE", "auto")
    kernel = resolve_kernel(str(compile_library(tmp_path, "matmulonly", MATMUL_ONLY_LIBRARY)))
    assert forward_op.supports(kernel, "matmul") and not forward_op.supports(kernel, "conv2d")
    assert not forward_op.supports(resolve_kernel("bf16"), "matmul")      # rounds in Python
    assert forward_op.supports(resolve_kernel("mul8u_drum4"), "conv2d")       # fused tables
    rng = np.random.default_rng(3)
    a = rng.normal(size=(6, 5)).astype(np.float32)
    b = rng.normal(size=(5, 4)).astype(np.float32)
    matmul = tf.function(lambda p, q: ops.swapped_matmul(p, q, kernel))
    assert "GraphswapForward" in _op_types(matmul, tf.constant(a), tf.constant(b))
    np.testing.assert_allclose(matmul(a, b).numpy(), a @ b, rtol=1e-5, atol=1e-6)
    x = rng.normal(size=(1, 5, 5, 2)).astype(np.float32)
    w = rng.normal(size=(3, 3, 2, 3)).astype(np.float32)
    conv = tf.function(lambda p, q: ops.swapped_conv2d(p, q, kernel))
    types = _op_types(conv, tf.constant(x), tf.constant(w))
    assert "GraphswapForward" not in types and "PyFuncStateless" in types
    np.testing.assert_allclose(conv(x, w).numpy(), tf.nn.conv2d(x, w, 1, "VALID").numpy(),
                               rtol=1e-5, atol=1e-5)


def test_library_error_reaches_tensorflow_with_its_message(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHSWAP_BRIDGE", "op")
    kernel = resolve_kernel(str(failing_matmul_library(tmp_path, "overheats",
                                                       "GRAPHSWAP_ERR_OVERFLOW",
                                                       "array overheated")))
    matmul = tf.function(lambda p, q: ops.swapped_matmul(p, q, kernel))
    with pytest.raises(tf.errors.InternalError,
                       match=r"kernel graphswap_matmul_f32 in .*overheats.* failed with code -3 "
                             r"\(overflow\): array overheated"):
        matmul(tf.ones((2, 3)), tf.ones((3, 2)))


def test_a_handle_from_another_process_is_refused():
    module = forward_op.op_library().module
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match="was not registered in this process: the graph was built in "
                             "another process"):
        module.graphswap_forward(tf.ones((2, 2)), tf.ones((2, 2)), [], handle=(1 << 40) | 3)


def test_bad_bridge_setting_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("GRAPHSWAP_BRIDGE", "ctypes")
    with pytest.raises(KernelLoadError, match=r"GRAPHSWAP_BRIDGE='ctypes' is not one of "
                                              r"\('auto', 'op', 'numpy', 'xla'\).*set "
                                              r"GRAPHSWAP_BRIDGE to auto\|op\|numpy\|xla"):
        forward_op.supports(resolve_kernel("exact"), "matmul")


def test_an_op_that_cannot_be_built_falls_back_or_fails_as_asked(monkeypatch):
    def no_compiler():
        raise compiler.CompilerError("no C++ compiler found (test)")

    monkeypatch.setattr(forward_op, "op_library_path", no_compiler)
    monkeypatch.setattr(forward_op, "_loaded", None)
    monkeypatch.setattr(forward_op, "_unavailable", None)
    kernel = resolve_kernel("exact")
    monkeypatch.setenv("GRAPHSWAP_BRIDGE", "auto")
    with pytest.warns(RuntimeWarning, match="through tf.numpy_function .* no C\\+\\+ compiler"):
        assert not forward_op.supports(kernel, "matmul")
    matmul = tf.function(lambda p, q: ops.swapped_matmul(p, q, kernel))
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert "PyFuncStateless" in _op_types(matmul, tf.constant(a), tf.constant(a.T))
    np.testing.assert_array_equal(matmul(a, a.T).numpy(), a @ a.T)
    monkeypatch.setenv("GRAPHSWAP_BRIDGE", "op")
    with pytest.raises(KernelLoadError, match="GRAPHSWAP_BRIDGE=op, but graphswap's TensorFlow "
                                              "op is not available: no C\\+\\+ compiler"):
        forward_op.supports(kernel, "matmul")
