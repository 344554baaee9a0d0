"""Label-free fine-tuning by distillation: the swapped model learns to reproduce a teacher's
outputs on any inputs (graphswap.research.finetune(..., teacher=...), `finetune --teacher`).

    resolve_teacher("original", swapped)   the float model the swapped one was made from: its
                                           swapped layers lowered back to the stock layers
                                           (graphswap.io.lower_model: same weights, exact
                                           arithmetic); or a model file / keras.Model
    distillation_data(data, teacher, task) the data with the teacher's outputs as its labels
                                           (with `teacher_weight` < 1: mixed with its labels)
    distillation_sets(...)                 finetune's training and validation data, distilled
    target_entropy(task, data)             what the distillation loss of a perfect student is

The loss (graphswap.research.data.output_task.OutputTask.distillation_loss): for classifiers the
cross-entropy against the teacher's probabilities (categorical for softmax outputs, binary for
sigmoid ones; temperature 1) - the KL divergence to the teacher plus the teacher's entropy, a
constant, so the same gradients -, for regression and reconstruction outputs the MSE against the
teacher's outputs.  The teacher's outputs are computed once, before training, on the inputs as the
model sees them (fitted and scaled); an image folder or tf.data dataset is read into memory for it.

Distillation mixed with the labels (`teacher_weight` w < 1, Hinton et al.'s alpha): the targets are
w * teacher + (1 - w) * labels (class indices as one-hot rows).  Both losses are linear in their
target (cross-entropy) or differ from it by a constant (MSE: w |p - t|^2 + (1 - w) |p - y|^2 =
|p - (w t + (1 - w) y)|^2 + const), so training on the mixed target is exactly training on
w * distillation loss + (1 - w) * label loss, with the same gradients.
"""

from __future__ import annotations

import dataclasses
import os

import keras
import numpy as np
import tensorflow as tf

from graphswap.errors import GraphswapError
from graphswap.io import load_model, lower_model
from graphswap.research.data.data import translate_errors
from graphswap.research.training.recovery import AUTO_LOSS_SAMPLES
from graphswap.research.data.scoring import predict
from graphswap.swap import iter_layers

TEACHER_ORIGINAL = "original"


def _has_swapped_layers(model) -> bool:
    return any(hasattr(layer, "arithmetic") for _, layer in iter_layers(model))


def resolve_teacher(teacher, model, custom_objects=None, safe_mode: bool = True):
    """(teacher model, description) for distillation: "original" (the float model `model` was
    made from: its swapped layers lowered back to the stock layers, exact arithmetic, same
    weights - graphswap.io.lower_model), a model file, or a keras.Model."""
    if isinstance(teacher, keras.Model):
        found, what = teacher, f"the model {teacher.name!r}"
    elif teacher == TEACHER_ORIGINAL:
        if not _has_swapped_layers(model):
            raise GraphswapError(
                "teacher 'original' is the float model the swapped one was made from, but this "
                "model has no swapped layers; fine-tune a rewritten model (graphswap convert), "
                "or pass the teacher's model file (--teacher MODEL.keras)")
        found, _ = lower_model(model)
        what = "the original float model (the swapped layers lowered to exact arithmetic)"
    elif isinstance(teacher, (str, os.PathLike)):
        found = load_model(teacher, custom_objects=custom_objects, safe_mode=safe_mode)
        what = f"the model {teacher}"
    else:
        raise GraphswapError(f"teacher must be {TEACHER_ORIGINAL!r}, a model file or a "
                             f"keras.Model, got {type(teacher).__name__}")
    have = [tuple(t.shape[1:]) for t in found.outputs]
    want = [tuple(t.shape[1:]) for t in model.outputs]
    if have != want or [tuple(t.shape[1:]) for t in found.inputs] != \
            [tuple(t.shape[1:]) for t in model.inputs]:
        raise GraphswapError(f"the teacher ({what}) has inputs "
                             f"{[tuple(t.shape[1:]) for t in found.inputs]} and outputs {have}, "
                             f"the model {[tuple(t.shape[1:]) for t in model.inputs]} and "
                             f"{want}; a teacher must take and give the same shapes")
    return found, what


