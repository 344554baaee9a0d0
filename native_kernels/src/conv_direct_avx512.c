/*
 * conv_direct_avx512.c -- direct float32 convolution with AVX-512 (part of graphswap_conv2d_f32)
 * for unit-stride, undilated, ungrouped convolutions with output channels in multiples of 16 and
 * enough input channels (a ResNet's 3x3 layers).
 *
 * im2col + sgemm copies every patch twice (our gather, then OpenBLAS's packing: ~16% of the call
 * on 8x56x56x64 3x3) before the multiply.  Here the input is read in place: a tile of TW adjacent
 * output pixels x up to 64 output channels (4 zmm) stays in 24 accumulators; for every tap and
 * input channel one filter row (oc contiguous in HWIO) is loaded and each pixel's input value is
 * broadcast into TW x 4 FMAs.  Pixels whose window crosses the left/right padding run one at a
 * time with the taps that exist; rows outside the image are skipped (they would add 0 * w).
 */
#pragma GCC target("avx512f,avx512vl,avx2,fma")

#include <immintrin.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "internal.h"

#define TW 6                              /* output pixels per register tile */
#define OCB 64                            /* output channels per tile (4 zmm) */
#define GS_DIRECT_MIN_FLOPS_PER_THREAD 4.0e6

/* Where it beats im2col + sgemm (8x56x56x64 3x3: 0.76x the time; 14x14x256 0.87x): windows of
 * more than one tap (a 1x1 convolution multiplies the input in place, no im2col to save) and a
 * filter slice per 64 output channels that stays in L2 while a row's pixels reuse it (7x7x512 3x3,
 * 1.2 MB a slice, ran 2.1x slower from memory). */
#define GS_DIRECT_MAX_SLICE_BYTES (1 << 20)

/* Pixels whose window crosses the padding, and a row's last OW % TW, run one at a time: a row
 * whose full tiles cover under 3/4 of it runs slower than im2col + sgemm (the Conv2DTranspose
 * phases merged into one 2x2 convolution over a 12-wide row, 64 -> 128 channels: 1.8x the time;
 * over a 6-wide row 2x). */
static int rows_tile_well(const graphswap_conv2d_params *P)
{
    const int64_t inner = P->out_width - P->pad_left - P->pad_right;
    return inner >= TW && 4 * (inner / TW) * TW >= 3 * P->out_width;
}

int gs_conv_direct_avx512_fits(const graphswap_conv2d_params *P)
{
    const int64_t taps = P->filter_height * P->filter_width;
    return rows_tile_well(P) && P->groups == 1 && P->stride_height == 1 && P->stride_width == 1 && P->dilation_height == 1 &&
           P->dilation_width == 1 && P->out_channels % 16 == 0 && P->out_channels >= 32 &&
           P->in_channels >= 16 && taps > 1 &&
           taps * P->in_channels * OCB * (int64_t)sizeof(float) <= GS_DIRECT_MAX_SLICE_BYTES;
}

/* Output pixels ow0 .. ow0 + NP - 1 of row (n, oh), channels oc0 .. oc0 + 16 NV - 1, taps fw in
 * [fw0, fw1) for every pixel (the caller guarantees they are inside the image). */
static inline __attribute__((always_inline)) void tile(const float *restrict img, const float *restrict filter,
                                                       float *restrict out, const graphswap_conv2d_params *P,
                                                       int64_t oh, int64_t ow0, int64_t oc0, int64_t fw0,
                                                       int64_t fw1, const int NP, const int NV)
{
    const int64_t C = P->in_channels, W = P->in_width, H = P->in_height, FW = P->filter_width;
    const int64_t cout = P->out_channels;
    __m512 acc[TW][4];
    for (int p = 0; p < NP; ++p)
        for (int v = 0; v < NV; ++v) acc[p][v] = _mm512_setzero_ps();
    for (int64_t fh = 0; fh < P->filter_height; ++fh) {
        const int64_t ih = oh - P->pad_top + fh;
        if (ih < 0 || ih >= H) continue;
        for (int64_t fw = fw0; fw < fw1; ++fw) {
            const float *x = img + (ih * W + ow0 - P->pad_left + fw) * C;
            const float *w = filter + (fh * FW + fw) * C * cout + oc0;
            for (int64_t ic = 0; ic < C; ++ic) {
                __m512 wv[4];
                for (int v = 0; v < NV; ++v) wv[v] = _mm512_loadu_ps(w + ic * cout + 16 * v);
                for (int p = 0; p < NP; ++p) {
                    const __m512 b = _mm512_set1_ps(x[p * C + ic]);
                    for (int v = 0; v < NV; ++v) acc[p][v] = _mm512_fmadd_ps(b, wv[v], acc[p][v]);
                }
            }
        }
    }
    for (int p = 0; p < NP; ++p)
        for (int v = 0; v < NV; ++v) _mm512_storeu_ps(out + (ow0 + p) * cout + oc0 + 16 * v, acc[p][v]);
}

