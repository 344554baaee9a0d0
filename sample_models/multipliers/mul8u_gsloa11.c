/***
 * mul8u_gsloa11: medium approximate 8x8 unsigned uint8 multiplier - array multiplier with
 * lower-part-OR accumulation, 11 OR'ed bits.
 * Written for graphswap's sample_models (not part of EvoApproxLib); EvoApproxLib-style
 * file: one function, header metrics below.  Generated and verified by
 * sample_models/make_multipliers.py; edit that script, not this file.
 *
 * Signature: uint16_t f(uint8_t A, uint8_t B).
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
 * Metrics (computed over all 65536 operand pairs from this C function by make_multipliers.py;
 * EvoApproxLib conventions): MAE% = mean|approx - exact| / 2^16 * 100, WCE% = max|approx -
 * exact| / 2^16 * 100, WCRE% = max relative error over non-zero exact products, EP% = share of
 * operand pairs with any error, MRE% = mean relative error over non-zero exact products, MSE =
 * mean squared error.
 *
 * PDK45_PWR is an ESTIMATE, NOT a synthesis result: the exact 8x8 multiplier's 0.391 mW
 * (EvoApproxLib mul8u_1JFF, PDK45) times the share of array cells kept (74 of 128: one AND gate
 * per partial-product bit generated plus one adder cell per bit summed by an adder; OR gates
 * count as nothing). PDK45_AREA and PDK45_DELAY are not given: they would need synthesis.
 *
 * mean error (bias) = -304.49
 ***/
// MAE% = 0.7914 %
// MAE = 518.64
// WCE% = 4.2877 %
// WCE = 2810
// WCRE% = 48.43 %
// EP% = 86.52 %
// MRE% = 5.8951 %
// MSE = 500611.3
// PDK45_PWR = 0.226 mW   (ESTIMATE from the kept array cells, NOT a synthesis result)

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

uint16_t mul8u_gsloa11(uint8_t A, uint8_t B)
{
    uint32_t ma = A, mb = B;
    uint32_t p = 0;
    for (int j = 0; j < 8; ++j) {
        uint32_t row = ((mb >> j) & 1u) ? (ma << j) : 0u;   /* partial-product row j */
        p = loa_add(p, row);                              /* LOA with 11 OR'ed bits */
    }
    return (uint16_t)p;
}
