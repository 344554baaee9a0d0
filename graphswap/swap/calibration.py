"""Static calibration: each swapped layer's input range, observed on representative data, stored
in the layer (its QuantScheme's activation_range, saved and reloaded with it).

    calibrate(model, data, samples=512, method="minmax", source="float")

`data` is the model's input as arrays (one array, or a list for a multi-input model); the first
`samples` examples are used (at least MIN_CALIBRATION_SAMPLES), in eager batches of
`batch_size`.  Every swapped layer whose arithmetic quantizes gets

    source="float"        the range of its input in the float forward: every swapped layer computes
                          with graphswap's exact float32 kernel - the original model, to float
                          round-off - in one pass;
    source="approximate"  the range of its input with the layers before it already running their
                          approximate arithmetic on their own calibrated ranges (one pass per
                          layer, in model order): the activations the hardware will actually see.

A layer with an intermediate operand (SeparableConv2D's depthwise result, the pointwise product's
input) gets a second range, observed the same way in the same pass (with either source, the
layer's own first product in float).

Methods (per layer, over the observed values v; a range always contains 0):
    minmax      lo, hi = min(v), max(v)
    percentile  unsigned (asymmetric) layers: lo, hi = the (100 - p)th and p-th percentiles;
                signed (symmetric): +-(the p-th percentile of |v|); p = percentile (99.99)
    entropy     the clipping threshold of least KL divergence between the histogram of |v| and its
                quantized version (TensorRT's entropy calibrator; graphswap.swap.entropy_calibration)
    mse         the clipping range minimizing the mean squared quantization error of v under the
                layer's own activation quantizer (N-bit for an Nx8 multiplier): the minmax range
                scaled by f, f over 100 steps from 0.01 to 1 (the best f is kept)
    output      the percentile range, narrowed where the layer's own output through its multiplier
                errs less (graphswap.swap.output_calibration: one more pass per group of layers)
Each method is described (name, --help line, default) in graphswap/methods.py's
CALIBRATION_REGISTRY and implemented here by one range function registered with
`@range_method(name)` (RANGE_METHODS; "output" adds calibrate's extra pass).
Percentile and mse read a deterministic subsample of at most SUBSAMPLE_VALUES values per layer (and
always the exact minimum and maximum); minmax reads every value.

The observation itself (`observing`) is the swapped layers' observer hook
(graphswap/swap/quantstate.py); graphswap/swap/compensation.py builds bias compensation and BN
re-estimation on the same machinery.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from graphswap.errors import QuantizationError
from graphswap.methods import CALIBRATION_REGISTRY, Implementations
from graphswap.kernels import resolve_kernel
from graphswap.kernels.quantized import asymmetric_params, weight_limit
from graphswap.swap.clone import iter_layers
from graphswap.swap.subclassed import held_layers, is_custom_container
from graphswap.swap.compare import model_inputs
from graphswap.swap.entropy_calibration import entropy_range
from graphswap.swap.output_calibration import SEARCH_SAMPLES, OutputSearch, describe
from graphswap.swap.text_inputs import input_array

CALIBRATION_METHODS = CALIBRATION_REGISTRY.names   # described in graphswap/methods.py
CALIBRATION_SOURCES = ("float", "approximate")
DEFAULT_CALIBRATION_METHOD = CALIBRATION_REGISTRY.default   # measured: docs/RECOVERY.md, ResNet-8
DEFAULT_CALIBRATION_SOURCE = "approximate"   # measured: docs/RECOVERY.md, ResNet-8 on CIFAR-10
DEFAULT_CALIBRATION_SAMPLES = 512
MIN_CALIBRATION_SAMPLES = 16
DEFAULT_PERCENTILE = 99.99
SUBSAMPLE_VALUES = 1 << 20
MSE_STEPS = 100
BATCH_SIZE = 128


# --------------------------------------------------------------------------------------------
# data and layers
# --------------------------------------------------------------------------------------------

def calibration_inputs(model, data, samples: int = DEFAULT_CALIBRATION_SAMPLES,
                       what: str = "calibration data") -> list[np.ndarray]:
    """The first `samples` examples of `data` as float32 arrays (string arrays for a string
    input), one per model input, checked against the model's input shapes.  Raises
    QuantizationError on a mismatch or too few examples."""
    if isinstance(samples, bool) or not isinstance(samples, (int, np.integer)) \
            or samples < MIN_CALIBRATION_SAMPLES:
        raise QuantizationError(f"the number of {what} samples must be a whole number >= "
                                f"{MIN_CALIBRATION_SAMPLES}; got {samples!r}")
    if isinstance(data, tuple) and len(data) == 2 and len(model.inputs) == 1:
        data = data[0]     # (x, y): the inputs
    arrays = list(data) if isinstance(data, (list, tuple)) else [data]
    if len(arrays) != len(model.inputs):
        raise QuantizationError(f"{what}: the model has {len(model.inputs)} input(s) but "
                                f"{len(arrays)} array(s) were given")
    checked = []
    for array, tensor in zip(arrays, model.inputs):
        try:
            array = input_array(array, tensor)  # float32; strings for a string input
        except (TypeError, ValueError):
            raise QuantizationError(f"{what} must be numeric arrays (strings for a string "
                                    f"input); got {type(array).__name__}") from None
        expected = tuple(tensor.shape[1:])
        if array.ndim != len(expected) + 1 or any(
                e is not None and e != a for e, a in zip(expected, array.shape[1:])):
            raise QuantizationError(
                f"{what} has shape {array.shape}, but the model's input {tensor.name!r} takes "
                f"(N, {', '.join('any' if e is None else str(e) for e in expected)}); pass "
                f"samples shaped like the model's input (the same the model is evaluated on)")
        checked.append(array)
    count = min(len(a) for a in checked)
    if count < MIN_CALIBRATION_SAMPLES:
        raise QuantizationError(f"{what} has {count} example(s); calibration needs at least "
                                f"{MIN_CALIBRATION_SAMPLES} (representative inputs, e.g. a few "
                                f"hundred training images)")
    return [a[:samples] for a in checked]


def product_layers(model):
    """(path, layer) of every leaf layer in model order, a layer whose products sit in sublayers
    (MultiHeadAttention: `quantized_parts()`; recurrent layers: their cells) replaced by those,
    as "path/name"; the layers a custom layer holds follow it, as "path/inner"."""
    def expand(path, layer):
        parts = getattr(layer, "quantized_parts", None)
        if parts is not None:
            for name, part in parts().items():
                yield f"{path}/{name}", part
            return
        yield path, layer
        if is_custom_container(layer):
            for steps, inner in held_layers(layer):
                yield from expand(f"{path}/{inner.name}", inner)

    for path, layer in iter_layers(model):
        yield from expand(path, layer)


def quantizing_layers(model) -> list:
    """(path, layer) of the swapped layers whose arithmetic quantizes, in model order (attention's
    projections apart)."""
    return [(path, layer) for path, layer in product_layers(model)
            if getattr(layer, "quantization", None) is not None]


def select_layers(targets, paths):
    """The (path, layer) pairs of `targets` named in `paths` (None: all)."""
    if paths is None:
        return targets
    wanted = set(paths)
    unknown = wanted - {path for path, _ in targets}
    if unknown:
        raise QuantizationError(f"no quantizing swapped layer {', '.join(sorted(unknown))}; "
                                f"they are: {', '.join(path for path, _ in targets)}")
    return [(path, layer) for path, layer in targets if path in wanted]


def run_batches(model, inputs: list[np.ndarray], batch_size: int = BATCH_SIZE) -> None:
    """Run the model eagerly (inference mode) over the inputs, discarding the outputs."""
    count = len(inputs[0])
    for start in range(0, count, batch_size):
        batch = [a[start:start + batch_size] for a in inputs]
        model(model_inputs(model, batch[0] if len(batch) == 1 else batch), training=False)


@contextlib.contextmanager
def _setting(layers, attribute: str, value):
    """While inside, each layer's `attribute` is `value`; the previous values come back after."""
    previous = [getattr(layer, attribute) for layer in layers]
    for layer in layers:
        setattr(layer, attribute, value)
    try:
        yield
    finally:
        for layer, before in zip(layers, previous):
            setattr(layer, attribute, before)


