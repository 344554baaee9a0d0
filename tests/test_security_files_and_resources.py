"""Security and data safety of files and resources: what commands may delete, and bounded reads.

Each test is the attack, written from the attacker's (or the unlucky user's) side; the
parenthesised notes say what an unguarded implementation did.

* Files graphswap did not write are never deleted or replaced: a `.graphswap.lock` that is a
  symbolic link (its target was truncated and overwritten with a pid), the checkpoint lock's
  clean-up (it deleted every `*.graphswap-tmp-*` / `*.graphswap-old-*` in the folder: another
  command's set-aside SavedModel, a live convert's temporary), `finetune --force` over a user's
  own best.keras / last.keras / state.json; and a property test: convert, export, evaluate and
  finetune run against folders seeded with look-alike names, and nothing they did not create is
  deleted, truncated or replaced.
* Resources: a sparse 4 GiB file in a SavedModel (copied in full before any check), the 64 MB
  config limit skipped for a graphswap SavedModel's embedded model, TensorFlow's `Abort` op
  passing the pure-op check, .npz members that fit one by one but not together once widened.
* Unclear errors, each now one `Error:` line: deep folder nesting, non-UTF-8 paths, a 40 GB sparse
  manifest, weights Keras refuses inside a .keras, a full disk under the config folder, a study
  file carrying a trigger, a hand-edited checkpoint state.json.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import h5py
import keras
import numpy as np
import pytest
from click.testing import CliRunner

import graphswap
from conftest import SAMPLE_DATA, SAMPLE_MODEL
from graphswap import io as gsio
from graphswap.cli import main
from graphswap.errors import CheckpointError, DataError, GraphswapError, ModelLoadError
from graphswap.io import atomic, paths
from graphswap.io import savedmodel_program as program
from graphswap.research import load_data
from graphswap.research.data import datafiles
from graphswap.research.training import checkpoints
from graphswap.research.training.finetuning import finetune
from graphswap.research.exploration.study_database import check_study_file
from test_security_checkpoints import SETTINGS, data, dropout_model

MULTIPLIER_SOURCE = Path(__file__).resolve().parent.parent / "sample_models" / "multipliers" / \
    "mul8u_gsot45l.c"
OTHER_HOST = "0badc0de"   # a host tag that is not this machine's


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

def invoke(*args) -> "click.testing.Result":  # noqa: F821 - click's type, by name
    return CliRunner().invoke(main, [os.fspath(a) for a in args])


def one_error_line(result) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and "unexpected" not in result.output, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, result.output
    return lines[0]


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def snapshot(root: Path) -> dict:
    """{relative path: what it is} for everything under `root`, links not followed: type, size,
    SHA-256 and inode of files, link targets, inodes of folders - a deleted, truncated, rewritten
    or replaced entry changes its record."""
    found = {}
    for parent, folders, files in os.walk(root):
        for name in folders + files:
            path = Path(parent) / name
            info = os.lstat(path)
            key = str(path.relative_to(root))
            if stat.S_ISLNK(info.st_mode):
                found[key] = ("link", os.readlink(path), info.st_ino)
            elif stat.S_ISDIR(info.st_mode):
                found[key] = ("folder", info.st_ino)
            elif stat.S_ISREG(info.st_mode):
                found[key] = ("file", info.st_size, hashlib.sha256(path.read_bytes()).hexdigest(),
                              info.st_ino)
            else:
                found[key] = ("other", stat.S_IFMT(info.st_mode), info.st_ino)
    return found


def assert_kept(before: dict, after: dict, what: str) -> None:
    """Everything of `before` is in `after` as it was (new entries are allowed)."""
    changed = {key: (value, after.get(key)) for key, value in before.items()
               if after.get(key) != value}
    assert not changed, f"{what} deleted, truncated or replaced what it did not write: {changed}"


def make_deep(root: Path, depth: int) -> None:
    """`root`/d/d/.../d, `depth` folders below `root` (made through descriptors)."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)


def remove_deep(root: Path) -> None:
    """Remove what make_deep made, deepest first (shutil.rmtree recurses: RecursionError)."""
    chain = [root]
    while (chain[-1] / "d").is_dir():
        chain.append(chain[-1] / "d")
    for folder in reversed(chain[1:]):
        for entry in os.scandir(folder):
            os.unlink(entry.path)
        os.rmdir(folder)


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """graphswap's SavedModel of the sample LeNet-5 (copied by each test that edits it)."""
    path = tmp_path_factory.mktemp("exported") / "lenet_sm"
    gsio.export_saved_model(keras.models.load_model(SAMPLE_MODEL), path, check_batch=2)
    return path


