/* Embeddings and the tied language-model head, for token models (GPT).
 *
 * Token ids.  A token model's input is one sequence of T token ids per
 * sample.  They travel as int32 in ctx->batch->tokens (B, T), not as floats
 * in x: the first layer (the embedding) receives x == NULL from dp_model_run
 * and never computes an input gradient (there is none for a discrete id).
 * The model's per-sample input shape is (T), which fixes T.
 *
 * Layers in this file:
 *   - "embedding": one table W (N, D) read row by row, torch.nn.Embedding.  Its
 *     ids are the tokens (N = vocabulary V) or, for a learned position
 *     embedding, the positions 0..T-1 (N = context length >= T).
 *   - "tokpos_embedding": y[t] = tok.W[id_t] + pos.W[t], a composite of two
 *     embedding children (as the residual block has conv/BN children), so
 *     the parameters are named "tok.weight" and "pos.weight" as in the
 *     PyTorch module, and form one contiguous range: tok then pos.
 *   - "tied_lm_head": logits = x W^T with W an existing (V, D) parameter (the
 *     token embedding), no bias, no parameters of its own.
 *
 * Tied gradient and the reducer.  dp_model_run reports a layer's range to
 * grad_ready when that layer's backward ends, in reverse layer order, and the
 * data-parallel reducer starts a bucket's all-reduce once its lowest offset
 * has been reported.  The head runs its backward FIRST (it is the last layer)
 * and adds its contribution dW += dlogits^T x into the gradient of tok.weight;
 * since the head owns no parameter range (param_count 0), nothing is reported
 * for it.  The embedding layer, first in the model, runs its backward LAST,
 * adds its scatter contribution, and only then is its range (tok.weight,
 * pos.weight) reported: both contributions are in before the bucket holding
 * tok.weight can start.  This is why the head must come after the layer that
 * owns the weight (dp_tied_lm_head checks that the weight already exists,
 * which in a sequence means an earlier layer).
 *
 * The head records the weight's range as its tied range (dp_layer.tied_off,
 * tied_count): ZeRO-3 gathers a layer's parameters just before it runs
 * (dp_pass.layer_begin), and the head's are another layer's.
 *
 * Tensor parallelism (ctx->tp, Megatron-LM's vocabulary-parallel embedding): the token table
 * and the tied head are split by row, rank r of the group holding the tokens [v0, v0 + Vl) of
 * dp_tp_slice.  The embedding gives a token's row on the rank that holds it and zero on the
 * others, the group sums them (one all-reduce: one term is not zero, so the sum is that row's
 * bits), and the positions are added after; the head computes the rank's logits (R, Vl), which
 * the loss reads split (dp_softmax_xent_split), and its input's gradient is the group's sum.
 *
 * Letters: B batch, T positions, N table rows, D width, V vocabulary,
 * R = B * T rows. */
#include <stdio.h>
#include <string.h>

#include "nn/layers_impl.h"

/* ---- embedding ------------------------------------------------------------------ */

struct embedding {
    int64_t N, D;  /* table (N, D) */
    int positions; /* 1: ids are positions 0..T-1; 0: ids are ctx->batch->tokens */
};

/* The rows [*a, *b) this rank holds: all of them, or under a tensor group a token table's slice. */
static void emb_rows(const struct embedding *p, const struct dp_ctx *ctx, int64_t *a, int64_t *b) {
    int64_t n = p->N;
    *a = 0;
    if (ctx->tp && !p->positions) dp_tp_slice(p->N, ctx->tp->size, ctx->tp->rank, a, &n);
    *b = *a + n;
}

/* The id at (b, t), or a negative DP_E* code when it is outside [0, N). */
static int64_t emb_id(const struct dp_layer *l, const struct dp_ctx *ctx, int64_t b, int64_t t,
                      int64_t T) {
    const struct embedding *p = l->priv;
    if (p->positions) return t; /* T <= N checked at construction */
    int64_t id = ctx->batch->tokens[b * T + t];
    if (id < 0 || id >= p->N)
        return dp_seterr(DP_EINVAL, "embedding %s: token %lld at (%lld, %lld) outside [0, %lld)",
                         l->name, (long long)id, (long long)b, (long long)t, (long long)p->N);
    return id;
}

/* Forward:  y[b, t, :] = W[id(b, t), :]                      y (B, T, D), W (N, D)
 * Backward: dW[id(b, t), :] += dy[b, t, :]   (a scatter-add: one row can be hit
 *           many times, so it runs serially, in (b, t) order: deterministic)
 *           No input gradient (ids are discrete): dx, if asked for, is zero. */
