/*
 * dp/comm.h — the communicator: collectives between the ranks (workers) of a
 * data-parallel job.
 *
 * Overview
 * --------
 * Every rank holds one communicator, `struct dp_comm`.  It offers all-reduce
 * (sum), reduce-scatter (sum), all-gather, broadcast and barrier, each both
 * blocking and nonblocking (start, then test/wait).  Behind the API sits a
 * table of function pointers, one implementation per backend, each in its own
 * file:
 *
 *     thread   P ranks are threads of one process sharing memory (built in;
 *              the default on one machine).  Each rank has a communication
 *              thread that executes that rank's operations in order, so the
 *              thread that issued them keeps computing meanwhile.
 *     mpi      one rank per process, launched by mpirun (built in when the
 *              Makefile finds mpicc; dp_comm_init(&c, "mpi", params)).  The
 *              project's ring and rhd over MPI point-to-point (the default),
 *              or MPI's own collectives (DP_ALGO_NATIVE); see docs/mpi.md.
 *     nccl     GPUs (later; not built in yet)
 *
 * Asking for a backend that was not built in returns DP_ENOTSUP at run time.
 *
 * Matching.  Operations are matched across ranks by issue order, as MPI
 * collectives are: every rank must issue the same sequence of operations with
 * the same count, dtype, algorithm and root.  The thread backend checks this
 * where it can (DP_EMISMATCH on the rank that notices, DP_ECANCELED on the
 * others).
 *
 * Buffers are in place and owned by the caller: from the start of an
 * operation until its wait returns, the caller must neither read nor write
 * the buffer (the other ranks read and write it directly).
 *
 * Partition.  Reduce-scatter and all-gather use one block partition of
 * `count` elements into P blocks, computed only by dp_comm_split(): rank r's
 * block has count/P + (r < count%P) elements, and blocks follow each other in
 * rank order.  ZeRO shards use the same function.
 *
 * Element types.  DP_DTYPE_F32 and DP_DTYPE_F64 are summed in their own
 * precision.  DP_DTYPE_BF16 buffers are summed in fp32: every partial sum is
 * computed in fp32 from the bf16 inputs and rounded to bf16 (round to
 * nearest even) at most once per hop, i.e. each time a partial result is
 * stored where another rank reads it.  Per algorithm, a final bf16 element
 * has been rounded:
 *     direct   once (all P inputs summed in fp32 in rank order, then rounded)
 *     native   (mpi) at most P-1 times: MPI has no bf16 sum, so the backend
 *              gives MPI a user-defined operation that adds two bf16
 *              vectors in fp32 and rounds once; MPI's algorithm decides
 *              the order and the number of hops
 *     ring     P-1 times (once per reduce-scatter step; the all-gather copies)
 *     rhd      log2(P') times, plus once for the fold when P is not a power of
 *              two (P' = the largest power of two <= P)
 * So |result - exact| <= sum_j |x_j| * k * 2^-8 (approximately), k = the count above.
 *
 * Determinism.  For a given algorithm and P, every element is summed in a
 * fixed order that does not depend on timing, and all ranks end with the
 * same bits.  `direct` sums in rank order 0, 1, ..., P-1.  For `native`
 * the order is MPI's (Open MPI's choice depends on P and the size, not on
 * timing); its result is the same on every rank.
 *
 * Failure.  dp_comm_abort(c, msg), from any thread of any rank, makes every
 * pending and future operation on every rank return DP_ECANCELED promptly,
 * with the message "rank R aborted: msg".  With params.timeout_s > 0, an
 * operation blocked longer than that aborts the world the same way with a
 * message naming the ranks that did not arrive ("comm: timeout after 2.0 s
 * in allreduce #17 on rank 0: rank 3 did not arrive"); every rank then
 * returns DP_ECANCELED.  Workers never hang because one of them failed.
 * The mpi backend cannot reach into other processes: dp_comm_abort fails
 * this process's operations only, and a timed-out rank names the ranks that
 * did not arrive by asking the others over a side channel ("rank 2 did not
 * respond (stalled or lost)").  A launcher then ends the job with
 * dp_comm_kill_job().
 *
 * Usage (thread backend)
 * ----------------------
 *     struct dp_comm_params cp = dp_comm_default_params();
 *     cp.timeout_s = 60;
 *     struct dp_comm_world *w;
 *     if (dp_comm_thread_world_init(&w, P, &cp)) { ... dp_errmsg() ... }
 *     // start P threads; thread r runs:
 *         struct dp_comm *c;
 *         int rc = dp_comm_thread_init(&c, w, r);
 *         // blocking: sum grads over all ranks, in place
 *         rc = dp_comm_allreduce(c, grads, n, DP_DTYPE_F32, DP_ALGO_AUTO);
 *         // nonblocking: overlap a bucket's reduction with more compute
 *         struct dp_comm_req *req;
 *         rc = dp_comm_iallreduce(c, bucket, len, DP_DTYPE_F32, DP_ALGO_AUTO, &req);
 *         ... backward of the next layers ...
 *         rc = dp_comm_wait(c, req);           // releases req
 *         if (rc) dp_comm_abort(c, dp_errmsg()); // on any failure: nobody hangs
 *         dp_comm_free(c);
 *     // after joining the threads:
 *     dp_comm_thread_world_free(w);
 *
 * Usage (mpi backend; every process of `mpirun -np P prog` runs)
 * ---------------------------------------------------------------
 *     struct dp_comm *c;
 *     if (dp_comm_init(&c, "mpi", &cp)) { ... dp_errmsg() ... }
 *     rc = dp_comm_allreduce(c, grads, n, DP_DTYPE_F32, DP_ALGO_AUTO); // ring or rhd
 *     if (rc) dp_comm_kill_job(c, 1);      // ends every process of the job
 *     dp_comm_free(c);                     // finalizes MPI if init started it
 */
