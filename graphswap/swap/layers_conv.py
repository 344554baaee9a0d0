"""Swapped convolution layers beyond Conv2D: SwappedDepthwiseConv2D, SwappedSeparableConv2D,
SwappedConv1D, SwappedConv2DTranspose.

Like SwappedConv2D they subclass the Keras layers (same weights: names, shapes, order,
initialisers, constraints), override only the product, and keep the arithmetic's record and the
backward mode in the config (from_config passes the trust gate: graphswap.swap.layers
SwappedMixin).  Every Keras option is mirrored (Keras itself refuses strides > 1 with dilations > 1 where
TensorFlow cannot compute them); `check_options` refuses, naming the layer and the option, what
cannot be: Keras-quantized layers, and any padding Keras may add later.  The spatial input shape
must be static (the kernel's geometry is fixed when the op is traced).

* DepthwiseConv2D: a grouped conv2d, groups = input channels (graphswap.swap.ops_layers);
  strides, dilations (also together), padding, depth_multiplier, channels_first.
* SeparableConv2D: the depthwise product, then the pointwise 1x1 conv2d - both through the
  kernel (two products, as an accelerator runs them: the depthwise result is quantized again for
  the pointwise one when the kernel is 8-bit).
* Conv1D: a conv2d of height 1 (graphswap.swap.ops.swapped_conv2d); padding "causal" is the left
  padding Keras applies before a "valid" convolution; groups, dilations, channels_first.
* Conv2DTranspose: the stride-1 conv2d of the zero-inserted input with the flipped filter
  (graphswap.native.transpose); strides, output_padding, dilations, padding, channels_first.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from graphswap.errors import UnsupportedLayerError
from graphswap.swap import ops, ops_layers
from graphswap.swap.layers import SwappedMixin


def _nhwc(inputs, channels_first: bool):
    return tf.transpose(inputs, [0, 2, 3, 1]) if channels_first else inputs


def _back(outputs, channels_first: bool):
    return tf.transpose(outputs, [0, 3, 1, 2]) if channels_first else outputs


def _bias_and_activation(layer, outputs, channels: int):
    """What Keras' convolution layers do after the product (base_conv.call)."""
    if layer.use_bias:
        if layer.data_format == "channels_last":
            shape = (1,) * (layer.rank + 1) + (channels,)
        else:
            shape = (1, channels) + (1,) * layer.rank
        outputs = tf.add(outputs, tf.cast(tf.reshape(layer.bias, shape), outputs.dtype))
    if layer.activation is not None:
        return layer.activation(outputs)
    return outputs


@keras.saving.register_keras_serializable(package="graphswap")
class SwappedDepthwiseConv2D(SwappedMixin, keras.layers.DepthwiseConv2D):
    """DepthwiseConv2D whose product runs a graphswap kernel (a grouped conv2d, groups = in)."""

    def __init__(self, kernel_size, arithmetic=None, backward="native", swap_kernel=None,
                 quantization=None, output_correction=None, **kwargs):
        super().__init__(kernel_size, **kwargs)
        check_options(self)
        self._init_swap(arithmetic, swap_kernel, backward, quantization, output_correction)

    def call(self, inputs):
        channels_first = self.data_format == "channels_first"
        outputs = ops_layers.swapped_depthwise_conv2d(
            _nhwc(inputs, channels_first), self.kernel, self.scheme_kernel(), strides=self.strides,
            padding=self.padding, dilations=self.dilation_rate, backward=self.backward)
        channels = int(self.kernel.shape[2]) * self.depth_multiplier
        return _bias_and_activation(self, _back(outputs, channels_first), channels)


