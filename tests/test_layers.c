/* Layers: backward of every layer against central finite differences, the
 * fast convolution against the direct-loop reference, BatchNorm statistics
 * (running stats, eval mode, synchronised over two workers), dropout masks
 * keyed by sample, softmax cross-entropy against a double implementation,
 * gradient accumulation, determinism across thread counts, and constructor
 * errors.
 *
 * Finite differences.  Each layer sits alone in a tiny model
 * (followed by a flatten when its output has more than 2 dims, so the model
 * can be finalised), is called directly through l->ops, and is checked on
 *     L(theta) = sum_i y_i r_i          (r fixed random in [-1, 1], so dy = r),
 * summed in double.  For every input element and every parameter element
 *     fd = (L(theta + eps) - L(theta - eps)) / (2 eps),   eps = 1e-2,
 * and the analytic gradient a must satisfy |a - fd| <= 1e-3 + 2e-3 max(|a|, |fd|).
 * The forward runs in float, so eps cannot be much smaller; for these smooth
 * layers the worst point uses about 2% of that tolerance (DP_TEST_VERBOSE=1
 * prints it), while a wrong or missing term shows as an O(1) error.
 * Kinks (ReLU, max pooling): ReLU/max-pool inputs are generated away from
 * kinks (|x| >= 0.05, window values 0.1 apart), so no point is skipped there.
 * The residual block has ReLUs on internal values (behind BatchNorm, which
 * couples a whole channel), where kinks cannot be avoided that way: it uses
 * eps = 1e-3 and |a - fd| <= 2e-3 + 1e-2 max(|a|, |fd|) (the worst point uses
 * about half of it, and the error shrinks with eps, as kink crossings do), and
 * a point is skipped when the differences at eps and eps/2 disagree (a kink was
 * crossed between them); at most 10% of its points may be skipped,
 * and none for the smooth layers. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dp/nn.h"
#include "nn/layers_impl.h"
#include "test.h"

/* defaults for smooth layers; the residual block uses eps 1e-3 and a looser
 * tolerance (see the top of the file) */
#define FD_EPS 1e-2
#define FD_ATOL 1e-3
#define FD_RTOL 2e-3
static double fd_worst;

static float urand(uint64_t seed, uint64_t i, float lo, float hi) {
    return lo + (hi - lo) * dp_rng_uniform(seed, DP_RNG_USER, 7, i);
}

