/* Tests of src/plan: the simulator against closed forms, the cost model
 * against hand-computed values, the JSON reader and the SVG writer. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/core.h"
#include "dp/ddp.h"
#include "dp/nn.h"
#include "dp/par.h"
#include "dp/plan.h"
#include "test.h"

/* ---- simulator ------------------------------------------------------------------ */

static struct dp_sim_params sim_const(enum dp_sim_mode mode, int P, int64_t K, double c, double a) {
    struct dp_sim_params p = dp_sim_default_params();
    p.mode = mode, p.workers = P, p.steps = K, p.compute_mean_s = c, p.comm_s = a, p.batch = 10;
    return p;
}

/* Constant compute c and comm a: a sync step is c + a, nobody waits. */
TEST(sim_sync_closed_form) {
    struct dp_sim_params p = sim_const(DP_SIM_SYNC, 5, 40, 0.1, 0.02);
    struct dp_sim_result r;
    ASSERT_OK(dp_sim_run(&p, &r));
    ASSERT_NEAR(r.time_s, 40 * 0.12, 1e-9);
    ASSERT_NEAR(r.steps_per_s, 1 / 0.12, 1e-9);
    ASSERT_NEAR(r.samples_per_s, 5 * 10 / 0.12, 1e-6);
    ASSERT_NEAR(r.idle_max, 0, 1e-12);
    ASSERT_EQ(r.stale_max, 0);
    dp_sim_result_free(&r);
}

/* One worker k times slower sets the sync step at k c + a; the others idle
 * (k c - c) / (k c + a) of the time. */
TEST(sim_sync_one_slow_worker) {
    double slow[6] = {1, 1, 3, 1, 1, 1};
    struct dp_sim_params p = sim_const(DP_SIM_SYNC, 6, 30, 0.1, 0.02);
    p.slow = slow;
    struct dp_sim_result r;
    ASSERT_OK(dp_sim_run(&p, &r));
    ASSERT_NEAR(r.steps_per_s, 1 / 0.32, 1e-9);
    ASSERT_NEAR(r.idle[0], 0.2 / 0.32, 1e-9);
    ASSERT_NEAR(r.idle[2], 0, 1e-9);
    ASSERT_EQ(r.idle_max_worker, 0);
    dp_sim_result_free(&r);
}

/* Backup workers b = 1 with one slow worker: the step closes without it, at
 * the fast rate 1 / (c + a); b = 0 waits for it. */
TEST(sim_backup_recovers_fast_rate) {
    double slow[6] = {1, 1, 1, 1, 5, 1};
    struct dp_sim_params p = sim_const(DP_SIM_BACKUP, 6, 30, 0.1, 0.02);
    p.slow = slow, p.backup = 1;
    struct dp_sim_result r;
    ASSERT_OK(dp_sim_run(&p, &r));
    ASSERT_NEAR(r.steps_per_s, 1 / 0.12, 1e-9);
    ASSERT_NEAR(r.samples_per_s, 5 * 10 / 0.12, 1e-6); /* P - b gradients per step */
    /* the slow worker computes all the time (always dropped) */
    ASSERT_NEAR(r.idle[4], 0, 1e-9);
    dp_sim_result_free(&r);
    p.backup = 0;
    ASSERT_OK(dp_sim_run(&p, &r));
    ASSERT_NEAR(r.steps_per_s, 1 / 0.52, 1e-9);
    dp_sim_result_free(&r);
}

/* Async, P equal workers, zero server time: the pushes of a round arrive
 * together and are applied in worker order; worker i read the version after
 * its own previous push, so P - 1 pushes (the others') lie between: the
 * staleness is exactly P - 1 from the second round on (i in the first). */
TEST(sim_async_staleness_is_p_minus_1) {
    int P = 7;
    int64_t K = 20;
    struct dp_sim_params p = sim_const(DP_SIM_ASYNC, P, K, 0.05, 0);
    struct dp_sim_result r;
    ASSERT_OK(dp_sim_run(&p, &r));
    ASSERT_EQ(r.stale_max, P - 1);
    ASSERT_EQ(r.stale_p50, P - 1);
    ASSERT_EQ(r.stale_hist_len, P);
    for (int i = 0; i < P - 1; i++) ASSERT_EQ(r.stale_hist[i], 1);
    ASSERT_EQ(r.stale_hist[P - 1], P * K - (P - 1));
    ASSERT_NEAR(r.stale_mean, ((double)(P - 1) * P / 2 + (double)(P - 1) * (P * K - P)) / (double)(P * K), 1e-12);
    ASSERT_NEAR(r.steps_per_s, 1 / 0.05, 1e-9);
    dp_sim_result_free(&r);
}

/* Async with a busy server: S shards serve S / server_s pushes per second
 * when the workers could send more (8 workers x 100/s = 800/s). */
TEST(sim_async_server_bound) {
    for (int S = 1; S <= 2; S++) {
        struct dp_sim_params p = sim_const(DP_SIM_ASYNC, 8, 200, 0.01, 0);
        p.server_s = 0.004, p.shards = S;
        struct dp_sim_result r;
        ASSERT_OK(dp_sim_run(&p, &r));
        double pushes = r.steps_per_s * 8;
        ASSERT_NEAR(pushes, S / 0.004, 0.01 * S / 0.004);
        dp_sim_result_free(&r);
    }
}

/* SSP with s = 0 is sync, exactly, on noisy, stalling, uneven workers; with
 * s > 0 it is at least as fast and its staleness stays within s. */
TEST(sim_ssp_bound0_equals_sync) {
    double slow[9] = {1, 1.5, 1, 1, 1, 1, 2, 1, 1};
    struct dp_sim_params p = sim_const(DP_SIM_SYNC, 9, 60, 0.1, 0.01);
    p.compute_sd_s = 0.03, p.stall_p = 0.05, p.stall_s = 0.2, p.sigma = 0.3, p.slow = slow, p.seed = 42;
    struct dp_sim_result a, b;
    ASSERT_OK(dp_sim_run(&p, &a));
    p.mode = DP_SIM_SSP, p.bound = 0;
    ASSERT_OK(dp_sim_run(&p, &b));
    ASSERT_FEQ(a.time_s, b.time_s);
    for (int w = 0; w < 9; w++) ASSERT_NEAR(a.idle[w], b.idle[w], 1e-12);
    ASSERT_EQ(b.stale_max, 0);
    dp_sim_result_free(&b);
    for (int s = 1; s <= 4; s++) {
        p.bound = s;
        ASSERT_OK(dp_sim_run(&p, &b));
        ASSERT_TRUE(b.time_s <= a.time_s);
        ASSERT_TRUE(b.stale_max <= s);
        ASSERT_TRUE(b.stale_max >= 1); /* the stalls make someone run ahead */
        dp_sim_result_free(&b);
    }
    dp_sim_result_free(&a);
}

/* Same parameters and seed, same result; another seed, another result. */
TEST(sim_deterministic) {
    struct dp_sim_params p = sim_const(DP_SIM_ASYNC, 50, 40, 0.1, 0.01);
    p.compute_sd_s = 0.02, p.stall_p = 0.02, p.stall_s = 0.5, p.server_s = 0.001, p.seed = 7;
    struct dp_sim_result a, b;
    ASSERT_OK(dp_sim_run(&p, &a));
    ASSERT_OK(dp_sim_run(&p, &b));
    ASSERT_FEQ(a.time_s, b.time_s);
    ASSERT_FEQ(a.stale_mean, b.stale_mean);
    dp_sim_result_free(&b);
    p.seed = 8;
    ASSERT_OK(dp_sim_run(&p, &b));
    ASSERT_TRUE(a.time_s != b.time_s);
    dp_sim_result_free(&a), dp_sim_result_free(&b);
}

/* A trace of one value is that constant compute; stalls come on top with the
 * trainer's draws (DP_RNG_SLOW at (w, 2 step)): count them by hand. */
