/*
 * dp/ddp.h — the gradient reducer: buckets over the flat gradient slab,
 * all-reduced while backward is still running; gradient compression; ZeRO;
 * backup workers across processes; and dp_sync (at the end), the one object
 * a synchronous trainer's step talks to, which owns the reducer, ZeRO and
 * the optimizer of one worker.
 *
 * The rule (docs/architecture.md §2):
 *   - Buckets are contiguous ranges of the flat gradient slab made of whole
 *     top-level layers, planned from the END of the slab, because backward
 *     finishes layers in reverse order.  The first bucket (the output side)
 *     is small so that communication starts early; the others are capped.
 *   - A bucket's all-reduce starts the moment its last gradient is final
 *     (the model's grad_ready callback reports the layer holding the bucket's
 *     lowest offset), on the communicator's progress thread, while the
 *     worker's compute thread goes on with backward.
 *   - The all-reduce SUMS.  Each worker's gradient is its per-sample sum
 *     weighted by 1 / (samples in the global batch) (or the caller scales the
 *     reduced sum by it), so the result is the gradient of the mean loss over
 *     the global batch whatever the split.  Every rank plans the same buckets from
 *     the same model, so bucket k is the k-th collective on every rank.
 *
 *     struct dp_reducer r;
 *     dp_reducer_init(&r, model, comm, grads, &params);
 *     pass.grad_ready = dp_reducer_grad_ready; pass.grad_ready_arg = &r;
 *     dp_reducer_begin(&r);
 *     dp_model_run(model, replica, &batch, &pass);     // buckets start here
 *     dp_reducer_finish(&r);                            // waits for the rest
 */
#ifndef DP_DDP_H
#define DP_DDP_H

#include "comm.h"
#include "nn.h"
#include "optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Gradient compression (docs/ddp.md "Gradient compression"; the math and
 * the wire format of each scheme are beside its code in src/ddp/compress.c).
 * With one worker nothing is communicated, so nothing is compressed. */
enum dp_compress {
    DP_COMPRESS_NONE = 0,
    DP_COMPRESS_BF16,     /* bf16 all-reduce (fp32 sums inside the comm), per bucket, overlapped */
    DP_COMPRESS_FP16,     /* fp16 + a power-of-two scale per rank and bucket, all-gathered, fp32 sum */
    DP_COMPRESS_POWERSGD, /* rank-r PowerSGD with error feedback, after backward (not overlapped) */
    DP_COMPRESS_TOPK,     /* top-k of |u + e| per tensor (u: local momentum), (index, value) all-gathered */
    DP_COMPRESS_SIGN,     /* EF-signSGD on the local momentum: 1 bit per element + one scale per tensor */
    DP_COMPRESS_COUNT
};
struct dp_compress_params {
    enum dp_compress kind;
    int rank;                  /* powersgd: the rank r (>= 1) */
    double fraction;           /* topk: the fraction kept per tensor (1-D tensors go whole), in (0, 1] */
    int64_t powersgd_start;    /* powersgd: plain all-reduce before this optimizer step */
    uint64_t seed;             /* powersgd: Q's initial values, from (seed, DP_RNG_POWERSGD, tensor) */
    int compress_all;          /* powersgd, for tests: compress every matrix, even where
                                  r (n + m) is not 2x smaller than n m */
    float momentum;            /* topk, sign: the optimizer's SGD momentum (set by the trainer;
                                  0 for AdamW, Nesterov or dampening): compress the local
                                  momentum (compress.c, lm_begin) */
    int no_ef;                 /* topk, sign, powersgd: no error feedback (--no-error-feedback,
                                  to measure what it buys): each step compresses g alone; the
                                  residual then holds only what that step left out */
};
/* "none", "bf16", "fp16", "powersgd", "topk", "sign" ("unknown" out of range). */
const char *dp_compress_name(enum dp_compress k);
/* Parses "none|bf16|fp16|powersgd:RANK|topk:FRACTION|sign" into p->kind,
 * p->rank, p->fraction (other fields untouched).  DP_EINVAL with one line for
 * a bad spec. */
int dp_compress_parse(const char *spec, struct dp_compress_params *p);
/* The spec back as text ("topk:0.01"), into buf. */
void dp_compress_format(const struct dp_compress_params *p, char *buf, size_t len);

struct dp_compressor; /* src/ddp/compress.c: per-bucket wire buffers, error-feedback state */

