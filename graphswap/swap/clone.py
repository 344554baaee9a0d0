"""Model surgery machinery: clone a Keras model, replacing selected layers, copying weights 1:1.

`transform_model` clones Sequential and Functional models - nested models at any depth, shared
layers (cloned once, still shared), multi-input/multi-output graphs - through
keras.models.clone_model(recursive=True), lets a callback replace any layer, then copies every
original layer's weights into its clone.  The input model is never modified.  A layer the callback
leaves as it is also gets the state its class keeps beyond its weights (a TextVectorization's
vocabulary, a Normalization's statistics: graphswap/swap/layer_state.py), and its clone is checked
against it (config and that state): a copy that lost either is refused, naming the layer.  Used by
rewrite_model (swap Dense/Conv2D), graphswap.surgery.override (gradient rules) and the exports
(lowering swapped layers back to stock ones).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Callable

import keras
from keras.src.models.functional import Functional  # not exported publicly by Keras 3

from graphswap.errors import GraphswapError, UnsupportedLayerError
from graphswap.kernels import Kernel
from graphswap.swap.layer_state import check_layer_state, copy_layer_state
from graphswap.swap.xla import (compile_config_without_xla, keras_jit_fallback_quiet,
                                recompile_without_xla)


def check_cloneable(model) -> None:
    """Refuse what transform_model cannot clone (not a model; a subclassed model)."""
    if not isinstance(model, keras.Model):
        raise GraphswapError(f"expected a keras.Model, got {type(model).__name__}")
    if not isinstance(model, (keras.Sequential,)) and not is_functional(model):
        raise UnsupportedLayerError(
            f"model {model.name!r} is a subclassed model ({type(model).__name__}); this step "
            f"clones Sequential and Functional models only, because a subclassed model's call() "
            f"is Python code it cannot rewire (rewrite_model swaps a subclassed model's layer "
            f"attributes instead; exports and gradient overrides need a functional model). "
            f"Rebuild it functionally (keras.Input + layer calls)")


def is_functional(model) -> bool:
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
                                                   or is_functional(layer)):
                yield path, layer
                yield from walk(layer, path + "/")
            else:
                yield path, layer

    yield from walk(model, prefix)


def clone_layer(layer):
    """A fresh copy of `layer` from its config.  A swapped layer keeps its resolved arithmetic
    (already checked when it was built), so cloning reads no kernel file again."""
    config = layer.get_config()
    arithmetic = getattr(layer, "arithmetic", None)
    if isinstance(arithmetic, Kernel):
        config = {**config, "arithmetic": arithmetic}
    return layer.__class__.from_config(config)


def transform_model(model, replace: Callable, name_suffix: str = "", prefix: str = "",
                    weights=None):
    """Clone `model`, letting `replace(path, layer)` return a new layer (or None to clone as is).

    Returns (new_model, {id(original_layer): new_layer}).  Weights of every layer are copied from
    the original; a replacement layer must have the same weights layout as the layer it replaces,
    unless `weights(original, clone)` returns the list to set instead (None: the original's).
    `prefix` is put before every path (a model nested in a subclassed one).
    """
    check_cloneable(model)
    paths = {id(layer): path for path, layer in iter_layers(model, prefix)}
    pairs: list[tuple] = []
    kept = set()  # the layers cloned as they are (their non-weight state is copied and checked)

    def clone_function(layer):
        path = paths.get(id(layer), layer.name)
        new_layer = replace(path, layer)
        if new_layer is None:
            new_layer = clone_layer(layer)
            kept.add(id(layer))
        pairs.append((layer, new_layer))
        return new_layer

    # The model is already in memory (whoever loaded it decided whether to trust its Lambda
    # layers); cloning it must not trip Keras' safe mode a second time.
    with _unsafe_clone_scope():
        with keras_jit_fallback_quiet():  # the clone is compiled without XLA below
            new_model = keras.models.clone_model(model, clone_function=clone_function,
                                                 recursive=True)
    for original, clone in pairs:
        if not isinstance(original, keras.layers.Layer):
            continue  # a keras.ops call in a functional graph (e.g. ops.relu): no weights
        values = weights(original, clone) if weights is not None else None
        values = original.get_weights() if values is None else values
        if values:
            if not clone.built:
                raise GraphswapError(
                    f"layer {original.name!r} was not built in the clone; is the model built?")
            clone.set_weights(values)
        if id(original) in kept:
            path = paths.get(id(original), original.name)
            copy_layer_state(original, clone, path)
            check_layer_state(original, clone, path)
    copy_compile_config(model, new_model)
    return new_model, {id(original): clone for original, clone in pairs}


def _unsafe_clone_scope():
    try:
        from keras.src.saving.serialization_lib import SafeModeScope
    except ImportError:  # pragma: no cover - Keras moved it; cloning Lambdas then needs the flag
        return contextlib.nullcontext()
    return SafeModeScope(False)


def copy_compile_config(model, new_model) -> None:
    """Carry loss/metrics/optimizer settings over (not optimizer state), when the model has them."""
    if not getattr(model, "compiled", False) or getattr(new_model, "compiled", False):
        recompile_without_xla(new_model)  # swapped layers run outside XLA (swap/xla.py)
        return
    try:
        config = model.get_compile_config()
        if config:  # jit_compile=True dropped where swapped layers run outside XLA
            new_model.compile_from_config(compile_config_without_xla(new_model, config))
    except Exception as exc:  # noqa: BLE001 - a model without compile info still rewrites
        warnings.warn(f"could not carry the compile settings over to the rewritten model: {exc}")


def copy_model(model):
    """A copy of `model` (same weights, same compile settings) built in the current scope - e.g.
    so that its variables belong to the active distribution strategy."""
    return transform_model(model, lambda path, layer: None)[0]
