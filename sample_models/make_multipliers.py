"""Generate and verify the example approximate multipliers in sample_models/multipliers/.

These are graphswap's own EvoApproxLib-*style* 8x8 multipliers (written for graphswap, not taken from
EvoApproxLib): one C function per file, a comment block describing the circuit, and the
EvoApproxLib header lines (`// MAE% = ... %` etc.) that `graphswap kernels check` compares with its
own computation.  Three severities, each unsigned and signed (sign-magnitude around the same
unsigned core), plus one file in EvoApproxLib's legacy signature:

  design                                         unsigned            signed
  mild    broken-array multiplier, VBL = 6       mul8u_gsbam6        mul8s_gsbam6
  medium  array multiplier accumulating with     mul8u_gsloa11       mul8s_gsloa11
          lower-part-OR adders, 11 OR'ed bits
  severe  operand truncation (low operand bits   mul8u_gsot45        mul8s_gsot36
          not wired into the array)              mul8u_gsot45l (legacy uint64_t (B, A) signature)

Every metric in a file's header is computed here from the C function itself: each file is compiled
with the system C compiler (cc) into a shared library, the function is called through ctypes on all
65536 operand pairs, and the metrics are computed from those products.  The products are also
compared with an independent numpy model of the same circuit (a mistake in either shows up as a
mismatch).  `--check` verifies the existing files without rewriting them and fails (exit 1) if any
header value disagrees with the computation (rounded or truncated to its printed precision, the rule
graphswap uses), or if the C and numpy models differ.

PDK45_PWR is an ESTIMATE, not a synthesis result: the exact array multiplier's figure (EvoApproxLib's
exact 8x8 multipliers: mul8u_1JFF 0.391 mW unsigned, mul8s_1KV6 0.425 mW signed) scaled by the share
of array cells the design keeps, counting one AND gate per partial-product bit generated and one
adder cell per partial-product bit summed by an adder (an exact 8x8 array: 64 + 64 = 128 cells); an
OR gate replacing an adder cell counts as nothing, and the sign-magnitude conversion of the signed
variants is not counted.  PDK45_AREA and PDK45_DELAY are omitted (nothing here could honestly
estimate them).

    python sample_models/make_multipliers.py            # write the files, then verify them
    python sample_models/make_multipliers.py --check    # verify only (exit 1 on a disagreement)
    python sample_models/make_multipliers.py --check --graphswap   # also run graphswap's own check
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "multipliers"
EXACT_PWR = {False: 0.391, True: 0.425}   # mW, EvoApproxLib mul8u_1JFF / mul8s_1KV6 (PDK45)
ARRAY_CELLS = 128                         # 64 AND gates + 64 adder cells (see the docstring)


# --------------------------------------------------------------------------------------------
# the designs: C core (operating on unsigned magnitudes A, B in uint32_t ma, mb), numpy mirror,
# description, cell count for the power estimate
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Design:
    key: str                 # file / function suffix
    title: str
    description: str         # comment block paragraphs
    core_c: str              # C statements computing uint32_t p from uint32_t ma, mb
    helpers_c: str           # static helper functions (may be "")
    numpy_core: object       # f(ma, mb) -> p on int64 arrays
    cells: int               # AND + adder cells kept, out of ARRAY_CELLS


def _bam_numpy(vbl):
    def core(ma, mb):
        acc = np.zeros(np.broadcast(ma, mb).shape, np.int64)
        for j in range(8):
            acc += ((mb >> j) & 1) * ((ma << j) & ~((1 << vbl) - 1))
        return acc
    return core


def _loa_numpy(lower):
    def add(x, y):
        mask = (1 << lower) - 1
        carry = (x >> (lower - 1)) & (y >> (lower - 1)) & 1
        return (((x >> lower) + (y >> lower) + carry) << lower) | ((x | y) & mask)

    def core(ma, mb):
        acc = np.zeros(np.broadcast(ma, mb).shape, np.int64)
        for j in range(8):
            acc = add(acc, ((mb >> j) & 1) * (ma << j))
        return acc
    return core


def _ot_numpy(ta, tb):
    def core(ma, mb):
        return ((ma >> ta) << ta) * ((mb >> tb) << tb)
    return core


def _bits_in_columns_below(v):
    """Partial-product bits a_i b_j (0 <= i, j < 8) with i + j < v."""
    return sum(1 for i in range(8) for j in range(8) if i + j < v)


def bam(vbl: int) -> Design:
    dropped = _bits_in_columns_below(vbl)
    return Design(
        key=f"bam{vbl}",
        title=f"broken-array multiplier, vertical break line {vbl}",
        description=(
            f"Broken-array multiplier (BAM; H. R. Mahdiani, A. Ahmadi, S. M. Fakhraie, C. Lucas, "
            f"'Bio-inspired imprecise computational blocks for efficient VLSI implementation of "
            f"soft-computing applications', IEEE TCAS-I 57(4), 2010) with vertical break line "
            f"VBL = {vbl} and no horizontal break: the carry-save cells of every partial-product "
            f"bit a_i & b_j with i + j < {vbl} are removed from the 8x8 array, so those "
            f"{dropped} of the 64 partial-product bits (columns 0..{vbl - 1}) never reach the sum. "
            f"The result is never larger than the exact product (a negative bias).",
        ),
        core_c=(
            "    uint32_t p = 0;\n"
            "    for (int j = 0; j < 8; ++j) {\n"
            "        if (!((mb >> j) & 1u))\n"
            "            continue;\n"
            "        uint32_t row = ma << j;                    /* row j of the array: a_i & b_j at column i + j */\n"
            f"        row &= ~((1u << {vbl}) - 1u);              /* broken array: columns 0..{vbl - 1} have no cells */\n"
            "        p += row;\n"
            "    }\n"),
        helpers_c="",
        numpy_core=_bam_numpy(vbl),
        cells=2 * (64 - dropped),
    )


def loa(lower: int) -> Design:
    # bits summed by OR gates: partial-product bits in columns < lower (of rows 1..7; row 0 enters
    # an empty accumulator and needs no adder either way)
    ored = _bits_in_columns_below(lower)
    return Design(
        key=f"loa{lower}",
        title=f"array multiplier with lower-part-OR accumulation, {lower} OR'ed bits",
        description=(
            f"Array multiplier whose eight partial-product rows are accumulated one after another "
            f"with lower-part-OR adders (LOA; Mahdiani et al., IEEE TCAS-I 57(4), 2010): in every "
            f"row addition the {lower} least significant bits are computed by OR gates (a_k | b_k) "
            f"instead of full adders, and the exact upper-part adder receives the AND of the two "
            f"lower parts' most significant bits as its carry-in (LOA's carry prediction).  All 64 "
            f"partial-product bits are generated; the {ored} of them in columns 0..{lower - 1} are "
            f"summed by OR gates.  Errors appear only when two added bits in the lower part are "
            f"both 1, so small operands are often exact; the bias is negative.",
        ),
        core_c=(
            "    uint32_t p = 0;\n"
            "    for (int j = 0; j < 8; ++j) {\n"
            "        uint32_t row = ((mb >> j) & 1u) ? (ma << j) : 0u;   /* partial-product row j */\n"
            f"        p = loa_add(p, row);                              /* LOA with {lower} OR'ed bits */\n"
            "    }\n"),
        helpers_c=(
            f"/* lower-part-OR adder: bits 0..{lower - 1} OR'ed, exact upper part with carry-in\n"
            f"   x[{lower - 1}] & y[{lower - 1}] */\n"
            "static uint32_t loa_add(uint32_t x, uint32_t y)\n"
            "{\n"
            f"    const uint32_t lower_mask = (1u << {lower}) - 1u;\n"
            f"    uint32_t carry = (x >> {lower - 1}) & (y >> {lower - 1}) & 1u;\n"
            f"    uint32_t upper = ((x >> {lower}) + (y >> {lower}) + carry) << {lower};\n"
            "    return upper | ((x | y) & lower_mask);\n"
            "}\n\n"),
        numpy_core=_loa_numpy(lower),
        cells=64 + (64 - ored),
    )


def operand_truncation(ta: int, tb: int) -> Design:
    kept = (8 - ta) * (8 - tb)
    return Design(
        key=f"ot{ta}{tb}",
        title=f"operand truncation, {ta} low bits of A and {tb} of B not wired",
        description=(
            f"Static operand truncation: the {ta} least significant bits of the first operand A "
            f"(the activation) and the {tb} least significant bits of the second operand B (the "
            f"weight) are not wired into the array, leaving a ({8 - ta} x {8 - tb})-bit array of "
            f"{kept} partial-product bits whose product is shifted back into place "
            f"((A >> {ta} << {ta}) * (B >> {tb} << {tb})).  The simplest way to shrink a multiplier "
            f"(cf. the fixed-width / truncated multipliers surveyed by H. Jiang et al., 'Approximate "
            f"arithmetic circuits: a survey, characterization, and recent applications', Proc. IEEE "
            f"108(12), 2020), here deliberately severe: errors up to about "
            f"{100 * (2 ** ta - 1 + 2 ** tb - 1) // 256}% of full scale, always downwards, and "
            f"operand order matters (A and B are truncated differently).",
        ),
        core_c=(
            f"    uint32_t ta = ma & ~((1u << {ta}) - 1u);   /* A's {ta} low bits not wired */\n"
            f"    uint32_t tb = mb & ~((1u << {tb}) - 1u);   /* B's {tb} low bits not wired */\n"
            "    uint32_t p = ta * tb;\n"),
        helpers_c="",
        numpy_core=_ot_numpy(ta, tb),
        cells=2 * kept,
    )


@dataclasses.dataclass
class Variant:
    design: Design
    signed: bool
    legacy: bool = False

    @property
    def name(self) -> str:
        return f"mul8{'s' if self.signed else 'u'}_gs{self.design.key}{'l' if self.legacy else ''}"

    @property
    def filename(self) -> str:
        return f"{self.name}.c"


SEVERITY = {"bam6": "mild", "loa11": "medium", "ot45": "severe", "ot36": "severe"}

VARIANTS = [
    Variant(bam(6), False), Variant(bam(6), True),
    Variant(loa(11), False), Variant(loa(11), True),
    Variant(operand_truncation(4, 5), False), Variant(operand_truncation(3, 6), True),
    Variant(operand_truncation(4, 5), False, legacy=True),
]


# --------------------------------------------------------------------------------------------
# C source
# --------------------------------------------------------------------------------------------

def function_source(v: Variant) -> str:
    core = v.design.core_c
    if v.legacy:
        return (f"uint64_t {v.name}(const uint64_t B, const uint64_t A)\n"
                "{\n"
                "    uint32_t ma = (uint32_t)(A & 0xFFu), mb = (uint32_t)(B & 0xFFu);\n"
                f"{core}"
                "    return (uint64_t)p;\n"
                "}\n")
    if not v.signed:
        return (f"uint16_t {v.name}(uint8_t A, uint8_t B)\n"
                "{\n"
                "    uint32_t ma = A, mb = B;\n"
                f"{core}"
                "    return (uint16_t)p;\n"
                "}\n")
    return (f"int16_t {v.name}(int8_t A, int8_t B)\n"
            "{\n"
            "    /* sign-magnitude: the unsigned core multiplies |A| and |B| (0..128) */\n"
            "    uint32_t ma = (uint32_t)(A < 0 ? -(int32_t)A : (int32_t)A);\n"
            "    uint32_t mb = (uint32_t)(B < 0 ? -(int32_t)B : (int32_t)B);\n"
            f"{core}"
            "    int32_t s = ((A < 0) != (B < 0)) ? -(int32_t)p : (int32_t)p;\n"
            "    return (int16_t)s;\n"
            "}\n")


def _wrap(text: str, width: int = 96, prefix: str = " * ") -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if line and len(prefix) + len(line) + 1 + len(word) > width:
            lines.append(prefix + line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        lines.append(prefix + line)
    return lines


def header_lines(m: dict, v: Variant) -> list[str]:
    return [
        f"// MAE% = {m['MAE%']:.4f} %",
        f"// MAE = {m['MAE']:.2f}",
        f"// WCE% = {m['WCE%']:.4f} %",
        f"// WCE = {m['WCE']}",
        f"// WCRE% = {m['WCRE%']:.2f} %",
        f"// EP% = {m['EP%']:.2f} %",
        f"// MRE% = {m['MRE%']:.4f} %",
        f"// MSE = {m['MSE']:.1f}",
        f"// PDK45_PWR = {m['PWR_EST']:.3f} mW   (ESTIMATE from the kept array cells, NOT a synthesis result)",
    ]


def file_source(v: Variant, m: dict) -> str:
    d = v.design
    kind = "signed int8 (two's complement operands, sign-magnitude core)" if v.signed \
        else "unsigned uint8"
    signature = ("legacy EvoApproxLib signature uint64_t f(const uint64_t B, const uint64_t A): "
                 "note the operand order B, A" if v.legacy else
                 ("int16_t f(int8_t A, int8_t B)" if v.signed else "uint16_t f(uint8_t A, uint8_t B)"))
    lines = ["/***",
             *_wrap(f"{v.name}: {SEVERITY[d.key]} approximate 8x8 {kind} multiplier - {d.title}."),
             " * Written for graphswap's sample_models (not part of EvoApproxLib); EvoApproxLib-style",
             " * file: one function, header metrics below.  Generated and verified by",
             " * sample_models/make_multipliers.py; edit that script, not this file.",
             " *",
             f" * Signature: {signature}.",
             " * First operand A = activation, second operand B = weight (graphswap's convention).",
             " *"]
    for paragraph in d.description:
        lines += _wrap(paragraph)
        lines.append(" *")
    if v.signed:
        lines += _wrap("Signed variant: A and B are converted to sign-magnitude, the unsigned core "
                       "multiplies the magnitudes |A|, |B| (0..128), and the product is negated when "
                       "the signs differ, so the error is symmetric about zero.")
        lines.append(" *")
    lines += _wrap(
        "Metrics (computed over all 65536 operand pairs from this C function by "
        "make_multipliers.py; EvoApproxLib conventions): MAE% = mean|approx - exact| / 2^16 * 100, "
        "WCE% = max|approx - exact| / 2^16 * 100, WCRE% = max relative error over non-zero exact "
        "products, EP% = share of operand pairs with any error, MRE% = mean relative error over "
        "non-zero exact products, MSE = mean squared error.")
    lines.append(" *")
    lines += _wrap(
        f"PDK45_PWR is an ESTIMATE, NOT a synthesis result: the exact 8x8 multiplier's "
        f"{EXACT_PWR[v.signed]} mW (EvoApproxLib {'mul8s_1KV6' if v.signed else 'mul8u_1JFF'}, PDK45) "
        f"times the share of array cells kept ({d.cells} of {ARRAY_CELLS}: one AND gate per "
        f"partial-product bit generated plus one adder cell per bit summed by an adder; OR gates "
        f"count as nothing{', the sign-magnitude conversion is not counted' if v.signed else ''}). "
        f"PDK45_AREA and PDK45_DELAY are not given: they would need synthesis.")
    lines.append(" *")
    lines.append(f" * mean error (bias) = {m['bias']:.2f}")
    lines.append(" ***/")
    return ("\n".join(lines) + "\n" + "\n".join(header_lines(m, v)) + "\n\n#include <stdint.h>\n\n"
            + v.design.helpers_c + function_source(v))


# --------------------------------------------------------------------------------------------
# evaluating the C function
# --------------------------------------------------------------------------------------------

def operand_values(signed: bool) -> np.ndarray:
    codes = np.arange(256)
    return np.where(codes > 127, codes - 256, codes) if signed else codes


def compile_and_tabulate(path: Path, name: str, signed: bool, legacy: bool, workdir: Path) -> np.ndarray:
    """products[i, j] = f(value i, value j) for operand values in code order 0..255."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise SystemExit("no C compiler (cc) found")
    library = workdir / f"{name}.so"
    subprocess.run([cc, "-O2", "-std=c99", "-Wall", "-Werror", "-shared", "-fPIC", str(path),
                    "-o", str(library)], check=True)
    fn = getattr(ctypes.CDLL(str(library)), name)
    values = operand_values(signed)
    table = np.empty((256, 256), dtype=np.int64)
    if legacy:
        fn.argtypes, fn.restype = [ctypes.c_uint64, ctypes.c_uint64], ctypes.c_uint64
        for i in range(256):
            for j in range(256):
                table[i, j] = fn(j, i)          # f(B, A): A = first operand i
    elif signed:
        fn.argtypes, fn.restype = [ctypes.c_int8, ctypes.c_int8], ctypes.c_int16
        for i, a in enumerate(values):
            for j, b in enumerate(values):
                table[i, j] = fn(int(a), int(b))
    else:
        fn.argtypes, fn.restype = [ctypes.c_uint8, ctypes.c_uint8], ctypes.c_uint16
        for i in range(256):
            for j in range(256):
                table[i, j] = fn(i, j)
    return table


