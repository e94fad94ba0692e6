/*
 * Optimizers, schedules and clipping.
 *
 * Oracles: an independent double-precision SGD/AdamW written here in the
 * textbook form (random data, several steps, every option), hand-computed
 * 1-element cases, and a PyTorch 1.13 fixture (tests/fixtures/optim_ref.bin,
 * written by tests/torch/gen_optim_fixture.py).
 */
#include <stdint.h>

#include "dp/core.h"
#include "dp/optim.h"
#include "test.h"

/* Odd size that spans several of adamw.c's 512-float blocks plus a tail. */
enum { N = 1237 };

static void fill(float *x, int64_t n, uint64_t seed, uint64_t a) {
    for (int64_t i = 0; i < n; i++) x[i] = dp_rng_uniform(seed, DP_RNG_USER, a, (uint64_t)i) - 0.5f;
}

/* ============================================================================
 * Double-precision reference
 * ========================================================================= */

struct ref {
    struct dp_optim_params p;
    int64_t step;
    double b[N], m[N], v[N];
};

/* SGD:   d = g + wd*p;  b = d (first step) or mu*b + (1-dampening)*d;
 *        u = nesterov ? d + mu*b : b  (u = d without momentum);  p -= lr*u.
 * AdamW: p *= 1 - lr*wd;  m, v moving averages of g, g^2;
 *        p -= lr * mhat / (sqrt(vhat) + eps),  mhat = m/(1-b1^t), vhat = v/(1-b2^t). */
static void ref_step(struct ref *r, double *p, const float *g, int64_t n, double lr) {
    const double wd = r->p.weight_decay, mu = r->p.momentum, damp = r->p.dampening;
    const double b1 = r->p.beta1, b2 = r->p.beta2, eps = r->p.eps;
    const double t = (double)(r->step + 1);
    for (int64_t i = 0; i < n; i++) {
        if (r->p.kind == DP_OPTIM_SGD) {
            double d = g[i] + wd * p[i];
            if (mu != 0) {
                r->b[i] = r->step == 0 ? d : mu * r->b[i] + (1 - damp) * d;
                d = r->p.nesterov ? d + mu * r->b[i] : r->b[i];
            }
            p[i] -= lr * d;
        } else {
            p[i] *= 1 - lr * wd;
            r->m[i] = b1 * r->m[i] + (1 - b1) * g[i];
            r->v[i] = b2 * r->v[i] + (1 - b2) * (double)g[i] * g[i];
            double mhat = r->m[i] / (1 - pow(b1, t)), vhat = r->v[i] / (1 - pow(b2, t));
            p[i] -= lr * mhat / (sqrt(vhat) + eps);
        }
    }
    r->step++;
}

/* Runs `steps` steps of dp_optim and of the reference from the same random
 * start, with fresh random gradients and a changing lr, and compares. */
static void check_against_ref(const struct dp_optim_params *hp, int steps, double lr0, double tol) {
    static float p[N], g[N];
    static double pd[N];
    static struct ref r;
    memset(&r, 0, sizeof r);
    r.p = *hp;
    fill(p, N, 7, 0);
    for (int i = 0; i < N; i++) pd[i] = p[i];
    struct dp_optim o;
    ASSERT_OK(dp_optim_init(&o, hp, N));
    for (int s = 0; s < steps; s++) {
        fill(g, N, 8, (uint64_t)s + 1);
        float lr = (float)(lr0 * (1 + 0.25 * s));
        ASSERT_OK(dp_optim_step(&o, p, g, N, lr));
        ref_step(&r, pd, g, N, lr);
        for (int i = 0; i < N; i++)
            if (!(fabs(p[i] - pd[i]) <= tol * (1 + fabs(pd[i]))))
                dp_test_fail(__FILE__, __LINE__,
                             "%s mom %g damp %g nest %d wd %g b1 %g b2 %g eps %g: step %d "
                             "p[%d] = %.9g, reference %.9g",
                             dp_optim_kind_name(hp->kind), (double)hp->momentum,
                             (double)hp->dampening, hp->nesterov, (double)hp->weight_decay,
                             (double)hp->beta1, (double)hp->beta2, (double)hp->eps, s, i,
                             (double)p[i], pd[i]);
    }
    ASSERT_EQ(o.step, steps);
    dp_optim_free(&o);
}

