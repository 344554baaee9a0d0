"""BatchNormalization folding: the folded model equals the unfolded one with the exact kernel, the
folded + LUT model equals an independent numpy pipeline bit for bit, the pairs that must not be
folded are reported (not errors), and the folded model trains, saves, reloads and exports."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest

import graphswap
from conftest import assert_close_to_roundoff
from graphswap import swap

import reference

CNN_BN = Path(__file__).resolve().parent.parent / "sample_models" / "cnn_bn.keras"
RNG = np.random.default_rng(3)


@pytest.fixture()
def cnn_bn():
    return keras.models.load_model(CNN_BN)


def test_folding_the_shipped_bn_cnn_equals_it_with_the_exact_kernel(cnn_bn, digits):
    folded, report = swap.fold_batchnorm(cnn_bn)
    assert report.folded == [("conv1", "bn1"), ("conv2", "bn2"), ("fc1", "bn3")]
    assert not any(isinstance(layer, keras.layers.BatchNormalization) for layer in folded.layers)
    x = digits["x_test"][:64]
    assert_close_to_roundoff(folded(x, training=False), cnn_bn(x, training=False), terms=400)
    exact = graphswap.rewrite_model(cnn_bn, kernel="exact", fold_batchnorm=True)
    assert_close_to_roundoff(exact(x, training=False), cnn_bn(x, training=False), terms=400)
    assert cnn_bn.get_layer("bn1") is not None      # the input model is untouched


def _functional_bn_model():
    keras.utils.set_random_seed(5)
    image = keras.Input((9, 9, 2))
    y = keras.layers.Conv2D(4, 3, use_bias=False, name="conv")(image)
    y = keras.layers.BatchNormalization(name="bn_conv", center=False)(y)
    y = keras.layers.ReLU()(y)
    y = keras.layers.Flatten()(y)
    y = keras.layers.Dense(6, name="dense")(y)
    y = keras.layers.BatchNormalization(name="bn_dense", scale=False, epsilon=0.01)(y)
    model = keras.Model(image, y)
    for layer in model.layers:   # non-trivial statistics
        if isinstance(layer, keras.layers.BatchNormalization):
            n = layer.moving_mean.shape[0]
            layer.moving_mean.assign(RNG.normal(0, 0.5, n))
            layer.moving_variance.assign(RNG.uniform(0.2, 2.0, n))
            if layer.scale:
                layer.gamma.assign(RNG.uniform(-1.5, 1.5, n))
            if layer.center:
                layer.beta.assign(RNG.normal(0, 0.5, n))
    return model


def numpy_fold(weights, bias, bn):
    mean, variance = np.asarray(bn.moving_mean, np.float64), np.asarray(bn.moving_variance,
                                                                         np.float64)
    gamma = np.asarray(bn.gamma, np.float64) if bn.scale else 1.0
    beta = np.asarray(bn.beta, np.float64) if bn.center else 0.0
    scale = gamma / np.sqrt(variance + bn.epsilon)
    bias = 0.0 if bias is None else np.asarray(bias, np.float64)
    return ((np.asarray(weights, np.float64) * scale).astype(np.float32),
            ((bias - mean) * scale + beta).astype(np.float32))


@pytest.mark.parametrize("kernel", ["mul8u_drum4", "mul8s_drum3"])
def test_folded_lut_model_equals_an_independent_numpy_pipeline(kernel):
    model = _functional_bn_model()
    x = RNG.uniform(0, 1, (5, 9, 9, 2)).astype(np.float32)
    swapped = graphswap.rewrite_model(model, kernel=kernel, fold_batchnorm=True)
    table = graphswap.kernels.resolve_multiplier(kernel).table   # code order
    signed = kernel.startswith("mul8s")
    conv_w, conv_b = numpy_fold(model.get_layer("conv").kernel, None, model.get_layer("bn_conv"))
    dense_w, dense_b = numpy_fold(model.get_layer("dense").kernel, model.get_layer("dense").bias,
                                  model.get_layer("bn_dense"))
    y = reference.quantized_conv2d(x, conv_w, table, signed, (1, 1), (1, 1), (0, 0, 0, 0), 1)
    y = np.maximum(y + conv_b, 0).reshape(5, -1)
    want = reference.quantized_matmul(y, dense_w, table, signed) + dense_b
    np.testing.assert_array_equal(np.asarray(swapped(x, training=False)), want)


def test_pairs_that_cannot_be_folded_are_reported():
    image = keras.Input((6, 6, 1))
    a = keras.layers.Conv2D(3, 3, activation="relu", name="with_activation")(image)
    a = keras.layers.BatchNormalization(name="bn_after_relu")(a)
    b = keras.layers.Conv2D(3, 3, name="used_twice")(image)
    c = keras.layers.BatchNormalization(name="bn_shared_input")(b)
    d = keras.layers.Add()([a, b, c])
    e = keras.layers.Conv2D(2, 1, name="wrong_axis")(d)
    f = keras.layers.BatchNormalization(axis=1, name="bn_axis1")(e)
    model = keras.Model(image, f)
    folded, report = swap.fold_batchnorm(model)
    reasons = dict(report.skipped)
    assert report.folded == []
    assert "applies an activation" in reasons["bn_after_relu"]
    assert "also used elsewhere" in reasons["bn_shared_input"]
    assert "channel axis" in reasons["bn_axis1"]
    assert ("no foldable Dense/Conv2D/DepthwiseConv2D/SeparableConv2D/Conv1D + "
            "BatchNormalization pair" in report.lines()[0])
    x = RNG.uniform(size=(2, 6, 6, 1)).astype(np.float32)
    np.testing.assert_array_equal(folded(x, training=False), model(x, training=False))


def test_a_model_without_batchnorm_gets_a_report_line(lenet):
    swapped, report = graphswap.rewrite_model(lenet, kernel="mul8u_drum4", fold_batchnorm=True,
                                              return_report=True)
    assert "--fold-batchnorm: no BatchNormalization layer in the model; nothing folded" in \
        report.notes
    assert len(report.swapped) == 5


def test_folding_keeps_what_calibration_compensation_and_bn_reestimation_won(cnn_bn, digits):
    x = digits["x_train"][:256]
    swapped = graphswap.rewrite_model(cnn_bn, kernel="mul8s_drum3", calibration_data=x,
                                      bias_correction="mean", recalibrate_bn=True)
    folded, report = swap.fold_batchnorm(swapped)
    assert len(report.folded) == 3
    test = digits["x_test"]
    before = np.asarray(swapped(test, training=False)).argmax(1)
    after = np.asarray(folded(test, training=False)).argmax(1)
    assert (before == after).mean() >= 0.99
    assert folded.get_layer("conv2").current_quantization() == \
        swapped.get_layer("conv2").current_quantization()


def test_folded_model_trains_saves_reloads_and_exports(cnn_bn, digits, tmp_path):
    swapped = graphswap.rewrite_model(cnn_bn, kernel="mul8u_drum4", fold_batchnorm=True,
                                      bias_correction=None, calibration_data=digits["x_train"][:256])
    result = graphswap.finetune(swapped, (digits["x_train"][:256], digits["y_train"][:256]),
                                epochs=1, verbose=0)
    trained = result.model
    before = swapped.get_layer("conv1").get_weights()[0]
    assert not np.array_equal(trained.get_layer("conv1").get_weights()[0], before)
    path = tmp_path / "folded.keras"
    trained.save(path)
    loaded = keras.models.load_model(path)
    x = digits["x_test"][:32]
    np.testing.assert_array_equal(loaded(x, training=False), trained(x, training=False))
    export = graphswap.export_model(loaded, tmp_path / "folded.onnx", format="onnx")
    assert export.max_abs_difference < 1e-3
