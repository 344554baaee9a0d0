"""Recovery without gradient steps: bias (mean-error) compensation of the approximate products and
BatchNormalization statistics re-estimated with the approximate forward in the loop.

compensate_bias(model, data, method="mean")
    For each swapped layer that quantizes, in model order (the layers before it already
    compensated, all running their approximate arithmetic), its inputs on the first `samples`
    examples are observed and its product is computed twice with the same codes: through the
    multiplier (y) and with exact products (y_e, the kernel's `exact_products()`).  Per output
    channel c, over every sample and position:
        method "mean":    offset_c = mean(y_e - y)   gain_c = 1     (mean-error compensation)
        method "moments": gain_c = std(y_e) / std(y) (1 if std(y) == 0),
                          offset_c = mean(y_e) - gain_c mean(y)     (mean and spread matched)
    and the layer's output correction becomes y <- gain * y + offset (before the bias) - an
    integer bias / per-channel requantization scale in hardware.  Zero training.  The methods
    are described in graphswap/methods.py's COMPENSATION_REGISTRY; each one's correction is
    registered here with `@correction_method(name)` (CORRECTION_METHODS).

    Recurrent cells (LSTM, GRU, SimpleRNN; `recurrent_products`): the correction sits on the input
    product x_t @ kernel, and the recurrent products add to the same gate pre-activations, so
    their mean error is folded into its offset: for each recurrent operand p (the state h at
    every step; a GRU with reset_after=False also r * h), observed on the same run,
        offset_c += mean(p @ R_exact - p @ R)_c      (columns c the product adds to)
    with R its recurrent weights and that operand's own scheme; "moments" keeps the gain of the
    input product (the spread of a sum of two products cannot be matched by a gain on one of
    them) and with this offset matches the mean of the whole pre-activation.  A GRU with
    reset_after=True multiplies its candidate columns' recurrent product by the reset gate r
    (sample by sample) before adding it, so their error is r * e: the offset of those columns
    gets mean(r * e), r computed from the same step's products as the cell computes it (the
    approximate products, the bias, the correction the layer has during the run).

recalibrate_batchnorm(model, data)
    For each BatchNormalization layer, in model order (the ones before it already re-estimated),
    moving_mean and moving_variance become the mean and the (population) variance of its input
    over the first `samples` examples, with every swapped layer running its arithmetic.  No
    gradient steps; gamma and beta are untouched.

Both change `model` in place and return a small report; data as for graphswap.swap.calibration.
"""

from __future__ import annotations

import contextlib
import dataclasses

import keras
import numpy as np

from graphswap.errors import QuantizationError
from graphswap.kernels import bind_scheme
from graphswap.methods import COMPENSATION_REGISTRY, Implementations
from graphswap.swap.calibration import (BATCH_SIZE, DEFAULT_CALIBRATION_METHOD,
                                        DEFAULT_CALIBRATION_SAMPLES, DEFAULT_CALIBRATION_SOURCE,
                                        CalibrationReport, calibrate, calibration_inputs,
                                        observing, product_layers, quantizing_layers,
                                        run_batches, select_layers)
from graphswap.swap.clone import iter_layers
from graphswap.swap.recurrent_cells import SWAPPED_CELLS, SwappedGRUCell
from graphswap.swap.weight_tuning import WeightTuningReport, tune_weights
from graphswap.swap.wiring import WiringReport, choose_operands

COMPENSATION_METHODS = COMPENSATION_REGISTRY.names   # described in graphswap/methods.py
DEFAULT_COMPENSATION = COMPENSATION_REGISTRY.default   # measured: docs/RECOVERY.md, ablation


@dataclasses.dataclass
class RecoveryStep:
    """What one zero-gradient recovery step did."""

    step: str
    samples: int
    layers: dict          # path -> summary numbers

    def lines(self) -> list[str]:
        if self.step == "bias compensation":
            shown = ", ".join(f"{path} (mean |offset| {v['mean_abs_offset']:.3g})"
                              for path, v in self.layers.items())
            return [f"bias compensation on {self.samples} samples: {shown}"]
        if not self.layers:
            return ["BatchNorm re-estimation: the model has no BatchNormalization layer"]
        return [f"re-estimated the statistics of {len(self.layers)} BatchNormalization layer(s) "
                f"on {self.samples} samples with the approximate forward: "
                f"{', '.join(self.layers)}"]


