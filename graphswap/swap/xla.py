"""Swapped layers and XLA.  A swapped layer's product runs one of two ways:

* the C path (the CPU default): graphswap's C kernels through the `GraphswapForward` op or a
  `tf.numpy_function` - which XLA cannot compile;
* the device path (graphswap/kernels/device_products.py): the same products written in `keras.ops`,
  bit for bit the C kernels' for every table-driven kernel, which XLA compiles and every device
  runs.  It covers LutKernel (every multiplier table and QuantScheme), Fp8Kernel (the FP8
  built-ins and users' FP8 tables: graphswap/kernels/device_fp8.py, the codes bit for bit, the
  float32 sums within round-off), "exact" (TensorFlow's own matmul / convolution) and "bf16" /
  "fp32_m{m}" (operands rounded as the C kernels do, the backend's float32 products).  It is
  chosen by itself inside `tf.function(jit_compile=True)` and
  when the op is placed on an accelerator (an input on a GPU/TPU, or no device named and one
  visible), and for every covered kernel with GRAPHSWAP_BRIDGE=xla.  Saved models carry nothing
  of it: a model saved on one path runs on the other.

What is bit for bit (tests/test_xla_bit_identity.py): a table-driven layer's whole output - the
product, dequantize, output correction (gain, offset: dynamic or calibrated static ranges), bias
and the ReLU graphswap fuses - under jit_compile equals the C path's, so a model of such layers
and exact ones (max pooling, reshapes) gives the same bits end to end (FP8 tables, bf16 and
fp32_m{m}: their float32 sums are the backend's, within round-off).  The epilogue
is `affine`: XLA would contract y * gain + shift into one FMA, the C epilogue rounds twice.  Not
graphswap's and not bit for bit: any other activation (softmax, tanh, ...) and the float layers
between swapped ones are Keras ops that XLA compiles with its own code (XLA's exp is not
Eigen's), so they differ by round-off under jit exactly as in the float model (a softmax by an
ulp: the float control shows the same); so do a recurrent layer's gate arithmetic and attention.

Keras: every swapped layer inherits `RunsOutsideXla` (through `QuantizedLayerMixin`), whose
`supports_jit` is True only when the device path covers the layer's arithmetic (its gradients,
"native", "kernel" and "lut_grad", run there too) and XLA is what this machine should run: a
GPU/TPU is visible, or GRAPHSWAP_BRIDGE=xla.  On a CPU-only machine the C path stays the
default (it is several times faster there than XLA's look-ups: benchmarks/bench_device.py), so a
model compiled with jit_compile=True keeps running its products in C, as before.  Keras reads
`supports_jit` when it resolves `jit_compile`: "auto" (XLA on accelerators only) and an explicit
`compile(jit_compile=True)` then XLA-compile a covered model; otherwise Keras gives its one warning "Model doesn't support
`jit_compile=True`. Proceeding with `jit_compile=False`." and runs without XLA.  A user's own
`tf.function(jit_compile=True)` around a layer the device path does not cover (an
operation-level library of the user's) raises XlaCompilationError while the function is traced,
naming the layer and what to do, instead of TensorFlow's "No registered 'GraphswapForward'
OpKernel for XLA_CPU_JIT" at run time.  The gradients "lut_grad" (Dense, Conv2D) and "kernel"
(every type) run on the device path too (graphswap/kernels/device_gradients.py and the
device_*_gradients below).  `compile_config_without_xla`: the compile settings a rewritten model is
compiled (and saved) with - jit_compile=True becomes False where the model holds a layer that
cannot run in XLA.
"""

from __future__ import annotations

import contextlib
import warnings

import tensorflow as tf

