/* The training loop: one or P data-parallel workers.
 *
 * Each worker is a thread holding a full replica (parameters, gradients,
 * optimizer state) and its own loader that yields its share of every global
 * batch.  One optimizer step:
 *
 *   for each of the `accum` micro-batches:
 *       loader.next -> forward -> backward: sum over the worker's samples of
 *       the per-sample gradients, each times 1/N (N = samples in the global
 *       batch, all workers; with accumulation the 1/N is applied at the end)
 *       on the last micro-batch the reducer all-reduces (sums) gradient buckets
 *       as backward finishes them, overlapping the rest of backward
 *   wait for all buckets -> non-finite check -> [clip] -> lr = schedule(step)
 *   -> optimizer step
 *
 * Summing over workers what each computed as (1/N) * its per-sample sum
 * gives the gradient of the mean loss over the global batch whatever the
 * split: P workers with global batch N train the
 * same model as one worker with batch N, to float rounding.  The position
 * (epoch, step in epoch) and the seed fix the data order, so a checkpoint
 * resumes the very same sequence of batches.  With P = 1 the single worker
 * runs in the caller's thread and no collective does any work.
 *
 * Positions.  A classifier's loss has one term per sample; a language
 * model's has one per position, T per window (the model's output is (T, V)).
 * The loss is the mean over every term of the global batch, so N above is
 * samples x positions per sample (t->pos, 1 for classifiers: their scale is
 * the same bits as before), and every reported loss is per term.
 *
 * Text.  A gpt model trains on a token file (--data tokens.bin): the loader
 * draws training windows by (seed, epoch, global index), and the end-of-epoch
 * evaluation runs on the fixed validation windows (docs/text.md). */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "dp/ddp.h"
#include "dp/ps.h"
#include "dp/train.h"
#include "run_folder.h"
#include "timeline.h"

/* Backup workers (--backup-workers b; see "backup workers" below): the
 * process's step slot, shared by its P workers under mu.  Published
 * gradients live in a ring of BACKUP_DEPTH slots (step s in s % D), so the
 * ranks that close a step may run up to D steps ahead of a late rank. */
#define BACKUP_DEPTH DP_BACKUP_DEPTH
struct backup {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int init;                       /* mu and cv initialised */
    int need;                       /* P - b: gradients accepted per step */
    int64_t open;                   /* the step collecting gradients; all before it are published */
    int count;                      /* gradients accepted for `open` so far */
    const float **src;              /* (P) the accepted ranks' gradient sums for `open`, else NULL */
    double *n;                      /* (P) their sample counts */
    int64_t *arrived;               /* (P) the last step each rank arrived at (-1: none) */
    float *upd[BACKUP_DEPTH];       /* step s's gradient (the accepted samples' mean) */
    int64_t upd_step[BACKUP_DEPTH]; /* the step a slot holds (-1: none) */
    int consumed[BACKUP_DEPTH];     /* workers that have taken it: the slot is free again at P */
    double upd_n[BACKUP_DEPTH];     /* samples accepted (0: no update to apply) */
    int upd_bad[BACKUP_DEPTH];      /* the gradient is not finite */
    unsigned char *acc[BACKUP_DEPTH]; /* (P) 1: the rank's gradient was accepted */
    int failed;                     /* a worker failed: every wait returns DP_ECANCELED */
    char why[400];
};

struct worker {
    struct dp_trainer *t;
    int rank;                  /* index in this process: w[rank] */
    int grank;                 /* rank in the whole job (= rank with one process) */
    struct dp_replica rep;
    struct dp_optim opt;       /* over zero.len floats: the whole slab, or with ZeRO this worker's shard */
    uint64_t zhash;            /* ZeRO 3: dp_replica_hash's value, folded as the ranges passed (end_epoch) */
    int ckpt_due;              /* --ckpt-every-steps fell on the epoch's last step: end_epoch checkpoints */
    struct dp_zero zero;
    struct dp_loader *loader;
    struct dp_comm *comm;
    struct dp_reducer red;
    struct dp_timeline tl;
    double *acc;               /* deterministic mode: fixed-point gradient sums (num_params) */
    float *buf_save;           /* --skip-nonfinite: the buffers before this step (num_buffers) */
    pthread_t thread;
    int started;
    int rc;
    char err[512];
    int32_t *etok, *etgt;      /* text: one evaluation chunk's windows (eval_chunk x ctx) */
    /* this epoch's sums */
    double loss_sum, t_fwd, t_bwd, t_opt, t_comm, t_exposed, wait0;
    double t_step0;            /* when this step started (dp_time) */
    double *arrival;           /* (nb) per bucket: sum over this epoch's steps of the time from
                                  the step's start to the bucket's reduction start */
    int64_t arrival_steps;     /* steps summed in arrival */
    int64_t correct, seen, skipped;
    int64_t step, epoch, in_epoch; /* this worker's copy of the position */
    /* --simulate-slow/--simulate-jitter (see pace below): this micro-batch's
     * multiplier, stall, start of compute and sleep so far */
    double pace_mult, pace_stall, pace_t0, pace_slept;
    double step_wait, step_slow;   /* this step's wait in the reduction, and simulated sleep */
    /* this epoch's gradient traffic (sums over its reducing steps, from the
     * reducer's per-step accounting) and compression times */
    double b_sent, b_recv, b_fp32, t_cz, t_dz;
    int64_t reduce_steps;
    double t_wait, t_slow;         /* this epoch's sums of them */
    double *waits;                 /* (G) every rank's step_wait, gathered per step (gather_waits) */
    /* --balance (see rebalance): samples and compute seconds since the last
     * re-plan, every rank's throughput EMA, the plan in force (units of
     * align samples per rank; NULL until the first change: equal) and the
     * all-gather buffer.  Each worker keeps its own copy; all are equal. */
    double bal_n, bal_s, bal_a;    /* ... and the update's seconds (the fixed part) over bal_k steps */
    int64_t bal_k;
    double stat_s;                 /* seconds in SyncBatchNorm's statistics all-reduces (stat_sync) */
    int64_t *bal_rate;             /* (G) samples/s x 1024, 0 = not measured yet */
    int64_t *bal_fix;              /* (G) EMA of the update's µs per step, 0 = not measured (or ZeRO) */
    int64_t *bal_fixu;             /* (G) the same in 1/1024 units of the split (dp_balance_plan) */
    int64_t *bal_share, *bal_new;  /* (G) */
    double *bal_buf;               /* (3G) */
    unsigned char *dropped;        /* (P) backup workers: this step's dropped ranks (1 = dropped) */
    int ndropped;
    int64_t ps_stale;              /* parameter server: the staleness of this worker's last push */
};

struct dp_trainer {
    cpu_set_t cpus;            /* --pin-threads: the process's affinity at dp_trainer_run */
    struct dp_train_params p;
    struct dp_dataset train, test;
    /* text (a token model): the token file, its split, the window length */
    int text;
    struct dp_tokens tokens;
    struct dp_text_split split;
    int64_t ctx, windows;      /* windows: training windows per epoch */
    int64_t pos;               /* loss terms per sample: 1, or T for a language model */
    int64_t eval_chunk;        /* samples per evaluation chunk */
    struct dp_model *model;
    struct dp_comm_world *world;
    struct worker *w;          /* w[0..P): this process's workers */
    int P;                     /* workers in this process */
    int G, base;               /* workers in the job, and the job rank of w[0] */
    int comm_progress;         /* the world's dp_comm_params.progress (auto resolved) */
    /* identical on every worker; written by each worker for itself and read
     * by rank 0 only at points where all workers are past a collective */
    int64_t step, epoch, step_in_epoch, batches_per_epoch, steps_per_epoch, max_batch;
    double t_origin;
    FILE *metrics;
    char metrics_path[4096];
    atomic_llong eval_next;    /* evaluate_shared: the next chunk of this process's block to claim */
    int slow_rank;             /* the last epoch's straggler (rank 0), -1 if none */
    double slow_lag;
    /* slow workers on purpose: per job rank, the compute factor (NULL when
     * no rank is slowed), the jitter, and whether either is on */
    double *slow_factor;
    struct dp_jitter jit;
    int simulate;
    /* gather every rank's wait after each step, for last_rank (G > 1 and
     * metrics written or a simulation on; the same on every rank, agreed) */
    int gather_waits;
    int64_t *last_count;       /* (G) rank 0: this epoch's steps each rank arrived last */
    int balance;               /* --balance on and G > 1 */
    int64_t bal_align;         /* split unit: det_chunk, or 1 */
    int64_t *rank_samples;     /* (G) rank 0: samples each rank took in the epoch (epoch_totals) */
    int64_t *share_samples;    /* (G) rank 0, with balance: the plan in samples, for the report */
    int bk_on;                 /* backup workers: steps go through bk, not the reducer */
    struct dp_backup_star *star; /* ... across processes (with `inter`): through rank 0 instead */
    struct backup bk;
    int64_t *dropped_count;    /* (G) rank 0, with bk_on: this epoch's steps each rank was dropped */
    char note[512];            /* for the caller: what the resume changed (dp_trainer_note) */
    /* parameter server (--mode async; see ps_loop): the server, whether the workers claim
     * batches dynamically (plain async) and the epoch's next batch to claim, batches per
     * epoch in that case, the divisor from server versions to schedule steps, the samples
     * pushed so far (for rank 0's step events) and the epoch's staleness (rank 0) */
    struct dp_ps *ps;
    struct dp_ps_net *psn;     /* ... across processes (`inter`, --servers S ranks): see ps_net_loop */
    int ps_on;                 /* either of them */
    int ps_servers;            /* shards (threads) or server ranks (mpi) */
    int ps_W;                  /* the job's workers: P on threads, processes - S on mpi */
    int ps_dynamic;
    atomic_llong ps_next, ps_samples;
    int64_t ps_batches, ps_div;
    struct dp_ps_hist ps_hist;
    int zsaving;               /* rank 0 inside checkpoint(): a multi-process ZeRO job's other workers send
                                  their pieces (zero_stream) */
    float *efstate;            /* multi-process job, rank 0 with out_dir: every rank's error-feedback
                                  state (G x dp_reducer_state_len), gathered by ef_gather_state */
    int64_t efstate_step;      /* the optimizer step efstate was gathered at (-1: never) */
    int red_check;             /* the reduced gradient is checked for non-finite values inside the
                                  all-reduce (reduced_check), not by every worker after it */
    atomic_llong red_bad;      /* ... 1 + the last step whose reduced gradient had one */
    atomic_llong stop_at;      /* a requested stop, in one process: the step after which every worker
                                  stops (INT64_MAX: none; stop_agreed); the parameter server's
                                  threads: the epoch at whose end they stop (ps_stop_note) */
    int64_t stopped;           /* the step a requested stop ended the run at (-1: none) */
};

static int red_check_possible(const struct dp_trainer *t);
static void reduced_check(void *arg, int64_t off, int64_t n);

struct dp_train_params dp_train_default_params(void) {
    struct dp_train_params p;
    memset(&p, 0, sizeof p);
    p.data_dir = "/usr/share/datasets/fashion-mnist";
    p.model = "mlp";
    p.workers = 1;
    p.accum = 1;
    p.bucket_cap_bytes = 0; /* auto (dp/ddp.h) */
    p.first_bucket_bytes = 1u << 20;
    p.overlap = 1;
    p.comm_spin_us = -1; /* auto */
    p.comm_progress = DP_PROGRESS_AUTO;
    p.algo = DP_ALGO_AUTO;
    p.det_chunk = 0; /* auto: dp_det_chunk_auto(batch) */
    p.epochs = 1;
    p.batch = 128;
    p.optim = dp_optim_default_params();
    p.sched.kind = DP_SCHED_CONSTANT;
    p.sched.base_lr = 0.05f;
    p.sched.gamma = 0.1f;
    p.seed = 1;
    p.staleness = -1;
    p.threads = 1;
    p.prefetch = -1; /* auto */
    /* Fashion-MNIST pixel statistics (train set, after /255). */
    p.norm_mean = 0.2860f;
    p.norm_std = 0.3530f;
    return p;
}

const struct dp_model *dp_trainer_model(const struct dp_trainer *t) { return t->model; }

int dp_trainer_comm_progress(const struct dp_trainer *t) { return t->comm_progress; }
int dp_trainer_prefetch(const struct dp_trainer *t) { return t->p.prefetch; }
struct dp_replica *dp_trainer_replica(struct dp_trainer *t) { return &t->w[0].rep; }
int64_t dp_trainer_live_bytes(const struct dp_trainer *t, int worker) {
    if (worker < 0 || worker >= t->P) return -1;
    return dp_zero_live_bytes(&t->w[worker].zero, &t->w[worker].opt);
}
int64_t dp_trainer_inflight_bytes(const struct dp_trainer *t) { return dp_zero_inflight_bytes(&t->w[0].zero); }
int dp_trainer_zero_counts(const struct dp_trainer *t, int worker, struct dp_zero_counts *c) {
    if (worker < 0 || worker >= t->P) return -1;
    const struct worker *w = &t->w[worker];
    *c = (struct dp_zero_counts){w->zero.gathers, w->zero.refaults, (int64_t)sizeof(float) * w->red.shard_hw};
    return 0;
}
uint64_t dp_trainer_param_hash(const struct dp_trainer *t) { return dp_replica_hash(&t->w[0].rep); }
const char *dp_trainer_note(const struct dp_trainer *t) { return t->note[0] ? t->note : NULL; }
int64_t dp_trainer_stopped(const struct dp_trainer *t) { return t->stopped; }

void dp_trainer_free(struct dp_trainer *t) {
    if (!t) return;
    for (int r = 0; t->w && r < t->P; r++) {
        struct worker *w = &t->w[r];
        dp_reducer_free(&w->red);
        dp_timeline_free(&w->tl);
        dp_free(w->acc);
        dp_free(w->buf_save);
        dp_free(w->arrival);
        dp_free(w->waits);
        dp_free(w->bal_rate);
        dp_free(w->bal_fix);
        dp_free(w->bal_fixu);
        dp_free(w->bal_share);
        dp_free(w->bal_new);
        dp_free(w->bal_buf);
        dp_free(w->dropped);
        dp_free(w->etok);
        dp_free(w->etgt);
        dp_comm_free(w->comm);
        dp_loader_free(w->loader);
        dp_optim_free(&w->opt);
        dp_zero_free(&w->zero);
        dp_replica_free(&w->rep);
    }
    dp_free(t->w);
    dp_free(t->slow_factor);
    dp_free(t->last_count);
    dp_free(t->rank_samples);
    dp_free(t->share_samples);
    dp_free(t->dropped_count);
    dp_free(t->efstate);
    dp_backup_star_free(t->star); /* stops rank 0's collector */
    dp_ps_free(t->ps);
    dp_ps_net_free(t->psn);
    dp_free(t->bk.src);
    dp_free(t->bk.n);
    dp_free(t->bk.arrived);
    for (int k = 0; k < BACKUP_DEPTH; k++) dp_free(t->bk.upd[k]), dp_free(t->bk.acc[k]);
    if (t->bk.init) pthread_mutex_destroy(&t->bk.mu), pthread_cond_destroy(&t->bk.cv);
    dp_comm_thread_world_free(t->world);
    dp_model_free(t->model);
    dp_dataset_free(&t->train);
    dp_dataset_free(&t->test);
    dp_tokens_free(&t->tokens);
    if (t->metrics) fclose(t->metrics);
    dp_free(t);
}

/* The parameter server's settings, and what it does not combine with (one
 * line each; see ps_loop). */
static int check_ps(const struct dp_train_params *p) {
    int async = p->async || p->staleness >= 0;
    if (p->servers < 0) return dp_seterr(DP_EINVAL, "--servers must be >= 1 (got %d)", p->servers);
    if (!async && (p->servers || p->staleness_lr))
        return dp_seterr(DP_EINVAL, "%s needs --mode async or --staleness S (the parameter server)",
                         p->servers ? "--servers" : "--staleness-lr");
    if (!async && (p->share_lr || p->implicit_momentum))
        return dp_seterr(DP_EINVAL, "%s needs --mode async (the parameter server)",
                         p->share_lr ? "--share-lr" : "--implicit-momentum");
    if (!async) return DP_OK;
    const char *mode = p->staleness >= 0 ? "--staleness" : "--mode async";
    if (p->share_lr && p->staleness >= 0)
        return dp_seterr(DP_EINVAL, "--share-lr does not work with --staleness: a clock's pushes are summed into "
                         "one update, each weighted by its samples already");
    /* across processes: async, SSP or the replay over --servers S dedicated ranks (ps_net_loop) */
    if (p->inter && p->workers > 1)
        return dp_seterr(DP_ENOTSUP, "--mode async across processes needs one worker per process (--workers 1 "
                         "under mpirun; got %d)", p->workers);
    if (p->inter && (p->servers ? p->servers : 1) >= dp_comm_world(p->inter))
        return dp_seterr(DP_EINVAL, "--servers %d leaves no worker: under mpirun the last S of the %d processes "
                         "serve and the others work, so S must be below %d", p->servers ? p->servers : 1,
                         dp_comm_world(p->inter), dp_comm_world(p->inter));
    if (p->staleness > DP_PS_MAX_STALENESS)
        return dp_seterr(DP_EINVAL, "--staleness must be in 0..%d (got %d); for no bound use --mode async",
                         DP_PS_MAX_STALENESS, p->staleness);
    if (p->backup) return dp_seterr(DP_EINVAL, "--backup-workers does not work with %s: no worker waits for another "
                                    "there, so there is nothing to drop", mode);
    if (p->balance) return dp_seterr(DP_EINVAL, "--balance does not work with %s: %s", mode, p->staleness >= 0 ?
                                     "its clocks take static shares" : "async workers already take batches at "
                                     "their own pace");
    if (p->compress.kind != DP_COMPRESS_NONE)
        return dp_seterr(DP_ENOTSUP, "--compress does not work with %s: pushes go to the server uncompressed "
                         "(compression is a strategy of the all-reduce path)", mode);
    if (p->accum > 1) return dp_seterr(DP_ENOTSUP, "--accum > 1 is not supported with %s", mode);
    if (p->max_steps) return dp_seterr(DP_ENOTSUP, "--max-steps is not supported with %s: it stops at epoch "
                                       "boundaries only (where every push is applied)", mode);
    if (p->check_replicas) return dp_seterr(DP_EINVAL, "--check-replicas does not work with %s: the replicas "
                                            "differ by design between pulls", mode);
    if (p->skip_nonfinite) return dp_seterr(DP_ENOTSUP, "--skip-nonfinite is not supported with %s", mode);
    if (p->staleness >= 0 && p->clip_norm > 0)
        return dp_seterr(DP_ENOTSUP, "--clip does not work with --staleness: a clock's update is summed shard by "
                         "shard, and clipping needs the norm of the whole gradient (plain --mode async clips each push)");
    if (p->staleness > 0 && p->deterministic)
        return dp_seterr(DP_ENOTSUP, "--staleness %d with --deterministic is not built: which version a worker "
                         "pulls depends on timing (--staleness 0 and --mode async are deterministic)", p->staleness);
    return DP_OK;
}

static int check_params(const struct dp_train_params *p) {
    int rc;
    if (p->epochs < 0) return dp_seterr(DP_EINVAL, "--epochs must be >= 0 (got %lld)", (long long)p->epochs);
    if (p->batch <= 0 || p->batch > (1 << 20))
        return dp_seterr(DP_EINVAL, "--batch must be in 1..1048576 (got %lld)", (long long)p->batch);
    if (p->workers < 1 || p->workers > 256)
        return dp_seterr(DP_EINVAL, "--workers must be in 1..256 (got %d)", p->workers);
    if (p->accum < 1 || p->accum > 1 << 16) return dp_seterr(DP_EINVAL, "--accum must be in 1..65536 (got %d)", p->accum);
    if (!(p->sched.base_lr > 0.0f) || !isfinite(p->sched.base_lr))
        return dp_seterr(DP_EINVAL, "--lr must be a positive number (got %g)", (double)p->sched.base_lr);
    if (p->comm_progress < DP_PROGRESS_THREAD || p->comm_progress > DP_PROGRESS_AUTO)
        return dp_seterr(DP_EINVAL, "comm_progress must be thread, caller or auto (got %d)", p->comm_progress);
    if (p->threads < 1 || p->threads > 256)
        return dp_seterr(DP_EINVAL, "--threads must be in 1..256 (got %d)", p->threads);
    if (p->clip_norm < 0) return dp_seterr(DP_EINVAL, "--clip must be >= 0 (got %g)", p->clip_norm);
    if (!(p->norm_std > 0)) return dp_seterr(DP_EINVAL, "normalisation std must be > 0");
    if (p->max_steps < 0) return dp_seterr(DP_EINVAL, "--max-steps must be >= 0");
    if (p->check_replicas < 0) return dp_seterr(DP_EINVAL, "--check-replicas must be >= 0");
    if (p->balance < 0 || p->balance > 1000000)
        return dp_seterr(DP_EINVAL, "--balance must be in 1..1000000 steps between re-plans (got %lld)",
                         (long long)p->balance);
    if (p->comm_timeout < 0) return dp_seterr(DP_EINVAL, "--comm-timeout must be >= 0");
    int G = p->inter ? p->workers * dp_comm_world(p->inter) : p->workers;
    if (p->backup && (p->backup_workers < 0 || p->backup_workers >= G))
        return dp_seterr(DP_EINVAL, "--backup-workers must be in 0..%d (fewer than the %d worker%s; got %d)",
                         G - 1, G, G > 1 ? "s" : "", p->backup_workers);
    /* across processes the step goes through rank 0 (dp_backup_star): one
     * worker per process, as a slot shared by threads and messages between
     * processes would make two protocols of one step */
    if (p->backup && p->inter && p->workers > 1)
        return dp_seterr(DP_ENOTSUP, "--backup-workers across processes needs one worker per process "
                         "(--workers 1 under mpirun; got %d)", p->workers);
    /* which ranks are accepted depends on timing: not deterministic */
    if (p->backup && p->deterministic && p->backup_workers > 0)
        return dp_seterr(DP_EINVAL, "--backup-workers %d does not work with --deterministic: which ranks are "
                         "dropped depends on timing (only --backup-workers 0 does)", p->backup_workers);
    if ((rc = check_ps(p))) return rc;
    if (p->zero < 0 || p->zero > 3) return dp_seterr(DP_EINVAL, "--zero must be in 0..3 (got %d)", p->zero);
    /* stages 2 and 3 reduce-scatter each bucket: the compressed forms are all-reduces or all-gathers */
    if (p->zero >= 2 && p->compress.kind != DP_COMPRESS_NONE)
        return dp_seterr(DP_ENOTSUP, "--compress does not work with --zero %d (it reduce-scatters each bucket; "
                         "the compressed forms are all-reduces): use --zero 1", p->zero);
    if (p->zero >= 2 && p->zero_scatter)
        return dp_seterr(DP_EINVAL, "--zero-reduce is --zero 1's option (--zero %d always reduce-scatters each "
                         "bucket)", p->zero);
    if (p->zero && (p->async || p->staleness >= 0))
        return dp_seterr(DP_EINVAL, "--zero does not work with %s: the parameter server already holds the only "
                         "optimizer state", p->staleness >= 0 ? "--staleness" : "--mode async");
    if (p->zero && p->backup)
        return dp_seterr(DP_ENOTSUP, "--zero does not work with --backup-workers (their steps do not go through "
                         "the reducer)");
    if (p->zero_gather < DP_ZERO_GATHER_AUTO || p->zero_gather > DP_ZERO_GATHER_AHEAD)
        return dp_seterr(DP_EINVAL, "zero_gather must be auto, step or ahead (got %d)", p->zero_gather);
    if (p->zero_gather && p->zero != 1)
        return dp_seterr(DP_EINVAL, "--zero-gather is --zero 1's option (this run is --zero %d)", p->zero);
    if (p->zero_scatter && p->compress.kind != DP_COMPRESS_NONE)
        return dp_seterr(DP_ENOTSUP, "--compress does not work with --zero-reduce scatter (the compressed forms "
                         "are all-reduces): use --zero-reduce allreduce");
    if (p->algo < 0 || p->algo >= DP_ALGO_COUNT) return dp_seterr(DP_EINVAL, "unknown all-reduce algorithm");
    /* Deterministic mode promises the same bits for any worker count.  Every
     * compression scheme rounds (bf16, fp16), selects (topk, sign) or
     * projects (powersgd) each worker's partial gradient, which depends on
     * how the batch is split, so none can keep that promise; for a fixed
     * worker count they are all reproducible (sums in a fixed order). */
    if (p->compress.kind != DP_COMPRESS_NONE && p->deterministic)
        return dp_seterr(DP_EINVAL, "--compress %s does not work with --deterministic: the compressed gradient "
                         "depends on how the batch is split across workers (runs with a fixed --workers are "
                         "reproducible without --deterministic)", dp_compress_name(p->compress.kind));
    if (p->compress.kind != DP_COMPRESS_NONE && p->backup)
        return dp_seterr(DP_EINVAL, "--compress does not work with --backup-workers (their steps do not go "
                         "through the reducer)");
    if (p->deterministic && (p->det_chunk < 0 || p->det_chunk > p->batch))
        return dp_seterr(DP_EINVAL, "--det-chunk must be in 1..batch (got %lld)", (long long)p->det_chunk);
    /* Deterministic mode stops at the first non-finite chunk gradient (it
     * cannot be turned into fixed point); a request to skip such steps
     * would be silently ignored. */
    if (p->deterministic && p->skip_nonfinite)
        return dp_seterr(DP_EINVAL, "--skip-nonfinite does not work with --deterministic (a non-finite "
                         "gradient always stops a deterministic run): use one or the other");
    rc = dp_optim_check(&p->optim);
    if (rc) return rc;
    struct dp_jitter j;
    if (p->simulate_slow && (rc = dp_parse_simulate_slow(p->simulate_slow, 0, NULL))) return rc;
    if (p->simulate_jitter && (rc = dp_parse_simulate_jitter(p->simulate_jitter, &j))) return rc;
    /* total_steps may still be 0 here: it is filled from the epoch count
     * once the data is loaded, and checked again then (dp_trainer_init). */
    struct dp_sched s = p->sched;
    if (s.total_steps <= 0) s.total_steps = s.warmup_steps + 1;
    return dp_sched_check(&s);
}

