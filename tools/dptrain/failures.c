/*
 * Failures at scale in `dptrain simulate` and `dptrain plan` (issue 33, E5):
 * the options, and the report of the library's failure model (dp_fail_*,
 * src/plan/failures.c) for a step time that the command worked out.
 * simulate reports the interval given (or Young-Daly's); plan recommends
 * Young-Daly's and checks it against a simulated sweep of intervals.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dp/core.h"
#include "dp/plan.h"
#include "cli.h"

#define die dptrain_die

const char *const dptrain_fail_help =
    "failures (off unless --mtbf-hours is given):\n"
    "  --mtbf-hours H        a worker's mean time between failures (exponential); the job,\n"
    "                        which stops when any worker fails, has MTBF H / workers\n"
    "  --recovery-s R        from a failure to the first step after relaunch [60]\n"
    "  --snapshot-ms C       what a checkpoint costs the step (the copy of a background\n"
    "                        snapshot; the whole write with --ckpt-sync) [100]\n"
    "  --write-ms W          from the copy to a durable file (the background write) [0]\n"
    "  --snapshot-every N    steps between snapshots [Young-Daly: sqrt(2 C M) / step]\n"
    "  --job-steps K         the job's length in steps [20 job MTBFs of steps, at least 1000]\n"
    "  --trials T            jobs simulated and averaged [50]\n";

void dptrain_fail_defaults(struct dptrain_fail_opts *o) {
    *o = (struct dptrain_fail_opts){.recovery_s = 60, .snapshot_s = 0.1, .every = -1, .trials = 50};
}

int dptrain_fail_take(int argc, char **argv, int *i, struct dptrain_fail_opts *o) {
    const char *a = argv[*i], *v;
    if (dptrain_take(argc, argv, i, "--mtbf-hours", &v)) o->mtbf_worker_s = dptrain_num_arg(a, v, 1e-6, 1e15) * 3600;
    else if (dptrain_take(argc, argv, i, "--recovery-s", &v)) o->recovery_s = dptrain_num_arg(a, v, 0, 1e9);
    else if (dptrain_take(argc, argv, i, "--snapshot-ms", &v)) o->snapshot_s = dptrain_num_arg(a, v, 0, 1e12) / 1e3;
    else if (dptrain_take(argc, argv, i, "--write-ms", &v)) o->write_s = dptrain_num_arg(a, v, 0, 1e12) / 1e3;
    else if (dptrain_take(argc, argv, i, "--snapshot-every", &v)) o->every = dptrain_int_arg(a, v, 0, 1LL << 40);
    else if (dptrain_take(argc, argv, i, "--job-steps", &v)) o->job_steps = dptrain_int_arg(a, v, 1, 1LL << 40);
    else if (dptrain_take(argc, argv, i, "--trials", &v)) o->trials = (int)dptrain_int_arg(a, v, 1, 1000000);
    else return 0;
    o->given = 1;
    return 1;
}

/* Young-Daly's interval in whole steps (at least 1). */
static long long young_daly_steps(double snapshot_s, double mtbf_s, double step_s) {
    double n = round(dp_fail_young_daly_s(snapshot_s, mtbf_s) / step_s);
    return n < 1 ? 1 : n > 1e12 ? (long long)1e12 : (long long)n;
}

/* The job's length: given, or long enough to see about 20 failures (a goodput
 * of the steady state, which Young-Daly's interval optimises). */
static long long job_steps(const struct dptrain_fail_opts *o, int workers, double step_s) {
    if (o->job_steps > 0) return o->job_steps;
    double k = ceil(20 * o->mtbf_worker_s / workers / step_s);
    return k < 1000 ? 1000 : k > 1e12 ? (long long)1e12 : (long long)k;
}

static struct dp_fail_params params(const struct dptrain_fail_opts *o, int workers, double step_s, long long every,
                                    uint64_t seed) {
    struct dp_fail_params p = dp_fail_default_params();
    p.workers = workers, p.steps = job_steps(o, workers, step_s), p.step_s = step_s;
    p.mtbf_worker_s = o->mtbf_worker_s;
    p.recovery_s = o->recovery_s, p.snapshot_every = every, p.snapshot_s = o->snapshot_s, p.write_s = o->write_s;
    p.trials = o->trials, p.seed = seed;
    return p;
}

static void run(const struct dp_fail_params *p, struct dp_fail_result *r) {
    if (dp_fail_run(p, r)) die("%s", dp_errmsg());
}

static void print_result(const struct dp_fail_params *p, const struct dp_fail_result *r, int json) {
    if (json) {
        printf(", \"fail_mtbf_job_s\": %.9g, \"fail_every\": %lld, \"fail_goodput\": %.6f, \"fail_daly_goodput\": %.6f, "
               "\"fail_failures\": %.6g, \"fail_steps_lost_mean\": %.6g, \"fail_steps_lost_max\": %.6g, "
               "\"fail_time_s\": %.9g, \"fail_snapshot_s\": %.9g, \"fail_recovery_s\": %.9g, \"fail_lost_s\": %.9g",
               r->mtbf_job_s, (long long)p->snapshot_every, r->goodput, isnan(r->daly_goodput) ? -1 : r->daly_goodput,
               r->failures, r->steps_lost_mean, r->steps_lost_max, r->time_s, r->snapshot_s, r->recovery_s, r->lost_s);
        return;
    }
    printf("goodput %.4f", r->goodput);
    if (!isnan(r->daly_goodput)) printf(" (Daly's formula: %.4f)", r->daly_goodput);
    printf("  failures %.4g per job  steps lost per failure: mean %.4g, max %.0f\n", r->failures, r->steps_lost_mean,
           r->steps_lost_max);
    double wall = r->time_s;
    printf("wall time %.6g s = useful %.1f%% + snapshots %.1f%% + recovery %.1f%% + work redone %.1f%%\n", wall,
           100 * (double)p->steps * p->step_s / wall, 100 * r->snapshot_s / wall, 100 * r->recovery_s / wall,
           100 * r->lost_s / wall);
}

