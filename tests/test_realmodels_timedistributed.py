"""Real models: a video model's TimeDistributed layers and a text model of any length.

- TimeDistributed: in a video classifier (Input((T, H, W, C)) -> TimeDistributed(Conv2D) ->
  TimeDistributed(MaxPool) -> TimeDistributed(Flatten) -> LSTM -> Dense) the wrapped layer is
  swapped (graphswap.swap.layers_wrapped: the timesteps folded into one kernel call; kept, it
  would leave 73% of the weight MACs, 99.6% at a real video size, in float), calibrated and
  compensated through its inner layer, saved and reloaded, exported (lowered ONNX, kept-kernel
  ONNX, SavedModel) and counted as timesteps x the wrapped layer's MACs.
- Variable-length inputs: `convert` of Input((None,)) tokens -> Embedding -> Bidirectional(GRU)
  -> Dense works without data (a check batch needs every dimension), both exports work, and the
  BiGRU's MACs are counted: free dimensions take a length (the data's, `--sequence-length N`,
  else 16), stated in the report with the MACs counted at it.

Fixtures are built here the way users write them (Keras 3 `.keras`; the video model also as a
tf_keras `.h5`), tiny so that each command runs in seconds.
"""

from __future__ import annotations

import json
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import assert_close_to_roundoff, invoke_cli, json_report
from graphswap import io as gsio
from graphswap.io import onnx_ops
from graphswap.swap import SwappedTimeDistributed, rewrite_model

STEPS, SIZE, CHANNELS, FILTERS = 4, 8, 3, 4
#: one TimeDistributed(Conv2D) step: 6 x 6 positions x 4 filters x 3 x 3 x 3 taps
CONV_STEP_MACS = 6 * 6 * FILTERS * 27
VOCABULARY, EMBED, UNITS = 50, 8, 6
#: one Bidirectional(GRU) step: two directions x (input + units) x 3 gates x units
BIGRU_STEP_MACS = 2 * (EMBED + UNITS) * 3 * UNITS
#: round-off terms: a step's conv sums, the LSTM's 4 steps x (inputs + units)
TERMS = 1024


def video_model(k, steps=STEPS):
    inputs = k.Input((steps, SIZE, SIZE, CHANNELS), name="frames")
    # the wrapped layer named: an automatic name ("conv2d_7") depends on what the process built
    x = k.layers.TimeDistributed(k.layers.Conv2D(FILTERS, 3, activation="relu", name="conv"),
                                 name="frame_conv")(inputs)
    x = k.layers.TimeDistributed(k.layers.MaxPooling2D(2), name="frame_pool")(x)
    x = k.layers.TimeDistributed(k.layers.Flatten(), name="frame_flat")(x)
    x = k.layers.LSTM(8, name="lstm")(x)
    outputs = k.layers.Dense(3, activation="softmax", name="head")(x)
    model = k.Model(inputs, outputs, name="video")
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


def text_model():
    inputs = keras.Input((None,), name="tokens")
    x = keras.layers.Embedding(VOCABULARY, EMBED, name="embed")(inputs)
    x = keras.layers.Bidirectional(keras.layers.GRU(UNITS), name="bigru")(x)
    outputs = keras.layers.Dense(2, activation="softmax", name="head")(x)
    model = keras.Model(inputs, outputs, name="text")
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("timedistributed")
    rng = np.random.default_rng(0)
    keras.utils.set_random_seed(0)
    video = video_model(keras)
    video.save(root / "video.keras")
    x = rng.uniform(0, 1, (32, STEPS, SIZE, SIZE, CHANNELS)).astype(np.float32)
    np.savez(root / "video.npz", x=x, y=rng.integers(0, 3, 32))
    text = text_model()
    text.save(root / "text.keras")
    tokens = rng.integers(0, VOCABULARY, (32, 12)).astype(np.float32)
    np.savez(root / "text.npz", x=tokens, y=rng.integers(0, 2, 32))
    return {"root": root, "video": root / "video.keras", "video_data": root / "video.npz",
            "video_x": x, "video_out": np.asarray(video(x, training=False)),
            "text": root / "text.keras", "text_data": root / "text.npz", "tokens": tokens}




