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
  the pointwise one when the kernel is 8-bit, on a range of its own when calibrated).
* Conv1D: a conv2d of height 1 (graphswap.swap.ops.swapped_conv2d); padding "causal" is the left
  padding Keras applies before a "valid" convolution; groups, dilations, channels_first.
* Conv2DTranspose: the stride-1 conv2d of the zero-inserted input with the flipped filter
  (graphswap.native.transpose); strides, output_padding, dilations, padding, channels_first.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from graphswap.errors import UnsupportedLayerError
from graphswap.kernels import bind_scheme
from graphswap.native import conv_geometry
from graphswap.swap import ops, ops_layers
from graphswap.swap.layers import SwappedMixin


def _nhwc(inputs, channels_first: bool):
    return tf.transpose(inputs, [0, 2, 3, 1]) if channels_first else inputs


def _back(outputs, channels_first: bool):
    return tf.transpose(outputs, [0, 3, 1, 2]) if channels_first else outputs


@keras.saving.register_keras_serializable(package="graphswap")
class SwappedDepthwiseConv2D(SwappedMixin, keras.layers.DepthwiseConv2D):
    """DepthwiseConv2D whose product runs a graphswap kernel (a grouped conv2d, groups = in);
    one input, one product: calibrated static ranges and an output correction, like Conv2D."""


    def __init__(self, kernel_size, arithmetic=None, backward="native", swap_kernel=None,
                 quantization=None, output_correction=None, **kwargs):
        super().__init__(kernel_size, **kwargs)
        check_options(self)
        self._init_swap(arithmetic, swap_kernel, backward, quantization, output_correction)

    def build(self, input_shape):
        super().build(input_shape)
        self._build_quantization(int(self.kernel.shape[2]) * self.depth_multiplier)

    def call(self, inputs, training=None):
        channels_first = self.data_format == "channels_first"
        x = _nhwc(inputs, channels_first)
        quant, activation_range = self._quant_inputs(x, training)
        # the output correction and the bias in the op's epilogue (one pass in C)
        gain, shift = self._output_epilogue(self.bias if self.use_bias else None)
        outputs = ops_layers.swapped_depthwise_conv2d(
            x, self.kernel, self.arithmetic, strides=self.strides, padding=self.padding,
            dilations=self.dilation_rate, backward=self.backward, quant=quant,
            activation_range=activation_range, gain=gain, shift=shift)
        outputs = _back(outputs, channels_first)
        return self.activation(outputs) if self.activation is not None else outputs

    def numpy_product(self, x, arithmetic=None, quant=None):
        """The layer's product (no correction, bias or activation) of an NHWC input."""
        return ops_layers.depthwise_product(
            arithmetic or self.arithmetic, x, np.asarray(self.kernel, dtype=np.float32),
            tuple(self.strides), self.padding, tuple(self.dilation_rate), quant)


@keras.saving.register_keras_serializable(package="graphswap")
class SwappedSeparableConv2D(SwappedMixin, keras.layers.SeparableConv2D):
    """SeparableConv2D whose depthwise and pointwise products both run a graphswap kernel; each
    product's activations have their own static range when calibrated (the layer's input, and
    the depthwise result: intermediate point "pointwise"); the output correction applies to the
    pointwise product, per filter."""

    intermediate_points = ("pointwise",)

    def __init__(self, filters, kernel_size, arithmetic=None, backward="native",
                 swap_kernel=None, quantization=None, output_correction=None,
                 intermediate_ranges=None, **kwargs):
        super().__init__(filters, kernel_size, **kwargs)
        check_options(self)
        self._init_swap(arithmetic, swap_kernel, backward, quantization, output_correction,
                        intermediate_ranges)

    def build(self, input_shape):
        super().build(input_shape)
        self._build_quantization(self.filters)

    def call(self, inputs, training=None):
        channels_first = self.data_format == "channels_first"
        x = _nhwc(inputs, channels_first)
        quant, activation_range = self._quant_inputs(x, training)
        depthwise = ops_layers.swapped_depthwise_conv2d(
            x, self.depthwise_kernel, self.arithmetic, strides=self.strides,
            padding=self.padding, dilations=self.dilation_rate, backward=self.backward,
            quant=quant, activation_range=activation_range)
        # the depthwise result is quantized again, on its own range, for the pointwise product
        quant, activation_range = self._quant_inputs(depthwise, training, "pointwise")
        # the correction, the bias and a plain ReLU in the op's epilogue (one pass in C)
        gain, shift = self._output_epilogue(self.bias if self.use_bias else None)
        relu = self._fused_relu()
        outputs = ops.swapped_conv2d(depthwise, self.pointwise_kernel, self.arithmetic,
                                     backward=self.backward, quant=quant,
                                     activation_range=activation_range, gain=gain, shift=shift,
                                     relu=relu)
        outputs = _back(outputs, channels_first)
        return outputs if self.activation is None or relu else self.activation(outputs)

    def pointwise_scheme(self, quant):
        """The pointwise product's scheme for the depthwise input's scheme `quant`: a static
        scheme takes the layer's pointwise range."""
        if quant is None or quant.activations != "static":
            return quant
        return quant.with_range(*self.intermediate_ranges()["pointwise"])

    def numpy_product(self, x, arithmetic=None, quant=None):
        """Both products (no correction, bias or activation) of an NHWC input, the depthwise
        result requantized on the pointwise range."""
        arithmetic = arithmetic or self.arithmetic
        depthwise = ops_layers.depthwise_product(
            arithmetic, x, np.asarray(self.depthwise_kernel, dtype=np.float32),
            tuple(self.strides), self.padding, tuple(self.dilation_rate), quant)
        w = np.asarray(self.pointwise_kernel, dtype=np.float32)
        g = conv_geometry(depthwise.shape, w.shape, (1, 1), (1, 1), "valid")
        return bind_scheme(arithmetic, self.pointwise_scheme(quant)).conv2d(depthwise, w, g)