#ifndef DP_COMM_H
#define DP_COMM_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- element types ----------------------------------------------------------- */

enum dp_dtype {
    DP_DTYPE_F32 = 0,
    DP_DTYPE_BF16, /* bfloat16, stored as uint16_t; reduced with fp32 accumulation */
    DP_DTYPE_F64,  /* sum only, e.g. SyncBatchNorm statistics */
    DP_DTYPE_COUNT
};
/* Bytes per element (0 for an unknown type). */
size_t dp_dtype_size(enum dp_dtype t);
/* "f32", "bf16", "f64" ("unknown" out of range); parse returns -1 if unknown. */
const char *dp_dtype_name(enum dp_dtype t);
int dp_dtype_parse(const char *name);

/* fp32 <-> bf16, round to nearest even; NaN stays NaN (quiet). */
static inline uint16_t dp_bf16_from_f32(float f) {
    union { float f; uint32_t u; } v = {f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u);
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}
static inline float dp_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = {(uint32_t)h << 16};
    return v.f;
}

/* ---- algorithms ---------------------------------------------------------------- */

/* Collective algorithms, selectable per call; DP_ALGO_AUTO asks
 * dp_comm_choose_algo().  The protocols are described above each function in
 * src/comm/algo_*.c. */
enum dp_comm_algo {
    DP_ALGO_AUTO = 0,
    DP_ALGO_RING,   /* reduce-scatter then all-gather around a ring; 2(P-1) steps */
    DP_ALGO_RHD,    /* recursive halving-doubling (Rabenseifner); 2 log2(P) steps (+2 fold) */
    DP_ALGO_DIRECT, /* shared memory: the ranks share the reduction chunk by chunk, each
                       chunk read from all P buffers and its sum written into all P */
    DP_ALGO_NATIVE, /* the backend's own collectives (mpi: MPI_Iallreduce, ...); on the
                       thread backend it means direct */
    DP_ALGO_COUNT
};
/* "auto", "ring", "rhd", "direct", "native" ("unknown" out of range); parse
 * returns -1 for an unknown name or NULL. */
