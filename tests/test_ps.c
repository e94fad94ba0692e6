/* The parameter server (--mode async, --staleness, thread backend): the
 * server's protocol on its own (the staleness-scaled lr against a manual
 * update, the SSP sum and its bound, a stalled clock's timeout, the
 * histogram), then the trainer: SSP with s = 0 trains the all-reduce's
 * model (P = 2, 3; mlp, cnn), plain async on P = 1..4 (every batch pushed
 * once, staleness recorded), empty shares, the deterministic replay (same
 * hash twice, staleness P - 1; the same bits for any shard count), resume at
 * an epoch boundary, a slowed worker taking fewer batches, and the refusals. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "dp/core.h"
#include "dp/ps.h"
#include "dp/train.h"
#include "test.h"

#include "ddp_util.h"

/* ---- the server alone --------------------------------------------------------------------- */

TEST(ps_hist_quantiles) {
    struct dp_ps_hist h;
    memset(&h, 0, sizeof h);
    ASSERT_EQ(dp_ps_hist_quantile(&h, 0.5), 0);
    for (int i = 0; i < 98; i++) dp_ps_hist_add(&h, 1);
    dp_ps_hist_add(&h, 5);
    dp_ps_hist_add(&h, 1000); /* overflow: the exact max is kept */
    ASSERT_EQ(h.count, 100);
    ASSERT_EQ(h.overflow, 1);
    ASSERT_EQ(h.max, 1000);
    ASSERT_EQ(dp_ps_hist_quantile(&h, 0.5), 1);
    ASSERT_EQ(dp_ps_hist_quantile(&h, 0.99), 5);
    ASSERT_EQ(dp_ps_hist_quantile(&h, 1.0), 1000);
    struct dp_ps_hist m;
    memset(&m, 0, sizeof m);
    dp_ps_hist_merge(&m, &h);
    dp_ps_hist_merge(&m, &h);
    ASSERT_EQ(m.count, 200);
    ASSERT_EQ(m.max, 1000);
    ASSERT_NEAR(m.sum, 2 * (98.0 + 5 + 1000), 1e-9);
}

static struct dp_ps_params sgd_params(int P, int S, int staleness, int staleness_lr) {
    struct dp_ps_params pp = {.shards = S, .workers = P, .staleness = staleness, .staleness_lr = staleness_lr,
                              .optim = dp_optim_default_params(), .lr_div = 1};
    pp.sched.kind = DP_SCHED_CONSTANT;
    pp.sched.base_lr = 0.5f;
    return pp;
}

/* Async, P = 2: both workers pull version 0; rank 0 pushes g0 over 8
 * samples (staleness 0), then rank 1 pushes g1 over 4 samples computed
 * from version 0 (staleness 1).  Plain SGD: p - lr g0 - lr g1, and with
 * --staleness-lr the second step has lr / 2.  With share_batch 16
 * (--share-lr, global batch 16) each push's lr is scaled by its samples /
 * 16: lr 8/16 for g0, lr 4/16 for g1 (then / 2 for its staleness).  Rank
 * 1's replica gets the fresh parameters in the same call. */
