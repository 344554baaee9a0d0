"""Backward-only primitives: keep a computation's forward pass, change its gradient - the opposite
of `tf.stop_gradient`: computations "used only when computing gradients".  Each one is listed with
what it does in graphswap.gradients, their public face.

Every function is a `tf.custom_gradient`: correct eagerly, inside `tf.function` and in
`model.fit`, preserving shapes and dtypes.  Their Keras layers and their rule objects (for
`override`) are in graphswap.surgery.rules.
"""

from __future__ import annotations

import numbers
import re

import keras
import numpy as np
import tensorflow as tf

from graphswap.errors import CustomGradientError, GraphswapError

# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------

def _float_tensor(x, what: str):
    x = tf.convert_to_tensor(x)
    if not x.dtype.is_floating:
        raise GraphswapError(
            f"{what}: gradients flow only through floating-point tensors, got dtype "
            f"{x.dtype.name}; cast the input first (e.g. tf.cast(x, tf.float32))")
    return x


def check_number(value, what: str, positive: bool = False):
    """Validate Python numbers now; tensors/variables are taken as they are."""
    if isinstance(value, (numbers.Number, np.number)) and not isinstance(value, bool):
        if not np.isfinite(float(value)):
            raise GraphswapError(f"{what} must be a finite number, got {value!r}")
        if positive and float(value) <= 0:
            raise GraphswapError(f"{what} must be > 0, got {value!r}")
        return float(value)
    if isinstance(value, (tf.Tensor, tf.Variable, np.ndarray)):
        return value
    raise GraphswapError(f"{what} must be a number or a scalar tensor, got {value!r}")


def _op_name(prefix: str, name: str) -> str:
    """A TensorFlow-valid op name (lambdas are called '<lambda>')."""
    return f"{prefix}_{re.sub(r'[^A-Za-z0-9_.]', '_', name)}".rstrip("_")


# --------------------------------------------------------------------------------------------
# functions
# --------------------------------------------------------------------------------------------

def scale(x, factor):
    """Forward: identity.  Backward: `dy * factor`."""
    x = _float_tensor(x, "scale")
    factor = check_number(factor, "scale: factor")

    @tf.custom_gradient
    def _scale(x):
        def grad(dy):
            return dy * tf.cast(factor, dy.dtype)

        return tf.identity(x), grad

    return _scale(x)


def reverse(x, factor=1.0):
    """Gradient reversal (Ganin & Lempitsky): forward identity, backward `-factor * dy`."""
    x = _float_tensor(x, "reverse")
    factor = check_number(factor, "reverse: factor")

    @tf.custom_gradient
    def _reverse(x):
        def grad(dy):
            return -tf.cast(factor, dy.dtype) * dy

        return tf.identity(x), grad

    return _reverse(x)


def clip_by_value(x, clip_value_min, clip_value_max):
    """Forward: identity.  Backward: `clip(dy, clip_value_min, clip_value_max)` element-wise."""
    x = _float_tensor(x, "clip_by_value")
    low = check_number(clip_value_min, "clip_by_value: clip_value_min")
    high = check_number(clip_value_max, "clip_by_value: clip_value_max")
    if isinstance(low, float) and isinstance(high, float) and low > high:
        raise GraphswapError(
            f"clip_by_value: clip_value_min ({low}) is greater than clip_value_max ({high})")

    @tf.custom_gradient
    def _clip(x):
        def grad(dy):
            return tf.clip_by_value(dy, tf.cast(low, dy.dtype), tf.cast(high, dy.dtype))

        return tf.identity(x), grad

    return _clip(x)


def clip_by_norm(x, clip_norm, axes=None):
    """Forward: identity.  Backward: `tf.clip_by_norm(dy, clip_norm, axes)`.

    With axes=None the L2 norm is taken over the whole gradient tensor (batch included), as in
    tf.clip_by_norm; pass e.g. axes=[1, 2, 3] to clip each sample's gradient separately.
    """
    x = _float_tensor(x, "clip_by_norm")
    clip_norm = check_number(clip_norm, "clip_by_norm: clip_norm", positive=True)
    if axes is not None:
        axes = [int(a) for a in (axes if isinstance(axes, (list, tuple)) else [axes])]
        rank = x.shape.rank
        if rank is not None and any(not -rank <= a < rank for a in axes):
            raise GraphswapError(f"clip_by_norm: axes {axes} out of range for a rank-{rank} tensor")

    @tf.custom_gradient
    def _clip(x):
        def grad(dy):
            return tf.clip_by_norm(dy, tf.cast(clip_norm, dy.dtype), axes=axes)

        return tf.identity(x), grad

    return _clip(x)


