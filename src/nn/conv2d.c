/* 2-D convolution on NCHW images, as torch.nn.Conv2d with a square kernel,
 * one stride for both axes, zero padding and groups = 1.
 *
 * The fast path lowers the convolution to GEMMs (im2col), a chunk of n
 * samples at a time:
 *   col (CKK, Nc)  with CKK = C*K*K, Nc = n*OH*OW;
 *                  row r = (c*K + kh)*K + kw, column j = (b*OH + oh)*OW + ow,
 *                  col[r][j] = x[b][c][oh*S - P + kh][ow*S - P + kw] (0 outside)
 *   Y' (OC, Nc) = W (OC, CKK) · col        one GEMM per chunk
 *   y (n, OC, OH, OW) = reorder(Y') + b    (no reorder when n == 1)
 * n is chosen so that a chunk has about 512 columns (see chunk_cols); with
 * dp__conv2d_set_chunk_cols(0) the whole batch is one chunk.  Backward
 * recomputes each chunk's col (it is cheap and stays in cache), uses it for
 * dW, then overwrites it with dcol.  A plain direct-loop reference
 * (dp__conv2d_*_ref) is what the tests compare the fast path to.
 *
 * Parameters: weight (OC, C, K, K), bias (OC), both U(-1/sqrt(CKK), 1/sqrt(CKK)).
 *
 * Letters: B batch, n samples per chunk, C OC channels, H W OH OW planes,
 * K kernel, S stride, P padding, CKK = C*K*K, Nc = n*OH*OW, OHW = OH*OW. */
#include <math.h>
#include <string.h>

#include "nn/layers_impl.h"

struct conv {
    struct dp__conv_dims d;
    int bias;
    int relu; /* 1: ReLU fused into the epilogue (conv_fuse_relu) */
    /* (K, OH*OW) for "same" convolutions (stride 1, OH == H, OW == W), else
     * NULL: colmask[kw][o] = 1 when output pixel o's input column for kernel
     * column kw lies inside the image. */
    uint8_t *colmask;
    struct dp__conv_dnnl *dn; /* oneDNN's kernels (conv_dnnl.c), where dp__conv_dnnl_fits */
};

struct dp__conv_dims dp__conv2d_dims(const struct dp_layer *l) {
    return ((const struct conv *)l->priv)->d;
}

/* The output columns ow in [*lo, *hi) whose input column ow*S - P + kw lies
 * inside [0, W); the others read zero padding. */
static void ow_range(int64_t kw, const struct dp__conv_dims *d, int64_t *lo, int64_t *hi) {
    int64_t a = d->P - kw;            /* need ow*S >= a */
    int64_t z = d->W - 1 + d->P - kw; /* need ow*S <= z */
    int64_t l = a > 0 ? (a + d->S - 1) / d->S : 0;
    int64_t h = z >= 0 ? z / d->S + 1 : 0;
    if (h > d->OW) h = d->OW;
    if (l > h) l = h;
    *lo = l;
    *hi = h;
}

/* ---- im2col / col2im ----------------------------------------------------------- */

/* "Same" convolutions (stride 1, OH == H, OW == W): output pixel o and input
 * pixel o + shift line up over the whole plane, shift = (kh - P) W + (kw - P),
 * so each (kernel offset, plane) pair is one long vectorisable loop over
 * o in [a, b) with the column mask; outside [a, b) the col entry is padding.
 * [a, b) covers the output rows whose input row is inside the image, less
 * the few masked pixels at its ends whose o + shift would leave the plane. */
static void same_range(const struct dp__conv_dims *d, int64_t kh, int64_t kw, int64_t *a,
                       int64_t *b, int64_t *shift) {
    const int64_t P = d->P, OW = d->OW, HW = d->H * d->W;
    int64_t oh_lo = P - kh > 0 ? P - kh : 0;
    int64_t oh_hi = d->H + P - kh < d->OH ? d->H + P - kh : d->OH;
    if (oh_hi < oh_lo) oh_hi = oh_lo;
    int64_t sh = (kh - P) * d->W + (kw - P);
    int64_t lo = oh_lo * OW > -sh ? oh_lo * OW : -sh;
    int64_t hi = oh_hi * OW < HW - sh ? oh_hi * OW : HW - sh;
    if (hi < lo) hi = lo;
    *a = lo;
    *b = hi;
    *shift = sh;
}