static void fill(float *x, int64_t n, uint64_t seed, float lo, float hi) {
    for (int64_t i = 0; i < n; i++)
        x[i] = urand(seed, (uint64_t)i, lo, hi);
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* ---- a layer under test ------------------------------------------------------- */

struct lt {
    struct dp_model *m;
    struct dp_replica r;
    struct dp_layer *l; /* the layer under test (m->layers[under]) */
    int under;          /* layers before it only own parameters it uses (a tied head) */
    int64_t B, nin, nout;
    float *x, *dy, *dx; /* (B, in), (B, out), (B, in) */
    float *y;           /* output of the last forward (arena) */
    int64_t sidx[64];
    struct dp_batch batch;
    int training;
    uint64_t seed;
    dp_stat_sync_fn sync;
    void *sync_arg;
    double eps, atol, rtol; /* finite differences */
};

static void lt_begin(struct lt *t, struct dp_shape in, int64_t B) {
    memset(t, 0, sizeof *t);
    t->B = B;
    t->training = 1;
    t->seed = 1234;
    t->eps = FD_EPS, t->atol = FD_ATOL, t->rtol = FD_RTOL;
    ASSERT_OK(dp_model_init(&t->m, "test", &in));
}

/* Finishes the model after the layer under test was added, initialises
 * parameters and moves the "1"/"0"-initialised ones (norm weights and biases,
 * running stats) to random values, and fills x and dy. */
static void lt_end(struct lt *t, uint64_t seed) {
    ASSERT_TRUE(t->m->nlayers == t->under + 1);
    if (dp_model_cur_shape(t->m).ndim > 2) ASSERT_OK(dp_flatten(t->m, "flat"));
    ASSERT_OK(dp_model_finalize(t->m));
    t->l = t->m->layers[t->under];
    ASSERT_OK(dp_replica_init(&t->r, t->m, t->B));
    dp_model_init_params(t->m, &t->r, seed);
    for (int i = 0; i < t->m->nparams; i++) {
        const struct dp_param_info *p = &t->m->params[i];
        float *dst = (p->is_buffer ? t->r.buffers : t->r.params) + p->offset;
        uint64_t s = seed * 131 + (uint64_t)i;
        if (ends_with(p->name, "running_var"))
            fill(dst, p->count, s, 0.5f, 2.0f);
        else if (ends_with(p->name, "running_mean"))
            fill(dst, p->count, s, -0.5f, 0.5f);
        else if (ends_with(p->name, "num_batches_tracked"))
            continue;
        else if (p->init == DP_INIT_CONST)
            fill(dst, p->count, s, 0.5f, 1.5f);
        else if (p->init == DP_INIT_ZERO)
            fill(dst, p->count, s, -0.5f, 0.5f);
        else if (p->init == DP_INIT_NORMAL) /* GPT's N(0, 0.02^2): too small to see a term */
            fill(dst, p->count, s, -0.5f, 0.5f);
    }
    t->nin = t->B * dp_shape_numel(&t->l->in_shape);
    t->nout = t->B * dp_shape_numel(&t->l->out_shape);
    t->x = malloc(sizeof(float) * (size_t)t->nin);
    t->dx = malloc(sizeof(float) * (size_t)t->nin);
    t->dy = malloc(sizeof(float) * (size_t)t->nout);
    fill(t->x, t->nin, seed + 1, -1.0f, 1.0f);
    fill(t->dy, t->nout, seed + 2, -1.0f, 1.0f);
    for (int64_t b = 0; b < t->B && b < 64; b++)
        t->sidx[b] = 1000 + 3 * b;
    t->batch.B = t->B;
    t->batch.sample_idx = t->sidx;
}

static void lt_free(struct lt *t) {
    free(t->x), free(t->dx), free(t->dy);
    dp_replica_free(&t->r);
    dp_model_free(t->m);
}

static struct dp_ctx lt_ctx(struct lt *t) {
    struct dp_ctx c = {
        .params = t->r.params,
        .grads = t->r.grads,
        .buffers = t->r.buffers,
        .arena = &t->r.arena,
        .saved = t->r.saved,
        .batch = &t->batch,
        .training = t->training,
        .seed = t->seed,
        .loss_scale = 1.0f,
        .stat_sync = t->sync,
        .stat_sync_arg = t->sync_arg,
    };
    return c;
}

/* A fresh step: resets the arena and runs forward. */
static void lt_forward(struct lt *t) {
    dp_arena_reset(&t->r.arena);
    memset(t->r.saved, 0, sizeof(void *) * (size_t)(t->m->nids + 1));
    struct dp_ctx c = lt_ctx(t);
    t->y = dp_arena_alloc(&t->r.arena, sizeof(float) * (size_t)t->nout);
    ASSERT_TRUE(t->y != NULL);
    ASSERT_OK(t->l->ops->forward(t->l, &c, t->y, t->x, t->B));
}

static void lt_backward(struct lt *t, float *dx) {
    struct dp_ctx c = lt_ctx(t);
    ASSERT_OK(t->l->ops->backward(t->l, &c, dx, t->dy, t->x, t->y, t->B));
}

static double lt_loss(struct lt *t) {
    lt_forward(t);
    double s = 0.0;
    for (int64_t i = 0; i < t->nout; i++)
        s += (double)t->y[i] * t->dy[i];
    return s;
}

/* Compares analytic[0..n) with central differences of L over theta[0..n).
 * Returns the number of points skipped as kinks. */
static int fd_check(struct lt *t, const char *what, float *theta, const float *analytic, int64_t n,
                    int allow_kinks) {
    int skipped = 0;
    for (int64_t i = 0; i < n; i++) {
        const float save = theta[i];
        double f[4];
        const double eps = t->eps, atol = t->atol, rtol = t->rtol;
        const double h[4] = {eps, -eps, eps / 2, -eps / 2};
        for (int k = 0; k < 4; k++) {
            theta[i] = (float)(save + h[k]);
            f[k] = lt_loss(t);
        }
        theta[i] = save;
        /* the perturbations actually applied, in float */
        const double e1 = (double)(float)(save + eps) - (double)(float)(save - eps);
        const double e2 = (double)(float)(save + eps / 2) - (double)(float)(save - eps / 2);
        const double fd = (f[0] - f[1]) / e1, fd2 = (f[2] - f[3]) / e2;
        const double a = analytic[i];
        if (allow_kinks && fabs(fd - fd2) > atol + rtol * fmax(fabs(fd), fabs(fd2))) {
            skipped++;
            continue;
        }
        double q = fabs(a - fd) / (atol + rtol * fmax(fabs(a), fabs(fd)));
        if (q > fd_worst) fd_worst = q;
        if (!(q <= 1.0))
            dp_test_fail(__FILE__, __LINE__,
                         "%s %s[%lld]: analytic %.7g, finite difference %.7g (eps/2: %.7g)",
                         t->l->name, what, (long long)i, a, fd, fd2);
    }
    return skipped;
}

/* Checks dx and every parameter gradient of the layer under test. */
static void lt_check_grads(struct lt *t, int allow_kinks) {
    memset(t->r.grads, 0, sizeof(float) * (size_t)t->m->num_params);
    lt_forward(t);
    lt_backward(t, t->dx);
    float *g = malloc(sizeof(float) * (size_t)(t->m->num_params + 1));
    memcpy(g, t->r.grads, sizeof(float) * (size_t)t->m->num_params);
    int64_t points = t->nin, skipped = fd_check(t, "x", t->x, t->dx, t->nin, allow_kinks);
    for (int i = 0; i < t->m->nparams; i++) {
        const struct dp_param_info *p = &t->m->params[i];
        if (p->is_buffer) continue;
        skipped +=
            fd_check(t, p->name, t->r.params + p->offset, g + p->offset, p->count, allow_kinks);
        points += p->count;
    }
    free(g);
    if (getenv("DP_TEST_VERBOSE")) /* how close to the tolerance the worst point came */
        fprintf(stderr, "    %s: worst |a - fd| / tol = %.3f, %lld of %lld points skipped\n",
                t->l->name, fd_worst, (long long)skipped, (long long)points);
    fd_worst = 0;
    if (!allow_kinks) ASSERT_EQ(skipped, 0);
    if (skipped * 10 > points)
        dp_test_fail(__FILE__, __LINE__, "%s: %lld of %lld points skipped as kinks", t->l->name,
                     (long long)skipped, (long long)points);
}

/* ---- finite differences, layer by layer ---------------------------------------- */

TEST(layer_linear_grad) {
    struct lt t;
    lt_begin(&t, dp__shape1(7), 3);
    ASSERT_OK(dp_linear(t.m, "fc", 5, 1));
    lt_end(&t, 1);
    ASSERT_EQ(t.l->out_shape.d[0], 5);
    lt_check_grads(&t, 0);
    lt_free(&t);
    /* sequences: (T, IN) rows, no bias */
    lt_begin(&t, dp__shape2(4, 6), 2);
    ASSERT_OK(dp_linear(t.m, "proj", 3, 0));
    lt_end(&t, 2);
    ASSERT_EQ(t.l->out_shape.ndim, 2);
    ASSERT_EQ(t.l->out_shape.d[1], 3);
    ASSERT_EQ(t.m->num_params, 18);
    lt_check_grads(&t, 0);
    lt_free(&t);
}

static void conv_grad_case(int64_t C, int64_t H, int64_t W, int64_t OC, int K, int S, int P,
                           int bias, int64_t B, uint64_t seed) {
    struct lt t;
    lt_begin(&t, dp__shape3(C, H, W), B);
    ASSERT_OK(dp_conv2d(t.m, "conv", OC, K, S, P, bias));
    lt_end(&t, seed);
    ASSERT_EQ(t.l->out_shape.d[1], (H + 2 * P - K) / S + 1);
    lt_check_grads(&t, 0);
    lt_free(&t);
}

TEST(layer_conv2d_grad) {
    conv_grad_case(2, 5, 6, 3, 3, 1, 0, 1, 2, 11); /* stride 1, pad 0 */
    conv_grad_case(3, 5, 5, 2, 3, 1, 1, 0, 2, 12); /* stride 1, pad 1 */
    conv_grad_case(2, 7, 6, 3, 3, 2, 1, 1, 2, 13); /* stride 2, pad 1 */
    conv_grad_case(2, 6, 7, 2, 2, 2, 0, 1, 3, 14); /* stride 2, pad 0 */
    conv_grad_case(3, 4, 4, 2, 1, 1, 0, 0, 2, 15); /* 1x1 */
}

TEST(layer_maxpool_grad) {
    struct lt t;
    lt_begin(&t, dp__shape3(2, 5, 6), 2);
    ASSERT_OK(dp_maxpool2d(t.m, "pool", 2, 2));
    lt_end(&t, 3);
    ASSERT_EQ(t.l->out_shape.d[1], 2);
    ASSERT_EQ(t.l->out_shape.d[2], 3);
    /* Distinct values 0.1 apart in random order: +-eps never changes an argmax. */
    for (int64_t i = 0; i < t.nin; i++)
        t.x[i] = (float)(0.1 * (double)((i * 37) % t.nin)) - 3.0f;
    lt_check_grads(&t, 0);
    lt_free(&t);
    /* overlapping windows (stride < kernel) accumulate into dx */
    lt_begin(&t, dp__shape3(1, 5, 5), 2);
    ASSERT_OK(dp_maxpool2d(t.m, "pool", 3, 1));
    lt_end(&t, 4);
    for (int64_t i = 0; i < t.nin; i++)
        t.x[i] = (float)(0.1 * (double)((i * 13) % t.nin));
    lt_check_grads(&t, 0);
    lt_free(&t);
}

/* Ties go to the first maximum in PyTorch's scan order (row by row), in the
 * 2x2/stride-2 path and in the general one; a NaN wins. */
TEST(layer_maxpool_ties_and_nan) {
    const int ks[2][2] = {{2, 2}, {2, 1}}; /* kernel, stride */
    for (int v = 0; v < 2; v++) {
        struct lt t;
        lt_begin(&t, dp__shape3(1, 4, 4), 1);
        ASSERT_OK(dp_maxpool2d(t.m, "pool", ks[v][0], ks[v][1]));
        lt_end(&t, 20);
        memset(t.x, 0, sizeof(float) * 16);
        /* window (0,1) of the 2x2 pooling: b = c = d = 1; window (1,0): c is NaN */
        t.x[0 * 4 + 3] = 1.0f;
        t.x[1 * 4 + 2] = 1.0f;
        t.x[1 * 4 + 3] = 1.0f;
        t.x[2 * 4 + 0] = NAN;
        for (int64_t i = 0; i < t.nout; i++)
            t.dy[i] = 1.0f + (float)i;
        lt_forward(&t);
        lt_backward(&t, t.dx);
        if (v == 0) {
            /* windows: (0,0) all 0 -> top-left; (0,1) max 1 first at (0,3); (1,0) NaN */
            ASSERT_TRUE(t.y[0] == 0.0f && t.y[1] == 1.0f && isnan(t.y[2]) && t.y[3] == 0.0f);
            ASSERT_TRUE(t.dx[0] == 1.0f && t.dx[3] == 2.0f && t.dx[8] == 3.0f && t.dx[10] == 4.0f);
            ASSERT_TRUE(t.dx[6] == 0.0f && t.dx[7] == 0.0f);
        } else {
            /* 3x3 outputs; (0,0) window all zero -> (0,0); (0,2) covers (0,2),(0,3),(1,2),(1,3):
             * first max is (0,3) */
            ASSERT_TRUE(t.y[0] == 0.0f && t.dx[0] == 1.0f);
            ASSERT_TRUE(t.y[2] == 1.0f);
            ASSERT_TRUE(t.dx[3] >= 3.0f && t.dx[7] == 0.0f);
            ASSERT_TRUE(isnan(t.y[3]) && isnan(t.y[6]));
        }
        lt_free(&t);
    }
}

/* The 2x2/stride-2 path (maxpool_plane_2x2) against PyTorch's scan written out here: y and
 * dx bit for bit, on planes of odd and even sizes and rows of 1 to 33 outputs, with values
 * drawn from {0, -0, 1, -1, NaN} so that ties and NaNs are everywhere. */
TEST(layer_maxpool_2x2_matches_scan) {
    const int64_t sizes[7][2] = {{5, 7}, {6, 8}, {4, 3}, {7, 67}, {8, 64}, {3, 34}, {28, 28}};
    const float vals[5] = {0.0f, -0.0f, 1.0f, -1.0f, NAN};
    for (int v = 0; v < 7; v++) {
        const int64_t H = sizes[v][0], W = sizes[v][1], OH = H / 2, OW = W / 2, C = 3;
        struct lt t;
        lt_begin(&t, dp__shape3(C, H, W), 4);
        ASSERT_OK(dp_maxpool2d(t.m, "pool", 2, 2));
        lt_end(&t, 30 + (uint64_t)v);
        for (int64_t i = 0; i < t.nin; i++) t.x[i] = vals[dp_rng_u32(7, 1, (uint64_t)v, (uint64_t)i) % 5];
        for (int64_t i = 0; i < t.nout; i++) t.dy[i] = (float)(i % 9) - 4.0f; /* -0 from 0 * -1 too */
        t.dy[1] = -0.0f;
        lt_forward(&t);
        lt_backward(&t, t.dx);
        float *dx = calloc((size_t)t.nin, sizeof(float));
        for (int64_t pl = 0; pl < t.B * C; pl++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    const float *xp = t.x + pl * H * W;
                    float mx = -INFINITY;
                    int64_t at = 2 * oh * W + 2 * ow;
                    for (int kh = 0; kh < 2; kh++)
                        for (int kw = 0; kw < 2; kw++) {
                            const int64_t i = (2 * oh + kh) * W + 2 * ow + kw;
                            if (xp[i] > mx || xp[i] != xp[i]) mx = xp[i], at = i;
                        }
                    const int64_t o = pl * OH * OW + oh * OW + ow;
                    ASSERT_TRUE(!memcmp(&t.y[o], &mx, sizeof mx));
                    dx[pl * H * W + at] += t.dy[o];
                }
        ASSERT_TRUE(!memcmp(dx, t.dx, sizeof(float) * (size_t)t.nin));
        free(dx);
        lt_free(&t);
    }
}

TEST(layer_avgpool_grad) {
    struct lt t;
    lt_begin(&t, dp__shape3(3, 4, 5), 2);
    ASSERT_OK(dp_global_avgpool(t.m, "gap"));
    lt_end(&t, 5);
    ASSERT_EQ(t.l->out_shape.ndim, 1);
    ASSERT_EQ(t.l->out_shape.d[0], 3);
    lt_check_grads(&t, 0);
    lt_free(&t);
}

TEST(layer_relu_grad) {
    struct lt t;
    lt_begin(&t, dp__shape3(2, 3, 3), 3);
    ASSERT_OK(dp_relu(t.m, "relu"));
    lt_end(&t, 6);
    for (int64_t i = 0; i < t.nin; i++)
        t.x[i] += t.x[i] < 0 ? -0.05f : 0.05f; /* off the kink */
    lt_check_grads(&t, 0);
    lt_free(&t);
}

TEST(layer_gelu_grad) {
    struct lt t;
    lt_begin(&t, dp__shape2(3, 8), 2);
    ASSERT_OK(dp_gelu(t.m, "gelu"));
    lt_end(&t, 7);
    fill(t.x, t.nin, 77, -4.0f, 4.0f);
    lt_forward(&t);
    for (int64_t i = 0; i < t.nin; i++) {
        double v = t.x[i];
        double ref = 0.5 * v * (1.0 + tanh(sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
        ASSERT_NEAR(t.y[i], ref, 1e-6 + 1e-6 * fabs(ref));
    }
    lt_check_grads(&t, 0);
    lt_free(&t);
}

TEST(layer_dropout_grad) {
    struct lt t;
    lt_begin(&t, dp__shape2(4, 5), 3);
    ASSERT_OK(dp_dropout(t.m, "drop", 0.3f));
    lt_end(&t, 8);
    lt_forward(&t);
    int zeros = 0;
    for (int64_t i = 0; i < t.nin; i++) {
        if (t.y[i] == 0.0f)
            zeros++;
        else
            ASSERT_NEAR(t.y[i], t.x[i] / 0.7, 1e-6);
    }
    ASSERT_TRUE(zeros > 0 && zeros < t.nin);
    lt_check_grads(&t, 0);
    /* eval: identity */
    t.training = 0;
    lt_forward(&t);
    for (int64_t i = 0; i < t.nin; i++)
        ASSERT_TRUE(t.y[i] == t.x[i]);
    lt_check_grads(&t, 0);
    lt_free(&t);
}

TEST(layer_batchnorm_grad_train) {
    struct lt t;
    lt_begin(&t, dp__shape3(3, 4, 3), 3);
    ASSERT_OK(dp_batchnorm2d(t.m, "bn", 1e-5f, 0.1f));
    lt_end(&t, 9);
    lt_check_grads(&t, 0);
    lt_free(&t);
    /* (C) inputs: BatchNorm1d */
    lt_begin(&t, dp__shape1(5), 4);
    ASSERT_OK(dp_batchnorm2d(t.m, "bn", 1e-5f, 0.1f));
    lt_end(&t, 10);
    lt_check_grads(&t, 0);
    lt_free(&t);
}

TEST(layer_batchnorm_grad_eval) {
    struct lt t;
    lt_begin(&t, dp__shape3(3, 4, 3), 2);
    ASSERT_OK(dp_batchnorm2d(t.m, "bn", 1e-5f, 0.1f));
    lt_end(&t, 11);
    t.training = 0;
    lt_check_grads(&t, 0);
    lt_free(&t);
}

TEST(layer_layernorm_grad) {
    struct lt t;
    lt_begin(&t, dp__shape2(3, 8), 2);
    ASSERT_OK(dp_layernorm(t.m, "ln", 1e-5f));
    lt_end(&t, 12);
    lt_forward(&t);
    for (int64_t r = 0; r < 6; r++) { /* normalised rows, before the affine part */
        const float *w = t.r.params + t.l->param_off, *b = w + 8;
        double s = 0, s2 = 0;
        for (int j = 0; j < 8; j++) {
            double v = (t.y[r * 8 + j] - b[j]) / w[j];
            s += v, s2 += v * v;
        }
        ASSERT_NEAR(s / 8, 0.0, 1e-5);
        ASSERT_NEAR(s2 / 8, 1.0, 1e-3);
    }
    lt_check_grads(&t, 0);
    lt_free(&t);
}

TEST(layer_flatten_grad) {
    struct lt t;
    lt_begin(&t, dp__shape3(2, 3, 4), 2);
    ASSERT_OK(dp_flatten(t.m, "flat0"));
    lt_end(&t, 13);
    ASSERT_EQ(t.l->out_shape.ndim, 1);
    ASSERT_EQ(t.l->out_shape.d[0], 24);
    lt_check_grads(&t, 0);
    lt_free(&t);
}

TEST(layer_resblock_identity_grad) {
    struct lt t;
    lt_begin(&t, dp__shape3(3, 5, 5), 3);
    ASSERT_OK(dp_resblock(t.m, "layer1.0", 3, 1));
    lt_end(&t, 14);
    t.eps = 1e-3, t.atol = 2e-3, t.rtol = 1e-2; /* many ReLU kinks: see the top */
    ASSERT_TRUE(dp_model_find_param(t.m, "layer1.0.downsample.0.weight") == NULL);
    ASSERT_EQ(t.l->param_count, 2 * 27 * 3 + 4 * 3);
    ASSERT_EQ(t.l->buffer_count, 2 * (2 * 3 + 1));
    lt_check_grads(&t, 1);
    lt_free(&t);
}

TEST(layer_resblock_projection_grad) {
    struct lt t;
    lt_begin(&t, dp__shape3(2, 6, 5), 3);
    ASSERT_OK(dp_resblock(t.m, "layer2.0", 4, 2));
    lt_end(&t, 15);
    t.eps = 1e-3, t.atol = 2e-3, t.rtol = 1e-2; /* many ReLU kinks: see the top */
    ASSERT_EQ(t.l->out_shape.d[0], 4);
    ASSERT_EQ(t.l->out_shape.d[1], 3);
    ASSERT_EQ(t.l->out_shape.d[2], 3);
    /* torchvision's names, order and layouts */
    const char *names[] = {"layer2.0.conv1.weight",
                           "layer2.0.bn1.weight",
                           "layer2.0.bn1.bias",
                           "layer2.0.bn1.running_mean",
                           "layer2.0.bn1.running_var",
                           "layer2.0.bn1.num_batches_tracked",
                           "layer2.0.conv2.weight",
                           "layer2.0.bn2.weight",
                           "layer2.0.bn2.bias",
                           "layer2.0.bn2.running_mean",
                           "layer2.0.bn2.running_var",
                           "layer2.0.bn2.num_batches_tracked",
                           "layer2.0.downsample.0.weight",
                           "layer2.0.downsample.1.weight",
                           "layer2.0.downsample.1.bias",
                           "layer2.0.downsample.1.running_mean",
                           "layer2.0.downsample.1.running_var",
                           "layer2.0.downsample.1.num_batches_tracked"};
    ASSERT_EQ(t.m->nparams, (int)DP_ARRAY_LEN(names));
    for (size_t i = 0; i < DP_ARRAY_LEN(names); i++)
        if (strcmp(t.m->params[i].name, names[i]) != 0)
            dp_test_fail(__FILE__, __LINE__, "param %zu is %s, expected %s", i, t.m->params[i].name,
                         names[i]);
    const struct dp_param_info *p = dp_model_find_param(t.m, "layer2.0.downsample.0.weight");
    ASSERT_TRUE(p && p->shape.ndim == 4 && p->shape.d[0] == 4 && p->shape.d[1] == 2 &&
                p->shape.d[2] == 1 && p->shape.d[3] == 1);
    p = dp_model_find_param(t.m, "layer2.0.conv1.weight");
    ASSERT_TRUE(p && p->shape.d[0] == 4 && p->shape.d[1] == 2 && p->shape.d[2] == 3);
    ASSERT_TRUE(dp_model_find_param(t.m, "layer2.0.bn2.running_var")->is_buffer);
    ASSERT_EQ(t.l->param_off, 0);
    ASSERT_EQ(t.l->param_count, t.m->num_params);
    ASSERT_EQ(t.l->buffer_count, t.m->num_buffers);
    lt_check_grads(&t, 1);
    lt_free(&t);
}

/* ---- fast convolution against the reference ------------------------------------- */

static void assert_close_rel(const char *what, const float *a, const float *ref, int64_t n,
                             double rel) {
    double rms = 0;
    for (int64_t i = 0; i < n; i++)
        rms += (double)ref[i] * ref[i];
    rms = sqrt(rms / (double)(n ? n : 1));
    for (int64_t i = 0; i < n; i++)
        if (!(fabs((double)a[i] - ref[i]) <= rel * (fabs(ref[i]) + rms)))
            dp_test_fail(__FILE__, __LINE__, "%s[%lld]: %.9g vs reference %.9g", what, (long long)i,
                         (double)a[i], (double)ref[i]);
}

/* Fast path within 1e-4 * (|ref| + rms(ref)) of the direct loops, forward and
 * backward, on fixed "same" shapes (the stride-1 fast im2col) and random
 * ones, for every GEMM backend built in and several chunk sizes: the whole
 * batch in one GEMM (0), one sample per GEMM (1), chunks with a remainder
 * (40 columns), and the default. */
TEST(layer_conv2d_fast_matches_reference) {
    /* C, H, W, OC, K, S, P, bias, B */
    static const int fixed[][9] = {
        {3, 6, 5, 4, 3, 1, 1, 1, 3}, {2, 5, 7, 3, 5, 1, 2, 0, 2}, {4, 4, 4, 5, 1, 1, 0, 1, 5},
        {2, 9, 8, 3, 3, 2, 1, 0, 3}, {3, 7, 7, 2, 1, 2, 0, 0, 4}, {1, 3, 3, 2, 3, 1, 0, 1, 2},
    };
    const int64_t chunks[] = {0, 1, 40, 512};
    for (int be = 0; be < DP_GEMM_BACKEND_COUNT; be++) {
        if (!dp_gemm_backend_available(be)) continue;
        ASSERT_OK(dp_gemm_set_backend(be));
        for (uint64_t trial = 0; trial < 16 * DP_ARRAY_LEN(chunks); trial++) {
            uint64_t s = 100 + trial / DP_ARRAY_LEN(chunks);
            dp__conv2d_set_chunk_cols(chunks[trial % DP_ARRAY_LEN(chunks)]);
            int64_t C = 1 + dp_rng_u32(s, DP_RNG_USER, 1, 0) % 5;
            int64_t H = 3 + dp_rng_u32(s, DP_RNG_USER, 1, 1) % 10;
            int64_t W = 3 + dp_rng_u32(s, DP_RNG_USER, 1, 2) % 10;
            int64_t OC = 1 + dp_rng_u32(s, DP_RNG_USER, 1, 3) % 6;
            int K = (int)(1 + dp_rng_u32(s, DP_RNG_USER, 1, 4) % 5);
            int S = (int)(1 + dp_rng_u32(s, DP_RNG_USER, 1, 5) % 3);
            int P = (int)(dp_rng_u32(s, DP_RNG_USER, 1, 6) % 3);
            int bias = (int)(dp_rng_u32(s, DP_RNG_USER, 1, 7) % 2);
            int64_t B = 1 + dp_rng_u32(s, DP_RNG_USER, 1, 8) % 4;
            size_t fi = (size_t)(s - 100);
            if (fi < DP_ARRAY_LEN(fixed)) {
                const int *f = fixed[fi];
                C = f[0], H = f[1], W = f[2], OC = f[3], K = f[4], S = f[5], P = f[6], bias = f[7],
                B = f[8];
            }
            if (K > H + 2 * P || K > W + 2 * P) K = 1;
            struct lt t;
            lt_begin(&t, dp__shape3(C, H, W), B);
            ASSERT_OK(dp_conv2d(t.m, "conv", OC, K, S, P, bias));
            lt_end(&t, s);
            struct dp__conv_dims d = dp__conv2d_dims(t.l);
            const float *w = t.r.params + t.l->param_off;
            int64_t nw = OC * C * K * K;
            float *yr = malloc(sizeof(float) * (size_t)t.nout);
            float *dxr = malloc(sizeof(float) * (size_t)t.nin);
            float *gr = calloc((size_t)(nw + OC), sizeof(float));
            lt_forward(&t);
            dp__conv2d_forward_ref(yr, t.x, w, bias ? w + nw : NULL, B, &d);
            assert_close_rel("conv y", t.y, yr, t.nout, 1e-4);
            memset(t.r.grads, 0, sizeof(float) * (size_t)t.m->num_params);
            lt_backward(&t, t.dx);
            dp__conv2d_backward_ref(dxr, gr, bias ? gr + nw : NULL, t.dy, t.x, w, B, &d);
            assert_close_rel("conv dx", t.dx, dxr, t.nin, 1e-4);
            assert_close_rel("conv dw", t.r.grads + t.l->param_off, gr, nw, 1e-4);
            if (bias)
                assert_close_rel("conv db", t.r.grads + t.l->param_off + nw, gr + nw, OC, 1e-4);
            /* dx == NULL: parameter gradients only */
            memset(t.r.grads, 0, sizeof(float) * (size_t)t.m->num_params);
            lt_forward(&t);
            lt_backward(&t, NULL);
            assert_close_rel("conv dw (no dx)", t.r.grads + t.l->param_off, gr, nw, 1e-4);
            free(yr), free(dxr), free(gr);
            lt_free(&t);
        }
    }
    dp__conv2d_set_chunk_cols(512);
}

/* oneDNN's blocked kernels (src/nn/conv_dnnl.c), taken where C >= 16 and K >= 2: within
 * 1e-4 * (|ref| + rms(ref)) of the direct loops, forward and backward, with and without dx;
 * batches of one group, of several with a shorter last one (17, 35), and of one short group;
 * and the same bits on 2 and 1 threads (the groups depend on B alone; the primitives are made
 * on 2, as a trainer with --threads 2 makes them, and must still run one per thread).  With the path turned
 * off (im2col + GEMM) the bits differ: the test saw the blocked kernels run. */
TEST(layer_conv2d_dnnl_matches_reference) {
    /* C, H, W, OC, K, S, P, bias, B */
    static const int shapes[][9] = {
        {16, 6, 6, 8, 3, 1, 1, 1, 17}, {24, 7, 5, 20, 3, 2, 1, 0, 35}, {16, 9, 9, 16, 5, 1, 2, 1, 5},
        {32, 4, 4, 12, 3, 1, 0, 1, 16}, {16, 8, 8, 5, 2, 2, 0, 0, 1},
    };
    if (!dp_gemm_backend_available(DP_GEMM_DNNL)) return; /* (built without oneDNN: im2col only) */
    ASSERT_OK(dp_gemm_set_backend(DP_GEMM_DNNL));
    for (size_t i = 0; i < DP_ARRAY_LEN(shapes); i++) {
        const int *f = shapes[i];
        const int64_t C = f[0], OC = f[3], B = f[8];
        const int K = f[4], bias = f[7];
        struct lt t;
        lt_begin(&t, dp__shape3(C, f[1], f[2]), B);
        ASSERT_OK(dp_conv2d(t.m, "conv", OC, K, f[5], f[6], bias));
        lt_end(&t, 300 + i);
        struct dp__conv_dims d = dp__conv2d_dims(t.l);
        ASSERT_TRUE(dp__conv_dnnl_usable(&d));
        const float *w = t.r.params + t.l->param_off;
        const int64_t nw = OC * C * K * K, ng = nw + (bias ? OC : 0);
        float *yr = malloc(sizeof(float) * (size_t)t.nout), *dxr = malloc(sizeof(float) * (size_t)t.nin);
        float *gr = calloc((size_t)(nw + OC), sizeof(float));
        float *y1 = malloc(sizeof(float) * (size_t)t.nout), *dx1 = malloc(sizeof(float) * (size_t)t.nin);
        float *g1 = malloc(sizeof(float) * (size_t)ng);
        dp__conv2d_forward_ref(yr, t.x, w, bias ? w + nw : NULL, B, &d);
        dp__conv2d_backward_ref(dxr, gr, bias ? gr + nw : NULL, t.dy, t.x, w, B, &d);
        for (int nth = 2; nth >= 1; nth--) { /* (2 first: the primitives are made on 2 threads) */
            dp_set_num_threads(nth);
            memset(t.r.grads, 0, sizeof(float) * (size_t)t.m->num_params);
            lt_forward(&t);
            lt_backward(&t, t.dx);
            assert_close_rel("dnnl conv y", t.y, yr, t.nout, 1e-4);
            assert_close_rel("dnnl conv dx", t.dx, dxr, t.nin, 1e-4);
            assert_close_rel("dnnl conv dw", t.r.grads + t.l->param_off, gr, nw, 1e-4);
            if (bias) assert_close_rel("dnnl conv db", t.r.grads + t.l->param_off + nw, gr + nw, OC, 1e-4);
            if (nth == 2) {
                memcpy(y1, t.y, sizeof(float) * (size_t)t.nout), memcpy(dx1, t.dx, sizeof(float) * (size_t)t.nin);
                memcpy(g1, t.r.grads + t.l->param_off, sizeof(float) * (size_t)ng);
            } else { /* one thread: the bits of two */
                ASSERT_TRUE(!memcmp(y1, t.y, sizeof(float) * (size_t)t.nout));
                ASSERT_TRUE(!memcmp(dx1, t.dx, sizeof(float) * (size_t)t.nin));
                ASSERT_TRUE(!memcmp(g1, t.r.grads + t.l->param_off, sizeof(float) * (size_t)ng));
            }
        }
        dp_set_num_threads(1);
        /* no dx: the parameter gradients alone, the same bits */
        memset(t.r.grads, 0, sizeof(float) * (size_t)t.m->num_params);
        lt_forward(&t);
        lt_backward(&t, NULL);
        ASSERT_TRUE(!memcmp(g1, t.r.grads + t.l->param_off, sizeof(float) * (size_t)ng));
        /* im2col + GEMM: close, and other bits */
        dp__conv2d_set_dnnl(0);
        ASSERT_TRUE(!dp__conv_dnnl_usable(&d));
        lt_forward(&t);
        assert_close_rel("im2col conv y", t.y, yr, t.nout, 1e-4);
        ASSERT_TRUE(memcmp(y1, t.y, sizeof(float) * (size_t)t.nout) != 0);
        dp__conv2d_set_dnnl(1);
        free(yr), free(dxr), free(gr), free(y1), free(dx1), free(g1);
        lt_free(&t);
    }
}

/* ---- BatchNorm statistics ---------------------------------------------------------- */

TEST(layer_batchnorm_running_stats_and_eval) {
    const int64_t C = 3, HW = 8, B = 5, N = B * HW;
    const float eps = 1e-3f, mom = 0.2f;
    struct dp_model *m;
    struct dp_shape in = dp__shape3(C, 2, 4);
    ASSERT_OK(dp_model_init(&m, "bn", &in));
    ASSERT_OK(dp_batchnorm2d(m, "bn", eps, mom));
    ASSERT_OK(dp_flatten(m, "flat"));
    ASSERT_OK(dp_model_finalize(m));
    struct dp_replica r;
    ASSERT_OK(dp_replica_init(&r, m, B));
    dp_model_init_params(m, &r, 3);
    const struct dp_param_info *pw = dp_model_find_param(m, "bn.weight"),
                               *pb = dp_model_find_param(m, "bn.bias"),
                               *prm = dp_model_find_param(m, "bn.running_mean"),
                               *prv = dp_model_find_param(m, "bn.running_var"),
                               *pn = dp_model_find_param(m, "bn.num_batches_tracked");
    ASSERT_TRUE(pw && pb && prm && prv && pn);
    ASSERT_TRUE(prm->is_buffer && prv->is_buffer && pn->is_buffer && !pw->is_buffer);
    ASSERT_EQ(pn->count, 1);
    ASSERT_EQ(pn->shape.ndim, 0); /* a scalar, as torch's state dict */
    float *w = r.params + pw->offset, *b = r.params + pb->offset;
    float *rm = r.buffers + prm->offset, *rv = r.buffers + prv->offset,
          *nbt = r.buffers + pn->offset;
    for (int64_t c = 0; c < C; c++) {
        ASSERT_TRUE(w[c] == 1.0f && b[c] == 0.0f && rm[c] == 0.0f && rv[c] == 1.0f);
        w[c] = 0.5f + (float)c, b[c] = 0.25f * (float)c;
    }
    float x[5 * 3 * 8], y[5 * 3 * 8];
    fill(x, B * C * HW, 21, -2.0f, 3.0f);
    for (int64_t i = 0; i < B * C * HW; i++)
        x[i] += (float)((i / HW) % C); /* channel offsets */
    struct dp_ctx ctx = {.params = r.params,
                         .grads = r.grads,
                         .buffers = r.buffers,
                         .arena = &r.arena,
                         .saved = r.saved,
                         .training = 1,
                         .loss_scale = 1.0f};
    struct dp_layer *l = m->layers[0];
    ASSERT_OK(l->ops->forward(l, &ctx, y, x, B));
    for (int64_t c = 0; c < C; c++) {
        double s = 0, s2 = 0;
        for (int64_t n = 0; n < B; n++)
            for (int64_t j = 0; j < HW; j++)
                s += x[(n * C + c) * HW + j];
        double mean = s / N;
        for (int64_t n = 0; n < B; n++)
            for (int64_t j = 0; j < HW; j++)
                s2 += pow(x[(n * C + c) * HW + j] - mean, 2);
        double var = s2 / N;
        ASSERT_NEAR(rm[c], mom * mean, 1e-6);
        ASSERT_NEAR(rv[c], (1 - mom) * 1.0 + mom * var * N / (N - 1), 1e-6);
        for (int64_t n = 0; n < B; n++)
            for (int64_t j = 0; j < HW; j++) {
                int64_t i = (n * C + c) * HW + j;
                ASSERT_NEAR(y[i], (x[i] - mean) / sqrt(var + eps) * w[c] + b[c], 1e-5);
            }
    }
    ASSERT_TRUE(nbt[0] == 1.0f);
    /* eval: running statistics, which stay unchanged */
    float rm0[3], rv0[3];
    memcpy(rm0, rm, sizeof rm0), memcpy(rv0, rv, sizeof rv0);
    ctx.training = 0;
    ASSERT_OK(l->ops->forward(l, &ctx, y, x, B));
    for (int64_t i = 0; i < B * C * HW; i++) {
        int64_t c = (i / HW) % C;
        ASSERT_NEAR(y[i], (x[i] - rm[c]) / sqrt(rv[c] + eps) * w[c] + b[c], 1e-5);
    }
    ASSERT_TRUE(memcmp(rm0, rm, sizeof rm0) == 0 && memcmp(rv0, rv, sizeof rv0) == 0);
    ASSERT_TRUE(nbt[0] == 1.0f);
    /* a training batch of one value per channel is refused */
    ctx.training = 1;
    struct dp_model *m1;
    struct dp_shape in1 = dp__shape1(4);
    ASSERT_OK(dp_model_init(&m1, "bn1d", &in1));
    ASSERT_OK(dp_batchnorm2d(m1, "bn", 1e-5f, 0.1f));
    ASSERT_OK(dp_model_finalize(m1));
    struct dp_replica r1;
    ASSERT_OK(dp_replica_init(&r1, m1, 1));
    dp_model_init_params(m1, &r1, 1);
    struct dp_ctx c1 = {.params = r1.params,
                        .grads = r1.grads,
                        .buffers = r1.buffers,
                        .arena = &r1.arena,
                        .saved = r1.saved,
                        .training = 1};
    ASSERT_ERR(m1->layers[0]->ops->forward(m1->layers[0], &c1, y, x, 1), DP_EINVAL,
               "more than one value");
    dp_replica_free(&r1);
    dp_model_free(m1);
    dp_replica_free(&r);
    dp_model_free(m);
}

/* SyncBatchNorm: two workers on half batches, with stat_sync summing over
 * both, match one worker on the whole batch. */
struct sync_group {
    pthread_barrier_t bar;
    double *slot[2];
    double sum[64];
};
struct sync_worker {
    struct sync_group *g;
    int rank;
    struct lt *t;
    int64_t off_in, off_out;
    int rc;
};

static int sync_sum(void *arg, double *buf, int64_t n) {
    struct sync_worker *w = arg;
    struct sync_group *g = w->g;
    if (n > 64) return DP_EINVAL;
    g->slot[w->rank] = buf;
    pthread_barrier_wait(&g->bar);
    if (w->rank == 0)
        for (int64_t i = 0; i < n; i++)
            g->sum[i] = g->slot[0][i] + g->slot[1][i];
    pthread_barrier_wait(&g->bar);
    memcpy(buf, g->sum, sizeof(double) * (size_t)n);
    pthread_barrier_wait(&g->bar);
    return DP_OK;
}

static void *sync_worker_main(void *arg) {
    struct sync_worker *w = arg;
    struct lt *t = w->t;
    dp_arena_reset(&t->r.arena);
    struct dp_ctx c = lt_ctx(t);
    t->y = dp_arena_alloc(&t->r.arena, sizeof(float) * (size_t)t->nout);
    w->rc = t->l->ops->forward(t->l, &c, t->y, t->x, t->B);
    if (!w->rc) w->rc = t->l->ops->backward(t->l, &c, t->dx, t->dy, t->x, t->y, t->B);
    return NULL;
}

TEST(layer_batchnorm_sync_matches_full_batch) {
    const int64_t B = 6, C = 3;
    struct lt full, half[2];
    lt_begin(&full, dp__shape3(C, 3, 2), B);
    ASSERT_OK(dp_batchnorm2d(full.m, "bn", 1e-5f, 0.1f));
    lt_end(&full, 31);
    memset(full.r.grads, 0, sizeof(float) * (size_t)full.m->num_params);
    lt_forward(&full);
    lt_backward(&full, full.dx);
    struct sync_group g;
    pthread_barrier_init(&g.bar, NULL, 2);
    struct sync_worker wk[2];
    pthread_t th[2];
    const int64_t sz = C * 6;
    for (int k = 0; k < 2; k++) {
        lt_begin(&half[k], dp__shape3(C, 3, 2), B / 2);
        ASSERT_OK(dp_batchnorm2d(half[k].m, "bn", 1e-5f, 0.1f));
        lt_end(&half[k], 31); /* same parameters and running stats */
        memcpy(half[k].x, full.x + k * (B / 2) * sz, sizeof(float) * (size_t)half[k].nin);
        memcpy(half[k].dy, full.dy + k * (B / 2) * sz, sizeof(float) * (size_t)half[k].nout);
        memset(half[k].r.grads, 0, sizeof(float) * (size_t)half[k].m->num_params);
        wk[k] = (struct sync_worker){.g = &g, .rank = k, .t = &half[k]};
        half[k].sync = sync_sum;
        half[k].sync_arg = &wk[k];
    }
    for (int k = 0; k < 2; k++)
        pthread_create(&th[k], NULL, sync_worker_main, &wk[k]);
    for (int k = 0; k < 2; k++)
        pthread_join(th[k], NULL);
    pthread_barrier_destroy(&g.bar);
    for (int k = 0; k < 2; k++) {
        ASSERT_OK(wk[k].rc);
        for (int64_t i = 0; i < half[k].nout; i++) {
            ASSERT_NEAR(half[k].y[i], full.y[k * (B / 2) * sz + i], 1e-5);
            ASSERT_NEAR(half[k].dx[i], full.dx[k * (B / 2) * sz + i], 1e-5);
        }
        for (int64_t i = 0; i < full.m->num_buffers; i++)
            ASSERT_NEAR(half[k].r.buffers[i], full.r.buffers[i], 1e-6);
    }
    for (int64_t i = 0; i < full.m->num_params; i++) /* local sums add up to the full ones */
        ASSERT_NEAR(half[0].r.grads[i] + half[1].r.grads[i], full.r.grads[i], 1e-5);
    lt_free(&half[0]), lt_free(&half[1]), lt_free(&full);
}

/* ---- dropout masks ---------------------------------------------------------------- */

TEST(layer_dropout_mask_keyed_by_sample) {
    struct lt t;
    const int64_t n = 256;
    lt_begin(&t, dp__shape1(n), 3);
    ASSERT_OK(dp_dropout(t.m, "drop", 0.5f));
    lt_end(&t, 41);
    for (int64_t i = 0; i < t.nin; i++)
        t.x[i] = 1.0f;
    int64_t a[3] = {5, 9, 2};
    t.batch.sample_idx = a;
    lt_forward(&t);
    float *y1 = malloc(sizeof(float) * (size_t)t.nout);
    memcpy(y1, t.y, sizeof(float) * (size_t)t.nout);
    int64_t kept = 0;
    for (int64_t i = 0; i < t.nout; i++) {
        ASSERT_TRUE(y1[i] == 0.0f || y1[i] == 2.0f);
        kept += y1[i] != 0.0f;
    }
    ASSERT_TRUE(kept > 0.4 * t.nout && kept < 0.6 * t.nout);
    /* sample 9 moves from position 1 to position 0, sample 2 to position 2 */
    int64_t b2[3] = {9, 7, 2};
    t.batch.sample_idx = b2;
    lt_forward(&t);
    ASSERT_TRUE(memcmp(t.y, y1 + n, sizeof(float) * (size_t)n) == 0);
    ASSERT_TRUE(memcmp(t.y + 2 * n, y1 + 2 * n, sizeof(float) * (size_t)n) == 0);
    ASSERT_TRUE(memcmp(t.y + n, y1 + n, sizeof(float) * (size_t)n) != 0); /* sample 7 differs */
    /* another seed, another mask; backward uses the same mask as forward */
    t.seed = 99;
    lt_forward(&t);
    ASSERT_TRUE(memcmp(t.y, y1 + n, sizeof(float) * (size_t)n) != 0);
    lt_backward(&t, t.dx);
    for (int64_t i = 0; i < t.nout; i++)
        ASSERT_TRUE(t.dx[i] == (t.y[i] != 0.0f ? 2.0f * t.dy[i] : 0.0f));
    /* without sample indices the position is the key */
    t.batch.sample_idx = NULL;
    t.seed = 1234;
    lt_forward(&t);
    int64_t c[3] = {0, 1, 2};
    memcpy(y1, t.y, sizeof(float) * (size_t)t.nout);
    t.batch.sample_idx = c;
    lt_forward(&t);
    ASSERT_TRUE(memcmp(t.y, y1, sizeof(float) * (size_t)t.nout) == 0);
    free(y1);
    lt_free(&t);
}

/* The vectorised mask is dp_rng_uniform's, bit for bit: element e of sample s
 * in layer id is kept iff U(seed, DP_RNG_DROPOUT, s, id << 32 | e) >= p. */
TEST(layer_dropout_mask_matches_rng) {
    struct dp_model *m;
    struct dp_shape in = dp__shape2(3, 37);
    ASSERT_OK(dp_model_init(&m, "drop", &in));
    ASSERT_OK(dp_relu(m, "relu"));
    ASSERT_OK(dp_dropout(m, "drop", 0.37f));
    ASSERT_OK(dp_model_finalize(m));
    struct dp_replica r;
    ASSERT_OK(dp_replica_init(&r, m, 4));
    struct dp_layer *l = m->layers[1];
    ASSERT_EQ(l->id, 1);
    const int64_t n = 3 * 37, B = 4;
    int64_t sidx[4] = {0, 7, 5000000000LL, (int64_t)1 << 40};
    struct dp_batch batch = {.B = B, .sample_idx = sidx};
    float x[4 * 111], y[4 * 111];
    for (int64_t i = 0; i < B * n; i++) x[i] = 1.0f;
    for (uint64_t seed = 1; seed < 4; seed++) {
        dp_arena_reset(&r.arena);
        struct dp_ctx c = {.arena = &r.arena, .saved = r.saved, .batch = &batch, .training = 1,
                           .seed = seed * 0x9e3779b97f4a7c15ULL};
        ASSERT_OK(l->ops->forward(l, &c, y, x, B));
        for (int64_t b = 0; b < B; b++)
            for (int64_t e = 0; e < n; e++) {
                float u = dp_rng_uniform(c.seed, DP_RNG_DROPOUT, (uint64_t)sidx[b],
                                         ((uint64_t)1 << 32) | (uint64_t)e);
                ASSERT_EQ(y[b * n + e] != 0.0f, u >= 0.37f);
            }
    }
    dp_replica_free(&r);
    dp_model_free(m);
}

/* ---- softmax cross-entropy --------------------------------------------------------- */

TEST(layer_softmax_xent_matches_double) {
    const int64_t R = 9, V = 13;
    float z[9 * 13], dz[9 * 13];
    int32_t tg[9];
    fill(z, R * V, 51, -4.0f, 4.0f);
    for (int64_t j = 0; j < V; j++)
        z[2 * V + j] += 200.0f; /* stability: a large offset */
    for (int64_t j = 0; j < V; j++)
        z[3 * V + j] -= 300.0f;
    for (int64_t r = 0; r < R; r++)
        tg[r] = (int32_t)(dp_rng_u32(52, DP_RNG_USER, 0, (uint64_t)r) % V);
    tg[4] = 0;
    z[4 * V + 0] = 50.0f; /* a sure hit */
    const float scale = 1.0f / 9.0f;
    double loss;
    int64_t correct;
    ASSERT_OK(dp_softmax_xent(dz, &loss, &correct, z, tg, R, V, scale));
    double ref = 0;
    int64_t hits = 0;
    for (int64_t r = 0; r < R; r++) {
        const float *zr = z + r * V;
        double mx = zr[0];
        int64_t am = 0;
        for (int64_t j = 1; j < V; j++)
            if (zr[j] > mx) mx = zr[j], am = j;
        double s = 0;
        for (int64_t j = 0; j < V; j++)
            s += exp((double)zr[j] - mx);
        ref += log(s) + mx - zr[tg[r]];
        hits += am == tg[r];
        for (int64_t j = 0; j < V; j++) {
            double g = scale * (exp((double)zr[j] - mx) / s - (j == tg[r]));
            ASSERT_NEAR(dz[r * V + j], g, 1e-7);
        }
    }
    ASSERT_NEAR(loss, ref, 1e-5 * fabs(ref));
    ASSERT_EQ(correct, hits);
    ASSERT_TRUE(hits >= 1);
    /* without the gradient */
    double loss2;
    ASSERT_OK(dp_softmax_xent(NULL, &loss2, NULL, z, tg, R, V, scale));
    ASSERT_TRUE(loss2 == loss);
    /* finite differences of scale * loss */
    for (int64_t i = 0; i < R * V; i += 3) {
        float save = z[i];
        double lp, lm;
        z[i] = save + 1e-2f;
        ASSERT_OK(dp_softmax_xent(NULL, &lp, NULL, z, tg, R, V, scale));
        z[i] = save - 1e-2f;
        ASSERT_OK(dp_softmax_xent(NULL, &lm, NULL, z, tg, R, V, scale));
        double e = (double)(save + 1e-2f) - (double)(save - 1e-2f);
        z[i] = save;
        double fd = scale * (lp - lm) / e;
        ASSERT_NEAR(dz[i], fd, 1e-4 + 1e-2 * fabs(fd));
    }
    /* invalid targets */
    tg[5] = (int32_t)V;
    ASSERT_ERR(dp_softmax_xent(dz, &loss, NULL, z, tg, R, V, scale), DP_EINVAL, "row 5: target 13");
    tg[5] = -1;
    ASSERT_ERR(dp_softmax_xent(dz, &loss, NULL, z, tg, R, V, scale), DP_EINVAL, "row 5: target -1");
    ASSERT_ERR(dp_softmax_xent(dz, &loss, NULL, z, NULL, R, V, scale), DP_EINVAL, "targets");
}

/* ---- accumulation, determinism ------------------------------------------------------ */

/* Backward twice after one forward: dx is the same (overwritten), parameter
 * gradients double (accumulated). */
static void accumulate_case(struct lt *t) {
    memset(t->r.grads, 0, sizeof(float) * (size_t)t->m->num_params);
    lt_forward(t);
    lt_backward(t, t->dx);
    int64_t np = t->m->num_params;
    float *g1 = malloc(sizeof(float) * (size_t)np), *dx1 = malloc(sizeof(float) * (size_t)t->nin);
    memcpy(g1, t->r.grads, sizeof(float) * (size_t)np);
    memcpy(dx1, t->dx, sizeof(float) * (size_t)t->nin);
    for (int64_t i = 0; i < t->nin; i++)
        t->dx[i] = 12345.0f;
    lt_backward(t, t->dx);
    for (int64_t i = 0; i < t->nin; i++)
        ASSERT_NEAR(t->dx[i], dx1[i], 1e-5 + 1e-5 * fabs(dx1[i]));
    for (int64_t i = 0; i < np; i++)
        ASSERT_NEAR(t->r.grads[i], 2.0 * g1[i], 1e-5 + 1e-5 * fabs(g1[i]));
    double gn = 0;
    for (int64_t i = 0; i < np; i++)
        gn += fabs(g1[i]);
    ASSERT_TRUE(np == 0 || gn > 0);
    free(g1), free(dx1);
    lt_free(t);
}

TEST(layer_grads_accumulate) {
    struct lt t;
    lt_begin(&t, dp__shape1(6), 3);
    ASSERT_OK(dp_linear(t.m, "fc", 4, 1));
    lt_end(&t, 61);
    accumulate_case(&t);
    lt_begin(&t, dp__shape3(2, 5, 5), 2);
    ASSERT_OK(dp_conv2d(t.m, "conv", 3, 3, 1, 1, 1));
    lt_end(&t, 62);
    accumulate_case(&t);
    lt_begin(&t, dp__shape3(2, 5, 5), 2);
    ASSERT_OK(dp_batchnorm2d(t.m, "bn", 1e-5f, 0.1f));
    lt_end(&t, 63);
    accumulate_case(&t);
    lt_begin(&t, dp__shape2(3, 6), 2);
    ASSERT_OK(dp_layernorm(t.m, "ln", 1e-5f));
    lt_end(&t, 64);
    accumulate_case(&t);
    lt_begin(&t, dp__shape3(2, 6, 6), 2);
    ASSERT_OK(dp_resblock(t.m, "layer1.0", 3, 2));
    lt_end(&t, 65);
    accumulate_case(&t);
}

/* Bit-identical results for 1 and 2 threads (sizes above the OpenMP
 * threshold; for the convolutions this also relies on the GEMM library
 * giving the same bits for the same single-threaded call). */
static void run_threads(struct lt *t, int nth, float *out) {
    dp_set_num_threads(nth);
    memset(t->r.grads, 0, sizeof(float) * (size_t)t->m->num_params);
    lt_forward(t);
    lt_backward(t, t->dx);
    memcpy(out, t->y, sizeof(float) * (size_t)t->nout);
    memcpy(out + t->nout, t->dx, sizeof(float) * (size_t)t->nin);
    memcpy(out + t->nout + t->nin, t->r.grads, sizeof(float) * (size_t)t->m->num_params);
}

static void thread_case(struct lt *t) {
    int64_t n = t->nout + t->nin + t->m->num_params;
    float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n);
    run_threads(t, 1, a);
    run_threads(t, 2, b);
    if (memcmp(a, b, sizeof(float) * (size_t)n) != 0)
        dp_test_fail(__FILE__, __LINE__, "%s differs between 1 and 2 threads", t->l->name);
    dp_set_num_threads(1);
    free(a), free(b);
    lt_free(t);
}

TEST(layer_deterministic_across_threads) {
    struct lt t;
    lt_begin(&t, dp__shape3(16, 32, 32), 4);
    ASSERT_OK(dp_batchnorm2d(t.m, "bn", 1e-5f, 0.1f));
    lt_end(&t, 71);
    thread_case(&t);
    lt_begin(&t, dp__shape2(64, 256), 4);
    ASSERT_OK(dp_layernorm(t.m, "ln", 1e-5f));
    lt_end(&t, 72);
    thread_case(&t);
    lt_begin(&t, dp__shape3(8, 32, 32), 4);
    ASSERT_OK(dp_maxpool2d(t.m, "pool", 2, 2));
    lt_end(&t, 73);
    thread_case(&t);
    /* convolutions: 16 one-sample chunks, spread over the threads with 2 */
    lt_begin(&t, dp__shape3(3, 24, 24), 16);
    ASSERT_OK(dp_conv2d(t.m, "conv", 8, 3, 1, 1, 1));
    lt_end(&t, 75);
    thread_case(&t);
    lt_begin(&t, dp__shape3(4, 24, 24), 16);
    ASSERT_OK(dp_resblock(t.m, "layer1.0", 6, 2));
    lt_end(&t, 76);
    thread_case(&t);
    /* loss over many rows */
    const int64_t R = 700, V = 100;
    float *z = malloc(sizeof(float) * R * V), *d1 = malloc(sizeof(float) * R * V),
          *d2 = malloc(sizeof(float) * R * V);
    int32_t *tg = malloc(sizeof(int32_t) * R);
    fill(z, R * V, 74, -5.0f, 5.0f);
    for (int64_t r = 0; r < R; r++)
        tg[r] = (int32_t)(r % V);
    double l1, l2;
    dp_set_num_threads(1);
    ASSERT_OK(dp_softmax_xent(d1, &l1, NULL, z, tg, R, V, 1.0f / R));
    dp_set_num_threads(2);
    ASSERT_OK(dp_softmax_xent(d2, &l2, NULL, z, tg, R, V, 1.0f / R));
    dp_set_num_threads(1);
    ASSERT_TRUE(l1 == l2);
    ASSERT_TRUE(memcmp(d1, d2, sizeof(float) * R * V) == 0);
    free(z), free(d1), free(d2), free(tg);
}

/* ---- through dp_model_run --------------------------------------------------------- */

TEST(layer_small_cnn_through_model_run) {
    struct dp_model *m;
    struct dp_shape in = dp__shape3(1, 8, 8);
    ASSERT_OK(dp_model_init(&m, "tiny", &in));
    ASSERT_OK(dp_conv2d(m, "conv1", 4, 3, 1, 1, 0));
    ASSERT_OK(dp_batchnorm2d(m, "bn1", 1e-5f, 0.1f));
    ASSERT_OK(dp_relu(m, "relu"));
    ASSERT_OK(dp_resblock(m, "layer1.0", 6, 2));
    ASSERT_OK(dp_maxpool2d(m, "pool", 2, 2));
    ASSERT_OK(dp_flatten(m, "flatten"));
    ASSERT_OK(dp_dropout(m, "drop", 0.25f));
    ASSERT_OK(dp_linear(m, "fc1", 16, 1));
    ASSERT_OK(dp_gelu(m, "gelu"));
    ASSERT_OK(dp_layernorm(m, "ln", 1e-5f));
    ASSERT_OK(dp_linear(m, "fc2", 5, 1));
    ASSERT_OK(dp_model_finalize(m));
    ASSERT_EQ(dp_model_num_classes(m), 5);
    ASSERT_TRUE(m->flops_fwd > 2 * 4 * 9 * 64);
    /* PyTorch's default initialisation bounds */
    const struct dp_param_info *p = dp_model_find_param(m, "conv1.weight");
    ASSERT_TRUE(p && p->init == DP_INIT_UNIFORM);
    ASSERT_NEAR(p->init_a, 1.0 / 3.0, 1e-7);
    p = dp_model_find_param(m, "fc1.weight");
    ASSERT_TRUE(p && p->shape.d[0] == 16 && p->shape.d[1] == 24);
    ASSERT_NEAR(p->init_a, 1.0 / sqrt(24.0), 1e-7);
    ASSERT_NEAR(dp_model_find_param(m, "fc1.bias")->init_a, 1.0 / sqrt(24.0), 1e-7);

    const int64_t B = 6;
    struct dp_replica r;
    ASSERT_OK(dp_replica_init(&r, m, B));
    dp_model_init_params(m, &r, 5);
    float x[6 * 64];
    int32_t tg[6];
    int64_t sidx[6];
    fill(x, B * 64, 81, -1.0f, 1.0f);
    for (int64_t b = 0; b < B; b++)
        tg[b] = (int32_t)(b % 5), sidx[b] = 10 + b;
    struct dp_batch batch = {.B = B, .x = x, .targets = tg, .sample_idx = sidx};
    float *g1 = malloc(sizeof(float) * (size_t)m->num_params);
    double loss1 = 0;
    for (int rep = 0; rep < 2; rep++) {
        memset(r.grads, 0, sizeof(float) * (size_t)m->num_params);
        struct dp_pass pass = {.training = 1, .seed = 3, .backward = 1};
        ASSERT_OK(dp_model_run(m, &r, &batch, &pass));
        ASSERT_TRUE(isfinite(pass.loss_sum) && pass.loss_sum > 0);
        double gn = 0;
        for (int64_t i = 0; i < m->num_params; i++) {
            ASSERT_TRUE(isfinite(r.grads[i]));
            gn += fabs(r.grads[i]);
        }
        ASSERT_TRUE(gn > 0);
        if (rep == 0) {
            memcpy(g1, r.grads, sizeof(float) * (size_t)m->num_params);
            loss1 = pass.loss_sum;
        } else { /* the same step again gives the same result */
            ASSERT_TRUE(pass.loss_sum == loss1);
            ASSERT_TRUE(memcmp(g1, r.grads, sizeof(float) * (size_t)m->num_params) == 0);
        }
    }
    struct dp_pass ev = {.training = 0};
    ASSERT_OK(dp_model_run(m, &r, &batch, &ev));
    ASSERT_TRUE(isfinite(ev.loss_sum));
    free(g1);
    dp_replica_free(&r);
    dp_model_free(m);
}

/* Fusion (dp_model_finalize): a ReLU after conv2d or linear is applied in that layer's
 * epilogue and its dy masked there; the pass skips the ReLU layer.  The fused model gives the
 * unfused one's bits: logits, loss and every gradient, on 1 and 2 threads, with the convolution
 * cut into chunks of one sample (the n == 1 paths), of ~512 columns, and whole, and with conv2
 * on oneDNN's blocked kernels (16 input channels) where they are built in. */
static struct dp_model *fusion_model(int fuse) {
    struct dp_model *m;
    struct dp_shape in = dp__shape3(2, 12, 12);
    if (dp_model_init(&m, "fusion", &in)) return NULL;
    int rc = dp_model_set_fusion(m, fuse);
    if (!rc) rc = dp_conv2d(m, "conv1", 16, 3, 1, 1, 1); /* "same": the masked im2col */
    if (!rc) rc = dp_relu(m, "relu1");
    if (!rc) rc = dp_maxpool2d(m, "pool", 2, 2);
    if (!rc) rc = dp_conv2d(m, "conv2", 5, 3, 2, 1, 1); /* strided, 3x3 planes; 16 channels: oneDNN's */
    if (!rc) rc = dp_relu(m, "relu2");
    if (!rc) rc = dp_conv2d(m, "conv3", 4, 1, 1, 0, 0); /* no bias */
    if (!rc) rc = dp_relu(m, "relu3");
    if (!rc) rc = dp_flatten(m, "flatten");
    if (!rc) rc = dp_linear(m, "fc1", 9, 1);
    if (!rc) rc = dp_relu(m, "relu4");
    if (!rc) rc = dp_relu(m, "relu5"); /* after a fused ReLU: runs as written */
    if (!rc) rc = dp_linear(m, "fc2", 7, 1);
    if (!rc) rc = dp_relu(m, "relu6"); /* the logits themselves */
    if (!rc) rc = dp_model_finalize(m);
    if (rc) {
        dp_model_free(m);
        return NULL;
    }
    return m;
}

/* Trains one step of B = 7 samples (in floats each) through the fused model mf and the unfused
 * mu, on 1 and 2 threads with the convolutions cut into chunks of one sample, of ~512 columns
 * and whole: the same logits (7 classes), loss, gradients and buffers. */
static void expect_fused_same_bits(struct dp_model *mf, struct dp_model *mu, int64_t in) {
    ASSERT_TRUE(mf->desc && mu->desc && !strcmp(mf->desc, mu->desc)); /* the same text */
    ASSERT_ERR(dp_model_set_fusion(mf, 0), DP_EINVAL, "before finalize");
    const int64_t B = 7;
    struct dp_replica rf, ru;
    ASSERT_OK(dp_replica_init(&rf, mf, B));
    ASSERT_OK(dp_replica_init(&ru, mu, B));
    dp_model_init_params(mf, &rf, 11);
    dp_model_init_params(mu, &ru, 11);
    float *x = malloc(sizeof(float) * (size_t)(B * in));
    int32_t tg[7];
    int64_t sidx[7];
    fill(x, B * in, 5, -1.0f, 1.0f);
    for (int64_t i = 0; i < B * in; i += 13) x[i] = 0.0f; /* exact zeros before the ReLUs too */
    for (int64_t b = 0; b < B; b++) tg[b] = (int32_t)(b % 7), sidx[b] = b;
    struct dp_batch batch = {.B = B, .x = x, .targets = tg, .sample_idx = sidx};
    const size_t np = sizeof(float) * (size_t)mf->num_params, nb = sizeof(float) * (size_t)mf->num_buffers;
    const int64_t chunks[3] = {1, 512, 0};
    for (int nth = 1; nth <= 2; nth++)
        for (int c = 0; c < 3; c++) {
            dp_set_num_threads(nth);
            dp__conv2d_set_chunk_cols(chunks[c]);
            memset(rf.grads, 0, np), memset(ru.grads, 0, np);
            struct dp_pass pf = {.training = 1, .seed = 3, .backward = 1}, pu = pf;
            ASSERT_OK(dp_model_run(mf, &rf, &batch, &pf));
            ASSERT_OK(dp_model_run(mu, &ru, &batch, &pu));
            ASSERT_TRUE(pf.loss_sum == pu.loss_sum && isfinite(pf.loss_sum));
            ASSERT_TRUE(!memcmp(rf.acts[mf->nlayers], ru.acts[mu->nlayers], sizeof(float) * 7 * 7));
            ASSERT_TRUE(!memcmp(rf.grads, ru.grads, np));
            ASSERT_TRUE(!nb || !memcmp(rf.buffers, ru.buffers, nb));
            int64_t nz = 0;
            for (int64_t i = 0; i < mf->num_params; i++) nz += rf.grads[i] != 0.0f;
            ASSERT_TRUE(nz > mf->num_params / 2); /* the gradients are not all masked away */
            struct dp_pass ef = {.training = 0}, eu = ef; /* evaluation: the running statistics */
            ASSERT_OK(dp_model_run(mf, &rf, &batch, &ef));
            ASSERT_OK(dp_model_run(mu, &ru, &batch, &eu));
            ASSERT_TRUE(ef.loss_sum == eu.loss_sum && isfinite(ef.loss_sum));
        }
    dp_set_num_threads(1);
    dp__conv2d_set_chunk_cols(512);
    free(x);
    dp_replica_free(&rf);
    dp_replica_free(&ru);
    dp_model_free(mf);
    dp_model_free(mu);
}

TEST(layer_fused_relu_same_bits) {
    struct dp_model *mf = fusion_model(1), *mu = fusion_model(0);
    ASSERT_TRUE(mf && mu);
    const int want[13] = {0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 1};
    ASSERT_EQ(mf->nlayers, 13);
    for (int i = 0; i < mf->nlayers; i++) {
        ASSERT_EQ(mf->layers[i]->fused, want[i]);
        ASSERT_EQ(mu->layers[i]->fused, 0);
    }
    expect_fused_same_bits(mf, mu, 2 * 12 * 12);
}

/* BatchNorm with the ReLU after it: at the top level (bn, relu) and inside the residual
 * blocks (bn1 and its ReLU, fused by the block's fuse_inner), one with the identity shortcut
 * and one with the downsampling one.  The mask is recomputed from x in backward. */
static struct dp_model *fusion_bn_model(int fuse) {
    struct dp_model *m;
    struct dp_shape in = dp__shape3(3, 8, 8);
    if (dp_model_init(&m, "fusion_bn", &in)) return NULL;
    int rc = dp_model_set_fusion(m, fuse);
    if (!rc) rc = dp_conv2d(m, "conv", 16, 3, 1, 1, 0);
    if (!rc) rc = dp_batchnorm2d(m, "bn", 1e-5f, 0.1f);
    if (!rc) rc = dp_relu(m, "relu");
    if (!rc) rc = dp_resblock(m, "layer1", 16, 1);
    if (!rc) rc = dp_resblock(m, "layer2", 32, 2);
    if (!rc) rc = dp_flatten(m, "flatten");
    if (!rc) rc = dp_linear(m, "fc", 7, 1);
    if (!rc) rc = dp_model_finalize(m);
    if (rc) {
        dp_model_free(m);
        return NULL;
    }
    return m;
}

TEST(layer_fused_bn_relu_same_bits) {
    struct dp_model *mf = fusion_bn_model(1), *mu = fusion_bn_model(0);
    ASSERT_TRUE(mf && mu);
    const int want[7] = {0, 0, 1, 0, 0, 0, 0};
    ASSERT_EQ(mf->nlayers, 7);
    for (int i = 0; i < mf->nlayers; i++) {
        ASSERT_EQ(mf->layers[i]->fused, want[i]);
        ASSERT_EQ(mu->layers[i]->fused, 0);
    }
    expect_fused_same_bits(mf, mu, 3 * 8 * 8);
}

/* ---- constructor errors ------------------------------------------------------------- */

TEST(layer_constructor_errors) {
    struct dp_model *m;
    struct dp_shape img = dp__shape3(2, 3, 3);
    ASSERT_OK(dp_model_init(&m, "err", &img));
    ASSERT_ERR(dp_conv2d(m, "conv", 4, 5, 1, 0, 1), DP_EINVAL, "larger than padded input");
    ASSERT_ERR(dp_conv2d(m, "conv", 4, 3, 0, 0, 1), DP_EINVAL, "stride 0");
    ASSERT_ERR(dp_maxpool2d(m, "pool", 4, 4), DP_EINVAL, "larger than input");
    ASSERT_ERR(dp_linear(m, "fc", 4, 1), DP_EINVAL, "flatten first");
    ASSERT_ERR(dp_dropout(m, "drop", 1.5f), DP_EINVAL, "outside [0, 1]");
    ASSERT_ERR(dp_batchnorm2d(m, "bn", 0.0f, 0.1f), DP_EINVAL, "eps");
    ASSERT_ERR(dp_resblock(m, "a_block_name_long_enough_to_overflow_the_child_name_buffer_x", 4, 1),
               DP_EINVAL, "name too long");
    /* failed constructors leave the model unchanged */
    ASSERT_EQ(m->nlayers, 0);
    ASSERT_EQ(m->nparams, 0);
    ASSERT_EQ(m->num_params, 0);
    ASSERT_EQ(m->num_buffers, 0);
    ASSERT_EQ(m->nids, 0);
    ASSERT_OK(dp_conv2d(m, "conv", 4, 3, 1, 1, 1));
    ASSERT_OK(dp_flatten(m, "flat"));
    ASSERT_ERR(dp_maxpool2d(m, "pool", 2, 2), DP_EINVAL, "expected (C, H, W)");
    ASSERT_ERR(dp_global_avgpool(m, "gap"), DP_EINVAL, "expected (C, H, W)");
    ASSERT_ERR(dp_conv2d(m, "conv2", 4, 1, 1, 0, 1), DP_EINVAL, "expected (C, H, W)");
    ASSERT_ERR(dp_resblock(m, "layer1.0", 4, 1), DP_EINVAL, "expected (C, H, W)");
    ASSERT_EQ(m->nlayers, 2);
    ASSERT_EQ(m->num_params, 4 * 2 * 9 + 4);
    ASSERT_OK(dp_linear(m, "fc", 3, 1));
    ASSERT_OK(dp_model_finalize(m));
    ASSERT_ERR(dp_relu(m, "late"), DP_EINVAL, "after finalize");
    dp_model_free(m);
}

/* ---- allocation failures ---------------------------------------------------------- */

/* Counts live blocks and fails the allocation numbered fail_at (-1: none). */
static int64_t live_blocks, alloc_count, fail_at = -1;
static void *count_alloc(size_t size, void *user) {
    (void)user;
    if (alloc_count++ == fail_at) return NULL;
    void *p = NULL;
    if (posix_memalign(&p, 64, (size + 63) & ~(size_t)63) != 0) return NULL;
    live_blocks++;
    return p;
}
static void count_free(void *p, void *user) {
    (void)user;
    live_blocks--;
    free(p);
}

static int build_all_layers(struct dp_model **out) {
    struct dp_shape in = dp__shape3(2, 8, 8);
    struct dp_model *m;
    int rc = dp_model_init(&m, "all", &in);
    if (rc) return rc;
    if (!rc) rc = dp_conv2d(m, "conv1", 4, 3, 1, 1, 0);
    if (!rc) rc = dp_batchnorm2d(m, "bn1", 1e-5f, 0.1f);
    if (!rc) rc = dp_relu(m, "relu");
    if (!rc) rc = dp_resblock(m, "layer1.0", 4, 1);
    if (!rc) rc = dp_resblock(m, "layer2.0", 6, 2);
    if (!rc) rc = dp_maxpool2d(m, "pool", 2, 2);
    if (!rc) rc = dp_global_avgpool(m, "gap");
    if (!rc) rc = dp_dropout(m, "drop", 0.1f);
    if (!rc) rc = dp_linear(m, "fc1", 8, 1);
    if (!rc) rc = dp_gelu(m, "gelu");
    if (!rc) rc = dp_layernorm(m, "ln", 1e-5f);
    if (!rc) rc = dp_linear(m, "fc2", 3, 1);
    if (!rc) rc = dp_model_finalize(m);
    if (rc) {
        dp_model_free(m);
        return rc;
    }
    *out = m;
    return DP_OK;
}

/* Every constructor frees what it made when an allocation fails (tried at
 * every allocation in turn), and a model frees all its layers. */
TEST(layer_constructors_survive_allocation_failures) {
    struct dp_allocator counting = {count_alloc, count_free, NULL};
    dp_set_allocator(&counting);
    struct dp_model *m = NULL;
    alloc_count = 0, fail_at = -1;
    ASSERT_OK(build_all_layers(&m));
    const int64_t total = alloc_count;
    dp_model_free(m);
    ASSERT_EQ(live_blocks, 0);
    for (int64_t k = 0; k < total; k++) {
        alloc_count = 0, fail_at = k;
        m = NULL;
        int rc = build_all_layers(&m);
        ASSERT_EQ(rc, DP_ENOMEM);
        ASSERT_EQ(live_blocks, 0);
    }
    fail_at = -1;
    dp_set_allocator(NULL);
}

/* ---- transformer layers (GPT) ------------------------------------------------------
 * Each layer alone against finite differences (tiny sizes: T 4..5, D 8, 2
 * heads, V 11), forward values against direct double-precision formulas
 * where the FD check cannot see them (a wrong scale or a missing residual
 * would be differentiated consistently), the causal mask, and the whole
 * tiny model end to end through dp_model_run. */

/* dp__normcdf against double precision, as the exact GELU uses it: over
 * [-5.6, 5.6] Phi(x) and x Phi(x) within 8 ulp (measured 5.9 and 6.3), over
 * [-12, 12] x Phi(x) within 1e-6 absolute and the derivative Phi + x phi within
 * 4e-7 absolute (it crosses 0, so ulps mean nothing there; measured 3.8e-7 and
 * 1.8e-7), and the special values.  1 + erff(x / sqrt 2) in float fails the
 * first check by far in the negative tail (cancellation). */
static double ulps_off(float got, double want) {
    float w = (float)want, aw = fabsf(w);
    double ulp = (double)nextafterf(aw, INFINITY) - aw;
    return fabs((double)got - want) / ulp;
}

TEST(gelu_normcdf_matches_double) {
    double worst_cdf = 0, worst_y = 0, worst_abs = 0, worst_d = 0;
    for (int i = -6000000; i <= 6000000; i++) {
        float x = (float)i * 2e-6f, g;
        float c = dp__normcdf(x, &g);
        double C = 0.5 * erfc(-(double)x / sqrt(2.0));
        double dC = C + (double)x * exp(-0.5 * (double)x * x) / sqrt(2.0 * M_PI);
        if (fabsf(x) < 5.6f) {
            worst_cdf = fmax(worst_cdf, ulps_off(c, C));
            worst_y = fmax(worst_y, ulps_off(x * c, (double)x * C));
        }
        worst_abs = fmax(worst_abs, fabs((double)(x * c) - (double)x * C));
        worst_d = fmax(worst_d, fabs((double)(c + x * (0.39894228040143268f * g)) - dC));
    }
    fprintf(stderr, "    Phi %.2f ulp, x Phi %.2f ulp, |x Phi| err %.3g, derivative err %.3g\n",
            worst_cdf, worst_y, worst_abs, worst_d);
    ASSERT_TRUE(worst_cdf <= 8.0);
    ASSERT_TRUE(worst_y <= 8.0);
    ASSERT_TRUE(worst_abs <= 1e-6);
    ASSERT_TRUE(worst_d <= 4e-7);
    float g;
    ASSERT_FEQ(dp__normcdf(INFINITY, &g), 1.0f);
    ASSERT_FEQ(dp__normcdf(-INFINITY, &g), 0.0f);
    ASSERT_FEQ(dp__normcdf(0.0f, &g), 0.5f);
    ASSERT_FEQ(g, 1.0f);
    ASSERT_FEQ(-1e30f * dp__normcdf(-1e30f, &g), 0.0f);
    ASSERT_TRUE(isnan(dp__normcdf(NAN, &g)));
}

TEST(layer_gelu_erf_grad) {
    struct lt t;
    lt_begin(&t, dp__shape2(3, 8), 2);
    ASSERT_OK(dp_gelu_erf(t.m, "gelu"));
    lt_end(&t, 21);
    for (int64_t i = 0; i < t.nin; i++) /* spread over [-3, 3] */
        t.x[i] *= 3.0f;
    lt_forward(&t);
    for (int64_t i = 0; i < t.nin; i++) { /* exact GELU, not the tanh approximation */
        double v = t.x[i];
        ASSERT_NEAR(t.y[i], 0.5 * v * (1.0 + erf(v / sqrt(2.0))), 1e-6);
    }
    lt_check_grads(&t, 0);
    lt_free(&t);
}

/* The transformer block's fc and GELU fused into the GEMM's tiles (dp__linear_forward_gelu:
 * g = GELU(x W^T + b), GELU' kept in y's place; dp__linear_backward_mul: dx times the kept GELU'
 * as its tiles are written) give the unfused layers' bits: the Linear's y and backward, then
 * the gelu_erf layer's expressions over y.  300 rows x 300 features x 64 are two GEMM tiles (one
 * short); inputs spread over [-12, 12] reach both tails.  Whole and in slices of output
 * features (ZeRO-3's dp_model_set_unit), on 1 and 2 threads. */
TEST(layer_linear_gelu_fused_same_bits) {
    const int64_t T = 60, IN = 64, OUT = 300, B = 5;
    struct lt t;
    lt_begin(&t, dp__shape2(T, IN), B);
    ASSERT_OK(dp_linear(t.m, "fc", OUT, 1));
    lt_end(&t, 23);
    for (int64_t i = 0; i < t.nin; i++) t.x[i] *= 12.0f;
    const int64_t ny = t.nout, nx = t.nin, np = t.m->num_params;
    float *y = malloc(sizeof(float) * (size_t)ny), *g = malloc(sizeof(float) * (size_t)ny);
    float *d = malloc(sizeof(float) * (size_t)ny), *dx = malloc(sizeof(float) * (size_t)nx);
    float *mul = malloc(sizeof(float) * (size_t)nx), *gw = malloc(sizeof(float) * (size_t)np);
    float *yf = malloc(sizeof(float) * (size_t)ny), *gf = malloc(sizeof(float) * (size_t)ny);
    float *dxf = malloc(sizeof(float) * (size_t)nx);
    fill(mul, nx, 77, -2.0f, 2.0f);
    for (int sliced = 0; sliced < 2; sliced++) {
        /* the unfused layers (dx is summed over the slices: their bits are the sliced layer's) */
        dp_set_num_threads(1);
        t.l->slice_rows = sliced ? 128 : 0;
        memset(t.r.grads, 0, sizeof(float) * (size_t)np);
        lt_forward(&t);
        lt_backward(&t, dx);
        memcpy(gw, t.r.grads, sizeof(float) * (size_t)np);
        for (int64_t i = 0; i < ny; i++) y[i] = t.y[i], g[i] = dp__gelu_erf1(y[i], &d[i]);
        for (int64_t i = 0; i < nx; i++) dx[i] *= mul[i];
        int spread = 0;
        for (int64_t i = 0; i < ny; i++) spread |= (y[i] < -6.0f) | (y[i] > 6.0f) << 1;
        ASSERT_EQ(spread, 3);
        for (int th = 1; th <= 2; th++) {
            dp_set_num_threads(th);
            struct dp_ctx c = lt_ctx(&t);
            memset(t.r.grads, 0, sizeof(float) * (size_t)np);
            memset(yf, 0xff, sizeof(float) * (size_t)ny); /* NaNs: the GEMM must not read them */
            ASSERT_OK(dp__linear_forward_gelu(t.l, &c, yf, gf, t.x, B));
            ASSERT_OK(dp__linear_backward_mul(t.l, &c, dxf, mul, t.dy, t.x, B));
            ASSERT_TRUE(!memcmp(yf, d, sizeof(float) * (size_t)ny));
            ASSERT_TRUE(!memcmp(gf, g, sizeof(float) * (size_t)ny));
            ASSERT_TRUE(!memcmp(dxf, dx, sizeof(float) * (size_t)nx));
            ASSERT_TRUE(!memcmp(t.r.grads, gw, sizeof(float) * (size_t)np));
        }
    }
    t.l->slice_rows = 0;
    dp_set_num_threads(1);
    free(y), free(g), free(d), free(dx), free(mul), free(gw), free(yf), free(gf), free(dxf);
    lt_free(&t);
}

/* tokens (B, T) in [0, V) with repeats, so the scatter-add accumulates */
static void fill_tokens(int32_t *tok, int64_t n, uint64_t seed, int32_t V) {
    for (int64_t i = 0; i < n; i++)
        tok[i] = (int32_t)(dp_rng_uniform(seed, DP_RNG_USER, 9, (uint64_t)i) * (float)V) % V;
    tok[n - 1] = tok[0];
}

TEST(layer_embedding_grad) {
    const int64_t B = 2, T = 5, V = 11, D = 8;
    struct lt t;
    int32_t tok[10];
    lt_begin(&t, dp__shape1(T), B);
    ASSERT_OK(dp_tokpos_embedding(t.m, "tok", "pos", V, 6, D));
    lt_end(&t, 22);
    fill_tokens(tok, B * T, 3, (int32_t)V);
    t.batch.tokens = tok;
    const struct dp_param_info *tw = dp_model_find_param(t.m, "tok.weight");
    const struct dp_param_info *pw = dp_model_find_param(t.m, "pos.weight");
    ASSERT_TRUE(tw && pw && tw->offset == 0 && pw->offset == V * D);
    ASSERT_EQ(tw->shape.d[0], V);
    ASSERT_EQ(pw->shape.d[0], 6);
    ASSERT_TRUE(tw->init == DP_INIT_NORMAL && tw->init_a == 0.02f);
    ASSERT_EQ(t.l->param_count, (V + 6) * D);
    ASSERT_EQ(t.l->out_shape.ndim, 2);
    ASSERT_EQ(t.l->out_shape.d[1], D);
    lt_forward(&t);
    for (int64_t b = 0; b < B; b++) /* y[t] = tok[id] + pos[t] */
        for (int64_t i = 0; i < T; i++)
            for (int64_t j = 0; j < D; j++)
                ASSERT_FEQ(t.y[(b * T + i) * D + j], t.r.params[tw->offset + tok[b * T + i] * D + j] +
                                                         t.r.params[pw->offset + i * D + j]);
    lt_check_grads(&t, 0); /* x is unused: its gradient is zero */
    tok[3] = (int32_t)V;
    struct dp_ctx c = lt_ctx(&t);
    ASSERT_ERR(t.l->ops->forward(t.l, &c, t.y, NULL, B), DP_EINVAL, "outside [0, 11)");
    lt_free(&t);
}

/* Direct attention in double: y (B, T, D) from x and the layer's parameters. */
static void attention_ref(double *y, const double *x, const float *prm, int64_t B, int64_t T,
                          int64_t D, int64_t H) {
    const float *wq = prm, *bq = wq + 3 * D * D, *wp = bq + 3 * D, *bp = wp + D * D;
    const int64_t dh = D / H;
    double *qkv = malloc(sizeof(double) * (size_t)(T * 3 * D));
    double *att = malloc(sizeof(double) * (size_t)(T * D));
    double s[128]; /* one row of scores: T <= 128 */
    ASSERT_TRUE(T <= 128);
    for (int64_t b = 0; b < B; b++) {
        const double *xb = x + b * T * D;
        for (int64_t i = 0; i < T; i++)
            for (int64_t o = 0; o < 3 * D; o++) {
                double a = bq[o];
                for (int64_t k = 0; k < D; k++) a += (double)wq[o * D + k] * xb[i * D + k];
                qkv[i * 3 * D + o] = a;
            }
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < T; i++) {
                double mx = -1e300, z = 0;
                for (int64_t j = 0; j <= i; j++) {
                    double a = 0;
                    for (int64_t e = 0; e < dh; e++)
                        a += qkv[i * 3 * D + h * dh + e] * qkv[j * 3 * D + D + h * dh + e];
                    s[j] = a / sqrt((double)dh);
                    mx = fmax(mx, s[j]);
                }
                for (int64_t j = 0; j <= i; j++) s[j] = exp(s[j] - mx), z += s[j];
                for (int64_t e = 0; e < dh; e++) {
                    double a = 0;
                    for (int64_t j = 0; j <= i; j++) a += s[j] / z * qkv[j * 3 * D + 2 * D + h * dh + e];
                    att[i * D + h * dh + e] = a;
                }
            }
        for (int64_t i = 0; i < T; i++)
            for (int64_t o = 0; o < D; o++) {
                double a = bp[o];
                for (int64_t k = 0; k < D; k++) a += (double)wp[o * D + k] * att[i * D + k];
                y[(b * T + i) * D + o] = a;
            }
    }
    free(qkv), free(att);
}

TEST(layer_attention_grad) {
    const int64_t B = 2, T = 5, D = 8, H = 2;
    struct lt t;
    lt_begin(&t, dp__shape2(T, D), B);
    ASSERT_OK(dp_attention(t.m, "attn", (int)H));
    lt_end(&t, 23);
    const struct dp_param_info *q = dp_model_find_param(t.m, "attn.qkv.weight");
    ASSERT_TRUE(q && q->shape.d[0] == 3 * D && q->shape.d[1] == D && q->init == DP_INIT_NORMAL);
    ASSERT_TRUE(dp_model_find_param(t.m, "attn.qkv.bias")->init == DP_INIT_ZERO);
    ASSERT_TRUE(dp_model_find_param(t.m, "attn.proj.weight") != NULL);
    ASSERT_EQ(t.l->param_count, 3 * D * D + 3 * D + D * D + D);
    lt_forward(&t);
    double ref[2 * 5 * 8], xd[2 * 5 * 8];
    for (int64_t i = 0; i < t.nin; i++) xd[i] = t.x[i];
    attention_ref(ref, xd, t.r.params + t.l->param_off, B, T, D, H);
    for (int64_t i = 0; i < t.nout; i++)
        ASSERT_NEAR(t.y[i], ref[i], 1e-5 + 1e-5 * fabs(ref[i]));
    lt_check_grads(&t, 0);
    lt_free(&t);
}

/* Longer than the causal row block (32) and not a multiple of it: T = 70 is
 * blocks 32, 32, 6, so every product runs its skipped-triangle path (rows
 * [i0, i1) against columns [0, i1), and the transposed ones against rows
 * [i0, T)).  Forward against the double reference, gradients by FD. */
TEST(layer_attention_causal_blocks) {
    const int64_t B = 1, T = 70, D = 8, H = 2;
    struct lt t;
    lt_begin(&t, dp__shape2(T, D), B);
    ASSERT_OK(dp_attention(t.m, "attn", (int)H));
    lt_end(&t, 25);
    lt_forward(&t);
    double *ref = malloc(sizeof(double) * (size_t)t.nout), *xd = malloc(sizeof(double) * (size_t)t.nin);
    ASSERT_TRUE(ref && xd);
    for (int64_t i = 0; i < t.nin; i++) xd[i] = t.x[i];
    attention_ref(ref, xd, t.r.params + t.l->param_off, B, T, D, H);
    for (int64_t i = 0; i < t.nout; i++)
        ASSERT_NEAR(t.y[i], ref[i], 1e-5 + 1e-5 * fabs(ref[i]));
    lt_check_grads(&t, 0);
    free(ref);
    free(xd);
    lt_free(&t);
}

/* Position i's output depends on positions <= i only: changing the last
 * position's input leaves every earlier output bit for bit unchanged (and
 * does change the last); a gradient at position 0 alone reaches the input at
 * position 0 alone. */
TEST(layer_attention_causal_mask) {
    const int64_t B = 2, T = 5, D = 8;
    struct lt t;
    lt_begin(&t, dp__shape2(T, D), B);
    ASSERT_OK(dp_attention(t.m, "attn", 2));
    lt_end(&t, 24);
    lt_forward(&t);
    float *y0 = malloc(sizeof(float) * (size_t)t.nout);
    memcpy(y0, t.y, sizeof(float) * (size_t)t.nout);
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < D; j++) t.x[(b * T + T - 1) * D + j] += 0.5f;
    lt_forward(&t);
    for (int64_t b = 0; b < B; b++) {
        ASSERT_TRUE(memcmp(t.y + b * T * D, y0 + b * T * D, sizeof(float) * (size_t)((T - 1) * D)) == 0);
        ASSERT_TRUE(memcmp(t.y + (b * T + T - 1) * D, y0 + (b * T + T - 1) * D, sizeof(float) * (size_t)D) != 0);
    }
    memset(t.dy, 0, sizeof(float) * (size_t)t.nout);
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < D; j++) t.dy[b * T * D + j] = 1.0f;
    lt_backward(&t, t.dx);
    for (int64_t b = 0; b < B; b++) {
        double g0 = 0;
        for (int64_t j = 0; j < D; j++) g0 += fabs(t.dx[b * T * D + j]);
        ASSERT_TRUE(g0 > 0);
        for (int64_t i = D; i < T * D; i++) ASSERT_FEQ(t.dx[b * T * D + i], 0.0f);
    }
    free(y0);
    lt_free(&t);
}

