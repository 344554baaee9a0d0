"""Training/evaluation data: what a model expects of it, the validated container (Data), and the
checks shared by every source (graphswap.research.data.loading reads the sources).

Everything is checked up front, before any training or evaluation starts, and every problem ends in
one DataError that says what was found, what the model expects and what to do:

  - `.npz` keys: `x`/`y`, or `x_train`/`y_train` (training) and `x_test`/`y_test` (evaluation);
  - emptiness, x/y length mismatch, non-numeric or non-finite values;
  - sample shape against the model's input (a missing trailing channel axis is added; images of
    another height/width are refused unless `resize=True` (bilinear) or `pad=True` (zero padding,
    centred) was asked for);
  - labels against the model's task (graphswap.research.data.task, derived once from the loss saved
    with the model or --loss): class indices or one-hot rows (converted to what the loss takes),
    0/1 labels of shape (N,) or (N, 1) for a binary output, targets of the output's shape for
    regression; a reconstruction model's labels default to its inputs, and commands that use
    only inputs (calibration, distillation) read data without labels.

Scaling is never guessed: integer pixels are passed unchanged, and the notes say whether the model's
own Rescaling layer scales them (the sample LeNet-5 does) or that nothing does (then `scale=1/255`
is the user's call).  tf.data datasets are checked on their element spec up front and on their label
values while they run (a DataError, not a TensorFlow traceback).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from fractions import Fraction

import keras
import numpy as np
import tensorflow as tf

from graphswap.errors import DataError
from graphswap.swap import iter_layers, tensorflow_reason

#: marker in the messages of runtime label checks, used to turn TensorFlow errors into DataError
CHECK_MARKER = "graphswap data check:"

SPLITS = ("train", "test")


# --------------------------------------------------------------------------------------------
# what the model expects
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ModelExpectation:
    """The parts of a model that data must fit."""

    input_shape: tuple          # per-sample shape, None for free dimensions
    input_dtype: str
    classes: int                # width of the (first) output's last axis
    rescaling: tuple | None     # (layer name, scale, offset) of an input Rescaling layer, if any
    input_key: str | None = None  # the input's name when the model takes its input as a dict

    def feed(self, x):
        """`x` in the structure the model was built with (a dict for a model built on
        {name: Input}), so Keras has no input-structure mismatch to warn about."""
        return x if self.input_key is None else {self.input_key: x}

    @property
    def is_image(self) -> bool:
        return len(self.input_shape) == 3 and not self.takes_strings

    @property
    def takes_strings(self) -> bool:
        """A tf.string input (text: graphswap.research.data.text_data)."""
        return self.input_dtype == "string"

    def prepared(self, x, scale):
        """A tensor of inputs as the model is fed: float32 times `scale`; strings unchanged."""
        if self.takes_strings:
            return x
        x = tf.cast(x, tf.float32)
        return x * scale if scale is not None else x

    def describe_input(self) -> str:
        return "x".join("?" if d is None else str(d) for d in self.input_shape)


def find_input_rescaling(model):
    """The Rescaling layer the model applies to its input before any weighted layer, or None."""
    for _, layer in iter_layers(model):
        if isinstance(layer, keras.Model):
            continue
        if isinstance(layer, keras.layers.Rescaling):
            return layer
        if layer.weights:  # the first layer with weights ends the input preprocessing
            return None
    return None


def model_expectation(model) -> ModelExpectation:
    """What `model` expects of its data; DataError for models graphswap cannot feed from files."""
    if len(model.inputs) != 1:
        raise DataError(
            f"model {model.name!r} has {len(model.inputs)} inputs; graphswap's data loading "
            f"supports single-input models. From Python, call model.fit/evaluate with your own "
            f"tf.data pipeline instead")
    tensor = model.inputs[0]
    shape = tuple(None if d is None else int(d) for d in tensor.shape[1:])
    output_shape = model.outputs[0].shape
    classes = int(output_shape[-1]) if len(output_shape) > 1 and output_shape[-1] else 1
    layer = find_input_rescaling(model)
    rescaling = None
    if layer is not None:
        rescaling = (layer.name, float(np.asarray(layer.scale).ravel()[0]),
                     float(np.asarray(layer.offset).ravel()[0]))
    try:
        structure = model.input  # a functional model's: the structure it was built on
    except (AttributeError, ValueError):  # Sequential/subclassed models never called on one
        structure = None
    input_key = next(iter(structure)) if isinstance(structure, dict) else None
    return ModelExpectation(shape, str(getattr(tensor, "dtype", "float32")), classes, rescaling,
                            input_key)


# --------------------------------------------------------------------------------------------
# the container
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Data:
    """Validated data for one model: numpy arrays or a tf.data dataset of single examples.

    `x` holds samples already fitted to the model's input shape (resized/padded/expanded as
    asked), in their original dtype unless a transformation made them float32; `as_dataset` casts
    to float32 and applies `scale`.
    """

    source: str
    expectation: ModelExpectation
    x: np.ndarray | None = None
    y: np.ndarray | None = None
    dataset: object = None               # tf.data.Dataset of (x, y) single examples
    count: int | None = None             # number of examples (None: unknown for a dataset)
    label_format: str = "sparse"         # "sparse" (class indices), "one_hot", "binary",
    #                                      "multilabel", "values" (regression), "none" (no labels:
    #                                      zeros stand in), "+"-joined for several outputs
    scale: float | None = None
    notes: list = dataclasses.field(default_factory=list)
    directory: str | None = None         # the image folder the dataset reads, if any
    task: object = None                  # the graphswap.research.data.task.Task the labels are for

    @property
    def has_labels(self) -> bool:
        return self.label_format != "none"

    def __len__(self) -> int:
        return int(self.count or 0)

    @property
    def classes(self) -> int:
        return self.expectation.classes

    def as_dataset(self, batch_size: int, shuffle: bool = False, seed: int = 0,
                   feed: bool = False):
        """A batched tf.data.Dataset of float32 inputs and labels; with `feed` the inputs are
        in the structure the model takes (ModelExpectation.feed), for calling the model."""
        if batch_size < 1:
            raise DataError(f"batch size must be at least 1, got {batch_size}")
        if self.x is not None:
            dataset = tf.data.Dataset.from_tensor_slices((self.x, self.y))
            buffer = len(self.x)
        else:
            dataset = self.dataset
            buffer = 10_000
        scale, expect = self.scale, self.expectation
        structure = expect.feed if feed else (lambda x: x)

        def cast(x, y):
            return structure(expect.prepared(x, scale)), y

        if shuffle:
            dataset = dataset.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
        dataset = dataset.map(cast, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE)

    def training_dataset(self, batch_size: int, seed: int | None, initial_epoch: int,
                         epochs: int):
        """(dataset, steps_per_epoch) for epochs initial_epoch+1..epochs, reshuffled each epoch,
        inputs in the structure the model takes (for Model.fit).

        For arrays, epoch e's order is a NumPy permutation seeded by (seed, e), fed as batches
        of indices: the same batches whatever the distribution strategy, and a resumed run sees
        exactly the batches an uninterrupted one would.  (tf.data's own shuffle re-seeds when a
        strategy rewrites the pipeline.)  Datasets of known size (image folders, tf.data with a
        known cardinality) are shuffled with tf.data, epoch e with a shuffle seeded by (seed, e),
        so a resumed run sees the same batches too; a dataset of unknown size is reshuffled each
        epoch by tf.data (steps None), which a resumed run does not replay.
        """
        if batch_size < 1:
            raise DataError(f"batch size must be at least 1, got {batch_size}")
        base = int(seed) if seed is not None else int(np.random.SeedSequence().entropy % 2**31)
        if self.x is None:
            if not self.count:
                return self.as_dataset(batch_size, shuffle=True, seed=seed or 0,
                                       feed=True), None
            seeds = [int(np.random.default_rng([base, epoch]).integers(2 ** 31))
                     for epoch in range(initial_epoch, epochs)]
            source, buffer, scale = self.dataset, min(int(self.count), 10_000), self.scale

            def epoch_batches(epoch_seed):
                shuffled = source.shuffle(buffer, seed=epoch_seed, reshuffle_each_iteration=False)
                return shuffled.map(lambda x, y: (
                    self.expectation.feed(self.expectation.prepared(x, scale)), y)
                ).batch(batch_size)

            epochs_in_order = [epoch_batches(epoch_seed) for epoch_seed in seeds]
            dataset = epochs_in_order[0]
            for more in epochs_in_order[1:]:
                dataset = dataset.concatenate(more)
            return dataset.prefetch(tf.data.AUTOTUNE), -(-int(self.count) // batch_size)
        count = len(self.x)
        orders = np.stack([np.random.default_rng([base, epoch]).permutation(count)
                           for epoch in range(initial_epoch, epochs)]).astype(np.int64)
        x_all, y_all = tf.constant(self.x), tf.nest.map_structure(tf.constant, self.y)
        scale = self.scale

        def gather(indices):
            x = self.expectation.prepared(tf.gather(x_all, indices), scale)
            return self.expectation.feed(x), tf.nest.map_structure(lambda y: tf.gather(y, indices),
                                                                   y_all)

        dataset = tf.data.Dataset.from_tensor_slices(orders).flat_map(
            lambda order: tf.data.Dataset.from_tensor_slices(order).batch(batch_size))
        dataset = dataset.map(gather, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return dataset.prefetch(tf.data.AUTOTUNE), -(-count // batch_size)

    def labels(self) -> np.ndarray:
        """All labels as a numpy array (iterates a dataset once)."""
        if self.y is not None:
            return self.y
        with translate_errors(self):
            batches = [tf.nest.map_structure(np.asarray, y) for _, y in self.as_dataset(1024)]
        return tf.nest.map_structure(lambda *parts: np.concatenate(parts, axis=0), *batches)

    def split(self, fraction: float, seed: int = 0) -> tuple["Data", "Data"]:
        """(rest, held-out fraction), a seeded random split (for --val-split)."""
        if not 0.0 < fraction < 1.0:
            raise DataError(f"validation split must be between 0 and 1 (exclusive), got {fraction}")
        if self.x is None:
            if self.count is None:
                raise DataError(
                    "cannot split a tf.data dataset of unknown size; pass validation data "
                    "explicitly (val_data= / --val-data)")
            held = int(round(self.count * fraction))
            shuffled = self.dataset.shuffle(self.count, seed=seed, reshuffle_each_iteration=False)
            parts = [(shuffled.skip(held), self.count - held), (shuffled.take(held), held)]
            pieces = [dataclasses.replace(self, dataset=ds, count=n, notes=list(self.notes))
                      for ds, n in parts]
        else:
            held = int(round(len(self.x) * fraction))
            order = np.random.default_rng(seed).permutation(len(self.x))
            rest, val = order[held:], order[:held]
            pieces = [dataclasses.replace(self, x=self.x[idx], count=len(idx),
                                          y=tf.nest.map_structure(lambda y: y[idx], self.y),
                                          notes=list(self.notes)) for idx in (rest, val)]
        if held == 0 or held == self.count:
            raise DataError(
                f"a validation split of {fraction} of {self.count} examples leaves "
                f"{held} for validation and {self.count - held} for training; both need at least "
                f"one example")
        pieces[0].source = f"{self.source} ({1 - fraction:.0%} for training)"
        pieces[1].source = f"{self.source} ({fraction:.0%} held out for validation)"
        return pieces[0], pieces[1]


#: what TensorFlow says when an image file does not decode
_DECODE_FAILURE = re.compile(r"Invalid (PNG|JPEG|GIF|BMP)|Unknown image file format|decode_image|"
                             r"Decode(Image|Png|Jpeg|Gif|Bmp)|Input is empty|corrupt", re.I)
IMAGE_SUFFIXES = (".bmp", ".gif", ".jpeg", ".jpg", ".png")


def undecodable_images(directory: str) -> list[tuple[str, str]]:
    """(path, TensorFlow's reason) of every image file under `directory` that does not decode."""
    bad = []
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files):
            if not name.lower().endswith(IMAGE_SUFFIXES):
                continue
            path = os.path.join(root, name)
            try:
                tf.io.decode_image(tf.io.read_file(path), expand_animations=False)
            except (tf.errors.OpError, OSError) as exc:
                bad.append((path, tensorflow_reason(exc)))
    return bad


