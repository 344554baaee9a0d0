"""Kept-kernel versions of the swapped layers, for the kept-kernel ONNX export: each product of a
layer is one `tf.numpy_function` named "<marker>_part<i>", which tf2onnx hands to
graphswap.io.onnx_export's handler, which makes it a custom node (graphswap.io.onnx_ops):

    Dense, EinsumDense, MultiHeadAttention's projections  -> GraphswapMatMul (2-D operands; an
        einsum's transposes and reshapes stay standard ONNX ops around it)
    Conv2D, DepthwiseConv2D (groups = channels), both parts of SeparableConv2D, Conv1D (height 1;
        causal padding a Pad), Conv2DTranspose (zero insertion and padding as standard ops, then a
        'valid' stride-1 convolution of the flipped filter)      -> GraphswapConv2D
    LSTM, GRU, SimpleRNN, RNN, Bidirectional: each product of the cell (input, recurrent state, a
        GRU's r * h), part i with its own scheme, inside Keras' while loop, which tf2onnx makes
        an ONNX Loop with the custom nodes in its body         -> GraphswapMatMul
    TimeDistributed: the kept version of the layer it wraps, called once on the timesteps folded
        into the batch (reshapes around it)                    -> the wrapped layer's nodes

KEPT_CLASSES maps each layer kind (graphswap.swap.kinds) to its kept class (Dense's and Conv2D's
in graphswap.io.kept_dense_conv).  `onnx_node(part)` gives each part's custom op and attributes.
These layers are only ever traced for tf2onnx: never trained, never saved.  The numbers are the
swapped layers' own: the same Kernel on the same operands.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from graphswap.io.kept_dense_conv import KeptConv2D, KeptDense
from graphswap.io.onnx_ops import MATMUL_OP, conv_attributes
from graphswap.native import conv_geometry, einsum_plan, transposed_conv
from graphswap.swap import (SwappedBidirectional, SwappedConv1D, SwappedConv2DTranspose,
                            SwappedDepthwiseConv2D, SwappedEinsumDense, SwappedGRU, SwappedLSTM,
                            SwappedMultiHeadAttention, SwappedRNN, SwappedSeparableConv2D,
                            SwappedSimpleRNN, type_name)
from graphswap.swap.layers_wrapped import FoldedTimeDistributed
from graphswap.swap.recurrent_cells import SwappedGRUCell, SwappedLSTMCell, SwappedSimpleRNNCell
from graphswap.swap.kinds.counting import input_shape_of
from graphswap.swap.tracking import replace_attribute


def part_name(marker: str, part: int) -> str:
    return f"{marker}_part{part}"


def kernel_conv(arithmetic, x, w, name, strides=(1, 1), padding="valid", dilations=(1, 1),
                groups=1):
    """NHWC x HWIO through the arithmetic, one marked numpy_function (shape kept for tf2onnx)."""
    filter_shape = tuple(int(d) for d in w.shape)

    def forward(x_array, w_array):
        geometry = conv_geometry(x_array.shape, filter_shape, strides, dilations, padding, groups)
        return arithmetic.conv2d(x_array, w_array, geometry)

    y = tf.numpy_function(forward, [x, w], tf.float32, stateful=False, name=name)
    g = conv_geometry((1, *x.shape[1:]), filter_shape, strides, dilations, padding, groups)
    # ensure_shape: tf2onnx re-infers shapes from the GraphDef, where a PyFunc has none
    return tf.ensure_shape(y, [x.shape[0], g.out_height, g.out_width, filter_shape[3]])


def kernel_matmul(arithmetic, a, b, name):
    y = tf.numpy_function(lambda p, q: arithmetic.matmul(p, q), [a, b], tf.float32,
                          stateful=False, name=name)
    return tf.ensure_shape(y, [a.shape[0], b.shape[1]])


def _f32(t):
    return tf.cast(t, tf.float32)


def _finish(layer, inputs, y, channels):
    """Back to the layer's layout and dtype, then bias and activation as the layer does them."""
    if layer.data_format == "channels_first":
        y = tf.transpose(y, [0, 3, 1, 2])
    if layer.use_bias:
        shape = ((1,) * (layer.rank + 1) + (channels,)) if layer.data_format == "channels_last" \
            else ((1, channels) + (1,) * layer.rank)
        y = tf.add(y, tf.reshape(_f32(layer.bias), shape))
    if layer.activation is not None:
        y = layer.activation(y)
    return tf.cast(y, inputs.dtype) if inputs.dtype != tf.float32 else y


