"""Swapped LSTM / GRU / SimpleRNN / RNN(cell) / Bidirectional against the stock Keras layers:
outputs and every weight's gradient (through time) equal to float32 round-off with the exact
kernel, for the layer options Keras offers (sequences, states, go_backwards, masking, unroll,
no bias, implementation 1, both GRU variants, dropout in training); with `mul8u_drum4` the
recurrence equals an independent numpy reference built step by step on tests/reference.py's
quantized matmul; saving and reloading; static calibration of both operands; MAC counts against
the hand formula timesteps x (input_dim + units) x gates x units; what cannot be swapped is kept,
named and counted."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import reference
from conftest import assert_close_to_roundoff
from test_kernels_security import attack  # noqa: F401 - the fixture of the tampering test
from graphswap.swap import rewrite_model
from graphswap.swap.layers_recurrent import (SwappedBidirectional, SwappedGRU, SwappedLSTM,
                                             SwappedRNN, SwappedSimpleRNN)

STEPS, FEATURES, UNITS, BATCH = 5, 4, 3, 6


def _inputs(seed=0, batch=BATCH):
    return np.random.default_rng(seed).normal(size=(batch, STEPS, FEATURES)).astype(np.float32)


def _model(layer, masked=False):
    inputs = keras.Input((STEPS, FEATURES))
    x = keras.layers.Masking(0.0)(inputs) if masked else inputs
    outputs = layer(x)
    if isinstance(outputs, (list, tuple)):
        outputs = keras.layers.Concatenate()(list(outputs))
    return keras.Model(inputs, outputs)


CASES = {
    "lstm_sequences": lambda: keras.layers.LSTM(UNITS, return_sequences=True),
    "lstm_state_backwards": lambda: keras.layers.LSTM(UNITS, return_state=True,
                                                      go_backwards=True),
    "lstm_no_bias_unroll": lambda: keras.layers.LSTM(UNITS, use_bias=False, unroll=True),
    "lstm_implementation_1": lambda: keras.layers.LSTM(UNITS, implementation=1,
                                                       return_sequences=True),
    "gru_reset_after": lambda: keras.layers.GRU(UNITS, return_sequences=True),
    "gru_reset_before": lambda: keras.layers.GRU(UNITS, reset_after=False, return_state=True),
    "simple_rnn": lambda: keras.layers.SimpleRNN(UNITS, return_sequences=True),
    "rnn_of_lstm_cell": lambda: keras.layers.RNN(keras.layers.LSTMCell(UNITS)),
    "bidirectional_lstm": lambda: keras.layers.Bidirectional(
        keras.layers.LSTM(UNITS, return_sequences=True)),
    "bidirectional_gru_sum": lambda: keras.layers.Bidirectional(
        keras.layers.GRU(UNITS, reset_after=False), merge_mode="sum"),
}
SWAPPED_TYPE = {"lstm": SwappedLSTM, "gru": SwappedGRU, "simple": SwappedSimpleRNN,
                "rnn": SwappedRNN, "bidirectional": SwappedBidirectional}


def _loss_and_gradients(model, x, training=False):
    with tf.GradientTape() as tape:
        y = model(x, training=training)
        loss = tf.reduce_sum(y * y)
    return y, tape.gradient(loss, model.trainable_weights)


@pytest.mark.parametrize("masked", [False, True], ids=["plain", "masked"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_exact_kernel_equals_stock_outputs_and_gradients(case, masked):
    keras.utils.set_random_seed(1)
    model = _model(CASES[case](), masked)
    x = _inputs()
    if masked:
        x[0, -2:] = 0.0   # trailing padding in one example
        x[1, :1] = 0.0    # leading padding in another
    swapped, report = rewrite_model(model, return_report=True)
    layer = [layer for layer in swapped.layers if hasattr(layer, "arithmetic")][0]
    assert type(layer) is SWAPPED_TYPE[case.split("_")[0]], [type(l) for l in swapped.layers]
    assert len(report.swapped) == 1
    y_stock, g_stock = _loss_and_gradients(model, x)
    y_swapped, g_swapped = _loss_and_gradients(swapped, x)
    terms = STEPS * (FEATURES + UNITS) * 2
    assert_close_to_roundoff(y_swapped, y_stock, terms)
    assert [w.path for w in swapped.trainable_weights] == [w.path for w in model.trainable_weights]
    for weight, got, want in zip(model.trainable_weights, g_swapped, g_stock):
        assert got is not None, weight.path
        assert_close_to_roundoff(got, want, terms * BATCH * STEPS,
                                 magnitude=np.abs(np.asarray(want)).max() + 1e-3)


@pytest.mark.parametrize("layer", [
    lambda: keras.layers.LSTM(UNITS, dropout=0.3, recurrent_dropout=0.3, seed=4,
                              return_sequences=True),
    lambda: keras.layers.GRU(UNITS, dropout=0.3, recurrent_dropout=0.2, seed=5),
    lambda: keras.layers.SimpleRNN(UNITS, dropout=0.4, recurrent_dropout=0.4, seed=6)],
    ids=["lstm", "gru", "simple_rnn"])
def test_dropout_in_training_equals_stock(layer):
    """The same seeds give the same masks: a training call (dropout on both operands) equals the
    stock layer's, gradients included - and differs from the inference call."""
    keras.utils.set_random_seed(2)
    model = _model(layer())
    swapped = rewrite_model(model)
    x = _inputs(3)
    y_stock, g_stock = _loss_and_gradients(model, x, training=True)
    y_swapped, g_swapped = _loss_and_gradients(swapped, x, training=True)
    terms = STEPS * (FEATURES + UNITS) * 2
    assert_close_to_roundoff(y_swapped, y_stock, terms)
    assert np.abs(np.asarray(y_swapped) - np.asarray(swapped(x))).max() > 1e-3
    for got, want in zip(g_swapped, g_stock):
        assert_close_to_roundoff(got, want, terms * BATCH * STEPS,
                                 magnitude=np.abs(np.asarray(want)).max() + 1e-3)


