/*
 * graphswap_kernels.h -- the C ABI between graphswap (Python, through ctypes) and kernel libraries.
 *
 * ABI version 1.  A library built against this header exports graphswap_abi_version() returning
 * GRAPHSWAP_ABI_VERSION; graphswap refuses to load a library that reports another version.
 *
 * Two levels share this contract:
 *
 * 1. Operation level -- a library that computes whole float32 matrix products / convolutions.
 *    Required:  graphswap_abi_version, graphswap_matmul_f32.
 *    Optional:  graphswap_conv2d_f32 (without it, graphswap lowers Conv2D to patches x matmul),
 *               graphswap_last_error (message for the last non-zero return, per thread),
 *               graphswap_set_num_threads.
 *
 * 2. Multiplier level -- a scalar 8-bit multiplier (e.g. an EvoApproxLib circuit).  Users do not
 *    implement anything from this header for that: graphswap evaluates the scalar function into a
 *    256x256 table and runs the table-driven kernels (graphswap_lut_*) shipped in graphswap's own
 *    library: integer ones (graphswap_lut_matmul / _conv2d: codes in, exact sums out) and fused
 *    float ones (graphswap_lut_matmul_f32 / _conv2d_f32: quantization inside).
 *
 * graphswap's own library additionally exports graphswap_isa / graphswap_isa_supported /
 * graphswap_set_isa (its run-time instruction-set paths), graphswap_blas_info and
 * graphswap_builtin_multiplier_table.  None of these is part of what a user library must provide.
 *
 * Conventions (all entry points):
 *   - float32 buffers, row-major, C-contiguous, no aliasing between inputs and outputs;
 *   - all sizes are int64_t;
 *   - tensors use TensorFlow's layouts: input NHWC, filter HWIO
 *     ([filter_height, filter_width, in_channels / groups, out_channels]), output NHWC;
 *   - paddings, strides and dilations are explicit; graphswap computes them on the Python side
 *     exactly as TensorFlow does for 'SAME' / 'VALID';
 *   - every entry point returns GRAPHSWAP_OK (0) or a negative error code, never aborts, and
 *     never writes outside the output buffer it was given;
 *   - entry points must be re-entrant: graphswap calls them concurrently from several threads
 *     (TensorFlow's thread pools, tf.distribute replicas) with distinct buffers;
 *   - a size of 0 in any dimension is legal and must return GRAPHSWAP_OK with nothing computed
 *     (output buffers of zero elements may be NULL).
 */
#ifndef GRAPHSWAP_KERNELS_H
#define GRAPHSWAP_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GRAPHSWAP_ABI_VERSION 1

#if defined(_WIN32)
#define GRAPHSWAP_EXPORT __declspec(dllexport)
#else
#define GRAPHSWAP_EXPORT __attribute__((visibility("default")))
#endif

/* Return codes. */
#define GRAPHSWAP_OK 0
#define GRAPHSWAP_ERR_INVALID_ARGUMENT (-1) /* a size, stride, pointer or geometry is invalid   */
#define GRAPHSWAP_ERR_OUT_OF_MEMORY (-2)    /* a scratch allocation failed                      */
#define GRAPHSWAP_ERR_OVERFLOW (-3)         /* a size or an accumulator would overflow          */
#define GRAPHSWAP_ERR_UNSUPPORTED (-4)      /* the library does not implement this variant      */
#define GRAPHSWAP_ERR_INTERNAL (-5)         /* anything else; see graphswap_last_error()        */

/*
 * Convolution geometry, shared by the float and the table-driven convolutions.
 * out_height == (in_height + pad_top + pad_bottom - dilation_height*(filter_height-1) - 1)
 *               / stride_height + 1      (same for width); graphswap always passes consistent values
 * and kernels must reject inconsistent ones with GRAPHSWAP_ERR_INVALID_ARGUMENT.
 * in_channels and out_channels are both divisible by groups; filter input depth is in_channels/groups;
 * output channel oc belongs to group oc / (out_channels / groups).
 */
