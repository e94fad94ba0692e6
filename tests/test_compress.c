/* Gradient compression (src/ddp/compress.c): the pure helpers against plain
 * references, each scheme through the reducer on a team of threads against
 * the plain sum, error feedback's conservation law, training with every
 * scheme, clipping after decompression, and the error-feedback state in
 * checkpoints. */
#include <pthread.h>
#include <stdlib.h>

#include "ddp/compress_impl.h"
#include "ddp_util.h"
#include "dp/ddp.h"
#include "dp/train.h"
#include "test.h"

/* ---- specs ---- */

TEST(compress_parse_specs) {
    struct dp_compress_params p = {0};
    ASSERT_OK(dp_compress_parse("topk:0.01", &p));
    ASSERT_EQ(p.kind, DP_COMPRESS_TOPK);
    ASSERT_NEAR(p.fraction, 0.01, 1e-15);
    ASSERT_OK(dp_compress_parse("powersgd:4", &p));
    ASSERT_EQ(p.kind, DP_COMPRESS_POWERSGD);
    ASSERT_EQ(p.rank, 4);
    ASSERT_OK(dp_compress_parse("bf16", &p));
    ASSERT_EQ(p.kind, DP_COMPRESS_BF16);
    ASSERT_OK(dp_compress_parse("fp16", &p));
    ASSERT_OK(dp_compress_parse("sign", &p));
    ASSERT_OK(dp_compress_parse("none", &p));
    ASSERT_EQ(p.kind, DP_COMPRESS_NONE);
    ASSERT_ERR(dp_compress_parse("topk:0", &p), DP_EINVAL, "0 < FRACTION <= 1");
    ASSERT_ERR(dp_compress_parse("topk:2", &p), DP_EINVAL, "0 < FRACTION <= 1");
    ASSERT_ERR(dp_compress_parse("topk:x", &p), DP_EINVAL, "0 < FRACTION <= 1");
    ASSERT_ERR(dp_compress_parse("topk", &p), DP_EINVAL, "needs a value");
    ASSERT_ERR(dp_compress_parse("powersgd:0", &p), DP_EINVAL, "RANK in 1..1024");
    ASSERT_ERR(dp_compress_parse("powersgd:2.5", &p), DP_EINVAL, "RANK in 1..1024");
    ASSERT_ERR(dp_compress_parse("gzip", &p), DP_EINVAL, "unknown scheme 'gzip'");
    ASSERT_ERR(dp_compress_parse("sign:3", &p), DP_EINVAL, "takes no value");
    ASSERT_EQ(p.kind, DP_COMPRESS_NONE); /* a refused spec changes nothing */
}

/* ---- pure helpers ---- */

TEST(compress_fp16_conversion) {
    ASSERT_EQ(dp__f16_from_f32(1.0f), 0x3c00);
    ASSERT_EQ(dp__f16_from_f32(-2.0f), 0xc000);
    ASSERT_EQ(dp__f16_from_f32(65504.0f), 0x7bff);
    ASSERT_EQ(dp__f16_from_f32(65519.0f), 0x7bff);
    ASSERT_EQ(dp__f16_from_f32(65520.0f), 0x7c00); /* the tie rounds to even: infinity */
    ASSERT_EQ(dp__f16_from_f32(ldexpf(1, -24)), 0x0001);
    ASSERT_EQ(dp__f16_from_f32(ldexpf(1, -25)), 0x0000);     /* tie to even */
    ASSERT_EQ(dp__f16_from_f32(ldexpf(3, -25)), 0x0002);     /* tie to even */
    ASSERT_EQ(dp__f16_from_f32(1.0f + ldexpf(1, -11)), 0x3c00); /* tie to even (down) */
    ASSERT_EQ(dp__f16_from_f32(1.0f + ldexpf(3, -11)), 0x3c02); /* tie to even (up) */
    ASSERT_TRUE(isnan(dp__f16_to_f32(dp__f16_from_f32(NAN))));
    /* every finite half survives half -> float -> half */
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue; /* NaN */
        float f = dp__f16_to_f32((uint16_t)h);
        if (dp__f16_from_f32(f) != h) dp_test_fail(__FILE__, __LINE__, "half 0x%04x -> %g -> 0x%04x", h, f,
                                                   dp__f16_from_f32(f));
    }
}

