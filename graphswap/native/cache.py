"""The per-user cache: compiled multipliers, graphswap's TensorFlow op, the shipped library built
from a source checkout, and private copies of the native code graphswap loads.

Caches are code: what is in them is loaded into the process.  So:

* the cache root ($GRAPHSWAP_CACHE_DIR, else $XDG_CACHE_HOME/graphswap, else ~/.cache/graphswap)
  and every folder below it that graphswap uses must belong to the current user, must not be
  writable by group or others, and must not be a symbolic link; the folders above the root must
  belong to root or the user and not be writable by others - unless they are root's sticky folders
  like /tmp, where nobody can rename another's entry (symbolic links on that part of the path must
  belong to root or the user).  Anything else is refused (`CacheSecurityError`, one line saying
  what is wrong and how to fix it); graphswap never changes the permissions of a folder it finds.
* a compiled artefact is reused only if the SHA-256 of its bytes matches the record graphswap
  wrote when it built it (`records/`, owner-only, keyed by the artefact's place in the cache); a
  file without its record or with another hash is rebuilt, never loaded.  The hash is taken from
  the open descriptor (no symbolic link followed), and the library is loaded through that same
  descriptor (native.files.open_checked).

What this cannot protect against: a process already running as the user can write the records
too (docs/RELIABILITY.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path

from graphswap.errors import CacheSecurityError, KernelTrustError
from graphswap.native.files import CheckedFile, open_checked

CACHE_ENV_VAR = "GRAPHSWAP_CACHE_DIR"
RECORDS = "records"


def configured_cache_root() -> Path:
    """The cache root the environment names (absolute; not created, not checked)."""
    base = os.environ.get(CACHE_ENV_VAR) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "graphswap")
    return Path(os.path.abspath(base))


def _fix_hint() -> str:
    return f"or set {CACHE_ENV_VAR} to a folder of your own (e.g. {CACHE_ENV_VAR}=$(mktemp -d))"


def _refuse(path, problem: str, fix: str) -> CacheSecurityError:
    return CacheSecurityError(
        f"graphswap's cache folder {path} {problem}; graphswap loads compiled code from it, so "
        f"it must be yours alone. {fix}, {_fix_hint()}")


def _check_private(path: Path, root: Path) -> None:
    """`path` (the root or a folder below it): a real folder (no link) of the user's, not
    writable by group or others."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise _refuse(path, f"is a symbolic link (to {os.readlink(path)})",
                      "Replace the link by a real folder")
    if not stat.S_ISDIR(info.st_mode):
        raise _refuse(path, "is not a folder", "Remove it")
    if info.st_uid != os.getuid():
        raise _refuse(path, f"belongs to another user (uid {info.st_uid}; you are uid "
                            f"{os.getuid()})",
                      f"graphswap will not use or chmod a folder it does not own: remove it "
                      f"({'rm -r ' + str(path)}) or have its owner do so")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o022:
        who = " and ".join(w for w, bit in (("group", 0o020), ("others", 0o002)) if mode & bit)
        raise _refuse(path, f"is writable by {who} (permissions {mode:04o})",
                      f"Anyone could have planted code in it: remove it (rm -r {root}) and let "
                      f"graphswap rebuild it, or if you are sure of its content run "
                      f"'chmod 700 {path}'")


def _check_ancestors(root: Path) -> None:
    """The folders above the cache root: each belongs to root or the user and is not writable by
    others, except root-owned sticky folders (/tmp); a symbolic link on the way belongs to root or
    the user, and the folders it leads to pass the same checks."""
    me = os.getuid()
    literal = Path("/")
    for part in root.parent.parts[1:]:
        literal = literal / part
        try:
            info = os.lstat(literal)
        except FileNotFoundError:
            break
        if stat.S_ISLNK(info.st_mode) and info.st_uid not in (0, me):
            raise _refuse(root, f"is reached through the symbolic link {literal}, which belongs "
                                f"to another user (uid {info.st_uid}), who can re-point it",
                          "Use a path without that link")
    real = Path(os.path.realpath(root.parent))
    walked = Path("/")
    for part in (real.parts[1:] or ()):
        walked = walked / part
        try:
            info = os.stat(walked)
        except FileNotFoundError:
            break
        _check_ancestor(walked, info, root, me)
    _check_ancestor(Path("/"), os.stat("/"), root, me)


def _check_ancestor(path: Path, info, root: Path, me: int) -> None:
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid not in (0, me):
        raise _refuse(root, f"lies in {path}, which belongs to another user (uid {info.st_uid}), "
                            f"who can rename or replace it", "Use a folder outside it")
    if mode & 0o022 and not (mode & stat.S_ISVTX and info.st_uid == 0):
        raise _refuse(root, f"lies in {path}, which is writable by others (permissions "
                            f"{mode:04o}, not a root-owned sticky folder like /tmp), so others "
                            f"can replace it", f"Run 'chmod go-w {path}'")