typedef struct graphswap_conv2d_params {
    int64_t batch, in_height, in_width, in_channels;
    int64_t filter_height, filter_width, out_channels;
    int64_t out_height, out_width;
    int64_t stride_height, stride_width;
    int64_t dilation_height, dilation_width;
    int64_t pad_top, pad_bottom, pad_left, pad_right;
    int64_t groups;
} graphswap_conv2d_params;

/* ---- operation level: required ---- */

/* Returns GRAPHSWAP_ABI_VERSION of the header the library was built with. */
GRAPHSWAP_EXPORT int32_t graphswap_abi_version(void);

/* c[m,n] = sum_k a[m,k] * b[k,n].  a is (m,k), b is (k,n), c is (m,n); c is overwritten. */
GRAPHSWAP_EXPORT int32_t graphswap_matmul_f32(const float *a, const float *b, float *c,
                                              int64_t m, int64_t k, int64_t n);

/* ---- operation level: optional ---- */

/* output[n,oh,ow,oc] = sum_{fh,fw,ic} input[n, oh*sh - pt + fh*dh, ow*sw - pl + fw*dw, g*icg + ic]
 *                                     * filter[fh, fw, ic, oc]      (out-of-range input reads are 0)
 * where g is oc's group and icg = in_channels / groups.  output is overwritten. */
GRAPHSWAP_EXPORT int32_t graphswap_conv2d_f32(const float *input, const float *filter, float *output,
                                              const graphswap_conv2d_params *params);

/* The input gradient of that convolution (TensorFlow's Conv2DBackpropInput; a Conv2DTranspose of
 * dy by the same filter): dx[n, ih, iw, ic] = sum over (oh, ow, fh, fw, oc) with
 * ih == oh*sh - pt + fh*dh and iw == ow*sw - pl + fw*dw of dy[n, oh, ow, oc] * filter[fh, fw, ic, oc].
 * params describe the forward convolution (dx is its input, dy its output); groups must be 1.
 * dx is overwritten.  graphswap's own library exports it (graphswap's exact Conv2DTranspose). */
GRAPHSWAP_EXPORT int32_t graphswap_conv2d_backprop_input_f32(const float *dy, const float *filter, float *dx,
                                                             const graphswap_conv2d_params *params);

/* Human-readable message for the last non-zero return in the calling thread ("" if none). */
GRAPHSWAP_EXPORT const char *graphswap_last_error(void);

/* Upper bound on threads one call may use (graphswap passes TensorFlow's intra-op setting);
 * n <= 0 means "library default".  Returns the previous setting. */
GRAPHSWAP_EXPORT int32_t graphswap_set_num_threads(int32_t n);

/* ---- multiplier level: table-driven kernels (graphswap's own library) ----
 *
 * Operands are 8-bit codes.  For unsigned multipliers a code is the operand value 0..255; for signed
 * multipliers a code is the two's-complement bit pattern of the int8 value (code = (uint8_t)value).
 * table has 65536 int32 entries: table[(a_code << 8) | b_code] is the multiplier's product of
 * operand a (first, from the left matrix / the input) and operand b (second, from the right matrix /
 * the filter).  Products are summed exactly in 64-bit integers; no rounding, no saturation.
 */

/* acc[m,n] = sum_k table[(a[m,k] << 8) | b[k,n]].  a is (m,k), b is (k,n), acc is (m,n). */
GRAPHSWAP_EXPORT int32_t graphswap_lut_matmul(const uint8_t *a, const uint8_t *b, const int32_t *table,
                                              int64_t *acc, int64_t m, int64_t k, int64_t n);

/* acc[n,oh,ow,oc] = sum_{fh,fw,ic} table[(x << 8) | filter[fh,fw,ic,oc]], with x the input code at the
 * same position as in graphswap_conv2d_f32, or pad_code where that position lies in the padding.
 * If window_sums is not NULL it receives, per (n, oh, ow, group), the sum of the input codes
 * (pad_code included) in that window: shape [batch, out_height, out_width, groups]; graphswap uses it
 * for exact zero-point corrections. */
