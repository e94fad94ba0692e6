/*
 * dp/plan.h — predicting a data-parallel run before it happens: a
 * discrete-event simulator of training steps (dp_sim_*), the analytic
 * α-β-γ cost model of the communicator and the reducer (dp_plan_*), and the
 * small readers and writers the CLI's plan, simulate and plot commands use
 * (a flat JSON-line reader, an SVG writer).
 *
 * The planner depends on src/core only: it models the communicator and the
 * reducer (their algorithms, their bucket rule) without calling them, so it
 * runs for 20,000 workers on one core.  The trainer's --simulate-slow and
 * --simulate-jitter specs are parsed by the CLI (dp/train.h) and handed in
 * as plain numbers.
 *
 *     struct dp_sim_params p = dp_sim_default_params();
 *     p.mode = DP_SIM_SYNC, p.workers = 1000, p.steps = 100;
 *     p.compute_mean_s = 0.1, p.comm_s = 0.02;
 *     struct dp_sim_result r;
 *     if (dp_sim_run(&p, &r)) fprintf(stderr, "%s\n", dp_errmsg());
 *     else printf("%.2f steps/s\n", r.steps_per_s);
 *     dp_sim_result_free(&r);
 */
#ifndef DP_PLAN_H
#define DP_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "dp/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the simulator ------------------------------------------------------------ */

enum dp_sim_mode {
    DP_SIM_SYNC = 0, /* every step waits for all P workers, then one all-reduce of comm_s */
    DP_SIM_SSP,      /* stale-synchronous: a worker may run at most `bound` steps ahead of the slowest */
    DP_SIM_ASYNC,    /* parameter server: each worker pushes and pulls on its own; the server is a queue */
    DP_SIM_BACKUP,   /* synchronous, but a step closes when the first P - backup gradients arrived */
    DP_SIM_MODE_COUNT
};
/* "sync", "ssp", "async", "backup"; parse returns the mode or DP_EINVAL. */
const char *dp_sim_mode_name(enum dp_sim_mode m);
int dp_sim_mode_parse(const char *name);

/* The random stream of the simulator's normal compute draws (a = worker,
 * b = step).  Stalls and the lognormal factor use the trainer's own draws,
 * DP_RNG_SLOW at (worker, 2 step) and (worker, 2 step + 1), so a simulated
 * worker stalls in the same steps as the trainer's --simulate-jitter would. */
#define DP_RNG_SIM 17

struct dp_sim_params {
    enum dp_sim_mode mode;
    int workers;            /* P >= 1 */
    int64_t steps;          /* steps per worker (async: P x steps pushes in all) */
    int64_t batch;          /* samples per worker per step (for samples/s) */
    /* Compute time of worker w in its step k:
     *   c = max(0, mean + sd z) x slow[w] x max(1, exp(sigma z')) + (stall_s with probability stall_p)
     * or, with a trace, trace[u mod trace_len] in place of max(0, mean + sd z)
     * (a bootstrap draw from a measured run's per-step compute). */
    double compute_mean_s, compute_sd_s;
    const double *slow;     /* (P) factors >= 1, or NULL: all 1 (--simulate-slow) */
    double stall_p, stall_s, sigma; /* --simulate-jitter p, ms / 1000, lognormal */
    const double *trace;    /* (trace_len) measured compute times in s, or NULL */
    int64_t trace_len;
    double comm_s;          /* sync, backup: the all-reduce; ssp, async: one push + pull transfer */
    int bound;              /* ssp: s >= 0 */
    int backup;             /* backup: b, 0 <= b < P */
    int shards;             /* async: S >= 1 */
    double server_s;        /* async: time one server takes to apply one whole push (a shard: server_s / S) */
    uint64_t seed;
};
struct dp_sim_params dp_sim_default_params(void);

struct dp_sim_result {
    double time_s;          /* simulated wall time */
    int64_t updates;        /* model updates: steps (sync, ssp, backup) or pushes (async) */
    double steps_per_s;     /* steps per worker per second (async: pushes / P / s) */
    double samples_per_s;   /* samples that reached the model per second (backup: P - b per step) */
    double *idle;           /* (P) fraction of time_s each worker neither computed nor sent */
    double idle_mean, idle_min, idle_max;
    int idle_max_worker;
    /* Staleness of each update (ssp: in steps, k - 1 - the last step every
     * worker had committed when the worker read; async: pushes applied by the
     * server between the worker's read and its push).  Zero for sync and backup. */
    double stale_mean;
    int64_t stale_p50, stale_p99, stale_max;
    int64_t *stale_hist;    /* (stale_hist_len) counts of staleness 0, 1, ...; the last bin also counts larger values */
    int64_t stale_hist_len;
};

/* Runs the simulation.  0 or DP_EINVAL (a bad parameter, with a message) or
 * DP_ENOMEM.  Deterministic: a pure function of the parameters (seed
 * included).  The result owns idle and stale_hist: dp_sim_result_free. */
int dp_sim_run(const struct dp_sim_params *p, struct dp_sim_result *r);
void dp_sim_result_free(struct dp_sim_result *r);

/* ---- a reader of flat JSON lines (metrics.jsonl) ---------------------------------- */

/* One line of metrics.jsonl is one flat object: string keys, values that are
 * numbers, strings, true/false/null or arrays of numbers.  Nothing nested
 * deeper is accepted.  Bad input is DP_EFORMAT with a message naming the
 * column; never a crash (tests/test_plan.c feeds it mutated lines). */
enum dp_json_type { DP_JSON_NUM = 0, DP_JSON_STR, DP_JSON_ARR, DP_JSON_BOOL, DP_JSON_NULL, DP_JSON_TYPE_COUNT };
struct dp_json_field {
    char *key;
    enum dp_json_type type;
    double num;             /* NUM, BOOL (0 or 1) */
    char *str;              /* STR (escapes decoded; \u beyond ASCII becomes '?') */
    double *arr;            /* ARR (n) */
    int64_t n;
};
struct dp_json_obj {
    struct dp_json_field *f;
    int n, cap;
};
/* Parses s[0..len) (one object; surrounding white space allowed) into o,
 * which the caller frees with dp_json_obj_free (also after a failure). */
int dp_json_parse(const char *s, size_t len, struct dp_json_obj *o);
void dp_json_obj_free(struct dp_json_obj *o);
/* The field named key, or NULL. */
const struct dp_json_field *dp_json_get(const struct dp_json_obj *o, const char *key);
/* The number at key, or dflt when absent or not a number. */
double dp_json_num(const struct dp_json_obj *o, const char *key, double dflt);
/* 1 when the string at key equals val. */
int dp_json_str_is(const struct dp_json_obj *o, const char *key, const char *val);

#ifdef __cplusplus
}
#endif
#endif
