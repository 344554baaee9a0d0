/*
 * lut_conv_backprop.c -- a factored table's transposed convolution as the input gradient of the
 * forward convolution (graphswap_lut_conv2d_backprop_input_f32), the products of real values only.
 *
 * The spec (graphswap/kernels/quantized.py) defines a table-driven Conv2DTranspose as the quantized
 * convolution of the zero-inserted, padded input with the flipped filter.  Where the table factors
 * (T[a][b] = f(a) g(b)) and its row of the activation zero point z is exact (T[z][q] == z q
 * unsigned, T[0][q] == 0 signed: the inserted zeros' and the padding's products then cancel their
 * zero-point terms), with sign-magnitude or symmetric weights, that sum is
 *     c = sum over the real taps of (f(qa) - f(z)) * sigma g(m)
 * - the mapped input (gs_quantize_map, shifted by f(z)) times the mapped weights, scattered as
 * conv_backprop_f32.c does: per image one GEMM by every tap (over runs of input channels whose
 * float32 sums stay exact integers), the runs and the taps added in float32 where every output's
 * whole sum stays exact there too, else into float64, where integer sums below 2^53 are exact; then y = float32((s_a s_j) c) (+ bias), NaN where a non-finite input
 * reaches or the channel has a non-finite weight.  The zero-inserted convolution's sums, bit for
 * bit (tests/test_transpose_subpixel.py against tests/reference.py).  On the avx512 path, where the
 * input channels fit one exact run, conv_backprop_avx512.c computes the same sums output pixel by
 * output pixel (tests/test_conv_backprop_direct.py).  Anything else is
 * GRAPHSWAP_ERR_UNSUPPORTED (graphswap routes only these calls here).
 */
#include <math.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "lut_internal.h"

#define FN "graphswap_lut_conv2d_backprop_input_f32"
#define GS_LUT_BACKPROP_BLOCK_FLOATS (256 * 1024)

/* y (rows x OW pixels, taps x C columns) of dy rows row0.. added into the image's float64 sums */
static void scatter_rows64(const graphswap_conv2d_params *P, const float *y, int64_t row0, int64_t rows,
                           double *dx)
{
    const int64_t IH = P->in_height, IW = P->in_width, C = P->in_channels, FH = P->filter_height,
                  FW = P->filter_width, OW = P->out_width, N = FH * FW * C;
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t oh = row0 + r;
        for (int64_t ow = 0; ow < OW; ++ow) {
            const float *yp = y + (r * OW + ow) * N;
            for (int64_t fh = 0; fh < FH; ++fh) {
                const int64_t ih = oh * P->stride_height - P->pad_top + fh * P->dilation_height;
                if (ih < 0 || ih >= IH) continue;
                for (int64_t fw = 0; fw < FW; ++fw) {
                    const int64_t iw = ow * P->stride_width - P->pad_left + fw * P->dilation_width;
                    if (iw < 0 || iw >= IW) continue;
                    double *restrict d = dx + (ih * IW + iw) * C;
                    const float *restrict s = yp + (fh * FW + fw) * C;
                    for (int64_t c = 0; c < C; ++c) d[c] += (double)s[c];
                }
            }
        }
    }
}

/* NaN at every output a non-finite input pixel of image n reaches (all channels) */
static void poison(const graphswap_conv2d_params *P, const float *dy, float *dx)
{
    const int64_t IH = P->in_height, IW = P->in_width, C = P->in_channels, K = P->out_channels;
    for (int64_t oh = 0; oh < P->out_height; ++oh)
        for (int64_t ow = 0; ow < P->out_width; ++ow) {
            int bad = 0;
            for (int64_t k = 0; k < K; ++k) bad |= !gs_finite(dy[(oh * P->out_width + ow) * K + k]);
            if (!bad) continue;
            for (int64_t fh = 0; fh < P->filter_height; ++fh) {
                const int64_t ih = oh * P->stride_height - P->pad_top + fh * P->dilation_height;
                if (ih < 0 || ih >= IH) continue;
                for (int64_t fw = 0; fw < P->filter_width; ++fw) {
                    const int64_t iw = ow * P->stride_width - P->pad_left + fw * P->dilation_width;
                    if (iw < 0 || iw >= IW) continue;
                    for (int64_t c = 0; c < C; ++c) dx[(ih * IW + iw) * C + c] = NAN;
                }
            }
        }
}

