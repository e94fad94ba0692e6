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
#include <stdio.h>

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

/* ---- failures at scale (src/plan/failures.c) ------------------------------------------ */

/* The random stream of the failure times (a = trial, b = failure number). */
#define DP_RNG_FAIL 18

struct dp_fail_params {
    int workers;            /* P >= 1: the job fails when any worker does */
    int64_t steps;          /* K: steps the job must complete */
    double step_s;          /* one step without failures (dp_sim_run's or dp_plan_run's) */
    double mtbf_worker_s;   /* a worker's mean time between failures (exponential) */
    double recovery_s;      /* R: from a failure to the first step after relaunch */
    int64_t snapshot_every; /* N: steps between snapshots (0: none, a failure restarts the job) */
    double snapshot_s;      /* C: what a snapshot costs the step (the copy, or the whole write with --ckpt-sync) */
    double write_s;         /* from the copy to a durable file (the background write); 0: at once */
    int trials;             /* runs of the job averaged */
    uint64_t seed;
};
struct dp_fail_params dp_fail_default_params(void);

struct dp_fail_result {
    double mtbf_job_s;      /* M = mtbf_worker_s / P */
    double time_s;          /* mean wall time to finish the job */
    double goodput;         /* K step_s / time_s: the useful fraction of worker-time */
    double daly_goodput;    /* Daly's expected goodput for the same parameters (NAN where write_s > 0) */
    double failures;        /* mean failures per job (those during recovery included) */
    double snapshots;       /* mean snapshots per job */
    double steps_lost;      /* mean steps redone per job */
    double steps_lost_mean; /* per failure */
    double steps_lost_max;  /* the most any failure lost, over all trials */
    /* where the time beyond K step_s went, means per job; they sum with K step_s to time_s */
    double snapshot_s, recovery_s, lost_s;
};

/* Simulates `trials` jobs (failures.c has the model).  0 or DP_EINVAL (a bad
 * parameter, or a job that would never finish, with a message).  A pure
 * function of the parameters. */
int dp_fail_run(const struct dp_fail_params *p, struct dp_fail_result *r);
double dp_fail_job_mtbf_s(const struct dp_fail_params *p);
/* Young's interval of work between snapshots, sqrt(2 C M). */
double dp_fail_young_daly_s(double snapshot_s, double mtbf_s);
/* Daly's expected goodput with tau seconds of work between snapshots of cost
 * C, recovery R and job MTBF M: tau / (M e^(R/M) (e^((tau+C)/M) - 1)). */
double dp_fail_daly_goodput(double tau_s, double snapshot_s, double recovery_s, double mtbf_s);

/* ---- the analytic cost model (DESIGN §4) ------------------------------------------ */

/* Collective algorithms as the model knows them, n bytes, p workers, α s per
 * message, β s per byte, γ s per byte reduced:
 *   ring  2(p-1)α + 2(p-1)/p nβ + (p-1)/p nγ             (bandwidth-optimal)
 *   rhd   2 log2(p')α + 2(p'-1)/p' nβ + (p'-1)/p' nγ,     p' = 2^floor(log2 p),
 *         + 2(α + nβ) + nγ when p is not a power of two   (Rabenseifner with a fold)
 *   tree  2 ceil(log2 p)(α + nβ) + ceil(log2 p) nγ       (binary tree reduce + broadcast)
 *   hier  g workers per host, H = p/g hosts: reduce-scatter inside the host
 *         (g-1)(α' + n/g β') + (g-1)/g nγ, ring all-reduce of n/g between hosts,
 *         all-gather inside the host (g-1)(α' + n/g β')   (α', β': the intra-host link)
 *   ps    S shards on their own hosts: each worker pushes and pulls n, each shard
 *         receives and sends p n/S in p/S messages each way, whose per-message
 *         costs queue at the shard: 2 max(1, p/S)α + max(2n, 2pn/S)β + (pn/S)γ
 */
