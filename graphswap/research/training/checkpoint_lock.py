"""The lock on a fine-tuning checkpoint directory, and the clean-up of what killed runs left there.

`lock_checkpoint_directory` holds an exclusive flock on `DIR/.graphswap.lock` for the whole run:
a second fine-tune on the same directory is refused ("in use by pid N").  The lock file is opened
without following a link (O_NOFOLLOW) and must be a plain file of its own (one link) holding
nothing but a pid: a symbolic link, a FIFO, a device, a folder, a hard link to another file or a
file of the user's under that name is refused, never truncated or written through.

Under the lock, what a killed fine-tune left is removed: only entries named as the checkpoint
code names its own temporaries (`.epoch-N`, `.current`, `.last.keras`, `.best.keras`,
`.state.json` + `.graphswap-tmp-` / `.graphswap-old-` + pid and host tag) whose process is
provably gone (graphswap.io.atomic.left_by_a_dead_process) - never another command's
temporaries or set-aside outputs in the same folder, nor a live process's.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import re
import shutil
import stat
import threading
from pathlib import Path

from graphswap.errors import CheckpointError, OutputPathError
from graphswap.io.atomic import ASIDE_MARK, OWNER, TEMPORARY_MARK, left_by_a_dead_process
from graphswap.research.training.checkpoint_state import (CHECKPOINT_LOCK, CHECKPOINT_STATE, FILES,
                                                          written_by_graphswap)

#: temporaries of the layout before one directory per epoch
OLD_TEMPORARIES = (".last.tmp.keras", ".best.tmp.keras", ".state.json.tmp")
#: what the checkpoint code names its temporaries and set-aside entries
_OWN_LEFTOVER = re.compile(
    r"\.(?:epoch-\d+|current|" + "|".join(re.escape(name) for name in FILES) + ")"
    + "(?:" + re.escape(TEMPORARY_MARK) + "|" + re.escape(ASIDE_MARK) + ")" + OWNER.pattern)
_PID_TEXT = re.compile(rb"\d{0,20}\n?")


class CheckpointLock:
    """An exclusive flock on `directory`/.graphswap.lock, held until `release`."""

    def __init__(self, directory: Path, fd: int):
        self.directory = directory
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


_held = threading.local()


def releases_checkpoint_locks(function):
    """Decorator: the checkpoint locks taken (lock_checkpoint_directory) while `function` runs are
    released when it returns or raises."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        stack = getattr(_held, "stack", None)
        if stack is None:
            stack = _held.stack = []
        stack.append([])
        try:
            return function(*args, **kwargs)
        finally:
            for lock in stack.pop():
                lock.release()

    return wrapper


def _refuse(path: Path, what: str) -> CheckpointError:
    return CheckpointError(
        f"the checkpoint lock {path} is {what}; graphswap's lock is a plain file it creates there "
        f"and writes its pid into, and it never writes through anything else under that name. "
        f"Remove {path} (it is not graphswap's), or choose another --checkpoint-dir")


def _open_lock(path: Path) -> int:
    """The lock file's descriptor: created, or opened without following a link and checked to be
    graphswap's (a plain file of one link holding at most a pid)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    if info is not None and stat.S_ISLNK(info.st_mode):
        raise _refuse(path, f"a symbolic link (to {os.readlink(path)})")
    if info is not None and not stat.S_ISREG(info.st_mode):
        kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                 (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))
        raise _refuse(path, next((name for test, name in kinds if test(info.st_mode)),
                                 "not a plain file"))
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:   # became a link meanwhile
            raise _refuse(path, "a symbolic link") from None
        raise
    opened = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(opened.st_mode):
        problem = "not a plain file"
    elif opened.st_nlink != 1:
        problem = f"a hard link to another file ({opened.st_nlink} names share its content)"
    elif opened.st_size > 32 or not _PID_TEXT.fullmatch(os.pread(fd, 64, 0)):
        problem = "a file holding something other than a pid (not graphswap's)"
    if problem is not None:
        os.close(fd)
        raise _refuse(path, problem)
    return fd


def lock_checkpoint_directory(directory) -> CheckpointLock:
    """Create `directory` if needed, take its lock (CheckpointError "in use by pid N" when another
    process holds it; CheckpointError for a lock file that is not graphswap's) and clean up what a
    killed run left there.  Inside a function decorated with releases_checkpoint_locks the lock is
    released when that function ends."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise OutputPathError(f"checkpoint directory {directory} is a file; choose another "
                              f"--checkpoint-dir")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = _open_lock(directory / CHECKPOINT_LOCK)
    except OSError as exc:
        raise OutputPathError(f"cannot use the checkpoint directory {directory}: "
                              f"{os.strerror(exc.errno) if exc.errno else exc}; choose another "
                              f"--checkpoint-dir") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = ""
        with contextlib.suppress(OSError, ValueError):
            holder = os.pread(fd, 32, 0).decode().strip()
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            who = f"pid {int(holder)}" if holder.isdigit() else "another process"
            raise CheckpointError(
                f"checkpoint directory {directory} is in use by {who} (another fine-tune writing "
                f"its checkpoints); wait for it to finish, or choose another --checkpoint-dir"
            ) from None
        raise OutputPathError(f"cannot lock the checkpoint directory {directory}: "
                              f"{os.strerror(exc.errno) if exc.errno else exc}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    lock = CheckpointLock(directory, fd)
    stack = getattr(_held, "stack", None)
    if stack:
        stack[-1].append(lock)
    clean_leftovers(directory)
    return lock


def clean_leftovers(directory: Path) -> list[str]:
    """Under the lock: remove the checkpoint code's own temporaries and set-aside entries left by
    a process that is provably gone, and the fixed temporaries of the older layout when the
    directory holds that layout's checkpoint; nothing else.  Returns the names removed."""
    removed = []
    names = os.listdir(directory)
    old_layout = any(name in OLD_TEMPORARIES for name in names) and \
        (directory / CHECKPOINT_STATE).is_file() and \
        not (directory / CHECKPOINT_STATE).is_symlink() and \
        written_by_graphswap(directory)[0] is not None
    for name in names:
        match = _OWN_LEFTOVER.match(name)
        dead = match is not None and left_by_a_dead_process(int(match.group(1)), match.group(2))
        if dead or (old_layout and name in OLD_TEMPORARIES):
            path = directory / name
            with contextlib.suppress(OSError):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
                removed.append(name)
    return removed
