/*
 * lut_matmul.c -- table-driven GEMM entry points:
 *   graphswap_lut_matmul      8-bit codes in, exact int64 sums out;
 *   graphswap_lut_matmul_f32  float32 in, float32 out: quantize -> table GEMM -> exact zero-point
 *                             corrections -> dequantize (+ bias), in one call.
 *
 * Steps of a call: prepare the table (cached, lut_table.c); quantize the weights (codes row-major
 * and transposed, per-column scales / zero points / code sums); quantize the activations into the
 * kernels' packed layout (row blocks of 256, groups of 64 rows k-major), with row code sums and
 * non-finite flags; then jobs of (row block x up to 256 columns) over the OpenMP team: the ISA's
 * kernel gives the exact sums and the epilogue writes the output.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "lut_internal.h"

#define GS_LUT_MIN_WORK 65536. /* lookups per thread before a second thread pays off */

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Packs rows [r0, r0 + rows) of an m x k source into block dst (zeroing pad lanes).  Source is
 * either codes (src8) or floats (srcf, quantized with q); rowsum/badrow (may be NULL) per row.
 * Rows go 8 at a time through tmp (8 x k8 bytes, k8 = k rounded up to 8) and 8 x 8 byte
 * transposes into the k-major groups. */
static void pack_rows(const uint8_t *src8, const float *srcf, const gs_qparams *q, int64_t k,
                      int64_t r0, int64_t rows, uint8_t *dst, int64_t *rowsum, uint8_t *badrow,
                      uint8_t *tmp)
{
    const int64_t groups = (rows + 63) / 64, k8 = (k + 7) & ~(int64_t)7;
    const gs_isa_level isa = gs_isa();
    if (rows % 64) memset(dst + (groups - 1) * k * 64, 0, (size_t)(k * 64));
    memset(tmp, 0, (size_t)(8 * k8)); /* pad columns k..k8 stay 0; so do rows past the last row */
    for (int64_t r8 = 0; r8 < rows; r8 += 8) {
        const int64_t nr = rows - r8 < 8 ? rows - r8 : 8;
        if (nr < 8) memset(tmp + nr * k8, 0, (size_t)((8 - nr) * k8));
        for (int64_t i = 0; i < nr; ++i) {
            uint8_t *t = tmp + i * k8;
            const int64_t r = r0 + r8 + i;
            if (src8) {
                memcpy(t, src8 + r * k, (size_t)k);
            } else {
                const double recip = gs_recip(q->scale);
                const int bad = gs_quantize_activations(isa, srcf + r * k, k, q, &recip, t);
                if (badrow) badrow[r] = (uint8_t)bad;
            }
            if (rowsum) {
                int64_t sum = 0;
                for (int64_t kk = 0; kk < k; ++kk) sum += t[kk];
                rowsum[r] = sum;
            }
        }
        gs_pack_rows8(tmp, k8, k, dst + (r8 / 64) * k * 64 + (r8 % 64));
    }
}

typedef struct mm_job {
    const gs_lut_table *t;
    gs_isa_level isa;
    const uint8_t *apack; /* group g (rows 64g..64g+63) at apack + g * 64 * k */
    int64_t m, k, n;
    const uint8_t *b;     /* codes, k x n */
    const gs_wquant *w;   /* qt, colsum, scale, zero, bad */
    /* integer output */
    int64_t *acc;
    /* float output */
    float *c;
    const float *bias;
    const int64_t *rowsum;
    const uint8_t *badrow;
    const double *sasb;   /* s_a * s_b[j] */
    int is_unsigned;
    int64_t za;
    int sm;               /* sign-magnitude weights: b and w->qt hold 2 physical columns per column */
} mm_job;