static void async_manual(int S, int staleness_lr, int64_t share_batch) {
    enum { N = 10 };
    float p0[N], g0[N], g1[N], r0[N], r1[N];
    for (int i = 0; i < N; i++) p0[i] = 1.0f + 0.1f * (float)i, g0[i] = 0.25f * (float)(i - 4), g1[i] = 0.5f;
    struct dp_ps_params pp = sgd_params(2, S, -1, staleness_lr);
    pp.share_batch = share_batch;
    struct dp_ps *ps;
    ASSERT_OK(dp_ps_init(&ps, &pp, N));
    dp_ps_set_state(ps, p0, NULL, 0, 0);
    ASSERT_OK(dp_ps_pull(ps, 0, 0, r0));
    ASSERT_OK(dp_ps_pull(ps, 1, 0, r1));
    int64_t st0 = -1, st1 = -1;
    ASSERT_OK(dp_ps_push(ps, 0, g0, 8, 0, r0, &st0));
    ASSERT_OK(dp_ps_push(ps, 1, g1, 4, 0, r1, &st1));
    ASSERT_EQ(st0, 0);
    ASSERT_EQ(st1, 1);
    float lr1 = share_batch ? 0.5f * 8 / 16 : 0.5f;
    float lr2 = (share_batch ? 0.5f * 4 / 16 : 0.5f) / (staleness_lr ? 2 : 1);
    for (int i = 0; i < N; i++) {
        float want = p0[i] - lr1 * g0[i] - lr2 * g1[i];
        ASSERT_NEAR(r1[i], want, 1e-6);
        ASSERT_NEAR(r0[i], p0[i] - lr1 * g0[i], 1e-6); /* rank 0 pulled before rank 1's push */
    }
    float out[N];
    int64_t step, version;
    dp_ps_get_state(ps, out, NULL, &step, &version);
    ASSERT_EQ(version, 2);
    ASSERT_EQ(step, 2);
    for (int i = 0; i < N; i++) ASSERT_FEQ(out[i], r1[i]);
    struct dp_ps_hist h;
    dp_ps_hist_get(ps, &h);
    ASSERT_EQ(h.count, 2);
    ASSERT_EQ(h.max, 1);
    dp_ps_free(ps);
}
TEST(ps_async_staleness_lr_manual) {
    for (int S = 1; S <= 3; S += 2) async_manual(S, 0, 0), async_manual(S, 1, 0);
}
/* --share-lr: each push moves the parameters by lr x its samples / the global batch */
TEST(ps_async_share_lr_manual) {
    for (int S = 1; S <= 3; S += 2) async_manual(S, 0, 16), async_manual(S, 1, 16);
    struct dp_ps_params pp = sgd_params(2, 1, 0, 0);
    pp.share_batch = 16; /* SSP weights its pushes by their samples already */
    struct dp_ps *ps;
    ASSERT_ERR(dp_ps_init(&ps, &pp, 4), DP_EINVAL, "share_batch 16 needs async");
}

/* --implicit-momentum, P = 2, SGD momentum 0.9: the server runs at momentum
 * 1 - 2 (1 - 0.9) = 0.8.  Two pushes (PyTorch's first step: b = g): p - lr g0,
 * then b = 0.8 g0 + g1, p - lr g0 - lr (0.8 g0 + g1) (0.9 without the option).
 * dp_ps_momentum: P = 4 gives 0.6; P = 10 leaves nothing (refused), as do
 * AdamW and SSP. */
TEST(ps_async_implicit_momentum_manual) {
    enum { N = 6 };
    float p0[N], g0[N], g1[N], r[N];
    for (int i = 0; i < N; i++) p0[i] = 0.5f * (float)i, g0[i] = 1.0f - 0.25f * (float)i, g1[i] = 0.75f;
    for (int on = 0; on <= 1; on++) {
        struct dp_ps_params pp = sgd_params(2, 2, -1, 0);
        pp.optim.momentum = 0.9f, pp.implicit_momentum = on;
        struct dp_ps *ps;
        ASSERT_OK(dp_ps_init(&ps, &pp, N));
        dp_ps_set_state(ps, p0, NULL, 0, 0);
        int64_t st;
        ASSERT_OK(dp_ps_push(ps, 0, g0, 8, 0, r, &st));
        ASSERT_OK(dp_ps_push(ps, 0, g1, 8, 1, r, &st));
        float mu = on ? 0.8f : 0.9f;
        for (int i = 0; i < N; i++) ASSERT_NEAR(r[i], p0[i] - 0.5f * g0[i] - 0.5f * (mu * g0[i] + g1[i]), 1e-6);
        dp_ps_free(ps);
    }
    struct dp_ps_params pp = sgd_params(4, 1, -1, 0);
    pp.optim.momentum = 0.9f, pp.implicit_momentum = 1;
    float mu = 0;
    ASSERT_OK(dp_ps_momentum(&pp, &mu));
    ASSERT_NEAR(mu, 0.6, 1e-6);
    pp.workers = 10;
    ASSERT_ERR(dp_ps_momentum(&pp, &mu), DP_EINVAL, "nothing is left");
    struct dp_ps *ps;
    ASSERT_ERR(dp_ps_init(&ps, &pp, 4), DP_EINVAL, "nothing is left");
    pp.workers = 2, pp.optim.kind = DP_OPTIM_ADAMW;
    ASSERT_ERR(dp_ps_momentum(&pp, &mu), DP_EINVAL, "needs SGD");
    pp.optim.kind = DP_OPTIM_SGD, pp.staleness = 1;
    ASSERT_ERR(dp_ps_momentum(&pp, &mu), DP_EINVAL, "does not work with --staleness");
}