def observing(layers, callback):
    """While inside, every eager call of each layer hands (layer, operand, point) to `callback`
    (point None: the layer's input; else an intermediate operand's name)."""
    return _setting(layers, "observer", callback)


def float_forward(layers):
    """While inside, the layers compute with the exact float32 kernel (no quantization)."""
    return _setting(layers, "arithmetic", resolve_kernel("exact"))


# --------------------------------------------------------------------------------------------
# ranges
# --------------------------------------------------------------------------------------------

class RangeObserver:
    """Minimum, maximum and a capped deterministic subsample of the finite values seen over
    `batches` calls (the subsampling rate is set from the first call's size)."""

    def __init__(self, batches: int, seed: int = 0):
        self.lo = np.inf
        self.hi = -np.inf
        self.kept = []
        self.count = 0
        self._batches = max(int(batches), 1)
        self._fraction = None
        self._rng = np.random.default_rng(seed)

    def update(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.float32).reshape(-1)
        values = values[np.isfinite(values)]
        if not values.size:
            return
        if self._fraction is None:
            self._fraction = min(1.0, SUBSAMPLE_VALUES / (values.size * self._batches))
        self.lo = min(self.lo, float(values.min()))
        self.hi = max(self.hi, float(values.max()))
        self.count += values.size
        if self._fraction < 1.0:
            take = max(1, int(round(values.size * self._fraction)))
            values = values[self._rng.choice(values.size, take, replace=False)]
        self.kept.append(values)

    def values(self) -> np.ndarray:
        kept = np.concatenate(self.kept) if self.kept else np.zeros(0, np.float32)
        return np.concatenate([kept, np.array([self.lo, self.hi], np.float32)]) if self.count \
            else kept

    def range(self, method: str, signed: bool, percentile: float = DEFAULT_PERCENTILE,
              bits: int = 8):
        """(lo, hi) of the values seen, by the calibration `method`'s function (RANGE_METHODS)."""
        function = RANGE_METHODS[method]
        if not self.count:
            return 0.0, 0.0
        return function(self, signed, percentile, bits)


