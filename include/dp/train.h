/*
 * dp/train.h — the training loop, checkpoints and metrics.
 *
 *     struct dp_train_params tp = dp_train_default_params();
 *     tp.data.data_dir = "/usr/share/datasets/fashion-mnist";
 *     tp.run.model = "cnn";
 *     struct dp_trainer *t;
 *     if (dp_trainer_init(&t, &tp)) { ... dp_errmsg() ... }
 *     int rc = dp_trainer_run(t);        // progress through tp.io.on_event
 *     dp_trainer_free(t);
 *
 * Library code never prints: the trainer reports progress through the
 * on_event callback (the CLI draws a progress bar from it).
 */
#ifndef DP_TRAIN_H
#define DP_TRAIN_H

#include "comm.h"
#include "data.h"
#include "ddp.h"
#include "nn.h"
#include "optim.h"

#ifdef __cplusplus
extern "C" {
#endif

enum dp_event_kind {
    DP_EVENT_STEP = 0,    /* after each optimizer step */
    DP_EVENT_EPOCH,       /* after each epoch (train metrics + test accuracy) */
    DP_EVENT_CHECKPOINT,  /* a checkpoint was written */
    DP_EVENT_EVAL,        /* an evaluation between epochs (eval_every, or the end of a run that
                             max_steps stopped mid-epoch): step, epoch, test_acc, test_loss */
    DP_EVENT_KIND_COUNT
};

struct dp_event {
    enum dp_event_kind kind;
    int64_t step, epoch, step_in_epoch, steps_per_epoch, epochs;
    float lr;
    int64_t samples;      /* STEP: samples in this step's batch */
    double loss;          /* STEP: this batch's mean loss; EPOCH: the epoch's mean */
    double train_acc;     /* EPOCH */
    double test_acc, test_loss; /* EPOCH (NaN if no test set); text: on the validation windows;
                                   regression: test_acc is the mean absolute error, test_loss the
                                   mean squared error */
    int regression;       /* EPOCH, EVAL: the model's loss is mse */
    double val_bpb;       /* EPOCH, EVAL: a language model's validation loss in bits per byte of
                             the text (dp_trainer_bits_per_byte); NaN for other models */
    int64_t positions;    /* EPOCH: loss terms per sample: 1, or T for a language model (its
                             losses and accuracies are per token; tokens/s = samples/s x T) */
    double samples_per_s; /* EPOCH: training throughput of the epoch */
    double epoch_time;    /* EPOCH: seconds */
    double t_data, t_fwd, t_bwd, t_opt; /* EPOCH: seconds spent per phase (rank 0) */
    double t_comm, t_comm_exposed;      /* EPOCH: all-reduce time in total, and the part
                                           not hidden behind backward (rank 0) */
    int64_t skipped;                    /* EPOCH: steps skipped as non-finite */
    /* EPOCH: gradient traffic of rank 0 per reducing step, averaged over the
     * epoch (bytes sent and received on the wire, what fp32 would have
     * moved: bytes_fp32 / bytes_sent is the compression ratio), and the
     * epoch's seconds compressing and decompressing */
    double bytes_sent, bytes_recv, bytes_fp32, t_compress, t_decompress;
    int slow_rank;                      /* EPOCH: the rank whose reductions start latest in
                                           its steps, on average (-1 with one worker) */
    double slow_lag;                    /* EPOCH: its lag behind the earliest rank, s per step */
    int last_rank;                      /* STEP: the rank that arrived last at the step's reduction
                                           (-1: one worker, or not gathered: see wait_s) */
    double wait_s;                      /* STEP: rank 0's wait in the step's reduction (docs/ddp.md) */
    double slow_s;                      /* STEP: rank 0's simulated slowness (sleep) in the step */
    const int64_t *shares;              /* EPOCH, with --balance: each rank's share of a full global
                                           batch (samples) at the epoch's end; NULL otherwise */
    const int64_t *rank_samples;        /* EPOCH, with --balance or the parameter server: the samples
                                           each rank took */
    int nshares;                        /* EPOCH: entries in shares and rank_samples (the ranks) */
    int ndropped;                       /* STEP, with backup workers: ranks whose gradient was dropped */
    const int64_t *dropped_steps;       /* EPOCH, with backup workers: per rank, the steps in which
                                           its gradient was dropped (nshares entries); NULL otherwise */
    /* parameter server (--mode async, --staleness): STEP: the staleness of rank 0's push; EPOCH:
       the epoch's pushes (0 in sync mode) and their staleness (updates between a worker's pull and
       the apply of its push; docs/ddp.md) */
    int64_t staleness;                  /* STEP */
    int64_t pushes;                     /* EPOCH */
    double stale_mean;                  /* EPOCH */
    int64_t stale_p50, stale_p99, stale_max; /* EPOCH */
    const char *path;     /* CHECKPOINT */
};
typedef void (*dp_event_fn)(void *arg, const struct dp_event *ev);

/* dp_train_params.data.normalize */
enum { DP_NORM_SOURCE = 0, DP_NORM_AUTO = 1, DP_NORM_NONE = 2, DP_NORM_FIXED = 3 };
/* The checkpoint section holding the run's input normalisation (text: "mean M0 M1 ...\nstd S0 S1 ...\n"). */
#define DP_CKPT_NORM_TAG "DPNORMIN"
/* The checkpoint section holding a language model's BPE tokenizer (the bytes of its .bpe file,
 * dp/tokenizer.h), when its token file has one beside it (prepare-text --vocab). */
#define DP_CKPT_BPE_TAG "DPTOKBPE"
/* The checkpoint section holding the class names of a run on a folder of images, one per line
 * in class order. */
#define DP_CKPT_CLASSES_TAG "DPCLASSN"

/* dp_train_params.dp.zero_gather */
enum { DP_ZERO_GATHER_AUTO = 0, DP_ZERO_GATHER_STEP = 1, DP_ZERO_GATHER_AHEAD = 2 };

/* What is trained, and for how long */
struct dp_train_run {
    const char *model;         /* model spec: mlp, cnn, resnet, mlp:... */
    const char *model_file;    /* a model file (docs/models.md); when set it replaces model.  Every
                                  process reads it; its canonical text goes into the checkpoint */
    const char *model_text;    /* a model file's text itself, in place of model_file; model, if set,
                                  then only names it (default "custom") */
    /* A model built by the caller through the C API (examples/custom_model.c): when set it
     * replaces model and model_file.  Called once per process, before the data is read, with
     * model_build_arg; the model declares its input (dp_model_init), which must be the data's,
     * and is finalized here if the builder did not.  The trainer owns and frees it.  Its
     * canonical text (dp_model.desc) goes into the checkpoint, so a resume, `dptrain eval` and
     * `ckpt export` rebuild it without the builder (a layer of the caller's own, which has no
     * text, needs the builder again). */
    int (*model_build)(struct dp_model **m, void *arg);
    void *model_build_arg;
    /* enum dp_loss_kind: DP_LOSS_XENT (classes, the default) or DP_LOSS_MSE (a regression: the
     * labels are float targets, the report gives RMSE and MAE).  A model file's `loss mse` is
     * the same as DP_LOSS_MSE. */
    int loss;
    int64_t epochs;
    int64_t batch;
    int64_t max_steps;         /* stop after this many steps in total (0 = no limit) */
    uint64_t seed;
    int threads;               /* compute threads */
    double clip_norm;          /* 0 = no clipping */
};

/* Where the samples come from and how they are prepared (docs/data.md) */
struct dp_train_data {
    const char *data_dir;      /* IDX files (train-*, t10k-*); an .npy of features (with labels); for a
                                  gpt model, a token file (dptrain prepare-text, docs/text.md) */
    /* Your own data (docs/data.md).  data_dir X.npy takes its labels from `labels` (y.npy); the
     * test set is test_data + test_labels, or val_split of the samples held out (seed-keyed),
     * or none.  layout_nhwc: X is (N, H, W, C). */
    const char *labels, *test_data, *test_labels;
    const char *npz_keys;      /* data.npz: its two arrays "X,Y" (NULL: x,y, else x_train,y_train) */
    const char *label_column;  /* data.csv: the labels' column, a header name or a 0-based index (NULL:
                                  the last) */
    int csv_header;            /* data.csv: -1 (default) detect a header row, 0 none, 1 the first row is one */
    /* a folder of images (DIR/<class>/<image>.png|.jpg): the size every image is resized and
     * centre-cropped to (0, 0: their own, all equal), the channels (0: from the images, 1 or 3),
     * and whether a corrupt image is skipped and counted instead of ending the run */
    int64_t image_h, image_w;
    int image_channels, skip_bad_images;
    /* a language model's --data: 0, a token file (dptrain's own, or an llm.c shard, told by its
     * magic); 1, raw little-endian uint16 tokens with no header (nanoGPT's train.bin), their
     * vocabulary the model's */
    int tokens_raw_u16;
    double val_split;          /* 0: none */
    int layout_nhwc;
    /* Arrays in memory in place of files (the Python package, docs/python.md): when train_x.data
     * is set, train_x and train_y are the training set (data_dir and labels are not read) and
     * test_x, test_y (when set) the test set, read as an .npy pair is (dp_dataset_open_arrays:
     * the same shapes, dtypes, layout_nhwc, val_split and normalisation).  Borrowed: they must stay
     * alive and unchanged while a trainer made from these params lives.  Set them with
     * dp_train_params_set_array.  train_y.data NULL: every label 0 (a prediction's inputs). */
    struct dp_array train_x, train_y, test_x, test_y;
    /* Input normalisation, per channel: DP_NORM_SOURCE (0, default) is the source's own
     * (DP_NORM_FIXED for IDX, DP_NORM_AUTO for the others); AUTO computes each channel's mean
     * and std over the training split; FIXED uses norm_mean and norm_std; NONE leaves the
     * values as read.  A resumed run uses its checkpoint's. */
    int normalize;
    /* The normalisation of a run trained before, in the text of its checkpoint's section
     * (DP_CKPT_NORM_TAG: "mean M0 M1 ...\nstd S0 S1 ...\n", one value per channel or
     * feature), e.g. from a safetensors file's metadata; NULL: none.  Overrides normalize. */
    const char *norm_text;
    float norm_mean, norm_std; /* input normalisation */
    struct dp_augment aug;
    int prefetch;              /* batches a loader thread prepares ahead; 0: none, each worker assembles
                                  its batch itself; -1 (default) auto: dp_train_prefetch_auto */
    int64_t train_limit;       /* use only the first N training samples (0 = all); text: N windows per epoch */
    int64_t test_limit;        /* evaluate on the first N test samples (0 = all); text: validation windows */
};

/* Data parallelism: the workers, the reduction, the modes of training (docs/ddp.md) */
struct dp_train_dp {
    /* Several processes (for example MPI ranks): this process's communicator
     * with the others, one per process, or NULL for a single process.  Each
     * process then runs `workers` worker threads, and the job has
     * workers x processes ranks (process p's thread t is rank p*workers + t):
     * a hierarchical world (dp_comm_thread_world_init_hier).  Every process
     * loads the data and, when resuming, reads the checkpoint; only rank 0
     * writes metrics, checkpoints and the timeline (others write
     * TIMELINE.p<process>).  The caller keeps `inter` (it outlives the
     * trainer) and, when dp_trainer_run fails, should end the job
     * (dp_comm_kill_job) so that no process waits for this one. */
    struct dp_comm *inter;
    /* data parallelism: `workers` replicas, each a thread with `threads`
     * compute threads, each taking its share of every global batch */
    int workers;               /* P (default 1) */
    int accum;                 /* gradient accumulation: global batches per optimizer step */
    /* Pipeline parallelism (docs/parallel.md): pp stages (1 = off), the model's layer sequence
     * cut into pp contiguous stages balanced by counted cost; the workers form workers / pp
     * data-parallel replicas of the pipeline (job rank g is stage g / (workers / pp), replica
     * g mod (workers / pp)).  Each replica's share of the global batch is cut into
     * micro_batches (0 = pp) that flow through the stages by pp_schedule (enum
     * dp_pipe_schedule, dp/par.h).  Threads of one process, or one worker per process (`inter`);
     * ZeRO 0, or 1 on threads (each stage's state sharded over its replicas); with --deterministic
     * the micro-batches are the fixed chunks (any layout: the same bits); not with --accum,
     * --balance, compression, backup workers or the parameter server. */
    int pp;
    int micro_batches;
    int pp_schedule;
    /* Tensor parallelism (docs/parallel.md): tp workers that see the same samples split each
     * transformer block (attention by heads, its MLP column then row: struct dp_tp, dp/nn.h),
     * 2 all-reduces in forward and 2 in backward per block; the workers form workers / tp
     * data-parallel replicas (job rank g is tensor rank g mod tp of replica g / tp; with pp, each
     * stage of each replica is a group).  A group is threads of one process (under mpirun, --workers
     * a multiple of tp in each process, the replicas across them); every worker holds the whole
     * model; ZeRO 0 or 1; not with --deterministic, --balance, compression, backup workers or
     * the parameter server. */
    int tp;
    size_t bucket_cap_bytes;   /* reducer bucket cap (default 0 = auto, see dp/ddp.h) */
    size_t first_bucket_bytes; /* reducer first bucket (default 1 MiB) */
    int overlap;               /* 1: all-reduce buckets during backward (default) */
    /* gradient compression (--compress, --powersgd-start; docs/ddp.md
     * "Gradient compression"); kind NONE = off.  Not with deterministic or
     * backup workers.  compress.seed is ignored (the run's seed is used). */
    struct dp_compress_params compress;
    int algo;                  /* enum dp_comm_algo (default AUTO) */
    int64_t check_replicas;    /* compare replica hashes every N steps (0 = off) */
    int skip_nonfinite;        /* skip steps whose loss or gradient is not finite */
    double comm_timeout;       /* seconds a collective may block before the run fails (0 = off) */
    int comm_progress;         /* enum dp_comm_progress: who runs the bucket all-reduces on
                                  threads (dp/comm.h; default DP_PROGRESS_AUTO, resolved by
                                  dp_train_progress_auto) */
    int comm_spin_us;          /* dp_comm_params.spin_us of the workers' world (-1 = auto, default) */
    int pin_threads;           /* 1: worker r of this process runs only on the (r mod n)-th of the n
                                  cores the process may use (its affinity at dp_trainer_run), so the
                                  workers never share a core or migrate (the communication threads
                                  are not pinned); the calling thread's affinity is restored after
                                  the run.  0 (default): the scheduler places them. */
    int deterministic;         /* bit-identical results for any worker count (docs/ddp.md) */
    int64_t det_chunk;         /* deterministic mode: samples per fixed chunk (0 = dp_det_chunk_auto) */
    /* ZeRO (docs/ddp.md "ZeRO"; dp/ddp.h): 1 = each worker keeps the optimizer state of its
     * 1/G shard of the parameters, updates that shard and all-gathers the parameters; 2 also
     * shards the gradient, 3 the parameters (0 = off).  zero_scatter: the gradient is
     * reduce-scattered (each worker needs only its shard's sum: half an all-reduce's bytes)
     * instead of all-reduced bucket by bucket during backward: bucket by bucket during backward
     * when the all-gather is ahead (zero_gather), else the whole slab after backward.
     * Not with --backup-workers or the parameter server. */
    int zero;
    int zero_scatter;
    /* --zero 1: when the all-gather of the updated parameters completes.
     * DP_ZERO_GATHER_STEP: within the step; DP_ZERO_GATHER_AHEAD: issued bucket by bucket and
     * waited for by the next forward, layer by layer (src/ddp/zero.c "Ahead");
     * DP_ZERO_GATHER_AUTO (0, default): ahead when the workers span processes (the gather
     * crosses a network and overlaps forward), within the step on threads (every core computes,
     * so the overlap only moves the copy to the communication thread; docs/ddp.md "ZeRO"). */
    int zero_gather;
    /* --zero-unit-mb: the largest range ZeRO gathers or reduce-scatters at once, in bytes (0:
     * none; the buckets as planned).  Buckets are capped at it, and a top-level layer larger
     * than it (linear) runs in slices of output features, each slice a range of its own
     * (dp_model_set_unit), so ZeRO 2 and 3 hold a few units in flight instead of whole
     * layers.  Applied whatever the stage and worker count, so that the bits are those of
     * every run with the same unit. */
    size_t zero_unit_bytes;
    /* Heterogeneity-aware batches (docs/ddp.md "Balanced shares"): every
     * `balance` optimizer steps the ranks all-gather their measured
     * throughput and re-split the global batch in proportion to it (0 = off:
     * equal shares).  The gradient stays the exact global-batch one. */
    int64_t balance;
    /* Backup workers (docs/ddp.md "Backup workers"): with backup = 1 each
     * synchronous step takes the gradients of the first workers - b ranks
     * to finish their compute (b = backup_workers, 0 <= b < workers; 0
     * accepts every rank through the same path) and drops the others'; the
     * step's gradient is the mean over the accepted ranks' samples and every
     * replica applies it.  Thread backend in one process only (not with
     * `inter`), and not with --deterministic unless b = 0. */
    int backup;
    int backup_workers;
    /* Parameter server (docs/ddp.md "Parameter server and bounded staleness"), thread backend in
     * one process: with async = 1 every worker loops pull -> forward/backward -> push through a
     * server of `servers` shards (0 = min(workers, 4)) and never waits for another.  staleness < 0:
     * plain async (workers claim the epoch's batches of batch / workers samples as they go);
     * staleness = s >= 0: stale-synchronous, the P pushes of a clock (worker r's share of global
     * batch c) summed into one update, a worker at most s clocks ahead of the slowest (s = 0 is
     * synchronous training).  staleness_lr scales the lr by 1 / (1 + staleness); share_lr
     * (async only) scales a push's lr by its samples / batch; implicit_momentum (async SGD)
     * runs the server at momentum 1 - P (1 - momentum) (dp_ps_momentum).  With deterministic,
     * async applies pushes in the fixed order clock x P + rank (a replay). */
    int async;
    int staleness;             /* default -1 (unbounded) */
    int staleness_lr;
    int share_lr;
    int implicit_momentum;
    int servers;
};

/* The run folder, checkpoints and evaluation, and the caller's hooks */
struct dp_train_io {
    /* The run folder: metrics.jsonl and checkpoint.bin (NULL = none), created with its missing
     * parents.  A folder that holds a run already (a checkpoint.bin or a non-empty
     * metrics.jsonl) is refused unless this run resumes that folder's own checkpoint (resume
     * names the file in it) or `overwrite` is set; the error names what the folder holds.  A
     * resume first cuts metrics.jsonl back to what it held when the checkpoint was written (a
     * record cut short by a kill, and the records of steps past the checkpoint, are dropped),
     * so every step is recorded once.  Each record reaches the file in one write. */
    const char *out_dir;
    int overwrite;
    int ckpt_every;            /* epochs between checkpoints (0 = only at the end) */
    int64_t ckpt_every_steps;  /* and every N optimizer steps (0 = off), written in the background
                                  (not with ZeRO) */
    int ckpt_sync;             /* write those in the step instead (for comparison) */
    int64_t eval_every;        /* evaluate every N optimizer steps (0 = only at epoch ends): a
                                  DP_EVENT_EVAL and test_loss/test_acc in that step's record */
    /* The caller's configuration of the run, stored verbatim in every checkpoint (section
     * "DPCONFIG"; dptrain: its train options, one per line) for a resume to restore
     * (dp_ckpt_read_section).  NULL = none. */
    const char *config;
    const char *resume;        /* checkpoint to continue from */
    const char *init_from;     /* safetensors file with initial weights */
    const char *timeline;      /* write a Chrome trace-event file of the run here (NULL = off) */
    /* A stop on request (a signal; the caller's flag, set to non-zero from any thread): the
     * run finishes its current step, every rank at the same step (in one process they agree
     * through a shared atomic step; across processes, one 8-byte all-reduce per step), writes
     * the checkpoint and returns DP_OK; dp_trainer_stopped then gives the step.  NULL = off.
     *   Take the signal on a thread of your own (block it before starting any thread, then
     * sigwait), not with a handler that may run on the thread that called dp_trainer_run:
     * oneDNN's GEMM (Debian 12's libdnnl 2.7) points rsp into a heap buffer while it runs,
     * and a handler run there writes its frame over the heap (oneDNN#4845).  The library's
     * own threads block every asynchronous signal; dptrain's main.c shows the pattern. */
#ifdef __cplusplus
    const volatile int *stop;  /* (the same object: C++ spells C11's _Atomic int differently) */
#else
    const _Atomic int *stop;
#endif
    dp_event_fn on_event;
    void *event_arg;
};

/* Slow workers on purpose (docs/ddp.md "Slow workers on purpose"): timing only */
struct dp_train_sim {
    /* Slow workers on purpose (docs/ddp.md "Slow workers on purpose"): sleep
     * proportional to a rank's measured compute.  simulate_slow:
     * "RANK:FACTOR[,RANK:FACTOR...]" (job ranks, FACTOR >= 1);
     * simulate_jitter: "p=P,ms=MS" and/or "lognormal=SIGMA", drawn per
     * (rank, step) from (seed, DP_RNG_SLOW).  NULL = off.  Timing only: the
     * arithmetic, and so the parameters, are unchanged. */
    const char *simulate_slow;
    const char *simulate_jitter;
};

/* A training run's parameters, by concept: what is trained (run), its samples (data), the
 * optimizer and its schedule, data parallelism (dp), the run folder and the caller's hooks
 * (io), simulated slowness (sim).  dp_train_default_params() gives the defaults;
 * dp_train_option_set sets a field by the name of train's CLI option for it. */
struct dp_train_params {
    struct dp_train_run run;
    struct dp_train_data data;
    struct dp_optim_params optim; /* the optimizer (dp/optim.h) */
    struct dp_sched sched;        /* the learning-rate schedule: base_lr = the learning rate;
                                     total_steps filled in if 0 */
    struct dp_train_dp dp;
    struct dp_train_io io;
    struct dp_train_sim sim;
};
struct dp_train_params dp_train_default_params(void);
/* The same on the heap (for callers that cannot lay the struct out, such as Python's ctypes),
 * and its end; NULL when out of memory. */
struct dp_train_params *dp_train_params_new(void);
void dp_train_params_free(struct dp_train_params *p);

/* train's options by name: one table drives the CLI's parsing and help, the Python
 * package's keyword arguments, and the configuration stored in checkpoints. */
struct dp_train_option {
    const char *name;  /* as the CLI spells it without "--": "lr", "zero-reduce" */
    const char *arg;   /* its value's placeholder ("F", "N|auto"); NULL for a flag */
    const char *group; /* its group in `dptrain train --help` */
    const char *help;  /* one or more lines, separated by '\n' */
    int optional;      /* the value may be left out (--balance alone: every 10 steps) */
};
/* The i-th option (0-based), NULL past the end; an option by name (as dp_train_option_set
 * takes it), NULL if there is none; the i-th name. */
const struct dp_train_option *dp_train_option_at(int i);
const struct dp_train_option *dp_train_option_find(const char *name);
const char *dp_train_option_name(int i);
/* Sets option NAME ("lr", "--lr" and "zero_reduce" are all accepted: '_' reads as '-') of p
 * from its text VALUE, checked as the CLI checks it.  A flag takes NULL (on) or
 * 1/0/true/false/yes/no/on/off; an optional value takes NULL for its default.  String values
 * are borrowed: keep them alive while p is used.  DP_EINVAL with a one-line message on an
 * unknown name or a bad value. */
int dp_train_option_set(struct dp_train_params *p, const char *name, const char *value);
/* After every option is set: DP_EINVAL when option NAME does not apply to the run p describes
 * (--momentum with --optim adamw, --warmup without --schedule cosine, ...), with a line that
 * names the setting it needs; an option that is silently ignored would make the run differ
 * from what was asked. */
int dp_train_option_check(const struct dp_train_params *p, const char *name);
/* The options that define the run (its data, model, optimizer, schedule, batch, epochs,
 * seed, the data-parallel options that change the arithmetic or its failure modes, the
 * checkpoint and evaluation cadence), one "--name=value" or "--name" per line, as the
 * stored configuration of its checkpoints (dp_train_params.io.config): malloc'ed, NULL when out
 * of memory.  Not rendered: where and how fast this invocation runs (workers, threads,
 * pinning, progress threads, prefetch, gemm), its own stop and outputs (max-steps, out,
 * resume, overwrite, init-from, timeline) and the slowness simulations.  Paths are made
 * absolute: a resume may run from another folder. */
char *dp_train_options_render(const struct dp_train_params *p);

/* The parsers of simulate_slow and simulate_jitter (the trainer calls them;
 * exposed for the CLI and the tests).  dp_parse_simulate_slow fills
 * factor[0..world) (1 where not named); world <= 0 checks the syntax only
 * (factor may then be NULL).  A bad spec is DP_EINVAL with a one-line
 * message. */
int dp_parse_simulate_slow(const char *spec, int world, double *factor);
struct dp_jitter {
    double p, ms;              /* a stall of ms milliseconds with probability p per (rank, step) */
    double sigma;              /* compute x exp(sigma z), z ~ N(0, 1), when > 1 (0 = off) */
};
int dp_parse_simulate_jitter(const char *spec, struct dp_jitter *j);

/* The --balance plan (exposed for the tests): `units` units of a full
 * global batch apportioned to `world` ranks so that their steps end
 * together, each rank's step lasting fixed[r] / 1024 + share[r] units at
 * rate[r] (an integer throughput, 1..2^30; <= 0: not measured yet, counted
 * as the mean of the measured ones); fixed[r] (NULL: none) is rank r's
 * fixed part, the units it could compute in that time, in 1/1024 units.
 * Without fixed parts the shares are in proportion to rate.  Largest
 * remainders in integer arithmetic, every rank at least one unit when
 * units >= world (one whose fixed part alone outlasts the others' steps
 * gets just that).  Integer in, integer out: the same shares on every rank
 * and every build. */
void dp_balance_plan(const int64_t *rate, const int64_t *fixed, int world, int64_t units, int64_t *share);

/* The trainer's per-step all-gather of every rank's wait when it records
 * metrics (a run with an output folder): rank `rank` of G puts `wait` in
 * waits[rank], the call fills waits[0..G) on every rank and *last is the
 * last arriver (the smallest wait).  Exposed for `dptrain calibrate`, which
 * times the same call in its steps. */
int dp_train_gather_waits(struct dp_comm *comm, int G, int rank, double wait, double *waits, int *last);

struct dp_trainer;
/* The default --det-chunk for a global batch: a quarter of the batch, within 8..32 (and at most
 * the batch).  It depends on the batch alone, so runs at any worker count that keep the batch
 * keep the bits; docs/ddp.md "Deterministic mode" gives the trade-off. */
int64_t dp_det_chunk_auto(int64_t batch);
/* --comm-progress auto: DP_PROGRESS_CALLER when the process's `workers` x
 * `threads` compute threads fill its `cpus` with no core left for their
 * communication threads (workers x threads <= cpus < workers x threads +
 * workers), else DP_PROGRESS_THREAD (a spare core each: the reduction runs
 * beside the compute; more threads than cores: the tested thread path).
 * docs/ddp.md "Who runs the reduction" gives the measurements. */
int dp_train_progress_auto(int workers, int threads, int cpus);
/* --prefetch auto: 0 when the process's `workers` x `threads` compute
 * threads fill its `cpus` (a loader thread then has no core of its own: it
 * takes its time slices from a worker, and the batch it wrote must move to
 * the worker's core; assembling in place was faster on the 2-core VM,
 * docs/results.md "The loader thread on a full machine"), else 2. */
int dp_train_prefetch_auto(int workers, int threads, int cpus);
int dp_trainer_init(struct dp_trainer **t, const struct dp_train_params *p);
/* Trains until the epoch count (or max_steps) is reached, or a stop is requested. */
int dp_trainer_run(struct dp_trainer *t);
/* After dp_trainer_run: the step at which a requested stop (dp_train_params.io.stop) ended the
 * run, or -1 when it ran to its end. */
int64_t dp_trainer_stopped(const struct dp_trainer *t);
/* After dp_trainer_run: what the background checkpoints (--ckpt-every-steps) cost, on rank 0.
 * taken: snapshots; copy_s: the steps' time copying them; wait_s: the steps' time waiting for
 * a write still in flight; write_s, write_cpu_s: the writer thread's wall and CPU time. */
struct dp_snapshot_stats {
    int64_t taken;
    double copy_s, wait_s, write_s, write_cpu_s;
};
void dp_trainer_snapshot_stats(const struct dp_trainer *t, struct dp_snapshot_stats *s);
/* Accuracy and mean loss of the current model on a dataset (eval mode); for
 * a text model ds is NULL and the data is its validation windows (per-token
 * accuracy and loss). */
int dp_trainer_evaluate(struct dp_trainer *t, const struct dp_dataset *ds, int64_t limit,
                        double *acc, double *loss);
/* Writes a checkpoint of the current state to path (atomically). */
int dp_trainer_save(struct dp_trainer *t, const char *path);
uint64_t dp_trainer_param_hash(const struct dp_trainer *t);
/* A note about the resume for the caller to show (NULL: none), e.g. the
 * error-feedback state reset because the worker count changed. */
const char *dp_trainer_note(const struct dp_trainer *t);
const struct dp_model *dp_trainer_model(const struct dp_trainer *t);
/* A language model's validation loss per token (loss, as dp_trainer_evaluate gives it on the
 * first `limit` windows, 0: all) in bits per byte of the text its targets spell:
 * loss * tokens / bytes / ln 2, each target token counting its length in bytes (1 for byte-level
 * tokens; its tokenizer's for BPE).  Comparable across vocabularies.  NaN for other models. */
double dp_trainer_bits_per_byte(const struct dp_trainer *t, double loss, int64_t limit);
/* What the trainer did to read its data, for the user: "" for an IDX folder or .npy arrays;
 * for a CSV, an .npz or an image folder what was found and whether its arrays were made now
 * or reused from the cache folder (one line, no newline). */
const char *dp_trainer_data_note(const struct dp_trainer *t);
/* How the model is split, for the user ("" when it is not): --pp's line "pipeline: " the
 * stages, replicas, micro-batches and schedule, and each stage's layers, parameters and share
 * of the FLOPs; --tp's line "tensor: " the groups, replicas and the parameters split;
 * --zero-unit-mb's line "zero unit: " the layers run in slices (several: a newline between
 * them, none at the end). */
const char *dp_trainer_layout(const struct dp_trainer *t);
/* The most bytes of activations (forward's saved outputs and backward's scratch) worker `worker`
 * of this process held at once so far: its replica's arena's high-water mark, or, on a pipeline
 * stage, the sum over the micro-batches it holds in flight (dp_pipe_max_inflight) of theirs;
 * -1 for no such worker.  (A stage evaluates in a view of its own, given back after it.) */
int64_t dp_trainer_activation_bytes(const struct dp_trainer *t, int worker);
/* The bytes of worker `worker`'s parameter and gradient slabs resident in memory now (mincore,
 * whole pages): the whole model's twice on a plain replica; a pipeline stage's share (its span's,
 * and a tied copy); -1 for no such worker. */
int64_t dp_trainer_slab_bytes(const struct dp_trainer *t, int worker);
/* A pipeline's stages: their count S, and in *first (S + 1 entries, owned by t) stage s's first
 * layer first[s], first[S] the layer count; 0 (and *first NULL) without --pp. */
int dp_trainer_stages(const struct dp_trainer *t, const int **first);
/* The test set as the run evaluates it (normalised; n = 0 when there is none). */
const struct dp_dataset *dp_trainer_test_set(const struct dp_trainer *t);
/* Who runs this process's bucket all-reduces: DP_PROGRESS_THREAD or
 * DP_PROGRESS_CALLER (--comm-progress, auto resolved at init). */
int dp_trainer_comm_progress(const struct dp_trainer *t);
/* The batches each worker's loader prepares ahead (--prefetch, auto resolved at init). */
int dp_trainer_prefetch(const struct dp_trainer *t);
struct dp_replica *dp_trainer_replica(struct dp_trainer *t);
/* The bytes of model state worker `worker` of this process holds in memory
 * now: the resident pages of its gradient and parameter slabs (ZeRO 2 and 3
 * give theirs back), its shards and its optimizer state (dp_zero_live_bytes;
 * -1 if it cannot be measured).  Call between steps: from the on_event
 * callback of a step (rank 0's thread) for worker 0, or around a run. */
int64_t dp_trainer_live_bytes(const struct dp_trainer *t, int worker);
/* ZeRO 2 and 3: the most slab bytes a worker holds resident at once beyond
 * its shards during a step (dp_zero_inflight_bytes); 0 for other stages. */
int64_t dp_trainer_inflight_bytes(const struct dp_trainer *t);
/* ZeRO 2 and 3: worker `worker`'s struct dp_zero_counts (stage 1 with the all-gather ahead:
 * its range all-gathers; all 0 otherwise); -1 for a worker out of range. */
int dp_trainer_zero_counts(const struct dp_trainer *t, int worker, struct dp_zero_counts *c);
void dp_trainer_free(struct dp_trainer *t);

/* ---- the trainer from another language (src/train/host.c; the Python package) -------------
 * What a binding needs that it cannot reach without mirroring the structs. */
/* Sets one of the arrays of dp_train_params: which is "x", "y", "test_x" or "test_y" (a NULL
 * a, or a->data NULL: none).  The array's description is copied, its data borrowed.  DP_EINVAL
 * on another name. */
int dp_train_params_set_array(struct dp_train_params *p, const char *which, const struct dp_array *a);
/* Sets the event callback (on_event, event_arg), the stop flag (stop: an int the caller owns and
 * sets non-zero from any thread, read atomically; NULL: none) and the job's communicator with the
 * other processes (inter; NULL: one process). */
void dp_train_params_set_hooks(struct dp_train_params *p, dp_event_fn on_event, void *event_arg, void *stop,
                               struct dp_comm *inter);
/* The settings a checkpoint's header holds (batch, seed, optimizer, learning rate and schedule
 * kind), resume = path, and no model (the checkpoint's), as `dptrain eval --ckpt` takes them.
 * Its model, where asked for (each pointer may be NULL): *epoch, the epochs it has trained;
 * in_shape, its input (C, H, W); *outputs, its outputs per sample (classes, or a regression's
 * values); *regression, 1 for a regression (loss mse).  path is borrowed. */
int dp_train_params_from_ckpt(struct dp_train_params *p, const char *path, int64_t *epoch, int64_t *in_shape,
                              int64_t *outputs, int *regression);
/* The event's metrics record as one line of JSON (no newline) in buf (cap bytes): an EPOCH
 * event gives the keys metrics.jsonl's epoch record has for them ("kind": "epoch", "epoch",
 * "step", "lr", "train_loss", "train_acc", the test figures, "samples_per_s", "epoch_time_s",
 * the phases' seconds, "skipped_steps", "slowest_rank", "slowest_lag_s", the traffic), STEP
 * "kind": "step" with "step", "epoch", "loss", "lr", "samples", EVAL the "eval" record, CHECKPOINT
 * "kind": "checkpoint" with "path".  Returns the length, or DP_EINVAL when cap is too small. */
int dp_event_json(const struct dp_event *ev, char *buf, size_t cap);
/* The outputs of the trained model (rank 0's replica, eval mode) for the n samples of x,
 * normalised as the run's data was: logits (n, classes), or a regression's (n, K) values, into
 * out (cap floats).  x as train_x takes it.  Not for a language model, nor under ZeRO 3 before
 * dp_trainer_run has ended (the workers hold shards until its end gathers them whole). */
int dp_trainer_predict(struct dp_trainer *t, const struct dp_array *x, float *out, int64_t cap);
/* The floats per sample that dp_trainer_predict writes. */
int64_t dp_trainer_outputs(const struct dp_trainer *t);
/* 1 when the model is a regression (loss mse: its accuracy is a mean absolute error), else 0. */
int dp_trainer_regression(const struct dp_trainer *t);
/* dp_trainer_evaluate on arrays (x, y as train_x, train_y take them), normalised as the run's
 * data was.  With several workers the job's rank 0 evaluates alone. */
int dp_trainer_evaluate_arrays(struct dp_trainer *t, const struct dp_array *x, const struct dp_array *y,
                               double *acc, double *loss);
/* Writes the trained model's weights as safetensors, with the metadata `dptrain ckpt export`
 * writes: the model, its input shape and the run's normalisation (input_mean, input_std). */
int dp_trainer_export(struct dp_trainer *t, const char *path);
/* The model's i-th parameter or buffer (0 <= i < dp_trainer_param_count): its PyTorch name, its
 * shape (*ndim dimensions into shape[4]), and a pointer to its floats in rank 0's replica (valid
 * while t lives; NULL under ZeRO 3 before dp_trainer_run has ended: the replica holds shards).
 * DP_EINVAL past the end. */
int dp_trainer_param_count(const struct dp_trainer *t);
int dp_trainer_param_info(struct dp_trainer *t, int i, const char **name, int *ndim, int64_t *shape, float **data,
                          int *is_buffer);

/* ---- checkpoints ---------------------------------------------------------
 * Format (little-endian; docs/checkpoint.md):
 *   struct dp_ckpt_header (fixed size, with its own CRC-32)
 *   payload: params (num_params f32) | buffers (num_buffers f32) |
 *            optimizer state (optim_state_len f32)
 * The header's payload_crc covers the whole payload.
 * Optional sections may follow the payload (a file without any is the
 * format as it always was): each is a struct dp_ckpt_section and `size`
 * bytes of data.  "DPEFSTAT": the gradient compressor's error-feedback state
 * of every worker (struct dp_ckpt_ef, then workers x len f32).  A reader
 * checks every section's CRCs; unknown tags are skipped. */
#define DP_CKPT_MAGIC "DPTRCKPT"
#define DP_CKPT_VERSION 1u

struct dp_ckpt_header {
    char magic[8];             /* "DPTRCKPT" */
    uint32_t version;          /* DP_CKPT_VERSION */
    uint32_t header_size;      /* sizeof(struct dp_ckpt_header) */
    char model_spec[128];      /* NUL-terminated */
    int64_t in_shape[4];       /* per-sample input shape, unused dims 0 */
    int64_t num_params, num_buffers;
    uint64_t seed;
    int64_t step, epoch, step_in_epoch; /* position to continue from */
    int64_t batch;             /* global batch size the run used */
    uint32_t optim_kind, nesterov;
    float momentum, dampening, weight_decay, beta1, beta2, eps;
    float lr;                  /* base learning rate */
    uint32_t sched_kind;
    int64_t optim_step, optim_state_len;
    uint64_t param_hash;       /* FNV-1a 64 of params then buffers */
    uint64_t payload_size;     /* bytes after the header */
    uint32_t payload_crc;      /* CRC-32 of the payload */
    uint32_t header_crc;       /* CRC-32 of this header with header_crc = 0 */
};

/* Writes header + payload to path via a temporary file, fsync and rename, so
 * that an interrupted write never leaves a broken file at path. */
struct dp_ckpt_section {
    char tag[8];               /* e.g. "DPEFSTAT" */
    uint64_t size;             /* bytes of data after this header */
    uint32_t data_crc;         /* CRC-32 of the data */
    uint32_t header_crc;       /* CRC-32 of this header with header_crc = 0 */
};
#define DP_CKPT_EF_TAG "DPEFSTAT"
/* "DPCONFIG": dp_train_params.io.config, as given (text).  "DPMETRIC": a struct dp_ckpt_metrics,
 * the length of the run folder's metrics.jsonl when the checkpoint was written. */
#define DP_CKPT_CONFIG_TAG "DPCONFIG"
/* Section "DPMODTXT": the model's canonical text (dp_model.desc, docs/models.md), whatever
 * built it; the header's model_spec keeps its name ("cnn", "file:NAME", the caller's). */
#define DP_CKPT_MODEL_TAG "DPMODTXT"
#define DP_CKPT_METRICS_TAG "DPMETRIC"
struct dp_ckpt_metrics {
    int64_t bytes;
};
struct dp_ckpt_ef {            /* the data of a "DPEFSTAT" section starts with this */
    uint32_t kind;             /* enum dp_compress */
    uint32_t workers;          /* job ranks whose state follows, in rank order */
    int64_t len;               /* floats per worker (dp_reducer_state_len) */
};
int dp_ckpt_write(const char *path, struct dp_ckpt_header *h, const float *params,
                  const float *buffers, const float *optim_state);
/* The same, with one optional section (tag, data, size bytes) after the
 * payload (tag NULL: none). */
int dp_ckpt_write_section(const char *path, struct dp_ckpt_header *h, const float *params,
                          const float *buffers, const float *optim_state, const char *tag, const void *data,
                          uint64_t size);
/* The same written as a stream, for a writer that never holds the whole
 * payload (a ZeRO checkpoint: rank 0 writes the pieces as they come, range
 * by range).  open: h's num_params, num_buffers and optim_state_len fix the
 * payload size; put: the payload's bytes, in file order; hash: the FNV-1a 64
 * of the params and buffers put so far (the header's param_hash); close: h
 * (with param_hash) completed and written first, the optional section, the
 * rename (atomic, as dp_ckpt_write); it frees w, also on error, and must be
 * called once after a successful open.  After an error every call returns
 * it and the temporary file is gone. */
struct dp_ckpt_writer;
int dp_ckpt_writer_open(struct dp_ckpt_writer **w, const char *path, const struct dp_ckpt_header *h);
int dp_ckpt_writer_put(struct dp_ckpt_writer *w, const void *data, size_t n);
uint64_t dp_ckpt_writer_hash(const struct dp_ckpt_writer *w);
int dp_ckpt_writer_close(struct dp_ckpt_writer *w, struct dp_ckpt_header *h, const char *tag, const void *data,
                         uint64_t size);
/* A section after the payload, before close (any number, each tag once): call it once every
 * payload byte has been put. */
int dp_ckpt_writer_section(struct dp_ckpt_writer *w, const char *tag, const void *data, uint64_t size);
/* Reads and checks the whole file, and returns the data of section `tag`
 * (*data: caller frees with dp_free; NULL and *size 0 when the file has no
 * such section). */
int dp_ckpt_read_section(const char *path, const char *tag, void **data, uint64_t *size);
/* Reads and validates the header (magic, version, sizes, header CRC, file
 * size). */
int dp_ckpt_read_header(const char *path, struct dp_ckpt_header *h);
/* The model a checkpoint holds, built from its DPMODTXT section when it has one, else from
 * the header's spec (h: its header, read already). */
int dp_ckpt_build_model(const char *path, const struct dp_ckpt_header *h, struct dp_model **m);
/* The checkpoint's model text (its DPMODTXT section) into *text (dp_free it), NULL when the
 * model came from a spec. */
int dp_ckpt_model_text(const char *path, char **text);
/* 1 when the checkpoint's model reads token ids (a language model); 0 also on a read error. */
int dp_ckpt_reads_tokens(const char *path, const struct dp_ckpt_header *h);
/* Reads and validates the whole checkpoint; the payload is checked against
 * payload_crc.  *payload (caller frees with dp_free) holds params, buffers,
 * optimizer state in that order. */
int dp_ckpt_read(const char *path, struct dp_ckpt_header *h, float **payload);
/* Reads a checkpoint without holding its payload (a resume: each worker
 * takes its own pieces of the state).  open: the header and every check of
 * dp_ckpt_read (the payload's CRC in one pass of 1 MiB blocks, the
 * sections), and also param_hash against the params and buffers; these are
 * copied into params and buffers as they pass (either may be NULL).  read:
 * count floats of the payload from float `at` (0 = the first parameter)
 * into dst, by pread.  close frees r (NULL: nothing). */
struct dp_ckpt_reader;
int dp_ckpt_reader_open(struct dp_ckpt_reader **r, const char *path, struct dp_ckpt_header *h, float *params,
                        float *buffers);
int dp_ckpt_reader_read(struct dp_ckpt_reader *r, int64_t at, int64_t count, float *dst);
void dp_ckpt_reader_close(struct dp_ckpt_reader *r);
/* Validation of an in-memory image (used by the fuzzer). */
int dp_ckpt_parse(const uint8_t *buf, size_t len, struct dp_ckpt_header *h, const float **payload);

/* ---- safetensors ----------------------------------------------------------
 * Tensors named and laid out as in PyTorch's state_dict. */
int dp_safetensors_save(const char *path, const struct dp_model *m, const struct dp_replica *r);
/* The same, with more "__metadata__" entries (string keys and values without
 * quotes, backslashes or control characters).  Every file's metadata has
 * "format": "pt", "dptrain_model": the model spec and "input_shape": "C,H,W";
 * dptrain's export adds the input preprocessing (docs/checkpoint.md).  The
 * file is replaced atomically, like a checkpoint. */
struct dp_st_meta {
    const char *key, *value;
};
int dp_safetensors_save_meta(const char *path, const struct dp_model *m, const struct dp_replica *r,
                             const struct dp_st_meta *meta, int nmeta);
/* Loads every parameter and buffer of m from the file; names, dtypes (F32)
 * and shapes must match.  Extra tensors in the file are an error.  On error
 * the replica's contents are unspecified (callers discard it). */
int dp_safetensors_load(const char *path, const struct dp_model *m, struct dp_replica *r);
/* The "__metadata__" value of `key` (e.g. "dptrain_model", "input_shape") into val (cap
 * bytes); DP_ENOENT when the file has no such entry. */
int dp_safetensors_meta(const char *path, const char *key, char *val, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
