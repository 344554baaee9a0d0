"""Multiplier-aware weight tuning (ALWANN's, Mrazek et al., ICCAD 2019): zero training steps.

Each quantized weight code q is replaced by the code q' whose approximate products best match
q's exact products over the layer's calibrated activation distribution.  In the code units of
graphswap/kernels/quantized.py's spec (its correction terms are computed exactly, outside the
multiplier), for activation code r (value a: r, or r's two's-complement value for signed
multipliers), activation zero point z_a, weight zero point z_w (0 unless asymmetric), table T
(column: the weight code's 8-bit pattern, q mod 256):

    approx(r, q') = T[r, q'] - z_w a - z_a q' + z_a z_w      (what the kernel sums for code q')
    exact(r, q)   = (a - z_a) (q - z_w)                       (what it should sum for code q)
    E(q', q)      = sum_r p(r) (approx(r, q') - exact(r, q))^2
    remap(q)      = q if E(q, q) is within TIE of min over q' of E(q', q), else the smallest
                    minimising q'  (so the expected error never increases)

over the weight codes the quantizer produces (sign-magnitude magnitudes and asymmetric codes
0..2^N-1, symmetric codes -(2^(N-1)-1)..2^(N-1)-1, N = the multiplier's `weight_bits`, 8 for an
8x8 multiplier).  The sign of a sign-magnitude weight factors out of its error, so its magnitude
is remapped.  p is the histogram of the layer's input codes under its calibrated (static) scheme,
observed on the calibration data with the model running its approximate arithmetic (the layers
before it already tuned); padding taps of a convolution are not counted.  A layer with a second
product (SeparableConv2D's pointwise operand, a recurrent cell's recurrent kernel) gets its own
histogram for it.  The remap depends on the weights' zero point only, so it is per layer - per
output channel only for per-channel asymmetric weights.

Applied to the stored weights: an entry whose code changes gets the value its new code
dequantizes to (sign-magnitude: sign * q' * s_j; symmetric: q' * s_j; asymmetric: (q' - z_j) s_j),
kept inside the channel's original [min, max] (a negative weight whose magnitude becomes 0 stores
-s_j / 4, which still quantizes to magnitude 0 with the negative sign).  The entries that define
the channel's scale (the max |w| entries; asymmetric: the min and max entries) keep their value,
so the scales - recomputed from the weights on every call - do not move, and re-quantizing the
stored weights gives exactly the tuned codes (checked; an entry that would not is left as it
was).  Channels with a non-finite or no nonzero weight are left alone.  The saved model, both
exports and fine-tuning all start from the tuned weights.
"""

from __future__ import annotations

import contextlib
import dataclasses

import keras
import numpy as np

from graphswap.errors import QuantizationError
from graphswap.kernels.quantized import LutKernel, activation_quantization, quantize_weights
from graphswap.kernels.scheme import activation_codes_signed
from graphswap.native.einsum import ELLIPSIS
from graphswap.native import einsum_plan
from graphswap.swap.calibration import (BATCH_SIZE, DEFAULT_CALIBRATION_SAMPLES,
                                        calibration_inputs, observing, quantizing_layers,
                                        run_batches, select_layers)

#: whether rewrite_model tunes weights by default whenever calibration data is given (measured:
#: docs/RECOVERY.md, the harder model's table)
DEFAULT_WEIGHT_TUNING = False
#: relative tolerance under which two expected errors count as equal (the identity wins a tie)
TIE = 1e-9
#: a remapped negative weight of magnitude 0 stores -STORED_ZERO * s (quantizes to 0, sign kept)
STORED_ZERO = 0.25


# --------------------------------------------------------------------------------------------
# the definition, on a table and a histogram
# --------------------------------------------------------------------------------------------

def weight_code_values(encoding: str, bits: int = 8) -> np.ndarray:
    """The weight codes (as integers) the quantizer produces for an N-bit weight operand."""
    if encoding == "symmetric":
        limit = 2 ** (bits - 1) - 1
        return np.arange(-limit, limit + 1)
    return np.arange(2 ** bits)


def activation_values(signed: bool) -> np.ndarray:
    """The value of each activation code (table row) 0..255."""
    rows = np.arange(256)
    return np.where(rows > 127, rows - 256, rows) if signed else rows


