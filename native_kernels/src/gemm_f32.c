/*
 * gemm_f32.c -- hand-written exact float32 GEMM (AVX2 + FMA), gs_gemm_f32, used by conv_f32.c where
 * it beats OpenBLAS (convolutions with few output channels, e.g. LeNet-5's: its implicit im2col
 * packs patches straight into register-tile panels and runs transposed for narrow outputs).
 * graphswap_matmul_f32 itself runs on OpenBLAS (blas_f32.c).
 *
 * The whole file is compiled for AVX2 + FMA (the pragma below) whatever the library's baseline;
 * callers must check gs_isa() >= GS_ISA_AVX2 first.
 *
 * Structure (Goto/BLIS): C is computed in MR x NR register tiles by an AVX2/FMA micro-kernel
 * (6 x 16: twelve 8-float accumulators) from packed operand panels.  Loops, outermost first:
 *   jc over N in NC-blocks -> pc over K in KC-blocks (pack a KC x NC block of B into NR-wide panels,
 *   kept in L3/L2) -> ic over M in MC-blocks (pack an MC x KC block of A into MR-tall panels, kept in
 *   L2) -> jr over NR panels (one B micro-panel stays in L1) -> ir over MR panels -> micro-kernel.
 * Panels are zero-padded at the edges, so the micro-kernel always runs a full tile; partial tiles
 * (and tiles of a transposed C) are written back through a small buffer.
 *
 * Operands are abstract (gs_operand, see internal.h): a strided matrix, or an implicit im2col view
 * of a convolution input that is expanded only while packing, so convolutions need no im2col buffer.
 *
 * Orientation: the tile is 6 x 16, so a product with few columns (n = 6, 10 ...) wastes most of each
 * 16-wide row.  gs_gemm_f32 then computes C^T = B^T A^T instead (swapping the operands and C's
 * strides), whichever pads less.
 *
 * Threads (OpenMP, at most gs_num_threads()): with enough rows, the team packs each B block together
 * into a shared buffer and then takes row blocks of A dynamically (each thread packs its own A);
 * with few rows (transposed products), threads take column chunks dynamically.  Dynamic scheduling
 * keeps a core that TensorFlow's pool (or anything else) is using from holding the others up.
 * Products under ~2 x GS_GEMM_MIN_FLOPS_PER_THREAD run on the calling thread only (waking a
 * sleeping OpenMP thread costs ~10-40 us here).  Scratch is allocated per call: re-entrant.
 */
#pragma GCC target("avx2,fma")

#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define GS_HAVE_AVX2 1
#endif

#include "internal.h"

#define MR 6
#define NR 16
#define KC 256
#define MC 168  /* multiple of MR */
#define NC 4080 /* multiple of NR */

/* Minimum flops per thread before a second thread is worth waking (measured: fork/join with a
 * passive wait policy costs ~10-30 us here). */
#ifndef GS_GEMM_MIN_FLOPS_PER_THREAD
#define GS_GEMM_MIN_FLOPS_PER_THREAD 3.0e6
#endif

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* ------------------------------------------------------------------------------------------------
 * Packing.  pack_panel writes dst[k*R + r] = op(i0 + r, k0 + k) for r < rows, k < kc, and zeros for
 * rows <= r < R.  R is MR (A panels) or NR (B panels); the functions are inlined with R constant.
 * ------------------------------------------------------------------------------------------------ */

