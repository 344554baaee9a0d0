"""Swapped layers and XLA: their products call graphswap's C kernels (the `GraphswapForward` op or
a `tf.numpy_function`), which XLA cannot compile, so a swapped layer runs outside XLA.

* Keras: every swapped layer inherits `RunsOutsideXla` (through `QuantizedLayerMixin`), whose
  `supports_jit` is always False.  Keras reads it when it resolves `jit_compile`: "auto" picks no
  XLA for a model holding a swapped layer, and an explicit `compile(jit_compile=True)` (or a file
  saved with it) gets Keras's one warning "Model doesn't support `jit_compile=True`. Proceeding
  with `jit_compile=False`." - predict, evaluate and fit then run, without XLA.
* A user's own `tf.function(jit_compile=True)` around a swapped model cannot run it: the call
  raises XlaCompilationError while the function is traced, naming the layer and what to do,
  instead of TensorFlow's "No registered 'GraphswapForward' OpKernel for XLA_CPU_JIT" at run time.
* `compile_config_without_xla`: the compile settings a rewritten model is compiled (and saved)
  with - jit_compile=True becomes False where the model holds a swapped layer, so the file
  reloads without the warning.
"""

from __future__ import annotations

import contextlib
import warnings

import tensorflow as tf

from graphswap.errors import GraphswapError

try:  # no public way to ask whether a graph is being traced for XLA
    from tensorflow.python.ops.control_flow_util import GraphOrParentsInXlaContext
except ImportError:  # pragma: no cover - a TensorFlow without it: TensorFlow's own error stays
    GraphOrParentsInXlaContext = None

XLA_ADVICE = ("swapped layers call graphswap's C kernels, which XLA cannot compile; call the "
              "model in a tf.function without jit_compile, or let Keras run it (compile() with "
              "jit_compile=True or 'auto' runs a swapped model without XLA)")


class XlaCompilationError(GraphswapError):
    """A swapped layer called inside tf.function(jit_compile=True).  It derives from
    GraphswapError alone, so AutoGraph re-raises it as itself (not as a StagingError)."""


def in_xla_context() -> bool:
    """Whether the code running now is being traced for XLA (a tf.function(jit_compile=True))."""
    if tf.executing_eagerly() or GraphOrParentsInXlaContext is None:
        return False
    return bool(GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def check_not_in_xla(layer_name: str) -> None:
    """Raise XlaCompilationError when layer `layer_name` is called inside an XLA compilation."""
    if in_xla_context():
        raise XlaCompilationError(
            f"layer {layer_name!r} cannot run inside tf.function(jit_compile=True): "
            f"{XLA_ADVICE}")


class RunsOutsideXla:
    """Mixin of every swapped layer: never XLA-compiled (module docstring).  `supports_jit` is
    False whatever Keras's Layer.__init__ (or anyone) assigns to it."""

    @property
    def supports_jit(self) -> bool:
        return False

    @supports_jit.setter
    def supports_jit(self, value) -> None:  # Keras's Layer.__init__ sets True: the kernels decide
        pass

    def __call__(self, *args, **kwargs):
        check_not_in_xla(self.name)
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
