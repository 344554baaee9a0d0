"""Swapped models and XLA (graphswap/swap/xla.py).  A layer whose kernel the device path covers
(multiplier tables, exact, bf16, fp32_m{m}) runs inside XLA; one it does not cover (a user's
operation-level library) never breaks a model compiled with jit_compile=True or "auto" - Keras
runs it without XLA after one warning - and a user's own tf.function(jit_compile=True) gets
graphswap's error naming the layer instead of TensorFlow's "No registered 'GraphswapForward'
OpKernel for XLA_CPU_JIT"; `convert` saves compile settings that reload and run in a fresh
process.  On a CPU-only machine Keras keeps covered layers out of XLA too (the C path is the CPU
default) unless GRAPHSWAP_BRIDGE=xla."""

from __future__ import annotations

import json
import warnings
import zipfile

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import assert_close_to_roundoff, compile_library, run_python

import graphswap
from graphswap.swap import xla
from graphswap.swap.xla import RunsOutsideXla, XlaCompilationError, model_runs_in_xla

JIT_WARNING = "doesn't support `jit_compile=True`"

USER_LIBRARY = """
    #include <stdint.h>
    #include "graphswap_kernels.h"
    GRAPHSWAP_EXPORT int32_t graphswap_abi_version(void) { return GRAPHSWAP_ABI_VERSION; }
    GRAPHSWAP_EXPORT int32_t graphswap_matmul_f32(const float *a, const float *b, float *c,
                                                 int64_t m, int64_t k, int64_t n) {
        for (int64_t i = 0; i < m; ++i) for (int64_t j = 0; j < n; ++j) {
            double s = 0; for (int64_t t = 0; t < k; ++t) s += (double)a[i * k + t] * b[t * n + j];
            c[i * n + j] = (float)s; }
        return 0; }
"""


@pytest.fixture
def user_library(tmp_path):
    """An operation-level float library of the user's (matmul only; trusted for the session):
    the kind of kernel the device path does not cover."""
    path = compile_library(tmp_path / "lib", "userops", USER_LIBRARY)
    graphswap.kernels.trust_file(str(path))
    return str(path)