/* The error-feedback state of a resumed run (a "DPEFSTAT" section, see
 * dp_trainer_save): worker r takes job rank r's state when the checkpoint
 * holds the same scheme, worker count and length; otherwise the residuals
 * start at zero and t->note says why (a different worker count splits the
 * batch differently, so the old per-worker residuals would not fit). */
static int load_ef_state(struct dp_trainer *t, const char *path) {
    int64_t len = dp_reducer_state_len(&t->w[0].red);
    if (len == 0) return DP_OK;
    void *data;
    uint64_t size;
    int rc = dp_ckpt_read_section(path, DP_CKPT_EF_TAG, &data, &size);
    if (rc) return rc;
    struct dp_ckpt_ef ef;
    if (!data) {
        snprintf(t->note, sizeof t->note, "%s has no error-feedback state for --compress %s: the residuals start "
                 "at zero", path, dp_compress_name(t->p.compress.kind));
        return DP_OK;
    }
    memcpy(&ef, data, size >= sizeof ef ? sizeof ef : 0);
    if (size < sizeof ef || ef.len < 0 || size != sizeof ef + 4u * (uint64_t)ef.len * ef.workers) {
        dp_free(data);
        return dp_seterr(DP_EFORMAT, "%s: the error-feedback section is malformed", path);
    }
    if (ef.kind != (uint32_t)t->p.compress.kind || ef.len != len)
        snprintf(t->note, sizeof t->note, "%s holds error-feedback state of --compress %s, this run uses %s: the "
                 "residuals start at zero", path, dp_compress_name((enum dp_compress)ef.kind),
                 dp_compress_name(t->p.compress.kind));
    else if ((int)ef.workers != t->G)
        snprintf(t->note, sizeof t->note, "%s was saved by %u workers, this run has %d: the error-feedback "
                 "residuals are reset to zero", path, ef.workers, t->G);
    else
        for (int r = 0; r < t->P; r++)
            dp_reducer_state_set(&t->w[r].red, (const float *)(const void *)((const char *)data + sizeof ef) +
                                                   (size_t)len * (size_t)t->w[r].grank);
    dp_free(data);
    return DP_OK;
}

/* Restores the state saved by dp_trainer_save into every worker.  Every
 * field that must agree with this run is checked first, so nothing is
 * half-loaded on error.  The checkpoint does not depend on the worker count:
 * any P can resume it.  No worker holds the whole payload: the reader's
 * pass (which checks it) puts the parameters and buffers into worker 0's
 * replica (stage 3: only the buffers), the others copy them from there, and
 * each worker reads its own pieces of the optimizer state (stage 3: of the
 * parameters too) at their offsets in the whole-slab layout. */
static int load_checkpoint(struct dp_trainer *t, const char *path) {
    struct dp_ckpt_header h;
    int rc = dp_ckpt_read_header(path, &h);
    if (rc) return rc;
    const struct dp_model *m = t->model;
    /* the whole-slab layout whatever the stage: with ZeRO each worker takes its shard */
    int64_t full_state = (int64_t)t->w[0].zero.parts * m->num_params;
    if (strcmp(h.model_spec, m->spec) != 0)
        rc = dp_seterr(DP_EMISMATCH, "%s: checkpoint is for model '%s', this run builds '%s'", path,
                       h.model_spec, m->spec);
    else if (h.num_params != m->num_params || h.num_buffers != m->num_buffers)
        rc = dp_seterr(DP_EMISMATCH, "%s: checkpoint has %lld parameters, model '%s' has %lld", path,
                       (long long)h.num_params, m->spec, (long long)m->num_params);
    else if (h.in_shape[0] != m->in_shape.d[0] || h.in_shape[1] != m->in_shape.d[1] ||
             h.in_shape[2] != m->in_shape.d[2])
        rc = dp_seterr(DP_EMISMATCH, "%s: checkpoint input shape differs from the data's", path);
    else if ((int)h.optim_kind != (int)t->p.optim.kind)
        rc = dp_seterr(DP_EMISMATCH, "%s: checkpoint's optimizer is %s, this run's is %s (--optim)", path,
                       dp_optim_kind_name((enum dp_optim_kind)h.optim_kind), dp_optim_kind_name(t->p.optim.kind));
    else if (h.optim_state_len != full_state && h.optim_kind == DP_OPTIM_SGD)
        /* SGD keeps a velocity only with momentum */
        rc = dp_seterr(DP_EMISMATCH, "%s: checkpoint's SGD %s momentum state (--momentum %g), this run's %s "
                       "(--momentum %g): give --momentum %g, or leave it out to take the checkpoint's", path,
                       h.momentum > 0 ? "keeps" : "has no", (double)h.momentum, t->p.optim.momentum > 0 ? "needs it" : "has none",
                       (double)t->p.optim.momentum, (double)h.momentum);
    else if (h.optim_state_len != full_state)
        rc = dp_seterr(DP_EMISMATCH, "%s: checkpoint's optimizer state has %lld floats, this run's %s needs %lld", path,
                       (long long)h.optim_state_len, dp_optim_kind_name(t->p.optim.kind), (long long)full_state);
    else if (h.batch != t->p.batch)
        rc = dp_seterr(DP_EMISMATCH, "%s: checkpoint was trained with batch %lld, this run uses %lld "
                       "(the data order would differ)", path, (long long)h.batch, (long long)t->p.batch);
    else if (h.seed != t->p.seed)
        rc = dp_seterr(DP_EMISMATCH, "%s: checkpoint seed %llu differs from --seed %llu", path,
                       (unsigned long long)h.seed, (unsigned long long)t->p.seed);
    struct dp_ckpt_reader *rd = NULL;
    /* a corrupt file is reported as corrupt, not as a setting that differs: on a mismatch the
     * whole file's checksums are checked first (a pass that loads nothing) */
    if (rc) {
        char why[1024];
        snprintf(why, sizeof why, "%s", dp_errmsg());
        struct dp_ckpt_header h2;
        int crc = dp_ckpt_reader_open(&rd, path, &h2, NULL, NULL);
        dp_ckpt_reader_close(rd);
        return crc ? crc : dp_seterr(rc, "%s", why);
    }
    const int p3 = t->w[0].zero.pshard != NULL; /* stage 3, sharded */
    if (!rc) rc = dp_ckpt_reader_open(&rd, path, &h, p3 ? NULL : t->w[0].rep.params, t->w[0].rep.buffers);
    for (int r = 0; !rc && r < t->P; r++) {
        struct worker *w = &t->w[r];
        const struct dp_zero *z = &w->zero;
        if (r > 0 && !p3) memcpy(w->rep.params, t->w[0].rep.params, sizeof(float) * (size_t)h.num_params);
        if (r > 0) memcpy(w->rep.buffers, t->w[0].rep.buffers, sizeof(float) * (size_t)h.num_buffers);
        /* piece i's part k (k = -1: stage 3's parameters) lies at k n + off in
         * the state (after the params and buffers), at off in the params */
        for (int i = 0; !rc && i < z->npieces; i++)
            for (int k = p3 ? -1 : 0; !rc && k < z->parts; k++) {
                const struct dp_zero_piece *pc = &z->piece[i];
                int64_t at = k < 0 ? pc->off : h.num_params + h.num_buffers + k * h.num_params + pc->off;
                rc = dp_ckpt_reader_read(rd, at, pc->len, (float *)dp_zero_piece_data(z, &w->opt, i, k));
            }
        w->opt.step = h.optim_step;
    }
    dp_ckpt_reader_close(rd);
    if (!rc) {
        t->step = h.step;
        t->epoch = h.epoch;
        t->step_in_epoch = h.step_in_epoch;
    }
    if (!rc) rc = load_ef_state(t, path);
    return rc;
}

/* At an epoch boundary the position in the schedule follows from the epoch,
 * and each mode counts it its own way: synchronous and SSP in global batches
 * (steps_per_epoch per epoch), plain async in pushes (ps_batches per epoch:
 * batches of batch / P), the replay in clock x P + r (steps_per_epoch x P).
 * The checkpoint's step is its own mode's count; one saved by another mode,
 * worker count or --train-limit would put this run at a wrong point of its
 * schedule, so it continues from this mode's count for the epoch, and says
 * so.  (The optimizer's own step, AdamW's bias correction, is kept.) */
static void resume_position(struct dp_trainer *t) {
    const struct dp_train_params *p = &t->p;
    int64_t per = t->steps_per_epoch;
    const char *mode = "synchronous";
    if (p->staleness >= 0) mode = "--staleness";
    else if (p->async && p->deterministic) per = t->steps_per_epoch * (p->inter ? t->ps_W : t->P), mode = "the replay";
    else if (p->async) per = t->ps_batches, mode = "--mode async";
    int64_t want = t->epoch * per;
    if (t->step == want) return;
    size_t len = strlen(t->note);
    snprintf(t->note + len, sizeof t->note - len, "%sthe checkpoint's step %lld (its mode's count at the start of "
             "epoch %lld) is %lld in this run (%s, %d worker%s): the schedule continues from there", len ? "; " : "",
             (long long)t->step, (long long)t->epoch + 1, (long long)want, mode, t->G, t->G > 1 ? "s" : "");
    t->step = want;
}

static int worker_init(struct dp_trainer *t, struct worker *w, int rank) {
    const struct dp_train_params *p = &t->p;
    w->t = t;
    w->rank = rank;
    w->grank = t->base + rank;
    /* ZeRO 2 and 3 (sharded): the slabs a worker holds only parts of are
     * mapped, never touched as a whole (the gradient; stage 3, the parameters) */
    int lazy = p->zero >= 2 && t->G > 1 ? DP_REPLICA_LAZY_GRADS | (p->zero == 3 ? DP_REPLICA_LAZY_PARAMS : 0) : 0;
    int rc = dp_replica_init_lazy(&w->rep, t->model, t->max_batch, lazy);
    if (rc) return rc;
    if ((rc = dp_comm_thread_init(&w->comm, t->world, rank))) return rc;
    if ((rc = dp_zero_init(&w->zero, w->comm, t->model->num_params, p->zero, &p->optim))) return rc;
    w->zero.padded = lazy;
    /* ZeRO 1: the all-gather ahead (src/ddp/zero.c "Ahead"); the shard is then cut along the
     * buckets, so --zero-reduce scatter reduce-scatters each bucket during backward (the
     * reducer's shard form, as stages 2 and 3) instead of the slab after it */
    const int ahead = p->zero == 1 && t->G > 1 &&
                      (p->zero_gather == DP_ZERO_GATHER_AHEAD || (p->zero_gather == DP_ZERO_GATHER_AUTO && t->G > t->P));
    w->zero.ahead = ahead;
    struct dp_loader_params lp = dp_loader_default_params();
    lp.batch = p->batch;
    lp.shuffle = 1;
    lp.seed = p->seed;
    lp.aug = p->aug;
    lp.prefetch = p->prefetch;
    lp.rank = w->grank;
    lp.world = t->ps_W; /* G, but for the parameter server's ranks under mpirun */
    if (lp.rank >= t->ps_W) lp.rank = 0, lp.prefetch = 0; /* a server rank: its loader is not read */
    lp.align = p->deterministic && !p->async ? p->det_chunk : 1;
    lp.uneven = t->balance;
    if (t->ps_dynamic) {
        /* plain async: this worker reads whichever batch k of ceil(batch / P)
         * samples it claims (dp_loader_seek, then next); no prefetch, as the
         * next batch it will read is not known in advance (ps_loop) */
        lp.batch = (p->batch + t->ps_W - 1) / t->ps_W;
        lp.rank = 0, lp.world = 1, lp.prefetch = 0;
    }
    if (t->text) {
        rc = dp_loader_init_text(&w->loader, &t->tokens, &t->split, t->ctx, t->windows, &lp);
        if (!rc) {
            size_t n = (size_t)(t->eval_chunk * t->ctx);
            w->etok = dp_malloc(n * sizeof(int32_t));
            w->etgt = dp_malloc(n * sizeof(int32_t));
            if (!w->etok || !w->etgt) rc = dp_seterr(DP_ENOMEM, "trainer: out of memory");
        }
    } else
        rc = dp_loader_init(&w->loader, &t->train, &lp);
    if (rc) return rc;
    /* ~10 events per step: 200k covers long runs; later events are counted, not kept */
    if ((rc = dp_timeline_init(&w->tl, p->timeline ? 200000 : 0))) return rc;
    if (p->deterministic) {
        w->acc = dp_malloc_big(sizeof(double) * (size_t)(t->model->num_params ? t->model->num_params : 1));
        if (!w->acc) return dp_seterr(DP_ENOMEM, "deterministic mode: cannot allocate the accumulator");
    }
    if (p->skip_nonfinite && t->model->num_buffers > 0) {
        w->buf_save = dp_malloc(sizeof(float) * (size_t)t->model->num_buffers);
        if (!w->buf_save) return dp_seterr(DP_ENOMEM, "--skip-nonfinite: out of memory");
    }
    struct dp_reducer_params rp = dp_reducer_default_params();
    rp.bucket_cap_bytes = p->bucket_cap_bytes;
    rp.first_bucket_bytes = p->first_bucket_bytes;
    rp.overlap = p->overlap;
    rp.algo = (enum dp_comm_algo)p->algo;
    rp.compress = p->compress;
    rp.compress.seed = p->seed;
    if (p->optim.kind == DP_OPTIM_SGD && !p->optim.nesterov && p->optim.dampening == 0)
        rp.compress.momentum = p->optim.momentum;
    rp.scatter = p->zero && p->zero_scatter && !ahead;
    rp.shard = (p->zero >= 2 && t->G > 1) || (ahead && p->zero_scatter);
    if ((rc = dp_reducer_init(&w->red, t->model, w->comm, w->rep.grads, &rp))) return rc;
    /* ZeRO: the optimizer state of this worker's shard only (the memory win);
     * stages 2 and 3 cut the shard along the reducer's buckets */
    if (p->zero >= 2) w->red.done = dp_zero_bucket_done, w->red.done_arg = &w->zero; /* (1: the sums stay in the slab) */
    if ((rc = dp_zero_plan(&w->zero, w->red.b, w->red.nb, w->rep.params, w->rep.grads)) ||
        (rc = dp_optim_init(&w->opt, &p->optim, w->zero.len)))
        return rc;
    w->arrival = dp_calloc((size_t)w->red.nb + 1, sizeof(double));
    w->waits = dp_calloc((size_t)t->G, sizeof(double));
    if (!w->arrival || !w->waits) return dp_seterr(DP_ENOMEM, "trainer: out of memory");
    if (t->bk_on && !(w->dropped = dp_calloc((size_t)t->G, 1))) return dp_seterr(DP_ENOMEM, "trainer: out of memory");
    if (t->balance) {
        w->bal_rate = dp_calloc((size_t)t->G, sizeof(int64_t));
        w->bal_fix = dp_calloc((size_t)t->G, sizeof(int64_t));
        w->bal_fixu = dp_calloc((size_t)t->G, sizeof(int64_t));
        w->bal_new = dp_calloc((size_t)t->G, sizeof(int64_t));
        w->bal_buf = dp_calloc(3 * (size_t)t->G, sizeof(double));
        if (!w->bal_rate || !w->bal_fix || !w->bal_fixu || !w->bal_new || !w->bal_buf)
            return dp_seterr(DP_ENOMEM, "trainer: out of memory");
    }
    return DP_OK;
}

/* The schedule against the run's real length, known only once the data is
 * loaded (check_params could only use a placeholder): epochs x
 * steps_per_epoch optimizer steps.  A cosine warmup that is not shorter
 * than the run would end the run before the rate decays at all.  A run of
 * 0 epochs takes no step, so its schedule is never used. */
static int check_schedule(const struct dp_trainer *t) {
    const struct dp_sched *s = &t->p.sched;
    if (t->p.epochs == 0) return DP_OK;
    if (s->kind == DP_SCHED_COSINE && s->warmup_steps >= s->total_steps) {
        if (s->total_steps == t->steps_per_epoch * t->p.epochs)
            return dp_seterr(DP_EINVAL, "--warmup %lld must be shorter than the run, which has %lld optimizer "
                             "steps (%lld epoch%s x %lld steps): the learning rate would never decay",
                             (long long)s->warmup_steps, (long long)s->total_steps, (long long)t->p.epochs,
                             t->p.epochs > 1 ? "s" : "", (long long)t->steps_per_epoch);
        return dp_seterr(DP_EINVAL, "cosine schedule: warmup_steps %lld must be shorter than total_steps %lld",
                         (long long)s->warmup_steps, (long long)s->total_steps);
    }
    return dp_sched_check(s);
}

/* Samples per evaluation chunk: images, and text windows.  Both are fixed
 * (never derived from the worker count: see the evaluation below).  A window
 * costs T positions of activations, O(T^2) per head in attention, so text
 * chunks are small. */
#define EVAL_CHUNK 256
#define TEXT_EVAL_CHUNK 16

/* A token model's data: the token file named by --data, its fixed split
 * (the last DP_TEXT_VAL_FRAC of the tokens validate), and the model.
 *
 * An epoch is floor(train_n / (ctx + 1)) windows, as many as fit side by
 * side in the training part: an epoch reads about as many tokens as the part
 * holds (windows are drawn with replacement, so not each one exactly once).
 * train_limit caps the windows per epoch, test_limit the validation windows. */
static int load_text(struct dp_trainer *t, const char *spec) {
    const struct dp_train_params *p = &t->p;
    struct stat st;
    if (!p->data_dir || (stat(p->data_dir, &st) == 0 && S_ISDIR(st.st_mode)))
        return dp_seterr(DP_EINVAL, "model '%s' trains on a token file, and --data %s is a folder: run "
                         "'dptrain prepare-text %s --out tokens.bin' first, then train with --data tokens.bin",
                         spec, p->data_dir ? p->data_dir : "(none)", p->data_dir ? p->data_dir : "DIR");
    int rc = dp_tokens_read(p->data_dir, &t->tokens);
    if (rc) return rc;
    if ((rc = dp_model_from_spec(&t->model, spec, 1, 1, 1))) return rc;
    t->ctx = t->model->in_shape.d[0];
    if (t->tokens.vocab > dp_model_num_classes(t->model))
        return dp_seterr(DP_EMISMATCH, "%s has a vocabulary of %lld tokens, model '%s' outputs %lld",
                         p->data_dir, (long long)t->tokens.vocab, spec,
                         (long long)dp_model_num_classes(t->model));
    if ((rc = dp_text_split_init(&t->split, t->tokens.n, DP_TEXT_VAL_FRAC))) return rc;
    if (t->split.train_n < t->ctx + 1)
        return dp_seterr(DP_EINVAL, "%s: the training part holds %lld tokens, a window of ctx %lld needs %lld",
                         p->data_dir, (long long)t->split.train_n, (long long)t->ctx, (long long)(t->ctx + 1));
    t->windows = t->split.train_n / (t->ctx + 1);
    if (p->train_limit > 0 && p->train_limit < t->windows) t->windows = p->train_limit;
    t->eval_chunk = TEXT_EVAL_CHUNK;
    return DP_OK;
}

/* The backup workers' step slot (the protocol is at backup_step). */
static int backup_init(struct dp_trainer *t) {
    struct backup *bk = &t->bk;
    size_t np = (size_t)(t->model->num_params ? t->model->num_params : 1);
    bk->need = t->P - t->p.backup_workers;
    bk->src = dp_calloc((size_t)t->P, sizeof *bk->src);
    bk->n = dp_calloc((size_t)t->P, sizeof(double));
    bk->arrived = dp_calloc((size_t)t->P, sizeof(int64_t));
    t->dropped_count = dp_calloc((size_t)t->G, sizeof(int64_t));
    int bad = !bk->src || !bk->n || !bk->arrived || !t->dropped_count;
    for (int k = 0; k < BACKUP_DEPTH; k++) {
        bk->upd[k] = dp_malloc_big(sizeof(float) * np);
        bk->acc[k] = dp_calloc((size_t)t->P, 1);
        bad |= !bk->upd[k] || !bk->acc[k];
    }
    if (bad) return dp_seterr(DP_ENOMEM, "--backup-workers: out of memory");
    if (pthread_mutex_init(&bk->mu, NULL) != 0) return dp_seterr(DP_ENOMEM, "--backup-workers: cannot create a mutex");
    if (dp_cond_init_monotonic(&bk->cv) != 0) {
        pthread_mutex_destroy(&bk->mu);
        return dp_seterr(DP_ENOMEM, "--backup-workers: cannot create a condition variable");
    }
    bk->init = 1;
    return DP_OK;
}

