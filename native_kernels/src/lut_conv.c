/*
 * lut_conv.c -- table-driven 2-D convolution entry points (NHWC input, HWIO filter, all of
 * graphswap_conv2d_params):
 *   graphswap_lut_conv2d      8-bit codes in, exact int64 sums (+ window code sums) out;
 *   graphswap_lut_conv2d_f32  float32 in, float32 out, quantization and corrections inside.
 *
 * Method: per group, the GEMM  out[pixel, oc] = sum_k T[patch[pixel, k]][filter[k, oc]]  over
 * blocks of 256 output pixels: each block's patches are gathered (im2col) straight into the
 * kernels' packed layout in a per-thread buffer (padding positions get the pad code -- the
 * activation zero point -- so those products do go through the table, as on a zero-point-padded
 * accelerator), the window code sums come from the same gather, and the ISA's kernel multiplies the
 * block with the group's filter columns.  Scratch is O(256 x kernel size) per thread, whatever the
 * batch.
 */
#include <math.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "lut_internal.h"

#define GS_CONV_MIN_WORK 65536.

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Contiguous runs of a window inside the image: run i copies len bytes from offset off[i] (from
 * the window's first input element) to patch position pos[i]. */
typedef struct conv_runs {
    int64_t count, len;
    int64_t *off, *pos;
} conv_runs;

/* Patch (row-major, k bytes) of one output pixel into t (no sum). */
static inline void patch(const graphswap_conv2d_params *P, const gs_conv_geo *G, const uint8_t *img,
                         uint8_t pad, int64_t ih0, int64_t iw0, const conv_runs *R, uint8_t *t)
{
    const int64_t cg = G->cin_g, FW = P->filter_width, C = P->in_channels;
    const int64_t H = P->in_height, W = P->in_width;
    if (ih0 >= 0 && ih0 + (P->filter_height - 1) * P->dilation_height < H && iw0 >= 0 &&
        iw0 + (FW - 1) * P->dilation_width < W) {
        const uint8_t *src = img + (ih0 * W + iw0) * C;
        const int64_t len = R->len;
        for (int64_t i = 0; i < R->count; ++i) {
            const uint8_t *s = src + R->off[i];
            uint8_t *d = t + R->pos[i];
            int64_t j = 0;
            for (; j + 8 <= len; j += 8) memcpy(d + j, s + j, 8);
            for (; j < len; ++j) d[j] = s[j];
        }
        return;
    }
    for (int64_t fh = 0; fh < P->filter_height; ++fh) {
        const int64_t ih = ih0 + fh * P->dilation_height;
        const int inside_h = ih >= 0 && ih < H;
        for (int64_t fw = 0; fw < FW; ++fw) {
            const int64_t iw = iw0 + fw * P->dilation_width;
            uint8_t *tk = t + (fh * FW + fw) * cg;
            if (!inside_h || iw < 0 || iw >= W)
                memset(tk, pad, (size_t)cg);
            else
                memcpy(tk, img + (ih * W + iw) * C, (size_t)cg);
        }
    }
}

/* Patches of output pixels [p0, p0 + rows) of group g into the packed block dst (8 pixels at a
 * time through tmp, 8 x k8 bytes, and 8 x 8 byte transposes); sums[r] = window code sums (unless sums
 * is NULL). */
static void gather(const graphswap_conv2d_params *P, const gs_conv_geo *G, const uint8_t *codes,
                   uint8_t pad, int64_t g, int64_t p0, int64_t rows, const conv_runs *R, uint8_t *dst,
                   int64_t *sums, uint8_t *tmp)
{
    const int64_t K = G->taps, k8 = (K + 7) & ~(int64_t)7, C = P->in_channels;
    const int64_t groups = (rows + 63) / 64;
    if (rows % 64) memset(dst + (groups - 1) * K * 64, 0, (size_t)(K * 64));
    int64_t pix = p0;
    int64_t ow = pix % P->out_width, oh = (pix / P->out_width) % P->out_height;
    int64_t n = pix / (P->out_width * P->out_height);
    memset(tmp, 0, (size_t)(8 * k8)); /* pad columns K..k8 stay 0; so do rows past the last pixel */
    for (int64_t r8 = 0; r8 < rows; r8 += 8) {
        const int64_t nr = rows - r8 < 8 ? rows - r8 : 8;
        if (nr < 8) memset(tmp + nr * k8, 0, (size_t)((8 - nr) * k8));
        for (int64_t i = 0; i < nr; ++i) {
            uint8_t *t = tmp + i * k8;
            const uint8_t *img = codes + n * P->in_height * P->in_width * C + g * G->cin_g;
            patch(P, G, img, pad, oh * P->stride_height - P->pad_top, ow * P->stride_width - P->pad_left, R, t);
            if (sums) {
                int64_t sum = 0;
                for (int64_t k = 0; k < K; ++k) sum += t[k];
                sums[r8 + i] = sum;
            }
            if (++ow == P->out_width) {
                ow = 0;
                if (++oh == P->out_height) { oh = 0; ++n; }
            }
        }
        gs_pack_rows8(tmp, k8, K, dst + (r8 / 64) * K * 64 + (r8 % 64));
    }
}

/* Where gather_direct reads the input codes: NHWC as given, or run()'s channel planes. */
typedef struct code_layout {
    const uint8_t *codes;
    int64_t image, group, pixel; /* element strides of an image, a group's first channel, a pixel */
} code_layout;

/* Direct variant for windows with few channels per tap (cin_g < 4, e.g. a first layer, or a
 * depthwise convolution, whose codes run() first transposes to one plane per channel), tap by tap:
 * the lanes of a packed group are consecutive output pixels, so within one output row a tap reads
 * input positions `stride_width` apart -- one contiguous copy for a single channel at unit stride.
 * The window code sums (unless sums is NULL) are added lane-wise afterwards.  (Pixel by pixel, 25 scalar loads and
 * 64-byte-strided stores per pixel took 70% of LeNet-5's first table-driven conv.) */
static void gather_direct(const graphswap_conv2d_params *P, const gs_conv_geo *G, const code_layout *L,
                          uint8_t pad, int64_t g, int64_t p0, int64_t rows, uint8_t *dst, int64_t *sums)
{
    const int64_t K = G->taps, cg = G->cin_g, FW = P->filter_width, C = L->pixel;
    const int64_t H = P->in_height, W = P->in_width, OW = P->out_width, OH = P->out_height;
    const int64_t sw = P->stride_width;
    const int64_t groups = (rows + 63) / 64;
    if (rows % 64) memset(dst + (groups - 1) * K * 64, 0, (size_t)(K * 64));
    for (int64_t gi = 0; gi < groups; ++gi) {
        uint8_t *block = dst + gi * K * 64;
        const int64_t lanes = min64(64, rows - gi * 64);
        for (int64_t lane = 0, pix = p0 + gi * 64; lane < lanes;) {
            const int64_t ow = pix % OW, oh = (pix / OW) % OH, n = pix / (OW * OH);
            const int64_t len = min64(lanes - lane, OW - ow); /* lanes left in this output row */
            const uint8_t *img = L->codes + n * L->image + g * L->group;
            for (int64_t fh = 0; fh < P->filter_height; ++fh) {
                const int64_t ih = oh * P->stride_height - P->pad_top + fh * P->dilation_height;
                for (int64_t fw = 0; fw < FW; ++fw) {
                    const int64_t iw0 = ow * sw - P->pad_left + fw * P->dilation_width;
                    /* lanes [lo, hi) read inside the row; the others are padding */
                    const int64_t lo = iw0 >= 0 ? 0 : min64(len, (-iw0 + sw - 1) / sw);
                    const int64_t hi = iw0 + (len - 1) * sw < W ? len
                                       : (W - iw0 <= 0 ? lo : (W - iw0 + sw - 1) / sw);
                    for (int64_t ic = 0; ic < cg; ++ic) {
                        uint8_t *d = block + ((fh * FW + fw) * cg + ic) * 64 + lane;
                        if (ih < 0 || ih >= H || hi <= lo) {
                            memset(d, pad, (size_t)len);
                            continue;
                        }
                        const uint8_t *s = img + ih * W * C + ic;
                        if (lo > 0) memset(d, pad, (size_t)lo);
                        if (hi < len) memset(d + hi, pad, (size_t)(len - hi));
                        if (C == 1 && sw == 1)
                            memcpy(d + lo, s + iw0 + lo, (size_t)(hi - lo));
                        else
                            for (int64_t l = lo; l < hi; ++l) d[l] = s[(iw0 + l * sw) * C];
                    }
                }
            }
            lane += len, pix += len;
        }
        if (!sums) continue;
        uint32_t lane_sums[64] = {0};
        for (int64_t k = 0; k < K; ++k)
            for (int l = 0; l < 64; ++l) lane_sums[l] += block[k * 64 + l];
        for (int64_t l = 0; l < lanes; ++l) sums[gi * 64 + l] = lane_sums[l];
    }
}

typedef struct conv_job {
    const graphswap_conv2d_params *P;
    const gs_conv_geo *G;
    const gs_lut_table *t;
    gs_isa_level isa;
    const uint8_t *codes;   /* input codes, NHWC */
    uint8_t pad;
    const uint8_t *wq;      /* filter codes, taps x out_channels */
    const gs_wquant *w;     /* qt, colsum, scale, zero, bad */
    int64_t *acc;           /* integer output (or NULL) */
    int64_t *window_sums;   /* integer output (or NULL) */
    float *out;             /* float output (or NULL) */
    const float *bias;
    const double *sasb;
    int is_unsigned;
    int64_t zx;
    int sm;                 /* sign-magnitude weights: wq and w->qt hold 2 physical channels each */
} conv_job;

/* Depthwise (one input channel per group, channel planes): the exact sums of group g's output
 * channels [j0, j0 + ncols) over output pixels [p0, p0 + rows) straight from the plane, through
 * the transposed table's columns (one column per tap and channel: T[.][weight code]) -- no im2col
 * block and no expanded table, whose fixed cost per job dwarfs a depthwise job's rows x taps x 1
 * products.  acc[r * ncols + j] = sum_k T[a_k, q_kj] (sign-magnitude: sum_k sigma_kj T[a_k, m_kj],
 * the finished sum gs_sm_combine would give), sums[r] = the window's code sums (padding: the pad
 * code, as gather_direct).  Scratch: K * (ncols * 12 + 8) bytes at `scratch`. */
static void depthwise_block(const conv_job *J, const code_layout *L, int64_t g, int64_t j0, int64_t ncols,
                            int64_t p0, int64_t rows, int64_t *acc, int64_t *sums, uint8_t *scratch)
{
    const graphswap_conv2d_params *P = J->P;
    const int64_t K = J->G->taps, cog = J->G->cout_g, cout = P->out_channels;
    const int64_t H = P->in_height, W = P->in_width, OW = P->out_width, OH = P->out_height;
    const int64_t FH = P->filter_height, FW = P->filter_width, px = L->pixel;
    const int64_t dh = P->dilation_height, dw = P->dilation_width;
    const int32_t **col = (const int32_t **)scratch;        /* K x ncols table columns */
    int64_t *off = (int64_t *)(col + K * ncols);            /* K: tap offsets inside the image */
    int32_t *sgn = (int32_t *)(off + K);                    /* K x ncols: +1 / -1 */
    for (int64_t k = 0; k < K; ++k) {
        off[k] = ((k / FW) * dh * W + (k % FW) * dw) * px;
        for (int64_t j = 0; j < ncols; ++j) {
            const int64_t c = g * cog + j0 + j;
            int code = J->sm ? (J->wq[k * 2 * cout + 2 * c] | J->wq[k * 2 * cout + 2 * c + 1])
                             : J->wq[k * cout + c];
            col[k * ncols + j] = J->t->tt + ((int64_t)code << 8);
            sgn[k * ncols + j] = J->sm ? J->w->sign[k * cout + c] : 1;
        }
    }
    const uint8_t pad = J->pad;
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t pix = p0 + r;
        const int64_t ow = pix % OW, oh = (pix / OW) % OH, n = pix / (OW * OH);
        const uint8_t *img = L->codes + n * L->image + g * L->group;
        const int64_t ih0 = oh * P->stride_height - P->pad_top, iw0 = ow * P->stride_width - P->pad_left;
        int64_t *out = acc + r * ncols;
        int64_t s = 0;
        for (int64_t j = 0; j < ncols; ++j) out[j] = 0;
        const int inside = ih0 >= 0 && ih0 + (FH - 1) * dh < H && iw0 >= 0 && iw0 + (FW - 1) * dw < W;
        const uint8_t *base = inside ? img + (ih0 * W + iw0) * px : img;
        if (ncols == 1) { /* the usual depthwise layer: one output channel per group */
            int64_t v = 0;
            if (inside)
                for (int64_t k = 0; k < K; ++k) {
                    const uint8_t a = base[off[k]];
                    s += a, v += (int64_t)sgn[k] * col[k][a];
                }
            else
                for (int64_t k = 0; k < K; ++k) {
                    const int64_t ih = ih0 + (k / FW) * dh, iw = iw0 + (k % FW) * dw;
                    const uint8_t a = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? img[(ih * W + iw) * px] : pad;
                    s += a, v += (int64_t)sgn[k] * col[k][a];
                }
            out[0] = v;
        } else {
            for (int64_t k = 0; k < K; ++k) {
                uint8_t a;
                if (inside) {
                    a = base[off[k]];
                } else {
                    const int64_t ih = ih0 + (k / FW) * dh, iw = iw0 + (k % FW) * dw;
                    a = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? img[(ih * W + iw) * px] : pad;
                }
                s += a;
                for (int64_t j = 0; j < ncols; ++j) out[j] += sgn[k * ncols + j] * col[k * ncols + j][a];
            }
        }
        if (sums) sums[r] = s;
    }
}