const char *dp_comm_algo_name(enum dp_comm_algo a);
int dp_comm_algo_parse(const char *name);

/* The collectives, for dp_comm_choose_algo(). */
enum dp_comm_coll {
    DP_COLL_ALLREDUCE = 0,
    DP_COLL_REDUCE_SCATTER,
    DP_COLL_ALLGATHER,
    DP_COLL_BROADCAST,
    DP_COLL_BARRIER,
    DP_COLL_COUNT
};
/* "allreduce", "reduce_scatter", "allgather", "broadcast", "barrier". */
const char *dp_comm_coll_name(enum dp_comm_coll k);

/* The policy behind DP_ALGO_AUTO, the only place that holds it: the
 * algorithm for collective `coll` of `bytes` bytes (the whole buffer) over
 * `nranks` ranks on backend `backend` ("thread", ...).  A pure function of its
 * arguments, so every rank makes the same choice.  Never returns
 * DP_ALGO_AUTO. */
enum dp_comm_algo dp_comm_choose_algo(const char *backend, enum dp_comm_coll coll, int nranks,
                                      size_t bytes);

/* ---- the block partition ----------------------------------------------------- */

/* Block `part` of `count` elements split into `nparts` blocks: it starts at
 * *offset and has *len = count/nparts + (part < count%nparts) elements.  The
 * only function in dptrain that computes these offsets. */
void dp_comm_split(int64_t count, int nparts, int part, int64_t *offset, int64_t *len);

/* ---- communicators ----------------------------------------------------------- */

struct dp_comm;       /* one per rank; opaque */
struct dp_comm_world; /* thread backend: shared by the P ranks of one process */
struct dp_comm_req;   /* one started operation; released by dp_comm_wait */

struct dp_comm_params {
    double timeout_s; /* an operation blocked this long aborts the world (mpi: this
                         rank's communicator); 0 = wait forever */
    int spin_us;      /* busy-wait this long before sleeping; -1 = auto (thread: 10 µs
                         when the ranks fit on the CPUs, else 1 µs, and with caller
                         progress up to 2 ms while the waiting thread has its core to
                         itself (comm_thread.c, "Waiting"); mpi: 50 µs) */
    int progress;     /* enum dp_comm_progress: who runs the thread backend's nonblocking
                         direct all-reduces (mpi: ignored) */
};
/* Thread backend.  DP_PROGRESS_THREAD: every nonblocking operation runs on the
 * rank's communication thread.  DP_PROGRESS_CALLER: a direct all-reduce of a
 * flat world advances inside the rank's own dp_comm_iallreduce, dp_comm_test
 * and dp_comm_wait calls (each rank sums its own block once every rank has
 * arrived), so no third thread competes with the compute threads for the
 * cores; such an operation completes only once every rank has called in after
 * the last one arrived.  The result has the same bits (comm_thread.c, "Caller
 * progress").  DP_PROGRESS_AUTO is the trainer's choice between the two
 * (dp_train_progress_auto); a communicator given it runs as THREAD. */
enum dp_comm_progress { DP_PROGRESS_THREAD = 0, DP_PROGRESS_CALLER = 1, DP_PROGRESS_AUTO = 2 };
/* timeout_s 0, spin_us -1, progress DP_PROGRESS_THREAD. */
struct dp_comm_params dp_comm_default_params(void);

/* 1 if backend `name` is built in ("thread" always is; "mpi" when the build
 * found MPI; "nccl" not yet). */
int dp_comm_backend_available(const char *name);

