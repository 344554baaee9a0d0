/*
 * lut_quant.c -- quantization for the fused table-driven kernels: ranges, parameters, weight codes.
 * The formulas are those of graphswap_kernels.h (and graphswap/quantized.py): float64 scale
 * arithmetic, rint = round half to even, non-finite values out of every range.
 */
#include <math.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "lut_internal.h"

#define GS_RANGE_CHUNK (1 << 16)

int gs_quantize_span_scalar(const float *src, int64_t n, const double *scale, const int32_t *zero,
                            int per_element, int is_signed, uint8_t *dst)
{
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
        const int64_t e = per_element ? i : 0;
        const float v = src[i];
        if (!gs_finite(v)) {
            dst[i] = (uint8_t)zero[e];
            bad = 1;
        } else {
            dst[i] = is_signed ? gs_quant_s8(v, scale[e]) : gs_quant_u8(v, scale[e], (double)zero[e]);
        }
    }
    return bad;
}

int gs_quantize_span(gs_isa_level isa, const float *src, int64_t n, const double *scale,
                     const double *recip, const int32_t *zero, int per_element, int is_signed,
                     uint8_t *dst)
{
    return gs_lut_ops_for(isa)->quantize_span(src, n, scale, recip, zero, per_element, is_signed, dst);
}

int gs_range_span_scalar(const float *src, int64_t n, float *lo, float *hi)
{
    float l = *lo, h = *hi;
    int b = 0;
    for (int64_t i = 0; i < n; ++i) {
        const float v = src[i];
        if (gs_finite(v)) {
            l = v < l ? v : l;
            h = v > h ? v : h;
        } else {
            b = 1;
        }
    }
    *lo = l, *hi = h;
    return b;
}

static void range_chunk(const float *x, int64_t n, float *lo, float *hi, int *bad)
{
    float l = INFINITY, h = -INFINITY;
    *bad = gs_lut_ops_for(gs_isa())->range_span(x, n, &l, &h);
    *lo = l, *hi = h;
}

void gs_range_f32(const float *x, int64_t n, float *lo, float *hi, int *any_bad)
{
    float l = INFINITY, h = -INFINITY;
    int b = 0;
    const int64_t chunks = (n + GS_RANGE_CHUNK - 1) / GS_RANGE_CHUNK;
    const int nt = gs_threads_for((double)n, 4.0 * GS_RANGE_CHUNK);
    if (nt <= 1) {
        range_chunk(x, n, &l, &h, &b);
    } else {
#pragma omp parallel for num_threads(nt) schedule(static) reduction(min : l) reduction(max : h) reduction(| : b)
        for (int64_t c = 0; c < chunks; ++c) {
            float cl, ch;
            int cb;
            const int64_t lo0 = c * GS_RANGE_CHUNK;
            range_chunk(x + lo0, n - lo0 < GS_RANGE_CHUNK ? n - lo0 : GS_RANGE_CHUNK, &cl, &ch, &cb);
            l = cl < l ? cl : l;
            h = ch > h ? ch : h;
            b |= cb;
        }
    }
    *lo = l, *hi = h, *any_bad = b;
}

/* The parameters of a range for codes 0..levels (unsigned) / -levels..levels (signed). */
static gs_qparams qparams_levels(int is_signed, float flo, float fhi, double levels)
{
    gs_qparams q = {is_signed, 1.0, 0};
    if (is_signed) {
        double amax = 0.0;
        if (flo <= fhi) { /* some finite value */
            const double a = fabs((double)flo), b = fabs((double)fhi);
            amax = a > b ? a : b;
        }
        q.scale = amax > 0.0 ? amax / levels : 1.0;
        return q;
    }
    const double lo = (double)flo < 0.0 ? (double)flo : 0.0; /* +inf (no finite value) -> 0 */
    const double hi = (double)fhi > 0.0 ? (double)fhi : 0.0;
    if (hi == lo) return q;
    q.scale = (hi - lo) / levels;
    double z = gs_rint(-lo / q.scale);
    z = z < 0.0 ? 0.0 : (z > levels ? levels : z);
    q.zero = (int32_t)z;
    return q;
}

gs_qparams gs_qparams_dynamic(int is_signed, float flo, float fhi)
{
    return qparams_levels(is_signed, flo, fhi, is_signed ? 127.0 : 255.0);
}