static int32_t run(const char *fn, const conv_job *J)
{
    const graphswap_conv2d_params *P = J->P;
    const gs_conv_geo *G = J->G;
    const int64_t K = G->taps, cout = P->out_channels, cog = G->cout_g;
    const gs_lut_shape shape = gs_lut_job_shape(J->isa, J->t);
    const int64_t width = J->sm ? 2 : 1;      /* physical channels per output channel */
    const int64_t cols = shape.cols / width;  /* output channels per job */
    const int64_t blocks = (G->pixels + shape.rows - 1) / shape.rows;
    const int64_t chunks = cog > 0 ? (cog + cols - 1) / cols : 1;
    const int64_t jobs = blocks * chunks * P->groups;
    int nt = gs_threads_for((double)G->pixels * (double)K * (double)(cout > 0 ? cout : 1), GS_CONV_MIN_WORK);
    if (nt > jobs) nt = (int)jobs;
    if (nt < 1) nt = 1;
    const int64_t kscratch = J->t ? (gs_lut_scratch_bytes(J->isa, J->t, K, shape.rows) + 63) / 64 * 64 : 0;
    const int64_t packbytes = (gs_lut_packed_bytes(shape.rows, K) + 63) / 64 * 64;
    const int64_t accbytes = J->out ? shape.rows * shape.cols * 8 : 0;
    const int64_t tmpbytes = (8 * ((K + 7) & ~(int64_t)7) + 63) / 64 * 64;
    const int64_t per_thread = kscratch + packbytes + accbytes + shape.rows * 8 + tmpbytes;
    uint8_t *scratch = gs_alloc(per_thread * nt);
    /* runs of an interior window: whole filter rows when taps are adjacent in memory */
    conv_runs R;
    const int merge = P->dilation_width == 1 && G->cin_g == P->in_channels;
    R.count = merge ? P->filter_height : P->filter_height * P->filter_width;
    R.len = merge ? P->filter_width * G->cin_g : G->cin_g;
    R.off = gs_alloc((R.count > 0 ? R.count : 1) * 2 * 8);
    if (!scratch || !R.off) {
        gs_free(scratch), gs_free(R.off);
        return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, "%s: cannot allocate %lld bytes of im2col scratch", fn,
                       (long long)(per_thread * nt));
    }
    R.pos = R.off + (R.count > 0 ? R.count : 1);
    const int direct = G->cin_g < 4;
    /* a depthwise convolution reads one channel of every pixel: from channel planes (NCHW), a tap
     * of an output row is one contiguous copy instead of bytes in_channels apart */
    const int64_t C = P->in_channels, HW = P->in_height * P->in_width;
    const int planar = direct && G->cin_g == 1 && P->groups == C && C > 1 && P->batch * HW > 0;
    code_layout L = {J->codes, HW * C, G->cin_g, C};
    uint8_t *planes = NULL;
    if (planar) {
        planes = gs_alloc(P->batch * C * HW);
        if (!planes) {
            gs_free(scratch), gs_free(R.off);
            return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, "%s: cannot allocate %lld bytes of channel planes",
                           fn, (long long)(P->batch * C * HW));
        }
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
        for (int64_t row = 0; row < P->batch * P->in_height; ++row) {
            const int64_t n = row / P->in_height, h = row % P->in_height;
            const uint8_t *src = J->codes + row * P->in_width * C;
            uint8_t *dst = planes + n * C * HW + h * P->in_width;
            for (int64_t c = 0; c < C; ++c) /* the row (W x C bytes) stays in cache */
                for (int64_t w = 0; w < P->in_width; ++w) dst[c * HW + w] = src[w * C + c];
        }
        L = (code_layout){planes, C * HW, HW, 1};
    }
    /* a depthwise convolution into floats: straight from the planes (depthwise_block), when its
     * per-job tap columns fit in the packed block's space */
    const int depthwise = planar && J->out && J->t && ((cog < cols ? cog : cols) * 12 + 8) * K <= packbytes;
    /* window code sums: asked for, or the zero-point correction of asymmetric weights needs them */
    const int need_sums = J->window_sums || (J->out && J->is_unsigned && !J->sm);
    for (int64_t fh = 0, i = 0; fh < P->filter_height; ++fh)
        for (int64_t fw = 0; fw < (merge ? 1 : P->filter_width); ++fw, ++i) {
            R.off[i] = (fh * P->dilation_height * P->in_width + fw * P->dilation_width) * P->in_channels;
            R.pos[i] = (fh * P->filter_width + fw) * G->cin_g;
        }
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
    for (int64_t job = 0; job < jobs; ++job) {
#ifdef _OPENMP
        uint8_t *mine = scratch + (int64_t)omp_get_thread_num() * per_thread;
#else
        uint8_t *mine = scratch;
#endif
        uint8_t *packed = mine + kscratch;
        int64_t *acc = (int64_t *)(packed + packbytes);
        int64_t *sums = (int64_t *)((uint8_t *)acc + accbytes);
        uint8_t *tmp = (uint8_t *)(sums + shape.rows);
        const int64_t g = job / (blocks * chunks), rest = job % (blocks * chunks);
        const int64_t blk = rest / chunks, cc = rest % chunks;
        const int64_t p0 = blk * shape.rows, rows = min64(shape.rows, G->pixels - p0);
        const int64_t j0 = cc * cols, ncols = cog > 0 ? min64(cols, cog - j0) : 0;
        if (depthwise) {
            if (ncols == 0) continue;
            depthwise_block(J, &L, g, j0, ncols, p0, rows, acc, need_sums ? sums : NULL, packed);
            gs_epilogue e = {J->w->zero + (g * cog + j0), J->w->colsum + (g * cog + j0), J->sasb + (g * cog + j0),
                             J->bias ? J->bias + (g * cog + j0) : NULL, J->w->bad + (g * cog + j0), J->zx, K,
                             J->is_unsigned};
            gs_epilogue_rows(J->isa, &e, acc, 0, rows, ncols, need_sums ? sums : NULL,
                             J->out + p0 * cout + g * cog + j0, cout);
            continue;
        }
        if (direct)
            gather_direct(P, G, &L, J->pad, g, p0, rows, packed, need_sums ? sums : NULL);
        else
            gather(P, G, J->codes, J->pad, g, p0, rows, &R, packed, need_sums ? sums : NULL, tmp);
        if (J->window_sums && cc == 0)
            for (int64_t r = 0; r < rows; ++r) J->window_sums[(p0 + r) * P->groups + g] = sums[r];
        if (ncols == 0 || !J->t) continue;
        const int64_t col0 = g * cog + j0; /* first output channel of the job */
        gs_lut_args a;
        a.t = J->t;
        a.a = packed;
        a.rows = rows;
        a.k = K;
        a.b = J->wq + width * col0;
        a.ldb = width * cout;
        a.bt = J->w->qt + width * col0 * K;
        a.ldbt = K;
        a.ncols = width * ncols;
        a.scratch = mine;
        a.pairs = 0;
        if (!J->out) {
            a.acc = J->acc + p0 * cout + col0;
            a.ldacc = cout;
            gs_lut_run(J->isa, &a);
            continue;
        }
        a.acc = acc;
        const int pairs = gs_lut_run_for_epilogue(J->isa, &a, J->sm, J->w, cout, col0, ncols);
        gs_epilogue e = {J->w->zero + col0, J->w->colsum + col0, J->sasb + col0,
                         J->bias ? J->bias + col0 : NULL, J->w->bad + col0, J->zx, K, J->is_unsigned};
        gs_epilogue_rows(J->isa, &e, acc, pairs, rows, ncols, need_sums ? sums : NULL, J->out + p0 * cout + col0,
                         cout);
    }
    gs_free(scratch), gs_free(R.off), gs_free(planes);
    return GRAPHSWAP_OK;
}

