"""Multiplier specs: built-in tables vs the papers, EvoApproxLib-style C files of both
signature generations, shared-library symbols, table files, metrics, checks, error messages."""

from __future__ import annotations

import struct
import subprocess

import numpy as np
import pytest

from graphswap import kernels, multipliers
from graphswap.errors import KernelSpecError
from graphswap.kernels import LutKernel

import reference


def signed_values():
    codes = np.arange(256)
    return np.where(codes > 127, codes - 256, codes)


def table_2d(m):
    return m.table.reshape(256, 256).astype(np.int64)


# ---------------------------------------------------------------------------- built-ins

ALL_BUILTINS = sorted(multipliers.builtin_multipliers())


def test_builtin_list_is_complete():
    expected = {f"mul8{s}_{d}" for s in "us" for d in
                ["exact", "mitchell"] + [f"trunc{k}" for k in range(1, 9)] + [f"drum{k}" for k in range(3, 7)]}
    assert set(ALL_BUILTINS) == expected
    assert all(isinstance(v, str) and v for v in multipliers.builtin_multipliers().values())
    assert set(ALL_BUILTINS) <= set(kernels.available_kernels())


@pytest.mark.parametrize("name", ALL_BUILTINS)
def test_builtin_table_matches_published_design(name):
    m = kernels.resolve_multiplier(name)
    assert m.spec == name and m.signed == name.startswith("mul8s")
    assert m.table.dtype == np.int32 and m.table.shape == (65536,)
    np.testing.assert_array_equal(m.table.astype(np.int64), reference.builtin_reference(name))


def test_builtin_spot_values():
    # hand-computed: DRUM-3: 255 -> (111b|1)<<5 = 224; 224*224 = 50176
    assert table_2d(kernels.resolve_multiplier("mul8u_drum3"))[255, 255] == 50176
    # Mitchell: 3*3: k=1, f=0.5 each, f sum = 1 -> 2^(1+1+1) * 1 = 8
    assert table_2d(kernels.resolve_multiplier("mul8u_mitchell"))[3, 3] == 8
    # signed trunc2: -3 * 1 = -3 -> floor to multiple of 4 = -4
    t = table_2d(kernels.resolve_multiplier("mul8s_trunc2"))
    assert t[256 - 3, 1] == -4 and t[3, 1] == 0
    # signed Mitchell is sign-magnitude: f(-3, 3) = -f(3, 3)
    t = table_2d(kernels.resolve_multiplier("mul8s_mitchell"))
    assert t[256 - 3, 3] == -8 and t[256 - 128, 256 - 128] == 16384


@pytest.mark.parametrize("spec,fragment", [
    ("mul8u_drum9", "3 <= k <= 6"), ("mul8s_trunc0", "1 <= k <= 8"), ("mul8u_bogus", "unknown built-in"),
])
def test_bad_builtin_names(spec, fragment):
    with pytest.raises(KernelSpecError, match=fragment):
        kernels.resolve_multiplier(spec)


@pytest.mark.parametrize("spec", ["exact", "bf16", "fp32_m7", "libop.so", "something"])
def test_not_a_multiplier_spec(spec):
    assert kernels.resolve_multiplier(spec) is None


def test_resolve_kernel_gives_lut_kernel():
    kernel = kernels.resolve_kernel("mul8s_drum4")
    assert isinstance(kernel, LutKernel)
    assert kernel.to_config() == {"spec": "mul8s_drum4"}
    assert kernel.hardware_metrics == {}


# ---------------------------------------------------------------------------- C files

LEGACY = """/***
* EvoApproxLib-style test circuit (legacy signature generation).
***/
// MAE% = {mae_pct} %
// MAE = {mae}
// WCE% = {wce_pct} %
// EP% = {ep_pct} %
// MRE% = 1.00 %
// PDK45_PWR = 0.123 mW
// PDK45_AREA = 45.6 um2
// PDK45_DELAY = 0.78 ns
#include <stdint.h>
#include <stdlib.h>

uint64_t mul8u_LEG(const uint64_t B,const uint64_t A)
{{
   uint64_t O;   int avg=0;
   O = A * (B & 0xF0);   /* asymmetric: only B loses its low nibble */
   return O & 0xFFFF;
}}
"""

NEWER_UNSIGNED = """#include <stdint.h>
uint16_t mul8u_NEW(uint8_t A, uint8_t B)
{
  return (uint16_t)(A * (B & 0xF0));
}
"""

