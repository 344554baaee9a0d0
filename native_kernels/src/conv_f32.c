/*
 * conv_f32.c -- exact float32 2-D convolution (graphswap_conv2d_f32), NHWC input, HWIO filter.
 *
 * Per group, one GEMM  out[pixel, oc] = sum_k patch[pixel, k] * filter[k, oc]  with
 * k = (fh*filter_w + fw)*cin_g + ic (the HWIO filter is already that K x out_channels matrix).
 * Two ways to run it:
 *   BLAS  tiles of output pixels: each tile's patches are packed (im2col) into a per-thread buffer
 *         of at most ~256 KiB and multiplied by OpenBLAS's single-threaded sgemm straight into the
 *         output rows; tiles are spread dynamically over the OpenMP team.  1x1 stride-1 unpadded
 *         convolutions multiply the input itself.  Scratch is bounded whatever the batch.
 *   OWN   the hand-written AVX2 GEMM of gemm_f32.c with implicit im2col (patches expanded while
 *         packing register panels, transposed for narrow outputs).  It is kept because it beats
 *         sgemm when a group has few output channels (LeNet-5's 6 and 16: sgemm's tiles are
 *         16-24 wide; benchmarks/bench_core.py, LeNet conv rows); used only on the avx2 /
 *         avx512 paths.
 *   DEPTHWISE  one input channel per group (DepthwiseConv2D, groups = in_channels): a direct
 *         loop, vectorised across the channels of a pixel (on the avx512 path, with a depth
 *         multiplier of 1: conv_depthwise_avx512.c, 4 pixels a block) -- as a GEMM each group would be a
 *         single-column product (measured 7x the float MobileNetV2 through sgemm).  Taps in the
 *         padding are left out (they would add 0 * w).
 *   SINGLE CHANNEL  one input channel, groups == 1, stride_width == 1 (a grayscale image's first
 *         layer): a direct loop vectorised across 16 output pixels (conv_single_channel.c).
 *   DIRECT (avx512 path)  unit stride, no dilation or groups, >= 16 input and a multiple of 16
 *         output channels, more than one tap, a filter slice that stays in L2: the input read in
 *         place by register tiles of 6 pixels x 64 channels (conv_direct_avx512.c) -- im2col +
 *         sgemm copies each patch twice before multiplying (8x56x56x64 3x3: 0.76x the time).
 *   NARROW (avx512 path)  at most 4 output channels, unit stride, no dilation or groups, >= 8 input
 *         channels: the input rows transposed once, 64 pixels x the outputs in registers
 *         (conv_narrow_avx512.c), OWN's sums bit for bit without its per-pixel patch gathers.
 * GRAPHSWAP_CONV_F32=blas|own forces one of the GEMM ways, =direct the direct AVX-512 convolution
 * where it applies (benchmarks, tests).
 */
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "internal.h"

#define FN "graphswap_conv2d_f32"
#define GS_CONV_TILE_BYTES (512 << 10) /* patch buffer per thread */
#define GS_CONV_MIN_FLOPS_PER_THREAD 4.0e6
#define GS_OWN_MAX_COUT 24             /* hand-written kernel for groups with at most this many outputs */

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Patches of output pixels [p0, p0 + rows) of group g into dst (rows x taps, row-major). */
static void im2col_f32(const graphswap_conv2d_params *P, const gs_conv_geo *G, const float *input,
                       int64_t g, int64_t p0, int64_t rows, float *restrict dst)
{
    const int64_t OW = P->out_width, OH = P->out_height, H = P->in_height, W = P->in_width;
    const int64_t C = P->in_channels, cg = G->cin_g, FH = P->filter_height, FW = P->filter_width;
    const int merge = P->dilation_width == 1 && cg == C; /* adjacent taps are adjacent in memory */
    int64_t pix = p0;
    int64_t ow = pix % OW, oh = (pix / OW) % OH, n = pix / (OW * OH);
    for (int64_t r = 0; r < rows; ++r, ++pix) {
        float *d = dst + r * G->taps;
        const float *img = input + n * H * W * C + g * cg;
        const int64_t ih0 = oh * P->stride_height - P->pad_top, iw0 = ow * P->stride_width - P->pad_left;
        for (int64_t fh = 0; fh < FH; ++fh) {
            const int64_t ih = ih0 + fh * P->dilation_height;
            float *drow = d + fh * FW * cg;
            if (ih < 0 || ih >= H) {
                memset(drow, 0, (size_t)(FW * cg) * sizeof(float));
                continue;
            }
            const float *srow = img + ih * W * C;
            if (merge) {
                /* taps [lo, hi) are inside the row: one copy, zeros around it */
                int64_t lo = iw0 < 0 ? -iw0 : 0, hi = W - iw0 < FW ? W - iw0 : FW;
                if (hi < lo) hi = lo;
                if (lo > FW) lo = hi = FW;
                if (lo > 0) memset(drow, 0, (size_t)(lo * cg) * sizeof(float));
                if (hi > lo) memcpy(drow + lo * cg, srow + (iw0 + lo) * C, (size_t)((hi - lo) * cg) * sizeof(float));
                if (hi < FW) memset(drow + hi * cg, 0, (size_t)((FW - hi) * cg) * sizeof(float));
            } else {
                for (int64_t fw = 0; fw < FW; ++fw) {
                    const int64_t iw = iw0 + fw * P->dilation_width;
                    if (iw < 0 || iw >= W)
                        memset(drow + fw * cg, 0, (size_t)cg * sizeof(float));
                    else
                        memcpy(drow + fw * cg, srow + iw * C, (size_t)cg * sizeof(float));
                }
            }
        }
        if (++ow == OW) {
            ow = 0;
            if (++oh == OH) { oh = 0; ++n; }
        }
    }
}