def guided_relu(x, max_value=None, negative_slope=0.0, threshold=0.0, forward=None):
    """Guided-backprop ReLU (Springenberg et al. 2015).

    Forward: exactly Keras' relu with these options (`keras.activations.relu`), or `forward(x)`
    when given (used to keep e.g. `relu6`'s own op).  Backward: the gradient passes only where the
    unit is in its positive-slope (identity) region *and* the incoming gradient is positive:

        dx = (dy > 0) * (threshold < x < max_value) * dy

    which is `(dy > 0) * (x > 0) * dy` for the plain ReLU.  The leaky part (negative_slope) and the
    saturated part (x >= max_value) pass nothing, just as an inactive unit passes nothing in
    guided backprop.
    """
    x = _float_tensor(x, "guided_relu")
    if max_value is not None:
        max_value = check_number(max_value, "guided_relu: max_value")
    negative_slope = check_number(negative_slope, "guided_relu: negative_slope")
    threshold = check_number(threshold, "guided_relu: threshold")

    @tf.custom_gradient
    def _guided(x):
        if forward is not None:
            y = forward(x)
        else:
            y = keras.activations.relu(x, negative_slope=negative_slope, max_value=max_value,
                                       threshold=threshold)

        def grad(dy):
            gate = tf.logical_and(dy > 0, x > tf.cast(threshold, x.dtype))
            if max_value is not None:
                gate = tf.logical_and(gate, x < tf.cast(max_value, x.dtype))
            return tf.where(gate, dy, tf.zeros_like(dy))

        return tf.identity(y), grad

    return _guided(x)


def straight_through(f, b=None):
    """`straight_through(f, b)(*xs)`: forward `f(*xs)`, backward the gradient of `b` at `xs`.

    f runs once per forward pass.  b runs only when a gradient is asked for, inside the custom
    gradient (its vector-Jacobian product is taken with a GradientTape there), so there is no
    `b(x) + stop_gradient(f(x) - b(x))` double forward.  Without b the gradient passes through
    unchanged (the classic straight-through estimator; f(x) must then have x's shape).

    Variables f reads (e.g. a layer's kernel) get their gradient from b too, so b must read the
    same variables (`straight_through(approx_layer, exact_layer)`); those b does not read get zero.
    """
    if not callable(f):
        raise GraphswapError(f"straight_through: f must be callable, got {f!r}")
    if b is not None and not callable(b):
        raise GraphswapError(f"straight_through: b must be callable or None, got {b!r}")
    f_name = getattr(f, "__name__", type(f).__name__)

    def apply(*xs):
        if not xs:
            raise GraphswapError("straight_through(f, b) must be called with at least one tensor")
        xs = [_float_tensor(x, "straight_through") for x in xs]
        if b is None and len(xs) != 1:
            raise GraphswapError(
                f"straight_through({f_name}) without b passes dy through unchanged, which needs "
                f"exactly one input; got {len(xs)}: give b")

        @tf.custom_gradient
        def _st(*xs):
            y = f(*xs)
            if not isinstance(y, (tf.Tensor, tf.Variable, np.ndarray)) and not tf.is_tensor(y):
                raise CustomGradientError(
                    f"straight_through: f ({f_name}) must return one tensor, got "
                    f"{type(y).__name__}")
            y = tf.convert_to_tensor(y)
            if b is None and not y.shape.is_compatible_with(xs[0].shape):
                raise CustomGradientError(
                    f"straight_through({f_name}) without b passes dy through unchanged, so f's "
                    f"output shape {y.shape} must equal the input shape {xs[0].shape}; give b")

            def grad(dy, variables=None):
                variables = list(variables or [])
                if b is None:
                    input_grads = [tf.cast(dy, xs[0].dtype)]
                    return (input_grads, [tf.zeros_like(v) for v in variables]) if variables \
                        else input_grads[0]
                with tf.GradientTape() as tape:
                    for x in xs:
                        tape.watch(x)
                    yb = tf.convert_to_tensor(b(*xs))
                if not yb.shape.is_compatible_with(dy.shape):
                    raise CustomGradientError(
                        f"straight_through: b's output shape {yb.shape} differs from f's output "
                        f"shape {dy.shape}; b must compute the same function shape as f")
                dy_b = tf.cast(dy, yb.dtype)
                all_grads = tape.gradient(yb, list(xs) + variables, output_gradients=dy_b)
                input_grads, var_grads = all_grads[:len(xs)], all_grads[len(xs):]
                if all(g is None for g in input_grads):
                    raise CustomGradientError(
                        f"straight_through: b ({getattr(b, '__name__', type(b).__name__)}) has no "
                        f"gradient with respect to its inputs (ops such as tf.round and tf.sign "
                        f"have none); use a differentiable surrogate for b")
                input_grads = [tf.zeros_like(x) if g is None else g
                               for x, g in zip(xs, input_grads)]
                if variables:
                    var_grads = [tf.zeros_like(v) if g is None else g
                                 for v, g in zip(variables, var_grads)]
                    return input_grads, var_grads
                return input_grads if len(xs) > 1 else input_grads[0]

            return tf.identity(y), grad

        return _st(*xs)

    apply.__name__ = f"straight_through_{f_name}"
    return apply


