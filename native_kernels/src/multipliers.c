/*
 * multipliers.c -- graphswap's built-in 8-bit multipliers, as C scalar functions, and the exported
 * graphswap_builtin_multiplier_table() that evaluates one of them into the 65536-entry table the
 * table-driven kernels (lut_matmul.c, lut_conv.c) take.
 *
 * Why in C: the built-ins are the same kind of object a user brings (a scalar C function of two
 * 8-bit operands), so they go through exactly the same path (scalar function -> table -> LUT
 * kernels); the tests check every table against an independent Python model of each paper.
 *
 * Operand conventions (see graphswap_kernels.h): unsigned multipliers take operands 0..255; signed
 * ones take int8 values -128..127, i.e. table index code = (uint8_t)value.  The first operand `a` is
 * the activation / left matrix, the second `b` the weight / right matrix.  All designs below are
 * symmetric in a and b.
 *
 * Designs and citations:
 *
 *   mul8u_exact / mul8s_exact   the exact product a*b.
 *
 *   mul8u_trunc{k} / mul8s_trunc{k}, k = 1..8  -- "truncated product": the exact product with its k
 *       least significant bits cleared, the simplest output-truncation approximate multiplier (e.g.
 *       the truncated multipliers surveyed in H. Jiang, C. Liu, L. Liu, F. Lombardi, J. Han,
 *       "A Review, Classification, and Comparative Evaluation of Approximate Arithmetic Circuits",
 *       ACM JETC 13(4), 2017).  Signed: the k LSBs are cleared in the 16-bit two's-complement
 *       representation of the exact product, i.e. p & ~(2^k - 1) == floor(p / 2^k) * 2^k (rounds
 *       toward minus infinity, so negative products move away from zero: -3 -> -4 for k = 2).
 *
 *   mul8u_drum{k} / mul8s_drum{k}, k = 3..6  -- DRUM, S. Hashemi, R. I. Bahar, S. Reda, "DRUM: A
 *       Dynamic Range Unbiased Multiplier for Approximate Applications", ICCAD 2015.  Each operand x
 *       keeps only the k bits starting at its leading one: if x < 2^k it is used unchanged;
 *       otherwise, with t the position of its leading one and s = t - k + 1, the k-bit segment
 *       (x >> s) has its least significant bit forced to 1 (the unbiasing step: the expected value
 *       of the discarded bits) and stands for x ~= ((x >> s) | 1) << s.  The two k-bit segments are
 *       multiplied exactly and the product shifted left by s_a + s_b.  Signed operands use
 *       sign-magnitude, as the paper does for signed inputs: |a| and |b| (|-128| = 128 is a valid
 *       8-bit magnitude) go through the unsigned DRUM, and the product is negated if the signs differ.
 *
 *   mul8u_mitchell / mul8s_mitchell  -- J. N. Mitchell, "Computer Multiplication and Division Using
 *       Binary Logarithms", IRE Transactions on Electronic Computers EC-11(4), 1962.  Write
 *       x = 2^k (1 + f), 0 <= f < 1 (k = position of the leading one, f = (x - 2^k) / 2^k).  Then
 *       log2(a b) ~= k_a + k_b + f_a + f_b and the antilogarithm is approximated piecewise linearly:
 *         f_a + f_b <  1:  a b ~= 2^(k_a + k_b) (1 + f_a + f_b)
 *         f_a + f_b >= 1:  a b ~= 2^(k_a + k_b + 1) (f_a + f_b)
 *       For 8-bit operands 2^(k_a+k_b) (f_a + f_b) = r_a 2^k_b + r_b 2^k_a with r = x - 2^k, an
 *       integer, so the result is exact in integers (no extra truncation); a = 0 or b = 0 gives 0.
 *       Signed: sign-magnitude as for DRUM.
 */
#include <string.h>

#include "internal.h"

/* ---- scalar designs on magnitudes (0..256 is enough for |int8|) ---- */

static int leading_one(uint32_t x) /* x > 0 */
{
    return 31 - __builtin_clz(x);
}

static int32_t exact_u(uint32_t a, uint32_t b) { return (int32_t)(a * b); }

static int32_t drum_u(uint32_t a, uint32_t b, int k)
{
    uint32_t sa = 0, sb = 0;
    if (a >= (1u << k)) {
        sa = (uint32_t)(leading_one(a) - k + 1);
        a = (a >> sa) | 1u;
    }
    if (b >= (1u << k)) {
        sb = (uint32_t)(leading_one(b) - k + 1);
        b = (b >> sb) | 1u;
    }
    return (int32_t)((a * b) << (sa + sb));
}

