/***
 * mul4x8u_gsbam4: approximate 4x8 unsigned multiplier (4-bit activation x 8-bit weight) - broken-array
 * multiplier, vertical break line 4.
 * Written for graphswap's sample_models (not part of EvoApproxLib); EvoApproxLib-style Nx8 file:
 * one function in EvoApproxLib's mixed-precision signature, operand comments, header metrics below.
 *
 * Signature: uint64_t mul4x8u_gsbam4(const uint64_t A, const uint64_t B),
 * the product in the low 12 bits.  A = activation (4 bits), B = weight (8 bits).
 *
 * Broken-array multiplier (BAM; Mahdiani et al., IEEE TCAS-I 57(4), 2010) with vertical break line
 * VBL = 4: the partial-product bits a_i & b_j with i + j < 4 (10 of the 32 bits)
 * never reach the sum; the result is never larger than the exact product.
 *
 * Metrics computed over all 16 x 256 operand pairs at the circuit's own output width
 * (12 bits, EvoApproxLib's convention for its mixed-precision files): MAE% = mean|approx - exact| / 2^12
 * * 100, WCE% = max|approx - exact| / 2^12 * 100, WCRE% = max relative error over non-zero exact
 * products, EP% = share of pairs with any error, MRE% = mean relative error over non-zero exact
 * products, MSE = mean squared error.
 *
 * PDK45_PWR is an ESTIMATE, NOT a synthesis result (the rule of the 8x8 examples,
 * sample_models/make_multipliers.py): the exact 8x8 multiplier's 0.391 mW (EvoApproxLib
 * mul8u_1JFF, PDK45) times the share of the 8x8 array's 128 cells this circuit keeps (44: one
 * AND gate per partial-product bit generated plus one adder cell per bit summed).  PDK45_AREA and
 * PDK45_DELAY are not given: they would need synthesis.
 *
 * mean error (bias) = -12.2500
 ***/
// MAE% = 0.2991 %
// MAE = 12.2500
// WCE% = 1.1963 %
// WCE = 49
// WCRE% = 100.00 %
// EP% = 81.2500 %
// MRE% = 4.7991 %
// MSE = 248.2500
// PDK45_PWR = 0.1344 mW   (ESTIMATE from the kept array cells, NOT a synthesis result)

#include <stdint.h>

uint64_t mul4x8u_gsbam4(const uint64_t A /* 4-bit unsigned operand */, const uint64_t B /* 8-bit unsigned operand */)
{
    uint64_t p = 0;
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 8; ++j)
            if (i + j >= 4)
                p += (((A >> i) & 1u) & ((B >> j) & 1u)) << (i + j);
    return p & 4095u;
}