/* A communicator of a process-per-rank backend ("mpi", "nccl"), whose rank and
 * world size come from the launcher.  params may be NULL (defaults).
 *
 * "mpi": one rank per process of MPI_COMM_WORLD.  Initialises MPI if nobody
 * has (MPI_Init_thread asking for MPI_THREAD_MULTIPLE; at least
 * MPI_THREAD_SERIALIZED is required, since the communicator may be used from
 * a thread other than the one that created it, one thread at a time), and
 * then dp_comm_free finalizes it.  Collective over MPI_COMM_WORLD: every
 * process calls it, in the same order as its other dp_comm_init calls.
 * Errors: DP_ENOTSUP when MPI was not built in ("backend 'mpi' was not built
 * in (install openmpi-bin libopenmpi-dev)"), when MPI offers less than
 * MPI_THREAD_SERIALIZED or was already finalized; DP_EIO when an MPI call
 * fails.  "nccl" returns DP_ENOTSUP; "thread" DP_EINVAL (its ranks are made
 * with dp_comm_thread_init); any other name DP_EINVAL. */
int dp_comm_init(struct dp_comm **c, const char *backend, const struct dp_comm_params *params);

/* Thread backend.  Creates the world shared by `nranks` ranks (1..1024) of this
 * process; params may be NULL (defaults).  Free it with
 * dp_comm_thread_world_free() after every rank has freed its communicator. */
int dp_comm_thread_world_init(struct dp_comm_world **w, int nranks,
                              const struct dp_comm_params *params);
void dp_comm_thread_world_free(struct dp_comm_world *w);
/* Hierarchical (hybrid) world: `nlocal` ranks (threads) of this process over
 * a process-level communicator `inter` (for example an MPI communicator, one
 * per process, every process with the same nlocal).  Thread t of process p
 * is global rank p*nlocal + t of p's world of nprocs*nlocal ranks;
 * dp_comm_rank and dp_comm_world report global numbers.  Each collective is
 * done in three stages, run on the ranks' communication threads:
 *     allreduce      local direct all-reduce; local rank 0 all-reduces across
 *                    processes on `inter`; local broadcast from local rank 0
 *     reduce_scatter the same (the other blocks then hold full sums)
 *     allgather      each rank zeroes what is not its block; local
 *                    all-reduce; the leaders all-gather on `inter` when each
 *                    process's blocks form inter's block of that process
 *                    (always with one thread per process; else when the split
 *                    lines up), otherwise they all-reduce the vector (twice
 *                    the bytes); local broadcast.  (x + 0 = x exactly; in the
 *                    local sum -0.0 comes back as +0.0)
 *     broadcast      local broadcast in the root's process; leaders broadcast
 *                    on `inter`; local broadcast in the other processes
 *     barrier        local barrier, leaders' barrier, local barrier
 * The algorithm asked for applies to the `inter` stage (AUTO and direct mean
 * inter's own choice); the local stages use direct.  The sum order differs
 * from a flat world's, so float results agree to rounding (integer-valued
 * data, as in deterministic mode, exactly).  Only local rank 0's
 * communication thread uses `inter` while the world exists, and the world
 * does not own it.  Checks that every process has the same nlocal (one
 * all-reduce on `inter`; DP_EMISMATCH naming the first process that
 * differs).  An abort stops this process's ranks; the other processes see
 * `inter` fail or time out (a launcher kills the job: dp_comm_kill_job). */
int dp_comm_thread_world_init_hier(struct dp_comm_world **w, int nlocal,
                                   const struct dp_comm_params *params, struct dp_comm *inter);
/* Rank `rank` of world w: call once per rank, from any thread (normally the
 * worker thread of that rank).  Starts the rank's communication thread.  The
 * communicator may be used from one thread at a time (dp_comm_abort and
 * dp_comm_status from any thread). */
int dp_comm_thread_init(struct dp_comm **c, struct dp_comm_world *w, int rank);

/* A group of parent's ranks: every rank of parent calls it (collective), and those with the same
 * color (>= 0) get a communicator of their own over them, ranked by key (ties by parent's rank):
 * a pipeline stage's data-parallel replicas, for example.  mpi: MPI_Comm_split, the group's
 * operations apart from the parent's; the parent's timeout and spin.  thread: DP_ENOTSUP (the
 * ranks of a group of threads form a world of their own: dp_comm_thread_world_init).  Free it
 * with dp_comm_free before the parent. */
int dp_comm_split_group(struct dp_comm *parent, int color, int key, struct dp_comm **c);

