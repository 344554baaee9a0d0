"""What an exploration measured: every assignment, the measured Pareto front, the references,
the error model's quality; as a table, a JSON front of kernel maps, and a plot."""

from __future__ import annotations

import dataclasses
import json

from graphswap.io import atomic_output
from graphswap.research.circuits import EXACT, UNITS, CircuitLibrary
from graphswap.tables import format_table

EXPLORE_SCHEMA = "graphswap.explore/1"


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

    def format_table(self) -> str:
        unit = f"relative {self.objective}"
        headers = ["#", "accuracy", "drop", "predicted", unit, "assignment"]
        if any("finetuned_accuracy" in p for p in self.front):
            headers.insert(3, "fine-tuned")
        rows, markers = [], []
        best = self.best
        for index, point in enumerate(self.front):
            row = [str(index), f"{point['accuracy']:.2%}", f"{point['accuracy_drop'] * 100:+.2f}",
                   f"{point['predicted_drop'] * 100:+.2f}", f"{point['relative_cost']:.3f}",
                   _describe(point["assignment"])]
            if "fine-tuned" in headers:
                tuned = point.get("finetuned_accuracy")
                row.insert(3, f"{tuned:.2%}" if tuned is not None else "-")
            rows.append(row)
            markers.append("  <- best within budget" if best is point else "")
        lines = format_table(headers, rows, markers)
        exact = self.references["all exact"]
        lines.append(f"float model {self.baseline['accuracy']:.2%}; all-exact 8-bit "
                     f"{exact['accuracy']:.2%}; budget {self.budget * 100:.2f} points; "
                     f"{len(self.front)} front points of {len(self.points)} measured "
                     f"assignments ({self.counts['space']:,} possible)")
        quality = self.prediction
        if quality.get("points"):
            lines.append(f"error model: mean |predicted - measured drop| "
                         f"{quality['mean_abs_error'] * 100:.2f} points over {quality['points']} "
                         f"measured assignments (rank correlation {quality['rank_correlation']:.2f})")
        return "\n".join(lines)

    def plot(self, path, force: bool = False) -> None:
        """Accuracy against relative cost: every measured point, the front, the all-exact and
        single-circuit references and the budget."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axes = plt.subplots(figsize=(7.5, 5.0), dpi=110)
        axes.scatter([p["relative_cost"] for p in self.points],
                     [p["accuracy"] * 100 for p in self.points], s=10, color="0.75",
                     label="measured assignments")
        front = sorted(self.front, key=lambda p: p["relative_cost"])
        axes.plot([p["relative_cost"] for p in front], [p["accuracy"] * 100 for p in front],
                  "o-", color="tab:blue", label="Pareto front (measured)")
        exact = self.references["all exact"]
        axes.scatter([exact["relative_cost"]], [exact["accuracy"] * 100], marker="*", s=160,
                     color="black", zorder=5, label="all exact (8-bit)")
        singles = [(name, p) for name, p in self.references.items() if name != "all exact"]
        axes.scatter([p["relative_cost"] for _, p in singles],
                     [p["accuracy"] * 100 for _, p in singles], marker="^", color="tab:orange",
                     zorder=4, label="one circuit everywhere")
        for name, point in singles:
            axes.annotate(name, (point["relative_cost"], point["accuracy"] * 100), fontsize=7,
                          xytext=(3, 3), textcoords="offset points")
        axes.axhline((self.baseline["accuracy"] - self.budget) * 100, color="tab:red",
                     linestyle="--", linewidth=1, label=f"budget ({self.budget * 100:.2g} points)")
        axes.set_xlabel(f"relative {self.objective} of the multipliers (all exact = 1)")
        axes.set_ylabel("accuracy (%)")
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
