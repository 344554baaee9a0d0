/*
 * lut_gemm.c -- table-driven ("LUT") GEMM for 8-bit approximate multipliers:
 *     acc[m,n] = sum_k table[(a[m,k] << 8) | b[k,n]]          (graphswap_lut_matmul)
 * plus the core shared with the convolution (lut_internal.h).
 *
 * Why this shape.  A table lookup per multiply-accumulate cannot use the FMA units; what limits it
 * is how many table loads per cycle the core sustains.  The loop order is i-k-j: for one row i of a
 * and one k, every product of the sweep over j reads the same 1 KiB table row table[a[i,k] << 8 ...],
 * so that row sits in L1 while 8 lookups at a time are done by one AVX2 gather
 * (_mm256_i32gather_epi32) whose indices are b's codes b[k, j..j+7] (zero-extended bytes, read
 * straight from b's row: no packing of b is needed).  The sums live in a small int32 row buffer in
 * L1 (a chunk of at most GS_LUT_NC columns) and are flushed to int64 every K-block; the K-block is
 * the longest run of terms that cannot overflow int32 for this table (32767 terms for 16-bit
 * multipliers), so the result is exact for any K.  Rows are split across OpenMP threads (columns when
 * there are fewer rows than threads).  A product with fewer than 8 columns (a Dense layer with few
 * units, LeNet's 6-channel convolution) cannot fill a gather, so it is computed transposed:
 * acc^T = B^T (x) A^T with the transposed table.
 */
#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>
#define GS_LUT_AVX2 1
#endif

#include "lut_internal.h"

#define FN "graphswap_lut_matmul"
#define GS_LUT_NC 512          /* columns per row chunk: int32 + int64 buffers stay in L1 */
#define GS_LUT_MIN_WORK 65536. /* lookups per thread before a second thread pays off */

int64_t gs_lut_kblock(const int32_t *table)
{
    int64_t maxabs = 0;
    for (int i = 0; i < 65536; ++i) {
        int64_t v = table[i];
        if (v < 0) v = -v;
        if (v > maxabs) maxabs = v;
    }
    if (maxabs == 0) return INT64_MAX;
    int64_t kb = (int64_t)INT32_MAX / maxabs;
    return kb > 0 ? kb : 1;
}

void gs_lut_transpose_table(const int32_t *table, int32_t *tt)
{
    for (int a = 0; a < 256; ++a)
        for (int b = 0; b < 256; ++b) tt[(b << 8) | a] = table[(a << 8) | b];
}

/* acc32[0..w) += row[bk[0..w)] */
static inline void lookup_row(const int32_t *row, const uint8_t *bk, int32_t *acc32, int64_t w)
{
    int64_t j = 0;
#ifdef GS_LUT_AVX2
    for (; j + 32 <= w; j += 32) {
        __m256i i0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(bk + j)));
        __m256i i1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(bk + j + 8)));
        __m256i i2 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(bk + j + 16)));
        __m256i i3 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(bk + j + 24)));
        __m256i g0 = _mm256_i32gather_epi32((const int *)row, i0, 4);
        __m256i g1 = _mm256_i32gather_epi32((const int *)row, i1, 4);
        __m256i g2 = _mm256_i32gather_epi32((const int *)row, i2, 4);
        __m256i g3 = _mm256_i32gather_epi32((const int *)row, i3, 4);
        __m256i *acc = (__m256i *)(acc32 + j);
        _mm256_storeu_si256(acc + 0, _mm256_add_epi32(_mm256_loadu_si256(acc + 0), g0));
        _mm256_storeu_si256(acc + 1, _mm256_add_epi32(_mm256_loadu_si256(acc + 1), g1));
        _mm256_storeu_si256(acc + 2, _mm256_add_epi32(_mm256_loadu_si256(acc + 2), g2));
        _mm256_storeu_si256(acc + 3, _mm256_add_epi32(_mm256_loadu_si256(acc + 3), g3));
    }
    for (; j + 8 <= w; j += 8) {
        __m256i i0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(bk + j)));
        __m256i g0 = _mm256_i32gather_epi32((const int *)row, i0, 4);
        __m256i *acc = (__m256i *)(acc32 + j);
        _mm256_storeu_si256(acc, _mm256_add_epi32(_mm256_loadu_si256(acc), g0));
    }
#endif
    for (; j < w; ++j) acc32[j] += row[bk[j]];
}

