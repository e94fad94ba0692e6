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

#include "dp/core.h"
#include "dp/nn.h"
#include "dp/par.h"
#include "dp/plan.h"
#include "dp/train.h"
#include "cli.h"

#define die dptrain_die




/* ---- metrics.jsonl ---------------------------------------------------------------- */

/* The metrics file of a run: PATH itself, or PATH/metrics.jsonl for a folder. */
static void metrics_path(const char *path, char *out, size_t n) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) snprintf(out, n, "%s/metrics.jsonl", path);
    else snprintf(out, n, "%s", path);
}

/* Calls fn on every line of a metrics file, parsed; a bad line ends with one
 * error naming the file and line.  (cli.h) */
void dptrain_each_record(const char *path, void (*fn)(const struct dp_json_obj *, void *), void *arg) {
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
            /* a last line without its newline is a record cut short (a run killed inside a
             * write): one warning, and the records before it are read */
            int partial = line[len - 1] != '\n' && getc(f) == EOF;
            free(line);
            fclose(f);
            if (partial) {
                fprintf(stderr, "dptrain: warning: %s:%ld: the last record is cut short (a killed run?): "
                        "read the %ld before it\n", file, ln, ln - 1);
                return;
            }
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
    struct dptrain_fail_opts fo;
    dptrain_fail_defaults(&fo);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(help_simulate, stdout);
            fputs(dptrain_fail_help, stdout);
            return 0;
        }
        if (dptrain_take(argc, argv, &i, "--mode", &v)) {
            int m = dp_sim_mode_parse(v);
            if (m < 0) die("--mode: %s", dp_errmsg());
            p.mode = (enum dp_sim_mode)m;
        } else if (dptrain_take(argc, argv, &i, "--workers", &v)) p.workers = (int)dptrain_int_arg(a, v, 1, 10000000);
        else if (dptrain_take(argc, argv, &i, "--steps", &v)) p.steps = dptrain_int_arg(a, v, 1, 100000000);
        else if (dptrain_take(argc, argv, &i, "--batch", &v)) p.batch = dptrain_int_arg(a, v, 1, 1LL << 40);
        else if (dptrain_take(argc, argv, &i, "--compute-ms", &v)) p.compute_mean_s = dptrain_num_arg(a, v, 0, 1e9) / 1e3;
        else if (dptrain_take(argc, argv, &i, "--compute-sd-ms", &v)) p.compute_sd_s = dptrain_num_arg(a, v, 0, 1e9) / 1e3;
        else if (dptrain_take(argc, argv, &i, "--trace", &v)) trace = v;
        else if (dptrain_take(argc, argv, &i, "--simulate-slow", &v)) slow = v;
        else if (dptrain_take(argc, argv, &i, "--simulate-jitter", &v)) jitter = v;
        else if (dptrain_take(argc, argv, &i, "--comm-ms", &v)) p.comm_s = dptrain_num_arg(a, v, 0, 1e9) / 1e3;
        else if (dptrain_take(argc, argv, &i, "--bound", &v)) p.bound = (int)dptrain_int_arg(a, v, 0, 1000000000);
        else if (dptrain_take(argc, argv, &i, "--backup", &v)) p.backup = (int)dptrain_int_arg(a, v, 0, 10000000);
        else if (dptrain_take(argc, argv, &i, "--shards", &v)) p.shards = (int)dptrain_int_arg(a, v, 1, 1000000);
        else if (dptrain_take(argc, argv, &i, "--server-ms", &v)) p.server_s = dptrain_num_arg(a, v, 0, 1e9) / 1e3;
        else if (dptrain_take(argc, argv, &i, "--seed", &v)) p.seed = (uint64_t)dptrain_int_arg(a, v, 0, INT64_MAX);
        else if (!strcmp(a, "--per-worker")) per_worker = 1;
        else if (!strcmp(a, "--json")) json = 1;
        else if (dptrain_fail_take(argc, argv, &i, &fo)) continue;
        else die("unknown option '%s' (see 'dptrain simulate --help')", a);
    }
    if (p.mode != DP_SIM_BACKUP) p.backup = 0;
    else if (p.backup >= p.workers) die("--backup %d: needs at least %d workers", p.backup, p.backup + 1);
    double *factor = NULL;
    if (slow) {
        factor = malloc(sizeof(double) * (size_t)p.workers);
        if (!factor) die("out of memory");
        if (dp_parse_simulate_slow(slow, p.workers, factor)) {
            free(factor); /* die exits: leave nothing for the leak checker */
            die("%s", dp_errmsg());
        }
        p.slow = factor;
    }
    if (jitter) {
        struct dp_jitter j;
        if (dp_parse_simulate_jitter(jitter, &j)) die("%s", dp_errmsg());
        p.stall_p = j.p, p.stall_s = j.ms / 1e3, p.sigma = j.sigma;
    }
    static struct trace tr; /* static: reachable if a bad line ends the program mid-read */
    if (trace) {
        dptrain_each_record(trace, trace_add, &tr);
        if (!tr.n) {
            free(factor);
            die("--trace %s: no step records with forward_s and backward_s", trace);
        }
        p.trace = tr.t, p.trace_len = tr.n;
    }
    struct dp_sim_result r;
    if (dp_sim_run(&p, &r)) {
        free(factor), free(tr.t);
        die("%s", dp_errmsg());
    }
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
        /* failures: the job's step is the simulated one */
        if (fo.given) dptrain_fail_simulate(&fo, p.workers, 1 / r.steps_per_s, p.seed, 1);
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
        if (fo.given) dptrain_fail_simulate(&fo, p.workers, 1 / r.steps_per_s, p.seed, 0);
    }
    dp_sim_result_free(&r);
    free(tr.t);
    tr = (struct trace){0};
    free(factor);
    return 0;
}

/* ---- plan ---------------------------------------------------------------------------- */

