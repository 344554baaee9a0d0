"""Recovery tools at the research level: the zero-gradient-step ones on data sources graphswap reads
(.npz, image folders, arrays), and the fine-tuning recipe.

    calibration_arrays(source, model)       the inputs calibration, bias compensation and BN
                                            re-estimation run on (first `samples` examples)
    recalibrate_batchnorm(model, data)      BN statistics re-estimated with the approximate forward
    compensate_bias(model, data)            per-channel compensation of the products' error
    make_optimizer(recipe, steps)           the fine-tuning optimizer of a recipe

The mechanisms are graphswap.swap.calibration / graphswap.swap.compensation; these add data
loading (the model's own input fitting and scaling, graphswap.research.data.loading) on top.

Fine-tuning recipe (graphswap finetune's defaults; chosen from the measurements in
docs/RECOVERY.md, reproduced by benchmarks/recovery_table.py --sections recipes): Adam, decayed by
a cosine to 0 over the run (`schedule="cosine"`), batch 32 (DEFAULT_BATCH_SIZE), learning rate
"auto" (auto_learning_rate: 1e-4 when the start's training loss shows it still fits its training
data, 3e-4 when it is within 4x the original float model's loss, 1e-3 when the products cost it
the fit; the last two measured on the MLPerf Tiny ResNet-8, docs/RECOVERY.md), and for models with BatchNormalization the statistics
re-estimated with the approximate forward after training (the moving averages Keras keeps during
1-3 short epochs lag behind the weights).  Of the recipes measured (Adam 1e-4 constant - the first
default -, 1e-4, 3e-4, 1e-3 with cosine decay - the second -, and auto), a fixed 1e-3 is the only
one that brings the severe signed multiplier within 3 points in 3 epochs, but it moves a model
that already fits by 2-3 test images in one epoch; auto takes 1e-3 for exactly the starts that
need it (see the recipes table).  The schedules are described in graphswap/methods.py's
SCHEDULE_REGISTRY; each one's learning rate is registered here with `@schedule_method(name)`
(SCHEDULE_METHODS).
"""

from __future__ import annotations

import keras
import numpy as np

from graphswap.errors import DataError, GraphswapError
from graphswap.io import lower_model
from graphswap.methods import SCHEDULE_REGISTRY, Implementations
from graphswap.research.data.data import translate_errors
from graphswap.research.data.loading import load_data
from graphswap.swap.recipe import has_batchnorm
from graphswap.swap import (CHECK_SAMPLES, DEFAULT_CALIBRATION_SAMPLES, DEFAULT_COMPENSATION,
                            compensate_bias as compensate_layers,
                            recalibrate_batchnorm as recalibrate_layers)

DEFAULT_BIAS_CORRECTION = DEFAULT_COMPENSATION
SCHEDULES = SCHEDULE_REGISTRY.names   # described in graphswap/methods.py
DEFAULT_SCHEDULE = SCHEDULE_REGISTRY.default
# Batch 32 (Keras fit's own default): on the small data sets fine-tuning gets (a few thousand
# examples), 3 epochs at 128 are 66 steps - measured on the ResNet-8 (docs/RECOVERY.md) batch 32
# recovers 2 to 6 points more on the severe multipliers and the same on the medium ones.
DEFAULT_BATCH_SIZE = 32
AUTO_LEARNING_RATE = "auto"
DEFAULT_LEARNING_RATE = AUTO_LEARNING_RATE
# "auto": the start's mean training loss (cross-entropy) decides.  At or below FITTED_LOSS the model
# still fits its training data and Adam's steps - about the learning rate per weight, whatever the
# gradient's size - would mostly add noise; above it the products cost the fit and large steps pay.
# Measured (docs/RECOVERY.md, recipes): starts of the shipped models after calibration and
# compensation lie at 0.0002-0.019 or at 0.046-0.65, nothing between.
FITTED_LOSS = 0.03
# With the original float model at hand (a swapped model's layers lowered back), "fits" is
# relative: the start's loss within FITTED_RATIO of the original's on the same examples.  A harder
# task's float model does not reach 0.03: the MLPerf Tiny ResNet-8's own loss on CIFAR-10 training
# images is 0.19, its medium-multiplier starts 0.28 (1.5x) and 0.41 (2.1x) - where 1e-4 gained
# 0.9 and 2.7 points in 3 epochs and 1e-3 lost 2.3 and gained 0.3 -, its severe ones 3.1 and 6.4
# (16x, 33x; docs/RECOVERY.md, ResNet-8 section).
FITTED_RATIO = 4.0
FITTED_LEARNING_RATE = 1e-4
# A start close to the original's fit but not at 0.03 (the relative rule): 3e-4 at batch 32 gave
# 89.2 / 87.5 on the ResNet-8's medium starts, 1e-4 89.0 / -, 1e-3 85.7 / 84.4.
CLOSE_LEARNING_RATE = 3e-4
UNFITTED_LEARNING_RATE = 1e-3
AUTO_LOSS_SAMPLES = 2048