TEST(sim_trace_and_stalls) {
    double tr[1] = {0.1};
    struct dp_sim_params p = sim_const(DP_SIM_SYNC, 3, 50, 99, 0);
    p.trace = tr, p.trace_len = 1, p.stall_p = 0.1, p.stall_s = 1, p.seed = 3;
    struct dp_sim_result r;
    ASSERT_OK(dp_sim_run(&p, &r));
    double want = 0;
    for (int k = 0; k < 50; k++) {
        int any = 0;
        for (int w = 0; w < 3; w++) any |= (double)dp_rng_uniform(3, DP_RNG_SLOW, (uint64_t)w, 2 * (uint64_t)k) < 0.1;
        want += 0.1 + (any ? 1 : 0);
    }
    ASSERT_TRUE(want > 50 * 0.1); /* the seed gives some stalls */
    ASSERT_NEAR(r.time_s, want, 1e-9);
    dp_sim_result_free(&r);
}

TEST(sim_bad_params) {
    struct dp_sim_params p = sim_const(DP_SIM_BACKUP, 4, 10, 0.1, 0);
    struct dp_sim_result r;
    p.backup = 4;
    ASSERT_EQ(dp_sim_run(&p, &r), DP_EINVAL);
    ASSERT_TRUE(strstr(dp_errmsg(), "backup") != NULL);
    p.backup = 0, p.workers = 0;
    ASSERT_EQ(dp_sim_run(&p, &r), DP_EINVAL);
    p.workers = 4, p.compute_mean_s = NAN;
    ASSERT_EQ(dp_sim_run(&p, &r), DP_EINVAL);
    p.compute_mean_s = 0.1, p.mode = DP_SIM_ASYNC, p.shards = 0;
    ASSERT_EQ(dp_sim_run(&p, &r), DP_EINVAL);
    ASSERT_EQ(dp_sim_mode_parse("bogus"), DP_EINVAL);
    ASSERT_EQ(dp_sim_mode_parse("ssp"), DP_SIM_SSP);
}

/* ---- JSON reader ------------------------------------------------------------------- */

static const char *json_line =
    "{\"kind\": \"step\", \"step\": 3, \"loss\": -1.5e-3, \"ok\": true, \"no\": null, "
    "\"arr\": [1, 2.5, -3e2], \"e\": [], \"s\": \"a\\\"b\\u0041\\n\", \"h\": [\"x\", \"y\\u0041\"]}\n";

TEST(json_parse_flat) {
    struct dp_json_obj o;
    ASSERT_OK(dp_json_parse(json_line, strlen(json_line), &o));
    ASSERT_EQ(o.n, 9);
    ASSERT_TRUE(dp_json_str_is(&o, "kind", "step"));
    ASSERT_FEQ(dp_json_num(&o, "step", 0), 3);
    ASSERT_FEQ(dp_json_num(&o, "loss", 0), -1.5e-3);
    ASSERT_FEQ(dp_json_num(&o, "missing", 7), 7);
    const struct dp_json_field *a = dp_json_get(&o, "arr");
    ASSERT_TRUE(a && a->type == DP_JSON_ARR);
    ASSERT_EQ(a->n, 3);
    ASSERT_FEQ(a->arr[2], -300);
    ASSERT_EQ(dp_json_get(&o, "e")->n, 0);
    ASSERT_TRUE(!strcmp(dp_json_get(&o, "s")->str, "a\"bA\n"));
    ASSERT_EQ(dp_json_get(&o, "ok")->type, DP_JSON_BOOL);
    const struct dp_json_field *h = dp_json_get(&o, "h");
    ASSERT_TRUE(h && h->type == DP_JSON_STRS && h->n == 2);
    ASSERT_TRUE(!strcmp(h->strs[0], "x") && !strcmp(h->strs[1], "yA"));
    dp_json_obj_free(&o);
}

TEST(json_rejects_bad_input) {
    const char *bad[] = {"", "{", "{\"a\"}", "{\"a\": }", "{\"a\": 1,}", "{\"a\": 01}", "{\"a\": +1}",
                         "{\"a\": nan}", "{\"a\": inf}", "{\"a\": 1.}", "{\"a\": {\"b\": 1}}", "{\"a\": [[1]]}",
                         "{\"a\": [\"x\", 1]}", "{\"a\": [1, \"x\"]}", "{\"a\": [\"x\",]}", "{\"a\": \"\\x\"}", "{\"a\": \"\\u12\"}", "{\"a\": 1} x", "[1]",
                         "{\"a\": tru}", "{\"a\": 0x10}", "{\"a\": \"abc"};
    for (size_t i = 0; i < DP_ARRAY_LEN(bad); i++) {
        struct dp_json_obj o;
        int rc = dp_json_parse(bad[i], strlen(bad[i]), &o);
        dp_json_obj_free(&o);
        if (rc != DP_EFORMAT) dp_test_fail(__FILE__, __LINE__, "accepted bad input '%s' (rc %d)", bad[i], rc);
        ASSERT_TRUE(strstr(dp_errmsg(), "json: column") != NULL);
    }
}

/* Every truncation and every single-byte change of a good line either
 * parses or fails with DP_EFORMAT: never a crash or an overread (the
 * ASan build checks the latter; the copy is exactly len bytes, unterminated). */
TEST(json_fuzz_mutations) {
    size_t n = strlen(json_line);
    const char subst[] = "{}[]\",:\\-.0eE9 tnu";
    int ok = 0, bad = 0;
    for (size_t len = 0; len <= n; len++) {
        char *buf = dp_malloc(len ? len : 1);
        memcpy(buf, json_line, len);
        for (size_t pos = 0; pos <= len; pos++)
            for (size_t k = 0; k < (pos < len ? sizeof subst - 1 : 1); k++) {
                char save = pos < len ? buf[pos] : 0;
                if (pos < len) buf[pos] = subst[k];
                struct dp_json_obj o;
                int rc = dp_json_parse(buf, len, &o);
                dp_json_obj_free(&o);
                if (rc == DP_OK) ok++;
                else if (rc == DP_EFORMAT) bad++;
                else dp_test_fail(__FILE__, __LINE__, "rc %d at len %zu pos %zu", rc, len, pos);
                if (pos < len) buf[pos] = save;
            }
        dp_free(buf);
    }
    ASSERT_TRUE(ok > 0 && bad > 0);
}

/* ---- cost model ------------------------------------------------------------------ */

static struct dp_plan_net net_of(int P, double alpha, double bytes_per_s) {
    struct dp_plan_net n;
    memset(&n, 0, sizeof n);
    n.workers = P, n.shards = 1;
    dp_plan_net_link(&n, alpha, bytes_per_s);
    return n;
}

/* The formulas of DESIGN §4 on the textbook case: 800 MB (200M fp32) on 8
 * workers at 100 Gbit/s (12.5 GB/s), 5 us per message. */
