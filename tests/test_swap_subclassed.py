"""Subclassed models: layers held as attributes, in lists and dicts, in nested layers and models are
swapped - on a get_config/from_config copy, or in place with inplace=True - with the same weights,
outputs equal to the original with the exact kernel, equal gradients, and a .keras round trip
that keeps the arithmetic."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import graphswap
from conftest import assert_close_to_roundoff
from graphswap.errors import GraphswapError
from graphswap.swap import is_swapped

RNG = np.random.default_rng(3)


@keras.saving.register_keras_serializable(package="graphswap_tests")
class Block(keras.layers.Layer):
    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.fc = keras.layers.Dense(units, activation="relu", name="fc")
        self.norm = keras.layers.LayerNormalization(name="norm")

    def call(self, x):
        return self.norm(self.fc(x))

    def get_config(self):
        return {**super().get_config(), "units": self.fc.units}


@keras.saving.register_keras_serializable(package="graphswap_tests")
class Net(keras.Model):
    def __init__(self, units=6, **kwargs):
        super().__init__(**kwargs)
        self.conv = keras.layers.Conv2D(4, 3, padding="same", name="conv")
        self.dw = keras.layers.DepthwiseConv2D(3, name="dw")
        self.blocks = [Block(units, name="block0"), Block(units, name="block1")]
        self.heads = {"a": keras.layers.Dense(3, name="head_a"),
                      "b": keras.layers.Dense(2, name="head_b")}
        self.encoder = keras.Sequential([keras.layers.Dense(5, name="enc_fc")], name="encoder")
        self.flat = keras.layers.Flatten()

    def call(self, x):
        h = self.flat(self.dw(self.conv(x)))
        for block in self.blocks:
            h = block(h)
        h = self.encoder(h)
        return self.heads["a"](h), self.heads["b"](h)

    def get_config(self):
        return {**super().get_config(), "units": self.blocks[0].fc.units}


class Opaque(keras.Model):
    """A subclass Keras cannot copy: its __init__ takes a layer object and it has no get_config."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.out = keras.layers.Dense(2)

    def call(self, x):
        return self.out(self.inner(x))


def built_net():
    keras.utils.set_random_seed(1)
    model = Net(name="net")
    model(np.zeros((1, 6, 6, 3), np.float32))
    return model


def swapped_attributes(model):
    return [model.conv, model.dw, model.blocks[0].fc, model.blocks[1].fc, model.heads["a"],
            model.heads["b"], model.encoder.layers[0]]


def loss_and_gradients(model, x):
    with tf.GradientTape() as tape:
        a, b = model(x)
        loss = tf.reduce_sum(a * a) + tf.reduce_sum(tf.sin(b))
    return loss, tape.gradient(loss, model.trainable_weights)


