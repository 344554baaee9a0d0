"""Input files a user names (or an attacker plants): opened without blocking and refused unless
they are regular files; their JSON refused when it nests deeper than graphswap reads.

`open_regular` opens a path with O_NONBLOCK, so a FIFO with no writer never blocks the command,
and checks the open descriptor (fstat): a FIFO, a socket, a character or block device (/dev/zero
would be read without end) or a directory is refused by what it is, and the file that is read is
the one that was checked.  `require_regular` makes the same check for a file a library opens by its
path afterwards (zipfile, h5py, numpy).

`load_json` checks how deep a JSON text nests before it is parsed: Python's parser raises
RecursionError for 100,000 nested brackets, and no JSON graphswap reads nests more than a few
levels.  Every JSON document graphswap reads from a file a user could edit (kernel maps, metrics
tables, checkpoint states, SavedModel manifests and metadata) goes through it; a Keras model's
configuration is checked with a larger limit (MAX_MODEL_JSON_DEPTH: models nest in models).
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat

import numpy as np

from graphswap.errors import InputFileError

#: deepest JSON nesting graphswap reads from its own kinds of files (a kernel map, a front, a
#: metrics table, a checkpoint state, a manifest: at most a few levels deep)
MAX_JSON_DEPTH = 64
#: deepest JSON nesting of a Keras model configuration graphswap reads: a model's configuration
#: is 7-15 levels deep and each model nested in it adds about 4
MAX_MODEL_JSON_DEPTH = 256

FILE_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
              (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
              (stat.S_ISDIR, "a directory"))


def file_kind(mode: int) -> str | None:
    """What a file of st_mode `mode` is, in words ("a FIFO (named pipe)"); None: a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in FILE_KINDS if test(mode)), "not a regular file")


def not_regular(path, what: str, kind: str, error=InputFileError):
    """The error for an input that is `kind`, not a regular file."""
    return error(f"the {what} {os.fspath(path)} is {kind}, not a regular file; graphswap reads "
                 f"a {what} only from a regular file (reading {kind} could block or never end). "
                 f"Give the path of the file itself")


def open_regular(path, what: str, error=InputFileError):
    """The regular file at `path`, open for binary reading; `error` (naming `what`, e.g. "kernel
    map") when it is missing or unreadable, or is a FIFO, a socket, a device or a directory.
    Opened O_NONBLOCK (a FIFO never blocks the open), checked on the descriptor."""
    shown = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        try:
            kind = file_kind(os.stat(path).st_mode)   # a socket cannot be opened (ENXIO)
        except OSError:
            kind = None
        if kind is not None:
            raise not_regular(path, what, kind, error) from None
        reason = "no such file" if exc.errno == errno.ENOENT else (exc.strerror or str(exc))
        raise error(f"cannot read the {what} {shown}: {reason}") from None
    try:
        kind = file_kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise not_regular(path, what, kind, error)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def require_regular(path, what: str, error=InputFileError) -> None:
    """Refuse `path` (with `error`) unless it is a regular file graphswap can open, without
    blocking on a FIFO; for files a library opens by their path afterwards."""
    open_regular(path, what, error).close()


def read_regular(path, what: str, limit: int | None = None, error=InputFileError) -> bytes:
    """The bytes of the regular file at `path` (open_regular); with `limit`, a file of more bytes
    is refused before it is read whole."""
    with open_regular(path, what, error) as handle:
        try:
            if limit is None:
                return handle.read()
            size = os.fstat(handle.fileno()).st_size
            data = handle.read(limit + 1) if size <= limit else b""
        except OSError as exc:
            raise error(f"cannot read the {what} {os.fspath(path)}: "
                        f"{exc.strerror or exc}") from None
    if size > limit or len(data) > limit:
        raise error(f"the {what} {os.fspath(path)} holds {max(size, len(data)):,} bytes, more "
                    f"than the {limit:,} graphswap reads of it; check that it is the right file")
    return data


# --------------------------------------------------------------------------------------------
# JSON of a bounded depth
# --------------------------------------------------------------------------------------------

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def json_depth(text: str | bytes) -> int:
    """How deep the brackets of a JSON text nest (those inside strings do not count); an
    unbalanced text counts its open brackets."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if not brackets:
        return 0
    codes = np.frombuffer(brackets.encode("ascii"), np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1).astype(np.int32)
    return int(np.cumsum(steps).max())


def check_json_depth(text: str | bytes, where: str, error=InputFileError,
                     max_depth: int = MAX_JSON_DEPTH) -> None:
    """Refuse (`error`) JSON text nested deeper than `max_depth`; `where` names the document
    ("the kernel map k.json")."""
    depth = json_depth(text)
    if depth > max_depth:
        raise error(f"{where} nests too deeply: its JSON is {depth:,} levels deep, more than the "
                    f"{max_depth} graphswap reads (what it reads there nests a few levels); the "
                    f"file was edited or is not the one meant. Check where it came from, or write "
                    f"it again")


def load_json(text: str | bytes, where: str, error=InputFileError,
              max_depth: int = MAX_JSON_DEPTH):
    """json.loads(text) after check_json_depth; json.JSONDecodeError (a ValueError) for text that
    is no JSON, for the caller to say what the file should be."""
    check_json_depth(text, where, error, max_depth)
    return json.loads(text)
