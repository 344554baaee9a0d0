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
 * Loop order: per column j, runs of <= 256 terms, up to 4 groups of 64 rows (P <= 2; 2 groups for
 * P = 3) whose accumulators stay in registers while k advances; each term loads the column of
 * code b[k, j] (4P registers, from the 64-192 KiB plane table in L1/L2) and one 64-code
 * activation vector per group.  A column's terms are a list of (code, activation offset): every k,
 * or - when code 0 adds nothing (t->zero_code_free) - only the k with a nonzero code, which halves
 * the work of sign-magnitude weights (each magnitude sits in one of two columns, 0 in the other).
 */
/* x86 only (GS_LUT_X86): elsewhere the dispatch has the scalar path alone. */
#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx2,fma")

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "lut_internal.h"

#define RUN 256

/* Flushes accumulators (W, O) of plane sums for 64 rows into dst[lane] (32-bit row sums, added).
 * W's word w holds lane 2w's sum + 256 x lane 2w+1's (mod 2^16), O's word w lane 2w+1's sum: the
 * even sums are W - 256 O; one word permute per 32 rows puts both back in lane order.  A run with
 * subtracted terms (sign-magnitude pairs) has sums in [-bias, 65535 - bias], bias = 255 x the
 * subtracted terms: read as (word + bias mod 2^16) - bias. */
static inline void flush_plane(__m512i W, __m512i O, int shift, int32_t bias, uint32_t *dst)
{
    const __m512i b16 = _mm512_set1_epi16((int16_t)bias);
    const __m512i even = _mm512_add_epi16(_mm512_sub_epi16(W, _mm512_slli_epi16(O, 8)), b16);
    const __m512i odd = _mm512_add_epi16(O, b16);
    /* word i of `first`: lane i (i < 32) = even[i/2] or odd[i/2]; `second` likewise for lanes 32-63 */
    const __m512i interleave_lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                                   39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i interleave_hi = _mm512_add_epi16(interleave_lo, _mm512_set1_epi16(16));
    const __m512i first = _mm512_permutex2var_epi16(even, interleave_lo, odd);
    const __m512i second = _mm512_permutex2var_epi16(even, interleave_hi, odd);
    const __m512i parts[4] = {_mm512_cvtepu16_epi32(_mm512_castsi512_si256(first)),
                              _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(first, 1)),
                              _mm512_cvtepu16_epi32(_mm512_castsi512_si256(second)),
                              _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(second, 1))};
    const __m512i b32 = _mm512_set1_epi32(bias);
    for (int i = 0; i < 4; ++i) {
        const __m512i value = _mm512_sub_epi32(parts[i], b32);
        const __m512i old = _mm512_loadu_si512((const void *)(dst + 16 * i));
        _mm512_storeu_si512((void *)(dst + 16 * i),
                            _mm512_add_epi32(old, _mm512_sll_epi32(value, _mm_cvtsi32_si128(shift))));
    }
}

/* One run of a column: terms i in [0, count) (count <= RUN) with weight codes codes[i] and
 * activation offsets ko[i] (bytes), R groups starting at packed group pointer a (stride gstride
 * bytes between groups); adds the run's sums of U (terms from npos on subtracted) to
 * sums[g*64 + lane]. */
static inline __attribute__((always_inline)) void column_run(const uint8_t *restrict a, int64_t gstride,
                                                             const uint8_t *restrict codes,
                                                             const int64_t *restrict ko, int64_t count,
                                                             int64_t npos, const uint8_t *restrict planes,
                                                             const int P, const int R, uint32_t *sums)
{
    __m512i W[4][3], O[4][3];
    for (int g = 0; g < R; ++g)
        for (int q = 0; q < P; ++q) W[g][q] = O[g][q] = _mm512_setzero_si512();
    for (int64_t i = 0; i < count; ++i) {
        /* terms past npos are subtracted: v -> (v ^ m) - m with m = -1 negates */
        const __m512i m = _mm512_set1_epi16(i < npos ? 0 : -1);
        const uint8_t *col = planes + (int64_t)codes[i] * P * 256;
        __m512i T[3][4];
        for (int q = 0; q < P; ++q)
            for (int s = 0; s < 4; ++s) T[q][s] = _mm512_loadu_si512((const void *)(col + q * 256 + s * 64));
        for (int g = 0; g < R; ++g) {
            const __m512i idx = _mm512_loadu_si512((const void *)(a + g * gstride + ko[i]));
            const __mmask64 hi = _mm512_movepi8_mask(idx);
            const __mmask64 lo = _knot_mask64(hi);
            for (int q = 0; q < P; ++q) {
                __m512i x = _mm512_mask2_permutex2var_epi8(T[q][2], idx, hi, T[q][3]);
                x = _mm512_mask2_permutex2var_epi8(T[q][0], x, lo, T[q][1]);
                const __m512i odd = _mm512_srli_epi16(x, 8);
                W[g][q] = _mm512_add_epi16(W[g][q], _mm512_sub_epi16(_mm512_xor_si512(x, m), m));
                O[g][q] = _mm512_add_epi16(O[g][q], _mm512_sub_epi16(_mm512_xor_si512(odd, m), m));
            }
        }
    }
    const int32_t bias = (int32_t)(255 * (count - npos));
    for (int g = 0; g < R; ++g)
        for (int q = 0; q < P; ++q) flush_plane(W[g][q], O[g][q], 8 * q, bias, sums + g * 64);
}

