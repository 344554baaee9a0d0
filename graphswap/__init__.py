"""graphswap: run Keras layers' forward products through your own C arithmetic, keep
TensorFlow's gradients, fine-tune, save, export.

    import graphswap
    swapped = graphswap.rewrite_model(model, kernel="mul8u_drum4")

Importing graphswap registers the swapped layers (SwappedDense, SwappedConv2D, ...) with Keras, so
keras.models.load_model() reads rewritten models after a plain `import graphswap`.

The package reads as the pipeline, top to bottom (docs/ARCHITECTURE.md): cli -> research -> io ->
surgery -> swap -> kernels -> multipliers -> native; a module imports only from layers below it.
"""

from graphswap._quiet_import import import_tensorflow_quietly as _import_tensorflow_quietly

_import_tensorflow_quietly()

# The imports below load TensorFlow, so they follow the quiet import.
from graphswap._version import __version__  # noqa: E402
from graphswap.errors import (  # noqa: E402
    CustomGradientError, DataError, ExportError, GraphswapError, KernelExecutionError,
    KernelLoadError, KernelSpecError, KernelTrustError, ModelLoadError, OutputPathError,
    QuantizationError,
    RuleMatchError, ShapeError, UnknownRuleError, UnsupportedLayerError)
from graphswap.io import (ConvertResult, ExportResult, convert, export_model,  # noqa: E402
                          load_model, onnx_session)
from graphswap.kernels import QuantScheme, available_kernels, resolve_kernel  # noqa: E402
from graphswap.kernels.trust import trust, untrust  # noqa: E402
from graphswap.research import (Data, EvaluationResult, ExploreResult,  # noqa: E402
                                FinetuneResult, SweepResult, compensate_bias, evaluate, explore,
                                finetune, load_data, recalibrate_batchnorm, saliency_map, sweep,
                                write_saliency_png)
from graphswap.surgery import (GradientClip, GradientOverride, GradientReversal,  # noqa: E402
                               GradientScale, GuidedReLU, OverrideReport, OverrideWarning,
                               override)
from graphswap.swap import (LAYER_TYPES, RewriteReport, SwappedConv1D,  # noqa: E402
                            SwappedConv2D, SwappedConv2DTranspose, SwappedDense,
                            SwappedDepthwiseConv2D, SwappedEinsumDense, SwappedMultiHeadAttention,
                            SwappedSeparableConv2D, calibrate, fold_batchnorm, plan, rewrite_model,
                            transform_model)

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