GRAPHSWAP_EXPORT int32_t graphswap_lut_conv2d(const uint8_t *input, const uint8_t *filter,
                                              const int32_t *table, uint8_t pad_code, int64_t *acc,
                                              int64_t *window_sums,
                                              const graphswap_conv2d_params *params)
{
    static const char fn[] = "graphswap_lut_conv2d";
    int32_t rc = gs_isa_ready(fn);
    gs_conv_geo G;
    if (rc == GRAPHSWAP_OK) rc = gs_conv_validate(fn, params, &G);
    if (rc != GRAPHSWAP_OK) return rc;
    const graphswap_conv2d_params P = *params;
    if (G.pixels == 0) return GRAPHSWAP_OK;
    if (window_sums == NULL && G.out_elems == 0) return GRAPHSWAP_OK;
    if (G.out_elems > 0 && !acc)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, "%s: acc is NULL (%lld elements)", fn, (long long)G.out_elems);
    if (G.taps > 0 && ((G.in_elems > 0 && !input) || (G.filter_elems > 0 && (!filter || !table))))
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, "%s: input, filter and table must not be NULL", fn);
    if (G.taps == 0) {
        if (G.out_elems) memset(acc, 0, (size_t)G.out_elems * sizeof acc[0]);
        if (window_sums) memset(window_sums, 0, (size_t)(G.pixels * P.groups) * sizeof window_sums[0]);
        return GRAPHSWAP_OK;
    }
    gs_lut_table *t = NULL;
    if (G.out_elems > 0) {
        t = gs_lut_table_acquire(table);
        if (!t) return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, "%s: cannot allocate the prepared table", fn);
    }
    gs_wquant w;
    rc = gs_wcodes_make(fn, filter ? filter : (const uint8_t *)"", G.out_elems > 0 ? G.taps : 0,
                        P.out_channels, &w);
    if (rc == GRAPHSWAP_OK) {
        conv_job J = {0};
        J.P = &P, J.G = &G, J.t = t, J.isa = gs_isa(), J.codes = input, J.pad = pad_code, J.wq = filter;
        J.w = &w, J.acc = acc, J.window_sums = window_sums;
        rc = run(fn, &J);
        gs_wquant_free(&w);
    }
    gs_lut_table_release(t);
    return rc;
}

