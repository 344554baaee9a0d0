/*
 * conv_narrow_avx512.c -- direct float32 convolution with AVX-512 for layers of at most 4 output
 * channels (an image decoder's last Conv2D: 128 channels -> RGB), part of graphswap_conv2d_f32 on
 * the avx512 path.
 *
 * gemm_f32.c runs such a layer as C^T = B^T A^T with its implicit im2col: every 16-pixel panel is
 * packed by gathering one float per pixel and k (a stride of in_channels floats), 6 x 16 tiles of
 * which 3 rows are output channels - the packing costs more than the products.  Here the input
 * rows are transposed once (channel-major rows of the padded width, a ring of filter_height rows
 * per job), so the 16 pixels of one k are one unaligned load, and 4 x 16 pixels x up to 4 output
 * channels stay in 16 accumulators.  The sums are gemm_f32.c's bit for bit: per output one FMA
 * chain from 0 over each block of KC = 256 k = (fh, fw, ic), padding taps included as 0 * w, the
 * blocks' chains added in order (tests/test_conv_narrow_direct.py compares with the avx2 path).
 * With `sums`, a factored table's mapped operands (lut_conv.c): every chain a run whose integer
 * sums stay exact in float32, the runs added into float64 sums - the exact integer sums.
 */
#pragma GCC target("avx512f,avx512vl,avx2,fma")

#include <immintrin.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "internal.h"

#define NPV 4    /* 16-pixel vectors per tile */
#define KC 256   /* gemm_f32.c's K block */
#define BAND 16  /* output rows per job */

/* compiled for AVX-512 like the whole file: callers check gs_isa() == GS_ISA_AVX512 first */
int gs_conv_narrow_avx512_fits(const graphswap_conv2d_params *P)
{
    return gs_isa() == GS_ISA_AVX512 && P->groups == 1 && P->stride_height == 1 && P->stride_width == 1 &&
           P->dilation_height == 1 && P->dilation_width == 1 && P->out_channels >= 1 && P->out_channels <= 4 &&
           P->in_channels >= 8 && P->out_width >= 16 && P->filter_height <= 64;
}

typedef struct narrow_job {
    const graphswap_conv2d_params *P;
    const float *filter;
    int64_t wp;          /* floats per transposed channel row */
    float *ring;         /* filter_height rows of in_channels x wp */
    int64_t *held;       /* the input row each ring slot holds (-1: none) */
    const float *zeros;  /* a row of zeros (in_channels x wp) for rows in the padding */
    double *sums;        /* exact-integer mode: the float64 sums (pixels x outputs), else NULL */
    int64_t run;         /* k per float32 chain: KC, or a run whose integer sums stay exact */
} narrow_job;

static const float *transposed_row(narrow_job *J, const float *image, int64_t ih)
{
    const graphswap_conv2d_params *P = J->P;
    if (ih < 0 || ih >= P->in_height) return J->zeros;
    const int64_t slot = ih % P->filter_height, C = P->in_channels, W = P->in_width;
    float *d = J->ring + slot * C * J->wp;
    if (J->held[slot] != ih) {
        const float *x = image + ih * W * C;
        for (int64_t c = 0; c < C; ++c) {
            float *dc = d + c * J->wp + P->pad_left;
            for (int64_t iw = 0; iw < W; ++iw) dc[iw] = x[iw * C + c];
        }
        J->held[slot] = ih;
    }
    return d;
}

