"""Swapped einsum layers: SwappedEinsumDense and SwappedMultiHeadAttention.

SwappedEinsumDense subclasses Keras' EinsumDense (same kernel, bias, bias_axes, LoRA through the
`kernel` property) and runs `einsum(equation, inputs, kernel)` as one matmul through the kernel
between the transposes and reshapes the equation resolves to (graphswap.native.einsum); an
equation outside that class is refused when the layer is made, naming the equation.  It
calibrates, compensates and observes like Dense (one input range; one correction per matmul
column).

SwappedMultiHeadAttention subclasses MultiHeadAttention: after Keras' build creates the query,
key, value (and gate) and output projections - EinsumDense layers - it replaces each by a
SwappedEinsumDense in the same tracking position (graphswap.swap.tracking), so weights, their
order and checkpoints are the stock layer's.  The attention-score products (Q K^T and
scores x V) are activations times activations, not weights, and stay TensorFlow's float einsums.
Each projection calibrates, compensates and observes like an EinsumDense of its own (a static
range on its own input: the query, the key, the value, the attention output); the attention
layer reaches them through `quantized_parts()` and saves their state in its config.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from graphswap.errors import QuantizationError, UnsupportedLayerError
from graphswap.kernels import QuantScheme
from graphswap.native import einsum_plan
from graphswap.native.einsum import ELLIPSIS
from graphswap.swap import ops_layers
from graphswap.swap.layers import SwappedMixin
from graphswap.swap.tracking import replace_attribute
from graphswap.swap.xla import affine

#: MultiHeadAttention's projection sublayers, in the order Keras builds them
PROJECTIONS = ("_query_dense", "_key_dense", "_gate_dense", "_value_dense", "_output_dense")


def check_equation(layer) -> None:
    """Refuse (naming the layer) an equation that is not one matmul (graphswap.native.einsum)."""
    lhs = str(layer.equation).replace(" ", "").split(",")[0]
    rank = len(lhs.replace(ELLIPSIS, "")) + (1 if ELLIPSIS in lhs else 0)
    try:
        einsum_plan(layer.equation, rank)
    except UnsupportedLayerError as exc:
        raise UnsupportedLayerError(f"layer {layer.name!r}: {exc}") from None


@keras.saving.register_keras_serializable(package="graphswap")
class SwappedEinsumDense(SwappedMixin, keras.layers.EinsumDense):
    """EinsumDense whose product runs a graphswap kernel as one (m,k)x(k,n) matmul.  Its output
    channels are the matmul's n columns (the kernel's produced axes, e.g. heads x head size of an
    attention projection): a calibrated layer has one static input range and an output
    correction per column, broadcast over the output's produced axes before the bias."""


    def __init__(self, equation, output_shape, arithmetic=None, backward="native",
                 swap_kernel=None, quantization=None, output_correction=None, **kwargs):
        super().__init__(equation, output_shape, **kwargs)
        check_equation(self)
        if kwargs.get("quantization_config") is not None:
            raise UnsupportedLayerError(
                f"layer {self.name!r}: Keras-quantized EinsumDense cannot be swapped; swap the "
                f"float model instead")
        self._init_swap(arithmetic, swap_kernel, backward, quantization, output_correction)

    def build(self, input_shape):
        super().build(input_shape)
        if self.quantization_mode:
            raise UnsupportedLayerError(
                f"layer {self.name!r}: Keras-quantized EinsumDense ({self.quantization_mode}) "
                f"cannot be swapped; swap the float model instead")
        self._plan = einsum_plan(self.equation, len(input_shape))
        self._build_quantization(self._plan.kernel_matrix_shape(tuple(self.kernel.shape))[1])

    def call(self, inputs, training=None):
        quant, activation_range = self._quant_inputs(inputs, training)
        x = ops_layers.swapped_einsum(self.equation, inputs, self.kernel, self.arithmetic,
                                      self.backward, quant, activation_range)
        gain, offset = self._correction(x.dtype)
        if gain is not None:
            shape = tuple(int(d) for d in self.kernel.shape)
            x = affine(x, ops_layers.einsum_channels(self._plan, shape, gain),  # no FMA in XLA
                       ops_layers.einsum_channels(self._plan, shape, offset))
        if self.bias is not None:
            x = tf.add(x, tf.cast(self.bias, x.dtype))
        if self.activation is not None:
            x = self.activation(x)
        return x

    def numpy_product(self, x, arithmetic=None, quant=None):
        """The (m, n) product matrix (no correction, bias or activation) of an input."""
        return ops_layers.einsum_product(arithmetic or self.arithmetic, self._plan, x,
                                         np.asarray(self.kernel, dtype=np.float32), quant)