@pytest.fixture(scope="module")
def small_npz(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "small.npz"
    with np.load(SAMPLE_DATA) as digits:
        np.savez(path, x=digits["x_test"][:40], y=digits["y_test"][:40])
    return path


def manifest_of(directory: Path) -> Path:
    return directory / "assets" / "graphswap" / "manifest.json"


# ---------------------------------------------------------------------------------------------
# 4. the checkpoint lock never follows a link or writes into a file that is not its own
# ---------------------------------------------------------------------------------------------

def test_a_lock_file_that_is_a_link_or_not_graphswaps_is_refused_and_left_alone(tmp_path):
    """`.graphswap.lock` as a symbolic link to the user's file (it used to be truncated and
    overwritten with a pid), a hard link to it, a FIFO, a folder, a file of the user's under that
    name: CheckpointError naming what it is; the victim is byte for byte unchanged."""
    victim = tmp_path / "thesis.tex"
    victim.write_text("\\chapter{Results}\n" * 50)
    kept = victim.read_bytes()
    cases = {
        "symbolic link": lambda lock: lock.symlink_to(victim),
        "dangling link": lambda lock: lock.symlink_to(tmp_path / "created-through-the-link"),
        "hard link": lambda lock: os.link(victim, lock),
        "FIFO": lambda lock: os.mkfifo(lock),
        "folder": lambda lock: lock.mkdir(),
        "user's file": lambda lock: lock.write_text("my notes, not a pid\n"),
    }
    messages = {"symbolic link": "is a symbolic link (to", "dangling link": "is a symbolic link",
                "hard link": "is a hard link to another file", "FIFO": "is a FIFO",
                "folder": "is a folder", "user's file": "holding something other than a pid"}
    for case, make in cases.items():
        directory = tmp_path / case.replace(" ", "_").replace("'", "")
        directory.mkdir()
        make(directory / ".graphswap.lock")
        before = snapshot(tmp_path)
        with pytest.raises(CheckpointError) as caught:
            checkpoints.lock_checkpoint_directory(directory)
        message = str(caught.value)
        assert messages[case] in message and "never writes through" in message, (case, message)
        assert f"Remove {directory / '.graphswap.lock'}" in message, message
        assert_kept(before, snapshot(tmp_path), case)
        assert victim.read_bytes() == kept
        assert not (tmp_path / "created-through-the-link").exists()
    # through finetune and the CLI: one line, nothing trained or written
    model, arrays = dropout_model(), data()
    linked = tmp_path / "ck"
    linked.mkdir()
    (linked / ".graphswap.lock").symlink_to(victim)
    with pytest.raises(CheckpointError, match="is a symbolic link"):
        finetune(model, arrays, checkpoint_dir=linked, **SETTINGS)
    np.savez(tmp_path / "d.npz", x=arrays[0], y=arrays[1])
    model.save(tmp_path / "m.keras")
    line = one_error_line(invoke("finetune", tmp_path / "m.keras", "--data", tmp_path / "d.npz",
                                 "--epochs", "1", "--checkpoint-dir", linked,
                                 "-o", tmp_path / "out.keras"))
    assert "is a symbolic link" in line and not (tmp_path / "out.keras").exists()
    assert victim.read_bytes() == kept and os.listdir(linked) == [".graphswap.lock"]
    # an honest lock file (empty, or a pid graphswap wrote) is still taken
    honest = tmp_path / "honest"
    honest.mkdir()
    (honest / ".graphswap.lock").write_text("12345\n")
    checkpoints.lock_checkpoint_directory(honest).release()
    assert (honest / ".graphswap.lock").read_text() == f"{os.getpid()}\n"


# ---------------------------------------------------------------------------------------------
# 5. the lock's clean-up removes only its own leftovers of dead processes
# ---------------------------------------------------------------------------------------------

def test_taking_the_checkpoint_lock_removes_only_its_own_leftovers_of_dead_processes(tmp_path):
    """The lock used to delete every temporary and set-aside entry in the folder.  A set-aside
    SavedModel of a killed `convert --force` (the next convert puts it back), a live convert's
    temporary, look-alikes, a checkpoint temporary of another machine sharing the folder and one
    of a live process are kept; only the checkpoint code's own entries of a dead process on this
    machine go."""
    directory = tmp_path / "ck"
    directory.mkdir()
    gone = dead_pid()
    tag = atomic.host_tag() if hasattr(atomic, "host_tag") else "0" * 8   # (before: no tag)
    aside = directory / f".served{atomic.ASIDE_MARK}{gone}-zzzz0000"   # another command's
    (aside / "assets" / "graphswap").mkdir(parents=True)
    (aside / "assets" / "graphswap" / "manifest.json").write_text('{"format": "x"}')
    (aside / "saved_model.pb").write_bytes(b"the set-aside old output")
    kept = {
        aside.name: None,
        f".out.keras{atomic.TEMPORARY_MARK}{os.getpid()}.{tag}-abcd1234.keras": b"live",
        "x.graphswap-tmp-123": b"look-alike", "x.graphswap-old-456": b"look-alike",
        f".epoch-000002{atomic.TEMPORARY_MARK}{gone}.{OTHER_HOST}-abcdefgh": b"another machine",
        f".best.keras{atomic.ASIDE_MARK}{gone}.{OTHER_HOST}-abcdefgh": b"another machine",
        f".current{atomic.TEMPORARY_MARK}{os.getpid()}.{tag}-abcdefgh": b"alive",
        ".state.json.tmp": b"no old-layout checkpoint here: not a leftover",
    }
    for name, content in kept.items():
        if content is not None:
            (directory / name).write_bytes(content)
    removed = [f".epoch-000002{atomic.TEMPORARY_MARK}{gone}.{tag}-abcdefgh",
               f".last.keras{atomic.ASIDE_MARK}{gone}.{tag}-abcdefgh",
               f".epoch-000001{atomic.ASIDE_MARK}{gone}-abcdefgh"]   # an older graphswap's name
    for name in removed:
        (directory / name).mkdir()
        (directory / name / "last.keras").write_bytes(b"partial")
    before = snapshot(directory)
    lock = checkpoints.lock_checkpoint_directory(directory)
    lock.release()
    after = snapshot(directory)
    assert sorted(os.listdir(directory)) == sorted([*kept, ".graphswap.lock"])
    assert_kept({k: v for k, v in before.items() if not k.startswith(tuple(removed))}, after,
                "taking the lock")
    # the killed convert's old output is still there to be put back by the next convert
    with pytest.raises(GraphswapError, match="already exists"):
        paths.check_output_path(directory / "served")
    assert (directory / "served" / "saved_model.pb").read_bytes() == b"the set-aside old output"


# ---------------------------------------------------------------------------------------------
# 6. --force replaces only a checkpoint graphswap wrote
# ---------------------------------------------------------------------------------------------

def test_force_never_replaces_a_users_own_best_last_and_state(tmp_path):
    """A user's own best.keras, last.keras and a state.json with an "epoch" key (it used to be
    taken for an old checkpoint and replaced by --force), a best.keras alone (a fresh run used to
    replace it by a link), an epoch-000001 folder of theirs, a `current` of theirs: CheckpointError
    naming each, with or without --force or --resume; nothing touched.  A checkpoint graphswap
    wrote is still started over with --force."""
    model, arrays = dropout_model(), data()
    mine = tmp_path / "mine.keras"
    dropout_model().save(mine)
    layouts = {
        "best, last, state": {"best.keras": mine.read_bytes(), "last.keras": mine.read_bytes(),
                              "state.json": json.dumps({"epoch": 3, "notes": "mine"}).encode()},
        "best alone": {"best.keras": mine.read_bytes()},
        "state with files": {"last.keras": mine.read_bytes(), "state.json": json.dumps(
            {"epoch": 1, "files": {"last.keras": "0" * 64}}).encode()},
        "epoch folder": {"epoch-000001/results.csv": b"epoch,accuracy\n1,0.9\n"},
        "current": {"current": b"my current draft\n"},
    }
    for case, files in layouts.items():
        directory = tmp_path / case.replace(" ", "_").replace(",", "")
        for name, content in files.items():
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            (directory / name).write_bytes(content)
        for flags in ({"force": True}, {"resume": True}, {}):
            before = snapshot(directory)
            with pytest.raises(CheckpointError) as caught:
                finetune(model, arrays, checkpoint_dir=directory, **flags, **SETTINGS)
            message = str(caught.value)
            assert "graphswap did not write" in message and "not even with --force" in message, \
                (case, message)
            assert all(name.split("/")[0] in message for name in files), (case, message)
            after = snapshot(directory)
            after.pop(".graphswap.lock", None)   # the lock it took (its own file)
            assert after == {k: v for k, v in before.items() if k != ".graphswap.lock"}, case
    # the CLI says so in one line
    np.savez(tmp_path / "d.npz", x=arrays[0], y=arrays[1])
    model.save(tmp_path / "m.keras")
    line = one_error_line(invoke("finetune", tmp_path / "m.keras", "--data", tmp_path / "d.npz",
                                 "--epochs", "1", "--checkpoint-dir", tmp_path / "best_last_state",
                                 "--force", "-o", tmp_path / "out.keras"))
    assert "best.keras" in line and "graphswap did not write" in line
    assert not (tmp_path / "out.keras").exists()
    # graphswap's own checkpoint: --force starts over
    own = tmp_path / "own"
    finetune(model, arrays, checkpoint_dir=own, **{**SETTINGS, "epochs": 1})
    again = finetune(model, arrays, checkpoint_dir=own, force=True, **SETTINGS)
    assert again.epochs_run == [1, 2]
    assert json.loads((own / "state.json").read_text())["format"] == "graphswap-checkpoint"


# ---------------------------------------------------------------------------------------------
# the property: what a command did not create survives it
# ---------------------------------------------------------------------------------------------

def _seed(work: Path, gone: int) -> Path:
    """Look-alike names, foreign temporaries, a user's checkpoint-like files and a lock link."""
    victim = work / "victim.txt"
    victim.write_text("the user's file a lock link points at\n")
    for name in ("x.graphswap-tmp-123", ".x.graphswap-tmp-1-abcdefgh"):
        (work / name).write_bytes(b"look-alike")
    (work / "x.graphswap-old-456").mkdir()
    (work / "x.graphswap-old-456" / "kept.txt").write_text("a folder that looks set aside")
    # another machine's live writer of the very outputs written below, and a pid that runs
    (work / f".out.keras{atomic.TEMPORARY_MARK}{gone}.{OTHER_HOST}-abcdefgh.keras").write_bytes(
        b"another machine writes out.keras")
    (work / f".out.keras{atomic.TEMPORARY_MARK}1-abcdefgh.keras").write_bytes(b"pid 1 runs")
    aside = work / f".sm{atomic.ASIDE_MARK}{gone}.{OTHER_HOST}-zzzzzzzz"
    (aside / "assets").mkdir(parents=True)
    (aside / "saved_model.pb").write_bytes(b"another machine's set-aside SavedModel")
    (work / "best.keras").write_bytes(b"the user's best model")
    (work / "state.json").write_text(json.dumps({"epoch": 7}))
    clean = work / "ck"      # a checkpoint folder with only look-alike leftovers
    clean.mkdir()
    (clean / "notes.txt").write_text("my notes")
    (clean / "x.graphswap-tmp-123").write_bytes(b"look-alike")
    (clean / f".epoch-000001{atomic.TEMPORARY_MARK}1-abcdefgh").mkdir()     # pid 1 runs
    (clean / f".best.keras{atomic.ASIDE_MARK}{gone}.{OTHER_HOST}-abcdefgh").write_bytes(b"x")
    (clean / f".served{atomic.ASIDE_MARK}{gone}-zzzz0000").mkdir()   # another command's
    foreign = work / "ck_foreign"   # a user's own checkpoint-like files
    foreign.mkdir()
    for name in ("best.keras", "last.keras"):
        shutil.copyfile(SAMPLE_MODEL, foreign / name)
    (foreign / "state.json").write_text(json.dumps({"epoch": 2, "lr": 0.1}))
    (foreign / "epoch-000001").mkdir()
    (foreign / "epoch-000001" / "log.txt").write_text("mine")
    linked = work / "ck_link"
    linked.mkdir()
    (linked / ".graphswap.lock").symlink_to(victim)
    return victim


def test_commands_never_delete_truncate_or_replace_what_they_did_not_write(tmp_path, small_npz):
    """convert, export, evaluate and finetune (with --checkpoint-dir: a folder of look-alike
    leftovers, a user's checkpoint-like files with --force, a lock link) run in a folder seeded
    with look-alike names; before and after each command the whole tree is snapshotted (paths,
    types, sizes, hashes, inodes, link targets): what existed before is there after, unchanged."""
    work = tmp_path / "work"
    work.mkdir()
    _seed(work, dead_pid())
    runs = [
        ("convert", ["convert", SAMPLE_MODEL, "-k", "exact", "-o", work / "out.keras"], 0),
        ("export", ["export", SAMPLE_MODEL, "--format", "savedmodel", "-o", f"{work / 'sm'}/",
                    "--check-batch", "2"], 0),
        ("evaluate", ["evaluate", SAMPLE_MODEL, "--data", small_npz, "-k", "exact",
                      "-o", work / "eval.json"], 0),
        ("finetune", ["finetune", SAMPLE_MODEL, "--data", small_npz, "--epochs", "1",
                      "--batch-size", "20", "--lr", "0.001", "--checkpoint-dir", work / "ck",
                      "-o", work / "ft.keras"], 0),
        ("finetune --force over a user's files",
         ["finetune", SAMPLE_MODEL, "--data", small_npz, "--epochs", "1", "--batch-size", "20",
          "--lr", "0.001", "--checkpoint-dir", work / "ck_foreign", "--force",
          "-o", work / "ft_foreign.keras"], 1),
        ("finetune with a lock link", ["finetune", SAMPLE_MODEL, "--data", small_npz, "--epochs",
                                       "1", "--lr", "0.001", "--checkpoint-dir", work / "ck_link",
                                       "-o", work / "ft_link.keras"], 1),
    ]
    for what, args, code in runs:
        before = snapshot(work)
        result = invoke(*args)
        assert result.exit_code == code, (what, result.output)
        if code:
            one_error_line(result)
        after = snapshot(work)
        assert_kept(before, after, what)
        new = sorted(set(after) - set(before))
        assert not any(atomic.TEMPORARY_MARK in name or atomic.ASIDE_MARK in name
                       for name in new), (what, new)   # and it left no temporary of its own
    assert (work / "out.keras").is_file() and (work / "sm" / "saved_model.pb").is_file()
    assert (work / "ft.keras").is_file() and os.readlink(work / "ck" / "current") == \
        "epoch-000001"
    assert not (work / "ft_foreign.keras").exists() and not (work / "ft_link.keras").exists()


# ---------------------------------------------------------------------------------------------
# 7. sizes are checked before a SavedModel is copied
# ---------------------------------------------------------------------------------------------

def test_a_sparse_file_in_a_savedmodel_is_refused_before_anything_is_copied(exported, tmp_path,
                                                                         monkeypatch):
    """A 4 GiB sparse file in assets/ used to be copied in full (the disk filled) before any
    check; a SavedModel whose files exceed the temporary folder's free space likewise."""
    copy = tmp_path / "sparse_sm"
    shutil.copytree(exported, copy)
    with open(copy / "assets" / "padding.bin", "wb") as handle:
        handle.truncate(4 * 1024 ** 3)

    def no_copy(*args, **kwargs):
        raise AssertionError("a file was copied before the sizes were checked")

    monkeypatch.setattr(program, "_copy_file", no_copy)
    with pytest.raises(ModelLoadError) as caught:
        graphswap.load_model(copy)
    message = str(caught.value)
    assert "its files hold more than 2,147,483,648 bytes" in message, message
    assert "assets/padding.bin alone declares 4,294,967,296" in message, message
    line = one_error_line(invoke("convert", copy, "-o", tmp_path / "out.keras"))
    assert "more than 2,147,483,648 bytes" in line and not (tmp_path / "out.keras").exists()
    monkeypatch.undo()
    # no room for the private copy where the temporaries go
    (copy / "assets" / "padding.bin").unlink()
    monkeypatch.setattr(program.shutil, "disk_usage",
                        lambda path: shutil._ntuple_diskusage(10 ** 9, 10 ** 9 - 1000, 1000))
    with pytest.raises(ModelLoadError, match=r"which has 1,000 bytes free; free some space there, "
                                             r"or set TMPDIR"):
        graphswap.load_model(copy)
    monkeypatch.undo()
    graphswap.load_model(copy)   # the honest directory still opens


# ---------------------------------------------------------------------------------------------
# 8. the embedded model's config is bounded as a .keras file's is
# ---------------------------------------------------------------------------------------------

def test_the_embedded_models_config_is_bounded_as_a_keras_files(exported, tmp_path):
    """A graphswap SavedModel whose embedded model.keras holds a config.json of 64 MB + 1 byte (it
    compresses to kilobytes; the manifest's hash updated): refused before Keras reads it, as the
    same archive as a .keras file is (the limit used to be skipped there)."""
    copy = tmp_path / "inflated_sm"
    shutil.copytree(exported, copy)
    embedded = copy / "assets" / "graphswap" / "model.keras"
    with zipfile.ZipFile(embedded) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    members["config.json"] += b" " * (64 * 1024 * 1024 + 1 - len(members["config.json"]))
    with zipfile.ZipFile(embedded, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    data = embedded.read_bytes()
    assert len(data) < 2 * 1024 * 1024
    manifest = json.loads(manifest_of(copy).read_text())
    manifest["model"].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    manifest_of(copy).write_text(json.dumps(manifest))
    shutil.copyfile(embedded, tmp_path / "alone.keras")
    with pytest.raises(ModelLoadError, match="config.json declares 67,108,865 bytes") as alone:
        graphswap.load_model(tmp_path / "alone.keras")
    with pytest.raises(ModelLoadError) as caught:
        graphswap.load_model(copy)
    message = str(caught.value)
    assert message.startswith(f"{copy}/assets/graphswap/model.keras: its config.json declares "
                              f"67,108,865 bytes"), message
    assert str(alone.value).split(": ", 1)[1] == message.split(": ", 1)[1]
    assert "graphswap-savedmodel-" not in message   # the private copy is not named


# ---------------------------------------------------------------------------------------------
# 9. Abort and its kin are no pure computation
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tf_keras_dense(tmp_path_factory):
    tf_keras = pytest.importorskip("tf_keras")
    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.Input((4,), name="features"),
                                 tf_keras.layers.Dense(3, name="head")])
    path = tmp_path_factory.mktemp("tf_keras") / "dense"
    model.save(str(path), save_format="tf")
    return path


