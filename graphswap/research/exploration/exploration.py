"""Design-space exploration: choose a multiplier per layer from a library of circuits, under an
accuracy budget, with retraining in the loop.

    result = graphswap.explore("model.keras", "val.npz", library=["circuits/"], budget=0.01)
    result.best                      # the cheapest measured assignment within 1 point
    result.write("front.json")       # the measured Pareto front as kernel maps
    result.plot("front.png")

Steps (each kept in the study database, so an interrupted exploration resumes and a finished
one answers new budgets without evaluating anything again):

1. The library (graphswap.research.exploration.circuits): circuits with their hardware figures.
2. Cheap estimates: every (layer, circuit) pair measured alone, on a validation subset, and the
   additive error model built from them (graphswap.research.exploration.design_space).
3. The search, over assignments of {exact, circuit...} to every layer: exhaustive when the space
   has at most `exhaustive_limit` assignments (tests check the optimum against brute force),
   otherwise optuna's NSGA-II sampler over `trials` assignments, seeded with the all-exact and
   single-circuit assignments and with the error model's cheapest predictions for several
   budgets.  Every candidate is measured on the whole validation set: the front is what was
   measured, not what was predicted; the prediction is reported beside it.
4. Retraining in the loop: with `finetune_data`, the front's points within the budget are
   fine-tuned for `finetune_epochs` epochs with their approximate arithmetic and measured again.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import time

import numpy as np

from graphswap.errors import GraphswapError
from graphswap.io import load_model
from graphswap.research.exploration.circuits import EXACT, OBJECTIVES, CircuitLibrary, load_library
from graphswap.research.exploration.design_space import (CALIBRATION_OPTIONS,
                                                         DEFAULT_CLAIM_TIMEOUT, ERROR_MODELS,
                                                         ErrorModel, Evaluator, Study, all_exact,
                                                         assignment_key, data_fingerprint,
                                                         every_assignment, model_fingerprint,
                                                         relative_cost, single, uniform)
from graphswap.research.exploration.explore_result import (PERCENT_SCORES, ExploreResult,
                                                           describe_rewrite, pareto_front)
from graphswap.research.exploration.explore_search import progress_bar, retrain, search
from graphswap.research.data.loading import load_data
from graphswap.research.training.recovery import prepared_rewrite_options
from graphswap.research.data.task import derive_task
from graphswap.swap import plan, rewrite_model
from graphswap.swap.folding import fold_batchnorm
from graphswap.swap.recipe import has_batchnorm, recipe_defaults

def _rank_correlation(a, b) -> float:
    if len(a) < 2 or np.std(a) == 0 or np.std(b) == 0:
        return float("nan")
    ranks_a = np.argsort(np.argsort(a))
    ranks_b = np.argsort(np.argsort(b))
    return float(np.corrcoef(ranks_a, ranks_b)[0, 1])


def _subset(data, samples: int, seed: int):
    """A seeded subset of `samples` examples (the whole data when it is not larger)."""
    if samples is None or samples >= len(data):
        return data
    if samples < 1:
        raise GraphswapError(f"estimate_samples must be at least 1, got {samples}")
    return data.split(samples / len(data), seed=seed)[1]


def describe_amount(value: float, metric: str) -> str:
    """A score difference as the user reads it: points for accuracies and R^2, else the
    metric's own units."""
    return f"{value * 100:.2f} points" if metric in PERCENT_SCORES else f"{value:.4g} {metric}"