TEST(plan_allreduce_formulas) {
    double n = 800e6, a = 5e-6, B = 12.5e9;
    struct dp_plan_net net = net_of(8, a, B);
    ASSERT_NEAR(dp_plan_allreduce_s(DP_PLAN_RING, n, &net), 14 * a + 1.75 * n / B, 1e-12); /* 112.07 ms */
    ASSERT_NEAR(dp_plan_allreduce_s(DP_PLAN_RING, n, &net), 0.11207, 1e-9);
    ASSERT_NEAR(dp_plan_sent_bytes(DP_PLAN_RING, n, &net), 1.4e9, 1e-3);
    ASSERT_NEAR(dp_plan_allreduce_s(DP_PLAN_RHD, n, &net), 6 * a + 1.75 * n / B, 1e-12);
    ASSERT_NEAR(dp_plan_allreduce_s(DP_PLAN_TREE, n, &net), 6 * (a + n / B), 1e-12);
    ASSERT_TRUE(isinf(dp_plan_allreduce_s(DP_PLAN_HIER, n, &net))); /* no hosts given */
    /* ps, 2 shards: each shard moves 2 x 8 x n / 2 bytes, the bottleneck */
    net.shards = 2;
    ASSERT_NEAR(dp_plan_allreduce_s(DP_PLAN_PS, n, &net), 2 * 4 * a + 8 * n / B, 1e-12);
    net.shards = 8; /* the worker's own 2n is the bottleneck now, one message each way per shard */
    ASSERT_NEAR(dp_plan_allreduce_s(DP_PLAN_PS, n, &net), 2 * a + 2 * n / B, 1e-12);
    /* rhd on 6 workers: 4 in the power-of-two core plus a fold in and out */
    net = net_of(6, a, B);
    ASSERT_NEAR(dp_plan_allreduce_s(DP_PLAN_RHD, n, &net), 4 * a + 1.5 * n / B + 2 * (a + n / B), 1e-12);
    ASSERT_NEAR(dp_plan_allreduce_s(DP_PLAN_TREE, n, &net), 6 * (a + n / B), 1e-12); /* ceil(log2 6) = 3 */
    /* hier: 2 hosts of 4, 1 us / 100 GB/s inside: reduce-scatter and
     * all-gather inside (3 steps of n/4 each), a ring of n/4 between hosts */
    net = net_of(8, a, B);
    net.per_host = 4, net.intra_alpha_s = 1e-6, net.intra_beta_s = 1 / 100e9;
    double intra = 3 * (1e-6 + n / 4 / 100e9), inter = 2 * a + 2 * 0.5 * (n / 4) / B;
    ASSERT_NEAR(dp_plan_allreduce_s(DP_PLAN_HIER, n, &net), 2 * intra + inter, 1e-12);
    /* gamma: the ring reduces (p-1)/p n bytes */
    net = net_of(8, a, B);
    net.gamma_s = 1 / 10e9;
    ASSERT_NEAR(dp_plan_allreduce_s(DP_PLAN_RING, n, &net), 14 * a + 1.75 * n / B + 0.875 * n / 10e9, 1e-12);
    /* one worker: nothing to do */
    net = net_of(1, a, B);
    ASSERT_FEQ(dp_plan_allreduce_s(DP_PLAN_RING, n, &net), 0);
    /* the reducer's auto cap: a quarter of the gradient within [1 MiB, 25 MiB] */
    ASSERT_EQ(dp_plan_auto_cap(100000), 1 << 20);
    ASSERT_EQ(dp_plan_auto_cap(2000000), 2000000);
    ASSERT_EQ(dp_plan_auto_cap(1000000000), 25 << 20);
    int al = 0;
    ASSERT_OK(dp_plan_algo_parse("best", &al));
    ASSERT_EQ(al, -1);
    ASSERT_OK(dp_plan_algo_parse("hier", &al));
    ASSERT_EQ(al, DP_PLAN_HIER);
    ASSERT_EQ(dp_plan_algo_parse("mesh", &al), DP_EINVAL);
}

/* The planner's buckets are the reducer's, bucket for bucket, on real models
 * and caps (the reducer plans them without a communicator). */
TEST(plan_buckets_match_reducer) {
    const char *specs[] = {"mlp", "cnn", "gpt:layers=2,heads=2,dim=32,ctx=16"};
    size_t caps[] = {0, 4096, 65536, 1u << 20};
    for (size_t s = 0; s < DP_ARRAY_LEN(specs); s++) {
        struct dp_model *m;
        ASSERT_OK(dp_model_from_spec(&m, specs[s], 1, 28, 28));
        int64_t lp[256];
        ASSERT_TRUE(m->nlayers <= 256);
        for (int i = 0; i < m->nlayers; i++) lp[i] = m->layers[i]->param_count;
        for (size_t c = 0; c < DP_ARRAY_LEN(caps); c++)
            for (size_t first = 1024; first <= (1u << 20); first *= 1024) {
                struct dp_reducer_params rp = dp_reducer_default_params();
                rp.bucket_cap_bytes = caps[c], rp.first_bucket_bytes = first;
                struct dp_reducer red;
                ASSERT_OK(dp_reducer_init(&red, m, NULL, NULL, &rp));
                struct dp_plan_bucket *b;
                size_t cap = caps[c] ? caps[c] : dp_plan_auto_cap(m->num_params);
                int nb = dp_plan_buckets(lp, m->nlayers, cap, first, &b);
                ASSERT_EQ(nb, red.nb);
                for (int k = 0; k < nb; k++) {
                    ASSERT_EQ(b[k].off, red.b[k].off);
                    ASSERT_EQ(b[k].count, red.b[k].count);
                    ASSERT_EQ(b[k].nlayers, red.b[k].nlayers);
                }
                dp_free(b);
                dp_reducer_free(&red);
            }
        dp_model_free(m);
    }
}

/* Four layers of 1M floats (4 MB, each over the 1 MiB cap: a bucket each),
 * 2 workers x 1 sample at 1 GFLOP/s: forward 2 x 4M FLOPs = 8 ms, each
 * layer's backward 4 ms, so buckets are ready at 12, 16, 20, 24 ms.  A ring
 * of 2 with α = 0 takes n β = 4 MB x 1.5 ns = 6 ms per bucket: they run
 * 12-18, 18-24, 24-30, 30-36 ms; exposed 36 - 24 = 12 ms.  Without overlap
 * all four start at 24 ms: exposed 24 ms. */
/* Runs the plan and checks the four 6 ms buckets of these tests: forward,
 * backward, and each bucket's ready and start times (done = start + 6 ms, by
 * the ring). */
static void run_four_buckets(const struct dp_plan_params *p, struct dp_plan_result *r, double fwd, double bwd,
                             const double ready[4], const double start[4]) {
    ASSERT_OK(dp_plan_run(p, r));
    ASSERT_EQ(r->nb, 4);
    ASSERT_NEAR(r->fwd_s, fwd, 1e-12);
    ASSERT_NEAR(r->bwd_s, bwd, 1e-12);
    for (int k = 0; k < 4; k++) {
        ASSERT_NEAR(r->b[k].ready_s, ready[k], 1e-12);
        ASSERT_NEAR(r->b[k].start_s, start[k], 1e-12);
        ASSERT_NEAR(r->b[k].done_s, start[k] + 6e-3, 1e-12);
        ASSERT_EQ(r->b[k].algo, DP_PLAN_RING);
    }
}

/* 4 layers of 1M parameters at 1 GFLOP/s, 2 workers with 1 sample each,
 * ring at 1.5 ns per byte: one 4 MB bucket per layer, 6 ms each. */
static struct dp_plan_params four_layers(void) {
    struct dp_plan_params p = dp_plan_default_params();
    p.params = 4000000, p.nlayers = 4, p.flops = 1e9, p.batch = 2, p.algo = DP_PLAN_RING;
    p.bucket_cap_bytes = 1u << 20;
    p.net = net_of(2, 0, 1 / 1.5e-9);
    return p;
}