static inline void pack_matrix(const gs_operand *s, int64_t i0, int64_t rows, int64_t k0, int64_t kc,
                               const int R, float *restrict dst)
{
    const int64_t si = s->si, sk = s->sk;
    const float *p = s->p + i0 * si + k0 * sk;
    if (si == 1) {
        /* the R values of one k are contiguous */
        if (rows == R) {
            for (int64_t k = 0; k < kc; ++k) {
                const float *src = p + k * sk;
                float *d = dst + k * R;
                for (int r = 0; r < R; ++r) d[r] = src[r];
            }
        } else {
            for (int64_t k = 0; k < kc; ++k) {
                const float *src = p + k * sk;
                float *d = dst + k * R;
                int r = 0;
                for (; r < rows; ++r) d[r] = src[r];
                for (; r < R; ++r) d[r] = 0.0f;
            }
        }
        return;
    }
    if (sk == 1) {
        /* each operand row is contiguous along k: transpose rows into the panel */
        int64_t r = 0;
#ifdef GS_HAVE_AVX2
        if (R == 16 || R == 8) {
            /* 8 x 8 transposes */
            for (; r + 8 <= rows; r += 8) {
                const float *s0 = p + r * si;
                int64_t k = 0;
                for (; k + 8 <= kc; k += 8) {
                    __m256 x0 = _mm256_loadu_ps(s0 + 0 * si + k), x1 = _mm256_loadu_ps(s0 + 1 * si + k);
                    __m256 x2 = _mm256_loadu_ps(s0 + 2 * si + k), x3 = _mm256_loadu_ps(s0 + 3 * si + k);
                    __m256 x4 = _mm256_loadu_ps(s0 + 4 * si + k), x5 = _mm256_loadu_ps(s0 + 5 * si + k);
                    __m256 x6 = _mm256_loadu_ps(s0 + 6 * si + k), x7 = _mm256_loadu_ps(s0 + 7 * si + k);
                    __m256 t0 = _mm256_unpacklo_ps(x0, x1), t1 = _mm256_unpackhi_ps(x0, x1);
                    __m256 t2 = _mm256_unpacklo_ps(x2, x3), t3 = _mm256_unpackhi_ps(x2, x3);
                    __m256 t4 = _mm256_unpacklo_ps(x4, x5), t5 = _mm256_unpackhi_ps(x4, x5);
                    __m256 t6 = _mm256_unpacklo_ps(x6, x7), t7 = _mm256_unpackhi_ps(x6, x7);
                    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
                    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
                    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
                    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
                    float *d = dst + k * R + r;
                    _mm256_storeu_ps(d + 0 * R, _mm256_permute2f128_ps(u0, u4, 0x20));
                    _mm256_storeu_ps(d + 1 * R, _mm256_permute2f128_ps(u1, u5, 0x20));
                    _mm256_storeu_ps(d + 2 * R, _mm256_permute2f128_ps(u2, u6, 0x20));
                    _mm256_storeu_ps(d + 3 * R, _mm256_permute2f128_ps(u3, u7, 0x20));
                    _mm256_storeu_ps(d + 4 * R, _mm256_permute2f128_ps(u0, u4, 0x31));
                    _mm256_storeu_ps(d + 5 * R, _mm256_permute2f128_ps(u1, u5, 0x31));
                    _mm256_storeu_ps(d + 6 * R, _mm256_permute2f128_ps(u2, u6, 0x31));
                    _mm256_storeu_ps(d + 7 * R, _mm256_permute2f128_ps(u3, u7, 0x31));
                }
                for (; k < kc; ++k)
                    for (int q = 0; q < 8; ++q) dst[k * R + r + q] = s0[q * si + k];
            }
        }
#endif
        if (r < rows) {
            /* remaining rows, R at a time along k to keep the writes sequential */
            const int64_t nrem = rows - r;
            for (int64_t k = 0; k < kc; ++k) {
                float *d = dst + k * R + r;
                const float *src = p + r * si + k;
                for (int64_t q = 0; q < nrem; ++q) d[q] = src[q * si];
            }
        }
        if (rows < R)
            for (int64_t k = 0; k < kc; ++k)
                for (int64_t q = rows; q < R; ++q) dst[k * R + q] = 0.0f;
        return;
    }
    for (int64_t k = 0; k < kc; ++k) {
        float *d = dst + k * R;
        int64_t r = 0;
        for (; r < rows; ++r) d[r] = p[r * si + k * sk];
        for (; r < R; ++r) d[r] = 0.0f;
    }
}

/* d[0..n) = s[0..n) without a libc call (these copies are short and many). */
static inline void copy_floats(float *restrict d, const float *restrict s, int64_t n)
{
    int64_t j = 0;
#ifdef GS_HAVE_AVX2
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(d + j, _mm256_loadu_ps(s + j));
    if (j + 4 <= n) {
        _mm_storeu_ps(d + j, _mm_loadu_ps(s + j));
        j += 4;
    }
    /* (no vmaskmovps: its store form is microcoded and slow on AMD) */
#endif
    for (; j < n; ++j) d[j] = s[j];
}

static inline void zero_floats(float *d, int64_t n)
{
    for (int64_t j = 0; j < n; ++j) d[j] = 0.0f;
}

/* Implicit im2col: operand row = output pixel, column k = (fh*FW + fw)*cin_g + ic.
 * The panel's pixels are handled in segments that lie in one output row (consecutive ow). */

