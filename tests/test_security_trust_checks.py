"""Trust checks: the pin covers every file a trusted kernel makes graphswap read.

Each test is an attack (or a bad input) that graphswap must refuse, with one clear error:
a header a trusted C source includes, changed after the trust; a library a trusted shared library
needs, replaced; a relative entry in $GRAPHSWAP_TRUSTED_KERNELS; a FIFO given to `trust add`; a
path with control characters in the trust store; a negative or NaN hardware figure in a header.
The attacker's code carries a constructor that writes a marker file the moment it is loaded; the
marker must never appear, and each refusal is one clear error.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

import graphswap
from conftest import HEADER_DIR
from graphswap import kernels, native
from graphswap.cli import main
from graphswap.errors import KernelSpecError, KernelTrustError
from graphswap.kernels import trust as kernel_trust

CANARY = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void graphswap_trust_canary(void) {
    const char *path = getenv("GRAPHSWAP_TEST_CANARY");
    FILE *f = fopen(path ? path : "/tmp/graphswap-test-canary", "a");
    if (f) { fputs("attacker code ran\n", f); fclose(f); }
}
"""


@pytest.fixture()
def marker(tmp_path, monkeypatch):
    """The file the attacker's constructor writes; asserted absent after the test."""
    path = tmp_path / "canary-ran"
    monkeypatch.setenv("GRAPHSWAP_TEST_CANARY", str(path))
    monkeypatch.setenv(kernel_trust.CONFIG_ENV_VAR, str(tmp_path / "config"))
    monkeypatch.delenv(kernel_trust.ENV_VAR, raising=False)
    yield path
    assert not path.exists(), "the attacker's code ran"


def _record(path: Path, spec: str | None = None) -> dict:
    """The kernel record a saved model keeps for `path` (as `convert` writes it)."""
    content = native.read_file(str(path), "kernel file")
    return {"spec": spec or str(path), "path": str(path), "sha256": content.sha256}


def _approved_earlier(path: Path) -> None:
    """The user trusted `path` (its bytes, as they are now) - before this round, `trust add` and
    naming the kernel did exactly this for any file."""
    kernel_trust.approve(native.read_file(str(path), "kernel file"))