static int32_t conv_blas(const float *input, const float *filter, float *output,
                         const graphswap_conv2d_params *P, const gs_conv_geo *G)
{
    const int64_t K = G->taps, cout = P->out_channels, cog = G->cout_g;
    const int pointwise = P->filter_height == 1 && P->filter_width == 1 && P->stride_height == 1 &&
                          P->stride_width == 1 && P->pad_top == 0 && P->pad_bottom == 0 &&
                          P->pad_left == 0 && P->pad_right == 0;
    int64_t tile = GS_CONV_TILE_BYTES / (K * (int64_t)sizeof(float));
    if (tile < 16) tile = 16;
    if (tile > 4096) tile = 4096;
    const int64_t tiles = (G->pixels + tile - 1) / tile;
    const int64_t jobs = tiles * P->groups;
    const double flops = 2.0 * (double)G->pixels * (double)K * (double)cout;
    int nt = gs_threads_for(flops, GS_CONV_MIN_FLOPS_PER_THREAD);
    if (nt > jobs) nt = (int)jobs;
    if (nt < 1) nt = 1;
    float *scratch = NULL;
    if (!pointwise) {
        scratch = (float *)gs_alloc((int64_t)nt * tile * K * (int64_t)sizeof(float));
        if (!scratch)
            return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, FN ": cannot allocate %d patch buffers of %lld floats",
                           nt, (long long)(tile * K));
    }
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
    for (int64_t job = 0; job < jobs; ++job) {
        const int64_t g = job / tiles, p0 = (job % tiles) * tile, rows = min64(tile, G->pixels - p0);
        float *c = output + p0 * cout + g * cog;
        const float *b = filter + g * cog;
        if (pointwise) {
            gs_sgemm_rows(rows, cog, K, input + p0 * P->in_channels + g * G->cin_g, P->in_channels, b,
                          cout, c, cout, 0);
        } else {
#ifdef _OPENMP
            float *patches = scratch + (int64_t)omp_get_thread_num() * tile * K;
#else
            float *patches = scratch;
#endif
            im2col_f32(P, G, input, g, p0, rows, patches);
            gs_sgemm_rows(rows, cog, K, patches, K, b, cout, c, cout, 0);
        }
    }
    gs_free(scratch);
    return GRAPHSWAP_OK;
}

/* One output row (image n, row oh) of a depthwise convolution, channels innermost.  Written once,
 * compiled for baseline x86-64 and for AVX2 (depthwise_row_avx2) so the channel loops vectorise on
 * both; the same additions in the same order either way (no contraction: -ffp-contract=off). */