static void im2col_same(float *col, const float *x, int64_t B, const struct conv *p) {
    const struct dp__conv_dims *d = &p->d;
    const int64_t K = d->K, CKK = d->C * K * K, OHW = d->OH * d->OW, N = B * OHW, HW = d->H * d->W;
#pragma omp parallel for collapse(2) schedule(static) if (CKK * N >= DP__OMP_MIN)
    for (int64_t r = 0; r < CKK; r++) {
        for (int64_t b = 0; b < B; b++) {
            int64_t c = r / (K * K), kh = (r / K) % K, kw = r % K;
            const float *xp = x + (b * d->C + c) * HW; /* (H, W) */
            float *dst = col + r * N + b * OHW;        /* (OH, OW) */
            const uint8_t *m = p->colmask + kw * OHW;  /* (OH, OW) */
            int64_t lo, hi, sh;
            same_range(d, kh, kw, &lo, &hi, &sh);
            memset(dst, 0, sizeof(float) * (size_t)lo);
#pragma omp simd
            for (int64_t o = lo; o < hi; o++) {
                float v = xp[o + sh];
                dst[o] = m[o] ? v : 0.0f;
            }
            memset(dst + hi, 0, sizeof(float) * (size_t)(OHW - hi));
        }
    }
}

/* col2im for "same" convolutions; masked pixels add 0 to an element of the
 * same plane, which leaves it unchanged. */
static void col2im_same(float *dx, const float *dcol, int64_t B, const struct conv *p) {
    const struct dp__conv_dims *d = &p->d;
    const int64_t K = d->K, C = d->C, OHW = d->OH * d->OW, N = B * OHW, HW = d->H * d->W;
#pragma omp parallel for collapse(2) schedule(static) if (C * K * K * N >= DP__OMP_MIN)
    for (int64_t c = 0; c < C; c++) {
        for (int64_t b = 0; b < B; b++) {
            float *dxp = dx + (b * C + c) * HW; /* (H, W) */
            memset(dxp, 0, sizeof(float) * (size_t)HW);
            for (int64_t kh = 0; kh < K; kh++) {
                for (int64_t kw = 0; kw < K; kw++) {
                    const float *src = dcol + ((c * K + kh) * K + kw) * N + b * OHW;
                    const uint8_t *m = p->colmask + kw * OHW;
                    int64_t lo, hi, sh;
                    same_range(d, kh, kw, &lo, &hi, &sh);
#pragma omp simd
                    for (int64_t o = lo; o < hi; o++)
                        dxp[o + sh] += m[o] ? src[o] : 0.0f;
                }
            }
        }
    }
}

/* col (CKK, N) from x (B, C, H, W).  Each (row, sample) pair writes its own
 * OHW-long segment of col. */
