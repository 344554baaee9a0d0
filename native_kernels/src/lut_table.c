/*
 * lut_table.c -- prepared multiplier tables, cached by content, and the per-ISA dispatch: the one
 * file that names the routines of lut_scalar.c, lut_avx2.c, lut_gather_avx2.c and lut_avx512.c.
 *
 * Preparing a table (transpose, range, byte planes) reads and writes ~0.5 MiB, tens of
 * microseconds: too much to repeat on every call of a small layer.  Prepared tables are kept in a
 * small cache keyed by the table's full contents (memcmp against the stored copy, so a caller that
 * rewrites its buffer in place still gets the right table); entries are reference-counted so a
 * call in flight keeps its table while another thread evicts it.
 */
#include <pthread.h>
#include <string.h>

#include "lut_internal.h"

#define GS_LUT_CACHE 8

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static gs_lut_table *cache[GS_LUT_CACHE]; /* most recently used first */

static void table_free(gs_lut_table *t)
{
    if (!t) return;
    gs_free(t->plane_data);
    gs_free(t->tt16);
    gs_free(t);
}

static gs_lut_table *table_build(const int32_t *table)
{
    gs_lut_table *t = gs_alloc((int64_t)sizeof(gs_lut_table));
    if (!t) return NULL;
    memcpy(t->table, table, sizeof t->table);
    int32_t lo = table[0], hi = table[0];
    for (int i = 1; i < 65536; ++i) {
        lo = table[i] < lo ? table[i] : lo;
        hi = table[i] > hi ? table[i] : hi;
    }
    t->tmin = lo;
    t->tmax = hi;
    t->zero_code_free = 1;
    for (int a = 0; a < 256; ++a) t->zero_code_free &= table[a << 8] == lo;
    t->zero_column = 0;
    for (int a = 0; a < 256; ++a) t->zero_column |= table[a << 8] != 0;
    const int64_t maxabs = -(int64_t)lo > (int64_t)hi ? -(int64_t)lo : (int64_t)hi;
    t->kblock = maxabs == 0 ? INT64_MAX : ((int64_t)INT32_MAX / maxabs > 0 ? (int64_t)INT32_MAX / maxabs : 1);
    for (int a = 0; a < 256; ++a)
        for (int b = 0; b < 256; ++b) t->tt[(b << 8) | a] = table[(a << 8) | b];
    const int64_t span = (int64_t)hi - (int64_t)lo;
    t->planes = span < 256 ? 1 : span < 65536 ? 2 : span < (1 << 24) ? 3 : 0;
    t->plane_data = NULL;
    t->tt16 = NULL;
    if (t->planes && t->planes <= 2) {
        t->tt16 = gs_alloc(65536 * 2);
        if (!t->tt16) {
            gs_free(t);
            return NULL;
        }
        for (int i = 0; i < 65536; ++i) t->tt16[i] = (uint16_t)((int64_t)t->tt[i] - lo);
    }
    if (t->planes) {
        const int P = t->planes;
        t->plane_data = gs_alloc((int64_t)256 * P * 256);
        if (!t->plane_data) {
            gs_free(t->tt16);
            gs_free(t);
            return NULL;
        }
        for (int b = 0; b < 256; ++b)
            for (int p = 0; p < P; ++p)
                for (int a = 0; a < 256; ++a)
                    t->plane_data[(b * P + p) * 256 + a] =
                        (uint8_t)((uint32_t)((int64_t)table[(a << 8) | b] - lo) >> (8 * p));
    }
    gs_lut_factor(t);
    t->refs = 1;
    return t;
}

gs_lut_table *gs_lut_table_acquire(const int32_t *table)
{
    pthread_mutex_lock(&cache_lock);
    for (int i = 0; i < GS_LUT_CACHE; ++i) {
        gs_lut_table *t = cache[i];
        if (t && memcmp(t->table, table, sizeof t->table) == 0) {
            ++t->refs;
            memmove(cache + 1, cache, (size_t)i * sizeof cache[0]); /* move to front */
            cache[0] = t;
            pthread_mutex_unlock(&cache_lock);
            return t;
        }
    }
    pthread_mutex_unlock(&cache_lock);

    gs_lut_table *t = table_build(table); /* outside the lock: ~100 us */
    if (!t) return NULL;
    pthread_mutex_lock(&cache_lock);
    gs_lut_table *evicted = cache[GS_LUT_CACHE - 1];
    memmove(cache + 1, cache, (GS_LUT_CACHE - 1) * sizeof cache[0]);
    cache[0] = t;
    t->refs = 2; /* the cache's reference + the caller's */
    int free_evicted = evicted && --evicted->refs == 0;
    pthread_mutex_unlock(&cache_lock);
    if (free_evicted) table_free(evicted);
    return t;
}

void gs_lut_table_release(gs_lut_table *t)
{
    if (!t) return;
    pthread_mutex_lock(&cache_lock);
    int last = --t->refs == 0;
    pthread_mutex_unlock(&cache_lock);
    if (last) table_free(t);
}

/* ------------------------------------------------------------------------------------------------
 * Dispatch
 * ------------------------------------------------------------------------------------------------ */

/* Each path's routines; a path runs only on a CPU gs_isa() found able to. */

