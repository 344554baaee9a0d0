"""The device path (graphswap/kernels/device_products.py) on whatever device TensorFlow finds: the
table MAC rate of its LUT matmul under XLA, the two exact formulations the module chose between
(look-ups in bounded blocks, against a one-hot decomposition into 256 GEMMs), and LeNet-5 /
ResNet-8 inference and one training step - the float model, the swapped model on the C path
(where the C path runs: the CPU) and the swapped model under XLA (the device path) - from one run.
Prints the device, the path and every figure; --quick for a short run (smaller sizes).

    python benchmarks/bench_device.py [--quick] [--batch N] [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _timing import cpu_model, print_step_ratios  # noqa: E402
from keras import ops  # noqa: E402

import graphswap  # noqa: E402
from graphswap.kernels import resolve_kernel  # noqa: E402
from graphswap.kernels import device_products as dp  # noqa: E402


def device_line() -> str:
    accelerators = [d.name for d in tf.config.list_logical_devices() if d.device_type != "CPU"]
    where = ", ".join(accelerators) if accelerators else "no GPU/TPU: the CPU"
    return (f"device: {where}; CPU {cpu_model()} ({os.cpu_count()} cores); TensorFlow "
            f"{tf.__version__}, Keras {keras.__version__} ({keras.backend.backend()} backend)")


def timed(fn, repeats: int) -> float:
    """Median seconds of fn() after one warm-up call (which compiles)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        if hasattr(out, "numpy"):
            out.numpy()
        elif isinstance(out, (list, tuple)) and out and hasattr(out[0], "numpy"):
            out[0].numpy()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def one_hot_sums(a_codes, b_codes, table):
    """The other exact formulation: c = sum_a (qa == a) @ T[a, qb] - 256 GEMMs (float64, exact
    for these integer sums), each (m, k) x (k, n)."""
    table = ops.convert_to_tensor(np.asarray(table, np.float64).reshape(256, 256))

    def step(code, acc):
        mask = ops.cast(ops.equal(a_codes, code), "float64")
        return acc + ops.matmul(mask, ops.take(ops.take(table, code, axis=0), b_codes))

    return ops.fori_loop(0, 256, step, ops.zeros((a_codes.shape[0], b_codes.shape[1]),
                                                "float64"))


def table_rates(m, k, n, repeats):
    kernel = resolve_kernel("mul8u_drum4")
    scheme = kernel.resolve_scheme(None)
    rng = np.random.default_rng(0)
    a = rng.normal(size=(m, k)).astype(np.float32)
    b = rng.normal(size=(k, n)).astype(np.float32)
    macs = m * k * n
    xla_path = tf.function(lambda a, b: dp.lut_matmul(a, b, kernel.multiplier.table, False,
                                                      scheme), jit_compile=True)
    np.testing.assert_array_equal(xla_path(a, b).numpy(), kernel.matmul(a, b, quant=scheme))
    qa = rng.integers(0, 256, (m, k)).astype(np.int32)
    qb = rng.integers(0, 256, (k, n)).astype(np.int32)
    blocks = tf.function(lambda qa, qb: dp.table_sums(
        qa[:, None, :] * 256, qb[None], dp.extended_table(kernel.multiplier.table, False),
        "int32"), jit_compile=True)
    one_hot = tf.function(lambda qa, qb: one_hot_sums(qa, qb, kernel.multiplier.table),
                          jit_compile=True)
    np.testing.assert_array_equal(blocks(qa, qb).numpy()[:, 0, :],
                                  one_hot(qa, qb).numpy().astype(np.int64))
    float_mm = tf.function(lambda a, b: tf.linalg.matmul(a, b), jit_compile=True)
    rows = [("XLA device path, lut_matmul (quantize + sums + dequantize)",
             timed(lambda: xla_path(a, b), repeats)),
            ("XLA, sums only: look-ups in bounded blocks (chosen)",
             timed(lambda: blocks(qa, qb), repeats)),
            ("XLA, sums only: one-hot into 256 float64 GEMMs",
             timed(lambda: one_hot(qa, qb), repeats)),
            ("C path, LutKernel.matmul (this CPU)",
             timed(lambda: kernel.matmul(a, b, quant=scheme), repeats)),
            ("float32 matmul under XLA", timed(lambda: float_mm(a, b), repeats))]
    print(f"\ntable MAC rate, ({m} x {k}) x ({k} x {n}) = {macs / 1e6:.1f} M MACs")
    for name, seconds in rows:
        print(f"  {name:<62s} {seconds * 1e3:9.2f} ms  {macs / seconds:10.3e} MAC/s")


def lenet5():
    inputs = keras.Input((28, 28, 1))
    x = keras.layers.Conv2D(6, 5, padding="same", activation="relu")(inputs)
    x = keras.layers.AveragePooling2D(2)(x)
    x = keras.layers.Conv2D(16, 5, activation="relu")(x)
    x = keras.layers.AveragePooling2D(2)(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(120, activation="relu")(x)
    x = keras.layers.Dense(84, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(x), name="lenet5")


def resnet8():
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(16, 3, padding="same", use_bias=False)(inputs)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
    for filters, stride in ((16, 1), (32, 2), (64, 2)):
        y = keras.layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
        y = keras.layers.ReLU()(keras.layers.BatchNormalization()(y))
        y = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(y)
        y = keras.layers.BatchNormalization()(y)
        if stride != 1 or x.shape[-1] != filters:
            x = keras.layers.Conv2D(filters, 1, strides=stride, use_bias=False)(x)
        x = keras.layers.ReLU()(keras.layers.Add()([x, y]))
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(x), name="resnet8")


def model_rows(build, batch, repeats):
    keras.utils.set_random_seed(0)
    model = build()
    shape = (batch, *model.input_shape[1:])
    x = np.random.default_rng(1).uniform(0, 1, shape).astype(np.float32)
    y = np.arange(batch) % 10
    swapped = graphswap.rewrite_model(model, kernel="mul8u_drum4")
    variants = [("float model, XLA", model, True), ("swapped, C path", swapped, False),
                ("swapped, XLA device path", swapped, True)]
    print(f"\n{model.name}, batch {batch} (kernel mul8u_drum4)")
    results = {}
    for name, net, jit in variants:
        infer = tf.function(lambda b, net=net: net(b, training=False), jit_compile=jit)
        optimizer = keras.optimizers.SGD(0.01)
        loss_fn = keras.losses.SparseCategoricalCrossentropy()

        @tf.function(jit_compile=jit)
        def step(b, labels, net=net, optimizer=optimizer, loss_fn=loss_fn):
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, net(b, training=True))
            grads = tape.gradient(loss, net.trainable_variables)
            optimizer.apply(grads, net.trainable_variables)
            return loss

        results[name] = (timed(lambda: infer(x), repeats), timed(lambda: step(x, y), repeats))
    print_step_ratios(results, "float model, XLA")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--models", default="lenet5,resnet8")
    args = parser.parse_args()
    repeats = args.repeats or (2 if args.quick else 5)
    batch = args.batch or (16 if args.quick else 128)
    print(device_line())
    print("path: graphswap/kernels/device_products.py under TensorFlow with XLA "
          "(tf.function(jit_compile=True)); the C path for comparison where it runs")
    if args.quick:
        table_rates(256, 256, 64, repeats)
    else:
        table_rates(1024, 1152, 128, repeats)
    builders = {"lenet5": lenet5, "resnet8": resnet8}
    for name in args.models.split(","):
        model_rows(builders[name], batch, repeats)


if __name__ == "__main__":
    main()
