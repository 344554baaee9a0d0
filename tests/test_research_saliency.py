"""Saliency maps (guided / vanilla) on the sample LeNet-5, its swapped copy, and the CLI."""

from __future__ import annotations

import keras
import matplotlib.image as mpimg
import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner

import graphswap
from graphswap import gradients as gg
from graphswap.research.analysis import saliency as sal
from graphswap.cli import main
from graphswap.errors import DataError, GraphswapError

from conftest import SAMPLE_DATA, SAMPLE_MODEL, assert_close_to_roundoff, reduction_terms

PNG_SIZE = (400, 800)  # rows, columns: two 4-inch panels at 100 dpi


def _logit_gradient(model, image, class_index, guided):
    """Reference: strip the softmax by hand, optionally guided, tape the logit."""
    # the last layer without its softmax, on top of the penultimate features
    features = keras.Model(model.inputs, model.get_layer("fc2").output)
    if guided:
        features = gg.override(features, {"relu": "guided"})
    kernel, bias = model.get_layer("predictions").get_weights()
    x = tf.constant(image[None].astype(np.float32))
    with tf.GradientTape() as tape:
        tape.watch(x)
        score = (features(x) @ kernel + bias)[0, class_index]
    return tape.gradient(score, x).numpy()[0]


@pytest.mark.parametrize("method", ["guided", "vanilla"])
def test_saliency_map_values(lenet, digits, method):
    image = digits["x_test"][3]
    result = sal.saliency_map(lenet, image, method=method)
    assert result.predicted == int(digits["y_test"][3])
    assert result.class_index == result.predicted and result.score == "logit"
    expected = _logit_gradient(lenet, image, result.class_index, method == "guided")
    assert_close_to_roundoff(result.gradient, expected, 2 * reduction_terms(lenet))
    assert result.gradient.shape == (32, 32, 1) and result.heatmap.shape == (32, 32)
    assert result.heatmap.max() == 1.0 and result.heatmap.min() >= 0.0
    assert result.heatmap.std() > 0.05
    np.testing.assert_allclose(result.probabilities.sum(), 1.0, rtol=1e-5)


def test_guided_differs_from_vanilla_and_is_sparser(lenet, digits):
    image = digits["x_test"][0]
    guided = sal.saliency_map(lenet, image, method="guided")
    vanilla = sal.saliency_map(lenet, image, method="vanilla")
    assert not np.allclose(guided.gradient, vanilla.gradient)
    # guided backprop keeps only positive evidence paths: more exact zeros on the input
    assert np.count_nonzero(guided.gradient) <= np.count_nonzero(vanilla.gradient)


def test_chosen_class_and_output_score(lenet, digits):
    image = digits["x_test"][0]
    other = (int(digits["y_test"][0]) + 1) % 10
    result = sal.saliency_map(lenet, image, class_index=other, method="vanilla")
    assert result.class_index == other
    assert_close_to_roundoff(result.gradient, _logit_gradient(lenet, image, other, False),
                             2 * reduction_terms(lenet))  # forward and backward sums
    probability = sal.saliency_map(lenet, image, class_index=other, method="vanilla",
                                   score="output")
    assert probability.score == "output"
    assert not np.allclose(probability.gradient, result.gradient)


def test_swapped_model_saliency_matches(lenet, digits):
    swapped = graphswap.rewrite_model(lenet, kernel="exact")
    image = digits["x_test"][7]
    for method in ("guided", "vanilla"):
        a = sal.saliency_map(lenet, image, method=method)
        b = sal.saliency_map(swapped, image, method=method)
        assert a.class_index == b.class_index
        assert_close_to_roundoff(b.gradient, a.gradient, 2 * reduction_terms(lenet))


def test_png_written_with_size_and_content(lenet, digits, tmp_path):
    result = sal.saliency_map(lenet, digits["x_test"][2], method="guided")
    path = sal.write_saliency_png(result, tmp_path / "s.png", title="digit")
    pixels = mpimg.imread(path)
    assert pixels.shape[:2] == PNG_SIZE
    assert pixels[..., :3].std() > 0.05
    left, right = pixels[:, :400, :3], pixels[:, 400:, :3]
    assert not np.allclose(left, right)
    # the heat map panel uses colour (inferno), the input panel is grey
    assert np.abs(right[..., 0] - right[..., 2]).max() > 0.2
    with pytest.raises(graphswap.OutputPathError, match="already exists; pass --force"):
        sal.write_saliency_png(result, path)
    sal.write_saliency_png(result, path, force=True)


