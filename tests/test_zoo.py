"""The model zoo end to end (keras.applications with weights=None: nothing is downloaded):
MobileNetV2, ResNet50, EfficientNetB0 and a small ViT-style model built from MultiHeadAttention,
at small input sizes.  Rewritten with the exact kernel they equal the original to float round-off,
their weight gradients match, every MAC of their weight layers runs on the kernel, they save and
reload, and they run with a LUT multiplier; MobileNetV2's kept-kernel ONNX with a LUT multiplier
equals the Keras model."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import graphswap
from conftest import assert_key_bias_gradients_vanish, is_key_bias, reduction_terms
from graphswap.swap import is_swapped, iter_layers

RNG = np.random.default_rng(17)


def vit(image=32, patch=8, dim=32, heads=4, depth=2, classes=10):
    """A small ViT: patch embedding (a strided Conv2D), position embedding, pre-norm transformer
    blocks (MultiHeadAttention + a GELU MLP of Dense layers), a classification head."""
    inputs = keras.Input((image, image, 3), name="image")
    x = keras.layers.Conv2D(dim, patch, strides=patch, name="patch_embed")(inputs)
    tokens = (image // patch) ** 2
    x = keras.layers.Reshape((tokens, dim))(x)
    x = keras.layers.Add()([x, keras.layers.Embedding(tokens, dim, name="pos_embed")(
        keras.ops.arange(tokens)[None])])
    for i in range(depth):
        h = keras.layers.LayerNormalization(name=f"ln{i}a")(x)
        h = keras.layers.MultiHeadAttention(heads, dim // heads, name=f"mha{i}")(h, h)
        x = keras.layers.Add()([x, h])
        h = keras.layers.LayerNormalization(name=f"ln{i}b")(x)
        h = keras.layers.Dense(2 * dim, activation="gelu", name=f"mlp{i}a")(h)
        x = keras.layers.Add()([x, keras.layers.Dense(dim, name=f"mlp{i}b")(h)])
    x = keras.layers.GlobalAveragePooling1D()(keras.layers.LayerNormalization()(x))
    return keras.Model(inputs, keras.layers.Dense(classes, name="head")(x), name="vit_tiny")


# logits, not softmax outputs: a randomly initialised model's softmax can be uniform to float32
# precision, which would hide any difference between arithmetics
ZOO = {
    "MobileNetV2": lambda: keras.applications.MobileNetV2(
        input_shape=(64, 64, 3), alpha=0.35, weights=None, classes=10,
        classifier_activation=None),
    "ResNet50": lambda: keras.applications.ResNet50(
        input_shape=(32, 32, 3), weights=None, classes=10, classifier_activation=None),
    "EfficientNetB0": lambda: keras.applications.EfficientNetB0(
        input_shape=(64, 64, 3), weights=None, classes=10, classifier_activation=None),
    "ViT": vit,
}


@pytest.fixture(scope="module", params=sorted(ZOO))
def zoo_model(request):
    keras.utils.set_random_seed(0)
    return request.param, ZOO[request.param]()


def relative_difference(actual, expected) -> float:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.max(np.abs(actual - expected)) / max(np.max(np.abs(expected)), 1e-30))


def test_zoo_exact_rewrite_equals_original_with_equal_gradients(zoo_model, tmp_path):
    name, model = zoo_model
    swapped, report = graphswap.rewrite_model(model, return_report=True)
    # every weight layer's MACs on the kernel (attention scores are activations x activations)
    assert report.kernel_macs == report.total_macs > 0, report.format_table()
    assert "100.0% of" in report.summary_line()
    kept = [(p, type(l).__name__) for p, l in iter_layers(swapped)
            if l.weights and not is_swapped(l) and not isinstance(
                l, (keras.layers.BatchNormalization, keras.layers.LayerNormalization,
                    keras.layers.Embedding, keras.layers.Normalization, keras.Model))]
    assert not kept, f"{name}: layers with weights left unswapped: {kept}"
    if name == "MobileNetV2":
        counts = report.by_type()
        assert counts["DepthwiseConv2D"]["swapped"] == 17 and counts["Conv2D"]["swapped"] == 35
    x = RNG.uniform(0, 1, (2, *model.input_shape[1:])).astype(np.float32)
    labels = np.array([1, 7])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=name == "ViT")

    def loss_and_gradients(m):
        # inference mode: batch norm with its moving statistics (per-batch statistics of 2
        # samples on 1x1 feature maps would amplify round-off, not test the rewrite)
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, m(x, training=False))
        return loss, tape.gradient(loss, m.trainable_weights)

    y_ref, y = model(x, training=False), swapped(x, training=False)
    # float32 round-off through tens of layers (batch norm, softmax): relative, not bit for bit
    assert relative_difference(y, y_ref) < 1e-4
    loss_ref, g_ref = loss_and_gradients(model)
    loss, g = loss_and_gradients(swapped)
    assert abs(float(loss) - float(loss_ref)) <= 1e-4 * max(abs(float(loss_ref)), 1.0)
    assert len(g) == len(g_ref)
    by_path = {weight.path: want for want, weight in zip(g_ref, model.trainable_weights)}
    for got, want, weight in zip(g, g_ref, model.trainable_weights):
        if is_key_bias(weight.path):   # zero up to round-off: both must vanish
            assert_key_bias_gradients_vanish(weight.path, [got, want], by_path,
                                             reduction_terms(model))
        else:
            assert relative_difference(got, want) < 2e-3, weight.path

    path = tmp_path / f"{name}.keras"
    swapped.save(path)
    reloaded = keras.models.load_model(path)
    np.testing.assert_array_equal(reloaded(x, training=False).numpy(),
                                  swapped(x, training=False).numpy())


def test_zoo_runs_with_a_lut_multiplier(zoo_model):
    name, model = zoo_model
    swapped, report = graphswap.rewrite_model(model, kernel="mul8s_drum4", return_report=True)
    assert {e.kernel for e in report.swapped} == {"mul8s_drum4"}
    x = RNG.uniform(0, 1, (1, *model.input_shape[1:])).astype(np.float32)
    y = swapped(x, training=False).numpy()
    assert y.shape == (1, 10) and np.all(np.isfinite(y))
    # the multiplier really runs: DRUM-4 is not the exact product
    assert not np.array_equal(y, model(x, training=False).numpy())


def test_mobilenet_kept_kernel_onnx_with_a_lut_equals_keras(tmp_path):
    from graphswap.io import export_onnx, onnx_ops

    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35, weights=None,
                                           classes=10)
    swapped = graphswap.rewrite_model(model, kernel="mul8s_drum4")
    result = export_onnx(swapped, tmp_path / "mnv2.onnx", keep_kernels=True, check_batch=2)
    types = {layer.layer_type for layer in result.layers}
    assert types == {"Conv2D", "DepthwiseConv2D", "Dense"}
    assert all(layer.onnx_nodes for layer in result.layers)
    session = onnx_ops.session(tmp_path / "mnv2.onnx")
    x = RNG.uniform(0, 1, (3, 32, 32, 3)).astype(np.float32)
    (got,) = session.run(None, {session.get_inputs()[0].name: x})
    np.testing.assert_allclose(got, swapped(x, training=False).numpy(), rtol=1e-5, atol=1e-6)


def test_calibrated_folded_mobilenet_is_static_everywhere_and_batch_independent():
    """MobileNetV2's Conv2D/DepthwiseConv2D + BatchNormalization pairs all fold, every swapped
    layer (Conv2D, DepthwiseConv2D, Dense) gets a static range, and its outputs are then bit for
    bit the same in any batch - the whole network as an int8 accelerator runs it."""
    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35, weights=None,
                                           classes=10, classifier_activation=None)
    x = RNG.uniform(0, 1, (24, 32, 32, 3)).astype(np.float32)
    swapped = graphswap.rewrite_model(model, kernel="mul8u_drum4", bias_correction=None,
                                      calibration_data=x[:16], calibration_source="float",
                                      weight_tuning=False, dynamic_fallback=False,
                                      fold_batchnorm=True)
    assert not any(isinstance(layer, keras.layers.BatchNormalization)
                   for _, layer in iter_layers(swapped))
    swapped_layers = [layer for _, layer in iter_layers(swapped) if is_swapped(layer)]
    assert {type(layer).__name__ for layer in swapped_layers} == {
        "SwappedConv2D", "SwappedDepthwiseConv2D", "SwappedDense"}
    assert all(layer.current_quantization().activations == "static" for layer in swapped_layers)
    whole = swapped(x, training=False).numpy()
    for size in (1, 5):
        parts = np.concatenate([swapped(x[i:i + size], training=False).numpy()
                                for i in range(0, len(x), size)])
        np.testing.assert_array_equal(parts, whole)


def test_calibrated_folded_xception_runs_both_separable_ranges_and_is_batch_independent():
    """Xception's SeparableConv2D + BatchNormalization pairs fold into the pointwise kernels
    (with the exact kernel the folded network equals the original), and with a multiplier every
    SeparableConv2D gets both static ranges - its input's and its depthwise result's - so the
    whole network's outputs are bit for bit the same in any batch."""
    keras.utils.set_random_seed(0)
    model = keras.applications.Xception(input_shape=(71, 71, 3), weights=None, classes=10,
                                        classifier_activation=None)
    x = RNG.uniform(0, 1, (16, 71, 71, 3)).astype(np.float32)
    exact = graphswap.rewrite_model(model, kernel="exact", fold_batchnorm=True)
    want = model(x[:4], training=False).numpy()
    np.testing.assert_allclose(exact(x[:4], training=False).numpy(), want,
                               atol=1e-4 * np.abs(want).max())
    # one calibration pass in float, no alternative conversions measured: the ranges are the
    # point here, not the recipe (tests/test_weight_tuning.py, test_zero_step_check_zoo.py)
    swapped, report = graphswap.rewrite_model(
        model, kernel="mul8u_drum4", bias_correction=None, calibration_data=x,
        calibration_source="float", weight_tuning=False, dynamic_fallback=False,
        fold_batchnorm=True, return_report=True)
    assert not any(isinstance(layer, keras.layers.BatchNormalization)
                   for _, layer in iter_layers(swapped))
    separable = [layer for _, layer in iter_layers(swapped)
                 if type(layer).__name__ == "SwappedSeparableConv2D"]
    assert len(separable) == 34
    # 34 after SeparableConv2D, 6 after Conv2D: all of Xception's
    assert any(note.startswith("folded 40 BatchNormalization layer(s)") for note in report.notes)
    assert all(layer.current_quantization().activations == "static"
               and None not in layer.intermediate_ranges().values() for layer in separable)
    whole = swapped(x[:12], training=False).numpy()
    parts = np.concatenate([swapped(x[i:min(i + 5, 12)], training=False).numpy()
                            for i in range(0, 12, 5)])
    np.testing.assert_array_equal(parts, whole)


