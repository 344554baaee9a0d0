"""Bidirectional around a recurrent layer (graphswap.swap.layers_recurrent.SwappedBidirectional):
both directions' cells swapped."""

from __future__ import annotations

import keras

from graphswap.swap.kinds.counting import recurrent_macs
from graphswap.swap.kinds.registry import LayerKind, register
from graphswap.swap.layers_recurrent import (SwappedBidirectional, recurrent_refusal,
                                             swapped_recurrent)

KIND = register(LayerKind(name="Bidirectional", stock=keras.layers.Bidirectional,
                          swapped=SwappedBidirectional, macs=recurrent_macs,
                          # swapped through its directions' cells; only stock ones are
                          build=swapped_recurrent, refuse=recurrent_refusal, recurrent=True))
