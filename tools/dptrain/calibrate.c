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
 *   comm_cpu           the compute one all-reduce second takes away: each worker
 *                      runs forward + backward again while a thread of its own
 *                      all-reduces the gradient back to back (the reducer's
 *                      progress thread), and
 *                          comm_cpu = (T_with - T_alone) / min(T_with, T_comm)
 *                      clamped to 0..1 (T_comm: the time spent in the all-reduces)
 * Each worker keeps the median over --compute-iters iterations (after two
 * warm-up ones); the profile takes the slowest worker's (the step waits for
 * it; forward and backward: the median over the passes of the slowest
 * worker in each pass), comm_cpu the workers' mean.
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
#include "dp/nn.h"
#include "dp/optim.h"
#include "dp/plan.h"
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
    "    AdamW), zeroing the gradient, the loader's seconds per sample, and comm_cpu: the\n"
    "    compute that an all-reduce running beside it takes away (0..1);\n"
    "  - with --run: the forward + backward seconds per sample of a run's step records.\n"
    "Writes one JSON object (profile version 2).\n"
    "\n"
    "  --backend B      thread: P threads of this process [thread]; mpi: one worker per\n"
    "                   process, every process of the job (mpirun -np N dptrain calibrate\n"
    "                   --backend mpi ...); rank 0 writes the profile\n"
    "  --workers P      threads (thread backend) [2]\n"
    "  --min-bytes N    [4096]   --max-bytes N [16777216]   --iters N per size [20]\n"
    "  --model SPEC     mlp | cnn | resnet | mlp:... | gpt:... (as train)\n"
    "  --input C,H,W    input shape of an image model [1,28,28]\n"
    "  --batch B        global batch: each worker computes B / P samples [128]\n"
    "  --threads N      compute threads per worker (as train's --threads) [1]\n"
    "  --compute-iters K  timed iterations per compute phase [20]\n"
    "  --run RUN        a run folder or metrics.jsonl (dptrain train --out RUN)\n"
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

/* A step record's "samples" is the global batch and its forward_s and
 * backward_s are rank 0's, so rank 0's seconds per sample are
 * (forward + backward) / (samples / workers), workers from the epoch
 * records (equal shares: not for --balance runs). */
