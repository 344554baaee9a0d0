"""Saliency maps: the gradient of a class score with respect to the input image.

    result = saliency_map(model, image, method="guided")     # or "vanilla"
    write_saliency_png(result, "saliency.png")

"vanilla" is Simonyan et al.'s gradient of the class score; "guided" is guided backprop
(Springenberg et al.): the same gradient through `override(model, {"relu": "guided"})`, whose ReLUs
pass only positive gradients through active units.  The class score is the logit: a softmax on the
output layer is stripped for the gradient (the probabilities are still reported), since the
softmax couples all classes and flattens the gradient of a confident prediction.  The heat map is
max over channels of |gradient|, scaled to [0, 1].  Works on swapped models too (their backward
is TensorFlow's).
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from graphswap.errors import DataError, GraphswapError
from graphswap.native import missing_reason
from graphswap.io import atomic_output
from graphswap.research.data.datafiles import open_npz
from graphswap.surgery import OverrideWarning, activation_name, override
from graphswap.swap import transform_model

METHODS = ("guided", "vanilla")
FIGURE_DPI = 100
PANEL_INCHES = 4.0


@dataclasses.dataclass
class SaliencyResult:
    image: np.ndarray          # the input sample, (H, W, C), as fed to the model
    gradient: np.ndarray       # d score / d input, (H, W, C), float32
    heatmap: np.ndarray        # max_c |gradient|, scaled to [0, 1], (H, W)
    class_index: int           # the class whose score was differentiated
    predicted: int             # the model's top class
    probabilities: np.ndarray  # the model's outputs for the sample
    method: str
    score: str                 # "logit" or "output"


def _check_method(method: str) -> str:
    if method not in METHODS:
        raise GraphswapError(f"unknown saliency method {method!r}; allowed: {', '.join(METHODS)}")
    return method


def image_input_shape(model) -> tuple[int, int, int]:
    """(H, W, C) of a model with one image input (batch, H, W, C); DataError otherwise."""
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise DataError(f"saliency needs a model with one input and one output; model "
                        f"{model.name!r} has {len(model.inputs)} inputs and {len(model.outputs)} "
                        f"outputs")
    shape = tuple(model.inputs[0].shape)
    if len(shape) != 4 or None in shape[1:]:
        raise DataError(f"saliency needs an image input of shape (batch, height, width, channels) "
                        f"with known sizes; model {model.name!r} takes {shape}")
    return int(shape[1]), int(shape[2]), int(shape[3])


def _output_layer(model):
    history = getattr(model.outputs[0], "_keras_history", None)
    return history.operation if history is not None else model.layers[-1]


def logit_model(model):
    """(model, "logit") with a softmax on the output layer removed, else (model, "output")."""
    output_layer = _output_layer(model)
    if activation_name(getattr(output_layer, "activation", None)) != "softmax" or \
            isinstance(output_layer, keras.Model):
        return model, "output"

    def replace(path, layer):
        if layer is output_layer:
            return layer.__class__.from_config({**layer.get_config(), "activation": "linear"})
        return None

    stripped, _ = transform_model(model, replace)
    return stripped, "logit"


def input_gradients(model, images, class_indices, method: str = "vanilla", score: str = "logit"):
    """d score[class] / d input for a batch; `images` (N, H, W, C), `class_indices` (N,) ints.

    Returns (gradients as numpy (N, H, W, C), the score kind used: "logit" or "output").
    """
    _check_method(method)
    if score not in ("logit", "output"):
        raise GraphswapError(f"unknown score {score!r}; allowed: 'logit', 'output'")
    scored, kind = logit_model(model) if score == "logit" else (model, "output")
    if method == "guided":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OverrideWarning)  # a ReLU-free model: same as vanilla
            scored = override(scored, {"relu": "guided"})
    x = tf.convert_to_tensor(np.asarray(images, dtype=np.float32))
    classes = np.asarray(class_indices, dtype=np.int64).reshape(-1)
    with tf.GradientTape() as tape:
        tape.watch(x)
        outputs = scored(x, training=False)
        outputs = tf.reshape(outputs, (tf.shape(outputs)[0], -1))
        if classes.size and (classes.min() < 0 or classes.max() >= outputs.shape[-1]):
            bad = [int(c) for c in classes if not 0 <= c < outputs.shape[-1]]
            raise DataError(f"class index {bad[0]} out of range: the model has "
                            f"{outputs.shape[-1]} outputs (0..{outputs.shape[-1] - 1})")
        picked = tf.gather(outputs, classes, axis=1, batch_dims=1)
        total = tf.reduce_sum(picked)
    return tape.gradient(total, x).numpy(), kind


def heatmap_of(gradient: np.ndarray) -> np.ndarray:
    """max over channels of |gradient|, scaled to [0, 1] (all zeros stays zeros)."""
    heat = np.max(np.abs(gradient), axis=-1)
    peak = float(heat.max())
    return (heat / peak if peak > 0 else heat).astype(np.float32)


def saliency_map(model, image, class_index: int | None = None, method: str = "guided",
                 score: str = "logit") -> SaliencyResult:
    """Saliency of one image ((H, W, C) or (1, H, W, C), in the model's input units).

    class_index None differentiates the model's top class.
    """
    _check_method(method)
    height, width, channels = image_input_shape(model)
    image = np.asarray(image, dtype=np.float32)
    if image.ndim == 4 and image.shape[0] == 1:
        image = image[0]
    if image.ndim == 2 and channels == 1:
        image = image[..., None]
    if image.shape != (height, width, channels):
        raise DataError(f"image of shape {image.shape} does not fit the model input "
                        f"{(height, width, channels)}")
    probabilities = np.asarray(model(image[None], training=False)).reshape(-1)
    predicted = int(np.argmax(probabilities))
    chosen = predicted if class_index is None else int(class_index)
    gradients, kind = input_gradients(model, image[None], [chosen], method, score)
    gradient = gradients[0]
    return SaliencyResult(image, gradient, heatmap_of(gradient), chosen, predicted,
                          probabilities, method, kind)


def write_saliency_png(result: SaliencyResult, path, force: bool = False, title: str | None = None):
    """Write input and heat map side by side: a PNG of 2*400 x 400 pixels.  Atomic."""
    from matplotlib.figure import Figure  # no pyplot: renders with Agg, leaves the backend alone


    figure = Figure(figsize=(2 * PANEL_INCHES, PANEL_INCHES), dpi=FIGURE_DPI)
    left, right = figure.subplots(1, 2)
    image = result.image
    shown = image[..., 0] if image.shape[-1] == 1 else image[..., :3]
    low, high = float(shown.min()), float(shown.max())
    shown = (shown - low) / (high - low) if high > low else np.zeros_like(shown)
    left.imshow(shown, cmap="gray" if shown.ndim == 2 else None, vmin=0.0, vmax=1.0,
                interpolation="nearest")
    probability = (float(result.probabilities[result.class_index])
                   if result.class_index < result.probabilities.size else float("nan"))
    left.set_title(f"input (predicted {result.predicted})", fontsize=10)
    right.imshow(result.heatmap, cmap="inferno", vmin=0.0, vmax=1.0, interpolation="nearest")
    right.set_title(f"{result.method} saliency, class {result.class_index} "
                    f"(p={probability:.2f})", fontsize=10)
    for axis in (left, right):
        axis.set_xticks([])
        axis.set_yticks([])
    if title:
        figure.suptitle(title, fontsize=11)
    path = Path(path)
    with atomic_output(path, force, suffix=".png") as tmp:
        figure.savefig(tmp, format="png", dpi=FIGURE_DPI)
    return path


# --------------------------------------------------------------------------------------------
# inputs for the CLI: an image file, or one sample of an .npz
# --------------------------------------------------------------------------------------------

NPZ_KEYS = ("x_test", "x", "images", "x_train")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")


def _expects_raw_pixels(model) -> bool:
    """True if the model rescales its input itself (a Rescaling layer at the front)."""
    for layer in model.layers[:3]:
        if isinstance(layer, keras.layers.Rescaling):
            return True
    return False


def load_sample(model, path, index: int | None = None, key: str | None = None):
    """One input sample for `model` from an image file or an .npz, plus notes to print.

    Returns (image (H, W, C) float32, label or None, list of notes).  An image is converted to
    the model's channels and resized to its input size (a note says so); its pixels (0..255) are
    divided by 255 unless the model starts with a Rescaling layer.  An .npz needs `index`; its
    array is `key`, else the first of x_test, x, images, x_train present (or its only array).
    """
    height, width, channels = image_input_shape(model)
    path = Path(path)
    notes: list[str] = []
    if not path.is_file():
        reason = missing_reason(path)
        raise DataError(f"input file not found: {path}" if reason == "does not exist" else
                        f"input file {path} {reason}" if reason != "exists" else
                        f"input {path} is not a file")
    if path.suffix.lower() == ".npz":
        # the bounded reader: members are checked before they are allocated (DataError)
        with open_npz(path) as archive:
            names = list(archive.files)
            if key is None:
                key = next((k for k in NPZ_KEYS if k in names), names[0] if len(names) == 1
                           else None)
                if key is None:
                    raise DataError(f"{path} holds arrays {names}; choose one with --key")
            elif key not in names:
                raise DataError(f"{path} has no array {key!r}; it holds {names}")
            data = archive[key]
            if data.ndim == 0:
                raise DataError(f"{key!r} in {path} is a scalar (a 0-d array); it must hold "
                                f"samples along its first axis")
            if index is None:
                raise DataError(f"{path} is an .npz archive: choose a sample with --index "
                                f"(0..{data.shape[0] - 1} in {key!r})")
            if not 0 <= index < data.shape[0]:
                raise DataError(f"--index {index} out of range: {key!r} in {path} has "
                                f"{data.shape[0]} samples")
            image = np.asarray(data[index], dtype=np.float32)
            label = None
            label_key = {"x_test": "y_test", "x_train": "y_train", "x": "y"}.get(key)
            if label_key in names and archive[label_key].shape[:1] == data.shape[:1]:
                label = archive[label_key][index]
                label = int(label) if np.ndim(label) == 0 else int(np.argmax(label))
        if image.ndim == 2 and channels == 1:
            image = image[..., None]
        if image.shape != (height, width, channels):
            raise DataError(f"sample {index} of {key!r} has shape {image.shape}; the model takes "
                            f"{(height, width, channels)}")
        notes.append(f"sample {index} of {key!r} in {path}"
                     + (f" (label {label})" if label is not None else ""))
        return image, label, notes
    if index is not None or key is not None:
        raise DataError("--index/--key select a sample of an .npz archive; "
                        f"{path} is not one")
    color_mode = {1: "grayscale", 3: "rgb", 4: "rgba"}.get(channels)
    if color_mode is None:
        raise DataError(f"the model takes {channels}-channel images; only 1, 3 or 4 channels can "
                        f"be read from an image file (use an .npz)")
    try:
        picture = keras.utils.load_img(path, color_mode=color_mode)
    except Exception as exc:  # noqa: BLE001 - PIL raises many types for unreadable files
        raise DataError(f"cannot read image {path}: {type(exc).__name__}: {exc}; expected a "
                        f"PNG/JPEG image or an .npz archive") from None
    if picture.size != (width, height):
        notes.append(f"resized {path.name} from {picture.size[0]}x{picture.size[1]} to "
                     f"{width}x{height} (the model's input)")
        picture = keras.utils.load_img(path, color_mode=color_mode, target_size=(height, width),
                                       interpolation="bilinear")
    image = keras.utils.img_to_array(picture, dtype="float32")
    if not _expects_raw_pixels(model):
        image = image / 255.0
        notes.append("pixels scaled to 0..1 (the model has no Rescaling layer at its input)")
    return image, None, notes
