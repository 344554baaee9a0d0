"""A SavedModel is a program.  Every file here is the attacker's: a
tf_keras Dense model whose tracked resource's initialiser writes a marker file on load, a Lambda
hidden in a TimeDistributed (its own metadata node renamed), side-effecting ops in every place a
SavedModel can hold them, and a directory swapped between graphswap's check and its load.  Each is
first shown to fire when TensorFlow/tf_keras loads it directly (the canary is armed), then to be
refused by graphswap with the marker never written.  Honest tf_keras files (Dense, Conv2D,
BatchNormalization, Dropout, LSTM) and graphswap's own LSTM export still load."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import graphswap
from graphswap.errors import ModelLoadError
from graphswap.io import dual_savedmodel, keras2
from graphswap.io import savedmodel_program as program
from graphswap.io import stored_code

from conftest import assert_close_to_roundoff, reduction_terms

tf_keras = pytest.importorskip("tf_keras")  # installed with the test extras (legacy fixtures)


def package_env() -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    root = str(Path(graphswap.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                                                   else []))
    return env


def fresh(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                          timeout=600, env=package_env(), cwd=str(cwd))


TF_KERAS_LOADS = "import sys, tf_keras; tf_keras.models.load_model(sys.argv[1])"


def assert_armed(directory: Path, marker: Path, cwd: Path) -> None:
    """The file really runs the attacker's code when tf_keras loads it (fresh process)."""
    assert not marker.exists()
    proc = fresh("-c", TF_KERAS_LOADS, directory, cwd=cwd)
    assert marker.exists(), f"the canary did not fire: the fixture guards nothing " \
                            f"({proc.stderr[-1500:]})"
    marker.unlink()


# ---------------------------------------------------------------------------------------------
# the attacker's files
# ---------------------------------------------------------------------------------------------

class MarkerResource(tf.saved_model.experimental.TrackableResource):
    """A tracked resource whose initialiser (run by tf.saved_model.load) lists files and writes."""

    def __init__(self, marker: str):
        self._marker = marker
        super().__init__()

    def _create_resource(self):
        return tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[], shared_name="canary")

    def _initialize(self):
        found = tf.io.matching_files(self._marker + "*")
        tf.io.write_file(self._marker, tf.strings.join(["canary ", tf.strings.as_string(
            tf.size(found))]))
        return tf.raw_ops.AssignVariableOp(resource=self.resource_handle, value=1.0)


def dense_keras2(seed: int = 0):
    tf_keras.utils.set_random_seed(seed)
    return tf_keras.Sequential([tf_keras.Input((4,), name="features"),
                                tf_keras.layers.Dense(3, name="head")], name="ordinary")


@pytest.fixture(scope="module")
def canary(tmp_path_factory):
    """An ordinary tf_keras Dense model carrying a marker-writing resource."""
    work = tmp_path_factory.mktemp("canary")
    marker = work / "marker.txt"
    model = dense_keras2()
    model.canary = MarkerResource(str(marker))
    model.save(str(work / "evil"), save_format="tf")
    assert not marker.exists()
    honest = dense_keras2()
    honest.save(str(work / "honest"), save_format="tf")
    return {"dir": work, "evil": work / "evil", "honest": honest, "honest_dir": work / "honest",
            "marker": marker}


@pytest.fixture(scope="module")
def hidden_lambda(tmp_path_factory):
    """A Lambda inside a TimeDistributed whose own metadata node is renamed to 'Activation'."""
    work = tmp_path_factory.mktemp("hidden_lambda")
    marker = work / "lambda_marker.txt"

    def body(t, marker=str(marker)):  # self-contained: its bytecode runs in another process
        with open(marker, "w") as handle:
            handle.write("the Lambda's bytecode ran")
        return t * 2.0

    inputs = tf_keras.Input((3, 4), name="frames")
    wrapped = tf_keras.layers.TimeDistributed(tf_keras.layers.Lambda(body, name="inner"),
                                              name="per_frame")(inputs)
    model = tf_keras.Model(inputs, tf_keras.layers.Dense(2, name="head")(wrapped))
    directory = work / "td_lambda"
    model.save(str(directory), save_format="tf")
    marker.unlink()  # written while the model was built here
    from tf_keras.protobuf import saved_metadata_pb2

    metadata = saved_metadata_pb2.SavedMetadata()
    metadata.ParseFromString((directory / "keras_metadata.pb").read_bytes())
    renamed = 0
    for node in metadata.nodes:
        record = json.loads(node.metadata)
        if record.get("class_name") == "Lambda":
            record["class_name"] = "Activation"
            node.metadata = json.dumps(record)
            renamed += 1
    assert renamed == 1
    (directory / "keras_metadata.pb").write_bytes(metadata.SerializeToString())
    return {"dir": work, "model": directory, "marker": marker}


