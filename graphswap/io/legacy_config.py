"""Keras 2 (tf.keras / tf_keras) model and training configs translated to what Keras 3 builds.

`translate_model_config` rewrites, in a copy of the JSON config, every layer option Keras 3
renamed or dropped, before Keras 3 builds a layer (Keras 3's own legacy loader only handles
`batch_input_shape` and list-valued `axis`):

- `KEY_RULES`: per layer class, the options Keras 3 does not have - dropped when they hold the
  value that means what Keras 3 does anyway (`groups=1` of depthwise/separable/transposed convs,
  `time_major=False` of recurrent layers, MultiHeadAttention's build shapes), renamed
  (LeakyReLU `alpha`), and refused with the layer and the option named when they would change
  the computation (`groups=2` on a transposed conv, `time_major=True`, batch renormalization).
- any other option a Keras 3 layer of that class does not accept: dropped when it is null, else
  refused by name (never a config dump).
- what a config means (graphswap.io.legacy_semantics): Keras 2's `hard_sigmoid` formula, and
  Keras 2's defaults (by the writing Keras version) for keys a config leaves out.
- where a layer sits: a wrapper's inner layer without a `module` key (tf.keras before 2.13) gets
  Keras 3's `keras.layers`, which its wrappers need to find the class; a Sequential's first layer
  holding `batch_input_shape` (no InputLayer entry, as older tf.keras wrote it) gets an
  InputLayer of that shape, and no other layer keeps one (Keras 3 would read it as a shape
  without the batch axis: "expected ndim=3, found ndim=4").
- the graph's nodes: Keras 2 wrote a call's keyword arguments with tensor references
  (`[layer, node, tensor]`, e.g. MultiHeadAttention's `value`) that Keras 3's legacy reader
  passes on as plain lists; they are rewritten in Keras 3's node format.  `TFOpLambda` /
  `SlicingOpLambda` layers get graphswap's allow-listed rebuild (graphswap.io.tf_op_layer) with
  their constant arguments moved into the layer config.

`translate_training_config` turns a Keras 2 `training_config` (loss names and objects, metrics
such as `'accuracy'` saved as `MeanMetricWrapper`, optimizers with `lr`/`decay`) into
`model.compile` arguments, replacing what cannot be rebuilt with a note.
"""

from __future__ import annotations

import copy
import inspect

import keras

from graphswap.errors import ModelLoadError
from graphswap.io.legacy_semantics import apply_semantics, keras_version

#: a note for every option that was translated with a caveat, or dropped
Notes = list

_SAME = object()  # a rule: drop the key whatever its value


def _require(value):
    """Drop the key when it holds `value`; any other value is refused."""
    return ("require", value)


def _rename(new_key):
    return ("rename", new_key)


_CONV_GROUPS = {"groups": _require(1)}
_SEPARABLE = {"groups": _require(1), "kernel_initializer": _SAME, "kernel_regularizer": _SAME,
              "kernel_constraint": _SAME}
_RECURRENT = {"time_major": _require(False), "implementation": _SAME}
_BATCH_NORM = {"fused": _SAME, "renorm": _require(False), "renorm_clipping": _SAME,
               "renorm_momentum": _SAME, "virtual_batch_size": _require(None),
               "adjustment": _require(None)}
_SPATIAL_DROPOUT = {"noise_shape": _require(None), "trainable": _SAME}

#: layer class -> {Keras 2 option: rule}
KEY_RULES = {
    "DepthwiseConv1D": _CONV_GROUPS, "DepthwiseConv2D": _CONV_GROUPS,
    "Conv1DTranspose": _CONV_GROUPS, "Conv2DTranspose": _CONV_GROUPS,
    "Conv3DTranspose": _CONV_GROUPS,
    "SeparableConv1D": _SEPARABLE, "SeparableConv2D": _SEPARABLE,
    "LSTM": _RECURRENT, "GRU": _RECURRENT, "SimpleRNN": _RECURRENT, "ConvLSTM2D": _RECURRENT,
    "LSTMCell": {"implementation": _SAME}, "GRUCell": {"implementation": _SAME},
    "BatchNormalization": _BATCH_NORM,
    "MultiHeadAttention": {"query_shape": _SAME, "key_shape": _SAME, "value_shape": _SAME,
                           # Keras 3 always masks the robust way (tf.where); tf.keras' default
                           # added -1e9 instead: equal unless a score is itself near 1e9
                           "softmax_robust_masking": _SAME},
    "LeakyReLU": {"alpha": _rename("negative_slope")},
    "SpatialDropout1D": _SPATIAL_DROPOUT, "SpatialDropout2D": _SPATIAL_DROPOUT,
    "SpatialDropout3D": _SPATIAL_DROPOUT,
}
#: options Keras 3 reads for any layer (its base class, and model_from_config's legacy keys)
BASE_KEYS = frozenset({"name", "trainable", "dtype", "autocast", "activity_regularizer",
                       "input_shape", "input_dim", "batch_input_shape", "batch_size"})