TEST(optim_sgd_matches_double_reference) {
    /* momentum, dampening, nesterov, weight_decay */
    const float cfg[][4] = {
        {0, 0, 0, 0},      {0, 0, 0, 0.01f},    {0.9f, 0, 0, 0},    {0.9f, 0, 1, 1e-4f},
        {0.9f, 0, 1, 0.05f}, {0.5f, 0.3f, 0, 0.05f}, {0.99f, 1.0f, 0, 0},
    };
    for (size_t c = 0; c < DP_ARRAY_LEN(cfg); c++) {
        struct dp_optim_params hp = dp_optim_default_params();
        hp.kind = DP_OPTIM_SGD;
        hp.momentum = cfg[c][0], hp.dampening = cfg[c][1];
        hp.nesterov = (int)cfg[c][2], hp.weight_decay = cfg[c][3];
        check_against_ref(&hp, 6, 0.1, 1e-6);
    }
}

TEST(optim_adamw_matches_double_reference) {
    /* beta1, beta2, eps, weight_decay */
    const float cfg[][4] = {
        {0.9f, 0.999f, 1e-8f, 0}, {0.9f, 0.999f, 1e-8f, 0.01f}, {0.5f, 0.9f, 1e-3f, 0.1f},
        {0, 0, 1e-6f, 0},         {0.99f, 0.9999f, 1e-8f, 0.5f},
    };
    for (size_t c = 0; c < DP_ARRAY_LEN(cfg); c++) {
        struct dp_optim_params hp = dp_optim_default_params();
        hp.kind = DP_OPTIM_ADAMW;
        hp.beta1 = cfg[c][0], hp.beta2 = cfg[c][1], hp.eps = cfg[c][2];
        hp.weight_decay = cfg[c][3];
        /* The first steps are the ones bias correction changes most. */
        check_against_ref(&hp, 8, 1e-2, 2e-6);
    }
}

/* ============================================================================
 * Hand-computed 1-element cases
 * ========================================================================= */

static void sgd_two_steps(float mom, float damp, int nest, float out[2]) {
    struct dp_optim_params hp = dp_optim_default_params();
    hp.momentum = mom, hp.dampening = damp, hp.nesterov = nest;
    struct dp_optim o;
    ASSERT_OK(dp_optim_init(&o, &hp, 1));
    float p = 1.0f, g = 0.5f;
    for (int s = 0; s < 2; s++) {
        ASSERT_OK(dp_optim_step(&o, &p, &g, 1, 0.1f));
        out[s] = p;
    }
    dp_optim_free(&o);
}

TEST(optim_sgd_momentum_by_hand) {
    /* p = 1, g = 0.5 twice, lr 0.1. */
    float p[2];
    /* mu 0.9: b = 0.5 -> p = 0.95;  b = 0.45 + 0.5 = 0.95 -> p = 0.855. */
    sgd_two_steps(0.9f, 0, 0, p);
    ASSERT_NEAR(p[0], 0.95, 1e-7);
    ASSERT_NEAR(p[1], 0.855, 1e-7);
    /* dampening 0.5 does not apply to the first step: b = 0.5 -> p = 0.95;
     * b = 0.45 + 0.25 = 0.7 -> p = 0.88. */
    sgd_two_steps(0.9f, 0.5f, 0, p);
    ASSERT_NEAR(p[0], 0.95, 1e-7);
    ASSERT_NEAR(p[1], 0.88, 1e-7);
    /* Nesterov: b = 0.5, u = 0.5 + 0.45 = 0.95 -> p = 0.905;
     * b = 0.95, u = 0.5 + 0.855 = 1.355 -> p = 0.7695. */
    sgd_two_steps(0.9f, 0, 1, p);
    ASSERT_NEAR(p[0], 0.905, 1e-7);
    ASSERT_NEAR(p[1], 0.7695, 1e-7);
}

