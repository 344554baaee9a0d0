"""Regenerate sample_models/cnn_bn.keras: a small CNN with BatchNormalization on the shipped digits.

For testing BatchNorm folding and BN-statistics re-estimation, and as the second model of the
recovery tables.  Data: sample_models/digits.npz as shipped (make_lenet5.py makes it; this script
only reads it).  Model (raw uint8 pixels in, like lenet5.keras):

    Rescaling(1/255)
    Conv2D 8@3x3 (with bias)    -> BatchNormalization -> ReLU -> MaxPooling 2
    Conv2D 16@3x3 (no bias)     -> BatchNormalization -> ReLU -> MaxPooling 2
    Flatten -> Dense 32 (no bias) -> BatchNormalization -> ReLU
    Dense 10, softmax

Both BN placements occur (after a layer with a bias and after one without; after Conv2D and after
Dense), so folding code meets each case.  Trained with Adam 1e-3, batch 32, 30 epochs, seeded and
with TensorFlow's op determinism on.

    python sample_models/make_cnn_bn.py          # under a minute on 2 cores
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

HERE = Path(__file__).resolve().parent
SEED = 1234


def make_cnn_bn() -> keras.Model:
    layers = keras.layers
    return keras.Sequential([
        keras.Input((32, 32, 1), name="pixels"),
        layers.Rescaling(1.0 / 255.0, name="rescale"),
        layers.Conv2D(8, 3, name="conv1"),
        layers.BatchNormalization(name="bn1"),
        layers.ReLU(name="relu1"),
        layers.MaxPooling2D(2, name="pool1"),
        layers.Conv2D(16, 3, use_bias=False, name="conv2"),
        layers.BatchNormalization(name="bn2"),
        layers.ReLU(name="relu2"),
        layers.MaxPooling2D(2, name="pool2"),
        layers.Flatten(name="flatten"),
        layers.Dense(32, use_bias=False, name="fc1"),
        layers.BatchNormalization(name="bn3"),
        layers.ReLU(name="relu3"),
        layers.Dense(10, activation="softmax", name="predictions"),
    ], name="cnn_bn")


def main() -> None:
    keras.utils.set_random_seed(SEED)
    tf.config.experimental.enable_op_determinism()
    with np.load(HERE / "digits.npz") as data:
        data = {k: data[k] for k in data.files}
    model = make_cnn_bn()
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(data["x_train"], data["y_train"], epochs=30, batch_size=32, verbose=2,
              validation_data=(data["x_test"], data["y_test"]))
    loss, accuracy = model.evaluate(data["x_test"], data["y_test"], verbose=0)
    print(f"test accuracy {accuracy:.4f}, loss {loss:.4f}")
    model.save(HERE / "cnn_bn.keras")


if __name__ == "__main__":
    main()
