"""What a model is for: one task description, derived once per command, that decides how labels are
read, which loss and metrics fine-tuning compiles with, which metrics evaluation reports and which
single score evaluate / sweep / explore compare.

    task = derive_task(model)                      # from the loss saved with the model
    task = derive_task(model, loss="mse", metrics=["mae", "r2"])     # --loss / --metrics

Kinds (one per model output; a multi-output model has one OutputTask per output):

    multiclass      softmax / logits over C classes; sparse or categorical cross-entropy.  Class
                    indices given to a categorical loss are converted to one-hot rows, one-hot
                    rows given to a sparse loss to indices (a note says so)
    binary          one sigmoid (or logit) output, shape (N, 1); labels (N,) or (N, 1) of 0/1
                    (soft targets in [0, 1] too), binary cross-entropy
    multilabel      K sigmoid outputs, labels (N, K) in [0, 1], binary cross-entropy
    regression      any output, labels of the output's shape; MSE / MAE / Huber / ...
    reconstruction  a regression whose output has the input's shape (autoencoders, image
                    decoders): the labels default to the inputs themselves

Where the kind comes from, in order: the `loss` override, the loss saved with the model (its
compile config), else the output: softmax -> multiclass, sigmoid -> binary (1 unit) or
multilabel, an output of the input's shape -> reconstruction, an output of rank > 2 ->
regression, a plain 1-unit output -> binary on logits, other plain outputs -> multiclass on
logits (the rule graphswap always used for uncompiled classifiers).

Metrics (computed with numpy from one forward pass, `Task.evaluate`):

    classification  accuracy (top-1; binary: the output thresholded at 0.5, or 0 for logits;
                    multilabel: per element), top5_accuracy (multiclass with > 10 classes),
                    loss, agreement (share of predictions equal to the reference model's)
    regression      mse, mae, r2 (1 - SSE / SST over all values of the labels), psnr for image
                    outputs (10 log10(peak^2 / mse), peak = the labels' max - min), loss,
                    max_abs_diff (the largest |output - reference output|)

The score evaluate / sweep / explore compare (higher is better; a "drop" is the baseline's score
minus the candidate's): accuracy for classifiers, r2 for regression and reconstruction (both
fractions, so a budget of 0.01 is one point either way); the first `--metrics` name when given
(for metrics where lower is better - mse, mae, loss, max_abs_diff - the drop is the increase).
A multi-output model's score is the mean of its outputs' scores.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np

from graphswap.errors import DataError, GraphswapError
from graphswap.research.data.output_task import (CLASSIFICATION, CLASSIFICATION_METRICS, KINDS,
                                                 METRICS, REGRESSION_METRICS, BinaryAgreement,
                                                 OutputTask, display_loss_name,
                                                 normalised_loss_name, output_activation,
                                                 takes_logits)

__all__ = ["CLASSIFICATION", "CLASSIFICATION_METRICS", "KINDS", "METRICS", "REGRESSION_METRICS",
           "BinaryAgreement", "OutputTask", "Task", "derive_task", "display_loss_name",
           "normalised_loss_name", "output_activation", "takes_logits"]

#: normalised loss name (lower case, no underscores/spaces) -> (kind, label target)
_LOSS_KINDS = {
    "sparsecategoricalcrossentropy": ("multiclass", "indices"),
    "categoricalcrossentropy": ("multiclass", "one_hot"),
    "categoricalfocalcrossentropy": ("multiclass", "one_hot"),
    "kldivergence": ("multiclass", "one_hot"),
    "kld": ("multiclass", "one_hot"),
    "kullbackleiblerdivergence": ("multiclass", "one_hot"),
    "binarycrossentropy": ("binary", "values"),
    "binaryfocalcrossentropy": ("binary", "values"),
    "meansquarederror": ("regression", "values"),
    "mse": ("regression", "values"),
    "meanabsoluteerror": ("regression", "values"),
    "mae": ("regression", "values"),
    "huber": ("regression", "values"),
    "huberloss": ("regression", "values"),
    "logcosh": ("regression", "values"),
    "meansquaredlogarithmicerror": ("regression", "values"),
    "msle": ("regression", "values"),
    "meanabsolutepercentageerror": ("regression", "values"),
    "mape": ("regression", "values"),
}


@dataclasses.dataclass(frozen=True)
class Task:
    """The task of a whole model: one OutputTask per output, the score, where it came from."""

    outputs: tuple
    source: str                      # "the loss saved with the model", "--loss", "the output"
    metrics: tuple = ()              # --metrics (graphswap metric names), () for the default
    note: str = ""

    @property
    def single(self) -> OutputTask:
        return self.outputs[0]

    @property
    def kind(self) -> str:
        kinds = sorted({output.kind for output in self.outputs})
        return kinds[0] if len(kinds) == 1 else "+".join(kinds)

    @property
    def is_classifier(self) -> bool:
        return all(output.is_classifier for output in self.outputs)

    @property
    def score_metric(self) -> str:
        if self.metrics:
            return self.metrics[0]
        return "accuracy" if self.is_classifier else "r2"

    @property
    def higher_is_better(self) -> bool:
        return METRICS[self.score_metric]

    @property
    def classes(self) -> int:
        return self.single.classes

    def metric_names(self) -> tuple:
        """The metric keys of each row, in the order the tables show them."""
        names = []
        for output in self.outputs:
            base = CLASSIFICATION_METRICS if output.is_classifier else REGRESSION_METRICS
            if self.metrics:
                base = tuple(m for m in self.metrics) + tuple(
                    m for m in ("loss",) if m not in self.metrics)
            for metric in base:
                if metric == "top5_accuracy" and not (output.kind == "multiclass"
                                                      and output.classes > 10) \
                        and not self.metrics:
                    continue
                if metric == "psnr" and not output.image and not self.metrics:
                    continue
                key = self._key(output, metric)
                if key not in names:
                    names.append(key)
        return tuple(names)

    def _key(self, output, metric) -> str:
        return metric if len(self.outputs) == 1 else f"{output.name}/{metric}"

    def evaluate(self, outputs, labels=None, reference=None) -> dict:
        """Every output's metrics (keys `metric`, or `output/metric` for several outputs), the
        total loss, and `score`: the task's score metric (the mean over outputs)."""
        outputs = _as_list(outputs, len(self.outputs))
        labels_list = _as_list(labels, len(self.outputs)) if labels is not None else \
            [None] * len(self.outputs)
        reference_list = _as_list(reference, len(self.outputs)) if reference is not None else \
            [None] * len(self.outputs)
        result, scores, losses = {}, [], []
        for output, out, lab, ref in zip(self.outputs, outputs, labels_list, reference_list):
            metrics = output.evaluate(out, lab, ref)
            if self.score_metric not in metrics:
                metrics.update({k: v for k, v in _extra_metric(self.score_metric, output, out,
                                                               lab, ref).items()})
            for metric in self.metrics:
                if metric not in metrics:
                    metrics.update(_extra_metric(metric, output, out, lab, ref))
            scores.append(metrics.get(self.score_metric))
            losses.append(metrics.get("loss"))
            for key, value in metrics.items():
                result[self._key(output, key)] = value
        if len(self.outputs) > 1:
            result["loss"] = None if None in losses else float(sum(losses))
        result["score"] = None if None in scores else float(np.mean(scores))
        return result

    def drop(self, baseline: dict, metrics: dict) -> float:
        """How much worse `metrics` scores than `baseline` (>= 0 worse, < 0 better)."""
        difference = baseline["score"] - metrics["score"]
        return difference if self.higher_is_better else -difference

    def prepare_labels(self, y, count: int, label: str, notes: list | None = None):
        """(labels, label format) for this task: one array, or a tuple for several outputs."""
        if len(self.outputs) == 1:
            if isinstance(y, (list, tuple, dict)) and not isinstance(y, np.ndarray):
                parts = self._per_output(y, label)
                y = parts[0]
            return self.single.prepare_labels(y, count, label, notes)
        parts = self._per_output(y, label)
        prepared = [output.prepare_labels(part, count, f"{label} [{output.name}]", notes)
                    for output, part in zip(self.outputs, parts)]
        return tuple(p[0] for p in prepared), "+".join(p[1] for p in prepared)

    def _per_output(self, y, label):
        names = [output.name for output in self.outputs]
        if isinstance(y, dict):
            missing = [name for name in names if name not in y]
            if missing:
                raise DataError(f"{label}: labels for the model's outputs {names}; missing "
                                f"{missing} (have {sorted(y)})")
            return [np.asarray(y[name]) for name in names]
        if isinstance(y, (list, tuple)) and len(y) == len(names) and all(
                np.ndim(part) >= 1 for part in y) and len(names) > 1:
            return [np.asarray(part) for part in y]
        if len(names) == 1:
            return [np.asarray(y)]
        raise DataError(f"{label}: the model has {len(names)} outputs ({', '.join(names)}); pass "
                        f"one label array per output (a list in output order, a dict by output "
                        f"name, or in a .npz the arrays y_<output name>)")

    def keras_loss(self):
        losses = [output.keras_loss() for output in self.outputs]
        return losses[0] if len(losses) == 1 else losses

    def keras_metrics(self):
        names = [m for m in self.metrics] or None
        metrics = [output.keras_metrics(names) for output in self.outputs]
        return metrics[0] if len(metrics) == 1 else metrics

    def loss_name(self) -> str:
        return ", ".join(display_loss_name(output.loss) for output in self.outputs)

    def describe(self) -> str:
        parts = []
        for output in self.outputs:
            logits = " on logits" if output.from_logits and output.is_classifier else ""
            size = f", {output.classes} classes" if output.kind == "multiclass" else ""
            prefix = f"{output.name}: " if len(self.outputs) > 1 else ""
            parts.append(f"{prefix}{output.kind}{size}{logits}, loss "
                         f"{display_loss_name(output.loss)}")
        return (f"task: {'; '.join(parts)} (from {self.source}); score "
                f"{self.score_metric}")

    # ----------------------------------------------------------------------------------------
    # distillation
    # ----------------------------------------------------------------------------------------

    def soft_targets(self, teacher_outputs):
        if len(self.outputs) == 1:
            return self.single.soft_targets(teacher_outputs)
        return tuple(output.soft_targets(part) for output, part in
                     zip(self.outputs, _as_list(teacher_outputs, len(self.outputs))))

    def mixed_targets(self, teacher_targets, labels, weight: float):
        if len(self.outputs) == 1:
            return self.single.mixed_targets(teacher_targets, labels, weight)
        count = len(self.outputs)
        return tuple(output.mixed_targets(targets, part, weight) for output, targets, part in
                     zip(self.outputs, _as_list(teacher_targets, count), _as_list(labels, count)))

    def distillation_loss(self):
        losses = [output.distillation_loss() for output in self.outputs]
        return losses[0] if len(losses) == 1 else losses

    def distillation_metrics(self):
        metrics = [output.distillation_metrics() for output in self.outputs]
        return metrics[0] if len(metrics) == 1 else metrics

    def distillation_name(self) -> str:
        return ", ".join(
            ("cross-entropy against the teacher's probabilities" if output.is_classifier
             else "MSE against the teacher's outputs") for output in self.outputs)