MODEL_CLASSES = ("Functional", "Model", "Sequential")
TF_OP_CLASSES = ("TFOpLambda", "SlicingOpLambda")
#: tf_keras' records of tensor methods and properties: code paths graphswap does not rebuild
TENSOR_METHOD_CLASSES = ("ClassMethod", "InstanceMethod", "InstanceProperty")
#: classes whose Keras 2 options Keras 3's legacy reader translates itself
KERAS_TRANSLATES = ("Lambda",)
CONSTANT = "_CONSTANT_VALUE"
#: the keys of a wrapper's (Bidirectional, TimeDistributed, RNN) inner layers
INNER_KEYS = ("layer", "backward_layer", "cell")


def translate_model_config(config: dict, notes: Notes, version: str | None = None) -> dict:
    """A translated copy of a Keras 2 model config ({"class_name", "config"}); notes appended.
    `version`: the `keras_version` the file records (Keras 2's defaults depend on it)."""
    config = copy.deepcopy(config)
    _translate_layer(config, notes, keras_version(version))
    return config


def _translate_layer(entry, notes: Notes, version=None) -> None:
    if not isinstance(entry, dict) or not isinstance(entry.get("config"), dict):
        return
    class_name = entry.get("class_name")
    layer_config = entry["config"]
    if class_name in MODEL_CLASSES:
        if class_name != "Sequential":
            _renumber_nested_model_nodes(layer_config)
        else:
            _sequential_input(layer_config)
        for child in layer_config.get("layers", []) or []:
            _translate_layer(child, notes, version)
            if class_name != "Sequential":
                _translate_nodes(child)
                if isinstance(child, dict) and child.get("class_name") != "InputLayer" and \
                        isinstance(child.get("config"), dict):
                    # a graph's input shapes are its InputLayers'; Keras 3 warns on the copy
                    child["config"].pop("batch_input_shape", None)
        for key in ("input_layers", "output_layers"):
            # Keras 2 wrote one input as [[name, 0, 0]]; Keras 3 reads that as a list of inputs
            # (and warns on every call that its structure does not match a single tensor)
            ends = layer_config.get(key)
            if isinstance(ends, list) and len(ends) == 1 and _is_reference(ends[0]):
                layer_config[key] = ends[0]
        return
    inner = [layer_config[key] for key in INNER_KEYS if isinstance(layer_config.get(key), dict)]
    inner += [cell for cell in layer_config.get("cells") or [] if isinstance(cell, dict)]
    for child in inner:  # wrappers: Bidirectional, TimeDistributed, RNN, StackedRNNCells
        _translate_layer(child, notes, version)
        _inner_layer_module(child)
        if isinstance(child.get("config"), dict):  # the wrapper's input shape is the model's
            child["config"].pop("batch_input_shape", None)
    if class_name in TF_OP_CLASSES:
        layer_config.pop("function_type", None)
        return
    if class_name in TENSOR_METHOD_CLASSES:
        raise ModelLoadError(
            f"layer {layer_config.get('name', class_name)!r} is a Keras 2 {class_name} (a "
            f"tensor's method or property, such as x.shape or a RaggedTensor method, called on a "
            f"symbolic tensor), which graphswap does not rebuild (it rebuilds TFOpLambda calls of "
            f"pure tf.* functions). Rebuild that step of the model with Keras layers or "
            f"keras.ops and save it again")
    name = layer_config.get("name", class_name)
    for key, rule in KEY_RULES.get(class_name, {}).items():
        if key in layer_config:
            _apply_rule(layer_config, key, rule, name, class_name)
    if _keras_layer_class(class_name) is not None:  # a custom class's config means what it says
        apply_semantics(class_name, layer_config, version)
    _drop_unknown_keys(layer_config, name, class_name)