TEST(plan_overlap_timeline) {
    struct dp_plan_params p = four_layers();
    struct dp_plan_result r;
    run_four_buckets(&p, &r, 8e-3, 16e-3, (double[]){12e-3, 16e-3, 20e-3, 24e-3}, (double[]){12e-3, 18e-3, 24e-3, 30e-3});
    ASSERT_NEAR(r.comm_s, 24e-3, 1e-12);
    ASSERT_NEAR(r.exposed_s, 12e-3, 1e-12);
    ASSERT_NEAR(r.step_s, 36e-3, 1e-12);
    ASSERT_NEAR(r.efficiency, 24.0 / 36, 1e-12);
    ASSERT_NEAR(r.samples_per_s, 2 / 36e-3, 1e-9);
    ASSERT_NEAR(r.grad_bytes, 16e6, 1e-6);
    ASSERT_NEAR(r.sent_bytes, 16e6, 1e-6); /* 2 (p-1)/p n = n for p = 2 */
    dp_plan_result_free(&r);
    p.overlap = 0;
    ASSERT_OK(dp_plan_run(&p, &r));
    ASSERT_NEAR(r.exposed_s, 24e-3, 1e-12);
    dp_plan_result_free(&r);
    /* compression 4: 1.5 ms per bucket, all hidden but the last one's */
    p.overlap = 1, p.compress = 4;
    ASSERT_OK(dp_plan_run(&p, &r));
    ASSERT_NEAR(r.exposed_s, 1.5e-3, 1e-12);
    dp_plan_result_free(&r);
    /* measured 12 ms per sample (fwd + bwd) instead of FLOPs: 4 + 8 ms */
    p.sample_s = 12e-3;
    ASSERT_OK(dp_plan_run(&p, &r));
    ASSERT_NEAR(r.fwd_s, 4e-3, 1e-12);
    ASSERT_NEAR(r.bwd_s, 8e-3, 1e-12);
    dp_plan_result_free(&r);
}

/* The calibrated terms, in closed form.  4 layers of 1M parameters, 2
 * workers, 1 sample each; measured forward 8 ms and backward 20 ms per
 * sample: each layer's backward 5 ms, so the four 4 MB buckets are ready at
 * 13, 18, 23, 28 ms; 6 ms each on the link: they run 13-19, 19-25, 25-31,
 * 31-37.  Beside backward (8..28 ms): 6 + 6 + 3 + 0 = 15 ms; exposed
 * 37 - 28 = 9 ms; with comm_cpu 0.5 the steal is 7.5 ms.  Optimizer
 * 1 ms + 4M x 1 ns, zeroing 4M x 0.25 ns.  rest = 1 + 28 + 7.5 + 9 + 5 =
 * 50.5 ms; data 10 ms (shorter than rest: only its comm_cpu half shows)
 * gives 5 ms, step 55.5 ms; data 60 ms: 60 - 50.5 waited for, plus 0.5 x 50.5. */
TEST(plan_step_terms) {
    struct dp_plan_params p = four_layers();
    p.fwd_sample_s = 8e-3, p.bwd_sample_s = 20e-3;
    p.opt_s = 1e-3, p.opt_param_s = 1e-9, p.zero_param_s = 0.25e-9;
    p.comm_cpu = 0.5, p.data_sample_s = 10e-3;
    struct dp_plan_result r;
    run_four_buckets(&p, &r, 8e-3, 20e-3, (double[]){13e-3, 18e-3, 23e-3, 28e-3}, (double[]){13e-3, 19e-3, 25e-3, 31e-3});
    ASSERT_NEAR(r.overlap_s, 15e-3, 1e-12);
    ASSERT_NEAR(r.steal_s, 7.5e-3, 1e-12);
    ASSERT_NEAR(r.exposed_s, 9e-3, 1e-12);
    ASSERT_NEAR(r.opt_s, 5e-3, 1e-12);
    ASSERT_NEAR(r.zero_s, 1e-3, 1e-12);
    ASSERT_NEAR(r.data_s, 5e-3, 1e-12);
    ASSERT_NEAR(r.step_s, 55.5e-3, 1e-12);
    ASSERT_NEAR(r.efficiency, 39 / 55.5, 1e-12);
    dp_plan_result_free(&r);
    p.data_sample_s = 60e-3; /* the loader is the bottleneck */
    ASSERT_OK(dp_plan_run(&p, &r));
    ASSERT_NEAR(r.data_s, 9.5e-3 + 25.25e-3, 1e-12);
    ASSERT_NEAR(r.step_s, 85.25e-3, 1e-12);
    dp_plan_result_free(&r);
    /* comm_cpu 0 (a wait on a link): no steal, the prefetch hidden */
    p.comm_cpu = 0, p.data_sample_s = 10e-3;
    ASSERT_OK(dp_plan_run(&p, &r));
    ASSERT_NEAR(r.step_s, 43e-3, 1e-12);
    dp_plan_result_free(&r);
    /* the metrics' all-gather of 2 doubles: α + 8 bytes x β with α = 10 us */
    p.gathers = 1;
    for (int a = 0; a < DP_PLAN_ALGO_COUNT; a++) p.net.alpha_s[a] = 10e-6;
    ASSERT_OK(dp_plan_run(&p, &r));
    ASSERT_NEAR(r.gather_s, 10e-6 + 8 * 1.5e-9, 1e-15);
    ASSERT_NEAR(r.step_s, 43e-3 + r.gather_s + (r.exposed_s - 9e-3), 1e-12); /* α also delays the buckets */
    dp_plan_result_free(&r);
    /* the gather's measured sync wait (calibrate --run) joins it, per gather, and the step */
    p.gather_wait_s = 0.2e-3;
    ASSERT_OK(dp_plan_run(&p, &r));
    ASSERT_NEAR(r.gather_s, 10e-6 + 8 * 1.5e-9 + 0.2e-3, 1e-15);
    ASSERT_NEAR(r.step_s, 43e-3 + r.gather_s + (r.exposed_s - 9e-3), 1e-12);
    dp_plan_result_free(&r);
    p.gathers = 0; /* no metrics: no gather, no wait */
    ASSERT_OK(dp_plan_run(&p, &r));
    ASSERT_NEAR(r.gather_s, 0, 1e-15);
    dp_plan_result_free(&r);
    p.gather_wait_s = -1e-3;
    ASSERT_EQ(dp_plan_run(&p, &r), DP_EINVAL);
    p.gather_wait_s = 0;
    for (int a = 0; a < DP_PLAN_ALGO_COUNT; a++) p.net.alpha_s[a] = 0;
    p.bwd_sample_s = 0; /* forward alone */
    ASSERT_EQ(dp_plan_run(&p, &r), DP_EINVAL);
    p.bwd_sample_s = 20e-3, p.comm_cpu = 1.5;
    ASSERT_EQ(dp_plan_run(&p, &r), DP_EINVAL);
}

/* Which compute the plan priced, the first that applies: calibrated
 * forward and backward, else a measured time per sample, else FLOPs at the
 * rate given (an estimate the CLI must not pass off as a measurement:
 * `dptrain plan --profile` refuses a model's FLOP estimate, and says so
 * without a profile). */
TEST(plan_compute_source) {
    struct dp_plan_params p = four_layers();
    struct dp_plan_result r;
    ASSERT_OK(dp_plan_run(&p, &r));
    ASSERT_EQ(r.compute, DP_PLAN_COMPUTE_FLOPS);
    dp_plan_result_free(&r);
    p.sample_s = 1e-3;
    ASSERT_OK(dp_plan_run(&p, &r));
    ASSERT_EQ(r.compute, DP_PLAN_COMPUTE_SAMPLE);
    dp_plan_result_free(&r);
    p.fwd_sample_s = 1e-3, p.bwd_sample_s = 2e-3;
    ASSERT_OK(dp_plan_run(&p, &r));
    ASSERT_EQ(r.compute, DP_PLAN_COMPUTE_CALIBRATED);
    dp_plan_result_free(&r);
}

/* e_p = E[max of p standard normals]: in closed form for p <= 3 (e_2 =
 * 1/sqrt(pi), e_3 = 3/(2 sqrt(pi))), the published table's values at 10 and
 * 100 (1.538753, 2.507594), and growing with p. */
