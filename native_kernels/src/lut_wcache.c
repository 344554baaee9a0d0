/*
 * lut_wcache.c -- quantized weights, cached by content.
 *
 * A recurrent layer multiplies by the same weights at every timestep (an LSTM over 100 tokens
 * quantizes its kernels 100 times per forward pass), and an inference loop multiplies by the same
 * weights at every batch.  Quantizing K x N weights (range, scale, rounding, sign-magnitude split,
 * transpose) costs tens of nanoseconds per weight; comparing them against a stored copy and copying
 * the stored codes costs a few.  So gs_wquant_prepare keeps the last few results keyed by the
 * weights' full contents and the quantization parameters (memcmp against the stored copy, as
 * lut_table.c keys tables: a caller that rewrites its buffer in place - an optimizer step - gets
 * codes of the new values).  A hit returns a copy the caller owns, so nothing changes for callers:
 * they free it with gs_wquant_free as before.
 */
#include <pthread.h>
#include <string.h>

#include "lut_internal.h"

/* enough entries for every layer of a small model's forward pass (MobileNetV1 has 28 swapped
 * products: a shorter least-recently-used list would never hit), within a budget of weights */
#define GS_WCACHE_ENTRIES 64
#define GS_WCACHE_MAX_WEIGHTS (2 * 1024 * 1024) /* larger layers are quantized every call */
#define GS_WCACHE_BUDGET (8 * 1024 * 1024)      /* weights held in all entries (~80 MB with codes) */
/* Storing a layer costs a copy of its weights and codes: about 10% of quantizing them.  A
 * training step's weights are new at every call, so they would pay it for nothing; layers above
 * GS_WCACHE_SMALL weights are stored only when their fingerprint (sizes, parameters and a sample
 * of the values) was seen by one of the last GS_WCACHE_SEEN misses - the second call of an
 * inference loop, never a training step.  A hit still compares every weight. */
#define GS_WCACHE_SMALL (256 * 1024)
#define GS_WCACHE_SEEN 16
#define GS_WCACHE_SAMPLES 4096

typedef struct {
    int64_t K, N;
    int sm, is_signed, per_channel, weight_bits;
    float *weights; /* K x N, the key */
    gs_wquant w;    /* the result, owned by the cache */
} wcache_entry;

static pthread_mutex_t wcache_lock = PTHREAD_MUTEX_INITIALIZER;
static wcache_entry *wcache[GS_WCACHE_ENTRIES]; /* most recently used first */
static uint64_t wcache_seen[GS_WCACHE_SEEN];     /* fingerprints of recent large misses, a ring */
static int wcache_seen_next;

/* Sizes, parameters and GS_WCACHE_SAMPLES evenly spaced weights' bits, mixed (FNV-1a). */
static uint64_t fingerprint(const float *wf, int64_t K, int64_t N, int sm, int is_signed, int per_channel,
                            int weight_bits)
{
    const int64_t n = K * N, step = n > GS_WCACHE_SAMPLES ? n / GS_WCACHE_SAMPLES : 1;
    uint64_t h = 1469598103934665603ull;
    const int64_t head[6] = {K, N, sm, is_signed, per_channel, weight_bits};
    for (int i = 0; i < 6; ++i) h = (h ^ (uint64_t)head[i]) * 1099511628211ull;
    for (int64_t i = 0; i < n; i += step) {
        uint32_t bits;
        memcpy(&bits, wf + i, sizeof bits);
        h = (h ^ bits) * 1099511628211ull;
    }
    return h | 1; /* 0 marks an empty slot */
}

/* Whether a large layer's weights were seen by a recent miss (called with the lock held);
 * records them otherwise. */
static int seen_before(uint64_t print)
{
    for (int i = 0; i < GS_WCACHE_SEEN; ++i)
        if (wcache_seen[i] == print) return 1;
    wcache_seen[wcache_seen_next] = print;
    wcache_seen_next = (wcache_seen_next + 1) % GS_WCACHE_SEEN;
    return 0;
}

static void entry_free(wcache_entry *e)
{
    if (!e) return;
    gs_free(e->weights);
    gs_wquant_free(&e->w);
    gs_free(e);
}

static void *copy_of(const void *src, int64_t bytes, int *failed)
{
    if (!src) return NULL;
    void *dst = gs_alloc(bytes > 0 ? bytes : 1);
    if (!dst) {
        *failed = 1;
        return NULL;
    }
    memcpy(dst, src, (size_t)bytes);
    return dst;
}

/* A deep copy of `src`, the quantization of K x N weights (sign-magnitude: 2N code columns, per
 * gs_wquant_make_sm); 0 on success. */
