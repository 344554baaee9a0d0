/***
 * mul8s_gsloa11: medium approximate 8x8 signed int8 (two's complement operands, sign-magnitude
 * core) multiplier - array multiplier with lower-part-OR accumulation, 11 OR'ed bits.
 * Written for graphswap's sample_models (not part of EvoApproxLib); EvoApproxLib-style
 * file: one function, header metrics below.  Generated and verified by
 * sample_models/make_multipliers.py; edit that script, not this file.
 *
 * Signature: int16_t f(int8_t A, int8_t B).
 * First operand A = activation, second operand B = weight (graphswap's convention).
 *
 * Array multiplier whose eight partial-product rows are accumulated one after another with
 * lower-part-OR adders (LOA; Mahdiani et al., IEEE TCAS-I 57(4), 2010): in every row addition
 * the 11 least significant bits are computed by OR gates (a_k | b_k) instead of full adders,
 * and the exact upper-part adder receives the AND of the two lower parts' most significant bits
 * as its carry-in (LOA's carry prediction). All 64 partial-product bits are generated; the 54
 * of them in columns 0..10 are summed by OR gates. Errors appear only when two added bits in
 * the lower part are both 1, so small operands are often exact; the bias is negative.
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
 * (EvoApproxLib mul8s_1KV6, PDK45) times the share of array cells kept (74 of 128: one AND gate
 * per partial-product bit generated plus one adder cell per bit summed by an adder; OR gates
 * count as nothing, the sign-magnitude conversion is not counted). PDK45_AREA and PDK45_DELAY
 * are not given: they would need synthesis.
 *
 * mean error (bias) = 0.00
 ***/
// MAE% = 0.5594 %
// MAE = 366.61
// WCE% = 3.5919 %
// WCE = 2354
// WCRE% = 48.43 %
// EP% = 79.58 %
// MRE% = 10.3949 %
// MSE = 309276.1
// PDK45_PWR = 0.246 mW   (ESTIMATE from the kept array cells, NOT a synthesis result)

#include <stdint.h>

/* lower-part-OR adder: bits 0..10 OR'ed, exact upper part with carry-in
   x[10] & y[10] */
static uint32_t loa_add(uint32_t x, uint32_t y)
{
    const uint32_t lower_mask = (1u << 11) - 1u;
    uint32_t carry = (x >> 10) & (y >> 10) & 1u;
    uint32_t upper = ((x >> 11) + (y >> 11) + carry) << 11;
    return upper | ((x | y) & lower_mask);
}

int16_t mul8s_gsloa11(int8_t A, int8_t B)
{
    /* sign-magnitude: the unsigned core multiplies |A| and |B| (0..128) */
    uint32_t ma = (uint32_t)(A < 0 ? -(int32_t)A : (int32_t)A);
    uint32_t mb = (uint32_t)(B < 0 ? -(int32_t)B : (int32_t)B);
    uint32_t p = 0;
    for (int j = 0; j < 8; ++j) {
        uint32_t row = ((mb >> j) & 1u) ? (ma << j) : 0u;   /* partial-product row j */
        p = loa_add(p, row);                              /* LOA with 11 OR'ed bits */
    }
    int32_t s = ((A < 0) != (B < 0)) ? -(int32_t)p : (int32_t)p;
    return (int16_t)s;
}
