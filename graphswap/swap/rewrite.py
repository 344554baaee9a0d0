"""`rewrite_model`: a copy of a model whose selected layers (every type in
graphswap.swap.catalog.LAYER_TYPES) run a kernel.

The route of a kernel spec, in reading order: LayerSelection.from_arguments resolves it once to a
Kernel (graphswap.swap.selection, graphswap.kernels); LayerSwapper.replace gives each selected
layer that Kernel and its QuantScheme; catalog.swapped_from builds the swapped layer, whose call
runs the Kernel's ops (graphswap.swap.ops -> graphswap.native).  The clone-and-replace machinery
is graphswap.swap.clone; the report is graphswap.swap.report.
"""

from __future__ import annotations

import keras
import numpy as np

from graphswap.errors import GraphswapError
from graphswap.swap import ops
from graphswap.swap.calibration import (DEFAULT_CALIBRATION_METHOD, DEFAULT_CALIBRATION_SAMPLES,
                                        DEFAULT_CALIBRATION_SOURCE, calibration_inputs,
                                        check_method, product_layers)
from graphswap.swap.catalog import float_wrapper_reason, swapped_from
from graphswap.swap.clone import copy_compile_config, transform_model
from graphswap.swap.compensation import calibrate_and_compensate
from graphswap.swap.recipe import (DEFAULT_RECIPE, QuantizationRequest, fallback_wanted,
                                   has_batchnorm, operands_default, quantization_request,
                                   recipe_defaults, recipe_note)
from graphswap.swap.fallback import choose_conversion
from graphswap.swap.folding import fold_batchnorm as fold_pairs
from graphswap.swap.selection import LayerSelection
from graphswap.swap.kinds.counting import layer_macs
from graphswap.swap.kinds.multi_head_attention import attention_macs
from graphswap.swap.report import LayerReport, RewriteReport, assumed_length, quantization_line
from graphswap.swap.subclassed import (copy_custom_layer, copy_subclassed, held_layers,
                                       is_custom_container, is_custom_layer, is_subclassed,
                                       layer_paths, mark_swapped, own_weights, swap_layers)