/* A pixel whose window crosses the row's padding: the taps inside the image (none: zeros). */
static inline __attribute__((always_inline)) void border_pixel(const float *img, const float *filter, float *out,
                                                               const graphswap_conv2d_params *P, int64_t oh,
                                                               int64_t ow, int64_t oc0, const int NV)
{
    const int64_t W = P->in_width, FW = P->filter_width, pl = P->pad_left;
    const int64_t f0 = pl - ow > 0 ? pl - ow : 0, f1 = W + pl - ow < FW ? W + pl - ow : FW;
    if (f1 > f0) {
        tile(img, filter, out, P, oh, ow, oc0, f0, f1, 1, NV);
        return;
    }
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(out + ow * P->out_channels + oc0 + 16 * v, _mm512_setzero_ps());
}

/* One output row's channels [oc0, oc0 + 16 NV): pixels [lo, hi) have every tap inside the row. */
static inline __attribute__((always_inline)) void row(const float *img, const float *filter, float *out,
                                                      const graphswap_conv2d_params *P, int64_t oh,
                                                      int64_t oc0, const int NV)
{
    const int64_t OW = P->out_width, pl = P->pad_left;
    const int64_t lo = pl < OW ? pl : OW;
    int64_t hi = P->in_width - P->filter_width + pl + 1;
    hi = hi > OW ? OW : (hi < lo ? lo : hi);
    int64_t ow = 0;
    for (; ow < lo; ++ow) border_pixel(img, filter, out, P, oh, ow, oc0, NV);
    for (; ow + TW <= hi; ow += TW) tile(img, filter, out, P, oh, ow, oc0, 0, P->filter_width, TW, NV);
    for (; ow < hi; ++ow) tile(img, filter, out, P, oh, ow, oc0, 0, P->filter_width, 1, NV);
    for (; ow < OW; ++ow) border_pixel(img, filter, out, P, oh, ow, oc0, NV);
}

int32_t gs_conv_direct_avx512(const float *input, const float *filter, float *output,
                              const graphswap_conv2d_params *P)
{
    const int64_t OH = P->out_height, OW = P->out_width, cout = P->out_channels;
    const int64_t rows = P->batch * OH, blocks = (cout + OCB - 1) / OCB, jobs = rows * blocks;
    const double flops = 2.0 * (double)rows * (double)OW * (double)cout *
                         (double)(P->filter_height * P->filter_width * P->in_channels);
    int nt = gs_threads_for(flops, GS_DIRECT_MIN_FLOPS_PER_THREAD);
    if (nt > jobs) nt = (int)(jobs > 0 ? jobs : 1);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t job = 0; job < jobs; ++job) {
        const int64_t r = job / blocks, oc0 = (job % blocks) * OCB;
        const int64_t n = r / OH, oh = r % OH;
        const float *img = input + n * P->in_height * P->in_width * P->in_channels;
        float *out = output + r * OW * cout;
        switch ((cout - oc0 >= OCB ? OCB : cout - oc0) / 16) {
        case 4: row(img, filter, out, P, oh, oc0, 4); break;
        case 3: row(img, filter, out, P, oh, oc0, 3); break;
        case 2: row(img, filter, out, P, oh, oc0, 2); break;
        default: row(img, filter, out, P, oh, oc0, 1); break;
        }
    }
    return GRAPHSWAP_OK;
}
