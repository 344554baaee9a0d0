"""DepthwiseConv2D, SeparableConv2D, Conv2DTranspose, Conv1D and EinsumDense calibrate, compensate
and observe like Dense and Conv2D: static ranges equal what the float model's layers see
(SeparableConv2D's second range: its float depthwise result), calibrated outputs do not depend on
the batch (dynamic ones do), depthwise, separable and einsum layers' outputs equal an independent
numpy reference of their schemes and correction, the state round-trips through save/load and kept-kernel ONNX,
compensation lowers the layer's measured error, and the moving-average observer follows its
formula inside `fit`."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import graphswap
from graphswap.errors import QuantizationError
from graphswap.swap import (SwappedConv1D, SwappedConv2DTranspose, SwappedDepthwiseConv2D,
                            SwappedSeparableConv2D)
from graphswap.swap import compensation, ops_layers
from conftest import assert_close_to_roundoff
from reference import builtin_reference, quantized_conv2d

STATIC_LAYERS = ("conv", "depthwise", "sep", "transpose", "conv1d", "ein", "head")


def small_model(seed: int = 0) -> keras.Model:
    """Conv2D -> DepthwiseConv2D (multiplier 2, bias, ReLU) -> SeparableConv2D (multiplier 2,
    ReLU) -> Conv2DTranspose (stride 2) -> Conv1D (causal) -> EinsumDense (output channels over
    two axes) -> Dense."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((10, 10, 3))
    x = keras.layers.Conv2D(4, 3, activation="relu", name="conv")(inputs)
    x = keras.layers.DepthwiseConv2D(3, padding="same", depth_multiplier=2, activation="relu",
                                     bias_initializer="random_normal", name="depthwise")(x)
    x = keras.layers.SeparableConv2D(4, 3, padding="same", depth_multiplier=2,
                                     activation="relu", name="sep")(x)
    x = keras.layers.Conv2DTranspose(2, 3, strides=2, padding="same", activation="relu",
                                     name="transpose")(x)
    x = keras.layers.Reshape((128, 4))(x)
    x = keras.layers.Conv1D(5, 3, padding="causal", activation="relu", name="conv1d")(x)
    x = keras.layers.EinsumDense("abc,cde->abde", output_shape=(128, 2, 3), bias_axes="de",
                                 activation="relu", name="ein")(x)
    x = keras.layers.Reshape((128, 6))(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(x))


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(1).random((96, 10, 10, 3)).astype(np.float32)


def in_batches(model, x, size):
    return np.concatenate([np.asarray(model(x[i:i + size], training=False))
                           for i in range(0, len(x), size)])


def test_minmax_ranges_of_the_static_layers_are_the_float_inputs_extremes(images):
    model = small_model()
    swapped = graphswap.rewrite_model(model, kernel="mul8u_drum4", bias_correction=None, calibration_data=images[:64],
                                      calibration_method="minmax", calibration_source="float",
                                      dynamic_fallback=False)
    names = ("depthwise", "sep", "transpose", "conv1d", "ein")
    probe = keras.Model(model.inputs, [model.get_layer(n).input for n in names])
    inputs = dict(zip(names, (np.asarray(t) for t in probe(images[:64]))))
    for name, values in inputs.items():
        scheme = swapped.get_layer(name).current_quantization()
        assert scheme.activations == "static"
        np.testing.assert_allclose(scheme.activation_range, [min(values.min(), 0.0),
                                                             values.max()], rtol=1e-5, atol=1e-6)
    # the separable layer's pointwise operand: its float depthwise result (TensorFlow's op)
    stock = model.get_layer("sep")
    depthwise = np.asarray(tf.nn.depthwise_conv2d(inputs["sep"], stock.depthwise_kernel,
                                                  [1, 1, 1, 1], "SAME"))
    np.testing.assert_allclose(swapped.get_layer("sep").intermediate_ranges()["pointwise"],
                               [min(depthwise.min(), 0.0), depthwise.max()], rtol=1e-5,
                               atol=1e-6)
    assert isinstance(swapped.get_layer("sep"), SwappedSeparableConv2D)
    assert isinstance(swapped.get_layer("depthwise"), SwappedDepthwiseConv2D)
    assert isinstance(swapped.get_layer("conv1d"), SwappedConv1D)
    assert isinstance(swapped.get_layer("transpose"), SwappedConv2DTranspose)


