/* Causal multi-head self-attention, as in GPT-2, over a sequence x (T, D):
 *
 *     qkv = x Wqkv^T + bqkv                 (T, 3D)   child "<prefix>.qkv", Linear D -> 3D
 *     per head h (width dh = D / H):  Q, K, V = columns [h dh, (h+1) dh) of the
 *     three D-wide thirds of qkv (PyTorch's q, k, v = qkv.split(D, -1), then
 *     .view(T, H, dh)), and
 *         S = Q K^T / sqrt(dh)              (T, T)
 *         P_ij = exp(S_ij) / sum_{k <= i} exp(S_ik)  for j <= i,  P_ij = 0 for j > i
 *         O = P V                           (T, dh)   written to columns [h dh, (h+1) dh) of att
 *     y = att Wproj^T + bproj               (T, D)    child "<prefix>.proj", Linear D -> D
 *
 * Backward, per head, from dO (the columns of datt = proj^T(dy)):
 *     dV = P^T dO,   dP = dO V^T
 *     softmax: P_i = softmax(S_i) row by row, dP_ij/dS_ik = P_ij ([j == k] - P_ik), so
 *         dS_ik = sum_j dP_ij P_ij ([j == k] - P_ik) = P_ik (dP_ik - sum_j P_ij dP_ij)
 *     (masked entries have P = 0, so dS = 0 there: the mask needs no extra care),
 *     dQ = dS K / sqrt(dh),   dK = dS^T Q / sqrt(dh),
 * and dx = qkv^T(dqkv), with the parameter gradients accumulated by the children.
 *
 * Memory: forward keeps qkv (T, 3D), att (T, D) and the probabilities P
 * (H, T, T) of every sample for backward: O(T^2) per head, B H T^2 floats in
 * all (plus a (T, T) scratch per head in backward).  At T = 64 that is small
 * next to the activations; a fused (flash-style) kernel would avoid it.
 *
 * The products are dp_gemm calls: one for each projection over all B T rows,
 * and small ones per (sample, head) for Q K^T, P V and their gradients, in
 * causal row blocks (CAUSAL_BLOCK) that skip the masked upper triangle block
 * by block.
 *
 * Letters: B batch, T positions, D width, H heads, dh = D / H. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "nn/layers_impl.h"

struct attention {
    struct dp_layer *qkv, *proj;
    int64_t T, D, H, dh;
};

struct attention_saved {
    float *qkv; /* (B, T, 3D) */
    float *P;   /* (B, H, T, T) softmax probabilities, zero above the diagonal */
    float *att; /* (B, T, D) heads' outputs, concatenated */
};

/* Rows of the causal products are done in blocks of this many positions,
 * so that the (almost) all-zero upper triangle is skipped block by block: at
 * T = 64 that is 3/4 of the full products' work, at T = 256 5/8. */
#define CAUSAL_BLOCK 32

/* The row work runs in LANES lanes, each a fixed set of columns (j mod LANES), whole vectors
 * over the row's first n columns rounded up to LANES (masked past n, never past T when T is a
 * multiple of LANES; past T only in a last short block, also masked): no scalar remainder loop
 * and no serial chain through the row, which at n <= T = 64 were most of the softmax's time.
 * The lanes' partial sums meet in a fixed tree, so the result is deterministic. */
#define LANES 16

/* The sum of the LANES partial sums in s, pairwise (a fixed order). */
static inline float lanes_sum(float *s) {
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) s[l] += s[l + w];
    return s[0];
}

/* Row i of the causal softmax, in place: row[0..n) (n = i + 1) becomes
 * softmax(row[0..n)), row[n..T) becomes 0.  The max is exact in any order (a NaN anywhere
 * makes the whole row NaN through the sum). */
static void softmax_row(float *row, int64_t n, int64_t T) {
    float m[LANES], s[LANES];
    for (int l = 0; l < LANES; l++) m[l] = row[0], s[l] = 0.0f;
    for (int64_t j = 0; j < n; j += LANES)
#pragma omp simd
        for (int l = 0; l < LANES; l++) {
            const float v = j + l < n ? row[j + l] : row[0];
            m[l] = v > m[l] ? v : m[l];
        }
    float mx = m[0];
    for (int l = 1; l < LANES; l++) mx = m[l] > mx ? m[l] : mx;
    for (int64_t j = 0; j < n; j += LANES)
#pragma omp simd
        for (int l = 0; l < LANES; l++)
            if (j + l < n) {
                const float e = dp__expf(row[j + l] - mx);
                row[j + l] = e;
                s[l] += e;
            }
    const float inv = 1.0f / lanes_sum(s);
#pragma omp simd
    for (int64_t j = 0; j < T; j++)
        row[j] = j < n ? row[j] * inv : 0.0f;
}

