/***
 * mul8s_gsot36: severe approximate 8x8 signed int8 (two's complement operands, sign-magnitude
 * core) multiplier - operand truncation, 3 low bits of A and 6 of B not wired.
 * Written for graphswap's sample_models (not part of EvoApproxLib); EvoApproxLib-style
 * file: one function, header metrics below.  Generated and verified by
 * sample_models/make_multipliers.py; edit that script, not this file.
 *
 * Signature: int16_t f(int8_t A, int8_t B).
 * First operand A = activation, second operand B = weight (graphswap's convention).
 *
 * Static operand truncation: the 3 least significant bits of the first operand A (the
 * activation) and the 6 least significant bits of the second operand B (the weight) are not
 * wired into the array, leaving a (5 x 2)-bit array of 10 partial-product bits whose product is
 * shifted back into place ((A >> 3 << 3) * (B >> 6 << 6)). The simplest way to shrink a
 * multiplier (cf. the fixed-width / truncated multipliers surveyed by H. Jiang et al.,
 * 'Approximate arithmetic circuits: a survey, characterization, and recent applications', Proc.
 * IEEE 108(12), 2020), here deliberately severe: errors up to about 27% of full scale, always
 * downwards, and operand order matters (A and B are truncated differently).
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
 * (EvoApproxLib mul8s_1KV6, PDK45) times the share of array cells kept (20 of 128: one AND gate
 * per partial-product bit generated plus one adder cell per bit summed by an adder; OR gates
 * count as nothing, the sign-magnitude conversion is not counted). PDK45_AREA and PDK45_DELAY
 * are not given: they would need synthesis.
 *
 * mean error (bias) = 0.00
 ***/
// MAE% = 3.2497 %
// MAE = 2129.75
// WCE% = 12.8922 %
// WCE = 8449
// WCRE% = 100.00 %
// EP% = 99.08 %
// MRE% = 69.1348 %
// MSE = 7778510.2
// PDK45_PWR = 0.066 mW   (ESTIMATE from the kept array cells, NOT a synthesis result)

#include <stdint.h>

int16_t mul8s_gsot36(int8_t A, int8_t B)
{
    /* sign-magnitude: the unsigned core multiplies |A| and |B| (0..128) */
    uint32_t ma = (uint32_t)(A < 0 ? -(int32_t)A : (int32_t)A);
    uint32_t mb = (uint32_t)(B < 0 ? -(int32_t)B : (int32_t)B);
    uint32_t ta = ma & ~((1u << 3) - 1u);   /* A's 3 low bits not wired */
    uint32_t tb = mb & ~((1u << 6) - 1u);   /* B's 6 low bits not wired */
    uint32_t p = ta * tb;
    int32_t s = ((A < 0) != (B < 0)) ? -(int32_t)p : (int32_t)p;
    return (int16_t)s;
}
