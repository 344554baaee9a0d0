"""Replacing a layer that another layer or a subclassed model holds (an attribute, or an item of
a list or dict attribute), so that Keras' tracking keeps the replacement in the old one's place.

Keras lists a layer's sublayers in the order they were assigned, and `weights`,
`get_weights()`/`set_weights()` and checkpoints follow that order; a plain re-assignment would
append the new layer at the end (and keep the old one's weights).  `replace_in_tracker` swaps the
entry in place through Keras' own Tracker.replace_tracked_value.
"""

from __future__ import annotations

import keras

from graphswap.errors import GraphswapError


def replace_in_tracker(parent, old, new) -> None:
    """Put `new` where `old` is in `parent`'s tracked sublayers."""
    tracker = getattr(parent, "_tracker", None)
    if tracker is None or not tracker.is_in_store("layers", old):
        raise GraphswapError(f"layer {old.name!r} is not tracked by {parent.name!r}; cannot "
                             f"replace it in place")
    tracker.replace_tracked_value("layers", old, new)


def replace_attribute(parent, attribute: str, new) -> None:
    """`parent.<attribute> = new` in the old layer's tracking position."""
    old = getattr(parent, attribute)
    replace_in_tracker(parent, old, new)
    setattr(parent, attribute, new)  # Keras' tracker sees `new` already in place: no append


def replace_item(parent, container, key, new) -> None:
    """`container[key] = new` (a list or dict attribute of `parent`) in the old one's position."""
    old = container[key]
    replace_in_tracker(parent, old, new)
    container[key] = new


def is_layer(value) -> bool:
    return isinstance(value, keras.layers.Layer)