/* Its backward, in place on dr = dP's row: dS_j = P_j (dP_j - sum_k P_k dP_k)
 * for j < n, 0 beyond. */
static void softmax_row_backward(float *dr, const float *pr, int64_t n, int64_t T) {
    float s[LANES] = {0};
    for (int64_t j = 0; j < n; j += LANES)
#pragma omp simd
        for (int l = 0; l < LANES; l++)
            if (j + l < n) s[l] += pr[j + l] * dr[j + l];
    const float dot = lanes_sum(s);
#pragma omp simd
    for (int64_t j = 0; j < T; j++)
        dr[j] = j < n ? pr[j] * (dr[j] - dot) : 0.0f;
}

/* The heads' products: Hn heads of width dh on qkv (B, T, 3 Ds), Ds = Hn dh, its q, k and v
 * each Ds wide; into P (B, Hn, T, T) and att (B, T, Ds).  (All the heads: Ds = D; under
 * tensor parallelism a rank's Hn = H / size heads.) */
static void heads_forward(const float *qkv, float *Pall, float *att, int64_t B, int64_t T, int64_t Hn, int64_t dh) {
    const int64_t Ds = Hn * dh, D3 = 3 * Ds;
    const float scale = 1.0f / sqrtf((float)dh);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hn; h++) {
            const float *q = qkv + b * T * D3 + h * dh; /* (T, dh), row stride 3 Ds */
            const float *k = q + Ds, *v = q + 2 * Ds;
            float *P = Pall + (b * Hn + h) * T * T; /* (T, T) */
            float *o = att + b * T * Ds + h * dh;
            /* causal blocks: rows [i0, i1) need columns [0, i1) only */
            for (int64_t i0 = 0; i0 < T; i0 += CAUSAL_BLOCK) {
                const int64_t i1 = i0 + CAUSAL_BLOCK < T ? i0 + CAUSAL_BLOCK : T;
                dp_gemm(0, 1, i1 - i0, i1, dh, scale, q + i0 * D3, D3, k, D3, 0.0f, P + i0 * T, T);
            }
            for (int64_t i = 0; i < T; i++)
                softmax_row(P + i * T, i + 1, T);
            for (int64_t i0 = 0; i0 < T; i0 += CAUSAL_BLOCK) {
                const int64_t i1 = i0 + CAUSAL_BLOCK < T ? i0 + CAUSAL_BLOCK : T;
                dp_gemm(0, 0, i1 - i0, dh, i1, 1.0f, P + i0 * T, T, v, D3, 0.0f, o + i0 * Ds, Ds);
            }
        }
}

/* Their backward: from datt (B, T, Ds), dqkv (B, T, 3 Ds); dS a (T, T) scratch. */
static void heads_backward(const float *qkv, const float *Pall, const float *datt, float *dqkv, float *dS, int64_t B,
                           int64_t T, int64_t Hn, int64_t dh) {
    const int64_t Ds = Hn * dh, D3 = 3 * Ds;
    const float scale = 1.0f / sqrtf((float)dh);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hn; h++) {
            const float *q = qkv + b * T * D3 + h * dh, *k = q + Ds, *v = q + 2 * Ds;
            float *dq = dqkv + b * T * D3 + h * dh, *dk = dq + Ds, *dv = dq + 2 * Ds;
            const float *P = Pall + (b * Hn + h) * T * T;
            const float *dO = datt + b * T * Ds + h * dh; /* (T, dh), row stride Ds */
            /* Blocks of CAUSAL_BLOCK: a product whose rows are query positions
             * i in [i0, i1) needs key columns [0, i1); one whose rows are key
             * positions j in [j0, j1) needs query rows [j0, T).  The skipped
             * entries of P and dS are the zeros above the diagonal. */
            for (int64_t i0 = 0; i0 < T; i0 += CAUSAL_BLOCK) {
                const int64_t i1 = i0 + CAUSAL_BLOCK < T ? i0 + CAUSAL_BLOCK : T;
                dp_gemm(1, 0, i1 - i0, dh, T - i0, 1.0f, P + i0 * T + i0, T, dO + i0 * Ds, Ds, 0.0f,
                        dv + i0 * D3, D3); /* dV = P^T dO */
                dp_gemm(0, 1, i1 - i0, i1, dh, 1.0f, dO + i0 * Ds, Ds, v, D3, 0.0f, dS + i0 * T,
                        T); /* dP = dO V^T */
            }
            for (int64_t i = 0; i < T; i++)
                softmax_row_backward(dS + i * T, P + i * T, i + 1, T);
            for (int64_t i0 = 0; i0 < T; i0 += CAUSAL_BLOCK) {
                const int64_t i1 = i0 + CAUSAL_BLOCK < T ? i0 + CAUSAL_BLOCK : T;
                dp_gemm(0, 0, i1 - i0, dh, i1, scale, dS + i0 * T, T, k, D3, 0.0f, dq + i0 * D3,
                        D3); /* dQ = dS K s */
                dp_gemm(1, 0, i1 - i0, dh, T - i0, scale, dS + i0 * T + i0, T, q + i0 * D3, D3,
                        0.0f, dk + i0 * D3, D3); /* dK = dS^T Q s */
            }
        }
}