def _decode_error(message: str, data) -> DataError:
    reason = _DECODE_FAILURE.search(message)
    for item in data:
        directory = getattr(item, "directory", None)
        if directory is None:
            continue
        bad = undecodable_images(directory)
        if bad:
            shown = "; ".join(f"{path} ({why})" for path, why in bad[:3])
            more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
            return DataError(f"{len(bad)} image file(s) in {directory} cannot be decoded: "
                             f"{shown}{more}; remove or replace them")
    return DataError(f"an image in the data cannot be decoded "
                     f"({reason.group(0) if reason else 'TensorFlow could not read it'}); check "
                     f"the image files (a truncated or mislabelled .png/.jpg?)")


@contextlib.contextmanager
def translate_errors(*data):
    """Turn failures of the runtime label checks inside TensorFlow into DataError, and an image
    file that does not decode into a DataError naming the file (the image folders of `data`,
    Data objects, are searched for it only then)."""
    try:
        yield
    except tf.errors.InvalidArgumentError as exc:
        message = str(exc)
        if CHECK_MARKER in message:
            start = message.index(CHECK_MARKER) + len(CHECK_MARKER)
            detail = message[start:].split("\n")[0]
            detail = re.sub(r"\]\s*\[", " ", detail).strip("[]'\" .")
            raise DataError(detail) from None
        if _DECODE_FAILURE.search(message):
            raise _decode_error(message, data) from None
        raise


