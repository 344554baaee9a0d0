/*
 * lut_internal.h -- the table-driven ("LUT") GEMM core shared by the integer entry points
 * (graphswap_lut_matmul, graphswap_lut_conv2d) and the fused float ones (graphswap_lut_matmul_f32,
 * graphswap_lut_conv2d_f32).  Not part of the ABI (hidden symbols).
 *
 * One product is  acc[r, j] = sum_k T[(a[r, k] << 8) | b[k, j]]  for a block of at most
 * GS_LUT_ROWS rows and a range of columns, computed by one of three per-ISA kernels:
 *   scalar  (lut_scalar.c)  row by row, one 1 KiB table row per (r, k) swept over the columns;
 *   avx2    (lut_avx2.c)    expanded weights: E[k][code][j] = T[code][b[k, j]] built per block of
 *                           8 k x 32 columns by 8x8 transposes of the transposed table, then every
 *                           row is vector adds of E rows; jobs of few rows, which would not pay
 *                           the expansion back, gather from the table rows (lut_gather_avx2.c);
 *   avx512  (lut_avx512.c)  weight-stationary VBMI lookups: one weight code's 256-entry column of
 *                           (T - min T), split into byte planes, sits in 4 zmm registers per plane,
 *                           and vpermi2b looks up 64 activations at once.
 * All three give identical int64 sums (exact integer arithmetic).  Every per-ISA routine (kernels,
 * quantizers, epilogues) is reached only through the function table of the path in use,
 * gs_lut_ops_for (lut_table.c): an ISA file calls its own functions and ISA-neutral helpers, never
 * another ISA file's, so each file's target attributes cover all it runs
 * (tests/test_architecture_c.py).  A table that factors exactly,
 * T[a][b] = f(a) g(b), skips them: its sums are float32 GEMMs of f(a) and g(b) on OpenBLAS, in
 * runs of k short enough to stay exact (lut_factored.c) -- the same int64 sums.
 *
 * Activations reach the kernels packed: a block's rows in groups of 64, k-major inside a group,
 *     a[(g * k + kk) * 64 + lane]   for row r = 64 g + lane
 * (lanes past the block's rows hold code 0 and are ignored).  Weights come both row-major
 * (b[kk * ldb + j]) and transposed (bt[j * ldbt + kk]).
 */
#ifndef GRAPHSWAP_LUT_INTERNAL_H
#define GRAPHSWAP_LUT_INTERNAL_H

#include <string.h>

#include "internal.h"

/* Where the avx2 / avx512 files are compiled in (elsewhere only the scalar path exists); the ISA
 * files test the same macros before their target pragmas. */
#if defined(__x86_64__) || defined(__i386__)
#define GS_LUT_X86 1
#else
#define GS_LUT_X86 0
#endif

#define GS_LUT_ROWS 256  /* rows per block (4 groups of 64) */
#define GS_LUT_COLS 256  /* columns per job */

/* A multiplier table prepared for the kernels; shared, read-only, reference-counted (lut_table.c). */
typedef struct gs_lut_table {
    int32_t table[65536];     /* the caller's table (the cache key) */
    int32_t tt[65536];        /* transposed: tt[(b << 8) | a] = table[(a << 8) | b] */
    int32_t tmin, tmax;
    int64_t kblock;           /* longest run of terms whose int32 sum cannot overflow (>= 1) */
    int planes;               /* byte planes of (T - tmin): 1..3, or 0 if the span needs more */
    uint8_t *plane_data;      /* [256 b][planes][256 a]: byte p of T[a][b] - tmin (NULL if planes == 0) */
    uint16_t *tt16;           /* [256 b][256 a]: T[a][b] - tmin if planes <= 2 (else NULL) */
    int zero_code_free;       /* T[a][0] == tmin for every a: terms with weight code 0 add nothing to
                               * the sums of T - tmin, so the avx512 kernel skips them (half the
                               * terms of sign-magnitude weights' two columns; pruned weights) */
    int zero_column;          /* some T[a][0] != 0: sign-magnitude sums need gs_sm_combine's terms */
    int factored;             /* T[a][b] == fa[a] * fb[b] exactly, integer factors (lut_factored.c) */
    float fa[256], fb[256];   /* the factors (when factored) */
    int64_t fkblock;          /* k per float32 GEMM whose partial sums stay exact integers (<= 2^24) */
    int refs;                 /* users + 1 while cached */
} gs_lut_table;

