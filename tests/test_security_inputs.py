"""Data and side files graphswap reads end in one clear error.

Each case is tried through the CLI (one `Error:` line, exit 1, no traceback) and the API (the
error class and its message): .npz members whose declared sizes or bytes cannot be right, 0-d
inputs, a kernel map that is not UTF-8, image folders whose links go in circles, and --study files
that are not graphswap studies or hold values graphswap did not write.
"""

from __future__ import annotations

import io
import json
import sqlite3
import zipfile

import keras
import numpy as np
import pytest
from click.testing import CliRunner
from numpy.lib import format as npy_format

import graphswap
from graphswap.cli import main
from graphswap.errors import DataError, GraphswapError
from graphswap.research import load_data
from graphswap.research.data import datafiles
from graphswap.research.exploration import design_space

X = np.random.default_rng(0).standard_normal((12, 4)).astype(np.float32)
Y = np.arange(12) % 3


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    folder = tmp_path_factory.mktemp("inputs")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax",
                                                                    name="out")])
    model.compile(loss="sparse_categorical_crossentropy")
    path = folder / "dense.keras"
    model.save(path)
    return model, path


def _npy(array=None, header=None, data=b""):
    buffer = io.BytesIO()
    if array is not None:
        np.save(buffer, array)
        return buffer.getvalue()
    npy_format.write_array_header_1_0(buffer, header)
    return buffer.getvalue() + data


