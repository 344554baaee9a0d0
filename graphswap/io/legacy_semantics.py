"""What a Keras 2 config *means* that Keras 3 would compute differently: the table of every
Keras 2 -> 3 change of meaning the translation handles (docs/LEGACY.md prints it), and the two
kinds of change applied to a layer's config before Keras 3 builds it.

- **A function that changed its formula.** Keras 2's `hard_sigmoid` is clip(0.2 x + 0.5, 0, 1);
  Keras 3's is clip(x / 6 + 0.5, 0, 1) (max |difference| 1/12, 0.57 seen at a published GRU's
  output).  Every `activation` / `recurrent_activation` of a Keras layer (Activation, Dense,
  convolutions, LSTM/GRU/SimpleRNN and their cells, ConvLSTM) that names `hard_sigmoid` becomes
  `graphswap>keras2_hard_sigmoid`, a registered function of plain ops (Mul, Add, ClipByValue): it
  saves, reloads, runs on every backend and exports (ONNX `Clip`).
- **A default that changed.** A key absent from a Keras 2 config meant Keras 2's default, which
  Keras 3 may not share (GRU `reset_after`, the recurrent activation of Keras 2.0-2.2 and of
  ConvLSTM, the data format of 1D layers): the key is written with Keras 2's value, by the Keras
  version that wrote the file.

Keras 2 files are also compared with tf_keras' own load of the same file where tf_keras is
installed (graphswap.io.legacy_reference), which catches a change this table misses.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import Callable

import keras

KERAS2_HARD_SIGMOID = "graphswap>keras2_hard_sigmoid"
#: the config keys that hold an activation function in Keras layers
ACTIVATION_KEYS = ("activation", "recurrent_activation")


@keras.saving.register_keras_serializable(package="graphswap", name="keras2_hard_sigmoid")
def keras2_hard_sigmoid(x):
    """Keras 2's hard sigmoid: clip(0.2 * x + 0.5, 0, 1), the ops tf_keras runs, in its order."""
    return keras.ops.clip(x * 0.2 + 0.5, 0.0, 1.0)


def keras_version(text) -> tuple | None:
    """(major, minor) of a Keras version string ("2.2.4", "2.2.4-tf", "2.15.0"), or None."""
    match = re.match(r"\s*(\d+)\.(\d+)", str(text or ""))
    return (int(match.group(1)), int(match.group(2))) if match else None


def _before_2_3(version) -> bool:
    """Keras 2.0-2.2 (and a file that does not say which Keras wrote it: the oldest ones)."""
    return version is None or version < (2, 3)


@dataclasses.dataclass(frozen=True)
class SemanticChange:
    """One Keras 2 -> 3 change of meaning and what the translation does about it.

    `key` / `classes` / `absent`: a default that changed - for a config of one of `classes`
    without `key`, `absent(version)` is Keras 2's value (None: Keras 3's default is the same)."""

    name: str
    keras2: str
    keras3: str
    handling: str
    classes: tuple = ()
    key: str | None = None
    absent: Callable | None = None


_RECURRENT_GATES = ("LSTM", "LSTMCell", "GRU", "GRUCell")
_CONV_LSTM = ("ConvLSTM1D", "ConvLSTM2D", "ConvLSTM3D")
_ONE_D = ("Conv1D", "AveragePooling1D", "MaxPooling1D", "GlobalAveragePooling1D",
          "GlobalMaxPooling1D")

