"""8xN mixed-precision multipliers: an 8-bit activation times an N-bit weight.

Tables against the C function for every operand pair, header metrics at the circuit's own output
width, the fused C kernels against tests/reference.py (N-bit weights) on every ISA path, a model
converted with an exact 8x4 multiplier against an independent numpy 4-bit weight quantization,
and bad input (widths graphswap cannot run, contradictions) with one clear error."""

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
from graphswap.kernels import LutKernel, resolve_kernel, trust
from graphswap.multipliers import checks
from graphswap.multipliers.metrics import metrics

import reference

EXAMPLES = Path(__file__).resolve().parent.parent / "sample_models" / "multipliers"
EXAMPLE_FILES = {"mul8x4u_gsbam4.c": (4, 4), "mul8x2u_gsbam3.c": (2, 3)}   # (N, break line)

EXACT_8X4 = """
#include <stdint.h>
uint64_t mul8x4u_exact(const uint64_t A /* 8-bit unsigned operand */,
                       const uint64_t B /* 4-bit unsigned operand */)
{ return (A & 255u) * (B & 15u); }
"""


def _bam(bits, vbl):
    """Independent numpy model of the examples' broken-array circuit: (256, 2^N) products."""
    a = np.arange(256)[:, None]
    b = np.arange(2 ** bits)[None, :]
    p = np.zeros((256, 2 ** bits), np.int64)
    for i in range(8):
        for j in range(bits):
            if i + j >= vbl:
                p += (((a >> i) & 1) & ((b >> j) & 1)) << (i + j)
    return p


def _build(source, so):
    """The C file compiled by the system compiler itself (every symbol visible)."""
    subprocess.run([shutil.which("cc") or "gcc", "-shared", "-fPIC", "-O1", "-o", str(so),
                    str(source)], check=True)


def _resolve(path):
    trust.trust(str(path))
    return resolve_kernel(str(path))


def _copy(tmp_path, name):
    target = tmp_path / name
    shutil.copyfile(EXAMPLES / name, target)
    return target


@pytest.mark.parametrize("name", sorted(EXAMPLE_FILES))
def test_example_tables_equal_the_c_function_for_every_operand_pair(tmp_path, name):
    bits, vbl = EXAMPLE_FILES[name]
    path = _copy(tmp_path, name)
    kernel = _resolve(path)
    multiplier = kernel.multiplier
    assert multiplier.weight_bits == bits and not multiplier.signed
    # the C function itself, compiled here and called through ctypes on all 256 x 2^N pairs
    so = tmp_path / "direct.so"
    _build(path, so)
    fn = getattr(ctypes.CDLL(str(so)), path.stem)
    fn.restype, fn.argtypes = ctypes.c_uint64, [ctypes.c_uint64, ctypes.c_uint64]
    direct = np.array([[fn(a, b) for b in range(2 ** bits)] for a in range(256)], np.int64)
    np.testing.assert_array_equal(multiplier.weight_table(), direct)
    np.testing.assert_array_equal(direct, _bam(bits, vbl))
    # codes beyond the N-bit range hold the exact product (never read by the quantizer)
    full = multiplier.table.reshape(256, 256)
    assert (full[:, 2 ** bits:] == np.arange(256)[:, None] * np.arange(2 ** bits, 256)).all()


@pytest.mark.parametrize("name", sorted(EXAMPLE_FILES))
def test_example_header_metrics_are_reproduced_at_the_circuit_width(tmp_path, name):
    bits, vbl = EXAMPLE_FILES[name]
    multiplier = _resolve(_copy(tmp_path, name)).multiplier
    result = checks.check(multiplier)
    assert result["passed"], checks.format_check(result)
    compared = {e["metric"]: e["agrees"] for e in result["header_comparison"]}
    assert set(compared) >= {"MAE%", "WCE%", "EP%", "MRE%", "MAE", "WCE", "MSE"}
    assert all(compared.values()), compared
    # independent: MAE% at 8 + N output bits, not 16
    exact = np.arange(256)[:, None] * np.arange(2 ** bits)[None, :]
    mae = np.abs(_bam(bits, vbl) - exact).mean()
    assert metrics(multiplier)["MAE%"] == pytest.approx(mae / 2 ** (8 + bits) * 100)
    assert result["width"] == f"8x{bits}"


