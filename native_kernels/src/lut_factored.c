/*
 * lut_factored.c -- tables whose products factor exactly, run as a float GEMM.
 *
 * A multiplier that approximates each operand on its own and then multiplies exactly (DRUM, operand
 * truncation, the exact product itself) has a table of rank 1: T[a][b] = f(a) * g(b) for integer
 * vectors f and g.  Then every sum the table kernels compute is a GEMM of the mapped operands,
 *     sum_k T[a_k][b_k] = sum_k f(a_k) * g(b_k),
 * which OpenBLAS's float32 GEMM does several times faster than any table look-up can.  It is exact:
 * f(a) and g(b) are integers, so is every product, and each GEMM covers a run of k short enough
 * (`fkblock`) that the sum of the terms' magnitudes stays <= 2^24 -- every partial sum, in whatever
 * order the GEMM adds them, is an integer float32 holds exactly.  The runs' sums are added in int64,
 * so the result is the table kernels' int64 sums bit for bit.
 *
 * gs_lut_factor finds the factors when a table is prepared (lut_table.c); gs_lut_run sends the
 * prepared table's products here while factoring is on (GRAPHSWAP_TABLE_FACTORING, or
 * graphswap_set_table_factoring; tests switch it off to run the table kernels on the same tables).
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <cblas.h>

#include "lut_internal.h"

#define GS_FACTORED_MAX_RUN 512 /* k per GEMM at most: bounds the scratch (F and G of one run) */

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static int64_t gcd64(int64_t a, int64_t b)
{
    a = a < 0 ? -a : a, b = b < 0 ? -b : b;
    while (b) {
        const int64_t r = a % b;
        a = b, b = r;
    }
    return a;
}

void gs_lut_factor(gs_lut_table *t)
{
    t->factored = 0;
    const int64_t maxabs = -(int64_t)t->tmin > (int64_t)t->tmax ? -(int64_t)t->tmin : (int64_t)t->tmax;
    if (maxabs > (1 << 24)) return; /* a product float32 may not hold exactly */
    int a0 = -1, b0 = -1;
    for (int i = 0; i < 65536 && a0 < 0; ++i)
        if (t->table[i] != 0) a0 = i >> 8, b0 = i & 255;
    int64_t f[256], g[256];
    if (a0 < 0) { /* the all-zero table: 0 * 0 */
        memset(f, 0, sizeof f), memset(g, 0, sizeof g);
    } else {
        /* g: row a0 divided by its entries' gcd (a primitive vector); every row of a rank-1 integer
         * table is then an integer multiple of g, f(a) = T[a][b0] / g(b0) */
        int64_t d = 0;
        for (int b = 0; b < 256; ++b) d = gcd64(d, t->table[(a0 << 8) | b]);
        for (int b = 0; b < 256; ++b) g[b] = t->table[(a0 << 8) | b] / d;
        for (int a = 0; a < 256; ++a) {
            const int64_t v = t->table[(a << 8) | b0];
            if (v % g[b0] != 0) return;
            f[a] = v / g[b0];
        }
        for (int a = 0; a < 256; ++a)
            for (int b = 0; b < 256; ++b)
                if (f[a] * g[b] != (int64_t)t->table[(a << 8) | b]) return;
    }
    for (int i = 0; i < 256; ++i) t->fa[i] = (float)f[i], t->fb[i] = (float)g[i];
    t->fkblock = maxabs == 0 ? GS_FACTORED_MAX_RUN : min64((1 << 24) / maxabs, GS_FACTORED_MAX_RUN);
    t->factored = 1;
}

/* ---- the switch ---- */

static int factoring_state = -1; /* -1: not read from the environment yet */

static int factoring_from_env(void)
{
    const char *env = getenv("GRAPHSWAP_TABLE_FACTORING");
    if (!env) return 1;
    return !(strcmp(env, "0") == 0 || strcmp(env, "off") == 0 || strcmp(env, "no") == 0 ||
             strcmp(env, "false") == 0);
}

int gs_table_factoring(void)
{
    int v = __atomic_load_n(&factoring_state, __ATOMIC_ACQUIRE);
    if (v < 0) {
        v = factoring_from_env();
        __atomic_store_n(&factoring_state, v, __ATOMIC_RELEASE);
    }
    return v;
}

GRAPHSWAP_EXPORT int32_t graphswap_set_table_factoring(int32_t enabled)
{
    __atomic_store_n(&factoring_state, enabled < 0 ? factoring_from_env() : enabled != 0, __ATOMIC_RELEASE);
    return GRAPHSWAP_OK;
}

GRAPHSWAP_EXPORT int32_t graphswap_lut_table_factored(const int32_t *table)
{
    if (!table) return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, "graphswap_lut_table_factored: table is NULL");
    gs_lut_table *t = gs_lut_table_acquire(table);
    if (!t) return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, "graphswap_lut_table_factored: cannot allocate the prepared table");
    const int32_t used = gs_lut_uses_factors(t);
    gs_lut_table_release(t);
    return used;
}

/* ---- the kernel ---- */

