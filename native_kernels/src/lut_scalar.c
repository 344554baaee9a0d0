/*
 * lut_scalar.c -- the plain-C table-driven kernel (baseline x86-64, any table).
 *
 * Row by row: for each k the row's table row T[a[r,k]][*] (1 KiB) is swept over the columns with
 * b's row k as indices, into int32 partial sums of at most t->kblock terms (cannot overflow),
 * flushed into the int64 result.
 */
#include <string.h>

#include "lut_internal.h"

void gs_lut_kernel_scalar(const gs_lut_args *p)
{
    const int64_t K = p->k, n = p->ncols;
    const int64_t run = p->t->kblock < K ? p->t->kblock : K;
    int32_t *acc32 = (int32_t *)p->scratch; /* GS_LUT_COLS entries */
    for (int64_t r = 0; r < p->rows; ++r) {
        const uint8_t *ar = p->a + (r / 64) * K * 64 + (r % 64);
        int64_t *out = p->acc + r * p->ldacc;
        memset(out, 0, (size_t)n * sizeof(int64_t));
        for (int64_t k0 = 0; k0 < K; k0 += run) {
            const int64_t k1 = K - k0 < run ? K : k0 + run;
            memset(acc32, 0, (size_t)n * sizeof(int32_t));
            for (int64_t kk = k0; kk < k1; ++kk) {
                const int32_t *trow = p->t->table + ((int64_t)ar[kk * 64] << 8);
                const uint8_t *brow = p->b + kk * p->ldb;
                for (int64_t j = 0; j < n; ++j) acc32[j] += trow[brow[j]];
            }
            for (int64_t j = 0; j < n; ++j) out[j] += acc32[j];
        }
    }
}
