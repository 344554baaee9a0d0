"""GRU (graphswap.swap.layers_recurrent.SwappedGRU): the three gates' input and recurrent
products (and r * h), step by step inside its cell."""

from __future__ import annotations

import keras

from graphswap.swap.kinds.counting import recurrent_macs
from graphswap.swap.kinds.registry import LayerKind, register
from graphswap.swap.layers_recurrent import SwappedGRU, recurrent_refusal, swapped_recurrent

KIND = register(LayerKind(name="GRU", stock=keras.layers.GRU, swapped=SwappedGRU,
                          macs=recurrent_macs,
                          # the cell is swapped, not the layer; only stock cells are
                          build=swapped_recurrent, refuse=recurrent_refusal, recurrent=True))
