"""Shared fixtures: the sample model and data, small models of every topology, user C libraries."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The tests' trust store lives in a directory of their own, never the user's ~/.config.
if "GRAPHSWAP_CONFIG_DIR" not in os.environ:
    import tempfile

    os.environ["GRAPHSWAP_CONFIG_DIR"] = tempfile.mkdtemp(prefix="graphswap-test-config-")
# Under pytest-xdist (`pytest -n auto`) each worker gets its own trust store and kernel cache:
# tests trust, untrust, plant and re-permission them, which must not reach another worker's test.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("GRAPHSWAP_CONFIG_DIR", "GRAPHSWAP_CACHE_DIR"):
        if os.environ.get(_name):
            _own = os.path.join(os.environ[_name], os.environ["PYTEST_XDIST_WORKER"])
            os.makedirs(_own, mode=0o700, exist_ok=True)
            os.environ[_name] = _own

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SAMPLE_MODEL = REPO / "sample_models" / "lenet5.keras"
SAMPLE_DATA = REPO / "sample_models" / "digits.npz"
HEADER_DIR = REPO / "native_kernels" / "include"


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per core this process may use, at most four (each worker holds a
    TensorFlow runtime and runs multi-threaded ops of its own)."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


@pytest.fixture(autouse=True)
def _fresh_session_trust():
    """Each test starts with nothing trusted for the session (as a new process would)."""
    from graphswap.kernels import trust as kernel_trust

    kernel_trust.clear_session_trust()
    yield


@pytest.fixture
def imshow_spy(monkeypatch):
    """What matplotlib's Axes.imshow is given ({"data", "extent"} of its last call); the image is
    still drawn."""
    import matplotlib.axes

    shown = {}
    original = matplotlib.axes.Axes.imshow

    def spy(self, data, *args, **kwargs):
        shown["data"], shown["extent"] = np.asarray(data), kwargs.get("extent")
        return original(self, data, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "imshow", spy)
    return shown


@pytest.fixture(scope="session")
def digits():
    with np.load(SAMPLE_DATA) as data:
        return {key: data[key] for key in data.files}


@pytest.fixture()
def lenet():
    return keras.models.load_model(SAMPLE_MODEL)


def load_sample_script():
    """sample_models/make_lenet5.py as a module (the architecture and data preparation)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_lenet5",
                                                  REPO / "sample_models" / "make_lenet5.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_nested_functional(seed: int = 0) -> keras.Model:
    """Two inputs, two outputs, a nested Sequential inside a nested Functional, a shared Dense."""
    keras.utils.set_random_seed(seed)
    inner_seq = keras.Sequential([
        keras.Input((8, 8, 3)),
        keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="inner_conv"),
        keras.layers.Conv2D(6, 3, strides=2, name="inner_conv_s2"),
    ], name="inner_seq")
    inner_in = keras.Input((8, 8, 3))
    inner_out = keras.layers.Flatten()(inner_seq(inner_in))
    inner_func = keras.Model(inner_in, keras.layers.Dense(5, activation="tanh", name="inner_dense")(
        inner_out), name="inner_func")
    image = keras.Input((8, 8, 3), name="image")
    vector = keras.Input((7,), name="vector")
    shared = keras.layers.Dense(5, name="shared_dense")
    a = shared(inner_func(image))
    b = shared(keras.layers.Dense(5, name="vec_dense")(vector))
    merged = keras.layers.Concatenate()([a, b])
    out1 = keras.layers.Dense(3, activation="softmax", name="head_a")(merged)
    out2 = keras.layers.Dense(1, name="head_b")(keras.layers.Add()([a, b]))
    return keras.Model([image, vector], [out1, out2], name="outer")


@pytest.fixture()
def nested_model():
    return build_nested_functional()


EPS32 = float(np.finfo(np.float32).eps)