struct per_sample {
    double *v;
    int64_t n, cap;
    double workers;
};
static void sample_add(const struct dp_json_obj *o, void *arg) {
    struct per_sample *ps = arg;
    if (dp_json_str_is(o, "kind", "epoch")) ps->workers = dp_json_num(o, "workers", ps->workers);
    if (!dp_json_str_is(o, "kind", "step")) return;
    double f = dp_json_num(o, "forward_s", NAN), b = dp_json_num(o, "backward_s", NAN), n = dp_json_num(o, "samples", NAN);
    if (!(f >= 0 && b >= 0 && n > 0)) return;
    if (ps->n == ps->cap) {
        ps->cap = ps->cap ? 2 * ps->cap : 256;
        ps->v = realloc(ps->v, sizeof(double) * (size_t)ps->cap);
        if (!ps->v) die("out of memory");
    }
    ps->v[ps->n++] = (f + b) / n;
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

/* ---- compute ------------------------------------------------------------------------ */

/* One worker's results (its medians); the profile takes the slowest worker's
 * (forward and backward: per pass, see calibrate_compute). */
enum { CAL_FWD1, CAL_BWD1, CAL_FWD, CAL_BWD, CAL_SGD, CAL_ADAMW, CAL_ZERO, CAL_DATA, CAL_COMM_CPU, CAL_N };
#define CAL_MAX_ITERS 1000

struct cal {
    const struct dp_model *m;
    int P;                      /* worker threads in this process */
    int64_t B;                  /* samples per worker */
    int iters, threads;         /* threads: compute threads per worker (train's --threads) */
    struct dp_comm *job;        /* --backend mpi: the process communicator (P = 1), else NULL */
    struct dp_comm_world *w;    /* thread backend: the all-reduce beside compute */
    pthread_barrier_t bar;
    double ar_s;                /* the fit's time of one all-reduce of the gradient */
    double comm_iters;          /* set by worker 0: all-reduces run beside compute */
    const struct dp_dataset *ds;/* image models: the loader's data set */
};

struct cal_job {
    struct cal *c;
    int rank;
    struct dp_replica rep;
    struct dp_batch b;
    struct dp_comm *comm;       /* the all-reduce thread's */
    float *ar;                  /* its buffer (the gradient's size) */
    double comm_busy;
    double v[CAL_N];
    double tf[CAL_MAX_ITERS], tb[CAL_MAX_ITERS]; /* the passes all workers started together */
};

/* All workers of the job at the same point: the threads, then the processes. */
static void cal_sync(struct cal_job *j) {
    pthread_barrier_wait(&j->c->bar);
    if (j->c->job && dp_comm_barrier(j->c->job)) die("%s", dp_errmsg());
}

/* iters timed forward + backward passes (after two warm-up ones): the
 * medians per sample in fwd, bwd and their sum in *sum.  With sync, the
 * workers start every pass together, as the steps of a synchronous run do
 * (the step's all-reduce lines them up): on a loaded machine the kernel
 * treats a thread that waits between bursts differently from one that
 * computes without a break, and the run's workers are the former. */
static void cal_sync(struct cal_job *j);
static void cal_compute(struct cal_job *j, int sync, double *fwd, double *bwd, double *sum) {
    struct cal *c = j->c;
    double *tf = j->tf, *tb = j->tb, kf[CAL_MAX_ITERS], kb[CAL_MAX_ITERS];
    if (!sync) tf = kf, tb = kb; /* (only the synchronised passes are kept) */
    *sum = 0;
    for (int i = -2; i < c->iters; i++) {
        if (sync) cal_sync(j);
        memset(j->rep.grads, 0, sizeof(float) * (size_t)c->m->num_params);
        struct dp_pass pass = {.training = 1, .backward = 1, .seed = 1, .loss_scale = 0};
        if (dp_model_run(c->m, &j->rep, &j->b, &pass)) die("calibrate: %s", dp_errmsg());
        if (i < 0) continue;
        tf[i] = pass.t_forward, tb[i] = pass.t_backward;
        *sum += pass.t_forward + pass.t_backward;
    }
    memcpy(kf, tf, sizeof(double) * (size_t)c->iters), memcpy(kb, tb, sizeof(double) * (size_t)c->iters);
    *fwd = median(kf, c->iters) / (double)c->B;
    *bwd = median(kb, c->iters) / (double)c->B;
}

/* The reducer's progress thread, as calibration has it: all-reduces of the
 * whole gradient, back to back. */
static void *cal_comm_main(void *arg) {
    struct cal_job *j = arg;
    double t0 = dp_time();
    for (double k = 0; k < j->c->comm_iters; k++)
        if (dp_comm_allreduce(j->comm, j->ar, j->c->m->num_params, DP_DTYPE_F32, DP_ALGO_AUTO))
            die("calibrate: %s", dp_errmsg());
    j->comm_busy = dp_time() - t0;
    return NULL;
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
    int tokens = dp_model_spec_reads_tokens(m->spec);
    int64_t ntarg = tokens ? B * per : B;
    if (dp_replica_init(&j->rep, m, B)) die("calibrate: %s", dp_errmsg());
    dp_model_init_params(m, &j->rep, 1 + (uint64_t)j->rank);
    /* random inputs and targets (the time does not depend on the values) */
    float *x = tokens ? NULL : dp_malloc(sizeof(float) * (size_t)(B * per));
    int32_t *tk = tokens ? dp_malloc(sizeof(int32_t) * (size_t)(B * per)) : NULL, *y = dp_malloc(sizeof(int32_t) * (size_t)ntarg);
    int64_t *idx = dp_malloc(sizeof(int64_t) * (size_t)B);
    j->ar = dp_calloc((size_t)m->num_params, sizeof(float));
    if ((!x && !tk) || !y || !idx || !j->ar) die("out of memory");
    for (int64_t i = 0; i < B * per; i++) {
        if (x) x[i] = dp_rng_uniform(7, DP_RNG_USER, (uint64_t)j->rank, (uint64_t)i);
        else tk[i] = (int32_t)(dp_rng_u32(7, DP_RNG_USER, (uint64_t)j->rank, (uint64_t)i) % (uint32_t)V);
    }
    for (int64_t i = 0; i < ntarg; i++) y[i] = (int32_t)(dp_rng_u32(8, DP_RNG_USER, (uint64_t)j->rank, (uint64_t)i) % (uint32_t)V);
    for (int64_t i = 0; i < B; i++) idx[i] = i;
    j->b = (struct dp_batch){.B = B, .x = x, .tokens = tk, .targets = y, .sample_idx = idx};
    if (c->w && dp_comm_thread_init(&j->comm, c->w, j->rank)) die("calibrate: %s", dp_errmsg());
    if (c->job) j->comm = c->job;
    double sum, sum_with, f, b;

    /* 1. worker 0 alone */
    cal_sync(j);
    int alone = j->rank == 0 && (!c->job || dp_comm_rank(c->job) == 0);
    if (alone) cal_compute(j, 0, &j->v[CAL_FWD1], &j->v[CAL_BWD1], &sum);
    cal_sync(j);
    /* 2. every worker at once */
    cal_compute(j, 1, &j->v[CAL_FWD], &j->v[CAL_BWD], &sum);
    /* 3. the same with the all-reduce beside it: as many all-reduces as the
     * fit says last as long as the compute did (worker 0's count for all) */
    if (j->rank == 0) c->comm_iters = ceil(sum / c->ar_s) < 1 ? 1 : ceil(sum / c->ar_s) > 1e5 ? 1e5 : ceil(sum / c->ar_s);
    cal_sync(j);
    if (c->job && dp_comm_broadcast(c->job, &c->comm_iters, 1, DP_DTYPE_F64, 0, DP_ALGO_AUTO)) die("%s", dp_errmsg());
    cal_sync(j);
    pthread_t th;
    if (pthread_create(&th, NULL, cal_comm_main, j)) die("cannot start a thread");
    cal_compute(j, 0, &f, &b, &sum_with); /* (the all-reduces keep their own pace) */
    pthread_join(th, NULL);
    double over = sum_with < j->comm_busy ? sum_with : j->comm_busy, cpu = over > 0 ? (sum_with - sum) / over : 0;
    j->v[CAL_COMM_CPU] = cpu < 0 ? 0 : cpu > 1 ? 1 : cpu;
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
    dp_free(x), dp_free(tk), dp_free(y), dp_free(idx), dp_free(j->ar);
    dp_replica_free(&j->rep);
    return NULL;
}

/* Runs the compute phases on P threads (or this process's one worker of the
 * job) and leaves the job's figures in out[CAL_N]. */
static void calibrate_compute(struct cal *c, double *out) {
    c->ds = NULL;
    struct dp_dataset ds = {0};
    if (!dp_model_spec_reads_tokens(c->m->spec)) {
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
    if (!c->job && dp_comm_thread_world_init(&c->w, c->P, &cp)) die("%s", dp_errmsg());
    struct cal_job *j = calloc((size_t)c->P, sizeof *j);
    pthread_t *th = calloc((size_t)c->P, sizeof *th);
    if (!j || !th) die("out of memory");
    for (int r = 0; r < c->P; r++) {
        j[r] = (struct cal_job){.c = c, .rank = r};
        if (pthread_create(&th[r], NULL, cal_main, &j[r])) die("cannot start worker threads");
    }
    for (int r = 0; r < c->P; r++) pthread_join(th[r], NULL);
    /* worker 0 alone; the slowest worker of the rest; comm_cpu's mean.  Over
     * processes: every rank's values to every rank, then the same. */
    int nproc = c->job ? dp_comm_world(c->job) : 1, me = c->job ? dp_comm_rank(c->job) : 0;
    double *all = calloc((size_t)(nproc * c->P * CAL_N), sizeof(double));
    if (!all) die("out of memory");
    for (int r = 0; r < c->P; r++) memcpy(all + ((size_t)me * c->P + r) * CAL_N, j[r].v, sizeof(double) * CAL_N);
    if (c->job && dp_comm_allgather(c->job, all, (int64_t)nproc * c->P * CAL_N, DP_DTYPE_F64, DP_ALGO_AUTO))
        die("%s", dp_errmsg());
    for (int k = 0; k < CAL_N; k++) out[k] = 0;
    out[CAL_FWD1] = all[CAL_FWD1], out[CAL_BWD1] = all[CAL_BWD1];
    for (int r = 0; r < nproc * c->P; r++) {
        const double *v = all + (size_t)r * CAL_N;
        for (int k = CAL_FWD; k < CAL_N; k++)
            if (k == CAL_COMM_CPU) out[k] += v[k] / (nproc * c->P);
            else if (v[k] > out[k]) out[k] = v[k];
    }
    /* A synchronous step waits for its slowest worker, pass by pass: the
     * forward and backward of the profile are the medians over the passes of
     * the slowest worker's time in that pass (on a loaded machine a different
     * worker is slowest each time, so this is more than the slowest worker's
     * median).  Backward: the median of the slowest forward + backward minus
     * the median of the slowest forward. */
    int W = nproc * c->P, K = c->iters;
    double *pt = calloc((size_t)W * K * 2, sizeof(double)), *mf = malloc(sizeof(double) * K), *ms = malloc(sizeof(double) * K);
    if (!pt || !mf || !ms) die("out of memory");
    for (int r = 0; r < c->P; r++)
        for (int i = 0; i < K; i++) {
            pt[(((size_t)me * c->P + r) * K + i) * 2] = j[r].tf[i];
            pt[(((size_t)me * c->P + r) * K + i) * 2 + 1] = j[r].tb[i];
        }
    if (c->job && dp_comm_allgather(c->job, pt, (int64_t)W * K * 2, DP_DTYPE_F64, DP_ALGO_AUTO)) die("%s", dp_errmsg());
    for (int i = 0; i < K; i++) {
        mf[i] = ms[i] = 0;
        for (int r = 0; r < W; r++) {
            double f = pt[((size_t)r * K + i) * 2], b = pt[((size_t)r * K + i) * 2 + 1];
            mf[i] = f > mf[i] ? f : mf[i], ms[i] = f + b > ms[i] ? f + b : ms[i];
        }
    }
    double f = median(mf, K), fb = median(ms, K);
    out[CAL_FWD] = f / (double)c->B;
    out[CAL_BWD] = (fb > f ? fb - f : out[CAL_BWD] * (double)c->B) / (double)c->B;
    free(pt), free(mf), free(ms);
    free(all), free(j), free(th);
    if (c->w) dp_comm_thread_world_free(c->w);
    pthread_barrier_destroy(&c->bar);
    dp_free(ds.x), dp_free(ds.y);
}

/* ---- the command ---------------------------------------------------------------------- */

int dptrain_cmd_calibrate(int argc, char **argv) {
    int P = 2, iters = 20, citers = 20, mpi = 0, threads = 1;
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
        else if (dptrain_take(argc, argv, &i, "--compute-iters", &v)) citers = (int)dptrain_int_arg(a, v, 1, CAL_MAX_ITERS);
        else if (dptrain_take(argc, argv, &i, "--run", &v)) run = v;
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
    if (run) {
        struct per_sample ps = {.workers = NAN};
        dptrain_each_record(run, sample_add, &ps);
        if (!ps.n || !(ps.workers >= 1)) {
            free(ps.v);
            die("--run %s: needs step records (forward_s, backward_s, samples) and an epoch record (workers)", run);
        }
        per_sample = median(ps.v, ps.n) * ps.workers;
        free(ps.v);
    }
    double gamma = measure_gamma((size_t)4 << 20);
    const enum dp_comm_algo comm_algo[2] = {DP_ALGO_RING, DP_ALGO_RHD};
    const int plan_algo[2] = {DP_PLAN_RING, DP_PLAN_RHD};
    double alpha[2], beta[2], tt[2][64];
    for (int k = 0; k < 2; k++) {
        if (job) dptrain_allreduce_medians_comm(job, comm_algo[k], sizes, n, iters, tt[k]);
        else dptrain_allreduce_medians(P, comm_algo[k], sizes, n, iters, tt[k]);
        if (dp_plan_fit(plan_algo[k], P, gamma, bytes, tt[k], n, &alpha[k], &beta[k])) die("%s", dp_errmsg());
    }
    double cal[CAL_N];
    if (m) {
        /* the fit's ring all-reduce of the whole gradient, for comm_cpu */
        struct dp_plan_net net = {.workers = P, .shards = 1, .gamma_s = gamma};
        net.alpha_s[DP_PLAN_RING] = alpha[0], net.beta_s[DP_PLAN_RING] = beta[0];
        struct cal c = {.m = m, .P = job ? 1 : P, .B = batch / P, .iters = citers, .threads = threads, .job = job,
                        .ar_s = dp_plan_allreduce_s(DP_PLAN_RING, 4.0 * (double)m->num_params, &net)};
        if (!(c.ar_s > 0)) c.ar_s = 1e-6;
        calibrate_compute(&c, cal);
    }
    if (me != 0) { /* rank 0 writes */
        dp_model_free(m);
        dptrain_job_free();
        return 0;
    }
    FILE *f = out ? fopen(out, "w") : stdout;
    if (!f) die("%s: %s", out, strerror(errno));
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    fprintf(f, "{\"kind\": \"profile\", \"version\": 2, \"backend\": \"%s\", \"level\": \"%s\", \"workers\": %d, "
               "\"cores\": %ld, \"gamma_s\": %.6g, \"alpha_s\": %.6g, \"beta_s\": %.6g",
            job ? "mpi" : "thread", job ? "process" : "thread", P, cores, gamma, alpha[0], beta[0]);
    for (int k = 0; k < 2; k++)
        fprintf(f, ", \"%s_alpha_s\": %.6g, \"%s_beta_s\": %.6g", dp_plan_algo_name(plan_algo[k]), alpha[k],
                dp_plan_algo_name(plan_algo[k]), beta[k]);
    if (m) {
        fprintf(f, ", \"model\": \"%s\", \"batch\": %lld, \"fwd_sample_s\": %.6g, \"bwd_sample_s\": %.6g, "
                   "\"fwd_sample_1_s\": %.6g, \"bwd_sample_1_s\": %.6g, \"sgd_param_s\": %.6g, "
                   "\"adamw_param_s\": %.6g, \"zero_param_s\": %.6g, \"data_sample_s\": %.6g, \"comm_cpu\": %.4f",
                model, batch, cal[CAL_FWD], cal[CAL_BWD], cal[CAL_FWD1], cal[CAL_BWD1], cal[CAL_SGD],
                cal[CAL_ADAMW], cal[CAL_ZERO], cal[CAL_DATA], cal[CAL_COMM_CPU]);
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
        printf("\n");
        if (m)
            printf("%s, %lld per worker: forward %.4g + backward %.4g us per sample (alone %.4g + %.4g); "
                   "optimizer %.3g (sgd) %.3g (adamw) ns per parameter; zeroing %.3g ns per parameter; "
                   "data %.4g us per sample; comm_cpu %.2f\n",
                   model, batch / P, cal[CAL_FWD] * 1e6, cal[CAL_BWD] * 1e6, cal[CAL_FWD1] * 1e6, cal[CAL_BWD1] * 1e6,
                   cal[CAL_SGD] * 1e9, cal[CAL_ADAMW] * 1e9, cal[CAL_ZERO] * 1e9, cal[CAL_DATA] * 1e6,
                   cal[CAL_COMM_CPU]);
    }
    dp_model_free(m);
    dptrain_job_free();
    return 0;
}
