/*
 * common.c -- runtime shared by all kernels: ABI version, per-thread error messages, thread count,
 * instruction-set dispatch, and the one validation of graphswap_conv2d_params.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "internal.h"

/* Message for the last failing call, per calling thread (entry points are re-entrant). */
static _Thread_local char gs_error_buffer[1024];

/* graphswap_set_num_threads setting; 0 = library default (all available cores). */
static int gs_thread_setting = 0;

int32_t gs_fail(int32_t code, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    vsnprintf(gs_error_buffer, sizeof gs_error_buffer, fmt, args);
    va_end(args);
    return code;
}

int gs_num_threads(void)
{
    int n = __atomic_load_n(&gs_thread_setting, __ATOMIC_RELAXED);
    if (n > 0) return n;
#ifdef _OPENMP
    n = omp_get_num_procs();
    return n > 0 ? n : 1;
#else
    return 1;
#endif
}

GRAPHSWAP_EXPORT int32_t graphswap_abi_version(void) { return GRAPHSWAP_ABI_VERSION; }

GRAPHSWAP_EXPORT const char *graphswap_last_error(void) { return gs_error_buffer; }

/* Returns the previous *setting* (0 = library default), so set_num_threads(previous) restores it. */
GRAPHSWAP_EXPORT int32_t graphswap_set_num_threads(int32_t n)
{
    if (n < 0) n = 0;
    return __atomic_exchange_n(&gs_thread_setting, (int)n, __ATOMIC_RELAXED);
}

/* ------------------------------------------------------------------------------------------------
 * Instruction-set dispatch
 * ------------------------------------------------------------------------------------------------ */

static const char *const gs_isa_names[] = {"scalar", "avx2", "avx512"};

/* Current path (gs_isa_level), or -1 while a forced path is refused (gs_isa_refusal says why). */
static int gs_isa_current = -1;
static int gs_isa_initialised = 0;
static char gs_isa_refusal[256];

/* Best path this CPU and OS can run.  __builtin_cpu_supports checks the OS's XSAVE state (XCR0)
 * for AVX and AVX-512 as well as the CPUID bits. */
static gs_isa_level gs_isa_best(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vbmi") &&
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return GS_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return GS_ISA_AVX2;
#endif
    return GS_ISA_SCALAR;
}

/* Parses a path name: "" / NULL / "auto" -> best; returns -2 for an unknown name. */
static int gs_isa_parse(const char *name)
{
    if (!name || !*name || strcmp(name, "auto") == 0) return (int)gs_isa_best();
    for (int i = 0; i < 3; ++i)
        if (strcmp(name, gs_isa_names[i]) == 0) return i;
    return -2;
}

/* Selects `name`; returns GRAPHSWAP_OK or an error code with the reason in *why (static text). */
static int32_t gs_isa_select(const char *name, const char *origin)
{
    int want = gs_isa_parse(name);
    if (want == -2) {
        snprintf(gs_isa_refusal, sizeof gs_isa_refusal,
                 "%s=\"%s\" is not an instruction-set path; use scalar, avx2, avx512 or auto", origin,
                 name);
        __atomic_store_n(&gs_isa_current, -1, __ATOMIC_RELEASE);
        return GRAPHSWAP_ERR_INVALID_ARGUMENT;
    }
    const int best = (int)gs_isa_best();
    if (want > best) {
        snprintf(gs_isa_refusal, sizeof gs_isa_refusal,
                 "%s=%s, but this CPU can only run up to %s (%s needs %s)", origin, name,
                 gs_isa_names[best], name,
                 want == GS_ISA_AVX512 ? "AVX-512 F, BW, VL, DQ and VBMI" : "AVX2 and FMA");
        __atomic_store_n(&gs_isa_current, -1, __ATOMIC_RELEASE);
        return GRAPHSWAP_ERR_UNSUPPORTED;
    }
    __atomic_store_n(&gs_isa_current, want, __ATOMIC_RELEASE);
    return GRAPHSWAP_OK;
}

static void gs_isa_init_once(void)
{
    if (__atomic_load_n(&gs_isa_initialised, __ATOMIC_ACQUIRE)) return;
    const char *env = getenv("GRAPHSWAP_ISA");
    gs_isa_select(env, "GRAPHSWAP_ISA");
    __atomic_store_n(&gs_isa_initialised, 1, __ATOMIC_RELEASE);
}

__attribute__((constructor)) static void gs_isa_constructor(void) { gs_isa_init_once(); }

gs_isa_level gs_isa(void)
{
    gs_isa_init_once();
    int v = __atomic_load_n(&gs_isa_current, __ATOMIC_ACQUIRE);
    return v < 0 ? GS_ISA_SCALAR : (gs_isa_level)v;
}

int32_t gs_isa_ready(const char *fn)
{
    gs_isa_init_once();
    if (__atomic_load_n(&gs_isa_current, __ATOMIC_ACQUIRE) >= 0) return GRAPHSWAP_OK;
    return gs_fail(GRAPHSWAP_ERR_UNSUPPORTED, "%s: %s", fn, gs_isa_refusal);
}

GRAPHSWAP_EXPORT const char *graphswap_isa(void)
{
    gs_isa_init_once();
    int v = __atomic_load_n(&gs_isa_current, __ATOMIC_ACQUIRE);
    return v < 0 ? "none" : gs_isa_names[v];
}

GRAPHSWAP_EXPORT int32_t graphswap_set_isa(const char *name)
{
    gs_isa_init_once();
    int32_t rc = gs_isa_select(name, "graphswap_set_isa");
    if (rc != GRAPHSWAP_OK) return gs_fail(rc, "graphswap_set_isa: %s", gs_isa_refusal);
    return GRAPHSWAP_OK;
}