def expected_errors(table, counts, encoding: str, *, signed: bool, bits: int = 8,
                    activation_zero: int = 0, weight_zero: int = 0) -> np.ndarray:
    """E[i, j] = E(codes[i], codes[j]) of the module docstring (codes = weight_code_values),
    for the 256x256 (or 65536-entry) table and per-row activation counts (normalised here)."""
    table = np.asarray(table, dtype=np.int64).reshape(256, 256)
    counts = np.asarray(counts, dtype=np.float64).reshape(256)
    total = counts.sum()
    codes = weight_code_values(encoding, bits)
    if total <= 0:
        return np.zeros((len(codes), len(codes)))
    p = counts / total
    rows = np.flatnonzero(p)
    p = p[rows]
    a = activation_values(signed)[rows].astype(np.float64)
    z_a = float(activation_zero)
    z_w = float(weight_zero)
    approx = (table[np.ix_(rows, codes % 256)].astype(np.float64)
              - z_w * a[:, None] - z_a * codes[None, :] + z_a * z_w)
    # exact(r, q) = u_r v_q is rank one, so E[i, j] = A2_i - 2 B_i v_j + U2 v_j^2
    u = a - z_a
    v = codes.astype(np.float64) - z_w
    a2 = p @ (approx * approx)
    b = (p * u) @ approx
    u2 = float(p @ (u * u))
    return a2[:, None] - 2.0 * b[:, None] * v[None, :] + u2 * (v * v)[None, :]


def remap_from_errors(errors: np.ndarray) -> np.ndarray:
    """remap[j] = index of the code replacing codes[j] (the identity on a tie)."""
    errors = np.asarray(errors, dtype=np.float64)
    best = np.argmin(errors, axis=0)
    columns = np.arange(errors.shape[1])
    lowest = errors[best, columns]
    own = errors[columns, columns]
    scale = np.maximum(np.abs(errors).max(axis=0), 1.0)
    keep = own <= lowest + TIE * scale
    return np.where(keep, columns, best)


def tuned_remap(table, counts, encoding: str, *, signed: bool, bits: int = 8,
                activation_zero: int = 0, weight_zero: int = 0):
    """(codes, remapped codes, E) of the module docstring: codes[j] is replaced by remapped[j]."""
    errors = expected_errors(table, counts, encoding, signed=signed, bits=bits,
                             activation_zero=activation_zero, weight_zero=weight_zero)
    codes = weight_code_values(encoding, bits)
    return codes, codes[remap_from_errors(errors)], errors


# --------------------------------------------------------------------------------------------
# one weight operand
# --------------------------------------------------------------------------------------------

def _code_integers(codes: np.ndarray, encoding: str) -> np.ndarray:
    """quantize_weights' uint8 codes as integer code values (int8 patterns for symmetric)."""
    if encoding == "symmetric":
        return codes.view(np.int8).astype(np.int64)
    return codes.astype(np.int64)


def _dequantized(codes, negative, scale, zero, encoding):
    if encoding == "sign_magnitude":
        magnitude = codes * scale
        return np.where(negative, np.where(codes == 0, -STORED_ZERO * scale, -magnitude),
                        magnitude)
    if encoding == "asymmetric":
        return (codes - zero) * scale
    return codes * scale


