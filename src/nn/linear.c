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

#include "core/core_impl.h"
#include "nn/layers_impl.h"

struct linear {
    int64_t in, out; /* features */
    int bias;
    int relu; /* 1: ReLU fused (linear_fuse_relu) */
};

/* db (OUT) += sum over rows of dy (R, OUT).  Each thread owns a range of columns and walks the
 * rows in order, in runs of up to COLSUM_RUN columns (one pass over memory where N fits), so
 * the result does not depend on the number of threads. */
#define COLSUM_RUN 512
static void colsum_add_ld(float *db, const float *dy, int64_t ld, int64_t R, int64_t N) {
#pragma omp parallel if (R * N >= DP__OMP_MIN && N > 1)
    {
        int64_t a, b;
        dp__thread_share(N, &a, &b);
        for (int64_t j0 = a; j0 < b; j0 += COLSUM_RUN) {
            const int64_t j1 = j0 + COLSUM_RUN < b ? j0 + COLSUM_RUN : b;
            float acc[COLSUM_RUN] = {0};
            for (int64_t r = 0; r < R; r++) {
                const float *row = dy + r * ld;
#pragma omp simd
                for (int64_t j = j0; j < j1; j++)
                    acc[j - j0] += row[j];
            }
            for (int64_t j = j0; j < j1; j++)
                db[j] += acc[j - j0];
        }
    }
}

static void colsum_add(float *db, const float *dy, int64_t R, int64_t N) { colsum_add_ld(db, dy, N, R, N); }

/* ---- forward / backward ------------------------------------------------------ */

/* What each tile of the forward GEMM's y gets right after the GEMM wrote it, while it is in cache
 * (dp__gemm_post): the bias, then the layer's fused ReLU, or the transformer's exact GELU keeping
 * its derivative (g = GELU(v), GELU'(v) in v's place).  Elementwise, so the tiles never show in
 * the bits; the expressions are the ReLU and gelu_erf layers'. */
struct fwd_post {
    const float *b; /* the bias from the GEMM's column 0 on (NULL: none) */
    int relu;
    float *g; /* the GELU's output at the GEMM's column 0, row stride ldg (NULL: no GELU) */
    int64_t ldg;
};

static void fwd_post_tile(void *arg, float *c, int64_t ldc, int64_t i0, int64_t j0, int64_t m, int64_t n) {
    const struct fwd_post *p = arg;
    for (int64_t i = 0; i < m; i++) {
        float *y = c + i * ldc;
        if (p->b) {
            const float *b = p->b + j0;
#pragma omp simd
            for (int64_t j = 0; j < n; j++)
                y[j] += b[j];
        }
        if (p->relu) {
#pragma omp simd
            for (int64_t j = 0; j < n; j++)
                y[j] = dp__relu1(y[j]);
        } else if (p->g) {
            float *g = p->g + (i0 + i) * p->ldg + j0;
#pragma omp simd
            for (int64_t j = 0; j < n; j++) {
                float d;
                g[j] = dp__gelu_erf1(y[j], &d);
                y[j] = d;
            }
        }
    }
}

/* dx's tiles times the kept GELU' (the transformer's fc_out): dx[i][j] *= mul[i][j]. */
struct mul_post {
    const float *mul;
    int64_t ld;
};

static void mul_post_tile(void *arg, float *c, int64_t ldc, int64_t i0, int64_t j0, int64_t m, int64_t n) {
    const struct mul_post *p = arg;
    for (int64_t i = 0; i < m; i++) {
        float *dx = c + i * ldc;
        const float *d = p->mul + (i0 + i) * p->ld + j0;
#pragma omp simd
        for (int64_t j = 0; j < n; j++)
            dx[j] *= d[j];
    }
}

/* Forward:  y = x W^T + b                    y (R, OUT), x (R, IN), W (OUT, IN)
 * Backward: dx = dy W                        (overwrite; skipped when dx is NULL)
 *           dW += dy^T x                     (OUT, IN)
 *           db += sum_r dy[r]                (OUT)
 * Each pass is one GEMM over all R rows of the batch (or one per slice of output features:
 * dp_model_set_unit); the bias (and a fused activation) go onto y's tiles as the GEMM writes
 * them.  With g (dp__linear_forward_gelu): g = GELU(y), and GELU'(y) in y's place. */
