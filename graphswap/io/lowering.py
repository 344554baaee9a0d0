"""Lowering swapped layers for export: back to their stock Keras layers (same weights), or to
layers whose kernel calls are marked PyFuncs that tf2onnx turns into custom ONNX nodes.  Each layer
kind (graphswap.swap.kinds) has one entry in MARKED_CLASSES here (its stock class in a marking name
scope) and one in graphswap.io.kept_layers.KEPT_CLASSES (its kept-kernel class).

`lower_model(model)` computes what `model` computes with the exact kernel (an output correction
compensates an approximate multiplier's error, so it is dropped with it); `kept_kernel_model`
keeps the kernels, with each layer's quantization scheme - static ranges included - fixed at
export and its output correction as standard ops.  Both return the per-layer records the export
metadata stores.  For an export (`marked`, and the kept-kernel model) a layer that only acts in
training - random augmentation, noise, dropout: `INFERENCE_IDENTITY` - becomes the identity it is
at inference, so the exported graph holds no random-number state (a SavedModel could not reach
its seed generator's variable from the root).
"""

from __future__ import annotations

import dataclasses
import re

import keras
import tensorflow as tf

from graphswap.io.kept_layers import KEPT_CLASSES, mark
from graphswap.errors import ExportError, GraphswapError
from graphswap.swap import (SWAPPED_CLASSES, iter_layers, stock_class, transform_model,
                            type_name)
from graphswap.swap.kinds import of_layer
from graphswap.swap.layers_wrapped import FoldedTimeDistributed, fold_time_steps, folded_copy
from graphswap.swap.kinds.counting import input_shape_of
from graphswap.swap.layers_recurrent import STOCK as RECURRENT_STOCK
from graphswap.swap.layers_recurrent import stock_config as recurrent_stock_config
from graphswap.swap.rewrite import built_replacement
from graphswap.swap.subclassed import (copy_custom_layer, held_layers, is_custom_container,
                                     is_custom_layer, layer_paths, swap_layers)

MARKER = "graphswap_export_{index}"
MARKER_RE = re.compile(r"graphswap_export_(\d+)(?![0-9])")
#: Keras layers that return their input unchanged at inference (their randomness, and the seed
#: generator holding its state, act only in training); exports hold them as Identity.  Exact
#: classes only: a subclass may compute at inference.
INFERENCE_IDENTITY = (
    "RandomFlip", "RandomRotation", "RandomZoom", "RandomTranslation", "RandomContrast",
    "RandomBrightness", "RandomShear", "RandomColorJitter", "RandomColorDegeneration",
    "RandomGrayscale", "RandomHue", "RandomSaturation", "RandomSharpness", "RandomPosterization",
    "RandomInvert", "RandomErasing", "RandomGaussianBlur", "RandomPerspective",
    "RandomElasticTransform", "AugMix", "RandAugment", "CutMix", "MixUp", "GaussianNoise",
    "GaussianDropout", "AlphaDropout", "Dropout", "SpatialDropout1D", "SpatialDropout2D",
    "SpatialDropout3D")


@dataclasses.dataclass
class SwappedLayer:
    """One swapped layer of an exported model, as recorded in the export's metadata."""

    index: int
    path: str             # nested path, "outer/inner/fc1"
    name: str
    layer_type: str       # the stock layer it stands for ("Dense", "Conv2D", "DepthwiseConv2D", ...)
    kernel: dict          # the kernel config stored in the layer ({"spec": ...}, + path/sha256)
    description: str
    backward: str
    onnx_nodes: list = dataclasses.field(default_factory=list)
    quantization: dict | None = None   # the layer's QuantScheme config (static range included)
    part_quantizations: list | None = None    # per product, when a layer has several
    corrected: bool = False     # the layer applies an output correction (gain / offset)

    def to_dict(self) -> dict:
        record = {"layer": self.path, "name": self.name, "type": self.layer_type,
                  "kernel": self.kernel, "kernel_spec": self.kernel.get("spec"),
                  "description": self.description, "backward": self.backward}
        if self.quantization is not None:
            record["quantization"] = self.quantization
        if self.part_quantizations and len(self.part_quantizations) > 1:
            record["part_quantizations"] = self.part_quantizations
        if self.onnx_nodes:
            record["onnx_nodes"] = list(self.onnx_nodes)
        return record


