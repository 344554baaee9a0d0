"""TensorFlow ops whose forward pass runs a graphswap Kernel and whose backward pass is TensorFlow's.

Forward: one C call for the whole batch, with the static output shape set - through graphswap's
compiled TensorFlow op where it covers the kernel (graphswap.swap.forward_op: float libraries and
the fused table kernels), else through `tf.numpy_function`.  Backward (`backward="native"`): the same computations TensorFlow registers as the
gradients of MatMul and Conv2D (MatMul: dy @ w^T and x^T @ dy; Conv2D: Conv2DBackpropInput and
Conv2DBackpropFilter with the forward's VALID/SAME padding), against the float weights - the
straight-through estimator for approximate forwards, and bit-for-bit TensorFlow's own gradient code
for the exact kernel.  `backward="kernel"` sends the backward products through the same kernel (as
ApproxTrain does): the matmuls directly, the convolution gradients as patches x matmul.
`backward="lut_grad"` (8-bit multiplier kernels; float kernels fall back to "native") uses the
table's own partial derivatives (graphswap/kernels/derivatives.py) on the forward's codes.

Weights are explicit inputs of the custom-gradient functions (no captured variables), and all
inputs are cast to float32 for the kernel; the casts' own gradients cast back, so float16,
bfloat16 and mixed-precision policies work unchanged.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from graphswap import native
from graphswap.errors import UnsupportedLayerError
from graphswap.kernels import Kernel, bind_scheme, lut_conv2d_gradients, lut_matmul_gradients
from graphswap.native import conv_geometry
from graphswap.swap import forward_op, xla

BACKWARD_MODES = ("native", "kernel", "lut_grad")

_sized_libraries: set = set()


@tf.autograph.experimental.do_not_convert
def _configure_threads(arithmetic: Kernel) -> None:
    """Size the thread pool of every kernel library a swapped op uses - graphswap's own and the
    arithmetic's - from TensorFlow's intra-op setting, once per library."""
    threads = tf.config.threading.get_intra_op_parallelism_threads() or (os.cpu_count() or 1)
    for library in (native.shipped_library(), getattr(arithmetic, "library", None)):
        if library is None or library.path in _sized_libraries:
            continue
        library.set_num_threads(threads)
        _sized_libraries.add(library.path)


#: public name, for the ops of graphswap.swap.ops_layers
configure_threads = _configure_threads


def check_backward_mode(backward: str) -> str:
    if backward not in BACKWARD_MODES:
        raise UnsupportedLayerError(f"backward must be one of {BACKWARD_MODES}, got {backward!r}")
    return backward


# --------------------------------------------------------------------------------------------
# matmul
# --------------------------------------------------------------------------------------------

def scheme_with_range(quant, activation_range):
    """The QuantScheme a kernel call receives: the layer's scheme, with the current static range
    (a float32 array [lo, hi] read from the layer's state) when there is one."""
    if quant is None or activation_range is None:
        return quant
    lo, hi = (float(v) for v in np.asarray(activation_range, dtype=np.float32))
    return quant.with_range(lo, hi)


def gradient_kernel(arithmetic: Kernel, quant) -> Kernel:
    """The arithmetic for backward="kernel" products: gradients have ranges of their own, so
    dynamic activations with the layer's weight encoding."""
    return bind_scheme(arithmetic, quant.dynamic() if quant is not None else None)


def kernel_call(method, quant, with_range: bool, epilogue: tuple = (False, False, False)):
    """`method(*arrays)` for numpy_function.  With `with_range` the array after the operands is
    the static activation range and becomes the scheme's; `quant` is passed only when not None
    (kernels written against the older interface take no quant argument).  `epilogue` = (has
    gain, has shift, relu): the last arrays are the per-channel gain and shift applied to the
    product, then the ReLU, in one native pass (graphswap_channel_affine_f32)."""
    has_gain, has_shift, relu = epilogue
    # resolved now, at trace time: finding the library re-hashes a source checkout's sources
    affine = native.shipped_library().channel_affine_ if any(epilogue) else None

    def call(*arrays):
        arrays = list(arrays)
        shift = arrays.pop() if has_shift else None
        gain = arrays.pop() if has_gain else None
        if quant is None:
            product = method(*arrays)
        elif with_range:
            *arrays, activation_range = arrays
            product = method(*arrays, quant=scheme_with_range(quant, activation_range))
        else:
            product = method(*arrays, quant=quant)
        if affine is None:
            return product
        return affine(product, gain, shift, relu)

    return call


def epilogue_inputs(gain, shift) -> list:
    """The epilogue tensors an op passes on (float32; None ones left out)."""
    return [tf.cast(t, tf.float32) for t in (gain, shift) if t is not None]


def epilogue_gradients(dy, y, gain, shift, relu):
    """(dy of the product, [gradients of the epilogue inputs]) for y = relu?(product * gain +
    shift): TensorFlow's own ReluGrad (on the output, as it registers for Relu) and BiasAdd
    gradient; the gain is non-trainable state (the output correction), so it gets none."""
    if relu:
        dy = tf.raw_ops.ReluGrad(gradients=dy, features=y)
    extra = []
    if gain is not None:
        extra.append(None)
    if shift is not None:
        extra.append(tf.raw_ops.BiasAddGrad(out_backprop=dy, data_format="NHWC"))
    if gain is not None:
        dy = dy * tf.cast(gain, dy.dtype)
    return dy, extra


def _kernel_matmul(arithmetic: Kernel, a, b, m_static, n_static, quant=None, activation_range=None,
                  gain=None, shift=None, relu=False):
    if xla.use_device_path(arithmetic, a):  # inside XLA / on an accelerator (swap/xla.py)
        out = xla.device_matmul(arithmetic, a, b, quant, activation_range, gain, shift, relu)
        out.set_shape([m_static, n_static])
        return out
    if forward_op.supports(arithmetic, "matmul"):
        out = forward_op.matmul(arithmetic, a, b, gain, shift, relu, quant, activation_range)
        out.set_shape([m_static, n_static])
        return out
    with_range = activation_range is not None
    inputs = [a, b] + ([activation_range] if with_range else []) + epilogue_inputs(gain, shift)
    call = kernel_call(arithmetic.matmul, quant, with_range,
                       (gain is not None, shift is not None, relu))
    out = tf.numpy_function(call, inputs, tf.float32, stateful=False, name="graphswap_matmul")
    out.set_shape([m_static, n_static])
    return out


@tf.autograph.experimental.do_not_convert  # plain graph-building code: nothing to convert
def swapped_matmul(x, w, arithmetic: Kernel, backward: str = "native", quant=None,
                   activation_range=None, gain=None, shift=None, relu=False):
    """x (..., k) @ w (k, n) with the arithmetic's forward; returns x's dtype, shape (..., n).

    `quant` (the layer's QuantScheme) and `activation_range` (its static range tensor, or None)
    go to the kernel with every forward call.  `gain` and `shift` ((n,) tensors or None) and
    `relu`: the result is relu?(product * gain + shift) (a layer's output correction, bias and
    activation), applied inside the same numpy_function call."""
    _configure_threads(arithmetic)
    dtype = x.dtype
    x32 = tf.cast(x, tf.float32)
    w32 = tf.cast(w, tf.float32)
    k = w32.shape[0]
    n = w32.shape[1]
    leading_static = x32.shape[:-1]
    x2d = tf.reshape(x32, [-1, k]) if x32.shape.rank != 2 else x32
    m_static = x2d.shape[0]

    def product_gradients(a, b, dy):
        if backward == "lut_grad" and quant is not None:
            if xla.use_device_path(arithmetic, a):   # inside XLA / on an accelerator
                return xla.device_lut_grad_matmul(arithmetic, a, b, dy, quant, activation_range)
            return _lut_grad_matmul(arithmetic, a, b, dy, quant, activation_range)
        if backward in ("native", "lut_grad"):
            # what TensorFlow registers for MatMul(transpose_a=False, transpose_b=False)
            return (tf.linalg.matmul(dy, b, transpose_b=True),
                    tf.linalg.matmul(a, dy, transpose_a=True))
        # gradients have ranges of their own: dynamic, with the layer's weight encoding
        backward_quant = quant.dynamic() if quant is not None else None
        da = _kernel_matmul(arithmetic, dy, tf.transpose(b), m_static, k, backward_quant)
        db = _kernel_matmul(arithmetic, tf.transpose(a), dy, k, n, backward_quant)
        return da, db

    @tf.custom_gradient
    def matmul(a, b, *epilogue):
        g, s = split_epilogue(epilogue, gain, shift)
        y = _kernel_matmul(arithmetic, a, b, m_static, n, quant, activation_range, g, s, relu)

        def grad(dy):
            dy, extra = epilogue_gradients(dy, y, g, s, relu)
            return (*product_gradients(a, b, dy), *extra)

        return y, grad

    y = matmul(x2d, w32, *epilogue_inputs(gain, shift))
    if x32.shape.rank != 2:
        y = tf.reshape(y, tf.concat([tf.shape(x32)[:-1], [n]], axis=0))
        y.set_shape(leading_static.concatenate([n]))
    return tf.cast(y, dtype) if dtype != tf.float32 else y


def split_epilogue(tensors, gain, shift):
    """(gain, shift) back out of the custom-gradient function's extra arguments."""
    tensors = list(tensors)
    return (tensors.pop(0) if gain is not None else None,
            tensors.pop(0) if shift is not None else None)


def _lut_grad_matmul(arithmetic, a, b, dy, quant, activation_range):
    """(da, db) through the table's own derivatives (graphswap/kernels/derivatives.py)."""
    with_range = activation_range is not None

    def gradients(a_array, b_array, dy_array, *rest):
        scheme = scheme_with_range(quant, rest[0]) if with_range else quant
        return lut_matmul_gradients(arithmetic, a_array, b_array, dy_array, quant=scheme)

    inputs = [a, b, dy] + ([activation_range] if with_range else [])
    da, db = tf.numpy_function(gradients, inputs, [tf.float32, tf.float32], stateful=False,
                               name="graphswap_matmul_lut_grad")
    da.set_shape(a.shape)
    db.set_shape(b.shape)
    return da, db


# --------------------------------------------------------------------------------------------
# conv2d
# --------------------------------------------------------------------------------------------

def _dilated_vjp(strides, dilations, padding):
    def one_group(x, w, dy_group):
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            y = tf.nn.convolution(x, w, strides=list(strides), padding=padding.upper(),
                                  dilations=list(dilations))
        return tape.gradient(y, [x, w], output_gradients=dy_group)

    return one_group


def _native_conv_gradients(inputs, filters, dy, strides, dilations, groups,
                           padding_string="valid"):
    """TensorFlow's Conv2D gradient ops; grouped convolutions one group at a time, because
    TensorFlow's CPU backprop kernels reject grouped filters.

    The padding is passed as the forward's "VALID"/"SAME" (the same geometry TensorFlow derives,
    and what nn_grad._Conv2DGrad passes for a stock layer), never "EXPLICIT": TensorFlow's CPU
    backprop kernels run explicit paddings without oneDNN, about 8x slower (LeNet-5's first conv:
    7.7 ms against 0.9 ms at batch 256)."""
    tf_strides = [1, strides[0], strides[1], 1]
    tf_dilations = [1, dilations[0], dilations[1], 1]
    tf_padding = str(padding_string).upper()

    def one_group(x, w, dy_group):
        dx = tf.raw_ops.Conv2DBackpropInput(
            input_sizes=tf.shape(x), filter=w, out_backprop=dy_group, strides=tf_strides,
            padding=tf_padding, dilations=tf_dilations, data_format="NHWC")
        dw = tf.raw_ops.Conv2DBackpropFilter(
            input=x, filter_sizes=tf.shape(w), out_backprop=dy_group, strides=tf_strides,
            padding=tf_padding, dilations=tf_dilations, data_format="NHWC")
        return dx, dw

    if max(dilations) > 1:
        # TensorFlow's CPU backprop kernels reject dilations; tf.nn.convolution realises a dilated
        # convolution as SpaceToBatch -> Conv2D -> BatchToSpace, and its gradient is what an
        # unswapped Keras layer gets, so take the vector-Jacobian product of exactly that.
        one_group = _dilated_vjp(strides, dilations, padding_string)
    if groups == 1:
        return one_group(inputs, filters, dy)
    xs = tf.split(inputs, groups, axis=3)
    ws = tf.split(filters, groups, axis=3)
    dys = tf.split(dy, groups, axis=3)
    parts = [one_group(x, w, d) for x, w, d in zip(xs, ws, dys)]
    return tf.concat([p[0] for p in parts], axis=3), tf.concat([p[1] for p in parts], axis=3)


@tf.autograph.experimental.do_not_convert
def swapped_conv2d(x, w, arithmetic: Kernel, strides=(1, 1), padding="valid", dilations=(1, 1),
                   groups=1, backward: str = "native", quant=None, activation_range=None,
                   gain=None, shift=None, relu=False):
    """NHWC x HWIO convolution with the arithmetic's forward; returns x's dtype (`quant`,
    `activation_range`, `gain`, `shift`, `relu`: as for swapped_matmul)."""
    _configure_threads(arithmetic)
    strides = tuple(int(s) for s in strides)
    dilations = tuple(int(d) for d in dilations)
    if max(strides) > 1 and max(dilations) > 1:
        raise UnsupportedLayerError(
            f"Conv2D with strides {strides} and dilation_rate {dilations} together: TensorFlow has "
            f"no gradient for that combination; use strides=1 or dilation_rate=1")
    dtype = x.dtype
    x32 = tf.cast(x, tf.float32)
    w32 = tf.cast(w, tf.float32)
    filter_shape = tuple(int(d) for d in w32.shape)
    out_channels = filter_shape[3]
    # Static geometry (batch may be unknown in graph mode) for the output shape.
    static = x32.shape
    if None not in static[1:]:
        g_static = conv_geometry((1, *static[1:]), filter_shape, strides, dilations, padding,
                                 groups)
        static_out = [static[0], g_static.out_height, g_static.out_width, out_channels]
    else:
        raise UnsupportedLayerError(
            f"swapped Conv2D needs static height, width and channels, got input shape {static}")

    def geometry_of(x_array):
        return conv_geometry(x_array.shape, filter_shape, strides, dilations, padding, groups)

    def forward_np(x_array, w_array, quant=None):
        return bind_scheme(arithmetic, quant).conv2d(x_array, w_array, geometry_of(x_array))

    backward_kernel = gradient_kernel(arithmetic, quant)

    def backward_np(x_array, w_array, dy_array):
        return native.conv_gradients_via_matmul(x_array, w_array, dy_array,
                                                geometry_of(x_array), backward_kernel.matmul)

    def lut_grad(inputs, filters, dy):
        with_range = activation_range is not None

        def gradients(x_array, w_array, dy_array, *rest):
            scheme = scheme_with_range(quant, rest[0]) if with_range else quant
            return lut_conv2d_gradients(arithmetic, x_array, w_array, dy_array,
                                        geometry_of(x_array), quant=scheme)

        grad_inputs = [inputs, filters, dy] + ([activation_range] if with_range else [])
        dx, dw = tf.numpy_function(gradients, grad_inputs, [tf.float32, tf.float32],
                                   stateful=False, name="graphswap_conv2d_lut_grad")
        dx.set_shape(inputs.shape)
        dw.set_shape(filters.shape)
        return dx, dw

    def product_gradients(inputs, filters, dy):
        if backward == "lut_grad" and quant is not None:
            if xla.use_device_path(arithmetic, inputs):   # inside XLA / on an accelerator
                return xla.device_lut_grad_conv2d(arithmetic, inputs, filters, dy, g_static,
                                                  quant, activation_range)
            return lut_grad(inputs, filters, dy)
        if backward in ("native", "lut_grad"):
            # what TensorFlow registers for Conv2D (nn_grad._Conv2DGrad)
            return _native_conv_gradients(inputs, filters, dy, strides, dilations, groups, padding)
        if xla.use_device_path(backward_kernel, inputs):
            return xla.device_conv2d_gradients(backward_kernel, inputs, filters, dy, g_static)
        xla.check_gradient_not_in_xla(backward)
        dx, dw = tf.numpy_function(backward_np, [inputs, filters, dy], [tf.float32, tf.float32],
                                   stateful=False, name="graphswap_conv2d_grad")
        dx.set_shape(inputs.shape)
        dw.set_shape(filters.shape)
        return dx, dw

    @tf.custom_gradient
    def conv(inputs, filters, *epilogue):
        g, s = split_epilogue(epilogue, gain, shift)
        if xla.use_device_path(arithmetic, inputs):  # inside XLA / on an accelerator
            y = xla.device_conv2d(arithmetic, inputs, filters, g_static, quant, activation_range,
                                  g, s, relu)
        elif forward_op.supports(arithmetic, "conv2d"):
            y = forward_op.conv2d(arithmetic, inputs, filters, g_static, g, s, relu, quant,
                                  activation_range)
        else:
            with_range = activation_range is not None
            forward_inputs = ([inputs, filters] + ([activation_range] if with_range else [])
                              + epilogue_inputs(g, s))
            call = kernel_call(forward_np, quant, with_range, (g is not None, s is not None, relu))
            y = tf.numpy_function(call, forward_inputs, tf.float32, stateful=False,
                                  name="graphswap_conv2d")
        y.set_shape(static_out)

        def grad(dy):
            dy, extra = epilogue_gradients(dy, y, g, s, relu)
            return (*product_gradients(inputs, filters, dy), *extra)

        return y, grad

    y = conv(x32, w32, *epilogue_inputs(gain, shift))
    return tf.cast(y, dtype) if dtype != tf.float32 else y