@pytest.mark.parametrize("weights", ["sign_magnitude", "asymmetric"])
@pytest.mark.parametrize("granularity", ["per_channel", "per_tensor"])
def test_fused_kernels_equal_the_reference_with_n_bit_weights_on_every_isa(
        tmp_path, each_isa, weights, granularity):
    kernel = _resolve(_copy(tmp_path, "mul8x4u_gsbam4.c"))
    rng = np.random.default_rng(3)
    a = rng.normal(size=(5, 19)).astype(np.float32)
    b = rng.normal(size=(19, 7)).astype(np.float32)
    x = rng.normal(size=(2, 6, 5, 3)).astype(np.float32)
    w = rng.normal(size=(3, 2, 3, 4)).astype(np.float32)
    scheme = graphswap.kernels.QuantScheme(weights=weights, granularity=granularity)
    mode = {"weights": weights, "granularity": granularity, "weight_bits": 4}
    table = kernel.multiplier.table
    want_mm = reference.quantized_matmul(a, b, table, False, mode)
    geometry = graphswap.native.conv_geometry(x.shape, w.shape, (1, 1), (1, 1), "same", 1)
    pads = (geometry.pad_top, geometry.pad_bottom, geometry.pad_left, geometry.pad_right)
    want_conv = reference.quantized_conv2d(x, w, table, False, (1, 1), (1, 1), pads, 1, mode)
    # the reference itself differs from 8-bit weights (the test could fail)
    assert not np.array_equal(want_mm, reference.quantized_matmul(
        a, b, table, False, {"weights": weights, "granularity": granularity}))
    for isa in each_isa.supported_isas:
        each_isa.set_isa(isa)
        np.testing.assert_array_equal(kernel.matmul(a, b, quant=scheme), want_mm, err_msg=isa)
        np.testing.assert_array_equal(kernel.conv2d(x, w, geometry, quant=scheme), want_conv,
                                      err_msg=isa)


def test_numpy_pipeline_quantizes_weights_to_n_bits():
    from graphswap.kernels import quantize_weights
    w = np.array([[-1.0, 0.5], [0.3, 2.0], [0.01, -0.7]], np.float32)
    scheme = graphswap.kernels.QuantScheme().resolve(False)
    codes, negative, scale, _, _ = quantize_weights(w, scheme, 4)
    np.testing.assert_array_equal(scale, [1.0 / 15, 2.0 / 15])
    np.testing.assert_array_equal(codes, np.clip(np.rint(np.abs(w) / scale), 0, 15))
    assert codes.max() == 15 and negative.tolist() == (w < 0).tolist()


def test_signed_8xn_declared_in_the_spec(tmp_path):
    source = tmp_path / "smul.c"
    source.write_text("#include <stdint.h>\nint16_t smul(int16_t A, int16_t B) { return A * B; }\n")
    trust.trust(str(source))
    kernel = resolve_kernel(f"{source}:s8x3")
    m = kernel.multiplier
    assert m.signed and m.weight_bits == 3
    values = np.where(np.arange(8) >= 4, np.arange(8) - 8, np.arange(8))
    a = np.where(np.arange(256) > 127, np.arange(256) - 256, np.arange(256))
    np.testing.assert_array_equal(m.weight_table(), a[:, None] * values[None, :])
    assert metrics(m)["MAE"] == 0
    rng = np.random.default_rng(0)
    a32, b32 = rng.normal(size=(4, 9)).astype(np.float32), rng.normal(size=(9, 3)).astype(np.float32)
    want = reference.quantized_matmul(a32, b32, m.table, True, {"weight_bits": 3})
    np.testing.assert_array_equal(kernel.matmul(a32, b32), want)