TEST(compress_wire_bytes_survive_copy_and_sum) {
    uint8_t src[301], dst[301];
    float w[101];
    for (int i = 0; i < 301; i++) src[i] = (uint8_t)(i * 97 + 13);
    src[0] = src[1] = src[2] = 0xff; /* the largest word */
    for (size_t n = 0; n <= 301; n += 1 + n / 7) {
        ASSERT_EQ(dp__wire_words(n), (n + 2) / 3);
        dp__wire_pack(src, n, w);
        for (size_t j = 0; j < dp__wire_words(n); j++) {
            ASSERT_TRUE(w[j] >= 0 && w[j] < 16777216.0f && w[j] == floorf(w[j]));
            volatile float zero = 0.0f;
            w[j] = w[j] + zero; /* what a hierarchical all-gather does to it */
        }
        memset(dst, 0, sizeof dst);
        dp__wire_unpack(w, n, dst);
        ASSERT_TRUE(memcmp(src, dst, n) == 0);
    }
}

static int cmp_desc_abs(const void *a, const void *b) {
    float x = fabsf(*(const float *)a), y = fabsf(*(const float *)b);
    return x < y ? 1 : x > y ? -1 : 0;
}

TEST(compress_topk_selects_the_k_largest) {
    enum { N = 1000 };
    float v[N], s[N];
    uint32_t idx[N];
    for (int trial = 0; trial < 3; trial++) {
        for (int i = 0; i < N; i++) {
            v[i] = dp_rng_normal(7, DP_RNG_USER, (uint64_t)trial, (uint64_t)i);
            if (trial == 2 && i % 3) v[i] = 0; /* many ties at zero */
        }
        memcpy(s, v, sizeof v);
        qsort(s, N, sizeof(float), cmp_desc_abs);
        int64_t ks[] = {1, 2, 37, 333, 500, 999, 1000};
        for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) {
            int64_t k = ks[t];
            for (int i = 0; i < N; i++) idx[i] = (uint32_t)i;
            dp__topk_select(v, idx, N, k);
            /* a permutation, and the first k are the k largest magnitudes */
            static unsigned char seen[N];
            memset(seen, 0, sizeof seen);
            for (int i = 0; i < N; i++) seen[idx[i]]++;
            for (int i = 0; i < N; i++) ASSERT_EQ(seen[i], 1);
            float kth = fabsf(s[k - 1]);
            for (int64_t i = 0; i < k; i++) ASSERT_TRUE(fabsf(v[idx[i]]) >= kth);
            for (int64_t i = k; i < N; i++) ASSERT_TRUE(fabsf(v[idx[i]]) <= kth);
        }
    }
}

TEST(compress_sign_pack) {
    float p[19] = {1, -1, 0, -0.5f, 2, 3, -4, -5, 6, -7, 0, 0, 0, 0, 0, 0, -1, 1, -1};
    uint8_t bits[3] = {0xaa, 0xaa, 0xaa};
    dp__sign_pack(p, 19, bits);
    for (int i = 0; i < 19; i++) ASSERT_EQ((bits[i >> 3] >> (i & 7)) & 1, p[i] < 0);
    ASSERT_EQ(bits[2] >> 3, 0); /* the padding bits are zero */
}

/* sign's scale is |p|_2 / sqrt(n), not the mean |p| (compress.c): for
 * p = (5, -1, -1, -1, -1, 1, 1, 1), |p|_2^2 = 32, so s = sqrt(32 / 8) = 2
 * (the mean |p| is 1.5), and the scaled sign 2 sign(p) has p's norm. */
TEST(compress_sign_scale) {
    const float p[8] = {5, -1, -1, -1, -1, 1, 1, 1};
    ASSERT_FEQ(dp__sign_scale(p, 8), 2.0f);
    ASSERT_FEQ(dp__sign_scale(p + 1, 7), 1.0f);
    ASSERT_FEQ(dp__sign_scale(p, 0), 0.0f);
    const float q[2] = {-3, 4}; /* |q|_2 = 5: s = 5 / sqrt(2) */
    ASSERT_NEAR(dp__sign_scale(q, 2), 5.0 / sqrt(2.0), 1e-6);
}

TEST(compress_gram_schmidt_orthonormal) {
    enum { N = 9, R = 4 };
    float P[N * R];
    for (int i = 0; i < N * R; i++) P[i] = dp_rng_normal(3, DP_RNG_USER, 0, (uint64_t)i);
    dp__gram_schmidt(P, N, R);
    for (int a = 0; a < R; a++)
        for (int b = 0; b < R; b++) {
            double d = 0;
            for (int k = 0; k < N; k++) d += (double)P[k * R + a] * P[k * R + b];
            ASSERT_NEAR(d, a == b ? 1.0 : 0.0, 1e-5);
        }
}

/* ---- through the reducer, on a team of P threads ---- */

