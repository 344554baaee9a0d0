"""BatchNormalization folding: each Dense/Conv2D/Conv1D/DepthwiseConv2D/SeparableConv2D (the layer
kinds with a BatchNormFold, graphswap.swap.kinds, which says where their channels are) followed
by a BatchNormalization is replaced by one layer whose weights and bias absorb the normalization
(inference statistics), and the BatchNormalization by the identity (FoldedBatchNormalization) -
what an int8 accelerator executes, and what quantization must see (the folded weights are the
ones that get quantized).  A depthwise kernel (h, w, in, multiplier) has output channel
c = i * multiplier + m, so W[..., c] is its kernel[..., i, m]; a SeparableConv2D folds into its
pointwise kernel (its depthwise kernel, whose result is not normalized, stays).

With gamma, beta (1 and 0 when the BN has no scale / center), the moving mean mu and variance
sigma^2, and epsilon, per output channel c (float64, then float32):

    f_c = gamma_c / sqrt(sigma_c^2 + epsilon)
    W'[..., c] = W[..., c] * f_c          b'_c = (b_c - mu_c) * f_c + beta_c   (b = 0 without bias)

A pair is folded when the BN directly consumes the layer's output and nothing else does (in a
Sequential: the next layer; in a Functional graph: the only consumer, not a model output), the
layer has no activation, neither is shared (one call each), and the BN normalizes the layer's
channel axis (last; axis 1 for channels_first Conv2D).  Everything else is left as it is and
reported.  The folded model is a plain model: it trains (without the BN), saves, reloads and
exports.

A swapped layer keeps its arithmetic and quantization state (its input, hence its activation
range, is unchanged); an output correction y <- g y + o becomes g y' + f o (y' = f y is the folded
product).  With per-output-channel weight scales the folded weights have the same codes as the
unfolded ones (up to rounding ties) and y' = f y, so folding a calibrated, compensated model
whose BN statistics were re-estimated (graphswap.swap.compensation) keeps what those steps won.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np

from graphswap.swap.clone import is_functional, iter_layers, transform_model
from graphswap.swap.kinds import all_kinds, folding_kind

#: the stock classes a BatchNormalization folds into: the kinds with a BatchNormFold, in report
#: order (their subclasses and swapped layers fold too)
FOLDABLE_TYPES = tuple(kind.stock for kind in all_kinds() if kind.fold is not None)
FOLDABLE_NAMES = "/".join(t.__name__ for t in FOLDABLE_TYPES)


@keras.saving.register_keras_serializable(package="graphswap")
class FoldedBatchNormalization(keras.layers.Layer):
    """What a folded BatchNormalization becomes: the identity (its normalization now lives in the
    layer before).  Accepts the BN's call arguments, which a cloned graph replays."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, inputs, training=None, mask=None):
        return inputs

    def compute_output_shape(self, input_shape):
        return input_shape


@dataclasses.dataclass
class FoldReport:
    """Which pairs were folded, and why the other BatchNormalizations were not."""

    folded: list = dataclasses.field(default_factory=list)    # (layer path, bn path)
    skipped: list = dataclasses.field(default_factory=list)   # (bn path, reason)

    def lines(self) -> list[str]:
        if not self.folded and not self.skipped:
            return ["--fold-batchnorm: no BatchNormalization layer in the model; nothing folded"]
        lines = []
        if self.folded:
            lines.append(f"folded {len(self.folded)} BatchNormalization layer(s) into the layer "
                         f"before: " + ", ".join(f"{bn} -> {layer}" for layer, bn in self.folded))
        else:
            lines.append(f"--fold-batchnorm: no foldable {FOLDABLE_NAMES} + "
                         f"BatchNormalization pair; nothing folded")
        lines.extend(f"not folded: {bn} ({reason})" for bn, reason in self.skipped)
        return lines

    def to_dict(self) -> dict:
        return {"folded": [{"layer": layer, "batchnorm": bn} for layer, bn in self.folded],
                "skipped": [{"batchnorm": bn, "reason": reason} for bn, reason in self.skipped]}


def _containers(model):
    yield "", model
    for path, layer in iter_layers(model):
        if isinstance(layer, keras.Model) and layer is not model:
            yield path + "/", layer


def _channel_axis_ok(layer, bn) -> bool:
    axis = bn.axis if isinstance(bn.axis, int) else (bn.axis[0] if len(bn.axis) == 1 else None)
    if axis is None:
        return False
    rank = len(layer.output.shape)
    axis = axis % rank
    if getattr(layer, "data_format", "channels_last") == "channels_first":
        return axis == 1
    return axis == rank - 1


def _functional_consumers(model) -> dict:
    """{id(producing layer): number of uses of its output} inside a Functional graph."""
    uses: dict[int, int] = {}
    for nodes in model._nodes_by_depth.values():
        for node in nodes:
            for tensor in node.input_tensors:
                producer = tensor._keras_history.operation
                uses[id(producer)] = uses.get(id(producer), 0) + 1
    for tensor in model.outputs:
        producer = tensor._keras_history.operation
        uses[id(producer)] = uses.get(id(producer), 0) + 1
    return uses


def _producer_of(model, bn):
    """The layer feeding `bn` in container `model`, or None when it cannot be told."""
    if isinstance(model, keras.Sequential):
        layers = model.layers
        index = layers.index(bn)
        return layers[index - 1] if index > 0 else None
    if not is_functional(model):
        return None
    nodes = [node for nodes in model._nodes_by_depth.values() for node in nodes
             if node.operation is bn]
    if len(nodes) != 1 or len(nodes[0].input_tensors) != 1:
        return None
    return nodes[0].input_tensors[0]._keras_history.operation


