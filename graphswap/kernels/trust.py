"""Which native code graphswap may run, and the one gate that every file-named kernel passes.

Two kinds of origin:

* **Named by the user** - a spec string given to the API (`rewrite_model(kernel="mymul.c")`) or on
  the command line (`--kernel mymul.c`).  Naming a file is approving it: the API trusts it for the
  session, the CLI also records it in the trust store (see below).
* **Named by a file** - a saved model's layer config, a kernel map, a kept-kernel ONNX node, a
  fine-tuning checkpoint.  A file never adds trust.  What it names must be a built-in (a closed
  list of names) or a complete record ``{"spec", "path", "sha256"}`` whose spec refers to exactly
  that (absolute, normalised) path.  `admit_recorded_file` checks the record, reads the file once,
  hashes what it read, compares the hash with the record and - for native code - with the trust
  sources, all **before** anything is compiled or loaded; what is then compiled or loaded is a
  private, owner-only copy of exactly the bytes that were hashed (`native.private_copy`), so the
  file cannot be swapped between the check and the load.

Trust sources (any one suffices; trust is always of a content hash, so editing a file revokes it):

* the session: `trust(path)`, `--trust-kernel PATH`, and every kernel the user names;
* the per-user trust store, `trust(path, persist=True)` / `graphswap trust add FILE`: a JSON file
  in the user's config directory ($GRAPHSWAP_CONFIG_DIR, else $XDG_CONFIG_HOME/graphswap, else
  ~/.config/graphswap), owner-only, keyed by SHA-256 and recording the path (like Jupyter's
  notebook signatures or `direnv allow`);
* the environment variable GRAPHSWAP_TRUSTED_KERNELS: entries separated by os.pathsep, each a
  SHA-256 hex digest or an absolute file path (a path trusts whatever that path holds: the file
  that was read must be the file the path names - same device and inode, compared on the
  descriptor that was read, never by resolving the recorded path again).  A relative entry is
  refused: it would name another file in every folder a command runs in.

Trust is of a file's own bytes, so a kernel must not read other files that could change without
changing them: a C source is compiled and run in a sandbox that lets it read nothing but its own
bytes and the system's files (graphswap.native.sandbox), and a library must pass the allowlist of
graphswap.native.elf_policy, needing only root's system libraries; `trust` refuses a source
including another header, or a library failing the allowlist, at once.

Multiplier tables (.lut/.bin) are data, not code: they need no trust, but they pass the same
record checks and their hash must match.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import re
import stat
import tempfile
import threading
from pathlib import Path

from graphswap.errors import KernelTrustError, TrustStoreError
from graphswap.multipliers.c_tables import check_headers
from graphswap.native.dependencies import check_library_dependencies
from graphswap.native.files import FileContent, read_file

ENV_VAR = "GRAPHSWAP_TRUSTED_KERNELS"
CONFIG_ENV_VAR = "GRAPHSWAP_CONFIG_DIR"
STORE_NAME = "trusted_kernels.json"
STORE_VERSION = 1
_HEX = re.compile(r"^[0-9a-f]{64}$")
_LIBRARY = re.compile(r"\.(?:so|dylib)(?:\.\d+)*$")
_FILE_TYPES = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
               (stat.S_ISDIR, "a directory"))

_session: dict[str, str] = {}   # sha256 -> path it was trusted under
_lock = threading.Lock()


# --------------------------------------------------------------------------------------------
# the trust store
# --------------------------------------------------------------------------------------------

def config_dir() -> Path:
    """The user's graphswap configuration directory (not created here); KernelTrustError when
    $GRAPHSWAP_CONFIG_DIR names something that is not a folder (a file)."""
    if os.environ.get(CONFIG_ENV_VAR):
        path = Path(os.environ[CONFIG_ENV_VAR])
        if os.path.lexists(path) and not path.is_dir():
            raise KernelTrustError(
                f"{CONFIG_ENV_VAR}={path} names a file, not a folder; graphswap keeps its trust "
                f"store ({STORE_NAME}) in that folder. Point {CONFIG_ENV_VAR} at a folder (it is "
                f"created if missing), or unset it to use ~/.config/graphswap")
        return path
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    path = Path(base) / "graphswap"
    if os.path.lexists(path) and not path.is_dir():
        raise KernelTrustError(
            f"graphswap's configuration folder {path} is a file, not a folder; it keeps the trust "
            f"store ({STORE_NAME}) there. Move the file away, or set {CONFIG_ENV_VAR} to a folder")
    return path


def store_path() -> Path:
    return config_dir() / STORE_NAME


def _check_private(path: Path, what: str, info: os.stat_result | None = None) -> None:
    """Refuse a store (or its directory) that another user owns or could write."""
    info = path.stat() if info is None else info
    if info.st_uid != os.getuid():
        raise KernelTrustError(
            f"the trust store {what} {path} belongs to another user (uid {info.st_uid}); "
            f"graphswap only reads a trust store you own. Remove it, or point "
            f"${CONFIG_ENV_VAR} at a directory of yours")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        fix = "700" if stat.S_ISDIR(info.st_mode) else "600"
        raise KernelTrustError(
            f"the trust store {what} {path} has permissions {mode:04o}; it must be owner-only "
            f"(others could add trust to it). Fix it with: chmod {fix} {path}")


def _not_plain(path: Path, what: str, kind: str) -> TrustStoreError:
    return TrustStoreError(
        f"the trust store's {what} {path} is {kind}; graphswap uses only a plain file it made "
        f"there, never reading or writing through anything else. Remove it and run again")


def _open_plain(path: Path, what: str, flags: int) -> int | None:
    """`path` opened without following a link (None when it does not exist and `flags` do not
    create it); TrustStoreError for a symbolic link, a FIFO, a folder, anything but a plain file."""
    info = None
    with contextlib.suppress(FileNotFoundError):
        info = os.lstat(path)
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise _not_plain(path, what, f"a symbolic link (to {shown(os.readlink(path))})"
                         if stat.S_ISLNK(info.st_mode) else next(
                             (name for test, name in _FILE_TYPES if test(info.st_mode)),
                             "not a plain file"))
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ENOENT and not flags & os.O_CREAT:
            return None
        if exc.errno == errno.ELOOP:   # became a link meanwhile
            raise _not_plain(path, what, "a symbolic link") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _not_plain(path, what, "not a plain file")
    return fd


def _unwritable(path: Path, exc: OSError, what: str = "trust store") -> TrustStoreError:
    reason = exc.strerror or str(exc)   # e.g. "No space left on device"
    return TrustStoreError(
        f"could not write the {what} {path}: {reason}; free some space there (or make the folder "
        f"writable, or set {CONFIG_ENV_VAR} to a writable folder) and run the command again. "
        f"The trust store was left as it was", reason=reason)


def _read_store() -> dict[str, dict]:
    """{sha256: entry} from the store file ({} when there is none), opened following no link."""
    path = store_path()
    if not os.path.lexists(path):
        return {}
    _check_private(path.parent, "directory")
    def unreadable(reason):
        return KernelTrustError(
            f"the trust store {path} is unreadable ({reason}); remove it and trust your kernels "
            f"again with 'graphswap trust add FILE'")

    try:
        fd = _open_plain(path, "file", os.O_RDONLY)
        if fd is None:
            return {}
        with os.fdopen(fd, "rb") as handle:
            _check_private(path, "file", os.fstat(fd))
            entries = json.loads(handle.read().decode("utf-8"))["kernels"]
        store = {}
        for entry in entries:
            if not isinstance(entry.get("sha256"), str) or not _HEX.match(entry["sha256"]):
                raise unreadable(f"bad sha256 {entry.get('sha256')!r}")
            store[entry["sha256"]] = {"sha256": entry["sha256"], "path": str(entry["path"]),
                                      "added": str(entry.get("added", ""))}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise unreadable(f"{type(exc).__name__}: {exc}") from None
    return store


def _write_store(store: dict[str, dict]) -> None:
    """Replace the store (under _store_lock): written in full to a new owner-only temporary,
    synced, renamed over it; on a failure the old store stays (TrustStoreError)."""
    path = store_path()
    document = {"version": STORE_VERSION,
                "kernels": sorted(store.values(), key=lambda e: (e["path"], e["sha256"]))}
    tmp = None
    try:   # mkstemp: O_EXCL | O_NOFOLLOW, mode 0600, a random name
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=2)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise _unwritable(path, exc) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


@contextlib.contextmanager
def _store_lock():
    """Serialise read-modify-write of the store between processes: an flock on the plain file
    `.trusted_kernels.json.lock`, opened without following a link, never truncated or written."""
    import fcntl

    directory = config_dir()
    path = directory / f".{STORE_NAME}.lock"
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise _unwritable(directory, exc, "trust store's folder") from None
    _check_private(directory, "directory")
    try:
        fd = _open_plain(path, "lock file", os.O_RDWR | os.O_CREAT)
    except OSError as exc:
        raise _unwritable(path, exc, "trust store's lock file") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def stored_trust() -> list[dict]:
    """The trust store's entries: [{"sha256", "path", "added"}], sorted by path."""
    return sorted(_read_store().values(), key=lambda e: (e["path"], e["sha256"]))