#define MODEL "mlp:24,16,12,10" /* weights (16, 24), (12, 16), (10, 12) and biases */
#define MAXP 4
#define STEPS 5

struct team {
    struct dp_compress_params cp;
    int P, steps;
    int64_t n;
    size_t bucket_cap;
    struct dp_model *m;
    float *gsum;             /* (P, n) sum over steps of each rank's gradient */
    float *applied;          /* (P, n) sum over steps of the reduced slab on each rank */
    float *last;             /* (P, n) the last step's reduced slab and gradient */
    float *lastg;
    float *resid;            /* (P, n) the final residual (0 without one) */
    float *msum;             /* (P, n) local momentum (cp.momentum > 0): the sum over steps of the
                                optimizer's momentum m = beta m + slab, as each rank sees it */
    float *usum;             /* (P, n) and of each rank's own momentum u = beta u + g */
    double sent;             /* rank 0's wire bytes in the last step, and fp32's */
    double fp32;
};
struct member {
    struct team *t;
    struct dp_comm_world *w;
    int rank;
};

/* Rank r's gradient at step s: normal, with a few large entries. */
static float grad_value(int r, int s, int64_t i) {
    float g = dp_rng_normal(11, DP_RNG_USER, (uint64_t)(r * 100 + s), (uint64_t)i) * 1e-2f;
    return i % 17 == 0 ? g * 30 : g;
}

static void *member_main(void *arg) {
    struct member *mb = arg;
    struct team *t = mb->t;
    struct dp_comm *c;
    ASSERT_OK(dp_comm_thread_init(&c, mb->w, mb->rank));
    float *g = dp_malloc_big(sizeof(float) * (size_t)t->n);
    float *mm = calloc((size_t)t->n, sizeof(float)), *uu = calloc((size_t)t->n, sizeof(float));
    const float beta = t->cp.momentum;
    struct dp_reducer_params rp = dp_reducer_default_params();
    rp.compress = t->cp;
    rp.compress.seed = 5;
    rp.bucket_cap_bytes = t->bucket_cap, rp.first_bucket_bytes = t->bucket_cap;
    struct dp_reducer r;
    ASSERT_OK(dp_reducer_init(&r, t->m, c, g, &rp));
    const int64_t n = t->n, me = mb->rank;
    for (int s = 0; s < t->steps; s++) {
        for (int64_t i = 0; i < n; i++) g[i] = grad_value(mb->rank, s, i), t->gsum[me * n + i] += g[i];
        for (int64_t i = 0; i < n; i++) uu[i] = beta * uu[i] + g[i], t->usum[me * n + i] += uu[i];
        memcpy(t->lastg + me * n, g, sizeof(float) * (size_t)n);
        r.step = s;
        dp_reducer_begin(&r);
        /* backward's order: the layers from the last */
        for (int l = t->m->nlayers - 1; l >= 0; l--)
            if (t->m->layers[l]->param_count)
                dp_reducer_grad_ready(&r, t->m->layers[l]->param_off, t->m->layers[l]->param_count);
        ASSERT_OK(dp_reducer_finish(&r));
        for (int64_t i = 0; i < n; i++) t->applied[me * n + i] += g[i];
        for (int64_t i = 0; i < n; i++) mm[i] = beta * mm[i] + g[i], t->msum[me * n + i] += mm[i];
        memcpy(t->last + me * n, g, sizeof(float) * (size_t)n);
    }
    const float *e = dp_reducer_residual(&r);
    for (int64_t i = 0; i < n; i++) t->resid[me * n + i] = e ? e[i] : 0;
    if (me == 0) t->sent = r.bytes_sent, t->fp32 = r.bytes_fp32;
    dp_reducer_free(&r);
    dp_free(g);
    free(mm), free(uu);
    dp_comm_free(c);
    return NULL;
}

static void run_team(struct team *t) {
    ASSERT_OK(dp_model_from_spec(&t->m, MODEL, 1, 1, 24));
    t->n = t->m->num_params;
    size_t sz = sizeof(float) * (size_t)(MAXP * t->n);
    t->gsum = calloc(1, sz), t->applied = calloc(1, sz), t->last = calloc(1, sz), t->lastg = calloc(1, sz);
    t->resid = calloc(1, sz), t->msum = calloc(1, sz), t->usum = calloc(1, sz);
    if (!t->bucket_cap) t->bucket_cap = 4 * 200; /* several buckets */
    struct dp_comm_world *w;
    ASSERT_OK(dp_comm_thread_world_init(&w, t->P, NULL));
    pthread_t th[MAXP];
    struct member mb[MAXP];
    for (int r = 0; r < t->P; r++) {
        mb[r] = (struct member){t, w, r};
        ASSERT_EQ(pthread_create(&th[r], NULL, member_main, &mb[r]), 0);
    }
    for (int r = 0; r < t->P; r++) pthread_join(th[r], NULL);
    dp_comm_thread_world_free(w);
    /* every rank applied the same bits */
    for (int r = 1; r < t->P; r++)
        ASSERT_TRUE(memcmp(t->last, t->last + r * t->n, sizeof(float) * (size_t)t->n) == 0);
}

