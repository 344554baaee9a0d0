"""Bias compensation of recurrent cells: the recurrent products' mean error (the state h at every
step; a GRU with reset_after=False also r * h) folded into the offset of the input product's
output correction, on the columns each product adds to (a GRU with reset_after=True: its
candidate columns, gated by r, get the mean of r * e).  Checked against an independent numpy recurrence
(tests/reference.py's quantized matmul with the multiplier's table and the exact table on the
same codes), for both methods; and on a seeded example the corrected model's output error
against the float model is not larger than without the recurrent term or without correction."""

import keras
import numpy as np
import pytest

import reference
from graphswap.swap import compensation, rewrite_model
from graphswap.swap.compensation import compensate_bias

STEPS, FEATURES, UNITS = 6, 4, 5
KERNEL = "mul8u_drum4"

CASES = {
    "lstm": lambda: keras.layers.LSTM(UNITS, return_sequences=True),
    "gru": lambda: keras.layers.GRU(UNITS, return_sequences=True),
    "gru_reset_before": lambda: keras.layers.GRU(UNITS, reset_after=False,
                                                 return_sequences=True),
    "simple_rnn": lambda: keras.layers.SimpleRNN(UNITS, return_sequences=True),
}


def _inputs(seed, batch):
    return np.random.default_rng(seed).normal(size=(batch, STEPS, FEATURES)).astype(np.float32)


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def _reference_errors(case, weights, x, ranges):
    """The recurrence in numpy with the multiplier's table, each product also computed with the
    exact table on the same codes.  Returns (input products approximate, exact; the recurrent
    error summed per correction column, rows counted)."""
    table = reference.builtin_reference(KERNEL)
    exact_table = reference.builtin_reference("mul8u_exact")

    def both(a, w, operand):
        mode = {"activation_range": ranges[operand]}
        return (reference.quantized_matmul(a, w, table, False, mode).astype(np.float64),
                reference.quantized_matmul(a, w, exact_table, False, mode).astype(np.float64))

    kernel, recurrent = weights[0], weights[1]
    bias = weights[2]
    units = recurrent.shape[0]
    h = np.zeros((x.shape[0], units), np.float32)
    c = np.zeros_like(h)
    approx_in, exact_in = [], []
    recurrent_error = np.zeros(kernel.shape[1])
    # Keras' TensorFlow loop runs the step at time zero once before the loop (for the output's
    # shape and dtype), so the observed operands hold that step twice: so does the reference
    for t in [0, *range(x.shape[1])]:
        if t == 0:
            h = np.zeros((x.shape[0], units), np.float32)
            c = np.zeros_like(h)
        xa, xe = both(x[:, t], kernel, "x")
        approx_in.append(xa)
        exact_in.append(xe)
        if case == "gru_reset_before":
            ha, he = both(h, recurrent[:, :2 * units], "h")
            recurrent_error[:2 * units] += (he - ha).sum(axis=0)
            x_z, x_r, x_h = np.split(xa + bias, 3, axis=1)
            r_z, r_r = np.split(ha, 2, axis=1)
            z, r = _sigmoid(x_z + r_z), _sigmoid(x_r + r_r)
            reset = (r * h).astype(np.float32)
            ra, re = both(reset, recurrent[:, 2 * units:], "rh")
            recurrent_error[2 * units:] += (re - ra).sum(axis=0)
            hh = np.tanh(x_h + ra)
            h = (z * h + (1 - z) * hh).astype(np.float32)
            continue
        ha, he = both(h, recurrent, "h")
        if case.startswith("gru"):   # candidate columns: r * (h @ R_h + b), their error r * e
            recurrent_error[:2 * units] += (he - ha)[:, :2 * units].sum(axis=0)
            x_r, r_r = (xa + bias[0])[:, units:2 * units], (ha + bias[1])[:, units:2 * units]
            r = _sigmoid(x_r + r_r) if case == "gru" else 1.0   # "gru_ungated": as if additive
            recurrent_error[2 * units:] += (r * (he - ha)[:, 2 * units:]).sum(axis=0)
        else:
            recurrent_error += (he - ha).sum(axis=0)
        if case == "lstm":
            i, f, g, o = np.split(xa + bias + ha, 4, axis=1)
            c = (_sigmoid(f) * c + _sigmoid(i) * np.tanh(g)).astype(np.float32)
            h = (_sigmoid(o) * np.tanh(c)).astype(np.float32)
        elif case == "simple_rnn":
            h = np.tanh(xa + bias + ha).astype(np.float32)
        else:
            x_z, x_r, x_h = np.split(xa + bias[0], 3, axis=1)
            r_z, r_r, r_h = np.split(ha + bias[1], 3, axis=1)
            z, r = _sigmoid(x_z + r_z), _sigmoid(x_r + r_r)
            h = (z * h + (1 - z) * np.tanh(x_h + r * r_h)).astype(np.float32)
    rows = x.shape[0] * (x.shape[1] + 1)
    return np.concatenate(approx_in), np.concatenate(exact_in), recurrent_error, rows


