"""Nx8 multipliers: an N-bit activation times an 8-bit weight.

Tables against the C function for every operand pair, header metrics at the circuit's own output
width, the fused C kernels against tests/reference.py (N-bit activations, dynamic and static) on
every ISA path, a model converted with an exact 4x8 multiplier against an independent numpy
forward pass with 4-bit activations, the XLA device path bit for bit with C, the CLI end to end,
and bad input (widths graphswap cannot run or infer) with one clear error."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import graphswap
from graphswap.errors import KernelSpecError
from graphswap.kernels import QuantScheme, resolve_kernel, trust
from graphswap.multipliers import checks
from graphswap.multipliers.metrics import metrics

import reference

EXAMPLES = Path(__file__).resolve().parent.parent / "sample_models" / "multipliers"
EXAMPLE = "mul4x8u_gsbam4.c"

EXACT_4X8 = """
#include <stdint.h>
uint64_t mul4x8u_exact(const uint64_t A /* 4-bit unsigned operand */,
                       const uint64_t B /* 8-bit unsigned operand */)
{ return (A & 15u) * (B & 255u); }
"""


def _bam(bits, vbl):
    """Independent numpy model of the example's broken-array circuit: (2^N, 256) products."""
    a = np.arange(2 ** bits)[:, None]
    b = np.arange(256)[None, :]
    p = np.zeros((2 ** bits, 256), np.int64)
    for i in range(bits):
        for j in range(8):
            if i + j >= vbl:
                p += (((a >> i) & 1) & ((b >> j) & 1)) << (i + j)
    return p


def _copy(tmp_path, name):
    target = tmp_path / name
    shutil.copyfile(EXAMPLES / name, target)
    return target


def _resolve(spec, path=None):
    trust.trust(str(path or spec))
    return resolve_kernel(str(spec))


def _exact_4x8(tmp_path):
    source = tmp_path / "mul4x8u_exact.c"
    source.write_text(EXACT_4X8)
    return source, _resolve(source)


def test_example_table_equals_the_c_function_for_every_operand_pair(tmp_path):
    path = _copy(tmp_path, EXAMPLE)
    multiplier = _resolve(path).multiplier
    assert (multiplier.activation_bits, multiplier.weight_bits, multiplier.signed) == (4, 8, False)
    assert multiplier.width == "4x8"
    so = tmp_path / "direct.so"
    subprocess.run([shutil.which("cc") or "gcc", "-shared", "-fPIC", "-O1", "-o", str(so),
                    str(path)], check=True)
    fn = getattr(ctypes.CDLL(str(so)), path.stem)
    fn.restype, fn.argtypes = ctypes.c_uint64, [ctypes.c_uint64, ctypes.c_uint64]
    direct = np.array([[fn(a, b) for b in range(256)] for a in range(16)], np.int64)
    np.testing.assert_array_equal(multiplier.weight_table(), direct)
    np.testing.assert_array_equal(direct, _bam(4, 4))
    # rows beyond the 4-bit activation codes hold the exact product (never read)
    full = multiplier.table.reshape(256, 256)
    assert (full[16:, :] == np.arange(16, 256)[:, None] * np.arange(256)[None, :]).all()
    # the same file as a shared-library symbol, by name and declared
    trust.trust(str(so))
    by_name = resolve_kernel(f"{so}:{path.stem}").multiplier
    declared = resolve_kernel(f"{so}:{path.stem}:u4x8").multiplier
    assert by_name.activation_bits == declared.activation_bits == 4
    np.testing.assert_array_equal(by_name.table, multiplier.table)
    np.testing.assert_array_equal(declared.table, multiplier.table)