@keras.saving.register_keras_serializable(package="graphswap")
class SwappedSeparableConv2D(SwappedMixin, keras.layers.SeparableConv2D):
    """SeparableConv2D whose depthwise and pointwise products both run a graphswap kernel."""

    def __init__(self, filters, kernel_size, arithmetic=None, backward="native",
                 swap_kernel=None, quantization=None, output_correction=None, **kwargs):
        super().__init__(filters, kernel_size, **kwargs)
        check_options(self)
        self._init_swap(arithmetic, swap_kernel, backward, quantization, output_correction)

    def call(self, inputs):
        channels_first = self.data_format == "channels_first"
        depthwise = ops_layers.swapped_depthwise_conv2d(
            _nhwc(inputs, channels_first), self.depthwise_kernel, self.scheme_kernel(),
            strides=self.strides, padding=self.padding, dilations=self.dilation_rate,
            backward=self.backward)
        outputs = ops.swapped_conv2d(depthwise, self.pointwise_kernel, self.scheme_kernel(),
                                     backward=self.backward)
        return _bias_and_activation(self, _back(outputs, channels_first), self.filters)


@keras.saving.register_keras_serializable(package="graphswap")
class SwappedConv1D(SwappedMixin, keras.layers.Conv1D):
    """Conv1D whose convolution runs a graphswap kernel (a conv2d of height 1)."""

    def __init__(self, filters, kernel_size, arithmetic=None, backward="native",
                 swap_kernel=None, quantization=None, output_correction=None, **kwargs):
        super().__init__(filters, kernel_size, **kwargs)
        check_options(self)
        self._init_swap(arithmetic, swap_kernel, backward, quantization, output_correction)

    def call(self, inputs):
        channels_first = self.data_format == "channels_first"
        x = tf.transpose(inputs, [0, 2, 1]) if channels_first else inputs
        padding = self.padding
        if padding == "causal":  # what Keras' Conv1D does: pad on the left, then 'valid'
            left = self.dilation_rate[0] * (self.kernel_size[0] - 1)
            x = tf.pad(x, [[0, 0], [left, 0], [0, 0]])
            padding = "valid"
        outputs = ops.swapped_conv2d(
            tf.expand_dims(x, 1), tf.expand_dims(self.kernel, 0), self.scheme_kernel(),
            strides=(1, self.strides[0]), padding=padding, dilations=(1, self.dilation_rate[0]),
            groups=self.groups, backward=self.backward)
        outputs = tf.squeeze(outputs, [1])
        if channels_first:
            outputs = tf.transpose(outputs, [0, 2, 1])
        return _bias_and_activation(self, outputs, self.filters)


@keras.saving.register_keras_serializable(package="graphswap")
class SwappedConv2DTranspose(SwappedMixin, keras.layers.Conv2DTranspose):
    """Conv2DTranspose whose products run a graphswap kernel (zero-inserted stride-1 conv2d)."""

    def __init__(self, filters, kernel_size, arithmetic=None, backward="native",
                 swap_kernel=None, quantization=None, output_correction=None, **kwargs):
        super().__init__(filters, kernel_size, **kwargs)
        check_options(self)
        self._init_swap(arithmetic, swap_kernel, backward, quantization, output_correction)

    def call(self, inputs):
        channels_first = self.data_format == "channels_first"
        outputs = ops_layers.swapped_conv2d_transpose(
            _nhwc(inputs, channels_first), self.kernel, self.scheme_kernel(), strides=self.strides,
            padding=self.padding, output_padding=self.output_padding,
            dilations=self.dilation_rate, backward=self.backward)
        return _bias_and_activation(self, _back(outputs, channels_first), self.filters)


def check_options(layer) -> None:
    """Raise UnsupportedLayerError, naming the layer and option, for what cannot be mirrored."""
    kind = type(layer).__name__.replace("Swapped", "")
    if getattr(layer, "quantization_mode", None):
        raise UnsupportedLayerError(
            f"layer {layer.name!r}: Keras-quantized {kind} ({layer.quantization_mode}) cannot be "
            f"swapped; swap the float model instead")
    allowed = ("valid", "same", "causal") if isinstance(layer, keras.layers.Conv1D) else (
        "valid", "same")
    if str(layer.padding).lower() not in allowed:
        raise UnsupportedLayerError(
            f"layer {layer.name!r}: padding={layer.padding!r} is not supported for {kind}; "
            f"allowed: {', '.join(repr(a) for a in allowed)}")
