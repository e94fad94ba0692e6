/* The failure model (src/plan/failures.c): without failures it is the
 * closed form; its time always splits into useful, snapshot, recovery and
 * redone work; with synchronous snapshots it agrees with Daly's expected
 * goodput; Young-Daly's interval is as good as the best of a sweep; a
 * failure never loses more than the interval (two with a background write
 * in flight); and bad parameters are refused with a message. */
#include <math.h>

#include "dp/core.h"
#include "dp/plan.h"
#include "test.h"

static struct dp_fail_params fail_params(double mtbf_job_s, int64_t every, double c, double recovery) {
    struct dp_fail_params p = dp_fail_default_params();
    p.workers = 100, p.steps = 20000, p.step_s = 1;
    p.mtbf_worker_s = mtbf_job_s * p.workers;
    p.snapshot_every = every, p.snapshot_s = c, p.recovery_s = recovery;
    p.trials = 200, p.seed = 7;
    return p;
}

/* No failure in reach: K steps and a snapshot at every N-th step but the last. */
TEST(fail_none_is_closed_form) {
    struct dp_fail_params p = fail_params(1e30, 100, 2, 30);
    p.steps = 1050, p.trials = 3;
    struct dp_fail_result r;
    ASSERT_OK(dp_fail_run(&p, &r));
    ASSERT_NEAR(r.failures, 0, 0);
    ASSERT_NEAR(r.snapshots, 10, 0);
    ASSERT_NEAR(r.time_s, 1050 + 10 * 2, 1e-6);
    ASSERT_NEAR(r.goodput, 1050.0 / 1070, 1e-12);
    ASSERT_NEAR(r.recovery_s + r.lost_s, 0, 0);
    /* a background write that outlasts the interval makes the next snapshot wait for it */
    p.write_s = 150;
    ASSERT_OK(dp_fail_run(&p, &r));
    ASSERT_NEAR(r.time_s, 1050 + 2 + 9 * (150 - 100 + 2), 1e-6);
}

/* time = useful + snapshots + recovery + redone work, in every configuration;
 * the same parameters give the same result and another seed another. */
TEST(fail_time_accounts_and_is_deterministic) {
    const double writes[] = {0, 20, 300};
    for (int i = 0; i < 3; i++) {
        struct dp_fail_params p = fail_params(400, 150, 5, 40);
        p.write_s = writes[i], p.trials = 30;
        struct dp_fail_result r, r2;
        ASSERT_OK(dp_fail_run(&p, &r));
        ASSERT_TRUE(r.failures > 30); /* about 20000 / 400 per job */
        ASSERT_NEAR(r.time_s, (double)p.steps * p.step_s + r.snapshot_s + r.recovery_s + r.lost_s, 1e-6 * r.time_s);
        ASSERT_NEAR(r.steps_lost, r.steps_lost_mean * r.failures, 1e-6 * r.steps_lost);
        ASSERT_OK(dp_fail_run(&p, &r2));
        ASSERT_TRUE(r.time_s == r2.time_s && r.failures == r2.failures);
        p.seed = 8;
        ASSERT_OK(dp_fail_run(&p, &r2));
        ASSERT_TRUE(r.time_s != r2.time_s);
    }
}

/* Synchronous snapshots: the simulated goodput is Daly's expectation, to 1%
 * (about 9,000 failures in all: the standard error is about 0.2%). */
TEST(fail_matches_daly) {
    const int64_t every[] = {20, 140, 600};
    for (int i = 0; i < 3; i++) {
        struct dp_fail_params p = fail_params(1000, every[i], 10, 30);
        p.steps = every[i] * (20000 / every[i]);
        struct dp_fail_result r;
        ASSERT_OK(dp_fail_run(&p, &r));
        ASSERT_TRUE(!isnan(r.daly_goodput));
        ASSERT_NEAR(r.goodput, r.daly_goodput, 0.01 * r.daly_goodput);
        ASSERT_NEAR(r.daly_goodput,
                    dp_fail_daly_goodput((double)every[i], p.snapshot_s, p.recovery_s, dp_fail_job_mtbf_s(&p)), 1e-12);
    }
}

/* Young-Daly's interval, sqrt(2 C M) = sqrt(2 x 10 x 1000) = 141 steps of 1 s,
 * simulated, is within 0.5% of the best goodput of a sweep of intervals from
 * 1/8 to 8 times it, and well above its ends. */
TEST(fail_young_daly_near_best) {
    ASSERT_NEAR(dp_fail_young_daly_s(10, 1000), sqrt(20000), 1e-9);
    const int64_t yd = 141, sweep[] = {18, 35, 70, 141, 282, 564, 1128};
    double g[7], best = 0;
    for (int i = 0; i < 7; i++) {
        struct dp_fail_params p = fail_params(1000, sweep[i], 10, 30);
        struct dp_fail_result r;
        ASSERT_OK(dp_fail_run(&p, &r));
        g[i] = r.goodput;
        if (g[i] > best) best = g[i];
    }
    ASSERT_EQ(sweep[3], yd);
    ASSERT_TRUE(g[3] > best - 0.005);
    ASSERT_TRUE(g[0] < g[3] - 0.02 && g[6] < g[3] - 0.05);
}

/* A failure loses at most the interval's N steps with synchronous snapshots,
 * and at most 2N with a background write that takes less than the interval
 * (the one in flight is lost with the job, the one before it is durable). */
TEST(fail_steps_lost_bounded) {
    struct dp_fail_params p = fail_params(300, 50, 2, 10);
    p.trials = 50;
    struct dp_fail_result r;
    ASSERT_OK(dp_fail_run(&p, &r));
    ASSERT_TRUE(r.steps_lost_max <= 50 && r.steps_lost_max >= 45);
    p.write_s = 30;
    ASSERT_OK(dp_fail_run(&p, &r));
    ASSERT_TRUE(isnan(r.daly_goodput));
    ASSERT_TRUE(r.steps_lost_max <= 100 && r.steps_lost_max > 50);
}

TEST(fail_bad_params) {
    struct dp_fail_params ok = fail_params(1000, 100, 1, 10), p;
    struct dp_fail_result r;
    p = ok, p.workers = 0;
    ASSERT_EQ(dp_fail_run(&p, &r), DP_EINVAL);
    p = ok, p.mtbf_worker_s = 0;
    ASSERT_EQ(dp_fail_run(&p, &r), DP_EINVAL);
    p = ok, p.step_s = NAN;
    ASSERT_EQ(dp_fail_run(&p, &r), DP_EINVAL);
    p = ok, p.recovery_s = -1;
    ASSERT_EQ(dp_fail_run(&p, &r), DP_EINVAL);
    p = ok, p.trials = 0;
    ASSERT_EQ(dp_fail_run(&p, &r), DP_EINVAL);
    /* no snapshots and 20000 s of work at a job MTBF of 10 s: refused, not simulated for ever */
    p = ok, p.snapshot_every = 0, p.mtbf_worker_s = 10 * p.workers;
    ASSERT_EQ(dp_fail_run(&p, &r), DP_EINVAL);
    ASSERT_TRUE(strstr(dp_errmsg(), "never finish") != NULL);
}
