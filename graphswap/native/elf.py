"""A strict reader of ELF shared libraries (standard library only): what glibc's dynamic loader
reads of a library before any of its code runs, read the way the loader reads it.

* the ELF header and the program headers (never the section headers: the loader ignores them,
  and a stripped library has none);
* the PT_LOAD segments, as the loader maps them: each at its address, page by page;
* the dynamic section through the PT_DYNAMIC segment's *address* in those mappings (the loader
  reads it from memory, not from the header's file offset), entry after entry up to the first
  DT_NULL (the loader reads on until one comes, whatever the segment's size says).

Whatever the loader could read otherwise than this reader is refused (ElfFormatError, a
KernelTrustError whose message is the reason alone): headers or segments that run past the end
of the file, loadable segments out of address order, overlapping or sharing a memory page (the
later mapping would replace the page the earlier one's bytes are read from), an address/offset
pair the loader would refuse, more than one PT_DYNAMIC (the loader takes the last), a PT_DYNAMIC
whose offset and address disagree or that lies outside the file bytes of a loadable segment, a
dynamic section with no DT_NULL there.  Addresses the dynamic section gives (its string table)
are read through `ElfImage.read_at`, which answers only from the file bytes of one segment.

graphswap.native.elf_policy decides from what is read here whether a library may be loaded.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from typing import Callable

from graphswap.errors import KernelTrustError

PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3
DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_RPATH, DT_RUNPATH = 0, 1, 5, 10, 15, 29
PN_XNUM = 0xFFFF
_MAX_HEADERS = 4096
_MAX_ENTRIES = 1 << 16
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class ElfFormatError(KernelTrustError):
    """An ELF file that is malformed, or that the loader could read otherwise than graphswap:
    the message says what, alone (the caller names the file and what to do)."""


@dataclasses.dataclass(frozen=True)
class Segment:
    """One program header."""

    kind: int
    offset: int
    vaddr: int
    filesz: int
    memsz: int
    align: int


@dataclasses.dataclass(frozen=True)
class ElfImage:
    """What the loader reads of an ELF file: its header fields, its program headers, and the
    entries of its dynamic section before the first DT_NULL (None: no PT_DYNAMIC)."""

    wide: bool
    little: bool
    osabi: int
    kind: int
    machine: int
    segments: tuple[Segment, ...]
    dynamic: tuple[tuple[int, int], ...] | None
    size: int
    reader: Callable[[int, int], bytes] = dataclasses.field(repr=False, compare=False)

    @property
    def loads(self) -> tuple[Segment, ...]:
        return tuple(s for s in self.segments if s.kind == PT_LOAD)

    def file_offset(self, address: int, size: int) -> int | None:
        """The file offset of the `size` bytes the loader maps at `address`, when they all lie in
        the file bytes of one loadable segment; None otherwise (not mapped, or zero-filled)."""
        for load in self.loads:
            if load.vaddr <= address and address + size <= load.vaddr + load.filesz:
                return load.offset + address - load.vaddr
        return None

    def read_at(self, address: int, size: int) -> bytes | None:
        """The `size` bytes the loader maps at `address` (see file_offset); None when they are not
        all file bytes of one loadable segment."""
        offset = self.file_offset(address, size)
        return None if offset is None else self.reader(offset, size)


def bytes_reader(data: bytes) -> tuple[Callable[[int, int], bytes], int]:
    """(read(offset, size), size) of bytes in memory."""
    view = memoryview(data)

    def read(offset: int, size: int) -> bytes:
        if offset < 0 or size < 0 or offset + size > len(data):
            raise ElfFormatError(f"{size} bytes at offset {offset} run past the end of the file "
                                 f"({len(data)} bytes)")
        return bytes(view[offset:offset + size])
    return read, len(data)


def handle_reader(handle) -> tuple[Callable[[int, int], bytes], int]:
    """(read(offset, size), size) of a binary, seekable file."""
    size = handle.seek(0, os.SEEK_END)

    def read(offset: int, count: int) -> bytes:
        if offset < 0 or count < 0 or offset + count > size:
            raise ElfFormatError(f"{count} bytes at offset {offset} run past the end of the file "
                                 f"({size} bytes)")
        handle.seek(offset)
        return handle.read(count)
    return read, size


def _segments(read, size, wide, order, phoff, phnum) -> tuple[Segment, ...]:
    header, entry_size = (order + "IIQQQQQQ", 56) if wide else (order + "IIIIIIII", 32)
    if phoff + phnum * entry_size > size:
        raise ElfFormatError(f"its {phnum} program headers at offset {phoff} run past the end of "
                             f"the file ({size} bytes)")
    raw = read(phoff, phnum * entry_size)
    segments = []
    for index in range(phnum):
        fields = struct.unpack_from(header, raw, index * entry_size)
        if wide:
            kind, _, offset, vaddr, _, filesz, memsz, align = fields
        else:
            kind, offset, vaddr, _, filesz, memsz, _, align = fields
        segments.append(Segment(kind, offset, vaddr, filesz, memsz, align))
    return tuple(segments)


def _check_loads(loads, size: int, page: int) -> None:
    """The loadable segments as the loader maps them: in the file, page-aligned, in address order,
    no two sharing a memory page."""
    if not loads:
        raise ElfFormatError("it has no loadable (PT_LOAD) segment")
    for load in loads:
        where = f"its loadable segment at address {load.vaddr:#x}"
        if load.offset + load.filesz > size:
            raise ElfFormatError(f"{where} takes {load.filesz} bytes at offset {load.offset:#x}, "
                                 f"past the end of the file ({size} bytes)")
        if load.filesz > load.memsz:
            raise ElfFormatError(f"{where} has more file bytes ({load.filesz}) than memory bytes "
                                 f"({load.memsz})")
        if load.align % page or (load.vaddr - load.offset) % page:
            raise ElfFormatError(f"{where} (offset {load.offset:#x}, alignment {load.align:#x}) "
                                 f"is not aligned to the {page}-byte pages the loader maps")
        if load.vaddr + load.memsz >= 1 << 63:
            raise ElfFormatError(f"{where} ends past the address space")
    for before, after in zip(loads, loads[1:]):
        end = -(-(before.vaddr + before.memsz) // page) * page
        if after.vaddr // page * page < end:
            raise ElfFormatError(
                f"its loadable segments at addresses {before.vaddr:#x} and {after.vaddr:#x} are "
                f"out of order, overlap or share a memory page (the later mapping would replace "
                f"the bytes of the earlier one)")


def _dynamic_entries(read, image: ElfImage, dynamic: Segment, wide, order):
    entry, entry_size = (order + "qQ", 16) if wide else (order + "iI", 8)
    offset = image.file_offset(dynamic.vaddr, dynamic.filesz)
    if offset is None or dynamic.filesz < entry_size:
        raise ElfFormatError(f"its dynamic section ({dynamic.filesz} bytes at address "
                             f"{dynamic.vaddr:#x}) is not inside the file bytes of a loadable "
                             f"segment")
    if offset != dynamic.offset:
        raise ElfFormatError(f"its PT_DYNAMIC header gives file offset {dynamic.offset:#x}, but "
                             f"its address {dynamic.vaddr:#x} maps file offset {offset:#x}, "
                             f"which is what the loader reads")
    count = min(dynamic.filesz // entry_size, _MAX_ENTRIES)
    raw = read(offset, count * entry_size)
    entries = []
    for index in range(count):
        tag, value = struct.unpack_from(entry, raw, index * entry_size)
        if tag == DT_NULL:
            return tuple(entries)
        entries.append((tag, value))
    raise ElfFormatError(f"no DT_NULL ends its dynamic section within its {dynamic.filesz} bytes "
                         f"(at most {_MAX_ENTRIES} entries); the loader would read on past them")


def read_elf(read: Callable[[int, int], bytes], size: int,
             page: int = PAGE_SIZE) -> ElfImage | None:
    """The ElfImage of the file `read` reads (bytes_reader, handle_reader); None when it is no
    ELF file.  ElfFormatError for anything malformed or ambiguous (see the module docstring)."""
    if size < 16:
        return None
    ident = read(0, 16)
    if ident[:4] != b"\x7fELF":
        return None
    if ident[4] not in (1, 2) or ident[5] not in (1, 2) or ident[6] != 1:
        raise ElfFormatError(f"ELF class {ident[4]}, data encoding {ident[5]}, version {ident[6]} "
                             f"(known: class 1 or 2, encoding 1 or 2, version 1)")
    wide, order = ident[4] == 2, "<" if ident[5] == 1 else ">"
    layout, header_size, entry_size = (("HHIQQQIHHHHHH", 64, 56) if wide
                                       else ("HHIIIIIHHHHHH", 52, 32))
    if size < header_size:
        raise ElfFormatError(f"the file ({size} bytes) is shorter than an ELF header")
    (kind, machine, version, _, phoff, _, _, _, phentsize, phnum, _, _, _) = struct.unpack(
        order + layout, read(16, header_size - 16))
    if version != 1:
        raise ElfFormatError(f"ELF version {version} (known: 1)")
    if phentsize != entry_size or phnum == 0 or phnum == PN_XNUM or phnum > _MAX_HEADERS:
        raise ElfFormatError(f"{phnum} program headers of {phentsize} bytes (an ordinary "
                             f"library has a few of {entry_size} bytes)")
    segments = _segments(read, size, wide, order, phoff, phnum)
    loads = [s for s in segments if s.kind == PT_LOAD]
    _check_loads(loads, size, page)
    image = ElfImage(wide, order == "<", ident[7], kind, machine, segments, None, size, read)
    dynamics = [s for s in segments if s.kind == PT_DYNAMIC]
    if len(dynamics) > 1:
        raise ElfFormatError(f"it has {len(dynamics)} PT_DYNAMIC program headers (the loader "
                             f"reads the last one only)")
    if not dynamics:
        return image
    entries = _dynamic_entries(read, image, dynamics[0], wide, order)
    return dataclasses.replace(image, dynamic=entries)


def string_at(table: bytes, offset: int) -> str | None:
    """The NUL-terminated string at `offset` of a string table, None when it does not end inside
    the table (the loader would read on past it)."""
    end = table.find(b"\0", offset) if 0 <= offset < len(table) else -1
    return None if end < 0 else table[offset:end].decode("utf-8", "surrogateescape")


@dataclasses.dataclass(frozen=True)
class DynamicSection:
    """What a library's dynamic section asks of the loader (entries split at ':', as written,
    $ORIGIN and all; None: the entry is absent)."""

    needed: tuple[str, ...]
    rpath: tuple[str, ...] | None
    runpath: tuple[str, ...] | None


def read_dynamic_section(handle, name: str) -> DynamicSection | None:
    """The libraries the ELF file open in `handle` (binary, seekable) needs and its search paths,
    as the loader reads them (the last DT_STRTAB counts, like the loader's); None when it is no
    ELF file or has no dynamic section.  This is for reading the system's own libraries: a
    library graphswap is asked to load passes graphswap.native.elf_policy instead.
    ElfFormatError (naming `name`) for one that is malformed."""
    try:
        image = read_elf(*handle_reader(handle))
    except ElfFormatError as exc:
        raise ElfFormatError(f"cannot read the dynamic section of {name}: {exc}") from None
    if image is None or image.dynamic is None:
        return None
    values = {tag: value for tag, value in image.dynamic}   # the last one counts
    wanted = [(tag, value) for tag, value in image.dynamic
              if tag in (DT_NEEDED, DT_RPATH, DT_RUNPATH)]
    if not wanted:
        return DynamicSection((), None, None)
    table = image.read_at(values.get(DT_STRTAB, -1), values.get(DT_STRSZ, 0)) \
        if DT_STRTAB in values and DT_STRSZ in values else None
    if table is None:
        raise ElfFormatError(f"cannot read the dynamic section of {name}: its string table is "
                             f"in no loaded segment")
    strings = {}
    for tag, value in wanted:
        text = string_at(table, value)
        if text is None:
            raise ElfFormatError(f"cannot read the dynamic section of {name}: string offset "
                                 f"{value} is outside its string table")
        strings.setdefault(tag, []).append(text)
    paths = {kind: (tuple(part for value in strings[kind] for part in value.split(":"))
                    if kind in strings else None) for kind in (DT_RPATH, DT_RUNPATH)}
    return DynamicSection(tuple(strings.get(DT_NEEDED, ())), paths[DT_RPATH], paths[DT_RUNPATH])