def _classifier(jit_compile=True, seed=0):
    """A named-input conv + dense classifier, compiled as a GPU user's "auto" would resolve."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 1), name="pixels")
    x = keras.layers.Conv2D(4, 3, activation="relu", name="conv")(inputs)
    x = keras.layers.Flatten(name="flat")(x)
    x = keras.layers.Dense(8, activation="relu", name="hidden")(x)
    outputs = keras.layers.Dense(3, activation="softmax", name="out")(x)
    model = keras.Model(inputs, outputs, name="jit_classifier")
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], jit_compile=jit_compile)
    return model


def _data(n=32, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(0, 1, (n, 8, 8, 1)).astype(np.float32), rng.integers(0, 3, n)


def _every_type_model():
    """One model holding every swappable type graphswap's catalog had before the recurrent
    layers (each stock layer once)."""
    inputs = keras.Input((8, 8, 3), name="image")
    x = keras.layers.Conv2D(4, 3, padding="same", name="conv")(inputs)
    x = keras.layers.DepthwiseConv2D(3, padding="same", name="depthwise")(x)
    x = keras.layers.SeparableConv2D(4, 3, padding="same", name="separable")(x)
    x = keras.layers.Conv2DTranspose(4, 3, padding="same", name="transpose")(x)
    x = keras.layers.Reshape((64, 4), name="tokens")(x)
    x = keras.layers.Conv1D(4, 3, padding="same", name="conv1d")(x)
    x = keras.layers.MultiHeadAttention(2, 4, name="attention")(x, x)
    x = keras.layers.EinsumDense("btc,cd->btd", (64, 4), name="einsum")(x)
    x = keras.layers.Flatten(name="flat")(x)
    return keras.Model(inputs, keras.layers.Dense(3, name="out")(x))


def test_which_swapped_layers_support_xla_and_keras_runs_the_others_without_it(user_library,
                                                                               monkeypatch):
    model = _every_type_model()
    assert model_runs_in_xla(model)  # the stock model may be compiled by XLA
    for kernel in ("exact", "mul8u_drum4", "bf16"):  # covered by the device path
        covered = graphswap.rewrite_model(model, kernel=kernel)
        # Keras XLA-compiles them on accelerators; on a CPU-only machine the C path stays
        assert model_runs_in_xla(covered) is xla.accelerator_visible(), kernel
        monkeypatch.setenv("GRAPHSWAP_BRIDGE", "xla")   # unless the device path is asked for
        assert model_runs_in_xla(covered), kernel
        monkeypatch.delenv("GRAPHSWAP_BRIDGE")
    lut_grad = graphswap.rewrite_model(model, kernel="mul8u_drum4", backward="lut_grad",
                                       layer_types=["Dense"])
    assert model_runs_in_xla(lut_grad) is xla.accelerator_visible()
    monkeypatch.setenv("GRAPHSWAP_BRIDGE", "xla")
    assert model_runs_in_xla(lut_grad)   # its gradients run on the device path too
    monkeypatch.delenv("GRAPHSWAP_BRIDGE")
    swapped, report = graphswap.rewrite_model(model, kernel=user_library, return_report=True)
    swapped_layers = [layer for layer in swapped._flatten_layers()
                      if isinstance(layer, RunsOutsideXla)
                      and getattr(layer, "arithmetic", None) is not None]
    # every layer the report calls swapped (MHA's projections too) refuses XLA
    assert len(swapped_layers) >= sum(e.action == "swapped" for e in report.layers) >= 8
    for layer in swapped_layers:
        layer.supports_jit = True  # Keras's Layer.__init__ does this: the kernels decide
        assert layer.supports_jit is False, layer.name
    assert not model_runs_in_xla(swapped)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        swapped.compile(loss="mse", jit_compile=True)
    assert [str(w.message) for w in caught if JIT_WARNING in str(w.message)] and \
        swapped.jit_compile is False
    x = np.random.default_rng(1).uniform(0, 1, (4, 8, 8, 3)).astype(np.float32)
    reference = model.predict(x, verbose=0)
    assert_close_to_roundoff(swapped.predict(x, verbose=0), reference, terms=64 * 4 * 9)


def test_jit_compile_true_and_auto_run_predict_evaluate_fit(user_library):
    original = _classifier(jit_compile=True)
    x, y = _data()
    reference = original.predict(x, verbose=0)  # XLA on this CPU: jit_compile=True is explicit
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        swapped = graphswap.rewrite_model(original, kernel=user_library)
    # graphswap's own clone does not warn: it compiles the rewritten model without XLA
    assert not [w for w in caught if JIT_WARNING in str(w.message)]
    assert swapped.get_compile_config()["jit_compile"] is False
    assert swapped.get_compile_config()["loss"] == "sparse_categorical_crossentropy"
    assert_close_to_roundoff(swapped.predict(x, verbose=0), reference, terms=72)
    for setting, warns in ((True, True), ("auto", False)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            swapped.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                            metrics=["accuracy"], jit_compile=setting)
        notes = [str(w.message) for w in caught if JIT_WARNING in str(w.message)]
        assert len(notes) == (1 if warns else 0), notes  # one note, never an error
        assert swapped.jit_compile is False
        history = swapped.fit(x, y, epochs=1, batch_size=16, verbose=0)
        assert np.isfinite(history.history["loss"][0])
        loss, accuracy = swapped.evaluate(x, y, verbose=0)
        assert np.isfinite(loss) and 0.0 <= accuracy <= 1.0
        assert swapped.predict(x, verbose=0).shape == (32, 3)


def test_users_jit_compiled_function_raises_graphswaps_error(user_library):
    swapped = graphswap.rewrite_model(_classifier(jit_compile=False), kernel=user_library)
    x, _ = _data(4)

    @tf.function(jit_compile=True)
    def compiled(batch):
        return swapped(batch, training=False)

    with pytest.raises(XlaCompilationError, match=r"layer 'conv' cannot run inside "
                                                  r"tf.function\(jit_compile=True\).*without "
                                                  r"jit_compile") as error:
        compiled(x)
    assert isinstance(error.value, graphswap.GraphswapError)

    @tf.function  # the same function without XLA runs, and equals the eager call
    def traced(batch):
        return swapped(batch, training=False)

    np.testing.assert_array_equal(traced(x).numpy(), swapped(x, training=False).numpy())


def _saved_compile_config(path) -> dict:
    with zipfile.ZipFile(path) as archive:
        return json.loads(archive.read("config.json"))["compile_config"]


def test_converted_jit_model_reloads_and_trains_in_a_fresh_process(tmp_path):
    original = _classifier(jit_compile=True)
    path = tmp_path / "jit.keras"
    original.save(path)
    assert _saved_compile_config(path)["jit_compile"] is True
    x, y = _data()
    np.savez(tmp_path / "data.npz", x=x, y=y)
    expected = {}
    for kernel in ("exact", "mul8u_drum4"):
        out = tmp_path / f"jit.{kernel}.keras"
        result = graphswap.convert(str(path), kernel, output=str(out))
        assert any("jit_compile=False" in note for note in result.notes)
        assert "jit_compile=False" in result.format_text()
        assert _saved_compile_config(out)["jit_compile"] is False
        expected[kernel] = result.model.predict(x, verbose=0)
    # a file an older graphswap wrote, still asking for XLA: Keras's one warning, then it runs
    old = tmp_path / "old.keras"
    result.model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                         jit_compile=True)
    result.model.save(old)
    assert _saved_compile_config(old)["jit_compile"] is True
    np.save(tmp_path / "float.npy", original.predict(x, verbose=0))
    code = f"""
        import json, warnings
        import numpy as np
        import keras
        import graphswap
        data = np.load({str(tmp_path / 'data.npz')!r})
        report = {{}}
        for name in ("exact", "mul8u_drum4", "old"):
            path = {str(tmp_path)!r} + ("/old.keras" if name == "old" else f"/jit.{{name}}.keras")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model = keras.models.load_model(path)
                predictions = model.predict(data["x"], verbose=0)
                loss = model.evaluate(data["x"], data["y"], verbose=0)
                history = model.fit(data["x"], data["y"], epochs=1, batch_size=16, verbose=0)
            np.save({str(tmp_path)!r} + f"/{{name}}.npy", predictions)
            report[name] = {{"jit": model.jit_compile, "loss": np.ravel(loss).tolist(),
                            "fit": history.history["loss"],
                            "warnings": [str(w.message) for w in caught
                                         if {JIT_WARNING!r} in str(w.message)]}}
        print("REPORT " + json.dumps(report))
    """
    run = run_python(code, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.split("REPORT ", 1)[1])
    for name in ("exact", "mul8u_drum4", "old"):
        assert report[name]["jit"] is False
        assert np.all(np.isfinite(report[name]["loss"] + report[name]["fit"]))
        assert len(report[name]["warnings"]) == (1 if name == "old" else 0), report[name]
    assert "No registered 'GraphswapForward' OpKernel" not in run.stderr
    float_outputs = np.load(tmp_path / "float.npy")
    assert_close_to_roundoff(np.load(tmp_path / "exact.npy"), float_outputs, terms=72)
    np.testing.assert_array_equal(np.load(tmp_path / "mul8u_drum4.npy"), expected["mul8u_drum4"])
    np.testing.assert_array_equal(np.load(tmp_path / "old.npy"), expected["mul8u_drum4"])
    # the approximate kernel really ran: its outputs differ from the float model's
    assert np.max(np.abs(expected["mul8u_drum4"] - float_outputs)) > 1e-4