def _npz(path, members, method=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", method) as archive:
        for name, data in members.items():
            archive.writestr(name + ".npy", data)
    return path


def _header(shape, descr="<f4"):
    return {"descr": descr, "fortran_order": False, "shape": shape}


def _bad_archives(folder):
    """(name, path, message parts) of every damaged .npz."""
    y = _npy(Y)
    good = folder / "good.npz"
    np.savez(good, x=X, y=Y)
    raw = good.read_bytes()
    at = raw.index(X.tobytes()[:16])
    flipped = bytearray(raw)
    flipped[at + 5] ^= 0xFF
    (folder / "crc.npz").write_bytes(bytes(flipped))
    np.savez_compressed(folder / "compressed.npz", x=X, y=Y)
    with zipfile.ZipFile(folder / "compressed.npz") as archive:
        info = archive.getinfo("x.npy")
    damaged = bytearray((folder / "compressed.npz").read_bytes())
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    for i in range(start + 3, start + 40):
        damaged[i] ^= 0x5A
    (folder / "zlib.npz").write_bytes(bytes(damaged))
    return [
        ("declared_1e12", _npz(folder / "huge.npz", {
            "x": _npy(header=_header((10 ** 12, 4)), data=X.tobytes()), "y": y}),
         ("array 'x' (member x.npy) declares shape (1000000000000, 4) of float32",
          "4,000,000,000,000 elements", "memory available")),
        ("overflowing_shape", _npz(folder / "overflow.npz", {
            "x": _npy(header=_header((2 ** 62, 2 ** 62)), data=X.tobytes()), "y": y}),
         ("declares shape (4611686018427387904, 4611686018427387904)", "memory available")),
        ("declared_more_than_held", _npz(folder / "short.npz", {
            "x": _npy(header=_header((20, 4)), data=X.tobytes()), "y": y}),
         ("declares shape (20, 4) of float32 (320 bytes)", "holds 192 bytes",
          "corrupt or truncated")),
        ("negative_dimension", _npz(folder / "negative.npz", {
            "x": _npy(header=_header((-1, 4)), data=X.tobytes()), "y": y}),
         ("negative dimension",)),
        ("object_array", _npz(folder / "object.npz", {
            "x": _npy(header=_header((12, 4), "|O"), data=b"\x80" * 40), "y": y}),
         ("holds Python objects", "never unpickles")),
        ("no_npy_header", _npz(folder / "header.npz", {"x": b"\x93NUMPY\x01\x00" + b"\x10\x00"
                                                       + b"{'a': 1}".ljust(16), "y": y}),
         ("array 'x' (member x.npy) has no valid .npy header",)),
        ("crc_error", folder / "crc.npz",
         ("array 'x' (member x.npy) is corrupt", "Bad CRC-32", "damaged or truncated")),
        ("zlib_error", folder / "zlib.npz",
         ("array 'x' (member x.npy) is corrupt", "zlib error", "damaged or truncated")),
        ("zero_d_inputs", _npz(folder / "scalar.npz", {"x": _npy(np.float32(3.0)), "y": y}),
         ("inputs are a scalar (a 0-d array, shape ())", "batch axis",
          "shape (examples, 4)")),
        ("zero_d_labels", _npz(folder / "scalar_y.npz", {"x": _npy(X), "y": _npy(np.int64(2))}),
         ("the labels are a scalar (a 0-d array, shape ())", "one label per example",
          "length 12")),
    ]


def _cli_error(args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and "unexpected" not in result.output, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, result.output
    return lines[0]


def test_damaged_npz_members_are_named_before_anything_is_allocated(dense, tmp_path):
    """10 damaged archives: one clear line each from `evaluate`, and a DataError from load_data;
    the size checks come before any allocation (a 10^12-element header used to be a
    MemoryError, an overflowing one was blamed on pickle, CRC and zlib errors were unexpected,
    a 0-d input was "empty", 0-d labels an unexpected TypeError)."""
    model, model_path = dense
    cases = _bad_archives(tmp_path)
    assert len(cases) == 10
    for name, path, parts in cases:
        line = _cli_error(["evaluate", model_path, "--data", path])
        for part in parts:
            assert part in line, f"{name}: {part!r} not in {line!r}"
        assert "pickle (" not in line, f"{name}: blamed on pickle: {line}"
        with pytest.raises(DataError) as caught:
            load_data(path, model)
        assert all(part in str(caught.value) for part in parts), f"{name}: {caught.value}"


def test_the_checked_reader_reads_what_numpy_writes(tmp_path, monkeypatch):
    """Honest archives read back exactly as np.load reads them: stored and compressed, C and
    Fortran order, 0-size and structured-free dtypes, and arrays read in many small chunks."""
    arrays = {"x": X, "f": np.asfortranarray(np.arange(24, dtype=np.int16).reshape(4, 6)),
              "e": np.zeros((0, 3), np.uint8), "b": np.array([True, False]),
              "big": np.random.default_rng(1).standard_normal((300, 7))}
    monkeypatch.setattr(datafiles, "CHUNK_BYTES", 1000)  # the reading loop runs many times
    for writer in (np.savez, np.savez_compressed):
        path = tmp_path / f"{writer.__name__}.npz"
        writer(path, **arrays)
        with np.load(path) as expected, datafiles.open_npz(path) as archive:
            assert archive.files == expected.files
            for key in expected.files:
                got = archive[key]
                assert got.dtype == expected[key].dtype and got.shape == expected[key].shape
                np.testing.assert_array_equal(got, expected[key])


def test_the_size_bound_is_the_memory_available(tmp_path, monkeypatch):
    """A consistent archive whose array needs more memory than is available is refused before
    it is read (the bound is the machine's, not the file's own claim)."""
    path = tmp_path / "fits.npz"
    np.savez(path, x=X, y=Y)
    monkeypatch.setattr(datafiles, "memory_available", lambda: 100)
    with pytest.raises(DataError, match=r"declares shape \(12, 4\) of float32 = 48 elements, "
                                        r"192 bytes; this machine has 100 bytes of memory"):
        datafiles.open_npz(path)["x"]
    monkeypatch.setattr(datafiles, "memory_available", lambda: None)  # the system does not say
    np.testing.assert_array_equal(datafiles.open_npz(path)["x"], X)
    assert datafiles.memory_available is not None


def test_a_kernel_map_that_is_not_utf8_is_named(dense, tmp_path):
    model, model_path = dense
    latin = tmp_path / "map.json"
    latin.write_bytes('{"out": "mul8u_drum4", "caf\u00e9": null}'.encode("latin-1"))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    for path, parts in ((latin, ("is not UTF-8 text (byte 0xe9 at offset 27",
                                 "save it again as UTF-8")),
                        (deep, ("nests too deeply",))):
        line = _cli_error(["convert", model_path, "--kernel-map", path, "-o",
                           tmp_path / "out.keras"])
        assert all(part in line for part in parts), line
        assert not (tmp_path / "out.keras").exists()
        with pytest.raises(GraphswapError) as caught:
            graphswap.rewrite_model(model, kernel=None, kernel_map=str(path))
        assert all(part in str(caught.value) for part in parts), caught.value


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    keras.utils.set_random_seed(0)
    folder = tmp_path_factory.mktemp("images")
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(2, 3, name="conv"),
                              keras.layers.Flatten(),
                              keras.layers.Dense(2, activation="softmax", name="out")])
    model.compile(loss="sparse_categorical_crossentropy")
    path = folder / "conv.keras"
    model.save(path)
    return model, path


