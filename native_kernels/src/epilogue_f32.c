/*
 * epilogue_f32.c -- the swapped layers' output epilogue (graphswap_channel_affine_f32):
 * y = y * gain + shift per output channel, then max(y, 0) when asked, in place, in one pass.
 *
 * Why in C: a layer's output correction (gain, offset), its bias and its ReLU were four TensorFlow
 * ops (Mul, AddV2, BiasAdd, Relu), four passes over the output; over LeNet-5's 6 channels each of
 * the first three cost about as much as the convolution itself (Eigen broadcasts badly over a short
 * last axis).  Here the output is one flat loop against the channel pattern repeated to 256
 * floats (full vectors, no branch: a branchy ReLU mispredicts on every other sign), blocks split
 * over the OpenMP team.  ReLU keeps NaN (as TensorFlow's does): y < 0 ? 0 : y.
 */
#include "internal.h"

#define FN "graphswap_channel_affine_f32"
#define GS_AFFINE_MIN_ELEMS_PER_THREAD 262144.0 /* below this a second thread's wake-up dominates */

/* The channel pattern repeated to at least this many floats: long enough for the loop to run on
 * full vectors whatever the channel count (LeNet-5's 6 channels would leave 6-float rows). */
#define GS_AFFINE_PATTERN 256

GRAPHSWAP_EXPORT int32_t graphswap_channel_affine_f32(float *y, int64_t rows, int64_t channels,
                                                      const float *gain, const float *shift,
                                                      int32_t apply_relu)
{
    if (rows < 0 || channels < 0)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, FN ": sizes must be >= 0, got rows=%lld channels=%lld",
                       (long long)rows, (long long)channels);
    int64_t elems;
    if (gs_mul_i64(rows, channels, &elems))
        return gs_fail(GRAPHSWAP_ERR_OVERFLOW, FN ": rows x channels overflows int64");
    if (elems == 0 || (!gain && !shift && !apply_relu)) return GRAPHSWAP_OK;
    if (!y) return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, FN ": y is NULL (%lld elements)", (long long)elems);
    /* gain and shift repeated over a pattern of whole rows (1 and 0 where not given: exact) */
    const int64_t reps = channels >= GS_AFFINE_PATTERN ? 1 : (GS_AFFINE_PATTERN + channels - 1) / channels;
    const int64_t period = reps * channels;
    float *pattern = (float *)gs_alloc(2 * period * (int64_t)sizeof(float));
    if (!pattern) return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, FN ": cannot allocate %lld floats", (long long)(2 * period));
    float *g = pattern, *s = pattern + period;
    for (int64_t i = 0; i < period; ++i) {
        g[i] = gain ? gain[i % channels] : 1.0f;
        s[i] = shift ? shift[i % channels] : 0.0f;
    }
    const int64_t blocks = (elems + period - 1) / period;
    const int nt = gs_threads_for((double)elems, GS_AFFINE_MIN_ELEMS_PER_THREAD);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        float *restrict v = y + blk * period;
        const int64_t len = blk == blocks - 1 ? elems - blk * period : period;
        if (apply_relu) {
            for (int64_t i = 0; i < len; ++i) {
                const float t = v[i] * g[i] + s[i];
                v[i] = t < 0.0f ? 0.0f : t; /* keeps NaN, as TensorFlow's Relu does */
            }
        } else {
            for (int64_t i = 0; i < len; ++i) v[i] = v[i] * g[i] + s[i];
        }
    }
    gs_free(pattern);
    return GRAPHSWAP_OK;
}