def test_calibrated_static_layers_do_not_depend_on_the_batch(images):
    model = small_model()
    static = graphswap.rewrite_model(model, kernel="mul8u_drum4", calibration_data=images[:64],
                                     bias_correction="moments")
    whole = np.asarray(static(images, training=False))
    for size in (1, 7, 32):
        np.testing.assert_array_equal(in_batches(static, images, size), whole)
    # the difference the static mode exists for: only the layers beyond Dense/Conv2D swapped,
    # per-call ranges, and the same images give other outputs in other batches
    dynamic = graphswap.rewrite_model(model, kernel="mul8u_drum4",
                                      include=["depthwise", "sep", "transpose", "conv1d",
                                               "ein"])
    assert np.abs(in_batches(dynamic, images, 7)
                  - np.asarray(dynamic(images, training=False))).max() > 1e-4


@pytest.mark.parametrize("kernel", ["mul8u_drum4", "mul8s_drum4"])
def test_static_depthwise_output_equals_the_numpy_reference(images, kernel):
    model = keras.Sequential([keras.Input((10, 10, 3)), keras.layers.DepthwiseConv2D(
        3, padding="same", depth_multiplier=2, activation="relu",
        bias_initializer="random_normal", name="depthwise")])
    calibration = images[:32] - 0.25   # inputs of both signs
    x = images[32:40] - 0.25           # others (a per-call range would differ)
    swapped = graphswap.rewrite_model(model, kernel=kernel, calibration_data=calibration,
                                      calibration_method="percentile",
                                      bias_correction="moments")
    layer = swapped.get_layer("depthwise")
    scheme = layer.current_quantization()
    correction = layer.output_correction
    assert scheme.activations == "static" and correction["gain"] and correction["offset"]
    w = np.asarray(layer.kernel).reshape(3, 3, 1, 6)
    product = quantized_conv2d(x, w, builtin_reference(kernel), kernel.startswith("mul8s"),
                               (1, 1), (1, 1), (1, 1, 1, 1), 3,
                               {"activation_range": scheme.activation_range})
    want = np.maximum(product.astype(np.float64) * np.asarray(correction["gain"])
                      + np.asarray(correction["offset"]) + np.asarray(layer.bias), 0.0)
    got = np.asarray(swapped(x, training=False))
    # the epilogue runs in float32 (one multiply-add per output)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6 * np.abs(want).max())


