"""The serving half of a graphswap SavedModel is never trusted on one spot check.

A graphswap SavedModel holds a serving graph plus the embedded Keras model, and they used to be
tied by one fixed random batch: a serving graph that answers differently only on inputs holding an
exact 0.0 passed, and `evaluate` reported the embedded model's numbers while the directory served
others.  graphswap now redoes the export of the embedded model and compares the two serving
graphs op by op and weight by weight (graphswap.io.savedmodel_serving).  Each crafted directory
here is first shown to pass the spot check alone (and to serve something else), then to be
refused.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner

import graphswap
from graphswap.cli import main
from graphswap.errors import SavedModelConsistencyError
from graphswap.io import dual_savedmodel
from graphswap.io.savedmodel_serving import (differences, reference_form, serving_form,
                                             serving_module)
from graphswap.swap import sample_inputs

from conftest import SAMPLE_MODEL


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    work = tmp_path_factory.mktemp("serving")
    swapped = graphswap.rewrite_model(keras.models.load_model(SAMPLE_MODEL), kernel="exact")
    graphswap.export_model(swapped, work / "honest_sm", format="savedmodel")
    embedded = graphswap.load_model(work / "honest_sm")
    return {"dir": work, "path": work / "honest_sm", "model": embedded}


def with_serving_half(exported, tmp_path, module_and_signature) -> Path:
    """A copy of the honest export whose saved_model.pb and variables/ are those of a SavedModel
    saved from (tf.Module, serving function) - its assets (embedded model, manifest) untouched."""
    scratch = tmp_path / "scratch_sm"
    module, signature = module_and_signature
    tf.saved_model.save(module, str(scratch), signatures={"serving_default": signature})
    directory = tmp_path / "crafted_sm"
    shutil.copytree(exported["path"], directory)
    shutil.rmtree(directory / "variables")
    shutil.copytree(scratch / "variables", directory / "variables")
    shutil.copyfile(scratch / "saved_model.pb", directory / "saved_model.pb")
    return directory


def spot_check_batch(exported):
    """The manifest's sample batch: what the spot check compares on."""
    size = dual_savedmodel.read_manifest(exported["path"])["consistency_check"]["batch"]
    return sample_inputs(exported["model"], size, seed=dual_savedmodel.CHECK_SEED)


def served(directory: Path, x) -> np.ndarray:
    serve = tf.saved_model.load(str(directory)).signatures["serving_default"]
    return serve(pixels=tf.constant(x))["predictions"].numpy()


def lowered(model, x) -> np.ndarray:
    return np.asarray(serving_module(model).lowered(x, training=False))


def spot_check_alone_accepts(directory: Path, monkeypatch) -> None:
    """Without the op-by-op comparison the directory loads: the old check passes it."""
    with monkeypatch.context() as patched:
        patched.setattr(dual_savedmodel, "_check_serving_form", lambda *args: None)
        graphswap.load_model(directory)


def refused_in_one_line(directory: Path, tmp_path: Path, fragment: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    result = CliRunner().invoke(main, ["convert", str(directory), "--kernel", "bf16", "-o",
                                       str(out / "converted")])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].startswith("Error: ") and fragment in lines[0], lines[0]
    assert list(out.iterdir()) == []


def test_an_honest_export_is_its_own_re_export(exported):
    stored, reference = serving_form(exported["path"]), reference_form(exported["model"])
    assert differences(stored, reference) is None
    assert stored.structure == reference.structure and len(stored.captures) == 10
    assert stored.ops["Conv2D"] == 2 and stored.ops["MatMul"] == 3
    graphswap.load_model(exported["path"])


def test_a_serving_graph_that_differs_only_on_exact_zeros_is_refused(exported, tmp_path,
                                                                    monkeypatch):
    model = exported["model"]
    built = serving_module(model)

    @tf.function(input_signature=built.specs, autograph=False)
    def serve(pixels):
        out = built.lowered(pixels, training=False)
        zero = tf.reduce_any(tf.equal(pixels, 0.0), axis=[1, 2, 3], keepdims=False)
        return {"predictions": tf.where(zero[:, None], tf.reverse(out, axis=[1]), out)}

    built.module.serve = serve
    directory = with_serving_half(exported, tmp_path,
                                  (built.module, serve.get_concrete_function()))
    batch = spot_check_batch(exported)
    assert not np.any(batch == 0.0)
    np.testing.assert_array_equal(served(directory, batch), lowered(model, batch))
    blank = np.zeros((2, 32, 32, 1), np.float32)   # a blank image: holds exact zeros
    assert not np.allclose(served(directory, blank), lowered(model, blank))
    spot_check_alone_accepts(directory, monkeypatch)
    with pytest.raises(SavedModelConsistencyError,
                       match=r"the serving graph \(saved_model.pb\) is not what graphswap exports "
                             r"from the embedded model .*computes differently in the function "
                             r"tf.saved_model.load runs .*op\(s\) only in the directory: .*Equal "
                             r"x1.*ReverseV2 x1.* Re-export the directory"):
        graphswap.load_model(directory)
    refused_in_one_line(directory, tmp_path, "is not what graphswap exports")


def test_serving_weights_changed_within_the_spot_checks_tolerance_are_refused(
        exported, tmp_path, monkeypatch):
    built = serving_module(exported["model"])
    bias = next(w for w in built.lowered.weights if w.path.endswith("fc2/bias"))
    bias.assign(bias.numpy() + np.float32(1e-6))
    directory = with_serving_half(exported, tmp_path, (built.module, built.concrete))
    spot_check_alone_accepts(directory, monkeypatch)
    with pytest.raises(SavedModelConsistencyError,
                       match=r"serving signature \(saved_model.pb \+ variables/\) and the "
                             r"embedded model .* disagree: max \|difference\| [0-9.e-]+ in the "
                             r"serving weight \S*fc2/bias \(\d+ of 84 value\(s\) differ; every "
                             r"serving weight must equal the embedded model's bit for bit\)"):
        graphswap.load_model(directory)


def test_a_signature_def_rewired_for_tensorflow_serving_is_refused(exported, tmp_path,
                                                                 monkeypatch):
    """The graph-level signature_def (what TensorFlow Serving and other TF1-style loaders read)
    names a negation of the outputs; the object graph's function (what tf.saved_model.load runs,
    and so the spot check) is left honest."""
    from tensorflow.core.protobuf import saved_model_pb2

    directory = tmp_path / "rewired_sm"
    shutil.copytree(exported["path"], directory)
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((directory / "saved_model.pb").read_bytes())
    meta_graph = proto.meta_graphs[0]
    output = meta_graph.signature_def["serving_default"].outputs["predictions"]
    negate = meta_graph.graph_def.node.add()
    negate.name, negate.op = "rewired", "Neg"
    negate.input.append(output.name)
    negate.attr["T"].type = output.dtype
    output.name = "rewired:0"
    (directory / "saved_model.pb").write_bytes(proto.SerializeToString())
    # tf.saved_model.load serves through the object graph: still the honest outputs
    batch = spot_check_batch(exported)
    np.testing.assert_array_equal(served(directory, batch), lowered(exported["model"], batch))
    spot_check_alone_accepts(directory, monkeypatch)
    with pytest.raises(SavedModelConsistencyError,
                       match=r"computes differently in the graph TensorFlow Serving runs \(its "
                             r"signature_def\) \(op\(s\) only in the directory: Neg x1\)"):
        graphswap.load_model(directory)
