"""Scoring a model on data: its outputs in batches, and the metrics of its task
(graphswap.research.data.task: accuracy / top-5 / loss / agreement for classifiers, MSE / MAE /
PSNR / R^2 / max |diff| for regression and reconstruction), shared by evaluate, sweep and
explore."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from graphswap.errors import DataError
from graphswap.research.data.data import translate_errors
from graphswap.research.data.task import OutputTask, takes_logits

__all__ = ["classification_metrics", "predict", "score", "takes_logits"]


def predict(model, data, batch_size: int = 256):
    """The model's outputs on all of `data` (a graphswap.research.data.data.Data), as float32 numpy
    (a list of arrays, one per output, for a multi-output model)."""
    outputs = []
    with translate_errors(data):
        for x, _ in data.as_dataset(batch_size, feed=True):
            value = model(x, training=False)
            outputs.append(tf.nest.map_structure(lambda v: np.asarray(v, dtype=np.float32),
                                                 value))
    if not outputs:
        raise DataError(f"{data.source}: the data set is empty (0 examples)")
    if isinstance(outputs[0], (list, tuple, dict)):
        return [np.concatenate(parts, axis=0) for parts in zip(*[
            list(o.values()) if isinstance(o, dict) else list(o) for o in outputs])]
    return np.concatenate(outputs, axis=0)


def score(task, outputs, labels=None, reference=None) -> dict:
    """The task's metrics of `outputs` against `labels` and the `reference` model's outputs,
    with `score` (graphswap.research.data.task.Task.evaluate)."""
    return task.evaluate(outputs, labels, reference)


def classification_metrics(outputs: np.ndarray, labels: np.ndarray, label_format: str,
                           loss=None, reference: np.ndarray | None = None,
                           from_logits: bool = False) -> dict:
    """accuracy, top5_accuracy (None for <= 10 classes), loss, agreement with `reference`, of a
    single-output classifier (the task's metrics without a Task; kept for callers that have
    only the label format)."""
    classes = outputs.shape[-1]
    kind = "binary" if classes == 1 else "multiclass"
    target = "one_hot" if label_format == "one_hot" else ("indices" if kind == "multiclass"
                                                         else "values")
    output = OutputTask("output", kind, tuple(outputs.shape[1:]), loss, from_logits, target)
    if kind == "binary":
        labels = np.asarray(labels, dtype=np.float32).reshape(outputs.shape)
    result = output.evaluate(outputs, labels, reference)
    if loss is None:
        result["loss"] = None
    result.setdefault("top5_accuracy", None)
    return result
