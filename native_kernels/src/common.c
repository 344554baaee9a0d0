/*
 * common.c -- runtime shared by all kernels: ABI version, per-thread error messages, thread count.
 */
#include <stdarg.h>
#include <stdio.h>

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
