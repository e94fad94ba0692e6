/* Pooling on NCHW images: max pooling (torch.nn.MaxPool2d with kernel, stride,
 * no padding, floor mode) and global average pooling (AdaptiveAvgPool2d(1)
 * followed by a flatten: (C, H, W) -> (C)).
 *
 * Letters: B batch, C channels, H W input plane, OH OW output plane,
 * K kernel, S stride. */
#include <math.h>
#include <string.h>

#include "nn/layers_impl.h"

struct maxpool {
    int64_t C, H, W, OH, OW;
    int K, S;
    int32_t *off; /* (OH*OW) window offsets, for K = S = 2 only */
};

/* ---- max pooling ------------------------------------------------------------- */

/* The common 2x2, stride 2 case, vectorised over the whole output plane:
 * off (OH*OW) holds the top-left input offset of each window, so the four
 * loads are gathers and there is no short per-row loop. */
static void maxpool_plane_2x2(float *y, int32_t *idx, const float *x, const struct maxpool *p) {
    const int64_t n = p->OH * p->OW;
    const int32_t W = (int32_t)p->W;
    const int32_t *off = p->off;
#pragma omp simd
    for (int64_t o = 0; o < n; o++) {
        const int32_t ia = off[o];
        const float a = x[ia], b = x[ia + 1], c = x[ia + W], d = x[ia + W + 1];
        float m = a;
        int32_t im = ia;
        int t = (b > m) | (b != b);
        m = t ? b : m;
        im = t ? ia + 1 : im;
        t = (c > m) | (c != c);
        m = t ? c : m;
        im = t ? ia + W : im;
        t = (d > m) | (d != d);
        m = t ? d : m;
        im = t ? ia + W + 1 : im;
        y[o] = m;
        idx[o] = im;
    }
}

/* y (OH, OW) and the argmax idx (OH, OW) of one plane x (H, W). */
static void maxpool_plane(float *y, int32_t *idx, const float *x, const struct maxpool *p) {
    const int64_t S = p->S, W = p->W, OW = p->OW;
    if (p->off) {
        maxpool_plane_2x2(y, idx, x, p);
        return;
    }
    for (int64_t oh = 0; oh < p->OH; oh++) {
        float *yr = y + oh * OW;     /* (OW) */
        int32_t *ir = idx + oh * OW; /* (OW) */
        const int64_t h0 = oh * S;
        for (int64_t ow = 0; ow < OW; ow++) {
            yr[ow] = -INFINITY;
            ir[ow] = (int32_t)(h0 * W + ow * S);
        }
        /* Window positions in PyTorch's scan order (kh, then kw); the inner
         * loop runs over the output row so that it vectorises. */
        for (int64_t kh = 0; kh < p->K; kh++) {
            for (int64_t kw = 0; kw < p->K; kw++) {
                const int64_t base = (h0 + kh) * W + kw;
                const float *xr = x + base;
#pragma omp simd
                for (int64_t ow = 0; ow < OW; ow++) {
                    float v = xr[ow * S];
                    int take = (v > yr[ow]) | (v != v);
                    yr[ow] = take ? v : yr[ow];
                    ir[ow] = take ? (int32_t)(base + ow * S) : ir[ow];
                }
            }
        }
    }
}

/* Forward:  y[b,c,oh,ow] = max_{kh,kw} x[b,c,oh*S+kh,ow*S+kw]; the position of
 *           the maximum (first one in scan order, or a NaN, as PyTorch) is
 *           saved as an index into the (H, W) plane.
 * Backward: dx[b,c,argmax] += dy[b,c,oh,ow], dx zero elsewhere (windows may
 *           overlap when S < K, hence +=). */