def _keras_layer_class(class_name):
    cls = getattr(keras.layers, str(class_name), None)
    return cls if inspect.isclass(cls) and issubclass(cls, keras.layers.Layer) else None


def _inner_layer_module(entry: dict) -> None:
    """A wrapper's inner Keras layer without a `module` key (tf.keras before 2.13 wrote none):
    Keras 3's wrappers deserialize it by module ("Could not locate class 'GRU'" without one)."""
    class_name = entry.get("class_name")
    if "module" not in entry and class_name not in MODEL_CLASSES and \
            _keras_layer_class(class_name) is not None:
        entry["module"] = "keras.layers"
        entry.setdefault("registered_name", None)


def _sequential_input(sequential: dict) -> None:
    """A Sequential's input shape as an InputLayer entry: Keras 2 kept `batch_input_shape` on its
    first layer (older tf.keras wrote no InputLayer), which Keras 3's legacy reader passes on as
    `input_shape`, batch axis included.  Later layers' copies (tf_keras writes one on the layer
    after its InputLayer) are dropped."""
    layers = sequential.get("layers")
    if not isinstance(layers, list) or not layers or not isinstance(layers[0], dict):
        return
    first = layers[0]
    if first.get("class_name") != "InputLayer" and isinstance(first.get("config"), dict):
        config = first["config"]
        shape = config.get("batch_input_shape")
        if shape is None:  # a wrapper first (Bidirectional(LSTM(input_shape=...))): its layer's
            inner = [config[key].get("config") for key in INNER_KEYS
                     if isinstance(config.get(key), dict)]
            shape = next((c.get("batch_input_shape") for c in inner
                          if isinstance(c, dict) and c.get("batch_input_shape")), None)
        if shape is not None:
            dtype = config.get("dtype")
            dtype = dtype if isinstance(dtype, str) and not dtype.startswith("mixed") \
                else "float32"
            layers.insert(0, {"class_name": "InputLayer", "config": {
                "batch_input_shape": shape, "dtype": dtype,
                "name": f"{config.get('name', 'sequential')}_input"}})
    for child in layers[1:]:
        if isinstance(child, dict) and isinstance(child.get("config"), dict):
            child["config"].pop("batch_input_shape", None)


def _apply_rule(layer_config, key, rule, name, class_name) -> None:
    value = layer_config.pop(key)
    if rule is _SAME:
        return
    kind, argument = rule
    if kind == "rename":
        layer_config[argument] = value
    elif value != argument:
        raise ModelLoadError(
            f"layer {name!r} ({class_name}) is saved with {key}={value!r}, which Keras 3's "
            f"{class_name} does not support (only {key}={argument!r} can be translated); "
            f"graphswap cannot load it faithfully. Rebuild the layer without that option")


def _drop_unknown_keys(layer_config, name, class_name) -> None:
    cls = getattr(keras.layers, str(class_name), None)
    if not inspect.isclass(cls) or class_name in KERAS_TRANSLATES:
        return  # a custom class: its own from_config decides
    accepted = set(BASE_KEYS)
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            accepted.update(inspect.signature(vars(klass)["__init__"]).parameters)
    for key in [key for key in layer_config if key not in accepted]:
        value = layer_config.pop(key)
        if value is not None:
            raise ModelLoadError(
                f"layer {name!r} ({class_name}) is saved with the Keras 2 option {key}={value!r}, "
                f"which Keras 3's {class_name} does not have; graphswap cannot translate it. "
                f"Rebuild the layer without that option, or save the model from Keras 3")


# -- the graph's nodes -------------------------------------------------------------------------

def _renumber_nested_model_nodes(graph: dict) -> None:
    """Keras 2 counted a nested model's calls from 1: its node 0 was the model's own (its inputs
    to its outputs), skipped when saving (tf_keras' _should_skip_first_node).  A Keras 3 model
    has no such node, so references to a nested model built on an InputLayer move down by one:
    in the layers' inbound nodes, and in the model's outputs for a nested Sequential (Keras 3
    already moves a nested Functional's there)."""
    nested = {}
    for child in graph.get("layers", []) or []:
        if isinstance(child, dict) and child.get("class_name") in MODEL_CLASSES and \
                isinstance(child.get("config"), dict) and \
                (child["config"].get("layers") or [{}])[0].get("class_name") == "InputLayer":
            nested[child.get("name") or child["config"].get("name")] = child["class_name"]
    if nested:
        _shift_references(graph, set(nested),
                          {name for name, kind in nested.items() if kind == "Sequential"})