/* SSP, s = 0, P = 2: rank 0's push of clock 0 applies nothing; rank 1's
 * completes the clock: p - lr (g0 + g1).  Rank 0 may pull for clock 1 now,
 * but not for clock 2 (that would be 2 clocks ahead of version 1): the
 * wait fails at its timeout and names the shard. */
TEST(ps_ssp_sum_and_bound) {
    enum { N = 7 };
    float p0[N], g0[N], g1[N], r[N];
    for (int i = 0; i < N; i++) p0[i] = (float)i, g0[i] = 0.125f * (float)i, g1[i] = -1.0f;
    struct dp_ps_params pp = sgd_params(2, 2, 0, 0);
    pp.timeout_s = 0.2;
    struct dp_ps *ps;
    ASSERT_OK(dp_ps_init(&ps, &pp, N));
    dp_ps_set_state(ps, p0, NULL, 0, 0);
    int64_t st;
    ASSERT_OK(dp_ps_push(ps, 0, g0, 3, 0, r, &st));
    float out[N];
    int64_t step, version;
    dp_ps_get_state(ps, out, NULL, &step, &version);
    ASSERT_EQ(version, 0);
    for (int i = 0; i < N; i++) ASSERT_FEQ(out[i], p0[i]); /* nothing applied yet */
    ASSERT_OK(dp_ps_push(ps, 1, g1, 3, 0, r, &st));
    ASSERT_OK(dp_ps_pull(ps, 0, 1, r));
    for (int i = 0; i < N; i++) ASSERT_NEAR(r[i], p0[i] - 0.5f * (g0[i] + g1[i]), 1e-6);
    ASSERT_ERR(dp_ps_pull(ps, 0, 2, r), DP_ECANCELED, "timeout");
    dp_ps_free(ps);
    /* bad shard counts */
    pp.shards = 0;
    ASSERT_ERR(dp_ps_init(&ps, &pp, N), DP_EINVAL, "--servers must be in 1..7");
    pp.shards = 8;
    ASSERT_ERR(dp_ps_init(&ps, &pp, N), DP_EINVAL, "--servers must be in 1..7");
}

/* Four threads push at once to five shards (the work-conserving walk takes
 * free shards first): every push reaches every shard exactly once.  With
 * plain SGD and gradients exact in binary, the result does not depend on
 * the order: p0 - 200 x 0.5 x 2^-6 on every element, and every shard took
 * 200 steps. */
struct pusher {
    struct dp_ps *ps;
    int rank, rc;
    float g[37], rep[37];
};
static void *pusher_main(void *arg) {
    struct pusher *a = arg;
    int64_t st;
    a->rc = dp_ps_pull(a->ps, a->rank, 0, a->rep);
    for (int k = 0; k < 50 && !a->rc; k++) a->rc = dp_ps_push(a->ps, a->rank, a->g, 1, k, a->rep, &st);
    return NULL;
}
TEST(ps_concurrent_pushes_reach_every_shard) {
    enum { N = 37, P = 4 };
    float p0[N], out[N];
    for (int i = 0; i < N; i++) p0[i] = (float)i;
    struct dp_ps_params pp = sgd_params(P, 5, -1, 0);
    struct dp_ps *ps;
    ASSERT_OK(dp_ps_init(&ps, &pp, N));
    dp_ps_set_state(ps, p0, NULL, 0, 0);
    struct pusher a[P];
    pthread_t th[P];
    for (int r = 0; r < P; r++) {
        a[r].ps = ps, a[r].rank = r, a[r].rc = 0;
        for (int i = 0; i < N; i++) a[r].g[i] = 1.0f / 64;
        ASSERT_EQ(pthread_create(&th[r], NULL, pusher_main, &a[r]), 0);
    }
    for (int r = 0; r < P; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < P; r++) ASSERT_OK(a[r].rc);
    int64_t step, version;
    dp_ps_get_state(ps, out, NULL, &step, &version);
    ASSERT_EQ(step, 200);
    ASSERT_EQ(version, 200);
    for (int i = 0; i < N; i++) ASSERT_FEQ(out[i], p0[i] - 200 * 0.5f / 64);
    struct dp_ps_hist h;
    dp_ps_hist_get(ps, &h);
    ASSERT_EQ(h.count, 200);
    dp_ps_free(ps);
}

/* ---- the trainer ---------------------------------------------------------------------------- */

