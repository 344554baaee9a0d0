"""`override(model, rules)`: a copy of a model whose selected layers get backward modifications.

Uses the same machinery as `rewrite_model` (graphswap.swap.transform_model): Sequential and
Functional models are cloned recursively (nested models, shared layers), weights copy 1:1, and the
input model is never modified.

Rules are a dict {selector: rule or [rules]}.

Selectors
  "dense_1", "outer/inner/dense_1"   a layer by name or nested path
  "conv*", "inner/*"                 a glob (fnmatch) over names and paths
  "type:Dense", keras.layers.Dense   by type (subclasses included, e.g. SwappedDense)
  "activation:softmax"               layers whose `activation` is that function
  "relu" (= "activation:relu")       every ReLU form: activation="relu"/"relu6"/"leaky_relu" on
                                     Dense/Conv*/EinsumDense/..., keras.layers.ReLU (any options),
                                     LeakyReLU, Activation("relu"/"relu6"/"leaky_relu"), at any
                                     nesting depth

Rules
  "guided" / gg.Guided()       the ReLU's backward becomes guided backprop (see gg.guided_relu);
                               a layer with activation="relu" keeps its weights and gets the
                               activation split off into the guided ReLU
  gg.Scale(f), gg.Reverse(f), gg.ClipByValue(lo, hi), gg.ClipByNorm(n)
                               act on the gradient arriving at the layer's output

Several rules on one layer act on the output gradient in the order listed.  A selector that
matches no layer (or, for "guided", no ReLU form) is a warning, listed in the report, or a
RuleMatchError with strict=True; so is a ReLU that cannot be reached (inside a recurrent layer,
or keras.ops.relu called directly in a functional graph, which is not a layer).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import warnings

import keras

from graphswap.errors import GraphswapError
from graphswap.errors import RuleMatchError
from graphswap.surgery.rules import Guided, GuidedReLU, get_rule
from graphswap.surgery.wrapper import GradientOverride
from graphswap.swap import check_cloneable, iter_layers, transform_model
from graphswap.tables import format_table


class OverrideWarning(UserWarning):
    """A rule that matched nothing, or a ReLU that override cannot reach."""


# Layers whose call() ends with `outputs = self.activation(outputs)`: the activation can be split
# off and re-applied outside.  isinstance, so subclasses (SwappedDense, SwappedConv2D) count.
OUTPUT_ACTIVATION_TYPES = tuple(getattr(keras.layers, name) for name in (
    "Dense", "EinsumDense", "Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose", "Conv2DTranspose",
    "Conv3DTranspose", "DepthwiseConv1D", "DepthwiseConv2D", "SeparableConv1D", "SeparableConv2D")
    if hasattr(keras.layers, name))

# activation name -> GuidedReLU options reproducing it exactly
RELU_ACTIVATIONS = {"relu": {}, "relu6": {"max_value": 6.0}, "leaky_relu": {"negative_slope": 0.2}}
RELU_OPERATIONS = ("Relu", "Relu6", "LeakyRelu")


def activation_name(function) -> str | None:
    """'relu', 'softmax', ... for a layer's activation function (None if it has none)."""
    if function is None:
        return None
    try:
        name = keras.activations.serialize(function)
        if isinstance(name, str):
            return name
    except Exception:  # noqa: BLE001 - fall back to the function's own name
        pass
    return getattr(function, "__name__", None)


@dataclasses.dataclass
class ReluForm:
    """How a layer applies a ReLU: `kind` is "layer" (the layer is the ReLU), "activation" (its
    activation argument), or "unreachable" (`reason` says why)."""

    kind: str
    options: dict
    reason: str = ""


def relu_form(layer) -> ReluForm | None:
    """The ReLU a layer applies, or None."""
    if isinstance(layer, keras.layers.ReLU):
        config = layer.get_config()
        return ReluForm("layer", {"max_value": config.get("max_value"),
                                  "negative_slope": float(config.get("negative_slope") or 0.0),
                                  "threshold": float(config.get("threshold") or 0.0)})
    if isinstance(layer, keras.layers.LeakyReLU):
        return ReluForm("layer", {"negative_slope": float(layer.get_config()["negative_slope"])})
    name = activation_name(getattr(layer, "activation", None))
    if name not in RELU_ACTIVATIONS:
        return None
    options = dict(RELU_ACTIVATIONS[name])
    if isinstance(layer, keras.layers.Activation):
        return ReluForm("layer", options)
    if isinstance(layer, OUTPUT_ACTIVATION_TYPES):
        return ReluForm("activation", options)
    return ReluForm("unreachable", options,
                    f"{type(layer).__name__} applies {name} inside its own computation (e.g. a "
                    f"recurrence), where override cannot split it off")


