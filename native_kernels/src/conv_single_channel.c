/*
 * conv_single_channel.c -- direct float32 convolution for one input channel (a grayscale image's
 * first layer: LeNet-5's 32x32x1 -> 28x28x6), part of graphswap_conv2d_f32.
 *
 * As a GEMM this is a product with a reduction of only filter_h * filter_w terms and a handful of
 * output columns, which neither OpenBLAS's tiles nor the hand-written GEMM use well (22 GF/s on
 * LeNet-5's first conv, against TensorFlow's fused oneDNN conv at about twice that).  Here adjacent
 * output pixels of a row are one vector (16 with avx512, 8 with avx2, 4 on the baseline's SSE2):
 * each tap is one unaligned load of that many inputs from
 * a zero-padded copy of the input row, multiplied by 8 output channels' weights (broadcast) into 8
 * accumulators held in registers; the vector x 8 results are then interleaved into the NHWC output.
 * Taps are summed in (fh, fw) order, the same on every path (no FMA contraction), so scalar, avx2
 * and avx512 give the same bits.  Used for groups == 1, in_channels == 1, stride_width == 1 (any
 * padding, height stride and dilation).
 */
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "internal.h"

#define FN "graphswap_conv2d_f32"
#define OCB 8  /* output channels per register block */
#define GS_SINGLE_MIN_FLOPS_PER_THREAD 4.0e6
#define MAX_VL 16

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

int gs_conv_single_channel_fits(const graphswap_conv2d_params *P)
{
    return P->groups == 1 && P->in_channels == 1 && P->stride_width == 1;
}

#define ROWS_ARGS const float *input, const float *wpad, float *output, \
                  const graphswap_conv2d_params *P, int64_t lo, int64_t hi, float *line, int64_t lw

/* rows_NAME: output rows [lo, hi) (row = n * out_height + oh) with VLEN-float vectors (the ISA's
 * own width, so GCC's vector extension maps each vector op to one instruction).  `line`:
 * filter_height zero-padded input rows of `lw` floats; `wpad`: the filter as
 * [tap][channel block][OCB], zero beyond out_channels. */
