"""Backward-only surgery: keep a computation's forward pass, change its gradient.

The opposite of `tf.stop_gradient`: computations "used only when computing gradients".

    from graphswap import gradients as gg
    y = gg.scale(x, 5.0)                     # forward identity, backward dy * 5
    y = gg.clip_by_value(x, -0.1, 0.1)       # forward identity, backward clipped to [-0.1, 0.1]
    y = gg.clip_by_norm(x, 1.0)              # forward identity, backward's L2 norm <= 1
    y = gg.reverse(x, 1.0)                   # forward identity, backward -1.0 * dy
    y = gg.guided_relu(x)                    # forward relu, backward (dy > 0) * (x > 0) * dy
    y = gg.straight_through(f, b)(x)         # forward f(x) (run once), backward that of b at x
    y = gg.with_gradient(np_fn, grad_fn)(x)  # numpy/ctypes forward, numpy gradient

Every function is a `tf.custom_gradient`: correct eagerly, inside `tf.function` and in
`model.fit`, preserving shapes and dtypes.  Each has a Keras layer (GradientScale, GradientClip,
GradientReversal, GuidedReLU) and a rule object (Scale, ClipByValue, ClipByNorm, Reverse, Guided)
for `override(model, rules)`, which lives in graphswap.overrides and is re-exported here.

Rules resolve through one trio: `get_rule` (name, config dict or rule -> rule), `serialize_rule`,
`deserialize_rule`.  GradientOverride is the wrapper layer `override` puts around a layer: the
wrapped layer keeps its weights (same order), its output gets the rules.
"""

from __future__ import annotations

import inspect
import numbers
import re

import keras
import numpy as np
import tensorflow as tf

from graphswap.errors import (  # noqa: F401 - re-exported for gg.UnknownRuleError etc.
    CustomGradientError, GraphswapError, RuleMatchError, UnknownRuleError)


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------

def _float_tensor(x, what: str):
    x = tf.convert_to_tensor(x)
    if not x.dtype.is_floating:
        raise GraphswapError(
            f"{what}: gradients flow only through floating-point tensors, got dtype "
            f"{x.dtype.name}; cast the input first (e.g. tf.cast(x, tf.float32))")
    return x


def _check_number(value, what: str, positive: bool = False):
    """Validate Python numbers now; tensors/variables are taken as they are."""
    if isinstance(value, (numbers.Number, np.number)) and not isinstance(value, bool):
        if not np.isfinite(float(value)):
            raise GraphswapError(f"{what} must be a finite number, got {value!r}")
        if positive and float(value) <= 0:
            raise GraphswapError(f"{what} must be > 0, got {value!r}")
        return float(value)
    if isinstance(value, (tf.Tensor, tf.Variable, np.ndarray)):
        return value
    raise GraphswapError(f"{what} must be a number or a scalar tensor, got {value!r}")


def _op_name(prefix: str, name: str) -> str:
    """A TensorFlow-valid op name (lambdas are called '<lambda>')."""
    return f"{prefix}_{re.sub(r'[^A-Za-z0-9_.]', '_', name)}".rstrip("_")


# --------------------------------------------------------------------------------------------
# functions
# --------------------------------------------------------------------------------------------

def scale(x, factor):
    """Forward: identity.  Backward: `dy * factor`."""
    x = _float_tensor(x, "scale")
    factor = _check_number(factor, "scale: factor")

    @tf.custom_gradient
    def _scale(x):
        def grad(dy):
            return dy * tf.cast(factor, dy.dtype)

        return tf.identity(x), grad

    return _scale(x)


def reverse(x, factor=1.0):
    """Gradient reversal (Ganin & Lempitsky): forward identity, backward `-factor * dy`."""
    x = _float_tensor(x, "reverse")
    factor = _check_number(factor, "reverse: factor")

    @tf.custom_gradient
    def _reverse(x):
        def grad(dy):
            return -tf.cast(factor, dy.dtype) * dy

        return tf.identity(x), grad

    return _reverse(x)


