"""Swapping: the TensorFlow ops (forward through a Kernel - graphswap's compiled op or
numpy_function - backward with TensorFlow's own gradient ops), the swapped Keras layers, the
clone-and-replace machinery, rewrite_model with its report, and the output comparison used to check
a rewrite.

Modules: ops (matmul, conv2d) and ops_layers (depthwise, transposed, einsum), forward_op (the
compiled op their forwards use), layers (Dense, Conv2D), layers_conv (DepthwiseConv2D,
SeparableConv2D, Conv1D, Conv2DTranspose), layers_attention (EinsumDense, MultiHeadAttention),
layers_recurrent and recurrent_cells (LSTM, GRU, SimpleRNN, RNN, Bidirectional), layers_wrapped
(TimeDistributed around any of them),
quantstate (a swapped layer's quantization state), kinds (one module per layer kind: its classes,
MAC count, folding, own swapping steps), catalog (stock -> swapped, from kinds), tracking (replacing
held sublayers in place), clone (transform_model, iter_layers), subclassed (subclassed models),
rewrite (rewrite_model, plan, kernel maps), report, compare, calibration (static activation
ranges), folding (BatchNormalization folding), compensation (bias compensation, BN re-estimation).
"""

from graphswap.swap.calibration import (CALIBRATION_METHODS, CALIBRATION_SOURCES,
                                        DEFAULT_CALIBRATION_METHOD, DEFAULT_CALIBRATION_SAMPLES,
                                        DEFAULT_CALIBRATION_SOURCE, MIN_CALIBRATION_SAMPLES,
                                        CalibrationReport, calibrate, calibration_inputs)
from graphswap.swap.catalog import (LAYER_TYPES, SWAPPABLE_TYPES, SWAPPED_CLASSES, is_swapped,
                                    stock_class, type_name)
from graphswap.swap.clone import (check_cloneable, clone_layer, copy_model, is_functional,
                                  iter_layers, transform_model)
from graphswap.swap.compare import (DEFAULT_SEQUENCE_LENGTH, MAX_CHECK_BATCH,
                                    MAX_SEQUENCE_LENGTH, OriginalCannotRunError, OutputComparison,
                                    compare_outputs, free_dimension_length, has_free_dimensions,
                                    max_output_difference, model_inputs, run_model,
                                    sample_inputs, tensorflow_reason, validate_check_batch,
                                    validate_sequence_length)
from graphswap.swap.compensation import (COMPENSATION_METHODS, DEFAULT_COMPENSATION,
                                         RecoveryStep, calibrate_and_compensate, compensate_bias,
                                         recalibrate_batchnorm)
from graphswap.swap.folding import FoldReport, fold_batchnorm
from graphswap.swap.recipe import (DEFAULT_BN_REESTIMATION, DEFAULT_RECIPE, QUANTIZATION_PRESETS,
                                   quantization_request)
from graphswap.swap.wiring import OPERAND_CHOICES, WiringReport, choose_operands
from graphswap.swap.fallback import CHECK_SAMPLES
from graphswap.swap.weight_tuning import DEFAULT_WEIGHT_TUNING, WeightTuningReport, tune_weights
from graphswap.swap.layers import SwappedConv2D, SwappedDense, check_conv_options
from graphswap.swap.layers_attention import SwappedEinsumDense, SwappedMultiHeadAttention
from graphswap.swap.layers_conv import (SwappedConv1D, SwappedConv2DTranspose,
                                        SwappedDepthwiseConv2D, SwappedSeparableConv2D)
from graphswap.swap.layers_recurrent import (SwappedBidirectional, SwappedGRU, SwappedLSTM,
                                             SwappedRNN, SwappedSimpleRNN)
from graphswap.swap.layers_wrapped import SwappedTimeDistributed
from graphswap.swap.ops import BACKWARD_MODES, check_backward_mode, swapped_conv2d, swapped_matmul
from graphswap.swap.kinds.counting import counting_length, layer_macs
from graphswap.swap.report import LayerReport, RewriteReport
from graphswap.swap.quantstate import legacy_scheme
from graphswap.swap.rewrite import plan, rewrite_model
from graphswap.swap.selection import (LayerSelection, check_layer_types, load_kernel_map,
                                      resolve_kernel_map)

__all__ = ["LAYER_TYPES", "SWAPPED_CLASSES", "SwappedConv1D", "SwappedConv2DTranspose",
           "SwappedDepthwiseConv2D", "SwappedEinsumDense", "SwappedMultiHeadAttention",
           "SwappedSeparableConv2D", "SwappedLSTM", "SwappedGRU", "SwappedSimpleRNN",
           "SwappedRNN", "SwappedBidirectional", "SwappedTimeDistributed", "check_layer_types",
           "is_swapped", "stock_class",
           "type_name",
           "CALIBRATION_METHODS", "CALIBRATION_SOURCES", "COMPENSATION_METHODS",
           "DEFAULT_CALIBRATION_METHOD", "DEFAULT_CALIBRATION_SAMPLES",
           "DEFAULT_CALIBRATION_SOURCE", "DEFAULT_COMPENSATION", "calibrate_and_compensate",
           "MIN_CALIBRATION_SAMPLES", "QUANTIZATION_PRESETS", "OPERAND_CHOICES", "WiringReport", "CHECK_SAMPLES",
           "choose_operands",
           "CalibrationReport", "FoldReport", "RecoveryStep", "calibrate", "calibration_inputs",
           "compensate_bias", "fold_batchnorm", "legacy_scheme", "quantization_request",
           "recalibrate_batchnorm", "DEFAULT_WEIGHT_TUNING", "DEFAULT_BN_REESTIMATION",
           "DEFAULT_RECIPE", "WeightTuningReport", "tune_weights", "BACKWARD_MODES", "LayerReport", "MAX_CHECK_BATCH",
           "OriginalCannotRunError", "OutputComparison",
           "RewriteReport", "SWAPPABLE_TYPES", "SwappedConv2D", "SwappedDense",
           "check_backward_mode", "check_cloneable", "check_conv_options", "clone_layer",
           "compare_outputs", "copy_model", "is_functional", "iter_layers", "layer_macs",
           "load_kernel_map", "max_output_difference", "model_inputs", "plan",
           "resolve_kernel_map",
           "rewrite_model", "run_model", "sample_inputs", "swapped_conv2d", "swapped_matmul",
           "tensorflow_reason", "transform_model", "validate_check_batch",
           "DEFAULT_SEQUENCE_LENGTH", "MAX_SEQUENCE_LENGTH", "counting_length",
           "free_dimension_length", "has_free_dimensions", "validate_sequence_length"]
