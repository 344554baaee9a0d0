"""Per-layer sensitivity sweep: where does an approximate multiplier cost accuracy, and how much
multiply energy does it save there?

`sweep` swaps one layer at a time (every type rewrite_model swaps: Dense, Conv2D, depthwise,
separable, 1-D, transposed, einsum, attention) to the given kernel (the rest stay the original
float layers) and measures accuracy, its drop from the original, and agreement with the original's
predictions, next to each layer's multiply-accumulates per sample.  It then builds cumulative
assignments greedily - least harmful layers first - and evaluates each, which traces the
accuracy/energy trade-off; the Pareto-optimal points are marked, and the cheapest assignment whose
drop stays within `max_accuracy_drop` is written as a kernel map that `graphswap convert
--kernel-map` accepts.

Energy model (multiplies only, as in EvoApproxLib's figures): a layer's multiplies cost its MACs x
the power of its multiplier, so

    relative multiply energy = sum over layers of MACs_l x P(kernel_l) / (total MACs x P_exact)

with P from the kernel's hardware metrics (EvoApproxLib's `// PDK45_PWR = ... mW` header line) or
the user's `power`, and P_exact the exact 8-bit multiplier's power: EvoApproxLib's mul8u_1JFF
(exact 8x8 unsigned, PDK45_PWR = 0.391 mW) or, for signed kernels, mul8s_1KV6 (exact 8x8 signed,
PDK45_PWR = 0.425 mW); overridable with `reference_power`.

The sweep compares the score of the model's task (graphswap.research.data.task: accuracy for
classifiers, R^2 for regression and reconstruction, or the first --metrics name); classifiers'
results keep their accuracy fields.  The module is longer than 450 lines because the result's
table, kernel map and Pareto plot sit with the sweep that fills them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re

import numpy as np

from graphswap.errors import GraphswapError
from graphswap.io import atomic_output, load_model
from graphswap.kernels import resolve_kernel
from graphswap.research.data.loading import load_data
from graphswap.research.training.recovery import prepared_rewrite_options
from graphswap.research.data.scoring import predict
from graphswap.research.data.task import derive_task
from graphswap.swap import plan, rewrite_model
from graphswap.tables import format_table

SWEEP_SCHEMA = "graphswap.sweep/1"

#: PDK45_PWR (mW) of EvoApproxLib's exact 8x8 multipliers, from the header comments of
#: ehw-fit/evoapproxlib multiplers/8x8_unsigned/pareto_pwr_mse/mul8u_1JFF.c (unsigned) and
#: multiplers/8x8_signed/pareto_pwr_wce/mul8s_1KV6.c (signed)
EXACT_POWER_UNSIGNED_MW = 0.391
EXACT_POWER_SIGNED_MW = 0.425
POWER_METRIC = "PDK45_PWR"


# --------------------------------------------------------------------------------------------
# power
# --------------------------------------------------------------------------------------------

def _as_power(value, what: str) -> float:
    if isinstance(value, str):
        match = re.match(r"^\s*([0-9.eE+-]+)\s*(mW)?\s*$", value)
        if not match:
            raise GraphswapError(f"{what}: expected a power in mW such as 0.25, got {value!r}")
        value = match.group(1)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise GraphswapError(f"{what}: expected a power in mW such as 0.25, got {value!r}") \
            from None
    if not np.isfinite(number) or number < 0:
        raise GraphswapError(f"{what}: power must be a finite number >= 0 (mW), got {value!r}")
    return number


def parse_power_options(values) -> dict:
    """CLI `--power SPEC=VALUE` (or a bare VALUE for the swept kernel, key None) -> dict."""
    result = {}
    for item in values or ():
        if "=" in item:
            spec, _, value = item.rpartition("=")
            result[spec.strip()] = _as_power(value, f"--power {item}")
        else:
            result[None] = _as_power(item, f"--power {item}")
    return result


def kernel_is_signed(kernel) -> bool | None:
    """Whether a multiplier kernel multiplies signed operands (None: not an 8-bit multiplier)."""
    for holder in (kernel, getattr(kernel, "multiplier", None)):
        signed = getattr(holder, "signed", None)
        if isinstance(signed, bool):
            return signed
    name = os.path.basename(str(getattr(kernel, "spec", "")))
    if re.match(r"^mul\d+s", name):
        return True
    if re.match(r"^mul\d+u", name):
        return False
    return None


def kernel_power(kernel, user_power: dict | None = None) -> tuple[float | None, str]:
    """(power in mW or None, where it came from) for a resolved kernel."""
    user_power = user_power or {}
    for key in (kernel.spec, os.path.basename(kernel.spec), None):
        if key in user_power:
            return user_power[key], "--power"
    for key, value in user_power.items():
        if key is not None and os.path.abspath(key) == os.path.abspath(kernel.spec):
            return value, "--power"
    metrics = kernel.hardware_metrics or {}
    if POWER_METRIC in metrics and metrics[POWER_METRIC] is not None:
        return _as_power(metrics[POWER_METRIC], f"{kernel.spec} {POWER_METRIC}"), \
            f"{POWER_METRIC} in the kernel's source"
    return None, ""


def reference_power_for(kernel, reference_power=None) -> tuple[float, str]:
    if reference_power is not None:
        return _as_power(reference_power, "reference power"), "--reference-power"
    if kernel_is_signed(kernel):
        return EXACT_POWER_SIGNED_MW, "EvoApproxLib mul8s_1KV6 (exact 8x8 signed), PDK45"
    return EXACT_POWER_UNSIGNED_MW, "EvoApproxLib mul8u_1JFF (exact 8x8 unsigned), PDK45"


def relative_energy(layer_macs: dict, approximate: set, power: float | None,
                    reference: float) -> float | None:
    """sum MACs_l x P_l / (total MACs x P_exact): approximate layers at `power`, others exact."""
    if power is None:
        return None
    total = sum(layer_macs.values())
    if total == 0:
        return None
    energy = sum(macs * (power if path in approximate else reference)
                 for path, macs in layer_macs.items())
    return energy / (total * reference)


# --------------------------------------------------------------------------------------------
# sweep
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class SweepResult:
    model_name: str
    kernel: str
    data_source: str
    examples: int
    baseline: dict                 # metrics of the original model
    layers: list                   # one dict per swappable layer (single-layer swap)
    configurations: list           # evaluated assignments (baseline, greedy steps, all)
    recommended: dict              # the configuration written as kernel map
    max_accuracy_drop: float
    power: float | None
    power_source: str
    reference_power: float
    reference_source: str
    notes: list = dataclasses.field(default_factory=list)
    score_name: str = "accuracy"   # what "score" holds (graphswap.research.data.task); drops are
    #                                in the worse direction of that metric
    higher_is_better: bool = True

    def _score_text(self, value) -> str:
        if value is None:
            return ""
        if self.score_name in ("accuracy", "top5_accuracy", "agreement"):
            return f"{100 * value:.2f}%"
        return f"{value:.4g}"

    def _drop_text(self, value) -> str:
        if self.score_name in ("accuracy", "top5_accuracy", "agreement"):
            return f"{100 * value:.2f}"
        return f"{value:.4g}"

    @property
    def energy_available(self) -> bool:
        return self.power is not None

    def kernel_map(self, configuration: dict | None = None) -> dict:
        configuration = configuration or self.recommended
        chosen = set(configuration["layers"])
        return {entry["layer"]: (self.kernel if entry["layer"] in chosen else None)
                for entry in self.layers}

    def kernel_map_document(self) -> dict:
        """What `convert --kernel-map` reads (extra keys are ignored there)."""
        rec = self.recommended
        return {"kernel_map": self.kernel_map(), "kernel": self.kernel,
                "model": self.model_name, "max_accuracy_drop": self.max_accuracy_drop,
                "baseline_accuracy": self.baseline.get("accuracy"),
                "accuracy": rec["accuracy"], "score": self.score_name,
                "baseline_score": self.baseline["score"], "score_value": rec["score"],
                "relative_energy": rec["relative_energy"],
                "swapped_mac_share": rec["swapped_mac_share"],
                "generated_by": "graphswap sweep"}

    def to_dict(self) -> dict:
        return {"schema": SWEEP_SCHEMA, "model": self.model_name, "kernel": self.kernel,
                "data": {"source": self.data_source, "examples": self.examples},
                "score": self.score_name, "baseline": self.baseline, "layers": self.layers,
                "configurations": self.configurations, "recommended": self.recommended,
                "kernel_map": self.kernel_map(), "max_accuracy_drop": self.max_accuracy_drop,
                "energy": {"power_mw": self.power, "power_source": self.power_source,
                           "reference_power_mw": self.reference_power,
                           "reference_source": self.reference_source},
                "notes": self.notes}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def format_table(self) -> str:
        percent = self.score_name in ("accuracy", "top5_accuracy", "agreement")
        classifier = self.baseline.get("agreement") is not None
        headers = ["layer", "type", "MACs/sample", "MAC share", self.score_name,
                   "drop (pt)" if percent else "drop",
                   "agreement" if classifier else "max |diff|", "rel. energy"]
        rows = []
        for entry in self.layers:
            rows.append([entry["layer"], entry["type"], f"{entry['macs']:,}",
                         f"{100 * entry['mac_share']:.1f}%", self._score_text(entry["score"]),
                         self._drop_text(entry["score_drop"]),
                         f"{100 * entry['agreement']:.2f}%" if classifier
                         else f"{entry.get('max_abs_diff') or 0:.4g}",
                         "" if entry["relative_energy"] is None
                         else f"{entry['relative_energy']:.3f}"])
        lines = [f"kernel {self.kernel}: one layer at a time (others original); original "
                 f"{self.score_name} {self._score_text(self.baseline['score'])} on "
                 f"{self.examples} examples",
                 *format_table(headers, rows)]
        lines.append("")
        lines.append("cumulative assignments (least harmful layers first):")
        for config in self.configurations:
            energy = ("" if config["relative_energy"] is None
                      else f", rel. energy {config['relative_energy']:.3f}")
            flag = " [pareto]" if config["pareto"] else ""
            chosen = " <- kernel map" if config["name"] == self.recommended["name"] else ""
            lines.append(f"  {config['name']:<22} {self.score_name} "
                         f"{self._score_text(config['score'])} "
                         f"(drop {self._drop_text(config['score_drop'])}), "
                         f"{100 * config['swapped_mac_share']:.1f}% of MACs approximate"
                         f"{energy}{flag}{chosen}")
        if self.energy_available:
            lines.append(f"energy: multiplier {self.power:g} mW ({self.power_source}), exact "
                         f"reference {self.reference_power:g} mW ({self.reference_source})")
        else:
            lines.append(f"energy: no power figure for {self.kernel} (no {POWER_METRIC} in its "
                         f"source); pass --power {self.kernel}=MILLIWATTS to estimate it")
        return "\n".join(lines)

    def write_kernel_map(self, path, force: bool = False) -> None:
        with atomic_output(path, force) as tmp:
            tmp.write_text(json.dumps(self.kernel_map_document(), indent=2) + "\n",
                           encoding="utf-8")

    def write_json(self, path, force: bool = False) -> None:
        with atomic_output(path, force) as tmp:
            tmp.write_text(self.to_json() + "\n", encoding="utf-8")

    def plot(self, path, force: bool = False) -> None:
        """Pareto plot PNG: accuracy vs relative multiply energy (or approximate MAC share)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        key = "relative_energy" if self.energy_available else "swapped_mac_share"
        label = ("relative multiply energy (exact = 1)" if self.energy_available
                 else "share of MACs on the approximate multiplier")
        figure, axes = plt.subplots(figsize=(6.4, 4.4))
        singles_x = [entry[key] if self.energy_available else entry["mac_share"]
                     for entry in self.layers]
        factor = 100.0 if self.score_name in ("accuracy", "top5_accuracy", "agreement") else 1.0
        singles_y = [factor * entry["score"] for entry in self.layers]
        axes.scatter(singles_x, singles_y, marker="o", color="tab:gray", s=12 if len(
            self.layers) > LABEL_ALL else 30, label="one layer approximate")
        # with many layers only the most sensitive ones are named, so the plot stays readable
        labelled = labelled_layers(self.layers)
        for entry, x, y in zip(self.layers, singles_x, singles_y):
            if entry["layer"] in labelled:
                axes.annotate(entry["layer"].split("/")[-1], (x, y), fontsize=7,
                              xytext=(3, 3), textcoords="offset points")
        xs = [c[key] for c in self.configurations]
        ys = [factor * c["score"] for c in self.configurations]
        axes.plot(xs, ys, "-", color="tab:blue", alpha=0.5, label="cumulative (greedy)")
        pareto = [c for c in self.configurations if c["pareto"]]
        axes.scatter([c[key] for c in pareto], [factor * c["score"] for c in pareto],
                     color="tab:blue", zorder=3, label="Pareto-optimal")
        rec = self.recommended
        axes.scatter([rec[key]], [factor * rec["score"]], s=160, facecolors="none",
                     edgecolors="tab:red", linewidths=2, zorder=4, label="kernel map")
        sign = 1.0 if self.higher_is_better else -1.0
        axes.axhline(factor * (self.baseline["score"] - sign * self.max_accuracy_drop),
                     color="tab:red",
                     linestyle=":", linewidth=1,
                     label=f"max drop {100 * self.max_accuracy_drop:g} pt")
        axes.set_xlabel(label)
        axes.set_ylabel("top-1 accuracy (%)" if self.score_name == "accuracy" else
                        self.score_name + (" (%)" if factor == 100.0 else ""))
        title = f"{self.model_name}: {os.path.basename(self.kernel)}"
        if len(labelled) < len(self.layers):
            title += f"\n(names: the {len(labelled)} most sensitive of {len(self.layers)} layers)"
        axes.set_title(title, fontsize=10)
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=8, loc="best")
        figure.tight_layout()
        with atomic_output(path, force, suffix=".png") as tmp:
            figure.savefig(tmp, format="png", dpi=120)
        plt.close(figure)