NEWER_SIGNED = """#include <stdint.h>
int16_t mul8s_NEW(int8_t A, int8_t B)
{
  return (int16_t)(A * (B & ~3));  /* B floored to a multiple of 4 */
}
"""

MISDECLARED_SIGNED = """#include <stdint.h>
/* a signed circuit declared with unsigned types, as some upstream files are */
uint16_t mul8s_BUG(uint8_t A, uint8_t B)
{
  int16_t p = (int16_t)((int8_t)A * (int8_t)(B & 0xFC));
  return (uint16_t)p;
}
"""


def expected_asym_unsigned():
    a = np.arange(256)[:, None]
    b = np.arange(256)[None, :]
    return a * (b & 0xF0)


def expected_asym_signed():
    v = signed_values()
    return v[:, None] * (v[None, :] & ~3)


def legacy_source(header_ok=True):
    err = np.abs(expected_asym_unsigned() - np.arange(256)[:, None] * np.arange(256)[None, :])
    mae = err.mean()
    values = dict(mae_pct=f"{mae / 65536 * 100:.2f}", mae=f"{mae:.0f}",
                  wce_pct=f"{err.max() / 65536 * 100:.2f}", ep_pct=f"{np.mean(err != 0) * 100:.2f}")
    if not header_ok:
        values["mae_pct"] = "9.99"
    return LEGACY.format(**values)


def test_legacy_generation_operand_order_b_a(tmp_path):
    path = tmp_path / "mul8u_LEG.c"
    path.write_text(legacy_source())
    m = kernels.resolve_multiplier(str(path))
    assert not m.signed and m.name == "mul8u_LEG" and m.kind == "c"
    # first operand goes to parameter A although A is declared second
    np.testing.assert_array_equal(table_2d(m), expected_asym_unsigned())
    assert any("B = second, A = first" in note for note in m.notes)
    assert m.header_metrics["PDK45_PWR"] == pytest.approx(0.123)
    config = m.to_config()
    assert config["path"] == str(path.resolve()) and len(config["sha256"]) == 64
    assert LutKernel(m).hardware_metrics == {"PDK45_PWR": 0.123, "PDK45_AREA": 45.6, "PDK45_DELAY": 0.78}


def test_newer_generation_unsigned_and_signed(tmp_path):
    (tmp_path / "u.c").write_text(NEWER_UNSIGNED)
    (tmp_path / "s.c").write_text(NEWER_SIGNED)
    mu = kernels.resolve_multiplier(str(tmp_path / "u.c"))
    ms = kernels.resolve_multiplier(str(tmp_path / "s.c"))
    assert not mu.signed and ms.signed
    np.testing.assert_array_equal(table_2d(mu), expected_asym_unsigned())
    v = signed_values()
    np.testing.assert_array_equal(table_2d(ms), expected_asym_signed())
    # lut(): rows = first operand, signed rows/cols ordered -128..127
    lut = kernels.lut(str(tmp_path / "s.c"))
    order = np.argsort(v)
    np.testing.assert_array_equal(lut, expected_asym_signed()[np.ix_(order, order)])
    assert lut[0, 128] == 0 and lut[0, 129] == 0 and lut[0, 132] == -128 * 4


def test_misdeclared_signed_file_is_detected(tmp_path):
    path = tmp_path / "mul8s_BUG.c"
    path.write_text(MISDECLARED_SIGNED)
    m = kernels.resolve_multiplier(str(path))
    assert m.signed
    assert any("declared with unsigned" in note for note in m.notes)
    np.testing.assert_array_equal(table_2d(m), expected_asym_signed())
    assert table_2d(m)[255, 4] == -4  # (-1) * 4, not 255 * 4 and not 65532
    report = kernels.check(str(path))
    assert next(c for c in report["checks"] if c["check"] == "signedness plausibility")["passed"]


def test_c_function_selection(tmp_path):
    path = tmp_path / "two.c"
    path.write_text(NEWER_UNSIGNED + NEWER_SIGNED.replace("#include <stdint.h>", ""))
    with pytest.raises(KernelSpecError, match="several candidate multipliers.*two.c:FUNCTION"):
        kernels.resolve_multiplier(str(path))
    m = kernels.resolve_multiplier(f"{path}:mul8s_NEW")
    assert m.signed and m.spec.endswith(":mul8s_NEW")
    with pytest.raises(KernelSpecError, match="no two-operand function named 'nope'"):
        kernels.resolve_multiplier(f"{path}:nope")