/* the avx512 direct kernel over (image, dx row) pairs, then the row's epilogue; b holds the mapped
 * weights as K x (taps, C) */
static int32_t direct(const graphswap_conv2d_params *P, const float *dy, const float *bias, float *dx,
                      const float *b, const gs_wquant *w, const double *sasb, int bad, const float *mapped,
                      int64_t group, int whole)
{
    const int64_t C = P->in_channels, K = P->out_channels, taps = P->filter_height * P->filter_width;
    const int64_t IW = P->in_width, row_out = IW * C, image_dy = P->out_height * P->out_width * K;
    float *wt = gs_alloc(gs_backprop_packed_floats(taps, K, C) * (int64_t)sizeof(float));
    if (!wt) return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, FN ": cannot allocate the packed filter");
    /* b[k, (tap, c)] -> the (tap, k, c) source the packing reads with k_inner = 0 */
    float *tkc = gs_alloc(taps * K * C * (int64_t)sizeof(float));
    if (!tkc) {
        gs_free(wt);
        return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, FN ": cannot allocate the packed filter");
    }
    for (int64_t tp = 0; tp < taps; ++tp)
        for (int64_t k = 0; k < K; ++k)
            memcpy(tkc + (tp * K + k) * C, b + k * taps * C + tp * C, (size_t)C * sizeof(float));
    gs_backprop_pack_avx512(tkc, taps, K, C, 0, wt);
    gs_free(tkc);
    /* the mapped operands are finite: dy padded with zeros, every pixel in full tiles */
    const int64_t pad = gs_backprop_pad(P), padded_image = P->out_height * (P->out_width + 2 * pad) * K;
    float *dyp = gs_alloc(P->batch * padded_image * (int64_t)sizeof(float));
    if (!dyp) {
        gs_free(wt);
        return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, FN ": cannot allocate the padded input");
    }
    gs_backprop_pad_dy(P, mapped, pad, dyp);
    const int64_t rows = P->batch * P->in_height;
    const int nt = gs_threads_for(2.0 * (double)P->batch * (double)image_dy * (double)(taps * C), 4.0e6);
    int failed = 0;
#pragma omp parallel num_threads(nt) if (nt > 1) reduction(| : failed)
    {
        double *row64 = whole ? NULL : gs_alloc(row_out * 8);
        if (!whole && !row64) failed = 1;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            if (!whole && !row64) continue;
            float *out = dx + r * row_out;
            if (row64) memset(row64, 0, (size_t)row_out * 8);
            gs_backprop_row_avx512(P, dyp + (r / P->in_height) * padded_image, pad, wt, r % P->in_height, 0,
                                   group, out, row64);
            for (int64_t q = 0; q < IW; ++q)
                for (int64_t c = 0; c < C; ++c) {
                    const double total = row64 ? row64[q * C + c] : (double)out[q * C + c];
                    const float v = (float)(sasb[c] * total);
                    out[q * C + c] = w->bad[c] ? NAN : (bias ? v + bias[c] : v);
                }
        }
        gs_free(row64);
    }
    gs_free(wt), gs_free(dyp);
    if (failed) return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, FN ": cannot allocate the products");
    if (bad)
        for (int64_t n = 0; n < P->batch; ++n) poison(P, dy + n * image_dy, dx + n * P->in_height * row_out);
    return GRAPHSWAP_OK;
}

