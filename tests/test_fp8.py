"""8-bit floating-point multipliers (graphswap/kernels/fp8.py, graphswap/multipliers/fp8_circuits.py,
native_kernels/src/lut_float.c): quantization bit for bit against ml_dtypes (TensorFlow's own
float8 types), the kernels against independent numpy references, gradients, user circuits (C and
.npy), bad input, and the CLI end to end."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import keras
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner
from conftest import small_data, small_model

import graphswap
from graphswap.cli import main
from graphswap.errors import KernelSpecError, QuantizationError, UnsupportedLayerError
from graphswap.kernels import QuantScheme, resolve_kernel
from graphswap.kernels.fp8 import E4M3, E5M2, decode, encode
from graphswap.native import conv_geometry

FORMATS = [(E4M3, ml_dtypes.float8_e4m3fn), (E5M2, ml_dtypes.float8_e5m2)]
MITCHELL = Path(__file__).resolve().parents[1] / "sample_models" / "multipliers" / \
    "fp8_e4m3_mitchell.c"


def _ml_codes(x, dtype, fmt):
    """ml_dtypes' codes of clip(x, -max, max): OCP's saturating conversion (NaN stays NaN)."""
    return np.clip(np.asarray(x, np.float32), -fmt.max_finite, fmt.max_finite) \
        .astype(dtype).view(np.uint8)


def _float32_cases(fmt) -> np.ndarray:
    """float32 values of every class: all 2^20 patterns of the top 20 bits (every exponent, so
    normals, float32 subnormals, huge values that saturate, infinities and NaNs of both signs),
    random patterns, signed zeros, and around every FP8 value: the exact midpoints to its
    neighbours (ties) and the float32 values one ulp either side of them and of the value."""
    rng = np.random.default_rng(1)
    prefixes = (np.arange(1 << 20, dtype=np.uint32) << np.uint32(12)) \
        | rng.integers(0, 1 << 12, 1 << 20, dtype=np.uint32)
    random = rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32)
    grid = fmt.values[np.isfinite(fmt.values)].astype(np.float64)
    grid = np.unique(np.concatenate([grid, [fmt.max_finite * 1.0625, fmt.max_finite * 2]]))
    middles = ((grid[1:] + grid[:-1]) / 2).astype(np.float32)
    near = np.concatenate([middles, grid.astype(np.float32)])
    around = np.concatenate([near, np.nextafter(near, np.float32(np.inf)),
                             np.nextafter(near, np.float32(-np.inf))])
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45,
                         np.finfo(np.float32).max, -np.finfo(np.float32).max], np.float32)
    nan_payloads = np.array([0x7FC00001, 0xFFC12345, 0x7F800001, 0xFF800001], np.uint32)
    return np.concatenate([prefixes.view(np.float32), random.view(np.float32), around, -around,
                           specials, nan_payloads.view(np.float32)])


@pytest.mark.parametrize("fmt,dtype", FORMATS, ids=["e4m3", "e5m2"])
def test_decode_matches_ml_dtypes_for_every_code(fmt, dtype):
    ours = fmt.values
    theirs = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)
    assert np.array_equal(np.isnan(ours), np.isnan(theirs))
    finite = ~np.isnan(theirs)
    assert np.array_equal(ours[finite].view(np.uint32), theirs[finite].view(np.uint32))  # -0 too
    assert np.isnan(ours).sum() == (2 if fmt is E4M3 else 6)
    assert np.isinf(ours).sum() == (0 if fmt is E4M3 else 2)
    assert float(np.nanmax(ours[np.isfinite(ours)])) == fmt.max_finite


@pytest.mark.parametrize("fmt,dtype", FORMATS, ids=["e4m3", "e5m2"])
def test_encode_is_bit_exact_with_ml_dtypes_for_every_float32_class(fmt, dtype):
    x = _float32_cases(fmt)
    ours = encode(x, fmt)
    theirs = _ml_codes(x, dtype, fmt)
    wrong = np.flatnonzero(ours != theirs)
    assert wrong.size == 0, (f"{wrong.size} of {x.size} differ, e.g. {x[wrong[:5]]}: ours "
                             f"{ours[wrong[:5]]}, ml_dtypes {theirs[wrong[:5]]}")
    # within range no clipping is involved: ml_dtypes' own cast, unchanged
    inside = np.abs(x) <= fmt.max_finite
    assert np.array_equal(ours[inside], x[inside].astype(dtype).view(np.uint8))
    # the classes named explicitly: saturation (infinity too), NaN, signed zero, ties to even
    top = fmt.max_code
    assert list(encode(np.array([np.inf, -np.inf, 1e30, -fmt.max_finite * 1.5], np.float32),
                       fmt)) == [top, 0x80 | top, top, 0x80 | top]
    assert list(encode(np.array([np.nan, -np.nan, 0.0, -0.0], np.float32), fmt)) == \
        [fmt.nan_code, 0x80 | fmt.nan_code, 0x00, 0x80]
    smallest = float(fmt.values[1])           # the smallest subnormal
    assert list(encode(np.array([smallest / 2, smallest * 1.5, smallest * 2.5], np.float32),
                       fmt)) == [0, 2, 2]       # ties go to the even code


def _reference_quantize(t, amax, fmt, dtype):
    scale = np.where(amax > 0, np.asarray(amax, np.float64) / fmt.max_finite, 1.0)
    scaled = (np.asarray(t, np.float64) / scale).astype(np.float32)
    values = np.clip(scaled, -fmt.max_finite, fmt.max_finite).astype(dtype).astype(np.float32)
    return values, scale


def _reference_matmul(a, b, fmt, dtype, per_channel=True, activation_amax=None):
    """Independent reference: ml_dtypes casts, products in float32, sums in float64."""
    amax_a = np.abs(a).max() if activation_amax is None else activation_amax
    amax_b = np.abs(b).max(axis=0) if per_channel else np.full(b.shape[1], np.abs(b).max())
    va, sa = _reference_quantize(a, amax_a, fmt, dtype)
    vb, sb = _reference_quantize(b, amax_b, fmt, dtype)
    products = va[:, :, None] * vb[None, :, :]          # float32 products (exact)
    sums = products.astype(np.float64).sum(axis=1)
    bound = np.abs(products).astype(np.float64).sum(axis=1)
    return sums * (sa * sb)[None, :], bound * (sa * sb)[None, :]


@pytest.mark.parametrize("fmt,dtype", FORMATS, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("granularity", ["per_channel", "per_tensor"])
def test_exact_fp8_matmul_matches_numpy_reference(fmt, dtype, granularity):
    rng = np.random.default_rng(2)
    a = (rng.standard_normal((17, 40)) * np.exp(rng.uniform(-4, 4, (17, 40)))).astype(np.float32)
    b = (rng.standard_normal((40, 9)) * np.exp(rng.uniform(-3, 3, 9))[None, :]).astype(np.float32)
    kernel = resolve_kernel(f"fp8_{fmt.name}")
    got = kernel.matmul(a, b, quant=QuantScheme(granularity=granularity))
    want, bound = _reference_matmul(a, b, fmt, dtype, granularity == "per_channel")
    # float32 sums in another order: within k float32 roundings of the terms' magnitudes
    assert np.all(np.abs(got - want) <= 40 * 2.0 ** -23 * bound + 1e-30)
    # and FP8 is coarse: the result is visibly not the float product
    assert np.abs(got - a @ b).max() > 1e-3 * np.abs(a @ b).max()
    # static activations: values beyond the calibrated range saturate
    static = QuantScheme(activations="static", activation_range=(-1.0, 2.0),
                         granularity=granularity)
    got_static = kernel.matmul(a, b, quant=static)
    want_static, bound = _reference_matmul(a, b, fmt, dtype, granularity == "per_channel",
                                           activation_amax=2.0)
    assert np.all(np.abs(got_static - want_static) <= 40 * 2.0 ** -23 * bound + 1e-30)


@pytest.mark.parametrize("fmt,dtype", FORMATS, ids=["e4m3", "e5m2"])
def test_exact_fp8_conv2d_matches_tensorflow_on_quantized_operands(fmt, dtype):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 9, 8, 3)).astype(np.float32)
    w = rng.standard_normal((3, 3, 3, 4)).astype(np.float32)
    geometry = conv_geometry(x.shape, w.shape, (2, 1), (1, 1), "same")
    got = resolve_kernel(f"fp8_{fmt.name}").conv2d(x, w, geometry)
    vx, sx = _reference_quantize(x, np.abs(x).max(), fmt, dtype)
    vw, sw = _reference_quantize(w, np.abs(w).reshape(-1, 4).max(axis=0), fmt, dtype)
    want = tf.nn.conv2d(vx.astype(np.float64), vw.astype(np.float64), (2, 1), "SAME").numpy() \
        * sx * sw
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _table_file(tmp_path, table, name="table.npy"):
    path = tmp_path / name
    np.save(path, table)
    return path


def test_table_kernel_is_the_float32_running_sum_of_table_entries(tmp_path):
    rng = np.random.default_rng(4)
    table = rng.standard_normal((256, 256)).astype(np.float32)
    kernel = resolve_kernel(f"fp8_e5m2:{_table_file(tmp_path, table)}")
    a = rng.standard_normal((13, 57)).astype(np.float32)
    b = rng.standard_normal((57, 6)).astype(np.float32)
    sa = float(np.abs(a).max()) / E5M2.max_finite     # scales in float64
    qa = encode((a.astype(np.float64) / sa).astype(np.float32), E5M2)
    sb = np.abs(b).max(axis=0).astype(np.float64) / E5M2.max_finite
    qb = encode((b.astype(np.float64) / sb).astype(np.float32), E5M2)
    running = np.zeros((13, 6), np.float32)
    for k in range(57):   # float32 running sum in increasing k: what the C kernel promises
        running += table[qa[:, k][:, None], qb[k][None, :]]
    want = (running.astype(np.float64) * (sa * sb)).astype(np.float32)
    assert np.array_equal(kernel.matmul(a, b), want)
    # the same table through the convolution path: windows as patches x the table GEMM
    x = rng.standard_normal((2, 5, 5, 2)).astype(np.float32)
    w = rng.standard_normal((2, 2, 2, 3)).astype(np.float32)
    geometry = conv_geometry(x.shape, w.shape, (1, 1), (1, 1), "valid")
    patches = np.stack([x[:, i:i + 2, j:j + 2, :].reshape(2, -1) for i in range(4)
                        for j in range(4)], axis=1).reshape(-1, 8)
    expected = kernel.matmul(patches, w.reshape(-1, 3)).reshape(2, 4, 4, 3)
    np.testing.assert_array_equal(kernel.conv2d(x, w, geometry), expected)


def test_exact_table_file_equals_builtin_and_mitchell_c_matches_numpy(tmp_path):
    values = E4M3.values.astype(np.float64)
    exact = np.multiply.outer(values, values).astype(np.float32)
    exact[~np.isfinite(exact)] = 0.0
    from_table = resolve_kernel(f"fp8_e4m3:{_table_file(tmp_path, exact)}")
    rng = np.random.default_rng(5)
    a = rng.standard_normal((8, 30)).astype(np.float32)
    b = rng.standard_normal((30, 4)).astype(np.float32)
    builtin = resolve_kernel("fp8_e4m3").matmul(a, b)
    np.testing.assert_allclose(from_table.matmul(a, b), builtin, rtol=1e-5,
                               atol=1e-6 * np.abs(builtin).max())
    # the shipped approximate C multiplier, all 65536 code pairs, against Mitchell in numpy
    shutil.copy(MITCHELL, tmp_path / MITCHELL.name)
    mitchell = resolve_kernel(f"fp8_e4m3:{tmp_path / MITCHELL.name}")
    table = mitchell.products_table()
    magnitudes = np.abs(values)
    exponent = np.floor(np.log2(np.where(magnitudes > 0, magnitudes, 1.0)))
    fraction = np.where(magnitudes > 0, magnitudes / 2.0 ** exponent - 1.0, 0.0)
    x, y = fraction[:, None], fraction[None, :]
    significand = np.where(x + y < 1, 1 + x + y, 2 * (x + y))
    sign = np.where((np.arange(256)[:, None] ^ np.arange(256)[None, :]) & 0x80, -1.0, 1.0)
    want = sign * significand * 2.0 ** (exponent[:, None] + exponent[None, :])
    want[(magnitudes[:, None] == 0) | (magnitudes[None, :] == 0)] = 0.0
    finite = np.isfinite(values)
    both = finite[:, None] & finite[None, :]
    assert np.array_equal(table[both], want[both].astype(np.float32))
    assert np.isnan(table[~both]).all()
    assert (table[both] != exact[both]).mean() > 0.5      # it is approximate
    assert mitchell.to_config() == {"spec": f"fp8_e4m3:{tmp_path / MITCHELL.name}",
                                    "path": str(tmp_path / MITCHELL.name),
                                    "sha256": mitchell.sha256}


def test_outputs_of_non_finite_inputs_are_nan():
    kernel = resolve_kernel("fp8_e4m3")
    a = np.ones((3, 4), np.float32)
    b = np.ones((4, 2), np.float32)
    a[1, 2] = np.nan
    b[0, 1] = np.inf
    out = kernel.matmul(a, b)
    assert np.isnan(out[1]).all() and np.isnan(out[:, 1]).all()
    assert out[0, 0] == 4.0 and out[2, 0] == 4.0


def test_gradients_native_and_kernel_match_numeric_and_lut_grad_is_refused():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((5, 7)).astype(np.float32)
    weights = rng.standard_normal((7, 3)).astype(np.float32)
    c = rng.standard_normal((5, 3)).astype(np.float32)

    def loss_and_grads(backward):
        inputs = keras.Input((7,))
        dense = keras.layers.Dense(3, use_bias=False, name="d")
        model = keras.Model(inputs, dense(inputs))
        dense.set_weights([weights])
        swapped = graphswap.rewrite_model(model, kernel="fp8_e4m3", backward=backward)
        xt = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(xt)
            loss = tf.reduce_sum(swapped(xt) * c)
        dx, dw = tape.gradient(loss, [xt, swapped.get_layer("d").kernel])
        return loss, dx.numpy(), dw.numpy()

    loss, dx, dw = loss_and_grads("native")
    # forward: the FP8 product; backward: the float product's gradients (straight-through)
    want_y = resolve_kernel("fp8_e4m3").matmul(x, weights)
    np.testing.assert_allclose(float(loss), float((want_y * c).sum()), rtol=1e-5)
    np.testing.assert_allclose(dx, c @ weights.T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dw, x.T @ c, rtol=1e-5, atol=1e-6)
    # numerically: a central difference of sum(c * (x W)) in float64
    eps, i, j = 1e-3, 2, 1
    shifted = [weights.astype(np.float64) for _ in range(2)]
    shifted[0][i, j] += eps
    shifted[1][i, j] -= eps
    numeric = ((x @ shifted[0] * c).sum() - (x @ shifted[1] * c).sum()) / (2 * eps)
    assert abs(dw[i, j] - numeric) < 1e-3 * max(1.0, abs(numeric))
    # backward="kernel": the gradient products run through the FP8 kernel (dynamic ranges)
    _, dx_kernel, dw_kernel = loss_and_grads("kernel")
    fp8 = resolve_kernel("fp8_e4m3")
    np.testing.assert_allclose(dx_kernel, fp8.matmul(c, weights.T), rtol=1e-5, atol=1e-6)
    assert not np.allclose(dx_kernel, dx, rtol=1e-4, atol=0)
    with pytest.raises(UnsupportedLayerError, match=r"layer 'd'.*lut_grad.*fp8_e4m3.*8-bit "
                                                    r"float multiplier.*'native' or 'kernel'"):
        loss_and_grads("lut_grad")


def test_bad_tables_and_specs_get_one_clear_error(tmp_path):
    cases = {
        "shape.npy": (np.zeros((256, 255), np.float32), r"shape \(256, 255\); allowed: \(256, 256\)"),
        "flat.npy": (np.zeros(65536, np.float32), r"shape \(65536,\); allowed: \(256, 256\)"),
        "float64.npy": (np.zeros((256, 256)), r"dtype float64; allowed: float32"),
        "int32.npy": (np.zeros((256, 256), np.int32), r"dtype int32; allowed: float32"),
        "float16.npy": (np.zeros((256, 256), np.float16), r"dtype float16; allowed: float32"),
        "objects.npy": (np.array([{"a": 1}], dtype=object), r"pickled Python objects"),
    }
    for name, (array, message) in cases.items():
        np.save(tmp_path / name, array, allow_pickle=True)
        with pytest.raises(KernelSpecError, match=message):
            resolve_kernel(f"fp8_e4m3:{tmp_path / name}")
    (tmp_path / "garbage.npy").write_bytes(b"not an npy file at all")
    with pytest.raises(KernelSpecError, match=r"garbage.npy is not a readable .npy file"):
        resolve_kernel(f"fp8_e4m3:{tmp_path / 'garbage.npy'}")
    infinite = np.ones((256, 256), np.float32)
    infinite[3, 200] = np.inf
    with pytest.raises(KernelSpecError, match=r"0x03 x 0xc8 is inf; .*must be finite"):
        resolve_kernel(f"fp8_e4m3:{_table_file(tmp_path, infinite, 'inf.npy')}")
    with pytest.raises(KernelSpecError, match=r"file part must be a C source \(.c.*\.npy"):
        resolve_kernel(f"fp8_e5m2:{tmp_path / 'table.lut'}")
    with pytest.raises(KernelSpecError, match=r"FP8 multiplier table not found"):
        resolve_kernel(f"fp8_e5m2:{tmp_path / 'missing.npy'}")
    (tmp_path / "int_mul.c").write_text(
        "#include <stdint.h>\nuint16_t mul(uint8_t a, uint8_t b) { return a * b; }\n")
    with pytest.raises(KernelSpecError, match=r"no FP8 multiplier found \(functions seen: mul\); "
                                              r"expected float NAME\(uint8_t a, uint8_t b\)"):
        resolve_kernel(f"fp8_e4m3:{tmp_path / 'int_mul.c'}")
    with pytest.raises(QuantizationError, match=r"weight encoding 'sign_magnitude' cannot run"):
        resolve_kernel("fp8_e4m3").matmul(np.ones((1, 2), np.float32), np.ones((2, 1), np.float32),
                                          quant=QuantScheme(weights="sign_magnitude"))


def test_cli_fp8_end_to_end_convert_evaluate_finetune_sweep_exports(tmp_path):
    runner = CliRunner()
    model = small_model()
    x, y = small_data()
    model.fit(x, y, epochs=3, verbose=0)
    model_path = tmp_path / "small.keras"
    model.save(model_path)
    data = tmp_path / "data.npz"
    np.savez(data, x_train=x, y_train=y, x_test=x, y_test=y)
    table = tmp_path / "mitchell_e4m3.c"
    shutil.copy(MITCHELL, table)
    converted = tmp_path / "fp8.keras"

    def ok(args):
        result = runner.invoke(main, [str(a) for a in args])
        assert result.exit_code == 0, result.output
        return result.output

    ok(["convert", model_path, "--kernel", f"fp8_e4m3:{table}", "--calibrate", data,
        "-o", converted])
    reloaded = keras.models.load_model(converted)
    dense = reloaded.get_layer("out")
    assert dense.arithmetic.spec == f"fp8_e4m3:{table}"
    assert dense.quantization.activations == "static"
    # the reloaded model computes the FP8 product: the kernel applied to the conv's output
    features = keras.Model(reloaded.inputs, reloaded.get_layer("flat").output)(x[:4]).numpy()
    correction = dense.output_correction or {}   # what compensation set, if anything
    gain = np.asarray(correction.get("gain") or 1.0, np.float32)
    offset = np.asarray(correction.get("offset") or 0.0, np.float32)
    logits = dense.arithmetic.matmul(features, dense.kernel.numpy(),
                                     quant=dense.current_quantization(None)) * gain + offset \
        + dense.bias.numpy()
    np.testing.assert_allclose(reloaded(x[:4]).numpy(), tf.nn.softmax(logits).numpy(),
                               rtol=1e-5, atol=1e-6)
    out = ok(["evaluate", model_path, "--data", data, "-k", "fp8_e4m3", "-k", "fp8_e5m2"])
    assert "fp8_e4m3" in out and "fp8_e5m2" in out
    tuned = tmp_path / "tuned.keras"
    ok(["finetune", converted, "--data", data, "--epochs", "1", "--batch-size", "16",
        "-o", tuned])
    assert keras.models.load_model(tuned).get_layer("conv").arithmetic.spec == \
        f"fp8_e4m3:{table}"
    sweep = tmp_path / "sweep.json"
    ok(["sweep", model_path, "--data", data, "-k", "fp8_e5m2", "-o", sweep])
    kernel_map = json.loads(sweep.read_text())
    assert "fp8_e5m2" in json.dumps(kernel_map)
    lowered = tmp_path / "lowered.onnx"
    kept = tmp_path / "kept.onnx"
    ok(["export", tuned, "-o", lowered])
    out = ok(["export", tuned, "--keep-kernels", "-o", kept])
    assert "verified against the swapped Keras model" in out
    session = graphswap.io.onnx_ops.session(str(kept))
    swapped = keras.models.load_model(tuned)
    name = session.get_inputs()[0].name
    np.testing.assert_allclose(session.run(None, {name: x[:5]})[0], swapped(x[:5]).numpy(),
                               rtol=1e-5, atol=1e-6)
    bad = runner.invoke(main, ["convert", str(model_path), "--kernel",
                               f"fp8_e4m3:{tmp_path / 'data.npz'}", "-o",
                               str(tmp_path / "bad.keras")])
    assert bad.exit_code == 1
    assert bad.output.strip().startswith("Error: ") and len(bad.output.strip().splitlines()) == 1
    assert "Traceback" not in bad.output and not os.path.exists(tmp_path / "bad.keras")


def test_a_model_naming_an_untrusted_or_changed_fp8_source_is_refused(tmp_path, monkeypatch):
    from graphswap.errors import KernelTrustError, ModelLoadError
    from graphswap.kernels import clear_cache
    from graphswap.kernels import trust as kernel_trust

    monkeypatch.setenv("GRAPHSWAP_CONFIG_DIR", str(tmp_path / "config"))  # an empty trust store
    source = tmp_path / "approx.c"
    shutil.copy(MITCHELL, source)
    swapped = graphswap.rewrite_model(small_model(), kernel=f"fp8_e4m3:{source}")
    saved = tmp_path / "swapped.keras"
    swapped.save(saved)
    x, _ = small_data(4)
    want = swapped(x).numpy()
    kernel_trust.clear_session_trust()
    clear_cache()
    with pytest.raises((KernelTrustError, ModelLoadError),
                       match=r"refusing to load the FP8 multiplier source .*approx.c \(sha256 "
                             r"[0-9a-f]{64}\): it is not trusted"):
        graphswap.load_model(saved)
    graphswap.trust(str(source))
    np.testing.assert_array_equal(graphswap.load_model(saved)(x).numpy(), want)
    source.write_text(MITCHELL.read_text().replace("2 * fraction", "2 * fraction + 1"))
    clear_cache()
    with pytest.raises((KernelTrustError, ModelLoadError),
                       match=r"FP8 multiplier source .*approx.c has changed since the model was "
                             r"saved"):
        graphswap.load_model(saved)


def test_explore_chooses_among_fp8_circuits_and_refuses_mixed_families(tmp_path):
    from graphswap.errors import GraphswapError
    from graphswap.research.exploration.circuits import load_library

    values = E5M2.values.astype(np.float64)
    coarse = np.multiply.outer(values, values)
    coarse = np.where(np.isfinite(coarse), coarse * 0.75, 0.0).astype(np.float32)  # 25% low
    table = _table_file(tmp_path, coarse, "low.npy")
    metrics = {"exact": {"power": 0.3}, "low": {"power": 0.1}}
    library = load_library([f"fp8_e5m2:{table}"], metrics)
    assert library.exact.spec == "fp8_e5m2" and library.names() == ["low"]
    assert library.by_name("low").metric("power") == 0.1
    for mixed, message in ((["fp8_e4m3", f"fp8_e5m2:{table}"], "mixes fp8_e4m3 and fp8_e5m2"),
                           (["mul8s_drum4", "fp8_e4m3"], "mixes fp8_e4m3 and integer")):
        with pytest.raises(GraphswapError, match=message):
            load_library(mixed, metrics)
    model = small_model()
    x, y = small_data()
    model.fit(x, y, epochs=3, verbose=0)
    model.save(tmp_path / "small.keras")
    np.savez(tmp_path / "data.npz", x_test=x, y_test=y)
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    front = tmp_path / "front.json"
    result = CliRunner().invoke(main, [
        "explore", str(tmp_path / "small.keras"), "--data", str(tmp_path / "data.npz"),
        "--library", f"fp8_e5m2:{table}", "--metrics", str(tmp_path / "metrics.json"),
        "--budget", "100", "-o", str(front)])
    assert result.exit_code == 0, result.output
    assert "all 4 assignments measured" in result.output
    points = json.loads(front.read_text())
    assert "low" in json.dumps(points)