TEST(optim_adamw_by_hand) {
    /* p = 1, lr 0.1, wd 0.1, betas (0.9, 0.999), eps 1e-8; g = 0.5 then -0.25.
     * Step 1: p = 0.99; m = 0.05, v = 0.00025; mhat = 0.5, vhat = 0.25;
     *         p = 0.99 - 0.1*0.5/(0.5 + 1e-8) = 0.890000002.
     * Step 2: p = 0.890000002*0.99 = 0.88110000198; m = 0.045 - 0.025 = 0.02,
     *         v = 0.00024975 + 0.0000625 = 0.00031225;
     *         mhat = 0.02/0.19 = 0.105263158, vhat = 0.00031225/0.001999 =
     *         0.156203102, sqrt = 0.395225381;
     *         p = 0.881100002 - 0.1*0.105263158/0.395225391 = 0.854466299. */
    struct dp_optim_params hp = dp_optim_default_params();
    hp.kind = DP_OPTIM_ADAMW, hp.weight_decay = 0.1f;
    struct dp_optim o;
    ASSERT_OK(dp_optim_init(&o, &hp, 1));
    float p = 1.0f, g = 0.5f;
    ASSERT_OK(dp_optim_step(&o, &p, &g, 1, 0.1f));
    ASSERT_NEAR(p, 0.890000002, 1e-7);
    ASSERT_NEAR(o.state[0], 0.05, 5e-8);    /* m (1 - 0.9f = 0.10000002) */
    ASSERT_NEAR(o.state[1], 0.00025, 1e-8); /* v (1 - 0.999f = 0.00099999) */
    g = -0.25f;
    ASSERT_OK(dp_optim_step(&o, &p, &g, 1, 0.1f));
    ASSERT_NEAR(p, 0.854466299, 2e-7);
    ASSERT_NEAR(o.state[0], 0.02, 5e-8);
    ASSERT_NEAR(o.state[1], 0.00031225, 1e-8);
    ASSERT_EQ(o.step, 2);
    dp_optim_free(&o);
}

/* ============================================================================
 * State, resume, errors
 * ========================================================================= */

TEST(optim_state_layout_and_lifetime) {
    struct dp_optim_params hp = dp_optim_default_params();
    struct dp_optim o;
    ASSERT_OK(dp_optim_init(&o, &hp, 100)); /* plain SGD: no state */
    ASSERT_EQ(o.state_len, 0);
    ASSERT_TRUE(o.state == NULL);
    dp_optim_free(&o);
    dp_optim_free(&o); /* twice is fine */
    dp_optim_free(NULL);
    hp.momentum = 0.9f;
    ASSERT_OK(dp_optim_init(&o, &hp, 100));
    ASSERT_EQ(o.state_len, 100);
    dp_optim_free(&o);
    hp.kind = DP_OPTIM_ADAMW;
    ASSERT_OK(dp_optim_init(&o, &hp, 100));
    ASSERT_EQ(o.state_len, 200);
    ASSERT_EQ(o.n, 100);
    ASSERT_EQ(o.step, 0);
    for (int i = 0; i < 200; i++) ASSERT_TRUE(o.state[i] == 0.0f);
    dp_optim_free(&o);
    ASSERT_OK(dp_optim_init(&o, &hp, 0)); /* empty slab: steps are no-ops */
    ASSERT_OK(dp_optim_step(&o, NULL, NULL, 0, 0.1f));
    ASSERT_EQ(o.step, 1);
    dp_optim_free(&o);
}

/* What a checkpoint does: save step and state, restore into a fresh
 * optimizer, continue.  The result must equal an uninterrupted run bit for bit. */