def tune_operand(values: np.ndarray, scheme, table, counts, *, signed: bool, bits: int = 8,
                 activation_bits: int = 8):
    """The weights `values` (output channel last) tuned for the activation histogram `counts`
    under the resolved static `scheme` (module docstring); `bits` / `activation_bits`: the
    multiplier's weight / activation widths (8xN, Nx8).  Returns (tuned float32 values of the
    same shape, summary dict: changed entries, expected error before and after)."""
    values = np.asarray(values, dtype=np.float32)
    encoding = scheme.weights
    shape = values.shape
    n = shape[-1]
    flat = values.reshape(-1, n)
    summary = {"weights": int(flat.size), "changed": 0, "error_before": 0.0, "error_after": 0.0}
    if flat.size == 0:
        return values.copy(), summary
    codes8, negative, scale, zero, _ = quantize_weights(flat, scheme, bits)
    codes = _code_integers(codes8, encoding)
    negative = np.zeros_like(codes, bool) if negative is None else negative
    _, zero_a = (None, 0) if signed else activation_zero_of(scheme, activation_bits)
    per_channel = scheme.granularity == "per_channel"
    # the entries that define each channel's (or the tensor's) scale keep their value
    f64 = flat.astype(np.float64)
    usable = np.isfinite(f64).all(axis=0) if per_channel else \
        np.full(n, bool(np.isfinite(f64).all()))
    magnitude = np.abs(np.where(np.isfinite(f64), f64, 0.0))
    if encoding == "asymmetric":
        lo = f64.min(axis=0) if per_channel else np.full(n, f64.min())
        hi = f64.max(axis=0) if per_channel else np.full(n, f64.max())
        fixed = (f64 == lo[None, :]) | (f64 == hi[None, :])
        usable &= hi > lo
    else:
        amax = magnitude.max(axis=0) if per_channel else np.full(n, magnitude.max())
        fixed = magnitude == amax[None, :]
        lo, hi = -amax, amax
        usable &= amax > 0
    target = codes.copy()
    remaps = {}        # weight zero point -> (first code, remapped codes, E)
    keys = {}          # channel -> its weight zero point
    for j in np.flatnonzero(usable):
        z_w = int(zero[j]) if encoding == "asymmetric" else 0
        if z_w not in remaps:
            all_codes, remapped, errors = tuned_remap(table, counts, encoding, signed=signed,
                                                      bits=bits, activation_zero=zero_a,
                                                      weight_zero=z_w)
            remaps[z_w] = (int(all_codes[0]), remapped, errors)
        keys[j] = z_w
        first, remapped, _ = remaps[z_w]
        target[:, j] = np.where(fixed[:, j], codes[:, j], remapped[codes[:, j] - first])
    changed = target != codes
    tuned = f64.copy()
    new_values = _dequantized(target, negative, scale[None, :], zero[None, :], encoding)
    new_values = np.clip(new_values, lo[None, :], hi[None, :])
    tuned[changed] = new_values[changed]
    tuned = tuned.astype(np.float32)
    # re-quantizing must give the tuned codes (and signs) with the same scales; an entry that
    # would not (never expected: float32 rounding at the edge of a code) keeps its value
    check, check_negative, check_scale, check_zero, _ = quantize_weights(tuned, scheme, bits)
    if not (np.array_equal(check_scale, scale) and np.array_equal(check_zero, zero)):
        return values.copy(), summary
    wrong = changed & (_code_integers(check, encoding) != target)
    if check_negative is not None:
        wrong |= changed & (check_negative != negative)
    tuned[wrong] = flat[wrong]
    target[wrong] = codes[wrong]
    before = after = 0.0
    for j, z_w in keys.items():
        first, _, errors = remaps[z_w]
        before += float(errors[codes[:, j] - first, codes[:, j] - first].sum())
        after += float(errors[target[:, j] - first, codes[:, j] - first].sum())
    summary.update(changed=int((target != codes).sum()), error_before=before, error_after=after)
    return tuned.reshape(shape), summary


def activation_zero_of(scheme, bits: int = 8):
    """(scale, zero point) of a static unsigned scheme's `bits`-bit activations (the spec's
    rule)."""
    _, scale, zero, _ = activation_quantization(np.zeros(0, np.float32), scheme, False, bits)
    return scale, zero


# --------------------------------------------------------------------------------------------
# layers
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class WeightOperand:
    """One weight product of a layer: the variable, which entries (an index array of the
    variable's flat entries, output channel last, as the kernel quantizes them), and the point
    of its activation operand (None: the layer's input)."""

    name: str
    variable: object
    entries: np.ndarray
    point: str | None = None


def _indices(variable) -> np.ndarray:
    return np.arange(int(np.prod(variable.shape)), dtype=np.int64).reshape(tuple(variable.shape))