/* y (R, N) = x (R, K) W^T + b, in double */
static void linear_ref(double *y, const double *x, const float *w, const float *b, int64_t R,
                       int64_t K, int64_t N) {
    for (int64_t r = 0; r < R; r++)
        for (int64_t o = 0; o < N; o++) {
            double a = b[o];
            for (int64_t k = 0; k < K; k++) a += (double)w[o * K + k] * x[r * K + k];
            y[r * N + o] = a;
        }
}

/* LayerNorm of rows (R, D) in double, eps 1e-5 */
static void ln_ref(double *y, const double *x, const float *w, const float *b, int64_t R,
                   int64_t D) {
    for (int64_t r = 0; r < R; r++) {
        double mu = 0, v = 0;
        for (int64_t j = 0; j < D; j++) mu += x[r * D + j] / (double)D;
        for (int64_t j = 0; j < D; j++) v += (x[r * D + j] - mu) * (x[r * D + j] - mu) / (double)D;
        for (int64_t j = 0; j < D; j++)
            y[r * D + j] = (x[r * D + j] - mu) / sqrt(v + 1e-5) * w[j] + b[j];
    }
}

/* The block's forward in double, straight from its definition:
 * r = x + attn(ln1(x)), y = r + fc_out(gelu_erf(fc(ln2(r)))). */