TEST(plan_normal_max) {
    ASSERT_NEAR(dp_plan_normal_max(1), 0, 1e-15);
    ASSERT_NEAR(dp_plan_normal_max(2), 1 / sqrt(M_PI), 1e-9);
    ASSERT_NEAR(dp_plan_normal_max(3), 1.5 / sqrt(M_PI), 1e-9);
    ASSERT_NEAR(dp_plan_normal_max(10), 1.538753, 1e-6);
    ASSERT_NEAR(dp_plan_normal_max(100), 2.507594, 1e-6);
    double prev = 0;
    for (int p = 2; p <= 100000000; p *= 10) {
        double e = dp_plan_normal_max(p);
        ASSERT_TRUE(e > prev && e < sqrt(2 * log((double)p)) + 0.5);
        prev = e;
    }
}

/* The straggler wait on plan_step_terms' step (compute F + B + steal = 8 +
 * 20 + 7.5 = 35.5 ms, step 55.5 ms): compute_cv 0.1 on 2 workers waits e_2
 * 0.1 x 35.5 ms = 2.0029 ms more; a measured straggle_cv 0.05 at 2 workers
 * replaces it there (1.775 ms) but not at 4 workers (e_4 x 0.1 x their
 * compute + steal). */
TEST(plan_straggler_wait) {
    struct dp_plan_params p = four_layers();
    p.fwd_sample_s = 8e-3, p.bwd_sample_s = 20e-3;
    p.opt_s = 1e-3, p.opt_param_s = 1e-9, p.zero_param_s = 0.25e-9;
    p.comm_cpu = 0.5, p.data_sample_s = 10e-3;
    p.compute_cv = 0.1;
    struct dp_plan_result r;
    ASSERT_OK(dp_plan_run(&p, &r));
    ASSERT_NEAR(r.steal_s, 7.5e-3, 1e-12);
    ASSERT_NEAR(r.straggle_s, 0.1 / sqrt(M_PI) * 35.5e-3, 1e-12);
    ASSERT_NEAR(r.exposed_s, 9e-3, 1e-12); /* the buckets do not move */
    ASSERT_NEAR(r.step_s, 55.5e-3 + 0.1 / sqrt(M_PI) * 35.5e-3, 1e-12);
    ASSERT_NEAR(r.efficiency, 39e-3 / r.step_s, 1e-12);
    dp_plan_result_free(&r);
    p.straggle_cv = 0.05, p.straggle_workers = 2; /* measured at this P: used as it is */
    ASSERT_OK(dp_plan_run(&p, &r));
    ASSERT_NEAR(r.straggle_s, 0.05 * 35.5e-3, 1e-12);
    ASSERT_NEAR(r.step_s, 55.5e-3 + 1.775e-3, 1e-12);
    dp_plan_result_free(&r);
    /* 4 workers, 4 samples: 1 each as before, so the same 28 ms of compute
     * (the ring of 4 moves 1.5 n instead of n: another overlap and steal),
     * and the wait is e_4 x compute_cv, not the straggle_cv of 2 workers */
    p.net.workers = 4, p.batch = 4;
    struct dp_plan_result r4;
    ASSERT_OK(dp_plan_run(&p, &r4));
    ASSERT_NEAR(r4.straggle_s, dp_plan_normal_max(4) * 0.1 * (28e-3 + r4.steal_s), 1e-12);
    ASSERT_NEAR(dp_plan_normal_max(4), 1.029375, 1e-6);
    dp_plan_result_free(&r4);
    /* one worker waits for no one */
    p.net.workers = 1, p.batch = 2;
    ASSERT_OK(dp_plan_run(&p, &r));
    ASSERT_NEAR(r.straggle_s, 0, 0);
    dp_plan_result_free(&r);
    p.net.workers = 2, p.batch = 2, p.compute_cv = -0.1;
    ASSERT_EQ(dp_plan_run(&p, &r), DP_EINVAL);
    p.compute_cv = 0.1, p.straggle_workers = -1;
    ASSERT_EQ(dp_plan_run(&p, &r), DP_EINVAL);
}

/* A measured table replaces the formula at its own worker count:
 * 1000, 2000, 4000 bytes in 1, 3, 4 ms: 1500 bytes -> 2 ms (between), 500 ->
 * 1 ms (the floor), 6000 -> 4 + 2000 x 0.5 us = 5 ms (the last slope); other
 * workers, or an algorithm without a table, keep the formula. */
TEST(plan_measured_table) {
    struct dp_plan_net net = net_of(2, 1e-5, 1e9);
    double x[3] = {1000, 2000, 4000}, t[3] = {1e-3, 3e-3, 4e-3};
    net.tab_n = 3, net.tab_workers = 2, net.tab_bytes = x, net.tab_s[DP_PLAN_RING] = t;
    ASSERT_NEAR(dp_plan_allreduce_s(DP_PLAN_RING, 1500, &net), 2e-3, 1e-15);
    ASSERT_NEAR(dp_plan_allreduce_s(DP_PLAN_RING, 500, &net), 1e-3, 1e-15);
    ASSERT_NEAR(dp_plan_allreduce_s(DP_PLAN_RING, 6000, &net), 5e-3, 1e-15);
    ASSERT_NEAR(dp_plan_allreduce_s(DP_PLAN_RHD, 1500, &net), 2 * 1e-5 + 1500 / 1e9, 1e-15);
    net.workers = 4;
    ASSERT_NEAR(dp_plan_allreduce_s(DP_PLAN_RING, 1500, &net), 6 * 1e-5 + 1.5 * 1500 / 1e9, 1e-15);
    /* through a step: one 8000-byte bucket (2000 floats) on the table */
    struct dp_plan_params p = dp_plan_default_params();
    p.params = 2000, p.nlayers = 1, p.batch = 2, p.algo = DP_PLAN_RING, p.flops = 1e9;
    p.net = net, p.net.workers = 2;
    struct dp_plan_result r;
    ASSERT_OK(dp_plan_run(&p, &r));
    ASSERT_NEAR(r.comm_s, 4e-3 + 4000 * 0.5e-6, 1e-15);
    dp_plan_result_free(&r);
    t[1] = -1; /* a bad time is refused */
    ASSERT_EQ(dp_plan_run(&p, &r), DP_EINVAL);
}

/* AdamW in fp32, Ψ = 1M on 4 workers: 16Ψ, 8Ψ + 8Ψ/P, 4Ψ + 12Ψ/P, 16Ψ/P, and the units in
 * flight beside them. */
TEST(plan_zero_memory) {
    struct dp_plan_params p = dp_plan_default_params();
    p.params = 1000000, p.nlayers = 3, p.batch = 4;
    p.net = net_of(4, 0, 1e9);
    struct dp_plan_result r;
    ASSERT_OK(dp_plan_run(&p, &r));
    ASSERT_NEAR(r.mem_bytes[0], 16e6, 1e-6);
    ASSERT_NEAR(r.mem_bytes[1], 10e6, 1e-6);
    ASSERT_NEAR(r.mem_bytes[2], 7e6, 1e-6);
    ASSERT_NEAR(r.mem_bytes[3], 4e6, 1e-6);
    /* the units in flight on top (dp_zero_inflight_bytes' rule): the largest two adjacent
     * buckets' gradients (stage 2), also their parameters and two 2 MiB units (stage 3) */
    ASSERT_TRUE(r.mem_inflight[0] == 0 && r.mem_inflight[1] == 0);
    int64_t pair = r.b[0].count;
    for (int k = 0; k + 1 < r.nb; k++)
        if (r.b[k].count + r.b[k + 1].count > pair) pair = r.b[k].count + r.b[k + 1].count;
    ASSERT_TRUE(r.nb >= 2 && pair < p.params); /* (a pair, not the whole model) */
    ASSERT_NEAR(r.mem_inflight[2], 4.0 * (double)pair, 1e-6);
    ASSERT_NEAR(r.mem_inflight[3], 8.0 * (double)pair + 4194304.0, 1e-6);
    dp_plan_result_free(&r);
    p.net = net_of(1, 0, 1e9), p.batch = 1; /* one worker: nothing is sharded, nothing in flight */
    ASSERT_OK(dp_plan_run(&p, &r));
    ASSERT_TRUE(r.mem_inflight[2] == 0 && r.mem_inflight[3] == 0);
    dp_plan_result_free(&r);
    p.net = net_of(4, 0, 1e9), p.batch = 4;
    p.opt_state_bytes = 4; /* SGD with momentum: 12Ψ plain */
    ASSERT_OK(dp_plan_run(&p, &r));
    ASSERT_NEAR(r.mem_bytes[0], 12e6, 1e-6);
    dp_plan_result_free(&r);
}

