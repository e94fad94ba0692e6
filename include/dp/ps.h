/*
 * dp/ps.h — the parameter server on the thread backend (docs/ddp.md
 * "Parameter server and bounded staleness").
 *
 * The server holds the master parameters and the optimizer state, split
 * into S contiguous shards (dp_comm_split over the parameter slab).  Each
 * shard has its own mutex and condition variable, its own optimizer over its
 * slice (its own step counter) and its own version (updates applied to it).
 * There is no global lock: a push walks the shards in order, holding one
 * shard's lock at a time.  Workers are threads of the process, ranks
 * 0..P-1; the server is passive (the pushing threads apply the updates).
 *
 *     struct dp_ps *ps;
 *     dp_ps_init(&ps, &pp, num_params);
 *     dp_ps_set_state(ps, params, optim_state, optim_step, version);
 *     dp_ps_pull(ps, rank, 0, replica_params);             // the first pull
 *     loop: compute grad on replica_params
 *           dp_ps_push(ps, rank, grad, n, clock, replica_params, &staleness);
 *
 * Modes (struct dp_ps_params):
 *   async (staleness < 0): each push is applied at once with the run's lr
 *       (x n_samples / share_batch with share_batch > 0), and the fresh
 *       slice is copied back in the same lock hold.
 *   async + ordered (deterministic replay): push `clock` of rank r is
 *       applied exactly when the shard's version is clock * P + r.
 *   SSP (staleness = s >= 0): the P pushes of clock c are summed into one
 *       update, applied when the last one arrives; dp_ps_pull(c) waits until
 *       version >= c - s.
 */
#ifndef DP_PS_H
#define DP_PS_H

#include "optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Staleness histogram: bucket k counts pushes of staleness k for k <
 * DP_PS_HIST_BUCKETS; larger ones go to `overflow`; max is exact. */
#define DP_PS_HIST_BUCKETS 64
struct dp_ps_hist {
    int64_t bucket[DP_PS_HIST_BUCKETS];
    int64_t overflow;
    int64_t count, max;
    double sum;
};
void dp_ps_hist_add(struct dp_ps_hist *h, int64_t staleness);
void dp_ps_hist_merge(struct dp_ps_hist *into, const struct dp_ps_hist *h);
/* q-quantile (0 < q <= 1) as an integer staleness: the smallest k with at
 * least ceil(q count) pushes <= k; in the overflow bucket, the exact max.
 * 0 for an empty histogram. */
int64_t dp_ps_hist_quantile(const struct dp_ps_hist *h, double q);

struct dp_ps_params {
    int shards;                /* S >= 1 (at most the parameter count) */
    int workers;               /* P >= 1 */
    int staleness;             /* < 0: async; s >= 0: SSP with bound s (at most DP_PS_MAX_STALENESS) */
    int staleness_lr;          /* scale the lr by 1 / (1 + staleness) (async: per push and shard;
                                  SSP: per clock, by the mean staleness of its pushes) */
    int64_t share_batch;       /* async: scale a push's lr by n_samples / share_batch, its share of
                                  the global batch (linear scaling: every sample moves the
                                  parameters by lr / N x its gradient, as in sync); 0 = off.
                                  SSP weights pushes so already (must be 0) */
    int implicit_momentum;     /* async, SGD: asynchrony acts like momentum 1 - 1/P (Mitliagkas et
                                  al. 2016); the server's momentum is then 1 - P (1 - momentum), so
                                  that explicit and implicit compose to the run's (dp_ps_momentum) */
    int ordered;               /* async: deterministic replay (apply order clock * P + rank) */
    int exact;                 /* SSP: sum the pushes in fixed point (order-independent bits) */
    double timeout_s;          /* a wait longer than this fails the run (0 = none) */
    struct dp_optim_params optim;
    struct dp_sched sched;     /* lr = dp_sched_lr(sched, version / lr_div) */
    int64_t lr_div;            /* async: P (the schedule spans the sync run's epochs); SSP: 1 */
};
#define DP_PS_MAX_STALENESS 1000

struct dp_ps;
/* The SGD momentum the server's optimizers use: the run's, or with
 * implicit_momentum 1 - P (1 - momentum).  DP_EINVAL with a message when
 * implicit_momentum is asked outside async SGD or leaves no momentum > 0. */
int dp_ps_momentum(const struct dp_ps_params *p, float *momentum);
int dp_ps_init(struct dp_ps **ps, const struct dp_ps_params *p, int64_t n);
void dp_ps_free(struct dp_ps *ps);
/* Loads the server (no worker may be running): params (n), the optimizer
 * state in the whole-slab layout of dp_optim (NULL: zero) with its step, and
 * every shard's version.  Resets the workers' pulled versions to it. */
void dp_ps_set_state(struct dp_ps *ps, const float *params, const float *optim_state, int64_t optim_step,
                     int64_t version);
/* Copies the server out (at a point where no push is in flight): params,
 * the optimizer state in the whole-slab layout, its step (every shard has
 * taken the same number of steps there) and the version (of shard 0). */
void dp_ps_get_state(const struct dp_ps *ps, float *params, float *optim_state, int64_t *optim_step,
                     int64_t *version);
/* Rank's pull into dst (n floats), shard by shard; in SSP mode for clock c
 * it first waits until the shard's version >= c - s (async: c is ignored). */