# --------------------------------------------------------------------------------------------
# LUT kernel: an independent numpy recurrence on tests/reference.py's quantized matmul
# --------------------------------------------------------------------------------------------

def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def _reference_sequence(kind, weights, x, table, mode=None, ranges=None, reset_after=True):
    """h_t for every step, each product quantized on its own operand (reference.quantized_matmul,
    dynamic per call unless `ranges` {operand: (lo, hi)} gives static ones)."""
    ranges = ranges or {}

    def product(a, w, operand):
        step_mode = dict(mode or {})
        if operand in ranges:
            step_mode["activation_range"] = ranges[operand]
        return reference.quantized_matmul(a, w, table, False, step_mode).astype(np.float64)

    kernel, recurrent = weights[0], weights[1]
    bias = weights[2] if len(weights) > 2 else None
    units = recurrent.shape[0]
    h = np.zeros((x.shape[0], units), np.float32)
    c = np.zeros_like(h)
    outputs = []
    for t in range(x.shape[1]):
        x_t = x[:, t]
        if kind == "lstm":
            z = product(x_t, kernel, "x") + bias + product(h, recurrent, "h")
            i, f, g, o = np.split(z, 4, axis=1)
            c = (_sigmoid(f) * c + _sigmoid(i) * np.tanh(g)).astype(np.float32)
            h = (_sigmoid(o) * np.tanh(c)).astype(np.float32)
        elif kind == "simple_rnn":
            h = np.tanh(product(x_t, kernel, "x") + bias + product(h, recurrent, "h")
                        ).astype(np.float32)
        elif reset_after:   # GRU, bias (2, 3 units)
            x_z, x_r, x_h = np.split(product(x_t, kernel, "x") + bias[0], 3, axis=1)
            r_z, r_r, r_h = np.split(product(h, recurrent, "h") + bias[1], 3, axis=1)
            z, r = _sigmoid(x_z + r_z), _sigmoid(x_r + r_r)
            hh = np.tanh(x_h + r * r_h)
            h = (z * h + (1 - z) * hh).astype(np.float32)
        else:               # GRU, reset before the third recurrent product
            x_z, x_r, x_h = np.split(product(x_t, kernel, "x") + bias, 3, axis=1)
            r_z, r_r = np.split(product(h, recurrent[:, :2 * units], "h"), 2, axis=1)
            z, r = _sigmoid(x_z + r_z), _sigmoid(x_r + r_r)
            reset = (r * h).astype(np.float32)
            hh = np.tanh(x_h + product(reset, recurrent[:, 2 * units:], "rh"))
            h = (z * h + (1 - z) * hh).astype(np.float32)
        outputs.append(h)
    return np.stack(outputs, axis=1)