def file_state(entry: dict) -> str:
    """Whether a store entry's file still holds the trusted content: "same", "changed",
    "missing", or "reads other files" (same content, but it includes headers or needs libraries
    from outside the system's, so graphswap refuses it: check_reads)."""
    try:
        content = read_file(entry["path"], "kernel file")
    except KernelTrustError:
        return "missing"
    if content.sha256 != entry["sha256"]:
        return "changed"
    try:
        check_reads(content)
    except KernelTrustError:
        return "reads other files"
    return "same"


def shown(path: str) -> str:
    """A path as printed: itself when every character is printable, else escaped as Python writes
    a string (a newline or another control character in a stored path must not make lines of
    output of its own)."""
    return path if path.isprintable() else repr(path)


def check_reads(content: FileContent) -> None:
    """Refuse (KernelTrustError naming both files) a kernel file that reads files besides itself
    that its hash does not cover: a C source (.c) including a header from outside the compiler's
    system headers, a library (.so) needing one from outside the system library directories.
    Compiling and loading check what they use again; this is the early, same answer."""
    if content.path.endswith(".c"):
        check_headers(content, "kernel source")   # the preprocessor alone, in the sandbox
    elif _LIBRARY.search(content.path):
        check_library_dependencies(content, "kernel library")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def trust(path, persist: bool = False) -> str:
    """Trust the kernel file at `path` with its current content; returns its SHA-256.

    For this process, or (persist=True) for later sessions too, through the trust store.  A later
    change of the file revokes the trust: its new hash is not trusted.
    """
    real = os.path.realpath(os.fspath(path))
    try:
        mode = os.stat(real).st_mode
    except OSError:
        raise KernelTrustError(f"cannot trust {shown(os.fspath(path))}: no such file") from None
    if not stat.S_ISREG(mode):
        kind = next((f"{name}, not a regular file" for test, name in _FILE_TYPES if test(mode)),
                     "not a regular file")
        raise KernelTrustError(
            f"cannot trust {shown(os.fspath(path))}: it is {kind}; graphswap trusts kernel files "
            f"(a .c source, a .so library) by the hash of their content. Give the path of the "
            f"kernel file itself")
    content = read_file(real, "kernel file")
    check_reads(content)
    approve(content, persist=persist)
    return content.sha256


