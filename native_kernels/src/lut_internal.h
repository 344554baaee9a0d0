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

/* Expanded b block: E[kk*256*ldE + code*ldE + j] = tt[(b[kk*ldb + n0 + j] << 8) | code] for
 * kk < kcount, j < nbpad (nbpad a multiple of 8; columns j >= w use b code 0, results unused). */
void gs_lut_expand(const uint8_t *b, int64_t ldb, int64_t kcount, int64_t n0, int64_t w, int64_t nbpad,
                   const int32_t *tt, int32_t *E, int64_t ldE);

/* acc[i*ldacc + j] += sum_{kk < kcount} E[(kk*256 + a[i*lda + kk])*ldE + j], i < rows, j < nbpad
 * (int32; the caller keeps kcount within gs_lut_kblock). */
void gs_lut_expanded_rows(const uint8_t *a, int64_t lda, int64_t rows, int64_t kcount,
                          const int32_t *E, int64_t ldE, int64_t nbpad, int32_t *acc, int64_t ldacc);

/* Columns per expanded block / vector tile (work splits along n should be multiples of it). */
#define GS_LUT_NB 32
/* k rows per expanded block of gs_lut_expanded_tile. */
#define GS_LUT_KB 8

/* The expanded-b product for rows [m0, m1) x columns [n0, n1) on the calling thread (see
 * lut_gemm.c).  tt is the transposed table; E (GS_LUT_KB*256*GS_LUT_NB int32) and accp
 * ((m1-m0)*GS_LUT_NB int32) are the caller's scratch.  Requires p->kblock >= GS_LUT_KB. */
void gs_lut_expanded_tile(const gs_lut_gemm *p, const int32_t *tt, int64_t m0, int64_t m1, int64_t n0,
                          int64_t n1, int32_t *E, int32_t *accp);

#endif /* GRAPHSWAP_LUT_INTERNAL_H */
