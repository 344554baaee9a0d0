/*
 * lut_gemm.c -- table-driven ("LUT") GEMM for 8-bit approximate multipliers:
 *     acc[m,n] = sum_k table[(a[m,k] << 8) | b[k,n]]          (graphswap_lut_matmul)
 * plus the core shared with the convolution (lut_internal.h).
 *
 * Why this shape.  A table lookup per multiply-accumulate cannot use the FMA units, and on the
 * target machine (AMD Zen 3) both scalar loads and AVX2 gathers sustain well under one lookup per
 * cycle.  Two paths:
 *
 * 1. Expanded B (many rows, m >= GS_LUT_EXPAND_MIN_M).  For a block of KB rows of b and NB = 32
 *    columns, build E[kk][code][0..NB) = table[code][b[k0+kk, n0..n0+NB)] for all 256 codes of the
 *    first operand.  Then row i of the product is plain vector adds of contiguous E rows:
 *        acc[i, n0..n0+NB) += E[kk][a[i, k0+kk]][0..NB)        (4 AVX2 adds per 32 MACs)
 *    E is built by transposing rows of the transposed table (tt[b][*], contiguous) in 8x8 register
 *    blocks -- no gathers -- and costs 256*KB*NB table reads, amortised over all m rows.  E for one
 *    block is 256 KiB (KB = 8), so it stays in L2.  Threads take disjoint column blocks (each builds
 *    its own E; no barriers) or, with too few column blocks, disjoint row ranges.
 * 2. Direct lookups (few rows): loop order i-k-j, so one 1 KiB table row (table[a[i,k] << 8 ...]) is
 *    reused for the whole sweep over j; 8 lookups at a time by an AVX2 gather whose indices are b's
 *    codes b[k, j..j+7] read straight from b's row.
 *
 * Exactness: partial sums are int32 over runs of at most gs_lut_kblock(table) terms (32767 for
 * 16-bit multipliers), flushed to int64, so the result is exact for any K.  A product with fewer than
 * 8 columns (a Dense layer with few units) cannot fill a vector, so it is computed transposed:
 * acc^T = B^T (x) A^T with the transposed table.
 */
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX2__)
#include <immintrin.h>
#define GS_LUT_AVX2 1
#endif

#include "lut_internal.h"

#define FN "graphswap_lut_matmul"
#define GS_LUT_NC 512          /* columns per row chunk: int32 + int64 buffers stay in L1 */
#define GS_LUT_MIN_WORK 65536. /* lookups per thread before a second thread pays off */
#define GS_LUT_EXPAND_MIN_M 48 /* rows from which expanding b beats direct lookups */

