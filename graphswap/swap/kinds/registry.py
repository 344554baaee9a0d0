"""The layer kinds graphswap swaps, one LayerKind each, in the order reports list them.

Each module of graphswap.swap.kinds registers one kind: its stock Keras class, the Swapped class
that replaces it, how its weight MACs are counted, whether a BatchNormalization folds into it,
and the steps of swapping it that are its own (an option it refuses, a recurrent layer's cells, a
wrapper's inner layer).  Everything that asks "which kind is this layer?" asks here:
graphswap.swap.catalog (the tables rewrite_model and the command line read), the report's MAC
count, BatchNormalization folding, and (one floor up) the exports' per-kind tables.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from graphswap.errors import GraphswapError
from graphswap.swap.layers import check_lut_grad, check_lut_grad_kernel


@dataclasses.dataclass(frozen=True)
class BatchNormFold:
    """How a BatchNormalization right after a layer of a kind folds into it
    (graphswap.swap.folding): the weight whose last axes are the output channels, and the
    weights in front of it that stay as they are."""

    kernel: str = "kernel"
    #: a depthwise kernel (h, w, in, multiplier): output channel c = i * multiplier + m
    depthwise: bool = False
    #: weights before the folded kernel, kept unchanged (a separable conv's depthwise kernel)
    kept: tuple = ()


@dataclasses.dataclass(frozen=True)
class LayerKind:
    """One swappable layer kind.  Only layers whose class is exactly `stock` are swapped (a
    user's subclass has its own call()); `counted` layers, subclasses included, get MACs."""

    name: str
    stock: type
    swapped: type
    #: weight MACs per sample: macs(layer, input shape with free dimensions at the counting
    #: length; None when unknown)
    macs: Callable
    #: the classes (and their subclasses) `macs` counts; () means (stock,)
    counted: tuple = ()
    #: False: `macs` finds its own shapes (attention counts through its projections)
    macs_need_shape: bool = True
    #: how a following BatchNormalization folds in; None: it does not
    fold: BatchNormFold | None = None
    #: check(stock layer) raises for an option the swapped layer cannot mirror
    check: Callable | None = None
    #: build(stock layer, arithmetic, backward, quantization) -> swapped layer;
    #: None: `swapped` made from the stock layer's config
    build: Callable | None = None
    #: refuse(stock layer) -> why it cannot be swapped as it is, or None
    refuse: Callable | None = None
    #: wrapped(layer) -> the layer a wrapper kind runs (its products are that layer's)
    wrapped: Callable | None = None
    #: its products sit in recurrent cells (graphswap.swap.layers_recurrent)
    recurrent: bool = False

    def __post_init__(self):
        if not self.counted:
            object.__setattr__(self, "counted", (self.stock,))


_KINDS: list[LayerKind] = []
_BY_NAME: dict[str, LayerKind] = {}
_BY_STOCK: dict[type, LayerKind] = {}
_BY_SWAPPED: dict[type, LayerKind] = {}


def register(kind: LayerKind) -> LayerKind:
    """Add `kind` after the ones already registered (graphswap/swap/kinds/__init__.py imports
    the kind modules in report order)."""
    if kind.name in _BY_NAME or kind.stock in _BY_STOCK or kind.swapped in _BY_SWAPPED:
        raise GraphswapError(f"layer kind {kind.name!r} is registered twice")
    _KINDS.append(kind)
    _BY_NAME[kind.name] = kind
    _BY_STOCK[kind.stock] = kind
    _BY_SWAPPED[kind.swapped] = kind
    return kind


def all_kinds() -> tuple[LayerKind, ...]:
    """Every registered kind, in report order."""
    return tuple(_KINDS)


def by_name(name: str) -> LayerKind:
    return _BY_NAME[name]


def by_stock(cls) -> LayerKind | None:
    """The kind whose stock class is exactly `cls`."""
    return _BY_STOCK.get(cls)


def by_swapped(cls) -> LayerKind | None:
    """The kind whose Swapped class is exactly `cls`."""
    return _BY_SWAPPED.get(cls)


def of_layer(layer) -> LayerKind | None:
    """The kind of a stock or swapped layer (exact class; None for anything else)."""
    return _BY_STOCK.get(type(layer)) or _BY_SWAPPED.get(type(layer))


def counting_kind(layer) -> LayerKind | None:
    """The kind whose MAC count applies to `layer`: its own, else the first whose `counted`
    classes it is an instance of (a Conv3D counts like a Conv2D)."""
    kind = of_layer(layer)
    if kind is not None:
        return kind
    return next((k for k in _KINDS if isinstance(layer, k.counted)), None)


def folding_kind(layer) -> LayerKind | None:
    """The foldable kind `layer` is an instance of (subclasses and swapped layers included)."""
    return next((k for k in _KINDS if k.fold is not None and isinstance(layer, k.stock)), None)


def is_swappable_family(layer) -> bool:
    """An instance of a swappable stock class (possibly a user's subclass of it); a wrapper
    (TimeDistributed) when the layer it wraps is."""
    for kind in _KINDS:
        if kind.wrapped is not None and isinstance(layer, kind.stock):
            return is_swappable_family(kind.wrapped(layer))
    return isinstance(layer, tuple(kind.stock for kind in _KINDS))


def refusal(layer) -> str | None:
    """Why a stock layer of a swappable kind cannot be swapped as it is (None: it can)."""
    kind = _BY_STOCK.get(type(layer))
    return kind.refuse(layer) if kind is not None and kind.refuse is not None else None


def swapped_from(layer, arithmetic, backward: str, quantization=None):
    """A swapped copy (unbuilt, same config) of the stock `layer`; refuses what it cannot mirror.
    `quantization`: the QuantScheme config of a multiplier kernel (None: the defaults)."""
    kind = _BY_STOCK[type(layer)]
    if kind.check is not None:
        kind.check(layer)
    # before from_config, which Keras would wrap an error of in a TypeError
    check_lut_grad(kind.swapped, layer.name, backward)
    check_lut_grad_kernel(arithmetic, layer.name, backward)
    if kind.build is not None:
        return kind.build(layer, arithmetic, backward, quantization)
    return kind.swapped.from_config({**layer.get_config(), "arithmetic": arithmetic,
                                     "backward": backward, "quantization": quantization})