class _ChannelMoments:
    def __init__(self):
        self.n = 0
        self.sums = None

    def update(self, approximate: np.ndarray, exact: np.ndarray) -> None:
        channels = approximate.shape[-1]
        a = approximate.reshape(-1, channels).astype(np.float64)
        e = exact.reshape(-1, channels).astype(np.float64)
        finite = np.isfinite(a).all(axis=1) & np.isfinite(e).all(axis=1)
        a, e = a[finite], e[finite]
        values = np.stack([a.sum(0), e.sum(0), (a * a).sum(0), (e * e).sum(0)])
        self.sums = values if self.sums is None else self.sums + values
        self.n += len(a)

    def correction(self, method: str):
        """(gain, offset) by the compensation `method`'s function (CORRECTION_METHODS)."""
        function = CORRECTION_METHODS[method]
        if not self.n:
            return None, None
        return function(*(self.sums / self.n))


#: the correction of each bias compensation method (graphswap.methods.COMPENSATION_REGISTRY):
#: function(mean_a, mean_e, square_a, square_e) -> (gain or None, offset) per output channel, from
#: the means of the approximate (a) and exact (e) products and of their squares
CORRECTION_METHODS = Implementations(COMPENSATION_REGISTRY)
correction_method = CORRECTION_METHODS.register


@correction_method("mean")
def mean_correction(mean_a, mean_e, square_a, square_e):
    return None, mean_e - mean_a


@correction_method("moments")
def moments_correction(mean_a, mean_e, square_a, square_e):
    std_a = np.sqrt(np.maximum(square_a - mean_a ** 2, 0.0))
    std_e = np.sqrt(np.maximum(square_e - mean_e ** 2, 0.0))
    gain = np.where(std_a > 0, std_e / np.where(std_a > 0, std_a, 1.0), 1.0)
    return gain, mean_e - gain * mean_a


def recurrent_products(cell) -> dict:
    """{point: (weights, width, first)} of a swapped recurrent cell's recurrent products whose
    error adds to the gate pre-activations: operand @ weights (the weights as the cell multiplies
    them), its first `width` columns adding to correction columns first.. (module docstring);
    {} for any other layer."""
    if not isinstance(cell, SWAPPED_CELLS):
        return {}
    units = int(cell.units)
    weights = np.asarray(cell.recurrent_kernel, dtype=np.float32)
    if isinstance(cell, SwappedGRUCell):
        if cell.reset_after:   # the candidate's columns are gated by r: _GatedCandidate
            return {"recurrent": (weights, 2 * units, 0)}
        return {"recurrent": (weights[:, :2 * units], 2 * units, 0),
                "reset_state": (weights[:, 2 * units:], units, 2 * units)}
    return {"recurrent": (weights, int(weights.shape[1]), 0)}


class _MeanError:
    """Running mean over rows of (exact - approximate) of one recurrent product."""

    def __init__(self):
        self.n = 0
        self.total = 0.0

    def update(self, approximate: np.ndarray, exact: np.ndarray) -> None:
        a = approximate.astype(np.float64)
        e = exact.astype(np.float64)
        finite = np.isfinite(a).all(axis=1) & np.isfinite(e).all(axis=1)
        self.total = self.total + (e[finite] - a[finite]).sum(axis=0)
        self.n += int(finite.sum())


class _GatedCandidate:
    """A GRU with reset_after=True: running mean of r * e over its candidate columns, e the
    recurrent product's error there and r the reset gate of the same step (module docstring)."""

    def __init__(self, cell):
        units = int(cell.units)
        self.cell, self.units = cell, units
        correction = cell.output_correction or {}
        self.gain = np.asarray(correction.get("gain") or np.ones(3 * units), np.float64)
        self.offset = np.asarray(correction.get("offset") or np.zeros(3 * units), np.float64)
        self.bias = (np.asarray(cell.bias, np.float64) if cell.use_bias
                     else np.zeros((2, 3 * units)))
        self.inputs = None   # the approximate input product of the step under way
        self.n = 0
        self.total = 0.0

    def update(self, approximate: np.ndarray, exact: np.ndarray) -> None:
        """One step's recurrent products (all columns), after its input product."""
        if self.inputs is None or len(self.inputs) != len(approximate):
            return
        u = self.units
        a = approximate.astype(np.float64)
        x_r = (self.inputs * self.gain + self.offset + self.bias[0])[:, u:2 * u]
        r = np.asarray(self.cell.recurrent_activation(
            (x_r + a[:, u:2 * u] + self.bias[1][u:2 * u]).astype(np.float32)), np.float64)
        error = r * (exact.astype(np.float64) - a)[:, 2 * u:]
        finite = np.isfinite(error).all(axis=1)
        self.total = self.total + error[finite].sum(axis=0)
        self.n += int(finite.sum())
        self.inputs = None