def test_example_header_metrics_are_reproduced_at_the_circuit_width(tmp_path):
    multiplier = _resolve(_copy(tmp_path, EXAMPLE)).multiplier
    result = checks.check(multiplier)
    assert result["passed"], checks.format_check(result)
    compared = {e["metric"]: e["agrees"] for e in result["header_comparison"]}
    assert set(compared) >= {"MAE%", "WCE%", "EP%", "MRE%", "MAE", "WCE", "MSE"}
    assert all(compared.values()), compared
    exact = np.arange(16)[:, None] * np.arange(256)[None, :]
    error = np.abs(_bam(4, 4) - exact)
    assert metrics(multiplier)["MAE%"] == pytest.approx(error.mean() / 2 ** 12 * 100)
    assert metrics(multiplier)["WCE"] == error.max()
    assert result["width"] == "4x8"
    assert "4-bit activation" in checks.format_check(result)


def test_widths_from_comments_on_operand_a_and_from_a_spec_declaration(tmp_path):
    source = tmp_path / "f.c"
    source.write_text("#include <stdint.h>\nuint64_t f(uint64_t A /* 3-bit unsigned operand */, "
                      "uint64_t B /* 8-bit unsigned operand */) { return (A & 7u) * B; }\n")
    m = _resolve(source).multiplier
    assert (m.activation_bits, m.weight_bits) == (3, 8)
    np.testing.assert_array_equal(m.weight_table(), np.arange(8)[:, None] * np.arange(256))
    signed = tmp_path / "smul.c"
    signed.write_text("#include <stdint.h>\nint16_t smul(int16_t A, int16_t B) { return A * B; }\n")
    trust.trust(str(signed))
    m = resolve_kernel(f"{signed}:s3x8").multiplier
    assert m.signed and (m.activation_bits, m.weight_bits) == (3, 8)
    values = np.where(np.arange(8) >= 4, np.arange(8) - 8, np.arange(8))
    b = np.where(np.arange(256) > 127, np.arange(256) - 256, np.arange(256))
    np.testing.assert_array_equal(m.weight_table(), values[:, None] * b[None, :])


@pytest.mark.parametrize("weights", ["sign_magnitude", "asymmetric"])
@pytest.mark.parametrize("static", [False, True])
def test_fused_kernels_equal_the_reference_with_n_bit_activations_on_every_isa(
        tmp_path, each_isa, weights, static):
    kernel = _resolve(_copy(tmp_path, EXAMPLE))
    rng = np.random.default_rng(3)
    a = rng.normal(size=(5, 19)).astype(np.float32)
    a[1, 2] = np.inf
    b = rng.normal(size=(19, 7)).astype(np.float32)
    x = rng.normal(size=(2, 6, 5, 3)).astype(np.float32)
    w = rng.normal(size=(3, 2, 3, 4)).astype(np.float32)
    scheme = QuantScheme(weights=weights)
    mode = {"weights": weights, "activation_bits": 4}
    if static:
        scheme = scheme.with_range(-0.75, 1.875)
        mode["activation_range"] = (-0.75, 1.875)
    table = kernel.multiplier.table
    want_mm = reference.quantized_matmul(a, b, table, False, mode)
    geometry = graphswap.native.conv_geometry(x.shape, w.shape, (1, 1), (1, 1), "same", 1)
    pads = (geometry.pad_top, geometry.pad_bottom, geometry.pad_left, geometry.pad_right)
    want_conv = reference.quantized_conv2d(x, w, table, False, (1, 1), (1, 1), pads, 1, mode)
    eight = {k: v for k, v in mode.items() if k != "activation_bits"}
    assert not np.array_equal(want_mm, reference.quantized_matmul(a, b, table, False, eight),
                              equal_nan=True)
    for isa in each_isa.supported_isas:
        each_isa.set_isa(isa)
        np.testing.assert_array_equal(kernel.matmul(a, b, quant=scheme), want_mm, err_msg=isa)
        np.testing.assert_array_equal(kernel.conv2d(x, w, geometry, quant=scheme), want_conv,
                                      err_msg=isa)


