"""Rules and their layers.

Rules are what `override(model, rules)` attaches to a layer's output gradient; one trio resolves
them: `get_rule` (name, config dict or rule -> rule), `serialize_rule`, `deserialize_rule`.  Each
rule has a Keras layer applying it (GradientScale, GradientReversal, GradientClip, GuidedReLU:
shape- and dtype-preserving, weightless), for models built by hand.  They share one module because
each needs the other: a rule builds its layer, GradientClip is made of clip rules."""

from __future__ import annotations

import keras

from graphswap.errors import GraphswapError, UnknownRuleError
from graphswap.surgery.primitives import (check_number, clip_by_norm, clip_by_value, guided_relu,
                                          reverse, scale)


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
        self.factor = float(check_number(factor, "Scale: factor"))

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
        self.factor = float(check_number(factor, "Reverse: factor"))

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
        self.min_value = float(check_number(min_value, "ClipByValue: min_value"))
        self.max_value = float(check_number(max_value, "ClipByValue: max_value"))
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
        self.clip_norm = float(check_number(clip_norm, "ClipByNorm: clip_norm", positive=True))
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
        self.factor = float(check_number(factor, "GradientScale: factor"))

    def call(self, inputs):
        return scale(inputs, self.factor)

    def get_config(self):
        return {**super().get_config(), "factor": self.factor}


@keras.saving.register_keras_serializable(package="graphswap")
class GradientReversal(_GradientLayer):
    """Forward identity, backward `-factor * dy` (domain-adversarial training)."""

    def __init__(self, factor=1.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = float(check_number(factor, "GradientReversal: factor"))

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