def compensate_bias(model, data, *, samples: int = DEFAULT_CALIBRATION_SAMPLES,
                    method: str = "mean", batch_size: int = BATCH_SIZE,
                    layers=None) -> RecoveryStep:
    """Per-output-channel compensation of the approximate products' error (module docstring);
    `layers`: only the quantizing layers with these paths."""
    COMPENSATION_REGISTRY.check(method)
    inputs = calibration_inputs(model, data, samples, what="bias compensation data")
    targets = select_layers(quantizing_layers(model), layers)
    if not targets:
        raise QuantizationError(f"model {model.name!r} has no swapped layer that quantizes (8-bit "
                                f"multiplier kernels); there is no approximate product to "
                                f"compensate")
    summary = {}
    for path, layer in targets:
        moments = _ChannelMoments()
        scheme = layer.current_quantization()
        exact = layer.arithmetic.exact_products()
        recurrent = {point: (weights, width, first, _MeanError(),
                             bind_scheme(layer.arithmetic, layer.current_quantization(point)),
                             bind_scheme(exact, layer.current_quantization(point)))
                     for point, (weights, width, first) in recurrent_products(layer).items()}

        gated = _GatedCandidate(layer) if isinstance(layer, SwappedGRUCell) and \
            layer.reset_after else None

        def record(observed, x, point=None, layer=layer, moments=moments, scheme=scheme,
                   exact=exact, recurrent=recurrent, gated=gated):
            if point is None:
                approximate = layer.numpy_product(x, quant=scheme)
                moments.update(approximate, layer.numpy_product(x, exact, quant=scheme))
                if gated is not None:
                    gated.inputs = np.asarray(approximate, np.float64)
            elif point in recurrent:   # the other intermediate operands: numpy_product covers
                weights, width, _, errors, approximate, exact_kernel = recurrent[point]
                x = np.asarray(x, np.float32)
                products = (np.asarray(approximate.matmul(x, weights)),
                            np.asarray(exact_kernel.matmul(x, weights)))
                errors.update(products[0][:, :width], products[1][:, :width])
                if gated is not None:
                    gated.update(*products)

        with observing([layer], record):
            run_batches(model, inputs, batch_size)
        gain, offset = moments.correction(method)
        folded = 0.0
        if offset is not None and recurrent:
            offset = np.array(offset, dtype=np.float64)
            added = np.zeros_like(offset)
            for weights, width, first, errors, _, _ in recurrent.values():
                if errors.n:
                    added[first:first + width] += errors.total / errors.n
            if gated is not None and gated.n:
                added[2 * gated.units:] += gated.total / gated.n
            offset += added
            folded = float(np.abs(added).mean())
        layer.set_output_correction(gain, offset)
        summary[path] = {"mean_abs_offset": float(np.abs(offset).mean()) if offset is not None
                         else 0.0,
                         "mean_gain": float(np.mean(gain)) if gain is not None else 1.0}
        if recurrent:
            summary[path]["mean_abs_recurrent_offset"] = folded
    return RecoveryStep("bias compensation", len(inputs[0]), summary)


@contextlib.contextmanager
def _recording_inputs(layer, record):
    """While inside, every call of `layer` hands its input (numpy) to `record`."""
    original = layer.call

    def call(inputs, *args, **kwargs):
        record(np.asarray(inputs, dtype=np.float64))
        return original(inputs, *args, **kwargs)

    layer.call = call
    try:
        yield
    finally:
        del layer.call


