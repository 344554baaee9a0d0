"""The allowlist a shared library must pass before graphswap loads it (an operation-level `lib.so`,
a `lib.so:SYMBOL` multiplier, once at `trust` and again at every load).

Trust is of the hash of the library's own bytes, and the dynamic loader does more than map them:
it loads what the dynamic section asks for (needed libraries, filtees, audit libraries), from
folders the section names.  A denylist of what graphswap thinks the loader follows misses what
it does not know of, so graphswap loads a library only if its ELF file holds nothing beyond what
graphswap knows to be safe, read as the loader reads it (graphswap.native.elf):

* the header: ELF class, byte order and machine of this machine (x86-64: 64-bit little-endian
  EM_X86_64 = 62; aarch64: EM_AARCH64 = 183; from os.uname().machine), type ET_DYN, OS ABI
  System V or GNU; no PT_INTERP (a library has none); exactly one PT_DYNAMIC;
* the dynamic section: only the tags of ALLOWED_TAGS (what `cc -shared -fPIC` writes for an
  ordinary library, with gcc's and clang's usual options), each at most once but DT_NEEDED.
  Refused by name (REFUSED_TAGS): DT_RPATH and DT_RUNPATH (folders searched for what it needs:
  no $ORIGIN, which is /proc/self/fd for the private copy graphswap loads, nor any other folder),
  DT_AUXILIARY and DT_FILTER (filtees the loader loads as well; a missing auxiliary filtee is
  ignored, so it could be planted after the approval), DT_AUDIT and DT_DEPAUDIT (audit
  libraries), DT_CONFIG (a loader configuration file); any other tag is refused as unknown;
* exactly one DT_STRTAB and one DT_STRSZ (the loader takes the last of several), the table inside
  the file bytes of one loadable segment, every string (DT_NEEDED, DT_SONAME) ending inside it;
* DT_NEEDED only plain names (letters, digits, '.', '_', '+', '-': no '/', no '$'):
  graphswap.native.dependencies looks each up in the system library directories only;
* DT_FLAGS only DF_ORIGIN, DF_SYMBOLIC, DF_TEXTREL, DF_BIND_NOW, DF_STATIC_TLS; DT_FLAGS_1 only
  DF_1_NOW, DF_1_NODELETE, DF_1_ORIGIN (the others change where libraries are looked up -
  DF_1_NODEFLIB -, how symbols bind for other libraries - DF_1_GLOBAL, DF_1_INTERPOSE,
  DF_1_GROUP, DF_1_INITFIRST -, use filters or configuration - DF_1_LOADFLTR, DF_1_CONFALT,
  DF_1_GLOBAUDIT -, or mark something else than a library - DF_1_PIE, DF_1_NOOPEN).

Not checked: the contents of the version sections (DT_VERNEED names libraries that DT_NEEDED
already names; the loader matches them with what it loaded and loads nothing for them).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import struct
import sys

from graphswap.native.elf import (DT_NEEDED, DT_STRSZ, DT_STRTAB, PT_DYNAMIC, PT_INTERP,
                                  ElfFormatError, ElfImage, bytes_reader, read_elf, string_at)

ET_DYN = 3
DT_SONAME, DT_FLAGS, DT_FLAGS_1 = 14, 30, 0x6FFFFFFB

#: tags an ordinary shared library holds, harmless: addresses and sizes of its own tables, code
#: run at load (its own), flags checked below
ALLOWED_TAGS = {
    1: "DT_NEEDED", 2: "DT_PLTRELSZ", 3: "DT_PLTGOT", 4: "DT_HASH", 5: "DT_STRTAB",
    6: "DT_SYMTAB", 7: "DT_RELA", 8: "DT_RELASZ", 9: "DT_RELAENT", 10: "DT_STRSZ",
    11: "DT_SYMENT", 12: "DT_INIT", 13: "DT_FINI", 14: "DT_SONAME", 16: "DT_SYMBOLIC",
    17: "DT_REL", 18: "DT_RELSZ", 19: "DT_RELENT", 20: "DT_PLTREL", 21: "DT_DEBUG",
    22: "DT_TEXTREL", 23: "DT_JMPREL", 24: "DT_BIND_NOW", 25: "DT_INIT_ARRAY",
    26: "DT_FINI_ARRAY", 27: "DT_INIT_ARRAYSZ", 28: "DT_FINI_ARRAYSZ", 30: "DT_FLAGS",
    32: "DT_PREINIT_ARRAY", 33: "DT_PREINIT_ARRAYSZ", 35: "DT_RELRSZ", 36: "DT_RELR",
    37: "DT_RELRENT", 0x6FFFFEF5: "DT_GNU_HASH", 0x6FFFFEF6: "DT_TLSDESC_PLT",
    0x6FFFFEF7: "DT_TLSDESC_GOT", 0x6FFFFFF0: "DT_VERSYM", 0x6FFFFFF9: "DT_RELACOUNT",
    0x6FFFFFFA: "DT_RELCOUNT", 0x6FFFFFFB: "DT_FLAGS_1", 0x6FFFFFFC: "DT_VERDEF",
    0x6FFFFFFD: "DT_VERDEFNUM", 0x6FFFFFFE: "DT_VERNEED", 0x6FFFFFFF: "DT_VERNEEDNUM",
}
#: processor-specific tags, allowed for their machine only: PLT addresses and markers
MACHINE_TAGS = {
    62: {0x70000000: "DT_X86_64_PLT", 0x70000001: "DT_X86_64_PLTSZ",
         0x70000003: "DT_X86_64_PLTENT"},
    183: {0x70000001: "DT_AARCH64_BTI_PLT", 0x70000003: "DT_AARCH64_PAC_PLT",
          0x70000005: "DT_AARCH64_VARIANT_PCS"},
}
_LOOKUP = ("a folder list the loader searches for the libraries it needs before the system "
           "library directories; graphswap loads a private copy of the approved bytes through "
           "/proc/self/fd/N, where $ORIGIN is /proc/self/fd, not the library's folder")
#: tags refused by name: what the loader would read besides the library itself
REFUSED_TAGS = {
    15: ("DT_RPATH", _LOOKUP),
    29: ("DT_RUNPATH", _LOOKUP),
    0x7FFFFFFD: ("DT_AUXILIARY", "an auxiliary filter: the loader loads that library as well, "
                                 "running its code, and ignores it when it is missing, so it "
                                 "could be planted after the approval"),
    0x7FFFFFFF: ("DT_FILTER", "a filter: the loader loads that library as well and takes the "
                              "library's symbols from it"),
    0x6FFFFEFC: ("DT_AUDIT", "an audit library the loader would load and run"),
    0x6FFFFEFB: ("DT_DEPAUDIT", "an audit library the loader would load and run"),
    0x6FFFFEFA: ("DT_CONFIG", "a configuration file the loader would read"),
}
_OTHER_NAMES = {
    34: "DT_SYMTAB_SHNDX", 0x6FFFFDF4: "DT_GNU_FLAGS_1", 0x6FFFFDF5: "DT_GNU_PRELINKED",
    0x6FFFFDF6: "DT_GNU_CONFLICTSZ", 0x6FFFFDF7: "DT_GNU_LIBLISTSZ", 0x6FFFFDF8: "DT_CHECKSUM",
    0x6FFFFDF9: "DT_PLTPADSZ", 0x6FFFFDFA: "DT_MOVEENT", 0x6FFFFDFB: "DT_MOVESZ",
    0x6FFFFDFC: "DT_FEATURE_1", 0x6FFFFDFD: "DT_POSFLAG_1", 0x6FFFFDFE: "DT_SYMINSZ",
    0x6FFFFDFF: "DT_SYMINENT", 0x6FFFFEF8: "DT_GNU_CONFLICT", 0x6FFFFEF9: "DT_GNU_LIBLIST",
    0x6FFFFEFD: "DT_PLTPAD", 0x6FFFFEFE: "DT_MOVETAB", 0x6FFFFEFF: "DT_SYMINFO",
    0x7FFFFFFE: "DT_USED",
}
#: DT_FLAGS: DF_ORIGIN, DF_SYMBOLIC, DF_TEXTREL, DF_BIND_NOW, DF_STATIC_TLS
ALLOWED_FLAGS = 0x1 | 0x2 | 0x4 | 0x8 | 0x10
#: DT_FLAGS_1: DF_1_NOW, DF_1_NODELETE, DF_1_ORIGIN
ALLOWED_FLAGS_1 = 0x1 | 0x8 | 0x80
_FLAG_1_NAMES = ("NOW", "GLOBAL", "GROUP", "NODELETE", "LOADFLTR", "INITFIRST", "NOOPEN",
                 "ORIGIN", "DIRECT", "TRANS", "INTERPOSE", "NODEFLIB", "NODUMP", "CONFALT",
                 "ENDFILTEE", "DISPRELDNE", "DISPRELPND", "NODIRECT", "IGNMULDEF", "NOKSYMS",
                 "NOHDR", "EDITED", "NORELOC", "SYMINTPOSE", "GLOBAUDIT", "SINGLETON", "STUB",
                 "PIE", "KMOD", "WEAKFILTER", "NOCOMMON")
_FLAG_NAMES = ("ORIGIN", "SYMBOLIC", "TEXTREL", "BIND_NOW", "STATIC_TLS")
#: os.uname().machine -> e_machine
MACHINES = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183, "i386": 3, "i486": 3,
            "i586": 3, "i686": 3, "armv6l": 40, "armv7l": 40, "armv8l": 40, "ppc64le": 21,
            "ppc64": 21, "s390x": 22, "riscv64": 243, "loongarch64": 258}
_MACHINE_NAMES = {62: "x86-64", 183: "aarch64", 3: "i386", 40: "ARM", 21: "PowerPC64",
                  22: "s390x", 243: "RISC-V", 258: "LoongArch"}
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_+][A-Za-z0-9._+-]{0,254}")
#: what the refusal says is allowed
ALLOWED_SUMMARY = (
    "an ELF shared object for this machine (ET_DYN, no PT_INTERP) whose dynamic section holds one "
    "string table, DT_NEEDED names of libraries in the system library directories, and only the "
    "other entries an ordinary `cc -shared -fPIC` build writes (graphswap.native.elf_policy."
    "ALLOWED_TAGS: no DT_RPATH, DT_RUNPATH, DT_AUXILIARY, DT_FILTER, DT_AUDIT, DT_DEPAUDIT, "
    "DT_CONFIG, nothing unknown)")


@dataclasses.dataclass(frozen=True)
class AllowedLibrary:
    """What an allowed library asks of the loader: the plain names of the libraries it needs."""

    needed: tuple[str, ...]
    soname: str | None


def host() -> tuple[int | None, bool, bool]:
    """(e_machine or None when unknown, 64-bit, little-endian) of this machine."""
    return (MACHINES.get(os.uname().machine), struct.calcsize("P") == 8,
            sys.byteorder == "little")


def tag_name(tag: int, machine: int | None = None) -> str:
    """The DT_ name of a dynamic tag (its number when graphswap knows no name)."""
    if tag in ALLOWED_TAGS:
        return ALLOWED_TAGS[tag]
    if tag in REFUSED_TAGS:
        return REFUSED_TAGS[tag][0]
    name = MACHINE_TAGS.get(machine, {}).get(tag) or _OTHER_NAMES.get(tag)
    return f"{name} (tag {tag:#x})" if name else f"the unknown tag {tag:#x}"


def _quoted(text: str) -> str:
    return f"'{text}'" if text.isprintable() else repr(text)


def _check_header(image: ElfImage) -> None:
    machine, wide, little = host()
    here = f"{'64' if wide else '32'}-bit {'little' if little else 'big'}-endian"
    there = f"{'64' if image.wide else '32'}-bit {'little' if image.little else 'big'}-endian"
    if (image.wide, image.little) != (wide, little):
        raise ElfFormatError(f"it is a {there} ELF file; this machine loads {here} ones")
    if machine is not None and image.machine != machine:
        raise ElfFormatError(
            f"it is built for machine {image.machine} "
            f"({_MACHINE_NAMES.get(image.machine, 'another processor')}); this machine is "
            f"{os.uname().machine} (e_machine {machine})")
    if image.osabi not in (0, 3):
        raise ElfFormatError(f"its OS ABI is {image.osabi} (known: 0 System V, 3 GNU/Linux)")
    if image.kind != ET_DYN:
        raise ElfFormatError(f"its ELF type is {image.kind}, not ET_DYN ({ET_DYN}, a shared "
                             f"object)")
    if any(s.kind == PT_INTERP for s in image.segments):
        raise ElfFormatError("it has a PT_INTERP program header (an executable names its "
                             "program interpreter there; a library has none)")
    if image.dynamic is None or not any(s.kind == PT_DYNAMIC for s in image.segments):
        raise ElfFormatError("it has no dynamic section (PT_DYNAMIC)")


def _string_table(image: ElfImage, counts, values) -> bytes:
    for tag in (DT_STRTAB, DT_STRSZ):
        if counts[tag] != 1:
            raise ElfFormatError(
                f"its dynamic section holds {counts[tag]} {ALLOWED_TAGS[tag]} entries (exactly "
                f"one is allowed: the loader reads the last of several, a reader the first)")
    address, size = values[DT_STRTAB], values[DT_STRSZ]
    table = image.read_at(address, size) if size <= image.size else None
    if table is None:
        raise ElfFormatError(f"its string table ({size} bytes at address {address:#x}) is not "
                             f"inside the file bytes of a loadable segment")
    return table


def _best_effort_string(image: ElfImage, entries, value: int) -> str:
    """The string at `value` for a message, when the string table can be read at all."""
    counts = collections.Counter(tag for tag, _ in entries)
    try:
        table = _string_table(image, counts, dict(entries))
    except ElfFormatError:
        return f"(string offset {value})"
    text = string_at(table, value)
    return _quoted(text) if text is not None else f"(string offset {value})"


def _check_tags(image: ElfImage, entries) -> None:
    allowed = {**ALLOWED_TAGS, **MACHINE_TAGS.get(image.machine, {})}
    for tag, value in entries:
        if tag in REFUSED_TAGS:
            name, why = REFUSED_TAGS[tag]
            raise ElfFormatError(f"its dynamic section holds {name} "
                                 f"{_best_effort_string(image, entries, value)} ({why})")
    for tag, _ in entries:
        if tag not in allowed:
            raise ElfFormatError(f"its dynamic section holds {tag_name(tag, image.machine)}, "
                                 f"which is not on graphswap's list of entries known to be "
                                 f"harmless")
    counts = collections.Counter(tag for tag, _ in entries)
    for tag, count in counts.items():
        if count > 1 and tag != DT_NEEDED:
            raise ElfFormatError(
                f"its dynamic section holds {count} {allowed[tag]} entries (at most one is "
                f"allowed: the loader takes the last of several, a reader could take the first)")


def _flag_names(bits: int, names) -> str:
    shown = [names[i] if i < len(names) else f"bit {i}" for i in range(64) if bits >> i & 1]
    return ", ".join(shown)


def _check_flags(values) -> None:
    flags = values.get(DT_FLAGS, 0) & ~ALLOWED_FLAGS
    if flags:
        names = _flag_names(flags, ["DF_" + n for n in _FLAG_NAMES])
        raise ElfFormatError(f"its DT_FLAGS hold {names} (allowed: DF_ORIGIN, DF_SYMBOLIC, "
                             f"DF_TEXTREL, DF_BIND_NOW, DF_STATIC_TLS)")
    flags = values.get(DT_FLAGS_1, 0) & ~ALLOWED_FLAGS_1
    if flags:
        raise ElfFormatError(
            f"its DT_FLAGS_1 hold {_flag_names(flags, ['DF_1_' + n for n in _FLAG_1_NAMES])}, "
            f"which change what the loader loads or how it binds (allowed: DF_1_NOW, "
            f"DF_1_NODELETE, DF_1_ORIGIN)")


def check_library(data: bytes) -> AllowedLibrary:
    """The needs of the library whose bytes are `data`, if its ELF file passes the allowlist (see
    the module docstring); ElfFormatError saying what does not, otherwise."""
    image = read_elf(*bytes_reader(data))
    if image is None:
        raise ElfFormatError("it is not an ELF file")
    _check_header(image)
    entries = image.dynamic
    _check_tags(image, entries)
    values = dict(entries)
    table = _string_table(image, collections.Counter(tag for tag, _ in entries), values)
    strings = {}
    for tag, value in entries:
        if tag in (DT_NEEDED, DT_SONAME):
            text = string_at(table, value)
            if text is None:
                raise ElfFormatError(
                    f"its {ALLOWED_TAGS[tag]} entry's string offset {value} is outside its "
                    f"string table ({len(table)} bytes, or the string does not end in it)")
            strings.setdefault(tag, []).append(text)
    needed = tuple(strings.get(DT_NEEDED, ()))
    for name in needed:
        if not _PLAIN_NAME.fullmatch(name):
            raise ElfFormatError(
                f"its DT_NEEDED entry {_quoted(name)} is not a plain library name (a path, a "
                f"$-token or other characters than letters, digits, '.', '_', '+', '-'); the "
                f"libraries it needs are taken from the system library directories only")
    _check_flags(values)
    soname = strings.get(DT_SONAME, [None])[0]
    return AllowedLibrary(needed, soname)
