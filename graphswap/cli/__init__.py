"""The `graphswap` command line: thin click commands over the Python API.

Every command parses its options (validation in click types and callbacks), calls the API, and
prints.  Any error prints as one `Error: ...` line with exit code 1 (reporting.py).

One module per command (convert, inspect, export, saliency, finetune, evaluate, sweep, explore,
the `kernels` and `trust` groups); group.py holds the `graphswap` group (`main`) and registers
them.  The options several commands share are defined once in options.py and applied by each
command; help.py makes a command's --help list its essential options and --help-all every option,
grouped under headings (quantization and calibration, data and task, model loading, ...);
running.py holds what the commands do around their API call.

Importing this package imports no TensorFlow: `graphswap --help`, every command's --help, usage
errors and `graphswap kernels` answer at once.  Each command imports the API subpackages it calls
inside its body (`from graphswap import io`), after import_tensorflow_quietly() where they need
TensorFlow (`kernels` does not), so a reader follows every call to its module; the option choices and defaults the help texts show are literal
values or - the methods chosen by name - read from graphswap.methods, which imports no TensorFlow
(values.py; tests/test_cli_startup.py holds each to the API's own).  The console
command's entry point is graphswap_command.main (docs/ARCHITECTURE.md, "The command starts
without TensorFlow"); `python -m graphswap.cli` runs the same group.
"""

from __future__ import annotations

from graphswap.cli.group import main
from graphswap.cli.values import (BACKWARD_MODES, CALIBRATION_METHODS, CALIBRATION_SOURCES,
                                  CHECK_SAMPLES, COMPENSATION_METHODS, DEFAULT_BATCH_SIZE,
                                  DEFAULT_BN_REESTIMATION, DEFAULT_CALIBRATION_METHOD,
                                  DEFAULT_CALIBRATION_SAMPLES, DEFAULT_CALIBRATION_SOURCE,
                                  DEFAULT_COMPENSATION, DEFAULT_LEARNING_RATE, DEFAULT_RECIPE,
                                  DEFAULT_SCHEDULE, DEFAULT_SEQUENCE_LENGTH,
                                  DEFAULT_WEIGHT_TUNING, LAYER_TYPES, MAX_CHECK_BATCH,
                                  MAX_SEQUENCE_LENGTH, MIN_CALIBRATION_SAMPLES, OPERAND_CHOICES,
                                  OPTION_VALUES, QUANTIZATION_PRESETS, SCHEDULES)

__all__ = ["main", "BACKWARD_MODES", "CALIBRATION_METHODS", "CALIBRATION_SOURCES",
           "CHECK_SAMPLES", "COMPENSATION_METHODS", "DEFAULT_BATCH_SIZE",
           "DEFAULT_BN_REESTIMATION", "DEFAULT_CALIBRATION_METHOD", "DEFAULT_CALIBRATION_SAMPLES",
           "DEFAULT_CALIBRATION_SOURCE", "DEFAULT_COMPENSATION", "DEFAULT_LEARNING_RATE",
           "DEFAULT_RECIPE", "DEFAULT_SCHEDULE", "DEFAULT_SEQUENCE_LENGTH",
           "DEFAULT_WEIGHT_TUNING", "LAYER_TYPES", "MAX_CHECK_BATCH", "MAX_SEQUENCE_LENGTH",
           "MIN_CALIBRATION_SAMPLES", "OPERAND_CHOICES", "OPTION_VALUES", "QUANTIZATION_PRESETS",
           "SCHEDULES"]