/* Prepared table for `table` (from the cache, or built); NULL on allocation failure.  Release
 * with gs_lut_table_release. */
gs_lut_table *gs_lut_table_acquire(const int32_t *table);
void gs_lut_table_release(gs_lut_table *t);

typedef struct gs_lut_args {
    const gs_lut_table *t;
    const uint8_t *a;      /* packed block (see above) */
    int64_t rows, k;
    const uint8_t *b;      /* b[kk * ldb + j], j < ncols (already offset to the first column) */
    int64_t ldb;
    const uint8_t *bt;     /* bt[j * ldbt + kk] */
    int64_t ldbt;
    int64_t ncols;
    int64_t *acc;          /* acc[r * ldacc + j] = sum, overwritten */
    int64_t ldacc;
    void *scratch;         /* gs_lut_scratch_bytes bytes, 64-byte aligned */
    int pairs;             /* sign-magnitude pairs (only where gs_lut_pairs_fused): bt holds 2 ncols
                            * columns, acc[r, j] = sum of column 2j - sum of column 2j + 1 */
} gs_lut_args;

/* Rows and columns per job for the path in use (rows a multiple of 64): the avx2 kernel amortises
 * its weight expansion over the rows, so it takes more of them. */
typedef struct gs_lut_shape {
    int64_t rows, cols;
} gs_lut_shape;
gs_lut_shape gs_lut_job_shape(gs_isa_level isa, const gs_lut_table *t);

/* Scratch one kernel call of at most `rows` rows needs for the path in use. */
int64_t gs_lut_scratch_bytes(gs_isa_level isa, const gs_lut_table *t, int64_t k, int64_t rows);

/* Whether the kernel of `isa` subtracts sign-magnitude column pairs itself (gs_lut_args.pairs): the
 * avx512 kernel, for tables of <= 2 byte planes whose code-0 column is all 0 (so skipped terms add
 * nothing and gs_sm_combine has no terms to add). */
int gs_lut_pairs_fused(gs_isa_level isa, const gs_lut_table *t);

/* Runs the kernel of `isa` (falling back to a narrower one when the table does not suit it). */
void gs_lut_run(gs_isa_level isa, const gs_lut_args *args);

/* Factored tables (lut_factored.c): gs_lut_factor sets t->factored / fa / fb / fkblock for a table
 * being prepared; gs_table_factoring() says whether factored tables take the float GEMM
 * (GRAPHSWAP_TABLE_FACTORING, graphswap_set_table_factoring); gs_lut_kernel_factored computes a
 * job's sums as float32 GEMMs of the mapped operands (pairs fused), in gs_lut_scratch_factored bytes. */
void gs_lut_factor(gs_lut_table *t);
int gs_table_factoring(void);
void gs_lut_kernel_factored(const gs_lut_args *args);
int64_t gs_lut_scratch_factored(int64_t k, int64_t rows, int64_t cols);
#define GS_LUT_FACTORED_COLS 512 /* columns per job of the factored path (rows: GS_LUT_ROWS) */

/* Whether t's products go through gs_lut_kernel_factored. */
static inline int gs_lut_uses_factors(const gs_lut_table *t)
{
    return t && t->factored && gs_table_factoring();
}

/* per-ISA kernels (through gs_lut_ops_for only) */
void gs_lut_kernel_scalar(const gs_lut_args *args);
void gs_lut_kernel_avx2(const gs_lut_args *args);
void gs_lut_kernel_avx512(const gs_lut_args *args);
int64_t gs_lut_scratch_avx2(const gs_lut_table *t, int64_t k, int64_t rows);
/* Jobs of at most GS_LUT_GATHER_ROWS rows on the avx2 path look their products up by gathers from
 * the table rows (lut_gather_avx2.c): the expanded-weights kernel pays its expansion back only
 * over more rows than that.  Measured on an Intel Xeon (avx2 path, k = 64, n = 256): gathers
 * 2.2-2.7 G products/s at 16-64 rows, the expansion 0.6 / 1.2 / 1.8 / 2.8 at 16 / 32 / 48 / 64
 * rows; 32 leaves room for AMD's slower gathers (docs/BENCHMARKS.md). */