@pytest.mark.parametrize("kernel", ["mul8u_drum4", "mul8s_drum4"])
def test_static_separable_output_equals_the_numpy_reference(images, kernel):
    """Two quantized products, each on its own calibrated range: the depthwise one on the
    layer's input range, the pointwise one on the range of the depthwise result; the
    correction, bias and ReLU after the pointwise product."""
    model = keras.Sequential([keras.Input((10, 10, 3)), keras.layers.SeparableConv2D(
        4, 3, padding="same", depth_multiplier=2, activation="relu",
        bias_initializer="random_normal", name="sep")])
    calibration = images[:32] - 0.25
    x = images[32:40] - 0.25
    swapped = graphswap.rewrite_model(model, kernel=kernel, calibration_data=calibration,
                                      bias_correction="moments")
    layer = swapped.get_layer("sep")
    first = layer.current_quantization().activation_range
    second = layer.intermediate_ranges()["pointwise"]
    correction = layer.output_correction
    assert first != second and correction["gain"] and correction["offset"]
    table, signed = builtin_reference(kernel), kernel.startswith("mul8s")
    depthwise = quantized_conv2d(x, np.asarray(layer.depthwise_kernel).reshape(3, 3, 1, 6),
                                 table, signed, (1, 1), (1, 1), (1, 1, 1, 1), 3,
                                 {"activation_range": first})
    product = quantized_conv2d(depthwise, np.asarray(layer.pointwise_kernel), table, signed,
                               (1, 1), (1, 1), (0, 0, 0, 0), 1, {"activation_range": second})
    want = np.maximum(product.astype(np.float64) * np.asarray(correction["gain"])
                      + np.asarray(correction["offset"]) + np.asarray(layer.bias), 0.0)
    got = np.asarray(swapped(x, training=False))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6 * np.abs(want).max())
    # and the layer's numpy product with its scheme (what compensation measures) is the same
    # two products
    np.testing.assert_allclose(layer.numpy_product(x, quant=layer.current_quantization()),
                               product, rtol=1e-6, atol=1e-6 * np.abs(product).max())


@pytest.mark.parametrize("equation, output_shape, bias_axes, to_output", [
    # (a*b, d*e) -> (a, b, d, e): the correction's columns are d x e
    ("abc,cde->abde", (6, 3, 4), "de", lambda y, a, b: y.reshape(a, b, 3, 4)),
    # (a*b, d) -> (a, d, b): the produced axis in the middle of the output
    ("abc,cd->adb", (5, 6), "d", lambda y, a, b: y.reshape(a, b, 5).transpose(0, 2, 1))])
@pytest.mark.parametrize("kernel", ["mul8u_drum4", "mul8s_drum4"])
def test_static_einsum_output_equals_the_numpy_reference(kernel, equation, output_shape,
                                                         bias_axes, to_output):
    """One input range; the product matrix's columns are the output channels, corrected one by
    one and put back on the output's axes before the bias."""
    from reference import quantized_matmul

    model = keras.Sequential([keras.Input((6, 8)), keras.layers.EinsumDense(
        equation, output_shape=output_shape, bias_axes=bias_axes, activation="relu",
        bias_initializer="random_normal", name="ein")])
    rng = np.random.default_rng(7)
    calibration = rng.normal(size=(32, 6, 8)).astype(np.float32)
    x = rng.normal(size=(5, 6, 8)).astype(np.float32)
    swapped = graphswap.rewrite_model(model, kernel=kernel, calibration_data=calibration,
                                      bias_correction="moments")
    layer = swapped.get_layer("ein")
    scheme = layer.current_quantization()
    correction = layer.output_correction
    assert scheme.activations == "static" and correction["gain"] and correction["offset"]
    w = np.asarray(layer.kernel)
    product = quantized_matmul(x.reshape(-1, 8), w.reshape(8, -1), builtin_reference(kernel),
                               kernel.startswith("mul8s"),
                               {"activation_range": scheme.activation_range})
    corrected = product.astype(np.float64) * np.asarray(correction["gain"]) \
        + np.asarray(correction["offset"])
    bias = np.asarray(layer.bias)
    bias = bias.reshape(bias.shape[0], 1) if equation.endswith("adb") else bias
    want = np.maximum(to_output(corrected, 5, 6) + bias, 0.0)
    got = np.asarray(swapped(x, training=False))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6 * np.abs(want).max())


