/* Failures at scale (dp/plan.h, dp_fail_*): what machine failures cost a
 * synchronous job, by simulation, and the snapshot interval that minimises
 * the cost, by Young and Daly's formulas.
 *
 * The model.  A job of K steps of step_s each runs on P workers.  Worker
 * failures are independent and exponential with mean mtbf_worker_s, so the
 * job, which stops at any worker's failure, fails as a Poisson process of
 * rate P / mtbf_worker_s: its MTBF is M = mtbf_worker_s / P (a replaced
 * worker is new, and the process has no memory, so the rate never changes).
 * Every N steps the job takes a snapshot: the step pays C (the copy,
 * snapshot_s) and the snapshot becomes durable write_s later (the
 * background write, snapshot.c); one write in flight, so a snapshot due
 * while the previous one is still being written waits for it.  A failure
 * loses the work since the newest durable snapshot (a write in flight is
 * lost with the job) and costs R (recovery_s: detection, relaunch, loading);
 * a failure during recovery starts the recovery again.
 *
 * Simulated event by event: the job jumps from one event (a snapshot
 * boundary, the end, a failure) to the next, O(failures + K / N) per trial,
 * with failure times from a counter-based stream (seed, trial, failure
 * number), so a result is a pure function of the parameters.
 *
 * Goodput is the useful fraction of worker-time: K step_s / wall time (all
 * P workers are busy or idle together).  Daly's expected wall time for the
 * same model with a synchronous snapshot (write_s = 0), with tau = N step_s
 * of work between snapshots (J. T. Daly, "A higher order estimate of the
 * optimum checkpoint interval for restart dumps", FGCS 22, 2006):
 *
 *     T = M e^(R/M) (e^((tau + C)/M) - 1) K step_s / tau
 *
 * (each segment of tau + C is retried until it runs M-free, and each retry
 * pays a recovery that itself restarts on failure).  Its minimum over tau is
 * near Young's tau = sqrt(2 C M) (first order in C/M; Daly's higher-order
 * optimum is sqrt(2 C M) - C for C < 2M). */
#include <math.h>
#include <string.h>

#include "dp/core.h"
#include "dp/plan.h"

struct dp_fail_params dp_fail_default_params(void) {
    return (struct dp_fail_params){.workers = 1, .steps = 1000, .step_s = 1, .trials = 100, .seed = 1};
}

double dp_fail_job_mtbf_s(const struct dp_fail_params *p) { return p->mtbf_worker_s / p->workers; }

double dp_fail_young_daly_s(double snapshot_s, double mtbf_s) { return sqrt(2 * snapshot_s * mtbf_s); }

double dp_fail_daly_goodput(double tau_s, double snapshot_s, double recovery_s, double mtbf_s) {
    if (tau_s <= 0 || mtbf_s <= 0) return 0;
    double t = mtbf_s * exp(recovery_s / mtbf_s) * expm1((tau_s + snapshot_s) / mtbf_s);
    return isfinite(t) && t > 0 ? tau_s / t : 0;
}

/* Exponential with mean m: -m ln u, u uniform in (0, 1) with 53 bits. */
static double draw_exp(uint64_t seed, uint64_t trial, uint64_t n, double m) {
    uint32_t w[4];
    dp_rng_philox(seed, DP_RNG_FAIL, trial, n, w);
    double u = ((double)(((uint64_t)w[0] << 21) ^ (w[1] >> 11)) + 0.5) / 9007199254740992.0; /* / 2^53 */
    return -m * log(u);
}

/* One trial: the job's wall time, and its failures, recovery and snapshot
 * time and steps lost added to r (the caller divides by the trials). */
struct trial {
    uint64_t seed, trial, nfail; /* the stream's counter: failures drawn so far */
    double m;                    /* job MTBF */
    double t, t_fail;            /* now, the next failure */
};

static void next_failure(struct trial *s) { s->t_fail = s->t + draw_exp(s->seed, s->trial, s->nfail++, s->m); }

/* A failure at s->t_fail that loses `lost` steps, lost_s seconds of work
 * done: then the recovery, started again by each failure inside it. */
static void fail(const struct dp_fail_params *p, struct trial *s, struct dp_fail_result *r, int64_t lost,
                 double lost_s) {
    r->failures++;
    r->steps_lost += (double)lost;
    if ((double)lost > r->steps_lost_max) r->steps_lost_max = (double)lost;
    r->lost_s += lost_s;
    s->t = s->t_fail;
    for (;;) {
        next_failure(s);
        if (s->t_fail >= s->t + p->recovery_s) break;
        r->failures++;
        r->recovery_s += s->t_fail - s->t;
        s->t = s->t_fail;
    }
    s->t += p->recovery_s;
    r->recovery_s += p->recovery_s;
}