def _nhwc(layer, inputs):
    x = _f32(inputs)
    return tf.transpose(x, [0, 2, 3, 1]) if layer.data_format == "channels_first" else x


class KeptDepthwiseConv2D(SwappedDepthwiseConv2D):
    graphswap_marker = ""

    def call(self, inputs):
        k_h, k_w, channels, multiplier = (int(d) for d in self.kernel.shape)
        w = tf.reshape(_f32(self.kernel), [k_h, k_w, 1, channels * multiplier])
        # the scheme as it is now (a static range: a constant of the export), then the
        # output correction as standard ops
        y = kernel_conv(self.current_scheme_kernel(), _nhwc(self, inputs), w,
                        part_name(self.graphswap_marker, 0), self.strides, self.padding,
                        self.dilation_rate, channels)
        return _finish(self, inputs, self._correct_outputs(y), channels * multiplier)

    def onnx_node(self, part):
        return conv_attributes(self.padding, self.strides, self.dilation_rate,
                               int(self.kernel.shape[2]))


class KeptSeparableConv2D(SwappedSeparableConv2D):
    graphswap_marker = ""

    def call(self, inputs):
        k_h, k_w, channels, multiplier = (int(d) for d in self.depthwise_kernel.shape)
        w = tf.reshape(_f32(self.depthwise_kernel), [k_h, k_w, 1, channels * multiplier])
        # each product's scheme as it is now (static ranges: constants of the export)
        depthwise = kernel_conv(self.current_scheme_kernel(), _nhwc(self, inputs), w,
                                part_name(self.graphswap_marker, 0), self.strides, self.padding,
                                self.dilation_rate, channels)
        y = kernel_conv(self.current_scheme_kernel("pointwise"), depthwise,
                        _f32(self.pointwise_kernel), part_name(self.graphswap_marker, 1))
        return _finish(self, inputs, self._correct_outputs(y), self.filters)

    def onnx_node(self, part):
        if part == 0:
            return conv_attributes(self.padding, self.strides, self.dilation_rate,
                                   int(self.depthwise_kernel.shape[2]))
        return conv_attributes("valid", (1, 1), (1, 1), 1)


class KeptConv1D(SwappedConv1D):
    graphswap_marker = ""

    def call(self, inputs):
        x = _f32(inputs)
        if self.data_format == "channels_first":
            x = tf.transpose(x, [0, 2, 1])
        if self.padding == "causal":
            x = tf.pad(x, [[0, 0], [self.dilation_rate[0] * (self.kernel_size[0] - 1), 0],
                           [0, 0]])
        y = kernel_conv(self.current_scheme_kernel(), tf.expand_dims(x, 1),
                        tf.expand_dims(_f32(self.kernel), 0), part_name(self.graphswap_marker, 0),
                        (1, self.strides[0]), self._conv_padding(), (1, self.dilation_rate[0]),
                        self.groups)
        y = tf.squeeze(self._correct_outputs(y), [1])
        if self.data_format == "channels_first":
            y = tf.transpose(y, [0, 2, 1])
        if self.use_bias:
            shape = (1, 1, self.filters) if self.data_format == "channels_last" else (
                1, self.filters, 1)
            y = tf.add(y, tf.reshape(_f32(self.bias), shape))
        if self.activation is not None:
            y = self.activation(y)
        return tf.cast(y, inputs.dtype) if inputs.dtype != tf.float32 else y

    def _conv_padding(self):
        return "valid" if self.padding == "causal" else self.padding

    def onnx_node(self, part):
        return conv_attributes(self._conv_padding(), (1, self.strides[0]),
                               (1, self.dilation_rate[0]), self.groups)


def insert_zeros_tf(x, plan):
    """graphswap.native.insert_zeros and the plan's paddings in standard TensorFlow ops."""
    s_h, s_w = plan.strides
    _, height, width, channels = (int(d) if d is not None else -1 for d in x.shape)
    z = tf.reshape(x, [-1, height, 1, width, 1, channels])
    z = tf.pad(z, [[0, 0], [0, 0], [0, s_h - 1], [0, 0], [0, s_w - 1], [0, 0]])
    z = tf.reshape(z, [-1, height * s_h, width * s_w, channels])
    z = z[:, :plan.crop_height, :plan.crop_width, :]
    g = plan.geometry
    return tf.pad(z, [[0, 0], [g.pad_top, g.pad_bottom], [g.pad_left, g.pad_right], [0, 0]])


