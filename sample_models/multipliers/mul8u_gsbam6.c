/***
 * mul8u_gsbam6: mild approximate 8x8 unsigned uint8 multiplier - broken-array multiplier,
 * vertical break line 6.
 * Written for graphswap's sample_models (not part of EvoApproxLib); EvoApproxLib-style
 * file: one function, header metrics below.  Generated and verified by
 * sample_models/make_multipliers.py; edit that script, not this file.
 *
 * Signature: uint16_t f(uint8_t A, uint8_t B).
 * First operand A = activation, second operand B = weight (graphswap's convention).
 *
 * Broken-array multiplier (BAM; H. R. Mahdiani, A. Ahmadi, S. M. Fakhraie, C. Lucas,
 * 'Bio-inspired imprecise computational blocks for efficient VLSI implementation of
 * soft-computing applications', IEEE TCAS-I 57(4), 2010) with vertical break line VBL = 6 and
 * no horizontal break: the carry-save cells of every partial-product bit a_i & b_j with i + j <
 * 6 are removed from the 8x8 array, so those 21 of the 64 partial-product bits (columns 0..5)
 * never reach the sum. The result is never larger than the exact product (a negative bias).
 *
 * Metrics (computed over all 65536 operand pairs from this C function by make_multipliers.py;
 * EvoApproxLib conventions): MAE% = mean|approx - exact| / 2^16 * 100, WCE% = max|approx -
 * exact| / 2^16 * 100, WCRE% = max relative error over non-zero exact products, EP% = share of
 * operand pairs with any error, MRE% = mean relative error over non-zero exact products, MSE =
 * mean squared error.
 *
 * PDK45_PWR is an ESTIMATE, NOT a synthesis result: the exact 8x8 multiplier's 0.391 mW
 * (EvoApproxLib mul8u_1JFF, PDK45) times the share of array cells kept (86 of 128: one AND gate
 * per partial-product bit generated plus one adder cell per bit summed by an adder; OR gates
 * count as nothing). PDK45_AREA and PDK45_DELAY are not given: they would need synthesis.
 *
 * mean error (bias) = -80.25
 ***/
// MAE% = 0.1225 %
// MAE = 80.25
// WCE% = 0.4898 %
// WCE = 321
// WCRE% = 100.00 %
// EP% = 93.75 %
// MRE% = 2.6375 %
// MSE = 9158.2
// PDK45_PWR = 0.263 mW   (ESTIMATE from the kept array cells, NOT a synthesis result)

#include <stdint.h>

uint16_t mul8u_gsbam6(uint8_t A, uint8_t B)
{
    uint32_t ma = A, mb = B;
    uint32_t p = 0;
    for (int j = 0; j < 8; ++j) {
        if (!((mb >> j) & 1u))
            continue;
        uint32_t row = ma << j;                    /* row j of the array: a_i & b_j at column i + j */
        row &= ~((1u << 6) - 1u);              /* broken array: columns 0..5 have no cells */
        p += row;
    }
    return (uint16_t)p;
}