/* Tensor parallelism (ctx->tp, Megatron-LM's): rank r of the group computes heads
 * [r Hn, (r+1) Hn), Hn = H / size: the qkv Linear is column-parallel (rows r Ds.. of each of
 * its q, k and v thirds), proj row-parallel (its columns r Ds..), so
 *     y = sum over ranks of att_r Wproj[:, r]^T  + bproj     one all-reduce in forward,
 *     dx = sum over ranks of dqkv_r Wqkv[r]                 one in backward. */
static int attn_forward(struct dp_layer *l, struct dp_ctx *ctx, float *y, const float *x,
                        int64_t B) {
    const struct attention *p = l->priv;
    const struct dp_tp *tp = ctx->tp;
    const int64_t T = p->T, D = p->D, dh = p->dh, Hn = tp ? p->H / tp->size : p->H, Ds = Hn * dh, R = B * T;
    struct attention_saved *sv = dp_arena_alloc(ctx->arena, sizeof *sv);
    if (!sv) return DP_ENOMEM;
    sv->qkv = dp__arena_floats(ctx, B * T * 3 * Ds);
    sv->P = dp__arena_floats(ctx, B * Hn * T * T);
    sv->att = dp__arena_floats(ctx, B * T * Ds);
    if (!sv->qkv || !sv->P || !sv->att) return DP_ENOMEM;
    int rc = DP_OK;
    if (!tp) rc = dp__kid_forward(ctx, l, p->qkv, sv->qkv, x, B);
    else
        for (int64_t g = 0; g < 3; g++) /* q, k, v: this rank's heads of each */
            dp__linear_rows_forward(p->qkv, ctx, sv->qkv + g * Ds, NULL, 3 * Ds, x, R, g * D + tp->rank * Ds, Ds);
    if (rc) return rc;
    heads_forward(sv->qkv, sv->P, sv->att, B, T, Hn, dh);
    if (!tp) rc = dp__kid_forward(ctx, l, p->proj, y, sv->att, B);
    else {
        dp__linear_cols_forward(p->proj, ctx, y, sv->att, R, tp->rank * Ds, Ds);
        if (!(rc = tp->allreduce(tp->arg, y, R * D))) dp__linear_bias_forward(p->proj, ctx, y, R);
    }
    if (rc) return rc;
    ctx->saved[l->id] = sv;
    return DP_OK;
}