def weight_operands(layer) -> list[WeightOperand]:
    """The table-driven weight products of a swapped layer (or recurrent cell)."""
    # imported here: the layer classes are only needed to tell the types apart
    from graphswap.swap.layers_attention import SwappedEinsumDense
    from graphswap.swap.layers_conv import (SwappedConv2DTranspose, SwappedDepthwiseConv2D,
                                            SwappedSeparableConv2D)
    if isinstance(layer, SwappedSeparableConv2D):
        depthwise = _indices(layer.depthwise_kernel)
        return [WeightOperand("depthwise_kernel", layer.depthwise_kernel,
                              depthwise.reshape(*depthwise.shape[:2], 1, -1)),
                WeightOperand("pointwise_kernel", layer.pointwise_kernel,
                              _indices(layer.pointwise_kernel), "pointwise")]
    if isinstance(layer, SwappedDepthwiseConv2D):
        index = _indices(layer.kernel)
        return [WeightOperand("kernel", layer.kernel, index.reshape(*index.shape[:2], 1, -1))]
    if isinstance(layer, SwappedConv2DTranspose):
        return [WeightOperand("kernel", layer.kernel,
                              np.transpose(_indices(layer.kernel), (0, 1, 3, 2)))]
    if isinstance(layer, SwappedEinsumDense):
        lhs = str(layer.equation).replace(" ", "").split(",")[0]
        rank = len(lhs.replace(ELLIPSIS, "")) + (1 if ELLIPSIS in lhs else 0)
        plan = einsum_plan(layer.equation, rank)
        index = _indices(layer.kernel)
        k, n = plan.kernel_matrix_shape(index.shape)
        return [WeightOperand("kernel", layer.kernel,
                              np.transpose(index, plan.kernel_permutation).reshape(k, n))]
    if isinstance(layer, keras.layers.GRUCell) and not layer.reset_after:
        index = _indices(layer.recurrent_kernel)
        units = int(layer.units)
        return [WeightOperand("kernel", layer.kernel, _indices(layer.kernel)),
                WeightOperand("recurrent_kernel[:, :2u]", layer.recurrent_kernel,
                              index[:, :2 * units], "recurrent"),
                WeightOperand("recurrent_kernel[:, 2u:]", layer.recurrent_kernel,
                              index[:, 2 * units:], "reset_state")]
    if "recurrent" in getattr(layer, "intermediate_points", ()):
        return [WeightOperand("kernel", layer.kernel, _indices(layer.kernel)),
                WeightOperand("recurrent_kernel", layer.recurrent_kernel,
                              _indices(layer.recurrent_kernel), "recurrent")]
    kernel = getattr(layer, "kernel", None)
    if kernel is None:
        return []
    index = _indices(kernel)
    return [WeightOperand("kernel", kernel, index.reshape(-1, index.shape[-1]))]


@dataclasses.dataclass
class WeightTuningReport:
    """What tune_weights did: per layer path, per operand, its summary numbers; skipped layers
    with the reason."""

    samples: int
    layers: dict          # path -> {operand name: summary}
    skipped: dict = dataclasses.field(default_factory=dict)   # path -> reason

    def lines(self) -> list[str]:
        shown = []
        for path, operands in self.layers.items():
            total = sum(s["weights"] for s in operands.values())
            changed = sum(s["changed"] for s in operands.values())
            before = sum(s["error_before"] for s in operands.values())
            after = sum(s["error_after"] for s in operands.values())
            drop = f", expected product error -{100 * (1 - after / before):.0f}%" \
                if before > 0 else ""
            shown.append(f"{path} ({changed}/{total} weight codes changed{drop})")
        lines = [f"weight tuning (multiplier-aware weight codes) on {self.samples} samples: "
                 f"{', '.join(shown) or 'no layer'}"]
        if self.skipped:
            lines.append("weight tuning skipped: " + ", ".join(
                f"{path} ({why})" for path, why in self.skipped.items()))
        return lines


def _table_of(arithmetic):
    """(the 256x256 integer table, weight bits) of an integer multiplier kernel, else (None, 8)."""
    if not isinstance(arithmetic, LutKernel):
        return None, 8     # float kernels, FP8 multipliers (their codes are not integers)
    multiplier = arithmetic.multiplier
    table = getattr(multiplier, "table", None)
    if table is None or np.asarray(table).size != 65536:
        return None, 8
    return np.asarray(table, dtype=np.int64).reshape(256, 256), \
        int(getattr(multiplier, "weight_bits", 8))


