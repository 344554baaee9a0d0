"""Subclassed models (`class Net(keras.Model)` with layers as attributes): swapping the layers they
hold, and saving the result so that it reloads with its arithmetic.

A subclassed model's call() is Python code graphswap cannot rewire, but the layers it calls are
attributes of the model - directly, in lists and dicts, inside nested layers and models at any
depth - so swapping means replacing those attributes (graphswap.swap.tracking keeps Keras' tracking
order, so weights, their order and checkpoints stay the stock model's).  A nested Sequential or
Functional model is rewritten as a copy and put in its place.

Copy or in place: `swap_layers` works on whatever model it is given.  rewrite_model hands it a copy
made with the model's own get_config/from_config (a subclass whose __init__ arguments Keras can
serialise, or that defines get_config) with the weights copied; a model that cannot be copied that
way is swapped only when the caller says inplace=True, and then the caller's model itself changes.

Custom layers of Sequential/Functional models (a user's layer class holding Dense, EinsumDense,
MultiHeadAttention, convolutions... as attributes - the usual transformer block): the same
machinery on a copy of the layer (`copy_custom_layer`: its own from_config, built by a symbolic
call like the original's first call, the weights copied), which then takes the original's place
in the cloned graph.  It saves the same way as a swapped subclassed model.

Saving: the swapped model's class becomes a subclass of its own class (made once per class) whose
get_config wraps the original config with, for every replaced attribute, the serialised swapped
layer; `from_config` (registered as "graphswap>SwappedSubclassedModel") rebuilds the original model
from its config, finds its class through Keras' registry or the custom objects given to
load_model, and puts the deserialised swapped layers back (each passes the kernel trust gate)
before Keras builds the model and loads its weights.
"""

from __future__ import annotations

import keras
from keras.src import tree

from graphswap.errors import GraphswapError, ModelLoadError, UnsupportedLayerError
from graphswap.swap.clone import clone_layer
from graphswap.swap.layer_state import copy_layer_state
from graphswap.swap.tracking import replace_attribute, replace_item

REGISTERED_NAME = "graphswap>SwappedSubclassedModel"
_INTERNAL: set = set()


def is_subclassed(model) -> bool:
    from keras.src.models.functional import Functional  # not exported publicly by Keras 3

    return isinstance(model, keras.Model) and not isinstance(model, (keras.Sequential,
                                                                      Functional))


def _internal_attributes() -> set:
    """Attributes every Keras layer/model has (not the user's); computed once."""
    if not _INTERNAL:
        _INTERNAL.update(vars(keras.Model()), vars(keras.layers.Layer()))
    return _INTERNAL


def held_layers(owner):
    """(steps, layer) for every layer `owner` holds in its own attributes, lists and dicts;
    steps is the JSON-able path [["attr", name], ["item", index or key], ...]."""
    internal = _internal_attributes()
    for name, value in list(vars(owner).items()):
        if name in internal or name.startswith("_self_") or name.startswith("_keras") \
                or name.startswith("graphswap_"):   # graphswap_swaps: the swaps' record
            continue
        yield from _walk([["attr", name]], value)


def _walk(steps, value):
    if isinstance(value, keras.layers.Layer):
        yield steps, value
    elif isinstance(value, dict):
        for key in list(value):
            if isinstance(key, (str, int)):
                yield from _walk(steps + [["item", key]], value[key])
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _walk(steps + [["item", index]], item)


def describe_steps(steps) -> str:
    out = ""
    for kind, key in steps:
        out += f".{key}" if kind == "attr" else f"[{key!r}]"
    return out.lstrip(".")


def put(owner, steps, new) -> None:
    """Replace the layer at `steps` under `owner` (keeping Keras' tracking order)."""
    *path, (kind, key) = steps
    holder = owner
    container = None
    for step_kind, step_key in path:
        container = getattr(holder if container is None else container, step_key) \
            if step_kind == "attr" else container[step_key]
        if isinstance(container, keras.layers.Layer):
            holder, container = container, None
    if kind == "attr":
        replace_attribute(holder, key, new)
    elif isinstance(container, tuple):
        raise UnsupportedLayerError(
            f"layer {container[key].name!r} of {owner.name!r} is held in a tuple "
            f"({describe_steps(steps)}), which cannot be changed; hold it in a list instead")
    else:
        replace_item(holder, container, key, new)


