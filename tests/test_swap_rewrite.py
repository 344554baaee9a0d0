"""rewrite_model: equality with the original (outputs and every weight's gradient), topology,
weights transfer, immutability of the input, selection, save/load, training."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import graphswap
from conftest import (assert_close_to_roundoff, build_nested_functional, gradient_terms,
                      load_sample_script, reduction_terms, run_python)
from graphswap import SwappedConv2D, SwappedDense
from graphswap.errors import GraphswapError, KernelSpecError, UnsupportedLayerError


def _weight_snapshot(model):
    return [w.numpy().copy() for w in model.weights]


def _loss_and_grads(model, inputs, targets, loss_fn):
    with tf.GradientTape() as tape:
        outputs = model(inputs, training=True)
        outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        loss = tf.add_n([loss_fn[i](t, o) for i, (t, o) in enumerate(zip(targets, outputs))])
    return loss, tape.gradient(loss, model.trainable_weights)


def test_sample_model_outputs_and_gradients_equal_original(lenet, digits):
    before = _weight_snapshot(lenet)
    swapped = graphswap.rewrite_model(lenet, kernel="exact")
    x = digits["x_test"][:64].astype(np.float32)
    # Random labels: on the true labels this 99.7%-accurate model has softmax outputs ~1, and its
    # loss gradient (p - onehot) is a cancellation that amplifies forward round-off ~1e4-fold; with
    # random labels the same comparison measures the gradients themselves.
    y = np.random.default_rng(0).integers(0, 10, 64)
    assert_close_to_roundoff(swapped(x).numpy(), lenet(x).numpy(), reduction_terms(lenet))
    loss_fn = [keras.losses.SparseCategoricalCrossentropy()]
    loss_ref, grads_ref = _loss_and_grads(lenet, x, [y], loss_fn)
    loss, grads = _loss_and_grads(swapped, x, [y], loss_fn)
    def names(model):
        return [w.path.split("/")[-2:] for w in model.trainable_weights]

    assert names(swapped) == names(lenet)
    assert len(grads) == len(grads_ref) == 10
    assert_close_to_roundoff(loss, loss_ref, reduction_terms(lenet) + 64)
    for g, g_ref, terms in zip(grads, grads_ref, gradient_terms(lenet, 64)):
        assert_close_to_roundoff(g, g_ref, terms)
    # the input model is untouched and shares no layer with the rewrite
    for a, b in zip(before, _weight_snapshot(lenet)):
        np.testing.assert_array_equal(a, b)
    assert not {id(layer) for layer in lenet.layers} & {id(layer) for layer in swapped.layers}
    assert [type(layer).__name__ for layer in lenet.layers] == [
        "Rescaling", "Conv2D", "MaxPooling2D", "Conv2D", "MaxPooling2D", "Flatten", "Dense",
        "Dense", "Dense"]


def test_nested_shared_multi_io_model(nested_model):
    model = nested_model
    before = _weight_snapshot(model)
    swapped, report = graphswap.rewrite_model(model, kernel="exact", return_report=True)
    swapped_paths = sorted(e.path for e in report.swapped)
    assert swapped_paths == sorted([
        "inner_func/inner_seq/inner_conv", "inner_func/inner_seq/inner_conv_s2",
        "inner_func/inner_dense", "shared_dense", "vec_dense", "head_a", "head_b"])
    # nested models are rebuilt with swapped layers inside
    inner_func = swapped.get_layer("inner_func")
    assert isinstance(inner_func.get_layer("inner_seq").get_layer("inner_conv"), SwappedConv2D)
    # the shared layer stays one shared layer
    shared = swapped.get_layer("shared_dense")
    assert isinstance(shared, SwappedDense) and len(shared._inbound_nodes) == 2
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((6, 8, 8, 3)).astype(np.float32),
              rng.standard_normal((6, 7)).astype(np.float32)]
    targets = [rng.integers(0, 3, 6), rng.standard_normal((6, 1)).astype(np.float32)]
    for out, ref in zip(swapped(inputs), model(inputs)):
        assert_close_to_roundoff(out.numpy(), ref.numpy(), reduction_terms(model))
    loss_fn = [keras.losses.SparseCategoricalCrossentropy(), keras.losses.MeanSquaredError()]
    loss_ref, grads_ref = _loss_and_grads(model, inputs, targets, loss_fn)
    loss, grads = _loss_and_grads(swapped, inputs, targets, loss_fn)
    assert len(grads) == len(grads_ref) == len(model.trainable_weights)
    for g, g_ref, terms in zip(grads, grads_ref, gradient_terms(model, 6)):
        assert_close_to_roundoff(g, g_ref, terms)
    for a, b in zip(before, _weight_snapshot(model)):
        np.testing.assert_array_equal(a, b)


def test_selection_by_include_exclude_type_and_map(nested_model):
    _, report = graphswap.rewrite_model(nested_model, include="head", return_report=True)
    assert sorted(e.path for e in report.swapped) == ["head_a", "head_b"]
    _, report = graphswap.rewrite_model(nested_model, exclude=["inner", "head_b"],
                                        return_report=True)
    assert sorted(e.path for e in report.swapped) == ["head_a", "shared_dense", "vec_dense"]
    _, report = graphswap.rewrite_model(nested_model, layer_types=("Conv2D",), return_report=True)
    assert all(e.layer_type == "Conv2D" for e in report.swapped) and len(report.swapped) == 2
    swapped, report = graphswap.rewrite_model(
        nested_model, kernel=None, kernel_map={"head_*": "bf16", "vec_dense": "exact"},
        return_report=True)
    assert {e.path: e.kernel for e in report.swapped} == {
        "head_a": "bf16", "head_b": "bf16", "vec_dense": "exact"}
    assert swapped.get_layer("head_a").swap_kernel == {"spec": "bf16"}
    kept = {e.path: e.reason for e in report.layers if e.action == "kept"}
    assert kept["shared_dense"] == "not in kernel map"


def test_kernel_map_naming_missing_layer_is_an_error(nested_model, tmp_path):
    path = tmp_path / "map.json"
    path.write_text('{"kernel_map": {"no_such_layer": "exact"}}')
    with pytest.raises(GraphswapError, match="kernel map names layer.*no_such_layer"):
        graphswap.rewrite_model(nested_model, kernel_map=str(path))
    path.write_text('{"a": 3}')
    with pytest.raises(GraphswapError, match="must be a JSON object"):
        graphswap.rewrite_model(nested_model, kernel_map=str(path))


def test_report_counts_macs(lenet):
    report = graphswap.plan(lenet)
    macs = {e.path: e.macs for e in report.layers if e.macs}
    assert macs == {"conv1": 28 * 28 * 6 * 25, "conv2": 10 * 10 * 16 * 25 * 6,
                    "fc1": 400 * 120, "fc2": 120 * 84, "predictions": 84 * 10}
    assert "5 of 5 layers with weights swapped" in report.format_table()


def test_subclassed_model_is_rewritten_but_cloning_it_is_refused_clearly():
    class Custom(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    model = Custom()
    model(np.ones((1, 3), np.float32))
    swapped = graphswap.rewrite_model(model, inplace=True)  # (tests/test_swap_subclassed.py)
    assert type(swapped.dense).__name__ == "SwappedDense"
    # exports and gradient overrides clone the graph, which a subclassed model does not have
    with pytest.raises(UnsupportedLayerError, match="subclassed model.*Sequential and Functional"):
        graphswap.transform_model(model, lambda path, layer: None)


def test_unknown_kernel_is_refused_before_any_work(lenet):
    with pytest.raises(KernelSpecError, match="unknown kernel 'mul9_foo'.*graphswap kernels"):
        graphswap.rewrite_model(lenet, kernel="mul9_foo")


def test_save_load_round_trip_and_keeps_training(lenet, digits, tmp_path):
    swapped = graphswap.rewrite_model(lenet, kernel="exact")
    path = tmp_path / "m.keras"
    swapped.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.get_layer("conv1"), SwappedConv2D)
    x = digits["x_test"][:32].astype(np.float32)
    np.testing.assert_array_equal(loaded(x).numpy(), swapped(x).numpy())
    # the compile settings travelled with the model; the loaded model trains
    assert loaded.compiled and loaded.loss == "sparse_categorical_crossentropy"
    before = loaded.get_layer("fc1").kernel.numpy().copy()
    loaded.fit(digits["x_train"][:64], digits["y_train"][:64], epochs=1, verbose=0)
    assert not np.array_equal(before, loaded.get_layer("fc1").kernel.numpy())


def test_fit_lowers_the_loss(digits):
    keras.utils.set_random_seed(3)
    model = graphswap.rewrite_model(load_sample_script().make_lenet5())
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    x, y = digits["x_train"], digits["y_train"]
    initial = model.evaluate(x, y, verbose=0)
    model.fit(x, y, epochs=1, batch_size=32, verbose=0)
    assert model.evaluate(x, y, verbose=0) < 0.9 * initial


def test_mirrored_strategy_with_two_logical_cpus_trains():
    result = run_python("""
        import numpy as np, tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
        import keras, graphswap
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        assert strategy.num_replicas_in_sync == 2
        keras.utils.set_random_seed(0)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((256, 6, 6, 2)).astype("float32")
        y = (x.sum(axis=(1, 2, 3)) > 0).astype("int64")
        with strategy.scope():
            base = keras.Sequential([keras.Input((6, 6, 2)), keras.layers.Conv2D(4, 3),
                                     keras.layers.Flatten(), keras.layers.Dense(2)])
            model = graphswap.rewrite_model(base)
            model.compile(keras.optimizers.SGD(0.05),
                          keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        first = model.evaluate(x, y, verbose=0)
        model.fit(x, y, epochs=3, batch_size=32, verbose=0)
        last = model.evaluate(x, y, verbose=0)
        print("LOSS", first, last)
        assert last < first
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "LOSS" in result.stdout


def test_rewriting_a_swapped_model_keeps_its_kernels(lenet):
    once = graphswap.rewrite_model(lenet, kernel="bf16")
    twice, report = graphswap.rewrite_model(once, kernel="exact", return_report=True)
    assert not report.swapped
    assert twice.get_layer("fc1").swap_kernel == {"spec": "bf16"}
    assert "already swapped (bf16)" in {e.reason for e in report.layers}
