"""Security: a shared library loads only if its ELF file passes graphswap's allowlist.

Trust is of the SHA-256 of a library's own bytes; the dynamic loader also loads what the library's
dynamic section asks for.  An adversarial review found three ways around a checker that read the
file otherwise than glibc's loader: an auxiliary filtee (DT_AUXILIARY / DT_FILTER, never read by
the checker, loaded by glibc - a missing one ignored, so it can be planted after the approval),
$ORIGIN (graphswap loads a private copy through /proc/self/fd/N, so for the loader
$ORIGIN/../../.. is /), and a second DT_STRTAB (the checker read the first, glibc reads the last).
Each attack here is real - the crafted library, loaded directly through /proc/self/fd as graphswap
loads it, runs the attacker's constructor - and graphswap refuses it, through the public API, with
one KernelTrustError naming the entry, before anything runs: the constructor writes a canary file
that must never appear.  A seeded fuzz of dynamic sections checks that whatever is not on the
allowlist, or is inconsistent, is refused (and nothing else raised), and that ordinary libraries
still load.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import graphswap
from conftest import HEADER_DIR
from graphswap import kernels, native
from graphswap.errors import KernelTrustError
from graphswap.kernels import trust as kernel_trust
from graphswap.native import FileContent, sha256_of
from graphswap.native import dependencies
from graphswap.native.dependencies import check_library_dependencies
from graphswap.native.elf_policy import ALLOWED_TAGS, MACHINE_TAGS, host

CANARY = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void graphswap_allowlist_canary(void) {
    const char *path = getenv("GRAPHSWAP_TEST_CANARY");
    FILE *f = fopen(path ? path : "/tmp/graphswap-test-canary", "a");
    if (f) { fputs("attacker code ran\n", f); fclose(f); }
}
int dep_value(void) { return 2; }
"""

#: the kernels a user builds: a scalar multiplier (`lib.so:SYMBOL`), an operation-level library
SOURCES = {
    "multiplier lib.so:SYMBOL": """
        #include <stdint.h>
        uint16_t mul8u_plain(uint8_t a, uint8_t b) { return (uint16_t)(a * b); }
    """,
    "operation-level lib.so": """
        #include "graphswap_kernels.h"
        GRAPHSWAP_EXPORT int32_t graphswap_abi_version(void) { return GRAPHSWAP_ABI_VERSION; }
        GRAPHSWAP_EXPORT int32_t graphswap_matmul_f32(const float *a, const float *b, float *c,
                                                      int64_t m, int64_t k, int64_t n) {
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < n; j++) {
                    float s = 0.0f;
                    for (int64_t p = 0; p < k; p++) s += a[i * k + p] * b[p * n + j];
                    c[i * n + j] = s;
                }
            return GRAPHSWAP_OK;
        }
    """,
}
KINDS = list(SOURCES)

#: the allowlist as specified (graphswap.native.elf_policy.ALLOWED_TAGS must say the same)
SPEC_ALLOWED = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 16, 17, 18, 19, 20, 21, 22, 23,
                24, 25, 26, 27, 28, 30, 32, 33, 35, 36, 37, 0x6FFFFEF5, 0x6FFFFEF6, 0x6FFFFEF7,
                0x6FFFFFF0, 0x6FFFFFF9, 0x6FFFFFFA, 0x6FFFFFFB, 0x6FFFFFFC, 0x6FFFFFFD,
                0x6FFFFFFE, 0x6FFFFFFF}
REFUSED_BY_NAME = {15: "DT_RPATH", 29: "DT_RUNPATH", 0x7FFFFFFD: "DT_AUXILIARY",
                   0x7FFFFFFF: "DT_FILTER", 0x6FFFFEFC: "DT_AUDIT", 0x6FFFFEFB: "DT_DEPAUDIT",
                   0x6FFFFEFA: "DT_CONFIG"}
DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_SONAME = 0, 1, 5, 10, 14
DT_DEBUG, DT_FLAGS, DT_FLAGS_1 = 21, 30, 0x6FFFFFFB

needs_64_bit_little_endian = pytest.mark.skipif(
    host()[1:] != (True, True) or host()[0] is None,
    reason="the byte patching here is written for 64-bit little-endian ELF")