def test_abort_in_a_savedmodel_is_refused_before_tensorflow_runs_it(tf_keras_dense, tmp_path):
    """TensorFlow's `Abort` op (stateless by its registry) passed the pure-op check: `convert`
    exited 0 with nothing written (exit_without_error) or died with SIGABRT.  Refused, naming it,
    as are the other stateless ops that are more than computation."""
    target = tmp_path / "aborting"
    shutil.copytree(tf_keras_dense, target)
    proto = program.read_saved_model(target)
    function = next(f for f in proto.meta_graphs[0].graph_def.library.function
                    if f.signature.name.startswith("__inference__wrapped_model"))
    node = function.node_def.add(name="stop", op="Abort")
    node.attr["exit_without_error"].b = True
    node.attr["error_msg"].s = b"bye"
    (target / "saved_model.pb").write_bytes(proto.SerializeToString())
    program.check_keras2_saved_model(tf_keras_dense)   # the honest file passes
    with pytest.raises(ModelLoadError) as caught:
        program.check_keras2_saved_model(target)
    assert "Abort (ends the process) in function __inference__wrapped_model" in \
        str(caught.value), str(caught.value)
    line = one_error_line(invoke("convert", target, "-o", tmp_path / "out.keras"))
    assert "Abort (ends the process)" in line and not (tmp_path / "out.keras").exists()
    for op in ("Abort", "MlirPassthroughOp", "CustomAggregator", "Batch", "Unbatch",
               "DTensorAllReduce", "Relayout", "InfeedEnqueuePrelinearizedBuffer",
               "GetElementAtIndex"):
        assert not program.is_pure_op(op), op
    for op in ("Assert", "MatMul", "BatchMatMulV2", "While", "StatelessIf", "Conv2D"):
        assert program.is_pure_op(op), op


