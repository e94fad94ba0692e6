/*
 * `dptrain simulate` and `dptrain plan`: the CLI of the simulator and of the
 * analytic cost model (include/dp/plan.h, src/plan/).  This file parses
 * options, reads metrics.jsonl traces and prints; the models are in the
 * library.  The --simulate-slow and --simulate-jitter specs are parsed by the
 * trainer's own parsers (dp_parse_simulate_slow/_jitter, dp/train.h), so the
 * simulator accepts exactly what `dptrain train` accepts.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dp/plan.h"
#include "dp/train.h"
#include "cli.h"

#define die dptrain_die

/* "--name VALUE" or "--name=VALUE": 1 and *val when argv[*i] is the option. */
static int take(int argc, char **argv, int *i, const char *name, const char **val) {
    size_t n = strlen(name);
    const char *s = argv[*i];
    if (strncmp(s, name, n) != 0) return 0;
    if (s[n] == '=') {
        *val = s + n + 1;
        return 1;
    }
    if (s[n] != 0) return 0;
    if (*i + 1 >= argc) die("option %s needs a value", name);
    *val = argv[++*i];
    return 1;
}

static long long int_arg(const char *name, const char *v, long long lo, long long hi) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) die("%s: '%s' is not an integer in %lld..%lld", name, v, lo, hi);
    return x;
}

static double num_arg(const char *name, const char *v, double lo, double hi) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !(x >= lo && x <= hi)) die("%s: '%s' is not a number in %g..%g", name, v, lo, hi);
    return x;
}

/* ---- metrics.jsonl ---------------------------------------------------------------- */

/* The metrics file of a run: PATH itself, or PATH/metrics.jsonl for a folder. */
static void metrics_path(const char *path, char *out, size_t n) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) snprintf(out, n, "%s/metrics.jsonl", path);
    else snprintf(out, n, "%s", path);
}

/* Calls fn on every line of a metrics file, parsed; a bad line ends with one
 * error naming the file and line. */
static void each_record(const char *path, void (*fn)(const struct dp_json_obj *, void *), void *arg) {
    char file[4096];
    metrics_path(path, file, sizeof file);
    FILE *f = fopen(file, "r");
    if (!f) die("%s: %s", file, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long ln = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        ln++;
        if (len == 0 || (len == 1 && line[0] == '\n')) continue;
        struct dp_json_obj o;
        if (dp_json_parse(line, (size_t)len, &o)) {
            char msg[256];
            snprintf(msg, sizeof msg, "%s", dp_errmsg());
            dp_json_obj_free(&o);
            free(line);
            fclose(f);
            die("%s:%ld: %s", file, ln, msg);
        }
        fn(&o, arg);
        dp_json_obj_free(&o);
    }
    free(line);
    fclose(f);
}

struct trace {
    double *t;
    int64_t n, cap;
};

/* A step record's compute: forward + backward (the trainer's --simulate-*
 * pacing included, communication and waits not). */
static void trace_add(const struct dp_json_obj *o, void *arg) {
    struct trace *tr = arg;
    if (!dp_json_str_is(o, "kind", "step")) return;
    double f = dp_json_num(o, "forward_s", NAN), b = dp_json_num(o, "backward_s", NAN);
    if (!(f >= 0 && b >= 0)) return;
    if (tr->n == tr->cap) {
        tr->cap = tr->cap ? 2 * tr->cap : 256;
        tr->t = realloc(tr->t, sizeof(double) * (size_t)tr->cap);
        if (!tr->t) die("out of memory");
    }
    tr->t[tr->n++] = f + b;
}

/* ---- simulate ----------------------------------------------------------------------- */

