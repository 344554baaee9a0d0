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
import math
import os
import sqlite3
from urllib.parse import quote as urllib_quote

import numpy as np

from graphswap.errors import GraphswapError
from graphswap.research.circuits import EXACT, CircuitLibrary
from graphswap.research.scoring import predict
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
    """Measures assignments of `library` circuits to `layers` of `model` on `data`, scored by
    `task` (graphswap.research.task.Task; "accuracy" holds its score - accuracy for classifiers,
    R^2 for regression - and "drop" the score lost against the model)."""

    def __init__(self, model, data, layers: list, library: CircuitLibrary, task,
                 batch_size: int, backward: str = "native", rewrite_options=None):
        self.model = model
        self.data = data
        self.layers = list(layers)
        self.library = library
        self.task = task
        self.batch_size = batch_size
        self.backward = backward
        self.rewrite_options = dict(rewrite_options or {})
        self.labels = data.labels()
        self.reference = predict(model, data, batch_size)
        self.baseline = task.evaluate(self.reference, self.labels, self.reference)
        self.baseline["accuracy"] = self.baseline["score"]
        self.evaluations = 0

    def kernel_map(self, assignment: dict) -> dict:
        return {layer: self.library.by_name(name).spec for layer, name in assignment.items()}

    def rewrite(self, assignment: dict):
        return rewrite_model(self.model, kernel=None, kernel_map=self.kernel_map(assignment),
                             backward=self.backward, **self.rewrite_options)

    def measure_model(self, model) -> dict:
        outputs = predict(model, self.data, self.batch_size)
        metrics = self.task.evaluate(outputs, self.labels, self.reference)
        return {"accuracy": metrics["score"], "loss": metrics.get("loss"),
                "agreement": metrics.get("agreement", metrics.get("max_abs_diff")),
                "drop": self.task.drop(self.baseline, metrics)}

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


#: the tables optuna's RDB storage creates (optuna 2.x - 4.x); a study file holds no others
OPTUNA_TABLES = frozenset({
    "alembic_version", "studies", "study_directions", "study_user_attributes",
    "study_system_attributes", "trials", "trial_params", "trial_values",
    "trial_intermediate_values", "trial_user_attributes", "trial_system_attributes",
    "trial_heartbeats", "version_info"})
STUDY_NAME = "graphswap-explore"