/* Window code sums per output pixel and group, sums[pixel * groups + g], as gather counts them:
 * the pad code for each tap outside the image.  Per input pixel and group the channels' (code -
 * pad) first, then per window taps * pad plus those of its taps inside the image. */
static int32_t window_code_sums(const char *fn, const graphswap_conv2d_params *P, const gs_conv_geo *G,
                                const uint8_t *codes, uint8_t pad, int64_t *sums)
{
    const int64_t H = P->in_height, W = P->in_width, C = P->in_channels, groups = P->groups, cg = G->cin_g;
    const int64_t in_pixels = P->batch * H * W, taps = P->filter_height * P->filter_width * cg;
    int64_t *chan = gs_alloc(in_pixels * groups * 8);
    if (!chan) return gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, "%s: cannot allocate the window code sums", fn);
    const int nt = gs_threads_for((double)G->in_elems, 1 << 18);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t p = 0; p < in_pixels; ++p)
        for (int64_t g = 0; g < groups; ++g) {
            int64_t s = 0;
            for (int64_t ic = 0; ic < cg; ++ic) s += (int64_t)codes[p * C + g * cg + ic] - pad;
            chan[p * groups + g] = s;
        }
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t pix = 0; pix < G->pixels; ++pix) {
        const int64_t ow = pix % P->out_width, oh = (pix / P->out_width) % P->out_height;
        const int64_t n = pix / (P->out_width * P->out_height);
        int64_t *out = sums + pix * groups;
        for (int64_t g = 0; g < groups; ++g) out[g] = taps * (int64_t)pad;
        for (int64_t fh = 0; fh < P->filter_height; ++fh) {
            const int64_t ih = oh * P->stride_height - P->pad_top + fh * P->dilation_height;
            if (ih < 0 || ih >= H) continue;
            for (int64_t fw = 0; fw < P->filter_width; ++fw) {
                const int64_t iw = ow * P->stride_width - P->pad_left + fw * P->dilation_width;
                if (iw < 0 || iw >= W) continue;
                const int64_t *src = chan + ((n * H + ih) * W + iw) * groups;
                for (int64_t g = 0; g < groups; ++g) out[g] += src[g];
            }
        }
    }
    gs_free(chan);
    return GRAPHSWAP_OK;
}