def code_histogram(x, scheme, signed: bool, activation_bits: int = 8) -> np.ndarray:
    """Counts of each of the 256 activation codes of the finite values of `x` under `scheme`."""
    codes, _, _, bad = activation_quantization(x, scheme, signed, activation_bits)
    codes = codes.reshape(-1) if bad is None else codes[~bad]
    return np.bincount(codes.reshape(-1), minlength=256)


def _tuned_value(operand, scheme, table, counts, *, signed: bool, bits: int,
                 activation_bits: int = 8):
    """(the value of the operand's variable with its entries' codes tuned, tune_operand's
    summary)."""
    stored = np.array(operand.variable.numpy(), dtype=np.float32)
    flat = stored.reshape(-1)
    tuned, summary = tune_operand(flat[operand.entries], scheme, table, counts, signed=signed,
                                  bits=bits, activation_bits=activation_bits)
    flat[operand.entries] = tuned
    return flat.reshape(stored.shape), summary


def tuned_operand_values(layer, scheme, counts, activation_signed: bool) -> np.ndarray:
    """The value of `layer`'s one weight variable with its codes tuned for the activation code
    histogram `counts` under `scheme` (a wiring being measured: graphswap.swap.wiring)."""
    (operand,) = weight_operands(layer)
    table, bits = _table_of(layer.arithmetic.wired(scheme))
    return _tuned_value(operand, scheme, table, counts, signed=activation_signed, bits=bits)[0]


@contextlib.contextmanager
def substituted_weights(layer, values):
    """While inside, `layer`'s one weight variable holds `values`; its own value comes back."""
    (operand,) = weight_operands(layer)
    stored = operand.variable.numpy()
    operand.variable.assign(values)
    try:
        yield
    finally:
        operand.variable.assign(stored)


def tune_weights(model, data, *, samples: int = DEFAULT_CALIBRATION_SAMPLES,
                 batch_size: int = BATCH_SIZE, layers=None) -> WeightTuningReport:
    """Tune the stored weights of every calibrated, table-driven swapped layer of `model` (or
    those whose paths are in `layers`), in model order (module docstring).  Changes `model` in
    place; returns a WeightTuningReport."""
    inputs = calibration_inputs(model, data, samples, what="weight tuning data")
    targets = select_layers(quantizing_layers(model), layers)
    if not targets:
        raise QuantizationError(f"model {model.name!r} has no swapped layer that quantizes (8-bit "
                                f"multiplier kernels); there are no weight codes to tune")
    report = WeightTuningReport(len(inputs[0]), {})
    for path, layer in targets:
        table, bits = _table_of(layer.arithmetic)
        if table is None:
            report.skipped[path] = f"{layer.arithmetic.spec} is not table-driven"
            continue
        if layer.current_quantization() is None or \
                layer.current_quantization().activations != "static":
            report.skipped[path] = "not calibrated (static activations needed)"
            continue
        operands = weight_operands(layer)
        signed = bool(layer.arithmetic.signed)
        histograms = {operand.point: np.zeros(256, np.int64) for operand in operands}

        activation_bits = getattr(layer.arithmetic, "activation_bits", 8)   # Nx8: N

        def record(observed, x, point=None, layer=layer, histograms=histograms, signed=signed,
                   activation_bits=activation_bits):
            if point not in histograms:
                return
            scheme = layer.current_quantization(point)
            if scheme is None or scheme.activation_range is None:
                return
            histograms[point] += code_histogram(x, scheme, signed, activation_bits)

        with observing([layer], record):
            run_batches(model, inputs, batch_size)
        summaries = {}
        for operand in operands:
            counts = histograms[operand.point]
            if not counts.any():
                continue
            scheme = layer.current_quantization(operand.point)
            value, summaries[operand.name] = _tuned_value(
                operand, scheme, table, counts, signed=activation_codes_signed(signed, scheme),
                bits=bits, activation_bits=activation_bits)
            operand.variable.assign(value)
        if summaries:
            report.layers[path] = summaries
        else:
            report.skipped[path] = "no input observed (it runs inside a graph loop)"
    return report
