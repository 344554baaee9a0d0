"""Multiplier-aware weight tuning (graphswap/swap/weight_tuning.py; ALWANN's, Mrazek et al.):
the remap against an independent implementation of its definition on random tables and
histograms, the expected product error never increasing on any built-in multiplier (with the
stored weights re-quantized by the kernel's own quantizer), every table-driven layer type, and a
tuned model that saves, reloads and exports with identical outputs."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import graphswap
from conftest import assert_close_to_roundoff
from graphswap.errors import QuantizationError
from graphswap.kernels import QuantScheme
from graphswap.kernels.quantized import activation_quantization, quantize_weights
from graphswap.multipliers import builtin
from graphswap.multipliers.builtins import builtin_multipliers
from graphswap.swap.weight_tuning import tune_operand, tune_weights, tuned_remap


# -- an independent implementation of the definition --------------------------------------------

def reference_errors(table, counts, encoding, signed, z_a, z_w):
    """E[q', q] = sum_r p(r) (approx(r, q') - exact(r, q))^2, straight from the definition:
    one activation code at a time, integer products, no algebra."""
    table = np.asarray(table, np.int64).reshape(256, 256)
    p = np.asarray(counts, np.float64) / np.sum(counts)
    if encoding == "symmetric":
        codes = list(range(-127, 128))
    else:
        codes = list(range(256))
    errors = np.zeros((len(codes), len(codes)))
    for r in range(256):
        if p[r] == 0:
            continue
        a = r - 256 if (signed and r > 127) else r
        approx = np.array([table[r, q % 256] - z_w * a - z_a * q + z_a * z_w for q in codes],
                          np.int64)
        exact = np.array([(a - z_a) * (q - z_w) for q in codes], np.int64)
        difference = (approx[:, None] - exact[None, :]).astype(np.float64)
        errors += p[r] * difference ** 2
    return np.array(codes), errors


def random_case(seed, signed):
    rng = np.random.default_rng(seed)
    values = np.where(np.arange(256) > 127, np.arange(256) - 256, np.arange(256)) if signed \
        else np.arange(256)
    exact = values[:, None] * values[None, :]
    noise = rng.integers(-600, 601, size=(256, 256)) * (rng.random((256, 256)) < 0.7)
    table = exact + noise
    counts = rng.integers(0, 50, size=256) * (rng.random(256) < 0.4)
    counts[rng.integers(0, 256)] += 1
    return table, counts


CASES = [("sign_magnitude", False, 0, 0), ("sign_magnitude", False, 37, 0),
         ("asymmetric", False, 12, 140), ("asymmetric", False, 0, 3),
         ("symmetric", True, 0, 0)]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("encoding, signed, z_a, z_w", CASES)
def test_remap_is_the_minimiser_of_its_definition(seed, encoding, signed, z_a, z_w):
    table, counts = random_case(seed, signed)
    codes, remapped, errors = tuned_remap(table, counts, encoding, signed=signed,
                                          activation_zero=z_a, weight_zero=z_w)
    ref_codes, reference = reference_errors(table, counts, encoding, signed, z_a, z_w)
    np.testing.assert_array_equal(codes, ref_codes)
    np.testing.assert_allclose(errors, reference, rtol=1e-9, atol=1e-6)
    index = {int(c): i for i, c in enumerate(codes)}
    chosen = np.array([reference[index[int(q2)], j] for j, q2 in enumerate(remapped)])
    best = reference.min(axis=0)
    np.testing.assert_allclose(chosen, best, rtol=1e-9, atol=1e-6)     # a minimiser every time
    own = reference[np.arange(len(codes)), np.arange(len(codes))]
    # a strictly better code exists -> the code changes; the identity is a minimiser -> kept
    better = best < own * (1 - 1e-6) - 1e-6
    assert better.any() and (remapped != codes).sum() == better.sum()
    np.testing.assert_array_equal(remapped[~better], codes[~better])
    # where the minimiser is unique it is the one chosen
    for j in np.flatnonzero(better)[:40]:
        order = np.argsort(reference[:, j])
        if reference[order[1], j] > reference[order[0], j] * (1 + 1e-6) + 1e-6:
            assert remapped[j] == codes[order[0]]


def test_exact_multiplier_changes_nothing():
    for name in ("mul8u_exact", "mul8s_exact"):
        multiplier = builtin(name)
        rng = np.random.default_rng(3)
        counts = rng.integers(0, 9, size=256)
        encoding = "symmetric" if multiplier.signed else "sign_magnitude"
        codes, remapped, _ = tuned_remap(multiplier.table, counts, encoding,
                                         signed=multiplier.signed,
                                         activation_zero=0 if multiplier.signed else 20)
        np.testing.assert_array_equal(remapped, codes)


# -- one weight tensor, every built-in multiplier -------------------------------------------------

def expected_product_error(table, counts, scheme, signed, original, stored):
    """sum over weights of E(code of `stored`, code of `original`), both quantized by the
    kernel's own quantizer, E from the independent reference."""
    q0, neg0, s0, z0, _ = quantize_weights(original, scheme)
    q1, neg1, s1, z1, _ = quantize_weights(stored, scheme)
    np.testing.assert_array_equal(s0, s1)          # the scales did not move
    np.testing.assert_array_equal(z0, z1)
    if neg0 is not None:
        np.testing.assert_array_equal(neg0, neg1)  # nor any weight's sign
    as_int = (lambda q: q.view(np.int8).astype(int)) if scheme.weights == "symmetric" \
        else (lambda q: q.astype(int))
    q0, q1 = as_int(q0), as_int(q1)
    _, zero = activation_quantization(np.zeros(0, np.float32), scheme, signed)[1:3] \
        if not signed else (None, 0)
    total = 0.0
    for z_w in np.unique(z0):
        codes, errors = REFERENCE_CACHE(table, counts, scheme.weights, signed, zero, int(z_w))
        first = int(codes[0])
        cols = z0 == z_w
        total += errors[q1[:, cols] - first, q0[:, cols] - first].sum()
    return total