static const char *help_simulate =
    "usage: dptrain simulate [options]\n"
    "\n"
    "A discrete-event simulation of data-parallel training steps: P workers whose compute\n"
    "time per step is drawn (normal, plus the trainer's slow factors and stalls) or taken\n"
    "from a run's metrics.jsonl, under one of four schemes.  Prints throughput, the idle\n"
    "fraction per worker and, for ssp and async, the staleness distribution.  The same\n"
    "options and seed give the same output.  Cost: O(P K) for sync and backup, O(P K log s)\n"
    "for ssp, O(P K log P) for async (K steps); 20,000 workers x 1,000 steps takes seconds.\n"
    "\n"
    "  --mode M              sync | ssp | async | backup [sync]\n"
    "  --workers P           workers [8]\n"
    "  --steps K             steps per worker (async: K pushes per worker) [100]\n"
    "  --batch B             samples per worker per step, for samples/s [32]\n"
    "  --compute-ms MS       mean compute time per step [100]\n"
    "  --compute-sd-ms MS    its standard deviation (normal, cut at 0) [0]\n"
    "  --trace RUN           draw compute times from RUN/metrics.jsonl's step records\n"
    "                        (forward_s + backward_s) instead of the normal\n"
    "  --simulate-slow R:F[,R:F...]   worker R computes F times slower (as train accepts)\n"
    "  --simulate-jitter p=P,ms=MS[,lognormal=S]   stalls and lognormal noise (as train),\n"
    "                        with the trainer's own draws for the same --seed\n"
    "  --comm-ms MS          sync/backup: the all-reduce; ssp/async: one push + pull [0]\n"
    "  --bound S             ssp: how many steps a worker may run ahead [1]\n"
    "  --backup B            backup: a step closes at the first P-B gradients [1]\n"
    "  --shards S            async: parameter-server shards [1]\n"
    "  --server-ms MS        async: time one server takes to apply one push (a shard: MS/S) [0]\n"
    "  --seed N              [1]\n"
    "  --per-worker          print every worker's idle fraction\n"
    "  --json                print one JSON object (dptrain plot reads it) instead of text\n";

static void print_hist_json(const struct dp_sim_result *r) {
    printf(", \"stale_hist\": [");
    int64_t n = r->stale_hist_len < 10000 ? r->stale_hist_len : 10000;
    for (int64_t i = 0; i < n; i++) printf("%s%lld", i ? ", " : "", (long long)r->stale_hist[i]);
    printf("]");
}

