#!/usr/bin/env python
"""Three more fine-tuning techniques measured on the MLPerf Tiny ResNet-8 with real CIFAR-10,
against the command line's `finetune --epochs 3` (ft:default).

Same material, split and scoring as benchmarks/recovery_cifar.py (whose helpers this imports):
2,805 training images (calibration and training only), 1,000 held-out images scored by
`graphswap evaluate`.  Every technique spends 3 training epochs, as ft:default does, unless its
name says otherwise.

Techniques (rows):
  default       convert --calibrate train.npz (the CLI default; zero training)
  ft:default    finetune default.keras --data train.npz --epochs 3 (the baseline to beat)
  progressive   the multiplier introduced in 3 stages, in network order (conv2d..conv2d_2, then
                ..conv2d_5, then the rest): each stage is the CLI default `convert --kernel-map`
                of the float weights trained so far (the layers not yet introduced run exact
                float arithmetic) then `finetune --epochs 1`
  noise         the *float* model trained 3 epochs with Gaussian noise added to each weight
                layer's product in training mode only, per-channel std = the measured std of
                (approximate - float) product of that layer (per-channel mean removed: bias
                compensation removes it), then the CLI default convert (zero-step)
  noise+ft1     noise, then finetune --epochs 1 (4 epochs in all)
  lsq           float fine-tuning (3 epochs) with 8-bit fake quantization as graphswap
                quantizes (inputs: range initialised from the default conversion's calibrated
                range, times a trainable exp(log-scale); weights: per channel, sign-magnitude
                / symmetric) starting from the float weights; then the trained weights and
                learned ranges are written into the default conversion (its wiring kept),
                weight tuning redone if it had kept it, bias compensation and BatchNorm
                re-estimated (zero-step after that)
  lsq+noise     lsq with the noise of `noise` as well

    python benchmarks/recovery_techniques.py --multipliers /work/evoapprox --work /tmp/tech \
        --only mul8u_13QR,mul8s_1KR3
Results are cached in WORK/techniques.json (a rerun computes only what is missing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import REPO, run_context  # noqa: E402
from recovery_cifar import (EVOAPPROX, ZERO_STEP, accuracy, graphswap,  # noqa: E402
                            split_data, zero_step)

TECHNIQUES = ("default", "ft:default", "progressive", "noise", "noise+ft1", "lsq", "lsq+noise")
EPOCHS = 3
# Weight layers in network order, split into thirds for progressive introduction.
STAGES = (("conv2d", "conv2d_1", "conv2d_2"),
          ("conv2d_3", "conv2d_4", "conv2d_5"),
          ("conv2d_6", "conv2d_7", "conv2d_8", "dense"))
# Float training (noise, lsq) uses the rate `--lr auto` picks for a model that does not fit its
# data yet: the noisy / fake-quantized model is such a model, though its noise-free inference
# loss (what auto measures) is the float model's.
FLOAT_TRAINING_LR = 1e-3
NOISE_SAMPLES = 256


# -- helpers shared by the techniques -----------------------------------------------------------

def load_xy(path: Path):
    data = np.load(path)
    return data["x"].astype(np.float32), data["y"].reshape(-1).astype(np.int64)


def weight_layer_names() -> list[str]:
    return [name for stage in STAGES for name in stage]


def copy_weights(source, target) -> None:
    """Copy the Keras weights of every layer of `source` into the layer of the same name in
    `target`.  A swapped layer's weights are exactly the stock layer's (kernel, bias: the float
    weights trained straight-through), so this moves weights between float and swapped models;
    extra variables of the training layers below (ranges) are skipped."""
    for layer in source.layers:
        weights = layer.get_weights()
        if not weights:
            continue
        other = target.get_layer(layer.name)
        if isinstance(other, TrainingLayer) or isinstance(layer, TrainingLayer):
            other.kernel.assign(layer.kernel)
            if layer.use_bias:
                other.bias.assign(layer.bias)
        else:
            other.set_weights(weights)


def load_float(source: Path):
    import keras

    return keras.models.load_model(source)   # compiled: keeps the saved loss for the CLI


# -- progressive introduction -------------------------------------------------------------------

def progressive(source, kernel, train, work, env) -> Path:
    """Stage k: the float weights trained so far, converted by the CLI default with the
    multiplier on the layers of stages 1..k (the others exact float), fine-tuned 1 epoch.  The
    float weights carried to the next stage are the fine-tuned model's kernel/bias (trained
    straight-through from the weight-tuned values, when the conversion kept weight tuning) and
    BatchNorm weights; the next stage's conversion re-derives ranges, wiring, weight tuning,
    bias compensation and BatchNorm statistics from them, as `convert` does for any float
    model - nothing else of the swapped state is carried."""
    stem = Path(kernel).stem
    current = Path(source)
    introduced = []
    for index, stage in enumerate(STAGES, 1):
        introduced += stage
        kernel_map = work / f"{stem}_progressive_map{index}.json"
        kernel_map.write_text(json.dumps({name: str(kernel) for name in introduced}))
        converted = work / f"{stem}_progressive{index}.keras"
        graphswap("convert", current, "--kernel-map", kernel_map, "--calibrate", train,
                  "-o", converted, "--force", env=env)
        tuned = work / f"{stem}_progressive{index}_ft.keras"
        graphswap("finetune", converted, "--data", train, "--epochs", 1, "-o", tuned,
                  "--force", env=env)
        if index < len(STAGES):
            current = float_copy(source, tuned, work / f"{stem}_progressive{index}_float.keras")
    return tuned


def float_copy(source, swapped_path: Path, output: Path) -> Path:
    """The float model with the weights of the swapped model at `swapped_path`, saved."""
    import graphswap as gs

    model = load_float(source)
    copy_weights(gs.load_model(swapped_path), model)
    model.save(output)
    return output


# -- noise injection and learned ranges: float training layers ----------------------------------

def training_layer_classes():
    """Conv2D / Dense subclasses that compute their product in float, optionally with 8-bit
    fake quantization of input and weights (graphswap's encodings) and Gaussian noise on the
    product in training mode.  Built lazily so that TensorFlow loads only when needed."""
    import keras
    import tensorflow as tf

    class Mixin(TrainingLayer):
        spec: dict = {}

        def build(self, input_shape):
            super().build(input_shape)
            if self.spec.get("range") is not None:
                # the range as calibrated times exp(a trainable log-scale): Adam moves a raw
                # bound by about the learning rate per step whatever its size (the first
                # layer's is 255, the others' 1 to 6), a log-scale by the same fraction of each
                # - LSQ scales its step-size gradient for the same reason
                self.log_scale = self.add_weight(shape=(2,), name="log_scale",
                                                 initializer="zeros")

        def _bounds(self):
            lo, hi = self.spec["range"]
            if self.spec["signed"]:   # symmetric: one bound, the larger magnitude
                bound = max(abs(lo), abs(hi)) * tf.exp(self.log_scale[1])
                return -bound, bound
            return lo * tf.exp(self.log_scale[0]), hi * tf.exp(self.log_scale[1])

        def learned_range(self):
            lo, hi = self.spec["range"]
            scale = np.exp(self.log_scale.numpy())
            if self.spec["signed"]:   # keep the calibrated range's shape, scaled
                return lo * float(scale[1]), hi * float(scale[1])
            return lo * float(scale[0]), hi * float(scale[1])

        def _fake_quant(self, x, kernel):
            # the input: asymmetric 0..255 (unsigned multipliers) or symmetric -127..127
            lo, hi = self._bounds()
            x = tf.quantization.fake_quant_with_min_max_vars(
                x, lo, hi, num_bits=8, narrow_range=bool(self.spec["signed"]))
            # weights, per output channel (last axis), scale from max |w|: sign-magnitude
            # magnitudes 0..255 = 9-bit narrow range; symmetric int8 = 8-bit narrow range
            flat = tf.reshape(kernel, (-1, kernel.shape[-1]))
            top = tf.stop_gradient(tf.maximum(tf.reduce_max(tf.abs(flat), axis=0), 1e-8))
            kernel = tf.quantization.fake_quant_with_min_max_vars_per_channel(
                kernel, -top, top, num_bits=8 if self.spec["signed"] else 9, narrow_range=True)
            return x, kernel

        def call(self, inputs, training=None):
            x, kernel = inputs, self.kernel
            if self.spec.get("range") is not None:
                x, kernel = self._fake_quant(x, kernel)
            y = self.product(x, kernel)
            if training and self.spec.get("noise") is not None:
                y = y + tf.random.normal(tf.shape(y)) * self.spec["noise"]
            if self.use_bias:
                y = y + self.bias
            return self.activation(y)

    class TrainingConv2D(Mixin, keras.layers.Conv2D):
        def product(self, x, kernel):
            return self.convolution_op(x, kernel)

    class TrainingDense(Mixin, keras.layers.Dense):
        def product(self, x, kernel):
            return tf.matmul(x, kernel)

    return {keras.layers.Conv2D: TrainingConv2D, keras.layers.Dense: TrainingDense}


class TrainingLayer:
    """Marker of the layers training_layer_classes() builds."""


def training_model(float_model, specs: dict):
    """A copy of `float_model` whose weight layers named in `specs` are training layers with
    that spec ({"noise": per-channel std or None, "range": (lo, hi) or None, "signed": bool})."""
    import keras

    classes = training_layer_classes()

    def clone(layer):
        cls = classes.get(type(layer)) if layer.name in specs else None
        if cls is None:
            return layer.__class__.from_config(layer.get_config())
        new = cls.from_config(layer.get_config())
        new.spec = specs[layer.name]
        return new

    model = keras.models.clone_model(float_model, clone_function=clone)
    copy_weights(float_model, model)
    return model


def measure_noise(float_model, swapped, x) -> dict:
    """{layer: per-channel std of (approximate - float) product}, each layer given the same
    input: the swapped model's own input to it (the layers before it approximate).  The float
    product uses the float model's weights, so any weight tuning counts as error; the
    per-channel mean is removed (bias compensation removes it)."""
    import keras

    names = weight_layer_names()
    probe = keras.Model(swapped.inputs, [swapped.get_layer(n).input for n in names])
    inputs = probe.predict(x, batch_size=64, verbose=0)
    stds = {}
    for name, layer_input in zip(names, inputs):
        outputs = []
        for layer in (swapped.get_layer(name), float_model.get_layer(name)):
            activation, layer.activation = layer.activation, keras.activations.linear
            outputs.append(np.asarray(layer(layer_input)))   # the product + bias, no softmax
            layer.activation = activation
        error = (outputs[0] - outputs[1]).reshape(-1, outputs[0].shape[-1])
        stds[name] = (error - error.mean(axis=0)).std(axis=0).astype(np.float32)
    return stds


def train_float(model, train: Path, epochs: int, seed: int = 0):
    """The default recipe's schedule (batch 32, Adam decayed by a cosine to 0) on a float
    training model, at FLOAT_TRAINING_LR.  A plain Keras loop, not graphswap.finetune: that
    copies the model through get_config/from_config, which would drop the layers' spec (noise,
    ranges).  BatchNorm statistics are re-estimated by the conversion that follows."""
    import keras

    keras.utils.set_random_seed(seed)
    x, y = load_xy(train)
    steps = epochs * int(np.ceil(len(x) / 32))
    schedule = keras.optimizers.schedules.CosineDecay(FLOAT_TRAINING_LR, steps)
    model.compile(optimizer=keras.optimizers.Adam(schedule),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(x, y, batch_size=32, epochs=epochs, shuffle=True, verbose=0)
    # training-mode figures: with noise / fake quantization in the loop
    print(f"    float training: loss {history.history['loss'][0]:.3f} -> "
          f"{history.history['loss'][-1]:.3f}, accuracy {history.history['accuracy'][-1]:.3f}",
          flush=True)
    return model


def noise_trained(source, kernel, default_model: Path, train, work, env) -> Path:
    """The float model trained with measured per-channel product noise; saved as a plain float
    model for `convert`."""
    import graphswap as gs

    float_model = load_float(source)
    x, _ = load_xy(train)
    stds = measure_noise(float_model, gs.load_model(default_model), x[:NOISE_SAMPLES])
    print("    noise std (mean over channels): "
          + ", ".join(f"{n} {s.mean():.3g}" for n, s in stds.items()), flush=True)
    specs = {name: {"noise": std, "range": None, "signed": False} for name, std in stds.items()}
    trained = train_float(training_model(float_model, specs), train, EPOCHS)
    copy_weights(trained, float_model)
    output = work / f"{Path(kernel).stem}_noise_float.keras"
    float_model.save(output)
    return output


def lsq(source, kernel, default_model: Path, train, work, with_noise: bool) -> Path:
    """Learned activation ranges (module docstring); returns the swapped model written."""
    import graphswap as gs
    from graphswap.swap.compensation import (DEFAULT_COMPENSATION, compensate_bias,
                                             recalibrate_batchnorm)
    from graphswap.swap.weight_tuning import tune_weights

    swapped = gs.load_model(default_model)
    float_model = load_float(source)
    x, _ = load_xy(train)
    stds = measure_noise(float_model, swapped, x[:NOISE_SAMPLES]) if with_noise else {}
    # Start from the float weights, not the conversion's: weight tuning (when the conversion
    # kept it) stores codes chosen so that the *multiplier's* products match; trained under
    # exact fake quantization they would be pulled back to the untuned codes.  The tuning is
    # redone below, for the learned ranges.
    tuned = any(not np.array_equal(swapped.get_layer(n).get_weights()[0],
                                   float_model.get_layer(n).get_weights()[0])
                for n in weight_layer_names())
    specs = {}
    for name in weight_layer_names():
        layer = swapped.get_layer(name)
        specs[name] = {"noise": stds.get(name), "signed": bool(layer.arithmetic.signed),
                       "range": tuple(layer.current_quantization().activation_range)}
    trained = train_float(training_model(float_model, specs), train, EPOCHS)
    copy_weights(trained, swapped)
    for name in weight_layer_names():
        layer, learned = swapped.get_layer(name), trained.get_layer(name).learned_range()
        print(f"    {name} range {specs[name]['range']} -> "
              f"({learned[0]:.4g}, {learned[1]:.4g})", flush=True)
        layer.set_quantization(layer.current_quantization().with_range(*learned))
        layer.set_output_correction(None, None)   # recomputed below for the new ranges
    if tuned:
        print("    the conversion kept weight tuning: tuning the trained weights again",
              flush=True)
        tune_weights(swapped, x)
    compensate_bias(swapped, x, method=DEFAULT_COMPENSATION)
    recalibrate_batchnorm(swapped, x)
    output = work / f"{Path(kernel).stem}_{'lsq_noise' if with_noise else 'lsq'}.keras"
    swapped.save(output)
    return output


# -- the driver ----------------------------------------------------------------------------------

def measure(technique, source, kernel, train, test, work, env) -> float:
    stem = Path(kernel).stem
    default_model = work / f"{stem}_default.keras"
    if not default_model.exists():
        zero_step("default", ZERO_STEP["default"], source, kernel, train, work, env)
    if technique == "default":
        return accuracy(default_model, test, env)
    if technique == "ft:default":
        tuned = work / f"{stem}_default_ft.keras"
        if not tuned.exists():
            graphswap("finetune", default_model, "--data", train, "--epochs", EPOCHS, "-o",
                      tuned, "--force", env=env)
        return accuracy(tuned, test, env)
    if technique == "progressive":
        return accuracy(progressive(source, kernel, train, work, env), test, env)
    if technique in ("noise", "noise+ft1"):
        converted = work / f"{stem}_noise.keras"
        if not converted.exists():
            float_model = noise_trained(source, kernel, default_model, train, work, env)
            graphswap("convert", float_model, "--kernel", kernel, "--calibrate", train, "-o",
                      converted, "--force", env=env)
        if technique == "noise":
            return accuracy(converted, test, env)
        tuned = work / f"{stem}_noise_ft1.keras"
        graphswap("finetune", converted, "--data", train, "--epochs", 1, "-o", tuned,
                  "--force", env=env)
        return accuracy(tuned, test, env)
    if technique in ("lsq", "lsq+noise"):
        model = lsq(source, kernel, default_model, train, work, technique == "lsq+noise")
        return accuracy(model, test, env)
    raise ValueError(f"unknown technique {technique!r}")


def table(results: dict, techniques: list[str], kernels: list[str]) -> str:
    """Technique x multiplier: accuracy (difference to float / to ft:default)."""
    float_acc = results["float"]
    lines = ["| technique (epochs) | " + " | ".join(kernels) + " |",
             "|---|" + "---|" * len(kernels)]
    epochs = {"default": 0, "noise": 3, "noise+ft1": 4}
    for technique in techniques:
        cells = [f"{technique} ({epochs.get(technique, EPOCHS)})"]
        for name in kernels:
            value = results.get(name, {}).get(technique)
            base = results.get(name, {}).get("ft:default")
            if value is None:
                cells.append("-")
                continue
            versus = "" if base is None else f" / {value - base:+.1f} ft"
            cells.append(f"{value:.1f} ({value - float_acc:+.1f} float{versus})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    parser.add_argument("--multipliers", required=True, help="folder with EvoApproxLib's .c")
    parser.add_argument("--work", required=True, help="folder for data, models, results")
    parser.add_argument("--only", default="mul8u_13QR,mul8s_1KR3",
                        help="multipliers (comma-separated) [default: the two severe ones]")
    parser.add_argument("--techniques", default=",".join(TECHNIQUES))
    parser.add_argument("--test-size", type=int, default=1000)
    args = parser.parse_args()
    print(run_context())
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    names = args.only.split(",")
    kernels = {name: Path(args.multipliers).expanduser().resolve() / f"{name}.c"
               for name in names}
    unknown = set(names) - set(EVOAPPROX)
    if unknown:
        parser.error(f"unknown multipliers {sorted(unknown)}; known: {sorted(EVOAPPROX)}")
    # trust exactly these kernel files, for this process and the commands it runs
    os.environ["GRAPHSWAP_TRUSTED_KERNELS"] = os.pathsep.join(map(str, kernels.values()))
    os.environ.setdefault("GRAPHSWAP_CONFIG_DIR", str(work / "config"))
    env = dict(os.environ)
    train, test = split_data(Path(args.data_dir), work, args.test_size)
    source = Path(args.data_dir) / "mlperf_tiny_resnet8.h5"
    cache = work / "techniques.json"
    results = json.loads(cache.read_text()) if cache.exists() else {}
    if "float" not in results:
        results["float"] = accuracy(source, test, env)
    print(f"float: {results['float']:.1f}% on {args.test_size} held-out images", flush=True)
    techniques = args.techniques.split(",")
    for name, kernel in kernels.items():
        entry = results.setdefault(name, {})
        for technique in techniques:
            if technique in entry:
                continue
            started = time.perf_counter()
            entry[technique] = measure(technique, source, kernel, train, test, work, env)
            entry.setdefault("seconds", {})[technique] = round(time.perf_counter() - started)
            cache.write_text(json.dumps(results, indent=2))
            print(f"  {name} {technique}: {entry[technique]:.1f}% "
                  f"({entry['seconds'][technique]} s)", flush=True)
    print()
    print(f"test accuracy % on {args.test_size} held-out images (difference to float "
          f"{results['float']:.1f}% and to ft:default)")
    print(table(results, techniques, names))


if __name__ == "__main__":
    main()
