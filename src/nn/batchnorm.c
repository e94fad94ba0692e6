/* Batch normalisation over channels, as torch.nn.BatchNorm2d (and, for (C) or
 * (C, L) inputs, BatchNorm1d: statistics per channel over everything else).
 *
 * Training normalises with the batch statistics (biased variance) and updates
 * the running statistics with the unbiased one, as PyTorch:
 *     running = (1 - momentum) * running + momentum * stat,
 *     num_batches_tracked += 1.
 * Eval normalises with the running statistics.
 *
 * Data parallelism (SyncBatchNorm): the per-channel sums are computed in
 * double and, when ctx->stat_sync is set, summed over the workers before use,
 * so every worker normalises with the statistics of the global batch:
 *     forward:  buf = [sum x (C), sum x^2 (C), count (1)]
 *     backward: buf = [sum dy (C), sum dy*xhat (C)]
 * dW and db accumulate the LOCAL sums; the gradient reducer sums them.
 *
 * Parameters weight (C) = 1 and bias (C) = 0; buffers running_mean (C) = 0,
 * running_var (C) = 1 and num_batches_tracked = 0, a 0-dim tensor of one
 * element as in PyTorch's state dict (an int64 there, a float here: exact up
 * to 2^24 steps).
 *
 * Determinism: every sum runs over one channel in a fixed order (samples,
 * then pixels), and threads split the channels, so results do not depend on
 * the number of threads.
 *
 * Deterministic data parallelism (ctx->stat_acc; "ghost" batch normalisation, Hoffer et al.
 * 2017): each fixed chunk of the global batch is normalised with its own statistics, which do
 * not depend on how the chunks are spread over workers.  The running statistics move once per
 * optimizer step, towards the mean over the step's chunks of each chunk's mean and unbiased
 * variance: every chunk adds them in fixed point (round(v * 2^16), exact in a double) to
 * stat_acc, and 1 to its count, so the sum over any split of the chunks is the same integer;
 * apply_stats divides by the count after the trainer's all-reduce.
 *
 * Letters: B batch, C channels, HW pixels per channel and sample,
 * N = B*HW (summed over workers with stat_sync). */
#include <math.h>
#include <string.h>

#include "nn/layers_impl.h"

/* deterministic mode: a batch statistic's bound (its fixed point below 2^40) */
#define STAT_MAX 16777216.0

struct bn {
    int64_t C, HW;
    float eps, momentum;
    int relu; /* 1: ReLU fused (bn_fuse_relu, or the residual block's bn1) */
};

/* One output element before the fused ReLU: forward writes it, and backward recomputes it
 * from x for the ReLU's mask, [a x + s > 0] = [y > 0], instead of reading y or a masked
 * copy of dy (the one expression in both places, so the same bits). */
static inline float bn_affine(float a, float x, float s) { return a * x + s; }

/* g where v > 0, else +0: the ReLU mask's select (dp__relu_mask's y > 0 ? dy : 0) as bit
 * operations, which gcc vectorises inside a reduction where it will not if-convert the select. */
static inline float relu_gate(float v, float g) {
    uint32_t u;
    memcpy(&u, &g, sizeof u);
    u &= -(uint32_t)(v > 0.0f);
    float r;
    memcpy(&r, &u, sizeof r);
    return r;
}

/* Evaluation's affine map from the running statistics (forward, and a fused backward). */
static void eval_affine(const struct bn *p, const float *w, const float *bias, const float *rmean,
                        const float *rvar, float *scale, float *shift) {
    for (int64_t c = 0; c < p->C; c++) {
        double rstd = 1.0 / sqrt((double)rvar[c] + (double)p->eps);
        scale[c] = (float)(rstd * w[c]);
        shift[c] = (float)(bias[c] - rmean[c] * rstd * w[c]);
    }
}

/* What training forward keeps for backward. */
struct bn_saved {
    double N;    /* global count per channel */
    float *mean; /* (C) */
    float *rstd; /* (C) 1 / sqrt(var + eps) */
    float *scale; /* (2, C) forward's y = scale x + shift (a fused ReLU's mask) */
};

