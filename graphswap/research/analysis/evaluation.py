"""Evaluating kernels side by side: the original model and one rewritten copy per kernel, on the
same data, in one table - the metrics of the model's task (graphswap.research.data.task): for
classifiers top-1 accuracy (and top-5 when there are more than 10 classes), loss, agreement with
the original's predictions; for regression and reconstruction MSE, MAE, PSNR (image outputs),
R^2, loss and the largest |difference| from the original's outputs - and optionally the same
after fine-tuning each rewritten copy.  Results serialise to JSON (schema "graphswap.evaluate/1")
and CSV, and plot as a bar chart.

Metrics are computed here from the models' predictions (not with model.evaluate), so accuracy,
top-5, loss and agreement all come from the same forward pass and can be checked by hand.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os

import numpy as np

from graphswap.errors import GraphswapError
from graphswap.io import atomic_output, load_model
from graphswap.research.training.finetuning import check_learning_rate, finetune, swapped_layers
from graphswap.research.data.loading import load_data
from graphswap.research.training.recovery import DEFAULT_LEARNING_RATE, prepared_rewrite_options
from graphswap.research.data.scoring import predict
from graphswap.research.data.task import CLASSIFICATION_METRICS, derive_task
from graphswap.swap import rewrite_model
from graphswap.tables import format_table

EVALUATE_SCHEMA = "graphswap.evaluate/1"


# --------------------------------------------------------------------------------------------
# evaluate
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class EvaluationResult:
    model_name: str
    data_source: str
    examples: int
    classes: int
    loss_name: str
    rows: list            # one dict per model: original first, then one per kernel
    finetune: dict | None = None
    notes: list = dataclasses.field(default_factory=list)
    task: str = "multiclass"                  # the task's kind (graphswap.research.data.task)
    metrics: tuple = CLASSIFICATION_METRICS   # the metric keys of each row, in table order
    score: str = "accuracy"                   # the metric the rows' "score" holds

    COLUMNS = ("name", "kernel", "swapped_layers", "accuracy", "top5_accuracy", "loss",
               "agreement", "finetuned_accuracy", "finetuned_top5_accuracy", "finetuned_loss",
               "finetuned_agreement")

    @property
    def columns(self) -> tuple:
        """The JSON/CSV columns: COLUMNS for a classifier's default metrics, else the task's."""
        if tuple(self.metrics) == CLASSIFICATION_METRICS or (
                self.task in ("multiclass", "binary", "multilabel")
                and set(self.metrics) <= set(CLASSIFICATION_METRICS)):
            return self.COLUMNS
        keys = [*self.metrics, "score"]
        return ("name", "kernel", "swapped_layers", *keys, *(f"finetuned_{k}" for k in keys))

    def to_dict(self) -> dict:
        return {"schema": EVALUATE_SCHEMA, "model": self.model_name,
                "data": {"source": self.data_source, "examples": self.examples,
                         "classes": self.classes},
                "task": self.task, "score": self.score,
                "loss": self.loss_name, "top5": self.classes > 10 and self.task == "multiclass",
                "finetune": self.finetune,
                "rows": [{key: row.get(key) for key in self.columns} for row in self.rows],
                "notes": self.notes}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_csv(self) -> str:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=self.columns, lineterminator="\n")
        writer.writeheader()
        for row in self.rows:
            writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in self.columns})
        return buffer.getvalue()

    def format_table(self) -> str:
        if tuple(self.metrics) == CLASSIFICATION_METRICS:
            shown = ["accuracy", *(["top5_accuracy"] if self.classes > 10
                                   and self.task == "multiclass" else []), "loss", "agreement"]
        else:
            shown = [key for key in self.metrics
                     if any(row.get(key) is not None for row in self.rows)]
        headers = ["model", "swapped", *(HEADERS.get(key.split("/")[-1], key) if "/" not in key
                                         else key for key in shown)]
        if self.finetune is not None:
            headers.append(f"{HEADERS.get(self.score, self.score)} after "
                           f"{self.finetune['epochs']} epoch(s) fine-tuning")
        rows = []
        for row in self.rows:
            cells = [row["name"], str(row["swapped_layers"]),
                     *(format_metric(key, row.get(key)) for key in shown)]
            if self.finetune is not None:
                cells.append(format_metric(self.score, row.get("finetuned_score")) or "-")
            rows.append(cells)
        lines = format_table(headers, rows)
        if self.task in ("multiclass", "binary", "multilabel"):
            what = (f"{self.classes} classes; " if self.task == "multiclass" else
                    f"{self.task}; ")
            tail = "agreement = share of examples whose top-1 class matches the original model's"
            if self.task != "multiclass":
                tail = ("agreement = share of thresholded outputs equal to the original "
                        "model's")
        else:
            what = f"{self.task}; "
            tail = ("max |diff| = the largest difference from the original model's outputs; "
                    "R2 = 1 - SSE/SST over all values")
        lines.append(f"{self.examples} examples from {self.data_source}; {what}loss "
                     f"{self.loss_name}; {tail}")
        return "\n".join(lines)

    def write(self, path, force: bool = False) -> None:
        """Write JSON or CSV, chosen by the suffix (.json / .csv), atomically."""
        suffix = os.path.splitext(str(path))[1].lower()
        if suffix not in (".json", ".csv"):
            raise GraphswapError(f"results file {path} must end in .json or .csv")
        text = self.to_json() + "\n" if suffix == ".json" else self.to_csv()
        with atomic_output(path, force) as tmp:
            tmp.write_text(text, encoding="utf-8")

    def plot(self, path, force: bool = False) -> None:
        """Bar chart PNG: accuracy per model (and after fine-tuning), written atomically."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        names = [row["name"] for row in self.rows]
        percent = self.score in ("accuracy", "top5_accuracy", "agreement")
        factor = 100.0 if percent else 1.0
        before = [factor * row["score"] if row.get("score") is not None else np.nan
                  for row in self.rows]
        positions = np.arange(len(names))
        figure, axes = plt.subplots(figsize=(max(5.0, 1.4 * len(names) + 2), 4.0))
        if self.finetune is not None:
            after = [factor * row["finetuned_score"] if row.get("finetuned_score") is not None
                     else np.nan for row in self.rows]
            width = 0.38
            bars = axes.bar(positions - width / 2, before, width, label="as converted")
            bars_after = axes.bar(positions + width / 2, after, width,
                                  label=f"after {self.finetune['epochs']} epoch(s) fine-tuning")
            groups = [bars, bars_after]
            axes.legend(loc="lower right")
        else:
            groups = [axes.bar(positions, before, 0.6)]
        for group in groups:
            for bar in group:
                height = bar.get_height()
                if np.isfinite(height):
                    axes.annotate(f"{height:.1f}", (bar.get_x() + bar.get_width() / 2, height),
                                  ha="center", va="bottom", fontsize=8)
        finite = [v for v in before if np.isfinite(v)] or [0.0]
        if percent:
            axes.set_ylim(max(0.0, min(finite) - 10.0), 100.5)
        axes.set_xticks(positions, [os.path.basename(n) for n in names], rotation=20, ha="right")
        axes.set_ylabel("top-1 accuracy (%)" if self.score == "accuracy" else
                        f"{HEADERS.get(self.score, self.score)}{' (%)' if percent else ''}")
        axes.set_title(f"{self.model_name}: {self.examples} examples")
        figure.tight_layout()
        with atomic_output(path, force, suffix=".png") as tmp:
            figure.savefig(tmp, format="png", dpi=120)
        plt.close(figure)