def parse_scale(value) -> float | None:
    """A scale factor from a number or a fraction string such as '1/255'."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        result = float(value)
    else:
        try:
            result = float(Fraction(str(value).strip()))
        except (ValueError, ZeroDivisionError):
            raise DataError(f"scale must be a number or a fraction such as 1/255, got {value!r}") \
                from None
    if not np.isfinite(result) or result == 0:
        raise DataError(f"scale must be a finite, non-zero number, got {value!r}")
    return result


def check_labels(y: np.ndarray, count: int, classes: int, label: str) -> tuple[np.ndarray, str]:
    """Validate labels for a classifier with `classes` outputs; returns (labels, format)."""
    if y.dtype.kind not in "biuf":
        raise DataError(f"{label}: labels have dtype {y.dtype}; expected integer class indices "
                        f"(or one-hot float rows)")
    if len(y) != count:
        raise DataError(f"{label}: {count} inputs but {len(y)} labels; x and y must have the same "
                        f"length")
    if y.ndim == 2 and y.shape[1] == classes and classes > 1:
        if not np.all(np.isfinite(y)) or y.min() < 0 or y.max() > 1:
            raise DataError(f"{label}: labels of shape {y.shape} look one-hot but hold values "
                            f"outside [0, 1]; expected one-hot rows or class indices")
        return y.astype(np.float32), "one_hot"
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise DataError(
            f"{label}: labels have shape {y.shape}; expected class indices of shape ({count},) "
            f"or one-hot rows of shape ({count}, {classes}) for the model's {classes} outputs")
    if y.dtype.kind == "f":
        if not np.all(np.isfinite(y)) or np.any(y != np.round(y)):
            raise DataError(f"{label}: labels are floats with fractional or non-finite values; "
                            f"expected integer class indices 0..{max(classes - 1, 1)}")
    y = y.astype(np.int64)
    high = 1 if classes == 1 else classes - 1
    low_seen, high_seen = int(y.min()), int(y.max())
    if low_seen < 0 or high_seen > high:
        what = ("a single output (binary classifier) takes labels 0 and 1" if classes == 1 else
                f"the model has {classes} output classes, so labels must lie in 0..{high}")
        raise DataError(f"{label}: labels range from {low_seen} to {high_seen}, but {what}; "
                        f"check that the data belongs to this model")
    return y, ("binary" if classes == 1 else "sparse")