def test_calibrated_vit_is_static_in_every_projection_and_batch_independent(tmp_path):
    """The ViT's patch embedding, MLPs, head and every attention projection get a static range
    (the attention layers through their projections); outputs are then bit for bit the same in
    any batch, also after saving and reloading."""
    from graphswap.swap.calibration import quantizing_layers

    keras.utils.set_random_seed(0)
    model = vit()
    x = RNG.uniform(0, 1, (24, 32, 32, 3)).astype(np.float32)
    swapped = graphswap.rewrite_model(model, kernel="mul8s_drum4", calibration_data=x[:16],
                                      bias_correction="moments")
    layers = dict(quantizing_layers(swapped))
    # 1 patch embedding, per block 4 projections + 2 MLP layers, 1 head
    assert len(layers) == 1 + 2 * 6 + 1 and "mha1/output_dense" in layers
    assert all(layer.current_quantization().activation_range is not None
               and layer.output_correction is not None for layer in layers.values())
    whole = swapped(x, training=False).numpy()
    for size in (1, 5):
        parts = np.concatenate([swapped(x[i:i + size], training=False).numpy()
                                for i in range(0, len(x), size)])
        np.testing.assert_array_equal(parts, whole)
    path = tmp_path / "vit.keras"
    swapped.save(path)
    np.testing.assert_array_equal(keras.models.load_model(path)(x, training=False).numpy(), whole)