def rewrite_model(model, kernel="exact", include=None, exclude=None, kernel_map=None,
                  layer_types=None, backward="native", return_report=False, inplace=False,
                  quantization=None, calibration_data=None,
                  calibration_samples=DEFAULT_CALIBRATION_SAMPLES,
                  calibration_method=DEFAULT_CALIBRATION_METHOD,
                  calibration_source=DEFAULT_CALIBRATION_SOURCE, bias_correction=DEFAULT_RECIPE,
                  recalibrate_bn=DEFAULT_RECIPE, fold_batchnorm=False,
                  weight_tuning=DEFAULT_RECIPE, operands=DEFAULT_RECIPE,
                  dynamic_fallback=DEFAULT_RECIPE):
    """Return a copy of `model` whose selected layers' forward products run `kernel`.

    Args:
      model: a built keras.Model: Sequential or Functional (never modified), or subclassed
        (class Net(keras.Model) holding its layers as attributes, lists, dicts, nested layers
        and models): its layers are swapped on a copy made through the class's
        get_config/from_config, or - only with inplace=True - on `model` itself.
      kernel: kernel spec for every selected layer (see graphswap.kernels); None swaps only the
        layers named in `kernel_map`.
      include / exclude: regular expression(s) searched in each layer's name and nested path
        ("outer/inner/dense"); a layer is selected if it matches some include (or include is
        None) and no exclude.
      kernel_map: {layer name, path or glob: kernel spec, or None to keep the layer}, or a JSON
        file path; entries override `kernel` for the layers they name.
      layer_types: which of graphswap.swap.LAYER_TYPES to swap (e.g. ("Dense", "Conv2D"));
        None (the default) swaps every one of them.
      backward: "native" (TensorFlow's gradients, straight-through) or "kernel" (backward
        products through the kernel as well).
      return_report: also return a RewriteReport.
      inplace: subclassed models only: swap the layers of `model` itself (for a class that
        cannot be copied through get_config/from_config); `model` is changed and returned.
      quantization: how the 8-bit multiplier layers quantize - None (the defaults: sign-magnitude
        weights for unsigned multipliers, symmetric for signed, per-channel scales), "tfapprox"
        (asymmetric per-tensor, dynamic), a dict or a graphswap.kernels.QuantScheme.
      calibration_data: the model's inputs (an array, a list per input, or (x, y)); given, the
        multiplier layers get static activation ranges calibrated on its first
        `calibration_samples` examples (graphswap.swap.calibration: `calibration_method`
        "minmax" | "percentile" | "mse" | "entropy" | "output" (default), `calibration_source`
        "float" | "approximate");
        without it activations are quantized per call ("dynamic", as TFApprox).  Static ranges
        are for every swapped type: SeparableConv2D has a second range for its pointwise
        operand, MultiHeadAttention one per projection.
      bias_correction: with calibration data, also compensate each multiplier layer's product
        error per output channel: "mean" (mean-error) or "moments" (mean and spread;
        graphswap.swap.compensation); None/"none": none; "default": graphswap.swap.recipe.
      recalibrate_bn: with calibration data, also re-estimate the BatchNormalization statistics
        with the approximate forward (graphswap.swap.compensation); "default": whenever the
        model (after any folding) still has BatchNormalization layers (graphswap.swap.recipe).
      fold_batchnorm: fold each Dense/Conv2D + BatchNormalization pair first
        (graphswap.swap.folding); a model with no foldable pair gets a report note.
      weight_tuning: with calibration data, also tune each multiplier layer's stored weight
        codes to its multiplier (graphswap.swap.weight_tuning), before bias compensation.
      operands: which multiplier input the weights feed: "activation_first" (activations on
        operand A), "weight_first", or "auto" - measured per layer on the calibration data
        (graphswap.swap.wiring); "default": auto with calibration data, else the scheme's.
      dynamic_fallback: with calibration data, also build the dynamic conversion and keep it
        when it is closer to the original on that data (graphswap.swap.fallback, which also
        measures weight tuning left at "default"); "default": True, but for static
        `quantization` and inplace=True.

    Raises UnsupportedLayerError (naming the layer and option) for a selected layer whose options
    cannot be reproduced, and KernelSpecError for unknown kernels.
    """
    arguments = dict(locals())   # the call, for the alternatives the zero-step check builds
    ops.check_backward_mode(backward)
    calibrated = calibration_data is not None
    bn_by_default = isinstance(recalibrate_bn, str) and recalibrate_bn == DEFAULT_RECIPE
    # left at its default, weight tuning is measured: with and without, the closer one kept
    tuning_measured = calibrated and not inplace and isinstance(weight_tuning, str) and \
        weight_tuning == DEFAULT_RECIPE
    bias_correction, weight_tuning, recalibrate_bn = recipe_defaults(
        bias_correction, weight_tuning, calibrated, recalibrate_bn, has_batchnorm(model))
    operands = operands_default(operands, calibrated)
    fallback = calibrated and fallback_wanted(dynamic_fallback, quantization, inplace)
    request = quantization_request(quantization, calibrated,
                                   None if operands == "auto" else operands)
    if calibrated:   # checked before any work is done
        check_method(calibration_method, calibration_source)
        calibration_inputs(model, calibration_data, calibration_samples)

    notes = []
    source_model = model
    if fold_batchnorm:
        source_model, fold_report = fold_pairs(model)
        notes.extend(fold_report.lines())
        if bn_by_default:   # re-estimated by default only where a BatchNorm is left unfolded
            recalibrate_bn = recalibrate_bn and has_batchnorm(source_model)
    selection = LayerSelection.from_arguments(kernel, include, exclude, kernel_map, layer_types)
    swapper = LayerSwapper(selection, backward, request,
                           enter_custom_layers=not is_subclassed(source_model))
    if is_subclassed(source_model):
        new_model = _rewrite_subclassed(source_model, swapper.replace, inplace, notes)
    else:
        if inplace:
            raise GraphswapError(
                f"inplace=True is for subclassed models; {model.name!r} is a "
                f"{type(model).__name__} model, which rewrite_model copies (never modifies)")
        new_model, _ = transform_model(source_model, swapper.replace)
    entries = swapper.entries
    unmatched = selection.unmatched_map_keys(e.path for e in entries)
    if unmatched:
        raise GraphswapError(
            f"kernel map names layer(s) not in model {model.name!r}: {', '.join(unmatched)}; "
            f"list the layers with 'graphswap inspect MODEL'")
    # attention: its projections, which hold its quantization state
    quantizing = [layer for _, layer in product_layers(new_model)
                  if getattr(layer, "quantization", None) is not None]
    if quantizing:
        calibration_notes = calibrate_and_compensate(
            new_model, calibration_data, samples=calibration_samples, method=calibration_method,
            source=calibration_source, bias_correction=bias_correction,
            recalibrate_bn=recalibrate_bn, weight_tuning=weight_tuning,
            operands=operands) if calibrated else []
        # each layer's own scheme, once calibrated (already swapped layers keep theirs); the
        # ranges are listed by the calibration note
        described = sorted({quantization_line(layer) for layer in quantizing})
        notes.append(f"quantization: {'; '.join(described)}")
        if calibrated:
            notes.append(recipe_note(bias_correction, weight_tuning, recalibrate_bn,
                                     fold_batchnorm))
        notes.extend(calibration_notes)
        alternatives = []
        if tuning_measured and not weight_tuning and any(
                hasattr(layer.arithmetic, "multiplier") for layer in quantizing):
            alternatives.append(("calibrated + weight tuning", lambda: rewrite_model(**{
                **arguments, "weight_tuning": True, "dynamic_fallback": False,
                "return_report": True})))
        if fallback:
            alternatives.append(("dynamic", lambda: rewrite_model(**{
                **arguments, "calibration_data": None, "bias_correction": DEFAULT_RECIPE,
                "recalibrate_bn": DEFAULT_RECIPE, "weight_tuning": DEFAULT_RECIPE,
                "return_report": True, "operands": DEFAULT_RECIPE if operands == "auto"
                else arguments["operands"]})))
        if alternatives:
            new_model, entries, notes = choose_conversion(
                model, (new_model, entries, notes), alternatives,
                calibration_inputs(model, calibration_data, 1 << 62), calibration_samples)
    elif calibrated:
        notes.append("calibration data given, but no swapped layer quantizes (no 8-bit "
                     "multiplier kernel): nothing calibrated")
    report = RewriteReport(model.name, entries, notes)
    return (new_model, report) if return_report else new_model


