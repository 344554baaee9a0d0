"""Layer state that is not a weight, carried from a layer to its clone and checked there.

A layer cloned from its config and given its weights (`transform_model`'s 1:1 copy) loses what
its class keeps elsewhere: a TextVectorization's or StringLookup's vocabulary (a lookup table,
saved by Keras as an asset), a tf-idf layer's idf weights, the statistics a Normalization derives
from its adapted variables.  Keras' own saving reaches that state through four hooks
(`save_own_variables` / `load_own_variables`, `save_assets` / `load_assets`); `copy_layer_state`
hands it over through the same hooks - what a reload of the saved file will do - for the layer
and every layer it holds.  `state_difference` compares a layer with its clone: each (sub)layer's
config, and for the layers with such hooks their vocabulary, own variables and assets; the clone
step refuses a clone that differs (UnsupportedLayerError naming the layer) rather than saving a
model whose preprocessing silently changed.
"""

from __future__ import annotations

import os
import tempfile

import keras
import numpy as np

from graphswap.errors import UnsupportedLayerError

_HOOKS = ("save_own_variables", "load_own_variables", "save_assets", "load_assets")


def own_hooks(layer) -> set:
    """The state hooks `layer`'s class defines beyond keras.layers.Layer's (none for most)."""
    base = keras.layers.Layer
    return {name for name in _HOOKS
            if getattr(type(layer), name, None) not in (None, getattr(base, name, None))}


def _sublayers(layer) -> list:
    flatten = getattr(layer, "_flatten_layers", None)
    if flatten is None:
        return []
    try:
        return list(flatten(include_self=False, recursive=True))
    except TypeError:  # pragma: no cover - a Keras without those arguments
        return []


def _pairs(original, clone) -> list:
    """(original part, clone part) for the layer and the layers it holds, matched by position
    (only where both hold the same classes in the same order)."""
    pairs = [(original, clone)]
    inner, cloned = _sublayers(original), _sublayers(clone)
    if len(inner) == len(cloned) and all(type(a) is type(b) for a, b in zip(inner, cloned)):
        pairs.extend(zip(inner, cloned))
    return pairs


def _variables(layer) -> dict:
    store: dict = {}
    layer.save_own_variables(store)
    return {key: np.array(value) for key, value in store.items()}


def _assets(layer) -> dict:
    """{file name: bytes} of what `layer.save_assets` writes."""
    with tempfile.TemporaryDirectory(prefix="graphswap-state-") as folder:
        layer.save_assets(folder)
        found = {}
        for root, _, files in os.walk(folder):
            for name in files:
                path = os.path.join(root, name)
                with open(path, "rb") as handle:
                    found[os.path.relpath(path, folder)] = handle.read()
        return found


def copy_layer_state(original, clone, name: str | None = None) -> None:
    """Give `clone` (a layer of `original`'s class built from its config, weights already set)
    the state `original` keeps outside its weights, through Keras' saving hooks, for the layer
    and every layer it holds.  UnsupportedLayerError naming the layer when a hook fails."""
    for source, target in _pairs(original, clone):
        hooks = own_hooks(source)
        if not hooks or type(source) is not type(target) or isinstance(source, keras.Model):
            continue
        try:
            if hooks & {"save_own_variables", "load_own_variables"}:
                target.load_own_variables(_variables(source))
            if hasattr(source, "save_assets") and hasattr(target, "load_assets"):
                with tempfile.TemporaryDirectory(prefix="graphswap-state-") as folder:
                    source.save_assets(folder)
                    target.load_assets(folder)
        except Exception as exc:  # noqa: BLE001 - any layer's own hook, any failure
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise UnsupportedLayerError(
                f"layer {name or original.name!r} ({type(original).__name__}) keeps state "
                f"beyond its weights (a vocabulary, lookup table or adapted statistics, in "
                f"{type(source).__name__}) that graphswap could not copy into the rewritten model "
                f"({type(exc).__name__}: {reason}); rebuild the layer with that state in its "
                f"config (e.g. vocabulary=... instead of adapt()) and convert again") from None


def _state(layer) -> list:
    """Per (sub)layer: its class, its config and, for layers with state hooks, their state."""
    described = []
    for part in [layer, *_sublayers(layer)]:
        try:
            config = dict(part.get_config())
        except Exception:  # noqa: BLE001 - a sublayer without get_config: nothing to compare
            config = None
        if part is not layer and config is not None:
            config.pop("name", None)  # a held layer's generated name ("string_lookup_5")
        entry = {"class": type(part).__name__, "config": config}
        if own_hooks(part) and not isinstance(part, keras.Model):
            vocabulary = getattr(part, "get_vocabulary", None)
            if callable(vocabulary):
                entry["vocabulary"] = list(vocabulary())
            entry["variables"] = _variables(part)
            if hasattr(part, "save_assets"):
                entry["assets"] = _assets(part)
        described.append(entry)
    return described


def _difference(a, b, where: str):
    """Where `a` and `b` differ, as words (None when they agree).  Values of types other than
    containers, numbers, strings and arrays count as equal when their types are."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return f"{where}: shape {a.shape} before, {b.shape} after"
        same = np.array_equal(a, b, equal_nan=a.dtype.kind in "fc" and b.dtype.kind in "fc")
        return None if same else f"{where}: values differ"
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return f"{where}: keys {sorted(map(str, set(a) ^ set(b)))} present on one side only"
        for key in a:
            found = _difference(a[key], b[key], f"{where}.{key}" if where else str(key))
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{where}: {len(a)} entries before, {len(b)} after"
        for index, (x, y) in enumerate(zip(a, b)):
            found = _difference(x, y, f"{where}[{index}]")
            if found:
                return found
        return None
    plain = (str, bytes, bool, int, float, type(None), np.generic)
    if isinstance(a, plain) or isinstance(b, plain):
        if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
            return None  # both NaN
        try:
            same = bool(a == b)
        except (TypeError, ValueError):
            same = False
        return None if same else f"{where}: {a!r} before, {b!r} after"
    return None if type(a) is type(b) else \
        f"{where}: {type(a).__name__} before, {type(b).__name__} after"


def state_difference(original, clone):
    """How `clone` differs from `original` in config or non-weight state (None: it does not)."""
    before, after = _state(original), _state(clone)
    if len(before) != len(after):
        if any("variables" in entry for entry in before[1:]):  # held state: unmatched
            return f"it holds {len(before) - 1} layer(s) before and {len(after) - 1} after"
        before, after = before[:1], after[:1]   # held layers without state of their own
    for first, second in zip(before, after):
        found = _difference(first, second, "" if first is before[0] else first["class"])
        if found:
            return found
    return None


def check_layer_state(original, clone, name: str | None = None) -> None:
    """UnsupportedLayerError naming the layer when `clone` lost config or non-weight state."""
    found = state_difference(original, clone)
    if found:
        raise UnsupportedLayerError(
            f"layer {name or original.name!r} ({type(original).__name__}) is not the same after "
            f"graphswap copied it ({found}): its state beyond the weights (vocabulary, lookup "
            f"table, adapted statistics) did not survive; rebuild the layer with that state in "
            f"its config (e.g. vocabulary=... instead of adapt()) and convert again")