def test_c_that_does_not_compile_shows_compiler_message(tmp_path):
    path = tmp_path / "broken.c"
    path.write_text("#include <stdint.h>\nuint16_t mul8u_X(uint8_t A, uint8_t B)\n{\n  return A * undefined_thing;\n}\n")
    with pytest.raises(KernelSpecError) as info:
        kernels.resolve_multiplier(str(path))
    message = str(info.value)
    assert "cannot compile multiplier" in message
    assert "undefined_thing" in message and "error" in message  # the compiler's own diagnostic


def test_c_syntax_garbage_shows_compiler_message(tmp_path):
    path = tmp_path / "garbage.c"
    path.write_text("this is not C at all ((\n")
    with pytest.raises(KernelSpecError, match="(?s)cannot compile multiplier.*error"):
        kernels.resolve_multiplier(str(path))


@pytest.mark.parametrize("source,fragment", [
    ("float mul8u_F(float a, float b) { return a * b; }", "unsupported signature"),
    ("#include <stdint.h>\nuint16_t mul8u_P(uint8_t *a, uint8_t b) { return *a * b; }", "unsupported signature"),
    ("#include <stdint.h>\nint16_t mul8u_S(int8_t A, int8_t B) { return A * B; }", "named as an unsigned"),
    ("int mymul(int a, int b) { return a * b; }", "cannot tell whether"),
])
def test_unsupported_signatures(tmp_path, source, fragment):
    path = tmp_path / "f.c"
    path.write_text(source)
    with pytest.raises(KernelSpecError, match=fragment):
        kernels.resolve_multiplier(str(path))


def test_missing_file(tmp_path):
    with pytest.raises(KernelSpecError, match="not found"):
        kernels.resolve_multiplier(str(tmp_path / "nope.c"))


# ---------------------------------------------------------------------------- shared libraries

SO_SOURCE = r"""
#include <stdint.h>
#define X __attribute__((visibility("default")))
X uint16_t mul8u_so(uint8_t a, uint8_t b) { return (uint16_t)(a * (b & 0xF0)); }
X int16_t mul8s_so(int8_t a, int8_t b) { return (int16_t)(a * (b & ~3)); }
X uint16_t mul8s_sobug(uint8_t a, uint8_t b) { return (uint16_t)(int16_t)((int8_t)a * (int8_t)(b & 0xFC)); }
X uint64_t mul8u_legacy(const uint64_t B, const uint64_t A) { return A * (B & 0xF0); }
X uint16_t plain(uint8_t a, uint8_t b) { return (uint16_t)(a * (b & 0xF0)); }
"""


@pytest.fixture(scope="module")
def user_library(tmp_path_factory):
    directory = tmp_path_factory.mktemp("so")
    source = directory / "mul.c"
    source.write_text(SO_SOURCE)
    library = directory / "libmul.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", str(source), "-o", str(library)], check=True)
    return library


def test_so_symbols(user_library):
    lib = str(user_library)
    np.testing.assert_array_equal(table_2d(kernels.resolve_multiplier(f"{lib}:mul8u_so")),
                                  expected_asym_unsigned())
    ms = kernels.resolve_multiplier(f"{lib}:mul8s_so")
    assert ms.signed
    np.testing.assert_array_equal(table_2d(ms), expected_asym_signed())
    bug = kernels.resolve_multiplier(f"{lib}:mul8s_sobug:s8u")
    assert bug.signed
    np.testing.assert_array_equal(table_2d(bug), expected_asym_signed())
    legacy = kernels.resolve_multiplier(f"{lib}:mul8u_legacy:u64")
    np.testing.assert_array_equal(table_2d(legacy), expected_asym_unsigned())  # default order ba
    swapped = kernels.resolve_multiplier(f"{lib}:mul8u_so:ba")
    np.testing.assert_array_equal(table_2d(swapped), expected_asym_unsigned().T)
    plain = kernels.resolve_multiplier(f"{lib}:plain:u8")
    np.testing.assert_array_equal(table_2d(plain), expected_asym_unsigned())
    assert plain.to_config()["sha256"] and plain.spec.endswith("libmul.so:plain:u8")


