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
/* x86 only (GS_LUT_X86): elsewhere the dispatch has the scalar path alone. */
#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx2,fma")

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "lut_internal.h"

#define KB 8
#define NB 32

#define RUN16 256 /* terms per flush of the 16-bit accumulators (multiple of KB) */

int64_t gs_lut_scratch_avx2(const gs_lut_table *t, int64_t k, int64_t rows)
{
    (void)t, (void)k;
    /* int32 path: E + acc32 (rows x NB int32); 16-bit path: E16 + W/O (rows x 4 ymm): both below */
    return (int64_t)KB * 256 * NB * 4 + rows * NB * 4 + 64;
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

/* ---- 16-bit path (table span < 2^16): E16 holds U = T - min T as uint16, 16 columns per ymm ----
 * Per 32 MACs: 2 loads of E rows and 6 word ops; sums are exact by the W/O trick of lut_avx512.c
 * (W += v wrapping, O += v >> 8: after <= 256 terms O is the sum of high bytes, W - 256*O mod 2^16
 * the sum of low bytes). */

static inline void transpose16x16_epi16(__m256i r[16])
{
    __m256i s[16], u[16], v[16];
    for (int i = 0; i < 8; ++i) {
        s[2 * i] = _mm256_unpacklo_epi16(r[2 * i], r[2 * i + 1]);
        s[2 * i + 1] = _mm256_unpackhi_epi16(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {
        u[4 * i + 0] = _mm256_unpacklo_epi32(s[4 * i], s[4 * i + 2]);
        u[4 * i + 1] = _mm256_unpackhi_epi32(s[4 * i], s[4 * i + 2]);
        u[4 * i + 2] = _mm256_unpacklo_epi32(s[4 * i + 1], s[4 * i + 3]);
        u[4 * i + 3] = _mm256_unpackhi_epi32(s[4 * i + 1], s[4 * i + 3]);
    }
    /* u[4i+e]: rows 4i..4i+3, elements 2e, 2e+1 (and +8 in the high lane) */
    for (int h = 0; h < 2; ++h)          /* rows 0-7 (h = 0), 8-15 (h = 1) */
        for (int e = 0; e < 4; ++e) {
            v[h * 8 + 2 * e] = _mm256_unpacklo_epi64(u[8 * h + e], u[8 * h + 4 + e]);
            v[h * 8 + 2 * e + 1] = _mm256_unpackhi_epi64(u[8 * h + e], u[8 * h + 4 + e]);
        }
    /* v[8h + c]: rows 8h..8h+7 of element c (low lane) and c + 8 (high lane) */
    for (int c = 0; c < 8; ++c) {
        r[c] = _mm256_permute2x128_si256(v[c], v[8 + c], 0x20);
        r[c + 8] = _mm256_permute2x128_si256(v[c], v[8 + c], 0x31);
    }
}

/* E16[kk*256*NB + code*NB + j] = tt16[(b[kk*ldb + j] << 8) | code] */
static void expand16(const uint8_t *b, int64_t ldb, int64_t kc, int64_t w, const uint16_t *tt16, uint16_t *E)
{
    const int64_t jn = w <= 16 ? 16 : NB; /* narrow blocks expand (and add) one vector of columns */
    for (int64_t kk = 0; kk < kc; ++kk) {
        const uint8_t *brow = b + kk * ldb;
        uint16_t *Ek = E + kk * 256 * NB;
        for (int64_t j0 = 0; j0 < jn; j0 += 16) {
            const uint16_t *src[16];
            for (int q = 0; q < 16; ++q) src[q] = tt16 + ((j0 + q < w) ? ((int64_t)brow[j0 + q] << 8) : 0);
            for (int c0 = 0; c0 < 256; c0 += 16) {
                __m256i v[16];
                for (int q = 0; q < 16; ++q) v[q] = _mm256_loadu_si256((const __m256i *)(src[q] + c0));
                transpose16x16_epi16(v);
                for (int q = 0; q < 16; ++q) _mm256_store_si256((__m256i *)(Ek + (c0 + q) * NB + j0), v[q]);
            }
        }
    }
}

/* acc[r] (W0, O0: 16 words each per row; layout as rows_add16) += first 16 columns of E16 rows */
static void rows_add16_narrow(const uint8_t *a, int64_t K, int64_t rows, int64_t kc, const uint16_t *E,
                              __m256i *acc)
{
    for (int64_t r = 0; r < rows; ++r) {
        const uint8_t *ar = a + (r / 64) * K * 64 + (r % 64);
        __m256i *o = acc + 4 * r;
        __m256i w0 = _mm256_load_si256(o + 0), h0 = _mm256_load_si256(o + 2);
        for (int64_t kk = 0; kk < kc; ++kk) {
            const __m256i x0 = _mm256_load_si256((const __m256i *)(E + (kk * 256 + ar[kk * 64]) * NB));
            w0 = _mm256_add_epi16(w0, x0);
            h0 = _mm256_add_epi16(h0, _mm256_srli_epi16(x0, 8));
        }
        _mm256_store_si256(o + 0, w0);
        _mm256_store_si256(o + 2, h0);
    }
}

/* acc[r] (W0, W1, O0, O1: 4 x 16 words per row) += rows of E16 for kk < kc */
static void rows_add16(const uint8_t *a, int64_t K, int64_t rows, int64_t kc, const uint16_t *E, __m256i *acc)
{
    for (int64_t r = 0; r < rows; ++r) {
        const uint8_t *ar = a + (r / 64) * K * 64 + (r % 64);
        __m256i *o = acc + 4 * r;
        __m256i w0 = _mm256_load_si256(o + 0), w1 = _mm256_load_si256(o + 1);
        __m256i h0 = _mm256_load_si256(o + 2), h1 = _mm256_load_si256(o + 3);
        for (int64_t kk = 0; kk < kc; ++kk) {
            const __m256i *e = (const __m256i *)(E + (kk * 256 + ar[kk * 64]) * NB);
            const __m256i x0 = _mm256_load_si256(e), x1 = _mm256_load_si256(e + 1);
            w0 = _mm256_add_epi16(w0, x0);
            w1 = _mm256_add_epi16(w1, x1);
            h0 = _mm256_add_epi16(h0, _mm256_srli_epi16(x0, 8));
            h1 = _mm256_add_epi16(h1, _mm256_srli_epi16(x1, 8));
        }
        _mm256_store_si256(o + 0, w0);
        _mm256_store_si256(o + 1, w1);
        _mm256_store_si256(o + 2, h0);
        _mm256_store_si256(o + 3, h1);
    }
}

static void kernel16(const gs_lut_args *p)
{
    const int64_t K = p->k, rows = p->rows;
    uint16_t *E = (uint16_t *)p->scratch;                     /* KB x 256 x NB */
    __m256i *acc = (__m256i *)(E + KB * 256 * NB);           /* rows x 4 */
    const int64_t offset = K * (int64_t)p->t->tmin;
    for (int64_t j0 = 0; j0 < p->ncols; j0 += NB) {
        const int64_t w = p->ncols - j0 < NB ? p->ncols - j0 : NB;
        for (int64_t r = 0; r < rows; ++r) {
            int64_t *out = p->acc + r * p->ldacc + j0;
            for (int64_t j = 0; j < w; ++j) out[j] = offset;
        }
        for (int64_t kr = 0; kr < K; kr += RUN16) {
            const int64_t kend = K - kr < RUN16 ? K : kr + RUN16;
            memset(acc, 0, (size_t)(rows * 4) * sizeof(__m256i));
            for (int64_t k0 = kr; k0 < kend; k0 += KB) {
                const int64_t kc = kend - k0 < KB ? kend - k0 : KB;
                expand16(p->b + k0 * p->ldb + j0, p->ldb, kc, w, p->t->tt16, E);
                if (w <= 16)
                    rows_add16_narrow(p->a + k0 * 64, K, rows, kc, E, acc);
                else
                    rows_add16(p->a + k0 * 64, K, rows, kc, E, acc);
            }
            for (int64_t r = 0; r < rows; ++r) {
                const uint16_t *W = (const uint16_t *)(acc + 4 * r), *O = W + 32;
                int64_t *out = p->acc + r * p->ldacc + j0;
                for (int64_t j = 0; j < w; ++j) {
                    const uint32_t hi = O[j], lo = (uint16_t)(W[j] - (uint16_t)(O[j] << 8));
                    out[j] += (int64_t)(lo + (hi << 8));
                }
            }
        }
    }
}

void gs_lut_kernel_avx2(const gs_lut_args *p)
{
    if (p->t->tt16) {
        kernel16(p);
        return;
    }

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

/* ------------------------------------------------------------------------------------------------
 * Quantization (bit for bit gs_quant: float64 division, round half to even, same clamps)
 * ------------------------------------------------------------------------------------------------ */

int gs_range_span_avx2(const float *src, int64_t n, float *lo, float *hi)
{
    const __m256 expmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7f800000));
    __m256 l = _mm256_set1_ps(*lo), h = _mm256_set1_ps(*hi), bad = _mm256_setzero_ps();
    const __m256 pinf = _mm256_set1_ps(INFINITY), ninf = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(src + i);
        const __m256 nonfinite = _mm256_cmp_ps(_mm256_and_ps(x, expmask), expmask, _CMP_EQ_OQ);
        bad = _mm256_or_ps(bad, nonfinite);
        l = _mm256_min_ps(l, _mm256_blendv_ps(x, pinf, nonfinite));
        h = _mm256_max_ps(h, _mm256_blendv_ps(x, ninf, nonfinite));
    }
    float lv[8], hv[8];
    _mm256_storeu_ps(lv, l);
    _mm256_storeu_ps(hv, h);
    float L = lv[0], H = hv[0];
    for (int q = 1; q < 8; ++q) L = lv[q] < L ? lv[q] : L, H = hv[q] > H ? hv[q] : H;
    int b = _mm256_movemask_ps(bad) != 0;
    for (; i < n; ++i) {
        const float v = src[i];
        if (gs_finite(v)) L = v < L ? v : L, H = v > H ? v : H;
        else b = 1;
    }
    *lo = L, *hi = H;
    return b;
}

/* fl(t / s) as far as rint can tell: t * (1/s), except lanes within 2^-48 |v| of a half-integer
 * (or not finite), which are divided (see gs_recip). */
static inline __m256d quotient_avx2(__m256d t, __m256d s, __m256d r)
{
    const __m256d absmask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));
    const __m256d v = _mm256_mul_pd(t, r);
    const __m256d n = _mm256_round_pd(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256d frac = _mm256_and_pd(_mm256_sub_pd(v, n), absmask);
    const __m256d tol = _mm256_mul_pd(_mm256_and_pd(v, absmask), _mm256_set1_pd(0x1p-48));
    const __m256d near = _mm256_cmp_pd(_mm256_sub_pd(_mm256_set1_pd(0.5), frac), tol, _CMP_NGT_UQ);
    if (_mm256_movemask_pd(near)) return _mm256_blendv_pd(v, _mm256_div_pd(t, s), near);
    return v;
}