static int32_t run_jobs(const char *fn, const mm_job *J)
{
    const gs_lut_shape shape = gs_lut_job_shape(J->isa, J->t);
    const int64_t width = J->sm ? 2 : 1;          /* physical columns per logical column */
    const int64_t cols = shape.cols / width;      /* logical columns per job */
    const int64_t row_blocks = (J->m + shape.rows - 1) / shape.rows;
    const int64_t col_chunks = (J->n + cols - 1) / cols;
    const int64_t jobs = row_blocks * col_chunks;
    int nt = gs_threads_for((double)J->m * (double)J->k * (double)J->n, GS_LUT_MIN_WORK);
    if (nt > jobs) nt = (int)jobs;
    const int64_t kscratch = (gs_lut_scratch_bytes(J->isa, J->t, J->k, shape.rows) + 63) / 64 * 64;
    const int64_t accbytes = J->c ? shape.rows * shape.cols * 8 : 0;
    const int64_t per_thread = kscratch + accbytes;
    uint8_t *scratch = gs_alloc(per_thread * nt);
    if (!scratch)
        return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, "%s: cannot allocate %lld bytes of kernel scratch", fn,
                       (long long)(per_thread * nt));
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
    for (int64_t job = 0; job < jobs; ++job) {
#ifdef _OPENMP
        uint8_t *mine = scratch + (int64_t)omp_get_thread_num() * per_thread;
#else
        uint8_t *mine = scratch;
#endif
        const int64_t rb = job / col_chunks, cc = job % col_chunks;
        const int64_t r0 = rb * shape.rows, rows = min64(shape.rows, J->m - r0);
        const int64_t j0 = cc * cols, ncols = min64(cols, J->n - j0);
        gs_lut_args a;
        a.t = J->t;
        a.a = J->apack + r0 * J->k; /* groups of 64 rows are contiguous */
        a.rows = rows;
        a.k = J->k;
        a.b = J->b + width * j0;
        a.ldb = width * J->n;
        a.bt = J->w->qt + width * j0 * J->k;
        a.ldbt = J->k;
        a.ncols = width * ncols;
        a.scratch = mine;
        a.pairs = 0;
        if (!J->c) {
            a.acc = J->acc + r0 * J->n + j0;
            a.ldacc = J->n;
            gs_lut_run(J->isa, &a);
            continue;
        }
        int64_t *acc = (int64_t *)(mine + kscratch);
        a.acc = acc;
        const int pairs = gs_lut_run_for_epilogue(J->isa, &a, J->sm, J->w, J->n, j0, ncols);
        /* epilogue: corrections, dequantization, bias, NaN */
        gs_epilogue e = {J->w->zero + j0, J->w->colsum + j0, J->sasb + j0, J->bias ? J->bias + j0 : NULL,
                         J->w->bad + j0, J->za, J->k, J->is_unsigned};
        gs_epilogue_rows(J->isa, &e, acc, pairs, rows, ncols, J->rowsum + r0, J->c + r0 * J->n + j0, J->n);
        for (int64_t r = 0; r < rows; ++r)
            if (J->badrow[r0 + r])
                for (int64_t j = 0; j < ncols; ++j) J->c[(r0 + r) * J->n + j0 + j] = NAN;
    }
    gs_free(scratch);
    return GRAPHSWAP_OK;
}

/* Packs all row blocks in parallel. */
static void pack_all(const uint8_t *src8, const float *srcf, const gs_qparams *q, int64_t m, int64_t k,
                     uint8_t *apack, int64_t *rowsum, uint8_t *badrow, int *failed)
{
    const int64_t blocks = (m + GS_LUT_ROWS - 1) / GS_LUT_ROWS;
    int nt = gs_threads_for((double)m * (double)k, 1 << 18);
    if (nt > blocks) nt = (int)blocks;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
    for (int64_t rb = 0; rb < blocks; ++rb) {
        const int64_t r0 = rb * GS_LUT_ROWS;
        uint8_t *tmp = malloc((size_t)(8 * ((k + 7) & ~(int64_t)7)) + 64);
        if (!tmp) {
#pragma omp atomic write
            *failed = 1;
            continue;
        }
        pack_rows(src8, srcf, q, k, r0, min64(GS_LUT_ROWS, m - r0), apack + r0 * k, rowsum, badrow, tmp);
        free(tmp);
    }
}

static int32_t check_sizes(const char *fn, int64_t m, int64_t k, int64_t n)
{
    if (m < 0 || k < 0 || n < 0)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, "%s: sizes must be >= 0, got m=%lld k=%lld n=%lld", fn,
                       (long long)m, (long long)k, (long long)n);
    int64_t mk, kn, mn, t;
    if (gs_mul_i64(m + GS_LUT_ROWS, k, &mk) || gs_mul_i64(k, n, &kn) || gs_mul_i64(m, n, &mn) ||
        gs_mul_i64(mn, 8, &t) || gs_mul_i64(mk, 4, &t) || gs_mul_i64(kn, 4, &t) || gs_add_i64(mk, kn, &t) ||
        gs_add_i64(t, 1 << 24, &t))
        return gs_fail(GRAPHSWAP_ERR_OVERFLOW, "%s: buffer sizes overflow int64 (m=%lld k=%lld n=%lld)", fn,
                       (long long)m, (long long)k, (long long)n);
    return GRAPHSWAP_OK;
}

