/*
 * blas_f32.c -- exact float32 GEMM (graphswap_matmul_f32) on OpenBLAS from the scipy-openblas32
 * wheel (symbols prefixed scipy_), and the row-major sgemm helper used by conv_f32.c.
 *
 * Threads.  OpenBLAS's own pthread pool spins for a while after every call, which steals the cores
 * TensorFlow's pool needs for the rest of a training step.  So the library sets OpenBLAS to one
 * thread when it is loaded and parallelises itself: an OpenMP team (sized by
 * graphswap_set_num_threads, sleeping after a call with OMP_WAIT_POLICY=PASSIVE, which graphswap
 * sets before loading) where each thread runs single-threaded sgemm on its own block of C.
 * OpenBLAS (pthread build, 0.3.x) is safe to call concurrently from several threads; the harness
 * checks it.  numpy ships its own, separate OpenBLAS (scipy_openblas64_): neither setting affects
 * the other.
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <cblas.h>

#include "internal.h"

/* Minimum flops per thread before a second thread is worth waking (a passive wake-up costs
 * ~10-40 us here). */
#define GS_BLAS_MIN_FLOPS_PER_THREAD 4.0e6
#ifndef GS_BLAS_ONE_BLOCK_ROWS
#define GS_BLAS_ONE_BLOCK_ROWS 384 /* rows (columns) per thread from which one block each is best */
#endif

/* OpenBLAS runs on the calling thread only; this library is its only user in the process. */
__attribute__((constructor)) static void gs_blas_single_threaded(void)
{
    scipy_openblas_set_num_threads(1);
}

GRAPHSWAP_EXPORT const char *graphswap_blas_info(void)
{
    static char info[256];
    static int done = 0;
    if (!__atomic_load_n(&done, __ATOMIC_ACQUIRE)) {
        /* benign race: every writer writes the same text */
        const char *core = scipy_openblas_get_corename();
        const char *config = scipy_openblas_get_config();
        snprintf(info, sizeof info, "%s; core %s; threads %d", config ? config : "OpenBLAS",
                 core ? core : "?", scipy_openblas_get_num_threads());
        __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
    }
    return info;
}

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

void gs_sgemm_rows(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
                   int64_t ldb, float *c, int64_t ldc, int accumulate)
{
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {
        if (!accumulate)
            for (int64_t i = 0; i < m; ++i) memset(c + i * ldc, 0, (size_t)n * sizeof(float));
        return;
    }
    if (lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX) {
        /* leading dimensions beyond blasint (rows of > 8 GiB): plain loops */
        for (int64_t i = 0; i < m; ++i) {
            float *ci = c + i * ldc;
            if (!accumulate) memset(ci, 0, (size_t)n * sizeof(float));
            for (int64_t p = 0; p < k; ++p) {
                const float av = a[i * lda + p];
                const float *bp = b + p * ldb;
                for (int64_t j = 0; j < n; ++j) ci[j] += av * bp[j];
            }
        }
        return;
    }
    const int64_t step = (int64_t)1 << 30;
    for (int64_t i0 = 0; i0 < m; i0 += step)
        for (int64_t j0 = 0; j0 < n; j0 += step)
            for (int64_t p0 = 0; p0 < k; p0 += step) {
                const float beta = (accumulate || p0 > 0) ? 1.0f : 0.0f;
                scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)min64(step, m - i0),
                                  (blasint)min64(step, n - j0), (blasint)min64(step, k - p0), 1.0f,
                                  a + i0 * lda + p0, (blasint)lda, b + p0 * ldb + j0, (blasint)ldb, beta,
                                  c + i0 * ldc + j0, (blasint)ldc);
            }
}

GRAPHSWAP_EXPORT int32_t graphswap_matmul_f32(const float *a, const float *b, float *c, int64_t m,
                                              int64_t k, int64_t n)
{
    int32_t rc = gs_isa_ready("graphswap_matmul_f32");
    if (rc != GRAPHSWAP_OK) return rc;
    if (m < 0 || k < 0 || n < 0)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT,
                       "graphswap_matmul_f32: sizes must be >= 0, got m=%lld k=%lld n=%lld",
                       (long long)m, (long long)k, (long long)n);
    int64_t mk, kn, mn;
    if (gs_mul_i64(m, k, &mk) || gs_mul_i64(k, n, &kn) || gs_mul_i64(m, n, &mn) ||
        gs_mul_i64(mk, (int64_t)sizeof(float), &mk) || gs_mul_i64(kn, (int64_t)sizeof(float), &kn) ||
        gs_mul_i64(mn, (int64_t)sizeof(float), &mn))
        return gs_fail(GRAPHSWAP_ERR_OVERFLOW,
                       "graphswap_matmul_f32: buffer sizes overflow int64 (m=%lld k=%lld n=%lld)",
                       (long long)m, (long long)k, (long long)n);
    if (mn == 0) return GRAPHSWAP_OK;
    if (!c) return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, "graphswap_matmul_f32: c is NULL (m=%lld n=%lld)",
                           (long long)m, (long long)n);
    if (k > 0 && (!a || !b))
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, "graphswap_matmul_f32: %s is NULL (m=%lld k=%lld n=%lld)",
                       !a ? "a" : "b", (long long)m, (long long)k, (long long)n);

    const double flops = 2.0 * (double)m * (double)n * (double)k;
    const int nt = gs_threads_for(flops, GS_BLAS_MIN_FLOPS_PER_THREAD);
    if (nt <= 1 || k == 0) {
        gs_sgemm_rows(m, n, k, a, k, b, n, c, n, 0);
        return GRAPHSWAP_OK;
    }
    /* Blocks of C, one sgemm each, taken dynamically (a core may be busy with TensorFlow's pool):
     * row blocks when there are enough rows (each block re-packs B, k*n, small next to its
     * rows*k*n work), else column blocks (multiples of 16 floats). */
    const int split_rows = m >= 32 * (int64_t)nt || m >= n;
    const int64_t extent = split_rows ? m : n;
    /* Two blocks per thread balance a loaded machine; but every block re-packs the shared operand
     * (k x n, or m x k), so big products take one block per thread. */
    int64_t blocks = 2 * (int64_t)nt;
    const int64_t quantum = split_rows ? 8 : 16;
    if (extent / blocks < 4 * quantum || extent / nt >= GS_BLAS_ONE_BLOCK_ROWS) blocks = nt;
    int64_t size = (extent + blocks - 1) / blocks;
    size = (size + quantum - 1) / quantum * quantum;
    blocks = (extent + size - 1) / size;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t lo = blk * size, len = min64(size, extent - lo);
        if (split_rows)
            gs_sgemm_rows(len, n, k, a + lo * k, k, b, n, c + lo * n, n, 0);
        else
            gs_sgemm_rows(m, len, k, a, k, b + lo, n, c + lo, n, 0);
    }
    return GRAPHSWAP_OK;
}