enum dp_plan_algo { DP_PLAN_RING = 0, DP_PLAN_RHD, DP_PLAN_TREE, DP_PLAN_HIER, DP_PLAN_PS, DP_PLAN_ALGO_COUNT };
const char *dp_plan_algo_name(int algo);
/* Sets *algo to the algorithm's index, or -1 for "best" (per bucket);
 * returns 0 or DP_EINVAL. */
int dp_plan_algo_parse(const char *name, int *algo);

struct dp_plan_net {
    int workers;                          /* p >= 1 */
    int per_host;                         /* hier: g workers per host (p a multiple of g); 0 or 1: hier unavailable */
    int shards;                           /* ps: S >= 1 */
    double alpha_s[DP_PLAN_ALGO_COUNT];   /* per message, per algorithm (hier, ps: between hosts) */
    double beta_s[DP_PLAN_ALGO_COUNT];    /* per byte, per algorithm */
    double intra_alpha_s, intra_beta_s;   /* hier: inside a host */
    double gamma_s;                       /* per byte reduced (0: free) */
    /* Measured all-reduce times (dptrain calibrate's per-size medians) for
     * tab_workers workers: where p == tab_workers, an algorithm with a table
     * is timed from it instead of its formula: linear interpolation between
     * the two sizes around n; below the smallest, its time (the latency
     * floor); above the largest, the last two points' slope carried on.  A
     * single α-β line fits badly where the link changes regime with the size
     * (a shaped link's burst, the caches of a shared-memory copy). */
    int tab_n, tab_workers;
    const double *tab_bytes;                  /* (tab_n) ascending */
    const double *tab_s[DP_PLAN_ALGO_COUNT];  /* (tab_n) each, or NULL: the formula */
};
/* Fills every algorithm with one link: latency_s and bytes_per_s. */
void dp_plan_net_link(struct dp_plan_net *n, double latency_s, double bytes_per_s);
/* Time of one all-reduce of `bytes` bytes by algo (from the table when it
 * has one for p); INFINITY where the algo does not apply (hier without
 * per_host >= 2 dividing p). */
double dp_plan_allreduce_s(int algo, double bytes, const struct dp_plan_net *n);
/* Bytes one worker sends in that all-reduce (the busiest worker for tree). */
double dp_plan_sent_bytes(int algo, double bytes, const struct dp_plan_net *n);

/* One bucket of the reducer, as the model plans and times it. */
struct dp_plan_bucket {
    int64_t off, count;       /* range of the gradient slab in elements, as dp_reducer plans it */
    int first_layer, nlayers; /* its layers: first_layer .. first_layer + nlayers - 1 */
    double bytes;             /* on the wire: count x bytes_per_elem / compress */
    double ready_s, start_s, done_s; /* from the step's start */
    int algo;                 /* the algorithm used (the fastest, unless forced) */
    double algo_s[DP_PLAN_ALGO_COUNT];
};

/* The reducer's bucket cap for a model of num_params floats when asked for
 * 0 (auto): a quarter of the gradient, clamped to [1 MiB, 25 MiB] (the rule
 * in dp_reducer_init, src/ddp/reducer.c). */
size_t dp_plan_auto_cap(int64_t num_params);
/* Plans buckets exactly as dp_reducer does: from the last layer backwards, a
 * bucket closes when the next layer would push it past its cap (the first
 * bucket's cap is first_bytes; a layer larger than the cap gets its own).
 * layers[i] = parameter floats of top-level layer i (0 allowed, skipped).
 * *out (dp_malloc) gets the buckets, output side first; returns their count
 * or < 0. */
int dp_plan_buckets(const int64_t *layers, int nlayers, size_t cap_bytes, size_t first_bytes,
                    struct dp_plan_bucket **out);

