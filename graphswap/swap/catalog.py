"""Which stock Keras layer becomes which swapped layer: the one table rewrite_model, the report,
the exports and `convert --layer-types` read.  TimeDistributed is swapped when the layer it wraps
is (graphswap.swap.layers_wrapped: the wrapped layer swapped by this table, timesteps folded into
one call).

A layer is swapped only when its class is exactly the stock class (a user's subclass of Dense
has its own call() and is reported, not swapped).  The swapped class is made from the stock
layer's config plus the arithmetic and the backward mode; its constructor refuses, naming the
layer and the option, whatever it cannot mirror.
"""

from __future__ import annotations

import keras

from graphswap.swap.layers import (SwappedConv2D, SwappedDense, check_conv_options, check_lut_grad,
                                   check_lut_grad_kernel)
from graphswap.swap.layers_attention import SwappedEinsumDense, SwappedMultiHeadAttention
from graphswap.swap.layers_conv import (SwappedConv1D, SwappedConv2DTranspose,
                                        SwappedDepthwiseConv2D, SwappedSeparableConv2D)
from graphswap.swap.layers_recurrent import (SwappedBidirectional, SwappedGRU, SwappedLSTM,
                                             SwappedRNN, SwappedSimpleRNN, recurrent_refusal,
                                             swapped_recurrent)
from graphswap.swap.layers_wrapped import SwappedTimeDistributed

#: type name -> (stock class, swapped class), in the order reports list them
CATALOG = {
    "Dense": (keras.layers.Dense, SwappedDense),
    "Conv2D": (keras.layers.Conv2D, SwappedConv2D),
    "DepthwiseConv2D": (keras.layers.DepthwiseConv2D, SwappedDepthwiseConv2D),
    "SeparableConv2D": (keras.layers.SeparableConv2D, SwappedSeparableConv2D),
    "Conv1D": (keras.layers.Conv1D, SwappedConv1D),
    "Conv2DTranspose": (keras.layers.Conv2DTranspose, SwappedConv2DTranspose),
    "EinsumDense": (keras.layers.EinsumDense, SwappedEinsumDense),
    "MultiHeadAttention": (keras.layers.MultiHeadAttention, SwappedMultiHeadAttention),
    "LSTM": (keras.layers.LSTM, SwappedLSTM),
    "GRU": (keras.layers.GRU, SwappedGRU),
    "SimpleRNN": (keras.layers.SimpleRNN, SwappedSimpleRNN),
    "RNN": (keras.layers.RNN, SwappedRNN),
    "Bidirectional": (keras.layers.Bidirectional, SwappedBidirectional),
    "TimeDistributed": (keras.layers.TimeDistributed, SwappedTimeDistributed),
}
#: the recurrent types (their products sit in a cell, or two: graphswap.swap.layers_recurrent)
RECURRENT_TYPES = ("LSTM", "GRU", "SimpleRNN", "RNN", "Bidirectional")

#: every type graphswap swaps (the default selection)
LAYER_TYPES = tuple(CATALOG)
#: the stock class of each type
SWAPPABLE_TYPES = {name: stock for name, (stock, _) in CATALOG.items()}
SWAPPED_CLASSES = tuple(swapped for _, swapped in CATALOG.values())
_BY_STOCK = {stock: name for name, (stock, _) in CATALOG.items()}
_BY_SWAPPED = {swapped: name for name, (_, swapped) in CATALOG.items()}


def type_name(layer) -> str | None:
    """The catalog name of a stock or swapped layer (None for anything else)."""
    return _BY_STOCK.get(type(layer)) or _BY_SWAPPED.get(type(layer))


def is_swapped(layer) -> bool:
    return type(layer) in _BY_SWAPPED


def is_swappable_family(layer) -> bool:
    """An instance of a swappable stock class (possibly a user's subclass of it); a
    TimeDistributed when the layer it wraps is."""
    if isinstance(layer, keras.layers.TimeDistributed):
        return is_swappable_family(layer.layer)
    return isinstance(layer, tuple(SWAPPABLE_TYPES.values()))


def refusal(layer) -> str | None:
    """Why a layer of a swappable type cannot be swapped as it is (None: it can) - a generic RNN
    or Bidirectional around something that is not a stock LSTM/GRU/SimpleRNN cell or layer, a
    TimeDistributed around a user's subclass or a layer that cannot be swapped."""
    if type_name(layer) in RECURRENT_TYPES and not is_swapped(layer):
        return recurrent_refusal(layer)
    if type_name(layer) == "TimeDistributed" and not is_swapped(layer):
        inner = layer.layer
        if type_name(inner) is None:
            return (f"wraps {type(inner).__name__} {inner.name!r}, a subclass of a swappable "
                    f"layer (its own call()): not swapped")
        reason = refusal(inner)
        return f"its {type(inner).__name__} {inner.name!r} {reason}" if reason else None
    return None


def float_wrapper_reason(layer) -> str:
    """Why a TimeDistributed stays float ("" when what it wraps is swappable)."""
    if is_swappable_family(layer):
        return ""
    return (f"TimeDistributed around a {type(layer.layer).__name__}, which graphswap does not "
            f"swap: it runs in float")


def stock_class(swapped_layer):
    """The stock Keras class a swapped layer stands for."""
    return CATALOG[_BY_SWAPPED[type(swapped_layer)]][0]


def swapped_from(layer, arithmetic, backward: str, quantization=None):
    """A swapped copy (unbuilt, same config) of the stock `layer`; refuses what it cannot mirror.
    `quantization`: the QuantScheme config of a multiplier kernel (None: the defaults)."""
    name = _BY_STOCK[type(layer)]
    if name == "Conv2D":
        check_conv_options(layer)
    # before from_config, which Keras would wrap an error of in a TypeError
    check_lut_grad(CATALOG[name][1], layer.name, backward)
    check_lut_grad_kernel(arithmetic, layer.name, backward)
    if name in RECURRENT_TYPES:
        return swapped_recurrent(layer, arithmetic, backward, quantization)
    if name == "TimeDistributed":   # the wrapped layer swapped by this table
        config = {key: value for key, value in layer.get_config().items() if key != "layer"}
        return SwappedTimeDistributed(swapped_from(layer.layer, arithmetic, backward,
                                                   quantization), **config)
    config = layer.get_config()
    return CATALOG[name][1].from_config({**config, "arithmetic": arithmetic,
                                         "backward": backward, "quantization": quantization})