/* Segment of `seg` pixels of one output row, filled k by k: for each k the pixels' inputs are
 * equally spaced (sw*C apart) along one input row.  Best when that spacing is 1 (C == 1, stride 1)
 * or when per-pixel runs are short. */
static inline void pack_conv_row_gather(const gs_conv_src *cv, const float *img, int64_t ih0,
                                        int64_t iw0, int64_t seg, int64_t tap0, int64_t ic0,
                                        int64_t kc, const int R, float *restrict dst)
{
    const int64_t H = cv->height, W = cv->width, C = cv->channels, FW = cv->filter_w, CG = cv->cin_g;
    const int64_t sw = cv->sw, step = cv->sw * C;
    int64_t fh = tap0 / FW, fw = tap0 - fh * FW, ic = ic0;
    int64_t kk = 0;
    const int64_t FH_last = (tap0 + (ic0 + kc - 1) / CG) / FW; /* last filter row touched */
    if (ih0 >= 0 && ih0 + FH_last * cv->dh < H && iw0 >= 0 &&
        iw0 + (seg - 1) * sw + (FW - 1) * cv->dw < W) {
        /* interior: every read is inside the image */
        while (kk < kc) {
            const int64_t run = min64(CG - ic, kc - kk);
            const float *src = img + ((ih0 + fh * cv->dh) * W + iw0 + fw * cv->dw) * C + ic;
            float *d = dst + kk * R;
            if (step == 1) {
                if (seg == R) {
                    for (int64_t t = 0; t < run; ++t, d += R) copy_floats(d, src + t, R);
                } else {
                    for (int64_t t = 0; t < run; ++t, d += R) copy_floats(d, src + t, seg);
                }
            } else {
                for (int64_t t = 0; t < run; ++t, d += R)
                    for (int64_t j = 0; j < seg; ++j) d[j] = src[j * step + t];
            }
            kk += run;
            ic = 0;
            if (++fw == FW) { fw = 0; ++fh; }
        }
        return;
    }
    while (kk < kc) {
        const int64_t run = min64(CG - ic, kc - kk);
        const int64_t ih = ih0 + fh * cv->dh;
        float *d = dst + kk * R;
        if (ih < 0 || ih >= H) {
            for (int64_t t = 0; t < run; ++t, d += R) zero_floats(d, seg);
        } else {
            const int64_t iwf = iw0 + fw * cv->dw; /* input column of the segment's pixel 0 */
            int64_t jlo = 0, jhi = seg;
            if (iwf < 0) jlo = (-iwf + sw - 1) / sw;
            if (iwf + (seg - 1) * sw >= W) jhi = (iwf >= W) ? 0 : (W - 1 - iwf) / sw + 1;
            if (jlo > jhi) jlo = jhi;
            /* pixel j reads rowp[x0 + j*step + t]; only valid j index the image */
            const float *rowp = img + ih * W * C + ic;
            const int64_t x0 = iwf * C;
            for (int64_t t = 0; t < run; ++t, d += R) {
                zero_floats(d, jlo);
                if (step == 1) {
                    if (jhi > jlo) copy_floats(d + jlo, rowp + x0 + jlo + t, jhi - jlo);
                } else {
                    for (int64_t j = jlo; j < jhi; ++j) d[j] = rowp[x0 + j * step + t];
                }
                zero_floats(d + jhi, seg - jhi);
            }
        }
        kk += run;
        ic = 0;
        if (++fw == FW) { fw = 0; ++fh; }
    }
}

/* One pixel, filled along k with contiguous input runs (consecutive taps of one filter row are
 * merged into one run when they are adjacent in memory: dilation_w 1 and a single group). */
static inline void pack_conv_pixel(const gs_conv_src *cv, const float *img, int64_t ih0, int64_t iw0,
                                   int64_t tap0, int64_t ic0, int64_t kc, const int R,
                                   float *restrict d)
{
    const int64_t H = cv->height, W = cv->width, C = cv->channels, FW = cv->filter_w, CG = cv->cin_g;
    const int64_t dw = cv->dw;
    const int merge = dw == 1 && CG == C;
    int64_t fh = tap0 / FW, fw = tap0 - fh * FW, ic = ic0;
    int64_t kk = 0;
    while (kk < kc) {
        const int64_t ih = ih0 + fh * cv->dh;
        int64_t run;
        if (ih < 0 || ih >= H) {
            run = min64((FW - fw) * CG - ic, kc - kk); /* rest of this filter row: zeros */
            for (int64_t t = 0; t < run; ++t) d[(kk + t) * R] = 0.0f;
        } else {
            const int64_t iw = iw0 + fw * dw;
            if (iw < 0 || iw >= W) {
                run = min64(CG - ic, kc - kk);
                for (int64_t t = 0; t < run; ++t) d[(kk + t) * R] = 0.0f;
            } else {
                const int64_t taps = merge ? min64(FW - fw, W - iw) : 1;
                run = min64(taps * CG - ic, kc - kk);
                const float *src = img + (ih * W + iw) * C + ic;
                for (int64_t t = 0; t < run; ++t) d[(kk + t) * R] = src[t];
            }
        }
        kk += run;
        ic += run;
        fw += ic / CG;
        ic %= CG;
        if (fw >= FW) { fw -= FW; ++fh; }
    }
}