/* The convolution of a factored table through graphswap_conv2d_f32 (lut_factored.c's "whole
 * layers"): img holds the input's f(code) - f(pad) (gs_quantize_map), codes the codes themselves
 * when the window code sums are needed; the filter becomes g(code). */
static int32_t factored_conv(const char *fn, const graphswap_conv2d_params *P, const gs_conv_geo *G,
                             const gs_lut_table *t, const float *img, const uint8_t *codes, uint8_t pad,
                             const gs_wquant *w, int sm, const gs_epilogue *e, int need_sums, float *output)
{
    const int64_t K = G->taps, cout = P->out_channels;
    float *filt = gs_alloc(K * cout * (int64_t)sizeof(float));
    double *gsum = gs_alloc(cout * 8), *base = gs_alloc(cout * 8);
    int64_t *sums = need_sums ? gs_alloc(G->pixels * P->groups * 8) : NULL;
    int32_t rc = GRAPHSWAP_OK;
    if (!filt || !gsum || !base || (need_sums && !sums)) {
        rc = gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, "%s: cannot allocate the mapped filter", fn);
    } else {
        gs_factored_filter(t, w, K, cout, sm, filt, gsum);
        gs_factored_base(e, gsum, t->fa[pad], cout, base);
        rc = graphswap_conv2d_f32(img, filt, output, P);
        if (rc == GRAPHSWAP_OK && need_sums) rc = window_code_sums(fn, P, G, codes, pad, sums);
        if (rc == GRAPHSWAP_OK) rc = gs_factored_epilogue(fn, e, base, sums, P->groups, G->pixels, cout, output);
    }
    gs_free(filt), gs_free(gsum), gs_free(base), gs_free(sums);
    return rc;
}