static const char *help_plan =
    "usage: dptrain plan (--params N | --model SPEC) --workers P [options]\n"
    "\n"
    "The analytic cost model of one synchronous data-parallel step (docs/plan.md): the\n"
    "reducer's buckets (the rule of src/ddp/reducer.c), each bucket's all-reduce by ring,\n"
    "recursive halving-doubling, tree, hierarchical (intra + inter host) or a parameter\n"
    "server with S shards (alpha-beta-gamma), overlapped with backward.  Prints the step\n"
    "time, the exposed communication, the scaling efficiency, the bytes on the wire and\n"
    "the memory per worker plain and under ZeRO 1/2/3 (weights, grads, optimizer state).\n"
    "\n"
    "model:\n"
    "  --params N            parameters (1e6, 2e8 accepted); with --layers L equal layers [24]\n"
    "  --model SPEC          count them with the library's model builder (mlp, cnn,\n"
    "                        gpt:layers=..,heads=..,dim=..,ctx=..), per layer, with FLOPs\n"
    "  --input C,H,W         input shape of an image model [1,28,28]\n"
    "  --tokens T            tokens per sample for --params FLOPs (2 x params x T forward) [1]\n"
    "  --batch B             global batch [P x 32]\n"
    "  --dtype fp32|bf16     gradient on the wire [fp32]\n"
    "  --compress R          the wire carries 1/R of the bytes [1]\n"
    "  --optim sgd|adamw     the optimizer: its state bytes (4 SGD momentum, 8 AdamW) and,\n"
    "                        with a profile from calibrate --model, its time per parameter [adamw]\n"
    "  --opt-state-bytes S   optimizer state per parameter (overrides --optim's)\n"
    "  --opt-ms MS           optimizer time per step, beside the profile's per parameter [0]\n"
    "  --comm-cpu F          0..1: compute lost per second of all-reduce beside it [0; profile]\n"
    "  --compute-cv F        sigma / mean of a worker's forward + backward per step: the step\n"
    "                        waits e_P x F x compute for its slowest worker [0; profile]\n"
    "compute:\n"
    "  --flops F             achieved FLOP/s per worker [1e12: an estimate, said so in the output]\n"
    "  --sample-ms MS        or measured forward + backward per sample (overrides --flops)\n"
    "network:\n"
    "  --workers P           [1]\n"
    "  --link-gbps G         link rate per worker, Gbit/s [100]\n"
    "  --latency-us U        per message [5]\n"
    "  --reduce-gbs R        reduction rate, GB/s (gamma = 1/R); 0 = free [0]\n"
    "  --per-host G          workers per host for hier [0 = hier not considered]\n"
    "  --intra-gbps G        link inside a host [800]   --intra-latency-us U [1]\n"
    "  --intra-profile FILE  the link inside a host from a profile (its ring alpha, beta):\n"
    "                        calibrate on one host, beside --profile of calibrate across hosts\n"
    "  --shards S            parameter-server shards [1]\n"
    "  --algo A              ring | rhd | tree | hier | ps | best (per bucket) [best]\n"
    "  --bucket-mb M         bucket cap (0 = the reducer's auto rule) [0]\n"
    "  --first-bucket-mb M   [1]\n"
    "  --zero-unit-mb M      train's --zero-unit-mb: the units in flight are its ranges [none]\n"
    "  --no-overlap          all buckets after backward\n"
    "  --metrics             the run records metrics (train --out): one all-gather of P doubles\n"
    "                        per step (every rank's wait) joins the step, with the profile's\n"
    "                        gather_wait_s (its measured wait, calibrate --metrics or --run)\n"
    "  --profile FILE        a JSON profile (dptrain calibrate writes one): alpha_s, beta_s,\n"
    "                        gamma_s, flops, sample_s, <algo>_alpha_s, <algo>_beta_s; from\n"
    "                        calibrate --model (version 2) also fwd_sample_s, bwd_sample_s,\n"
    "                        sgd_param_s, adamw_param_s, zero_param_s, data_sample_s, comm_cpu;\n"
    "                        version 3 also compute_cv and straggle_cv (the straggler wait),\n"
    "                        version 4 (calibrate --model) also gather_wait_s\n"
    "                        (then --model must name the calibrated model; a profile with\n"
    "                        no compute for --model, from calibrate without --model, is\n"
    "                        refused unless --sample-ms or --flops states it); with the same\n"
    "                        --workers as calibrated, the measured times per size (sizes,\n"
    "                        <algo>_measured_s) time the all-reduces, interpolated; options\n"
    "                        after it override it (a link given after it: the formulas)\n"
    "splitting the model (docs/parallel.md; needs --model):\n"
    "  --pp S                a pipeline of S stages x P/S replicas: the stages' split, each\n"
    "                        micro-batch's forward and backward per stage, the boundary message,\n"
    "                        the makespan and its bubble, the stages' reductions, memory per stage\n"
    "  --micro-batches M     [S]   --pp-schedule gpipe|1f1b [1f1b]   --zero 0|1 [0]\n"
    "  --tp T                tensor groups of T (each stage's, with --pp): each layer's share\n"
    "                        over T and its group's all-reduces on the intra-host link\n"
    "  --layout auto         every layout of the P workers (data-parallel replicas x pipeline\n"
    "                        stages x tensor ranks, micro-batches S..16S, ZeRO 0-3 without\n"
    "                        stages or tensor groups, 0-1 with),\n"
    "                        those that fit --memory-per-worker, ranked by predicted step time\n"
    "  --memory-per-worker B bytes a worker may hold (suffix K, M, G: powers of 1000) [no limit]\n"
    "  --profile-at FILE     (up to 8) profiles of calibrate --model at other --batch / --workers:\n"
    "                        the compute per sample at each size, interpolated for each layout's\n"
    "                        samples per worker or micro-batch (small batches can cost less a\n"
    "                        sample: their activations stay in cache)\n"
    "output:\n"
    "  --buckets             the bucket table (times from the step's start)\n"
    "  --sweep MAX           the same global batch on P = 1, 2, 4 .. MAX workers, and the\n"
    "                        first P where communication exceeds compute\n"
    "  --json                one JSON object instead of text (with --mtbf-hours, the failure\n"
    "                        sweep's objects follow it, one per line)\n";

static void print_bytes(const char *label, double b) {
    const char *u[] = {"B", "KB", "MB", "GB", "TB", "PB"};
    int i = 0;
    double x = b;
    while (fabs(x) >= 1000 && i < 5) x /= 1000, i++;
    printf("%s%.4g %s", label, x, u[i]);
}

/* What a profile says beyond the plan's parameters: the model and optimizer
 * it was calibrated for (checked against --model once all options are read). */
struct profile_info {
    char path[1024], model[128];
    long long batch; /* calibrate --model's --batch and --workers (0: none) */
    int workers;
    int compute; /* 1: the profile prices compute (calibrated fwd/bwd, sample_s or flops) */
    double sgd_param_s, adamw_param_s;
    double sizes[64], measured[DP_PLAN_ALGO_COUNT][64]; /* the all-reduce table (dp_plan_net tab_*) */
};

/* A profile: version 1 (no "version": communication, gamma, sample_s), 2
 * (dptrain calibrate --model: the step's calibrated terms too; forward and
 * backward the slowest worker's), 3 (forward and backward the workers'
 * mean, and the straggler wait apart: compute_cv, straggle_cv at the
 * profile's workers) or 4 (with --run: the step terms from a run's records,
 * and gather_wait_s); a newer one is refused.  read_profile reads and parses
 * one into *o, and dies with one line on a bad or newer one. */
static void read_profile(const char *path, struct dp_json_obj *o) {
    FILE *f = fopen(path, "r");
    if (!f) die("%s: %s", path, strerror(errno));
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    int full = n == sizeof buf;
    fclose(f);
    if (full) die("%s: larger than 64 KiB", path);
    if (dp_json_parse(buf, n, o)) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", dp_errmsg());
        dp_json_obj_free(o);
        die("%s: %s", path, msg);
    }
    double version = dp_json_num(o, "version", 1);
    if (version > 4) {
        dp_json_obj_free(o);
        die("%s: profile version %g: this dptrain reads versions 1 to 4 (calibrate again with this build)", path,
            version);
    }
}

/* The intra-host link of hier from a second profile (--intra-profile): its
 * ring's alpha and beta (else its alpha_s, beta_s), e.g. a thread-level
 * calibrate on one host beside a process-level one across hosts (--profile):
 * hier's reduce-scatter and all-gather inside a host are ring steps. */