#ifdef GS_HAVE_AVX2
/* d[t*6 + r] = src[r][t] for t < len, r < 6 (an A panel from six contiguous runs), 8 x 8 transposes
 * with two zero rows; stores are exactly 6 floats wide (4 + 2), never past the panel row. */
static inline void transpose6(float *restrict d, const float *const src[6], int64_t len)
{
    int64_t t = 0;
    const __m256 z = _mm256_setzero_ps();
    for (; t + 8 <= len; t += 8) {
        __m256 x0 = _mm256_loadu_ps(src[0] + t), x1 = _mm256_loadu_ps(src[1] + t);
        __m256 x2 = _mm256_loadu_ps(src[2] + t), x3 = _mm256_loadu_ps(src[3] + t);
        __m256 x4 = _mm256_loadu_ps(src[4] + t), x5 = _mm256_loadu_ps(src[5] + t);
        __m256 t0 = _mm256_unpacklo_ps(x0, x1), t1 = _mm256_unpackhi_ps(x0, x1);
        __m256 t2 = _mm256_unpacklo_ps(x2, x3), t3 = _mm256_unpackhi_ps(x2, x3);
        __m256 t4 = _mm256_unpacklo_ps(x4, x5), t5 = _mm256_unpackhi_ps(x4, x5);
        __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
        __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
        __m256 u4 = _mm256_shuffle_ps(t4, z, 0x44), u5 = _mm256_shuffle_ps(t4, z, 0xEE);
        __m256 u6 = _mm256_shuffle_ps(t5, z, 0x44), u7 = _mm256_shuffle_ps(t5, z, 0xEE);
        /* row q of the transpose: low 4 lanes from u(q%4) lane-half, lanes 4,5 from u(4+q%4) */
        const __m256 lo[4] = {u0, u1, u2, u3}, hi[4] = {u4, u5, u6, u7};
        float *dd = d + t * 6;
        for (int q = 0; q < 4; ++q) {
            _mm_storeu_ps(dd + q * 6, _mm256_castps256_ps128(lo[q]));
            _mm_storel_pi((__m64 *)(dd + q * 6 + 4), _mm256_castps256_ps128(hi[q]));
            _mm_storeu_ps(dd + (q + 4) * 6, _mm256_extractf128_ps(lo[q], 1));
            _mm_storel_pi((__m64 *)(dd + (q + 4) * 6 + 4), _mm256_extractf128_ps(hi[q], 1));
        }
    }
    for (; t < len; ++t)
        for (int r = 0; r < 6; ++r) d[t * 6 + r] = src[r][t];
}
#endif

