/*
 * lut_gather_avx2.c -- the AVX2 table kernel for jobs of few rows: gathers from the table rows.
 *
 * The expanded-weights kernel (lut_avx2.c) builds E[k][code][j] = T[code][b[k, j]] for all 256
 * activation codes before any row uses it: 256 x 8 x 32 entries per block, paid back only over
 * hundreds of rows.  A recurrent layer's step (batch x units) or a small batch has tens of rows,
 * where that expansion is most of the time (an LSTM step of 32 rows: about 1 G products/s).
 * Here each row looks its terms up directly: for row r and term k the 256 products of activation
 * code a = a[r, k] are the contiguous table row T[a][0..256), and 8 columns' products are one
 * vpgatherdd of that row at the weight codes b[k, j..j+8).  A job has at most 64 columns
 * (gs_lut_job_shape), so a row's sums stay in 8 registers across all its terms.
 *
 * Sums are int32 over runs of at most t->kblock terms (no overflow), flushed to int64: the same
 * exact integers as every other kernel.
 */
/* x86 only (GS_LUT_X86): elsewhere the dispatch has the scalar path alone. */
#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx2,fma")

#include <immintrin.h>
#include <string.h>

#include "lut_internal.h"

#define GATHER_COLS 64 /* at most this many columns per call: 8 ymm of int32 sums */

/* acc[r, j0 .. j0 + 8 * vecs) for one row: vecs full vectors of 8 columns, terms [k0, k1). */
static inline void row_sums(const int32_t *table, const uint8_t *ar, const uint8_t *b, int64_t ldb,
                            int64_t k0, int64_t k1, int vecs, __m256i sums[8])
{
    for (int64_t kk = k0; kk < k1; ++kk) {
        const int32_t *row = table + ((int64_t)ar[kk * 64] << 8);
        const uint8_t *brow = b + kk * ldb;
        for (int v = 0; v < vecs; ++v) {
            const __m256i codes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(brow + 8 * v)));
            sums[v] = _mm256_add_epi32(sums[v], _mm256_i32gather_epi32(row, codes, 4));
        }
    }
}

void gs_lut_kernel_gather_avx2(const gs_lut_args *p)
{
    const int32_t *table = p->t->table;
    const int64_t K = p->k, run = p->t->kblock;
    for (int64_t j0 = 0; j0 < p->ncols; j0 += GATHER_COLS) {
        const int64_t w = p->ncols - j0 < GATHER_COLS ? p->ncols - j0 : GATHER_COLS;
        const int vecs = (int)(w / 8);               /* whole vectors; the rest column by column */
        const uint8_t *b = p->b + j0;
        for (int64_t r = 0; r < p->rows; ++r) {
            const uint8_t *ar = p->a + (r / 64) * K * 64 + (r % 64);
            int64_t *out = p->acc + r * p->ldacc + j0;
            memset(out, 0, (size_t)w * sizeof(int64_t));
            for (int64_t kr = 0; kr < K; kr += run) {
                const int64_t kend = K - kr < run ? K : kr + run;
                __m256i sums[8];
                for (int v = 0; v < vecs; ++v) sums[v] = _mm256_setzero_si256();
                row_sums(table, ar, b, p->ldb, kr, kend, vecs, sums);
                for (int v = 0; v < vecs; ++v) {
                    int32_t lanes[8];
                    _mm256_storeu_si256((__m256i *)lanes, sums[v]);
                    for (int q = 0; q < 8; ++q) out[8 * v + q] += lanes[q];
                }
                for (int64_t j = 8 * (int64_t)vecs; j < w; ++j) {   /* the last < 8 columns */
                    int32_t s = 0;
                    for (int64_t kk = kr; kk < kend; ++kk)
                        s += table[((int32_t)ar[kk * 64] << 8) | b[kk * p->ldb + j]];
                    out[j] += s;
                }
            }
        }
    }
}

#endif /* x86 */
