"""The option choices and defaults the command line's help shows, as literal values or read from
graphswap.methods (the methods chosen by name: calibration, bias compensation, learning-rate
schedules - described there for the API and the command line alike): loading the command line
imports no TensorFlow to read them from the API.
tests/test_cli_startup.py::test_option_values_are_the_apis fails when one drifts from the API's.
"""

from __future__ import annotations

from graphswap.methods import CALIBRATION_REGISTRY, COMPENSATION_REGISTRY, SCHEDULE_REGISTRY

LAYER_TYPES = ("Dense", "Conv2D", "DepthwiseConv2D", "SeparableConv2D", "Conv1D",
               "Conv2DTranspose", "EinsumDense", "MultiHeadAttention", "LSTM", "GRU",
               "SimpleRNN", "RNN", "Bidirectional", "TimeDistributed")  # swap.LAYER_TYPES
MAX_CHECK_BATCH = 1024                                                  # swap.MAX_CHECK_BATCH
DEFAULT_SEQUENCE_LENGTH = 16                                    # swap.DEFAULT_SEQUENCE_LENGTH
MAX_SEQUENCE_LENGTH = 65536                                     # swap.MAX_SEQUENCE_LENGTH
BACKWARD_MODES = ("native", "kernel", "lut_grad")                       # swap.BACKWARD_MODES
COMPENSATION_METHODS = COMPENSATION_REGISTRY.names                     # swap.COMPENSATION_METHODS
DEFAULT_COMPENSATION = COMPENSATION_REGISTRY.default                    # with --calibrate
DEFAULT_WEIGHT_TUNING = False                                           # with --calibrate
DEFAULT_BN_REESTIMATION = True                                  # with --calibrate, BN models
DEFAULT_RECIPE = "default"                                      # swap.DEFAULT_RECIPE
CALIBRATION_SOURCES = ("float", "approximate")                          # swap.CALIBRATION_SOURCES
DEFAULT_CALIBRATION_SOURCE = "approximate"   # measured: docs/RECOVERY.md, ResNet-8 on CIFAR-10
CALIBRATION_METHODS = CALIBRATION_REGISTRY.names                       # swap.CALIBRATION_METHODS
DEFAULT_CALIBRATION_METHOD = CALIBRATION_REGISTRY.default
DEFAULT_CALIBRATION_SAMPLES = 512
MIN_CALIBRATION_SAMPLES = 16
QUANTIZATION_PRESETS = ("default", "tfapprox")                          # swap.QUANTIZATION_PRESETS
OPERAND_CHOICES = ("auto", "activation_first", "weight_first")          # swap.OPERAND_CHOICES
CHECK_SAMPLES = 512                                                     # swap.CHECK_SAMPLES
DEFAULT_LEARNING_RATE = "auto"                                          # research.DEFAULT_...
SCHEDULES = SCHEDULE_REGISTRY.names                                     # research.SCHEDULES
DEFAULT_SCHEDULE = SCHEDULE_REGISTRY.default
DEFAULT_BATCH_SIZE = 32                                                 # research.DEFAULT_...
#: (cli constant, API subpackage, API name): what the startup test compares
OPTION_VALUES = tuple((name, package, name) for package, names in (
    ("graphswap.swap", ("LAYER_TYPES", "MAX_CHECK_BATCH", "BACKWARD_MODES", "COMPENSATION_METHODS",
                        "DEFAULT_COMPENSATION", "DEFAULT_WEIGHT_TUNING",
                        "DEFAULT_BN_REESTIMATION", "DEFAULT_RECIPE",
                        "CALIBRATION_SOURCES", "DEFAULT_CALIBRATION_SOURCE", "CALIBRATION_METHODS",
                        "DEFAULT_CALIBRATION_METHOD", "DEFAULT_CALIBRATION_SAMPLES",
                        "MIN_CALIBRATION_SAMPLES", "QUANTIZATION_PRESETS", "OPERAND_CHOICES",
                        "CHECK_SAMPLES", "DEFAULT_SEQUENCE_LENGTH", "MAX_SEQUENCE_LENGTH")),
    ("graphswap.research", ("DEFAULT_LEARNING_RATE", "SCHEDULES", "DEFAULT_SCHEDULE",
                            "DEFAULT_BATCH_SIZE")))
    for name in names)