def test_so_errors(user_library):
    lib = str(user_library)
    with pytest.raises(KernelSpecError, match="symbol 'mul8u_missing' not found in .*nm -D"):
        kernels.resolve_multiplier(f"{lib}:mul8u_missing")
    with pytest.raises(KernelSpecError, match="cannot tell the C signature of 'plain'"):
        kernels.resolve_multiplier(f"{lib}:plain")
    with pytest.raises(KernelSpecError, match="unknown option"):
        kernels.resolve_multiplier(f"{lib}:mul8u_so:float")


# ---------------------------------------------------------------------------- table files

def test_lut_file_roundtrip_code_and_value_order(tmp_path):
    table = (expected_asym_signed().reshape(-1)).astype(np.int32)
    multipliers.write_lut(tmp_path / "c.lut", table, signed=True)
    multipliers.write_lut(tmp_path / "v.lut", table, signed=True, value_order=True)
    for name in ("c.lut", "v.lut"):
        m = kernels.resolve_multiplier(str(tmp_path / name))
        assert m.signed
        np.testing.assert_array_equal(m.table, table)
    raw = (tmp_path / "v.lut").read_bytes()
    assert len(raw) == 16 + 4 * 65536 and raw[:8] == b"GSWAPLUT"
    # value order on disk: first entry is f(-128, -128)
    assert struct.unpack_from("<i", raw, 16)[0] == -128 * -128


def test_lut_file_errors(tmp_path):
    (tmp_path / "short.lut").write_bytes(b"GSWAPLUT" + bytes(100))
    with pytest.raises(KernelSpecError, match="wrong size.*262160"):
        kernels.resolve_multiplier(str(tmp_path / "short.lut"))
    (tmp_path / "magic.lut").write_bytes(b"NOTALUT!" + bytes(8 + 4 * 65536))
    with pytest.raises(KernelSpecError, match="not a graphswap .lut file"):
        kernels.resolve_multiplier(str(tmp_path / "magic.lut"))


def test_tfapprox_bin(tmp_path):
    expected = expected_asym_unsigned()
    (tmp_path / "m.bin").write_bytes(expected.astype("<u2").tobytes())
    m = kernels.resolve_multiplier(str(tmp_path / "m.bin"))
    assert not m.signed
    np.testing.assert_array_equal(table_2d(m), expected)
    (tmp_path / "bad.bin").write_bytes(bytes(1000))
    with pytest.raises(KernelSpecError, match="wrong size for a TFApprox"):
        kernels.resolve_multiplier(str(tmp_path / "bad.bin"))


# ---------------------------------------------------------------------------- metrics and checks

def test_metrics_trunc8_by_hand():
    a = np.arange(256)[:, None] * np.arange(256)[None, :]
    err = (a >> 8 << 8) - a
    got = kernels.metrics("mul8u_trunc8")
    assert got["MAE"] == pytest.approx(np.abs(err).mean())
    assert got["MAE%"] == pytest.approx(np.abs(err).mean() / 65536 * 100)
    assert got["WCE"] == 255 and got["WCE%"] == pytest.approx(255 / 65536 * 100)
    assert got["EP%"] == pytest.approx(np.mean(err != 0) * 100)
    assert got["bias"] == pytest.approx(err.mean())
    assert got["MSE"] == pytest.approx((err.astype(float) ** 2).mean())
    exact = kernels.metrics("mul8s_exact")
    assert all(v == 0 for v in exact.values())


def drum(x: int, k: int) -> int:
    """DRUM-k of a magnitude, from its definition: k bits from the leading one, the last set."""
    if x < 1 << k:
        return x
    shift = x.bit_length() - k
    return ((x >> shift) | 1) << shift


