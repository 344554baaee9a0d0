/*
 * lut_avx2.c -- the AVX2 table-driven kernel: expanded weights.
 *
 * For a block of KB = 8 rows of b and NB = 32 columns, E[kk][code][0..NB) = T[code][b[k0+kk, j0..]]
 * for all 256 codes of the first operand (256 KiB, stays in L2), built by 8x8 register transposes
 * of rows of the transposed table (tt[b][*] is contiguous) -- no gathers, which are slow on AMD.
 * Then row r of the product is plain vector adds of contiguous E rows:
 *     acc[r, j0..j0+NB) += E[kk][a[r, k0+kk]][0..NB)        (4 AVX2 adds per 32 MACs)
 * Partial sums are int32 over runs of at most t->kblock terms (rounded down to KB), flushed to int64.
 * The expansion costs 256 * KB * NB table reads per block, amortised over the block's rows.
 * Requires t->kblock >= KB (gs_lut_run falls back to the scalar kernel otherwise).
 */
#pragma GCC target("avx2,fma")

#include <immintrin.h>
#include <string.h>

#include "lut_internal.h"

#define KB 8
#define NB 32

int64_t gs_lut_scratch_avx2(const gs_lut_table *t, int64_t k)
{
    (void)t, (void)k;
    return (int64_t)KB * 256 * NB * 4 + (int64_t)GS_LUT_ROWS * NB * 4 + 64;
}

static inline void transpose8(__m256i r[8])
{
    __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]), t5 = _mm256_unpackhi_epi32(r[4], r[5]);
    __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]), t7 = _mm256_unpackhi_epi32(r[6], r[7]);
    __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
    __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
    r[0] = _mm256_permute2x128_si256(u0, u4, 0x20);
    r[1] = _mm256_permute2x128_si256(u1, u5, 0x20);
    r[2] = _mm256_permute2x128_si256(u2, u6, 0x20);
    r[3] = _mm256_permute2x128_si256(u3, u7, 0x20);
    r[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
    r[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
    r[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
    r[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
}

/* E[kk*256*NB + code*NB + j] = tt[(b[kk*ldb + j] << 8) | code], kk < kc, j < NB (columns >= w use
 * b code 0; their sums are discarded). */
static void expand(const uint8_t *b, int64_t ldb, int64_t kc, int64_t w, const int32_t *tt, int32_t *E)
{
    for (int64_t kk = 0; kk < kc; ++kk) {
        const uint8_t *brow = b + kk * ldb;
        int32_t *Ek = E + kk * 256 * NB;
        for (int64_t j0 = 0; j0 < NB; j0 += 8) {
            const int32_t *src[8];
            for (int q = 0; q < 8; ++q) src[q] = tt + ((j0 + q < w) ? ((int64_t)brow[j0 + q] << 8) : 0);
            for (int c0 = 0; c0 < 256; c0 += 8) {
                __m256i v[8];
                for (int q = 0; q < 8; ++q) v[q] = _mm256_loadu_si256((const __m256i *)(src[q] + c0));
                transpose8(v);
                for (int q = 0; q < 8; ++q) _mm256_store_si256((__m256i *)(Ek + (c0 + q) * NB + j0), v[q]);
            }
        }
    }
}

/* acc[r*NB + 0..NB) += sum_{kk < kc} E[kk][a[r, kk]] for the packed rows (a points at k0). */
static void rows_add(const uint8_t *a, int64_t K, int64_t rows, int64_t kc, const int32_t *E, int32_t *acc)
{
    for (int64_t r = 0; r < rows; ++r) {
        const uint8_t *ar = a + (r / 64) * K * 64 + (r % 64);
        __m256i *out = (__m256i *)(acc + r * NB);
        __m256i s0 = _mm256_load_si256(out + 0), s1 = _mm256_load_si256(out + 1);
        __m256i s2 = _mm256_load_si256(out + 2), s3 = _mm256_load_si256(out + 3);
        for (int64_t kk = 0; kk < kc; ++kk) {
            const __m256i *e = (const __m256i *)(E + (kk * 256 + ar[kk * 64]) * NB);
            s0 = _mm256_add_epi32(s0, _mm256_load_si256(e + 0));
            s1 = _mm256_add_epi32(s1, _mm256_load_si256(e + 1));
            s2 = _mm256_add_epi32(s2, _mm256_load_si256(e + 2));
            s3 = _mm256_add_epi32(s3, _mm256_load_si256(e + 3));
        }
        _mm256_store_si256(out + 0, s0);
        _mm256_store_si256(out + 1, s1);
        _mm256_store_si256(out + 2, s2);
        _mm256_store_si256(out + 3, s3);
    }
}

void gs_lut_kernel_avx2(const gs_lut_args *p)
{
    const int64_t K = p->k, rows = p->rows;
    int32_t *E = (int32_t *)p->scratch;
    int32_t *acc32 = E + KB * 256 * NB;
    const int64_t run = (p->t->kblock / KB) * KB; /* int32-safe terms per flush (>= KB) */
    for (int64_t j0 = 0; j0 < p->ncols; j0 += NB) {
        const int64_t w = p->ncols - j0 < NB ? p->ncols - j0 : NB;
        for (int64_t r = 0; r < rows; ++r) memset(p->acc + r * p->ldacc + j0, 0, (size_t)w * sizeof(int64_t));
        for (int64_t kr = 0; kr < K; kr += run) {
            const int64_t kend = K - kr < run ? K : kr + run;
            memset(acc32, 0, (size_t)(rows * NB) * sizeof(int32_t));
            for (int64_t k0 = kr; k0 < kend; k0 += KB) {
                const int64_t kc = kend - k0 < KB ? kend - k0 : KB;
                expand(p->b + k0 * p->ldb + j0, p->ldb, kc, w, p->t->tt, E);
                rows_add(p->a + k0 * 64, K, rows, kc, E, acc32);
            }
            for (int64_t r = 0; r < rows; ++r) {
                int64_t *out = p->acc + r * p->ldacc + j0;
                for (int64_t j = 0; j < w; ++j) out[j] += acc32[r * NB + j];
            }
        }
    }
}