def _entry(report, path):
    (entry,) = [e for e in report["layers"] if e["path"] == path]
    return entry


def _outputs(model, x):
    return np.asarray(model(x, training=False))


# -- 7. TimeDistributed ----------------------------------------------------------------------------

def test_video_convert_exact_swaps_time_distributed_and_equals_the_original(files, tmp_path):
    out = tmp_path / "video.exact.keras"
    report = json_report(invoke_cli("convert", files["video"], "--kernel", "exact", "-o", out,
                                    "--json"))
    conv = _entry(report, "frame_conv")
    assert conv["action"] == "swapped" and conv["kernel"] == "exact"
    assert conv["macs"] == STEPS * CONV_STEP_MACS
    assert _entry(report, "frame_pool")["action"] == "kept"
    model = gsio.load_model(out)
    assert isinstance(model.get_layer("frame_conv"), SwappedTimeDistributed)
    assert_close_to_roundoff(_outputs(model, files["video_x"]), files["video_out"], TERMS)


def test_video_convert_multiplier_puts_every_weight_mac_on_the_kernel(files, tmp_path):
    out = tmp_path / "video.drum.keras"
    output = invoke_cli("convert", files["video"], "--kernel", "mul8u_drum4", "-o", out)
    assert "3 of 3 layers with weights swapped; 100.0% of" in output
    report = json_report(invoke_cli("convert", files["video"], "--kernel", "mul8u_drum4", "-o", out,
                           "--force", "--json"))
    assert report["macs"]["kernel"] == report["macs"]["total"] > STEPS * CONV_STEP_MACS
    assert report["macs"]["by_type"]["TimeDistributed"]["kernel_macs"] == STEPS * CONV_STEP_MACS
    assert report["macs"]["length"] is None   # every dimension known: no length assumed


def test_video_save_reload_equals_the_rewritten_model(files, tmp_path):
    original = keras.models.load_model(files["video"])
    swapped = rewrite_model(original, kernel="mul8u_drum4")
    path = tmp_path / "swapped.keras"
    swapped.save(path)
    x = files["video_x"][:8]
    expected = _outputs(swapped, x)
    for reloaded in (keras.models.load_model(path), gsio.load_model(path)):
        layer = reloaded.get_layer("frame_conv")
        assert isinstance(layer, SwappedTimeDistributed) and layer.arithmetic.spec == \
            "mul8u_drum4"
        np.testing.assert_array_equal(_outputs(reloaded, x), expected)


def test_video_calibrate_reaches_the_wrapped_layer(files, tmp_path):
    out = tmp_path / "video.calibrated.keras"
    output = invoke_cli("convert", files["video"], "--kernel", "mul8u_drum4", "--calibrate",
                     files["video_data"], "--no-dynamic-fallback", "-o", out)
    assert "frame_conv/conv [" in output          # its static range
    assert "frame_conv/conv (mean |offset|" in output   # its bias compensation
    assert "100.0% of" in output
    model = gsio.load_model(out)
    inner = model.get_layer("frame_conv").layer
    scheme = inner.current_quantization()
    assert scheme.activations == "static" and scheme.activation_range is not None
    assert inner.output_correction is not None
    x = files["video_x"][:8]
    difference = np.abs(_outputs(model, x) - files["video_out"][:8]).max()
    assert 0 < difference < 0.1


