"""DepthwiseConv2D (graphswap.swap.layers_conv.SwappedDepthwiseConv2D); its MAC count also
covers DepthwiseConv1D."""

from __future__ import annotations

import keras
from keras.src.layers.convolutional.base_depthwise_conv import BaseDepthwiseConv

from graphswap.swap.kinds.counting import channels, output_positions, prod
from graphswap.swap.kinds.registry import BatchNormFold, LayerKind, register
from graphswap.swap.layers_conv import SwappedDepthwiseConv2D


def depthwise_macs(layer, shape) -> int:
    """Output positions x input channels x multiplier x taps."""
    taps = prod(layer.kernel_size)
    return output_positions(layer, shape) * channels(shape, layer) * int(
        layer.depth_multiplier) * taps


KIND = register(LayerKind(name="DepthwiseConv2D", stock=keras.layers.DepthwiseConv2D,
                          swapped=SwappedDepthwiseConv2D, macs=depthwise_macs,
                          counted=(BaseDepthwiseConv,),
                          # kernel (h, w, in, multiplier): output channel c = i * multiplier + m
                          fold=BatchNormFold(depthwise=True)))
