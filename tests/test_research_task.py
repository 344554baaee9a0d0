"""One task description (graphswap.research.data.task) for every command: binary sigmoid classifiers
with (N,) and (N, 1) labels, class indices converted for a categorical loss, regression and
reconstruction (metrics against numpy), calibration from inputs alone, multi-output models,
--loss / --metrics overrides, and label-free fine-tuning by distillation (API and CLI)."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner

from graphswap.cli import main
from graphswap.errors import DataError, GraphswapError
from graphswap.research import evaluate, finetune, load_data, sweep
from graphswap.research.training.distillation import distillation_data, resolve_teacher
from graphswap.research.data.scoring import predict
from graphswap.research.data.task import derive_task
from graphswap.swap import rewrite_model

APPROXIMATE = "mul8u_drum4"
#: float products with a 2-bit mantissa: a large error, the same whatever the batch (the
#: distillation tests compare losses measured on other batches than training's)
COARSE = "fp32_m2"


def _rng(seed=0):
    return np.random.default_rng(seed)


def binary_model(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((6,), name="features"),
                              keras.layers.Dense(8, activation="relu", name="hidden"),
                              keras.layers.Dense(1, activation="sigmoid", name="out")],
                             name="binary")
    model.compile(loss="binary_crossentropy", metrics=["accuracy"])
    return model


def binary_data(n=40, seed=0):
    x = _rng(seed).normal(size=(n, 6)).astype(np.float32)
    return x, (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64)


def classifier(loss="categorical_crossentropy", seed=0, softmax=True):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((6,), name="features"),
                              keras.layers.Dense(8, activation="relu", name="hidden"),
                              keras.layers.Dense(3, activation="softmax" if softmax else None,
                                                 name="out")], name="classifier")
    if loss is not None:
        model.compile(loss=loss)
    return model


def regression_model(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((5,), name="features"),
                              keras.layers.Dense(12, activation="relu", name="hidden"),
                              keras.layers.Dense(3, name="out")], name="regressor")
    model.compile(loss="mse")
    return model


def regression_data(n=48, seed=0):
    rng = _rng(seed)
    x = rng.normal(size=(n, 5)).astype(np.float32)
    y = (x @ rng.normal(size=(5, 3)) + 0.1 * rng.normal(size=(n, 3))).astype(np.float32)
    return x, y


def autoencoder(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 1), name="image")
    h = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="enc")(inputs)
    h = keras.layers.MaxPooling2D(2, name="pool")(h)
    h = keras.layers.Conv2DTranspose(4, 3, strides=2, padding="same", activation="relu",
                                     name="dec")(h)
    outputs = keras.layers.Conv2D(1, 3, padding="same", activation="sigmoid", name="out")(h)
    model = keras.Model(inputs, outputs, name="autoencoder")
    model.compile(loss="mse")
    return model


def images(n=24, seed=0):
    rng = _rng(seed)
    x = np.zeros((n, 8, 8, 1), np.float32)
    for i in range(n):
        top, left = rng.integers(0, 5, 2)
        x[i, top:top + 3, left:left + 3, 0] = rng.uniform(0.5, 1.0)
    return x


def multi_output_model(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6,), name="features")
    hidden = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
    classes = keras.layers.Dense(3, activation="softmax", name="cls")(hidden)
    values = keras.layers.Dense(2, name="reg")(hidden)
    model = keras.Model(inputs, [classes, values], name="two_heads")
    model.compile(loss={"cls": "sparse_categorical_crossentropy", "reg": "mse"})
    return model


def saved(model, tmp_path, name=None):
    path = tmp_path / f"{name or model.name}.keras"
    model.save(path)
    return path


def invoke(args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result


# ----------------------------------------------------------------------------------------------
# binary classifiers
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", ["n", "n1"])
def test_binary_sigmoid_classifier_through_evaluate_and_finetune_with_lr_auto(shape, tmp_path):
    model = binary_model()
    x, y = binary_data()
    labels = y if shape == "n" else y[:, None]
    task = derive_task(model)
    assert task.kind == "binary" and task.score_metric == "accuracy"
    result = evaluate(model, (x, labels), [APPROXIMATE], batch_size=64)  # one batch
    probabilities = np.asarray(model(x))[:, 0]
    assert result.rows[0]["accuracy"] == pytest.approx(np.mean((probabilities > 0.5) == y))
    bce = -np.mean(y * np.log(probabilities) + (1 - y) * np.log(1 - probabilities))
    assert result.rows[0]["loss"] == pytest.approx(bce, rel=1e-4)
    swapped = rewrite_model(model, kernel=APPROXIMATE)
    approximate = np.asarray(swapped(x))[:, 0]
    assert result.rows[1]["accuracy"] == pytest.approx(np.mean((approximate > 0.5) == y))
    assert result.rows[1]["agreement"] == pytest.approx(
        np.mean((approximate > 0.5) == (probabilities > 0.5)))
    tuned = finetune(swapped, (x, labels), epochs=1, batch_size=8, learning_rate="auto",
                     verbose=0)
    assert any(note.startswith("learning rate auto:") and "training loss" in note
               for note in tuned.notes)
    assert tuned.epochs_run == [1] and "accuracy" in tuned.history
    # the CLI, from the file as saved, with labels of this shape in an .npz
    np.savez(tmp_path / "data.npz", x=x, y=labels)
    path = saved(model, tmp_path)
    out = invoke(["evaluate", path, "--data", tmp_path / "data.npz", "--json"])
    assert out.exit_code == 0, out.output
    payload = json.loads(out.output)
    assert payload["task"] == "binary"
    assert payload["rows"][0]["accuracy"] == pytest.approx(result.rows[0]["accuracy"])
    out = invoke(["finetune", path, "--data", tmp_path / "data.npz", "--epochs", "1",
                  "--batch-size", "8", "--lr", "auto", "-o", tmp_path / "ft.keras"])
    assert out.exit_code == 0, out.output
    assert (tmp_path / "ft.keras").is_file()


def test_binary_labels_outside_0_1_are_refused_with_the_task():
    model = binary_model()
    x, y = binary_data()
    with pytest.raises(DataError, match=r"labels range from 0 to 2, but a single sigmoid output "
                                        r"\(binary classifier\) take labels 0 and 1"):
        load_data((x, np.where(y == 1, 2, 0)), model)
    with pytest.raises(DataError, match=r"labels have shape \(40, 2\); expected 0/1 labels of "
                                        r"shape \(40,\) or \(40, 1\)"):
        load_data((x, np.zeros((40, 2))), model)


def test_tf_data_labels_follow_the_task():
    model = binary_model()
    x, y = binary_data()
    result = evaluate(model, tf.data.Dataset.from_tensor_slices((x, y)).batch(8), [],
                      batch_size=64)
    probabilities = np.asarray(model(x))[:, 0]
    assert result.rows[0]["accuracy"] == pytest.approx(np.mean((probabilities > 0.5) == y))
    with pytest.raises(DataError, match="sigmoid outputs take labels 0 and 1"):
        evaluate(model, tf.data.Dataset.from_tensor_slices((x, 2 * y)), [], batch_size=64)
    categorical = classifier("categorical_crossentropy")
    data = load_data(tf.data.Dataset.from_tensor_slices((x, y + 1)), categorical)
    assert data.label_format == "one_hot"
    np.testing.assert_array_equal(data.labels(), np.eye(3, dtype=np.float32)[y + 1])


# ----------------------------------------------------------------------------------------------
# class indices with a categorical loss, one-hot rows with a sparse one
# ----------------------------------------------------------------------------------------------

def test_class_indices_are_converted_to_one_hot_for_a_categorical_loss():
    model = classifier("categorical_crossentropy")
    x = _rng(1).normal(size=(30, 6)).astype(np.float32)
    y = _rng(2).integers(0, 3, 30)
    data = load_data((x, y), model)
    assert data.label_format == "one_hot"
    np.testing.assert_array_equal(data.labels(), np.eye(3, dtype=np.float32)[y])
    assert any("class indices converted to one-hot rows for the loss categorical_crossentropy"
               in note for note in data.notes)
    result = evaluate(model, (x, y), [], batch_size=16)
    outputs = np.asarray(model(x))
    assert result.rows[0]["accuracy"] == pytest.approx(np.mean(outputs.argmax(1) == y))
    cross_entropy = -np.mean(np.log(outputs[np.arange(30), y]))
    assert result.rows[0]["loss"] == pytest.approx(cross_entropy, rel=1e-4)
    tuned = finetune(rewrite_model(model, kernel="exact"), (x, y), epochs=1, batch_size=8,
                     verbose=0)
    assert tuned.epochs_run == [1]
    # and the other way round: exact one-hot rows for a sparse loss become indices
    sparse = classifier("sparse_categorical_crossentropy")
    data = load_data((x, np.eye(3)[y]), sparse)
    assert data.label_format == "sparse"
    np.testing.assert_array_equal(data.labels(), y)
    with pytest.raises(DataError, match="labels are soft rows .* pass --loss "
                                        "categorical_crossentropy"):
        load_data((x, np.full((30, 3), 1 / 3)), sparse)


# ----------------------------------------------------------------------------------------------
# regression and reconstruction
# ----------------------------------------------------------------------------------------------

def test_regression_mlp_calibrates_from_inputs_alone_evaluates_and_finetunes(tmp_path):
    model = regression_model()
    x, y = regression_data()
    path = saved(model, tmp_path)
    np.savez(tmp_path / "inputs.npz", x=x[:32])            # no labels: calibration only
    np.savez(tmp_path / "test.npz", x=x, y=y)
    task = derive_task(model)
    assert task.kind == "regression" and task.score_metric == "r2"
    out = invoke(["evaluate", path, "--data", tmp_path / "test.npz", "-k", APPROXIMATE,
                  "--calibrate", tmp_path / "inputs.npz", "--json"])
    assert out.exit_code == 0, out.output
    payload = json.loads(out.output)
    assert payload["task"] == "regression" and payload["score"] == "r2"
    original, approximate = payload["rows"]
    reference = np.asarray(model(x), np.float64)
    swapped = rewrite_model(model, kernel=APPROXIMATE, calibration_data=x[:32])  # the default recipe
    outputs = np.asarray(swapped(x), np.float64)
    for row, values in ((original, reference), (approximate, outputs)):
        error = values - y
        assert row["mse"] == pytest.approx(np.mean(error ** 2), rel=1e-5)
        assert row["mae"] == pytest.approx(np.mean(np.abs(error)), rel=1e-5)
        assert row["r2"] == pytest.approx(1 - np.sum(error ** 2) / np.sum((y - y.mean()) ** 2),
                                          rel=1e-5)
        assert row["loss"] == pytest.approx(np.mean(error ** 2), rel=1e-4)
    assert original["max_abs_diff"] == 0.0
    assert approximate["max_abs_diff"] == pytest.approx(np.max(np.abs(outputs - reference)),
                                                        rel=1e-5)
    assert approximate["max_abs_diff"] > 0
    assert "psnr" not in payload["rows"][0] or payload["rows"][0]["psnr"] is None
    # fine-tuning from the file: MSE, "auto" says why it picks 1e-3
    out = invoke(["finetune", path, "--data", tmp_path / "test.npz", "--epochs", "2",
                  "--batch-size", "8", "-o", tmp_path / "ft.keras"])
    assert out.exit_code == 0, out.output
    assert "learning rate auto: 0.001 (the loss mean_squared_error is not a cross-entropy" \
        in out.output
    tuned = keras.models.load_model(tmp_path / "ft.keras")
    assert derive_task(tuned).kind == "regression"


def test_conv_autoencoder_reconstructs_its_inputs_psnr_and_finetune(tmp_path):
    model = autoencoder()
    x = images()
    task = derive_task(model)
    assert task.kind == "reconstruction" and task.single.image
    np.savez(tmp_path / "x.npz", x=x)                      # inputs only: targets are x
    data = load_data(tmp_path / "x.npz", model)
    np.testing.assert_array_equal(data.labels(), x)
    result = evaluate(model, tmp_path / "x.npz", [APPROXIMATE], batch_size=8,
                      rewrite_options={"calibration_data": tmp_path / "x.npz"})
    reference = np.asarray(model(x), np.float64)
    mse = np.mean((reference - x) ** 2)
    peak = x.max() - x.min()
    row = result.rows[0]
    assert row["mse"] == pytest.approx(mse, rel=1e-5)
    assert row["psnr"] == pytest.approx(10 * np.log10(peak ** 2 / mse), rel=1e-5)
    swapped = rewrite_model(model, kernel=APPROXIMATE, calibration_data=x)  # the default recipe
    outputs = np.asarray(swapped(x), np.float64)
    assert result.rows[1]["max_abs_diff"] == pytest.approx(np.max(np.abs(outputs - reference)),
                                                           rel=1e-5)
    assert "PSNR (dB)" in result.format_table() and "max |diff|" in result.format_table()
    tuned = finetune(swapped, tmp_path / "x.npz", epochs=2, batch_size=8, learning_rate=1e-2,
                     verbose=0)
    assert tuned.history["loss"][-1] < tuned.history["loss"][0]


def test_sweep_of_a_regression_model_scores_r2(tmp_path):
    model = regression_model()
    x, y = regression_data()
    result = sweep(model, (x, y), APPROXIMATE, batch_size=64, max_accuracy_drop=0.5)
    assert result.score_name == "r2"
    reference = np.asarray(model(x), np.float64)
    r2 = 1 - np.sum((reference - y) ** 2) / np.sum((y - y.mean()) ** 2)
    assert result.baseline["score"] == pytest.approx(r2, rel=1e-5)
    for entry in result.layers:
        single = rewrite_model(model, kernel=None, kernel_map={entry["layer"]: APPROXIMATE})
        outputs = np.asarray(single(x), np.float64)
        expected = 1 - np.sum((outputs - y) ** 2) / np.sum((y - y.mean()) ** 2)
        assert entry["score"] == pytest.approx(expected, rel=1e-5)
        assert entry["score_drop"] == pytest.approx(r2 - expected, rel=1e-5, abs=1e-9)
    assert "r2" in result.format_table()
    # the CLI, from the file, with --metrics naming the score
    np.savez(tmp_path / "r.npz", x=x, y=y)
    out = invoke(["sweep", saved(model, tmp_path), "--data", tmp_path / "r.npz", "-k",
                  APPROXIMATE, "--batch-size", "64", "--metrics", "mae", "--max-drop", "50",
                  "-o", tmp_path / "map.json", "--json"])
    assert out.exit_code == 0, out.output
    payload = json.loads(out.output)
    assert payload["score"] == "mae"
    assert payload["baseline"]["score"] == pytest.approx(np.mean(np.abs(reference - y)),
                                                         rel=1e-5)
    for entry in payload["layers"]:   # mae: lower is better, the drop is its increase
        assert entry["score_drop"] == pytest.approx(entry["score"] - payload["baseline"]["score"],
                                                    abs=1e-9)


def test_labels_missing_for_a_classifier_say_what_to_do(tmp_path):
    np.savez(tmp_path / "x.npz", x=binary_data()[0])
    with pytest.raises(DataError, match=r"holds inputs but no labels; the model's task \(binary\) "
                                        r"needs them.*--teacher original"):
        load_data(tmp_path / "x.npz", binary_model())


# ----------------------------------------------------------------------------------------------
# several outputs
# ----------------------------------------------------------------------------------------------

def test_multi_output_model_labels_per_output_metrics_and_finetune(tmp_path):
    model = multi_output_model()
    rng = _rng(3)
    x = rng.normal(size=(32, 6)).astype(np.float32)
    classes = rng.integers(0, 3, 32)
    values = rng.normal(size=(32, 2)).astype(np.float32)
    task = derive_task(model)
    assert [o.kind for o in task.outputs] == ["multiclass", "regression"]
    np.savez(tmp_path / "two.npz", x=x, y_cls=classes, y_reg=values)
    for source in ((x, [classes, values]), (x, {"cls": classes, "reg": values}),
                   tmp_path / "two.npz"):
        result = evaluate(model, source, [], batch_size=8)
        row = result.rows[0]
        probabilities, predicted = (np.asarray(o) for o in model(x))
        assert row["cls/accuracy"] == pytest.approx(np.mean(probabilities.argmax(1) == classes))
        assert row["reg/mse"] == pytest.approx(np.mean((predicted - values) ** 2), rel=1e-5)
        assert row["loss"] == pytest.approx(row["cls/loss"] + row["reg/loss"])
    with pytest.raises(DataError, match="the model has 2 outputs"):
        load_data((x, classes), model)
    tuned = finetune(rewrite_model(model, kernel="exact"), (x, [classes, values]), epochs=1,
                     batch_size=8, verbose=0)
    assert tuned.epochs_run == [1]


# ----------------------------------------------------------------------------------------------
# --loss / --metrics
# ----------------------------------------------------------------------------------------------

def test_loss_and_metrics_overrides(tmp_path):
    plain = classifier(loss=None, softmax=False)     # no saved loss: multiclass on logits
    assert derive_task(plain).kind == "multiclass" and derive_task(plain).single.from_logits
    task = derive_task(plain, loss="mse", metrics="mae,r2")
    assert task.kind == "regression" and task.source == "--loss"
    assert task.score_metric == "mae" and not task.higher_is_better
    x, y = regression_data(seed=4)
    x = np.concatenate([x, x[:, :1]], axis=1)         # 6 features
    result = evaluate(plain, (x, y), [], batch_size=16, loss="mse", metrics=["mae", "r2"])
    outputs = np.asarray(plain(x), np.float64)
    assert result.rows[0]["mae"] == pytest.approx(np.mean(np.abs(outputs - y)), rel=1e-5)
    assert result.rows[0]["score"] == result.rows[0]["mae"]
    assert result.columns[3:6] == ("mae", "r2", "loss")
    with pytest.raises(GraphswapError, match="unknown loss 'msee'; allowed: "):
        derive_task(plain, loss="msee")
    with pytest.raises(GraphswapError, match="unknown metric.s. f1; allowed: accuracy"):
        derive_task(plain, metrics="accuracy,f1")
    np.savez(tmp_path / "r.npz", x=x, y=y)
    path = saved(plain, tmp_path)
    out = invoke(["evaluate", path, "--data", tmp_path / "r.npz", "--loss", "mse",
                  "--metrics", "mae,r2", "--json"])
    assert out.exit_code == 0, out.output
    payload = json.loads(out.output)
    assert payload["score"] == "mae" and payload["loss"] == "mse"
    assert payload["rows"][0]["mae"] == pytest.approx(result.rows[0]["mae"], rel=1e-6)
    out = invoke(["evaluate", path, "--data", tmp_path / "r.npz", "--loss", "msee"])
    assert out.exit_code == 1 and out.output.startswith("Error: unknown loss 'msee'")
    assert "Traceback" not in out.output
    out = invoke(["finetune", path, "--data", tmp_path / "r.npz", "--loss", "mse", "--metrics",
                  "mae", "--epochs", "1", "--batch-size", "16", "-o", tmp_path / "ft.keras"])
    assert out.exit_code == 0, out.output
    assert "compiled with the loss given by --loss: mse" in out.output
    # explore budgets a lower-is-better score as an allowed increase (test_explore_scores.py)
    (tmp_path / "power.csv").write_text(f"name,power\nexact,0.4\n{APPROXIMATE},0.2\n")
    out = invoke(["explore", path, "--data", tmp_path / "r.npz", "--library", APPROXIMATE,
                  "--metrics", tmp_path / "power.csv", "--budget", "1e6", "--loss", "mse",
                  "--task-metrics", "mse", "-o", tmp_path / "front.json"])
    assert out.exit_code == 0, out.output
    assert json.loads((tmp_path / "front.json").read_text())["score"] == "mse"


# ----------------------------------------------------------------------------------------------
# distillation
# ----------------------------------------------------------------------------------------------

def _kl_to_teacher(student, teacher, x):
    p = np.clip(np.asarray(teacher(x), np.float64), 1e-7, 1)
    q = np.clip(np.asarray(student(x), np.float64), 1e-7, 1)
    return float(np.mean(np.sum(p * (np.log(p) - np.log(q)), axis=1)))


def test_teacher_original_distillation_reduces_the_distillation_loss_without_labels():
    model = classifier("sparse_categorical_crossentropy", seed=5)
    x = _rng(5).normal(size=(64, 6)).astype(np.float32) * 2
    swapped = rewrite_model(model, kernel=COARSE)
    teacher, what = resolve_teacher("original", swapped)
    assert "original float model" in what
    # the lowered teacher computes what the float model computes
    np.testing.assert_allclose(np.asarray(teacher(x)), np.asarray(model(x)), rtol=1e-5,
                               atol=1e-6)
    before = _kl_to_teacher(swapped, model, x)
    assert before > 1e-4
    result = finetune(swapped, x, epochs=3, batch_size=16, learning_rate=1e-2,
                      teacher="original", verbose=0)
    after = _kl_to_teacher(result.model, model, x)
    assert after < 0.5 * before
    assert set(result.history) >= {"loss", "agreement"}
    assert any(note.startswith("distillation: the model learns to reproduce the original")
               for note in result.notes)
    # the saved compile settings are the task's again, not the distillation loss
    assert derive_task(result.model).single.target == "indices"
    # --lr auto compares the KL divergence to the teacher (the loss less the targets' entropy)
    auto = finetune(swapped, x, epochs=1, batch_size=16, teacher="original", verbose=0)
    note = next(n for n in auto.notes if n.startswith("learning rate auto:"))
    assert "distillation loss less the targets' entropy" in note and "on 64 examples" in note
    measured = float(note.split("entropy ")[1].split()[0])
    assert measured == pytest.approx(before, abs=2e-4)
    assert note.startswith("learning rate auto: 0.0001" if before <= 0.03 else
                           "learning rate auto: 0.001 ")
    # the data's labels are not read: a teacher works on any inputs
    data = load_data((x, np.full(64, 99)), swapped, labels="unused")
    targets = distillation_data(data, teacher, derive_task(swapped)).labels()
    np.testing.assert_allclose(targets, np.asarray(model(x)), rtol=1e-5, atol=1e-6)


def test_teacher_on_a_regression_model_and_teacher_errors(tmp_path):
    model = regression_model(seed=6)
    x, _ = regression_data(seed=6)
    swapped = rewrite_model(model, kernel=COARSE)
    before = float(np.mean((np.asarray(swapped(x)) - np.asarray(model(x))) ** 2))
    path = saved(model, tmp_path, "teacher")
    result = finetune(swapped, x, epochs=3, batch_size=16, learning_rate=1e-2, teacher=path,
                      verbose=0)
    after = float(np.mean((np.asarray(result.model(x)) - np.asarray(model(x))) ** 2))
    assert after < 0.7 * before
    assert any("loss MSE against the teacher's outputs" in note for note in result.notes)
    with pytest.raises(GraphswapError, match="this model has no swapped layers"):
        finetune(model, x, epochs=1, teacher="original", verbose=0)
    with pytest.raises(GraphswapError, match="a teacher must take and give the same shapes"):
        finetune(swapped, x, epochs=1, teacher=binary_model(), verbose=0)


def test_teacher_original_from_the_cli_with_an_inputs_only_npz(tmp_path):
    model = classifier("sparse_categorical_crossentropy", seed=7)
    x = _rng(7).normal(size=(48, 6)).astype(np.float32) * 2
    swapped = rewrite_model(model, kernel=COARSE)
    path = saved(swapped, tmp_path, "swapped")
    np.savez(tmp_path / "inputs.npz", x=x)
    out = invoke(["finetune", path, "--data", tmp_path / "inputs.npz", "--teacher", "original",
                  "--epochs", "3", "--batch-size", "16", "--lr", "1e-2",
                  "-o", tmp_path / "distilled.keras"])
    assert out.exit_code == 0, out.output
    assert "labels not read; the targets are the teacher's outputs" in out.output
    distilled = keras.models.load_model(tmp_path / "distilled.keras")
    assert _kl_to_teacher(distilled, model, x) < _kl_to_teacher(swapped, model, x)
    assert derive_task(distilled).single.target == "indices"
    np.testing.assert_allclose(predict(distilled, load_data(x, distilled, labels="unused")),
                               np.asarray(distilled(x)), rtol=1e-6)
    out = invoke(["finetune", saved(model, tmp_path, "float"), "--data",
                  tmp_path / "inputs.npz", "--teacher", "original"])
    assert out.exit_code == 1 and out.output.startswith("Error: teacher 'original' is the float")


def test_distillation_checkpoints_resume(tmp_path):
    # a binary classifier: its checkpoint holds the distillation loss and the agreement metric,
    # which reload with it (graphswap's registered BinaryAgreement), so the run resumes
    model = binary_model(seed=8)
    x, _ = binary_data(seed=8)
    swapped = rewrite_model(model, kernel=COARSE)
    first = finetune(swapped, x, epochs=1, batch_size=16, learning_rate=1e-2, teacher="original",
                     checkpoint_dir=tmp_path / "ckpt", verbose=0)
    assert first.epochs_run == [1] and "agreement" in first.history
    resumed = finetune(swapped, x, epochs=2, batch_size=16, learning_rate=1e-2,
                       teacher="original", checkpoint_dir=tmp_path / "ckpt", resume=True,
                       verbose=0)
    assert resumed.epochs_run == [2]
    assert any("resumed from" in note for note in resumed.notes)
    assert derive_task(resumed.model).kind == "binary"