/* The hot case, P = 2 planes x R = 4 groups, in assembly: GCC keeps the 16 accumulators + 8 table
 * registers only with spills (measured 5.3 vs 8.5 products per cycle on Zen 4).  zmm0-7 the column
 * (plane 0: 0-3, plane 1: 4-7), zmm8-15 W[g][q], zmm16-23 O[g][q], zmm24-25 temporaries.
 * out receives, per group g, W0, W1, O0, O1 (4 x 64 bytes). */
#define GS_GROUP(OP, AOFF, W0, W1, O0, O1)                                                          \
    "vmovdqu8 " AOFF ", %%zmm24\n\t"                                                                \
    "vpmovb2m %%zmm24, %%k1\n\t"                                                                    \
    "knotq %%k1, %%k2\n\t"                                                                          \
    "vmovdqa64 %%zmm24, %%zmm25\n\t"                                                                \
    "vpermi2b %%zmm3, %%zmm2, %%zmm25%{%%k1%}\n\t"                                                  \
    "vpermi2b %%zmm7, %%zmm6, %%zmm24%{%%k1%}\n\t"                                                  \
    "vpermi2b %%zmm1, %%zmm0, %%zmm25%{%%k2%}\n\t"                                                  \
    "vpermi2b %%zmm5, %%zmm4, %%zmm24%{%%k2%}\n\t"                                                  \
    OP " %%zmm25, " W0 ", " W0 "\n\t"                                                               \
    OP " %%zmm24, " W1 ", " W1 "\n\t"                                                               \
    "vpsrlw $8, %%zmm25, %%zmm25\n\t"                                                               \
    "vpsrlw $8, %%zmm24, %%zmm24\n\t"                                                               \
    OP " %%zmm25, " O0 ", " O0 "\n\t"                                                               \
    OP " %%zmm24, " O1 ", " O1 "\n\t"

/* One term: the column of code *btj into zmm0-7, then the 4 groups (OP = vpaddw or vpsubw). */
#define GS_TERM(OP)                                                                                 \
    "mov (%[ko]), %[a]\n\t"                                                                         \
    "add %[base], %[a]\n\t"                                                                         \
    "lea (%[a],%[gs],2), %[a3]\n\t"                                                                 \
    "add %[gs], %[a3]\n\t"                                                                          \
    "movzbl (%[btj]), %k[tmp]\n\t"                                                                  \
    "shl $9, %[tmp]\n\t"                                                                            \
    "add %[pl], %[tmp]\n\t"                                                                         \
    "vmovdqu64 (%[tmp]), %%zmm0\n\t" "vmovdqu64 64(%[tmp]), %%zmm1\n\t"                             \
    "vmovdqu64 128(%[tmp]), %%zmm2\n\t" "vmovdqu64 192(%[tmp]), %%zmm3\n\t"                         \
    "vmovdqu64 256(%[tmp]), %%zmm4\n\t" "vmovdqu64 320(%[tmp]), %%zmm5\n\t"                         \
    "vmovdqu64 384(%[tmp]), %%zmm6\n\t" "vmovdqu64 448(%[tmp]), %%zmm7\n\t"                         \
    GS_GROUP(OP, "(%[a])", "%%zmm8", "%%zmm9", "%%zmm16", "%%zmm17")                                 \
    GS_GROUP(OP, "(%[a],%[gs],1)", "%%zmm10", "%%zmm11", "%%zmm18", "%%zmm19")                       \
    GS_GROUP(OP, "(%[a],%[gs],2)", "%%zmm12", "%%zmm13", "%%zmm20", "%%zmm21")                       \
    GS_GROUP(OP, "(%[a3])", "%%zmm14", "%%zmm15", "%%zmm22", "%%zmm23")                              \
    "add $8, %[ko]\n\t"                                                                             \
    "inc %[btj]\n\t"

