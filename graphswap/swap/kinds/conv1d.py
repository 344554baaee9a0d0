"""Conv1D (graphswap.swap.layers_conv.SwappedConv1D), counted like every plain convolution."""

from __future__ import annotations

import keras

from graphswap.swap.kinds.counting import conv_macs
from graphswap.swap.kinds.registry import BatchNormFold, LayerKind, register
from graphswap.swap.layers_conv import SwappedConv1D

KIND = register(LayerKind(name="Conv1D", stock=keras.layers.Conv1D, swapped=SwappedConv1D,
                          macs=conv_macs, fold=BatchNormFold()))
