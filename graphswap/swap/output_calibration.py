"""The "output" calibration method: each layer's activation range chosen by the error of its own
output through the multiplier, not by the error of quantizing its input.

The other methods (minmax, percentile, entropy, mse) look at the input values alone, as if the
multiplier were exact.  An approximate one is not: mul8u_13QR keeps only the top bits of each
operand, mul8s_1KR3 zeroes every product whose first operand is below 64, so a narrower range -
more clipping, larger codes - can give a far smaller error at the layer's output.  So, per layer:

    start from the percentile range (lo, hi); for each factor f of FACTORS compute the layer's
    product of its observed input x with the range (f lo, f hi) through its own multiplier (y_f)
    and in float (y); keep the f whose error left after the best per-channel affine correction
    (what bias compensation then applies: y ~ gain * y_f + offset; AffineResidual, which
    graphswap.swap.wiring ranks operand wirings by too) is smallest - a narrower range only
    when it cuts that error by MARGIN.

It runs on the first SEARCH_SAMPLES calibration examples, on the inputs the layer sees in the pass
calibrate() makes (float, or with the layers before it approximate: `source`).  Layers whose
product the scheme does not describe as one (recurrent cells, SeparableConv2D's two products) and
float kernels keep the percentile range.  Zero training; the report lists each chosen factor.
"""

from __future__ import annotations

import numpy as np

from graphswap.kernels import resolve_kernel
from graphswap.kernels.quantized import LutKernel

#: a narrower range must cut the layer's output error by this much (as wiring.MARGIN)
MARGIN = 0.02
#: the fractions of the percentile range tried (1: the percentile range itself)
FACTORS = (1.0, 0.85, 0.7, 0.55, 0.45, 0.35, 0.25, 0.18, 0.12)
#: examples whose layer outputs are compared (each layer's product is computed 1 + len(FACTORS)
#: times on them)
SEARCH_SAMPLES = 128


class AffineResidual:
    """Per-channel sums that give the error left after y_e ~ gain * y + offset."""

    def __init__(self):
        self.n = 0
        self.sums = None

    def update(self, y: np.ndarray, reference: np.ndarray) -> None:
        channels = y.shape[-1]
        y = np.asarray(y, np.float64).reshape(-1, channels)
        r = np.asarray(reference, np.float64).reshape(-1, channels)
        finite = np.isfinite(y).all(axis=1) & np.isfinite(r).all(axis=1)
        y, r = y[finite], r[finite]
        sums = np.stack([y.sum(0), r.sum(0), (y * y).sum(0), (r * r).sum(0), (y * r).sum(0)])
        self.sums = sums if self.sums is None else self.sums + sums
        self.n += len(y)

    def value(self) -> float:
        if not self.n:
            return float("inf")
        sy, sr, syy, srr, syr = self.sums / self.n
        var_y, var_r, cov = syy - sy * sy, srr - sr * sr, syr - sy * sr
        explained = np.where(var_y > 1e-30, cov * cov / np.maximum(var_y, 1e-30), 0.0)
        return float(np.maximum(var_r - explained, 0.0).sum())


def searchable(layer) -> bool:
    """Whether `layer`'s range can be chosen by its output: a multiplier table, one product."""
    return (isinstance(getattr(layer, "arithmetic", None), LutKernel)
            and not layer.intermediate_points
            and not getattr(layer, "is_recurrent_cell", False)
            and not hasattr(layer, "recurrent_kernel"))


class OutputSearch:
    """Collects, over observed inputs, the residual error of every candidate range of each
    layer in `layers` [(path, layer)], whose percentile range is already set."""

    def __init__(self, layers):
        self.layers = [(path, layer) for path, layer in layers if searchable(layer)]
        self.kernels = {id(layer): layer.arithmetic for _, layer in self.layers}
        self.residuals = {id(layer): [AffineResidual() for _ in FACTORS]
                          for _, layer in self.layers}
        self.seen = {id(layer): 0 for _, layer in self.layers}

    def record(self, layer, x, point=None) -> None:
        if point is not None or id(layer) not in self.kernels \
                or self.seen[id(layer)] >= SEARCH_SAMPLES:
            return
        x = np.asarray(x, np.float32)[:SEARCH_SAMPLES - self.seen[id(layer)]]
        self.seen[id(layer)] += len(x)
        scheme = layer.current_quantization()
        lo, hi = scheme.activation_range
        reference = layer.numpy_product(x, resolve_kernel("exact"))
        for factor, residual in zip(FACTORS, self.residuals[id(layer)]):
            candidate = scheme.with_range(lo * factor, hi * factor)
            residual.update(layer.numpy_product(x, self.kernels[id(layer)], quant=candidate),
                            reference)

    def choose(self) -> dict:
        """Set each layer's chosen range; returns path -> (factor, residual ratio to f = 1)."""
        chosen = {}
        for path, layer in self.layers:
            values = [residual.value() for residual in self.residuals[id(layer)]]
            best = int(np.argmin(values))
            if not values[best] < (1 - MARGIN) * values[0]:
                best = 0
            factor = FACTORS[best]
            if factor != 1.0:
                scheme = layer.quantization
                lo, hi = scheme.activation_range
                layer.set_quantization(scheme.with_range(lo * factor, hi * factor))
            chosen[path] = (factor, values[best] / values[0] if values[0] > 0 else 1.0)
        return chosen


def describe(chosen: dict) -> list[str]:
    """The report line of the factors chosen (an empty list when no layer was searched)."""
    if not chosen:
        return []
    narrowed = {path: entry for path, entry in chosen.items() if entry[0] != 1.0}
    shown = ", ".join(f"{path} x{factor:g} (output error {ratio:.2f}x)"
                      for path, (factor, ratio) in narrowed.items())
    return [f"output calibration: {len(narrowed)} of {len(chosen)} layer(s) narrowed from the "
            f"percentile range by their output error through the multiplier"
            + (f": {shown}" if shown else "")]
