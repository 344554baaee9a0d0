"""override(model, rules): guided ReLU through every ReLU form, selectors, reports, errors."""

from __future__ import annotations


import keras
import numpy as np
import pytest
import tensorflow as tf

import graphswap
from conftest import assert_close_to_roundoff, reduction_terms
from graphswap import gradients as gg
from graphswap.errors import GraphswapError, UnsupportedLayerError


def build_all_relu_forms(seed: int = 0) -> keras.Model:
    """Every ReLU form, two levels of nesting."""
    keras.utils.set_random_seed(seed)
    deep_in = keras.Input((24,))
    deep = keras.Model(deep_in, keras.layers.Dense(16, activation="relu", name="deep_dense")(
        deep_in), name="deep")
    inner = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(24, activation="relu6", name="dense_relu6"),
        deep,
        keras.layers.Dense(12, name="dense_lin"),
        keras.layers.Activation("relu", name="act_relu"),
        keras.layers.Dense(10, name="dense_lin2"),
        keras.layers.LeakyReLU(negative_slope=0.3, name="leaky"),
    ], name="inner")
    inputs = keras.Input((8, 8, 2), name="image")
    x = keras.layers.Conv2D(4, 3, activation="relu", name="conv_relu")(inputs)
    x = keras.layers.Conv2D(4, 3, name="conv_lin")(x)
    x = keras.layers.ReLU(max_value=1.0, negative_slope=0.1, threshold=0.05, name="relu_capped")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = inner(x)
    x = keras.layers.Dense(8, activation=keras.activations.relu, name="dense_relu")(x)
    x = keras.layers.Activation("relu6", name="act_relu6")(x)
    outputs = keras.layers.Dense(3, name="logits")(x)
    model = keras.Model(inputs, outputs, name="relu_forms")
    # larger weights so that relu6 / max_value saturate for some units
    for layer, factor in ((inner.get_layer("dense_relu6"), 15.0),
                          (model.get_layer("dense_relu"), 6.0)):
        kernel, bias = layer.get_weights()
        layer.set_weights([kernel * factor, bias + 0.5])
    return model


def _weights(model):
    inner = model.get_layer("inner")
    deep = inner.get_layer("deep")
    layers = {name: model.get_layer(name) for name in ("conv_relu", "conv_lin", "dense_relu",
                                                       "logits")}
    layers.update({name: inner.get_layer(name) for name in ("dense_relu6", "dense_lin",
                                                            "dense_lin2")})
    layers["deep_dense"] = deep.get_layer("deep_dense")
    return {name: [tf.constant(w) for w in layer.get_weights()] for name, layer in layers.items()}


def independent_guided_backprop(model, images, class_index):
    """Guided backprop by hand: a forward of the same network written out with TF ops, then a
    backward that chains each linear piece's vector-Jacobian product (its own small tape) with
    explicit numpy gating (dy > 0) * (low < z < high) at every ReLU."""
    w = _weights(model)
    inf = np.inf
    conv = lambda name: lambda z: tf.nn.conv2d(z, w[name][0], 1, "VALID") + w[name][1]  # noqa
    dense = lambda name: lambda z: z @ w[name][0] + w[name][1]  # noqa
    relu = lambda z: tf.maximum(z, 0.0)  # noqa
    stages = [
        ("linear", conv("conv_relu")), ("gate", relu, 0.0, inf),
        ("linear", conv("conv_lin")),
        ("gate", lambda z: tf.where(z >= 1.0, 1.0, tf.where(z >= 0.05, z, 0.1 * (z - 0.05))),
         0.05, 1.0),
        ("linear", lambda z: tf.reshape(z, (z.shape[0], -1))),
        ("linear", dense("dense_relu6")), ("gate", lambda z: tf.clip_by_value(z, 0.0, 6.0), 0, 6),
        ("linear", dense("deep_dense")), ("gate", relu, 0.0, inf),
        ("linear", dense("dense_lin")), ("gate", relu, 0.0, inf),
        ("linear", dense("dense_lin2")), ("gate", lambda z: tf.where(z > 0, z, 0.3 * z), 0, inf),
        ("linear", dense("dense_relu")), ("gate", relu, 0.0, inf),
        ("gate", lambda z: tf.clip_by_value(z, 0.0, 6.0), 0.0, 6.0),
        ("linear", dense("logits")),
    ]
    activations = [tf.constant(images, tf.float32)]
    for stage in stages:
        activations.append(stage[1](activations[-1]))
    logits = activations[-1].numpy()
    upstream = np.zeros_like(logits)
    upstream[:, class_index] = 1.0
    for stage, z in zip(reversed(stages), reversed(activations[:-1])):
        if stage[0] == "gate":
            low, high = stage[2], stage[3]
            zn = z.numpy()
            upstream = upstream * (upstream > 0) * ((zn > low) & (zn < high))
        else:
            with tf.GradientTape() as tape:
                tape.watch(z)
                out = stage[1](z)
            upstream = tape.gradient(out, z, output_gradients=tf.constant(upstream)).numpy()
    return logits, upstream