#define DEFINE_ROWS(NAME, VLEN, ATTR)                                                                   \
    typedef float NAME##_v __attribute__((vector_size((VLEN) * sizeof(float))));                       \
    typedef float NAME##_vu __attribute__((vector_size((VLEN) * sizeof(float)), aligned(4)));          \
    ATTR static void NAME(ROWS_ARGS)                                                                   \
    {                                                                                                  \
        const int64_t H = P->in_height, W = P->in_width, OH = P->out_height, OW = P->out_width;        \
        const int64_t FH = P->filter_height, FW = P->filter_width, cout = P->out_channels;             \
        const int64_t dw = P->dilation_width, blocks = (cout + OCB - 1) / OCB;                         \
        for (int64_t row = lo; row < hi; ++row) {                                                      \
            const int64_t n = row / OH, oh = row % OH;                                                 \
            for (int64_t fh = 0; fh < FH; ++fh) {                                                      \
                float *l = line + fh * lw;                                                             \
                const int64_t ih = oh * P->stride_height - P->pad_top + fh * P->dilation_height;       \
                memset(l, 0, (size_t)lw * sizeof(float));                                              \
                if (ih >= 0 && ih < H)                                                                 \
                    memcpy(l + P->pad_left, input + (n * H + ih) * W, (size_t)W * sizeof(float));      \
            }                                                                                          \
            for (int64_t ow0 = 0; ow0 < OW; ow0 += (VLEN)) {                                           \
                const int64_t valid = min64((VLEN), OW - ow0);                                         \
                for (int64_t b = 0; b < blocks; ++b) {                                                 \
                    NAME##_v a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0},     \
                             a7 = {0};                                                                 \
                    for (int64_t fh = 0; fh < FH; ++fh) {                                              \
                        const float *l = line + fh * lw + ow0;                                         \
                        const float *w = wpad + (fh * FW * blocks + b) * OCB;                          \
                        for (int64_t fw = 0; fw < FW; ++fw, w += blocks * OCB) {                       \
                            const NAME##_v x = *(const NAME##_vu *)(l + fw * dw);                      \
                            a0 += x * w[0]; a1 += x * w[1]; a2 += x * w[2]; a3 += x * w[3];            \
                            a4 += x * w[4]; a5 += x * w[5]; a6 += x * w[6]; a7 += x * w[7];            \
                        }                                                                              \
                    }                                                                                  \
                    float tmp[OCB][MAX_VL];                                                            \
                    *(NAME##_vu *)tmp[0] = a0; *(NAME##_vu *)tmp[1] = a1;                              \
                    *(NAME##_vu *)tmp[2] = a2; *(NAME##_vu *)tmp[3] = a3;                              \
                    *(NAME##_vu *)tmp[4] = a4; *(NAME##_vu *)tmp[5] = a5;                              \
                    *(NAME##_vu *)tmp[6] = a6; *(NAME##_vu *)tmp[7] = a7;                              \
                    const int64_t oc0 = b * OCB, ocn = min64(OCB, cout - oc0);                         \
                    float *o = output + (row * OW + ow0) * cout + oc0;                                 \
                    for (int64_t p = 0; p < valid; ++p)                                                \
                        for (int64_t j = 0; j < ocn; ++j) o[p * cout + j] = tmp[j][p];                 \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
    }

DEFINE_ROWS(rows_avx512, 16, __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))))
DEFINE_ROWS(rows_avx2, 8, __attribute__((target("avx2"))))
DEFINE_ROWS(rows_scalar, 4, )

typedef void (*rows_fn_t)(ROWS_ARGS);

/* The path's row function and its vector length (the padded rows depend on it), chosen together. */
static rows_fn_t rows_for_isa(int64_t *vector_length)
{
    const gs_isa_level isa = gs_isa();
    *vector_length = isa >= GS_ISA_AVX512 ? 16 : isa >= GS_ISA_AVX2 ? 8 : 4;
    return isa >= GS_ISA_AVX512 ? rows_avx512 : isa >= GS_ISA_AVX2 ? rows_avx2 : rows_scalar;
}

int32_t gs_conv_single_channel(const float *input, const float *filter, float *output,
                               const graphswap_conv2d_params *P)
{
    const int64_t FH = P->filter_height, FW = P->filter_width, cout = P->out_channels;
    const int64_t blocks = (cout + OCB - 1) / OCB, rows = P->batch * P->out_height;
    int64_t vl;
    const rows_fn_t rows_fn = rows_for_isa(&vl);
    const int64_t chunks = (P->out_width + vl - 1) / vl;
    /* a padded row covers every vector load: chunks * vl pixels plus the filter's reach */
    const int64_t lw = chunks * vl + (FW - 1) * P->dilation_width;
    float *wpad = (float *)gs_alloc(FH * FW * blocks * OCB * (int64_t)sizeof(float));
    if (!wpad) return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, FN ": cannot allocate the padded filter");
    memset(wpad, 0, (size_t)(FH * FW * blocks * OCB) * sizeof(float));
    for (int64_t tap = 0; tap < FH * FW; ++tap)
        for (int64_t oc = 0; oc < cout; ++oc)
            wpad[(tap * blocks + oc / OCB) * OCB + oc % OCB] = filter[tap * cout + oc];

    const double flops = 2.0 * (double)rows * (double)P->out_width * (double)(FH * FW) * (double)cout;
    int nt = gs_threads_for(flops, GS_SINGLE_MIN_FLOPS_PER_THREAD);
    if (nt > rows) nt = (int)(rows > 0 ? rows : 1);
    int32_t rc = GRAPHSWAP_OK;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int t = 0, team = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        team = omp_get_num_threads();
#endif
        float *line = (float *)gs_alloc(FH * lw * (int64_t)sizeof(float));
        if (!line) {
#pragma omp atomic write
            rc = GRAPHSWAP_ERR_OUT_OF_MEMORY;
        } else {
            const int64_t per = (rows + team - 1) / team, lo = min64(rows, t * per);
            rows_fn(input, wpad, output, P, lo, min64(rows, lo + per), line, lw);
        }
        gs_free(line);
    }
    gs_free(wpad);
    if (rc != GRAPHSWAP_OK) return gs_fail(rc, FN ": cannot allocate the padded input rows");
    return GRAPHSWAP_OK;
}