def with_gradient(np_fn, grad_fn, output_shape=None, output_dtype=None):
    """Wrap a numpy (or ctypes) function `np_fn(*arrays) -> array` with a user gradient.

    `with_gradient(np_fn, grad_fn)(*xs)` runs np_fn through `tf.numpy_function` with the output's
    static shape set: `output_shape` (a tuple, None entries allowed; or a callable taking the
    input TensorShapes), by default the first input's shape.  Output dtype: `output_dtype`, by
    default the first input's.  The backward pass calls `grad_fn(dy, *arrays)` (numpy in, numpy
    out), which must return one gradient per input (a single array for one input; None for "no
    gradient", taken as zeros), each shaped like its input.  Shapes are checked on every call:
    a mismatch raises CustomGradientError (inside a tf.function it surfaces as TensorFlow's
    InvalidArgumentError carrying the same message).

    The numpy body is Python: it is not serialized into a SavedModel.
    """
    if not callable(np_fn) or not callable(grad_fn):
        raise GraphswapError("with_gradient(np_fn, grad_fn): both arguments must be callable")
    fn_name = getattr(np_fn, "__name__", type(np_fn).__name__)
    grad_name = getattr(grad_fn, "__name__", type(grad_fn).__name__)

    def apply(*xs):
        if not xs:
            raise GraphswapError(f"with_gradient({fn_name}) must be called with at least one "
                                 f"tensor")
        xs = [_float_tensor(x, f"with_gradient({fn_name})") for x in xs]
        dtype = tf.as_dtype(output_dtype) if output_dtype is not None else xs[0].dtype
        if callable(output_shape):
            static_shape = tf.TensorShape(output_shape(*[x.shape for x in xs]))
        elif output_shape is not None:
            static_shape = tf.TensorShape(output_shape)
        else:
            static_shape = xs[0].shape
        same_as_input = output_shape is None

        def forward(*arrays):
            result = np.asarray(np_fn(*arrays))
            expected = arrays[0].shape if same_as_input else None
            if (expected is not None and result.shape != expected) or \
                    not static_shape.is_compatible_with(result.shape):
                raise CustomGradientError(
                    f"with_gradient: {fn_name} returned shape {result.shape}, expected "
                    f"{expected if expected is not None else static_shape}; pass output_shape= "
                    f"if the function changes the shape")
            return result.astype(dtype.as_numpy_dtype, copy=False)

        def backward(dy, *arrays):
            grads = grad_fn(dy, *arrays)
            if len(arrays) == 1 and not isinstance(grads, (tuple, list)):
                grads = (grads,)
            if not isinstance(grads, (tuple, list)) or len(grads) != len(arrays):
                raise CustomGradientError(
                    f"with_gradient: {grad_name}(dy, *inputs) must return one gradient per input "
                    f"({len(arrays)}), got {type(grads).__name__}"
                    f"{'' if not isinstance(grads, (tuple, list)) else f' of {len(grads)}'}")
            out = []
            for index, (grad, array) in enumerate(zip(grads, arrays)):
                if grad is None:
                    out.append(np.zeros_like(array))
                    continue
                grad = np.asarray(grad)
                if grad.shape != array.shape:
                    raise CustomGradientError(
                        f"with_gradient: {grad_name} returned a gradient of shape {grad.shape} "
                        f"for input {index}, whose shape is {array.shape}; a gradient must have "
                        f"its input's shape")
                out.append(grad.astype(array.dtype, copy=False))
            return out

        @tf.custom_gradient
        def _wrapped(*xs):
            y = tf.numpy_function(forward, list(xs), dtype, name=_op_name("with_gradient", fn_name))
            y.set_shape(static_shape)

            def grad(dy):
                grads = tf.numpy_function(backward, [tf.cast(dy, dtype), *xs],
                                          [x.dtype for x in xs],
                                          name=_op_name("gradient", grad_name))
                if not isinstance(grads, (list, tuple)):
                    grads = [grads]
                grads = list(grads)
                for g, x in zip(grads, xs):
                    g.set_shape(x.shape)
                return grads if len(xs) > 1 else grads[0]

            return y, grad

        return _wrapped(*xs)

    apply.__name__ = f"with_gradient_{fn_name}"
    return apply