struct dp_plan_params {
    int64_t params;           /* Ψ; with layers, their sum is used */
    const int64_t *layers;    /* (nlayers) floats per top-level layer in slab order, or NULL: nlayers equal layers */
    const double *layer_flops;/* (nlayers) forward FLOPs per sample, or NULL: 2 x layer params x tokens */
    int nlayers;
    double tokens;            /* tokens per sample (for the default FLOPs) [1] */
    struct dp_plan_net net;
    double flops;             /* achieved FLOP/s per worker */
    double sample_s;          /* > 0: measured forward + backward seconds per sample (overrides flops) */
    int64_t batch;            /* global batch; each worker computes batch / p */
    int bytes_per_elem;       /* of the gradient on the wire: 4 (fp32) or 2 (bf16) */
    double compress;          /* >= 1: the wire carries bytes / compress */
    size_t bucket_cap_bytes;  /* 0: auto (dp_plan_auto_cap) */
    size_t first_bucket_bytes;/* 1 MiB */
    size_t unit_bytes;        /* --zero-unit-mb (0: none): no range above it, and the layers it cuts
                                 (unit_nranges) each range its own, as the reducer cuts them */
    const int *unit_nranges;  /* (nlayers) how many ranges the unit cut layer i into (0: not cut), or NULL */
    const int64_t *unit_ranges; /* their floats, layer after layer, each layer's highest first
                                   (dp_layer_ranges after dp_model_set_unit) */
    int overlap;              /* 1: a bucket starts when its last layer's backward ends */
    int algo;                 /* -1: the fastest per bucket; else forced */
    double opt_s;             /* optimizer time per step (fixed part) */
    double opt_state_bytes;   /* optimizer state per parameter: 8 for AdamW (m, v), 4 for SGD momentum */
    /* Calibrated terms (dptrain calibrate; 0 = absent).  Measured with all
     * p workers computing at once, so the contention for cores and memory
     * is in them, not modelled. */
    double fwd_sample_s, bwd_sample_s; /* > 0: forward and backward seconds per sample (override sample_s, flops) */
    double opt_param_s;       /* optimizer seconds per parameter (the update), added to opt_s */
    double zero_param_s;      /* seconds per parameter to zero the gradient slab before the step */
    double data_sample_s;     /* loader seconds per sample (gather + copy) of the worker's share */
    double comm_cpu;          /* 0..1: compute time lost per second of all-reduce running beside it
                               * (the thread backend on a machine with no spare core: near 1) */
    int gathers;              /* small all-gathers of p doubles per step outside the buckets: 1 when
                               * the run records metrics (the trainer gathers every rank's wait) */
    double gather_wait_s;     /* per gather, beyond its formula: the measured cost of the step-boundary
                               * sync it is (the wait for the slowest worker's update and the wake-up;
                               * dptrain calibrate --run, held at every p; 0 = absent) */
    /* The straggler wait: a synchronous step waits for the slowest of the p
     * workers' forward + backward, C (x) the mean.  Measured as fractions of
     * the mean compute C = fwd + bwd + steal (dptrain calibrate, from its
     * steps with the real reducer; 0 = absent): */
    double compute_cv;        /* sigma / C of one worker's compute around its step's mean; for
                               * p != straggle_workers the wait is e_p sigma (dp_plan_normal_max) */
    double straggle_cv;       /* the measured (median max - median mean) / C at straggle_workers */
    int straggle_workers;     /* the p that straggle_cv was measured at (0: none) */
    /* a pipeline (dp_plan_pipeline): per layer, the floats per sample of its output, the bytes per
     * sample it keeps for backward, and the most bytes per sample its backward adds while it runs
     * (scratch, gradient buffers); NULL: none (no messages, no activations counted) */
    const double *layer_out, *layer_act, *layer_scratch;
    double tie_bytes;         /* a parameter tied across the first and last stage (the gpt's embedding) */
    /* tensor parallelism (dp_plan_layout): per layer, the all-reduces a tensor group makes for
     * one micro-batch's forward and backward, and the floats per sample of each (dp_model_tp_traffic);
     * NULL: the layers do not split */
    const double *layer_tp_calls, *layer_tp_floats;
    /* Calibrated compute at several sizes (dptrain plan --profile-at): forward and backward seconds
     * per sample measured with cal_batch[i] samples per worker (ascending).  A small batch can cost
     * less per sample than a large one (its activations stay in cache), and a pipeline's
     * micro-batches are small: the times at b samples are interpolated in log b between the two
     * nearest sizes, held beyond them (dp_plan_sample_times).  cal_n 0: fwd_sample_s and
     * bwd_sample_s at every size. */
    int cal_n;
    const double *cal_batch, *cal_fwd, *cal_bwd;
};
struct dp_plan_params dp_plan_default_params(void);
/* The calibrated forward and backward seconds per sample at b samples per worker (see cal_n). */
void dp_plan_sample_times(const struct dp_plan_params *p, double b, double *fwd, double *bwd);