@pytest.mark.parametrize("body, spec_suffix, message", [
    ("uint64_t mul4x4u_x(uint64_t A, uint64_t B) { return A * B; }", "",
     "operand widths 4x4 are not supported"),
    ("uint64_t f(uint64_t A, uint64_t B) { return A * B; }", ":u4x4",
     "operand widths 4x4 are not supported"),
    ("uint64_t mul8x4u_x(const uint64_t A /* 8-bit unsigned operand */, "
     "const uint64_t B /* 2-bit unsigned operand */) { return A * B; }", "",
     "contradict the widths 8x4 from the name"),
    ("uint64_t f(uint64_t A /* 8-bit unsigned operand */, uint64_t B /* 4-bit signed operand */)"
     " { return A * B; }", "", "mix signed and unsigned operands"),
    ("int64_t mul8x4u_x(int64_t A, int64_t B) { return A * B; }", "",
     "unsigned 8x4 multiplier"),
    ("uint64_t mul8x4u_x(uint64_t A, uint64_t B) { return A * B + 5000; }", "",
     "outside the 12-bit range of an 8x4 product"),
    ("uint64_t f(uint64_t A, uint64_t B) { return A * B; }", "",
     "cannot tell whether f(uint64_t, uint64_t) multiplies signed or unsigned"),
])
def test_bad_8xn_declarations_get_one_clear_error(tmp_path, body, spec_suffix, message):
    source = tmp_path / "bad.c"
    source.write_text("#include <stdint.h>\n" + body + "\n")
    trust.trust(str(source))
    with pytest.raises(KernelSpecError, match=re.escape(message)):
        resolve_kernel(str(source) + spec_suffix)


def test_multiplier_record_refuses_impossible_widths():
    from graphswap.multipliers import builtin
    import dataclasses
    exact = builtin("mul8s_exact")
    with pytest.raises(KernelSpecError, match="2..8 signed"):
        dataclasses.replace(exact, weight_bits=1)
    with pytest.raises(KernelSpecError, match="has 1..8 bits"):
        dataclasses.replace(exact, weight_bits=9)


def test_shared_library_symbol_with_width_option(tmp_path):
    path = _copy(tmp_path, "mul8x4u_gsbam4.c")
    so = tmp_path / "lib8x4.so"
    _build(path, so)
    trust.trust(str(so))
    by_name = resolve_kernel(f"{so}:mul8x4u_gsbam4").multiplier
    declared = resolve_kernel(f"{so}:mul8x4u_gsbam4:u8x4").multiplier
    assert by_name.weight_bits == declared.weight_bits == 4
    np.testing.assert_array_equal(by_name.weight_table(), _bam(4, 4))
    np.testing.assert_array_equal(declared.table, by_name.table)
    with pytest.raises(KernelSpecError, match="bit patterns: signature u64"):
        resolve_kernel(f"{so}:mul8x4u_gsbam4:u8x4,s8")