static void team_free(struct team *t) {
    free(t->gsum), free(t->applied), free(t->last), free(t->lastg), free(t->resid), free(t->msum), free(t->usum);
    dp_model_free(t->m);
}

/* The last step's slab against the plain sum of the ranks' gradients:
 * |got - sum| <= tol_rel * max|contribution| elementwise. */
static void expect_close_to_sum(const struct team *t, double tol_rel, const char *what) {
    double worst = 0;
    for (int64_t i = 0; i < t->n; i++) {
        double sum = 0, mx = 0;
        for (int r = 0; r < t->P; r++) sum += t->lastg[r * t->n + i], mx = fmax(mx, fabs(t->lastg[r * t->n + i]));
        double d = fabs(t->last[i] - sum) / (mx > 0 ? mx : 1);
        if (d > worst) worst = d;
    }
    fprintf(stderr, "    %s P=%d: worst error %.3g of the largest contribution\n", what, t->P, worst);
    ASSERT_TRUE(worst <= tol_rel);
}

TEST(compress_bf16_matches_the_sum) {
    for (int P = 2; P <= 3; P++) {
        struct team t = {.cp = {.kind = DP_COMPRESS_BF16}, .P = P, .steps = 1};
        run_team(&t);
        expect_close_to_sum(&t, P * 3 * 0x1p-8, "bf16"); /* rounded <= P-1 hops + the input */
        ASSERT_NEAR(t.fp32 / t.sent, 2.0, 1e-9);
        team_free(&t);
    }
}

TEST(compress_fp16_matches_the_sum) {
    for (int P = 2; P <= 4; P += 2) {
        struct team t = {.cp = {.kind = DP_COMPRESS_FP16}, .P = P, .steps = 1};
        run_team(&t);
        /* each contribution is rounded once, to 2^-11 relative of its value
         * (or 2^-25 of its bucket's max, in the subnormals): tiny */
        expect_close_to_sum(&t, P * 0x1p-10, "fp16");
        team_free(&t);
    }
}

TEST(compress_topk_fraction_one_is_the_exact_sum) {
    struct team t = {.cp = {.kind = DP_COMPRESS_TOPK, .fraction = 1.0}, .P = 2, .steps = 1};
    run_team(&t);
    for (int64_t i = 0; i < t.n; i++) ASSERT_FEQ(t.last[i], t.lastg[i] + t.lastg[t.n + i]);
    for (int64_t i = 0; i < 2 * t.n; i++) ASSERT_FEQ(t.resid[i], 0.0f);
    team_free(&t);
}

/* Error feedback loses nothing: summed over steps and ranks, what was
 * applied plus what is still held back equals the gradients. */
static void expect_conservation(struct dp_compress_params cp, int P, const char *what) {
    struct team t = {.cp = cp, .P = P, .steps = STEPS};
    run_team(&t);
    double worst = 0, scale = 0, held = 0;
    for (int64_t i = 0; i < t.n; i++) {
        double g = 0, e = 0;
        for (int r = 0; r < P; r++) g += t.gsum[r * t.n + i], e += t.resid[r * t.n + i];
        worst = fmax(worst, fabs(t.applied[i] + e - g));
        scale = fmax(scale, fabs(g));
        held = fmax(held, fabs(e));
    }
    fprintf(stderr, "    %s P=%d: |applied + residual - gradients| <= %.3g (largest gradient sum %.3g, residual "
            "%.3g), wire %.1fx less than fp32\n", what, P, worst, scale, held, t.fp32 / t.sent);
    ASSERT_TRUE(held > 1e-3 * scale); /* the scheme did hold something back */
    ASSERT_TRUE(worst <= 1e-5 * scale);
    ASSERT_TRUE(t.fp32 / t.sent > 2);
    team_free(&t);
}

TEST(compress_topk_error_feedback_conserves) {
    expect_conservation((struct dp_compress_params){.kind = DP_COMPRESS_TOPK, .fraction = 0.05}, 2, "topk:0.05");
    expect_conservation((struct dp_compress_params){.kind = DP_COMPRESS_TOPK, .fraction = 0.01}, 3, "topk:0.01");
}