static void im2col(float *col, const float *x, int64_t B, const struct conv *p) {
    if (p->colmask) {
        im2col_same(col, x, B, p);
        return;
    }
    const struct dp__conv_dims *d = &p->d;
    const int64_t K = d->K, S = d->S, P = d->P, W = d->W, OW = d->OW;
    const int64_t CKK = d->C * K * K, OHW = d->OH * OW, N = B * OHW, HW = d->H * W;
#pragma omp parallel for collapse(2) schedule(static) if (CKK * N >= DP__OMP_MIN)
    for (int64_t r = 0; r < CKK; r++) {
        for (int64_t b = 0; b < B; b++) {
            int64_t c = r / (K * K), kh = (r / K) % K, kw = r % K;
            const float *xp = x + (b * d->C + c) * HW; /* (H, W) */
            float *dst = col + r * N + b * OHW;        /* (OH, OW) */
            int64_t lo, hi;
            ow_range(kw, d, &lo, &hi);
            for (int64_t oh = 0; oh < d->OH; oh++, dst += OW) {
                int64_t ih = oh * S - P + kh;
                if (ih < 0 || ih >= d->H) {
                    memset(dst, 0, sizeof(float) * (size_t)OW);
                    continue;
                }
                const float *xrow = xp + ih * W;
                for (int64_t ow = 0; ow < lo; ow++)
                    dst[ow] = 0.0f;
                if (S == 1 && hi > lo)
                    memcpy(dst + lo, xrow + lo - P + kw, sizeof(float) * (size_t)(hi - lo));
                else if (S == 2) { /* a constant stride: shuffles, where a variable one gathers */
                    const float *xs = xrow - P + kw;
#pragma omp simd
                    for (int64_t ow = lo; ow < hi; ow++)
                        dst[ow] = xs[2 * ow];
                } else if (S != 1) {
#pragma omp simd
                    for (int64_t ow = lo; ow < hi; ow++)
                        dst[ow] = xrow[ow * S - P + kw];
                }
                for (int64_t ow = hi; ow < OW; ow++)
                    dst[ow] = 0.0f;
            }
        }
    }
}

/* dx (B, C, H, W) = sum of dcol (CKK, N) scattered back to the input pixels
 * (overwrite).  Each (sample, channel) plane is owned by one thread and
 * summed in a fixed order.  Channels outside, samples inside: the K*K rows of
 * dcol that feed one channel are then read as sequential streams. */
static void col2im(float *dx, const float *dcol, int64_t B, const struct conv *p) {
    if (p->colmask) {
        col2im_same(dx, dcol, B, p);
        return;
    }
    const struct dp__conv_dims *d = &p->d;
    const int64_t K = d->K, S = d->S, P = d->P, W = d->W, OW = d->OW, C = d->C;
    const int64_t OHW = d->OH * OW, N = B * OHW, HW = d->H * W;
#pragma omp parallel for collapse(2) schedule(static) if (C * K * K * N >= DP__OMP_MIN)
    for (int64_t c = 0; c < C; c++) {
        for (int64_t b = 0; b < B; b++) {
            float *dxp = dx + (b * C + c) * HW; /* (H, W) */
            memset(dxp, 0, sizeof(float) * (size_t)HW);
            for (int64_t kh = 0; kh < K; kh++) {
                for (int64_t kw = 0; kw < K; kw++) {
                    const float *src = dcol + ((c * K + kh) * K + kw) * N + b * OHW;
                    int64_t lo, hi;
                    ow_range(kw, d, &lo, &hi);
                    for (int64_t oh = 0; oh < d->OH; oh++) {
                        int64_t ih = oh * S - P + kh;
                        if (ih < 0 || ih >= d->H) continue;
                        float *xrow = dxp + ih * W;
                        const float *srow = src + oh * OW;
#pragma omp simd
                        for (int64_t ow = lo; ow < hi; ow++)
                            xrow[ow * S - P + kw] += srow[ow];
                    }
                }
            }
        }
    }
}

/* ---- forward / backward ------------------------------------------------------ */

/* Columns per GEMM: the batch is processed in chunks of nb samples with
 * nb * OH * OW ~ chunk_cols, so that a chunk's col (CKK, nb*OH*OW) stays in
 * the L2 cache (0: the whole batch in one GEMM).  Measured here with oneDNN,
 * 1 thread, B = 128 (fwd + bwd): 32->32 3x3 at 28x28 66 -> 42 ms, 64->64 at
 * 14x14 47 -> 39 ms, 128->128 at 7x7 44 -> 40 ms against the whole batch;
 * single-sample GEMMs are slower for 7x7 planes (too few columns), hence the
 * target of ~512 columns rather than one sample.  The step arena also no
 * longer holds a whole-batch col per layer (115 MB for 32->32 at 28x28). */
static int64_t chunk_cols = 512;

void dp__conv2d_set_chunk_cols(int64_t cols) { chunk_cols = cols > 0 ? cols : 0; }

static int64_t chunk_samples(const struct dp__conv_dims *d, int64_t B) {
    const int64_t OHW = d->OH * d->OW;
    int64_t nb = chunk_cols > 0 ? (chunk_cols + OHW - 1) / OHW : B;
    if (nb > B) nb = B;
    return nb < 1 ? 1 : nb;
}

