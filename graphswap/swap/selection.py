"""Which layers rewrite_model swaps, and with which kernel: `LayerSelection` answers for one
layer (path, layer) -> (Kernel or None, why not), from the layer types, the include/exclude
regular expressions over names and nested paths, and a kernel map
{name, path or glob: kernel spec | None} (a dict or a JSON file, resolved here to Kernels).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import re

import keras

from graphswap.errors import GraphswapError
from graphswap.input_files import load_json, read_regular
from graphswap.kernels import Kernel, resolve_file_named, resolve_kernel
from graphswap.swap.catalog import (LAYER_TYPES, SWAPPABLE_TYPES, is_swappable_family, is_swapped,
                                    refusal, type_name)


@dataclasses.dataclass
class LayerSelection:
    """The user's choice of layers and kernels, every spec already resolved to a Kernel (a bad
    spec fails before any cloning).  `kernel`: for every selected layer (None: only the kernel
    map's layers); `kernel_map`: {name, path or glob: Kernel | None}."""
    kernel: Kernel | None
    kernel_map: dict
    layer_types: tuple[str, ...]
    include: list[str]
    exclude: list[str]

    @classmethod
    def from_arguments(cls, kernel, include=None, exclude=None, kernel_map=None,
                       layer_types=None) -> "LayerSelection":
        include, exclude = _as_patterns(include), _as_patterns(exclude)
        mapping = resolve_kernel_map(kernel_map) if kernel_map is not None else {}
        layer_types = check_layer_types(layer_types)
        kernel = None if kernel is None else resolve_kernel(kernel)
        return cls(kernel, mapping, layer_types, include, exclude)

    def decide(self, path: str, layer) -> tuple[Kernel | None, str]:
        """(the Kernel this layer gets or None, the reason it gets none - "" when it is simply
        not a swappable layer)."""
        if isinstance(layer, keras.Model):
            return None, "nested model (its layers are listed below)"
        if not is_swappable_family(layer):
            return None, ""
        if is_swapped(layer):
            return None, f"already swapped ({layer.arithmetic.spec})"
        if type_name(layer) is None:
            return None, f"subclass {type(layer).__name__} of a swappable layer: not swapped"
        why_not = refusal(layer)
        if why_not:
            return None, f"not swappable: {why_not}"
        found, spec = _map_lookup(self.kernel_map, path, layer.name)
        if found:
            return spec, "kernel map" if spec is not None else "kernel map: keep"
        if type_name(layer) not in self.layer_types:
            return None, "layer type not selected"
        if self.include and not _matches(self.include, path, layer.name):
            return None, "not matched by include"
        if self.exclude and _matches(self.exclude, path, layer.name):
            return None, "matched by exclude"
        if self.kernel is None:
            return None, "not in kernel map"
        return self.kernel, ""

    def unmatched_map_keys(self, paths) -> list[str]:
        """The kernel map's keys that name none of the layer `paths` seen."""
        paths = list(paths)
        return [key for key in self.kernel_map
                if not any(path == key or path.split("/")[-1] == key
                           or fnmatch.fnmatchcase(path.split("/")[-1], key)
                           or fnmatch.fnmatchcase(path, key) for path in paths)]


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
        try:  # a FIFO, a device: refused unread; JSON nested deeper than a map: refused unparsed
            text = read_regular(path, "kernel map", limit=256 << 20).decode("utf-8")
            mapping = load_json(text, f"the kernel map {path}")
        except json.JSONDecodeError as exc:
            raise GraphswapError(f"kernel map {path} is not valid JSON: {exc}") from None
        except UnicodeDecodeError as exc:
            raise GraphswapError(
                f"kernel map {path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at "
                f"offset {exc.start}; a file saved as Latin-1 or another legacy encoding?); JSON "
                f"is UTF-8: save it again as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
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


def check_layer_types(layer_types) -> tuple[str, ...]:
    """The selected type names (None: all of LAYER_TYPES); GraphswapError for unknown names."""
    if layer_types is None:
        return LAYER_TYPES
    if isinstance(layer_types, str):
        layer_types = (layer_types,)
    unknown = [t for t in layer_types if t not in SWAPPABLE_TYPES]
    if unknown:
        raise GraphswapError(
            f"unknown layer type(s) {', '.join(map(repr, unknown))}; allowed: "
            f"{', '.join(LAYER_TYPES)}")
    return tuple(layer_types)