TEST(compress_sign_error_feedback_conserves) {
    expect_conservation((struct dp_compress_params){.kind = DP_COMPRESS_SIGN}, 2, "sign");
    expect_conservation((struct dp_compress_params){.kind = DP_COMPRESS_SIGN}, 4, "sign");
}

/* topk and sign work per tensor, 1-D tensors whole (compress.c
 * plan_segments), even when one bucket holds the whole model: one step
 * against an oracle that applies the rule to each rank's gradient tensor by
 * tensor.  topk: a rank sends its k_t = ceil(F n_t) largest |g| of each
 * matrix; sign: |g|_2 / sqrt(n_t) of the tensor times sign(g); both: every
 * bias. */
static void expect_per_tensor(struct dp_compress_params cp) {
    struct team t = {.cp = cp, .P = 2, .steps = 1, .bucket_cap = 1u << 20};
    run_team(&t);
    const struct dp_model *m = t.m;
    double worst = 0;
    for (int pi = 0; pi < m->nparams; pi++) {
        const struct dp_param_info *q = &m->params[pi];
        int64_t o = q->offset, n = q->count;
        for (int r = 0; r < 2; r++) {
            const float *g = t.lastg + r * t.n + o;
            double l2 = 0, kth = 0;
            for (int64_t i = 0; i < n; i++) l2 += (double)g[i] * g[i];
            const double sc = sqrt(l2 / (double)n);
            if (q->shape.ndim >= 2 && cp.kind == DP_COMPRESS_TOPK) { /* the k-th largest |g| */
                float *a = malloc(sizeof(float) * (size_t)n);
                for (int64_t i = 0; i < n; i++) a[i] = g[i];
                qsort(a, (size_t)n, sizeof *a, cmp_desc_abs);
                kth = fabs(a[(int64_t)ceil(cp.fraction * (double)n) - 1]);
                free(a);
            }
            for (int64_t i = 0; i < n; i++) {
                double want = q->shape.ndim < 2                ? g[i]
                              : cp.kind == DP_COMPRESS_TOPK ? (fabs(g[i]) >= kth ? g[i] : 0)
                                                            : (g[i] < 0 ? -sc : sc);
                t.last[o + i] -= (float)want; /* what is left must be 0 */
            }
        }
        for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(t.last[o + i]));
    }
    fprintf(stderr, "    %s, one bucket: |slab - per-tensor oracle| <= %.3g\n", dp_compress_name(cp.kind), worst);
    ASSERT_TRUE(worst <= 1e-6);
    team_free(&t);
}

TEST(compress_topk_and_sign_per_tensor) {
    expect_per_tensor((struct dp_compress_params){.kind = DP_COMPRESS_TOPK, .fraction = 0.05});
    expect_per_tensor((struct dp_compress_params){.kind = DP_COMPRESS_SIGN});
}

/* Local momentum (cp.momentum = the optimizer's beta; compress.c lm_begin):
 * each rank compresses its own momentum u = beta u + g and the slab is
 * S_t - beta S_{t-1}, so that the optimizer's momentum m = beta m + slab is
 * S_t, the sum of what was sent.  Then, summed over steps and ranks,
 * m + residuals = u, to rounding (sign: every element is sent each step, no
 * masking).  Without it (the plain form) m is the momentum of the
 * compressed gradients, and the law fails. */
TEST(compress_local_momentum_conserves) {
    for (int P = 2; P <= 3; P++) {
        struct team t = {.cp = {.kind = DP_COMPRESS_SIGN, .momentum = 0.9f}, .P = P, .steps = STEPS};
        run_team(&t);
        double worst = 0, scale = 0;
        for (int64_t i = 0; i < t.n; i++) {
            double u = 0, e = 0;
            for (int r = 0; r < P; r++) u += t.usum[r * t.n + i], e += t.resid[r * t.n + i];
            worst = fmax(worst, fabs(t.msum[i] + e - u));
            scale = fmax(scale, fabs(u));
        }
        fprintf(stderr, "    sign, momentum 0.9, P=%d: |sum m + residual - sum u| <= %.3g (largest %.3g)\n", P, worst,
                scale);
        ASSERT_TRUE(worst <= 1e-5 * scale);
        team_free(&t);
    }
}

TEST(compress_powersgd_error_feedback_conserves) {
    expect_conservation((struct dp_compress_params){.kind = DP_COMPRESS_POWERSGD, .rank = 1, .compress_all = 1}, 2,
                        "powersgd:1");
    expect_conservation((struct dp_compress_params){.kind = DP_COMPRESS_POWERSGD, .rank = 2, .compress_all = 1}, 3,
                        "powersgd:2");
}