def test_signed_nx8_fused_kernel_equals_the_reference(tmp_path):
    source = tmp_path / "smul.c"
    source.write_text("#include <stdint.h>\nint16_t smul(int16_t A, int16_t B) { return A * B; }\n")
    trust.trust(str(source))
    kernel = resolve_kernel(f"{source}:s4x8")
    rng = np.random.default_rng(5)
    a, b = rng.normal(size=(4, 11)).astype(np.float32), rng.normal(size=(11, 3)).astype(np.float32)
    want = reference.quantized_matmul(a, b, kernel.multiplier.table, True, {"activation_bits": 4})
    np.testing.assert_array_equal(kernel.matmul(a, b), want)
    # the numpy pipeline's activation codes: -7..7 at amax / 7
    from graphswap.kernels import activation_quantization
    codes, scale, zero, _ = activation_quantization(a, kernel.resolve_scheme(None), True, 4)
    assert scale == np.abs(a).max() / 7 and zero == 0
    assert np.abs(codes.view(np.int8)).max() == 7


def test_model_with_exact_4x8_equals_numpy_4_bit_activations(tmp_path):
    """A LeNet-like model converted with an exact 4x8 multiplier computes, layer by layer, what an
    independent numpy forward pass computes with its activations quantized to 4 bits (asymmetric,
    per batch) and 8-bit sign-magnitude weights through exact products."""
    import keras
    source, _ = _exact_4x8(tmp_path)
    keras.utils.set_random_seed(2)
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(3, 3, activation="relu", name="conv")(inputs)
    h = keras.layers.Flatten()(h)
    h = keras.layers.Dense(6, activation="relu", name="hidden")(h)
    outputs = keras.layers.Dense(4, name="out")(h)
    model = keras.Model(inputs, outputs)
    x = np.random.default_rng(1).normal(size=(5, 8, 8, 1)).astype(np.float32)
    converted = graphswap.rewrite_model(model, kernel=str(source), bias_correction=None)
    got = np.asarray(converted(x))
    table = np.arange(256)[:, None] * np.arange(256)[None, :]
    mode = {"activation_bits": 4}
    w, bias = model.get_layer("conv").get_weights()
    h = reference.quantized_conv2d(x, w, table.reshape(-1), False, (1, 1), (1, 1), (0, 0, 0, 0),
                                   1, mode)
    h = np.maximum(h + bias, 0).reshape(len(x), -1)
    for name, relu in (("hidden", True), ("out", False)):
        w, bias = model.get_layer(name).get_weights()
        h = reference.quantized_matmul(h, w, table.reshape(-1), False, mode) + bias
        h = np.maximum(h, 0) if relu else h
    np.testing.assert_allclose(got, h, rtol=1e-5, atol=1e-5 * np.abs(h).max())
    eight = np.asarray(graphswap.rewrite_model(model, kernel="mul8u_exact",
                                               bias_correction=None)(x))
    assert np.abs(eight - got).max() > 1e-2 * np.abs(h).max()


def test_xla_device_path_is_bit_exact_with_c(tmp_path):
    from graphswap.kernels import device_products as dp
    kernel = _resolve(_copy(tmp_path, EXAMPLE))
    rng = np.random.default_rng(4)
    a = rng.normal(size=(6, 21)).astype(np.float32)
    b = rng.normal(size=(21, 5)).astype(np.float32)
    x = rng.normal(size=(2, 7, 6, 2)).astype(np.float32)
    w = rng.normal(size=(3, 3, 2, 4)).astype(np.float32)
    geometry = graphswap.native.conv_geometry(x.shape, w.shape, (2, 1), (1, 1), "same", 1)
    table = kernel.multiplier.table
    for scheme in (QuantScheme(), QuantScheme(weights="asymmetric").with_range(-0.5, 2.0)):
        resolved = kernel.resolve_scheme(scheme)
        got = dp.lut_matmul(a, b, table, False, resolved, activation_bits=4).numpy()
        np.testing.assert_array_equal(got, kernel.matmul(a, b, quant=resolved))
        got = dp.lut_conv2d(x, w, table, False, resolved, geometry, activation_bits=4).numpy()
        np.testing.assert_array_equal(got, kernel.conv2d(x, w, geometry, quant=resolved))
    # a swapped model under jit_compile (the device path) equals the C path
    import keras
    import tensorflow as tf
    inputs = keras.Input((6, 6, 2))
    h = keras.layers.Conv2D(3, 3, name="conv")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2, name="out")(keras.layers.Flatten()(h)))
    swapped = graphswap.rewrite_model(model, kernel=str(tmp_path / EXAMPLE))
    batch = rng.normal(size=(3, 6, 6, 2)).astype(np.float32)
    compiled = tf.function(lambda t: swapped(t, training=False), jit_compile=True)
    np.testing.assert_array_equal(compiled(batch).numpy(), swapped(batch, training=False).numpy())