static int attn_backward(struct dp_layer *l, struct dp_ctx *ctx, float *dx, const float *dy,
                         const float *x, const float *y, int64_t B) {
    (void)y;
    const struct attention *p = l->priv;
    const struct attention_saved *sv = ctx->saved[l->id];
    if (!sv) return dp_seterr(DP_EINTERNAL, "attention %s: backward without forward", l->name);
    const struct dp_tp *tp = ctx->tp;
    const int64_t T = p->T, D = p->D, dh = p->dh, Hn = tp ? p->H / tp->size : p->H, Ds = Hn * dh, R = B * T;
    float *datt = dp__arena_floats(ctx, B * T * Ds);
    float *dqkv = dp__arena_floats(ctx, B * T * 3 * Ds);
    float *dS = dp__arena_floats(ctx, T * T);
    if (!datt || !dqkv || !dS) return DP_ENOMEM;
    if (!tp) {
        int rc = dp__kid_backward(ctx, l, p->proj, datt, dy, sv->att, NULL, B);
        if (rc) return rc;
    } else {
        dp__linear_cols_backward(p->proj, ctx, datt, NULL, dy, sv->att, R, tp->rank * Ds, Ds);
        dp__linear_bias_backward(p->proj, ctx, dy, R);
    }
    heads_backward(sv->qkv, sv->P, datt, dqkv, dS, B, T, Hn, dh);
    if (!tp) return dp__kid_backward(ctx, l, p->qkv, dx, dqkv, x, NULL, B);
    for (int64_t g = 0; g < 3; g++)
        dp__linear_rows_backward(p->qkv, ctx, dx, g > 0, dqkv + g * Ds, 3 * Ds, x, R, g * D + tp->rank * Ds, Ds);
    return dx ? tp->allreduce(tp->arg, dx, R * D) : DP_OK;
}

static void attn_free(struct dp_layer *l) {
    struct attention *p = l->priv;
    if (!p) return;
    dp_layer_free(p->qkv);
    dp_layer_free(p->proj);
    dp_free(p);
}

static const struct dp_layer_ops attn_ops = {"attention", attn_forward, attn_backward, attn_free};

int dp__attention_make(struct dp_model *m, struct dp_layer **out, const char *name,
                       const char *prefix, const struct dp_shape *in, int heads) {
    *out = NULL;
    struct dp__model_mark mk = dp__model_mark(m);
    if (in->ndim != 2)
        return dp_seterr(DP_EINVAL, "attention %s: input has %d dims, expected (T, D)", name,
                         in->ndim);
    const int64_t T = in->d[0], D = in->d[1];
    if (heads <= 0 || D % heads != 0)
        return dp_seterr(DP_EINVAL, "attention %s: width %lld is not a multiple of %d heads", name,
                         (long long)D, heads);
    struct dp_layer *l;
    int rc = dp_layer_make(m, &l, &attn_ops, name, in);
    if (rc) return rc;
    struct attention *p = dp_calloc(1, sizeof *p);
    if (!p)
        return dp__layer_fail(m, l, &mk, dp_seterr(DP_ENOMEM, "attention %s: out of memory", name));
    l->priv = p;
    p->T = T, p->D = D, p->H = heads, p->dh = D / heads;
    char nm[64];
    if (strlen(prefix) + sizeof ".proj" > sizeof nm)
        return dp__layer_fail(m, l, &mk,
                              dp_seterr(DP_EINVAL, "attention %s: name too long", name));
    snprintf(nm, sizeof nm, "%s.qkv", prefix);
    if ((rc = dp__linear_make(m, &p->qkv, nm, in, 3 * D, 1))) return dp__layer_fail(m, l, &mk, rc);
    snprintf(nm, sizeof nm, "%s.proj", prefix);
    if ((rc = dp__linear_make(m, &p->proj, nm, in, D, 1))) return dp__layer_fail(m, l, &mk, rc);
    dp__linear_init_gpt(m, p->qkv);
    dp__linear_init_gpt(m, p->proj);
    dp__linear_set_tp(m, p->qkv, DP_TP_ROWS);  /* (each of qkv's q, k and v thirds cut by head) */
    dp__linear_set_tp(m, p->proj, DP_TP_COLS);
    l->param_count = m->num_params - l->param_off;
    l->kids[0] = p->qkv, l->kids[1] = p->proj, l->nkids = 2; /* (--zero-unit-mb's parts) */
    l->flops_fwd = p->qkv->flops_fwd + p->proj->flops_fwd + heads * (4 * T * T * p->dh + 5 * T * T);
    *out = l;
    return DP_OK;
}

int dp_attention(struct dp_model *m, const char *name, int heads) {
    struct dp_shape in = dp_model_cur_shape(m);
    struct dp__model_mark mk = dp__model_mark(m);
    struct dp_layer *l;
    int rc = dp__attention_make(m, &l, name, name, &in, heads);
    return dp__layer_record(m, l, rc, &mk, "attention %s heads=%d", name, heads);
}

int dp__attention_heads(const struct dp_layer *l) { return (int)((const struct attention *)l->priv)->H; }