LUT_CASES = {
    "lstm": lambda: keras.layers.LSTM(UNITS, return_sequences=True),
    "gru": lambda: keras.layers.GRU(UNITS, return_sequences=True),
    "gru_reset_before": lambda: keras.layers.GRU(UNITS, reset_after=False,
                                                 return_sequences=True),
    "simple_rnn": lambda: keras.layers.SimpleRNN(UNITS, return_sequences=True),
}


@pytest.mark.parametrize("case", sorted(LUT_CASES))
def test_lut_recurrence_equals_numpy_reference(case):
    keras.utils.set_random_seed(3)
    model = _model(LUT_CASES[case]())
    swapped = rewrite_model(model, "mul8u_drum4")
    x = _inputs(4)
    table = reference.builtin_reference("mul8u_drum4")
    want = _reference_sequence(case.replace("_reset_before", ""), model.layers[-1].get_weights(),
                               x, table, reset_after=case != "gru_reset_before")
    got = np.asarray(swapped(x))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)
    # the approximate multiplier changes the result (the kernel really runs)
    assert np.abs(got - np.asarray(model(x))).max() > 1e-3


def test_static_ranges_of_both_operands_calibrate_save_and_match_reference(tmp_path):
    keras.utils.set_random_seed(4)
    model = _model(keras.layers.GRU(UNITS, reset_after=False, return_sequences=True))
    x = _inputs(5, batch=24)
    swapped, report = rewrite_model(model, "mul8u_drum4", bias_correction=None, calibration_data=x,
                                    calibration_method="minmax", return_report=True,
                                    weight_tuning=False, dynamic_fallback=False)
    cell = swapped.layers[-1].cell
    lo, hi = cell.current_quantization().activation_range
    assert (lo, hi) == pytest.approx((float(x.min()), float(x.max())))
    stock_h = np.asarray(model(x))            # the float recurrence the ranges were taken on
    ranges = cell.intermediate_ranges()
    assert ranges["recurrent"] == pytest.approx((min(stock_h.min(), 0.0), stock_h.max()),
                                                abs=1e-6)
    assert ranges["reset_state"] is not None and ranges["reset_state"][1] <= ranges[
        "recurrent"][1] + 1e-6
    assert any("intermediate operand" in note for note in report.notes)
    table = reference.builtin_reference("mul8u_drum4")
    want = _reference_sequence("gru", model.layers[-1].get_weights(), x, table,
                               ranges={"x": (lo, hi), "h": ranges["recurrent"],
                                       "rh": ranges["reset_state"]}, reset_after=False)
    np.testing.assert_allclose(np.asarray(swapped(x)), want, rtol=0, atol=2e-6)
    path = tmp_path / "gru.keras"
    swapped.save(path)
    reloaded = keras.models.load_model(path)
    assert reloaded.layers[-1].cell.intermediate_ranges() == ranges
    np.testing.assert_array_equal(np.asarray(reloaded(x)), np.asarray(swapped(x)))