struct dp_reducer_params {
    size_t bucket_cap_bytes;   /* 0 (the default) = auto: a quarter of the gradient, at least
                                  1 MiB and at most 25 MiB (PyTorch DDP's fixed cap), so that a
                                  small model still gets several buckets to overlap on slow links */
    size_t first_bucket_bytes; /* default 1 MiB */
    size_t unit_bytes;         /* --zero-unit-mb: no bucket larger (both caps lowered to it), but a
                                  layer's slices (dp_layer.slice_rows, dp_model_set_unit), each a
                                  bucket of its own, its tail another; 0: none */
    int overlap;               /* 1: start buckets during backward; 0: all after it */
    enum dp_comm_algo algo;        /* all-reduce algorithm (AUTO) */
    struct dp_compress_params compress; /* gradient compression (kind NONE: off) */
    int scatter;               /* ZeRO: instead of the buckets, one reduce-scatter of the whole slab
                                  after backward (dp_comm_reduce_scatter: rank r's block
                                  dp_comm_split(n, P, r) holds the sum, the rest is scratch);
                                  not with compression */
    int shard;                 /* ZeRO stages 2, 3 (and 1 with --zero-reduce scatter and the gather
                                  ahead): each bucket is reduce-scattered (rank r's block
                                  dp_comm_split(count, P, r) of the bucket holds the sum) as soon as
                                  it is ready, and done(done_arg, k), if set, is called once bucket k
                                  has completed (from grad_ready's polling or from finish) */
    struct dp_span span;       /* a pipeline stage's layers: the buckets cover its parameters only, the
                                  slab given to dp_reducer_init starts at span.param_off and
                                  grad_ready's offsets are the model's (zeroed: the whole model) */
};
struct dp_reducer_params dp_reducer_default_params(void);

struct dp_bucket {
    int64_t off, count;        /* range of the gradient slab (floats) */
    int64_t nlayers;           /* top-level layers in it */
    struct dp_comm_req *req;   /* in flight, or NULL */
    double t_ready, t_done;    /* when it was started / found complete (dp_time) */
    double t_c0, t_c1;         /* compression: when its compress ran (0: none) */
    double t_d0, t_d1;         /* and its decompress */
    struct dp_reducer *owner;  /* the reducer it belongs to (its post hook) */
};

struct dp_reducer {
    struct dp_reducer_params p;
    struct dp_comm *comm;
    float *grads;
    int64_t base;              /* p.span.param_off: grad_ready's offsets less this index grads */
    struct dp_bucket *b;       /* b[0] is the output side (highest offsets) */
    int nb;
    int next;                  /* next bucket to start */
    int rc;                    /* first error of a start inside the callback */
    void (*done)(void *arg, int k); /* p.shard: bucket k is reduced (dp_zero_bucket_done) */
    void *done_arg;
    /* (optional, plain fp32 all-reduce only) post(post_arg, off, n): the
     * floats [off, off + n) of the slab are reduced in every replica, and this
     * worker's thread was the one that summed them: called once per range
     * across the workers, before any worker's bucket completes
     * (dp_comm_iallreduce_post; the trainer's non-finite check).  A comm that
     * cannot do it fails the bucket with DP_ENOTSUP. */
    dp_comm_post_fn post;
    void *post_arg;
    int64_t shard_done;        /* p.shard: floats of this step's buckets reduced (and given back) */
    int64_t shard_hw;          /* p.shard: the most gradient floats backward had written and not yet
                                  seen reduced at a layer's end, since init: the gradient in flight */
    char err[256];
    /* timing of the last step */
    double t_begin, t_backward_end, t_end;
    double comm_total, comm_exposed;
    /* compression (see struct dp_compress_params) */
    struct dp_compressor *cz;  /* NULL: plain fp32 all-reduce */
    int64_t step;              /* the optimizer step being reduced: set by the caller before
                                  dp_reducer_begin (powersgd_start compares with it) */
    float grad_unit;           /* what the caller multiplies the reduced slab by to get the
                                  gradient (1, the default, when it already is; 1/N with
                                  accumulation): residuals are kept in gradient units, so a
                                  step of another size does not misread them.  Set before
                                  dp_reducer_begin. */
    /* the last step's accounting: bytes this worker sent and received on the
     * wire (the collectives' ring/rhd volume: all-reduce of B bytes moves
     * 2 (P-1)/P B each way, all-gather of P blocks totalling B bytes
     * (P-1)/P B), what a plain fp32 all-reduce would have moved, and the
     * seconds spent compressing and decompressing */
    double bytes_sent, bytes_recv, bytes_fp32, t_compress, t_decompress;
};

int dp_reducer_init(struct dp_reducer *r, const struct dp_model *m, struct dp_comm *comm, float *grads,
                    const struct dp_reducer_params *p);
void dp_reducer_free(struct dp_reducer *r);
/* Before each backward that must communicate. */
void dp_reducer_begin(struct dp_reducer *r);
/* The model's grad_ready callback (arg = the reducer).  With p.shard it also
 * waits for every started bucket but the last, so that backward holds at
 * most two buckets of unreduced gradient (src/ddp/reducer.c). */