@pytest.fixture()
def marker(tmp_path, monkeypatch):
    """The file the attacker's constructor writes; asserted absent after the test."""
    path = tmp_path / "canary-ran"
    monkeypatch.setenv("GRAPHSWAP_TEST_CANARY", str(path))
    monkeypatch.setenv(kernel_trust.CONFIG_ENV_VAR, str(tmp_path / "config"))
    monkeypatch.setenv("GRAPHSWAP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(kernel_trust.ENV_VAR, raising=False)
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    yield path
    assert not path.exists(), "the attacker's code ran"


def _built(directory: Path, name: str, source: str, *flags: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    src = directory / f"{name}.c"
    src.write_text(textwrap.dedent(source))
    out = directory / f"lib{name}.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", f"-I{HEADER_DIR}", str(src), "-o",
                    str(out), *flags], check=True, capture_output=True)
    src.unlink()
    return out


def _runs_canary(library: Path, tmp_path: Path) -> bool:
    """Whether loading `library` as graphswap loads it (dlopen of /proc/self/fd/N, in a fresh
    process) runs the attacker's constructor: the attack is real."""
    proof = tmp_path / "proof-canary"
    proof.unlink(missing_ok=True)
    code = ("import ctypes, os, sys\nfd = os.open(sys.argv[1], os.O_RDONLY)\n"
            "try:\n    ctypes.CDLL(f'/proc/self/fd/{fd}')\nexcept OSError:\n    pass\n")
    subprocess.run([sys.executable, "-I", "-c", code, str(library)], capture_output=True,
                   env={**os.environ, "GRAPHSWAP_TEST_CANARY": str(proof)}, timeout=60)
    ran = proof.exists()
    proof.unlink(missing_ok=True)
    return ran


def _approved(path: Path) -> None:
    """The user trusted `path` by the hash of its bytes (as `trust add` did before this round)."""
    kernel_trust.approve(native.read_file(str(path), "kernel file"))


def _spec(kind: str, library: Path) -> str:
    return f"{library}:mul8u_plain" if kind.startswith("multiplier") else str(library)


def _refused_everywhere(kind: str, library: Path) -> str:
    """The refusal of a library trusted by hash, loaded through the public API (as the user names
    it, and as a saved model's record names it), and of trusting it anew: one message."""
    _approved(library)
    spec = _spec(kind, library)
    with pytest.raises(KernelTrustError) as named:
        if kind.startswith("multiplier"):
            kernels.resolve_multiplier(spec)
        else:
            kernels.resolve_kernel(spec)
    content = native.read_file(str(library), "kernel file")
    with pytest.raises(KernelTrustError) as recorded:
        kernels.open_record({"spec": spec, "path": str(library), "sha256": content.sha256},
                            "layer 'fc'")
    with pytest.raises(KernelTrustError) as trusted:
        graphswap.trust(library)
    message = str(named.value)
    assert f"{library} is refused: " in message
    assert "graphswap loads a shared library only if it is an ELF shared object" in message
    assert "Nothing was loaded" in message
    assert "Rebuild it as an ordinary shared library with `cc -shared -fPIC ...`" in message
    assert "link other code into it statically" in message
    assert str(recorded.value).split(" is refused: ")[1] == message.split(" is refused: ")[1]
    assert str(trusted.value).split(" is refused: ")[1] == message.split(" is refused: ")[1]
    assert not list((library.parent.parent / "cache").rglob("verified/*/*"))  # no private copy
    return message


# --------------------------------------------------------------------------------------------
# 1. filtees: DT_AUXILIARY (-Wl,-f) and DT_FILTER (-Wl,-F)
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flag, entry", [("-f", "DT_AUXILIARY"), ("-F", "DT_FILTER")])
@pytest.mark.parametrize("kind", KINDS)
def test_a_filtee_planted_after_the_approval_never_runs(tmp_path, marker, kind, flag, entry):
    filtee = tmp_path / "elsewhere" / "libfiltee.so"
    library = _built(tmp_path / "lib", "userkernel", SOURCES[kind], f"-Wl,{flag},{filtee}")
    _approved(library)                     # no DT_NEEDED; the filtee does not exist yet
    filtee.parent.mkdir()
    shutil.copy(_built(tmp_path / "evil", "filtee", CANARY), filtee)   # planted afterwards
    assert _runs_canary(library, tmp_path), "the loader does not load the filtee: no attack"
    message = _refused_everywhere(kind, library)
    assert f"its dynamic section holds {entry} '{filtee}'" in message     # what was wrong
    assert "the loader loads that library as well" in message
    assert "no DT_RPATH, DT_RUNPATH, DT_AUXILIARY, DT_FILTER" in message  # what is allowed


