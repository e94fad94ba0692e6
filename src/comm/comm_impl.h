/*
 * comm_impl.h — private to src/comm: the backend interface (ops table), the
 * shared-memory step-flag layer the thread algorithms are written over, and
 * the reduction kernels.
 *
 * Vocabulary used by every algorithm file:
 *   P       the number of ranks; r this rank; l = (r-1) mod P, rr = (r+1) mod P.
 *   block   one of the P parts of the buffer given by dp_comm_split(count, P, b);
 *           "block b" is the b-th part; rank b owns block b in reduce-scatter
 *           and all-gather.
 *   unit    rhd halves ranges of units (blocks of a partition into U parts).
 *   mark    a step flag.  Each rank publishes one monotonic 64-bit progress
 *           word, prog = seq << 24 | mark, where seq is the operation's number
 *           in issue order (1, 2, ...; the same on all ranks) and mark is the
 *           step reached within it.  Mark 1 = "arrived": the rank's buffer and
 *           descriptor are published.  A rank sets mark m (release) after it
 *           has finished every read and write of step m; a peer that waits for
 *           mark m (acquire) may then read what step m wrote.  Marks only grow,
 *           and moving on to the next operation passes every mark of this one.
 *   end rule  a rank returns only after every peer that reads or writes its
 *           buffer has set the mark that follows its last such access: the
 *           caller owns the buffer again when the operation returns.
 */
#ifndef DP_COMM_IMPL_H
#define DP_COMM_IMPL_H

#include <stdint.h>

#include "dp/comm.h"

/* ---- one operation as issued ----------------------------------------------------- */

/* What a rank asked for; matched across ranks by issue order. */
struct dp__op {
    enum dp_comm_coll coll;
    enum dp_comm_algo algo; /* resolved: never DP_ALGO_AUTO (barrier: DP_ALGO_DIRECT on
                               thread, DP_ALGO_NATIVE on mpi); never DP_ALGO_NATIVE on
                               thread (comm.c maps it to DP_ALGO_DIRECT) */
    enum dp_dtype dtype;
    int root;               /* broadcast; 0 otherwise */
    int64_t count;          /* elements */
    void *buf;
    dp_comm_post_fn post;   /* all-reduce, thread direct only: this rank's hook for each range it
                               summed (dp_comm_iallreduce_post); NULL: none */
    void *post_arg;
};

/* ---- the backend interface ------------------------------------------------------- */

/* One table per backend (comm_thread.c, comm_mpi.c, later comm_nccl.c).  The
 * generic layer (comm.c) validates arguments, resolves DP_ALGO_AUTO, and
 * builds the blocking calls as start + wait. */
struct dp_comm_ops {
    const char *name;
    /* Starts d (already validated).  `blocking` says the caller will wait at
     * once, so a backend may skip waking a progress thread. */
    int (*start)(struct dp_comm *c, const struct dp__op *d, int blocking,
                 struct dp_comm_req **req);
    int (*test)(struct dp_comm *c, struct dp_comm_req *req, int *done);
    int (*wait)(struct dp_comm *c, struct dp_comm_req *req);
    int (*abort)(struct dp_comm *c, const char *msg);
    int (*status)(const struct dp_comm *c);
    void (*free)(struct dp_comm *c);
    /* (optional) Ends every process of the job; NULL: dp_comm_abort. */
    int (*kill_job)(struct dp_comm *c, int code);
    /* (optional) This host's ranks; NULL: every rank on one host. */
    void (*host_ranks)(const struct dp_comm *c, int *local_rank, int *local_size);
    /* (optional) Point-to-point messages, arguments validated by comm.c;
     * NULL: DP_ENOTSUP. */
    int (*isend)(struct dp_comm *c, const void *buf, int64_t bytes, int dest, int tag,
                 struct dp_comm_msg **msg);
    int (*irecv)(struct dp_comm *c, void *buf, int64_t bytes, int src, int tag,
                 struct dp_comm_msg **msg);
    int (*msg_test)(struct dp_comm *c, struct dp_comm_msg *msg, int *done);
    int (*msg_wait)(struct dp_comm *c, struct dp_comm_msg *msg, int *src, int64_t *bytes);
    int (*msg_cancel)(struct dp_comm *c, struct dp_comm_msg *msg);
    /* (optional) The ranks a timeout found silent; NULL: none. */
    int (*lost_ranks)(const struct dp_comm *c, int *ranks, int max);
};

/* The base every backend's communicator starts with. */
struct dp_comm {
    const struct dp_comm_ops *ops;
    int rank, nranks;
};

/* The mpi backend (comm_mpi.c; DP_WITH_MPI only): dp_comm_init(c, "mpi", p). */
int dp__comm_mpi_init(struct dp_comm **c, const struct dp_comm_params *params);
int dp__comm_mpi_split(struct dp_comm *parent, int color, int key, struct dp_comm **c);
/* Tests (comm_mpi.c): the mpi communicator c takes ranks q and r to be on one
 * host iff q / per_host == r / per_host (message segments differ between
 * hosts); every rank calls it alike before any operation. */