def assert_close_to_roundoff(actual, desired, terms: int, factor: float = 8.0, magnitude=None):
    """Float32 results that may differ only by round-off in sums of `terms` products.

    Two correct implementations sum in different orders (TensorFlow's oneDNN blocks differently
    on AVX2 and AVX-512), so an element may differ by about sqrt(terms) * eps32 times the
    magnitude of what is summed; a real error (a wrong tap, padding or weight) is of the order of
    the values themselves.  The tolerance is factor * sqrt(terms) * eps32 * max|desired|, or
    with `magnitude` (sum_k |a_k||b_k| of each element, e.g. np.abs(a) @ np.abs(b), for sums
    that cancel) factor * sqrt(terms) * eps32 * magnitude, element by element.
    """
    actual = np.asarray(actual, dtype=np.float64)
    desired = np.asarray(desired, dtype=np.float64)
    assert actual.shape == desired.shape, f"shape {actual.shape} != {desired.shape}"
    if desired.size == 0:
        return
    bound = factor * np.sqrt(max(int(terms), 1)) * EPS32
    if magnitude is not None:  # element by element
        magnitude = np.broadcast_to(np.abs(np.asarray(magnitude, dtype=np.float64)), desired.shape)
        tolerance = bound * np.maximum(magnitude, np.finfo(np.float32).tiny)
        excess = np.abs(actual - desired) / tolerance
        worst = np.unravel_index(int(np.argmax(excess)), excess.shape)
        assert excess[worst] <= 1.0, (
            f"|difference| {abs(actual[worst] - desired[worst]):.3g} at {worst} exceeds the "
            f"float32 round-off bound {tolerance[worst]:.3g} ({factor} * sqrt({terms}) * eps32 * "
            f"sum|a||b| {magnitude[worst]:.3g})")
        return
    scale = max(float(np.max(np.abs(desired))), np.finfo(np.float32).tiny)
    tolerance = bound * scale
    difference = float(np.max(np.abs(actual - desired)))
    assert difference <= tolerance, (
        f"max |difference| {difference:.3g} exceeds the float32 round-off bound {tolerance:.3g} "
        f"({factor} * sqrt({terms}) * eps32 * max|desired| {scale:.3g})")


def is_key_bias(path: str) -> bool:
    """MultiHeadAttention's key-projection bias: it adds q . b_k to every score of query q, which
    the softmax over the keys cancels, so its gradient is zero up to round-off - two round-off
    noises, which no relative tolerance can compare (assert_key_bias_gradients_vanish)."""
    return path.endswith("key/bias")


def assert_key_bias_gradients_vanish(path: str, gradients, by_path: dict, terms: int,
                                     factor: float = 8.0):
    """The key-bias `gradients` (the swapped model's and the stock one's) are zero analytically:
    each within float32 round-off of sums of `terms` terms the size of the key kernel's gradient
    (`by_path[... "key/kernel"]`, the terms that cancel)."""
    cancelling = np.asarray(by_path[path.replace("key/bias", "key/kernel")])
    bound = factor * np.sqrt(max(int(terms), 1)) * EPS32 * float(np.max(np.abs(cancelling)))
    for gradient in gradients:
        worst = float(np.max(np.abs(gradient)))
        assert worst <= bound, (f"{path}: an analytically zero gradient reaches {worst:.3g}, "
                                f"beyond the round-off bound {bound:.3g}")


def reduction_terms(model) -> int:
    """Products summed along the longest path through `model`'s Dense/Conv2D layers (each
    layer's reduction length, added up): the `terms` of a whole-model output comparison, since
    every layer adds its own round-off and passes the earlier layers' on."""
    from graphswap.swap import iter_layers

    total = 0
    for _, layer in iter_layers(model):
        if isinstance(layer, (keras.layers.Dense, keras.layers.Conv2D)) and layer.weights:
            total += int(np.prod(layer.kernel.shape[:-1]))
    return max(total, 1)


def gradient_terms(model, batch: int) -> list[int]:
    """`terms` of each trainable weight's gradient (aligned with model.trainable_weights): it
    sums over the batch and every output position of its layer, on top of the forward pass's
    round-off."""
    from graphswap.swap import iter_layers

    forward = reduction_terms(model)
    by_weight = {}
    for _, layer in iter_layers(model):
        if isinstance(layer, keras.Model) or not layer.trainable_weights:
            continue
        positions = 1
        if isinstance(layer, keras.layers.Conv2D):
            try:
                shape = layer.output.shape
            except (AttributeError, ValueError):  # shared or never called: no single output
                shape = None
            if shape is not None and None not in shape[1:]:
                spatial = shape[1:-1] if layer.data_format == "channels_last" else shape[2:]
                positions = int(np.prod(spatial))
        for weight in layer.trainable_weights:
            by_weight[id(weight)] = forward + batch * positions
    return [by_weight.get(id(w), forward + batch) for w in model.trainable_weights]


# --------------------------------------------------------------------------------------------
# graphswap's own kernels on every instruction-set path the library reports
# --------------------------------------------------------------------------------------------

def library_isas(path=None) -> list[str]:
    """The instruction-set paths graphswap's shipped C kernels (or the library at `path`) can run
    on this CPU, as the library reports them (`const char *graphswap_isa_supported(void)`: a
    space-separated list such as "scalar avx2 avx512"; one is selected with GRAPHSWAP_ISA), or []
    for a library without run-time dispatch.
    """
    import ctypes

    from graphswap import native

    library = ctypes.CDLL(str(path or native.shipped_library_path()))
    report = getattr(library, "graphswap_isa_supported", None)
    if report is None:
        return []
    report.restype = ctypes.c_char_p
    report.argtypes = []
    return [name for name in (report() or b"").decode().replace(",", " ").split() if name]


