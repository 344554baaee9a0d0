"""Data files read defensively: .npz archives whose members' declared sizes are checked before
anything is allocated, and image folders whose symbolic links are checked before Keras lists them.

`np.load` trusts each member's `.npy` header: a header declaring 10^12 elements allocates (a
MemoryError, or the machine swapping), a shape whose product overflows is reported as a pickle
problem, and a damaged member surfaces as zipfile's or zlib's own exception.  `open_npz` reads the
header itself (numpy.lib.format.read_magic / read_array_header_*), checks the dtype (no Python
objects: graphswap never unpickles), the shape (non-negative), the size (against the memory this
machine has available, and against the bytes the archive says the member holds), and only then
allocates and reads, turning CRC, zlib and truncation errors into a DataError naming the member.

`check_image_links` refuses, before `keras.utils.image_dataset_from_directory` sees an image folder,
a class folder that is a symbolic link loop or a link back to the folder holding it (it used to be
skipped, or counted as a class, silently), an image file that is a link loop or a link to
nothing (it used to end in "unexpected UnknownError ... Too many levels of symbolic links"), and
folders nested more than MAX_FOLDER_DEPTH deep (it used to be "unexpected RecursionError").

`NpzArchive` also bounds what the members take together: each member read is charged its bytes
plus the copy graphswap makes of it (inputs widened to float32, labels to int64 / float32), and
the total must fit the memory available when the archive was opened (members that each fit used
to widen together to many times the machine's memory).

Every failure is one DataError: what was found, what is allowed, what to do.
"""

from __future__ import annotations

import functools
import math
import os
import zipfile
import zlib

import numpy as np
from numpy.lib import format as npy_format

from graphswap.errors import DataError
from graphswap.native.files import missing_reason

#: bytes read per call while filling an array (bounded reads, like numpy's own)
CHUNK_BYTES = 16 * 1024 * 1024
_RESAVE = "save the data again with np.savez(path, x=inputs, y=labels)"
#: the files keras.utils.image_dataset_from_directory reads
IMAGE_SUFFIXES = (".bmp", ".gif", ".jpeg", ".jpg", ".png")
#: folders an image folder may nest below it (class folders are depth 1)
MAX_FOLDER_DEPTH = 64