void dp_reducer_grad_ready(void *arg, int64_t offset, int64_t count);
/* Starts whatever has not started yet and waits for every bucket.  Records
 * the communication time in total (the time the progress thread was busy
 * with buckets, completions polled between layers) and the part not hidden
 * behind backward (from the end of backward to the last completion). */
int dp_reducer_finish(struct dp_reducer *r);

/* Backup workers across processes (src/ddp/backup_star.c has the protocol):
 * each step takes the gradients of the first G - b ranks to arrive, through
 * rank 0, with point-to-point messages on c (one worker per process).
 *     dp_backup_star_init(&bs, comm, num_params, b, positions, timeout_s);
 *     dp_backup_star_start(bs, first_step);        // rank 0: the collector thread
 *     each step: g = this rank's gradient SUM over its n samples (loss scale 1);
 *     dp_backup_star_step(bs, step, g, n, &n_acc, &bad, accepted);
 *         // g = the mean over the accepted samples x positions; accepted[r] (G)
 *     dp_backup_star_free(bs);                      // after the last step
 * Every rank gets the same update, n_acc and flags.  Up to DP_BACKUP_DEPTH
 * steps may be open between the fastest and the slowest rank. */
#define DP_BACKUP_DEPTH 4
struct dp_backup_star;
int dp_backup_star_init(struct dp_backup_star **bs, struct dp_comm *c, int64_t num_params, int backup,
                        double positions, double timeout_s);
int dp_backup_star_start(struct dp_backup_star *bs, int64_t first_step);
int dp_backup_star_step(struct dp_backup_star *bs, int64_t step, float *g, double n_local, double *n_acc,
                        int *bad, unsigned char *accepted);
/* Fails rank 0's waits and stops its collector (any thread; idempotent). */
void dp_backup_star_abort(struct dp_backup_star *bs, const char *why);
void dp_backup_star_free(struct dp_backup_star *bs);

/* Backup workers on the threads of one process (src/ddp/backup_slot.c has
 * the protocol): the same step as the star's, through a slot in shared
 * memory that the P workers meet in (one per process, made by its caller).
 *     dp_backup_slot_init(&bs, P, base, num_params, b, positions, timeout_s);
 *     dp_backup_slot_start(bs, first_step);        // before the workers start
 *     each step, worker r (job rank base + r):
 *     dp_backup_slot_step(bs, r, comm, step, g, n, &n_acc, &bad, accepted);
 *         // g = the mean over the accepted samples x positions; accepted[r] (P)
 *     dp_backup_slot_free(bs);                      // after the workers
 * dp_backup_slot_abort (any thread; idempotent) fails every wait with
 * DP_ECANCELED; a wait longer than timeout_s (0: none) names the ranks that
 * did not arrive and aborts comm. */
struct dp_backup_slot;
int dp_backup_slot_init(struct dp_backup_slot **bs, int P, int base, int64_t num_params, int backup,
                        double positions, double timeout_s);
void dp_backup_slot_start(struct dp_backup_slot *bs, int64_t first_step);
int dp_backup_slot_step(struct dp_backup_slot *bs, int rank, struct dp_comm *comm, int64_t step, float *g,
                        double n_local, double *n_acc, int *bad, unsigned char *accepted);
void dp_backup_slot_abort(struct dp_backup_slot *bs, const char *why);
void dp_backup_slot_free(struct dp_backup_slot *bs);

/* Error-feedback state (per worker, kept across steps: the residuals of
 * topk, sign and powersgd, and powersgd's warm-started Q), for checkpoints:
 * its length in floats (0 when the scheme keeps none), a copy out, and a
 * restore.  dp_reducer_reset_state zeroes the residuals and re-draws Q. */
int64_t dp_reducer_state_len(const struct dp_reducer *r);
void dp_reducer_state_get(const struct dp_reducer *r, float *out);
void dp_reducer_state_set(struct dp_reducer *r, const float *in);
void dp_reducer_reset_state(struct dp_reducer *r);
/* The residual e over the gradient slab (num_params floats), or NULL when
 * the scheme keeps none (tests check sum(updates) + e = sum(gradients)). */
const float *dp_reducer_residual(const struct dp_reducer *r);

