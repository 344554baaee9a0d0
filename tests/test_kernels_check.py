"""`graphswap kernels check` runs the kernel in a child process: crashes, hangs, out-of-bounds writes,
non-determinism and non-re-entrancy become failed checks, never a dead command line."""

import json

import pytest
from click.testing import CliRunner

from conftest import compile_library
from graphswap.cli import main
from graphswap.kernels import check_kernel
from conftest import MATMUL_ONLY_LIBRARY

CRASHING = {
    "segfault": ("SIGSEGV", "{ volatile int *p = 0; *p = 1; }"),
    "abort": ("SIGABRT", "abort();"),
}


@pytest.mark.parametrize("kind", sorted(CRASHING))
def test_crashing_multiplier_is_a_failed_check(tmp_path, kind):
    signal_name, statement = CRASHING[kind]
    source = tmp_path / f"mul8u_{kind}.c"
    source.write_text(f"""
        #include <stdint.h>
        #include <stdlib.h>
        uint16_t mul8u_{kind}(uint8_t a, uint8_t b) {{
            if (a == 200 && b == 3) {statement}
            return (uint16_t)(a * b);
        }}
    """)
    result = CliRunner().invoke(main, ["kernels", "check", str(source)])
    assert result.exit_code == 1
    assert signal_name in result.output and "runs without crashing" in result.output
    assert "stage: evaluating the multiplier table" in result.output or \
           "stage: resolving the kernel" in result.output
    assert "Traceback" not in result.output


def test_hanging_multiplier_times_out(tmp_path):
    source = tmp_path / "mul8u_hang.c"
    source.write_text("""
        #include <stdint.h>
        uint16_t mul8u_hang(uint8_t a, uint8_t b) {
            volatile int spin = 1;
            if (a == 7) while (spin) {}
            return (uint16_t)(a * b);
        }
    """)
    result = check_kernel(str(source), timeout=60)
    assert not result["passed"]
    assert "hangs (killed)" in result["checks"][0]["detail"]


def test_out_of_bounds_write_is_caught_by_guard_regions(tmp_path):
    scribbler = MATMUL_ONLY_LIBRARY.replace(
        "return GRAPHSWAP_OK;", "c[m * n] = 42.0f;  /* one past the end */\n        return GRAPHSWAP_OK;")
    library = compile_library(tmp_path, "scribble", scribbler)
    result = check_kernel(str(library))
    failed = {c["check"]: c["detail"] for c in result["checks"] if c["passed"] is False}
    assert "no writes outside the output (guard regions)" in failed
    assert not result["passed"]


def test_stateful_multiplier_library_is_not_deterministic(tmp_path):
    library = compile_library(tmp_path, "stateful", """
        #include <stdint.h>
        static unsigned calls = 0;
        uint16_t mul8u_drift(uint8_t a, uint8_t b) { calls++; return (uint16_t)(a * b + (calls > 65536)); }
    """)
    result = check_kernel(f"{library}:mul8u_drift")
    failed = {c["check"] for c in result["checks"] if c["passed"] is False}
    assert "deterministic (table evaluated twice)" in failed


def test_good_operation_level_library_passes_every_check(tmp_path):
    library = compile_library(tmp_path, "good", MATMUL_ONLY_LIBRARY)
    result = CliRunner().invoke(main, ["kernels", "check", str(library), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    checks = {c["check"]: c["passed"] for c in payload["checks"]}
    assert checks["no writes outside the output (guard regions)"] is True
    assert checks["re-entrant (concurrent calls equal sequential)"] is True
    assert checks["deterministic (repeated calls)"] is True


EVOAPPROX_STYLE = """
// Library = EvoApprox8b
// Circuit = mul8u_TEST (written for the test: clears the product's 4 LSBs)
// MAE% = {mae}
// WCE% = {wce}
// EP% = {ep} %
// PDK45_PWR = 0.300 mW
#include <stdint.h>
#include <stdlib.h>
uint64_t mul8u_TEST(const uint64_t B,const uint64_t A)
{{
  uint64_t P = (A * B) & ~(uint64_t)15;
  return P;
}}
"""


def test_evoapprox_file_with_plot(tmp_path):
    import numpy as np

    a = np.arange(256)[:, None]
    exact = a * a.T
    error = exact - (exact & ~15)
    text = EVOAPPROX_STYLE.format(mae=f"{np.abs(error).mean() / 65536 * 100:.4f}",
                                  wce=f"{np.abs(error).max() / 65536 * 100:.4f}",
                                  ep=f"{np.count_nonzero(error) / 65536 * 100:.1f}")
    source = tmp_path / "mul8u_TEST.c"
    source.write_text(text)
    plot = tmp_path / "heat.png"
    result = CliRunner().invoke(main, ["kernels", "check", str(source), "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    assert "all checks passed" in result.output
    assert "header MAE% agrees" in result.output and "header EP% agrees" in result.output
    assert plot.stat().st_size > 5000 and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unknown_or_missing_kernel_is_one_clear_error(tmp_path):
    runner = CliRunner()
    typo = runner.invoke(main, ["kernels", "check", "mul8u_drum44"])
    assert typo.exit_code == 1 and typo.output.startswith("Error: ")
    assert "[FAIL]" not in typo.output
    missing = runner.invoke(main, ["kernels", "check", str(tmp_path / "nope.c")])
    assert missing.exit_code == 1 and "not found" in missing.output