def numpy_table(v: Variant) -> np.ndarray:
    values = operand_values(v.signed)
    a, b = values[:, None], values[None, :]
    p = v.design.numpy_core(np.abs(a), np.abs(b))
    return np.sign(a) * np.sign(b) * p if v.signed else p


def compute_metrics(table: np.ndarray, signed: bool, cells: int) -> dict:
    values = operand_values(signed)
    exact = values[:, None] * values[None, :]
    error = table - exact
    abs_error = np.abs(error)
    nonzero = exact != 0
    relative = abs_error[nonzero] / np.abs(exact[nonzero])
    return {"MAE%": abs_error.mean() / 2 ** 16 * 100, "MAE": float(abs_error.mean()),
            "WCE%": abs_error.max() / 2 ** 16 * 100, "WCE": int(abs_error.max()),
            "WCRE%": relative.max() * 100, "EP%": np.count_nonzero(error) / error.size * 100,
            "MRE%": relative.mean() * 100, "MSE": float((error.astype(np.float64) ** 2).mean()),
            "bias": float(error.mean()), "PWR_EST": EXACT_PWR[signed] * cells / ARRAY_CELLS}


_HEADER = re.compile(r"^//\s*(MAE%|MAE|WCE%|WCE|WCRE%|EP%|MRE%|MSE|PDK45_PWR)\s*=\s*"
                     r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)", re.MULTILINE)