def calibration_arrays(source, model, samples: int = DEFAULT_CALIBRATION_SAMPLES,
                       split: str | None = "train", resize: bool = False, pad: bool = False,
                       scale=None, name: str = "calibration data") -> np.ndarray:
    """The first `samples` inputs of `source` as float32 (strings for a model that takes strings),
    fitted and scaled as for training (graphswap.research.load_data); arrays of the model's
    input shape pass through."""
    if isinstance(source, np.ndarray):
        return source[:samples]
    data = load_data(source, model, split=split, resize=resize, pad=pad, scale=scale, name=name,
                     labels="unused")
    strings = data.expectation.takes_strings
    if data.x is not None:
        if strings:
            return data.x[:samples]
        x = np.asarray(data.x[:samples], dtype=np.float32)
        return x * np.float32(data.scale) if data.scale is not None else x
    batches, count = [], 0
    with translate_errors():
        for x, _ in data.as_dataset(128):
            batches.append(np.asarray(x) if strings else np.asarray(x, dtype=np.float32))
            count += len(batches[-1])
            if count >= samples:
                break
    if not batches:
        raise GraphswapError(f"{name}: {data.source} holds no examples")
    return np.concatenate(batches)[:samples]


def recalibrate_batchnorm(model, data, samples: int = DEFAULT_CALIBRATION_SAMPLES, **loading):
    """Re-estimate `model`'s BatchNormalization statistics in place with its swapped layers'
    arithmetic in the loop (no gradient steps); `data` as for calibration_arrays."""
    x = calibration_arrays(data, model, samples, name="BatchNorm re-estimation data", **loading)
    return recalibrate_layers(model, x, samples=samples)


def compensate_bias(model, data, samples: int = DEFAULT_CALIBRATION_SAMPLES,
                    method: str = DEFAULT_COMPENSATION, **loading):
    """Per-output-channel compensation of the approximate products' error, in place (no
    training); `data` as for calibration_arrays, methods as graphswap.swap.compensate_bias."""
    x = calibration_arrays(data, model, samples, name="bias compensation data", **loading)
    return compensate_layers(model, x, samples=samples, method=method)


def start_training_loss(model, data, loss, batch_size: int = 128) -> tuple[float, int]:
    """(mean `loss`, examples) of `model` (inference mode) over the first AUTO_LOSS_SAMPLES
    examples of `data` (graphswap.research.data.data.Data)."""
    loss_fn = keras.losses.get(loss) if isinstance(loss, str) else loss
    total, count = 0.0, 0
    with translate_errors(data):
        for x, y in data.as_dataset(batch_size, feed=True):
            value = np.asarray(loss_fn(y, model(x, training=False)), dtype=np.float64)
            n = int(np.shape(keras.tree.flatten(x)[0])[0])  # x: an array or {input name: array}
            total += float(value.mean()) * n
            count += n
            if count >= AUTO_LOSS_SAMPLES:
                break
    if count == 0:
        raise DataError("the training data produced no batches")
    return total / count, count


def loss_name(loss) -> str:
    """A loss's name: the string itself, a Keras loss object's `name`, a function's name."""
    if isinstance(loss, str):
        return loss
    return getattr(loss, "name", None) or getattr(loss, "__name__", None) or type(loss).__name__