def test_operand_levels_count_the_values_a_multiplier_tells_apart():
    # DRUM-3: the number of distinct DRUM-3 values over the operand range, by its definition
    unsigned = len({drum(x, 3) for x in range(256)})
    signed_nonnegative = len({drum(x, 3) for x in range(128)})
    signed = len({(1 if v >= 0 else -1) * drum(abs(v), 3) for v in range(-128, 128)})
    assert (unsigned, signed_nonnegative, signed) == (18, 16, 32)
    assert kernels.operand_levels("mul8u_drum3") == {
        "first": unsigned, "second": unsigned, "first_nonnegative": unsigned,
        "nonnegative_values": 256}
    assert kernels.operand_levels("mul8s_drum3") == {
        "first": signed, "second": signed, "first_nonnegative": signed_nonnegative,
        "nonnegative_values": 128}
    # trunc8 clears the product's low byte: a = 0 and a = 1 give 0 for every b < 256, every
    # other pair of rows differs (f(a, 255) = floor(255 a / 256) * 256 = (a - 1) * 256, a >= 1)
    assert kernels.operand_levels("mul8u_trunc8")["first"] == 255
    assert kernels.operand_levels("mul8u_exact")["first"] == 256
    detail = {c["check"]: c["detail"] for c in kernels.check("mul8s_drum3")["checks"]}
    assert "32 of 256 values told apart (5.0 bits), 16 of the 128 non-negative" in \
        detail["operand resolution"]


def test_check_agrees_with_evoapprox_header(tmp_path):
    path = tmp_path / "mul8u_LEG.c"
    path.write_text(legacy_source())
    result = kernels.check(str(path))
    agreed = {e["metric"]: e["agrees"] for e in result["header_comparison"]}
    assert agreed["MAE%"] and agreed["WCE%"] and agreed["EP%"] and agreed["MAE"]
    assert result["passed"]
    names = {c["check"]: c for c in result["checks"]}
    assert "operand order matters" in names["operand-order symmetry"]["detail"]
    text = multipliers.format_check(result)
    assert "MAE%" in text and "agrees" in text and "PDK45_PWR" in text


def test_check_flags_wrong_header_and_nonzero_at_zero(tmp_path):
    path = tmp_path / "mul8u_LEG.c"
    path.write_text(legacy_source(header_ok=False))
    result = kernels.check(str(path))
    assert not result["passed"]
    assert "DIFFERS" in multipliers.format_check(result)
    table = np.arange(65536, dtype=np.int32) % 7 + 1  # never zero
    multipliers.write_lut(tmp_path / "nz.lut", table, signed=False)
    result = kernels.check(str(tmp_path / "nz.lut"))
    names = {c["check"]: c for c in result["checks"]}
    # a non-zero product of a zero operand is a property of some published circuits: a warning
    for name in ("f(a, 0) = 0", "f(0, b) = 0"):
        assert names[name]["passed"] is None and names[name]["status"] == "warn"
        assert "non-zero for 256 of 256" in names[name]["detail"]


def test_check_flags_implausible_signedness(tmp_path):
    # a signed multiplier's table stored as an unsigned .lut (values as 16-bit patterns)
    signed_table = table_2d(kernels.resolve_multiplier("mul8s_exact")).reshape(-1) & 0xFFFF
    multipliers.write_lut(tmp_path / "wrong.lut", signed_table.astype(np.int32), signed=False)
    result = kernels.check(str(tmp_path / "wrong.lut"))
    names = {c["check"]: c for c in result["checks"]}
    assert names["signedness plausibility"]["passed"] is False
    assert "looks signed" in names["signedness plausibility"]["detail"]


def test_plot_error_heatmap(tmp_path):
    out = kernels.plot_error_heatmap("mul8s_drum3", tmp_path / "heat.png")
    data = (tmp_path / "heat.png").read_bytes()
    assert out.endswith("heat.png") and data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


@pytest.mark.parametrize("computed,printed,agrees", [
    (1.17966, "1.18", True),        # rounded (EvoApproxLib mul8u_18UH's MAE%)
    (0.00648499, "0.0064", True),   # truncated (EvoApproxLib mul8s_1KVB's MAE%)
    (4.25, "4.2", True),            # truncated
    (99.1486, "99.15", True),
    (919691.0, "919691", True),
    (471649810.0, "47164.981e4", True),
    (0.0066, "0.0064", False),      # neither rounding nor truncation of the printed value
    (1.16, "1.18", False),
    (-0.0065, "0.0064", False),     # sign differs
])
def test_header_agreement_accepts_rounding_and_truncation(computed, printed, agrees):
    from graphswap.multipliers import agrees_with_header

    assert agrees_with_header(computed, printed) is agrees


