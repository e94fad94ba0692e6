/*
 * `dptrain calibrate`: measures this machine, or the processes of an MPI
 * job, for `dptrain plan --profile` (the model of src/plan/model.c).
 *
 * Communication: the all-reduce at sizes --min-bytes .. --max-bytes (x4),
 * timed as `dptrain bench allreduce` times it (bench_allreduce.c), for ring
 * and rhd; α and β per algorithm by dp_plan_fit; γ from a sum of two
 * buffers.  Level "thread": P worker threads of this process; level
 * "process" (--backend mpi, under mpirun): one rank per process.
 *
 * Compute (--model SPEC): every phase runs on all P workers at once (P
 * threads, or one per process with every process at once), so that the
 * contention for cores, caches and memory of a P-worker run is in the
 * figures, not modelled:
 *   forward, backward  seconds per sample at batch / P samples (dp_model_run);
 *                      also worker 0 alone, to show what the contention costs
 *   optimizer          seconds per parameter of the update (dp_optim_step), for
 *                      SGD with momentum 0.9 and for AdamW (the trainer's finite
 *                      check before it, one read pass, is left out)
 *   zeroing            seconds per parameter of clearing the gradient slab
 *   data               the loader's seconds per sample (gather from a data set
 *                      of the model's input shape, synchronous: what the
 *                      prefetch thread does), image models only
 *   steps              forward + backward with the trainer's own reducer (its
 *                      buckets, their all-reduces started from backward and
 *                      run as train's default runs them, on the communicator's
 *                      progress thread or by the workers between layers
 *                      (dp_train_progress_auto), the wait at the end) and
 *                      the update (--optim), as a training step has them, and
 *                      with --metrics the trainer's own all-gather of every
 *                      rank's wait after the update (dp_train_gather_waits,
 *                      which a run with an output folder makes every step),
 *                      for:
 *     comm_cpu         the compute that the all-reduces beside backward take:
 *                      steal = median backward with the reducer - without, and
 *                          comm_cpu = steal / overlap,
 *                      overlap the plan's own (dp_plan_run for this model, P,
 *                      batch and the fitted link), clamped to 0..1, so that the
 *                      plan's steal term at the calibrated point is what the
 *                      real progress thread took
 *     straggle_cv      c_w,k = worker w's forward + backward in step k, C its
 *                      mean over the workers' step means: (median_k max_w c_w,k
 *                      - median_k mean_w c_w,k) / C, the step's wait for its
 *                      slowest worker at this P
 *     compute_cv       sigma / C of c_w,k about its step's mean (robust: 1.4826 x
 *                      the median absolute deviation, x sqrt(W / (W - 1)) for the
 *                      mean taken out), for the plan's e_P sigma at other P
 *     gather_wait_s    --metrics: the all-gather's median time (the workers'
 *                      mean per step) - the plan's formula for it, (P-1)(α +
 *                      8β) on the ring's fit, at least 0: the wait for the
 *                      slowest worker's update and the wake-up
 *   The synchronised passes and the steps take turns in up to 5 rounds, so
 *   that the machine's busy moments weigh on both and on the whole phase.
 * Each worker keeps the median over --compute-iters iterations (after two
 * warm-up ones); the profile takes the slowest worker's (optimizer, zeroing,
 * data), and for forward and backward the median over the passes of the
 * workers' mean in each pass (profile version 3: the straggler wait is its
 * own term; version 2 took the slowest worker's per pass).
 *
 * With --run too (profile version 4): the step terms from a short run of
 * the same training, the trainer's own step loop (run_terms).  Without
 * --run the profile is calibrate's own, independent of the run it predicts
 * (plan from it is a prediction); with --run of the same configuration it is
 * a calibration to that run (plan from it checks consistency).
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dp/comm.h"
#include "dp/core.h"
#include "dp/data.h"
#include "dp/ddp.h"
#include "dp/nn.h"
#include "dp/optim.h"
#include "dp/plan.h"
#include "dp/train.h"
#include "cli.h"

#define die dptrain_die

static const char *help_calibrate =
    "usage: dptrain calibrate [--backend thread|mpi] [--workers P] [--model SPEC] [options]\n"
    "                         [--out FILE]\n"
    "\n"
    "Measures this machine (or, with --backend mpi under mpirun, the processes of the job)\n"
    "for `dptrain plan --profile FILE` (docs/plan.md, \"Calibration\"):\n"
    "  - the all-reduce at sizes --min-bytes .. --max-bytes (x4 steps), timed as `dptrain\n"
    "    bench allreduce` times it, for ring and rhd; alpha and beta per algorithm by a\n"
    "    least-squares fit (relative error) of the plan's own formulas; gamma (seconds per\n"
    "    byte reduced) from a sum of two buffers;\n"
    "  - with --model: forward and backward seconds per sample with all P workers computing\n"
    "    at once (and worker 0 alone), the optimizer's seconds per parameter (SGD momentum,\n"
    "    AdamW), zeroing the gradient, the loader's seconds per sample; and from steps with\n"
    "    the trainer's reducer (buckets all-reduced beside backward): comm_cpu, the compute\n"
    "    that the all-reduces take away (0..1), and the spread of the workers' compute per\n"
    "    step (straggle_cv, compute_cv: the wait for the slowest worker); with --metrics,\n"
    "    the steps update and all-gather every rank's wait as the trainer does when it records\n"
    "    metrics (train --out): gather_wait_s, that all-gather's time beyond its formula;\n"
    "    the passes and the steps in up to 5 rounds, taking turns;\n"
    "  - with --run: the forward + backward seconds per sample of a run's step records; with\n"
    "    --model too, the step's terms from the run (a run of this model, --workers and --batch,\n"
    "    with --out): forward, backward, optimizer, the straggler wait and the metrics\n"
    "    all-gather's wait, rank 0's medians after the 5th step, so that the plan there sums\n"
    "    to the run's median step.\n"
    "Writes one JSON object (profile version 4).\n"
    "\n"
    "  --backend B      thread: P threads of this process [thread]; mpi: one worker per\n"
    "                   process, every process of the job (mpirun -np N dptrain calibrate\n"
    "                   --backend mpi ...); rank 0 writes the profile\n"
    "  --workers P      threads (thread backend) [2]\n"
    "  --min-bytes N    [4096]   --max-bytes N [16777216]   --iters N per size [20], in up to\n"
    "                   5 rounds of 3 or more (the algorithms taking turns): the median of\n"
    "                   the rounds' medians\n"
    "  --model SPEC     mlp | cnn | resnet | mlp:... | gpt:... (as train)\n"
    "  --input C,H,W    input shape of an image model [1,28,28]\n"
    "  --batch B        global batch: each worker computes B / P samples [128]\n"
    "  --threads N      compute threads per worker (as train's --threads) [1]\n"
    "  --algo A         the reducer's all-reduce in the steps (as train's --algo) [auto]\n"
    "  --compute-iters K  timed iterations per compute phase [20]\n"
    "  --run RUN        a run folder or metrics.jsonl (dptrain train --out RUN)\n"
    "  --optim sgd|adamw  the steps' update; with --run, the run's optimizer: its per-parameter\n"
    "                   time from the run [sgd]\n"
    "  --metrics        the run to predict records metrics (train --out DIR, plan --metrics):\n"
    "                   the steps all-gather every rank's wait after the update [off]\n"
    "  --out FILE       write the profile there (and a summary to stdout) [stdout]\n";

/* γ: seconds per byte of a[i] += b[i] over n floats (the reduction's own
 * work: read two, write one), the fastest of 5 passes after one warm-up. */
