"""Design-space exploration: choose a multiplier per layer from a library of circuits, under an
accuracy budget, with retraining in the loop.

    result = graphswap.explore("model.keras", "val.npz", library=["circuits/"], budget=0.01)
    result.best                      # the cheapest measured assignment within 1 point
    result.write("front.json")       # the measured Pareto front as kernel maps
    result.plot("front.png")

Steps (each kept in the study database, so an interrupted exploration resumes and a finished
one answers new budgets without evaluating anything again):

1. The library (graphswap.research.circuits): circuits with their hardware figures.
2. Cheap estimates: every (layer, circuit) pair measured alone, on a validation subset, and the
   additive error model built from them (graphswap.research.design_space).
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

import os
import time

import numpy as np

from graphswap.errors import GraphswapError
from graphswap.io import load_model
from graphswap.research.circuits import EXACT, OBJECTIVES, CircuitLibrary, load_library
from graphswap.research.design_space import (ERROR_MODELS, ErrorModel, Evaluator, Study,
                                             all_exact,
                                             assignment_key, data_fingerprint, every_assignment,
                                             model_fingerprint, relative_cost, single, uniform)
from graphswap.research.explore_result import ExploreResult, pareto_front
from graphswap.research.finetuning import finetune
from graphswap.research.loading import load_data
from graphswap.research.task import derive_task
from graphswap.swap import plan

def _progress(iterable, total, description, enabled):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=description, unit="eval", leave=False)


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


def explore(model, data, library, *, budget: float = 0.01, objective: str = "power",
            metrics=None, trials: int | None = None, exhaustive_limit: int = 256,
            estimate_samples: int | None = 512, finetune_data=None, finetune_epochs: int = 1,
            finetune_points: int = 3, study=None, error_model: str = "multiplicative",
            layer_types=("Dense", "Conv2D"),
            include=None, exclude=None, backward: str = "native", batch_size: int = 128,
            seed: int = 0, split: str | None = "test", resize: bool = False, pad: bool = False,
            scale=None, custom_objects=None, safe_mode: bool = True, progress: bool = True,
            log=None, loss=None, task_metrics=None) -> ExploreResult:
    """Explore per-layer multiplier assignments of `model` on validation `data` (module docstring).

    Args:
      library: a CircuitLibrary, or sources for graphswap.research.circuits.load_library
        (directories, files, specs, built-in names); `metrics` is its optional figures table.
      budget: the accuracy drop allowed, as a fraction (0.01 = 1 point), against the float model.
      objective: "power", "area" or "delay" of the multipliers, MAC-weighted.
      trials: assignments the NSGA-II search measures in all (stored ones count) [default:
        20 x the number of layers]; a space of at most `exhaustive_limit` assignments is
        enumerated instead.
      estimate_samples: size of the validation subset the per-(layer, circuit) estimates use.
      finetune_data / finetune_epochs / finetune_points: retrain the cheapest `finetune_points`
        front points within the budget and measure them again.
      study: a path to the SQLite study database (resumable); None keeps it in memory.
      error_model: "multiplicative" or "additive" (graphswap.research.design_space).
      log: called with each note as it is made.
      loss / task_metrics: override the task the saved loss implies (graphswap.research.task;
        `metrics` is the circuits' table here).  The "accuracy" explore compares is the task's
        score - accuracy for classifiers, R^2 for regression and reconstruction, or the first
        of `task_metrics`, which must be one where higher is better.
    """
    started = time.perf_counter()
    if not 0 <= budget <= 1:
        raise GraphswapError(f"budget is an accuracy drop between 0 and 1 (0.01 = one point), "
                             f"got {budget}")
    if objective not in OBJECTIVES:
        raise GraphswapError(f"unknown objective {objective!r}; allowed: {', '.join(OBJECTIVES)}")
    if error_model not in ERROR_MODELS:
        raise GraphswapError(f"unknown error model {error_model!r}; allowed: "
                             f"{', '.join(ERROR_MODELS)}")
    if trials is not None and trials < 1:
        raise GraphswapError(f"trials must be at least 1, got {trials}")
    if finetune_data is not None and finetune_epochs < 1:
        raise GraphswapError(f"finetune_epochs must be at least 1, got {finetune_epochs}")
    notes = []

    def note(text):
        notes.append(text)
        if log is not None:
            log(text)

    if isinstance(model, (str, os.PathLike)):
        model = load_model(model, custom_objects=custom_objects, safe_mode=safe_mode)
    task = derive_task(model, loss, task_metrics)
    if not task.higher_is_better:
        raise GraphswapError(
            f"explore compares a score where higher is better and budgets its drop; "
            f"{task.score_metric} is lower-is-better - put accuracy, r2, psnr, agreement or "
            f"top5_accuracy first in the task metrics (--task-metrics)")
    if not isinstance(library, CircuitLibrary):
        library = load_library(library, metrics)
    library.require_metric(objective)
    note(task.note)  # after every input check: a refused input prints only its Error line
    for source, reason in library.skipped:
        note(f"skipped circuit {source}: {reason}")
    validation = load_data(data, model, split=split, resize=resize, pad=pad, scale=scale,
                           name="validation data", task=task)
    report = plan(model, kernel=library.exact.spec, include=include, exclude=exclude,
                  layer_types=tuple(layer_types), backward=backward)
    layers = [entry.path for entry in report.swapped]
    if not layers:
        raise GraphswapError(f"no layer of {model.name!r} can be swapped with the given selection; "
                             f"see 'graphswap inspect'")
    macs = {entry.path: max(entry.macs, 1) for entry in report.swapped}
    evaluator = Evaluator(model, validation, layers, library, task, batch_size, backward)
    subset = _subset(validation, estimate_samples, seed)
    estimator = evaluator if subset is validation else Evaluator(
        model, subset, layers, library, task, batch_size, backward)
    choices = [EXACT, *library.names()]
    space = len(choices) ** len(layers)

    fingerprint = {"model": model_fingerprint(model), "data": data_fingerprint(validation),
                   "library": library.fingerprint(), "layers": layers,
                   "batch_size": batch_size, "backward": backward,
                   "estimate_subset": f"{len(subset)}@{seed}"}
    database = Study(study, fingerprint, layers, choices)
    measured = database.measured()
    stored_before = len(measured)
    if stored_before:
        note(f"resumed study {study}: {stored_before} assignment(s) already measured")

    def cost_of(assignment):
        return relative_cost(assignment, macs, library, objective)

    def measure(assignment, trial=None):
        """The metrics of `assignment`, measured once; stored as `trial` (the sampler's) or as
        a trial of its own."""
        key = assignment_key(assignment, layers)
        if key not in measured:
            metrics_ = evaluator.measure(assignment)
            if trial is None:
                database.record(assignment, metrics_, cost_of(assignment))
            else:
                for name, value in {**metrics_, "cost": cost_of(assignment)}.items():
                    trial.set_user_attr(name, value)
            measured[key] = metrics_
        return measured[key]

    # all-exact first: the budget must be reachable at all
    exact_metrics = measure(all_exact(layers))
    if exact_metrics["drop"] > budget + 1e-12:
        raise GraphswapError(
            f"the budget ({budget * 100:.2f} points) is below the accuracy drop of the all-exact "
            f"8-bit model ({exact_metrics['drop'] * 100:.2f} points: quantization alone costs "
            f"that); no assignment can meet it. Raise the budget")

    # estimates
    estimates = database.get("estimates") or {}
    todo = [(layer, name) for layer in layers for name in library.names()
            if name not in estimates.get(layer, {})]
    subset_exact = database.get("estimate_all_exact")
    if subset_exact is None:
        subset_exact = estimator.measure(all_exact(layers))["accuracy"]
        database.put("estimate_all_exact", subset_exact)
    for layer, name in _progress(todo, len(todo), "estimates (layer x circuit)", progress):
        accuracy = estimator.measure(single(layers, layer, name))["accuracy"]
        estimates.setdefault(layer, {})[name] = accuracy
        database.put("estimates", estimates)
    subset_baseline = estimator.baseline["accuracy"]
    deltas = {layer: {name: subset_exact - estimates[layer][name] for name in library.names()}
              for layer in layers}
    model_kind = error_model
    error_model = ErrorModel(subset_baseline - subset_exact, deltas, subset_baseline, model_kind)
    seeding_model = ErrorModel(subset_baseline - subset_exact, deltas, subset_baseline,
                               "additive")

    # references: one circuit everywhere
    references = {"all exact": all_exact(layers)}
    for name in library.names():
        references[name] = uniform(layers, name)
    for assignment in _progress(list(references.values()), len(references), "references",
                                progress):
        measure(assignment)

    if space <= exhaustive_limit and (trials is None or trials >= space):
        note(f"exhaustive search: all {space} assignments measured")
        pending = [a for a in every_assignment(layers, choices)
                   if assignment_key(a, layers) not in measured]
        for assignment in _progress(pending, len(pending), "exhaustive search", progress):
            measure(assignment)
    else:
        trials = trials if trials is not None else 20 * len(layers)
        _search(database, layers, choices, trials, seed, budget, seeding_model, cost_of,
                measure, measured, progress, note)

    points = [_point(dict(zip(layers, key)), metrics_, cost_of, error_model, evaluator)
              for key, metrics_ in measured.items()]
    front = pareto_front(points)
    by_key = {assignment_key(p["assignment"], layers): p for p in points}
    reference_points = {name: by_key[assignment_key(a, layers)] for name, a in references.items()}

    if finetune_data is not None:
        _retrain(front, budget, finetune_points, finetune_data, finetune_epochs, batch_size,
                 seed, evaluator, database, layers, progress, note)

    predicted = [(p["predicted_drop"], p["accuracy_drop"]) for p in points
                 if any(name != EXACT for name in p["assignment"].values())]
    singles = [p for p in points if sum(name != EXACT for name in p["assignment"].values()) == 1]
    prediction = {"model": f"{model_kind}, from per-(layer, circuit) accuracies measured alone "
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
    return ExploreResult(model.name, validation.source, len(validation), objective, budget,
                         evaluator.baseline, [{"layer": layer, "macs": macs[layer]}
                                              for layer in layers],
                         library, points, front, reference_points, estimates, prediction,
                         counts, notes)


def _point(assignment, metrics, cost_of, error_model, evaluator) -> dict:
    return {"assignment": assignment, "kernel_map": evaluator.kernel_map(assignment),
            "accuracy": metrics["accuracy"], "accuracy_drop": metrics["drop"],
            "loss": metrics["loss"], "agreement": metrics["agreement"],
            "relative_cost": cost_of(assignment),
            "predicted_drop": error_model.predict(assignment)}


def _search(database, layers, choices, trials, seed, budget, error_model, cost_of, measure,
            measured, progress, note):
    """NSGA-II over the assignments (optuna), seeded with the error model's picks."""
    import optuna

    study = database.study
    study.sampler = optuna.samplers.NSGAIISampler(seed=seed, population_size=max(
        8, min(50, 2 * len(layers) * len(choices))))
    done = len([t for t in study.get_trials(deepcopy=False)
                if t.state == optuna.trial.TrialState.COMPLETE])
    remaining = max(trials - done, 0)
    note(f"NSGA-II search: {trials} assignments in all ({done} stored, {remaining} to go) of "
         f"{len(choices) ** len(layers):,} possible")

    def cost_for(layer, name):
        return cost_of({layer: name}) if name != EXACT else cost_of({layer: EXACT})

    seeds = []
    for factor in (0.25, 0.5, 1.0, 1.5, 2.0, 4.0):
        pick = error_model.cheapest_within(budget * factor, layers, choices, cost_for)
        if assignment_key(pick, layers) not in measured:
            seeds.append(pick)
    for assignment in seeds[:remaining]:
        study.enqueue_trial(assignment)
    distributions = database.distributions
    for _ in _progress(range(remaining), remaining, "NSGA-II search", progress):
        trial = study.ask(distributions)
        assignment = {layer: trial.params[layer] for layer in layers}
        key = assignment_key(assignment, layers)
        if key in measured:  # the sampler proposed a measured assignment again: no evaluation
            metrics = measured[key]
            trial.set_user_attr("repeat", True)
        else:
            metrics = measure(assignment, trial)
        study.tell(trial, [metrics["drop"], cost_of(assignment)])


def _retrain(front, budget, points, finetune_data, epochs, batch_size, seed, evaluator,
             database, layers, progress, note):
    within = sorted([p for p in front if p["accuracy_drop"] <= budget + 1e-12
                     and any(n != EXACT for n in p["assignment"].values())],
                    key=lambda p: p["relative_cost"])[:points]
    note(f"fine-tuning {len(within)} front point(s) for {epochs} epoch(s)")
    for point in _progress(within, len(within), "fine-tuning front points", progress):
        key = f"finetuned:{epochs}:{'|'.join(assignment_key(point['assignment'], layers))}"
        stored = database.get(key)
        if stored is None:
            swapped = evaluator.rewrite(point["assignment"])
            tuned = finetune(swapped, finetune_data, epochs=epochs, batch_size=batch_size,
                             seed=seed, verbose=0, task=evaluator.task)
            stored = evaluator.measure_model(tuned.model)
            database.put(key, stored)
        point["finetuned_accuracy"] = stored["accuracy"]
        point["finetuned_drop"] = stored["drop"]
        point["finetune_epochs"] = epochs