/* Where a plan's forward and backward times come from, the first that
 * applies: a calibrated model (fwd_sample_s, bwd_sample_s), a measured
 * time per sample (sample_s), or FLOPs at a rate (flops): an estimate, from
 * an assumed rate, not a measurement of the model. */
enum dp_plan_compute {
    DP_PLAN_COMPUTE_FLOPS = 0,
    DP_PLAN_COMPUTE_SAMPLE,
    DP_PLAN_COMPUTE_CALIBRATED,
    DP_PLAN_COMPUTE_COUNT
};

struct dp_plan_result {
    enum dp_plan_compute compute; /* where fwd_s and bwd_s come from */
    double fwd_s, bwd_s, opt_s;   /* per step per worker (opt: opt_s + opt_param_s x params) */
    double zero_s;                /* zeroing the gradient slab */
    double data_s;                /* the loader's part that the step waits for (see dp_plan_run) */
    double comm_s;                /* sum of the buckets' all-reduce times */
    double overlap_s;             /* the part of comm_s that runs while backward does */
    double steal_s;               /* compute lost to it: comm_cpu x overlap_s */
    double straggle_s;            /* the wait for the slowest worker's compute (see dp_plan_params) */
    double gather_s;              /* the per-step all-gathers (gathers x (formula + gather_wait_s)) */
    double exposed_s;             /* communication left after backward */
    double step_s;                /* data + zero + fwd + bwd + steal + straggle + exposed + opt + gather */
    double efficiency;            /* (data + zero + fwd + bwd + opt) / step: throughput over p x the
                                     no-communication rate */
    double samples_per_s;         /* batch / step */
    double grad_bytes;            /* on the wire per all-reduce of the whole gradient */
    double sent_bytes;            /* one worker sends per step */
    double mem_bytes[4];          /* weights + grads + optimizer state per worker: plain, ZeRO 1, 2, 3 */
    double mem_inflight[4];       /* on top of mem_bytes, what a sharded step holds at once per worker
                                     (src/ddp/zero.c dp_zero_inflight_bytes): ZeRO 2 the gradients of
                                     the largest two adjacent buckets, ZeRO 3 also their gathered
                                     parameters and two 2 MiB units; 0 for plain, ZeRO 1 and P = 1.
                                     With unit_bytes the ranges are the unit's (slices) */
    int nb;
    struct dp_plan_bucket *b;     /* (nb), output side first */
};
/* Predicts one step.  0, DP_EINVAL (a bad parameter, with a message) or
 * DP_ENOMEM.  The result owns b: dp_plan_result_free. */