static double run_trial(const struct dp_fail_params *p, struct trial *s, struct dp_fail_result *r) {
    const int64_t K = p->steps, N = p->snapshot_every;
    int64_t k = 0, durable = 0, pending = -1; /* steps done; the newest durable snapshot; one being written */
    double pending_at = 0;                     /* when it becomes durable */
    s->t = 0;
    next_failure(s);
    while (k < K) {
        /* the failure, if it comes before the next event: wherever it falls, the
         * job goes back to the newest durable snapshot after a recovery */
        int64_t next = N > 0 ? (k / N + 1) * N : K;
        if (next > K) next = K;
        double t_next = s->t + (double)(next - k) * p->step_s;
        if (s->t_fail < t_next) {
            int64_t done = k + (int64_t)floor((s->t_fail - s->t) / p->step_s);
            if (pending >= 0 && pending_at <= s->t_fail) durable = pending; /* written before the failure */
            fail(p, s, r, done - durable, s->t_fail - s->t + (double)(k - durable) * p->step_s);
            k = durable, pending = -1;
            continue;
        }
        s->t = t_next, k = next;
        if (pending >= 0 && pending_at <= s->t) durable = pending, pending = -1;
        if (k == K) break;
        /* a snapshot: wait for the write in flight, then the copy */
        double start = s->t, ready = pending >= 0 ? pending_at : s->t;
        if (s->t_fail < ready + p->snapshot_s) {
            /* failed while waiting or copying: the steps since the newest durable snapshot are lost */
            if (pending >= 0 && pending_at <= s->t_fail) durable = pending;
            r->snapshot_s += s->t_fail - start;
            fail(p, s, r, k - durable, (double)(k - durable) * p->step_s);
            k = durable, pending = -1;
            continue;
        }
        if (pending >= 0) durable = pending;
        s->t = ready + p->snapshot_s;
        r->snapshot_s += s->t - start;
        r->snapshots++;
        pending = k, pending_at = s->t + p->write_s;
        if (p->write_s <= 0) durable = k, pending = -1;
    }
    return s->t;
}

int dp_fail_run(const struct dp_fail_params *p, struct dp_fail_result *r) {
    memset(r, 0, sizeof *r);
    if (p->workers < 1) return dp_seterr(DP_EINVAL, "failures: workers must be at least 1");
    if (p->steps < 1) return dp_seterr(DP_EINVAL, "failures: steps must be at least 1");
    if (!(p->step_s > 0) || !isfinite(p->step_s)) return dp_seterr(DP_EINVAL, "failures: the step time must be > 0");
    if (!(p->mtbf_worker_s > 0) || !isfinite(p->mtbf_worker_s))
        return dp_seterr(DP_EINVAL, "failures: the worker MTBF must be > 0");
    if (!(p->recovery_s >= 0) || !(p->snapshot_s >= 0) || !(p->write_s >= 0) || !isfinite(p->recovery_s) ||
        !isfinite(p->snapshot_s) || !isfinite(p->write_s))
        return dp_seterr(DP_EINVAL, "failures: recovery, snapshot and write times must be >= 0");
    if (p->snapshot_every < 0) return dp_seterr(DP_EINVAL, "failures: the snapshot interval must be >= 0");
    if (p->trials < 1) return dp_seterr(DP_EINVAL, "failures: trials must be at least 1");
    const double m = dp_fail_job_mtbf_s(p), useful = (double)p->steps * p->step_s;
    /* A job that cannot finish: without a snapshot, or with an interval of
     * work far beyond M, the expected time grows as e^(tau/M) (Daly): refuse
     * past e^50 rather than simulate for ever. */
    double tau = p->snapshot_every > 0 ? (double)p->snapshot_every * p->step_s : useful;
    if ((tau + p->snapshot_s + p->write_s) / m > 50 || p->recovery_s / m > 50)
        return dp_seterr(DP_EINVAL,
                         "failures: the job's MTBF (%.6g s) is far below its interval of work between snapshots "
                         "(%.6g s) or its recovery (%.6g s): it would never finish",
                         m, tau + p->snapshot_s + p->write_s, p->recovery_s);
    double sum_t = 0;
    for (int i = 0; i < p->trials; i++) {
        struct trial s = {.seed = p->seed, .trial = (uint64_t)i, .m = m};
        sum_t += run_trial(p, &s, r);
    }
    const double n = p->trials;
    r->mtbf_job_s = m;
    r->time_s = sum_t / n;
    r->goodput = useful / r->time_s;
    r->failures /= n;
    r->steps_lost_mean = r->failures > 0 ? r->steps_lost / n / r->failures : 0;
    r->steps_lost /= n;
    r->snapshots /= n;
    r->snapshot_s /= n, r->recovery_s /= n, r->lost_s /= n;
    r->daly_goodput = p->write_s == 0 ? dp_fail_daly_goodput(tau, p->snapshot_s, p->recovery_s, m) : NAN;
    return DP_OK;
}
