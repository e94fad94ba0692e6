/* Residual basic block, as torchvision's BasicBlock (ResNet-18/34):
 *
 *     x ─┬─ conv1 (3x3, stride, pad 1) ─ bn1 ─ relu ─ conv2 (3x3, pad 1) ─ bn2 ─┐
 *        └─ shortcut ───────────────────────────────────────────────────────── + ─ relu ─ y
 *
 * The shortcut is the identity when the shape is kept (stride 1, same
 * channels), else "downsample.0" (1x1 conv, stride, no bias) followed by
 * "downsample.1" (BN).  The convolutions have no bias; the BNs use PyTorch's
 * defaults (eps 1e-5, momentum 0.1).
 *
 * The children are ordinary layers owned by the block, named "<block>.conv1",
 * "<block>.bn1", ..., so parameter names match torchvision's state dict
 * ("layer2.0.downsample.0.weight"), registered in torchvision's order.  The
 * block's parameter range is the union of its children's, which are
 * contiguous since they are created right after the block.
 *
 * Letters: B batch, C OC channels, M = B*OC*OH*OW (the block's output size),
 * n_in = B*C*H*W. */
#include <stdio.h>
#include <string.h>

#include "nn/layers_impl.h"

struct resblock {
    struct dp_layer *conv1, *bn1, *conv2, *bn2;
    struct dp_layer *dconv, *dbn; /* NULL for the identity shortcut */
    int bn1_relu;                 /* 1: bn1 applies the ReLU after it (resblock_fuse) */
};

/* Intermediates kept by forward for backward (all (M) floats). */
struct resblock_saved {
    float *t1; /* conv1(x) */
    float *t2; /* relu(bn1(t1)), computed in place */
    float *t4; /* conv2(t2) */
    float *s1; /* downsample.0(x), or NULL */
};

/* Forward:  t2 = relu(bn1(conv1(x))),  y = relu(bn2(conv2(t2)) + s(x))
 * Backward: g = dy [y > 0]
 *           main:     dt2 = conv2^T(bn2^T(g)) [t2 > 0],  dx_main = conv1^T(bn1^T(dt2))
 *           shortcut: dx_s = g (identity) or conv_d^T(bn_d^T(g))
 *           dx = dx_main + dx_s  (each child's backward overwrites its dx, so the
 *           two paths are summed here); parameter gradients accumulate in the
 *           children.  BatchNorm's and conv's backward do not read y, so the
 *           buffers holding their outputs may be reused in place. */
static int resblock_forward(struct dp_layer *l, struct dp_ctx *ctx, float *y, const float *x,
                            int64_t B) {
    const struct resblock *p = l->priv;
    const int64_t M = B * dp_shape_numel(&l->out_shape);
    struct resblock_saved *sv = dp_arena_alloc(ctx->arena, sizeof *sv);
    if (!sv) return DP_ENOMEM;
    memset(sv, 0, sizeof *sv);
    sv->t1 = dp__arena_floats(ctx, M);
    sv->t2 = dp__arena_floats(ctx, M);
    sv->t4 = dp__arena_floats(ctx, M);
    if (!sv->t1 || !sv->t2 || !sv->t4) return DP_ENOMEM;
    int rc;
    if ((rc = p->conv1->ops->forward(p->conv1, ctx, sv->t1, x, B)) ||
        (rc = p->bn1->ops->forward(p->bn1, ctx, sv->t2, sv->t1, B)))
        return rc;
    if (!p->bn1_relu) dp__relu(sv->t2, sv->t2, M);
    /* bn2 writes straight into y; the shortcut is added in place. */
    if ((rc = p->conv2->ops->forward(p->conv2, ctx, sv->t4, sv->t2, B)) ||
        (rc = p->bn2->ops->forward(p->bn2, ctx, y, sv->t4, B)))
        return rc;
    const float *s = x;
    if (p->dconv) {
        float *s2 = dp__arena_floats(ctx, M);
        sv->s1 = dp__arena_floats(ctx, M);
        if (!s2 || !sv->s1) return DP_ENOMEM;
        if ((rc = p->dconv->ops->forward(p->dconv, ctx, sv->s1, x, B)) ||
            (rc = p->dbn->ops->forward(p->dbn, ctx, s2, sv->s1, B)))
            return rc;
        s = s2;
    }
#pragma omp parallel for simd schedule(static) if (parallel : M >= DP__OMP_MIN)
    for (int64_t i = 0; i < M; i++) {
        y[i] = dp__relu1(y[i] + s[i]);
    }
    ctx->saved[l->id] = sv;
    return DP_OK;
}