def test_dense_model_with_exact_8x4_equals_numpy_4_bit_weights(tmp_path):
    """A model converted with an exact 8x4 multiplier computes what the same model computes with
    its weights quantized to 4 bits (sign-magnitude, per channel) by numpy, run through the exact
    8x8 multiplier: a 4-bit magnitude q at scale amax/15 is the 8-bit magnitude 17 q at amax/255."""
    import keras
    source = tmp_path / "mul8x4u_exact.c"
    source.write_text(EXACT_8X4)
    trust.trust(str(source))
    inputs = keras.Input((6, 6, 1))
    h = keras.layers.Conv2D(3, 3, activation="relu")(inputs)
    h = keras.layers.Flatten()(h)
    outputs = keras.layers.Dense(4)(h)
    model = keras.Model(inputs, outputs)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(8, 6, 6, 1)).astype(np.float32)
    four_bit = keras.models.clone_model(model)
    four_bit.set_weights(model.get_weights())
    for layer in four_bit.layers:
        if layer.get_weights():
            w, bias = layer.get_weights()
            amax = np.abs(w).reshape(-1, w.shape[-1]).max(axis=0)
            scale = np.where(amax > 0, amax / 15.0, 1.0)
            q = np.clip(np.rint(np.abs(w.astype(np.float64)) / scale), 0, 15)
            layer.set_weights([(np.sign(w) * q * scale).astype(np.float32), bias])
    converted = graphswap.rewrite_model(model, kernel=str(source))
    reference_model = graphswap.rewrite_model(four_bit, kernel="mul8u_exact")
    got = np.asarray(converted(x))
    want = np.asarray(reference_model(x))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    # and it is not the 8-bit-weight result
    assert np.abs(np.asarray(graphswap.rewrite_model(model, kernel="mul8u_exact")(x)) - got).max() \
        > 1e-3 * np.abs(want).max()


@pytest.mark.parametrize("signed, bits, value_order", [(False, 4, False), (True, 3, True),
                                                       (True, 5, False), (False, 1, False)])
def test_lut_files_of_8xn_tables_round_trip(tmp_path, signed, bits, value_order):
    from graphswap.multipliers import write_lut
    rng = np.random.default_rng(bits)
    limit = 2 ** (7 + bits) - 1
    products = rng.integers(-limit if signed else 0, limit, size=(256, 2 ** bits))
    path = tmp_path / "t.lut"
    write_lut(path, products, signed, value_order=value_order, weight_bits=bits)
    assert path.stat().st_size == 24 + 1024 * 2 ** bits
    trust.trust(str(path))
    m = resolve_kernel(str(path)).multiplier
    assert (m.signed, m.weight_bits) == (signed, bits)
    np.testing.assert_array_equal(m.weight_table(), products)
    # written again from Multiplier.table, in the other order: the same multiplier
    again = tmp_path / "again.lut"
    write_lut(again, m.table, signed, value_order=False, weight_bits=bits)
    trust.trust(str(again))
    np.testing.assert_array_equal(resolve_kernel(str(again)).multiplier.table, m.table)
    if value_order:   # the file's columns really are in value order
        raw = np.frombuffer(path.read_bytes()[24:], "<i4").reshape(256, 2 ** bits)
        assert raw[128, 0] == products[0, 2 ** (bits - 1)]   # f(0, -2^(N-1))


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d[:-4], "wrong size for an 8x4 multiplier table"),
    (lambda d: d[:16] + (9).to_bytes(4, "little") + d[20:], "weight width 9"),
    (lambda d: d[:20] + (1).to_bytes(4, "little") + d[24:], "reserved field 1"),
    (lambda d: d[:18], "truncated 8xN multiplier table"),
])
def test_bad_8xn_lut_files_get_one_clear_error(tmp_path, mutate, message):
    from graphswap.multipliers import write_lut
    good = tmp_path / "good.lut"
    write_lut(good, np.zeros((256, 16), np.int64), False, weight_bits=4)
    bad = tmp_path / "bad.lut"
    bad.write_bytes(mutate(good.read_bytes()))
    trust.trust(str(bad))
    with pytest.raises(KernelSpecError, match=re.escape(message)):
        resolve_kernel(str(bad))
    with pytest.raises(KernelSpecError, match=re.escape("has shape (256, 16) or 65536 entries")):
        write_lut(tmp_path / "x.lut", np.zeros((256, 8)), False, weight_bits=4)


