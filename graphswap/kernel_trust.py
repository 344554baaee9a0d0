"""Which native code a saved model may make graphswap load.

A `.keras` file produced by graphswap names the kernel libraries (or multiplier sources) its layers
use, with their SHA-256.  Loading such a model must not run native code the user has not approved:
  - graphswap's built-in kernels load freely;
  - a kernel the user names themselves (a spec string passed to the API or the CLI) is trusted for
    the session, with the hash it had then;
  - any other library/source loads only if it is trusted - `graphswap.trust(path)`, the
    environment variable GRAPHSWAP_TRUSTED_KERNELS (entries separated by os.pathsep, each a file
    path or a SHA-256 hex digest), or the CLI's `--trust-kernel PATH` - AND its current hash equals
    the one recorded in the model.
Multiplier tables (.lut/.bin) are data, not code: they need no trust, but their hash is checked.
"""

from __future__ import annotations

import os
import re
import threading

from graphswap.errors import KernelTrustError

ENV_VAR = "GRAPHSWAP_TRUSTED_KERNELS"
_HEX = re.compile(r"^[0-9a-f]{64}$")

_trusted: set[tuple[str, str]] = set()   # (realpath, sha256)
_lock = threading.Lock()


def _sha256(path: str) -> str:
    from graphswap.native import file_sha256

    return file_sha256(path)


def trust(path: str | os.PathLike) -> str:
    """Trust the library/source at `path` with its current content, for this process.

    Returns its SHA-256.  A later change of the file revokes the trust (the hash no longer matches).
    """
    real = os.path.realpath(path)
    if not os.path.isfile(real):
        raise KernelTrustError(f"cannot trust {path}: no such file")
    digest = _sha256(real)
    with _lock:
        _trusted.add((real, digest))
    return digest


def _env_entries() -> list[str]:
    return [entry.strip() for entry in os.environ.get(ENV_VAR, "").split(os.pathsep)
            if entry.strip()]


def is_trusted(path: str, sha256: str) -> bool:
    """True if (path, sha256) is trusted by trust(), the environment variable, or by hash."""
    real = os.path.realpath(path)
    with _lock:
        if (real, sha256) in _trusted:
            return True
    for entry in _env_entries():
        if _HEX.match(entry.lower()):
            if entry.lower() == sha256:
                return True
        elif os.path.realpath(os.path.expanduser(entry)) == real:
            return True
    return False


def verify_recorded_file(path: str | None, recorded_sha256: str | None, what: str,
                         executable: bool = True) -> None:
    """Check a file a saved model names before anything loads it.

    Raises KernelTrustError naming the file, its hash and how to trust it, when the file is
    missing, changed since it was recorded, or (for native code) not trusted.
    """
    if not path:
        raise KernelTrustError(f"the model names a {what} without a path; re-convert the model")
    if not os.path.isfile(path):
        raise KernelTrustError(
            f"the model's {what} {path} is missing; put the file back at that path or re-convert "
            f"the model with its new location")
    actual = _sha256(path)
    if recorded_sha256 and actual != recorded_sha256:
        raise KernelTrustError(
            f"the model's {what} {path} has changed since the model was saved: recorded sha256 "
            f"{recorded_sha256}, file now has {actual}. Restore the original file, or re-convert "
            f"the model with the new one")
    if not recorded_sha256:
        raise KernelTrustError(
            f"the model names the {what} {path} without a recorded sha256; re-convert the model")
    if executable and not is_trusted(path, actual):
        raise KernelTrustError(
            f"refusing to load the {what} {path} (sha256 {actual}) named by the model: it is not "
            f"trusted. If you trust it, call graphswap.trust('{path}') before loading, add the path "
            f"or its sha256 to ${ENV_VAR}, or pass --trust-kernel {path} on the command line")