@pytest.mark.parametrize("body, spec_suffix, error, message", [
    ("uint64_t f(uint64_t A, uint64_t B) { return A * B; }", ":u4x4", KernelSpecError,
     "operand widths 4x4 are not supported"),
    ("uint64_t f(uint64_t A, uint64_t B) { return A * B; }", ":u0x8", KernelSpecError,
     "operand widths 0x8 are not supported; one operand must have 8 bits"),
    ("uint64_t f(uint64_t A, uint64_t B) { return A * B; }", ":u9x8", KernelSpecError,
     "operand widths 9x8 are not supported; one operand must have 8 bits"),
    ("uint64_t f(uint64_t A, uint64_t B) { return A * B; }", ":s1x8", KernelSpecError,
     "activation operand has 1..8 bits (2..8 signed); got 1"),
    ("uint64_t f(uint64_t A, uint64_t B) { return A * B; }", "", KernelSpecError,
     "cannot tell whether f(uint64_t, uint64_t) multiplies signed or unsigned"),
    ("uint64_t mul4x8u_x(const uint64_t A /* 2-bit unsigned operand */, "
     "const uint64_t B /* 8-bit unsigned operand */) { return A * B; }", "", KernelSpecError,
     "contradict the widths 4x8 from the name"),
    ("uint64_t mul4x8u_x(uint64_t A, uint64_t B) { return A * B + 5000; }", "", KernelSpecError,
     "outside the 12-bit range of an 4x8 product"),
    ("int64_t mul4x8u_x(int64_t A, int64_t B) { return A * B; }", "", KernelSpecError,
     "unsigned 4x8 multiplier"),
])
def test_bad_nx8_declarations_get_one_clear_error(tmp_path, body, spec_suffix, error, message):
    source = tmp_path / "bad.c"
    source.write_text("#include <stdint.h>\n" + body + "\n")
    trust.trust(str(source))
    with pytest.raises(error, match=re.escape(message)):
        resolve_kernel(str(source) + spec_suffix)


def test_c_kernels_refuse_a_bad_activation_width_in_the_struct():
    from graphswap.errors import GraphswapError
    from graphswap.kernels.quantized import fused_quant
    from graphswap import native
    library = native.shipped_library()
    table = np.arange(65536, dtype=np.int32) % 7
    a, b = np.ones((2, 3), np.float32), np.ones((3, 2), np.float32)
    good = fused_quant(QuantScheme().resolve(False), False, 8, 4)
    assert good.weight_bits == 8 | (4 << 8)
    library.lut_matmul_f32(a, b, table, good)
    for bits in ((9 << 8) | 8, (4 << 8) | 4, 1 << 16):
        bad = fused_quant(QuantScheme().resolve(False), False)
        bad.weight_bits = bits
        with pytest.raises(GraphswapError, match="activation width in its second byte"):
            library.lut_matmul_f32(a, b, table, bad)