/* Rank of this communicator in 0..world-1, and the number of ranks. */
int dp_comm_rank(const struct dp_comm *c);
int dp_comm_world(const struct dp_comm *c);
/* "thread", ... */
const char *dp_comm_backend_name(const struct dp_comm *c);

/* Releases this rank's communicator (NULL-safe).  Every started request should
 * have been waited for; if some were not, the world is aborted first (so the
 * other ranks do not wait for this one) and the requests are released.
 * mpi: the abort is this rank's only; the last communicator that
 * dp_comm_init made finalizes MPI if dp_comm_init initialised it, unless an
 * operation was abandoned unfinished (a timeout, an abort with operations in
 * flight): MPI_Finalize waits for every process and would hang on a stalled
 * one, so the process should then exit (mpirun ends the job) or call
 * dp_comm_kill_job. */
void dp_comm_free(struct dp_comm *c);

/* Aborts the whole world: every pending and future operation on every rank
 * returns DP_ECANCELED with the message "rank R aborted: msg".  Callable from
 * any thread, any number of times (the first message is kept).  Returns
 * DP_ECANCELED and sets this thread's message, so a worker may write
 * `return dp_comm_abort(c, "NaN in loss");`.  mpi: this rank's operations
 * only (it cannot reach the other processes; they fail by their timeout, or
 * the job ends with dp_comm_kill_job); an operation MPI already holds may
 * still write its buffer until the job ends. */
int dp_comm_abort(struct dp_comm *c, const char *msg);
/* 0 while the world is healthy; DP_ECANCELED with the abort message once any
 * rank aborted or timed out.  Cheap (one atomic load), for compute loops that
 * should stop early. */
int dp_comm_status(const struct dp_comm *c);

/* For a launcher's error path: ends the whole job with exit status `code`.
 * mpi: MPI_Abort(MPI_COMM_WORLD, code), which kills every process of the job,
 * stalled ones included, and does not return.  thread: the same as
 * dp_comm_abort(c, "job killed (code N)"), returning DP_ECANCELED (the caller
 * then exits with `code` itself). */
int dp_comm_kill_job(struct dp_comm *c, int code);

/* The ranks of this communicator on this host: this rank's position among
 * them (*local_rank, 0-based, in rank order) and their number (*local_size).
 * mpi: computed at init (MPI_Comm_split_type, MPI_COMM_TYPE_SHARED); thread:
 * every rank shares the host, so rank and world size.  0, or DP_EINVAL for a
 * NULL argument. */
int dp_comm_host_ranks(const struct dp_comm *c, int *local_rank, int *local_size);

/* The ranks that a timeout on this rank found silent (neither answering nor in
 * the operation: stalled, killed, or cut off), for a failure record: their
 * number, the first `max` of them in ranks[] in rank order.  0 before any
 * timeout, and always on the thread backend (its ranks cannot be lost apart
 * from the process).  DP_EINVAL for a NULL argument. */
int dp_comm_lost_ranks(const struct dp_comm *c, int *ranks, int max);

/* ---- collectives: blocking ------------------------------------------------------ */

/* Each one is its nonblocking form followed by dp_comm_wait().  Returns 0, or
 * a negative DP_E* with a message: DP_EINVAL (bad argument, checked before
 * anything is started), DP_ECANCELED (aborted or timed out), DP_EMISMATCH
 * (the ranks issued different operations). */

/* buf (count) on every rank becomes the elementwise sum over ranks. */
int dp_comm_allreduce(struct dp_comm *c, void *buf, int64_t count, enum dp_dtype dtype,
                      enum dp_comm_algo algo);
/* buf (count): on return, rank r's block (dp_comm_split(count, P, r)) holds the
 * sum over ranks of that block; the other blocks of buf hold unspecified
 * partial sums (they are scratch). */
int dp_comm_reduce_scatter(struct dp_comm *c, void *buf, int64_t count, enum dp_dtype dtype,
                           enum dp_comm_algo algo);