/* A factored table's convolution of at most 4 outputs whose reduction is longer than one exact
 * float32 run (avx512): conv_narrow_avx512.c sums the mapped operands in exact runs into float64,
 * then factored_conv's epilogue, y = float32(scale (sum + base)) (+ bias) - its bits, and so the
 * table kernels'. */
static int32_t narrow_factored(const char *fn, const graphswap_conv2d_params *P, const gs_conv_geo *G,
                               const gs_lut_table *t, const float *img, uint8_t pad, const gs_wquant *w, int sm,
                               const gs_epilogue *e, int64_t run, float *output)
{
    const int64_t K = G->taps, cout = P->out_channels;
    float *filt = gs_alloc(K * cout * (int64_t)sizeof(float));
    double *gsum = gs_alloc(cout * 8), *base = gs_alloc(cout * 8), *sums = gs_alloc(G->out_elems * 8);
    int32_t rc = GRAPHSWAP_OK;
    if (!filt || !gsum || !base || !sums) {
        rc = gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, "%s: cannot allocate the mapped filter", fn);
    } else {
        gs_factored_filter(t, w, K, cout, sm, filt, gsum);
        gs_factored_base(e, gsum, t->fa[pad], cout, base);
        rc = gs_conv_narrow_avx512(img, filt, NULL, P, sums, run);
        double scale[4];
        for (int64_t j = 0; j < cout; ++j) scale[j] = e->bad[j] ? __builtin_nan("") : e->sasb[j];
        if (rc == GRAPHSWAP_OK)
            for (int64_t i = 0; i < G->out_elems; ++i) {
                const int64_t j = i % cout;
                const float y = (float)(scale[j] * (sums[i] + base[j]));
                output[i] = e->bias ? y + e->bias[j] : y;
            }
    }
    gs_free(filt), gs_free(gsum), gs_free(base), gs_free(sums);
    return rc;
}

