/* dp_sync (include/dp/ddp.h): a team of P threads, each with its own replica
 * of a small mlp and its own dp_sync, trains a few steps on synthetic data
 * through the interface alone, the way the trainer's step calls it.  The
 * oracles: the deterministic step gives the same bits for P = 1, 2, 3 and
 * every ZeRO stage; at a fixed P the ZeRO stages (and stage 1's scatter and
 * gather ahead) give the plain run's bits, with clipping (and stage 1 with
 * accumulation; stages 2, 3 then sum in another order);
 * and the stats count what the reductions did. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dp/ddp.h"
#include "test.h"

#define MODEL "mlp:24,16,12,10"
#define MAXP 3
#define STEPS 4
#define N 12    /* samples per global batch */
#define CHUNK 3 /* deterministic: samples per chunk */

struct team {
    int P, zero, scatter, ahead, det, accum, adamw;
    double clip;
    struct dp_model *m;
    float *x;               /* (STEPS x N, 24) inputs */
    int32_t *y;             /* (STEPS x N) labels */
    int64_t *idx;           /* (STEPS x N) sample indices */
    float *out;             /* rank 0's parameters after the last step */
    struct dp_sync_stats st[MAXP];
};
struct member {
    struct team *t;
    struct dp_comm_world *w;
    int rank;
};

/* Runs samples [lo, lo + B) of step s's batch as one micro-batch (or chunk). */
static int run(struct team *t, struct dp_sync *s, struct dp_replica *rep, int64_t s_, int64_t lo, int64_t B, int64_t k,
               int64_t nmicro, double n_before, double n_batch) {
    const int64_t at = s_ * N + lo;
    struct dp_batch b = {.B = B, .x = t->x + at * 24, .targets = t->y + at, .sample_idx = t->idx + at};
    struct dp_pass pass = {.training = 1, .backward = 1, .seed = 7, .loss_scale = 1.0f};
    int reducing = dp_sync_micro_begin(s, &pass, k, nmicro, n_before, n_batch);
    int rc = dp_model_run(t->m, rep, &b, &pass);
    rc = dp_sync_micro_end(s, &pass, reducing, rc);
    if (!rc && reducing) rc = dp_sync_finish(s, k == nmicro - 1);
    return rc;
}

static void *member_main(void *arg) {
    struct member *mb = arg;
    struct team *t = mb->t;
    const int r = mb->rank, P = t->P;
    struct dp_comm *c;
    ASSERT_OK(dp_comm_thread_init(&c, mb->w, r));
    struct dp_replica rep;
    ASSERT_OK(dp_replica_init(&rep, t->m, N));
    dp_model_init_params(t->m, &rep, 5); /* the same on every rank */
    struct dp_sync_params sp = dp_sync_default_params();
    sp.reducer.bucket_cap_bytes = sp.reducer.first_bucket_bytes = 4 * 200; /* several buckets */
    sp.optim = dp_optim_default_params();
    if (t->adamw) sp.optim.kind = DP_OPTIM_ADAMW;
    else sp.optim.momentum = 0.9f;
    sp.zero = t->zero, sp.zero_scatter = t->scatter, sp.zero_ahead = t->ahead && P > 1;
    sp.deterministic = t->det;
    struct dp_sync s;
    ASSERT_OK(dp_sync_init(&s, t->m, c, &rep, &sp));
    if (dp_sync_sharded_params(&s)) { /* ZeRO 3: each rank keeps its pieces of the initial slab */
        ASSERT_OK(dp_sync_shard_init(&s, t->m, 5, rep.params));
        ASSERT_OK(dp_sync_release(&s));
    }
    for (int64_t step = 0; step < STEPS; step++) {
        ASSERT_OK(dp_sync_step_begin(&s, step));
        if (t->det) { /* rank r's whole chunks of the batch, one pass each */
            int64_t c0, nc;
            dp_comm_split(N / CHUNK, P, r, &c0, &nc);
            for (int64_t q = c0; q < c0 + nc; q++) ASSERT_OK(run(t, &s, &rep, step, q * CHUNK, CHUNK, 0, 1, 0, N));
            ASSERT_OK(dp_sync_finish(&s, 1));
        } else { /* accum micro-batches of N / accum samples, rank r's share of each */
            const int64_t M = N / t->accum;
            for (int64_t k = 0; k < t->accum; k++) {
                int64_t off, len;
                dp_comm_split(M, P, r, &off, &len);
                ASSERT_OK(run(t, &s, &rep, step, k * M + off, len, k, t->accum, (double)(k * M), (double)M));
            }
        }
        dp_sync_mean(&s, N);
        int bad = 1;
        ASSERT_OK(dp_sync_check(&s, &bad));
        ASSERT_EQ(bad, 0);
        ASSERT_OK(dp_sync_update(&s, t->adamw ? 1e-3f : 0.05f, t->clip));
    }
    ASSERT_OK(dp_sync_gather(&s, 1, NULL)); /* the whole parameters (ZeRO 3), settled (ZeRO 1 ahead) */
    if (r == 0) memcpy(t->out, rep.params, sizeof(float) * (size_t)t->m->num_params);
    t->st[r] = dp_sync_stats_take(&s);
    struct dp_sync_stats again = dp_sync_stats_take(&s);
    ASSERT_EQ(again.reduce_steps, 0); /* the take zeroed them */
    dp_sync_free(&s);
    dp_replica_free(&rep);
    dp_comm_free(c);
    return NULL;
}