static void block_ref(double *y, const float *xf, const float *prm, int64_t B, int64_t T,
                      int64_t D, int64_t H) {
    const int64_t R = B * T, n = R * D;
    const float *ln1 = prm, *attn = ln1 + 2 * D, *ln2 = attn + 4 * D * D + 4 * D;
    const float *fcw = ln2 + 2 * D, *fcb = fcw + 4 * D * D, *ow = fcb + 4 * D, *ob = ow + 4 * D * D;
    double *x = malloc(sizeof(double) * (size_t)n), *h = malloc(sizeof(double) * (size_t)n);
    double *r = malloc(sizeof(double) * (size_t)n), *f = malloc(sizeof(double) * (size_t)(4 * n));
    for (int64_t i = 0; i < n; i++) x[i] = xf[i];
    ln_ref(h, x, ln1, ln1 + D, R, D);
    attention_ref(r, h, attn, B, T, D, H);
    for (int64_t i = 0; i < n; i++) r[i] += x[i];
    ln_ref(h, r, ln2, ln2 + D, R, D);
    linear_ref(f, h, fcw, fcb, R, D, 4 * D);
    for (int64_t i = 0; i < 4 * n; i++) f[i] = 0.5 * f[i] * (1.0 + erf(f[i] / sqrt(2.0)));
    linear_ref(y, f, ow, ob, R, 4 * D, D);
    for (int64_t i = 0; i < n; i++) y[i] += r[i];
    free(x), free(h), free(r), free(f);
}