static int resblock_backward(struct dp_layer *l, struct dp_ctx *ctx, float *dx, const float *dy,
                             const float *x, const float *y, int64_t B) {
    const struct resblock *p = l->priv;
    const struct resblock_saved *sv = ctx->saved[l->id];
    if (!sv) return dp_seterr(DP_EINTERNAL, "resblock %s: backward without forward", l->name);
    const int64_t M = B * dp_shape_numel(&l->out_shape);
    const int64_t n_in = B * dp_shape_numel(&l->in_shape);
    float *g = dp__arena_floats(ctx, M);  /* dL/d(pre-activation sum) */
    float *g1 = dp__arena_floats(ctx, M); /* ping-pong buffers for the main path */
    float *g2 = dp__arena_floats(ctx, M);
    if (!g || !g1 || !g2) return DP_ENOMEM;
    dp__relu_mask(g, dy, y, M);

    int rc;
    if ((rc = p->bn2->ops->backward(p->bn2, ctx, g1, g, sv->t4, NULL, B)) ||
        (rc = p->conv2->ops->backward(p->conv2, ctx, g2, g1, sv->t2, NULL, B)))
        return rc;
    if (!p->bn1_relu) dp__relu_mask(g2, g2, sv->t2, M); /* (fused: bn1 masks as it reads) */
    if ((rc = p->bn1->ops->backward(p->bn1, ctx, g1, g2, sv->t1, NULL, B)) ||
        (rc = p->conv1->ops->backward(p->conv1, ctx, dx, g1, x, NULL, B)))
        return rc;

    const float *ds = g; /* shortcut gradient w.r.t. x */
    if (p->dconv) {
        float *dxs = dx ? dp__arena_floats(ctx, n_in) : NULL;
        if (dx && !dxs) return DP_ENOMEM;
        if ((rc = p->dbn->ops->backward(p->dbn, ctx, g2, g, sv->s1, NULL, B)) ||
            (rc = p->dconv->ops->backward(p->dconv, ctx, dxs, g2, x, NULL, B)))
            return rc;
        ds = dxs;
    }
    if (dx) {
#pragma omp parallel for simd schedule(static) if (parallel : n_in >= DP__OMP_MIN)
        for (int64_t i = 0; i < n_in; i++)
            dx[i] += ds[i];
    }
    return DP_OK;
}

static void resblock_free(struct dp_layer *l) {
    struct resblock *p = l->priv;
    if (!p) return;
    dp_layer_free(p->conv1);
    dp_layer_free(p->bn1);
    dp_layer_free(p->conv2);
    dp_layer_free(p->bn2);
    dp_layer_free(p->dconv);
    dp_layer_free(p->dbn);
    dp_free(p);
}

/* Fusion (dp_model_finalize): bn1 applies the ReLU after it in its own passes, so forward
 * and backward make one pass over t2 fewer each; the same bits (batchnorm.c, bn_affine). */
static void resblock_fuse(struct dp_layer *l) {
    struct resblock *p = l->priv;
    p->bn1_relu = p->bn1->fuse_relu && p->bn1->fuse_relu(p->bn1);
}

static const struct dp_layer_ops resblock_ops = {"resblock", resblock_forward, resblock_backward,
                                                 resblock_free};

int dp__resblock_children(const struct dp_layer *l, const struct dp_layer *child[6]) {
    const struct resblock *p = l->priv;
    const struct dp_layer *all[6] = {p->conv1, p->bn1, p->conv2, p->bn2, p->dconv, p->dbn};
    int n = 0;
    for (int i = 0; i < 6; i++)
        if (all[i]) child[n++] = all[i];
    return n;
}