class KeptConv2DTranspose(SwappedConv2DTranspose):
    graphswap_marker = ""

    def call(self, inputs):
        x = _nhwc(self, inputs)
        plan = transposed_conv((1, *x.shape[1:]), tuple(self.kernel.shape), self.strides,
                               self.padding, self.output_padding, self.dilation_rate)
        w = tf.transpose(tf.reverse(_f32(self.kernel), [0, 1]), [0, 1, 3, 2])
        y = kernel_conv(self.current_scheme_kernel(), insert_zeros_tf(x, plan), w,
                        part_name(self.graphswap_marker, 0), dilations=self.dilation_rate)
        return _finish(self, inputs, self._correct_outputs(y), self.filters)

    def onnx_node(self, part):
        return conv_attributes("valid", (1, 1), self.dilation_rate, 1)


def kept_einsum(layer, inputs, kernel, marker, part):
    """The einsum of an EinsumDense as transposes/reshapes around one marked matmul."""
    x = _f32(inputs)
    plan = einsum_plan(layer.equation, x.shape.rank)
    w = _f32(kernel)
    k, n = plan.kernel_matrix_shape(tuple(w.shape))
    x2 = tf.reshape(tf.transpose(x, plan.input_permutation), [-1, k])
    w2 = tf.reshape(tf.transpose(w, plan.kernel_permutation), [k, n])
    # the scheme as it is now (a static range: a constant of the export), then the output
    # correction per product column as standard ops
    y2 = layer._correct_outputs(kernel_matmul(layer.current_scheme_kernel(), x2, w2,
                                              part_name(marker, part)))
    dynamic = tf.shape(tf.transpose(x, plan.input_permutation))
    free = len(plan.free)
    sizes = plan.sizes(list(x.shape), tuple(w.shape))
    produced = [sizes[c] for c in plan.produced]
    y = tf.reshape(y2, tf.concat([dynamic[:free], tf.constant(produced, tf.int32)], 0))
    y = tf.transpose(y, plan.output_permutation)
    y.set_shape(plan.output_shape(list(x.shape), tuple(w.shape)))
    if layer.bias is not None:
        y = tf.add(y, _f32(layer.bias))
    if layer.activation is not None:
        y = layer.activation(y)
    return tf.cast(y, inputs.dtype) if inputs.dtype != tf.float32 else y


class KeptEinsumDense(SwappedEinsumDense):
    graphswap_marker = ""
    graphswap_part = 0

    def call(self, inputs, training=None):
        return kept_einsum(self, inputs, self.kernel, self.graphswap_marker, self.graphswap_part)

    def onnx_node(self, part):
        return MATMUL_OP, {}