/* Chunks are spread over the threads (one OpenMP region per pass, GEMMs
 * single-threaded inside it) when there are enough of them; otherwise they
 * run in order and each GEMM and loop uses the threads itself.  Many small
 * parallel regions per pass would make every chunk pay a fork/join, which
 * collapses when a core is shared with another process. */
static int use_outer(int64_t nchunks, int T) { return T > 1 && nchunks >= 4 * (int64_t)T; }

/* Groups of chunks for dW: group g sums its chunks into its own partial, and
 * the partials are added in order, so dW does not depend on the threads. */
#define CONV_GROUPS 8

/* Forward:  y[b,oc,oh,ow] = b[oc] + sum_{c,kh,kw} W[oc,c,kh,kw] x[b,c,oh*S-P+kh,ow*S-P+kw]
 *           per chunk of n samples: Y' = W · col       Y' (OC, n*OHW), W (OC, CKK)
 * Backward: dW += sum over chunks of dY' · col^T      (OC, CKK), dY' = dy as (OC, n*OHW)
 *           db += sum_{b,oh,ow} dy[b,oc,oh,ow]        (OC; per chunk, from dY' in cache)
 *           dx = col2im(W^T · dY')                    (overwrite; skipped when dx is NULL)
 * Backward does not read y (the residual block reuses that buffer), unless a ReLU is fused:
 * then y is the ReLU's output, and dy is masked by [y > 0] as it is read. */
static void fwd_chunk(const struct conv *p, const float *w, const float *bias, float *y,
                      const float *x, int64_t b0, int64_t n, float *col, float *yt) {
    const struct dp__conv_dims *d = &p->d;
    const int64_t OC = d->OC, CKK = d->C * d->K * d->K, OHW = d->OH * d->OW, Nc = n * OHW;
    float *yb = y + b0 * OC * OHW; /* (n, OC, OHW) */
    float *ytc = n == 1 ? yb : yt; /* (OC, Nc); one sample: Y' is y's layout */
    im2col(col, x + b0 * d->C * d->H * d->W, n, p);
    dp_gemm(0, 0, OC, Nc, CKK, 1.0f, w, CKK, col, Nc, 0.0f, ytc, Nc);
    /* The epilogue, on Y' while it is in cache: reorder, bias, the fused ReLU (dp__relu1,
     * the ReLU layer's expression, so the same bits as the ReLU layer: a NaN stays, -0 stays). */
    const int relu = p->relu;
#pragma omp parallel for collapse(2) schedule(static) if (OC * Nc >= DP__OMP_MIN)
    for (int64_t bb = 0; bb < n; bb++) {
        for (int64_t oc = 0; oc < OC; oc++) {
            float *dst = yb + (bb * OC + oc) * OHW; /* (OHW) */
            const float *src = ytc + oc * Nc + bb * OHW;
            const float bv = p->bias ? bias[oc] : 0.0f;
            if (dst != src || p->bias) { /* (+ 0.0f as before: -0 becomes +0 without bias) */
#pragma omp simd
                for (int64_t i = 0; i < OHW; i++) {
                    const float v = src[i] + bv;
                    dst[i] = relu ? dp__relu1(v) : v;
                }
            } else if (relu) {
#pragma omp simd
                for (int64_t i = 0; i < OHW; i++)
                    dst[i] = dp__relu1(dst[i]);
            }
        }
    }
}

/* dwp (OC, CKK) = beta * dwp + dY' col^T for one chunk; dbp (OC) += the sums of dY''s rows
 * when dbp (in double, while dY' is in cache); dx part if dx.  With the fused ReLU, dY' is
 * dy [y > 0] (dp__relu_mask's expression), masked as it is reordered into dyt. */