def clip_by_value(x, clip_value_min, clip_value_max):
    """Forward: identity.  Backward: `clip(dy, clip_value_min, clip_value_max)` element-wise."""
    x = _float_tensor(x, "clip_by_value")
    low = _check_number(clip_value_min, "clip_by_value: clip_value_min")
    high = _check_number(clip_value_max, "clip_by_value: clip_value_max")
    if isinstance(low, float) and isinstance(high, float) and low > high:
        raise GraphswapError(
            f"clip_by_value: clip_value_min ({low}) is greater than clip_value_max ({high})")

    @tf.custom_gradient
    def _clip(x):
        def grad(dy):
            return tf.clip_by_value(dy, tf.cast(low, dy.dtype), tf.cast(high, dy.dtype))

        return tf.identity(x), grad

    return _clip(x)


def clip_by_norm(x, clip_norm, axes=None):
    """Forward: identity.  Backward: `tf.clip_by_norm(dy, clip_norm, axes)`.

    With axes=None the L2 norm is taken over the whole gradient tensor (batch included), as in
    tf.clip_by_norm; pass e.g. axes=[1, 2, 3] to clip each sample's gradient separately.
    """
    x = _float_tensor(x, "clip_by_norm")
    clip_norm = _check_number(clip_norm, "clip_by_norm: clip_norm", positive=True)
    if axes is not None:
        axes = [int(a) for a in (axes if isinstance(axes, (list, tuple)) else [axes])]
        rank = x.shape.rank
        if rank is not None and any(not -rank <= a < rank for a in axes):
            raise GraphswapError(f"clip_by_norm: axes {axes} out of range for a rank-{rank} tensor")

    @tf.custom_gradient
    def _clip(x):
        def grad(dy):
            return tf.clip_by_norm(dy, tf.cast(clip_norm, dy.dtype), axes=axes)

        return tf.identity(x), grad

    return _clip(x)


def guided_relu(x, max_value=None, negative_slope=0.0, threshold=0.0, forward=None):
    """Guided-backprop ReLU (Springenberg et al. 2015).

    Forward: exactly Keras' relu with these options (`keras.activations.relu`), or `forward(x)`
    when given (used to keep e.g. `relu6`'s own op).  Backward: the gradient passes only where the
    unit is in its positive-slope (identity) region *and* the incoming gradient is positive:

        dx = (dy > 0) * (threshold < x < max_value) * dy

    which is `(dy > 0) * (x > 0) * dy` for the plain ReLU.  The leaky part (negative_slope) and the
    saturated part (x >= max_value) pass nothing, just as an inactive unit passes nothing in
    guided backprop.
    """
    x = _float_tensor(x, "guided_relu")
    if max_value is not None:
        max_value = _check_number(max_value, "guided_relu: max_value")
    negative_slope = _check_number(negative_slope, "guided_relu: negative_slope")
    threshold = _check_number(threshold, "guided_relu: threshold")

    @tf.custom_gradient
    def _guided(x):
        if forward is not None:
            y = forward(x)
        else:
            y = keras.activations.relu(x, negative_slope=negative_slope, max_value=max_value,
                                       threshold=threshold)

        def grad(dy):
            gate = tf.logical_and(dy > 0, x > tf.cast(threshold, x.dtype))
            if max_value is not None:
                gate = tf.logical_and(gate, x < tf.cast(max_value, x.dtype))
            return tf.where(gate, dy, tf.zeros_like(dy))

        return tf.identity(y), grad

    return _guided(x)


