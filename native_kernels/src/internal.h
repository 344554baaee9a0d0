/*
 * internal.h -- helpers shared by the .c files of graphswap's own kernel library.
 *
 * Not part of the ABI: nothing here is exported (the library is built with -fvisibility=hidden).
 * Keep it small.  What it offers:
 *
 *   gs_fail(code, fmt, ...)     record a printf-style message for graphswap_last_error() in the
 *                               calling thread and return `code`:
 *                                   return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT,
 *                                                  "graphswap_lut_matmul: m must be >= 0, got %lld",
 *                                                  (long long)m);
 *   gs_num_threads()            upper bound on OpenMP threads one call may use (set by
 *                               graphswap_set_num_threads; default: all available cores).
 *   gs_threads_for(work, min)   threads to use for `work` units when each thread should get at
 *                               least `min` units (1 for small problems: fork/join costs ~10 us).
 *   gs_mul_i64 / gs_add_i64     overflow-checked int64 arithmetic for sizes (return 0 if OK).
 *   gs_alloc / gs_free          64-byte-aligned scratch allocation (NULL on failure or bytes == 0
 *                               overflow; report GRAPHSWAP_ERR_OUT_OF_MEMORY yourself).
 *
 * Threading rule for every kernel: open parallel regions with
 *     #pragma omp parallel num_threads(nt)
 * where nt comes from gs_threads_for(...) (never more than gs_num_threads()), and skip the parallel
 * region entirely when nt == 1.  graphswap sets OMP_WAIT_POLICY=PASSIVE so threads sleep after a
 * call instead of spinning against TensorFlow's pool.  Kernels must be re-entrant: no global mutable
 * scratch -- allocate per call (or per thread inside the call).
 */
#ifndef GRAPHSWAP_INTERNAL_H
#define GRAPHSWAP_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "graphswap_kernels.h"

#if defined(__GNUC__) || defined(__clang__)
#define GS_PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define GS_PRINTF_LIKE(f, a)
#endif

/* Stores the formatted message (truncated to ~1 KiB) for graphswap_last_error() in the calling
 * thread and returns `code` unchanged. */
int32_t gs_fail(int32_t code, const char *fmt, ...) GS_PRINTF_LIKE(2, 3);

/* Upper bound on threads per call: graphswap_set_num_threads(n) if n > 0, else all available cores
 * (omp_get_num_procs(); 1 without OpenMP).  Always >= 1. */
int gs_num_threads(void);

/* Threads for a job of `work` units (e.g. flops) when each thread should get at least
 * `min_work_per_thread` units; in [1, gs_num_threads()]. */
static inline int gs_threads_for(double work, double min_work_per_thread)
{
    int limit = gs_num_threads();
    double want = min_work_per_thread > 0 ? work / min_work_per_thread : (double)limit;
    if (want < 1.0) return 1;
    return want < (double)limit ? (int)want : limit;
}

/* *out = a * b; returns 0, or 1 if the product overflows int64 (then *out is unspecified). */
static inline int gs_mul_i64(int64_t a, int64_t b, int64_t *out)
{
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_mul_overflow(a, b, out) ? 1 : 0;
#else
    if (a != 0 && b != 0) {
        if ((a > 0 && b > 0 && a > INT64_MAX / b) || (a < 0 && b < 0 && a < INT64_MAX / b) ||
            (a > 0 && b < 0 && b < INT64_MIN / a) || (a < 0 && b > 0 && a < INT64_MIN / b))
            return 1;
    }
    *out = a * b;
    return 0;
#endif
}

/* *out = a + b; returns 0, or 1 on int64 overflow. */
static inline int gs_add_i64(int64_t a, int64_t b, int64_t *out)
{
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_add_overflow(a, b, out) ? 1 : 0;
#else
    if ((b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b)) return 1;
    *out = a + b;
    return 0;
#endif
}

/* 64-byte-aligned allocation of `bytes` (rounded up); NULL on failure or if bytes <= 0. */
static inline void *gs_alloc(int64_t bytes)
{
    if (bytes <= 0 || (uint64_t)bytes > (uint64_t)SIZE_MAX - 64) return NULL;
    size_t size = ((size_t)bytes + 63) & ~(size_t)63;
    return aligned_alloc(64, size);
}