def test_calibrated_model_quantizes_to_4_bits_with_its_static_range_on_both_paths(tmp_path):
    """Calibrated (static) activations: the TensorFlow op's scale and zero point of the layer's
    range use 15 levels (the reference with that range), and the XLA path agrees bit for bit."""
    import keras
    import tensorflow as tf
    circuit = _copy(tmp_path, EXAMPLE)
    trust.trust(str(circuit))
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((9,)), keras.layers.Dense(3, name="out")])
    rng = np.random.default_rng(8)
    data = rng.normal(size=(16, 9)).astype(np.float32)
    converted = graphswap.rewrite_model(model, kernel=str(circuit), calibration_data=data,
                                        bias_correction=None)
    scheme = converted.get_layer("out").current_quantization()
    assert scheme.activations == "static"
    lo, hi = (float(v) for v in scheme.activation_range)
    x = (rng.normal(size=(5, 9)) * 1.5).astype(np.float32)   # beyond the range too: clipped
    w, bias = model.get_layer("out").get_weights()
    want = reference.quantized_matmul(x, w, converted.get_layer("out").arithmetic.multiplier.table,
                                      False, {"activation_bits": 4, "activation_range": (lo, hi)})
    got = np.asarray(converted(x, training=False))
    np.testing.assert_allclose(got, want + bias, rtol=1e-6, atol=1e-6)
    compiled = tf.function(lambda t: converted(t, training=False), jit_compile=True)
    np.testing.assert_array_equal(compiled(x).numpy(), got)


def test_cli_end_to_end_with_a_4x8_circuit(tmp_path):
    """convert, kernels check, evaluate, finetune (1 epoch, few samples), sweep, explore (tiny
    budget, a library mixing 4x8 and 8x8 circuits), both ONNX exports and the SavedModel export,
    from the CLI, for the shipped 4x8 example; the converted model's layers
    quantize their activations to 4 bits, also after reloading."""
    import json

    import keras
    from click.testing import CliRunner

    from conftest import SAMPLE_DATA
    from graphswap.cli import main

    with np.load(SAMPLE_DATA) as archive:
        x, y = archive["x_train"][:48], archive["y_train"][:48]
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((32, 32, 1)), keras.layers.Rescaling(1 / 255.0),
        keras.layers.Conv2D(3, 5, strides=3, activation="relu", name="conv"),
        keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax", name="out")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, epochs=2, verbose=0)
    path = tmp_path / "m.keras"
    model.save(path)
    data = tmp_path / "d.npz"
    np.savez(data, x_train=x, y_train=y, x_test=x[:32], y_test=y[:32])
    circuit = str(_copy(tmp_path, EXAMPLE))
    runner = CliRunner()

    def run(*args):
        result = runner.invoke(main, [str(a) for a in args])
        assert result.exit_code == 0, result.output
        return result.output

    converted = tmp_path / "m4.keras"
    out = run("convert", path, "--kernel", circuit, "--trust-kernel", circuit, "-o", converted)
    assert "4-bit dynamic activations" in out and f"wrote {converted}" in out
    reloaded = graphswap.load_model(converted)
    assert reloaded.get_layer("out").arithmetic.activation_bits == 4
    out = run("kernels", "check", circuit)
    assert "4x8" in out and "all checks passed" in out
    out = run("evaluate", path, "--data", data, "--kernel", "exact", "--kernel", circuit)
    assert "mul4x8u_gsbam4" in out
    tuned = tmp_path / "m4ft.keras"
    run("finetune", converted, "--data", data, "--epochs", "1", "--batch-size", "16", "-o", tuned)
    assert graphswap.load_model(tuned).get_layer("conv").arithmetic.activation_bits == 4
    out = run("sweep", path, "--data", data, "--kernel", circuit, "--json")
    assert json.loads(out[out.index("{"):])
    wide = str(_copy(tmp_path, "mul8u_gsbam6.c"))
    front = tmp_path / "front.json"
    run("explore", path, "--data", data, "--library", circuit, "--library", wide,
        "--trust-kernel", circuit, "--trust-kernel", wide, "--trials", "4", "--budget", "50",
        "-o", front)
    assert json.loads(front.read_text())["front"]
    for args, written in [(["--format", "onnx"], tmp_path / "l.onnx"),
                          (["--format", "onnx", "--keep-kernels"], tmp_path / "k.onnx"),
                          (["--format", "savedmodel"], tmp_path / "sm")]:
        out = run("export", converted, *args, "-o", written)
        assert f"wrote {written}" in out and written.exists()
    # the kept-kernel ONNX file runs the 4x8 circuit: equal to the converted model
    session = graphswap.onnx_session(str(tmp_path / "k.onnx"))
    name = session.get_inputs()[0].name
    batch = x[:4].astype(np.float32)
    got = session.run(None, {name: batch})[0]
    want = np.asarray(reloaded(batch))
    np.testing.assert_allclose(got, want, atol=1e-6)
    eight = graphswap.rewrite_model(keras.models.load_model(path), kernel="mul8u_exact")
    assert np.abs(np.asarray(eight(batch)) - want).max() > 1e-4


