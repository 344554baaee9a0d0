"""`graphswap kernels check` runs the kernel in a child process: crashes, hangs, out-of-bounds writes,
non-determinism and non-re-entrancy become failed checks, never a dead command line."""

import json

import numpy as np
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
    assert not result["passed"] and not result.get("crashed")
    # nothing more is run on unguarded buffers: it could corrupt the checking process
    further = [c for c in result["checks"] if c["check"] == "further checks"]
    assert further and "skipped: the kernel writes outside its output" in further[0]["detail"]


def test_stateful_multiplier_library_is_not_deterministic(tmp_path):
    library = compile_library(tmp_path, "stateful", """
        #include <stdint.h>
        static unsigned calls = 0;
        uint16_t mul8u_drift(uint8_t a, uint8_t b) { calls++; return (uint16_t)(a * b + (calls > 65536)); }
    """)
    result = check_kernel(f"{library}:mul8u_drift")
    failed = {c["check"] for c in result["checks"] if c["passed"] is False}
    assert "deterministic (table evaluated three times)" in failed


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


def test_out_of_range_results_fail_the_check_naming_the_operands(tmp_path):
    """A mul8u returning 70000 at 200x200, or a uint64_t result of 2**64 - 5, is no 8x8-bit
    product: a FAIL naming the operands, exit 1 (it used to pass, the table holding 70000 and -5)."""
    cases = {"mul8u_big": ("if (A == 200 && B == 200) return 70000;",
                           "mul8u_big(200, 200) = 70000"),
             "mul8u_neg": ("if (A == 3 && B == 7) return (uint64_t)-5;",
                           "mul8u_neg(3, 7) = 18446744073709551611 (2**64 - 5; -5 if read as "
                           "int64)")}
    for name, (statement, named) in cases.items():
        source = tmp_path / f"{name}.c"
        source.write_text(f"#include <stdint.h>\nuint64_t {name}(const uint64_t B, const uint64_t A)"
                          f"\n{{\n    {statement}\n    return A * B;\n}}\n")
        result = CliRunner().invoke(main, ["kernels", "check", str(source), "--json"])
        assert result.exit_code == 1, result.output
        payload = json.loads(result.output)
        failed = {c["check"]: c["detail"] for c in payload["checks"] if c["passed"] is False}
        assert named in failed["results are 8x8-bit products"]
        assert not payload["passed"]


def test_compiler_output_is_part_of_the_report(tmp_path):
    source = tmp_path / "bad.c"
    source.write_text("#include <stdint.h>\nuint16_t mul8u_bad(uint8_t a, uint8_t b)\n{\n"
                      "    return a * undefined_thing;\n}\n")
    text = CliRunner().invoke(main, ["kernels", "check", str(source)])
    assert text.exit_code == 1
    assert "[FAIL] loads (compiles, links, evaluates)" in text.output
    # the compiler's own diagnostic, naming the user's file (not the private copy) and the line
    assert f"{source}:4:" in text.output and "undefined_thing" in text.output
    assert "error" in text.output
    payload = json.loads(CliRunner().invoke(main, ["kernels", "check", str(source),
                                                   "--json"]).output)
    detail = payload["checks"][0]["detail"]
    assert "undefined_thing" in detail and f"{source}:4:" in detail and "\n" in detail


SEGFAULT_AT_200_3 = """
    #include <stdint.h>
    uint16_t mul8u_boom(uint8_t a, uint8_t b) {
        if (a == 200 && b == 3) { volatile int *p = 0; *p = 1; }
        return (uint16_t)(a * b);
    }
"""


def test_a_crashing_multiplier_is_reported_not_fatal(tmp_path):
    """convert, evaluate, sweep and the API evaluate a user's multiplier in a child process: a
    segfault is one error naming the signal and the stage, and graphswap goes on living."""
    import textwrap

    import keras

    import graphswap
    from graphswap.errors import KernelCrashError
    from conftest import SAMPLE_DATA, SAMPLE_MODEL

    source = tmp_path / "mul8u_boom.c"
    source.write_text(textwrap.dedent(SEGFAULT_AT_200_3))
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(KernelCrashError, match=r"crashed with SIGSEGV \(11\) while evaluating its "
                                               r"table \(first operand 200; 200 of 256 rows done\)"):
        graphswap.rewrite_model(model, kernel=str(source))
    runner = CliRunner()
    commands = {
        "convert": ["convert", str(SAMPLE_MODEL), "--kernel", str(source), "-o",
                    str(tmp_path / "out.keras")],
        "evaluate": ["evaluate", str(SAMPLE_MODEL), "--data", str(SAMPLE_DATA), "--kernel",
                     str(source)],
        "sweep": ["sweep", str(SAMPLE_MODEL), "--data", str(SAMPLE_DATA), "--kernel", str(source),
                  "-o", str(tmp_path / "map.json")],
    }
    for name, args in commands.items():
        result = runner.invoke(main, args)
        assert result.exit_code == 1, (name, result.output)
        assert result.output.startswith("Error: ") and "Traceback" not in result.output, name
        assert "mul8u_boom crashed with SIGSEGV" in result.output, name
        assert "first operand 200" in result.output, name
    assert not (tmp_path / "out.keras").exists() and not (tmp_path / "map.json").exists()


