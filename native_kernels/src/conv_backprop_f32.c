/*
 * conv_backprop_f32.c -- the input gradient of a convolution (graphswap_conv2d_backprop_input_f32):
 * what TensorFlow's Conv2DBackpropInput computes, and so a Conv2DTranspose.
 *
 * Per image, one GEMM of the image's pixels by every tap of the filter, then a scatter-add of each
 * tap's products into the positions it reaches (col2im):
 *     Y[p, (fh, fw, ic)] = sum_oc dy[p, oc] * filter[fh, fw, ic, oc]       (OpenBLAS sgemm, B^T)
 *     dx[n, oh * sh - pt + fh * dh, ow * sw - pl + fw * dw, ic] += Y[(oh, ow), (fh, fw, ic)]
 * Only the products of real values: no inserted zeros, no zero weights padding a window (a
 * stride-2 3x3 transposed convolution as one convolution of its merged sub-pixel phases pays 16
 * products where this pays 9).  Rows of dy are taken in blocks whose Y stays in ~1 MiB; images
 * are spread over the OpenMP team (each image's scatter-adds stay on one thread: no races), the
 * additions into each dx element in the same order on every path.  On the avx512 path the same
 * sums are computed output pixel by output pixel (conv_backprop_avx512.c: no products matrix,
 * which for a 7x7 layer of 128 filters is 49 x 128 floats per input pixel), except where
 * OpenBLAS would have taken its small-matrix kernel (another order of additions).
 */
#include <limits.h>
#include <math.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <cblas.h>

#include "internal.h"

#define FN "graphswap_conv2d_backprop_input_f32"
#define GS_BACKPROP_BLOCK_FLOATS (256 * 1024) /* Y of one block of dy rows */
#define GS_BACKPROP_MIN_FLOPS_PER_THREAD 4.0e6

void gs_scatter_taps_f32(const graphswap_conv2d_params *P, const float *y, int64_t row0, int64_t rows,
                         float *dx_image)
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
                    float *restrict d = dx_image + (ih * IW + iw) * C;
                    const float *restrict s = yp + (fh * FW + fw) * C;
                    for (int64_t c = 0; c < C; ++c) d[c] += s[c];
                }
            }
        }
    }
}