static inline void pack_conv(const gs_operand *s, int64_t i0, int64_t rows, int64_t k0, int64_t kc,
                             const int R, float *restrict dst)
{
    const gs_conv_src *cv = s->conv;
    const int64_t H = cv->height, W = cv->width, C = cv->channels, OW = cv->out_w, OH = cv->out_h;
    const int64_t CG = cv->cin_g;
    const int64_t pix0 = s->row0 + i0;
    const int64_t ohw = OH * OW;
    int64_t n = pix0 / ohw, rem = pix0 - n * ohw, oh = rem / OW, ow = rem - oh * OW;
    const int64_t tap0 = k0 / CG, ic0 = k0 - tap0 * CG;
    const int64_t pixel_run = (cv->dw == 1 && CG == C) ? cv->filter_w * CG : CG;
    const int gather_ok = cv->sw * C == 1 || pixel_run < 4;

#ifdef GS_HAVE_AVX2
    if (R == 6 && rows == 6) {
        /* A panel of 6 pixels that all see only the image interior: vector transposes of their
         * contiguous runs (pixels may lie in different output rows or images) */
        const float *img[6];
        int64_t ihb[6], iwb[6];
        const int64_t FW = cv->filter_w, dh = cv->dh, dw = cv->dw;
        const int64_t FH_last = (tap0 + (ic0 + kc - 1) / CG) / FW;
        int interior = 1;
        int64_t pn = n, poh = oh, pow_ = ow;
        for (int q = 0; q < 6; ++q) {
            img[q] = cv->input + pn * H * W * C + cv->c_off;
            ihb[q] = poh * cv->sh - cv->pt;
            iwb[q] = pow_ * cv->sw - cv->pl;
            interior &= ihb[q] >= 0 && ihb[q] + FH_last * dh < H && iwb[q] >= 0 &&
                        iwb[q] + (FW - 1) * dw < W;
            if (++pow_ == OW) {
                pow_ = 0;
                if (++poh == OH) { poh = 0; ++pn; }
            }
        }
        if (interior) {
            int64_t fh = tap0 / FW, fw = tap0 - fh * FW, ic = ic0, kk = 0;
            while (kk < kc) {
                const int64_t run = min64((pixel_run == CG ? CG : (FW - fw) * CG) - ic, kc - kk);
                const float *src[6];
                for (int q = 0; q < 6; ++q)
                    src[q] = img[q] + ((ihb[q] + fh * dh) * W + iwb[q] + fw * dw) * C + ic;
                transpose6(dst + kk * 6, src, run);
                kk += run;
                ic += run;
                fw += ic / CG;
                ic %= CG;
                if (fw >= FW) { fw -= FW; ++fh; }
            }
            return;
        }
    }
#endif
    int64_t r = 0;
    while (r < rows) {
        const int64_t seg = min64(rows - r, OW - ow);
        const float *img = cv->input + n * H * W * C + cv->c_off;
        const int64_t ih0 = oh * cv->sh - cv->pt, iw0 = ow * cv->sw - cv->pl;
        if (gather_ok && seg >= 4) {
            pack_conv_row_gather(cv, img, ih0, iw0, seg, tap0, ic0, kc, R, dst + r);
        } else {
            for (int64_t j = 0; j < seg; ++j)
                pack_conv_pixel(cv, img, ih0, iw0 + j * cv->sw, tap0, ic0, kc, R, dst + r + j);
        }
        r += seg;
        ow += seg;
        if (ow == OW) {
            ow = 0;
            if (++oh == OH) { oh = 0; ++n; }
        }
    }
    for (int64_t q = rows; q < R; ++q)
        for (int64_t k = 0; k < kc; ++k) dst[k * R + q] = 0.0f;
}

static inline void pack_panel(const gs_operand *s, int64_t i0, int64_t rows, int64_t k0, int64_t kc,
                              const int R, float *restrict dst)
{
    if (s->conv)
        pack_conv(s, i0, rows, k0, kc, R, dst);
    else
        pack_matrix(s, i0, rows, k0, kc, R, dst);
}

/* ------------------------------------------------------------------------------------------------
 * Micro-kernel: C_tile(mr x nr) (+)= A_panel(kc x MR)^T * B_panel(kc x NR); accumulate != 0 adds to C.
 * ------------------------------------------------------------------------------------------------ */

static inline void store_tile_generic(const float *restrict t, float *restrict c, int64_t rs_c,
                                      int64_t cs_c, int64_t mr, int64_t nr, int accumulate)
{
    if (rs_c == 1) {
        /* transposed product: C rows are the tile's columns; write them contiguously */
        for (int64_t j = 0; j < nr; ++j) {
            float *cj = c + j * cs_c;
            if (accumulate)
                for (int64_t r = 0; r < mr; ++r) cj[r] += t[r * NR + j];
            else
                for (int64_t r = 0; r < mr; ++r) cj[r] = t[r * NR + j];
        }
        return;
    }
    if (accumulate) {
        for (int64_t r = 0; r < mr; ++r)
            for (int64_t j = 0; j < nr; ++j) c[r * rs_c + j * cs_c] += t[r * NR + j];
    } else {
        for (int64_t r = 0; r < mr; ++r)
            for (int64_t j = 0; j < nr; ++j) c[r * rs_c + j * cs_c] = t[r * NR + j];
    }
}

#ifdef GS_HAVE_AVX2