# --------------------------------------------------------------------------------------------
# 2. $ORIGIN, and any other search folder: DT_RPATH, DT_RUNPATH
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tags", ["DT_RUNPATH", "DT_RPATH"])
@pytest.mark.parametrize("folder", ["$ORIGIN/../../..", "$ORIGIN", "absolute"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_search_folder_in_the_library_is_refused(tmp_path, marker, kind, folder, tags):
    libdir = tmp_path / "lib"
    dep = _built(libdir, "dep", "int dep_value(void) { return 1; }\n")
    rpath = str(libdir) if folder == "absolute" else folder
    library = _built(libdir, "userkernel", SOURCES[kind], f"-L{libdir}", "-Wl,--no-as-needed",
                     "-ldep", f"-Wl,-rpath,{rpath}",
                     "-Wl,--enable-new-dtags" if tags == "DT_RUNPATH" else
                     "-Wl,--disable-new-dtags")
    _approved(library)
    shutil.copy(_built(tmp_path / "evil", "dep", CANARY), dep)   # the dependency replaced
    message = _refused_everywhere(kind, library)
    assert f"its dynamic section holds {tags} '{rpath}'" in message
    assert "where $ORIGIN is /proc/self/fd, not the library's folder" in message


def test_origin_is_the_descriptor_folder_for_the_loader(tmp_path, marker):
    """What the review found: loaded as graphswap loads it, $ORIGIN/../../.. is / for glibc."""
    libdir = tmp_path / "lib"
    _built(libdir, "dep", "int dep_value(void) { return 1; }\n")
    library = _built(libdir, "userkernel", SOURCES[KINDS[0]], f"-L{libdir}",
                     "-Wl,--no-as-needed", "-ldep", "-Wl,-rpath,$ORIGIN/../../..")
    code = ("import ctypes, os, sys\nfd = os.open(sys.argv[1], os.O_RDONLY)\n"
            "try:\n    ctypes.CDLL(f'/proc/self/fd/{fd}')\nexcept OSError:\n    pass\n")
    searched = subprocess.run([sys.executable, "-I", "-c", code, str(library)],
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "LD_DEBUG": "libs"}).stderr
    if "find library=libdep.so" not in searched:
        pytest.skip("this loader does not report its search (LD_DEBUG)")
    assert "trying file=/proc/self/fd/../../../libdep.so" in searched
    assert f"trying file={libdir}/libdep.so" not in searched


# --------------------------------------------------------------------------------------------
# 3. a second DT_STRTAB: the checker read the first, the loader reads the last
# --------------------------------------------------------------------------------------------

def _layout(data: bytes):
    """(PT_LOADs [(offset, vaddr, filesz, memsz)], PT_DYNAMIC (offset, vaddr, filesz), all
    dynamic slots [(tag, value)]) of a 64-bit little-endian ELF file, read independently."""
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for index in range(phnum):
        kind, _, offset, vaddr, _, filesz, memsz, _ = struct.unpack_from(
            "<IIQQQQQQ", data, phoff + index * phentsize)
        if kind == 1:
            loads.append((offset, vaddr, filesz, memsz))
        elif kind == 2:
            dynamic = (offset, vaddr, filesz)
    slots = [struct.unpack_from("<qQ", data, dynamic[0] + 16 * i)
             for i in range(dynamic[2] // 16)]
    return loads, dynamic, slots


def _vaddr_of(loads, offset: int) -> int:
    return next(v + offset - o for o, v, size, _ in loads if o <= offset < o + size)


def _offset_of(loads, vaddr: int) -> int:
    return next(o + vaddr - v for o, v, size, _ in loads if v <= vaddr < v + size)


SPARE_TABLE = ('__attribute__((used)) static const char graphswap_spare_table[8192] = '
               '"GRAPHSWAP-SPARE-TABLE";\n')


@needs_64_bit_little_endian
@pytest.mark.parametrize("kind", KINDS)
def test_a_second_string_table_never_loads_its_dependency(tmp_path, marker, kind):
    """The library needs a harmless (missing) library by name in its string table; a copy of the
    table in its read-only data, named by a second DT_STRTAB, names the attacker's library in
    its place.  The loader reads the last DT_STRTAB."""
    stub_name = "libgraphswap_harmless_" + "x" * 200 + ".so"
    stub = _built(tmp_path / "stub", "stub", "int stub_value(void) { return 1; }\n",
                  f"-Wl,-soname,{stub_name}")
    library = _built(tmp_path / "lib", "userkernel", SPARE_TABLE + SOURCES[kind],
                     f"-L{stub.parent}", "-Wl,--no-as-needed", "-lstub")
    evil = _built(tmp_path / "evil", "evil", CANARY)
    data = bytearray(library.read_bytes())
    loads, dynamic, slots = _layout(data)
    values = dict(slots)
    start = _offset_of(loads, values[DT_STRTAB])
    table = bytes(data[start:start + values[DT_STRSZ]])
    at = next(v for t, v in slots if t == DT_NEEDED and table[v:].startswith(b"libgraphswap_"))
    end = table.index(b"\0", at)
    copy = bytearray(table)
    copy[at:end] = str(evil).encode().ljust(end - at, b"\0")
    spare = data.index(b"GRAPHSWAP-SPARE-TABLE")
    data[spare:spare + len(copy)] = copy
    free = [i for i, (tag, _) in enumerate(slots) if tag == DT_NULL]
    assert len(free) >= 2, "no spare dynamic slot to patch"
    struct.pack_into("<qQ", data, dynamic[0] + 16 * free[0], DT_STRTAB, _vaddr_of(loads, spare))
    library.write_bytes(bytes(data))
    assert _runs_canary(library, tmp_path), "the loader does not read the second table"
    message = _refused_everywhere(kind, library)
    assert "its dynamic section holds 2 DT_STRTAB entries" in message
    assert "the loader takes the last of several" in message


# --------------------------------------------------------------------------------------------
# audit libraries, loader flags
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flag, entry", [("--audit", "DT_AUDIT"), ("--depaudit", "DT_DEPAUDIT")])
@pytest.mark.parametrize("kind", KINDS)
def test_an_audit_library_is_refused(tmp_path, marker, kind, flag, entry):
    auditor = _built(tmp_path / "evil", "auditor", CANARY)
    library = _built(tmp_path / "lib", "userkernel", SOURCES[kind], f"-Wl,{flag},{auditor}")
    message = _refused_everywhere(kind, library)
    assert f"its dynamic section holds {entry} '{auditor}'" in message
    assert "an audit library the loader would load and run" in message


@pytest.mark.parametrize("option, named", [
    ("nodefaultlib", "DF_1_NODEFLIB"), ("global", "DF_1_GLOBAL"),
    ("interpose", "DF_1_INTERPOSE"), ("initfirst", "DF_1_INITFIRST"),
    ("loadfltr", "DF_1_LOADFLTR"), ("nodlopen", "DF_1_NOOPEN")])
def test_loader_flags_that_change_loading_are_refused(tmp_path, marker, option, named):
    library = _built(tmp_path / "lib", "userkernel", SOURCES[KINDS[0]], f"-Wl,-z,{option}")
    message = _refused_everywhere(KINDS[0], library)
    assert f"its DT_FLAGS_1 hold {named}" in message
    assert "allowed: DF_1_NOW, DF_1_NODELETE, DF_1_ORIGIN" in message


def test_a_needed_name_with_a_path_is_refused(tmp_path, marker):
    dep = _built(tmp_path / "evil", "dep", CANARY)
    library = _built(tmp_path / "lib", "userkernel", SOURCES[KINDS[0]], "-Wl,--no-as-needed",
                     str(dep))                 # no soname: DT_NEEDED is the path as given
    message = _refused_everywhere(KINDS[0], library)
    assert f"its DT_NEEDED entry '{dep}' is not a plain library name" in message


# --------------------------------------------------------------------------------------------
# where needed libraries come from: $LD_LIBRARY_PATH, system folders others can write
# --------------------------------------------------------------------------------------------

MATH = """
    #include <stdint.h>
    #include <math.h>
    uint16_t mul8u_plain(uint8_t a, uint8_t b) {
        volatile double x = (double)a * a;
        return (uint16_t)lrint(sqrt(x) * b);
    }
"""


def test_a_needed_library_in_an_ld_library_path_folder_is_refused(tmp_path, marker,
                                                                  monkeypatch):
    library = _built(tmp_path / "lib", "userkernel", MATH, "-lm")
    planted = tmp_path / "mylibs"
    planted.mkdir()
    monkeypatch.setenv("LD_LIBRARY_PATH", f"/nonexistent:{planted}")
    kernels.resolve_multiplier(f"{library}:mul8u_plain")   # nothing there yet: loads
    kernels.clear_cache()
    shutil.copy(_built(tmp_path / "evil", "m", CANARY), planted / "libm.so.6")
    with pytest.raises(KernelTrustError) as refused:
        kernels.resolve_multiplier(f"{library}:mul8u_plain")
    message = str(refused.value)
    assert f"{library} needs libm.so.6, which the dynamic loader would load from " \
           f"{planted / 'libm.so.6'}" in message
    assert f"its $LD_LIBRARY_PATH entry '{planted}'" in message
    assert "outside the system library directories (" in message
    assert "take that folder out of $LD_LIBRARY_PATH" in message


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
@pytest.mark.parametrize("how", ["folder writable by others", "file of another user"])
def test_a_needed_system_library_that_others_can_change_is_refused(tmp_path, marker,
                                                                   monkeypatch, how):
    library = _built(tmp_path / "lib", "userkernel", MATH, "-lm")
    system = tmp_path / "system"
    system.mkdir()
    libm = next(Path(folder, "libm.so.6") for folder in dependencies.system_library_dirs()
                if Path(folder, "libm.so.6").is_file())
    shutil.copy(libm, system / "libm.so.6")
    if how == "folder writable by others":
        system.chmod(0o777)
        reason = f"{system} may be written by its group or by others (permissions 0777)"
    else:
        os.chown(system / "libm.so.6", 1234, 0)
        reason = f"{system / 'libm.so.6'} belongs to uid 1234, not root"
    monkeypatch.setattr(dependencies, "system_library_dirs", lambda: (str(system),))
    with pytest.raises(KernelTrustError) as refused:
        kernels.resolve_multiplier(f"{library}:mul8u_plain")
    message = str(refused.value)
    assert f"{library} needs libm.so.6, which the dynamic loader could load from " \
           f"{system / 'libm.so.6'} in the system library directories" in message
    assert reason in message
    assert "Have the administrator make it and its folders root's" in message


# --------------------------------------------------------------------------------------------
# ordinary libraries still load
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags", [(), ("-lm",), ("-Wl,-z,now", "-Wl,-z,relro"),
                                   ("-Wl,-soname,libmul.so.1", "-Wl,--hash-style=both"),
                                   ("-Wl,-z,nodelete",), ("-fopenmp",)])
def test_an_ordinary_library_loads_and_works(tmp_path, marker, flags):
    """What the README tells users to build: `cc -O2 -shared -fPIC mul.c -o libmul.so`."""
    library = _built(tmp_path / "lib", "mul", MATH if "-lm" in flags else SOURCES[KINDS[0]],
                     *flags)
    assert graphswap.trust(library) == sha256_of(library.read_bytes())
    table = kernels.lut(f"{library}:mul8u_plain")
    a, b = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
    np.testing.assert_array_equal(np.asarray(table).reshape(256, 256), a * b)


def test_an_ordinary_operation_level_library_loads_and_works(tmp_path, marker):
    library = _built(tmp_path / "lib", "opkernel", SOURCES[KINDS[1]], "-lm")
    kernel = kernels.resolve_kernel(str(library))
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(kernel.library.matmul_f32(a, b), a @ b)


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
def test_an_ordinary_cxx_library_passes(tmp_path):
    source = tmp_path / "mul.cc"
    source.write_text('#include <cstdint>\n#include <vector>\nextern "C" uint16_t '
                      "mul8u_plain(uint8_t a, uint8_t b) { std::vector<int> v(a, b); "
                      "int s = 0; for (int x : v) s += x; return (uint16_t)s; }\n")
    library = tmp_path / "libmul.so"
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", str(source), "-o", str(library)],
                   check=True, capture_output=True)
    data = library.read_bytes()
    check_library_dependencies(FileContent(str(library), sha256_of(data), data))