/* ---- ZeRO: sharded optimizer state, gradients, parameters (src/ddp/zero.c;
 * docs/ddp.md "ZeRO") ----
 * Stage 1.  Worker r of G owns the contiguous shard [off, off + len) =
 * dp_comm_split(n, G, r) of the flat parameter slab, and keeps the optimizer
 * state (momentum; AdamW's m and v) of that shard only: the optimizer is
 * initialised over len floats, not n.  After the reduction (the shard of the
 * gradient slab holds the global-batch gradient: an all-reduce or a
 * reduce-scatter of the slab both give it), every worker updates its shard,
 * then the parameters are all-gathered (dp_comm_allgather over the whole slab
 * uses exactly this partition), so every replica holds the same full
 * parameters again.  The update is elementwise, so shard by shard it is the
 * same bits as the whole-slab update on the same gradient.
 *
 * Stages 2 and 3 (G > 1; with one worker they are stage 1): the shard is
 * bucket-aligned.  Worker r's piece of bucket k is its block
 * dp_comm_split(count_k, G, r) at off_k (what a reduce-scatter of the bucket
 * leaves it), and its pieces are stored contiguously, in bucket order, as
 * the shard of len floats: gshard (the reduced gradient) and, stage 3,
 * pshard (the master parameters).  The reducer (p.shard) reduce-scatters
 * each bucket as soon as backward has finished it and calls
 * dp_zero_bucket_done, which keeps the piece and gives the bucket's
 * gradient pages back to the kernel.  Stage 2 all-gathers every bucket after
 * the update; stage 3 keeps no full parameters: dp_zero_layer_begin (the
 * model's layer_begin hook) gathers a bucket's parameters before its first
 * layer runs, prefetches the next bucket, and gives the previous one back.
 *
 *     struct dp_zero z;
 *     dp_zero_init(&z, comm, n, stage, &optim_params);    // stage 1: z.off, z.len, z.parts
 *     dp_zero_plan(&z, red.b, red.nb, params, grads);     // stages 2, 3: the pieces, z.len
 *     dp_optim_init(&opt, &optim_params, z.len);
 *     each step, after the reduction:
 *     dp_zero_sumsq(&z, g, &ss);                     // ||g||^2 of the global gradient
 *     dp_zero_step(&z, &opt, params, g, lr, clip, ss); // shard update + all-gather
 *
 * Stage 0 is off (dp_zero_init sets off 0, len n and never communicates). */
struct dp_zero_piece {
    int64_t roff, rcount;      /* the range (bucket) of the slab it is cut from */
    int64_t off, len;          /* this worker's block of it, in slab offsets */
    int64_t soff;              /* where it starts in the shard (gshard, pshard) */
};
struct dp_zero {
    int stage;                 /* 0 (off) .. 3 */
    int sharded;               /* stage 2 or 3 with G > 1: bucket-aligned pieces, the gradient in gshard */
    int ahead;                 /* stage 1 with G > 1 and --zero-gather ahead (set before dp_zero_plan):
                                  bucket-aligned pieces, the all-gather left in flight for the next
                                  forward (src/ddp/zero.c "Ahead") */
    struct dp_comm *comm;
    int64_t n;                 /* parameters in the slab */
    int64_t off, len;          /* this worker's shard: stage 1 the slab's [off, off + len);
                                  sharded: len floats of pieces (off -1) */
    int parts;                 /* optimizer state slabs of the layout: 0, 1 (momentum), 2 (AdamW m, v) */
    struct dp_zero_piece *piece; /* (npieces): one for stage 0, 1; one per bucket when sharded */
    int npieces;
    float *gshard, *pshard;    /* sharded: the reduced gradient; stage 3: the master parameters */
    float *params, *grads;     /* the replica's slabs (dp_zero_plan) */
    struct dp_comm_req **greq; /* stage 3, ahead: bucket k's parameter all-gather in flight */
    unsigned char *have;       /* stage 3: bucket k's parameters are in the slab */
    int cur;                   /* stage 3: the bucket whose layers run (-1: none) */
    int xcur;                  /* stage 3: the bucket held for the running layer's tied range (-1: none) */
    int keep;                  /* stage 3: bucket 1, kept from forward for backward, which needs it
                                  right after bucket 0 (-1: none; dp_zero_layer_begin) */
    unsigned char *gone;       /* stage 3: per 2 MiB unit of the parameter slab, given back in this
                                  pass (release_range) */
    int64_t gathers;           /* stage 3: bucket all-gathers started, since dp_zero_plan */
    int64_t refaults;          /* stage 3: units given back and gathered into again in the same pass
                                  (each a fault of a zeroed huge page), since dp_zero_plan */
    int64_t held_hw;           /* stage 3: the most parameter floats held at once within a pass
                                  (ranges gathered or being gathered, after each layer_begin) */
    uintptr_t grel;            /* the lowest address of the gradient slab given back in this step */
    int padded;                /* DP_REPLICA_LAZY_* of the slabs: whole 2 MiB units (dp_slab_map), so
                                  releasing a whole slab gives back its last unit too */
    int accumulate;            /* dp_zero_bucket_done adds into gshard (a micro-batch after the first) */
    double t_g0, t_g1;         /* the last step's all-gather (dp_time) */
};