static void column_run_p2r4_asm(const uint8_t *base, int64_t gs, const uint8_t *btj,
                                const int64_t *ko, int64_t count, int64_t npos, const uint8_t *planes,
                                uint8_t *out)
{
    const uint8_t *a, *a3;
    const uint8_t *mid = btj + npos, *end = btj + count; /* terms [npos, count) are subtracted */
    int64_t tmp;
    __asm__ volatile(
        "vpxorq %%zmm8, %%zmm8, %%zmm8\n\t"
        "vmovdqa64 %%zmm8, %%zmm9\n\t" "vmovdqa64 %%zmm8, %%zmm10\n\t" "vmovdqa64 %%zmm8, %%zmm11\n\t"
        "vmovdqa64 %%zmm8, %%zmm12\n\t" "vmovdqa64 %%zmm8, %%zmm13\n\t" "vmovdqa64 %%zmm8, %%zmm14\n\t"
        "vmovdqa64 %%zmm8, %%zmm15\n\t" "vmovdqa64 %%zmm8, %%zmm16\n\t" "vmovdqa64 %%zmm8, %%zmm17\n\t"
        "vmovdqa64 %%zmm8, %%zmm18\n\t" "vmovdqa64 %%zmm8, %%zmm19\n\t" "vmovdqa64 %%zmm8, %%zmm20\n\t"
        "vmovdqa64 %%zmm8, %%zmm21\n\t" "vmovdqa64 %%zmm8, %%zmm22\n\t" "vmovdqa64 %%zmm8, %%zmm23\n\t"
        "cmp %[btj], %[mid]\n\t"
        "je 2f\n\t"
        "1:\n\t"
        GS_TERM("vpaddw")
        "cmp %[btj], %[mid]\n\t"
        "jne 1b\n\t"
        "2:\n\t"
        "cmp %[btj], %[end]\n\t"
        "je 4f\n\t"
        "3:\n\t"
        GS_TERM("vpsubw")
        "cmp %[btj], %[end]\n\t"
        "jne 3b\n\t"
        "4:\n\t"
        "vmovdqu64 %%zmm8, 0(%[out])\n\t" "vmovdqu64 %%zmm9, 64(%[out])\n\t"
        "vmovdqu64 %%zmm16, 128(%[out])\n\t" "vmovdqu64 %%zmm17, 192(%[out])\n\t"
        "vmovdqu64 %%zmm10, 256(%[out])\n\t" "vmovdqu64 %%zmm11, 320(%[out])\n\t"
        "vmovdqu64 %%zmm18, 384(%[out])\n\t" "vmovdqu64 %%zmm19, 448(%[out])\n\t"
        "vmovdqu64 %%zmm12, 512(%[out])\n\t" "vmovdqu64 %%zmm13, 576(%[out])\n\t"
        "vmovdqu64 %%zmm20, 640(%[out])\n\t" "vmovdqu64 %%zmm21, 704(%[out])\n\t"
        "vmovdqu64 %%zmm14, 768(%[out])\n\t" "vmovdqu64 %%zmm15, 832(%[out])\n\t"
        "vmovdqu64 %%zmm22, 896(%[out])\n\t" "vmovdqu64 %%zmm23, 960(%[out])\n\t"
        : [a] "=&r"(a), [a3] "=&r"(a3), [btj] "+r"(btj), [ko] "+r"(ko), [tmp] "=&r"(tmp)
        : [base] "r"(base), [gs] "r"(gs), [mid] "r"(mid), [end] "r"(end), [pl] "r"(planes), [out] "r"(out)
        : "memory", "cc", "k1", "k2", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",
          "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17",
          "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25");
}
#undef GS_TERM
#undef GS_GROUP

/* One column of `terms` terms (codes[i], activation offset ko[i]) over a packed block of K per
 * group; terms [npos, terms) are subtracted (a sign-magnitude pair's negative column; then each
 * run's 32-bit sums are signed). */