def test_the_allowlist_is_the_specified_one():
    assert set(ALLOWED_TAGS) == SPEC_ALLOWED
    assert not set(REFUSED_BY_NAME) & set(ALLOWED_TAGS)


# --------------------------------------------------------------------------------------------
# fuzz: dynamic sections mutated at random
# --------------------------------------------------------------------------------------------

FUZZ_SOURCE = """
    #include <stdint.h>
    #include <math.h>
    uint16_t mul8u_plain(uint8_t a, uint8_t b) {
        volatile double x = (double)a * a;
        return (uint16_t)lrint(sqrt(x) * b);
    }
"""


@pytest.fixture(scope="module")
def fuzz_base(tmp_path_factory):
    directory = tmp_path_factory.mktemp("fuzz")
    library = _built(directory, "fuzzbase", FUZZ_SOURCE, "-lm", "-Wl,-soname,libfuzzbase.so",
                     "-Wl,-z,now")
    return library.read_bytes()


def _check(data: bytes) -> str:
    """'accepted' or 'refused' (KernelTrustError); any other exception propagates."""
    try:
        check_library_dependencies(FileContent("/fuzz/libfuzz.so", sha256_of(data), data))
    except KernelTrustError:
        return "refused"
    return "accepted"


class Mutator:
    """One random variant of the base library: (bytes, expected) with expected 'refused',
    'accepted' or 'either' (a valid in-table string chosen at random as a needed name)."""

    def __init__(self, base: bytes, rng: random.Random):
        self.base, self.rng = base, rng
        self.loads, self.dynamic, self.slots = _layout(base)
        self.used = [i for i, (tag, _) in enumerate(self.slots) if tag != DT_NULL]
        self.used = self.used[:next((n for n, i in enumerate(self.used) if i != n),
                                    len(self.used))]
        self.free = list(range(len(self.used), len(self.slots) - 1))
        values = dict(self.slots[i] for i in self.used)
        self.strtab, self.strsz = values[DT_STRTAB], values[DT_STRSZ]
        start = _offset_of(self.loads, self.strtab)
        self.table = base[start:start + self.strsz]
        self.string_starts = [0] + [i + 1 for i, c in enumerate(self.table[:-1]) if c == 0]
        machine = host()[0]
        self.allowed = SPEC_ALLOWED | set(MACHINE_TAGS.get(machine, {}))
        self.load_end = max(o + size for o, _, size, _ in self.loads)

    def _with_slots(self, slots) -> bytes:
        data = bytearray(self.base)
        for index, (tag, value) in slots.items():
            struct.pack_into("<qQ", data, self.dynamic[0] + 16 * index, tag, value)
        return bytes(data)

    def _slot(self) -> int:
        """A slot to write an extra entry to: the first DT_NULL when another follows it (the
        loader reads up to the first DT_NULL), else one of the used ones."""
        return self.free[0] if self.free else self.rng.choice(self.used)

    def _in_file(self, address: int, size: int) -> bool:
        return any(v <= address and address + size <= v + s for _, v, s, _ in self.loads)

    def unknown_tag(self):
        rng = self.rng
        while True:
            tag = rng.choice([rng.choice(list(REFUSED_BY_NAME)), rng.randrange(38, 0x6FFFFDF0),
                              rng.randrange(0x6FFFFDF0, 0x70000000),
                              rng.randrange(0x70000000, 0x80000000),
                              rng.randrange(-2 ** 63, 0), rng.randrange(2 ** 31, 2 ** 63),
                              34, 31, 0x6FFFFDF5, 0x6FFFFEF9, 0x6FFFFDFD, 0x6FFFFEFF])
            if tag not in self.allowed and tag != DT_NULL:
                return tag

    # refused ------------------------------------------------------------------------------
    def add_unknown(self):
        return self._with_slots({self._slot(): (self.unknown_tag(), self.rng.randrange(2 ** 64))
                                 }), "refused"

    def replace_with_unknown(self):
        return self._with_slots({self.rng.choice(self.used): (
            self.unknown_tag(), self.rng.choice([0, 1, self.rng.randrange(2 ** 64)]))}), "refused"

    def duplicate(self):
        index = self.rng.choice([i for i in self.used if self.slots[i][0] != DT_NEEDED])
        tag, value = self.slots[index]
        value = value if self.rng.random() < 0.5 else self.rng.randrange(2 ** 64)
        target = self._slot()
        if target == index:
            return self.duplicate()
        return self._with_slots({target: (tag, value)}), "refused"

    def string_out_of_range(self):
        index = self.rng.choice([i for i in self.used if self.slots[i][0] in (DT_NEEDED,
                                                                             DT_SONAME)])
        value = self.rng.choice([self.strsz, self.strsz + self.rng.randrange(1, 1 << 20),
                                 self.rng.randrange(2 ** 64)])
        return self._with_slots({index: (self.slots[index][0], value)}), "refused"

    def table_elsewhere(self):
        while True:
            address = self.rng.choice([
                self.rng.randrange(2 ** 64), self.rng.randrange(2 ** 32),
                self.loads[-1][1] + self.loads[-1][2] - self.rng.randrange(1, self.strsz),
                self.loads[-1][1] + self.loads[-1][3] + self.rng.randrange(1 << 16)])
            if not self._in_file(address, self.strsz):
                break
        index = next(i for i in self.used if self.slots[i][0] == DT_STRTAB)
        return self._with_slots({index: (DT_STRTAB, address)}), "refused"

    def table_size(self):
        index = next(i for i in self.used if self.slots[i][0] == DT_STRSZ)
        strings = [v for i in self.used for t, v in [self.slots[i]] if t in (DT_NEEDED,
                                                                              DT_SONAME)]
        shortest = max(self.table.index(b"\0", v) + 1 for v in strings)
        size = self.rng.choice([self.rng.randrange(0, shortest), 2 ** 63 + self.rng.randrange(9),
                                self.load_end + self.rng.randrange(1 << 20)])
        if self._in_file(self.strtab, size) and size >= shortest:
            return self.table_size()
        return self._with_slots({index: (DT_STRSZ, size)}), "refused"

    def no_null(self):
        needed = next(self.slots[i] for i in self.used if self.slots[i][0] == DT_NEEDED)
        return self._with_slots({i: needed for i in range(len(self.used), len(self.slots))}), \
            "refused"

    def bad_flags(self):
        tag, allowed = self.rng.choice([(DT_FLAGS_1, 0x1 | 0x8 | 0x80),
                                        (DT_FLAGS, 0x1F)])
        bits = self.rng.randrange(1, 2 ** 64) & ~allowed or 0x800
        index = next((i for i in self.used if self.slots[i][0] == tag), None)
        return self._with_slots({index if index is not None else self._slot(): (tag, bits)}), \
            "refused"

    def truncated(self):
        return self.base[:self.rng.randrange(0, self.load_end)], "refused"

    def header(self):
        data = bytearray(self.base)
        phoff, = struct.unpack_from("<Q", data, 0x20)
        _, phnum = struct.unpack_from("<HH", data, 0x36)
        choice = self.rng.randrange(11)
        if choice == 0:
            struct.pack_into("<H", data, 0x38, self.rng.choice([0, 0xFFFF, 5000, phnum + 4000]))
        elif choice == 1:
            struct.pack_into("<Q", data, 0x20, len(data) + self.rng.randrange(2 ** 40))
        elif choice == 2:
            struct.pack_into("<H", data, 0x12, self.rng.choice([0, 3, 40, 183 if host()[0] != 183
                                                                else 62]))
        elif choice == 3:
            struct.pack_into("<H", data, 0x10, self.rng.choice([0, 1, 2, 4]))
        elif choice == 4:
            data[4] = 1                                    # ELFCLASS32
        elif choice == 5:
            data[5] = 2                                    # big-endian
        else:
            types = [struct.unpack_from("<I", data, phoff + 56 * i)[0] for i in range(phnum)]
            dyn = types.index(2)
            other = next(i for i, t in enumerate(types) if t not in (1, 2))
            if choice == 6:
                struct.pack_into("<I", data, phoff + 56 * dyn, 0)          # no PT_DYNAMIC
            elif choice == 7:
                struct.pack_into("<I", data, phoff + 56 * other, 2)        # a second one
            elif choice == 8:
                struct.pack_into("<I", data, phoff + 56 * other, 3)        # PT_INTERP
            elif choice == 9:   # the dynamic section's offset disagrees with its address
                struct.pack_into("<Q", data, phoff + 56 * dyn + 8, self.dynamic[0] + 16)
            else:               # a loadable segment past the end of the file
                load = types.index(1)
                struct.pack_into("<Q", data, phoff + 56 * load + 32,
                                 len(data) + self.rng.randrange(1, 2 ** 40))
        return bytes(data), "refused"

    # accepted -----------------------------------------------------------------------------
    def permuted(self):
        order = list(self.used)
        self.rng.shuffle(order)
        return self._with_slots({i: self.slots[j] for i, j in zip(self.used, order)}), \
            "accepted"

    def harmless_values(self):
        changes = {}
        for index in self.used:
            tag, _ = self.slots[index]
            if tag == DT_FLAGS_1:
                changes[index] = (tag, self.rng.choice([0, 1, 8, 0x80, 0x89]))
            elif tag == DT_FLAGS:
                changes[index] = (tag, self.rng.randrange(0x20))
            elif tag in (0x6FFFFFF9, 12, 13, 3) and self.rng.random() < 0.5:
                changes[index] = (tag, self.rng.randrange(2 ** 64))
            elif tag == DT_SONAME:
                changes[index] = (tag, self.rng.choice(self.string_starts))
        present = {self.slots[i][0] for i in self.used}
        extra = [t for t in (DT_DEBUG, 22, 24, 16) if t not in present]
        for slot, tag in zip(self.free, self.rng.sample(extra, min(len(extra),
                                                                   len(self.free)))):
            changes[slot] = (tag, self.rng.randrange(2 ** 64))
        return self._with_slots(changes), "accepted"

    def needed_again(self):
        if not self.free:
            return self.permuted()
        needed = next(self.slots[i] for i in self.used if self.slots[i][0] == DT_NEEDED)
        return self._with_slots({self.free[0]: needed}), "accepted"

    def section_headers_cut(self):
        return self.base[:self.rng.randrange(self.load_end, len(self.base) + 1)], "accepted"

    # either -------------------------------------------------------------------------------
    def needed_elsewhere_in_table(self):
        index = next(i for i in self.used if self.slots[i][0] == DT_NEEDED)
        return self._with_slots({index: (DT_NEEDED, self.rng.randrange(self.strsz))}), "either"

    REFUSED = ("add_unknown", "replace_with_unknown", "duplicate", "string_out_of_range",
               "table_elsewhere", "table_size", "no_null", "bad_flags", "truncated", "header")
    ACCEPTED = ("permuted", "harmless_values", "needed_again", "section_headers_cut")


@needs_64_bit_little_endian
def test_fuzzed_dynamic_sections_are_refused_unless_harmless(fuzz_base, monkeypatch):
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    assert _check(fuzz_base) == "accepted"
    rng = random.Random(20240607)
    mutator = Mutator(fuzz_base, rng)
    assert mutator.free, "the base library has no spare dynamic slot"
    names = list(Mutator.REFUSED) * 3 + list(Mutator.ACCEPTED) + ["needed_elsewhere_in_table"]
    seen = {"refused": 0, "accepted": 0, "either": 0}
    for case in range(400):
        name = rng.choice(names)
        data, expected = getattr(mutator, name)()
        try:
            outcome = _check(data)
        except Exception as exc:  # noqa: BLE001 - any other exception fails the test
            raise AssertionError(f"case {case} ({name}): {type(exc).__name__}: {exc}") from exc
        assert expected in ("either", outcome), f"case {case} ({name}): {outcome}"
        seen[expected] += 1
    assert seen["refused"] > 200 and seen["accepted"] > 30
