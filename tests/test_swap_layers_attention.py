"""SwappedEinsumDense and SwappedMultiHeadAttention against the stock Keras layers: forward (exact
kernel), every weight's gradient in both backward modes, for the equations EinsumDense's
documentation and MultiHeadAttention use; LUT versions bit-exact against the numpy reference of
the quantized matmul; unsupported equations refused naming the layer and the equation."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import reference
from conftest import assert_close_to_roundoff, assert_key_bias_gradients_vanish, is_key_bias
from graphswap import SwappedEinsumDense, SwappedMultiHeadAttention
from graphswap.errors import UnsupportedLayerError
from graphswap.kernels import resolve_multiplier
from test_swap_layers_conv import assert_matches_stock, make_pair

RNG = np.random.default_rng(5)

EQUATIONS = [
    # (equation, output_shape, bias_axes, input shape)
    ("ab,bc->ac", 4, "c", (3, 5)),                       # Dense
    ("abc,cd->abd", (7, 6), "d", (2, 7, 5)),             # a dense over a sequence
    ("abc,cde->abde", (7, 2, 3), "de", (1, 7, 5)),       # MultiHeadAttention q/k/v projection
    ("abcd,cde->abe", (7, 4), "e", (2, 7, 3, 5)),        # MultiHeadAttention output projection
    ("abcd,def->abcef", (3, 4, 2, 3), "ef", (2, 3, 4, 5)),  # projection of a rank-4 input
    ("...b,bc->...c", 6, "c", (2, 3, 4, 5)),             # ellipsis
    ("abc,dc->abd", (7, 3), None, (2, 7, 5)),            # a transposed kernel
    ("bca,cd->bda", (3, 4, 2), "d", (2, 5, 4)),          # the batch-free axis last
]


@pytest.mark.parametrize("backward", ["native", "kernel"])
@pytest.mark.parametrize("equation,output_shape,bias_axes,input_shape", EQUATIONS,
                         ids=[e[0] for e in EQUATIONS])
def test_einsum_dense_matches_keras(equation, output_shape, bias_axes, input_shape, backward):
    stock, swapped = make_pair(keras.layers.EinsumDense, SwappedEinsumDense, input_shape,
                               equation, output_shape, bias_axes=bias_axes, activation="tanh",
                               backward=backward)
    assert_matches_stock(stock, swapped, RNG.standard_normal(input_shape).astype(np.float32))


@pytest.mark.parametrize("name", ["mul8s_drum4", "mul8u_drum4"])
@pytest.mark.parametrize("equation,input_shape,matrices", [
    ("abc,cde->abde", (2, 7, 5), lambda x, w: (x.reshape(14, 5), w.reshape(5, 6))),
    ("abcd,cde->abe", (2, 7, 3, 5), lambda x, w: (x.reshape(14, 15), w.reshape(15, 4))),
    ("abc,cd->abd", (1, 3, 5), lambda x, w: (x.reshape(3, 5), w)),
])
def test_einsum_dense_lut_is_one_quantized_matmul(name, equation, input_shape, matrices):
    mult = resolve_multiplier(name)
    shapes = {"abc,cde->abde": (7, 2, 3), "abcd,cde->abe": (7, 4), "abc,cd->abd": (3, 4)}
    layer = SwappedEinsumDense(equation, shapes[equation], arithmetic=name)
    x = (RNG.standard_normal(input_shape) * 0.7).astype(np.float32)
    layer.build(x.shape)
    x2, w2 = matrices(x, layer.kernel.numpy())
    want = reference.quantized_matmul(x2, w2, mult.table, mult.signed)
    got = layer(x).numpy()
    np.testing.assert_array_equal(got.reshape(want.shape), want)


@pytest.mark.parametrize("backward", ["native", "kernel"])
@pytest.mark.parametrize("kwargs,query_shape,value_shape", [
    (dict(num_heads=2, key_dim=4), (2, 5, 8), None),
    (dict(num_heads=3, key_dim=2, value_dim=5, output_shape=6), (1, 4, 7), (1, 6, 3)),
    (dict(num_heads=2, key_dim=3, attention_axes=(1, 2)), (1, 3, 2, 4), None),
])
def test_multi_head_attention_matches_keras(kwargs, query_shape, value_shape, backward):
    value_shape = value_shape or query_shape
    query = tf.constant(RNG.standard_normal(query_shape).astype(np.float32))
    value = tf.constant(RNG.standard_normal(value_shape).astype(np.float32))
    stock = keras.layers.MultiHeadAttention(**kwargs)
    stock(query, value)
    swapped = SwappedMultiHeadAttention(**kwargs, backward=backward)
    swapped(query, value)
    projections = swapped.projections()
    assert {type(p).__name__ for p in projections.values()} == {"SwappedEinsumDense"}
    assert all(p.backward == backward for p in projections.values())
    assert [w.path for w in swapped.weights] == [w.path.replace(stock.name, swapped.name)
                                                 for w in stock.weights]
    swapped.set_weights(stock.get_weights())
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([query, value])
        y_ref, y = stock(query, value), swapped(query, value)
        dy = tf.constant(RNG.standard_normal(y.shape).astype(np.float32))
        loss_ref, loss = tf.reduce_sum(y_ref * dy), tf.reduce_sum(y * dy)
    g_ref = tape.gradient(loss_ref, [query, value, *stock.trainable_weights])
    g = tape.gradient(loss, [query, value, *swapped.trainable_weights])
    terms = int(np.prod(query_shape)) * 8
    assert_close_to_roundoff(y.numpy(), y_ref.numpy(), terms)
    assert len(g) == len(g_ref) == 2 + 8
    paths = ["query", "value"] + [w.path for w in stock.trainable_weights]
    by_path = dict(zip(paths, g_ref))
    for path, a, b in zip(paths, g, g_ref):
        if is_key_bias(path):
            assert_key_bias_gradients_vanish(path, [a, b], by_path, terms)
        else:
            assert_close_to_roundoff(a.numpy(), b.numpy(), terms)


def test_multi_head_attention_config_round_trip_and_lut():
    layer = SwappedMultiHeadAttention(2, 4, arithmetic="mul8s_drum4", name="att")
    x = RNG.standard_normal((2, 5, 8)).astype(np.float32)
    y = layer(x, x)
    config = layer.get_config()
    assert config["arithmetic"] == {"spec": "mul8s_drum4"}
    clone = SwappedMultiHeadAttention.from_config(config)
    clone(x, x)
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(clone(x, x).numpy(), y.numpy())
    assert all(p.arithmetic.spec == "mul8s_drum4" for p in clone.projections().values())


@pytest.mark.parametrize("equation,why", [
    ("abc,bcd->abd", "summed within one operand|is not supported"),
    ("abc,acd->abd", "in the input, the kernel and the output"),
    ("abc,cd->abde", "come from no operand"),
    ("ab,bc,cd->ad", "one kernel"),
    ("abc,cd...->abd", "one kernel|form"),
    ("aab,bc->ac", "repeats"),
    ("abc,cd->bad", "first axis"),
])
def test_unsupported_equations_are_refused_naming_layer_and_equation(equation, why):
    with pytest.raises(UnsupportedLayerError, match=rf"layer 'proj'.*{equation[:3]}.*"):
        try:
            SwappedEinsumDense(equation, 4, name="proj")
        except UnsupportedLayerError as exc:
            assert any(part in str(exc) for part in why.split("|")), str(exc)
            raise
