"""Tampered files cannot make graphswap run native code the user did not approve.

An attacker's library carries a constructor that writes a marker file the moment it is loaded;
every tampered model, kernel map, ONNX file and checkpoint below must be refused with one clear
error, and the marker must never appear.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import keras
import numpy as np
import pytest
from click.testing import CliRunner

import graphswap
from conftest import (SAMPLE_DATA, assert_close_to_roundoff, compile_library, reduction_terms,
                      run_python)
from graphswap import kernels
from graphswap.io import onnx_ops
from graphswap.kernels import trust as kernel_trust
from graphswap.cli import main
from graphswap.errors import KernelTrustError

CANARY_CONSTRUCTOR = r"""
    #include <stdio.h>
    #include <stdlib.h>
    #include <stdint.h>
    __attribute__((constructor)) static void graphswap_test_canary(void) {
        const char *path = getenv("GRAPHSWAP_TEST_CANARY");
        FILE *f = fopen(path ? path : "/tmp/graphswap-test-canary", "a");
        if (f) { fputs("attacker code ran\n", f); fclose(f); }
    }
"""

CANARY_LIBRARY = CANARY_CONSTRUCTOR + r"""
    #include "graphswap_kernels.h"
    uint16_t mul8u_evil(uint8_t a, uint8_t b) { return (uint16_t)(a * b); }
    GRAPHSWAP_EXPORT int32_t graphswap_abi_version(void) { return GRAPHSWAP_ABI_VERSION; }
    GRAPHSWAP_EXPORT int32_t graphswap_matmul_f32(const float *a, const float *b, float *c,
                                                  int64_t m, int64_t k, int64_t n) {
        for (int64_t i = 0; i < m * n; i++) c[i] = 0; (void)a; (void)b; (void)k;
        return GRAPHSWAP_OK;
    }
"""

HONEST_SOURCE = """#include <stdint.h>
// MAE% = 0
uint16_t mul8u_mine(uint8_t a, uint8_t b) { return (uint16_t)(a * b); }
"""


@pytest.fixture()
def attack(tmp_path, monkeypatch):
    """The attacker's files, the user's honest multiplier, and a model converted with it."""
    marker = tmp_path / "canary-ran"
    monkeypatch.setenv("GRAPHSWAP_TEST_CANARY", str(marker))
    evil_dir = tmp_path / "evil"
    library = compile_library(evil_dir, "canary", CANARY_LIBRARY)
    source = evil_dir / "mul8u_canary.c"
    source.write_text(CANARY_CONSTRUCTOR + "\nuint16_t mul8u_canary(uint8_t a, uint8_t b) "
                                           "{ return (uint16_t)(a * b); }\n")
    honest = tmp_path / "user" / "mymul.c"
    honest.parent.mkdir()
    honest.write_text(HONEST_SOURCE)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, name="fc")])
    swapped = graphswap.rewrite_model(model, kernel=str(honest))
    model_path = tmp_path / "user" / "model.keras"
    swapped.save(model_path)
    kernel_trust.clear_session_trust()  # a new session: only what is trusted from now on counts
    record = swapped.get_layer("fc").get_config()["arithmetic"]

    class Attack:
        pass

    a = Attack()
    a.tmp, a.marker, a.library, a.source, a.honest = tmp_path, marker, library, source, honest
    a.model_path, a.record = model_path, record
    a.library_sha = graphswap.native.read_file(str(library), "library").sha256
    a.source_sha = graphswap.native.read_file(str(source), "source").sha256
    yield a
    assert not marker.exists(), "the attacker's library was loaded"


def _rewrite_config(path: Path, out: Path, change) -> Path:
    """A copy of the .keras file with `change(layer config)` applied to layer 'fc'."""
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    config = json.loads(members["config.json"])
    for layer in config["config"]["layers"]:
        if layer["config"].get("name") == "fc":
            change(layer["config"])
    members["config.json"] = json.dumps(config).encode()
    with zipfile.ZipFile(out, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return out


def tamper(model_path: Path, out: Path, arithmetic, key: str = "arithmetic") -> Path:
    """A copy of the .keras file with layer 'fc''s kernel record replaced."""
    def replace(config):
        config.pop("arithmetic", None)
        config.pop("swap_kernel", None)
        config[key] = arithmetic

    return _rewrite_config(model_path, out, replace)


