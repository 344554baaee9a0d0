"""Models the benchmarks build (not part of the package): ResNet-8 for CIFAR-shaped inputs, a
ViT-Ti/16-style model, and the keras.applications models (weights=None: nothing downloaded); and
the training step the benchmarks time."""

from __future__ import annotations


def resnet8(seed: int = 0, classes: int = 10):
    """ResNet-8 for 32x32x3 inputs: a 16-channel stem and three stages of one basic block
    (16, 32, 64 channels), global pooling, a Dense head: 9 convolutions (2 of them 1x1
    projections) and 1 Dense."""
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(16, 3, padding="same", name="stem")(inputs)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
    for stage, filters in enumerate((16, 32, 64)):
        stride = 1 if stage == 0 else 2
        shortcut = x
        y = keras.layers.Conv2D(filters, 3, strides=stride, padding="same",
                                name=f"s{stage}_a")(x)
        y = keras.layers.ReLU()(keras.layers.BatchNormalization()(y))
        y = keras.layers.Conv2D(filters, 3, padding="same", name=f"s{stage}_b")(y)
        y = keras.layers.BatchNormalization()(y)
        if stride != 1 or shortcut.shape[-1] != filters:
            shortcut = keras.layers.Conv2D(filters, 1, strides=stride, name=f"s{stage}_proj")(x)
        x = keras.layers.ReLU()(keras.layers.Add()([y, shortcut]))
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(classes, activation="softmax", name="fc")(x)
    model = keras.Model(inputs, outputs, name="resnet8")
    model.compile(loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def vit(image=224, patch=16, dim=192, heads=3, depth=12, classes=1000):
    """A ViT-Ti/16-style model built from MultiHeadAttention + Dense."""
    import keras

    inputs = keras.Input((image, image, 3))
    x = keras.layers.Conv2D(dim, patch, strides=patch, name="patch_embed")(inputs)
    tokens = (image // patch) ** 2
    x = keras.layers.Reshape((tokens, dim))(x)
    for i in range(depth):
        h = keras.layers.LayerNormalization()(x)
        x = keras.layers.Add()([x, keras.layers.MultiHeadAttention(heads, dim // heads,
                                                                   name=f"mha{i}")(h, h)])
        h = keras.layers.LayerNormalization()(x)
        h = keras.layers.Dense(4 * dim, activation="gelu", name=f"mlp{i}a")(h)
        x = keras.layers.Add()([x, keras.layers.Dense(dim, name=f"mlp{i}b")(h)])
    x = keras.layers.GlobalAveragePooling1D()(keras.layers.LayerNormalization()(x))
    return keras.Model(inputs, keras.layers.Dense(classes, name="head")(x), name="vit_ti16")


def build(name: str, size: int = 224):
    """A model of the zoo by name, for `size`x`size`x3 inputs (ResNet8: always 32x32x3)."""
    import keras

    shape = (size, size, 3)
    if name == "ResNet8":
        return resnet8()
    if name == "MobileNetV2":
        return keras.applications.MobileNetV2(input_shape=shape, weights=None)
    if name == "ResNet50":
        return keras.applications.ResNet50(input_shape=shape, weights=None)
    if name == "EfficientNetB0":
        return keras.applications.EfficientNetB0(input_shape=shape, weights=None)
    if name == "Xception":
        return keras.applications.Xception(input_shape=shape, weights=None)
    if name == "ViT":
        return vit(image=size)
    raise SystemExit(f"unknown model {name!r}; choose from ResNet8, MobileNetV2, ResNet50, "
                     f"EfficientNetB0, Xception, ViT")


def train_step_fn(model):
    """One training step as `fit` runs it: forward, GradientTape, SGD apply, in a tf.function."""
    import keras
    import tensorflow as tf

    optimizer = keras.optimizers.SGD(1e-4)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    return step
