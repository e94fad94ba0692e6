/* The trainer's internals, shared by its files (src/train/): the workers, the
 * trainer, and the functions one file calls in another.  Not installed. */
#ifndef DP_TRAIN_TRAINER_H
#define DP_TRAIN_TRAINER_H

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
#include "dp/tokenizer.h"
#include "dp/train.h"
#include "fault.h"
#include "run_folder.h"
#include "timeline.h"

/* Backup workers (--backup-workers b; backup.c): the ranks that close steps
 * run at most BACKUP_DEPTH steps ahead of the latest (dp/ddp.h). */
#define BACKUP_DEPTH DP_BACKUP_DEPTH

/* --tp: a pass's gradient hook (tp.c): the replicated ranges zeroed, then the reduction's hook */
struct dp__tp_hook {
    struct worker *w;
    dp_grad_ready_fn ready;
    void *arg;
};

struct worker {
    struct dp_trainer *t;
    int rank;                  /* index in this process: w[rank] */
    int grank;                 /* rank in the whole job (= rank with one process) */
    struct dp_replica rep;
    struct dp_sync sync;       /* the step's synchronisation: reducer, ZeRO, optimizer (dp/ddp.h) */
    uint64_t zhash;            /* ZeRO 3: dp_replica_hash's value, folded as the ranges passed (end_epoch) */
    int ckpt_due;              /* --ckpt-every-steps fell on the epoch's last step: end_epoch checkpoints */
    int zsnap_pending;         /* a ZeRO snapshot of several processes is written, not yet finished (snapshot.c) */
    struct dp_loader *loader;
    struct dp_comm *comm;
    struct dp_timeline tl;
    float *buf_save;           /* --skip-nonfinite: the buffers before this step (num_buffers) */
    pthread_t thread;
    int started;
    int rc;
    char err[512];
    int32_t *etok, *etgt;      /* text: one evaluation chunk's windows (eval_chunk x ctx) */
    float *ex;                 /* a mapped test set: one evaluation chunk's samples, converted */
    /* this epoch's sums (t_comm, t_exposed: the modes outside sync, whose stats hold the rest) */
    double loss_sum, t_fwd, t_bwd, t_opt, t_comm, t_exposed, wait0;
    double t_step0;            /* when this step started (dp_time) */
    double *arrival;           /* (nb) per bucket: sum over this epoch's steps of the time from
                                  the step's start to the bucket's reduction start */
    int64_t arrival_steps;     /* steps summed in arrival */
    int64_t correct, seen, skipped;
    int64_t step, epoch, in_epoch; /* this worker's copy of the position */
    /* --simulate-slow/--simulate-jitter (simulate.c): this micro-batch's
     * multiplier, stall, start of compute and sleep so far */
    double pace_mult, pace_stall, pace_t0, pace_slept;
    void (*pace_ready)(void *arg, int64_t offset, int64_t count); /* the grad_ready hook paced in front of */
    void *pace_ready_arg;
    double step_wait, step_slow;   /* this step's wait in the reduction, and simulated sleep */
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
    struct worker_pipe *pipe;      /* --pp: this worker's stage (pipe_step.c), NULL otherwise */
    struct dp_tp tp;               /* --tp: this worker's tensor rank and its group's sum (tp.c) */
    struct dp_comm *tp_comm;       /* ... the group (NULL: no --tp) */
    struct dp__tp_hook tp_hook;    /* ... the pass's gradient hook (a pipeline's: one per micro-batch) */
};

/* A mode of training: how a worker runs and what one optimizer step is.
 * Chosen once, at dp_trainer_init (dp__mode_for); a new mode is one file that
 * defines its table, and one line in dp__mode_for.  The synchronous family
 * (plain with the reducer or ZeRO, deterministic, backup workers) shares the
 * step loop (dp__step_loop: positions, stops, reports, checkpoints) and
 * differs in `step`; the parameter server keeps its own loop shape. */
struct dp__mode {
    const char *name;
    int (*setup)(struct dp_trainer *t); /* once the model, the workers and any checkpoint are in (NULL: none) */
    int (*loop)(struct worker *w);      /* the worker's run, from the resume position to the end */
    /* with loop = dp__step_loop: one optimizer step of `nmicro` micro-batches;
     * *skipped counts a step skipped by --skip-nonfinite, *n_step the global
     * batch's samples and *loss_step this worker's mean loss */
    int (*step)(struct worker *w, int64_t nmicro, int64_t *skipped, double *n_step, double *loss_step);
};
extern const struct dp__mode dp__mode_sync, dp__mode_det, dp__mode_backup, dp__mode_ps, dp__mode_ps_net,
    dp__mode_pipe;

