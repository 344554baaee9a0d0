"""Inputs an attacker can shape are bounded before graphswap (or Keras) acts on them.

A `.keras` archive whose weights member inflates a thousandfold is refused by the sizes it
declares, before Keras reads it into memory; a metrics table's figures are finite numbers >= 0;
JSON nested 100,000 levels deep (a kernel map, a metrics table, a checkpoint state, a SavedModel's
metadata, a model's config, a study's values) is refused by its depth, not a RecursionError; a
FIFO or a device given as an input file is refused by what it is, never waited on.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import keras
import numpy as np
import pytest
from click.testing import CliRunner

import graphswap
from graphswap import input_files
from graphswap import io as gsio
from conftest import one_error_line
from graphswap.cli import main
from graphswap.errors import (CheckpointError, DataError, GraphswapError, InputFileError,
                              ModelLoadError)
from graphswap.research import load_data
from graphswap.research.exploration import circuits
from graphswap.research.training.checkpoints import read_checkpoint_state

DEEP = "[" * 100000 + "]" * 100000
X = np.random.default_rng(0).standard_normal((12, 4)).astype(np.float32)
Y = np.arange(12) % 3


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bounded")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax",
                                                                    name="out")])
    model.compile(loss="sparse_categorical_crossentropy")
    path = folder / "dense.keras"
    model.save(path)
    return model, path


def _cli_error(args) -> str:
    """The one `Error:` line of a command that must fail with exit code 1."""
    return one_error_line(CliRunner().invoke(main, [str(a) for a in args]))


# --------------------------------------------------------------------------------------------
# .keras archives whose members inflate
# --------------------------------------------------------------------------------------------

def _zeros_deflated(size: int) -> tuple[bytes, int]:
    """(raw deflate stream, CRC-32) of `size` zero bytes (a multiple of 1 MiB), made in well under
    a second: every 1 MiB block, compressed after a full flush, is the same bytes."""
    block = bytes(1 << 20)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    one = compressor.compress(block) + compressor.flush(zlib.Z_FULL_FLUSH)
    count = size // len(block)
    crc = 0
    for _ in range(count):
        crc = zlib.crc32(block, crc)
    return one * count + compressor.flush(zlib.Z_FINISH), crc


def _write_zip(path: Path, members) -> Path:
    """A zip archive of `members` [(name, method, raw data, crc, size)], written field by field (so
    a member can be a deflate stream made without inflating it)."""
    local, central = bytearray(), bytearray()
    for name, method, data, crc, size in members:
        encoded = name.encode()
        header = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0x21, crc, len(data),
                             size, len(encoded), 0)
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0x21, crc,
                               len(data), size, len(encoded), 0, 0, 0, 0, 0, len(local))
        central += encoded
        local += header + encoded + data
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(central),
                      len(local), 0)
    path.write_bytes(bytes(local + central + end))
    return path


def _stored(name: str, data: bytes):
    return name, 0, data, zlib.crc32(data), len(data)


def _keras_members(source: Path) -> dict:
    import zipfile

    with zipfile.ZipFile(source) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def _weights_bomb(source: Path, path: Path, size: int = 1 << 30) -> Path:
    """`source`'s archive with its weights member replaced by `size` zero bytes, deflated
    ~1000:1: a file of about 1 MB that inflates to 1 GiB."""
    members = _keras_members(source)
    data, crc = _zeros_deflated(size)
    return _write_zip(path, [_stored("metadata.json", members["metadata.json"]),
                             _stored("config.json", members["config.json"]),
                             ("model.weights.h5", 8, data, crc, size)])


def test_a_weights_member_that_inflates_a_thousandfold_is_refused_before_keras_reads_it(
        dense, tmp_path, monkeypatch):
    _, source = dense
    bomb = _weights_bomb(source, tmp_path / "bomb.keras")
    assert bomb.stat().st_size < 2 * 1024 * 1024   # a small file; 1 GiB once inflated

    def keras_must_not_read(*args, **kwargs):
        raise AssertionError("Keras was asked to load the archive")

    monkeypatch.setattr(keras.models, "load_model", keras_must_not_read)
    with pytest.raises(ModelLoadError) as caught:
        gsio.load_model(bomb)
    message = str(caught.value)
    assert "its member model.weights.h5 declares 1,073,741,824 bytes inflated from" in message
    assert "graphswap reads a .keras archive whose members inflate to at most 100x" in message
    assert "refusing to load it" in message and "Re-save the model" in message


def test_many_small_members_that_inflate_in_all_are_refused(dense, tmp_path):
    """Three members of 40 MiB of zeros each: every one under the 64 MiB floor, 120 MiB in all
    from a file of about 120 KB."""
    _, source = dense
    members = _keras_members(source)
    data, crc = _zeros_deflated(40 << 20)
    bomb = _write_zip(tmp_path / "many.keras", [
        _stored("metadata.json", members["metadata.json"]),
        _stored("config.json", members["config.json"]),
        _stored("model.weights.h5", members["model.weights.h5"]),
        *[(f"assets/pad{i}", 8, data, crc, 40 << 20) for i in range(3)]])
    with pytest.raises(ModelLoadError, match=r"its 6 members declare 125,\d{3},\d{3} bytes in "
                                             r"all, from a file of"):
        gsio.load_model(bomb)


def test_honest_archives_still_load_stored_or_recompressed(dense, tmp_path):
    """Keras' own (stored) archive, and the same members recompressed by a zip tool (deflate),
    load with the same weights."""
    import zipfile

    model, source = dense
    recompressed = tmp_path / "deflated.keras"
    with zipfile.ZipFile(recompressed, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in _keras_members(source).items():
            archive.writestr(name, data)
    for path in (source, recompressed):
        loaded = gsio.load_model(path)
        for a, b in zip(loaded.get_weights(), model.get_weights()):
            np.testing.assert_array_equal(a, b)


MEASURE_INSPECT = """
import resource, sys
from click.testing import CliRunner
from graphswap.cli import main
result = CliRunner().invoke(main, ["inspect", sys.argv[1]])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print("RESULT", result.exit_code, peak)
print(result.output)
"""


def test_inspect_of_a_weights_bomb_fails_fast_without_exhausting_the_memory(dense, tmp_path):
    """`graphswap inspect` of a 1 MB archive inflating to 1 GiB peaked at 2.7 GB (Keras read the
    weights member into memory whole): now one `Error:` line, exit 1, and the peak memory of the
    process stays that of an inspect of a small model."""
    _, source = dense
    bomb = _weights_bomb(source, tmp_path / "bomb.keras")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    root = str(Path(graphswap.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])

    def inspected(path):
        process = subprocess.run([sys.executable, "-c", MEASURE_INSPECT, str(path)],
                                 capture_output=True, text=True, timeout=600, env=env)
        assert process.returncode == 0, process.stderr[-3000:]
        head, _, output = process.stdout.partition("RESULT ")[2].partition("\n")
        code, peak = map(int, head.split())
        return code, peak, output

    code, peak, output = inspected(bomb)
    assert code == 1, output
    errors = [line for line in output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and "model.weights.h5 declares 1,073,741,824 bytes" in errors[0]
    # the same process inspecting the small model it was made from: the 1 GiB member adds
    # nothing (read whole, it would add at least 1 GiB)
    honest_code, honest_peak, _ = inspected(source)
    assert honest_code == 0
    assert peak < honest_peak + 256 * 2 ** 20, (f"peak memory {peak / 2 ** 20:.0f} MiB, "
                                               f"{honest_peak / 2 ** 20:.0f} MiB for the model")


# --------------------------------------------------------------------------------------------
# metrics tables: finite figures >= 0
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix, text, shown", [
    (".csv", "name,power\nexact,0.4\nmul8u_drum4,inf\n", "power 'inf'"),
    (".csv", "name,power\nexact,0.4\nmul8u_drum4,nan\n", "power 'nan'"),
    (".csv", "name,power\nexact,0.4\nmul8u_drum4,-0.2\n", "power '-0.2'"),
    (".json", '{"exact": {"power": 0.4}, "mul8u_drum4": {"power": Infinity}}', "power inf"),
    (".json", '{"exact": {"power": 0.4}, "mul8u_drum4": {"power": 1e999}}', "power inf"),
    (".json", '{"exact": {"power": 0.4}, "mul8u_drum4": {"power": NaN}}', "power nan"),
    (".json", '{"exact": {"power": 0.4}, "mul8u_drum4": {"area": -3}}', "area -3"),
])
def test_a_metrics_table_figure_that_is_not_finite_or_is_negative_is_refused(tmp_path, suffix,
                                                                            text, shown):
    table = tmp_path / f"metrics{suffix}"
    table.write_text(text)
    with pytest.raises(GraphswapError) as caught:
        circuits.read_metrics_table(table)
    assert f"metrics table {table}: entry 'mul8u_drum4' has {shown}; a {shown.split()[0]} is a " \
           f"finite number >= 0" in str(caught.value), caught.value


def test_explore_refuses_an_infinite_power_in_its_metrics_table(dense, tmp_path):
    _, model_path = dense
    data = tmp_path / "val.npz"
    np.savez(data, x=X, y=Y)
    table = tmp_path / "power.csv"
    table.write_text("name,power\nexact,0.4\nmul8u_drum4,inf\n")
    out = tmp_path / "front.json"
    line = _cli_error(["explore", model_path, "--data", data, "--library", "mul8u_drum4",
                       "--metrics", table, "--budget", "90", "--include", "out", "-o", out])
    assert "entry 'mul8u_drum4' has power 'inf'; a power is a finite number >= 0 (mW)" in line
    assert not out.exists()


# --------------------------------------------------------------------------------------------
# JSON nested 100,000 levels deep
# --------------------------------------------------------------------------------------------

def test_json_depth_counts_brackets_outside_strings():
    assert input_files.json_depth('{"a": [1, {"b": "[[[[{{{{"}], "c": "\\"[["}') == 3
    assert input_files.json_depth("[" * 70) == 70       # unclosed: the open brackets count
    assert input_files.json_depth("3") == 0
    assert input_files.load_json('{"x": [[1]]}', "t") == {"x": [[1]]}
    with pytest.raises(InputFileError, match=r"t nests too deeply: its JSON is 65 levels deep, "
                                             r"more than the 64 graphswap reads"):
        input_files.load_json("[" * 65 + "]" * 65, "t")


def test_a_deep_kernel_map_is_refused_by_its_depth(dense, tmp_path):
    model, model_path = dense
    deep = tmp_path / "deep.json"
    deep.write_text(DEEP)
    with pytest.raises(InputFileError, match=rf"the kernel map {deep} nests too deeply: its JSON "
                                             rf"is 100,000 levels deep"):
        graphswap.rewrite_model(model, kernel=None, kernel_map=str(deep))
    line = _cli_error(["convert", model_path, "--kernel-map", deep, "-o", tmp_path / "o.keras"])
    assert "100,000 levels deep, more than the 64 graphswap reads" in line
    assert not (tmp_path / "o.keras").exists()


def test_a_deep_metrics_table_is_refused_by_its_depth(tmp_path):
    table = tmp_path / "metrics.json"
    table.write_text('{"exact": ' + DEEP + "}")
    with pytest.raises(InputFileError, match=rf"the metrics table {table} nests too deeply: its "
                                             rf"JSON is 100,001 levels deep"):
        circuits.read_metrics_table(table)


def test_a_deep_checkpoint_state_is_refused_by_its_depth(tmp_path):
    directory = tmp_path / "ck"
    directory.mkdir()
    (directory / "state.json").write_text(DEEP)
    before = (directory / "state.json").read_bytes()
    with pytest.raises(CheckpointError, match=r"state.json is no graphswap state \(its JSON nests "
                                              r"100,000 levels deep, more than the 64 graphswap "
                                              r"reads\)"):
        read_checkpoint_state(directory)
    assert (directory / "state.json").read_bytes() == before


def test_deep_savedmodel_metadata_is_refused_by_its_depth(tmp_path):
    """The export metadata assets/graphswap_kernels.json of a SavedModel directory."""
    directory = tmp_path / "exported"
    (directory / "assets").mkdir(parents=True)
    (directory / "assets" / "graphswap_kernels.json").write_text(DEEP)
    with pytest.raises(ModelLoadError, match=r"graphswap_kernels.json nests too deeply: its JSON "
                                             r"is 100,000 levels deep"):
        gsio.read_metadata(directory)
    (directory / "assets" / "graphswap_kernels.json").write_text("[1]")
    with pytest.raises(ModelLoadError, match=r"is a JSON list, not the object graphswap writes"):
        gsio.read_metadata(directory)


def test_a_deep_model_config_is_refused_before_keras_parses_it(dense, tmp_path):
    _, source = dense
    members = _keras_members(source)
    config = json.loads(members["config.json"])
    config["config"]["name"] = json.loads("[" * 300 + "]" * 300)
    path = _write_zip(tmp_path / "deep.keras", [
        _stored("metadata.json", members["metadata.json"]),
        _stored("config.json", json.dumps(config).encode()),
        _stored("model.weights.h5", members["model.weights.h5"])])
    with pytest.raises(ModelLoadError, match=r"deep.keras: its config.json nests too deeply: its "
                                             r"JSON is 302 levels deep, more than the 256"):
        gsio.load_model(path)
    line = _cli_error(["inspect", path])
    assert "its config.json nests too deeply" in line


# --------------------------------------------------------------------------------------------
# FIFOs and devices as input files
# --------------------------------------------------------------------------------------------

@contextlib.contextmanager
def deadline(seconds: float = 60.0):
    """Fail (TimeoutError) instead of hanging when something waits on a FIFO."""
    def expired(signum, frame):
        raise TimeoutError(f"still waiting after {seconds:g} s: a FIFO was opened for reading")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


FIFO_WORDS = "is a FIFO (named pipe), not a regular file"


def test_a_fifo_or_a_device_as_kernel_map_is_refused_not_waited_on(dense, tmp_path):
    model, model_path = dense
    fifo = _fifo(tmp_path / "map.json")
    out = tmp_path / "out.keras"
    with deadline():
        with pytest.raises(InputFileError,
                           match=re.escape(f"the kernel map {fifo} {FIFO_WORDS}")):
            graphswap.rewrite_model(model, kernel=None, kernel_map=str(fifo))
        line = _cli_error(["convert", model_path, "--kernel-map", fifo, "-o", out])
        assert FIFO_WORDS in line and "Give the path of the file itself" in line
        with pytest.raises(InputFileError, match=r"the kernel map /dev/zero is a character "
                                                 r"device, not a regular file"):
            graphswap.rewrite_model(model, kernel=None, kernel_map="/dev/zero")
    assert not out.exists()


def test_a_fifo_as_data_file_is_refused_not_waited_on(dense, tmp_path):
    model, model_path = dense
    fifo = _fifo(tmp_path / "data.npz")
    with deadline():
        with pytest.raises(DataError, match=re.escape(f"the data file {fifo} {FIFO_WORDS}")):
            load_data(fifo, model)
        line = _cli_error(["evaluate", model_path, "--data", fifo])
    assert FIFO_WORDS in line


def test_a_fifo_as_metrics_table_is_refused_not_waited_on(dense, tmp_path):
    _, model_path = dense
    fifo = _fifo(tmp_path / "power.csv")
    data = tmp_path / "val.npz"
    np.savez(data, x=X, y=Y)
    out = tmp_path / "front.json"
    with deadline():
        with pytest.raises(InputFileError,
                           match=re.escape(f"the metrics table {fifo} {FIFO_WORDS}")):
            circuits.read_metrics_table(fifo)
        line = _cli_error(["explore", model_path, "--data", data, "--library", "mul8u_drum4",
                           "--metrics", fifo, "--budget", "90", "--include", "out", "-o", out])
    assert f"the metrics table {fifo} {FIFO_WORDS}" in line and not out.exists()


def test_a_fifo_as_model_file_is_refused_not_waited_on(tmp_path):
    fifo = _fifo(tmp_path / "model.keras")
    with deadline():
        with pytest.raises(ModelLoadError,
                           match=re.escape(f"the model file {fifo} {FIFO_WORDS}")):
            gsio.load_model(fifo)
        line = _cli_error(["inspect", fifo])
    assert FIFO_WORDS in line



def test_a_deep_savedmodel_manifest_is_refused_by_its_depth(tmp_path):
    from graphswap.errors import SavedModelConsistencyError
    from graphswap.io import dual_savedmodel

    directory = tmp_path / "m_savedmodel"
    (directory / "assets" / "graphswap").mkdir(parents=True)
    (directory / "assets" / "graphswap" / "model.keras").write_bytes(b"")
    (directory / "assets" / "graphswap" / "manifest.json").write_text("[" * 100000 +
                                                                      "]" * 100000)
    with pytest.raises(SavedModelConsistencyError, match="manifest.json nests too deeply"):
        dual_savedmodel.read_manifest(directory)