static int linear_forward_g(struct dp_layer *l, struct dp_ctx *ctx, float *y, float *g, const float *x, int64_t B) {
    const struct linear *p = l->priv;
    int64_t R = B * (dp_shape_numel(&l->in_shape) / p->in);
    const float *w = ctx->params + l->param_off; /* (OUT, IN) */
    /* (a sliced layer's bias is read once its first slice has begun: ZeRO-3 gathers it then) */
    int rc = l->slice_rows > 0 ? dp__layer_slice_begin(ctx, l, DP_PHASE_FORWARD, 0, l->slice_rows, p->bias) : DP_OK;
    if (rc) return rc;
    const float *b = p->bias ? w + p->out * p->in : NULL; /* (OUT) */
    struct fwd_post post = {b, p->relu, g, p->out};
    const struct dp__gemm_post gp = {fwd_post_tile, &post}, *pp = b || p->relu || g ? &gp : NULL;
    if (l->slice_rows > 0) { /* in slices of output features: y[:, r0:r0+nr] = x W[r0:r0+nr]^T */
        for (int64_t r0 = 0; r0 < p->out; r0 += l->slice_rows) {
            int64_t nr = p->out - r0 < l->slice_rows ? p->out - r0 : l->slice_rows;
            if (r0 && (rc = dp__layer_slice_begin(ctx, l, DP_PHASE_FORWARD, r0, nr, p->bias))) return rc;
            post.b = b ? b + r0 : NULL, post.g = g ? g + r0 : NULL;
            dp__gemm_post(0, 1, R, nr, p->in, 1.0f, x, p->in, w + r0 * p->in, p->in, 0.0f, y + r0, p->out, pp);
        }
    } else
        dp__gemm_post(0, 1, R, p->out, p->in, 1.0f, x, p->in, w, p->in, 0.0f, y, p->out, pp);
    return DP_OK;
}

static int linear_forward(struct dp_layer *l, struct dp_ctx *ctx, float *y, const float *x, int64_t B) {
    return linear_forward_g(l, ctx, y, NULL, x, B);
}

int dp__linear_forward_gelu(struct dp_layer *l, struct dp_ctx *ctx, float *y, float *g, const float *x, int64_t B) {
    return linear_forward_g(l, ctx, y, g, x, B);
}

/* Backward in slices, from the last rows down (the order the reducer's buckets are ready in):
 * db first (its bucket is the highest), then per slice dW[r0:r0+nr] += dy[:, r0:r0+nr]^T x and
 * dx (+)= dy[:, r0:r0+nr] W[r0:r0+nr], each slice's gradient reported ready as soon as it is
 * written.  dx is so summed over output features one slice at a time, the last first. */
static int linear_backward_sliced(struct dp_layer *l, struct dp_ctx *ctx, float *dx, const float *dy, const float *x,
                                  int64_t R, const struct dp__gemm_post *dx_post) {
    const struct linear *p = l->priv;
    const float *w = ctx->params + l->param_off;
    float *dw = ctx->grads + l->param_off;
    if (p->bias) { /* (its range visited too, first, as backward visits every range in turn: ZeRO-3 then
                    * prefetches the last slice while db is summed) */
        int rc = dp__layer_slice_begin(ctx, l, DP_PHASE_BACKWARD, p->out, 0, 0);
        if (rc) return rc;
        colsum_add(dw + p->out * p->in, dy, R, p->out);
        if (ctx->grad_ready) ctx->grad_ready(ctx->grad_ready_arg, l->param_off + p->out * p->in, p->out);
    }
    const int64_t ns = (p->out + l->slice_rows - 1) / l->slice_rows;
    for (int64_t j = ns - 1; j >= 0; j--) {
        int64_t r0 = j * l->slice_rows, nr = p->out - r0 < l->slice_rows ? p->out - r0 : l->slice_rows;
        int rc = dp__layer_slice_begin(ctx, l, DP_PHASE_BACKWARD, r0, nr, 0);
        if (rc) return rc;
        dp_gemm(1, 0, nr, p->in, R, 1.0f, dy + r0, p->out, x, p->in, 1.0f, dw + r0 * p->in, p->in);
        if (dx) /* (dx_post once dx is whole, with the last slice) */
            dp__gemm_post(0, 0, R, p->in, nr, 1.0f, dy + r0, p->out, w + r0 * p->in, p->in, j == ns - 1 ? 0.0f : 1.0f,
                          dx, p->in, j == 0 ? dx_post : NULL);
        if (ctx->grad_ready) ctx->grad_ready(ctx->grad_ready_arg, l->param_off + r0 * p->in, nr * p->in);
    }
    return DP_OK;
}