@dataclasses.dataclass
class OverrideEntry:
    path: str
    layer_type: str
    action: str        # "overridden", "kept", "skipped"
    detail: str = ""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class OverrideReport:
    model_name: str
    layers: list[OverrideEntry]
    warnings: list[str]

    @property
    def overridden(self) -> list[OverrideEntry]:
        return [entry for entry in self.layers if entry.action == "overridden"]

    def to_dict(self) -> dict:
        return {"model": self.model_name, "overridden": len(self.overridden),
                "layers": [entry.to_dict() for entry in self.layers],
                "warnings": list(self.warnings)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def format_table(self) -> str:
        headers = ("layer", "type", "action", "detail")
        rows = [(e.path, e.layer_type, e.action, e.detail) for e in self.layers]
        out = format_table(headers, rows)
        out.append(f"{len(self.overridden)} of {len(self.layers)} layers overridden")
        out += [f"warning: {message}" for message in self.warnings]
        return "\n".join(text.rstrip() for text in out)


class _Selector:
    def __init__(self, key):
        self.key = key
        if isinstance(key, type) and issubclass(key, keras.layers.Layer):
            self.kind, self.value = "type", key
            self.label = f"type {key.__name__}"
            return
        if not isinstance(key, str) or not key.strip():
            raise GraphswapError(
                f"override: a rule key must be a layer name, path or glob ('conv*'), "
                f"'type:ClassName' or a layer class, 'activation:NAME', or 'relu'; got {key!r}")
        text = key.strip()
        if text.lower() == "relu" or text.lower() == "activation:relu":
            self.kind, self.value, self.label = "relu", "relu", "every ReLU form"
        elif text.startswith("activation:"):
            self.kind, self.value = "activation", text.split(":", 1)[1].strip()
            self.label = f"activation {self.value}"
        elif text.startswith("type:"):
            self.kind, self.value = "type", text.split(":", 1)[1].strip()
            self.label = f"type {self.value}"
        else:
            self.kind, self.value, self.label = "name", text, f"name {text!r}"

    def matches(self, path: str, layer) -> bool:
        if self.kind == "name":
            return (self.value in (path, layer.name) or fnmatch.fnmatchcase(layer.name, self.value)
                    or fnmatch.fnmatchcase(path, self.value))
        if self.kind == "type":
            if isinstance(self.value, type):
                return isinstance(layer, self.value)
            return any(cls.__name__ == self.value for cls in type(layer).__mro__)
        if self.kind == "relu":
            return relu_form(layer) is not None
        return activation_name(getattr(layer, "activation", None)) == self.value


def _normalise_rules(rules) -> list[tuple[_Selector, list]]:
    if not isinstance(rules, dict) or not rules:
        raise GraphswapError(
            "override: rules must be a non-empty dict {selector: rule}, e.g. {'relu': 'guided'} "
            "or {'dense_1': gg.ClipByNorm(1.0)}")
    parsed = []
    for key, value in rules.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        if not values:
            raise GraphswapError(f"override: no rule given for {key!r}")
        parsed.append((_Selector(key), [get_rule(v) for v in values]))
    return parsed


def _relu_operations(model):
    """(model name, operation name) for keras.ops.relu-style operations in functional graphs."""
    found = []
    models = [model] + [layer for _, layer in iter_layers(model) if isinstance(layer, keras.Model)]
    for container in models:
        for operation in getattr(container, "operations", []):
            if not isinstance(operation, keras.layers.Layer) and \
                    type(operation).__name__ in RELU_OPERATIONS:
                found.append((container.name, operation.name))
    return found


def override(model, rules, strict: bool = False, return_report: bool = False):
    """Return a copy of `model` with the gradient rules attached (see the module docstring).

    Args:
      model: a built Sequential or Functional keras.Model (never modified); swapped models work.
      rules: {selector: rule or list of rules}.
      strict: raise RuleMatchError instead of warning about rules that match nothing and ReLUs
        that cannot be reached.
      return_report: also return an OverrideReport (what was touched, and the warnings).
    """
    parsed = _normalise_rules(rules)
    check_cloneable(model)
    plans: dict[int, tuple] = {}      # id(layer) -> (guided options or None, rules, detail)
    entries: list[OverrideEntry] = []
    problems: list[str] = []
    applied = {id(selector): False for selector, _ in parsed}
    hits = {id(selector): False for selector, _ in parsed}
    nested_hits: dict[int, list[str]] = {id(selector): [] for selector, _ in parsed}

    for path, layer in iter_layers(model):
        if isinstance(layer, keras.layers.InputLayer):
            continue
        if isinstance(layer, keras.Model):
            for selector, _ in parsed:
                if selector.kind == "name" and selector.matches(path, layer):
                    nested_hits[id(selector)].append(path)
            continue
        guided, layer_rules, notes = None, [], []
        form = relu_form(layer)
        for selector, selector_rules in parsed:
            if not selector.matches(path, layer):
                continue
            hits[id(selector)] = True
            for rule in selector_rules:
                if isinstance(rule, Guided):
                    if form is None:
                        notes.append(f"guided ({selector.label}): not a ReLU form")
                        continue
                    if form.kind == "unreachable":
                        problems.append(f"layer {path}: {form.reason}; guided backprop does not "
                                        f"reach it")
                        applied[id(selector)] = True  # reported above, not as "matched nothing"
                        continue
                    guided = form
                elif rule not in layer_rules:
                    layer_rules.append(rule)
                applied[id(selector)] = True
        layer_type = type(layer).__name__
        if guided is None and not layer_rules:
            reason = "; ".join(notes)
            if form is not None and form.kind == "unreachable":
                entries.append(OverrideEntry(path, layer_type, "skipped", form.reason))
            else:
                entries.append(OverrideEntry(path, layer_type, "kept", reason))
            continue
        details = []
        if guided is not None:
            options = {k: v for k, v in guided.options.items() if v not in (None, 0.0)}
            text = ", ".join(f"{k}={v:g}" for k, v in options.items())
            details.append(f"guided ReLU{f' ({text})' if text else ''}"
                           + (" split off the layer's activation" if guided.kind == "activation"
                              else ""))
        details += [rule.describe() for rule in layer_rules]
        plans[id(layer)] = (guided, layer_rules)
        entries.append(OverrideEntry(path, layer_type, "overridden", "; ".join(details)))

    for selector, selector_rules in parsed:
        if applied[id(selector)]:
            continue
        what = ("only layers without a ReLU form (guided needs one)" if hits[id(selector)]
                else "no layer")
        hint = ""
        if nested_hits[id(selector)]:
            hint = (f" ({', '.join(nested_hits[id(selector)])} is a nested model: rules act on "
                    f"layers; select its layers with '{nested_hits[id(selector)][0]}/*')")
        problems.append(f"rule {selector.key!r} ({selector.label}) matched {what} in model "
                        f"{model.name!r}{hint}; list the layers with 'graphswap inspect MODEL'")

    if any(isinstance(r, Guided) for _, rs in parsed for r in rs):
        for container, operation in _relu_operations(model):
            problems.append(
                f"operation {operation!r} in model {container!r} is keras.ops.relu (or relu6/"
                f"leaky_relu) called directly in a functional graph, which is not a layer: "
                f"override cannot reach it; build the model with keras.layers.ReLU() or "
                f"Activation('relu') instead")

    if problems and strict:
        raise RuleMatchError("override (strict): " + "; ".join(problems))
    for message in problems:
        warnings.warn(message, OverrideWarning, stacklevel=2)

    def replace(path, layer):
        plan = plans.get(id(layer))
        if plan is None:
            return None
        guided, layer_rules = plan
        common = {"name": layer.name, "dtype": layer.dtype_policy}
        if guided is not None and guided.kind == "layer":
            guided_layer = GuidedReLU(**guided.options, **common)
            return GradientOverride(guided_layer, layer_rules, **common) if layer_rules \
                else guided_layer
        config = layer.get_config()
        guided_options = None
        if guided is not None:
            config = {**config, "activation": "linear"}
            guided_options = guided.options
        inner = layer.__class__.from_config(config)
        return GradientOverride(inner, layer_rules, guided=guided_options, **common)

    new_model, _ = transform_model(model, replace)
    report = OverrideReport(model.name, entries, problems)
    return (new_model, report) if return_report else new_model

