/*
 * lut_conv.c -- table-driven 2-D convolution (graphswap_lut_conv2d), NHWC input codes, HWIO filter
 * codes, all of graphswap_conv2d_params (strides, dilations, explicit paddings, groups).
 *
 * Method: im2col in bounded chunks.  Output pixels are processed a chunk at a time (per group):
 * each chunk's patches are gathered into a per-thread code buffer (padding positions get pad_code,
 * so those products do go through the table, as on a zero-point-padded accelerator), the per-window
 * code sums are taken from the same buffer, and the chunk is multiplied with the group's filter
 * slice by the LUT GEMM machinery of lut_gemm.c.  Scratch is O(chunk x kernel size) per thread,
 * whatever the batch.  Three strategies, by size:
 *   FULL_E    the filter is small (kernel size x channels x 1 KiB <= 8 MiB per group, e.g. all of
 *             LeNet-5): it is expanded once per call into E[k][code][oc] = table[code][filter[k,oc]]
 *             and every pixel row is then vector adds of E rows (channels padded to 8 lanes);
 *   BLOCKED_E larger filters: each chunk of 1024 pixels runs the blocked expanded GEMM;
 *   DIRECT    tiny problems, or tables whose entries are too large for 8-term int32 runs: AVX2
 *             gathers straight from the table.
 */
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "lut_internal.h"

#define FN "graphswap_lut_conv2d"
#define GS_CONV_PIXELS 256            /* pixels per job with a fully expanded filter / direct */
#define GS_CONV_PIXELS_BLOCKED 1024   /* pixels per job when the filter is expanded per block */
#define GS_CONV_FULL_E_BYTES (8 << 20) /* largest fully expanded filter (per group) */
#define GS_CONV_MIN_WORK 65536.

enum { DIRECT, FULL_E, BLOCKED_E, SUMS_ONLY };

static int32_t bad(const char *field, int64_t value, const char *rule)
{
    return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, FN ": %s must be %s, got %lld", field, rule,
                   (long long)value);
}

/* Expected output extent along one axis; -1 on int64 overflow. */
static int64_t out_extent(int64_t in, int64_t pad0, int64_t pad1, int64_t filt, int64_t dil, int64_t stride)
{
    int64_t span, eff;
    if (filt == 0) filt = 1;
    if (gs_mul_i64(dil, filt - 1, &span) || gs_add_i64(in, pad0, &eff) || gs_add_i64(eff, pad1, &eff))
        return -1;
    eff = eff - span - 1;
    if (eff < 0) return 0;
    return eff / stride + 1;
}

static int32_t validate(const graphswap_conv2d_params *P)
{
    const struct { const char *name; int64_t v; } nonneg[] = {
        {"batch", P->batch}, {"in_height", P->in_height}, {"in_width", P->in_width},
        {"in_channels", P->in_channels}, {"filter_height", P->filter_height},
        {"filter_width", P->filter_width}, {"out_channels", P->out_channels},
        {"out_height", P->out_height}, {"out_width", P->out_width}, {"pad_top", P->pad_top},
        {"pad_bottom", P->pad_bottom}, {"pad_left", P->pad_left}, {"pad_right", P->pad_right},
    };
    for (size_t i = 0; i < sizeof nonneg / sizeof nonneg[0]; ++i)
        if (nonneg[i].v < 0) return bad(nonneg[i].name, nonneg[i].v, ">= 0");
    const struct { const char *name; int64_t v; } positive[] = {
        {"stride_height", P->stride_height}, {"stride_width", P->stride_width},
        {"dilation_height", P->dilation_height}, {"dilation_width", P->dilation_width},
        {"groups", P->groups},
    };
    for (size_t i = 0; i < sizeof positive / sizeof positive[0]; ++i)
        if (positive[i].v < 1) return bad(positive[i].name, positive[i].v, ">= 1");
    if (P->in_channels % P->groups)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, FN ": in_channels (%lld) must be divisible by groups (%lld)",
                       (long long)P->in_channels, (long long)P->groups);
    if (P->out_channels % P->groups)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, FN ": out_channels (%lld) must be divisible by groups (%lld)",
                       (long long)P->out_channels, (long long)P->groups);
    const int64_t oh = out_extent(P->in_height, P->pad_top, P->pad_bottom, P->filter_height,
                                  P->dilation_height, P->stride_height);
    const int64_t ow = out_extent(P->in_width, P->pad_left, P->pad_right, P->filter_width,
                                  P->dilation_width, P->stride_width);
    if (oh < 0 || ow < 0) return gs_fail(GRAPHSWAP_ERR_OVERFLOW, FN ": padded/dilated extents overflow int64");
    if (P->out_height != oh || P->out_width != ow)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT,
                       FN ": output size must be %lldx%lld for input %lldx%lld, pads (%lld,%lld,%lld,%lld), "
                       "filter %lldx%lld, dilations (%lld,%lld), strides (%lld,%lld); got %lldx%lld",
                       (long long)oh, (long long)ow, (long long)P->in_height, (long long)P->in_width,
                       (long long)P->pad_top, (long long)P->pad_bottom, (long long)P->pad_left,
                       (long long)P->pad_right, (long long)P->filter_height, (long long)P->filter_width,
                       (long long)P->dilation_height, (long long)P->dilation_width,
                       (long long)P->stride_height, (long long)P->stride_width,
                       (long long)P->out_height, (long long)P->out_width);
    return GRAPHSWAP_OK;
}