def _input_gradient(model, images, class_index):
    x = tf.constant(images, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = model(x, training=False)
        score = tf.reduce_sum(out[:, class_index])
    return out.numpy(), tape.gradient(score, x).numpy()


@pytest.fixture(scope="module")
def relu_model():
    return build_all_relu_forms()


@pytest.fixture(scope="module")
def relu_images():
    return np.random.default_rng(42).normal(0.5, 1.0, size=(3, 8, 8, 2)).astype(np.float32)


def test_guided_override_matches_independent_guided_backprop(relu_model, relu_images):
    guided, report = gg.override(relu_model, {"relu": "guided"}, return_report=True)
    touched = {entry.path for entry in report.overridden}
    assert touched == {"conv_relu", "relu_capped", "inner/dense_relu6", "inner/deep/deep_dense",
                       "inner/act_relu", "inner/leaky", "dense_relu", "act_relu6"}
    assert report.warnings == []
    for class_index in range(3):
        reference_logits, reference_grad = independent_guided_backprop(relu_model, relu_images,
                                                                       class_index)
        out, grad = _input_gradient(guided, relu_images, class_index)
        original_out, vanilla = _input_gradient(relu_model, relu_images, class_index)
        np.testing.assert_array_equal(out, original_out)  # forward unchanged, bit for bit
        assert_close_to_roundoff(out, reference_logits, reduction_terms(relu_model))
        assert_close_to_roundoff(grad, reference_grad, 2 * reduction_terms(relu_model))
        assert all(np.count_nonzero(sample) > 50 for sample in grad)  # 128 inputs per sample
        assert not np.allclose(grad, vanilla, atol=1e-5)  # guided really differs from vanilla


def test_guided_reference_exercises_every_gate(relu_model, relu_images):
    """The hand computation would be vacuous if no unit saturated or went negative."""
    x = tf.constant(relu_images)
    inner = relu_model.get_layer("inner")
    capped_in = relu_model.get_layer("conv_lin")(relu_model.get_layer("conv_relu")(x)).numpy()
    assert (capped_in > 1.0).any() and (capped_in < 0.05).any()
    flat = relu_model.get_layer("relu_capped")(capped_in).numpy().reshape(3, -1)
    relu6_in = flat @ inner.get_layer("dense_relu6").kernel.numpy() + \
        inner.get_layer("dense_relu6").bias.numpy()
    assert (relu6_in > 6.0).any() and (relu6_in < 0).any()
    features = keras.Model(relu_model.inputs, relu_model.get_layer("dense_relu").output)
    dense_relu_out = features(x).numpy()
    assert (dense_relu_out > 6.0).any() and (dense_relu_out == 0).any()  # act_relu6 saturates


def test_override_does_not_mutate_and_keeps_weights(relu_model, relu_images):
    before = [w.copy() for w in relu_model.get_weights()]
    types = [type(layer) for layer in relu_model.layers]
    _, vanilla = _input_gradient(relu_model, relu_images, 0)
    guided = gg.override(relu_model, {"relu": "guided", "logits": gg.Scale(3.0)})
    assert [type(layer) for layer in relu_model.layers] == types
    for a, b in zip(before, relu_model.get_weights()):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(relu_model.get_weights(), guided.get_weights()):
        np.testing.assert_array_equal(a, b)
    _, again = _input_gradient(relu_model, relu_images, 0)
    np.testing.assert_array_equal(vanilla, again)
    assert isinstance(guided.get_layer("conv_relu"), gg.GradientOverride)
    assert guided.get_layer("conv_relu").layer.get_config()["activation"] == "linear"
    assert isinstance(guided.get_layer("relu_capped"), gg.GuidedReLU)
    assert guided.get_layer("relu_capped").get_config()["max_value"] == 1.0


def test_guided_override_on_swapped_model(relu_model, relu_images):
    swapped = graphswap.rewrite_model(relu_model, kernel="exact")
    guided_swapped, report = gg.override(swapped, {"relu": "guided"}, return_report=True)
    assert isinstance(guided_swapped.get_layer("conv_relu").layer, graphswap.SwappedConv2D)
    assert isinstance(guided_swapped.get_layer("dense_relu").layer, graphswap.SwappedDense)
    assert len(report.overridden) == 8
    _, reference = independent_guided_backprop(relu_model, relu_images, 1)
    _, grad = _input_gradient(guided_swapped, relu_images, 1)
    assert_close_to_roundoff(grad, reference, 2 * reduction_terms(relu_model))


def test_overridden_model_saves_and_reloads(relu_model, relu_images, tmp_path):
    guided = gg.override(relu_model, {"relu": "guided", "dense_relu": gg.ClipByNorm(0.5),
                                      "inner/dense_lin": [gg.Scale(2.0), gg.Reverse(0.5)]})
    path = tmp_path / "guided.keras"
    guided.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.get_layer("dense_relu").rules == [gg.ClipByNorm(0.5)]
    out_a, grad_a = _input_gradient(guided, relu_images, 2)
    out_b, grad_b = _input_gradient(loaded, relu_images, 2)
    np.testing.assert_array_equal(out_a, out_b)
    np.testing.assert_array_equal(grad_a, grad_b)


# ----------------------------------------------------------------------------------------------
# selectors and rules
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rules,factor,touched", [
    ({"logits": gg.Scale(2.0)}, 2.0, {"logits"}),
    ({"logits": gg.Reverse(1.0)}, -1.0, {"logits"}),
    ({"logits": "reverse"}, -1.0, {"logits"}),
    ({"conv_*": gg.Scale(0.5)}, 0.25, {"conv_relu", "conv_lin"}),
    ({"type:Conv2D": gg.Scale(0.5)}, 0.25, {"conv_relu", "conv_lin"}),
    ({keras.layers.Conv2D: gg.Scale(0.5)}, 0.25, {"conv_relu", "conv_lin"}),
    ({"activation:relu6": gg.Scale(0.5)}, 0.25, {"inner/dense_relu6", "act_relu6"}),
    ({"inner/deep/deep_dense": gg.Scale(3.0)}, 3.0, {"inner/deep/deep_dense"}),
    ({"deep_dense": gg.Scale(3.0)}, 3.0, {"inner/deep/deep_dense"}),
    ({"inner/*": gg.Scale(-1.0)}, -1.0 ** 1, None),
])
def test_selectors(relu_model, relu_images, rules, factor, touched):
    modified, report = gg.override(relu_model, rules, return_report=True)
    if touched is not None:
        assert {entry.path for entry in report.overridden} == touched
    else:  # every leaf layer of inner (6 of them, odd count, deep is a model): (-1)^6 = 1
        assert len(report.overridden) == 6
        factor = 1.0
    out, grad = _input_gradient(modified, relu_images, 0)
    original_out, original_grad = _input_gradient(relu_model, relu_images, 0)
    np.testing.assert_array_equal(out, original_out)
    assert_close_to_roundoff(grad, factor * original_grad, 2 * reduction_terms(relu_model))