/* What a sharded worker's steps cost in memory traffic, since init (dp_trainer_zero_counts). */
struct dp_zero_counts {
    int64_t gathers, refaults; /* dp_zero.gathers, .refaults */
    int64_t grad_hw_bytes;     /* 4 x dp_reducer.shard_hw */
    int64_t param_hw_bytes;    /* 4 x dp_zero.held_hw */
};
int dp_zero_init(struct dp_zero *z, struct dp_comm *comm, int64_t n, int stage, const struct dp_optim_params *op);
/* Stages 2 and 3 with G > 1: the pieces from the reducer's buckets (every
 * rank plans the same), gshard (and pshard) allocated, and the whole
 * gradient slab given back zeroed.  Stage 1 with `ahead`: the pieces only.
 * Records the slabs for the calls below.  Other stages: records the slabs
 * only (and clears `ahead`). */
int dp_zero_plan(struct dp_zero *z, const struct dp_bucket *b, int nb, float *params, float *grads);
void dp_zero_free(struct dp_zero *z);
/* The reducer's bucket-done callback (arg = z): after bucket k's
 * reduce-scatter, copies this worker's block to gshard (adds it with
 * z->accumulate set: the micro-batches of one step); the bucket's range
 * of the gradient slab reads as zeros afterwards, and every whole 2 MiB unit
 * of the slab above the bucket's offset is given back (buckets complete in
 * order, from the top; src/ddp/zero.c). */
void dp_zero_bucket_done(void *arg, int k);
/* Deterministic mode (the whole reduced gradient g in the slab): its pieces
 * into gshard, and the slab released.  No-op unless sharded. */
void dp_zero_take_grad(struct dp_zero *z, float *g);
/* *sumsq = the sum over the whole slab of g^2, in double: each worker sums its
 * shard, one all-reduce of one double adds the G partial sums (so its bits
 * depend on G; a NaN or Inf anywhere makes it non-finite on every worker,
 * which is also the step's non-finite check).  Collective. */
int dp_zero_sumsq(struct dp_zero *z, const float *g, double *sumsq);
/* The shard update: clip_norm > 0 scales the shard gradient by
 * coef = clip_norm / (sqrt(sumsq) + 1e-6) when coef < 1 (dp_clip_grad_norm's
 * rule, with the norm from dp_zero_sumsq), then dp_optim_step piece by piece
 * (o initialised over z->len; one o->step per call), then the all-gather of
 * params (stage 1: bucket by bucket, left in flight with `ahead`, else the
 * slab; stage 2: bucket by bucket; stage 3: none, the update went to
 * pshard).  Collective. */
int dp_zero_step(struct dp_zero *z, struct dp_optim *o, float *params, float *g, float lr, double clip_norm,
                 double sumsq);
/* Stage 1 ahead: waits for the all-gathers still in flight, so the slab
 * holds the full parameters (a no-op otherwise).  dp_zero_step,
 * dp_zero_materialize, dp_zero_gather_params and dp_zero_layer_begin in
 * backward call it; whatever else reads the parameters after a step and
 * before the next forward must. */
int dp_zero_settle(struct dp_zero *z);
/* Stage 3 (no-ops otherwise, but for dp_zero_settle's waits).  dp_zero_shard_init: this worker's pieces of
 * the initial parameters into pshard, copied from `whole` (a full slab,
 * equal on every rank: a checkpoint, --init-from) or, with whole NULL, drawn
 * from the seed piece by piece (dp_model_init_slice): no whole slab is built.
 * dp_zero_materialize: every bucket gathered, so the slab holds the full
 * parameters (deterministic mode's step); collective.
 * dp_zero_gather_params: every bucket gathered in turn; with keep, the slab
 * holds the full parameters after (checkpoints, the run's result), without,
 * each range is given back before the next is gathered; hash, if not NULL,
 * continues dp_fnv1a64 over the slab's bytes in order (any stage: the slab
 * itself when it is whole); collective.
 * dp_zero_release_params: waits for gathers in flight and gives the whole
 * parameter slab back (pshard keeps the pieces).
 * dp_zero_layer_begin: the model's layer_begin hook (arg = z; see
 * dp_pass), collective in the layers' order; stage 1 ahead: waits for the
 * layer's ranges in forward. */