static int32_t mitchell_u(uint32_t a, uint32_t b)
{
    if (a == 0 || b == 0) return 0;
    int ka = leading_one(a), kb = leading_one(b);
    uint32_t ra = a - (1u << ka), rb = b - (1u << kb);
    uint32_t frac = (ra << kb) + (rb << ka); /* 2^(ka+kb) * (f_a + f_b) */
    uint32_t one = 1u << (ka + kb);
    if (frac < one) return (int32_t)(one + frac);
    return (int32_t)(2u * frac);
}

/* ---- the named built-ins ---- */

typedef enum { GS_EXACT, GS_TRUNC, GS_DRUM, GS_MITCHELL } gs_design;

static int32_t design_u(gs_design d, int param, uint32_t a, uint32_t b)
{
    switch (d) {
    case GS_EXACT: return exact_u(a, b);
    case GS_TRUNC: return (int32_t)((a * b) & ~((1u << param) - 1u));
    case GS_DRUM: return drum_u(a, b, param);
    case GS_MITCHELL: return mitchell_u(a, b);
    }
    return 0;
}

static int32_t design_s(gs_design d, int param, int32_t a, int32_t b)
{
    if (d == GS_TRUNC) {
        int32_t p = a * b; /* two's complement; clearing bits == floor to a multiple of 2^param */
        return (int32_t)((uint32_t)p & ~((1u << param) - 1u));
    }
    uint32_t ma = (uint32_t)(a < 0 ? -a : a), mb = (uint32_t)(b < 0 ? -b : b);
    int32_t m = design_u(d, param, ma, mb);
    return ((a < 0) != (b < 0)) ? -m : m;
}

/* Parses "<family><k>" with k in [lo, hi]; returns 1 and sets *k on success. */
static int parse_param(const char *text, const char *family, int lo, int hi, int *k)
{
    size_t len = strlen(family);
    if (strncmp(text, family, len) != 0) return 0;
    const char *digits = text + len;
    if (digits[0] < '0' || digits[0] > '9' || (digits[1] != '\0' && (digits[1] < '0' || digits[1] > '9')) ||
        (digits[1] != '\0' && digits[2] != '\0') || (digits[0] == '0'))
        return 0;
    int value = digits[0] - '0';
    if (digits[1] != '\0') value = value * 10 + (digits[1] - '0');
    if (value < lo || value > hi) return 0;
    *k = value;
    return 1;
}

/*
 * Fills table[(a_code << 8) | b_code] (65536 int32 entries) with the built-in multiplier `name`,
 * e.g. "mul8u_drum4", "mul8s_trunc3", "mul8s_mitchell".  Returns GRAPHSWAP_OK, or
 * GRAPHSWAP_ERR_INVALID_ARGUMENT (with a message) for an unknown name or a NULL pointer.
 */
GRAPHSWAP_EXPORT int32_t graphswap_builtin_multiplier_table(const char *name, int32_t *table)
{
    if (!name || !table)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT,
                       "graphswap_builtin_multiplier_table: name and table must not be NULL");
    int is_signed;
    if (strncmp(name, "mul8u_", 6) == 0) is_signed = 0;
    else if (strncmp(name, "mul8s_", 6) == 0) is_signed = 1;
    else goto unknown;
    const char *rest = name + 6;
    gs_design design;
    int param = 0;
    if (strcmp(rest, "exact") == 0) design = GS_EXACT;
    else if (strcmp(rest, "mitchell") == 0) design = GS_MITCHELL;
    else if (parse_param(rest, "trunc", 1, 8, &param)) design = GS_TRUNC;
    else if (parse_param(rest, "drum", 3, 6, &param)) design = GS_DRUM;
    else goto unknown;

    for (int a = 0; a < 256; ++a) {
        for (int b = 0; b < 256; ++b) {
            int32_t v = is_signed ? design_s(design, param, (int8_t)a, (int8_t)b)
                                  : design_u(design, param, (uint32_t)a, (uint32_t)b);
            table[(a << 8) | b] = v;
        }
    }
    return GRAPHSWAP_OK;

unknown:
    return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT,
                   "graphswap_builtin_multiplier_table: unknown built-in multiplier '%.64s'; known: "
                   "mul8{u,s}_exact, mul8{u,s}_trunc{1..8}, mul8{u,s}_drum{3..6}, mul8{u,s}_mitchell",
                   name);
}