# ---------------------------------------------------------------------------------------------
# 10. an .npz is bounded in all, widened
# ---------------------------------------------------------------------------------------------

def test_npz_members_that_fit_alone_but_not_together_widened_are_refused(tmp_path, monkeypatch):
    """Two uint8 members of a compressed archive (kilobytes on disk), each well within the memory
    available; read and widened (inputs to float32, labels to int64) they would take 14.5 MB of
    the 12 MB available (the attack: 6.5 MB on disk, 17 GB widened, SIGSEGV).  Refused before
    the second member is read, naming both."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(loss="sparse_categorical_crossentropy")
    model.save(tmp_path / "dense.keras")
    count = 500_000
    path = tmp_path / "wide.npz"
    np.savez_compressed(path, x=np.zeros((count, 4), np.uint8), y=np.zeros(count, np.uint8))
    assert path.stat().st_size < 100_000
    monkeypatch.setattr(datafiles, "memory_available", lambda: 12_000_000)
    with datafiles.open_npz(path) as archive:   # each member alone fits
        assert archive["x"].nbytes < 12_000_000
    with datafiles.open_npz(path) as archive:
        assert archive["y"].nbytes < 12_000_000
    with pytest.raises(DataError) as caught:
        load_data(path, model)
    message = str(caught.value)
    assert "its arrays take 13.8 MB once read and widened for the model" in message, message
    assert "'x' (500000, 4) uint8 -> 9.54 MB" in message and "'y' (500000,) uint8" in message
    assert "this machine had 11.4 MB of memory available" in message, message
    line = one_error_line(invoke("evaluate", tmp_path / "dense.keras", "--data", path))
    assert "once read and widened" in line
    monkeypatch.setattr(datafiles, "memory_available", lambda: 10 ** 9)
    assert len(load_data(path, model)) == count


# ---------------------------------------------------------------------------------------------
# unclear errors, each now one line
# ---------------------------------------------------------------------------------------------

def test_deeply_nested_folders_are_one_error_line(exported, tmp_path):
    """1100 folders nested in a SavedModel's assets/ and in an image folder's class: "unexpected
    RecursionError" before; one line naming the nesting now, nothing written."""
    copy = tmp_path / "deep_sm"
    shutil.copytree(exported, copy)
    images = tmp_path / "images"
    from PIL import Image

    for label in ("a", "b"):
        (images / label).mkdir(parents=True)
        for index in range(2):
            Image.fromarray(np.full((32, 32), 40 * index, np.uint8)).save(
                images / label / f"{index}.png")
    make_deep(copy / "assets" / "nest", 1100)
    make_deep(images / "a" / "nest", 1100)
    try:
        line = one_error_line(invoke("convert", copy, "-o", tmp_path / "out.keras"))
        assert "its folders nest more than 32 deep" in line and "Remove the nested" in line
        assert not (tmp_path / "out.keras").exists()
        line = one_error_line(invoke("evaluate", SAMPLE_MODEL, "--data", images))
        assert f"image folder {images} nests folders more than 64 deep" in line, line
    finally:
        remove_deep(copy / "assets" / "nest")
        remove_deep(images / "a" / "nest")