/* Backward, with dx times mul as its tiles are written (dp__linear_backward_mul) when mul is not
 * NULL. */
static int linear_backward_m(struct dp_layer *l, struct dp_ctx *ctx, float *dx, const float *mul, const float *dy,
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
    struct mul_post mp = {mul, p->in};
    const struct dp__gemm_post gp = {mul_post_tile, &mp}, *pp = mul ? &gp : NULL;
    if (l->slice_rows > 0) return linear_backward_sliced(l, ctx, dx, dy, x, R, pp);
    dp_gemm(1, 0, p->out, p->in, R, 1.0f, dy, p->out, x, p->in, 1.0f, dw, p->in);
    if (p->bias) colsum_add(db, dy, R, p->out);
    if (dx) dp__gemm_post(0, 0, R, p->in, p->out, 1.0f, dy, p->out, w, p->in, 0.0f, dx, p->in, pp);
    return DP_OK;
}

static int linear_backward(struct dp_layer *l, struct dp_ctx *ctx, float *dx, const float *dy, const float *x,
                           const float *y, int64_t B) {
    return linear_backward_m(l, ctx, dx, NULL, dy, x, y, B);
}

int dp__linear_backward_mul(struct dp_layer *l, struct dp_ctx *ctx, float *dx, const float *mul, const float *dy,
                            const float *x, int64_t B) {
    return linear_backward_m(l, ctx, dx, mul, dy, x, NULL, B);
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
    l->rows = p->out, l->row_len = p->in; /* can run in slices (dp_model_set_unit) */
    *out = l;
    return DP_OK;
}

/* ---- slices, for tensor parallelism (Megatron-LM's parallel Linear) --------------------
 * Column-parallel: this rank's output features [r0, r0 + nr), rows r0.. of W and b:
 *     y[:, 0:nr] = x W[r0:r0+nr]^T + b[r0:r0+nr]        y (R, nr) with row stride ldy
 *     dW[r0:r0+nr] += dy^T x,  db[r0:r0+nr] += sum_r dy,  dx (+)= dy W[r0:r0+nr]
 * dx is this rank's share of the input's gradient (the group's sum is the whole; the caller
 * all-reduces), added to dx when accumulate (several slices of one input).
 * Row-parallel: this rank's input features [c0, c0 + nc), columns c0.. of W (row stride IN):
 *     y = x W[:, c0:c0+nc]^T                            x (R, nc), y (R, OUT): a partial sum
 *     dW[:, c0:c0+nc] += dy^T x,  dx = dy W[:, c0:c0+nc]
 * whose bias is added once, by the caller, after the all-reduce (and its gradient is the
 * full layer's: dp__linear_bias_backward).
 * The transformer's MLP: the column-parallel fc with g (not NULL) also takes the GELU, g = GELU(y)
 * with y's stride and GELU'(y) in y's place, and the row-parallel fc_out with mul (not NULL)
 * multiplies dx (R, nc) by mul (R, nc), as dp__linear_forward_gelu and _backward_mul do. */