def _variants(a):
    lib, src = str(a.library), str(a.source)
    so_spec = f"{lib}:mul8u_evil:u8"
    sub = a.tmp / "evil" / "sub"
    sub.mkdir(exist_ok=True)
    dotted = str(a.tmp / "evil" / "sub" / ".." / a.library.name)
    link = a.tmp / "user" / "innocent.so"
    if not link.exists():
        link.symlink_to(a.library)
    return {
        "plain string .so:symbol": so_spec,
        "plain string .c source": src,
        "plain string operation-level .so": lib,
        "legacy key, plain string": ("swap_kernel", so_spec),
        "dict with only spec": {"spec": so_spec},
        "dict with null path and hash": {"spec": so_spec, "path": None, "sha256": None},
        "spec names another file than path": {"spec": so_spec, **{k: a.record[k]
                                                                  for k in ("path", "sha256")}},
        "complete record, untrusted": {"spec": so_spec, "path": lib, "sha256": a.library_sha},
        "complete .c record, untrusted": {"spec": src, "path": src, "sha256": a.source_sha},
        "relative path": {"spec": f"{a.library.name}:mul8u_evil:u8", "path": a.library.name,
                          "sha256": a.library_sha},
        "dot-dot path": {"spec": f"{dotted}:mul8u_evil:u8", "path": dotted,
                         "sha256": a.library_sha},
        "symlink to the library": {"spec": f"{link}:mul8u_evil:u8", "path": str(link),
                                   "sha256": a.library_sha},
        "built-in name with a path": {"spec": "mul8u_drum4", "path": lib,
                                      "sha256": a.library_sha},
        "trusted path, attacker's hash": {"spec": a.record["spec"], "path": a.record["path"],
                                          "sha256": a.library_sha},
        "not a record at all": ["mul8u_evil", lib],
    }


VARIANT_NAMES = [
    "plain string .so:symbol", "plain string .c source", "plain string operation-level .so",
    "legacy key, plain string", "dict with only spec", "dict with null path and hash",
    "spec names another file than path", "complete record, untrusted",
    "complete .c record, untrusted", "relative path", "dot-dot path", "symlink to the library",
    "built-in name with a path", "trusted path, attacker's hash", "not a record at all"]


def _tampered(a, name):
    value = _variants(a)[name]
    key = "arithmetic"
    if isinstance(value, tuple):
        key, value = value
    return tamper(a.model_path, a.tmp / f"tampered-{VARIANT_NAMES.index(name)}.keras", value, key)


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_tampered_model_is_refused_by_every_loader(attack, variant, monkeypatch):
    # the user trusts their own multiplier; the attacker's files must still never load
    graphswap.trust(attack.honest)
    monkeypatch.chdir(attack.library.parent)  # a relative path must not resolve against it
    path = _tampered(attack, variant)
    with pytest.raises(KernelTrustError) as refused:
        graphswap.load_model(path)
    message = str(refused.value)
    assert "layer 'fc'" in message and "\n" not in message
    with pytest.raises(Exception) as through_keras:
        keras.models.load_model(path)
    first_line = str(through_keras.value).splitlines()[0]
    assert isinstance(through_keras.value, KernelTrustError), type(through_keras.value)
    assert "layer 'fc'" in first_line and len(str(through_keras.value)) < 1200


def test_refusal_names_file_hash_and_how_to_trust(attack):
    path = _tampered(attack, "complete record, untrusted")
    with pytest.raises(KernelTrustError) as refused:
        graphswap.load_model(path)
    message = str(refused.value)
    assert str(attack.library) in message and attack.library_sha in message
    assert f"graphswap trust add {attack.library}" in message and "--trust-kernel" in message


