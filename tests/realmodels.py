"""Small versions of the published models users bring to graphswap, each built by the Keras that
wrote it: every builder takes the Keras module (`keras` for Keras 3, `tf_keras` for tf.keras 2), so
the same architecture is saved as a Keras 3 `.keras` and as tf.keras `.h5` / Keras 2 SavedModel.

    resnet8          MLPerf Tiny image classification (Conv + BN + residual adds), CIFAR-10 shape
    mobilenet_v1     MLPerf Tiny visual wake words (DepthwiseConv2D + 1x1 Conv2D, alpha 0.25)
    ds_cnn           MLPerf Tiny keyword spotting (depthwise-separable CNN on an MFCC map)
    fc_autoencoder   MLPerf Tiny anomaly detection (Dense autoencoder, MSE)
    lstm_text        an Embedding + LSTM text classifier
    gru_text         an Embedding + bidirectional GRU text classifier
    conv_decoder     a stride-2 Conv2DTranspose image decoder (MSE, 3 colour channels)
    binary_mlp       a binary classifier with a sigmoid (N, 1) output
    regression_mlp   a regressor (MSE)
    transformer_ecg  Conv1D stem + a custom transformer-block layer (Keras 3 only: the block is a
                     user class holding MultiHeadAttention, LayerNormalization and Dense layers)

Sizes are cut down so that a test runs in seconds; the layer kinds and their options are the
published ones.  Every model is compiled with the loss its task would use, as users save them.

The file and export cases (`FILE_AND_EXPORT_CASES`, not in the zoo's BUILDERS: each is about one
way a file or an export can go wrong, tests/test_realmodels_keras2_and_exports.py):

    gru_sensor       a Keras 2-era sequence classifier: GRU(recurrent_activation="hard_sigmoid",
                     reset_after=False) - Keras 2.0-2.2's defaults -, an LSTM with the same gate,
                     hard_sigmoid Dense and Activation layers (built by tf_keras: Keras 2's
                     formula, 0.2 x + 0.5 clipped)
    sequential_gru   a Sequential whose first layer carries the input shape (`input_shape=`:
                     Keras 2 saves it as the layer's batch_input_shape), then Bidirectional(GRU)
    two_heads        two outputs of different widths, named out of alphabetical order
    augmented_cnn    RandomFlip and RandomRotation before a Conv2D (Keras 3)
"""

from __future__ import annotations

import numpy as np


def resnet8(k, classes=10, size=16):
    inputs = k.Input((size, size, 3), name="image")
    x = k.layers.Conv2D(8, 3, padding="same", name="stem")(inputs)
    x = k.layers.BatchNormalization(name="stem_bn")(x)
    x = k.layers.Activation("relu")(x)
    for stage, filters in enumerate((8, 16, 32)):
        strides = 1 if stage == 0 else 2
        y = k.layers.Conv2D(filters, 3, strides=strides, padding="same", name=f"s{stage}_a")(x)
        y = k.layers.BatchNormalization(name=f"s{stage}_a_bn")(y)
        y = k.layers.Activation("relu")(y)
        y = k.layers.Conv2D(filters, 3, padding="same", name=f"s{stage}_b")(y)
        y = k.layers.BatchNormalization(name=f"s{stage}_b_bn")(y)
        if strides != 1:
            x = k.layers.Conv2D(filters, 1, strides=strides, name=f"s{stage}_skip")(x)
        x = k.layers.Activation("relu")(k.layers.Add()([x, y]))
    x = k.layers.GlobalAveragePooling2D()(x)
    outputs = k.layers.Dense(classes, activation="softmax", name="head")(x)
    model = k.Model(inputs, outputs, name="resnet8")
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def mobilenet_v1(k, classes=2, size=24, alpha=0.25):
    inputs = k.Input((size, size, 3), name="input_1")
    x = k.layers.Conv2D(int(32 * alpha), 3, strides=2, padding="same", use_bias=False)(inputs)
    x = k.layers.BatchNormalization()(x)
    x = k.layers.ReLU(6.0)(x)
    for filters, strides in ((64, 1), (128, 2), (128, 1), (256, 2)):
        x = k.layers.DepthwiseConv2D(3, strides=strides, padding="same", use_bias=False)(x)
        x = k.layers.BatchNormalization()(x)
        x = k.layers.ReLU(6.0)(x)
        x = k.layers.Conv2D(int(filters * alpha), 1, use_bias=False)(x)
        x = k.layers.BatchNormalization()(x)
        x = k.layers.ReLU(6.0)(x)
    x = k.layers.GlobalAveragePooling2D()(x)
    outputs = k.layers.Dense(classes, activation="softmax")(x)
    model = k.Model(inputs, outputs, name="mobilenet_v1")
    model.compile("adam", "categorical_crossentropy", metrics=["accuracy"])
    return model