def _calibrated(case, x):
    keras.utils.set_random_seed(6)
    inputs = keras.Input((STEPS, FEATURES))
    model = keras.Model(inputs, CASES[case]()(inputs))
    return model, rewrite_model(model, KERNEL, bias_correction=None, calibration_data=x)


@pytest.mark.parametrize("method", ["mean", "moments"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_recurrent_error_is_folded_into_the_offset(case, method):
    x = _inputs(1, 20)
    model, swapped = _calibrated(case, x)
    cell = swapped.layers[-1].cell
    assert cell.output_correction is None or not np.any(cell.output_correction["offset"])
    step = compensate_bias(swapped, x, method=method)
    ranges = {"x": cell.current_quantization().activation_range,
              "h": cell.intermediate_ranges()["recurrent"],
              "rh": cell.intermediate_ranges().get("reset_state")}
    approx, exact, recurrent_error, rows = _reference_errors(
        case, model.layers[-1].get_weights(), x, ranges)
    folded = recurrent_error / rows
    if method == "mean":
        gain = np.ones(approx.shape[1])
        offset = (exact - approx).mean(axis=0) + folded
    else:
        gain = np.where(approx.std(axis=0) > 0, exact.std(axis=0) / approx.std(axis=0), 1.0)
        offset = exact.mean(axis=0) - gain * approx.mean(axis=0) + folded
    correction = cell.output_correction
    got_gain = np.ones_like(gain) if correction["gain"] is None else np.asarray(correction["gain"])
    np.testing.assert_allclose(got_gain, gain, rtol=1e-4)
    scale = np.abs(offset).max()
    np.testing.assert_allclose(np.asarray(correction["offset"]), offset, rtol=0,
                               atol=1e-4 * scale)
    # the recurrent term is really there: not the input product's offset alone
    assert np.abs(folded).max() > 100 * 1e-4 * scale
    if case == "gru":   # the r-gated candidate columns: r * e, not e
        _, _, ungated, _ = _reference_errors("gru_ungated", model.layers[-1].get_weights(), x,
                                             ranges)
        assert np.abs(ungated / rows - folded)[2 * UNITS:].max() > 100 * 1e-4 * scale
    summary = step.layers[f"{swapped.layers[-1].name}/cell"]
    assert summary["mean_abs_recurrent_offset"] == pytest.approx(np.abs(folded).mean(),
                                                                  rel=1e-3)


@pytest.mark.parametrize("case", ["lstm", "gru", "gru_reset_before"])
def test_folding_the_recurrent_error_does_not_raise_the_output_error(case, monkeypatch):
    """Seeded: held-out error against the float model with no correction, with the input
    product's only (the previous behaviour) and with the recurrent products folded in."""
    x, held_out = _inputs(2, 64), _inputs(3, 32)
    model, plain = _calibrated(case, x)
    want = np.asarray(model(held_out))

    def error(swapped):
        return float(np.abs(np.asarray(swapped(held_out)) - want).mean())

    errors = {"none": error(plain)}
    _, folded = _calibrated(case, x)
    compensate_bias(folded, x, method="mean")
    errors["folded"] = error(folded)
    _, input_only = _calibrated(case, x)
    monkeypatch.setattr(compensation, "recurrent_products", lambda cell: {})
    compensate_bias(input_only, x, method="mean")
    errors["input only"] = error(input_only)
    assert errors["folded"] <= errors["none"], errors
    assert errors["folded"] <= errors["input only"], errors