def _image_folder(root):
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
        for i in range(2):
            keras.utils.save_img(root / name / f"{i}.png",
                                 np.random.default_rng(i).integers(0, 255, (8, 8, 3)))
    return root


def test_image_folder_links_that_go_nowhere_are_named(images, tmp_path):
    """4 link problems (a class folder that is a link loop or a link back to the data folder, an
    image that is a link loop or a broken link): one line each naming the link; it used to be
    "unexpected UnknownError ... Too many levels of symbolic links" or a silent skip.  Links
    that Keras does not follow (to folders inside a class folder) stay harmless."""
    model, model_path = images
    cases = []
    loop = _image_folder(tmp_path / "class_loop")
    (loop / "c").symlink_to("c")
    cases.append((loop, "class folder", "c is a symbolic link loop"))
    back = _image_folder(tmp_path / "class_back")
    (back / "c").symlink_to(back)
    cases.append((back, "class folder", "which holds the data folder itself"))
    image = _image_folder(tmp_path / "image_loop")
    (image / "a" / "x.png").symlink_to("y.png")
    (image / "a" / "y.png").symlink_to("x.png")
    cases.append((image, "image file", "x.png is a symbolic link loop"))
    broken = _image_folder(tmp_path / "image_broken")
    (broken / "b" / "z.png").symlink_to(tmp_path / "gone.png")
    cases.append((broken, "image file", "z.png is a broken symbolic link"))
    for folder, what, part in cases:
        line = _cli_error(["evaluate", model_path, "--data", folder])
        assert f"Error: {what} {folder}" in line and part in line, line
        with pytest.raises(DataError, match=part.replace(".", r"\.")):
            load_data(folder, model)
    harmless = _image_folder(tmp_path / "harmless")
    (harmless / "a" / "up").symlink_to("..")
    assert len(load_data(harmless, model)) == 4


# --------------------------------------------------------------------------------------------
# --study files
# --------------------------------------------------------------------------------------------

LAYERS, CHOICES = ["out"], ["exact", "mul8u_drum4"]
FINGERPRINT = {"model": "m", "data": "d"}


def _study(path):
    return design_space.Study(path, FINGERPRINT, LAYERS, CHOICES)