def recalibrate_batchnorm(model, data, *, samples: int = DEFAULT_CALIBRATION_SAMPLES,
                          batch_size: int = BATCH_SIZE, layers=None) -> RecoveryStep:
    """BatchNormalization moving statistics from the approximate forward (module docstring);
    `layers`: only the BatchNormalization layers with these paths."""
    inputs = calibration_inputs(model, data, samples, what="BatchNorm re-estimation data")
    norms = [(path, layer) for path, layer in iter_layers(model)
             if isinstance(layer, keras.layers.BatchNormalization)]
    if layers is not None:
        norms = [(path, layer) for path, layer in norms if path in set(layers)]
    summary = {}
    for path, bn in norms:
        axes = [bn.axis] if isinstance(bn.axis, int) else list(bn.axis)
        totals = {"n": 0, "sum": 0.0, "square": 0.0}

        def record(x, axes=axes, totals=totals):
            keep = [a % x.ndim for a in axes]
            reduce = tuple(d for d in range(x.ndim) if d not in keep)
            totals["n"] += int(np.prod([x.shape[d] for d in reduce]))
            totals["sum"] = totals["sum"] + x.sum(axis=reduce)
            totals["square"] = totals["square"] + (x * x).sum(axis=reduce)

        with _recording_inputs(bn, record):
            run_batches(model, inputs, batch_size)
        if not totals["n"]:
            continue
        mean = totals["sum"] / totals["n"]
        variance = np.maximum(totals["square"] / totals["n"] - mean ** 2, 0.0)
        bn.moving_mean.assign(mean.astype(np.float32).reshape(bn.moving_mean.shape))
        bn.moving_variance.assign(variance.astype(np.float32).reshape(bn.moving_variance.shape))
        summary[path] = {"mean": float(np.mean(mean)), "variance": float(np.mean(variance))}
    return RecoveryStep("batchnorm", len(inputs[0]), summary)


def calibrate_and_compensate(model, data, *, samples: int = DEFAULT_CALIBRATION_SAMPLES,
                             method: str = DEFAULT_CALIBRATION_METHOD,
                             source: str = DEFAULT_CALIBRATION_SOURCE, bias_correction: str | None = None, recalibrate_bn: bool = False,
                             batch_size: int = BATCH_SIZE, weight_tuning: bool = False,
                             operands: str | None = None) -> list[str]:
    """The zero-gradient-step recovery of rewrite_model: static calibration, then (with
    operands="auto") each layer's operand wiring measured (graphswap.swap.wiring), then
    (optionally) weight tuning (graphswap.swap.weight_tuning: after calibration, before compensation), then
    (optionally) bias compensation, then (optionally) BatchNorm re-estimation.  With the approximate source
    the steps alternate in model order - each quantizing layer is calibrated and compensated, each
    BatchNormalization re-estimated, with everything before it already done - so every range and
    correction is measured on the activations the finished model produces.  Returns report
    lines."""
    if bias_correction is not None:
        COMPENSATION_REGISTRY.check(bias_correction)
    options = dict(samples=samples, batch_size=batch_size)
    if source == "float":
        lines = calibrate(model, data, method=method, source=source, **options).lines()
        if operands == "auto":
            lines += choose_operands(model, data, batch_size=batch_size,
                                     tuning=weight_tuning).lines()
        if weight_tuning:
            lines += tune_weights(model, data, **options).lines()
        if bias_correction is not None:
            lines += compensate_bias(model, data, method=bias_correction, **options).lines()
        if recalibrate_bn:
            lines += recalibrate_batchnorm(model, data, **options).lines()
        return lines
    ranges, narrowed, offsets, norms, count = {}, {}, {}, {}, 0
    tuned = WeightTuningReport(0, {})
    wiring = WiringReport(0, {})
    quantizing = {path for path, _ in quantizing_layers(model)}
    for path, layer in product_layers(model):
        if path in quantizing:
            report = calibrate(model, data, method=method, source=source, layers=[path],
                               **options)
            ranges.update(report.ranges)
            narrowed.update(report.narrowed)
            count = report.samples
            if operands == "auto":
                step = choose_operands(model, data, batch_size=batch_size, layers=[path],
                                       tuning=weight_tuning)
                wiring.samples = step.samples
                wiring.layers.update(step.layers)
            if weight_tuning:
                step = tune_weights(model, data, layers=[path], **options)
                tuned.layers.update(step.layers)
                tuned.skipped.update(step.skipped)
            if bias_correction is not None:
                offsets.update(compensate_bias(model, data, method=bias_correction,
                                               layers=[path], **options).layers)
        elif recalibrate_bn and isinstance(layer, keras.layers.BatchNormalization):
            norms.update(recalibrate_batchnorm(model, data, layers=[path], **options).layers)
    lines = CalibrationReport(method, source, count, ranges, narrowed).lines()
    if operands == "auto":
        lines += wiring.lines()
    if weight_tuning:
        tuned.samples = count
        lines += tuned.lines()
    if bias_correction is not None:
        lines += RecoveryStep("bias compensation", count, offsets).lines()
    if recalibrate_bn:
        lines += RecoveryStep("batchnorm", count, norms).lines()
    if bias_correction is not None or recalibrate_bn or weight_tuning:
        lines.append("(the steps alternated layer by layer, in model order)")
    return lines