/* Best per bucket: small buckets go to the latency-light algorithm (rhd,
 * 2 log2 p messages), and a forced one is used as asked. */
TEST(plan_best_algorithm_per_bucket) {
    struct dp_plan_params p = dp_plan_default_params();
    p.params = 1000, p.nlayers = 1, p.batch = 64;
    p.net = net_of(64, 10e-6, 12.5e9);
    struct dp_plan_result r;
    ASSERT_OK(dp_plan_run(&p, &r));
    ASSERT_EQ(r.b[0].algo, DP_PLAN_RHD);
    ASSERT_NEAR(r.comm_s, 12 * 10e-6 + 2 * 63.0 / 64 * 4000 / 12.5e9, 1e-12);
    dp_plan_result_free(&r);
    p.algo = DP_PLAN_TREE;
    ASSERT_OK(dp_plan_run(&p, &r));
    ASSERT_EQ(r.b[0].algo, DP_PLAN_TREE);
    dp_plan_result_free(&r);
    p.batch = 10; /* fewer samples than workers */
    ASSERT_EQ(dp_plan_run(&p, &r), DP_EINVAL);
    p.batch = 64, p.algo = DP_PLAN_HIER;
    ASSERT_EQ(dp_plan_run(&p, &r), DP_EINVAL);
}

/* ---- SVG writer ------------------------------------------------------------------- */

const char *dp_test_fixtures(void);
const char *dp_test_tmpdir(void);

/* Renders a plot into a string (dp_malloc'd) through a temporary file. */
static char *render(const struct dp_svg_plot *p, const struct dp_svg_series *s, int ns, int *rc) {
    char path[4096];
    snprintf(path, sizeof path, "%s/plot.svg", dp_test_tmpdir());
    FILE *f = fopen(path, "w+");
    if (!f) return NULL;
    *rc = dp_svg_write(f, p, s, ns);
    long n = ftell(f);
    rewind(f);
    char *buf = dp_malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    buf[got] = 0;
    fclose(f);
    return buf;
}

/* The golden file: two short series, one with a gap (NaN), and a title
 * that needs escaping.  DP_UPDATE_GOLDEN=1 rewrites the fixture (then check
 * the diff by eye). */
TEST(svg_golden_small_plot) {
    double x[5] = {0, 1, 2, 3, 4}, a[5] = {2.5, 1.8, 1.2, 0.9, 0.7}, b[5] = {2.4, 2.0, NAN, 1.1, 0.8};
    struct dp_svg_series s[2] = {{"run a", x, a, 5, NULL}, {"run <b>", x, b, 5, NULL}};
    struct dp_svg_plot p = {DP_SVG_LINES, "Loss & friends", "step (steps)", "loss (nats)", 320, 200, 1};
    int rc = -99;
    char *got = render(&p, s, 2, &rc);
    ASSERT_TRUE(got != NULL);
    ASSERT_OK(rc);
    char path[4096];
    snprintf(path, sizeof path, "%s/plot_small.svg", dp_test_fixtures());
    if (getenv("DP_UPDATE_GOLDEN")) {
        FILE *f = fopen(path, "w");
        ASSERT_TRUE(f != NULL);
        fputs(got, f);
        fclose(f);
    }
    FILE *f = fopen(path, "r");
    if (!f) SKIP("golden file %s missing", path);
    char want[1 << 14];
    size_t n = fread(want, 1, sizeof want - 1, f);
    want[n] = 0;
    fclose(f);
    if (strcmp(got, want)) dp_test_fail(__FILE__, __LINE__, "plot differs from %s:\n%s", path, got);
    /* what the golden file must show, independent of the layout */
    ASSERT_TRUE(strstr(got, "Loss &amp; friends") && strstr(got, "run &lt;b&gt;"));
    ASSERT_TRUE(strstr(got, ">step (steps)<") && strstr(got, ">loss (nats)<"));
    int polylines = 0;
    for (const char *q = got; (q = strstr(q, "<polyline")); q++) polylines++;
    ASSERT_EQ(polylines, 3); /* a, and b broken in two by its NaN */
    dp_free(got);
}

TEST(svg_rejects_bad_plots) {
    double x[3] = {0, 1, 2}, y[3] = {1, 2, 3}, z[2] = {1, 2}, nan3[3] = {NAN, NAN, NAN};
    struct dp_svg_series s[2] = {{"a", x, y, 3, NULL}, {"b", x, z, 2, NULL}};
    struct dp_svg_plot p = {DP_SVG_LINES, "t", "step", "loss (nats)", 0, 0, 0};
    int rc = 0;
    char *o = render(&p, s, 1, &rc); /* x label without a unit */
    dp_free(o);
    ASSERT_EQ(rc, DP_EINVAL);
    ASSERT_TRUE(strstr(dp_errmsg(), "carries no unit") != NULL);
    p.xlabel = "step (steps)", p.kind = DP_SVG_STACKED;
    o = render(&p, s, 2, &rc); /* stacked series of different lengths */
    dp_free(o);
    ASSERT_EQ(rc, DP_EINVAL);
    p.kind = DP_SVG_LINES, s[0].y = nan3;
    o = render(&p, s, 1, &rc); /* nothing finite */
    dp_free(o);
    ASSERT_EQ(rc, DP_EINVAL);
    /* every kind renders a simple input */
    s[0].y = y;
    for (int k = 0; k < DP_SVG_KIND_COUNT; k++) {
        p.kind = (enum dp_svg_kind)k;
        o = render(&p, s, 1, &rc);
        ASSERT_OK(rc);
        ASSERT_TRUE(o && strstr(o, "</svg>"));
        dp_free(o);
    }
}

/* Bars stand at whole x (a rank, a bucket): the x axis gets a tick at each
 * whole value and none between (2 ranks once had ticks at -0.5, 0.5, 1.5). */
TEST(svg_bars_whole_ticks) {
    double x[2] = {0, 1}, y[2] = {3, 5};
    struct dp_svg_series s = {"wait", x, y, 2, NULL};
    struct dp_svg_plot p = {DP_SVG_BARS, "Straggler profile", "rank (index)", "wait (ms)", 0, 0, 0};
    int rc = 0;
    char *o = render(&p, &s, 1, &rc);
    ASSERT_OK(rc);
    ASSERT_TRUE(strstr(o, ">0</text>") && strstr(o, ">1</text>"));
    ASSERT_TRUE(!strstr(o, ">0.5</text>") && !strstr(o, ">-0.5</text>") && !strstr(o, ">1.5</text>"));
    dp_free(o);
}

/* The fit recovers α and β from times the model itself made (ring and rhd,
 * with a γ term), and from the same times with ±2% noise within 10%. */
TEST(plan_fit_recovers_alpha_beta) {
    double bytes[7], t[7];
    for (int algo = DP_PLAN_RING; algo <= DP_PLAN_RHD; algo++)
        for (int noisy = 0; noisy < 2; noisy++) {
            struct dp_plan_net n = net_of(4, 20e-6, 2e9);
            n.gamma_s = 1 / 8e9;
            for (int i = 0; i < 7; i++) {
                bytes[i] = 4096.0 * pow(4, i);
                t[i] = dp_plan_allreduce_s(algo, bytes[i], &n) * (noisy ? 1 + 0.02 * ((i % 3) - 1) : 1);
            }
            double a, b;
            ASSERT_OK(dp_plan_fit(algo, 4, n.gamma_s, bytes, t, 7, &a, &b));
            ASSERT_NEAR(a, 20e-6, noisy ? 2e-6 : 1e-12);
            ASSERT_NEAR(b, 1 / 2e9, noisy ? 0.05 / 2e9 : 1e-18);
        }
    double a, b;
    ASSERT_EQ(dp_plan_fit(DP_PLAN_RING, 4, 0, bytes, t, 1, &a, &b), DP_EINVAL);
    ASSERT_EQ(dp_plan_fit(DP_PLAN_HIER, 4, 0, bytes, t, 7, &a, &b), DP_EINVAL);
}