def test_video_exports_onnx_kept_and_savedmodel(files, tmp_path):
    import onnx
    import onnxruntime

    converted = tmp_path / "video.drum.keras"
    invoke_cli("convert", files["video"], "--kernel", "mul8u_drum4", "-o", converted)
    swapped = gsio.load_model(converted)
    x = files["video_x"][:8]

    lowered = tmp_path / "video.onnx"
    invoke_cli("export", converted, "-o", lowered)
    session = onnxruntime.InferenceSession(str(lowered), providers=["CPUExecutionProvider"])
    (actual,) = session.run(None, {session.get_inputs()[0].name: x})
    assert_close_to_roundoff(actual, files["video_out"][:8], TERMS)   # the exact-kernel model
    record = [r for r in gsio.read_metadata(lowered)["swapped_layers"]
              if r["layer"] == "frame_conv"]
    assert record and record[0]["type"] == "TimeDistributed"
    assert len(record[0]["onnx_nodes"]) == 1      # one Conv for all the timesteps

    kept = tmp_path / "video.kept.onnx"
    invoke_cli("export", converted, "--keep-kernels", "-o", kept)
    (actual,) = onnx_ops.session(kept).run(None, {"frames": x})
    np.testing.assert_allclose(actual, _outputs(swapped, x), atol=1e-5)
    nodes = {node.op_type for _, node in onnx_ops.walk_nodes(onnx.load(str(kept)))}
    assert onnx_ops.CONV2D_OP in nodes

    saved = tmp_path / "video_savedmodel"
    invoke_cli("export", converted, "--format", "savedmodel", "-o", saved)
    loaded = tf.saved_model.load(str(saved))
    (served,) = loaded.signatures["serving_default"](frames=tf.constant(x)).values()
    assert_close_to_roundoff(served.numpy(), files["video_out"][:8], TERMS)
    reopened = gsio.load_model(saved)
    assert isinstance(reopened.get_layer("frame_conv"), SwappedTimeDistributed)
    np.testing.assert_array_equal(_outputs(reopened, x), _outputs(swapped, x))


def test_video_of_any_length_converts_and_exports(tmp_path):
    import onnxruntime

    keras.utils.set_random_seed(1)
    model = video_model(keras, steps=None)
    path = tmp_path / "video_any.keras"
    model.save(path)
    report = json_report(invoke_cli("convert", path, "--kernel", "mul8u_drum4", "-o",
                           tmp_path / "any.drum.keras", "--json"))
    assert report["macs"]["length"] == 16
    assert _entry(report, "frame_conv")["macs"] == 16 * CONV_STEP_MACS
    assert report["macs"]["kernel"] == report["macs"]["total"]
    exact = tmp_path / "any.exact.keras"
    invoke_cli("convert", path, "--kernel", "exact", "-o", exact, "--sequence-length", "3")
    onnx_path = tmp_path / "any.onnx"
    invoke_cli("export", exact, "-o", onnx_path, "--sequence-length", "5")
    x = np.random.default_rng(2).uniform(0, 1, (2, 7, SIZE, SIZE, CHANNELS)).astype(np.float32)
    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    (actual,) = session.run(None, {"frames": x})
    assert_close_to_roundoff(actual, _outputs(model, x), TERMS)


def test_video_h5_from_tf_keras_converts_with_time_distributed_swapped(tmp_path):
    tf_keras = pytest.importorskip("tf_keras")
    tf_keras.utils.set_random_seed(3)
    model = video_model(tf_keras)
    path = tmp_path / "video.h5"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # "HDF5 is legacy": what users' files are
        model.save(str(path), save_format="h5")
    x = np.random.default_rng(3).uniform(0, 1, (4, STEPS, SIZE, SIZE, CHANNELS))
    x = x.astype(np.float32)
    expected = model(x, training=False).numpy()
    out = tmp_path / "video.h5.keras"
    report = json_report(invoke_cli("convert", path, "--kernel", "exact", "-o", out, "--json"))
    assert _entry(report, "frame_conv")["action"] == "swapped"
    assert report["macs"]["kernel"] == report["macs"]["total"]
    assert_close_to_roundoff(_outputs(gsio.load_model(out), x), expected, TERMS)


@keras.saving.register_keras_serializable(package="test_timedistributed")
class OwnDense(keras.layers.Dense):
    """A user's subclass of Dense (its own call() could compute anything): never swapped."""


