"""Files read once: the bytes of a kernel file together with the hash of exactly those bytes.

Everything graphswap compiles or loads from a user's file goes through `read_file`, so the content
that is checked (hash, trust) is the content that is used - never a second read of the path.  The
file is opened once; what is checked (regular file, size, device and inode) is the `fstat` of that
open descriptor, and the bytes hashed are the bytes read from it, so a path that is re-pointed
(a symbolic link flipped) after the read changes nothing that was decided.

`open_checked` is the same idea for native code graphswap loads from its cache: the descriptor is
opened without following a symbolic link, its bytes are hashed, and the library is then loaded
through that descriptor (`/proc/self/fd/N`), never through the path again.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import stat
import threading

from graphswap.errors import KernelTrustError

#: largest kernel file graphswap reads (a multiplier source or library is kilobytes to megabytes)
MAX_KERNEL_FILE_BYTES = 512 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class FileContent:
    """The bytes of a kernel file, read once, with the hash of exactly those bytes."""

    path: str        # absolute path the bytes were read from
    sha256: str
    data: bytes
    #: (st_dev, st_ino) of the open file the bytes were read from (None: not read from a file)
    identity: tuple[int, int] | None = None


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _hash_descriptor(fd: int) -> str:
    digest = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    for block in iter(lambda: os.read(fd, 1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's current content (streamed)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _hash_descriptor(fd)
    finally:
        os.close(fd)


def missing_reason(path) -> str:
    """Why `path` cannot be opened, for "not found" messages: a symbolic link loop and a link to
    nothing are said as such (os.path.exists() is False for both)."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "is a symbolic link loop (it points, through links, back to itself)"
        if os.path.islink(path):
            return f"is a broken symbolic link (to {os.readlink(path)}, which does not exist)"
        if exc.errno == errno.ENOENT:
            return "does not exist"
        return f"cannot be read ({exc.strerror or exc})"
    return "exists"


def read_file(path: str, what: str) -> FileContent:
    """Read `path` once (refusing what is not a regular file, or absurdly large).

    The checks are made on the open descriptor (fstat), the hash on the bytes read from it, and
    the result carries the descriptor's (device, inode): whoever decides on a path's identity
    afterwards (trust by path) compares it with these, never with the path resolved again."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise KernelTrustError(f"the {what} {path} is missing") from None
    except OSError as exc:
        if exc.errno == errno.EISDIR:
            raise KernelTrustError(f"the {what} {path} is not a regular file") from None
        raise KernelTrustError(f"the {what} {path} {missing_reason(path)}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise KernelTrustError(f"the {what} {path} is not a regular file")
        if info.st_size > MAX_KERNEL_FILE_BYTES:
            raise KernelTrustError(f"the {what} {path} is {info.st_size:,} bytes; graphswap reads "
                                   f"kernel files of at most {MAX_KERNEL_FILE_BYTES:,} bytes")
        chunks, size = [], 0
        while size <= MAX_KERNEL_FILE_BYTES:
            chunk = os.read(fd, min(1 << 20, MAX_KERNEL_FILE_BYTES + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        raise KernelTrustError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    return FileContent(os.path.abspath(path), sha256_of(data), data,
                       (info.st_dev, info.st_ino))


# --------------------------------------------------------------------------------------------
# native code loaded through the descriptor that was hashed
# --------------------------------------------------------------------------------------------

#: descriptors of libraries loaded through /proc/self/fd/N, kept open for the process: the dynamic
#: loader knows a loaded object by that name, so the number must never be reused for another file
_pinned: list[int] = []
_pinned_lock = threading.Lock()


@dataclasses.dataclass
class CheckedFile:
    """A file opened once (no symbolic link followed), with the SHA-256 of its bytes as read from
    that descriptor; `load_path` names the descriptor, for dlopen."""

    path: str
    sha256: str
    fd: int

    @property
    def load_path(self) -> str:
        """What to hand to dlopen: the descriptor itself where /proc is mounted, else the path."""
        proc = f"/proc/self/fd/{self.fd}"
        return proc if os.path.exists(proc) else self.path

    def keep_open(self) -> None:
        """Keep the descriptor for the process (call once the library was loaded through it)."""
        with _pinned_lock:
            _pinned.append(self.fd)

    def close(self) -> None:
        os.close(self.fd)


def open_checked(path: str | os.PathLike, sha256: str | None = None,
                 owner_only: bool = False, what: str = "library") -> CheckedFile:
    """Open `path` without following a symbolic link, check what was opened (a regular file; with
    `owner_only`, one the current user owns that nobody else may write), hash its bytes through
    the descriptor and, when `sha256` is given, require that hash (KernelTrustError otherwise)."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise KernelTrustError(f"the {what} {path} is a symbolic link; graphswap loads native "
                                   f"code only from the file itself") from None
        raise KernelTrustError(f"cannot open the {what} {path}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise KernelTrustError(f"the {what} {path} is not a regular file")
        if owner_only and (info.st_uid != os.getuid() or info.st_mode & 0o022):
            raise KernelTrustError(
                f"the {what} {path} belongs to uid {info.st_uid} with permissions "
                f"{stat.S_IMODE(info.st_mode):04o}; graphswap loads code from its cache only when "
                f"you own it and nobody else may write it. Remove it and run again")
        digest = _hash_descriptor(fd)
        if sha256 is not None and digest != sha256:
            raise KernelTrustError(
                f"the {what} {path} has SHA-256 {digest}, not the {sha256} graphswap checked; "
                f"nothing was loaded. Run the command again")
    except BaseException:
        os.close(fd)
        raise
    return CheckedFile(path, digest, fd)