# ---------------------------------------------------------------------------------------------
# 1. a resource initialiser that writes a file
# ---------------------------------------------------------------------------------------------

def test_the_resource_canary_fires_when_tf_keras_loads_it(canary):
    assert_armed(canary["evil"], canary["marker"], canary["dir"])


def test_load_model_refuses_the_resource_canary_naming_ops_and_function(canary):
    with pytest.raises(ModelLoadError) as info:
        graphswap.load_model(canary["evil"])
    message = str(info.value)
    assert message.startswith(f"{canary['evil']}: a SavedModel is a program")
    assert "MatchingFiles (reads or writes files), WriteFile (reads or writes files)" in message
    assert "in function __inference__initializer_" in message
    assert "--unsafe" in message and "trust the file's author" in message
    assert "graphswap-savedmodel-" not in message  # the private copy's path is never shown
    assert not canary["marker"].exists()


@pytest.mark.parametrize("command", ["inspect", "convert", "evaluate", "export"])
def test_cli_refuses_the_resource_canary_in_a_fresh_process(canary, command, tmp_path):
    data = tmp_path / "data.npz"
    np.savez(data, x=np.zeros((8, 4), np.float32), y=np.zeros(8, np.int64))
    output = tmp_path / "out.keras"
    args = {"inspect": [canary["evil"]],
            "convert": [canary["evil"], "-o", output],
            "evaluate": [canary["evil"], "--data", data],
            "export": [canary["evil"], "--format", "savedmodel", "-o", tmp_path / "out_sm"]}[command]
    proc = fresh("-m", "graphswap.cli", command, *args, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "a SavedModel is a program" in errors[0] and "WriteFile" in errors[0]
    assert "--unsafe" in errors[0]
    assert not canary["marker"].exists()
    assert not output.exists() and not (tmp_path / "out_sm").exists()


def test_honest_twin_of_the_canary_loads(canary):
    model = graphswap.load_model(canary["honest_dir"])
    x = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    assert_close_to_roundoff(np.asarray(model(x)), canary["honest"](x).numpy(),
                             reduction_terms(model))


# ---------------------------------------------------------------------------------------------
# 2. a Lambda hidden in a wrapper
# ---------------------------------------------------------------------------------------------

def test_the_hidden_lambda_canary_fires_when_tf_keras_loads_it(hidden_lambda):
    # the top-level class names no longer say Lambda: the old check let this through
    assert "Lambda" not in keras2.saved_model_layer_classes(hidden_lambda["model"])
    assert_armed(hidden_lambda["model"], hidden_lambda["marker"], hidden_lambda["dir"])


def test_a_lambda_inside_time_distributed_is_refused_before_tf_keras(hidden_lambda, tmp_path):
    with pytest.raises(ModelLoadError, match=r"contains a Lambda layer or other stored Python "
                                             r"code \(Lambda 'inner' \(inside .*TimeDistributed "
                                             r"'per_frame'\); a function stored as bytecode "
                                             r"\(inside Activation 'inner'\)\).*--unsafe"):
        graphswap.load_model(hidden_lambda["model"])
    proc = fresh("-m", "graphswap.cli", "convert", hidden_lambda["model"], "-o",
                 tmp_path / "o.keras", cwd=tmp_path)
    assert proc.returncode == 1 and "Lambda 'inner'" in proc.stderr, proc.stderr[-2000:]
    assert not hidden_lambda["marker"].exists()
    assert not (tmp_path / "o.keras").exists()


@pytest.mark.parametrize("suffix", [".h5", ".keras"])
def test_a_lambda_inside_time_distributed_in_a_keras2_file_is_refused(hidden_lambda, suffix,
                                                                     tmp_path):
    """The same hidden Lambda in a tf_keras .h5 / Keras 2 .keras: graphswap reads (and
    translates) their configs before Keras 3 does, so it checks them first."""
    marker = tmp_path / "file_marker.txt"

    def body(t, marker=str(marker)):
        with open(marker, "w") as handle:
            handle.write("the Lambda's bytecode ran")
        return t * 2.0

    inputs = tf_keras.Input((3, 4), name="frames")
    wrapped = tf_keras.layers.TimeDistributed(tf_keras.layers.Lambda(body, name="inner"),
                                              name="per_frame")(inputs)
    path = tmp_path / f"td_lambda{suffix}"
    tf_keras.Model(inputs, wrapped).save(str(path))
    marker.unlink()
    with pytest.raises(ModelLoadError, match=r"stored Python code \(Lambda 'inner' \(inside "
                                             r"Functional '.*' > TimeDistributed 'per_frame'\)\)"):
        graphswap.load_model(path)
    assert not marker.exists()


LAMBDA_K2 = {"class_name": "Lambda", "config": {"name": "lam", "function": ["YWJj", None, None],
                                                "function_type": "lambda", "module": "__main__"}}
K3_LAMBDA_FN = {"class_name": "__lambda__", "config": {"code": "YWJj", "defaults": None,
                                                       "closure": None}}


def wrap(inner, cls="TimeDistributed", name="wrapper"):
    return {"class_name": cls, "config": {"name": name, "layer": inner}}


CODE_CONFIGS = {
    "top level": (LAMBDA_K2, "Lambda 'lam'"),
    "TimeDistributed": (wrap(LAMBDA_K2), "Lambda 'lam' (inside TimeDistributed 'wrapper')"),
    "Bidirectional forward/backward": (
        {"class_name": "Bidirectional", "config": {"name": "bi", "layer": {"class_name": "LSTM",
         "config": {"name": "l"}}, "backward_layer": LAMBDA_K2}}, "(inside Bidirectional 'bi')"),
    "Sequential inside a Functional layer list": (
        {"class_name": "Functional", "config": {"name": "outer", "layers": [
            {"class_name": "InputLayer", "config": {"name": "in"}},
            {"class_name": "Sequential", "config": {"name": "seq", "layers": [
                {"class_name": "Dense", "config": {"name": "d"}}, wrap(LAMBDA_K2)]}}]}},
        "Functional 'outer' > Sequential 'seq' > TimeDistributed 'wrapper'"),
    "custom layer holding a layer list": (
        {"class_name": "MyBlock", "config": {"name": "blk", "sublayers": [
            {"class_name": "Dense", "config": {"name": "q"}}, LAMBDA_K2]}},
        "(inside MyBlock 'blk')"),
    "Keras 3 serialised lambda as an activation": (
        {"class_name": "Dense", "config": {"name": "act", "activation": K3_LAMBDA_FN}},
        "__lambda__"),
    "Lambda renamed, its bytecode kept (function_type)": (
        {"class_name": "Activation", "config": {"name": "sneaky", "function": ["YWJj", None, None],
                                                "function_type": "lambda"}},
        "Activation 'sneaky'"),
    "output shape stored as bytecode": (
        {"class_name": "Reshape", "config": {"name": "shape", "output_shape": ["YWJj"],
                                             "output_shape_type": "lambda"}},
        "Reshape 'shape'"),
    "bytecode in a bare dict four levels down": (
        {"class_name": "Model", "config": {"name": "m", "extra": [{"a": {"b": {
            "function_type": "lambda", "function": "YWJj"}}}]}},
        "a function stored as bytecode (inside Model 'm')"),
}


@pytest.mark.parametrize("case", sorted(CODE_CONFIGS))
def test_code_carrying_layers_are_found_at_any_depth(case):
    config, expected = CODE_CONFIGS[case]
    found = stored_code.code_carrying_layers(config)
    assert found and any(expected in where for where in found), found
    with pytest.raises(ModelLoadError, match=r"stored Python code .*safe_mode=False \(CLI: "
                                             r"--unsafe\)"):
        stored_code.check_keras_configs([("root", config)], "model_dir")


def test_honest_configs_hold_no_code():
    honest = {"class_name": "Functional", "config": {"name": "m", "layers": [
        {"class_name": "TFOpLambda", "config": {"name": "tf.math.multiply",
                                                "function": "math.multiply"}},
        {"class_name": "Dense", "config": {"name": "d", "activation": "relu"}},
        wrap({"class_name": "LSTM", "config": {"name": "l", "activation": "tanh"}},
             "Bidirectional", "bi"),
        {"class_name": "Lambda_like_name", "config": {"function_type": "function"}}]}}
    assert stored_code.code_carrying_layers(honest) == []


# ---------------------------------------------------------------------------------------------
# every place a SavedModel can hold an op
# ---------------------------------------------------------------------------------------------

SPEC = [tf.TensorSpec([None, 4], tf.float32)]


def module_with(body):
    module = tf.Module()
    module.v = tf.Variable(tf.ones([4, 2]))
    module.serve = tf.function(lambda x: body(module, x), input_signature=SPEC)
    return module


def _in_while(m, x):
    def step(i, acc):
        tf.print("loop", i)
        return i + 1, acc + 1.0
    _, total = tf.while_loop(lambda i, acc: i < 3, step, [tf.constant(0), tf.zeros([])])
    return tf.matmul(x, m.v) + total


def _in_cond(m, x, path="MARKER"):
    def write():
        tf.io.write_file(path, "x")
        return tf.ones([])
    return tf.matmul(x, m.v) * tf.cond(tf.reduce_sum(x) > 0, write, lambda: tf.zeros([]))


@tf.function
def _nested_reader(path):
    return tf.strings.length(tf.io.read_file(path))


def _in_nested_call(m, x):
    return tf.matmul(x, m.v) + tf.cast(_nested_reader("/etc/hostname"), tf.float32)


def _py_function(m, x):
    return tf.py_function(lambda t: t * 2.0, [tf.matmul(x, m.v)], tf.float32)


def _save_in_serving(m, x):
    tf.raw_ops.SaveV2(prefix="/tmp/ckpt", tensor_names=["v"], shape_and_slices=[""],
                      tensors=[m.v.read_value()])
    return tf.matmul(x, m.v)


SIDE_EFFECTS = {
    "PrintV2 in a While body": (_in_while, "PrintV2", "function while_body"),
    "WriteFile in an If branch": (_in_cond, "WriteFile", "function cond_true"),
    "ReadFile in a nested tf.function": (_in_nested_call, "ReadFile", "function "
                                                                        "__inference__nested_reader"),
    "EagerPyFunc": (_py_function, "EagerPyFunc", "function __inference_"),
    "SaveV2 reachable from the signature": (_save_in_serving, "SaveV2", "function __inference_"),
}


@pytest.fixture(scope="module")
def saved_modules(tmp_path_factory):
    work = tmp_path_factory.mktemp("modules")
    paths = {}
    for case, (body, _, _) in {**SIDE_EFFECTS, "pure control flow": (_pure_flow, "", "")}.items():
        directory = work / case.replace(" ", "_")
        module = module_with(body)
        tf.saved_model.save(module, str(directory), signatures={"serving_default": module.serve})
        paths[case] = directory
    return paths


def _pure_flow(m, x):
    """While, If, TensorArray (TensorList ops), variable reads: pure computation (the saver's
    SaveV2/RestoreV2 functions come with every SavedModel)."""
    def step(i, acc):
        return i + 1, acc.write(i, tf.reduce_sum(x) * tf.cast(i, tf.float32))
    _, acc = tf.while_loop(lambda i, acc: i < 3, step,
                           [tf.constant(0), tf.TensorArray(tf.float32, size=3)])
    gate = tf.cond(tf.reduce_sum(x) > 0, lambda: tf.ones([]), lambda: tf.zeros([]))
    return tf.matmul(x, m.v) + tf.reduce_sum(acc.stack()) * gate


@pytest.mark.parametrize("case", sorted(SIDE_EFFECTS))
def test_side_effecting_ops_anywhere_are_refused(case, saved_modules):
    _, op, where = SIDE_EFFECTS[case]
    with pytest.raises(ModelLoadError) as info:
        program.check_program(saved_modules[case])
    message = str(info.value)
    assert "a SavedModel is a program" in message and "--unsafe" in message
    assert f" {op} (" in message and where in message, message


def test_pure_control_flow_passes(saved_modules):
    proto = program.check_program(saved_modules["pure control flow"])
    ops = {node.op for f in proto.meta_graphs[0].graph_def.library.function for node in f.node_def}
    assert {"StatelessWhile", "StatelessIf", "TensorListReserve", "TensorListSetItem",
            "StatefulPartitionedCall", "SaveV2", "RestoreV2"} <= ops, ops


def edited(source: Path, target: Path, edit) -> Path:
    """A copy of the SavedModel `source` whose saved_model.pb went through `edit(proto)`."""
    shutil.copytree(source, target)
    proto = program.read_saved_model(target)
    edit(proto)
    (target / "saved_model.pb").write_bytes(proto.SerializeToString())
    return target


def _function(proto, prefix):
    return next(f for f in proto.meta_graphs[0].graph_def.library.function
                if f.signature.name.startswith(prefix))


def _add_write(function_def, name="evil"):
    node = function_def.node_def.add(name=name, op="WriteFile")
    node.input.extend(["Const:output:0", "Const:output:0"])


def _graph_level(proto):
    proto.meta_graphs[0].graph_def.node.add(name="evil", op="WriteFile",
                                            input=["saver_filename", "saver_filename"])


def _unreferenced(proto):
    dead = proto.meta_graphs[0].graph_def.library.function.add()
    dead.signature.name = "__inference_never_called_1"
    _add_write(dead)


def _custom_op(proto):
    _function(proto, "__inference__wrapped_model").node_def.add(name="x", op="EvilCustomOp")


PROTO_EDITS = {
    "WriteFile in the saver's restore function": (
        lambda p: _add_write(_function(p, "__inference__traced_restore")), "WriteFile",
        "function __inference__traced_restore_"),
    "WriteFile as a graph-level node": (_graph_level, "WriteFile", "graph node evil"),
    "WriteFile in a function nothing calls": (_unreferenced, "WriteFile",
                                              "function __inference_never_called_1"),
    "an op TensorFlow does not know": (_custom_op, "EvilCustomOp (not a TensorFlow op",
                                       "function __inference__wrapped_model"),
    "SaveV2 moved into a call function": (
        lambda p: _function(p, "__inference__wrapped_model").node_def.add(name="s", op="SaveV2"),
        "SaveV2", "function __inference__wrapped_model"),
}


@pytest.mark.parametrize("case", sorted(PROTO_EDITS))
def test_edited_protos_are_refused_wherever_the_op_sits(case, canary, tmp_path):
    edit, op, where = PROTO_EDITS[case]
    program.check_keras2_saved_model(canary["honest_dir"])  # the honest file passes ...
    target = edited(canary["honest_dir"], tmp_path / "edited", edit)
    with pytest.raises(ModelLoadError) as info:  # ... the edited one does not
        program.check_keras2_saved_model(target)
    assert op in str(info.value) and where in str(info.value), str(info.value)


def test_unsafe_skips_the_checks(canary, hidden_lambda):
    program.check_keras2_saved_model(canary["evil"], safe_mode=False)
    program.check_keras2_saved_model(hidden_lambda["model"], safe_mode=False)


# ---------------------------------------------------------------------------------------------
# honest tf_keras files
# ---------------------------------------------------------------------------------------------

def test_honest_tf_keras_savedmodels_still_load(tmp_path):
    tf_keras.utils.set_random_seed(0)
    layers = tf_keras.layers
    inputs = tf_keras.Input((6, 8, 3), name="image")
    x = layers.Conv2D(4, 3, padding="same", activation="relu", name="conv")(inputs)
    x = layers.BatchNormalization(name="bn")(x)
    x = layers.Dropout(0.25, name="drop")(x)
    x = layers.Reshape((6, 32), name="rows")(x)
    x = layers.LSTM(5, name="lstm")(x)
    original = tf_keras.Model(inputs, layers.Dense(3, activation="softmax", name="head")(x))
    original.compile("adam", "sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    original.fit(rng.normal(size=(8, 6, 8, 3)), rng.integers(0, 3, 8), epochs=1, verbose=0)
    original.save(str(tmp_path / "honest"), save_format="tf")
    proto = program.check_program(tmp_path / "honest")  # it holds the saver and a training trace
    ops = {n.op for f in proto.meta_graphs[0].graph_def.library.function for n in f.node_def}
    assert {"SaveV2", "RestoreV2", "RandomUniform", "AssignVariableOp"} <= ops
    model = graphswap.load_model(tmp_path / "honest")
    x = rng.normal(size=(4, 6, 8, 3)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(model(x, training=False)),
                               original(x, training=False).numpy(), atol=1e-5)


# ---------------------------------------------------------------------------------------------
# 5. swapped between the check and the load
# ---------------------------------------------------------------------------------------------

def test_keras2_directory_swapped_after_the_check_is_never_loaded(canary, tmp_path, monkeypatch):
    original_dir = tmp_path / "victim"
    shutil.copytree(canary["honest_dir"], original_dir)
    real_check = keras2.check_keras2_saved_model
    swapped = []

    def check_then_swap(path, shown=None, safe_mode=True):
        real_check(path, shown, safe_mode)
        for name in ("saved_model.pb", "keras_metadata.pb"):  # the attacker wins the race
            shutil.copyfile(canary["evil"] / name, original_dir / name)
        swapped.append(Path(path))

    monkeypatch.setattr(keras2, "check_keras2_saved_model", check_then_swap)
    model = graphswap.load_model(original_dir)
    assert swapped and swapped[0] != original_dir  # the check ran on the private copy
    assert not swapped[0].exists()  # which is gone
    x = np.random.default_rng(2).normal(size=(3, 4)).astype(np.float32)
    assert_close_to_roundoff(np.asarray(model(x)), canary["honest"](x).numpy(),
                             reduction_terms(model))
    assert not canary["marker"].exists()
    assert_armed(original_dir, canary["marker"], tmp_path)  # the swapped-in file is live


def test_private_copy_is_owner_only_and_refuses_links(canary, tmp_path):
    with program.private_copy(canary["honest_dir"]) as copy:
        assert oct(copy.stat().st_mode & 0o777) == "0o700"
        assert oct(copy.parent.stat().st_mode & 0o777) == "0o700"
        assert (copy / "saved_model.pb").read_bytes() == \
            (canary["honest_dir"] / "saved_model.pb").read_bytes()
        assert (copy / "saved_model.pb").stat().st_mode & 0o077 == 0
    assert not copy.exists()
    linked = tmp_path / "linked"
    shutil.copytree(canary["honest_dir"], linked)
    (linked / "saved_model.pb").unlink()
    (linked / "saved_model.pb").symlink_to(canary["evil"] / "saved_model.pb")
    with pytest.raises(ModelLoadError, match="not a plain file or folder"):
        graphswap.load_model(linked)


WRITES_WHEN_SERVED = """
import sys
import tensorflow as tf

class Served(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None, 5, 3], tf.float32, name="tokens")])
    def serve(self, tokens):
        tf.io.write_file(sys.argv[2], "written by the swapped-in SavedModel")
        return {"head": tf.zeros([tf.shape(tokens)[0], 2])}

module = Served()
tf.saved_model.save(module, sys.argv[1], signatures={"serving_default": module.serve})
"""


@pytest.fixture(scope="module")
def lstm_export(tmp_path_factory):
    """graphswap's own SavedModel of a Keras 3 LSTM model (its While op must not be refused)."""
    work = tmp_path_factory.mktemp("lstm_export")
    keras.utils.set_random_seed(0)
    inputs = keras.Input((5, 3), name="tokens")
    x = keras.layers.LSTM(4, name="lstm")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(x), name="lstm_model")
    swapped = graphswap.rewrite_model(model, kernel="exact")
    result = graphswap.export_model(swapped, work / "lstm_sm", format="savedmodel")
    return {"dir": work, "path": result.path, "model": swapped}


def test_lstm_model_exports_as_a_savedmodel_and_reopens(lstm_export):
    proto = program.check_program(lstm_export["path"], own_export=True)
    ops = {n.op for f in proto.meta_graphs[0].graph_def.library.function for n in f.node_def}
    assert ops & {"While", "StatelessWhile"}, ops
    reopened = graphswap.load_model(lstm_export["path"])
    x = np.random.default_rng(3).normal(size=(4, 5, 3)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(reopened(x)), np.asarray(lstm_export["model"](x)))
    served = tf.saved_model.load(str(lstm_export["path"])).signatures["serving_default"]
    np.testing.assert_allclose(served(tokens=tf.constant(x))["head"].numpy(),
                               np.asarray(lstm_export["model"](x)), atol=1e-5)


def test_graphswap_savedmodel_swapped_after_the_check_is_never_run(lstm_export, tmp_path,
                                                                   monkeypatch):
    marker = tmp_path / "served_marker.txt"
    evil = tmp_path / "evil_serving"
    proc = fresh("-c", WRITES_WHEN_SERVED, evil, marker, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    victim = tmp_path / "victim_sm"
    shutil.copytree(lstm_export["path"], victim)
    real_check = dual_savedmodel.check_program
    checked = []

    def check_then_swap(path, shown=None, own_export=False):
        proto = real_check(path, shown, own_export)
        shutil.copyfile(evil / "saved_model.pb", victim / "saved_model.pb")
        checked.append(Path(path))
        return proto

    monkeypatch.setattr(dual_savedmodel, "check_program", check_then_swap)
    graphswap.load_model(victim)
    assert checked and checked[0] != victim
    assert not marker.exists()
    # the swapped-in graph is live: served directly, it writes
    monkeypatch.undo()
    tf.saved_model.load(str(victim)).signatures["serving_default"](tokens=tf.zeros([1, 5, 3]))
    assert marker.read_text() == "written by the swapped-in SavedModel"
