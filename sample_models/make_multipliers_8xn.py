"""Write the 8xN example multipliers in sample_models/multipliers/ (mul8x4u_gsbam4.c,
mul8x2u_gsbam3.c: broken-array circuits in EvoApproxLib's mixed-precision signature), with header
metrics computed from a numpy model of the circuit over all 256 x 2^N operand pairs at the circuit's
own output width (8 + N bits).  tests/test_multipliers_8xn.py checks that the C function equals
that model on every pair and that `graphswap kernels check` reproduces every header metric.
Also the Nx8 example mul4x8u_gsbam4.c (a 4-bit activation A x an 8-bit weight B; the same rules
over its 16 x 256 pairs), checked by tests/test_multipliers_nx8.py.

    python sample_models/make_multipliers_8xn.py [OUTPUT_DIR]
"""
import numpy as np, sys
from pathlib import Path

def bam(n_bits, vbl, a_bits=8):
    a = np.arange(2 ** a_bits)[:, None]; b = np.arange(2 ** n_bits)[None, :]
    p = np.zeros((2 ** a_bits, 2 ** n_bits), np.int64)
    for i in range(a_bits):
        for j in range(n_bits):
            if i + j >= vbl:
                p += (((a >> i) & 1) & ((b >> j) & 1)) << (i + j)
    return p

def metrics(p, n_bits, a_bits=8):
    a = np.arange(2 ** a_bits)[:, None]; b = np.arange(2 ** n_bits)[None, :]
    exact = a * b; err = p - exact; ae = np.abs(err); full = 2 ** (a_bits + n_bits)
    nz = exact != 0
    return dict(MAE=ae.mean(), MAEp=ae.mean() / full * 100, WCE=ae.max(), WCEp=ae.max() / full * 100,
                WCREp=(ae[nz] / exact[nz]).max() * 100, EPp=np.count_nonzero(err) / err.size * 100,
                MREp=(ae[nz] / exact[nz]).mean() * 100, MSE=(err.astype(float) ** 2).mean(), bias=err.mean())

TEMPLATE = """/***
 * {name}: approximate {a}x{n} unsigned multiplier ({a}-bit activation x {n}-bit weight) - broken-array
 * multiplier, vertical break line {vbl}.
 * Written for graphswap's sample_models (not part of EvoApproxLib); EvoApproxLib-style {kind} file:
 * one function in EvoApproxLib's mixed-precision signature, operand comments, header metrics below.
 *
 * Signature: uint64_t {name}(const uint64_t A, const uint64_t B),
 * the product in the low {w} bits.  A = activation ({a} bits), B = weight ({n} bits).
 *
 * Broken-array multiplier (BAM; Mahdiani et al., IEEE TCAS-I 57(4), 2010) with vertical break line
 * VBL = {vbl}: the partial-product bits a_i & b_j with i + j < {vbl} ({dropped} of the {total} bits)
 * never reach the sum; the result is never larger than the exact product.
 *
 * Metrics computed over all {a_levels} x {levels} operand pairs at the circuit's own output width
 * ({w} bits, EvoApproxLib's convention for its {convention} files): MAE% = mean|approx - exact| / 2^{w}
 * * 100, WCE% = max|approx - exact| / 2^{w} * 100, WCRE% = max relative error over non-zero exact
 * products, EP% = share of pairs with any error, MRE% = mean relative error over non-zero exact
 * products, MSE = mean squared error.
 *
 * PDK45_PWR is an ESTIMATE, NOT a synthesis result (the rule of the 8x8 examples,
 * sample_models/make_multipliers.py): the exact 8x8 multiplier's 0.391 mW (EvoApproxLib
 * mul8u_1JFF, PDK45) times the share of the 8x8 array's 128 cells this circuit keeps ({cells}: one
 * AND gate per partial-product bit generated plus one adder cell per bit summed).  PDK45_AREA and
 * PDK45_DELAY are not given: they would need synthesis.
 *
 * mean error (bias) = {bias:.4f}
 ***/
// MAE% = {MAEp:.4f} %
// MAE = {MAE:.4f}
// WCE% = {WCEp:.4f} %
// WCE = {WCE}
// WCRE% = {WCREp:.2f} %
// EP% = {EPp:.4f} %
// MRE% = {MREp:.4f} %
// MSE = {MSE:.4f}
// PDK45_PWR = {pwr:.4f} mW   (ESTIMATE from the kept array cells, NOT a synthesis result)

#include <stdint.h>

uint64_t {name}(const uint64_t A /* {a}-bit unsigned operand */, const uint64_t B /* {n}-bit unsigned operand */)
{{
    uint64_t p = 0;
    for (int i = 0; i < {a}; ++i)
        for (int j = 0; j < {n}; ++j)
            if (i + j >= {vbl})
                p += (((A >> i) & 1u) & ((B >> j) & 1u)) << (i + j);
    return p & {mask}u;
}}
"""
out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "multipliers"
for a, n, vbl in ((8, 4, 4), (8, 2, 3), (4, 8, 4)):
    name = f"mul{a}x{n}u_gsbam{vbl}"
    p = bam(n, vbl, a)
    m = metrics(p, n, a)
    dropped = sum(1 for i in range(a) for j in range(n) if i + j < vbl)
    (out / f"{name}.c").write_text(TEMPLATE.format(name=name, a=a, n=n, vbl=vbl, w=a + n,
        levels=2 ** n, a_levels=2 ** a, kind="8xN" if a == 8 else "Nx8",
        convention="8xN" if a == 8 else "mixed-precision", dropped=dropped,
        total=a * n, mask=2 ** (a + n) - 1, cells=2 * (a * n - dropped),
        pwr=0.391 * 2 * (a * n - dropped) / 128, **m))
    print(name, m)
