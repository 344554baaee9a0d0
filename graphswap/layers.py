"""Keras layers whose forward pass runs a graphswap kernel: SwappedDense and SwappedConv2D.

They subclass Keras' Dense and Conv2D, so weights (names, shapes, order), initialisers, regularisers,
constraints, bias and activation behave exactly as in the layers they replace; only the product
(`inputs @ kernel`, the convolution) is routed through graphswap.ops.  The kernel spec and the
backward mode are part of the config, so a saved model reloads with the same arithmetic.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from graphswap import ops
from graphswap.errors import UnsupportedLayerError
from graphswap.kernels import Kernel, resolve_kernel


def _normalise_spec(swap_kernel) -> dict:
    """Kernel spec as the JSON-serialisable record stored in configs."""
    if isinstance(swap_kernel, Kernel):
        return swap_kernel.to_config()
    if isinstance(swap_kernel, str):
        return resolve_kernel(swap_kernel).to_config()
    if isinstance(swap_kernel, dict) and "spec" in swap_kernel:
        return dict(swap_kernel)
    raise ValueError(
        f"swap_kernel must be a kernel spec string, a Kernel or a kernel config dict, "
        f"got {swap_kernel!r}")


class _SwappedMixin:
    """Kernel resolution and config shared by the swapped layers."""

    def _init_swap(self, swap_kernel, backward):
        self.swap_kernel = _normalise_spec(swap_kernel)
        self.backward = ops.check_backward_mode(backward)
        # Resolve now, so a missing/untrusted/changed library fails when the model is built or
        # loaded, not in the middle of training.
        self.arithmetic = resolve_kernel(self.swap_kernel)

    def _swap_config(self) -> dict:
        return {"swap_kernel": dict(self.swap_kernel), "backward": self.backward}


@keras.saving.register_keras_serializable(package="graphswap")
class SwappedDense(_SwappedMixin, keras.layers.Dense):
    """Dense whose matmul runs a graphswap kernel (float32), with TensorFlow's MatMul gradient."""

    def __init__(self, units, swap_kernel="exact", backward="native", **kwargs):
        super().__init__(units, **kwargs)
        self._init_swap(swap_kernel, backward)

    def build(self, input_shape):
        super().build(input_shape)
        if self.quantization_mode:
            raise UnsupportedLayerError(
                f"layer {self.name!r}: Keras-quantized Dense ({self.quantization_mode}) cannot be "
                f"swapped; swap the float model instead")

    def call(self, inputs, training=None):
        outputs = ops.swapped_matmul(inputs, self.kernel, self.arithmetic, self.backward)
        if self.bias is not None:
            outputs = tf.add(outputs, tf.cast(self.bias, outputs.dtype))
        if self.activation is not None:
            outputs = self.activation(outputs)
        return outputs

    def get_config(self):
        return {**super().get_config(), **self._swap_config()}


@keras.saving.register_keras_serializable(package="graphswap")
class SwappedConv2D(_SwappedMixin, keras.layers.Conv2D):
    """Conv2D whose convolution runs a graphswap kernel (NHWC/HWIO, float32), TF's gradients."""

    def __init__(self, filters, kernel_size, swap_kernel="exact", backward="native", **kwargs):
        super().__init__(filters, kernel_size, **kwargs)
        check_conv_options(self)
        self._init_swap(swap_kernel, backward)

    def convolution_op(self, inputs, kernel):
        channels_first = self.data_format == "channels_first"
        if channels_first:
            inputs = tf.transpose(inputs, [0, 2, 3, 1])
        outputs = ops.swapped_conv2d(inputs, kernel, self.arithmetic, strides=self.strides,
                                     padding=self.padding, dilations=self.dilation_rate,
                                     groups=self.groups, backward=self.backward)
        if channels_first:
            outputs = tf.transpose(outputs, [0, 3, 1, 2])
        return outputs

    def get_config(self):
        return {**super().get_config(), **self._swap_config()}


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