TEST(layer_transformer_block_grad) {
    const int64_t B = 2, T = 4, D = 8;
    struct lt t;
    lt_begin(&t, dp__shape2(T, D), B);
    ASSERT_OK(dp_transformer_block(t.m, "blocks.0", 2));
    lt_end(&t, 25);
    /* the PyTorch module's names, in its registration order */
    const char *names[] = {"ln1.weight", "ln1.bias", "qkv.weight", "qkv.bias",
                           "proj.weight", "proj.bias", "ln2.weight", "ln2.bias",
                           "fc.weight", "fc.bias", "fc_out.weight", "fc_out.bias"};
    ASSERT_EQ(t.m->nparams, 12);
    for (int i = 0; i < 12; i++) {
        char full[96];
        snprintf(full, sizeof full, "blocks.0.%s", names[i]);
        ASSERT_TRUE(strcmp(t.m->params[i].name, full) == 0);
    }
    ASSERT_EQ(dp_model_find_param(t.m, "blocks.0.fc.weight")->shape.d[0], 4 * D);
    ASSERT_EQ(t.l->param_count, 2 * D + (3 * D * D + 3 * D) + (D * D + D) + 2 * D +
                                    (4 * D * D + 4 * D) + (4 * D * D + D));
    lt_forward(&t);
    double ref[2 * 4 * 8];
    block_ref(ref, t.x, t.r.params, B, T, D, 2);
    for (int64_t i = 0; i < t.nout; i++)
        ASSERT_NEAR(t.y[i], ref[i], 1e-5 + 1e-5 * fabs(ref[i]));
    lt_check_grads(&t, 0);
    /* the residual wiring: with both branches' output Linears zeroed, y = x */
    float *prm = t.r.params;
    const struct dp_param_info *pw = dp_model_find_param(t.m, "blocks.0.proj.weight");
    const struct dp_param_info *ow = dp_model_find_param(t.m, "blocks.0.fc_out.weight");
    memset(prm + pw->offset, 0, sizeof(float) * (size_t)(D * D + D));
    memset(prm + ow->offset, 0, sizeof(float) * (size_t)(4 * D * D + D));
    lt_forward(&t);
    for (int64_t i = 0; i < t.nout; i++) ASSERT_FEQ(t.y[i], t.x[i]);
    lt_free(&t);
}