GRAPHSWAP_EXPORT const char *graphswap_isa_supported(void)
{
    switch (gs_isa_best()) {
    case GS_ISA_AVX512: return "scalar avx2 avx512";
    case GS_ISA_AVX2: return "scalar avx2";
    default: return "scalar";
    }
}

/* ------------------------------------------------------------------------------------------------
 * Convolution geometry
 * ------------------------------------------------------------------------------------------------ */

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

int32_t gs_conv_validate(const char *fn, const graphswap_conv2d_params *params, gs_conv_geo *geo)
{
    if (!params) return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, "%s: params is NULL", fn);
    const graphswap_conv2d_params P = *params;
    const struct { const char *name; int64_t v; } nonneg[] = {
        {"batch", P.batch}, {"in_height", P.in_height}, {"in_width", P.in_width},
        {"in_channels", P.in_channels}, {"filter_height", P.filter_height},
        {"filter_width", P.filter_width}, {"out_channels", P.out_channels},
        {"out_height", P.out_height}, {"out_width", P.out_width}, {"pad_top", P.pad_top},
        {"pad_bottom", P.pad_bottom}, {"pad_left", P.pad_left}, {"pad_right", P.pad_right},
    };
    for (size_t i = 0; i < sizeof nonneg / sizeof nonneg[0]; ++i)
        if (nonneg[i].v < 0)
            return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, "%s: %s must be >= 0, got %lld", fn,
                           nonneg[i].name, (long long)nonneg[i].v);
    const struct { const char *name; int64_t v; } positive[] = {
        {"stride_height", P.stride_height}, {"stride_width", P.stride_width},
        {"dilation_height", P.dilation_height}, {"dilation_width", P.dilation_width},
        {"groups", P.groups},
    };
    for (size_t i = 0; i < sizeof positive / sizeof positive[0]; ++i)
        if (positive[i].v < 1)
            return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, "%s: %s must be >= 1, got %lld", fn,
                           positive[i].name, (long long)positive[i].v);
    if (P.in_channels % P.groups)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT,
                       "%s: in_channels (%lld) must be divisible by groups (%lld)", fn,
                       (long long)P.in_channels, (long long)P.groups);
    if (P.out_channels % P.groups)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT,
                       "%s: out_channels (%lld) must be divisible by groups (%lld)", fn,
                       (long long)P.out_channels, (long long)P.groups);

    const int64_t oh = out_extent(P.in_height, P.pad_top, P.pad_bottom, P.filter_height,
                                  P.dilation_height, P.stride_height);
    const int64_t ow = out_extent(P.in_width, P.pad_left, P.pad_right, P.filter_width,
                                  P.dilation_width, P.stride_width);
    if (oh < 0 || ow < 0) return gs_fail(GRAPHSWAP_ERR_OVERFLOW, "%s: padded/dilated extents overflow int64", fn);
    if (P.out_height != oh || P.out_width != ow)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT,
                       "%s: output size must be %lldx%lld for input %lldx%lld, pads (%lld,%lld,%lld,%lld), "
                       "filter %lldx%lld, dilations (%lld,%lld), strides (%lld,%lld); got %lldx%lld", fn,
                       (long long)oh, (long long)ow, (long long)P.in_height, (long long)P.in_width,
                       (long long)P.pad_top, (long long)P.pad_bottom, (long long)P.pad_left,
                       (long long)P.pad_right, (long long)P.filter_height, (long long)P.filter_width,
                       (long long)P.dilation_height, (long long)P.dilation_width,
                       (long long)P.stride_height, (long long)P.stride_width,
                       (long long)P.out_height, (long long)P.out_width);

    gs_conv_geo g;
    g.cin_g = P.in_channels / P.groups;
    g.cout_g = P.out_channels / P.groups;
    int64_t t;
    /* element counts, plus byte counts with a margin (scratch of 16 bytes per element, 256-element
     * padding of packed blocks), must fit in int64 */
    if (gs_mul_i64(P.batch, P.in_height, &g.in_elems) || gs_mul_i64(g.in_elems, P.in_width, &g.in_elems) ||
        gs_mul_i64(g.in_elems, P.in_channels, &g.in_elems) || gs_mul_i64(g.in_elems, 16, &t) ||
        gs_mul_i64(P.filter_height, P.filter_width, &g.taps) || gs_mul_i64(g.taps, g.cin_g, &g.taps) ||
        gs_mul_i64(g.taps, P.out_channels, &g.filter_elems) || gs_mul_i64(g.filter_elems, 16, &t) ||
        gs_mul_i64(g.taps, 16 * 256, &t) ||
        gs_mul_i64(P.batch, P.out_height, &g.pixels) || gs_mul_i64(g.pixels, P.out_width, &g.pixels) ||
        gs_mul_i64(g.pixels, P.out_channels, &g.out_elems) || gs_mul_i64(g.out_elems, 16, &t) ||
        gs_mul_i64(g.pixels, P.groups, &t) || gs_mul_i64(t, 16, &t))
        return gs_fail(GRAPHSWAP_ERR_OVERFLOW,
                       "%s: tensor sizes overflow int64 (batch=%lld, in=%lldx%lldx%lld, "
                       "filter=%lldx%lld, out=%lldx%lldx%lld)", fn,
                       (long long)P.batch, (long long)P.in_height, (long long)P.in_width,
                       (long long)P.in_channels, (long long)P.filter_height,
                       (long long)P.filter_width, (long long)P.out_height, (long long)P.out_width,
                       (long long)P.out_channels);
    *geo = g;
    return GRAPHSWAP_OK;
}
