"""Label-free fine-tuning by distillation: the swapped model learns to reproduce a teacher's
outputs on any inputs (graphswap.research.finetune(..., teacher=...), `finetune --teacher`).

    resolve_teacher("original", swapped)   the float model the swapped one was made from: its
                                           swapped layers lowered back to the stock layers
                                           (graphswap.io.lower_model: same weights, exact
                                           arithmetic); or a model file / keras.Model
    distillation_data(data, teacher, task) the data with the teacher's outputs as its labels
    target_entropy(task, data)             what the distillation loss of a perfect student is

The loss (graphswap.research.output_task.OutputTask.distillation_loss): for classifiers the
cross-entropy against the teacher's probabilities (categorical for softmax outputs, binary for
sigmoid ones; temperature 1) - the KL divergence to the teacher plus the teacher's entropy, a
constant, so the same gradients -, for regression and reconstruction outputs the MSE against the
teacher's outputs.  The teacher's outputs are computed once, before training, on the inputs as the
model sees them (fitted and scaled); an image folder or tf.data dataset is read into memory for it.
"""

from __future__ import annotations

import dataclasses
import os

import keras
import numpy as np

from graphswap.errors import GraphswapError
from graphswap.io import load_model, lower_model
from graphswap.research.data import translate_errors
from graphswap.research.recovery import AUTO_LOSS_SAMPLES
from graphswap.research.scoring import predict
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


def distillation_data(data, teacher, task, batch_size: int = 256, label: str = "data"):
    """`data` with the teacher's outputs (as task.soft_targets) for labels; its inputs are kept
    (read into memory when they come from a dataset or an image folder)."""
    outputs = predict(teacher, data, batch_size)
    if data.x is None:
        batches = []
        with translate_errors(data):
            for x, _ in data.as_dataset(batch_size):
                batches.append(np.char.decode(np.asarray(x).astype(bytes), "utf-8")
                               if data.expectation.takes_strings  # text: unicode, as from .npz
                               else np.asarray(x, dtype=np.float32))
        x, scale = np.concatenate(batches, axis=0), None
    else:
        x, scale = data.x, data.scale
    targets = task.soft_targets(outputs)
    notes = list(data.notes) + [f"{label}: labels not read; "
                                f"the targets are the teacher's outputs on its {len(x)} inputs"]
    return dataclasses.replace(data, x=x, y=targets, dataset=None, count=len(x), scale=scale,
                               label_format="teacher", notes=notes, directory=None)


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