static inline __attribute__((always_inline)) void narrow_tile(const narrow_job *J, const float *const *rows,
                                                              int64_t ow0, int64_t pixel0, float *out_row,
                                                              const int NOC)
{
    const graphswap_conv2d_params *P = J->P;
    const int64_t C = P->in_channels, FH = P->filter_height, FW = P->filter_width, wp = J->wp, run = J->run;
    __m512 acc[4][NPV], tot[4][NPV];
    double t64[4][NPV * 16];
    _Pragma("GCC unroll 4") for (int o = 0; o < NOC; ++o)
        _Pragma("GCC unroll 4") for (int v = 0; v < NPV; ++v) acc[o][v] = _mm512_setzero_ps(),
                                                               tot[o][v] = _mm512_setzero_ps();
    if (J->sums) memset(t64, 0, sizeof t64);
    int64_t kk = 0, blocks = 0;
    const float *w = J->filter;
    for (int64_t fh = 0; fh < FH; ++fh)
        for (int64_t fw = 0; fw < FW; ++fw) {
            const float *x = rows[fh] + ow0 + fw;
            for (int64_t c = 0; c < C; ++c, w += NOC) {
                __m512 xv[NPV];
                _Pragma("GCC unroll 4") for (int v = 0; v < NPV; ++v) xv[v] = _mm512_loadu_ps(x + c * wp + 16 * v);
                _Pragma("GCC unroll 4") for (int o = 0; o < NOC; ++o) {
                    const __m512 wv = _mm512_set1_ps(w[o]);
                    _Pragma("GCC unroll 4") for (int v = 0; v < NPV; ++v) acc[o][v] = _mm512_fmadd_ps(wv, xv[v], acc[o][v]);
                }
                if (++kk < run) continue;
                kk = 0;
                if (J->sums) { /* an exact float32 run: into the float64 sums */
                    _Pragma("GCC unroll 4") for (int o = 0; o < NOC; ++o)
                        _Pragma("GCC unroll 4") for (int v = 0; v < NPV; ++v) {
                            double *d = t64[o] + 16 * v;
                            _mm512_storeu_pd(d, _mm512_add_pd(_mm512_loadu_pd(d),
                                                              _mm512_cvtps_pd(_mm512_castps512_ps256(acc[o][v]))));
                            _mm512_storeu_pd(d + 8, _mm512_add_pd(_mm512_loadu_pd(d + 8), _mm512_cvtps_pd(
                                _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[o][v]), 1)))));
                            acc[o][v] = _mm512_setzero_ps();
                        }
                } else { /* gemm_f32.c: C = chain (first block), C += chain after */
                    _Pragma("GCC unroll 4") for (int o = 0; o < NOC; ++o)
                        _Pragma("GCC unroll 4") for (int v = 0; v < NPV; ++v) {
                            tot[o][v] = blocks ? _mm512_add_ps(tot[o][v], acc[o][v]) : acc[o][v];
                            acc[o][v] = _mm512_setzero_ps();
                        }
                }
                ++blocks;
            }
        }
    const int64_t n = P->out_width - ow0 < NPV * 16 ? P->out_width - ow0 : NPV * 16;
    float t[4][NPV * 16];
    if (J->sums) {
        _Pragma("GCC unroll 4") for (int o = 0; o < NOC; ++o)
            _Pragma("GCC unroll 4") for (int v = 0; v < NPV; ++v) _mm512_storeu_ps(t[o] + 16 * v, acc[o][v]);
        for (int64_t j = 0; j < n; ++j)
            for (int o = 0; o < NOC; ++o) J->sums[(pixel0 + j) * NOC + o] = t64[o][j] + (double)t[o][j];
        return;
    }
    if (kk > 0)
        _Pragma("GCC unroll 4") for (int o = 0; o < NOC; ++o)
            _Pragma("GCC unroll 4") for (int v = 0; v < NPV; ++v)
                tot[o][v] = blocks ? _mm512_add_ps(tot[o][v], acc[o][v]) : acc[o][v];
    _Pragma("GCC unroll 4") for (int o = 0; o < NOC; ++o)
        _Pragma("GCC unroll 4") for (int v = 0; v < NPV; ++v) _mm512_storeu_ps(t[o] + 16 * v, tot[o][v]);
    for (int64_t j = 0; j < n; ++j)
        for (int o = 0; o < NOC; ++o) out_row[(ow0 + j) * NOC + o] = t[o][j];
}

int32_t gs_conv_narrow_avx512(const float *input, const float *filter, float *output,
                              const graphswap_conv2d_params *P, double *sums, int64_t run)
{
    const int64_t C = P->in_channels, FH = P->filter_height, OH = P->out_height, OW = P->out_width,
                  NOC = P->out_channels;
    const int64_t wp = (OW + NPV * 16 - 1) / (NPV * 16) * (NPV * 16) + P->filter_width + 16;
    const int64_t bands = (OH + BAND - 1) / BAND, jobs = P->batch * bands;
    const double flops = 2.0 * (double)P->batch * (double)(OH * OW) * (double)(FH * P->filter_width * C) * (double)NOC;
    int nt = gs_threads_for(flops, 4.0e6);
    if (nt > jobs) nt = (int)jobs;
    float *zeros = gs_alloc(C * wp * (int64_t)sizeof(float));
    if (!zeros) return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, "graphswap_conv2d_f32: cannot allocate a row of zeros");
    memset(zeros, 0, (size_t)(C * wp) * sizeof(float));
    int failed = 0;
#pragma omp parallel num_threads(nt) if (nt > 1) reduction(| : failed)
    {
        narrow_job J = {P, filter, wp, gs_alloc(FH * C * wp * (int64_t)sizeof(float)),
                        gs_alloc(FH * (int64_t)sizeof(int64_t)), zeros, sums, sums ? run : KC};
        if (!J.ring || !J.held) failed = 1;
        else memset(J.ring, 0, (size_t)(FH * C * wp) * sizeof(float));
        const float *rows[64];
#pragma omp for schedule(dynamic, 1)
        for (int64_t job = 0; job < jobs; ++job) {
            if (!J.ring || !J.held) continue;
            const int64_t n = job / bands, oh0 = (job % bands) * BAND;
            const float *image = input + n * P->in_height * P->in_width * C;
            for (int64_t s = 0; s < FH; ++s) J.held[s] = -1;
            for (int64_t oh = oh0; oh < OH && oh < oh0 + BAND; ++oh) {
                for (int64_t fh = 0; fh < FH; ++fh) rows[fh] = transposed_row(&J, image, oh - P->pad_top + fh);
                const int64_t pixel0 = (n * OH + oh) * OW;
                float *out_row = output ? output + pixel0 * NOC : NULL;
                for (int64_t ow0 = 0; ow0 < OW; ow0 += NPV * 16) {
                    if (NOC == 1) narrow_tile(&J, rows, ow0, pixel0 + ow0, out_row, 1);
                    else if (NOC == 2) narrow_tile(&J, rows, ow0, pixel0 + ow0, out_row, 2);
                    else if (NOC == 3) narrow_tile(&J, rows, ow0, pixel0 + ow0, out_row, 3);
                    else narrow_tile(&J, rows, ow0, pixel0 + ow0, out_row, 4);
                }
            }
        }
        gs_free(J.ring), gs_free(J.held);
    }
    gs_free(zeros);
    if (failed) return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, "graphswap_conv2d_f32: cannot allocate transposed rows");
    return GRAPHSWAP_OK;
}