static int wquant_copy(const gs_wquant *src, int64_t K, int64_t N, int sm, gs_wquant *dst)
{
    const int64_t cols = sm ? 2 * N : N, kn = K * cols > 0 ? K * cols : 1, n = cols > 0 ? cols : 1;
    int failed = 0;
    memset(dst, 0, sizeof *dst);
    dst->q = copy_of(src->q, kn, &failed);
    dst->qt = copy_of(src->qt, kn, &failed);
    dst->colsum = copy_of(src->colsum, n * 8, &failed);
    dst->scale = copy_of(src->scale, n * 8, &failed);
    dst->recip = copy_of(src->recip, n * 8, &failed);
    dst->zero = copy_of(src->zero, n * 4, &failed);
    dst->bad = copy_of(src->bad, n, &failed);
    dst->sign = copy_of(src->sign, K * N > 0 ? K * N : 1, &failed);
    dst->any_bad = src->any_bad;
    if (failed) gs_wquant_free(dst);
    return failed;
}

static int matches(const wcache_entry *e, const float *wf, int64_t K, int64_t N, int sm, int is_signed,
                   int per_channel, int weight_bits)
{
    return e && e->K == K && e->N == N && e->sm == sm && e->is_signed == (sm ? 0 : is_signed) &&
           e->per_channel == per_channel && e->weight_bits == weight_bits &&
           memcmp(e->weights, wf, (size_t)(K * N) * sizeof(float)) == 0;
}

int32_t gs_wquant_prepare(const char *fn, const float *wf, int64_t K, int64_t N, int sm, int is_signed,
                          int per_channel, int weight_bits, gs_wquant *out)
{
    int cacheable = K > 0 && N > 0 && K * N <= GS_WCACHE_MAX_WEIGHTS;
    if (cacheable) {
        pthread_mutex_lock(&wcache_lock);
        for (int i = 0; i < GS_WCACHE_ENTRIES; ++i) {
            wcache_entry *e = wcache[i];
            if (!matches(e, wf, K, N, sm, is_signed, per_channel, weight_bits)) continue;
            memmove(wcache + 1, wcache, (size_t)i * sizeof wcache[0]); /* move to front */
            wcache[0] = e;
            const int failed = wquant_copy(&e->w, K, N, sm, out);
            pthread_mutex_unlock(&wcache_lock);
            if (!failed) return GRAPHSWAP_OK;
            return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, "%s: cannot allocate weight codes", fn);
        }
        if (K * N > GS_WCACHE_SMALL)
            cacheable = seen_before(fingerprint(wf, K, N, sm, is_signed, per_channel, weight_bits));
        pthread_mutex_unlock(&wcache_lock);
    }
    int32_t rc = sm ? gs_wquant_make_sm(fn, wf, K, N, per_channel, weight_bits, out)
                    : gs_wquant_make(fn, wf, K, N, is_signed, per_channel, weight_bits, out);
    if (rc != GRAPHSWAP_OK || !cacheable) return rc;
    /* keep a copy (a failed allocation only means no caching) */
    wcache_entry *e = gs_alloc((int64_t)sizeof *e);
    if (!e) return rc;
    memset(e, 0, sizeof *e);
    e->K = K, e->N = N, e->sm = sm, e->is_signed = sm ? 0 : is_signed, e->per_channel = per_channel;
    e->weight_bits = weight_bits;
    int failed = 0;
    e->weights = copy_of(wf, K * N * (int64_t)sizeof(float), &failed);
    if (failed || wquant_copy(out, K, N, sm, &e->w)) {
        gs_free(e->weights);
        gs_free(e);
        return rc;
    }
    wcache_entry *evicted[GS_WCACHE_ENTRIES];
    int dropped = 0;
    pthread_mutex_lock(&wcache_lock);
    if (wcache[GS_WCACHE_ENTRIES - 1]) evicted[dropped++] = wcache[GS_WCACHE_ENTRIES - 1];
    memmove(wcache + 1, wcache, (GS_WCACHE_ENTRIES - 1) * sizeof wcache[0]);
    wcache[0] = e;
    int64_t held = 0; /* the least recently used entries go while the budget is exceeded */
    for (int i = 0; i < GS_WCACHE_ENTRIES && wcache[i]; ++i) {
        held += wcache[i]->K * wcache[i]->N;
        if (held > GS_WCACHE_BUDGET && i > 0) {
            evicted[dropped++] = wcache[i];
            wcache[i] = NULL;
        }
    }
    for (int i = 1, j = 1; i < GS_WCACHE_ENTRIES; ++i) { /* close the gaps, order kept */
        if (wcache[i]) wcache[j++] = wcache[i];
        if (i >= j) wcache[i] = NULL;
    }
    pthread_mutex_unlock(&wcache_lock);
    for (int i = 0; i < dropped; ++i) entry_free(evicted[i]);
    return rc;
}