class LayerSwapper:
    """transform_model's `replace(path, layer)` for one rewrite: each layer's Kernel from the
    selection, its QuantScheme from the QuantizationRequest (graphswap.swap.recipe), the swapped
    layer from graphswap.swap.catalog.swapped_from; one report entry per layer seen
    (`entries`).  A custom layer of a functional model is entered: the layers it holds are
    swapped on a copy of it."""

    def __init__(self, selection: LayerSelection, backward: str, request: QuantizationRequest,
                 enter_custom_layers: bool):
        self.selection, self.backward, self.request = selection, backward, request
        self.enter_custom_layers = enter_custom_layers
        self.entries: list[LayerReport] = []

    def layer_quantization(self, kernel) -> dict:
        """The QuantScheme config a layer running `kernel` is created with: a static scheme is
        created dynamic and calibrated after the clone."""
        scheme = self.request.scheme_for(kernel)
        return (scheme.dynamic() if scheme.activation_range is None else scheme).to_config()

    def replace(self, path, layer):
        kernel, reason = self.selection.decide(path, layer)
        if kernel is None and not reason and self.enter_custom_layers \
                and is_custom_container(layer):
            return self.enter_custom_layer(path, layer)
        entry = describe(path, layer, "kept", reason)
        self.entries.append(entry)
        if kernel is None:
            return None
        new_layer = swapped_from(layer, kernel, self.backward, self.layer_quantization(kernel))
        entry.action, entry.kernel = "swapped", kernel.spec
        return new_layer

    def enter_custom_layer(self, path, layer):
        """A swapped copy of a custom layer of a functional model (None: keep it as it is)."""
        entry = describe(path, layer, "kept", "custom layer")
        self.entries.append(entry)
        before = len(self.entries)
        try:
            copy = copy_custom_layer(layer)
            swaps = swap_layers(copy, built_replacement(self.replace), prefix=path + "/",
                                paths=layer_paths(layer, path + "/"))
        except GraphswapError as exc:
            del self.entries[before:]
            self.entries.extend(
                describe(f"{path}/{inner_path}", inner, "kept",
                         f"inside custom layer {layer.name!r}, not entered: {exc}")
                for inner_path, inner in inner_layers(layer))
            entry.reason = f"custom layer, not entered: {exc}"
            return None
        if not swaps:
            entry.reason = "custom layer: no layer inside it swapped"
            return None
        mark_swapped(copy, swaps)
        swapped_inside = sum(1 for e in self.entries[before:] if e.action == "swapped")
        entry.reason = f"custom layer: {swapped_inside} layer(s) inside swapped (listed below)"
        return copy