_cache = {}


def REFERENCE_CACHE(table, counts, encoding, signed, z_a, z_w):   # noqa: N802
    key = (id(table), encoding, z_a, z_w)
    if key not in _cache:
        _cache[key] = reference_errors(table, counts, encoding, signed, z_a, z_w)
    return _cache[key]


@pytest.mark.parametrize("granularity", ["per_channel", "per_tensor"])
def test_never_increases_the_expected_product_error_on_any_builtin(granularity):
    rng = np.random.default_rng(7)
    weights = (rng.normal(size=(48, 6)) * np.array([0.1, 1.0, 3.0, 0.02, 0.5, 1.5])) \
        .astype(np.float32)
    activations = np.maximum(rng.normal(0.3, 1.0, size=4000), -0.2).astype(np.float32)
    improved = []
    for name in builtin_multipliers():
        multiplier = builtin(name)
        signed = multiplier.signed
        scheme = QuantScheme(granularity=granularity).resolve(signed).with_range(
            float(activations.min()), float(activations.max()))
        codes = activation_quantization(activations, scheme, signed)[0]
        counts = np.bincount(codes.reshape(-1), minlength=256)
        table = np.asarray(multiplier.table)
        tuned, summary = tune_operand(weights, scheme, table, counts, signed=signed)
        before = expected_product_error(table, counts, scheme, signed, weights, weights)
        after = expected_product_error(table, counts, scheme, signed, weights, tuned)
        assert after <= before * (1 + 1e-12) + 1e-9, name
        np.testing.assert_allclose([summary["error_before"], summary["error_after"]],
                                   [before, after], rtol=1e-6, atol=1e-4)
        if "drum" in name or "mitchell" in name:
            improved.append((name, after < before))
    # the remap exists for a reason: it strictly cuts the error of every multiplier with large,
    # structured errors (DRUM, Mitchell)
    assert len(improved) == 10 and all(better for _, better in improved), improved