/* A pipeline's step (dp_plan_pipeline): equal stages without communication take
 * (M + S - 1)(f + b), the bubble (S - 1)/(M + S - 1); the split is the trainer's; memory per
 * worker is the whole slabs (8 Psi), the stage's optimizer state (/ R with ZeRO 1) and the
 * micro-batches in flight (gpipe M, 1f1b min(S - s, M)) x b x the stage's bytes per sample; a
 * boundary message on a slow link lengthens the step; bad layouts are refused. */
TEST(plan_pipeline_formula) {
    int64_t layers[8];
    double flops[8], out[8], act[8], scratch[8];
    for (int i = 0; i < 8; i++) layers[i] = 1000, flops[i] = 1e6, out[i] = 100, act[i] = 400, scratch[i] = i;
    struct dp_plan_params p = dp_plan_default_params();
    p.layers = layers, p.layer_flops = flops, p.nlayers = 8;
    p.layer_out = out, p.layer_act = act, p.layer_scratch = scratch;
    p.fwd_sample_s = 1e-3, p.bwd_sample_s = 2e-3; /* per sample, the whole model */
    p.batch = 64, p.net.workers = 4;
    dp_plan_net_link(&p.net, 0, 1e30); /* (no communication time) */
    struct dp_plan_pipe r;
    ASSERT_OK(dp_plan_pipeline(&p, 2, 4, DP_PIPE_1F1B, 1, &r));
    ASSERT_EQ(r.stages, 2);
    ASSERT_EQ(r.replicas, 2);
    ASSERT_EQ(r.micro, 4);
    ASSERT_EQ(r.first[0], 0);
    ASSERT_EQ(r.first[1], 4);
    ASSERT_EQ(r.first[2], 8);
    const double b = 64.0 / (2 * 4), fb = b * 3e-3 / 2; /* one stage's forward + backward of a micro-batch */
    ASSERT_NEAR(r.f_s[0] + r.b_s[0], fb, 1e-12);
    ASSERT_NEAR(r.pipe_s, (4 + 2 - 1) * fb, 1e-12);
    ASSERT_NEAR(r.bubble, 1.0 / 5, 1e-12);
    ASSERT_NEAR(r.act_bytes[0], 2 * b * (4 * 400 + 3), 1e-9); /* 1f1b: 2 held on stage 0 */
    ASSERT_NEAR(r.act_bytes[1], 1 * b * (4 * 400 + 7), 1e-9);
    ASSERT_NEAR(r.mem_bytes[1], 8 * 4000 + 8 * 4000 / 2 + r.act_bytes[1], 1e-6); /* ZeRO 1: the state over R */
    dp_plan_pipe_free(&r);
    ASSERT_OK(dp_plan_pipeline(&p, 2, 4, DP_PIPE_GPIPE, 0, &r));
    ASSERT_NEAR(r.act_bytes[1], 4 * b * (4 * 400 + 7), 1e-9);
    double quiet = r.step_s;
    dp_plan_pipe_free(&r);
    dp_plan_net_link(&p.net, 1e-4, 1e6); /* a slow link: the boundary's messages show */
    ASSERT_OK(dp_plan_pipeline(&p, 2, 4, DP_PIPE_1F1B, 0, &r));
    ASSERT_NEAR(r.p2p_s, 1e-4 + b * 100 * 4 / 1e6, 1e-12);
    ASSERT_TRUE(r.step_s > quiet + 2 * r.p2p_s);
    dp_plan_pipe_free(&r);
    ASSERT_ERR(dp_plan_pipeline(&p, 3, 4, DP_PIPE_1F1B, 0, &r), DP_EINVAL, "3 stages for 4 workers");
    ASSERT_ERR(dp_plan_pipeline(&p, 2, 4, DP_PIPE_1F1B, 2, &r), DP_EINVAL, "ZeRO 2");
    ASSERT_ERR(dp_plan_pipeline(&p, 2, 64, DP_PIPE_1F1B, 0, &r), DP_EINVAL, "smaller than 2 replicas x 64");
}

/* The planned schedule op by op (dp_plan_pipe_spans): every stage's 2M operations, none
 * overlapping on its stage, each micro-batch's backward after its forward and after the next
 * stage's backward, the first forward at 0; for equal stages without messages the last end is
 * the formula's makespan, (M + S - 1)(f + b), for gpipe and 1f1b; a slow boundary delays it. */
TEST(plan_pipeline_spans) {
    int64_t layers[6];
    double flops[6], out[6];
    for (int i = 0; i < 6; i++) layers[i] = 500, flops[i] = 1e6, out[i] = 64;
    struct dp_plan_params p = dp_plan_default_params();
    p.layers = layers, p.layer_flops = flops, p.nlayers = 6, p.layer_out = out;
    p.fwd_sample_s = 1e-3, p.bwd_sample_s = 2e-3, p.batch = 48, p.net.workers = 3;
    dp_plan_net_link(&p.net, 0, 1e30);
    for (int kind = 0; kind < DP_PIPE_SCHEDULE_COUNT; kind++) {
        struct dp_plan_pipe r;
        ASSERT_OK(dp_plan_pipeline(&p, 3, 4, kind, 0, &r));
        struct dp_plan_span *sp;
        int n = dp_plan_pipe_spans(&r, kind, &sp);
        ASSERT_EQ(n, 2 * 3 * 4);
        double end = 0;
        for (int i = 0; i < n; i++) {
            if (sp[i].t1 > end) end = sp[i].t1;
            if (i % 8) ASSERT_TRUE(sp[i].t0 >= sp[i - 1].t1 - 1e-15); /* (one stage's ops in order) */
            for (int j = 0; j < n; j++)
                if (sp[j].micro == sp[i].micro && sp[i].backward && sp[j].backward && sp[j].stage == sp[i].stage + 1)
                    ASSERT_TRUE(sp[i].t0 >= sp[j].t1 - 1e-15);
        }
        ASSERT_FEQ(sp[0].t0, 0.0);
        ASSERT_NEAR(end, r.pipe_s, 1e-12);
        ASSERT_NEAR(end, (4 + 3 - 1) * (r.f_s[0] + r.b_s[0]), 1e-12);
        dp_free(sp);
        dp_plan_pipe_free(&r);
    }
    dp_plan_net_link(&p.net, 1e-3, 1e9);
    struct dp_plan_pipe r;
    ASSERT_OK(dp_plan_pipeline(&p, 3, 4, DP_PIPE_1F1B, 0, &r));
    struct dp_plan_span *sp;
    ASSERT_EQ(dp_plan_pipe_spans(&r, DP_PIPE_1F1B, &sp), 24);
    ASSERT_TRUE(sp[8].t0 >= sp[0].t1 + 1e-3); /* stage 1's first forward waits for the message */
    dp_free(sp);
    dp_plan_pipe_free(&r);
}

/* Compute calibrated at several sizes: the per-sample times interpolated in log b between the
 * nearest two, held beyond; a pipeline's micro-batch and a data-parallel worker's share each take
 * the times at their own size. */