/* buf (count): on entry rank r's block (dp_comm_split(count, P, r)) holds its
 * data; on return every block holds its owner's data, on every rank. */
int dp_comm_allgather(struct dp_comm *c, void *buf, int64_t count, enum dp_dtype dtype,
                      enum dp_comm_algo algo);
/* buf (count) on every rank becomes a copy of rank root's buf.  ring =
 * pipelined chain, rhd = binomial tree, direct = every rank copies from root. */
int dp_comm_broadcast(struct dp_comm *c, void *buf, int64_t count, enum dp_dtype dtype, int root,
                      enum dp_comm_algo algo);
/* Returns once every rank has entered the barrier. */
int dp_comm_barrier(struct dp_comm *c);

/* ---- collectives: nonblocking ------------------------------------------------- */

/* Start the operation and return at once with *req set; the arguments are
 * validated first (on an error nothing is started and *req is NULL).  A
 * rank's operations execute in issue order, and complete in that order.
 * Every request must be passed to dp_comm_wait() exactly once. */
int dp_comm_iallreduce(struct dp_comm *c, void *buf, int64_t count, enum dp_dtype dtype,
                       enum dp_comm_algo algo, struct dp_comm_req **req);
int dp_comm_ireduce_scatter(struct dp_comm *c, void *buf, int64_t count, enum dp_dtype dtype,
                            enum dp_comm_algo algo, struct dp_comm_req **req);
int dp_comm_iallgather(struct dp_comm *c, void *buf, int64_t count, enum dp_dtype dtype,
                       enum dp_comm_algo algo, struct dp_comm_req **req);
int dp_comm_ibroadcast(struct dp_comm *c, void *buf, int64_t count, enum dp_dtype dtype, int root,
                       enum dp_comm_algo algo, struct dp_comm_req **req);
int dp_comm_ibarrier(struct dp_comm *c, struct dp_comm_req **req);
/* An all-reduce (sum) that also hands each part of the result to `post`:
 * post(post_arg, off, n) runs once for each range [off, off + n) of the
 * buffer, the ranges tiling [0, count), on the thread of the rank that summed
 * that range (a rank's own post and arg), after the sum is stored in every
 * rank's buffer and before the operation completes on any rank.  So a look
 * at the result (the trainer's check for non-finite values) is shared among
 * the ranks like the sum itself, while the sum is in the summing core's
 * cache, instead of every rank reading the whole result again.  Only where
 * every rank's buffer is in this process's memory: the thread backend, not
 * hierarchical, with the direct algorithm (what DP_ALGO_AUTO resolves to for
 * up to 16 ranks); elsewhere DP_ENOTSUP, nothing started. */
typedef void (*dp_comm_post_fn)(void *arg, int64_t off, int64_t n);
int dp_comm_iallreduce_post(struct dp_comm *c, void *buf, int64_t count, enum dp_dtype dtype,
                            enum dp_comm_algo algo, dp_comm_post_fn post, void *post_arg,
                            struct dp_comm_req **req);
/* 1 when an all-reduce of count elements of dtype with algo (AUTO resolved
 * as the start resolves it) runs the direct algorithm on the thread backend,
 * where dp_comm_iallreduce_post may be used (a hierarchical world, which the
 * backend refuses at the start, aside); else 0. */
int dp_comm_post_supported(const struct dp_comm *c, int64_t count, enum dp_dtype dtype, enum dp_comm_algo algo);

/* *done = 1 if req has completed (successfully or not), else 0.  Does not
 * block and does not release req.  Returns 0 (or DP_EINVAL for bad args).
 * mpi: also the way to make progress without blocking: it polls MPI, and
 * runs ring and rhd operations (which move only inside test and wait) as
 * far as they go. */
int dp_comm_test(struct dp_comm *c, struct dp_comm_req *req, int *done);
/* Blocks until req completes, releases it, and returns the operation's
 * status (its message is set on the calling thread).  The buffer belongs to
 * the caller again.  If the operation has not started yet, the calling
 * thread runs it itself (no hand-off latency for blocking calls). */