def test_cli_refuses_an_nx8_width_it_cannot_run_in_one_line(tmp_path):
    from click.testing import CliRunner

    from graphswap.cli import main
    source = tmp_path / "f.c"
    source.write_text("#include <stdint.h>\nuint64_t f(uint64_t A, uint64_t B) { return A * B; }\n")
    import keras
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.save(tmp_path / "m.keras")
    out = tmp_path / "out.keras"
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "m.keras"), "--kernel",
                                       f"{source}:u4x4", "--trust-kernel", str(source), "-o",
                                       str(out)])
    assert result.exit_code == 1 and not out.exists()
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ")
    assert "operand widths 4x4 are not supported" in lines[0] and "Nx8" in lines[0]


def test_lut_grad_of_an_exact_4x8_multiplier_is_the_straight_through_gradient(tmp_path):
    """backward="lut_grad" with an exact 4x8 table: dL/da = g @ Wq^T with Wq the 8-bit weights,
    dL/db = Aq^T @ g with Aq the activations quantized to 4 bits (numpy, independently); the
    table's derivatives hold at the edge of the 4-bit range (code 15) too."""
    from graphswap.kernels.derivatives import lut_conv2d_gradients, lut_matmul_gradients
    _, kernel = _exact_4x8(tmp_path)
    rng = np.random.default_rng(5)
    a = rng.normal(size=(6, 11)).astype(np.float32)
    b = rng.normal(size=(11, 4)).astype(np.float32)
    g = rng.normal(size=(6, 4)).astype(np.float32)
    da, db = lut_matmul_gradients(kernel, a, b, g)
    lo, hi = min(float(a.min()), 0.0), max(float(a.max()), 0.0)
    sa = (hi - lo) / 15
    za = np.clip(np.rint(-lo / sa), 0, 15)
    codes = np.clip(np.rint(a.astype(np.float64) / sa) + za, 0, 15)
    assert (codes == 15).any() and (codes == 0).any()
    aq = sa * (codes - za)
    amax = np.abs(b.astype(np.float64)).max(axis=0)
    wq = np.sign(b) * np.clip(np.rint(np.abs(b) / (amax / 255)), 0, 255) * (amax / 255)
    np.testing.assert_allclose(da, g.astype(np.float64) @ wq.T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(db, aq.T @ g.astype(np.float64), rtol=1e-5, atol=1e-6)
    approx = _resolve(_copy(tmp_path, EXAMPLE))
    da_approx, _ = lut_matmul_gradients(approx, a, b, g)
    assert np.isfinite(da_approx).all() and not np.allclose(da_approx, da)
    x = rng.normal(size=(1, 5, 5, 2)).astype(np.float32)
    w = rng.normal(size=(3, 3, 2, 3)).astype(np.float32)
    geometry = graphswap.native.conv_geometry(x.shape, w.shape, (1, 1), (1, 1), "valid", 1)
    dx, dw = lut_conv2d_gradients(approx, x, w, np.ones((1, 3, 3, 3), np.float32), geometry)
    assert dx.shape == x.shape and dw.shape == w.shape and np.isfinite(dw).all()


def test_bias_compensation_of_an_exact_4x8_multiplier_changes_nothing(tmp_path):
    """Compensation measures the products against exact products of the same codes: for a 4x8
    kernel those of the 4-bit activations (an 8x8 exact reference would count the 4-bit rounding
    as multiplier error and 'correct' it)."""
    import keras
    source, _ = _exact_4x8(tmp_path)
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3)])
    x = np.random.default_rng(2).normal(size=(64, 12)).astype(np.float32)
    calibrated = graphswap.rewrite_model(model, kernel=str(source), calibration_data=x,
                                         bias_correction=None)
    compensated = graphswap.rewrite_model(model, kernel=str(source), calibration_data=x,
                                          bias_correction="mean")
    np.testing.assert_array_equal(np.asarray(compensated(x)), np.asarray(calibrated(x)))
    exact = calibrated.layers[0].arithmetic.exact_products()
    assert exact.activation_bits == 4 and exact.multiplier.activation_bits == 4