TEST(layer_tied_lm_head_grad) {
    const int64_t B = 2, T = 5, V = 11, D = 8;
    struct lt t;
    lt_begin(&t, dp__shape1(T), B);
    ASSERT_OK(dp_tokpos_embedding(t.m, "tok", "pos", V, T, D));
    ASSERT_ERR(dp_tied_lm_head(t.m, "lm_head", "nope.weight"), DP_EINVAL, "no parameter");
    ASSERT_OK(dp_linear(t.m, "narrow", 4, 0));
    ASSERT_ERR(dp_tied_lm_head(t.m, "lm_head", "tok.weight"), DP_EINVAL, "is not a (V, 4)");
    /* start again without the extra layer */
    dp_model_free(t.m);
    struct dp_shape in = dp__shape1(T);
    ASSERT_OK(dp_model_init(&t.m, "test", &in));
    ASSERT_OK(dp_tokpos_embedding(t.m, "tok", "pos", V, T, D));
    ASSERT_OK(dp_tied_lm_head(t.m, "lm_head", "tok.weight"));
    t.under = 1;
    lt_end(&t, 26);
    ASSERT_EQ(t.l->param_count, 0);
    ASSERT_EQ(t.l->out_shape.d[0], T);
    ASSERT_EQ(t.l->out_shape.d[1], V);
    ASSERT_EQ(t.m->num_params, (V + T) * D);
    /* logits = x tok.weight^T */
    lt_forward(&t);
    for (int64_t r = 0; r < B * T; r++)
        for (int64_t v = 0; v < V; v++) {
            double a = 0;
            for (int64_t j = 0; j < D; j++) a += (double)t.x[r * D + j] * t.r.params[v * D + j];
            ASSERT_NEAR(t.y[r * V + v], a, 1e-5);
        }
    /* dx, and the head's part of tok.weight's gradient (pos.weight's is 0) */
    lt_check_grads(&t, 0);
    lt_free(&t);
}

