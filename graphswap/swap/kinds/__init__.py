"""The layer kinds graphswap swaps, one module each, registered in the order reports list them.

registry holds LayerKind and the lookups (by name, stock class, swapped class); counting the MAC
count every kind's formula plugs into.  Importing this package imports every kind module, in
report order, so the registry is complete.  Adding a kind: docs/ARCHITECTURE.md, "Adding a layer
kind".
"""

# the import order is the registry's order: the report order, and LAYER_TYPES'
from graphswap.swap.kinds import dense, conv2d, depthwise_conv2d, separable_conv2d  # isort: skip
from graphswap.swap.kinds import conv1d, conv2d_transpose, einsum_dense  # isort: skip
from graphswap.swap.kinds import multi_head_attention, lstm, gru, simple_rnn, rnn  # isort: skip
from graphswap.swap.kinds import bidirectional, time_distributed  # isort: skip
from graphswap.swap.kinds.registry import (BatchNormFold, LayerKind, all_kinds, by_name,
                                           by_stock, by_swapped, counting_kind, folding_kind,
                                           is_swappable_family, of_layer, refusal, register,
                                           swapped_from)

#: the kind modules, each registering one LayerKind (tests/test_architecture.py checks)
KIND_MODULES = (dense, conv2d, depthwise_conv2d, separable_conv2d, conv1d, conv2d_transpose,
                einsum_dense, multi_head_attention, lstm, gru, simple_rnn, rnn, bidirectional,
                time_distributed)

__all__ = ["KIND_MODULES", "BatchNormFold", "LayerKind", "all_kinds", "by_name", "by_stock",
           "by_swapped", "counting_kind", "folding_kind", "is_swappable_family", "of_layer",
           "refusal", "register", "swapped_from"]