static inline __attribute__((always_inline)) void column(const uint8_t *a, int64_t K, int64_t groups,
                                                         const uint8_t *codes, const int64_t *ko,
                                                         int64_t terms, int64_t npos, const uint8_t *planes,
                                                         const int P, uint32_t *sums32, int64_t *sums64)
{
    const int RMAX = P == 3 ? 2 : 4;
    const int signed_sums = npos < terms;
    if (terms == 0)
        for (int64_t i = 0; i < groups * 64; ++i) sums64[i] = 0;
    for (int64_t k0 = 0; k0 < terms; k0 += RUN) {
        const int64_t k1 = terms - k0 < RUN ? terms : k0 + RUN;
        const int64_t run_pos = npos <= k0 ? 0 : (npos >= k1 ? k1 - k0 : npos - k0);
        memset(sums32, 0, (size_t)(groups * 64) * sizeof(uint32_t));
        for (int64_t g0 = 0; g0 < groups; g0 += RMAX) {
            const int64_t R = groups - g0 < RMAX ? groups - g0 : RMAX;
            const uint8_t *ag = a + g0 * K * 64;
            uint32_t *s = sums32 + g0 * 64;
            if (P == 2 && R == 4) {
                uint8_t acc[16 * 64] __attribute__((aligned(64)));
                column_run_p2r4_asm(ag, K * 64, codes + k0, ko + k0, k1 - k0, run_pos, planes, acc);
                const int32_t bias = (int32_t)(255 * (k1 - k0 - run_pos));
                for (int g = 0; g < 4; ++g)
                    for (int q = 0; q < 2; ++q)
                        flush_plane(_mm512_load_si512((const void *)(acc + (g * 4 + q) * 64)),
                                    _mm512_load_si512((const void *)(acc + (g * 4 + 2 + q) * 64)), 8 * q,
                                    bias, s + g * 64);
                continue;
            }
            switch (R) {
            case 4: column_run(ag, K * 64, codes + k0, ko + k0, k1 - k0, run_pos, planes, P, 4, s); break;
            case 3: column_run(ag, K * 64, codes + k0, ko + k0, k1 - k0, run_pos, planes, P, 3, s); break;
            case 2: column_run(ag, K * 64, codes + k0, ko + k0, k1 - k0, run_pos, planes, P, 2, s); break;
            default: column_run(ag, K * 64, codes + k0, ko + k0, k1 - k0, run_pos, planes, P, 1, s); break;
            }
        }
        for (int64_t i = 0; i < groups * 64; ++i) {
            const int64_t v = signed_sums ? (int64_t)(int32_t)sums32[i] : (int64_t)sums32[i];
            sums64[i] = k0 == 0 ? v : sums64[i] + v; /* the first run sets the sums */
        }
    }
}

#define COLS 8 /* columns whose sums are written out together (one cache line per row) */

/* out[r * ld + c] = sums[c * GS_LUT_ROWS + r] + offset for c < w <= 8, r < rows: 8 x 8 transposes
 * of int64 (unpack within 128-bit lanes, then two rounds of 128-bit lane shuffles). */
static void write_columns(const int64_t *sums, int64_t w, int64_t rows, int64_t offset, int64_t *out, int64_t ld)
{
    const __mmask8 m = (__mmask8)((1u << w) - 1);
    const __m512i off = _mm512_set1_epi64(offset);
    int64_t r0 = 0;
    for (; r0 + 8 <= rows; r0 += 8) {
        __m512i v[8], t[8], u[8];
        for (int c = 0; c < 8; ++c)
            v[c] = c < w ? _mm512_loadu_si512((const void *)(sums + c * GS_LUT_ROWS + r0)) : _mm512_setzero_si512();
        for (int c = 0; c < 8; c += 2) {
            t[c] = _mm512_unpacklo_epi64(v[c], v[c + 1]);     /* rows 0,2,4,6 of columns c, c+1 */
            t[c + 1] = _mm512_unpackhi_epi64(v[c], v[c + 1]); /* rows 1,3,5,7 */
        }
        for (int h = 0; h < 8; h += 4) {
            u[h] = _mm512_shuffle_i64x2(t[h], t[h + 2], 0x88);     /* rows 0, 4 of 4 columns */
            u[h + 1] = _mm512_shuffle_i64x2(t[h + 1], t[h + 3], 0x88); /* rows 1, 5 */
            u[h + 2] = _mm512_shuffle_i64x2(t[h], t[h + 2], 0xDD);     /* rows 2, 6 */
            u[h + 3] = _mm512_shuffle_i64x2(t[h + 1], t[h + 3], 0xDD); /* rows 3, 7 */
        }
        for (int i = 0; i < 4; ++i) {
            const __m512i lo = _mm512_shuffle_i64x2(u[i], u[i + 4], 0x88); /* row i */
            const __m512i hi = _mm512_shuffle_i64x2(u[i], u[i + 4], 0xDD); /* row i + 4 */
            _mm512_mask_storeu_epi64(out + (r0 + i) * ld, m, _mm512_add_epi64(lo, off));
            _mm512_mask_storeu_epi64(out + (r0 + i + 4) * ld, m, _mm512_add_epi64(hi, off));
        }
    }
    for (; r0 < rows; ++r0)
        for (int64_t c = 0; c < w; ++c) out[r0 * ld + c] = sums[c * GS_LUT_ROWS + r0] + offset;
}