/* The parameter server (after the model and any checkpoint are loaded; its
 * state is set from worker 0's when the run starts).  Default shards:
 * min(P, 4): a push holds one shard at a time, so up to S workers apply at
 * once (bench/ps_shards.sh measures it).  Schedule: async applies about P
 * updates per global batch, so lr = sched(version / P) spans the same
 * epochs as sync; SSP's version counts clocks (global batches). */
static int ps_init(struct dp_trainer *t) {
    const struct dp_train_params *p = &t->p;
    struct dp_ps_params pp = {.shards = p->servers ? p->servers : (t->P < 4 ? t->P : 4), .workers = t->P,
                              .staleness = p->staleness, .staleness_lr = p->staleness_lr,
                              .share_batch = p->share_lr ? p->batch : 0,
                              .implicit_momentum = p->implicit_momentum,
                              .ordered = p->deterministic && p->staleness < 0,
                              .exact = p->deterministic, .timeout_s = p->comm_timeout, .optim = p->optim,
                              .sched = p->sched, .lr_div = p->staleness < 0 ? t->P : 1};
    if (p->servers > t->model->num_params)
        return dp_seterr(DP_EINVAL, "--servers must be in 1..%lld (the parameters of '%s'; got %d)",
                         (long long)t->model->num_params, t->model->spec, p->servers);
    if (t->step_in_epoch != 0)
        return dp_seterr(DP_ENOTSUP, "the parameter server resumes only from an epoch boundary (the checkpoint "
                         "is at step %lld of epoch %lld)", (long long)t->step_in_epoch, (long long)t->epoch + 1);
    t->ps_div = pp.lr_div;
    t->ps_on = 1;
    atomic_init(&t->ps_next, 0);
    atomic_init(&t->ps_samples, 0);
    if (p->inter) { /* server ranks: the last S processes; one shard each (src/ddp/ps_mpi.c) */
        struct dp_ps_net_params np = {.c = p->inter, .servers = t->ps_servers, .n = t->model->num_params,
                                      .batches = t->ps_batches, .ps = pp};
        np.ps.workers = pp.workers = t->ps_W;
        if (p->staleness < 0) np.ps.lr_div = t->ps_div = t->ps_W;
        np.slow = t->slow_factor ? t->slow_factor[t->base] : 1;
        float mu; /* every rank refuses what the servers' dp_ps_init would */
        int rc = dp_ps_momentum(&np.ps, &mu);
        return rc ? rc : dp_ps_net_init(&t->psn, &np);
    }
    t->ps_servers = pp.shards;
    return dp_ps_init(&t->ps, &pp, t->model->num_params);
}

/* Chunks cost two ways (measured, docs/results.md "What deterministic mode
 * costs"): a small chunk means GEMMs of few rows and one conversion pass over
 * the gradient per few samples (mlp at P = 2: 0.44x of ordinary training with
 * chunks of 8, 0.72x with 32); a large chunk leaves fewer chunks than workers
 * (a worker with no chunk idles).  A quarter of the batch keeps 4 workers busy
 * at any batch and is 32 at the default batch of 128; beyond 32 rows the
 * GEMMs gain little, and below 8 they lose much. */
int64_t dp_det_chunk_auto(int64_t batch) {
    int64_t c = batch / 4;
    if (c > 32) c = 32;
    if (c < 8) c = 8;
    return c < batch ? c : batch;
}

/* Measured on 2 cores with 2 workers of 1 thread (docs/results.md, the
 * quiet runs of caller progress and of pinned workers): without a third
 * thread per worker mlp ran 1.12-1.15x as fast and cnn and resnet within a
 * few percent either way, the same bits.  With a spare core per worker the
 * communication thread reduces beside the compute instead of between its
 * layers; with more compute threads than cores the thread path is the one
 * measured and tested under load. */
/* The process's compute threads, what the auto rules below weigh against its CPUs. */
static int64_t compute_threads(int workers, int threads) { return (int64_t)workers * (threads > 0 ? threads : 1); }

int dp_train_progress_auto(int workers, int threads, int cpus) {
    int64_t busy = compute_threads(workers, threads);
    return workers > 1 && busy <= cpus && cpus < busy + workers ? DP_PROGRESS_CALLER : DP_PROGRESS_THREAD;
}

int dp_train_prefetch_auto(int workers, int threads, int cpus) { return compute_threads(workers, threads) >= cpus ? 0 : 2; }

int dp_trainer_init(struct dp_trainer **out, const struct dp_train_params *p) {
    *out = NULL;
    int rc = check_params(p);
    if (rc) return rc;
    struct dp_trainer *t = dp_calloc(1, sizeof *t);
    if (!t) return dp_seterr(DP_ENOMEM, "trainer: out of memory");
    t->p = *p;
    if (p->staleness >= 0) t->p.async = 1; /* --staleness implies the parameter server */
    if (p->prefetch < 0) t->p.prefetch = dp_train_prefetch_auto(p->workers, p->threads, dp_cpus_allowed());
    if (p->deterministic && !p->det_chunk) t->p.det_chunk = dp_det_chunk_auto(p->batch);
    p = &t->p;
    t->P = p->workers;
    t->G = p->inter ? t->P * dp_comm_world(p->inter) : t->P;
    t->base = p->inter ? t->P * dp_comm_rank(p->inter) : 0;
    t->slow_rank = -1;
    /* the parameter server under mpirun: the last S ranks serve (check_ps: one worker each) */
    t->ps_servers = p->inter && p->async ? (p->servers ? p->servers : 1) : 0;
    t->ps_W = t->G - t->ps_servers;
    t->efstate_step = -1;
    t->stopped = -1;
    atomic_init(&t->eval_next, 0);
    atomic_init(&t->stop_at, INT64_MAX);
    dp_set_num_threads(p->threads);

    /* A folder that holds another run is refused before anything is loaded. */
    if (p->out_dir && t->base == 0 && (rc = dp__run_folder_check(p->out_dir, p->resume, p->overwrite))) goto fail;
    /* A checkpoint names its model; --model may be omitted when resuming. */
    char spec[128];
    snprintf(spec, sizeof spec, "%s", p->model ? p->model : "");
    if (p->resume) {
        struct dp_ckpt_header h;
        if ((rc = dp_ckpt_read_header(p->resume, &h))) goto fail;
        if (!p->model) snprintf(spec, sizeof spec, "%s", h.model_spec);
    }
    if (!spec[0]) {
        rc = dp_seterr(DP_EINVAL, "no model given (--model)");
        goto fail;
    }
    /* A language model (gpt:...) reads token ids: its data is a token file. */
    t->text = dp_model_spec_reads_tokens(spec);
    if (t->text) {
        if ((rc = load_text(t, spec))) goto fail;
    } else {
        /* only the samples the limits keep are read (a short run decompresses
         * no more than it trains and evaluates on) */
        if ((rc = dp_dataset_load_dir_first(&t->train, &t->test, p->data_dir, p->train_limit > 0 ? p->train_limit : 0,
                                            p->test_limit > 0 ? p->test_limit : 0)))
            goto fail;
        dp_dataset_normalize(&t->train, p->norm_mean, p->norm_std);
        dp_dataset_normalize(&t->test, p->norm_mean, p->norm_std);
        if ((rc = dp_model_from_spec(&t->model, spec, t->train.C, t->train.H, t->train.W))) goto fail;
        t->eval_chunk = EVAL_CHUNK;
    }
    {
        struct dp_shape os = dp_model_cur_shape(t->model);
        t->pos = dp_shape_numel(&os) / os.d[os.ndim - 1];
    }
    if (t->text && p->fault_kind == DP_FAULT_NAN) {
        /* the fault puts a NaN into the float inputs; a token model has none */
        rc = dp_seterr(DP_ENOTSUP, "the NaN fault injects into float inputs; model '%s' reads token ids", spec);
        goto fail;
    }
    if (!t->text && t->train.num_classes > dp_model_num_classes(t->model)) {
        rc = dp_seterr(DP_EMISMATCH, "the data has %lld classes, model '%s' outputs %lld",
                       (long long)t->train.num_classes, spec, (long long)dp_model_num_classes(t->model));
        goto fail;
    }
    if (p->deterministic && t->model->num_buffers > 0) {
        rc = dp_seterr(DP_ENOTSUP, "--deterministic does not support models with BatchNorm yet ('%s'): "
                       "their batch statistics are summed in floating point across workers", spec);
        goto fail;
    }
    if (p->backup && t->model->num_buffers > 0) {
        rc = dp_seterr(DP_ENOTSUP, "--backup-workers does not support models with BatchNorm ('%s'): their "
                       "statistics are synchronised across every worker in forward", spec);
        goto fail;
    }
    if (p->async && t->model->num_buffers > 0) {
        rc = dp_seterr(DP_ENOTSUP, "%s does not support models with BatchNorm ('%s'): their statistics are "
                       "synchronised across every worker in forward", p->staleness >= 0 ? "--staleness" : "--mode async",
                       spec);
        goto fail;
    }
    /* plain async claims batches as it goes; SSP and the replay take static shares */
    t->ps_dynamic = p->async && p->staleness < 0 && !p->deterministic;
    /* --backup-workers 0 with --deterministic is plain deterministic sync */
    t->bk_on = p->backup && !p->deterministic;
    if (t->bk_on && !p->inter && (rc = backup_init(t))) goto fail;
    if (t->bk_on && p->inter) {
        if (!(t->dropped_count = dp_calloc((size_t)t->G, sizeof(int64_t)))) {
            rc = dp_seterr(DP_ENOMEM, "--backup-workers: out of memory");
            goto fail;
        }
        if ((rc = dp_backup_star_init(&t->star, p->inter, t->model->num_params, p->backup_workers,
                                      (double)t->pos, p->comm_timeout)))
            goto fail;
    }
    /* A worker's share is at most ceil(batch / P); evaluation uses up to
     * eval_chunk samples. */
    int64_t share = (p->batch + t->ps_W - 1) / t->ps_W;
    t->balance = p->balance > 0 && t->G > 1;
    t->bal_align = p->deterministic ? p->det_chunk : 1;
    if (t->balance) share = p->batch; /* a balanced share may be the whole batch */
    if (p->deterministic && !p->async) share = p->det_chunk; /* one chunk at a time */
    t->max_batch = share > t->eval_chunk ? share : t->eval_chunk;
    struct dp_comm_params cp = dp_comm_default_params();
    cp.timeout_s = p->comm_timeout;
    /* (a hierarchical world, with processes, reduces on its threads whatever is asked) */
    cp.progress = p->comm_progress == DP_PROGRESS_AUTO ? dp_train_progress_auto(t->P, p->threads, dp_cpus_allowed())
                                                       : p->comm_progress;
    t->comm_progress = p->inter ? DP_PROGRESS_THREAD : cp.progress;
    cp.spin_us = p->comm_spin_us;
    rc = p->inter ? dp_comm_thread_world_init_hier(&t->world, t->P, &cp, p->inter)
                  : dp_comm_thread_world_init(&t->world, t->P, &cp);
    if (rc) goto fail;
    if (p->simulate_slow) {
        t->slow_factor = dp_malloc(sizeof(double) * (size_t)t->G);
        if (!t->slow_factor) {
            rc = dp_seterr(DP_ENOMEM, "trainer: out of memory");
            goto fail;
        }
        /* the ranks are known now: a rank out of range is an error here */
        if ((rc = dp_parse_simulate_slow(p->simulate_slow, t->G, t->slow_factor))) goto fail;
    }
    if (p->simulate_jitter) (void)dp_parse_simulate_jitter(p->simulate_jitter, &t->jit); /* checked above */
    t->simulate = p->simulate_slow || p->simulate_jitter;
    /* (not with backup workers: a per-step all-gather would wait for the late) */
    t->gather_waits = t->G > 1 && (p->out_dir || t->simulate) && !t->bk_on && !p->async;
    t->last_count = dp_calloc((size_t)t->G, sizeof(int64_t));
    t->rank_samples = dp_calloc((size_t)t->G, sizeof(int64_t));
    t->share_samples = dp_calloc((size_t)t->G, sizeof(int64_t));
    t->w = dp_calloc((size_t)t->P, sizeof *t->w);
    if (!t->w || !t->last_count || !t->rank_samples || !t->share_samples) {
        rc = dp_seterr(DP_ENOMEM, "trainer: out of memory");
        goto fail;
    }
    for (int r = 0; r < t->P; r++)
        if ((rc = worker_init(t, &t->w[r], r))) {
            dp_adderr(rc, "worker %d", t->base + r);
            goto fail;
        }
    t->red_check = red_check_possible(t);
    for (int r = 0; t->red_check && r < t->P; r++) t->w[r].red.post = reduced_check, t->w[r].red.post_arg = &t->w[r];
    /* Rank 0 initialises; the others receive its parameters by broadcast
     * when the run starts.  (Every rank could draw the same values from the
     * seed; the broadcast makes "all replicas start equal" hold for any
     * initialisation, including --init-from on rank 0 only.)  ZeRO 3
     * (sharded) builds no replica: each worker draws its own pieces from the
     * seed, below, and rank 0 only its buffers. */
    int zero3 = p->zero == 3 && t->G > 1;
    if (zero3 && !p->init_from)
        dp_model_init_slice(t->model, 1, t->w[0].rep.buffers, 0, t->model->num_buffers, p->seed);
    else dp_model_init_params(t->model, &t->w[0].rep, p->seed);
    if (p->init_from && (rc = dp_safetensors_load(p->init_from, t->model, &t->w[0].rep))) goto fail;
    t->batches_per_epoch = dp_loader_steps_per_epoch(t->w[0].loader);
    if (t->ps_dynamic) { /* the loader's batches are batch / P: the schedule counts global batches */
        int64_t n = t->text ? t->windows : t->train.n;
        t->ps_batches = t->batches_per_epoch;
        t->batches_per_epoch = (n + p->batch - 1) / p->batch;
    }
    t->steps_per_epoch = (t->batches_per_epoch + p->accum - 1) / p->accum;
    if (t->p.sched.total_steps <= 0) t->p.sched.total_steps = t->steps_per_epoch * p->epochs;
    if ((rc = check_schedule(t))) goto fail;

    if (p->resume && (rc = load_checkpoint(t, p->resume))) goto fail;
    if (p->resume && t->step_in_epoch == 0) resume_position(t);
    /* ZeRO 3: each worker's pieces, drawn from the seed, or copied from rank
     * 0's slab where --init-from filled it, which is then given back; a
     * checkpoint has put them in place already (load_checkpoint).  Every
     * process of an MPI job computes the same pieces (the same seed, the
     * same files), so the parameters need no broadcast. */
    if (zero3) {
        const float *whole = p->init_from ? t->w[0].rep.params : NULL;
        for (int r = 0; r < t->P && !rc && !p->resume; r++)
            rc = dp_zero_shard_init(&t->w[r].zero, t->model, p->seed, whole);
        if (rc || (whole && (rc = dp_zero_release_params(&t->w[0].zero)))) goto fail;
    }
    if (p->async && (rc = ps_init(t))) goto fail;
    /* Only the job's rank 0 writes metrics and checkpoints (src/train/run_folder.c). */
    if (p->out_dir && t->base == 0 &&
        (rc = dp__run_folder_open(p->out_dir, p->resume, p->overwrite, &t->metrics, t->metrics_path,
                                  sizeof t->metrics_path, t->note, sizeof t->note)))
        goto fail;
    *out = t;
    return DP_OK;
fail:
    dp_trainer_free(t);
    return rc;
}

static void fill_header(const struct dp_trainer *t, struct dp_ckpt_header *h) {
    const struct worker *w = &t->w[0];
    memset(h, 0, sizeof *h);
    const struct dp_model *m = t->model;
    snprintf(h->model_spec, sizeof h->model_spec, "%s", m->spec);
    for (int i = 0; i < m->in_shape.ndim && i < 4; i++) h->in_shape[i] = m->in_shape.d[i];
    h->num_params = m->num_params;
    h->num_buffers = m->num_buffers;
    h->seed = t->p.seed;
    h->step = t->step;
    h->epoch = t->epoch;
    h->step_in_epoch = t->step_in_epoch;
    h->batch = t->p.batch;
    h->optim_kind = (uint32_t)t->p.optim.kind;
    h->nesterov = (uint32_t)t->p.optim.nesterov;
    h->momentum = t->p.optim.momentum;
    h->dampening = t->p.optim.dampening;
    h->weight_decay = t->p.optim.weight_decay;
    h->beta1 = t->p.optim.beta1;
    h->beta2 = t->p.optim.beta2;
    h->eps = t->p.optim.eps;
    h->lr = t->p.sched.base_lr;
    h->sched_kind = (uint32_t)t->p.sched.kind;
    h->optim_step = w->opt.step;
    /* ZeRO: the whole slab's state whatever the stage (zero_stream writes it from the shards) */
    h->optim_state_len = t->p.zero ? (int64_t)w->zero.parts * m->num_params : w->opt.state_len;
}

/* ---- ZeRO checkpoints, streamed from the shards --------------------------------------------
 * A ZeRO checkpoint is today's file (the whole-slab layout, so any stage
 * and worker count resumes it, and ckpt info/diff/export read it), but no
 * process gathers the whole state: rank 0 writes the payload in file order
 * and each piece comes from its owner as it is written:
 *
 *     params        stage 3: range by range from the slab's start, in each
 *                   range the ranks' pieces in rank order (their pshard);
 *                   else rank 0's slab
 *     buffers       rank 0's (replicated)
 *     state part k  the ranges and pieces in the same order, each piece's
 *                   part k (dp_zero_piece_data)
 *
 * One process (G == P): rank 0 reads the other workers' pieces in place;
 * they are idle (waiting at the epoch's barrier, or the run is over), so
 * the save holds nothing beyond the shards.  Several processes: every
 * worker of the job runs the same loop, and each piece travels in blocks of
 * at most ZBLOCK floats (4 MiB), broadcast by its owner, so a process holds
 * one block per worker beyond its shards.  (dp_comm has no gather to one
 * root: the broadcast delivers a block to every rank, as the all-gather of
 * the whole state it replaces did.)  docs/ddp.md "ZeRO" says why one file
 * rather than a file per shard. */
#define ZBLOCK ((int64_t)1 << 20)

/* Part `part` (-1: stage 3's parameters) in file order.  out: rank 0's
 * writer (NULL on the others, or where rank 0 could not open the file: it
 * still sends its pieces); buf: ZBLOCK floats for the broadcasts, NULL to
 * read in place.  A write error stays in out (sticky) and the loop goes on,
 * so that no rank waits for a broadcast that never comes. */
static int zero_stream_part(struct worker *w, struct dp_ckpt_writer *out, float *buf, int part) {
    struct dp_trainer *t = w->t;
    const struct dp_zero *z = &w->zero;
    int rc = DP_OK;
    for (int i = z->npieces - 1; i >= 0 && !rc; i--) /* piece[0] is the highest range */
        for (int q = 0; q < t->G && !rc; q++) {
            int64_t off, len;
            dp_comm_split(z->piece[i].rcount, t->G, q, &off, &len);
            const struct worker *o = buf ? (w->grank == q ? w : NULL) : &t->w[q];
            const float *src = o ? dp_zero_piece_data(&o->zero, &o->opt, i, part) : NULL;
            for (int64_t b = 0; b < len && !rc; b += ZBLOCK) {
                const int64_t c = len - b < ZBLOCK ? len - b : ZBLOCK;
                const float *x = src ? src + b : NULL;
                if (buf) {
                    if (src) memcpy(buf, x, sizeof(float) * (size_t)c);
                    rc = dp_comm_broadcast(w->comm, buf, c, DP_DTYPE_F32, q, DP_ALGO_AUTO);
                    x = buf;
                }
                if (out && !rc) dp_ckpt_writer_put(out, x, sizeof(float) * (size_t)c);
            }
        }
    return rc;
}

/* The payload of a ZeRO checkpoint: rank 0 with its writer; in a
 * multi-process job also every other worker (out NULL), at the same point. */
static int zero_stream(struct worker *w, struct dp_ckpt_writer *out) {
    struct dp_trainer *t = w->t;
    const struct dp_model *m = t->model;
    float *buf = NULL;
    if (t->G > t->P) {
        int64_t most = 1;
        for (int i = 0; i < w->zero.npieces; i++) {
            int64_t c = (w->zero.piece[i].rcount + t->G - 1) / t->G;
            if (c > most) most = c;
        }
        if (!(buf = dp_malloc(sizeof(float) * (size_t)(most < ZBLOCK ? most : ZBLOCK))))
            return dp_seterr(DP_ENOMEM, "checkpoint: out of memory for a block of the ZeRO state");
    }
    int rc = DP_OK;
    if (w->zero.pshard) rc = zero_stream_part(w, out, buf, -1);
    else if (out) dp_ckpt_writer_put(out, w->rep.params, sizeof(float) * (size_t)m->num_params);
    if (out && !rc) dp_ckpt_writer_put(out, w->rep.buffers, sizeof(float) * (size_t)m->num_buffers);
    for (int k = 0; k < w->zero.parts && !rc; k++) rc = zero_stream_part(w, out, buf, k);
    dp_free(buf);
    return rc;
}

/* Rank 0 writes a checkpoint now (checkpoint() below): in a multi-process
 * ZeRO job every other worker sends its pieces meanwhile. */
static int zero_serves(const struct dp_trainer *t) { return t->p.zero && t->p.out_dir && t->G > t->P; }

int dp_trainer_save(struct dp_trainer *t, const char *path) {
    struct worker *w = &t->w[0];
    if (t->p.zero && t->G > t->P && !t->zsaving)
        return dp_seterr(DP_ENOTSUP, "checkpoint: a multi-process ZeRO job writes its checkpoints during the run "
                         "(every rank sends its pieces), at epoch ends and --max-steps");
    struct dp_ckpt_header h;
    fill_header(t, &h);
    h.param_hash = dp_replica_hash(&w->rep); /* (ZeRO: the writer's hash of what it wrote) */
    /* The compressor's per-worker state (residuals, PowerSGD's Q), every
     * worker's in rank order, as a section after the payload: this
     * process's workers' when it holds every worker, else (a multi-process
     * job) the states ef_gather_state brought to rank 0 at this step; a
     * multi-process save at another step writes none (its resume starts the
     * residuals at zero, with a note). */
    int64_t len = dp_reducer_state_len(&w->red);
    int gathered = t->G != t->P && t->efstate && t->efstate_step == w->opt.step;
    size_t size = 0;
    char *data = NULL;
    int rc = DP_OK;
    if (len && (t->G == t->P || gathered)) {
        size = sizeof(struct dp_ckpt_ef) + sizeof(float) * (size_t)len * (size_t)t->G;
        if (!(data = dp_malloc_big(size))) rc = dp_seterr(DP_ENOMEM, "checkpoint: out of memory for the error-feedback state");
    }
    if (data) {
        struct dp_ckpt_ef ef = {.kind = (uint32_t)t->p.compress.kind, .workers = (uint32_t)t->G, .len = len};
        memcpy(data, &ef, sizeof ef);
        if (gathered) memcpy(data + sizeof ef, t->efstate, sizeof(float) * (size_t)len * (size_t)t->G);
        for (int r = 0; !gathered && r < t->P; r++)
            dp_reducer_state_get(&t->w[r].red, (float *)(void *)(data + sizeof ef) + (size_t)len * (size_t)r);
    }
    /* The sections after the payload: the error-feedback state, the length of metrics.jsonl
     * now (a resume cuts the file back to it: load_metrics) and the caller's configuration. */
    struct dp_ckpt_writer *out = NULL;
    if (!rc) rc = dp_ckpt_writer_open(&out, path, &h);
    int src;
    if (!t->p.zero) {
        if (out) {
            dp_ckpt_writer_put(out, w->rep.params, sizeof(float) * (size_t)h.num_params);
            dp_ckpt_writer_put(out, w->rep.buffers, sizeof(float) * (size_t)h.num_buffers);
            dp_ckpt_writer_put(out, w->opt.state, sizeof(float) * (size_t)h.optim_state_len);
        }
        src = DP_OK;
    } else
        src = zero_stream(w, out); /* (the others wait for the pieces even where the file failed) */
    if (out) {
        if (t->p.zero) h.param_hash = dp_ckpt_writer_hash(out);
        if (data) dp_ckpt_writer_section(out, DP_CKPT_EF_TAG, data, size);
        if (t->metrics) {
            struct dp_ckpt_metrics mb = {.bytes = ftell(t->metrics)}; /* (every record is flushed) */
            dp_ckpt_writer_section(out, DP_CKPT_METRICS_TAG, &mb, sizeof mb);
        }
        if (t->p.config) dp_ckpt_writer_section(out, DP_CKPT_CONFIG_TAG, t->p.config, strlen(t->p.config));
        int crc = dp_ckpt_writer_close(out, &h, NULL, NULL, 0);
        if (!src) src = crc;
    }
    if (!rc) rc = src;
    dp_free(data);
    return rc;
}