static void micro_kernel(int64_t kc, const float *restrict a, const float *restrict b, float *restrict c,
                         int64_t rs_c, int64_t cs_c, int64_t mr, int64_t nr, int accumulate)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
    __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
    __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
    __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();

#define GS_STEP(o)                                                                             \
    do {                                                                                       \
        const __m256 b0 = _mm256_load_ps(b + (o) * NR), b1 = _mm256_load_ps(b + (o) * NR + 8); \
        __m256 av = _mm256_broadcast_ss(a + (o) * MR + 0);                                     \
        c00 = _mm256_fmadd_ps(av, b0, c00);                                                    \
        c01 = _mm256_fmadd_ps(av, b1, c01);                                                    \
        av = _mm256_broadcast_ss(a + (o) * MR + 1);                                            \
        c10 = _mm256_fmadd_ps(av, b0, c10);                                                    \
        c11 = _mm256_fmadd_ps(av, b1, c11);                                                    \
        av = _mm256_broadcast_ss(a + (o) * MR + 2);                                            \
        c20 = _mm256_fmadd_ps(av, b0, c20);                                                    \
        c21 = _mm256_fmadd_ps(av, b1, c21);                                                    \
        av = _mm256_broadcast_ss(a + (o) * MR + 3);                                            \
        c30 = _mm256_fmadd_ps(av, b0, c30);                                                    \
        c31 = _mm256_fmadd_ps(av, b1, c31);                                                    \
        av = _mm256_broadcast_ss(a + (o) * MR + 4);                                            \
        c40 = _mm256_fmadd_ps(av, b0, c40);                                                    \
        c41 = _mm256_fmadd_ps(av, b1, c41);                                                    \
        av = _mm256_broadcast_ss(a + (o) * MR + 5);                                            \
        c50 = _mm256_fmadd_ps(av, b0, c50);                                                    \
        c51 = _mm256_fmadd_ps(av, b1, c51);                                                    \
    } while (0)

    int64_t p = 0;
    for (; p + 4 <= kc; p += 4) {
        _mm_prefetch((const char *)(b + 16 * NR), _MM_HINT_T0);
        GS_STEP(0);
        GS_STEP(1);
        GS_STEP(2);
        GS_STEP(3);
        a += 4 * MR;
        b += 4 * NR;
    }
    for (; p < kc; ++p) {
        GS_STEP(0);
        a += MR;
        b += NR;
    }
#undef GS_STEP

    if (mr == MR && nr == NR && cs_c == 1) {
#define GS_ROW(r, x0, x1)                                                       \
    do {                                                                        \
        float *cr = c + (r) * rs_c;                                             \
        if (accumulate) {                                                       \
            x0 = _mm256_add_ps(x0, _mm256_loadu_ps(cr));                        \
            x1 = _mm256_add_ps(x1, _mm256_loadu_ps(cr + 8));                    \
        }                                                                       \
        _mm256_storeu_ps(cr, x0);                                               \
        _mm256_storeu_ps(cr + 8, x1);                                           \
    } while (0)
        GS_ROW(0, c00, c01);
        GS_ROW(1, c10, c11);
        GS_ROW(2, c20, c21);
        GS_ROW(3, c30, c31);
        GS_ROW(4, c40, c41);
        GS_ROW(5, c50, c51);
#undef GS_ROW
        return;
    }
    float t[MR * NR] __attribute__((aligned(32)));
    _mm256_store_ps(t + 0 * NR, c00); _mm256_store_ps(t + 0 * NR + 8, c01);
    _mm256_store_ps(t + 1 * NR, c10); _mm256_store_ps(t + 1 * NR + 8, c11);
    _mm256_store_ps(t + 2 * NR, c20); _mm256_store_ps(t + 2 * NR + 8, c21);
    _mm256_store_ps(t + 3 * NR, c30); _mm256_store_ps(t + 3 * NR + 8, c31);
    _mm256_store_ps(t + 4 * NR, c40); _mm256_store_ps(t + 4 * NR + 8, c41);
    _mm256_store_ps(t + 5 * NR, c50); _mm256_store_ps(t + 5 * NR + 8, c51);
    store_tile_generic(t, c, rs_c, cs_c, mr, nr, accumulate);
}

#else /* portable fallback: same tile, plain C (auto-vectorised where the target allows) */