void gs_lut_kernel_avx512(const gs_lut_args *p)
{
    const int64_t K = p->k, groups = (p->rows + 63) / 64;
    const int P = p->t->planes;
    uint32_t *sums32 = (uint32_t *)p->scratch;                           /* GS_LUT_ROWS */
    int64_t *sums64 = (int64_t *)((char *)p->scratch + GS_LUT_ROWS * 4); /* COLS x GS_LUT_ROWS */
    int64_t *ko = sums64 + COLS * GS_LUT_ROWS;                            /* 2K term offsets */
    uint8_t *codes = (uint8_t *)(ko + 2 * (K > 0 ? K : 1));               /* 2K term codes */
    const int skip_zero = p->t->zero_code_free;
    /* the subtracted minimum comes back as K min(T) per column; a pair's two cancel */
    const int64_t offset = p->pairs ? 0 : K * (int64_t)p->t->tmin;
    for (int64_t j0 = 0; j0 < p->ncols; j0 += COLS) {
        const int64_t w = p->ncols - j0 < COLS ? p->ncols - j0 : COLS;
        for (int64_t c = 0; c < w; ++c) {
            /* the column's terms: every k, or only the nonzero codes; a pair's negative column
             * follows its positive one (pairs: skip_zero holds, gs_lut_pairs_fused) */
            int64_t terms = 0, npos;
            const int64_t columns = p->pairs ? 2 : 1;
            for (int64_t half = 0; half < columns; ++half) {
                const uint8_t *btj = p->bt + (columns * (j0 + c) + half) * p->ldbt;
                for (int64_t kk = 0; kk < K; ++kk) {
                    codes[terms] = btj[kk];
                    ko[terms] = kk * 64;
                    terms += !skip_zero || btj[kk] != 0;
                }
                if (half == 0) npos = terms;
            }
            int64_t *s64 = sums64 + c * GS_LUT_ROWS;
            switch (P) {
            case 1: column(p->a, K, groups, codes, ko, terms, npos, p->t->plane_data, 1, sums32, s64); break;
            case 2: column(p->a, K, groups, codes, ko, terms, npos, p->t->plane_data, 2, sums32, s64); break;
            default: column(p->a, K, groups, codes, ko, terms, npos, p->t->plane_data, 3, sums32, s64); break;
            }
        }
        write_columns(sums64, w, p->rows, offset, p->acc + j0, p->ldacc);
    }
}

/* ------------------------------------------------------------------------------------------------
 * Quantization (bit for bit gs_quant: float64 division, round half to even, same clamps)
 * ------------------------------------------------------------------------------------------------ */

static inline __mmask16 nonfinite16(__m512 x)
{
    const __m512i e = _mm512_set1_epi32(0x7f800000);
    return _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(x), e), e);
}

int gs_range_span_avx512(const float *src, int64_t n, float *lo, float *hi)
{
    __m512 l = _mm512_set1_ps(*lo), h = _mm512_set1_ps(*hi);
    __mmask16 bad = 0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(src + i);
        const __mmask16 nf = nonfinite16(x);
        bad |= nf;
        l = _mm512_mask_min_ps(l, (__mmask16)~nf, l, x);
        h = _mm512_mask_max_ps(h, (__mmask16)~nf, h, x);
    }
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        const __m512 x = _mm512_maskz_loadu_ps(m, src + i);
        const __mmask16 nf = nonfinite16(x) & m;
        bad |= nf;
        l = _mm512_mask_min_ps(l, (__mmask16)(~nf & m), l, x);
        h = _mm512_mask_max_ps(h, (__mmask16)(~nf & m), h, x);
    }
    *lo = _mm512_reduce_min_ps(l);
    *hi = _mm512_reduce_max_ps(h);
    return bad != 0;
}