int dp_zero_shard_init(struct dp_zero *z, const struct dp_model *m, uint64_t seed, const float *whole);
int dp_zero_materialize(struct dp_zero *z);
int dp_zero_gather_params(struct dp_zero *z, int keep, uint64_t *hash);
/* Stage 3: 1 when every range is in the slab (gathered and kept, none in flight). */
int dp_zero_params_whole(const struct dp_zero *z);
int dp_zero_release_params(struct dp_zero *z);
int dp_zero_layer_begin(void *arg, int phase, int layer, const struct dp_layer *l);
/* Checkpoints keep today's whole-slab layout (parts slabs of n floats),
 * written from the shards (src/train/checkpointing.c zero_stream).
 * dp_zero_piece_data: piece i's floats in this worker's memory, part k of
 * its optimizer state, or with k = -1 its stage-3 parameters (pshard); a
 * resume reads each piece into it (load_checkpoint). */
const float *dp_zero_piece_data(const struct dp_zero *z, const struct dp_optim *o, int i, int k);
/* Bytes of [p, p + bytes) resident in memory (mincore; whole pages), or -1. */
int64_t dp_resident_bytes(const void *p, size_t bytes);
/* The worker's live bytes of model state: the resident pages of its
 * gradient and parameter slabs, and of gshard, plus pshard and the optimizer state
 * (-1 if mincore fails).  After dp_zero_plan. */
int64_t dp_zero_live_bytes(const struct dp_zero *z, const struct dp_optim *o);
/* The gradient shard's pages given back (it reads as zeros): the run is over. */
void dp_zero_drop_grad_shard(struct dp_zero *z);
/* Sharded stages: the most bytes of the slabs resident at once during a
 * step, beyond the shards (the ranges in flight; src/ddp/zero.c); else 0. */
int64_t dp_zero_inflight_bytes(const struct dp_zero *z);
/* Its rule, from `pair`, the floats of the largest two adjacent ranges (buckets): stage 2 holds
 * their gradients (one bucket's whole gradient waits for its reduce-scatter while the next is
 * written), stage 3 also their gathered parameters and two slab units.  Also the plan's
 * (dp_plan_result.mem_inflight). */
static inline int64_t dp_zero_inflight_of_pair(int stage, int64_t pair) {
    const int64_t b = (int64_t)sizeof(float) * pair;
    return stage == 3 ? 2 * b + 2 * (int64_t)DP_SLAB_UNIT : b;
}

/* ---- dp_sync: one worker's synchronisation of a step (src/ddp/sync.c) ----
 * The one object the synchronous trainer talks to.  It owns the worker's
 * reducer (buckets, overlap, compression), its ZeRO state and its optimizer
 * (over the whole slab, or with ZeRO over this worker's shard), and, with
 * `deterministic`, the fixed-point accumulator of the deterministic step.
 * One optimizer step of nmicro micro-batches (or deterministic chunks):
 *
 *     dp_sync_step_begin(&s, step);                 // the gradient slab zeroed
 *     for each micro-batch k (each chunk, deterministic):
 *         reducing = dp_sync_micro_begin(&s, &pass, k, nmicro, n_before, n_batch);
 *                                                   // grad_ready / layer_begin hooks, loss scale
 *         rc = dp_model_run(model, replica, &batch, &pass);
 *         rc = dp_sync_micro_end(&s, &pass, reducing, rc);
 *         if (reducing) rc = dp_sync_finish(&s, k == nmicro - 1);   // the reduction's end
 *     deterministic: dp_sync_finish(&s, 1);         // the accumulators' one all-reduce
 *     dp_sync_mean(&s, n_total);                    // sum -> mean over the global batch
 *     dp_sync_check(&s, &bad);                      // every replica takes the same decision
 *     dp_sync_update(&s, lr, clip_norm);            // [clip] -> optimizer (ZeRO: shard + gather)
 *
 * Then, before anything else reads the parameters: dp_sync_settle (ZeRO 1's
 * gather ahead), or dp_sync_gather (every range, for hashes and checkpoints;
 * ZeRO 3 holds no whole parameters between passes), dp_sync_release after.
 * What the reductions cost accumulates in `stats` until dp_sync_stats_take. */