/* ---- evaluation ----------------------------------------------------------------------------
 * The test set (or, for text, the validation windows) is cut into chunks of
 * t->eval_chunk samples (every replica's arena holds at least that many, see
 * max_batch).  Chunk c's correct count and loss sum go to slot[2c],
 * slot[2c + 1]; the totals are the slots summed in chunk order.  The chunks
 * do not depend on the worker count, so the result is the same bits whoever
 * evaluates which chunk. */

/* Samples evaluated: the first `limit` (0 = all) of ds, or with ds NULL of
 * the text validation windows. */
static int64_t eval_count(const struct dp_trainer *t, const struct dp_dataset *ds, int64_t limit) {
    int64_t n = ds ? ds->n : dp_text_val_windows(&t->split, t->ctx);
    return limit > 0 && limit < n ? limit : n;
}

/* Evaluates chunks [c0, c1) of the first n samples of ds on replica w->rep
 * (ds NULL: the text validation windows, filled into w's scratch). */
/* gather: ZeRO 3 (sharded), the layers' ranges gathered as in training
 * (collective: evaluate_shared); a chunk past the end is then an empty pass
 * that takes part in the gathers. */
static int eval_chunks(struct dp_trainer *t, struct worker *w, const struct dp_dataset *ds, int64_t n,
                       int64_t c0, int64_t c1, double *slot, int gather) {
    const int64_t E = t->eval_chunk;
    for (int64_t c = c0; c < c1; c++) {
        int64_t i = c * E, B = n - i < E ? n - i : E;
        struct dp_batch b = {.B = B > 0 ? B : 0};
        if (B <= 0) i = 0; /* an empty pass still reads from valid pointers */
        if (ds) {
            b.x = ds->x + i * ds->C * ds->H * ds->W;
            b.targets = ds->y + i;
        } else {
            int rc = B > 0 ? dp_text_fill_val(&t->tokens, &t->split, t->ctx, i, B, w->etok, w->etgt) : DP_OK;
            if (rc) return dp_adderr(rc, "evaluate");
            b.tokens = w->etok, b.targets = w->etgt;
        }
        struct dp_pass pass = {.training = 0, .seed = t->p.seed};
        if (gather) pass.layer_begin = dp_zero_layer_begin, pass.layer_begin_arg = &w->zero;
        int rc = dp_model_run(t->model, &w->rep, &b, &pass);
        if (rc) return dp_adderr(rc, "evaluate");
        if (B > 0) slot[2 * c] = (double)pass.correct, slot[2 * c + 1] = pass.loss_sum;
    }
    return DP_OK;
}

/* Accuracy and loss per term: n samples of t->pos terms each. */
static void eval_totals(const struct dp_trainer *t, const double *slot, int64_t nchunks, int64_t n,
                        double *acc, double *loss) {
    double correct = 0, loss_sum = 0;
    for (int64_t c = 0; c < nchunks; c++) correct += slot[2 * c], loss_sum += slot[2 * c + 1];
    double terms = (double)n * (double)t->pos;
    *acc = n ? correct / terms : NAN;
    *loss = n ? loss_sum / terms : NAN;
}

/* Evaluation runs on rank 0's replica (all replicas are equal). */
int dp_trainer_evaluate(struct dp_trainer *t, const struct dp_dataset *ds, int64_t limit,
                        double *acc, double *loss) {
    if (!ds && !t->text) return dp_seterr(DP_EINVAL, "evaluate: no data set (only a text model has its own)");
    if (ds && t->text) return dp_seterr(DP_EINVAL, "evaluate: a text model evaluates its validation windows (ds NULL)");
    int64_t n = eval_count(t, ds, limit), nchunks = (n + t->eval_chunk - 1) / t->eval_chunk;
    double *slot = dp_calloc((size_t)(2 * nchunks + 1), sizeof(double));
    if (!slot) return dp_seterr(DP_ENOMEM, "evaluate: out of memory");
    int rc = eval_chunks(t, &t->w[0], ds, n, 0, nchunks, slot, 0);
    if (!rc) eval_totals(t, slot, nchunks, n, acc, loss);
    dp_free(slot);
    return rc;
}

/* The end-of-epoch evaluation, on every rank of the job at once (all
 * replicas are equal).  Each process takes its block of the chunks
 * (dp_comm_split over the processes), and its worker threads claim the
 * block's chunks one at a time from a shared counter, so a worker that
 * gets less CPU simply evaluates fewer chunks.  One all-reduce gathers the
 * slots: each slot has one nonzero contributor and x + 0 = x exactly, so
 * the totals are the bits dp_trainer_evaluate computes alone, whoever
 * evaluated which chunk.
 *
 * Sharing the work matters beyond speed: with rank 0 evaluating alone, the
 * others waited in a collective for the whole evaluation, and
 * --comm-timeout (meant for a stalled peer) fired whenever evaluation took
 * longer than the timeout.  Now the ranks of a process reach the
 * all-reduce within about one chunk of each other, and processes compute
 * equal blocks, as in a training step.
 *
 * The counter: every local worker has finished claiming once it enters the
 * all-reduce, so when local rank 0 leaves it no claim is in flight; it
 * resets the counter then, before the end-of-epoch barrier that every local
 * worker passes before the next evaluation. */
static int evaluate_shared(struct worker *w, double *acc, double *loss) {
    struct dp_trainer *t = w->t;
    const struct dp_dataset *ds = t->text ? NULL : &t->test;
    int64_t n = eval_count(t, ds, t->p.test_limit), nchunks = (n + t->eval_chunk - 1) / t->eval_chunk;
    int64_t c0, len;
    dp_comm_split(nchunks, t->G / t->P, t->base / t->P, &c0, &len);
    double *slot = dp_calloc((size_t)(2 * nchunks + 1), sizeof(double));
    if (!slot) return dp_seterr(DP_ENOMEM, "evaluate: out of memory");
    int rc = dp_zero_settle(&w->zero); /* ZeRO 1: the last step's all-gather, left in flight */
    if (w->zero.stage == 3 && w->zero.sharded) {
        /* ZeRO 3: each pass gathers the layers' ranges in turn (collectives),
         * so every rank runs as many passes: chunk c is rank c mod G's, and a
         * rank short of a chunk in the last round runs an empty one.  No
         * whole replica is built; the totals are the same bits. */
        for (int64_t c = w->grank; !rc && c - w->grank < nchunks; c += t->G)
            rc = eval_chunks(t, w, ds, n, c, c + 1, slot, 1);
        int rr = dp_zero_release_params(&w->zero);
        if (!rc) rc = rr;
    } else
        for (int64_t k; !rc && (k = atomic_fetch_add(&t->eval_next, 1)) < len;)
            rc = eval_chunks(t, w, ds, n, c0 + k, c0 + k + 1, slot, 0);
    if (!rc && t->G > 1 && nchunks > 0) rc = dp_comm_allreduce(w->comm, slot, 2 * nchunks, DP_DTYPE_F64, DP_ALGO_AUTO);
    if (w->rank == 0) atomic_store(&t->eval_next, 0);
    if (!rc) eval_totals(t, slot, nchunks, n, acc, loss);
    dp_free(slot);
    return rc;
}

static void emit(struct dp_trainer *t, struct dp_event *ev) {
    ev->steps_per_epoch = t->steps_per_epoch;
    ev->epochs = t->p.epochs;
    if (t->p.on_event) t->p.on_event(t->p.event_arg, ev);
}

static int checkpoint(struct dp_trainer *t) {
    if (!t->p.out_dir) return DP_OK;
    char path[4096];
    snprintf(path, sizeof path, "%s/checkpoint.bin", t->p.out_dir);
    t->zsaving = 1;
    int rc = dp_trainer_save(t, path);
    t->zsaving = 0;
    if (rc) return rc;
    struct dp_event ev = {.kind = DP_EVENT_CHECKPOINT, .step = t->step, .epoch = t->epoch, .path = path};
    emit(t, &ev);
    return DP_OK;
}

/* 1 if any x[i] is NaN or infinite: an all-ones exponent.  Integer tests so
 * the loop vectorises (a float sum would be a serial dependency chain).  The
 * bits are read with memcpy, not through a uint32_t pointer (which would
 * break strict aliasing); a 4-byte memcpy compiles to the same plain load:
 * gcc and clang at -O2 -march=native emit the very instructions of the old
 * pointer-cast loop (vpandd, vpcmpd over 16 floats at a time). */

/* BatchNorm statistics summed over the workers (SyncBatchNorm).  Timed:
 * the all-reduce is mostly a wait for the slowest worker, which --balance
 * must not count as this worker's compute. */
static int stat_sync(void *arg, double *buf, int64_t n) {
    struct worker *w = arg;
    double t0 = dp_time();
    int rc = dp_comm_allreduce(w->comm, buf, n, DP_DTYPE_F64, DP_ALGO_AUTO);
    w->stat_s += dp_time() - t0;
    return rc;
}

/* Every rank's k 64-bit hashes: on return (*all)[r * k + j] is rank r's hash
 * j (caller frees).  They travel as exact 32-bit halves in doubles through
 * one all-gather, whose size depends only on the job's rank count. */
static int gather_hashes(struct worker *w, const uint64_t *mine, int k, uint64_t **all) {
    struct dp_trainer *t = w->t;
    size_t n = (size_t)t->G * (size_t)k;
    double *h = dp_calloc(2 * n, sizeof(double));
    *all = dp_malloc(n * sizeof(uint64_t));
    if (!h || !*all) {
        dp_free(h), dp_free(*all), *all = NULL;
        return dp_seterr(DP_ENOMEM, "out of memory");
    }
    double *slot = h + 2 * (size_t)w->grank * (size_t)k;
    for (int j = 0; j < k; j++) slot[2 * j] = (double)(mine[j] >> 32), slot[2 * j + 1] = (double)(mine[j] & 0xffffffffu);
    int rc = dp_comm_allgather(w->comm, h, (int64_t)(2 * n), DP_DTYPE_F64, DP_ALGO_AUTO);
    for (size_t i = 0; i < n; i++) (*all)[i] = (uint64_t)h[2 * i] << 32 | (uint64_t)h[2 * i + 1];
    dp_free(h);
    if (rc) dp_free(*all), *all = NULL;
    return rc;
}

/* Compares every replica's parameter hash with rank 0's. */
static int check_replicas(struct worker *w) {
    /* dp_replica_hash's bytes; ZeRO 3 hashes its ranges as they are gathered, one at a time */
    uint64_t mine = DP_FNV1A64_INIT, *h;
    int rc = dp_zero_gather_params(&w->zero, 0, &mine);
    if (rc) return rc;
    mine = dp_fnv1a64(w->rep.buffers, sizeof(float) * (size_t)w->t->model->num_buffers, mine);
    rc = gather_hashes(w, &mine, 1, &h);
    for (int r = 1; !rc && r < w->t->G; r++)
        if (h[r] != h[0])
            rc = dp_seterr(DP_EMISMATCH, "step %lld: the replica of worker %d diverged from worker 0 "
                           "(parameter hash %016llx, expected %016llx)", (long long)w->step + 1, r,
                           (unsigned long long)h[r], (unsigned long long)h[0]);
    dp_free(h);
    return rc;
}

/* ---- slow workers on purpose (--simulate-slow, --simulate-jitter) --------------------------
 * A slowed rank sleeps (nanosleep: it never spins, so it leaves the core to
 * the others and a 2-core machine can emulate a cluster with one slow host)
 * (m - 1) x c per micro-batch, where c is the compute the rank really spent
 * on it (wall time from the end of its data wait, less the sleep) and
 * m = FACTOR x max(1, exp(SIGMA z)): a log-normal factor below 1 does
 * nothing (sleep cannot speed a worker up).  A jitter stall of MS ms is added
 * once per step, in the last micro-batch.
 *
 * Where the sleep goes.  With overlap the reducer starts a bucket's
 * all-reduce as soon as backward has finished its layers, so sleeping only
 * after backward would let the slowed rank's buckets start at full speed
 * (all but the last would not wait for it) and the wait would show up one
 * step late.  Instead the debt is paid at every grad_ready callback, before
 * the bucket is handed to the reducer: each bucket becomes ready at
 * t0 + m x (compute up to it), exactly when an m-times slower host's would,
 * and the rest (forward's share too when backward reports nothing) is paid
 * after backward, before the reduction is waited for.  Without a reduction
 * in the micro-batch (accumulation, one worker) it is all paid at its end;
 * deterministic mode reduces once after the last chunk, so it pays once,
 * before that all-reduce.  The draws are (seed, DP_RNG_SLOW, rank, 2 step)
 * for the stall and (..., 2 step + 1) for z: a run replays exactly. */
static int slow_err(const char *opt, const char *spec, const char *what) {
    return dp_seterr(DP_EINVAL, "%s '%s': %s", opt, spec, what);
}

int dp_parse_simulate_slow(const char *spec, int world, double *factor) {
    const char *o = "--simulate-slow";
    if (!spec || !*spec) return slow_err(o, spec ? spec : "", "expected RANK:FACTOR[,RANK:FACTOR...]");
    if (factor)
        for (int r = 0; r < world; r++) factor[r] = 0; /* 0: not named yet */
    char msg[160];
    for (const char *s = spec;;) {
        char *end;
        errno = 0;
        long r = strtol(s, &end, 10);
        if (end == s || *end != ':' || errno || (s[0] != '-' && (s[0] < '0' || s[0] > '9')))
            return slow_err(o, spec, "expected RANK:FACTOR[,RANK:FACTOR...]");
        const char *fs = end + 1;
        double f = strtod(fs, &end);
        if (end == fs || (*end && *end != ',') || (fs[0] != '.' && (fs[0] < '0' || fs[0] > '9')))
            return slow_err(o, spec, "expected RANK:FACTOR[,RANK:FACTOR...]");
        if (r < 0 || (world > 0 && r >= world)) {
            if (world > 0) snprintf(msg, sizeof msg, "rank %ld is out of range 0..%d (the job has %d rank%s)", r,
                                    world - 1, world, world > 1 ? "s" : "");
            else snprintf(msg, sizeof msg, "rank %ld is out of range (ranks count from 0)", r);
            return slow_err(o, spec, msg);
        }
        if (!(f >= 1 && f <= 1000)) {
            snprintf(msg, sizeof msg, "rank %ld: factor %g must be in 1..1000 (1 = full speed)", r, f);
            return slow_err(o, spec, msg);
        }
        if (factor) {
            if (factor[r] != 0) {
                snprintf(msg, sizeof msg, "rank %ld is given twice", r);
                return slow_err(o, spec, msg);
            }
            factor[r] = f;
        }
        if (!*end) break;
        s = end + 1;
    }
    if (factor)
        for (int r = 0; r < world; r++)
            if (factor[r] == 0) factor[r] = 1;
    return DP_OK;
}

int dp_parse_simulate_jitter(const char *spec, struct dp_jitter *j) {
    const char *o = "--simulate-jitter";
    memset(j, 0, sizeof *j);
    if (!spec || !*spec) return slow_err(o, spec ? spec : "", "expected p=P,ms=MS and/or lognormal=SIGMA");
    int have_p = 0, have_ms = 0, have_ln = 0;
    char msg[160];
    for (const char *s = spec;;) {
        const char *eq = strchr(s, '='), *comma = strchr(s, ',');
        if (!comma) comma = s + strlen(s);
        if (!eq || eq > comma) return slow_err(o, spec, "expected KEY=VALUE items (p, ms, lognormal)");
        size_t kl = (size_t)(eq - s);
        char *end;
        errno = 0;
        double v = strtod(eq + 1, &end);
        if (end == eq + 1 || end != comma || errno || !isfinite(v)) {
            snprintf(msg, sizeof msg, "'%.*s' is not KEY=NUMBER", (int)(comma - s), s);
            return slow_err(o, spec, msg);
        }
        if (kl == 1 && !strncmp(s, "p", 1)) {
            if (!(v >= 0 && v <= 1)) return slow_err(o, spec, "p must be in [0, 1]");
            j->p = v, have_p++;
        } else if (kl == 2 && !strncmp(s, "ms", 2)) {
            if (!(v >= 0 && v <= 1e6)) return slow_err(o, spec, "ms must be in 0..1000000");
            j->ms = v, have_ms++;
        } else if (kl == 9 && !strncmp(s, "lognormal", 9)) {
            if (!(v >= 0 && v <= 10)) return slow_err(o, spec, "lognormal SIGMA must be in 0..10");
            j->sigma = v, have_ln++;
        } else {
            snprintf(msg, sizeof msg, "unknown key '%.*s' (expected p, ms or lognormal)", (int)kl, s);
            return slow_err(o, spec, msg);
        }
        if (!*comma) break;
        s = comma + 1;
    }
    if (have_p > 1 || have_ms > 1 || have_ln > 1) return slow_err(o, spec, "a key is given twice");
    if (have_p != have_ms) return slow_err(o, spec, "p and ms go together (p=P,ms=MS)");
    return DP_OK;
}

/* This step's compute multiplier and stall (s) for worker w. */
static void pace_plan(const struct worker *w, double *mult, double *stall) {
    const struct dp_trainer *t = w->t;
    uint64_t a = (uint64_t)w->grank, b = 2 * (uint64_t)w->step;
    *mult = t->slow_factor ? t->slow_factor[w->grank] : 1;
    *stall = 0;
    if (t->jit.sigma > 0) {
        double f = exp(t->jit.sigma * (double)dp_rng_normal(t->p.seed, DP_RNG_SLOW, a, b + 1));
        if (f > 1) *mult *= f;
    }
    if (t->jit.p > 0 && (double)dp_rng_uniform(t->p.seed, DP_RNG_SLOW, a, b) < t->jit.p) *stall = t->jit.ms * 1e-3;
}

/* Starts pacing one micro-batch whose compute starts at t0. */
static void pace_start(struct worker *w, double mult, double stall, double t0) {
    w->pace_mult = mult, w->pace_stall = stall, w->pace_t0 = t0, w->pace_slept = 0;
}

/* Sleeps what this micro-batch owes so far: (m - 1) x its compute up to
 * now, plus the stall, less what it slept already (an oversleep is paid
 * back at the next point).  Debts under 50 us wait for the next point. */