static void load_intra_profile(const char *path, struct dp_plan_params *p) {
    struct dp_json_obj o;
    read_profile(path, &o);
    double a = dp_json_num(&o, "ring_alpha_s", dp_json_num(&o, "alpha_s", NAN));
    double b = dp_json_num(&o, "ring_beta_s", dp_json_num(&o, "beta_s", NAN));
    dp_json_obj_free(&o);
    if (!(a >= 0 && b > 0)) die("%s: no ring_alpha_s, ring_beta_s (or alpha_s, beta_s) for the intra-host link", path);
    p->net.intra_alpha_s = a, p->net.intra_beta_s = b;
}

static void load_profile(const char *path, struct dp_plan_params *p, struct profile_info *pi) {
    struct dp_json_obj o;
    read_profile(path, &o);
    snprintf(pi->path, sizeof pi->path, "%s", path);
    const struct dp_json_field *mf = dp_json_get(&o, "model");
    snprintf(pi->model, sizeof pi->model, "%s", mf && mf->type == DP_JSON_STR ? mf->str : "");
    pi->sgd_param_s = dp_json_num(&o, "sgd_param_s", NAN), pi->adamw_param_s = dp_json_num(&o, "adamw_param_s", NAN);
    pi->batch = (long long)dp_json_num(&o, "batch", 0), pi->workers = (int)dp_json_num(&o, "workers", 0);
    /* the calibrated step terms (0 where the profile has none) */
    double fw = dp_json_num(&o, "fwd_sample_s", NAN), bw = dp_json_num(&o, "bwd_sample_s", NAN);
    if (fw == fw && bw == bw) p->fwd_sample_s = fw, p->bwd_sample_s = bw;
    double z = dp_json_num(&o, "zero_param_s", NAN), d = dp_json_num(&o, "data_sample_s", NAN),
           cc = dp_json_num(&o, "comm_cpu", NAN);
    if (z == z) p->zero_param_s = z;
    if (d == d) p->data_sample_s = d;
    if (cc == cc) p->comm_cpu = cc;
    double cv = dp_json_num(&o, "compute_cv", NAN), sv = dp_json_num(&o, "straggle_cv", NAN);
    if (cv == cv) p->compute_cv = cv;
    if (sv == sv) p->straggle_cv = sv, p->straggle_workers = (int)dp_json_num(&o, "workers", 0);
    double gw = dp_json_num(&o, "gather_wait_s", NAN); /* version 4, from calibrate --metrics or --run */
    if (gw == gw) p->gather_wait_s = gw;
    double a = dp_json_num(&o, "alpha_s", NAN), b = dp_json_num(&o, "beta_s", NAN);
    for (int k = 0; k < DP_PLAN_ALGO_COUNT; k++) {
        char ka[64], kb[64];
        snprintf(ka, sizeof ka, "%s_alpha_s", dp_plan_algo_name(k));
        snprintf(kb, sizeof kb, "%s_beta_s", dp_plan_algo_name(k));
        double ak = dp_json_num(&o, ka, a), bk = dp_json_num(&o, kb, b);
        if (ak == ak) p->net.alpha_s[k] = ak;
        if (bk == bk) p->net.beta_s[k] = bk;
    }
    double g = dp_json_num(&o, "gamma_s", NAN), fl = dp_json_num(&o, "flops", NAN), ss = dp_json_num(&o, "sample_s", NAN);
    if (g == g) p->net.gamma_s = g;
    if (fl == fl) p->flops = fl;
    if (ss == ss) p->sample_s = ss;
    pi->compute = (fw == fw && bw == bw) || fl == fl || ss == ss;
    /* the measured all-reduce times per size, for the profile's worker count */
    const struct dp_json_field *sz = dp_json_get(&o, "sizes");
    double pw = dp_json_num(&o, "workers", 0);
    p->net.tab_n = 0;
    for (int k = 0; sz && sz->type == DP_JSON_ARR && sz->n >= 1 && sz->n <= 64 && pw >= 2 && k < DP_PLAN_ALGO_COUNT; k++) {
        char key[64];
        snprintf(key, sizeof key, "%s_measured_s", dp_plan_algo_name(k));
        const struct dp_json_field *ms = dp_json_get(&o, key);
        p->net.tab_s[k] = NULL;
        if (!ms || ms->type != DP_JSON_ARR || ms->n != sz->n) continue;
        memcpy(pi->sizes, sz->arr, sizeof(double) * (size_t)sz->n);
        memcpy(pi->measured[k], ms->arr, sizeof(double) * (size_t)sz->n);
        p->net.tab_n = (int)sz->n, p->net.tab_workers = (int)pw, p->net.tab_bytes = pi->sizes;
        p->net.tab_s[k] = pi->measured[k];
    }
    double ia = dp_json_num(&o, "intra_alpha_s", NAN), ib = dp_json_num(&o, "intra_beta_s", NAN);
    if (ia == ia) p->net.intra_alpha_s = ia;
    if (ib == ib) p->net.intra_beta_s = ib;
    dp_json_obj_free(&o);
}