def layer_paths(model, prefix: str = "") -> dict:
    """{describe_steps(steps): layer-name path} of every layer `model` holds, at any depth."""
    paths: dict = {}

    def visit(owner, steps_prefix, name_prefix):
        for steps, layer in held_layers(owner):
            full = steps_prefix + steps
            key = describe_steps(full)
            if key in paths:
                continue
            paths[key] = f"{name_prefix}{layer.name}"
            if not isinstance(layer, keras.Model) or is_subclassed(layer):
                visit(layer, full, paths[key] + "/")

    visit(model, [], prefix)
    return paths


def swap_layers(model, replace, prefix: str = "", paths: dict | None = None) -> dict:
    """Replace, at any depth, every layer `replace(path, layer)` returns a replacement for.

    `replace` gets the layer-name path ("block_1/conv"; from `paths`, layer_paths of the model
    `model` was copied from, when given, so a copy's renamed layers keep the original's names) and
    returns a new layer (built, with the weights it should have) or None; for None, a layer
    holding layers is searched in turn.
    Returns {describe_steps(steps): (steps, new layer)} of the replacements made on `model`
    itself (deeper ones are found again through those steps)."""
    done: dict = {}
    swaps: dict = {}

    def visit(owner, steps_prefix, name_prefix):
        for steps, layer in list(held_layers(owner)):
            full = steps_prefix + steps
            if id(layer) in done:  # a layer held twice: replace it everywhere with one copy
                if done[id(layer)] is not layer:
                    put(owner, steps, done[id(layer)])
                    swaps[describe_steps(full)] = (full, done[id(layer)])
                continue
            path = (paths or {}).get(describe_steps(full), f"{name_prefix}{layer.name}")
            new = replace(path, layer)
            done[id(layer)] = layer if new is None else new
            if new is not None:
                put(owner, steps, new)
                swaps[describe_steps(full)] = (full, new)
            elif not isinstance(layer, keras.Model) or is_subclassed(layer):
                visit(layer, full, path + "/")

    visit(model, [], prefix)
    return swaps


class SubclassSwapMixin:
    """get_config / from_config of a swapped subclassed model (module docstring)."""

    graphswap_base = None
    graphswap_swaps: dict = {}

    def get_config(self):
        base = type(self).graphswap_base
        swaps = {name: {"steps": steps, "layer": keras.saving.serialize_keras_object(layer)}
                 for name, (steps, layer) in self.graphswap_swaps.items()}
        return {"graphswap_base": {"module": base.__module__, "class_name": base.__name__,
                                   "registered_name": keras.saving.get_registered_name(base)},
                "graphswap_config": base.get_config(self), "graphswap_swaps": swaps}

    @classmethod
    def from_config(cls, config):
        base = _base_class(config["graphswap_base"])
        model = base.from_config(config["graphswap_config"])
        swaps = {}
        for name, record in config.get("graphswap_swaps", {}).items():
            layer = keras.saving.deserialize_keras_object(record["layer"])
            put(model, record["steps"], layer)
            swaps[name] = (record["steps"], layer)
        mark_swapped(model, swaps)
        return model


keras.saving.register_keras_serializable(package="graphswap", name="SwappedSubclassedModel")(
    SubclassSwapMixin)
_CLASSES: dict = {}


def mark_swapped(model, swaps: dict) -> None:
    """Give `model` the class that saves its swaps (a subclass of its own class)."""
    base = getattr(type(model), "graphswap_base", None) or type(model)
    cls = _CLASSES.get(base)
    if cls is None:
        cls = type(base.__name__, (SubclassSwapMixin, base),
                   {"graphswap_base": base, "__module__": base.__module__,
                    "__doc__": base.__doc__})
        keras.saving.register_keras_serializable(package="graphswap",
                                                 name="SwappedSubclassedModel")(cls)
        _CLASSES[base] = cls
    previous = dict(getattr(model, "graphswap_swaps", {}) or {})
    model.__class__ = cls
    model.graphswap_swaps = {**previous, **swaps}