def find_pairs(model) -> tuple[list, list]:
    """([(layer, bn, layer path, bn path)], [(bn path, reason)]) of foldable pairs."""
    pairs, skipped = [], []
    for prefix, container in _containers(model):
        if not (isinstance(container, keras.Sequential) or is_functional(container)):
            continue
        uses = _functional_consumers(container) if is_functional(container) and not isinstance(
            container, keras.Sequential) else None
        for bn in container.layers:
            if not isinstance(bn, keras.layers.BatchNormalization):
                continue
            bn_path = prefix + bn.name
            producer = _producer_of(container, bn)
            reason = None
            if producer is None:
                reason = "its input does not come from one layer of the same model"
            elif not isinstance(producer, FOLDABLE_TYPES):
                reason = f"it follows {type(producer).__name__} {producer.name!r}, not a " \
                         f"{FOLDABLE_NAMES}"
            elif getattr(producer.activation, "__name__", "linear") != "linear":
                reason = f"{producer.name!r} applies an activation before the normalization"
            elif uses is not None and uses.get(id(producer), 0) != 1:
                reason = f"the output of {producer.name!r} is also used elsewhere"
            elif uses is None and container.layers.index(bn) == 0:
                reason = "it is the first layer"
            elif not _channel_axis_ok(producer, bn):
                reason = f"it does not normalize the channel axis of {producer.name!r}"
            elif any(p[0] is producer for p in pairs):
                reason = f"{producer.name!r} is already folded with another normalization"
            if reason is None:
                pairs.append((producer, bn, prefix + producer.name, bn_path))
            else:
                skipped.append((bn_path, reason))
    return pairs, skipped


def fold_factor(bn, channels: int) -> np.ndarray:
    """f = gamma / sqrt(variance + epsilon) per channel (float64)."""
    gamma = np.asarray(bn.gamma, np.float64) if bn.scale else np.ones(channels)
    variance = np.asarray(bn.moving_variance, np.float64)
    return gamma / np.sqrt(variance + float(bn.epsilon))


def _output_kernel(layer):
    """The kernel whose last axes are the layer's output channels (its kind's BatchNormFold
    names it: SeparableConv2D's pointwise one)."""
    return getattr(layer, folding_kind(layer).fold.kernel)


def output_channels(layer) -> int:
    """Output channels of a foldable layer: the kernel's last axis, or for a depthwise kernel
    (h, w, in, multiplier) in * multiplier (output channel c = i * multiplier + m)."""
    shape = _output_kernel(layer).shape
    if folding_kind(layer).fold.depthwise:
        return int(shape[-2]) * int(shape[-1])
    return int(shape[-1])


def folded_weights(layer, bn) -> list[np.ndarray]:
    """The layer's weights with `bn` folded in (module docstring): [W', b'], or for a
    SeparableConv2D [depthwise kernel, pointwise W', b'] (its fold's `kept` weights first)."""
    fold = folding_kind(layer).fold
    kernel = np.asarray(_output_kernel(layer), dtype=np.float64)
    channels = output_channels(layer)
    bias = np.asarray(layer.bias, dtype=np.float64) if layer.use_bias else np.zeros(channels)
    beta = np.asarray(bn.beta, np.float64) if bn.center else np.zeros(channels)
    mean = np.asarray(bn.moving_mean, np.float64)
    factor = fold_factor(bn, channels)
    if fold.depthwise:   # channel c = i * multiplier + m
        scaled = kernel * factor.reshape(kernel.shape[-2:])
    else:
        scaled = kernel * factor
    folded = [scaled.astype(np.float32), ((bias - mean) * factor + beta).astype(np.float32)]
    return [np.asarray(getattr(layer, name), np.float32) for name in fold.kept] + folded


def fold_batchnorm(model):
    """(a copy of `model` with every foldable layer + BatchNormalization pair folded,
    FoldReport).  `model` is not modified; with nothing to fold the copy equals it."""
    pairs, skipped = find_pairs(model)
    by_layer = {id(layer): bn for layer, bn, _, _ in pairs}
    folded_bns = {id(bn) for _, bn, _, _ in pairs}
    new_weights: dict[int, list] = {}

    def replace(path, layer):
        if id(layer) in folded_bns:
            return FoldedBatchNormalization(name=layer.name)
        if id(layer) not in by_layer:
            return None
        config = {**layer.get_config(), "use_bias": True}
        arithmetic = getattr(layer, "arithmetic", None)
        if arithmetic is not None:
            config["arithmetic"] = arithmetic
        correction = config.get("output_correction")
        if correction and correction.get("offset") is not None:
            factor = fold_factor(by_layer[id(layer)], output_channels(layer))
            config["output_correction"] = {
                "gain": correction.get("gain"),
                "offset": [float(v) for v in np.asarray(correction["offset"]) * factor]}
        clone = type(layer).from_config(config)
        new_weights[id(layer)] = folded_weights(layer, by_layer[id(layer)])
        return clone

    def weights_of(original, clone):
        if id(original) in folded_bns:
            return []
        return new_weights.get(id(original))

    new_model, _ = transform_model(model, replace, weights=weights_of)
    report = FoldReport([(layer_path, bn_path) for _, _, layer_path, bn_path in pairs], skipped)
    return new_model, report