/* Output positions whose window (in `group`'s channels) holds a non-finite input get NaN in the
 * group's output channels.  Rare path: plain loops. */
static void poison_windows(const graphswap_conv2d_params *P, const gs_conv_geo *G, const float *input,
                           float *out)
{
    const int64_t H = P->in_height, W = P->in_width, C = P->in_channels, cg = G->cin_g, cog = G->cout_g;
    for (int64_t pix = 0; pix < G->pixels; ++pix) {
        const int64_t ow = pix % P->out_width, oh = (pix / P->out_width) % P->out_height;
        const int64_t n = pix / (P->out_width * P->out_height);
        for (int64_t g = 0; g < P->groups; ++g) {
            int bad = 0;
            for (int64_t fh = 0; fh < P->filter_height && !bad; ++fh) {
                const int64_t ih = oh * P->stride_height - P->pad_top + fh * P->dilation_height;
                if (ih < 0 || ih >= H) continue;
                for (int64_t fw = 0; fw < P->filter_width && !bad; ++fw) {
                    const int64_t iw = ow * P->stride_width - P->pad_left + fw * P->dilation_width;
                    if (iw < 0 || iw >= W) continue;
                    const float *s = input + ((n * H + ih) * W + iw) * C + g * cg;
                    for (int64_t ic = 0; ic < cg; ++ic)
                        if (!gs_finite(s[ic])) { bad = 1; break; }
                }
            }
            if (bad)
                for (int64_t j = 0; j < cog; ++j) out[pix * P->out_channels + g * cog + j] = NAN;
        }
    }
}

