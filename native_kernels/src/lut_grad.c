/*
 * lut_grad.c -- approximation-aware gradients of table-driven products (backward="lut_grad").
 *
 * graphswap_lut_derivative_tables: the table's own partial derivatives, as smoothed (central,
 * half-width h) finite differences in operand-value order, clamped at the ends of the range:
 *
 *     d_first [(ca << 8) | cb] = (f(a+, b) - f(a-, b)) / (a+ - a-),  a+ = min(a + h, amax),
 *                                                                    a- = max(a - h, amin)
 *     d_second[(ca << 8) | cb] = (f(a, b+) - f(a, b-)) / (b+ - b-)   (likewise over b)
 *
 * where a, b are the operand values of codes ca, cb (0..255 unsigned; the two's-complement value
 * -128..127 of the byte for signed tables), f(a, b) = table[(code(a) << 8) | code(b)].
 *
 * graphswap_lut_matmul_grad: the two gradient products of y = sum_k table[a[i,k], b[k,j]]
 * (codes) with those derivatives in place of the table's:
 *
 *     da[i,k] = sum_j d_first [(a[i,k] << 8) | b[k,j]] * sign[k,j] * g_a[i,j]
 *     db[k,j] = sum_i d_second[(a[i,k] << 8) | b[k,j]] * g_b[i,j]
 *
 * (sign = +1 everywhere when NULL; either output may be NULL to skip it, its g then too.)  Sums
 * in double, results stored as float.  Rows of da and rows of db are independent and split over
 * OpenMP threads.
 */
#include <string.h>

#include "internal.h"

static int code_of(int value, int signed_operands)
{
    return signed_operands ? (value & 0xFF) : value;
}

GRAPHSWAP_EXPORT int32_t graphswap_lut_derivative_tables(const int32_t *table, int32_t signed_operands,
                                                         int32_t half_width, float *d_first,
                                                         float *d_second)
{
    if (table == NULL || d_first == NULL || d_second == NULL)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT,
                       "graphswap_lut_derivative_tables: NULL table or output");
    if (half_width < 1 || half_width > 255)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT,
                       "graphswap_lut_derivative_tables: half_width must be in 1..255, got %d",
                       (int)half_width);
    const int lo = signed_operands ? -128 : 0;
    const int hi = signed_operands ? 127 : 255;
    for (int a = lo; a <= hi; a++) {
        const int a_up = a + half_width > hi ? hi : a + half_width;
        const int a_dn = a - half_width < lo ? lo : a - half_width;
        for (int b = lo; b <= hi; b++) {
            const int b_up = b + half_width > hi ? hi : b + half_width;
            const int b_dn = b - half_width < lo ? lo : b - half_width;
            const int ca = code_of(a, signed_operands), cb = code_of(b, signed_operands);
            const double fa = (double)table[(code_of(a_up, signed_operands) << 8) | cb]
                              - (double)table[(code_of(a_dn, signed_operands) << 8) | cb];
            const double fb = (double)table[(ca << 8) | code_of(b_up, signed_operands)]
                              - (double)table[(ca << 8) | code_of(b_dn, signed_operands)];
            d_first[(ca << 8) | cb] = (float)(fa / (double)(a_up - a_dn));
            d_second[(ca << 8) | cb] = (float)(fb / (double)(b_up - b_dn));
        }
    }
    return GRAPHSWAP_OK;
}

GRAPHSWAP_EXPORT int32_t graphswap_lut_matmul_grad(const uint8_t *a, const uint8_t *b,
                                                   const int8_t *sign, const float *d_first,
                                                   const float *d_second, const float *g_a,
                                                   const float *g_b, float *da, float *db,
                                                   int64_t m, int64_t k, int64_t n)
{
    if (m < 0 || k < 0 || n < 0)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT,
                       "graphswap_lut_matmul_grad: sizes must be >= 0, got m=%lld k=%lld n=%lld",
                       (long long)m, (long long)k, (long long)n);
    int64_t mk, kn, mn;
    if (gs_mul_i64(m, k, &mk) || gs_mul_i64(k, n, &kn) || gs_mul_i64(m, n, &mn))
        return gs_fail(GRAPHSWAP_ERR_OVERFLOW, "graphswap_lut_matmul_grad: sizes overflow");
    if ((da != NULL && (d_first == NULL || g_a == NULL)) ||
        (db != NULL && (d_second == NULL || g_b == NULL)))
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT,
                       "graphswap_lut_matmul_grad: an output needs its derivative table and g");
    if (mk == 0 && kn == 0) return GRAPHSWAP_OK;
    if ((mk > 0 && a == NULL) || (kn > 0 && b == NULL))
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, "graphswap_lut_matmul_grad: NULL operand");
    const double work = (double)m * (double)k * (double)n;
    const int nt = gs_threads_for(work, 2e5);

    if (da != NULL && mk > 0) {
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
        for (int64_t i = 0; i < m; i++) {
            const float *gi = g_a + i * n;
            for (int64_t kk = 0; kk < k; kk++) {
                const float *row = d_first + ((int64_t)a[i * k + kk] << 8);
                const uint8_t *bk = b + kk * n;
                double total = 0.0;
                if (sign == NULL) {
                    for (int64_t j = 0; j < n; j++) total += (double)row[bk[j]] * (double)gi[j];
                } else {
                    const int8_t *sk = sign + kk * n;
                    for (int64_t j = 0; j < n; j++)
                        total += (double)row[bk[j]] * (double)sk[j] * (double)gi[j];
                }
                da[i * k + kk] = (float)total;
            }
        }
    }
    if (db != NULL && kn > 0) {
        int32_t status = GRAPHSWAP_OK;
#pragma omp parallel num_threads(nt) if (nt > 1)
        {
            double *acc = (double *)gs_alloc((int64_t)(n > 0 ? n : 1) * (int64_t)sizeof(double));
            if (acc == NULL) {
#pragma omp atomic write
                status = GRAPHSWAP_ERR_OUT_OF_MEMORY;
            }
#pragma omp for schedule(static)
            for (int64_t kk = 0; kk < k; kk++) {
                if (acc == NULL) continue;
                memset(acc, 0, (size_t)n * sizeof(double));
                const uint8_t *bk = b + kk * n;
                for (int64_t i = 0; i < m; i++) {
                    const float *row = d_second + ((int64_t)a[i * k + kk] << 8);
                    const float *gi = g_b + i * n;
                    for (int64_t j = 0; j < n; j++) acc[j] += (double)row[bk[j]] * (double)gi[j];
                }
                for (int64_t j = 0; j < n; j++) db[kk * n + j] = (float)acc[j];
            }
            gs_free(acc);
        }
        if (status != GRAPHSWAP_OK)
            return gs_fail(status, "graphswap_lut_matmul_grad: out of memory");
    }
    return GRAPHSWAP_OK;
}