@pytest.mark.parametrize("kernel", ["exact", "mul8u_drum4"])
def test_save_and_reload_in_the_same_process(tmp_path, kernel):
    keras.utils.set_random_seed(5)
    inputs = keras.Input((STEPS, FEATURES))
    x = keras.layers.Bidirectional(keras.layers.LSTM(UNITS, return_sequences=True))(inputs)
    x = keras.layers.GRU(UNITS, return_sequences=True)(x)
    x = keras.layers.RNN(keras.layers.SimpleRNNCell(UNITS))(x)
    model = keras.Model(inputs, keras.layers.Dense(2)(x))
    swapped = rewrite_model(model, kernel)
    path = tmp_path / "rnn.keras"
    swapped.save(path)
    reloaded = keras.models.load_model(path)
    assert [type(layer) for layer in reloaded.layers] == [type(layer) for layer in swapped.layers]
    for layer in reloaded.layers[1:]:
        assert layer.arithmetic.spec == kernel
    data = _inputs(6)
    np.testing.assert_array_equal(np.asarray(reloaded(data)), np.asarray(swapped(data)))
    config = reloaded.layers[2].get_config()
    assert config["arithmetic"] == {"spec": kernel}


def test_report_counts_recurrent_macs_by_the_hand_formula():
    inputs = keras.Input((STEPS, FEATURES))
    x = keras.layers.LSTM(UNITS, return_sequences=True)(inputs)             # 4 gates
    x = keras.layers.Bidirectional(keras.layers.GRU(2, return_sequences=True))(x)  # 3 gates x 2
    x = keras.layers.SimpleRNN(5)(x)
    model = keras.Model(inputs, keras.layers.Dense(2)(x))
    lstm = STEPS * (FEATURES + UNITS) * 4 * UNITS
    gru = 2 * STEPS * (UNITS + 2) * 3 * 2
    simple = STEPS * (2 * 2 + 5) * 5
    dense = 5 * 2
    _, report = rewrite_model(model, return_report=True)
    assert [e.macs for e in report.layers if e.macs] == [lstm, gru, simple, dense]
    assert report.kernel_macs == report.total_macs == lstm + gru + simple + dense
    # kept by type selection: still counted, as float
    _, kept = rewrite_model(model, layer_types=["Dense"], return_report=True)
    assert kept.total_macs == lstm + gru + simple + dense
    assert kept.kernel_macs == dense
    assert kept.by_type()["LSTM"] == {"layers": 1, "swapped": 0, "kernel_macs": 0,
                                      "float_macs": lstm}


def test_time_distributed_dense_is_swapped_and_counted_per_timestep():
    """TimeDistributed swaps the layer it wraps (not kept in float); the whole video model is
    tests/test_realmodels_timedistributed.py."""
    inputs = keras.Input((STEPS, FEATURES))
    x = keras.layers.LSTM(UNITS, return_sequences=True)(inputs)
    model = keras.Model(inputs, keras.layers.TimeDistributed(keras.layers.Dense(2))(x))
    _, report = rewrite_model(model, return_report=True)
    entry = report.layers[-1]
    assert entry.layer_type == "TimeDistributed" and entry.action == "swapped"
    assert entry.macs == STEPS * UNITS * 2
    assert report.total_macs == report.kernel_macs


def test_unswappable_cells_are_kept_named_and_counted():
    inputs = keras.Input((STEPS, FEATURES))
    stacked = keras.layers.RNN([keras.layers.LSTMCell(UNITS), keras.layers.GRUCell(2)])
    model = keras.Model(inputs, stacked(inputs))
    swapped, report = rewrite_model(model, return_report=True)
    entry = report.layers[-1]
    assert entry.action == "kept"
    assert "StackedRNNCells is not swappable" in entry.reason
    assert entry.macs == STEPS * ((FEATURES + UNITS) * 4 * UNITS + (UNITS + 2) * 3 * 2)
    assert report.kernel_macs == 0 and report.total_macs == entry.macs
    assert type(swapped.layers[-1]) is keras.layers.RNN


