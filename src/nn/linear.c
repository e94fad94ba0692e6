/* Linear (fully connected) layer over the last dimension, as torch.nn.Linear.
 *
 * Inputs are (IN) per sample, or (T, IN) for sequences (each of the T rows is
 * transformed independently); the batch then holds R = B * T rows.  A 3-D or
 * 4-D input such as (C, H, W) is rejected with DP_EINVAL ("flatten first"):
 * PyTorch would apply the layer to W alone, which is almost never what a
 * model means after a convolution.
 *
 * Parameters (PyTorch names and layout): weight (OUT, IN), bias (OUT), both
 * initialised U(-1/sqrt(IN), 1/sqrt(IN)).
 *
 * Letters: R rows, IN input features, OUT output features. */
#include <math.h>
#include <string.h>

#include "nn/layers_impl.h"

struct linear {
    int64_t in, out; /* features */
    int bias;
    int relu; /* 1: ReLU fused (linear_fuse_relu) */
};

/* db (OUT) += sum over rows of dy (R, OUT).  Each thread owns a block of
 * columns and sums its rows in order, so the result does not depend on the
 * number of threads. */
static void colsum_add(float *db, const float *dy, int64_t R, int64_t N) {
    int64_t nblk = (N + 63) / 64;
#pragma omp parallel for schedule(static) if (R * N >= DP__OMP_MIN && nblk > 1)
    for (int64_t blk = 0; blk < nblk; blk++) {
        int64_t j0 = blk * 64, j1 = j0 + 64 < N ? j0 + 64 : N;
        float acc[64] = {0};
        for (int64_t r = 0; r < R; r++) {
            const float *row = dy + r * N;
#pragma omp simd
            for (int64_t j = j0; j < j1; j++)
                acc[j - j0] += row[j];
        }
        for (int64_t j = j0; j < j1; j++)
            db[j] += acc[j - j0];
    }
}

/* ---- forward / backward ------------------------------------------------------ */

/* Forward:  y = x W^T + b                    y (R, OUT), x (R, IN), W (OUT, IN)
 * Backward: dx = dy W                        (overwrite; skipped when dx is NULL)
 *           dW += dy^T x                     (OUT, IN)
 *           db += sum_r dy[r]                (OUT)
 * Each pass is one GEMM over all R rows of the batch. */
static int linear_forward(struct dp_layer *l, struct dp_ctx *ctx, float *y, const float *x,
                          int64_t B) {
    const struct linear *p = l->priv;
    int64_t R = B * (dp_shape_numel(&l->in_shape) / p->in);
    const float *w = ctx->params + l->param_off; /* (OUT, IN) */
    const float *b = w + p->out * p->in;         /* (OUT) */
    float beta = 0.0f;
    if (p->bias) {
        /* Start from the bias rows; the GEMM adds x W^T onto them. */
#pragma omp parallel for schedule(static) if (R * p->out >= DP__OMP_MIN)
        for (int64_t r = 0; r < R; r++)
            memcpy(y + r * p->out, b, sizeof(float) * (size_t)p->out);
        beta = 1.0f;
    }
    dp_gemm(0, 1, R, p->out, p->in, 1.0f, x, p->in, w, p->in, beta, y, p->out);
    if (p->relu) dp__relu(y, y, R * p->out); /* the fused ReLU, right after the GEMM wrote y */
    return DP_OK;
}