/* Parameter gradients accumulate (+=), dx is overwritten, for each
 * transformer layer; the head accumulates into the tied weight. */
TEST(layer_transformer_grads_accumulate) {
    struct lt t;
    int32_t tok[10];
    fill_tokens(tok, 10, 5, 11);
    lt_begin(&t, dp__shape1(5), 2);
    ASSERT_OK(dp_tokpos_embedding(t.m, "tok", "pos", 11, 5, 8));
    lt_end(&t, 66);
    t.batch.tokens = tok;
    accumulate_case(&t);
    lt_begin(&t, dp__shape1(5), 2);
    ASSERT_OK(dp_tokpos_embedding(t.m, "tok", "pos", 11, 5, 8));
    ASSERT_OK(dp_tied_lm_head(t.m, "lm_head", "tok.weight"));
    t.under = 1;
    lt_end(&t, 67);
    accumulate_case(&t);
    lt_begin(&t, dp__shape2(5, 8), 2);
    ASSERT_OK(dp_attention(t.m, "attn", 2));
    lt_end(&t, 68);
    accumulate_case(&t);
    lt_begin(&t, dp__shape2(4, 8), 2);
    ASSERT_OK(dp_transformer_block(t.m, "blocks.0", 2));
    lt_end(&t, 69);
    accumulate_case(&t);
}

/* Bit-identical for 1 and 2 threads at a size where the block's
 * elementwise loops and LayerNorms run OpenMP teams (n = 32768). */
TEST(layer_transformer_deterministic_across_threads) {
    struct lt t;
    lt_begin(&t, dp__shape2(64, 64), 8);
    ASSERT_OK(dp_transformer_block(t.m, "blocks.0", 4));
    lt_end(&t, 73);
    thread_case(&t);
}

/* ---- the tiny GPT end to end ------------------------------------------------------- */

#define GPT_TINY "gpt:layers=2,heads=2,dim=8,ctx=5,vocab=11"

struct gpt_case {
    struct dp_model *m;
    struct dp_replica r;
    int32_t tok[10], tgt[10];
    int64_t sidx[2];
    struct dp_batch batch;
};

/* The tiny model with parameters spread out (as lt_end does), B = 2 random
 * sequences and next-token targets. */
static void gpt_case_init(struct gpt_case *g) {
    memset(g, 0, sizeof *g);
    ASSERT_OK(dp_model_from_spec(&g->m, GPT_TINY, 1, 1, 1));
    ASSERT_OK(dp_replica_init(&g->r, g->m, 2));
    dp_model_init_params(g->m, &g->r, 7);
    for (int i = 0; i < g->m->nparams; i++) {
        const struct dp_param_info *p = &g->m->params[i];
        float *dst = g->r.params + p->offset;
        if (p->init == DP_INIT_CONST) fill(dst, p->count, 500 + (uint64_t)i, 0.5f, 1.5f);
        else fill(dst, p->count, 500 + (uint64_t)i, -0.4f, 0.4f);
    }
    fill_tokens(g->tok, 10, 11, 11);
    fill_tokens(g->tgt, 10, 12, 11);
    g->sidx[0] = 4, g->sidx[1] = 9;
    g->batch = (struct dp_batch){.B = 2, .tokens = g->tok, .targets = g->tgt, .sample_idx = g->sidx};
}

static void gpt_case_free(struct gpt_case *g) {
    dp_replica_free(&g->r);
    dp_model_free(g->m);
}

/* the summed loss over all B T positions (loss_scale 1: dloss/dlogits unscaled) */
static double gpt_loss(struct gpt_case *g, int backward) {
    struct dp_pass pass = {.training = 1, .backward = backward, .loss_scale = 1.0f};
    ASSERT_OK(dp_model_run(g->m, &g->r, &g->batch, &pass));
    return pass.loss_sum;
}

/* Every parameter of the whole model (embeddings, both blocks, ln_f, the
 * tied head through tok.weight) against central differences of the summed
 * cross-entropy, with the layer tests' eps and tolerance; and the default
 * loss scale is the mean over the B T positions. */
TEST(gpt_tiny_model_grad) {
    struct gpt_case g;
    gpt_case_init(&g);
    ASSERT_EQ(dp_model_num_classes(g.m), 11);
    ASSERT_EQ(g.m->in_shape.ndim, 1);
    ASSERT_EQ(g.m->in_shape.d[0], 5);
    const int64_t np = g.m->num_params;
    memset(g.r.grads, 0, sizeof(float) * (size_t)np);
    const double l0 = gpt_loss(&g, 1);
    ASSERT_TRUE(isfinite(l0) && l0 > 0);
    float *ga = malloc(sizeof(float) * (size_t)np);
    memcpy(ga, g.r.grads, sizeof(float) * (size_t)np);
    double worst = 0;
    for (int64_t i = 0; i < np; i++) {
        float *th = g.r.params + i;
        const float save = *th;
        *th = (float)(save + FD_EPS);
        const double fp = gpt_loss(&g, 0);
        *th = (float)(save - FD_EPS);
        const double fm = gpt_loss(&g, 0);
        *th = save;
        const double e = (double)(float)(save + FD_EPS) - (double)(float)(save - FD_EPS);
        const double fd = (fp - fm) / e, a = ga[i];
        const double q = fabs(a - fd) / (FD_ATOL + FD_RTOL * fmax(fabs(a), fabs(fd)));
        if (q > worst) worst = q;
        if (!(q <= 1.0)) {
            const char *name = "?";
            for (int k = 0; k < g.m->nparams; k++)
                if (i >= g.m->params[k].offset && i < g.m->params[k].offset + g.m->params[k].count)
                    name = g.m->params[k].name;
            dp_test_fail(__FILE__, __LINE__, "%s (slab %lld): analytic %.7g, finite difference %.7g",
                         name, (long long)i, a, fd);
        }
    }
    if (getenv("DP_TEST_VERBOSE"))
        fprintf(stderr, "    gpt tiny: %lld parameters, worst |a - fd| / tol = %.3f\n",
                (long long)np, worst);
    /* default scale: the mean over R = B T = 10 positions */
    memset(g.r.grads, 0, sizeof(float) * (size_t)np);
    struct dp_pass mean = {.training = 1, .backward = 1};
    ASSERT_OK(dp_model_run(g.m, &g.r, &g.batch, &mean));
    ASSERT_FEQ(mean.loss_sum, l0);
    for (int64_t i = 0; i < np; i++)
        ASSERT_NEAR(g.r.grads[i] * 10.0, ga[i], 1e-6 + 1e-5 * fabs(ga[i]));
    free(ga);
    gpt_case_free(&g);
}

struct ready_log {
    int n;
    int64_t off[16], cnt[16];
    double tok_abs[16]; /* sum |grad| over tok.weight at each report */
    const float *grads;
    int64_t tok_count;
};

static void ready_record(void *arg, int64_t off, int64_t cnt) {
    struct ready_log *lg = arg;
    ASSERT_TRUE(lg->n < 16);
    double s = 0;
    for (int64_t i = 0; i < lg->tok_count; i++) s += fabs(lg->grads[i]);
    lg->off[lg->n] = off, lg->cnt[lg->n] = cnt, lg->tok_abs[lg->n] = s;
    lg->n++;
}

/* The tied weight's gradient gets both contributions before its range is
 * reported: ranges come in decreasing offsets, the head reports nothing, the
 * embedding's (tok.weight, pos.weight) range comes last; the head's share is
 * already in tok.weight's gradient at the first report, and what is there at
 * the last report is the final gradient. */
TEST(gpt_tied_gradient_reported_once_last) {
    struct gpt_case g;
    gpt_case_init(&g);
    const struct dp_param_info *tw = dp_model_find_param(g.m, "tok.weight");
    const struct dp_param_info *pw = dp_model_find_param(g.m, "pos.weight");
    ASSERT_EQ(tw->offset, 0);
    struct ready_log lg = {.grads = g.r.grads, .tok_count = tw->count};
    memset(g.r.grads, 0, sizeof(float) * (size_t)g.m->num_params);
    struct dp_pass pass = {.training = 1, .backward = 1, .grad_ready = ready_record,
                           .grad_ready_arg = &lg};
    ASSERT_OK(dp_model_run(g.m, &g.r, &g.batch, &pass));
    ASSERT_EQ(lg.n, 4); /* ln_f, blocks.1, blocks.0, tok+pos; not lm_head */
    for (int i = 0; i + 1 < lg.n; i++) {
        ASSERT_TRUE(lg.off[i + 1] + lg.cnt[i + 1] == lg.off[i]); /* contiguous, descending */
        ASSERT_TRUE(lg.off[i] >= tw->count + pw->count);        /* none covers tok.weight */
    }
    ASSERT_EQ(lg.off[lg.n - 1], 0);
    ASSERT_EQ(lg.cnt[lg.n - 1], tw->count + pw->count);
    ASSERT_EQ(lg.off[0] + lg.cnt[0], g.m->num_params);
    ASSERT_TRUE(lg.tok_abs[0] > 0);                       /* the head's share, early */
    ASSERT_TRUE(lg.tok_abs[lg.n - 1] != lg.tok_abs[0]);   /* plus the embedding's */
    double fin = 0;
    for (int64_t i = 0; i < tw->count; i++) fin += fabs(g.r.grads[i]);
    ASSERT_FEQ(fin, lg.tok_abs[lg.n - 1]);
    gpt_case_free(&g);
}

/* The pass in halves (a pipeline's stages): forward [0, k) then [k, L) on a view's
 * activations, backward [k, L) then [0, k) from the dx it hands back, gives the whole
 * pass's loss and gradients bit for bit, at every cut of the gpt; the spans of the cuts
 * tile the slab; and the halves refuse ranges out of order. */
