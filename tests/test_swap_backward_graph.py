"""The swapped model's backward pass runs the ops the original model's graph runs: the same
Conv2DBackpropInput/Conv2DBackpropFilter (VALID/SAME padding, never EXPLICIT, which TensorFlow's
CPU build runs without oneDNN) and the same MatMul gradients."""

from __future__ import annotations

import collections

import keras
import numpy as np
import pytest
import tensorflow as tf

import graphswap
from conftest import SAMPLE_MODEL

GRADIENT_OPS = ("Conv2DBackpropInput", "Conv2DBackpropFilter", "MatMul", "Conv2D")


def _backward_ops(model, x, y) -> collections.Counter:
    """(op type, padding) of the gradient ops in a traced training step of `model`."""
    loss_fn = keras.losses.SparseCategoricalCrossentropy()

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return tape.gradient(loss, model.trainable_weights)

    graph = step.get_concrete_function(tf.TensorSpec(x.shape, tf.float32),
                                       tf.TensorSpec(y.shape, tf.int64)).graph
    found = collections.Counter()
    functions = [graph.as_graph_def()]
    definition = functions[0]
    nodes = list(definition.node) + [n for f in definition.library.function for n in f.node_def]
    for node in nodes:
        if node.op in GRADIENT_OPS:
            padding = node.attr["padding"].s.decode() if "padding" in node.attr else ""
            found[(node.op, padding)] += 1
    return found


@pytest.mark.parametrize("kernel", ["exact", "mul8u_drum4"])
def test_swapped_backward_runs_the_original_gradient_ops(kernel):
    original = keras.models.load_model(SAMPLE_MODEL)
    swapped = graphswap.rewrite_model(original, kernel=kernel)
    x = np.zeros((8, 32, 32, 1), np.float32)
    y = np.zeros((8,), np.int64)
    want = _backward_ops(original, x, y)
    got = _backward_ops(swapped, x, y)
    # the forward products run in the kernel (numpy_function): 2 Conv2D and 3 MatMul fewer
    assert want[("Conv2D", "VALID")] == 2 and got[("Conv2D", "VALID")] == 0
    assert got[("MatMul", "")] == want[("MatMul", "")] - 3 == 6
    for op in ("Conv2DBackpropInput", "Conv2DBackpropFilter"):
        assert got[(op, "VALID")] == want[(op, "VALID")] == 2
    assert not any(padding == "EXPLICIT" for _, padding in got)
