"""SeparableConv2D: a depthwise then a pointwise convolution
(graphswap.swap.layers_conv.SwappedSeparableConv2D); its MAC count also covers SeparableConv1D."""

from __future__ import annotations

import keras
from keras.src.layers.convolutional.base_separable_conv import BaseSeparableConv

from graphswap.swap.kinds.counting import channels, output_positions, prod
from graphswap.swap.kinds.registry import BatchNormFold, LayerKind, register
from graphswap.swap.layers_conv import SwappedSeparableConv2D


def separable_macs(layer, shape) -> int:
    """Output positions x (the depthwise products + the pointwise ones)."""
    taps = prod(layer.kernel_size)
    middle = channels(shape, layer) * int(layer.depth_multiplier)
    return output_positions(layer, shape) * (middle * taps + middle * int(layer.filters))


KIND = register(LayerKind(name="SeparableConv2D", stock=keras.layers.SeparableConv2D,
                          swapped=SwappedSeparableConv2D, macs=separable_macs,
                          counted=(BaseSeparableConv,),
                          # the BN folds into the pointwise kernel; the depthwise one stays
                          fold=BatchNormFold(kernel="pointwise_kernel",
                                             kept=("depthwise_kernel",))))