def pytest_generate_tests(metafunc):
    """A test taking `kernel_isa` runs once per ISA path the library reports (GRAPHSWAP_ISA set
    for the subprocess it starts), or once with the default path (kernel_isa None) when the
    library reports none - never skipped."""
    if "kernel_isa" in metafunc.fixturenames:
        isas = library_isas() or [None]
        metafunc.parametrize("kernel_isa", isas, ids=[isa or "default-isa" for isa in isas])


@pytest.fixture
def each_isa():
    """graphswap's shipped library, for a test that switches its ISA path (set_isa) or its
    factored-table path (set_table_factoring); the paths in use before are restored afterwards."""
    from graphswap import native

    library = native.shipped_library()
    before = library.isa
    yield library
    library.set_isa(before)
    library.set_table_factoring(None)


def table_paths(library):
    """Switches `library` through every (ISA path, factoring on/off) this CPU runs and yields
    each as a label: tests of the table kernels run them on tables that factor too."""
    for isa in library.supported_isas:
        for factoring in (True, False):
            library.set_isa(isa)
            library.set_table_factoring(factoring)
            yield f"{isa}{'' if factoring else ' (table kernels)'}"


def tensorflow_runs_nchw_conv_on_cpu() -> bool:
    """Whether this TensorFlow build runs channels_first Conv2D on the CPU (oneDNN builds on
    some CPUs do, others refuse): tests probe it instead of assuming either."""
    import tensorflow as tf

    try:
        with tf.device("/CPU:0"):
            tf.nn.conv2d(tf.ones((1, 1, 3, 3)), tf.ones((1, 1, 1, 1)), 1, "VALID",
                         data_format="NCHW").numpy()
        return True
    except (tf.errors.UnimplementedError, tf.errors.InvalidArgumentError):
        return False


_CPU_PROBES = {}


def tensorflow_runs_on_cpu(op: str) -> bool:
    """Whether this TensorFlow build runs `op` on the CPU: "unequal-stride depthwise"
    (DepthwiseConv2dNative with strides (2, 1)) or "dilated conv_transpose"
    (Conv2DBackpropInput with dilations 2).  Builds without oneDNN on some CPUs (an AVX2-only
    EPYC) refuse both; tests probe once instead of assuming either, and compare with an
    independent reference where the stock op does not run."""
    import tensorflow as tf

    if op not in _CPU_PROBES:
        probes = {
            "unequal-stride depthwise": lambda: tf.nn.depthwise_conv2d(
                tf.ones((1, 4, 4, 1)), tf.ones((2, 2, 1, 1)), [1, 2, 1, 1], "VALID"),
            "dilated conv_transpose": lambda: tf.nn.conv2d_transpose(
                tf.ones((1, 3, 3, 1)), tf.ones((2, 2, 1, 1)), (1, 3, 3, 1), 1, "SAME",
                dilations=2),
        }
        try:
            with tf.device("/CPU:0"):
                probes[op]().numpy()
            _CPU_PROBES[op] = True
        except (tf.errors.UnimplementedError, tf.errors.InvalidArgumentError):
            _CPU_PROBES[op] = False
    return _CPU_PROBES[op]


def compile_library(tmp_path: Path, name: str, source: str) -> Path:
    """Compile a small C library against graphswap_kernels.h into tmp_path."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    src = tmp_path / f"{name}.c"
    src.write_text(textwrap.dedent(source))
    out = tmp_path / f"lib{name}.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", f"-I{HEADER_DIR}", str(src), "-o", str(out)],
                   check=True, capture_output=True)
    return out


FAILING_MATMUL = """
    #include "graphswap_kernels.h"
    GRAPHSWAP_EXPORT int32_t graphswap_abi_version(void) { return GRAPHSWAP_ABI_VERSION; }
    GRAPHSWAP_EXPORT const char *graphswap_last_error(void) { return "MESSAGE"; }
    GRAPHSWAP_EXPORT int32_t graphswap_matmul_f32(const float *a, const float *b, float *c,
                                                  int64_t m, int64_t k, int64_t n) {
        (void)a; (void)b; (void)c; (void)m; (void)k; (void)n;
        return CODE;
    }
