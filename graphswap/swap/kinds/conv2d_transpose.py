"""Conv2DTranspose (graphswap.swap.layers_conv.SwappedConv2DTranspose); its MAC count also
covers Conv1DTranspose and Conv3DTranspose."""

from __future__ import annotations

import keras
from keras.src.layers.convolutional.base_conv_transpose import BaseConvTranspose

from graphswap.swap.kinds.counting import channels, prod, spatial
from graphswap.swap.kinds.registry import LayerKind, register
from graphswap.swap.layers_conv import SwappedConv2DTranspose


def transpose_macs(layer, shape) -> int:
    """Input positions x taps x input channels x filters (the products with inserted zeros that
    the kernel also computes are not counted)."""
    taps = prod(layer.kernel_size)
    return prod(spatial(shape, layer)) * taps * channels(shape, layer) * int(layer.filters)


KIND = register(LayerKind(name="Conv2DTranspose", stock=keras.layers.Conv2DTranspose,
                          swapped=SwappedConv2DTranspose, macs=transpose_macs,
                          counted=(BaseConvTranspose,)))