def _plain_config(layer) -> dict:
    if type(layer) in RECURRENT_STOCK:
        return recurrent_stock_config(layer)
    config = layer.get_config()
    config.pop("arithmetic", None)
    config.pop("swap_kernel", None)
    config.pop("backward", None)
    config.pop("quantization", None)
    config.pop("output_correction", None)
    config.pop("intermediate_ranges", None)
    config.pop("projection_states", None)
    return config


class MarkedDense(keras.layers.Dense):
    """Dense whose ops sit in a name scope that marks the swapped layer it stands for."""

    graphswap_marker = ""

    def call(self, inputs, training=None):
        with tf.name_scope(self.graphswap_marker):
            return super().call(inputs, training=training)


class MarkedConv2D(keras.layers.Conv2D):
    """Conv2D in a marking name scope (grouped / channels_first ones as NHWC Conv2D ops)."""

    graphswap_marker = ""

    def call(self, inputs):
        with tf.name_scope(self.graphswap_marker):
            return super().call(inputs)

    def convolution_op(self, inputs, kernel):
        # Keras runs grouped convolutions inside a jit_compile tf.function, which tf2onnx
        # cannot convert (a StatefulPartitionedCall is left), and NCHW Conv2D does not run on
        # CPU: compute those in NHWC, one plain Conv2D per group (what the kernels compute).
        if self.groups == 1 and self.data_format != "channels_first":
            return super().convolution_op(inputs, kernel)
        channels_first = self.data_format == "channels_first"
        x = tf.transpose(inputs, [0, 2, 3, 1]) if channels_first else inputs
        parts = [tf.nn.convolution(x_group, w_group, strides=list(self.strides),
                                   padding=str(self.padding).upper(),
                                   dilations=list(self.dilation_rate))
                 for x_group, w_group in zip(tf.split(x, self.groups, axis=3),
                                             tf.split(kernel, self.groups, axis=3))]
        y = parts[0] if len(parts) == 1 else tf.concat(parts, axis=3)
        return tf.transpose(y, [0, 3, 1, 2]) if channels_first else y


class MarkedTimeDistributed(FoldedTimeDistributed):
    """TimeDistributed in a marking name scope, the timesteps folded into one call of its (marked)
    layer: one product node whatever the number of steps, known or not."""

    graphswap_marker = ""

    def call(self, inputs, training=None, mask=None):
        with tf.name_scope(self.graphswap_marker):
            return fold_time_steps(self.layer, inputs, training, mask)


class MarkedLayer:
    """Mixin: the layer's ops in a marking name scope (for the stock classes beyond Dense/Conv2D,
    which compute without XLA functions on CPU as they are)."""

    graphswap_marker = ""

    def __call__(self, *args, **kwargs):
        with tf.name_scope(self.graphswap_marker):
            return super().__call__(*args, **kwargs)


class MarkedConv1D(MarkedLayer, keras.layers.Conv1D):
    """Conv1D; a grouped one as one NHWC Conv2D per group (Keras runs grouped convolutions in an
    XLA function tf2onnx cannot convert)."""

    def call(self, inputs):
        if self.groups == 1:
            return super().call(inputs)
        x = tf.transpose(inputs, [0, 2, 1]) if self.data_format == "channels_first" else inputs
        padding = self.padding
        if padding == "causal":
            x = tf.pad(x, [[0, 0], [self.dilation_rate[0] * (self.kernel_size[0] - 1), 0], [0, 0]])
            padding = "valid"
        x = tf.expand_dims(x, 1)
        kernel = tf.expand_dims(self.kernel, 0)
        parts = [tf.nn.convolution(x_group, w_group, strides=[1, self.strides[0]],
                                   padding=str(padding).upper(),
                                   dilations=[1, self.dilation_rate[0]])
                 for x_group, w_group in zip(tf.split(x, self.groups, axis=3),
                                             tf.split(kernel, self.groups, axis=3))]
        y = tf.squeeze(tf.concat(parts, axis=3), [1])
        if self.use_bias:
            y = tf.add(y, self.bias)
        if self.data_format == "channels_first":
            y = tf.transpose(y, [0, 2, 1])
        return self.activation(y) if self.activation is not None else y