static void print_plan_text(const struct dp_plan_params *p, const struct dp_plan_result *r, int buckets,
                            int flops_given) {
    double psi = 0;
    for (int k = 0; k < r->nb; k++) psi += (double)r->b[k].count;
    printf("model %.6g parameters in %d buckets  workers %d  global batch %lld (%.6g per worker)\n", psi, r->nb,
           p->net.workers, (long long)p->batch, (double)p->batch / p->net.workers);
    print_bytes("gradient on the wire per step: ", r->grad_bytes);
    print_bytes("  sent per worker per step: ", r->sent_bytes);
    print_bytes("  all workers per second: ", r->sent_bytes * p->net.workers / r->step_s);
    printf("/s\n");
    printf("step %.6g ms = forward %.6g + backward %.6g + exposed comm %.6g + optimizer %.6g ms", r->step_s * 1e3,
           r->fwd_s * 1e3, r->bwd_s * 1e3, r->exposed_s * 1e3, r->opt_s * 1e3);
    if (r->data_s > 0 || r->zero_s > 0 || r->steal_s > 0 || r->gather_s > 0 || r->straggle_s > 0)
        printf(" + data %.6g + zeroing %.6g + lost to comm %.6g + straggler wait %.6g + metrics gather %.6g ms",
               r->data_s * 1e3, r->zero_s * 1e3, r->steal_s * 1e3, r->straggle_s * 1e3, r->gather_s * 1e3);
    printf("\n");
    printf("communication %.6g ms (%.1f%% hidden behind backward)  efficiency %.4f  %.6g samples/s",
           r->comm_s * 1e3, r->comm_s > 0 ? fmax(0, 100 * (1 - r->exposed_s / r->comm_s)) : 100.0, r->efficiency,
           r->samples_per_s);
    /* the default rate is nobody's measurement: say so beside the figure
     * (a rate given with --flops is the user's own assumption) */
    if (r->compute == DP_PLAN_COMPUTE_FLOPS && !flops_given)
        printf(" (compute: a FLOP estimate at the default %g FLOP/s, not measured)", p->flops);
    printf("\n");
    int count[DP_PLAN_ALGO_COUNT] = {0};
    for (int k = 0; k < r->nb; k++) count[r->b[k].algo]++;
    printf("algorithm per bucket:");
    for (int a = 0; a < DP_PLAN_ALGO_COUNT; a++)
        if (count[a]) printf(" %s x%d", dp_plan_algo_name(a), count[a]);
    printf("\n");
    printf("memory per worker (weights, grads, optimizer):");
    print_bytes(" plain ", r->mem_bytes[0]);
    print_bytes("  zero1 ", r->mem_bytes[1]);
    print_bytes("  zero2 ", r->mem_bytes[2]);
    print_bytes("  zero3 ", r->mem_bytes[3]);
    printf("\n");
    if (r->mem_inflight[2] > 0) { /* whole buckets, held at once on top of that (src/ddp/zero.c) */
        printf("units in flight per worker, on top:");
        print_bytes(" zero2 ", r->mem_inflight[2]);
        print_bytes("  zero3 ", r->mem_inflight[3]);
        printf("  (the largest two adjacent %s)\n", p->unit_bytes ? "ranges of --zero-unit-mb" : "buckets");
    }
    if (!buckets) return;
    printf("bucket  layers    elements      bytes   ready_ms   start_ms    done_ms  algo");
    for (int a = 0; a < DP_PLAN_ALGO_COUNT; a++) printf(" %8s_ms", dp_plan_algo_name(a));
    printf("\n");
    for (int k = 0; k < r->nb; k++) {
        const struct dp_plan_bucket *b = &r->b[k];
        printf("%6d  %3d..%-3d %10lld %10.4g %10.4g %10.4g %10.4g  %-4s", k, b->first_layer,
               b->first_layer + b->nlayers - 1, (long long)b->count, b->bytes, b->ready_s * 1e3, b->start_s * 1e3,
               b->done_s * 1e3, dp_plan_algo_name(b->algo));
        for (int a = 0; a < DP_PLAN_ALGO_COUNT; a++) {
            if (isinf(b->algo_s[a])) printf(" %11s", "-"); /* does not apply (hier without hosts) */
            else printf(" %11.4g", b->algo_s[a] * 1e3);
        }
        printf("\n");
    }
}

static void print_plan_json(const struct dp_plan_params *p, const struct dp_plan_result *r) {
    printf("{\"kind\": \"plan\", \"workers\": %d, \"batch\": %lld, \"step_s\": %.9g, \"fwd_s\": %.9g, "
           "\"bwd_s\": %.9g, \"opt_s\": %.9g, \"comm_s\": %.9g, \"exposed_s\": %.9g, \"efficiency\": %.6f, "
           "\"samples_per_s\": %.9g, \"grad_bytes\": %.9g, \"sent_bytes\": %.9g, \"mem_plain\": %.9g, "
           "\"mem_zero1\": %.9g, \"mem_zero2\": %.9g, \"mem_zero3\": %.9g, \"mem_inflight_zero2\": %.9g, "
           "\"mem_inflight_zero3\": %.9g, \"data_s\": %.9g, \"zero_s\": %.9g, "
           "\"overlap_s\": %.9g, \"steal_s\": %.9g, \"straggle_s\": %.9g, \"gather_s\": %.9g",
           p->net.workers, (long long)p->batch, r->step_s, r->fwd_s, r->bwd_s, r->opt_s, r->comm_s, r->exposed_s,
           r->efficiency, r->samples_per_s, r->grad_bytes, r->sent_bytes, r->mem_bytes[0], r->mem_bytes[1],
           r->mem_bytes[2], r->mem_bytes[3], r->mem_inflight[2], r->mem_inflight[3], r->data_s, r->zero_s, r->overlap_s, r->steal_s, r->straggle_s, r->gather_s);
    const char *keys[] = {"bucket_bytes", "bucket_ready_s", "bucket_start_s", "bucket_done_s"};
    for (int f = 0; f < 4; f++) {
        printf(", \"%s\": [", keys[f]);
        for (int k = 0; k < r->nb; k++) {
            const struct dp_plan_bucket *b = &r->b[k];
            double v = f == 0 ? b->bytes : f == 1 ? b->ready_s : f == 2 ? b->start_s : b->done_s;
            printf("%s%.9g", k ? ", " : "", v);
        }
        printf("]");
    }
    printf(", \"bucket_algo\": [");
    for (int k = 0; k < r->nb; k++) printf("%s%d", k ? ", " : "", r->b[k].algo);
    printf("]}\n");
}

/* ---- splitting the model ------------------------------------------------------------------ */

/* One candidate layout's predicted step and its terms, for --layout auto's table. */
struct layout {
    int dp, pp, tp, micro, zero;
    double step_s, compute_s, bubble, p2p_s, tp_s, comm_s, mem;
};

static int layout_cmp(const void *a, const void *b) {
    const struct layout *x = a, *y = b;
    return x->step_s < y->step_s ? -1 : x->step_s > y->step_s;
}

