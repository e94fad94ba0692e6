/* Elementwise layers: ReLU, GELU (tanh approximation, as GPT-2 and
 * torch.nn.GELU(approximate="tanh")), exact GELU (erf, torch.nn.GELU()) and
 * Dropout.  All keep the input shape.
 *
 * Letters: B batch, n = numel of one sample. */
#include <math.h>
#include <string.h>

#include "nn/layers_impl.h"

/* Shared constructor for the parameterless elementwise layers. */
static int elementwise_make(struct dp_model *m, struct dp_layer **out,
                            const struct dp_layer_ops *ops, const char *name,
                            const struct dp_shape *in, int64_t flops_per_elem) {
    *out = NULL;
    struct dp_layer *l;
    int rc = dp_layer_make(m, &l, ops, name, in);
    if (rc) return rc;
    l->flops_fwd = flops_per_elem * dp_shape_numel(in);
    *out = l;
    return DP_OK;
}

/* ---- ReLU -------------------------------------------------------------------- */

/* Forward:  y = max(x, 0)   (a NaN stays NaN, as in PyTorch)      y, x (B, n)
 * Backward: dx = dy * [y > 0] */
void dp__relu(float *y, const float *x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : n >= DP__OMP_MIN)
    for (int64_t i = 0; i < n; i++)
        y[i] = dp__relu1(x[i]);
}

void dp__relu_mask(float *dx, const float *dy, const float *y, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : n >= DP__OMP_MIN)
    for (int64_t i = 0; i < n; i++)
        dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

static int relu_forward(struct dp_layer *l, struct dp_ctx *ctx, float *y, const float *x,
                        int64_t B) {
    dp__relu(y, x, B * dp_shape_numel(&l->in_shape));
    return DP_OK;
}

static int relu_backward(struct dp_layer *l, struct dp_ctx *ctx, float *dx, const float *dy,
                         const float *x, const float *y, int64_t B) {
    if (dx) dp__relu_mask(dx, dy, y, B * dp_shape_numel(&l->in_shape));
    return DP_OK;
}

static const struct dp_layer_ops relu_ops = {"relu", relu_forward, relu_backward, NULL};

int dp__relu_make(struct dp_model *m, struct dp_layer **out, const char *name,
                  const struct dp_shape *in) {
    return elementwise_make(m, out, &relu_ops, name, in, 1);
}

int dp_relu(struct dp_model *m, const char *name) {
    struct dp_shape in = dp_model_cur_shape(m);
    struct dp__model_mark mk = dp__model_mark(m);
    struct dp_layer *l;
    int rc = dp__relu_make(m, &l, name, &in);
    return dp__layer_record(m, l, rc, &mk, "relu %s", name);
}

/* ---- GELU (tanh approximation) ----------------------------------------------- */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

/* Forward:  y = 0.5 x (1 + t),  t = tanh(u),  u = sqrt(2/pi) (x + 0.044715 x^3)
 * Backward: dx = dy * (0.5 (1 + t) + 0.5 x (1 - t^2) du/dx),
 *           du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
 * (1 - t^2 = sech^2 u, which avoids cosh overflow for large |u|.)  tanh is
 * dp__tanhf (absolute error ~2e-7), which vectorises. */
static int gelu_forward(struct dp_layer *l, struct dp_ctx *ctx, float *y, const float *x,
                        int64_t B) {
    const int64_t n = B * dp_shape_numel(&l->in_shape);
#pragma omp parallel for simd schedule(static) if (parallel : n >= DP__OMP_MIN / 4)
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        float t = dp__tanhf(GELU_K * (v + GELU_C * v * v * v));
        y[i] = 0.5f * v * (1.0f + t);
    }
    return DP_OK;
}

static int gelu_backward(struct dp_layer *l, struct dp_ctx *ctx, float *dx, const float *dy,
                         const float *x, const float *y, int64_t B) {
    if (!dx) return DP_OK;
    const int64_t n = B * dp_shape_numel(&l->in_shape);
#pragma omp parallel for simd schedule(static) if (parallel : n >= DP__OMP_MIN / 4)
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        float t = dp__tanhf(GELU_K * (v + GELU_C * v * v * v));
        float du = GELU_K * (1.0f + 3.0f * GELU_C * v * v);
        dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
    }
    return DP_OK;
}

static const struct dp_layer_ops gelu_ops = {"gelu", gelu_forward, gelu_backward, NULL};

int dp__gelu_make(struct dp_model *m, struct dp_layer **out, const char *name,
                  const struct dp_shape *in) {
    return elementwise_make(m, out, &gelu_ops, name, in, 8);
}

int dp_gelu(struct dp_model *m, const char *name) {
    struct dp_shape in = dp_model_cur_shape(m);
    struct dp__model_mark mk = dp__model_mark(m);
    struct dp_layer *l;
    int rc = dp__gelu_make(m, &l, name, &in);
    return dp__layer_record(m, l, rc, &mk, "gelu %s", name);
}