#define GS_LUT_GATHER_ROWS 32
void gs_lut_kernel_gather_avx2(const gs_lut_args *args);

/* In-register transpose of an 8 x 8 byte block: x[i] byte j <-> x[j] byte i. */
static inline void gs_transpose8x8_bytes(uint64_t x[8])
{
    for (int i = 0; i < 8; i += 2) {
        const uint64_t t = ((x[i] >> 8) ^ x[i + 1]) & 0x00FF00FF00FF00FFull;
        x[i + 1] ^= t, x[i] ^= t << 8;
    }
    for (int i = 0; i < 8; i += 4)
        for (int j = 0; j < 2; ++j) {
            const uint64_t t = ((x[i + j] >> 16) ^ x[i + j + 2]) & 0x0000FFFF0000FFFFull;
            x[i + j + 2] ^= t, x[i + j] ^= t << 16;
        }
    for (int j = 0; j < 4; ++j) {
        const uint64_t t = ((x[j] >> 32) ^ x[j + 4]) & 0x00000000FFFFFFFFull;
        x[j + 4] ^= t, x[j] ^= t << 32;
    }
}

/* Stores 8 rows of k codes - row i at tmp + i * k8 (k8 = k rounded up to 8, the pad zero) - into
 * a packed block at d (the first row's byte of k = 0; consecutive k are 64 bytes apart) by 8 x 8
 * byte transposes. */
static inline void gs_pack_rows8(const uint8_t *tmp, int64_t k8, int64_t k, uint8_t *d)
{
    for (int64_t k0 = 0; k0 < k; k0 += 8) {
        uint64_t x[8];
        for (int i = 0; i < 8; ++i) memcpy(&x[i], tmp + i * k8 + k0, 8);
        gs_transpose8x8_bytes(x);
        const int64_t nk = k - k0 < 8 ? k - k0 : 8;
        for (int64_t j = 0; j < nk; ++j) memcpy(d + (k0 + j) * 64, &x[j], 8);
    }
}

/* Bytes of a packed block of `rows` rows (rows rounded up to 64). */
static inline int64_t gs_lut_packed_bytes(int64_t rows, int64_t k)
{
    return ((rows + 63) / 64) * 64 * k;
}

/* ---- quantization (lut_quant.c): the formulas of graphswap_kernels.h, bit for bit numpy's ---- */

/* rint (round half to even) for |x| <= 2^51, without libm (baseline x86-64 has no roundsd). */
static inline double gs_rint(double x)
{
    const double magic = 6755399441055744.0; /* 1.5 * 2^52 */
    return (x + magic) - magic;
}

static inline int gs_finite(float x)
{
    union { float f; uint32_t u; } v = {x};
    return (v.u & 0x7f800000u) != 0x7f800000u;
}

/* code of finite t: clip(rint(t / s) + z, 0, 255) */
static inline uint8_t gs_quant_u8(float t, double s, double z)
{
    double v = (double)t / s;
    v = v > 512.0 ? 512.0 : (v < -512.0 ? -512.0 : v); /* t/s may overflow; clipped anyway */
    double q = gs_rint(v) + z;
    q = q < 0.0 ? 0.0 : (q > 255.0 ? 255.0 : q);
    return (uint8_t)(int)q;
}

/* code of finite t: two's-complement byte of clip(rint(t / s), -127, 127) */
static inline uint8_t gs_quant_s8(float t, double s)
{
    double v = (double)t / s;
    v = v > 512.0 ? 512.0 : (v < -512.0 ? -512.0 : v);
    double q = gs_rint(v);
    q = q < -127.0 ? -127.0 : (q > 127.0 ? 127.0 : q);
    return (uint8_t)(int8_t)(int)q;
}

