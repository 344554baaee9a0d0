"""The device path under Keras's JAX backend, for machines with JAX (and CUDA) but no
TensorFlow: graphswap/kernels/device_products.py's table-driven products compiled by jax.jit on
whatever device JAX finds, against the float model's products in the same run.

* the table MAC rate of lut_matmul (quantize + exact integer sums + dequantize) and of the
  float32 matmul of the same shapes;
* ResNet-8 (MLPerf Tiny's CIFAR-10 network, BatchNorm folded into biases) and LeNet-5 built from
  the module's functions: inference and one SGD training step (straight-through gradients: the
  float product's, as graphswap's native backward) with every convolution and Dense product
  through the mul8u_drum4 table, against the same networks in float32.

TensorFlow is never imported (run it where it is not installed).  Prints the device, the path
and every figure; --quick for a short run.

    python benchmarks/bench_device_jax.py [--quick] [--batch N] [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("JAX_ENABLE_X64", "1")   # the quantization arithmetic is float64

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from _timing import cpu_model, print_step_ratios  # noqa: E402
from keras import ops  # noqa: E402

from graphswap.kernels import device_products as dp  # noqa: E402
from graphswap.multipliers import builtin  # noqa: E402
from graphswap.native import conv_geometry  # noqa: E402

MULTIPLIER = "mul8u_drum4"


class UnsignedDefaultScheme:
    """graphswap's default scheme for an unsigned multiplier: sign-magnitude weights, per-channel
    scales, activations quantized per call (QuantScheme().resolve(False)'s fields)."""
    activations = "dynamic"
    activation_range = None
    granularity = "per_channel"
    weights = "sign_magnitude"


def timed(fn, repeats: int) -> float:
    """Median seconds of fn() after one warm-up call (which compiles)."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def table_rates(m, k, n, repeats, table):
    rng = np.random.default_rng(0)
    a = jax.device_put(rng.normal(size=(m, k)).astype(np.float32))
    b = jax.device_put(rng.normal(size=(k, n)).astype(np.float32))
    lut = jax.jit(lambda a, b: dp.lut_matmul(a, b, table, False, UnsignedDefaultScheme))
    exact = jax.jit(lambda a, b: ops.matmul(a, b))
    check_against_c(np.asarray(a), np.asarray(b), np.asarray(lut(a, b)))
    macs = m * k * n
    print(f"\ntable MAC rate, ({m} x {k}) x ({k} x {n}) = {macs / 1e6:.1f} M MACs")
    for name, fn in (("lut_matmul (quantize + table sums + dequantize)", lambda: lut(a, b)),
                     ("float32 matmul", lambda: exact(a, b))):
        seconds = timed(fn, repeats)
        print(f"  {name:<52s} {seconds * 1e3:9.2f} ms  {macs / seconds:10.3e} MAC/s")


def check_against_c(a, b, got):
    """Bit for bit against graphswap's C kernel where its library loads (this checkout built)."""
    try:
        from graphswap.kernels import QuantScheme, resolve_kernel
        kernel = resolve_kernel(MULTIPLIER)
        expected = kernel.matmul(a, b, quant=kernel.resolve_scheme(QuantScheme()))
    except Exception as exc:  # noqa: BLE001 - no C library on this machine: say so, go on
        print(f"  (not checked against the C kernel: {type(exc).__name__}: {exc})")
        return
    np.testing.assert_array_equal(got, expected)
    print("  lut_matmul equals the C kernel bit for bit on these operands")


# -- networks as functions of their parameters: conv(x, w, b, strides, padding), dense -------------

def conv_layer(lut_table):
    def conv(x, w, bias, stride, padding):
        exact = ops.conv(x, w, strides=stride, padding=padding) + bias
        if lut_table is None:
            return exact
        geometry = conv_geometry(x.shape, w.shape, (stride, stride), (1, 1), padding)
        lut = dp.lut_conv2d(x, w, lut_table, False, UnsignedDefaultScheme, geometry) + bias
        # forward: the table's products; backward: the float product's (straight-through)
        return exact + jax.lax.stop_gradient(lut - exact)
    return conv


def dense_layer(lut_table):
    def dense(x, w, bias):
        exact = ops.matmul(x, w) + bias
        if lut_table is None:
            return exact
        lut = dp.lut_matmul(x, w, lut_table, False, UnsignedDefaultScheme) + bias
        return exact + jax.lax.stop_gradient(lut - exact)
    return dense


def resnet8(rng):
    """MLPerf Tiny ResNet-8 (CIFAR-10): parameters and forward(params, x, table)."""
    def conv_params(kh, cin, cout):
        return [rng.normal(0, (2 / (kh * kh * cin)) ** 0.5, (kh, kh, cin, cout)).astype(np.float32),
                np.zeros(cout, np.float32)]
    params = [conv_params(3, 3, 16)]
    cin = 16
    for filters in (16, 32, 64):
        params += [conv_params(3, cin, filters), conv_params(3, filters, filters)]
        if filters != cin:
            params.append(conv_params(1, cin, filters))
        cin = filters
    params.append([rng.normal(0, 0.1, (64, 10)).astype(np.float32), np.zeros(10, np.float32)])

    def forward(params, x, table):
        conv, dense = conv_layer(table), dense_layer(table)
        it = iter(params)
        x = ops.relu(conv(x, *next(it), 1, "same"))
        cin = 16
        for filters, stride in ((16, 1), (32, 2), (64, 2)):
            y = ops.relu(conv(x, *next(it), stride, "same"))
            y = conv(y, *next(it), 1, "same")
            if filters != cin:
                x = conv(x, *next(it), stride, "valid")
            x = ops.relu(x + y)
            cin = filters
        return dense(ops.mean(x, axis=(1, 2)), *next(it))
    return params, forward, (32, 32, 3)


def lenet5(rng):
    params = [[rng.normal(0, 0.2, s).astype(np.float32), np.zeros(s[-1], np.float32)]
              for s in ((5, 5, 1, 6), (5, 5, 6, 16))]
    params += [[rng.normal(0, 0.1, s).astype(np.float32), np.zeros(s[-1], np.float32)]
               for s in ((400, 120), (120, 84), (84, 10))]

    def forward(params, x, table):
        conv, dense = conv_layer(table), dense_layer(table)
        x = ops.average_pool(ops.relu(conv(x, *params[0], 1, "same")), 2, 2)
        x = ops.average_pool(ops.relu(conv(x, *params[1], 1, "valid")), 2, 2)
        x = ops.reshape(x, (x.shape[0], -1))
        x = ops.relu(dense(x, *params[2]))
        x = ops.relu(dense(x, *params[3]))
        return dense(x, *params[4])
    return params, forward, (28, 28, 1)


def model_rows(name, build, batch, repeats, table):
    rng = np.random.default_rng(1)
    params, forward, shape = build(rng)
    params = jax.device_put(params)
    x = jax.device_put(rng.uniform(0, 1, (batch, *shape)).astype(np.float32))
    labels = jax.device_put(np.arange(batch) % 10)
    print(f"\n{name}, batch {batch} (every convolution and Dense product on {MULTIPLIER})")
    results = {}
    for label, lut in (("float32", None), ("table-driven (device path)", table)):
        infer = jax.jit(lambda p, x, lut=lut: forward(p, x, lut))

        def loss(p, x, y, lut=lut):
            logits = forward(p, x, lut)
            return ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits,
                                                                         from_logits=True))

        @jax.jit
        def step(p, x, y, loss=loss):
            value, grads = jax.value_and_grad(loss)(p, x, y)
            return value, jax.tree_util.tree_map(lambda w, g: w - 0.01 * g, p, grads)

        results[label] = (timed(lambda: infer(params, x), repeats),
                          timed(lambda: step(params, x, labels), repeats))
    print_step_ratios(results, "float32")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    repeats = args.repeats or (2 if args.quick else 5)
    batch = args.batch or (16 if args.quick else 128)
    device = jax.devices()[0]
    print(f"device: {device.platform} ({device.device_kind}); CPU {cpu_model()} "
          f"({os.cpu_count()} cores); JAX {jax.__version__}, Keras {keras.__version__} "
          f"({keras.backend.backend()} backend); TensorFlow "
          f"{'imported' if sys.modules.get('tensorflow') is not None else 'not imported'}")
    print("path: graphswap/kernels/device_products.py under jax.jit (Keras's JAX backend)")
    table = np.asarray(builtin(MULTIPLIER).table)
    if args.quick:
        table_rates(256, 256, 64, repeats, table)
    else:
        table_rates(1024, 1152, 128, repeats, table)
    for name, build in (("LeNet-5", lenet5), ("ResNet-8", resnet8)):
        model_rows(name, build, batch, repeats, table)


if __name__ == "__main__":
    main()