def test_error_heatmap_of_a_4x8_multiplier_covers_its_own_domain(tmp_path, imshow_spy):
    from graphswap.multipliers import plot_error_heatmap
    shown = imshow_spy
    m = _resolve(_copy(tmp_path, EXAMPLE)).multiplier
    out = plot_error_heatmap(m, tmp_path / "heat.png")
    assert Path(out).read_bytes().startswith(b"\x89PNG")
    np.testing.assert_array_equal(shown["data"],
                                  _bam(4, 4) - np.arange(16)[:, None] * np.arange(256)[None, :])
    assert shown["extent"] == (-0.5, 255.5, -0.5, 15.5)


def test_signed_4x8_in_evoapproxlib_types_is_read_as_a_12_bit_pattern(tmp_path):
    """mul4x8s_ with uint64_t operands and result: the 4-bit activation arrives as a bit pattern,
    the product's low 12 bits are its two's-complement value."""
    source = tmp_path / "mul4x8s_pat.c"
    source.write_text(
        "#include <stdint.h>\n"
        "uint64_t mul4x8s_pat(const uint64_t A /* 4-bit signed operand */,\n"
        "                     const uint64_t B /* 8-bit signed operand */)\n"
        "{ int64_t a = (int64_t)(A & 15u); int64_t b = (int8_t)(B & 255u); if (a > 7) a -= 16;\n"
        "  return (uint64_t)(a * b) & 0xFFFu; }\n")
    m = _resolve(source).multiplier
    assert m.signed and (m.activation_bits, m.weight_bits) == (4, 8)
    a = np.where(np.arange(16) > 7, np.arange(16) - 16, np.arange(16))
    b = np.where(np.arange(256) > 127, np.arange(256) - 256, np.arange(256))
    np.testing.assert_array_equal(m.weight_table(), a[:, None] * b[None, :])
    assert checks.check(m)["passed"]