def test_write_lut_of_a_lut_result_round_trips(tmp_path):
    """kernels.lut() returns a signed table ordered by value; writing it back must say so."""
    drum = kernels.resolve_multiplier("mul8s_drum4")
    by_value = kernels.lut("mul8s_drum4")
    with pytest.raises(ValueError, match="ambiguous: pass table_order='value'"):
        multipliers.write_lut(tmp_path / "x.lut", by_value, signed=True)
    multipliers.write_lut(tmp_path / "v.lut", by_value, signed=True, table_order="value")
    multipliers.write_lut(tmp_path / "c.lut", drum.table.reshape(256, 256), signed=True,
                          table_order="code")
    for name in ("v.lut", "c.lut"):
        np.testing.assert_array_equal(
            kernels.resolve_multiplier(str(tmp_path / name)).table, drum.table)
    unsigned = kernels.lut("mul8u_mitchell")  # unsigned: one order, no argument needed
    multipliers.write_lut(tmp_path / "u.lut", unsigned, signed=False)
    np.testing.assert_array_equal(kernels.resolve_multiplier(str(tmp_path / "u.lut")).table,
                                  kernels.resolve_multiplier("mul8u_mitchell").table)


# ------------------------------------------------------------ results at their declared width

OUT_OF_RANGE = {
    # file: (source, what the refusal names)
    "mul8u_big.c": ("""#include <stdint.h>
uint64_t mul8u_big(const uint64_t B, const uint64_t A)
{
    if (A == 200 && B == 200) return 70000;  /* wider than a 16-bit product */
    return A * B;
}
""", "mul8u_big(200, 200) = 70000 (1 of 65536 operand pairs)"),
    "mul8u_neg.c": ("""#include <stdint.h>
uint64_t mul8u_neg(const uint64_t B, const uint64_t A)
{
    if (A == 3 && B == 7) return (uint64_t)-5;  /* 2**64 - 5, which int64 reads as -5 */
    return A * B;
}
""", "mul8u_neg(3, 7) = 18446744073709551611 (2**64 - 5; -5 if read as int64)"),
    "mul8s_wide.c": ("""#include <stdint.h>
int32_t mul8s_wide(int8_t A, int8_t B)
{
    return (A == -128 && B == -128) ? 40000 : A * B;
}
""", "mul8s_wide(-128, -128) = 40000"),
    "mul8u_short.c": ("""#include <stdint.h>
int16_t mul8u_short(uint8_t A, uint8_t B)
{
    return (int16_t)(A * B);  /* products above 32767 come out negative */
}
""", "mul8u_short(129, 255) = -32641"),
}


@pytest.mark.parametrize("name", sorted(OUT_OF_RANGE))
def test_results_outside_an_8x8_bit_product_are_refused(tmp_path, name):
    """A result the table cannot hold as the function's real product is refused, naming the
    operands - 2**64 - 5 is not -5, and 70000 is no 8x8-bit product."""
    from graphswap.errors import MultiplierRangeError

    source, named = OUT_OF_RANGE[name]
    path = tmp_path / name
    path.write_text(source)
    with pytest.raises(MultiplierRangeError) as info:
        kernels.resolve_multiplier(str(path))
    assert named in str(info.value)
    assert "graphswap refuses it" in str(info.value)


def test_a_model_is_never_built_on_an_out_of_range_multiplier(tmp_path):
    import keras

    import graphswap
    from graphswap.errors import MultiplierRangeError

    path = tmp_path / "mul8u_big.c"
    path.write_text(OUT_OF_RANGE["mul8u_big.c"][0])
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(MultiplierRangeError, match=r"mul8u_big\(200, 200\) = 70000"):
        graphswap.rewrite_model(model, kernel=str(path))


WIDE_RESULTS_SO = r"""
#include <stdint.h>
#define X __attribute__((visibility("default")))
X uint64_t mul8u_big(const uint64_t B, const uint64_t A) { return (A == 200 && B == 200) ? 70000 : A * B; }
X uint64_t mul8u_neg(const uint64_t B, const uint64_t A) { return (A == 3 && B == 7) ? (uint64_t)-5 : A * B; }
"""


def test_shared_library_results_are_read_at_their_declared_width(tmp_path):
    from graphswap.errors import MultiplierRangeError

    (tmp_path / "wide.c").write_text(WIDE_RESULTS_SO)
    library = tmp_path / "libwide.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", str(tmp_path / "wide.c"), "-o", str(library)],
                   check=True)
    with pytest.raises(MultiplierRangeError, match=r"mul8u_big\(200, 200\) = 70000"):
        kernels.resolve_multiplier(f"{library}:mul8u_big:u64")
    with pytest.raises(MultiplierRangeError, match=r"mul8u_neg\(3, 7\) = 18446744073709551611 "
                                                   r"\(2\*\*64 - 5; -5 if read as int64\)"):
        kernels.resolve_multiplier(f"{library}:mul8u_neg:u64")