/* --no-error-feedback (cp.no_ef): each step compresses its gradient alone,
 * so the last step's slab plus the residuals (what that step left out)
 * equals the last step's gradients; with error feedback it does not (the
 * residual also carries the earlier steps), which the test checks too, so
 * it can tell the two apart. */
static double last_step_gap(struct dp_compress_params cp, double *scale) {
    struct team t = {.cp = cp, .P = 2, .steps = STEPS};
    run_team(&t);
    double worst = 0;
    *scale = 0;
    for (int64_t i = 0; i < t.n; i++) {
        double g = t.lastg[i] + t.lastg[t.n + i], e = t.resid[i] + t.resid[t.n + i];
        worst = fmax(worst, fabs(t.last[i] + e - g));
        *scale = fmax(*scale, fabs(g));
    }
    team_free(&t);
    return worst;
}

TEST(compress_no_error_feedback_drops_the_residual) {
    const struct dp_compress_params cps[] = {
        {.kind = DP_COMPRESS_TOPK, .fraction = 0.05},
        {.kind = DP_COMPRESS_SIGN},
        {.kind = DP_COMPRESS_POWERSGD, .rank = 1, .compress_all = 1},
    };
    for (size_t k = 0; k < sizeof cps / sizeof cps[0]; k++) {
        struct dp_compress_params cp = cps[k];
        double s_ef, s_no;
        double with_ef = last_step_gap(cp, &s_ef);
        cp.no_ef = 1;
        double without = last_step_gap(cp, &s_no);
        fprintf(stderr, "    %s: last step |slab + residual - gradient| %.3g without EF, %.3g with (scale %.3g)\n",
                dp_compress_name(cp.kind), without, with_ef, s_no);
        ASSERT_TRUE(without <= 1e-5 * s_no);
        ASSERT_TRUE(with_ef > 1e-2 * s_ef);
    }
}

TEST(compress_powersgd_full_rank_reconstructs) {
    /* rank >= every matrix's smaller side: P spans the row space of the
     * summed M, so P P^T M = M: the exact sum up to rounding */
    struct team t = {.cp = {.kind = DP_COMPRESS_POWERSGD, .rank = 16, .compress_all = 1}, .P = 2, .steps = 1};
    run_team(&t);
    expect_close_to_sum(&t, 1e-4, "powersgd full rank");
    team_free(&t);
    /* and rank 1 is not (the test can tell) */
    struct team u = {.cp = {.kind = DP_COMPRESS_POWERSGD, .rank = 1, .compress_all = 1}, .P = 2, .steps = 1};
    run_team(&u);
    double worst = 0;
    for (int64_t i = 0; i < u.n; i++) worst = fmax(worst, fabs(u.last[i] - (u.lastg[i] + u.lastg[u.n + i])));
    ASSERT_TRUE(worst > 1e-3);
    team_free(&u);
}

TEST(compress_powersgd_start_is_plain_before) {
    struct team t = {.cp = {.kind = DP_COMPRESS_POWERSGD, .rank = 1, .compress_all = 1, .powersgd_start = 100},
                     .P = 2, .steps = 2};
    run_team(&t);
    for (int64_t i = 0; i < t.n; i++) ASSERT_FEQ(t.last[i], t.lastg[i] + t.lastg[t.n + i]);
    for (int64_t i = 0; i < 2 * t.n; i++) ASSERT_FEQ(t.resid[i], 0.0f);
    ASSERT_NEAR(t.fp32 / t.sent, 1.0, 1e-12);
    team_free(&t);
}

/* ---- training ---- */

struct losses {
    double first, last;
    int64_t n;
};
static void on_step(void *arg, const struct dp_event *ev) {
    struct losses *l = arg;
    if (ev->kind != DP_EVENT_STEP) return;
    if (l->n++ < 3) l->first += ev->loss / 3;
    l->last = 0.7 * l->last + 0.3 * ev->loss; /* a smoothed end */
}

/* Trains with p; the first steps' and the (smoothed) last steps' loss. */
static struct losses train_losses(struct dp_train_params *p) {
    struct losses l = {0};
    p->io.on_event = on_step, p->io.event_arg = &l;
    struct dp_trainer *t;
    ASSERT_OK(dp_trainer_init(&t, p));
    ASSERT_OK(dp_trainer_run(t));
    dp_trainer_free(t);
    return l;
}

static const char *const schemes[] = {"bf16", "fp16", "topk:0.01", "sign", "powersgd:2"};