static void bwd_chunk(const struct conv *p, const float *w, float *dwp, float beta, double *dbp,
                      float *dx, const float *dy, const float *y, const float *x, int64_t b0,
                      int64_t n, float *col, float *dyt) {
    const struct dp__conv_dims *d = &p->d;
    const int64_t OC = d->OC, CKK = d->C * d->K * d->K, OHW = d->OH * d->OW, Nc = n * OHW;
    const int64_t CHW = d->C * d->H * d->W;
    const float *dyb = dy + b0 * OC * OHW; /* (n, OC, OHW) */
    const float *g = dyb;                  /* dY' (OC, Nc) */
    if (p->relu) {
        const float *yb = y + b0 * OC * OHW; /* (n, OC, OHW) */
#pragma omp parallel for collapse(2) schedule(static) if (OC * Nc >= DP__OMP_MIN)
        for (int64_t oc = 0; oc < OC; oc++)
            for (int64_t bb = 0; bb < n; bb++) {
                float *dst = dyt + oc * Nc + bb * OHW;
                const float *src = dyb + (bb * OC + oc) * OHW, *ys = yb + (bb * OC + oc) * OHW;
#pragma omp simd
                for (int64_t i = 0; i < OHW; i++) {
                    const float v = src[i];
                    dst[i] = ys[i] > 0.0f ? v : 0.0f;
                }
            }
        g = dyt;
    } else if (n > 1) {
#pragma omp parallel for collapse(2) schedule(static) if (OC * Nc >= DP__OMP_MIN)
        for (int64_t oc = 0; oc < OC; oc++)
            for (int64_t bb = 0; bb < n; bb++)
                memcpy(dyt + oc * Nc + bb * OHW, dyb + (bb * OC + oc) * OHW,
                       sizeof(float) * (size_t)OHW);
        g = dyt;
    }
    if (dbp) {
#pragma omp parallel for schedule(static) if (OC * Nc >= DP__OMP_MIN)
        for (int64_t oc = 0; oc < OC; oc++) {
            const float *row = g + oc * Nc;
            double acc = 0.0;
#pragma omp simd reduction(+ : acc)
            for (int64_t i = 0; i < Nc; i++)
                acc += row[i];
            dbp[oc] += acc;
        }
    }
    im2col(col, x + b0 * CHW, n, p);
    dp_gemm(0, 1, OC, CKK, Nc, 1.0f, g, Nc, col, Nc, beta, dwp, CKK);
    if (dx) {
        /* col is no longer needed: it becomes dcol (CKK, Nc). */
        dp_gemm(1, 0, CKK, Nc, OC, 1.0f, w, CKK, g, Nc, 0.0f, col, Nc);
        col2im(dx + b0 * CHW, col, n, p);
    }
}

static int conv_forward(struct dp_layer *l, struct dp_ctx *ctx, float *y, const float *x,
                        int64_t B) {
    const struct conv *p = l->priv;
    const struct dp__conv_dims *d = &p->d;
    const int64_t OC = d->OC, CKK = d->C * d->K * d->K, OHW = d->OH * d->OW;
    const int64_t nb = chunk_samples(d, B), nchunks = (B + nb - 1) / nb;
    const int T = dp_get_num_threads(), outer = use_outer(nchunks, T), nbuf = outer ? T : 1;
    const float *w = ctx->params + l->param_off;               /* (OC, CKK) */
    const float *bias = w + OC * CKK;                          /* (OC) */
    if (p->dn && dp__conv_dnnl_usable(d))
        return dp__conv_dnnl_forward(p->dn, ctx, d, p->relu, w, p->bias ? bias : NULL, y, x, B);
    float *col = dp__arena_floats(ctx, nbuf * CKK * nb * OHW); /* (nbuf, CKK, nb*OHW) */
    float *yt =
        nb > 1 ? dp__arena_floats(ctx, nbuf * OC * nb * OHW) : NULL; /* (nbuf, OC, nb*OHW) */
    if (!col || (nb > 1 && !yt)) return DP_ENOMEM;
#pragma omp parallel num_threads(T) if (outer)
    {
        const int t = dp__thread_id();
        float *ct = col + t * CKK * nb * OHW, *yt_t = yt ? yt + t * OC * nb * OHW : NULL;
#pragma omp for schedule(static)
        for (int64_t k = 0; k < nchunks; k++) {
            const int64_t b0 = k * nb, n = b0 + nb <= B ? nb : B - b0;
            fwd_chunk(p, w, bias, y, x, b0, n, ct, yt_t);
        }
    }
    return DP_OK;
}