def test_signed_file_declared_with_64_bit_unsigned_types_is_read_as_its_16_bit_pattern(tmp_path):
    """A mis-declared signed multiplier returning its product sign-extended to 64 unsigned bits is
    valid (the low 16 bits are the two's-complement product); a value beyond 16 bits is not."""
    from graphswap.errors import MultiplierRangeError

    path = tmp_path / "mul8s_W64.c"
    path.write_text("""#include <stdint.h>
uint64_t mul8s_W64(const uint64_t B, const uint64_t A)
{
    return (uint64_t)((int64_t)(int8_t)A * (int64_t)(int8_t)(B & 0xFC));
}
""")
    m = kernels.resolve_multiplier(str(path))
    assert m.signed
    np.testing.assert_array_equal(table_2d(m), expected_asym_signed())
    bad = tmp_path / "mul8s_B64.c"
    bad.write_text(path.read_text().replace("mul8s_W64", "mul8s_B64").replace(
        "    return (uint64_t)", "    if (A == 1 && B == 1) return 70000;\n    return (uint64_t)"))
    with pytest.raises(MultiplierRangeError, match=r"mul8s_B64\(1, 1\) = 70000"):
        kernels.resolve_multiplier(str(bad))


def test_the_evaluating_child_loads_only_the_checked_copy(tmp_path):
    """The child process hashes the private copy again before loading it."""
    from graphswap.errors import KernelTrustError
    from graphswap.multipliers.evaluation import EvaluationPlan, evaluate_isolated

    library = tmp_path / "libwide.so"
    (tmp_path / "wide.c").write_text(WIDE_RESULTS_SO)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", str(tmp_path / "wide.c"), "-o", str(library)],
                   check=True)
    plan = EvaluationPlan(source=str(library), name="mul8u_big", library=str(library),
                          sha256="0" * 64, mode="symbol", symbol="mul8u_big", arg="u64",
                          ret="u64", order="ba")
    with pytest.raises(KernelTrustError, match="changed after it was checked; nothing was loaded"):
        evaluate_isolated(plan, signed=False)


def test_a_multiplier_that_prints_does_not_corrupt_its_table(tmp_path):
    """The evaluating child sends the rows on its own descriptor; a debugging printf in the
    user's function goes to stderr."""
    path = tmp_path / "mul8u_chatty.c"
    path.write_text("""#include <stdint.h>
#include <stdio.h>
uint16_t mul8u_chatty(uint8_t A, uint8_t B)
{
    if (B == 0) { printf("row %d\\n", A); fflush(stdout); }
    return (uint16_t)(A * (B & 0xF0));
}
""")
    np.testing.assert_array_equal(table_2d(kernels.resolve_multiplier(str(path))),
                                  expected_asym_unsigned())


# ---------------------------------------------------------------------------- published circuits

def _header(multiplier_metrics: dict, keys=("MAE%", "MAE", "WCE%", "WCE", "WCRE%", "EP%", "MRE%")):
    """EvoApproxLib-style header lines printing `multiplier_metrics` as the library does."""
    formats = {"MAE%": "{:.2f} %", "MAE": "{:.0f}", "WCE%": "{:.2f} %", "WCE": "{:.0f}",
               "WCRE%": "{:.2f} %", "EP%": "{:.2f} %", "MRE%": "{:.2f} %"}
    return "".join(f"// {k} = {formats[k].format(multiplier_metrics[k])}\n" for k in keys)


def _metrics_of(function, signed=False):
    v = signed_values() if signed else np.arange(256)
    a, b = np.meshgrid(v, v, indexing="ij")
    approx = function(a, b)
    error = np.abs(approx - a * b)
    nonzero = a * b != 0
    return {"MAE%": error.mean() / 65536 * 100, "MAE": error.mean(),
            "WCE%": error.max() / 65536 * 100, "WCE": error.max(),
            "WCRE%": (error[nonzero] / np.abs(a * b)[nonzero]).max() * 100,
            "EP%": np.mean(error != 0) * 100,
            "MRE%": (error[nonzero] / np.abs(a * b)[nonzero]).mean() * 100}


