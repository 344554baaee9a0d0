"""The swapped recurrent cells: SwappedLSTMCell, SwappedGRUCell, SwappedSimpleRNNCell.

They subclass Keras' cells and override only `call`: the input-kernel product (inputs @ kernel)
and the recurrent-kernel product(s) (h @ recurrent_kernel) run through
`graphswap.swap.ops.swapped_matmul` - the op Dense uses, with TensorFlow's MatMul gradient, so
gradients through time are TensorFlow's own (the while loop's gradient around the stock ops).
Everything else is the stock cell's code: gates, activations, dropout masks (implementation 1's
per-gate masks included), the GRU's reset_after variants, bias.  The layers that run them are in
graphswap.swap.layers_recurrent, whose docstring describes their quantization state.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
from keras.src import tree

from graphswap.errors import UnsupportedLayerError
from graphswap.kernels import bind_scheme
from graphswap.swap import ops
from graphswap.swap.layers import SwappedMixin

SWAP_KEYS = ("arithmetic", "backward", "swap_kernel", "quantization", "output_correction",
              "intermediate_ranges")


class _SwappedCellMixin(SwappedMixin):
    """A recurrent cell whose kernel products run the arithmetic (module docstring)."""

    intermediate_points = ("recurrent",)
    gates = 1
    lut_grad_supported = True   # swapped_matmul's, product by product

    def _init_cell(self, arithmetic, swap_kernel, backward, quantization, output_correction,
                   intermediate_ranges):
        self._init_swap(arithmetic, swap_kernel, backward, quantization, output_correction,
                        intermediate_ranges)

    def build(self, input_shape):
        super().build(input_shape)
        self._build_quantization(self.gates * self.units)

    def _product(self, x, kernel, training, point=None, shift=None, corrected=False):
        """x @ kernel through the arithmetic, on the operand's own range; `corrected`: with the
        output correction (the input product); `shift`: a bias added in the same pass."""
        quant, activation_range = self._quant_inputs(x, training, point)
        gain = None
        if corrected:
            gain, shift = self._output_epilogue(shift)
        elif shift is not None:
            shift = tf.cast(shift, tf.float32)
        return ops.swapped_matmul(x, kernel, self.arithmetic, self.backward, quant,
                                  activation_range, gain, shift)

    def _gate_products(self, operands, kernel, training, point=None, shift=None,
                       corrected=False):
        """The product of one operand, or - per-gate operands (implementation 1's dropout masks)
        - each gate's columns of its own operand's full product (the weights quantize as one
        product either way)."""
        if not isinstance(operands, (list, tuple)):
            return self._product(operands, kernel, training, point, shift, corrected)
        width = int(kernel.shape[-1]) // len(operands)
        parts = [self._product(x, kernel, training, point, shift, corrected)
                 [:, g * width:(g + 1) * width] for g, x in enumerate(operands)]
        return tf.concat(parts, axis=-1)

    def numpy_product(self, x, arithmetic=None, quant=None):
        """The input product x @ kernel (no correction or bias) of an (m, k) input."""
        arithmetic = arithmetic or self.arithmetic
        return bind_scheme(arithmetic, quant).matmul(
            np.asarray(x, np.float32), np.asarray(self.kernel, dtype=np.float32))


def _per_gate(x, mask, count):
    """x times each gate's mask (implementation 1), as the stock cells index them."""
    return [x * mask[g] for g in range(count)]


@keras.saving.register_keras_serializable(package="graphswap")
class SwappedLSTMCell(_SwappedCellMixin, keras.layers.LSTMCell):
    """LSTMCell whose two kernel products run a graphswap kernel."""

    gates = 4

    def __init__(self, units, arithmetic=None, backward="native", swap_kernel=None,
                 quantization=None, output_correction=None, intermediate_ranges=None, **kwargs):
        super().__init__(units, **kwargs)
        self._init_cell(arithmetic, swap_kernel, backward, quantization, output_correction,
                        intermediate_ranges)

    def call(self, inputs, states, training=False):
        h_tm1, c_tm1 = states[0], states[1]
        dropout = training and 0.0 < self.dropout < 1.0
        recurrent_dropout = training and 0.0 < self.recurrent_dropout < 1.0
        x = inputs
        if dropout:
            mask = self.get_dropout_mask(inputs)
            x = _per_gate(inputs, mask, 4) if self.implementation == 1 else inputs * mask
        h = h_tm1
        if self.implementation == 1 and recurrent_dropout:
            h = _per_gate(h_tm1, self.get_recurrent_dropout_mask(h_tm1), 4)
        z = self._gate_products(x, self.kernel, training, None, self.bias, corrected=True)
        z = tf.add(z, self._gate_products(h, self.recurrent_kernel, training, "recurrent"))
        c, o = self._compute_carry_and_output_fused(tf.split(z, 4, axis=1), c_tm1)
        h = o * self.activation(c)
        return h, [h, c]


@keras.saving.register_keras_serializable(package="graphswap")
class SwappedGRUCell(_SwappedCellMixin, keras.layers.GRUCell):
    """GRUCell whose kernel products run a graphswap kernel (both reset_after variants)."""

    gates = 3

    def __init__(self, units, arithmetic=None, backward="native", swap_kernel=None,
                 quantization=None, output_correction=None, intermediate_ranges=None, **kwargs):
        super().__init__(units, **kwargs)
        if not self.reset_after:
            self.intermediate_points = ("recurrent", "reset_state")
        self._init_cell(arithmetic, swap_kernel, backward, quantization, output_correction,
                        intermediate_ranges)

    def call(self, inputs, states, training=False):
        h_tm1 = states[0] if tree.is_nested(states) else states
        input_bias = recurrent_bias = None
        if self.use_bias:
            if self.reset_after:
                input_bias, recurrent_bias = self.bias[0], self.bias[1]
            else:
                input_bias = self.bias
        units = self.units
        dropout = training and 0.0 < self.dropout < 1.0
        recurrent_dropout = training and 0.0 < self.recurrent_dropout < 1.0
        x = inputs
        if dropout:
            mask = self.get_dropout_mask(inputs)
            x = _per_gate(inputs, mask, 3) if self.implementation == 1 else inputs * mask
        h_z = h_r = h_h = h_tm1
        if self.implementation == 1 and recurrent_dropout:
            h_z, h_r, h_h = _per_gate(h_tm1, self.get_recurrent_dropout_mask(h_tm1), 3)
        matrix_x = self._gate_products(x, self.kernel, training, None, input_bias,
                                       corrected=True)
        x_z, x_r, x_h = tf.split(matrix_x, 3, axis=-1)
        per_gate = h_z is not h_tm1
        if self.reset_after:
            operands = [h_z, h_r, h_h] if per_gate else h_tm1
            inner = self._gate_products(operands, self.recurrent_kernel, training, "recurrent",
                                        recurrent_bias)
            recurrent_z, recurrent_r, recurrent_h = tf.split(inner, 3, axis=-1)
            z = self.recurrent_activation(x_z + recurrent_z)
            r = self.recurrent_activation(x_r + recurrent_r)
            recurrent_h = r * recurrent_h
        else:
            operands = [h_z, h_r] if per_gate else h_tm1
            inner = self._gate_products(operands, self.recurrent_kernel[:, :2 * units], training,
                                        "recurrent")
            recurrent_z, recurrent_r = tf.split(inner, 2, axis=-1)
            z = self.recurrent_activation(x_z + recurrent_z)
            r = self.recurrent_activation(x_r + recurrent_r)
            recurrent_h = self._product(r * h_h, self.recurrent_kernel[:, 2 * units:], training,
                                        "reset_state")
        hh = self.activation(x_h + recurrent_h)
        h = z * h_tm1 + (1 - z) * hh
        return h, ([h] if tree.is_nested(states) else h)


@keras.saving.register_keras_serializable(package="graphswap")
class SwappedSimpleRNNCell(_SwappedCellMixin, keras.layers.SimpleRNNCell):
    """SimpleRNNCell whose two kernel products run a graphswap kernel."""

    def __init__(self, units, arithmetic=None, backward="native", swap_kernel=None,
                 quantization=None, output_correction=None, intermediate_ranges=None, **kwargs):
        super().__init__(units, **kwargs)
        self._init_cell(arithmetic, swap_kernel, backward, quantization, output_correction,
                        intermediate_ranges)

    def call(self, sequence, states, training=False):
        prev_output = states[0] if isinstance(states, (list, tuple)) else states
        dp_mask = self.get_dropout_mask(sequence)
        rec_dp_mask = self.get_recurrent_dropout_mask(prev_output)
        if training and dp_mask is not None:
            sequence = sequence * dp_mask
        h = self._product(sequence, self.kernel, training, None, self.bias, corrected=True)
        if training and rec_dp_mask is not None:
            prev_output = prev_output * rec_dp_mask
        output = h + self._product(prev_output, self.recurrent_kernel, training, "recurrent")
        if self.activation is not None:
            output = self.activation(output)
        return output, ([output] if isinstance(states, (list, tuple)) else output)


#: stock cell class -> swapped cell class
CELLS = {keras.layers.LSTMCell: SwappedLSTMCell, keras.layers.GRUCell: SwappedGRUCell,
         keras.layers.SimpleRNNCell: SwappedSimpleRNNCell}
SWAPPED_CELLS = tuple(CELLS.values())


def swapped_cell(cell, arithmetic, backward="native", quantization=None, output_correction=None,
                 intermediate_ranges=None, swap_kernel=None):
    """A swapped copy (unbuilt, same config) of a stock cell (LSTMCell, GRUCell, SimpleRNNCell);
    UnsupportedLayerError for any other cell."""
    swapped = CELLS.get(type(cell))
    if swapped is None:
        raise UnsupportedLayerError(
            f"layer {cell.name!r}: a recurrent cell of type {type(cell).__name__} cannot be "
            f"swapped; swappable cells: LSTMCell, GRUCell, SimpleRNNCell")
    config = {key: value for key, value in cell.get_config().items() if key not in SWAP_KEYS}
    if getattr(cell, "implementation", None) is not None and "implementation" not in config:
        config["implementation"] = cell.implementation
    return swapped(arithmetic=arithmetic, backward=backward, swap_kernel=swap_kernel,
                   quantization=quantization, output_correction=output_correction,
                   intermediate_ranges=intermediate_ranges, **config)
