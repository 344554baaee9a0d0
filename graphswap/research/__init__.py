"""Research workflows on top of the rest: data, fine-tuning with the kernels in the loop
(strategies, checkpoints), evaluation of kernels side by side, the per-layer sensitivity sweep,
saliency maps and design-space exploration.

The modules sit on four floors, one subpackage each, bottom first; a floor imports only its own
modules and the floors below it (tests/test_architecture.py):

    data/         what a model is fed and what it is for: data, datafiles, dataset_labels,
                  text_data, loading, task, output_task, scoring
    training/     fine-tuning with the kernels in the loop: recovery, distillation,
                  finetune_checks, checkpoint_state, checkpoint_lock, checkpoints, fingerprints,
                  strategies, finetuning
    analysis/     measuring kernels on a model: evaluation, sweeping, saliency
    exploration/  design-space exploration over a library of circuits: circuits, design_space,
                  study_files, study_database, explore_search, explore_result, exploration

This package re-exports the public API; the command line reaches research only through it.
"""

from graphswap.research.analysis.evaluation import EvaluationResult, evaluate
from graphswap.research.analysis.saliency import (SaliencyResult, input_gradients, load_sample,
                                                  saliency_map, write_saliency_png)
from graphswap.research.analysis.sweeping import SweepResult, parse_power_options, sweep
from graphswap.research.data.data import Data, ModelExpectation, model_expectation
from graphswap.research.data.loading import load_data
from graphswap.research.data.task import Task, derive_task
from graphswap.research.exploration.circuits import Circuit, CircuitLibrary, load_library
from graphswap.research.exploration.exploration import explore
from graphswap.research.exploration.explore_result import ExploreResult
from graphswap.research.training.finetuning import (CompileSettings, FinetuneResult,
                                                    check_learning_rate, compile_settings,
                                                    finetune, format_final, format_history,
                                                    swapped_layers)
from graphswap.research.training.recovery import (AUTO_LEARNING_RATE, DEFAULT_BATCH_SIZE,
                                                  DEFAULT_BIAS_CORRECTION, DEFAULT_LEARNING_RATE,
                                                  DEFAULT_SCHEDULE, SCHEDULES, auto_learning_rate,
                                                  calibration_arrays, compensate_bias,
                                                  make_optimizer, recalibrate_batchnorm)
from graphswap.research.training.strategies import STRATEGIES, is_chief, resolve_strategy

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
