"""Dense: one matmul over the last axis (graphswap.swap.layers.SwappedDense)."""

from __future__ import annotations

import keras

from graphswap.swap.kinds.counting import prod
from graphswap.swap.kinds.registry import BatchNormFold, LayerKind, register
from graphswap.swap.layers import SwappedDense


def dense_macs(layer, shape) -> int:
    """Every position before the last axis x inputs x units."""
    return prod(shape[1:-1]) * int(shape[-1]) * int(layer.units)


KIND = register(LayerKind(name="Dense", stock=keras.layers.Dense, swapped=SwappedDense,
                          macs=dense_macs, fold=BatchNormFold()))