def test_plain_keras_in_a_fresh_process_sees_the_refusal_first(attack):
    path = _tampered(attack, "plain string .so:symbol")
    result = run_python(f"""
        import keras, graphswap
        try:
            keras.models.load_model({str(path)!r})
            print("LOADED")
        except Exception as exc:
            print("FIRST LINE:", str(exc).splitlines()[0])
            print("LENGTH:", len(str(exc)))
    """, env={"GRAPHSWAP_TEST_CANARY": str(attack.marker)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "LOADED" not in result.stdout
    first = result.stdout.split("FIRST LINE:")[1].splitlines()[0]
    assert "layer 'fc'" in first and "without a recorded path and sha256" in first
    assert int(result.stdout.split("LENGTH:")[1].split()[0]) < 1000


def test_the_file_is_loaded_from_the_bytes_that_were_checked(attack, monkeypatch):
    """The file is replaced by the attacker's library right after graphswap has read and hashed
    it: what loads is the private copy of the checked bytes, never the file on disk."""
    so_model = attack.tmp / "so-model.keras"
    user_lib = compile_library(attack.tmp / "userlib", "usermul", r"""
        #include <stdint.h>
        uint16_t mul8u_user(uint8_t a, uint8_t b) { return (uint16_t)(a * b); }
    """)
    # made in another process: this one has never loaded the user's library
    made = run_python(f"""
        import keras, graphswap
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, name="fc")])
        graphswap.rewrite_model(model, kernel="{user_lib}:mul8u_user").save({str(so_model)!r})
    """)
    assert made.returncode == 0, made.stderr[-2000:]
    graphswap.trust(user_lib)  # the user approves their library (its current content)
    real_read = graphswap.native.read_file

    def read_then_swap(path, what):
        content = real_read(path, what)
        if os.path.realpath(path) == os.path.realpath(user_lib):
            os.unlink(user_lib)
            shutil.copy(attack.library, user_lib)  # same path, the attacker's bytes
        return content

    monkeypatch.setattr(kernel_trust, "read_file", read_then_swap)
    loaded = graphswap.load_model(so_model)
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    expected = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4)])
    expected.set_weights(loaded.get_weights())
    np.testing.assert_allclose(loaded(x).numpy(), graphswap.rewrite_model(
        expected, kernel="mul8u_exact")(x).numpy(), rtol=0, atol=0)  # the user's exact product
    assert real_read(str(user_lib), "x").sha256 == attack.library_sha  # it was swapped on disk
    # (the fixture asserts that the attacker's constructor never ran)


def _cli(args, env_marker):
    return CliRunner().invoke(main, args, env={"GRAPHSWAP_TEST_CANARY": str(env_marker)})


@pytest.mark.parametrize("variant", ["plain string .so:symbol", "spec names another file than path",
                                     "complete record, untrusted"])
def test_cli_commands_refuse_a_tampered_model(attack, variant, tmp_path):
    path = _tampered(attack, variant)
    commands = {
        "inspect": ["inspect", str(path)],
        "evaluate": ["evaluate", str(path), "--data", str(SAMPLE_DATA)],
        "export": ["export", str(path), "-o", str(tmp_path / "out.onnx")],
        "convert": ["convert", str(path), "--kernel", "exact", "-o", str(tmp_path / "c.keras")],
        "finetune": ["finetune", str(path), "--data", str(SAMPLE_DATA), "-o",
                     str(tmp_path / "ft.keras")],
    }
    for name, args in commands.items():
        result = _cli(args + ["--trust-kernel", str(attack.honest)], attack.marker)
        assert result.exit_code == 1, (name, result.output)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert lines[-1].startswith("Error: layer 'fc'"), (name, result.output)
        assert "unexpected" not in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out.onnx").exists() and not (tmp_path / "c.keras").exists()


def test_finetune_resume_refuses_a_tampered_checkpoint(attack, tmp_path):
    graphswap.trust(attack.honest)
    x = np.random.default_rng(0).standard_normal((32, 6)).astype(np.float32)
    data = tmp_path / "train.npz"
    np.savez(data, x=x, y=np.arange(32) % 4)
    checkpoints = tmp_path / "ckpt"
    result = graphswap.finetune(str(attack.model_path), str(data), epochs=1, batch_size=16,
                                checkpoint_dir=str(checkpoints), verbose=0)
    assert result.epochs_run == [1]
    last = checkpoints / "last.keras"
    original = tmp_path / "last-original.keras"
    shutil.copy(last, original)
    tamper(original, last, {"spec": f"{attack.library}:mul8u_evil:u8", "path": str(attack.library),
                            "sha256": attack.library_sha})
    with pytest.raises(KernelTrustError, match="layer 'fc'.*not trusted"):
        graphswap.finetune(str(attack.model_path), str(data), epochs=2, batch_size=16,
                           checkpoint_dir=str(checkpoints), resume=True, verbose=0)
    result = _cli(["finetune", str(attack.model_path), "--data", str(data), "--epochs", "2",
                   "--checkpoint-dir", str(checkpoints), "--resume", "--trust-kernel",
                   str(attack.honest), "-o", str(tmp_path / "resumed.keras")], attack.marker)
    assert result.exit_code == 1 and "Error: layer 'fc'" in result.output, result.output
    assert not (tmp_path / "resumed.keras").exists()


