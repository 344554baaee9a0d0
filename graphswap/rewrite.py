"""Model surgery: clone a Keras model, replacing selected layers, and report what happened.

`transform_model` is the generic machinery (also used by graphswap.gradients.override): it clones
Sequential and Functional models - nested models at any depth, shared layers (cloned once, still
shared), multi-input/multi-output graphs - through keras.models.clone_model(recursive=True), lets a
callback replace any layer, then copies every original layer's weights into its clone 1:1.  The
input model is never modified.

`rewrite_model` uses it to swap Dense/Conv2D layers for SwappedDense/SwappedConv2D.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import json
import os
import re
import warnings
from typing import Callable

import keras
import numpy as np

from graphswap.errors import GraphswapError, UnsupportedLayerError
from graphswap.kernels import Kernel, resolve_file_named, resolve_kernel
from graphswap.layers import SwappedConv2D, SwappedDense, check_conv_options
from graphswap.tables import format_table
from graphswap import ops


@dataclasses.dataclass
class LayerReport:
    """One line of a rewrite report."""

    path: str            # "outer_model/inner_model/dense_1"
    layer_type: str      # class name of the original layer
    action: str          # "swapped", "kept" or a transform-specific verb
    reason: str = ""     # why it was kept / what was done
    kernel: str = ""     # kernel spec, for swapped layers
    macs: int = 0        # multiply-accumulates per sample (Dense/Conv2D), 0 if unknown

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class RewriteReport:
    model_name: str
    layers: list[LayerReport]

    @property
    def swapped(self) -> list[LayerReport]:
        return [entry for entry in self.layers if entry.action == "swapped"]

    def to_dict(self) -> dict:
        return {"model": self.model_name,
                "swapped": len(self.swapped),
                "layers": [entry.to_dict() for entry in self.layers]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def format_table(self) -> str:
        headers = ("layer", "type", "action", "kernel", "MACs/sample", "note")
        rows = [(e.path, e.layer_type, e.action, e.kernel, f"{e.macs:,}" if e.macs else "",
                 e.reason) for e in self.layers]
        out = format_table(headers, rows)
        total = sum(e.macs for e in self.swapped)
        out.append(f"{len(self.swapped)} of {sum(1 for e in self.layers if e.macs)} Dense/Conv2D "
                   f"layers swapped, {total:,} swapped MACs per sample")
        return "\n".join(out)


def _check_cloneable(model) -> None:
    if not isinstance(model, keras.Model):
        raise GraphswapError(f"expected a keras.Model, got {type(model).__name__}")
    if not isinstance(model, (keras.Sequential,)) and not _is_functional(model):
        raise UnsupportedLayerError(
            f"model {model.name!r} is a subclassed model ({type(model).__name__}); graphswap can "
            f"rewrite Sequential and Functional models only, because a subclassed model's call() "
            f"is Python code it cannot rewire. Rebuild it functionally (keras.Input + layer calls), "
            f"or use SwappedDense/SwappedConv2D directly in its __init__")


def _is_functional(model) -> bool:
    from keras.src.models.functional import Functional

    return isinstance(model, Functional)


def iter_layers(model, prefix: str = ""):
    """Yield (path, layer) for every leaf layer, depth first, each shared layer once."""
    seen = set()

    def walk(container, prefix):
        for layer in container.layers:
            if id(layer) in seen:
                continue
            seen.add(id(layer))
            path = f"{prefix}{layer.name}"
            if isinstance(layer, keras.Model) and (isinstance(layer, keras.Sequential)
                                                   or _is_functional(layer)):
                yield path, layer
                yield from walk(layer, path + "/")
            else:
                yield path, layer

    yield from walk(model, prefix)


def layer_macs(layer) -> int:
    """Multiply-accumulates per sample of a Dense or Conv2D layer (0 if not built/unknown)."""
    try:
        input_shape = layer.input.shape if not isinstance(layer.input, list) else None
    except (AttributeError, ValueError):
        input_shape = None
    if input_shape is None:
        try:
            input_shape = layer._build_shapes_dict and next(iter(layer._build_shapes_dict.values()))
        except (AttributeError, StopIteration, TypeError):
            input_shape = None
    if not input_shape:
        return 0
    if isinstance(layer, keras.layers.Dense):
        positions = int(np.prod([d for d in input_shape[1:-1]] or [1]))
        return positions * int(input_shape[-1]) * int(layer.units)
    if isinstance(layer, keras.layers.Conv2D):
        if not layer.built:
            return 0
        output_shape = layer.compute_output_shape(input_shape)
        if layer.data_format == "channels_first":
            out_h, out_w = output_shape[2], output_shape[3]
            in_c = input_shape[1]
        else:
            out_h, out_w = output_shape[1], output_shape[2]
            in_c = input_shape[3]
        kh, kw = layer.kernel_size
        if None in (out_h, out_w, in_c):
            return 0
        return int(out_h * out_w * layer.filters * kh * kw * (in_c // layer.groups))
    return 0


def transform_model(model, replace: Callable, name_suffix: str = ""):
    """Clone `model`, letting `replace(path, layer)` return a new layer (or None to clone as is).

    Returns (new_model, {id(original_layer): new_layer}).  Weights of every layer are copied from
    the original; a replacement layer must have the same weights layout as the layer it replaces.
    """
    _check_cloneable(model)
    paths = {id(layer): path for path, layer in iter_layers(model)}
    pairs: list[tuple] = []

    def clone_function(layer):
        path = paths.get(id(layer), layer.name)
        new_layer = replace(path, layer)
        if new_layer is None:
            new_layer = layer.__class__.from_config(layer.get_config())
        pairs.append((layer, new_layer))
        return new_layer

    # The model is already in memory (whoever loaded it decided whether to trust its Lambda
    # layers); cloning it must not trip Keras' safe mode a second time.
    with _unsafe_clone_scope():
        new_model = keras.models.clone_model(model, clone_function=clone_function, recursive=True)
    for original, clone in pairs:
        if not isinstance(original, keras.layers.Layer):
            continue  # a keras.ops call in a functional graph (e.g. ops.relu): no weights
        weights = original.get_weights()
        if weights:
            if not clone.built:
                raise GraphswapError(
                    f"layer {original.name!r} was not built in the clone; is the model built?")
            clone.set_weights(weights)
    _copy_compile_config(model, new_model)
    return new_model, {id(original): clone for original, clone in pairs}


def _unsafe_clone_scope():
    try:
        from keras.src.saving.serialization_lib import SafeModeScope
    except ImportError:  # pragma: no cover - Keras moved it; cloning Lambdas then needs the flag
        return contextlib.nullcontext()
    return SafeModeScope(False)


def _copy_compile_config(model, new_model) -> None:
    """Carry loss/metrics/optimizer settings over (not optimizer state), when the model has them."""
    if not getattr(model, "compiled", False) or getattr(new_model, "compiled", False):
        return
    try:
        config = model.get_compile_config()
        if config:
            new_model.compile_from_config(config)
    except Exception as exc:  # noqa: BLE001 - a model without compile info still rewrites
        warnings.warn(f"could not carry the compile settings over to the rewritten model: {exc}")


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
