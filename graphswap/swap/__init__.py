"""Swapping: the TensorFlow ops (forward through a Kernel in numpy_function, backward with
TensorFlow's own gradient ops), the swapped Keras layers, the clone-and-replace machinery,
rewrite_model with its report, and the output comparison used to check a rewrite.

Modules: ops, layers, clone (transform_model, iter_layers), rewrite (rewrite_model, plan, kernel
maps), report, compare.
"""

from graphswap.swap.clone import (check_cloneable, clone_layer, copy_model, is_functional,
                                  iter_layers, transform_model)
from graphswap.swap.compare import (MAX_CHECK_BATCH, OriginalCannotRunError, OutputComparison,
                                    compare_outputs, max_output_difference, run_model,
                                    sample_inputs, tensorflow_reason, validate_check_batch)
from graphswap.swap.layers import SwappedConv2D, SwappedDense, check_conv_options
from graphswap.swap.ops import BACKWARD_MODES, check_backward_mode, swapped_conv2d, swapped_matmul
from graphswap.swap.report import LayerReport, RewriteReport, layer_macs
from graphswap.swap.rewrite import (SWAPPABLE_TYPES, load_kernel_map, plan, resolve_kernel_map,
                                    rewrite_model)

__all__ = ["BACKWARD_MODES", "LayerReport", "MAX_CHECK_BATCH", "OriginalCannotRunError", "OutputComparison",
           "RewriteReport", "SWAPPABLE_TYPES", "SwappedConv2D", "SwappedDense",
           "check_backward_mode", "check_cloneable", "check_conv_options", "clone_layer",
           "compare_outputs", "copy_model", "is_functional", "iter_layers", "layer_macs",
           "load_kernel_map", "max_output_difference", "plan", "resolve_kernel_map",
           "rewrite_model", "run_model", "sample_inputs", "swapped_conv2d", "swapped_matmul",
           "tensorflow_reason", "transform_model", "validate_check_batch"]