struct dp_sync_params {
    struct dp_reducer_params reducer; /* buckets, overlap, algorithm, compression (scatter, shard: set by init) */
    struct dp_optim_params optim;
    int zero;                  /* ZeRO stage 0..3 */
    int zero_scatter;          /* stage 1: reduce-scatter instead of all-reduce (--zero-reduce scatter) */
    int zero_ahead;            /* stage 1 with G > 1: the all-gather left in flight (--zero-gather ahead) */
    int lazy;                  /* DP_REPLICA_LAZY_* the replica's slabs were mapped with */
    int deterministic;         /* fixed-point sums per chunk, one all-reduce of doubles per step */
    double positions;          /* loss terms per sample (1; T for a language model): N = samples x positions */
    struct dp_span span;       /* a pipeline stage: its layers' parameters only are reduced, checked and
                                  updated (params, grads and n below are that range; ZeRO 0 and 1, no
                                  compression); zeroed: the whole model */
    /* A pipeline stage, which holds its span's parameters only: called by dp_sync_settle (keep
     * -1, hash NULL: what is held made current) and dp_sync_gather (keep 0 or 1), on every
     * worker, to pass the stages' spans (the stages' assembly), fold the whole slab into *hash
     * (hash not NULL) and keep it only with keep 1; NULL: none */
    int (*whole)(void *arg, int keep, uint64_t *hash);
    void *whole_arg;
};
struct dp_sync_params dp_sync_default_params(void);

/* What the reductions cost, summed over steps (dp_sync_stats_take reads and
 * zeroes it): seconds of communication in total and not hidden behind
 * backward, the bytes on the wire and those a plain fp32 all-reduce would
 * have moved, the compression's seconds, and the optimizer steps that
 * reduced (the bytes are per such step). */
struct dp_sync_stats {
    double t_comm, t_exposed;
    double bytes_sent, bytes_recv, bytes_fp32;
    double t_compress, t_decompress;
    int64_t reduce_steps;
};

struct dp_sync {
    struct dp_sync_params p;
    struct dp_reducer red;
    struct dp_zero zero;
    struct dp_optim opt;       /* over zero.len floats */
    struct dp_comm *comm;
    const struct dp_model *m;
    float *params, *grads;     /* the replica's slabs (n floats each) */
    float *buffers;            /* ... and its buffers (BatchNorm's running statistics) */
    int64_t n;
    int64_t base;              /* the slab offset of params[0] (p.span.param_off; 0: the whole model) */
    int G;                     /* workers in the job */
    int64_t step;              /* the optimizer step being taken (dp_sync_step_begin) */
    int folded;                /* the 1/N of the mean went into the loss scale (one micro-batch) */
    double sumsq;              /* ZeRO: ||g||^2 from dp_sync_check, for the clipping of dp_sync_update */
    double *acc;               /* deterministic: fixed-point gradient sums (n) */
    double *stat_acc;          /* deterministic with BatchNorm: the chunks' statistics in fixed
                                  point (num_buffers; dp_pass.stat_acc), all-reduced by finish */
    int64_t det_done;          /* deterministic: floats of this chunk converted by its grad_ready */
    int det_first;             /* deterministic: the chunk in hand is this worker's first of the step */
    int det_mean_bad;          /* deterministic: dp_sync_mean's gradient has a non-finite value */
    int det_tiles;             /* deterministic: backward's ranges were seen to tile the slab (then a
                                  step's first chunk stores into acc, which needs no zeroing) */
    int det_bad;               /* deterministic: a chunk's gradient did not fit fixed point */
    double t_gather0, t_gather1; /* the last update's all-gather (ZeRO; equal when none) */
    struct dp_sync_stats stats; /* since the last dp_sync_stats_take */
    struct dp_sync_stats last;  /* the last reduction's bytes and compression seconds */
};

/* Everything for one worker of comm's world over replica r's slabs (kept
 * by reference); model m plans the buckets.  A NULL-safe dp_sync_free
 * releases it. */
int dp_sync_init(struct dp_sync *s, const struct dp_model *m, struct dp_comm *comm, struct dp_replica *r,
                 const struct dp_sync_params *p);
void dp_sync_free(struct dp_sync *s);
/* The step begins: the gradient slab is zeroed (ZeRO 2, 3: the last
 * reduction gave it back zeroed); deterministic: the accumulator zeroed and,
 * ZeRO 3, the whole parameters gathered for the chunks (collective). */
int dp_sync_step_begin(struct dp_sync *s, int64_t step);
/* Before micro-batch k of nmicro (n_before samples of the global batch in
 * the ones before it, n_batch in it): installs the pass's hooks and returns
 * 1 if this micro-batch's backward reduces (then dp_sync_finish follows). */
int dp_sync_micro_begin(struct dp_sync *s, struct dp_pass *pass, int64_t k, int64_t nmicro, double n_before,
                        double n_batch);
/* After the run (rc: its result): what the hooks hold released; on an error
 * nothing left in flight and that error's message kept.  Deterministic: the
 * chunk's gradient converted (DP_ENONFINITE when it cannot be). */
int dp_sync_micro_end(struct dp_sync *s, const struct dp_pass *pass, int reducing, int rc);
/* Waits for the reduction and adds its cost to the stats; last_micro: the
 * step's last reduction (counted in reduce_steps).  Deterministic: the one
 * all-reduce of the fixed-point sums, then BatchNorm's (the running
 * statistics move once per step, alike on every replica).  Collective. */