static int emb_forward(struct dp_layer *l, struct dp_ctx *ctx, float *y, const float *x,
                       int64_t B) {
    (void)x;
    const struct embedding *p = l->priv;
    const int64_t T = l->in_shape.d[0], D = p->D;
    if (!p->positions && B > 0 && (!ctx->batch || !ctx->batch->tokens))
        return dp_seterr(DP_EINVAL, "embedding %s: the batch has no token ids", l->name);
    const float *w = ctx->params + l->param_off;
    int64_t ra, rb;
    emb_rows(p, ctx, &ra, &rb);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            int64_t id = emb_id(l, ctx, b, t, T);
            if (id < 0) return (int)id;
            if (id >= ra && id < rb) memcpy(y + (b * T + t) * D, w + id * D, sizeof(float) * (size_t)D);
            else memset(y + (b * T + t) * D, 0, sizeof(float) * (size_t)D);
        }
    /* (a split table: each row from the rank that holds it, the others' zeros added) */
    return rb - ra < p->N ? ctx->tp->allreduce(ctx->tp->arg, y, B * T * D) : DP_OK;
}

static int emb_backward(struct dp_layer *l, struct dp_ctx *ctx, float *dx, const float *dy,
                        const float *x, const float *y, int64_t B) {
    (void)x, (void)y;
    const struct embedding *p = l->priv;
    const int64_t T = l->in_shape.d[0], D = p->D;
    if (dx) memset(dx, 0, sizeof(float) * (size_t)(B * T));
    if (!p->positions && B > 0 && (!ctx->batch || !ctx->batch->tokens))
        return dp_seterr(DP_EINVAL, "embedding %s: the batch has no token ids", l->name);
    float *dw = ctx->grads + l->param_off;
    int64_t ra, rb;
    emb_rows(p, ctx, &ra, &rb);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            int64_t id = emb_id(l, ctx, b, t, T);
            if (id < 0) return (int)id;
            if (id < ra || id >= rb) continue; /* (another tensor rank's row) */
            float *dr = dw + id * D;
            const float *g = dy + (b * T + t) * D;
#pragma omp simd
            for (int64_t j = 0; j < D; j++)
                dr[j] += g[j];
        }
    return DP_OK;
}

static void emb_free(struct dp_layer *l) { dp_free(l->priv); }

static const struct dp_layer_ops emb_ops = {"embedding", emb_forward, emb_backward, emb_free};

/* An embedding of N rows of width D for inputs (T); weight N(0, std^2). */
static int emb_make(struct dp_model *m, struct dp_layer **out, const char *name,
                    const struct dp_shape *in, int64_t N, int64_t D, int positions, float std) {
    *out = NULL;
    struct dp__model_mark mk = dp__model_mark(m);
    if (in->ndim != 1)
        return dp_seterr(DP_EINVAL, "embedding %s: input has %d dims, expected (T) token ids", name,
                         in->ndim);
    if (N <= 0 || D <= 0)
        return dp_seterr(DP_EINVAL, "embedding %s: %lld rows of width %lld", name, (long long)N,
                         (long long)D);
    if (positions && in->d[0] > N)
        return dp_seterr(DP_EINVAL, "embedding %s: %lld positions, the table has %lld", name,
                         (long long)in->d[0], (long long)N);
    struct dp_layer *l;
    int rc = dp_layer_make(m, &l, &emb_ops, name, in);
    if (rc) return rc;
    struct embedding *p = dp_calloc(1, sizeof *p);
    if (!p)
        return dp__layer_fail(m, l, &mk, dp_seterr(DP_ENOMEM, "embedding %s: out of memory", name));
    l->priv = p;
    p->N = N, p->D = D, p->positions = positions;
    l->out_shape = dp__shape2(in->d[0], D);
    if ((rc = dp__add_param(m, l, "weight", dp__shape2(N, D), DP_INIT_NORMAL, std, 0)))
        return dp__layer_fail(m, l, &mk, rc);
    if (!positions) m->params[m->nparams - 1].tp_split = DP_TP_ROWS; /* (a token table: by token, under a tensor group) */
    l->flops_fwd = 0; /* a copy */
    *out = l;
    return DP_OK;
}

/* ---- token + position embedding ---------------------------------------------------- */

struct tokpos {
    struct dp_layer *tok, *pos;
};