static int conv_backward(struct dp_layer *l, struct dp_ctx *ctx, float *dx, const float *dy,
                         const float *x, const float *y, int64_t B) {
    const struct conv *p = l->priv;
    const struct dp__conv_dims *d = &p->d;
    const int64_t OC = d->OC, CKK = d->C * d->K * d->K, OHW = d->OH * d->OW, NW = OC * CKK;
    const int64_t nb = chunk_samples(d, B), nchunks = (B + nb - 1) / nb;
    const int64_t G = nchunks < CONV_GROUPS ? nchunks : CONV_GROUPS;
    const int T = dp_get_num_threads(), outer = use_outer(nchunks, T), nbuf = outer ? T : 1;
    const float *w = ctx->params + l->param_off; /* (OC, CKK) */
    float *dw = ctx->grads + l->param_off;       /* (OC, CKK) */
    float *db = dw + NW;                         /* (OC) */
    if (B == 0) return DP_OK; /* an empty share: no gradient to add */
    if (p->dn && dp__conv_dnnl_usable(d))
        return dp__conv_dnnl_backward(p->dn, ctx, d, p->relu, w, dw, p->bias ? db : NULL, dx, dy, x, y, B);

    const int need_dyt = nb > 1 || p->relu;
    float *col = dp__arena_floats(ctx, nbuf * CKK * nb * OHW); /* (nbuf, CKK, nb*OHW) */
    float *dyt =
        need_dyt ? dp__arena_floats(ctx, nbuf * OC * nb * OHW) : NULL; /* (nbuf, OC, nb*OHW) */
    float *part = dp__arena_floats(ctx, G * NW);                     /* (G, OC, CKK) */
    double *dbp = p->bias ? dp_arena_alloc(ctx->arena, sizeof(double) * (size_t)(G * OC)) : NULL; /* (G, OC) */
    if (!col || (need_dyt && !dyt) || !part || (p->bias && !dbp)) return DP_ENOMEM;
    if (dbp) memset(dbp, 0, sizeof(double) * (size_t)(G * OC));
#pragma omp parallel num_threads(T) if (outer)
    {
        const int t = dp__thread_id();
        float *ct = col + t * CKK * nb * OHW, *dt = dyt ? dyt + t * OC * nb * OHW : NULL;
#pragma omp for schedule(static)
        for (int64_t g = 0; g < G; g++) {
            const int64_t k0 = g * nchunks / G, k1 = (g + 1) * nchunks / G;
            for (int64_t k = k0; k < k1; k++) {
                const int64_t b0 = k * nb, n = b0 + nb <= B ? nb : B - b0;
                bwd_chunk(p, w, part + g * NW, k == k0 ? 0.0f : 1.0f, dbp ? dbp + g * OC : NULL, dx, dy, y,
                          x, b0, n, ct, dt);
            }
        }
#pragma omp for schedule(static)
        for (int64_t i = 0; i < NW; i++) {
            float acc = part[i];
            for (int64_t g = 1; g < G; g++)
                acc += part[g * NW + i];
            dw[i] += acc;
        }
        if (dbp) {
#pragma omp for schedule(static)
            for (int64_t oc = 0; oc < OC; oc++) {
                double acc = dbp[oc];
                for (int64_t g = 1; g < G; g++)
                    acc += dbp[g * OC + oc];
                db[oc] += (float)acc;
            }
        }
    }
    return DP_OK;
}

static void conv_free(struct dp_layer *l) {
    struct conv *p = l->priv;
    if (p) dp_free(p->colmask), dp__conv_dnnl_free(p->dn);
    dp_free(p);
}

static int conv_fuse_relu(struct dp_layer *l) {
    ((struct conv *)l->priv)->relu = 1;
    return 1;
}

static const struct dp_layer_ops conv_ops = {"conv2d", conv_forward, conv_backward, conv_free};