def ds_cnn(k, classes=12, frames=25, mfcc=10):
    inputs = k.Input((frames, mfcc, 1), name="mfcc")
    x = k.layers.Conv2D(16, (10, 4), strides=(2, 2), padding="same")(inputs)
    x = k.layers.BatchNormalization()(x)
    x = k.layers.Activation("relu")(x)
    for _ in range(2):
        x = k.layers.DepthwiseConv2D(3, padding="same")(x)
        x = k.layers.BatchNormalization()(x)
        x = k.layers.Activation("relu")(x)
        x = k.layers.Conv2D(16, 1)(x)
        x = k.layers.BatchNormalization()(x)
        x = k.layers.Activation("relu")(x)
    x = k.layers.Dropout(0.2)(x)
    x = k.layers.GlobalAveragePooling2D()(x)
    outputs = k.layers.Dense(classes, activation="softmax")(x)
    model = k.Model(inputs, outputs, name="ds_cnn")
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def fc_autoencoder(k, features=40, code=8):
    inputs = k.Input((features,), name="frames")
    x = inputs
    for units in (32, 16, code, 16, 32):
        x = k.layers.Dense(units)(x)
        x = k.layers.BatchNormalization()(x)
        x = k.layers.Activation("relu")(x)
    outputs = k.layers.Dense(features)(x)
    model = k.Model(inputs, outputs, name="fc_autoencoder")
    model.compile("adam", "mse")
    return model