gs_qparams gs_qparams_activation(const gs_qparams *act, float flo, float fhi)
{
    gs_qparams q = act->levels == 0 ? gs_qparams_dynamic(act->is_signed, flo, fhi)
                                    : qparams_levels(act->is_signed, flo, fhi, (double)act->levels);
    q.levels = act->levels;
    q.weights_signed = act->weights_signed;
    return q;
}

int gs_quantize_activations(gs_isa_level isa, const float *src, int64_t n, const gs_qparams *act,
                            const double *recip, uint8_t *dst)
{
    if (act->levels == 0)
        return gs_quantize_span(isa, src, n, &act->scale, recip, &act->zero, 0, act->is_signed, dst);
    /* N-bit activations (an Nx8 multiplier): the 8-bit formulas with 255 / 127 replaced by levels */
    const double top = (double)act->levels, bottom = act->is_signed ? -top : 0.0;
    const double z = (double)act->zero;
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
        const float v = src[i];
        if (!gs_finite(v)) {
            dst[i] = (uint8_t)act->zero;
            bad = 1;
            continue;
        }
        double t = (double)v / act->scale;
        t = t > 512.0 ? 512.0 : (t < -512.0 ? -512.0 : t);
        double q = gs_rint(t) + z;
        q = q < bottom ? bottom : (q > top ? top : q);
        dst[i] = (uint8_t)(int8_t)(int)q;
    }
    return bad;
}

/* The largest weight code of N-bit weights: 2^N - 1 (unsigned), 2^(N-1) - 1 (signed); 8 bits for
 * weight_bits 0. */
static double weight_levels(int is_signed, int weight_bits)
{
    const int bits = weight_bits == 0 ? 8 : weight_bits;
    return is_signed ? (double)((1 << (bits - 1)) - 1) : (double)((1 << bits) - 1);
}

int32_t gs_quant_check(const char *fn, const graphswap_lut_quant *q, gs_qparams *act)
{
    if (!q) return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, "%s: quant is NULL", fn);
    if (q->scheme != GRAPHSWAP_LUT_UNSIGNED && q->scheme != GRAPHSWAP_LUT_SIGNED &&
        q->scheme != GRAPHSWAP_LUT_SIGNED_UNSIGNED_ACTIVATIONS)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT,
                       "%s: quant->scheme must be GRAPHSWAP_LUT_UNSIGNED (0), GRAPHSWAP_LUT_SIGNED (1) "
                       "or GRAPHSWAP_LUT_SIGNED_UNSIGNED_ACTIVATIONS (2), got %d", fn, (int)q->scheme);
    if (q->activation_mode != GRAPHSWAP_QUANT_DYNAMIC && q->activation_mode != GRAPHSWAP_QUANT_STATIC)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT,
                       "%s: quant->activation_mode must be GRAPHSWAP_QUANT_DYNAMIC (0) or "
                       "GRAPHSWAP_QUANT_STATIC (1), got %d", fn, (int)q->activation_mode);
    if (q->weight_mode != GRAPHSWAP_QUANT_PER_TENSOR && q->weight_mode != GRAPHSWAP_QUANT_PER_CHANNEL)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT,
                       "%s: quant->weight_mode must be GRAPHSWAP_QUANT_PER_TENSOR (0) or "
                       "GRAPHSWAP_QUANT_PER_CHANNEL (1), got %d", fn, (int)q->weight_mode);
    if (q->weight_encoding != GRAPHSWAP_WEIGHTS_DEFAULT &&
        q->weight_encoding != GRAPHSWAP_WEIGHTS_SIGN_MAGNITUDE)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT,
                       "%s: quant->weight_encoding must be GRAPHSWAP_WEIGHTS_DEFAULT (0) or "
                       "GRAPHSWAP_WEIGHTS_SIGN_MAGNITUDE (1), got %d", fn, (int)q->weight_encoding);
    const int wbits = gs_weight_bits(q->weight_bits), abits = (q->weight_bits >> 8) & 0xff;
    if (q->weight_bits < 0 || (q->weight_bits >> 16) != 0 || wbits > 8 || abits > 8 ||
        (q->scheme == GRAPHSWAP_LUT_SIGNED && (wbits == 1 || abits == 1)) ||
        ((wbits != 0 && wbits != 8) && (abits != 0 && abits != 8)))
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT,
                       "%s: quant->weight_bits must hold the weight width in its low byte (0 or 8: "
                       "8-bit weights; 1..7, 2..7 for the signed scheme) and the activation width "
                       "in its second byte (0 or 8, or 1..7 / 2..7 when the weights have 8 bits), "
                       "got %d", fn, (int)q->weight_bits);
    if (q->scheme == GRAPHSWAP_LUT_SIGNED_UNSIGNED_ACTIVATIONS &&
        (q->activation_mode != GRAPHSWAP_QUANT_STATIC || q->activation_zero_point != 0 ||
         (wbits != 0 && wbits != 8) || (abits != 0 && abits != 8)))
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT,
                       "%s: GRAPHSWAP_LUT_SIGNED_UNSIGNED_ACTIVATIONS needs STATIC activations with "
                       "zero point 0 and 8-bit weights and activations", fn);
    if (q->weight_encoding == GRAPHSWAP_WEIGHTS_SIGN_MAGNITUDE && q->scheme != GRAPHSWAP_LUT_UNSIGNED)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT,
                       "%s: sign-magnitude weights need an unsigned multiplier (scheme "
                       "GRAPHSWAP_LUT_UNSIGNED)", fn);
    act->is_signed = q->scheme == GRAPHSWAP_LUT_SIGNED;
    act->weights_signed = q->scheme != GRAPHSWAP_LUT_UNSIGNED;
    act->scale = 1.0;
    act->zero = 0;
    act->levels = (abits == 0 || abits == 8) ? 0 : (int32_t)weight_levels(act->is_signed, abits);
    const int32_t top = act->levels ? act->levels : 255;
    if (q->activation_mode == GRAPHSWAP_QUANT_STATIC) {
        const double s = q->activation_scale;
        if (!(s > 0.0) || !isfinite(s))
            return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT,
                           "%s: static quant->activation_scale must be finite and > 0, got %g", fn, s);
        const int32_t z = q->activation_zero_point;
        if (act->is_signed ? z != 0 : (z < 0 || z > top))
            return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT,
                           "%s: static quant->activation_zero_point must be %s%d, got %d", fn,
                           act->is_signed ? "0 for the signed scheme" : "in 0..",
                           act->is_signed ? 0 : (int)top, (int)z);
        act->scale = s;
        act->zero = z;
    }
    return GRAPHSWAP_OK;
}