static int linear_backward(struct dp_layer *l, struct dp_ctx *ctx, float *dx, const float *dy,
                           const float *x, const float *y, int64_t B) {
    const struct linear *p = l->priv;
    int64_t R = B * (dp_shape_numel(&l->in_shape) / p->in);
    const float *w = ctx->params + l->param_off; /* (OUT, IN) */
    float *dw = ctx->grads + l->param_off;       /* (OUT, IN) */
    float *db = dw + p->out * p->in;             /* (OUT) */
    if (p->relu) { /* the fused ReLU: dy [y > 0], once for all three products */
        float *g = dp__arena_floats(ctx, R * p->out); /* (R, OUT) */
        if (!g) return DP_ENOMEM;
        dp__relu_mask(g, dy, y, R * p->out);
        dy = g;
    }
    dp_gemm(1, 0, p->out, p->in, R, 1.0f, dy, p->out, x, p->in, 1.0f, dw, p->in);
    if (p->bias) colsum_add(db, dy, R, p->out);
    if (dx) dp_gemm(0, 0, R, p->in, p->out, 1.0f, dy, p->out, w, p->in, 0.0f, dx, p->in);
    return DP_OK;
}

static void linear_free(struct dp_layer *l) { dp_free(l->priv); }

static int linear_fuse_relu(struct dp_layer *l) {
    ((struct linear *)l->priv)->relu = 1;
    return 1;
}

static const struct dp_layer_ops linear_ops = {"linear", linear_forward, linear_backward,
                                               linear_free};

/* ---- constructors -------------------------------------------------------------- */

int dp__linear_make(struct dp_model *m, struct dp_layer **out, const char *name,
                    const struct dp_shape *in, int64_t out_features, int bias) {
    *out = NULL;
    struct dp__model_mark mk = dp__model_mark(m);
    if (in->ndim < 1 || in->ndim > 2)
        return dp_seterr(DP_EINVAL,
                         "linear %s: input has %d dims; it takes (IN) or (T, IN) (flatten first)",
                         name, in->ndim);
    if (out_features <= 0)
        return dp_seterr(DP_EINVAL, "linear %s: out_features %lld", name, (long long)out_features);
    struct dp_layer *l;
    int rc = dp_layer_make(m, &l, &linear_ops, name, in);
    if (rc) return rc;
    struct linear *p = dp_calloc(1, sizeof *p);
    if (!p)
        return dp__layer_fail(m, l, &mk, dp_seterr(DP_ENOMEM, "linear %s: out of memory", name));
    l->priv = p;
    p->in = in->d[in->ndim - 1];
    p->out = out_features;
    p->bias = bias != 0;
    l->out_shape.d[in->ndim - 1] = out_features;

    float a = 1.0f / sqrtf((float)p->in);
    if ((rc = dp__add_param(m, l, "weight", dp__shape2(p->out, p->in), DP_INIT_UNIFORM, a, 0)) ||
        (p->bias && (rc = dp__add_param(m, l, "bias", dp__shape1(p->out), DP_INIT_UNIFORM, a, 0))))
        return dp__layer_fail(m, l, &mk, rc);

    int64_t rows = dp_shape_numel(in) / p->in;
    l->flops_fwd = 2 * rows * p->in * p->out + (p->bias ? rows * p->out : 0);
    l->fuse_relu = linear_fuse_relu;
    *out = l;
    return DP_OK;
}

void dp__linear_init_gpt(struct dp_model *m, const struct dp_layer *l) {
    for (int i = 0; i < m->nparams; i++) {
        struct dp_param_info *p = &m->params[i];
        if (p->is_buffer || p->offset < l->param_off || p->offset >= l->param_off + l->param_count)
            continue;
        int is_bias = p->shape.ndim == 1;
        p->init = is_bias ? DP_INIT_ZERO : DP_INIT_NORMAL;
        p->init_a = is_bias ? 0.0f : 0.02f;
    }
}

int dp_linear(struct dp_model *m, const char *name, int64_t out_features, int bias) {
    struct dp_shape in = dp_model_cur_shape(m);
    struct dp__model_mark mk = dp__model_mark(m);
    struct dp_layer *l;
    int rc = dp__linear_make(m, &l, name, &in, out_features, bias);
    return dp__layer_record(m, l, rc, &mk, "linear %s out=%lld bias=%d", name, (long long)out_features, bias != 0);
}
