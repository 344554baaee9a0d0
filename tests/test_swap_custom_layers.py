"""Weight layers inside custom layers of Sequential/Functional models (the usual tf.keras
transformer block: MultiHeadAttention, a Dense feed-forward, normalisation, dropout): swapped on
a copy of the custom layer, 100% of the weight MACs on the kernel with only the attention-score
products apart; outputs and every weight's gradient equal to the stock model's with the exact
kernel; the swaps saved and restored on reload; what graphswap cannot enter is kept, named and
counted."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import assert_close_to_roundoff, assert_key_bias_gradients_vanish, is_key_bias
from graphswap.errors import UnsupportedLayerError
from graphswap.swap import SwappedDense, SwappedMultiHeadAttention, rewrite_model

STEPS, FEATURES, DIM, HEADS, FF = 6, 5, 8, 2, 16


@keras.saving.register_keras_serializable(package="graphswap_tests")
class TransformerBlock(keras.layers.Layer):
    """A transformer encoder block as tf.keras tutorials write it."""

    def __init__(self, dim=DIM, heads=HEADS, ff=FF, **kwargs):
        super().__init__(**kwargs)
        self.dim, self.heads, self.ff = dim, heads, ff
        self.attention = keras.layers.MultiHeadAttention(heads, dim // heads, name="attention")
        self.feed_forward = [keras.layers.Dense(ff, activation="relu", name="ff1"),
                             keras.layers.Dense(dim, name="ff2")]
        self.norm1 = keras.layers.LayerNormalization()
        self.norm2 = keras.layers.LayerNormalization()
        self.dropout = keras.layers.Dropout(0.1)

    def call(self, x, training=None):
        x = self.norm1(x + self.dropout(self.attention(x, x), training=training))
        return self.norm2(x + self.feed_forward[1](self.feed_forward[0](x)))

    def get_config(self):
        return {**super().get_config(), "dim": self.dim, "heads": self.heads, "ff": self.ff}


@keras.saving.register_keras_serializable(package="graphswap_tests")
class TupleBlock(keras.layers.Layer):
    """Holds its Dense layers in a tuple, which graphswap cannot change in place."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.pair = (keras.layers.Dense(4, name="inner_a"), keras.layers.Dense(DIM, name="inner_b"))

    def call(self, x):
        return self.pair[1](self.pair[0](x))


@keras.saving.register_keras_serializable(package="graphswap_tests")
class OwnWeights(keras.layers.Layer):
    """Computes with a weight of its own (no layer inside)."""

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], 3), name="w")

    def call(self, x):
        return tf.matmul(x, self.w)