def check_study_file(path) -> None:
    """Refuse a --study file that is not a graphswap study, before optuna opens it (optuna adds
    its tables to any SQLite file): a missing or empty file is a new study; an existing one must be
    an SQLite database holding only optuna's tables and graphswap's study.  Read-only."""
    text = os.fspath(path)
    new_file = "give --study a new file name (graphswap creates it)"
    if os.path.isdir(text):
        raise GraphswapError(f"the study {text} is a directory; {new_file}")
    if not os.path.exists(text) or os.path.getsize(text) == 0:
        return
    try:
        with open(text, "rb") as handle:
            magic = handle.read(16)
    except OSError as exc:
        raise GraphswapError(f"cannot read the study {text}: {exc.strerror or exc}") from None
    if magic != b"SQLite format 3\x00":
        raise GraphswapError(f"the study {text} is not an SQLite database (a graphswap study is "
                             f"one); {new_file}, or delete {text} if it is not needed")
    try:
        uri = "file:" + urllib_quote(os.path.abspath(text)) + "?mode=ro"
        connection = sqlite3.connect(uri, uri=True)
        try:
            tables = {row[0] for row in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE "
                "'sqlite_%'")}
            studies = ({row[0] for row in connection.execute("SELECT study_name FROM studies")}
                       if "studies" in tables else set())
        finally:
            connection.close()
    except sqlite3.Error as exc:
        raise GraphswapError(f"the study {text} cannot be read as an SQLite database ({exc}); "
                             f"{new_file}") from None
    foreign = sorted(tables - OPTUNA_TABLES)
    if foreign:
        shown = ", ".join(foreign[:6]) + (", ..." if len(foreign) > 6 else "")
        raise GraphswapError(
            f"the study {text} is an SQLite database with tables of its own ({shown}), not a "
            f"graphswap study; graphswap would add optuna's tables to it. {new_file.capitalize()}")
    if tables and STUDY_NAME not in studies:
        shown = ", ".join(sorted(map(str, studies))[:6]) or "none"
        raise GraphswapError(
            f"the study {text} is an optuna database without graphswap's study "
            f"{STUDY_NAME!r} (its studies: {shown}); graphswap would add its study to it. "
            f"{new_file.capitalize()}")


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
        self.path = path
        self.layers = layers
        self.choices = choices
        if path is not None:
            check_study_file(path)  # never add optuna's tables to a file that is not a study
        storage = None if path is None else f"sqlite:///{path}"
        try:
            self.study = optuna.create_study(
                study_name=STUDY_NAME, storage=storage, load_if_exists=True,
                directions=["minimize", "minimize"], sampler=sampler)
        except Exception as exc:  # noqa: BLE001 - sqlalchemy/optuna raise many types
            raise GraphswapError(f"cannot open the study database {path}: {type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
        stored = self.study.user_attrs.get("fingerprint")
        if stored is not None and not (isinstance(stored, dict)
                                       and all(isinstance(k, str) for k in stored)):
            raise self._tampered("the study's fingerprint", stored, "an object of named parts")
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
            where = f"trial {trial.number}"
            for layer in self.layers:
                if trial.params.get(layer) not in self.choices:
                    raise self._tampered(f"{where}'s circuit for layer {layer!r}",
                                         trial.params.get(layer),
                                         f"one of {', '.join(map(str, self.choices))}")
            key = tuple(trial.params[layer] for layer in self.layers)
            metrics = dict(trial.user_attrs)
            self._check_metrics(metrics, where, ("cost",))
            found[key] = metrics
        return found

    def record(self, assignment: dict, metrics: dict, cost: float) -> None:
        trial = self.optuna.trial.create_trial(
            params=dict(assignment), distributions=self.distributions,
            values=[metrics["drop"], cost], user_attrs={**metrics, "cost": cost})
        self.study.add_trial(trial)

    # -- estimates and fine-tuning ------------------------------------------------------------
    def get(self, key: str):
        """A stored estimate or fine-tuned measurement, checked to be what graphswap writes
        (`put`): "estimates" {layer: {circuit: accuracy}}, "estimate_all_exact" an accuracy,
        "finetuned:..." the metrics of a measurement."""
        value = self.study.user_attrs.get(key)
        if value is None:
            return None
        if key == "estimate_all_exact":
            self._check_number(value, -math.inf, 1.0, "the stored all-exact estimate")
        elif key == "estimates":
            if not isinstance(value, dict):
                raise self._tampered("the stored estimates", value,
                                     "an object {layer: {circuit: accuracy}}")
            for layer, row in value.items():
                if layer not in self.layers or not isinstance(row, dict):
                    raise self._tampered("the stored estimates", {layer: row},
                                         f"rows for the layers {', '.join(self.layers)}, each "
                                         f"an object {{circuit: accuracy}}")
                for name, accuracy in row.items():
                    if name not in self.choices:
                        raise self._tampered(f"the estimate of layer {layer!r}", name,
                                             f"one of {', '.join(map(str, self.choices))}")
                    self._check_number(accuracy, -math.inf, 1.0,
                                       f"the estimate of layer {layer!r} on {name}")
        elif key.startswith("finetuned:"):
            if not isinstance(value, dict):
                raise self._tampered(f"the stored {key!r}", value, "an object of metrics")
            self._check_metrics(value, f"the stored {key!r}")
        return value

    # -- checks of what the database holds ----------------------------------------------------
    def _tampered(self, what, value, allowed):
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        return GraphswapError(
            f"the study {self.path} holds a value graphswap did not write: {what} is {shown}; "
            f"expected {allowed}. The file was edited or written by another program: delete it "
            f"(or use another --study file) to measure again")

    def _check_number(self, value, low, high, what, finite=True, optional=False):
        if optional and value is None:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                (finite and not math.isfinite(value)) or \
                (math.isfinite(value) and not low <= value <= high):
            allowed = (f"a number in [{low:g}, {high:g}]" if math.isfinite(low) else
                       f"a number up to {high:g}" if math.isfinite(high) else "a number")
            raise self._tampered(what, value, allowed + (" or null" if optional else ""))

    def _check_metrics(self, metrics: dict, where: str, extra=()):
        # "accuracy" is the task's score: an accuracy, or R^2 for regression (at most 1)
        self._check_number(metrics.get("accuracy"), -math.inf, 1.0, f"{where}'s accuracy")
        self._check_number(metrics.get("drop"), -math.inf, math.inf, f"{where}'s drop")
        # a loss or an output difference may be NaN/inf for a broken model, or absent
        for name in ("loss", "agreement"):
            self._check_number(metrics.get(name), -math.inf, math.inf, f"{where}'s {name}",
                               finite=False, optional=True)
        for name in extra:
            self._check_number(metrics.get(name), 0.0, math.inf, f"{where}'s {name}")

    def put(self, key: str, value) -> None:
        self.study.set_user_attr(key, value)