/* Forward (training): xhat = (x - mean_c) * rstd_c,  y = w_c xhat + b_c
 *           mean_c = sum x / N,  var_c = sum x^2 / N - mean_c^2,  rstd_c = 1/sqrt(var_c + eps)
 * Backward: db_c += sum dy,  dW_c += sum dy xhat                 (local sums)
 *           dx = (w_c rstd_c / N) (N dy - sum dy - xhat sum dy xhat)   (global sums and N)
 * Eval uses mean_c = running_mean, var_c = running_var, so dx = w_c rstd_c dy.
 * Backward does not read y (the residual block reuses that buffer): a fused ReLU's mask is
 * recomputed from x, [scale x + shift > 0].
 * Fused ReLU (bn_fuse_relu): y = max(w_c xhat + b_c, 0), and backward uses dy [y > 0]. */
static int bn_forward(struct dp_layer *l, struct dp_ctx *ctx, float *y, const float *x, int64_t B) {
    const struct bn *p = l->priv;
    const int64_t C = p->C, HW = p->HW;
    const float *w = ctx->params + l->param_off; /* (C) */
    const float *bias = w + C;                   /* (C) */
    float *rmean = ctx->buffers + l->buffer_off; /* (C) */
    float *rvar = rmean + C;                     /* (C) */
    float *nbt = rvar + C;                       /* (1) */
    float *scale = dp__arena_floats(ctx, 2 * C); /* (2, C): y = scale * x + shift */
    if (!scale) return DP_ENOMEM;
    float *shift = scale + C;

    if (ctx->training) {
        double *buf = dp_arena_alloc(ctx->arena, sizeof(double) * (size_t)(2 * C + 1));
        struct bn_saved *sv = dp_arena_alloc(ctx->arena, sizeof *sv);
        float *ms = dp__arena_floats(ctx, 2 * C);
        if (!buf || !sv || !ms) return DP_ENOMEM;
        /* Each thread sums its channels sample by sample, in memory order.  A channel's values
         * are B runs of HW floats, C HW apart: walked one channel at a time the runs were too
         * short (a 7x7 plane is 196 bytes) for the hardware prefetchers, and the sums waited on
         * memory. */
#pragma omp parallel if (B * C * HW >= DP__OMP_MIN)
        {
            int64_t c0, c1;
            dp__thread_share(C, &c0, &c1);
            for (int64_t c = c0; c < c1; c++) buf[c] = buf[C + c] = 0.0;
            for (int64_t b = 0; b < B; b++) {
                for (int64_t c = c0; c < c1; c++) {
                    const float *xp = x + (b * C + c) * HW;
                    double s = buf[c], ss = buf[C + c];
#pragma omp simd reduction(+ : s, ss)
                    for (int64_t j = 0; j < HW; j++) {
                        double v = xp[j];
                        s += v;
                        ss += v * v;
                    }
                    buf[c] = s;
                    buf[C + c] = ss;
                }
            }
        }
        buf[2 * C] = (double)(B * HW);
        if (ctx->stat_sync && !ctx->stat_acc) {
            int rc = ctx->stat_sync(ctx->stat_sync_arg, buf, 2 * C + 1);
            if (rc) return dp_adderr(rc, "batchnorm %s: statistics sync", l->name);
        }
        const double N = buf[2 * C];
        if (!(N > 1.0))
            return dp_seterr(
                DP_EINVAL, "batchnorm %s: training needs more than one value per channel (got %g)",
                l->name, N);
        sv->N = N;
        sv->mean = ms;
        sv->rstd = ms + C;
        sv->scale = scale;
        const double mom = p->momentum;
        for (int64_t c = 0; c < C; c++) {
            double mean = buf[c] / N;
            double var = buf[C + c] / N - mean * mean;
            if (var < 0.0) var = 0.0;
            double rstd = 1.0 / sqrt(var + (double)p->eps);
            sv->mean[c] = (float)mean;
            sv->rstd[c] = (float)rstd;
            scale[c] = (float)(rstd * w[c]);
            shift[c] = (float)(bias[c] - mean * rstd * w[c]);
            if (ctx->stat_acc) { /* deterministic mode: summed now, applied per step (bn_apply_stats) */
                double *acc = ctx->stat_acc + l->buffer_off, uv = var * N / (N - 1.0);
                if (!(fabs(mean) < STAT_MAX && uv < STAT_MAX))
                    return dp_seterr(DP_ENONFINITE, "batchnorm %s: a batch statistic (mean %g, variance %g) is "
                                     "not below 2^24, the bound of deterministic mode's fixed-point sums",
                                     l->name, mean, uv);
                acc[c] += nearbyint(mean * DP_STAT_FIXED_SCALE);
                acc[C + c] += nearbyint(uv * DP_STAT_FIXED_SCALE);
                continue;
            }
            rmean[c] = (float)((1.0 - mom) * rmean[c] + mom * mean);
            rvar[c] = (float)((1.0 - mom) * rvar[c] + mom * var * N / (N - 1.0));
        }
        if (ctx->stat_acc) ctx->stat_acc[l->buffer_off + 2 * C] += 1.0;
        else nbt[0] += 1.0f;
        ctx->saved[l->id] = sv;
    } else {
        eval_affine(p, w, bias, rmean, rvar, scale, shift);
    }
    const int relu = p->relu;
#pragma omp parallel for collapse(2) schedule(static) if (B * C * HW >= DP__OMP_MIN)
    for (int64_t b = 0; b < B; b++) {
        for (int64_t c = 0; c < C; c++) {
            const float *xp = x + (b * C + c) * HW;
            float *yp = y + (b * C + c) * HW;
            const float a = scale[c], s = shift[c];
            if (relu) {
#pragma omp simd
                for (int64_t j = 0; j < HW; j++)
                    yp[j] = dp__relu1(bn_affine(a, xp[j], s));
            } else {
#pragma omp simd
                for (int64_t j = 0; j < HW; j++)
                    yp[j] = bn_affine(a, xp[j], s);
            }
        }
    }
    return DP_OK;
}