def test_non_utf8_paths_are_written_or_refused_in_one_line(exported, tmp_path):
    """An output named with a byte that is no UTF-8 used to be "unexpected UnicodeEncodeError";
    a graphswap SavedModel under such a name was "damaged or edited".  A .keras output is
    written; a SavedModel output (TensorFlow writes only UTF-8 paths) is one line; a SavedModel
    input opens."""
    keras_output = tmp_path / os.fsdecode(b"r\xe9sultat.keras")
    result = invoke("convert", SAMPLE_MODEL, "-k", "exact", "-o", keras_output)
    assert result.exit_code == 0, result.output
    assert keras.models.load_model(keras_output) is not None
    directory_output = tmp_path / os.fsdecode(b"sm\xff")
    line = one_error_line(invoke("export", SAMPLE_MODEL, "--format", "savedmodel",
                                 "-o", f"{directory_output}/"))
    assert "is not UTF-8 text (a name with the byte 0xff)" in line and \
        "name the output in UTF-8" in line, line
    assert not directory_output.exists()
    source = tmp_path / os.fsdecode(b"lenet_\xffsm")
    shutil.copytree(exported, source)
    assert graphswap.load_model(source) is not None


def test_a_40_gb_sparse_manifest_is_one_error_line(exported, tmp_path):
    """manifest.json made a 40 GB sparse file: a MemoryError before; now refused by its size
    before it is read."""
    copy = tmp_path / "big_manifest_sm"
    shutil.copytree(exported, copy)
    with open(manifest_of(copy), "r+b") as handle:
        handle.truncate(40 * 1024 ** 3)
    with pytest.raises(ModelLoadError) as caught:
        graphswap.load_model(copy)
    assert str(caught.value) == (
        f"{copy}: assets/graphswap/manifest.json holds 42,949,672,960 bytes, more than the "
        f"67,108,864 graphswap reads of a JSON file in a model (graphswap writes kilobytes "
        f"there); it was edited or replaced. Re-export the directory")
    assert "42,949,672,960 bytes" in one_error_line(invoke("inspect", copy))