GRAPHSWAP_EXPORT int32_t graphswap_lut_conv2d(const uint8_t *input, const uint8_t *filter,
                                              const int32_t *table, uint8_t pad_code, int64_t *acc,
                                              int64_t *window_sums,
                                              const graphswap_conv2d_params *params);

/* 8-bit floating-point multipliers (optional; graphswap/kernels/fp8.py, docs/FP8.md): a and b hold FP8
 * codes, table 65536 float32 products, table[(a_code << 8) | b_code].  out[m,n] is the float32
 * running sum of table[(a[m,k] << 8) | b[k,n]] over k = 0, 1, ..., in that order (not exact: float). */
GRAPHSWAP_EXPORT int32_t graphswap_lut_float_matmul(const uint8_t *a, const uint8_t *b, const float *table,
                                                    float *out, int64_t m, int64_t k, int64_t n);

/* ---- fused quantized table-driven kernels (graphswap's own library; ABI version 1 additions) ----
 *
 * One call does what graphswap/quantized.py does around graphswap_lut_matmul / _conv2d, with no
 * numpy pass: float32 activations and weights -> 8-bit codes -> table products summed exactly ->
 * exact zero-point corrections -> float32 output (+ bias).  The arithmetic, for a tensor t:
 *
 *   GRAPHSWAP_LUT_UNSIGNED (asymmetric uint8, TFApprox-style; an unsigned multiplier's table)
 *     dynamic range (activations in DYNAMIC mode; weights, per tensor or per output channel):
 *         lo = min(min t, 0), hi = max(max t, 0)      over the finite values of the tensor/channel
 *         s = (hi - lo) / 255, z = clip(rint(-lo / s), 0, 255);  s = 1, z = 0 if hi == lo
 *     STATIC activations: s = activation_scale, z = activation_zero_point (from calibration)
 *     codes  q = clip(rint(t / s) + z, 0, 255)
 *     result sum_k (qa - za)(qb - zb) = sum_k T[qa][qb] - zb sum_k qa - za sum_k qb + K za zb,
 *            only the first sum through the table; conv padding is code za (a real 0), and those
 *            products do go through the table.
 *   GRAPHSWAP_LUT_SIGNED (symmetric int8, AdaPT-style; a signed multiplier's table)
 *     s = max|t| / 127 over the finite values (s = 1 if that is 0), or activation_scale (STATIC);
 *     q = clip(rint(t / s), -127, 127), code = the two's-complement byte of q; zero points 0;
 *     every product through the table, padding code 0.
 *   output y = float32((s_a * s_b) * float64(c)), c the exact int64 result, all scale arithmetic in
 *     float64, rint = round half to even; then y = y + bias[channel] in float32 if bias != NULL.
 *   Non-finite values are left out of every range, quantized as the zero point, and every output
 *     that depends on one (its row of a / window of the input, or its column of b / output
 *     channel of the filter) is NaN.
 * With DYNAMIC activations and PER_TENSOR (unsigned) / PER_CHANNEL (signed) weights this is bit for
 * bit graphswap/quantized.py's pipeline.  With STATIC activations a sample's output does not depend
 * on the rest of its batch.
 */
#define GRAPHSWAP_LUT_UNSIGNED 0
#define GRAPHSWAP_LUT_SIGNED 1
/* A signed multiplier's table with STATIC unsigned activation codes q = clip(rint(t / s), 0, 255)
 * (zero point 0, 8 bits) and SIGNED's weights; no correction terms: the caller's table folds in
 * the zero point (graphswap's QuantScheme.activation_zero_point = -128, TFLite int8's activations
 * of a non-negative range: the circuit sees q - 128, the table subtracts its row of -128). */
