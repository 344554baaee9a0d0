/*
 * conv_depthwise_avx512.c -- one output row of a depthwise convolution (depth multiplier 1) on
 * the avx512 path: 16 channels a register, and output pixels whose windows lie inside the row
 * in blocks of 4 that share each tap's weight load.  The same products and additions in the
 * same order as conv_f32.c's depthwise_row (per channel: 0 + the taps in (fh, fw) order,
 * padding left out; mul then add, never fused), so every ISA path gives the same bits.
 */
#pragma GCC target("avx512f,avx512vl,avx2,fma")

#include <immintrin.h>

#include "internal.h"

#define PIXELS 4 /* output pixels of one block */

/* The taps of output pixel (oh, ow) that lie inside the image, in (fh, fw) order: their
 * offsets into the image and into the filter; returns how many. */
static int64_t window_taps(const graphswap_conv2d_params *P, int64_t oh, int64_t ow, int64_t *x_at,
                           int64_t *w_at)
{
    const int64_t H = P->in_height, W = P->in_width, C = P->in_channels, FH = P->filter_height,
                  FW = P->filter_width, cout = P->out_channels;
    int64_t taps = 0;
    for (int64_t fh = 0; fh < FH; ++fh) {
        const int64_t ih = oh * P->stride_height - P->pad_top + fh * P->dilation_height;
        if (ih < 0 || ih >= H) continue;
        for (int64_t fw = 0; fw < FW; ++fw) {
            const int64_t iw = ow * P->stride_width - P->pad_left + fw * P->dilation_width;
            if (iw < 0 || iw >= W) continue;
            x_at[taps] = (ih * W + iw) * C;
            w_at[taps++] = (fh * FW + fw) * cout;
        }
    }
    return taps;
}

/* channels [c0, C) of one output pixel over its `taps` window taps: blocks of 16, 8, then one
 * channel at a time */
static void pixel(const float *img, const float *filter, float *restrict o, int64_t C, int64_t taps,
                  const int64_t *x_at, const int64_t *w_at, int64_t c0)
{
    for (; c0 + 16 <= C; c0 += 16) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t t = 0; t < taps; ++t)
            acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_loadu_ps(img + x_at[t] + c0),
                                                   _mm512_loadu_ps(filter + w_at[t] + c0)));
        _mm512_storeu_ps(o + c0, acc);
    }
    for (; c0 + 8 <= C; c0 += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t t = 0; t < taps; ++t)
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(img + x_at[t] + c0),
                                                   _mm256_loadu_ps(filter + w_at[t] + c0)));
        _mm256_storeu_ps(o + c0, acc);
    }
    for (; c0 < C; ++c0) {
        float acc = 0.0f;
        for (int64_t t = 0; t < taps; ++t) acc += img[x_at[t] + c0] * filter[w_at[t] + c0];
        o[c0] = acc;
    }
}

/* PIXELS output pixels from ow whose windows lie inside the row (the taps of the first; the
 * others' image offsets step by stride_width * C): channels in blocks of 16, then one of 8;
 * returns where the blocks end */
static int64_t inner_block(const float *img, const float *filter, float *restrict o, int64_t C, int64_t cout,
                           int64_t step, int64_t taps, const int64_t *x_at, const int64_t *w_at)
{
    int64_t c0 = 0;
    for (; c0 + 16 <= C; c0 += 16) {
        __m512 acc[PIXELS];
        for (int p = 0; p < PIXELS; ++p) acc[p] = _mm512_setzero_ps();
        for (int64_t t = 0; t < taps; ++t) {
            const float *x = img + x_at[t] + c0;
            const __m512 w = _mm512_loadu_ps(filter + w_at[t] + c0);
            for (int p = 0; p < PIXELS; ++p)
                acc[p] = _mm512_add_ps(acc[p], _mm512_mul_ps(_mm512_loadu_ps(x + p * step), w));
        }
        for (int p = 0; p < PIXELS; ++p) _mm512_storeu_ps(o + p * cout + c0, acc[p]);
    }
    if (c0 + 8 <= C) { /* 8 channels left (MobileNet's first block has only 8) */
        __m256 acc[PIXELS];
        for (int p = 0; p < PIXELS; ++p) acc[p] = _mm256_setzero_ps();
        for (int64_t t = 0; t < taps; ++t) {
            const float *x = img + x_at[t] + c0;
            const __m256 w = _mm256_loadu_ps(filter + w_at[t] + c0);
            for (int p = 0; p < PIXELS; ++p)
                acc[p] = _mm256_add_ps(acc[p], _mm256_mul_ps(_mm256_loadu_ps(x + p * step), w));
        }
        for (int p = 0; p < PIXELS; ++p) _mm256_storeu_ps(o + p * cout + c0, acc[p]);
        c0 += 8;
    }
    return c0;
}

void gs_depthwise_row_avx512(const float *input, const float *filter, float *output,
                             const graphswap_conv2d_params *P, int64_t row)
{
    const int64_t H = P->in_height, W = P->in_width, C = P->in_channels, OH = P->out_height,
                  OW = P->out_width, FW = P->filter_width, cout = P->out_channels;
    const int64_t n = row / OH, oh = row % OH;
    const float *img = input + n * H * W * C;
    float *out_row = output + row * OW * cout;
    int64_t x_at[P->filter_height * FW], w_at[P->filter_height * FW];
    /* the pixels whose every tap column lies inside the row: ow * sw - pl >= 0 and
     * ow * sw - pl + (FW - 1) * dw < W */
    const int64_t sw = P->stride_width, reach = (FW - 1) * P->dilation_width;
    int64_t first = (P->pad_left + sw - 1) / sw, last = W - 1 - reach + P->pad_left;
    last = last < 0 ? -1 : last / sw; /* inclusive */
    if (last >= OW) last = OW - 1;
    for (int64_t ow = 0; ow < OW; ++ow) {
        const int64_t taps = window_taps(P, oh, ow, x_at, w_at);
        if (ow >= first && ow + PIXELS - 1 <= last) {
            const int64_t c0 = inner_block(img, filter, out_row + ow * cout, C, cout, sw * C, taps, x_at, w_at);
            for (int p = 0; p < PIXELS; ++p) {
                for (int64_t t = 0; t < taps; ++t) x_at[t] += p ? sw * C : 0;
                pixel(img, filter, out_row + (ow + p) * cout, C, taps, x_at, w_at, c0);
            }
            ow += PIXELS - 1;
            continue;
        }
        pixel(img, filter, out_row + ow * cout, C, taps, x_at, w_at, 0);
    }
}
