"""EinsumDense: one einsum of the input and the kernel
(graphswap.swap.layers_attention.SwappedEinsumDense)."""

from __future__ import annotations

import keras

from graphswap.native import einsum_plan
from graphswap.swap.kinds.registry import LayerKind, register
from graphswap.swap.layers_attention import SwappedEinsumDense


def einsum_macs(layer, shape) -> int:
    return einsum_plan(layer.equation, len(shape)).macs(shape, tuple(layer.kernel.shape))


KIND = register(LayerKind(name="EinsumDense", stock=keras.layers.EinsumDense,
                          swapped=SwappedEinsumDense, macs=einsum_macs))