def agrees(computed: float, printed: str) -> bool:
    """Printed value = computed rounded (or truncated) to the printed precision."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    step = 10.0 ** -decimals
    value = float(printed)
    return abs(computed - value) <= step / 2 + 1e-9 or 0 <= abs(computed) - abs(value) < step + 1e-9


def verify(v: Variant, workdir: Path) -> list[str]:
    """Problems found in v's file (empty: all good); prints its metrics."""
    path = OUT / v.filename
    problems = []
    if not path.is_file():
        return [f"{path} is missing (run make_multipliers.py without --check)"]
    table = compile_and_tabulate(path, v.name, v.signed, v.legacy, workdir)
    if not np.array_equal(table, numpy_table(v)):
        bad = np.argwhere(table != numpy_table(v))[0]
        problems.append(f"{v.filename}: C and numpy models differ, e.g. at operand codes {tuple(bad)}")
    m = compute_metrics(table, v.signed, v.design.cells)
    header = {key: text for key, text in _HEADER.findall(path.read_text())}
    for key in ("MAE%", "MAE", "WCE%", "WCE", "WCRE%", "EP%", "MRE%", "MSE", "PDK45_PWR"):
        if key not in header:
            problems.append(f"{v.filename}: header line {key} missing")
            continue
        computed = m["PWR_EST"] if key == "PDK45_PWR" else m[key]
        if not agrees(computed, header[key]):
            problems.append(f"{v.filename}: header {key} = {header[key]} but the C function gives "
                            f"{computed:.6g}")
    print(f"{v.name:15s} {SEVERITY[v.design.key]:6s} MAE% {m['MAE%']:.4f}  WCE% {m['WCE%']:.4f}  "
          f"EP% {m['EP%']:.2f}  MRE% {m['MRE%']:.4f}  WCRE% {m['WCRE%']:.2f}  MSE {m['MSE']:.1f}  "
          f"bias {m['bias']:.2f}  PWR(est.) {m['PWR_EST']:.3f} mW  "
          f"{'ok' if not problems else 'PROBLEMS'}")
    return problems


