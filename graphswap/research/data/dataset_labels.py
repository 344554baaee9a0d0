"""A tf.data dataset's labels for the model's task, checked on the element spec up front and on
their values while the dataset runs (a failed check is a DataError through
graphswap.research.data.data.translate_errors), converted to what the loss takes."""

from __future__ import annotations

import tensorflow as tf

from graphswap.errors import DataError
from graphswap.research.data.data import CHECK_MARKER


def task_labels(dataset, y_spec, task, label):
    """A dataset's labels for a binary / multi-label / regression / multi-output task: float32
    in each output's shape (checked on the element spec), 0..1 for sigmoid outputs (checked
    while it runs)."""
    specs = tf.nest.flatten(y_spec)
    if len(specs) != len(task.outputs):
        raise DataError(f"{label}: the dataset yields {len(specs)} label tensor(s) for the "
                        f"model's {len(task.outputs)} output(s)")
    for spec, output in zip(specs, task.outputs):
        if not (spec.dtype.is_integer or spec.dtype.is_floating):
            raise DataError(f"{label}: dataset labels have dtype {spec.dtype.name}; expected "
                            f"numbers")
        have = [d for d in spec.shape if d != 1] if spec.shape.rank is not None else None
        if have is not None and None not in have and have != [d for d in output.shape
                                                              if d != 1]:
            raise DataError(f"{label}: dataset labels have shape {spec.shape}; "
                            + output.describe_labels(1).replace("(1, ", "(").replace("(1,)", "()"))
    outputs = task.outputs

    def convert(x, y):
        parts = tf.nest.flatten(y)
        converted = []
        for part, output in zip(parts, outputs):
            value = tf.reshape(tf.cast(part, tf.float32), output.shape)
            if output.kind in ("binary", "multilabel"):
                ok = tf.reduce_all((value >= 0) & (value <= 1))
                assertion = tf.debugging.Assert(
                    ok, [f"{CHECK_MARKER} {label}: found label", value,
                         "but sigmoid outputs take labels 0 and 1"], summarize=3)
                with tf.control_dependencies([assertion]):
                    value = tf.identity(value)
            converted.append(value)
        return x, (converted[0] if len(converted) == 1 else tuple(converted))

    formats = {"binary": "binary", "multilabel": "multilabel"}
    label_format = "+".join(formats.get(o.kind, "values") if o.kind != "multiclass" else "sparse"
                            for o in outputs)
    return dataset.map(convert), label_format


def class_labels(dataset, y_spec, task, label):
    """A dataset's class labels, checked against the output's classes while it runs and
    converted to what the loss takes (indices <-> one-hot rows)."""
    output = task.single
    classes = output.classes
    if not (y_spec.dtype.is_integer or y_spec.dtype.is_floating):
        raise DataError(f"{label}: dataset labels have dtype {y_spec.dtype.name}; expected "
                        f"integer class indices")
    label_format = "binary" if classes == 1 else "sparse"
    if y_spec.shape.rank == 1 and y_spec.shape[0] == classes and classes > 1:
        label_format = "one_hot"
    elif y_spec.shape.rank not in (0, None) and tuple(y_spec.shape) != (1,):
        raise DataError(f"{label}: dataset labels have shape {y_spec.shape}; expected scalar "
                        f"class indices or one-hot rows of width {classes}")
    if label_format != "one_hot":
        high = 1 if classes == 1 else classes - 1
        what = (f"the model has {classes} output classes (labels 0..{high})" if classes > 1
                else "a single-output model takes labels 0 and 1")

        def check(x, y):
            flat = tf.reshape(y, [-1])
            ok = tf.reduce_all((flat >= 0) & (flat <= high))
            assertion = tf.debugging.Assert(
                ok, [f"{CHECK_MARKER} {label}: found label", flat, f"but {what}"], summarize=3)
            with tf.control_dependencies([assertion]):
                return tf.identity(x), tf.identity(flat[0])

        dataset = dataset.map(check)
        if output.target == "one_hot":
            dataset = dataset.map(lambda x, y: (x, tf.one_hot(tf.cast(y, tf.int32), classes)))
            label_format = "one_hot"
    elif output.target == "indices":
        dataset = dataset.map(lambda x, y: (x, tf.argmax(y, axis=-1)))
        label_format = "sparse"
    return dataset, label_format