def test_separable_intermediate_range_is_checked():
    arithmetic = dict(arithmetic="mul8u_drum4")
    with pytest.raises(QuantizationError, match=r"'s'.*intermediate_ranges.*pointwise"):
        SwappedSeparableConv2D(4, 3, name="s", intermediate_ranges={"depthwise": [0, 1]},
                               **arithmetic)
    with pytest.raises(QuantizationError, match=r"finite lo <= hi"):
        SwappedSeparableConv2D(4, 3, name="s", intermediate_ranges={"pointwise": [2, 1]},
                               **arithmetic)
    # static on the input but the pointwise operand never calibrated: one clear error
    layer = SwappedSeparableConv2D(4, 3, name="s", quantization={
        "activations": "static", "activation_range": [0.0, 1.0]}, **arithmetic)
    with pytest.raises(QuantizationError, match=r"'s'.*no calibrated range for its pointwise "
                                                r"operand; calibrate it"):
        layer(np.ones((1, 5, 5, 2), np.float32))
    with pytest.raises(QuantizationError, match=r"no intermediate operand 'depthwise'"):
        layer.set_intermediate_range("depthwise", 0.0, 1.0)


def test_static_state_round_trips_through_save_and_load(images, tmp_path):
    swapped = graphswap.rewrite_model(small_model(), kernel="mul8s_drum4",
                                      calibration_data=images[:64], bias_correction="moments")
    path = tmp_path / "static.keras"
    swapped.save(path)
    loaded = keras.models.load_model(path)
    for name in STATIC_LAYERS:
        assert loaded.get_layer(name).current_quantization() == \
            swapped.get_layer(name).current_quantization()
        assert loaded.get_layer(name).output_correction == \
            swapped.get_layer(name).output_correction
    assert loaded.get_layer("sep").intermediate_ranges() == \
        swapped.get_layer("sep").intermediate_ranges()
    assert None not in loaded.get_layer("sep").intermediate_ranges().values()
    np.testing.assert_array_equal(np.asarray(loaded(images, training=False)),
                                  np.asarray(swapped(images, training=False)))


def test_kept_kernel_onnx_runs_the_static_layers_batch_by_batch(images, tmp_path):
    swapped = graphswap.rewrite_model(small_model(), kernel="mul8u_drum4",
                                      calibration_data=images[:64], bias_correction="moments")
    path = tmp_path / "static.kept.onnx"
    graphswap.export_model(swapped, path, format="onnx", keep_kernels=True)
    session = graphswap.onnx_session(path)
    name = session.get_inputs()[0].name
    whole = session.run(None, {name: images[:40]})[0]
    start = 0
    for size in (1, 5, 34):
        batch = images[start:start + size]
        got = session.run(None, {name: batch})[0]
        np.testing.assert_array_equal(got, whole[start:start + size])
        assert_close_to_roundoff(got, np.asarray(swapped(batch, training=False)), terms=200)
        start += size


def depthwise_error(swapped, model, x) -> float:
    """Mean |approximate - float| of the depthwise layer's output, on its own float input."""
    probe = keras.Model(model.inputs, model.get_layer("depthwise").input)
    layer_in = probe(x)
    return float(np.mean(np.abs(np.asarray(swapped.get_layer("depthwise")(layer_in))
                                - np.asarray(model.get_layer("depthwise")(layer_in)))))


def test_compensation_lowers_the_depthwise_error_on_held_out_data(images):
    model = small_model()
    options = dict(kernel="mul8u_mitchell", include=["depthwise"],
                   calibration_data=images[:64])
    plain = graphswap.rewrite_model(model, bias_correction=None, **options)
    compensated = graphswap.rewrite_model(model, bias_correction="moments", **options)
    before = depthwise_error(plain, model, images[64:])
    after = depthwise_error(compensated, model, images[64:])
    # Mitchell's products are all too small, by a share of the product: a per-channel gain
    # error, which "moments" removes (measured 27% of the whole error, quantization included)
    assert after < 0.85 * before