void dp__comm_mpi_fake_hosts(struct dp_comm *c, int per_host);

/* ---- the shared-memory step-flag layer (implemented in comm_thread.c) -------------- */

/* One rank's view of one operation in progress.  The world (comm_thread.c) is
 * opaque to the algorithms. */
struct dp__coll {
    struct dp_comm_world *world;
    int rank, nranks;
    uint64_t seq;      /* operation number on this rank, from 1 */
    struct dp__op d;   /* this rank's operation (d.buf is this rank's buffer) */
    size_t esize;      /* bytes per element */
    double deadline;   /* dp_time() after which a wait times out; 0 = never */
    char **peer_buf;   /* (P) scratch: peers' buffers as found by dp__coll_peer */
};

#define DP__MARK_ARRIVED 1u
#define DP__MARK_MAX ((1u << 24) - 1)

/* Waits until `peer` has arrived at this operation, checks that it issued the
 * same operation (else aborts the world and returns DP_EMISMATCH), and sets
 * *buf to its buffer.  0, or DP_ECANCELED on abort or timeout. */
int dp__coll_peer(struct dp__coll *op, int peer, char **buf);
/* Waits until `peer` has set mark `mark` (or moved past this operation).
 * Spins briefly, then sleeps.  0, or DP_ECANCELED (abort or timeout). */
int dp__coll_wait(struct dp__coll *op, int peer, unsigned mark);
/* 1 while the calling thread has its core to itself, by its run-queue time
 * over the last window (comm_thread.c, "Waiting"); `now` is dp_time(). */
int dp__comm_core_own(double now);
/* dp__coll_wait for every rank but this one. */
int dp__coll_wait_all(struct dp__coll *op, unsigned mark);
/* Publishes mark `mark` of this rank (release), waking sleepers. */
void dp__coll_mark(struct dp__coll *op, unsigned mark);
/* Work sharing: returns the next unclaimed chunk index in 0..nchunks-1 of this
 * operation, or -1 when all are claimed; every chunk goes to exactly one
 * caller.  All ranks of the world share one claim counter, so an algorithm may
 * use it only between a wait for every rank's arrival and a wait for every
 * rank's mark after its last claim (one operation claims at a time).
 * Claims carry no memory ordering; marks order the data. */
int64_t dp__coll_claim(struct dp__coll *op, int64_t nchunks);

/* Byte offset and length of block b of `count` elements split in `nparts`. */
static inline void dp__block(const struct dp__coll *op, int nparts, int b, size_t *off,
                             size_t *len) {
    int64_t o, n;
    dp_comm_split(op->d.count, nparts, b, &o, &n);
    *off = (size_t)o * op->esize;
    *len = (size_t)n * op->esize;
}

/* ---- the algorithms (algo_ring.c, algo_rhd.c, algo_direct.c) ----------------------- */

/* Uniform signature: the operation is op->d; this rank's mark 1 is set. */
typedef int (*dp__algo_fn)(struct dp__coll *op);

int dp__allreduce_ring(struct dp__coll *op);
int dp__reduce_scatter_ring(struct dp__coll *op);
int dp__allgather_ring(struct dp__coll *op);
int dp__broadcast_ring(struct dp__coll *op);

int dp__allreduce_rhd(struct dp__coll *op);
int dp__reduce_scatter_rhd(struct dp__coll *op);
int dp__allgather_rhd(struct dp__coll *op);
int dp__broadcast_rhd(struct dp__coll *op);

int dp__allreduce_direct(struct dp__coll *op);
int dp__reduce_scatter_direct(struct dp__coll *op);
int dp__allgather_direct(struct dp__coll *op);
int dp__broadcast_direct(struct dp__coll *op);
int dp__barrier_direct(struct dp__coll *op);

/* ---- reduction kernels (reduce.c) ------------------------------------------------ */

/* dst[i] = dst[i] + src[i] for n elements (bf16: both widened to fp32, added,
 * rounded once).  dst and src do not overlap. */
void dp__reduce_add(void *dst, const void *src, int64_t n, enum dp_dtype t);
/* With every pointer advanced by `off` bytes: s[i] = src[0][i] + src[1][i] +
 * ... + src[nsrc-1][i], summed in that order (in fp32 for bf16, rounded once),
 * then dst[j][i] = s[i] for every j < ndst.  A dst may be one of the srcs
 * (element i is read from all srcs before it is written); otherwise the arrays
 * do not overlap.  At most 1024 pointers each. */
void dp__reduce_sum_to(char *const *dst, int ndst, char *const *src, int nsrc, size_t off,
                       int64_t n, enum dp_dtype t);

#endif