def _as_list(values, count):
    if count == 1:
        if isinstance(values, (list, tuple)) and len(values) == 1:
            return [values[0]]
        return [values]
    if isinstance(values, dict):
        return list(values.values())
    return list(values)


def _extra_metric(metric, output, outputs, labels, reference) -> dict:
    """A --metrics choice the output's kind does not compute by default: a regression metric of
    a classifier compares its outputs with the labels as rows (one-hot for class indices); a
    classification metric of a regression output is None (not defined)."""
    if not output.is_classifier or metric not in REGRESSION_METRICS:
        return {metric: None}
    if labels is not None and output.kind == "multiclass" and np.ndim(labels) == 1:
        labels = np.eye(output.classes, dtype=np.float32)[np.asarray(labels, dtype=np.int64)]
    twin = dataclasses.replace(output, kind="regression", loss=keras.losses.MeanSquaredError(),
                               target="values")
    return {metric: twin.evaluate(outputs, labels, reference).get(metric)}


# --------------------------------------------------------------------------------------------
# deriving the task
# --------------------------------------------------------------------------------------------

def _saved_losses(model):
    """The loss(es) in the model's compile config: None, one loss, a list, or a dict."""
    if not getattr(model, "compiled", False):
        return None
    try:
        config = model.get_compile_config()
    except Exception:  # noqa: BLE001 - no (readable) compile config: no saved loss
        return None
    if not config:
        return None
    return config.get("loss")