int dp_comm_wait(struct dp_comm *c, struct dp_comm_req *req);

/* ---- point-to-point messages ---------------------------------------------------- */

/*
 * Messages between two ranks, for the protocols that are not collectives (a
 * parameter server's pushes and pulls, backup workers across processes).
 * They are apart from the collectives' issue order: a rank may send or
 * receive between any two collectives, and have several messages in flight.
 *
 *     struct dp_comm_msg *m;
 *     dp_comm_isend(c, grad, bytes, 0, tag, &m);  ...  dp_comm_msg_wait(c, m, NULL, NULL);
 *     dp_comm_recv(c, buf, cap, DP_ANY_SOURCE, tag, &from, &got);
 *
 * Matching.  A receive takes the first message that arrived from `src` (any
 * rank with DP_ANY_SOURCE) carrying `tag` (0..DP_COMM_TAG_MAX).  Messages
 * from one sender with one tag are received in the order they were sent
 * (non-overtaking, as in MPI).  thread: a receive is matched when it is
 * tested or waited for, not when it is posted; mpi: in posting order (MPI's
 * rule).  The two agree when a rank has at most one receive per (src, tag)
 * in flight, which is how the project uses them.
 * Buffers.  The send buffer must stay unchanged and the receive buffer
 * untouched until the message's wait (thread copies the bytes at once
 * (eager), mpi may read the buffer until the receiver has taken it).  A
 * message longer than the receive buffer fails the receive (DP_EINVAL,
 * naming both sizes); a shorter one is fine (*bytes says how many came).
 * Every message must be waited for (dp_comm_msg_wait) or cancelled
 * (dp_comm_msg_cancel) exactly once, which releases it; test does not.
 * mpi: the messages may be used from a thread other than the one issuing
 * the collectives (MPI_THREAD_MULTIPLE is required: DP_ENOTSUP otherwise).
 * Failure.  Abort and timeout work as for collectives: after an abort every
 * message operation fails with DP_ECANCELED; a wait blocked longer than
 * params.timeout_s fails, names the peer and the tag, and aborts the world
 * (mpi: this rank's communicator).  Not available in a hierarchical world
 * (DP_ENOTSUP: its ranks span processes through one leader).
 */
#define DP_ANY_SOURCE (-1)
#define DP_COMM_TAG_MAX 32767 /* the least upper bound MPI guarantees */
struct dp_comm_msg;           /* one message in flight; released by dp_comm_msg_wait */

int dp_comm_isend(struct dp_comm *c, const void *buf, int64_t bytes, int dest, int tag,
                  struct dp_comm_msg **msg);
int dp_comm_irecv(struct dp_comm *c, void *buf, int64_t bytes, int src, int tag,
                  struct dp_comm_msg **msg);
/* *done = 1 once the message has completed (received into the buffer, or,
 * for a send, handed over).  Does not block or release. */
int dp_comm_msg_test(struct dp_comm *c, struct dp_comm_msg *msg, int *done);
/* Blocks until msg completes and releases it; for a receive, *src and *bytes
 * (either may be NULL) tell the sender and the length received. */
int dp_comm_msg_wait(struct dp_comm *c, struct dp_comm_msg *msg, int *src, int64_t *bytes);
/* Releases a message without waiting: a receive not yet matched is
 * withdrawn (nothing will be written into its buffer), one already matched
 * is dropped; a send must have completed (it cannot be taken back).  For the
 * end of a protocol, whose last posted receives will never be answered. */
int dp_comm_msg_cancel(struct dp_comm *c, struct dp_comm_msg *msg);
/* isend/irecv followed by dp_comm_msg_wait. */
int dp_comm_send(struct dp_comm *c, const void *buf, int64_t bytes, int dest, int tag);
int dp_comm_recv(struct dp_comm *c, void *buf, int64_t bytes, int src, int tag, int *from,
                 int64_t *got);

#ifdef __cplusplus
}
#endif
#endif