/* Patches of output pixels [p0, p0+rows) for group g, row-major rows x kdim (HWC order, matching
 * the HWIO filter's rows); sums[r] = sum of the row's codes. */
static void gather_patches(const graphswap_conv2d_params *P, const uint8_t *input, uint8_t pad_code,
                           int64_t g, int64_t p0, int64_t rows, uint8_t *patches, int64_t *sums)
{
    const int64_t cin_g = P->in_channels / P->groups;
    const int64_t kdim = P->filter_height * P->filter_width * cin_g;
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t pix = p0 + r;
        const int64_t x = pix % P->out_width, y = (pix / P->out_width) % P->out_height;
        const int64_t nimg = pix / (P->out_width * P->out_height);
        uint8_t *dst = patches + r * kdim;
        for (int64_t fh = 0; fh < P->filter_height; ++fh) {
            const int64_t iy = y * P->stride_height - P->pad_top + fh * P->dilation_height;
            for (int64_t fw = 0; fw < P->filter_width; ++fw, dst += cin_g) {
                const int64_t ix = x * P->stride_width - P->pad_left + fw * P->dilation_width;
                if (iy < 0 || iy >= P->in_height || ix < 0 || ix >= P->in_width) {
                    memset(dst, pad_code, (size_t)cin_g);
                } else {
                    memcpy(dst, input + ((nimg * P->in_height + iy) * P->in_width + ix) * P->in_channels
                                    + g * cin_g, (size_t)cin_g);
                }
            }
        }
        if (sums) {
            const uint8_t *row = patches + r * kdim;
            int64_t s = 0;
            for (int64_t i = 0; i < kdim; ++i) s += row[i];
            sums[r] = s;
        }
    }
}

GRAPHSWAP_EXPORT int32_t graphswap_lut_conv2d(const uint8_t *input, const uint8_t *filter,
                                              const int32_t *table, uint8_t pad_code, int64_t *acc,
                                              int64_t *window_sums,
                                              const graphswap_conv2d_params *params)
{
    if (!params) return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, FN ": params is NULL");
    const graphswap_conv2d_params P = *params;
    int32_t status = validate(&P);
    if (status != GRAPHSWAP_OK) return status;

    const int64_t G = P.groups, cin_g = P.in_channels / G, cout_g = P.out_channels / G;
    int64_t in_elems, kdim, filt_elems, pixels, out_elems, sum_elems, t;
    if (gs_mul_i64(P.batch, P.in_height, &in_elems) || gs_mul_i64(in_elems, P.in_width, &in_elems) ||
        gs_mul_i64(in_elems, P.in_channels, &in_elems) ||
        gs_mul_i64(P.filter_height, P.filter_width, &kdim) || gs_mul_i64(kdim, cin_g, &kdim) ||
        gs_mul_i64(kdim, P.out_channels, &filt_elems) || gs_mul_i64(kdim, 2 * GS_CONV_PIXELS, &t) ||
        gs_mul_i64(P.batch, P.out_height, &pixels) || gs_mul_i64(pixels, P.out_width, &pixels) ||
        gs_mul_i64(pixels, P.out_channels, &out_elems) || gs_mul_i64(out_elems, 8, &t) ||
        gs_mul_i64(pixels, G, &sum_elems) || gs_mul_i64(sum_elems, 8, &t))
        return gs_fail(GRAPHSWAP_ERR_OVERFLOW, FN ": tensor sizes overflow int64");
    if (pixels == 0) return GRAPHSWAP_OK;
    if (window_sums == NULL && out_elems == 0) return GRAPHSWAP_OK;
    if (out_elems > 0 && !acc) return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, FN ": acc is NULL (%lld elements)",
                                              (long long)out_elems);
    if (kdim > 0 && ((in_elems > 0 && !input) || (filt_elems > 0 && (!filter || !table))))
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, FN ": input, filter and table must not be NULL");
    if (kdim == 0) {
        if (out_elems) memset(acc, 0, (size_t)out_elems * sizeof acc[0]);
        if (window_sums) memset(window_sums, 0, (size_t)sum_elems * sizeof window_sums[0]);
        return GRAPHSWAP_OK;
    }

    /* Strategy (see the file comment). */
    const int64_t kblock = out_elems > 0 ? gs_lut_kblock(table) : 1;
    const int64_t npad = (cout_g + 7) & ~(int64_t)7;
    int64_t ebytes = 0;
    int strategy = DIRECT;
    if (out_elems > 0 && kblock >= GS_LUT_KB) {
        if (!gs_mul_i64(kdim, npad * 256 * (int64_t)sizeof(int32_t), &ebytes) && ebytes <= GS_CONV_FULL_E_BYTES &&
            pixels >= 48)
            strategy = FULL_E;
        else if (pixels >= 48 && cout_g >= 8)
            strategy = BLOCKED_E;
    }
    if (out_elems == 0) strategy = SUMS_ONLY;

    int32_t *tt = NULL, *E = NULL;
    if (strategy == FULL_E || strategy == BLOCKED_E) {
        tt = gs_alloc(65536 * (int64_t)sizeof(int32_t));
        if (strategy == FULL_E) E = gs_alloc(ebytes * G);
        if (!tt || (strategy == FULL_E && !E)) {
            gs_free(tt), gs_free(E);
            return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, FN ": cannot allocate the expanded filter");
        }
        gs_lut_transpose_table(table, tt);
        if (strategy == FULL_E)
            for (int64_t g = 0; g < G; ++g)
                gs_lut_expand(filter, P.out_channels, kdim, g * cout_g, cout_g, npad, tt,
                              E + g * (ebytes / (int64_t)sizeof(int32_t)), npad);
    }

    const int64_t chunk = strategy == BLOCKED_E ? GS_CONV_PIXELS_BLOCKED : GS_CONV_PIXELS;
    const int64_t chunks_per_group = (pixels + chunk - 1) / chunk;
    const int64_t jobs = chunks_per_group * G;
    const double work = (double)pixels * (double)kdim * (double)(P.out_channels > 0 ? P.out_channels : 1);
    int nt = gs_threads_for(work, GS_CONV_MIN_WORK);
    if (nt > jobs) nt = (int)jobs;
    /* per-thread scratch: patches, int32 partial sums, window sums, expanded block */
    const int64_t patch_bytes = ((chunk * kdim + 63) / 64) * 64;
    const int64_t acc_cols = strategy == BLOCKED_E ? GS_LUT_NB : npad;
    const int64_t acc_bytes = chunk * acc_cols * (int64_t)sizeof(int32_t);
    const int64_t eblk_bytes = strategy == BLOCKED_E ? (int64_t)GS_LUT_KB * 256 * GS_LUT_NB * 4 : 0;
    const int64_t per_thread = patch_bytes + acc_bytes + chunk * 8 + eblk_bytes + 256;
    uint8_t *scratch = gs_alloc(per_thread * nt);
    if (!scratch) {
        gs_free(tt), gs_free(E);
        return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, FN ": cannot allocate %lld bytes of im2col scratch",
                       (long long)(per_thread * nt));
    }