/* "<block>.<child>" into buf (64 bytes, the size of dp_layer.name). */
static int child_name(char *buf, const char *block, const char *child) {
    int n = snprintf(buf, 64, "%s.%s", block, child);
    if (n < 0 || n >= 64)
        return dp_seterr(DP_EINVAL, "resblock %s: name too long for child %s", block, child);
    return DP_OK;
}

int dp__resblock_make(struct dp_model *m, struct dp_layer **out, const char *name,
                      const struct dp_shape *in, int64_t out_channels, int stride) {
    *out = NULL;
    struct dp__model_mark mk = dp__model_mark(m);
    if (in->ndim != 3)
        return dp_seterr(DP_EINVAL, "resblock %s: input has %d dims, expected (C, H, W)", name,
                         in->ndim);
    if (out_channels <= 0 || stride <= 0)
        return dp_seterr(DP_EINVAL, "resblock %s: out_channels %lld, stride %d", name,
                         (long long)out_channels, stride);
    struct dp_layer *l;
    int rc = dp_layer_make(m, &l, &resblock_ops, name, in);
    if (rc) return rc;
    struct resblock *p = dp_calloc(1, sizeof *p);
    if (!p)
        return dp__layer_fail(m, l, &mk, dp_seterr(DP_ENOMEM, "resblock %s: out of memory", name));
    l->priv = p;
    l->fuse_inner = resblock_fuse;

    /* Children in torchvision's registration order. */
    char nm[64];
    const float eps = 1e-5f, mom = 0.1f;
    if ((rc = child_name(nm, name, "conv1")) ||
        (rc = dp__conv2d_make(m, &p->conv1, nm, in, out_channels, 3, stride, 1, 0)) ||
        (rc = child_name(nm, name, "bn1")) ||
        (rc = dp__batchnorm2d_make(m, &p->bn1, nm, &p->conv1->out_shape, eps, mom)) ||
        (rc = child_name(nm, name, "conv2")) ||
        (rc = dp__conv2d_make(m, &p->conv2, nm, &p->bn1->out_shape, out_channels, 3, 1, 1, 0)) ||
        (rc = child_name(nm, name, "bn2")) ||
        (rc = dp__batchnorm2d_make(m, &p->bn2, nm, &p->conv2->out_shape, eps, mom)))
        return dp__layer_fail(m, l, &mk, rc);
    if (stride != 1 || out_channels != in->d[0]) {
        if ((rc = child_name(nm, name, "downsample.0")) ||
            (rc = dp__conv2d_make(m, &p->dconv, nm, in, out_channels, 1, stride, 0, 0)) ||
            (rc = child_name(nm, name, "downsample.1")) ||
            (rc = dp__batchnorm2d_make(m, &p->dbn, nm, &p->dconv->out_shape, eps, mom)))
            return dp__layer_fail(m, l, &mk, rc);
        const struct dp_shape *a = &p->dconv->out_shape, *b = &p->conv2->out_shape;
        if (a->d[1] != b->d[1] || a->d[2] != b->d[2])
            return dp__layer_fail(
                m, l, &mk, dp_seterr(DP_EINTERNAL, "resblock %s: shortcut shape differs", name));
    }
    l->out_shape = p->bn2->out_shape;
    l->param_count = m->num_params - l->param_off;
    l->buffer_count = m->num_buffers - l->buffer_off;
    const int64_t M = dp_shape_numel(&l->out_shape);
    l->flops_fwd =
        p->conv1->flops_fwd + p->bn1->flops_fwd + p->conv2->flops_fwd + p->bn2->flops_fwd + 3 * M;
    if (p->dconv) l->flops_fwd += p->dconv->flops_fwd + p->dbn->flops_fwd;
    *out = l;
    return DP_OK;
}

int dp_resblock(struct dp_model *m, const char *name, int64_t out_channels, int stride) {
    struct dp_shape in = dp_model_cur_shape(m);
    struct dp__model_mark mk = dp__model_mark(m);
    struct dp_layer *l;
    int rc = dp__resblock_make(m, &l, name, &in, out_channels, stride);
    return dp__layer_record(m, l, rc, &mk, "resblock %s out=%lld stride=%d", name, (long long)out_channels, stride);
}