static inline void gs_free(void *p) { free(p); }

/* ---- instruction-set dispatch (common.c) ----
 *
 * The library is compiled for baseline x86-64; code for wider vector units lives in files compiled
 * with `#pragma GCC target(...)` (lut_avx2.c, lut_avx512.c, gemm_f32.c) and is only ever called
 * after gs_isa() says the CPU (and OS) supports it.  The path is chosen once, at load time: the
 * best the CPU supports, or the one named by GRAPHSWAP_ISA=scalar|avx2|avx512; graphswap_set_isa
 * changes it at run time (tests use it to run every path in one process). */
typedef enum gs_isa_level {
    GS_ISA_SCALAR = 0, /* baseline x86-64 (SSE2), plain C */
    GS_ISA_AVX2 = 1,   /* AVX2 + FMA */
    GS_ISA_AVX512 = 2, /* AVX-512 F/BW/VL/DQ + VBMI (vpermi2b): Ice Lake, Sapphire Rapids, Zen 4 */
} gs_isa_level;

/* The path in use. */
gs_isa_level gs_isa(void);

/* GRAPHSWAP_OK, or (with gs_fail called, naming `fn`) GRAPHSWAP_ERR_UNSUPPORTED when the path
 * forced by GRAPHSWAP_ISA could not be used: then every entry point refuses to run. */
int32_t gs_isa_ready(const char *fn);

/* ---- shared validation of graphswap_conv2d_params (common.c), used by every conv entry point ----
 *
 * Checks signs, divisibility by groups, out_height/out_width against the formula in the header and
 * that every element and byte count (times a margin of 16) fits in int64; fills `geo` with the
 * derived sizes.  Returns GRAPHSWAP_OK or an error code with gs_fail called (messages start with
 * `fn`). */
typedef struct gs_conv_geo {
    int64_t cin_g, cout_g;  /* channels per group */
    int64_t taps;           /* filter_height * filter_width * cin_g: the reduction length */
    int64_t in_elems, filter_elems, pixels, out_elems;
} gs_conv_geo;

int32_t gs_conv_validate(const char *fn, const graphswap_conv2d_params *params, gs_conv_geo *geo);

/* Direct convolution of a single-channel input (conv_single_channel.c): whether it applies
 * (groups == 1, in_channels == 1, stride_width == 1), and the convolution itself. */
int gs_conv_single_channel_fits(const graphswap_conv2d_params *params);
int32_t gs_conv_single_channel(const float *input, const float *filter, float *output,
                               const graphswap_conv2d_params *params);

/* Direct AVX-512 convolution (conv_direct_avx512.c; avx512 path only): whether it applies (unit
 * stride, no dilation or groups, >= 16 input and a multiple of 16 output channels, more than one
 * tap, an L2-sized filter slice), and the convolution itself. */
int gs_conv_direct_avx512_fits(const graphswap_conv2d_params *params);
int32_t gs_conv_direct_avx512(const float *input, const float *filter, float *output,
                              const graphswap_conv2d_params *params);

/* Direct AVX-512 convolution of at most 4 output channels (conv_narrow_avx512.c; avx512 path
 * only): whether it applies (unit stride, no dilation or groups, >= 8 input channels, >= 16 output
 * columns), and the convolution, gemm_f32.c's sums bit for bit (sums NULL); with `sums`, integer
 * operands summed in float32 runs of `run` k that stay exact, added into float64 `sums`
 * (pixels x outputs) instead of `output`. */
int gs_conv_narrow_avx512_fits(const graphswap_conv2d_params *params);
int32_t gs_conv_narrow_avx512(const float *input, const float *filter, float *output,
                              const graphswap_conv2d_params *params, double *sums, int64_t run);

/* One output row of a depthwise convolution with depth multiplier 1 (conv_depthwise_avx512.c;
 * avx512 path only): conv_f32.c's depthwise loop, 16 channels a register and 4 pixels a block,
 * the same additions in the same order. */
void gs_depthwise_row_avx512(const float *input, const float *filter, float *output,
                             const graphswap_conv2d_params *params, int64_t row);