static void print_header(const struct dptrain_fail_opts *o, int workers, double step_s, long long every, int yd) {
    double m = o->mtbf_worker_s / workers;
    printf("failures: worker MTBF %.6g h, job MTBF %.6g s at %d workers; recovery %.6g s; step %.6g ms; "
           "job %lld steps (%d trials)\n",
           o->mtbf_worker_s / 3600, m, workers, o->recovery_s, step_s * 1e3, job_steps(o, workers, step_s), o->trials);
    printf("snapshot every %lld steps%s: cost %.6g ms, durable %.6g ms after\n", every,
           yd ? " (Young-Daly: sqrt(2 C M))" : "", o->snapshot_s * 1e3, o->write_s * 1e3);
}

void dptrain_fail_simulate(const struct dptrain_fail_opts *o, int workers, double step_s, uint64_t seed, int json) {
    if (!(o->mtbf_worker_s > 0)) die("failures: give --mtbf-hours H (a worker's mean time between failures)");
    long long every = o->every >= 0 ? o->every : young_daly_steps(o->snapshot_s, o->mtbf_worker_s / workers, step_s);
    struct dp_fail_params p = params(o, workers, step_s, every, seed);
    struct dp_fail_result r;
    run(&p, &r);
    if (!json) print_header(o, workers, step_s, every, o->every < 0);
    print_result(&p, &r, json);
}

/* plan: Young-Daly's interval, Daly's expected goodput, and a simulated sweep
 * from 1/8 to 8 times the interval (the same failure draws for every
 * interval: the seed is fixed) that checks it. */
void dptrain_fail_plan(const struct dptrain_fail_opts *o, int workers, double step_s, int json) {
    if (!(o->mtbf_worker_s > 0)) die("failures: give --mtbf-hours H (a worker's mean time between failures)");
    const double m = o->mtbf_worker_s / workers;
    const long long yd = young_daly_steps(o->snapshot_s, m, step_s);
    const long long every = o->every >= 0 ? o->every : yd;
    const double factors[] = {0.125, 0.25, 0.5, 1, 2, 4, 8};
    long long best_n = 0, prev = -1;
    double best_g = -1, at_every = NAN;
    if (!json) {
        print_header(o, workers, step_s, every, o->every < 0);
        printf("%14s %12s %10s %10s %10s %12s\n", "snapshot_every", "interval_s", "goodput", "daly", "failures",
               "lost/failure");
    }
    for (int f = 0; f < (int)(sizeof factors / sizeof *factors); f++) {
        long long n = (long long)llround((double)every * factors[f]);
        if (n < 1) n = 1;
        if (n == prev) continue;
        prev = n;
        struct dp_fail_params p = params(o, workers, step_s, n, 1);
        struct dp_fail_result r;
        if (dp_fail_run(&p, &r)) continue; /* an interval too long to ever finish: not a candidate */
        if (r.goodput > best_g) best_g = r.goodput, best_n = n;
        if (n == every) at_every = r.goodput;
        if (json)
            printf("{\"kind\": \"plan_failures\", \"snapshot_every\": %lld, \"interval_s\": %.9g, \"goodput\": %.6f, "
                   "\"daly_goodput\": %.6f, \"failures\": %.6g, \"steps_lost_mean\": %.6g}\n",
                   n, (double)n * step_s, r.goodput, isnan(r.daly_goodput) ? -1 : r.daly_goodput, r.failures,
                   r.steps_lost_mean);
        else {
            char daly[32] = "-";
            if (!isnan(r.daly_goodput)) snprintf(daly, sizeof daly, "%.4f", r.daly_goodput);
            printf("%14lld %12.6g %10.4f %10s %10.4g %12.4g%s\n", n, (double)n * step_s, r.goodput, daly, r.failures,
                   r.steps_lost_mean, n == every ? "  <-" : "");
        }
    }
    if (isnan(at_every)) die("failures: the job cannot finish at a snapshot every %lld steps (job MTBF %.6g s)", every, m);
    if (json) {
        double expect = dp_fail_daly_goodput((double)every * step_s, o->snapshot_s, o->recovery_s, m);
        printf("{\"kind\": \"plan_failures_recommend\", \"snapshot_every\": %lld, \"young_daly_every\": %lld, "
               "\"expected_goodput\": %.6f, \"simulated_goodput\": %.6f, \"best_every\": %lld, \"best_goodput\": %.6f}\n",
               every, yd, expect, at_every, best_n, best_g);
        return;
    }
    printf("recommended: --ckpt-every-steps %lld (Young-Daly: %.6g s of work between snapshots), expected goodput "
           "%.4f (Daly's formula)\n",
           yd, (double)yd * step_s, dp_fail_daly_goodput((double)yd * step_s, o->snapshot_s, o->recovery_s, m));
    printf("simulated: %.4f at every %lld steps (%s); the sweep's best is %.4f at every %lld steps\n", at_every, every,
           o->every >= 0 ? "given" : "recommended", best_g, best_n);
}