from graphswap.errors import GraphswapError
from graphswap.kernels.base import SchemeBoundKernel, oriented
from graphswap.kernels.fp8 import Fp8Kernel
from graphswap.kernels.float_kernels import LibraryKernel, OperandRoundingKernel
from graphswap.kernels.quantized import LutKernel
from graphswap.kernels import device_fp8, device_gradients, device_products
from graphswap.kernels.derivatives import derivative_tables
from graphswap.swap.forward_op import bridge_mode

try:  # no public way to ask whether a graph is being traced for XLA
    from tensorflow.python.ops.control_flow_util import GraphOrParentsInXlaContext
except ImportError:  # pragma: no cover - a TensorFlow without it: TensorFlow's own error stays
    GraphOrParentsInXlaContext = None
try:  # XLA's ReducePrecision: a float32 rounding XLA cannot fuse into an FMA (_affine)
    from tensorflow.compiler.tf2xla.python.xla import reduce_precision
except ImportError:  # pragma: no cover - a TensorFlow without it: XLA may contract the epilogue
    reduce_precision = None

XLA_ADVICE = ("its kernel runs only as graphswap's C code, which XLA cannot compile (the XLA "
              "path covers multiplier tables, FP8 multipliers, exact, bf16 and fp32_m{m}); call "
              "the model in a "
              "tf.function without jit_compile, or let Keras run it (compile() with "
              "jit_compile=True or 'auto' runs such a model without XLA)")
GRADIENT_ADVICE = ("backward={backward!r} computes its gradients with graphswap's C code, which "
                   "XLA cannot compile; take this gradient outside jit_compile, or use "
                   "backward='native' (TensorFlow's gradients, which XLA compiles)")


class XlaCompilationError(GraphswapError):
    """A swapped layer called inside tf.function(jit_compile=True).  It derives from
    GraphswapError alone, so AutoGraph re-raises it as itself (not as a StagingError)."""