static int bn_backward(struct dp_layer *l, struct dp_ctx *ctx, float *dx, const float *dy,
                       const float *x, const float *y, int64_t B) {
    const struct bn *p = l->priv;
    const int64_t C = p->C, HW = p->HW;
    const float *w = ctx->params + l->param_off; /* (C) */
    float *dw = ctx->grads + l->param_off;       /* (C) */
    float *db = dw + C;                          /* (C) */
    const float *rmean = ctx->buffers + l->buffer_off;
    const float *rvar = rmean + C;

    /* mean and rstd as used by forward */
    const struct bn_saved *sv = NULL;
    float *ms = NULL;
    if (ctx->training) {
        sv = ctx->saved[l->id];
        if (!sv)
            return dp_seterr(DP_EINTERNAL, "batchnorm %s: backward without a training forward",
                             l->name);
        ms = sv->mean;
    } else {
        ms = dp__arena_floats(ctx, 2 * C);
        if (!ms) return DP_ENOMEM;
        for (int64_t c = 0; c < C; c++) {
            ms[c] = rmean[c];
            ms[C + c] = (float)(1.0 / sqrt((double)rvar[c] + (double)p->eps));
        }
    }
    const float *mean = ms, *rstd = sv ? sv->rstd : ms + C;
    /* a fused ReLU: dy is masked by [scale x + shift > 0], forward's own y > 0 */
    const int relu = p->relu;
    const float *scale = sv ? sv->scale : NULL, *shift;
    if (relu && !scale) {
        float *sc = dp__arena_floats(ctx, 2 * C);
        if (!sc) return DP_ENOMEM;
        eval_affine(p, w, w + C, rmean, rvar, sc, sc + C);
        scale = sc;
    }
    shift = scale ? scale + C : NULL;

    double *buf = dp_arena_alloc(ctx->arena, sizeof(double) * (size_t)(2 * C)); /* (2, C) */
    if (!buf) return DP_ENOMEM;
    /* (each thread its channels, sample by sample, as forward's sums) */
#pragma omp parallel if (B * C * HW >= DP__OMP_MIN)
    {
        int64_t c0, c1;
        dp__thread_share(C, &c0, &c1);
        for (int64_t c = c0; c < c1; c++) buf[c] = buf[C + c] = 0.0;
        for (int64_t b = 0; b < B; b++) {
            for (int64_t c = c0; c < c1; c++) {
                const float *xp = x + (b * C + c) * HW, *g = dy + (b * C + c) * HW;
                const float m = mean[c], r = rstd[c];
                double sdy = buf[c], sdyx = buf[C + c];
                if (relu) {
                    const float a = scale[c], s = shift[c];
#pragma omp simd reduction(+ : sdy, sdyx)
                    for (int64_t j = 0; j < HW; j++) {
                        const float gj = relu_gate(bn_affine(a, xp[j], s), g[j]);
                        sdy += gj;
                        sdyx += (double)gj * ((xp[j] - m) * r);
                    }
                } else {
#pragma omp simd reduction(+ : sdy, sdyx)
                    for (int64_t j = 0; j < HW; j++) {
                        sdy += g[j];
                        sdyx += (double)g[j] * ((xp[j] - m) * r);
                    }
                }
                buf[c] = sdy;
                buf[C + c] = sdyx;
            }
        }
        for (int64_t c = c0; c < c1; c++) {
            db[c] += (float)buf[c];
            dw[c] += (float)buf[C + c];
        }
    }
    if (!dx) return DP_OK;

    /* Per channel: dx = k (dy - a - xhat * e) */
    float *k = dp__arena_floats(ctx, 3 * C); /* (3, C) */
    if (!k) return DP_ENOMEM;
    float *a = k + C, *e = k + 2 * C;
    if (ctx->training) {
        if (ctx->stat_sync && !ctx->stat_acc) { /* (deterministic mode: the chunk's own sums) */
            int rc = ctx->stat_sync(ctx->stat_sync_arg, buf, 2 * C);
            if (rc) return dp_adderr(rc, "batchnorm %s: gradient sync", l->name);
        }
        for (int64_t c = 0; c < C; c++) {
            k[c] = w[c] * rstd[c];
            a[c] = (float)(buf[c] / sv->N);
            e[c] = (float)(buf[C + c] / sv->N);
        }
    } else {
        for (int64_t c = 0; c < C; c++) {
            k[c] = w[c] * rstd[c];
            a[c] = 0.0f;
            e[c] = 0.0f;
        }
    }
#pragma omp parallel for collapse(2) schedule(static) if (B * C * HW >= DP__OMP_MIN)
    for (int64_t b = 0; b < B; b++) {
        for (int64_t c = 0; c < C; c++) {
            const float *xp = x + (b * C + c) * HW, *g = dy + (b * C + c) * HW;
            float *d = dx + (b * C + c) * HW;
            const float m = mean[c], r = rstd[c], kc = k[c], ac = a[c], ec = e[c];
            if (relu) {
                const float sa = scale[c], sb = shift[c];
#pragma omp simd
                for (int64_t j = 0; j < HW; j++) {
                    const float gj = relu_gate(bn_affine(sa, xp[j], sb), g[j]);
                    d[j] = kc * (gj - ac - (xp[j] - m) * r * ec);
                }
                continue;
            }
#pragma omp simd
            for (int64_t j = 0; j < HW; j++)
                d[j] = kc * (g[j] - ac - (xp[j] - m) * r * ec);
        }
    }
    return DP_OK;
}