GRAPHSWAP_EXPORT int32_t graphswap_lut_matmul(const uint8_t *a, const uint8_t *b, const int32_t *table,
                                              int64_t *acc, int64_t m, int64_t k, int64_t n)
{
    static const char fn[] = "graphswap_lut_matmul";
    int32_t rc = gs_isa_ready(fn);
    if (rc == GRAPHSWAP_OK) rc = check_sizes(fn, m, k, n);
    if (rc != GRAPHSWAP_OK) return rc;
    if (m == 0 || n == 0) return GRAPHSWAP_OK;
    if (!acc) return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, "%s: acc is NULL (m=%lld n=%lld)", fn,
                             (long long)m, (long long)n);
    if (k == 0) {
        memset(acc, 0, (size_t)(m * n) * sizeof acc[0]);
        return GRAPHSWAP_OK;
    }
    if (!a || !b || !table)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, "%s: a, b and table must not be NULL (m=%lld k=%lld n=%lld)",
                       fn, (long long)m, (long long)k, (long long)n);
    gs_lut_table *t = gs_lut_table_acquire(table);
    if (!t) return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, "%s: cannot allocate the prepared table", fn);
    gs_wquant w;
    rc = gs_wcodes_make(fn, b, k, n, &w);
    uint8_t *apack = rc == GRAPHSWAP_OK ? gs_alloc(gs_lut_packed_bytes(m + GS_LUT_ROWS, k)) : NULL;
    if (rc == GRAPHSWAP_OK && !apack) {
        gs_wquant_free(&w);
        rc = gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, "%s: cannot allocate %lld bytes of packed codes", fn,
                     (long long)gs_lut_packed_bytes(m + GS_LUT_ROWS, k));
    }
    if (rc == GRAPHSWAP_OK) {
        int failed = 0;
        pack_all(a, NULL, NULL, m, k, apack, NULL, NULL, &failed);
        mm_job J = {0};
        J.t = t, J.isa = gs_isa(), J.apack = apack, J.m = m, J.k = k, J.n = n, J.b = b, J.w = &w, J.acc = acc;
        rc = run_jobs(fn, &J);
        gs_free(apack);
        gs_wquant_free(&w);
    }
    gs_lut_table_release(t);
    return rc;
}

/* The product of a factored table through graphswap_matmul_f32 (lut_factored.c's "whole layers"):
 * each row quantized and mapped to f(code) while in cache, with its code sum and non-finite flag. */
static int32_t factored_matmul(const char *fn, const gs_lut_table *t, const float *a, const gs_qparams *qa,
                               const gs_wquant *w, int sm, const float *bias, const double *sasb, int64_t m,
                               int64_t k, int64_t n, float *c)
{
    const int need_sums = !qa->weights_signed && !sm;
    float *F = gs_alloc(m * k * (int64_t)sizeof(float));
    float *G = gs_alloc(k * n * (int64_t)sizeof(float));
    double *gsum = gs_alloc(n * 8), *base = gs_alloc(n * 8);
    int64_t *rowsum = gs_alloc(m * 8);
    uint8_t *badrow = gs_alloc(m);
    int failed = !F || !G || !gsum || !base || !rowsum || !badrow;
    if (!failed) {
        const int nt = gs_threads_for((double)m * (double)k, 1 << 18);
#pragma omp parallel num_threads(nt) if (nt > 1)
        {
            uint8_t *codes = malloc((size_t)k);
            if (!codes) {
#pragma omp atomic write
                failed = 1;
            }
#pragma omp for schedule(static)
            for (int64_t r = 0; r < m; ++r) {
                if (!codes) continue;
                badrow[r] = (uint8_t)gs_quantize_map(t, a + r * k, k, qa, -1, F + r * k, need_sums ? codes : NULL);
                int64_t sum = 0;
                if (need_sums)
                    for (int64_t kk = 0; kk < k; ++kk) sum += codes[kk];
                rowsum[r] = sum;
            }
            free(codes);
        }
    }
    int32_t rc = GRAPHSWAP_OK;
    if (failed) {
        rc = gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, "%s: cannot allocate %lld bytes of mapped operands", fn,
                     (long long)((m + n) * k * 4));
    } else {
        const gs_epilogue e = {w->zero, w->colsum, sasb, bias, w->bad, qa->zero, k, !qa->weights_signed};
        gs_factored_filter(t, w, k, n, sm, G, gsum);
        gs_factored_base(&e, gsum, 0.0f, n, base);
        rc = graphswap_matmul_f32(F, G, c, m, k, n);
        if (rc == GRAPHSWAP_OK) rc = gs_factored_epilogue(fn, &e, base, need_sums ? rowsum : NULL, 1, m, n, c);
        for (int64_t r = 0; r < m && rc == GRAPHSWAP_OK; ++r)
            if (badrow[r])
                for (int64_t j = 0; j < n; ++j) c[r * n + j] = NAN;
    }
    gs_free(F), gs_free(G), gs_free(gsum), gs_free(base), gs_free(rowsum), gs_free(badrow);
    return rc;
}