static void converges(const char *spec, int P, int accum) {
    struct dp_train_params p = base("mlp", P);
    ASSERT_OK(dp_compress_parse(spec, &p.dp.compress));
    p.dp.accum = accum;
    p.run.epochs = accum; /* the same number of optimizer steps */
    p.run.batch = 40;
    p.sched.base_lr = 0.1f;
    p.optim.momentum = 0; /* (sign with momentum 0.9 at this rate diverges: see docs/ddp.md) */
    struct losses l = train_losses(&p);
    fprintf(stderr, "    %s P=%d accum %d: loss %.3f -> %.3f\n", spec, P, accum, l.first, l.last);
    ASSERT_TRUE(l.last < 0.75 * l.first);
}

/* One test per scheme (each fits its timeout under TSan): P = 2 and 4
 * (one worker compresses nothing), and P = 3 with accumulation. */
#define CONVERGES(name, spec)                     \
    TEST_T(compress_training_converges_##name, 300) { \
        require_data();                           \
        converges(spec, 2, 1);                    \
        converges(spec, 4, 1);                    \
        converges(spec, 3, 2);                    \
    }
CONVERGES(bf16, "bf16")
CONVERGES(fp16, "fp16")
CONVERGES(topk, "topk:0.01")
CONVERGES(sign, "sign")
CONVERGES(powersgd, "powersgd:2")

/* resnet (BatchNorm, residual blocks, 1-D tensors: the BN weights and
 * biases, fc's bias) with every scheme: 2 workers, 12 steps over the same 16
 * samples, plain SGD; the training loss must fall. */
TEST_T(compress_resnet_trains_with_every_scheme, 300) {
    require_data();
    for (size_t s = 0; s < sizeof schemes / sizeof schemes[0]; s++) {
        struct dp_train_params p = base("resnet", 2);
        ASSERT_OK(dp_compress_parse(schemes[s], &p.dp.compress));
        p.data.train_limit = 16, p.data.test_limit = 16, p.run.batch = 16, p.run.epochs = 12;
        p.sched.base_lr = 0.05f;
        p.optim.momentum = 0;
        struct losses l = train_losses(&p);
        fprintf(stderr, "    resnet %s: loss %.3f -> %.3f\n", schemes[s], l.first, l.last);
        ASSERT_EQ(l.n, 12);
        ASSERT_TRUE(l.last < 0.8 * l.first);
    }
}

/* ---- clipping after decompression ---- */

/* One step of plain SGD: returns the parameter change / lr = the clipped
 * gradient the optimizer applied (caller frees), and its length. */
static float *one_step(const char *spec, int P, int accum, double clip, int64_t *n) {
    struct dp_train_params p = base("mlp", P);
    if (spec) ASSERT_OK(dp_compress_parse(spec, &p.dp.compress));
    p.optim.momentum = 0;
    p.dp.accum = accum;
    p.run.max_steps = 1;
    p.run.clip_norm = clip;
    struct dp_trainer *t;
    ASSERT_OK(dp_trainer_init(&t, &p));
    *n = dp_trainer_model(t)->num_params;
    float *before = malloc(sizeof(float) * (size_t)*n);
    memcpy(before, dp_trainer_replica(t)->params, sizeof(float) * (size_t)*n);
    ASSERT_OK(dp_trainer_run(t));
    const float *after = dp_trainer_replica(t)->params;
    for (int64_t i = 0; i < *n; i++) before[i] = (before[i] - after[i]) / p.sched.base_lr;
    dp_trainer_free(t);
    return before;
}

static double norm(const float *x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return sqrt(s);
}

TEST_T(compress_clip_uses_the_decompressed_gradient, 300) {
    require_data();
    const double clip = 0.05;
    int64_t n;
    for (int accum = 1; accum <= 2; accum++) {
        float *ref = one_step(NULL, 2, accum, clip, &n);
        ASSERT_NEAR(norm(ref, n), clip, 1e-4 * clip); /* the clip is active */
        for (size_t s = 0; s < sizeof schemes / sizeof schemes[0]; s += accum) { /* accum 2: bf16, topk, powersgd */
            float *g = one_step(schemes[s], 2, accum, clip, &n);
            double gn = norm(g, n);
            fprintf(stderr, "    %s accum %d: post-clip norm %.6g (clip %g), rel diff to fp32 %.3g\n", schemes[s],
                    accum, gn, clip, rel_diff(g, ref, n));
            ASSERT_NEAR(gn, clip, 1e-4 * clip);
            if (!strcmp(schemes[s], "bf16") || !strcmp(schemes[s], "fp16"))
                ASSERT_TRUE(rel_diff(g, ref, n) < (schemes[s][0] == 'b' ? 1e-2 : 2e-3));
            free(g);
        }
        free(ref);
    }
}