def in_xla_context() -> bool:
    """Whether the code running now is being traced for XLA (a tf.function(jit_compile=True))."""
    if tf.executing_eagerly() or GraphOrParentsInXlaContext is None:
        return False
    return bool(GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def check_not_in_xla(layer_name: str, arithmetic=None) -> None:
    """Raise XlaCompilationError when layer `layer_name` is called inside an XLA compilation and
    the device path does not cover its `arithmetic` (None: nothing covers it)."""
    if in_xla_context() and not (arithmetic is not None and covers(arithmetic)):
        raise XlaCompilationError(
            f"layer {layer_name!r} cannot run inside tf.function(jit_compile=True): "
            f"{XLA_ADVICE}")


def check_gradient_not_in_xla(backward: str) -> None:
    """Raise XlaCompilationError when a gradient that calls C code ("kernel", "lut_grad") is
    taken inside an XLA compilation."""
    if in_xla_context():
        raise XlaCompilationError(f"a swapped layer's gradient cannot run inside "
                                  f"tf.function(jit_compile=True): "
                                  f"{GRADIENT_ADVICE.format(backward=backward)}")


# ----------------------------------------------------------------------------------------------
# the device path
# ----------------------------------------------------------------------------------------------

def unbound(arithmetic, quant=None):
    """(kernel, scheme) of a kernel a layer bound to its scheme (kernels.base.bind_scheme), the
    kernel's table wired as the scheme says (kernels.base.oriented)."""
    if isinstance(arithmetic, SchemeBoundKernel):
        arithmetic, quant = arithmetic.kernel, quant if quant is not None else arithmetic.quant
    return oriented(arithmetic, quant), quant


def covers(arithmetic) -> bool:
    """Whether the device path computes `arithmetic`'s products (module docstring)."""
    kernel, _ = unbound(arithmetic)
    if isinstance(kernel, (LutKernel, Fp8Kernel)):
        return True
    if isinstance(kernel, OperandRoundingKernel):
        return device_products.operand_rounding(kernel.spec) is not None
    return isinstance(kernel, LibraryKernel) and kernel.spec == "exact" and kernel.path is None


def accelerator_visible() -> bool:
    """Whether TensorFlow sees a GPU or TPU."""
    return bool(tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"))


def _on_accelerator(tensor) -> bool:
    device = (getattr(tensor, "device", "") or "").upper()
    if device:
        return "GPU" in device or "TPU" in device
    return accelerator_visible()


def keras_may_compile() -> bool:
    """Whether swapped layers the device path covers let Keras XLA-compile them: on an
    accelerator, or when GRAPHSWAP_BRIDGE=xla asks for the device path (module docstring)."""
    return bridge_mode() == "xla" or accelerator_visible()


def use_device_path(arithmetic, tensor=None) -> bool:
    """Whether a product of `arithmetic` on `tensor` takes the device path: covered, and inside
    XLA, on an accelerator, or forced by GRAPHSWAP_BRIDGE=xla."""
    if not covers(arithmetic):
        return False
    return bridge_mode() == "xla" or in_xla_context() or _on_accelerator(tensor)


def affine(y, gain, shift):
    """y * gain + shift (a None one left out; both cast to y's dtype) with the product and the
    sum each rounded, as the C epilogue (graphswap_channel_affine_f32, built with
    -ffp-contract=off) and TensorFlow's Mul and AddV2 kernels round them.  XLA contracts a
    multiply feeding an add into one FMA (one rounding: outputs an ulp apart), so inside XLA a
    float32 product is taken in float64 (exact: 24 + 24 bits), rounded to float32 by
    ReducePrecision (an XLA op no FMA can absorb; it flushes subnormals, so products below
    float32's smallest normal are put on its subnormal grid here), the shift added in float64 and
    the sum rounded to float32: the same bits (a float64 sum of two float32 values rounded again
    to float32 is their float32 sum: 53 >= 2 x 24 + 2).  Subnormal results follow the float
    environment, as everywhere in TensorFlow: flushed to zero on the CPU, inside XLA and in
    TensorFlow's kernels (and the C epilogue they call)."""
    y = tf.convert_to_tensor(y)
    gain = None if gain is None else tf.cast(gain, y.dtype)
    shift = None if shift is None else tf.cast(shift, y.dtype)
    if (gain is None or shift is None or y.dtype != tf.float32 or reduce_precision is None
            or not in_xla_context()):
        if gain is not None:
            y = y * gain
        return y if shift is None else y + shift
    product = tf.cast(y, tf.float64) * tf.cast(gain, tf.float64)
    return tf.cast(_to_float32_grid(product) + tf.cast(shift, tf.float64), tf.float32)


@tf.custom_gradient
def _to_float32_grid(product):
    """float64 `product` rounded to the nearest float32 (subnormals included), still float64;
    its gradient is the identity's (XlaReducePrecision has none registered), as float32's
    rounding has in TensorFlow's own Mul."""
    rounded = tf.where(tf.abs(product) < 2.0 ** -126,
                       tf.math.rint(product * 2.0 ** 149) * 2.0 ** -149,
                       reduce_precision(product, exponent_bits=8, mantissa_bits=23))
    return rounded, lambda upstream: upstream


def _epilogue(y, gain, shift, relu):
    """relu?(y * gain + shift) (graphswap_channel_affine_f32: ReLU keeps NaN)."""
    y = affine(y, gain, shift)
    if relu:
        y = tf.where(y < 0, tf.zeros_like(y), y)
    return y


def _lut_scheme(kernel, quant, activation_range):
    """The resolved scheme of a LUT call; a static range tensor stands for the scheme's range."""
    if quant is not None and activation_range is not None and quant.activations == "static":
        return kernel.resolve_scheme(quant.with_range(0.0, 1.0)), activation_range
    return kernel.resolve_scheme(quant), None


def device_matmul(arithmetic, a, b, quant=None, activation_range=None, gain=None, shift=None,
                  relu=False):
    """relu?((a @ b) * gain + shift) for float32 (m, k) x (k, n) on the device path."""
    kernel, quant = unbound(arithmetic, quant)
    if isinstance(kernel, Fp8Kernel):
        scheme, current = _lut_scheme(kernel, quant, activation_range)
        y = device_fp8.fp8_matmul(a, b, kernel.format, kernel.table, scheme, current)
    elif isinstance(kernel, LutKernel):
        scheme, current = _lut_scheme(kernel, quant, activation_range)
        y = device_products.lut_matmul(a, b, kernel.multiplier.table, kernel.signed, scheme,
                                       current, weight_bits=getattr(kernel, "weight_bits", 8),
                                       activation_bits=getattr(kernel, "activation_bits", 8))
    else:
        rounding = (device_products.operand_rounding(kernel.spec)
                    if isinstance(kernel, OperandRoundingKernel) else None)
        if rounding is not None:
            a, b = rounding(a), rounding(b)
        y = tf.linalg.matmul(a, b)
    return _epilogue(y, gain, shift, relu)


def device_conv2d(arithmetic, x, w, geometry, quant=None, activation_range=None, gain=None,
                  shift=None, relu=False):
    """relu?(conv(x, w) * gain + shift), NHWC x HWIO float32, on the device path."""
    kernel, quant = unbound(arithmetic, quant)
    if isinstance(kernel, Fp8Kernel):
        scheme, current = _lut_scheme(kernel, quant, activation_range)
        y = device_fp8.fp8_conv2d(x, w, kernel.format, kernel.table, scheme, geometry, current)
    elif isinstance(kernel, LutKernel):
        scheme, current = _lut_scheme(kernel, quant, activation_range)
        y = device_products.lut_conv2d(x, w, kernel.multiplier.table, kernel.signed, scheme,
                                       geometry, current,
                                       weight_bits=getattr(kernel, "weight_bits", 8),
                                       activation_bits=getattr(kernel, "activation_bits", 8))
    else:
        rounding = (device_products.operand_rounding(kernel.spec)
                    if isinstance(kernel, OperandRoundingKernel) else None)
        if rounding is not None:
            x, w = rounding(x), rounding(w)
        y = device_products.float_conv2d(x, w, geometry)
    return _epilogue(y, gain, shift, relu)


def device_conv2d_transpose(arithmetic, inputs, weights, plan, quant=None,
                            activation_range=None, gain=None, shift=None):
    """A transposed convolution (Keras kernel (h, w, filters, in)) on the device path: the
    stride-1 conv2d of the zero-inserted input with the flipped filter (graphswap.native.
    transpose's plan; what the C path's numpy forward computes)."""
    return device_conv2d(arithmetic, _zero_inserted(inputs, plan), _flipped(weights),
                         plan.geometry, quant, activation_range, gain, shift)


def _zero_inserted(inputs, plan):
    """NHWC `inputs` with stride - 1 zeros between samples, cropped as `plan` says
    (graphswap.native.insert_zeros)."""
    s_h, s_w = plan.strides
    shape = tf.shape(inputs)
    spread = tf.pad(inputs[:, :, None, :, None, :],
                    [[0, 0], [0, 0], [0, s_h - 1], [0, 0], [0, s_w - 1], [0, 0]])
    spread = tf.reshape(spread, [shape[0], shape[1] * s_h, shape[2] * s_w, shape[3]])
    return spread[:, :plan.crop_height, :plan.crop_width, :]


def _flipped(weights):
    """Keras's transposed-conv kernel as the flipped HWIO filter (graphswap.native.
    flipped_filter)."""
    return tf.transpose(tf.reverse(weights, [0, 1]), [0, 1, 3, 2])


def _linear_vjp(linear, x, cotangent):
    """The adjoint of `linear` (reshapes, transposes, pads, slices: exact) applied to
    `cotangent`."""
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = linear(x)
    return tape.gradient(y, x, output_gradients=cotangent)


def device_einsum(arithmetic, plan, inputs, weights, quant=None, activation_range=None):
    """keras.ops.einsum(plan's equation, inputs, weights) with its one matmul on the device
    path (graphswap.native.einsum's transposes and reshapes, in TensorFlow)."""
    k, n = plan.kernel_matrix_shape(tuple(int(d) for d in weights.shape))
    moved = tf.transpose(inputs, plan.input_permutation)
    free_shape = tf.shape(moved)[:len(plan.free)]
    x2 = tf.reshape(moved, [-1, k])
    w2 = tf.reshape(tf.transpose(weights, plan.kernel_permutation), [k, n])
    y2 = device_matmul(arithmetic, x2, w2, quant, activation_range)
    sizes = plan.sizes((), tuple(int(d) for d in weights.shape))
    y = tf.reshape(y2, tf.concat([free_shape, [sizes[c] for c in plan.produced]], axis=0))
    return tf.transpose(y, plan.output_permutation)


def device_lut_grad_matmul(arithmetic, a, b, dy, quant, activation_range=None):
    """(da, db) of a LUT matmul under backward="lut_grad", on the device path (the table's
    derivatives, graphswap/kernels/device_gradients.py)."""
    kernel, quant = unbound(arithmetic, quant)
    scheme, current = _lut_scheme(kernel, quant, activation_range)
    return device_gradients.lut_matmul_gradients(
        a, b, dy, derivative_tables(kernel.multiplier), kernel.signed, scheme, current,
        weight_bits=getattr(kernel, "weight_bits", 8),
        activation_bits=getattr(kernel, "activation_bits", 8))


def device_lut_grad_conv2d(arithmetic, x, w, dy, geometry, quant, activation_range=None):
    """(dx, dw) of a LUT convolution under backward="lut_grad", on the device path."""
    kernel, quant = unbound(arithmetic, quant)
    scheme, current = _lut_scheme(kernel, quant, activation_range)
    return device_gradients.lut_conv2d_gradients(
        x, w, dy, derivative_tables(kernel.multiplier), kernel.signed, scheme, geometry, current,
        weight_bits=getattr(kernel, "weight_bits", 8),
        activation_bits=getattr(kernel, "activation_bits", 8))


def device_conv2d_gradients(backward_kernel, x, w, dy, geometry):
    """(dx, dw) of a convolution under backward="kernel" on the device path: its products
    through `backward_kernel` (dynamic ranges), as the C path's conv_gradients_via_matmul."""
    return device_gradients.conv2d_gradients_through(
        lambda p, q: device_matmul(backward_kernel, p, q), x, w, dy, geometry)


def device_depthwise_gradients(backward_kernel, x, w, dy, geometry):
    """backward="kernel" of a depthwise convolution (Keras kernel (h, w, in, multiplier); its
    `geometry` the grouped convolution's) on the device path."""
    hwio = (*w.shape[:2], 1, int(w.shape[2]) * int(w.shape[3]))
    dx, dw = device_conv2d_gradients(backward_kernel, x, tf.reshape(w, hwio), dy, geometry)
    return dx, tf.reshape(dw, tf.shape(w))


def device_conv2d_transpose_gradients(backward_kernel, x, w, dy, plan):
    """backward="kernel" of a transposed convolution on the device path: the convolution's
    gradients of the zero-inserted input and flipped filter, taken back through both maps."""
    spread = _zero_inserted(x, plan)
    dz, dflipped = device_conv2d_gradients(backward_kernel, spread, _flipped(w), dy,
                                           plan.geometry)
    return (_linear_vjp(lambda t: _zero_inserted(t, plan), x, dz),
            _linear_vjp(_flipped, w, dflipped))


def device_einsum_gradients(backward_kernel, plan, x, w, dy):
    """backward="kernel" of an einsum on the device path: its two backward products through the
    kernel, the einsum's transposes and reshapes taken back by their adjoints."""
    k, n = plan.kernel_matrix_shape(tuple(int(d) for d in w.shape))
    moved_shape = tf.shape(tf.transpose(x, plan.input_permutation))

    def to_x2(t):
        return tf.reshape(tf.transpose(t, plan.input_permutation), [-1, k])

    def to_w2(t):
        return tf.reshape(tf.transpose(t, plan.kernel_permutation), [k, n])

    def from_y2(y2):
        sizes = plan.sizes((), tuple(int(d) for d in w.shape))
        y = tf.reshape(y2, tf.concat([moved_shape[:len(plan.free)],
                                      [sizes[c] for c in plan.produced]], axis=0))
        return tf.transpose(y, plan.output_permutation)

    x2, w2 = to_x2(x), to_w2(w)
    dy2 = _linear_vjp(from_y2, tf.zeros([tf.shape(x2)[0], n], tf.float32), dy)
    dx2 = device_matmul(backward_kernel, dy2, tf.transpose(w2))
    dw2 = device_matmul(backward_kernel, tf.transpose(x2), dy2)
    return _linear_vjp(to_x2, x, dx2), _linear_vjp(to_w2, w, dw2)


def layer_arithmetic(layer):
    """The arithmetic a swapped layer runs (a recurrent layer's is its cell's), or None."""
    arithmetic = getattr(layer, "arithmetic", None)
    if arithmetic is None and getattr(layer, "cell", None) is not None:
        arithmetic = getattr(layer.cell, "arithmetic", None)
    return arithmetic


class RunsOutsideXla:
    """Mixin of every swapped layer (module docstring): `supports_jit` is True only when the
    device path covers the layer's arithmetic and Keras may compile it
    (`keras_may_compile`) - whatever Keras's Layer.__init__ (or anyone) assigns to it."""

    @property
    def supports_jit(self) -> bool:
        arithmetic = layer_arithmetic(self)
        if arithmetic is None:   # a layer without a product of its own (MultiHeadAttention)
            return True
        return covers(arithmetic) and keras_may_compile()

    @supports_jit.setter
    def supports_jit(self, value) -> None:  # Keras's Layer.__init__ sets True: the kernels decide
        pass

    def __call__(self, *args, **kwargs):
        arithmetic = layer_arithmetic(self)
        if arithmetic is not None:
            check_not_in_xla(self.name, arithmetic)
        return super().__call__(*args, **kwargs)


def model_runs_in_xla(model) -> bool:
    """Whether Keras may XLA-compile `model`: no layer of it (at any depth) refuses."""
    layers = model._flatten_layers() if hasattr(model, "_flatten_layers") else [model]
    return all(getattr(layer, "supports_jit", True) for layer in layers)


def compile_config_without_xla(model, config: dict) -> dict:
    """`config` (a Keras compile config) as `model` can run it: jit_compile=True is dropped to
    False when the model holds a layer that runs outside XLA (a swapped layer)."""
    if config.get("jit_compile") is True and not model_runs_in_xla(model):
        return {**config, "jit_compile": False}
    return config


def recompile_without_xla(model) -> None:
    """Compile `model` again from its own compile config when that asks for XLA and the model
    holds a swapped layer (Keras's clone_model compiles a clone with the original's settings)."""
    if not getattr(model, "compiled", False):
        return
    config = model.get_compile_config()
    if config and compile_config_without_xla(model, config) is not config:
        try:
            model.compile_from_config(compile_config_without_xla(model, config))
        except Exception:  # noqa: BLE001 - a config Keras cannot recompile: keep its compile,
            model.jit_compile = False  # which runs without XLA anyway (Keras's own fallback)


@contextlib.contextmanager
def keras_jit_fallback_quiet():
    """Within: Keras's "Model doesn't support `jit_compile=True`" warning is not shown - for
    graphswap's own cloning, whose result is then compiled without XLA (recompile_without_xla)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Model doesn't support `jit_compile=True`")
        yield
