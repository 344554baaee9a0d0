"""Backward-only surgery functions and layers: forward unchanged, gradient as defined."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import keras

from conftest import assert_close_to_roundoff
from graphswap import gradients as gg
from graphswap.errors import GraphswapError


def _grad(fn, x, upstream, compiled=False):
    """(forward, d<upstream, fn(x)>/dx), eagerly or inside a tf.function."""

    def run(x, upstream):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
            total = tf.reduce_sum(y * upstream)
        return y, tape.gradient(total, x)

    if compiled:
        run = tf.function(run)
    y, g = run(tf.convert_to_tensor(x), tf.convert_to_tensor(upstream))
    return y.numpy(), g.numpy()


def _random(seed, shape=(3, 5, 4), dtype=np.float32, spread=2.0):
    rng = np.random.default_rng(seed)
    return (rng.normal(0, spread, size=shape).astype(dtype),
            rng.normal(0, spread, size=shape).astype(dtype))


# expected gradient as a function of (x, dy), per function
def _clip_norm_expected(dy, norm):
    length = np.sqrt(np.sum(dy.astype(np.float64) ** 2))
    return dy * min(1.0, norm / length)


CASES = {
    "scale": (lambda x: gg.scale(x, 5.0), lambda x, dy: dy * 5.0),
    "scale_negative": (lambda x: gg.scale(x, -0.25), lambda x, dy: dy * -0.25),
    "reverse": (lambda x: gg.reverse(x), lambda x, dy: -dy),
    "reverse_0.3": (lambda x: gg.reverse(x, 0.3), lambda x, dy: -0.3 * dy),
    "clip_by_value": (lambda x: gg.clip_by_value(x, -0.1, 0.1),
                      lambda x, dy: np.clip(dy, -0.1, 0.1)),
    "clip_by_norm": (lambda x: gg.clip_by_norm(x, 1.0), lambda x, dy: _clip_norm_expected(dy, 1.0)),
    "clip_by_norm_large": (lambda x: gg.clip_by_norm(x, 1e6), lambda x, dy: dy),
}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_identity_forward_and_defined_gradient(name, seed, compiled):
    fn, expected = CASES[name]
    x, dy = _random(seed)
    y, g = _grad(fn, x, dy, compiled)
    np.testing.assert_array_equal(y, x)  # forward exactly unchanged
    np.testing.assert_allclose(g, expected(x, dy), rtol=1e-6, atol=1e-7)
    assert g.shape == x.shape and g.dtype == x.dtype


def test_clip_by_norm_actually_clips_and_per_sample_axes():
    x, dy = _random(3)
    _, g = _grad(lambda v: gg.clip_by_norm(v, 1.0), x, dy)
    assert np.linalg.norm(dy) > 5
    np.testing.assert_allclose(np.linalg.norm(g), 1.0, rtol=1e-6)
    _, g = _grad(lambda v: gg.clip_by_norm(v, 1.0, axes=[1, 2]), x, dy)
    for sample, upstream in zip(g, dy):
        np.testing.assert_allclose(sample, upstream / np.linalg.norm(upstream), rtol=1e-5)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float64])
@pytest.mark.parametrize("fn", [lambda x: gg.scale(x, 2.0), lambda x: gg.reverse(x),
                                lambda x: gg.clip_by_value(x, -1.0, 1.0),
                                lambda x: gg.clip_by_norm(x, 1.0), gg.guided_relu],
                         ids=["scale", "reverse", "clip_value", "clip_norm", "guided"])
def test_dtypes_and_shapes_preserved(fn, dtype):
    x = tf.cast(tf.constant([[0.5, -1.5, 3.0]]), dtype)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    g = tape.gradient(y, x, output_gradients=tf.cast(tf.constant([[4.0, 4.0, -4.0]]), dtype))
    assert y.dtype == dtype and g.dtype == dtype
    assert y.shape == x.shape and g.shape == x.shape


def test_unknown_static_shape_in_tf_function():
    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = gg.scale(x, 3.0)
            total = tf.reduce_sum(y)
        assert y.shape.as_list() == [None, None]
        return tape.gradient(total, x)

    np.testing.assert_array_equal(run(tf.ones((2, 3))).numpy(), np.full((2, 3), 3.0))


def test_integer_input_and_bad_arguments_rejected():
    with pytest.raises(GraphswapError, match="floating-point tensors, got dtype int32"):
        gg.scale(tf.constant([1, 2]), 2.0)
    with pytest.raises(GraphswapError, match=r"clip_value_min \(1.0\) is greater than "
                                             r"clip_value_max \(-1.0\)"):
        gg.clip_by_value(tf.ones(2), 1.0, -1.0)
    with pytest.raises(GraphswapError, match="clip_norm must be > 0, got 0"):
        gg.clip_by_norm(tf.ones(2), 0)
    with pytest.raises(GraphswapError, match="factor must be a number or a scalar tensor"):
        gg.scale(tf.ones(2), "big")


# ----------------------------------------------------------------------------------------------
# the classic: d sum(x @ y), with the gradients of x and y clipped by norm
# ----------------------------------------------------------------------------------------------

def test_classic_matmul_gradient_clip_by_norm():
    x = tf.Variable([[1.0, 2.0], [3.0, 4.0]])
    y = tf.Variable([[1.0, 2.0], [3.0, 4.0]])
    with tf.GradientTape() as tape:
        z = tf.reduce_sum(x @ y)
    gx, gy = tape.gradient(z, [x, y])
    # d sum(x @ y) / dx = ones @ y^T: row i, column k holds sum_j y[k, j] -> [[3, 7], [3, 7]]
    np.testing.assert_array_equal(gx.numpy(), [[3.0, 7.0], [3.0, 7.0]])
    # d sum(x @ y) / dy = x^T @ ones: row k, column j holds sum_i x[i, k] -> [[4, 4], [6, 6]]
    np.testing.assert_array_equal(gy.numpy(), [[4.0, 4.0], [6.0, 6.0]])

    with tf.GradientTape() as tape:
        z = tf.reduce_sum(gg.clip_by_norm(x, 1.0) @ gg.clip_by_norm(y, 0.5))
    gx, gy = tape.gradient(z, [x, y])
    # Forward is unchanged, so the gradients arriving at the clip points are the ones above.
    # ||[[3, 7], [3, 7]]|| = sqrt(9 + 49 + 9 + 49) = sqrt(116) = 10.770 > 1.0:
    #   x's gradient becomes [[3, 7], [3, 7]] / sqrt(116) = [[0.27854, 0.64993], [...]]
    # ||[[4, 4], [6, 6]]|| = sqrt(16 + 16 + 36 + 36) = sqrt(104) = 10.198 > 0.5:
    #   y's gradient becomes [[4, 4], [6, 6]] * 0.5 / sqrt(104) = [[0.19612, ...], [0.29417, ...]]
    np.testing.assert_allclose(gx.numpy(), [[0.27854301, 0.64993368], [0.27854301, 0.64993368]],
                               rtol=1e-6)
    np.testing.assert_allclose(gy.numpy(), [[0.19611614, 0.19611614], [0.29417420, 0.29417420]],
                               rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(gx.numpy()), 1.0, rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(gy.numpy()), 0.5, rtol=1e-6)


def test_classic_same_variable_used_twice_sums_the_clipped_parts():
    x = tf.Variable([[1.0, 2.0], [3.0, 4.0]])
    with tf.GradientTape() as tape:
        z = tf.reduce_sum(gg.clip_by_norm(x, 1.0) @ gg.clip_by_norm(x, 0.5))
    # the two uses get [[3,7],[3,7]]/sqrt(116) and [[4,4],[6,6]]*0.5/sqrt(104); x gets their sum
    expected = (np.array([[3.0, 7.0], [3.0, 7.0]]) / np.sqrt(116)
                + np.array([[4.0, 4.0], [6.0, 6.0]]) * 0.5 / np.sqrt(104))
    np.testing.assert_allclose(tape.gradient(z, x).numpy(), expected, rtol=1e-6)


# ----------------------------------------------------------------------------------------------
# guided ReLU
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
def test_guided_relu_definition(compiled):
    x, dy = _random(5, shape=(4, 6, 3))
    y, g = _grad(gg.guided_relu, x, dy, compiled)
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    np.testing.assert_array_equal(g, (dy > 0) * (x > 0) * dy)
    assert 0 < np.count_nonzero(g) < np.count_nonzero((x > 0) * dy)  # both gates did something


def test_guided_relu_with_options_gates_on_the_identity_region():
    x = np.array([-2.0, -0.5, 0.05, 0.1, 0.3, 1.0, 2.5, 3.0, 4.0], np.float32)
    dy = np.array([1.0, 1.0, 1.0, 1.0, 1.0, -1.0, 2.0, 1.0, 1.0], np.float32)
    fn = lambda v: gg.guided_relu(v, max_value=3.0, negative_slope=0.1, threshold=0.1)  # noqa
    y, g = _grad(fn, x, dy)
    layer = keras.layers.ReLU(max_value=3.0, negative_slope=0.1, threshold=0.1)
    np.testing.assert_array_equal(y, layer(x).numpy())
    # passes only where 0.1 < x < 3.0 and dy > 0
    np.testing.assert_array_equal(g, [0, 0, 0, 0, 1.0, 0, 2.0, 0, 0])


# ----------------------------------------------------------------------------------------------
# straight_through
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
def test_straight_through_runs_f_once_and_uses_b_gradient(compiled):
    calls = {"f": 0, "b": 0}

    def f(v):
        calls["f"] += 1
        return tf.round(v * 4.0) / 4.0  # quantize: no usable gradient of its own

    def b(v):
        calls["b"] += 1
        return tf.sin(v)

    x, dy = _random(7)
    y, g = _grad(gg.straight_through(f, b), x, dy, compiled)
    np.testing.assert_array_equal(y, np.round(x * 4.0) / 4.0)
    np.testing.assert_allclose(g, dy * np.cos(x), rtol=1e-5, atol=1e-6)
    assert calls["f"] == 1  # one forward evaluation (or one trace): never f and b both forward
    assert calls["b"] == 1  # b only inside the gradient


def test_straight_through_default_is_identity_gradient():
    x, dy = _random(8)
    y, g = _grad(gg.straight_through(tf.sign), x, dy)
    np.testing.assert_array_equal(y, np.sign(x))
    np.testing.assert_array_equal(g, dy)


def test_straight_through_several_inputs_and_variables():
    rng = np.random.default_rng(9)
    x = tf.constant(rng.normal(size=(3, 4)).astype(np.float32))
    w = tf.Variable(rng.normal(size=(4, 2)).astype(np.float32))
    approx = lambda a, k: tf.round(a @ k)  # noqa: E731
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = gg.straight_through(approx, tf.matmul)(x, w)
        total = tf.reduce_sum(y * 2.0)
    np.testing.assert_array_equal(y.numpy(), np.round(x.numpy() @ w.numpy()))
    gx, gw = tape.gradient(total, [x, w])
    two = np.full((3, 2), 2.0)
    assert_close_to_roundoff(gx.numpy(), two @ w.numpy().T, terms=2,
                             magnitude=two @ np.abs(w.numpy()).T)
    assert_close_to_roundoff(gw.numpy(), x.numpy().T @ two, terms=3,
                             magnitude=np.abs(x.numpy()).T @ two)

    # f reading a variable (a layer): the variable's gradient comes from b as well
    dense = keras.layers.Dense(2, use_bias=False)
    dense.build((None, 4))
    with tf.GradientTape() as tape:
        out = gg.straight_through(lambda a: tf.round(dense(a)), lambda a: dense(a))(x)
        total = tf.reduce_sum(out)
    (g_kernel,) = tape.gradient(total, [dense.kernel])
    assert_close_to_roundoff(g_kernel.numpy(), x.numpy().T @ np.ones((3, 2)), terms=3,
                             magnitude=np.abs(x.numpy()).T @ np.ones((3, 2)))


def test_straight_through_errors():
    x = tf.ones((2, 3))
    with pytest.raises(gg.CustomGradientError, match="output shape .* must equal the input shape"):
        gg.straight_through(lambda v: tf.reduce_sum(v, axis=0))(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = gg.straight_through(lambda v: v * 2.0, tf.round)(x)
    with pytest.raises(gg.CustomGradientError, match="b \\(round\\) has no gradient"):
        tape.gradient(y, x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = gg.straight_through(lambda v: v * 2.0, lambda v: tf.reduce_sum(v))(x)
    with pytest.raises(gg.CustomGradientError, match=r"b's output shape \(\) differs from f's"):
        tape.gradient(y, x)
    with pytest.raises(GraphswapError, match="f must be callable"):
        gg.straight_through(3)


# ----------------------------------------------------------------------------------------------
# with_gradient
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
def test_with_gradient_numpy_function(compiled):
    calls = {"forward": 0}

    def np_cube(a):
        calls["forward"] += 1
        assert isinstance(a, np.ndarray)
        return a ** 3

    def np_cube_grad(dy, a):
        return dy * 3.0 * a ** 2

    x, dy = _random(11)
    y, g = _grad(gg.with_gradient(np_cube, np_cube_grad), x, dy, compiled)
    np.testing.assert_allclose(y, x ** 3, rtol=1e-6)
    np.testing.assert_allclose(g, dy * 3.0 * x ** 2, rtol=1e-6)
    assert calls["forward"] == 1


def test_with_gradient_static_shape_and_output_shape():
    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def run(x):
        y = gg.with_gradient(lambda a: a * 2.0, lambda dy, a: dy * 2.0)(x)
        pooled = gg.with_gradient(lambda a: a.sum(axis=1), lambda dy, a: np.repeat(
            dy[:, None], a.shape[1], axis=1), output_shape=(None,))(x)
        assert y.shape.as_list() == [None, 4]
        assert pooled.shape.as_list() == [None]
        return y, pooled

    y, pooled = run(tf.ones((3, 4)))
    np.testing.assert_array_equal(pooled.numpy(), [4.0, 4.0, 4.0])

    two = gg.with_gradient(lambda a, b: a * b, lambda dy, a, b: (dy * b, dy * a))
    a, b = tf.constant([1.0, 2.0]), tf.constant([3.0, 5.0])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([a, b])
        out = two(a, b)
    np.testing.assert_array_equal(tape.gradient(out, a).numpy(), [3.0, 5.0])
    np.testing.assert_array_equal(tape.gradient(out, b).numpy(), [1.0, 2.0])


def test_with_gradient_wrong_gradient_shape_is_a_clear_error():
    fn = gg.with_gradient(lambda a: a + 1.0, lambda dy, a: dy.sum(axis=0))
    x = tf.ones((2, 2))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    with pytest.raises(gg.CustomGradientError,
                       match=r"returned a gradient of shape \(2,\) for input 0, whose shape is "
                             r"\(2, 2\); a gradient must have its input's shape"):
        tape.gradient(y, x)

    @tf.function
    def compiled(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
        return tape.gradient(y, x)

    # inside a graph TensorFlow re-raises it as InvalidArgumentError, same message
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"CustomGradientError: with_gradient: <lambda> returned a gradient "
                             r"of shape \(2,\) for input 0"):
        compiled(x)


def test_with_gradient_wrong_forward_shape_and_count():
    with pytest.raises(gg.CustomGradientError,
                       match=r"returned shape \(4,\), expected \(2, 2\); pass output_shape="):
        gg.with_gradient(lambda a: a.ravel(), lambda dy, a: dy)(tf.ones((2, 2)))
    two = gg.with_gradient(lambda a, b: a + b, lambda dy, a, b: dy)
    a = tf.ones(2)
    with tf.GradientTape() as tape:
        tape.watch(a)
        y = two(a, a)
    with pytest.raises(gg.CustomGradientError, match=r"must return one gradient per input \(2\)"):
        tape.gradient(y, a)


# ----------------------------------------------------------------------------------------------
# usable on swapped layers' outputs
# ----------------------------------------------------------------------------------------------

def test_functions_on_swapped_layer_outputs():
    from graphswap.swap import SwappedDense

    rng = np.random.default_rng(12)
    x = tf.constant(rng.normal(size=(4, 6)).astype(np.float32))
    layer = SwappedDense(3, swap_kernel="exact")
    layer.build((None, 6))
    reference = keras.layers.Dense(3)
    reference.build((None, 6))
    reference.set_weights(layer.get_weights())
    for fn, factor in ((lambda v: gg.scale(v, 0.5), 0.5), (lambda v: gg.reverse(v, 2.0), -2.0)):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            swapped = fn(layer(x))
            plain = reference(x)
        kernel = np.abs(layer.kernel.numpy())
        assert_close_to_roundoff(swapped.numpy(), plain.numpy(), terms=6,
                                 magnitude=np.abs(x.numpy()) @ kernel)
        assert_close_to_roundoff(tape.gradient(swapped, layer.kernel).numpy(),
                                 factor * tape.gradient(plain, reference.kernel).numpy(), terms=4,
                                 magnitude=abs(factor) * np.abs(x.numpy()).T @ np.ones((4, 3)))
        assert_close_to_roundoff(tape.gradient(swapped, x).numpy(),
                                 factor * tape.gradient(plain, x).numpy(), terms=3,
                                 magnitude=abs(factor) * np.ones((4, 3)) @ kernel.T)


# ----------------------------------------------------------------------------------------------
# layers: in model.fit, serialization
# ----------------------------------------------------------------------------------------------

def _fit_delta(middle_layer, seed=3):
    """Change of the first Dense's kernel after one SGD step of model.fit."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(4, name="first")(inputs)
    if middle_layer is not None:
        hidden = middle_layer(hidden)
    outputs = keras.layers.Dense(1, name="second")(hidden)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 5)).astype(np.float32), rng.normal(size=(16, 1)).astype(np.float32)
    before = model.get_layer("first").kernel.numpy().copy()
    second_before = model.get_layer("second").kernel.numpy().copy()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    return (model.get_layer("first").kernel.numpy() - before,
            model.get_layer("second").kernel.numpy() - second_before)