def explore(model, data, library, *, budget: float = 0.01, objective: str = "power",
            metrics=None, trials: int | None = None, exhaustive_limit: int = 256,
            estimate_samples: int | None = 512, finetune_data=None, finetune_epochs: int = 1,
            finetune_points: int = 3, study=None, error_model: str = "multiplicative",
            layer_types=("Dense", "Conv2D"),
            include=None, exclude=None, backward: str = "native", batch_size: int = 128,
            seed: int = 0, split: str | None = "test", resize: bool = False, pad: bool = False,
            scale=None, custom_objects=None, safe_mode: bool = True, progress: bool = True,
            log=None, loss=None, task_metrics=None, rewrite_options=None,
            reuse_calibration: bool = True,
            claim_timeout: float = DEFAULT_CLAIM_TIMEOUT) -> ExploreResult:
    """Explore per-layer multiplier assignments of `model` on validation `data` (module docstring).

    Args:
      library: a CircuitLibrary, or sources for graphswap.research.exploration.circuits.load_library
        (directories, files, specs, built-in names); `metrics` is its optional figures table.
      budget: the score drop allowed against the float model: for accuracies and R^2 a fraction
        (0.01 = 1 point); for a lower-is-better score (mse, mae) the increase allowed, in its
        units.
      objective: "power", "area" or "delay" of the multipliers, MAC-weighted.
      trials: assignments the NSGA-II search measures in all (stored ones count) [default:
        20 x the number of layers]; a space of at most `exhaustive_limit` assignments is
        enumerated instead.
      estimate_samples: size of the validation subset the per-(layer, circuit) estimates use.
      finetune_data / finetune_epochs / finetune_points: retrain the cheapest `finetune_points`
        front points within the budget and measure them again.
      study: the study database (resumable, shareable by several workers): a SQLite file path
        or an optuna storage URL (sqlite:///, postgresql://, mysql://); None keeps it in memory.
      error_model: "multiplicative" or "additive" (graphswap.research.exploration.design_space); a
        lower-is-better score always uses the additive one.
      log: called with each note as it is made.
      loss / task_metrics: override the task the saved loss implies (graphswap.research.data.task;
        `metrics` is the circuits' table here).  The score explore compares is the task's -
        accuracy for classifiers, R^2 for regression and reconstruction, or the first of
        `task_metrics` (higher- or lower-is-better); results name it (`score_metric`).
      rewrite_options: rewrite_model's quantization, calibration and folding arguments
        (graphswap.research.training.recovery.REWRITE_OPTIONS; calibration_data may be a data
        source, read as `graphswap convert --calibrate` reads it): each assignment is measured as
        the model `convert --kernel-map FRONT#INDEX` with the same options builds.
      reuse_calibration: calibrate the activation ranges once when they do not depend on the
        assignment (the float calibration source; design_space.Evaluator); False calibrates
        every assignment's model from scratch (the same numbers, slower).
      claim_timeout: seconds without a heartbeat after which another worker's claimed
        measurements are taken over (workers sharing a study; design_space.Study).
    """
    started = time.perf_counter()
    if objective not in OBJECTIVES:
        raise GraphswapError(f"unknown objective {objective!r}; allowed: {', '.join(OBJECTIVES)}")
    if error_model not in ERROR_MODELS:
        raise GraphswapError(f"unknown error model {error_model!r}; allowed: "
                             f"{', '.join(ERROR_MODELS)}")
    if trials is not None and trials < 1:
        raise GraphswapError(f"trials must be at least 1, got {trials}")
    if finetune_data is not None and finetune_epochs < 1:
        raise GraphswapError(f"finetune_epochs must be at least 1, got {finetune_epochs}")
    if not claim_timeout > 0:
        raise GraphswapError(f"claim_timeout must be a positive number of seconds, got "
                             f"{claim_timeout}")
    if not budget >= 0:
        raise GraphswapError(f"budget is a score drop of at least 0 (0.01 = one point), got "
                             f"{budget}")
    notes = []

    def note(text):
        notes.append(text)
        if log is not None:
            log(text)

    if isinstance(model, (str, os.PathLike)):
        model = load_model(model, custom_objects=custom_objects, safe_mode=safe_mode)
    task = derive_task(model, loss, task_metrics)
    metric = task.score_metric
    if task.higher_is_better and budget > 1:
        raise GraphswapError(f"budget is an accuracy drop between 0 and 1 (0.01 = one point), "
                             f"got {budget}")
    if not isinstance(library, CircuitLibrary):
        library = load_library(library, metrics)
    library.require_metric(objective)
    validation = load_data(data, model, split=split, resize=resize, pad=pad, scale=scale,
                           name="validation data", task=task)
    # read as 'graphswap convert --calibrate DATA' reads it: what convert then builds is this
    options = prepared_rewrite_options(rewrite_options, model)
    if options.get("calibration_data") is not None:
        # the zero-training steps convert applies by default apply here too, explicitly
        defaults = inspect.signature(rewrite_model).parameters
        options = {**{name: defaults[name].default for name in CALIBRATION_OPTIONS}, **options}
        # resolved as rewrite_model resolves them, so that the front file names each step
        folded = fold_batchnorm(model)[0] if options.get("fold_batchnorm") else model
        tuning = options["weight_tuning"]   # left at its default, rewrite_model measures it
        options["bias_correction"], resolved, options["recalibrate_bn"] = \
            recipe_defaults(options["bias_correction"], tuning, True,
                            options["recalibrate_bn"], has_batchnorm(folded))
        if not (isinstance(tuning, str) and tuning == "default"):
            options["weight_tuning"] = resolved
    rewrite = describe_rewrite(rewrite_options, options)
    later = []   # notes printed once every input (the study too) is checked
    report = plan(model, kernel=library.exact.spec, include=include, exclude=exclude,
                  layer_types=tuple(layer_types), backward=backward)
    layers = [entry.path for entry in report.swapped]
    if not layers:
        raise GraphswapError(f"no layer of {model.name!r} can be swapped with the given selection; "
                             f"see 'graphswap inspect'")
    macs = {entry.path: max(entry.macs, 1) for entry in report.swapped}
    evaluator = Evaluator(model, validation, layers, library, task, batch_size, backward,
                          options, reuse_calibration)
    subset = _subset(validation, estimate_samples, seed)
    estimator = evaluator if subset is validation else Evaluator(
        model, subset, layers, library, task, batch_size, backward, options, reuse_calibration)
    if options.get("calibration_data") is not None:
        later.append(f"each assignment measured as convert builds it with "
                     f"{' '.join(rewrite['convert'])} ("
                     f"{'activation ranges calibrated once, ' if evaluator.reuses_calibration else ''}"
                     f"{_calibration_steps(options)})")
    choices = [EXACT, *library.names()]
    space = len(choices) ** len(layers)

    fingerprint = {"model": model_fingerprint(model), "data": data_fingerprint(validation),
                   "library": library.fingerprint(), "layers": layers,
                   "batch_size": batch_size, "backward": backward,
                   "estimate_subset": f"{len(subset)}@{seed}"}
    if rewrite["fingerprint"] is not None:  # absent for the default: older studies stay valid
        fingerprint["rewrite"] = rewrite["fingerprint"]
    if metric != ("accuracy" if task.is_classifier else "r2"):
        fingerprint["score"] = metric
    database = Study(study, fingerprint, layers, choices, claim_timeout=claim_timeout,
                     score_max=1.0 if task.higher_is_better else math.inf)
    note(task.note)  # after every input check: a refused input prints only its Error line
    for source, reason in library.skipped:
        note(f"skipped circuit {source}: {reason}")
    for text in later:
        note(text)
    try:
        return _explore(model, task, library, validation, subset, layers, macs, choices, space,
                        evaluator, estimator, database, study, budget, objective, trials,
                        exhaustive_limit, finetune_data, finetune_epochs, finetune_points,
                        error_model, batch_size, seed, progress, note, notes, rewrite, started)
    finally:
        database.close()