/* 8 codes of src[0..8) as the low 8 bytes of the result */
static inline __m128i quant8_avx2(const float *src, __m256d s0, __m256d s1, __m256d r0, __m256d r1,
                                  __m256d z0, __m256d z1, int is_signed, __m256i zero8, int *bad)
{
    const __m256 x = _mm256_loadu_ps(src);
    const __m256 expmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7f800000));
    const __m256 nonfinite = _mm256_cmp_ps(_mm256_and_ps(x, expmask), expmask, _CMP_EQ_OQ);
    *bad |= _mm256_movemask_ps(nonfinite);
    const __m256d lim = _mm256_set1_pd(512.0), nlim = _mm256_set1_pd(-512.0);
    /* non-finite lanes are replaced below; keep them out of the quotient (inf * r is harmless, but
     * NaN would force the division path) */
    const __m256 xf = _mm256_andnot_ps(nonfinite, x);
    __m256d v0 = quotient_avx2(_mm256_cvtps_pd(_mm256_castps256_ps128(xf)), s0, r0);
    __m256d v1 = quotient_avx2(_mm256_cvtps_pd(_mm256_extractf128_ps(xf, 1)), s1, r1);
    v0 = _mm256_round_pd(_mm256_max_pd(_mm256_min_pd(v0, lim), nlim), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v1 = _mm256_round_pd(_mm256_max_pd(_mm256_min_pd(v1, lim), nlim), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256d lo, hi;
    if (is_signed) {
        lo = _mm256_set1_pd(-127.0), hi = _mm256_set1_pd(127.0);
    } else {
        v0 = _mm256_add_pd(v0, z0), v1 = _mm256_add_pd(v1, z1);
        lo = _mm256_setzero_pd(), hi = _mm256_set1_pd(255.0);
    }
    v0 = _mm256_max_pd(_mm256_min_pd(v0, hi), lo);
    v1 = _mm256_max_pd(_mm256_min_pd(v1, hi), lo);
    const __m256i q = _mm256_set_m128i(_mm256_cvtpd_epi32(v1), _mm256_cvtpd_epi32(v0)); /* 8 x int32 */
    const __m256i codes = _mm256_blendv_epi8(q, zero8, _mm256_castps_si256(nonfinite));
    /* int32 -> bytes: values are in -127..255; keep the low byte of each */
    const __m256i shuf = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i b = _mm256_shuffle_epi8(codes, shuf);
    return _mm_unpacklo_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
}

int gs_quantize_span_avx2(const float *src, int64_t n, const double *scale, const double *recip,
                          const int32_t *zero, int per_element, int is_signed, uint8_t *dst)
{
    int bad = 0;
    int64_t i = 0;
    if (!per_element) {
        const __m256d s = _mm256_set1_pd(scale[0]), r = _mm256_set1_pd(recip[0]);
        const __m256d z = _mm256_set1_pd((double)zero[0]);
        const __m256i z8 = _mm256_set1_epi32(zero[0]);
        for (; i + 8 <= n; i += 8)
            _mm_storel_epi64((__m128i *)(dst + i), quant8_avx2(src + i, s, s, r, r, z, z, is_signed, z8, &bad));
    } else {
        for (; i + 8 <= n; i += 8) {
            const __m256i zi = _mm256_loadu_si256((const __m256i *)(zero + i));
            const __m256d z0 = _mm256_cvtepi32_pd(_mm256_castsi256_si128(zi));
            const __m256d z1 = _mm256_cvtepi32_pd(_mm256_extracti128_si256(zi, 1));
            _mm_storel_epi64((__m128i *)(dst + i),
                             quant8_avx2(src + i, _mm256_loadu_pd(scale + i), _mm256_loadu_pd(scale + i + 4),
                                         _mm256_loadu_pd(recip + i), _mm256_loadu_pd(recip + i + 4), z0, z1,
                                         is_signed, zi, &bad));
        }
    }
    if (i < n)
        bad |= gs_quantize_span_scalar(src + i, n - i, per_element ? scale + i : scale,
                                       per_element ? zero + i : zero, per_element, is_signed, dst + i);
    return bad != 0;
}

/* ---- the epilogue, 4 columns at a time (gs_epilogue_rows_scalar bit for bit) ----
 * The corrected sum v stays in int64 (vpaddq / vpsubq; zero[j] * rsum by vpmuludq, both < 2^32) and
 * becomes float64 by the magic-number conversion, exact for |v| < 2^51; a vector with a lane outside
 * that (never for 8-bit products short of 2^35 terms) takes the scalar formula. */
static inline __m256d epilogue_i64_to_f64(__m256i v)
{
    const __m256i magic_i = _mm256_set1_epi64x(0x4338000000000000LL); /* bits of 1.5 * 2^52 */
    const __m256d magic_d = _mm256_set1_pd(6755399441055744.0);
    return _mm256_sub_pd(_mm256_castsi256_pd(_mm256_add_epi64(v, magic_i)), magic_d);
}

void gs_epilogue_rows_avx2(const gs_epilogue *e, const int64_t *acc, int pairs, int64_t rows, int64_t n,
                           const int64_t *rsums, float *out, int64_t ldout)
{
    if (e->K >= ((int64_t)1 << 24)) { /* window code sums may pass 2^32: vpmuludq would not do */
        gs_epilogue_rows_scalar(e, acc, pairs, rows, n, rsums, out, ldout);
        return;
    }
    const int64_t lda = pairs ? 2 * n : n, n4 = n & ~(int64_t)3;
    const __m256i lim_hi = _mm256_set1_epi64x((int64_t)1 << 51), lim_lo = _mm256_set1_epi64x(-((int64_t)1 << 51));
    const __m128 nan4 = _mm_set1_ps(__builtin_nanf(""));
    for (int64_t j = 0; j < n4; j += 4) {
        __m256i fixed = _mm256_setzero_si256(), zero = _mm256_setzero_si256();
        int row_term = 0;
        if (e->is_unsigned) {
            int64_t f[4], z[4];
            for (int i = 0; i < 4; ++i) {
                z[i] = e->zero[j + i];
                f[i] = e->K * e->za * z[i] - e->za * e->colsum[j + i];
                row_term |= z[i] != 0;
            }
            fixed = _mm256_loadu_si256((const __m256i *)f);
            zero = _mm256_loadu_si256((const __m256i *)z);
            row_term &= rsums != NULL;
        }
        const __m256d scale = _mm256_loadu_pd(e->sasb + j);
        const __m128 bias = e->bias ? _mm_loadu_ps(e->bias + j) : _mm_setzero_ps();
        const __m128 bad = _mm_castsi128_ps(_mm_cmpgt_epi32(
            _mm_setr_epi32(e->bad[j], e->bad[j + 1], e->bad[j + 2], e->bad[j + 3]), _mm_setzero_si128()));
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t *a = acc + r * lda;
            __m256i v;
            if (pairs) { /* the sign-magnitude column pair (2j, 2j + 1): positive minus negative sums */
                const __m256i lo = _mm256_loadu_si256((const __m256i *)(a + 2 * j));
                const __m256i hi = _mm256_loadu_si256((const __m256i *)(a + 2 * j + 4));
                const __m256i even = _mm256_permute4x64_epi64(_mm256_unpacklo_epi64(lo, hi), 0xD8);
                const __m256i odd = _mm256_permute4x64_epi64(_mm256_unpackhi_epi64(lo, hi), 0xD8);
                v = _mm256_sub_epi64(even, odd);
            } else {
                v = _mm256_loadu_si256((const __m256i *)(a + j));
            }
            v = _mm256_add_epi64(v, fixed);
            if (row_term) v = _mm256_sub_epi64(v, _mm256_mul_epu32(zero, _mm256_set1_epi64x(rsums[r])));
            float *o = out + r * ldout + j;
            const __m256i outside = _mm256_or_si256(_mm256_cmpgt_epi64(v, lim_hi), _mm256_cmpgt_epi64(lim_lo, v));
            if (!_mm256_testz_si256(outside, outside)) {
                const int64_t rsum = rsums ? rsums[r] : 0;
                for (int i = 0; i < 4; ++i) {
                    const int64_t s = pairs ? a[2 * (j + i)] - a[2 * (j + i) + 1] : a[j + i];
                    o[i] = gs_epilogue_value(e, j + i, s, rsum);
                }
                continue;
            }
            __m128 y = _mm256_cvtpd_ps(_mm256_mul_pd(scale, epilogue_i64_to_f64(v)));
            if (e->bias) y = _mm_add_ps(y, bias);
            _mm_storeu_ps(o, _mm_blendv_ps(y, nan4, bad));
        }
    }
    for (int64_t r = 0; r < rows && n4 < n; ++r) { /* the last n % 4 columns */
        const int64_t rsum = rsums ? rsums[r] : 0, *a = acc + r * lda;
        for (int64_t j = n4; j < n; ++j)
            out[r * ldout + j] = gs_epilogue_value(e, j, pairs ? a[2 * j] - a[2 * j + 1] : a[j], rsum);
    }
}