GRAPHSWAP_EXPORT int32_t graphswap_lut_conv2d_backprop_input_f32(const float *dy, const float *filter,
                                                                 const float *bias, float *dx,
                                                                 const int32_t *table,
                                                                 const graphswap_lut_quant *quant,
                                                                 const graphswap_conv2d_params *params)
{
    int32_t rc = gs_isa_ready(FN);
    gs_conv_geo G;
    gs_qparams qa;
    if (rc == GRAPHSWAP_OK) rc = gs_conv_validate(FN, params, &G);
    if (rc == GRAPHSWAP_OK) rc = gs_quant_check(FN, quant, &qa);
    if (rc != GRAPHSWAP_OK) return rc;
    const graphswap_conv2d_params P = *params;
    /* forward convolution: dx is its input (C = in_channels: the transposed convolution's
     * filters), dy its output (K = out_channels: the transposed convolution's input channels) */
    const int64_t C = P.in_channels, K = P.out_channels, taps = P.filter_height * P.filter_width;
    const int64_t image_in = P.in_height * P.in_width * C, pixels_out = P.out_height * P.out_width;
    const int64_t n_dy = P.batch * pixels_out * K;
    const int asymmetric = !qa.weights_signed && quant->weight_encoding != GRAPHSWAP_WEIGHTS_SIGN_MAGNITUDE;
    if (P.groups != 1 || asymmetric || qa.levels != 0 ||
        gs_weight_bits(quant->weight_bits) != 8)
        return gs_fail(GRAPHSWAP_ERR_UNSUPPORTED, FN ": only ungrouped 8-bit sign-magnitude or symmetric schemes");
    if ((n_dy > 0 && !dy) || (P.batch * image_in > 0 && !dx) || !table || (taps * C * K > 0 && !filter))
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, FN ": a buffer is NULL");
    float lo = INFINITY, hi = -INFINITY;
    int any_bad = 0;
    if (quant->activation_mode == GRAPHSWAP_QUANT_DYNAMIC || quant->observed_range)
        gs_range_f32(dy, n_dy, &lo, &hi, &any_bad);
    if (quant->observed_range) quant->observed_range[0] = lo, quant->observed_range[1] = hi;
    if (quant->activation_mode == GRAPHSWAP_QUANT_DYNAMIC) qa = gs_qparams_activation(&qa, lo, hi);
    if (P.batch * image_in == 0) return GRAPHSWAP_OK;

    gs_lut_table *t = gs_lut_table_acquire(table);
    if (!t) return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, FN ": cannot allocate the prepared table");
    /* the zero point's row must be exact (module comment) and the table factored */
    int exact_row = 1;
    for (int q = 0; q < 256; ++q)
        exact_row &= qa.is_signed ? t->table[q] == 0 : t->table[(qa.zero << 8) | q] == qa.zero * q;
    int64_t run = K; /* input channels per float32 GEMM run whose sums stay exact integers */
    while (run > 1 && !gs_factored_float_fits(t, run, qa.zero)) run = (run + 1) / 2;
    /* whether every output's whole sum (at most ceil(FH / sh) ceil(FW / sw) taps of K channels)
     * stays exact in float32 too: then the scatter adds in float32, else in float64 */
    const int64_t reach = ((P.filter_height + P.stride_height - 1) / P.stride_height) *
                          ((P.filter_width + P.stride_width - 1) / P.stride_width);
    const int whole_fits = run == K && gs_factored_float_fits(t, reach * K, qa.zero) &&
                           P.dilation_height == 1 && P.dilation_width == 1;
    if (!exact_row || !gs_factored_float_fits(t, run, qa.zero)) {
        gs_lut_table_release(t);
        return gs_fail(GRAPHSWAP_ERR_UNSUPPORTED, FN ": the table does not factor, or its zero-point row is not exact");
    }
    /* weights: per transposed-convolution output channel c, over (fh, fw, k) -> K2 x C codes */
    const int sm = quant->weight_encoding == GRAPHSWAP_WEIGHTS_SIGN_MAGNITUDE;
    const int per_channel = quant->weight_mode == GRAPHSWAP_QUANT_PER_CHANNEL;
    const int64_t K2 = taps * K, N = taps * C;
    float *wt = gs_alloc(K2 * C * (int64_t)sizeof(float)), *g = gs_alloc(K2 * C * (int64_t)sizeof(float));
    float *b = gs_alloc(K * N * (int64_t)sizeof(float)), *mapped = gs_alloc(n_dy * (int64_t)sizeof(float));
    double *gsum = gs_alloc(C * 8), *sasb = gs_alloc(C * 8);
    gs_wquant w;
    memset(&w, 0, sizeof w);
    rc = (!wt || !g || !b || (n_dy > 0 && !mapped) || !gsum || !sasb)
             ? gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, FN ": cannot allocate scratch")
             : GRAPHSWAP_OK;
    if (rc == GRAPHSWAP_OK) {
        for (int64_t tp = 0; tp < taps; ++tp) /* (tap, c, k) -> rows (tap, k), column c */
            for (int64_t c = 0; c < C; ++c)
                for (int64_t k = 0; k < K; ++k) wt[(tp * K + k) * C + c] = filter[(tp * C + c) * K + k];
        rc = gs_wquant_prepare(FN, wt, K2, C, sm, qa.weights_signed, per_channel, 8, &w);
    }
    int bad = 0;
    if (rc == GRAPHSWAP_OK) {
        gs_factored_filter(t, &w, K2, C, sm, g, gsum);
        for (int64_t tp = 0; tp < taps; ++tp) /* B[k, (tap, c)] = sigma g of weight (tap, c, k) */
            for (int64_t k = 0; k < K; ++k)
                for (int64_t c = 0; c < C; ++c) b[k * N + tp * C + c] = g[(tp * K + k) * C + c];
        for (int64_t c = 0; c < C; ++c) sasb[c] = qa.scale * w.scale[c];
        bad = gs_quantize_map(t, dy, n_dy, &qa, qa.zero, mapped, NULL);
    }
    /* avx512, one exact run over the input channels: output pixel by output pixel
     * (conv_backprop_avx512.c), the taps' runs in float32 groups that stay exact */
    int64_t group = reach;
    while (group > 1 && !gs_factored_float_fits(t, group * K, qa.zero)) --group;
    if (rc == GRAPHSWAP_OK && run == K && gs_factored_float_fits(t, K, qa.zero) &&
        gs_isa() == GS_ISA_AVX512 && gs_backprop_direct_fits(&P)) {
        rc = direct(&P, dy, bias, dx, b, &w, sasb, bad, mapped, group, group >= reach);
        goto done;
    }
    const int64_t row_floats = P.out_width * N;
    int64_t block = GS_LUT_BACKPROP_BLOCK_FLOATS / (row_floats > 0 ? row_floats : 1);
    block = block < 1 ? 1 : (block > P.out_height ? P.out_height : block);
    const double flops = 2.0 * (double)n_dy * (double)N;
    int nt = gs_threads_for(flops, 4.0e6);
    if (nt > P.batch) nt = (int)P.batch;
    int failed = 0;
    if (rc == GRAPHSWAP_OK) {
#pragma omp parallel num_threads(nt) if (nt > 1) reduction(| : failed)
        {
            float *y = gs_alloc(block * row_floats * (int64_t)sizeof(float));
            double *sum = whole_fits ? NULL : gs_alloc(image_in * 8);
            if (!y || (!whole_fits && !sum)) failed = 1;
#pragma omp for schedule(static)
            for (int64_t n = 0; n < P.batch; ++n) {
                if (!y || (!whole_fits && !sum)) continue;
                float *out = dx + n * image_in;
                if (whole_fits) memset(out, 0, (size_t)image_in * sizeof(float));
                else memset(sum, 0, (size_t)image_in * 8);
                const float *img = mapped + n * pixels_out * K;
                for (int64_t row0 = 0; row0 < P.out_height; row0 += block) {
                    const int64_t rows = row0 + block <= P.out_height ? block : P.out_height - row0;
                    for (int64_t k0 = 0; k0 < K; k0 += run) {
                        const int64_t len = k0 + run <= K ? run : K - k0;
                        gs_sgemm_rows(rows * P.out_width, N, len, img + row0 * P.out_width * K + k0, K,
                                      b + k0 * N, N, y, N, 0);
                        if (whole_fits) gs_scatter_taps_f32(&P, y, row0, rows, out);
                        else scatter_rows64(&P, y, row0, rows, sum);
                    }
                }
                for (int64_t q = 0; q < image_in / (C > 0 ? C : 1); ++q)
                    for (int64_t c = 0; c < C; ++c) {
                        const double total = whole_fits ? (double)out[q * C + c] : sum[q * C + c];
                        const float v = (float)(sasb[c] * total);
                        out[q * C + c] = w.bad[c] ? NAN : (bias ? v + bias[c] : v);
                    }
                if (bad) poison(&P, dy + n * pixels_out * K, out);
            }
            gs_free(y), gs_free(sum);
        }
        if (failed) rc = gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, FN ": cannot allocate the products");
    }
done:
    gs_free(wt), gs_free(g), gs_free(b), gs_free(mapped), gs_free(gsum), gs_free(sasb);
    gs_wquant_free(&w);
    gs_lut_table_release(t);
    return rc;
}