/* Quantization of one tensor (or channel): code = quant(t) for finite t, `zero` for non-finite. */
typedef struct gs_qparams {
    int is_signed;
    double scale;
    int32_t zero;   /* 0 for signed */
    int32_t levels; /* activations only: 0 = 8-bit codes (255 / 127); else the largest code of
                     * N-bit activations (an Nx8 multiplier): 2^N - 1 unsigned, 2^(N-1) - 1 signed */
    int weights_signed; /* activations only: the weights' codes are symmetric int8 (the SIGNED and
                         * SIGNED_UNSIGNED_ACTIVATIONS schemes), else the unsigned scheme's */
} gs_qparams;

static inline uint8_t gs_quant(const gs_qparams *q, float t)
{
    if (!gs_finite(t)) return (uint8_t)q->zero;
    return q->is_signed ? gs_quant_s8(t, q->scale) : gs_quant_u8(t, q->scale, (double)q->zero);
}

/* min / max of the finite values (+inf / -inf if none), and whether any value is not finite;
 * parallel for large n. */
void gs_range_f32(const float *x, int64_t n, float *lo, float *hi, int *any_bad);

/* Parameters from a finite range (lo = +inf, hi = -inf when there are no finite values). */
gs_qparams gs_qparams_dynamic(int is_signed, float lo, float hi);

/* The activation parameters of a range with act's signedness and levels (gs_quant_check's act). */
gs_qparams gs_qparams_activation(const gs_qparams *act, float lo, float hi);

/* gs_quantize_span with one scale / zero point for activations: 8-bit codes per ISA, or (act->levels
 * != 0: N-bit activations of an Nx8 multiplier) codes clipped to act->levels by a scalar loop. */
int gs_quantize_activations(gs_isa_level isa, const float *src, int64_t n, const gs_qparams *act,
                            const double *recip, uint8_t *dst);

/* The weight width of graphswap_lut_quant.weight_bits (its low byte; the second byte holds the
 * activation width of an Nx8 multiplier). */
static inline int gs_weight_bits(int32_t weight_bits) { return (int)(weight_bits & 0xff); }

/* Vectorised quantization, per ISA (bit for bit gs_quant): dst[i] = code of src[i], i < n, with
 * scale[i] / zero[i] / recip[i] (per_element != 0) or scale[0] / zero[0] / recip[0]; non-finite
 * values get the zero point.  recip = gs_recip(scale) lets the vector paths multiply instead of
 * divide (see gs_recip).  Returns 1 if any src[i] is not finite. */
int gs_quantize_span(gs_isa_level isa, const float *src, int64_t n, const double *scale,
                     const double *recip, const int32_t *zero, int per_element, int is_signed,
                     uint8_t *dst);
int gs_quantize_span_scalar(const float *src, int64_t n, const double *scale, const int32_t *zero,
                            int per_element, int is_signed, uint8_t *dst);
/* the vector ones: through gs_lut_ops_for only */
int gs_quantize_span_avx2(const float *src, int64_t n, const double *scale, const double *recip,
                          const int32_t *zero, int per_element, int is_signed, uint8_t *dst);
int gs_quantize_span_avx512(const float *src, int64_t n, const double *scale, const double *recip,
                            const int32_t *zero, int per_element, int is_signed, uint8_t *dst);

/* 1/s for the vector quantizers, or NaN when s is outside [1e-300, 1e300] (then they divide).
 * They compute v = t * (1/s); v differs from the correctly rounded t / s by at most ~3 * 2^-53 |v|,
 * so rint(v) == rint(fl(t / s)) unless v lies within that of a half-integer: lanes within
 * 2^-48 |v| of one (or NaN / inf) are divided instead, keeping numpy's results bit for bit. */
static inline double gs_recip(double s)
{
    return (s >= 1e-300 && s <= 1e300) ? 1.0 / s : __builtin_nan("");
}

/* min / max over the finite values of src[0..n) folded into *lo / *hi; returns 1 if any is not
 * finite (scalar: lut_quant.c; the vector ones through gs_lut_ops_for only). */
int gs_range_span_scalar(const float *src, int64_t n, float *lo, float *hi);
int gs_range_span_avx2(const float *src, int64_t n, float *lo, float *hi);
int gs_range_span_avx512(const float *src, int64_t n, float *lo, float *hi);