def test_lut_grad_through_a_cell_is_dense_lut_grad_on_one_step():
    """backward="lut_grad" (the table's own derivatives) in a recurrent cell: one step from a
    zero state is a Dense layer with the cell's kernel - the same loss and gradients, bit for bit
    - and it differs from the straight-through estimator; several steps train."""
    keras.utils.set_random_seed(12)
    x = _inputs(15)[:, :1]
    inputs = keras.Input((1, FEATURES))
    rnn = keras.layers.SimpleRNN(UNITS)
    model = keras.Model(inputs, rnn(inputs))
    dense_inputs = keras.Input((FEATURES,))
    dense = keras.layers.Dense(UNITS, activation="tanh")
    dense_model = keras.Model(dense_inputs, dense(dense_inputs))
    kernel, _, bias = rnn.get_weights()
    dense.set_weights([kernel, bias])
    swapped = rewrite_model(model, "mul8u_drum4", backward="lut_grad")
    swapped_dense = rewrite_model(dense_model, "mul8u_drum4", backward="lut_grad")
    y, (g_kernel, g_recurrent, g_bias) = _loss_and_gradients(swapped, x)
    y_dense, (g_dense_kernel, g_dense_bias) = _loss_and_gradients(swapped_dense, x[:, 0])
    np.testing.assert_array_equal(np.asarray(y), np.asarray(y_dense))
    np.testing.assert_array_equal(np.asarray(g_kernel), np.asarray(g_dense_kernel))
    np.testing.assert_array_equal(np.asarray(g_bias), np.asarray(g_dense_bias))
    assert not np.asarray(g_recurrent).any()           # h0 = 0
    _, (g_straight, _, _) = _loss_and_gradients(rewrite_model(model, "mul8u_drum4"), x)
    assert np.abs(np.asarray(g_straight) - np.asarray(g_kernel)).max() > 1e-3
    longer = rewrite_model(_model(keras.layers.GRU(UNITS)), "mul8u_drum4", backward="lut_grad")
    _, gradients = _loss_and_gradients(longer, _inputs(16))
    assert all(np.isfinite(np.asarray(g)).all() and np.asarray(g).any() for g in gradients)