def test_asymmetric_per_channel_uses_each_channels_zero_point():
    rng = np.random.default_rng(2)
    weights = np.stack([rng.uniform(-0.1, 1.0, 64), rng.uniform(-1.0, 0.2, 64),
                        rng.uniform(-0.5, 0.5, 64)], axis=1).astype(np.float32)
    scheme = QuantScheme(weights="asymmetric").resolve(False).with_range(-0.5, 2.0)
    counts = np.bincount(rng.integers(30, 200, 5000), minlength=256)
    table = np.asarray(builtin("mul8u_drum4").table)
    tuned, summary = tune_operand(weights, scheme, table, counts, signed=False)
    before = expected_product_error(table, counts, scheme, False, weights, weights)
    after = expected_product_error(table, counts, scheme, False, weights, tuned)
    assert summary["changed"] > 0 and after < before
    np.testing.assert_allclose(summary["error_after"], after, rtol=1e-6)


def test_non_finite_and_all_zero_channels_are_left_alone():
    weights = np.array([[0.5, 0.0, np.nan], [-0.3, 0.0, 0.2], [0.11, 0.0, 0.7]], np.float32)
    scheme = QuantScheme().resolve(False).with_range(0.0, 4.0)
    counts = np.bincount(np.arange(256), minlength=256)
    tuned, _ = tune_operand(weights, scheme, np.asarray(builtin("mul8u_drum3").table), counts,
                            signed=False)
    np.testing.assert_array_equal(tuned[:, 1:], weights[:, 1:])
    assert tuned[0, 0] == 0.5          # the channel's max |w| keeps its value


# -- layers and models ----------------------------------------------------------------------------

def every_type_model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(6, 3, padding="same", activation="relu", name="conv")(inputs)
    x = keras.layers.DepthwiseConv2D(3, depth_multiplier=2, activation="relu", name="dw")(x)
    x = keras.layers.SeparableConv2D(5, 3, activation="relu", name="sep")(x)
    x = keras.layers.Conv2DTranspose(4, 3, strides=2, name="tconv")(x)
    x = keras.layers.Reshape((81, 4))(x)
    x = keras.layers.Conv1D(3, 3, name="conv1d")(x)
    x = keras.layers.EinsumDense("btc,cd->btd", output_shape=(79, 5), name="einsum")(x)
    x = keras.layers.Flatten()(x)
    outputs = keras.layers.Dense(4, name="dense")(x)
    return keras.Model(inputs, outputs)


def product_error(layer, x, point_inputs=None):
    """Mean squared difference of the layer's approximate and exact-product outputs on x."""
    scheme = layer.current_quantization()
    approx = layer.numpy_product(x, quant=scheme)
    exact = layer.numpy_product(x, layer.arithmetic.exact_products(), quant=scheme)
    return float(np.mean((approx - exact) ** 2))


@pytest.mark.parametrize("kernel", ["mul8u_drum3", "mul8s_drum3"])
def test_every_table_driven_layer_type_is_tuned(kernel):
    model = every_type_model()
    rng = np.random.default_rng(0)
    data = rng.normal(size=(16, 8, 8, 3)).astype(np.float32)
    swapped = graphswap.rewrite_model(model, kernel, calibration_data=data)
    inputs = {}

    def keep(layer, x, point=None):
        if point is None:
            inputs[layer.name] = x

    layers = [layer for layer in swapped.layers if getattr(layer, "quantization", None)]
    for layer in layers:
        layer.observer = keep
    swapped(data)
    for layer in layers:
        layer.observer = None
    before = {layer.name: product_error(layer, inputs[layer.name]) for layer in layers}
    weights = {layer.name: [w.copy() for w in layer.get_weights()] for layer in layers}
    report = tune_weights(swapped, data)
    assert set(report.layers) == {layer.name for layer in layers} and not report.skipped
    for layer in layers:
        after = product_error(layer, inputs[layer.name])
        changed = any(not np.array_equal(a, b) for a, b in zip(weights[layer.name],
                                                                layer.get_weights()))
        assert changed, layer.name
        # the layer's own kernel, on the inputs it was tuned on: the approximate products are
        # closer to the exact ones (SeparableConv2D: both products, its pointwise on its own range)
        assert after < before[layer.name], (layer.name, before[layer.name], after)