/* fl(t / s) as far as rint can tell: t * (1/s), except lanes within 2^-48 |v| of a half-integer
 * (or not finite), which are divided (see gs_recip). */
static inline __m512d quotient_avx512(__m512d t, __m512d s, __m512d r)
{
    const __m512d v = _mm512_mul_pd(t, r);
    const __m512d n = _mm512_roundscale_pd(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512d frac = _mm512_abs_pd(_mm512_sub_pd(v, n));
    const __m512d tol = _mm512_mul_pd(_mm512_abs_pd(v), _mm512_set1_pd(0x1p-48));
    const __mmask8 near = _mm512_cmp_pd_mask(_mm512_sub_pd(_mm512_set1_pd(0.5), frac), tol, _CMP_NGT_UQ);
    if (near) return _mm512_mask_div_pd(v, near, t, s);
    return v;
}

/* codes of the 16 floats x */
static inline __m128i quant16_avx512(__m512 x, __m512d s0, __m512d s1, __m512d r0, __m512d r1, __m512d z0,
                                     __m512d z1, __m512i zero16, int is_signed, __mmask16 *bad)
{
    const __mmask16 nf = nonfinite16(x);
    *bad |= nf;
    const __m512d lim = _mm512_set1_pd(512.0), nlim = _mm512_set1_pd(-512.0);
    const __m512 xf = _mm512_maskz_mov_ps((__mmask16)~nf, x); /* non-finite lanes replaced below */
    __m512d v0 = quotient_avx512(_mm512_cvtps_pd(_mm512_castps512_ps256(xf)), s0, r0);
    __m512d v1 = quotient_avx512(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(xf), 1))),
                                 s1, r1);
    v0 = _mm512_roundscale_pd(_mm512_max_pd(_mm512_min_pd(v0, lim), nlim), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v1 = _mm512_roundscale_pd(_mm512_max_pd(_mm512_min_pd(v1, lim), nlim), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512d lo, hi;
    if (is_signed) {
        lo = _mm512_set1_pd(-127.0), hi = _mm512_set1_pd(127.0);
    } else {
        v0 = _mm512_add_pd(v0, z0), v1 = _mm512_add_pd(v1, z1);
        lo = _mm512_setzero_pd(), hi = _mm512_set1_pd(255.0);
    }
    v0 = _mm512_max_pd(_mm512_min_pd(v0, hi), lo);
    v1 = _mm512_max_pd(_mm512_min_pd(v1, hi), lo);
    __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtpd_epi32(v0)), _mm512_cvtpd_epi32(v1), 1);
    q = _mm512_mask_blend_epi32(nf, q, zero16);
    return _mm512_cvtepi32_epi8(q); /* low byte of each (values -127..255) */
}

int gs_quantize_span_avx512(const float *src, int64_t n, const double *scale, const double *recip,
                            const int32_t *zero, int per_element, int is_signed, uint8_t *dst)
{
    __mmask16 bad = 0;
    int64_t i = 0;
    if (!per_element) {
        const __m512d s = _mm512_set1_pd(scale[0]), r = _mm512_set1_pd(recip[0]);
        const __m512d z = _mm512_set1_pd((double)zero[0]);
        const __m512i z16 = _mm512_set1_epi32(zero[0]);
        for (; i + 16 <= n; i += 16)
            _mm_storeu_si128((__m128i *)(dst + i),
                             quant16_avx512(_mm512_loadu_ps(src + i), s, s, r, r, z, z, z16, is_signed, &bad));
        if (i < n) {
            const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
            __mmask16 b = 0;
            const __m128i c = quant16_avx512(_mm512_maskz_loadu_ps(m, src + i), s, s, r, r, z, z, z16, is_signed, &b);
            bad |= b & m;
            _mm_mask_storeu_epi8(dst + i, m, c);
        }
    } else {
        for (; i + 16 <= n; i += 16) {
            const __m512i zi = _mm512_loadu_si512((const void *)(zero + i));
            const __m512d z0 = _mm512_cvtepi32_pd(_mm512_castsi512_si256(zi));
            const __m512d z1 = _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(zi, 1));
            _mm_storeu_si128((__m128i *)(dst + i),
                             quant16_avx512(_mm512_loadu_ps(src + i), _mm512_loadu_pd(scale + i),
                                            _mm512_loadu_pd(scale + i + 8), _mm512_loadu_pd(recip + i),
                                            _mm512_loadu_pd(recip + i + 8), z0, z1, zi, is_signed, &bad));
        }
        if (i < n)
            bad |= (__mmask16)gs_quantize_span_scalar(src + i, n - i, scale + i, zero + i, 1, is_signed, dst + i);
    }
    return bad != 0;
}

