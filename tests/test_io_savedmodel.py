"""graphswap SavedModels: one directory that serves without graphswap and reopens in
graphswap - the convert -> export -> finetune -> serve round trip in subprocesses, fine-tuning from
the directory equal to fine-tuning from the .keras, the consistency check refusing every edited
half, the bad inputs, and every MODEL-taking command accepting the directory."""

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
from click.testing import CliRunner

import graphswap
from graphswap import io as gsio
from graphswap.cli import main
from graphswap.errors import (ExportError, KernelTrustError, ModelLoadError, OutputPathError,
                              SavedModelConsistencyError)
from graphswap.io import dual_savedmodel
from graphswap.io.lowering import lower_model
from graphswap.kernels import trust as kernel_trust
from graphswap.swap import iter_layers

from conftest import SAMPLE_DATA, SAMPLE_MODEL, assert_close_to_roundoff

KERNEL = "mul8u_drum4"
SWAPPED = ["conv1", "conv2", "fc1", "fc2", "predictions"]
#: the largest number of products summed for one LeNet-5 output (fc1: 400 inputs)
TERMS = 400


def package_env(**extra) -> dict:
    import graphswap as package

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **extra}
    root = str(Path(package.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                                                   else []))
    return env


def cli(*args, cwd) -> subprocess.CompletedProcess:
    """`python -m graphswap.cli ARGS` in a fresh process."""
    proc = subprocess.run([sys.executable, "-m", "graphswap.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=900, env=package_env(),
                          cwd=str(cwd))
    assert proc.returncode == 0, f"{args}: {proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    return proc


def kernels_of(model) -> dict:
    return {path: layer.arithmetic.spec for path, layer in iter_layers(model)
            if hasattr(layer, "arithmetic")}


def listing(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


@pytest.fixture(scope="module")
def digits_x():
    with np.load(SAMPLE_DATA) as data:
        return data["x_test"][:64].astype(np.float32)


@pytest.fixture(scope="module")
def round_trip(tmp_path_factory):
    """The user's session, each command in its own process:
    convert -> export savedmodel -> finetune the directory into a new directory (and the .keras
    into a .keras, same seed)."""
    work = tmp_path_factory.mktemp("round_trip")
    cli("convert", SAMPLE_MODEL, "--kernel", KERNEL, "-o", "l.keras", cwd=work)
    exported = cli("export", "l.keras", "--format", "savedmodel", "-o", "l_sm", cwd=work)
    # a constant learning rate keeps the optimizer's variables those of the exported model, so
    # swapping variables/ between the two exports reaches the consistency check (with the cosine
    # default TensorFlow already refuses the differently shaped optimizer state)
    tuned = cli("finetune", "l_sm", "--data", SAMPLE_DATA, "--epochs", "1", "--seed", "3",
                "--schedule", "constant", "-o", "l_ft_sm/", cwd=work)
    cli("finetune", "l.keras", "--data", SAMPLE_DATA, "--epochs", "1", "--seed", "3",
        "--schedule", "constant", "-o", "l_ft.keras", cwd=work)
    return {"dir": work, "export_output": exported.stdout, "finetune_output": tuned.stdout}


SERVE_WITHOUT_GRAPHSWAP = """
import importlib.abc, json, sys
import numpy as np

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "graphswap" or name.startswith("graphswap."):
            raise ImportError("graphswap is blocked in this process")
        return None

sys.meta_path.insert(0, Block())
try:
    import graphswap  # noqa: F401
    importable = True
except ImportError:
    importable = False
import tensorflow as tf

serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
out = serve(pixels=tf.constant(np.load(sys.argv[2])))
np.save(sys.argv[3], out["predictions"].numpy())
print(json.dumps({"graphswap_importable": importable,
                  "graphswap_loaded": any(m.startswith("graphswap") for m in sys.modules)}))
"""


def serve_without_graphswap(directory: Path, x: np.ndarray, scratch: Path) -> np.ndarray:
    np.save(scratch / "x.npy", x)
    script = scratch / "serve.py"
    script.write_text(SERVE_WITHOUT_GRAPHSWAP)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    proc = subprocess.run([sys.executable, str(script), str(directory), str(scratch / "x.npy"),
                           str(scratch / "y.npy")], capture_output=True, text=True, timeout=600,
                          env=env, cwd=str(scratch))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {
        "graphswap_importable": False, "graphswap_loaded": False}
    return np.load(scratch / "y.npy")


def lowered_outputs(model, x) -> np.ndarray:
    return np.asarray(lower_model(model)[0](x, training=False))


# ---------------------------------------------------------------------------------------------
# the round trip
# ---------------------------------------------------------------------------------------------

def test_finetuned_directory_serves_without_graphswap_and_reopens(round_trip, digits_x,
                                                                  tmp_path):
    work = round_trip["dir"]
    assert "wrote l_ft_sm" in round_trip["finetune_output"]
    assert listing(work / "l_ft_sm") == ["assets", "fingerprint.pb", "saved_model.pb",
                                         "variables"]
    assert listing(work / "l_ft_sm" / "assets" / "graphswap") == ["manifest.json",
                                                                   "model.keras"]
    served = serve_without_graphswap(work / "l_ft_sm", digits_x, tmp_path)
    # the serving signature is the fine-tuned Keras model with its kernels lowered
    tuned_keras = keras.models.load_model(work / "l_ft.keras")
    assert_close_to_roundoff(served, lowered_outputs(tuned_keras, digits_x), TERMS)
    # ... and not the model before fine-tuning (so the comparison above can fail)
    before = serve_without_graphswap(work / "l_sm", digits_x, tmp_path)
    assert np.max(np.abs(served - before)) > 1e-3
    # reopened in graphswap, it still names the same kernels and computes the same
    reopened = graphswap.load_model(work / "l_ft_sm")
    assert kernels_of(reopened) == {name: KERNEL for name in SWAPPED}
    assert_close_to_roundoff(lowered_outputs(reopened, digits_x), served, TERMS)
    np.testing.assert_array_equal(np.asarray(reopened(digits_x, training=False)),
                                  np.asarray(tuned_keras(digits_x, training=False)))
    # the export metadata names the kernels as before
    assert [e["kernel_spec"] for e in gsio.read_metadata(work / "l_ft_sm")["swapped_layers"]] \
        == [KERNEL] * 5


def test_finetuning_the_directory_equals_finetuning_the_keras_file(round_trip):
    work = round_trip["dir"]
    from_directory = graphswap.load_model(work / "l_ft_sm")
    from_keras = keras.models.load_model(work / "l_ft.keras")
    start = keras.models.load_model(work / "l.keras")
    pairs = list(zip(from_directory.get_weights(), from_keras.get_weights()))
    assert len(pairs) == 10
    for a, b in pairs:
        np.testing.assert_array_equal(a, b)
    assert max(float(np.max(np.abs(a - b))) for a, b in
               zip(from_keras.get_weights(), start.get_weights())) > 1e-4  # it did train
    # the optimizer state travels in the embedded model
    assert from_directory.optimizer is not None and int(from_directory.optimizer.iterations) \
        == int(from_keras.optimizer.iterations) > 0


def test_export_writes_the_manifest_tying_the_halves(round_trip):
    work = round_trip["dir"]
    manifest = gsio.read_manifest(work / "l_sm")
    embedded = work / "l_sm" / "assets" / "graphswap" / "model.keras"
    import hashlib

    assert manifest["format"] == "graphswap-savedmodel" and manifest["format_version"] == 1
    assert manifest["model"]["sha256"] == hashlib.sha256(embedded.read_bytes()).hexdigest()
    assert manifest["signature"] == {"name": "serving_default", "inputs": ["pixels"],
                                     "outputs": ["predictions"]}
    assert [(e["layer"], e["kernel"]) for e in manifest["lowered_layers"]] == [
        (name, {"spec": KERNEL}) for name in SWAPPED]
    assert manifest["consistency_check"]["batch"] == 8
    assert "graphswap commands reopen it" in round_trip["export_output"]
    # the embedded model is the rewritten model itself, loadable by plain Keras
    assert kernels_of(keras.models.load_model(embedded)) == {n: KERNEL for n in SWAPPED}


# ---------------------------------------------------------------------------------------------
# an edited half is refused
# ---------------------------------------------------------------------------------------------

def copy_export(round_trip, name, tmp_path) -> Path:
    target = tmp_path / name
    shutil.copytree(round_trip["dir"] / name, target)
    return target


def edit_manifest(directory: Path, edit) -> None:
    path = directory / "assets" / "graphswap" / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def test_variables_copied_from_another_export_are_refused(round_trip, tmp_path):
    directory = copy_export(round_trip, "l_sm", tmp_path)
    shutil.rmtree(directory / "variables")
    shutil.copytree(round_trip["dir"] / "l_ft_sm" / "variables", directory / "variables")
    with pytest.raises(SavedModelConsistencyError,
                       match=r"serving signature \(saved_model.pb \+ variables/\) and the "
                             r"embedded model .* disagree: max \|difference\|"):
        graphswap.load_model(directory)


def test_swapped_embedded_model_is_refused_by_its_hash(round_trip, tmp_path):
    directory = copy_export(round_trip, "l_sm", tmp_path)
    shutil.copy(round_trip["dir"] / "l_ft.keras",
                directory / "assets" / "graphswap" / "model.keras")
    with pytest.raises(SavedModelConsistencyError,
                       match="embedded model assets/graphswap/model.keras has SHA-256 .* the "
                             "manifest records"):
        graphswap.load_model(directory)


def test_swapped_embedded_model_with_its_hash_updated_is_refused_by_the_outputs(round_trip,
                                                                                tmp_path):
    import hashlib

    directory = copy_export(round_trip, "l_sm", tmp_path)
    other = round_trip["dir"] / "l_ft.keras"
    shutil.copy(other, directory / "assets" / "graphswap" / "model.keras")
    edit_manifest(directory, lambda m: m["model"].update(
        sha256=hashlib.sha256(other.read_bytes()).hexdigest()))
    with pytest.raises(SavedModelConsistencyError, match="disagree: max"):
        graphswap.load_model(directory)


@pytest.mark.parametrize("edit, message", [
    (lambda m: m["lowered_layers"][1]["kernel"].update(spec="mul8s_trunc4"),
     r"manifest's lowered layers disagree .*layer 1 \(conv2\): recorded kernel "
     r"\{\"spec\": \"mul8s_trunc4\"\}, the embedded model has \{\"spec\": \"mul8u_drum4\"\}"),
    (lambda m: m["lowered_layers"].pop(),
     r"4 layer\(s\) recorded, the embedded model has 5"),
    (lambda m: m["model"].update(sha256="0" * 64), r"manifest records 0000000000000000"),
    (lambda m: m["signature"].update(outputs=["probabilities"]),
     r"manifest names inputs \['pixels'\] and outputs \['probabilities'\]"),
    (lambda m: m["consistency_check"].update(batch=0), r"batch is 0; .* cannot be skipped"),
    (lambda m: m.update(format="something-else"), "not a graphswap SavedModel manifest"),
])
def test_edited_manifest_is_refused(round_trip, tmp_path, edit, message):
    directory = copy_export(round_trip, "l_sm", tmp_path)
    edit_manifest(directory, edit)
    with pytest.raises(SavedModelConsistencyError, match=message):
        graphswap.load_model(directory)


def test_newer_manifest_version_and_edited_metadata_are_refused(round_trip, tmp_path):
    directory = copy_export(round_trip, "l_sm", tmp_path)
    edit_manifest(directory, lambda m: m.update(format_version=2))
    with pytest.raises(ModelLoadError, match="manifest format version 2; this graphswap .* "
                                             "reads version 1"):
        graphswap.load_model(directory)
    directory = copy_export(round_trip, "l_ft_sm", tmp_path)
    metadata = directory / "assets" / "graphswap_kernels.json"
    doc = json.loads(metadata.read_text())
    doc["swapped_layers"][0]["kernel"] = {"spec": "exact"}
    metadata.write_text(json.dumps(doc))
    with pytest.raises(SavedModelConsistencyError,
                       match=r"export metadata assets/graphswap_kernels.json disagrees .*"
                             r"layer 0 \(conv1\)"):
        graphswap.load_model(directory)


def test_cli_refuses_an_edited_directory_in_one_line_and_writes_nothing(round_trip, tmp_path):
    directory = copy_export(round_trip, "l_sm", tmp_path)
    shutil.rmtree(directory / "variables")
    shutil.copytree(round_trip["dir"] / "l_ft_sm" / "variables", directory / "variables")
    out = tmp_path / "out"
    out.mkdir()
    result = CliRunner().invoke(main, ["finetune", str(directory), "--data", str(SAMPLE_DATA),
                                       "-o", str(out / "tuned")])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "disagree" in lines[0]
    assert listing(out) == []


WRITES_A_FILE = """
import sys
import tensorflow as tf

class Served(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None, 32, 32, 1], tf.float32, name="pixels")])
    def serve(self, pixels):
        tf.io.write_file(sys.argv[2], "written by the SavedModel")
        return {"predictions": tf.zeros([tf.shape(pixels)[0], 10])}

module = Served()
tf.saved_model.save(module, sys.argv[1], signatures={"serving_default": module.serve})
"""


def test_a_serving_graph_that_does_more_than_compute_is_never_run(round_trip, tmp_path):
    directory = tmp_path / "evil"
    canary = tmp_path / "canary.txt"
    proc = subprocess.run([sys.executable, "-c", WRITES_A_FILE, str(directory), str(canary)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    shutil.copytree(round_trip["dir"] / "l_sm" / "assets", directory / "assets",
                    dirs_exist_ok=True)
    with pytest.raises(ModelLoadError, match="a SavedModel is a program.* WriteFile .* refused "
                                             "before anything is loaded or run.* --unsafe"):
        graphswap.load_model(directory)
    assert not canary.exists()
    # the graph really writes when it is served (so the check above guards something)
    serve = tf.saved_model.load(str(directory)).signatures["serving_default"]
    serve(pixels=tf.zeros([1, 32, 32, 1]))
    assert canary.read_text() == "written by the SavedModel"


def test_the_directory_never_adds_trust(tmp_path, lenet):
    source = tmp_path / "mymul.c"
    source.write_text("#include <stdint.h>\n"
                      "uint16_t mul8u_mine(uint8_t a, uint8_t b) { return (uint16_t)(a * b); }\n")
    swapped = graphswap.rewrite_model(lenet, kernel=str(source))  # named in code: trusted
    gsio.export_saved_model(swapped, tmp_path / "mine_sm")
    kernel_trust.clear_session_trust()  # as a new process would start
    with pytest.raises(KernelTrustError, match="mymul.c"):
        graphswap.load_model(tmp_path / "mine_sm")
    kernel_trust.trust(source)
    assert set(kernels_of(graphswap.load_model(tmp_path / "mine_sm")).values()) == {str(source)}


# ---------------------------------------------------------------------------------------------
# bad inputs
# ---------------------------------------------------------------------------------------------

def _plain_tf_saved_model(tmp_path, round_trip):
    module = tf.Module()
    module.scale = tf.Variable(2.0)
    module.serve = tf.function(lambda x: x * module.scale,
                               input_signature=[tf.TensorSpec([None], tf.float32)])
    tf.saved_model.save(module, str(tmp_path / "plain"))
    return tmp_path / "plain", "inference-only SavedModel"


def _keras3_export(tmp_path, round_trip):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.export(str(tmp_path / "exported"), verbose=False)
    return tmp_path / "exported", "inference-only SavedModel"


def _missing_embedded_model(tmp_path, round_trip):
    directory = copy_export(round_trip, "l_sm", tmp_path)
    (directory / "assets" / "graphswap" / "model.keras").unlink()
    return directory, "missing part: assets/graphswap/model.keras (the embedded model) is missing"


def _missing_manifest(tmp_path, round_trip):
    directory = copy_export(round_trip, "l_sm", tmp_path)
    (directory / "assets" / "graphswap" / "manifest.json").unlink()
    return directory, "missing part: assets/graphswap/manifest.json is missing"


def _missing_variables(tmp_path, round_trip):
    directory = copy_export(round_trip, "l_sm", tmp_path)
    shutil.rmtree(directory / "variables")
    return directory, "missing part: variables/ (the serving weights) is missing"


def _older_graphswap_export(tmp_path, round_trip):
    directory = copy_export(round_trip, "l_sm", tmp_path)
    shutil.rmtree(directory / "assets" / "graphswap")
    return directory, "exported by graphswap without the embedded Keras model"


BAD_DIRECTORIES = {"plain_tf_saved_model": _plain_tf_saved_model,
                   "keras3_model_export": _keras3_export,
                   "missing_embedded_model": _missing_embedded_model,
                   "missing_manifest": _missing_manifest,
                   "missing_variables": _missing_variables,
                   "older_graphswap_export": _older_graphswap_export}


@pytest.mark.parametrize("case", sorted(BAD_DIRECTORIES))
def test_bad_directories_fail_in_one_line(case, round_trip, tmp_path):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    directory, fragment = BAD_DIRECTORIES[case](inputs, round_trip)
    with pytest.raises(ModelLoadError) as caught:
        graphswap.load_model(directory)
    assert fragment in str(caught.value)
    assert not isinstance(caught.value, SavedModelConsistencyError)
    out = tmp_path / "out"
    out.mkdir()
    result = CliRunner().invoke(main, ["convert", str(directory), "--kernel", "bf16", "-o",
                                       str(out / "converted")])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and fragment in lines[0]
    assert listing(out) == []


# ---------------------------------------------------------------------------------------------
# every MODEL-taking command accepts the directory
# ---------------------------------------------------------------------------------------------

def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_evaluate_and_sweep_give_the_same_numbers_for_directory_and_keras(round_trip, tmp_path):
    work = round_trip["dir"]
    # sweep places a kernel layer by layer, so it takes an unswapped model: export LeNet-5 itself
    # (a graphswap SavedModel of a model without swapped layers)
    gsio.export_saved_model(keras.models.load_model(SAMPLE_MODEL), tmp_path / "lenet5_savedmodel")
    runs = [("evaluate", work / "l_sm", work / "l.keras"),
            ("evaluate", tmp_path / "lenet5_savedmodel", SAMPLE_MODEL),
            ("sweep", tmp_path / "lenet5_savedmodel", SAMPLE_MODEL)]
    for command, directory, keras_file in runs:
        results = []
        for index, model in enumerate((directory, keras_file)):
            extra = ["-o", tmp_path / f"{index}.map.json"] if command == "sweep" else []
            result = invoke(command, model, "--data", SAMPLE_DATA, "--kernel", "mul8s_trunc4",
                            "--json", *extra)
            assert result.exit_code == 0, result.output
            payload = json.loads(result.output)
            payload.pop("output", None)
            results.append(payload)
        assert results[0] == results[1]
        assert "mul8s_trunc4" in json.dumps(results[0])
    maps = [json.loads((tmp_path / f"{i}.map.json").read_text()) for i in (0, 1)]
    assert maps[0] == maps[1]


@pytest.mark.parametrize("command", ["inspect", "convert", "export-onnx", "export-savedmodel",
                                     "finetune", "saliency"])
def test_every_model_command_accepts_the_directory(command, round_trip, tmp_path, digits_x):
    directory = copy_export(round_trip, "l_sm", tmp_path)
    if command == "inspect":
        result = invoke("inspect", directory)
        assert result.exit_code == 0, result.output
        assert result.output.count(f"already swapped ({KERNEL})") == 5
    elif command == "convert":
        result = invoke("convert", directory, "--kernel", "mul8s_trunc4", "--include", "^fc")
        assert result.exit_code == 0, result.output
        converted = graphswap.load_model(tmp_path / "l_sm_swapped_savedmodel")
        assert kernels_of(converted) == {"conv1": KERNEL, "conv2": KERNEL, "fc1": "mul8s_trunc4",
                                         "fc2": "mul8s_trunc4", "predictions": KERNEL}
    elif command == "export-onnx":
        result = invoke("export", directory, "--format", "onnx")
        assert result.exit_code == 0, result.output
        assert (tmp_path / "l_sm.onnx").is_file()
        import onnxruntime as ort

        session = ort.InferenceSession(str(tmp_path / "l_sm.onnx"),
                                       providers=["CPUExecutionProvider"])
        assert_close_to_roundoff(session.run(None, {"pixels": digits_x})[0],
                                 lowered_outputs(graphswap.load_model(directory), digits_x), TERMS)
    elif command == "export-savedmodel":
        result = invoke("export", directory, "--format", "savedmodel", "-o", tmp_path / "again")
        assert result.exit_code == 0, result.output
        again, source = graphswap.load_model(tmp_path / "again"), graphswap.load_model(directory)
        assert kernels_of(again) == {n: KERNEL for n in SWAPPED}
        for a, b in zip(again.get_weights(), source.get_weights(), strict=True):
            np.testing.assert_array_equal(a, b)
    elif command == "finetune":
        result = invoke("finetune", directory, "--data", SAMPLE_DATA, "--epochs", "1",
                        "--lr", "0")
        assert result.exit_code == 0, result.output
        tuned = tmp_path / "l_sm_ft_savedmodel"  # the default: a directory again
        assert f"wrote {tuned}" in result.output
        assert kernels_of(graphswap.load_model(tuned)) == {n: KERNEL for n in SWAPPED}
    else:
        result = invoke("saliency", directory, SAMPLE_DATA, "--index", "0", "-o",
                        tmp_path / "map.png")
        assert result.exit_code == 0, result.output
        assert (tmp_path / "map.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------
# outputs: by the path, default names, --force, atomic
# ---------------------------------------------------------------------------------------------

def test_output_format_follows_the_path():
    assert gsio.model_output_format("m.keras") == "keras"
    assert gsio.model_output_format("m.h5") == "h5"
    assert gsio.model_output_format("served") == "savedmodel"
    assert gsio.model_output_format("model_v1.2/") == "savedmodel"
    with pytest.raises(OutputPathError, match="must end in .keras .* or name a SavedModel "
                                              "directory"):
        gsio.model_output_format("m.kera")
    result = CliRunner().invoke(main, ["finetune", str(SAMPLE_MODEL), "--data",
                                       str(SAMPLE_DATA), "-o", "m.onnx"])
    assert result.exit_code == 1 and "must end in .keras" in result.output


def test_default_output_names(tmp_path):
    (tmp_path / "lenet5_savedmodel").mkdir()
    (tmp_path / "l_sm").mkdir()
    default = gsio.default_output_path
    assert default(tmp_path / "lenet5_savedmodel", "finetune", directory=True) \
        == tmp_path / "lenet5_ft_savedmodel"
    assert default(tmp_path / "l_sm", "finetune", directory=True) == tmp_path / "l_sm_ft_savedmodel"
    assert default(tmp_path / "l_sm", "convert", directory=True) \
        == tmp_path / "l_sm_swapped_savedmodel"
    assert default(tmp_path / "l_sm", "sweep", directory=True) == tmp_path / "l_sm.kernel_map.json"
    assert default(tmp_path / "m.keras", "finetune") == tmp_path / "m.ft.keras"
    help_text = " ".join(invoke("finetune", "--help").output.split())
    assert "NAME_ft_savedmodel/ when MODEL is a graphswap SavedModel directory" in help_text


def test_force_replaces_a_directory_atomically(round_trip, tmp_path, monkeypatch):
    work = round_trip["dir"]
    target = tmp_path / "served"
    tuned = graphswap.load_model(work / "l_ft_sm")
    first = gsio.save_model(keras.models.load_model(work / "l.keras"), target)
    old = gsio.read_manifest(first)["model"]["sha256"]
    with pytest.raises(OutputPathError, match="already exists; pass --force"):
        gsio.save_model(tuned, target)
    # a failing write leaves the old directory as it was, and no temporary behind
    from graphswap.io import savedmodel

    monkeypatch.setattr(savedmodel, "verify_export",
                        lambda *a: (_ for _ in ()).throw(ExportError("verification failed")))
    with pytest.raises(ExportError):
        gsio.save_model(tuned, target, force=True)
    assert gsio.read_manifest(target)["model"]["sha256"] == old
    assert listing(tmp_path) == ["served"]
    monkeypatch.undo()
    gsio.save_model(tuned, target, force=True)
    assert gsio.read_manifest(target)["model"]["sha256"] != old
    assert listing(tmp_path) == ["served"]
    graphswap.load_model(target)  # and it is whole


def test_finetune_api_writes_each_format_by_the_path(round_trip, tmp_path):
    work = round_trip["dir"]
    for output in ("tuned.keras", "tuned.h5", "tuned_sm"):
        result = graphswap.finetune(work / "l_sm", SAMPLE_DATA, epochs=1, learning_rate=0.0,
                                    output=tmp_path / output, verbose=0)
        assert result.output == str(tmp_path / output)
        reopened = graphswap.load_model(tmp_path / output)
        assert kernels_of(reopened) == {n: KERNEL for n in SWAPPED}
    assert (tmp_path / "tuned_sm" / "saved_model.pb").is_file()
    assert listing(tmp_path) == ["tuned.h5", "tuned.keras", "tuned_sm"]


def test_nested_multi_input_model_round_trips(nested_model, tmp_path):
    swapped = graphswap.rewrite_model(nested_model, kernel="bf16", exclude="head_b")
    swapped.compile(optimizer="adam", loss=["sparse_categorical_crossentropy", "mse"])
    gsio.save_model(swapped, tmp_path / "nested_sm")
    reopened = graphswap.load_model(tmp_path / "nested_sm")
    assert kernels_of(reopened) == kernels_of(swapped) and len(kernels_of(swapped)) == 6
    assert "head_b" not in kernels_of(reopened)
    rng = np.random.default_rng(1)
    batch = [rng.uniform(size=(5, 8, 8, 3)).astype(np.float32),
             rng.uniform(size=(5, 7)).astype(np.float32)]
    for got, want in zip(reopened(batch, training=False), swapped(batch, training=False),
                         strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    serve = tf.saved_model.load(str(tmp_path / "nested_sm")).signatures["serving_default"]
    served = serve(image=tf.constant(batch[0]), vector=tf.constant(batch[1]))
    lowered = lower_model(swapped)[0](batch, training=False)
    for name, want in zip(gsio.read_manifest(tmp_path / "nested_sm")["signature"]["outputs"],
                          lowered, strict=True):
        assert_close_to_roundoff(served[name].numpy(), np.asarray(want), 64)


def test_convert_re_rewrites_a_swapped_model_and_keeps_unselected_kernels(round_trip, tmp_path):
    work = round_trip["dir"]
    result = gsio.convert(work / "l.keras", "mul8s_trunc4", include="conv1",
                          output=tmp_path / "c.keras")
    assert [e.path for e in result.report.swapped] == ["conv1"]
    assert kernels_of(keras.models.load_model(tmp_path / "c.keras")) == {
        **{n: KERNEL for n in SWAPPED}, "conv1": "mul8s_trunc4"}
    with pytest.raises(graphswap.GraphswapError, match="nothing to swap"):
        gsio.convert(work / "l_sm", "bf16", include="no_such_layer", output=tmp_path / "d")
    assert listing(tmp_path) == ["c.keras"]


MIRRORED_FROM_A_DIRECTORY = """
    import json, sys
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
    import numpy as np
    import graphswap
    source, data, output = sys.argv[1:4]
    result = graphswap.finetune(source, data, epochs=1, strategy="mirrored", output=output,
                                verbose=0, seed=0)
    reopened = graphswap.load_model(output)
    serve = tf.saved_model.load(output).signatures["serving_default"]
    x = np.load(data)["x_test"][:16].astype("float32")
    lowered = graphswap.io.lower_model(reopened)[0](x, training=False)
    print("RESULT", json.dumps({
        "replicas": result.model.distribute_strategy.num_replicas_in_sync,
        "same_weights": all(np.array_equal(a, b) for a, b in
                            zip(reopened.get_weights(), result.model.get_weights())),
        "served_vs_lowered": float(np.max(np.abs(serve(pixels=tf.constant(x))["predictions"]
                                                 - lowered)))}))
"""


def test_mirrored_finetuning_of_a_directory_writes_a_directory(round_trip, tmp_path):
    import textwrap

    script = tmp_path / "mirrored.py"
    script.write_text(textwrap.dedent(MIRRORED_FROM_A_DIRECTORY))
    proc = subprocess.run([sys.executable, str(script), str(round_trip["dir"] / "l_sm"),
                           str(SAMPLE_DATA), str(tmp_path / "mirrored_sm")], capture_output=True,
                          text=True, timeout=900, env=package_env(), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert report["replicas"] == 2 and report["same_weights"]
    # softmax outputs (scale 1): the round-off bound of conftest.assert_close_to_roundoff
    assert report["served_vs_lowered"] <= 8 * np.sqrt(TERMS) * np.finfo(np.float32).eps