def check_teacher_weight(teacher_weight, teacher) -> float:
    if teacher is None and teacher_weight != 1:
        raise GraphswapError(f"a teacher's weight ({teacher_weight!r}) was given without a "
                             f"teacher; pass teacher='original' (--teacher original) or a "
                             f"teacher model to distil from, mixed with the labels")
    if isinstance(teacher_weight, bool) or not isinstance(teacher_weight, (int, float)) \
            or not 0 < teacher_weight <= 1:
        raise GraphswapError(f"the teacher's weight must be a number in (0, 1] (1: the teacher's "
                             f"outputs alone; below 1: mixed with the labels), got "
                             f"{teacher_weight!r}; to train on the labels alone leave the "
                             f"teacher out")
    return float(teacher_weight)


def distillation_data(data, teacher, task, batch_size: int = 256, label: str = "data",
                      teacher_weight: float = 1.0):
    """`data` with the teacher's outputs (as task.soft_targets) for labels - mixed with its own
    labels (task.label_targets) when `teacher_weight` < 1; its inputs are kept (read into
    memory when they come from a dataset or an image folder)."""
    outputs = predict(teacher, data, batch_size)
    if data.x is None:
        batches, labels = [], []
        with translate_errors(data):
            for x, y in data.as_dataset(batch_size):
                batches.append(np.char.decode(np.asarray(x).astype(bytes), "utf-8")
                               if data.expectation.takes_strings  # text: unicode, as from .npz
                               else np.asarray(x, dtype=np.float32))
                labels.append(tf.nest.map_structure(np.asarray, y))
        x, scale = np.concatenate(batches, axis=0), None
        y = tf.nest.map_structure(lambda *parts: np.concatenate(parts, axis=0), *labels) \
            if labels else None
    else:
        x, scale, y = data.x, data.scale, data.y
    targets = task.soft_targets(outputs)
    if teacher_weight < 1:
        targets = task.mixed_targets(targets, y, teacher_weight)
        used = (f"the targets are {teacher_weight:g} x the teacher's outputs + "
                f"{1 - teacher_weight:g} x the labels on its {len(x)} examples")
    else:
        used = f"labels not read; the targets are the teacher's outputs on its {len(x)} inputs"
    notes = list(data.notes) + [f"{label}: {used}"]
    return dataclasses.replace(data, x=x, y=targets, dataset=None, count=len(x), scale=scale,
                               label_format="teacher", notes=notes, directory=None)


def distillation_sets(teacher, teacher_weight, model, train, validation, task, batch_size,
                      custom_objects=None, safe_mode: bool = True):
    """(train, validation, note): finetune's data with the targets of distillation from
    `teacher` (resolve_teacher) at `teacher_weight`; validation may be None."""
    teacher_model, what = resolve_teacher(teacher, model, custom_objects, safe_mode)
    mixed = "" if teacher_weight == 1 else \
        f", mixed with the labels' ({teacher_weight:g} teacher, {1 - teacher_weight:g} labels)"
    note = (f"distillation: the model learns to reproduce {what}; loss "
            f"{task.distillation_name()}{mixed}")
    train = distillation_data(train, teacher_model, task, batch_size, "training data",
                              teacher_weight)
    if validation is not None:
        validation = distillation_data(validation, teacher_model, task, batch_size,
                                       "validation data", teacher_weight)
    return train, validation, note


def target_entropy(task, data) -> float:
    """The mean cross-entropy of the teacher's targets with themselves (their entropy): what
    the distillation loss of a student equal to its teacher is."""
    targets = data.y
    total = 0.0
    for output, part in zip(task.outputs, targets if len(task.outputs) > 1 else [targets]):
        if not output.is_classifier:
            continue
        p = np.clip(np.asarray(part[:AUTO_LOSS_SAMPLES], np.float64), 1e-7, 1 - 1e-7)
        if output.kind == "multiclass":
            total += float(np.mean(-np.sum(p * np.log(p), axis=-1)))
        else:
            total += float(np.mean(-(p * np.log(p) + (1 - p) * np.log(1 - p))))
    return total