def _marked(stock):
    """The stock class in a marking name scope, as it computes (no XLA functions on CPU)."""
    return type(f"Marked{stock.__name__}", (MarkedLayer, stock), {})


#: layer kind (graphswap.swap.kinds) -> the marking version of its stock class, every kind
#: (tests/test_architecture.py checks)
MARKED_CLASSES = {
    "Dense": MarkedDense,
    "Conv2D": MarkedConv2D,
    "DepthwiseConv2D": _marked(keras.layers.DepthwiseConv2D),
    "SeparableConv2D": _marked(keras.layers.SeparableConv2D),
    "Conv1D": MarkedConv1D,
    "Conv2DTranspose": _marked(keras.layers.Conv2DTranspose),
    "EinsumDense": _marked(keras.layers.EinsumDense),
    "MultiHeadAttention": _marked(keras.layers.MultiHeadAttention),
    "LSTM": _marked(keras.layers.LSTM),
    "GRU": _marked(keras.layers.GRU),
    "SimpleRNN": _marked(keras.layers.SimpleRNN),
    "RNN": _marked(keras.layers.RNN),
    "Bidirectional": _marked(keras.layers.Bidirectional),
    "TimeDistributed": MarkedTimeDistributed,
}


def _is_swapped(layer) -> bool:
    return isinstance(layer, SWAPPED_CLASSES)


def swapped_layers(model) -> list[SwappedLayer]:
    """The swapped layers of `model` (nested models and custom layers included), in traversal
    order."""
    records = []
    for path, layer in iter_layers(model):
        if _is_swapped(layer):
            records.append(_record(len(records), path, layer))
        elif _holds_swaps(layer):
            for inner_path, inner in _swapped_inside(layer, path + "/"):
                records.append(_record(len(records), inner_path, inner))
    return records


def _holds_swaps(layer) -> bool:
    """A custom layer of a functional model whose held layers were swapped."""
    return bool(getattr(layer, "graphswap_swaps", None)) and is_custom_container(layer)


def _swapped_inside(layer, prefix):
    """(path, swapped layer) of the swapped layers a custom layer holds, at any depth."""
    for _, inner in held_layers(layer):
        path = f"{prefix}{inner.name}"
        if _is_swapped(inner):
            yield path, inner
        elif not isinstance(inner, keras.Model):
            yield from _swapped_inside(inner, path + "/")


def _unswapped_custom_layer(layer):
    """An unbuilt copy of a custom layer with its own (stock) layers: the class and config it had
    before its held layers were swapped."""
    base = type(layer).graphswap_base
    return base.from_config(base.get_config(layer))


def _record(index, path, layer) -> SwappedLayer:
    return SwappedLayer(index=index, path=path, name=layer.name,
                        layer_type=type_name(layer) or type(layer).__name__,
                        kernel=layer.arithmetic.to_config(),
                        description=getattr(layer.arithmetic, "description", ""),
                        backward=layer.backward,
                        quantization=None if getattr(layer, "quantization", None) is None
                        else layer.current_quantization().to_config(),
                        part_quantizations=[scheme.to_config() for scheme in layer.part_schemes()]
                        if getattr(layer, "quantization", None) is not None else None,
                        corrected=getattr(layer, "output_correction", None) is not None)


def lower_model(model, marked: bool = False, keep=()):
    """A copy of `model` with every swapped layer replaced by its stock layer (same weights).

    Returns (lowered_model, [SwappedLayer, ...]).  The lowered model computes what `model` computes
    with the exact kernel.  With `marked=True` the replacements put their ops in a name scope
    "graphswap_export_<index>" (used to find them in the ONNX graph).  Swapped layers at the
    paths in `keep` stay swapped (the reference of an ONNX export whose FP8 layers are QDQ).
    """
    def class_of(layer):
        return MARKED_CLASSES[type_name(layer)] if marked else stock_class(layer)

    return _replace_swapped(model, class_of, _plain_config, keep=keep, inference=marked)


