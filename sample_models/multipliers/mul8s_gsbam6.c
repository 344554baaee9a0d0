/***
 * mul8s_gsbam6: mild approximate 8x8 signed int8 (two's complement operands, sign-magnitude
 * core) multiplier - broken-array multiplier, vertical break line 6.
 * Written for graphswap's sample_models (not part of EvoApproxLib); EvoApproxLib-style
 * file: one function, header metrics below.  Generated and verified by
 * sample_models/make_multipliers.py; edit that script, not this file.
 *
 * Signature: int16_t f(int8_t A, int8_t B).
 * First operand A = activation, second operand B = weight (graphswap's convention).
 *
 * Broken-array multiplier (BAM; H. R. Mahdiani, A. Ahmadi, S. M. Fakhraie, C. Lucas,
 * 'Bio-inspired imprecise computational blocks for efficient VLSI implementation of
 * soft-computing applications', IEEE TCAS-I 57(4), 2010) with vertical break line VBL = 6 and
 * no horizontal break: the carry-save cells of every partial-product bit a_i & b_j with i + j <
 * 6 are removed from the 8x8 array, so those 21 of the 64 partial-product bits (columns 0..5)
 * never reach the sum. The result is never larger than the exact product (a negative bias).
 *
 * Signed variant: A and B are converted to sign-magnitude, the unsigned core multiplies the
 * magnitudes |A|, |B| (0..128), and the product is negated when the signs differ, so the error
 * is symmetric about zero.
 *
 * Metrics (computed over all 65536 operand pairs from this C function by make_multipliers.py;
 * EvoApproxLib conventions): MAE% = mean|approx - exact| / 2^16 * 100, WCE% = max|approx -
 * exact| / 2^16 * 100, WCRE% = max relative error over non-zero exact products, EP% = share of
 * operand pairs with any error, MRE% = mean relative error over non-zero exact products, MSE =
 * mean squared error.
 *
 * PDK45_PWR is an ESTIMATE, NOT a synthesis result: the exact 8x8 multiplier's 0.425 mW
 * (EvoApproxLib mul8s_1KV6, PDK45) times the share of array cells kept (86 of 128: one AND gate
 * per partial-product bit generated plus one adder cell per bit summed by an adder; OR gates
 * count as nothing, the sign-magnitude conversion is not counted). PDK45_AREA and PDK45_DELAY
 * are not given: they would need synthesis.
 *
 * mean error (bias) = 0.00
 ***/
// MAE% = 0.1225 %
// MAE = 80.25
// WCE% = 0.4898 %
// WCE = 321
// WCRE% = 100.00 %
// EP% = 93.75 %
// MRE% = 7.5868 %
// MSE = 9158.2
// PDK45_PWR = 0.286 mW   (ESTIMATE from the kept array cells, NOT a synthesis result)

#include <stdint.h>

int16_t mul8s_gsbam6(int8_t A, int8_t B)
{
    /* sign-magnitude: the unsigned core multiplies |A| and |B| (0..128) */
    uint32_t ma = (uint32_t)(A < 0 ? -(int32_t)A : (int32_t)A);
    uint32_t mb = (uint32_t)(B < 0 ? -(int32_t)B : (int32_t)B);
    uint32_t p = 0;
    for (int j = 0; j < 8; ++j) {
        if (!((mb >> j) & 1u))
            continue;
        uint32_t row = ma << j;                    /* row j of the array: a_i & b_j at column i + j */
        row &= ~((1u << 6) - 1u);              /* broken array: columns 0..5 have no cells */
        p += row;
    }
    int32_t s = ((A < 0) != (B < 0)) ? -(int32_t)p : (int32_t)p;
    return (int16_t)s;
}