#: the range function of each calibration method (graphswap.methods.CALIBRATION_REGISTRY):
#: function(observer, signed, percentile, bits) -> (lo, hi) of a RangeObserver that saw values
RANGE_METHODS = Implementations(CALIBRATION_REGISTRY)
range_method = RANGE_METHODS.register


@range_method("minmax")
def minmax_range(observer: RangeObserver, signed: bool, percentile: float, bits: int):
    return observer.lo, observer.hi


@range_method("percentile")
def percentile_range(observer: RangeObserver, signed: bool, percentile: float, bits: int):
    values = observer.values().astype(np.float64)
    if signed:
        a = float(np.percentile(np.abs(values), percentile))
        return max(observer.lo, -a), min(observer.hi, a)
    return (min(float(np.percentile(values, 100 - percentile)), 0.0),
            float(np.percentile(values, percentile)))


@range_method("entropy")
def kl_range(observer: RangeObserver, signed: bool, percentile: float, bits: int):
    return entropy_range(observer.values().astype(np.float64), observer.lo, observer.hi, signed,
                         weight_limit(signed, bits))


@range_method("mse")
def mse_range(observer: RangeObserver, signed: bool, percentile: float, bits: int):
    return _mse_range(observer.values().astype(np.float64), observer.lo, observer.hi, signed,
                      bits)


@range_method("output")
def output_start_range(observer: RangeObserver, signed: bool, percentile: float, bits: int):
    """The percentile range; calibrate's extra pass narrows it (swap.output_calibration)."""
    return percentile_range(observer, signed, percentile, bits)


def _quantization_mse(values, lo, hi, signed, bits: int = 8) -> float:
    """Mean squared error of `values` quantized with the range [lo, hi] at `bits` bits (the
    activation quantizer of graphswap/kernels/quantized.py; 8 bits: 255 / 127 levels)."""
    if signed:
        limit = weight_limit(True, bits)
        amax = max(abs(lo), abs(hi))
        scale = amax / limit if amax > 0 else 1.0
        restored = np.clip(np.rint(values / scale), -limit, limit) * scale
    else:
        levels = weight_limit(False, bits)
        scale, zero = asymmetric_params(lo, hi, levels)
        codes = np.clip(np.rint(values / scale) + zero, 0, levels)
        restored = (codes - zero) * scale
    return float(np.mean((restored - values) ** 2))


def _mse_range(values, lo, hi, signed, bits: int = 8):
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    best, best_error = (lo, hi), np.inf
    for fraction in np.linspace(1.0 / MSE_STEPS, 1.0, MSE_STEPS):
        candidate = (lo * fraction, hi * fraction)
        error = _quantization_mse(values, *candidate, signed, bits)
        if error < best_error:
            best, best_error = candidate, error
    return best


