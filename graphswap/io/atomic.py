"""Atomic moves into place, for every file and directory graphswap writes (graphswap.io.paths's
atomic_output, the fine-tuning checkpoints): unique temporaries beside the destination, flushed to
disk before they are moved; a no-replace rename (renameat2 RENAME_NOREPLACE, else a hard link or an
exclusive mkdir) so that of two writers exactly one wins; a replaced directory set aside and
removed only once the new one is in place.

Temporaries are named `.NAME.graphswap-tmp-<pid>.<host>-<random>` and set-aside outputs
`.NAME.graphswap-old-<pid>.<host>-<random>` (`owner_prefix`; <host>: `host_tag`, eight hex digits
of this machine's boot and pid namespace), so what a killed run left is recognised and cleaned up
by the next run writing the same output - only once that pid is provably gone: the host tag is
this one's (a pid of another machine sharing the folder, or of a boot before, means nothing here)
and no process of that pid runs.  Names without a host tag (graphswap before it) are judged by the
pid alone.  An old output set aside is put back if the new one never arrived.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import hashlib
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

from graphswap.errors import OutputPathError

#: how graphswap's temporaries and set-aside outputs are named: .NAME<mark><pid>-<random>...
TEMPORARY_MARK = ".graphswap-tmp-"
ASIDE_MARK = ".graphswap-old-"
_RANDOM_LENGTH = 8      # tempfile's random part
_PID_ROOM = 10          # digits a pid may take in a temporary's name
_TAG_ROOM = 9           # "." and the host tag
#: after a mark: the pid, the host tag (absent in names of graphswap before it), "-"
OWNER = re.compile(r"(\d+)(?:\.([0-9a-f]{8}))?-")


@functools.lru_cache(maxsize=1)
def host_tag() -> str:
    """Eight hex digits naming this machine's boot and pid namespace (and host name): a pid in a
    temporary's name refers to a process here only when the tag beside it is this one."""
    parts = [socket.gethostname()]
    with contextlib.suppress(OSError):
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            parts.append(handle.read().strip())
    with contextlib.suppress(OSError):
        parts.append(os.readlink("/proc/self/ns/pid"))
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogateescape")).hexdigest()[:8]


def owner_prefix(stem: str, mark: str) -> str:
    """`<stem><mark><pid>.<host tag>-`: the start of a temporary this process owns."""
    return f"{stem}{mark}{os.getpid()}.{host_tag()}-"


def left_by_a_dead_process(pid: int, tag: str | None) -> bool:
    """Whether an entry named with `pid` and host `tag` (None: an older graphswap's name) was left
    by a process that is provably gone: one of this machine and boot, no longer running."""
    return (tag is None or tag == host_tag()) and not _pid_alive(pid)


def name_max(directory) -> int:
    """The longest name (bytes) the file system of `directory` allows."""
    try:
        return int(os.pathconf(directory, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return 255


def _stem_for_temporaries(path: Path, mark: str, suffix: str) -> str:
    """`.NAME` shortened so that `.NAME<mark><pid>.<host>-<random><suffix>` fits the file
    system."""
    room = (name_max(path.parent) - 1 - len(mark) - _PID_ROOM - _TAG_ROOM - 1 - _RANDOM_LENGTH
            - len(os.fsencode(suffix)))
    name = path.name
    while len(os.fsencode(name)) > max(room, 1):
        name = name[:-1]
    return f".{name}"


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _stale(parent: Path, stem: str, mark: str) -> list[Path]:
    """Entries of `parent` named `<stem><mark><pid>[.<host>]-...` left by a process that is
    provably gone (left_by_a_dead_process)."""
    found = []
    pattern = re.compile(re.escape(stem + mark) + OWNER.pattern)
    try:
        names = os.listdir(parent)
    except OSError:
        return found
    for name in names:
        match = pattern.match(name)
        if match and left_by_a_dead_process(int(match.group(1)), match.group(2)):
            found.append(parent / name)
    return found


def clean_stale_temporaries(target) -> list[str]:
    """Remove what killed runs left while writing `target` (links followed): their temporaries,
    and their set-aside old outputs - an old output is put back first when `target` itself is
    missing (the run died between moving the old one aside and the new one in).  Only entries of
    processes provably gone are touched (left_by_a_dead_process).  Returns the names removed or
    restored."""
    target = Path(target)
    done = []
    parent = target.parent
    asides = _stale(parent, _stem_for_temporaries(target, ASIDE_MARK, ""), ASIDE_MARK)
    if asides and not os.path.lexists(target):
        with contextlib.suppress(OSError):
            os.rename(asides[0], target)
            done.append(f"restored {asides[0].name}")
            asides = asides[1:]
    leftovers = asides + [entry for suffix in _temporary_suffixes(target)
                          for entry in _stale(parent, _stem_for_temporaries(
                              target, TEMPORARY_MARK, suffix), TEMPORARY_MARK)]
    for entry in dict.fromkeys(leftovers):
        with contextlib.suppress(OSError):
            remove_entry(entry)
            done.append(f"removed {entry.name}")
    return done


def _temporary_suffixes(target: Path) -> list[str]:
    # the stem is shortened by the suffix's length, so try each suffix a writer may have used
    return sorted({"", target.suffix.lower(), ".png", ".keras", ".h5"})


def make_temporary(path: Path, suffix: str, directory: bool) -> str:
    stem = _stem_for_temporaries(path, TEMPORARY_MARK, suffix)
    prefix = owner_prefix(stem, TEMPORARY_MARK)
    if directory:
        return tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=path.parent)
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=path.parent)
    os.close(fd)
    return name


