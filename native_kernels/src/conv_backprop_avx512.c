/*
 * conv_backprop_avx512.c -- the input gradient of a convolution (a Conv2DTranspose) computed
 * directly, output pixel by output pixel, on the avx512 path: conv_backprop_f32.c's and
 * lut_conv_backprop.c's GEMM by every tap and scatter-add without the products matrix.
 *
 * The GEMM + scatter writes taps x channels products per input pixel (1.6 GB for a 7x7 layer of
 * 128 filters over 64x64x32 inputs, batch 16) and reads them back to scatter them.  Here a tile
 * of TP output pixels of one phase (dx columns iw0, iw0 + sw, ...: their taps read adjacent dy
 * pixels) x 32 output channels (2 zmm) stays in registers while every tap that reaches it is
 * summed.  Two modes:
 *  - exact (graphswap_conv2d_backprop_input_f32): each tap's sum over the dy channels is its own
 *    FMA chain from 0 (what OpenBLAS's sgemm computes for one element of the products), added to
 *    the pixel's total in the scatter's order (oh, then ow ascending: fh, then fw descending) -
 *    the GEMM + scatter's result bit for bit (tests/test_conv_backprop_direct.py);
 *  - fused (the factored tables, every sum an exact integer): the products go straight into the
 *    accumulators; every `group` taps they are added into float64 (`row64`), or, where a pixel's
 *    whole sum stays exact in float32, written as floats.
 * Pixels whose taps leave dy (the row's first and last ones of a phase) and the tail of a phase
 * run one at a time with the taps that exist, in the same order.
 */
#pragma GCC target("avx512f,avx512vl,avx2,fma")

#include <immintrin.h>
#include <string.h>

#include "internal.h"

#define TP 8 /* output pixels per register tile (then 4, then 1) */

/* the filter as [block of 32 channels][tap][k][32 lanes] (the last block 16 lanes where at most
 * 16 channels remain), zero beyond C: src(tap, k, c) = filter[(tap * C + c) * K + k] when
 * `k_inner`, else filter[(tap * K + k) * C + c] */
int64_t gs_backprop_packed_floats(int64_t taps, int64_t K, int64_t C)
{
    const int64_t lanes = (C + 15) / 16 * 16;
    return ((lanes + 31) / 32 * 32) * taps * K;
}

void gs_backprop_pack_avx512(const float *filter, int64_t taps, int64_t K, int64_t C, int k_inner, float *wt)
{
    for (int64_t c0 = 0; c0 < C; c0 += 32) {
        const int64_t width = C - c0 > 16 ? 32 : 16;
        float *dst = wt + c0 * taps * K;
        for (int64_t tp = 0; tp < taps; ++tp)
            for (int64_t k = 0; k < K; ++k)
                for (int64_t l = 0; l < width; ++l) {
                    const int64_t c = c0 + l;
                    dst[(tp * K + k) * width + l] =
                        c >= C ? 0.0f : k_inner ? filter[(tp * C + c) * K + k] : filter[(tp * K + k) * C + c];
                }
    }
}

/* Zero pixels on each side of a dy row such that every tap of every dx pixel reads inside the
 * padded row; a tap outside dy then adds an exact 0 (0 * w: the weights must be finite, and a
 * pixel's total, which starts at +0, is never -0), so edge pixels run in full tiles too. */
int64_t gs_backprop_pad(const graphswap_conv2d_params *P)
{
    return (P->filter_width + P->pad_left + P->pad_right) / P->stride_width + 2;
}

/* dy (batch x OH x OW x K) into rows padded with `pad` zero pixels on both sides */
void gs_backprop_pad_dy(const graphswap_conv2d_params *P, const float *dy, int64_t pad, float *padded)
{
    const int64_t K = P->out_channels, OW = P->out_width, row = (OW + 2 * pad) * K;
    for (int64_t r = 0; r < P->batch * P->out_height; ++r) {
        float *d = padded + r * row;
        memset(d, 0, (size_t)(pad * K) * sizeof(float));
        memcpy(d + pad * K, dy + r * OW * K, (size_t)(OW * K) * sizeof(float));
        memset(d + (pad + OW) * K, 0, (size_t)(pad * K) * sizeof(float));
    }
}

typedef struct bp_row {
    const graphswap_conv2d_params *P;
    const float *dy;     /* the image's dy (OH x OW x K) */
    const float *wt;     /* gs_backprop_pack_avx512's layout */
    float *out;          /* the row's IW x C floats (exact mode, or fused with group >= ntaps) */
    double *row64;       /* the row's IW x C float64 sums (fused mode with groups), else NULL */
    int exact;
    int64_t group;       /* fused mode: taps per float32 run */
    int64_t ntaps;
    int64_t fh[64], oh[64]; /* the row's taps (fh descending), their dy rows */
    int64_t pad;            /* dy rows padded with `pad` zero pixels on both sides, or 0 */
} bp_row;