ALWAYS_ZERO = """#include <stdint.h>
uint64_t mul8u_ZERO(const uint64_t B, const uint64_t A)
{
   uint64_t O = 0;   /* as EvoApproxLib's mul8u_E9R: the zero-power end of a Pareto front */
   return O;
}
"""


def test_a_header_matching_the_declared_signedness_settles_it(tmp_path):
    """An unsigned multiplier that always returns 0 "looks signed" by MAE alone (4096 read as
    signed vs 16256 unsigned); its header's unsigned metrics match it exactly, so it passes."""
    header = _header(_metrics_of(lambda a, b: np.zeros_like(a)))
    assert "// MAE% = 24.81 %" in header and "// WCE% = 99.22 %" in header
    with_header = tmp_path / "mul8u_ZERO.c"
    with_header.write_text(header + ALWAYS_ZERO)
    result = kernels.check(str(with_header))
    names = {c["check"]: c for c in result["checks"]}
    assert names["signedness plausibility"]["passed"] is True
    assert "match the unsigned reading" in names["signedness plausibility"]["detail"]
    assert result["passed"]
    bare = tmp_path / "bare" / "mul8u_ZERO.c"  # no header: the MAE heuristic speaks
    bare.parent.mkdir()
    bare.write_text(ALWAYS_ZERO)
    names = {c["check"]: c for c in kernels.check(str(bare))["checks"]}
    assert names["signedness plausibility"]["passed"] is False
    assert "looks signed" in names["signedness plausibility"]["detail"]


def test_a_header_matching_the_other_signedness_is_a_failure(tmp_path):
    """A signed circuit's table stored as unsigned code patterns, with the signed circuit's header:
    the header matches the other reading, so the declaration is wrong."""
    header = _header(_metrics_of(lambda a, b: a * (b & ~3), signed=True),
                     keys=("MAE%", "WCE%", "EP%"))
    path = tmp_path / "mul8u_MIS.c"
    path.write_text(header + """#include <stdint.h>
uint16_t mul8u_MIS(uint8_t A, uint8_t B)
{
  return (uint16_t)(int16_t)((int8_t)A * (int8_t)(B & 0xFC));
}
""")
    names = {c["check"]: c for c in kernels.check(str(path))["checks"]}
    assert names["signedness plausibility"]["passed"] is False
    assert "match the signed reading, not the declared unsigned one" in \
        names["signedness plausibility"]["detail"]


OFFSET_PRODUCT = """#include <stdint.h>
uint16_t mul8u_OFS(uint8_t A, uint8_t B)
{
  return (uint16_t)((A * B) | 32);   /* as EvoApproxLib's mul8u_2AC: f(0, 0) = 32 */
}
"""


def test_a_non_zero_product_of_zero_is_a_warning_and_wcre_is_compared(tmp_path):
    offset = _metrics_of(lambda a, b: (a * b) | 32)
    path = tmp_path / "mul8u_OFS.c"
    path.write_text(_header(offset) + OFFSET_PRODUCT)
    result = kernels.check(str(path))
    names = {c["check"]: c for c in result["checks"]}
    assert result["passed"]  # warnings do not fail the check
    for name in ("f(a, 0) = 0", "f(0, b) = 0"):
        assert names[name]["status"] == "warn" and names[name]["passed"] is None
    assert "f(0, 0) = 32" in names["f(a, 0) = 0"]["detail"]
    assert "a property of this circuit" in names["f(a, 0) = 0"]["detail"]
    assert names["header WCRE% agrees"]["passed"] is True
    assert names["header WCRE% agrees"]["detail"] == "computed 3200, header 3200.00"  # f(1, 1) = 33
    assert multipliers.format_check(result).splitlines()[-1] == "all checks passed (2 warnings)"
    wrong = tmp_path / "wrong" / "mul8u_OFS.c"
    wrong.parent.mkdir()
    wrong.write_text(_header(offset).replace("WCRE% = 3200.00", "WCRE% = 100.00") + OFFSET_PRODUCT)
    result = kernels.check(str(wrong))
    names = {c["check"]: c for c in result["checks"]}
    assert names["header WCRE% agrees"]["passed"] is False and not result["passed"]
    assert "DIFFERS" in multipliers.format_check(result)