/* What a step's compute sums over its micro-batches (dp__compute) */
struct dp__sums {
    double n_total;  /* samples of the global batch */
    double n_local;  /* this worker's */
    double loss_sum; /* this worker's loss, summed */
    int local_bad;   /* this worker's loss is not finite */
};
/* A mode's hooks on each micro-batch of dp__compute (each may be NULL but finish) */
struct dp__micro_hooks {
    /* before micro-batch k's run: the pass's hooks and loss scale (n_before:
     * the global samples of the micro-batches before it); 1 if it reduces */
    int (*begin)(struct worker *w, struct dp_pass *pass, int64_t k, int64_t nmicro,
                 const struct dp_loader_batch *lb, double n_before);
    /* right after the run (rc: its result): what the hooks hold released */
    int (*after_run)(struct worker *w, const struct dp_pass *pass, int reducing, int rc);
    /* after the micro-batch's compute, when it reduces: the reduction's end */
    int (*finish)(struct worker *w, int last_micro);
};

struct dp_trainer {
    const struct dp__mode *mode; /* chosen once at init: dp__mode_for */
    struct dp_fault fault;       /* the tests' injected fault (fault.h; kind 0: none) */
    cpu_set_t cpus;            /* --pin-threads: the process's affinity at dp_trainer_run */
    struct dp_train_params p;
    struct dp_dataset train, test;
    float *norm_mean, *norm_std; /* (norm_C) the input normalisation applied (data_src.c) */
    int64_t norm_C;            /* channels; 0: none */
    int regression;            /* the model's loss is mse: float targets */
    uint16_t *tok_len;         /* text: each token's length in bytes (its tokenizer's), NULL: 1 each */
    uint8_t *bpe;              /* text: the tokenizer's file bytes (dp_bpe_serialize), NULL: byte-level */
    size_t bpe_len;
    char data_note[1024];      /* dp_trainer_data_note: how the data was read (data_src.c) */
    char *class_names;         /* a folder of images: its classes, one per line (NULL: none) */
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
    int bk_on;                 /* backup workers: steps go through the slot (or the star), not the reducer */
    struct dp_backup_slot *slot; /* ... on this process's threads (src/ddp/backup_slot.c) */
    struct dp_backup_star *star; /* ... across processes (with `inter`): through rank 0 instead */
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
                                  state (G x dp_sync_ef_len), gathered by ef_gather_state */
    struct dp_snapshot *snap;  /* the background checkpoint writer (snapshot.c), NULL until the first */
    double snap_copy_s, snap_wait_s; /* rank 0's time copying snapshots, and waiting for the writer */
    int64_t snap_taken;
    int64_t efstate_step;      /* the optimizer step efstate was gathered at (-1: never) */
    int red_check;             /* the reduced gradient is checked for non-finite values inside the
                                  all-reduce (reduced_check), not by every worker after it */
    atomic_llong red_bad;      /* ... 1 + the last step whose reduced gradient had one */
    atomic_llong stop_at;      /* a requested stop, in one process: the step after which every worker
                                  stops (INT64_MAX: none; stop_agreed); the parameter server's
                                  threads: the epoch at whose end they stop (ps_stop_note) */
    int64_t stopped;           /* the step a requested stop ended the run at (-1: none) */
    /* --pp (pipe_step.c): S stages of R = G / S replicas; stage s is layers [pp_first[s],
     * pp_first[s + 1]); each stage's replicas reduce in their own world */
    int pp, pp_R, pp_M;
    int *pp_first;
    struct dp_comm_world **pp_worlds;
    char layout[1024];         /* the layout, for the caller (dp_trainer_layout): --pp's, --tp's, --zero-unit-mb's */
    /* --tp (tp.c): tensor groups of tp workers, each its own world; the parameter ranges that
     * are replicated within a group (tp_nrep pairs offset, count) */
    int tp;
    struct dp_comm_world **tp_worlds;
    int64_t *tp_rep;
    int tp_nrep;
};

/* params.c */
/* The model's batch of samples [c0, c0 + B) of a loader's batch: per input values (or token
 * ids) per sample, pos label terms, and for a regression K targets per sample. */
