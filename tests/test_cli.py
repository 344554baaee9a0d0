"""The convert / inspect / kernels commands, through click's runner and as a real subprocess."""

import json
import os
import shutil
import subprocess
import sys

import h5py
import keras
import numpy as np
import pytest
from click.testing import CliRunner

from conftest import (EPS32, SAMPLE_MODEL, assert_close_to_roundoff, compile_library,
                      reduction_terms)
from graphswap import SwappedConv2D, SwappedDense
from graphswap.cli import main


@pytest.fixture()
def runner():
    return CliRunner()


@pytest.fixture()
def model_copy(tmp_path):
    path = tmp_path / "lenet5.keras"
    shutil.copy(SAMPLE_MODEL, path)
    return path


def test_convert_writes_default_output_and_reports(runner, model_copy, digits):
    result = runner.invoke(main, ["convert", str(model_copy)])
    assert result.exit_code == 0, result.output
    output = model_copy.with_name("lenet5.swapped.keras")
    assert output.is_file()
    assert "5 of 5 layers with weights swapped" in result.output
    assert "max |original - rewritten|" in result.output
    difference = float(result.output.split("random batch of 8: ")[1].split()[0])
    loaded = keras.models.load_model(output)
    original = keras.models.load_model(model_copy)
    # softmax outputs (at most 1) of the exact kernel: round-off only
    assert difference <= 8 * np.sqrt(reduction_terms(original)) * EPS32
    assert isinstance(loaded.get_layer("conv2"), SwappedConv2D)
    x = digits["x_test"][:16].astype(np.float32)
    assert_close_to_roundoff(loaded(x).numpy(), original(x).numpy(), reduction_terms(original))
    # only the model and its rewrite are in the directory: no temporary files left
    assert sorted(p.name for p in model_copy.parent.iterdir()) == [
        "lenet5.keras", "lenet5.swapped.keras"]


def test_convert_json_include_and_explicit_output(runner, model_copy, tmp_path):
    out = tmp_path / "dense_only.keras"
    result = runner.invoke(main, ["convert", str(model_copy), "-o", str(out), "--type", "Dense",
                                  "--exclude", "predictions", "--kernel", "bf16", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["swapped"] == 2 and payload["output"] == str(out)
    assert {layer["path"]: layer["kernel"] for layer in payload["layers"]
            if layer["action"] == "swapped"} == {"fc1": "bf16", "fc2": "bf16"}
    loaded = keras.models.load_model(out)
    assert isinstance(loaded.get_layer("fc1"), SwappedDense)
    assert not isinstance(loaded.get_layer("predictions"), SwappedDense)


def test_convert_refuses_to_overwrite_without_force(runner, model_copy):
    out = model_copy.with_name("lenet5.swapped.keras")
    out.write_bytes(b"precious")
    result = runner.invoke(main, ["convert", str(model_copy)])
    assert result.exit_code == 1
    assert "already exists; pass --force" in result.output
    assert out.read_bytes() == b"precious"
    result = runner.invoke(main, ["convert", str(model_copy), "-o", str(model_copy)])
    assert result.exit_code == 1 and "is the input file" in result.output
    result = runner.invoke(main, ["convert", str(model_copy), "--force"])
    assert result.exit_code == 0, result.output
    assert keras.models.load_model(out).name == "lenet5"


def _write(path, data):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("setup,message", [
    (lambda d: d / "missing.keras", "model file not found"),
    (lambda d: _write(d / "empty.keras", b""), "is empty"),
    (lambda d: _write(d / "random.keras", os.urandom(4096)), "is not a valid Keras archive: the file is corrupt or truncated"),
    (lambda d: (d / "notdir").mkdir() or d / "notdir", "not a SavedModel"),
])
def test_convert_bad_model_files(runner, tmp_path, setup, message):
    path = setup(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    result = runner.invoke(main, ["convert", str(path)])
    assert result.exit_code == 1
    assert message in result.output and "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_convert_weights_only_h5(runner, tmp_path):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    path = tmp_path / "model.weights.h5"
    model.save_weights(path)
    with h5py.File(path) as handle:
        assert "model_config" not in handle.attrs
    result = runner.invoke(main, ["convert", str(path)])
    assert result.exit_code == 1
    assert "weights-only HDF5 file: it holds weights but no architecture" in result.output
    assert not (tmp_path / "model.weights.swapped.keras").exists()


def test_convert_legacy_full_model_h5(runner, tmp_path, digits):
    original = keras.models.load_model(SAMPLE_MODEL)
    path = tmp_path / "legacy.h5"
    original.save(path)
    result = runner.invoke(main, ["convert", str(path)])
    assert result.exit_code == 0, result.output
    loaded = keras.models.load_model(tmp_path / "legacy.swapped.keras")
    x = digits["x_test"][:8].astype(np.float32)
    assert_close_to_roundoff(loaded(x).numpy(), original(x).numpy(), reduction_terms(original))


def test_convert_model_without_dense_or_conv(runner, tmp_path):
    path = tmp_path / "pool.keras"
    keras.Sequential([keras.Input((4, 4, 1)), keras.layers.MaxPooling2D()]).save(path)
    result = runner.invoke(main, ["convert", str(path)])
    assert result.exit_code == 1 and "nothing to swap" in result.output
    assert not (tmp_path / "pool.swapped.keras").exists()


def test_convert_unsupported_layer_option_names_layer_and_option(runner, tmp_path):
    path = tmp_path / "quant.keras"
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="qdense")])
    model.quantize("int8")
    model.save(path)
    result = runner.invoke(main, ["convert", str(path)])
    assert result.exit_code == 1
    assert "layer 'qdense'" in result.output and "quantized Dense (int8)" in result.output
    assert not (tmp_path / "quant.swapped.keras").exists()


