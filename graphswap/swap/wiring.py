"""Operand wiring chosen per layer by measurement: which multiplier input the weights feed.

An approximate circuit is rarely symmetric - EvoApproxLib's keep different partial products of
A and B, so mul8u_FTA(w, x) and mul8u_FTA(x, w) err differently - and a hardware designer wires
the weights to whichever port costs the network less.  QuantScheme.operands records the choice
per layer ("activation_first": the activation code is operand A, the default; "weight_first":
the weight code is), and LutKernel.oriented runs it as the transposed table: the same codes,
scales and exact sums, only the products change.

choose_operands(model, data)
    For each quantizing layer whose 8x8 table is not symmetric, its input is observed in one
    float forward pass over the first `samples` examples, and its product computed with the
    layer's calibrated codes both ways (y_A, y_B) and with exact products of the same codes (y_e).
    Per output channel the error left after the best affine correction (what bias compensation
    then applies: y_e ~ gain * y + offset) is

        residual = var(y_e) - cov(y, y_e)^2 / var(y)        (summed over channels)

    and the wiring with the smaller residual is kept - the other one only when it cuts the
    residual by MARGIN, so a symmetric-enough circuit keeps the default.  Zero training; the
    layer's scheme (saved with it) names the result.

The activation code offset is measured the same way (QuantScheme.activation_offset).  A circuit
that drops an operand's low bits repeats each row of its table: mul8s_1L1G keeps 8 * floor(a / 8)
(runs of 8 equal rows), mul8u_13QR keeps 32 * floor(a / 32), so every activation code is floored
to that step.  For each wiring whose activation port repeats rows in runs of exactly L over the
non-negative codes (L >= 2, at least MIN_LEVELS levels), the activation codes moved by L // 2 -
floor turned into rounding to the nearest step - are one more candidate, kept when it cuts the
residual by OFFSET_MARGIN.

A signed circuit fed a non-negative input (a ReLU's output: calibrated range [0, hi]) uses only
its codes 0..127.  TFLite's int8 zero point -128 (QuantScheme.activation_zero_point) gives that
range all 256 codes - the circuit sees q - 128, the zero-point term is added exactly - one bit
more, but every zero activation then meets the circuit at -128, where an approximate circuit errs
unless the weight codes sit on its grid.  So for such layers the zero point is one more candidate
(with and without the offset, on the table as it then wires), and with weight tuning on
(`tuning`) each candidate is measured with the weight codes tuned for it; the candidates are then
ranked against the float product (their codes differ), not the exact products of one set of codes.

Recurrent cells and layers with intermediate operands (SeparableConv2D) keep their wiring: their
several products share one scheme, and one choice for all of them is not a per-product one.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from graphswap.errors import QuantizationError
from graphswap.kernels import resolve_kernel
from graphswap.kernels.quantized import LutKernel
from graphswap.kernels.scheme import activation_codes_signed, wired_table
from graphswap.swap.output_calibration import AffineResidual
from graphswap.swap.calibration import (BATCH_SIZE, calibration_inputs, float_forward,
                                        observing, quantizing_layers, run_batches,
                                        select_layers)

OPERAND_ORDERS = ("activation_first", "weight_first")
#: rewrite_model's `operands` values: a fixed wiring for every layer, or "auto" (measured)
OPERAND_CHOICES = ("auto", *OPERAND_ORDERS)
#: with calibration data rewrite_model measures the wiring (docs/RECOVERY.md: it wins on every
#: asymmetric circuit measured and changes nothing for symmetric ones)
DEFAULT_OPERANDS = "auto"
WIRING_SAMPLES = 128      # enough for a ranking; each layer's product is computed three times
MARGIN = 0.02             # the non-default wiring must cut the residual error by 2%
#: an activation offset changes what every later layer sees; it must cut the layer's residual
#: error by 10% (on the ResNet-8 of docs/RECOVERY.md, offsets chosen for 3-8% cuts - mul8u_FTA,
#: mul8u_13QR - cost 1-2 points end to end, those of 11-46% - mul8s_1L1G - won 2)
OFFSET_MARGIN = 0.10
#: a port that keeps fewer levels of the non-negative codes does not round, it thresholds (two
#: levels: mul8s_1KR3's first operand, mul8s_gsot36's second); moving that threshold by half a
#: step cost 3-4 points where it was tried (docs/RECOVERY.md)
MIN_LEVELS = 4
#: the activation zero point must cut the layer's residual error by 25%: on the ResNet-8 of
#: docs/RECOVERY.md it cut mul8s_1L1G's and mul8s_1KR3's by 37-65% per layer and won 2-22 points;
#: on the digits lenet5 with mul8s_gsot36.c cuts of 2-24% won 2 points with zero steps but
#: fine-tuning from that start reached 3 points less (92.2 against 95.6 after one epoch)
ZERO_POINT_MARGIN = 0.25


def candidates(layer) -> list:
    """The (operands, activation_offset, activation_zero_point) wirings worth measuring for
    `layer` (module docstring): none unless an 8x8 table on a layer whose one product the scheme
    describes; both ports of an asymmetric table; a half-step offset where the activation port
    repeats rows; the zero point -128 for a signed table on a non-negative calibrated range."""
    kernel = layer.arithmetic
    if not isinstance(kernel, LutKernel) or kernel.weight_bits != 8 \
            or kernel.activation_bits != 8 or layer.intermediate_points:
        return []
    if getattr(layer, "is_recurrent_cell", False) or hasattr(layer, "recurrent_kernel"):
        return []
    # the circuit's own table: the layer may already run a transposed or moved variant
    table = np.asarray(kernel.base.multiplier.table).reshape(256, 256)
    scheme = layer.current_quantization()
    orders = OPERAND_ORDERS if not np.array_equal(table, table.T) else (scheme.operands,)
    zero_points = (0, -128) if kernel.signed and scheme.activation_range is not None \
        and scheme.activation_range[0] >= 0 and layer.backward != "lut_grad" else (0,)
    wirings = []
    for order in orders:
        for zero_point in zero_points:
            wirings.append((order, 0, zero_point))
            signed_rows = kernel.signed and not zero_point
            step = repeated_rows(wired_table(table, order, 0, kernel.signed, zero_point),
                                 signed_rows)
            if step >= 2 and (128 if signed_rows else 256) // step >= MIN_LEVELS:
                wirings.append((order, step // 2, zero_point))
    return wirings if len(wirings) > 1 else []


def repeated_rows(table: np.ndarray, signed: bool) -> int:
    """L where the non-negative activation codes of `table` fall in runs of exactly L equal
    consecutive rows (the port drops log2(L) low bits); 1 otherwise (every code has its own row,
    or runs of different lengths: DRUM, logarithmic circuits)."""
    rows = table[:128] if signed else table
    changes = np.flatnonzero((rows[1:] != rows[:-1]).any(axis=1)) + 1
    runs = np.diff(np.concatenate([[0], changes, [len(rows)]]))
    return int(runs[0]) if (runs == runs[0]).all() else 1


def wired_scheme(scheme, wiring):
    order, offset, zero_point = wiring
    return dataclasses.replace(scheme, operands=order, activation_offset=offset,
                               activation_zero_point=zero_point)


def measure(layer, x, wirings, tuning: bool) -> dict:
    """wiring -> the residual error of `layer`'s product of its observed input `x` wired so
    (module docstring), its weight codes tuned for each wiring when `tuning`."""
    # imported here: weight tuning imports the calibration helpers this module shares
    from graphswap.swap.weight_tuning import (code_histogram, substituted_weights,
                                              tuned_operand_values)
    kernel, scheme = layer.arithmetic, layer.current_quantization()
    if any(wiring[2] for wiring in wirings):    # codes that differ: against the float product
        reference = layer.numpy_product(x, resolve_kernel("exact"))
    else:
        reference = layer.numpy_product(x, kernel.exact_products(), quant=scheme)
    histograms = {}       # the codes depend on the zero point only, not on the wiring's port
    values = {}
    for wiring in wirings:
        wired = wired_scheme(scheme, wiring)
        weights = contextlib.nullcontext()
        if tuning:
            if wiring[2] not in histograms:
                histograms[wiring[2]] = code_histogram(x, wired, kernel.signed)
            weights = substituted_weights(layer, tuned_operand_values(
                layer, wired, histograms[wiring[2]], activation_codes_signed(kernel.signed, wired)))
        residual = AffineResidual()
        with weights:
            residual.update(layer.numpy_product(x, kernel, quant=wired), reference)
        values[wiring] = residual.value()
    return values


def margin(wiring, current) -> float:
    """How much `wiring` must cut the residual error of `current` to replace it."""
    return max(OFFSET_MARGIN if wiring[1] != current[1] else MARGIN,
               ZERO_POINT_MARGIN if wiring[2] != current[2] else MARGIN)


def wiring_name(wiring) -> str:
    order, offset, zero_point = wiring
    name = "weights first" if order == "weight_first" else "activations first"
    name += f", zero point {zero_point}" if zero_point else ""
    return f"{name}, activation codes {offset:+d}" if offset else name


@dataclasses.dataclass
class WiringReport:
    """What choose_operands measured: path -> {"residuals": {(order, offset, zero point):
    residual}, "chosen": (order, offset, zero point)}."""

    samples: int
    layers: dict

    def lines(self) -> list[str]:
        if not self.layers:
            return ["operand wiring: no layer runs an asymmetric 8x8 multiplier table or one that "
                    "drops its activations' low bits; the weights stay on its second operand "
                    "(the default)"]
        parts = []
        for path, entry in self.layers.items():
            residuals, chosen = entry["residuals"], entry["chosen"]
            base = max(residuals[chosen], 1e-30)
            others = ", ".join(f"{residuals[w] / base:.2f}x {wiring_name(w)}"
                               for w in residuals if w != chosen)
            parts.append(f"{path} {wiring_name(chosen)} (residual error {others})")
        flipped = sum(entry["chosen"][0] == "weight_first" for entry in self.layers.values())
        moved = sum(entry["chosen"][1] != 0 for entry in self.layers.values())
        zero = sum(entry["chosen"][2] != 0 for entry in self.layers.values())
        return [f"operand wiring measured on {self.samples} samples: {flipped} of "
                f"{len(self.layers)} layer(s) take the weights on the multiplier's first "
                f"operand, {moved} move their activation codes, {zero} take the activation "
                f"zero point -128: " + ", ".join(parts)]


def choose_operands(model, data, *, samples: int = WIRING_SAMPLES,
                    batch_size: int = BATCH_SIZE, layers=None,
                    tuning: bool = False) -> WiringReport:
    """Set each eligible layer's wiring to the measured better one (module docstring); `layers`:
    only the quantizing layers with these paths; `tuning`: weight tuning follows (each candidate
    measured with its tuned weight codes).  Call after calibration (the codes are the calibrated
    ones), before weight tuning and bias compensation (both depend on the wiring)."""
    inputs = calibration_inputs(model, data, samples, what="operand wiring data")
    wirings = {id(layer): (path, layer, candidates(layer))
               for path, layer in select_layers(quantizing_layers(model), layers)}
    targets = [(path, layer) for path, layer, found in wirings.values() if found]
    if not targets:
        return WiringReport(len(inputs[0]), {})
    observed = {id(layer): [] for _, layer in targets}

    def record(layer, x, point=None):
        if point is None:
            observed[id(layer)].append(np.asarray(x, np.float32))

    chosen = [layer for _, layer in targets]
    with float_forward(chosen), observing(chosen, record):
        run_batches(model, inputs, batch_size)
    summary = {}
    for path, layer in targets:
        scheme = layer.current_quantization()
        if not scheme.calibrated:
            raise QuantizationError(f"layer {layer.name!r}: the operand wiring is measured on "
                                    f"its calibrated codes; calibrate it first")
        values = measure(layer, np.concatenate(observed[id(layer)]), wirings[id(layer)][2],
                         tuning)
        current = (scheme.operands, scheme.activation_offset, scheme.activation_zero_point)
        eligible = [wiring for wiring in values if current not in values or wiring == current
                    or values[wiring] < (1 - margin(wiring, current)) * values[current]]
        best = min(eligible, key=values.get)
        layer.set_quantization(wired_scheme(scheme, best))
        summary[path] = {"residuals": values, "chosen": best}
    return WiringReport(len(inputs[0]), summary)