def test_tuned_model_saves_reloads_and_exports_with_identical_outputs(digits, tmp_path):
    model = keras.models.load_model(graphswap_sample("cnn_bn.keras"))
    calibration = digits["x_train"][:128]
    swapped, report = graphswap.rewrite_model(model, "mul8u_drum4", calibration_data=calibration,
                                              weight_tuning=True, bias_correction="moments",
                                              return_report=True)
    text = report.format() if hasattr(report, "format") else str(report)
    assert "weight tuning" in text
    plain = graphswap.rewrite_model(model, "mul8u_drum4", calibration_data=calibration,
                                    bias_correction="moments")
    assert any(not np.array_equal(a, b) for a, b in zip(plain.get_weights(),
                                                        swapped.get_weights()))
    x = digits["x_test"][:40].astype(np.float32)
    expected = np.asarray(swapped(x, training=False))
    path = tmp_path / "tuned.keras"
    graphswap.io.save_model(swapped, path)
    reloaded = graphswap.load_model(path)
    np.testing.assert_array_equal(np.asarray(reloaded(x, training=False)), expected)
    for a, b in zip(reloaded.get_weights(), swapped.get_weights()):
        np.testing.assert_array_equal(a, b)
    # kept-kernel ONNX runs the tuned codes through the multiplier
    onnx_path = tmp_path / "tuned.kept.onnx"
    graphswap.export_model(reloaded, onnx_path, format="onnx", keep_kernels=True)
    session = graphswap.onnx_session(onnx_path)
    got = session.run(None, {session.get_inputs()[0].name: x})[0]
    assert_close_to_roundoff(got, expected, terms=288)
    # the lowered SavedModel is the stock model with the tuned weights
    stock = keras.models.clone_model(model)
    stock.set_weights(swapped.get_weights())
    saved = tmp_path / "tuned_savedmodel"
    graphswap.export_model(reloaded, saved, format="savedmodel")
    import tensorflow as tf
    served = tf.saved_model.load(str(saved)).signatures["serving_default"]
    out = list(served(tf.constant(x)).values())[0].numpy()
    assert_close_to_roundoff(out, np.asarray(stock(x, training=False)), terms=288)


def graphswap_sample(name):
    from conftest import REPO
    return REPO / "sample_models" / name


def test_weight_tuning_needs_calibration_data(lenet):
    with pytest.raises(QuantizationError, match="weight tuning reads each layer's calibrated"):
        graphswap.rewrite_model(lenet, "mul8u_drum4", weight_tuning=True)


# -- the command line and the default recipe -----------------------------------------------------

def invoke(*args):
    from click.testing import CliRunner

    from graphswap.cli import main
    return CliRunner().invoke(main, [str(a) for a in args])


def test_convert_calibrate_alone_applies_the_default_recipe_and_says_so(tmp_path):
    from conftest import SAMPLE_DATA, SAMPLE_MODEL
    base = ["convert", SAMPLE_MODEL, "-k", "mul8u_drum4", "--calibrate", SAMPLE_DATA,
            "--calibration-samples", 32]
    result = invoke(*base, "-o", tmp_path / "default.keras")
    assert result.exit_code == 0, result.output
    assert "zero-training recipe: static calibration + moments bias compensation (the " \
           "default" in result.output
    assert "bias compensation on 32 samples" in result.output
    assert "weight tuning (multiplier-aware" not in result.output
    default = keras.models.load_model(tmp_path / "default.keras")
    assert any(layer.output_correction for layer in default.layers
               if hasattr(layer, "output_correction"))
    result = invoke(*base, "--bias-correction", "none", "--weight-tuning",
                    "-o", tmp_path / "tuned.keras")
    assert result.exit_code == 0, result.output
    assert "zero-training recipe: static calibration + weight tuning (the default" \
           in result.output
    assert "bias compensation on" not in result.output
    assert "weight tuning (multiplier-aware weight codes) on 32 samples:" in result.output
    tuned = keras.models.load_model(tmp_path / "tuned.keras")
    assert not any(layer.output_correction for layer in tuned.layers
                   if hasattr(layer, "output_correction"))
    stock = keras.models.load_model(SAMPLE_MODEL)
    assert any(not np.array_equal(a, b) for a, b in zip(stock.get_weights(), tuned.get_weights()))