static void print_pipe(const struct dp_plan_params *p, const struct dp_plan_pipe *r, int schedule, int zero,
                       char *const *names, int estimate, int json) {
    double comp = 0;
    for (int s = 0; s < r->stages; s++) comp += r->f_s[s] + r->b_s[s];
    if (json) {
        printf("{\"kind\": \"plan_pipeline\", \"workers\": %d, \"stages\": %d, \"replicas\": %d, \"tensor\": %d, "
               "\"micro_batches\": %d, \"schedule\": \"%s\", \"zero\": %d, \"step_s\": %.9g, \"samples_per_s\": %.9g, "
               "\"pipe_s\": %.9g, \"bubble\": %.6f, \"p2p_s\": %.9g, \"tp_s\": %.9g, \"comm_s\": %.9g, \"exposed_s\": %.9g, "
               "\"opt_s\": %.9g, \"tie_s\": %.9g, \"stage_first\": [",
               p->net.workers, r->stages, r->replicas, r->tensor, r->micro, dp_pipe_schedule_name(schedule), zero,
               r->step_s, r->samples_per_s, r->pipe_s, r->bubble, r->p2p_s, r->tp_s, r->comm_s, r->exposed_s, r->opt_s,
               r->tie_s);
        for (int s = 0; s <= r->stages; s++) printf("%s%d", s ? ", " : "", r->first[s]);
        printf("], \"stage_mem_bytes\": [");
        for (int s = 0; s < r->stages; s++) printf("%s%.6g", s ? ", " : "", r->mem_bytes[s]);
        printf("], \"stage_act_bytes\": [");
        for (int s = 0; s < r->stages; s++) printf("%s%.6g", s ? ", " : "", r->act_bytes[s]);
        /* the planned schedule, op by op (dptrain plot draws it: pipeline.svg) */
        struct dp_plan_span *sp;
        int n = dp_plan_pipe_spans(r, schedule, &sp);
        if (n < 0) die("%s", dp_errmsg());
        static const char *const keys[4] = {"span_stage", "span_backward", "span_t0_s", "span_t1_s"};
        for (int k = 0; k < 4; k++) {
            printf("], \"%s\": [", keys[k]);
            for (int i = 0; i < n; i++)
                printf("%s%.9g", i ? ", " : "", k == 0 ? sp[i].stage : k == 1 ? sp[i].backward : k == 2 ? sp[i].t0 : sp[i].t1);
        }
        printf("]}\n");
        dp_free(sp);
        return;
    }
    char groups[64] = "";
    if (r->tensor > 1) snprintf(groups, sizeof groups, " of %d-way tensor groups", r->tensor);
    printf("pipeline %d stage%s x %d replica%s%s, %d micro-batch%s of %.4g samples, %s, ZeRO %d\n", r->stages,
           r->stages > 1 ? "s" : "", r->replicas, r->replicas > 1 ? "s" : "", groups, r->micro, r->micro > 1 ? "es" : "",
           (double)p->batch / ((double)r->replicas * r->micro), dp_pipe_schedule_name(schedule), zero);
    for (int s = 0; s < r->stages; s++) {
        int a = r->first[s], b = r->first[s + 1];
        printf("  stage %d %s%s%s: per micro-batch forward %.4g + backward %.4g ms", s, names[a], b - a > 1 ? ".." : "",
               b - a > 1 ? names[b - 1] : "", r->f_s[s] * 1e3, r->b_s[s] * 1e3);
        print_bytes(", per worker ", r->mem_bytes[s]);
        print_bytes(" (activations ", r->act_bytes[s]);
        printf(")\n");
    }
    printf("step %.6g ms = micro-batches %.6g (bubble %.1f%%, boundary message %.4g ms", r->step_s * 1e3,
           r->pipe_s * 1e3, 100 * r->bubble, r->p2p_s * 1e3);
    if (r->tensor > 1) printf(", the bottleneck stage's tensor all-reduces %.4g ms a micro-batch", r->tp_s * 1e3);
    printf(") + reduction left %.4g + optimizer %.4g + tie %.4g ms\n", r->exposed_s * 1e3, r->opt_s * 1e3,
           r->tie_s * 1e3);
    printf("throughput %.6g samples/s; compute %.6g ms over the stages", r->samples_per_s, comp * r->micro * 1e3);
    if (estimate) printf(" (compute: a FLOP estimate at the default %g FLOP/s, not measured)", p->flops);
    printf("\n");
}

/* --layout auto: every (dp, pp, tp, micro, zero) of the P workers, those that fit, by step time
 * (tp_ok[T]: the model splits T ways). */
static void plan_layouts(struct dp_plan_params *p, const char *tp_ok, double *const *tla, double *const *tls,
                         double act_total, double mem_limit, int schedule, int estimate, int json) {
    int P = p->net.workers, n = 0, cap = 256;
    struct layout *ls = malloc(sizeof *ls * (size_t)cap);
    if (!ls) die("out of memory");
    for (int S = 1; S <= P && S <= p->nlayers; S++)
        for (int T = 1; T <= P / S; T++) {
        if (P % (S * T) || (T > 1 && !tp_ok[T])) continue;
        int R = P / (S * T), W = P / S;
        for (int M = S == 1 ? 1 : S; M <= (S == 1 ? 1 : 16 * S); M *= 2)
            for (int z = 0; z <= (S == 1 && T == 1 ? 3 : 1); z++) {
                if ((z > 0 && W < 2) || p->batch < (int64_t)R * M) continue;
                struct layout l = {.dp = R, .pp = S, .tp = T, .micro = M, .zero = z};
                if (S == 1 && T == 1) {
                    struct dp_plan_params q = *p;
                    q.net.workers = R;
                    struct dp_plan_result r;
                    if (dp_plan_run(&q, &r)) die("%s", dp_errmsg());
                    l.step_s = r.step_s, l.compute_s = r.fwd_s + r.bwd_s, l.comm_s = r.exposed_s;
                    l.mem = r.mem_bytes[z] + r.mem_inflight[z] + (double)p->batch / R * act_total;
                    dp_plan_result_free(&r);
                } else {
                    struct dp_plan_pipe r;
                    p->layer_act = tla[T], p->layer_scratch = tls[T]; /* (a tensor rank's, measured) */
                    if (dp_plan_layout(p, S, T, M, schedule, z, &r)) die("%s", dp_errmsg());
                    l.step_s = r.step_s, l.bubble = r.bubble, l.p2p_s = r.p2p_s, l.comm_s = r.exposed_s;
                    l.tp_s = r.tp_s * M;
                    for (int s = 0; s < S; s++) {
                        l.compute_s += (r.f_s[s] + r.b_s[s]) * M;
                        if (r.mem_bytes[s] > l.mem) l.mem = r.mem_bytes[s];
                    }
                    dp_plan_pipe_free(&r);
                }
                if (mem_limit > 0 && l.mem > mem_limit) continue;
                if (n == cap && !(ls = realloc(ls, sizeof *ls * (size_t)(cap *= 2)))) die("out of memory");
                ls[n++] = l;
            }
        }
    if (!n) die("no layout of %d workers fits %.4g bytes per worker (--memory-per-worker)", P, mem_limit);
    qsort(ls, (size_t)n, sizeof *ls, layout_cmp);
    if (!json && estimate)
        printf("(compute: a FLOP estimate at the default %g FLOP/s, not measured: --profile from calibrate --model)\n",
               p->flops);
    if (!json)
        printf("%4s %4s %4s %6s %4s %11s %12s %11s %8s %10s %10s %10s %12s\n", "dp", "pp", "tp", "micro", "zero",
               "step_ms", "samples_s", "compute_ms", "bubble", "p2p_ms", "tp_ms", "comm_ms", "memory");
    for (int i = 0; i < n; i++) {
        const struct layout *l = &ls[i];
        if (json) printf("{\"kind\": \"plan_layout\", \"rank\": %d, \"dp\": %d, \"pp\": %d, \"tp\": %d, "
                         "\"micro_batches\": %d, \"zero\": %d, \"step_s\": %.9g, \"samples_per_s\": %.9g, "
                         "\"compute_s\": %.9g, \"bubble\": %.6f, \"p2p_s\": %.9g, \"tp_s\": %.9g, \"comm_s\": %.9g, "
                         "\"mem_bytes\": %.6g}\n",
                         i + 1, l->dp, l->pp, l->tp, l->micro, l->zero, l->step_s, (double)p->batch / l->step_s,
                         l->compute_s, l->bubble, l->p2p_s, l->tp_s, l->comm_s, l->mem);
        else {
            printf("%4d %4d %4d %6d %4d %11.5g %12.6g %11.5g %7.1f%% %10.4g %10.4g %10.4g ", l->dp, l->pp, l->tp, l->micro,
                   l->zero, l->step_s * 1e3, (double)p->batch / l->step_s, l->compute_s * 1e3, 100 * l->bubble,
                   l->p2p_s * 1e3, l->tp_s * 1e3, l->comm_s * 1e3);
            print_bytes("", l->mem);
            printf("\n");
        }
    }
    free(ls);
}