def _tables(path):
    with sqlite3.connect(path) as connection:
        return sorted(row[0] for row in connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'"))


def test_a_study_file_that_is_not_a_graphswap_study_is_left_untouched(tmp_path):
    """An unrelated SQLite database, an optuna database of other studies, a text file and a
    directory are refused before optuna opens them: not one byte changes (optuna used to add
    its 13 tables to the user's database)."""
    import optuna

    unrelated = tmp_path / "notes.db"
    with sqlite3.connect(unrelated) as connection:
        connection.execute("CREATE TABLE notes (text TEXT)")
        connection.execute("INSERT INTO notes VALUES ('mine')")
    others = tmp_path / "others.db"
    optuna.create_study(study_name="someone-else", storage=f"sqlite:///{others}")
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n")
    folder = tmp_path / "folder"
    folder.mkdir()
    cases = [(unrelated, "is an SQLite database with tables of its own (notes), not a graphswap "
                         "study; graphswap would add optuna's tables to it"),
             (others, "is an optuna database without graphswap's study 'graphswap-explore' (its "
                      "studies: someone-else)"),
             (text, "is not an SQLite database"),
             (folder, "is a directory")]
    for path, message in cases:
        before = path.read_bytes() if path.is_file() else None
        with pytest.raises(GraphswapError, match=message.replace("(", r"\(").replace(")", r"\)")):
            _study(path)
        assert (path.read_bytes() if path.is_file() else None) == before
    assert _tables(unrelated) == ["notes"]
    # a new file, an empty one, and a graphswap study reopen
    for path in (tmp_path / "new.db", tmp_path / "empty.db"):
        if path.name == "empty.db":
            path.write_bytes(b"")
        _study(path).record({"out": "exact"}, {"accuracy": 0.5, "loss": 1.0, "agreement": 1.0,
                                               "drop": 0.0}, 1.0)
        assert list(_study(path).measured().values())[0]["accuracy"] == 0.5


def _tamper(path, sql, *args):
    with sqlite3.connect(path) as connection:
        changed = connection.execute(sql, args).rowcount
    assert changed >= 1, sql


def test_study_values_graphswap_did_not_write_are_refused(tmp_path):
    """8 edits of a study's stored values, each refused naming the value and what is allowed
    (they used to reach the search as strings, lists or unknown circuits)."""
    base = tmp_path / "study.db"
    study = _study(base)
    study.record({"out": "mul8u_drum4"}, {"accuracy": 0.75, "loss": 0.5, "agreement": 0.9,
                                          "drop": 0.05}, 0.5)
    study.put("estimates", {"out": {"mul8u_drum4": 0.7}})
    study.put("estimate_all_exact", 0.8)
    study.put("finetuned:1:mul8u_drum4", {"accuracy": 0.78, "loss": 0.4, "agreement": 0.95,
                                          "drop": 0.02})
    attrs = "UPDATE trial_user_attributes SET value_json = ? WHERE key = ?"
    study_attrs = "UPDATE study_user_attributes SET value_json = ? WHERE key = ?"
    edits = [
        ("accuracy_a_string", attrs, ('"high"', "accuracy"), "measured",
         "trial 0's accuracy is 'high'; expected a number up to 1"),
        ("accuracy_above_one", attrs, ("7.5", "accuracy"), "measured",
         "trial 0's accuracy is 7.5"),
        ("cost_negative", attrs, ("-1", "cost"), "measured", "trial 0's cost is -1"),
        ("circuit_unknown", "UPDATE trial_params SET distribution_json = ?", (json.dumps(
            {"name": "CategoricalDistribution",
             "attributes": {"choices": ["exact", "evil.so:f"]}}),), "measured",
         "trial 0's circuit for layer 'out' is 'evil.so:f'; expected one of exact, mul8u_drum4"),
        ("estimates_a_list", study_attrs, ("[1, 2]", "estimates"), "estimates",
         "the stored estimates is [1, 2]"),
        ("estimate_a_string", study_attrs, ('{"out": {"mul8u_drum4": "x"}}', "estimates"),
         "estimates", "the estimate of layer 'out' on mul8u_drum4 is 'x'"),
        ("all_exact_null_string", study_attrs, ('"0.8"', "estimate_all_exact"),
         "estimate_all_exact", "the stored all-exact estimate is '0.8'"),
        ("finetuned_without_drop", study_attrs, ('{"accuracy": 0.7}', "finetuned:1:mul8u_drum4"),
         "finetuned:1:mul8u_drum4", "the stored 'finetuned:1:mul8u_drum4''s drop is None"),
    ]
    for name, sql, args, read, message in edits:
        path = tmp_path / f"{name}.db"
        path.write_bytes(base.read_bytes())
        _tamper(path, sql, *args)
        with pytest.raises(GraphswapError) as caught:
            opened = _study(path)
            opened.measured() if read == "measured" else opened.get(read)
        assert message in str(caught.value), f"{name}: {caught.value}"
        assert "holds a value graphswap did not write" in str(caught.value)
        assert "delete it (or use another --study file)" in str(caught.value)
    path = tmp_path / "fingerprint.db"
    path.write_bytes(base.read_bytes())
    _tamper(path, study_attrs, '"abc"', "fingerprint")
    with pytest.raises(GraphswapError, match="the study's fingerprint is 'abc'"):
        _study(path)
    # the untouched study reads back what was written
    reopened = _study(base)
    assert list(reopened.measured()) == [("mul8u_drum4",)]
    assert reopened.get("estimates") == {"out": {"mul8u_drum4": 0.7}}


def test_explore_refuses_a_foreign_or_tampered_study_in_one_line(dense, tmp_path):
    model, model_path = dense
    data = tmp_path / "val.npz"
    np.savez(data, x=X, y=Y)
    table = tmp_path / "power.csv"
    table.write_text("name,power\nexact,0.4\nmul8u_drum4,0.2\n")
    args = ["explore", model_path, "--data", data, "--library", "mul8u_drum4", "--metrics",
            table, "--budget", "90", "--include", "out"]
    unrelated = tmp_path / "notes.db"
    with sqlite3.connect(unrelated) as connection:
        connection.execute("CREATE TABLE notes (text TEXT)")
    line = _cli_error(args + ["--study", unrelated, "-o", tmp_path / "a.json"])
    assert "tables of its own (notes), not a graphswap study" in line
    assert _tables(unrelated) == ["notes"] and not (tmp_path / "a.json").exists()
    study = tmp_path / "study.db"
    result = CliRunner().invoke(main, [str(a) for a in args + ["--study", study, "-o",
                                                                tmp_path / "b.json"]])
    assert result.exit_code == 0, result.output
    _tamper(study, "UPDATE trial_user_attributes SET value_json = '[0.5]' WHERE key = 'drop'")
    line = _cli_error(args + ["--study", study, "-o", tmp_path / "c.json", "--budget", "80"])
    assert "holds a value graphswap did not write" in line and "drop is [0.5]" in line
    assert not (tmp_path / "c.json").exists()


KILLED_WRITER = """
import sys
from graphswap.research.exploration import design_space
study = design_space.Study(sys.argv[1], {"model": "m", "data": "d"}, ["out"],
                           ["exact", "mul8u_drum4"])
for i in range(100000):
    study.put(f"finetuned:{i}", {"accuracy": 0.5, "loss": 1.0, "agreement": 1.0, "drop": 0.0})
    if i == 20:
        print("writing", flush=True)
"""


def test_a_study_killed_while_writing_reopens_whole_and_leaves_no_temporary(tmp_path):
    """The study is the only file these modules write (SQLite, through optuna): a writer killed
    (SIGKILL) mid-transaction leaves at most SQLite's journal, which the next open rolls back and
    removes; the study reopens with every value it committed readable."""
    import os
    import signal
    import subprocess
    import sys

    from conftest import REPO

    path = tmp_path / "study.db"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(path)],
                             stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "writing"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL
    study = _study(path)
    stored = [key for key in study.study.user_attrs if key.startswith("finetuned:")]
    assert len(stored) >= 21
    for key in stored:
        assert study.get(key)["accuracy"] == 0.5
    study.put("after", 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.db"]


HOT_JOURNAL_WRITER = """
import sqlite3, sys, time
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("PRAGMA cache_size = 1")   # pages spill to the file before the commit
connection.execute("BEGIN IMMEDIATE")
connection.execute("UPDATE studies SET study_name = study_name || '-half-written'")
connection.execute("CREATE TABLE scratch (x)")
for _ in range(20):
    connection.execute("INSERT INTO scratch VALUES (zeroblob(200000))")
print("in transaction", flush=True)
time.sleep(600)
"""


def test_a_study_whose_writer_died_inside_a_transaction_reopens_rolled_back(tmp_path):
    """A writer killed inside a transaction leaves a hot journal, which only a read-write open
    rolls back: the study check (a read-only open) must not refuse the study for it ("attempt
    to write a readonly database", seen when the test above's kill landed mid-transaction) - the
    study reopens with the transaction rolled back and the journal gone."""
    import os
    import signal
    import subprocess
    import sys

    path = tmp_path / "study.db"
    study = _study(path)
    study.put("finetuned:0", {"accuracy": 0.5, "loss": 1.0, "agreement": 1.0, "drop": 0.0})
    del study
    child = subprocess.Popen([sys.executable, "-c", HOT_JOURNAL_WRITER, str(path)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "in transaction"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    assert (tmp_path / "study.db-journal").exists()
    study = _study(path)
    assert study.get("finetuned:0")["accuracy"] == 0.5
    assert "scratch" not in _tables(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.db"]
    assert os.path.getsize(path) > 0


def test_saliency_reads_an_npz_sample_through_the_checked_reader(tmp_path):
    """`graphswap saliency MODEL A.npz --index 0` reads the archive with the same bounded
    reader as every other command: the eight damaged archives whose inputs cannot be read are
    named in one line (it used plain np.load: a 10^12-element header was a MemoryError), and a
    0-d input is refused by name."""
    from graphswap.research.analysis import saliency
    image_model = keras.Sequential([keras.Input((12, 4, 1)), keras.layers.Flatten(),
                                    keras.layers.Dense(3, activation="softmax")])
    model_path = tmp_path / "image.keras"
    image_model.save(model_path)
    cases = _bad_archives(tmp_path)
    unreadable = [case for case in cases if not case[0].startswith("zero_d")]
    assert len(unreadable) == 8
    for name, path, parts in unreadable:
        line = _cli_error(["saliency", model_path, path, "--index", "0",
                           "-o", tmp_path / f"{name}.png"])
        for part in parts:
            assert part in line, f"{name}: {part!r} not in {line!r}"
        assert not (tmp_path / f"{name}.png").exists()
    scalar = next(path for name, path, _ in cases if name == "zero_d_inputs")
    with pytest.raises(DataError, match=r"'x' in .* is a scalar \(a 0-d array\)"):
        saliency.load_sample(image_model, scalar, index=0)
