"""`rewrite_model`: a copy of a model whose selected Dense/Conv2D layers run a kernel.

Selection: layer types, include/exclude regular expressions over names and nested paths, and a
kernel map {name, path or glob: kernel spec | None}.  Each kernel spec is resolved once, here, to
a Kernel (graphswap.kernels) and handed to the swapped layers.  The clone-and-replace machinery is
graphswap.swap.clone; the report is graphswap.swap.report.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import re

import keras

from graphswap.errors import GraphswapError, QuantizationError, UnsupportedLayerError
from graphswap.kernels import Kernel, QuantScheme, resolve_file_named, resolve_kernel
from graphswap.swap import ops
from graphswap.swap.calibration import (DEFAULT_CALIBRATION_METHOD, DEFAULT_CALIBRATION_SAMPLES,
                                        DEFAULT_CALIBRATION_SOURCE, calibration_inputs,
                                        check_method)
from graphswap.swap.compensation import COMPENSATION_METHODS, calibrate_and_compensate
from graphswap.swap.clone import iter_layers, transform_model
from graphswap.swap.folding import fold_batchnorm as fold_pairs
from graphswap.swap.layers import SwappedConv2D, SwappedDense, check_conv_options
from graphswap.swap.quantstate import legacy_scheme
from graphswap.swap.report import LayerReport, RewriteReport, layer_macs

SWAPPABLE_TYPES = {"Dense": keras.layers.Dense, "Conv2D": keras.layers.Conv2D}


def _as_patterns(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


def _matches(patterns: list[str], path: str, name: str) -> bool:
    for pattern in patterns:
        try:
            if re.search(pattern, name) or re.search(pattern, path):
                return True
        except re.error as exc:
            raise GraphswapError(f"invalid regular expression {pattern!r}: {exc}") from None
    return False


def _map_lookup(kernel_map: dict, path: str, name: str):
    """A kernel_map entry for this layer: exact name/path first, then glob patterns."""
    for key in (path, name):
        if key in kernel_map:
            return True, kernel_map[key]
    for key, value in kernel_map.items():
        if fnmatch.fnmatchcase(name, key) or fnmatch.fnmatchcase(path, key):
            return True, value
    return False, None


def load_kernel_map(source) -> dict:
    """A kernel map from a dict or a JSON file: {"layer name or glob": "kernel spec" | null}.

    A JSON file may also wrap it as {"kernel_map": {...}} (what `graphswap sweep` writes).
    """
    if isinstance(source, dict):
        mapping = source
    else:
        try:
            with open(source, encoding="utf-8") as handle:
                mapping = json.load(handle)
        except OSError as exc:
            raise GraphswapError(f"cannot read kernel map {source}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise GraphswapError(f"kernel map {source} is not valid JSON: {exc}") from None
    if isinstance(mapping, dict) and isinstance(mapping.get("kernel_map"), dict):
        mapping = mapping["kernel_map"]
    if not isinstance(mapping, dict) or not all(
            isinstance(k, str) and (v is None or isinstance(v, (str, dict, Kernel)))
            for k, v in mapping.items()):
        raise GraphswapError(
            'a kernel map must be a JSON object {"layer name or glob": "kernel spec" or null}')
    return mapping


def resolve_kernel_map(source) -> dict:
    """{"layer name or glob": Kernel | None} of a kernel map (see load_kernel_map).

    In a dict (the caller's own code) the specs are named by the user.  In a JSON file they are
    named by a file: built-ins, records, or file specs relative to the map's folder whose content
    is already trusted - a kernel map never adds trust (see graphswap.kernel_trust).
    """
    mapping = load_kernel_map(source)
    if isinstance(source, dict):
        return {key: None if spec is None else resolve_kernel(spec)
                for key, spec in mapping.items()}
    base_dir = os.path.dirname(os.path.abspath(source))
    return {key: None if spec is None else resolve_file_named(
                spec, base_dir, f"kernel map {source}, entry {key!r}")
            for key, spec in mapping.items()}


QUANTIZATION_PRESETS = ("default", "tfapprox")


def quantization_request(quantization, calibrated: bool):
    """scheme_for(kernel) -> the QuantScheme rewrite_model gives a multiplier layer running that
    kernel.  `quantization`: None or "default" (sign-magnitude weights for unsigned multipliers,
    symmetric for signed, per-channel), "tfapprox" (TFApprox: asymmetric per-tensor for unsigned
    multipliers; signed ones keep symmetric per-channel), a dict or a QuantScheme.  Activations
    are static exactly when calibration data is given (dynamic, per call, otherwise)."""
    if quantization is None or quantization == "default":
        base = QuantScheme()
    elif isinstance(quantization, str):
        if quantization not in QUANTIZATION_PRESETS:
            raise QuantizationError(f"unknown quantization preset {quantization!r}; allowed: "
                                    f"{', '.join(QUANTIZATION_PRESETS)}, a dict or a QuantScheme")
        base = None
    else:
        base = QuantScheme.from_config(quantization)
    if base is not None and base.activations == "static" and not calibrated \
            and base.activation_range is None:
        raise QuantizationError("static activations need calibration data: pass "
                                "calibration_data= (--calibrate DATA), or use dynamic activations")

    def scheme_for(kernel) -> QuantScheme:
        scheme = base if base is not None else legacy_scheme(bool(getattr(kernel, "signed", 0)))
        if calibrated:
            scheme = dataclasses.replace(scheme, activations="static", activation_range=None)
        return scheme

    return scheme_for


def rewrite_model(model, kernel="exact", include=None, exclude=None, kernel_map=None,
                  layer_types=("Dense", "Conv2D"), backward="native", return_report=False,
                  quantization=None, calibration_data=None,
                  calibration_samples=DEFAULT_CALIBRATION_SAMPLES,
                  calibration_method=DEFAULT_CALIBRATION_METHOD,
                  calibration_source=DEFAULT_CALIBRATION_SOURCE, bias_correction=None, recalibrate_bn=False,
                  fold_batchnorm=False):
    """Return a copy of `model` whose Dense/Conv2D forward passes run `kernel`.

    Args:
      model: a built Sequential or Functional keras.Model (never modified).
      kernel: kernel spec for every selected layer (see graphswap.kernels); None swaps only the
        layers named in `kernel_map`.
      include / exclude: regular expression(s) searched in each layer's name and nested path
        ("outer/inner/dense"); a layer is selected if it matches some include (or include is
        None) and no exclude.
      kernel_map: {layer name, path or glob: kernel spec, or None to keep the layer}, or a JSON
        file path; entries override `kernel` for the layers they name.
      layer_types: which of "Dense", "Conv2D" to swap.
      backward: "native" (TensorFlow's gradients, straight-through) or "kernel" (backward
        products through the kernel as well).
      return_report: also return a RewriteReport.
      quantization: how the 8-bit multiplier layers quantize - None (the defaults: sign-magnitude
        weights for unsigned multipliers, symmetric for signed, per-channel scales), "tfapprox"
        (asymmetric per-tensor, dynamic), a dict or a graphswap.kernels.QuantScheme.
      calibration_data: the model's inputs (an array, a list per input, or (x, y)); given, the
        multiplier layers get static activation ranges calibrated on its first
        `calibration_samples` examples (graphswap.swap.calibration: `calibration_method`
        "minmax" | "percentile" | "mse", `calibration_source` "float" | "approximate");
        without it activations are quantized per call ("dynamic", as TFApprox).
      bias_correction: with calibration data, also compensate each multiplier layer's product
        error per output channel: "mean" (mean-error) or "moments" (mean and spread;
        graphswap.swap.compensation).
      recalibrate_bn: with calibration data, also re-estimate the BatchNormalization statistics
        with the approximate forward (graphswap.swap.compensation).
      fold_batchnorm: fold each Dense/Conv2D + BatchNormalization pair first
        (graphswap.swap.folding); a model with no foldable pair gets a report note.

    Raises UnsupportedLayerError (naming the layer and option) for a selected layer whose options
    cannot be reproduced, and KernelSpecError for unknown kernels.
    """
    ops.check_backward_mode(backward)
    calibrated = calibration_data is not None
    scheme_for = quantization_request(quantization, calibrated)
    if calibrated:   # checked before any work is done
        check_method(calibration_method, calibration_source)
        calibration_inputs(model, calibration_data, calibration_samples)
    if recalibrate_bn and not calibrated:
        raise QuantizationError("BatchNorm re-estimation in rewrite_model runs on the calibration "
                                "data: pass calibration_data= (--calibrate DATA) as well")
    if bias_correction is not None:
        if bias_correction not in COMPENSATION_METHODS:
            raise QuantizationError(f"unknown bias compensation method {bias_correction!r}; "
                                    f"allowed: {', '.join(COMPENSATION_METHODS)}")
        if not calibrated:
            raise QuantizationError("bias compensation is estimated on calibration data: pass "
                                    "calibration_data= (--calibrate DATA) as well")

    def layer_scheme(kernel) -> dict:
        scheme = scheme_for(kernel)   # static ones are created dynamic, calibrated after the clone
        return (scheme.dynamic() if scheme.activation_range is None else scheme).to_config()
    notes = []
    source_model = model
    if fold_batchnorm:
        source_model, fold_report = fold_pairs(model)
        notes.extend(fold_report.lines())
    include_patterns = _as_patterns(include)
    exclude_patterns = _as_patterns(exclude)
    mapping = resolve_kernel_map(kernel_map) if kernel_map is not None else {}
    unknown_types = [t for t in layer_types if t not in SWAPPABLE_TYPES]
    if unknown_types:
        raise GraphswapError(
            f"unknown layer type(s) {unknown_types}; allowed: {sorted(SWAPPABLE_TYPES)}")
    selected_types = tuple(SWAPPABLE_TYPES[t] for t in layer_types)
    if kernel is not None:
        kernel = resolve_kernel(kernel)  # resolved once, here: a bad spec fails before cloning
    entries: list[LayerReport] = []

    def decide(path, layer):
        """(spec or None, reason) for one layer."""
        if isinstance(layer, keras.Model):
            return None, "nested model (its layers are listed below)"
        if not isinstance(layer, (keras.layers.Dense, keras.layers.Conv2D)):
            return None, ""
        if type(layer) not in (keras.layers.Dense, keras.layers.Conv2D):
            if isinstance(layer, (SwappedDense, SwappedConv2D)):
                return None, f"already swapped ({layer.arithmetic.spec})"
            return None, f"subclass {type(layer).__name__} of a swappable layer: not swapped"
        found, spec = _map_lookup(mapping, path, layer.name)
        if found:
            return spec, "kernel map" if spec is not None else "kernel map: keep"
        if not isinstance(layer, selected_types):
            return None, "layer type not selected"
        if include_patterns and not _matches(include_patterns, path, layer.name):
            return None, "not matched by include"
        if exclude_patterns and _matches(exclude_patterns, path, layer.name):
            return None, "matched by exclude"
        if kernel is None:
            return None, "not in kernel map"
        return kernel, ""

    def replace(path, layer):
        spec, reason = decide(path, layer)
        macs = layer_macs(layer) if isinstance(layer, (keras.layers.Dense,
                                                       keras.layers.Conv2D)) else 0
        if spec is None:
            entries.append(LayerReport(path, type(layer).__name__, "kept", reason, "", macs))
            return None
        config = layer.get_config()
        if isinstance(layer, keras.layers.Conv2D):
            check_conv_options(layer)
            new_layer = SwappedConv2D.from_config({**config, "arithmetic": spec,
                                                   "backward": backward,
                                                   "quantization": layer_scheme(spec)})
        else:
            if getattr(layer, "quantization_mode", None):
                raise UnsupportedLayerError(
                    f"layer {layer.name!r}: Keras-quantized Dense ({layer.quantization_mode}) "
                    f"cannot be swapped; swap the float model instead")
            new_layer = SwappedDense.from_config({**config, "arithmetic": spec,
                                                  "backward": backward,
                                                  "quantization": layer_scheme(spec)})
        entries.append(LayerReport(path, type(layer).__name__, "swapped", reason, spec.spec,
                                   macs))
        return new_layer

    new_model, _ = transform_model(source_model, replace)
    unmatched = [key for key in mapping
                 if not any(e.path == key or e.path.split("/")[-1] == key
                            or fnmatch.fnmatchcase(e.path.split("/")[-1], key)
                            or fnmatch.fnmatchcase(e.path, key) for e in entries)]
    if unmatched:
        raise GraphswapError(
            f"kernel map names layer(s) not in model {model.name!r}: {', '.join(unmatched)}; "
            f"list the layers with 'graphswap inspect MODEL'")
    quantizing = [layer for _, layer in iter_layers(new_model)
                  if getattr(layer, "quantization", None) is not None]
    if quantizing:
        described = sorted({scheme_for(layer.arithmetic).resolve(layer.arithmetic.signed)
                            .describe() for layer in quantizing})
        notes.append(f"quantization: {'; '.join(described)}")
        if calibrated:
            notes.extend(calibrate_and_compensate(
                new_model, calibration_data, samples=calibration_samples,
                method=calibration_method, source=calibration_source,
                bias_correction=bias_correction, recalibrate_bn=recalibrate_bn))
    elif calibrated:
        notes.append("calibration data given, but no swapped layer quantizes (no 8-bit "
                     "multiplier kernel): nothing calibrated")
    report = RewriteReport(model.name, entries, notes)
    return (new_model, report) if return_report else new_model


def plan(model, **kwargs) -> RewriteReport:
    """What rewrite_model would do, without keeping the rewritten model."""
    _, report = rewrite_model(model, return_report=True, **kwargs)
    return report
