"""Backward-only surgery: keep a computation's forward pass, change its gradient.

Modules: primitives (scale, reverse, clip_by_value, clip_by_norm, guided_relu, straight_through,
with_gradient), rules (what `override` attaches, with one get/serialize/deserialize trio, and the
Keras layers applying them), wrapper (GradientOverride), override (`override(model, rules)`).
The public, documented face of all of it is `graphswap.gradients` (`from graphswap import
gradients as gg`).
"""

from graphswap.errors import CustomGradientError, RuleMatchError, UnknownRuleError
from graphswap.surgery.override import (OverrideEntry, OverrideReport, OverrideWarning, ReluForm,
                                        activation_name, override, relu_form)
from graphswap.surgery.primitives import (clip_by_norm, clip_by_value, guided_relu, reverse, scale,
                                          straight_through, with_gradient)
from graphswap.surgery.rules import (RULE_NAMES, RULES, ClipByNorm, ClipByValue, GradientClip,
                                     GradientReversal, GradientScale, Guided, GuidedReLU, Reverse,
                                     Rule, Scale, deserialize_rule, get_rule, serialize_rule)
from graphswap.surgery.wrapper import GradientOverride

__all__ = ["ClipByNorm", "ClipByValue", "CustomGradientError", "GradientClip", "GradientOverride",
           "GradientReversal", "GradientScale", "Guided", "GuidedReLU", "OverrideEntry",
           "OverrideReport", "OverrideWarning", "RULES", "RULE_NAMES", "ReluForm", "Reverse",
           "Rule", "RuleMatchError", "Scale", "UnknownRuleError", "activation_name",
           "clip_by_norm", "clip_by_value", "deserialize_rule", "get_rule", "guided_relu",
           "override", "relu_form", "reverse", "scale", "serialize_rule", "straight_through",
           "with_gradient"]
