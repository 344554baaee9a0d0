"""Trust that holds by construction: a C multiplier is compiled and run in a Landlock sandbox, and
every child process graphswap starts runs isolated.

Each test plants an attack on a source the user approved (its bytes, by hash): the approved bytes
make the compiler, the assembler or the preprocessor read another file that could change after
the approval.  The attacker's code writes a marker file when it runs; the marker must never
appear.  None of these attacks is recognised by a scan of the source: the sandbox refuses every
read outside the approved copy and the system's files, whatever the source contains.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from graphswap import kernels, multipliers, native
from graphswap.errors import KernelSpecError, KernelTrustError
from graphswap.kernels import trust as kernel_trust
from graphswap.native import sandbox

pytestmark = pytest.mark.skipif(sandbox.landlock_abi() < 1,
                                reason="needs a kernel with Landlock (Linux >= 5.13)")

#: assembly that, assembled into the multiplier's library, runs a constructor writing the marker
EVIL_ASSEMBLY = r"""
    .section .rodata
marker_path: .string "{marker}"
mode: .string "a"
    .text
run_attacker:
    sub $8, %rsp
    lea marker_path(%rip), %rdi
    lea mode(%rip), %rsi
    call fopen@PLT
    add $8, %rsp
    ret
    .section .init_array,"aw"
    .quad run_attacker
    .text