TEST(plan_sample_times_by_size) {
    struct dp_plan_params p = dp_plan_default_params();
    const double cb[2] = {2, 32}, cf[2] = {1e-3, 2e-3}, cw[2] = {2e-3, 4e-3};
    p.fwd_sample_s = 5e-3, p.bwd_sample_s = 5e-3; /* (the profile's own point; cal_n 0: these) */
    double f, b;
    dp_plan_sample_times(&p, 8, &f, &b);
    ASSERT_FEQ(f, 5e-3);
    p.cal_n = 2, p.cal_batch = cb, p.cal_fwd = cf, p.cal_bwd = cw;
    dp_plan_sample_times(&p, 8, &f, &b); /* log2: 8 is half way from 2 to 32 */
    ASSERT_NEAR(f, 1.5e-3, 1e-15);
    ASSERT_NEAR(b, 3e-3, 1e-15);
    dp_plan_sample_times(&p, 1, &f, &b);
    ASSERT_FEQ(f, 1e-3);
    dp_plan_sample_times(&p, 64, &f, &b);
    ASSERT_FEQ(b, 4e-3);
    int64_t layers[4] = {100, 100, 100, 100};
    double flops[4] = {1e6, 1e6, 1e6, 1e6};
    p.layers = layers, p.layer_flops = flops, p.nlayers = 4, p.batch = 64, p.net.workers = 2;
    dp_plan_net_link(&p.net, 0, 1e30);
    struct dp_plan_pipe r;
    ASSERT_OK(dp_plan_pipeline(&p, 2, 8, DP_PIPE_1F1B, 0, &r)); /* micro-batches of 8 */
    ASSERT_NEAR(r.f_s[0], 1.5e-3 * 8 / 2, 1e-15);
    ASSERT_NEAR(r.b_s[1], 3e-3 * 8 / 2, 1e-15);
    dp_plan_pipe_free(&r);
    struct dp_plan_result d;
    ASSERT_OK(dp_plan_run(&p, &d)); /* 32 samples a worker */
    ASSERT_NEAR(d.fwd_s, 2e-3 * 32, 1e-12);
    dp_plan_result_free(&d);
}

/* The layers' bytes are the arena's: the gpt's blocks keep more than their outputs, and a
 * layer without state keeps just its output. */
TEST(model_layer_bytes_measured) {
    struct dp_model *m;
    ASSERT_OK(dp_model_from_spec(&m, "gpt:layers=2,heads=2,dim=16,ctx=8", 1, 1, 1));
    double out[5], saved[5], scratch[5];
    ASSERT_OK(dp_model_layer_bytes(m, out, saved, scratch));
    ASSERT_FEQ(out[1], 8.0 * 16);
    ASSERT_TRUE(saved[1] > 4 * 4 * out[1]); /* a block: its output, LayerNorms, attention, the MLP */
    ASSERT_TRUE(scratch[1] > 0);
    dp_model_free(m);
}

/* Tensor parallelism in the plan (dp_plan_layout): T = 1 is the pipeline's plan; a group of 2
 * computes half of each stage plus its all-reduces, ring over the intra-host link (4 of 100
 * floats a sample per layer here, half in forward, half in backward); its stage is reduced over
 * the stage's R T workers; the layout must divide the workers and the layers must split. */
TEST(plan_layout_tensor_groups) {
    int64_t layers[8];
    double flops[8], out[8], act[8], scratch[8], calls[8], floats[8];
    for (int i = 0; i < 8; i++)
        layers[i] = 1000, flops[i] = 1e6, out[i] = 100, act[i] = 400, scratch[i] = i, calls[i] = 4, floats[i] = 100;
    struct dp_plan_params p = dp_plan_default_params();
    p.layers = layers, p.layer_flops = flops, p.nlayers = 8;
    p.layer_out = out, p.layer_act = act, p.layer_scratch = scratch;
    p.fwd_sample_s = 1e-3, p.bwd_sample_s = 2e-3, p.batch = 64, p.net.workers = 4;
    dp_plan_net_link(&p.net, 0, 1e30);
    p.net.intra_alpha_s = 1e-5, p.net.intra_beta_s = 1e-9, p.net.gamma_s = 0;
    struct dp_plan_pipe a, b;
    ASSERT_ERR(dp_plan_layout(&p, 2, 2, 4, DP_PIPE_1F1B, 0, &a), DP_EINVAL, "the model's layers do not split");
    ASSERT_OK(dp_plan_pipeline(&p, 2, 4, DP_PIPE_1F1B, 0, &a));
    p.layer_tp_calls = calls, p.layer_tp_floats = floats;
    ASSERT_OK(dp_plan_layout(&p, 2, 1, 4, DP_PIPE_1F1B, 0, &b));
    ASSERT_NEAR(b.step_s, a.step_s, 1e-15);
    dp_plan_pipe_free(&a), dp_plan_pipe_free(&b);
    ASSERT_OK(dp_plan_layout(&p, 2, 2, 4, DP_PIPE_1F1B, 1, &b));
    ASSERT_EQ(b.replicas, 1);
    ASSERT_EQ(b.tensor, 2);
    const double mb = 64.0 / 4, fb = mb * 3e-3 / 2 / 2; /* a stage's half of a micro-batch */
    const double ar = 2 * (1e-5 + mb * 100 * 4 / 2 * 1e-9); /* one all-reduce over 2 */
    ASSERT_NEAR(b.tp_s, 4 * 4 * ar, 1e-12);                  /* 4 layers of the stage, 4 each */
    ASSERT_NEAR(b.f_s[0] + b.b_s[0], fb + b.tp_s, 1e-12);
    ASSERT_NEAR(b.mem_bytes[0], 8 * 4000 + 8 * 4000 / 2 + b.act_bytes[0], 1e-6); /* ZeRO 1: over the stage's 2 */
    dp_plan_pipe_free(&b);
    ASSERT_OK(dp_plan_layout(&p, 1, 4, 1, DP_PIPE_1F1B, 0, &b)); /* tensor parallelism alone */
    ASSERT_NEAR(b.pipe_s, 64 * 3e-3 / 4 + b.tp_s, 1e-12);
    dp_plan_pipe_free(&b);
    ASSERT_ERR(dp_plan_layout(&p, 2, 4, 4, DP_PIPE_1F1B, 0, &b), DP_EINVAL, "2 stages x 4 tensor ranks for 4 workers");
}

/* What a gpt's layers all-reduce under a tensor group (dp_model_tp_traffic), and a tensor
 * rank's activations, measured (dp_model_layer_bytes_tp): a block's are less than whole. */
TEST(model_tp_traffic_and_bytes) {
    struct dp_model *m;
    ASSERT_OK(dp_model_from_spec(&m, "gpt:layers=2,heads=2,dim=16,ctx=8", 1, 1, 1));
    double calls[5], floats[5], out[5], saved[5], scratch[5], tsaved[5], tscratch[5];
    dp_model_tp_traffic(m, 2, calls, floats);
    ASSERT_FEQ(calls[0], 1.0); /* tok+pos: the token rows' sum */
    ASSERT_FEQ(floats[0], 8.0 * 16);
    ASSERT_FEQ(calls[1], 4.0); /* a block: 2 forward, 2 backward */
    ASSERT_FEQ(floats[1], 8.0 * 16);
    ASSERT_FEQ(calls[3], 0.0); /* ln_f */
    ASSERT_FEQ(calls[4], 3.0); /* the head: its input's gradient, the split loss's two */
    ASSERT_OK(dp_model_layer_bytes(m, out, saved, scratch));
    ASSERT_OK(dp_model_layer_bytes_tp(m, 2, out, tsaved, tscratch));
    ASSERT_TRUE(tsaved[1] < saved[1]);
    ASSERT_TRUE(tsaved[1] > saved[1] / 2); /* (its norms' and residuals' outputs stay whole) */
    fprintf(stderr, "    a block's saved bytes per sample: %.0f whole, %.0f at tp 2\n", saved[1], tsaved[1]);
    dp_model_free(m);
}