def transformer_model(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((STEPS, FEATURES))
    x = keras.layers.Conv1D(DIM, 3, padding="same", name="conv")(inputs)
    x = TransformerBlock(name="block")(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(x))


def _inputs(seed=0, batch=4):
    return np.random.default_rng(seed).normal(size=(batch, STEPS, FEATURES)).astype(np.float32)


def _gradients(model, x):
    with tf.GradientTape() as tape:
        y = model(x, training=False)
        loss = tf.reduce_sum(y * y)
    return y, tape.gradient(loss, model.trainable_weights)


def test_transformer_block_is_swapped_and_equals_stock():
    model = transformer_model()
    swapped, report = rewrite_model(model, return_report=True)
    block = swapped.get_layer("block")
    assert isinstance(block, TransformerBlock)
    assert type(block.attention) is SwappedMultiHeadAttention
    assert all(type(d) is SwappedDense for d in block.feed_forward)
    assert type(model.get_layer("block").feed_forward[0]) is keras.layers.Dense   # untouched
    x = _inputs()
    y_stock, g_stock = _gradients(model, x)
    y_swapped, g_swapped = _gradients(swapped, x)
    terms = 3 * FEATURES + DIM + FF + DIM * STEPS
    assert_close_to_roundoff(y_swapped, y_stock, terms)
    assert [w.shape for w in swapped.trainable_weights] == \
        [w.shape for w in model.trainable_weights]
    by_path = {w.path: g for w, g in zip(model.trainable_weights, g_stock)}
    for weight, got, want in zip(model.trainable_weights, g_swapped, g_stock):
        assert got is not None, weight.path
        if is_key_bias(weight.path):   # zero analytically: two round-off noises
            assert_key_bias_gradients_vanish(weight.path, [got, want], by_path, terms * 4 * STEPS)
            continue
        assert_close_to_roundoff(got, want, terms * 4 * STEPS,
                                 magnitude=np.abs(np.asarray(want)).max())


def test_report_puts_every_weight_mac_of_the_block_on_the_kernel():
    _, report = rewrite_model(transformer_model(), return_report=True)
    by_path = {e.path: e for e in report.layers}
    conv = STEPS * 3 * FEATURES * DIM
    projections = 4 * STEPS * DIM * DIM              # query, key, value, output
    feed_forward = STEPS * DIM * FF + STEPS * FF * DIM
    scores = STEPS * STEPS * HEADS * 2 * (DIM // HEADS)
    assert by_path["block/attention"].macs == projections
    assert by_path["block/attention"].float_macs == scores
    assert by_path["block/attention"].action == "swapped"
    assert by_path["block/ff1"].macs == STEPS * DIM * FF
    assert "2 layer(s) inside swapped" not in by_path["block"].reason
    assert "3 layer(s) inside swapped" in by_path["block"].reason
    assert report.total_macs == report.kernel_macs == conv + projections + feed_forward + 3 * DIM
    assert report.attention_macs == scores
    assert report.summary_line().startswith("100.0% of")


@pytest.mark.parametrize("kernel", ["exact", "mul8u_drum4"])
def test_swapped_block_saves_and_reloads(tmp_path, kernel):
    model = transformer_model(1)
    x = _inputs(1, batch=16)
    options = {"calibration_data": x} if kernel != "exact" else {}
    swapped = rewrite_model(model, kernel, **options)
    path = tmp_path / "block.keras"
    swapped.save(path)
    reloaded = keras.models.load_model(path)
    block = reloaded.get_layer("block")
    assert isinstance(block, TransformerBlock)
    assert type(block.attention) is SwappedMultiHeadAttention
    assert [d.arithmetic.spec for d in block.feed_forward] == [kernel, kernel]
    np.testing.assert_array_equal(np.asarray(reloaded(x)), np.asarray(swapped(x)))
    if kernel != "exact":
        assert np.abs(np.asarray(swapped(x)) - np.asarray(model(x))).max() > 1e-4
        ranges = [d.current_quantization().activation_range for d in block.feed_forward]
        assert ranges == [d.current_quantization().activation_range
                          for d in swapped.get_layer("block").feed_forward]
        assert None not in ranges


def test_kernel_map_and_excludes_reach_layers_inside_the_block():
    model = transformer_model()
    swapped, report = rewrite_model(model, kernel=None,
                                    kernel_map={"block/ff2": "mul8u_drum4"},
                                    return_report=True)
    block = swapped.get_layer("block")
    assert type(block.feed_forward[1]) is SwappedDense
    assert block.feed_forward[1].arithmetic.spec == "mul8u_drum4"
    assert type(block.feed_forward[0]) is keras.layers.Dense
    assert [e.path for e in report.swapped] == ["block/ff2"]
    _, excluded = rewrite_model(model, exclude="block/", return_report=True)
    assert [e.path for e in excluded.swapped] == ["conv", "head"]
    assert excluded.total_macs > excluded.kernel_macs > 0


def test_sequential_model_with_a_custom_layer():
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((STEPS, DIM)), TransformerBlock(name="block"),
                              keras.layers.Flatten(), keras.layers.Dense(2)])
    swapped = rewrite_model(model)
    assert type(swapped.get_layer("block").attention) is SwappedMultiHeadAttention
    x = np.random.default_rng(3).normal(size=(3, STEPS, DIM)).astype(np.float32)
    assert_close_to_roundoff(swapped(x), model(x), DIM * STEPS + FF)


