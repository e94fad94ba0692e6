/* Pre-LayerNorm transformer block, as GPT-2 (without dropout), over (T, D):
 *
 *     x ─┬─ ln1 ─ attention (qkv, proj) ─┐
 *        └──────────────────────────────  + ─ r ─┬─ ln2 ─ fc (D→4D) ─ GELU (erf) ─ fc_out (4D→D) ─┐
 *                                                └─────────────────────────────────────────────── + ─ y
 *
 * Children (named "<block>.ln1", "<block>.qkv", "<block>.proj", "<block>.ln2",
 * "<block>.fc", "<block>.fc_out", registered in that order, which is the
 * PyTorch reference module's): LayerNorms eps 1e-5 with weight 1, bias 0;
 * Linear weights N(0, 0.02^2), biases 0.  The block's parameter range is the
 * union of its children's and is reported as one range, as the residual
 * block's, unless --zero-unit-mb cuts it into its children's (dp_layer.parts).
 *
 * Letters: B batch, T positions, D width, n = B T D. */
#include <stdio.h>
#include <string.h>

#include "nn/layers_impl.h"

struct block {
    struct dp_layer *ln1, *attn, *ln2, *fc, *act, *fc_out;
};

/* Intermediates kept by forward for backward. */
struct block_saved {
    float *h1; /* ln1(x)        (n) */
    float *a;  /* attn(h1)      (n) */
    float *r;  /* x + a         (n) */
    float *h2; /* ln2(r)        (n) */
    float *f;  /* fc(h2), then gelu'(fc(h2)) in its place (4n) */
    float *g;  /* gelu(f)       (4n) */
};

/* Forward:  h1 = ln1(x), r = x + attn(h1), y = r + fc_out(gelu(fc(ln2(r))))
 * Backward: dg = fc_out^T(dy), df = gelu'(f) dg (gelu'(f) kept by forward), dh2 = fc^T(df)
 *           dr = ln2^T(dh2) + dy                         (residual: dy flows straight to r)
 *           dh1 = attn^T(dr),  dx = ln1^T(dh1) + dr      (residual: dr flows straight to x)
 * Each child's backward overwrites its dx, so the residual terms are added
 * here; parameter gradients accumulate in the children.
 *
 * Tensor parallelism (ctx->tp, Megatron-LM's MLP): rank r of the group holds the hidden
 * features [r F, (r+1) F), F = 4D / size: fc column-parallel, fc_out row-parallel, so
 *     fc_out(gelu(fc(h2))) = sum over ranks of gelu(h2 Wfc[r]^T + bfc[r]) Wout[:, r]^T + bout
 * is one all-reduce in forward, and dh2 = sum over ranks of df_r Wfc[r] one in backward; the
 * attention child does the same by heads.  The norms and residuals run whole on every rank. */
static int block_forward(struct dp_layer *l, struct dp_ctx *ctx, float *y, const float *x,
                         int64_t B) {
    const struct block *p = l->priv;
    const struct dp_tp *tp = ctx->tp;
    const int64_t n = B * dp_shape_numel(&l->in_shape), R = B * l->in_shape.d[0], D = l->in_shape.d[1];
    const int64_t F = tp ? 4 * D / tp->size : 4 * D, nf = R * F;
    struct block_saved *sv = dp_arena_alloc(ctx->arena, sizeof *sv);
    if (!sv) return DP_ENOMEM;
    sv->h1 = dp__arena_floats(ctx, n);
    sv->a = dp__arena_floats(ctx, n);
    sv->r = dp__arena_floats(ctx, n);
    sv->h2 = dp__arena_floats(ctx, n);
    sv->f = dp__arena_floats(ctx, nf);
    sv->g = dp__arena_floats(ctx, nf);
    if (!sv->h1 || !sv->a || !sv->r || !sv->h2 || !sv->f || !sv->g) return DP_ENOMEM;
    int rc;
    if ((rc = dp__kid_forward(ctx, l, p->ln1, sv->h1, x, B)) || (rc = dp__kid_forward(ctx, l, p->attn, sv->a, sv->h1, B)))
        return rc;
    float *r = sv->r;
    const float *a = sv->a;
#pragma omp parallel for simd schedule(static) if (parallel : n >= DP__OMP_MIN)
    for (int64_t i = 0; i < n; i++)
        r[i] = x[i] + a[i];
    if ((rc = dp__kid_forward(ctx, l, p->ln2, sv->h2, sv->r, B))) return rc;
    /* fc with the act child's GELU in its GEMM's tiles, keeping the derivative in f's place:
     * backward needs no Phi again */
    if (!tp && ((rc = dp__kid_begin(ctx, l, p->fc, DP_PHASE_FORWARD)) ||
                (rc = dp__linear_forward_gelu(p->fc, ctx, sv->f, sv->g, sv->h2, B))))
        return rc;
    if (tp) dp__linear_rows_forward(p->fc, ctx, sv->f, sv->g, F, sv->h2, R, tp->rank * F, F);
    if (!tp) rc = dp__kid_forward(ctx, l, p->fc_out, y, sv->g, B);
    else {
        dp__linear_cols_forward(p->fc_out, ctx, y, sv->g, R, tp->rank * F, F);
        if (!(rc = tp->allreduce(tp->arg, y, n))) dp__linear_bias_forward(p->fc_out, ctx, y, R);
    }
    if (rc) return rc;
#pragma omp parallel for simd schedule(static) if (parallel : n >= DP__OMP_MIN)
    for (int64_t i = 0; i < n; i++)
        y[i] += r[i];
    ctx->saved[l->id] = sv;
    return DP_OK;
}

