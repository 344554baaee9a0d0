"""graphswap: run Keras layers' forward products through your own C arithmetic, keep
TensorFlow's gradients, fine-tune, save, export.

    import graphswap
    swapped = graphswap.rewrite_model(model, kernel="mul8u_drum4")

Importing graphswap registers the swapped layers (SwappedDense, SwappedConv2D, ...) with Keras, so
keras.models.load_model() reads rewritten models after a plain `import graphswap`.

The package reads as the pipeline, top to bottom (docs/ARCHITECTURE.md): cli -> research -> io ->
surgery -> swap -> kernels -> multipliers -> native; a module imports only from layers below it.

The one exception to the eager import: the `graphswap` console command (graphswap_command.main,
outside this package) defers it, so that --help and `graphswap kernels` start without
TensorFlow.  Then only __version__ is defined here and the API loads on first attribute access
(PEP 562 __getattr__); the command's own imports register the layers when it touches a model.
"""

import importlib.util
import sys

from graphswap._version import __version__

__all__ = [
    "__version__", "trust", "untrust", "load_model", "convert", "ConvertResult", "rewrite_model",
    "transform_model", "plan", "RewriteReport", "SwappedDense", "SwappedConv2D",
    "SwappedDepthwiseConv2D", "SwappedSeparableConv2D", "SwappedConv1D", "SwappedConv2DTranspose",
    "SwappedEinsumDense", "SwappedMultiHeadAttention", "LAYER_TYPES",
    "resolve_kernel", "available_kernels", "export_model", "ExportResult", "onnx_session",
    "GraphswapError", "ExportError", "KernelSpecError", "KernelLoadError", "KernelTrustError",
    "KernelExecutionError", "UnsupportedLayerError", "ShapeError", "ModelLoadError", "DataError",
    "OutputPathError", "QuantizationError", "UnknownRuleError", "RuleMatchError", "CustomGradientError",
    "GradientScale", "GradientClip", "GradientReversal", "GuidedReLU", "GradientOverride",
    "override", "OverrideReport", "OverrideWarning", "saliency_map", "write_saliency_png",
    "Data", "load_data", "finetune", "FinetuneResult", "evaluate", "EvaluationResult", "sweep",
    "SweepResult", "explore", "ExploreResult", "QuantScheme", "calibrate", "compensate_bias",
    "recalibrate_batchnorm", "fold_batchnorm",
]


def _load_api() -> dict:
    """The public API by name (importing it registers the swapped layers with Keras)."""
    from graphswap._quiet_import import import_tensorflow_quietly

    import_tensorflow_quietly()
    # The imports below load TensorFlow, so they follow the quiet import.
    from graphswap.errors import (
        CustomGradientError, DataError, ExportError, GraphswapError, KernelExecutionError,
        KernelLoadError, KernelSpecError, KernelTrustError, ModelLoadError, OutputPathError,
        QuantizationError,
        RuleMatchError, ShapeError, UnknownRuleError, UnsupportedLayerError)
    from graphswap.io import (ConvertResult, ExportResult, convert, export_model,
                              load_model, onnx_session)
    from graphswap.kernels import QuantScheme, available_kernels, resolve_kernel
    from graphswap.kernels.trust import trust, untrust
    from graphswap.research import (Data, EvaluationResult, ExploreResult,
                                    FinetuneResult, SweepResult, compensate_bias, evaluate,
                                    explore, finetune, load_data, recalibrate_batchnorm,
                                    saliency_map, sweep, write_saliency_png)
    from graphswap.surgery import (GradientClip, GradientOverride, GradientReversal,
                                   GradientScale, GuidedReLU, OverrideReport, OverrideWarning,
                                   override)
    from graphswap.swap import (LAYER_TYPES, RewriteReport, SwappedConv1D,
                                SwappedConv2D, SwappedConv2DTranspose, SwappedDense,
                                SwappedDepthwiseConv2D, SwappedEinsumDense,
                                SwappedMultiHeadAttention, SwappedSeparableConv2D, calibrate,
                                fold_batchnorm, plan, rewrite_model, transform_model)
    names = locals()
    return {name: names[name] for name in __all__ if name in names}


def __getattr__(name):
    """PEP 562: reached only while the API is deferred (the `graphswap` command's start)."""
    if name in __all__:
        globals().update(_load_api())
        return globals()[name]
    raise AttributeError(f"module 'graphswap' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


# Deferred too where TensorFlow is not installed (a JAX-only GPU machine): there the
# TensorFlow-free parts - graphswap.kernels (its device_products under Keras's JAX backend),
# graphswap.multipliers, graphswap.native - still import.
if not getattr(sys.modules.get("graphswap_command"), "DEFER_API", False) and \
        importlib.util.find_spec("tensorflow") is not None:
    globals().update(_load_api())