int dp_ps_pull(struct dp_ps *ps, int rank, int64_t clock, float *dst);
/* Rank's push of gradient g (n floats) over n_samples samples (0: an empty
 * push: async applies no update but still takes its turn; SSP adds nothing).
 * Async: g is the mean gradient of the worker's batch; each shard applies it
 * and copies the fresh slice into dst (push and pull in one lock hold).
 * SSP: g is the worker's part of the global-batch mean (1/N-scaled sum);
 * clock is the worker's clock; dst is untouched (pull for the next clock).
 * *staleness: the push's staleness, the max over shards of (the shard's
 * version at apply, or SSP: the clock) - (the version the worker pulled). */
int dp_ps_push(struct dp_ps *ps, int rank, const float *g, double n_samples, int64_t clock, float *dst,
               int64_t *staleness);
/* Fails every present and future wait with DP_ECANCELED (idempotent). */
void dp_ps_abort(struct dp_ps *ps, const char *why);
/* Per-rank histograms of the pushes since the last reset, merged; reset
 * clears them (only where no push is in flight). */
void dp_ps_hist_get(const struct dp_ps *ps, struct dp_ps_hist *out);
void dp_ps_hist_reset(struct dp_ps *ps);
int dp_ps_shards(const struct dp_ps *ps);
/* Shard 0's version (where no push is in flight: the MPI server's one thread). */
int64_t dp_ps_version(const struct dp_ps *ps);

/* ---- across processes (src/ddp/ps_mpi.c; docs/ddp.md "The parameter server under MPI") ----
 *
 * `mpirun -np W + S ... --mode async --servers S`: job ranks 0..W-1 are the
 * workers (one worker each), ranks W..W+S-1 the servers; server i holds
 * shard i (dp_comm_split of the slab over S) in a local struct dp_ps of one
 * shard, which does the apply, the version, the lr schedule.  Messages go
 * over `c` (the job's process communicator, point-to-point).  Per epoch:
 *
 *   worker:  dp_ps_net_claim (the first batch), then per batch
 *            dp_ps_net_push (push-and-pull, and the next claim), and
 *            dp_ps_net_end once the claims are exhausted; SSP and the
 *            replay (static shares): dp_ps_net_push per clock, then end
 *   server:  dp_ps_net_serve serves until every worker has ended the epoch
 *   all:     dp_ps_net_collect fills the full parameters, the optimizer
 *            state and the staleness counters with this rank's part (zeros
 *            elsewhere) for the trainer's all-reduce (sum over ranks). */
struct dp_comm;
struct dp_ps_net;
struct dp_ps_net_params {
    struct dp_comm *c;         /* one rank per process; W + S ranks */
    int servers;               /* S in 1..ranks - 1 */
    int64_t n;                 /* parameters */
    int64_t batches;           /* claims per epoch (batches of the dynamic split) */
    double slow;               /* this server's --simulate-slow factor (>= 1): after each push's
                                  apply and reply it sleeps (slow - 1) x their time (a stalled
                                  server, for the timeout tests) */
    struct dp_ps_params ps;    /* .workers = W, .shards ignored (one per server); async, SSP or
                                  the replay (ordered) */
};
/* Meta words of dp_ps_net_collect: version, optimizer step, staleness count,
 * sum, overflow, then the DP_PS_HIST_BUCKETS buckets, then one max per job
 * rank (a sum of the ranks' words is then every count, and every rank's max). */
#define DP_PS_NET_META(ranks) (5 + DP_PS_HIST_BUCKETS + (int64_t)(ranks))
int dp_ps_net_init(struct dp_ps_net **out, const struct dp_ps_net_params *p);
void dp_ps_net_free(struct dp_ps_net *net);
int dp_ps_net_is_server(const struct dp_ps_net *net);
/* Server: loads its shard's slice of params (n), of the optimizer state
 * (whole-slab layout; NULL: zero), the step and the version. */
int dp_ps_net_set_state(struct dp_ps_net *net, const float *params, const float *optim_state, int64_t optim_step,
                        int64_t version);
/* Server: one epoch of requests, until all W workers have ended it.  A wait
 * longer than the timeout names the workers that have not ended the epoch. */
int dp_ps_net_serve(struct dp_ps_net *net);
/* Worker: the epoch's first batch to compute (*k = -1: none left). */
int dp_ps_net_claim(struct dp_ps_net *net, int64_t *k);
/* Worker: pushes gradient g (n floats) of n_samples samples (as dp_ps_push
 * takes it in the mode) to every server, receives every fresh shard into
 * params (n floats), the push's staleness (the max over the servers) and
 * the next batch *k (async; static shares: -1).  SSP and the replay: clock
 * is the push's clock, and the reply comes when the mode allows (SSP: every
 * shard at version >= clock + 1 - s; replay: the push applied in its turn). */
int dp_ps_net_push(struct dp_ps_net *net, const float *g, double n_samples, int64_t clock, float *params,
                   int64_t *staleness, int64_t *k);
/* Worker: tells every server it has ended the epoch. */
int dp_ps_net_end(struct dp_ps_net *net);
/* Every rank, at an epoch's end: params (n), optim_state (state_len, may be
 * NULL when 0) and meta (DP_PS_NET_META(ranks) doubles) hold this rank's
 * part: a server its slices, version and optimizer step (server 0 only for
 * the scalars); a worker its staleness counters of the epoch, which it then
 * resets.  The sum over ranks is the server's full state. */
void dp_ps_net_collect(struct dp_ps_net *net, float *params, float *optim_state, int64_t state_len, double *meta);
/* The merged histogram from the summed meta words. */
void dp_ps_net_hist(const double *meta, int ranks, struct dp_ps_hist *h, int64_t *version, int64_t *optim_step);

#ifdef __cplusplus
}
#endif
#endif
