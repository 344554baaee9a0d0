"""Outputs never destroy what graphswap did not write, and output paths are checked.

Written from the attacker's / unlucky user's side: `--force` aimed at a directory holding the input
or other files, two writers racing for one output (made deterministic with a barrier between the
check and the move), output paths that used to fail after the work (or with a misleading
message), a full disk, a link to another file system, and a kill at every step of a save
(fault injection: the output directory is snapshotted at every file-system call the save makes -
exactly what a kill at that instant leaves - and the next run's clean-up is applied to each).
"""

import errno
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import keras
import pytest
from click.testing import CliRunner

from conftest import SAMPLE_MODEL
from graphswap import io as gsio
from graphswap.cli import main
from graphswap.errors import OutputPathError
from graphswap.io import atomic, paths

MARK = atomic.TEMPORARY_MARK


def tiny_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,), name="x"), keras.layers.Dense(2, name="d")])


def error_line(result):
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1, result.output
    assert lines[-1].startswith("Error: ") and "Traceback" not in result.output, result.output
    assert "unexpected" not in result.output, result.output
    return lines[-1]


def fake_saved_model(path: Path, extra=()) -> Path:
    """A directory shaped as graphswap's SavedModel writer leaves it (manifest in assets/)."""
    (path / "assets" / "graphswap").mkdir(parents=True)
    (path / "assets" / "graphswap" / "manifest.json").write_text('{"format": "x"}')
    (path / "saved_model.pb").write_bytes(b"pb")
    (path / "variables").mkdir()
    for name in extra:
        (path / name).write_text("user data")
    return path


def tree(path: Path) -> dict:
    """{relative path: bytes or '<dir>' or '-> link'} of everything under `path`."""
    found = {}
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            full = Path(root) / name
            key = str(full.relative_to(path))
            if full.is_symlink():
                found[key] = f"-> {os.readlink(full)}"
            elif full.is_dir():
                found[key] = "<dir>"
            else:
                found[key] = full.read_bytes()
    return found


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# --- --force never destroys a directory graphswap did not write ------------------------------------

def test_force_never_replaces_a_directory_holding_the_input_or_foreign_files(tmp_path):
    """`convert proj/model.keras -o proj/ --force` used to delete proj/ with the input in it."""
    project = tmp_path / "proj"
    project.mkdir()
    shutil.copy(SAMPLE_MODEL, project / "model.keras")
    (project / "notes.txt").write_text("my notes")
    before = tree(project)
    runner = CliRunner()
    for output in (f"{project}/", str(project)):
        line = error_line(runner.invoke(main, ["convert", str(project / "model.keras"), "-o",
                                               output, "--force"]))
        assert "holding the input" in line and "--force never replaces" in line, line
    other = tmp_path / "other"
    other.mkdir()
    (other / "data.csv").write_text("1,2")
    line = error_line(runner.invoke(main, ["convert", str(project / "model.keras"), "-o",
                                           f"{other}/", "--force"]))
    assert "a directory graphswap did not write (it holds data.csv)" in line, line
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(OutputPathError, match="graphswap did not write .an empty directory"):
        gsio.check_model_output_path(f"{empty}/", force=True)
    # a graphswap SavedModel with the user's file put in it: --force will not delete that file
    served = fake_saved_model(tmp_path / "served", extra=["README.md"])
    with pytest.raises(OutputPathError, match="also holds README.md, which graphswap did not"):
        gsio.check_model_output_path(served, force=True)
    # a SavedModel directory holding the input (the input itself, or a file in it)
    clean = fake_saved_model(tmp_path / "clean")
    with pytest.raises(OutputPathError, match="holding the input"):
        gsio.check_model_output_path(clean, force=True, inputs=[clean / "saved_model.pb"])
    # a file output (.onnx, .json) never replaces a SavedModel directory
    with pytest.raises(OutputPathError, match="and this output is a file"):
        paths.check_output_path(clean, force=True, directory=False)
    with pytest.raises(OutputPathError, match="and this output is a file"):
        with paths.atomic_output(clean, force=True) as tmp:   # e.g. an ONNX export aimed at it
            tmp.write_bytes(b"onnx")
    # a link to a foreign directory is judged by what it points at
    (tmp_path / "link_sm").symlink_to(other)
    with pytest.raises(OutputPathError, match="a link to .*graphswap did not write"):
        gsio.check_model_output_path(tmp_path / "link_sm", force=True)
    assert tree(project) == before   # nothing of it was touched
    assert (project / "model.keras").read_bytes() == SAMPLE_MODEL.read_bytes()
    assert (other / "data.csv").read_text() == "1,2" and (served / "README.md").is_file()
    assert sorted(os.listdir(tmp_path)) == ["clean", "empty", "link_sm", "other", "proj", "served"]
    # what --force is for still works: a file, and a graphswap SavedModel directory
    (tmp_path / "old.keras").write_bytes(b"old")
    gsio.save_model(tiny_model(), tmp_path / "old.keras", force=True)
    assert keras.models.load_model(tmp_path / "old.keras").name


