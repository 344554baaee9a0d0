/*
 * lut_internal.h -- the table-driven GEMM core shared by lut_gemm.c (graphswap_lut_matmul) and
 * lut_conv.c (graphswap_lut_conv2d).  Not part of the ABI (hidden symbols).
 */
#ifndef GRAPHSWAP_LUT_INTERNAL_H
#define GRAPHSWAP_LUT_INTERNAL_H

#include "internal.h"

/* One table-driven product  c[i*rs_c + j*cs_c] = sum_k table[(a[i*lda + k] << 8) | b[k*ldb + j]]
 * for i < m, j < n.  b's rows are contiguous along j.  Partial sums are int32 over K-blocks of at
 * most `kblock` terms (chosen so they cannot overflow, see gs_lut_kblock) and flushed to int64. */
typedef struct gs_lut_gemm {
    const uint8_t *a;
    int64_t lda;
    const uint8_t *b;
    int64_t ldb;
    const int32_t *table;
    int64_t *c;
    int64_t rs_c, cs_c;
    int64_t m, k, n;
    int64_t kblock;
} gs_lut_gemm;

/* Largest K-block whose int32 partial sums cannot overflow for this table (>= 1). */
int64_t gs_lut_kblock(const int32_t *table);

/* Computes rows [m0, m1) x columns [n0, n1) of the product on the calling thread. */
void gs_lut_gemm_tile(const gs_lut_gemm *p, int64_t m0, int64_t m1, int64_t n0, int64_t n1);

/* 65536-entry transpose: tt[(b << 8) | a] = table[(a << 8) | b]. */
void gs_lut_transpose_table(const int32_t *table, int32_t *tt);

/* Columns per vector tile of gs_lut_gemm_tile (work splits along n should be multiples of it). */
#define GS_LUT_NB 32

#endif /* GRAPHSWAP_LUT_INTERNAL_H */