void gs_wquant_free(gs_wquant *w)
{
    gs_free(w->q), gs_free(w->qt), gs_free(w->colsum), gs_free(w->scale), gs_free(w->zero), gs_free(w->bad);
    gs_free(w->recip), gs_free(w->sign);
    memset(w, 0, sizeof *w);
}

static int32_t wquant_alloc(const char *fn, int64_t K, int64_t N, int need_q, gs_wquant *w)
{
    memset(w, 0, sizeof *w);
    const int64_t kn = K * N > 0 ? K * N : 1, n = N > 0 ? N : 1;
    if (need_q) w->q = gs_alloc(kn);
    w->qt = gs_alloc(kn);
    w->colsum = gs_alloc(n * 8);
    w->scale = gs_alloc(n * 8);
    w->recip = gs_alloc(n * 8);
    w->zero = gs_alloc(n * 4);
    w->bad = gs_alloc(n);
    if ((need_q && !w->q) || !w->qt || !w->colsum || !w->scale || !w->recip || !w->zero || !w->bad) {
        gs_wquant_free(w);
        return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, "%s: cannot allocate %lld bytes for weight codes", fn,
                       (long long)(2 * kn + 21 * n));
    }
    return GRAPHSWAP_OK;
}

/* qt and colsum from w->q (K x N). */
/* qt[j * K + k] = q[k * N + j], in 64 x 64 tiles (cache-friendly for both sides). */
static void transpose_bytes(const uint8_t *q, int64_t K, int64_t N, uint8_t *qt)
{
    const int64_t B = 64;
    for (int64_t k0 = 0; k0 < K; k0 += B)
        for (int64_t j0 = 0; j0 < N; j0 += B) {
            const int64_t k1 = K - k0 < B ? K : k0 + B, j1 = N - j0 < B ? N : j0 + B;
            for (int64_t k = k0; k < k1; ++k)
                for (int64_t j = j0; j < j1; ++j) qt[j * K + k] = q[k * N + j];
        }
}

static void transpose_codes(const uint8_t *q, int64_t K, int64_t N, gs_wquant *w)
{
    for (int64_t j = 0; j < N; ++j) w->colsum[j] = 0;
    transpose_bytes(q, K, N, w->qt);
    for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < N; ++j) w->colsum[j] += q[k * N + j];
}

