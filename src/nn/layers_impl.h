/*
 * nn/layers_impl.h — internal helpers shared by the layer files.
 *
 * Each layer type has a `dp__<type>_make` that creates the layer for a given
 * input shape and registers its parameters, WITHOUT appending it to the
 * model; composite layers (the residual block) use these for their children.
 * The public constructors in dp/nn.h are make(dp_model_cur_shape(m)) followed
 * by dp_model_append, through dp__layer_append().
 *
 * On failure a make function frees what it created, rolls the model back to
 * where it was (parameters, buffers, layer ids), sets *out = NULL and returns
 * DP_E* with a message: a failed constructor leaves the model unchanged.
 *
 * Dimension letters used in shape comments across the layer files:
 *   B batch, C channels (or features), H W height and width, OC output
 *   channels, OH OW output height and width, K kernel size, D last dim,
 *   R rows (B * numel / D), V classes.
 */
#ifndef DP_NN_LAYERS_IMPL_H
#define DP_NN_LAYERS_IMPL_H

#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "dp/nn.h"

/* ---- model marks: undo a failed constructor -------------------------------- */

struct dp__model_mark {
    int nparams, nids;
    int64_t num_params, num_buffers;
};

static inline struct dp__model_mark dp__model_mark(const struct dp_model *m) {
    struct dp__model_mark mk = {m->nparams, m->nids, m->num_params, m->num_buffers};
    return mk;
}

static inline void dp__model_rollback(struct dp_model *m, const struct dp__model_mark *mk) {
    m->nparams = mk->nparams;
    m->nids = mk->nids;
    m->num_params = mk->num_params;
    m->num_buffers = mk->num_buffers;
}

/* Fails a make function: frees l (if any), rolls the model back, returns rc
 * (whose message is already set). */
static inline int dp__layer_fail(struct dp_model *m, struct dp_layer *l,
                                 const struct dp__model_mark *mk, int rc) {
    dp_layer_free(l);
    dp__model_rollback(m, mk);
    return rc;
}

/* Finishes a public constructor: when rc == 0 appends l to m (freeing it and
 * rolling back on failure); returns the status.  `mk` is the mark taken
 * before the make call. */
static inline int dp__layer_append(struct dp_model *m, struct dp_layer *l, int rc,
                                   const struct dp__model_mark *mk) {
    if (rc) return rc;
    rc = dp_model_append(m, l);
    if (rc) return dp__layer_fail(m, l, mk, rc);
    return DP_OK;
}

/* dp__layer_append, then, on success, the layer's statement in the model's canonical text
 * (m->desc, docs/models.md: "KIND NAME KEY=VALUE ...", printf-style): a public constructor's
 * last step, so that every model built from them can be written down (model.c). */