struct seen {
    int epochs;
    int64_t pushes[4], stale_max[4], stale_p50[4], rank_samples[4][4];
    double stale_mean[4], loss[4], test_acc[4];
    int64_t steps, step_stale_max;
};
static void on_event(void *arg, const struct dp_event *ev) {
    struct seen *s = arg;
    if (ev->kind == DP_EVENT_STEP) {
        s->steps++;
        if (ev->staleness > s->step_stale_max) s->step_stale_max = ev->staleness;
    } else if (ev->kind == DP_EVENT_EPOCH && s->epochs < 4) {
        int e = s->epochs++;
        s->pushes[e] = ev->pushes, s->stale_max[e] = ev->stale_max, s->stale_p50[e] = ev->stale_p50;
        s->stale_mean[e] = ev->stale_mean, s->loss[e] = ev->loss, s->test_acc[e] = ev->test_acc;
        for (int r = 0; ev->rank_samples && r < ev->nshares && r < 4; r++) s->rank_samples[e][r] = ev->rank_samples[r];
    }
}

/* Trains and returns the parameter hash, the events in *s. */
static uint64_t run_hash(struct dp_train_params p, struct seen *s) {
    memset(s, 0, sizeof *s);
    p.io.on_event = on_event, p.io.event_arg = s;
    p.io.overwrite = 1; /* (the folders are scratch, reused by the test's runs) */
    struct dp_trainer *t;
    ASSERT_OK(dp_trainer_init(&t, &p));
    ASSERT_OK(dp_trainer_run(t));
    uint64_t h = dp_trainer_param_hash(t);
    dp_trainer_free(t);
    return h;
}

/* --staleness 0 is synchronous training: the same model as the all-reduce
 * path with the same workers and seed (a whole epoch, its short last batch
 * included), to float rounding; every push has staleness 0. */
static void ssp0_equals_sync(const char *model, int64_t limit) {
    require_data();
    for (int P = 2; P <= 3; P++) {
        struct dp_train_params p = base(model, P);
        p.data.train_limit = limit;
        int64_t n, n1;
        float *ref = train(&p, &n1);
        struct seen s = {0};
        p.dp.staleness = 0;
        p.io.on_event = on_event, p.io.event_arg = &s;
        float *got = train(&p, &n);
        ASSERT_EQ(n, n1);
        double d = rel_diff(ref, got, n);
        fprintf(stderr, "    %s P=%d --staleness 0: %.2e to the all-reduce\n", model, P, d);
        ASSERT_TRUE(d <= 1e-5);
        ASSERT_TRUE(s.pushes[0] > 0);
        ASSERT_EQ(s.stale_max[0], 0);
        free(ref), free(got);
    }
}
TEST_T(ps_ssp0_equals_sync_mlp, 300) { ssp0_equals_sync("mlp", 1000); }
TEST_T(ps_ssp0_equals_sync_cnn, 300) { ssp0_equals_sync("cnn", 300); }

/* Plain async on P = 1..4, 2 epochs: every batch of ceil(60 / P) samples is
 * pushed once per epoch (pushes = batches), one worker has no staleness,
 * the model learns (no momentum: P times more updates per epoch). */
TEST_T(ps_async_workers_1_to_4, 300) {
    require_data();
    for (int P = 1; P <= 4; P++) {
        struct dp_train_params p = base("mlp", P);
        p.dp.async = 1;
        p.run.epochs = 2;
        p.optim.momentum = 0;
        struct seen s;
        run_hash(p, &s);
        int64_t b = (60 + P - 1) / P, K = (1000 + b - 1) / b;
        fprintf(stderr, "    P=%d: %lld pushes/epoch, staleness mean %.2f max %lld, test acc %.3f\n", P,
                (long long)s.pushes[1], s.stale_mean[1], (long long)s.stale_max[1], s.test_acc[1]);
        ASSERT_EQ(s.epochs, 2);
        ASSERT_EQ(s.pushes[0], K);
        ASSERT_EQ(s.pushes[1], K);
        int64_t sum = 0;
        for (int r = 0; r < P; r++) sum += s.rank_samples[1][r];
        ASSERT_EQ(sum, 1000);
        if (P == 1) ASSERT_EQ(s.stale_max[0] + s.stale_max[1], 0);
        ASSERT_TRUE(s.stale_max[1] <= K);
        ASSERT_TRUE(isfinite(s.loss[1]) && s.test_acc[1] > 0.5);
    }
}

/* More workers than batches: 20 samples in batches of 15 (P = 4: two
 * batches, two workers with nothing to do); the replay and SSP with a
 * global batch of 3 for 4 workers (one empty share per clock). */