#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
    for (int64_t job = 0; job < jobs; ++job) {
#ifdef _OPENMP
        const int tid = omp_get_thread_num();
#else
        const int tid = 0;
#endif
        uint8_t *base = scratch + (int64_t)tid * per_thread;
        uint8_t *patches = base;
        int32_t *acc32 = (int32_t *)(base + patch_bytes);
        int64_t *sums = (int64_t *)(base + patch_bytes + acc_bytes);
        int32_t *eblk = (int32_t *)(base + patch_bytes + acc_bytes + chunk * 8);
        const int64_t g = job / chunks_per_group;
        const int64_t p0 = (job % chunks_per_group) * chunk;
        const int64_t rows = (pixels - p0) < chunk ? (pixels - p0) : chunk;
        gather_patches(&P, input, pad_code, g, p0, rows, patches, window_sums ? sums : NULL);
        if (window_sums)
            for (int64_t r = 0; r < rows; ++r) window_sums[(p0 + r) * G + g] = sums[r];
        int64_t *c = acc + p0 * P.out_channels + g * cout_g;
        switch (strategy) {
        case SUMS_ONLY:
            break;
        case FULL_E: {
            const int32_t *Eg = E + g * (ebytes / (int64_t)sizeof(int32_t));
            for (int64_t r = 0; r < rows; ++r)
                for (int64_t j = 0; j < cout_g; ++j) c[r * P.out_channels + j] = 0;
            for (int64_t k0 = 0; k0 < kdim; k0 += kblock) {
                const int64_t kc = (kdim - k0) < kblock ? (kdim - k0) : kblock;
                memset(acc32, 0, (size_t)(rows * npad) * sizeof acc32[0]);
                gs_lut_expanded_rows(patches + k0, kdim, rows, kc, Eg + k0 * 256 * npad, npad, npad,
                                     acc32, npad);
                for (int64_t r = 0; r < rows; ++r)
                    for (int64_t j = 0; j < cout_g; ++j) c[r * P.out_channels + j] += acc32[r * npad + j];
            }
            break;
        }
        case BLOCKED_E: {
            gs_lut_gemm p = {patches, kdim, filter + g * cout_g, P.out_channels, table,
                             c, P.out_channels, 1, rows, kdim, cout_g, kblock};
            gs_lut_expanded_tile(&p, tt, 0, rows, 0, cout_g, eblk, acc32);
            break;
        }
        default: {
            gs_lut_gemm p = {patches, kdim, filter + g * cout_g, P.out_channels, table,
                             c, P.out_channels, 1, rows, kdim, cout_g, kblock};
            gs_lut_gemm_tile(&p, 0, rows, 0, cout_g);
        }
        }
    }
    gs_free(scratch), gs_free(tt), gs_free(E);
    return GRAPHSWAP_OK;
}
