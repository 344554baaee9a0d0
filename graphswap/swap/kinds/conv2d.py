"""Conv2D (graphswap.swap.layers.SwappedConv2D).  Its MAC count is every plain convolution's:
Conv1D and Conv3D too, and a user's subclass of them."""

from __future__ import annotations

import keras
from keras.src.layers.convolutional.base_conv import BaseConv  # Keras 3 has no public bases

from graphswap.swap.kinds.counting import conv_macs
from graphswap.swap.kinds.registry import BatchNormFold, LayerKind, register
from graphswap.swap.layers import SwappedConv2D, check_conv_options

KIND = register(LayerKind(name="Conv2D", stock=keras.layers.Conv2D, swapped=SwappedConv2D,
                          macs=conv_macs, counted=(BaseConv,), fold=BatchNormFold(),
                          # options the swapped Conv2D cannot mirror, refused before building
                          check=check_conv_options))