/* ---- reference ------------------------------------------------------------------ */

void dp__conv2d_forward_ref(float *y, const float *x, const float *w, const float *b, int64_t B,
                            const struct dp__conv_dims *d) {
    const int64_t K = d->K;
    for (int64_t n = 0; n < B; n++)
        for (int64_t oc = 0; oc < d->OC; oc++)
            for (int64_t oh = 0; oh < d->OH; oh++)
                for (int64_t ow = 0; ow < d->OW; ow++) {
                    double s = b ? b[oc] : 0.0;
                    for (int64_t c = 0; c < d->C; c++)
                        for (int64_t kh = 0; kh < K; kh++)
                            for (int64_t kw = 0; kw < K; kw++) {
                                int64_t ih = oh * d->S - d->P + kh, iw = ow * d->S - d->P + kw;
                                if (ih < 0 || ih >= d->H || iw < 0 || iw >= d->W) continue;
                                s += (double)w[((oc * d->C + c) * K + kh) * K + kw] *
                                     x[((n * d->C + c) * d->H + ih) * d->W + iw];
                            }
                    y[((n * d->OC + oc) * d->OH + oh) * d->OW + ow] = (float)s;
                }
}

void dp__conv2d_backward_ref(float *dx, float *dw, float *db, const float *dy, const float *x,
                             const float *w, int64_t B, const struct dp__conv_dims *d) {
    const int64_t K = d->K;
#define DY(n, oc, oh, ow) dy[(((n)*d->OC + (oc)) * d->OH + (oh)) * d->OW + (ow)]
    if (db)
        for (int64_t oc = 0; oc < d->OC; oc++) {
            double s = 0;
            for (int64_t n = 0; n < B; n++)
                for (int64_t oh = 0; oh < d->OH; oh++)
                    for (int64_t ow = 0; ow < d->OW; ow++)
                        s += DY(n, oc, oh, ow);
            db[oc] += (float)s;
        }
    for (int64_t oc = 0; oc < d->OC; oc++)
        for (int64_t c = 0; c < d->C; c++)
            for (int64_t kh = 0; kh < K; kh++)
                for (int64_t kw = 0; kw < K; kw++) {
                    double s = 0;
                    for (int64_t n = 0; n < B; n++)
                        for (int64_t oh = 0; oh < d->OH; oh++)
                            for (int64_t ow = 0; ow < d->OW; ow++) {
                                int64_t ih = oh * d->S - d->P + kh, iw = ow * d->S - d->P + kw;
                                if (ih < 0 || ih >= d->H || iw < 0 || iw >= d->W) continue;
                                s += (double)DY(n, oc, oh, ow) *
                                     x[((n * d->C + c) * d->H + ih) * d->W + iw];
                            }
                    dw[((oc * d->C + c) * K + kh) * K + kw] += (float)s;
                }
    if (!dx) return;
    /* Gather form: input pixel (ih, iw) receives from every output position
     * whose window covers it. */
    for (int64_t n = 0; n < B; n++)
        for (int64_t c = 0; c < d->C; c++)
            for (int64_t ih = 0; ih < d->H; ih++)
                for (int64_t iw = 0; iw < d->W; iw++) {
                    double s = 0;
                    for (int64_t kh = 0; kh < K; kh++) {
                        int64_t th = ih + d->P - kh;
                        if (th < 0 || th % d->S || th / d->S >= d->OH) continue;
                        for (int64_t kw = 0; kw < K; kw++) {
                            int64_t tw = iw + d->P - kw;
                            if (tw < 0 || tw % d->S || tw / d->S >= d->OW) continue;
                            for (int64_t oc = 0; oc < d->OC; oc++)
                                s += (double)DY(n, oc, th / d->S, tw / d->S) *
                                     w[((oc * d->C + c) * K + kh) * K + kw];
                        }
                    }
                    dx[((n * d->C + c) * d->H + ih) * d->W + iw] = (float)s;
                }
#undef DY
}

/* ---- constructors -------------------------------------------------------------- */

