"""`rewrite_model`: a copy of a model whose selected Dense/Conv2D layers run a kernel.

Selection: layer types, include/exclude regular expressions over names and nested paths, and a
kernel map {name, path or glob: kernel spec | None}.  Each kernel spec is resolved once, here, to
a Kernel (graphswap.kernels) and handed to the swapped layers.  The clone-and-replace machinery is
graphswap.swap.clone; the report is graphswap.swap.report.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re

import keras

from graphswap.errors import GraphswapError, UnsupportedLayerError
from graphswap.kernels import Kernel, resolve_file_named, resolve_kernel
from graphswap.swap import ops
from graphswap.swap.clone import transform_model
from graphswap.swap.layers import SwappedConv2D, SwappedDense, check_conv_options
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


def split_map_source(source):
    """(file path, front index or None) of a kernel map source "PATH" or "PATH#INDEX"."""
    text = os.fspath(source)
    path, hash_sign, index = text.rpartition("#")
    if hash_sign and index.isdigit() and not os.path.exists(text):
        return path, int(index)
    return text, None


def load_kernel_map(source) -> dict:
    """A kernel map from a dict or a JSON file: {"layer name or glob": "kernel spec" | null}.

    A JSON file may also wrap it as {"kernel_map": {...}} (what `graphswap sweep` writes), or be
    an exploration front {"front": [{"kernel_map": {...}}, ...]} (what `graphswap explore`
    writes), from which "PATH#INDEX" picks one point.
    """
    if isinstance(source, dict):
        mapping = source
    else:
        path, index = split_map_source(source)
        try:
            with open(path, encoding="utf-8") as handle:
                mapping = json.load(handle)
        except OSError as exc:
            raise GraphswapError(f"cannot read kernel map {path}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise GraphswapError(f"kernel map {path} is not valid JSON: {exc}") from None
        front = mapping.get("front") if isinstance(mapping, dict) else None
        if isinstance(front, list):
            if index is None:
                raise GraphswapError(
                    f"{path} is an exploration front of {len(front)} kernel maps; pick one with "
                    f"{path}#INDEX (0..{len(front) - 1})")
            if not 0 <= index < len(front) or not isinstance(front[index], dict):
                raise GraphswapError(f"{path} has front points 0..{len(front) - 1}, not {index}")
            mapping = front[index]
        elif index is not None:
            raise GraphswapError(f"{path} is a single kernel map; #{index} selects a point of an "
                                 f"exploration front only")
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
    base_dir = os.path.dirname(os.path.abspath(split_map_source(source)[0]))
    return {key: None if spec is None else resolve_file_named(
                spec, base_dir, f"kernel map {source}, entry {key!r}")
            for key, spec in mapping.items()}


def rewrite_model(model, kernel="exact", include=None, exclude=None, kernel_map=None,
                  layer_types=("Dense", "Conv2D"), backward="native", return_report=False):
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

    Raises UnsupportedLayerError (naming the layer and option) for a selected layer whose options
    cannot be reproduced, and KernelSpecError for unknown kernels.
    """
    ops.check_backward_mode(backward)
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
                                                   "backward": backward})
        else:
            if getattr(layer, "quantization_mode", None):
                raise UnsupportedLayerError(
                    f"layer {layer.name!r}: Keras-quantized Dense ({layer.quantization_mode}) "
                    f"cannot be swapped; swap the float model instead")
            new_layer = SwappedDense.from_config({**config, "arithmetic": spec,
                                                  "backward": backward})
        entries.append(LayerReport(path, type(layer).__name__, "swapped", reason, spec.spec,
                                   macs))
        return new_layer

    new_model, _ = transform_model(model, replace)
    unmatched = [key for key in mapping
                 if not any(e.path == key or e.path.split("/")[-1] == key
                            or fnmatch.fnmatchcase(e.path.split("/")[-1], key)
                            or fnmatch.fnmatchcase(e.path, key) for e in entries)]
    if unmatched:
        raise GraphswapError(
            f"kernel map names layer(s) not in model {model.name!r}: {', '.join(unmatched)}; "
            f"list the layers with 'graphswap inspect MODEL'")
    report = RewriteReport(model.name, entries)
    return (new_model, report) if return_report else new_model


def plan(model, **kwargs) -> RewriteReport:
    """What rewrite_model would do, without keeping the rewritten model."""
    _, report = rewrite_model(model, return_report=True, **kwargs)
    return report

