/* Layer normalisation over the last dimension, as torch.nn.LayerNorm(D):
 * every row of D values (a feature vector, or one token of a (T, D)
 * sequence) is normalised on its own; statistics do not mix samples.
 *
 * Parameters weight (D) = 1 and bias (D) = 0.  Forward saves each row's mean
 * and rstd for backward (as llm.c's layernorm_forward).
 *
 * Letters: R rows (B * numel / D), D normalised dimension. */
#include <math.h>
#include <string.h>

#include "nn/layers_impl.h"

struct ln {
    int64_t D;
    float eps;
};

/* mean (R) and rstd (R) of the rows of x (R, D); two passes in double. */
static void ln_stats(float *mean, float *rstd, const float *x, int64_t R, int64_t D, float eps) {
#pragma omp parallel for schedule(static) if (R * D >= DP__OMP_MIN)
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * D;
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < D; j++)
            s += xr[j];
        double mu = s / (double)D, v = 0.0;
#pragma omp simd reduction(+ : v)
        for (int64_t j = 0; j < D; j++) {
            double t = xr[j] - mu;
            v += t * t;
        }
        mean[r] = (float)mu;
        rstd[r] = (float)(1.0 / sqrt(v / (double)D + (double)eps));
    }
}

/* Forward:  xhat = (x - mean_r) rstd_r,  y = w xhat + b,
 *           mean_r = sum_j x / D,  rstd_r = 1 / sqrt(sum_j (x - mean_r)^2 / D + eps)
 * Backward: g = dy w
 *           dx = rstd_r (g - mean_j(g) - xhat mean_j(g xhat))
 *           dW += sum_r dy xhat,  db += sum_r dy */
static int ln_forward(struct dp_layer *l, struct dp_ctx *ctx, float *y, const float *x, int64_t B) {
    const struct ln *p = l->priv;
    const int64_t D = p->D, R = B * (dp_shape_numel(&l->in_shape) / D);
    const float *w = ctx->params + l->param_off; /* (D) */
    const float *bias = w + D;                   /* (D) */
    float *stats = dp__arena_floats(ctx, 2 * R); /* (2, R): mean, rstd */
    if (!stats) return DP_ENOMEM;
    float *mean = stats, *rstd = stats + R;
    ln_stats(mean, rstd, x, R, D, p->eps);
#pragma omp parallel for schedule(static) if (R * D >= DP__OMP_MIN)
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * D;
        float *yr = y + r * D;
        const float m = mean[r], s = rstd[r];
#pragma omp simd
        for (int64_t j = 0; j < D; j++)
            yr[j] = (xr[j] - m) * s * w[j] + bias[j];
    }
    ctx->saved[l->id] = stats;
    return DP_OK;
}

static int ln_backward(struct dp_layer *l, struct dp_ctx *ctx, float *dx, const float *dy,
                       const float *x, const float *y, int64_t B) {
    const struct ln *p = l->priv;
    const int64_t D = p->D, R = B * (dp_shape_numel(&l->in_shape) / D);
    const float *w = ctx->params + l->param_off; /* (D) */
    float *dw = ctx->grads + l->param_off;       /* (D) */
    float *db = dw + D;                          /* (D) */
    float *stats = ctx->saved[l->id];
    if (!stats) {
        stats = dp__arena_floats(ctx, 2 * R);
        if (!stats) return DP_ENOMEM;
        ln_stats(stats, stats + R, x, R, D, p->eps);
    }
    const float *mean = stats, *rstd = stats + R;

    if (dx) {
#pragma omp parallel for schedule(static) if (R * D >= DP__OMP_MIN)
        for (int64_t r = 0; r < R; r++) {
            const float *xr = x + r * D, *g = dy + r * D;
            float *d = dx + r * D;
            const float m = mean[r], s = rstd[r];
            double sg = 0.0, sgx = 0.0;
#pragma omp simd reduction(+ : sg, sgx)
            for (int64_t j = 0; j < D; j++) {
                float gj = g[j] * w[j];
                sg += gj;
                sgx += (double)gj * ((xr[j] - m) * s);
            }
            const float mg = (float)(sg / (double)D), mgx = (float)(sgx / (double)D);
#pragma omp simd
            for (int64_t j = 0; j < D; j++)
                d[j] = s * (g[j] * w[j] - mg - (xr[j] - m) * s * mgx);
        }
    }

    /* Parameter gradients: each thread owns a range of columns and walks the rows in order, in
     * runs of up to RUN columns (one pass over memory where D fits): deterministic for any
     * thread count. */
    enum { RUN = 256 };
#pragma omp parallel if (R * D >= DP__OMP_MIN && D > 1)
    {
        int64_t a, b;
        dp__thread_share(D, &a, &b);
        for (int64_t j0 = a; j0 < b; j0 += RUN) {
            const int64_t j1 = j0 + RUN < b ? j0 + RUN : b;
            float aw[RUN] = {0}, ab[RUN] = {0};
            for (int64_t r = 0; r < R; r++) {
                const float *xr = x + r * D, *g = dy + r * D;
                const float m = mean[r], s = rstd[r];
#pragma omp simd
                for (int64_t j = j0; j < j1; j++) {
                    aw[j - j0] += g[j] * ((xr[j] - m) * s);
                    ab[j - j0] += g[j];
                }
            }
            for (int64_t j = j0; j < j1; j++) {
                dw[j] += aw[j - j0];
                db[j] += ab[j - j0];
            }
        }
    }
    return DP_OK;
}

static void ln_free(struct dp_layer *l) { dp_free(l->priv); }

static const struct dp_layer_ops ln_ops = {"layernorm", ln_forward, ln_backward, ln_free};

int dp__layernorm_make(struct dp_model *m, struct dp_layer **out, const char *name,
                       const struct dp_shape *in, float eps) {
    *out = NULL;
    struct dp__model_mark mk = dp__model_mark(m);
    if (in->ndim < 1) return dp_seterr(DP_EINVAL, "layernorm %s: input has no dims", name);
    if (!(eps > 0.0f)) return dp_seterr(DP_EINVAL, "layernorm %s: eps %g", name, (double)eps);
    struct dp_layer *l;
    int rc = dp_layer_make(m, &l, &ln_ops, name, in);
    if (rc) return rc;
    struct ln *p = dp_calloc(1, sizeof *p);
    if (!p)
        return dp__layer_fail(m, l, &mk, dp_seterr(DP_ENOMEM, "layernorm %s: out of memory", name));
    l->priv = p;
    p->D = in->d[in->ndim - 1];
    p->eps = eps;
    if ((rc = dp__add_param(m, l, "weight", dp__shape1(p->D), DP_INIT_CONST, 1.0f, 0)) ||
        (rc = dp__add_param(m, l, "bias", dp__shape1(p->D), DP_INIT_ZERO, 0.0f, 0)))
        return dp__layer_fail(m, l, &mk, rc);
    l->flops_fwd = 8 * dp_shape_numel(in);
    *out = l;
    return DP_OK;
}

int dp_layernorm(struct dp_model *m, const char *name, float eps) {
    struct dp_shape in = dp_model_cur_shape(m);
    struct dp__model_mark mk = dp__model_mark(m);
    struct dp_layer *l;
    int rc = dp__layernorm_make(m, &l, name, &in, eps);
    char es[32];
    return dp__layer_record(m, l, rc, &mk, "layernorm %s eps=%s", name, dp__float_str(es, eps));
}