int dptrain_cmd_simulate(int argc, char **argv) {
    struct dp_sim_params p = dp_sim_default_params();
    p.workers = 8, p.batch = 32, p.bound = 1, p.backup = 1;
    const char *slow = NULL, *jitter = NULL, *trace = NULL, *v;
    int per_worker = 0, json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(help_simulate, stdout);
            return 0;
        }
        if (take(argc, argv, &i, "--mode", &v)) {
            int m = dp_sim_mode_parse(v);
            if (m < 0) die("--mode: %s", dp_errmsg());
            p.mode = (enum dp_sim_mode)m;
        } else if (take(argc, argv, &i, "--workers", &v)) p.workers = (int)int_arg(a, v, 1, 10000000);
        else if (take(argc, argv, &i, "--steps", &v)) p.steps = int_arg(a, v, 1, 100000000);
        else if (take(argc, argv, &i, "--batch", &v)) p.batch = int_arg(a, v, 1, 1LL << 40);
        else if (take(argc, argv, &i, "--compute-ms", &v)) p.compute_mean_s = num_arg(a, v, 0, 1e9) / 1e3;
        else if (take(argc, argv, &i, "--compute-sd-ms", &v)) p.compute_sd_s = num_arg(a, v, 0, 1e9) / 1e3;
        else if (take(argc, argv, &i, "--trace", &v)) trace = v;
        else if (take(argc, argv, &i, "--simulate-slow", &v)) slow = v;
        else if (take(argc, argv, &i, "--simulate-jitter", &v)) jitter = v;
        else if (take(argc, argv, &i, "--comm-ms", &v)) p.comm_s = num_arg(a, v, 0, 1e9) / 1e3;
        else if (take(argc, argv, &i, "--bound", &v)) p.bound = (int)int_arg(a, v, 0, 1000000000);
        else if (take(argc, argv, &i, "--backup", &v)) p.backup = (int)int_arg(a, v, 0, 10000000);
        else if (take(argc, argv, &i, "--shards", &v)) p.shards = (int)int_arg(a, v, 1, 1000000);
        else if (take(argc, argv, &i, "--server-ms", &v)) p.server_s = num_arg(a, v, 0, 1e9) / 1e3;
        else if (take(argc, argv, &i, "--seed", &v)) p.seed = (uint64_t)int_arg(a, v, 0, INT64_MAX);
        else if (!strcmp(a, "--per-worker")) per_worker = 1;
        else if (!strcmp(a, "--json")) json = 1;
        else die("unknown option '%s' (see 'dptrain simulate --help')", a);
    }
    if (p.mode != DP_SIM_BACKUP) p.backup = 0;
    else if (p.backup >= p.workers) die("--backup %d: needs at least %d workers", p.backup, p.backup + 1);
    double *factor = NULL;
    if (slow) {
        factor = malloc(sizeof(double) * (size_t)p.workers);
        if (!factor) die("out of memory");
        if (dp_parse_simulate_slow(slow, p.workers, factor)) die("%s", dp_errmsg());
        p.slow = factor;
    }
    if (jitter) {
        struct dp_jitter j;
        if (dp_parse_simulate_jitter(jitter, &j)) die("%s", dp_errmsg());
        p.stall_p = j.p, p.stall_s = j.ms / 1e3, p.sigma = j.sigma;
    }
    struct trace tr = {0};
    if (trace) {
        each_record(trace, trace_add, &tr);
        if (!tr.n) die("--trace %s: no step records with forward_s and backward_s", trace);
        p.trace = tr.t, p.trace_len = tr.n;
    }
    struct dp_sim_result r;
    if (dp_sim_run(&p, &r)) die("%s", dp_errmsg());
    int stale = p.mode == DP_SIM_SSP || p.mode == DP_SIM_ASYNC;
    if (json) {
        printf("{\"kind\": \"simulate\", \"mode\": \"%s\", \"workers\": %d, \"steps\": %lld, \"time_s\": %.9g, "
               "\"steps_per_s\": %.9g, \"samples_per_s\": %.9g, \"idle_mean\": %.6f, \"idle_min\": %.6f, "
               "\"idle_max\": %.6f",
               dp_sim_mode_name(p.mode), p.workers, (long long)p.steps, r.time_s, r.steps_per_s, r.samples_per_s,
               r.idle_mean, r.idle_min, r.idle_max);
        if (per_worker) {
            printf(", \"idle\": [");
            for (int w = 0; w < p.workers; w++) printf("%s%.6f", w ? ", " : "", r.idle[w]);
            printf("]");
        }
        if (stale) {
            printf(", \"stale_mean\": %.6f, \"stale_p50\": %lld, \"stale_p99\": %lld, \"stale_max\": %lld",
                   r.stale_mean, (long long)r.stale_p50, (long long)r.stale_p99, (long long)r.stale_max);
            print_hist_json(&r);
        }
        printf("}\n");
    } else {
        printf("mode %s  workers %d  steps %lld  simulated time %.6g s\n", dp_sim_mode_name(p.mode), p.workers,
               (long long)p.steps, r.time_s);
        printf("throughput: %.6g steps/s  %.6g samples/s", r.steps_per_s, r.samples_per_s);
        if (p.mode == DP_SIM_ASYNC) printf("  (%.6g pushes/s)", r.steps_per_s * p.workers);
        printf("\n");
        printf("idle fraction: mean %.4f  min %.4f  max %.4f (worker %d)\n", r.idle_mean, r.idle_min, r.idle_max,
               r.idle_max_worker);
        if (stale)
            printf("staleness (%s): mean %.4g  p50 %lld  p99 %lld  max %lld\n",
                   p.mode == DP_SIM_SSP ? "steps" : "pushes", r.stale_mean, (long long)r.stale_p50,
                   (long long)r.stale_p99, (long long)r.stale_max);
        for (int w = 0; per_worker && w < p.workers; w++) printf("worker %d idle %.6f\n", w, r.idle[w]);
    }
    dp_sim_result_free(&r);
    free(tr.t);
    free(factor);
    return 0;
}