GRAPHSWAP_EXPORT int32_t graphswap_conv2d_backprop_input_f32(const float *dy, const float *filter,
                                                             float *dx, const graphswap_conv2d_params *params)
{
    int32_t rc = gs_isa_ready(FN);
    if (rc != GRAPHSWAP_OK) return rc;
    gs_conv_geo G;
    rc = gs_conv_validate(FN, params, &G);
    if (rc != GRAPHSWAP_OK) return rc;
    const graphswap_conv2d_params P = *params;
    if (P.groups != 1) return gs_fail(GRAPHSWAP_ERR_UNSUPPORTED, FN ": groups must be 1, got %lld", (long long)P.groups);
    const int64_t image_in = P.in_height * P.in_width * P.in_channels;
    const int64_t image_out = P.out_height * P.out_width * P.out_channels;
    const int64_t N = P.filter_height * P.filter_width * P.in_channels, K = P.out_channels;
    if ((P.batch * image_in > 0 && !dx) || (P.batch * image_out > 0 && !dy) || (N * K > 0 && !filter))
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, FN ": a buffer is NULL");
    if (P.batch * image_in == 0) return GRAPHSWAP_OK;
    if (N == 0 || K == 0 || image_out == 0) {
        memset(dx, 0, (size_t)(P.batch * image_in) * sizeof(float));
        return GRAPHSWAP_OK;
    }
    const int64_t row_floats = P.out_width * N;
    int64_t block = GS_BACKPROP_BLOCK_FLOATS / (row_floats > 0 ? row_floats : 1);
    block = block < 1 ? 1 : (block > P.out_height ? P.out_height : block);
    /* OpenBLAS (SkylakeX kernels) multiplies a GEMM of M * N <= 1200 (K >= 32, M N K <= 1e6) by
     * its small-matrix kernel, whose sums run in another order: those stay GEMMs (tiny anyway) */
    const int small_gemm = K >= 32 && block * P.out_width * N <= 1200 &&
                           (double)(block * P.out_width) * (double)N * (double)K <= 1e6;
    /* avx512: output pixel by output pixel (conv_backprop_avx512.c), the same bits */
    if (!small_gemm && gs_isa() == GS_ISA_AVX512 && gs_backprop_direct_fits(&P)) {
        const int64_t taps = P.filter_height * P.filter_width;
        float *wt = gs_alloc(gs_backprop_packed_floats(taps, K, P.in_channels) * (int64_t)sizeof(float));
        if (!wt) return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, FN ": cannot allocate the packed filter");
        gs_backprop_pack_avx512(filter, taps, K, P.in_channels, 1, wt);
        /* finite weights: dy padded with zeros, every pixel in full tiles (0 * w adds an exact 0) */
        int finite = 1;
        for (int64_t i = 0; i < N * K; ++i) finite &= isfinite(filter[i]) != 0;
        const int64_t pad = finite ? gs_backprop_pad(&P) : 0;
        const int64_t padded_row = (P.out_width + 2 * pad) * K;
        float *dyp = pad ? gs_alloc(P.batch * P.out_height * padded_row * (int64_t)sizeof(float)) : NULL;
        if (pad && !dyp) {
            gs_free(wt);
            return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, FN ": cannot allocate the padded input");
        }
        if (dyp) gs_backprop_pad_dy(&P, dy, pad, dyp);
        const float *src = dyp ? dyp : dy;
        const int64_t src_image = dyp ? P.out_height * padded_row : image_out;
        const double work = 2.0 * (double)P.batch * (double)(P.out_height * P.out_width) * (double)N * (double)K;
        const int64_t rows = P.batch * P.in_height, row_out = P.in_width * P.in_channels;
        const int threads = gs_threads_for(work, GS_BACKPROP_MIN_FLOPS_PER_THREAD);
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
        for (int64_t r = 0; r < rows; ++r)
            gs_backprop_row_avx512(&P, src + (r / P.in_height) * src_image, pad, wt, r % P.in_height, 1, 0,
                                   dx + r * row_out, NULL);
        gs_free(wt), gs_free(dyp);
        return GRAPHSWAP_OK;
    }
    memset(dx, 0, (size_t)(P.batch * image_in) * sizeof(float));
    if (block * P.out_width > INT_MAX || N > INT_MAX || K > INT_MAX)
        return gs_fail(GRAPHSWAP_ERR_OVERFLOW, FN ": a GEMM dimension exceeds int32");
    const double flops = 2.0 * (double)P.batch * (double)(P.out_height * P.out_width) * (double)N * (double)K;
    int nt = gs_threads_for(flops, GS_BACKPROP_MIN_FLOPS_PER_THREAD);
    if (nt > P.batch) nt = (int)P.batch;
    int failed = 0;
#pragma omp parallel num_threads(nt) if (nt > 1) reduction(| : failed)
    {
        float *y = gs_alloc(block * row_floats * (int64_t)sizeof(float));
        if (!y) failed = 1;
#pragma omp for schedule(static)
        for (int64_t n = 0; n < P.batch; ++n) {
            if (!y) continue;
            for (int64_t row0 = 0; row0 < P.out_height; row0 += block) {
                const int64_t rows = row0 + block <= P.out_height ? block : P.out_height - row0;
                scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)(rows * P.out_width),
                                  (blasint)N, (blasint)K, 1.0f, dy + n * image_out + row0 * P.out_width * K,
                                  (blasint)K, filter, (blasint)K, 0.0f, y, (blasint)N);
                gs_scatter_taps_f32(&P, y, row0, rows, dx + n * image_in);
            }
        }
        gs_free(y);
    }
    if (failed) return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, FN ": cannot allocate %lld floats of products",
                               (long long)(block * row_floats));
    return GRAPHSWAP_OK;
}