def kept_kernel_model(model):
    """A copy of `model` whose swapped layers call their kernel through marked PyFuncs (recurrent
    layers: their cells' products, inside the RNN loop; custom layers: a copy of the layer with
    the swapped layers it holds kept the same way).  Each record gets `layer`, its kept layer."""
    def class_of(layer):
        if type_name(layer) not in KEPT_CLASSES:
            raise ExportError(
                f"layer {layer.name!r} ({type_name(layer)}): the kept-kernel ONNX export does not "
                f"cover layers of type {type(layer).__name__}; export it lowered (exact float32 "
                f"arithmetic, without --keep-kernels)")
        return KEPT_CLASSES[type_name(layer)]

    def custom(path, layer, keep):
        try:
            copy = copy_custom_layer(layer)
            swap_layers(copy, built_replacement(
                lambda inner_path, inner: keep(inner_path, inner) if _is_swapped(inner) else None),
                prefix=path + "/", paths=layer_paths(layer, path + "/"))
        except ExportError:
            raise
        except GraphswapError as exc:
            raise ExportError(f"custom layer {layer.name!r} holds swapped layers, and its copy "
                              f"for the kept-kernel ONNX export failed: {exc}; export it lowered "
                              f"(exact float32 arithmetic, without --keep-kernels)") from None
        return copy

    return _replace_swapped(model, class_of, _config_keeping_arithmetic, custom, inference=True)


def inference_identity(layer) -> bool:
    """True for a layer that is the identity at inference (INFERENCE_IDENTITY, exact class)."""
    return any(type(layer) is getattr(keras.layers, name, None) for name in INFERENCE_IDENTITY)


def _replace_swapped(model, class_of, config_of, custom=None, keep=(), inference=False):
    records: list[SwappedLayer] = []

    def swap_one(path, layer):
        record = _record(len(records), path, layer)
        records.append(record)
        new_layer = _replacement(layer, class_of, config_of)
        cls = type(new_layer)
        if hasattr(cls, "graphswap_marker"):
            mark(new_layer, MARKER.format(index=record.index))
        if hasattr(cls, "onnx_node"):
            record.layer = new_layer
        return new_layer

    def replace(path, layer):
        if inference and inference_identity(layer):
            return keras.layers.Identity(name=layer.name, dtype=layer.dtype_policy)
        if inference and type(layer) is keras.layers.TimeDistributed and \
                not is_custom_layer(layer.layer) and (input_shape_of(layer) or (0, 0))[1] is None:
            return folded_copy(layer)   # tf2onnx mistranslates its loop over unknown steps
        if path in keep:
            return None
        if _holds_swaps(layer):
            if custom is not None:
                return custom(path, layer, swap_one)
            for inner_path, inner in _swapped_inside(layer, path + "/"):
                records.append(_record(len(records), inner_path, inner))
            return _unswapped_custom_layer(layer)
        if not _is_swapped(layer):
            return None
        return swap_one(path, layer)

    new_model, _ = transform_model(model, replace)
    return new_model, records


def _replacement(layer, class_of, config_of):
    """class_of(layer) made from config_of(layer); a wrapper (TimeDistributed) around the
    replacement of the layer it wraps (made the same way)."""
    kind = of_layer(layer)
    if kind is not None and kind.wrapped is not None:
        config = {key: value for key, value in layer.get_config().items() if key != "layer"}
        return class_of(layer)(_replacement(kind.wrapped(layer), class_of, config_of), **config)
    return class_of(layer).from_config(config_of(layer))


def _config_keeping_arithmetic(layer) -> dict:
    """The swapped layer's config with its resolved arithmetic (no second trip through the gate)."""
    return {**layer.get_config(), "arithmetic": layer.arithmetic}

