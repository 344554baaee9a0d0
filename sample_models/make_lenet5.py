"""Regenerate sample_models/digits.npz and sample_models/lenet5.keras.

Data: scikit-learn's bundled copy of the UCI "Optical Recognition of Handwritten Digits" test set
(1,797 real 8x8 handwritten digits, 16 grey levels), upsampled to LeNet-5's 32x32 input with
bilinear interpolation and stored as uint8 pixels 0..255 (N, 32, 32, 1).  A stratified 80/20 split
with a fixed seed gives x_train/y_train (1,437) and x_test/y_test (360).

Model: LeNet-5 as in the seed question - Conv2D 6@5x5, max-pool, Conv2D 16@5x5, max-pool, Dense 120,
84, 10 - with ReLU activations and a Rescaling(1/255) input layer, so it takes the raw uint8 pixels.

    python sample_models/make_lenet5.py          # about a minute on 2 cores
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

HERE = Path(__file__).resolve().parent
SEED = 1234


def make_digits() -> dict[str, np.ndarray]:
    digits = load_digits()
    images = digits.images.astype(np.float32) / 16.0  # 0..1, shape (1797, 8, 8)
    upsampled = tf.image.resize(images[..., None], (32, 32), method="bilinear").numpy()
    pixels = np.clip(np.rint(upsampled * 255.0), 0, 255).astype(np.uint8)
    labels = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        pixels, labels, test_size=0.2, stratify=labels, random_state=SEED)
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}


def make_lenet5() -> keras.Model:
    return keras.Sequential([
        keras.Input((32, 32, 1), name="pixels"),
        keras.layers.Rescaling(1.0 / 255.0, name="rescale"),
        keras.layers.Conv2D(6, 5, activation="relu", name="conv1"),
        keras.layers.MaxPooling2D(2, name="pool1"),
        keras.layers.Conv2D(16, 5, activation="relu", name="conv2"),
        keras.layers.MaxPooling2D(2, name="pool2"),
        keras.layers.Flatten(name="flatten"),
        keras.layers.Dense(120, activation="relu", name="fc1"),
        keras.layers.Dense(84, activation="relu", name="fc2"),
        keras.layers.Dense(10, activation="softmax", name="predictions"),
    ], name="lenet5")


def main() -> None:
    keras.utils.set_random_seed(SEED)
    data = make_digits()
    np.savez_compressed(HERE / "digits.npz", **data)
    model = make_lenet5()
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(data["x_train"], data["y_train"], epochs=40, batch_size=32, verbose=2,
              validation_data=(data["x_test"], data["y_test"]))
    loss, accuracy = model.evaluate(data["x_test"], data["y_test"], verbose=0)
    print(f"test accuracy {accuracy:.4f}, loss {loss:.4f}")
    model.save(HERE / "lenet5.keras")


if __name__ == "__main__":
    main()
