"""Which stock Keras layer becomes which swapped layer: the tables rewrite_model, the report,
the exports and `convert --layer-types` read, derived from the layer kinds
(graphswap.swap.kinds: one module per kind, in report order).  TimeDistributed is swapped when
the layer it wraps is (graphswap.swap.layers_wrapped: the wrapped layer swapped by its own kind,
timesteps folded into one call).

A layer is swapped only when its class is exactly the stock class (a user's subclass of Dense
has its own call() and is reported, not swapped).  The swapped class is made from the stock
layer's config plus the arithmetic and the backward mode; its constructor refuses, naming the
layer and the option, whatever it cannot mirror.
"""

from __future__ import annotations

from graphswap.swap.kinds import (all_kinds, by_swapped, is_swappable_family, of_layer, refusal,
                                  swapped_from)

__all__ = ["CATALOG", "LAYER_TYPES", "RECURRENT_TYPES", "SWAPPABLE_TYPES", "SWAPPED_CLASSES",
           "float_wrapper_reason", "is_swappable_family", "is_swapped", "refusal",
           "stock_class", "swapped_from", "type_name"]

#: type name -> (stock class, swapped class), in the order reports list them
CATALOG = {kind.name: (kind.stock, kind.swapped) for kind in all_kinds()}
#: the recurrent types (their products sit in a cell, or two: graphswap.swap.layers_recurrent)
RECURRENT_TYPES = tuple(kind.name for kind in all_kinds() if kind.recurrent)

#: every type graphswap swaps (the default selection)
LAYER_TYPES = tuple(CATALOG)
#: the stock class of each type
SWAPPABLE_TYPES = {name: stock for name, (stock, _) in CATALOG.items()}
SWAPPED_CLASSES = tuple(swapped for _, swapped in CATALOG.values())
_STOCK_OF = {swapped: stock for stock, swapped in CATALOG.values()}


def type_name(layer) -> str | None:
    """The catalog name of a stock or swapped layer (None for anything else)."""
    kind = of_layer(layer)
    return kind.name if kind is not None else None


def is_swapped(layer) -> bool:
    return by_swapped(type(layer)) is not None


def float_wrapper_reason(layer) -> str:
    """Why a TimeDistributed stays float ("" when what it wraps is swappable)."""
    if is_swappable_family(layer):
        return ""
    return (f"TimeDistributed around a {type(layer.layer).__name__}, which graphswap does not "
            f"swap: it runs in float")


def stock_class(swapped_layer):
    """The stock Keras class a swapped layer stands for."""
    return _STOCK_OF[type(swapped_layer)]