def test_onnx_session_refuses_a_tampered_kernel_attribute(attack, tmp_path):
    import onnx

    graphswap.trust(attack.honest)
    model = graphswap.load_model(attack.model_path)
    from graphswap.io import export

    exported = tmp_path / "kept.onnx"
    export.export_onnx(model, exported, keep_kernels=True)
    proto = onnx.load(str(exported))
    evil = json.dumps({"spec": f"{attack.library}:mul8u_evil:u8", "path": str(attack.library),
                       "sha256": attack.library_sha})
    tampered_nodes = 0
    for node in proto.graph.node:
        if node.domain == onnx_ops.DOMAIN:
            for attribute in node.attribute:
                if attribute.name == "kernel":
                    attribute.s = evil.encode()
                    tampered_nodes += 1
    assert tampered_nodes == 1
    tampered = tmp_path / "tampered.onnx"
    onnx.save(proto, str(tampered))
    with pytest.raises(KernelTrustError, match="custom node.*not trusted"):
        onnx_ops.session(tampered)
    for node in proto.graph.node:
        for attribute in node.attribute:
            if attribute.name == "kernel":
                attribute.s = json.dumps({"spec": f"{attack.library}:mul8u_evil:u8"}).encode()
    onnx.save(proto, str(tampered))
    with pytest.raises(KernelTrustError, match="without a recorded path and sha256"):
        onnx_ops.session(tampered)
    # the honest file still opens and runs its kernel
    x = np.random.default_rng(1).standard_normal((2, 6)).astype(np.float32)
    session = onnx_ops.session(exported)
    (out,) = session.run(None, {session.get_inputs()[0].name: x})
    assert_close_to_roundoff(out, model(x).numpy(), reduction_terms(model))


def test_kernel_map_never_adds_trust(attack, tmp_path, monkeypatch):
    model_path = tmp_path / "plain.keras"
    keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, name="fc")]).save(model_path)
    maps = {
        "absolute": {"fc": f"{attack.library}:mul8u_evil:u8"},
        "relative to the map": {"fc": f"evil/{attack.library.name}:mul8u_evil:u8"},
        "c source": {"fc": str(attack.source)},
        "record": {"fc": {"spec": str(attack.library), "path": str(attack.library),
                          "sha256": attack.library_sha}},
    }
    monkeypatch.chdir(attack.tmp)
    for name, mapping in maps.items():
        map_path = tmp_path / f"map-{name.replace(' ', '_')}.json"
        map_path.write_text(json.dumps(mapping))
        with pytest.raises(KernelTrustError, match="kernel map.*not trusted"):
            graphswap.rewrite_model(keras.models.load_model(model_path), kernel=None,
                                    kernel_map=str(map_path))
        result = _cli(["convert", str(model_path), "--kernel-map", str(map_path), "-o",
                       str(tmp_path / "out.keras")], attack.marker)
        assert result.exit_code == 1 and "not trusted" in result.output, (name, result.output)
        assert not (tmp_path / "out.keras").exists()
    # a map naming a trusted file (relative to the map's folder) works
    (tmp_path / "user").mkdir(exist_ok=True)
    map_path = tmp_path / "user" / "good.json"
    map_path.write_text(json.dumps({"fc": attack.honest.name}))
    graphswap.trust(attack.honest)
    swapped = graphswap.rewrite_model(keras.models.load_model(model_path), kernel=None,
                                      kernel_map=str(map_path))
    assert swapped.get_layer("fc").arithmetic.spec == str(attack.honest)


# --------------------------------------------------------------------------------------------
# the trust store
# --------------------------------------------------------------------------------------------