void gs_lut_gemm_tile(const gs_lut_gemm *p, int64_t m0, int64_t m1, int64_t n0, int64_t n1)
{
    int32_t acc32[GS_LUT_NC] __attribute__((aligned(64)));
    int64_t acc64[GS_LUT_NC] __attribute__((aligned(64)));
    const int64_t kblock = p->kblock < p->k ? p->kblock : p->k;
    for (int64_t i = m0; i < m1; ++i) {
        const uint8_t *arow = p->a + i * p->lda;
        for (int64_t jc = n0; jc < n1; jc += GS_LUT_NC) {
            const int64_t w = (n1 - jc) < GS_LUT_NC ? (n1 - jc) : GS_LUT_NC;
            memset(acc64, 0, (size_t)w * sizeof acc64[0]);
            for (int64_t k0 = 0; k0 < p->k; k0 += kblock) {
                const int64_t k1 = (p->k - k0) < kblock ? p->k : k0 + kblock;
                memset(acc32, 0, (size_t)w * sizeof acc32[0]);
                for (int64_t k = k0; k < k1; ++k)
                    lookup_row(p->table + ((int64_t)arow[k] << 8), p->b + k * p->ldb + jc, acc32, w);
                for (int64_t j = 0; j < w; ++j) acc64[j] += acc32[j];
            }
            int64_t *crow = p->c + i * p->rs_c + jc * p->cs_c;
            if (p->cs_c == 1) {
                memcpy(crow, acc64, (size_t)w * sizeof acc64[0]);
            } else {
                for (int64_t j = 0; j < w; ++j) crow[j * p->cs_c] = acc64[j];
            }
        }
    }
}

/* Runs the whole product, splitting rows (or columns, for few rows) over threads. */
static void run_parallel(const gs_lut_gemm *p)
{
    const double work = (double)p->m * (double)p->k * (double)p->n;
    const int nt = gs_threads_for(work, GS_LUT_MIN_WORK);
    if (nt <= 1) {
        gs_lut_gemm_tile(p, 0, p->m, 0, p->n);
        return;
    }
    const int split_rows = p->m >= 4 * (int64_t)nt || p->n < 2 * GS_LUT_NB;
#pragma omp parallel num_threads(nt)
    {
#ifdef _OPENMP
        const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
#else
        const int64_t t = 0, T = 1;
#endif
        if (split_rows) {
            const int64_t lo = p->m * t / T, hi = p->m * (t + 1) / T;
            if (lo < hi) gs_lut_gemm_tile(p, lo, hi, 0, p->n);
        } else {
            const int64_t tiles = (p->n + GS_LUT_NB - 1) / GS_LUT_NB;
            int64_t lo = tiles * t / T * GS_LUT_NB, hi = tiles * (t + 1) / T * GS_LUT_NB;
            if (hi > p->n) hi = p->n;
            if (lo < hi) gs_lut_gemm_tile(p, 0, p->m, lo, hi);
        }
    }
}

GRAPHSWAP_EXPORT int32_t graphswap_lut_matmul(const uint8_t *a, const uint8_t *b, const int32_t *table,
                                              int64_t *acc, int64_t m, int64_t k, int64_t n)
{
    if (m < 0 || k < 0 || n < 0)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, FN ": sizes must be >= 0, got m=%lld k=%lld n=%lld",
                       (long long)m, (long long)k, (long long)n);
    int64_t mk, kn, mn, t;
    if (gs_mul_i64(m, k, &mk) || gs_mul_i64(k, n, &kn) || gs_mul_i64(m, n, &mn) ||
        gs_mul_i64(mn, (int64_t)sizeof(int64_t), &t) || gs_add_i64(mk, kn, &t) ||
        gs_add_i64(t, 65536 * 2 * (int64_t)sizeof(int32_t), &t))
        return gs_fail(GRAPHSWAP_ERR_OVERFLOW, FN ": buffer sizes overflow int64 (m=%lld k=%lld n=%lld)",
                       (long long)m, (long long)k, (long long)n);
    if (mn == 0) return GRAPHSWAP_OK;
    if (!acc) return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, FN ": acc is NULL (m=%lld n=%lld)",
                             (long long)m, (long long)n);
    if (k == 0) {
        memset(acc, 0, (size_t)mn * sizeof acc[0]);
        return GRAPHSWAP_OK;
    }
    if (!a || !b || !table)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, FN ": a, b and table must not be NULL (m=%lld k=%lld n=%lld)",
                       (long long)m, (long long)k, (long long)n);

    gs_lut_gemm p = {a, k, b, n, table, acc, n, 1, m, k, n, gs_lut_kblock(table)};
    if (n >= 8 || m < 8) {
        run_parallel(&p);
        return GRAPHSWAP_OK;
    }
    /* Few columns: acc^T (n x m) = sum_k tt[(b^T[j,k] << 8) | a^T[k,i]], written back transposed. */
    uint8_t *at = gs_alloc(mk), *bt = gs_alloc(kn);
    int32_t *tt = gs_alloc(65536 * (int64_t)sizeof(int32_t));
    if (!at || !bt || !tt) {
        gs_free(at), gs_free(bt), gs_free(tt);
        return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, FN ": cannot allocate %lld bytes of scratch",
                       (long long)(mk + kn + 65536 * 4));
    }
    for (int64_t i = 0; i < m; ++i)
        for (int64_t kk = 0; kk < k; ++kk) at[kk * m + i] = a[i * k + kk];
    for (int64_t kk = 0; kk < k; ++kk)
        for (int64_t j = 0; j < n; ++j) bt[j * k + kk] = b[kk * n + j];
    gs_lut_transpose_table(table, tt);
    gs_lut_gemm q = {bt, k, at, m, tt, acc, 1, n, n, k, m, p.kblock};
    run_parallel(&q);
    gs_free(at), gs_free(bt), gs_free(tt);
    return GRAPHSWAP_OK;
}