GRAPHSWAP_EXPORT int32_t graphswap_lut_conv2d_f32(const float *input, const float *filter,
                                                  const float *bias, float *output,
                                                  const int32_t *table, const graphswap_lut_quant *quant,
                                                  const graphswap_conv2d_params *params)
{
    static const char fn[] = "graphswap_lut_conv2d_f32";
    int32_t rc = gs_isa_ready(fn);
    gs_conv_geo G;
    gs_qparams qx;
    if (rc == GRAPHSWAP_OK) rc = gs_conv_validate(fn, params, &G);
    if (rc == GRAPHSWAP_OK) rc = gs_quant_check(fn, quant, &qx);
    if (rc != GRAPHSWAP_OK) return rc;
    const graphswap_conv2d_params P = *params;
    if (G.in_elems > 0 && !input)
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, "%s: input is NULL (%lld elements)", fn, (long long)G.in_elems);
    float lo = INFINITY, hi = -INFINITY;
    int any_bad = 0;
    if (quant->activation_mode == GRAPHSWAP_QUANT_DYNAMIC || quant->observed_range)
        gs_range_f32(input, G.in_elems, &lo, &hi, &any_bad);
    if (quant->observed_range) quant->observed_range[0] = lo, quant->observed_range[1] = hi;
    if (quant->activation_mode == GRAPHSWAP_QUANT_DYNAMIC) qx = gs_qparams_activation(&qx, lo, hi);
    if (G.out_elems == 0) return GRAPHSWAP_OK;
    if (!output) return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, "%s: output is NULL (%lld elements)", fn,
                                (long long)G.out_elems);
    if (G.taps > 0 && (!filter || !table))
        return gs_fail(GRAPHSWAP_ERR_INVALID_ARGUMENT, "%s: filter and table must not be NULL", fn);

    gs_wquant w;
    const int sm = quant->weight_encoding == GRAPHSWAP_WEIGHTS_SIGN_MAGNITUDE;
    const int per_channel = quant->weight_mode == GRAPHSWAP_QUANT_PER_CHANNEL;
    const int wbits = gs_weight_bits(quant->weight_bits);
    rc = gs_wquant_prepare(fn, filter, G.taps, P.out_channels, sm, qx.weights_signed, per_channel,
                           wbits, &w);
    if (rc != GRAPHSWAP_OK) return rc;
    double *sasb = gs_alloc(P.out_channels * 8);
    uint8_t *codes = gs_alloc(G.in_elems > 0 ? G.in_elems : 1);
    gs_lut_table *t = G.taps > 0 ? gs_lut_table_acquire(table) : NULL;
    if (!sasb || !codes || (G.taps > 0 && !t)) {
        rc = gs_fail(GRAPHSWAP_ERR_OUT_OF_MEMORY, "%s: cannot allocate %lld bytes of input codes", fn,
                     (long long)G.in_elems);
    } else {
        for (int64_t o = 0; o < P.out_channels; ++o) sasb[o] = qx.scale * w.scale[o];
        if (quant->activation_mode == GRAPHSWAP_QUANT_STATIC) {
            /* the range pass was skipped unless observed: find non-finite values while quantizing */
            any_bad = 0;
        }
        /* a factored table whose whole reduction is exact in float32: the codes go straight to
         * the mapped image (and are kept only for window code sums) */
        const int need_sums = !qx.weights_signed && !sm;
        const int whole = G.taps > 0 && G.in_elems > 0 && gs_factored_float_fits(t, G.taps, qx.zero);
        /* or, longer, through the narrow direct kernel in exact float32 runs (avx512) */
        int64_t chain = 0;
        if (!whole && G.taps > 0 && G.in_elems > 0 && !need_sums && gs_isa() == GS_ISA_AVX512 &&
            gs_conv_narrow_avx512_fits(&P) &&
            gs_factored_float_fits(t, 1, qx.zero))
            for (chain = G.taps; chain > 1 && !gs_factored_float_fits(t, chain, qx.zero);)
                chain = (chain + 1) / 2;
        float *img = whole || chain > 0 ? gs_alloc(G.in_elems * (int64_t)sizeof(float)) : NULL;
        const int64_t n = G.in_elems, chunk = 1 << 16, chunks = (n + chunk - 1) / chunk;
        const gs_isa_level isa = gs_isa();
        int bad = 0;
        const int nt = gs_threads_for((double)n, 1 << 18);
#pragma omp parallel for num_threads(nt) schedule(static) reduction(| : bad) if (nt > 1)
        for (int64_t c = 0; c < chunks; ++c) {
            const int64_t i0 = c * chunk, len = min64(chunk, n - i0);
            const double recip = gs_recip(qx.scale);
            if (img)
                bad |= gs_quantize_map(t, input + i0, len, &qx, qx.zero, img + i0, need_sums ? codes + i0 : NULL);
            else
                bad |= gs_quantize_activations(isa, input + i0, len, &qx, &recip, codes + i0);
        }
        any_bad |= bad;
        if (G.taps == 0) {
            for (int64_t p = 0; p < G.pixels; ++p)
                for (int64_t o = 0; o < P.out_channels; ++o) {
                    float y = (float)(sasb[o] * 0.0);
                    if (bias) y += bias[o];
                    output[p * P.out_channels + o] = w.bad[o] ? NAN : y;
                }
        } else if (img && chain > 0) {
            const gs_epilogue e = {w.zero, w.colsum, sasb, bias, w.bad, qx.zero, G.taps, !qx.weights_signed};
            rc = narrow_factored(fn, &P, &G, t, img, (uint8_t)qx.zero, &w, sm, &e, chain, output);
        } else if (img) {
            const gs_epilogue e = {w.zero, w.colsum, sasb, bias, w.bad, qx.zero, G.taps, !qx.weights_signed};
            rc = factored_conv(fn, &P, &G, t, img, codes, (uint8_t)qx.zero, &w, sm, &e, need_sums, output);
        } else {
            conv_job J = {0};
            J.P = &P, J.G = &G, J.t = t, J.isa = gs_isa(), J.codes = codes, J.pad = (uint8_t)qx.zero;
            J.wq = w.q, J.w = &w, J.out = output, J.bias = bias, J.sasb = sasb;
            J.is_unsigned = !qx.weights_signed, J.zx = qx.zero, J.sm = sm;
            rc = run(fn, &J);
        }
        if (rc == GRAPHSWAP_OK && any_bad) poison_windows(&P, &G, input, output);
        gs_free(img);
    }
    gs_free(sasb), gs_free(codes);
    gs_wquant_free(&w);
    gs_lut_table_release(t);
    return rc;
}