TEST_T(ps_empty_shares, 120) {
    require_data();
    struct dp_train_params p = base("mlp", 4);
    p.data.train_limit = 20, p.run.epochs = 2, p.dp.async = 1;
    struct seen s;
    run_hash(p, &s);
    ASSERT_EQ(s.epochs, 2);
    ASSERT_EQ(s.pushes[1], 2);
    p.data.train_limit = 3, p.run.batch = 3, p.dp.det_chunk = 1;
    p.dp.deterministic = 1;
    run_hash(p, &s);
    ASSERT_EQ(s.epochs, 2);
    ASSERT_EQ(s.pushes[1], 3); /* the empty push takes its turn but is not counted */
    p.dp.deterministic = 0, p.dp.staleness = 0;
    run_hash(p, &s);
    ASSERT_EQ(s.epochs, 2);
    ASSERT_EQ(s.pushes[1], 3);
}

/* The replay: pushes applied in the order clock x P + rank, so two runs
 * give the same hash although every push but the first clock's has
 * staleness P - 1; and the same bits with 1 or 3 shards (each shard's
 * optimizer is the whole-slab one on its slice). */
TEST_T(ps_replay_deterministic, 300) {
    require_data();
    for (int opt = 0; opt < 2; opt++) {
        struct dp_train_params p = base("mlp", 3);
        p.dp.async = 1, p.dp.deterministic = 1, p.run.epochs = 2, p.data.train_limit = 300;
        p.optim.momentum = 0.5f;
        if (opt) p.optim.kind = DP_OPTIM_ADAMW, p.sched.base_lr = 1e-3f;
        p.dp.servers = 2;
        struct seen a, b, c;
        uint64_t h1 = run_hash(p, &a), h2 = run_hash(p, &b);
        p.dp.servers = 1;
        uint64_t h3 = run_hash(p, &c);
        fprintf(stderr, "    %s: %016llx %016llx %016llx, staleness p50 %lld max %lld\n", opt ? "adamw" : "sgd",
                (unsigned long long)h1, (unsigned long long)h2, (unsigned long long)h3, (long long)a.stale_p50[1],
                (long long)a.stale_max[1]);
        ASSERT_EQ(h1, h2);
        ASSERT_EQ(h1, h3);
        ASSERT_EQ(a.stale_max[1], 2);
        ASSERT_EQ(a.stale_p50[1], 2);
        ASSERT_EQ(a.step_stale_max, 2);
    }
}

/* Resume: 2 epochs straight = 1 epoch, checkpoint, resume 1 epoch (the
 * server's parameters, AdamW state and step, version), for the replay and
 * for SSP s = 0 with exact sums. */
TEST_T(ps_resume_exact, 300) {
    require_data();
    char d1[512], d2[512], ck[600];
    snprintf(d1, sizeof d1, "%s/ps_straight", dp_test_tmpdir());
    snprintf(d2, sizeof d2, "%s/ps_resumed", dp_test_tmpdir());
    snprintf(ck, sizeof ck, "%s/checkpoint.bin", d2);
    for (int mode = 0; mode < 2; mode++) {
        struct dp_train_params p = base("mlp", 3);
        p.dp.deterministic = 1;
        if (mode) p.dp.staleness = 0;
        else p.dp.async = 1;
        p.optim.kind = DP_OPTIM_ADAMW, p.sched.base_lr = 1e-3f;
        p.run.epochs = 2, p.io.out_dir = d1, p.data.train_limit = 300;
        struct seen s;
        uint64_t h2 = run_hash(p, &s);
        p.run.epochs = 1, p.io.out_dir = d2;
        uint64_t h1 = run_hash(p, &s);
        p.run.epochs = 2, p.io.resume = ck;
        uint64_t hr = run_hash(p, &s);
        fprintf(stderr, "    %s: straight %016llx, after 1 epoch %016llx, resumed %016llx\n", mode ? "ssp" : "replay",
                (unsigned long long)h2, (unsigned long long)h1, (unsigned long long)hr);
        ASSERT_NE(h1, h2);
        ASSERT_EQ(hr, h2);
        ASSERT_EQ(s.epochs, 1);
    }
}

/* A worker slowed 6x takes fewer of the epoch's batches than the others
 * (plain async balances by itself; cnn: compute far above scheduling noise). */