def straight_through(f, b=None):
    """`straight_through(f, b)(*xs)`: forward `f(*xs)`, backward the gradient of `b` at `xs`.

    f runs once per forward pass.  b runs only when a gradient is asked for, inside the custom
    gradient (its vector-Jacobian product is taken with a GradientTape there), so there is no
    `b(x) + stop_gradient(f(x) - b(x))` double forward.  Without b the gradient passes through
    unchanged (the classic straight-through estimator; f(x) must then have x's shape).

    Variables f reads (e.g. a layer's kernel) get their gradient from b too, so b must read the
    same variables (`straight_through(approx_layer, exact_layer)`); those b does not read get zero.
    """
    if not callable(f):
        raise GraphswapError(f"straight_through: f must be callable, got {f!r}")
    if b is not None and not callable(b):
        raise GraphswapError(f"straight_through: b must be callable or None, got {b!r}")
    f_name = getattr(f, "__name__", type(f).__name__)

    def apply(*xs):
        if not xs:
            raise GraphswapError("straight_through(f, b) must be called with at least one tensor")
        xs = [_float_tensor(x, "straight_through") for x in xs]
        if b is None and len(xs) != 1:
            raise GraphswapError(
                f"straight_through({f_name}) without b passes dy through unchanged, which needs "
                f"exactly one input; got {len(xs)}: give b")

        @tf.custom_gradient
        def _st(*xs):
            y = f(*xs)
            if not isinstance(y, (tf.Tensor, tf.Variable, np.ndarray)) and not tf.is_tensor(y):
                raise CustomGradientError(
                    f"straight_through: f ({f_name}) must return one tensor, got "
                    f"{type(y).__name__}")
            y = tf.convert_to_tensor(y)
            if b is None and not y.shape.is_compatible_with(xs[0].shape):
                raise CustomGradientError(
                    f"straight_through({f_name}) without b passes dy through unchanged, so f's "
                    f"output shape {y.shape} must equal the input shape {xs[0].shape}; give b")

            def grad(dy, variables=None):
                variables = list(variables or [])
                if b is None:
                    input_grads = [tf.cast(dy, xs[0].dtype)]
                    return (input_grads, [tf.zeros_like(v) for v in variables]) if variables \
                        else input_grads[0]
                with tf.GradientTape() as tape:
                    for x in xs:
                        tape.watch(x)
                    yb = tf.convert_to_tensor(b(*xs))
                if not yb.shape.is_compatible_with(dy.shape):
                    raise CustomGradientError(
                        f"straight_through: b's output shape {yb.shape} differs from f's output "
                        f"shape {dy.shape}; b must compute the same function shape as f")
                dy_b = tf.cast(dy, yb.dtype)
                all_grads = tape.gradient(yb, list(xs) + variables, output_gradients=dy_b)
                input_grads, var_grads = all_grads[:len(xs)], all_grads[len(xs):]
                if all(g is None for g in input_grads):
                    raise CustomGradientError(
                        f"straight_through: b ({getattr(b, '__name__', type(b).__name__)}) has no "
                        f"gradient with respect to its inputs (ops such as tf.round and tf.sign "
                        f"have none); use a differentiable surrogate for b")
                input_grads = [tf.zeros_like(x) if g is None else g
                               for x, g in zip(xs, input_grads)]
                if variables:
                    var_grads = [tf.zeros_like(v) if g is None else g
                                 for v, g in zip(variables, var_grads)]
                    return input_grads, var_grads
                return input_grads if len(xs) > 1 else input_grads[0]

            return tf.identity(y), grad

        return _st(*xs)

    apply.__name__ = f"straight_through_{f_name}"
    return apply


