"""Security and data safety of the trust store's own files.

Each test is the attack, written from the attacker's (or the unlucky user's) side.

* A full disk under the config folder: `graphswap trust add` / `trust remove` end in one `Error:`
  line naming the store, the reason and what to do (not "unexpected OSError"), exit 1, and the
  store as it was (written to a temporary, synced, renamed; a failed write leaves no temporary).
* Links planted in the config folder: a lock file opened following a link would create a dangling
  link's target (a FIFO or folder under its name would give "unexpected ..."), a store read
  through a link would trust another list, and a temporary of a predictable name opened with
  O_TRUNC following a link would truncate and overwrite its target, then rename the link over the
  store.  So the lock and the store are opened with O_NOFOLLOW and must be plain files (one
  `TrustStoreError` naming the path and what it is), the temporary is a fresh name (mkstemp),
  and nothing under a planted name is touched.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import graphswap
from graphswap.cli import main
from graphswap.errors import GraphswapError, KernelTrustError, TrustStoreError
from graphswap.kernels import trust as kernel_trust

MULTIPLIER_SOURCE = Path(__file__).resolve().parent.parent / "sample_models" / "multipliers" / \
    "mul8u_gsot45l.c"


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


def kernel_sources(tmp_path: Path) -> tuple[Path, Path]:
    """Two kernel sources of different content (two hashes)."""
    first, second = tmp_path / "mymul.c", tmp_path / "other.c"
    shutil.copyfile(MULTIPLIER_SOURCE, first)
    second.write_bytes(MULTIPLIER_SOURCE.read_bytes() + b"\n/* another multiplier */\n")
    return first, second


def listing(folder: Path) -> dict:
    """{name: (is a link, bytes or link target)} of a folder, links not followed."""
    seen = {}
    for entry in sorted(os.listdir(folder)):
        path = folder / entry
        if path.is_symlink():
            seen[entry] = ("link", os.readlink(path))
        elif path.is_file():
            seen[entry] = ("file", path.read_bytes())
        else:
            seen[entry] = ("other", None)
    return seen


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------
# a full disk under the config folder
# ---------------------------------------------------------------------------------------------

def test_a_full_disk_under_the_config_folder_is_one_error_line_for_trust_add_and_remove(
        tmp_path, monkeypatch):
    """`graphswap trust add FILE` / `trust remove FILE` with the config folder's disk full: it was
    "unexpected OSError" (exit 1, and a line about GRAPHSWAP_DEBUG).  Now one `Error:` line naming
    the store and the reason, with what to do; the store byte for byte as it was and no temporary
    left beside it - whether the temporary cannot be created, its bytes cannot be synced, or the
    lock file cannot be created in a fresh folder.  Once there is space, both commands work."""
    config = tmp_path / "config"
    monkeypatch.setenv("GRAPHSWAP_CONFIG_DIR", str(config))
    mine, other = kernel_sources(tmp_path)
    assert invoke("trust", "add", mine).exit_code == 0
    store = config / "trusted_kernels.json"
    before = listing(config)
    real_open, real_fsync = os.open, os.fsync

    def full_disk(path, flags, *args, **kwargs):
        inside = os.path.abspath(os.fspath(path)).startswith(str(config) + os.sep)
        if inside and flags & (os.O_WRONLY | os.O_RDWR) and not str(path).endswith(".lock"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    def fsync_full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    for name, patched in (("open", full_disk), ("fsync", fsync_full)):
        monkeypatch.setattr(os, name, patched)
        for command, path in (("add", other), ("remove", mine)):
            line = one_error_line(invoke("trust", command, path))
            assert line.startswith(f"Error: could not write the trust store {store}: No space "
                                   f"left on device; free some space there"), line
            assert "set GRAPHSWAP_CONFIG_DIR to a writable folder" in line, line
            assert line.endswith("The trust store was left as it was"), line
            assert listing(config) == before, (name, command)
        with pytest.raises(TrustStoreError) as caught:
            graphswap.trust(other, persist=True)
        assert isinstance(caught.value, GraphswapError)
        assert caught.value.reason == "No space left on device"
        assert listing(config) == before
        monkeypatch.setattr(os, name, {"open": real_open, "fsync": real_fsync}[name])

    # a fresh config folder on that disk: not even the lock file can be created
    fresh = tmp_path / "fresh"
    monkeypatch.setenv("GRAPHSWAP_CONFIG_DIR", str(fresh))

    def nothing_fits(path, flags, *args, **kwargs):
        if os.path.abspath(os.fspath(path)).startswith(str(fresh) + os.sep) and \
                flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", nothing_fits)
    line = one_error_line(invoke("trust", "add", other))
    assert line.startswith(f"Error: could not write the trust store's lock file "
                           f"{fresh / '.trusted_kernels.json.lock'}: No space left on device"), line
    assert os.listdir(fresh) == []
    monkeypatch.setattr(os, "open", real_open)

    monkeypatch.setenv("GRAPHSWAP_CONFIG_DIR", str(config))
    assert invoke("trust", "add", other).exit_code == 0
    assert invoke("trust", "remove", mine).exit_code == 0
    assert [e["path"] for e in kernel_trust.stored_trust()] == [str(other)]
    assert sorted(os.listdir(config)) == [".trusted_kernels.json.lock", "trusted_kernels.json"]


# ---------------------------------------------------------------------------------------------
# links, FIFOs and folders planted under the store's names
# ---------------------------------------------------------------------------------------------

def _plant(kind: str, where: Path, victim: Path) -> str:
    """Put `kind` at `where`; returns how the error names it."""
    if kind == "link to a file of the user's":
        where.symlink_to(victim)
        return f"a symbolic link (to {victim})"
    if kind == "dangling link":
        where.symlink_to(victim.with_name("created-through-the-link"))
        return f"a symbolic link (to {victim.with_name('created-through-the-link')})"
    if kind == "FIFO":
        os.mkfifo(where)
        return "a FIFO (named pipe)"
    where.mkdir()
    return "a directory"


@pytest.mark.parametrize("kind", ["link to a file of the user's", "dangling link", "FIFO",
                                  "folder"])
def test_a_link_or_fifo_planted_as_the_trust_stores_lock_is_refused_and_left_alone(
        tmp_path, monkeypatch, kind):
    """`.trusted_kernels.json.lock` in the config folder was opened with O_RDWR | O_CREAT following
    a link: a dangling link's target was created, a link to the user's file opened it for
    writing, a FIFO was used, a folder was "unexpected IsADirectoryError".  Now the lock is
    opened with O_NOFOLLOW and must be a plain file: one `Error:` line naming it and what it is
    (CLI `trust add` and `trust remove`, exit 1; TrustStoreError from the API), nothing created,
    truncated or written, the store unchanged."""
    config = tmp_path / "config"
    monkeypatch.setenv("GRAPHSWAP_CONFIG_DIR", str(config))
    mine, other = kernel_sources(tmp_path)
    assert invoke("trust", "add", mine).exit_code == 0
    lock = config / ".trusted_kernels.json.lock"
    lock.unlink()
    victim = tmp_path / "notes.txt"
    victim.write_text("the user's own notes\n")
    os.chmod(victim, 0o600)
    what = _plant(kind, lock, victim)
    before, victim_before = listing(config), victim.stat()
    for command, path in (("add", other), ("remove", mine)):
        line = one_error_line(invoke("trust", command, path))
        assert line.startswith(f"Error: the trust store's lock file {lock} is {what}; "), line
        assert "Remove it and run again" in line, line
    with pytest.raises(TrustStoreError, match="lock file .* is ") as caught:
        graphswap.trust(other, persist=True)
    assert isinstance(caught.value, KernelTrustError) and caught.value.reason is None
    assert listing(config) == before
    assert victim.read_text() == "the user's own notes\n"
    assert victim.stat().st_mtime_ns == victim_before.st_mtime_ns
    assert not victim.with_name("created-through-the-link").exists()
    assert [e["path"] for e in kernel_trust.stored_trust()] == [str(mine)]


def test_the_trust_store_is_neither_read_nor_written_through_a_planted_link(tmp_path,
                                                                            monkeypatch):
    """The store itself was read following a link (a `trusted_kernels.json` linking to a file
    elsewhere trusted what that file lists), and its temporary was `.trusted_kernels.json.PID.tmp`
    opened with O_TRUNC following a link: a link planted under that name had its target (the
    user's file) truncated and overwritten with the store, and was then renamed over the store.
    Now the store is opened with O_NOFOLLOW (a link is refused, naming it: CLI and API), and the
    temporary is a fresh name created with O_EXCL | O_NOFOLLOW: the planted link and its target
    are left alone, the store written is a plain owner-only file."""
    config = tmp_path / "config"
    monkeypatch.setenv("GRAPHSWAP_CONFIG_DIR", str(config))
    mine, other = kernel_sources(tmp_path)
    assert invoke("trust", "add", mine).exit_code == 0
    store = config / "trusted_kernels.json"

    # a predictable temporary name planted as a link to the user's file
    victim = tmp_path / "thesis.tex"
    victim.write_text("\\chapter{Results}\n")
    planted = config / f".trusted_kernels.json.{os.getpid()}.tmp"
    planted.symlink_to(victim)
    assert invoke("trust", "add", other).exit_code == 0
    assert victim.read_text() == "\\chapter{Results}\n"
    assert planted.is_symlink() and os.readlink(planted) == str(victim)
    assert not store.is_symlink() and store.stat().st_mode & 0o777 == 0o600
    assert [e["path"] for e in kernel_trust.stored_trust()] == sorted([str(mine), str(other)])
    assert sorted(os.listdir(config)) == sorted([".trusted_kernels.json.lock", planted.name,
                                                 store.name])

    # the store replaced by a link to a list elsewhere
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"version": 1, "kernels": [
        {"sha256": sha256(other), "path": str(other), "added": ""}]}))
    os.chmod(elsewhere, 0o600)
    store.unlink()
    store.symlink_to(elsewhere)
    kernel_trust.clear_session_trust()
    with pytest.raises(TrustStoreError, match=re.escape(f"file {store} is a symbolic link (to "
                                                        f"{elsewhere})")) as caught:
        kernel_trust.trusted_by(sha256(other), str(other))
    assert caught.value.reason is None
    for args in (("list",), ("add", mine), ("remove", other)):
        line = one_error_line(invoke("trust", *args))
        assert line.startswith(f"Error: the trust store's file {store} is a symbolic link (to "
                               f"{elsewhere}); "), line
    assert store.is_symlink() and json.loads(elsewhere.read_text())["kernels"][0]["path"] == \
        str(other)
