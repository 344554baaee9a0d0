"""Reading training/evaluation data for a model: .npz archives, image directories (one folder per
class), tf.data datasets and in-memory arrays, fitted to the model's input (channel axis, resize
or pad on request) and validated up front (see graphswap.research.data.data)."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from graphswap.errors import DataError
from graphswap.input_files import require_regular
from graphswap.native import missing_reason
from graphswap.research.data.data import (SPLITS, Data, ModelExpectation, model_expectation,
                                          parse_scale)
from graphswap.research.data.datafiles import check_image_links, open_npz
from graphswap.research.data.dataset_labels import class_labels, task_labels
from graphswap.research.data.task import derive_task
from graphswap.research.data.text_data import TEXT_SUFFIX, from_string_arrays, read_text_lines

#: load_data's `labels`: required, optional (inputs alone are accepted), unused (never read)
LABEL_MODES = ("required", "optional", "unused")

def _npz_arrays(path: Path, split: str | None,
                labels: str = "required") -> tuple[np.ndarray, np.ndarray, str]:
    if not path.exists():
        raise DataError(f"data file not found: {path}")
    if path.stat().st_size == 0 or not zipfile.is_zipfile(path):
        raise DataError(f"{path} is not a NumPy .npz archive (np.savez); expected arrays 'x' and "
                        f"'y', or 'x_train'/'y_train' and 'x_test'/'y_test'")
    try:
        archive = open_npz(path)  # every member's declared size checked first
    except Exception as exc:  # noqa: BLE001 - corrupt archives fail in many ways
        raise DataError(f"cannot read {path}: {type(exc).__name__}: {exc}") from None
    with archive:
        keys = list(archive.files)
        if split is not None and split not in SPLITS:
            raise DataError(f"split must be one of {SPLITS}, got {split!r}")
        candidates = ([(f"x_{split}", f"y_{split}"), ("x", "y")] if split
                      else [("x", "y"), ("x_train", "y_train"), ("x_test", "y_test")])
        for x_key, y_key in candidates:
            if x_key in keys and y_key in keys:
                # open_npz refuses object arrays (pickle) and damaged members, naming them
                x, y = archive[x_key], archive[y_key]
                return x, y, f"{path} [{x_key}, {y_key}]"
        if labels != "required" or any(key.startswith("y_") and key not in ("y_train", "y_test")
                                       for key in keys):
            for x_key, _ in candidates:
                if x_key in keys:
                    x = archive[x_key]  # open_npz refuses object arrays, names damage
                    outputs = {key[2:]: archive[key] for key in keys if key.startswith("y_")
                               and key not in ("y_train", "y_test")}
                    if outputs:
                        return x, outputs, f"{path} [{x_key}, {', '.join(sorted(outputs))}]"
                    return x, None, f"{path} [{x_key}]"
    wanted = (f"'x_{split}'/'y_{split}' or 'x'/'y'" if split
              else "'x'/'y', or 'x_train'/'y_train' and 'x_test'/'y_test'")
    raise DataError(f"{path} has arrays {keys or '(none)'}; expected {wanted} "
                    f"(save with np.savez(path, x=images, y=labels))")


def _directory_dataset(path: Path, expect: ModelExpectation, batch_size_hint: int = 32):
    if not expect.is_image or None in expect.input_shape:
        raise DataError(
            f"an image directory needs a model with a fixed image input (height x width x "
            f"channels); this model takes {expect.describe_input()}")
    height, width, channels = expect.input_shape
    modes = {1: "grayscale", 3: "rgb", 4: "rgba"}
    if channels not in modes:
        raise DataError(f"the model takes {channels}-channel images; an image directory gives 1 "
                        f"(grayscale), 3 (rgb) or 4 (rgba) channels")
    check_image_links(path)  # link loops and broken links named before Keras lists the folder
    subdirs = sorted(p.name for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not subdirs:
        raise DataError(f"{path} has no class subdirectories; expected one folder of images per "
                        f"class ({path}/class_a/*.png, {path}/class_b/*.png, ...)")
    try:
        dataset = keras.utils.image_dataset_from_directory(
            str(path), labels="inferred", label_mode="int", color_mode=modes[channels],
            batch_size=None, image_size=(height, width), shuffle=False, verbose=False)
    except ValueError as exc:
        raise DataError(f"cannot read images from {path}: {exc}") from None
    class_names = list(dataset.class_names)
    count = int(dataset.cardinality().numpy())
    return dataset, class_names, count


def load_data(source, model, split: str | None = None, resize: bool = False, pad: bool = False,
              scale=None, name: str | None = None, task=None, labels: str = "required") -> Data:
    """Load and validate data for `model`.

    Args:
      source: a .npz path, an image directory (one subfolder per class), a tf.data.Dataset of
        (x, y) pairs (batched or not), a tuple (x, y) of arrays, a dict {"x": ..., "y": ...}, or
        a Data (returned as is).
      model: the keras.Model the data is for (single input, single output).
      split: for .npz files holding both, "train" (x_train/y_train) or "test" (x_test/y_test);
        None takes x/y, else x_train/y_train, else x_test/y_test.
      resize / pad: fit images of another height/width to the model's input by bilinear
        resizing, or by centred zero padding (only to enlarge).
      scale: multiply inputs by this (e.g. 1/255) - for models without their own Rescaling.
      task: the graphswap.research.data.task.Task the labels are read for [default: derived from the
        model's saved loss]; labels: "required", "optional" (inputs alone accepted: an .npz
        with only `x`; a reconstruction model's labels are then its inputs) or "unused"
        (labels are not read; zeros stand in).  A multi-output model's labels: a list or dict of
        arrays, or .npz arrays `y_<output name>`.

    Raises DataError naming the problem, the model's expectation, and the fix.
    """
    if isinstance(source, Data):
        return source
    if resize and pad:
        raise DataError("choose one of resize and pad, not both")
    if labels not in LABEL_MODES:
        raise DataError(f"labels must be one of {', '.join(LABEL_MODES)}, got {labels!r}")
    task = task if task is not None else derive_task(model)
    expect = model_expectation(model)
    scale = parse_scale(scale)
    label = name or "data"
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            dataset, class_names, count = _directory_dataset(path, expect)
            if count == 0:
                raise DataError(f"{path} contains no images (looked in {len(class_names)} class "
                                f"folders for .bmp/.gif/.jpeg/.jpg/.png files)")
            if len(class_names) > expect.classes:
                raise DataError(
                    f"{path} has {len(class_names)} class folders but the model has "
                    f"{expect.classes} output classes; the folders (sorted: "
                    f"{', '.join(class_names[:12])}{', ...' if len(class_names) > 12 else ''}) "
                    f"must map onto classes 0..{expect.classes - 1}")
            if not task.single.kind == "multiclass" and labels == "required":
                raise DataError(f"{path}: an image directory gives class labels, but the model's "
                                f"task is {task.kind}; pass a .npz file")
            label_format = "sparse"
            if task.single.target == "one_hot":
                width = task.single.classes
                dataset = dataset.map(lambda x, y: (x, tf.one_hot(tf.cast(y, tf.int32), width)))
                label_format = "one_hot"
            data = Data(str(path), expect, dataset=dataset, count=count, scale=scale,
                        directory=str(path), task=task, label_format=label_format)
            data.notes.append(
                f"{label}: {count} images in {len(class_names)} class folders of {path}, "
                f"resized to {expect.input_shape[0]}x{expect.input_shape[1]} "
                f"(bilinear, keras.utils.image_dataset_from_directory); class i = folder "
                f"{class_names[0]!r}, ... in sorted order")
            data.notes.append(_scaling_note(expect, integer=True, scale=scale, label=label,
                                            value_range=(0.0, 255.0)))
            return data
        if not path.exists():
            reason = missing_reason(path)
            raise DataError(f"data not found: {path} (expected a .npz file or an image directory)"
                            if reason == "does not exist" else f"data {path} {reason}; expected "
                            f"a .npz file or an image directory")
        require_regular(path, "data file", DataError)   # a FIFO, a device: never waited on
        if path.suffix == TEXT_SUFFIX and expect.takes_strings:  # one text per line, no labels
            return from_string_arrays(read_text_lines(path, label), None, str(path), expect,
                                      scale, label, task, labels)
        if path.suffix != ".npz":
            raise DataError(f"{path}: unsupported data file; expected a NumPy .npz archive "
                            f"(arrays x/y or x_train/y_train/x_test/y_test), an image directory"
                            + (", or a .txt file (one text per line)" if expect.takes_strings
                               else ""))
        # inputs alone are read here; _from_arrays says whether the task can do without labels
        x, y, origin = _npz_arrays(path, split, "optional")
        return _from_arrays(x, y, origin, expect, resize, pad, scale, label, task, labels)
    if isinstance(source, np.ndarray) and labels != "required":
        return _from_arrays(source, None, "arrays", expect, resize, pad, scale, label, task,
                            labels)
    if isinstance(source, dict):
        wanted = ("x",) if labels != "required" else ("x", "y")
        missing = [k for k in wanted if k not in source]
        if missing:
            raise DataError(f"a data dict needs keys 'x' and 'y'; missing {missing}")
        return _from_arrays(np.asarray(source["x"]), source.get("y"), "arrays", expect,
                            resize, pad, scale, label, task, labels)
    if isinstance(source, (tuple, list)) and len(source) == 2:
        return _from_arrays(np.asarray(source[0]), source[1], "arrays", expect,
                            resize, pad, scale, label, task, labels)
    if isinstance(source, tf.data.Dataset):
        return _from_dataset(source, expect, resize, pad, scale, label, task, labels)
    raise DataError(
        f"unsupported data {type(source).__name__}; pass a .npz path, an image directory, a "
        f"tf.data.Dataset of (x, y), or a tuple (x, y) of arrays")


def _scaling_note(expect: ModelExpectation, integer: bool, scale, label: str,
                  value_range=None) -> str:
    if scale is not None:
        return f"{label}: inputs multiplied by {scale:g} before the model"
    if expect.rescaling is not None:
        layer_name, factor, offset = expect.rescaling
        if integer:
            return (f"{label}: integer pixels passed unchanged; the model's own Rescaling layer "
                    f"{layer_name!r} scales them (x * {factor:.6g} + {offset:g})")
        if value_range is not None and value_range[1] <= 1.0:
            return (f"{label}: WARNING values lie in [{value_range[0]:g}, {value_range[1]:g}] "
                    f"but the model rescales its input itself ({layer_name!r}: x * {factor:.6g} "
                    f"+ {offset:g}); if the data is already scaled it is scaled twice - pass the "
                    f"raw values, or scale={1 / factor:g}")
        return f"{label}: values passed unchanged to the model's Rescaling layer {layer_name!r}"
    if integer:
        low, high = value_range if value_range is not None else (None, None)
        span = f" (range {low:g}..{high:g})" if low is not None else ""
        return (f"{label}: integer data passed as float32 unchanged{span}; the model declares no "
                f"Rescaling layer - if it was trained on [0, 1] inputs, pass scale=1/255 "
                f"(--scale 1/255)")
    return f"{label}: float inputs passed unchanged (the model declares no Rescaling layer)"


def _fit_shape(x: np.ndarray, expect: ModelExpectation, resize: bool, pad: bool,
               label: str, notes: list) -> np.ndarray:
    want = expect.input_shape
    have = tuple(x.shape[1:])

    def matches(shape):
        return len(shape) == len(want) and all(w is None or w == h for w, h in zip(want, shape))

    if matches(have):
        if resize or pad:
            notes.append(f"{label}: already {expect.describe_input()}; no resize/pad needed")
        return x
    if len(have) == len(want) - 1 and want[-1] == 1 and matches(have + (1,)):
        notes.append(f"{label}: added a channel axis ({'x'.join(map(str, have))} -> "
                     f"{expect.describe_input()})")
        return x[..., None]
    if expect.is_image and len(have) in (2, 3):
        if len(have) == 2:
            have = have + (1,)
            x = x[..., None]
        if want[2] is not None and have[2] != want[2]:
            raise DataError(
                f"{label}: images have {have[2]} channel(s) but the model expects {want[2]} "
                f"({expect.describe_input()}); convert the images (e.g. grayscale <-> rgb) first")
        size = "x".join(map(str, have))
        if not (resize or pad):
            raise DataError(
                f"{label}: images are {size} but the model expects {expect.describe_input()}; "
                f"pass resize=True (--resize, bilinear interpolation) or pad=True (--pad, zero "
                f"padding, centred) to fit them, or supply {expect.describe_input()} data")
        height, width = want[0] or have[0], want[1] or have[1]
        if pad:
            if have[0] > height or have[1] > width:
                raise DataError(
                    f"{label}: cannot pad {size} images down to {expect.describe_input()}; "
                    f"padding only enlarges - use resize=True (--resize) instead")
            top, left = (height - have[0]) // 2, (width - have[1]) // 2
            out = np.zeros((len(x), height, width, have[2]), dtype=x.dtype)
            out[:, top:top + have[0], left:left + have[1], :] = x
            notes.append(f"{label}: {size} images zero-padded (centred) to "
                         f"{expect.describe_input()}")
            return out
        chunks = [tf.image.resize(x[i:i + 4096].astype(np.float32), (height, width),
                                  method="bilinear").numpy() for i in range(0, len(x), 4096)]
        out = np.concatenate(chunks, axis=0) if chunks else np.zeros(
            (0, height, width, have[2]), np.float32)
        notes.append(f"{label}: {size} images resized to {expect.describe_input()} (bilinear)")
        return out
    raise DataError(
        f"{label}: samples have shape {have} but the model expects "
        f"({', '.join('None' if d is None else str(d) for d in want)}); supply data of that shape")


def _from_arrays(x, y, origin, expect: ModelExpectation, resize, pad, scale, label, task=None,
                 labels="required") -> Data:
    if expect.takes_strings:  # text: graphswap.research.data.text_data
        return from_string_arrays(x, y, origin, expect, scale, label, task, labels)
    x = np.asarray(x)
    notes: list[str] = []
    if x.ndim == 0:
        raise DataError(f"{label} ({origin}): the inputs are a scalar (a 0-d array, shape ()); "
                        f"expected an array with a batch axis, shape (examples, "
                        f"{expect.describe_input()}): stack the examples along the first axis")
    if len(x) == 0:
        raise DataError(f"{label} ({origin}) is empty: 0 examples")
    if isinstance(y, (np.ndarray, np.generic, int, float)) and np.ndim(y) == 0:
        raise DataError(f"{label} ({origin}): the labels are a scalar (a 0-d array, shape ()); "
                        f"expected one label per example, an array of length {len(x)}")
    if x.dtype.kind not in "iuf":
        raise DataError(f"{label}: inputs have dtype {x.dtype}; expected numbers (uint8 pixels "
                        f"or floats)")
    if labels == "unused":
        y = None
    elif y is None and not (labels == "optional" or task.single.kind == "reconstruction"):
        raise DataError(f"{label} ({origin}) holds inputs but no labels; the model's task "
                        f"({task.kind}) needs them: save them as 'y' (np.savez(path, x=..., "
                        f"y=...)), or fine-tune without labels by distillation (--teacher "
                        f"original, --teacher-weight 1: the teacher alone)")
    if y is not None:
        y, label_format = task.prepare_labels(y, len(x), label, notes)
    integer = x.dtype.kind in "iu"
    if not integer and not np.all(np.isfinite(x)):
        bad = int(np.size(x) - np.count_nonzero(np.isfinite(x)))
        raise DataError(f"{label}: inputs contain {bad} NaN/infinite value(s); clean the data "
                        f"first")
    value_range = (float(x.min()), float(x.max()))
    x = _fit_shape(x, expect, resize, pad, label, notes)
    if y is None and labels != "unused" and task.single.kind == "reconstruction" \
            and len(task.outputs) == 1:
        y = x.astype(np.float32) * np.float32(scale if scale is not None else 1.0)
        y, label_format = task.prepare_labels(y, len(x), label)
        notes.append(f"{label}: no labels; the reconstruction targets are the inputs")
    if y is None:
        y, label_format = np.zeros(len(x), np.float32), "none"
    described = {"one_hot": "one-hot", "sparse": "class indices", "binary": "0/1",
                 "multilabel": "0/1 rows", "values": "target values", "none": "none (not used)"}
    notes.insert(0, f"{label}: {len(x)} examples from {origin}, inputs "
                    f"{expect.describe_input()} {x.dtype}, labels "
                    f"{described.get(label_format, label_format)}")
    notes.append(_scaling_note(expect, integer, scale, label, value_range))
    return Data(origin, expect, x=x, y=y, count=len(x), label_format=label_format, scale=scale,
                notes=notes, task=task)


def _from_dataset(dataset, expect: ModelExpectation, resize, pad, scale, label, task=None,
                  labels="required") -> Data:
    spec = dataset.element_spec
    inputs_only = isinstance(spec, tf.TensorSpec)
    if inputs_only and (labels != "required" or task.single.kind == "reconstruction"):
        reconstruction = labels != "unused" and task.single.kind == "reconstruction"
        dataset = dataset.map(lambda x: (x, tf.cast(x, tf.float32) if reconstruction
                                         else tf.zeros([tf.shape(x)[0]] if x.shape.rank ==
                                                       len(expect.input_shape) + 1 else [])))
        spec = dataset.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 2):
        raise DataError(f"{label}: a tf.data dataset must yield (x, y) pairs; its elements are "
                        f"{spec}")
    x_spec, y_spec = spec
    want = expect.input_shape
    rank = x_spec.shape.rank
    if rank == len(want) + 1:
        dataset = dataset.unbatch()
        x_spec, y_spec = dataset.element_spec
    elif rank != len(want):
        raise DataError(f"{label}: dataset inputs have shape {x_spec.shape}; the model expects "
                        f"samples of shape {expect.describe_input()} (batched or not)")
    have = tuple(x_spec.shape)
    notes = [f"{label}: tf.data dataset, inputs {x_spec.shape} {x_spec.dtype.name}"]
    if not (x_spec.dtype.is_integer or x_spec.dtype.is_floating
            or x_spec.dtype == tf.string and expect.takes_strings):
        raise DataError(f"{label}: dataset inputs have dtype {x_spec.dtype.name}; expected numbers")
    mismatched = [i for i, (w, h) in enumerate(zip(want, have))
                  if w is not None and h is not None and w != h]
    if mismatched:
        if expect.is_image and mismatched in ([0], [1], [0, 1]) and (resize or pad):
            height, width = want[0], want[1]
            if resize:
                dataset = dataset.map(lambda x, y: (tf.image.resize(x, (height, width)), y))
                notes.append(f"{label}: images resized to {expect.describe_input()} (bilinear)")
            else:
                if (have[0] or 0) > height or (have[1] or 0) > width:
                    raise DataError(f"{label}: cannot pad {have} images down to "
                                    f"{expect.describe_input()}; use resize instead")
                dataset = dataset.map(
                    lambda x, y: (tf.image.resize_with_crop_or_pad(x, height, width), y))
                notes.append(f"{label}: images zero-padded (centred) to "
                             f"{expect.describe_input()}")
        else:
            hint = ("; pass resize=True or pad=True to fit them" if expect.is_image
                    and mismatched in ([0], [1], [0, 1]) else "")
            raise DataError(f"{label}: dataset samples have shape {have} but the model expects "
                            f"{expect.describe_input()}{hint}")
    if inputs_only and labels != "required" and task.single.kind != "reconstruction" \
            or labels == "unused":
        label_format = "none"
    elif inputs_only:
        label_format = "values"
    elif task.single.kind != "multiclass" or len(task.outputs) > 1:
        dataset, label_format = task_labels(dataset, y_spec, task, label)
    else:
        dataset, label_format = class_labels(dataset, y_spec, task, label)
    cardinality = int(dataset.cardinality().numpy())
    count = cardinality if cardinality >= 0 else None
    if count == 0:
        raise DataError(f"{label}: the dataset is empty (0 examples)")
    notes.append(_scaling_note(expect, x_spec.dtype.is_integer, scale, label))
    return Data("tf.data dataset", expect, dataset=dataset, count=count,
                label_format=label_format, scale=scale, notes=notes, task=task)
