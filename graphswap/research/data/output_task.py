"""One model output's task (graphswap.research.data.task builds them): how its labels are checked
and converted for its loss, its metrics computed with numpy from one forward pass, what fine-tuning
compiles with, and the targets and loss of distillation from a teacher.  The kinds, metrics and
score are described in graphswap.research.data.task."""

from __future__ import annotations

import dataclasses

import keras
import numpy as np

from graphswap.errors import DataError

KINDS = ("multiclass", "binary", "multilabel", "regression", "reconstruction")
CLASSIFICATION = ("multiclass", "binary", "multilabel")

#: the metrics graphswap computes -> higher is better
METRICS = {"accuracy": True, "top5_accuracy": True, "agreement": True, "r2": True, "psnr": True,
           "loss": False, "mse": False, "mae": False, "max_abs_diff": False}
CLASSIFICATION_METRICS = ("accuracy", "top5_accuracy", "loss", "agreement")
REGRESSION_METRICS = ("mse", "mae", "psnr", "r2", "loss", "max_abs_diff")


def _thresholded_agreement(y_true, y_pred, threshold=0.5):
    """Per example, the share of units whose label (> 0.5) and output (> threshold) agree."""
    truth = keras.ops.greater(keras.ops.cast(y_true, "float32"), 0.5)
    predicted = keras.ops.greater(keras.ops.cast(y_pred, "float32"), threshold)
    return keras.ops.mean(keras.ops.cast(keras.ops.equal(truth, predicted), "float32"), axis=-1)


@keras.saving.register_keras_serializable(package="graphswap")
class ThresholdedBinaryAccuracy(keras.metrics.MeanMetricWrapper):
    """Binary / multi-label accuracy with the labels thresholded at 0.5 as well as the outputs:
    the definition `evaluate` uses (OutputTask.evaluate), so soft targets (a mask in [0, 1],
    label smoothing, a teacher's probabilities) score the same during fine-tuning as in
    `evaluate`.  Keras's BinaryAccuracy compares the raw label with the thresholded output, which
    gives 0 for every soft label."""

    def __init__(self, name="accuracy", dtype=None, threshold=0.5):
        super().__init__(_thresholded_agreement, name, dtype=dtype, threshold=threshold)
        self.threshold = threshold

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype, "threshold": self.threshold}


def normalised_loss_name(loss) -> str:
    """A loss's name in lower case without underscores: 'sparsecategoricalcrossentropy'."""
    if isinstance(loss, str):
        name = loss
    elif isinstance(loss, keras.losses.Loss) and type(loss).__name__ != "LossFunctionWrapper" \
            and type(loss).__module__.startswith("keras"):
        name = type(loss).__name__       # a built-in loss class: its own name may be anything
    else:
        name = (getattr(loss, "name", None) or getattr(loss, "__name__", None)
                or type(loss).__name__)
    return str(name).lower().replace("_", "").replace(" ", "")


def display_loss_name(loss) -> str:
    """A loss's name as the user knows it: the string, a Keras loss's `name`, a function's."""
    if isinstance(loss, str):
        return loss
    return getattr(loss, "name", None) or getattr(loss, "__name__", None) or type(loss).__name__


def takes_logits(loss) -> bool:
    """Whether a loss object takes logits (from_logits=True in its config)."""
    config = getattr(loss, "get_config", None)
    if callable(config):
        try:
            return bool(config().get("from_logits", False))
        except Exception:  # noqa: BLE001 - a custom loss's get_config may fail
            return False
    return False


def output_activation(model, index: int = 0) -> str | None:
    """Name of the activation the model applies last to output `index`, if visible."""
    try:
        layer = model.outputs[index]._keras_history.operation
    except (AttributeError, IndexError):
        layer = model.layers[-1] if model.layers else None
    while isinstance(layer, keras.Model) and layer.layers:
        layer = layer.layers[-1]
    if isinstance(layer, keras.layers.Softmax):
        return "softmax"
    if isinstance(layer, keras.layers.Activation):
        return getattr(layer.activation, "__name__", None)
    activation = getattr(layer, "activation", None)
    return getattr(activation, "__name__", None)


def binary_agreement(y_true, y_pred, threshold=0.5):
    """Per example: the share of sigmoid outputs on the same side as the targets (> 0.5) -
    a student's agreement with its teacher's probabilities."""
    return keras.ops.mean(keras.ops.cast(keras.ops.equal(
        keras.ops.greater(y_true, 0.5), keras.ops.greater(y_pred, threshold)), "float32"),
        axis=-1)


