"""Operand wiring (QuantScheme.operands, graphswap/swap/wiring.py) and the zero-step check against
the dynamic conversion (graphswap/swap/fallback.py): the weight on the multiplier's first operand
computes sum_k T[qw, qa] - checked against an independent numpy reference of that definition and
against the transposed table run the ordinary way, through every path (the compiled op, numpy,
lut_grad gradients), saved and reloaded; the measured choice picks the wiring a designed table
makes decisive, and keeps the default on symmetric tables; the check keeps the dynamic conversion
exactly when it is closer to the original, and says so."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from click.testing import CliRunner

import graphswap
from conftest import SAMPLE_DATA, SAMPLE_MODEL, assert_same_gradients
from graphswap.cli import main
from graphswap.errors import QuantizationError
from graphswap.kernels import QuantScheme, resolve_kernel
from graphswap.kernels.quantized import activation_quantization, quantize_weights
from graphswap.multipliers.table_files import write_lut
from graphswap.swap import fallback
from graphswap.swap.calibration import quantizing_layers

VALUES = np.arange(256)


def lut_file(tmp_path, name, table):
    path = tmp_path / f"{name}.lut"
    write_lut(path, np.asarray(table, np.int64).reshape(256, 256), signed=False)
    return str(path)


def truncating(first_bits_kept: int):
    """An unsigned table that keeps only the top bits of its FIRST operand (exact otherwise)."""
    mask = (0xFF << (8 - first_bits_kept)) & 0xFF
    return (VALUES[:, None] & mask) * VALUES[None, :]


def reference_by_products(a, b, scheme, signed, term):
    """The dequantized sums of term(qa_ik, qb_kj, weight negative, z_a), one product at a time
    (a definition written out, no table rearranged)."""
    qa, sa, za, _ = activation_quantization(a, scheme, signed)
    qb, negative, sb, _, _ = quantize_weights(b, scheme)
    acc = np.zeros((a.shape[0], b.shape[1]), np.int64)
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            acc[i, j] = sum(term(int(qa[i, k]), int(qb[k, j]),
                                 negative is not None and bool(negative[k, j]), int(za))
                            for k in range(a.shape[1]))
    return ((sa * sb)[None, :] * acc.astype(np.float64)).astype(np.float32)


def reference_weight_first(a, b, table, scheme):
    """sum_k T[m_kj, qa_ik] * sign - z_a-free sign-magnitude sums with the weight code on the
    FIRST operand (the definition, no table transposition)."""
    table = np.asarray(table, np.int64).reshape(256, 256)

    def term(code, magnitude, negative, za):
        sign = -1 if negative else 1
        return sign * int(table[magnitude, code]) - za * sign * magnitude

    return reference_by_products(a, b, scheme, False, term)


def test_weight_first_matmul_is_the_definition_and_the_transposed_table(tmp_path):
    rng = np.random.default_rng(0)
    table = truncating(3) + rng.integers(0, 40, (256, 256))   # asymmetric, nothing exact
    kernel = resolve_kernel(lut_file(tmp_path, "asym", table))
    transposed = resolve_kernel(lut_file(tmp_path, "asym_t", table.T))
    a = rng.uniform(-0.2, 1.0, (7, 19)).astype(np.float32)
    b = rng.normal(size=(19, 5)).astype(np.float32)
    scheme = QuantScheme(activations="static", activation_range=(-0.2, 1.0),
                         operands="weight_first").resolve(False)
    expected = reference_weight_first(a, b, table, scheme)
    np.testing.assert_array_equal(kernel.matmul(a, b, scheme), expected)
    plain = QuantScheme(activations="static", activation_range=(-0.2, 1.0)).resolve(False)
    np.testing.assert_array_equal(transposed.matmul(a, b, plain), expected)
    assert not np.array_equal(kernel.matmul(a, b, plain), expected)   # the wiring matters


def test_weight_first_layers_run_the_transposed_table_everywhere(tmp_path, digits):
    rng = np.random.default_rng(1)
    table = truncating(4) + rng.integers(0, 30, (256, 256))
    spec, spec_t = lut_file(tmp_path, "asym", table), lut_file(tmp_path, "asym_t", table.T)
    model = keras.models.load_model(SAMPLE_MODEL)
    x = digits["x_test"][:24].astype(np.float32)
    wired = graphswap.rewrite_model(model, kernel=spec, calibration_data=x, backward="lut_grad",
                                    quantization={"operands": "weight_first"},
                                    bias_correction=None, dynamic_fallback=False)
    plain = graphswap.rewrite_model(model, kernel=spec_t, calibration_data=x, backward="lut_grad",
                                    operands="activation_first", bias_correction=None,
                                    dynamic_fallback=False)
    np.testing.assert_array_equal(np.asarray(wired(x)), np.asarray(plain(x)))

    assert_same_gradients(wired, plain, x[:8])
    path = tmp_path / "wired.keras"
    wired.save(path)
    reloaded = keras.models.load_model(path)
    np.testing.assert_array_equal(np.asarray(reloaded(x)), np.asarray(wired(x)))
    for _, layer in quantizing_layers(reloaded):
        assert layer.current_quantization().operands == "weight_first"
        assert "weights on the multiplier's first operand" in \
            layer.current_quantization().describe()


def test_auto_wiring_takes_the_port_a_designed_table_favours(tmp_path, digits):
    model = keras.models.load_model(SAMPLE_MODEL)
    x = digits["x_train"][:160].astype(np.float32)
    # the first operand keeps 2 bits: on it the activations lose almost everything, the
    # weights (whose per-channel largest magnitude is code 255) far less
    spec = lut_file(tmp_path, "first2", truncating(2))
    # percentile ranges: the output method would choose each range for the wiring it starts
    # from, and the mirrored circuit below must see the same codes
    auto, report = graphswap.rewrite_model(model, kernel=spec, calibration_data=x,
                                           return_report=True, dynamic_fallback=False,
                                           calibration_method="percentile")
    orders = {layer.name: layer.current_quantization().operands
              for _, layer in quantizing_layers(auto)}
    line = next(note for note in report.notes if note.startswith("operand wiring"))
    assert list(orders.values()).count("activation_first") <= 1, (orders, line)
    # the same circuit wired the other way round: auto takes activations first
    swapped = lut_file(tmp_path, "second2", truncating(2).T)
    auto_t = graphswap.rewrite_model(model, kernel=swapped, calibration_data=x,
                                     dynamic_fallback=False, calibration_method="percentile")
    assert [layer.current_quantization().operands for _, layer in quantizing_layers(auto_t)] \
        == [("weight_first" if orders[name] == "activation_first" else "activation_first")
            for name in orders]


def test_symmetric_tables_keep_the_default_wiring(digits):
    model = keras.models.load_model(SAMPLE_MODEL)
    x = digits["x_train"][:64].astype(np.float32)
    swapped, report = graphswap.rewrite_model(model, kernel="mul8u_drum4", calibration_data=x,
                                              return_report=True, dynamic_fallback=False)
    assert {layer.current_quantization().operands for _, layer in quantizing_layers(swapped)} \
        == {"activation_first"}
    assert any("no layer runs an asymmetric 8x8 multiplier table" in n for n in report.notes)


def test_wiring_errors_are_clear(tmp_path):
    model = keras.models.load_model(SAMPLE_MODEL)
    with pytest.raises(QuantizationError, match="operands='auto' measures each layer's wiring"):
        graphswap.rewrite_model(model, kernel="mul8u_drum4", operands="auto")
    with pytest.raises(QuantizationError, match="operands must be one of"):
        graphswap.rewrite_model(model, kernel="mul8u_drum4", operands="sideways")
    with pytest.raises(QuantizationError, match="operand order must be one of"):
        QuantScheme(operands="B_first")
    narrow = resolve_kernel(str(SAMPLE_DATA.parent / "multipliers" / "mul8x4u_gsbam4.c"))
    with pytest.raises(QuantizationError, match="only 8x8 multipliers take"):
        narrow.oriented("weight_first")


def test_cli_operands_option(tmp_path):
    output = tmp_path / "wf.keras"
    result = CliRunner().invoke(main, ["convert", str(SAMPLE_MODEL), "-k", "mul8u_drum4",
                                       "--operands", "weight-first", "-o", str(output)])
    assert result.exit_code == 0, result.output
    reloaded = keras.models.load_model(output)
    assert {layer.current_quantization().operands
            for _, layer in quantizing_layers(reloaded)} == {"weight_first"}
    refused = CliRunner().invoke(main, ["convert", str(SAMPLE_MODEL), "-k", "mul8u_drum4",
                                        "--operands", "auto", "-o", str(tmp_path / "a.keras")])
    assert refused.exit_code == 1 and "--operands auto needs --calibrate" in refused.output


# -- the check against the dynamic conversion ---------------------------------------------------

def test_fidelity_is_agreement_for_classes_and_r2_otherwise():
    reference = [np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]]),
                 np.array([[1.0], [2.0], [3.0], [4.0]])]
    outputs = [np.array([[0.4, 0.6], [0.2, 0.8], [0.9, 0.1], [0.1, 0.9]]),
               np.array([[1.0], [2.0], [3.0], [5.0]])]
    # agreement 3/4; R^2 = 1 - mean(err^2) / var(ref) = 1 - 0.25 / 1.25
    assert fallback.fidelity(reference, outputs) == pytest.approx((0.75 + 0.8) / 2)
    assert fallback.fidelity([reference[1]], [np.full((4, 1), np.nan)]) == 0.0


def test_the_check_keeps_the_dynamic_conversion_when_it_is_closer(digits, monkeypatch):
    model = keras.models.load_model(SAMPLE_MODEL)
    x = digits["x_train"][:600].astype(np.float32)
    kept, report = graphswap.rewrite_model(model, kernel="mul8u_drum4", calibration_data=x,
                                           calibration_samples=400, return_report=True)
    line = report.notes[-1]
    assert line.startswith("zero-step check on 200 calibration-data examples beyond the 400")
    assert line.endswith("kept the calibrated conversion"), line
    assert "calibrated + weight tuning" in line and "% dynamic" in line
    assert all(layer.current_quantization().activations == "static"
               for _, layer in quantizing_layers(kept))
    # a calibration made useless (every range collapsed to a sliver): the dynamic one is kept
    real = graphswap.swap.calibration.RangeObserver.range

    def collapsed(self, *args, **kwargs):
        lo, hi = real(self, *args, **kwargs)
        return lo * 1e-3, hi * 1e-3

    monkeypatch.setattr(graphswap.swap.calibration.RangeObserver, "range", collapsed)
    dynamic, report = graphswap.rewrite_model(model, kernel="mul8u_drum4", calibration_data=x,
                                              calibration_samples=400, return_report=True)
    assert "kept the dynamic conversion - activations quantized per call" in report.notes[-1]
    assert all(layer.current_quantization().activations == "dynamic"
               for _, layer in quantizing_layers(dynamic))
    assert any(note.startswith("(measured, not kept) calibrated") for note in report.notes)
    measured = report.notes[-1].split("other outputs) ")[1].split(": kept")[0]
    scores = {part.split("% ")[1]: float(part.split("%")[0]) for part in measured.split(", ")}
    assert scores["dynamic"] > max(scores["calibrated"], scores["calibrated + weight tuning"])
    # and switched off, the calibrated model is returned whatever it scores
    forced = graphswap.rewrite_model(model, kernel="mul8u_drum4", calibration_data=x,
                                     calibration_samples=400, dynamic_fallback=False)
    assert all(layer.current_quantization().activations == "static"
               for _, layer in quantizing_layers(forced))


def test_the_check_is_refused_where_no_dynamic_model_exists(digits):
    model = keras.models.load_model(SAMPLE_MODEL)
    x = digits["x_train"][:64].astype(np.float32)
    with pytest.raises(QuantizationError, match="dynamic_fallback=True needs a dynamic"):
        graphswap.rewrite_model(model, kernel="mul8u_drum4", calibration_data=x,
                                quantization={"activations": "static"}, dynamic_fallback=True)