static void bn_free(struct dp_layer *l) { dp_free(l->priv); }

static int bn_fuse_relu(struct dp_layer *l) {
    ((struct bn *)l->priv)->relu = 1;
    return 1;
}

/* Deterministic mode, once per optimizer step: the running statistics move towards the mean
 * of the step's chunk statistics (acc: their fixed-point sums over every worker; count k) */
static void bn_apply_stats(const struct dp_layer *l, float *buffers, const double *acc) {
    const struct bn *p = l->priv;
    const int64_t C = p->C;
    const double *a = acc + l->buffer_off, k = a[2 * C], mom = p->momentum;
    float *rmean = buffers + l->buffer_off, *rvar = rmean + C, *nbt = rvar + C;
    if (!(k > 0)) return; /* no training batch this step */
    for (int64_t c = 0; c < C; c++) {
        rmean[c] = (float)((1.0 - mom) * rmean[c] + mom * (a[c] / (DP_STAT_FIXED_SCALE * k)));
        rvar[c] = (float)((1.0 - mom) * rvar[c] + mom * (a[C + c] / (DP_STAT_FIXED_SCALE * k)));
    }
    nbt[0] += 1.0f;
}

static const struct dp_layer_ops bn_ops = {"batchnorm2d", bn_forward, bn_backward, bn_free};