TEST(optim_resume_from_saved_state_is_exact) {
    enum { n = 777, before = 3, after = 4 };
    static float p1[n], p2[n], g[n];
    for (int kind = 0; kind < DP_OPTIM_KIND_COUNT; kind++) {
        struct dp_optim_params hp = dp_optim_default_params();
        hp.kind = (enum dp_optim_kind)kind, hp.momentum = 0.9f, hp.weight_decay = 0.01f;
        struct dp_optim a, b;
        ASSERT_OK(dp_optim_init(&a, &hp, n));
        fill(p1, n, 3, 0);
        for (int s = 0; s < before; s++) {
            fill(g, n, 4, (uint64_t)s);
            ASSERT_OK(dp_optim_step(&a, p1, g, n, 0.01f));
        }
        memcpy(p2, p1, sizeof p1);
        ASSERT_OK(dp_optim_init(&b, &hp, n));
        ASSERT_EQ(b.state_len, a.state_len);
        memcpy(b.state, a.state, sizeof(float) * (size_t)a.state_len);
        b.step = a.step;
        for (int s = before; s < before + after; s++) {
            fill(g, n, 4, (uint64_t)s);
            ASSERT_OK(dp_optim_step(&a, p1, g, n, 0.01f));
            ASSERT_OK(dp_optim_step(&b, p2, g, n, 0.01f));
        }
        ASSERT_TRUE(memcmp(p1, p2, sizeof p1) == 0);
        ASSERT_TRUE(memcmp(a.state, b.state, sizeof(float) * (size_t)a.state_len) == 0);
        dp_optim_free(&a);
        dp_optim_free(&b);
    }
}

static void expect_rejected(struct dp_optim_params hp, const char *needle) {
    struct dp_optim o;
    ASSERT_ERR(dp_optim_check(&hp), DP_EINVAL, needle);
    ASSERT_ERR(dp_optim_init(&o, &hp, 10), DP_EINVAL, needle);
    ASSERT_TRUE(o.state == NULL && o.state_len == 0);
    dp_optim_free(&o);
}

TEST(optim_invalid_params_rejected) {
    struct dp_optim_params d = dp_optim_default_params(), hp;
    hp = d, hp.momentum = -0.1f;
    expect_rejected(hp, "momentum");
    hp = d, hp.momentum = 1.0f;
    expect_rejected(hp, "sgd: momentum 1 must be in [0, 1)");
    hp = d, hp.momentum = NAN;
    expect_rejected(hp, "momentum");
    hp = d, hp.dampening = 1.5f;
    expect_rejected(hp, "dampening");
    hp = d, hp.nesterov = 1; /* no momentum */
    expect_rejected(hp, "nesterov momentum requires momentum > 0");
    hp = d, hp.nesterov = 1, hp.momentum = 0.9f, hp.dampening = 0.1f;
    expect_rejected(hp, "dampening 0");
    hp = d, hp.weight_decay = -1e-4f;
    expect_rejected(hp, "weight_decay");
    hp = d, hp.kind = (enum dp_optim_kind)7;
    expect_rejected(hp, "unknown kind 7");
    hp = d, hp.kind = DP_OPTIM_ADAMW, hp.beta1 = 1.0f;
    expect_rejected(hp, "adamw: beta1 1");
    hp = d, hp.kind = DP_OPTIM_ADAMW, hp.beta2 = -0.5f;
    expect_rejected(hp, "beta2");
    hp = d, hp.kind = DP_OPTIM_ADAMW, hp.eps = 0.0f;
    expect_rejected(hp, "eps");
    hp = d, hp.kind = DP_OPTIM_ADAMW, hp.weight_decay = -1.0f;
    expect_rejected(hp, "adamw: weight_decay");
    /* SGD fields do not matter to AdamW, nor AdamW fields to SGD. */
    hp = d, hp.kind = DP_OPTIM_ADAMW, hp.momentum = 5.0f, hp.nesterov = 1;
    ASSERT_OK(dp_optim_check(&hp));
    hp = d, hp.beta1 = 2.0f, hp.eps = -1.0f;
    ASSERT_OK(dp_optim_check(&hp));

    struct dp_optim o;
    ASSERT_ERR(dp_optim_init(&o, &d, -1), DP_EINVAL, "negative");
    ASSERT_OK(dp_optim_init(&o, &d, 4));
    float p[5] = {0}, g[5] = {0};
    ASSERT_ERR(dp_optim_step(&o, p, g, 5, 0.1f), DP_EINVAL, "step over 5 floats, but initialised for 4");
    ASSERT_EQ(o.step, 0);
    dp_optim_free(&o);
}

static void *failing_alloc(size_t size, void *user) {
    (void)size, (void)user;
    return NULL;
}
static void failing_free(void *p, void *user) { (void)p, (void)user; }