def _calibration_steps(options) -> str:
    steps = [f"{options.get('calibration_method', 'percentile')} ranges "
             f"({options.get('calibration_source', 'float')} forward)"]
    if options.get("bias_correction") is not None:
        steps.append(f"bias correction {options['bias_correction']} per assignment")
    if options.get("recalibrate_bn"):
        steps.append("BatchNorm re-estimated per assignment")
    return ", ".join(steps)


def _explore(model, task, library, validation, subset, layers, macs, choices, space, evaluator,
             estimator, database, study, budget, objective, trials, exhaustive_limit,
             finetune_data, finetune_epochs, finetune_points, error_model, batch_size, seed,
             progress, note, notes, rewrite, started):
    metric = task.score_metric
    measured = database.measured()
    stored_before = len(measured)
    if stored_before:
        note(f"resumed study {database.path}: {stored_before} assignment(s) already measured")

    def cost_of(assignment):
        return relative_cost(assignment, macs, library, objective)

    def refresh():
        measured.update(database.measured())

    def measure(assignment, trial=None):
        """The metrics of `assignment`, measured once (across every worker of the study): stored
        as `trial` (the sampler's) or as a trial of its own.  None when another worker claimed
        it first."""
        key = assignment_key(assignment, layers)
        if key in measured:
            return measured[key]
        if not database.claim(_claim(key)):
            return None
        metrics_ = evaluator.measure(assignment)
        if trial is None:
            database.record(assignment, metrics_, cost_of(assignment))
        else:
            for name, value in {**metrics_, "cost": cost_of(assignment)}.items():
                trial.set_user_attr(name, value)
        measured[key] = metrics_
        return metrics_

    def ensure(assignments, description):
        """Every one of `assignments` measured: here, or by the worker that claimed it."""
        pending = [a for a in assignments if assignment_key(a, layers) not in measured]
        for assignment in progress_bar(pending, len(pending), description, progress):
            measure(assignment)
        by_claim = {_claim(assignment_key(a, layers)): a for a in assignments
                    if assignment_key(a, layers) not in measured}
        if by_claim:
            database.wait_for(list(by_claim), refresh,
                              lambda name: assignment_key(by_claim[name], layers) in measured,
                              lambda name: _record_taken_over(by_claim[name]))

    def _record_taken_over(assignment):
        metrics_ = evaluator.measure(assignment)
        database.record(assignment, metrics_, cost_of(assignment))
        measured[assignment_key(assignment, layers)] = metrics_

    # all-exact first: the budget must be reachable at all
    ensure([all_exact(layers)], "all exact")
    exact_metrics = measured[assignment_key(all_exact(layers), layers)]
    if exact_metrics["drop"] > budget + 1e-12:
        raise GraphswapError(
            f"the budget ({describe_amount(budget, metric)}) is below the {metric} drop of the "
            f"all-exact 8-bit model ({describe_amount(exact_metrics['drop'], metric)}: "
            f"quantization alone costs that); no assignment can meet it. Raise the budget")

    # estimates: one study attribute per (layer, circuit), each measured by one worker
    estimates = database.estimates()
    subset_exact = database.get("estimate_all_exact")
    if subset_exact is None and database.claim("estimate all exact"):
        subset_exact = estimator.measure(all_exact(layers))["accuracy"]
        database.put("estimate_all_exact", subset_exact)
    todo = [(layer, name) for layer in layers for name in library.names()
            if name not in estimates.get(layer, {})]
    for layer, name in progress_bar(todo, len(todo), "estimates (layer x circuit)", progress):
        if database.claim(f"estimate {layer} {name}"):
            value = estimator.measure(single(layers, layer, name))["accuracy"]
            database.put(database.estimate_key(layer, name), value)
            estimates.setdefault(layer, {})[name] = value
    waiting = [f"estimate {layer} {name}" for layer, name in todo
               if name not in estimates.get(layer, {})]
    if subset_exact is None:
        waiting.append("estimate all exact")
    if waiting:
        pairs = {f"estimate {layer} {name}": (layer, name) for layer, name in todo}
        state = {"estimates": estimates, "exact": subset_exact}

        def reread():
            state["estimates"] = database.estimates()
            state["exact"] = database.get("estimate_all_exact")

        def have(name):
            if name == "estimate all exact":
                return state["exact"] is not None
            layer, circuit = pairs[name]
            return circuit in state["estimates"].get(layer, {})

        def take_over(name):
            if name == "estimate all exact":
                database.put("estimate_all_exact",
                             estimator.measure(all_exact(layers))["accuracy"])
            else:
                layer, circuit = pairs[name]
                database.put(database.estimate_key(layer, circuit),
                             estimator.measure(single(layers, layer, circuit))["accuracy"])
            reread()

        database.wait_for(waiting, reread, have, take_over)
        estimates, subset_exact = database.estimates(), database.get("estimate_all_exact")
    subset_baseline = estimator.baseline["accuracy"]
    sign = 1.0 if task.higher_is_better else -1.0
    deltas = {layer: {name: sign * (subset_exact - estimates[layer][name])
                      for name in library.names()} for layer in layers}
    model_kind = error_model if task.higher_is_better else "additive"
    if model_kind != error_model:
        note(f"error model: additive ({metric} is lower-is-better; the multiplicative model "
             f"shares out an accuracy)")
    exact_drop = sign * (subset_baseline - subset_exact)
    ceiling = subset_baseline if task.higher_is_better else math.inf
    error_model = ErrorModel(exact_drop, deltas, ceiling, model_kind)
    seeding_model = ErrorModel(exact_drop, deltas, ceiling, "additive")

    # references: one circuit everywhere
    references = {"all exact": all_exact(layers)}
    for name in library.names():
        references[name] = uniform(layers, name)
    ensure(list(references.values()), "references")

    if space <= exhaustive_limit and (trials is None or trials >= space):
        note(f"exhaustive search: all {space} assignments measured")
        ensure(list(every_assignment(layers, choices)), "exhaustive search")
    else:
        trials = trials if trials is not None else 20 * len(layers)
        search(database, layers, choices, trials, seed, budget, seeding_model, cost_of,
                measure, measured, progress, note)
        running = {}
        for trial in database.running_trials():
            key = tuple(trial.params.get(layer) for layer in layers)
            if key not in measured and all(value in choices for value in key):
                running[_claim(key)] = dict(zip(layers, key))
        if running:  # other workers' last assignments: every worker ends with one front
            database.wait_for(list(running), refresh,
                              lambda name: assignment_key(running[name], layers) in measured,
                              lambda name: _record_taken_over(running[name]))
    refresh()

    points = [_point(dict(zip(layers, key)), metrics_, cost_of, error_model, evaluator)
              for key, metrics_ in measured.items()]
    front = pareto_front(points)
    by_key = {assignment_key(p["assignment"], layers): p for p in points}
    reference_points = {name: by_key[assignment_key(a, layers)] for name, a in references.items()}

    if finetune_data is not None:
        retrain(front, budget, finetune_points, finetune_data, finetune_epochs, batch_size,
                 seed, evaluator, database, layers, progress, note)

    predicted = [(p["predicted_drop"], p["accuracy_drop"]) for p in points
                 if any(name != EXACT for name in p["assignment"].values())]
    singles = [p for p in points if sum(name != EXACT for name in p["assignment"].values()) == 1]
    prediction = {"model": f"{model_kind}, from per-(layer, circuit) {metric} measured alone "
                           f"on {len(subset)} validation examples",
                  "points": len(predicted),
                  "mean_abs_error": float(np.mean([abs(a - b) for a, b in predicted]))
                  if predicted else None,
                  "max_abs_error": float(max(abs(a - b) for a, b in predicted))
                  if predicted else None,
                  "rank_correlation": _rank_correlation([a for a, _ in predicted],
                                                        [b for _, b in predicted]),
                  "single_layer_max_abs_error": float(max(
                      abs(p["predicted_drop"] - p["accuracy_drop"]) for p in singles))
                  if singles else None}
    counts = {"space": space, "measured": len(measured), "stored_before": stored_before,
              "full_evaluations_this_run": evaluator.evaluations,
              "estimate_evaluations_this_run": estimator.evaluations if estimator is not
              evaluator else None, "seconds": round(time.perf_counter() - started, 1)}
    if rewrite["options"].get("calibrate") is not None:
        counts["calibration_reused"] = evaluator.reuses_calibration
        counts["calibration_seconds"] = round(
            evaluator.calibration_seconds +
            (estimator.calibration_seconds if estimator is not evaluator else 0.0), 2)
    return ExploreResult(model.name, validation.source, len(validation), objective, budget,
                         evaluator.baseline, [{"layer": layer, "macs": macs[layer]}
                                              for layer in layers],
                         library, points, front, reference_points, estimates, prediction,
                         counts, notes, score_metric=metric,
                         higher_is_better=task.higher_is_better,
                         rewrite_options=rewrite["options"], convert_options=rewrite["convert"])


def _claim(key) -> str:
    return "assignment " + json.dumps(list(key))


def _point(assignment, metrics, cost_of, error_model, evaluator) -> dict:
    return {"assignment": assignment, "kernel_map": evaluator.kernel_map(assignment),
            "accuracy": metrics["accuracy"], "accuracy_drop": metrics["drop"],
            "loss": metrics["loss"], "agreement": metrics["agreement"],
            "relative_cost": cost_of(assignment),
            "predicted_drop": error_model.predict(assignment)}
