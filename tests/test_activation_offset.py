"""The activation code offset (QuantScheme.activation_offset, measured per layer by
graphswap/swap/wiring.py): a layer with offset o computes sum_k T[clip(qa + o), qw] and counts the
codes as they were - checked against an independent numpy reference of that definition, against
the shifted table run the ordinary way through every path (the compiled op, lut_grad gradients,
XLA under jit_compile, save and reload), and the exact products compensation measures against never move; the measured
choice takes the half-step offset on a table that floors its activations and none on tables
without equal runs of rows; bad offsets are one clear error."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import graphswap
from conftest import SAMPLE_DATA, SAMPLE_MODEL, assert_same_gradients
from graphswap.errors import QuantizationError
from graphswap.kernels import QuantScheme, resolve_kernel
from graphswap.multipliers.table_files import write_lut
from graphswap.swap.calibration import quantizing_layers
from graphswap.swap.wiring import candidates, repeated_rows
from test_swap_wiring import reference_by_products

VALUES = np.arange(256)
SIGNED_VALUES = np.where(VALUES >= 128, VALUES - 256, VALUES)


def flooring(step: int, signed: bool) -> np.ndarray:
    """A table in code order whose operands both keep step * floor(v / step) (mul8s_1L1G: 8)."""
    values = SIGNED_VALUES if signed else VALUES
    kept = (values // step) * step
    return np.outer(kept, kept).reshape(-1)


def lut_file(tmp_path, name, table, signed):
    path = tmp_path / f"{name}.lut"
    write_lut(path, np.asarray(table, np.int64).reshape(-1), signed=signed)
    return str(path)


def reference_offset_matmul(a, b, table, scheme):
    """sum_k T[code(value(qa) + o clipped), qw] (symmetric weights, signed codes: the
    definition, no table shifting)."""
    table = np.asarray(table, np.int64).reshape(256, 256)

    def term(code, weight, negative, za):
        byte = code & 0xFF                       # the code's two's-complement value, moved
        value = min(127, max(-128, (byte - 256 if byte >= 128 else byte) + scheme.activation_offset))
        return int(table[value & 0xFF, weight & 0xFF])

    return reference_by_products(a, b, scheme, True, term)


def test_an_offset_layer_computes_the_definition_and_the_shifted_table(tmp_path):
    rng = np.random.default_rng(0)
    table = flooring(8, signed=True) + rng.integers(-30, 30, 65536)
    kernel = resolve_kernel(lut_file(tmp_path, "floor8", table, True))
    shifted = np.asarray(table).reshape(256, 256)[
        (np.clip(SIGNED_VALUES + 4, -128, 127) & 0xFF)]
    shifted_kernel = resolve_kernel(lut_file(tmp_path, "floor8_o4", shifted, True))
    a = rng.uniform(-0.3, 1.0, (6, 23)).astype(np.float32)
    a[0, :3] = 1.0                     # codes near 127 saturate after the offset
    b = rng.normal(size=(23, 5)).astype(np.float32)
    scheme = QuantScheme(activations="static", activation_range=(-0.3, 1.0),
                         activation_offset=4).resolve(True)
    expected = reference_offset_matmul(a, b, table, scheme)
    np.testing.assert_array_equal(kernel.matmul(a, b, scheme), expected)
    plain = QuantScheme(activations="static", activation_range=(-0.3, 1.0)).resolve(True)
    np.testing.assert_array_equal(shifted_kernel.matmul(a, b, plain), expected)
    assert not np.array_equal(kernel.matmul(a, b, plain), expected)   # the offset matters
    # the exact products compensation compares with count the codes as they are
    exact = kernel.exact_products()
    np.testing.assert_array_equal(exact.matmul(a, b, scheme), exact.matmul(a, b, plain))


def test_offset_layers_run_the_shifted_table_everywhere(tmp_path, digits):
    unsigned = (VALUES[:, None] // 8 * 8) * VALUES[None, :]
    spec = lut_file(tmp_path, "floor8u", unsigned, False)
    shifted = lut_file(tmp_path, "floor8u_o4", unsigned[np.clip(VALUES + 4, 0, 255)], False)
    model = keras.models.load_model(SAMPLE_MODEL)
    x = digits["x_test"][:24].astype(np.float32)
    options = dict(calibration_data=x, backward="lut_grad", bias_correction=None,
                   dynamic_fallback=False, calibration_method="percentile",
                   operands="activation_first")
    moved = graphswap.rewrite_model(model, kernel=spec, quantization={"activation_offset": 4},
                                    **options)
    plain = graphswap.rewrite_model(model, kernel=shifted, **options)
    np.testing.assert_array_equal(np.asarray(moved(x)), np.asarray(plain(x)))

    assert_same_gradients(moved, plain, x[:8])
    # the XLA path (keras.ops, jit_compile) reads the same moved table (both under XLA: the
    # softmax is XLA's own there, tests/test_xla_bit_identity.py)
    def jitted(m):
        return np.asarray(tf.function(lambda b: m(b, training=False), jit_compile=True)(x[:8]))

    np.testing.assert_array_equal(jitted(moved), jitted(plain))
    assert not np.array_equal(jitted(moved), jitted(graphswap.rewrite_model(
        model, kernel=spec, **options)))   # the offset is not lost under XLA
    path = tmp_path / "moved.keras"
    moved.save(path)
    reloaded = keras.models.load_model(path)
    np.testing.assert_array_equal(np.asarray(reloaded(x)), np.asarray(moved(x)))
    for _, layer in quantizing_layers(reloaded):
        assert layer.current_quantization().activation_offset == 4
        assert "activation codes +4 into the multiplier" in layer.current_quantization().describe()


def test_measured_wiring_rounds_a_flooring_table_and_leaves_others(tmp_path, digits):
    model = keras.models.load_model(SAMPLE_MODEL)
    x = digits["x_train"][:160].astype(np.float32)
    spec = lut_file(tmp_path, "floor8s", flooring(8, signed=True), True)
    moved, report = graphswap.rewrite_model(model, kernel=spec, calibration_data=x,
                                            return_report=True, dynamic_fallback=False)
    offsets = [layer.current_quantization().activation_offset
               for _, layer in quantizing_layers(moved)]
    line = next(note for note in report.notes if note.startswith("operand wiring"))
    # the half step where it cuts a layer's residual error by OFFSET_MARGIN (10%), no other
    assert set(offsets) <= {0, 4} and offsets.count(4) >= 2, (offsets, line)
    assert "activation codes +4" in line and "move their activation codes" in line
    # tables whose rows do not come in equal runs have nothing to measure
    for name in ("mul8u_drum4", "mul8u_mitchell", "mul8s_exact"):
        swapped = graphswap.rewrite_model(model, kernel=name, calibration_data=x[:32],
                                          dynamic_fallback=False)
        # (the signed exact table has only the zero point to measure: its rows do not repeat)
        assert all(all(offset == 0 for _, offset, _ in candidates(layer))
                   for _, layer in quantizing_layers(swapped)), name
        assert {layer.current_quantization().activation_offset
                for _, layer in quantizing_layers(swapped)} == {0}


def test_runs_of_equal_rows_are_recognised_only_when_equal():
    assert repeated_rows(flooring(8, True).reshape(256, 256), True) == 8
    assert repeated_rows(flooring(32, False).reshape(256, 256), False) == 32
    uneven = flooring(8, False).reshape(256, 256).copy()
    uneven[9] += 1                       # one run broken in two: not a uniform step
    assert repeated_rows(uneven, False) == 1


@pytest.mark.parametrize("offset, message", [
    (True, "activation_offset must be an integer from -255 to 255"),
    (300, "activation_offset must be an integer from -255 to 255"),
    (1.5, "activation_offset must be an integer from -255 to 255")])
def test_bad_offsets_are_one_clear_error(offset, message):
    with pytest.raises(QuantizationError, match=message):
        QuantScheme(activation_offset=offset)
    with pytest.raises(QuantizationError, match=message):   # as a saved layer's config holds it
        QuantScheme.from_config({"activation_offset": offset})


def test_an_offset_needs_eight_bit_activations():
    narrow = resolve_kernel(str(SAMPLE_DATA.parent / "multipliers" / "mul4x8u_gsbam4.c"))
    with pytest.raises(QuantizationError, match="applies to 8-bit activation codes, not 4-bit"):
        narrow.oriented("activation_first", 2)
    assert QuantScheme.from_config(QuantScheme(activation_offset=-3).to_config()) \
        .activation_offset == -3
    assert "activation_offset" not in QuantScheme().to_config()   # older files stay as they were


def test_a_port_of_two_levels_is_not_offset(tmp_path):
    """Runs of 64 on signed codes leave two levels (0 and 64): an offset would move a threshold,
    not round (MIN_LEVELS); runs of 32 (four levels) are measured."""
    model = keras.models.load_model(SAMPLE_MODEL)
    for step, expected in ((64, []), (32, [("activation_first", 0, 0), ("activation_first", 16, 0)])):
        spec = lut_file(tmp_path, f"floor{step}", flooring(step, signed=True), True)
        swapped = graphswap.rewrite_model(model, kernel=spec)
        assert [candidates(layer) for _, layer in quantizing_layers(swapped)] == \
            [expected] * len(quantizing_layers(swapped)), step


def test_candidates_read_the_circuit_whatever_the_layer_runs_now(tmp_path):
    """A layer already wired weights-first (its kernel the transposed table) still gets the
    candidates of the circuit itself: the half step on the port that repeats rows (A), for the
    wiring that puts the activations there, none on the other."""
    first_floored = (VALUES[:, None] // 8 * 8) * VALUES[None, :]   # operand A floored to 8
    spec = lut_file(tmp_path, "afloor8", first_floored, False)
    model = keras.models.load_model(SAMPLE_MODEL)
    expected = [("activation_first", 0, 0), ("activation_first", 4, 0), ("weight_first", 0, 0)]
    for operands in ("activation_first", "weight_first"):
        swapped = graphswap.rewrite_model(model, kernel=spec,
                                          quantization={"operands": operands})
        for _, layer in quantizing_layers(swapped):
            assert layer.arithmetic.operands == operands
            assert candidates(layer) == expected, operands