def test_weight_tuning_without_calibration_is_a_usage_error(tmp_path):
    from conftest import SAMPLE_MODEL
    result = invoke("convert", SAMPLE_MODEL, "-k", "mul8u_drum4", "--weight-tuning",
                    "-o", tmp_path / "out.keras")
    assert result.exit_code == 1 and "--weight-tuning needs --calibrate DATA" in result.output
    assert not (tmp_path / "out.keras").exists()


def test_rewrite_model_default_recipe_with_and_without_calibration(lenet, digits):
    x = digits["x_train"][:32]
    _, report = graphswap.rewrite_model(lenet, "mul8u_drum4", calibration_data=x,
                                        return_report=True)
    notes = "\n".join(report.notes)
    assert "zero-training recipe: static calibration + moments bias compensation" in notes
    _, report = graphswap.rewrite_model(lenet, "mul8u_drum4", return_report=True)
    assert "zero-training recipe" not in "\n".join(report.notes)
    with pytest.raises(QuantizationError, match="weight_tuning must be True, False or 'default'"):
        graphswap.rewrite_model(lenet, "mul8u_drum4", calibration_data=x, weight_tuning="yes")


def test_batchnorm_reestimation_is_in_the_default_recipe_where_the_model_has_batchnorm(
        lenet, digits, tmp_path):
    from conftest import REPO, SAMPLE_DATA
    cnn_bn = REPO / "sample_models" / "cnn_bn.keras"
    model = keras.models.load_model(cnn_bn)
    x = digits["x_train"][:64]
    default, report = graphswap.rewrite_model(model, "mul8s_drum3", calibration_data=x,
                                              return_report=True)
    explicit = graphswap.rewrite_model(model, "mul8s_drum3", calibration_data=x,
                                       recalibrate_bn=True)
    off, off_report = graphswap.rewrite_model(model, "mul8s_drum3", calibration_data=x,
                                              recalibrate_bn=False, return_report=True)
    for name in ("bn1", "bn2", "bn3"):
        statistics = [m.get_layer(name).moving_mean.numpy() for m in (default, explicit, off)]
        np.testing.assert_array_equal(statistics[0], statistics[1])
        assert not np.array_equal(statistics[0], statistics[2])
        np.testing.assert_array_equal(statistics[2], model.get_layer(name).moving_mean.numpy())
    def applied(notes) -> str:   # the recipe line's steps, before its note on the default
        return next(n for n in notes if n.startswith("zero-training recipe:")).split(" (")[0]

    calibrated = "zero-training recipe: static calibration + moments bias compensation"
    assert applied(report.notes) == calibrated + " + BatchNorm re-estimation"
    assert applied(off_report.notes) == calibrated
    # no BatchNorm left (none in lenet; cnn_bn's all folded): nothing to re-estimate, none named
    for source, options, expected in ((lenet, {}, calibrated),
                                      (model, {"fold_batchnorm": True}, calibrated.replace(
                                          "recipe: ", "recipe: BatchNorm folding + "))):
        _, plain = graphswap.rewrite_model(source, "mul8s_drum3", calibration_data=x,
                                           return_report=True, **options)
        assert applied(plain.notes) == expected
    with pytest.raises(QuantizationError, match="recalibrate_bn must be True, False or"):
        graphswap.rewrite_model(model, "mul8s_drum3", calibration_data=x, recalibrate_bn="yes")
    # the command line: --calibrate alone re-estimates, --no-recalibrate-bn opts out
    base = ["convert", cnn_bn, "-k", "mul8s_drum3", "--calibrate", SAMPLE_DATA,
            "--calibration-samples", 64]
    for flag, stem in ((None, "default"), ("--no-recalibrate-bn", "off")):
        result = invoke(*base, *([flag] if flag else []), "-o", tmp_path / f"{stem}.keras")
        assert result.exit_code == 0, result.output
        assert ("+ BatchNorm re-estimation (the default" in result.output) == (flag is None)
        saved = keras.models.load_model(tmp_path / f"{stem}.keras")
        reference = default if flag is None else off
        np.testing.assert_allclose(saved.get_layer("bn2").moving_variance.numpy(),
                                   reference.get_layer("bn2").moving_variance.numpy(), rtol=1e-6)