/* ------------------------------------------------------------------------------------------------
 * Epilogue (bit for bit gs_epilogue_row_scalar: int64 corrections, vcvtqq2pd / vcvtpd2ps round to
 * nearest like the C conversions)
 * ------------------------------------------------------------------------------------------------ */

/* Column by column chunk of 8 (the last masked), rows inner: a chunk's per-column terms -- the
 * row-independent part of the zero-point correction, K za zero - za colsum, scales, bias, NaN
 * mask -- are loaded once; the row's own term zero * rsum only when some zero point is not 0. */
void gs_epilogue_rows_avx512(const gs_epilogue *e, const int64_t *acc, int pairs, int64_t rows, int64_t n,
                             const int64_t *rsums, float *out, int64_t ldout)
{
    const __m512i even = _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_add_epi64(even, _mm512_set1_epi64(1));
    const __m256 nan8 = _mm256_set1_ps(__builtin_nanf(""));
    const int64_t lda = pairs ? 2 * n : n;
    for (int64_t j = 0; j < n; j += 8) {
        const int64_t left = n - j;
        const __mmask8 m = left >= 8 ? 0xFF : (__mmask8)((1u << left) - 1);
        /* a pair chunk reads 2 x 8 sums: the first 8 hold columns j..j+3, the next j+4..j+7 */
        const __mmask8 m_lo = left >= 4 ? 0xFF : (__mmask8)((1u << (2 * left)) - 1);
        const __mmask8 m_hi = left >= 8 ? 0xFF : (left > 4 ? (__mmask8)((1u << (2 * (left - 4))) - 1) : 0);
        __m512i zero = _mm512_setzero_si512(), fixed = _mm512_setzero_si512();
        int row_term = 0;
        if (e->is_unsigned) {
            zero = _mm512_cvtepi32_epi64(_mm256_maskz_loadu_epi32(m, e->zero + j));
            const __m512i cs = _mm512_maskz_loadu_epi64(m, e->colsum + j);
            fixed = _mm512_sub_epi64(_mm512_mullo_epi64(_mm512_set1_epi64(e->K * e->za), zero),
                                     _mm512_mullo_epi64(_mm512_set1_epi64(e->za), cs));
            row_term = rsums && _mm512_test_epi64_mask(zero, zero) != 0;
        }
        const __m512d scale = _mm512_maskz_loadu_pd(m, e->sasb + j);
        const __m256 bias = e->bias ? _mm256_maskz_loadu_ps(m, e->bias + j) : _mm256_setzero_ps();
        const __mmask8 bad = (__mmask8)_mm_cmpneq_epi8_mask(_mm_maskz_loadu_epi8((__mmask16)m, e->bad + j),
                                                           _mm_setzero_si128());
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t *a = acc + r * lda;
            __m512i v;
            if (pairs) { /* the sign-magnitude column pair (2j, 2j + 1): positive minus negative sums */
                const __m512i lo = _mm512_maskz_loadu_epi64(m_lo, a + 2 * j);
                const __m512i hi = _mm512_maskz_loadu_epi64(m_hi, a + 2 * j + 8);
                v = _mm512_sub_epi64(_mm512_permutex2var_epi64(lo, even, hi), _mm512_permutex2var_epi64(lo, odd, hi));
            } else {
                v = _mm512_maskz_loadu_epi64(m, a + j);
            }
            v = _mm512_add_epi64(v, fixed);
            if (row_term) v = _mm512_sub_epi64(v, _mm512_mullo_epi64(zero, _mm512_set1_epi64(rsums[r])));
            __m256 y = _mm512_cvtpd_ps(_mm512_mul_pd(scale, _mm512_cvtepi64_pd(v)));
            if (e->bias) y = _mm256_add_ps(y, bias);
            _mm256_mask_storeu_ps(out + r * ldout + j, m, _mm256_mask_blend_ps(bad, y, nan8));
        }
    }
}

/* ---- factored tables: quantize and map, and the epilogue row, 16 lanes at a time ----
 * gs_quantize_map_avx2's computation (lut_avx2.c) on 16 lanes: the same float32 fast path and the
 * same clipping.  A vector with a lane next to a half-integer (every vector, when the reciprocal
 * is not a normal float32) takes quant16_avx512's float64 formula and the tail gs_quant itself:
 * gs_quant's codes, as gs_quantize_map_avx2 gives, so the codes are its codes. */