def test_mse_calibration_searches_the_range_for_4_bit_activations(tmp_path):
    """calibration_method='mse' picks the clipping range that minimizes the error of the layer's
    own quantizer: 15 levels for a 4x8 multiplier (numpy search, independently), which is not
    the range the same search picks for 255 levels."""
    import keras
    source, _ = _exact_4x8(tmp_path)
    keras.utils.set_random_seed(4)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2, name="out")])
    x = np.random.default_rng(9).standard_t(3, size=(256, 6)).astype(np.float32)
    converted = graphswap.rewrite_model(model, kernel=str(source), calibration_data=x,
                                        calibration_method="mse", bias_correction=None,
                                        calibration_source="float", dynamic_fallback=False)
    got = converted.get_layer("out").current_quantization().activation_range

    def search(levels):
        values = np.concatenate([x.reshape(-1), [x.min(), x.max()]]).astype(np.float64)
        lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
        best, best_error = None, np.inf
        for f in np.linspace(0.01, 1.0, 100):
            a, b = lo * f, hi * f
            scale = (b - a) / levels
            zero = np.clip(np.rint(-a / scale), 0, levels)
            codes = np.clip(np.rint(values / scale) + zero, 0, levels)
            error = np.mean(((codes - zero) * scale - values) ** 2)
            if error < best_error:
                best, best_error = (a, b), error
        return tuple(float(np.float32(v)) for v in best)

    assert tuple(float(v) for v in got) == pytest.approx(search(15), rel=1e-6)
    assert search(15) != pytest.approx(search(255), rel=1e-3)


def test_a_model_with_a_declared_4x8_spec_saves_and_reloads_with_its_width(tmp_path,
                                                                            monkeypatch):
    import keras
    source = tmp_path / "plain.c"
    source.write_text("#include <stdint.h>\nuint64_t plain(uint64_t A, uint64_t B) "
                      "{ return (A & 15u) * (B & 255u); }\n")
    trust.trust(str(source))
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((7,)), keras.layers.Dense(3, name="out")])
    converted = graphswap.rewrite_model(model, kernel=f"{source}:u4x8")
    x = np.random.default_rng(6).normal(size=(4, 7)).astype(np.float32)
    path = tmp_path / "m.keras"
    converted.save(path)
    reloaded = graphswap.load_model(path)
    arithmetic = reloaded.get_layer("out").arithmetic
    assert arithmetic.activation_bits == 4 and arithmetic.spec.endswith(":u4x8")
    np.testing.assert_array_equal(np.asarray(reloaded(x)), np.asarray(converted(x)))
    eight = graphswap.rewrite_model(model, kernel="mul8u_exact")
    assert not np.array_equal(np.asarray(eight(x)), np.asarray(converted(x)))
    # the declared width does not get past the trust gate: untrusted, nothing is compiled
    from graphswap.errors import KernelTrustError
    from graphswap.multipliers import csource
    trust.clear_session_trust()
    built = []
    monkeypatch.setattr(csource, "compiled_tables", lambda *a, **k: built.append(a))
    with pytest.raises(KernelTrustError, match=re.escape(str(source.resolve()))):
        graphswap.load_model(path)
    assert not built


def test_weight_tuning_of_nx8_layers_uses_their_4_bit_activation_codes(tmp_path):
    """Weight tuning reads an Nx8 layer's histogram of N-bit activation codes: an exact 4x8
    table changes no weight (each code is its own best match), the approximate example
    lowers the expected product error it minimises, and no layer is skipped."""
    import keras

    from graphswap.swap import tune_weights
    exact_source, _ = _exact_4x8(tmp_path)
    approximate = _copy(tmp_path, EXAMPLE)
    trust.trust(str(approximate))
    keras.utils.set_random_seed(4)
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3)])
    x = np.random.default_rng(4).normal(size=(128, 12)).astype(np.float32)
    for source in (exact_source, approximate):
        calibrated = graphswap.rewrite_model(model, kernel=str(source), calibration_data=x,
                                             bias_correction=None)
        before = [w.copy() for w in calibrated.get_weights()]
        report = tune_weights(calibrated, x)
        assert not report.skipped and len(report.layers) == 2
        summaries = [s for layer in report.layers.values() for s in layer.values()]
        if source == exact_source:
            assert all(s["changed"] == 0 for s in summaries)
            for a, b in zip(before, calibrated.get_weights()):
                np.testing.assert_array_equal(a, b)
        else:
            assert sum(s["changed"] for s in summaries) > 0
            assert all(s["error_after"] <= s["error_before"] for s in summaries)
            assert sum(s["error_after"] for s in summaries) < \
                sum(s["error_before"] for s in summaries)
