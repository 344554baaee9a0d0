"""Scoring a classifier on data: its outputs in batches, accuracy / top-5 / loss / agreement with
a reference, shared by evaluate and sweep."""

from __future__ import annotations

import keras
import numpy as np

from graphswap.errors import DataError
from graphswap.research.data import translate_errors


def predict(model, data, batch_size: int = 256) -> np.ndarray:
    """The model's outputs on all of `data` (a graphswap.research.data.Data), as float32 numpy."""
    outputs = []
    with translate_errors(data):
        for x, _ in data.as_dataset(batch_size, feed=True):
            outputs.append(np.asarray(model(x, training=False), dtype=np.float32))
    if not outputs:
        raise DataError(f"{data.source}: the data set is empty (0 examples)")
    return np.concatenate(outputs, axis=0)


def _loss_value(loss, labels, outputs) -> float:
    function = keras.losses.get(loss) if isinstance(loss, (str, dict)) else loss
    value = function(labels, outputs)
    return float(np.mean(keras.ops.convert_to_numpy(value)))


def classification_metrics(outputs: np.ndarray, labels: np.ndarray, label_format: str,
                           loss=None, reference: np.ndarray | None = None,
                           from_logits: bool = False) -> dict:
    """accuracy, top5_accuracy (None for <= 10 classes), loss, agreement with `reference`."""
    if label_format == "one_hot":
        targets = labels.argmax(axis=1)
    else:
        targets = labels.reshape(-1).astype(np.int64)
    classes = outputs.shape[-1]
    if classes == 1:
        threshold = 0.0 if from_logits else 0.5
        predicted = (outputs[:, 0] > threshold).astype(np.int64)
    else:
        predicted = outputs.argmax(axis=1)
    result = {"accuracy": float(np.mean(predicted == targets)), "top5_accuracy": None}
    if classes > 10:
        top5 = np.argsort(-outputs, axis=1)[:, :5]
        result["top5_accuracy"] = float(np.mean(np.any(top5 == targets[:, None], axis=1)))
    result["loss"] = _loss_value(loss, labels, outputs) if loss is not None else None
    if reference is not None:
        if classes == 1:
            reference_predicted = (reference[:, 0] > (0.0 if from_logits else 0.5)).astype(int)
        else:
            reference_predicted = reference.argmax(axis=1)
        result["agreement"] = float(np.mean(predicted == reference_predicted))
    return result


def takes_logits(loss) -> bool:
    """Whether a loss object takes logits (from_logits=True in its config)."""
    config = getattr(loss, "get_config", None)
    if callable(config):
        try:
            return bool(config().get("from_logits", False))
        except Exception:  # noqa: BLE001
            return False
    return False