def with_gradient(np_fn, grad_fn, output_shape=None, output_dtype=None):
    """Wrap a numpy (or ctypes) function `np_fn(*arrays) -> array` with a user gradient.

    `with_gradient(np_fn, grad_fn)(*xs)` runs np_fn through `tf.numpy_function` with the output's
    static shape set: `output_shape` (a tuple, None entries allowed; or a callable taking the
    input TensorShapes), by default the first input's shape.  Output dtype: `output_dtype`, by
    default the first input's.  The backward pass calls `grad_fn(dy, *arrays)` (numpy in, numpy
    out), which must return one gradient per input (a single array for one input; None for "no
    gradient", taken as zeros), each shaped like its input.  Shapes are checked on every call:
    a mismatch raises CustomGradientError (inside a tf.function it surfaces as TensorFlow's
    InvalidArgumentError carrying the same message).

    The numpy body is Python: it is not serialized into a SavedModel.
    """
    if not callable(np_fn) or not callable(grad_fn):
        raise GraphswapError("with_gradient(np_fn, grad_fn): both arguments must be callable")
    fn_name = getattr(np_fn, "__name__", type(np_fn).__name__)
    grad_name = getattr(grad_fn, "__name__", type(grad_fn).__name__)

    def apply(*xs):
        if not xs:
            raise GraphswapError(f"with_gradient({fn_name}) must be called with at least one "
                                 f"tensor")
        xs = [_float_tensor(x, f"with_gradient({fn_name})") for x in xs]
        dtype = tf.as_dtype(output_dtype) if output_dtype is not None else xs[0].dtype
        if callable(output_shape):
            static_shape = tf.TensorShape(output_shape(*[x.shape for x in xs]))
        elif output_shape is not None:
            static_shape = tf.TensorShape(output_shape)
        else:
            static_shape = xs[0].shape
        same_as_input = output_shape is None

        def forward(*arrays):
            result = np.asarray(np_fn(*arrays))
            expected = arrays[0].shape if same_as_input else None
            if (expected is not None and result.shape != expected) or \
                    not static_shape.is_compatible_with(result.shape):
                raise CustomGradientError(
                    f"with_gradient: {fn_name} returned shape {result.shape}, expected "
                    f"{expected if expected is not None else static_shape}; pass output_shape= "
                    f"if the function changes the shape")
            return result.astype(dtype.as_numpy_dtype, copy=False)

        def backward(dy, *arrays):
            grads = grad_fn(dy, *arrays)
            if len(arrays) == 1 and not isinstance(grads, (tuple, list)):
                grads = (grads,)
            if not isinstance(grads, (tuple, list)) or len(grads) != len(arrays):
                raise CustomGradientError(
                    f"with_gradient: {grad_name}(dy, *inputs) must return one gradient per input "
                    f"({len(arrays)}), got {type(grads).__name__}"
                    f"{'' if not isinstance(grads, (tuple, list)) else f' of {len(grads)}'}")
            out = []
            for index, (grad, array) in enumerate(zip(grads, arrays)):
                if grad is None:
                    out.append(np.zeros_like(array))
                    continue
                grad = np.asarray(grad)
                if grad.shape != array.shape:
                    raise CustomGradientError(
                        f"with_gradient: {grad_name} returned a gradient of shape {grad.shape} "
                        f"for input {index}, whose shape is {array.shape}; a gradient must have "
                        f"its input's shape")
                out.append(grad.astype(array.dtype, copy=False))
            return out

        @tf.custom_gradient
        def _wrapped(*xs):
            y = tf.numpy_function(forward, list(xs), dtype, name=_op_name("with_gradient", fn_name))
            y.set_shape(static_shape)

            def grad(dy):
                grads = tf.numpy_function(backward, [tf.cast(dy, dtype), *xs],
                                          [x.dtype for x in xs],
                                          name=_op_name("gradient", grad_name))
                if not isinstance(grads, (list, tuple)):
                    grads = [grads]
                grads = list(grads)
                for g, x in zip(grads, xs):
                    g.set_shape(x.shape)
                return grads if len(xs) > 1 else grads[0]

            return y, grad

        return _wrapped(*xs)

    apply.__name__ = f"with_gradient_{fn_name}"
    return apply


# --------------------------------------------------------------------------------------------
# rules: what override() attaches; one get / serialize / deserialize trio
# --------------------------------------------------------------------------------------------