@keras.saving.register_keras_serializable(package="graphswap")
class SwappedMultiHeadAttention(SwappedMixin, keras.layers.MultiHeadAttention):
    """MultiHeadAttention whose query/key/value/(gate)/output projections run a graphswap
    kernel (SwappedEinsumDense); the attention-score products stay float.  Each projection keeps
    its own quantization state (static range, output correction): calibration, compensation and
    exports reach them through `quantized_parts()`, and the config carries them under
    "projection_states" ({name: {"quantization": ..., "output_correction": ...}})."""


    def __init__(self, num_heads, key_dim, arithmetic=None, backward="native",
                 swap_kernel=None, quantization=None, output_correction=None,
                 projection_states=None, **kwargs):
        super().__init__(num_heads, key_dim, **kwargs)
        self._init_swap(arithmetic, swap_kernel, backward, quantization, output_correction)
        self._pending_projections = _projection_states(projection_states, self.name)

    def build(self, query_shape, value_shape, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        key_shape = value_shape if key_shape is None else key_shape
        output_input = list(self._query_dense.compute_output_shape(query_shape))
        output_input[-1] = self._value_dim
        shapes = {"_query_dense": query_shape, "_key_dense": key_shape,
                  "_gate_dense": query_shape, "_value_dense": value_shape,
                  "_output_dense": tuple(output_input)}
        for attribute in PROJECTIONS:
            stock = getattr(self, attribute, None)
            if stock is None or isinstance(stock, SwappedEinsumDense):
                continue
            state = self._pending_projections.get(attribute.strip("_"), {})
            swapped = SwappedEinsumDense.from_config({
                **stock.get_config(), "arithmetic": self.arithmetic, "backward": self.backward,
                "quantization": state.get("quantization", self._scheme_config()),
                "output_correction": state.get("output_correction")})
            swapped.build(shapes[attribute])
            swapped.set_weights(stock.get_weights())
            replace_attribute(self, attribute, swapped)

    def projections(self) -> dict:
        """{attribute: the projection layer} of a built layer."""
        return {a: getattr(self, a) for a in PROJECTIONS if getattr(self, a, None) is not None}

    def quantized_parts(self) -> dict:
        """{name: projection} ("query_dense", ...): the layers holding this layer's quantization
        state, in the order the exports number them."""
        return {attribute.strip("_"): layer for attribute, layer in self.projections().items()}

    def part_schemes(self) -> list:
        return [layer.current_quantization() for layer in self.quantized_parts().values()]

    def _quantization_config(self) -> dict:
        config = super()._quantization_config()
        parts = self.quantized_parts() if self.built else {}
        if config and parts:
            config["projection_states"] = {
                name: {"quantization": layer.current_quantization().to_config(),
                       "output_correction": layer.output_correction}
                for name, layer in parts.items()}
        elif config and self._pending_projections:
            config["projection_states"] = self._pending_projections
        return config


def _projection_states(states, layer_name) -> dict:
    """The config's projection_states, checked: {projection name: {"quantization": scheme
    config, "output_correction": correction config or None}}."""
    if not states:
        return {}
    names = {attribute.strip("_") for attribute in PROJECTIONS}
    if not isinstance(states, dict) or set(states) - names or not all(
            isinstance(state, dict) and set(state) <= {"quantization", "output_correction"}
            for state in states.values()):
        raise QuantizationError(
            f"layer {layer_name!r}: projection_states must map projections "
            f"({', '.join(sorted(names))}) to {{'quantization': ..., 'output_correction': ...}}; "
            f"got {states!r}")
    for state in states.values():
        if state.get("quantization") is not None:
            QuantScheme.from_config(state["quantization"])   # raises QuantizationError
    return dict(states)