def test_a_hanging_multiplier_is_killed_when_it_is_resolved(tmp_path, monkeypatch):
    from graphswap import kernels
    from graphswap.errors import KernelCrashError
    from graphswap.multipliers import evaluation

    monkeypatch.setattr(evaluation, "EVALUATION_TIMEOUT", 8.0)
    source = tmp_path / "mul8u_stuck.c"
    source.write_text("#include <stdint.h>\nuint16_t mul8u_stuck(uint8_t a, uint8_t b) {\n"
                      "    volatile int spin = 1;\n    if (a == 7) while (spin) {}\n"
                      "    return (uint16_t)(a * b);\n}\n")
    with pytest.raises(KernelCrashError, match=r"did not finish within 8 s while evaluating its "
                                               r"table \(first operand 7; 7 of 256 rows done\): it "
                                               r"hangs"):
        kernels.resolve_multiplier(str(source))


def test_published_circuit_properties_are_warnings_not_failures(tmp_path):
    """f(0, 0) = 32 is what EvoApproxLib's mul8u_2AC computes: kernels check says so and passes."""
    source = tmp_path / "mul8u_OFS.c"
    source.write_text("#include <stdint.h>\nuint16_t mul8u_OFS(uint8_t A, uint8_t B)\n{\n"
                      "  return (uint16_t)((A * B) | 32);\n}\n")
    result = CliRunner().invoke(main, ["kernels", "check", str(source)])
    assert result.exit_code == 0, result.output
    assert "[warn] f(a, 0) = 0" in result.output and "[warn] f(0, b) = 0" in result.output
    assert "f(0, 0) = 32" in result.output
    assert result.output.rstrip().endswith("all checks passed (2 warnings)")


SHARED_SCRATCH_LIBRARY = """
    #include "graphswap_kernels.h"
    #include <stdlib.h>
    #include <string.h>
    GRAPHSWAP_EXPORT int32_t graphswap_abi_version(void) { return GRAPHSWAP_ABI_VERSION; }
    /* NOT re-entrant: one malloc'ed scratch buffer shared by every call */
    static float *scratch = 0;
    static int64_t capacity = 0;
    GRAPHSWAP_EXPORT int32_t graphswap_matmul_f32(const float *a, const float *b, float *c,
                                                  int64_t m, int64_t k, int64_t n) {
        if (capacity < m * n) {
            free(scratch);
            scratch = malloc(sizeof(float) * (size_t)(m * n));
            capacity = m * n;
        }
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double s = 0;
                for (int64_t p = 0; p < k; p++) s += (double)a[i * k + p] * b[p * n + j];
                scratch[i * n + j] = (float)s;
            }
        memcpy(c, scratch, sizeof(float) * (size_t)(m * n));
        return GRAPHSWAP_OK;
    }
"""


def test_reentrancy_check_is_deterministic_in_what_it_detects(tmp_path):
    """The same shape on several threads, each with its own values, against a sequential
    reference: a shared scratch buffer fails every time, a re-entrant library passes every time
    (the old check gave each thread another shape, and mostly passed the scratch library)."""
    from graphswap.kernels.check import reentrancy_check
    from graphswap.native import load_library

    def inputs(thread, rows):
        rng = np.random.default_rng(thread)
        return (rng.standard_normal((rows, 96)).astype(np.float32),
                rng.standard_normal((96, 40)).astype(np.float32))

    shared = load_library(compile_library(tmp_path / "shared", "scratch", SHARED_SCRATCH_LIBRARY))
    good = load_library(compile_library(tmp_path / "good", "good", MATMUL_ONLY_LIBRARY))
    for _ in range(5):
        passed, detail = reentrancy_check(shared.matmul_f32, inputs)
        assert passed is False and "not re-entrant" in detail, detail
        passed, detail = reentrancy_check(good.matmul_f32, inputs, budget_s=0.5)
        assert passed is True, detail
    result = CliRunner().invoke(main, ["kernels", "check", str(tmp_path / "shared" /
                                                               "libscratch.so")])
    assert result.exit_code == 1
    assert "[FAIL] re-entrant (concurrent calls equal sequential)" in result.output