/* d[0..15] += the 16 float32 sums of `acc` widened to float64 (lanes outside `mask` untouched):
 * a run of exact float32 partial sums handed to the row's float64 accumulator */
static inline __attribute__((always_inline)) void bp_add_to_row64(double *d, __m512 acc,
                                                                  __mmask16 mask) {
    const __mmask8 lo = (__mmask8)mask, hi = (__mmask8)(mask >> 8);
    const __m512d a0 = _mm512_cvtps_pd(_mm512_castps512_ps256(acc));
    const __m512d a1 = _mm512_cvtps_pd(_mm256_castpd_ps(
        _mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
    _mm512_mask_storeu_pd(d, lo, _mm512_add_pd(_mm512_maskz_loadu_pd(lo, d), a0));
    _mm512_mask_storeu_pd(d + 8, hi, _mm512_add_pd(_mm512_maskz_loadu_pd(hi, d + 8), a1));
}

/* pixels iw0 + j sw (j < NP) of the row, channels c0 .. c0 + 16 NV - 1 (block wb), taps fw in
 * fws[0..nfw) for every pixel (all inside dy when NP > 1, else checked).  EXACT: each tap's FMA
 * chain in registers, added into the pixel's total in memory (the row itself: a tile's 2 KiB stay
 * in L1); fused: the sums in registers. */
static inline __attribute__((always_inline)) void bp_tile(const bp_row *R, int64_t iw0, const int64_t *fws,
                                                          int64_t nfw, int64_t c0, const float *wb,
                                                          const int NP, const int NV, const int EXACT)
{
    const graphswap_conv2d_params *P = R->P;
    const int64_t K = P->out_channels, C = P->in_channels, OW = P->out_width, sw = P->stride_width,
                  FW = P->filter_width, width = 16 * NV;
    __mmask16 mask[2];
    _Pragma("GCC unroll 2") for (int v = 0; v < NV; ++v) {
        const int64_t left = C - c0 - 16 * v;
        mask[v] = left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
    }
    __m512 acc[TP][2];
    _Pragma("GCC unroll 8") for (int j = 0; j < NP; ++j)
        _Pragma("GCC unroll 2") for (int v = 0; v < NV; ++v) acc[j][v] = _mm512_setzero_ps();
    if (EXACT)
        _Pragma("GCC unroll 8") for (int j = 0; j < NP; ++j)
            _Pragma("GCC unroll 2") for (int v = 0; v < NV; ++v)
                _mm512_mask_storeu_ps(R->out + (iw0 + j * sw) * C + c0 + 16 * v, mask[v], acc[j][v]);
    int64_t done = 0;
    for (int64_t a = 0; a < R->ntaps; ++a) {
        const float *dyrow = R->dy + (R->oh[a] * (OW + 2 * R->pad) + R->pad) * K;
        for (int64_t b = 0; b < nfw; ++b) {
            const int64_t fw = fws[b], ow0 = (iw0 + P->pad_left - fw) / sw;
            if (NP == 1 && (ow0 < 0 || ow0 >= OW)) continue;
            const float *src = dyrow + ow0 * K;
            const float *w = wb + ((R->fh[a] * FW + fw) * K) * width;
            if (EXACT)
                _Pragma("GCC unroll 8") for (int j = 0; j < NP; ++j)
                    _Pragma("GCC unroll 2") for (int v = 0; v < NV; ++v) acc[j][v] = _mm512_setzero_ps();
            for (int64_t k = 0; k < K; ++k) {
                const __m512 w0 = _mm512_load_ps(w + k * width);
                const __m512 w1 = NV > 1 ? _mm512_load_ps(w + k * width + 16) : w0;
                _Pragma("GCC unroll 8") for (int j = 0; j < NP; ++j) {
                    const __m512 x = _mm512_set1_ps(src[j * K + k]);
                    acc[j][0] = _mm512_fmadd_ps(x, w0, acc[j][0]);
                    if (NV > 1) acc[j][1] = _mm512_fmadd_ps(x, w1, acc[j][1]);
                }
            }
            if (EXACT) {
                _Pragma("GCC unroll 8") for (int j = 0; j < NP; ++j)
                    _Pragma("GCC unroll 2") for (int v = 0; v < NV; ++v) {
                        float *o = R->out + (iw0 + j * sw) * C + c0 + 16 * v;
                        _mm512_mask_storeu_ps(o, mask[v], _mm512_add_ps(_mm512_maskz_loadu_ps(mask[v], o), acc[j][v]));
                    }
            } else if (R->row64 && ++done == R->group) { /* end of an exact float32 run */
                done = 0;
                _Pragma("GCC unroll 8") for (int j = 0; j < NP; ++j)
                    _Pragma("GCC unroll 2") for (int v = 0; v < NV; ++v) {
                        bp_add_to_row64(R->row64 + (iw0 + j * sw) * C + c0 + 16 * v, acc[j][v],
                                        mask[v]);
                        acc[j][v] = _mm512_setzero_ps();
                    }
            }
        }
    }
    if (EXACT) return;
    _Pragma("GCC unroll 8") for (int j = 0; j < NP; ++j)
        _Pragma("GCC unroll 2") for (int v = 0; v < NV; ++v) {
            if (R->row64) {
                bp_add_to_row64(R->row64 + (iw0 + j * sw) * C + c0 + 16 * v, acc[j][v], mask[v]);
            } else {
                _mm512_mask_storeu_ps(R->out + (iw0 + j * sw) * C + c0 + 16 * v, mask[v], acc[j][v]);
            }
        }
}

/* (compiled for AVX-512 like the whole file: call only after gs_isa() == GS_ISA_AVX512)
 * whether the direct kernel takes this geometry: no dilation or groups, at most 64 tap rows, >= 16
 * output channels (the transposed convolution's filters) and a reduction short enough that
 * OpenBLAS's sgemm sums it in one chain (GEMM_Q, its K block, is 256 or more on every core) */
int gs_backprop_direct_fits(const graphswap_conv2d_params *P)
{
    return gs_isa() == GS_ISA_AVX512 && P->groups == 1 && P->dilation_height == 1 && P->dilation_width == 1 &&
           P->filter_height <= 64 && P->filter_width <= 256 && P->in_channels >= 16 && P->out_channels >= 1 && P->out_channels <= 256;
}

/* row ih of image dy's transposed convolution (see the module comment); row64 (fused mode with
 * groups) must be zero on entry */
void gs_backprop_row_avx512(const graphswap_conv2d_params *P, const float *dy, int64_t pad, const float *wt,
                            int64_t ih, int exact, int64_t group, float *out, double *row64)
{
    bp_row R;
    R.P = P, R.dy = dy, R.wt = wt, R.out = out, R.row64 = row64, R.exact = exact, R.group = group;
    R.pad = pad;
    R.ntaps = 0;
    const int64_t sh = P->stride_height, sw = P->stride_width, IW = P->in_width, C = P->in_channels,
                  K = P->out_channels, taps = P->filter_height * P->filter_width;
    for (int64_t fh = P->filter_height - 1; fh >= 0; --fh) {
        const int64_t v = ih + P->pad_top - fh;
        if (v < 0 || v % sh != 0 || v / sh >= P->out_height) continue;
        R.fh[R.ntaps] = fh, R.oh[R.ntaps] = v / sh, R.ntaps++;
    }
    if (R.ntaps == 0) {
        if (!row64) memset(out, 0, (size_t)(IW * C) * sizeof(float));
        return;
    }
    for (int64_t r = 0; r < sw && r < IW; ++r) {
        int64_t fws[256], nfw = 0, lo = 0, hi = IW; /* iw range of pixels with every tap inside dy */
        for (int64_t fw = P->filter_width - 1; fw >= 0 && nfw < 256; --fw) {
            const int64_t v = r + P->pad_left - fw;
            if (((v % sw) + sw) % sw != 0) continue;
            fws[nfw++] = fw;
            /* ow = (iw + pad_left - fw) / sw in [0, OW) */
            const int64_t first = fw - P->pad_left, last = (P->out_width - 1) * sw + fw - P->pad_left;
            if (first > lo) lo = first;
            if (last + 1 < hi) hi = last + 1;
        }
        if (pad > 0) lo = 0, hi = IW; /* taps beyond dy read its zero padding */
        for (int64_t c0 = 0; c0 < C; c0 += 32) {
            const float *wb = wt + c0 * taps * K;
            const int two = C - c0 > 16;
            for (int64_t iw = r; iw < IW; iw += sw) {
                const int np = nfw > 0 && iw >= lo ? (iw + (TP - 1) * sw < hi ? TP : iw + 3 * sw < hi ? 4 : 1) : 1;
#define GS_BP_TILES(E)                                                                      \
    if (np == TP && two) bp_tile(&R, iw, fws, nfw, c0, wb, TP, 2, E);                      \
    else if (np == TP) bp_tile(&R, iw, fws, nfw, c0, wb, TP, 1, E);                        \
    else if (np == 4 && two) bp_tile(&R, iw, fws, nfw, c0, wb, 4, 2, E);                   \
    else if (np == 4) bp_tile(&R, iw, fws, nfw, c0, wb, 4, 1, E);                          \
    else if (two) bp_tile(&R, iw, fws, nfw, c0, wb, 1, 2, E);                              \
    else bp_tile(&R, iw, fws, nfw, c0, wb, 1, 1, E);
                if (exact) {
                    GS_BP_TILES(1)
                } else {
                    GS_BP_TILES(0)
                }
#undef GS_BP_TILES
                iw += (np - 1) * sw;
            }
        }
    }
}