void gs_factored_epilogue_row_avx2(const double *scale, const double *z, const float *bias, float *y, int64_t n)
{
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const __m256d v = _mm256_add_pd(_mm256_cvtps_pd(_mm_loadu_ps(y + j)), _mm256_loadu_pd(z + j));
        __m128 r = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_loadu_pd(scale + j), v));
        if (bias) r = _mm_add_ps(r, _mm_loadu_ps(bias + j));
        _mm_storeu_ps(y + j, r);
    }
    for (; j < n; ++j) {
        const float r = (float)(scale[j] * ((double)y[j] + z[j]));
        y[j] = bias ? r + bias[j] : r;
    }
}

void gs_factored_map_avx2(const float *mapped, const uint8_t *codes, int64_t n, float *out)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + i)));
        _mm256_storeu_ps(out + i, _mm256_i32gather_ps(mapped, idx, 4));
    }
    for (; i < n; ++i) out[i] = mapped[codes[i]];
}

/* ---- quantize and map in one pass (factored tables) ----
 * 8 lanes in float32 first: v = t * fl32(1/s) is within 2^-22 |v| of the float64 quotient the spec
 * rounds, so rint(v) is its code unless v lies that close to a half-integer; such a vector (rare)
 * takes quant8_avx2's float64 formula.  Lanes beyond +-600 clip to the same end either way.  The
 * codes then index the mapped table (f(code) - shift) by a gather; the bytes are stored only when
 * asked for (window or row code sums). */