def test_fit_runs_and_changes_the_swapped_weights():
    keras.utils.set_random_seed(6)
    model = _model(keras.layers.LSTM(UNITS))
    swapped = rewrite_model(model, "mul8u_drum4")
    swapped.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    before = [w.copy() for w in swapped.get_weights()]
    history = swapped.fit(_inputs(7), np.ones((BATCH, UNITS), np.float32), epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert all(np.abs(a - b).max() > 0 for a, b in zip(before, swapped.get_weights()))


# --------------------------------------------------------------------------------------------
# exports: lowered ONNX and SavedModel hold the stock recurrent layers; kept-kernel refuses
# --------------------------------------------------------------------------------------------

def _recurrent_stack(seed=8):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((STEPS, FEATURES))
    x = keras.layers.Bidirectional(keras.layers.LSTM(UNITS, return_sequences=True))(inputs)
    x = keras.layers.GRU(UNITS, reset_after=False, return_sequences=True)(x)
    x = keras.layers.RNN(keras.layers.SimpleRNNCell(UNITS))(x)
    return keras.Model(inputs, keras.layers.Dense(2)(x))


def test_lowering_gives_back_the_stock_layers_with_the_weights():
    from graphswap.io import lower_model

    model = _recurrent_stack()
    lowered, records = lower_model(rewrite_model(model, "mul8u_drum4"))
    assert [type(layer) for layer in lowered.layers] == [type(layer) for layer in model.layers]
    assert type(lowered.layers[1].forward_layer) is keras.layers.LSTM
    assert type(lowered.layers[3].cell) is keras.layers.SimpleRNNCell
    assert [r.layer_type for r in records] == ["Bidirectional", "GRU", "RNN", "Dense"]
    x = _inputs(9)
    np.testing.assert_array_equal(np.asarray(lowered(x)), np.asarray(model(x)))


def test_lowered_onnx_and_savedmodel_exports_of_a_recurrent_model(tmp_path):
    import onnxruntime as ort

    from graphswap.io.export import export_model

    model = _recurrent_stack()
    swapped = rewrite_model(model, "mul8u_drum4")
    x = _inputs(10)
    result = export_model(swapped, tmp_path / "rnn.onnx", "onnx")
    session = ort.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
    (onnx_out,) = session.run(None, {session.get_inputs()[0].name: x})
    assert_close_to_roundoff(onnx_out, model(x), STEPS * (FEATURES + UNITS) * 3)
    assert [record.layer_type for record in result.layers] == ["Bidirectional", "GRU", "RNN",
                                                                "Dense"]
    saved = export_model(swapped, tmp_path / "rnn_savedmodel", "savedmodel")
    served = tf.saved_model.load(str(saved.path)).signatures["serving_default"]
    (out,) = served(tf.constant(x)).values()
    assert_close_to_roundoff(out, model(x), STEPS * (FEATURES + UNITS) * 3)


def test_kept_kernel_onnx_exports_every_recurrent_layer(tmp_path):
    """Bidirectional LSTM, GRU (reset_after=False), RNN(SimpleRNNCell): each product a custom
    node in its ONNX Loop (test_export_kept_recurrent.py checks the nodes and the outputs)."""
    from graphswap.io.export import export_model

    swapped = rewrite_model(_recurrent_stack(), "mul8u_drum4")
    result = export_model(swapped, tmp_path / "kept.onnx", "onnx", keep_kernels=True)
    assert [r.layer_type for r in result.layers] == ["Bidirectional", "GRU", "RNN", "Dense"]
    assert [len(r.onnx_nodes) for r in result.layers] == [4, 3, 2, 1]
    assert result.path.exists()


def test_convert_to_keras_and_savedmodel_reloads_in_a_fresh_process(tmp_path):
    """convert (the CLI's path) on a saved LSTM text model, to a .keras file and to a graphswap
    SavedModel; both reopen in a fresh interpreter with the recurrent layers still swapped and
    the same outputs; converting the SavedModel again keeps what a kernel map leaves out."""
    from conftest import run_python
    from graphswap.io.convert import convert

    keras.utils.set_random_seed(9)
    inputs = keras.Input((STEPS,), name="tokens")
    x = keras.layers.Embedding(20, FEATURES, mask_zero=True)(inputs)
    x = keras.layers.Bidirectional(keras.layers.LSTM(UNITS, return_sequences=True),
                                   name="bidirectional")(x)
    x = keras.layers.GRU(UNITS, name="gru")(x)
    model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax", name="dense")(x))
    model.compile("adam", "sparse_categorical_crossentropy")
    model.save(tmp_path / "text.keras")
    tokens = np.random.default_rng(11).integers(0, 20, (8, STEPS)).astype(np.float32)
    tokens[0, -2:] = 0
    np.save(tmp_path / "tokens.npy", tokens)
    outputs = {}
    for name in ("converted.keras", "converted_savedmodel"):
        result = convert(str(tmp_path / "text.keras"), "mul8u_drum4",
                         output=str(tmp_path / name))
        assert [e.path for e in result.report.swapped] == ["bidirectional", "gru", "dense"]
        outputs[name] = np.asarray(result.model(tokens))
        np.save(tmp_path / f"{name}.npy", outputs[name])
    np.testing.assert_array_equal(outputs["converted.keras"], outputs["converted_savedmodel"])
    done = run_python(f"""
        import numpy as np
        import graphswap
        tokens = np.load({str(tmp_path / 'tokens.npy')!r})
        for name in ("converted.keras", "converted_savedmodel"):
            model = graphswap.load_model({str(tmp_path)!r} + "/" + name)
            kinds = [type(layer).__name__ for layer in model.layers]
            assert kinds[2:5] == ["SwappedBidirectional", "SwappedGRU", "SwappedDense"], kinds
            want = np.load({str(tmp_path)!r} + "/" + name + ".npy")
            np.testing.assert_array_equal(np.asarray(model(tokens)), want)
        print("reloaded")
    """)
    assert done.returncode == 0 and "reloaded" in done.stdout, done.stderr[-3000:]
    again = convert(str(tmp_path / "converted_savedmodel"), None,
                    kernel_map={"gru": "mul8u_drum3"}, output=str(tmp_path / "again.keras"))
    layers = {layer.name: layer for layer in again.model.layers}
    assert layers["gru"].arithmetic.spec == "mul8u_drum3"
    assert layers["bidirectional"].arithmetic.spec == "mul8u_drum4"
    assert type(layers["bidirectional"]).__name__ == "SwappedBidirectional"


def test_stateful_layer_carries_its_state_like_the_stock_one():
    keras.utils.set_random_seed(10)
    inputs = keras.Input((STEPS, FEATURES), batch_size=2)
    model = keras.Model(inputs, keras.layers.LSTM(UNITS, stateful=True)(inputs))
    swapped = rewrite_model(model)
    x = _inputs(12, batch=2)
    first, second = np.asarray(model(x)), np.asarray(model(x))
    assert np.abs(first - second).max() > 1e-3       # the state carried over
    terms = STEPS * (FEATURES + UNITS)
    assert_close_to_roundoff(swapped(x), first, terms)
    assert_close_to_roundoff(swapped(x), second, terms)
    swapped.layers[1].reset_states()
    assert_close_to_roundoff(swapped(x), first, terms)


# --------------------------------------------------------------------------------------------
# the trust gate: a recurrent layer's kernel records, wherever its config holds them
# --------------------------------------------------------------------------------------------

RECURRENT_RECORDS = {
    # where the record sits in the saved config of layer "fc"
    "LSTM: the layer's record": (lambda: keras.layers.LSTM(UNITS, name="fc"),
                                 lambda c: [c]),
    "RNN: the cell's record": (lambda: keras.layers.RNN(keras.layers.GRUCell(UNITS), name="fc"),
                               lambda c: [c["cell"]["config"]]),
    "Bidirectional: each direction's record": (
        lambda: keras.layers.Bidirectional(keras.layers.SimpleRNN(UNITS), name="fc"),
        lambda c: [c["layer"]["config"], c["backward_layer"]["config"]]),
    "Bidirectional: a record beside the wrapped layers": (
        lambda: keras.layers.Bidirectional(keras.layers.SimpleRNN(UNITS), name="fc"),
        lambda c: [c]),
}


@pytest.mark.parametrize("case", sorted(RECURRENT_RECORDS))
def test_tampered_recurrent_record_is_refused(attack, tmp_path, case):
    """An attacker's library named in any kernel record of a saved recurrent layer never loads:
    every loader refuses the file with KernelTrustError (the fixture checks the canary)."""
    import graphswap
    from graphswap.kernels import trust as kernel_trust
    from graphswap.errors import KernelTrustError
    from test_kernels_security import _rewrite_config, _variants

    a = attack
    make, records = RECURRENT_RECORDS[case]
    graphswap.trust(a.honest)
    swapped = rewrite_model(_model(make()), kernel=str(a.honest))
    path = tmp_path / "user" / "recurrent.keras"
    swapped.save(path)
    kernel_trust.clear_session_trust()
    graphswap.trust(a.honest)
    untrusted = _variants(a)["complete record, untrusted"]

    def replace(config):
        for holder in records(config):
            holder["arithmetic"] = untrusted

    bad = _rewrite_config(path, tmp_path / "tampered.keras", replace)
    for load in (graphswap.load_model, keras.models.load_model):
        with pytest.raises(KernelTrustError, match="not trusted|untrusted|trust"):
            load(bad)
    assert not a.marker.exists(), "the attacker's library was loaded"
    x = _inputs(13)
    np.testing.assert_array_equal(np.asarray(graphswap.load_model(path)(x)),
                                  np.asarray(swapped(x)))


@pytest.mark.parametrize("case", ["lstm_sequences", "gru_reset_before"])
def test_backward_kernel_mode_through_time_equals_stock_with_the_exact_kernel(case):
    """backward="kernel" sends the gradient products through the kernel too: with the exact
    kernel they are TensorFlow's gradients to round-off."""
    keras.utils.set_random_seed(11)
    model = _model(CASES[case]())
    swapped = rewrite_model(model, backward="kernel")
    assert [layer.cell.backward for layer in swapped.layers if hasattr(layer, "cell")] == \
        ["kernel"]
    x = _inputs(14)
    _, g_stock = _loss_and_gradients(model, x)
    _, g_swapped = _loss_and_gradients(swapped, x)
    terms = STEPS * (FEATURES + UNITS) * 2
    for got, want in zip(g_swapped, g_stock):
        assert_close_to_roundoff(got, want, terms * BATCH * STEPS,
                                 magnitude=np.abs(np.asarray(want)).max())
