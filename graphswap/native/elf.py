"""A small reader of ELF dynamic sections (standard library only): what a shared library asks the
dynamic loader for - the libraries it needs (DT_NEEDED) and where to look for them (DT_RPATH,
DT_RUNPATH) - read the way the loader reads them, through the program headers (a stripped library
has no section headers to rely on).

graphswap.native.dependencies decides from this which files besides the library itself a load
would read.
"""

from __future__ import annotations

import dataclasses
import struct

from graphswap.errors import KernelTrustError

PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_RPATH, DT_RUNPATH = 0, 1, 5, 10, 15, 29
_MAX_HEADERS = 4096
_MAX_ENTRIES = 1 << 16


@dataclasses.dataclass(frozen=True)
class DynamicSection:
    """What a library's dynamic section asks of the loader (entries split at ':', as written,
    $ORIGIN and all; None: the entry is absent)."""

    needed: tuple[str, ...]
    rpath: tuple[str, ...] | None
    runpath: tuple[str, ...] | None


def _malformed(name: str, reason: str) -> KernelTrustError:
    return KernelTrustError(
        f"cannot read the dynamic section of {name} ({reason}); graphswap reads which libraries "
        f"a library needs before it loads it. Rebuild it as an ordinary shared library")


def read_dynamic_section(handle, name: str) -> DynamicSection | None:
    """The dynamic section of the ELF file open in `handle` (binary, seekable); None when it is no
    ELF file or has no dynamic section (the loader has nothing to look up for it).  A truncated or
    inconsistent ELF file is refused (KernelTrustError naming `name`)."""

    def read(offset: int, size: int) -> bytes:
        handle.seek(offset)
        data = handle.read(size)
        if len(data) != size:
            raise _malformed(name, f"{size} bytes at offset {offset} run past its end")
        return data

    handle.seek(0)
    ident = handle.read(16)
    if len(ident) < 16 or ident[:4] != b"\x7fELF":
        return None
    if ident[4] not in (1, 2) or ident[5] not in (1, 2):
        raise _malformed(name, f"class {ident[4]}, data encoding {ident[5]}")
    wide, order = ident[4] == 2, "<" if ident[5] == 1 else ">"
    if wide:
        phoff, = struct.unpack(order + "Q", read(0x20, 8))
        phentsize, phnum = struct.unpack(order + "HH", read(0x36, 4))
        header, needed_size = order + "IIQQQQQQ", 56
    else:
        phoff, = struct.unpack(order + "I", read(0x1C, 4))
        phentsize, phnum = struct.unpack(order + "HH", read(0x2A, 4))
        header, needed_size = order + "IIIIIIII", 32
    if phnum == 0:
        return None
    if phnum > _MAX_HEADERS or phentsize < needed_size:
        raise _malformed(name, f"{phnum} program headers of {phentsize} bytes")
    loads, dynamic = [], None
    for index in range(phnum):
        fields = struct.unpack(header, read(phoff + index * phentsize, needed_size))
        if wide:
            p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = fields
        else:
            p_type, p_offset, p_vaddr, _, p_filesz, _, _, _ = fields
        if p_type == PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return None
    entry = order + ("qQ" if wide else "iI")
    size = struct.calcsize(entry)
    raw = read(dynamic[0], min(dynamic[1], _MAX_ENTRIES * size) // size * size)
    tags: list[tuple[int, int]] = []
    for offset in range(0, len(raw), size):
        tag, value = struct.unpack_from(entry, raw, offset)
        if tag == DT_NULL:
            break
        tags.append((tag, value))
    strtab = [value for tag, value in tags if tag == DT_STRTAB]
    strsz = [value for tag, value in tags if tag == DT_STRSZ]
    wanted = [(tag, value) for tag, value in tags if tag in (DT_NEEDED, DT_RPATH, DT_RUNPATH)]
    if not wanted:
        return DynamicSection((), None, None)
    if not strtab or not strsz:
        raise _malformed(name, "no string table for its DT_NEEDED / DT_RPATH / DT_RUNPATH entries")
    base = next((offset + strtab[0] - vaddr for vaddr, offset, filesz in loads
                 if vaddr <= strtab[0] < vaddr + filesz), None)
    if base is None:
        raise _malformed(name, f"its string table address {strtab[0]:#x} is in no loaded segment")
    strings = read(base, strsz[0])

    def string(offset: int) -> str:
        end = strings.find(b"\0", offset)
        if offset >= len(strings) or end < 0:
            raise _malformed(name, f"string offset {offset} is outside its string table")
        return strings[offset:end].decode("utf-8", "surrogateescape")

    needed = tuple(string(value) for tag, value in wanted if tag == DT_NEEDED)
    paths = {}
    for kind in (DT_RPATH, DT_RUNPATH):
        values = [string(value) for tag, value in wanted if tag == kind]
        paths[kind] = tuple(part for value in values for part in value.split(":")) \
            if values else None
    return DynamicSection(needed, paths[DT_RPATH], paths[DT_RUNPATH])
