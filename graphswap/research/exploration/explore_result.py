"""What an exploration measured: every assignment, the measured Pareto front, the references,
the error model's quality; as a table, a JSON front of kernel maps, and a plot."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import numpy as np

from graphswap.io import atomic_output
from graphswap.research.exploration.circuits import EXACT, UNITS, CircuitLibrary
from graphswap.swap import (DEFAULT_CALIBRATION_METHOD, DEFAULT_CALIBRATION_SAMPLES,
                            DEFAULT_CALIBRATION_SOURCE)
from graphswap.tables import format_table

EXPLORE_SCHEMA = "graphswap.explore/1"
#: scores shown in percent (points); others (mse, mae, psnr, ...) in their own units
PERCENT_SCORES = ("accuracy", "top5_accuracy", "agreement", "r2")


@dataclasses.dataclass
class ExploreResult:
    """What an exploration measured; `front` holds the measured Pareto-optimal points."""

    model_name: str
    data_source: str
    examples: int
    objective: str
    budget: float
    baseline: dict                 # the float model's metrics
    layers: list                   # [{"layer", "macs"}]
    library: CircuitLibrary
    points: list                   # every measured assignment (dicts, see _point)
    front: list                    # the non-dominated points, cheapest first
    references: dict               # {"all exact": point, circuit name: uniform point}
    estimates: dict                # {layer: {circuit: accuracy on the subset}}
    prediction: dict               # how well the error model predicted the measured drops
    counts: dict                   # evaluations this run, stored, exhaustive space size
    notes: list
    # the score the points' "accuracy" holds (graphswap.research.data.task): accuracy, r2, mse, ...;
    # "accuracy_drop" is how much worse it is than the float model's (an increase for mse)
    score_metric: str = "accuracy"
    higher_is_better: bool = True
    rewrite_options: dict = dataclasses.field(default_factory=dict)  # as the front file says
    convert_options: list = dataclasses.field(default_factory=list)  # convert's flags for them

    @property
    def within_budget(self) -> list:
        return [p for p in self.front if p["accuracy_drop"] <= self.budget + 1e-12]

    @property
    def best(self) -> dict | None:
        """The cheapest measured assignment within the budget."""
        within = self.within_budget
        return min(within, key=lambda p: (p["relative_cost"], p["accuracy_drop"])) \
            if within else None

    def kernel_maps(self) -> list:
        return [p["kernel_map"] for p in self.front]

    def to_dict(self) -> dict:
        return {"schema": EXPLORE_SCHEMA, "model": self.model_name, "data": self.data_source,
                "examples": self.examples, "objective": self.objective,
                "unit": UNITS[self.objective], "budget": self.budget,
                "score": self.score_metric, "higher_is_better": self.higher_is_better,
                "rewrite_options": self.rewrite_options,
                "convert_command": ["graphswap", "convert", "MODEL", "--kernel-map",
                                    "FRONT#INDEX", *self.convert_options],
                "baseline_accuracy": self.baseline["accuracy"], "layers": self.layers,
                "library": [{"name": c.name, "spec": c.spec, **{k: v for k, v in
                                                                c.metrics.items()}}
                            for c in [self.library.exact, *self.library.circuits]],
                "skipped_circuits": [{"source": s, "reason": r} for s, r in self.library.skipped],
                "front": self.front, "best": self.best, "references": self.references,
                "error_model": self.prediction, "evaluations": self.counts,
                "notes": self.notes}

    def write(self, path, force: bool = False) -> None:
        """The front as JSON: `front` is a list whose every `kernel_map` is accepted by
        `graphswap convert --kernel-map PATH#INDEX`."""
        with atomic_output(path, force) as tmp:
            tmp.write_text(json.dumps(self.to_dict(), indent=2), encoding="utf-8")

    def _shown(self, value: float, signed: bool = False) -> str:
        """A score (or, signed, a difference) in the metric's own form."""
        if self.score_metric in PERCENT_SCORES:
            return f"{value * 100:+.2f}" if signed else f"{value:.2%}"
        return f"{value:+.4g}" if signed else f"{value:.4g}"

    def format_table(self) -> str:
        unit = f"relative {self.objective}"
        metric = self.score_metric
        headers = ["#", metric, "drop" if self.higher_is_better else "increase", "predicted",
                   unit, "assignment"]
        if any("finetuned_accuracy" in p for p in self.front):
            headers.insert(3, "fine-tuned")
        rows, markers = [], []
        best = self.best
        for index, point in enumerate(self.front):
            row = [str(index), self._shown(point["accuracy"]),
                   self._shown(point["accuracy_drop"], True),
                   self._shown(point["predicted_drop"], True), f"{point['relative_cost']:.3f}",
                   _describe(point["assignment"])]
            if "fine-tuned" in headers:
                tuned = point.get("finetuned_accuracy")
                row.insert(3, self._shown(tuned) if tuned is not None else "-")
            rows.append(row)
            markers.append("  <- best within budget" if best is point else "")
        lines = format_table(headers, rows, markers)
        exact = self.references["all exact"]
        budget = (f"{self.budget * 100:.2f} points" if metric in PERCENT_SCORES
                  else f"{metric} +{self.budget:.4g}")
        lines.append(f"float model {metric} {self._shown(self.baseline['accuracy'])}; all-exact "
                     f"8-bit {self._shown(exact['accuracy'])}; budget {budget}; "
                     f"{len(self.front)} front points of {len(self.points)} measured "
                     f"assignments ({self.counts['space']:,} possible)")
        quality = self.prediction
        if quality.get("points"):
            error = (f"{quality['mean_abs_error'] * 100:.2f} points" if metric in PERCENT_SCORES
                     else f"{quality['mean_abs_error']:.4g}")
            lines.append(f"error model: mean |predicted - measured drop| {error} over "
                         f"{quality['points']} measured assignments (rank correlation "
                         f"{quality['rank_correlation']:.2f})")
        return "\n".join(lines)

    def plot(self, path, force: bool = False) -> None:
        """Accuracy against relative cost: every measured point, the front, the all-exact and
        single-circuit references and the budget."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        factor = 100.0 if self.score_metric in PERCENT_SCORES else 1.0
        figure, axes = plt.subplots(figsize=(7.5, 5.0), dpi=110)
        axes.scatter([p["relative_cost"] for p in self.points],
                     [p["accuracy"] * factor for p in self.points], s=10, color="0.75",
                     label="measured assignments")
        front = sorted(self.front, key=lambda p: p["relative_cost"])
        axes.plot([p["relative_cost"] for p in front], [p["accuracy"] * factor for p in front],
                  "o-", color="tab:blue", label="Pareto front (measured)")
        exact = self.references["all exact"]
        axes.scatter([exact["relative_cost"]], [exact["accuracy"] * factor], marker="*", s=160,
                     color="black", zorder=5, label="all exact (8-bit)")
        singles = [(name, p) for name, p in self.references.items() if name != "all exact"]
        axes.scatter([p["relative_cost"] for _, p in singles],
                     [p["accuracy"] * factor for _, p in singles], marker="^", color="tab:orange",
                     zorder=4, label="one circuit everywhere")
        for name, point in singles:
            axes.annotate(name, (point["relative_cost"], point["accuracy"] * factor), fontsize=7,
                          xytext=(3, 3), textcoords="offset points")
        sign = 1.0 if self.higher_is_better else -1.0
        axes.axhline((self.baseline["accuracy"] - sign * self.budget) * factor, color="tab:red",
                     linestyle="--", linewidth=1, label=f"budget ({self.budget * factor:.2g}"
                                                        f"{' points' if factor == 100 else ''})")
        axes.set_xlabel(f"relative {self.objective} of the multipliers (all exact = 1)")
        axes.set_ylabel(f"{self.score_metric}{' (%)' if factor == 100 else ''}")
        axes.set_title(f"{self.model_name}: {len(self.library.circuits)} circuits, "
                       f"{len(self.layers)} layers")
        axes.legend(fontsize=8, loc="lower right")
        axes.grid(alpha=0.3)
        figure.tight_layout()
        with atomic_output(path, force, suffix=".png") as tmp:
            figure.savefig(tmp, format="png")
        plt.close(figure)


def _describe(assignment: dict) -> str:
    """'conv1=drum4 fc1=drum4' for the approximate layers; 'all exact' otherwise."""
    parts = [f"{layer.split('/')[-1]}={name}" for layer, name in assignment.items()
             if name != EXACT]
    return " ".join(parts) if parts else "all exact"


def pareto_front(points: list) -> list:
    """Points not dominated in (accuracy drop, relative cost), cheapest first."""
    ordered = sorted(points, key=lambda p: (p["relative_cost"], p["accuracy_drop"]))
    front, best_drop = [], float("inf")
    for point in ordered:
        if point["accuracy_drop"] < best_drop - 1e-12:
            front.append(point)
            best_drop = point["accuracy_drop"]
    return front


def describe_rewrite(requested, prepared) -> dict:
    """The rewrite options as the front file records them ("options": JSON; "convert": the
    `graphswap convert` flags that build the same models; "fingerprint": what the study compares,
    None for the default so that older studies stay valid)."""
    requested = dict(requested or {})
    source = requested.get("calibration_data")
    calibrated = prepared.get("calibration_data") is not None
    options, convert = {}, []
    quantization = prepared.get("quantization")
    if isinstance(quantization, str) and quantization != "default":
        options["quantization"] = quantization
        convert += ["--quantization", quantization]
    elif isinstance(quantization, dict):
        defaults = {"weights": None, "granularity": "per_channel", "observer": "fixed",
                    "momentum": 0.99}
        changed = {k: v for k, v in quantization.items() if defaults.get(k, object()) != v}
        if changed:
            options["quantization"] = changed
        for key, flag in (("weights", "--weights"), ("granularity", "--weight-granularity"),
                          ("observer", "--observer")):
            if key in changed and changed[key] is not None:
                convert += [flag, str(changed[key]).replace("_", "-")]
        if "momentum" in changed:
            convert += ["--observer-momentum", f"{changed['momentum']:g}"]
    if prepared.get("fold_batchnorm"):
        options["fold_batchnorm"] = True
        convert.append("--fold-batchnorm")
    fingerprint = dict(options) if options else None
    if calibrated:
        shown = os.fspath(source) if isinstance(source, (str, os.PathLike)) else \
            "arrays"
        samples = prepared.get("calibration_samples", DEFAULT_CALIBRATION_SAMPLES)
        calibration = {"calibrate": shown, "calibration_samples": samples,
                       "calibration_method": prepared.get("calibration_method",
                                                          DEFAULT_CALIBRATION_METHOD),
                       "calibration_source": prepared.get("calibration_source",
                                                          DEFAULT_CALIBRATION_SOURCE),
                       "bias_correction": prepared.get("bias_correction"),
                       "recalibrate_bn": bool(prepared.get("recalibrate_bn"))}
        options.update(calibration)
        convert += ["--calibrate", shown, "--calibration-samples", str(samples),
                    "--calibration-method", calibration["calibration_method"],
                    "--calibration-source", calibration["calibration_source"]]
        # convert compensates by default with --calibrate: say "none" when it was left out
        convert += ["--bias-correction", calibration["bias_correction"] or "none"]
        if calibration["recalibrate_bn"]:
            convert.append("--recalibrate-bn")
        elif requested.get("recalibrate_bn") is False:   # convert's default re-estimates BN
            convert.append("--no-recalibrate-bn")
        tuning = prepared.get("weight_tuning")
        if tuning is True or tuning is False:
            options["weight_tuning"] = tuning
            convert.append("--weight-tuning" if tuning else "--no-weight-tuning")
        else:     # convert's default: measured with and without (graphswap.swap.fallback)
            options["weight_tuning"] = "measured"
        if prepared.get("operands") not in (None, "default"):
            options["operands"] = prepared["operands"]
            convert += ["--operands", prepared["operands"].replace("_", "-")]
        if prepared.get("dynamic_fallback") is False:
            options["dynamic_fallback"] = False
            convert.append("--no-dynamic-fallback")
        data = prepared["calibration_data"]
        digest = hashlib.sha256()
        for array in (data if isinstance(data, (list, tuple)) else [data]):
            digest.update(np.ascontiguousarray(np.asarray(array, dtype=np.float32)).tobytes())
        digest = digest.hexdigest()
        fingerprint = {**options, "calibrate": digest}
    return {"options": options, "convert": convert, "fingerprint": fingerprint}
