"""The design space of a model and a circuit library: assignments (which circuit runs each
layer), their cost, their measured accuracy, the per-(layer, circuit) estimates and the error model
that predicts an assignment's accuracy drop from them (the study database that keeps every
measurement: graphswap.research.exploration.study_database).

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
import inspect
import itertools
import time

import numpy as np

from graphswap.research.exploration.circuits import EXACT, CircuitLibrary
from graphswap.research.data.scoring import predict
from graphswap.research.exploration.study_database import (  # noqa: F401 - the study, as before
    DEFAULT_CLAIM_TIMEOUT, Study, check_study_file, data_fingerprint, model_fingerprint,
    study_storage)
from graphswap.swap import DEFAULT_CALIBRATION_SOURCE, rewrite_model
from graphswap.swap.calibration import quantizing_layers
from graphswap.kernels import resolve_multiplier
from graphswap.swap.recipe import (DEFAULT_RECIPE, fallback_wanted, has_batchnorm, operands_default,
                                   recipe_defaults)


def assignment_key(assignment: dict, layers: list) -> tuple:
    """An assignment as a hashable tuple, in layer order."""
    return tuple(assignment[layer] for layer in layers)


def relative_cost(assignment: dict, macs: dict, library: CircuitLibrary, objective: str) -> float:
    total = sum(macs[layer] * library.exact.metric(objective) for layer in assignment)
    spent = sum(macs[layer] * library.by_name(name).metric(objective)
                for layer, name in assignment.items())
    return spent / total


#: rewrite_model's options that calibrate the model on data (rewrite_model's zero-training steps)
CALIBRATION_OPTIONS = ("calibration_data", "calibration_samples", "calibration_method",
                       "calibration_source", "bias_correction", "recalibrate_bn",
                       "weight_tuning", "operands", "dynamic_fallback")


class Evaluator:
    """Measures assignments of `library` circuits to `layers` of `model` on `data`, scored by
    `task` (graphswap.research.data.task.Task; "accuracy" holds its score - accuracy for
    classifiers, R^2 for regression - and "drop" the score lost against the model).

    Each assignment's model is the one rewrite_model builds with `rewrite_options` (what
    `graphswap convert --kernel-map` builds with the same options).  When calibration sets only
    the activation ranges, from the float forward (`_reusable`), they do not depend on the
    assignment: they are calibrated once, on the all-exact model, and set on each assignment's
    model (`reuse_calibration`).  Steps that observe the approximate forward (bias correction,
    BatchNorm re-estimation) depend on every layer before them, so with them each assignment's
    model is calibrated by rewrite_model itself."""

    def __init__(self, model, data, layers: list, library: CircuitLibrary, task,
                 batch_size: int, backward: str = "native", rewrite_options=None,
                 reuse_calibration: bool = True):
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
        self.calibration_seconds = 0.0     # time spent calibrating/compensating, all rewrites
        self.reuses_calibration = reuse_calibration and _reusable(self.rewrite_options, model,
                                                                  library)
        self._ranges = None                # {layer path: (scheme, intermediate ranges)}

    def kernel_map(self, assignment: dict) -> dict:
        return {layer: self.library.by_name(name).spec for layer, name in assignment.items()}

    def rewrite(self, assignment: dict):
        options = self.rewrite_options
        kernel_map = self.kernel_map(assignment)
        if not self.reuses_calibration:
            started = time.perf_counter()
            model = rewrite_model(self.model, kernel=None, kernel_map=kernel_map,
                                  backward=self.backward, **options)
            if options.get("calibration_data") is not None:
                self.calibration_seconds += time.perf_counter() - started
            return model
        plain = {k: v for k, v in options.items() if k not in CALIBRATION_OPTIONS}
        model = rewrite_model(self.model, kernel=None, kernel_map=kernel_map,
                              backward=self.backward, **plain)
        started = time.perf_counter()
        if self._ranges is None:
            calibrated = rewrite_model(
                self.model, kernel=None, kernel_map=self.kernel_map(all_exact(self.layers)),
                backward=self.backward, **options)
            self._ranges = {path: (layer.quantization, layer.intermediate_ranges())
                            for path, layer in quantizing_layers(calibrated)}
        for path, layer in quantizing_layers(model):
            scheme, intermediate = self._ranges[path]
            layer.set_quantization(scheme)
            for point, value in intermediate.items():
                if value is not None:
                    layer.set_intermediate_range(point, *value)
        self.calibration_seconds += time.perf_counter() - started
        return model

    def measure_model(self, model) -> dict:
        outputs = predict(model, self.data, self.batch_size)
        metrics = self.task.evaluate(outputs, self.labels, self.reference)
        return {"accuracy": metrics["score"], "loss": metrics.get("loss"),
                "agreement": metrics.get("agreement", metrics.get("max_abs_diff")),
                "drop": self.task.drop(self.baseline, metrics)}

    def measure(self, assignment: dict) -> dict:
        self.evaluations += 1
        return self.measure_model(self.rewrite(assignment))


#: rewrite_model's parameters when the reuse below was written: a newer step (a parameter not
#: here) may depend on the assignment, so its presence turns the reuse off
KNOWN_REWRITE_PARAMETERS = frozenset({
    "model", "kernel", "include", "exclude", "kernel_map", "layer_types", "backward",
    "return_report", "inplace", "quantization", "calibration_data", "calibration_samples",
    "calibration_method", "calibration_source", "bias_correction", "recalibrate_bn",
    "fold_batchnorm", "weight_tuning", "operands", "dynamic_fallback"})


def _reusable(options: dict, model, library=None) -> bool:
    """Whether the calibrated model of every assignment is the all-exact one's ranges set on
    it: static ranges from the float forward (the float calibration source), activations
    created dynamic before calibration (every preset; a dict unless it asks for static ones),
    and no step after the ranges that depends on the layers' multipliers (bias correction, weight
    tuning, BatchNorm re-estimation, or any step rewrite_model gained since)."""
    if options.get("calibration_data") is None:
        return False
    if set(inspect.signature(rewrite_model).parameters) - KNOWN_REWRITE_PARAMETERS:
        return False
    if options.get("calibration_source", DEFAULT_CALIBRATION_SOURCE) != "float":
        return False
    # convert's defaults resolved as rewrite_model resolves them (graphswap.swap.recipe)
    bias_correction, weight_tuning, recalibrate_bn = recipe_defaults(
        options.get("bias_correction", DEFAULT_RECIPE),
        options.get("weight_tuning", DEFAULT_RECIPE), True,
        options.get("recalibrate_bn", DEFAULT_RECIPE), has_batchnorm(model))
    if bias_correction is not None or weight_tuning or recalibrate_bn:
        return False
    # the check against the dynamic conversion depends on each assignment's multipliers
    if fallback_wanted(options.get("dynamic_fallback", DEFAULT_RECIPE),
                       options.get("quantization"), False):
        return False
    # the measured operand wiring depends on each multiplier, unless every table is symmetric
    if operands_default(options.get("operands", DEFAULT_RECIPE), True) == "auto" and (
            library is None or not all(_symmetric(c.spec) for c in library.circuits)):
        return False
    quantization = options.get("quantization")
    return quantization is None or isinstance(quantization, str) or (
        isinstance(quantization, dict) and quantization.get("activations") in (None, "dynamic"))


def _symmetric(spec) -> bool:
    multiplier = resolve_multiplier(spec)
    if multiplier is None:    # an FP8 or float circuit: no table to wire either way
        return True
    table = np.asarray(multiplier.table).reshape(256, 256)
    return bool(np.array_equal(table, table.T))


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