def approve(content: FileContent, persist: bool = False) -> bool:
    """Trust `content` (by its hash) for the session, and with persist=True in the store.

    Returns True if the store gained an entry (it was not there before)."""
    with _lock:
        _session[content.sha256] = content.path
    if not persist:
        return False
    with _store_lock():
        store = _read_store()
        known = content.sha256 in store and store[content.sha256]["path"] == content.path
        if not known:
            store[content.sha256] = {"sha256": content.sha256, "path": content.path,
                                     "added": _now()}
            _write_store(store)
        return not known


def untrust(path_or_hash) -> list[dict]:
    """Remove trust: a SHA-256, or a path (every entry recorded under it, and its current hash).

    Removes from the store and from this session; returns the store entries removed."""
    key = os.fspath(path_or_hash)
    digests: set[str] = set()
    real = None
    if _HEX.match(key.lower()):
        digests.add(key.lower())
    else:
        real = os.path.realpath(key)
        if os.path.isfile(real):
            digests.add(read_file(real, "kernel file").sha256)
    with _store_lock():
        store = _read_store()
        removed = [e for e in store.values()
                   if e["sha256"] in digests or (real is not None and e["path"] == real)]
        for entry in removed:
            del store[entry["sha256"]]
        if removed:
            _write_store(store)
    with _lock:
        for digest in list(_session):
            if digest in digests or (real is not None and _session[digest] == real):
                del _session[digest]
    return removed


def clear_session_trust() -> None:
    """Forget everything trusted for this process (the store and the environment stay)."""
    with _lock:
        _session.clear()


