"""A swapped layer's quantization state: its QuantScheme, its static activation range, its output
correction - kept in the layer (config + non-weight state), shared by every swapped layer type
through `QuantizedLayerMixin` (the swapped layers' mixin inherits it).

What a layer whose arithmetic quantizes (an 8-bit multiplier) holds:

  quantization       a resolved QuantScheme (graphswap/kernels/scheme.py), config key
                     "quantization"; None for float kernels
  activation range   static activations: (lo, hi) of the layer's input, a non-trainable
                     tf.Variable (so the moving-average observer can update it inside training
                     steps) whose current value is written into the config's
                     quantization.activation_range - saved and reloaded with the layer
  intermediate       a layer with a second product of a tensor it computes itself (SeparableConv2D:
  ranges             the pointwise product of the depthwise result) has one more static range per
                     such operand (`intermediate_points`), held the same way, config key
                     "intermediate_ranges": {point: [lo, hi] | None}
  output correction  per output channel y <- y * gain + offset, applied to the product before the
                     bias (config key "output_correction": {"gain": [...] | None,
                     "offset": [...] | None}); bias (mean-error) compensation sets the offset.
                     Also tf.Variables, so a correction set after a model was traced applies.

None of these are Keras weights: a swapped layer's weights stay exactly the stock layer's
(kernel, bias), so weights transfer 1:1 from and to stock layers and checkpoints.  Consequence:
`set_weights`/`get_weights` (and fine-tuning's best-epoch restore) do not carry the state; the
config does.

Files written before this state existed have no "quantization" key; they reload with the scheme
they were trained with ("legacy": asymmetric per-tensor dynamic for unsigned multipliers,
symmetric per-channel dynamic for signed ones).

Observation hook: while `layer.observer` is set (a callable), every eager call hands it
(layer, input as float32 numpy, in the layout the kernel sees: (m, k) / NHWC, point) - point None
for the layer's input, the point's name for an intermediate operand; calibration and bias
compensation (graphswap/swap/calibration.py) use it.  While `layer.arithmetic` is
temporarily a float kernel (calibration's float pass), the scheme and the correction are skipped:
the layer computes the float product.  `layer.numpy_product(x, arithmetic, quant)` (each swapped
layer type implements it) computes the layer's product on such an input in numpy.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from graphswap.errors import QuantizationError
from graphswap.kernels import QuantScheme, oriented, tfapprox_scheme
from graphswap.kernels.scheme import as_range
from graphswap.swap.xla import RunsOutsideXla, affine

LEGACY = "legacy"


def legacy_scheme(signed: bool) -> QuantScheme:
    """What graphswap ran before QuantScheme existed (for files without a "quantization" key)."""
    if signed:
        return QuantScheme(weights="symmetric", granularity="per_channel", activations="dynamic")
    return tfapprox_scheme()


def check_quantization(arithmetic, quantization) -> None:
    """Raise QuantizationError if `quantization` cannot describe a layer running `arithmetic`."""
    if getattr(arithmetic, "quantizes", False) and quantization != LEGACY:
        QuantScheme.from_config(quantization).resolve(bool(getattr(arithmetic, "signed", False)))


def _vector(values, channels, what, layer_name):
    if values is None:
        return None
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    if array.shape != (channels,) or not np.isfinite(array).all():
        raise QuantizationError(f"layer {layer_name!r}: output correction {what} must be "
                                f"{channels} finite numbers (one per output channel); got shape "
                                f"{np.asarray(values).shape}")
    return array.astype(np.float32)


def _range_key(point: str | None) -> str:
    return "range" if point is None else f"range:{point}"


def _intermediate_ranges(values, points, layer_name) -> dict:
    """The config's intermediate_ranges, checked: {point: (lo, hi)} for the known points."""
    if not values:
        return {}
    if not isinstance(values, dict) or set(values) - set(points):
        raise QuantizationError(
            f"layer {layer_name!r}: intermediate_ranges must map its intermediate operands "
            f"({', '.join(points) or 'none'}) to [lo, hi]; got {values!r}")
    checked = {}
    for point, value in values.items():
        if value is not None:
            checked[point] = as_range(value)
    return checked


def _read(variable) -> np.ndarray:
    """A variable's current value, also while a tf.function is being traced."""
    with tf.init_scope():
        return np.asarray(variable.numpy())