int gs_quantize_map_avx512(const float *src, int64_t n, double scale, double recip, int32_t zero, int is_signed,
                           const float *mapped, float *out, uint8_t *codes)
{
    const float r32 = (float)recip;
    const int fast = recip == recip && r32 > 1e-30f && r32 < 1e30f; /* a normal float32 reciprocal */
    int bad = 0;
    int64_t i = 0;
    const __m512d s = _mm512_set1_pd(scale), r = _mm512_set1_pd(recip), zd = _mm512_set1_pd((double)zero);
    const __m512i z32 = _mm512_set1_epi32(zero), low_byte = _mm512_set1_epi32(0xff);
    const __m512 rf = _mm512_set1_ps(r32), zf = _mm512_set1_ps((float)zero);
    const __m512 lo = _mm512_set1_ps(is_signed ? -127.0f : 0.0f), hi = _mm512_set1_ps(is_signed ? 127.0f : 255.0f);
    const __m512 lim = _mm512_set1_ps(512.0f), nlim = _mm512_set1_ps(-512.0f);
    const __m512 expmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7f800000));
    const __m512 half = _mm512_set1_ps(0.5f), tolscale = _mm512_set1_ps(0x1p-22f), far = _mm512_set1_ps(600.0f);
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(src + i);
        const __mmask16 nonfinite = _mm512_cmp_ps_mask(_mm512_and_ps(x, expmask), expmask, _CMP_EQ_OQ);
        const __m512 v = _mm512_mul_ps(_mm512_maskz_mov_ps((__mmask16)~nonfinite, x), rf);
        const __m512 av = _mm512_abs_ps(v);
        const __m512 nearest = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512 frac = _mm512_abs_ps(_mm512_sub_ps(v, nearest));
        const __m512 gap = _mm512_abs_ps(_mm512_sub_ps(half, frac));
        const __mmask16 near = _mm512_cmp_ps_mask(gap, _mm512_mul_ps(av, tolscale), _CMP_LE_OQ) &
                               _mm512_cmp_ps_mask(av, far, _CMP_LT_OQ);
        if (!fast || near) {
            __mmask16 b = 0;
            const __m128i bytes = quant16_avx512(x, s, s, r, r, zd, zd, z32, is_signed, &b);
            bad |= b != 0;
            _mm512_storeu_ps(out + i, _mm512_i32gather_ps(_mm512_cvtepu8_epi32(bytes), mapped, 4));
            if (codes) _mm_storeu_si128((__m128i *)(codes + i), bytes);
            continue;
        }
        bad |= nonfinite != 0;
        __m512 q = _mm512_roundscale_ps(_mm512_max_ps(_mm512_min_ps(v, lim), nlim),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        if (!is_signed) q = _mm512_add_ps(q, zf);
        q = _mm512_max_ps(_mm512_min_ps(q, hi), lo);
        const __m512i c = _mm512_mask_mov_epi32(_mm512_cvtps_epi32(q), nonfinite, z32);
        /* the table is indexed by the code byte (two's complement for signed codes) */
        const __m512i idx = _mm512_and_si512(c, low_byte);
        _mm512_storeu_ps(out + i, _mm512_i32gather_ps(idx, mapped, 4));
        if (codes) _mm_storeu_si128((__m128i *)(codes + i), _mm512_cvtepi32_epi8(idx));
    }
    if (i < n) /* the last n % 16: the scalar loop (gs_quant) */
        bad |= gs_quantize_map_scalar(src + i, n - i, scale, recip, zero, is_signed, mapped, out + i,
                                      codes ? codes + i : NULL);
    return bad != 0;
}

/* gs_factored_epilogue_row_avx2 on 8 lanes: float32(scale * (y + z)) (+ bias), float64 inside;
 * the tail is its scalar formula */
void gs_factored_epilogue_row_avx512(const double *scale, const double *z, const float *bias, float *y, int64_t n)
{
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m512d v = _mm512_add_pd(_mm512_cvtps_pd(_mm256_loadu_ps(y + j)), _mm512_loadu_pd(z + j));
        __m256 r = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_loadu_pd(scale + j), v));
        if (bias) r = _mm256_add_ps(r, _mm256_loadu_ps(bias + j));
        _mm256_storeu_ps(y + j, r);
    }
    if (j < n) /* the last n % 8 */
        gs_factored_epilogue_row_scalar(scale + j, z + j, bias ? bias + j : NULL, y + j, n - j);
}

#endif /* x86 */
