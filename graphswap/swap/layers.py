"""Keras layers whose forward pass runs a graphswap kernel: SwappedDense and SwappedConv2D.

They subclass Keras' Dense and Conv2D, so weights (names, shapes, order), initialisers, regularisers,
constraints, bias and activation behave exactly as in the layers they replace; only the product
(`inputs @ kernel`, the convolution) is routed through graphswap.swap.ops.  The arithmetic's record
and the backward mode are part of the config, so a saved model reloads with the same arithmetic
- after the record has passed the trust gate (from_config -> kernels.open_record).  A layer whose
arithmetic quantizes also carries its quantization state (graphswap/swap/quantstate.py: scheme,
static activation range, output correction), in the config too.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from graphswap.errors import UnsupportedLayerError
from graphswap.kernels import Kernel, bind_scheme, open_record, resolve_kernel
from graphswap.native import conv_geometry
from graphswap.swap import ops
from graphswap.swap.quantstate import LEGACY, QuantizedLayerMixin, check_quantization


def check_lut_grad(swapped_class, layer_name: str, backward: str) -> None:
    """Refuse backward="lut_grad" (naming the layer) for a class whose op has no lut_grad."""
    if backward == "lut_grad" and not swapped_class.lut_grad_supported:
        raise UnsupportedLayerError(
            f"layer {layer_name!r}: backward='lut_grad' is implemented for Dense and Conv2D; "
            f"use backward='native' or 'kernel' for {swapped_class.__name__}, or swap only "
            f"Dense/Conv2D layers with lut_grad")


def check_lut_grad_kernel(arithmetic, layer_name: str, backward: str) -> None:
    """Refuse backward="lut_grad" (naming the layer) for a kernel without an integer table
    (the 8-bit float multipliers, graphswap/kernels/fp8.py)."""
    if backward == "lut_grad" and not getattr(arithmetic, "has_lut_grad", True):
        raise UnsupportedLayerError(
            f"layer {layer_name!r}: backward='lut_grad' differentiates an integer multiplier's "
            f"table over its evenly spaced codes; {arithmetic.spec} is an 8-bit float "
            f"multiplier (its codes are not evenly spaced); use backward='native' or 'kernel'")


class _SwappedMixin(QuantizedLayerMixin):
    """The arithmetic (a resolved Kernel) and its config, shared by the swapped layers.

    `lut_grad_supported`: whether the layer's op implements backward="lut_grad" (Dense and
    Conv2D); the others refuse it when made.

    Keras calls the weight matrix `kernel`, so the Kernel a swapped layer computes with is its
    `arithmetic`; the config stores the Kernel's record under "arithmetic" (files written before
    used "swap_kernel", which is still read)."""

    lut_grad_supported = False

    def _init_swap(self, arithmetic, swap_kernel, backward, quantization=None,
                   output_correction=None, intermediate_ranges=None):
        if swap_kernel is not None:  # the older keyword
            if arithmetic is not None:
                raise UnsupportedLayerError(
                    f"layer {self.name!r}: pass arithmetic= or its older name swap_kernel=, not both")
            arithmetic = swap_kernel
        # Resolve now, so a missing/untrusted/changed library fails when the model is built or
        # loaded, not in the middle of training.  A spec string here is named by the user's code.
        self.arithmetic = resolve_kernel("exact" if arithmetic is None else arithmetic)
        self.backward = ops.check_backward_mode(backward)
        check_lut_grad(type(self), self.name, self.backward)
        check_lut_grad_kernel(self.arithmetic, self.name, self.backward)
        self._init_quantization(quantization, output_correction, intermediate_ranges)

    def _fused_relu(self) -> bool:
        """Whether the op applies this layer's activation itself: Keras's plain ReLU, whose
        gradient (ReluGrad on the output) the op then registers."""
        return self.activation is keras.activations.relu

    def current_scheme_kernel(self, point: str | None = None) -> Kernel:
        """The arithmetic bound to the scheme as it is now - a static range as its current value
        (for exports, where it becomes a constant) - of the layer's input, or of the
        intermediate operand `point`."""
        return bind_scheme(self.arithmetic, self.current_quantization(point))

    def _scheme_config(self):
        return None if self.quantization is None else self.quantization.to_config()

    @property
    def swap_kernel(self) -> dict:
        """The arithmetic's record (its older name)."""
        return self.arithmetic.to_config()

    def _swap_config(self) -> dict:
        return {"arithmetic": self.arithmetic.to_config(), "backward": self.backward,
                **self._quantization_config()}

    def get_config(self):
        """The stock layer's config plus the arithmetic's record, backward mode and scheme."""
        return {**super().get_config(), **self._swap_config()}

    @classmethod
    def from_config(cls, config):
        """Rebuild from a config, where the arithmetic's record comes from a file: it passes the
        trust gate (kernels.open_record) before anything is loaded."""
        config = dict(config)
        legacy = config.pop("swap_kernel", None)
        arithmetic = config.pop("arithmetic", None)
        if arithmetic is None:
            arithmetic = legacy if legacy is not None else "exact"
        if not isinstance(arithmetic, Kernel):
            arithmetic = open_record(arithmetic, f"layer {config.get('name')!r}")
        # written before quantization schemes existed: the scheme it was trained with
        config.setdefault("quantization", LEGACY)
        check_quantization(arithmetic, config["quantization"])  # before Keras wraps errors
        return super().from_config({**config, "arithmetic": arithmetic})