#: up to this many layers every point of the plot is named; beyond, the LABEL_TOP most sensitive
LABEL_ALL = 12
LABEL_TOP = 8


def labelled_layers(layers: list) -> set:
    """The layers the Pareto plot names: all of a small model, else the most sensitive."""
    if len(layers) <= LABEL_ALL:
        return {entry["layer"] for entry in layers}
    worst = sorted(layers, key=lambda e: (-e["score_drop"], -e["macs"]))[:LABEL_TOP]
    return {entry["layer"] for entry in worst}


def _mark_pareto(configurations: list, key: str) -> None:
    """Mark configurations no other beats on both lower `key` and lower score drop."""
    for config in configurations:
        dominated = any(
            other is not config
            and other[key] <= config[key] and other["score_drop"] <= config["score_drop"]
            and (other[key] < config[key] or other["score_drop"] < config["score_drop"])
            for other in configurations)
        config["pareto"] = not dominated


def sweep(model, data, kernel, *, power=None, reference_power=None,
          max_accuracy_drop: float = 0.01, layer_types=None, include=None,
          exclude=None, backward: str = "native", batch_size: int = 128,
          split: str | None = "test", resize: bool = False, pad: bool = False, scale=None,
          custom_objects=None, safe_mode: bool = True, progress=None,
          rewrite_options=None, loss=None, metrics=None) -> SweepResult:
    """Per-layer sensitivity of `model` to `kernel` on `data`, with MACs and multiply energy.

    Args:
      model: a keras.Model (never modified) or a model file.
      data: evaluation data (anything graphswap.research.load_data accepts).
      kernel: one kernel spec (a multiplier, usually).
      power: the kernel's multiplier power in mW (float), or {spec: mW}; default: the kernel's
        PDK45_PWR hardware metric when its source carries one.
      reference_power: the exact multiplier's power in mW [default: 0.391 (mul8u_1JFF) or, for
        signed multipliers, 0.425 (mul8s_1KV6)].
      max_accuracy_drop: the budget for the kernel map: the largest drop of the task's score
        (graphswap.research.data.task: accuracy for classifiers, R^2 for regression - fractions,
        0.01 = 1 point - or the first of `metrics`, in its own unit).
      layer_types / include / exclude: which layers are candidates (as for rewrite_model; all
        swappable types by default).
      batch_size: evaluation batch size; it matters for multipliers whose activations are
        quantized per call (per batch), so keep it equal to evaluate's to compare numbers.
      progress: called as progress(done, total, label) after each evaluated model (one per
        layer, then one per cumulative step), e.g. to drive a progress bar.
      rewrite_options: rewrite_model's quantization, calibration and folding arguments, as for
        evaluate (graphswap.research.training.recovery.REWRITE_OPTIONS).
      loss / metrics: override the task the saved loss implies, as for evaluate.
    """
    if not 0 <= max_accuracy_drop <= 1:
        raise GraphswapError(f"max accuracy drop is a fraction between 0 and 1 (0.01 = one "
                             f"point), got {max_accuracy_drop}")
    if isinstance(model, (str, os.PathLike)):
        model = load_model(model, custom_objects=custom_objects, safe_mode=safe_mode)
    resolved = resolve_kernel(kernel)
    spec = kernel if isinstance(kernel, str) else resolved.spec
    user_power = power if isinstance(power, dict) else ({None: power} if power is not None
                                                         else {})
    watts, power_source = kernel_power(resolved, user_power)
    reference, reference_source = reference_power_for(resolved, reference_power)
    if reference == 0:
        raise GraphswapError("the reference (exact multiplier) power must be greater than 0")

    task = derive_task(model, loss, metrics)
    test = load_data(data, model, split=split, resize=resize, pad=pad, scale=scale,
                     name="evaluation data", task=task)
    options = prepared_rewrite_options(rewrite_options, model, resize, pad, scale)
    labels = test.labels()
    original = predict(model, test, batch_size)

    def measure(candidate):
        outputs = predict(candidate, test, batch_size)
        return task.evaluate(outputs, labels, original)

    baseline = task.evaluate(original, labels, original)
    report = plan(model, kernel=spec, include=include, exclude=exclude,
                  layer_types=None if layer_types is None else tuple(layer_types),
                  backward=backward)
    candidates = [entry for entry in report.swapped]
    if not candidates:
        raise GraphswapError(f"no layer of {model.name!r} can be swapped with the given "
                             f"selection; see 'graphswap inspect'")
    # MACs of every counted layer, swappable or not, so the energy covers the whole model
    all_macs = {entry.path: entry.macs for entry in report.layers if entry.macs}
    for entry in candidates:
        all_macs.setdefault(entry.path, entry.macs)
    total_macs = sum(all_macs.values())
    if total_macs == 0:
        raise GraphswapError(f"could not count the MACs of {model.name!r}'s layers (is the model "
                             f"built with a known input shape?)")

    total_steps = 2 * len(candidates) - 1
    done = 0

    def advance(label):
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total_steps, label)

    layers = []
    for entry in candidates:
        swapped, rewrite_report = rewrite_model(model, kernel=None,
                                                kernel_map={entry.path: spec}, backward=backward,
                                                return_report=True, **options)
        metrics = measure(swapped)
        accuracy = metrics.get("accuracy")
        layers.append({
            "layer": entry.path, "type": entry.layer_type, "macs": entry.macs,
            "mac_share": entry.macs / total_macs, "accuracy": accuracy,
            "accuracy_drop": None if accuracy is None else baseline["accuracy"] - accuracy,
            "score": metrics["score"], "score_drop": task.drop(baseline, metrics),
            "top5_accuracy": metrics.get("top5_accuracy"), "loss": metrics.get("loss"),
            "agreement": metrics.get("agreement"), "max_abs_diff": metrics.get("max_abs_diff"),
            "relative_energy": relative_energy(all_macs, {entry.path}, watts, reference)})
        advance(entry.path)

    def configuration(name, paths, metrics):
        paths = list(paths)
        share = sum(all_macs[p] for p in paths) / total_macs
        energy = relative_energy(all_macs, set(paths), watts, reference)
        return {"name": name, "layers": paths, "accuracy": metrics.get("accuracy"),
                "score": metrics["score"], "score_drop": task.drop(baseline, metrics),
                "loss": metrics.get("loss"), "agreement": metrics.get("agreement"),
                "swapped_mac_share": share,
                "relative_energy": energy, "pareto": False}

    # greedy: least score lost first; among equals, the layer with more MACs (saves more)
    order = sorted(layers, key=lambda e: (e["score_drop"], -e["macs"]))
    configurations = [configuration("original (all exact)", [], baseline)]
    chosen: list[str] = []
    single = {e["layer"]: e for e in layers}
    for step, entry in enumerate(order, start=1):
        chosen.append(entry["layer"])
        if step == 1:
            metrics = {k: single[entry["layer"]][k]
                       for k in ("accuracy", "score", "loss", "agreement")}
        else:
            swapped = rewrite_model(model, kernel=None, kernel_map={p: spec for p in chosen},
                                    backward=backward, **options)
            metrics = measure(swapped)
            advance(f"+ {entry['layer']}")
        name = "all swappable layers" if step == len(order) else f"+ {entry['layer']}"
        configurations.append(configuration(name, chosen, metrics))
    # lower energy is better; without energy, more approximate MACs is better
    scored = [{**c, "_cost": (c["relative_energy"] if watts is not None
                              else -c["swapped_mac_share"])} for c in configurations]
    _mark_pareto(scored, "_cost")
    for config, marked in zip(configurations, scored):
        config["pareto"] = marked["pareto"]
    within = [(c, s["_cost"]) for c, s in zip(configurations, scored)
              if c["score_drop"] <= max_accuracy_drop + 1e-12]
    recommended = min(within, key=lambda item: (item[1], item[0]["score_drop"]))[0]

    notes = [task.note, *test.notes]
    notes.extend(note for note in rewrite_report.notes
                 if note.startswith(("quantization", "folded", "--fold", "not folded")))
    if watts is None:
        notes.append(f"no power figure for {spec}: relative energy not estimated (pass "
                     f"power= / --power {spec}=MILLIWATTS); the Pareto plot uses the share of "
                     f"MACs on the approximate multiplier instead")
    return SweepResult(model.name, spec, test.source, len(test), baseline, layers, configurations,
                       recommended, max_accuracy_drop, watts, power_source, reference,
                       reference_source, notes, score_name=task.score_metric,
                       higher_is_better=task.higher_is_better)