/* ---- refusals ---- */

TEST(compress_refused_with_deterministic) {
    struct dp_train_params p = base("mlp", 2);
    ASSERT_OK(dp_compress_parse("bf16", &p.dp.compress));
    p.dp.deterministic = 1;
    struct dp_trainer *t;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "does not work with --deterministic");
}

/* ---- checkpoints ---- */

static uint64_t run_hash(struct dp_train_params p) {
    struct dp_trainer *t;
    ASSERT_OK(dp_trainer_init(&t, &p));
    ASSERT_OK(dp_trainer_run(t));
    uint64_t h = dp_trainer_param_hash(t);
    dp_trainer_free(t);
    return h;
}

TEST_T(compress_resume_keeps_error_feedback, 300) {
    require_data();
    char dir[512], ck[600];
    snprintf(dir, sizeof dir, "%s/ef", dp_test_tmpdir());
    snprintf(ck, sizeof ck, "%s/checkpoint.bin", dir);
    struct dp_train_params p = base("mlp", 2);
    ASSERT_OK(dp_compress_parse("topk:0.01", &p.dp.compress));
    p.run.epochs = 2;
    uint64_t whole = run_hash(p);
    p.run.epochs = 1;
    p.io.out_dir = dir;
    (void)run_hash(p);
    /* the section is there: 2 workers, the residual of every parameter */
    void *data;
    uint64_t size;
    ASSERT_OK(dp_ckpt_read_section(ck, DP_CKPT_EF_TAG, &data, &size));
    ASSERT_TRUE(data != NULL);
    struct dp_ckpt_ef ef;
    memcpy(&ef, data, sizeof ef);
    ASSERT_EQ(ef.workers, 2);
    ASSERT_EQ(ef.kind, DP_COMPRESS_TOPK);
    dp_free(data);
    p.run.epochs = 2;
    p.io.out_dir = NULL;
    p.io.resume = ck;
    ASSERT_EQ(run_hash(p), whole);
    /* a resume at another worker count resets it, and says so */
    p.dp.workers = 3;
    struct dp_trainer *t;
    ASSERT_OK(dp_trainer_init(&t, &p));
    ASSERT_TRUE(dp_trainer_note(t) && strstr(dp_trainer_note(t), "saved by 2 workers, this run has 3"));
    dp_trainer_free(t);
    /* and a run without compression has nothing to note */
    p.dp.workers = 2;
    p.dp.compress.kind = DP_COMPRESS_NONE;
    ASSERT_OK(dp_trainer_init(&t, &p));
    ASSERT_TRUE(dp_trainer_note(t) == NULL);
    dp_trainer_free(t);
}

TEST(compress_ckpt_sections_and_old_files) {
    char path[512];
    snprintf(path, sizeof path, "%s/s.bin", dp_test_tmpdir());
    struct dp_ckpt_header h;
    memset(&h, 0, sizeof h);
    snprintf(h.model_spec, sizeof h.model_spec, "mlp");
    h.num_params = 3, h.batch = 1;
    float params[3] = {1, 2, 3};
    /* a file without sections (the format as it always was) has none */
    ASSERT_OK(dp_ckpt_write(path, &h, params, NULL, NULL));
    void *data;
    uint64_t size;
    float *payload;
    ASSERT_OK(dp_ckpt_read_section(path, DP_CKPT_EF_TAG, &data, &size));
    ASSERT_TRUE(data == NULL && size == 0);
    /* with one: read back; the whole file still reads */
    const char blob[] = "twelve bytes";
    ASSERT_OK(dp_ckpt_write_section(path, &h, params, NULL, NULL, DP_CKPT_EF_TAG, blob, 12));
    ASSERT_OK(dp_ckpt_read(path, &h, &payload));
    dp_free(payload);
    ASSERT_OK(dp_ckpt_read_section(path, DP_CKPT_EF_TAG, &data, &size));
    ASSERT_EQ(size, 12);
    ASSERT_TRUE(memcmp(data, blob, 12) == 0);
    dp_free(data);
    /* a flipped byte in the section's data is caught */
    FILE *f = fopen(path, "r+b");
    ASSERT_TRUE(f != NULL);
    ASSERT_EQ(fseek(f, -3, SEEK_END), 0);
    fputc('X', f);
    fclose(f);
    ASSERT_ERR(dp_ckpt_read(path, &h, &payload), DP_EFORMAT, "checksum mismatch");
}