def _with_weights(path: Path, edit) -> Path:
    with zipfile.ZipFile(SAMPLE_MODEL) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    weights = path.with_suffix(".h5")
    weights.write_bytes(members["model.weights.h5"])
    with h5py.File(weights, "r+") as handle:
        edit(handle)
    members["model.weights.h5"] = weights.read_bytes()
    weights.unlink()
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    return path


def test_weights_keras_refuses_inside_a_keras_file_are_named(tmp_path):
    """Keras refuses a weight stored as an external link, of the wrong shape, or missing, with
    one aggregate message whose first line names no reason ("... Example error message for
    object <Dense name=fc1, built=True>:"): now the layer and the reason."""
    def external(handle):
        del handle["layers/dense/vars/0"]
        handle["layers/dense/vars/0"] = h5py.ExternalLink("/etc/hostname", "/x")

    def wrong_shape(handle):
        del handle["layers/dense/vars/0"]
        handle["layers/dense/vars/0"] = np.zeros((3, 3), np.float32)

    def missing(handle):
        del handle["layers/dense/vars/1"]

    cases = {external: "Not allowed: H5 file with ExternalLink",
             wrong_shape: "must match. variable.shape=(400, 120), Received: value.shape=(3, 3)",
             missing: "Layer 'fc1' expected 2 variables, but received 1 variables"}
    for edit, reason in cases.items():
        path = _with_weights(tmp_path / f"{edit.__name__}.keras", edit)
        with pytest.raises(ModelLoadError) as caught:
            graphswap.load_model(path)
        message = str(caught.value)
        assert message.startswith(f"cannot load model {path}: the weights of 1 object(s) "
                                  f"(Dense 'fc1') were refused: "), message
        assert reason in message and "re-save the model" in message, message
        assert "Target variable" not in message and len(message) < 700, message
        line = one_error_line(invoke("convert", path, "-o", tmp_path / "out.keras"))
        assert reason in line and not (tmp_path / "out.keras").exists()