@keras.saving.register_keras_serializable(package="graphswap")
class BinaryAgreement(keras.metrics.MeanMetricWrapper):
    """binary_agreement as a Keras metric that saves and reloads (checkpoints)."""

    def __init__(self, threshold=0.5, name="agreement", dtype=None):
        super().__init__(fn=binary_agreement, name=name, dtype=dtype, threshold=threshold)
        self.threshold = threshold

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype, "threshold": self.threshold}


@dataclasses.dataclass(frozen=True)
class OutputTask:
    """The task of one model output."""

    name: str                  # the output's name (its layer's)
    kind: str                  # one of KINDS
    shape: tuple               # per-sample output shape
    loss: object               # what Keras compiles with (a name or a loss object)
    from_logits: bool
    target: str                # "indices" | "one_hot" | "values": the labels the loss takes
    image: bool = False        # per-sample rank 3 output (PSNR is reported)

    @property
    def classes(self) -> int:
        return int(self.shape[-1]) if self.shape and self.shape[-1] else 1

    @property
    def is_classifier(self) -> bool:
        return self.kind in CLASSIFICATION

    def keras_loss(self):
        return keras.losses.get(self.loss) if isinstance(self.loss, (str, dict)) else self.loss

    # ----------------------------------------------------------------------------------------
    # labels
    # ----------------------------------------------------------------------------------------

    def prepare_labels(self, y, count: int, label: str, notes: list | None = None):
        """`y` checked and converted to what this output's loss takes; DataError otherwise."""
        y = np.asarray(y)
        if y.dtype.kind not in "biuf":
            raise DataError(f"{label}: labels have dtype {y.dtype}; expected numbers "
                            f"({self.describe_labels(count)})")
        if len(y) != count:
            raise DataError(f"{label}: {count} inputs but {len(y)} labels; x and y must have the "
                            f"same length")
        if y.dtype.kind == "f" and not np.all(np.isfinite(y)):
            raise DataError(f"{label}: labels contain NaN/infinite values; clean the data first")
        if self.kind == "multiclass":
            return self._class_labels(y, count, label, notes)
        if self.kind in ("binary", "multilabel"):
            want = (count, *self.shape)
            if y.shape != want and y.size == int(np.prod(want)) and (
                    y.ndim == 1 or y.shape[1:] == (1,) * (y.ndim - 1) or self.kind == "binary"):
                y = y.reshape(want)
            if y.shape != want:
                raise DataError(f"{label}: labels have shape {y.shape}; "
                                f"{self.describe_labels(count)}")
            if y.min() < 0 or y.max() > 1:
                outputs = ("a single sigmoid output (binary classifier)" if self.kind == "binary"
                           else "sigmoid outputs (multi-label)")
                raise DataError(f"{label}: labels range from {y.min():g} to {y.max():g}, but "
                                f"{outputs} take labels 0 and 1 (or probabilities in [0, 1]); "
                                f"check that the data belongs to this model")
            return y.astype(np.float32), "binary" if self.kind == "binary" else "multilabel"
        want = (count, *self.shape)
        if y.shape != want and y.size == int(np.prod(want)) and self._squeezable(y.shape, want):
            y = y.reshape(want)
        if y.shape != want:
            raise DataError(f"{label}: labels have shape {y.shape}; {self.describe_labels(count)}")
        return y.astype(np.float32), "values"

    @staticmethod
    def _squeezable(have, want) -> bool:
        """Whether `have` is `want` up to axes of size 1 (e.g. (N,) for (N, 1))."""
        return [d for d in have if d != 1] == [d for d in want if d != 1]

    def _class_labels(self, y, count, label, notes):
        classes = self.classes
        if y.ndim == 2 and y.shape[1] == classes and classes > 1:
            if y.min() < 0 or y.max() > 1:
                raise DataError(f"{label}: labels of shape {y.shape} look like one-hot rows but "
                                f"hold values outside [0, 1]; expected one-hot rows or class "
                                f"indices 0..{classes - 1}")
            if self.target == "one_hot":
                return y.astype(np.float32), "one_hot"
            exact = np.all((y == 0) | (y == 1)) and np.all(y.sum(axis=1) == 1)
            if not exact:
                raise DataError(
                    f"{label}: labels are soft rows (not exactly one 1 per row) but the loss "
                    f"{display_loss_name(self.loss)} takes class indices; pass --loss "
                    f"categorical_crossentropy (loss='categorical_crossentropy') to train on them")
            if notes is not None:
                notes.append(f"{label}: one-hot labels converted to class indices for the loss "
                             f"{display_loss_name(self.loss)}")
            return y.argmax(axis=1).astype(np.int64), "sparse"
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.ndim != 1:
            raise DataError(f"{label}: labels have shape {y.shape}; {self.describe_labels(count)}")
        if y.dtype.kind == "f" and np.any(y != np.round(y)):
            raise DataError(f"{label}: labels are floats with fractional or non-finite values; "
                            f"expected integer class indices 0..{classes - 1} (a regression model? "
                            f"pass "
                            f"--loss mse)")
        y = y.astype(np.int64)
        low, high = int(y.min()), int(y.max())
        if low < 0 or high > classes - 1:
            raise DataError(f"{label}: labels range from {low} to {high}, but the model has "
                            f"{classes} output classes, so labels must lie in 0..{classes - 1}; "
                            f"check that the data belongs to this model")
        if self.target == "one_hot":
            if notes is not None:
                notes.append(f"{label}: class indices converted to one-hot rows for the loss "
                             f"{display_loss_name(self.loss)}")
            return np.eye(classes, dtype=np.float32)[y], "one_hot"
        return y, "sparse"

    def describe_labels(self, count: int) -> str:
        shape = ", ".join(str(d) for d in (count, *self.shape))
        if self.kind == "multiclass":
            return (f"expected class indices of shape ({count},) or one-hot rows of shape "
                    f"({count}, {self.classes}) for the model's {self.classes} output classes")
        if self.kind == "binary":
            return f"expected 0/1 labels of shape ({count},) or ({count}, 1) for a binary output"
        if self.kind == "multilabel":
            return f"expected 0/1 rows of shape ({shape}) for {self.classes} sigmoid outputs"
        return (f"expected targets of the output's shape ({shape}) for the {self.kind} "
                f"loss {display_loss_name(self.loss)}")

    # ----------------------------------------------------------------------------------------
    # metrics
    # ----------------------------------------------------------------------------------------

    def threshold(self) -> float:
        return 0.0 if self.from_logits else 0.5

    def predicted_classes(self, outputs):
        if self.kind == "multiclass":
            return outputs.reshape(len(outputs), -1).argmax(axis=1)
        return outputs > self.threshold()

    def target_classes(self, labels):
        if self.kind == "multiclass":
            labels = np.asarray(labels)
            return labels.argmax(axis=1) if labels.ndim == 2 else labels.astype(np.int64)
        return np.asarray(labels) > 0.5

    def evaluate(self, outputs, labels=None, reference=None) -> dict:
        """This output's metrics (module docstring); `labels` None: only the reference ones."""
        outputs = np.asarray(outputs, dtype=np.float32)
        result: dict = {}
        if self.is_classifier:
            predicted = self.predicted_classes(outputs)
            result["accuracy"] = result["top5_accuracy"] = result["loss"] = None
            if labels is not None:
                targets = self.target_classes(labels)
                result["accuracy"] = float(np.mean(predicted == targets))
                if self.kind == "multiclass" and self.classes > 10:
                    top5 = np.argsort(-outputs, axis=1)[:, :5]
                    result["top5_accuracy"] = float(np.mean(np.any(top5 == targets[:, None],
                                                                   axis=1)))
                result["loss"] = self.loss_value(labels, outputs)
            if reference is not None:
                result["agreement"] = float(np.mean(
                    predicted == self.predicted_classes(np.asarray(reference, np.float32))))
            return result
        for key in ("mse", "mae", "psnr", "r2", "loss"):
            result[key] = None
        if labels is not None:
            labels = np.asarray(labels, dtype=np.float32)
            error = outputs.astype(np.float64) - labels.astype(np.float64)
            mse = float(np.mean(error ** 2))
            result["mse"] = mse
            result["mae"] = float(np.mean(np.abs(error)))
            spread = float(np.sum((labels - labels.mean(dtype=np.float64)) ** 2))
            result["r2"] = 1.0 - float(np.sum(error ** 2)) / spread if spread > 0 else None
            if self.image:
                peak = float(labels.max()) - float(labels.min())
                result["psnr"] = (float(10 * np.log10(peak ** 2 / mse)) if mse > 0 and peak > 0
                                  else (float("inf") if peak > 0 else None))
            result["loss"] = self.loss_value(labels, outputs)
        if reference is not None:
            result["max_abs_diff"] = float(np.max(np.abs(
                outputs - np.asarray(reference, dtype=np.float32)))) if outputs.size else 0.0
        return result

    def loss_value(self, labels, outputs) -> float | None:
        if self.loss is None:
            return None
        value = self.keras_loss()(labels, outputs)
        return float(np.mean(keras.ops.convert_to_numpy(value)))

    # ----------------------------------------------------------------------------------------
    # distillation
    # ----------------------------------------------------------------------------------------

    def soft_targets(self, teacher_outputs):
        """The teacher's outputs as the targets of distillation_loss (probabilities for
        classifiers: a teacher on logits has them turned into probabilities)."""
        teacher_outputs = np.asarray(teacher_outputs, dtype=np.float32)
        if not self.from_logits or not self.is_classifier:
            return teacher_outputs
        if self.kind == "multiclass":
            shifted = teacher_outputs - teacher_outputs.max(axis=-1, keepdims=True)
            exp = np.exp(shifted)
            return (exp / exp.sum(axis=-1, keepdims=True)).astype(np.float32)
        return (1.0 / (1.0 + np.exp(-teacher_outputs))).astype(np.float32)

    def mixed_targets(self, teacher_targets, labels, weight: float):
        """weight * the teacher's targets + (1 - weight) * the labels in their form
        (class indices as one-hot rows): distillation mixed with the labels."""
        teacher_targets = np.asarray(teacher_targets, dtype=np.float32)
        labels = np.asarray(labels)
        if self.kind == "multiclass" and labels.ndim == teacher_targets.ndim - 1:
            labels = np.eye(self.classes, dtype=np.float32)[labels.astype(np.int64)]
        labels = labels.astype(np.float32).reshape(teacher_targets.shape)
        return (weight * teacher_targets + (1 - weight) * labels).astype(np.float32)

    def distillation_loss(self):
        """Cross-entropy against the teacher's probabilities for classifiers (categorical for
        multiclass, binary for sigmoid outputs: KL divergence to the teacher plus the teacher's
        own entropy, a constant, so the same gradients; temperature 1), MSE otherwise."""
        if self.kind == "multiclass":
            return keras.losses.CategoricalCrossentropy(from_logits=self.from_logits,
                                                        name="distillation_crossentropy")
        if self.kind in ("binary", "multilabel"):
            return keras.losses.BinaryCrossentropy(from_logits=self.from_logits,
                                                   name="distillation_crossentropy")
        return keras.losses.MeanSquaredError(name="distillation_mse")

    def distillation_metrics(self) -> list:
        if self.kind == "multiclass":
            return [keras.metrics.CategoricalAccuracy(name="agreement")]
        if self.kind in ("binary", "multilabel"):
            return [BinaryAgreement(threshold=self.threshold())]
        return [keras.metrics.MeanAbsoluteError(name="mae")]

    # ----------------------------------------------------------------------------------------
    # training
    # ----------------------------------------------------------------------------------------

    def keras_metrics(self, names=None) -> list:
        """What fine-tuning compiles with: `names` (graphswap or Keras metric names) or the
        kind's default (accuracy / mae)."""
        if names:
            return [self._keras_metric(name) for name in names
                    if name not in ("loss", "agreement", "max_abs_diff", "psnr")]
        if self.kind == "multiclass":
            return ["accuracy"]
        if self.kind in ("binary", "multilabel"):
            return [ThresholdedBinaryAccuracy(name="accuracy", threshold=self.threshold())]
        return [keras.metrics.MeanAbsoluteError(name="mae")]

    def _keras_metric(self, name):
        if name == "accuracy" and self.kind in ("binary", "multilabel"):
            return ThresholdedBinaryAccuracy(name="accuracy", threshold=self.threshold())
        if name == "top5_accuracy":
            cls = (keras.metrics.SparseTopKCategoricalAccuracy if self.target == "indices"
                   else keras.metrics.TopKCategoricalAccuracy)
            return cls(k=5, name="top5_accuracy")
        if name == "r2":
            return keras.metrics.R2Score(name="r2")
        if name == "mse":
            return keras.metrics.MeanSquaredError(name="mse")
        if name == "mae":
            return keras.metrics.MeanAbsoluteError(name="mae")
        return name