"""
HARMLESS_ASSEMBLY = "    .text\n"
EXACT = "uint16_t {name}(uint8_t a, uint8_t b) {{ return (uint16_t)(a * b); }}\n"


@pytest.fixture()
def marker(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHSWAP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(kernel_trust.CONFIG_ENV_VAR, str(tmp_path / "config"))
    monkeypatch.delenv(kernel_trust.ENV_VAR, raising=False)
    path = tmp_path / "attacker-ran"
    yield path
    assert not path.exists(), "the attacker's code ran"


def _approved(source: Path) -> native.FileContent:
    content = native.read_file(str(source), "kernel file")
    kernel_trust.approve(content)
    return content


def _exact() -> np.ndarray:
    a = np.arange(256)
    return (a[:, None] * a[None, :]).reshape(-1)


@pytest.mark.parametrize("form", ["a section name", "an asm label", "an .incbin"])
def test_assembler_directives_outside_asm_read_nothing_outside_the_sandbox(tmp_path, marker,
                                                                           monkeypatch, form):
    """No `asm` statement and no #include: the directive reaches the assembler through a
    section name or an asm label (GCC copies them without #APP markers).  The included file is
    harmless when the source is approved and turns into a constructor later: either way the
    assembler is not allowed to read it.  (Unconfined, the changed file's constructor runs.)"""
    included = tmp_path / "innocent.s"
    included.write_text(HARMLESS_ASSEMBLY)
    directive = ".incbin" if form == "an .incbin" else ".include"
    if form == "an asm label":
        head = (f'uint16_t mul8u_x(uint8_t a, uint8_t b) __asm__("mul8u_x\\n{directive} '
                f'\\"{included}\\"\\n#");\n')
    else:
        head = (f'__attribute__((section(".text\\n{directive} \\"{included}\\"\\n#"))) '
                f"uint16_t mul8u_x(uint8_t a, uint8_t b);\n")
    source = tmp_path / "mul8u_x.c"
    source.write_text("#include <stdint.h>\n" + head + EXACT.format(name="mul8u_x"))
    _approved(source)
    for stage in ("as approved", "after the included file changed"):
        with pytest.raises(KernelSpecError) as refused:
            kernels.resolve_multiplier(str(source))
        message = str(refused.value)
        assert f"cannot compile multiplier {source}" in message, stage
        assert f"{included}" in message, stage   # the assembler could not read it
        assert "read only the approved source and the system's files" in message, stage
        included.write_text(EVIL_ASSEMBLY.format(marker=marker))
    assert not list((tmp_path / "cache").rglob("*.so"))
    if form == "a section name":
        # the control: unconfined (a kernel without Landlock, the user accepting the risk) the
        # same approved bytes run the changed file's constructor - the attack is real
        control = tmp_path / "ran-unconfined"
        included.write_text(EVIL_ASSEMBLY.format(marker=control))
        monkeypatch.setattr(sandbox, "landlock_abi", lambda: 0)
        monkeypatch.setenv(sandbox.UNSANDBOXED_VARIABLE, "1")
        monkeypatch.setattr(sandbox, "_warned", False)
        with pytest.warns(RuntimeWarning):
            table = multipliers.evaluate_passes("c", _approved(source), (None,),
                                                [range(256)])[0].table
        np.testing.assert_array_equal(table.reshape(-1), _exact())
        assert control.exists()


def test_a_header_swapped_while_it_is_read_is_never_compiled(tmp_path, marker):
    """A symbolic link that points at the attacker's header while the preprocessor reads it and
    back at <stdint.h> when anything checks: the sandbox does not let the preprocessor read the
    attacker's version at all, whatever the timing.  The link flips all the while."""
    evil = tmp_path / "evil.h"
    evil.write_text('#include <stdint.h>\n#define OFFSET 7\n__attribute__((constructor)) static '
                    'void ran(void) { __builtin_trap(); }\n')
    link = tmp_path / "stdint_link.h"
    link.symlink_to("/usr/include/stdint.h")
    source = tmp_path / "mul8u_hdr.c"
    source.write_text(f'#include "{link}"\n#ifndef OFFSET\n#define OFFSET 0\n#endif\n'
                      "uint16_t mul8u_hdr(uint8_t a, uint8_t b) "
                      "{ return (uint16_t)(a * b + OFFSET); }\n")
    content = _approved(source)
    stop = threading.Event()

    def flip():
        while not stop.is_set():
            for target in (evil, Path("/usr/include/stdint.h")):
                tmp = tmp_path / "link.tmp"
                tmp.unlink(missing_ok=True)
                tmp.symlink_to(target)
                os.replace(tmp, link)
                time.sleep(0.0005)

    flipper = threading.Thread(target=flip)
    flipper.start()
    outcomes = set()
    try:
        for _ in range(12):
            try:
                raw = multipliers.evaluate_passes("c", content, (None,), [range(256)])[0]
                assert np.array_equal(raw.table.reshape(-1), _exact()), "attacker's header read"
                outcomes.add("system header")
            except (KernelTrustError, KernelSpecError) as exc:
                assert "nothing was compiled" in str(exc).lower() or "Permission denied" in \
                    str(exc), str(exc)
                outcomes.add("refused")
    finally:
        stop.set()
        flipper.join()
    assert outcomes   # every attempt either read the system's header or was refused


def test_the_compiled_code_can_write_only_its_private_folder(tmp_path, marker):
    """An approved multiplier runs confined too: its constructor cannot create a file outside the
    sandbox's private folder (here, beside the source), and the table still comes back."""
    target = tmp_path / "written-by-the-multiplier"
    source = tmp_path / "mul8u_writer.c"
    source.write_text("#include <stdint.h>\n#include <stdio.h>\n"
                      "__attribute__((constructor)) static void write_out(void) {\n"
                      f'    FILE *f = fopen("{target}", "w"); if (f) {{ fputs("x", f); '
                      "fclose(f); }\n}\n" + EXACT.format(name="mul8u_writer"))
    _approved(source)
    table = kernels.resolve_multiplier(str(source)).table
    np.testing.assert_array_equal(table.reshape(-1), _exact())
    assert not target.exists()


def test_only_the_table_is_kept(tmp_path, marker):
    source = tmp_path / "mul8u_plain.c"
    source.write_text("#include <stdint.h>\n" + EXACT.format(name="mul8u_plain"))
    _approved(source)
    np.testing.assert_array_equal(kernels.resolve_multiplier(str(source)).table.reshape(-1),
                                  _exact())
    cache = tmp_path / "cache"
    assert not list(cache.rglob("*.so")) and not list(cache.rglob("*.c"))
    assert len(list((cache / "multipliers").rglob("table-*.raw"))) == 1


def test_without_a_sandbox_a_c_source_is_refused_unless_the_user_accepts_the_risk(
        tmp_path, marker, monkeypatch):
    source = tmp_path / "mul8u_nosandbox.c"
    source.write_text("#include <stdint.h>\n" + EXACT.format(name="mul8u_nosandbox"))
    content = _approved(source)
    monkeypatch.setattr(sandbox, "landlock_abi", lambda: 0)
    monkeypatch.delenv(sandbox.UNSANDBOXED_VARIABLE, raising=False)
    with pytest.raises(KernelTrustError) as refused:
        multipliers.evaluate_passes("c", content, (None,), [range(256)])
    message = str(refused.value)
    assert f"cannot compile the multiplier source {source}" in message
    assert "this kernel offers none" in message and "Nothing was compiled" in message
    assert f"{sandbox.UNSANDBOXED_VARIABLE}=1" in message and ".lut" in message
    assert not (tmp_path / "cache" / "multipliers").exists() or \
        not list((tmp_path / "cache" / "multipliers").rglob("table-*"))
    assert "graphswap --compile-c-unsandboxed" in message
    # the command line's option says it for the command it runs
    monkeypatch.setenv(sandbox.UNSANDBOXED_VARIABLE, "0")
    from click.testing import CliRunner

    from graphswap.cli import main
    assert CliRunner().invoke(main, ["--compile-c-unsandboxed", "kernels"]).exit_code == 0
    assert os.environ[sandbox.UNSANDBOXED_VARIABLE] == "1"
    monkeypatch.setattr(sandbox, "_warned", False)
    with pytest.warns(RuntimeWarning, match="compiles and runs C sources unconfined"):
        table = multipliers.evaluate_passes("c", content, (None,), [range(256)])[0].table
    np.testing.assert_array_equal(table.reshape(-1), _exact())


PLANTED_NUMPY = """
import os
open({marker!r}, "a").write("numpy.py from the working folder ran\\n")
raise SystemExit(0)
"""


@pytest.mark.parametrize("spec", ["mul8u_drum4", "a C source"])
def test_kernels_check_imports_nothing_from_the_working_folder(tmp_path, marker, spec):
    """`graphswap kernels check` run in a folder holding a numpy.py: the checking child is
    `python -I` in a folder of its own, so the planted module never runs and the checks really
    pass (its child used to run `python -m ...` in the current folder)."""
    folder = tmp_path / "downloads"
    folder.mkdir()
    (folder / "numpy.py").write_text(PLANTED_NUMPY.format(marker=str(marker)))
    if spec == "a C source":
        (folder / "mul8u_mine.c").write_text("#include <stdint.h>\n" +
                                             EXACT.format(name="mul8u_mine"))
        spec = "mul8u_mine.c"   # relative to the working folder
        kernel_trust.approve(native.read_file(str(folder / spec), "kernel file"), persist=True)
    command = Path(sys.executable).parent / "graphswap"   # the console command users run
    result = subprocess.run([str(command), "kernels", "check", spec], cwd=folder,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "all checks passed" in result.stdout, result.stdout[-3000:]
    assert "deterministic" in result.stdout or spec == "mul8u_drum4"