# --- two writers without --force: exactly one wins -------------------------------------------------

def _race(target: Path, directory: bool):
    """Two threads write `target` without --force; both pass the existence check before either
    moves its result into place (a barrier between check and move)."""
    barrier = threading.Barrier(2)
    outcome = {}

    def writer(tag):
        try:
            with paths.atomic_output(target, suffix="" if directory else None) as tmp:
                if directory:
                    fake_saved_model(tmp)
                    (tmp / "assets" / "who").write_text(tag)
                else:
                    tmp.write_text(tag)
                barrier.wait(timeout=30)
            outcome[tag] = "wrote"
        except OutputPathError as exc:
            outcome[tag] = str(exc)

    threads = [threading.Thread(target=writer, args=(tag,)) for tag in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return outcome


@pytest.mark.parametrize("directory", [False, True], ids=["file", "directory"])
@pytest.mark.parametrize("noreplace", ["renameat2", "link-or-mkdir"])
def test_two_writers_without_force_exactly_one_wins(tmp_path, monkeypatch, directory, noreplace):
    if noreplace == "link-or-mkdir":   # systems / file systems without RENAME_NOREPLACE
        monkeypatch.setattr(atomic, "_renameat2", False)
    target = tmp_path / ("out_savedmodel" if directory else "out.json")
    outcome = _race(target, directory)
    assert sorted(outcome) == ["a", "b"]
    winners = [tag for tag, what in outcome.items() if what == "wrote"]
    assert len(winners) == 1, outcome
    loser = ({"a", "b"} - set(winners)).pop()
    assert "was created by another command while this one worked" in outcome[loser]
    assert "left as it is" in outcome[loser]
    written = (target / "assets" / "who") if directory else target
    assert written.read_text() == winners[0]   # the winner's result, whole, not replaced
    assert sorted(os.listdir(tmp_path)) == [target.name]  # no temporary left by either


def test_a_convert_racing_another_writer_never_replaces_its_output(tmp_path, monkeypatch):
    """The second of two `convert`s: its output appears while it works - it refuses, and the
    first one's file is intact (it used to be silently replaced, both exiting 0)."""
    target = tmp_path / "out.keras"
    real_save = keras.Model.save

    def save_then_other_writer(self, filepath, *args, **kwargs):
        real_save(self, filepath, *args, **kwargs)
        target.write_bytes(b"the other command's model")

    monkeypatch.setattr(keras.Model, "save", save_then_other_writer)
    with pytest.raises(OutputPathError, match="created by another command"):
        gsio.save_model(tiny_model(), target)
    assert target.read_bytes() == b"the other command's model"
    assert os.listdir(tmp_path) == ["out.keras"]


# --- output paths checked before any work, with clear errors ---------------------------------------

def test_output_paths_are_checked_before_any_work(tmp_path):
    """Each bad -o is refused before MODEL is even opened (MODEL does not exist here: a check
    after loading would say so instead), by convert, finetune, export, evaluate, sweep and
    explore alike."""
    missing_model = str(tmp_path / "nothing.keras")
    (tmp_path / "afile").write_text("x")
    long_name = "m" * 300 + ".keras"
    cases = {
        str(tmp_path / "X.H5"): "only by the lower-case ending .h5",
        str(tmp_path / "Y.KERAS"): "write " + str(tmp_path / "Y.keras"),
        str(tmp_path / long_name): "name is too long (File name too long): 306 bytes",
        str(tmp_path / "missing" / ".." / "x.keras"): "missing does not exist (a path is followed "
                                                     "as written, '..' included)",
        str(tmp_path / "afile" / "x.keras"): "afile is a file, not a directory",
        str(tmp_path / "model.kera"): "must end in .keras or .h5",
    }
    runner = CliRunner()
    for output, expected in cases.items():
        for command in (["convert", missing_model], ["finetune", missing_model, "--data", "d.npz"]):
            line = error_line(runner.invoke(main, [*command, "-o", output]))
            assert expected in line, (command, output, line)
            assert "not writable" not in line and "not found" not in line
    line = error_line(runner.invoke(main, ["export", missing_model, "-o",
                                           str(tmp_path / long_name.replace(".keras", ".onnx"))]))
    assert "name is too long" in line, line
    long_json = str(tmp_path / long_name.replace(".keras", ".json"))
    dotted_json = str(tmp_path / "missing" / ".." / "r.json")
    for command in (["evaluate"], ["sweep", "-k", "exact"], ["explore", "--library", "x.c"]):
        for output, expected in ((long_json, "name is too long"),
                                 (dotted_json, "missing does not exist")):
            line = error_line(runner.invoke(main, [*command, missing_model, "--data", "d.npz",
                                                   "-o", output]))
            assert expected in line, (command, line)
    assert sorted(os.listdir(tmp_path)) == ["afile"]


def test_a_directory_output_with_dots_and_a_trailing_slash(tmp_path):
    """`-o out/kws.ft_savedmodel/` is a directory (the slash says so): checked, then written, by
    the API as by the CLI (it used to be refused after the work)."""
    out = tmp_path / "out"
    out.mkdir()
    checked = gsio.check_model_output_path(f"{out}/kws.ft_savedmodel/")
    assert gsio.model_output_format(checked) == "savedmodel"
    model = tiny_model()
    gsio.save_model(model, checked, check_batch=1)
    assert (out / "kws.ft_savedmodel" / "saved_model.pb").is_file()
    assert (out / "kws.ft_savedmodel" / "assets" / "graphswap" / "manifest.json").is_file()
    with pytest.raises(OutputPathError, match="already exists; pass --force"):
        gsio.check_model_output_path(f"{out}/kws.ft_savedmodel/")
    # without the slash a dotted name is a typo'd file name, not a directory
    with pytest.raises(OutputPathError, match="kws.v2/ writes a directory of that name"):
        gsio.check_model_output_path(f"{out}/kws.v2")
    assert sorted(os.listdir(out)) == ["kws.ft_savedmodel"]


def test_a_link_to_another_file_system_is_written_through(tmp_path):
    """A (dangling) link whose target is on another file system (/dev/shm): the temporary is made
    beside the target, so no rename crosses file systems (EXDEV); a link into a missing
    directory is refused before the work; without --force a link is an existing output."""
    other = Path("/dev/shm")
    assert os.stat(other).st_dev != os.stat(tmp_path).st_dev, "needs two file systems"
    remote = Path(tempfile.mkdtemp(dir=other))
    try:
        link = tmp_path / "out.keras"
        link.symlink_to(remote / "model.keras")
        with pytest.raises(OutputPathError, match="already exists; pass --force"):
            gsio.check_model_output_path(link)
        gsio.save_model(tiny_model(), link, force=True)
        assert link.is_symlink() and keras.models.load_model(link).name
        assert os.listdir(remote) == ["model.keras"]
        broken = tmp_path / "broken.keras"
        broken.symlink_to(remote / "gone" / "model.keras")
        with pytest.raises(OutputPathError, match="whose directory .*gone does not exist"):
            gsio.check_model_output_path(broken, force=True)
        # an EXDEV from below (a rename across file systems) is one clear line
        message = str(atomic.write_failed(link, OSError(errno.EXDEV, "Invalid cross-device")))
        assert "on another file system" in message and "nothing was written" in message
    finally:
        shutil.rmtree(remote)


@pytest.mark.parametrize("suffix", [".h5", ".keras"])
def test_a_full_disk_is_one_clear_line_and_leaves_nothing(tmp_path, monkeypatch, suffix):
    """h5py reports a full disk as OSError(28, "Can't close file (file write failed: time = ...,
    errno = 28, ...)"): said as the system's words, the old output intact, no 0-byte or partial
    temporary left."""
    target = tmp_path / f"out{suffix}"
    target.write_bytes(b"previous version")

    def full_disk(self, filepath, *args, **kwargs):
        Path(filepath).write_bytes(b"\x89HDF partial")
        raise OSError(errno.ENOSPC, "Can't close file (file write failed: time = Thu Dec  3\n, "
                                    "filename = 'x', errno = 28, error message = 'No space left "
                                    "on device', buf = 0x55904d320690, total write size = 2048)")

    monkeypatch.setattr(keras.Model, "save", full_disk)
    with pytest.raises(OutputPathError) as caught:
        gsio.save_model(tiny_model(), target, force=True)
    message = str(caught.value)
    assert message == (f"writing the output {target} failed: No space left on device; free some "
                       f"space or choose another location (-o/--output); nothing was written")
    assert target.read_bytes() == b"previous version"
    assert os.listdir(tmp_path) == [target.name]


def test_a_real_size_limit_during_an_h5_save_leaves_nothing(tmp_path):
    """A real write failure inside HDF5's C library (a file-size limit: EFBIG, as ENOSPC reaches
    it) in a fresh process: one clear line, nothing behind."""
    code = f"""
    import resource, signal, keras
    from graphswap import io as gsio
    from graphswap.errors import OutputPathError
    model = keras.Sequential([keras.Input((200,)), keras.layers.Dense(400)])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))
    try:
        gsio.save_model(model, {str(tmp_path / 'big.h5')!r})
    except OutputPathError as exc:
        print("ERROR", exc)
    """
    from conftest import run_python

    completed = run_python(code, timeout=300)
    assert "ERROR writing the output" in completed.stdout, completed.stdout + completed.stderr
    assert "File too large" in completed.stdout and "Can't" not in completed.stdout
    assert os.listdir(tmp_path) == []


# --- what a killed run left ------------------------------------------------------------------------

def test_temporaries_of_a_killed_run_are_removed_by_the_next_run(tmp_path):
    target = tmp_path / "out.keras"
    gone, alive = dead_pid(), os.getpid()
    stale = [tmp_path / f".out.keras{MARK}{gone}-abcd1234.keras",
             tmp_path / f".out.keras{MARK}{gone}-efgh5678"]
    stale[0].write_bytes(b"")                 # the 0-byte temporary of a run killed early
    stale[1].mkdir()
    (stale[1] / "saved_model.pb").write_bytes(b"partial")
    running = tmp_path / f".out.keras{MARK}{alive}-ijkl9012.keras"   # a live writer's: kept
    running.write_bytes(b"being written")
    unrelated = tmp_path / ".out.keras.mine"
    unrelated.write_bytes(b"not graphswap's")
    gsio.save_model(tiny_model(), target)
    assert sorted(os.listdir(tmp_path)) == sorted([target.name, running.name, unrelated.name])
    # a killed --force over a directory: the old output set aside, the new one never arrived
    served = tmp_path / "served"
    aside = fake_saved_model(tmp_path / f".served{atomic.ASIDE_MARK}{gone}-zzzz0000")
    (aside / "assets" / "who").write_text("old")
    with pytest.raises(OutputPathError, match="already exists"):
        paths.check_output_path(served)
    assert (served / "assets" / "who").read_text() == "old" and not aside.exists()


SAVE_CALLS = ("rename", "replace", "link", "unlink", "mkdir", "rmdir", "symlink", "fsync")


def snapshots_of_every_step(monkeypatch, watched: Path, action) -> list[dict]:
    """Run `action`, snapshotting `watched` before every file-system call of SAVE_CALLS and
    shutil.rmtree (and at the end): each snapshot is what a kill at that instant leaves."""
    taken = []
    for name in SAVE_CALLS:
        original = getattr(os, name)

        def wrapper(*args, _original=original, **kwargs):
            taken.append(tree(watched))
            return _original(*args, **kwargs)

        monkeypatch.setattr(os, name, wrapper)
    real_rmtree = shutil.rmtree

    def rmtree(*args, **kwargs):
        taken.append(tree(watched))
        return real_rmtree(*args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", rmtree)
    action()
    monkeypatch.undo()
    taken.append(tree(watched))
    unique = []
    for snapshot in taken:
        if snapshot not in unique:
            unique.append(snapshot)
    return unique


def restore(snapshot: dict, where: Path) -> None:
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir()
    for key, value in sorted(snapshot.items()):
        path = where / key
        if value == "<dir>":
            path.mkdir(exist_ok=True)
        elif isinstance(value, str):
            path.symlink_to(value[3:])
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(value)


@pytest.mark.parametrize("case", ["new file", "file --force", "directory --force"])
def test_a_kill_at_any_step_of_a_save_leaves_the_old_or_the_new_output(tmp_path, monkeypatch,
                                                                       case):
    """Fault injection at every rename, link, unlink, mkdir, fsync... of a save: after a kill
    there, and the next run's clean-up, the output is the old one or the new one, whole - never
    missing (when there was one), never mixed - and no temporary is left."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "keep.txt").write_text("the user's")
    directory = case.startswith("directory")
    target = work / ("out_savedmodel" if directory else "out.json")
    if directory:
        fake_saved_model(target)
        (target / "assets" / "who").write_text("old")
        old = tree(target)
    elif case == "file --force":
        target.write_text("old")
    force = case != "new file"

    def save():
        with paths.atomic_output(target, force, suffix="" if directory else None) as tmp:
            if directory:
                fake_saved_model(tmp)
                (tmp / "assets" / "who").write_text("new")
            else:
                tmp.write_text("new")

    states = snapshots_of_every_step(monkeypatch, work, save)
    assert len(states) >= 4, states
    replica = tmp_path / "replica"
    monkeypatch.setattr(atomic, "_pid_alive", lambda pid: False)   # the killed run is gone
    outcomes = set()
    for state in states:
        restore(state, replica)
        atomic.clean_stale_temporaries(replica / target.name)
        left = sorted(os.listdir(replica))
        if directory:
            assert left == ["keep.txt", target.name], (state, left)
            got = tree(replica / target.name)
            assert got == old or got == {**old, "assets/who": b"new"}, got
            outcomes.add((replica / target.name / "assets" / "who").read_text())
        elif case == "new file" and left == ["keep.txt"]:
            outcomes.add(None)
        else:
            assert left == ["keep.txt", target.name], (state, left)
            outcomes.add((replica / target.name).read_text())
    assert "new" in outcomes and len(outcomes) == 2, outcomes
