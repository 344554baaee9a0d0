/* fp8_e4m3_mitchell: an approximate 8-bit floating-point multiplier (graphswap example).
 *
 * Operands: two OCP FP8 E4M3 codes (S EEEE MMM, bias 7, 0x7F/0xFF NaN).  The significands are
 * multiplied with Mitchell's logarithmic approximation, (1 + x)(1 + y) ~ 1 + x + y when x + y < 1,
 * else 2 (x + y) - the adder-only multiplier of J. N. Mitchell, "Computer multiplication and
 * division using binary logarithms", IRE Trans. Electronic Computers, 1962 - so the product
 * needs no 4x4 significand multiplier; exponents add exactly, signs XOR, zero operands give a
 * (signed) zero, a NaN operand gives NaN.  Worst case relative error -11.1% (x = y = 1/2).
 * Use it as 'fp8_e4m3:fp8_e4m3_mitchell.c' (graphswap/kernels/fp8.py).
 */
#include <stdint.h>
#include <string.h>

static float fp8_pow2(int n) /* 2^n for -126 <= n <= 127 */
{
    uint32_t bits = (uint32_t)(n + 127) << 23;
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* |code| as significand (8..15, in eighths) and exponent; returns 0 for a zero */
static int fp8_e4m3_parts(uint8_t code, int *significand, int *exponent)
{
    int e = (code >> 3) & 15, m = code & 7;
    if (e == 0) {
        if (m == 0) return 0;
        e = -6;
        while (m < 8) { m <<= 1; --e; } /* normalise a subnormal */
        *significand = m;
        *exponent = e;
        return 1;
    }
    *significand = 8 + m;
    *exponent = e - 7;
    return 1;
}

float fp8_e4m3_mitchell(uint8_t a, uint8_t b)
{
    float sign = ((a ^ b) & 0x80) ? -1.0f : 1.0f;
    if ((a & 0x7F) == 0x7F || (b & 0x7F) == 0x7F) {
        float zero = 0.0f;
        return zero / zero; /* NaN */
    }
    int sa, ea, sb, eb;
    if (!fp8_e4m3_parts(a, &sa, &ea) || !fp8_e4m3_parts(b, &sb, &eb)) return sign * 0.0f;
    int fraction = (sa - 8) + (sb - 8); /* x + y, in eighths */
    int product = fraction < 8 ? 8 + fraction : 2 * fraction; /* the significand, in eighths */
    return sign * (float)product * fp8_pow2(ea + eb - 3);
}