class Rule:
    """A backward modification of a layer's output.  Subclasses define `apply(x)`."""

    name = "rule"

    def apply(self, x):
        raise NotImplementedError

    def describe(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if v is not None)
        return f"{self.name}({args})"

    def get_config(self) -> dict:
        return {}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def layer(self, **kwargs):
        """A Keras layer applying this rule (for building models by hand)."""
        raise NotImplementedError

    def __eq__(self, other):
        return type(self) is type(other) and self.get_config() == other.get_config()

    def __hash__(self):
        return hash((type(self).__name__, tuple(sorted(self.get_config().items()))))

    def __repr__(self):
        args = ", ".join(f"{v!r}" for v in self.get_config().values())
        return f"gg.{type(self).__name__}({args})"


@keras.saving.register_keras_serializable(package="graphswap")
class Scale(Rule):
    """Multiply the gradient by `factor`."""

    name = "scale"

    def __init__(self, factor):
        self.factor = float(_check_number(factor, "Scale: factor"))

    def apply(self, x):
        return scale(x, self.factor)

    def get_config(self):
        return {"factor": self.factor}

    def layer(self, **kwargs):
        return GradientScale(self.factor, **kwargs)


@keras.saving.register_keras_serializable(package="graphswap")
class Reverse(Rule):
    """Reverse (and scale) the gradient: `-factor * dy`."""

    name = "reverse"

    def __init__(self, factor=1.0):
        self.factor = float(_check_number(factor, "Reverse: factor"))

    def apply(self, x):
        return reverse(x, self.factor)

    def get_config(self):
        return {"factor": self.factor}

    def layer(self, **kwargs):
        return GradientReversal(self.factor, **kwargs)


@keras.saving.register_keras_serializable(package="graphswap")
class ClipByValue(Rule):
    """Clip the gradient element-wise to [min_value, max_value]."""

    name = "clip_by_value"

    def __init__(self, min_value, max_value):
        self.min_value = float(_check_number(min_value, "ClipByValue: min_value"))
        self.max_value = float(_check_number(max_value, "ClipByValue: max_value"))
        if self.min_value > self.max_value:
            raise GraphswapError(f"ClipByValue: min_value ({self.min_value}) is greater than "
                                 f"max_value ({self.max_value})")

    def apply(self, x):
        return clip_by_value(x, self.min_value, self.max_value)

    def get_config(self):
        return {"min_value": self.min_value, "max_value": self.max_value}

    def layer(self, **kwargs):
        return GradientClip(min_value=self.min_value, max_value=self.max_value, **kwargs)


@keras.saving.register_keras_serializable(package="graphswap")
class ClipByNorm(Rule):
    """Clip the gradient's L2 norm to `clip_norm` (over `axes`, default the whole tensor)."""

    name = "clip_by_norm"

    def __init__(self, clip_norm, axes=None):
        self.clip_norm = float(_check_number(clip_norm, "ClipByNorm: clip_norm", positive=True))
        self.axes = None if axes is None else [int(a) for a in (
            axes if isinstance(axes, (list, tuple)) else [axes])]

    def apply(self, x):
        return clip_by_norm(x, self.clip_norm, self.axes)

    def get_config(self):
        return {"clip_norm": self.clip_norm, "axes": self.axes}

    def __hash__(self):
        return hash((type(self).__name__, self.clip_norm, tuple(self.axes or ())))

    def layer(self, **kwargs):
        return GradientClip(norm=self.clip_norm, axes=self.axes, **kwargs)


@keras.saving.register_keras_serializable(package="graphswap")
class Guided(Rule):
    """Guided-backprop ReLU: replaces the backward of every ReLU form the rule reaches."""

    name = "guided"

    def apply(self, x):
        return guided_relu(x)

    def layer(self, **kwargs):
        return GuidedReLU(**kwargs)

    def __repr__(self):
        return "gg.Guided()"


RULES = {"scale": Scale, "reverse": Reverse, "clip_by_value": ClipByValue,
         "clip_by_norm": ClipByNorm, "guided": Guided}
# names usable as a bare string (rules that need no argument)
RULE_NAMES = {"guided": Guided, "reverse": Reverse}