int64_t gs_lut_scratch_factored(int64_t k, int64_t rows, int64_t cols)
{
    const int64_t R = (rows + 63) / 64 * 64, kc = min64(k > 0 ? k : 1, GS_FACTORED_MAX_RUN);
    return (kc * R + kc * cols + R * cols) * (int64_t)sizeof(float) + 3 * 64;
}

static inline float *align64(void *p)
{
    return (float *)(((uintptr_t)p + 63) & ~(uintptr_t)63);
}

void gs_lut_kernel_factored(const gs_lut_args *A)
{
    const gs_lut_table *t = A->t;
    const int64_t k = A->k, rows = A->rows, nc = A->ncols;
    const int64_t R = (rows + 63) / 64 * 64, groups = R / 64;
    const int64_t run = min64(k, t->fkblock);
    float *F = align64(A->scratch);                /* run x R: F[kk * R + r] = f(a[r, k0 + kk]) */
    float *G = align64(F + run * R);               /* run x nc: G[kk * nc + c] = g(b[k0 + kk, c]) */
    float *C = align64(G + run * nc);              /* rows x nc: one run's sums */
    for (int64_t k0 = 0; k0 < k; k0 += run) {
        const int64_t kc = min64(run, k - k0);
        for (int64_t gi = 0; gi < groups; ++gi)
            for (int64_t kk = 0; kk < kc; ++kk) {
                const uint8_t *src = A->a + (gi * k + k0 + kk) * 64;
                float *dst = F + kk * R + gi * 64;
                for (int l = 0; l < 64; ++l) dst[l] = t->fa[src[l]];
            }
        for (int64_t kk = 0; kk < kc; ++kk) {
            const uint8_t *b = A->b + (k0 + kk) * A->ldb;
            float *g = G + kk * nc;
            if (A->pairs) /* sign-magnitude: g(magnitude) of the column that holds it, negated for w < 0 */
                for (int64_t c = 0; c < nc; ++c) g[c] = t->fb[b[2 * c]] - t->fb[b[2 * c + 1]];
            else
                for (int64_t c = 0; c < nc; ++c) g[c] = t->fb[b[c]];
        }
        scipy_cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)rows, (blasint)nc, (blasint)kc,
                          1.0f, F, (blasint)R, G, (blasint)nc, 0.0f, C, (blasint)nc);
        for (int64_t r = 0; r < rows; ++r) {
            int64_t *acc = A->acc + r * A->ldacc;
            const float *c = C + r * nc;
            if (k0 == 0)
                for (int64_t j = 0; j < nc; ++j) acc[j] = (int64_t)c[j];
            else
                for (int64_t j = 0; j < nc; ++j) acc[j] += (int64_t)c[j];
        }
    }
}

/* ---- whole layers through the float kernels ----
 * Where a layer's whole reduction stays exact in float32 -- k terms of at most
 * max|f(a) - shift| * max|g(b)|, summing to <= 2^24 -- the fused entry points skip the job kernels
 * altogether: the activations' codes become the float image f(code) - shift (shift = f(pad code)
 * for a padded convolution, so padding is 0 as in a float convolution, and shift * sum g(w) is
 * added back per column), the weights' codes become g(code), and graphswap_matmul_f32 /
 * graphswap_conv2d_f32 -- the exact kernels, with all their layouts and threads -- compute the
 * sums.  The epilogue (gs_factored_epilogue) turns them into outputs in float64, where the
 * corrected sum of integers below 2^53 is exact: gs_epilogue_value's result, bit for bit. */

int gs_factored_float_fits(const gs_lut_table *t, int64_t k, int shift_code)
{
    if (!gs_lut_uses_factors(t) || k <= 0) return 0;
    const float shift = shift_code < 0 ? 0.0f : t->fa[shift_code];
    double fmax = 0.0, gmax = 0.0;
    for (int i = 0; i < 256; ++i) {
        const double fv = fabs((double)t->fa[i] - (double)shift), gv = fabs((double)t->fb[i]);
        fmax = fv > fmax ? fv : fmax;
        gmax = gv > gmax ? gv : gmax;
    }
    return fmax * gmax * (double)k <= 16777216.0;
}

void gs_factored_map(const gs_lut_table *t, const uint8_t *codes, int64_t n, int shift_code, float *out)
{
    const float shift = shift_code < 0 ? 0.0f : t->fa[shift_code];
    float mapped[256];
    for (int i = 0; i < 256; ++i) mapped[i] = t->fa[i] - shift; /* exact: integers below 2^25 */
    const int64_t chunk = 1 << 16, chunks = (n + chunk - 1) / chunk;
    const gs_lut_ops *ops = gs_lut_ops_for(gs_isa());
    const int nt = gs_threads_for((double)n, 1 << 18);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t c = 0; c < chunks; ++c) {
        const int64_t i0 = c * chunk, len = n - i0 < chunk ? n - i0 : chunk;
        ops->factored_map(mapped, codes + i0, len, out + i0);
    }
}