static inline struct dp_batch dp__batch_of(const struct dp_loader_batch *lb, int64_t c0, int64_t B, int64_t per,
                                           int64_t pos, int64_t K) {
    return (struct dp_batch){.B = B, .x = lb->x ? lb->x + c0 * per : NULL,
                             .tokens = lb->tokens ? lb->tokens + c0 * per : NULL,
                             .targets = lb->target ? NULL : lb->y + c0 * pos,
                             .target = lb->target ? lb->target + c0 * K : NULL,
                             .sample_idx = lb->idx + c0, .epoch = lb->epoch};
}

/* data_src.c: the training and test sets and their normalisation; the checkpoint's text of it */
int dp__data_load(struct dp_trainer *t);
char *dp__norm_text(const struct dp_trainer *t);
int dp__check_ps(const struct dp_train_params *p);
int dp__check_params(const struct dp_train_params *p);
int dp__check_schedule(const struct dp_trainer *t);

/* trainer.c */
void *dp__worker_main(void *arg);
int dp__step_loop(struct worker *w);
const struct dp__mode *dp__mode_for(const struct dp_trainer *t);

/* pipe_step.c (--pp): the stage split (before the workers), a worker's stage (worker_init: its
 * loader's rank and world, its sync's span, communicator and assembly hook), and their ends */
int dp__pipe_plan(struct dp_trainer *t);
int dp__pipe_worker_init(struct worker *w, struct dp_loader_params *lp);
struct dp_comm *dp__pipe_sync_params(struct worker *w, struct dp_sync_params *sp);
void dp__pipe_worker_free(struct worker *w);
void dp__pipe_free(struct dp_trainer *t);
/* The activation bytes a stage's micro-batches held at the most: their arenas' high-water marks. */
int64_t dp__pipe_activation_bytes(const struct worker *w);
/* A failed worker's message to the stages' worlds (their pending all-reduces fail at once). */
void dp__pipe_abort(struct dp_trainer *t, const char *msg);

/* tp.c (--tp): the groups' worlds and the replicated ranges (before the workers), a worker's
 * tensor rank (worker_init: its loader's rank and world), the pass's hooks (the group's sum,
 * the replicated gradient zeroed on ranks other than 0), and their ends */
int dp__tp_plan(struct dp_trainer *t);
int dp__tp_worker_init(struct worker *w, struct dp_loader_params *lp);
void dp__tp_begin(struct worker *w, struct dp_pass *pass, struct dp__tp_hook *h);
void dp__tp_failed(struct worker *w, int rc);
void dp__tp_worker_free(struct worker *w);
void dp__tp_free(struct dp_trainer *t);
void dp__tp_abort(struct dp_trainer *t, const char *msg);
/* The optimizer state's part k in the whole slab's layout (k = -1: the parameters, where a
 * pipeline's stages do not hold them whole: dp__pipe_partial), handed to put in slab order:
 * worker 0's, or a pipeline's stages' (each stage's replica 0 holds its span's: a worker of this
 * process, or, across processes, received from it in blocks: it sends them in dp__pipe_serve).
 * Rank 0. */
int dp__state_part_each(const struct dp_trainer *t, int k, void (*put)(void *arg, const float *p, int64_t n),
                        void *arg);
int dp__pipe_serve(struct worker *w);
/* 1 when the workers hold their stage's parameters only (a pipeline: the rest of the slabs
 * mapped, never touched), so that a stage's memory is its share. */
int dp__pipe_partial(const struct dp_trainer *t);
/* The ranges of the parameter slab a pipeline worker holds: its span, and a tied copy (the
 * reader's); the count of them (1 or 2). */
int dp__pipe_held(const struct worker *w, int64_t off[2], int64_t len[2]);

/* checkpointing.c */
int dp__load_checkpoint(struct dp_trainer *t, const char *path);
void dp__resume_position(struct dp_trainer *t);
int dp__zero_stream(struct worker *w, struct dp_ckpt_writer *out);
/* 1 when rank 0's checkpoint needs the other workers' parts (a multi-process job with ZeRO or a
 * pipeline): each of them then calls dp__ckpt_serve at the same point (ZeRO: dp__zero_stream with
 * no writer; a pipeline stage: dp__pipe_serve). */
int dp__ckpt_serves(const struct dp_trainer *t);
int dp__ckpt_serve(struct worker *w);
int dp__checkpoint_write(struct dp_trainer *t);
int dp__ef_gather_state(struct worker *w);
/* After each step (every worker): --ckpt-every-steps now, or with the epoch's end when
 * this step ends the epoch (epoch_ends); and the ZeRO snapshot still pending (snapshot.c). */