int dp_plan_run(const struct dp_plan_params *p, struct dp_plan_result *r);
void dp_plan_result_free(struct dp_plan_result *r);
/* ---- a pipeline's step (dptrain plan --pp, --layout auto) --------------------------------------
 * The layout of src/train/pipe_step.c (docs/parallel.md): p->net.workers = P workers as R = P / S
 * replicas of S stages, the layers cut by dp_pipe_split on each layer's forward FLOPs + 1, each
 * replica's share (batch / R) in M micro-batches.  Per stage s and micro-batch: f_s and b_s, its
 * layers' share of the forward and backward of b = batch / (R M) samples (p's compute model:
 * calibrated seconds per sample shared out by FLOPs, or FLOPs at a rate); c, one message of the
 * activations at a stage boundary, α + bytes β of the ring's link.  The micro-batches' makespan
 * (gpipe and 1f1b alike, each link carrying one message per micro-batch each way):
 *
 *     pipe = Σ_s (f_s + b_s) + 2 (S - 1) c + (M - 1) max(max_s (f_s + b_s), c)
 *
 * (for equal stages, (M + S - 1)(f + b): the bubble (S - 1)/(M + S - 1)).  Then each stage's
 * replicas all-reduce its span (ring over R; what the last micro-batch's backward does not hide
 * is exposed), each stage updates its span (opt_param_s per parameter), the tied parameters go
 * between the first and last stage (their gradient, then their values: 2 messages), and the
 * stages agree on 4 doubles (one all-reduce over P).  step = pipe + the slowest stage's exposed
 * reduction and update + the tie + the agreement.
 * Memory per worker (the implementation's): weights and gradient of the whole model (8Ψ: every
 * worker holds the whole slabs), its stage's optimizer state (S_bytes Ψ_s; ZeRO 1: / R) and its
 * micro-batches' activations: dp_pipe_max_inflight x b x (the stage's layer_act per sample + the
 * largest of its layers' layer_scratch: one layer's backward runs at a time). */
struct dp_plan_pipe {
    int stages, replicas, micro;  /* S, R, M */
    int tensor;                   /* T (dp_plan_layout; 1: no tensor parallelism) */
    double tp_s;                  /* of the bottleneck stage's f + b, its tensor group's all-reduces */
    int *first;                   /* (S + 1) stage s is layers [first[s], first[s + 1]) */
    double *f_s, *b_s;            /* (S) forward, backward of one micro-batch */
    double *mem_bytes;            /* (S) per worker of the stage: weights, gradient, state, activations */
    double *act_bytes;            /* (S) of it, the activations */
    double p2p_s;                 /* one boundary message (the largest boundary) */
    double pipe_s;                /* the micro-batches' makespan */
    double bubble;                /* 1 - M (f + b) / pipe for the bottleneck stage */
    double comm_s, exposed_s;     /* the slowest stage's span all-reduce, and its part after backward */
    double opt_s, tie_s, agree_s;
    double step_s, samples_per_s;
};
/* Predicts one step of the layout (S stages, M micro-batches, schedule enum dp_pipe_schedule,
 * ZeRO stage 0 or 1), from p as dp_plan_run reads it, with p->layer_out (the floats per sample
 * of each layer's output: the boundary messages), p->layer_act and p->layer_scratch, when given.  0, DP_EINVAL (S does not divide the workers, more stages than
 * layers, M < 1, ZeRO above 1) or DP_ENOMEM; dp_plan_pipe_free frees the arrays. */
int dp_plan_pipeline(const struct dp_plan_params *p, int stages, int micro, int schedule, int zero,
                     struct dp_plan_pipe *r);
/* The same with tensor parallelism (src/train/tp.c): each stage of each of the R = P / (S T)
 * replicas is a group of T threads of one process that splits its layers.  Per stage and
 * micro-batch, f_s and b_s are the stage's share over T, plus its group's all-reduces: for
 * each layer, p->layer_tp_calls[i] of b p->layer_tp_floats[i] floats over T on the intra-host link
 * (a ring: 2 (T - 1) (α' + n/T β')), half in forward, half in backward.  Every worker holds the
 * whole model and its stage's span is reduced over the stage's R T workers (the replicated part
 * counted once per group), updated by each (ZeRO 1: / R T).  The activations are counted whole:
 * an upper bound (a split block keeps its norms' and residuals' outputs whole, the rest / T).
 * S = 1 is tensor parallelism alone (M = 1: one pass).  T = 1 is dp_plan_pipeline. */
int dp_plan_layout(const struct dp_plan_params *p, int stages, int tensor, int micro, int schedule, int zero,
                   struct dp_plan_pipe *r);
void dp_plan_pipe_free(struct dp_plan_pipe *r);
/* The planned schedule, operation by operation: each stage runs its ops in the schedule's order
 * (dp_pipe_schedule), an op starting when its stage is free and its input has come (F(s, k): F(s-1,
 * k) ended + p2p_s; B(s, k): B(s+1, k) ended + p2p_s), for f_s and b_s.  (*out)[i] for i < 2 S M
 * (dp_free it), by stage then the stage's order; returns the count or < 0.  Its makespan is the
 * formula's pipe for equal stages (tests/test_plan.c). */
