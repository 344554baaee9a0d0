"""GradientOverride: the wrapper layer `override` puts around a layer - its forward unchanged,
its output's gradient modified by rules; the wrapped layer keeps its weights (same order)."""

from __future__ import annotations

import inspect

import keras

from graphswap.errors import GraphswapError
from graphswap.surgery.primitives import guided_relu
from graphswap.surgery.rules import GuidedReLU, get_rule, serialize_rule


@keras.saving.register_keras_serializable(package="graphswap")
class GradientOverride(keras.layers.Layer):
    """Wraps a layer: its forward unchanged, its output's gradient modified by `rules`.

    `guided` (a dict of GuidedReLU options, or None) means the wrapped layer's ReLU activation has
    been split off (the wrapped layer has activation="linear") and is applied here as a guided
    ReLU.  `rules` (rule objects/configs) act on the output gradient in the order listed: the
    first rule sees the incoming gradient first.  The wrapped layer's weights are this layer's
    weights, in the same order, so weights copy 1:1 between the original and the wrapper.
    """

    def __init__(self, layer, rules=(), guided=None, **kwargs):
        if isinstance(layer, dict):
            layer = keras.saving.deserialize_keras_object(layer)
        if not isinstance(layer, keras.layers.Layer):
            raise GraphswapError(f"GradientOverride wraps a Keras layer, got {layer!r}")
        kwargs.setdefault("name", layer.name)
        super().__init__(**kwargs)
        self.layer = layer
        self.rules = [get_rule(r) for r in rules]
        self.guided = dict(guided) if guided is not None else None
        if self.guided is not None:
            GuidedReLU(**self.guided)  # validate
        self._wrapped_takes_training = "training" in inspect.signature(layer.call).parameters

    def build(self, input_shape):
        if not self.layer.built:
            self.layer.build(input_shape)
        self.built = True

    def call(self, inputs, training=None):
        if self._wrapped_takes_training:
            outputs = self.layer(inputs, training=training)
        else:
            outputs = self.layer(inputs)

        def post(tensor):
            if self.guided is not None:
                tensor = guided_relu(tensor, **self.guided)
            for rule in reversed(self.rules):
                tensor = rule.apply(tensor)
            return tensor

        return keras.tree.map_structure(post, outputs)

    def compute_output_shape(self, input_shape):
        return self.layer.compute_output_shape(input_shape)

    def describe(self) -> str:
        parts = []
        if self.guided is not None:
            parts.append("guided ReLU (activation split off)")
        parts += [rule.describe() for rule in self.rules]
        return "; ".join(parts)

    def get_config(self):
        return {**super().get_config(),
                "layer": keras.saving.serialize_keras_object(self.layer),
                "rules": [serialize_rule(rule) for rule in self.rules],
                "guided": self.guided}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["layer"] = keras.saving.deserialize_keras_object(config["layer"])
        return cls(**config)
