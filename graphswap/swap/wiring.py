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

Recurrent cells and layers with intermediate operands (SeparableConv2D) keep their wiring: their
several products share one scheme, and one choice for all of them is not a per-product one.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from graphswap.errors import QuantizationError
from graphswap.kernels.quantized import LutKernel
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


def has_choice(layer) -> bool:
    """Whether `layer`'s wiring is worth measuring: an 8x8 table that is not symmetric, on a layer
    whose one product the scheme describes."""
    kernel = layer.arithmetic
    if not isinstance(kernel, LutKernel) or kernel.weight_bits != 8 \
            or kernel.activation_bits != 8 or layer.intermediate_points:
        return False
    if getattr(layer, "is_recurrent_cell", False) or hasattr(layer, "recurrent_kernel"):
        return False
    table = np.asarray(kernel.multiplier.table).reshape(256, 256)
    return not np.array_equal(table, table.T)


@dataclasses.dataclass
class WiringReport:
    """What choose_operands measured: path -> {order: residual, "chosen": order}."""

    samples: int
    layers: dict

    def lines(self) -> list[str]:
        if not self.layers:
            return ["operand wiring: no layer runs an asymmetric 8x8 multiplier table; the "
                    "weights stay on its second operand (the default)"]
        parts = []
        for path, entry in self.layers.items():
            first, second = entry["activation_first"], entry["weight_first"]
            base = max(first, 1e-30)
            parts.append(f"{path} {'weights first' if entry['chosen'] == 'weight_first' else 'activations first'}"
                         f" (residual error {second / base:.2f}x with weights first)")
        flipped = sum(entry["chosen"] == "weight_first" for entry in self.layers.values())
        return [f"operand wiring measured on {self.samples} samples: {flipped} of "
                f"{len(self.layers)} layer(s) take the weights on the multiplier's first operand: "
                + ", ".join(parts)]


def choose_operands(model, data, *, samples: int = WIRING_SAMPLES,
                    batch_size: int = BATCH_SIZE, layers=None) -> WiringReport:
    """Set each eligible layer's wiring to the measured better one (module docstring); `layers`:
    only the quantizing layers with these paths.  Call after calibration (the codes are the
    calibrated ones), before weight tuning and bias compensation (both depend on the wiring)."""
    inputs = calibration_inputs(model, data, samples, what="operand wiring data")
    targets = [(path, layer) for path, layer in select_layers(quantizing_layers(model), layers)
               if has_choice(layer)]
    if not targets:
        return WiringReport(len(inputs[0]), {})
    kernels = {id(layer): layer.arithmetic for _, layer in targets}
    schemes = {id(layer): layer.current_quantization() for _, layer in targets}
    residuals = {id(layer): {order: AffineResidual() for order in OPERAND_ORDERS}
                 for _, layer in targets}

    def record(layer, x, point=None):
        if point is not None:
            return
        scheme = schemes[id(layer)]
        if not scheme.calibrated:
            raise QuantizationError(f"layer {layer.name!r}: the operand wiring is measured on "
                                    f"its calibrated codes; calibrate it first")
        kernel = kernels[id(layer)]
        reference = layer.numpy_product(x, kernel.exact_products(), quant=scheme)
        for order in OPERAND_ORDERS:
            wired = dataclasses.replace(scheme, operands=order)
            residuals[id(layer)][order].update(layer.numpy_product(x, kernel, quant=wired),
                                               reference)

    chosen = [layer for _, layer in targets]
    with float_forward(chosen), observing(chosen, record):
        run_batches(model, inputs, batch_size)
    summary = {}
    for path, layer in targets:
        values = {order: residuals[id(layer)][order].value() for order in OPERAND_ORDERS}
        current = schemes[id(layer)].operands
        other = "weight_first" if current == "activation_first" else "activation_first"
        best = other if values[other] < (1 - MARGIN) * values[current] else current
        layer.set_quantization(dataclasses.replace(schemes[id(layer)], operands=best))
        summary[path] = {**values, "chosen": best}
    return WiringReport(len(inputs[0]), summary)