void gs_factored_map_scalar(const float *mapped, const uint8_t *codes, int64_t n, float *out)
{
    for (int64_t i = 0; i < n; ++i) out[i] = mapped[codes[i]];
}

int gs_quantize_map_scalar(const float *src, int64_t n, double scale, double recip, int32_t zero, int is_signed,
                           const float *mapped, float *out, uint8_t *codes)
{
    (void)recip; /* gs_quant divides */
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
        const float v = src[i];
        uint8_t code;
        if (!gs_finite(v)) {
            code = (uint8_t)zero;
            bad = 1;
        } else {
            code = is_signed ? gs_quant_s8(v, scale) : gs_quant_u8(v, scale, (double)zero);
        }
        out[i] = mapped[code];
        if (codes) codes[i] = code;
    }
    return bad;
}

int gs_quantize_map(const gs_lut_table *t, const float *src, int64_t n, const gs_qparams *q, int shift_code,
                    float *out, uint8_t *codes)
{
    const float shift = shift_code < 0 ? 0.0f : t->fa[shift_code];
    float mapped[256];
    for (int i = 0; i < 256; ++i) mapped[i] = t->fa[i] - shift;
    const gs_isa_level isa = gs_isa();
    const double recip = gs_recip(q->scale);
    if (q->levels == 0)
        return gs_lut_ops_for(isa)->quantize_map(src, n, q->scale, recip, q->zero, q->is_signed, mapped, out, codes);
    /* N-bit activations: the codes first, in pieces that stay in cache */
    uint8_t piece[4096];
    int bad = 0;
    for (int64_t i0 = 0; i0 < n; i0 += (int64_t)sizeof piece) {
        const int64_t len = n - i0 < (int64_t)sizeof piece ? n - i0 : (int64_t)sizeof piece;
        uint8_t *c = codes ? codes + i0 : piece;
        bad |= gs_quantize_activations(isa, src + i0, len, q, &recip, c);
        for (int64_t i = 0; i < len; ++i) out[i0 + i] = mapped[c[i]];
    }
    return bad;
}

void gs_factored_filter(const gs_lut_table *t, const gs_wquant *w, int64_t K, int64_t N, int sm, float *g,
                        double *gsum)
{
    for (int64_t j = 0; j < N; ++j) gsum[j] = 0.0;
    for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < N; ++j) {
            float v;
            if (sm) { /* the magnitude's g, with the weight's sign */
                const int m = w->q[k * 2 * N + 2 * j] | w->q[k * 2 * N + 2 * j + 1];
                v = (float)w->sign[k * N + j] * t->fb[m];
            } else {
                v = t->fb[w->q[k * N + j]];
            }
            g[k * N + j] = v;
            gsum[j] += (double)v;
        }
}

void gs_factored_base(const gs_epilogue *e, const double *gsum, float shift, int64_t n, double *base)
{
    for (int64_t j = 0; j < n; ++j) {
        base[j] = (double)shift * gsum[j];
        if (e->is_unsigned) base[j] += (double)(e->K * e->za * e->zero[j] - e->za * e->colsum[j]);
    }
}

/* One row: y[j] = float32(scale[j] * (float64(y[j]) + z[j])) (+ bias[j]). */
void gs_factored_epilogue_row_scalar(const double *scale, const double *z, const float *bias, float *y, int64_t n)
{
    if (bias)
        for (int64_t j = 0; j < n; ++j) y[j] = (float)(scale[j] * ((double)y[j] + z[j])) + bias[j];
    else
        for (int64_t j = 0; j < n; ++j) y[j] = (float)(scale[j] * ((double)y[j] + z[j]));
}

int32_t gs_factored_epilogue(const char *fn, const gs_epilogue *e, const double *base, const int64_t *sums,
                             int64_t groups, int64_t rows, int64_t n, float *out)
{
    const int nt = gs_threads_for((double)rows * (double)n, 1 << 16);
    /* the scales, NaN for columns with a non-finite weight (NaN times anything stays NaN), and one
     * row of corrections per thread */
    double *scale = gs_alloc(((int64_t)nt + 1) * n * (int64_t)sizeof(double));
    if (!scale) return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, "%s: cannot allocate the epilogue's row", fn);
    for (int64_t j = 0; j < n; ++j) scale[j] = e->bad[j] ? __builtin_nan("") : e->sasb[j];
    const gs_lut_ops *ops = gs_lut_ops_for(gs_isa());
    const int64_t cog = n / groups;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
#ifdef _OPENMP
        const int64_t me = omp_get_thread_num(), team = omp_get_num_threads();
#else
        const int64_t me = 0, team = 1;
#endif
        double *z = scale + (me + 1) * n;
        for (int64_t r = rows * me / team; r < rows * (me + 1) / team; ++r) {
            if (sums)
                for (int64_t j = 0; j < n; ++j)
                    z[j] = base[j] - (double)e->zero[j] * (double)sums[r * groups + j / cog];
            const double *zr = sums ? z : base;
            ops->factored_epilogue_row(scale, zr, e->bias, out + r * n, n);
        }
    }
    gs_free(scale);
    return GRAPHSWAP_OK;
}