def _shift_references(graph: dict, in_nodes: set, in_ends: set) -> None:
    def shift(value, nested):
        if _is_reference(value) and value[0] in nested and value[1] > 0:
            return [value[0], value[1] - 1, *value[2:3], *[shift(v, nested) for v in value[3:]]]
        if isinstance(value, list):
            return [shift(item, nested) for item in value]
        if isinstance(value, dict):
            return {key: shift(item, nested) for key, item in value.items()}
        return value

    for child in graph.get("layers", []) or []:
        if isinstance(child, dict) and "inbound_nodes" in child:
            child["inbound_nodes"] = shift(child["inbound_nodes"], in_nodes)
    for key in ("input_layers", "output_layers"):
        if key in graph:
            graph[key] = shift(graph[key], in_ends)


def _is_reference(item) -> bool:
    return (isinstance(item, (list, tuple)) and len(item) in (3, 4) and isinstance(item[0], str)
            and isinstance(item[1], int) and (item[0] == CONSTANT or isinstance(item[2], int))
            and (len(item) == 3 or isinstance(item[3], dict)))


def _keras_tensor(reference) -> dict:
    return {"class_name": "__keras_tensor__",
            "config": {"shape": [], "dtype": "float32", "keras_history": list(reference[:3])}}


def _contains_reference(value) -> bool:
    if _is_reference(value):
        return True
    if isinstance(value, (list, tuple)):
        return any(_contains_reference(item) for item in value)
    if isinstance(value, dict):
        return any(_contains_reference(item) for item in value.values())
    return False


def _revive(value):
    """Tensor references in a Keras 2 call argument as Keras 3 serialized KerasTensors."""
    if _is_reference(value):
        return value[2] if value[0] == CONSTANT else _keras_tensor(value)
    if isinstance(value, (list, tuple)):
        return [_revive(item) for item in value]
    if isinstance(value, dict):
        return {key: _revive(item) for key, item in value.items()}
    return value


def _first_kwargs(node):
    """The keyword arguments Keras 2 attached to (every) tensor of the first argument."""
    if _is_reference(node):
        return node[3] if len(node) == 4 else {}
    if isinstance(node, (list, tuple)):
        for item in node:
            found = _first_kwargs(item)
            if found:
                return found
    return {}


def _first_argument(node, keep_structure: bool):
    if _is_reference(node):
        return _revive(list(node[:3]))
    items = [_first_argument(item, keep_structure) for item in node]
    return items[0] if len(items) == 1 and not keep_structure else items


def _translate_nodes(entry) -> None:
    """Keras 2 nodes that pass tensors as keyword arguments, and every TFOpLambda node, in Keras
    3's node format ({"args", "kwargs"}); plain nodes stay as they are (Keras 3 reads them)."""
    nodes = entry.get("inbound_nodes")
    if not isinstance(nodes, list):
        return
    is_op = entry.get("class_name") in TF_OP_CLASSES
    translated = []
    for node in nodes:
        kwargs = dict(_first_kwargs(node))
        if not is_op and not _contains_reference(kwargs):
            translated.append(node)
            continue
        if is_op and len(nodes) == 1:  # constants go into the layer config (plain JSON)
            constants = {key: value for key, value in kwargs.items()
                         if not _contains_reference(value) and key != "name"}
            entry["config"]["arguments"] = _plain(constants)
            kwargs = {key: value for key, value in kwargs.items() if key not in constants}
        if is_op:
            kwargs.pop("name", None)
        translated.append({"args": [_first_argument(node, keep_structure=is_op and
                                                    not _is_reference(node))],
                           "kwargs": _revive(kwargs)})
    entry["inbound_nodes"] = translated


def _plain(value):
    """A JSON-safe copy of a constant argument (`...` in a slice spec as a marker string)."""
    if value is Ellipsis:
        return "__ellipsis__"
    if isinstance(value, dict):
        if value.get("class_name") == "__ellipsis__":
            return "__ellipsis__"
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value