TEST(optim_out_of_memory_reported) {
    struct dp_allocator fail = {failing_alloc, failing_free, NULL};
    struct dp_optim_params hp = dp_optim_default_params();
    hp.kind = DP_OPTIM_ADAMW;
    struct dp_optim o;
    dp_set_allocator(&fail);
    int rc = dp_optim_init(&o, &hp, 1000);
    dp_set_allocator(NULL);
    ASSERT_EQ(rc, DP_ENOMEM);
    ASSERT_TRUE(strstr(dp_errmsg(), "adamw: cannot allocate 8000 bytes") != NULL);
    ASSERT_TRUE(o.state == NULL);
    dp_optim_free(&o);
}

TEST(optim_names) {
    for (int k = 0; k < DP_OPTIM_KIND_COUNT; k++)
        ASSERT_EQ(dp_optim_kind_parse(dp_optim_kind_name((enum dp_optim_kind)k)), k);
    ASSERT_TRUE(strcmp(dp_optim_kind_name(DP_OPTIM_ADAMW), "adamw") == 0);
    ASSERT_TRUE(strcmp(dp_optim_kind_name((enum dp_optim_kind)42), "unknown") == 0);
    ASSERT_EQ(dp_optim_kind_parse("adam"), -1);
    ASSERT_EQ(dp_optim_kind_parse(NULL), -1);
    for (int k = 0; k < DP_SCHED_KIND_COUNT; k++)
        ASSERT_EQ(dp_sched_kind_parse(dp_sched_kind_name((enum dp_sched_kind)k)), k);
    ASSERT_TRUE(strcmp(dp_sched_kind_name(DP_SCHED_COSINE), "cosine") == 0);
    ASSERT_EQ(dp_sched_kind_parse("linear"), -1);
    ASSERT_EQ(dp_sched_kind_parse(NULL), -1);
}

/* ============================================================================
 * Schedules
 * ========================================================================= */

TEST(optim_sched_boundaries) {
    struct dp_sched s = {.kind = DP_SCHED_CONSTANT, .base_lr = 0.1f};
    ASSERT_OK(dp_sched_check(&s));
    ASSERT_TRUE(dp_sched_lr(&s, 0) == 0.1f && dp_sched_lr(&s, 1000000) == 0.1f);

    s = (struct dp_sched){.kind = DP_SCHED_STEP, .base_lr = 0.1f, .step_size = 10, .gamma = 0.5f};
    ASSERT_OK(dp_sched_check(&s));
    ASSERT_NEAR(dp_sched_lr(&s, 0), 0.1, 1e-8);
    ASSERT_NEAR(dp_sched_lr(&s, 9), 0.1, 1e-8);
    ASSERT_NEAR(dp_sched_lr(&s, 10), 0.05, 1e-8);
    ASSERT_NEAR(dp_sched_lr(&s, 19), 0.05, 1e-8);
    ASSERT_NEAR(dp_sched_lr(&s, 20), 0.025, 1e-8);
    ASSERT_NEAR(dp_sched_lr(&s, -5), 0.1, 1e-8);

    /* Cosine from 1 to 0.1 over 110 steps, 10 of them warmup. */
    s = (struct dp_sched){.kind = DP_SCHED_COSINE, .base_lr = 1.0f, .min_lr = 0.1f,
                          .warmup_steps = 10, .total_steps = 110};
    ASSERT_OK(dp_sched_check(&s));
    ASSERT_NEAR(dp_sched_lr(&s, 0), 0.1, 1e-7);  /* base * 1/10 */
    ASSERT_NEAR(dp_sched_lr(&s, 4), 0.5, 1e-7);
    ASSERT_NEAR(dp_sched_lr(&s, 9), 1.0, 1e-7);  /* last warmup step reaches base */
    ASSERT_NEAR(dp_sched_lr(&s, 10), 1.0, 1e-7); /* cos(0) */
    ASSERT_NEAR(dp_sched_lr(&s, 60), 0.55, 1e-7); /* halfway: cos(pi/2) = 0 */
    ASSERT_NEAR(dp_sched_lr(&s, 109), 0.1 + 0.45 * (1 + cos(M_PI * 99 / 100)), 1e-7);
    ASSERT_NEAR(dp_sched_lr(&s, 110), 0.1, 1e-7);
    ASSERT_NEAR(dp_sched_lr(&s, 100000), 0.1, 1e-7);
    for (int64_t t = 11; t < 110; t++) ASSERT_TRUE(dp_sched_lr(&s, t) <= dp_sched_lr(&s, t - 1));

    s.warmup_steps = 0; /* no warmup: starts at base */
    ASSERT_NEAR(dp_sched_lr(&s, 0), 1.0, 1e-7);
    ASSERT_NEAR(dp_sched_lr(&s, 55), 0.55, 1e-7);
    s.warmup_steps = 110; /* warmup only */
    ASSERT_NEAR(dp_sched_lr(&s, 109), 1.0, 1e-7);
    ASSERT_NEAR(dp_sched_lr(&s, 110), 0.1, 1e-7);
}

