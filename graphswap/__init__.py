"""graphswap: run Keras Dense/Conv2D forward passes through your own C arithmetic, keep
TensorFlow's gradients, fine-tune, save, export.

    import graphswap
    swapped = graphswap.rewrite_model(model, kernel="mul8u_drum4")

Importing graphswap registers SwappedDense / SwappedConv2D with Keras, so
keras.models.load_model() reads rewritten models after a plain `import graphswap`.
"""

from graphswap._quiet_import import import_tensorflow_quietly as _import_tensorflow_quietly

_import_tensorflow_quietly()

# The imports below load TensorFlow, so they follow the quiet import.
from graphswap._version import __version__  # noqa: E402
from graphswap.errors import (  # noqa: E402
    CustomGradientError, DataError, ExportError, GraphswapError, KernelExecutionError,
    KernelLoadError, KernelSpecError, KernelTrustError, ModelLoadError, OutputPathError,
    RuleMatchError, UnknownRuleError, UnsupportedLayerError)
from graphswap.data import Data, load_data  # noqa: E402
from graphswap.evaluate import EvaluationResult, evaluate  # noqa: E402
from graphswap.gradients import (  # noqa: E402 - importing also registers the layers
    GradientClip, GradientOverride, GradientReversal, GradientScale, GuidedReLU)
from graphswap.kernel_trust import trust, untrust  # noqa: E402
from graphswap.kernels import available_kernels, resolve_kernel  # noqa: E402
from graphswap.layers import SwappedConv2D, SwappedDense  # noqa: E402
from graphswap.modelio import load_model  # noqa: E402
from graphswap.overrides import OverrideReport, OverrideWarning, override  # noqa: E402
from graphswap.rewrite import RewriteReport, plan, rewrite_model, transform_model  # noqa: E402
from graphswap.saliency import saliency_map, write_saliency_png  # noqa: E402
from graphswap.sweep import SweepResult, sweep  # noqa: E402
from graphswap.train import FinetuneResult, finetune  # noqa: E402

__all__ = [
    "__version__", "trust", "untrust", "load_model", "rewrite_model", "transform_model", "plan", "RewriteReport",
    "SwappedDense", "SwappedConv2D", "resolve_kernel", "available_kernels",
    "GraphswapError", "ExportError", "KernelSpecError", "KernelLoadError", "KernelTrustError",
    "KernelExecutionError", "UnsupportedLayerError", "ModelLoadError", "DataError",
    "OutputPathError", "UnknownRuleError", "RuleMatchError", "CustomGradientError",
    "GradientScale", "GradientClip", "GradientReversal", "GuidedReLU", "GradientOverride",
    "override", "OverrideReport", "OverrideWarning", "saliency_map", "write_saliency_png",
    "Data", "load_data", "finetune", "FinetuneResult", "evaluate", "EvaluationResult", "sweep",
    "SweepResult",
]