static void micro_kernel(int64_t kc, const float *restrict a, const float *restrict b, float *restrict c,
                         int64_t rs_c, int64_t cs_c, int64_t mr, int64_t nr, int accumulate)
{
    float t[MR * NR];
    for (int i = 0; i < MR * NR; ++i) t[i] = 0.0f;
    for (int64_t p = 0; p < kc; ++p) {
        for (int r = 0; r < MR; ++r) {
            const float av = a[p * MR + r];
            for (int j = 0; j < NR; ++j) t[r * NR + j] += av * b[p * NR + j];
        }
    }
    store_tile_generic(t, c, rs_c, cs_c, mr, nr, accumulate);
}

#endif

/* ------------------------------------------------------------------------------------------------
 * Drivers
 * ------------------------------------------------------------------------------------------------ */

/* Scratch floats one thread needs for an (M x N x K) block. */
static void scratch_sizes(int64_t M, int64_t N, int64_t K, int64_t *a_floats, int64_t *b_floats)
{
    const int64_t kc = min64(K, KC);
    /* multiples of 16 floats, so every slice of the scratch stays 64-byte aligned */
    *a_floats = round_up(round_up(min64(M, MC), MR) * kc, 16);
    *b_floats = round_up(min64(N, NC), NR) * kc;
}

/* Packs rows [ic, ic+mc) x k [pc, pc+kc) of A into buf_a and multiplies them with the packed B
 * block buf_b (columns [jc, jc+nc)) into C. */
static void multiply_block(int64_t ic, int64_t mc, int64_t jc, int64_t nc, int64_t pc, int64_t kc,
                           const gs_operand *A, float *C, int64_t rs_c, int64_t cs_c,
                           float *restrict buf_a, const float *restrict buf_b)
{
    for (int64_t ip = 0; ip < mc; ip += MR)
        pack_panel(A, ic + ip, min64(MR, mc - ip), pc, kc, MR, buf_a + ip * kc);
    for (int64_t jp = 0; jp < nc; jp += NR) {
        const int64_t nr = min64(NR, nc - jp);
        const float *bp = buf_b + jp * kc;
        for (int64_t ip = 0; ip < mc; ip += MR)
            micro_kernel(kc, buf_a + ip * kc, bp, C + (ic + ip) * rs_c + (jc + jp) * cs_c, rs_c, cs_c,
                         min64(MR, mc - ip), nr, pc > 0);
    }
}

/* One thread: rows [i_begin, i_end) x columns [j_begin, j_end) of C. */
static void gemm_block(int64_t i_begin, int64_t i_end, int64_t j_begin, int64_t j_end, int64_t K,
                       const gs_operand *A, const gs_operand *B, float *C, int64_t rs_c, int64_t cs_c,
                       float *restrict buf_a, float *restrict buf_b)
{
    for (int64_t jc = j_begin; jc < j_end; jc += NC) {
        const int64_t nc = min64(NC, j_end - jc);
        for (int64_t pc = 0; pc < K; pc += KC) {
            const int64_t kc = min64(KC, K - pc);
            for (int64_t jp = 0; jp < nc; jp += NR)
                pack_panel(B, jc + jp, min64(NR, nc - jp), pc, kc, NR, buf_b + jp * kc);
            for (int64_t ic = i_begin; ic < i_end; ic += MC)
                multiply_block(ic, min64(MC, i_end - ic), jc, nc, pc, kc, A, C, rs_c, cs_c, buf_a, buf_b);
        }
    }
}