int dp__conv2d_make(struct dp_model *m, struct dp_layer **out, const char *name,
                    const struct dp_shape *in, int64_t out_channels, int kernel, int stride,
                    int pad, int bias) {
    *out = NULL;
    struct dp__model_mark mk = dp__model_mark(m);
    if (in->ndim != 3)
        return dp_seterr(DP_EINVAL, "conv2d %s: input has %d dims, expected (C, H, W)", name,
                         in->ndim);
    if (out_channels <= 0 || kernel <= 0 || stride <= 0 || pad < 0)
        return dp_seterr(DP_EINVAL, "conv2d %s: out_channels %lld, kernel %d, stride %d, pad %d",
                         name, (long long)out_channels, kernel, stride, pad);
    int64_t H = in->d[1], W = in->d[2];
    if (H + 2 * pad < kernel || W + 2 * pad < kernel)
        return dp_seterr(DP_EINVAL, "conv2d %s: kernel %d larger than padded input %lldx%lld", name,
                         kernel, (long long)(H + 2 * pad), (long long)(W + 2 * pad));
    struct dp_layer *l;
    int rc = dp_layer_make(m, &l, &conv_ops, name, in);
    if (rc) return rc;
    struct conv *p = dp_calloc(1, sizeof *p);
    if (!p)
        return dp__layer_fail(m, l, &mk, dp_seterr(DP_ENOMEM, "conv2d %s: out of memory", name));
    l->priv = p;
    struct dp__conv_dims *d = &p->d;
    d->C = in->d[0];
    d->H = H;
    d->W = W;
    d->OC = out_channels;
    d->K = kernel;
    d->S = stride;
    d->P = pad;
    d->OH = (H + 2 * pad - kernel) / stride + 1;
    d->OW = (W + 2 * pad - kernel) / stride + 1;
    p->bias = bias != 0;
    if (dp__conv_dnnl_fits(d) && !(p->dn = dp__conv_dnnl_new()))
        return dp__layer_fail(m, l, &mk, dp_seterr(DP_ENOMEM, "conv2d %s: out of memory", name));
    l->out_shape = dp__shape3(d->OC, d->OH, d->OW);
    if (stride == 1 && d->OH == H && d->OW == W) {
        p->colmask = dp_malloc((size_t)(kernel * H * W));
        if (!p->colmask)
            return dp__layer_fail(m, l, &mk,
                                  dp_seterr(DP_ENOMEM, "conv2d %s: out of memory", name));
        for (int64_t kw = 0; kw < kernel; kw++)
            for (int64_t o = 0; o < H * W; o++) {
                int64_t iw = o % W + kw - pad;
                p->colmask[kw * H * W + o] = iw >= 0 && iw < W;
            }
    }

    int64_t CKK = d->C * kernel * kernel;
    float a = 1.0f / sqrtf((float)CKK);
    if ((rc = dp__add_param(m, l, "weight", dp__shape4(d->OC, d->C, kernel, kernel),
                            DP_INIT_UNIFORM, a, 0)) ||
        (p->bias && (rc = dp__add_param(m, l, "bias", dp__shape1(d->OC), DP_INIT_UNIFORM, a, 0))))
        return dp__layer_fail(m, l, &mk, rc);
    int64_t OHW = d->OH * d->OW;
    l->flops_fwd = 2 * d->OC * CKK * OHW + (p->bias ? d->OC * OHW : 0);
    l->fuse_relu = conv_fuse_relu;
    *out = l;
    return DP_OK;
}

int dp_conv2d(struct dp_model *m, const char *name, int64_t out_channels, int kernel, int stride,
              int pad, int bias) {
    struct dp_shape in = dp_model_cur_shape(m);
    struct dp__model_mark mk = dp__model_mark(m);
    struct dp_layer *l;
    int rc = dp__conv2d_make(m, &l, name, &in, out_channels, kernel, stride, pad, bias);
    return dp__layer_record(m, l, rc, &mk, "conv2d %s out=%lld kernel=%d stride=%d pad=%d bias=%d", name,
                            (long long)out_channels, kernel, stride, pad, bias != 0);
}
