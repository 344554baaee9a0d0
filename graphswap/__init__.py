"""graphswap: run Keras Dense/Conv2D forward passes through your own C arithmetic, keep
TensorFlow's gradients, fine-tune, save, export.

    import graphswap
    swapped = graphswap.rewrite_model(model, kernel="mul8u_drum4")
"""

from graphswap._version import __version__
from graphswap.errors import (DataError, ExportError, GraphswapError, KernelExecutionError, KernelLoadError,
                              KernelSpecError, KernelTrustError, ModelLoadError, OutputPathError,
                              UnsupportedLayerError)
from graphswap.kernels import available_kernels, resolve_kernel
from graphswap.layers import SwappedConv2D, SwappedDense
from graphswap.rewrite import RewriteReport, plan, rewrite_model, transform_model
from graphswap.kernel_trust import trust

__all__ = [
    "__version__", "trust", "rewrite_model", "transform_model", "plan", "RewriteReport",
    "SwappedDense", "SwappedConv2D", "resolve_kernel", "available_kernels",
    "GraphswapError", "ExportError", "KernelSpecError", "KernelLoadError", "KernelTrustError",
    "KernelExecutionError", "UnsupportedLayerError", "ModelLoadError", "DataError",
    "OutputPathError",
]