static inline __attribute__((always_inline)) void depthwise_row(const float *input, const float *filter,
                                                                float *output, const graphswap_conv2d_params *P,
                                                                int64_t M, int64_t row)
{
    const int64_t H = P->in_height, W = P->in_width, C = P->in_channels, OH = P->out_height,
                  OW = P->out_width, FH = P->filter_height, FW = P->filter_width, cout = P->out_channels;
    const int64_t n = row / OH, oh = row % OH;
    const float *img = input + n * H * W * C;
    if (M == 1) {
        /* channels in blocks of 8 held in a register across the taps (one store per block, not
         * one per tap); each channel adds its taps in the same order as the loop below */
        for (int64_t ow = 0; ow < OW; ++ow) {
            float *restrict o = output + ((row * OW) + ow) * cout;
            int64_t c0 = 0;
            for (; c0 + 8 <= C; c0 += 8) {
                float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                for (int64_t fh = 0; fh < FH; ++fh) {
                    const int64_t ih = oh * P->stride_height - P->pad_top + fh * P->dilation_height;
                    if (ih < 0 || ih >= H) continue;
                    for (int64_t fw = 0; fw < FW; ++fw) {
                        const int64_t iw = ow * P->stride_width - P->pad_left + fw * P->dilation_width;
                        if (iw < 0 || iw >= W) continue;
                        const float *restrict x = img + (ih * W + iw) * C + c0;
                        const float *restrict w = filter + (fh * FW + fw) * cout + c0;
                        for (int j = 0; j < 8; ++j) acc[j] += x[j] * w[j];
                    }
                }
                for (int j = 0; j < 8; ++j) o[c0 + j] = acc[j];
            }
            if (c0 == C) continue;
            for (int64_t c = c0; c < C; ++c) o[c] = 0.0f;
            for (int64_t fh = 0; fh < FH; ++fh) {
                const int64_t ih = oh * P->stride_height - P->pad_top + fh * P->dilation_height;
                if (ih < 0 || ih >= H) continue;
                for (int64_t fw = 0; fw < FW; ++fw) {
                    const int64_t iw = ow * P->stride_width - P->pad_left + fw * P->dilation_width;
                    if (iw < 0 || iw >= W) continue;
                    const float *restrict x = img + (ih * W + iw) * C;
                    const float *restrict w = filter + (fh * FW + fw) * cout;
                    for (int64_t c = c0; c < C; ++c) o[c] += x[c] * w[c];
                }
            }
        }
        return;
    }
    for (int64_t ow = 0; ow < OW; ++ow) {
        float *restrict o = output + ((row * OW) + ow) * cout;
        for (int64_t c = 0; c < cout; ++c) o[c] = 0.0f;
        for (int64_t fh = 0; fh < FH; ++fh) {
            const int64_t ih = oh * P->stride_height - P->pad_top + fh * P->dilation_height;
            if (ih < 0 || ih >= H) continue;
            for (int64_t fw = 0; fw < FW; ++fw) {
                const int64_t iw = ow * P->stride_width - P->pad_left + fw * P->dilation_width;
                if (iw < 0 || iw >= W) continue;
                const float *restrict x = img + (ih * W + iw) * C;
                const float *restrict w = filter + (fh * FW + fw) * cout;
                if (M == 1) {
                    for (int64_t c = 0; c < C; ++c) o[c] += x[c] * w[c];
                } else {
                    for (int64_t c = 0; c < C; ++c)
                        for (int64_t j = 0; j < M; ++j) o[c * M + j] += x[c] * w[c * M + j];
                }
            }
        }
    }
}

static void depthwise_row_baseline(const float *input, const float *filter, float *output,
                                   const graphswap_conv2d_params *P, int64_t M, int64_t row)
{
    depthwise_row(input, filter, output, P, M, row);
}

__attribute__((target("avx2,fma"))) static void depthwise_row_avx2(const float *input, const float *filter,
                                                                    float *output,
                                                                    const graphswap_conv2d_params *P,
                                                                    int64_t M, int64_t row)
{
    depthwise_row(input, filter, output, P, M, row);
}

static int32_t conv_depthwise(const float *input, const float *filter, float *output,
                              const graphswap_conv2d_params *P, const gs_conv_geo *G)
{
    const int64_t rows = P->batch * P->out_height, M = G->cout_g;
    const double flops = 2.0 * (double)G->pixels * (double)(P->filter_height * P->filter_width) *
                         (double)P->out_channels;
    int nt = gs_threads_for(flops, GS_CONV_MIN_FLOPS_PER_THREAD);
    if (nt > rows) nt = (int)(rows > 0 ? rows : 1);
    const int avx2 = gs_isa() >= GS_ISA_AVX2, avx512 = gs_isa() == GS_ISA_AVX512 && M == 1;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t row = 0; row < rows; ++row) {
        if (avx512)
            gs_depthwise_row_avx512(input, filter, output, P, row);
        else if (avx2)
            depthwise_row_avx2(input, filter, output, P, M, row);
        else
            depthwise_row_baseline(input, filter, output, P, M, row);
    }
    return GRAPHSWAP_OK;
}

