/*
 * lut_avx512.c -- the AVX-512 VBMI table-driven kernel: weight-stationary byte-plane lookups.
 *
 * Let U = T - min(T) (so 0 <= U < 256^P, P = t->planes <= 3 byte planes).  For one weight code b
 * the column U[*][b] is 256 entries; byte plane p of it is 256 bytes = 4 zmm registers.  With the
 * column in registers, vpermi2b looks up 64 activation codes at once: codes >= 128 from registers
 * 2-3 (merge-masked by the code's top bit, other lanes keep the index), then codes < 128 from
 * registers 0-1 using that result as the index -- two lookups per plane per 64 products, no blend.
 *
 * Summation is exact without widening every byte: per plane, two u16 accumulators per 32 lane
 * pairs, W += x (the byte pair as a word, wrapping) and O += x >> 8 (the odd lane's byte).  After
 * at most 256 terms O is the odd lanes' sum exactly (<= 65280) and W - 256*O (mod 2^16) the even
 * lanes' sum exactly; the run is then flushed into int64 as sum_p 256^p * plane_sum, and at the end
 * K * min(T) is added back.  Per 64 products and plane: 2 vpermi2b + 3 word ops.
 *
 * Loop order: per column j, runs of <= 256 k, up to 4 groups of 64 rows (P <= 2; 2 groups for
 * P = 3) whose accumulators stay in registers while k advances; each k loads the column of code
 * b[k, j] (4P registers, from the 64-192 KiB plane table in L1/L2) and one 64-code activation
 * vector per group.
 */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma")

#include <immintrin.h>
#include <string.h>

#include "lut_internal.h"

#define RUN 256

/* Flushes accumulators (W, O) of plane sums for 64 rows into dst[lane] (uint32 row sums, added). */
static inline void flush_plane(__m512i W, __m512i O, int shift, uint32_t *dst)
{
    const __m512i even = _mm512_sub_epi16(W, _mm512_slli_epi16(O, 8)); /* word w: sum of lane 2w */
    /* interleave back to lane order: lane 2w <- even[w], lane 2w+1 <- O[w]; as 32-bit values */
    const __m512i ev_lo = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(even));
    const __m512i ev_hi = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(even, 1));
    const __m512i od_lo = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(O));
    const __m512i od_hi = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(O, 1));
    /* ev_lo holds rows 0,2,..,30; od_lo rows 1,3,..,31: unpack by 32-bit lanes across 128-bit
     * lanes is awkward, so go through memory (once per 256 terms, cheap) */
    uint32_t e[32], o[32];
    _mm512_storeu_si512((__m512i *)e, _mm512_slli_epi32(ev_lo, shift));
    _mm512_storeu_si512((__m512i *)(e + 16), _mm512_slli_epi32(ev_hi, shift));
    _mm512_storeu_si512((__m512i *)o, _mm512_slli_epi32(od_lo, shift));
    _mm512_storeu_si512((__m512i *)(o + 16), _mm512_slli_epi32(od_hi, shift));
    for (int w = 0; w < 32; ++w) {
        dst[2 * w] += e[w];
        dst[2 * w + 1] += o[w];
    }
}

/* One column, k in [k0, k1) (k1 - k0 <= RUN), R groups starting at packed group pointer a (stride
 * gstride bytes between groups); adds the run's sums of U to sums[g*64 + lane]. */
static inline __attribute__((always_inline)) void column_run(const uint8_t *restrict a, int64_t gstride,
                                                             const uint8_t *restrict btj, int64_t k0,
                                                             int64_t k1, const uint8_t *restrict planes,
                                                             const int P, const int R, uint32_t *sums)
{
    __m512i W[4][3], O[4][3];
    for (int g = 0; g < R; ++g)
        for (int q = 0; q < P; ++q) W[g][q] = O[g][q] = _mm512_setzero_si512();
    for (int64_t kk = k0; kk < k1; ++kk) {
        const uint8_t *col = planes + (int64_t)btj[kk] * P * 256;
        __m512i T[3][4];
        for (int q = 0; q < P; ++q)
            for (int s = 0; s < 4; ++s) T[q][s] = _mm512_loadu_si512((const void *)(col + q * 256 + s * 64));
        for (int g = 0; g < R; ++g) {
            const __m512i idx = _mm512_loadu_si512((const void *)(a + g * gstride + kk * 64));
            const __mmask64 hi = _mm512_movepi8_mask(idx);
            const __mmask64 lo = _knot_mask64(hi);
            for (int q = 0; q < P; ++q) {
                __m512i x = _mm512_mask2_permutex2var_epi8(T[q][2], idx, hi, T[q][3]);
                x = _mm512_mask2_permutex2var_epi8(T[q][0], x, lo, T[q][1]);
                W[g][q] = _mm512_add_epi16(W[g][q], x);
                O[g][q] = _mm512_add_epi16(O[g][q], _mm512_srli_epi16(x, 8));
            }
        }
    }
    for (int g = 0; g < R; ++g)
        for (int q = 0; q < P; ++q) flush_plane(W[g][q], O[g][q], 8 * q, sums + g * 64);
}

static inline __attribute__((always_inline)) void column(const uint8_t *a, int64_t K, int64_t groups,
                                                         const uint8_t *btj, const uint8_t *planes,
                                                         const int P, uint32_t *sums32, int64_t *sums64)
{
    const int RMAX = P == 3 ? 2 : 4;
    for (int64_t i = 0; i < groups * 64; ++i) sums64[i] = 0;
    for (int64_t k0 = 0; k0 < K; k0 += RUN) {
        const int64_t k1 = K - k0 < RUN ? K : k0 + RUN;
        memset(sums32, 0, (size_t)(groups * 64) * sizeof(uint32_t));
        for (int64_t g0 = 0; g0 < groups; g0 += RMAX) {
            const int64_t R = groups - g0 < RMAX ? groups - g0 : RMAX;
            const uint8_t *ag = a + g0 * K * 64;
            uint32_t *s = sums32 + g0 * 64;
            switch (R) {
            case 4: column_run(ag, K * 64, btj, k0, k1, planes, P, 4, s); break;
            case 3: column_run(ag, K * 64, btj, k0, k1, planes, P, 3, s); break;
            case 2: column_run(ag, K * 64, btj, k0, k1, planes, P, 2, s); break;
            default: column_run(ag, K * 64, btj, k0, k1, planes, P, 1, s); break;
            }
        }
        for (int64_t i = 0; i < groups * 64; ++i) sums64[i] += sums32[i];
    }
}

void gs_lut_kernel_avx512(const gs_lut_args *p)
{
    const int64_t K = p->k, groups = (p->rows + 63) / 64;
    const int P = p->t->planes;
    uint32_t *sums32 = (uint32_t *)p->scratch;                     /* GS_LUT_ROWS */
    int64_t *sums64 = (int64_t *)((char *)p->scratch + GS_LUT_ROWS * 4); /* GS_LUT_ROWS */
    const int64_t offset = K * (int64_t)p->t->tmin; /* sum of the subtracted minimum */
    for (int64_t j = 0; j < p->ncols; ++j) {
        const uint8_t *btj = p->bt + j * p->ldbt;
        switch (P) {
        case 1: column(p->a, K, groups, btj, p->t->plane_data, 1, sums32, sums64); break;
        case 2: column(p->a, K, groups, btj, p->t->plane_data, 2, sums32, sums64); break;
        default: column(p->a, K, groups, btj, p->t->plane_data, 3, sums32, sums64); break;
        }
        for (int64_t r = 0; r < p->rows; ++r) p->acc[r * p->ldacc + j] = sums64[r] + offset;
    }
}