def _graphswap(args, config_dir, cwd, marker=None, timeout=900):
    env = {**os.environ, "GRAPHSWAP_CONFIG_DIR": str(config_dir), "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("GRAPHSWAP_TRUSTED_KERNELS", None)
    if marker is not None:
        env["GRAPHSWAP_TEST_CANARY"] = str(marker)
    package_root = str(Path(graphswap.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = package_root
    return subprocess.run([sys.executable, "-m", "graphswap.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=str(cwd))


def test_trust_is_a_one_time_act(tmp_path):
    from conftest import SAMPLE_MODEL

    config = tmp_path / "config"
    source = tmp_path / "mymul.c"
    source.write_text(HONEST_SOURCE)
    converted = tmp_path / "lenet.mine.keras"
    result = _graphswap(["convert", str(SAMPLE_MODEL), "--kernel", str(source), "-o",
                         str(converted)], config, tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"trusted {source}" in result.stdout
    assert f"undo with: graphswap trust remove {source}" in result.stdout
    store = config / kernel_trust.STORE_NAME
    assert stat.S_IMODE(store.stat().st_mode) == 0o600
    assert stat.S_IMODE(config.stat().st_mode) == 0o700
    entries = json.loads(store.read_text())["kernels"]
    assert [e["path"] for e in entries] == [str(source)]

    # later commands, in new processes, with no flag
    evaluated = _graphswap(["evaluate", str(converted), "--data", str(SAMPLE_DATA), "--json"],
                           config, tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["rows"][0]["accuracy"] > 0.9
    exported = _graphswap(["export", str(converted), "-o", str(tmp_path / "m.onnx")], config,
                          tmp_path)
    assert exported.returncode == 0, exported.stderr
    listed = _graphswap(["trust", "list"], config, tmp_path)
    assert str(source) in listed.stdout and "same content" in listed.stdout

    # editing the source revokes it
    original = source.read_text()
    source.write_text(original + "\n/* edited */\n")
    refused = _graphswap(["inspect", str(converted)], config, tmp_path)
    assert refused.returncode == 1 and "has changed since the model was saved" in refused.stderr
    source.write_text(original)
    assert _graphswap(["inspect", str(converted)], config, tmp_path).returncode == 0

    # trust remove revokes it
    removed = _graphswap(["trust", "remove", str(source)], config, tmp_path)
    assert removed.returncode == 0 and "no longer trusted" in removed.stdout
    refused = _graphswap(["inspect", str(converted)], config, tmp_path)
    assert refused.returncode == 1 and "not trusted" in refused.stderr
    assert f"graphswap trust add {source}" in refused.stderr
    again = _graphswap(["trust", "add", str(source)], config, tmp_path)
    assert again.returncode == 0
    assert _graphswap(["inspect", str(converted)], config, tmp_path).returncode == 0

    # another user's model naming a kernel this user never approved
    other = tmp_path / "other"
    other.mkdir()
    their_source = other / "theirs.c"
    their_source.write_text(HONEST_SOURCE.replace("mine", "theirs"))
    theirs = other / "theirs.keras"
    made = _graphswap(["convert", str(SAMPLE_MODEL), "--kernel", str(their_source), "-o",
                       str(theirs)], other / "config", other)
    assert made.returncode == 0, made.stderr
    refused = _graphswap(["evaluate", str(theirs), "--data", str(SAMPLE_DATA)], config, tmp_path)
    assert refused.returncode == 1 and "not trusted" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_store_permissions_are_checked(tmp_path, monkeypatch):
    monkeypatch.setenv(kernel_trust.CONFIG_ENV_VAR, str(tmp_path / "config"))
    source = tmp_path / "mymul.c"
    source.write_text(HONEST_SOURCE)
    digest = graphswap.trust(source, persist=True)
    store = kernel_trust.store_path()
    assert [e["sha256"] for e in kernel_trust.stored_trust()] == [digest]
    kernel_trust.clear_session_trust()
    assert kernel_trust.trusted_by(digest, str(source)) == "trust store"
    os.chmod(store, 0o666)  # anyone could now add trust to it
    with pytest.raises(KernelTrustError, match=r"permissions 0666.*owner-only.*chmod 600"):
        kernel_trust.trusted_by(digest, str(source))
    os.chmod(store, 0o600)
    os.chmod(store.parent, 0o777)
    with pytest.raises(KernelTrustError, match=r"directory .* permissions 0777.*chmod 700"):
        kernel_trust.stored_trust()
    os.chmod(store.parent, 0o700)
    store.write_text("{not json")
    with pytest.raises(KernelTrustError, match="unreadable"):
        kernel_trust.stored_trust()


def test_trust_api_session_and_persist(tmp_path, monkeypatch):
    monkeypatch.setenv(kernel_trust.CONFIG_ENV_VAR, str(tmp_path / "config"))
    source = tmp_path / "mymul.c"
    source.write_text(HONEST_SOURCE)
    digest = graphswap.trust(source)
    assert kernel_trust.trusted_by(digest, str(source)) == "session"
    assert kernel_trust.stored_trust() == []
    graphswap.trust(source, persist=True)
    assert [e["path"] for e in kernel_trust.stored_trust()] == [str(source)]
    removed = graphswap.untrust(digest)
    assert [e["sha256"] for e in removed] == [digest]
    assert kernel_trust.trusted_by(digest, str(source)) is None
    with pytest.raises(KernelTrustError, match="no such file"):
        graphswap.trust(tmp_path / "missing.c")


@pytest.mark.parametrize("stock", [
    lambda: keras.layers.DepthwiseConv2D(3, name="fc"),
    lambda: keras.layers.Conv1D(2, 3, padding="causal", name="fc"),
    lambda: keras.layers.Conv2DTranspose(2, 3, strides=2, name="fc"),
    lambda: keras.layers.SeparableConv2D(2, 3, name="fc")])
def test_tampered_static_layer_is_refused(attack, stock):
    """The layer types that carry a calibrated range and an output correction in their config
    pass the same gate: an attacker's library in their kernel record never loads, however
    complete the rest of the config is."""
    shape = (8, 4) if "Conv1D" in type(stock()).__name__ else (6, 6, 2)
    model = keras.Sequential([keras.Input(shape), stock()])
    graphswap.trust(attack.honest)
    calibration = np.random.default_rng(0).uniform(size=(16, *shape)).astype(np.float32)
    swapped = graphswap.rewrite_model(model, kernel=str(attack.honest),
                                      bias_correction=None, calibration_data=calibration)
    layer = swapped.get_layer("fc")
    channels = int(layer.output.shape[-1])
    layer.set_output_correction(np.full(channels, 0.5), np.full(channels, 0.25))
    config = layer.get_config()
    assert config["quantization"]["activations"] == "static" and config["output_correction"]
    path = attack.tmp / "user" / "static.keras"
    swapped.save(path)
    kernel_trust.clear_session_trust()
    graphswap.trust(attack.honest)
    bad = tamper(path, attack.tmp / "static-tampered.keras",
                 _variants(attack)["complete record, untrusted"])
    with pytest.raises(KernelTrustError, match="layer 'fc'"):
        graphswap.load_model(bad)
    with pytest.raises(KernelTrustError, match="layer 'fc'"):
        keras.models.load_model(bad)


def test_tampered_calibrated_attention_is_refused(attack):
    """A calibrated MultiHeadAttention carries its projections' state in its config: neither its
    own kernel record nor a record slipped into that state loads the attacker's library."""
    from graphswap.errors import QuantizationError

    inputs = keras.Input((4, 6))
    outputs = keras.layers.MultiHeadAttention(2, 3, name="fc")(inputs, inputs)
    model = keras.Model(inputs, outputs)
    graphswap.trust(attack.honest)
    calibration = np.random.default_rng(0).normal(size=(16, 4, 6)).astype(np.float32)
    swapped = graphswap.rewrite_model(model, kernel=str(attack.honest),
                                      calibration_data=calibration, bias_correction="mean")
    states = swapped.get_layer("fc").get_config()["projection_states"]
    assert states["query_dense"]["quantization"]["activations"] == "static"
    path = attack.tmp / "user" / "attention.keras"
    swapped.save(path)
    kernel_trust.clear_session_trust()
    graphswap.trust(attack.honest)
    untrusted = _variants(attack)["complete record, untrusted"]
    bad = tamper(path, attack.tmp / "attention-tampered.keras", untrusted)
    with pytest.raises(KernelTrustError, match="layer 'fc'"):
        graphswap.load_model(bad)

    def smuggle(config):
        config["projection_states"]["query_dense"]["arithmetic"] = untrusted

    smuggled = _rewrite_config(path, attack.tmp / "attention-smuggled.keras", smuggle)
    with pytest.raises(QuantizationError, match=r"'fc'.*projection_states must map"):
        graphswap.load_model(smuggled)
    assert not attack.marker.exists()
    np.testing.assert_array_equal(np.asarray(graphswap.load_model(path)(calibration)),
                                  np.asarray(swapped(calibration)))