def test_time_distributed_around_an_unswappable_layer_is_named():
    inputs = keras.Input((3, 5))
    x = keras.layers.TimeDistributed(keras.layers.BatchNormalization(), name="norm")(inputs)
    x = keras.layers.TimeDistributed(OwnDense(4), name="own")(x)
    x = keras.layers.TimeDistributed(keras.layers.Dense(2), name="fc")(x)
    _, report = rewrite_model(keras.Model(inputs, x), kernel="exact", return_report=True)
    entries = {e.path: e for e in report.layers}
    assert entries["norm"].action == "kept" and "BatchNormalization, which graphswap does not " \
        "swap" in entries["norm"].reason
    assert entries["own"].action == "kept" and "OwnDense" in entries["own"].reason
    assert entries["own"].macs == 3 * 5 * 4
    assert entries["fc"].action == "swapped" and entries["fc"].macs == 3 * 4 * 2


# -- 4. variable-length inputs ---------------------------------------------------------------------

def test_text_of_any_length_converts_without_data_and_counts_the_bigru(files, tmp_path):
    out = tmp_path / "text.drum.keras"
    output = invoke_cli("convert", files["text"], "--kernel", "mul8u_drum4", "-o", out)
    total = 16 * BIGRU_STEP_MACS + 2 * UNITS * 2
    assert f"100.0% of {total:,} MACs per sample at length 16 on the kernel" in output
    assert "random batch of 8 (free dimensions at length 16)" in output
    report = json_report(invoke_cli("convert", files["text"], "--kernel", "mul8u_drum4", "-o", out,
                           "--force", "--sequence-length", "5", "--json"))
    assert report["macs"]["length"] == 5
    assert _entry(report, "bigru")["macs"] == 5 * BIGRU_STEP_MACS
    assert report["macs"]["kernel"] == report["macs"]["total"]
    # with data the length is the data's
    report = json_report(invoke_cli("convert", files["text"], "--kernel", "mul8u_drum4",
                                    "--calibrate", files["text_data"], "-o", out, "--force",
                                    "--json"))
    assert report["macs"]["length"] == 12
    assert _entry(report, "bigru")["macs"] == 12 * BIGRU_STEP_MACS


def test_text_exact_convert_equals_the_original_and_reloads(files, tmp_path):
    out = tmp_path / "text.exact.keras"
    invoke_cli("convert", files["text"], "--kernel", "exact", "-o", out)
    original = keras.models.load_model(files["text"])
    converted = gsio.load_model(out)
    rng = np.random.default_rng(4)
    for length in (3, 12, 20):
        x = rng.integers(0, VOCABULARY, (4, length)).astype(np.float32)
        assert_close_to_roundoff(_outputs(converted, x), _outputs(original, x), TERMS)
        np.testing.assert_array_equal(_outputs(keras.models.load_model(out), x),
                                      _outputs(converted, x))


def test_text_exports_onnx_and_savedmodel_at_any_length(files, tmp_path):
    import onnxruntime

    converted = tmp_path / "text.drum.keras"
    invoke_cli("convert", files["text"], "--kernel", "mul8u_drum4", "-o", converted)
    original = keras.models.load_model(files["text"])
    x = np.random.default_rng(5).integers(0, VOCABULARY, (3, 20)).astype(np.float32)

    onnx_path = tmp_path / "text.onnx"
    output = invoke_cli("export", converted, "-o", onnx_path)
    assert "(free dimensions at length 16)" in output
    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    (actual,) = session.run(None, {"tokens": x})
    assert_close_to_roundoff(actual, _outputs(original, x), TERMS)

    saved = tmp_path / "text_savedmodel"
    invoke_cli("export", converted, "--format", "savedmodel", "-o", saved, "--sequence-length", "9")
    manifest = json.loads((saved / "assets" / "graphswap" / "manifest.json").read_text())
    assert manifest["consistency_check"]["sequence_length"] == 9
    loaded = tf.saved_model.load(str(saved))
    (served,) = loaded.signatures["serving_default"](tokens=tf.constant(x)).values()
    assert_close_to_roundoff(served.numpy(), _outputs(original, x), TERMS)
    reopened = gsio.load_model(saved)   # its consistency check runs at the recorded length
    np.testing.assert_array_equal(_outputs(reopened, x),
                                  _outputs(gsio.load_model(converted), x))