def test_cli_end_to_end_with_an_8x4_circuit(tmp_path):
    """convert, evaluate, finetune (1 epoch, few samples), sweep, explore (tiny budget, a library
    mixing 8x4 and 8x8 circuits), both ONNX exports and the SavedModel export, from the CLI, for
    the shipped 8x4 example; the converted model's layers run 4-bit weights."""
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
    circuit = str(_copy(tmp_path, "mul8x4u_gsbam4.c"))
    wide = str(_copy(tmp_path, "mul8u_gsbam6.c"))
    runner = CliRunner()

    def run(*args):
        result = runner.invoke(main, [str(a) for a in args])
        assert result.exit_code == 0, result.output
        return result.output

    converted = tmp_path / "m4.keras"
    out = run("convert", path, "--kernel", circuit, "--trust-kernel", circuit, "-o", converted)
    assert "4-bit sign-magnitude weights" in out and f"wrote {converted}" in out
    reloaded = graphswap.load_model(converted)
    assert reloaded.get_layer("out").arithmetic.weight_bits == 4
    out = run("evaluate", path, "--data", data, "--kernel", "exact", "--kernel", circuit)
    assert "mul8x4u_gsbam4" in out
    tuned = tmp_path / "m4ft.keras"
    run("finetune", converted, "--data", data, "--epochs", "1", "--batch-size", "16", "-o", tuned)
    assert graphswap.load_model(tuned).get_layer("conv").arithmetic.weight_bits == 4
    out = run("sweep", path, "--data", data, "--kernel", circuit, "--json")
    assert json.loads(out[out.index("{"):])
    front = tmp_path / "front.json"
    out = run("explore", path, "--data", data, "--library", circuit, "--library", wide,
              "--trust-kernel", circuit, "--trust-kernel", wide, "--trials", "4", "--budget", "50",
              "-o", front)
    assert json.loads(front.read_text())["front"]
    for args, written in [(["--format", "onnx"], tmp_path / "l.onnx"),
                          (["--format", "onnx", "--keep-kernels"], tmp_path / "k.onnx"),
                          (["--format", "savedmodel"], tmp_path / "sm")]:
        out = run("export", converted, *args, "-o", written)
        assert f"wrote {written}" in out and written.exists()
    # the kept-kernel ONNX file runs the 8x4 circuit: equal to the converted model
    session = graphswap.onnx_session(str(tmp_path / "k.onnx"))
    name = session.get_inputs()[0].name
    got = session.run(None, {name: x[:4].astype(np.float32)})[0]
    np.testing.assert_allclose(got, np.asarray(reloaded(x[:4].astype(np.float32))), atol=1e-6)