def test_a_block_graphswap_cannot_enter_is_kept_named_and_counted():
    keras.utils.set_random_seed(3)
    inputs = keras.Input((STEPS, DIM))
    x = TupleBlock(name="tuple_block")(inputs)
    x = OwnWeights(name="own")(x)
    model = keras.Model(inputs, x)
    swapped, report = rewrite_model(model, return_report=True)
    by_path = {e.path: e for e in report.layers}
    inner = [by_path["tuple_block/inner_a"], by_path["tuple_block/inner_b"]]
    assert [e.macs for e in inner] == [STEPS * DIM * 4, STEPS * 4 * DIM]
    assert all(e.action == "kept" and "held in a tuple" in e.reason for e in inner)
    assert "not entered" in by_path["tuple_block"].reason
    assert "24 weight value(s) of its own" in by_path["own"].reason
    assert report.kernel_macs == 0 and report.total_macs == 2 * STEPS * DIM * 4
    x = np.random.default_rng(4).normal(size=(2, STEPS, DIM)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(swapped(x)), np.asarray(model(x)))


def test_tuple_refusal_is_an_unsupported_layer_error():
    """The reason recorded above is graphswap's own error for a tuple-held layer."""
    from graphswap.swap.subclassed import put

    block = TupleBlock()
    block(np.zeros((1, DIM), np.float32))
    with pytest.raises(UnsupportedLayerError, match=r"held in a tuple \(pair\[0\]\)"):
        put(block, [["attr", "pair"], ["item", 0]], keras.layers.Dense(4))


def test_lowered_onnx_export_of_the_block_holds_the_stock_layers(tmp_path):
    import onnxruntime as ort

    from graphswap.io import lower_model
    from graphswap.io.export import export_model

    model = transformer_model(4)
    swapped = rewrite_model(model, "mul8u_drum4")
    lowered, records = lower_model(swapped)
    block = lowered.get_layer("block")
    assert type(block) is TransformerBlock
    assert type(block.attention) is keras.layers.MultiHeadAttention
    assert [r.path for r in records] == ["conv", "block/attention", "block/ff1", "block/ff2",
                                         "head"]
    x = _inputs(5)
    np.testing.assert_array_equal(np.asarray(lowered(x)), np.asarray(model(x)))
    result = export_model(swapped, tmp_path / "block.onnx", "onnx")
    session = ort.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
    (onnx_out,) = session.run(None, {session.get_inputs()[0].name: x})
    assert_close_to_roundoff(onnx_out, model(x), 3 * FEATURES + DIM + FF + DIM * STEPS)
    # kept-kernel: the block's layers as custom nodes
    # (test_export_kept_recurrent.py::test_transformer_block_layers_run_the_kernel)
    kept = export_model(swapped, tmp_path / "kept.onnx", "onnx", keep_kernels=True)
    assert [r.path for r in kept.layers] == [r.path for r in records]
    assert all(r.onnx_nodes for r in kept.layers)


def test_a_run_fingerprint_tells_apart_the_kernels_inside_a_block():
    """Resuming a fine-tune checks the model's kernels: those of layers inside a custom layer
    are not in the model's config, and the fingerprint used to walk only the top-level layers,
    so a checkpoint of block/ff2 on mul8u_drum4 resumed on fp32_m3 without a word."""
    from graphswap.research.training.fingerprints import differences, model_fingerprint
    model = transformer_model()
    on_drum = rewrite_model(model, kernel=None, kernel_map={"block/ff2": "mul8u_drum4"})
    on_fp = rewrite_model(model, kernel=None, kernel_map={"block/ff2": "fp32_m3"})
    saved, current = model_fingerprint(on_drum), model_fingerprint(on_fp)
    assert saved["kernels"] == ["mul8u_drum4"] and current["kernels"] == ["fp32_m3"]
    rest = {"training data": None, "validation data": None, "settings": {}}
    assert any("the kernels differ (checkpointed: mul8u_drum4; now: fp32_m3)" in line
               for line in differences({"model": saved, **rest}, {"model": current, **rest}))
    assert model_fingerprint(on_drum) == saved