int gs_quantize_map_avx2(const float *src, int64_t n, double scale, double recip, int32_t zero, int is_signed,
                         const float *mapped, float *out, uint8_t *codes)
{
    int bad = 0;
    int64_t i = 0;
    const float r32 = (float)recip;
    const int fast = recip == recip && r32 > 1e-30f && r32 < 1e30f; /* a normal float32 reciprocal */
    const __m256d s = _mm256_set1_pd(scale), r = _mm256_set1_pd(recip), zd = _mm256_set1_pd((double)zero);
    const __m256i z8 = _mm256_set1_epi32(zero);
    const __m256 rf = _mm256_set1_ps(r32), zf = _mm256_set1_ps((float)zero);
    const __m256 lo = _mm256_set1_ps(is_signed ? -127.0f : 0.0f), hi = _mm256_set1_ps(is_signed ? 127.0f : 255.0f);
    const __m256 lim = _mm256_set1_ps(512.0f), nlim = _mm256_set1_ps(-512.0f);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 expmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7f800000));
    const __m256 half = _mm256_set1_ps(0.5f), tolscale = _mm256_set1_ps(0x1p-22f), far = _mm256_set1_ps(600.0f);
    const __m256i shuf = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    for (; i + 8 <= n; i += 8) {
        __m256i c;
        const __m256 x = _mm256_loadu_ps(src + i);
        const __m256 nonfinite = _mm256_cmp_ps(_mm256_and_ps(x, expmask), expmask, _CMP_EQ_OQ);
        const __m256 v = _mm256_mul_ps(_mm256_andnot_ps(nonfinite, x), rf);
        const __m256 av = _mm256_and_ps(v, absmask);
        const __m256 nearest = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256 frac = _mm256_and_ps(_mm256_sub_ps(v, nearest), absmask);
        const __m256 gap = _mm256_and_ps(_mm256_sub_ps(half, frac), absmask);
        const __m256 near = _mm256_and_ps(_mm256_cmp_ps(gap, _mm256_mul_ps(av, tolscale), _CMP_LE_OQ),
                                          _mm256_cmp_ps(av, far, _CMP_LT_OQ));
        if (!fast || _mm256_movemask_ps(near)) {
            int b = 0;
            const __m128i bytes = quant8_avx2(src + i, s, s, r, r, zd, zd, is_signed, z8, &b);
            bad |= b;
            c = is_signed ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes);
        } else {
            bad |= _mm256_movemask_ps(nonfinite);
            __m256 q = _mm256_round_ps(_mm256_max_ps(_mm256_min_ps(v, lim), nlim),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            if (!is_signed) q = _mm256_add_ps(q, zf);
            q = _mm256_max_ps(_mm256_min_ps(q, hi), lo);
            c = _mm256_blendv_epi8(_mm256_cvtps_epi32(q), z8, _mm256_castps_si256(nonfinite));
        }
        /* the table is indexed by the code byte (two's complement for signed codes) */
        const __m256i idx = _mm256_and_si256(c, _mm256_set1_epi32(0xff));
        _mm256_storeu_ps(out + i, _mm256_i32gather_ps(mapped, idx, 4));
        if (codes) {
            const __m256i b = _mm256_shuffle_epi8(idx, shuf);
            _mm_storel_epi64((__m128i *)(codes + i),
                             _mm_unpacklo_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
        }
    }
    if (i < n) /* the last n % 8: the scalar loop (gs_quant) */
        bad |= gs_quantize_map_scalar(src + i, n - i, scale, recip, zero, is_signed, mapped, out + i,
                                      codes ? codes + i : NULL);
    return bad != 0;
}

#endif /* x86 */