static int block_backward(struct dp_layer *l, struct dp_ctx *ctx, float *dx, const float *dy,
                          const float *x, const float *y, int64_t B) {
    (void)y;
    const struct block *p = l->priv;
    const struct block_saved *sv = ctx->saved[l->id];
    if (!sv) return dp_seterr(DP_EINTERNAL, "block %s: backward without forward", l->name);
    const struct dp_tp *tp = ctx->tp;
    const int64_t n = B * dp_shape_numel(&l->in_shape), R = B * l->in_shape.d[0], D = l->in_shape.d[1];
    const int64_t F = tp ? 4 * D / tp->size : 4 * D, nf = R * F;
    float *df = dp__arena_floats(ctx, nf);
    float *gn = dp__arena_floats(ctx, n), *dr = dp__arena_floats(ctx, n);
    if (!df || !gn || !dr) return DP_ENOMEM;
    int rc = DP_OK;
    /* fc_out's dx times the kept GELU' in its GEMM's tiles: df = gelu'(f) dg */
    if (!tp) {
        if ((rc = dp__kid_begin(ctx, l, p->fc_out, DP_PHASE_BACKWARD)) ||
            (rc = dp__linear_backward_mul(p->fc_out, ctx, df, sv->f, dy, sv->g, B)))
            return rc;
        dp__kid_backward_done(ctx, l, p->fc_out);
    } else {
        dp__linear_cols_backward(p->fc_out, ctx, df, sv->f, dy, sv->g, R, tp->rank * F, F);
        dp__linear_bias_backward(p->fc_out, ctx, dy, R);
    }
    if (!tp) rc = dp__kid_backward(ctx, l, p->fc, gn, df, sv->h2, NULL, B);
    else {
        dp__linear_rows_backward(p->fc, ctx, gn, 0, df, F, sv->h2, R, tp->rank * F, F);
        rc = tp->allreduce(tp->arg, gn, n);
    }
    if (rc || (rc = dp__kid_backward(ctx, l, p->ln2, dr, gn, sv->r, NULL, B))) return rc;
#pragma omp parallel for simd schedule(static) if (parallel : n >= DP__OMP_MIN)
    for (int64_t i = 0; i < n; i++)
        dr[i] += dy[i];
    if ((rc = dp__kid_backward(ctx, l, p->attn, gn, dr, sv->h1, sv->a, B)) ||
        (rc = dp__kid_backward(ctx, l, p->ln1, dx, gn, x, NULL, B)))
        return rc;
    if (dx) {
#pragma omp parallel for simd schedule(static) if (parallel : n >= DP__OMP_MIN)
        for (int64_t i = 0; i < n; i++)
            dx[i] += dr[i];
    }
    return DP_OK;
}

static void block_free(struct dp_layer *l) {
    struct block *p = l->priv;
    if (!p) return;
    dp_layer_free(p->ln1);
    dp_layer_free(p->attn);
    dp_layer_free(p->ln2);
    dp_layer_free(p->fc);
    dp_layer_free(p->act);
    dp_layer_free(p->fc_out);
    dp_free(p);
}

static const struct dp_layer_ops block_ops = {"transformer_block", block_forward, block_backward,
                                              block_free};

/* "<block>.<child>" into buf (64 bytes, the size of dp_layer.name). */
static int child_name(char *buf, const char *block, const char *child) {
    int n = snprintf(buf, 64, "%s.%s", block, child);
    if (n < 0 || n >= 64)
        return dp_seterr(DP_EINVAL, "block %s: name too long for child %s", block, child);
    return DP_OK;
}