int dptrain_cmd_plan(int argc, char **argv) {
    struct dp_plan_params p = dp_plan_default_params();
    p.nlayers = 24;
    p.net.intra_beta_s = 8 / 800e9;
    double gbps = 100, lat_us = 5;
    int gbps_given = 0, lat_given = 0, batch_given = 0, buckets = 0, json = 0, sgd = 0, state_given = 0;
    int compute_given = 0, profile_given = 0; /* --flops or --sample-ms; --profile */
    struct profile_info pi = {.sgd_param_s = NAN, .adamw_param_s = NAN};
    long long sweep = 0;
    int pp = 0, tp = 0, micro = 0, schedule = DP_PIPE_1F1B, zero = 0, layout = 0, nat = 0;
    const char *at[8];
    double cal_b[9], cal_f[9], cal_bw[9];
    double mem_limit = 0;
    const char *model = NULL, *input = "1,28,28", *v;
    struct dptrain_fail_opts fo;
    dptrain_fail_defaults(&fo);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(help_plan, stdout);
            fputs(dptrain_fail_help, stdout);
            return 0;
        }
        if (dptrain_take(argc, argv, &i, "--params", &v)) p.params = (int64_t)dptrain_num_arg(a, v, 1, 1e15);
        else if (dptrain_take(argc, argv, &i, "--layers", &v)) p.nlayers = (int)dptrain_int_arg(a, v, 1, 1000000);
        else if (dptrain_take(argc, argv, &i, "--model", &v)) model = v;
        else if (dptrain_take(argc, argv, &i, "--input", &v)) input = v;
        else if (dptrain_take(argc, argv, &i, "--tokens", &v)) p.tokens = dptrain_num_arg(a, v, 1, 1e9);
        else if (dptrain_take(argc, argv, &i, "--batch", &v)) p.batch = dptrain_int_arg(a, v, 1, 1LL << 40), batch_given = 1;
        else if (dptrain_take(argc, argv, &i, "--dtype", &v)) {
            if (!strcmp(v, "fp32")) p.bytes_per_elem = 4;
            else if (!strcmp(v, "bf16")) p.bytes_per_elem = 2;
            else die("--dtype: '%s' (expected fp32 or bf16)", v);
        } else if (dptrain_take(argc, argv, &i, "--compress", &v)) p.compress = dptrain_num_arg(a, v, 1, 1e6);
        else if (dptrain_take(argc, argv, &i, "--opt-state-bytes", &v))
            p.opt_state_bytes = dptrain_num_arg(a, v, 0, 64), state_given = 1;
        else if (dptrain_take(argc, argv, &i, "--optim", &v)) {
            if (!strcmp(v, "sgd")) sgd = 1;
            else if (!strcmp(v, "adamw")) sgd = 0;
            else die("--optim: '%s' (expected sgd or adamw)", v);
        } else if (dptrain_take(argc, argv, &i, "--comm-cpu", &v)) p.comm_cpu = dptrain_num_arg(a, v, 0, 1);
        else if (dptrain_take(argc, argv, &i, "--compute-cv", &v))
            p.compute_cv = dptrain_num_arg(a, v, 0, 10), p.straggle_workers = 0; /* e_P x F at every P */
        else if (dptrain_take(argc, argv, &i, "--opt-ms", &v)) p.opt_s = dptrain_num_arg(a, v, 0, 1e9) / 1e3;
        else if (dptrain_take(argc, argv, &i, "--flops", &v))
            p.flops = dptrain_num_arg(a, v, 1, 1e20), p.sample_s = 0, compute_given = 1;
        else if (dptrain_take(argc, argv, &i, "--sample-ms", &v))
            p.sample_s = dptrain_num_arg(a, v, 1e-9, 1e9) / 1e3, compute_given = 1;
        else if (dptrain_take(argc, argv, &i, "--workers", &v)) p.net.workers = (int)dptrain_int_arg(a, v, 1, 100000000);
        else if (dptrain_take(argc, argv, &i, "--link-gbps", &v)) gbps = dptrain_num_arg(a, v, 1e-6, 1e9), gbps_given = 1;
        else if (dptrain_take(argc, argv, &i, "--latency-us", &v)) lat_us = dptrain_num_arg(a, v, 0, 1e9), lat_given = 1;
        else if (dptrain_take(argc, argv, &i, "--reduce-gbs", &v)) {
            double g = dptrain_num_arg(a, v, 0, 1e9);
            p.net.gamma_s = g > 0 ? 1 / (g * 1e9) : 0;
        } else if (dptrain_take(argc, argv, &i, "--per-host", &v)) p.net.per_host = (int)dptrain_int_arg(a, v, 0, 1000000);
        else if (dptrain_take(argc, argv, &i, "--intra-gbps", &v)) p.net.intra_beta_s = 8 / (dptrain_num_arg(a, v, 1e-6, 1e9) * 1e9);
        else if (dptrain_take(argc, argv, &i, "--intra-latency-us", &v)) p.net.intra_alpha_s = dptrain_num_arg(a, v, 0, 1e9) / 1e6;
        else if (dptrain_take(argc, argv, &i, "--intra-profile", &v)) load_intra_profile(v, &p);
        else if (dptrain_take(argc, argv, &i, "--shards", &v)) p.net.shards = (int)dptrain_int_arg(a, v, 1, 1000000);
        else if (dptrain_take(argc, argv, &i, "--algo", &v)) {
            if (dp_plan_algo_parse(v, &p.algo)) die("--algo: %s", dp_errmsg());
        } else if (dptrain_take(argc, argv, &i, "--bucket-mb", &v)) p.bucket_cap_bytes = (size_t)(dptrain_num_arg(a, v, 0, 1e6) * (1 << 20));
        else if (dptrain_take(argc, argv, &i, "--zero-unit-mb", &v))
            p.unit_bytes = (size_t)(dptrain_num_arg(a, v, 1e-5, 1e5) * (1 << 20));
        else if (dptrain_take(argc, argv, &i, "--first-bucket-mb", &v))
            p.first_bucket_bytes = (size_t)(dptrain_num_arg(a, v, 1e-5, 1e6) * (1 << 20));
        else if (!strcmp(a, "--no-overlap")) p.overlap = 0;
        else if (!strcmp(a, "--metrics")) p.gathers = 1;
        else if (dptrain_take(argc, argv, &i, "--profile", &v)) {
            load_profile(v, &p, &pi);
            profile_given = 1;
            gbps_given = lat_given = 0; /* the profile's link, unless given again after it */
        } else if (!strcmp(a, "--buckets")) buckets = 1;
        else if (dptrain_take(argc, argv, &i, "--profile-at", &v)) {
            if (nat == 8) die("--profile-at: at most 8 profiles");
            at[nat++] = v;
        } else if (dptrain_take(argc, argv, &i, "--pp", &v)) pp = (int)dptrain_int_arg(a, v, 1, 65536);
        else if (dptrain_take(argc, argv, &i, "--tp", &v)) tp = (int)dptrain_int_arg(a, v, 1, 65536);
        else if (dptrain_take(argc, argv, &i, "--micro-batches", &v)) micro = (int)dptrain_int_arg(a, v, 1, 65536);
        else if (dptrain_take(argc, argv, &i, "--pp-schedule", &v)) {
            if ((schedule = dp_pipe_schedule_parse(v)) < 0) die("--pp-schedule: '%s' (expected gpipe or 1f1b)", v);
        } else if (dptrain_take(argc, argv, &i, "--zero", &v)) zero = (int)dptrain_int_arg(a, v, 0, 3);
        else if (dptrain_take(argc, argv, &i, "--layout", &v)) {
            if (strcmp(v, "auto")) die("--layout: '%s' (expected auto)", v);
            layout = 1;
        } else if (dptrain_take(argc, argv, &i, "--memory-per-worker", &v)) {
            char *end;
            mem_limit = strtod(v, &end);
            double u = !strcmp(end, "K") ? 1e3 : !strcmp(end, "M") ? 1e6 : !strcmp(end, "G") ? 1e9 : !*end ? 1 : 0;
            if (!(mem_limit > 0) || u == 0) die("--memory-per-worker: '%s' (expected bytes, with K, M or G)", v);
            mem_limit *= u;
        }

        else if (dptrain_take(argc, argv, &i, "--sweep", &v)) sweep = dptrain_int_arg(a, v, 1, 100000000);
        else if (!strcmp(a, "--json")) json = 1;
        else if (dptrain_fail_take(argc, argv, &i, &fo)) continue;
        else die("unknown option '%s' (see 'dptrain plan --help')", a);
        /* a link given on the command line applies to every algorithm */
        if (gbps_given || lat_given) {
            p.net.tab_n = 0; /* and not the profile's measured times */
            for (int k = 0; k < DP_PLAN_ALGO_COUNT; k++) {
                if (gbps_given) p.net.beta_s[k] = 8 / (gbps * 1e9);
                if (lat_given) p.net.alpha_s[k] = lat_us / 1e6;
            }
        }
    }
    if (!model && !p.params) die("give --params N or --model SPEC (see 'dptrain plan --help')");
    if (fo.given && sweep) die("--sweep and the failure options exclude each other: plan one worker count");
    if (model && p.params) die("--params and --model exclude each other");
    if (p.algo == DP_PLAN_HIER && p.net.per_host < 2) die("--algo hier needs --per-host G (G >= 2)");
    if (!batch_given) p.batch = 32LL * p.net.workers;
    if (!state_given) p.opt_state_bytes = sgd ? 4 : 8;
    double opp = sgd ? pi.sgd_param_s : pi.adamw_param_s;
    if (opp == opp) p.opt_param_s = opp;
    /* a profile's compute terms belong to the model it was calibrated on */
    if (pi.model[0] && (!model || strcmp(model, pi.model)))
        die("%s was calibrated for --model %s: plan that model, or calibrate again with --model %s", pi.path,
            pi.model, model ? model : "SPEC");
    /* A profile from calibrate without --model measures the link only.  Its
     * plan of a model would price the compute from FLOPs at --flops' rate
     * (a peak, 1e12 unless given): cnn at 77,085 samples/s where the run
     * measures about 5,800, with nothing to say the figure is no
     * measurement.  Who passes a profile wants measured figures: refuse,
     * and name the command that measures the model (or the options that
     * state the compute on purpose). */
    if (profile_given && model && !pi.compute && !compute_given)
        die("%s has no measured compute for --model %s (calibrated without --model): the plan would price it from "
            "FLOPs at %g FLOP/s, an estimate; run 'dptrain calibrate --model %s --out %s' (at the run's --workers and "
            "--batch), or give --sample-ms MS or --flops F",
            pi.path, model, p.flops, model, pi.path);
    if (nat) { /* the compute at other sizes: this profile's point and theirs, by samples per worker */
        if (!profile_given || p.fwd_sample_s <= 0)
            die("--profile-at needs --profile of calibrate --model (the compute at the run's own size)");
        cal_b[0] = (double)pi.batch / pi.workers, cal_f[0] = p.fwd_sample_s, cal_bw[0] = p.bwd_sample_s;
        for (int k = 0; k < nat; k++) {
            struct dp_plan_params q = dp_plan_default_params();
            struct profile_info qi = {.sgd_param_s = NAN, .adamw_param_s = NAN};
            load_profile(at[k], &q, &qi);
            if (strcmp(qi.model, pi.model) || q.fwd_sample_s <= 0 || qi.batch < 1 || qi.workers < 1)
                die("%s: --profile-at needs a profile of calibrate --model %s (it has %s)", at[k], pi.model,
                    qi.model[0] ? qi.model : "no model");
            cal_b[k + 1] = (double)qi.batch / qi.workers, cal_f[k + 1] = q.fwd_sample_s, cal_bw[k + 1] = q.bwd_sample_s;
        }
        for (int a = 1; a <= nat; a++) /* (insertion sort by size; equal sizes: the later one) */
            for (int b = a; b > 0 && cal_b[b - 1] >= cal_b[b]; b--) {
                double t;
                t = cal_b[b], cal_b[b] = cal_b[b - 1], cal_b[b - 1] = t;
                t = cal_f[b], cal_f[b] = cal_f[b - 1], cal_f[b - 1] = t;
                t = cal_bw[b], cal_bw[b] = cal_bw[b - 1], cal_bw[b - 1] = t;
            }
        p.cal_n = nat + 1, p.cal_batch = cal_b, p.cal_fwd = cal_f, p.cal_bwd = cal_bw;
    }
    if ((pp || tp || layout || micro) && !model)
        die("--pp, --tp, --micro-batches and --layout need --model (the layers to split)");
    if ((pp || tp || layout) && (sweep || fo.given))
        die("--pp, --tp and --layout plan one worker count: not with --sweep or the failure options");
    if ((pp || tp) && layout) die("--pp and --tp exclude --layout auto (the layout chooses the stages and groups)");
    if (tp && zero > 1) die("--zero %d with --tp: tensor groups take ZeRO 0 or 1 (docs/parallel.md)", zero);
    if (tp > 1 && (tp > p.net.workers || p.net.workers % (tp * (pp ? pp : 1))))
        die("plan: --tp %d%s does not divide --workers %d", tp, pp ? " x --pp" : "", p.net.workers);
    if (micro && !pp) die("--micro-batches is --pp's option");
    if (pp && zero > 1) die("--zero %d with --pp: a pipeline's stages take ZeRO 0 or 1 (docs/parallel.md)", zero);
    int64_t *lp = NULL, *lranges = NULL;
    int *lnr = NULL;
    double *lf = NULL, *lo = NULL, *la = NULL, *lsc = NULL, *ltc = NULL, *ltf = NULL;
    char **names = NULL, *tp_ok = NULL;
    double **tla = NULL, **tls = NULL; /* (per T: a tensor rank's activations and scratch per layer) */
    if (model) {

        long long c = 1, h = 28, w = 28;
        if (sscanf(input, "%lld,%lld,%lld", &c, &h, &w) != 3 || c < 1 || h < 1 || w < 1)
            die("--input: '%s' is not C,H,W", input);
        struct dp_model *m;
        if (dp_model_from_spec(&m, model, c, h, w)) die("--model %s: %s", model, dp_errmsg());
        lp = malloc(sizeof *lp * (size_t)m->nlayers);
        lf = malloc(sizeof *lf * (size_t)m->nlayers);
        if (!lp || !lf) die("out of memory");
        for (int i = 0; i < m->nlayers; i++) lp[i] = m->layers[i]->param_count, lf[i] = (double)m->layers[i]->flops_fwd;
        p.layers = lp, p.layer_flops = lf, p.nlayers = m->nlayers;
        if (p.unit_bytes) { /* --zero-unit-mb's ranges, as the reducer cuts them */
            dp_model_set_unit(m, p.unit_bytes);
            int total = 0;
            for (int i = 0; i < m->nlayers; i++) total += dp_layer_ranges(m->layers[i], NULL, NULL, 0);
            if (!(lnr = calloc((size_t)m->nlayers, sizeof *lnr)) || !(lranges = malloc(sizeof *lranges * (size_t)(total + 1))))
                die("out of memory");
            for (int i = 0, k = 0; i < m->nlayers; i++) {
                const struct dp_layer *l = m->layers[i];
                if (l->slice_rows > 0 || l->parts) k += lnr[i] = dp_layer_ranges(l, NULL, lranges + k, total - k);
            }
            p.unit_nranges = lnr, p.unit_ranges = lranges;
        }
        if (pp || tp || layout) { /* the boundary messages, the activations, the tied embedding, the groups */
            lo = malloc(sizeof *lo * (size_t)m->nlayers), la = malloc(sizeof *la * (size_t)m->nlayers);
            lsc = malloc(sizeof *lsc * (size_t)m->nlayers);
            ltc = malloc(sizeof *ltc * (size_t)m->nlayers), ltf = malloc(sizeof *ltf * (size_t)m->nlayers);
            names = calloc((size_t)m->nlayers, sizeof *names);
            tp_ok = calloc((size_t)p.net.workers + 1, 1);
            tla = calloc((size_t)p.net.workers + 1, sizeof *tla), tls = calloc((size_t)p.net.workers + 1, sizeof *tls);
            if (!lo || !la || !lsc || !ltc || !ltf || !names || !tp_ok || !tla || !tls) die("out of memory");
            for (int T = 2; T <= p.net.workers; T++) {
                if (p.net.workers % T || dp_model_tp_check(m, T) || (tp && T != tp)) continue;
                tp_ok[T] = 1;
                double *o = malloc(sizeof *o * (size_t)m->nlayers);
                tla[T] = malloc(sizeof(double) * (size_t)m->nlayers), tls[T] = malloc(sizeof(double) * (size_t)m->nlayers);
                if (!o || !tla[T] || !tls[T]) die("out of memory");
                if (dp_model_layer_bytes_tp(m, T, o, tla[T], tls[T])) die("plan: --model %s: %s", model, dp_errmsg());
                free(o);
            }
            if (tp > 1 && dp_model_tp_check(m, tp)) die("plan: %s", dp_errmsg());
            dp_model_tp_traffic(m, tp > 1 ? tp : 2, ltc, ltf);
            p.layer_tp_calls = ltc, p.layer_tp_floats = ltf;
            if (dp_model_layer_bytes(m, lo, la, lsc)) die("plan: --model %s: %s", model, dp_errmsg());
            tla[1] = la, tls[1] = lsc;
            for (int i = 0; i < m->nlayers; i++)
                if (!(names[i] = strdup(m->layers[i]->name))) die("out of memory");
            for (int i = 0; i < m->nlayers; i++)
                if (m->layers[i]->tied_count) p.tie_bytes = 4.0 * (double)m->layers[i]->tied_count;
            p.layer_out = lo, p.layer_act = la, p.layer_scratch = lsc;
        }
        dp_model_free(m);
    }
    if (pp || tp || layout) {
        if (layout) {
            double act = 0, most = 0; /* (a replica's: every layer's saved, one layer's scratch at a time) */
            for (int i = 0; i < p.nlayers; i++) act += la[i], most = lsc[i] > most ? lsc[i] : most;
            act += most;
            plan_layouts(&p, tp_ok, tla, tls, act, mem_limit, schedule,
                         !compute_given && !pi.compute && p.fwd_sample_s <= 0 && p.sample_s <= 0, json);
        } else {
            struct dp_plan_pipe r;
            const int S = pp ? pp : 1, T = tp ? tp : 1;
            p.layer_act = tla[T], p.layer_scratch = tls[T];
            if (dp_plan_layout(&p, S, T, micro ? micro : S, schedule, zero, &r)) die("%s", dp_errmsg());
            print_pipe(&p, &r, schedule, zero, names, !compute_given && !pi.compute && p.fwd_sample_s <= 0 && p.sample_s <= 0,
                       json);
            dp_plan_pipe_free(&r);
        }
        for (int i = 0; i < p.nlayers; i++) free(names[i]);
        for (int T = 2; tla && T <= p.net.workers; T++) free(tla[T]), free(tls[T]);
        free(names), free(lo), free(la), free(lsc), free(ltc), free(ltf), free(tp_ok), free(tla), free(tls), free(lp), free(lf), free(lranges), free(lnr);
        return 0;
    }

    struct dp_plan_result r;
    if (!sweep) {
        if (dp_plan_run(&p, &r)) {
            free(lp), free(lf), free(lranges), free(lnr);
            die("%s", dp_errmsg());
        }
        if (json) print_plan_json(&p, &r);
        else print_plan_text(&p, &r, buckets, compute_given || pi.compute);
        double step_s = r.step_s;
        dp_plan_result_free(&r);
        if (fo.given) dptrain_fail_plan(&fo, p.net.workers, step_s, json); /* (lines of their own after --json's) */
    } else {
        if (!json) printf("%8s %12s %12s %12s %12s %14s %10s\n", "workers", "compute_ms", "comm_ms", "exposed_ms",
                          "step_ms", "samples_s", "eff");
        long long cross = 0;
        for (long long P = 1; P <= sweep; P *= 2) {
            p.net.workers = (int)P;
            if (p.net.per_host > 1 && P % p.net.per_host) continue;
            if (p.batch < P) break;
            if (dp_plan_run(&p, &r)) {
                free(lp), free(lf), free(lranges), free(lnr);
                die("%s", dp_errmsg());
            }
            double comp = r.fwd_s + r.bwd_s;
            if (!cross && r.comm_s > comp) cross = P;
            if (json) printf("{\"kind\": \"plan_sweep\", \"workers\": %lld, \"compute_s\": %.9g, \"comm_s\": %.9g, "
                             "\"exposed_s\": %.9g, \"step_s\": %.9g, \"samples_per_s\": %.9g, \"efficiency\": %.6f}\n",
                             P, comp, r.comm_s, r.exposed_s, r.step_s, r.samples_per_s, r.efficiency);
            else printf("%8lld %12.5g %12.5g %12.5g %12.5g %14.6g %10.4f\n", P, comp * 1e3, r.comm_s * 1e3,
                        r.exposed_s * 1e3, r.step_s * 1e3, r.samples_per_s, r.efficiency);
            dp_plan_result_free(&r);
        }
        if (!json) {
            if (cross) printf("communication exceeds compute from %lld workers on\n", cross);
            else printf("communication stays under compute up to %lld workers\n", sweep);
        }
    }
    free(lp), free(lranges), free(lnr);
    free(lf);
    return 0;
}