def test_moving_average_observer_follows_its_formula_in_fit(images):
    """lo, hi <- m lo + (1 - m) min/max of what each range saw in the training step: the
    depthwise layer's input, and the separable layer's depthwise result (its pointwise range)."""
    model = small_model()
    swapped = graphswap.rewrite_model(model, kernel="mul8u_drum4", bias_correction=None, calibration_data=images[:64],
                                      quantization={"observer": "moving_average",
                                                    "momentum": 0.5})
    depthwise, separable = swapped.get_layer("depthwise"), swapped.get_layer("sep")
    before = {"depthwise": np.array(depthwise.current_quantization().activation_range),
              "pointwise": np.array(separable.intermediate_ranges()["pointwise"])}
    swapped.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")   # weights stay
    batch = images[:32]
    swapped.fit(batch, np.zeros((32, 3), np.float32), batch_size=32, epochs=1, verbose=0,
                shuffle=False)
    after = {"depthwise": np.array(depthwise.current_quantization().activation_range),
             "pointwise": np.array(separable.intermediate_ranges()["pointwise"])}
    # what they saw: every range moved once, before its own product, so the inputs computed
    # now (same weights, the moved ranges) are the step's
    probe = keras.Model(swapped.inputs, [depthwise.input, separable.input])
    depthwise_in, separable_in = (np.asarray(t) for t in probe(batch, training=False))
    seen = {"depthwise": depthwise_in, "pointwise": ops_layers.depthwise_product(
        separable.arithmetic, separable_in, np.asarray(separable.depthwise_kernel), (1, 1),
        "same", (1, 1), separable.current_quantization())}
    for name, values in seen.items():
        np.testing.assert_allclose(after[name], 0.5 * before[name] + 0.5 * np.array(
            [min(values.min(), 0.0), values.max()]), rtol=1e-5, atol=1e-6)
        assert not np.array_equal(after[name], before[name])


def test_depthwise_gradients_are_the_stock_layers_through_the_correction():
    """backward="native" with an output correction: d/dx and d/dw of the stock depthwise
    convolution of dy * gain, the bias gradient the sum of dy (the straight-through estimator:
    TensorFlow's registered gradients of the stock op)."""
    model = keras.Sequential([keras.Input((6, 6, 4)), keras.layers.DepthwiseConv2D(
        3, padding="same", name="depthwise")])
    x = np.random.default_rng(2).normal(size=(16, 6, 6, 4)).astype(np.float32)
    swapped = graphswap.rewrite_model(model, kernel="mul8u_exact", bias_correction=None, calibration_data=x)
    layer = swapped.get_layer("depthwise")
    gain = np.linspace(0.5, 1.5, 4).astype(np.float32)
    offset = np.linspace(-0.1, 0.1, 4).astype(np.float32)
    layer.set_output_correction(gain, offset)
    dy = np.random.default_rng(3).normal(size=(16, 6, 6, 4)).astype(np.float32)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = swapped(xt, training=True)
    dx, dw, db = tape.gradient(y, [xt, layer.kernel, layer.bias], output_gradients=dy)
    stock = model.get_layer("depthwise")
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y_stock = stock(xt)
    want_dx, want_dw = tape.gradient(y_stock, [xt, stock.kernel], output_gradients=dy * gain)
    # dx sums 9 taps, dw and db the 16 x 6 x 6 batch positions
    assert_close_to_roundoff(dx, want_dx, terms=9)
    assert_close_to_roundoff(dw, want_dw, terms=16 * 36)
    assert_close_to_roundoff(db, dy.sum(axis=(0, 1, 2)), terms=16 * 36)


def test_compensation_covers_every_static_layer(images):
    swapped = graphswap.rewrite_model(small_model(), kernel="mul8u_drum4",
                                      bias_correction=None, calibration_data=images[:64])
    step = compensation.compensate_bias(swapped, images[:64], samples=64, method="moments")
    assert sorted(step.layers) == sorted(STATIC_LAYERS)
    for name in STATIC_LAYERS:
        assert swapped.get_layer(name).output_correction["gain"] is not None