#define GRAPHSWAP_LUT_SIGNED_UNSIGNED_ACTIVATIONS 2
#define GRAPHSWAP_QUANT_DYNAMIC 0     /* activation range of this call's tensor */
#define GRAPHSWAP_QUANT_STATIC 1      /* activation scale / zero point given by the caller */
#define GRAPHSWAP_QUANT_PER_TENSOR 0  /* one weight scale (and zero point) */
#define GRAPHSWAP_QUANT_PER_CHANNEL 1 /* per column of b / output channel of the HWIO filter */
#define GRAPHSWAP_WEIGHTS_DEFAULT 0   /* asymmetric codes + zero points (UNSIGNED) / symmetric (SIGNED) */
#define GRAPHSWAP_WEIGHTS_SIGN_MAGNITUDE 1 /* UNSIGNED only: the multiplier sees |w|'s 8-bit
                                            * magnitude code m = clip(rint(|w| / s), 0, 255),
                                            * s = max|w| / 255 per channel (or tensor), weight zero
                                            * point 0; the product takes w's sign:
                                            * c = sum_k sign(w_k) T[qa_k, m_k] - z_a sum_k sign(w_k) m_k
                                            * (sign(w) = -1 for w < 0, else +1) */

typedef struct graphswap_lut_quant {
    int32_t scheme;                /* GRAPHSWAP_LUT_UNSIGNED, _SIGNED or _SIGNED_UNSIGNED_ACTIVATIONS */
    int32_t activation_mode;       /* GRAPHSWAP_QUANT_DYNAMIC or GRAPHSWAP_QUANT_STATIC */
    int32_t weight_mode;           /* GRAPHSWAP_QUANT_PER_TENSOR or GRAPHSWAP_QUANT_PER_CHANNEL */
    int32_t activation_zero_point; /* STATIC + UNSIGNED: 0..255; STATIC + SIGNED: must be 0 */
    double activation_scale;       /* STATIC: finite and > 0; ignored when DYNAMIC */
    double *observed_range;        /* NULL, or receives {min, max} of the finite activation values
                                    * of this call ({+inf, -inf} if there are none), for a
                                    * moving-average observer; written in every mode */
    int32_t weight_encoding;       /* GRAPHSWAP_WEIGHTS_DEFAULT or GRAPHSWAP_WEIGHTS_SIGN_MAGNITUDE */
    int32_t weight_bits;           /* 0 or 8: 8-bit weight codes as above; N = 1..7 (an 8xN
                                    * multiplier): weight codes of N bits, i.e. 255 above becomes
                                    * L = 2^N - 1 (sign-magnitude magnitudes and asymmetric codes
                                    * 0..L, zero points in 0..L) and the symmetric limit 127 becomes
                                    * 2^(N-1) - 1 (N >= 2); the table is still 256x256 and only its
                                    * columns of N-bit codes are read.  Occupies what was padding:
                                    * the struct's size and other offsets are unchanged.
                                    * Second byte (bits 8..15): the activation width of an Nx8
                                    * multiplier, 0 or 8 = 8-bit activations, N = 1..7 (2..7
                                    * signed, the weights then 8 bits): 255 / 127 of the activation
                                    * formulas become 2^N - 1 (codes and zero point, STATIC too, in
                                    * 0..2^N - 1) / 2^(N-1) - 1, only the table's rows of N-bit
                                    * codes are read.  weight_bits = 8 | (N << 8); higher bits 0. */
} graphswap_lut_quant;

/* c[m,n] = quantized a[m,k] x b[k,n] through `table` (layout as for graphswap_lut_matmul) per `quant`
 * (+ bias[n] if bias != NULL).  a = activations (first operand), b = weights. */
GRAPHSWAP_EXPORT int32_t graphswap_lut_matmul_f32(const float *a, const float *b, const float *bias,
                                                  float *c, int64_t m, int64_t k, int64_t n,
                                                  const int32_t *table, const graphswap_lut_quant *quant);

/* The table-driven Conv2DTranspose: output = the quantized convolution of the zero-inserted,
 * padded input with the flipped filter (graphswap_lut_conv2d_f32 of them, + bias), as the input
 * gradient of the forward convolution `params` (dy = the transposed convolution's input, dx its
 * output, filter the Keras kernel = the forward HWIO filter; per-channel weight ranges over each
 * filter, the forward convolution's in_channels).  Only for a table that factors, T[a][b] =
 * f(a) g(b), whose row of the activation zero point is exact, sign-magnitude or symmetric 8-bit
 * weights, 8-bit activations and groups 1: else GRAPHSWAP_ERR_UNSUPPORTED.  The same bits as the
 * zero-inserted convolution. */
