"""Real models that take strings.

Layer state that is not a weight - a TextVectorization's vocabulary, a StringLookup's table, a
Normalization's adapted statistics - survives rewrite_model, saving, reloading and the SavedModel
export (graphswap/swap/layer_state.py); a copy that lost it is refused naming the layer.  String
data (.npz unicode arrays, .txt files) feeds convert --calibrate, evaluate and finetune
(graphswap/research/data/text_data.py), and convert's check of a string model runs on its calibration
data or on short texts of its own vocabulary (graphswap/swap/text_inputs.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner

import keras
from conftest import invoke_cli
from graphswap import rewrite_model
from graphswap.cli import main
from graphswap.errors import DataError, UnsupportedLayerError

VOCABULARY = 250
WORDS = [f"w{i}" for i in range(400)]


def _corpus(rng, count):
    return np.array([" ".join(rng.choice(WORDS, size=int(rng.integers(3, 15))))
                     for _ in range(count)])


def _text_model(corpus, labels):
    """TextVectorization(250 tokens, length 12) -> Embedding -> Conv1D -> pooling -> Dense x2."""
    vectorize = keras.layers.TextVectorization(max_tokens=VOCABULARY, output_sequence_length=12)
    vectorize.adapt(corpus)
    inputs = keras.Input(shape=(1,), dtype="string", name="text")
    x = vectorize(inputs)
    x = keras.layers.Embedding(VOCABULARY, 8)(x)
    x = keras.layers.Conv1D(8, 3, activation="relu")(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    x = keras.layers.Dense(16, activation="relu")(x)
    outputs = keras.layers.Dense(3, activation="softmax")(x)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    model.fit(tf.constant(corpus[:, None]), labels, epochs=1, batch_size=64, verbose=0)
    return model


@pytest.fixture(scope="module")
def text_files(tmp_path_factory):
    """(model path, data path, text file path, the model) of a small trained text classifier."""
    folder = tmp_path_factory.mktemp("text")
    rng = np.random.default_rng(0)
    corpus = _corpus(rng, 200)
    labels = np.array([len(text.split()) % 3 for text in corpus])
    model = _text_model(corpus, labels)
    assert model.layers[1].vocabulary_size() == VOCABULARY
    path = folder / "text.keras"
    model.save(path)
    data = folder / "data.npz"
    np.savez(data, x=corpus, y=labels)          # x: (N,) unicode strings, y: class indices
    lines = folder / "texts.txt"
    lines.write_text("\n".join(corpus[:40]) + "\n", encoding="utf-8")
    return path, data, lines, model



def _vocabulary_sizes(model):
    return [layer.vocabulary_size() for layer in model.layers
            if isinstance(layer, keras.layers.TextVectorization)]


def _texts(count=6, seed=1):
    return tf.constant(_corpus(np.random.default_rng(seed), count)[:, None])


@pytest.fixture(scope="module")
def converted(text_files):
    """`graphswap convert --calibrate data.npz --kernel mul8u_drum4` of the text model."""
    path, data, _, _ = text_files
    out = path.with_name("text.drum4.keras")
    output = invoke_cli("convert", path, "--calibrate", data, "--kernel", "mul8u_drum4", "-o", out)
    return out, output


# ---------------------------------------------------------------------------------------------
# item 2: state that is not a weight
# ---------------------------------------------------------------------------------------------

def test_rewrite_save_reload_keeps_the_vocabulary(text_files, tmp_path):
    _, _, _, model = text_files
    swapped = rewrite_model(model, kernel="exact")
    assert _vocabulary_sizes(swapped) == [VOCABULARY]
    assert swapped.layers[1].get_vocabulary() == model.layers[1].get_vocabulary()
    saved = tmp_path / "swapped.keras"
    swapped.save(saved)
    reloaded = keras.models.load_model(saved)
    assert _vocabulary_sizes(reloaded) == [VOCABULARY]
    x = _texts()
    reference = np.asarray(model(x))
    for candidate in (swapped, reloaded):   # exact kernel: the original to float32 round-off
        np.testing.assert_allclose(np.asarray(candidate(x)), reference, rtol=1e-5, atol=1e-6)


def test_a_clone_that_lost_its_vocabulary_is_refused(text_files, monkeypatch):
    from graphswap.swap import clone

    monkeypatch.setattr(clone, "copy_layer_state", lambda *args, **kwargs: None)
    with pytest.raises(UnsupportedLayerError, match="text_vectorization.*vocabulary"):
        rewrite_model(text_files[3], kernel="exact")


def _lookup_model():
    """Two inputs: tokens -> StringLookup -> Embedding; numbers -> Normalization, Discretization,
    Hashing -> CategoryEncoding; concatenated -> Dense -> Dense."""
    rng = np.random.default_rng(3)
    tokens = np.array([f"t{i}" for i in range(30)])
    lookup = keras.layers.StringLookup()
    lookup.adapt(rng.choice(tokens, 200))
    normalize = keras.layers.Normalization()
    normalize.adapt(rng.normal(5.0, 3.0, (200, 4)).astype("float32"))
    bins = keras.layers.Discretization(num_bins=4)
    bins.adapt(rng.normal(size=(200, 1)).astype("float32"))
    words = keras.Input(shape=(3,), dtype="string", name="tokens")
    numbers = keras.Input(shape=(4,), name="numbers")
    a = keras.layers.Flatten()(keras.layers.Embedding(lookup.vocabulary_size(), 4)(lookup(words)))
    hashed = keras.layers.CategoryEncoding(7, output_mode="multi_hot")(
        keras.layers.Hashing(7)(words))
    binned = keras.layers.CategoryEncoding(4, output_mode="multi_hot")(bins(numbers[:, :1]))
    x = keras.layers.Concatenate()([a, normalize(numbers), hashed, binned])
    x = keras.layers.Dense(8, activation="relu")(x)
    model = keras.Model([words, numbers], keras.layers.Dense(2)(x))
    batch = [tf.constant(rng.choice(tokens, (5, 3))),
             tf.constant(rng.normal(5.0, 3.0, (5, 4)).astype("float32"))]
    return model, batch


def test_string_lookup_and_normalization_survive_rewrite_save_and_export(tmp_path):
    model, batch = _lookup_model()
    reference = np.asarray(model(batch))
    path = tmp_path / "lookup.keras"
    model.save(path)
    swapped = rewrite_model(model, kernel="exact")
    lookup = next(l for l in swapped.layers if isinstance(l, keras.layers.StringLookup))
    assert lookup.vocabulary_size() == 31
    saved = tmp_path / "swapped.keras"
    swapped.save(saved)
    reloaded = keras.models.load_model(saved)
    for candidate in (swapped, reloaded):
        np.testing.assert_allclose(np.asarray(candidate(batch)), reference, rtol=1e-5,
                                   atol=1e-6)
    normalize = next(l for l in reloaded.layers if isinstance(l, keras.layers.Normalization))
    original = next(l for l in model.layers if isinstance(l, keras.layers.Normalization))
    np.testing.assert_array_equal(np.asarray(normalize.mean), np.asarray(original.mean))
    # convert's check on synthetic tokens of the lookup's vocabulary, then the SavedModel
    output = invoke_cli("convert", path, "--kernel", "exact", "-o", tmp_path / "c.keras")
    assert "cannot run" not in output and "max |original - rewritten|" in output
    invoke_cli("export", tmp_path / "c.keras", "--format", "savedmodel", "-o", tmp_path / "sm")
    served = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_default"]
    result = served(tokens=batch[0], numbers=batch[1])
    np.testing.assert_allclose(np.asarray(list(result.values())[0]), reference, rtol=1e-5,
                               atol=1e-6)


# ---------------------------------------------------------------------------------------------
# item 3: string data
# ---------------------------------------------------------------------------------------------

def test_convert_calibrates_the_layers_after_the_text_layer(converted):
    out, output = converted
    assert "calibrated static activation ranges of 3 layer(s)" in output
    assert "on the first 8 calibration examples" in output
    assert _vocabulary_sizes(keras.models.load_model(out)) == [VOCABULARY]


def test_convert_without_data_checks_on_texts_of_the_vocabulary(text_files, tmp_path):
    path = text_files[0]
    output = invoke_cli("convert", path, "--kernel", "exact", "-o", tmp_path / "exact.keras")
    assert "cannot run the original" not in output
    difference = float(output.split("random batch of 8: ")[1].split()[0])
    assert difference <= 1e-5
    reloaded = keras.models.load_model(tmp_path / "exact.keras")
    np.testing.assert_allclose(np.asarray(reloaded(_texts())),
                               np.asarray(text_files[3](_texts())), rtol=1e-5, atol=1e-6)


def test_convert_calibrates_on_a_text_file(text_files, tmp_path):
    path, _, lines, _ = text_files
    output = invoke_cli("convert", path, "--calibrate", lines, "--kernel", "mul8u_drum4",
                     "--calibration-samples", 32, "-o", tmp_path / "t.keras")
    assert "calibrated static activation ranges of 3 layer(s) on 32 samples" in output


def test_evaluate_on_strings(text_files):
    path, data, _, _ = text_files
    output = invoke_cli("evaluate", path, "--data", data, "--kernel", "exact", "--kernel",
                     "mul8u_drum4")
    rows = {line.split()[0]: line.split() for line in output.splitlines() if line.strip()}
    assert rows["exact"][2] == rows["original"][2]           # exact: the same accuracy
    assert rows["mul8u_drum4"][1] == "3"          # Conv1D, Dense, Dense swapped


def test_finetune_on_strings(converted, text_files, tmp_path):
    out = tmp_path / "tuned.keras"
    invoke_cli("finetune", converted[0], "--data", text_files[1], "--epochs", 1, "-o", out)
    assert _vocabulary_sizes(keras.models.load_model(out)) == [VOCABULARY]


def test_savedmodel_export_serves_strings(converted, text_files, tmp_path):
    from graphswap.io.load import load_model

    folder = tmp_path / "served"
    invoke_cli("export", converted[0], "--format", "savedmodel", "-o", folder)
    serve = tf.saved_model.load(str(folder)).signatures["serving_default"]
    x = _texts()
    result = serve(text=x)
    # the serving half is the model lowered to exact arithmetic: the original's outputs
    np.testing.assert_allclose(np.asarray(list(result.values())[0]),
                               np.asarray(text_files[3](x)), rtol=1e-5, atol=1e-6)
    assert _vocabulary_sizes(load_model(folder)) == [VOCABULARY]   # graphswap reopens it


def test_onnx_export_names_the_text_layer(converted, tmp_path):
    result = CliRunner().invoke(main, ["export", str(converted[0]), "--format", "onnx", "-o",
                                       str(tmp_path / "t.onnx")])
    assert result.exit_code != 0
    assert "'text_vectorization' (TextVectorization)" in result.output
    assert "--format savedmodel" in result.output


def test_string_data_is_checked(text_files):
    from graphswap.research import load_data

    model = text_files[3]
    texts = np.array(["w1 w2", "w3"], dtype=object)
    data = load_data((texts, np.array([0, 1])), model)
    assert data.x.shape == (2, 1) and data.x.dtype.kind == "U"
    with pytest.raises(DataError, match="takes strings"):
        load_data((np.zeros((2, 1), np.float32), np.array([0, 1])), model)
    with pytest.raises(DataError, match="input 1 is a int"):
        load_data((np.array(["w1", 3], dtype=object), np.array([0, 1])), model)