/* Epilogue of one output row: out[j] = float32(sasb[j] * float64(c_j)) (+ bias[j]), NaN where
 * bad[j], with c_j = acc[j] - zero[j] * rsum - za * colsum[j] + K * za * zero[j] (unsigned) or
 * acc[j] (signed) -- exact int64 arithmetic, then one rounding to float64 and one to float32. */
typedef struct gs_epilogue {
    const int32_t *zero;
    const int64_t *colsum;
    const double *sasb;
    const float *bias;    /* or NULL */
    const uint8_t *bad;
    int64_t za, K;
    int is_unsigned;
} gs_epilogue;

static inline float gs_epilogue_value(const gs_epilogue *e, int64_t j, int64_t v, int64_t rsum)
{
    if (e->is_unsigned) v = v - e->zero[j] * rsum - e->za * e->colsum[j] + e->K * e->za * e->zero[j];
    float y = (float)(e->sasb[j] * (double)v);
    if (e->bias) y += e->bias[j];
    return e->bad[j] ? __builtin_nanf("") : y;
}

/* The epilogue of a block: out[r * ldout + j] (r < rows, j < n) from row r of acc, with the row's
 * code sum rsums[r] (0 when rsums is NULL).  pairs: acc rows hold each column's two sign-magnitude
 * sums (2n per row, gs_wquant_make_sm) and the column's value is acc[2j] - acc[2j + 1]; else n. */
static inline void gs_epilogue_rows_scalar(const gs_epilogue *e, const int64_t *restrict acc, int pairs,
                                           int64_t rows, int64_t n, const int64_t *rsums,
                                           float *restrict out, int64_t ldout)
{
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t rsum = rsums ? rsums[r] : 0;
        for (int64_t j = 0; j < n; ++j) {
            const int64_t v = pairs ? acc[r * 2 * n + 2 * j] - acc[r * 2 * n + 2 * j + 1] : acc[r * n + j];
            out[r * ldout + j] = gs_epilogue_value(e, j, v, rsum);
        }
    }
}

/* the same, vectorised (through gs_lut_ops_for only; gs_epilogue_rows picks the path's) */
void gs_epilogue_rows_avx512(const gs_epilogue *e, const int64_t *acc, int pairs, int64_t rows, int64_t n,
                             const int64_t *rsums, float *out, int64_t ldout);

void gs_epilogue_rows_avx2(const gs_epilogue *e, const int64_t *acc, int pairs, int64_t rows, int64_t n,
                           const int64_t *rsums, float *out, int64_t ldout);

/* Quantized weights: w is K x N row-major (matmul b, or an HWIO filter as taps x out_channels). */
typedef struct gs_wquant {
    uint8_t *q;      /* K x N codes, row-major */
    double *recip;   /* N: gs_recip(scale) */
    uint8_t *qt;     /* N x K codes (transposed) */
    int64_t *colsum; /* N: sum_k q[k, j] */
    double *scale;   /* N */
    int32_t *zero;   /* N */
    uint8_t *bad;    /* N: column has a non-finite value */
    int any_bad;
    int8_t *sign;    /* sign-magnitude only: K x N, -1 where w < 0, else +1 (NULL otherwise) */
} gs_wquant;

/* Returns GRAPHSWAP_OK or GRAPHSWAP_ERR_OUT_OF_MEMORY (gs_fail called with fn).  weight_bits:
 * graphswap_lut_quant.weight_bits (0 or 8 = 8-bit codes; 1..7 = N-bit codes, checked by
 * gs_quant_check). */
int32_t gs_wquant_make(const char *fn, const float *w, int64_t K, int64_t N, int is_signed,
                       int per_channel, int weight_bits, gs_wquant *out);
void gs_wquant_free(gs_wquant *w);

/* Sign-magnitude weights (GRAPHSWAP_WEIGHTS_SIGN_MAGNITUDE): q is K x 2N, the magnitude code of
 * w[k, j] in column 2j when w[k, j] >= 0 (else 0) and in column 2j + 1 when w[k, j] < 0 (else 0),
 * so that acc[2j] - acc[2j+1] = sum_k sign(w) (T[qa, m] - T[qa, 0]); qt is 2N x K; scale, zero
 * (all 0), bad, recip are per logical column j < N, and colsum[j] = sum_k sign(w[k, j]) m[k, j]. */
