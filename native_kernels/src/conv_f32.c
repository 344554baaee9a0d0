/*
 * conv_f32.c -- exact float32 2-D convolution (graphswap_conv2d_f32), NHWC input, HWIO filter.
 *
 * Method: per group, one GEMM  out[pixel, oc] = sum_k patch[pixel, k] * filter[k, oc]  with
 * k = (fh*filter_w + fw)*cin_g + ic (the HWIO filter is already that K x out_channels matrix).
 * The patch matrix is never materialised: gs_gemm_f32 expands it while packing its operand panels
 * (implicit im2col, see gemm_f32.c), so scratch memory is bounded by the GEMM's packing buffers
 * (a few MiB per thread) whatever the batch.  1x1 stride-1 unpadded convolutions read the input
 * directly as a (pixels x channels) matrix.  Few output channels per group (e.g. LeNet's 6) make
 * the GEMM run transposed, with 16 output pixels per register tile row.
 */
#include "internal.h"

#define FN "graphswap_conv2d_f32"

static int32_t bad(const char *field, int64_t value, const char *rule)
{
    return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, FN ": %s must be %s, got %lld", field, rule,
                   (long long)value);
}

/* Expected output extent along one axis; -1 on int64 overflow. */
static int64_t out_extent(int64_t in, int64_t pad0, int64_t pad1, int64_t filt, int64_t dil, int64_t stride)
{
    int64_t span, eff;
    if (filt == 0) filt = 1; /* an empty filter still has the extent of a 1-tap one */
    if (gs_mul_i64(dil, filt - 1, &span) || gs_add_i64(in, pad0, &eff) || gs_add_i64(eff, pad1, &eff))
        return -1;
    eff = eff - span - 1; /* cannot overflow: all terms non-negative */
    if (eff < 0) return 0;
    return eff / stride + 1;
}

