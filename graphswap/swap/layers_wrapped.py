"""`SwappedTimeDistributed`: TimeDistributed around any swapped layer (every type of
graphswap.swap.catalog: Conv2D, Dense, DepthwiseConv2D, Conv1D, ..., recurrent layers).

Keras' TimeDistributed calls its layer once per timestep (a Python loop when the number of steps
is known, `vectorized_map` when it is not).  The swapped one folds the timesteps into the batch,
(batch, steps, ...) -> (batch x steps, ...), calls the wrapped swapped layer once and unfolds its
output (`fold_time_steps`): one kernel call per layer call, whatever the number of steps, known or
not, and the same products (every timestep of every sample is one sample of the call).  With
dynamic activation ranges (per call, without calibration) that call's range covers every timestep
of the batch - as a convolution's covers every position - where a loop would take one range per
timestep; calibrated (static) ranges do not depend on the call.

The wrapped layer holds the arithmetic and the quantization state: calibration, bias
compensation, weight tuning, the report and the exports reach it through `quantized_parts()`
(path "td/conv2d"; a wrapped layer with parts of its own - a recurrent layer's cells, attention's
projections - hands those on as "td/lstm/cell"), and its observer sees its input with the
timesteps folded into the batch.  The config is TimeDistributed's: the wrapped layer's own config
carries its record, read back through the trust gate.  An "arithmetic" given beside a stock
wrapped layer (a lowered model swapped again) swaps that layer with it.
"""

from __future__ import annotations

import copy

import keras
import tensorflow as tf

from graphswap.errors import UnsupportedLayerError
from graphswap.kernels import Kernel, open_record, resolve_kernel
from graphswap.swap.xla import RunsOutsideXla

SWAP_KEYS = ("arithmetic", "backward", "quantization")


def computes_with_kernel(layer) -> bool:
    """Whether `layer` is a swapped layer (its products run a graphswap Kernel)."""
    return isinstance(getattr(layer, "arithmetic", None), Kernel)


def swapped_stock_layer(layer, arithmetic, backward="native", quantization=None):
    """A swapped copy (unbuilt, same config) of the stock Keras layer `layer`, found by the
    swapped class's registered name ("graphswap>Swapped" + the stock class name)."""
    stock = type(layer)
    swapped = keras.saving.get_registered_object(f"graphswap>Swapped{stock.__name__}")
    if getattr(keras.layers, stock.__name__, None) is not stock or swapped is None:
        raise UnsupportedLayerError(
            f"layer {layer.name!r}: graphswap does not swap a {stock.__name__} (inside "
            f"TimeDistributed)")
    swap = {"arithmetic": arithmetic, "backward": backward, "quantization": quantization}
    return swapped.from_config({**layer.get_config(),
                                **{key: value for key, value in swap.items()
                                   if value is not None}})


def fold_time_steps(layer, inputs, training=None, mask=None):
    """`layer` applied to every timestep of `inputs` (batch, steps, ...) as ONE call of its
    `call` on (batch x steps, ...), the output unfolded to (batch, steps, ...)."""
    shape = tf.shape(inputs)
    folded = tf.reshape(inputs, tf.concat([[-1], shape[2:]], axis=0))
    folded.set_shape(tf.TensorShape([None]).concatenate(inputs.shape[2:]))
    kwargs = {}
    if layer._call_has_mask_arg and mask is not None:
        kwargs["mask"] = tf.reshape(mask, tf.concat([[-1], tf.shape(mask)[2:]], axis=0))
    if layer._call_has_training_arg:
        kwargs["training"] = training
    outputs = layer.call(folded, **kwargs)
    unfolded = tf.reshape(outputs, tf.concat([shape[:2], tf.shape(outputs)[1:]], axis=0))
    unfolded.set_shape(inputs.shape[:2].concatenate(outputs.shape[1:]))
    return unfolded


class FoldedTimeDistributed(keras.layers.TimeDistributed):
    """TimeDistributed with its timesteps folded into one call of its layer (`fold_time_steps`).
    Exports hold a stock TimeDistributed over an unknown number of steps as this: tf2onnx
    mistranslates Keras' `vectorized_map` loop (its ONNX output had batch-size steps)."""

    def call(self, inputs, training=None, mask=None):
        return fold_time_steps(self.layer, inputs, training, mask)


def folded_copy(layer) -> FoldedTimeDistributed:
    """An unbuilt FoldedTimeDistributed copy of a stock TimeDistributed (same configs)."""
    inner = layer.layer
    config = {key: value for key, value in layer.get_config().items() if key != "layer"}
    return FoldedTimeDistributed(type(inner).from_config(inner.get_config()), **config)


@keras.saving.register_keras_serializable(package="graphswap")
class SwappedTimeDistributed(RunsOutsideXla, FoldedTimeDistributed):
    """TimeDistributed around a swapped layer, the timesteps folded into one call (module
    docstring)."""

    lut_grad_supported = True   # the wrapped layer's own type decides (checked when it is made)

    def __init__(self, layer, arithmetic=None, backward="native", quantization=None, **kwargs):
        if not computes_with_kernel(layer):
            if arithmetic is None:
                raise UnsupportedLayerError(
                    f"layer {kwargs.get('name')!r}: SwappedTimeDistributed wraps a swapped layer "
                    f"(or a stock one with arithmetic=); got a stock {type(layer).__name__}")
            layer = swapped_stock_layer(layer, resolve_kernel(arithmetic), backward, quantization)
        super().__init__(layer, **kwargs)

    @classmethod
    def from_config(cls, config, custom_objects=None):
        """TimeDistributed's from_config; an "arithmetic" beside the wrapped layer swaps a stock
        wrapped layer (a record from a file passes the trust gate) and, when it is the swapped
        wrapped layer's own (a clone), is handed to it resolved."""
        swap = {key: config[key] for key in SWAP_KEYS if key in config}
        config = copy.deepcopy({key: value for key, value in config.items() if key not in swap})
        arithmetic = swap.get("arithmetic")
        if arithmetic is not None and not isinstance(arithmetic, Kernel):
            arithmetic = swap["arithmetic"] = open_record(arithmetic,
                                                          f"layer {config.get('name')!r}")
        inner = config.pop("layer")
        inner_config = inner.get("config") if isinstance(inner, dict) else None
        if isinstance(arithmetic, Kernel) and isinstance(inner_config, dict) and \
                inner_config.get("arithmetic") == arithmetic.to_config():
            inner_config["arithmetic"] = arithmetic   # the file is not read again
        layer = keras.saving.deserialize_keras_object(inner, custom_objects=custom_objects)
        return cls(layer, **config, **swap)

    # -- the wrapped layer's arithmetic and quantization state ---------------------------------
    @property
    def arithmetic(self):
        return self.layer.arithmetic

    @property
    def backward(self):
        return self.layer.backward

    def quantized_parts(self) -> dict:
        """{name: the layer holding a product's state}: the wrapped layer, or its own parts."""
        parts = getattr(self.layer, "quantized_parts", None)
        if parts is None:
            return {self.layer.name: self.layer}
        return {f"{self.layer.name}/{name}": part for name, part in parts().items()}

    @property
    def quantization(self):
        return getattr(self.layer, "quantization", None)

    def current_quantization(self, point=None):
        return self.layer.current_quantization(point)

    def part_schemes(self) -> list:
        return self.layer.part_schemes()

    @property
    def output_correction(self):
        return getattr(self.layer, "output_correction", None)
