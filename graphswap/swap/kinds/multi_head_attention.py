"""MultiHeadAttention (graphswap.swap.layers_attention.SwappedMultiHeadAttention): its weight
products are its projections (EinsumDense layers); the attention-score products Q K^T and
scores x V multiply activations by activations, run in float, and are counted apart."""

from __future__ import annotations

import keras

from graphswap.swap.kinds.counting import fixed, input_shape_of, layer_macs, prod
from graphswap.swap.kinds.registry import LayerKind, register
from graphswap.swap.layers_attention import SwappedMultiHeadAttention


def attention_macs(layer) -> tuple[int, int]:
    """(projection MACs, attention-score MACs) per sample of a built MultiHeadAttention."""
    query, value = getattr(layer, "_query_dense", None), getattr(layer, "_value_dense", None)
    output = getattr(layer, "_output_dense", None)
    inputs = [getattr(layer, a, None) for a in ("_query_dense", "_key_dense", "_gate_dense",
                                                "_value_dense")]
    projection_macs = sum(layer_macs(p) for p in inputs if p is not None)
    q_shape = fixed(input_shape_of(query)) if query is not None else None
    v_shape = fixed(input_shape_of(value)) if value is not None else None
    scores = 0
    if q_shape and None not in q_shape[1:]:
        targets = prod(q_shape[1:-1])
        if output is not None:  # Keras builds it with the sequence length unknown
            projection_macs += targets * prod(output.kernel.shape)
        if v_shape and None not in v_shape[1:]:
            scores = targets * prod(v_shape[1:-1]) * layer.num_heads * (layer.key_dim
                                                                        + layer.value_dim)
    return projection_macs, scores


KIND = register(LayerKind(name="MultiHeadAttention", stock=keras.layers.MultiHeadAttention,
                          swapped=SwappedMultiHeadAttention,
                          # counted through its projections' own input shapes
                          macs=lambda layer, shape: attention_macs(layer)[0],
                          macs_need_shape=False))