/* The scatter-add of graphswap_conv2d_backprop_input_f32 (conv_backprop_f32.c): the products y of
 * dy rows row0 .. row0 + rows - 1 by every tap ((oh, ow) x (fh, fw, ic)) added into one image of
 * dx at the positions each tap reaches. */
void gs_scatter_taps_f32(const graphswap_conv2d_params *params, const float *y, int64_t row0, int64_t rows,
                         float *dx_image);

/* The same products computed output pixel by output pixel on the avx512 path
 * (conv_backprop_avx512.c): whether a geometry takes it; the filter packed for it (k_inner: HWCK
 * as graphswap_conv2d_backprop_input_f32 gets it, else (tap, k, c)); one dx row of an image -
 * exact: the GEMM + scatter's sums bit for bit; else a factored table's exact integer sums, added
 * into row64 every `group` taps (row64 zero on entry) or, with row64 NULL, written as floats. */
int gs_backprop_direct_fits(const graphswap_conv2d_params *params);
int64_t gs_backprop_packed_floats(int64_t taps, int64_t K, int64_t C);
void gs_backprop_pack_avx512(const float *filter, int64_t taps, int64_t K, int64_t C, int k_inner, float *wt);
void gs_backprop_row_avx512(const graphswap_conv2d_params *params, const float *dy, int64_t pad, const float *wt,
                            int64_t ih, int exact, int64_t group, float *out, double *row64);
/* dy's rows with `pad` zero pixels on both sides (gs_backprop_pad: enough for every tap; the row
 * kernel then runs edge pixels in full tiles - exact where the weights are finite) */
int64_t gs_backprop_pad(const graphswap_conv2d_params *params);
void gs_backprop_pad_dy(const graphswap_conv2d_params *params, const float *dy, int64_t pad, float *padded);

/* ---- float32 GEMM internals (gemm_f32.c, AVX2 + FMA only), used by conv_f32.c ----
 *
 * gs_gemm_f32 computes C[i*rs_c + j*cs_c] = sum_k A(i,k) * B(j,k) for i < M, j < N, where an
 * operand element (r, k) is either
 *   - a strided matrix: p[r*si + k*sk]                               (conv == NULL), or
 *   - an implicit im2col patch (conv != NULL): r is the output pixel index
 *     (n*out_h + oh)*out_w + ow, counted from `row0`, and k = (fh*filter_w + fw)*cin_g + ic reads
 *     input[n, oh*sh - pt + fh*dh, ow*sw - pl + fw*dw, c_off + ic] (0 outside the image).
 * Sizes must already be validated (no overflow).  Returns GRAPHSWAP_OK or _ERR_OUT_OF_MEMORY
 * (with gs_fail called).  Uses up to `max_threads` OpenMP threads. */
typedef struct gs_conv_src {
    const float *input;
    int64_t height, width, channels;     /* input image geometry (NHWC) */
    int64_t out_h, out_w;
    int64_t filter_w, cin_g, c_off;       /* filter width, channels per group, group channel offset */
    int64_t sh, sw, dh, dw, pt, pl;
} gs_conv_src;

typedef struct gs_operand {
    const float *p;           /* strided matrix source (conv == NULL) */
    int64_t si, sk;
    const gs_conv_src *conv;  /* implicit im2col source, or NULL */
    int64_t row0;             /* conv source: pixel index of operand row 0 */
} gs_operand;

int32_t gs_gemm_f32(int64_t M, int64_t N, int64_t K, const gs_operand *A, const gs_operand *B,
                    float *C, int64_t rs_c, int64_t cs_c, int max_threads);

/* ---- OpenBLAS (blas_f32.c) ----
 *
 * c[i*ldc + j] = sum_p a[i*lda + p] * b[p*ldb + j] (+ c if accumulate), row-major, one call of the
 * single-threaded sgemm of the scipy-openblas32 library on the calling thread (sizes split so every
 * blasint fits int32).  OpenBLAS's own thread pool is kept at one thread (set at load time):
 * parallelism comes from our OpenMP team, whose threads sleep after a call (OMP_WAIT_POLICY=PASSIVE). */
void gs_sgemm_rows(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
                   int64_t ldb, float *c, int64_t ldc, int accumulate);

#endif /* GRAPHSWAP_INTERNAL_H */