def test_a_full_disk_under_the_config_folder_stops_convert_before_it_writes(tmp_path,
                                                                            monkeypatch):
    """`convert --kernel mymul.c` records the file in the trust store; with the config folder's
    disk full that was "unexpected OSError" with exit 1 after the output had been written.  Now
    the store is written first: one line naming the store and what to do, nothing written."""
    config = tmp_path / "config"
    monkeypatch.setenv("GRAPHSWAP_CONFIG_DIR", str(config))
    source = tmp_path / "mymul.c"
    shutil.copyfile(MULTIPLIER_SOURCE, source)
    real_open = os.open

    def full_disk(path, flags, *args, **kwargs):
        inside = os.path.abspath(os.fspath(path)).startswith(str(config) + os.sep)
        if inside and flags & (os.O_WRONLY | os.O_RDWR) and not str(path).endswith(".lock"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", full_disk)
    output = tmp_path / "out.keras"
    line = one_error_line(invoke("convert", SAMPLE_MODEL, "-k", source, "-o", output))
    store = config / "trusted_kernels.json"
    assert line.startswith(f"Error: recording the kernel file {source} in the trust store "
                           f"{store} failed: No space left on device; "), line
    assert "set GRAPHSWAP_CONFIG_DIR to a writable folder" in line
    assert line.endswith("nothing was written"), line
    assert not output.exists()
    monkeypatch.setattr(os, "open", real_open)
    result = invoke("convert", SAMPLE_MODEL, "-k", source, "-o", output)
    assert result.exit_code == 0 and output.is_file(), result.output
    assert f"trusted {source}" in result.output


def _optuna_file(path: Path) -> Path:
    optuna = pytest.importorskip("optuna")
    storage = optuna.storages.RDBStorage(f"sqlite:///{path}")
    optuna.create_study(study_name="graphswap-explore", storage=storage,
                        directions=["minimize", "minimize"])
    storage.engine.dispose()
    return path


def test_a_study_file_carrying_a_trigger_or_a_view_is_refused_untouched(tmp_path):
    """An optuna study file with a trigger (it runs whenever optuna writes the study: here it
    deletes every recorded value) or a view passed the check of table names; refused now, by
    the whole schema (sqlite_master: triggers and views too), the file byte for byte unchanged.
    Optuna's own tables and indexes still pass."""
    honest = _optuna_file(tmp_path / "honest.db")
    check_study_file(honest)
    for kind, sql in (("trigger forget", "CREATE TRIGGER forget AFTER INSERT ON trial_values "
                                         "BEGIN DELETE FROM trial_values; END"),
                      ("view trials_seen", "CREATE VIEW trials_seen AS SELECT * FROM trials"),
                      ("index mine", "CREATE TABLE notes (t TEXT); "
                                     "CREATE INDEX mine ON notes (t)")):
        path = tmp_path / f"{kind.split()[0]}.db"
        shutil.copyfile(honest, path)
        with sqlite3.connect(path) as connection:
            connection.executescript(sql)
        connection.close()
        before = path.read_bytes()
        with pytest.raises(GraphswapError) as caught:
            check_study_file(path)
        message = str(caught.value)
        assert kind in message and "graphswap and optuna never write" in message, message
        assert "Give --study a new file name" in message
        assert path.read_bytes() == before


def test_a_hand_edited_checkpoint_state_is_refused_naming_what_is_wrong(tmp_path):
    """A state.json edited by hand ("history": [] made resume end in "unexpected AttributeError";
    a missing "files" made it skip the model files' hashes): its content is hashed as the model
    files are, and its fields checked; one CheckpointError, one CLI line."""
    model, arrays = dropout_model(), data()
    directory = tmp_path / "ck"
    finetune(model, arrays, checkpoint_dir=directory, **{**SETTINGS, "epochs": 1})
    state_path = directory / "epoch-000001" / "state.json"
    written = json.loads(state_path.read_text())
    np.savez(tmp_path / "d.npz", x=arrays[0], y=arrays[1])
    model.save(tmp_path / "m.keras")
    edits = {"history": [], "best_value": "high", "rng": 5, "fingerprint": [1], "files": {}}
    for key, value in edits.items():
        state_path.write_text(json.dumps({**written, key: value}))
        with pytest.raises(CheckpointError) as caught:
            finetune(model, arrays, checkpoint_dir=directory, resume=True, **SETTINGS)
        assert str(caught.value) == (
            f"checkpoint state {state_path} was edited after graphswap wrote it (its content "
            f"does not match the SHA-256 it records); graphswap resumes only the state it wrote: "
            f"delete {directory} to start over"), key
    assert written["format"] == "graphswap-checkpoint" and len(written["state_sha256"]) == 64
    # a state of the graphswap before the seal (no tag, no SHA-256 of its own): its fields
    unsealed = {k: v for k, v in written.items()
                if k not in ("format", "format_version", "state_sha256")}
    state_path.write_text(json.dumps({**unsealed, "history": []}))
    with pytest.raises(CheckpointError, match=r"was edited after graphswap wrote it \(its "
                                              r"'history' is \[\]; expected an object\)"):
        finetune(model, arrays, checkpoint_dir=directory, resume=True, **SETTINGS)
    line = one_error_line(invoke("finetune", tmp_path / "m.keras", "--data", tmp_path / "d.npz",
                                 "--epochs", "2", "--checkpoint-dir", directory, "--resume",
                                 "-o", tmp_path / "out.keras"))
    assert "'history' is []" in line and not (tmp_path / "out.keras").exists()
    state_path.write_text(json.dumps(unsealed))   # the older state itself still resumes
    assert finetune(model, arrays, checkpoint_dir=directory, resume=True,
                    **SETTINGS).epochs_run == [2]