static double measure_gamma(size_t n) {
    float *a = dp_malloc_big(n * sizeof(float)), *b = dp_malloc_big(n * sizeof(float));
    if (!a || !b) die("out of memory");
    for (size_t i = 0; i < n; i++) a[i] = 0, b[i] = 1;
    double best = INFINITY;
    for (int pass = 0; pass < 6; pass++) {
        double t0 = dp_time();
        for (size_t i = 0; i < n; i++) a[i] += b[i];
        double t = dp_time() - t0;
        if (pass && t < best) best = t;
    }
    volatile float sink = a[n / 2]; /* keep the sums */
    (void)sink;
    dp_free(a), dp_free(b);
    return best / (double)(n * sizeof(float));
}

/* A run's step records (rank 0's times) in order, and the workers of its
 * epoch records.  A record's "samples" is the global batch and its
 * forward_s and backward_s are rank 0's, so rank 0's seconds per sample are
 * (forward + backward) / (samples / workers) (equal shares: not for
 * --balance runs).  step_s, comm_exposed_s and optimizer_s are NaN where a
 * record has none (the step terms of --model need them). */
enum { RUN_SAMPLE, RUN_STEP, RUN_FWD, RUN_BWD, RUN_EXPOSED, RUN_OPT, RUN_SAMPLES, RUN_N };
struct run_recs {
    double *v[RUN_N];
    int64_t n, cap;
    double workers;
};
static void run_add(const struct dp_json_obj *o, void *arg) {
    struct run_recs *rr = arg;
    if (dp_json_str_is(o, "kind", "epoch")) rr->workers = dp_json_num(o, "workers", rr->workers);
    if (!dp_json_str_is(o, "kind", "step")) return;
    double f = dp_json_num(o, "forward_s", NAN), b = dp_json_num(o, "backward_s", NAN), n = dp_json_num(o, "samples", NAN);
    if (!(f >= 0 && b >= 0 && n > 0)) return;
    if (rr->n == rr->cap) {
        rr->cap = rr->cap ? 2 * rr->cap : 256;
        for (int k = 0; k < RUN_N; k++)
            if (!(rr->v[k] = realloc(rr->v[k], sizeof(double) * (size_t)rr->cap))) die("out of memory");
    }
    double *r[RUN_N];
    for (int k = 0; k < RUN_N; k++) r[k] = &rr->v[k][rr->n];
    *r[RUN_SAMPLE] = (f + b) / n, *r[RUN_FWD] = f, *r[RUN_BWD] = b, *r[RUN_SAMPLES] = n;
    *r[RUN_STEP] = dp_json_num(o, "step_s", NAN), *r[RUN_EXPOSED] = dp_json_num(o, "comm_exposed_s", NAN);
    *r[RUN_OPT] = dp_json_num(o, "optimizer_s", NAN);
    rr->n++;
}
static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
/* The median of v[0..n) (sorts v). */
static double median(double *v, int64_t n) {
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The median of v[from..n), on a copy. */
static double median_from(const double *v, int64_t from, int64_t n) {
    double *c = malloc(sizeof(double) * (size_t)(n - from));
    if (!c) die("out of memory");
    memcpy(c, v + from, sizeof(double) * (size_t)(n - from));
    double x = median(c, n - from);
    free(c);
    return x;
}

/* ---- compute ------------------------------------------------------------------------ */

/* One worker's results (its medians); the profile takes the slowest worker's
 * (forward and backward and the steps' terms: over the passes, see
 * calibrate_compute). */
enum { CAL_FWD1, CAL_BWD1, CAL_FWD, CAL_BWD, CAL_SGD, CAL_ADAMW, CAL_ZERO, CAL_DATA, /* per worker */
       CAL_STEAL, CAL_COMPUTE, CAL_STRAGGLE_CV, CAL_COMPUTE_CV, CAL_GATHER,    /* the job's (calibrate_compute) */
       CAL_N };
#define CAL_MAX_ITERS 1000
#define CAL_ROUNDS 5 /* the all-reduce table's rounds (see dptrain_cmd_calibrate), the compute's */

/* Rounds of iters iterations: up to CAL_ROUNDS, 3 iterations or more each
 * (the median of each round stands one preempted iteration). */
static int cal_rounds(int iters) {
    return iters / 3 < 1 ? 1 : iters / 3 > CAL_ROUNDS ? CAL_ROUNDS : iters / 3;
}

struct cal {
    const struct dp_model *m;
    int P;                      /* worker threads in this process */
    int64_t B;                  /* samples per worker */
    int iters, threads;         /* threads: compute threads per worker (train's --threads) */
    struct dp_comm *job;        /* --backend mpi: the process communicator (P = 1), else NULL */
    struct dp_comm_world *w;    /* thread backend: the workers' communicators */
    enum dp_comm_algo algo;     /* the reducer's (--algo) */
    enum dp_optim_kind optim;   /* the steps' update (--optim) */
    int gathers;                /* --metrics: the steps all-gather every rank's wait after the update */
    pthread_barrier_t bar;
    const struct dp_dataset *ds;/* image models: the loader's data set */
};

struct cal_job {
    struct cal *c;
    int rank;
    struct dp_replica rep;
    struct dp_batch b;
    struct dp_comm *comm;       /* this worker's communicator (the reducer's, the optimizer phase's) */
    double v[CAL_N];
    double tf[CAL_MAX_ITERS], tb[CAL_MAX_ITERS]; /* the passes all workers started together */
    double rf[CAL_MAX_ITERS], rb[CAL_MAX_ITERS]; /* the steps with the reducer */
    double rg[CAL_MAX_ITERS];                    /* their metrics all-gathers (--metrics; else 0) */
    struct dp_reducer red;      /* the steps' reducer, optimizer and gathered waits (cal_steps) */
    struct dp_optim opt;
    double *waits;
};

/* All workers of the job at the same point: the threads, then the processes. */
static void cal_sync(struct cal_job *j) {
    pthread_barrier_wait(&j->c->bar);
    if (j->c->job && dp_comm_barrier(j->c->job)) die("%s", dp_errmsg());
}

/* Passes from .. from + count - 1 of forward + backward into tf, tb (after
 * `warm` untimed ones).  With sync, the workers start every pass together,
 * as the steps of a synchronous run do (the step's all-reduce lines them
 * up): on a loaded machine the kernel treats a thread that waits between
 * bursts differently from one that computes without a break, and the run's
 * workers are the former. */
static void cal_sync(struct cal_job *j);
static void cal_passes(struct cal_job *j, int sync, int from, int count, int warm, double *tf, double *tb) {
    struct cal *c = j->c;
    for (int i = -warm; i < count; i++) {
        if (sync) cal_sync(j);
        memset(j->rep.grads, 0, sizeof(float) * (size_t)c->m->num_params);
        struct dp_pass pass = {.training = 1, .backward = 1, .seed = 1, .loss_scale = 0};
        if (dp_model_run(c->m, &j->rep, &j->b, &pass)) die("calibrate: %s", dp_errmsg());
        if (i >= 0) tf[from + i] = pass.t_forward, tb[from + i] = pass.t_backward;
    }
}

/* Steps from .. from + count - 1 as the trainer runs them (after `warm`
 * untimed ones): zero the gradient, forward + backward with the reducer's
 * grad_ready starting each bucket's all-reduce on the progress thread, the
 * wait for the last, the update (the finite check and the step of
 * --optim), and with --metrics the trainer's own all-gather of every rank's
 * wait (dp_train_gather_waits, the call its step loop makes when it records
 * metrics): a second sync point per step, which waits for the slowest
 * worker's update.  The reduction lines the workers up from one step to the
 * next, as in a run.  Keeps each step's forward and backward (the steal is
 * inside backward) and the all-gather's time. */
static void cal_steps(struct cal_job *j, int from, int count, int warm) {
    struct cal *c = j->c;
    int64_t n = c->m->num_params;
    int G = dp_comm_world(j->comm), me = dp_comm_rank(j->comm), last;
    for (int i = -warm; i < count; i++) {
        memset(j->rep.grads, 0, sizeof(float) * (size_t)n);
        struct dp_pass pass = {.training = 1, .backward = 1, .seed = 1, .loss_scale = 0,
                               .grad_ready = dp_reducer_grad_ready, .grad_ready_arg = &j->red};
        dp_reducer_begin(&j->red);
        if (dp_model_run(c->m, &j->rep, &j->b, &pass)) die("calibrate: %s", dp_errmsg());
        double t0 = dp_time();
        if (dp_reducer_finish(&j->red)) die("calibrate: %s", dp_errmsg());
        double t1 = dp_time(), g = 0;
        if (dp_any_nonfinite(j->rep.grads, n)) die("calibrate: the gradient is not finite");
        if (dp_optim_step(&j->opt, j->rep.params, j->rep.grads, n, 1e-6f)) die("calibrate: %s", dp_errmsg());
        if (c->gathers) {
            double t2 = dp_time();
            if (dp_train_gather_waits(j->comm, G, me, t1 - t0, j->waits, &last)) die("calibrate: %s", dp_errmsg());
            g = dp_time() - t2;
        }
        if (i >= 0) j->rf[from + i] = pass.t_forward, j->rb[from + i] = pass.t_backward, j->rg[from + i] = g;
    }
}

/* The optimizer phase per parameter, as the trainer times it: the check
 * that the reduced gradient is finite (a read pass) and the update.  Before
 * each (untimed): an all-reduce of the gradient, as in a step, so that the
 * phase reads a gradient the communication has just written (on the thread
 * backend, partly from the other workers' cores: their caches, not this
 * one's). */
static double cal_optim(struct cal_job *j, enum dp_optim_kind kind) {
    struct cal *c = j->c;
    int64_t n = c->m->num_params;
    struct dp_optim_params op = dp_optim_default_params();
    op.kind = kind, op.momentum = kind == DP_OPTIM_SGD ? 0.9f : 0;
    struct dp_optim o;
    if (dp_optim_init(&o, &op, n)) die("calibrate: %s", dp_errmsg());
    double t[CAL_MAX_ITERS];
    const float *g = j->rep.grads;
    for (int i = -2; i < c->iters; i++) {
        if (dp_comm_allreduce(j->comm, j->rep.grads, n, DP_DTYPE_F32, DP_ALGO_AUTO)) die("calibrate: %s", dp_errmsg());
        double t0 = dp_time();
        if (dp_any_nonfinite(g, n)) die("calibrate: the gradient is not finite");
        if (dp_optim_step(&o, j->rep.params, g, n, 1e-6f)) die("calibrate: %s", dp_errmsg());
        if (i >= 0) t[i] = dp_time() - t0;
    }
    dp_optim_free(&o);
    return median(t, c->iters) / (double)n;
}

/* The loader's work per sample: a synchronous loader (no prefetch thread)
 * over the shared data set, one batch per iteration. */
static double cal_data(struct cal_job *j) {
    struct cal *c = j->c;
    struct dp_loader_params lp = dp_loader_default_params();
    lp.batch = c->B, lp.shuffle = 1, lp.seed = 1 + (uint64_t)j->rank, lp.prefetch = 0, lp.drop_last = 1;
    struct dp_loader *l;
    if (dp_loader_init(&l, c->ds, &lp)) die("calibrate: %s", dp_errmsg());
    double t[CAL_MAX_ITERS];
    for (int i = -2; i < c->iters; i++) {
        const struct dp_loader_batch *lb;
        double t0 = dp_time();
        if (dp_loader_next(l, &lb)) die("calibrate: %s", dp_errmsg());
        if (i >= 0) t[i] = dp_time() - t0;
    }
    dp_loader_free(l);
    return median(t, c->iters) / (double)c->B;
}

static void *cal_main(void *arg) {
    struct cal_job *j = arg;
    struct cal *c = j->c;
    const struct dp_model *m = c->m;
    dp_set_num_threads(c->threads);
    int64_t B = c->B, per = dp_shape_numel(&m->in_shape), V = dp_model_num_classes(m);
    int tokens = dp_model_reads_tokens(m);
    int64_t ntarg = tokens ? B * per : B;
    if (dp_replica_init(&j->rep, m, B)) die("calibrate: %s", dp_errmsg());
    dp_model_init_params(m, &j->rep, 1 + (uint64_t)j->rank);
    /* random inputs and targets (the time does not depend on the values) */
    float *x = tokens ? NULL : dp_malloc(sizeof(float) * (size_t)(B * per));
    int32_t *tk = tokens ? dp_malloc(sizeof(int32_t) * (size_t)(B * per)) : NULL, *y = dp_malloc(sizeof(int32_t) * (size_t)ntarg);
    int64_t *idx = dp_malloc(sizeof(int64_t) * (size_t)B);
    if ((!x && !tk) || !y || !idx) die("out of memory");
    for (int64_t i = 0; i < B * per; i++) {
        if (x) x[i] = dp_rng_uniform(7, DP_RNG_USER, (uint64_t)j->rank, (uint64_t)i);
        else tk[i] = (int32_t)(dp_rng_u32(7, DP_RNG_USER, (uint64_t)j->rank, (uint64_t)i) % (uint32_t)V);
    }
    for (int64_t i = 0; i < ntarg; i++) y[i] = (int32_t)(dp_rng_u32(8, DP_RNG_USER, (uint64_t)j->rank, (uint64_t)i) % (uint32_t)V);
    for (int64_t i = 0; i < B; i++) idx[i] = i;
    j->b = (struct dp_batch){.B = B, .x = x, .tokens = tk, .targets = y, .sample_idx = idx};
    if (c->w && dp_comm_thread_init(&j->comm, c->w, j->rank)) die("calibrate: %s", dp_errmsg());
    if (c->job) j->comm = c->job;

    /* 1. worker 0 alone */
    cal_sync(j);
    int alone = j->rank == 0 && (!c->job || dp_comm_rank(c->job) == 0);
    if (alone) {
        double kf[CAL_MAX_ITERS], kb[CAL_MAX_ITERS];
        cal_passes(j, 0, 0, c->iters, 2, kf, kb);
        j->v[CAL_FWD1] = median(kf, c->iters) / (double)B, j->v[CAL_BWD1] = median(kb, c->iters) / (double)B;
    }
    /* 2. every worker at once and 3. the same as training steps, with the
     * reducer (and --metrics' all-gather): in up to CAL_ROUNDS rounds of
     * 3 or more iterations each, taking turns, so that a busy moment of the
     * machine weighs on both (the steal is their difference) and the
     * steps' spread and all-gather wait are taken over the whole phase,
     * not one stretch of it (2 warm-up iterations in the first round, 1
     * after each switch) */
    struct dp_reducer_params rp = dp_reducer_default_params();
    rp.algo = c->algo;
    struct dp_optim_params op = dp_optim_default_params();
    op.kind = c->optim, op.momentum = c->optim == DP_OPTIM_SGD ? 0.9f : 0;
    j->waits = dp_malloc(sizeof(double) * (size_t)dp_comm_world(j->comm));
    if (!j->waits) die("out of memory");
    if (dp_reducer_init(&j->red, m, j->comm, j->rep.grads, &rp) || dp_optim_init(&j->opt, &op, m->num_params))
        die("calibrate: %s", dp_errmsg());
    int rounds = cal_rounds(c->iters);
    for (int q = 0, from = 0; q < rounds; q++) {
        int k = c->iters / rounds + (q < c->iters % rounds);
        cal_sync(j);
        cal_passes(j, 1, from, k, q ? 1 : 2, j->tf, j->tb);
        cal_sync(j);
        cal_steps(j, from, k, q ? 1 : 2);
        from += k;
    }
    dp_reducer_free(&j->red), dp_optim_free(&j->opt), dp_free(j->waits);
    /* 4. the optimizer phase, zeroing and the loader */
    cal_sync(j);
    j->v[CAL_SGD] = cal_optim(j, DP_OPTIM_SGD);
    cal_sync(j);
    j->v[CAL_ADAMW] = cal_optim(j, DP_OPTIM_ADAMW);
    cal_sync(j);
    double t[CAL_MAX_ITERS];
    for (int i = -2; i < c->iters; i++) {
        double t0 = dp_time();
        memset(j->rep.grads, 0, sizeof(float) * (size_t)m->num_params);
        if (i >= 0) t[i] = dp_time() - t0;
    }
    j->v[CAL_ZERO] = median(t, c->iters) / (double)m->num_params;
    cal_sync(j);
    j->v[CAL_DATA] = c->ds ? cal_data(j) : 0;
    cal_sync(j);
    if (c->w) dp_comm_free(j->comm);
    dp_free(x), dp_free(tk), dp_free(y), dp_free(idx);
    dp_replica_free(&j->rep);
    return NULL;
}

/* The job's terms from every worker's times, t[(w K + i) CAL_T + q] for W
 * workers and K passes: q = 0, 1 the synchronised passes' forward and
 * backward, q = 2, 3 the steps' with the reducer, q = 4 the steps' metrics
 * all-gather (0 without --metrics); B samples per worker.  Per pass, the
 * workers' mean (forward, forward + backward, backward); the profile's
 * forward and backward per sample are the medians over the passes of those
 * means, and of the steps (c = forward + backward):
 *   steal        median mean backward (steps) - median mean backward (passes)
 *   compute      C = median_k mean_w c
 *   straggle_cv  (median_k max_w c - C) / C
 *   compute_cv   1.4826 median |c_w,k - mean_w c_.,k| sqrt(W / (W - 1)) / C
 *                (the normal's sigma from the median absolute deviation: robust
 *                to the stalls of a loaded machine, which the median step of a
 *                run leaves out too; the deviation from a mean of W has
 *                variance sigma^2 (W - 1) / W)
 *   gather       median_k mean_w of the all-gather's time: rank 0's wait in
 *                a run is any rank's, on average (the rank that arrives
 *                first waits for the last) */
#define CAL_T 5
static void cal_spread(const double *t, int W, int K, double B, double *out) {
    double *v = malloc(sizeof(double) * (size_t)K * 8), *dev = malloc(sizeof(double) * (size_t)K * W);
    if (!v || !dev) die("out of memory");
    double *mf = v, *mfb = v + K, *mb = v + 2 * K, *sb = v + 3 * K, *sc = v + 4 * K, *sx = v + 5 * K, *sx2 = v + 6 * K, *sg = v + 7 * K;
    for (int i = 0; i < K; i++) {
        mf[i] = mfb[i] = mb[i] = sb[i] = sc[i] = sg[i] = 0, sx[i] = -INFINITY;
        for (int w = 0; w < W; w++) {
            const double *q = t + ((size_t)w * K + i) * CAL_T;
            mf[i] += q[0] / W, mfb[i] += (q[0] + q[1]) / W, mb[i] += q[1] / W;
            sb[i] += q[3] / W, sc[i] += (q[2] + q[3]) / W, sx[i] = fmax(sx[i], q[2] + q[3]);
            sg[i] += q[4] / W;
        }
        for (int w = 0; w < W; w++) {
            const double *q = t + ((size_t)w * K + i) * CAL_T;
            dev[(size_t)i * W + w] = fabs(q[2] + q[3] - sc[i]);
        }
        sx2[i] = sx[i];
    }
    double f = median(mf, K), fb = median(mfb, K), b = median(mb, K);
    out[CAL_FWD] = f / B;
    out[CAL_BWD] = (fb > f ? fb - f : b) / B;
    out[CAL_STEAL] = fmax(0, median(sb, K) - b);
    double C = median(sc, K), mx = median(sx2, K);
    out[CAL_COMPUTE] = C;
    out[CAL_STRAGGLE_CV] = C > 0 ? fmax(0, mx - C) / C : 0;
    out[CAL_GATHER] = median(sg, K);
    out[CAL_COMPUTE_CV] = C > 0 && W > 1 ? 1.4826 * median(dev, (int64_t)K * W) * sqrt((double)W / (W - 1)) / C : 0;
    free(v), free(dev);
}

/* Runs the compute phases on P threads (or this process's one worker of the
 * job) and leaves the job's figures in out[CAL_N]. */
static void calibrate_compute(struct cal *c, double *out) {
    c->ds = NULL;
    struct dp_dataset ds = {0};
    if (!dp_model_reads_tokens(c->m)) {
        /* a data set of the model's input shape, up to 60,000 samples (the
         * size of Fashion-MNIST's training set) or 64 MiB */
        const struct dp_shape *s = &c->m->in_shape;
        int64_t per = dp_shape_numel(s), n = ((int64_t)16 << 20) / per;
        n = n > 60000 ? 60000 : n < c->B ? c->B : n;
        ds.n = n, ds.C = s->ndim == 3 ? s->d[0] : 1, ds.H = s->ndim == 3 ? s->d[1] : 1;
        ds.W = s->ndim == 3 ? s->d[2] : per, ds.num_classes = dp_model_num_classes(c->m);
        ds.x = dp_malloc_big(sizeof(float) * (size_t)(n * per));
        ds.y = dp_malloc(sizeof(int32_t) * (size_t)n);
        if (!ds.x || !ds.y) die("out of memory");
        for (int64_t i = 0; i < n * per; i++) ds.x[i] = (float)(i % 251) / 251;
        for (int64_t i = 0; i < n; i++) ds.y[i] = (int32_t)(i % ds.num_classes);
        c->ds = &ds;
    }
    if (pthread_barrier_init(&c->bar, NULL, (unsigned)c->P)) die("cannot make a barrier");
    struct dp_comm_params cp = dp_comm_default_params();
    cp.timeout_s = 120;
    /* the steps reduce as train's would by default (--comm-progress auto) */
    cp.progress = dp_train_progress_auto(c->P, c->threads, dp_cpus_allowed());
    if (!c->job && dp_comm_thread_world_init(&c->w, c->P, &cp)) die("%s", dp_errmsg());
    struct cal_job *j = calloc((size_t)c->P, sizeof *j);
    pthread_t *th = calloc((size_t)c->P, sizeof *th);
    if (!j || !th) die("out of memory");
    for (int r = 0; r < c->P; r++) {
        j[r] = (struct cal_job){.c = c, .rank = r};
        if (pthread_create(&th[r], NULL, cal_main, &j[r])) die("cannot start worker threads");
    }
    for (int r = 0; r < c->P; r++) pthread_join(th[r], NULL);
    /* worker 0 alone; the slowest worker of the rest (the per-worker terms).
     * Over processes: every rank's values to every rank, then the same. */
    int nproc = c->job ? dp_comm_world(c->job) : 1, me = c->job ? dp_comm_rank(c->job) : 0;
    double *all = calloc((size_t)(nproc * c->P * CAL_N), sizeof(double));
    if (!all) die("out of memory");
    for (int r = 0; r < c->P; r++) memcpy(all + ((size_t)me * c->P + r) * CAL_N, j[r].v, sizeof(double) * CAL_N);
    if (c->job && dp_comm_allgather(c->job, all, (int64_t)nproc * c->P * CAL_N, DP_DTYPE_F64, DP_ALGO_AUTO))
        die("%s", dp_errmsg());
    for (int k = 0; k < CAL_N; k++) out[k] = 0;
    out[CAL_FWD1] = all[CAL_FWD1], out[CAL_BWD1] = all[CAL_BWD1];
    for (int r = 0; r < nproc * c->P; r++)
        for (int k = CAL_SGD; k <= CAL_DATA; k++) out[k] = fmax(out[k], all[(size_t)r * CAL_N + k]);
    /* Every worker's forward and backward of every pass and step: t[w][i] =
     * (sync pass f, b, step f, b) */
    int W = nproc * c->P, K = c->iters;
    double *pt = calloc((size_t)W * K * CAL_T, sizeof(double));
    if (!pt) die("out of memory");
    for (int r = 0; r < c->P; r++)
        for (int i = 0; i < K; i++) {
            double *q = pt + (((size_t)me * c->P + r) * K + i) * CAL_T;
            q[0] = j[r].tf[i], q[1] = j[r].tb[i], q[2] = j[r].rf[i], q[3] = j[r].rb[i], q[4] = j[r].rg[i];
        }
    if (c->job && dp_comm_allgather(c->job, pt, (int64_t)W * K * CAL_T, DP_DTYPE_F64, DP_ALGO_AUTO)) die("%s", dp_errmsg());
    cal_spread(pt, W, K, (double)c->B, out);
    free(pt);
    free(all), free(j), free(th);
    if (c->w) dp_comm_thread_world_free(c->w);
    pthread_barrier_destroy(&c->bar);
    dp_free(ds.x), dp_free(ds.y);
}

/* The plan at the calibrated point (its overlap: the seconds of all-reduce
 * beside backward; its exposed communication, data, zeroing and gather):
 * this model's layers, P workers, the global batch, the calibrated
 * forward, backward, zeroing and data, comm_cpu, the optimizer's
 * opt_param_s, one metrics gather per step (the run's records are
 * gathered), no straggler wait, and the measured all-reduce table (ring,
 * rhd; the other algorithms of the plan by the ring's α and β). */
struct point {
    const struct dp_model *m;
    int P, algo;                /* algo: the plan's (-1: best per bucket) */
    long long batch;
    double gamma, alpha[2], beta[2], bytes[64], tt[2][64]; /* ring, rhd */
    int n;                      /* sizes in the table */
};
static struct dp_plan_result plan_point(const struct point *pt, const double *cal, double comm_cpu,
                                        double opt_param_s) {
    const struct dp_model *m = pt->m;
    int P = pt->P, n = pt->n;
    struct dp_plan_params p = dp_plan_default_params();
    int64_t *lp = malloc(sizeof *lp * (size_t)m->nlayers);
    double *lf = malloc(sizeof *lf * (size_t)m->nlayers);
    if (!lp || !lf) die("out of memory");
    for (int i = 0; i < m->nlayers; i++) lp[i] = m->layers[i]->param_count, lf[i] = (double)m->layers[i]->flops_fwd;
    p.layers = lp, p.layer_flops = lf, p.nlayers = m->nlayers, p.batch = pt->batch, p.algo = pt->algo;
    p.fwd_sample_s = cal[CAL_FWD], p.bwd_sample_s = cal[CAL_BWD];
    p.zero_param_s = cal[CAL_ZERO], p.data_sample_s = cal[CAL_DATA], p.comm_cpu = comm_cpu;
    p.opt_param_s = opt_param_s, p.gathers = 1;
    dp_plan_net_link(&p.net, pt->alpha[0], pt->beta[0] > 0 ? 1 / pt->beta[0] : 1e30);
    p.net.alpha_s[DP_PLAN_RHD] = pt->alpha[1], p.net.beta_s[DP_PLAN_RHD] = pt->beta[1];
    p.net.workers = P, p.net.gamma_s = pt->gamma;
    p.net.tab_n = n, p.net.tab_workers = P, p.net.tab_bytes = pt->bytes;
    p.net.tab_s[DP_PLAN_RING] = pt->tt[0], p.net.tab_s[DP_PLAN_RHD] = pt->tt[1];
    struct dp_plan_result r;
    if (dp_plan_run(&p, &r)) die("calibrate: %s", dp_errmsg());
    free(lp), free(lf);
    return r;
}

#define RUN_WARMUP 5

/* The measured all-reduce table (both algorithms) times k. */
static void scale_table(struct point *pt, double k) {
    for (int a = 0; a < 2; a++)
        for (int s = 0; s < pt->n; s++) pt->tt[a][s] *= k;
}

/* The plan at the point with the table times k and backward Bk (with b
 * samples per worker) as the run's: cal[CAL_BWD] set so that the plan's
 * backward + steal is Bk (the overlap moves with backward: a few rounds
 * agree to rounding). */
static struct dp_plan_result run_point(const struct point *pt, double k, double Bk, double b, double comm_cpu,
                                       double opt_param_s, double *cal) {
    struct point q = *pt;
    scale_table(&q, k);
    double ov = 0;
    struct dp_plan_result r = {0};
    for (int it = 0; it < 8; it++) {
        cal[CAL_BWD] = fmax(Bk - comm_cpu * ov, 0.5 * Bk) / b;
        dp_plan_result_free(&r);
        r = plan_point(&q, cal, comm_cpu, opt_param_s);
        if (fabs(r.overlap_s - ov) <= 1e-9 * Bk) break;
        ov = r.overlap_s;
    }
    return r;
}

/* The step terms from a run of this model at these P workers and global
 * batch (--model with --run), so that they come from the trainer's own step
 * loop (its metrics all-gather, its update, its scheduling) and from as many
 * steps as the run has, not from calibrate's imitation of a step: rank 0's
 * medians over the step records after the first RUN_WARMUP (as
 * bench/plan_validate.sh measures a step) of forward F, backward Bk,
 * comm_exposed W, optimizer O and step T replace the calibrated ones:
 *   fwd_sample_s  F / b                                 (b = batch / P)
 *   bwd_sample_s  (Bk - comm_cpu x overlap) / b         the steal is inside Bk
 *                 (comm_cpu from calibrate's steps with the reducer; the
 *                 overlap the plan's at this point, iterated to agree)
 *   <optim>_param_s  O / Ψ                              the run's --optim
 *   straggle_cv   max(0, W - E) / (F + Bk)              E the plan's exposed
 *                 communication here (from the table); compute_cv =
 *                 straggle_cv / e_P, the σ of the same wait at other P
 *   gather_wait_s max(0, T - F - Bk - W - O - (data + zero + gather)):
 *                 the rest of the step.  The trainer all-gathers every
 *                 rank's wait after the update when it records metrics (and
 *                 the run did): a second sync point per step, whose cost is
 *                 the wait for the slowest worker's update and the wake-up,
 *                 not the formula of an all-gather of P doubles
 *                 (bench/breakdown.sh, variant dp2m against dp2: the step's
 *                 "other", after the update, with and without --out).
 * T minus the phases' medians, not the median of each step's rest, so that
 * the plan at this point sums to the run's median step.  Where the table's
 * exposed communication E at this point is more than the run's whole wait
 * W, the table is scaled down (k in [0.001, 1], by bisection) until it is
 * W: at this p the table stands for the run's all-reduces, and a table
 * timed in a busy moment must not outweigh the run's steps (*table_scale =
 * k, 1 as measured).  Returns the overlap; writes the gather wait and the
 * run's median step. */
static double run_terms(const struct run_recs *rr, struct point *pt, double comm_cpu, int sgd, double *cal,
                        double *gather_wait, double *step, double *table_scale) {
    int64_t k0 = RUN_WARMUP, n = rr->n;
    double T = median_from(rr->v[RUN_STEP], k0, n), F = median_from(rr->v[RUN_FWD], k0, n);
    double Bk = median_from(rr->v[RUN_BWD], k0, n), W = median_from(rr->v[RUN_EXPOSED], k0, n);
    double O = median_from(rr->v[RUN_OPT], k0, n), b = (double)(pt->batch / pt->P), psi = (double)pt->m->num_params;
    cal[CAL_FWD] = F / b, cal[CAL_SGD + !sgd] = O / psi;
    double k = 1;
    struct dp_plan_result r = run_point(pt, k, Bk, b, comm_cpu, O / psi, cal);
    if (r.exposed_s > W) {
        double lo = 1e-3, hi = 1;
        for (int i = 0; i < 40; i++) {
            double mid = 0.5 * (lo + hi);
            dp_plan_result_free(&r);
            r = run_point(pt, mid, Bk, b, comm_cpu, O / psi, cal);
            if (r.exposed_s > W) hi = mid;
            else lo = mid;
        }
        k = lo;
        dp_plan_result_free(&r);
        r = run_point(pt, k, Bk, b, comm_cpu, O / psi, cal);
        scale_table(pt, k);
    }
    *table_scale = k;
    double ov = r.overlap_s;
    cal[CAL_STEAL] = comm_cpu * ov, cal[CAL_COMPUTE] = F + Bk;
    cal[CAL_STRAGGLE_CV] = F + Bk > 0 ? fmax(0, W - r.exposed_s) / (F + Bk) : 0;
    cal[CAL_COMPUTE_CV] = cal[CAL_STRAGGLE_CV] / dp_plan_normal_max(pt->P);
    *gather_wait = fmax(0, T - F - Bk - W - O - r.data_s - r.zero_s - r.gather_s);
    *step = T;
    dp_plan_result_free(&r);
    return ov;
}

/* ---- the command ---------------------------------------------------------------------- */

int dptrain_cmd_calibrate(int argc, char **argv) {
    int P = 2, iters = 20, citers = 20, mpi = 0, threads = 1, algo = DP_ALGO_AUTO, sgd = 1, gathers = 0;
    long long lo = 4096, hi = 16 << 20, batch = 128;
    const char *run = NULL, *out = NULL, *model = NULL, *input = "1,28,28", *v;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(help_calibrate, stdout);
            return 0;
        }
        if (dptrain_take(argc, argv, &i, "--workers", &v)) P = (int)dptrain_int_arg(a, v, 1, 64);
        else if (dptrain_take(argc, argv, &i, "--backend", &v)) {
            if (!strcmp(v, "mpi")) mpi = 1;
            else if (strcmp(v, "thread")) die("--backend: expected thread or mpi, got '%s'", v);
        } else if (dptrain_take(argc, argv, &i, "--min-bytes", &v)) lo = dptrain_int_arg(a, v, 64, 1LL << 32);
        else if (dptrain_take(argc, argv, &i, "--max-bytes", &v)) hi = dptrain_int_arg(a, v, 64, 1LL << 32);
        else if (dptrain_take(argc, argv, &i, "--iters", &v)) iters = (int)dptrain_int_arg(a, v, 1, 500);
        else if (dptrain_take(argc, argv, &i, "--model", &v)) model = v;
        else if (dptrain_take(argc, argv, &i, "--input", &v)) input = v;
        else if (dptrain_take(argc, argv, &i, "--batch", &v)) batch = dptrain_int_arg(a, v, 1, 1LL << 30);
        else if (dptrain_take(argc, argv, &i, "--threads", &v)) threads = (int)dptrain_int_arg(a, v, 1, 256);
        else if (dptrain_take(argc, argv, &i, "--algo", &v)) {
            if ((algo = dp_comm_algo_parse(v)) < 0) die("--algo: '%s' (expected auto, ring, rhd, direct or native)", v);
        } else if (dptrain_take(argc, argv, &i, "--compute-iters", &v)) citers = (int)dptrain_int_arg(a, v, 1, CAL_MAX_ITERS);
        else if (dptrain_take(argc, argv, &i, "--run", &v)) run = v;
        else if (dptrain_take(argc, argv, &i, "--optim", &v)) {
            if (strcmp(v, "sgd") && strcmp(v, "adamw")) die("--optim: expected sgd or adamw, got '%s'", v);
            sgd = !strcmp(v, "sgd");
        }
        else if (!strcmp(a, "--metrics")) gathers = 1;
        else if (dptrain_take(argc, argv, &i, "--out", &v)) out = v;
        else die("unknown option '%s' (see 'dptrain calibrate --help')", a);
    }
    size_t sizes[64];
    double bytes[64];
    int n = 0;
    for (long long s = lo; s <= hi && n < 64; s *= 4) sizes[n] = (size_t)s, bytes[n] = (double)(s / 4 * 4), n++;
    if (n < 2) die("--min-bytes .. --max-bytes must hold two sizes at least (x4 apart)");
    struct dp_comm *job = NULL;
    int me = 0;
    if (mpi) {
        job = dptrain_job_init();
        P = dp_comm_world(job), me = dp_comm_rank(job);
        if (P < 2) die("--backend mpi: needs 2 processes or more (mpirun -np N dptrain calibrate --backend mpi ...)");
    } else if (P < 2) die("--workers %d: needs 2 or more", P);
    struct dp_model *m = NULL;
    if (model) {
        long long c = 1, h = 28, w = 28;
        if (sscanf(input, "%lld,%lld,%lld", &c, &h, &w) != 3 || c < 1 || h < 1 || w < 1)
            die("--input: '%s' is not C,H,W", input);
        if (dp_model_from_spec(&m, model, c, h, w)) die("--model %s: %s", model, dp_errmsg());
        if (batch < P) die("--batch %lld: fewer samples than the %d workers", batch, P);
    }
    double per_sample = NAN;
    struct run_recs rr = {.workers = NAN};
    if (run) {
        dptrain_each_record(run, run_add, &rr);
        /* with --model the run is one of this model at these workers (a
         * --max-steps run within an epoch has no epoch record) */
        if (m && rr.workers != rr.workers) rr.workers = P;
        if (!rr.n || !(rr.workers >= 1))
            die("--run %s: needs step records (forward_s, backward_s, samples) and an epoch record (workers)", run);
        per_sample = median_from(rr.v[RUN_SAMPLE], 0, rr.n) * rr.workers;
        if (m) {
            if (rr.workers != P) die("--run %s: a run of %g workers, not the --workers %d calibrated", run, rr.workers, P);
            if (rr.n <= RUN_WARMUP)
                die("--run %s: %lld step records; the step terms need more than the first %d (the warm-up)", run,
                    (long long)rr.n, RUN_WARMUP);
            for (int64_t k = 0; k < rr.n; k++) {
                if (rr.v[RUN_SAMPLES][k] != (double)batch)
                    die("--run %s: a step of %g samples, not the --batch %lld calibrated", run, rr.v[RUN_SAMPLES][k],
                        batch);
                if (!(rr.v[RUN_STEP][k] >= 0 && rr.v[RUN_EXPOSED][k] >= 0 && rr.v[RUN_OPT][k] >= 0))
                    die("--run %s: step record %lld has no step_s, comm_exposed_s or optimizer_s", run, (long long)k + 1);
            }
        }
    }
    double gamma = measure_gamma((size_t)4 << 20);
    const enum dp_comm_algo comm_algo[2] = {DP_ALGO_RING, DP_ALGO_RHD};
    const int plan_algo[2] = {DP_PLAN_RING, DP_PLAN_RHD};
    /* the plan's algorithm as the reducer's: ring, rhd, or for auto the plan's best per bucket */
    struct point pt = {.m = m, .P = P, .batch = batch, .gamma = gamma, .n = n,
                       .algo = algo == DP_ALGO_RHD ? DP_PLAN_RHD : algo == DP_ALGO_RING ? DP_PLAN_RING : -1};
    double *alpha = pt.alpha, *beta = pt.beta, (*tt)[64] = pt.tt;
    memcpy(pt.bytes, bytes, sizeof bytes);
    /* The table in up to CAL_ROUNDS rounds of iters / rounds iterations (3
     * at least: the median of each round stands one preempted iteration),
     * the algorithms taking turns, and per size the median over the rounds:
     * the measurement spread over time, so that one busy moment of the
     * machine (a burst of another process) moves one round, not the table
     * (one burst of 10 iterations gave 583, 115 and 150 us at 4 MiB a minute
     * apart). */
    int rounds = cal_rounds(iters);
    double rt[2][64][CAL_ROUNDS];
    for (int q = 0; q < rounds; q++)
        for (int k = 0; k < 2; k++) {
            double t[64];
            int it = iters / rounds + (q < iters % rounds);
            if (job) dptrain_allreduce_medians_comm(job, comm_algo[k], sizes, n, it, t);
            else dptrain_allreduce_medians(P, comm_algo[k], sizes, n, it, t);
            for (int s = 0; s < n; s++) rt[k][s][q] = t[s];
        }
    for (int k = 0; k < 2; k++) {
        for (int s = 0; s < n; s++) tt[k][s] = median(rt[k][s], rounds);
        if (dp_plan_fit(plan_algo[k], P, gamma, bytes, tt[k], n, &alpha[k], &beta[k])) die("%s", dp_errmsg());
    }
    double cal[CAL_N], comm_cpu = 0, overlap = 0, gather_wait = 0, run_step = NAN, table_scale = 1;
    if (m) {
        struct cal c = {.m = m, .P = job ? 1 : P, .B = batch / P, .iters = citers, .threads = threads, .job = job,
                        .algo = (enum dp_comm_algo)algo, .optim = sgd ? DP_OPTIM_SGD : DP_OPTIM_ADAMW,
                        .gathers = gathers};
        calibrate_compute(&c, cal);
        /* --metrics: the steps' all-gather beyond the plan's formula for it
         * (a ring all-gather of P doubles on the fitted ring link), as plan
         * adds it: gathers x (formula + gather_wait_s); --run replaces it */
        if (gathers) gather_wait = fmax(0, cal[CAL_GATHER] - (P - 1) * (alpha[0] + 8 * beta[0]));
        struct dp_plan_result r = plan_point(&pt, cal, 0, 0);
        overlap = r.overlap_s;
        dp_plan_result_free(&r);
        comm_cpu = overlap > 0 ? fmin(1, cal[CAL_STEAL] / overlap) : 0;
        if (run) overlap = run_terms(&rr, &pt, comm_cpu, sgd, cal, &gather_wait, &run_step, &table_scale);
    }
    for (int k = 0; k < RUN_N; k++) free(rr.v[k]);
    if (me != 0) { /* rank 0 writes */
        dp_model_free(m);
        dptrain_job_free();
        return 0;
    }
    FILE *f = out ? fopen(out, "w") : stdout;
    if (!f) die("%s: %s", out, strerror(errno));
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    fprintf(f, "{\"kind\": \"profile\", \"version\": %d, \"backend\": \"%s\", \"level\": \"%s\", \"workers\": %d, "
               "\"cores\": %ld, \"gamma_s\": %.6g, \"alpha_s\": %.6g, \"beta_s\": %.6g",
            m ? 4 : 2, job ? "mpi" : "thread", job ? "process" : "thread", P, cores, gamma, alpha[0], beta[0]);
    for (int k = 0; k < 2; k++)
        fprintf(f, ", \"%s_alpha_s\": %.6g, \"%s_beta_s\": %.6g", dp_plan_algo_name(plan_algo[k]), alpha[k],
                dp_plan_algo_name(plan_algo[k]), beta[k]);
    if (m) {
        fprintf(f, ", \"model\": \"%s\", \"batch\": %lld, \"fwd_sample_s\": %.6g, \"bwd_sample_s\": %.6g, "
                   "\"fwd_sample_1_s\": %.6g, \"bwd_sample_1_s\": %.6g, \"sgd_param_s\": %.6g, "
                   "\"adamw_param_s\": %.6g, \"zero_param_s\": %.6g, \"data_sample_s\": %.6g, \"comm_cpu\": %.4f, "
                   "\"steal_s\": %.6g, \"overlap_s\": %.6g, \"compute_s\": %.6g, \"straggle_cv\": %.6g, "
                   "\"compute_cv\": %.6g, \"gathers\": %d, \"gather_s\": %.6g, \"gather_wait_s\": %.6g",
                model, batch, cal[CAL_FWD], cal[CAL_BWD], cal[CAL_FWD1], cal[CAL_BWD1], cal[CAL_SGD],
                cal[CAL_ADAMW], cal[CAL_ZERO], cal[CAL_DATA], comm_cpu, cal[CAL_STEAL], overlap, cal[CAL_COMPUTE],
                cal[CAL_STRAGGLE_CV], cal[CAL_COMPUTE_CV], gathers, cal[CAL_GATHER], gather_wait);
        if (run)
            fprintf(f, ", \"run_steps\": %lld, \"run_step_s\": %.6g, \"table_scale\": %.6g", (long long)(rr.n - RUN_WARMUP),
                    run_step, table_scale);
        if (per_sample != per_sample) per_sample = cal[CAL_FWD] + cal[CAL_BWD];
    }
    if (per_sample == per_sample) fprintf(f, ", \"sample_s\": %.6g", per_sample);
    fprintf(f, ", \"sizes\": [");
    for (int s = 0; s < n; s++) fprintf(f, "%s%.0f", s ? ", " : "", bytes[s]);
    for (int k = 0; k < 2; k++) {
        fprintf(f, "], \"%s_measured_s\": [", dp_plan_algo_name(plan_algo[k]));
        for (int s = 0; s < n; s++) fprintf(f, "%s%.6g", s ? ", " : "", tt[k][s]);
    }
    fprintf(f, "]}\n");
    if (out) {
        if (fclose(f) != 0) die("%s: %s", out, strerror(errno));
        printf("wrote %s (%s level, %d workers): gamma %.3g ns/B", out, job ? "process" : "thread", P, gamma * 1e9);
        for (int k = 0; k < 2; k++)
            printf("  %s alpha %.3g us beta %.3g ns/B (%.3g GB/s)", dp_plan_algo_name(plan_algo[k]), alpha[k] * 1e6,
                   beta[k] * 1e9, beta[k] > 0 ? 1 / beta[k] / 1e9 : INFINITY);
        if (per_sample == per_sample) printf("  %.4g ms per sample", per_sample * 1e3);
        /* plan --model refuses a profile with no compute (it would be a FLOP
         * estimate): say so here, where the profile is made */
        else printf("  (the link only: plan --model SPEC needs calibrate --model SPEC)");
        printf("\n");
        if (m)
            printf("%s, %lld per worker: forward %.4g + backward %.4g us per sample (alone %.4g + %.4g); "
                   "optimizer %.3g (sgd) %.3g (adamw) ns per parameter; zeroing %.3g ns per parameter; "
                   "data %.4g us per sample; %s: backward +%.4g ms beside %.4g ms of "
                   "all-reduce (comm_cpu %.2f), the slowest worker +%.2f%% (sigma %.2f%%) of %.4g ms",
                   model, batch / P, cal[CAL_FWD] * 1e6, cal[CAL_BWD] * 1e6, cal[CAL_FWD1] * 1e6, cal[CAL_BWD1] * 1e6,
                   cal[CAL_SGD] * 1e9, cal[CAL_ADAMW] * 1e9, cal[CAL_ZERO] * 1e9, cal[CAL_DATA] * 1e6,
                   run ? "the run's steps" : "steps with the reducer", cal[CAL_STEAL] * 1e3, overlap * 1e3, comm_cpu,
                   100 * cal[CAL_STRAGGLE_CV], 100 * cal[CAL_COMPUTE_CV], cal[CAL_COMPUTE] * 1e3);
        if (m && gathers && !run)
            printf("; the metrics all-gather %.4g ms per step, %.4g ms beyond its formula", cal[CAL_GATHER] * 1e3,
                   gather_wait * 1e3);
        if (m && run)
            printf("; the run's median step %.4g ms over %lld steps, %.4g ms of it after the update (the metrics "
                   "all-gather's wait); the table x %.3g",
                   run_step * 1e3, (long long)(rr.n - RUN_WARMUP), gather_wait * 1e3, table_scale);
        if (m) printf("\n");
    }
    dp_model_free(m);
    dptrain_job_free();
    return 0;
}