int32_t gs_wcodes_make(const char *fn, const uint8_t *b, int64_t K, int64_t N, gs_wquant *w)
{
    int32_t rc = wquant_alloc(fn, K, N, 0, w);
    if (rc != GRAPHSWAP_OK) return rc;
    transpose_codes(b, K, N, w);
    return GRAPHSWAP_OK;
}

int32_t gs_wquant_make(const char *fn, const float *wf, int64_t K, int64_t N, int is_signed,
                       int per_channel, int weight_bits, gs_wquant *w)
{
    const int narrow = weight_bits != 0 && weight_bits != 8;
    const double levels = weight_levels(is_signed, weight_bits);
    int32_t rc = wquant_alloc(fn, K, N, 1, w);
    if (rc != GRAPHSWAP_OK) return rc;
    /* ranges: per column (lo/hi in the colsum/scale buffers' space is not reused: small arrays) */
    float *lo = gs_alloc((N > 0 ? N : 1) * 4), *hi = gs_alloc((N > 0 ? N : 1) * 4);
    if (!lo || !hi) {
        gs_free(lo), gs_free(hi), gs_wquant_free(w);
        return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, "%s: cannot allocate weight ranges", fn);
    }
    for (int64_t j = 0; j < N; ++j) lo[j] = INFINITY, hi[j] = -INFINITY, w->bad[j] = 0;
    for (int64_t k = 0; k < K; ++k) {
        const float *row = wf + k * N;
        for (int64_t j = 0; j < N; ++j) { /* branch-free: vectorises */
            const float v = row[j];
            const int ok = gs_finite(v);
            const float vl = ok ? v : INFINITY, vh = ok ? v : -INFINITY;
            lo[j] = vl < lo[j] ? vl : lo[j];
            hi[j] = vh > hi[j] ? vh : hi[j];
            w->bad[j] |= (uint8_t)!ok;
        }
    }
    w->any_bad = 0;
    for (int64_t j = 0; j < N; ++j) w->any_bad |= w->bad[j];
    if (!per_channel) {
        float l = INFINITY, h = -INFINITY;
        for (int64_t j = 0; j < N; ++j) {
            l = lo[j] < l ? lo[j] : l;
            h = hi[j] > h ? hi[j] : h;
        }
        const gs_qparams q = qparams_levels(is_signed, l, h, levels);
        for (int64_t j = 0; j < N; ++j) w->scale[j] = q.scale, w->zero[j] = q.zero;
    } else {
        for (int64_t j = 0; j < N; ++j) {
            const gs_qparams q = qparams_levels(is_signed, lo[j], hi[j], levels);
            w->scale[j] = q.scale, w->zero[j] = q.zero;
        }
    }
    gs_free(lo), gs_free(hi);
    for (int64_t j = 0; j < N; ++j) w->recip[j] = gs_recip(w->scale[j]);
    if (narrow) {
        /* N-bit codes (an 8xN multiplier): the weights are few, a scalar loop is enough */
        const double top = levels, bottom = is_signed ? -levels : 0.0;
        for (int64_t k = 0; k < K; ++k)
            for (int64_t j = 0; j < N; ++j) {
                const float v = wf[k * N + j];
                double q = (double)w->zero[j];
                if (gs_finite(v)) {
                    double t = (double)v / w->scale[j];
                    t = t > 512.0 ? 512.0 : (t < -512.0 ? -512.0 : t);
                    q = gs_rint(t) + (double)w->zero[j];
                    q = q < bottom ? bottom : (q > top ? top : q);
                }
                w->q[k * N + j] = (uint8_t)(int8_t)(int)q;
            }
    } else {
        const gs_isa_level isa = gs_isa();
        for (int64_t k = 0; k < K; ++k)
            gs_quantize_span(isa, wf + k * N, N, w->scale, w->recip, w->zero, 1, is_signed, w->q + k * N);
    }
    transpose_codes(w->q, K, N, w);
    return GRAPHSWAP_OK;
}