def test_layers_in_model_fit():
    plain, plain_second = _fit_delta(None)
    assert np.abs(plain).max() > 1e-4
    for layer, factor in ((gg.GradientScale(2.0), 2.0), (gg.GradientReversal(1.0), -1.0),
                          (gg.GradientScale(0.0), 0.0)):
        delta, second = _fit_delta(layer)
        np.testing.assert_allclose(delta, factor * plain, rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(second, plain_second, rtol=1e-5, atol=1e-7)  # after: untouched
    clipped, _ = _fit_delta(gg.GradientClip(min_value=-1e-3, max_value=1e-3))
    assert np.abs(clipped).max() < np.abs(plain).max()
    assert not np.allclose(clipped, plain)


def test_gradient_clip_layer_value_then_norm():
    layer = gg.GradientClip(min_value=-1.0, max_value=1.0, norm=1.0)
    x = tf.zeros((1, 4))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x)
    g = tape.gradient(y, x, output_gradients=tf.constant([[3.0, -3.0, 0.5, 0.0]]))
    # value clip first: [1, -1, 0.5, 0]; its norm 1.5 -> scaled to norm 1
    np.testing.assert_allclose(g.numpy(), [[1.0, -1.0, 0.5, 0.0]] / np.float32(1.5), rtol=1e-6)
    with pytest.raises(GraphswapError, match="GradientClip needs min_value and max_value, or norm"):
        gg.GradientClip()
    with pytest.raises(GraphswapError, match="give both min_value and max_value"):
        gg.GradientClip(min_value=-1.0)