"""


def failing_matmul_library(tmp_path: Path, name: str, code: str, message: str) -> Path:
    """An operation-level library whose graphswap_matmul_f32 fails with `code` (a GRAPHSWAP_ERR_*
    name) and whose graphswap_last_error says `message`."""
    return compile_library(tmp_path, name,
                           FAILING_MATMUL.replace("CODE", code).replace("MESSAGE", message))


def run_python(code: str, timeout: int = 600, env=None) -> subprocess.CompletedProcess:
    """Run Python code in a fresh interpreter (for device setup that must precede TF init)."""
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    import graphswap

    package_root = str(Path(graphswap.__file__).resolve().parent.parent)
    full_env["PYTHONPATH"] = os.pathsep.join(
        [package_root] + ([full_env["PYTHONPATH"]] if full_env.get("PYTHONPATH") else []))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=full_env, cwd=str(REPO))


# --------------------------------------------------------------------------------------------
# helpers shared by several test modules
# --------------------------------------------------------------------------------------------

MATMUL_ONLY_LIBRARY = """
    #include "graphswap_kernels.h"
    GRAPHSWAP_EXPORT int32_t graphswap_abi_version(void) { return GRAPHSWAP_ABI_VERSION; }
    /* a user's op-level library: plain triple loop, no conv entry point */
    GRAPHSWAP_EXPORT int32_t graphswap_matmul_f32(const float *a, const float *b, float *c,
                                                  int64_t m, int64_t k, int64_t n) {
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double s = 0;
                for (int64_t p = 0; p < k; p++) s += (double)a[i * k + p] * b[p * n + j];
                c[i * n + j] = (float)s;
            }
        return GRAPHSWAP_OK;
    }
"""


def tf_keras_lenet(weights_from=None):
    """sample_models' LeNet-5 built with tf_keras (Keras 2), optionally with a Keras 3 model's
    weights copied layer by layer."""
    import tf_keras

    layers = tf_keras.layers
    model = tf_keras.Sequential([
        tf_keras.Input((32, 32, 1), name="pixels"),
        layers.Rescaling(1.0 / 255.0, name="rescale"),
        layers.Conv2D(6, 5, activation="relu", name="conv1"),
        layers.MaxPooling2D(2, name="pool1"),
        layers.Conv2D(16, 5, activation="relu", name="conv2"),
        layers.MaxPooling2D(2, name="pool2"),
        layers.Flatten(name="flatten"),
        layers.Dense(120, activation="relu", name="fc1"),
        layers.Dense(84, activation="relu", name="fc2"),
        layers.Dense(10, activation="softmax", name="predictions"),
    ], name="lenet5_k2")
    if weights_from is not None:
        for target in model.layers:
            target.set_weights(weights_from.get_layer(target.name).get_weights())
    return model


def small_model(compiled=True, softmax=True, seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((6, 6, 1), name="pixels"),
        keras.layers.Conv2D(3, 3, activation="relu", name="conv"),
        keras.layers.Flatten(name="flat"),
        keras.layers.Dense(3, activation="softmax" if softmax else None, name="out"),
    ], name="small")
    if compiled:
        model.compile(loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def small_data(n=48, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = rng.normal(size=(n, 6, 6, 1)).astype(np.float32) * 0.3
    x[:, 1:5, 1:5, 0] += y[:, None, None] - 1.0  # learnable: the class shifts the centre
    return x, y


def assert_same_gradients(model_a, model_b, x) -> None:
    """The two models' weight gradients of sum(output ** 2) on `x` are equal bit for bit."""
    import tensorflow as tf

    def gradients(model):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x) ** 2)
        return tape.gradient(loss, model.trainable_weights)

    for got, want in zip(gradients(model_a), gradients(model_b)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def invoke_cli(*args, code: int = 0) -> str:
    """Run the graphswap command line with `args` (str() of each), assert its exit code, and
    return what it printed (exceptions propagate: a traceback names the failing line)."""
    from click.testing import CliRunner

    from graphswap.cli import main

    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == code, result.output[-3000:]
    return result.output


def json_report(output: str):
    """The JSON document a `--json` command printed (after any note lines)."""
    import json

    return json.JSONDecoder().raw_decode(output[output.index("{"):])[0]


def one_error_line(result) -> str:
    """The one `Error:` line of a CliRunner result that must have failed with exit code 1 and no
    traceback."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and "unexpected" not in result.output, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, result.output
    return lines[0]


def tree_snapshot(root: Path) -> dict:
    """{relative path: what it is} for everything under `root`, links not followed: link targets,
    folder inodes, files' SHA-256 and inodes - a deleted, rewritten or replaced entry changes it."""
    import hashlib
    import stat

    found = {}
    for parent, folders, files in os.walk(root):
        for name in folders + files:
            path = Path(parent) / name
            info = os.lstat(path)
            key = str(path.relative_to(root))
            if stat.S_ISLNK(info.st_mode):
                found[key] = ("link", os.readlink(path), info.st_ino)
            elif stat.S_ISDIR(info.st_mode):
                found[key] = ("dir", None, info.st_ino)
            else:
                found[key] = ("file", hashlib.sha256(path.read_bytes()).hexdigest(), info.st_ino)
    return found