GRAPHSWAP_EXPORT int32_t graphswap_lut_conv2d_backprop_input_f32(const float *dy, const float *filter,
                                                                 const float *bias, float *dx,
                                                                 const int32_t *table,
                                                                 const graphswap_lut_quant *quant,
                                                                 const graphswap_conv2d_params *params);

/* output = quantized conv2d(input, filter) through `table` per `quant` (+ bias[out_channels]),
 * geometry and layouts as graphswap_conv2d_f32.  Per-channel weight ranges are over
 * filter[:, :, :, oc]; window code sums for the corrections are computed inside. */
GRAPHSWAP_EXPORT int32_t graphswap_lut_conv2d_f32(const float *input, const float *filter,
                                                  const float *bias, float *output,
                                                  const int32_t *table, const graphswap_lut_quant *quant,
                                                  const graphswap_conv2d_params *params);

/* ---- instruction-set paths of graphswap's own library ----
 *
 * The library is built for baseline x86-64 and carries per-ISA code for the table-driven kernels
 * (and its hand-written float conv), chosen when it is loaded: the best the CPU supports, or the
 * one named by the environment variable GRAPHSWAP_ISA = scalar | avx2 | avx512 | auto.
 *   scalar  plain C;  avx2  AVX2 + FMA;  avx512  AVX-512 F/BW/VL/DQ + VBMI (Ice Lake and later, Zen 4).
 * If GRAPHSWAP_ISA names a path this CPU cannot run (or no path), every entry point returns
 * GRAPHSWAP_ERR_UNSUPPORTED with the reason in graphswap_last_error(), until graphswap_set_isa succeeds.
 * The float GEMM runs on OpenBLAS, which picks its own kernels for the CPU (graphswap_blas_info). */

/* "scalar", "avx2" or "avx512": the path in use; "none" while a forced path is refused. */
GRAPHSWAP_EXPORT const char *graphswap_isa(void);

/* Space-separated paths this CPU can run, e.g. "scalar avx2 avx512". */
GRAPHSWAP_EXPORT const char *graphswap_isa_supported(void);

/* Switches the path for all later calls of every thread (not while calls are running):
 * name = "scalar" | "avx2" | "avx512" | "auto" (or NULL / "": auto).  Returns GRAPHSWAP_OK,
 * GRAPHSWAP_ERR_UNSUPPORTED if the CPU cannot run it, GRAPHSWAP_ERR_INVALID_ARGUMENT for an unknown
 * name (then, as with a refused GRAPHSWAP_ISA, entry points refuse to run until a call succeeds). */
GRAPHSWAP_EXPORT int32_t graphswap_set_isa(const char *name);

/* ---- factored tables ----
 *
 * A table whose products factor exactly, T[a][b] = f(a) * g(b) with integers f, g (a multiplier that
 * approximates each operand on its own and multiplies exactly: DRUM, operand truncation, the exact
 * product), runs through OpenBLAS's float32 GEMM of the mapped operands f(a), g(b) instead of the
 * table kernels: in runs of k whose terms' magnitudes sum to <= 2^24, so every partial sum is exact,
 * the runs added in int64 -- the same sums, bit for bit.  On by default; the environment variable
 * GRAPHSWAP_TABLE_FACTORING=off (or 0) keeps every table on the table kernels. */

/* 1 when `table`'s products take the factored GEMM (the table factors and factoring is on), 0 when
 * they take the table kernels; GRAPHSWAP_ERR_* (< 0) on error. */
GRAPHSWAP_EXPORT int32_t graphswap_lut_table_factored(const int32_t *table);

/* Switches factoring on (1) or off (0) for all later calls (not while calls are running); -1: back
 * to GRAPHSWAP_TABLE_FACTORING's setting.  Returns GRAPHSWAP_OK. */