def auto_learning_rate(model, data, loss, batch_size: int = 128,
                       offset: float = 0.0, reference=None) -> tuple[float, str]:
    """(learning rate, note) for learning_rate="auto": FITTED_LEARNING_RATE when `model`'s
    start_training_loss (less `offset`: for distillation the targets' own entropy, so that what
    is compared is the KL divergence to the teacher) is at most FITTED_LOSS, CLOSE_LEARNING_RATE
    when it is at most FITTED_RATIO x the loss of `reference` (the original float model) on the
    same examples, else UNFITTED_LEARNING_RATE; losses other than cross-entropies (whose scale the threshold does
    not fit) get UNFITTED_LEARNING_RATE."""
    names = [loss_name(item) for item in (loss if isinstance(loss, (list, tuple)) else [loss])]
    name = ", ".join(names)
    if not all("crossentropy" in item.lower().replace("_", "") for item in names):
        return UNFITTED_LEARNING_RATE, (
            f"learning rate auto: {UNFITTED_LEARNING_RATE:g} (the loss {name} is not a "
            f"cross-entropy, whose scale the automatic choice is measured for)")
    if len(names) > 1:
        return UNFITTED_LEARNING_RATE, (
            f"learning rate auto: {UNFITTED_LEARNING_RATE:g} (a model of several outputs; the "
            f"automatic choice is measured for one)")
    mean, count = start_training_loss(model, data, loss, batch_size)
    mean -= offset
    threshold, against = FITTED_LOSS, f"{FITTED_LOSS:g}"
    rate = FITTED_LEARNING_RATE
    if reference is not None and mean > FITTED_LOSS:
        original, _ = start_training_loss(reference, data, loss, batch_size)
        # the float model lowered from a weight-tuned one is not the original: one that does
        # not fit (loss above half of chance's, ln of the classes) is no yardstick
        classes = max(int(reference.outputs[0].shape[-1] or 2), 2)
        if original <= 0.5 * np.log(classes) and FITTED_RATIO * original > threshold:
            threshold, rate = FITTED_RATIO * original, CLOSE_LEARNING_RATE
            against = f"{FITTED_RATIO:g} x the original float model's {original:.4f}"
    fitted = mean <= threshold
    rate = rate if fitted else UNFITTED_LEARNING_RATE
    reason = ("the model still fits its training data" if fitted else
              "the products cost the model its fit")
    what = "distillation loss less the targets' entropy" if offset else "training loss"
    return rate, (f"learning rate auto: {rate:g} ({what} {mean:.4f} at the start on "
                  f"{count} examples, {'<=' if fitted else '>'} {against}: {reason})")


def make_optimizer(optimizer, learning_rate, schedule: str = "constant", steps: int | None = None):
    """The fine-tuning optimizer: `optimizer` (a name or a Keras optimizer, used as is), with
    `learning_rate` constant or decayed by a cosine to 0 over `steps` training steps."""
    learning_rate_over = SCHEDULE_METHODS[schedule]
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return optimizer
    try:
        opt = keras.optimizers.get(optimizer)
    except ValueError as exc:
        raise GraphswapError(f"unknown optimizer {optimizer!r}: {exc}") from None
    if learning_rate is None:
        return opt
    rate = learning_rate_over(learning_rate, steps)
    return type(opt).from_config({**opt.get_config(), "learning_rate": rate})


#: the learning rate of each schedule (graphswap.methods.SCHEDULE_REGISTRY):
#: function(learning_rate, steps or None) -> a rate or a Keras LearningRateSchedule
SCHEDULE_METHODS = Implementations(SCHEDULE_REGISTRY)
schedule_method = SCHEDULE_METHODS.register


@schedule_method("constant")
def constant_rate(learning_rate, steps):
    return learning_rate


@schedule_method("cosine")
def cosine_rate(learning_rate, steps):
    """Decayed by a cosine to 0 over `steps` (constant when the steps are not known)."""
    if not steps:
        return learning_rate
    return keras.optimizers.schedules.CosineDecay(float(learning_rate), int(steps))


REWRITE_OPTIONS = ("quantization", "calibration_data", "calibration_samples", "calibration_method",
                   "calibration_source", "bias_correction", "recalibrate_bn", "fold_batchnorm",
                   "weight_tuning", "operands", "dynamic_fallback")


def prepared_rewrite_options(options, model, resize: bool = False, pad: bool = False,
                             scale=None) -> dict:
    """rewrite_model's quantization/calibration/folding keyword arguments from `options` (a dict
    with keys REWRITE_OPTIONS), with a calibration data source (.npz, image folder, ...) read
    into arrays for `model` (fitted and scaled like the evaluation data)."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(REWRITE_OPTIONS))
    if unknown:
        raise GraphswapError(f"unknown rewrite option(s) {', '.join(unknown)}; allowed: "
                             f"{', '.join(REWRITE_OPTIONS)}")
    source = options.get("calibration_data")
    if source is not None and not isinstance(source, (np.ndarray, list, tuple)):
        samples = options.get("calibration_samples", DEFAULT_CALIBRATION_SAMPLES)
        # the examples beyond those calibrated on are the zero-step check's (swap.fallback)
        options["calibration_data"] = calibration_arrays(source, model, samples + CHECK_SAMPLES,
                                                         resize=resize,
                                                         pad=pad, scale=scale)
    return options


def original_float_model(model, data):
    """The float model a swapped `model` was made from, for judging its start: its swapped layers
    lowered back to stock ones and - BatchNorm statistics having been re-estimated for the
    approximate arithmetic - re-estimated again in float on `data`; None without swapped
    layers."""
    original, lowered = lower_model(model)
    if not lowered:
        return None
    if has_batchnorm(original):
        recalibrate_batchnorm(original, data)
    return original