TEST(optim_sched_invalid_rejected) {
    struct dp_sched s = {.kind = DP_SCHED_STEP, .base_lr = 0.1f, .step_size = 0, .gamma = 0.5f};
    ASSERT_ERR(dp_sched_check(&s), DP_EINVAL, "step_size 0");
    s.step_size = 10, s.gamma = 0;
    ASSERT_ERR(dp_sched_check(&s), DP_EINVAL, "gamma");
    s = (struct dp_sched){.kind = DP_SCHED_COSINE, .base_lr = 1, .total_steps = 10, .warmup_steps = 11};
    ASSERT_ERR(dp_sched_check(&s), DP_EINVAL, "warmup_steps 11 must be in [0, 10]");
    s.warmup_steps = 0, s.total_steps = 0;
    ASSERT_ERR(dp_sched_check(&s), DP_EINVAL, "total_steps");
    s.total_steps = 10, s.min_lr = 2;
    ASSERT_ERR(dp_sched_check(&s), DP_EINVAL, "min_lr");
    s.min_lr = 0, s.base_lr = -1;
    ASSERT_ERR(dp_sched_check(&s), DP_EINVAL, "base_lr");
    s.kind = (enum dp_sched_kind)9;
    ASSERT_ERR(dp_sched_check(&s), DP_EINVAL, "unknown kind 9");
}

/* ============================================================================
 * Clipping
 * ========================================================================= */

TEST(optim_clip_grad_norm) {
    float g[2] = {3, 4};
    ASSERT_NEAR(dp_grad_norm(g, 2), 5.0, 1e-12);
    ASSERT_NEAR(dp_clip_grad_norm(g, 2, 10.0), 5.0, 1e-12); /* below: unchanged */
    ASSERT_TRUE(g[0] == 3.0f && g[1] == 4.0f);
    ASSERT_NEAR(dp_clip_grad_norm(g, 2, 5.0), 5.0, 1e-12); /* coef just under 1: scaled */
    ASSERT_NEAR(g[0], 3.0 * 5 / (5 + 1e-6), 1e-6);
    g[0] = 3, g[1] = 4;
    ASSERT_NEAR(dp_clip_grad_norm(g, 2, 1.0), 5.0, 1e-12); /* above: scaled to ~1 */
    ASSERT_NEAR(g[0], 0.6 / (1 + 2e-7), 1e-7);
    ASSERT_NEAR(g[1], 0.8 / (1 + 2e-7), 1e-7);
    ASSERT_NEAR(dp_grad_norm(g, 2), 1.0, 1e-6);
    ASSERT_NEAR(dp_grad_norm(NULL, 0), 0.0, 0);
    ASSERT_NEAR(dp_clip_grad_norm(NULL, 0, 1.0), 0.0, 0);

    /* Large random slab vs a plain double sum. */
    enum { n = 100003 };
    static float x[n];
    fill(x, n, 11, 0);
    double acc = 0;
    for (int i = 0; i < n; i++) acc += (double)x[i] * x[i];
    double norm = sqrt(acc);
    ASSERT_NEAR(dp_grad_norm(x, n), norm, 1e-12 * norm);
    ASSERT_NEAR(dp_clip_grad_norm(x, n, 1.0), norm, 1e-12 * norm);
    ASSERT_NEAR(dp_grad_norm(x, n), 1.0, 1e-5);

    /* A non-finite norm is returned and g left alone. */
    float h[3] = {1, INFINITY, 2};
    ASSERT_TRUE(isinf(dp_clip_grad_norm(h, 3, 1.0)));
    ASSERT_TRUE(h[0] == 1.0f && h[2] == 2.0f);
    h[1] = NAN;
    ASSERT_TRUE(isnan(dp_clip_grad_norm(h, 3, 1.0)));
    ASSERT_TRUE(h[0] == 1.0f && h[2] == 2.0f);
}