GRAPHSWAP_EXPORT int32_t graphswap_set_table_factoring(int32_t enabled);

/* OpenBLAS build and core in use (e.g. "OpenBLAS 0.3.34 DYNAMIC_ARCH ...; core SkylakeX; threads 1"). */
GRAPHSWAP_EXPORT const char *graphswap_blas_info(void);
/* ---- multiplier level: approximation-aware gradients (backward="lut_grad"; src/lut_grad.c) ----
 *
 * The table's own partial derivatives as smoothed finite differences, in operand-value order
 * (values 0..255 unsigned; -128..127, the two's-complement value of the code, signed), a central
 * difference of half-width h clamped at the ends of the range:
 *   d_first [(ca << 8) | cb] = (f(a+, b) - f(a-, b)) / (a+ - a-),  a+- = clamp(a +- h)
 *   d_second[(ca << 8) | cb] = (f(a, b+) - f(a, b-)) / (b+ - b-),  b+- = clamp(b +- h)
 * with f(a, b) = table[(code(a) << 8) | code(b)].  Both outputs have 65536 floats; 1 <= h <= 255.
 */
GRAPHSWAP_EXPORT int32_t graphswap_lut_derivative_tables(const int32_t *table, int32_t signed_operands,
                                                         int32_t half_width, float *d_first,
                                                         float *d_second);

/* The gradient products of acc = sum_k table[(a[m,k] << 8) | b[k,n]] with the derivative tables:
 *   da[i,k] = sum_j d_first [(a[i,k] << 8) | b[k,j]] * sign[k,j] * g_a[i,j]   (sign NULL: +1)
 *   db[k,j] = sum_i d_second[(a[i,k] << 8) | b[k,j]] * g_b[i,j]
 * a (m,k) and b (k,n) codes, sign (k,n) int8 of +-1 or NULL, g_a and g_b (m,n) float, da (m,k) and
 * db (k,n) float; either output may be NULL (its table and g are then not read).  Sums in double. */
GRAPHSWAP_EXPORT int32_t graphswap_lut_matmul_grad(const uint8_t *a, const uint8_t *b,
                                                   const int8_t *sign, const float *d_first,
                                                   const float *d_second, const float *g_a,
                                                   const float *g_b, float *da, float *db,
                                                   int64_t m, int64_t k, int64_t n);

/* ---- extra exports of graphswap's own library (the built-in multipliers) ----
 *
 * Fills table[(a_code << 8) | b_code] (65536 int32 entries, codes as for graphswap_lut_*) with the
 * built-in multiplier `name`: "mul8u_exact", "mul8s_exact", "mul8{u,s}_trunc{1..8}",
 * "mul8{u,s}_drum{3..6}", "mul8{u,s}_mitchell" (designs and citations in src/multipliers.c).
 * Returns GRAPHSWAP_OK, or GRAPHSWAP_ERR_INVALID_ARGUMENT for an unknown name / NULL pointer. */
GRAPHSWAP_EXPORT int32_t graphswap_builtin_multiplier_table(const char *name, int32_t *table);

/* ---- extra exports of graphswap's own library: the swapped layers' output epilogue ----
 *
 * In place over y (rows x channels, row-major): y[r, c] = y[r, c] * gain[c] + shift[c], with gain
 * NULL meaning 1 and shift NULL meaning 0, then y = (y < 0 ? 0 : y) if apply_relu -- a layer's
 * output correction, bias and ReLU in one pass over the output (TensorFlow's BiasAdd over a few
 * channels costs as much as the product itself).  Returns GRAPHSWAP_OK, or
 * GRAPHSWAP_ERR_INVALID_ARGUMENT for negative sizes or a NULL y. */
GRAPHSWAP_EXPORT int32_t graphswap_channel_affine_f32(float *y, int64_t rows, int64_t channels,
                                                      const float *gain, const float *shift,
                                                      int32_t apply_relu);

#ifdef __cplusplus
}
#endif

#endif /* GRAPHSWAP_KERNELS_H */