int dp__step_checkpoint(struct worker *w, int64_t step, int epoch_ends);
/* step.c: the model's pass on b, or the fault a test armed in its place (fault.h); last: the
 * step's last batch on this worker (micro-batch, or deterministic chunk) */
int dp__model_run(struct worker *w, const struct dp_batch *b, struct dp_pass *pass, int last);
void dp__fill_header(const struct dp_trainer *t, struct dp_ckpt_header *h);
int dp__ckpt_ef_image(const struct dp_trainer *t, char **data, size_t *size);
void dp__ckpt_put_sections(const struct dp_trainer *t, struct dp_ckpt_writer *out, const char *ef, size_t ef_size,
                           int64_t metrics_bytes);
int dp__ckpt_keep_previous(const char *path);

/* ckpt.c: a payload written by several writers at their offsets, adopted as a writer (snapshot.c) */
int dp__ckpt_writer_adopt(struct dp_ckpt_writer **out, const char *tmp, const char *path,
                          const struct dp_ckpt_header *h);
/* snapshot.c: --ckpt-every-steps written in the background */
int dp__snapshot_on(const struct dp_trainer *t);
int dp__snapshot_take(struct dp_trainer *t);
int dp__snapshot_wait(struct dp_trainer *t);
/* ZeRO (every worker): take a snapshot (each copies its pieces; each process's writer
 * writes them); at a step boundary, learn whether every process has written a pending one
 * (one all-reduce while one is pending); wait for it (before a synchronous checkpoint, the
 * next snapshot, the run's end).  clean: rank 0 at the start removes a failed run's
 * temporary files. */
int dp__zsnap_take(struct worker *w);
int dp__zsnap_poll(struct worker *w);
int dp__zsnap_drain(struct worker *w);
void dp__zsnap_clean(const char *dir);
void dp__snapshot_free(struct dp_trainer *t);

/* eval.c */
int dp__evaluate_shared(struct worker *w, double *acc, double *loss);
/* Evaluation's pieces (eval.c): chunk c of the first n samples of ds as a batch, and its pass's
 * result in slot[2c], slot[2c + 1]; and evaluation through a pipeline's stages (pipe_step.c):
 * every chunk's result in slot on the rank of the last stage that evaluated it, zeros elsewhere. */
int dp__eval_batch(const struct dp_trainer *t, struct worker *w, const struct dp_dataset *ds, int64_t n, int64_t c,
                   struct dp_batch *b);
void dp__eval_record(const struct dp_trainer *t, const struct dp_pass *pass, int64_t B, int64_t c, double *slot);
int dp__pipe_evaluate(struct worker *w, const struct dp_dataset *ds, int64_t n, int64_t nchunks, double *slot);

/* report.c */
void dp__emit_event(struct dp_trainer *t, struct dp_event *ev);
int dp__gather_waits(struct worker *w, int *last);
int dp__metrics_error(const struct dp_trainer *t);
int dp__report_eval(struct worker *w, int64_t step, int64_t epoch, double acc, double loss);
int dp__end_epoch(struct worker *w, double t_start);
void dp__phase_sums(const struct worker *w, double out[6]);
int dp__step_record(const struct worker *w, int64_t step, int64_t epoch, double loss, double samples,
                    double step_s, const double s0[6], int last_rank, double test_acc, double test_loss);

/* step.c */
int dp__red_check_possible(const struct dp_trainer *t);
void dp__reduced_check(void *arg, int64_t off, int64_t n);
void dp__update_done(struct worker *w, double s);
int dp__compute(struct worker *w, int64_t nmicro, const struct dp__micro_hooks *h, struct dp__sums *c);
int dp__apply_update(struct worker *w, double t1);

/* agree.c */
int dp__check_replicas(struct worker *w);
int dp__stop_agreed(struct worker *w, int64_t step, int *stop);
int dp__agree_config(struct worker *w);

/* simulate.c */
void dp__pace_plan(const struct worker *w, double *mult, double *stall);
void dp__pace_start(struct worker *w, double mult, double stall, double t0);
void dp__pace_sleep(struct worker *w);
void dp__paced_grad_ready(void *arg, int64_t offset, int64_t count);

/* backup.c */
void dp__backup_abort(struct dp_trainer *t, const char *why);

/* balance.c */
int dp__rebalance(struct worker *w);



#endif
