"""The steps of an exploration that run the study (graphswap.research.exploration.exploration): the
NSGA-II search, shared by every worker of a study, and the retraining of the front's cheapest
points."""

from __future__ import annotations

from graphswap.research.exploration.circuits import EXACT
from graphswap.research.exploration.design_space import assignment_key
from graphswap.research.training.finetuning import finetune


def progress_bar(iterable, total, description, enabled):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=description, unit="eval", leave=False)


def search(database, layers, choices, trials, seed, budget, error_model, cost_of, measure,
            measured, progress, note):
    """NSGA-II over the assignments (optuna), seeded with the error model's picks.  Workers
    sharing the study ask and tell the same sampler; an assignment another worker claimed is
    told as pruned (not measured twice), and every worker stops once the study holds `trials`
    completed trials."""
    import optuna

    study = database.study
    study.sampler = optuna.samplers.NSGAIISampler(seed=seed, population_size=max(
        8, min(50, 2 * len(layers) * len(choices))))

    def completed():
        return len(study.get_trials(deepcopy=False, states=[optuna.trial.TrialState.COMPLETE]))

    done = completed()
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
    # one worker enqueues the seeds (each would otherwise queue them again)
    if seeds[:remaining] and database.claim(f"seeds {budget!r} {trials}"):
        for assignment in seeds[:remaining]:
            study.enqueue_trial(assignment)
    distributions = database.distributions
    asked = 0
    with ProgressBar(remaining, "NSGA-II search", progress) as bar:
        while asked < 4 * trials + 16:   # a bound: other workers may hold every proposal
            before = done
            done = completed()
            bar(done - before)
            if done >= trials:
                break
            asked += 1
            trial = study.ask(distributions)
            assignment = {layer: trial.params[layer] for layer in layers}
            key = assignment_key(assignment, layers)
            if key in measured:  # the sampler proposed a measured assignment again
                metrics = measured[key]
                trial.set_user_attr("repeat", True)
            else:
                metrics = measure(assignment, trial)
            if metrics is None:  # another worker claimed it: it measures and records it
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            else:
                study.tell(trial, [metrics["drop"], cost_of(assignment)])


class ProgressBar:
    """A tqdm bar advanced by hand (nothing when progress is off)."""

    def __init__(self, total, description, enabled):
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=description, unit="eval", leave=False)

    def __enter__(self):
        return self

    def __call__(self, steps):
        if self.bar is not None and steps > 0:
            self.bar.update(steps)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()


def retrain(front, budget, points, finetune_data, epochs, batch_size, seed, evaluator,
             database, layers, progress, note):
    within = sorted([p for p in front if p["accuracy_drop"] <= budget + 1e-12
                     and any(n != EXACT for n in p["assignment"].values())],
                    key=lambda p: p["relative_cost"])[:points]
    note(f"fine-tuning {len(within)} front point(s) for {epochs} epoch(s)")
    for point in progress_bar(within, len(within), "fine-tuning front points", progress):
        key = f"finetuned:{epochs}:{'|'.join(assignment_key(point['assignment'], layers))}"

        def tune(name, point=point, key=key):
            swapped = evaluator.rewrite(point["assignment"])
            tuned = finetune(swapped, finetune_data, epochs=epochs, batch_size=batch_size,
                             seed=seed, verbose=0, task=evaluator.task)
            database.put(key, evaluator.measure_model(tuned.model))

        if database.get(key) is None:
            if database.claim(key):
                tune(key)
            else:
                database.wait_for([key], lambda: None,
                                  lambda name: database.get(name) is not None, tune)
        stored = database.get(key)
        point["finetuned_accuracy"] = stored["accuracy"]
        point["finetuned_drop"] = stored["drop"]
        point["finetune_epochs"] = epochs
