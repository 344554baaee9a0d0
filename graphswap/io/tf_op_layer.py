"""Keras 2's `TFOpLambda` / `SlicingOpLambda` layers rebuilt for Keras 3, from an allow-list.

tf.keras recorded a TensorFlow function called on symbolic tensors (`tf.reshape(x, ...)`,
`x * 2.0` -> `tf.math.multiply`, `x[:, 0]` -> `tf.__operators__.getitem`) as a `TFOpLambda`
layer whose config holds the function's API name ("reshape", "math.multiply",
"__operators__.getitem").  Keras 3 has no such layer.  `TFOpLambda` here calls the named function
- looked up in `ALLOWED_TF_FUNCTIONS`, a closed list of pure, stateless TensorFlow functions; any
other name is refused (ModelLoadError) when the layer is built from a config, so a file cannot make
graphswap call an arbitrary function, and no Python code is ever deserialised.

The call's constant arguments (a reshape's shape, a slice spec) are kept in the layer config
(`arguments`), tensor arguments in the model graph (graphswap.io.legacy_config moves them there
when it translates a Keras 2 config), so the layer saves and reloads as plain JSON.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from graphswap.errors import ModelLoadError

#: TensorFlow API names (as tf.keras recorded them, relative to `tf.`) the rebuilt layer may call:
#: pure functions of their arguments, no state, no I/O, no Python callbacks.
ALLOWED_TF_FUNCTIONS = frozenset({
    # operators tf.keras recorded for Python operators on tensors
    "__operators__.add", "__operators__.getitem", "__operators__.eq", "__operators__.ne",
    # element-wise arithmetic
    "math.add", "math.add_n", "math.subtract", "math.multiply", "math.divide", "math.truediv",
    "math.floordiv", "math.floormod", "math.pow", "math.negative", "math.abs", "math.sign",
    "math.square", "math.sqrt", "math.rsqrt", "math.exp", "math.log", "math.log1p",
    "math.reciprocal", "math.maximum", "math.minimum", "math.round", "math.floor", "math.ceil",
    "math.sin", "math.cos", "math.tanh", "math.sigmoid", "math.erf", "math.softplus",
    "math.squared_difference", "math.divide_no_nan", "math.multiply_no_nan",
    "math.greater", "math.greater_equal", "math.less", "math.less_equal", "math.equal",
    "math.not_equal", "math.logical_and", "math.logical_or", "math.logical_not",
    # reductions and scans
    "math.reduce_sum", "math.reduce_mean", "math.reduce_max", "math.reduce_min",
    "math.reduce_prod", "math.reduce_std", "math.reduce_variance", "math.reduce_logsumexp",
    "math.reduce_any", "math.reduce_all", "math.argmax", "math.argmin", "math.cumsum",
    "math.l2_normalize", "math.top_k",
    "reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "argmax", "argmin",
    # activations
    "nn.relu", "nn.relu6", "nn.elu", "nn.selu", "nn.gelu", "nn.silu", "nn.swish",
    "nn.leaky_relu", "nn.sigmoid", "nn.tanh", "nn.softmax", "nn.log_softmax", "nn.softplus",
    "nn.softsign", "nn.l2_normalize", "nn.bias_add", "math.softmax", "math.log_softmax",
    # linear algebra
    "linalg.matmul", "matmul", "einsum", "linalg.einsum", "tensordot", "linalg.normalize",
    "linalg.norm", "norm",
    # shapes, layout, selection
    "reshape", "transpose", "linalg.matrix_transpose", "concat", "stack", "unstack", "split",
    "squeeze", "expand_dims", "tile", "repeat", "pad", "gather", "gather_nd", "slice",
    "strided_slice", "broadcast_to", "identity", "where", "reverse", "roll", "shape", "size",
    "rank", "cast", "dtypes.cast", "clip_by_value", "zeros_like", "ones_like", "fill",
    "one_hot", "range", "image.resize", "compat.v1.shape", "compat.v1.gather",
    "compat.v1.transpose", "compat.v1.squeeze", "compat.v1.pad", "compat.v1.concat",
})

#: what stands for `...` in a slice spec saved as JSON
ELLIPSIS_MARK = "__ellipsis__"


def tf_function(name: str):
    """The TensorFlow function `name` names (relative to `tf.`), if it is on the allow-list."""
    if not isinstance(name, str) or name not in ALLOWED_TF_FUNCTIONS:
        shown = name if isinstance(name, str) else type(name).__name__
        raise ModelLoadError(
            f"the model calls tf.{shown[:80]} (a Keras 2 TFOpLambda layer), which is not one of "
            f"the {len(ALLOWED_TF_FUNCTIONS)} pure TensorFlow functions graphswap rebuilds (e.g. "
            f"tf.reshape, tf.math.add, tf.nn.relu, slicing). Rebuild that step of the model with "
            f"Keras layers or keras.ops and save it again")
    target = tf
    for part in name.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ModelLoadError(f"this TensorFlow has no tf.{name} (a Keras 2 TFOpLambda layer "
                                 f"calls it); rebuild that step of the model with Keras layers")
    return target


def _to_slice(value):
    """A slice spec item as tf.keras saved it ({"start", "stop", "step"}) back to a slice."""
    if isinstance(value, dict) and set(value) == {"start", "stop", "step"}:
        return slice(value["start"], value["stop"], value["step"])
    if value == ELLIPSIS_MARK or (isinstance(value, dict)
                                  and value.get("class_name") == ELLIPSIS_MARK):
        return Ellipsis
    return value


@keras.saving.register_keras_serializable(package="graphswap")
class TFOpLambda(keras.layers.Layer):
    """A TensorFlow function from the allow-list, called on the layer's input with the saved
    constant `arguments` (and any tensor arguments the graph passes)."""

    def __init__(self, function, arguments=None, **kwargs):
        kwargs.pop("function_type", None)
        super().__init__(**kwargs)
        self.function = function
        self.arguments = dict(arguments or {})
        self.fn = tf_function(function)

    def call(self, inputs, **kwargs):
        return self.fn(inputs, **self._call_arguments(kwargs))

    def _call_arguments(self, kwargs):
        merged = {**self.arguments, **kwargs}
        merged.pop("name", None)  # op names are cosmetic; two layers must not clash
        return merged

    def get_config(self):
        return {**super().get_config(), "function": self.function, "arguments": self.arguments}


@keras.saving.register_keras_serializable(package="graphswap")
class SlicingOpLambda(TFOpLambda):
    """`tensor[...]` (tf.__operators__.getitem) with the slice spec tf.keras saved."""

    def _call_arguments(self, kwargs):
        merged = super()._call_arguments(kwargs)
        spec = merged.get("slice_spec")
        if isinstance(spec, (list, tuple)):
            merged["slice_spec"] = tuple(_to_slice(item) for item in spec)
        elif spec is not None:
            merged["slice_spec"] = _to_slice(spec)
        return merged


LAYER_CLASSES = {"TFOpLambda": TFOpLambda, "SlicingOpLambda": SlicingOpLambda}