def bn_model(seed: int = 4) -> keras.Model:
    """DepthwiseConv2D (multiplier 2, channels_first too) and Conv1D, each followed by a
    BatchNormalization with non-trivial statistics (MobileNet's and a 1-D CNN's pattern)."""
    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.DepthwiseConv2D(3, depth_multiplier=2, use_bias=False, name="depthwise")(
        inputs)
    x = keras.layers.BatchNormalization(name="bn_depthwise")(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Reshape((36, 6))(x)
    x = keras.layers.Conv1D(4, 3, padding="causal", name="conv1d")(x)
    x = keras.layers.BatchNormalization(name="bn_conv1d", epsilon=0.01)(x)
    model = keras.Model(inputs, x)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            n = layer.moving_mean.shape[0]
            layer.moving_mean.assign(rng.normal(0, 0.5, n))
            layer.moving_variance.assign(rng.uniform(0.2, 2.0, n))
            layer.gamma.assign(rng.uniform(-1.5, 1.5, n))
            layer.beta.assign(rng.normal(0, 0.5, n))
    return model


def test_depthwise_and_conv1d_fold_their_batchnorm(images):
    from graphswap import swap

    model = bn_model()
    x = images[:16, :8, :8]
    folded, report = swap.fold_batchnorm(model)
    assert report.folded == [("depthwise", "bn_depthwise"), ("conv1d", "bn_conv1d")]
    assert_close_to_roundoff(folded(x, training=False), model(x, training=False), terms=100)
    exact = graphswap.rewrite_model(model, kernel="exact", fold_batchnorm=True)
    assert_close_to_roundoff(exact(x, training=False), model(x, training=False), terms=100)
    # the depthwise output channel c = i * multiplier + m takes the BN's factor f_c
    bn = model.get_layer("bn_depthwise")
    factor = (np.asarray(bn.gamma, np.float64)
              / np.sqrt(np.asarray(bn.moving_variance, np.float64) + bn.epsilon))
    np.testing.assert_allclose(np.asarray(folded.get_layer("depthwise").kernel),
                               np.asarray(model.get_layer("depthwise").kernel)
                               * factor.reshape(3, 2), rtol=1e-6)


def test_separable_folds_its_batchnorm_into_the_pointwise_kernel(images):
    from graphswap import swap

    keras.utils.set_random_seed(5)
    rng = np.random.default_rng(5)
    model = keras.Sequential([
        keras.Input((8, 8, 3)),
        keras.layers.SeparableConv2D(4, 3, depth_multiplier=2, name="sep"),
        keras.layers.BatchNormalization(name="bn_sep"),
        keras.layers.ReLU()])
    bn = model.get_layer("bn_sep")
    bn.moving_mean.assign(rng.normal(0, 0.5, 4))
    bn.moving_variance.assign(rng.uniform(0.2, 2.0, 4))
    bn.gamma.assign(rng.uniform(-1.5, 1.5, 4))
    bn.beta.assign(rng.normal(0, 0.5, 4))
    x = images[:16, :8, :8]
    folded, report = swap.fold_batchnorm(model)
    assert report.folded == [("sep", "bn_sep")]
    assert_close_to_roundoff(folded(x, training=False), model(x, training=False), terms=100)
    factor = (np.asarray(bn.gamma, np.float64)
              / np.sqrt(np.asarray(bn.moving_variance, np.float64) + bn.epsilon))
    stock, merged = model.get_layer("sep"), folded.get_layer("sep")
    np.testing.assert_array_equal(np.asarray(merged.depthwise_kernel),
                                  np.asarray(stock.depthwise_kernel))
    np.testing.assert_allclose(np.asarray(merged.pointwise_kernel),
                               np.asarray(stock.pointwise_kernel) * factor, rtol=1e-6)
    exact = graphswap.rewrite_model(model, kernel="exact", fold_batchnorm=True)
    assert isinstance(exact.get_layer("sep"), SwappedSeparableConv2D)
    assert_close_to_roundoff(exact(x, training=False), model(x, training=False), terms=100)


def transposed_scatter(x, kernel, stride, pad_before, out_size, product):
    """Transposed convolution as its definition, a scatter: y[n, i*s + di - p, j*s + dj - p, o]
    += product(x[n, i, j, c], kernel[di, dj, o, c]) summed over c (`product` on whole arrays)."""
    n, h, w, c = x.shape
    kh, kw, filters, _ = kernel.shape
    y = np.zeros((n, out_size, out_size, filters), np.float64)
    for i in range(h):
        for j in range(w):
            for di in range(kh):
                for dj in range(kw):
                    oy, ox = i * stride + di - pad_before, j * stride + dj - pad_before
                    if 0 <= oy < out_size and 0 <= ox < out_size:
                        y[:, oy, ox, :] += product(x[:, i, j, :], kernel[di, dj])
    return y


def test_static_transposed_conv_equals_the_scatter_reference(images):
    """A signed multiplier (zero point 0: an inserted zero is a zero product, as in a scatter
    accelerator) against the definition, summed exactly in integers."""
    from reference import _activations, _lookup, _weight_channel

    model = keras.Sequential([keras.Input((5, 5, 3)), keras.layers.Conv2DTranspose(
        2, 3, strides=2, padding="same", name="transpose")])
    calibration, x = images[:32, :5, :5] - 0.3, images[32:36, :5, :5] - 0.3
    swapped = graphswap.rewrite_model(model, kernel="mul8s_drum4", bias_correction=None, calibration_data=calibration)
    layer = swapped.get_layer("transpose")
    kernel = np.asarray(layer.kernel, np.float64)
    # the reference's own geometry, checked on float values against TensorFlow's op
    float_scatter = transposed_scatter(x.astype(np.float64), kernel, 2, 0, 10,
                                       lambda a, w: a @ w.T)
    assert_close_to_roundoff(np.asarray(model(x)) - np.asarray(model.get_layer("transpose").bias),
                             float_scatter, terms=27)
    table = builtin_reference("mul8s_drum4")
    qa, sa, _ = _activations(x, True, layer.current_quantization().activation_range)
    channels = [_weight_channel(kernel[:, :, o, :], kernel[:, :, o, :], "symmetric")
                for o in range(2)]
    qw = np.stack([ch[0] for ch in channels], axis=2)           # (kh, kw, filters, in)
    scales = np.array([ch[2] for ch in channels])
    integer = transposed_scatter(qa, qw, 2, 0, 10, lambda a, w: _lookup(
        table, a[:, None, :], w[None], True).sum(axis=-1))
    want = integer * sa * scales + np.asarray(layer.bias)
    np.testing.assert_allclose(np.asarray(swapped(x, training=False)), want, rtol=1e-6,
                               atol=1e-6 * np.abs(want).max())


def test_lut_grad_stays_refused_for_the_layers_beyond_dense_and_conv2d():
    """Static ranges do not bring lut_grad with them: its C gradient is Dense/Conv2D's."""
    from graphswap.errors import UnsupportedLayerError

    with pytest.raises(UnsupportedLayerError, match=r"'depthwise'.*lut_grad.*Dense and Conv2D"):
        graphswap.rewrite_model(small_model(), kernel="mul8u_drum4", backward="lut_grad")
    swapped = graphswap.rewrite_model(small_model(), kernel="mul8u_drum4", backward="lut_grad",
                                      include=["^conv$", "^head$"])
    assert swapped.get_layer("conv").backward == "lut_grad"


def attention_model(seed: int = 0) -> keras.Model:
    """Self-attention whose key/value input is another tensor than its query input (a Dense
    of it), so the projections see different ranges; a residual and a Dense head."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6, 8))
    context = keras.layers.Dense(8, name="context")(inputs)
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, name="mha")(
        inputs, context)
    x = keras.layers.GlobalAveragePooling1D()(keras.layers.Add()([inputs, attended]))
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(x))


@pytest.fixture(scope="module")
def sequences():
    return np.random.default_rng(8).normal(size=(80, 6, 8)).astype(np.float32)


def test_attention_projections_calibrate_to_their_own_float_inputs(sequences):
    model = attention_model()
    swapped, report = graphswap.rewrite_model(model, kernel="mul8u_drum4",
                                              bias_correction=None, calibration_data=sequences[:64],
                                              calibration_method="minmax", return_report=True,
                                              calibration_source="float", dynamic_fallback=False)
    parts = swapped.get_layer("mha").quantized_parts()
    assert sorted(parts) == ["key_dense", "output_dense", "query_dense", "value_dense"]
    probe = keras.Model(model.inputs, [model.get_layer("mha").input[0],
                                       model.get_layer("context").output])
    query_in, context_in = (np.asarray(t) for t in probe(sequences[:64]))
    for name, values in (("query_dense", query_in), ("key_dense", context_in),
                         ("value_dense", context_in)):
        scheme = parts[name].current_quantization()
        assert scheme.activations == "static"
        np.testing.assert_allclose(scheme.activation_range, [min(values.min(), 0.0),
                                                             values.max()], rtol=1e-5, atol=1e-6)
    assert parts["output_dense"].current_quantization().activation_range is not None
    assert any("mha/query_dense [" in note for note in report.notes)
    assert not any("per-call" in note for note in report.notes)


def test_calibrated_attention_does_not_depend_on_the_batch_and_round_trips(sequences, tmp_path):
    model = attention_model()
    swapped = graphswap.rewrite_model(model, kernel="mul8s_drum4",
                                      calibration_data=sequences[:64], bias_correction="moments",
                                      dynamic_fallback=False)
    parts = swapped.get_layer("mha").quantized_parts()
    assert all(part.output_correction["gain"] is not None for part in parts.values())
    whole = np.asarray(swapped(sequences, training=False))
    for size in (1, 7, 32):
        np.testing.assert_array_equal(in_batches(swapped, sequences, size), whole)
    dynamic = graphswap.rewrite_model(model, kernel="mul8s_drum4", include=["mha"])
    assert np.abs(in_batches(dynamic, sequences, 7)
                  - np.asarray(dynamic(sequences, training=False))).max() > 1e-4
    # saved and reloaded: every projection's range and correction, and so the outputs
    path = tmp_path / "attention.keras"
    swapped.save(path)
    loaded = keras.models.load_model(path)
    for name, part in loaded.get_layer("mha").quantized_parts().items():
        assert part.current_quantization() == parts[name].current_quantization()
        assert part.output_correction == parts[name].output_correction
    np.testing.assert_array_equal(np.asarray(loaded(sequences, training=False)), whole)
    # kept-kernel ONNX: each projection's node runs its own static range
    onnx_path = tmp_path / "attention.kept.onnx"
    graphswap.export_model(swapped, onnx_path, format="onnx", keep_kernels=True)
    session = graphswap.onnx_session(onnx_path)
    name = session.get_inputs()[0].name
    start = 0
    for size in (1, 5, 20):
        batch = sequences[start:start + size]
        assert_close_to_roundoff(session.run(None, {name: batch})[0],
                                 whole[start:start + size], terms=100)
        start += size


def test_bad_projection_states_are_refused():
    from graphswap.swap import SwappedMultiHeadAttention

    with pytest.raises(QuantizationError, match=r"'mha'.*projection_states must map"):
        SwappedMultiHeadAttention(2, 4, name="mha", arithmetic="mul8u_drum4",
                                  projection_states={"attention_scores": {}})
    with pytest.raises(QuantizationError, match=r"activation mode must be one of"):
        SwappedMultiHeadAttention(2, 4, name="mha", arithmetic="mul8u_drum4",
                                  projection_states={"query_dense": {"quantization": {
                                      "activations": "sometimes"}}})