#: every Keras 2 -> 3 change of meaning handled (docs/LEGACY.md holds the same table)
SEMANTIC_CHANGES = (
    SemanticChange(
        "hard_sigmoid", "clip(0.2 x + 0.5, 0, 1)", "clip(x / 6 + 0.5, 0, 1)",
        f"`activation` / `recurrent_activation` 'hard_sigmoid' of every Keras layer (nested in "
        f"wrappers and RNN cells too) becomes `{KERAS2_HARD_SIGMOID}`, Keras 2's formula as "
        f"plain ops"),
    SemanticChange(
        "GRU reset_after", "False in Keras 2.0-2.2 (the earliest files have no key); True in "
        "tf.keras 2 (and Keras 2.3)", "True",
        "an absent key gets the writing version's default (False up to 2.2, and when no version "
        "is recorded)", _RECURRENT_GATES[2:], "reset_after",
        lambda version: False if _before_2_3(version) else None),
    SemanticChange(
        "LSTM/GRU recurrent_activation", "'hard_sigmoid' in Keras 2.0-2.2; 'sigmoid' from 2.3 "
        "and in tf.keras 2", "'sigmoid'",
        "an absent key gets the writing version's default (then Keras 2's hard_sigmoid)",
        _RECURRENT_GATES, "recurrent_activation",
        lambda version: "hard_sigmoid" if _before_2_3(version) else None),
    SemanticChange(
        "ConvLSTM recurrent_activation", "'hard_sigmoid' (every Keras 2)", "'sigmoid'",
        "an absent key gets 'hard_sigmoid' (then Keras 2's hard_sigmoid)", _CONV_LSTM,
        "recurrent_activation", lambda version: "hard_sigmoid"),
    SemanticChange(
        "1D layers' data_format", "'channels_last' (Conv1D, 1D pooling)",
        "None: keras.config.image_data_format()",
        "an absent key gets 'channels_last' (a keras.json saying channels_first would transpose "
        "them)", _ONE_D, "data_format", lambda version: "channels_last"),
    SemanticChange(
        "other activation functions", "elu, exponential, gelu, linear, mish, relu, selu, "
        "sigmoid, softmax, softplus, softsign, swish, tanh", "the same formulas",
        "none needed (checked on [-6, 6]: equal bit for bit)"),
    SemanticChange(
        "BatchNormalization epsilon and momentum, LayerNormalization epsilon",
        "1e-3 and 0.99, 1e-3", "1e-3 and 0.99, 1e-3",
        "none needed (checked); Keras 2's fused kernel and Keras 3's formula differ by "
        "round-off"),
    SemanticChange(
        "BatchNormalization renorm, virtual_batch_size, adjustment", "supported",
        "not supported", "refused by name unless they hold the value that changes nothing"),
    SemanticChange(
        "time_major of recurrent layers", "supported", "not supported",
        "refused by name when True"),
    SemanticChange(
        "groups of depthwise / separable / transposed convolutions", "an option (1)",
        "no option", "dropped when 1, refused by name otherwise"),
    SemanticChange(
        "LeakyReLU alpha", "alpha (default 0.3)", "negative_slope (default 0.3)",
        "renamed"),
    SemanticChange(
        "MultiHeadAttention masking", "adds -1e9 to masked scores",
        "tf.where on masked scores (softmax_robust_masking)",
        "the option is dropped: equal unless a score is itself near 1e9"),
)

_ABSENT = {}
for _change in SEMANTIC_CHANGES:
    for _class_name in _change.classes:
        _ABSENT.setdefault(_class_name, []).append(_change)


def _names_hard_sigmoid(value) -> bool:
    if value == "hard_sigmoid":
        return True
    return isinstance(value, dict) and value.get("config") == "hard_sigmoid" and \
        value.get("class_name") in ("function", "hard_sigmoid")


def fill_absent(class_name: str, layer_config: dict, version) -> None:
    """Write Keras 2's default (of the writing `version`: (major, minor) or None) into a layer
    config for every key it leaves out whose default Keras 3 changed (in place)."""
    for change in _ABSENT.get(class_name, ()):
        if change.key not in layer_config:
            value = change.absent(version)
            if value is not None:
                layer_config[change.key] = value


def apply_semantics(class_name: str, layer_config: dict, version) -> None:
    """Give a Keras layer's config Keras 2's meaning for Keras 3 (in place): absent keys with
    Keras 2's defaults (fill_absent), then Keras 2's hard_sigmoid wherever the config names it."""
    fill_absent(class_name, layer_config, version)
    for key in ACTIVATION_KEYS:
        if _names_hard_sigmoid(layer_config.get(key)):
            layer_config[key] = keras.activations.serialize(keras2_hard_sigmoid)


def with_keras2_defaults(config: dict, version) -> dict:
    """A copy of a Keras 2 model config with Keras 2's defaults written out (fill_absent, at any
    depth): what the file meant, for a tf_keras whose own defaults are newer than the file's."""
    config = copy.deepcopy(config)

    def walk(entry):
        if not isinstance(entry, dict) or not isinstance(entry.get("config"), dict):
            return
        layer_config = entry["config"]
        children = list(layer_config.get("layers") or []) + list(layer_config.get("cells") or [])
        children += [layer_config.get(key) for key in ("layer", "backward_layer", "cell")]
        for child in children:
            walk(child)
        fill_absent(entry.get("class_name"), layer_config, version)

    walk(config)
    return config