def _env_entries() -> list[str]:
    """The entries of $GRAPHSWAP_TRUSTED_KERNELS; KernelTrustError for a relative path."""
    entries = [entry.strip() for entry in os.environ.get(ENV_VAR, "").split(os.pathsep)
               if entry.strip()]
    for entry in entries:
        if not _HEX.match(entry.lower()) and not os.path.isabs(os.path.expanduser(entry)):
            raise KernelTrustError(
                f"${ENV_VAR} holds the relative path {entry!r}; it would be resolved against "
                f"each command's current folder, trusting whatever file of that name the folder "
                f"you run in holds. Its entries must be absolute paths or SHA-256 digests: "
                f"write it as an absolute path (e.g. {os.path.abspath(entry)}), or remove it")
    return entries


def trusted_by(sha256: str, path: str, identity: tuple[int, int] | None = None) -> str | None:
    """How (path, sha256) is trusted - 'session', 'trust store', the env var - or None.

    A path in $GRAPHSWAP_TRUSTED_KERNELS trusts the file it names now: with `identity` (the
    (device, inode) of the descriptor the bytes were read from, FileContent.identity) the file
    read must be that very file - compared with a stat of the trusted path, never by resolving
    `path` again after the read (a symbolic link re-pointed in between would pass that)."""
    with _lock:
        if sha256 in _session:
            return "session"
    real = os.path.realpath(path) if identity is None else None
    for entry in _env_entries():
        if _HEX.match(entry.lower()):
            if entry.lower() == sha256:
                return ENV_VAR
        elif identity is not None:
            try:
                info = os.stat(os.path.expanduser(entry))
            except OSError:
                continue
            if (info.st_dev, info.st_ino) == tuple(identity):
                return ENV_VAR
        elif os.path.realpath(os.path.expanduser(entry)) == real:
            return ENV_VAR
    if sha256 in _read_store():
        return "trust store"
    return None


def how_to_trust(path: str) -> str:
    return (f"If you trust it, run 'graphswap trust add {path}' (remembered), or pass "
            f"--trust-kernel {path} (this command), or call graphswap.trust('{path}') before "
            f"loading, or add its sha256 to ${ENV_VAR}")


# --------------------------------------------------------------------------------------------
# the gate for files named by files
# --------------------------------------------------------------------------------------------

def check_record_path(path, where: str) -> str:
    """A recorded path must be an absolute, normalised path (no '..', no relative resolution)."""
    if not isinstance(path, str) or not path:
        raise KernelTrustError(f"{where}: the kernel record has no path; re-convert the model")
    if not os.path.isabs(path) or os.path.normpath(path) != path:
        raise KernelTrustError(
            f"{where}: the kernel record's path {path!r} is not an absolute, normalised path; "
            f"graphswap never resolves a path a file names against the current directory. "
            f"Re-convert the model")
    return path


def admit_recorded_file(path, sha256, what: str, where: str, executable: bool) -> FileContent:
    """Read a file a record names and check it before anything opens it.

    Refuses (KernelTrustError naming `where`, the file, its hash and how to trust it) a malformed
    path or hash, a missing file, content whose hash differs from the record, and - for native
    code - content nobody trusted.  Returns the bytes that were checked.
    """
    path = check_record_path(path, where)
    if not isinstance(sha256, str) or not _HEX.match(sha256):
        raise KernelTrustError(f"{where}: the {what} {path} has no valid recorded sha256 "
                               f"(got {sha256!r}); re-convert the model")
    try:
        content = read_file(path, what)
    except KernelTrustError as exc:
        raise KernelTrustError(f"{where}: {exc}; put the file back at that path, or re-convert "
                               f"the model with its new location") from None
    if content.sha256 != sha256:
        raise KernelTrustError(
            f"{where}: the {what} {path} has changed since the model was saved: recorded sha256 "
            f"{sha256}, file now has {content.sha256}. Restore the original file, or re-convert "
            f"the model with the new one")
    if executable:
        require_trusted(content, what, where)
    return content


def require_trusted(content: FileContent, what: str, where: str) -> None:
    if trusted_by(content.sha256, content.path, content.identity) is None:
        raise KernelTrustError(
            f"{where}: refusing to load the {what} {content.path} (sha256 {content.sha256}): it "
            f"is not trusted. {how_to_trust(content.path)}")