def inner_layers(layer, prefix: str = ""):
    """(path below `layer`, layer) of every layer a layer holds, at any depth."""
    for _, inner in held_layers(layer):
        yield f"{prefix}{inner.name}", inner
        if not isinstance(inner, keras.Model) or is_subclassed(inner):
            yield from inner_layers(inner, f"{prefix}{inner.name}/")


def built_replacement(replace):
    """`replace(path, layer)` for layers held as attributes (swap_layers): the replacement comes
    built, with the layer's weights; a nested Sequential/Functional model is a rewritten copy
    (None when nothing in it was swapped)."""
    def replace_built(path, layer):
        if isinstance(layer, keras.Model) and not is_subclassed(layer):
            swapped = []

            def counting(inner_path, inner):
                new = replace(inner_path, inner)
                if new is not None:
                    swapped.append(inner_path)
                return new

            new_nested, _ = transform_model(layer, counting, prefix=path + "/")
            return new_nested if swapped else None
        new = replace(path, layer)
        if new is not None and layer.built and not new.built:
            new.build(**layer._build_shapes_dict)  # the shapes the stock layer was built with
            new.set_weights(layer.get_weights())
        return new

    return replace_built


def _rewrite_subclassed(model, replace, inplace, notes):
    """Swap the held layers of a subclassed model (graphswap.swap.subclassed), on a copy or -
    inplace - on the model itself; nested Sequential/Functional models are rewritten copies."""
    target = model if inplace else copy_subclassed(model)
    paths = layer_paths(model)  # the original's names (a copy's layers get fresh ones)
    swaps = swap_layers(target, built_replacement(replace), paths=paths)
    if swaps:
        mark_swapped(target, swaps)
    if inplace:
        notes.append(f"subclassed model {model.name!r}: swapped IN PLACE (inplace=True) - the "
                     f"model passed in now runs the kernels; it was not copied")
    else:
        copy_compile_config(model, target)
        notes.append(f"subclassed model {model.name!r}: swapped on a copy made through "
                     f"{type(model).__name__}.get_config/from_config")
    return target


def describe(path, layer, action, reason="") -> LayerReport:
    """A report line for `layer`, with its weight MACs (and attention-score MACs)."""
    float_macs = 0
    if isinstance(layer, keras.layers.MultiHeadAttention) and layer.built:
        float_macs = attention_macs(layer)[1]
    if not reason and isinstance(layer, keras.layers.TimeDistributed) and layer.weights:
        reason = float_wrapper_reason(layer)
    if not reason and is_custom_layer(layer) and own_weights(layer):
        count = sum(int(np.prod(w.shape)) for w in own_weights(layer))
        reason = (f"custom layer computing with {count:,} weight value(s) of its own: graphswap "
                  f"cannot see its products (float, not counted)")
    return LayerReport(path, type(layer).__name__, action, reason, "", layer_macs(layer),
                       float_macs, assumed_length(layer))


def plan(model, **kwargs) -> RewriteReport:
    """What rewrite_model would do, without keeping the rewritten model."""
    _, report = rewrite_model(model, return_report=True, **kwargs)
    return report