def _deserialize(loss):
    if isinstance(loss, dict) and "class_name" in loss:
        try:
            return keras.saving.deserialize_keras_object(loss)
        except Exception as exc:  # noqa: BLE001 - a custom loss not registered
            raise GraphswapError(
                f"the loss saved with the model ({loss.get('class_name')}) cannot be rebuilt "
                f"({type(exc).__name__}: {exc}); pass --loss NAME (loss=...) to choose one") \
                from None
    return loss


def _loss_per_output(saved, names):
    """The saved loss spread over the outputs (a list in order, a dict by name, or one)."""
    if saved is None:
        return [None] * len(names)
    if isinstance(saved, dict) and "class_name" not in saved:
        return [_deserialize(saved.get(name)) for name in names]
    if isinstance(saved, (list, tuple)):
        if len(saved) != len(names):
            raise GraphswapError(f"the model has {len(names)} outputs but {len(saved)} saved "
                                 f"losses; pass --loss NAME")
        return [_deserialize(item) for item in saved]
    return [_deserialize(saved)] * len(names)


def _output_names(model):
    names = []
    for index, tensor in enumerate(model.outputs):
        try:
            names.append(tensor._keras_history.operation.name)
        except AttributeError:
            names.append(f"output_{index}")
    if len(set(names)) != len(names):
        names = [f"{name}_{index}" for index, name in enumerate(names)]
    return names