struct dp_plan_span {
    int stage, micro, backward;
    double t0, t1;
};
int dp_plan_pipe_spans(const struct dp_plan_pipe *r, int schedule, struct dp_plan_span **out);

/* e_p = E[max of p independent standard normals] (e_1 = 0, e_2 = 1/sqrt(pi),
 * e_3 = 3 / (2 sqrt(pi))), by quadrature; p >= 1. */
double dp_plan_normal_max(int p);

/* Least-squares α and β of algorithm algo on p workers from measured
 * all-reduce times t[i] of bytes[i] (n >= 2 sizes), with γ given (its term
 * is subtracted first).  The model is linear in α and β, so this is a 2 x 2
 * weighted least-squares problem; the weights 1/t[i]^2 minimise the relative
 * error, so the small sizes (which carry α) count as much as the large ones
 * (which carry β).  A negative α (noise) is clamped to 0 and β refitted
 * alone.  0 or DP_EINVAL. */
int dp_plan_fit(int algo, int p, double gamma_s, const double *bytes, const double *t, int n, double *alpha_s,
                double *beta_s);

/* ---- a reader of flat JSON lines (metrics.jsonl) ---------------------------------- */

/* One line of metrics.jsonl is one flat object: string keys, values that are
 * numbers, strings, true/false/null, arrays of numbers or arrays of strings
 * (an empty array is one of numbers).  Nothing nested
 * deeper is accepted.  Bad input is DP_EFORMAT with a message naming the
 * column; never a crash (tests/test_plan.c feeds it mutated lines). */
enum dp_json_type { DP_JSON_NUM = 0, DP_JSON_STR, DP_JSON_ARR, DP_JSON_BOOL, DP_JSON_NULL, DP_JSON_STRS,
                    DP_JSON_TYPE_COUNT };
struct dp_json_field {
    char *key;
    enum dp_json_type type;
    double num;             /* NUM, BOOL (0 or 1) */
    char *str;              /* STR (escapes decoded; \u beyond ASCII becomes '?') */
    double *arr;            /* ARR (n) */
    char **strs;            /* STRS (n), decoded as str */
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

/* ---- a small SVG writer ----------------------------------------------------------- */

/* Self-contained SVG plots (no dependency): axes with ticks, labels that
 * must carry a unit in parentheses ("time (s)"), a title and a legend.
 *   LINES    one polyline per series (non-finite points break the line)
 *   STACKED  areas stacked in series order over series 0's x (all series the same n)
 *   BARS     one bar per point of series 0 (x = position, y = height); more series: side by side
 *   SPANS    one row per point: a bar from x[i] to y[i] (a timeline), every series on the same rows;
 *            with a series' row[], point i's bar on row[i] (several bars a row: a Gantt chart)
 * The output is a pure function of the input (fixed number formats). */
enum dp_svg_kind { DP_SVG_LINES = 0, DP_SVG_STACKED, DP_SVG_BARS, DP_SVG_SPANS, DP_SVG_KIND_COUNT };
struct dp_svg_series {
    const char *name;
    const double *x, *y;      /* (n) */
    int64_t n;
    const double *row;        /* SPANS: (n) the row of each bar (NULL: point i on row i) */
};
struct dp_svg_plot {
    enum dp_svg_kind kind;
    const char *title, *xlabel, *ylabel;
    int width, height;        /* pixels; 0: 640 x 400 */
    int markers;              /* LINES: a dot at each point */
};
/* Writes the plot to f (a file the caller opened).  0, DP_EINVAL (no data,
 * a label without a unit, unequal stacked series) or DP_EIO. */
int dp_svg_write(FILE *f, const struct dp_svg_plot *p, const struct dp_svg_series *s, int ns);

#ifdef __cplusplus
}
#endif
#endif