HEADERS = {"accuracy": "accuracy", "top5_accuracy": "top-5", "loss": "loss",
           "agreement": "agreement", "mse": "MSE", "mae": "MAE", "psnr": "PSNR (dB)", "r2": "R2",
           "max_abs_diff": "max |diff|"}


def format_metric(key: str, value) -> str:
    """A metric's table cell: shares in percent, PSNR in dB, the rest with 4 significant
    digits."""
    if value is None:
        return ""
    metric = key.split("/")[-1]
    if metric in ("accuracy", "top5_accuracy", "agreement"):
        return f"{100 * value:.2f}%"
    if metric == "psnr":
        return f"{value:.2f}"
    if metric in ("loss", "r2"):
        return f"{value:.4f}"
    return f"{value:.4g}"


def evaluate(model, data, kernels=None, *, finetune_data=None, epochs: int = 1,
             batch_size: int = 128, learning_rate: float | str = DEFAULT_LEARNING_RATE,
             seed: int | None = 0,
             include=None, exclude=None, backward: str = "native", split: str | None = "test",
             finetune_split: str | None = "train", resize: bool = False, pad: bool = False,
             scale=None, verbose: int = 0, custom_objects=None,
             safe_mode: bool = True, rewrite_options=None, loss=None,
             metrics=None) -> EvaluationResult:
    """Evaluate `model` and one rewritten copy per kernel on `data`, side by side.

    Args:
      model: a keras.Model (never modified) or a model file.
      data: evaluation data (anything graphswap.research.load_data accepts; .npz: x_test/y_test, else
        x/y).
      kernels: kernel specs, one row each (see graphswap.kernels) [default: "exact", or none
        for a model that already has swapped layers: it is evaluated as it is].
      finetune_data: when given, each rewritten copy is also fine-tuned for `epochs` epochs
        (graphswap.finetune, same seed for every kernel) and re-evaluated.
      include / exclude / backward: passed to rewrite_model.
      batch_size: for evaluation and fine-tuning.  It can change the numbers of multipliers
        whose activations are quantized per call (per batch, "dynamic"); with calibration data
        (static activations) it does not.
      rewrite_options: rewrite_model's quantization, calibration and folding arguments
        (graphswap.research.training.recovery.REWRITE_OPTIONS); calibration_data may be a data
        source.
      loss / metrics: override the task the saved loss implies (graphswap.research.data.task:
        a loss name such as "mse"; graphswap metric names, the first one the score).

    Returns an EvaluationResult (rows: original first, then each kernel in order).
    """
    if finetune_data is not None:
        # the fine-tuning settings are checked before any evaluation work, not after it
        if epochs < 1:
            raise GraphswapError(f"epochs must be at least 1, got {epochs}")
        learning_rate = check_learning_rate(learning_rate)
    if isinstance(model, (str, os.PathLike)):
        model = load_model(model, custom_objects=custom_objects, safe_mode=safe_mode)
    task = derive_task(model, loss, metrics)
    test = load_data(data, model, split=split, resize=resize, pad=pad, scale=scale,
                     name="evaluation data", task=task)
    labels = test.labels()
    notes = [task.note, *test.notes]
    options = prepared_rewrite_options(rewrite_options, model, resize, pad, scale)
    already = swapped_layers(model)
    kernels = list(kernels) if kernels is not None else ([] if already else ["exact"])
    if already:
        notes.append(f"{model.name!r} already has {len(already)} swapped layer(s) (kernel(s) "
                     f"{', '.join(sorted(set(os.path.basename(k) for k in already.values())))}): "
                     f"its 'original' row runs them, and each --kernel row swaps only the "
                     f"remaining float layers")
    reference = predict(model, test, batch_size)
    rows = [{"name": "original", "kernel": None, "swapped_layers": len(already),
             **task.evaluate(reference, labels, reference)}]
    finetune_info = None
    train = None
    if finetune_data is not None:
        train = load_data(finetune_data, model, split=finetune_split, resize=resize, pad=pad,
                          scale=scale, name="fine-tuning data", task=task)
        finetune_info = {"data": train.source, "examples": len(train), "epochs": epochs,
                         "batch_size": batch_size, "learning_rate": learning_rate, "seed": seed}
        notes.extend(n for n in train.notes if n not in notes)
    for spec in kernels:
        swapped, report = rewrite_model(model, kernel=spec, include=include, exclude=exclude,
                                        backward=backward, return_report=True, **options)
        notes.extend(f"{spec}: {note}" for note in report.notes)
        outputs = predict(swapped, test, batch_size)
        row = {"name": spec if isinstance(spec, str) else report.swapped[0].kernel,
               "kernel": report.swapped[0].kernel if report.swapped else str(spec),
               "swapped_layers": len(report.swapped),
               **task.evaluate(outputs, labels, reference)}
        if train is not None:
            result = finetune(swapped, train, epochs=epochs, batch_size=batch_size,
                              learning_rate=learning_rate, seed=seed, verbose=verbose,
                              restore_best=False, task=task)
            tuned = predict(result.model, test, batch_size)
            row.update({f"finetuned_{k}": v
                        for k, v in task.evaluate(tuned, labels, reference).items()})
        rows.append(row)
    names = task.metric_names()
    if task.is_classifier and not task.metrics and len(task.outputs) == 1:
        names = CLASSIFICATION_METRICS
    return EvaluationResult(model.name, test.source, len(test), test.classes,
                            task.loss_name(), rows, finetune_info, notes, task=task.kind,
                            metrics=tuple(names), score=task.score_metric)