def _allowed_rules_text() -> str:
    return ("allowed: the names " + ", ".join(repr(n) for n in RULE_NAMES)
            + ", or rule objects gg.Scale(factor), gg.Reverse(factor), gg.ClipByValue(min, max), "
              "gg.ClipByNorm(norm), gg.Guided(), or a config dict "
              "{\"rule\": \"scale\", \"factor\": 0.5}")


def get_rule(identifier) -> Rule:
    """A Rule from a rule object, a bare name ("guided", "reverse") or a config dict."""
    if isinstance(identifier, Rule):
        return identifier
    if isinstance(identifier, str):
        key = identifier.strip().lower()
        if key in RULE_NAMES:
            return RULE_NAMES[key]()
        hint = ""
        if key in RULES:
            hint = f" ({identifier!r} needs arguments: use gg.{RULES[key].__name__}(...))"
        raise UnknownRuleError(f"unknown gradient rule {identifier!r}{hint}; "
                               f"{_allowed_rules_text()}")
    if isinstance(identifier, dict):
        return deserialize_rule(identifier)
    raise UnknownRuleError(f"a gradient rule must be a name, a rule object or a config dict, "
                           f"got {identifier!r}; {_allowed_rules_text()}")


def serialize_rule(rule) -> dict:
    rule = get_rule(rule)
    return {"rule": rule.name, **rule.get_config()}


def deserialize_rule(config: dict) -> Rule:
    config = dict(config)
    name = config.pop("rule", None)
    if name not in RULES:
        raise UnknownRuleError(f"unknown gradient rule {name!r} in config; "
                               f"{_allowed_rules_text()}")
    try:
        return RULES[name].from_config(config)
    except TypeError as exc:
        raise UnknownRuleError(f"bad arguments for gradient rule {name!r}: {exc}") from None


# --------------------------------------------------------------------------------------------
# layers
# --------------------------------------------------------------------------------------------

class _GradientLayer(keras.layers.Layer):
    """Shape/dtype-preserving, weightless layers."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def compute_output_shape(self, input_shape):
        return input_shape


@keras.saving.register_keras_serializable(package="graphswap")
class GradientScale(_GradientLayer):
    """Forward identity, backward `dy * factor`."""

    def __init__(self, factor, **kwargs):
        super().__init__(**kwargs)
        self.factor = float(_check_number(factor, "GradientScale: factor"))

    def call(self, inputs):
        return scale(inputs, self.factor)

    def get_config(self):
        return {**super().get_config(), "factor": self.factor}


@keras.saving.register_keras_serializable(package="graphswap")
class GradientReversal(_GradientLayer):
    """Forward identity, backward `-factor * dy` (domain-adversarial training)."""

    def __init__(self, factor=1.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = float(_check_number(factor, "GradientReversal: factor"))

    def call(self, inputs):
        return reverse(inputs, self.factor)

    def get_config(self):
        return {**super().get_config(), "factor": self.factor}


@keras.saving.register_keras_serializable(package="graphswap")
class GradientClip(_GradientLayer):
    """Forward identity; backward clipped element-wise to [min_value, max_value] and/or to L2
    norm `norm` (over `axes`, default the whole tensor).  With both, the value clip comes first."""

    def __init__(self, min_value=None, max_value=None, norm=None, axes=None, **kwargs):
        super().__init__(**kwargs)
        if (min_value is None) != (max_value is None):
            raise GraphswapError("GradientClip: give both min_value and max_value, or neither")
        if min_value is None and norm is None:
            raise GraphswapError("GradientClip needs min_value and max_value, or norm (or both)")
        self.value_rule = ClipByValue(min_value, max_value) if min_value is not None else None
        self.norm_rule = ClipByNorm(norm, axes) if norm is not None else None

    def call(self, inputs):
        # forward order is the reverse of backward order: value clip applies to dy first
        outputs = inputs
        if self.norm_rule is not None:
            outputs = self.norm_rule.apply(outputs)
        if self.value_rule is not None:
            outputs = self.value_rule.apply(outputs)
        return outputs

    def get_config(self):
        value = self.value_rule.get_config() if self.value_rule else {}
        norm = self.norm_rule.get_config() if self.norm_rule else {}
        return {**super().get_config(), "min_value": value.get("min_value"),
                "max_value": value.get("max_value"), "norm": norm.get("clip_norm"),
                "axes": norm.get("axes")}


@keras.saving.register_keras_serializable(package="graphswap")
class GuidedReLU(_GradientLayer):
    """keras.layers.ReLU's forward (same options), guided-backprop backward (see guided_relu)."""

    def __init__(self, max_value=None, negative_slope=0.0, threshold=0.0, **kwargs):
        super().__init__(**kwargs)
        if max_value is not None and max_value < 0:
            raise GraphswapError(f"GuidedReLU: max_value must be >= 0, got {max_value}")
        if negative_slope < 0:
            raise GraphswapError(f"GuidedReLU: negative_slope must be >= 0, got {negative_slope}")
        self.max_value = None if max_value is None else float(max_value)
        self.negative_slope = float(negative_slope)
        self.threshold = float(threshold)

    def call(self, inputs):
        return guided_relu(inputs, self.max_value, self.negative_slope, self.threshold)

    def get_config(self):
        return {**super().get_config(), "max_value": self.max_value,
                "negative_slope": self.negative_slope, "threshold": self.threshold}