def _check_metric_names(metrics) -> tuple:
    if metrics is None:
        return ()
    if isinstance(metrics, str):
        metrics = [m for m in metrics.split(",")]
    names = tuple(str(m).strip().lower() for m in metrics if str(m).strip())
    unknown = [m for m in names if m not in METRICS]
    if unknown:
        raise GraphswapError(f"unknown metric(s) {', '.join(unknown)}; allowed: "
                             f"{', '.join(METRICS)} (the first one is the score compared)")
    return names


def _check_loss(loss):
    if loss is None or not isinstance(loss, str):
        return loss
    name = normalised_loss_name(loss)
    if name not in _LOSS_KINDS:
        known = sorted({"sparse_categorical_crossentropy", "categorical_crossentropy",
                        "binary_crossentropy", "mse", "mae", "huber", "log_cosh", "kl_divergence",
                        "mean_squared_logarithmic_error"})
        raise GraphswapError(f"unknown loss {loss!r}; allowed: {', '.join(known)} (or a Keras "
                             f"loss object from Python)")
    return loss


def derive_task(model, loss=None, metrics=None) -> Task:
    """The Task of `model` (module docstring): from `loss` when given (a name such as "mse" or
    a Keras loss; it applies to every output), else the loss saved with the model, else its
    outputs.  `metrics`: graphswap metric names (METRICS; a comma-separated string too), the
    first one the score."""
    metric_names = _check_metric_names(metrics)
    loss = _check_loss(loss)
    names = _output_names(model)
    if loss is not None:
        losses, source = [loss] * len(names), "--loss"
    else:
        losses = _loss_per_output(_saved_losses(model), names)
        source = "the loss saved with the model" if any(l is not None for l in losses) else \
            "the model's output"
    input_shapes = [tuple(t.shape[1:]) for t in model.inputs]
    outputs = []
    for index, (name, item) in enumerate(zip(names, losses)):
        shape = tuple(None if d is None else int(d) for d in model.outputs[index].shape[1:])
        activation = output_activation(model, index)
        outputs.append(_output_task(name, shape, item, activation, input_shapes))
    task = Task(tuple(outputs), source, metric_names)
    return dataclasses.replace(task, note=task.describe())


def _output_task(name, shape, loss, activation, input_shapes) -> OutputTask:
    image = len(shape) == 3
    same_as_input = any(tuple(s) == shape for s in input_shapes)
    width = shape[-1] if shape else 1
    if loss is not None:
        kind, target = _LOSS_KINDS.get(normalised_loss_name(loss), (None, None))
        if kind is None:
            raise GraphswapError(
                f"the model's loss {display_loss_name(loss)} is not one graphswap knows the task "
                f"of (cross-entropies, MSE/MAE/Huber/...); pass --loss NAME (loss=...) to "
                f"choose one")
        from_logits = takes_logits(loss)
        if kind == "binary" and (len(shape) != 1 or width != 1):
            kind = "multilabel"
        if kind == "regression" and same_as_input:
            kind = "reconstruction"
        return OutputTask(name, kind, shape, loss, from_logits, target, image)
    if activation == "softmax" and len(shape) == 1:
        return OutputTask(name, "multiclass", shape,
                          keras.losses.SparseCategoricalCrossentropy(), False, "indices")
    if same_as_input and len(shape) > 1:
        return OutputTask(name, "reconstruction", shape, keras.losses.MeanSquaredError(), False,
                          "values", image)
    if len(shape) != 1:
        return OutputTask(name, "regression", shape, keras.losses.MeanSquaredError(), False,
                          "values", image)
    if activation == "sigmoid":
        kind = "binary" if width == 1 else "multilabel"
        return OutputTask(name, kind, shape, keras.losses.BinaryCrossentropy(), False, "values")
    if width == 1:
        return OutputTask(name, "binary", shape, keras.losses.BinaryCrossentropy(from_logits=True),
                          True, "values")
    return OutputTask(name, "multiclass", shape,
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True), True, "indices")