int dp__layer_record(struct dp_model *m, struct dp_layer *l, int rc, const struct dp__model_mark *mk,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* 1 when s[0..n) is a name a model file can hold (a layer's, or pos=/tied=): letters,
 * digits, '_' and '.', 1..63 of them, starting with a letter or '_'.  One rule for the
 * parser (model_file.c) and for the text the constructors write (model.c). */
int dp__model_name_ok(const char *s, size_t n);
/* The shortest decimal that reads back as the same float ("1e-05" for 1e-5f), into buf. */
const char *dp__float_str(char buf[32], float x);

/* ---- small helpers ------------------------------------------------------------ */

static inline struct dp_shape dp__shape1(int64_t a) {
    struct dp_shape s = {1, {a, 0, 0, 0}};
    return s;
}
static inline struct dp_shape dp__shape2(int64_t a, int64_t b) {
    struct dp_shape s = {2, {a, b, 0, 0}};
    return s;
}
static inline struct dp_shape dp__shape3(int64_t a, int64_t b, int64_t c) {
    struct dp_shape s = {3, {a, b, c, 0}};
    return s;
}
static inline struct dp_shape dp__shape4(int64_t a, int64_t b, int64_t c, int64_t d) {
    struct dp_shape s = {4, {a, b, c, d}};
    return s;
}

/* Allocates n floats from the step arena, recording an error on failure. */
static inline float *dp__arena_floats(struct dp_ctx *ctx, int64_t n) {
    return dp_arena_alloc(ctx->arena, sizeof(float) * (size_t)(n > 0 ? n : 1));
}

/* dp_model_add_param returning a status (0 or DP_E*) instead of the offset. */
static inline int dp__add_param(struct dp_model *m, struct dp_layer *l, const char *name,
                                struct dp_shape shape, enum dp_init_kind init, float a,
                                int is_buffer) {
    int64_t off = dp_model_add_param(m, l, name, &shape, init, a, is_buffer);
    return off < 0 ? (int)off : DP_OK;
}

/* ---- vectorisable math ---------------------------------------------------------- */

/* exp(x) in float without library calls or branches, so that loops marked
 * `omp simd` vectorise (glibc's vector expf needs -ffast-math).  Cephes'
 * method: x = n ln2 + r with |r| <= ln2/2 (Cody-Waite split of ln2), a
 * degree-5 minimax polynomial for (e^r - 1 - r) / r^2, and 2^n built in the
 * exponent bits.  Relative error about 2e-7 (2 ulp) on [-87.3, 88.3]; below,
 * the result is exp(-87.3) ~ 1.2e-38 (not denormals, not 0); above,
 * exp(88.3); a NaN stays NaN. */
static inline float dp__expf(float x) {
    float xc = x < -87.33f ? -87.33f : x;
    xc = xc > 88.3f ? 88.3f : xc;
    xc = xc == xc ? xc : 0.0f; /* NaN: compute anything, return x below */
    /* n = round(x / ln2) by the 1.5 * 2^23 trick: n sits in t's low bits */
    const float magic = 12582912.0f;
    float t = xc * 1.44269504088896341f + magic;
    float n = t - magic;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float er = p * r * r + r + 1.0f;
    uint32_t tb, mb, eb;
    memcpy(&tb, &t, 4);
    memcpy(&mb, &magic, 4);
    eb = (tb - mb + 127u) << 23; /* 2^n, n in [-126, 127] */
    float scale;
    memcpy(&scale, &eb, 4);
    float y = er * scale;
    return x == x ? y : x;
}

/* tanh(x) = 1 - 2 / (exp(2x) + 1), vectorisable.  The ABSOLUTE error is
 * about 1e-7 (the relative error grows for |x| < 1e-3, where tanh(x) ~ x);
 * enough for GELU, where tanh enters as 1 + tanh. */
static inline float dp__tanhf(float x) { return 1.0f - 2.0f / (dp__expf(2.0f * x) + 1.0f); }

/* The standard normal distribution function Phi(x) = (1 + erf(x / sqrt 2)) / 2
 * in float, vectorisable (no calls, no branches), for the exact GELU; also
 * g = exp(-x^2 / 2), which the GELU's derivative needs (phi = g / sqrt(2 pi)).
 * With a = |x| / sqrt 2 and erfc(a) = e^(-a^2) R(a):
 *     Phi(x) = 1 - erfc(a) / 2  (x >= 0),     Phi(x) = erfc(a) / 2  (x < 0),
 * R a rational function of degree 4/4 in a, fitted to erfc(a) e^(a^2) on
 * [0, 4] (a weighted least-squares fit against double erfc, made for this
 * file; relative error 1.1e-8 in exact arithmetic, all coefficients positive,
 * so its float evaluation does not cancel).  Past a = 4 (|x| > 5.66) R's
 * relative error grows, but e^(-a^2) < 1.2e-7 multiplies it; past a = 10,
 * erfc(a) / 2 is taken as 0.  One rational and one exp, where erf through
 * two polynomial pieces cost twice as many instructions.  Measured against
 * double precision (test gelu_normcdf_matches_double): see there. */
__attribute__((always_inline)) static inline float dp__normcdf(float x, float *gauss) {
    const float a = fabsf(x) * 0.70710678118654752f;
    const float ac = a < 10.0f ? a : 10.0f, a2 = ac * ac;
    const float P = (0.9999999890954462f + 0.8662545991607199f * ac) +
                    (0.36424740780881326f + 0.06157428638456622f * ac) * a2 +
                    1.1698054904307753e-05f * (a2 * a2);
    const float Q = (1.0f + 1.9946327156311652f * ac) +
                    (1.614965797560153f + 0.6413872753848544f * ac) * a2 +
                    0.1095755805509322f * (a2 * a2);
    /* g = e^(-a^2) = e^(-x^2 / 2), with x^2 = hi + lo exactly (lo by a fused
     * multiply-add): e^(-hi/2) (1 - lo/2).  Rounding x^2 alone would cost up to
     * 16 ulp of Phi in the far negative tail, where e^(-x^2/2) is all of it. */
    const float hi = x * x, lo = fmaf(x, x, -hi);
    const float g = dp__expf(-0.5f * hi) * (1.0f - 0.5f * lo);
    float half_erfc = 0.5f * g * (P / Q);
    half_erfc = a < 10.0f ? half_erfc : 0.0f;
    *gauss = g;
    const float phi = x < 0.0f ? half_erfc : 1.0f - half_erfc;
    return x == x ? phi : x;
}

#define DP__RSQRT2PI 0.39894228040143268f /* 1/sqrt(2 pi) */

/* The exact GELU (torch.nn.GELU()) of v, y = v Phi(v), and its derivative
 * *d = Phi(v) + v phi(v), phi(v) = exp(-v^2 / 2) / sqrt(2 pi): the gelu_erf layer's
 * expressions (activation.c), for the layers that apply it themselves. */
__attribute__((always_inline)) static inline float dp__gelu_erf1(float v, float *d) {
    float g;
    const float cdf = dp__normcdf(v, &g);
    *d = cdf + v * (DP__RSQRT2PI * g);
    return v * cdf;
}

/* ---- make without appending ------------------------------------------------- */

int dp__linear_make(struct dp_model *m, struct dp_layer **out, const char *name,
                    const struct dp_shape *in, int64_t out_features, int bias);
/* Re-initialises a Linear layer made by dp__linear_make as GPT-2 does:
 * weight N(0, 0.02^2), bias 0 (instead of PyTorch's U(+-1/sqrt(IN))). */
void dp__linear_init_gpt(struct dp_model *m, const struct dp_layer *l);
/* The transformer block's MLP (transformer.c) applies the exact GELU in the GEMMs' tiles
 * (dp__gemm_post): its fc with g (not NULL) writes g = GELU(v), v = x W^T + b, and GELU'(v) in
 * y's place; its fc_out with mul (not NULL) multiplies dx by mul (that kept GELU', row stride
 * of dx) as dx is written.  The same bits as the Linear and gelu_erf layers one after the other. */
int dp__linear_forward_gelu(struct dp_layer *l, struct dp_ctx *ctx, float *y, float *g, const float *x, int64_t B);
int dp__linear_backward_mul(struct dp_layer *l, struct dp_ctx *ctx, float *dx, const float *mul, const float *dy,
                            const float *x, int64_t B);
/* A Linear's slices under tensor parallelism (linear.c; struct dp_tp): column-parallel rows
 * [r0, r0 + nr) of its output features, row-parallel columns [c0, c0 + nc) of its input
 * features; the row-parallel bias once, after the all-reduce; the parameters marked; g and mul
 * as above, on this rank's share. */
void dp__linear_rows_forward(const struct dp_layer *l, const struct dp_ctx *ctx, float *y, float *g, int64_t ldy,
                             const float *x, int64_t R, int64_t r0, int64_t nr);
void dp__linear_rows_backward(const struct dp_layer *l, const struct dp_ctx *ctx, float *dx, int accumulate,
                              const float *dy, int64_t ldy, const float *x, int64_t R, int64_t r0, int64_t nr);
void dp__linear_cols_forward(const struct dp_layer *l, const struct dp_ctx *ctx, float *y, const float *x, int64_t R,
                             int64_t c0, int64_t nc);
void dp__linear_cols_backward(const struct dp_layer *l, const struct dp_ctx *ctx, float *dx, const float *mul,
                              const float *dy, const float *x, int64_t R, int64_t c0, int64_t nc);
void dp__linear_bias_forward(const struct dp_layer *l, const struct dp_ctx *ctx, float *y, int64_t R);
void dp__linear_bias_backward(const struct dp_layer *l, const struct dp_ctx *ctx, const float *dy, int64_t R);
void dp__linear_set_tp(struct dp_model *m, const struct dp_layer *l, int kind);
/* An attention layer's heads (attention.c). */
int dp__attention_heads(const struct dp_layer *l);
int dp__conv2d_make(struct dp_model *m, struct dp_layer **out, const char *name,
                    const struct dp_shape *in, int64_t out_channels, int kernel, int stride,
                    int pad, int bias);
int dp__maxpool2d_make(struct dp_model *m, struct dp_layer **out, const char *name,
                       const struct dp_shape *in, int kernel, int stride);
int dp__global_avgpool_make(struct dp_model *m, struct dp_layer **out, const char *name,
                            const struct dp_shape *in);
int dp__relu_make(struct dp_model *m, struct dp_layer **out, const char *name,
                  const struct dp_shape *in);
/* The ReLU of one value, max(v, 0) (a NaN stays, -0 stays): the expression of the ReLU layer
 * and of every layer that applies it itself (in an epilogue, a tile's post-op, a block). */
static inline float dp__relu1(float v) { return v < 0.0f ? 0.0f : v; }
/* The ReLU layer's two loops, for the layers that apply it themselves (fused, or inside a
 * block), so that their bits are the layer's: y = max(x, 0), and dx = dy [y > 0] (y the ReLU's
 * output); either may work in place. */
void dp__relu(float *y, const float *x, int64_t n);
void dp__relu_mask(float *dx, const float *dy, const float *y, int64_t n);
/* Before slice [r0, r0 + nr) of a sliced layer (dp_layer.slice_rows) runs in `phase`: the
 * pass's layer_begin hook, if any, on a view of l whose parameters are those rows (r0 = rows:
 * its tail, the bias) and, with bias, whose tied range is the tail (forward reads it for
 * every slice). */
int dp__layer_slice_begin(const struct dp_ctx *ctx, const struct dp_layer *l, int phase, int64_t r0, int64_t nr,
                          int bias);
/* A composite's child, forward and backward: where the unit cut the composite (parent->parts),
 * the pass's layer_begin hook on the child first, and after its backward its range reported
 * to grad_ready (unless the child, cut in turn, reported its own); else just the child's op. */
int dp__kid_forward(struct dp_ctx *ctx, const struct dp_layer *parent, struct dp_layer *kid, float *y, const float *x,
                    int64_t B);
/* The two halves, for a parent that runs its child's pass itself (dp__linear_forward_gelu): the
 * hook before (phase DP_PHASE_*), and the report after a backward. */
int dp__kid_begin(struct dp_ctx *ctx, const struct dp_layer *parent, struct dp_layer *kid, int phase);
void dp__kid_backward_done(struct dp_ctx *ctx, const struct dp_layer *parent, struct dp_layer *kid);
int dp__kid_backward(struct dp_ctx *ctx, const struct dp_layer *parent, struct dp_layer *kid, float *dx,
                     const float *dy, const float *x, const float *y, int64_t B);
int dp__gelu_make(struct dp_model *m, struct dp_layer **out, const char *name,
                  const struct dp_shape *in);
int dp__dropout_make(struct dp_model *m, struct dp_layer **out, const char *name,
                     const struct dp_shape *in, float p);
int dp__batchnorm2d_make(struct dp_model *m, struct dp_layer **out, const char *name,
                         const struct dp_shape *in, float eps, float momentum);
int dp__layernorm_make(struct dp_model *m, struct dp_layer **out, const char *name,
                       const struct dp_shape *in, float eps);
int dp__flatten_make(struct dp_model *m, struct dp_layer **out, const char *name,
                     const struct dp_shape *in);
int dp__resblock_make(struct dp_model *m, struct dp_layer **out, const char *name,
                      const struct dp_shape *in, int64_t out_channels, int stride);
/* A residual block's layers (its convolutions and BatchNorms, the shortcut's when it has one)
 * into child; their number */
int dp__resblock_children(const struct dp_layer *l, const struct dp_layer *child[6]);
/* Deterministic mode's statistics (dp_model_apply_stats) applied to layer l: a BatchNorm's
 * running statistics, those of a residual block's BatchNorms; nothing for other layers */
void dp__layer_apply_stats(const struct dp_layer *l, float *buffers, const double *acc);
int dp__gelu_erf_make(struct dp_model *m, struct dp_layer **out, const char *name,
                      const struct dp_shape *in);
/* token embedding `tok_name` (vocab, dim) + position embedding `pos_name`
 * (ctx_len, dim), weights N(0, std^2); input (T) token ids, T <= ctx_len */
int dp__tokpos_embedding_make(struct dp_model *m, struct dp_layer **out, const char *tok_name,
                              const char *pos_name, const struct dp_shape *in, int64_t vocab,
                              int64_t ctx_len, int64_t dim, float std);
int dp__tied_lm_head_make(struct dp_model *m, struct dp_layer **out, const char *name,
                          const struct dp_shape *in, const char *weight);
/* causal self-attention named `name`, its children "<prefix>.qkv", "<prefix>.proj" */
int dp__attention_make(struct dp_model *m, struct dp_layer **out, const char *name,
                       const char *prefix, const struct dp_shape *in, int heads);
int dp__transformer_block_make(struct dp_model *m, struct dp_layer **out, const char *name,
                               const struct dp_shape *in, int heads);

/* ---- plain reference convolution (tests compare the fast path to it) -------- */

struct dp__conv_dims {
    int64_t C, H, W;    /* input plane */
    int64_t OC, OH, OW; /* output plane */
    int K, S, P;        /* kernel, stride, zero padding */
};
/* y = conv(x, w) + b with direct loops and double accumulation.
 * y (B, OC, OH, OW), x (B, C, H, W), w (OC, C, K, K), b (OC) or NULL. */
void dp__conv2d_forward_ref(float *y, const float *x, const float *w, const float *b, int64_t B,
                            const struct dp__conv_dims *d);
/* dx = conv^T(dy, w) (overwrite; skipped when dx is NULL), dw += corr(dy, x),
 * db += sum dy (skipped when db is NULL). */
void dp__conv2d_backward_ref(float *dx, float *dw, float *db, const float *dy, const float *x,
                             const float *w, int64_t B, const struct dp__conv_dims *d);
/* Columns per GEMM in the conv2d fast path (default 512; 0 = the whole batch
 * in one GEMM).  Process-wide; set it before workers start (tests, benches). */
void dp__conv2d_set_chunk_cols(int64_t cols);
/* oneDNN's blocked convolution kernels for the layers with C >= 16 (src/nn/conv_dnnl.c):
 * on (the default) or off (im2col + GEMM everywhere).  Process-wide, as the chunk above. */
void dp__conv2d_set_dnnl(int on);
struct dp__conv_dnnl; /* a layer's primitives, per group size */
/* Whether the shape is one the blocked kernels take (C >= 16, K >= 2; 0 when built without
 * oneDNN), and whether they run now (that, and on, and oneDNN the GEMM backend). */
int dp__conv_dnnl_fits(const struct dp__conv_dims *d);
int dp__conv_dnnl_usable(const struct dp__conv_dims *d);
struct dp__conv_dnnl *dp__conv_dnnl_new(void);
void dp__conv_dnnl_free(struct dp__conv_dnnl *c);
int dp__conv_dnnl_forward(struct dp__conv_dnnl *c, struct dp_ctx *ctx, const struct dp__conv_dims *d, int relu,
                          const float *w, const float *bias, float *y, const float *x, int64_t B);
int dp__conv_dnnl_backward(struct dp__conv_dnnl *c, struct dp_ctx *ctx, const struct dp__conv_dims *d, int relu,
                           const float *w, float *dw, float *db, float *dx, const float *dy, const float *x,
                           const float *y, int64_t B);
/* The dims of a conv2d layer made by dp__conv2d_make. */
struct dp__conv_dims dp__conv2d_dims(const struct dp_layer *l);

/* Minimum element count for which elementwise loops start an OpenMP team. */
#define DP__OMP_MIN 32768

/* The calling thread's number in its OpenMP team (0 outside one, or built without OpenMP). */
static inline int dp__thread_id(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* The calling thread's share [*a, *b) of n items, split evenly over its OpenMP team (all of them
 * outside a parallel region).  Loops that sum over rows and split their columns this way walk
 * the rows in memory order, one run of b - a columns per row, and each column's sum keeps its
 * order whatever the thread count. */
static inline void dp__thread_share(int64_t n, int64_t *a, int64_t *b) {
#ifdef _OPENMP
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
    const int64_t t = 0, nt = 1;
#endif
    *a = n * t / nt;
    *b = n * (t + 1) / nt;
}

#endif
