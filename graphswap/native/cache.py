"""The per-user cache (owner-only): compiled multipliers, the shipped library built from a source
checkout, and private copies of the native code graphswap loads."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from graphswap.native.files import file_sha256


def cache_dir() -> Path:
    """Per-user cache directory ($GRAPHSWAP_CACHE_DIR, else $XDG_CACHE_HOME/graphswap, else
    ~/.cache/graphswap), created with owner-only permissions: compiled kernels live here."""
    base = os.environ.get("GRAPHSWAP_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "graphswap")
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.stat().st_uid == os.getuid() and path.stat().st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def owner_only_directory(path: Path) -> Path:
    """`path` (inside the cache) created if needed, with owner-only permissions."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
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
    there is reused only if its content still hashes to `sha256`.
    """
    directory = owner_only_directory(owner_only_directory(cache_dir() / "verified") / sha256)
    target = directory / (os.path.basename(name) or "kernel")
    if target.is_file() and file_sha256(target) == sha256:
        return target
    return write_atomically(target, data, mode=0o700)