def test_lut_grad_of_an_exact_8x4_multiplier_is_the_straight_through_gradient(tmp_path):
    """backward="lut_grad" with an exact 8x4 table: dL/da = g @ Wq^T with Wq the weights quantized
    to 4 bits (numpy, independently), dL/db = Aq^T @ g with Aq the 8-bit activations; the table's
    derivatives hold at the edge of the 4-bit range (code 15) too."""
    from graphswap.kernels.derivatives import lut_conv2d_gradients, lut_matmul_gradients
    source = tmp_path / "mul8x4u_exact.c"
    source.write_text(EXACT_8X4)
    kernel = _resolve(source)
    rng = np.random.default_rng(5)
    a = rng.normal(size=(6, 11)).astype(np.float32)
    b = rng.normal(size=(11, 4)).astype(np.float32)
    g = rng.normal(size=(6, 4)).astype(np.float32)
    da, db = lut_matmul_gradients(kernel, a, b, g)
    amax = np.abs(b.astype(np.float64)).max(axis=0)
    scale = amax / 15
    wq = np.sign(b) * np.clip(np.rint(np.abs(b) / scale), 0, 15) * scale
    assert (np.abs(np.rint(np.abs(b) / scale)) == 15).any()      # the edge code is used
    codes, sa, za = reference._activations(a, False, None)
    aq = sa * (codes - za)
    np.testing.assert_allclose(da, g.astype(np.float64) @ wq.T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(db, aq.T @ g.astype(np.float64), rtol=1e-5, atol=1e-6)
    # the approximate 8x4 circuit's gradients exist (conv too) and differ from the exact ones
    approx = _resolve(_copy(tmp_path, "mul8x4u_gsbam4.c"))
    da_approx, _ = lut_matmul_gradients(approx, a, b, g)
    assert np.isfinite(da_approx).all() and not np.allclose(da_approx, da)
    x = rng.normal(size=(1, 5, 5, 2)).astype(np.float32)
    w = rng.normal(size=(3, 3, 2, 3)).astype(np.float32)
    geometry = graphswap.native.conv_geometry(x.shape, w.shape, (1, 1), (1, 1), "valid", 1)
    dx, dw = lut_conv2d_gradients(approx, x, w, np.ones((1, 3, 3, 3), np.float32), geometry)
    assert dx.shape == x.shape and dw.shape == w.shape and np.isfinite(dw).all()


def test_signed_8x4_in_evoapproxlib_types_is_read_as_a_12_bit_pattern(tmp_path):
    """mul8x4s_ with uint64_t operands and result (EvoApproxLib's types): the operands arrive as bit
    patterns, the product's low 12 bits are its two's-complement value."""
    source = tmp_path / "mul8x4s_pat.c"
    source.write_text(
        "#include <stdint.h>\n"
        "uint64_t mul8x4s_pat(const uint64_t A /* 8-bit signed operand */,\n"
        "                     const uint64_t B /* 4-bit signed operand */)\n"
        "{ int64_t a = (int8_t)(A & 255u); int64_t b = (int64_t)(B & 15u); if (b > 7) b -= 16;\n"
        "  return (uint64_t)(a * b) & 0xFFFu; }\n")
    m = _resolve(source).multiplier
    assert m.signed and m.weight_bits == 4
    a = np.where(np.arange(256) > 127, np.arange(256) - 256, np.arange(256))
    b = np.where(np.arange(16) > 7, np.arange(16) - 16, np.arange(16))
    np.testing.assert_array_equal(m.weight_table(), a[:, None] * b[None, :])
    assert checks.check(m)["passed"]


def test_bias_compensation_of_an_exact_8x4_multiplier_changes_nothing(tmp_path):
    """Compensation measures the approximate products against exact products of the same codes:
    for an 8x4 kernel those are the 4-bit weights' (an 8x8 exact reference would count the 4-bit
    rounding as multiplier error and 'correct' it)."""
    import keras
    source = tmp_path / "mul8x4u_exact.c"
    source.write_text(EXACT_8X4)
    trust.trust(str(source))
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3)])
    x = np.random.default_rng(2).normal(size=(64, 12)).astype(np.float32)
    calibrated = graphswap.rewrite_model(model, kernel=str(source), calibration_data=x)
    compensated = graphswap.rewrite_model(model, kernel=str(source), calibration_data=x,
                                          bias_correction="mean")
    np.testing.assert_array_equal(np.asarray(compensated(x)), np.asarray(calibrated(x)))
    exact = calibrated.layers[0].arithmetic.exact_products()
    assert exact.weight_bits == 4 and exact.multiplier.weight_bits == 4


def test_error_heatmap_of_an_8x4_multiplier_covers_its_own_domain(tmp_path, imshow_spy):
    from graphswap.multipliers import plot_error_heatmap
    shown = imshow_spy
    m = _resolve(_copy(tmp_path, "mul8x4u_gsbam4.c")).multiplier
    out = plot_error_heatmap(m, tmp_path / "heat.png")
    assert Path(out).read_bytes().startswith(b"\x89PNG")
    want = _bam(4, 4) - np.arange(256)[:, None] * np.arange(16)[None, :]
    np.testing.assert_array_equal(shown["data"], want)
    assert shown["extent"] == (-0.5, 15.5, -0.5, 255.5)