TEST_T(ps_async_slow_worker_takes_less, 300) {
    require_data();
    struct dp_train_params p = base("cnn", 2);
    p.dp.async = 1, p.data.train_limit = 360, p.optim.momentum = 0;
    p.sim.simulate_slow = "1:6";
    struct seen s;
    run_hash(p, &s);
    fprintf(stderr, "    samples: rank 0 %lld, rank 1 %lld\n", (long long)s.rank_samples[0][0],
            (long long)s.rank_samples[0][1]);
    ASSERT_EQ(s.rank_samples[0][0] + s.rank_samples[0][1], 360);
    ASSERT_TRUE(s.rank_samples[0][0] > s.rank_samples[0][1]);
}

TEST(ps_refusals) {
    require_data();
    struct dp_trainer *t;
    struct dp_train_params p = base("mlp", 2);
    p.dp.async = 1;
    p.dp.backup = 1, p.dp.backup_workers = 1;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "--backup-workers does not work with --mode async");
    p = base("mlp", 2), p.dp.async = 1, p.dp.balance = 5;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "--balance does not work with --mode async");
    p = base("mlp", 2), p.dp.staleness = 1, p.dp.accum = 2;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_ENOTSUP, "--accum > 1 is not supported with --staleness");
    p = base("mlp", 2), p.dp.async = 1, p.run.max_steps = 3;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_ENOTSUP, "--max-steps");
    p = base("mlp", 2), p.dp.async = 1, p.dp.check_replicas = 1;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "--check-replicas");
    p = base("mlp", 2), p.dp.async = 1, p.dp.skip_nonfinite = 1;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_ENOTSUP, "--skip-nonfinite");
    p = base("mlp", 2), p.dp.staleness = 0, p.run.clip_norm = 1;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_ENOTSUP, "--clip does not work with --staleness");
    p = base("mlp", 2), p.dp.staleness = 2, p.dp.deterministic = 1;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_ENOTSUP, "--staleness 2 with --deterministic is not built");
    p = base("mlp", 2), p.dp.staleness = DP_PS_MAX_STALENESS + 1;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "--staleness must be in 0..");
    p = base("mlp", 2), p.dp.servers = 2;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "--servers needs --mode async");
    p = base("mlp", 2), p.dp.staleness_lr = 1;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "--staleness-lr needs --mode async");
    p = base("mlp", 2), p.dp.share_lr = 1;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "--share-lr needs --mode async");
    p = base("mlp", 2), p.dp.staleness = 1, p.dp.share_lr = 1;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "--share-lr does not work with --staleness");
    p = base("mlp", 2), p.dp.implicit_momentum = 1;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "--implicit-momentum needs --mode async");
    p = base("mlp", 2), p.dp.staleness = 1, p.dp.implicit_momentum = 1;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "--implicit-momentum does not work with --staleness");
    p = base("mlp", 2), p.dp.async = 1, p.dp.servers = -1;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "--servers must be >= 1");
    p = base("mlp", 2), p.dp.async = 1, p.dp.servers = 1 << 30;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "--servers must be in 1..");
    p = base("resnet", 2), p.dp.async = 1;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_ENOTSUP, "BatchNorm");
    /* several processes (an MPI job): any communicator in `inter` (these refusals come before
     * it is used); async, SSP and the replay run there with server ranks (tests/cli.sh, the MPI block) */
    p = base("mlp", 2), p.dp.async = 1, p.dp.inter = (struct dp_comm *)&p;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_ENOTSUP, "--mode async across processes needs one worker per process");
    p = base("mlp", 2), p.dp.staleness = 0, p.dp.inter = (struct dp_comm *)&p;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_ENOTSUP, "--mode async across processes needs one worker per process");
}

/* A worker that fails (here: a non-finite gradient at a huge lr) ends the
 * run with its error, and the others, waiting for its turn (the replay) or
 * its clock (SSP), are cancelled instead of hanging. */
TEST_T(ps_failure_cancels_waits, 120) {
    require_data();
    for (int mode = 0; mode < 3; mode++) {
        struct dp_train_params p = base("mlp", 3);
        p.data.train_limit = 600, p.optim.momentum = 0, p.sched.base_lr = 1e8f;
        if (mode == 0) p.dp.async = 1;
        else if (mode == 1) p.dp.async = 1, p.dp.deterministic = 1;
        else p.dp.staleness = 1;
        p.dp.comm_timeout = 60;
        struct dp_trainer *t;
        ASSERT_OK(dp_trainer_init(&t, &p));
        int rc = dp_trainer_run(t);
        fprintf(stderr, "    mode %d: %s\n", mode, dp_errmsg());
        ASSERT_EQ(rc, DP_ENONFINITE);
        dp_trainer_free(t);
    }
}