def _base_class(record: dict):
    name = record.get("registered_name") or record.get("class_name")
    found = keras.saving.get_registered_object(name)
    if found is None and record.get("class_name") != name:
        found = keras.saving.get_registered_object(record.get("class_name"))
    if found is None:
        raise ModelLoadError(
            f"the swapped model's class {record.get('class_name')!r} (module "
            f"{record.get('module')!r}) is not known here: register it with "
            f"@keras.saving.register_keras_serializable() or pass it in custom_objects "
            f"(CLI: --custom-objects module.py)")
    return found


def is_custom_layer(layer) -> bool:
    """A user's layer class (not a Keras class, not a model)."""
    if isinstance(layer, keras.Model) or not isinstance(layer, keras.layers.Layer):
        return False
    module = type(layer).__module__ or ""
    return not (module == "keras" or module.startswith("keras.") or module.startswith("tf_keras"))


def is_custom_container(layer) -> bool:
    """A user's layer (not a Keras class, not a model) that holds layers as attributes."""
    return is_custom_layer(layer) and any(True for _ in held_layers(layer))


def own_weights(layer) -> list:
    """The weights a layer creates itself (not those of the layers it holds)."""
    inner = {id(w) for _, held in held_layers(layer) for w in held.weights}
    return [w for w in layer.weights if id(w) not in inner]


def copy_custom_layer(layer):
    """A built copy of a custom layer of a functional model, with its weights: made with its own
    get_config/from_config and called symbolically the way the original was first called.
    GraphswapError when it cannot be copied that way."""
    nodes = getattr(layer, "_inbound_nodes", None) or []
    if not nodes:
        raise GraphswapError(f"custom layer {layer.name!r} was never called in the model")
    try:
        copy = clone_layer(layer)

        def fresh(value):
            if isinstance(value, keras.KerasTensor):
                return keras.KerasTensor(value.shape, dtype=value.dtype, sparse=value.sparse)
            return value

        arguments = nodes[0].arguments
        copy(*tree.map_structure(fresh, arguments.args),
             **tree.map_structure(fresh, arguments.kwargs))
    except (NotImplementedError, TypeError, ValueError, KeyError, AttributeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GraphswapError(f"custom layer {layer.name!r} ({type(layer).__name__}) cannot be "
                             f"copied through get_config/from_config and a call ({first})"
                             ) from None
    if len(copy.weights) != len(layer.weights):
        raise GraphswapError(
            f"the copy of custom layer {layer.name!r} has {len(copy.weights)} weights, the layer "
            f"{len(layer.weights)}: it creates weights in a way a copy does not repeat")
    copy.set_weights(layer.get_weights())
    copy_layer_state(layer, copy)  # vocabularies, lookup tables of the layers it holds
    return copy


def copy_subclassed(model):
    """A copy of a subclassed model from its own get_config/from_config, built, with its
    weights; GraphswapError (naming inplace=True) when the class cannot be copied that way.
    An already swapped model copies with its swapped layers (SubclassSwapMixin)."""
    try:
        copy = type(model).from_config(model.get_config())
    except (NotImplementedError, TypeError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GraphswapError(
            f"model {model.name!r} ({type(model).__name__}) is a subclassed model that cannot be "
            f"copied through get_config/from_config ({first}); give the class a get_config() "
            f"(and register it with @keras.saving.register_keras_serializable() to save it), or "
            f"swap the model's own layers with rewrite_model(model, ..., inplace=True)") from None
    build_config = model.get_build_config() if model.built else None
    if build_config:
        copy.build_from_config(build_config)
        copy.built = True  # as Keras' own deserialisation does after build_from_config
    if len(copy.weights) != len(model.weights):
        raise GraphswapError(
            f"the copy of subclassed model {model.name!r} has {len(copy.weights)} weights, the "
            f"model {len(model.weights)}: build it by calling it on data before rewriting, or use "
            f"inplace=True")
    copy.set_weights(model.get_weights())
    copy_layer_state(model, copy)  # vocabularies, lookup tables of the layers it holds
    return copy