/* ---- GELU (exact, erf) ------------------------------------------------------------ */

/* Forward:  y = x Phi(x),  Phi(x) = 0.5 (1 + erf(x / sqrt(2)))   (torch.nn.GELU())
 * Backward: dx = dy (Phi(x) + x phi(x)),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
 * Phi and exp(-x^2/2) come from dp__normcdf (vectorisable, one rational and
 * one exp; a few ulp): with libm's scalar erff and expf these two loops took a
 * quarter of a small transformer's training step.  Phi is computed directly,
 * not as 1 + erf, so the far negative tail does not cancel (there 1 + erff in
 * float loses every digit: GELU(-4.8) would be off by percents).  Both through
 * dp__gelu_erf1 (layers_impl.h), which the Linear's fused GELU uses too. */
static int gelu_erf_forward(struct dp_layer *l, struct dp_ctx *ctx, float *y, const float *x,
                            int64_t B) {
    const int64_t n = B * dp_shape_numel(&l->in_shape);
#pragma omp parallel for simd schedule(static) if (parallel : n >= DP__OMP_MIN / 4)
    for (int64_t i = 0; i < n; i++) {
        float d;
        y[i] = dp__gelu_erf1(x[i], &d);
    }
    return DP_OK;
}

static int gelu_erf_backward(struct dp_layer *l, struct dp_ctx *ctx, float *dx, const float *dy,
                             const float *x, const float *y, int64_t B) {
    if (!dx) return DP_OK;
    const int64_t n = B * dp_shape_numel(&l->in_shape);
#pragma omp parallel for simd schedule(static) if (parallel : n >= DP__OMP_MIN / 4)
    for (int64_t i = 0; i < n; i++) {
        float d;
        (void)dp__gelu_erf1(x[i], &d);
        dx[i] = dy[i] * d;
    }
    return DP_OK;
}

static const struct dp_layer_ops gelu_erf_ops = {"gelu_erf", gelu_erf_forward, gelu_erf_backward,
                                                 NULL};

int dp__gelu_erf_make(struct dp_model *m, struct dp_layer **out, const char *name,
                      const struct dp_shape *in) {
    return elementwise_make(m, out, &gelu_erf_ops, name, in, 12);
}

int dp_gelu_erf(struct dp_model *m, const char *name) {
    struct dp_shape in = dp_model_cur_shape(m);
    struct dp__model_mark mk = dp__model_mark(m);
    struct dp_layer *l;
    int rc = dp__gelu_erf_make(m, &l, name, &in);
    return dp__layer_record(m, l, rc, &mk, "gelu_erf %s", name);
}

/* ---- Dropout -------------------------------------------------------------------- */

struct dropout {
    float p;
};

/* The keep mask (B, n) of one batch: element e of the sample with global index
 * s is kept when U(seed, DP_RNG_DROPOUT, s, id << 32 | e) >= p.  It depends only
 * on (seed, sample, layer, element), not on the batch composition.
 *
 * U is dp_rng_uniform, bit for bit (a test compares them), computed here with
 * the key hoisted out of the loop and the ten Philox4x32 rounds written out,
 * so that the loop over elements vectorises: about 20x faster than a call
 * per element.  Only the first output word is used, as in dp_rng_uniform. */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static uint64_t mix64(uint64_t z) { /* splitmix64 finaliser, as in core/rng.c */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

#define PHILOX_ROUND(r)                                                                   \
    do {                                                                                  \
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;            \
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ (k0 + (r) * PHILOX_W0);                 \
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ (k1 + (r) * PHILOX_W1);                 \
        c1 = (uint32_t)p1;                                                                \
        c3 = (uint32_t)p0;                                                                \
        c0 = n0;                                                                          \
        c2 = n2;                                                                          \
    } while (0)

/* The first word of Philox4x32-10 for counter (c0, c1, c2, c3), key (k0, k1). */
static inline uint32_t philox_word(uint32_t k0, uint32_t k1, uint32_t c0, uint32_t c1,
                                   uint32_t c2, uint32_t c3) {
    PHILOX_ROUND(0u);
    PHILOX_ROUND(1u);
    PHILOX_ROUND(2u);
    PHILOX_ROUND(3u);
    PHILOX_ROUND(4u);
    PHILOX_ROUND(5u);
    PHILOX_ROUND(6u);
    PHILOX_ROUND(7u);
    PHILOX_ROUND(8u);
    PHILOX_ROUND(9u);
    return c0;
}

static void dropout_mask(uint8_t *mask, const struct dp_layer *l, const struct dp_ctx *ctx,
                         int64_t B, int64_t n, float p) {
    const int64_t *sidx = ctx->batch ? ctx->batch->sample_idx : NULL;
    const uint64_t key = mix64(ctx->seed ^ mix64((uint64_t)DP_RNG_DROPOUT + 0x632be59bd9b4e019ULL));
    const uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32), id = (uint32_t)l->id;
#pragma omp parallel for schedule(static) if (B * n >= DP__OMP_MIN / 16)
    for (int64_t b = 0; b < B; b++) {
        const uint64_t s = sidx ? (uint64_t)sidx[b] : (uint64_t)b;
        const uint32_t s0 = (uint32_t)s, s1 = (uint32_t)(s >> 32);
        uint8_t *mb = mask + b * n;
#pragma omp simd
        for (int64_t e = 0; e < n; e++) {
            /* counter (a, b) = (s, id << 32 | e) */
            uint32_t w = philox_word(k0, k1, s0, s1, (uint32_t)e, id);
            mb[e] = (float)(w >> 8) * (1.0f / 16777216.0f) >= p;
        }
    }
}

