/* Float-table GEMM: the products of an 8-bit floating-point multiplier (FP8 codes in, float32
 * products out, graphswap/kernels/fp8.py) summed in float32.
 *
 *     out[i, j] = sum over kk = 0..k-1, in that order, of table[(a[i, kk] << 8) | b[kk, j]]
 *
 * a: (m, k) uint8 codes of the first operand (activations), b: (k, n) uint8 codes of the second
 * (weights), table: 65536 float32 products, row = first operand's code.  Each output is one float32
 * running sum in increasing kk (a numpy loop over kk reproduces it bit for bit).  Rows of the
 * output are spread over the OpenMP team (each output is summed by one thread, in order, so the
 * result does not depend on the thread count).  Plain C: the compiler vectorises the inner loop
 * where the ISA allows; no per-ISA path. */
#include <stdint.h>
#include <string.h>

#include "graphswap_kernels.h"
#include "internal.h"

GRAPHSWAP_EXPORT int32_t graphswap_lut_float_matmul(const uint8_t *a, const uint8_t *b, const float *table,
                                                    float *out, int64_t m, int64_t k, int64_t n)
{
    static const char fn[] = "graphswap_lut_float_matmul";
    if (m < 0 || k < 0 || n < 0)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, "%s: sizes must be >= 0, got m=%lld k=%lld n=%lld", fn,
                       (long long)m, (long long)k, (long long)n);
    int64_t mk, kn, mn;
    if (gs_mul_i64(m, k, &mk) || gs_mul_i64(k, n, &kn) || gs_mul_i64(m, n, &mn) || mn > INT64_MAX / 4)
        return gs_fail(GRAPHSWAP_ERR_OVERFLOW, "%s: buffer sizes overflow int64 (m=%lld k=%lld n=%lld)", fn,
                       (long long)m, (long long)k, (long long)n);
    if (m == 0 || n == 0) return GRAPHSWAP_OK;
    if (!out) return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    memset(out, 0, (size_t)mn * sizeof out[0]);
    if (k == 0) return GRAPHSWAP_OK;
    if (!a || !b || !table)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, "%s: a, b and table must not be NULL (m=%lld k=%lld n=%lld)",
                       fn, (long long)m, (long long)k, (long long)n);
    int nt = gs_threads_for((double)mk * (double)n, 1 << 20);
    (void)nt;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t i = 0; i < m; ++i) {
        float *row_out = out + i * n;
        const uint8_t *row_a = a + i * k;
        for (int64_t kk = 0; kk < k; ++kk) {
            const float *products = table + ((size_t)row_a[kk] << 8);
            const uint8_t *row_b = b + kk * n;
            for (int64_t j = 0; j < n; ++j) row_out[j] += products[row_b[j]];
        }
    }
    return GRAPHSWAP_OK;
}
