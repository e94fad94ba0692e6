/*
 * dp/ddp.h — the gradient reducer: buckets over the flat gradient slab,
 * all-reduced while backward is still running.
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

#ifdef __cplusplus
extern "C" {
#endif

struct dp_reducer_params {
    size_t bucket_cap_bytes;   /* 0 (the default) = auto: a quarter of the gradient, at least
                                  1 MiB and at most 25 MiB (PyTorch DDP's fixed cap), so that a
                                  small model still gets several buckets to overlap on slow links */
    size_t first_bucket_bytes; /* default 1 MiB */
    int overlap;               /* 1: start buckets during backward; 0: all after it */
    enum dp_comm_algo algo;        /* all-reduce algorithm (AUTO) */
};
struct dp_reducer_params dp_reducer_default_params(void);

struct dp_bucket {
    int64_t off, count;        /* range of the gradient slab (floats) */
    int64_t nlayers;           /* top-level layers in it */
    struct dp_comm_req *req;   /* in flight, or NULL */
    double t_ready, t_done;    /* when it was started / found complete (dp_time) */
};

struct dp_reducer {
    struct dp_reducer_params p;
    struct dp_comm *comm;
    float *grads;
    struct dp_bucket *b;       /* b[0] is the output side (highest offsets) */
    int nb;
    int next;                  /* next bucket to start */
    int rc;                    /* first error of a start inside the callback */
    char err[256];
    /* timing of the last step */
    double t_begin, t_backward_end, t_end;
    double comm_total, comm_exposed;
};

int dp_reducer_init(struct dp_reducer *r, const struct dp_model *m, struct dp_comm *comm, float *grads,
                    const struct dp_reducer_params *p);
void dp_reducer_free(struct dp_reducer *r);
/* Before each backward that must communicate. */
void dp_reducer_begin(struct dp_reducer *r);
/* The model's grad_ready callback (arg = the reducer). */
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

#ifdef __cplusplus
}
#endif
#endif