@keras.saving.register_keras_serializable(package="graphswap")
class GradientOverride(keras.layers.Layer):
    """Wraps a layer: its forward unchanged, its output's gradient modified by `rules`.

    `guided` (a dict of GuidedReLU options, or None) means the wrapped layer's ReLU activation has
    been split off (the wrapped layer has activation="linear") and is applied here as a guided
    ReLU.  `rules` (rule objects/configs) act on the output gradient in the order listed: the
    first rule sees the incoming gradient first.  The wrapped layer's weights are this layer's
    weights, in the same order, so weights copy 1:1 between the original and the wrapper.
    """

    def __init__(self, layer, rules=(), guided=None, **kwargs):
        if isinstance(layer, dict):
            layer = keras.saving.deserialize_keras_object(layer)
        if not isinstance(layer, keras.layers.Layer):
            raise GraphswapError(f"GradientOverride wraps a Keras layer, got {layer!r}")
        kwargs.setdefault("name", layer.name)
        super().__init__(**kwargs)
        self.layer = layer
        self.rules = [get_rule(r) for r in rules]
        self.guided = dict(guided) if guided is not None else None
        if self.guided is not None:
            GuidedReLU(**self.guided)  # validate
        self._wrapped_takes_training = "training" in inspect.signature(layer.call).parameters

    def build(self, input_shape):
        if not self.layer.built:
            self.layer.build(input_shape)
        self.built = True

    def call(self, inputs, training=None):
        if self._wrapped_takes_training:
            outputs = self.layer(inputs, training=training)
        else:
            outputs = self.layer(inputs)

        def post(tensor):
            if self.guided is not None:
                tensor = guided_relu(tensor, **self.guided)
            for rule in reversed(self.rules):
                tensor = rule.apply(tensor)
            return tensor

        return keras.tree.map_structure(post, outputs)

    def compute_output_shape(self, input_shape):
        return self.layer.compute_output_shape(input_shape)

    def describe(self) -> str:
        parts = []
        if self.guided is not None:
            parts.append("guided ReLU (activation split off)")
        parts += [rule.describe() for rule in self.rules]
        return "; ".join(parts)

    def get_config(self):
        return {**super().get_config(),
                "layer": keras.saving.serialize_keras_object(self.layer),
                "rules": [serialize_rule(rule) for rule in self.rules],
                "guided": self.guided}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["layer"] = keras.saving.deserialize_keras_object(config["layer"])
        return cls(**config)


def __getattr__(name):
    """`override` and its report live in graphswap.overrides; re-exported here lazily."""
    if name in ("override", "OverrideReport", "OverrideWarning", "relu_form"):
        from graphswap import overrides as _override_module

        return getattr(_override_module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