int dp_sync_finish(struct dp_sync *s, int last_micro);
/* The reduced sum -> the mean over the global batch of n_total samples
 * (x positions), unless the 1/N went into the loss scale already. */
void dp_sync_mean(struct dp_sync *s, double n_total);
/* *bad = 1 when the reduced gradient is not finite, on every worker alike
 * (ZeRO: from ||g||^2, which the clipping then uses; collective;
 * deterministic: dp_sync_mean's pass answered it, call it after that). */
int dp_sync_check(struct dp_sync *s, int *bad);
/* [clip the global norm to clip_norm] -> the optimizer step at lr; ZeRO:
 * the shard's update and the parameters' all-gather.  Collective with ZeRO. */
int dp_sync_update(struct dp_sync *s, float lr, double clip_norm);
/* ZeRO 1 ahead: waits for the gather in flight (a no-op otherwise). */
int dp_sync_settle(struct dp_sync *s);
/* A pipeline stage (p.whole): from the optimizer step to the next dp_sync_settle or
 * dp_sync_gather, the parameters outside the span are not current. */
/* 1 when this worker holds no whole parameters between passes (ZeRO 3 with
 * G > 1): passes gather layer by layer (dp_sync_eval_hooks), and whatever
 * reads the slab goes through dp_sync_gather. */
int dp_sync_sharded_params(const struct dp_sync *s);
/* 1 when the slab holds the whole parameters now: not sharded, or every range gathered and
 * kept (dp_sync_gather with keep, as at the run's end on worker 0). */
int dp_sync_params_whole(const struct dp_sync *s);
/* 1 when this worker does not hold the whole parameters between dp_sync_gather(keep) calls
 * (sharded, or a pipeline stage: p.whole): whatever reads the whole slab goes
 * through dp_sync_gather, with a hash where it needs one. */
int dp_sync_params_partial(const struct dp_sync *s);
/* A forward-only pass's hooks (evaluation): ZeRO 3's layer gathers. */
void dp_sync_eval_hooks(struct dp_sync *s, struct dp_pass *pass);
/* dp_zero_gather_params, dp_zero_release_params, dp_zero_drop_grad_shard,
 * dp_zero_shard_init on the sync's ZeRO state (dp/ddp.h above). */
int dp_sync_gather(struct dp_sync *s, int keep, uint64_t *hash);
int dp_sync_release(struct dp_sync *s);
void dp_sync_drop_grads(struct dp_sync *s);
int dp_sync_shard_init(struct dp_sync *s, const struct dp_model *m, uint64_t seed, const float *whole);
/* The stats since the last take, and zeroed. */
struct dp_sync_stats dp_sync_stats_take(struct dp_sync *s);
/* Checkpoint state.  The file keeps the whole-slab layout: the optimizer
 * state is dp_sync_state_len floats (parts x the model's parameters, whatever
 * the shard or the pipeline stage).  This worker holds npieces pieces of it;
 * piece i's part k (k = -1: ZeRO 3's master parameters) is *pc's range of the
 * slab (the model's offsets; pc may be NULL), its floats
 * at the pointer returned (read by a save, written by a resume; NULL where
 * the worker holds no such part).  The error-feedback state
 * (compression) is dp_sync_ef_len floats, got and set whole. */
int64_t dp_sync_state_len(const struct dp_sync *s);
int dp_sync_state_parts(const struct dp_sync *s); /* optimizer state slabs per parameter: 0, 1, 2 */
int dp_sync_npieces(const struct dp_sync *s);
float *dp_sync_piece(const struct dp_sync *s, int i, int k, struct dp_zero_piece *pc);
int64_t dp_sync_ef_len(const struct dp_sync *s);
void dp_sync_ef_get(const struct dp_sync *s, float *out);
void dp_sync_ef_set(struct dp_sync *s, const float *in);
/* The reducer's post hook (see struct dp_reducer): set where every bucket
 * supports it (dp_sync_post_supported: no ZeRO, no compression). */
int dp_sync_post_supported(const struct dp_sync *s);
void dp_sync_set_post(struct dp_sync *s, dp_comm_post_fn post, void *arg);
/* Memory: the live bytes of the model state (dp_zero_live_bytes), the bytes
 * in flight (dp_zero_inflight_bytes), and the ZeRO counters. */
int64_t dp_sync_live_bytes(const struct dp_sync *s);
int64_t dp_sync_inflight_bytes(const struct dp_sync *s);
struct dp_zero_counts dp_sync_zero_counts(const struct dp_sync *s);

#ifdef __cplusplus
}
#endif
#endif
