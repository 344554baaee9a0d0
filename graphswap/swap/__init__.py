"""Swapping: the TensorFlow ops (forward through a Kernel in numpy_function, backward with
TensorFlow's own gradient ops), the swapped Keras layers, the clone-and-replace machinery,
rewrite_model with its report, and the output comparison used to check a rewrite.

Modules: ops, layers, quantstate (a swapped layer's quantization state), clone (transform_model,
iter_layers), rewrite (rewrite_model, plan, kernel maps), report, compare, calibration (static
activation ranges), folding (BatchNormalization folding), compensation (bias compensation, BN
re-estimation).
"""

from graphswap.swap.calibration import (CALIBRATION_METHODS, CALIBRATION_SOURCES,
                                        DEFAULT_CALIBRATION_METHOD, DEFAULT_CALIBRATION_SAMPLES,
                                        DEFAULT_CALIBRATION_SOURCE, MIN_CALIBRATION_SAMPLES,
                                        CalibrationReport, calibrate, calibration_inputs)
from graphswap.swap.clone import (check_cloneable, clone_layer, copy_model, is_functional,
                                  iter_layers, transform_model)
from graphswap.swap.compare import (OriginalCannotRunError, OutputComparison, compare_outputs,
                                    max_output_difference, run_model, sample_inputs,
                                    tensorflow_reason)
from graphswap.swap.compensation import (COMPENSATION_METHODS, DEFAULT_COMPENSATION,
                                         RecoveryStep, calibrate_and_compensate, compensate_bias,
                                         recalibrate_batchnorm)
from graphswap.swap.folding import FoldReport, fold_batchnorm
from graphswap.swap.layers import SwappedConv2D, SwappedDense, check_conv_options
from graphswap.swap.ops import BACKWARD_MODES, check_backward_mode, swapped_conv2d, swapped_matmul
from graphswap.swap.report import LayerReport, RewriteReport, layer_macs
from graphswap.swap.quantstate import legacy_scheme
from graphswap.swap.rewrite import (QUANTIZATION_PRESETS, SWAPPABLE_TYPES, load_kernel_map, plan,
                                    quantization_request, resolve_kernel_map, rewrite_model)

__all__ = ["CALIBRATION_METHODS", "CALIBRATION_SOURCES", "COMPENSATION_METHODS",
           "DEFAULT_CALIBRATION_METHOD", "DEFAULT_CALIBRATION_SAMPLES",
           "DEFAULT_CALIBRATION_SOURCE", "DEFAULT_COMPENSATION", "calibrate_and_compensate", "MIN_CALIBRATION_SAMPLES", "QUANTIZATION_PRESETS",
           "CalibrationReport", "FoldReport", "RecoveryStep", "calibrate", "calibration_inputs",
           "compensate_bias", "fold_batchnorm", "legacy_scheme", "quantization_request",
           "recalibrate_batchnorm", "BACKWARD_MODES", "LayerReport", "OriginalCannotRunError", "OutputComparison",
           "RewriteReport", "SWAPPABLE_TYPES", "SwappedConv2D", "SwappedDense",
           "check_backward_mode", "check_cloneable", "check_conv_options", "clone_layer",
           "compare_outputs", "copy_model", "is_functional", "iter_layers", "layer_macs",
           "load_kernel_map", "max_output_difference", "plan", "resolve_kernel_map",
           "rewrite_model", "run_model", "sample_inputs", "swapped_conv2d", "swapped_matmul",
           "tensorflow_reason", "transform_model"]
