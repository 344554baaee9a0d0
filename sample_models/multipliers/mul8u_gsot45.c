/***
 * mul8u_gsot45: severe approximate 8x8 unsigned uint8 multiplier - operand truncation, 4 low
 * bits of A and 5 of B not wired.
 * Written for graphswap's sample_models (not part of EvoApproxLib); EvoApproxLib-style
 * file: one function, header metrics below.  Generated and verified by
 * sample_models/make_multipliers.py; edit that script, not this file.
 *
 * Signature: uint16_t f(uint8_t A, uint8_t B).
 * First operand A = activation, second operand B = weight (graphswap's convention).
 *
 * Static operand truncation: the 4 least significant bits of the first operand A (the
 * activation) and the 5 least significant bits of the second operand B (the weight) are not
 * wired into the array, leaving a (4 x 3)-bit array of 12 partial-product bits whose product is
 * shifted back into place ((A >> 4 << 4) * (B >> 5 << 5)). The simplest way to shrink a
 * multiplier (cf. the fixed-width / truncated multipliers surveyed by H. Jiang et al.,
 * 'Approximate arithmetic circuits: a survey, characterization, and recent applications', Proc.
 * IEEE 108(12), 2020), here deliberately severe: errors up to about 17% of full scale, always
 * downwards, and operand order matters (A and B are truncated differently).
 *
 * Metrics (computed over all 65536 operand pairs from this C function by make_multipliers.py;
 * EvoApproxLib conventions): MAE% = mean|approx - exact| / 2^16 * 100, WCE% = max|approx -
 * exact| / 2^16 * 100, WCRE% = max relative error over non-zero exact products, EP% = share of
 * operand pairs with any error, MRE% = mean relative error over non-zero exact products, MSE =
 * mean squared error.
 *
 * PDK45_PWR is an ESTIMATE, NOT a synthesis result: the exact 8x8 multiplier's 0.391 mW
 * (EvoApproxLib mul8u_1JFF, PDK45) times the share of array cells kept (24 of 128: one AND gate
 * per partial-product bit generated plus one adder cell per bit summed by an adder; OR gates
 * count as nothing). PDK45_AREA and PDK45_DELAY are not given: they would need synthesis.
 *
 * mean error (bias) = -2816.25
 ***/
// MAE% = 4.2973 %
// MAE = 2816.25
// WCE% = 17.1890 %
// WCE = 11265
// WCRE% = 100.00 %
// EP% = 99.06 %
// MRE% = 34.3447 %
// MSE = 11851726.2
// PDK45_PWR = 0.073 mW   (ESTIMATE from the kept array cells, NOT a synthesis result)

#include <stdint.h>

uint16_t mul8u_gsot45(uint8_t A, uint8_t B)
{
    uint32_t ma = A, mb = B;
    uint32_t ta = ma & ~((1u << 4) - 1u);   /* A's 4 low bits not wired */
    uint32_t tb = mb & ~((1u << 5) - 1u);   /* B's 5 low bits not wired */
    uint32_t p = ta * tb;
    return (uint16_t)p;
}
