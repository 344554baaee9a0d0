"""The design space of a model and a circuit library: assignments (which circuit runs each
layer), their cost, their measured accuracy, the per-(layer, circuit) estimates and the error model
that predicts an assignment's accuracy drop from them, and the study database that keeps every
measurement.

Cost (the objective: power, area or delay of the multipliers, weighted by each layer's MACs):

    relative cost = sum_l MACs_l x m(circuit_l) / (sum_l MACs_l x m(exact))

so the all-exact assignment costs 1.0.  (For delay this MAC-weighted mean is a proxy: a
pipeline's delay is its slowest stage, not a sum.)

Error model, from accuracies measured on an estimation subset S of the validation data (E = all
exact, l:c = only layer l on circuit c, the rest exact, acc_F = the float model):

    multiplicative (default):  predicted acc(a) = acc_S(E) x prod_l acc_S(l:a_l) / acc_S(E)
    additive:                  predicted acc(a) = acc_S(E) - sum_l [acc_S(E) - acc_S(l:a_l)]
    predicted drop(a) = acc_F - predicted acc(a)   (at most acc_F)

Both are exact for an assignment that differs from all-exact in one layer (when S is the whole
validation set) and ignore interactions between layers otherwise; the multiplicative one lets
drops compound without going past zero accuracy.  graphswap.research.explore reports how well
the model predicted every assignment it then measured.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json

import numpy as np

from graphswap.errors import GraphswapError
from graphswap.research.circuits import EXACT, CircuitLibrary
from graphswap.research.scoring import classification_metrics, predict, takes_logits
from graphswap.swap import rewrite_model


def assignment_key(assignment: dict, layers: list) -> tuple:
    """An assignment as a hashable tuple, in layer order."""
    return tuple(assignment[layer] for layer in layers)


def relative_cost(assignment: dict, macs: dict, library: CircuitLibrary, objective: str) -> float:
    total = sum(macs[layer] * library.exact.metric(objective) for layer in assignment)
    spent = sum(macs[layer] * library.by_name(name).metric(objective)
                for layer, name in assignment.items())
    return spent / total


class Evaluator:
    """Measures assignments of `library` circuits to `layers` of `model` on `data`."""

    def __init__(self, model, data, layers: list, library: CircuitLibrary, settings,
                 batch_size: int, backward: str = "native", rewrite_options=None):
        self.model = model
        self.data = data
        self.layers = list(layers)
        self.library = library
        self.settings = settings
        self.batch_size = batch_size
        self.backward = backward
        self.rewrite_options = dict(rewrite_options or {})
        self.labels = data.labels()
        self.from_logits = takes_logits(settings.loss)
        self.reference = predict(model, data, batch_size)
        self.baseline = classification_metrics(self.reference, self.labels, data.label_format,
                                               settings.loss, self.reference, self.from_logits)
        self.evaluations = 0

    def kernel_map(self, assignment: dict) -> dict:
        return {layer: self.library.by_name(name).spec for layer, name in assignment.items()}

    def rewrite(self, assignment: dict):
        return rewrite_model(self.model, kernel=None, kernel_map=self.kernel_map(assignment),
                             backward=self.backward, **self.rewrite_options)

    def measure_model(self, model) -> dict:
        outputs = predict(model, self.data, self.batch_size)
        metrics = classification_metrics(outputs, self.labels, self.data.label_format,
                                         self.settings.loss, self.reference, self.from_logits)
        return {"accuracy": metrics["accuracy"], "loss": metrics["loss"],
                "agreement": metrics["agreement"],
                "drop": self.baseline["accuracy"] - metrics["accuracy"]}

    def measure(self, assignment: dict) -> dict:
        self.evaluations += 1
        return self.measure_model(self.rewrite(assignment))


def all_exact(layers) -> dict:
    return {layer: EXACT for layer in layers}


def single(layers, layer, name) -> dict:
    return {**all_exact(layers), layer: name}


def uniform(layers, name) -> dict:
    return {layer: name for layer in layers}


def every_assignment(layers, choices):
    for combination in itertools.product(choices, repeat=len(layers)):
        yield dict(zip(layers, combination))


ERROR_MODELS = ("multiplicative", "additive")


@dataclasses.dataclass
class ErrorModel:
    """The error model (module docstring) from estimates measured on a subset."""

    exact_drop: float                 # drop_S(all exact)
    deltas: dict                      # {layer: {circuit: acc_S(all exact) - acc_S(single)}}
    baseline: float = 1.0             # acc_S of the float model (the largest possible drop)
    kind: str = "multiplicative"

    def predict(self, assignment: dict) -> float:
        changed = [(layer, name) for layer, name in assignment.items() if name != EXACT]
        if self.kind == "additive":
            drop = self.exact_drop + sum(self.deltas[layer][name] for layer, name in changed)
        else:
            # each layer keeps its share of the all-exact accuracy: drops compound, never past 0
            exact_accuracy = self.baseline - self.exact_drop
            accuracy = exact_accuracy
            for layer, name in changed:
                if exact_accuracy > 0:
                    accuracy *= max(exact_accuracy - self.deltas[layer][name], 0.0) / \
                        exact_accuracy
            drop = self.baseline - accuracy
        return float(min(drop, self.baseline))  # no assignment loses more than everything

    def cheapest_within(self, budget: float, layers, choices, cost_of) -> dict:
        """The assignment of least predicted cost whose predicted drop is within `budget`
        (a multiple-choice knapsack, solved exactly by dynamic programming over drops rounded to
        1e-4)."""
        step = 1e-4
        capacity = int(round(max(budget - self.exact_drop, 0.0) / step))
        # states: drop units used -> (cost, choices so far)
        states = {0: (0.0, [])}
        for layer in layers:
            nxt = {}
            for used, (cost, picked) in states.items():
                for name in choices:
                    delta = 0.0 if name == EXACT else self.deltas[layer][name]
                    units = used + max(int(np.ceil(delta / step - 1e-9)), 0)
                    if units > capacity:
                        continue
                    total = cost + cost_of(layer, name)
                    if units not in nxt or total < nxt[units][0]:
                        nxt[units] = (total, picked + [name])
            states = nxt
        best = min(states.values(), key=lambda item: item[0])
        return dict(zip(layers, best[1]))


# --------------------------------------------------------------------------------------------
# the study database
# --------------------------------------------------------------------------------------------

def model_fingerprint(model) -> str:
    """Architecture and weights of the model being explored."""
    digest = hashlib.sha256(json.dumps(model.get_config(), sort_keys=True, default=str).encode())
    for weight in model.get_weights():
        digest.update(np.ascontiguousarray(weight).tobytes())
    return digest.hexdigest()


def data_fingerprint(data) -> str:
    digest = hashlib.sha256(f"{len(data)}".encode())
    if data.x is not None:
        digest.update(np.ascontiguousarray(data.x).tobytes())
        digest.update(np.ascontiguousarray(data.y).tobytes())
    else:
        digest.update(str(data.source).encode())
    return digest.hexdigest()


class Study:
    """Every measurement of an exploration, kept in an optuna study (SQLite through optuna's own
    storage when a path is given, in memory otherwise): full evaluations as completed trials
    (params = the assignment, values = (drop, cost), user attributes = the metrics), estimates
    and fine-tuned accuracies as study attributes.  A study belongs to one model, one data set,
    one library and one set of settings (its fingerprint); another is refused."""

    def __init__(self, path, fingerprint: dict, layers: list, choices: list, sampler=None):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.optuna = optuna
        self.layers = layers
        self.choices = choices
        storage = None if path is None else f"sqlite:///{path}"
        try:
            self.study = optuna.create_study(
                study_name="graphswap-explore", storage=storage, load_if_exists=True,
                directions=["minimize", "minimize"], sampler=sampler)
        except Exception as exc:  # noqa: BLE001 - sqlalchemy/optuna raise many types
            raise GraphswapError(f"cannot open the study database {path}: {type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
        stored = self.study.user_attrs.get("fingerprint")
        if stored is None:
            self.study.set_user_attr("fingerprint", fingerprint)
        elif stored != fingerprint:
            differs = sorted(k for k in set(stored) | set(fingerprint)
                             if stored.get(k) != fingerprint.get(k))
            raise GraphswapError(
                f"the study {path} belongs to another exploration: its {', '.join(differs)} "
                f"differ(s) from this one's; use another --study file (or delete {path} to "
                f"start over)")
        self.distributions = {layer: optuna.distributions.CategoricalDistribution(choices)
                              for layer in layers}

    # -- full evaluations ---------------------------------------------------------------------
    def measured(self) -> dict:
        """{assignment key: metrics} of every completed evaluation."""
        found = {}
        for trial in self.study.get_trials(deepcopy=False,
                                           states=[self.optuna.trial.TrialState.COMPLETE]):
            if "accuracy" not in trial.user_attrs or trial.user_attrs.get("repeat"):
                continue
            key = tuple(trial.params[layer] for layer in self.layers)
            found[key] = dict(trial.user_attrs)
        return found

    def record(self, assignment: dict, metrics: dict, cost: float) -> None:
        trial = self.optuna.trial.create_trial(
            params=dict(assignment), distributions=self.distributions,
            values=[metrics["drop"], cost], user_attrs={**metrics, "cost": cost})
        self.study.add_trial(trial)

    # -- estimates and fine-tuning ------------------------------------------------------------
    def get(self, key: str):
        return self.study.user_attrs.get(key)

    def put(self, key: str, value) -> None:
        self.study.set_user_attr(key, value)
