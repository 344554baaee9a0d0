"""Files read once: the bytes of a kernel file together with the hash of exactly those bytes.

Everything graphswap compiles or loads from a user's file goes through `read_file`, so the content
that is checked (hash, trust) is the content that is used - never a second read of the path.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import stat

from graphswap.errors import KernelTrustError

#: largest kernel file graphswap reads (a multiplier source or library is kilobytes to megabytes)
MAX_KERNEL_FILE_BYTES = 512 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class FileContent:
    """The bytes of a kernel file, read once, with the hash of exactly those bytes."""

    path: str        # absolute path the bytes were read from
    sha256: str
    data: bytes


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's current content (streamed)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
    """Read `path` once (refusing what is not a regular file, or absurdly large)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise KernelTrustError(f"the {what} {path} is missing") from None
    except OSError:
        raise KernelTrustError(f"the {what} {path} {missing_reason(path)}") from None
    if not stat.S_ISREG(info.st_mode):
        raise KernelTrustError(f"the {what} {path} is not a regular file")
    if info.st_size > MAX_KERNEL_FILE_BYTES:
        raise KernelTrustError(f"the {what} {path} is {info.st_size:,} bytes; graphswap reads "
                               f"kernel files of at most {MAX_KERNEL_FILE_BYTES:,} bytes")
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_KERNEL_FILE_BYTES + 1)
    except OSError as exc:
        raise KernelTrustError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    return FileContent(os.path.abspath(path), sha256_of(data), data)