int32_t gs_gemm_f32(int64_t M, int64_t N, int64_t K, const gs_operand *A, const gs_operand *B,
                    float *C, int64_t rs_c, int64_t cs_c, int max_threads)
{
    if (M <= 0 || N <= 0) return GRAPHSWAP_OK;
    if (K <= 0) {
        for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) C[i * rs_c + j * cs_c] = 0.0f;
        return GRAPHSWAP_OK;
    }

    /* Orientation: compute C^T = B^T A^T when that pads the 6 x 16 tiles noticeably less (the
     * transposed write-back is slower, hence the 0.8 margin). */
    const double pad_normal = (double)round_up(M, MR) * (double)round_up(N, NR);
    const double pad_swapped = (double)round_up(N, MR) * (double)round_up(M, NR);
    if (pad_swapped < 0.8 * pad_normal) {
        const gs_operand *t = A;
        A = B;
        B = t;
        int64_t x = M;
        M = N;
        N = x;
        x = rs_c;
        rs_c = cs_c;
        cs_c = x;
    }

    const double flops = 2.0 * (double)M * (double)N * (double)K;
    int nt = gs_threads_for(flops, GS_GEMM_MIN_FLOPS_PER_THREAD);
    if (nt > max_threads) nt = max_threads;
    if (nt < 1) nt = 1;

    const int64_t kc_max = min64(K, KC);
    if (nt == 1) {
        int64_t a_floats, b_floats;
        scratch_sizes(M, N, K, &a_floats, &b_floats);
        float *scratch = (float *)gs_alloc((int64_t)sizeof(float) * (a_floats + b_floats));
        if (!scratch) goto oom;
        gemm_block(0, M, 0, N, K, A, B, C, rs_c, cs_c, scratch, scratch + a_floats);
        gs_free(scratch);
        return GRAPHSWAP_OK;
    }

    /* Several threads, scheduled dynamically (a core may be busy with TensorFlow's own pool):
     * - enough rows: for each (jc, pc) block the threads pack B together into one shared buffer,
     *   then take MC-row blocks of A (packed per thread) from a shared counter;
     * - few rows (e.g. a transposed product with 6 output channels): threads take column chunks,
     *   each packing its own A and B. */
    if ((M + MR - 1) / MR >= 2 * (int64_t)nt) {
        /* row blocks: at least ~4 per thread for balance, at most MC rows */
        int64_t mc_blk = round_up((M + 4 * nt - 1) / (4 * nt), MR);
        if (mc_blk > MC) mc_blk = MC;
        const int64_t n_blocks = (M + mc_blk - 1) / mc_blk;
        const int64_t a_floats = round_up(mc_blk * kc_max, 16);
        const int64_t b_floats = round_up(min64(N, NC), NR) * kc_max;
        float *scratch = (float *)gs_alloc((int64_t)sizeof(float) * (b_floats + a_floats * nt));
        if (!scratch) goto oom;
        float *buf_b = scratch;
#pragma omp parallel num_threads(nt)
        {
#ifdef _OPENMP
            float *buf_a = scratch + b_floats + a_floats * omp_get_thread_num();
#else
            float *buf_a = scratch + b_floats;
#endif
            for (int64_t jc = 0; jc < N; jc += NC) {
                const int64_t nc = min64(NC, N - jc);
                const int64_t b_panels = (nc + NR - 1) / NR;
                for (int64_t pc = 0; pc < K; pc += KC) {
                    const int64_t kc = min64(KC, K - pc);
#pragma omp for schedule(static)
                    for (int64_t q = 0; q < b_panels; ++q)
                        pack_panel(B, jc + q * NR, min64(NR, nc - q * NR), pc, kc, NR,
                                   buf_b + q * NR * kc);
                    /* implicit barrier: B is packed */
#pragma omp for schedule(dynamic, 1)
                    for (int64_t blk = 0; blk < n_blocks; ++blk) {
                        const int64_t ic = blk * mc_blk;
                        multiply_block(ic, min64(mc_blk, M - ic), jc, nc, pc, kc, A, C, rs_c, cs_c,
                                       buf_a, buf_b);
                    }
                    /* implicit barrier: buf_b may be repacked */
                }
            }
        }
        gs_free(scratch);
    } else {
        int64_t nc_blk = round_up((N + 4 * nt - 1) / (4 * nt), NR);
        if (nc_blk > NC) nc_blk = NC;
        const int64_t n_blocks = (N + nc_blk - 1) / nc_blk;
        int64_t a_floats, b_floats;
        scratch_sizes(M, nc_blk, K, &a_floats, &b_floats);
        const int64_t per_thread = a_floats + b_floats;
        float *scratch = (float *)gs_alloc((int64_t)sizeof(float) * per_thread * nt);
        if (!scratch) goto oom;
#pragma omp parallel num_threads(nt)
        {
#ifdef _OPENMP
            float *buf_a = scratch + per_thread * omp_get_thread_num();
#else
            float *buf_a = scratch;
#endif
#pragma omp for schedule(dynamic, 1)
            for (int64_t blk = 0; blk < n_blocks; ++blk) {
                const int64_t j0 = blk * nc_blk;
                gemm_block(0, M, j0, min64(j0 + nc_blk, N), K, A, B, C, rs_c, cs_c, buf_a,
                           buf_a + a_floats);
            }
        }
        gs_free(scratch);
    }
    return GRAPHSWAP_OK;

oom:
    return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY,
                   "graphswap: cannot allocate GEMM packing scratch (M=%lld N=%lld K=%lld, %d threads)",
                   (long long)M, (long long)N, (long long)K, nt);
}
