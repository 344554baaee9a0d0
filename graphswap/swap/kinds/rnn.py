"""RNN (graphswap.swap.layers_recurrent.SwappedRNN) around a stock LSTM/GRU/SimpleRNN cell or a
stack of them: its cells' products, step by step.  Its MAC count covers every RNN subclass
(ConvLSTM2D too: cells without 2-D kernels count 0)."""

from __future__ import annotations

import keras

from graphswap.swap.kinds.counting import recurrent_macs
from graphswap.swap.kinds.registry import LayerKind, register
from graphswap.swap.layers_recurrent import SwappedRNN, recurrent_refusal, swapped_recurrent

KIND = register(LayerKind(name="RNN", stock=keras.layers.RNN, swapped=SwappedRNN,
                          macs=recurrent_macs,
                          # the cell is swapped, not the layer; only stock cells are
                          build=swapped_recurrent, refuse=recurrent_refusal, recurrent=True))