/* Forward:  y[b, t] = tok.W[id(b, t)] + pos.W[t]
 * Backward: tok.dW[id(b, t)] += dy[b, t],  pos.dW[t] += sum_b dy[b, t]
 *           (each child's backward with the same dy); no input gradient. */
static int tokpos_forward(struct dp_layer *l, struct dp_ctx *ctx, float *y, const float *x,
                          int64_t B) {
    const struct tokpos *p = l->priv;
    const int64_t n = B * dp_shape_numel(&l->out_shape);
    float *e = dp__arena_floats(ctx, n);
    if (!e) return DP_ENOMEM;
    int rc;
    if ((rc = p->tok->ops->forward(p->tok, ctx, y, x, B)) ||
        (rc = p->pos->ops->forward(p->pos, ctx, e, x, B)))
        return rc;
#pragma omp parallel for simd schedule(static) if (parallel : n >= DP__OMP_MIN)
    for (int64_t i = 0; i < n; i++)
        y[i] += e[i];
    return DP_OK;
}

static int tokpos_backward(struct dp_layer *l, struct dp_ctx *ctx, float *dx, const float *dy,
                           const float *x, const float *y, int64_t B) {
    const struct tokpos *p = l->priv;
    int rc;
    if ((rc = p->pos->ops->backward(p->pos, ctx, NULL, dy, x, NULL, B)) ||
        (rc = p->tok->ops->backward(p->tok, ctx, NULL, dy, x, NULL, B)))
        return rc;
    (void)y;
    if (dx) memset(dx, 0, sizeof(float) * (size_t)(B * dp_shape_numel(&l->in_shape)));
    return DP_OK;
}

static void tokpos_free(struct dp_layer *l) {
    struct tokpos *p = l->priv;
    if (!p) return;
    dp_layer_free(p->tok);
    dp_layer_free(p->pos);
    dp_free(p);
}

static const struct dp_layer_ops tokpos_ops = {"tokpos_embedding", tokpos_forward, tokpos_backward,
                                               tokpos_free};

int dp__tokpos_embedding_make(struct dp_model *m, struct dp_layer **out, const char *tok_name,
                              const char *pos_name, const struct dp_shape *in, int64_t vocab,
                              int64_t ctx_len, int64_t dim, float std) {
    *out = NULL;
    struct dp__model_mark mk = dp__model_mark(m);
    char name[64];
    int n = snprintf(name, sizeof name, "%s+%s", tok_name, pos_name);
    if (n < 0 || n >= (int)sizeof name)
        return dp_seterr(DP_EINVAL, "embedding %s: name too long", tok_name);
    struct dp_layer *l;
    int rc = dp_layer_make(m, &l, &tokpos_ops, name, in);
    if (rc) return rc;
    struct tokpos *p = dp_calloc(1, sizeof *p);
    if (!p)
        return dp__layer_fail(m, l, &mk, dp_seterr(DP_ENOMEM, "embedding %s: out of memory", name));
    l->priv = p;
    /* children in the PyTorch module's order: tok, then pos */
    if ((rc = emb_make(m, &p->tok, tok_name, in, vocab, dim, 0, std)) ||
        (rc = emb_make(m, &p->pos, pos_name, in, ctx_len, dim, 1, std)))
        return dp__layer_fail(m, l, &mk, rc);
    l->out_shape = p->tok->out_shape;
    l->param_count = m->num_params - l->param_off;
    l->flops_fwd = dp_shape_numel(&l->out_shape);
    *out = l;
    return DP_OK;
}

int dp_tokpos_embedding(struct dp_model *m, const char *tok_name, const char *pos_name,
                        int64_t vocab, int64_t ctx_len, int64_t dim) {
    struct dp_shape in = dp_model_cur_shape(m);
    struct dp__model_mark mk = dp__model_mark(m);
    struct dp_layer *l;
    int rc = dp__tokpos_embedding_make(m, &l, tok_name, pos_name, &in, vocab, ctx_len, dim, 0.02f);
    return dp__layer_record(m, l, rc, &mk, "embedding %s pos=%s vocab=%lld dim=%lld ctx=%lld", tok_name, pos_name,
                            (long long)vocab, (long long)dim, (long long)ctx_len);
}

/* ---- tied LM head -------------------------------------------------------------------- */

struct tied_head {
    int64_t V, D;
    int64_t w_off; /* offset of the tied (V, D) weight in the parameter slab */
};

