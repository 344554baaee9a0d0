"""TimeDistributed (graphswap.swap.layers_wrapped.SwappedTimeDistributed): swapped when the layer
it wraps is, that layer swapped by its own kind and called once on the timesteps folded into the
batch."""

from __future__ import annotations

import keras

from graphswap.swap.kinds.counting import weight_macs
from graphswap.swap.kinds.registry import LayerKind, of_layer, refusal, register, swapped_from
from graphswap.swap.layers_wrapped import SwappedTimeDistributed


def time_distributed_macs(layer, shape) -> int:
    """Timesteps x the wrapped layer's."""
    if len(shape) < 3 or not layer.layer.built:
        return 0
    return int(shape[1]) * weight_macs(layer.layer, (shape[0], *shape[2:]))


def swapped_wrapper(layer, arithmetic, backward, quantization):
    """The wrapper around the swapped copy of its layer (same config otherwise)."""
    config = {key: value for key, value in layer.get_config().items() if key != "layer"}
    return SwappedTimeDistributed(swapped_from(layer.layer, arithmetic, backward, quantization),
                                  **config)


def wrapper_refusal(layer) -> str | None:
    """A TimeDistributed around a user's subclass, or around a layer that cannot be swapped."""
    inner = layer.layer
    if of_layer(inner) is None:
        return (f"wraps {type(inner).__name__} {inner.name!r}, a subclass of a swappable "
                f"layer (its own call()): not swapped")
    reason = refusal(inner)
    return f"its {type(inner).__name__} {inner.name!r} {reason}" if reason else None


KIND = register(LayerKind(name="TimeDistributed", stock=keras.layers.TimeDistributed,
                          swapped=SwappedTimeDistributed, macs=time_distributed_macs,
                          build=swapped_wrapper, refuse=wrapper_refusal,
                          wrapped=lambda layer: layer.layer))