def test_saliency_bad_inputs(lenet, digits):
    with pytest.raises(GraphswapError, match="unknown saliency method 'smooth'; allowed: guided, "
                                             "vanilla"):
        sal.saliency_map(lenet, digits["x_test"][0], method="smooth")
    with pytest.raises(DataError, match=r"class index 10 out of range: the model has 10 outputs"):
        sal.saliency_map(lenet, digits["x_test"][0], class_index=10)
    with pytest.raises(DataError, match=r"image of shape \(28, 28, 1\) does not fit the model "
                                        r"input \(32, 32, 1\)"):
        sal.saliency_map(lenet, np.zeros((28, 28, 1)))
    dense = keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)])
    with pytest.raises(DataError, match="saliency needs an image input"):
        sal.saliency_map(dense, np.zeros(5))


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------

@pytest.fixture()
def runner():
    return CliRunner()


def test_cli_npz_sample(runner, tmp_path, digits):
    out = tmp_path / "saliency.png"
    result = runner.invoke(main, ["saliency", str(SAMPLE_MODEL), str(SAMPLE_DATA), "--index", "4",
                                  "-o", str(out)])
    assert result.exit_code == 0, result.output
    label = int(digits["y_test"][4])
    assert f"sample 4 of 'x_test' in {SAMPLE_DATA} (label {label})" in result.output
    assert f"predicted class {label} (label {label}); guided saliency of class {label}" \
        in result.output
    assert mpimg.imread(out).shape[:2] == PNG_SIZE
    result = runner.invoke(main, ["saliency", str(SAMPLE_MODEL), str(SAMPLE_DATA), "--index", "4",
                                  "-o", str(out)])
    assert result.exit_code == 1
    assert "already exists; pass --force" in result.output
    result = runner.invoke(main, ["saliency", str(SAMPLE_MODEL), str(SAMPLE_DATA), "--index", "4",
                                  "--class", "2", "--method", "vanilla", "-o", str(out), "--force"])
    assert result.exit_code == 0, result.output
    assert "vanilla saliency of class 2" in result.output


def test_cli_image_file_is_resized(runner, tmp_path, digits):
    big = np.kron(digits["x_test"][5][..., 0], np.ones((3, 3), np.uint8))  # 96x96
    image_path = tmp_path / "digit.png"
    keras.utils.save_img(image_path, np.repeat(big[..., None], 3, axis=2), scale=False)
    out = tmp_path / "out.png"
    result = runner.invoke(main, ["saliency", str(SAMPLE_MODEL), str(image_path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "resized digit.png from 96x96 to 32x32 (the model's input)" in result.output
    assert f"predicted class {int(digits['y_test'][5])}" in result.output
    assert mpimg.imread(out).shape[:2] == PNG_SIZE


def test_cli_errors(runner, tmp_path):
    out = tmp_path / "out.png"
    cases = [
        ([str(SAMPLE_DATA)], "is an .npz archive: choose a sample with --index (0..359 in "
                             "'x_test')"),
        ([str(SAMPLE_DATA), "--index", "999"], "--index 999 out of range: 'x_test' in"),
        ([str(SAMPLE_DATA), "--index", "1", "--key", "nope"], "has no array 'nope'"),
        ([str(SAMPLE_DATA), "--index", "1", "--class", "11"], "class index 11 out of range"),
        ([str(tmp_path / "missing.png")], "input file not found"),
    ]
    for extra, message in cases:
        result = runner.invoke(main, ["saliency", str(SAMPLE_MODEL), *extra, "-o", str(out)])
        assert result.exit_code == 1, (extra, result.output)
        assert message in result.output, (extra, result.output)
        assert not out.exists()
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not an image")
    result = runner.invoke(main, ["saliency", str(SAMPLE_MODEL), str(broken), "-o", str(out)])
    assert result.exit_code == 1 and "cannot read image" in result.output
    result = runner.invoke(main, ["saliency", str(SAMPLE_MODEL), str(SAMPLE_DATA), "--index", "1",
                                  "--method", "smooth", "-o", str(out)])
    assert result.exit_code == 1 and "Invalid value for '--method'" in result.output
    assert list(tmp_path.iterdir()) == [broken]


def test_cli_swapped_model(runner, tmp_path, lenet):
    swapped_path = tmp_path / "lenet.swapped.keras"
    graphswap.rewrite_model(lenet, kernel="exact").save(swapped_path)
    out = tmp_path / "s.png"
    result = runner.invoke(main, ["saliency", str(swapped_path), str(SAMPLE_DATA), "--index", "0",
                                  "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert mpimg.imread(out).shape[:2] == PNG_SIZE
