"""FP8 multipliers in graphswap's reports and tools: the rewrite report's quantization line names
the FP8 format and scale granularity, and `graphswap kernels check` checks FP8 circuits (C
sources and .npy tables): loading, finite products, determinism, commutativity when claimed,
error metrics against the exact FP8 product, NaN/Inf handling, one report, exit 1 on failure."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import keras
import numpy as np
import pytest
from click.testing import CliRunner

import graphswap
from graphswap.cli import main
from graphswap.kernels import QuantScheme, resolve_kernel
from graphswap.kernels.check import RESULT_PREFIX, child_main, format_result
from graphswap.kernels.fp8 import E4M3, E5M2, decode

MITCHELL = Path(__file__).resolve().parents[1] / "sample_models" / "multipliers" / \
    "fp8_e4m3_mitchell.c"


def _model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((5, 5, 2))
    x = keras.layers.Conv2D(3, 3, name="conv")(inputs)
    x = keras.layers.Flatten()(x)
    return keras.Model(inputs, keras.layers.Dense(2, name="out")(x))


def _quantization_note(report):
    notes = [n for n in report.notes if n.startswith("quantization:")]
    assert len(notes) == 1, report.notes
    return notes[0]


def test_report_names_the_fp8_format_and_scale_granularity():
    model = _model()
    data = np.random.default_rng(1).normal(size=(16, 5, 5, 2)).astype(np.float32)
    _, report = graphswap.rewrite_model(model, kernel="fp8_e4m3", return_report=True)
    assert _quantization_note(report) == (
        "quantization: FP8 E4M3 weights, scale per-channel, FP8 E4M3 activations, one scale "
        "per call (dynamic)")
    _, report = graphswap.rewrite_model(
        model, kernel="fp8_e5m2", return_report=True, calibration_data=data,
        quantization=QuantScheme(granularity="per_tensor").to_config())
    note = _quantization_note(report)
    assert note == ("quantization: FP8 E5M2 weights, scale per-tensor, FP8 E5M2 activations, "
                    "one static scale (calibrated)")
    assert "int8" not in str(report)
    # integer multipliers keep their line
    _, report = graphswap.rewrite_model(model, kernel="mul8s_trunc3", return_report=True)
    assert "symmetric int8 weights per-channel" in _quantization_note(report)


def _check(spec, *extra):
    result = CliRunner().invoke(main, ["kernels", "check", spec, "--json", *extra])
    assert "Traceback" not in result.output
    payload = result.output[result.output.index("{"):]
    return result.exit_code, json.loads(payload)


def _child_check(spec, capsys):
    """The checking child's work, run in this process (no TensorFlow start-up per check): a C
    multiplier's table is still evaluated in a process of its own (crash isolation)."""
    capsys.readouterr()
    assert child_main(spec, None) == 0
    lines = [line for line in capsys.readouterr().out.splitlines()
             if line.startswith(RESULT_PREFIX)]
    assert len(lines) == 1
    result = json.loads(lines[0][len(RESULT_PREFIX):])
    return (0 if result["passed"] else 1), result


def _checks(result):
    return {c["check"]: c for c in result["checks"]}


def test_kernels_check_of_the_mitchell_fp8_source_reports_its_error_metrics(tmp_path):
    source = tmp_path / MITCHELL.name
    shutil.copy(MITCHELL, source)
    code, result = _check(f"fp8_e4m3:{source}")
    assert code == 0 and result["passed"], result
    checks = _checks(result)
    for name in ("loads (compiles, evaluates / reads the table)",
                 "products of finite codes are finite",
                 "deterministic (table evaluated three times)"):
        assert checks[name]["passed"] is True, name
    assert "yes" in checks["commutative (T[a, b] == T[b, a])"]["detail"]
    assert "outputs depending on a NaN/Inf input are NaN: True" in checks["NaN/Inf inputs"]["detail"]
    # the metrics, recomputed from the kernel's table and ml_dtypes-checked decode
    table = resolve_kernel(f"fp8_e4m3:{source}").products_table().astype(np.float64)
    finite = np.isfinite(E4M3.values)
    values = decode(np.flatnonzero(finite), E4M3).astype(np.float64)
    exact = np.multiply.outer(values, values)
    approx = table[np.ix_(finite, finite)]
    nonzero = exact != 0
    relative = np.abs(approx - exact)[nonzero] / np.abs(exact[nonzero])
    metrics = result["fp8_metrics"]
    assert metrics["pairs"] == 254 * 254
    assert metrics["mean_relative_error_percent"] == pytest.approx(relative.mean() * 100)
    assert metrics["max_relative_error_percent"] == pytest.approx(relative.max() * 100)
    assert metrics["max_relative_error_percent"] == pytest.approx(100 / 9)  # x = y = 1/2: 1/9
    assert metrics["exact_pairs_percent"] == pytest.approx((approx == exact).mean() * 100)
    assert metrics["nonzero_for_zero_product"] == 0
    # the readable report (what the command prints without --json): the figures on one line
    readable = format_result(result)
    assert readable.startswith(f"kernel      {MITCHELL.name}") and "all checks passed" in readable
    assert re.search(r"error vs the exact FP8 product +mean relative error 3\.7\d*%, max 11\.11% "
                     r"\(codes 0x03 x 0x03\)", readable), readable