void dp__linear_rows_forward(const struct dp_layer *l, const struct dp_ctx *ctx, float *y, float *g, int64_t ldy,
                             const float *x, int64_t R, int64_t r0, int64_t nr) {
    const struct linear *p = l->priv;
    const float *w = ctx->params + l->param_off + r0 * p->in, *b = ctx->params + l->param_off + p->out * p->in + r0;
    struct fwd_post post = {p->bias ? b : NULL, 0, g, ldy};
    const struct dp__gemm_post gp = {fwd_post_tile, &post};
    dp__gemm_post(0, 1, R, nr, p->in, 1.0f, x, p->in, w, p->in, 0.0f, y, ldy, p->bias || g ? &gp : NULL);
}

void dp__linear_rows_backward(const struct dp_layer *l, const struct dp_ctx *ctx, float *dx, int accumulate,
                              const float *dy, int64_t ldy, const float *x, int64_t R, int64_t r0, int64_t nr) {
    const struct linear *p = l->priv;
    const float *w = ctx->params + l->param_off + r0 * p->in;
    float *dw = ctx->grads + l->param_off + r0 * p->in, *db = ctx->grads + l->param_off + p->out * p->in + r0;
    dp_gemm(1, 0, nr, p->in, R, 1.0f, dy, ldy, x, p->in, 1.0f, dw, p->in);
    if (p->bias) colsum_add_ld(db, dy, ldy, R, nr);
    if (dx) dp_gemm(0, 0, R, p->in, nr, 1.0f, dy, ldy, w, p->in, accumulate ? 1.0f : 0.0f, dx, p->in);
}

void dp__linear_cols_forward(const struct dp_layer *l, const struct dp_ctx *ctx, float *y, const float *x, int64_t R,
                             int64_t c0, int64_t nc) {
    const struct linear *p = l->priv;
    dp_gemm(0, 1, R, p->out, nc, 1.0f, x, nc, ctx->params + l->param_off + c0, p->in, 0.0f, y, p->out);
}

void dp__linear_cols_backward(const struct dp_layer *l, const struct dp_ctx *ctx, float *dx, const float *mul,
                              const float *dy, const float *x, int64_t R, int64_t c0, int64_t nc) {
    const struct linear *p = l->priv;
    struct mul_post mp = {mul, nc};
    const struct dp__gemm_post gp = {mul_post_tile, &mp};
    dp_gemm(1, 0, p->out, nc, R, 1.0f, dy, p->out, x, nc, 1.0f, ctx->grads + l->param_off + c0, p->in);
    if (dx)
        dp__gemm_post(0, 0, R, nc, p->out, 1.0f, dy, p->out, ctx->params + l->param_off + c0, p->in, 0.0f, dx, nc,
                      mul ? &gp : NULL);
}

/* The bias: y (R, OUT) += b; db += sum_r dy (a row-parallel layer's, after the all-reduce). */
void dp__linear_bias_forward(const struct dp_layer *l, const struct dp_ctx *ctx, float *y, int64_t R) {
    const struct linear *p = l->priv;
    if (!p->bias) return;
    const float *b = ctx->params + l->param_off + p->out * p->in;
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < p->out; j++)
            y[r * p->out + j] += b[j];
}

void dp__linear_bias_backward(const struct dp_layer *l, const struct dp_ctx *ctx, const float *dy, int64_t R) {
    const struct linear *p = l->priv;
    if (p->bias) colsum_add(ctx->grads + l->param_off + p->out * p->in, dy, R, p->out);
}

/* Marks l's weight (and bias) as tensor-parallel: column-parallel (DP_TP_ROWS: both cut by
 * output feature) or row-parallel (DP_TP_COLS: the weight by input feature, the bias replicated). */
void dp__linear_set_tp(struct dp_model *m, const struct dp_layer *l, int kind) {
    for (int i = 0; i < m->nparams; i++) {
        struct dp_param_info *p = &m->params[i];
        if (p->is_buffer || p->offset < l->param_off || p->offset >= l->param_off + l->param_count) continue;
        p->tp_split = p->shape.ndim == 2 ? kind : kind == DP_TP_ROWS ? DP_TP_ROWS : DP_TP_REPLICATED;
    }
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