static int maxpool_forward(struct dp_layer *l, struct dp_ctx *ctx, float *y, const float *x,
                           int64_t B) {
    const struct maxpool *p = l->priv;
    const int64_t planes = B * p->C, HW = p->H * p->W, OHW = p->OH * p->OW;
    int32_t *idx =
        dp_arena_alloc(ctx->arena, sizeof(int32_t) * (size_t)(planes * OHW)); /* (B, C, OH, OW) */
    if (!idx) return DP_ENOMEM;
#pragma omp parallel for schedule(static) if (planes * HW >= DP__OMP_MIN)
    for (int64_t i = 0; i < planes; i++)
        maxpool_plane(y + i * OHW, idx + i * OHW, x + i * HW, p);
    ctx->saved[l->id] = idx;
    return DP_OK;
}

static int maxpool_backward(struct dp_layer *l, struct dp_ctx *ctx, float *dx, const float *dy,
                            const float *x, const float *y, int64_t B) {
    const struct maxpool *p = l->priv;
    const int64_t planes = B * p->C, HW = p->H * p->W, OHW = p->OH * p->OW;
    if (!dx) return DP_OK;
    int32_t *idx = ctx->saved[l->id];
    float *tmp = NULL;
    if (!idx) { /* forward did not run in this step: recompute the argmax */
        idx = dp_arena_alloc(ctx->arena, sizeof(int32_t) * (size_t)(planes * OHW));
        tmp = dp__arena_floats(ctx, planes * OHW);
        if (!idx || !tmp) return DP_ENOMEM;
    }
#pragma omp parallel for schedule(static) if (planes * HW >= DP__OMP_MIN)
    for (int64_t i = 0; i < planes; i++) {
        if (tmp) maxpool_plane(tmp + i * OHW, idx + i * OHW, x + i * HW, p);
        float *d = dx + i * HW;            /* (H, W) */
        const int32_t *ix = idx + i * OHW; /* (OH, OW) */
        const float *g = dy + i * OHW;     /* (OH, OW) */
        memset(d, 0, sizeof(float) * (size_t)HW);
        for (int64_t j = 0; j < OHW; j++)
            d[ix[j]] += g[j];
    }
    return DP_OK;
}

static void maxpool_free(struct dp_layer *l) {
    struct maxpool *p = l->priv;
    if (p) dp_free(p->off);
    dp_free(p);
}

static const struct dp_layer_ops maxpool_ops = {"maxpool2d", maxpool_forward, maxpool_backward,
                                                maxpool_free};

int dp__maxpool2d_make(struct dp_model *m, struct dp_layer **out, const char *name,
                       const struct dp_shape *in, int kernel, int stride) {
    *out = NULL;
    struct dp__model_mark mk = dp__model_mark(m);
    if (in->ndim != 3)
        return dp_seterr(DP_EINVAL, "maxpool2d %s: input has %d dims, expected (C, H, W)", name,
                         in->ndim);
    if (kernel <= 0 || stride <= 0)
        return dp_seterr(DP_EINVAL, "maxpool2d %s: kernel %d, stride %d", name, kernel, stride);
    if (in->d[1] < kernel || in->d[2] < kernel)
        return dp_seterr(DP_EINVAL, "maxpool2d %s: kernel %d larger than input %lldx%lld", name,
                         kernel, (long long)in->d[1], (long long)in->d[2]);
    if (in->d[1] * in->d[2] > INT32_MAX)
        return dp_seterr(DP_EINVAL, "maxpool2d %s: plane too large", name);
    struct dp_layer *l;
    int rc = dp_layer_make(m, &l, &maxpool_ops, name, in);
    if (rc) return rc;
    struct maxpool *p = dp_calloc(1, sizeof *p);
    if (!p)
        return dp__layer_fail(m, l, &mk, dp_seterr(DP_ENOMEM, "maxpool2d %s: out of memory", name));
    l->priv = p;
    p->C = in->d[0];
    p->H = in->d[1];
    p->W = in->d[2];
    p->K = kernel;
    p->S = stride;
    p->OH = (p->H - kernel) / stride + 1;
    p->OW = (p->W - kernel) / stride + 1;
    if (kernel == 2 && stride == 2) {
        p->off = dp_malloc(sizeof(int32_t) * (size_t)(p->OH * p->OW));
        if (!p->off)
            return dp__layer_fail(m, l, &mk,
                                  dp_seterr(DP_ENOMEM, "maxpool2d %s: out of memory", name));
        for (int64_t oh = 0; oh < p->OH; oh++)
            for (int64_t ow = 0; ow < p->OW; ow++)
                p->off[oh * p->OW + ow] = (int32_t)(2 * oh * p->W + 2 * ow);
    }
    l->out_shape = dp__shape3(p->C, p->OH, p->OW);
    l->flops_fwd = p->C * p->OH * p->OW * (int64_t)kernel * kernel;
    *out = l;
    return DP_OK;
}