void dp__layer_apply_stats(const struct dp_layer *l, float *buffers, const double *acc) {
    if (l->ops == &bn_ops) bn_apply_stats(l, buffers, acc);
    else if (!strcmp(l->ops->type, "resblock")) { /* its BatchNorms */
        const struct dp_layer *child[6];
        int n = dp__resblock_children(l, child);
        for (int i = 0; i < n; i++) dp__layer_apply_stats(child[i], buffers, acc);
    }
}

int dp__batchnorm2d_make(struct dp_model *m, struct dp_layer **out, const char *name,
                         const struct dp_shape *in, float eps, float momentum) {
    *out = NULL;
    struct dp__model_mark mk = dp__model_mark(m);
    if (in->ndim < 1 || in->ndim > 3)
        return dp_seterr(DP_EINVAL, "batchnorm %s: input has %d dims, expected (C, H, W)", name,
                         in->ndim);
    if (!(eps > 0.0f) || !(momentum >= 0.0f && momentum <= 1.0f))
        return dp_seterr(DP_EINVAL, "batchnorm %s: eps %g, momentum %g", name, (double)eps,
                         (double)momentum);
    struct dp_layer *l;
    int rc = dp_layer_make(m, &l, &bn_ops, name, in);
    if (rc) return rc;
    struct bn *p = dp_calloc(1, sizeof *p);
    if (!p)
        return dp__layer_fail(m, l, &mk, dp_seterr(DP_ENOMEM, "batchnorm %s: out of memory", name));
    l->priv = p;
    p->C = in->d[0];
    p->HW = dp_shape_numel(in) / p->C;
    p->eps = eps;
    p->momentum = momentum;
    const int64_t C = p->C;
    const struct dp_shape scalar = {0, {0, 0, 0, 0}}; /* 0-dim, one element, as in PyTorch */
    if ((rc = dp__add_param(m, l, "weight", dp__shape1(C), DP_INIT_CONST, 1.0f, 0)) ||
        (rc = dp__add_param(m, l, "bias", dp__shape1(C), DP_INIT_ZERO, 0.0f, 0)) ||
        (rc = dp__add_param(m, l, "running_mean", dp__shape1(C), DP_INIT_ZERO, 0.0f, 1)) ||
        (rc = dp__add_param(m, l, "running_var", dp__shape1(C), DP_INIT_CONST, 1.0f, 1)) ||
        (rc = dp__add_param(m, l, "num_batches_tracked", scalar, DP_INIT_ZERO, 0.0f, 1)))
        return dp__layer_fail(m, l, &mk, rc);
    l->flops_fwd = 2 * dp_shape_numel(in);
    l->fuse_relu = bn_fuse_relu;
    *out = l;
    return DP_OK;
}

int dp_batchnorm2d(struct dp_model *m, const char *name, float eps, float momentum) {
    struct dp_shape in = dp_model_cur_shape(m);
    struct dp__model_mark mk = dp__model_mark(m);
    struct dp_layer *l;
    int rc = dp__batchnorm2d_make(m, &l, name, &in, eps, momentum);
    char es[32], ms[32];
    return dp__layer_record(m, l, rc, &mk, "batchnorm %s eps=%s momentum=%s", name, dp__float_str(es, eps),
                            dp__float_str(ms, momentum));
}