int dp__transformer_block_make(struct dp_model *m, struct dp_layer **out, const char *name,
                               const struct dp_shape *in, int heads) {
    *out = NULL;
    struct dp__model_mark mk = dp__model_mark(m);
    if (in->ndim != 2)
        return dp_seterr(DP_EINVAL, "block %s: input has %d dims, expected (T, D)", name,
                         in->ndim);
    const int64_t D = in->d[1];
    struct dp_layer *l;
    int rc = dp_layer_make(m, &l, &block_ops, name, in);
    if (rc) return rc;
    struct block *p = dp_calloc(1, sizeof *p);
    if (!p)
        return dp__layer_fail(m, l, &mk, dp_seterr(DP_ENOMEM, "block %s: out of memory", name));
    l->priv = p;
    char nm[64];
    const float eps = 1e-5f;
    if ((rc = child_name(nm, name, "ln1")) ||
        (rc = dp__layernorm_make(m, &p->ln1, nm, in, eps)) ||
        (rc = child_name(nm, name, "attn")) ||
        (rc = dp__attention_make(m, &p->attn, nm, name, in, heads)) ||
        (rc = child_name(nm, name, "ln2")) ||
        (rc = dp__layernorm_make(m, &p->ln2, nm, in, eps)) ||
        (rc = child_name(nm, name, "fc")) ||
        (rc = dp__linear_make(m, &p->fc, nm, in, 4 * D, 1)) ||
        (rc = child_name(nm, name, "gelu")) ||
        (rc = dp__gelu_erf_make(m, &p->act, nm, &p->fc->out_shape)) ||
        (rc = child_name(nm, name, "fc_out")) ||
        (rc = dp__linear_make(m, &p->fc_out, nm, &p->act->out_shape, D, 1)))
        return dp__layer_fail(m, l, &mk, rc);
    dp__linear_init_gpt(m, p->fc);
    dp__linear_init_gpt(m, p->fc_out);
    dp__linear_set_tp(m, p->fc, DP_TP_ROWS);
    dp__linear_set_tp(m, p->fc_out, DP_TP_COLS);
    l->param_count = m->num_params - l->param_off;
    /* the children in their parameters' order (backward runs them in the reverse: --zero-unit-mb's parts) */
    l->kids[0] = p->ln1, l->kids[1] = p->attn, l->kids[2] = p->ln2, l->kids[3] = p->fc, l->kids[4] = p->act;
    l->kids[5] = p->fc_out, l->nkids = 6;
    const int64_t n = dp_shape_numel(in);
    l->flops_fwd = p->ln1->flops_fwd + p->attn->flops_fwd + p->ln2->flops_fwd + p->fc->flops_fwd +
                   p->act->flops_fwd + p->fc_out->flops_fwd + 2 * n;
    *out = l;
    return DP_OK;
}

int dp_transformer_block(struct dp_model *m, const char *name, int heads) {
    struct dp_shape in = dp_model_cur_shape(m);
    struct dp__model_mark mk = dp__model_mark(m);
    struct dp_layer *l;
    int rc = dp__transformer_block_make(m, &l, name, &in, heads);
    return dp__layer_record(m, l, rc, &mk, "transformer_block %s heads=%d", name, heads);
}

int dp_model_tp_check(const struct dp_model *m, int size) {
    int split = 0;
    for (int i = 0; i < m->nlayers; i++) {
        const struct dp_layer *l = m->layers[i];
        const int block = !strcmp(l->ops->type, "transformer_block");
        if (!block && strcmp(l->ops->type, "attention")) continue;
        const int heads = dp__attention_heads(block ? ((const struct block *)l->priv)->attn : l);
        if (heads % size)
            return dp_seterr(DP_EINVAL, "--tp %d: layer %s has %d heads, not a multiple of %d (attention splits by "
                             "head)", size, l->name, heads, size);
        split++;
    }
    for (int i = 0; split && i < m->nparams; i++)
        if (m->params[i].tp_split == DP_TP_ROWS && m->params[i].shape.d[0] < size)
            return dp_seterr(DP_EINVAL, "--tp %d: %s has %lld rows, fewer than the tensor ranks", size, m->params[i].name,
                             (long long)m->params[i].shape.d[0]);
    if (!split)
        return dp_seterr(DP_ENOTSUP, "--tp %d: model '%s' has no layer that splits (tensor parallelism splits the "
                         "transformer's attention and MLP: a gpt)", size, m->spec);
    return DP_OK;
}

void dp_model_tp_traffic(const struct dp_model *m, int size, double *calls, double *floats) {
    for (int i = 0; i < m->nlayers; i++) {
        const struct dp_layer *l = m->layers[i];
        const char *k = l->ops->type;
        const double in = (double)dp_shape_numel(&l->in_shape), out = (double)dp_shape_numel(&l->out_shape);
        const double pos = l->in_shape.ndim > 1 ? (double)l->in_shape.d[0] : 1.0;
        calls[i] = floats[i] = 0;
        if (!strcmp(k, "transformer_block")) calls[i] = 4, floats[i] = in;
        else if (!strcmp(k, "attention")) calls[i] = 2, floats[i] = in;
        else if (!strcmp(k, "tokpos_embedding") || !strcmp(k, "embedding")) {
            for (int j = 0; j < m->nparams; j++) /* (a token table splits; a position table does not) */
                if (m->params[j].tp_split == DP_TP_ROWS && m->params[j].offset >= l->param_off &&
                    m->params[j].offset < l->param_off + l->param_count)
                    calls[i] = 1, floats[i] = out;
        } else if (l->tp_out_split) calls[i] = 3, floats[i] = (in + pos * (size + 3)) / 3;
    }
}
