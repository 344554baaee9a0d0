"""Kept-kernel Dense and Conv2D, for the kept-kernel ONNX export (graphswap.io.kept_layers holds
the other kinds' and the table of all): the kernel call is one `tf.numpy_function` named by the
layer's marker, which tf2onnx hands to graphswap.io.onnx_export's handler, which makes it a
GraphswapMatMul / GraphswapConv2D node.  Only ever traced for tf2onnx: never trained, never
saved.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from graphswap.io.onnx_ops import MATMUL_OP, conv_attributes
from graphswap.native import conv_geometry
from graphswap.swap import SwappedConv2D, SwappedDense


class KeptDense(SwappedDense):
    """A swapped Dense whose kernel call is one numpy_function named by its marker (only ever
    traced for tf2onnx: never trained, never saved)."""

    graphswap_marker = ""

    def call(self, inputs, training=None):
        dtype = inputs.dtype
        x = tf.cast(inputs, tf.float32)
        w = tf.cast(self.kernel, tf.float32)
        k, n = int(w.shape[0]), int(w.shape[1])
        x2d = tf.reshape(x, [-1, k]) if x.shape.rank != 2 else x
        # the scheme as it is now (static parameters: constants of the export)
        arithmetic = self.current_scheme_kernel()
        y = tf.numpy_function(lambda a, b: arithmetic.matmul(a, b), [x2d, w],
                              tf.float32, stateful=False, name=self.graphswap_marker)
        # ensure_shape, not set_shape: tf2onnx re-infers shapes from the GraphDef, where a
        # PyFunc's output shape is unknown; ops needing it downstream (a Concat with axis -1)
        # would be left half-converted.  EnsureShape carries it and becomes an Identity.
        y = tf.ensure_shape(y, [x2d.shape[0], n])
        y = self._correct_outputs(y)
        if x.shape.rank != 2:
            y = tf.reshape(y, tf.concat([tf.shape(x)[:-1], [n]], axis=0))
            y.set_shape(x.shape[:-1].concatenate([n]))
        if self.bias is not None:
            y = tf.add(y, tf.cast(self.bias, tf.float32))
        if self.activation is not None:
            y = self.activation(y)
        return tf.cast(y, dtype) if dtype != tf.float32 else y

    def onnx_node(self, part):
        return MATMUL_OP, {}


class KeptConv2D(SwappedConv2D):
    """A swapped Conv2D whose kernel call is one marked numpy_function (traced only)."""

    graphswap_marker = ""

    def call(self, inputs, training=None):
        # Keras's own Conv2D.call: convolution_op below, then Keras's bias add (ONNX's Add)
        return keras.layers.Conv2D.call(self, inputs)

    def convolution_op(self, inputs, kernel):
        channels_first = self.data_format == "channels_first"
        x = tf.cast(inputs, tf.float32)
        if channels_first:
            x = tf.transpose(x, [0, 2, 3, 1])
        w = tf.cast(kernel, tf.float32)
        filter_shape = tuple(int(d) for d in w.shape)
        strides, dilations = tuple(self.strides), tuple(self.dilation_rate)
        padding, groups = self.padding, self.groups
        # the scheme as it is now (static parameters: constants of the export)
        arithmetic = self.current_scheme_kernel()

        def forward(x_array, w_array):
            geometry = conv_geometry(x_array.shape, filter_shape, strides, dilations, padding,
                                     groups)
            return arithmetic.conv2d(x_array, w_array, geometry)

        y = tf.numpy_function(forward, [x, w], tf.float32, stateful=False,
                              name=self.graphswap_marker)
        static = x.shape
        if None not in static[1:]:
            g = conv_geometry((1, *static[1:]), filter_shape, strides, dilations, padding,
                              groups)
            y = tf.ensure_shape(y, [static[0], g.out_height, g.out_width, filter_shape[3]])
        y = self._correct_outputs(y)
        if channels_first:
            y = tf.transpose(y, [0, 3, 1, 2])
        return tf.cast(y, inputs.dtype) if inputs.dtype != tf.float32 else y

    def onnx_node(self, part):
        return conv_attributes(self.padding, self.strides, self.dilation_rate, self.groups)