GRAPHSWAP_EXPORT int32_t graphswap_lut_matmul_f32(const float *a, const float *b, const float *bias,
                                                  float *c, int64_t m, int64_t k, int64_t n,
                                                  const int32_t *table, const graphswap_lut_quant *quant)
{
    static const char fn[] = "graphswap_lut_matmul_f32";
    int32_t rc = gs_isa_ready(fn);
    if (rc == GRAPHSWAP_OK) rc = check_sizes(fn, m, k, n);
    gs_qparams qa;
    if (rc == GRAPHSWAP_OK) rc = gs_quant_check(fn, quant, &qa);
    if (rc != GRAPHSWAP_OK) return rc;
    if (m * k > 0 && !a) return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, "%s: a is NULL (m=%lld k=%lld)", fn,
                                        (long long)m, (long long)k);
    /* activation range: needed for dynamic parameters and for the observer */
    float lo = INFINITY, hi = -INFINITY;
    int any_bad = 0;
    if (quant->activation_mode == GRAPHSWAP_QUANT_DYNAMIC || quant->observed_range)
        gs_range_f32(a, m * k, &lo, &hi, &any_bad);
    if (quant->observed_range) quant->observed_range[0] = lo, quant->observed_range[1] = hi;
    if (quant->activation_mode == GRAPHSWAP_QUANT_DYNAMIC) qa = gs_qparams_activation(&qa, lo, hi);
    if (m == 0 || n == 0) return GRAPHSWAP_OK;
    if (!c) return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, "%s: c is NULL (m=%lld n=%lld)", fn,
                           (long long)m, (long long)n);
    if (k > 0 && (!b || !table))
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, "%s: b and table must not be NULL (k=%lld n=%lld)", fn,
                       (long long)k, (long long)n);
    gs_lut_table *t = NULL;
    if (k > 0) {
        t = gs_lut_table_acquire(table);
        if (!t) return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, "%s: cannot allocate the prepared table", fn);
    }
    gs_wquant w;
    const int sm = quant->weight_encoding == GRAPHSWAP_WEIGHTS_SIGN_MAGNITUDE;
    const int per_channel = quant->weight_mode == GRAPHSWAP_QUANT_PER_CHANNEL;
    const int wbits = gs_weight_bits(quant->weight_bits);
    rc = gs_wquant_prepare(fn, b, k, n, sm, qa.weights_signed, per_channel, wbits, &w);
    if (rc != GRAPHSWAP_OK) {
        gs_lut_table_release(t);
        return rc;
    }
    uint8_t *apack = gs_alloc(gs_lut_packed_bytes(m + GS_LUT_ROWS, k > 0 ? k : 1));
    int64_t *rowsum = gs_alloc(m * 8);
    uint8_t *badrow = gs_alloc(m);
    double *sasb = gs_alloc(n * 8);
    if (!apack || !rowsum || !badrow || !sasb) {
        rc = gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, "%s: cannot allocate %lld bytes of packed codes", fn,
                     (long long)gs_lut_packed_bytes(m + GS_LUT_ROWS, k));
    } else if (k > 0 && gs_factored_float_fits(t, k, -1)) {
        for (int64_t j = 0; j < n; ++j) sasb[j] = qa.scale * w.scale[j];
        rc = factored_matmul(fn, t, a, &qa, &w, sm, bias, sasb, m, k, n, c);
    } else {
        for (int64_t j = 0; j < n; ++j) sasb[j] = qa.scale * w.scale[j];
        int failed = 0;
        pack_all(NULL, a, &qa, m, k, apack, rowsum, badrow, &failed);
        if (failed) rc = gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, "%s: cannot allocate quantization scratch", fn);
        mm_job J = {0};
        J.t = t, J.isa = gs_isa(), J.apack = apack, J.m = m, J.k = k, J.n = n, J.b = w.q, J.w = &w;
        J.c = c, J.bias = bias, J.rowsum = rowsum, J.badrow = badrow, J.sasb = sasb;
        J.is_unsigned = !qa.weights_signed, J.za = qa.zero, J.sm = sm;
        if (rc != GRAPHSWAP_OK) {
        } else if (k == 0) {
            /* no products: the sums are 0 (no table needed) */
            for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < n; ++j) {
                    float y = (float)(sasb[j] * 0.0);
                    if (bias) y += bias[j];
                    c[i * n + j] = (badrow[i] || w.bad[j]) ? NAN : y;
                }
        } else {
            rc = run_jobs(fn, &J);
        }
    }
    gs_free(apack), gs_free(rowsum), gs_free(badrow), gs_free(sasb);
    gs_wquant_free(&w);
    gs_lut_table_release(t);
    return rc;
}