def graphswap_check(v: Variant) -> list[str]:
    """Run graphswap's own reader and check on the file (its metrics must agree with the header)."""
    from graphswap import multipliers as gm
    from graphswap.kernels import require_multiplier

    path = str(OUT / v.filename)
    result = gm.check(require_multiplier(path))
    problems = [] if result["passed"] else [f"{v.filename}: graphswap kernels check failed"]
    if result["signed"] != v.signed:
        problems.append(f"{v.filename}: graphswap reads it as {'signed' if result['signed'] else 'unsigned'}")
    for entry in result["header_comparison"]:
        if not entry["agrees"]:
            problems.append(f"{v.filename}: graphswap's {entry['metric']} {entry['computed']:.6g} "
                            f"disagrees with the header {entry['header']}")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="verify the files only")
    parser.add_argument("--graphswap", action="store_true",
                        help="also run graphswap's reader/check on every file")
    args = parser.parse_args(argv)
    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if not args.check:
            for v in VARIANTS:
                # compile the bare function first, then write the file with the computed header
                draft = workdir / f"draft_{v.filename}"
                draft.write_text("#include <stdint.h>\n\n" + v.design.helpers_c + function_source(v))
                table = compile_and_tabulate(draft, v.name, v.signed, v.legacy, workdir)
                (OUT / v.filename).write_text(file_source(v, compute_metrics(table, v.signed,
                                                                             v.design.cells)))
        problems = []
        for v in VARIANTS:
            problems += verify(v, workdir)
            if args.graphswap:
                problems += graphswap_check(v)
    for problem in problems:
        print("FAIL:", problem, file=sys.stderr)
    print("all headers agree with the C functions" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