class QuantizedLayerMixin(RunsOutsideXla):
    """Quantization state of a swapped layer (module docstring).  The layer calls
    `_init_quantization` after its arithmetic is resolved, `_build_quantization(channels)` at the
    end of build, `_quant_inputs(x, training)` for the op's arguments and `_correct_outputs(y)` on
    the product (or `_output_epilogue(bias)`, for ops that apply correction and bias themselves).

    Every swapped type runs calibrated static ranges and carries an output correction (per
    output channel; EinsumDense: per matmul column).  MultiHeadAttention holds no product of its
    own: its projections (EinsumDense layers, `quantized_parts()`) hold the state.
    `intermediate_points`: names of the operands, beyond the input, that the layer computes and
    quantizes itself (SeparableConv2D's depthwise result; each gets a range of its own).
    Every swapped layer runs outside XLA (`RunsOutsideXla`, graphswap/swap/xla.py)."""

    observer = None
    intermediate_points: tuple = ()

    def _init_quantization(self, quantization, output_correction, intermediate_ranges=None):
        arithmetic = self.arithmetic
        self._gs_state = None
        self._pending_intermediate = _intermediate_ranges(intermediate_ranges,
                                                          self.intermediate_points, self.name)
        if not getattr(arithmetic, "quantizes", False):
            self.quantization = None
            self._pending_correction = None
            return
        signed = bool(getattr(arithmetic, "signed", False))
        scheme = legacy_scheme(signed) if quantization == LEGACY else \
            QuantScheme.from_config(quantization)
        self.quantization = scheme.resolve(signed)
        self.arithmetic = oriented(arithmetic, self.quantization)  # the wiring the scheme names
        self._pending_correction = output_correction

    def _build_quantization(self, channels: int):
        if self.quantization is None:
            return
        value = self.quantization.activation_range or (np.nan, np.nan)
        pending = self._pending_correction or {}
        gain = _vector(pending.get("gain"), channels, "gain", self.name)
        offset = _vector(pending.get("offset"), channels, "offset", self.name)
        variable = dict(trainable=False, synchronization=tf.VariableSynchronization.ON_WRITE,
                        aggregation=tf.VariableAggregation.MEAN)
        self._gs_state = {
            "range": tf.Variable(np.asarray(value, np.float32), name="activation_range",
                                 **variable),
            "gain": tf.Variable(np.ones(channels, np.float32) if gain is None else gain,
                                name="output_gain", **variable),
            "offset": tf.Variable(np.zeros(channels, np.float32) if offset is None else offset,
                                  name="output_offset", **variable),
        }
        for point in self.intermediate_points:
            value = self._pending_intermediate.get(point) or (np.nan, np.nan)
            self._gs_state[_range_key(point)] = tf.Variable(
                np.asarray(value, np.float32), name=f"activation_range_{point}", **variable)

    # -- reading and setting the state ----------------------------------------------------------
    def current_quantization(self, point: str | None = None) -> QuantScheme | None:
        """The scheme with the activation range as it is now (after any observer updates) - of
        the layer's input, or of the intermediate operand `point`."""
        scheme = self.quantization
        if point is not None:
            self._check_point(point)
        if scheme is None or scheme.activations != "static" or self._gs_state is None:
            return scheme
        lo, hi = (float(v) for v in _read(self._gs_state[_range_key(point)]))
        if not (np.isfinite(lo) and np.isfinite(hi)):
            # not calibrated yet: the scheme as configured (an intermediate has no range then)
            return scheme if point is None else dataclasses.replace(scheme, activation_range=None)
        return scheme.with_range(lo, hi)

    def intermediate_ranges(self) -> dict:
        """{point: (lo, hi) or None} of the intermediate operands, as they are now."""
        ranges = {}
        for point in self.intermediate_points:
            if self._gs_state is None:
                value = self._pending_intermediate.get(point)
            else:
                value = tuple(float(v) for v in _read(self._gs_state[_range_key(point)]))
                value = value if np.isfinite(value).all() else None
            ranges[point] = None if value is None else tuple(float(v) for v in value)
        return ranges

    def set_intermediate_range(self, point: str, lo, hi) -> None:
        """Set the static range of the intermediate operand `point` (calibration does)."""
        self._check_point(point)
        if self._gs_state is None:
            raise QuantizationError(f"layer {self.name!r} has no quantization state (a float "
                                    f"kernel, or not built yet)")
        self._gs_state[_range_key(point)].assign(np.asarray(as_range((lo, hi)), np.float32))

    def part_schemes(self) -> list:
        """The scheme of each of the layer's products, in the order exports number them: its
        input's, then each intermediate operand's (as they are now)."""
        return [self.current_quantization(point) for point in (None, *self.intermediate_points)]

    def _check_point(self, point) -> None:
        if point not in self.intermediate_points:
            raise QuantizationError(
                f"layer {self.name!r} has no intermediate operand {point!r}; it has: "
                f"{', '.join(self.intermediate_points) or 'none'}")

    def set_quantization(self, scheme: QuantScheme) -> None:
        """Replace the layer's scheme (e.g. static, with a calibrated range)."""
        if self.quantization is None:
            raise QuantizationError(f"layer {self.name!r} runs {self.arithmetic.spec}, a float "
                                    f"kernel: it does not quantize")
        scheme = QuantScheme.from_config(scheme).resolve(bool(self.arithmetic.signed))
        self.quantization = scheme
        self.arithmetic = oriented(self.arithmetic, scheme)
        if self._gs_state is not None:
            value = scheme.activation_range or (np.nan, np.nan)
            self._gs_state["range"].assign(np.asarray(value, np.float32))

    @property
    def output_correction(self) -> dict | None:
        """{"gain": list | None, "offset": list | None}, or None when there is none."""
        if self._gs_state is None:
            return self._pending_correction if self.quantization is not None else None
        gain = _read(self._gs_state["gain"])
        offset = _read(self._gs_state["offset"])
        result = {"gain": None if (gain == 1).all() else [float(v) for v in gain],
                  "offset": None if (offset == 0).all() else [float(v) for v in offset]}
        return None if result["gain"] is None and result["offset"] is None else result

    def set_output_correction(self, gain=None, offset=None) -> None:
        """Set the per-output-channel correction y <- y * gain + offset (None: 1 / 0)."""
        if self._gs_state is None:
            raise QuantizationError(f"layer {self.name!r} has no output correction (a float "
                                    f"kernel, or not built yet)")
        channels = int(self._gs_state["gain"].shape[0])
        gain = _vector(gain, channels, "gain", self.name)
        offset = _vector(offset, channels, "offset", self.name)
        self._gs_state["gain"].assign(np.ones(channels, np.float32) if gain is None else gain)
        self._gs_state["offset"].assign(np.zeros(channels, np.float32) if offset is None
                                        else offset)

    def _quantization_config(self) -> dict:
        if self.quantization is None:
            return {}
        config = {"quantization": self.current_quantization().to_config(),
                  "output_correction": self.output_correction}
        if self.intermediate_points:
            config["intermediate_ranges"] = {
                point: None if value is None else list(value)
                for point, value in self.intermediate_ranges().items()}
        return config

    # -- in the forward pass -------------------------------------------------------------------
    def _quant_inputs(self, x, training, point: str | None = None):
        """(scheme, activation-range tensor or None) for the op on the layer's input (or the
        intermediate operand `point`); updates a moving-average range in training calls; hands
        eager inputs to the observer."""
        if self.observer is not None and tf.executing_eagerly():
            self.observer(self, np.asarray(x, dtype=np.float32), point)
        scheme = self.quantization
        if not getattr(self.arithmetic, "quantizes", False):
            return None, None   # a float forward (e.g. calibration's float pass)
        if scheme is None or scheme.activations != "static":
            return scheme, None
        calibrated = scheme.activation_range is not None and self._gs_state is not None
        if calibrated and point is not None:
            calibrated = self.intermediate_ranges()[point] is not None
        if not calibrated:
            what = "" if point is None else f" for its {point} operand"
            raise QuantizationError(
                f"layer {self.name!r} uses static activations but has no calibrated range{what}; "
                f"calibrate it (rewrite_model(..., calibration_data=...), --calibrate DATA)")
        current = self._gs_state[_range_key(point)]
        if training is True and scheme.observer == "moving_average":
            x32 = tf.cast(x, tf.float32)
            finite = tf.math.is_finite(x32)
            lo = tf.reduce_min(tf.where(finite, x32, tf.float32.max))
            hi = tf.reduce_max(tf.where(finite, x32, tf.float32.min))
            observed = tf.stack([tf.minimum(lo, hi), tf.maximum(lo, hi)])
            m = tf.constant(scheme.momentum, tf.float32)
            updated = m * current + (1.0 - m) * observed
            updated = tf.where(tf.reduce_any(finite), updated, current)
            current.assign(updated)
            return scheme, tf.identity(updated)
        return scheme, tf.identity(current)

    def _correction(self, dtype):
        """(gain, offset) of the output correction as `dtype` tensors, or (None, None) when the
        layer has none (a float kernel, or not built yet)."""
        if self._gs_state is None or not getattr(self.arithmetic, "quantizes", False):
            return None, None
        return (tf.cast(self._gs_state["gain"], dtype),
                tf.cast(self._gs_state["offset"], dtype))

    def _output_epilogue(self, bias=None):
        """(gain, shift) float32 tensors (or None) for an op that applies its product's epilogue
        itself: y * gain + (offset + bias) - the output correction and the bias in one pass."""
        gain, shift = self._correction(tf.float32)
        if bias is not None:
            bias = tf.cast(bias, tf.float32)
            shift = bias if shift is None else shift + bias
        return gain, shift

    def _correct_outputs(self, y):
        """y * gain + offset over the last (channel) axis (rounded as the C epilogue: affine)."""
        gain, offset = self._correction(y.dtype)
        return y if gain is None else affine(y, gain, offset)