def memory_available() -> int | None:
    """Bytes of memory this machine can give a new array now (MemAvailable; the free pages where
    /proc/meminfo is missing), or None when the system does not say."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def describe_bytes(count: int) -> str:
    for unit, size in (("TB", 1 << 40), ("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if count >= size:
            value = count / size
            return f"{value:.3g} {unit}" if value < 1e6 else f"{count:.3g} bytes"
    return f"{count} bytes"


class NpzArchive:
    """The members of an .npz archive, read on demand (the part of np.load's NpzFile graphswap
    uses: `files`, `archive[key]`, a context manager)."""

    def __init__(self, path):
        self.path = os.fspath(path)
        try:
            self._zip = zipfile.ZipFile(self.path)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError) as exc:
            raise DataError(f"{self.path} is not a readable NumPy .npz archive ({exc}); "
                            f"{_RESAVE}") from None
        self._members = {}
        # what the arrays read so far take, widened as graphswap widens them, against the memory
        # available when the archive was opened: each member may fit, all of them together not
        self._budget, self._charged = memory_available(), []
        for info in self._zip.infolist():
            key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            self._members.setdefault(key, info)
        self.files = list(self._members)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def close(self) -> None:
        self._zip.close()

    def __contains__(self, key) -> bool:
        return key in self._members

    def __getitem__(self, key) -> np.ndarray:
        info = self._members[key]
        where = f"{self.path}: array {key!r} (member {info.filename})"
        if not info.filename.endswith(".npy"):
            raise DataError(f"{where} is not a .npy array; an .npz archive holds arrays; "
                            f"{_RESAVE}")
        try:
            with self._zip.open(info) as member:
                return _read_member(member, info, where, functools.partial(self._charge, key))
        except DataError:
            raise
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError,
                RuntimeError, ValueError) as exc:
            kind = "zlib error" if isinstance(exc, zlib.error) else type(exc).__name__
            raise DataError(f"{where} is corrupt: {kind}: {exc}; the archive was "
                            f"damaged or truncated - {_RESAVE}") from None

    def _charge(self, key: str, shape, dtype, count: int, size: int) -> None:
        """Refuse (DataError) reading array `key` when it and the arrays read before would take
        more than the memory available at open: each counted with the copy graphswap makes of it
        (inputs widened to float32; labels - arrays named y... - to int64 or float32)."""
        if key.startswith("y"):
            widened = count * (8 if dtype.kind in "iub" else 4)
        else:
            widened = 0 if dtype == np.float32 else count * 4
        self._charged.append((key, shape, dtype, size + widened))
        total = sum(need for *_, need in self._charged)
        if self._budget is None or total <= self._budget:
            return
        parts = ", ".join(f"{name!r} {tuple(dims)} {kind} -> {describe_bytes(need)}"
                          for name, dims, kind, need in self._charged)
        raise DataError(
            f"{self.path}: its arrays take {describe_bytes(total)} once read and widened for the "
            f"model ({parts}; each counted with its float32/int64 copy); this machine had "
            f"{describe_bytes(self._budget)} of memory available, and graphswap reads an .npz "
            f"whole: use a smaller file (fewer examples; evaluate or fine-tune on parts), an "
            f"image folder or a tf.data dataset")


def open_npz(path) -> NpzArchive:
    """An .npz archive whose members are checked before they are allocated (module docstring);
    raises DataError."""
    return NpzArchive(path)


def _read_member(member, info, where, charge) -> np.ndarray:
    try:
        version = npy_format.read_magic(member)
        if version == (1, 0):
            shape, fortran_order, dtype = npy_format.read_array_header_1_0(member)
        elif version in ((2, 0), (3, 0)):
            shape, fortran_order, dtype = npy_format.read_array_header_2_0(member)
        else:
            raise DataError(f"{where} has .npy format version {version}; graphswap reads "
                            f"versions 1.0 to 3.0: {_RESAVE}")
    except ValueError as exc:
        if isinstance(exc, DataError):
            raise
        raise DataError(f"{where} has no valid .npy header ({exc}); {_RESAVE}") from None
    header_bytes = member.tell()
    if dtype.hasobject:
        raise DataError(f"{where} holds Python objects (dtype {dtype}), which need pickle; "
                        f"graphswap never unpickles data files: save numeric arrays, and text "
                        f"as a unicode array (np.array(texts, dtype=str))")
    if any(d < 0 for d in shape):
        raise DataError(f"{where} declares the shape {shape}, with a negative dimension; the "
                        f"header is corrupt - {_RESAVE}")
    count = math.prod(shape)
    size = count * dtype.itemsize
    available = memory_available()
    if available is not None and size > available:
        raise DataError(
            f"{where} declares shape {shape} of {dtype} = {count:,} elements, "
            f"{describe_bytes(size)}; this machine has {describe_bytes(available)} of memory "
            f"available, and graphswap reads an .npz array whole: use a smaller file (fewer "
            f"examples; evaluate or fine-tune on parts), an image folder or a tf.data dataset")
    charge(shape, dtype, count, size)
    if header_bytes + size != info.file_size:
        raise DataError(
            f"{where} declares shape {shape} of {dtype} ({describe_bytes(size)}) but the archive "
            f"holds {describe_bytes(max(info.file_size - header_bytes, 0))} of data for it; the "
            f"member is corrupt or truncated - {_RESAVE}")
    buffer = np.empty(size, np.uint8)
    view = memoryview(buffer)
    done = 0
    while done < size:
        read = member.readinto(view[done:done + CHUNK_BYTES])
        if not read:
            raise DataError(f"{where} ends after {done:,} of {size:,} bytes of data; the member "
                            f"is truncated - {_RESAVE}")
        done += read
    if member.read(1):  # reaching the end also makes zipfile check the CRC
        raise DataError(f"{where} holds more data than its header declares ({shape} of "
                        f"{dtype}); the member is corrupt - {_RESAVE}")
    array = buffer.view(dtype) if dtype.itemsize else np.empty(count, dtype)
    if fortran_order:
        return array.reshape(shape[::-1]).transpose()
    return array.reshape(shape)


def _link_problem(path: str) -> str | None:
    """Why the symbolic link `path` cannot be followed, or None."""
    reason = missing_reason(path)
    return None if reason == "exists" else reason


def check_image_links(folder) -> None:
    """Refuse an image folder (one subfolder per class) whose links lead nowhere or in circles:
    a class folder that is a link loop, a broken link or a link to the folder itself or one
    above it, and an image file (what Keras reads: .bmp/.gif/.jpeg/.jpg/.png) that is a link loop
    or a broken link.  Raises DataError naming the link."""
    root = os.path.realpath(folder)
    fix = "remove the link, or replace it by the folder or file it should be"
    for name in sorted(os.listdir(folder)):
        entry = os.path.join(folder, name)
        if name.startswith(".") or not os.path.islink(entry):
            continue
        problem = _link_problem(entry)
        if problem is None and os.path.isdir(entry):
            target = os.path.realpath(entry)
            if root == target or root.startswith(target.rstrip(os.sep) + os.sep):
                problem = (f"is a link to {target}, which holds the data folder itself (a loop: "
                           f"each class must be a folder of its own images)")
        if problem is not None:
            raise DataError(f"class folder {entry} {problem}; {fix}")
    for name in sorted(os.listdir(folder)):
        top = os.path.join(folder, name)
        if name.startswith(".") or not os.path.isdir(top):
            continue
        for parent, files in _walk(top, folder):  # as Keras walks: links to folders not followed
            for file_name in sorted(files):
                entry = os.path.join(parent, file_name)
                if not file_name.lower().endswith(IMAGE_SUFFIXES) or not os.path.islink(entry):
                    continue
                problem = _link_problem(entry)
                if problem is not None:
                    raise DataError(f"image file {entry} {problem}; {fix}")


def _walk(top: str, folder):
    """(folder, names of what is not a folder in it) for `top` and every folder below it, links
    to folders not followed, without recursion; DataError for folders nested more than
    MAX_FOLDER_DEPTH deep below the data folder (Keras' own walk would end in a RecursionError)."""
    pending = [(top, 1)]
    while pending:
        parent, depth = pending.pop()
        try:
            entries = sorted(os.scandir(parent), key=lambda e: e.name)
        except OSError:
            continue
        folders = [e.path for e in entries if e.is_dir(follow_symlinks=False)]
        if folders and depth >= MAX_FOLDER_DEPTH:
            raise DataError(
                f"image folder {folder} nests folders more than {MAX_FOLDER_DEPTH} deep "
                f"({folders[0][:160]}...); a data folder holds one folder per class, its images "
                f"in it (or a few levels below): move the images up, or remove the nested folders")
        yield parent, [e.name for e in entries if not e.is_dir(follow_symlinks=False)]
        pending.extend((path, depth + 1) for path in reversed(folders))