int32_t gs_wquant_make_sm(const char *fn, const float *w, int64_t K, int64_t N, int per_channel,
                          int weight_bits, gs_wquant *out);

/* The weights' quantization as gs_wquant_make_sm (sm) or gs_wquant_make, through a small cache keyed
 * by the weights' contents and the parameters (lut_wcache.c): the caller owns the result either
 * way (gs_wquant_free). */
int32_t gs_wquant_prepare(const char *fn, const float *w, int64_t K, int64_t N, int sm, int is_signed,
                          int per_channel, int weight_bits, gs_wquant *out);

/* The split sign-magnitude sums of one job, made whole: for each row r < rows, with the physical
 * sums acc2[r * 2 ncols + 2c] (non-negative weights) and [.. + 2c + 1] (negative weights) of the
 * logical columns j0 + c, writes acc[r * ncols + c] = acc2[2c] - acc2[2c + 1]
 * + sum_k sign(w[k, j0 + c]) T[a_rk, 0] (a_rk read from the packed block as gs_lut_args.a; the
 * term is 0 unless the table has T[a, 0] != 0, the only tables gs_lut_run_for_epilogue calls this
 * for).  acc may alias acc2. */
void gs_sm_combine(const gs_lut_table *t, const gs_wquant *w, int64_t N, const uint8_t *packed,
                   int64_t rows, int64_t k, int64_t j0, int64_t ncols, const int64_t *acc2,
                   int64_t *acc);

/* Runs the kernel for a job whose sums go on to the epilogue: a's operands, rows, k and acc (a
 * tile of ncols logical columns, or 2 ncols with sign-magnitude weights) set by the caller; sets
 * ncols, ldacc and pairs.  With sign-magnitude weights (sm) the pairs are subtracted by the kernel
 * where it can (gs_lut_pairs_fused), by gs_sm_combine when code 0 has products to add (the table's
 * zero_column), else left to the epilogue: returns 1 then (gs_epilogue_rows' pairs), 0 when acc
 * holds the logical columns' sums. */
int gs_lut_run_for_epilogue(gs_isa_level isa, gs_lut_args *a, int sm, const gs_wquant *w, int64_t N,
                            int64_t j0, int64_t ncols);

/* Codes of an integer-entry caller (graphswap_lut_matmul / _conv2d): the transposed copy and column
 * sums only. */
int32_t gs_wcodes_make(const char *fn, const uint8_t *b, int64_t K, int64_t N, gs_wquant *out);

/* Whole layers of a factored table through the float kernels (lut_factored.c).
 * gs_factored_float_fits: whether k terms of f(a) - f(shift_code) (shift_code < 0: no shift) times
 * g(b) stay exact in float32 in any order (and factoring is on).
 * gs_factored_map: out[i] = f(codes[i]) - f(shift_code).
 * gs_factored_filter: g[k * N + j] = g of the weight code (sign-magnitude: the sign times g of the
 * magnitude), gsum[j] = its column sums.
 * gs_factored_base: per column, shift * gsum[j] plus the unsigned scheme's zero-point terms.
 * gs_factored_epilogue: in place, out[r, j] (an exact float sum) -> the output of gs_epilogue_value
 * with the window / row code sums sums[r * groups + j / (n / groups)] (NULL: none). */
int gs_factored_float_fits(const gs_lut_table *t, int64_t k, int shift_code);
void gs_factored_map(const gs_lut_table *t, const uint8_t *codes, int64_t n, int shift_code, float *out);
/* Quantizes src (the activation parameters q) and maps each code in the same pass: out[i] =
 * f(code) - f(shift_code), codes[i] = code unless codes is NULL; returns 1 if any src[i] is not
 * finite.  8-bit codes take the path's loop: out[i] = mapped[code of src[i]] (scalar:
 * lut_factored.c; 8 lanes: lut_avx2.c; 16 lanes: lut_avx512.c; the vector ones through
 * gs_lut_ops_for only), the same codes on every path. */
int gs_quantize_map(const gs_lut_table *t, const float *src, int64_t n, const gs_qparams *q, int shift_code,
                    float *out, uint8_t *codes);