def test_layers_save_and_load(tmp_path):
    inputs = keras.Input((6,))
    h = keras.layers.Dense(5)(inputs)
    h = gg.GradientScale(0.5, name="gs")(h)
    h = gg.GradientClip(min_value=-0.2, max_value=0.2, norm=3.0, axes=[1], name="gc")(h)
    h = gg.GradientReversal(0.7, name="gr")(h)
    h = gg.GuidedReLU(max_value=4.0, negative_slope=0.1, threshold=0.2, name="guided")(h)
    model = keras.Model(inputs, keras.layers.Dense(2)(h))
    path = tmp_path / "layers.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    for name in ("gs", "gc", "gr", "guided"):
        assert loaded.get_layer(name).get_config() == model.get_layer(name).get_config()
        assert type(loaded.get_layer(name)) is type(model.get_layer(name))
    x = tf.constant(np.random.default_rng(1).normal(size=(3, 6)).astype(np.float32))
    for m in (model, loaded):
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = m(x)
        m.grad = tape.gradient(out, x).numpy()
        m.out = out.numpy()
    np.testing.assert_array_equal(loaded.out, model.out)
    np.testing.assert_array_equal(loaded.grad, model.grad)


def test_rule_trio():
    assert gg.get_rule("guided") == gg.Guided()
    assert gg.get_rule("Reverse") == gg.Reverse(1.0)
    assert gg.get_rule({"rule": "scale", "factor": 0.5}) == gg.Scale(0.5)
    for rule in (gg.Scale(0.5), gg.ClipByNorm(1.0, axes=[1]), gg.ClipByValue(-1, 1),
                 gg.Reverse(0.2), gg.Guided()):
        assert gg.deserialize_rule(gg.serialize_rule(rule)) == rule
    with pytest.raises(gg.UnknownRuleError, match=r"unknown gradient rule 'guidd'; allowed: the "
                                                  r"names 'guided', 'reverse'"):
        gg.get_rule("guidd")
    with pytest.raises(gg.UnknownRuleError, match=r"'scale' needs arguments: use gg.Scale"):
        gg.get_rule("scale")
    with pytest.raises(gg.UnknownRuleError, match="unknown gradient rule 'spin' in config"):
        gg.get_rule({"rule": "spin"})
    with pytest.raises(gg.UnknownRuleError, match="bad arguments for gradient rule 'scale'"):
        gg.get_rule({"rule": "scale", "factr": 2})