static int32_t conv_own(const float *input, const float *filter, float *output,
                        const graphswap_conv2d_params *P, const gs_conv_geo *G)
{
    const int pointwise = P->filter_height == 1 && P->filter_width == 1 && P->stride_height == 1 &&
                          P->stride_width == 1 && P->pad_top == 0 && P->pad_bottom == 0 &&
                          P->pad_left == 0 && P->pad_right == 0;
    const int max_threads = gs_num_threads();
    for (int64_t g = 0; g < P->groups; ++g) {
        gs_conv_src src = {
            input, P->in_height, P->in_width, P->in_channels, P->out_height, P->out_width,
            P->filter_width, G->cin_g, g * G->cin_g,
            P->stride_height, P->stride_width, P->dilation_height, P->dilation_width, P->pad_top, P->pad_left,
        };
        gs_operand A;
        if (pointwise)
            A = (gs_operand){input + g * G->cin_g, P->in_channels, 1, NULL, 0};
        else
            A = (gs_operand){NULL, 0, 0, &src, 0};
        const gs_operand B = {filter + g * G->cout_g, 1, P->out_channels, NULL, 0}; /* B(oc, k) */
        int32_t rc = gs_gemm_f32(G->pixels, G->cout_g, G->taps, &A, &B, output + g * G->cout_g,
                                 P->out_channels, 1, max_threads);
        if (rc != GRAPHSWAP_OK) return rc;
    }
    return GRAPHSWAP_OK;
}

GRAPHSWAP_EXPORT int32_t graphswap_conv2d_f32(const float *input, const float *filter, float *output,
                                              const graphswap_conv2d_params *params)
{
    int32_t rc = gs_isa_ready(FN);
    if (rc != GRAPHSWAP_OK) return rc;
    gs_conv_geo G;
    rc = gs_conv_validate(FN, params, &G);
    if (rc != GRAPHSWAP_OK) return rc;
    const graphswap_conv2d_params P = *params;

    if (G.out_elems == 0) return GRAPHSWAP_OK;
    if (!output) return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, FN ": output is NULL (%lld elements)",
                                (long long)G.out_elems);
    if (G.taps > 0) {
        if (!filter) return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, FN ": filter is NULL (%lld elements)",
                                    (long long)G.filter_elems);
        if (!input && G.in_elems > 0)
            return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, FN ": input is NULL (%lld elements)",
                           (long long)G.in_elems);
    }
    if (G.taps == 0 || G.in_elems == 0) {
        /* empty reduction, or an empty image seen only through padding: all outputs are 0 */
        memset(output, 0, (size_t)G.out_elems * sizeof(float));
        return GRAPHSWAP_OK;
    }
    const char *force = getenv("GRAPHSWAP_CONV_F32");
    if (G.cin_g == 1 && P.groups > 1 && !force) return conv_depthwise(input, filter, output, &P, &G);
    if (!force && gs_conv_single_channel_fits(&P)) return gs_conv_single_channel(input, filter, output, &P);
    if ((!force || strcmp(force, "direct") == 0) && gs_isa() == GS_ISA_AVX512 && gs_conv_direct_avx512_fits(&P))
        return gs_conv_direct_avx512(input, filter, output, &P);
    if (!force && gs_isa() == GS_ISA_AVX512 && gs_conv_narrow_avx512_fits(&P))
        return gs_conv_narrow_avx512(input, filter, output, &P, NULL, 0);
    int own = gs_isa() >= GS_ISA_AVX2 && G.cout_g <= GS_OWN_MAX_COUT;
    if (force && strcmp(force, "blas") == 0) own = 0;
    if (force && strcmp(force, "own") == 0 && gs_isa() >= GS_ISA_AVX2) own = 1;
    return own ? conv_own(input, filter, output, &P, &G) : conv_blas(input, filter, output, &P, &G);
}
