"""Models the benchmarks build (not part of the package): ResNet-8 for CIFAR-shaped inputs, a
ViT-Ti/16-style model, the keras.applications models (weights=None: nothing downloaded), the
small edge models (MobileNetV1-0.25 at 96x96, the MLPerf Tiny DS-CNN, a stride-2
Conv2DTranspose decoder, an Embedding + LSTM text classifier), two larger ones (an image-codec
decoder of 3x3/5x5/7x7 stride-2 Conv2DTranspose layers, a stack of 1024-wide Dense layers); and
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


def ds_cnn(seed: int = 0, classes: int = 12, filters: int = 64, blocks: int = 4):
    """The MLPerf Tiny keyword-spotting DS-CNN: 49x10 MFCC frames, a (10, 4) stride-2 Conv2D of
    64 filters, four depthwise-separable blocks of 64 (DepthwiseConv2D 3x3 and a 1x1 Conv2D, each
    followed by BatchNormalization and ReLU), global pooling, a Dense head of 12 classes."""
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((49, 10, 1), name="mfcc")
    x = keras.layers.Conv2D(filters, (10, 4), strides=(2, 2), padding="same", name="stem")(inputs)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
    for i in range(blocks):
        x = keras.layers.DepthwiseConv2D(3, padding="same", name=f"dw{i}")(x)
        x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
        x = keras.layers.Conv2D(filters, 1, name=f"pw{i}")(x)
        x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
    x = keras.layers.Dropout(0.4)(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(classes, activation="softmax", name="fc")(x)
    return keras.Model(inputs, outputs, name="ds_cnn")


def conv_decoder(seed: int = 0, code: int = 32):
    """An image decoder: Dense -> Reshape (6, 6, 64) -> four stride-2 Conv2DTranspose layers
    (64, 32, 16, 3 filters, 3x3, 'same') to a 96x96x3 sigmoid image."""
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((code,), name="code")
    x = keras.layers.Dense(6 * 6 * 64, activation="relu", name="project")(inputs)
    x = keras.layers.Reshape((6, 6, 64))(x)
    for i, filters in enumerate((64, 32, 16)):
        x = keras.layers.Conv2DTranspose(filters, 3, strides=2, padding="same",
                                         activation="relu", name=f"up{i}")(x)
    outputs = keras.layers.Conv2DTranspose(3, 3, strides=2, padding="same",
                                           activation="sigmoid", name="image")(x)
    return keras.Model(inputs, outputs, name="conv_decoder")


def codec_decoder(seed: int = 0):
    """An image-codec decoder: 16x16x16 latents -> three stride-2 'same'
    Conv2DTranspose layers with ReLU (3x3/16, 5x5/32, 7x7/128 filters: 32x32, 64x64, 128x128)
    -> Conv2D 3x3/3 sigmoid, a 128x128x3 image."""
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((16, 16, 16), name="latents")
    x = inputs
    for i, (kernel, filters) in enumerate(((3, 16), (5, 32), (7, 128))):
        x = keras.layers.Conv2DTranspose(filters, kernel, strides=2, padding="same",
                                         activation="relu", name=f"up{i}")(x)
    outputs = keras.layers.Conv2D(3, 3, padding="same", activation="sigmoid", name="image")(x)
    return keras.Model(inputs, outputs, name="codec_decoder")


def dense1024(seed: int = 0, width: int = 1024, depth: int = 3):
    """`depth` Dense(1024) layers with ReLU over 1024 features, and a Dense(10) head."""
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((width,), name="features")
    x = inputs
    for i in range(depth):
        x = keras.layers.Dense(width, activation="relu", name=f"fc{i}")(x)
    outputs = keras.layers.Dense(10, activation="softmax", name="head")(x)
    return keras.Model(inputs, outputs, name="dense1024")


def lstm_text(seed: int = 0, vocabulary: int = 2000, length: int = 100, units: int = 64,
              classes: int = 2):
    """A text classifier: Embedding(vocabulary, 64) over `length` token ids, LSTM(64), a Dense
    softmax head."""
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((length,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(vocabulary, 64, name="embed")(inputs)
    x = keras.layers.LSTM(units, name="lstm")(x)
    outputs = keras.layers.Dense(classes, activation="softmax", name="fc")(x)
    return keras.Model(inputs, outputs, name="lstm_text")


# the small edge models (bench_models.py runs them at --batch, the decoder at --decoder-batch)
EDGE_MODELS = ("MobileNetV1", "DSCNN", "Decoder", "LSTM")
# a real image-codec decoder, and a stack of 1024-wide Dense layers
CODEC_AND_DENSE = ("CodecDecoder", "Dense1024")
NAMES = ("ResNet8", "MobileNetV2", "ResNet50", "EfficientNetB0", "Xception", "ViT") \
    + EDGE_MODELS + CODEC_AND_DENSE


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
    if name == "MobileNetV1":  # the MLPerf Tiny visual-wake-words model: always 96x96x3
        keras.utils.set_random_seed(0)
        return keras.applications.MobileNet(alpha=0.25, input_shape=(96, 96, 3), weights=None,
                                            classes=2)
    if name == "DSCNN":
        return ds_cnn()
    if name == "Decoder":
        return conv_decoder()
    if name == "LSTM":
        return lstm_text()
    if name == "CodecDecoder":
        return codec_decoder()
    if name == "Dense1024":
        return dense1024()
    raise SystemExit(f"unknown model {name!r}; choose from {', '.join(NAMES)}")


def train_step_fn(model, loss="sparse_categorical_crossentropy"):
    """One training step as `fit` runs it: forward, GradientTape, SGD apply, in a tf.function.
    `loss`: a Keras loss name (class indices for the default; "mse" for a decoder)."""
    import keras
    import tensorflow as tf

    optimizer = keras.optimizers.SGD(1e-4)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.get(loss)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    return step