static void pace(struct worker *w) {
    if (!w->t->simulate) return;
    double now = dp_time();
    double owed = (w->pace_mult - 1) * (now - w->pace_t0 - w->pace_slept) + w->pace_stall - w->pace_slept;
    if (owed < 50e-6) return;
    struct timespec ts = {(time_t)owed, (long)((owed - floor(owed)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    double t1 = dp_time();
    dp_timeline_add(&w->tl, "slow", 0, w->step, now, t1);
    w->pace_slept += t1 - now;
}

/* The grad_ready callback of a paced worker: pay the debt, then hand the
 * layer to the reducer (see above). */
static void paced_grad_ready(void *arg, int64_t offset, int64_t count) {
    struct worker *w = arg;
    pace(w);
    dp_reducer_grad_ready(&w->red, offset, count);
}

/* After a step: every rank's wait gathered into waits[0..G), and the last
 * arriver.  The rank that arrives last at a reduction finds the others
 * there and waits least (only for the transfer), so the last arriver is the
 * rank with the smallest wait: no clock is compared across ranks (MPI hosts
 * share none).  One all-gather of G doubles per step (a latency-bound
 * collective, not yet benchmarked), only when gather_waits (docs/ddp.md).
 * Exposed (dp/train.h) so that `dptrain calibrate` times this very call. */
int dp_train_gather_waits(struct dp_comm *comm, int G, int rank, double wait, double *waits, int *last) {
    memset(waits, 0, sizeof(double) * (size_t)G);
    waits[rank] = wait;
    int rc = dp_comm_allgather(comm, waits, G, DP_DTYPE_F64, DP_ALGO_AUTO);
    *last = 0;
    for (int r = 1; r < G; r++)
        if (waits[r] < waits[*last]) *last = r;
    return rc;
}
static int gather_waits(struct worker *w, int *last) {
    return dp_train_gather_waits(w->comm, w->t->G, w->grank, w->step_wait, w->waits, last);
}

/* ---- backup workers (--backup-workers b) ---------------------------------------------------
 * Each synchronous step takes the gradients of the first P - b workers to
 * finish their compute and drops the others'.  No collective is involved
 * (an all-reduce needs every rank): the P workers of this process meet in
 * t->bk under one mutex.  Every worker runs every step, in order:
 *
 *   compute its gradient sum g_r over its n_r samples (loss scale 1)
 *   arrive at step s:  if s is still open and fewer than P - b ranks were
 *       accepted, it is accepted (the slot keeps a pointer to g_r, which
 *       it leaves untouched until s is published); else it is dropped
 *   the (P - b)-th accepted rank closes s: once ring slot s % D is free
 *       (every worker took step s - D), it writes
 *           u = (sum over accepted r, in rank order, of g_r) / (sum n_r x pos)
 *       the mean gradient over the accepted samples, whatever the arrival
 *       order within the accepted set, marks the others dropped, and opens
 *       s + 1
 *   every worker, accepted or late, waits for step s's u, copies it, and
 *   applies it with its own optimizer: the same bits on every replica
 *
 * So a late worker finishes its (dropped) compute, applies the step's update
 * and starts step s + 1 from the new parameters.  The ranks that close steps
 * run at most D steps ahead of the latest one (the ring), and since every
 * worker runs the same sequence of steps, the collectives between steps
 * (--check-replicas, the epoch's totals, --balance) stay matched.  No step
 * ends half-done: a worker that fails sets bk.failed (backup_abort, from
 * worker_main) and every waiter returns DP_ECANCELED; a wait longer than
 * --comm-timeout fails the run naming the ranks that did not arrive.  A step
 * whose accepted ranks had no samples (empty shares) applies no update, on
 * every replica alike. */

/* Wakes every waiter of the slot with an error (idempotent; any thread). */
static void backup_abort(struct dp_trainer *t, const char *why) {
    struct backup *bk = &t->bk;
    if (t->star) dp_backup_star_abort(t->star, why);
    if (!t->bk_on || !bk->init) return;
    pthread_mutex_lock(&bk->mu);
    if (!bk->failed) {
        bk->failed = 1;
        snprintf(bk->why, sizeof bk->why, "%.300s", why);
    }
    pthread_cond_broadcast(&bk->cv);
    pthread_mutex_unlock(&bk->mu);
}

/* One wait on the slot (mu held) until deadline (dp_time; 0 = none).  At
 * the deadline it marks the slot failed with a message naming the ranks
 * that have not arrived at the open step, and returns 1 (the caller then
 * aborts the communicator too, as a collective's timeout does). */
static int backup_wait(struct worker *w, double deadline) {
    struct backup *bk = &w->t->bk;
    if (deadline <= 0) {
        pthread_cond_wait(&bk->cv, &bk->mu);
        return 0;
    }
    if (dp_cond_wait_until(&bk->cv, &bk->mu, deadline) != ETIMEDOUT) return 0;
    if (bk->failed) return 0;
    char who[200] = "";
    size_t len = 0;
    for (int r = 0; r < w->t->P && len + 16 < sizeof who; r++)
        if (bk->arrived[r] < bk->open) len += (size_t)snprintf(who + len, sizeof who - len, "%s%d", len ? ", " : "", w->t->base + r);
    snprintf(bk->why, sizeof bk->why, "comm: timeout after %.1f s in backup-workers step %lld on rank %d: %s",
             w->t->p.comm_timeout, (long long)bk->open, w->grank,
             len ? "rank(s) did not arrive: " : "a rank did not take the previous update");
    if (len) snprintf(bk->why + strlen(bk->why), sizeof bk->why - strlen(bk->why), "%s", who);
    bk->failed = 1;
    pthread_cond_broadcast(&bk->cv);
    return 1;
}

/* Worker w's arrival at its step w->step with its gradient sum in
 * w->rep.grads over n_local samples; on return w->rep.grads holds the step's
 * gradient (see above), *n_acc the accepted samples (0: apply nothing) and
 * *bad whether it is not finite; w->dropped the dropped ranks. */
static int backup_step(struct worker *w, double n_local, double *n_acc, int *bad) {
    struct dp_trainer *t = w->t;
    struct backup *bk = &t->bk;
    const int64_t s = w->step, np = t->model->num_params;
    const int k = (int)(s % BACKUP_DEPTH), P = t->P;
    double deadline = t->p.comm_timeout > 0 ? dp_time() + t->p.comm_timeout : 0;
    int timed = 0;
    pthread_mutex_lock(&bk->mu);
    bk->arrived[w->rank] = s;
    pthread_cond_broadcast(&bk->cv); /* a timeout message reads `arrived` */
    if (bk->open == s && bk->count < bk->need) {
        bk->src[w->rank] = w->rep.grads, bk->n[w->rank] = n_local;
        if (++bk->count == bk->need) {
            /* the closer: ring slot k must be free (every worker took step s - D) */
            while (!bk->failed && bk->upd_step[k] >= 0 && bk->consumed[k] < P) timed |= backup_wait(w, deadline);
            if (!bk->failed) {
                float *u = bk->upd[k];
                double n = 0;
                int first = 1;
                for (int r = 0; r < P; r++) {
                    bk->acc[k][r] = bk->src[r] != NULL;
                    if (!bk->src[r]) continue;
                    n += bk->n[r];
                    if (first) memcpy(u, bk->src[r], sizeof(float) * (size_t)np), first = 0;
                    else {
                        const float *g = bk->src[r];
#pragma omp simd
                        for (int64_t i = 0; i < np; i++) u[i] += g[i];
                    }
                    bk->src[r] = NULL;
                }
                /* sum -> mean over the accepted samples x positions */
                float scale = n > 0 ? (float)(1.0 / (n * (double)t->pos)) : 0.0f;
#pragma omp simd
                for (int64_t i = 0; i < np; i++) u[i] *= scale;
                bk->upd_n[k] = n;
                bk->upd_bad[k] = n > 0 && dp_any_nonfinite(u, np);
                bk->upd_step[k] = s;
                bk->consumed[k] = 0;
                bk->open = s + 1;
                bk->count = 0;
                pthread_cond_broadcast(&bk->cv);
            }
        }
    }
    while (!bk->failed && bk->upd_step[k] != s) timed |= backup_wait(w, deadline);
    if (bk->failed) {
        char why[sizeof bk->why];
        snprintf(why, sizeof why, "%s", bk->why);
        pthread_mutex_unlock(&bk->mu);
        if (timed) dp_comm_abort(w->comm, why); /* wake the ranks blocked in collectives */
        return dp_seterr(DP_ECANCELED, "%s", why);
    }
    *n_acc = bk->upd_n[k], *bad = bk->upd_bad[k];
    w->ndropped = 0;
    for (int r = 0; r < P; r++) w->dropped[r] = !bk->acc[k][r], w->ndropped += !bk->acc[k][r];
    pthread_mutex_unlock(&bk->mu);
    /* the slot is not rewritten before every worker has taken it (consumed) */
    memcpy(w->rep.grads, bk->upd[k], sizeof(float) * (size_t)np);
    pthread_mutex_lock(&bk->mu);
    if (++bk->consumed[k] == P) pthread_cond_broadcast(&bk->cv);
    pthread_mutex_unlock(&bk->mu);
    return DP_OK;
}

/* The same step across processes, through rank 0 (src/ddp/backup_star.c). */
static int backup_star(struct worker *w, double n_local, double *n_acc, int *bad) {
    struct dp_trainer *t = w->t;
    int rc = dp_backup_star_step(t->star, w->step, w->rep.grads, n_local, n_acc, bad, w->dropped);
    if (rc) return rc;
    w->ndropped = 0;
    for (int r = 0; r < t->G; r++) w->dropped[r] = !w->dropped[r], w->ndropped += w->dropped[r];
    return DP_OK;
}

/* ---- heterogeneity-aware batches (--balance) ------------------------------------------------
 * Each rank measures its throughput: samples over compute seconds (forward
 * + backward, plus its simulated slowness; not the data wait nor its waits
 * in collectives, the reduction's and SyncBatchNorm's, which measure the
 * others), and its fixed part: the update's seconds per step, the same work
 * whatever its share (not with ZeRO, whose update waits in its gather).
 * Every `balance` steps the ranks all-gather (samples, seconds, update
 * seconds per step) since the last re-plan, one G x 3 doubles collective at
 * those steps only, and every rank updates the same EMAs and computes the
 * same plan from the same gathered numbers:
 *
 *   rate_r = round(1024 n_r / s_r)          (integer, clamped to 1..2^30)
 *   fix_r  = round(1e6 a_r)                 (µs, clamped to 1..2^23)
 *   ema    = the first value, else (ema + value) / 2  (integers, each)
 *   share  = dp_balance_plan(ema_rate, ema_rate ema_fix / (1e6 align), G, U)
 *                                           U = ceil(batch / align) units
 *
 * so that a_r + n_r / s_r, each rank's step, is the same for all (a core
 * that is slower at the memory-bound update as well as at compute, as one
 * of the 2-core VM's often is, gets fewer samples for both reasons).
 * From the gathered doubles on, everything is integer arithmetic, so no
 * rank (nor a rank built by another compiler) can round differently.  A
 * rank with an empty share measures nothing and keeps its EMA.  The plan is
 * adopted only when some rank's share moves by max(1, U / 32) units or more:
 * each change discards the prefetched batches and gives the GEMMs new
 * shapes, not worth it for a sample or two of noise.  The split itself is
 * dp_loader_split; the gradient does not depend on it (docs/ddp.md). */
#define BAL_RATE_MAX ((int64_t)1 << 30)
#define BAL_FIX_MAX ((int64_t)1 << 40) /* 1/1024 units */

/* Rank r's plan with fixed parts.  Its step lasts a_r + n_r / v_r (a_r: the
 * update, the same work whatever its share; v_r: its units per second), and
 * the shares that end every rank's step together are n_r = v_r (T - a_r)
 * with sum n_r = U.  In units: f_r = v_r a_r (what r could have computed
 * during its fixed part) and n_r = (U + sum f) v_r / sum v - f_r.  With the
 * one unit each reserved first (min), the free units are apportioned that
 * way; a rank whose n_r would fall below 0 (its fixed part alone outlasts
 * the others' steps) keeps min and leaves the sum (water-filling).  Exact
 * fractions: n_r = num_r / (Q 1024), num_r = (free 1024 + F) q_r - f_r Q,
 * f in 1/1024 units; |num_r| < 2^127. */
typedef __int128 bal_wide; /* gcc and clang */
static bal_wide bal_num(int64_t free, int64_t F, int64_t Q, int64_t q, int64_t f) {
    return ((bal_wide)free * 1024 + F) * q - (bal_wide)f * Q;
}

void dp_balance_plan(const int64_t *rate, const int64_t *fixed, int world, int64_t units, int64_t *share) {
    int64_t known = 0, sum = 0;
    for (int r = 0; r < world; r++)
        if (rate[r] > 0) known++, sum += rate[r] < BAL_RATE_MAX ? rate[r] : BAL_RATE_MAX;
    int64_t fill = known ? sum / known : 1; /* an unmeasured rank counts as the mean */
    if (fill < 1) fill = 1;
#define BAL_Q(r) (rate[r] > 0 ? (rate[r] < BAL_RATE_MAX ? rate[r] : BAL_RATE_MAX) : fill)
#define BAL_F(r) (fixed && fixed[r] > 0 ? (fixed[r] < BAL_FIX_MAX ? fixed[r] : BAL_FIX_MAX) : 0)
    /* One unit each first (when there are enough): a rank with no work
     * measures nothing, so the plan could never see it speed up again. */
    int64_t min = units >= world ? 1 : 0, free = units - min * world, Q, F;
    /* share[r] = -1: out of the apportioning (keeps min) */
    for (int r = 0; r < world; r++) share[r] = 0;
    for (int changed = 1; changed;) {
        changed = 0, Q = 0, F = 0;
        for (int r = 0; r < world; r++)
            if (share[r] == 0) Q += BAL_Q(r), F += BAL_F(r);
        for (int r = 0; r < world; r++)
            if (share[r] == 0 && bal_num(free, F, Q, BAL_Q(r), BAL_F(r)) < 0) share[r] = -1, changed = 1;
    }
    /* Largest remainders: floor(n_r) each, then one more unit to the ranks
     * with the largest remainders (ties: the lower rank).  Without fixed
     * parts this is floor(free q_r / Q) and the remainders of free q_r / Q. */
    const int64_t den = Q * 1024;
    int64_t given = 0;
    for (int r = 0; r < world; r++) {
        int64_t n = share[r] < 0 ? 0 : (int64_t)(bal_num(free, F, Q, BAL_Q(r), BAL_F(r)) / den);
        share[r] = min + n;
        given += n;
    }
    for (int64_t left = free - given; left > 0; left--) {
        int best = -1;
        bal_wide best_rem = -1;
        for (int r = 0; r < world; r++) {
            bal_wide num = bal_num(free, F, Q, BAL_Q(r), BAL_F(r));
            /* out of the apportioning, or already given its extra unit */
            if (num < 0 || share[r] > min + (int64_t)(num / den)) continue;
            if (num % den > best_rem) best = r, best_rem = num % den;
        }
        share[best]++;
    }
#undef BAL_Q
#undef BAL_F
}

/* The re-plan, on every rank after the same steps (see above). */
static int rebalance(struct worker *w) {
    struct dp_trainer *t = w->t;
    int G = t->G;
    memset(w->bal_buf, 0, 3 * sizeof(double) * (size_t)G);
    double *mine = w->bal_buf + 3 * w->grank;
    mine[0] = w->bal_n, mine[1] = w->bal_s, mine[2] = w->bal_k > 0 ? w->bal_a / (double)w->bal_k : 0;
    w->bal_n = w->bal_s = w->bal_a = 0, w->bal_k = 0;
    int rc = dp_comm_allgather(w->comm, w->bal_buf, 3 * G, DP_DTYPE_F64, DP_ALGO_AUTO);
    if (rc) return rc;
    for (int r = 0; r < G; r++) {
        double n = w->bal_buf[3 * r], sec = w->bal_buf[3 * r + 1], fix = w->bal_buf[3 * r + 2];
        if (fix > 0) { /* the update's µs per step, within 1 µs .. 2^23 µs */
            double us = fix * 1e6;
            int64_t f = !(us < (double)(1 << 23)) ? 1 << 23 : us < 1 ? 1 : (int64_t)llround(us);
            w->bal_fix[r] = w->bal_fix[r] > 0 ? (w->bal_fix[r] + f) / 2 : f;
        }
        if (!(n > 0 && sec > 0)) continue;
        double x = n * 1024.0 / sec;
        int64_t rate = !(x < (double)BAL_RATE_MAX) ? BAL_RATE_MAX : x < 1 ? 1 : (int64_t)llround(x);
        w->bal_rate[r] = w->bal_rate[r] > 0 ? (w->bal_rate[r] + rate) / 2 : rate;
    }
    int64_t a = t->bal_align, U = (t->p.batch + a - 1) / a, move = 0;
    /* the fixed parts in 1/1024 units: rate (1024 samples/s) x µs / 1e6 / align
     * (< 2^53: rate <= 2^30, µs <= 2^23); a rank not measured yet has none */
    for (int r = 0; r < G; r++)
        w->bal_fixu[r] = w->bal_rate[r] > 0 ? w->bal_rate[r] * w->bal_fix[r] / (1000000 * a) : 0;
    dp_balance_plan(w->bal_rate, w->bal_fixu, G, U, w->bal_new);
    for (int r = 0; r < G; r++) {
        int64_t cur = w->bal_share ? w->bal_share[r] : U / G + (r < U % G); /* NULL: the equal split */
        int64_t d = w->bal_new[r] - cur;
        if (d < 0) d = -d;
        if (d > move) move = d;
    }
    if (move < (U / 32 > 1 ? U / 32 : 1)) return DP_OK;
    if (!w->bal_share && !(w->bal_share = dp_malloc(sizeof(int64_t) * (size_t)G)))
        return dp_seterr(DP_ENOMEM, "trainer: out of memory");
    memcpy(w->bal_share, w->bal_new, sizeof(int64_t) * (size_t)G);
    return dp_loader_set_shares(w->loader, w->bal_share);
}

/* ---- the update after the reduction -------------------------------------------------------
 * Plain: every worker checks, clips and updates the whole slab.  ZeRO
 * (dp/ddp.h): only this worker's shard of g is used (with --zero-reduce
 * scatter it is the only part that holds the sum), so the non-finite check
 * and the clipping norm come from the all-reduced shard sums of squares, and
 * after the shard update the parameters are all-gathered. */

/* The check for non-finite values inside the reduction.  After an
 * all-reduce every worker holds the same sum, and each worker used to read
 * all of it again to look for an Inf or a NaN: one more pass over the whole
 * gradient per worker and step (about 35 µs of mlp's 2.2 ms step on the
 * 2-core VM, docs/results.md "The check inside the reduction").  On threads
 * in one process the direct all-reduce hands each range to the worker that
 * summed it, while the sum is in that core's cache (dp_comm_iallreduce_post),
 * and that worker looks at it there: every element is looked at once, by one
 * worker.  A worker that finds one records the step in red_bad; every range
 * is looked at before any worker's all-reduce completes (the hook runs before
 * the summer's completion mark, which every rank waits for), so after the
 * reduction every worker reads the same verdict.  The decision that follows
 * (fail, or skip with --skip-nonfinite) is the one the full pass made: the
 * scaling after accumulation (by 1 / N <= 1) keeps finite values finite.
 * Only where the reduction is a plain all-reduce of every replica in this
 * process (not processes, ZeRO, compression, deterministic mode, backup
 * workers or the parameter server), with the direct algorithm for every
 * bucket. */
static int red_check_possible(const struct dp_trainer *t) {
    const struct dp_train_params *p = &t->p;
    if (t->G < 2 || t->G != t->P || p->inter || p->deterministic || p->async || t->bk_on || p->zero ||
        p->compress.kind != DP_COMPRESS_NONE)
        return 0;
    const struct dp_reducer *r = &t->w[0].red;
    for (int i = 0; i < r->nb; i++)
        if (!dp_comm_post_supported(r->comm, r->b[i].count, DP_DTYPE_F32, r->p.algo)) return 0;
    return 1;
}

static void reduced_check(void *arg, int64_t off, int64_t n) {
    struct worker *w = arg;
    if (dp_any_nonfinite(w->rep.grads + off, n))
        atomic_store_explicit(&w->t->red_bad, w->step + 1, memory_order_relaxed);
}

/* *bad = 1 when the reduced gradient is not finite, on every worker alike;
 * *ss = ||g||^2 with ZeRO (0 otherwise). */
static int grad_nonfinite(struct worker *w, const float *g, double *ss, int *bad) {
    *ss = 0;
    if (!w->t->p.zero) {
        *bad = dp_any_nonfinite(g, w->t->model->num_params);
        return DP_OK;
    }
    int rc = dp_zero_sumsq(&w->zero, g, ss);
    *bad = !isfinite(*ss);
    return rc;
}

/* [clip to clip_norm] -> optimizer step at lr (ss: ZeRO's ||g||^2). */
static int update(struct worker *w, float *g, float lr, double clip_norm, double ss) {
    struct dp_trainer *t = w->t;
    int64_t np = t->model->num_params;
    if (!t->p.zero) {
        if (clip_norm > 0) dp_clip_grad_norm(g, np, clip_norm);
        return dp_optim_step(&w->opt, w->rep.params, g, np, lr);
    }
    int rc = dp_zero_step(&w->zero, &w->opt, w->rep.params, g, lr, clip_norm, ss);
    if (w->zero.t_g1 > w->zero.t_g0) dp_timeline_add(&w->tl, "gather", 0, w->step, w->zero.t_g0, w->zero.t_g1);
    return rc;
}

/* The error-feedback state of a multi-process job, for dp_trainer_save:
 * rank 0 writes the file, so every rank's state (len floats) comes to it.
 * One file with every rank's state, as a single-process job writes it,
 * rather than one file per rank: a resume reads one path (any rank count
 * that matches can resume, and the same file resumes on threads), and no
 * rank's disk has to be shared.  Through the worker's communicator in
 * rounds: round k all-gathers G blocks of B floats, block r = rank r's
 * state[k B, (k+1) B), so no rank holds more than G B floats besides rank
 * 0's G x len (B: about 1M / G).  Called by every worker where rank 0
 * then writes a checkpoint. */
static int ef_gather_state(struct worker *w) {
    struct dp_trainer *t = w->t;
    const int64_t len = dp_reducer_state_len(&w->red), G = t->G;
    if (!t->p.out_dir || len == 0 || t->G == t->P) return DP_OK;
    int64_t B = ((int64_t)1 << 20) / G;
    if (B < 1) B = 1;
    if (B > len) B = len;
    float *mine = dp_malloc_big(sizeof(float) * (size_t)len), *buf = dp_malloc_big(sizeof(float) * (size_t)(G * B));
    if (w->grank == 0 && !t->efstate) t->efstate = dp_malloc_big(sizeof(float) * (size_t)(G * len));
    if (!mine || !buf || (w->grank == 0 && !t->efstate)) {
        dp_free(mine), dp_free(buf);
        return dp_seterr(DP_ENOMEM, "checkpoint: out of memory for the error-feedback state");
    }
    dp_reducer_state_get(&w->red, mine);
    int rc = DP_OK;
    for (int64_t k0 = 0; !rc && k0 < len; k0 += B) {
        const int64_t n = len - k0 < B ? len - k0 : B;
        memcpy(buf + w->grank * B, mine + k0, sizeof(float) * (size_t)n);
        rc = dp_comm_allgather(w->comm, buf, G * B, DP_DTYPE_F32, DP_ALGO_AUTO);
        for (int64_t q = 0; !rc && w->grank == 0 && q < G; q++)
            memcpy(t->efstate + q * len + k0, buf + q * B, sizeof(float) * (size_t)n);
    }
    if (!rc && w->grank == 0) t->efstate_step = w->opt.step;
    dp_free(mine), dp_free(buf);
    return rc;
}

/* The update phase's seconds of one step (from the reduced gradient to the
 * updated parameters): the optimizer total, and --balance's fixed part
 * (not with ZeRO, whose update waits in its gather). */
static void update_done(struct worker *w, double s) {
    w->t_opt += s;
    if (!w->t->p.zero) w->bal_a += s, w->bal_k++;
}

/* One optimizer step on worker w: `accum` micro-batches, the reduction,
 * the update.  Returns 0, or an error (already with its context). */
static int train_step(struct worker *w, int64_t nmicro, int64_t *skipped, double *n_step, double *loss_step) {
    struct dp_trainer *t = w->t;
    const struct dp_model *m = t->model;
    if (t->p.fault_kind == DP_FAULT_SLOW && w->grank == t->p.fault_worker && w->step >= t->p.fault_step)
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    /* ZeRO 2, 3: the last reduction gave the slab back zeroed (dp_zero_bucket_done) */
    if (!w->zero.sharded) memset(w->rep.grads, 0, sizeof(float) * (size_t)m->num_params);
    /* Forward in training mode updates the BatchNorm running statistics
     * before anyone knows whether this step will be skipped, and with
     * SyncBatchNorm one worker's NaN reaches every replica's statistics.
     * So with --skip-nonfinite the buffer slab (3 floats per BN channel:
     * 1353 floats for resnet, 0.4% of its parameters) is saved here and put back
     * if the step is skipped: a skipped step leaves parameters, buffers and
     * optimizer state exactly as they were.  (Deferring the update into
     * the layer would need a commit call through every layer for a copy
     * this small.) */
    if (w->buf_save) memcpy(w->buf_save, w->rep.buffers, sizeof(float) * (size_t)m->num_buffers);
    double n_total = 0, loss_sum = 0, n_local = 0;
    int local_bad = 0;
    double mult = 1, stall = 0;
    if (t->simulate) pace_plan(w, &mult, &stall);
    w->step_wait = w->step_slow = 0;
    for (int64_t k = 0; k < nmicro; k++) {
        const struct dp_loader_batch *lb;
        double td = dp_time();
        int rc = dp_loader_next(w->loader, &lb);
        if (rc) return rc;
        double ta = dp_time();
        dp_timeline_add(&w->tl, "data", 0, w->step, td, ta);
        int last_micro = k == nmicro - 1;
        /* with one worker there is nothing to reduce: no reducer, no
         * progress thread to wake */
        int last = last_micro && t->G > 1 && !t->bk_on; /* backup workers: no reducer (backup_step) */
        /* ZeRO 2, 3: every micro-batch is reduce-scattered, and its pieces
         * added into gshard (dp_zero_bucket_done), so no whole gradient stays
         * alive from one micro-batch to the next (k times the traffic) */
        if (w->zero.sharded && t->G > 1) last = 1, w->zero.accumulate = k > 0;
        struct dp_batch b = {.B = lb->B, .x = lb->x, .tokens = lb->tokens, .targets = lb->y,
                             .sample_idx = lb->idx, .epoch = lb->epoch};
        /* With one micro-batch the global batch size is known before
         * backward, so the 1/N of the mean (N = samples x positions) is
         * folded into the loss gradient (no extra pass); with accumulation
         * the sum is scaled at the end. */
        float ls = nmicro == 1 && !t->bk_on ? (float)(1.0 / ((double)lb->global_B * (double)t->pos)) : 1.0f;
        struct dp_pass pass = {.training = 1, .backward = 1, .seed = t->p.seed, .loss_scale = ls};
        if (t->G > 1 && !t->bk_on) pass.stat_sync = stat_sync, pass.stat_sync_arg = w;
        if ((w->zero.sharded && w->zero.stage == 3) || w->zero.ahead) /* ZeRO 3: gather; 1: wait for the gather */
            pass.layer_begin = dp_zero_layer_begin, pass.layer_begin_arg = &w->zero;
        pace_start(w, mult, last_micro ? stall : 0, ta);
        double stat_before = w->stat_s;
        if (last) {
            pass.grad_ready = t->simulate ? paced_grad_ready : dp_reducer_grad_ready;
            pass.grad_ready_arg = t->simulate ? (void *)w : (void *)&w->red;
            w->red.step = w->step;
            /* the scale applied after the reduction (below): 1 when folded into the loss */
            w->red.grad_unit = nmicro == 1 ? 1.0f
                               : (float)(1.0 / ((n_total + (double)lb->global_B) * (double)t->pos));
            dp_reducer_begin(&w->red);
        }
        int fault = t->p.fault_kind && w->grank == t->p.fault_worker && w->step == t->p.fault_step && last_micro;
        if (fault && t->p.fault_kind == DP_FAULT_ALLOC) rc = dp_seterr(DP_ENOMEM, "injected allocation failure");
        else if (fault && t->p.fault_kind == DP_FAULT_DATA) rc = dp_seterr(DP_EIO, "injected data error");
        else if (fault && t->p.fault_kind == DP_FAULT_NAN && b.B > 0) {
            /* a NaN in one input: forward, loss and gradients all turn NaN */
            size_t n = (size_t)(b.B * dp_shape_numel(&m->in_shape));
            float *x = dp_malloc(n * sizeof(float));
            if (!x) return dp_seterr(DP_ENOMEM, "out of memory");
            memcpy(x, b.x, n * sizeof(float));
            x[0] = NAN;
            b.x = x;
            rc = dp_model_run(m, &w->rep, &b, &pass);
            dp_free(x);
        } else
            rc = dp_model_run(m, &w->rep, &b, &pass);
        /* ZeRO 3: backward's last bucket (and any prefetch) given back */
        int rrc = pass.layer_begin ? dp_zero_release_params(&w->zero) : DP_OK;
        if (!rc) rc = rrc;
        if (rc) {
            if (last) { /* leave nothing in flight, and keep this error's message */
                char msg[512];
                snprintf(msg, sizeof msg, "%s", dp_errmsg());
                dp_reducer_finish(&w->red);
                dp_seterr(rc, "%s", msg);
            }
            return rc;
        }
        /* the sleep paid inside backward (grad_ready) is not compute; the
         * rest of the debt is paid now, before the reduction is waited for */
        double slept_in_run = w->pace_slept;
        pace(w);
        w->step_slow += w->pace_slept;
        /* --balance: this rank's compute, its simulated slowness included
         * (a slowed rank is a slower host); the wait for others is not, nor
         * SyncBatchNorm's all-reduces inside forward and backward (there a
         * faster rank waits for the slower one) */
        w->bal_n += (double)b.B;
        w->bal_s += pass.t_forward + pass.t_backward + (w->pace_slept - slept_in_run) - (w->stat_s - stat_before);
        dp_timeline_add(&w->tl, "forward", 0, w->step, ta, ta + pass.t_forward);
        dp_timeline_add(&w->tl, "backward", 0, w->step, ta + pass.t_forward, ta + pass.t_forward + pass.t_backward);
        if (last) {
            rc = dp_reducer_finish(&w->red);
            /* wait: from the end of this rank's compute (backward and its
             * simulated sleep) to the completion of its last bucket */
            w->step_wait += w->red.t_end - w->red.t_backward_end;
            dp_timeline_add(&w->tl, "wait", 0, w->step, w->red.t_backward_end, w->red.t_end);
            for (int i = 0; i < w->red.nb; i++)
                if (w->red.b[i].t_ready > 0) {
                    dp_timeline_add_bucket(&w->tl, i, (int64_t)sizeof(float) * w->red.b[i].count,
                                           w->red.b[i].t_ready, w->red.b[i].t_done);
                    w->arrival[i] += w->red.b[i].t_ready - w->t_step0;
                }
            w->arrival_steps++;
            /* compression: its own phase on the compute track */
            for (int i = 0; i < w->red.nb; i++) {
                const struct dp_bucket *bk = &w->red.b[i];
                if (bk->t_c1 > 0) dp_timeline_add(&w->tl, "compress", 0, w->step, bk->t_c0, bk->t_c1);
                if (bk->t_d1 > 0) dp_timeline_add(&w->tl, "decompress", 0, w->step, bk->t_d0, bk->t_d1);
            }
            w->b_sent += w->red.bytes_sent, w->b_recv += w->red.bytes_recv, w->b_fp32 += w->red.bytes_fp32;
            w->t_cz += w->red.t_compress, w->t_dz += w->red.t_decompress;
            w->t_comm += w->red.comm_total, w->t_exposed += w->red.comm_exposed;
            w->reduce_steps += last_micro; /* the bytes are per optimizer step */
            if (rc) return rc;
        }
        n_total += (double)lb->global_B;
        loss_sum += pass.loss_sum;
        local_bad |= !isfinite(pass.loss_sum);
        w->loss_sum += pass.loss_sum;
        w->correct += pass.correct;
        w->seen += b.B;
        n_local += (double)b.B;
        w->t_fwd += pass.t_forward;
        w->t_bwd += pass.t_backward - slept_in_run;
    }
    double n_acc = 0;
    int bk_bad = 0;
    if (t->bk_on) {
        /* backup workers: the first P - b ranks' mean gradient (backup_step);
         * the wait runs from the end of this rank's compute to the update */
        double tw = dp_time();
        w->arrival[0] += tw - w->t_step0; /* one arrival per step: "bucket" 0, as in det_step */
        w->arrival_steps++;
        int rc = t->star ? backup_star(w, n_local, &n_acc, &bk_bad) : backup_step(w, n_local, &n_acc, &bk_bad);
        double te = dp_time();
        w->step_wait = t->G > 1 ? te - tw : 0;
        w->t_comm += te - tw, w->t_exposed += te - tw;
        if (t->G > 1) dp_timeline_add(&w->tl, "wait", 0, w->step, tw, te);
        if (rc) return rc;
    }
    w->t_wait += w->step_wait, w->t_slow += w->step_slow;
    *n_step = n_total;
    *loss_step = n_local > 0 ? loss_sum / (n_local * (double)t->pos) : 0;
    double t1 = dp_time();
    /* sum -> mean over the global batch */
    float *g = w->rep.grads;
    if (t->bk_on) {
        /* every replica has the same update, n_acc and flag: the same decision */
        if (bk_bad) {
            if (t->p.skip_nonfinite) {
                (*skipped)++;
                return DP_OK;
            }
            return dp_seterr(DP_ENONFINITE, "step %lld (epoch %lld): the gradient of the accepted workers is not "
                             "finite; try a lower --lr, --clip, or --skip-nonfinite", (long long)w->step,
                             (long long)w->epoch + 1);
        }
        if (n_acc == 0) return DP_OK; /* the accepted ranks had no samples: no update */
    } else if (nmicro > 1) {
        float scale = (float)(1.0 / (n_total * (double)t->pos));
        float *gs = w->zero.sharded ? w->zero.gshard : g; /* ZeRO 2, 3: only the shard is reduced */
        int64_t len = w->zero.sharded ? w->zero.len : m->num_params;
#pragma omp simd
        for (int64_t i = 0; i < len; i++) gs[i] *= scale;
    }
    /* Every replica holds the same reduced gradient, and the same buffers
     * (the BatchNorm statistics are synchronised), so every worker takes
     * the same decision here without talking to the others.  The buffers
     * are checked too: a running statistic must not become non-finite even
     * when the gradient stays finite. */
    double ss = 0; /* ZeRO: ||g||^2, from the shards */
    int gbad = 0;
    if (t->red_check) /* looked at range by range inside the reduction */
        gbad = atomic_load_explicit(&t->red_bad, memory_order_relaxed) == w->step + 1;
    else if (!t->bk_on) {
        int rc = grad_nonfinite(w, g, &ss, &gbad);
        if (rc) return rc;
    }
    if (!t->bk_on && (gbad || dp_any_nonfinite(w->rep.buffers, m->num_buffers))) {
        /* Which worker? Each contributes a flag for its own loss. */
        double *flags = dp_calloc((size_t)t->G, sizeof(double));
        if (!flags) return dp_seterr(DP_ENOMEM, "out of memory");
        flags[w->grank] = local_bad;
        int rc = dp_comm_allreduce(w->comm, flags, t->G, DP_DTYPE_F64, DP_ALGO_AUTO);
        int who = -1;
        for (int r = 0; !rc && r < t->G && who < 0; r++)
            if (flags[r] != 0) who = r;
        dp_free(flags);
        if (rc) return rc;
        if (t->p.skip_nonfinite) {
            if (w->buf_save) memcpy(w->rep.buffers, w->buf_save, sizeof(float) * (size_t)m->num_buffers);
            (*skipped)++;
            return DP_OK;
        }
        if (who >= 0)
            return dp_seterr(DP_ENONFINITE, "step %lld (epoch %lld): worker %d: the loss is not finite; "
                             "try a lower --lr, --clip, or --skip-nonfinite", (long long)w->step,
                             (long long)w->epoch + 1, who);
        return dp_seterr(DP_ENONFINITE, "step %lld (epoch %lld): the gradient (or a BatchNorm running "
                         "statistic) is not finite; try a lower --lr, --clip, or --skip-nonfinite",
                         (long long)w->step, (long long)w->epoch + 1);
    }
    float lr = dp_sched_lr(&t->p.sched, w->step);
    int rc = update(w, g, lr, t->p.clip_norm, ss);
    if (t->p.fault_kind == DP_FAULT_DIVERGE && w->grank == t->p.fault_worker && w->step == t->p.fault_step &&
        !(rc = rc ? rc : dp_zero_settle(&w->zero))) /* (after the gather, which would write over it) */
        w->rep.params[m->num_params / 2] += 1e-3f;
    double t2 = dp_time();
    update_done(w, t2 - t1);
    dp_timeline_add(&w->tl, "optimizer", 0, w->step, t1, t2);
    return rc;
}

/* Deterministic mode: the same optimizer step as train_step, computed so
 * that the result does not depend on the number of workers.
 *
 * The global batch is cut into fixed chunks of det_chunk samples (the loader
 * hands every worker whole chunks).  Each chunk's gradient is computed on its
 * own, always with the same shapes, so it is the same bits on any worker; it
 * is then converted to fixed point (round(g * 2^32), held exactly in a double)
 * and added to the worker's accumulator.  Integer addition is associative, so
 * the all-reduce of the accumulators (sums of integers below 2^53 are exact
 * in double) gives the same bits whatever the number of workers and the
 * order of the sums.  Cost: smaller GEMMs (chunk-sized), one conversion pass
 * per chunk (vectorised, fused with the zeroing, and done layer by layer as
 * backward reports each range, while it is in cache), and an all-reduce of
 * doubles (twice the bytes) that starts only after the last chunk (no
 * overlap with backward). */
/* acc += the fixed point of g (dp_fixed_add), then g = 0 for the next
 * chunk's backward, which accumulates into it (the range is in cache). */
static int det_accumulate(double *acc, float *g, int64_t n) {
    int bad = dp_fixed_add(acc, g, n);
    memset(g, 0, sizeof(float) * (size_t)n);
    return bad;
}

/* The chunk's grad_ready: a top-level layer's range is final once it is
 * reported, so it is converted at once, while the gradient its backward
 * just wrote is still in cache.  done counts the floats converted, so the
 * caller can tell that every range came (the top-level ranges tile the slab;
 * if they ever did not, a pass over the whole slab adds the rest, and the
 * ranges already converted hold zeros, which add nothing). */
struct det_conv {
    double *acc;
    float *g;
    int64_t done;
    int bad;
};
static void det_grad_ready(void *arg, int64_t off, int64_t count) {
    struct det_conv *dc = arg;
    dc->bad |= det_accumulate(dc->acc + off, dc->g + off, count);
    dc->done += count;
}

static int det_step(struct worker *w, int64_t nmicro, double *n_step, double *loss_step) {
    struct dp_trainer *t = w->t;
    const struct dp_model *m = t->model;
    int64_t np = m->num_params, C = t->p.det_chunk;
    memset(w->acc, 0, sizeof(double) * (size_t)np);
    /* ZeRO 3: the chunks run on the whole parameters, gathered for the step
     * (deterministic mode holds full-size sums anyway: no memory win) */
    int zrc = dp_zero_materialize(&w->zero);
    if (zrc) return zrc;
    memset(w->rep.grads, 0, sizeof(float) * (size_t)np); /* then each conversion zeroes what it read */
    double n_total = 0, loss_sum = 0, n_local = 0, compute = 0;
    for (int64_t k = 0; k < nmicro; k++) {
        const struct dp_loader_batch *lb;
        int rc = dp_loader_next(w->loader, &lb);
        if (rc) return rc;
        int64_t per = dp_shape_numel(&m->in_shape);
        for (int64_t c0 = 0; c0 < lb->B; c0 += C) {
            int64_t B = lb->B - c0 < C ? lb->B - c0 : C;
            struct dp_batch b = {.B = B, .x = lb->x ? lb->x + c0 * per : NULL,
                                 .tokens = lb->tokens ? lb->tokens + c0 * per : NULL,
                                 .targets = lb->y + c0 * t->pos, .sample_idx = lb->idx + c0, .epoch = lb->epoch};
            struct det_conv dc = {.acc = w->acc, .g = w->rep.grads};
            struct dp_pass pass = {.training = 1, .backward = 1, .seed = t->p.seed, .loss_scale = 1.0f,
                                   .grad_ready = det_grad_ready, .grad_ready_arg = &dc};
            if ((rc = dp_model_run(m, &w->rep, &b, &pass))) return rc;
            if (dc.done != np) dc.bad |= det_accumulate(w->acc, w->rep.grads, np);
            if (dc.bad)
                return dp_seterr(DP_ENONFINITE, "deterministic mode: a gradient is not finite or too large "
                                 "for fixed-point accumulation (|g| >= 2^20)");
            loss_sum += pass.loss_sum;
            w->loss_sum += pass.loss_sum;
            w->correct += pass.correct;
            w->t_fwd += pass.t_forward;
            w->t_bwd += pass.t_backward;
            compute += pass.t_forward + pass.t_backward;
        }
        w->seen += lb->B;
        n_local += (double)lb->B;
        n_total += (double)lb->global_B;
    }
    /* the simulated slowness, all paid before the step's one reduction (the
     * chunks' compute as c; timing only: the sums are the same bits) */
    w->step_slow = 0;
    if (t->simulate) {
        double mult, stall;
        pace_plan(w, &mult, &stall);
        pace_start(w, mult, stall, dp_time() - compute);
        pace(w);
        w->step_slow = w->pace_slept;
    }
    w->bal_n += n_local, w->bal_s += compute + w->step_slow; /* --balance: as in train_step */
    double tc = dp_time();
    w->arrival[0] += tc - w->t_step0; /* one reduction per step: "bucket" 0 */
    w->arrival_steps++;
    int rc = dp_comm_allreduce(w->comm, w->acc, np, DP_DTYPE_F64, (enum dp_comm_algo)t->p.algo);
    double t1 = dp_time();
    w->t_comm += t1 - tc;
    w->t_exposed += t1 - tc;
    w->step_wait = t->G > 1 ? t1 - tc : 0;
    w->t_wait += w->step_wait, w->t_slow += w->step_slow;
    if (t->G > 1) dp_timeline_add(&w->tl, "wait", 0, w->step, tc, t1);
    if (rc) return rc;
    *n_step = n_total;
    *loss_step = n_local > 0 ? loss_sum / (n_local * (double)t->pos) : 0;
    /* back to float: the gradient of the mean loss (over samples x positions) */
    double scale = 1.0 / (DP_FIXED_SCALE * n_total * (double)t->pos);
    float *g = w->rep.grads;
    for (int64_t i = 0; i < np; i++) g[i] = (float)(w->acc[i] * scale);
    if (dp_any_nonfinite(g, np))
        return dp_seterr(DP_ENONFINITE, "step %lld: the gradient is not finite", (long long)w->step);
    /* the whole gradient is here (the accumulators were all-reduced): the
     * norm is the plain run's, and ZeRO's shard update then gives its bits */
    if (t->p.clip_norm > 0) dp_clip_grad_norm(g, np, t->p.clip_norm);
    dp_zero_take_grad(&w->zero, g); /* ZeRO 2, 3: the shard's pieces, the slab given back */
    rc = update(w, g, dp_sched_lr(&t->p.sched, w->step), 0, 0);
    zrc = dp_zero_release_params(&w->zero);
    if (!rc) rc = zrc;
    double t2 = dp_time();
    update_done(w, t2 - t1);
    return rc;
}

/* Epoch totals over all workers: out[0..4) = loss, correct, seen, skipped;
 * then, per rank r, out[4 + r] = its mean time per step from the step's
 * start to the start of its buckets' reductions (the mean over buckets),
 * and out[4 + G + r] = the samples it took (its shares, as observed). */
static int epoch_totals(struct worker *w, double *out) {
    struct dp_trainer *t = w->t;
    memset(out, 0, sizeof(double) * (size_t)(4 + 2 * t->G));
    out[4 + t->G + w->grank] = (double)w->seen;
    out[0] = w->loss_sum, out[1] = (double)w->correct, out[2] = (double)w->seen, out[3] = (double)w->skipped;
    int nb = t->p.deterministic || t->bk_on ? 1 : w->red.nb;
    double a = 0;
    for (int i = 0; i < nb; i++) a += w->arrival[i];
    if (nb > 0 && w->arrival_steps > 0) out[4 + w->grank] = a / nb / (double)w->arrival_steps;
    memset(w->arrival, 0, sizeof(double) * (size_t)(w->red.nb + 1));
    w->arrival_steps = 0;
    return dp_comm_allreduce(w->comm, out, 4 + 2 * t->G, DP_DTYPE_F64, DP_ALGO_AUTO);
}

/* The straggler: the rank whose reductions start latest after its step's
 * start, on average, and its lag behind the earliest rank (s per step).
 * Every rank waits for the last one in each collective, so this lag is what
 * the job loses to its slowest rank per step. */
static void straggler(const struct dp_trainer *t, const double *arr, int *rank, double *lag) {
    int slow = 0, fast = 0;
    for (int r = 1; r < t->G; r++) {
        if (arr[r] > arr[slow]) slow = r;
        if (arr[r] < arr[fast]) fast = r;
    }
    *rank = t->G > 1 ? slow : -1;
    *lag = t->G > 1 ? arr[slow] - arr[fast] : 0;
}

/* A failed write to metrics.jsonl (a full disk, an I/O error): an error of
 * the run, not silently lost metrics.  Called right after the failing call,
 * so errno is its reason. */
static int metrics_error(const struct dp_trainer *t) {
    int e = errno;
    return dp_seterr(DP_EIO, "metrics: cannot write %s: %s", t->metrics_path, e ? strerror(e) : "I/O error");
}

/* The end of a metrics record: its closing brace and newline, then the flush that hands the
 * whole record to the file in one write (src/train/run_folder.c). */
static int metrics_end(const struct dp_trainer *t) {
    errno = 0;
    if (fputs("}\n", t->metrics) < 0 || fflush(t->metrics) != 0) return metrics_error(t);
    return DP_OK;
}

/* Rank 0: an evaluation outside the epoch's end (a run --max-steps stopped mid-epoch): its
 * event and an "eval" record. */
static int report_eval(struct worker *w, int64_t step, int64_t epoch, double acc, double loss) {
    struct dp_trainer *t = w->t;
    struct dp_event ev = {.kind = DP_EVENT_EVAL, .step = step, .epoch = epoch, .test_acc = acc, .test_loss = loss,
                          .positions = t->pos, .step_in_epoch = (t->step_in_epoch + t->p.accum - 1) / t->p.accum};
    emit(t, &ev);
    if (!t->metrics) return DP_OK;
    errno = 0;
    if (fprintf(t->metrics, "{\"kind\": \"eval\", \"step\": %lld, \"epoch\": %lld, \"test_loss\": %.6f, "
                "\"test_acc\": %.6f", (long long)step, (long long)epoch + 1, loss, acc) < 0)
        return metrics_error(t);
    return metrics_end(t);
}

/* --ckpt-every-steps within an epoch: as end_epoch's checkpoint (every worker: ZeRO's last
 * all-gather settled, the error-feedback state brought to rank 0, which writes while the
 * others stream their pieces where ZeRO spans processes; then a barrier). */
static int step_checkpoint(struct worker *w) {
    struct dp_trainer *t = w->t;
    if (!t->p.out_dir) return DP_OK;
    int rc = dp_zero_settle(&w->zero);
    if (!rc) rc = ef_gather_state(w);
    if (!rc && w->grank == 0) rc = checkpoint(t);
    else if (!rc && zero_serves(t)) rc = zero_stream(w, NULL);
    return rc ? rc : dp_comm_barrier(w->comm);
}

/* A requested stop (dp_train_params.stop), checked before each step: *stop = 1 when every
 * rank stops before step `step`.  The ranks must agree on the step, or one would wait
 * forever in a collective the others never start.
 *   One process: the first worker to see the request, before step s, sets stop_at = s + lead,
 *   once (compare-and-swap), and every worker stops before that step.  No worker has begun
 *   it: a synchronous worker cannot finish step s before this one takes part in it (the
 *   step's reduction needs every rank), so lead = 1; a backup worker runs at most
 *   BACKUP_DEPTH steps ahead of the latest, so lead = BACKUP_DEPTH + 1.
 *   Several processes: one all-reduce of one double per step sums the ranks' views of
 *   their process's request; every rank gets the same sum, so all stop at the same step
 *   (measured in docs/results.md "A stop on request").  Backup workers across processes
 *   run no per-step collective (that would wait for the late ranks they exist to drop): a
 *   request there ends the run as a failure of the step. */
static int stop_agreed(struct worker *w, int64_t step, int *stop) {
    struct dp_trainer *t = w->t;
    *stop = 0;
    if (!t->p.stop) return DP_OK;
    if (t->p.inter) {
        if (t->bk_on)
            return atomic_load(t->p.stop) ? dp_seterr(DP_ECANCELED, "stopped on request (--backup-workers across "
                                                     "processes cannot agree on a step to stop at)") : DP_OK;
        double v = atomic_load(t->p.stop) != 0;
        int rc = dp_comm_allreduce(w->comm, &v, 1, DP_DTYPE_F64, DP_ALGO_AUTO);
        *stop = !rc && v > 0;
        return rc;
    }
    long long at = atomic_load(&t->stop_at);
    if (at == INT64_MAX && atomic_load(t->p.stop)) {
        atomic_compare_exchange_strong(&t->stop_at, &at, (long long)step + (t->bk_on ? BACKUP_DEPTH + 1 : 1));
        at = atomic_load(&t->stop_at); /* (ours, or the one another worker set first) */
    }
    *stop = step >= at;
    return DP_OK;
}

/* Rank 0 at the end of an epoch: the event, the metrics record and the
 * checkpoint.  dt: the epoch's training time (evaluation excluded); tot as
 * epoch_totals gives it; test_acc and test_loss as evaluate_shared gives
 * them. */
static int report_epoch(struct worker *w, double dt, const double *tot, double test_acc, double test_loss) {
    struct dp_trainer *t = w->t;
    int rc;
    t->epoch++;
    t->step_in_epoch = 0;
    int64_t sstep = t->ps_on ? t->step / t->ps_div : t->step; /* the server's version counts pushes */
    struct dp_event ev = {.kind = DP_EVENT_EPOCH, .step = t->step, .epoch = t->epoch,
                          .lr = dp_sched_lr(&t->p.sched, sstep > 0 ? sstep - 1 : 0)};
    ev.positions = t->pos;
    ev.loss = tot[2] > 0 ? tot[0] / (tot[2] * (double)t->pos) : NAN;
    ev.train_acc = tot[2] > 0 ? tot[1] / (tot[2] * (double)t->pos) : NAN;
    ev.samples_per_s = dt > 0 ? tot[2] / dt : 0;
    ev.skipped = (int64_t)tot[3];
    ev.epoch_time = dt;
    ev.t_data = dp_loader_wait_time(w->loader) - w->wait0;
    ev.t_fwd = w->t_fwd, ev.t_bwd = w->t_bwd, ev.t_opt = w->t_opt;
    ev.t_comm = w->t_comm, ev.t_comm_exposed = w->t_exposed;
    if (w->reduce_steps > 0) {
        double k = (double)w->reduce_steps;
        ev.bytes_sent = w->b_sent / k, ev.bytes_recv = w->b_recv / k, ev.bytes_fp32 = w->b_fp32 / k;
    }
    ev.t_compress = w->t_cz, ev.t_decompress = w->t_dz;
    straggler(t, tot + 4, &ev.slow_rank, &ev.slow_lag);
    t->slow_rank = ev.slow_rank, t->slow_lag = ev.slow_lag;
    ev.test_acc = test_acc, ev.test_loss = test_loss;
    if (t->balance) {
        /* the plan in force, as samples of a full global batch */
        for (int r = 0; r < t->G; r++) {
            int64_t off;
            dp_loader_split(t->p.batch, t->p.batch, t->bal_align, t->G, r, w->bal_share, &off, &t->share_samples[r]);
        }
        for (int r = 0; r < t->G; r++) t->rank_samples[r] = (int64_t)tot[4 + t->G + r];
        ev.shares = t->share_samples, ev.rank_samples = t->rank_samples, ev.nshares = t->G;
    }
    if (t->bk_on) ev.dropped_steps = t->dropped_count, ev.nshares = t->G;
    if (t->ps_on) { /* plain async: a faster worker takes more batches (server ranks: 0) */
        for (int r = 0; r < t->G; r++) t->rank_samples[r] = (int64_t)tot[4 + t->G + r];
        ev.rank_samples = t->rank_samples, ev.nshares = t->G;
    }
    const struct dp_ps_hist *sh = &t->ps_hist;
    if (t->ps_on) {
        ev.pushes = sh->count, ev.stale_max = sh->max;
        ev.stale_mean = sh->count ? sh->sum / (double)sh->count : 0;
        ev.stale_p50 = dp_ps_hist_quantile(sh, 0.5), ev.stale_p99 = dp_ps_hist_quantile(sh, 0.99);
    }
    if (t->metrics) {
        errno = 0;
        if (fprintf(t->metrics,
                "{\"kind\": \"epoch\", \"epoch\": %lld, \"step\": %lld, \"workers\": %d, \"lr\": %.6g, "
                "\"train_loss\": %.6f, \"train_acc\": %.6f, \"test_loss\": %.6f, \"test_acc\": %.6f, "
                "\"samples_per_s\": %.1f, \"epoch_time_s\": %.3f, \"data_wait_s\": %.3f, "
                "\"forward_s\": %.3f, \"backward_s\": %.3f, \"comm_s\": %.3f, \"comm_exposed_s\": %.3f, "
                "\"optimizer_s\": %.3f, \"skipped_steps\": %lld, \"slowest_rank\": %d, "
                "\"slowest_lag_s\": %.6f, \"param_hash\": \"%016llx\", \"rank_arrival_s\": [",
                (long long)ev.epoch, (long long)ev.step, t->G, (double)ev.lr, ev.loss, ev.train_acc,
                ev.test_loss, ev.test_acc, ev.samples_per_s, dt, ev.t_data, ev.t_fwd, ev.t_bwd, ev.t_comm,
                ev.t_comm_exposed, ev.t_opt, (long long)ev.skipped, ev.slow_rank, ev.slow_lag,
                (unsigned long long)(w->zero.pshard ? w->zhash : dp_replica_hash(&w->rep))) < 0)
            return metrics_error(t);
        for (int r = 0; r < t->G; r++)
            if (fprintf(t->metrics, "%s%.6f", r ? ", " : "", tot[4 + r]) < 0) return metrics_error(t);
        /* rank 0's wait and simulated sleep in the epoch; with gather_waits,
         * the steps in which each rank arrived last */
        if (fprintf(t->metrics, "], \"wait_s\": %.3f, \"slow_s\": %.3f", w->t_wait, w->t_slow) < 0)
            return metrics_error(t);
        /* gradient traffic per reducing step (rank 0) and compression */
        if (fprintf(t->metrics, ", \"compress\": \"%s\", \"bytes_sent\": %.0f, \"bytes_recv\": %.0f, "
                    "\"compress_ratio\": %.4g, \"compress_s\": %.4f, \"decompress_s\": %.4f",
                    dp_compress_name(t->p.compress.kind), ev.bytes_sent, ev.bytes_recv,
                    ev.bytes_sent > 0 ? ev.bytes_fp32 / ev.bytes_sent : 1.0, ev.t_compress, ev.t_decompress) < 0)
            return metrics_error(t);
        for (int r = 0; t->gather_waits && r < t->G; r++)
            if (fprintf(t->metrics, "%s%lld%s", r ? ", " : ", \"last_rank_steps\": [", (long long)t->last_count[r],
                        r == t->G - 1 ? "]" : "") < 0)
                return metrics_error(t);
        /* --balance: the plan at the epoch's end and the samples each rank took */
        for (int r = 0; t->balance && r < t->G; r++)
            if (fprintf(t->metrics, "%s%lld%s", r ? ", " : ", \"shares\": [", (long long)t->share_samples[r],
                        r == t->G - 1 ? "]" : "") < 0)
                return metrics_error(t);
        for (int r = 0; (t->balance || t->ps_on) && r < t->G; r++)
            if (fprintf(t->metrics, "%s%lld%s", r ? ", " : ", \"rank_samples\": [", (long long)t->rank_samples[r],
                        r == t->G - 1 ? "]" : "") < 0)
                return metrics_error(t);
        /* backup workers: the steps in which each rank's gradient was dropped */
        for (int r = 0; t->bk_on && r < t->G; r++)
            if (fprintf(t->metrics, "%s%lld%s", r ? ", " : ", \"dropped_steps\": [", (long long)t->dropped_count[r],
                        r == t->G - 1 ? "]" : "") < 0)
                return metrics_error(t);
        /* parameter server: the epoch's staleness histogram (bucket k: pushes of staleness k, up to
         * the largest nonempty one; overflow: staleness >= DP_PS_HIST_BUCKETS; max exact) */
        if (t->ps_on) {
            /* flat keys: metrics.jsonl lines are flat objects (dptrain plot reads them) */
            if (fprintf(t->metrics, ", \"mode\": \"%s\", \"servers\": %d, \"stale_pushes\": %lld, "
                        "\"stale_mean\": %.4f, \"stale_p50\": %lld, \"stale_p99\": %lld, \"stale_max\": %lld, "
                        "\"stale_overflow\": %lld, \"stale_hist\": [",
                        t->p.staleness >= 0 ? "ssp" : "async", t->ps_servers, (long long)ev.pushes,
                        ev.stale_mean, (long long)ev.stale_p50, (long long)ev.stale_p99, (long long)ev.stale_max,
                        (long long)sh->overflow) < 0)
                return metrics_error(t);
            int top = 0;
            for (int k = 0; k < DP_PS_HIST_BUCKETS; k++)
                if (sh->bucket[k]) top = k + 1;
            for (int k = 0; k < top; k++)
                if (fprintf(t->metrics, "%s%lld", k ? ", " : "", (long long)sh->bucket[k]) < 0) return metrics_error(t);
            if (fprintf(t->metrics, "]") < 0) return metrics_error(t);
        }
        /* text: the test set is the validation windows; perplexity exp(loss) */
        if (t->text && fprintf(t->metrics, ", \"val_loss\": %.6f, \"val_ppl\": %.4f, \"tokens_per_s\": %.1f",
                               ev.test_loss, exp(ev.test_loss), ev.samples_per_s * (double)t->pos) < 0)
            return metrics_error(t);
        if ((rc = metrics_end(t))) return rc;
    }
    emit(t, &ev);
    int last = t->epoch == t->p.epochs;
    if (last || (t->p.ckpt_every > 0 && t->epoch % t->p.ckpt_every == 0) || w->ckpt_due)
        if ((rc = checkpoint(t))) return rc;
    return DP_OK;
}

static int end_epoch(struct worker *w, double t_start) {
    struct dp_trainer *t = w->t;
    double *tot = dp_malloc(sizeof(double) * (size_t)(4 + 2 * t->G));
    if (!tot) return dp_seterr(DP_ENOMEM, "out of memory");
    double test_acc = NAN, test_loss = NAN;
    int rc = epoch_totals(w, tot);
    double dt = dp_time() - t_start;
    /* the epoch count after this one, as report_epoch will see it: a checkpoint then? */
    int64_t e = w->epoch + 1;
    /* ZeRO 3: the evaluation gathers layer by layer (evaluate_shared); the
     * whole parameters only where they are read: after the last epoch, the
     * run's result (dp_trainer_replica: each process's worker 0).  The other
     * workers pass their pieces on range by range (dp_zero_gather_params),
     * and the last epoch first gives back the gradient shards, so the whole
     * replica takes no more than the step did.  Given back after the
     * barrier.  With an output folder, the report's hash is folded range by
     * range as they pass (zhash), and the checkpoint streams the pieces
     * (zero_stream): neither needs the whole parameters. */
    int last = e == t->p.epochs, ckpt = last || (t->p.ckpt_every > 0 && e % t->p.ckpt_every == 0) || w->ckpt_due;
    if (!rc) rc = evaluate_shared(w, &test_acc, &test_loss);
    if (!rc && last) dp_zero_drop_grad_shard(&w->zero);
    if (!rc && (last || t->p.out_dir)) {
        uint64_t h = DP_FNV1A64_INIT;
        rc = dp_zero_gather_params(&w->zero, w->rank == 0 && last, w->zero.pshard ? &h : NULL);
        w->zhash = dp_fnv1a64(w->rep.buffers, sizeof(float) * (size_t)t->model->num_buffers, h);
    }
    if (!rc && ckpt) rc = ef_gather_state(w);
    if (!rc && w->grank == 0) rc = report_epoch(w, dt, tot, test_acc, test_loss);
    else if (!rc && ckpt && zero_serves(t)) rc = zero_stream(w, NULL); /* while rank 0 writes */
    dp_free(tot);
    w->ckpt_due = 0;
    if (rc) return rc;
    /* The others wait while rank 0 writes the metrics and the checkpoint: a
     * short write, under --comm-timeout like any collective (a hung file
     * system on rank 0 is a stall the timeout is there to catch). */
    rc = dp_comm_barrier(w->comm);
    return rc || e == t->p.epochs ? rc : dp_zero_release_params(&w->zero);
}


/* The worker's running phase sums: data wait, forward, backward, comm,
 * exposed comm, optimizer. */
static void phase_sums(const struct worker *w, double out[6]) {
    out[0] = dp_loader_wait_time(w->loader), out[1] = w->t_fwd, out[2] = w->t_bwd;
    out[3] = w->t_comm, out[4] = w->t_exposed, out[5] = w->t_opt;
}

/* One "step" line of metrics.jsonl (rank 0): the step's phase times are the
 * differences of the phase sums before (s0) and after it. */
static int step_record(const struct worker *w, int64_t step, int64_t epoch, double loss, double samples,
                       double step_s, const double s0[6], int last_rank, double test_acc, double test_loss) {
    double s1[6];
    phase_sums(w, s1);
    errno = 0;
    int n = fprintf(w->t->metrics,
            "{\"kind\": \"step\", \"step\": %lld, \"epoch\": %lld, \"loss\": %.6f, \"samples\": %lld, "
            "\"step_s\": %.6f, \"data_wait_s\": %.6f, \"forward_s\": %.6f, \"backward_s\": %.6f, "
            "\"comm_s\": %.6f, \"comm_exposed_s\": %.6f, \"optimizer_s\": %.6f, \"wait_s\": %.6f, "
            "\"slow_s\": %.6f, \"last_rank\": %d, \"bytes_sent\": %.0f, \"bytes_recv\": %.0f, "
            "\"compress_ratio\": %.4g, \"compress_s\": %.6f, \"decompress_s\": %.6f",
            (long long)step, (long long)epoch + 1, loss, (long long)samples, step_s, s1[0] - s0[0],
            s1[1] - s0[1], s1[2] - s0[2], s1[3] - s0[3], s1[4] - s0[4], s1[5] - s0[5], w->step_wait,
            w->step_slow, last_rank, w->red.bytes_sent, w->red.bytes_recv,
            w->red.bytes_sent > 0 ? w->red.bytes_fp32 / w->red.bytes_sent : 1.0, w->red.t_compress,
            w->red.t_decompress);
    /* backup workers: the ranks whose gradient this step dropped */
    if (n >= 0 && w->t->bk_on) {
        n = fprintf(w->t->metrics, ", \"dropped\": [");
        for (int r = 0, k = 0; n >= 0 && r < w->t->G; r++)
            if (w->dropped[r]) n = fprintf(w->t->metrics, "%s%d", k++ ? ", " : "", r);
        if (n >= 0) n = fprintf(w->t->metrics, "]");
    }
    /* parameter server: the staleness of rank 0's push */
    if (n >= 0 && w->t->ps_on) n = fprintf(w->t->metrics, ", \"staleness\": %lld", (long long)w->ps_stale);
    /* --eval-every: this step's evaluation */
    if (n >= 0 && !isnan(test_acc))
        n = fprintf(w->t->metrics, ", \"test_loss\": %.6f, \"test_acc\": %.6f", test_loss, test_acc);
    return n < 0 ? metrics_error(w->t) : metrics_end(w->t);
}

/* ---- agreement before the first step ----------------------------------------------------
 * Every rank hashes what must be equal everywhere, in five parts, and the
 * hashes are all-gathered (one collective whose size depends only on the
 * job's rank count, which the launcher fixes).  A rank that differs from
 * rank 0 is named, with the part, before any collective whose size depends
 * on those settings could hang or mix up data. */
enum { AGREE_MODEL, AGREE_BUCKETS, AGREE_DATA, AGREE_CONFIG, AGREE_POSITION, AGREE_PARTS };
#define AGREE_CONFIG_NAME \
    "configuration (batch, optimizer, schedule, seed, epochs, workers per process, data parallelism options)"
static const char *const agree_names[AGREE_PARTS] = {
    "model (spec and parameter count)", "gradient bucket layout", "training data (sample count and shape)",
    AGREE_CONFIG_NAME, "starting position (the checkpoint resumed)"};

#define H(x) (h = dp_fnv1a64(&(x), sizeof(x), h))
static void agree_hashes(const struct worker *w, uint64_t out[AGREE_PARTS]) {
    const struct dp_trainer *t = w->t;
    const struct dp_train_params *p = &t->p;
    const struct dp_model *m = t->model;
    uint64_t h = 0xcbf29ce484222325ull;
    h = dp_fnv1a64(m->spec, strlen(m->spec), h);
    H(m->num_params), H(m->num_buffers);
    out[AGREE_MODEL] = h;
    h = 0xcbf29ce484222325ull;
    H(w->red.nb);
    for (int i = 0; i < w->red.nb; i++) H(w->red.b[i].off), H(w->red.b[i].count);
    out[AGREE_BUCKETS] = h;
    h = 0xcbf29ce484222325ull;
    H(t->train.n), H(t->train.C), H(t->train.H), H(t->train.W), H(p->norm_mean), H(p->norm_std);
    H(p->test_limit), H(p->aug.crop_pad), H(p->aug.hflip);
    H(t->tokens.n), H(t->tokens.vocab), H(t->split.train_n), H(t->windows); /* text (0 otherwise) */
    out[AGREE_DATA] = h;
    h = 0xcbf29ce484222325ull;
    H(p->batch), H(p->accum), H(p->seed), H(p->epochs), H(p->max_steps), H(p->clip_norm), H(p->workers);
    H(p->optim.kind), H(p->optim.momentum), H(p->optim.nesterov), H(p->optim.dampening);
    H(p->optim.weight_decay), H(p->optim.beta1), H(p->optim.beta2), H(p->optim.eps);
    H(p->sched.kind), H(p->sched.base_lr), H(p->sched.total_steps), H(p->sched.warmup_steps);
    H(p->sched.step_size), H(p->sched.gamma), H(p->sched.min_lr);
    H(p->deterministic), H(p->det_chunk), H(p->algo), H(p->overlap), H(p->skip_nonfinite);
    H(p->check_replicas), H(p->accum), H(t->gather_waits), H(p->balance), H(p->backup), H(p->backup_workers);
    H(p->compress.kind), H(p->compress.rank), H(p->compress.fraction), H(p->compress.powersgd_start);
    H(p->async), H(p->staleness), H(p->staleness_lr), H(p->servers), H(p->zero), H(p->zero_scatter), H(p->zero_gather);
    H(p->share_lr), H(p->implicit_momentum); /* (not pin_threads: where a process's workers run is its own) */
    out[AGREE_CONFIG] = h;
    h = 0xcbf29ce484222325ull;
    H(w->step), H(w->epoch), H(w->in_epoch);
    out[AGREE_POSITION] = h;
}
#undef H

static int agree(struct worker *w) {
    uint64_t mine[AGREE_PARTS], *all;
    agree_hashes(w, mine);
    int rc = gather_hashes(w, mine, AGREE_PARTS, &all);
    for (int r = 1; !rc && r < w->t->G; r++)
        for (int k = 0; k < AGREE_PARTS; k++)
            if (all[(size_t)r * AGREE_PARTS + (size_t)k] != all[k]) {
                rc = dp_seterr(DP_EMISMATCH, "rank %d disagrees with rank 0 on the %s: every rank must be "
                               "started with the same options%s", r, agree_names[k],
                               k == AGREE_POSITION ? " and checkpoint" : "");
                break;
            }
    dp_free(all);
    return rc;
}

/* ---- the parameter server's workers (--mode async, --staleness) --------------------------------
 * The server and its protocol are src/ddp/ps.c.  A worker loops
 *
 *     [SSP: pull for clock c (waits until the slowest is at most s behind)]
 *     read its batch -> forward -> backward (its own batch, see below) -> push
 *
 * and never takes part in a collective until the epoch ends: every worker
 * has pushed its last batch there (a barrier), pulls the server's
 * parameters (all replicas are then equal), and the epoch ends as in sync
 * mode (end_epoch: totals, the shared evaluation, rank 0's report and
 * checkpoint of the server's state).
 *
 * Which batch.  Plain async: the epoch is cut into K = ceil(n / b) batches
 * of b = ceil(batch / P) samples, and the workers claim them from one atomic
 * counter, so a fast worker simply takes more of them (a worker may get none:
 * it waits at the epoch's barrier).  Its gradient is its batch's mean (loss
 * scale 1 / (B x positions)), applied by the server as one update.  SSP and
 * the deterministic replay: worker r's clock c is its share of global batch
 * c, as in sync mode (static: the comparison with sync is exact); SSP's
 * gradient is scaled by 1 / (samples of the global batch x positions), so
 * the server's sum of a clock's P pushes is the global-batch gradient.
 *
 * Clocks: the c-th batch of epoch e is clock e x steps_per_epoch + c (the
 * replay applies push (clock, r) at version clock x P + r). */
static int ps_batch(struct worker *w, int64_t epoch, int64_t k, double *n, double *loss) {
    struct dp_trainer *t = w->t;
    const struct dp_model *m = t->model;
    int rc;
    const struct dp_loader_batch *lb;
    double td = dp_time();
    if (t->ps_dynamic && (rc = dp_loader_seek(w->loader, epoch, k))) return rc;
    if ((rc = dp_loader_next(w->loader, &lb))) return rc;
    double ta = dp_time();
    dp_timeline_add(&w->tl, "data", 0, w->step, td, ta);
    memset(w->rep.grads, 0, sizeof(float) * (size_t)m->num_params);
    *n = (double)lb->B, *loss = 0;
    w->step_slow = 0;
    if (lb->B == 0) return DP_OK; /* an empty share: an empty push */
    double denom = (double)(t->p.staleness >= 0 ? lb->global_B : lb->B) * (double)t->pos;
    struct dp_batch b = {.B = lb->B, .x = lb->x, .tokens = lb->tokens, .targets = lb->y, .sample_idx = lb->idx,
                         .epoch = lb->epoch};
    struct dp_pass pass = {.training = 1, .backward = 1, .seed = t->p.seed, .loss_scale = (float)(1.0 / denom)};
    double mult = 1, stall = 0;
    if (t->simulate) pace_plan(w, &mult, &stall);
    pace_start(w, mult, stall, ta);
    if ((rc = dp_model_run(m, &w->rep, &b, &pass))) return rc;
    pace(w); /* the simulated slowness, all after backward (no bucket to time) */
    w->step_slow = w->pace_slept;
    w->t_slow += w->step_slow;
    dp_timeline_add(&w->tl, "forward", 0, w->step, ta, ta + pass.t_forward);
    dp_timeline_add(&w->tl, "backward", 0, w->step, ta + pass.t_forward, ta + pass.t_forward + pass.t_backward);
    w->t_fwd += pass.t_forward, w->t_bwd += pass.t_backward;
    w->loss_sum += pass.loss_sum, w->correct += pass.correct, w->seen += lb->B;
    *loss = pass.loss_sum / ((double)lb->B * (double)t->pos);
    if (!isfinite(pass.loss_sum) || dp_any_nonfinite(w->rep.grads, m->num_params))
        return dp_seterr(DP_ENONFINITE, "worker %d, epoch %lld: the loss or gradient of its batch is not finite; "
                         "try a lower --lr or --clip", w->grank, (long long)epoch + 1);
    if (t->p.clip_norm > 0) dp_clip_grad_norm(w->rep.grads, m->num_params, t->p.clip_norm);
    return DP_OK;
}

/* ps_stop_note: in the parameter server's modes a stop request (a signal)
 * ends the run at the end of the epoch it arrives in, where every push is
 * applied and the checkpoint is exact; a position inside an epoch of async
 * claims could not be resumed.  Across processes the ranks agree through
 * stop_agreed's all-reduce, servers included.  Among threads rank 0 reads
 * the flag before the epoch's barrier and the others read its decision
 * (stop_at) after it; rank 0 writes again only after end_epoch's barrier,
 * which nobody passes before reading. */
static int ps_loop(struct worker *w) {
    struct dp_trainer *t = w->t;
    struct dp_ps *ps = t->ps;
    const int64_t spe = t->steps_per_epoch;
    int64_t epoch = w->epoch, pushes = 0, reported = 0;
    double last_loss = 0;
    int rc = t->ps_dynamic ? DP_OK : dp_loader_seek(w->loader, epoch, 0);
    if (!rc) rc = dp_ps_pull(ps, w->rank, epoch * spe, w->rep.params);
    /* nobody pushes before everyone has pulled the starting version (the
     * replay's pulls must not depend on timing) */
    if (!rc) rc = dp_comm_barrier(w->comm);
    while (!rc && epoch < t->p.epochs) {
        double t_start = dp_time();
        w->wait0 = dp_loader_wait_time(w->loader);
        w->loss_sum = w->t_fwd = w->t_bwd = w->t_opt = w->t_comm = w->t_exposed = w->t_wait = w->t_slow = 0;
        w->correct = w->seen = w->skipped = 0;
        for (int64_t c = 0;; c++) {
            int64_t k = t->ps_dynamic ? atomic_fetch_add(&t->ps_next, 1) : c;
            if (k >= (t->ps_dynamic ? t->ps_batches : t->batches_per_epoch)) break;
            int64_t clock = epoch * spe + c;
            double s0[6], ts = dp_time(), n, loss;
            phase_sums(w, s0);
            w->step = pushes; /* the simulated slowness is drawn per (rank, push) */
            if (t->p.staleness >= 0 && (rc = dp_ps_pull(ps, w->rank, clock, w->rep.params))) break;
            double tw = dp_time();
            w->t_wait += tw - ts;
            if ((rc = ps_batch(w, epoch, k, &n, &loss))) break;
            double tp = dp_time();
            rc = dp_ps_push(ps, w->rank, w->rep.grads, n, clock, w->rep.params, &w->ps_stale);
            double te = dp_time();
            w->t_comm += te - tp, w->t_exposed += te - tp;
            dp_timeline_add(&w->tl, "push", 0, w->step, tp, te);
            if (rc) break;
            pushes++;
            long long done = atomic_fetch_add(&t->ps_samples, (long long)n) + (long long)n;
            if (w->grank == 0) {
                /* rank 0's pushes stand for all: samples = what every worker pushed since its last event */
                int64_t in_epoch = t->ps_dynamic ? ((k + 1) * spe + t->ps_batches - 1) / t->ps_batches : c + 1;
                int64_t since = done - reported;
                struct dp_event ev = {.kind = DP_EVENT_STEP, .step = epoch * spe + in_epoch, .epoch = epoch,
                                      .step_in_epoch = in_epoch, .samples = since, .loss = loss,
                                      .lr = dp_sched_lr(&t->p.sched, epoch * spe + in_epoch - 1),
                                      .last_rank = -1, .slow_s = w->step_slow, .staleness = w->ps_stale};
                reported = done, last_loss = loss;
                emit(t, &ev);
                /* the record's samples too (so samples / step_s over the records is the job's rate) */
                if (t->metrics && (rc = step_record(w, epoch * spe + in_epoch, epoch, loss, (double)since, te - ts, s0, -1, NAN, NAN)))
                    break;
            }
        }
        if (rc) break;
        /* every push of the epoch is applied once all are here */
        double s0[6], tb = dp_time();
        phase_sums(w, s0);
        /* A stop request ends the run at this epoch's end (ps_stop_note) */
        if (w->rank == 0 && t->p.stop && atomic_load(t->p.stop)) atomic_store(&t->stop_at, (long long)epoch);
        if ((rc = dp_comm_barrier(w->comm))) break;
        int stop = atomic_load(&t->stop_at) != INT64_MAX; /* (read before end_epoch's barrier) */
        w->ckpt_due |= stop;
        /* The pushes the others made after rank 0's last one: one more step
         * event and record, whose time is rank 0's wait for them, so that
         * the records' samples add up to the epoch and samples / step_s over
         * them is the job's training rate. */
        int64_t tail = (int64_t)atomic_load(&t->ps_samples) - reported;
        if (w->grank == 0 && tail > 0) {
            double te = dp_time();
            w->t_wait += te - tb;
            struct dp_event ev = {.kind = DP_EVENT_STEP, .step = (epoch + 1) * spe, .epoch = epoch,
                                  .step_in_epoch = spe, .samples = tail, .loss = last_loss,
                                  .lr = dp_sched_lr(&t->p.sched, (epoch + 1) * spe - 1), .last_rank = -1,
                                  .staleness = w->ps_stale};
            reported += tail;
            emit(t, &ev);
            if (t->metrics && (rc = step_record(w, (epoch + 1) * spe, epoch, last_loss, (double)tail, te - tb, s0, -1, NAN, NAN)))
                break;
        }
        if ((rc = dp_ps_pull(ps, w->rank, (epoch + 1) * spe, w->rep.params))) break;
        if (w->rank == 0) {
            int64_t version;
            dp_ps_get_state(ps, w->rep.params, w->opt.state, &w->opt.step, &version);
            t->step = version;
            dp_ps_hist_get(ps, &t->ps_hist);
            dp_ps_hist_reset(ps);
            atomic_store(&t->ps_next, 0); /* nobody claims before end_epoch's barrier */
        }
        if ((rc = end_epoch(w, t_start))) break;
        epoch++;
        if (stop) {
            if (w->rank == 0) t->stopped = t->step;
            break;
        }
    }
    return rc;
}

/* The parameter server across processes (src/ddp/ps_mpi.c): every process
 * runs this with its one worker thread.  Worker ranks claim batches from
 * server 0 and push-and-pull as ps_loop does (SSP and the replay: static
 * shares, one push per clock, whose reply the server sends when the bound
 * or the turn allows: ps_mpi.c); server ranks serve until
 * every worker has ended the epoch.  Then all ranks, servers included, end
 * the epoch together: the server's parameters, optimizer state and version
 * and the workers' staleness counters are summed over the job (each rank
 * contributes its part, zeros elsewhere: x + 0 = x exactly), so every rank
 * holds the server's state for end_epoch's shared evaluation and rank 0's
 * report and checkpoint (today's format).  The server ranks take part in
 * end_epoch with zero totals (their rank_samples are 0). */
static int ps_net_loop(struct worker *w) {
    struct dp_trainer *t = w->t;
    struct dp_ps_net *net = t->psn;
    const struct dp_model *m = t->model;
    const int64_t spe = t->steps_per_epoch;
    const int server = dp_ps_net_is_server(net);
    int64_t epoch = w->epoch, pushes = 0, reported = 0, nmeta = DP_PS_NET_META(t->G);
    double *meta = dp_malloc(sizeof(double) * (size_t)nmeta);
    if (!meta) return dp_seterr(DP_ENOMEM, "trainer: out of memory");
    /* every rank starts from rank 0's parameters (a resume loaded the same
     * checkpoint everywhere); the servers take their shard of them */
    int rc = dp_comm_broadcast(w->comm, w->rep.params, m->num_params, DP_DTYPE_F32, 0, DP_ALGO_AUTO);
    if (!rc && !server && !t->ps_dynamic) rc = dp_loader_seek(w->loader, epoch, 0); /* static shares */
    if (!rc && server) rc = dp_ps_net_set_state(net, w->rep.params, w->opt.state, w->opt.step, t->step);
    while (!rc && epoch < t->p.epochs) {
        double t_start = dp_time();
        w->wait0 = dp_loader_wait_time(w->loader);
        w->loss_sum = w->t_fwd = w->t_bwd = w->t_opt = w->t_comm = w->t_exposed = w->t_wait = w->t_slow = 0;
        w->correct = w->seen = w->skipped = 0;
        if (server) rc = dp_ps_net_serve(net);
        else {
            /* plain async: batch k as claimed from server 0, until -1; SSP and the replay: clock c
             * is this worker's share of global batch c (the loader's static split over the W) */
            int64_t k = 0;
            if (t->ps_dynamic) rc = dp_ps_net_claim(net, &k);
            for (int64_t c = 0; !rc && (t->ps_dynamic ? k >= 0 : c < t->batches_per_epoch); c++) {
                double s0[6], ts = dp_time(), n, loss;
                phase_sums(w, s0);
                w->step = pushes; /* the simulated slowness is drawn per (rank, push) */
                if (!t->ps_dynamic) k = c;
                if ((rc = ps_batch(w, epoch, k, &n, &loss))) break;
                double tp = dp_time();
                int64_t done_k = k;
                rc = dp_ps_net_push(net, w->rep.grads, n, epoch * spe + c, w->rep.params, &w->ps_stale, &k);
                double te = dp_time();
                w->t_comm += te - tp, w->t_exposed += te - tp;
                dp_timeline_add(&w->tl, "push", 0, w->step, tp, te);
                if (rc) break;
                pushes++;
                long long done = atomic_fetch_add(&t->ps_samples, (long long)n) + (long long)n;
                if (w->grank == 0) { /* rank 0's own pushes (the others' are not seen here) */
                    int64_t in_epoch = t->ps_dynamic ? ((done_k + 1) * spe + t->ps_batches - 1) / t->ps_batches
                                                     : c + 1;
                    struct dp_event ev = {.kind = DP_EVENT_STEP, .step = epoch * spe + in_epoch, .epoch = epoch,
                                          .step_in_epoch = in_epoch, .samples = done - reported, .loss = loss,
                                          .lr = dp_sched_lr(&t->p.sched, epoch * spe + in_epoch - 1),
                                          .last_rank = -1, .slow_s = w->step_slow, .staleness = w->ps_stale};
                    reported = done;
                    emit(t, &ev);
                    if (t->metrics && (rc = step_record(w, epoch * spe + in_epoch, epoch, loss, n, te - ts, s0, -1, NAN, NAN)))
                        break;
                }
            }
            if (!rc) rc = dp_ps_net_end(net);
        }
        if (rc) break;
        /* a stop request ends the run at this epoch's end (ps_stop_note): agreed by all ranks */
        int stop = 0;
        if ((rc = stop_agreed(w, epoch, &stop))) break;
        w->ckpt_due |= stop;
        /* the server's state on every rank */
        dp_ps_net_collect(net, w->rep.params, w->opt.state, w->opt.state_len, meta);
        if ((rc = dp_comm_allreduce(w->comm, w->rep.params, m->num_params, DP_DTYPE_F32, DP_ALGO_AUTO)) ||
            (w->opt.state_len &&
             (rc = dp_comm_allreduce(w->comm, w->opt.state, w->opt.state_len, DP_DTYPE_F32, DP_ALGO_AUTO))) ||
            (rc = dp_comm_allreduce(w->comm, meta, nmeta, DP_DTYPE_F64, DP_ALGO_AUTO)))
            break;
        int64_t version;
        dp_ps_net_hist(meta, t->G, &t->ps_hist, &version, &w->opt.step);
        t->step = version;
        if ((rc = end_epoch(w, t_start))) break;
        epoch++;
        if (stop) {
            if (w->grank == 0) t->stopped = t->step;
            break;
        }
    }
    dp_free(meta);
    return rc;
}

static int worker_loop(struct worker *w) {
    struct dp_trainer *t = w->t;
    if (t->psn) return ps_net_loop(w); /* across processes (above) */
    if (t->ps) return ps_loop(w); /* the parameter server's loop (above) */
    const struct dp_model *m = t->model;
    /* Every worker advances its own copy of the position; they stay equal
     * because every worker runs the same sequence of steps.  Only rank 0
     * writes the shared fields, and only rank 0 reads them for reporting. */
    int64_t step = w->step, epoch = w->epoch, in_epoch = w->in_epoch;
    int rc = dp_loader_seek(w->loader, epoch, in_epoch);
    if (rc) return rc;
    if (t->G > 1 && (rc = agree(w))) return rc;
    /* All replicas start from rank 0's parameters and buffers (ZeRO 3: each
     * worker holds its pieces already, dp_trainer_init; the slab is gathered
     * bucket by bucket from here on). */
    int zero3 = w->zero.stage == 3 && w->zero.sharded;
    if ((!zero3 && (rc = dp_comm_broadcast(w->comm, w->rep.params, m->num_params, DP_DTYPE_F32, 0, DP_ALGO_AUTO))) ||
        (m->num_buffers &&
         (rc = dp_comm_broadcast(w->comm, w->rep.buffers, m->num_buffers, DP_DTYPE_F32, 0, DP_ALGO_AUTO))))
        return rc;
    while (epoch < t->p.epochs) {
        double t_start = dp_time();
        w->wait0 = dp_loader_wait_time(w->loader);
        w->loss_sum = w->t_fwd = w->t_bwd = w->t_opt = w->t_comm = w->t_exposed = w->t_wait = w->t_slow = 0;
        w->b_sent = w->b_recv = w->b_fp32 = w->t_cz = w->t_dz = 0, w->reduce_steps = 0;
        if (w->grank == 0) memset(t->last_count, 0, sizeof(int64_t) * (size_t)t->G);
        if (w->grank == 0 && t->bk_on) memset(t->dropped_count, 0, sizeof(int64_t) * (size_t)t->G);
        w->correct = w->seen = w->skipped = 0;
        while (in_epoch < t->batches_per_epoch) {
            int stop = 0;
            if ((t->p.max_steps && step >= t->p.max_steps) || (rc = stop_agreed(w, step, &stop)) || stop) {
                if (rc) return dp_adderr(rc, "worker %d, step %lld: the stop request", w->grank, (long long)step);
                /* the run's end: as end_epoch's last epoch; --max-steps mid-epoch evaluates first
                 * (a requested stop does not: it is to end soon) */
                double acc = NAN, loss = NAN;
                if (!stop && in_epoch > 0 && (rc = evaluate_shared(w, &acc, &loss))) return rc;
                dp_zero_drop_grad_shard(&w->zero);
                if ((rc = dp_zero_gather_params(&w->zero, w->rank == 0, NULL)) || (rc = ef_gather_state(w)))
                    return rc;
                if (w->grank == 0) {
                    if (stop) t->stopped = step;
                    if (!isnan(acc)) rc = report_eval(w, step, epoch, acc, loss);
                    if (!rc) rc = checkpoint(t);
                } else if (zero_serves(t)) rc = zero_stream(w, NULL); /* while rank 0 writes */
                return rc ? rc : dp_comm_barrier(w->comm);
            }
            int64_t nmicro = t->batches_per_epoch - in_epoch < t->p.accum ? t->batches_per_epoch - in_epoch
                                                                          : t->p.accum;
            int64_t skipped_before = w->skipped;
            double n_step = 0, loss_step = 0;
            w->step = step, w->epoch = epoch;
            double s0[6], ts = dp_time();
            phase_sums(w, s0); /* for the per-step record */
            w->t_step0 = ts;
            rc = t->p.deterministic ? det_step(w, nmicro, &n_step, &loss_step)
                                    : train_step(w, nmicro, &w->skipped, &n_step, &loss_step);
            if (rc)
                /* non-finite errors already name the worker and step that caused them */
                return rc == DP_ENONFINITE ? rc : dp_adderr(rc, "worker %d, step %lld", w->grank, (long long)step);
            int last_rank = -1;
            if (t->gather_waits && (rc = gather_waits(w, &last_rank)))
                return dp_adderr(rc, "worker %d, step %lld", w->grank, (long long)step);
            step++;
            in_epoch += nmicro;
            /* every rank re-plans after the same steps (the step count is agreed) */
            if (t->balance && step % t->p.balance == 0 && (rc = rebalance(w)))
                return dp_adderr(rc, "worker %d, step %lld: --balance", w->grank, (long long)step);
            /* --eval-every: every rank evaluates (a collective), rank 0 reports with the step */
            double eacc = NAN, eloss = NAN, step_s = dp_time() - ts;
            if (t->p.eval_every && step % t->p.eval_every == 0 && (rc = evaluate_shared(w, &eacc, &eloss)))
                return dp_adderr(rc, "worker %d, step %lld: --eval-every", w->grank, (long long)step);
            if (w->grank == 0) {
                if (last_rank >= 0) t->last_count[last_rank]++;
                for (int r = 0; t->bk_on && r < t->G; r++) t->dropped_count[r] += w->dropped[r];
                t->step = step;
                t->step_in_epoch = in_epoch;
                struct dp_event ev = {.kind = DP_EVENT_STEP, .step = step, .epoch = epoch,
                                      .step_in_epoch = (in_epoch + t->p.accum - 1) / t->p.accum,
                                      .lr = dp_sched_lr(&t->p.sched, step - 1),
                                      .samples = (int64_t)n_step, .loss = loss_step,
                                      .skipped = w->skipped - skipped_before,
                                      .last_rank = last_rank, .wait_s = w->step_wait, .slow_s = w->step_slow,
                                      .ndropped = t->bk_on ? w->ndropped : 0};
                emit(t, &ev);
                if (t->metrics && (rc = step_record(w, step, epoch, loss_step, n_step, step_s, s0, last_rank, eacc,
                                                    eloss)))
                    return rc;
                if (!isnan(eacc)) {
                    struct dp_event eev = {.kind = DP_EVENT_EVAL, .step = step, .epoch = epoch,
                                           .step_in_epoch = ev.step_in_epoch, .test_acc = eacc, .test_loss = eloss,
                                           .positions = t->pos};
                    emit(t, &eev);
                }
            }
            if (t->p.check_replicas && step % t->p.check_replicas == 0 && (rc = check_replicas(w))) return rc;
            /* --ckpt-every-steps: now, or with the epoch's end when this step ends the epoch */
            if (t->p.ckpt_every_steps && step % t->p.ckpt_every_steps == 0) {
                if (in_epoch >= t->batches_per_epoch) w->ckpt_due = 1;
                else if ((rc = step_checkpoint(w)))
                    return dp_adderr(rc, "worker %d, step %lld: --ckpt-every-steps", w->grank, (long long)step);
            }
        }
        if ((rc = end_epoch(w, t_start))) return rc;
        epoch++;
        in_epoch = 0;
    }
    return DP_OK;
}

/* --pin-threads: the calling thread onto the (rank mod n)-th of the n cores
 * in `allowed` (the process's affinity, read once before any worker pins
 * itself).  One compute thread per core and no migrations.  Unpinned, on a
 * 2-core VM, one worker ended backward later at nearly every step of a run
 * (identical work: placement, not noise), and the other waited for it at the
 * step's end; pinned, cnn and resnet came 5-6 points closer to the machine's
 * ceiling (docs/results.md "Pinned workers").  A failure leaves the thread
 * unpinned. */
static void pin_to_core(const cpu_set_t *allowed, int rank) {
    int n = CPU_COUNT(allowed), want = n > 0 ? rank % n : 0, k = 0;
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE && n > 0; c++)
        if (CPU_ISSET(c, allowed) && k++ == want) {
            CPU_SET(c, &one);
            break;
        }
    if (CPU_COUNT(&one)) pthread_setaffinity_np(pthread_self(), sizeof one, &one);
}

static void *worker_main(void *arg) {
    struct worker *w = arg;
    cpu_set_t before;
    int pinned = w->t->p.pin_threads && pthread_getaffinity_np(pthread_self(), sizeof before, &before) == 0;
    if (pinned) pin_to_core(&w->t->cpus, w->rank);
    dp_set_num_threads(w->t->p.threads);
    w->rc = worker_loop(w);
    if (pinned) pthread_setaffinity_np(pthread_self(), sizeof before, &before); /* (the caller's, for worker 0) */
    if (w->rc) {
        snprintf(w->err, sizeof w->err, "%s", dp_errmsg());
        /* Unblock every other worker: their pending and future collectives
         * fail at once, so a failure never hangs the run. */
        if (w->rc != DP_ECANCELED) dp_comm_abort(w->comm, w->err);
        backup_abort(w->t, w->err); /* and the backup workers' step slot */
        if (w->t->ps && w->rc != DP_ECANCELED) dp_ps_abort(w->t->ps, w->err); /* and the server's waits */
    }
    return NULL;
}

int dp_trainer_run(struct dp_trainer *t) {
    t->t_origin = dp_time();
    if (t->p.pin_threads && sched_getaffinity(0, sizeof t->cpus, &t->cpus) != 0) CPU_ZERO(&t->cpus);
    for (int r = 0; r < t->P; r++) t->w[r].step = t->step, t->w[r].epoch = t->epoch, t->w[r].in_epoch = t->step_in_epoch;
    if (t->star) { /* rank 0's collector opens the first step */
        int rc = dp_backup_star_start(t->star, t->step);
        if (rc) return rc;
    } else if (t->bk_on) { /* the step slot opens at the first step */
        t->bk.open = t->step, t->bk.count = 0, t->bk.failed = 0;
        for (int r = 0; r < t->P; r++) t->bk.arrived[r] = -1;
        for (int k = 0; k < BACKUP_DEPTH; k++) t->bk.upd_step[k] = -1, t->bk.consumed[k] = 0;
    }
    if (t->ps) { /* the server starts from worker 0's state (initial, or the checkpoint's) */
        dp_ps_set_state(t->ps, t->w[0].rep.params, t->w[0].opt.state, t->w[0].opt.step, t->step);
        dp_ps_hist_reset(t->ps);
        atomic_store(&t->ps_next, 0);
    }
    for (int r = 1; r < t->P; r++) {
        if (pthread_create(&t->w[r].thread, NULL, worker_main, &t->w[r]) != 0) {
            dp_comm_abort(t->w[0].comm, "cannot start worker threads");
            for (int q = 1; q < r; q++) pthread_join(t->w[q].thread, NULL);
            return dp_seterr(DP_ENOMEM, "cannot start worker thread %d", r);
        }
        t->w[r].started = 1;
    }
    worker_main(&t->w[0]);
    for (int r = 1; r < t->P; r++)
        if (t->w[r].started) pthread_join(t->w[r].thread, NULL), t->w[r].started = 0;
    if (t->p.timeline) {
        struct dp_timeline *tls = dp_malloc(sizeof *tls * (size_t)t->P);
        if (!tls) return dp_seterr(DP_ENOMEM, "timeline: out of memory");
        for (int r = 0; r < t->P; r++) tls[r] = t->w[r].tl;
        char path[4096], note[160] = "";
        if (t->base == 0) snprintf(path, sizeof path, "%s", t->p.timeline);
        else snprintf(path, sizeof path, "%s.p%d", t->p.timeline, t->base / t->P);
        if (t->slow_rank >= 0)
            snprintf(note, sizeof note, "slowest rank: %d, %.3g ms per step behind the earliest", t->slow_rank,
                     t->slow_lag * 1e3);
        int rc = dp_timeline_write(path, tls, t->P, t->base, t->t_origin, note);
        dp_free(tls);
        if (rc && !t->w[0].rc) return rc;
    }
    /* The last step records (after the last epoch's flush, or all of them
     * when --max-steps stops mid-epoch) reach the file here. */
    errno = 0;
    if (t->metrics && !t->w[0].rc && (fflush(t->metrics) != 0 || ferror(t->metrics))) return metrics_error(t);
    /* Report the worker that failed first, not the ones it cancelled. */
    for (int r = 0; r < t->P; r++)
        if (t->w[r].rc && t->w[r].rc != DP_ECANCELED) return dp_seterr(t->w[r].rc, "%s", t->w[r].err);
    for (int r = 0; r < t->P; r++)
        if (t->w[r].rc) return dp_seterr(t->w[r].rc, "%s", t->w[r].err);
    return DP_OK;
}
