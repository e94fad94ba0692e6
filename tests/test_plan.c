/* Tests of src/plan: the simulator against closed forms, the cost model
 * against hand-computed values, the JSON reader and the SVG writer. */
#include <math.h>
#include <string.h>

#include "dp/core.h"
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
    "\"arr\": [1, 2.5, -3e2], \"e\": [], \"s\": \"a\\\"b\\u0041\\n\"}\n";

TEST(json_parse_flat) {
    struct dp_json_obj o;
    ASSERT_OK(dp_json_parse(json_line, strlen(json_line), &o));
    ASSERT_EQ(o.n, 8);
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
    dp_json_obj_free(&o);
}

TEST(json_rejects_bad_input) {
    const char *bad[] = {"", "{", "{\"a\"}", "{\"a\": }", "{\"a\": 1,}", "{\"a\": 01}", "{\"a\": +1}",
                         "{\"a\": nan}", "{\"a\": inf}", "{\"a\": 1.}", "{\"a\": {\"b\": 1}}", "{\"a\": [[1]]}",
                         "{\"a\": [\"x\"]}", "{\"a\": \"\\x\"}", "{\"a\": \"\\u12\"}", "{\"a\": 1} x", "[1]",
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
