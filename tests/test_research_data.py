"""graphswap.data: loading .npz / image directories / tf.data / arrays, and validating them against
the model (shapes, dtypes, Rescaling, labels, emptiness) with clear DataErrors."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import SAMPLE_DATA
from graphswap.research import load_data
from graphswap.research.data.data import (Data, find_input_rescaling, model_expectation,
                                          parse_scale, translate_errors)
from graphswap.errors import DataError


def small_model(rescale=True, classes=3, softmax=True, size=8, channels=1):
    keras.utils.set_random_seed(0)
    layers = [keras.Input((size, size, channels), name="pixels")]
    if rescale:
        layers.append(keras.layers.Rescaling(1.0 / 255.0, name="rescale"))
    layers += [keras.layers.Conv2D(2, 3, activation="relu", name="conv"),
               keras.layers.Flatten(name="flat"),
               keras.layers.Dense(classes, activation="softmax" if softmax else None,
                                  name="out")]
    return keras.Sequential(layers, name="small")


def arrays(n=12, size=8, classes=3, seed=0, channels=1):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, size, size, channels), dtype=np.uint8)
    y = rng.integers(0, classes, size=n).astype(np.int64)
    y[:classes] = np.arange(classes)
    return x, y


@pytest.fixture()
def model():
    return small_model()


def test_expectation_of_the_sample_shape(model):
    expect = model_expectation(model)
    assert expect.input_shape == (8, 8, 1)
    assert expect.classes == 3
    assert expect.rescaling == ("rescale", pytest.approx(1 / 255), 0.0)
    assert find_input_rescaling(small_model(rescale=False)) is None


def test_npz_x_y_keys_load_and_say_how_pixels_are_scaled(tmp_path, model):
    x, y = arrays()
    np.savez(tmp_path / "d.npz", x=x, y=y)
    data = load_data(tmp_path / "d.npz", model)
    assert len(data) == 12 and data.label_format == "sparse"
    np.testing.assert_array_equal(data.x, x)
    np.testing.assert_array_equal(data.y, y)
    assert any("Rescaling layer 'rescale' scales them" in note for note in data.notes)
    batch_x, batch_y = next(iter(data.as_dataset(5)))
    assert batch_x.dtype == tf.float32 and tuple(batch_x.shape) == (5, 8, 8, 1)
    np.testing.assert_array_equal(batch_x.numpy(), x[:5].astype(np.float32))


def test_npz_train_and_test_splits_are_picked_by_name(tmp_path, model):
    x, y = arrays(12)
    x2, y2 = arrays(5, seed=1)
    np.savez(tmp_path / "d.npz", x_train=x, y_train=y, x_test=x2, y_test=y2)
    assert len(load_data(tmp_path / "d.npz", model, split="train")) == 12
    test = load_data(tmp_path / "d.npz", model, split="test")
    assert len(test) == 5 and "[x_test, y_test]" in test.source


def test_sample_digits_fit_the_sample_model(lenet):
    data = load_data(SAMPLE_DATA, lenet, split="test")
    assert len(data) == 360 and data.x.dtype == np.uint8
    assert set(np.unique(data.y)) == set(range(10))


def test_missing_keys_name_what_was_found_and_what_is_expected(tmp_path, model):
    np.savez(tmp_path / "d.npz", images=np.zeros((3, 8, 8, 1)), labels=np.zeros(3))
    with pytest.raises(DataError, match=r"has arrays \['images', 'labels'\]; expected 'x'/'y', "
                                        r"or 'x_train'/'y_train'"):
        load_data(tmp_path / "d.npz", model)
    np.savez(tmp_path / "e.npz", x_train=np.zeros((3, 8, 8, 1)))
    # inputs without labels: the model's task says it needs them, and how to do without
    with pytest.raises(DataError, match=r"e\.npz \[x_train\]\) holds inputs but no labels; the "
                                        r"model's task \(multiclass\) needs them: save them as "
                                        r"'y'.*--teacher original"):
        load_data(tmp_path / "e.npz", model, split="train")


def test_missing_and_non_npz_files(tmp_path, model):
    with pytest.raises(DataError, match="data not found"):
        load_data(tmp_path / "nope.npz", model)
    (tmp_path / "bad.npz").write_text("not a zip")
    with pytest.raises(DataError, match="is not a NumPy .npz archive"):
        load_data(tmp_path / "bad.npz", model)
    (tmp_path / "d.csv").write_text("1,2")
    with pytest.raises(DataError, match="unsupported data file"):
        load_data(tmp_path / "d.csv", model)


def test_label_range_beyond_the_models_classes(model):
    x, y = arrays()
    y[4] = 5
    with pytest.raises(DataError, match=r"labels range from 0 to 5, but the model has 3 output "
                                        r"classes, so labels must lie in 0\.\.2"):
        load_data((x, y), model)
    y[4] = -1
    with pytest.raises(DataError, match="labels range from -1 to 2"):
        load_data((x, y), model)


def test_fractional_labels_and_bad_label_shapes(model):
    x, _ = arrays()
    with pytest.raises(DataError, match="fractional or non-finite"):
        load_data((x, np.full(12, 0.5)), model)
    with pytest.raises(DataError, match=r"labels have shape \(12, 2\)"):
        load_data((x, np.zeros((12, 2))), model)
    with pytest.raises(DataError, match="12 inputs but 11 labels"):
        load_data((x, np.zeros(11, int)), model)


def test_one_hot_labels_are_recognised(model):
    x, y = arrays()
    data = load_data((x, np.eye(3)[y]), model)
    # the model's task (no saved loss, softmax output: sparse cross-entropy) takes class
    # indices: exact one-hot rows are converted, and a note says so
    assert data.label_format == "sparse"
    np.testing.assert_array_equal(data.labels(), y)
    assert any("one-hot labels converted to class indices" in note for note in data.notes)


def test_shape_mismatch_says_what_the_model_expects_and_offers_resize(model):
    x, y = arrays(size=6)
    with pytest.raises(DataError, match=r"images are 6x6x1 but the model expects 8x8x1; pass "
                                        r"resize=True \(--resize"):
        load_data((x, y), model)


def test_resize_and_pad_fit_smaller_images(model):
    x, y = arrays(size=6)
    resized = load_data((x, y), model, resize=True)
    assert resized.x.shape == (12, 8, 8, 1)
    expected = tf.image.resize(x.astype(np.float32), (8, 8), method="bilinear").numpy()
    np.testing.assert_allclose(resized.x, expected)
    padded = load_data((x, y), model, pad=True)
    assert padded.x.shape == (12, 8, 8, 1)
    np.testing.assert_array_equal(padded.x[:, 1:7, 1:7, :], x)
    assert padded.x[:, 0].sum() == 0 and padded.x[:, 7].sum() == 0
    assert any("zero-padded (centred)" in note for note in padded.notes)
    big, y_big = arrays(size=10)
    with pytest.raises(DataError, match="cannot pad 10x10x1 images down to 8x8x1"):
        load_data((big, y_big), model, pad=True)
    with pytest.raises(DataError, match="choose one of resize and pad"):
        load_data((x, y), model, resize=True, pad=True)


def test_missing_channel_axis_is_added_but_wrong_channels_are_refused(model):
    x, y = arrays()
    data = load_data((x[..., 0], y), model)
    assert data.x.shape == (12, 8, 8, 1)
    assert any("added a channel axis" in note for note in data.notes)
    rgb, y = arrays(channels=3)
    with pytest.raises(DataError, match=r"images have 3 channel\(s\) but the model expects 1"):
        load_data((rgb, y), model)


def test_empty_data_and_non_finite_inputs(tmp_path, model):
    np.savez(tmp_path / "empty.npz", x=np.zeros((0, 8, 8, 1), np.uint8), y=np.zeros(0, int))
    with pytest.raises(DataError, match=r"is empty: 0 examples"):
        load_data(tmp_path / "empty.npz", model)
    x = np.zeros((4, 8, 8, 1), np.float32)
    x[1, 2, 3, 0] = np.nan
    with pytest.raises(DataError, match=r"1 NaN/infinite value\(s\)"):
        load_data((x, np.zeros(4, int)), model)
    with pytest.raises(DataError, match="expected numbers"):
        load_data((np.array(["a"] * 4), np.zeros(4, int)), model)


def test_scaling_notes_without_a_rescaling_layer_and_with_prescaled_floats():
    plain = small_model(rescale=False)
    x, y = arrays()
    data = load_data((x, y), plain)
    assert any("declares no Rescaling layer - if it was trained on [0, 1] inputs, pass "
               "scale=1/255" in note for note in data.notes)
    scaled = load_data((x, y), plain, scale="1/255")
    batch, _ = next(iter(scaled.as_dataset(12)))
    np.testing.assert_allclose(batch.numpy(), x / 255.0, rtol=1e-6)
    prescaled = load_data((x / 255.0, y), small_model())
    assert any("WARNING values lie in [0, 1]" in note for note in prescaled.notes)
    assert parse_scale("1/255") == pytest.approx(1 / 255)
    with pytest.raises(DataError, match="scale must be a number or a fraction"):
        parse_scale("abc")


def test_image_directory_one_folder_per_class(tmp_path, model):
    rng = np.random.default_rng(0)
    for name, count in (("cat", 3), ("dog", 2)):
        (tmp_path / "imgs" / name).mkdir(parents=True)
        for i in range(count):
            keras.utils.save_img(tmp_path / "imgs" / name / f"{i}.png",
                                 rng.integers(0, 256, (10, 10, 1)).astype(np.uint8), scale=False)
    data = load_data(tmp_path / "imgs", model)
    assert len(data) == 5
    np.testing.assert_array_equal(np.sort(data.labels()), [0, 0, 0, 1, 1])
    batch, labels = next(iter(data.as_dataset(8)))
    assert tuple(batch.shape) == (5, 8, 8, 1)
    assert any("resized to 8x8" in note for note in data.notes)
    (tmp_path / "empty" / "a").mkdir(parents=True)
    with pytest.raises(DataError, match="contains no images|cannot read images"):
        load_data(tmp_path / "empty", model)
    for name in ("b", "c", "d"):
        (tmp_path / "imgs" / name).mkdir()
        keras.utils.save_img(tmp_path / "imgs" / name / "0.png",
                             np.zeros((8, 8, 1), np.uint8), scale=False)
    with pytest.raises(DataError, match="has 5 class folders but the model has 3 output classes"):
        load_data(tmp_path / "imgs", model)
    (tmp_path / "flat").mkdir()
    with pytest.raises(DataError, match="no class subdirectories"):
        load_data(tmp_path / "flat", model)


def test_tf_data_batched_and_unbatched(model):
    x, y = arrays()
    unbatched = load_data(tf.data.Dataset.from_tensor_slices((x, y)), model)
    assert len(unbatched) == 12
    batched = load_data(tf.data.Dataset.from_tensor_slices((x, y)).batch(5), model)
    np.testing.assert_array_equal(np.sort(batched.labels()), np.sort(y))
    small, _ = arrays(size=6)
    with pytest.raises(DataError, match=r"dataset samples have shape \(6, 6, 1\) but the model "
                                        r"expects 8x8x1; pass resize=True"):
        load_data(tf.data.Dataset.from_tensor_slices((small, y)), model)
    resized = load_data(tf.data.Dataset.from_tensor_slices((small, y)), model, resize=True)
    assert tuple(next(iter(resized.as_dataset(4)))[0].shape) == (4, 8, 8, 1)
    with pytest.raises(DataError, match="must yield \\(x, y\\) pairs"):
        load_data(tf.data.Dataset.from_tensor_slices(x), model)


def test_tf_data_labels_out_of_range_fail_as_data_error_when_read(model):
    x, y = arrays()
    y[7] = 9
    data = load_data(tf.data.Dataset.from_tensor_slices((x, y)), model)
    with pytest.raises(DataError, match=r"found label 9 but the model has 3 output classes"):
        with translate_errors():
            for _ in data.as_dataset(4):
                pass


def test_split_is_seeded_and_disjoint(model):
    x, y = arrays(20)
    data = load_data((x, y), model)
    train, val = data.split(0.25, seed=3)
    assert (len(train), len(val)) == (15, 5)
    again_train, again_val = data.split(0.25, seed=3)
    np.testing.assert_array_equal(val.x, again_val.x)
    joined = np.concatenate([train.x, val.x]).reshape(20, -1)
    assert len(np.unique(joined, axis=0)) == len(np.unique(x.reshape(20, -1), axis=0))
    with pytest.raises(DataError, match="between 0 and 1"):
        data.split(1.5)


def test_multi_input_models_are_refused_with_a_pointer(nested_model):
    with pytest.raises(DataError, match="has 2 inputs; graphswap's data loading supports "
                                        "single-input models"):
        load_data((np.zeros((2, 8, 8, 3)), np.zeros(2)), nested_model)


def test_data_instances_pass_through(model):
    x, y = arrays()
    data = load_data((x, y), model)
    assert load_data(data, model) is data and isinstance(data, Data)