int32_t gs_wquant_make_sm(const char *fn, const float *wf, int64_t K, int64_t N, int per_channel,
                          int weight_bits, gs_wquant *w)
{
    const double levels = weight_levels(0, weight_bits);
    /* the codes and their transpose are 2N wide; the per-column arrays are N long */
    int32_t rc = wquant_alloc(fn, K, 2 * N, 1, w);
    if (rc != GRAPHSWAP_OK) return rc;
    w->sign = gs_alloc(K * N > 0 ? K * N : 1);
    if (!w->sign) {
        gs_wquant_free(w);
        return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, "%s: cannot allocate weight signs", fn);
    }
    double *amax = (double *)w->recip; /* scratch until the scales are set, then the reciprocals */
    for (int64_t j = 0; j < N; ++j) amax[j] = 0.0, w->bad[j] = 0;
    for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < N; ++j) {
            const float v = wf[k * N + j];
            if (!gs_finite(v)) {
                w->bad[j] = 1;
                continue;
            }
            const double a = fabs((double)v);
            amax[j] = a > amax[j] ? a : amax[j];
        }
    w->any_bad = 0;
    for (int64_t j = 0; j < N; ++j) w->any_bad |= w->bad[j];
    if (!per_channel) {
        double all = 0.0;
        for (int64_t j = 0; j < N; ++j) all = amax[j] > all ? amax[j] : all;
        for (int64_t j = 0; j < N; ++j) amax[j] = all;
    }
    for (int64_t j = 0; j < N; ++j) {
        w->scale[j] = amax[j] > 0.0 ? amax[j] / levels : 1.0;
        w->zero[j] = 0;
        w->colsum[j] = 0;
    }
    for (int64_t j = 0; j < N; ++j) w->recip[j] = gs_recip(w->scale[j]);
    for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < N; ++j) {
            const float v = wf[k * N + j];
            uint8_t m = 0;
            int8_t sign = 1;
            if (gs_finite(v)) {
                /* |v| * (1 / s) is within ~3 ulp of the quotient |v| / s: the same code unless it
                 * lies next to a half-integer (or 1 / s is NaN, see gs_recip); then divide */
                const double p = fabs((double)v) * w->recip[j];
                double q = gs_rint(p);
                const double off = fabs(p - q);
                if (!(fabs(off - 0.5) > 1e-9)) q = gs_rint(fabs((double)v) / w->scale[j]);
                q = q > levels ? levels : q;
                m = (uint8_t)q;
                sign = v < 0.0f ? -1 : 1;
            }
            w->sign[k * N + j] = sign;
            w->q[k * 2 * N + 2 * j] = sign > 0 ? m : 0;
            w->q[k * 2 * N + 2 * j + 1] = sign < 0 ? m : 0;
            w->colsum[j] += sign * (int64_t)m;
        }
    /* the transpose only: colsum above is the signed sum of the logical columns */
    transpose_bytes(w->q, K, 2 * N, w->qt);
    return GRAPHSWAP_OK;
}

void gs_sm_combine(const gs_lut_table *t, const gs_wquant *w, int64_t N, const uint8_t *packed,
                   int64_t rows, int64_t k, int64_t j0, int64_t ncols, const int64_t *acc2,
                   int64_t *acc)
{
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t *src = acc2 + r * 2 * ncols;
        int64_t *dst = acc + r * ncols;
        for (int64_t c = 0; c < ncols; ++c) dst[c] = src[2 * c] - src[2 * c + 1];
        /* the codes of row r, k-major in its group of 64 rows */
        const uint8_t *group = packed + (r / 64) * 64 * k + r % 64;
        for (int64_t c = 0; c < ncols; ++c) {
            const int8_t *sign = w->sign + j0 + c;
            int64_t term = 0;
            for (int64_t kk = 0; kk < k; ++kk)
                term += sign[kk * N] * (int64_t)t->table[(int)group[kk * 64] << 8];
            dst[c] += term;
        }
    }
}

int gs_lut_run_for_epilogue(gs_isa_level isa, gs_lut_args *a, int sm, const gs_wquant *w, int64_t N,
                            int64_t j0, int64_t ncols)
{
    a->pairs = sm && gs_lut_pairs_fused(isa, a->t);
    a->ncols = sm && !a->pairs ? 2 * ncols : ncols;
    a->ldacc = a->ncols;
    gs_lut_run(isa, a);
    if (!sm || a->pairs) return 0;
    if (!a->t->zero_column) return 1; /* the epilogue subtracts the pairs */
    gs_sm_combine(a->t, w, N, a->a, a->rows, a->k, j0, ncols, a->acc, a->acc);
    return 0;
}