int64_t gs_lut_kblock(const int32_t *table)
{
    /* int32 min/max (vectorisable), then the magnitude in int64 (|INT32_MIN| does not fit int32) */
    int32_t lo = table[0], hi = table[0];
    for (int i = 1; i < 65536; ++i) {
        lo = table[i] < lo ? table[i] : lo;
        hi = table[i] > hi ? table[i] : hi;
    }
    int64_t maxabs = -(int64_t)lo > (int64_t)hi ? -(int64_t)lo : (int64_t)hi;
    if (maxabs == 0) return INT64_MAX;
    int64_t kb = (int64_t)INT32_MAX / maxabs;
    return kb > 0 ? kb : 1;
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

#ifdef GS_LUT_AVX2
/* In-register transpose of an 8x8 int32 block. */
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
#endif

void gs_lut_transpose_table(const int32_t *table, int32_t *tt)
{
    for (int a0 = 0; a0 < 256; a0 += 8) {
        for (int b0 = 0; b0 < 256; b0 += 8) {
#ifdef GS_LUT_AVX2
            __m256i v[8];
            for (int q = 0; q < 8; ++q) v[q] = _mm256_loadu_si256((const __m256i *)(table + ((a0 + q) << 8) + b0));
            transpose8(v);
            for (int q = 0; q < 8; ++q) _mm256_storeu_si256((__m256i *)(tt + ((b0 + q) << 8) + a0), v[q]);
#else
            for (int a = a0; a < a0 + 8; ++a)
                for (int b = b0; b < b0 + 8; ++b) tt[(b << 8) | a] = table[(a << 8) | b];
#endif
        }
    }
}

void gs_lut_expand(const uint8_t *b, int64_t ldb, int64_t kcount, int64_t n0, int64_t w, int64_t nbpad,
                   const int32_t *tt, int32_t *E, int64_t ldE)
{
    for (int64_t kk = 0; kk < kcount; ++kk) {
        const uint8_t *brow = b + kk * ldb + n0;
        int32_t *Ek = E + kk * 256 * ldE;
        for (int64_t j0 = 0; j0 < nbpad; j0 += 8) {
            const int32_t *src[8];
            for (int q = 0; q < 8; ++q) src[q] = tt + ((j0 + q < w) ? ((int64_t)brow[j0 + q] << 8) : 0);
#ifdef GS_LUT_AVX2
            for (int c0 = 0; c0 < 256; c0 += 8) {
                __m256i v[8];
                for (int q = 0; q < 8; ++q) v[q] = _mm256_loadu_si256((const __m256i *)(src[q] + c0));
                transpose8(v);
                for (int q = 0; q < 8; ++q)
                    _mm256_storeu_si256((__m256i *)(Ek + (c0 + q) * ldE + j0), v[q]);
            }
#else
            for (int c = 0; c < 256; ++c)
                for (int q = 0; q < 8; ++q) Ek[c * ldE + j0 + q] = src[q][c];
#endif
        }
    }
}

void gs_lut_expanded_rows(const uint8_t *a, int64_t lda, int64_t rows, int64_t kcount,
                          const int32_t *E, int64_t ldE, int64_t nbpad, int32_t *acc, int64_t ldacc)
{
    for (int64_t i = 0; i < rows; ++i) {
        const uint8_t *arow = a + i * lda;
        int32_t *out = acc + i * ldacc;
        int64_t j0 = 0;
#ifdef GS_LUT_AVX2
        for (; j0 + 32 <= nbpad; j0 += 32) {
            __m256i s0 = _mm256_loadu_si256((const __m256i *)(out + j0));
            __m256i s1 = _mm256_loadu_si256((const __m256i *)(out + j0 + 8));
            __m256i s2 = _mm256_loadu_si256((const __m256i *)(out + j0 + 16));
            __m256i s3 = _mm256_loadu_si256((const __m256i *)(out + j0 + 24));
            for (int64_t kk = 0; kk < kcount; ++kk) {
                const int32_t *e = E + (kk * 256 + arow[kk]) * ldE + j0;
                s0 = _mm256_add_epi32(s0, _mm256_loadu_si256((const __m256i *)(e)));
                s1 = _mm256_add_epi32(s1, _mm256_loadu_si256((const __m256i *)(e + 8)));
                s2 = _mm256_add_epi32(s2, _mm256_loadu_si256((const __m256i *)(e + 16)));
                s3 = _mm256_add_epi32(s3, _mm256_loadu_si256((const __m256i *)(e + 24)));
            }
            _mm256_storeu_si256((__m256i *)(out + j0), s0);
            _mm256_storeu_si256((__m256i *)(out + j0 + 8), s1);
            _mm256_storeu_si256((__m256i *)(out + j0 + 16), s2);
            _mm256_storeu_si256((__m256i *)(out + j0 + 24), s3);
        }
        for (; j0 + 8 <= nbpad; j0 += 8) {
            __m256i s0 = _mm256_loadu_si256((const __m256i *)(out + j0));
            for (int64_t kk = 0; kk < kcount; ++kk)
                s0 = _mm256_add_epi32(s0, _mm256_loadu_si256(
                                              (const __m256i *)(E + (kk * 256 + arow[kk]) * ldE + j0)));
            _mm256_storeu_si256((__m256i *)(out + j0), s0);
        }
#endif
        for (; j0 < nbpad; ++j0) {
            int32_t s = out[j0];
            for (int64_t kk = 0; kk < kcount; ++kk) s += E[(kk * 256 + arow[kk]) * ldE + j0];
            out[j0] = s;
        }
    }
}

void gs_lut_expanded_tile(const gs_lut_gemm *p, const int32_t *tt, int64_t m0, int64_t m1, int64_t n0,
                          int64_t n1, int32_t *E, int32_t *accp)
{
    const int64_t rows = m1 - m0;
    const int64_t run = (p->kblock / GS_LUT_KB) * GS_LUT_KB; /* int32-safe terms per flush */
    for (int64_t jc = n0; jc < n1; jc += GS_LUT_NB) {
        const int64_t w = (n1 - jc) < GS_LUT_NB ? (n1 - jc) : GS_LUT_NB;
        const int64_t nbpad = (w + 7) & ~(int64_t)7;
        for (int64_t i = m0; i < m1; ++i)
            for (int64_t j = 0; j < w; ++j) p->c[i * p->rs_c + (jc + j) * p->cs_c] = 0;
        for (int64_t kr = 0; kr < p->k; kr += run) {
            const int64_t kend = (p->k - kr) < run ? p->k : kr + run;
            memset(accp, 0, (size_t)(rows * GS_LUT_NB) * sizeof accp[0]);
            for (int64_t k0 = kr; k0 < kend; k0 += GS_LUT_KB) {
                const int64_t kc = (kend - k0) < GS_LUT_KB ? (kend - k0) : GS_LUT_KB;
                gs_lut_expand(p->b + k0 * p->ldb, p->ldb, kc, jc, w, nbpad, tt, E, GS_LUT_NB);
                gs_lut_expanded_rows(p->a + m0 * p->lda + k0, p->lda, rows, kc, E, GS_LUT_NB, nbpad,
                                     accp, GS_LUT_NB);
            }
            for (int64_t i = 0; i < rows; ++i)
                for (int64_t j = 0; j < w; ++j)
                    p->c[(m0 + i) * p->rs_c + (jc + j) * p->cs_c] += accp[i * GS_LUT_NB + j];
        }
    }
}

/* Runs the expanded path over threads; returns GRAPHSWAP_OK or _ERR_OUT_OF_MEMORY. */
static int32_t run_expanded(const gs_lut_gemm *p)
{
    int32_t *tt = gs_alloc(65536 * (int64_t)sizeof(int32_t));
    if (!tt) return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, FN ": cannot allocate the transposed table");
    gs_lut_transpose_table(p->table, tt);
    const double work = (double)p->m * (double)p->k * (double)p->n;
    const int nt = gs_threads_for(work, GS_LUT_MIN_WORK);
    const int64_t blocks = (p->n + GS_LUT_NB - 1) / GS_LUT_NB;
    const int split_cols = blocks >= nt;
    int failed = 0;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
#ifdef _OPENMP
        const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
#else
        const int64_t t = 0, T = 1;
#endif
        int64_t m0 = 0, m1 = p->m, n0 = 0, n1 = p->n;
        if (split_cols) {
            n0 = blocks * t / T * GS_LUT_NB;
            n1 = blocks * (t + 1) / T * GS_LUT_NB;
            if (n1 > p->n) n1 = p->n;
        } else {
            m0 = p->m * t / T;
            m1 = p->m * (t + 1) / T;
        }
        if (m0 < m1 && n0 < n1) {
            int32_t *E = gs_alloc((int64_t)GS_LUT_KB * 256 * GS_LUT_NB * (int64_t)sizeof(int32_t));
            int32_t *accp = gs_alloc((m1 - m0) * GS_LUT_NB * (int64_t)sizeof(int32_t));
            if (E && accp) {
                gs_lut_expanded_tile(p, tt, m0, m1, n0, n1, E, accp);
            } else {
#pragma omp atomic write
                failed = 1;
            }
            gs_free(E), gs_free(accp);
        }
    }
    gs_free(tt);
    if (failed) return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, FN ": cannot allocate per-thread scratch");
    return GRAPHSWAP_OK;
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
    if (m >= GS_LUT_EXPAND_MIN_M && p.kblock >= GS_LUT_KB) return run_expanded(&p);
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