def test_rules_act_in_the_order_listed():
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(2, name="out")(inputs))
    x = np.ones((1, 3), np.float32)
    _, plain = _input_gradient(model, x, 0)
    clip_then_scale = gg.override(model, {"out": [gg.ClipByValue(-0.1, 0.1), gg.Scale(10.0)]})
    scale_then_clip = gg.override(model, {"out": [gg.Scale(10.0), gg.ClipByValue(-0.1, 0.1)]})
    # dy = 1 at the chosen logit: clip -> 0.1, then x10 -> 1.0: the plain gradient
    np.testing.assert_allclose(_input_gradient(clip_then_scale, x, 0)[1], plain, rtol=1e-6)
    # x10 -> 10, then clip -> 0.1: a tenth of the plain gradient
    np.testing.assert_allclose(_input_gradient(scale_then_clip, x, 0)[1], 0.1 * plain, rtol=1e-6)


def test_lenet_fit_with_scale_zero_freezes_earlier_layers(lenet, digits):
    frozen = gg.override(lenet, {"fc1": gg.Scale(0.0)})
    frozen.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy")
    before = {layer.name: [w.copy() for w in layer.get_weights()] for layer in frozen.layers}
    frozen.fit(digits["x_train"][:64], digits["y_train"][:64], batch_size=32, epochs=1, verbose=0)
    # the rule zeroes the gradient arriving at fc1's output: fc1 and everything before it freeze
    for name in ("conv1", "conv2", "fc1"):
        for a, b in zip(before[name], frozen.get_layer(name).get_weights()):
            np.testing.assert_array_equal(a, b)
    for name in ("fc2", "predictions"):
        assert any(not np.array_equal(a, b) for a, b in zip(
            before[name], frozen.get_layer(name).get_weights()))