def test_the_default_recipe_recovers_more_than_calibration_alone(digits):
    """The default recipe's measured gain on the harder model of docs/RECOVERY.md (resnet_bn,
    shipped in benchmarks/, float 93.06%): with mul8s_drum3, calibrated on the first 512 training
    digits, test accuracy with calibration alone, with `moments` alone and with the default
    (`moments` + BatchNorm re-estimation: this model has BatchNorm) - the table's 35.28 / 57.78 /
    73.89."""
    from conftest import REPO
    model = keras.models.load_model(REPO / "benchmarks" / "resnet_bn.keras")
    calibration = digits["x_train"][:512]
    x, y = digits["x_test"], digits["y_test"]

    def accuracy(**options):
        swapped = graphswap.rewrite_model(model, "mul8s_drum3", calibration_data=calibration,
                                          **options)
        return float(np.mean(np.asarray(swapped(x, training=False)).argmax(axis=1) == y))

    # the table's columns: calibration from the float forward (the previous default)
    alone = accuracy(bias_correction=None, recalibrate_bn=False, calibration_source="float",
                     weight_tuning=False, dynamic_fallback=False)
    moments = accuracy(recalibrate_bn=False, calibration_source="float",
                       weight_tuning=False)
    default = accuracy()
    print(f"resnet_bn, mul8s_drum3: calibrated {alone:.4f}, + moments {moments:.4f}, "
          f"default {default:.4f}")
    # each step of the default recovers a margin of tens of test images (one image = 0.28)
    assert moments >= alone + 0.10, (alone, moments)
    assert default >= moments + 0.08, (moments, default)


@pytest.mark.parametrize("granularity", ["per_channel", "per_tensor"])
def test_8xn_weights_are_tuned_among_their_own_n_bit_codes(granularity):
    """An 8x4 multiplier's weights are tuned at 4 bits: re-quantized by the kernel's quantizer at
    4 bits they keep their scales and signs, every code stays in 0..15, and the expected product
    error over those codes (the independent definition) does not grow - it drops for a DRUM
    table. (Tuning used to quantize at 8 bits whatever the multiplier's weight width.)"""
    import dataclasses
    bits = 4
    multiplier = dataclasses.replace(builtin("mul8u_drum3"), weight_bits=bits)
    rng = np.random.default_rng(3)
    weights = (rng.normal(size=(40, 5)) * np.array([0.1, 1.0, 3.0, 0.5, 1.5])).astype(np.float32)
    activations = np.maximum(rng.normal(0.3, 1.0, size=4000), -0.2).astype(np.float32)
    scheme = QuantScheme(granularity=granularity).resolve(False).with_range(
        float(activations.min()), float(activations.max()))
    codes = activation_quantization(activations, scheme, False)[0]
    counts = np.bincount(codes.reshape(-1), minlength=256)
    table = np.asarray(multiplier.table)
    tuned, summary = tune_operand(weights, scheme, table, counts, signed=False, bits=bits)
    q0, neg0, s0, _, _ = quantize_weights(weights, scheme, bits)
    q1, neg1, s1, _, _ = quantize_weights(tuned, scheme, bits)
    np.testing.assert_array_equal(s0, s1)
    np.testing.assert_array_equal(neg0, neg1)
    assert q1.max() <= 2 ** bits - 1 and summary["changed"] > 0
    zero = activation_quantization(np.zeros(0, np.float32), scheme, False)[2]
    _, errors = reference_errors(table, counts, "sign_magnitude", False, zero, 0)
    q0, q1 = q0.astype(int), q1.astype(int)
    before, after = errors[q0, q0].sum(), errors[q1, q0].sum()
    assert after < before
    np.testing.assert_allclose([summary["error_before"], summary["error_after"]],
                               [before, after], rtol=1e-6)