@keras.saving.register_keras_serializable(package="graphswap")
class SwappedDense(_SwappedMixin, keras.layers.Dense):
    """Dense whose matmul runs a graphswap kernel (float32), with TensorFlow's MatMul gradient."""

    lut_grad_supported = True

    def __init__(self, units, arithmetic=None, backward="native", swap_kernel=None,
                 quantization=None, output_correction=None, **kwargs):
        super().__init__(units, **kwargs)
        self._init_swap(arithmetic, swap_kernel, backward, quantization, output_correction)

    def build(self, input_shape):
        super().build(input_shape)
        if self.quantization_mode:
            raise UnsupportedLayerError(
                f"layer {self.name!r}: Keras-quantized Dense ({self.quantization_mode}) cannot be "
                f"swapped; swap the float model instead")
        self._build_quantization(self.units)

    def call(self, inputs, training=None):
        quant, activation_range = self._quant_inputs(
            tf.reshape(inputs, [-1, inputs.shape[-1]]), training)
        gain, shift = self._output_epilogue(self.bias)
        relu = self._fused_relu()
        outputs = ops.swapped_matmul(inputs, self.kernel, self.arithmetic, self.backward,
                                     quant, activation_range, gain, shift, relu)
        if self.activation is not None and not relu:
            outputs = self.activation(outputs)
        return outputs

    def numpy_product(self, x, arithmetic=None, quant=None):
        """The layer's product (no correction, bias or activation) of an (m, k) input."""
        arithmetic = arithmetic or self.arithmetic
        w = np.asarray(self.kernel, dtype=np.float32)
        return bind_scheme(arithmetic, quant).matmul(x, w)


@keras.saving.register_keras_serializable(package="graphswap")
class SwappedConv2D(_SwappedMixin, keras.layers.Conv2D):
    """Conv2D whose convolution runs a graphswap kernel (NHWC/HWIO, float32), TF's gradients."""

    lut_grad_supported = True

    def __init__(self, filters, kernel_size, arithmetic=None, backward="native", swap_kernel=None,
                 quantization=None, output_correction=None, **kwargs):
        super().__init__(filters, kernel_size, **kwargs)
        check_conv_options(self)
        self._init_swap(arithmetic, swap_kernel, backward, quantization, output_correction)
        self._training_call = None

    def build(self, input_shape):
        super().build(input_shape)
        self._build_quantization(self.filters)

    def call(self, inputs, training=None):
        # Conv2D.call takes no `training`; the moving-average observer needs it
        self._training_call = training
        try:
            if self.data_format == "channels_first":
                return super().call(inputs)   # Keras adds the bias after convolution_op
            # channels_last: correction and bias inside the op's call (one pass in C)
            relu = self._fused_relu()
            outputs = self._convolve(inputs, self.kernel, self.bias if self.use_bias else None,
                                     relu)
            return outputs if self.activation is None or relu else self.activation(outputs)
        finally:
            self._training_call = None

    def convolution_op(self, inputs, kernel):
        """Keras's hook (channels_first layers): NCHW in and out around the NHWC op."""
        outputs = self._convolve(tf.transpose(inputs, [0, 2, 3, 1]), kernel, None)
        return tf.transpose(outputs, [0, 3, 1, 2])

    def _convolve(self, inputs, kernel, bias, relu=False):
        """The swapped convolution of NHWC inputs, corrected, plus `bias` when given (then the
        ReLU with `relu`)."""
        quant, activation_range = self._quant_inputs(inputs, self._training_call)
        gain, shift = self._output_epilogue(bias)
        return ops.swapped_conv2d(inputs, kernel, self.arithmetic, strides=self.strides,
                                  padding=self.padding, dilations=self.dilation_rate,
                                  groups=self.groups, backward=self.backward, quant=quant,
                                  activation_range=activation_range, gain=gain, shift=shift,
                                  relu=relu)

    def numpy_product(self, x, arithmetic=None, quant=None):
        """The layer's convolution (no correction, bias or activation) of an NHWC input."""
        arithmetic = arithmetic or self.arithmetic
        w = np.asarray(self.kernel, dtype=np.float32)
        g = conv_geometry(x.shape, w.shape, tuple(self.strides), tuple(self.dilation_rate),
                          self.padding, self.groups)
        return bind_scheme(arithmetic, quant).conv2d(x, w, g)


def check_conv_options(layer) -> None:
    """Raise UnsupportedLayerError, naming the layer and option, for Conv2D options we can't mirror."""
    strides = tuple(layer.strides)
    dilations = tuple(layer.dilation_rate)
    if max(strides) > 1 and max(dilations) > 1:
        raise UnsupportedLayerError(
            f"layer {layer.name!r}: strides={strides} together with dilation_rate={dilations} is not "
            f"supported (TensorFlow has no Conv2D gradient for it); allowed: strides=1 or "
            f"dilation_rate=1")
    if str(layer.padding).lower() not in ("valid", "same"):
        raise UnsupportedLayerError(
            f"layer {layer.name!r}: padding={layer.padding!r} is not supported; allowed: 'valid', "
            f"'same'")
    if getattr(layer, "quantization_mode", None):
        raise UnsupportedLayerError(
            f"layer {layer.name!r}: Keras-quantized Conv2D ({layer.quantization_mode}) cannot be "
            f"swapped; swap the float model instead")


#: the mixin under its public name, for the swapped layers of graphswap.swap.layers_conv and
#: graphswap.swap.layers_attention
SwappedMixin = _SwappedMixin