def lstm_text(k, vocabulary=50, length=12, classes=3):
    inputs = k.Input((length,), name="tokens")
    x = k.layers.Embedding(vocabulary, 8)(inputs)
    x = k.layers.LSTM(16)(x)
    outputs = k.layers.Dense(classes, activation="softmax")(x)
    model = k.Model(inputs, outputs, name="lstm_text")
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def gru_text(k, vocabulary=50, length=12, classes=3):
    inputs = k.Input((length,), name="tokens")
    x = k.layers.Embedding(vocabulary, 8)(inputs)
    x = k.layers.Bidirectional(k.layers.GRU(8, return_sequences=True))(x)
    x = k.layers.SimpleRNN(8)(x)
    outputs = k.layers.Dense(classes, activation="softmax")(x)
    model = k.Model(inputs, outputs, name="gru_text")
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def conv_decoder(k, code=8, size=8):
    inputs = k.Input((code,), name="code")
    x = k.layers.Dense((size // 4) * (size // 4) * 8, activation="relu")(inputs)
    x = k.layers.Reshape((size // 4, size // 4, 8))(x)
    x = k.layers.Conv2DTranspose(8, 3, strides=2, padding="same", activation="relu")(x)
    outputs = k.layers.Conv2DTranspose(3, 3, strides=2, padding="same",
                                       activation="sigmoid")(x)
    model = k.Model(inputs, outputs, name="conv_decoder")
    model.compile("adam", "mse")
    return model


def binary_mlp(k, features=6):
    inputs = k.Input((features,), name="features")
    x = k.layers.Dense(16, activation="relu")(inputs)
    outputs = k.layers.Dense(1, activation="sigmoid")(x)
    model = k.Model(inputs, outputs, name="binary_mlp")
    model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
    return model


def regression_mlp(k, features=5):
    inputs = k.Input((features,), name="features")
    x = k.layers.Dense(16, activation="relu")(inputs)
    outputs = k.layers.Dense(2)(x)
    model = k.Model(inputs, outputs, name="regression_mlp")
    model.compile("adam", "mse", metrics=["mae"])
    return model


def transformer_block_class():
    """The user's transformer block, a custom Keras 3 layer holding weight layers as attributes
    (the way tf.keras transformers are written), registered like a user's class."""
    import keras

    @keras.saving.register_keras_serializable(package="realmodels")
    class TransformerBlock(keras.layers.Layer):
        def __init__(self, dim, heads, hidden, **kwargs):
            super().__init__(**kwargs)
            self.dim, self.heads, self.hidden = dim, heads, hidden
            self.attention = keras.layers.MultiHeadAttention(heads, dim // heads)
            self.norm1 = keras.layers.LayerNormalization()
            self.norm2 = keras.layers.LayerNormalization()
            self.up = keras.layers.Dense(hidden, activation="relu")
            self.down = keras.layers.Dense(dim)

        def call(self, x):
            x = self.norm1(x + self.attention(x, x))
            return self.norm2(x + self.down(self.up(x)))

        def get_config(self):
            return {**super().get_config(), "dim": self.dim, "heads": self.heads,
                    "hidden": self.hidden}

    return TransformerBlock


def transformer_ecg(k, length=32, classes=5):
    block = transformer_block_class()
    inputs = k.Input((length, 1), name="ecg")
    x = k.layers.Conv1D(16, 5, strides=2, padding="same", activation="relu")(inputs)
    x = block(16, 2, 32, name="block")(x)
    x = k.layers.GlobalAveragePooling1D()(x)
    outputs = k.layers.Dense(classes, activation="softmax")(x)
    model = k.Model(inputs, outputs, name="transformer_ecg")
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def gru_sensor(k, steps=10, features=4, classes=3):
    inputs = k.Input((steps, features), name="signals")
    x = k.layers.GRU(8, recurrent_activation="hard_sigmoid", reset_after=False,
                     return_sequences=True, name="gru")(inputs)
    x = k.layers.LSTM(8, recurrent_activation="hard_sigmoid", name="lstm")(x)
    x = k.layers.Dense(8, activation="hard_sigmoid", name="gate")(x)
    x = k.layers.Activation("hard_sigmoid", name="squash")(k.layers.Dense(8, name="mix")(x))
    outputs = k.layers.Dense(classes, activation="softmax", name="head")(x)
    model = k.Model(inputs, outputs, name="gru_sensor")
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def sequential_gru(k, steps=10, features=3, classes=2):
    model = k.Sequential([
        k.layers.GRU(6, return_sequences=True, input_shape=(steps, features), name="gru"),
        k.layers.Bidirectional(k.layers.GRU(4, return_sequences=True), name="bidirectional"),
        k.layers.GlobalAveragePooling1D(),
        k.layers.Dense(classes, activation="softmax", name="head")], name="sequential_gru")
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def two_heads(k, features=6):
    inputs = k.Input((features,), name="features")
    x = k.layers.Dense(16, activation="relu", name="trunk")(inputs)
    zeta = k.layers.Dense(7, name="zeta")(x)                          # a regression head
    alpha = k.layers.Dense(2, activation="softmax", name="alpha")(x)  # a classifier head
    model = k.Model(inputs, [zeta, alpha], name="two_heads")
    model.compile("adam", ["mse", "sparse_categorical_crossentropy"])
    return model


def augmented_cnn(k, size=16, classes=4, flip=None):
    inputs = k.Input((size, size, 3), name="image")
    x = (flip or k.layers.RandomFlip)("horizontal", name="flip")(inputs)
    x = k.layers.RandomRotation(0.1, name="rotate")(x)
    x = k.layers.Conv2D(8, 3, padding="same", activation="relu", name="conv")(x)
    x = k.layers.GlobalAveragePooling2D()(x)
    outputs = k.layers.Dense(classes, activation="softmax", name="head")(x)
    model = k.Model(inputs, outputs, name="augmented_cnn")
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


FILE_AND_EXPORT_CASES = {f.__name__: f for f in (gru_sensor, sequential_gru, two_heads,
                                                 augmented_cnn)}


BUILDERS = {f.__name__: f for f in (resnet8, mobilenet_v1, ds_cnn, fc_autoencoder, lstm_text,
                                     gru_text, conv_decoder, binary_mlp, regression_mlp,
                                     transformer_ecg)}


def sample_data(model, n=32, seed=0):
    """Inputs and labels in the form the model's saved loss expects (class indices for a sparse
    loss, one-hot for a categorical one, (n, 1) 0/1 labels for a sigmoid output, the inputs
    themselves for an autoencoder, real-valued targets for a regressor)."""
    rng = np.random.default_rng(seed)
    shape = tuple(model.inputs[0].shape[1:])
    if model.name in ("lstm_text", "gru_text"):
        x = rng.integers(0, 50, (n, *shape)).astype(np.float32)
    else:
        x = rng.uniform(0, 1, (n, *shape)).astype(np.float32)
    out = tuple(model.outputs[0].shape[1:])
    if model.name == "fc_autoencoder":
        y = x.copy()
    elif model.name in ("conv_decoder", "regression_mlp"):
        y = rng.uniform(0, 1, (n, *out)).astype(np.float32)
    elif model.name == "binary_mlp":
        y = (x.sum(axis=1, keepdims=True) > shape[0] / 2).astype(np.float32)
    elif model.name == "mobilenet_v1":
        y = np.eye(out[-1], dtype=np.float32)[rng.integers(0, out[-1], n)]
    elif model.name == "two_heads":  # (regression targets, class indices)
        y = (rng.uniform(0, 1, (n, *out)).astype(np.float32), rng.integers(0, 2, n))
    else:
        y = rng.integers(0, out[-1], n)
    return x, y


def trained(k, name, epochs=2, seed=0):
    """The model `name` built with Keras module `k` and fitted briefly on its sample data (so that
    its BatchNormalization statistics and outputs are not those of an initialisation)."""
    if hasattr(k.utils, "set_random_seed"):
        k.utils.set_random_seed(seed)
    model = {**BUILDERS, **FILE_AND_EXPORT_CASES}[name](k)
    x, y = sample_data(model, seed=seed)
    model.fit(x, y, epochs=epochs, batch_size=16, verbose=0)
    return model