def oserror_message(exc: OSError) -> str:
    """The system's own words for an OSError (h5py's carry a page of HDF5 detail after them)."""
    if exc.errno:
        return os.strerror(exc.errno)
    return (str(exc.strerror or exc).strip().splitlines() or [type(exc).__name__])[0]


def hdf5_errno(exc: BaseException) -> int | None:
    """The system error number an HDF5 error message carries ("... errno = 27, error message =
    'File too large' ..."), or None."""
    match = re.search(r"errno = (\d+)", str(exc))
    return int(match.group(1)) if match and int(match.group(1)) > 0 else None


def write_failed(path, exc: OSError, what: str = "output") -> OutputPathError:
    """One clear error for an OSError while writing `path`."""
    reason = oserror_message(exc)
    advice = {errno.ENOSPC: "free some space or choose another location",
              errno.EDQUOT: "free some space or choose another location",
              errno.EFBIG: "the file system or a limit refuses a file this large; choose another "
                           "location",
              errno.EROFS: "choose a writable location",
              errno.EACCES: "choose a writable location",
              errno.EXDEV: "the link's target is on another file system; remove the link or "
                           "choose another location"}.get(exc.errno, "choose another location")
    return OutputPathError(f"writing the {what} {path} failed: {reason}; {advice} (-o/--output); "
                           f"nothing was written")


# --- moving into place ---------------------------------------------------------------------------

def remove_entry(name) -> None:
    if os.path.isdir(name) and not os.path.islink(name):
        shutil.rmtree(name, ignore_errors=True)
    elif os.path.lexists(name):
        os.unlink(name)


def fsync_tree(name) -> None:
    """Flush a finished file, or every file of a finished directory and the directory, to disk."""
    name = os.fspath(name)
    if os.path.isdir(name) and not os.path.islink(name):
        for root, _dirs, files in os.walk(name):
            for file in files:
                _fsync_path(os.path.join(root, file))
            _fsync_path(root, directory=True)
    elif os.path.isfile(name):
        _fsync_path(name)


def _fsync_path(name, directory: bool = False) -> None:
    fd = os.open(name, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EBADF):  # directories on some file systems
            raise
    finally:
        os.close(fd)


def fsync_directory(name) -> None:
    """Make the renames in directory `name` durable."""
    with contextlib.suppress(OSError):
        _fsync_path(name, directory=True)


_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_renameat2 = None


def _renameat2_function():
    global _renameat2
    if _renameat2 is None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            function = libc.renameat2
            function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                                 ctypes.c_uint]
            function.restype = ctypes.c_int
            _renameat2 = function
        except (OSError, AttributeError):
            _renameat2 = False
    return _renameat2


def rename_no_replace(source, destination) -> None:
    """Rename `source` to `destination` only if `destination` does not exist, atomically:
    FileExistsError otherwise.  renameat2(RENAME_NOREPLACE); where the system or the file system
    lacks it, a hard link then an unlink (files) or an exclusive mkdir then a rename onto that
    empty directory (directories)."""
    source, destination = os.fspath(source), os.fspath(destination)
    function = _renameat2_function()
    if function:
        if function(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(destination),
                    _RENAME_NOREPLACE) == 0:
            return
        code = ctypes.get_errno()
        if code == errno.EEXIST:
            raise FileExistsError(code, os.strerror(code), destination)
        if code not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise write_failed(destination, OSError(code, os.strerror(code)))
    if os.path.isdir(source) and not os.path.islink(source):
        os.mkdir(destination)          # FileExistsError if anything is there: we did not claim it
        try:
            os.rename(source, destination)
        except OSError:
            with contextlib.suppress(OSError):
                os.rmdir(destination)
            raise
        return
    os.link(source, destination, follow_symlinks=False)
    os.unlink(source)


def publish(tmp_name, target, replace: bool, shown=None) -> None:
    """Move the finished `tmp_name` to `target` (same directory).  Without `replace`, never over
    anything (OutputPathError when `target` appeared meanwhile).  With it, a file replaces a file
    atomically; a directory (or anything replacing one) cannot be renamed over a directory, so
    the old output is first renamed aside and removed only once the new one is in place
    (restored if that fails; put back by the next run if this one is killed in between)."""
    target = Path(target)
    shown = shown if shown is not None else target
    if not replace or not os.path.lexists(target):
        try:
            rename_no_replace(tmp_name, target)
        except FileExistsError:
            raise OutputPathError(
                f"output {shown} was created by another command while this one worked; it is left "
                f"as it is and this result was not written (pass --force to replace it, or choose "
                f"another -o/--output)") from None
        fsync_directory(target.parent)
        return
    if not (os.path.isdir(tmp_name) or os.path.isdir(target)):
        os.replace(tmp_name, target)
        fsync_directory(target.parent)
        return
    stem = _stem_for_temporaries(target, ASIDE_MARK, "")
    aside = tempfile.mkdtemp(prefix=owner_prefix(stem, ASIDE_MARK), dir=target.parent)
    os.rmdir(aside)
    os.rename(target, aside)
    try:
        rename_no_replace(tmp_name, target)
    except OSError:
        os.rename(aside, target)
        raise
    fsync_directory(target.parent)
    remove_entry(aside)