/* Forward (training):  y = x * m / (1 - p),  m ~ Bernoulli(1 - p) per element
 *                      (the mask above); eval or p == 0: y = x
 * Backward:            dx = dy * m / (1 - p)  (eval: dx = dy) */
static int dropout_forward(struct dp_layer *l, struct dp_ctx *ctx, float *y, const float *x,
                           int64_t B) {
    const struct dropout *dr = l->priv;
    const int64_t n = dp_shape_numel(&l->in_shape), N = B * n;
    if (!ctx->training || dr->p == 0.0f) {
        memcpy(y, x, sizeof(float) * (size_t)N);
        return DP_OK;
    }
    uint8_t *mask = dp_arena_alloc(ctx->arena, (size_t)N); /* (B, n) */
    if (!mask) return DP_ENOMEM;
    dropout_mask(mask, l, ctx, B, n, dr->p);
    const float scale = dr->p < 1.0f ? 1.0f / (1.0f - dr->p) : 0.0f;
#pragma omp parallel for simd schedule(static) if (parallel : N >= DP__OMP_MIN)
    for (int64_t i = 0; i < N; i++)
        y[i] = mask[i] ? x[i] * scale : 0.0f;
    ctx->saved[l->id] = mask;
    return DP_OK;
}

static int dropout_backward(struct dp_layer *l, struct dp_ctx *ctx, float *dx, const float *dy,
                            const float *x, const float *y, int64_t B) {
    const struct dropout *dr = l->priv;
    const int64_t n = dp_shape_numel(&l->in_shape), N = B * n;
    if (!dx) return DP_OK;
    if (!ctx->training || dr->p == 0.0f) {
        memcpy(dx, dy, sizeof(float) * (size_t)N);
        return DP_OK;
    }
    uint8_t *mask = ctx->saved[l->id];
    if (!mask) { /* forward did not run in this step: the mask is a pure function */
        mask = dp_arena_alloc(ctx->arena, (size_t)N);
        if (!mask) return DP_ENOMEM;
        dropout_mask(mask, l, ctx, B, n, dr->p);
    }
    const float scale = dr->p < 1.0f ? 1.0f / (1.0f - dr->p) : 0.0f;
#pragma omp parallel for simd schedule(static) if (parallel : N >= DP__OMP_MIN)
    for (int64_t i = 0; i < N; i++)
        dx[i] = mask[i] ? dy[i] * scale : 0.0f;
    return DP_OK;
}

static void dropout_free(struct dp_layer *l) { dp_free(l->priv); }

static const struct dp_layer_ops dropout_ops = {"dropout", dropout_forward, dropout_backward,
                                                dropout_free};

int dp__dropout_make(struct dp_model *m, struct dp_layer **out, const char *name,
                     const struct dp_shape *in, float p) {
    *out = NULL;
    struct dp__model_mark mk = dp__model_mark(m);
    if (!(p >= 0.0f && p <= 1.0f))
        return dp_seterr(DP_EINVAL, "dropout %s: p = %g outside [0, 1]", name, (double)p);
    struct dp_layer *l;
    int rc = elementwise_make(m, &l, &dropout_ops, name, in, 1);
    if (rc) return rc;
    struct dropout *dr = dp_calloc(1, sizeof *dr);
    if (!dr)
        return dp__layer_fail(m, l, &mk, dp_seterr(DP_ENOMEM, "dropout %s: out of memory", name));
    dr->p = p;
    l->priv = dr;
    *out = l;
    return DP_OK;
}

int dp_dropout(struct dp_model *m, const char *name, float p) {
    struct dp_shape in = dp_model_cur_shape(m);
    struct dp__model_mark mk = dp__model_mark(m);
    struct dp_layer *l;
    int rc = dp__dropout_make(m, &l, name, &in, p);
    char ps[32];
    return dp__layer_record(m, l, rc, &mk, "dropout %s p=%s", name, dp__float_str(ps, p));
}