def test_copy_swaps_attributes_lists_dicts_nested_layers_and_models():
    model = built_net()
    x = RNG.standard_normal((3, 6, 6, 3)).astype(np.float32)
    swapped, report = graphswap.rewrite_model(model, return_report=True)
    assert swapped is not model and not any(is_swapped(l) for l in swapped_attributes(model))
    assert all(is_swapped(l) for l in swapped_attributes(swapped))
    assert {e.path for e in report.swapped} == {
        "conv", "dw", "block0/fc", "block1/fc", "head_a", "head_b", "encoder/enc_fc"}
    assert "copy made through Net.get_config/from_config" in report.format_table()
    # the swapped layers took over the weights, in the same order
    for a, b in zip(swapped.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    for got, want in zip(swapped(x), model(x)):
        assert_close_to_roundoff(got.numpy(), want.numpy(), 64)
    loss_ref, g_ref = loss_and_gradients(model, x)
    loss, g = loss_and_gradients(swapped, x)
    assert_close_to_roundoff(loss.numpy(), loss_ref.numpy(), 64)
    assert len(g) == len(g_ref) == 18
    for a, b in zip(g, g_ref):
        assert_close_to_roundoff(a.numpy(), b.numpy(), 256)


def test_selection_and_kernel_map_use_the_original_names():
    model = built_net()
    swapped, report = graphswap.rewrite_model(model, kernel=None,
                                              kernel_map={"block0/*": "mul8s_drum4"},
                                              return_report=True)
    assert [e.path for e in report.swapped] == ["block0/fc"]
    assert swapped.blocks[0].fc.arithmetic.spec == "mul8s_drum4"
    assert not is_swapped(swapped.blocks[1].fc)
    only_conv = graphswap.rewrite_model(model, layer_types=["Conv2D"])
    assert is_swapped(only_conv.conv) and not is_swapped(only_conv.dw)


def test_saved_swapped_subclass_reloads_with_its_arithmetic(tmp_path):
    model = built_net()
    swapped = graphswap.rewrite_model(model, kernel="mul8s_drum4")
    x = RNG.standard_normal((2, 6, 6, 3)).astype(np.float32)
    expected = [t.numpy() for t in swapped(x)]
    swapped.save(tmp_path / "net.keras")
    loaded = keras.models.load_model(tmp_path / "net.keras")
    assert isinstance(loaded, Net)
    assert all(is_swapped(l) and l.arithmetic.spec == "mul8s_drum4"
               for l in swapped_attributes(loaded))
    for got, want in zip(loaded(x), expected):
        np.testing.assert_array_equal(got.numpy(), want)
    # and once more: a reloaded swapped model saves and reloads again
    loaded.save(tmp_path / "again.keras")
    again = keras.models.load_model(tmp_path / "again.keras")
    np.testing.assert_array_equal(again(x)[0].numpy(), expected[0])


def test_a_subclass_that_cannot_be_copied_needs_inplace():
    model = Opaque(keras.layers.Dense(4))
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    expected = model(x).numpy()
    with pytest.raises(GraphswapError, match=r"cannot be copied.*inplace=True"):
        graphswap.rewrite_model(model)
    assert not is_swapped(model.inner)
    same, report = graphswap.rewrite_model(model, inplace=True, return_report=True)
    assert same is model and is_swapped(model.inner) and is_swapped(model.out)
    assert "IN PLACE" in report.format_table()
    assert_close_to_roundoff(model(x).numpy(), expected, 8)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x))
    assert all(g is not None for g in tape.gradient(loss, model.trainable_weights))


def test_inplace_is_refused_for_functional_models(lenet):
    with pytest.raises(GraphswapError, match="inplace=True is for subclassed models"):
        graphswap.rewrite_model(lenet, inplace=True)


def test_convert_on_a_saved_subclassed_model_with_custom_objects(tmp_path):
    from click.testing import CliRunner

    from graphswap.cli import main

    module = tmp_path / "netdef.py"
    module.write_text(
        "import keras\n\n"
        "@keras.saving.register_keras_serializable(package='netdef')\n"
        "class Tiny(keras.Model):\n"
        "    def __init__(self, units=3, **kwargs):\n"
        "        super().__init__(**kwargs)\n"
        "        self.layers_ = [keras.layers.Conv1D(4, 3, padding='causal'),\n"
        "                        keras.layers.Flatten(), keras.layers.Dense(units)]\n"
        "    def call(self, x):\n"
        "        for layer in self.layers_:\n"
        "            x = layer(x)\n"
        "        return x\n"
        "    def get_config(self):\n"
        "        return {**super().get_config(), 'units': self.layers_[-1].units}\n")
    script = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import numpy as np, netdef; "
              f"m = netdef.Tiny(); m(np.zeros((1, 8, 2), 'float32')); "
              f"m.save({str(tmp_path / 'tiny.keras')!r})")
    from conftest import run_python

    done = run_python(script)
    assert done.returncode == 0, done.stderr
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "tiny.keras"), "--kernel",
                                       "mul8s_drum4", "--custom-objects", str(module)])
    assert result.exit_code == 0, result.output
    assert "2 of 2 layers with weights swapped; 100.0% of" in result.output
    assert "Conv1D" in result.output