/* ============================================================================
 * PyTorch fixture
 * ========================================================================= */

static int read_u32(FILE *f, uint32_t *v) { return fread(v, 4, 1, f) == 1; }

TEST(optim_torch_fixture) {
    char path[512];
    snprintf(path, sizeof path, "%s/optim_ref.bin", dp_test_fixtures());
    FILE *f = fopen(path, "rb");
    if (!f) SKIP("%s missing (run tests/torch/gen_optim_fixture.py)", path);
    char magic[4];
    uint32_t version = 0, n = 0, steps = 0, ncases = 0;
    ASSERT_TRUE(fread(magic, 4, 1, f) == 1 && memcmp(magic, "DPFX", 4) == 0);
    ASSERT_TRUE(read_u32(f, &version) && read_u32(f, &n) && read_u32(f, &steps) &&
                read_u32(f, &ncases));
    ASSERT_EQ(version, 1);
    ASSERT_TRUE(n > 0 && n <= 4096 && steps > 0 && steps <= 16 && ncases > 0 && ncases <= 16);
    float *p0 = malloc(sizeof(float) * n), *g = malloc(sizeof(float) * n * steps);
    float *p = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n * steps);
    ASSERT_TRUE(p0 && g && p && want);
    ASSERT_TRUE(fread(p0, sizeof(float), n, f) == n);
    ASSERT_TRUE(fread(g, sizeof(float), (size_t)n * steps, f) == (size_t)n * steps);
    for (uint32_t c = 0; c < ncases; c++) {
        uint32_t kind = 0;
        float hpv[8] = {0}; /* lr, momentum, dampening, weight_decay, nesterov, beta1, beta2, eps */
        ASSERT_TRUE(read_u32(f, &kind) && fread(hpv, sizeof(float), 8, f) == 8);
        ASSERT_TRUE(fread(want, sizeof(float), (size_t)n * steps, f) == (size_t)n * steps);
        struct dp_optim_params hp = dp_optim_default_params();
        hp.kind = (enum dp_optim_kind)kind;
        hp.momentum = hpv[1], hp.dampening = hpv[2], hp.weight_decay = hpv[3];
        hp.nesterov = hpv[4] != 0, hp.beta1 = hpv[5], hp.beta2 = hpv[6], hp.eps = hpv[7];
        struct dp_optim o;
        ASSERT_OK(dp_optim_init(&o, &hp, n));
        memcpy(p, p0, sizeof(float) * n);
        for (uint32_t s = 0; s < steps; s++) {
            ASSERT_OK(dp_optim_step(&o, p, g + (size_t)s * n, n, hpv[0]));
            for (uint32_t i = 0; i < n; i++) {
                double w = want[(size_t)s * n + i];
                /* 1e-6 relative; values under 0.01 (cancellation) count as 0.01.
                 * With hardware FMA the results are in fact bit-identical. */
                if (!(fabs(p[i] - w) <= 1e-6 * fmax(fabs(w), 1e-2)))
                    dp_test_fail(__FILE__, __LINE__, "case %u (%s) step %u p[%u] = %.9g, torch %.9g",
                                 c, dp_optim_kind_name(hp.kind), s, i, (double)p[i], w);
            }
        }
        dp_optim_free(&o);
    }
    uint8_t extra;
    ASSERT_TRUE(fread(&extra, 1, 1, f) == 0); /* nothing after the last case */
    fclose(f);
    free(p0), free(g), free(p), free(want);
}