def test_convert_bad_kernel_library(runner, model_copy, tmp_path):
    library = compile_library(tmp_path, "nothing", "int unrelated(void) { return 1; }\n")
    result = runner.invoke(main, ["convert", str(model_copy), "--kernel", str(library)])
    assert result.exit_code == 1
    assert "does not export graphswap_abi_version" in result.output
    result = runner.invoke(main, ["convert", str(model_copy), "--kernel", "nonsense"])
    assert result.exit_code == 1 and "unknown kernel 'nonsense'" in result.output
    assert not model_copy.with_name("lenet5.swapped.keras").exists()


def test_convert_into_missing_directory(runner, model_copy, tmp_path):
    result = runner.invoke(main, ["convert", str(model_copy), "-o",
                                  str(tmp_path / "nope" / "out.keras")])
    assert result.exit_code == 1 and "does not exist; create it first" in result.output


def test_inspect_lists_layers_without_writing(runner, model_copy):
    result = runner.invoke(main, ["inspect", str(model_copy)])
    assert result.exit_code == 0, result.output
    assert "conv1" in result.output and "117,600" in result.output
    assert "61,706 parameters" in result.output
    assert sorted(p.name for p in model_copy.parent.iterdir()) == ["lenet5.keras"]
    result = runner.invoke(main, ["inspect", str(model_copy), "--json"])
    assert json.loads(result.output)["swapped"] == 5


def test_kernels_lists_builtins(runner):
    result = runner.invoke(main, ["kernels"])
    assert result.exit_code == 0
    assert result.output.startswith("exact ")
    assert "bf16" in result.output and "fp32_m{m}" in result.output
    listing = json.loads(runner.invoke(main, ["kernels", "--json"]).output)
    assert "exact" in listing


def test_real_subprocess_convert_and_version(tmp_path, model_copy):
    exe = shutil.which("graphswap")
    command = [exe] if exe else [sys.executable, "-m", "graphswap.cli"]
    version = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=120)
    assert version.returncode == 0 and "graphswap, version" in version.stdout
    result = subprocess.run([*command, "convert", str(model_copy), "-o", str(tmp_path / "o.keras")],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "wrote" in result.stdout and (tmp_path / "o.keras").is_file()
    bad = subprocess.run([*command, "convert", str(tmp_path / "missing.keras")],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 1
    assert "Error: model file not found" in bad.stderr and "Traceback" not in bad.stderr


# ---- regressions --------------------------------------------------------------------------------

def test_unbuilt_sequential_model_is_one_clear_error(runner, tmp_path):
    path = tmp_path / "unbuilt.keras"
    keras.Sequential([keras.layers.Dense(4), keras.layers.Dense(2)]).save(path)
    for command in (["inspect", str(path)], ["convert", str(path), "-o", str(tmp_path / "o.keras")]):
        result = runner.invoke(main, command)
        assert result.exit_code == 1, result.output
        assert "Error: " in result.output and "unbuilt model" in result.output
        assert "AttributeError" not in result.output
    assert not (tmp_path / "o.keras").exists()


@pytest.mark.parametrize("build", ["this TensorFlow build", "a build refusing NCHW"])
def test_convert_channels_first_model_on_cpu_skips_the_comparison(runner, tmp_path, monkeypatch,
                                                                  build):
    # Where TensorFlow's CPU Conv2D refuses NCHW the original cannot run, but the rewrite can
    # (graphswap's kernels run NHWC) and used to die with "unexpected UnimplementedError"; where
    # this TensorFlow build runs NCHW (oneDNN on some CPUs), the comparison is made as usual.
    # Both branches run on every machine: this build's own, and a refusing build simulated by
    # making the original's forward pass raise what such a build raises.
    import tensorflow as tf

    from conftest import tensorflow_runs_nchw_conv_on_cpu
    from graphswap.swap import compare

    nchw_runs = tensorflow_runs_nchw_conv_on_cpu() and build == "this TensorFlow build"
    if build == "a build refusing NCHW":
        real_run_model = compare.run_model

        def refusing_run_model(model, batch):
            if not any(isinstance(layer, SwappedConv2D) for layer in model.layers):
                raise tf.errors.UnimplementedError(
                    None, None, "{{node Conv2D}} The Conv2D op currently only supports the NHWC "
                                "tensor format on the CPU. The op was given the format: NCHW "
                                "[Op:Conv2D]")
            return real_run_model(model, batch)

        monkeypatch.setattr(compare, "run_model", refusing_run_model)
    inputs = keras.Input((3, 8, 8))
    conv = keras.layers.Conv2D(4, 3, data_format="channels_first", name="conv")(inputs)
    path = tmp_path / "cf.keras"
    keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(conv))).save(path)
    out = tmp_path / "cf.swapped.keras"
    result = runner.invoke(main, ["convert", str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    if nchw_runs:
        assert "max |original - rewritten| on a random batch of 8" in result.output
        assert "skipped" not in result.output
    else:
        assert "comparison with the original skipped" in result.output and "NCHW" in result.output
    loaded = keras.models.load_model(out)
    x = np.random.default_rng(0).random((2, 3, 8, 8), dtype=np.float32)
    nhwc = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3, name="conv")])
    nhwc.set_weights(loaded.get_layer("conv").get_weights())
    assert_close_to_roundoff(loaded.get_layer("conv")(x).numpy(),
                             nhwc(x.transpose(0, 2, 3, 1)).numpy().transpose(0, 3, 1, 2),
                             terms=3 * 3 * 3)