class KeptMultiHeadAttention(SwappedMultiHeadAttention):
    """Its projections become KeptEinsumDense layers, parts 0.. of its marker."""

    graphswap_marker = ""

    def build(self, query_shape, value_shape, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        for part, (attribute, layer) in enumerate(self.projections().items()):
            kept = KeptEinsumDense.from_config({**layer.get_config(),
                                                "arithmetic": self.arithmetic})
            kept.build(input_shape_of(layer))
            kept.set_weights(layer.get_weights())
            kept.graphswap_marker, kept.graphswap_part = self.graphswap_marker, part
            replace_attribute(self, attribute, kept)

    def onnx_node(self, part):
        return MATMUL_OP, {}


class _KeptCellMixin:
    """A swapped recurrent cell whose products are marked numpy_functions: part
    `graphswap_part_base + i` for its input (i = 0) and its recurrent operands (i = 1.., in
    `intermediate_points` order - the order of the layer's `part_schemes()`).  Inside the RNN's
    while loop; tf2onnx turns the loop into an ONNX Loop with the custom nodes in its body."""

    graphswap_marker = ""
    graphswap_part_base = 0

    def _product(self, x, kernel, training, point=None, shift=None, corrected=False):
        part = self.graphswap_part_base + (None, *self.intermediate_points).index(point)
        # the scheme of this operand as it is now (a static range: a constant of the export)
        y = kernel_matmul(self.current_scheme_kernel(point), _f32(x), _f32(kernel),
                          part_name(self.graphswap_marker, part))
        if corrected:
            y = self._correct_outputs(y)
        return y if shift is None else tf.add(y, _f32(shift))


class KeptLSTMCell(_KeptCellMixin, SwappedLSTMCell):
    pass


class KeptGRUCell(_KeptCellMixin, SwappedGRUCell):
    pass


class KeptSimpleRNNCell(_KeptCellMixin, SwappedSimpleRNNCell):
    pass


KEPT_CELLS = {SwappedLSTMCell: KeptLSTMCell, SwappedGRUCell: KeptGRUCell,
              SwappedSimpleRNNCell: KeptSimpleRNNCell}


def kept_cell(cell):
    """An unbuilt kept copy of a swapped cell (same config, same resolved arithmetic)."""
    return KEPT_CELLS[type(cell)].from_config({**cell.get_config(), "arithmetic": cell.arithmetic})


class _KeptRNNMixin:
    """A swapped LSTM / GRU / SimpleRNN / RNN with its cell replaced by the kept cell (built and
    given weights by the clone like any layer); `mark` gives the cell the layer's marker."""

    graphswap_marker = ""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        replace_attribute(self, "cell", kept_cell(self.cell))
        self._adopt_cell()

    def kept_cells(self) -> list:
        return [self.cell]

    def onnx_node(self, part):
        return MATMUL_OP, {}


class KeptLSTM(_KeptRNNMixin, SwappedLSTM):
    pass


class KeptGRU(_KeptRNNMixin, SwappedGRU):
    pass


class KeptSimpleRNN(_KeptRNNMixin, SwappedSimpleRNN):
    pass


class KeptRNN(_KeptRNNMixin, SwappedRNN):
    @classmethod
    def from_config(cls, config, custom_objects=None):
        # its cell carries the record (and the cell is already swapped)
        config = {key: value for key, value in config.items() if key != "arithmetic"}
        return super().from_config(config, custom_objects)


class KeptBidirectional(SwappedBidirectional):
    """Both directions as kept layers: the forward cell's parts first, then the backward's (the
    order of `part_schemes()`)."""

    graphswap_marker = ""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for attribute in ("forward_layer", "backward_layer"):
            inner = getattr(self, attribute)
            config = inner.get_config()
            if not isinstance(inner, SwappedRNN):
                config["arithmetic"] = inner.arithmetic
            kept = KEPT_CLASSES[type_name(inner)]     # a direction is an LSTM/GRU/SimpleRNN/RNN
            replace_attribute(self, attribute, kept.from_config(config))

    def kept_cells(self) -> list:
        return [self.forward_layer.cell, self.backward_layer.cell]

    def onnx_node(self, part):
        return MATMUL_OP, {}


class KeptTimeDistributed(FoldedTimeDistributed):
    """TimeDistributed around a kept layer, the timesteps folded into one call of it (traced
    only); its parts are the wrapped layer's."""

    graphswap_marker = ""

    def onnx_node(self, part):
        return self.layer.onnx_node(part)


def mark(layer, marker: str) -> None:
    """Give a marked layer its marker (and a kept recurrent layer's cells theirs, each with the
    index of its first part; a TimeDistributed's wrapped layer the same marker)."""
    layer.graphswap_marker = marker
    if isinstance(layer, keras.layers.TimeDistributed) and \
            hasattr(layer.layer, "graphswap_marker"):
        mark(layer.layer, marker)
    base = 0
    for cell in getattr(layer, "kept_cells", list)():
        cell.graphswap_marker, cell.graphswap_part_base = marker, base
        base += 1 + len(cell.intermediate_points)


#: layer kind (graphswap.swap.kinds) -> its kept-kernel class, every kind
#: (tests/test_architecture.py checks)
KEPT_CLASSES = {
    "Dense": KeptDense,
    "Conv2D": KeptConv2D,
    "DepthwiseConv2D": KeptDepthwiseConv2D,
    "SeparableConv2D": KeptSeparableConv2D,
    "Conv1D": KeptConv1D,
    "Conv2DTranspose": KeptConv2DTranspose,
    "EinsumDense": KeptEinsumDense,
    "MultiHeadAttention": KeptMultiHeadAttention,
    "LSTM": KeptLSTM,
    "GRU": KeptGRU,
    "SimpleRNN": KeptSimpleRNN,
    "RNN": KeptRNN,
    "Bidirectional": KeptBidirectional,
    "TimeDistributed": KeptTimeDistributed,
}