@keras.saving.register_keras_serializable(package="graphswap")
class SwappedConv1D(SwappedMixin, keras.layers.Conv1D):
    """Conv1D whose convolution runs a graphswap kernel (a conv2d of height 1); one input, one
    product: calibrated static ranges and an output correction, like Conv2D."""


    def __init__(self, filters, kernel_size, arithmetic=None, backward="native",
                 swap_kernel=None, quantization=None, output_correction=None, **kwargs):
        super().__init__(filters, kernel_size, **kwargs)
        check_options(self)
        self._init_swap(arithmetic, swap_kernel, backward, quantization, output_correction)

    def build(self, input_shape):
        super().build(input_shape)
        self._build_quantization(self.filters)

    def _product_input(self, inputs):
        """The NHWC (height 1) input the product sees, and the padding it runs with: Keras'
        "causal" is left padding, then a "valid" convolution."""
        x = tf.transpose(inputs, [0, 2, 1]) if self.data_format == "channels_first" else inputs
        padding = self.padding
        if padding == "causal":
            left = self.dilation_rate[0] * (self.kernel_size[0] - 1)
            x = tf.pad(x, [[0, 0], [left, 0], [0, 0]])
            padding = "valid"
        return tf.expand_dims(x, 1), padding

    def call(self, inputs, training=None):
        x, padding = self._product_input(inputs)
        quant, activation_range = self._quant_inputs(x, training)
        gain, shift = self._output_epilogue(self.bias if self.use_bias else None)
        outputs = ops.swapped_conv2d(
            x, tf.expand_dims(self.kernel, 0), self.arithmetic, strides=(1, self.strides[0]),
            padding=padding, dilations=(1, self.dilation_rate[0]), groups=self.groups,
            backward=self.backward, quant=quant, activation_range=activation_range, gain=gain,
            shift=shift)
        outputs = tf.squeeze(outputs, [1])
        if self.data_format == "channels_first":
            outputs = tf.transpose(outputs, [0, 2, 1])
        return self.activation(outputs) if self.activation is not None else outputs

    def numpy_product(self, x, arithmetic=None, quant=None):
        """The layer's product (no correction, bias or activation) of the NHWC (height 1) input
        `call` hands its observer."""
        arithmetic = arithmetic or self.arithmetic
        w = np.asarray(self.kernel, dtype=np.float32)[None]
        padding = "valid" if self.padding == "causal" else self.padding
        geometry = conv_geometry(x.shape, w.shape, (1, int(self.strides[0])),
                                 (1, int(self.dilation_rate[0])), padding, self.groups)
        return bind_scheme(arithmetic, quant).conv2d(x, w, geometry)


@keras.saving.register_keras_serializable(package="graphswap")
class SwappedConv2DTranspose(SwappedMixin, keras.layers.Conv2DTranspose):
    """Conv2DTranspose whose products run a graphswap kernel (zero-inserted stride-1 conv2d);
    one input, one product: calibrated static ranges and an output correction, like Conv2D."""


    def __init__(self, filters, kernel_size, arithmetic=None, backward="native",
                 swap_kernel=None, quantization=None, output_correction=None, **kwargs):
        super().__init__(filters, kernel_size, **kwargs)
        check_options(self)
        self._init_swap(arithmetic, swap_kernel, backward, quantization, output_correction)

    def build(self, input_shape):
        super().build(input_shape)
        self._build_quantization(self.filters)

    def call(self, inputs, training=None):
        channels_first = self.data_format == "channels_first"
        x = _nhwc(inputs, channels_first)
        quant, activation_range = self._quant_inputs(x, training)
        gain, shift = self._output_epilogue(self.bias if self.use_bias else None)
        relu = self._fused_relu()
        outputs = ops_layers.swapped_conv2d_transpose(
            x, self.kernel, self.arithmetic, strides=self.strides, padding=self.padding,
            output_padding=self.output_padding, dilations=self.dilation_rate,
            backward=self.backward, quant=quant, activation_range=activation_range, gain=gain,
            shift=shift, relu=relu)
        outputs = _back(outputs, channels_first)
        return outputs if self.activation is None or relu else self.activation(outputs)

    def numpy_product(self, x, arithmetic=None, quant=None):
        """The layer's product (no correction, bias or activation) of an NHWC input."""
        return ops_layers.transposed_product(
            arithmetic or self.arithmetic, x, np.asarray(self.kernel, dtype=np.float32),
            tuple(self.strides), self.padding, self.output_padding, tuple(self.dilation_rate),
            quant)


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