# ----------------------------------------------------------------------------------------------
# bad inputs and warnings
# ----------------------------------------------------------------------------------------------

def test_unknown_rule_name(relu_model):
    with pytest.raises(gg.UnknownRuleError, match=r"unknown gradient rule 'guidded'; allowed: the "
                                                  r"names 'guided', 'reverse', or rule objects"):
        gg.override(relu_model, {"relu": "guidded"})
    with pytest.raises(GraphswapError, match="rules must be a non-empty dict"):
        gg.override(relu_model, {})
    with pytest.raises(GraphswapError, match="a rule key must be a layer name, path or glob"):
        gg.override(relu_model, {3: "guided"})


def test_rule_matching_no_layer_warns_or_fails_with_strict(relu_model):
    with pytest.warns(gg.OverrideWarning, match="rule 'dense_99' \\(name 'dense_99'\\) matched no "
                                                "layer in model 'relu_forms'"):
        model, report = gg.override(relu_model, {"relu": "guided", "dense_99": gg.Scale(2.0)},
                                    return_report=True)
    assert len(report.warnings) == 1 and "dense_99" in report.warnings[0]
    assert "warning: rule 'dense_99'" in report.format_table()
    assert report.to_dict()["overridden"] == 8
    with pytest.raises(gg.RuleMatchError, match="override \\(strict\\): rule 'dense_99'"):
        gg.override(relu_model, {"relu": "guided", "dense_99": gg.Scale(2.0)}, strict=True)


def test_guided_on_layers_without_relu_and_nested_model_hint(relu_model):
    with pytest.warns(gg.OverrideWarning, match="matched only layers without a ReLU form"):
        _, report = gg.override(relu_model, {"logits": "guided"}, return_report=True)
    assert report.overridden == []
    with pytest.warns(gg.OverrideWarning, match="inner is a nested model: rules act on layers; "
                                                "select its layers with 'inner/\\*'"):
        gg.override(relu_model, {"inner": gg.Scale(2.0)})


def test_unreachable_relus_are_reported():
    inputs = keras.Input((5, 3))
    x = keras.layers.SimpleRNN(4, activation="relu", name="rnn")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2, activation="relu", name="head")(x))
    with pytest.warns(gg.OverrideWarning, match="layer rnn: SimpleRNN applies relu inside its own "
                                                "computation"):
        _, report = gg.override(model, {"relu": "guided"}, return_report=True)
    assert [e.path for e in report.overridden] == ["head"]
    assert [e.action for e in report.layers if e.path == "rnn"] == ["skipped"]
    assert len(report.warnings) == 1
    with pytest.raises(gg.RuleMatchError, match="SimpleRNN applies relu"):
        gg.override(model, {"relu": "guided"}, strict=True)


def test_relu_operation_in_functional_graph_is_reported():
    inputs = keras.Input((3,))
    x = keras.ops.relu(keras.layers.Dense(4, name="dense")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(x), name="with_op")
    with pytest.raises(gg.RuleMatchError,
                       match=r"operation 'relu' in model 'with_op' is keras.ops.relu \(or "
                             r"relu6/leaky_relu\) called directly in a functional graph, which is "
                             r"not a layer: override cannot reach it; build the model with "
                             r"keras.layers.ReLU\(\)"):
        gg.override(model, {"relu": "guided"}, strict=True)


def test_subclassed_model_rejected():
    class Custom(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2, activation="relu")

        def call(self, x):
            return self.dense(x)

    model = Custom()
    model(np.ones((1, 3), np.float32))
    with pytest.raises(UnsupportedLayerError, match="is a subclassed model"):
        gg.override(model, {"relu": "guided"})