def _built(directory: Path, name: str, source: str, *flags: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    src = directory / f"{name}.c"
    src.write_text(source)
    out = directory / f"lib{name}.so"
    subprocess.run(["cc", "-shared", "-fPIC", f"-I{HEADER_DIR}", str(src), "-o", str(out),
                    *flags], check=True, capture_output=True)
    src.unlink()
    return out


def _replace(target: Path, replacement: Path) -> None:
    """The attacker swaps `target` for `replacement` (a new file, as `cp` over a link would)."""
    target.unlink()
    shutil.copy(replacement, target)


# --------------------------------------------------------------------------------------------
# 1. a header a trusted C source includes
# --------------------------------------------------------------------------------------------

HONEST_HEADER = "static inline int helper_offset(void) { return 0; }\n"
EVIL_HEADER = CANARY + "static inline int helper_offset(void) { return 7; }\n"


@pytest.mark.parametrize("form", ["absolute path", "beside it", "absolute path with a space"])
def test_a_changed_header_of_a_trusted_source_is_refused_before_compiling(tmp_path, monkeypatch,
                                                                         marker, form):
    monkeypatch.setenv("GRAPHSWAP_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / ("my sources" if "space" in form else "sources")
    folder.mkdir()
    header = folder / "helper.h"
    header.write_text(HONEST_HEADER)
    include = '"helper.h"' if form == "beside it" else f'"{header}"'
    source = folder / "mul8u_inc.c"
    source.write_text(f"#include <stdint.h>\n#include {include}\n"
                      "uint16_t mul8u_inc(uint8_t a, uint8_t b) "
                      "{ return (uint16_t)(a * b + helper_offset()); }\n")
    record = _record(source)
    _approved_earlier(source)
    header.write_text(EVIL_HEADER)   # the source's bytes (and hash) are unchanged
    with pytest.raises(KernelTrustError) as refused:
        kernels.open_record(record, "layer 'fc'")
    message = str(refused.value)
    shown = '"helper.h"' if form == "beside it" else str(header)
    assert f"{source} includes {shown}" in message
    assert "not one of the compiler's system headers" in message          # what was wrong
    assert "<stdint.h>" in message and "/usr/include" in message          # what is allowed
    assert "Paste what the source needs" in message and "lib.so:SYMBOL" in message  # what to do
    assert "Nothing was compiled" in message
    assert not list((tmp_path / "cache").rglob("*.so"))                   # nothing compiled
    # the user names it directly: the same answer
    with pytest.raises(KernelTrustError, match="not one of the compiler's system headers"):
        kernels.resolve_kernel(str(source))
    assert not list((tmp_path / "cache").rglob("*.so"))


def test_a_source_that_includes_a_header_never_leaves_a_table_to_reuse(tmp_path, monkeypatch,
                                                                       marker):
    """What graphswap keeps of a C source is its table; a source including a header outside the
    system's is refused before one exists, every time, so no table of it (built while the header
    was honest) is there to be reused once the header changes."""
    monkeypatch.setenv("GRAPHSWAP_CACHE_DIR", str(tmp_path / "cache"))
    header = tmp_path / "helper.h"
    header.write_text(HONEST_HEADER)
    source = tmp_path / "mul8u_inc.c"
    source.write_text(f'#include <stdint.h>\n#include "{header}"\n'
                      "uint16_t mul8u_inc(uint8_t a, uint8_t b) "
                      "{ return (uint16_t)(a * b + helper_offset()); }\n")
    _approved_earlier(source)
    for _ in range(2):
        with pytest.raises(KernelTrustError, match=f"includes {header}"):
            kernels.open_record(_record(source), "layer 'fc'")
        assert not list((tmp_path / "cache").rglob("table-*")), "a table was kept"
        header.write_text(EVIL_HEADER)


def test_trust_add_and_list_of_a_source_that_includes_a_header(tmp_path, marker):
    header = tmp_path / "helper.h"
    header.write_text(HONEST_HEADER)
    source = tmp_path / "mul8u_inc.c"
    source.write_text(f'#include <stdint.h>\n#include "{header}"\n'
                      "uint16_t mul8u_inc(uint8_t a, uint8_t b) "
                      "{ return (uint16_t)(a * b + helper_offset()); }\n")
    runner = CliRunner()
    added = runner.invoke(main, ["trust", "add", str(source)])
    assert added.exit_code == 1
    assert added.output.startswith(f"Error: the kernel source {source} includes {header}")
    assert added.output.count("\n") == 1 and "Traceback" not in added.output
    assert kernel_trust.stored_trust() == []
    # an entry stored before this round: listed as refused, not as "same content" alone
    kernel_trust.approve(native.read_file(str(source), "kernel file"), persist=True)
    listed = runner.invoke(main, ["trust", "list"])
    assert listed.exit_code == 0, listed.output
    row = next(line for line in listed.output.splitlines() if str(source) in line)
    assert "same content, but refused: it includes headers" in row


def test_inline_assembly_that_reads_a_file_is_refused(tmp_path, monkeypatch, marker):
    """The assembler reads files too: `.incbin` puts another file's bytes into the library, and
    neither the preprocessor nor the source's hash sees it; in the sandbox it cannot read it."""
    monkeypatch.setenv("GRAPHSWAP_CACHE_DIR", str(tmp_path / "cache"))
    blob = tmp_path / "table.bin"
    blob.write_bytes(bytes(range(256)))
    source = tmp_path / "mul8u_blob.c"
    source.write_text("#include <stdint.h>\n"
                      f'__asm__(".section .rodata\\n.incbin \\"{blob}\\"\\n.previous");\n'
                      "uint16_t mul8u_blob(uint8_t a, uint8_t b) { return (uint16_t)(a * b); }\n")
    _approved_earlier(source)
    with pytest.raises(KernelSpecError) as refused:
        kernels.open_record(_record(source), "layer 'fc'")
    assert f"cannot compile multiplier {source}" in str(refused.value)
    assert str(blob) in str(refused.value)
    assert "read only the approved source and the system's files" in str(refused.value)
    assert not list((tmp_path / "cache").rglob("*.so"))


# --------------------------------------------------------------------------------------------
# 2. a library a trusted shared library needs
# --------------------------------------------------------------------------------------------

NEEDS_DEP = {
    "multiplier lib.so:symbol": """
        #include <stdint.h>
        int dep_value(void);
        uint16_t mul8u_dep(uint8_t a, uint8_t b) { return (uint16_t)(a * b * dep_value()); }
    """,
    "operation-level lib.so": """
        #include "graphswap_kernels.h"
        int dep_value(void);
        GRAPHSWAP_EXPORT int32_t graphswap_abi_version(void) { return GRAPHSWAP_ABI_VERSION; }
        GRAPHSWAP_EXPORT int32_t graphswap_matmul_f32(const float *a, const float *b, float *c,
                                                      int64_t m, int64_t k, int64_t n) {
            for (int64_t i = 0; i < m * n; i++) c[i] = (float)dep_value();
            (void)a; (void)b; (void)k;
            return GRAPHSWAP_OK;
        }
    """,
}


@pytest.mark.parametrize("rpath", ["$ORIGIN", "absolute"])
@pytest.mark.parametrize("kind", list(NEEDS_DEP))
def test_a_replaced_dependency_of_a_trusted_library_never_runs(tmp_path, marker, kind, rpath):
    libdir = tmp_path / "lib"
    dep = _built(libdir, "dep", "int dep_value(void) { return 1; }\n")
    library = _built(libdir, "userkernel", NEEDS_DEP[kind], f"-L{libdir}", "-ldep",
                     f"-Wl,-rpath,{'$ORIGIN' if rpath == '$ORIGIN' else libdir}")
    spec = f"{library}:mul8u_dep" if kind.startswith("multiplier") else str(library)
    record = _record(library, spec)
    _approved_earlier(library)
    _replace(dep, _built(tmp_path / "evil", "dep", CANARY + "int dep_value(void) { return 2; }\n"))
    with pytest.raises(KernelTrustError) as refused:
        kernels.open_record(record, "layer 'fc'")
    message = str(refused.value)
    shown = "$ORIGIN" if rpath == "$ORIGIN" else str(libdir)
    assert re.search(rf"{re.escape(str(library))} is refused: its dynamic section holds "
                     rf"DT_R(UN)?PATH '{re.escape(shown)}'", message)      # what was wrong
    assert "graphswap loads a shared library only if it is an ELF shared object" in message
    assert "link other code into it statically" in message                # what to do
    assert "Nothing was loaded" in message
    # trusting it now is refused the same way
    with pytest.raises(KernelTrustError, match="holds DT_R(UN)?PATH"):
        graphswap.trust(library)


def test_a_library_with_an_rpath_is_refused_before_a_dependency_is_looked_up(tmp_path, marker):
    """DT_RPATH is inherited: the libraries a library needs look up what *they* need in its
    RPATH folders too.  A trusted library that needs only the system's libstdc++, with a
    libgcc_s.so.1 planted in its RPATH folder, is refused for the RPATH itself."""
    import ctypes.util

    if ctypes.util.find_library("stdc++") is None or not shutil.which("g++"):
        pytest.skip("no libstdc++ among the system libraries")
    libdir = tmp_path / "lib"
    library = _built(libdir, "userkernel", NEEDS_DEP["multiplier lib.so:symbol"].replace(
        "* dep_value()", ""), "-Wl,--no-as-needed", "-lstdc++", "-Wl,--disable-new-dtags",
        f"-Wl,-rpath,{libdir}")
    record = _record(library, f"{library}:mul8u_dep")
    _approved_earlier(library)
    planted = _built(tmp_path / "evil", "gcc_s", CANARY + "int gcc_s_value(void) { return 2; }\n")
    shutil.copy(planted, libdir / "libgcc_s.so.1")
    with pytest.raises(KernelTrustError) as refused:
        kernels.open_record(record, "layer 'fc'")
    assert f"its dynamic section holds DT_RPATH '{libdir}'" in str(refused.value)


# --------------------------------------------------------------------------------------------
# 3. a relative entry in $GRAPHSWAP_TRUSTED_KERNELS
# --------------------------------------------------------------------------------------------

def test_a_relative_trusted_kernels_entry_is_refused(tmp_path, monkeypatch, marker):
    """The user trusts "mymul.c" meaning their project's file; a command run in another folder
    (the attacker's download) would trust the attacker's mymul.c there."""
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    evil = downloads / "mymul.c"
    evil.write_text("#include <stdint.h>\n" + CANARY +
                    "uint16_t mul8u_mine(uint8_t a, uint8_t b) { return (uint16_t)(a * b); }\n")
    monkeypatch.chdir(downloads)
    monkeypatch.setenv(kernel_trust.ENV_VAR, "mymul.c")
    with pytest.raises(KernelTrustError) as refused:
        kernels.open_record(_record(evil), "layer 'fc'")
    message = str(refused.value)
    assert "$GRAPHSWAP_TRUSTED_KERNELS holds the relative path 'mymul.c'" in message
    assert "absolute paths or SHA-256 digests" in message and str(evil) in message
    # an absolute entry, and a digest, still trust what they name
    honest = tmp_path / "project" / "mymul.c"
    honest.parent.mkdir()
    honest.write_text("#include <stdint.h>\n"
                      "uint16_t mul8u_mine(uint8_t a, uint8_t b) { return (uint16_t)(a * b); }\n")
    content = native.read_file(str(honest), "kernel file")
    for entry in (str(honest), content.sha256):
        monkeypatch.setenv(kernel_trust.ENV_VAR, entry)
        assert kernel_trust.trusted_by(content.sha256, content.path, content.identity) == \
            kernel_trust.ENV_VAR


# --------------------------------------------------------------------------------------------
# unclear errors
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("what", ["FIFO", "/dev/null"])
def test_trusting_something_that_is_not_a_regular_file_says_so(tmp_path, marker, what):
    if what == "FIFO":
        path = tmp_path / "kernel.so"
        os.mkfifo(path)
        kind = "a FIFO (named pipe)"
    else:
        path, kind = Path("/dev/null"), "a character device"
    with pytest.raises(KernelTrustError) as refused:
        graphswap.trust(path)
    assert str(refused.value) == (
        f"cannot trust {path}: it is {kind}, not a regular file; graphswap trusts kernel files "
        f"(a .c source, a .so library) by the hash of their content. Give the path of the "
        f"kernel file itself")
    added = CliRunner().invoke(main, ["trust", "add", str(path)])
    assert added.exit_code == 1
    assert added.output == f"Error: {refused.value}\n"
    assert "no such file" not in added.output


def test_trust_list_escapes_control_characters_in_stored_paths(tmp_path, marker):
    forged = "kernel.c\ntrusted.c   0123456789abcdef...  2024-01-01  same content\x1b[2J"
    kernel = tmp_path / forged
    kernel.write_text("/* a kernel */\n")
    runner = CliRunner()
    added = runner.invoke(main, ["trust", "add", str(kernel)])
    assert added.exit_code == 0, added.output
    assert repr(str(kernel)) in added.output and "\x1b" not in added.output
    listed = runner.invoke(main, ["trust", "list"])
    assert listed.exit_code == 0, listed.output
    assert "\x1b" not in listed.output
    assert not any(line.startswith("trusted.c") for line in listed.output.splitlines())
    assert repr(str(kernel)) in listed.output
    removed = runner.invoke(main, ["trust", "remove", str(kernel)])
    assert removed.exit_code == 0 and repr(str(kernel)) in removed.output
    assert removed.output.count("\n") == 1


@pytest.mark.parametrize("value", ["-0.391", "nan", "-inf", "1e999"])
def test_a_negative_or_nan_hardware_figure_in_a_header_is_refused(tmp_path, monkeypatch, marker,
                                                                  value):
    monkeypatch.setenv("GRAPHSWAP_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "mul8u_neg.c"
    source.write_text(f"#include <stdint.h>\n// MAE% = 0\n// PDK45_PWR = {value} mW\n"
                      "uint16_t mul8u_neg(uint8_t a, uint8_t b) { return (uint16_t)(a * b); }\n")
    with pytest.raises(KernelSpecError) as refused:
        kernels.resolve_kernel(str(source))
    assert str(refused.value) == (
        f"{source}: its header says 'PDK45_PWR = {value}'; a hardware figure (PDK45_PWR in mW, "
        f"PDK45_AREA, PDK45_DELAY) must be a finite number >= 0. Correct that line of the "
        f"header, or remove it and give the figure another way (sweep --power, a metrics table "
        f"for explore)")
    assert not list((tmp_path / "cache").rglob("*.so"))   # refused when the header is read
    # a study over a circuit library names the file and the value (it used to say "None")
    from graphswap.research.exploration import circuits

    with pytest.raises(graphswap.GraphswapError, match=f"PDK45_PWR = {value}'"):
        circuits.load_library([str(source)])