GRAPHSWAP_EXPORT int32_t graphswap_conv2d_f32(const float *input, const float *filter, float *output,
                                              const graphswap_conv2d_params *params)
{
    if (!params) return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, FN ": params is NULL");
    const graphswap_conv2d_params P = *params;

    /* ---- validation ---- */
    const struct { const char *name; int64_t v; } nonneg[] = {
        {"batch", P.batch}, {"in_height", P.in_height}, {"in_width", P.in_width},
        {"in_channels", P.in_channels}, {"filter_height", P.filter_height},
        {"filter_width", P.filter_width}, {"out_channels", P.out_channels},
        {"out_height", P.out_height}, {"out_width", P.out_width}, {"pad_top", P.pad_top},
        {"pad_bottom", P.pad_bottom}, {"pad_left", P.pad_left}, {"pad_right", P.pad_right},
    };
    for (size_t i = 0; i < sizeof nonneg / sizeof nonneg[0]; ++i)
        if (nonneg[i].v < 0) return bad(nonneg[i].name, nonneg[i].v, ">= 0");
    const struct { const char *name; int64_t v; } positive[] = {
        {"stride_height", P.stride_height}, {"stride_width", P.stride_width},
        {"dilation_height", P.dilation_height}, {"dilation_width", P.dilation_width},
        {"groups", P.groups},
    };
    for (size_t i = 0; i < sizeof positive / sizeof positive[0]; ++i)
        if (positive[i].v < 1) return bad(positive[i].name, positive[i].v, ">= 1");
    if (P.in_channels % P.groups)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT,
                       FN ": in_channels (%lld) must be divisible by groups (%lld)",
                       (long long)P.in_channels, (long long)P.groups);
    if (P.out_channels % P.groups)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT,
                       FN ": out_channels (%lld) must be divisible by groups (%lld)",
                       (long long)P.out_channels, (long long)P.groups);

    const int64_t oh = out_extent(P.in_height, P.pad_top, P.pad_bottom, P.filter_height,
                                  P.dilation_height, P.stride_height);
    const int64_t ow = out_extent(P.in_width, P.pad_left, P.pad_right, P.filter_width,
                                  P.dilation_width, P.stride_width);
    if (oh < 0 || ow < 0)
        return gs_fail(GRAPHSWAP_ERR_OVERFLOW, FN ": padded/dilated extents overflow int64");
    if (P.out_height != oh)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT,
                       FN ": out_height must be %lld for in_height=%lld, pads=(%lld,%lld), "
                       "filter_height=%lld, dilation=%lld, stride=%lld; got %lld",
                       (long long)oh, (long long)P.in_height, (long long)P.pad_top,
                       (long long)P.pad_bottom, (long long)P.filter_height,
                       (long long)P.dilation_height, (long long)P.stride_height,
                       (long long)P.out_height);
    if (P.out_width != ow)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT,
                       FN ": out_width must be %lld for in_width=%lld, pads=(%lld,%lld), "
                       "filter_width=%lld, dilation=%lld, stride=%lld; got %lld",
                       (long long)ow, (long long)P.in_width, (long long)P.pad_left,
                       (long long)P.pad_right, (long long)P.filter_width,
                       (long long)P.dilation_width, (long long)P.stride_width,
                       (long long)P.out_width);

    const int64_t cin_g = P.in_channels / P.groups, cout_g = P.out_channels / P.groups;
    int64_t in_elems, filt_elems, out_elems, pixels, kdim, t;
    /* element counts, plus byte counts and a margin, must fit in int64 */
    if (gs_mul_i64(P.batch, P.in_height, &in_elems) || gs_mul_i64(in_elems, P.in_width, &in_elems) ||
        gs_mul_i64(in_elems, P.in_channels, &in_elems) || gs_mul_i64(in_elems, 16, &t) ||
        gs_mul_i64(P.filter_height, P.filter_width, &kdim) || gs_mul_i64(kdim, cin_g, &kdim) ||
        gs_mul_i64(kdim, P.out_channels, &filt_elems) || gs_mul_i64(filt_elems, 16, &t) ||
        gs_mul_i64(P.batch, P.out_height, &pixels) || gs_mul_i64(pixels, P.out_width, &pixels) ||
        gs_mul_i64(pixels, P.out_channels, &out_elems) || gs_mul_i64(out_elems, 16, &t) ||
        gs_mul_i64(kdim, 16 * 256, &t))
        return gs_fail(GRAPHSWAP_ERR_OVERFLOW,
                       FN ": tensor sizes overflow int64 (batch=%lld, in=%lldx%lldx%lld, "
                       "filter=%lldx%lld, out=%lldx%lldx%lld)",
                       (long long)P.batch, (long long)P.in_height, (long long)P.in_width,
                       (long long)P.in_channels, (long long)P.filter_height,
                       (long long)P.filter_width, (long long)P.out_height, (long long)P.out_width,
                       (long long)P.out_channels);

    if (out_elems == 0) return GRAPHSWAP_OK;
    if (!output) return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, FN ": output is NULL (%lld elements)",
                                (long long)out_elems);
    if (kdim > 0) {
        if (!filter) return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, FN ": filter is NULL (%lld elements)",
                                    (long long)filt_elems);
        if (!input && in_elems > 0)
            return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, FN ": input is NULL (%lld elements)",
                           (long long)in_elems);
    }

    /* ---- compute ---- */
    if (kdim == 0 || in_elems == 0) {
        /* empty reduction, or an empty image seen only through padding: all outputs are 0 */
        for (int64_t i = 0; i < out_elems; ++i) output[i] = 0.0f;
        return GRAPHSWAP_OK;
    }
    const int pointwise = P.filter_height == 1 && P.filter_width == 1 && P.stride_height == 1 &&
                          P.stride_width == 1 && P.pad_top == 0 && P.pad_bottom == 0 &&
                          P.pad_left == 0 && P.pad_right == 0;
    const int max_threads = gs_num_threads();
    for (int64_t g = 0; g < P.groups; ++g) {
        gs_conv_src src = {
            input, P.in_height, P.in_width, P.in_channels, P.out_height, P.out_width,
            P.filter_width, cin_g, g * cin_g,
            P.stride_height, P.stride_width, P.dilation_height, P.dilation_width, P.pad_top, P.pad_left,
        };
        gs_operand A;
        if (pointwise) {
            /* 1x1 / stride 1 / no padding: the patches are the input rows themselves */
            A = (gs_operand){input + g * cin_g, P.in_channels, 1, NULL, 0};
        } else {
            A = (gs_operand){NULL, 0, 0, &src, 0};
        }
        const gs_operand B = {filter + g * cout_g, 1, P.out_channels, NULL, 0}; /* B(oc, k) */
        int32_t rc = gs_gemm_f32(pixels, cout_g, kdim, &A, &B, output + g * cout_g, P.out_channels, 1,
                                 max_threads);
        if (rc != GRAPHSWAP_OK) return rc;
    }
    return GRAPHSWAP_OK;
}