int dp_maxpool2d(struct dp_model *m, const char *name, int kernel, int stride) {
    struct dp_shape in = dp_model_cur_shape(m);
    struct dp__model_mark mk = dp__model_mark(m);
    struct dp_layer *l;
    int rc = dp__maxpool2d_make(m, &l, name, &in, kernel, stride);
    return dp__layer_record(m, l, rc, &mk, "maxpool %s kernel=%d stride=%d", name, kernel, stride);
}

/* ---- global average pooling --------------------------------------------------- */

/* Forward:  y[b,c] = (1/HW) sum_{h,w} x[b,c,h,w]        y (B, C), x (B, C, H, W)
 * Backward: dx[b,c,h,w] = dy[b,c] / HW */
static int avgpool_forward(struct dp_layer *l, struct dp_ctx *ctx, float *y, const float *x,
                           int64_t B) {
    const int64_t planes = B * l->in_shape.d[0], HW = l->in_shape.d[1] * l->in_shape.d[2];
#pragma omp parallel for schedule(static) if (planes * HW >= DP__OMP_MIN)
    for (int64_t i = 0; i < planes; i++) {
        const float *xp = x + i * HW;
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < HW; j++)
            s += xp[j];
        y[i] = (float)(s / (double)HW);
    }
    return DP_OK;
}

static int avgpool_backward(struct dp_layer *l, struct dp_ctx *ctx, float *dx, const float *dy,
                            const float *x, const float *y, int64_t B) {
    if (!dx) return DP_OK;
    const int64_t planes = B * l->in_shape.d[0], HW = l->in_shape.d[1] * l->in_shape.d[2];
    const float inv = 1.0f / (float)HW;
#pragma omp parallel for schedule(static) if (planes * HW >= DP__OMP_MIN)
    for (int64_t i = 0; i < planes; i++) {
        float g = dy[i] * inv;
        float *d = dx + i * HW;
#pragma omp simd
        for (int64_t j = 0; j < HW; j++)
            d[j] = g;
    }
    return DP_OK;
}

static const struct dp_layer_ops avgpool_ops = {"global_avgpool", avgpool_forward, avgpool_backward,
                                                NULL};

int dp__global_avgpool_make(struct dp_model *m, struct dp_layer **out, const char *name,
                            const struct dp_shape *in) {
    *out = NULL;
    if (in->ndim != 3)
        return dp_seterr(DP_EINVAL, "global_avgpool %s: input has %d dims, expected (C, H, W)",
                         name, in->ndim);
    struct dp_layer *l;
    int rc = dp_layer_make(m, &l, &avgpool_ops, name, in);
    if (rc) return rc;
    l->out_shape = dp__shape1(in->d[0]);
    l->flops_fwd = dp_shape_numel(in);
    *out = l;
    return DP_OK;
}

int dp_global_avgpool(struct dp_model *m, const char *name) {
    struct dp_shape in = dp_model_cur_shape(m);
    struct dp__model_mark mk = dp__model_mark(m);
    struct dp_layer *l;
    int rc = dp__global_avgpool_make(m, &l, name, &in);
    return dp__layer_record(m, l, rc, &mk, "global_avgpool %s", name);
}