def test_kernels_check_of_an_exact_table(tmp_path, capsys):
    values = E5M2.values.astype(np.float64)
    with np.errstate(invalid="ignore"):
        exact = np.multiply.outer(values, values).astype(np.float32)
    path = tmp_path / "exact.npy"
    np.save(path, exact)          # non-finite entries only in the NaN / inf rows and columns
    code, result = _child_check(f"fp8_e5m2:{path}", capsys)
    assert code == 0 and result["passed"]
    assert result["fp8_metrics"]["max_relative_error_percent"] == 0.0
    assert result["fp8_metrics"]["exact_pairs_percent"] == 100.0
    assert "deterministic (table evaluated three times)" not in _checks(result)   # data, no code


BAD_SOURCES = {  # name: (C body, the check that fails, words of its detail)
    "stateful": ("static unsigned s = 0;\n"
                 "    if (!s) s = (unsigned)time(0) ^ ((unsigned)getpid() << 8) | 1u;\n"
                 "    s = s * 1103515245u + 12345u;\n"
                 "    return (a == 9 && (s >> 16) % 2) ? 1.0f : exact(a, b);",
                 "deterministic (table evaluated three times)", "different products"),
    "lopsided": ("/* claimed commutative */\n"
                 "    return a == 0x38 && b == 0x40 ? 3.0f : exact(a, b);",
                 "commutative (T[a, b] == T[b, a]) as the source claims", "2 of 64516"),
    "infinite": ("return (a == 0x38 && b == 0x40) || (a == 0x40 && b == 0x38) ? 1.0f / 0.0f "
                 ": exact(a, b);",
                 "products of finite codes are finite", "0x38 x 0x40 = inf"),
    "crashing": ("if (a == 200 && b == 3) { volatile int *p = 0; *p = 1; }\n"
                 "    return exact(a, b);",
                 "runs without crashing (stage: evaluating the FP8 multiplier table)", "SIGSEGV"),
}
EXACT_E4M3 = """
/* An E4M3 multiplier (graphswap test). */
#include <stdint.h>
#include <time.h>
#include <unistd.h>
static float value(uint8_t c) {
    int e = (c >> 3) & 15, m = c & 7; float v;
    if ((c & 0x7F) == 0x7F) return 0.0f / 0.0f;
    v = e == 0 ? m / 8.0f / 64.0f : (1.0f + m / 8.0f) * (float)(1 << e) / 128.0f;
    return c & 0x80 ? -v : v;
}
static float exact(uint8_t a, uint8_t b) { return value(a) * value(b); }
float mine(uint8_t a, uint8_t b) {
    BODY
}
"""


@pytest.mark.parametrize("name", sorted(BAD_SOURCES))
def test_kernels_check_fails_bad_fp8_sources_with_one_clear_report(tmp_path, name, capsys):
    body, check, words = BAD_SOURCES[name]
    source = tmp_path / f"{name}.c"
    source.write_text(EXACT_E4M3.replace("BODY", body))
    code, result = _child_check(f"fp8_e4m3:{source}:mine", capsys)
    assert code == 1 and result["passed"] is False
    failed = [c for c in result["checks"] if c["passed"] is False]
    assert [c["check"] for c in failed] == [check], result["checks"]
    assert words in failed[0]["detail"], failed[0]["detail"]


def test_kernels_check_of_bad_fp8_tables_and_missing_files(tmp_path, capsys):
    np.save(tmp_path / "wide.npy", np.zeros((256, 255), np.float32))
    code, result = _child_check(f"fp8_e4m3:{tmp_path / 'wide.npy'}", capsys)
    assert code == 1
    assert result["checks"][0]["check"] == "loads (compiles, evaluates / reads the table)"
    assert "shape (256, 255); allowed: (256, 256)" in result["checks"][0]["detail"]
    table = np.ones((256, 256), np.float32)
    table[0x10, 0x20] = np.nan
    table[0x7F, 0x20] = np.nan      # a NaN code's row: never read, allowed
    np.save(tmp_path / "nan.npy", table)
    code, result = _child_check(f"fp8_e4m3:{tmp_path / 'nan.npy'}", capsys)
    assert code == 1
    failed = [c for c in result["checks"] if c["passed"] is False]
    assert len(failed) == 1 and "1 pairs are not, e.g. 0x10 x 0x20 = nan" in failed[0]["detail"]
    missing = CliRunner().invoke(main, ["kernels", "check", f"fp8_e5m2:{tmp_path / 'no.npy'}"])
    assert missing.exit_code == 1
    assert missing.output.strip().splitlines() == [
        f"Error: FP8 multiplier table not found: {tmp_path / 'no.npy'} (resolved to "
        f"{tmp_path / 'no.npy'}); check the path"]