static int quantize_span_scalar(const float *src, int64_t n, const double *scale, const double *recip,
                                const int32_t *zero, int per_element, int is_signed, uint8_t *dst)
{
    (void)recip; /* the scalar loop divides */
    return gs_quantize_span_scalar(src, n, scale, zero, per_element, is_signed, dst);
}

static int64_t scratch_scalar(const gs_lut_table *t, int64_t k, int64_t rows)
{
    (void)t, (void)k, (void)rows;
    return (int64_t)GS_LUT_COLS * (4 + 8) + 64;
}

static const gs_lut_ops ops_scalar = {
    .kernel = gs_lut_kernel_scalar,
    .kernel_few_rows = gs_lut_kernel_scalar,
    .scratch = scratch_scalar,
    .quantize_span = quantize_span_scalar,
    .range_span = gs_range_span_scalar,
    .epilogue_rows = gs_epilogue_rows_scalar,
    .factored_map = gs_factored_map_scalar,
    .quantize_map = gs_quantize_map_scalar,
    .factored_epilogue_row = gs_factored_epilogue_row_scalar,
};

#if GS_LUT_X86
static const gs_lut_ops ops_avx2 = {
    .kernel = gs_lut_kernel_avx2,
    .kernel_few_rows = gs_lut_kernel_gather_avx2, /* its expansion would not pay (GS_LUT_GATHER_ROWS) */
    .scratch = gs_lut_scratch_avx2,
    .quantize_span = gs_quantize_span_avx2,
    .range_span = gs_range_span_avx2,
    .epilogue_rows = gs_epilogue_rows_avx2,
    .factored_map = gs_factored_map_avx2,
    .quantize_map = gs_quantize_map_avx2,
    .factored_epilogue_row = gs_factored_epilogue_row_avx2,
};

static int64_t scratch_avx512(const gs_lut_table *t, int64_t k, int64_t rows)
{
    (void)t, (void)rows;
    return (int64_t)GS_LUT_ROWS * (4 + 8 * 8) + 64 + (k > 0 ? k : 1) * 18 + 64;
}

static const gs_lut_ops ops_avx512 = {
    .kernel = gs_lut_kernel_avx512,
    .kernel_few_rows = gs_lut_kernel_avx512,
    .scratch = scratch_avx512,
    .quantize_span = gs_quantize_span_avx512,
    .range_span = gs_range_span_avx512,
    .epilogue_rows = gs_epilogue_rows_avx512,
    .factored_map = gs_factored_map_avx2, /* no 16-lane loop of its own: the 8-lane gathers */
    .quantize_map = gs_quantize_map_avx512,
    .factored_epilogue_row = gs_factored_epilogue_row_avx512,
};
#endif

const gs_lut_ops *gs_lut_ops_for(gs_isa_level isa)
{
#if GS_LUT_X86
    if (isa == GS_ISA_AVX512) return &ops_avx512;
    if (isa == GS_ISA_AVX2) return &ops_avx2;
#else
    (void)isa;
#endif
    return &ops_scalar;
}

/* The avx512 kernel needs byte planes (table span < 2^24); avx2 needs 8-term int32 runs. */
static gs_isa_level effective(gs_isa_level isa, const gs_lut_table *t)
{
    if (isa == GS_ISA_AVX512 && t->planes == 0) isa = GS_ISA_AVX2;
    if (isa == GS_ISA_AVX2 && t->kblock < 8 && !t->tt16) isa = GS_ISA_SCALAR;
    return isa;
}

gs_lut_shape gs_lut_job_shape(gs_isa_level isa, const gs_lut_table *t)
{
    gs_lut_shape s = {GS_LUT_ROWS, GS_LUT_COLS};
    if (gs_lut_uses_factors(t))
        s.cols = GS_LUT_FACTORED_COLS; /* the mapped activations serve more columns */
    else if (t && effective(isa, t) == GS_ISA_AVX2)
        s.rows = 4 * GS_LUT_ROWS, s.cols = 64;
    return s;
}

int64_t gs_lut_scratch_bytes(gs_isa_level isa, const gs_lut_table *t, int64_t k, int64_t rows)
{
    if (gs_lut_uses_factors(t)) return gs_lut_scratch_factored(k, rows, GS_LUT_FACTORED_COLS);
    return gs_lut_ops_for(effective(isa, t))->scratch(t, k, rows);
}

int gs_lut_pairs_fused(gs_isa_level isa, const gs_lut_table *t)
{
    if (gs_lut_uses_factors(t)) return !t->zero_column; /* g(0) = 0: each pair's g difference is exact */
    return effective(isa, t) == GS_ISA_AVX512 && t->planes <= 2 && t->zero_code_free && !t->zero_column;
}

void gs_lut_run(gs_isa_level isa, const gs_lut_args *args)
{
    if (args->rows <= 0 || args->ncols <= 0) return;
    if (args->k == 0) {
        for (int64_t r = 0; r < args->rows; ++r)
            memset(args->acc + r * args->ldacc, 0, (size_t)args->ncols * sizeof(int64_t));
        return;
    }
    if (gs_lut_uses_factors(args->t)) {
        gs_lut_kernel_factored(args);
        return;
    }
    const gs_lut_ops *ops = gs_lut_ops_for(effective(isa, args->t));
    if (args->rows <= GS_LUT_GATHER_ROWS)
        ops->kernel_few_rows(args);
    else
        ops->kernel(args);
}