TEST(model_range_halves_same_bits) {
    struct gpt_case g;
    gpt_case_init(&g);
    const int64_t np = g.m->num_params;
    const int L = g.m->nlayers;
    memset(g.r.grads, 0, sizeof(float) * (size_t)np);
    struct dp_pass whole = {.training = 1, .backward = 1};
    ASSERT_OK(dp_model_run(g.m, &g.r, &g.batch, &whole));
    float *want = malloc(sizeof(float) * (size_t)np);
    memcpy(want, g.r.grads, sizeof(float) * (size_t)np);
    for (int k = 1; k < L; k++) {
        struct dp_replica v;
        ASSERT_OK(dp_replica_init_view(&v, &g.r, k, L, g.r.max_batch));
        struct dp_span a, b;
        ASSERT_OK(dp_model_span(g.m, 0, k, &a));
        ASSERT_OK(dp_model_span(g.m, k, L, &b));
        ASSERT_EQ(a.param_off, 0);
        ASSERT_EQ(a.param_off + a.param_count, b.param_off);
        ASSERT_EQ(b.param_off + b.param_count, np);
        memset(g.r.grads, 0, sizeof(float) * (size_t)np);
        struct dp_pass p0 = {.training = 1, .backward = 1}, p1 = p0;
        ASSERT_OK(dp_model_forward_range(g.m, &g.r, &g.batch, 0, k, NULL, &p0));
        ASSERT_FEQ(p0.loss_sum, 0.0);
        ASSERT_OK(dp_model_forward_range(g.m, &v, &g.batch, k, L, g.r.acts[k], &p1));
        ASSERT_FEQ(p1.loss_sum, whole.loss_sum);
        const float *dx = NULL, *none = NULL;
        ASSERT_OK(dp_model_backward_range(g.m, &v, &g.batch, k, L, NULL, &dx, &p1));
        ASSERT_TRUE(dx != NULL);
        ASSERT_OK(dp_model_backward_range(g.m, &g.r, &g.batch, 0, k, dx, &none, &p0));
        ASSERT_TRUE(none == NULL);
        ASSERT_TRUE(memcmp(want, g.r.grads, sizeof(float) * (size_t)np) == 0);
        dp_replica_free(&v);
    }
    struct dp_span s;
    struct dp_pass p = {.training = 1, .backward = 1};
    ASSERT_ERR(dp_model_span(g.m, 2, 2, &s), DP_EINVAL, "layers [2, 2)");
    ASSERT_ERR(dp_model_forward_range(g.m, &g.r, &g.batch, 1, L + 1, NULL, &p), DP_EINVAL, "layers [1,");
    ASSERT_ERR(dp_model_backward_range(g.m, &g.r, &g.batch, 0, 1, NULL, NULL, &p), DP_EINVAL, "output gradient");
    free(want);
    gpt_case_free(&g);
}

/* The workload size, the PyTorch module's names, layouts and inits,
 * and the spec parser's errors. */
/* The spec strings' parameters (issue 28, M3): cnn:C1,C2[,F], resnet:DEPTH[,WIDTH]
 * (6n + 2) and mlp's dropout; the bare names are their defaults exactly. */
TEST(model_spec_variants) {
    static const struct {
        const char *spec;
        int64_t params;
    } ok[] = {{"cnn", 421642},      {"cnn:32,64", 421642},      {"cnn:32,64,128", 421642},
              {"cnn:64,128", 878730}, {"resnet", 308074},         {"resnet:8", 308074},
              {"resnet:8,32", 308074}, {"resnet:20,16", 272186}, {"mlp:784,256,10,dropout=0.1", 203530}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        struct dp_model *m;
        ASSERT_OK(dp_model_from_spec(&m, ok[i].spec, 1, 28, 28));
        ASSERT_EQ(m->num_params, ok[i].params);
        dp_model_free(m);
    }
    struct dp_model *m;
    ASSERT_OK(dp_model_from_spec(&m, "resnet:14", 1, 28, 28));
    ASSERT_TRUE(strcmp(m->layers[m->nlayers - 3]->name, "layer3.1") == 0); /* 2 blocks a stage */
    dp_model_free(m);
    ASSERT_OK(dp_model_from_spec(&m, "mlp:784,64,32,10,dropout=0.25", 1, 28, 28));
    ASSERT_EQ(m->nlayers, 1 + 3 + 2 * 2); /* flatten, 3 fc, relu and dropout after each hidden one */
    ASSERT_TRUE(strcmp(m->layers[3]->name, "drop1") == 0);
    dp_model_free(m);
    ASSERT_ERR(dp_model_from_spec(&m, "resnet:18", 1, 28, 28), DP_EINVAL, "not 6n + 2");
    ASSERT_ERR(dp_model_from_spec(&m, "cnn:64", 1, 28, 28), DP_EINVAL, "cnn:C1,C2[,F]");
    ASSERT_ERR(dp_model_from_spec(&m, "cnn:64,x", 1, 28, 28), DP_EINVAL, "bad channel list");
    ASSERT_ERR(dp_model_from_spec(&m, "mlp:784,10,dropout=1", 1, 28, 28), DP_EINVAL, "0 <= dropout < 1");
    ASSERT_ERR(dp_model_from_spec(&m, "mlp:784,dropout=0.1,10", 1, 28, 28), DP_EINVAL, "bad dropout");
    ASSERT_ERR(dp_model_from_spec(&m, "vgg", 1, 28, 28), DP_EINVAL, "resnet:DEPTH");
}

TEST(gpt_spec_params_and_names) {
    struct dp_model *m;
    ASSERT_OK(dp_model_from_spec(&m, "gpt:layers=4,heads=4,dim=128,ctx=64", 1, 28, 28));
    ASSERT_EQ(m->num_params, 834304);
    ASSERT_EQ(m->num_buffers, 0);
    ASSERT_EQ(dp_model_num_classes(m), 256);
    ASSERT_EQ(m->nlayers, 4 + 3);
    ASSERT_EQ(m->nparams, 2 + 4 * 12 + 2);
    ASSERT_TRUE(strcmp(m->params[0].name, "tok.weight") == 0);
    ASSERT_TRUE(strcmp(m->params[1].name, "pos.weight") == 0);
    ASSERT_TRUE(strcmp(m->params[2].name, "blocks.0.ln1.weight") == 0);
    ASSERT_TRUE(strcmp(m->params[13].name, "blocks.0.fc_out.bias") == 0);
    ASSERT_TRUE(strcmp(m->params[49].name, "blocks.3.fc_out.bias") == 0);
    ASSERT_TRUE(strcmp(m->params[50].name, "ln_f.weight") == 0);
    ASSERT_TRUE(strcmp(m->params[51].name, "ln_f.bias") == 0);
    const struct dp_param_info *p = dp_model_find_param(m, "tok.weight");
    ASSERT_TRUE(p->shape.d[0] == 256 && p->shape.d[1] == 128 && p->init == DP_INIT_NORMAL);
    ASSERT_TRUE(p->init_a == 0.02f);
    p = dp_model_find_param(m, "pos.weight");
    ASSERT_TRUE(p->shape.d[0] == 64 && p->shape.d[1] == 128 && p->init == DP_INIT_NORMAL);
    p = dp_model_find_param(m, "blocks.2.qkv.weight");
    ASSERT_TRUE(p->shape.d[0] == 384 && p->shape.d[1] == 128);
    ASSERT_TRUE(p->init == DP_INIT_NORMAL && p->init_a == 0.02f);
    ASSERT_TRUE(dp_model_find_param(m, "blocks.2.qkv.bias")->init == DP_INIT_ZERO);
    p = dp_model_find_param(m, "blocks.1.fc_out.weight");
    ASSERT_TRUE(p->shape.d[0] == 128 && p->shape.d[1] == 512 && p->init == DP_INIT_NORMAL);
    ASSERT_TRUE(dp_model_find_param(m, "blocks.1.fc_out.bias")->init == DP_INIT_ZERO);
    p = dp_model_find_param(m, "blocks.0.ln2.weight");
    ASSERT_TRUE(p->init == DP_INIT_CONST && p->init_a == 1.0f);
    ASSERT_TRUE(dp_model_find_param(m, "ln_f.bias")->init == DP_INIT_ZERO);
    dp_model_free(m);
    ASSERT_OK(dp_model_from_spec(&m, "gpt:ctx=8,dim=16,heads=2,layers=1,vocab=50", 0, 0, 0));
    ASSERT_EQ(dp_model_num_classes(m), 50);
    dp_model_free(m);
    ASSERT_ERR(dp_model_from_spec(&m, "gpt:layers=2,heads=3,dim=8,ctx=4", 1, 1, 1), DP_EINVAL,
               "not a multiple");
    ASSERT_ERR(dp_model_from_spec(&m, "gpt:layers=2,heads=2,dim=8", 1, 1, 1), DP_EINVAL,
               "missing ctx");
    ASSERT_ERR(dp_model_from_spec(&m, "gpt:layers=2,heads=2,dim=8,ctx=4,depth=3", 1, 1, 1),
               DP_EINVAL, "bad or repeated key");
    ASSERT_ERR(dp_model_from_spec(&m, "gpt:layers=2,layers=2,heads=2,dim=8,ctx=4", 1, 1, 1),
               DP_EINVAL, "bad or repeated key");
    ASSERT_ERR(dp_model_from_spec(&m, "gpt:layers=0,heads=2,dim=8,ctx=4", 1, 1, 1), DP_EINVAL,
               "positive integer");
}

/* The transformer constructors free what they made when an allocation fails. */
TEST(gpt_constructor_survives_allocation_failures) {
    struct dp_allocator counting = {count_alloc, count_free, NULL};
    dp_set_allocator(&counting);
    struct dp_model *m = NULL;
    alloc_count = 0, fail_at = -1;
    ASSERT_OK(dp_model_from_spec(&m, GPT_TINY, 1, 1, 1));
    const int64_t total = alloc_count;
    ASSERT_TRUE(total > 20); /* every layer and child, their state, the tables */
    dp_model_free(m);
    ASSERT_EQ(live_blocks, 0);
    for (int64_t k = 0; k < total; k++) {
        alloc_count = 0, fail_at = k;
        m = NULL;
        ASSERT_EQ(dp_model_from_spec(&m, GPT_TINY, 1, 1, 1), DP_ENOMEM);
        ASSERT_EQ(live_blocks, 0);
    }
    fail_at = -1;
    dp_set_allocator(NULL);
}

/* The layer_begin hook (ZeRO-3 gathers a layer's parameters there): called
 * before every top-level layer's forward in increasing order, then before
 * every backward in decreasing order, with the layer (its own parameter
 * range, and its tied range: none in an mlp); a nonzero return stops the
 * pass with that status. */
struct begin_log {
    int n, stop_at;
    int phase[64], layer[64];
    int64_t off[64], cnt[64], toff[64], tcnt[64];
};
static int begin_record(void *arg, int phase, int layer, const struct dp_layer *l) {
    struct begin_log *lg = arg;
    ASSERT_TRUE(lg->n < 64);
    lg->phase[lg->n] = phase, lg->layer[lg->n] = layer, lg->off[lg->n] = l->param_off, lg->cnt[lg->n] = l->param_count;
    lg->toff[lg->n] = l->tied_off, lg->tcnt[lg->n] = l->tied_count;
    return ++lg->n == lg->stop_at ? DP_ECANCELED : DP_OK;
}
TEST(model_layer_begin_order_and_ranges) {
    struct dp_model *m;
    ASSERT_OK(dp_model_from_spec(&m, "mlp:12,8,6,3", 1, 1, 12));
    struct dp_replica r;
    ASSERT_OK(dp_replica_init(&r, m, 2));
    dp_model_init_params(m, &r, 1);
    float x[24];
    fill(x, 24, 7, -1.0f, 1.0f);
    int32_t tg[2] = {0, 2};
    int64_t sidx[2] = {0, 1};
    struct dp_batch batch = {.B = 2, .x = x, .targets = tg, .sample_idx = sidx};
    struct begin_log lg = {0};
    struct dp_pass pass = {.training = 1, .backward = 1, .layer_begin = begin_record, .layer_begin_arg = &lg};
    ASSERT_OK(dp_model_run(m, &r, &batch, &pass));
    const int L = m->nlayers;
    ASSERT_EQ(lg.n, 2 * L);
    int64_t covered = 0;
    for (int i = 0; i < 2 * L; i++) {
        int fwd = i < L, layer = fwd ? i : 2 * L - 1 - i;
        ASSERT_EQ(lg.phase[i], fwd ? DP_PHASE_FORWARD : DP_PHASE_BACKWARD);
        ASSERT_EQ(lg.layer[i], layer);
        ASSERT_EQ(lg.off[i], m->layers[layer]->param_off);
        ASSERT_EQ(lg.cnt[i], m->layers[layer]->param_count);
        ASSERT_EQ(lg.tcnt[i], 0);
        if (fwd) covered += lg.cnt[i];
    }
    ASSERT_EQ(covered, m->num_params);
    /* forward only: L calls */
    lg.n = 0;
    struct dp_pass ev = {.training = 0, .layer_begin = begin_record, .layer_begin_arg = &lg};
    ASSERT_OK(dp_model_run(m, &r, &batch, &ev));
    ASSERT_EQ(lg.n, L);
    /* an error from the hook stops the pass at once (the second backward call) */
    lg.n = 0, lg.stop_at = L + 2;
    ASSERT_EQ(dp_model_run(m, &r, &batch, &pass), DP_ECANCELED);
    ASSERT_EQ(lg.n, L + 2);
    dp_replica_free(&r);
    dp_model_free(m);
}

/* gpt: the tied head owns no parameters and reads tok.weight (the
 * embedding's, the first range of the slab); the hook is told so, in both
 * phases, and no other layer has a tied range. */
TEST(model_layer_begin_tied_head) {
    struct dp_model *m;
    ASSERT_OK(dp_model_from_spec(&m, GPT_TINY, 1, 1, 1));
    struct dp_replica r;
    ASSERT_OK(dp_replica_init(&r, m, 2));
    dp_model_init_params(m, &r, 1);
    const int64_t T = m->in_shape.d[0];
    int32_t tok[64], tg[64];
    ASSERT_TRUE(2 * T <= 64);
    for (int i = 0; i < 2 * T; i++) tok[i] = i % 7, tg[i] = (i + 1) % 7;
    struct dp_batch batch = {.B = 2, .tokens = tok, .targets = tg};
    struct begin_log lg = {0};
    struct dp_pass pass = {.training = 1, .backward = 1, .layer_begin = begin_record, .layer_begin_arg = &lg};
    ASSERT_OK(dp_model_run(m, &r, &batch, &pass));
    const int L = m->nlayers;
    const struct dp_param_info *w = dp_model_find_param(m, "tok.weight");
    ASSERT_TRUE(w != NULL);
    ASSERT_EQ(lg.n, 2 * L);
    for (int i = 0; i < 2 * L; i++) {
        int head = lg.layer[i] == L - 1;
        ASSERT_EQ(lg.cnt[i], head ? 0 : m->layers[lg.layer[i]]->param_count);
        ASSERT_EQ(lg.tcnt[i], head ? w->count : 0);
        if (head) ASSERT_EQ(lg.toff[i], w->offset);
    }
    ASSERT_EQ(lg.layer[L - 1], L - 1);
    ASSERT_EQ(lg.layer[L], L - 1); /* backward starts with the head */
    dp_replica_free(&r);
    dp_model_free(m);
}

/* Mean squared error: the loss, the absolute errors and the gradient against their
 * definitions in double, on a finite difference too. */
TEST(layer_mse_matches_definition) {
    const int64_t R = 5, K = 3;
    float o[15], t[15], d[15];
    fill(o, R * K, 61, -3.0f, 3.0f);
    fill(t, R * K, 62, -3.0f, 3.0f);
    const float scale = 1.0f / 5.0f;
    double loss, ab;
    ASSERT_OK(dp_mse(d, &loss, &ab, o, t, R, K, scale));
    double rl = 0, ra = 0;
    for (int64_t i = 0; i < R * K; i++) {
        double e = (double)o[i] - t[i];
        rl += e * e / K, ra += fabs(e) / K;
        ASSERT_NEAR(d[i], scale * 2.0 * e / K, 1e-6);
    }
    ASSERT_NEAR(loss, rl, 1e-6 * rl); /* (the differences are taken in float, as PyTorch does) */
    ASSERT_NEAR(ab, ra, 1e-6 * ra);
    /* d(scale * loss)/d o_i by central differences */
    for (int64_t i = 0; i < R * K; i += 4) {
        float keep = o[i];
        double lp, lm;
        o[i] = keep + 1e-2f;
        ASSERT_OK(dp_mse(NULL, &lp, NULL, o, t, R, K, scale));
        o[i] = keep - 1e-2f;
        ASSERT_OK(dp_mse(NULL, &lm, NULL, o, t, R, K, scale));
        o[i] = keep;
        ASSERT_NEAR(d[i], scale * (lp - lm) / 2e-2, 1e-3);
    }
    ASSERT_ERR(dp_mse(d, &loss, &ab, o, t, R, 0, scale), DP_EINVAL, "outputs");
}