/* Trains team t; returns rank 0's parameters (caller frees). */
static float *train(struct team t) {
    ASSERT_OK(dp_model_from_spec(&t.m, MODEL, 1, 1, 24));
    const int64_t n = t.m->num_params, S = STEPS * N;
    t.x = malloc(sizeof(float) * (size_t)(S * 24));
    t.y = malloc(sizeof(int32_t) * (size_t)S);
    t.idx = malloc(sizeof(int64_t) * (size_t)S);
    t.out = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < S * 24; i++) t.x[i] = dp_rng_normal(3, DP_RNG_USER, (uint64_t)i, 0);
    for (int64_t i = 0; i < S; i++) t.y[i] = (int32_t)(i * 7 % 10), t.idx[i] = i;
    if (!t.accum) t.accum = 1;
    struct dp_comm_world *w;
    ASSERT_OK(dp_comm_thread_world_init(&w, t.P, NULL));
    pthread_t th[MAXP];
    struct member mb[MAXP];
    for (int r = 0; r < t.P; r++) {
        mb[r] = (struct member){&t, w, r};
        ASSERT_EQ(pthread_create(&th[r], NULL, member_main, &mb[r]), 0);
    }
    for (int r = 0; r < t.P; r++) pthread_join(th[r], NULL);
    dp_comm_thread_world_free(w);
    /* the stats: one reducing step per step (P > 1, not deterministic), its bytes on the wire */
    for (int r = 0; r < t.P; r++) {
        ASSERT_EQ(t.st[r].reduce_steps, t.P > 1 && !t.det ? STEPS : 0);
        ASSERT_TRUE((t.st[r].bytes_sent > 0) == (t.P > 1 && !t.det));
    }
    free(t.x), free(t.y), free(t.idx);
    dp_model_free(t.m);
    return t.out;
}

static int64_t nparams(void) {
    struct dp_model *m;
    ASSERT_OK(dp_model_from_spec(&m, MODEL, 1, 1, 24));
    int64_t n = m->num_params;
    dp_model_free(m);
    return n;
}

static void expect_same(const float *a, const float *b, const char *what) {
    int same = memcmp(a, b, sizeof(float) * (size_t)nparams()) == 0;
    if (!same) fprintf(stderr, "    %s: differs (relative %.3g)\n", what, dp_rel_diff(a, b, nparams()));
    ASSERT_TRUE(same);
}

TEST(sync_deterministic_same_bits_any_workers_and_stage) {
    for (int adamw = 0; adamw <= 1; adamw++) {
        float *ref = train((struct team){.P = 1, .det = 1, .adamw = adamw, .clip = 0.5});
        for (int P = 2; P <= 3; P++)
            for (int z = 0; z <= 3; z++) {
                float *got = train((struct team){.P = P, .det = 1, .zero = z, .adamw = adamw, .clip = 0.5});
                char what[80];
                snprintf(what, sizeof what, "deterministic P=%d --zero %d%s", P, z, adamw ? " adamw" : "");
                expect_same(ref, got, what);
                free(got);
            }
        free(ref);
    }
}

TEST(sync_zero_stages_give_the_plain_bits) {
    for (int v = 0; v < 3; v++) { /* plain; clipped AdamW; accumulation */
        struct team base = {.P = 2, .adamw = v == 1, .clip = v == 1 ? 0.5 : 0, .accum = v == 2 ? 2 : 1};
        float *ref = train(base);
        for (int z = 1; z <= 3; z++)
            for (int form = 0; form < (z == 1 ? 4 : 1); form++) { /* stage 1: scatter x ahead */
                struct team t = base;
                t.zero = z, t.scatter = form & 1, t.ahead = form >> 1;
                float *got = train(t);
                char what[96];
                snprintf(what, sizeof what, "P=2 --zero %d%s%s (variant %d)", z, t.scatter ? " scatter" : "",
                         t.ahead ? " ahead" : "", v);
                /* With accumulation, stages 2 and 3 reduce every micro-batch and add the
                 * reduced pieces (sum_k sum_r g_rk), the plain run adds locally first
                 * (sum_r sum_k g_rk): the same sum in another order, so to rounding only
                 * (as the trainer's --accum 2 --zero 2 always was). */
                if (t.accum > 1 && z >= 2) {
                    double d = dp_rel_diff(ref, got, nparams());
                    fprintf(stderr, "    %s: %.3g (another order of the sums)\n", what, d);
                    ASSERT_TRUE(d < 1e-6);
                } else
                    expect_same(ref, got, what);
                free(got);
            }
        free(ref);
    }
}

TEST(sync_two_workers_train_one_workers_model) {
    float *one = train((struct team){.P = 1}), *two = train((struct team){.P = 2});
    double d = dp_rel_diff(one, two, nparams());
    fprintf(stderr, "    P=2 vs P=1: %.3g\n", d);
    ASSERT_TRUE(d < 1e-5);
    free(one), free(two);
}