def _make_private(path: Path, root: Path) -> Path:
    """`path` created owner-only (0700) if missing, then checked."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except NotADirectoryError:
        raise _refuse(path, "lies below something that is not a folder", "Remove it") from None
    _check_private(path, root)
    return path


def cache_dir() -> Path:
    """The per-user cache root, created (0700) if missing, after checking it and the folders
    above it (see the module docstring); CacheSecurityError when it is not private."""
    root = configured_cache_root()
    _check_ancestors(root)
    if not os.path.lexists(root):
        try:
            os.makedirs(root.parent, exist_ok=True)
            os.mkdir(root, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise CacheSecurityError(
                f"cannot create graphswap's cache folder {root}: {exc.strerror or exc}; "
                f"{_fix_hint()}") from None
        _check_ancestors(root)
    return _make_private(root, root)


def owner_only_directory(path: Path) -> Path:
    """`path`, a folder inside the cache: it and every folder between it and the cache root are
    created owner-only if missing and checked (CacheSecurityError when one is not private)."""
    root = cache_dir()
    path = Path(os.path.abspath(path))
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        raise CacheSecurityError(f"{path} is not inside graphswap's cache {root}") from None
    current = root
    for part in parts:
        current = _make_private(current / part, root)
    return path


def write_atomically(target: Path, data: bytes, mode: int = 0o600) -> Path:
    """Write `data` to a temporary file beside `target`, then rename it over `target`."""
    fd, tmp_name = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, target)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    return target


def private_copy(data: bytes, sha256: str, name: str) -> Path:
    """An owner-only copy of `data` (whose hash the caller verified) in the per-user cache.

    Native code named by a file is compiled or loaded from this copy, never from the file it was
    read from, so nobody can swap the file between the hash check and the load.  A copy already
    there is reused only if its content still hashes to `sha256` (read through a descriptor that
    follows no link); whoever loads it checks the hash again on the descriptor it loads from
    (native.load_library).
    """
    directory = owner_only_directory(cache_dir() / "verified" / sha256)
    target = directory / (os.path.basename(name) or "kernel")
    try:
        open_checked(target, sha256, owner_only=True).close()
        return target
    except KernelTrustError:
        pass
    return write_atomically(target, data, mode=0o700)


# --------------------------------------------------------------------------------------------
# records of what graphswap built
# --------------------------------------------------------------------------------------------

def _record_path(artefact: Path) -> tuple[Path, str]:
    root = cache_dir()
    relative = Path(os.path.abspath(artefact)).relative_to(root).as_posix()
    key = hashlib.sha256(relative.encode()).hexdigest()[:32]
    return owner_only_directory(root / RECORDS) / f"{key}.json", relative


def record_artefact(artefact: Path) -> CheckedFile:
    """Remember the SHA-256 of an artefact graphswap has just built into the cache (in the
    owner-only records folder); returns it opened and hashed, ready to load through its
    descriptor."""
    checked = open_checked(artefact, owner_only=True, what="compiled library")
    record, relative = _record_path(artefact)
    write_atomically(record, json.dumps({"artefact": relative,
                                         "sha256": checked.sha256}).encode())
    return checked


def recorded_artefact(artefact: Path) -> CheckedFile | None:
    """The cached artefact opened and hashed, if it is the one graphswap built: a regular file of
    the user's whose SHA-256 matches graphswap's record.  None when it is missing, has no record,
    or is anything else (the caller rebuilds it; a `.sha256` file beside it counts for nothing)."""
    record, relative = _record_path(artefact)
    try:
        checked = open_checked(record, owner_only=True, what="cache record")
        try:
            document = json.loads(os.pread(checked.fd, 1 << 16, 0).decode())
        finally:
            checked.close()
        if document.get("artefact") != relative:
            return None
        expected = document["sha256"]
    except (KernelTrustError, ValueError, KeyError, TypeError, AttributeError, OSError):
        return None
    try:
        os.lstat(artefact)
    except OSError:
        return None
    try:
        return open_checked(artefact, expected, owner_only=True, what="compiled library")
    except KernelTrustError:
        return None


def remove_stale(artefact: Path) -> None:
    """Before an artefact is rebuilt: whatever sits at its place (a planted file, a link) is
    replaced by the build's rename; only a folder there cannot be, and is refused."""
    try:
        info = os.lstat(artefact)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        raise _refuse(artefact, "is a folder where graphswap keeps a compiled library",
                      f"Remove it (rm -r {artefact})")