# --------------------------------------------------------------------------------------------
# calibrate
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class CalibrationReport:
    """What calibrate did: per layer path, the range it stored ("path:point" for an
    intermediate operand's)."""

    method: str
    source: str
    samples: int
    ranges: dict      # path -> (lo, hi)
    narrowed: dict = dataclasses.field(default_factory=dict)   # "output": path -> (f, ratio)

    def lines(self) -> list[str]:
        shown = ", ".join(f"{path} [{lo:.4g}, {hi:.4g}]" for path, (lo, hi) in self.ranges.items())
        layers = sum(":" not in path for path in self.ranges)
        extra = len(self.ranges) - layers
        operands = f" (+{extra} intermediate operand(s))" if extra else ""
        return [f"calibrated static activation ranges of {layers} layer(s){operands} on "
                f"{self.samples} samples ({self.method}, {self.source} forward): {shown}",
                *describe(self.narrowed)]


def check_method(method: str, source: str = "float") -> None:
    CALIBRATION_REGISTRY.check(method)
    if source not in CALIBRATION_SOURCES:
        raise QuantizationError(f"unknown calibration source {source!r}; allowed: "
                                f"{', '.join(CALIBRATION_SOURCES)}")


def calibrate(model, data, *, samples: int = DEFAULT_CALIBRATION_SAMPLES,
              method: str = DEFAULT_CALIBRATION_METHOD, source: str = DEFAULT_CALIBRATION_SOURCE,
              percentile: float = DEFAULT_PERCENTILE,
              batch_size: int = BATCH_SIZE, layers=None) -> CalibrationReport:
    """Give every quantizing swapped layer of `model` (or those whose paths are in `layers`)
    static activations with a calibrated range (module docstring).  Changes `model` in place;
    returns a CalibrationReport."""
    check_method(method, source)
    if not 50.0 < percentile <= 100.0:
        raise QuantizationError(f"the calibration percentile must be in (50, 100]; got "
                                f"{percentile}")
    inputs = calibration_inputs(model, data, samples)
    count = len(inputs[0])
    targets = select_layers(quantizing_layers(model), layers)
    if not targets:
        raise QuantizationError(f"model {model.name!r} has no swapped layer that quantizes "
                                f"(8-bit multiplier kernels); there is nothing to calibrate")
    swapped = [layer for _, layer in product_layers(model) if hasattr(layer, "arithmetic")]
    batches = -(-count // batch_size)
    ranges, narrowed = {}, {}
    # float: one pass, every swapped layer in float; approximate: one pass per layer, the
    # layers before it running their approximate arithmetic on the ranges just calibrated
    rounds = [targets] if source == "float" else [[target] for target in targets]
    for index, group in enumerate(rounds):
        in_float = swapped if source == "float" else [layer for _, layer in targets[index:]]
        # one observer per quantized operand: the layer's input (point None) and any
        # intermediate one (SeparableConv2D's depthwise result)
        observers = {(id(layer), point): RangeObserver(batches) for _, layer in group
                     for point in (None, *layer.intermediate_points)}

        def record(layer, x, point=None, observers=observers):
            observers[(id(layer), point)].update(x)

        with float_forward(in_float), observing([layer for _, layer in group], record):
            run_batches(model, inputs, batch_size)
        for path, layer in group:
            signed = layer.quantization.weights == "symmetric"
            bits = getattr(getattr(layer, "arithmetic", None), "activation_bits", 8)
            for point in (None, *layer.intermediate_points):
                lo, hi = observers[(id(layer), point)].range(method, signed, percentile, bits)
                ranges[path if point is None else f"{path}:{point}"] = (
                    float(np.float32(lo)), float(np.float32(hi)))
                if point is None:
                    layer.set_quantization(layer.quantization.with_range(lo, hi))
                else:
                    layer.set_intermediate_range(point, lo, hi)
        if method == "output":   # one more pass: each range chosen by the layer's output error
            search = OutputSearch(group)
            with float_forward(in_float), observing([layer for _, layer in group], search.record):
                run_batches(model, [a[:SEARCH_SAMPLES] for a in inputs], batch_size)
            narrowed.update(search.choose())
            for path, layer in search.layers:
                lo, hi = layer.current_quantization().activation_range
                ranges[path] = (float(np.float32(lo)), float(np.float32(hi)))
    return CalibrationReport(method, source, count, ranges, narrowed)