int gs_quantize_map_scalar(const float *src, int64_t n, double scale, double recip, int32_t zero, int is_signed,
                           const float *mapped, float *out, uint8_t *codes);
int gs_quantize_map_avx2(const float *src, int64_t n, double scale, double recip, int32_t zero, int is_signed,
                         const float *mapped, float *out, uint8_t *codes);
int gs_quantize_map_avx512(const float *src, int64_t n, double scale, double recip, int32_t zero, int is_signed,
                           const float *mapped, float *out, uint8_t *codes);
void gs_factored_filter(const gs_lut_table *t, const gs_wquant *w, int64_t K, int64_t N, int sm, float *g,
                        double *gsum);
void gs_factored_base(const gs_epilogue *e, const double *gsum, float shift, int64_t n, double *base);
int32_t gs_factored_epilogue(const char *fn, const gs_epilogue *e, const double *base, const int64_t *sums,
                             int64_t groups, int64_t rows, int64_t n, float *out);
/* gs_factored_map's loop: out[i] = mapped[codes[i]] (scalar: lut_factored.c; by 8-lane gathers:
 * lut_avx2.c, which the avx512 path uses too). */
void gs_factored_map_scalar(const float *mapped, const uint8_t *codes, int64_t n, float *out);
void gs_factored_map_avx2(const float *mapped, const uint8_t *codes, int64_t n, float *out);
/* One row of gs_factored_epilogue: y[j] = float32(scale[j] * (float64(y[j]) + z[j])) (+ bias[j])
 * (scalar: lut_factored.c; lut_avx2.c, lut_avx512.c). */
void gs_factored_epilogue_row_scalar(const double *scale, const double *z, const float *bias, float *y, int64_t n);
void gs_factored_epilogue_row_avx2(const double *scale, const double *z, const float *bias, float *y, int64_t n);
void gs_factored_epilogue_row_avx512(const double *scale, const double *z, const float *bias, float *y, int64_t n);

/* ---- run-time dispatch (lut_table.c) ----
 * The routines of one instruction-set path; gs_lut_ops_for(isa) gives the path's table and is
 * the only way shared code reaches an ISA file.  A path without a routine of its own names the
 * narrower one it runs (the avx512 path's factored_map is the avx2 loop). */
typedef struct gs_lut_ops {
    void (*kernel)(const gs_lut_args *args);
    void (*kernel_few_rows)(const gs_lut_args *args); /* jobs of <= GS_LUT_GATHER_ROWS rows */
    int64_t (*scratch)(const gs_lut_table *t, int64_t k, int64_t rows); /* bytes for `kernel` */
    int (*quantize_span)(const float *src, int64_t n, const double *scale, const double *recip,
                         const int32_t *zero, int per_element, int is_signed, uint8_t *dst);
    int (*range_span)(const float *src, int64_t n, float *lo, float *hi);
    void (*epilogue_rows)(const gs_epilogue *e, const int64_t *acc, int pairs, int64_t rows, int64_t n,
                          const int64_t *rsums, float *out, int64_t ldout);
    void (*factored_map)(const float *mapped, const uint8_t *codes, int64_t n, float *out);
    int (*quantize_map)(const float *src, int64_t n, double scale, double recip, int32_t zero, int is_signed,
                        const float *mapped, float *out, uint8_t *codes);
    void (*factored_epilogue_row)(const double *scale, const double *z, const float *bias, float *y, int64_t n);
} gs_lut_ops;

const gs_lut_ops *gs_lut_ops_for(gs_isa_level isa);

static inline void gs_epilogue_rows(gs_isa_level isa, const gs_epilogue *e, const int64_t *acc, int pairs,
                                    int64_t rows, int64_t n, const int64_t *rsums, float *out, int64_t ldout)
{
    gs_lut_ops_for(isa)->epilogue_rows(e, acc, pairs, rows, n, rsums, out, ldout);
}

/* Checks a graphswap_lut_quant; fills the static activation parameters when STATIC. */
int32_t gs_quant_check(const char *fn, const graphswap_lut_quant *q, gs_qparams *act);

#endif /* GRAPHSWAP_LUT_INTERNAL_H */