/* Forward:  logits = x W^T                    logits (R, V), x (R, D), W (V, D)
 * Backward: dx = dlogits W                    (overwrite; skipped when dx is NULL)
 *           dW += dlogits^T x                 into the tied weight's gradient,
 *           which the embedding reports later (see the top of the file). */
static int head_forward(struct dp_layer *l, struct dp_ctx *ctx, float *y, const float *x,
                        int64_t B) {
    const struct tied_head *p = l->priv;
    const int64_t R = B * (dp_shape_numel(&l->in_shape) / p->D);
    int64_t v0 = 0, V = p->V; /* (under a tensor group: its vocabulary slice, logits (R, Vl)) */
    if (ctx->tp) dp_tp_slice(p->V, ctx->tp->size, ctx->tp->rank, &v0, &V);
    const float *w = ctx->params + p->w_off + v0 * p->D;
    dp_gemm(0, 1, R, V, p->D, 1.0f, x, p->D, w, p->D, 0.0f, y, V);
    return DP_OK;
}

static int head_backward(struct dp_layer *l, struct dp_ctx *ctx, float *dx, const float *dy,
                         const float *x, const float *y, int64_t B) {
    (void)y;
    const struct tied_head *p = l->priv;
    const int64_t R = B * (dp_shape_numel(&l->in_shape) / p->D);
    int64_t v0 = 0, V = p->V;
    if (ctx->tp) dp_tp_slice(p->V, ctx->tp->size, ctx->tp->rank, &v0, &V);
    const float *w = ctx->params + p->w_off + v0 * p->D;
    float *dw = ctx->grads + p->w_off + v0 * p->D;
    dp_gemm(1, 0, V, p->D, R, 1.0f, dy, V, x, p->D, 1.0f, dw, p->D);
    if (dx) dp_gemm(0, 0, R, p->D, V, 1.0f, dy, V, w, p->D, 0.0f, dx, p->D);
    return dx && ctx->tp ? ctx->tp->allreduce(ctx->tp->arg, dx, R * p->D) : DP_OK;
}

static void head_free(struct dp_layer *l) { dp_free(l->priv); }

static const struct dp_layer_ops head_ops = {"tied_lm_head", head_forward, head_backward,
                                             head_free};

int dp__tied_lm_head_make(struct dp_model *m, struct dp_layer **out, const char *name,
                          const struct dp_shape *in, const char *weight) {
    *out = NULL;
    struct dp__model_mark mk = dp__model_mark(m);
    if (in->ndim < 1 || in->ndim > 2)
        return dp_seterr(DP_EINVAL, "lm head %s: input has %d dims; it takes (D) or (T, D)", name,
                         in->ndim);
    const struct dp_param_info *w = dp_model_find_param(m, weight);
    const int64_t D = in->d[in->ndim - 1];
    if (!w || w->is_buffer)
        return dp_seterr(DP_EINVAL, "lm head %s: no parameter '%s' to tie to (it must belong to "
                         "an earlier layer)", name, weight);
    if (w->shape.ndim != 2 || w->shape.d[1] != D)
        return dp_seterr(DP_EINVAL, "lm head %s: '%s' is not a (V, %lld) matrix", name, weight,
                         (long long)D);
    struct dp_layer *l;
    int rc = dp_layer_make(m, &l, &head_ops, name, in);
    if (rc) return rc;
    struct tied_head *p = dp_calloc(1, sizeof *p);
    if (!p)
        return dp__layer_fail(m, l, &mk, dp_seterr(DP_ENOMEM, "lm head %s: out of memory", name));
    l->priv = p;
    p->V = w->shape.d[0], p->D = D, p->w_off = w->offset;
    l->tied_off = w->offset, l->tied_count = w->count; /* for ZeRO-3's gather (dp_pass.layer_begin) */
    l->tp_out_split = w->tp_split == DP_TP_ROWS; /* (its vocabulary slice, as the table's) */
    l->out_shape.d[in->ndim - 1] = p->V;
    l->flops_fwd = 2 * (dp_shape_numel(in) / D) * D * p->V;
    *out = l;
    return DP_OK;
}

int dp_tied_lm_head(struct dp_model *m, const char *name, const char *weight) {
    struct dp_shape in = dp_model_cur_shape(m);
    struct dp__model_mark mk = dp__model_mark(m);
    struct dp_layer *l;
    int rc = dp__tied_lm_head_make(m, &l, name, &in, weight);
    return dp__layer_record(m, l, rc, &mk, "lm_head %s tied=%s", name, weight);
}
