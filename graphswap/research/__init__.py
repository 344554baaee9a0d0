"""Research workflows on top of the rest: data, fine-tuning with the kernels in the loop
(strategies, checkpoints), evaluation of kernels side by side, the per-layer sensitivity sweep,
and saliency maps.

Modules: data (what a model expects, the Data container), loading (reading .npz / image folders /
tf.data / arrays), recovery (calibration data, BN re-estimation, bias compensation, the fine-tuning
recipe), task and output_task (what a model is for, derived once from its saved loss: labels,
metrics, score), distillation (fine-tuning without labels), scoring, strategies, checkpoints,
finetuning, evaluation, sweeping, circuits, design_space and exploration (design-space
exploration over a library of circuits), saliency (it reads images and writes PNGs, so it sits
here rather than in surgery/, whose `override` it uses).
"""

from graphswap.research.circuits import Circuit, CircuitLibrary, load_library
from graphswap.research.data import Data, ModelExpectation, model_expectation
from graphswap.research.evaluation import EvaluationResult, evaluate
from graphswap.research.exploration import explore
from graphswap.research.explore_result import ExploreResult
from graphswap.research.finetuning import (CompileSettings, FinetuneResult, check_learning_rate,
                                         compile_settings, finetune, format_final, format_history,
                                         swapped_layers)
from graphswap.research.loading import load_data
from graphswap.research.recovery import (AUTO_LEARNING_RATE, DEFAULT_BATCH_SIZE,
                                         DEFAULT_BIAS_CORRECTION,
                                         DEFAULT_LEARNING_RATE, DEFAULT_SCHEDULE, SCHEDULES,
                                         auto_learning_rate, calibration_arrays, compensate_bias,
                                         make_optimizer, recalibrate_batchnorm)
from graphswap.research.saliency import (SaliencyResult, input_gradients, load_sample,
                                         saliency_map, write_saliency_png)
from graphswap.research.strategies import STRATEGIES, is_chief, resolve_strategy
from graphswap.research.sweeping import SweepResult, parse_power_options, sweep
from graphswap.research.task import Task, derive_task

__all__ = ["Circuit", "CircuitLibrary", "ExploreResult", "explore", "load_library",
           "AUTO_LEARNING_RATE", "DEFAULT_BIAS_CORRECTION", "DEFAULT_LEARNING_RATE",
           "DEFAULT_SCHEDULE", "SCHEDULES", "auto_learning_rate", "calibration_arrays",
           "compensate_bias", "make_optimizer", "recalibrate_batchnorm", "CompileSettings",
           "Data", "EvaluationResult", "FinetuneResult", "ModelExpectation", "STRATEGIES",
           "SaliencyResult", "SweepResult", "check_learning_rate", "compile_settings", "evaluate",
           "DEFAULT_BATCH_SIZE", "finetune", "format_final", "format_history", "input_gradients", "is_chief", "load_data",
           "load_sample", "model_expectation", "parse_power_options", "resolve_strategy",
           "saliency_map", "swapped_layers", "sweep", "write_saliency_png", "Task",
           "derive_task"]
