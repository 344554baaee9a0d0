"""SimpleRNN (graphswap.swap.layers_recurrent.SwappedSimpleRNN): its input and recurrent products,
step by step inside its cell."""

from __future__ import annotations

import keras

from graphswap.swap.kinds.counting import recurrent_macs
from graphswap.swap.kinds.registry import LayerKind, register
from graphswap.swap.layers_recurrent import SwappedSimpleRNN, recurrent_refusal, swapped_recurrent

KIND = register(LayerKind(name="SimpleRNN", stock=keras.layers.SimpleRNN, swapped=SwappedSimpleRNN,
                          macs=recurrent_macs,
                          # the cell is swapped, not the layer; only stock cells are
                          build=swapped_recurrent, refuse=recurrent_refusal, recurrent=True))
