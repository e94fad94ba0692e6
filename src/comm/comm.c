/*
 * The communicator's generic layer: names, the block partition, the choice of
 * algorithm, argument checks, and dispatch to the backend's ops table.  The
 * blocking collectives are the nonblocking ones followed by a wait.
 */
#include <stdio.h>
#include <string.h>

#include "comm_impl.h"

/* ---- names ---------------------------------------------------------------------- */

static const char *const dtype_names[DP_DTYPE_COUNT] = {"f32", "bf16", "f64"};
static const size_t dtype_sizes[DP_DTYPE_COUNT] = {4, 2, 8};
static const char *const algo_names[DP_ALGO_COUNT] = {"auto", "ring", "rhd", "direct", "native"};
static const char *const coll_names[DP_COLL_COUNT] = {"allreduce", "reduce_scatter",
                                                      "allgather", "broadcast", "barrier"};

size_t dp_dtype_size(enum dp_dtype t) {
    return (unsigned)t < DP_DTYPE_COUNT ? dtype_sizes[t] : 0;
}
const char *dp_dtype_name(enum dp_dtype t) {
    return (unsigned)t < DP_DTYPE_COUNT ? dtype_names[t] : "unknown";
}
int dp_dtype_parse(const char *name) {
    for (int i = 0; name && i < DP_DTYPE_COUNT; i++)
        if (strcmp(name, dtype_names[i]) == 0) return i;
    return -1;
}
const char *dp_comm_algo_name(enum dp_comm_algo a) {
    return (unsigned)a < DP_ALGO_COUNT ? algo_names[a] : "unknown";
}
int dp_comm_algo_parse(const char *name) {
    for (int i = 0; name && i < DP_ALGO_COUNT; i++)
        if (strcmp(name, algo_names[i]) == 0) return i;
    return -1;
}
const char *dp_comm_coll_name(enum dp_comm_coll k) {
    return (unsigned)k < DP_COLL_COUNT ? coll_names[k] : "unknown";
}

/* ---- the block partition ------------------------------------------------------------ */

void dp_comm_split(int64_t count, int nparts, int part, int64_t *offset, int64_t *len) {
    DP_ASSERT(nparts >= 1 && part >= 0 && part < nparts && count >= 0);
    int64_t q = count / nparts, rem = count % nparts;
    *len = q + (part < rem);
    *offset = part * q + (part < rem ? part : rem);
}

/* ---- the choice of algorithm ----------------------------------------------------------- */

/*
 * Policy for DP_ALGO_AUTO, kept apart from the algorithms so that tests and
 * benchmarks can force any one by name.
 *
 * Thread backend (shared memory).  Every algorithm here reads its peers'
 * buffers in place, so the cost is memory traffic plus synchronisation:
 *   direct  all-reduce: each rank reads n and writes n bytes, the minimum for an
 *           in-place result on every rank (every input read once, every output
 *           written once); 2 synchronisations, each waiting for all P ranks.
 *   ring    all-reduce: each rank reads about 3n(P-1)/P and writes 2n(P-1)/P, in
 *           2(P-1) dependent steps.
 *   rhd     all-reduce: about as many bytes as ring (plus a fold when P is not a
 *           power of two), in 2 log2(P) steps, each waiting for one partner.
 * Measured with `dptrain bench allreduce` on the 2-core VM (another job busy on
 * both cores; median µs):
 *   P = 2    4 KiB   64 KiB   1 MiB      direct 2.1  3.9  23     rhd 2.5  9.3  317
 *                                        ring 2.5  9.8  342
 *            64 MiB busbw GB/s, median (best iteration): direct 12 (26, the memory
 *            bound), ring 4.6 (7.0), rhd 4.8 (6.7); ring and rhd move 5n bytes
 *            instead of 4n and wait at every step
 *   P = 4    (oversubscribed: 4 ranks on 2 cores) 4 KiB: direct 162, rhd 95, ring 118
 *   P = 8    (oversubscribed) 4 KiB: direct 162, rhd 372, ring 391
 * so direct everywhere on one machine.  Its all-rank waits grow with P, so
 * beyond 16 ranks rhd's log2(P) pairwise steps are chosen for small messages
 * (an estimate, to be measured on a many-core machine).  Broadcast: direct
 * (every rank copies from the root at once).  Barrier: direct (the only one).
 *
 * MPI backend.  All-reduce, reduce-scatter and all-gather: the project's
 * point-to-point algorithms, rhd below 1 MiB (2 log2 P messages) and ring
 * from 1 MiB (bandwidth-optimal, no fold); broadcast and barrier: native
 * (the MPI library's own).  Measured, median µs (docs/mpi.md):
 *   4 emulated hosts, 1 Gbit/s TCP links (tests/netns), 20 iterations:
 *              16 KiB  256 KiB   1 MiB    4 MiB   16 MiB
 *     native    12352    30078   40325   132216   443759
 *     rhd        3924     7821   19538    71698   325872
 *     ring       7694     7769   18817    75853   243502
 *   (the link bound for 1 MiB is 2(P-1)/P * n / B = 13.3 ms: rhd and ring
 *   reach 70%, Open MPI's tuned all-reduce over TCP a third of that);
 *   2 processes on shared memory, busbw GB/s at 1 / 16 / 64 MiB: native 8.7 /
 *   10.4 / 9.4, ring 8.3 / 9.6 / 10.8, rhd 6.8 / 9.1 / 9.9 — within 10% below
 *   32 MiB and ahead above, where Open MPI allocates a temporary buffer per
 *   call, which from a thread other than the main one (dptrain's
 *   communication thread) becomes fresh pages every call: 64 MiB took 210 ms
 *   instead of 10.  So the project's algorithms by default, native on request
 *   (--algo native), which a tuned MPI on a real fabric may well win.
 *
 * Other message-passing backends (nccl; not built yet): the classic choice,
 * rhd below 256 KiB (latency-bound: 2 log2 P messages) and ring above
 * (bandwidth-optimal, no fold), as in Open MPI's and NCCL's tuning.
 */
enum dp_comm_algo dp_comm_choose_algo(const char *backend, enum dp_comm_coll coll, int nranks,
                                      size_t bytes) {
    int shared_memory = backend == NULL || strcmp(backend, "thread") == 0;
    if (backend && strcmp(backend, "mpi") == 0) {
        if (coll == DP_COLL_BROADCAST || coll == DP_COLL_BARRIER) return DP_ALGO_NATIVE;
        return bytes < ((size_t)1 << 20) ? DP_ALGO_RHD : DP_ALGO_RING;
    }
    if (coll == DP_COLL_BARRIER) return DP_ALGO_DIRECT;
    if (shared_memory) {
        if (nranks > 16 && bytes < ((size_t)64 << 10)) return DP_ALGO_RHD;
        return DP_ALGO_DIRECT;
    }
    return bytes < ((size_t)256 << 10) ? DP_ALGO_RHD : DP_ALGO_RING;
}

/* ---- communicators ---------------------------------------------------------------------- */

struct dp_comm_params dp_comm_default_params(void) {
    struct dp_comm_params p = {0};
    p.timeout_s = 0;
    p.spin_us = -1;
    return p;
}

int dp_comm_backend_available(const char *name) {
    if (!name) return 0;
#ifdef DP_WITH_MPI
    if (strcmp(name, "mpi") == 0) return 1;
#endif
    return strcmp(name, "thread") == 0;
}

int dp_comm_init(struct dp_comm **c, const char *backend, const struct dp_comm_params *params) {
    if (!c) return dp_seterr(DP_EINVAL, "comm: NULL communicator pointer");
    *c = NULL;
    if (!backend) return dp_seterr(DP_EINVAL, "comm: no backend named");
    if (strcmp(backend, "thread") == 0)
        return dp_seterr(DP_EINVAL, "comm: the thread backend's ranks are made with "
                                    "dp_comm_thread_world_init and dp_comm_thread_init");
    struct dp_comm_params p = params ? *params : dp_comm_default_params();
    if (!(p.timeout_s >= 0)) return dp_seterr(DP_EINVAL, "comm: timeout_s %g < 0", p.timeout_s);
    if (strcmp(backend, "mpi") == 0) {
#ifdef DP_WITH_MPI
        return dp__comm_mpi_init(c, &p);
#else
        return dp_seterr(DP_ENOTSUP, "comm: backend 'mpi' was not built in (install openmpi-bin "
                                     "libopenmpi-dev)");
#endif
    }
    if (strcmp(backend, "nccl") == 0)
        return dp_seterr(DP_ENOTSUP, "comm: backend '%s' was not built in", backend);
    return dp_seterr(DP_EINVAL, "comm: unknown backend '%s' (thread, mpi, nccl)", backend);
}

int dp_comm_split_group(struct dp_comm *parent, int color, int key, struct dp_comm **c) {
    if (!c) return dp_seterr(DP_EINVAL, "comm: NULL communicator pointer");
    *c = NULL;
    if (!parent || color < 0) return dp_seterr(DP_EINVAL, "comm: split of %s with color %d", parent ? "a rank" : "no communicator", color);
#ifdef DP_WITH_MPI
    if (!strcmp(parent->ops->name, "mpi")) return dp__comm_mpi_split(parent, color, key, c);
#endif
    (void)key;
    return dp_seterr(DP_ENOTSUP, "comm: backend '%s' makes its groups otherwise (thread: a world of their own, "
                     "dp_comm_thread_world_init)", parent->ops->name);
}

int dp_comm_rank(const struct dp_comm *c) { return c->rank; }
int dp_comm_world(const struct dp_comm *c) { return c->nranks; }
const char *dp_comm_backend_name(const struct dp_comm *c) { return c->ops->name; }

void dp_comm_free(struct dp_comm *c) {
    if (c) c->ops->free(c);
}

int dp_comm_abort(struct dp_comm *c, const char *msg) {
    if (!c) return dp_seterr(DP_EINVAL, "comm: abort on a NULL communicator");
    return c->ops->abort(c, msg ? msg : "(no message)");
}

int dp_comm_status(const struct dp_comm *c) { return c->ops->status(c); }

int dp_comm_kill_job(struct dp_comm *c, int code) {
    if (!c) return dp_seterr(DP_EINVAL, "comm: kill_job on a NULL communicator");
    if (c->ops->kill_job) return c->ops->kill_job(c, code);
    char msg[64];
    snprintf(msg, sizeof msg, "job killed (code %d)", code);
    return c->ops->abort(c, msg);
}

int dp_comm_host_ranks(const struct dp_comm *c, int *local_rank, int *local_size) {
    if (!c || !local_rank || !local_size)
        return dp_seterr(DP_EINVAL, "comm: host_ranks: NULL argument");
    if (c->ops->host_ranks) {
        c->ops->host_ranks(c, local_rank, local_size);
    } else {
        *local_rank = c->rank;
        *local_size = c->nranks;
    }
    return 0;
}

int dp_comm_lost_ranks(const struct dp_comm *c, int *ranks, int max) {
    if (!c || (max > 0 && !ranks)) return dp_seterr(DP_EINVAL, "comm: lost_ranks: NULL argument");
    return c->ops->lost_ranks ? c->ops->lost_ranks(c, ranks, max) : 0;
}

/* ---- dispatch -------------------------------------------------------------------------- */

/* The algorithm an operation runs: AUTO by dp_comm_choose_algo; on the
 * thread backend NATIVE is DIRECT (its own collectives are the direct ones). */
static enum dp_comm_algo resolve_algo(const struct dp_comm *c, enum dp_comm_coll coll, int64_t count,
                                      enum dp_dtype dtype, enum dp_comm_algo algo) {
    if (algo == DP_ALGO_AUTO)
        algo = dp_comm_choose_algo(c->ops->name, coll, c->nranks, (size_t)count * dp_dtype_size(dtype));
    if (algo == DP_ALGO_NATIVE && strcmp(c->ops->name, "thread") == 0) algo = DP_ALGO_DIRECT;
    return algo;
}

int dp_comm_post_supported(const struct dp_comm *c, int64_t count, enum dp_dtype dtype, enum dp_comm_algo algo) {
    return c && strcmp(c->ops->name, "thread") == 0 &&
           resolve_algo(c, DP_COLL_ALLREDUCE, count, dtype, algo) == DP_ALGO_DIRECT;
}

/* Checks the arguments (nothing is started on failure), resolves AUTO, starts. */
static int start_post(struct dp_comm *c, enum dp_comm_coll coll, void *buf, int64_t count,
                      enum dp_dtype dtype, int root, enum dp_comm_algo algo, int blocking,
                      dp_comm_post_fn post, void *post_arg, struct dp_comm_req **req) {
    const char *name = dp_comm_coll_name(coll);
    if (req) *req = NULL;
    if (!c) return dp_seterr(DP_EINVAL, "comm: %s on a NULL communicator", name);
    if (!req) return dp_seterr(DP_EINVAL, "comm: %s: NULL request pointer", name);
    if (count < 0)
        return dp_seterr(DP_EINVAL, "comm: %s: negative count %lld", name, (long long)count);
    if (count > 0 && !buf) return dp_seterr(DP_EINVAL, "comm: %s: NULL buffer", name);
    if ((unsigned)dtype >= DP_DTYPE_COUNT)
        return dp_seterr(DP_EINVAL, "comm: %s: unknown dtype %d", name, (int)dtype);
    if ((unsigned)algo >= DP_ALGO_COUNT)
        return dp_seterr(DP_EINVAL, "comm: %s: unknown algorithm %d", name, (int)algo);
    if (root < 0 || root >= c->nranks)
        return dp_seterr(DP_EINVAL, "comm: %s: root %d out of range 0..%d", name, root,
                         c->nranks - 1);
    if ((size_t)count > SIZE_MAX / 8)
        return dp_seterr(DP_EINVAL, "comm: %s: count %lld too large", name, (long long)count);
    struct dp__op d = {coll, resolve_algo(c, coll, count, dtype, algo), dtype, root, count, buf, post, post_arg};
    /* (the thread backend also refuses a hook in a hierarchical world) */
    if (post && !dp_comm_post_supported(c, count, dtype, algo))
        return dp_seterr(DP_ENOTSUP, "comm: %s with a post hook needs the thread backend's direct "
                         "algorithm (%s backend, %s)", name, c->ops->name, dp_comm_algo_name(d.algo));
    return c->ops->start(c, &d, blocking, req);
}
static int start(struct dp_comm *c, enum dp_comm_coll coll, void *buf, int64_t count, enum dp_dtype dtype,
                 int root, enum dp_comm_algo algo, int blocking, struct dp_comm_req **req) {
    return start_post(c, coll, buf, count, dtype, root, algo, blocking, NULL, NULL, req);
}

int dp_comm_iallreduce(struct dp_comm *c, void *buf, int64_t count, enum dp_dtype dtype,
                       enum dp_comm_algo algo, struct dp_comm_req **req) {
    return start(c, DP_COLL_ALLREDUCE, buf, count, dtype, 0, algo, 0, req);
}
int dp_comm_iallreduce_post(struct dp_comm *c, void *buf, int64_t count, enum dp_dtype dtype,
                            enum dp_comm_algo algo, dp_comm_post_fn post, void *post_arg,
                            struct dp_comm_req **req) {
    if (req) *req = NULL;
    if (!post) return dp_seterr(DP_EINVAL, "comm: allreduce: NULL post hook");
    return start_post(c, DP_COLL_ALLREDUCE, buf, count, dtype, 0, algo, 0, post, post_arg, req);
}
int dp_comm_ireduce_scatter(struct dp_comm *c, void *buf, int64_t count, enum dp_dtype dtype,
                            enum dp_comm_algo algo, struct dp_comm_req **req) {
    return start(c, DP_COLL_REDUCE_SCATTER, buf, count, dtype, 0, algo, 0, req);
}
int dp_comm_iallgather(struct dp_comm *c, void *buf, int64_t count, enum dp_dtype dtype,
                       enum dp_comm_algo algo, struct dp_comm_req **req) {
    return start(c, DP_COLL_ALLGATHER, buf, count, dtype, 0, algo, 0, req);
}
int dp_comm_ibroadcast(struct dp_comm *c, void *buf, int64_t count, enum dp_dtype dtype, int root,
                       enum dp_comm_algo algo, struct dp_comm_req **req) {
    return start(c, DP_COLL_BROADCAST, buf, count, dtype, root, algo, 0, req);
}
int dp_comm_ibarrier(struct dp_comm *c, struct dp_comm_req **req) {
    return start(c, DP_COLL_BARRIER, NULL, 0, DP_DTYPE_F32, 0, DP_ALGO_AUTO, 0, req);
}

int dp_comm_test(struct dp_comm *c, struct dp_comm_req *req, int *done) {
    if (!c || !req || !done) return dp_seterr(DP_EINVAL, "comm: test: NULL argument");
    return c->ops->test(c, req, done);
}
int dp_comm_wait(struct dp_comm *c, struct dp_comm_req *req) {
    if (!c || !req) return dp_seterr(DP_EINVAL, "comm: wait: NULL argument");
    return c->ops->wait(c, req);
}

/* Blocking = start (telling the backend the caller waits at once) + wait. */
static int run(struct dp_comm *c, enum dp_comm_coll coll, void *buf, int64_t count,
               enum dp_dtype dtype, int root, enum dp_comm_algo algo) {
    struct dp_comm_req *req;
    int rc = start(c, coll, buf, count, dtype, root, algo, 1, &req);
    if (rc) return rc;
    return c->ops->wait(c, req);
}

int dp_comm_allreduce(struct dp_comm *c, void *buf, int64_t count, enum dp_dtype dtype,
                      enum dp_comm_algo algo) {
    return run(c, DP_COLL_ALLREDUCE, buf, count, dtype, 0, algo);
}
int dp_comm_reduce_scatter(struct dp_comm *c, void *buf, int64_t count, enum dp_dtype dtype,
                           enum dp_comm_algo algo) {
    return run(c, DP_COLL_REDUCE_SCATTER, buf, count, dtype, 0, algo);
}
int dp_comm_allgather(struct dp_comm *c, void *buf, int64_t count, enum dp_dtype dtype,
                      enum dp_comm_algo algo) {
    return run(c, DP_COLL_ALLGATHER, buf, count, dtype, 0, algo);
}
int dp_comm_broadcast(struct dp_comm *c, void *buf, int64_t count, enum dp_dtype dtype, int root,
                      enum dp_comm_algo algo) {
    return run(c, DP_COLL_BROADCAST, buf, count, dtype, root, algo);
}
int dp_comm_barrier(struct dp_comm *c) {
    return run(c, DP_COLL_BARRIER, NULL, 0, DP_DTYPE_F32, 0, DP_ALGO_AUTO);
}

/* ---- point-to-point messages ----------------------------------------------------------- */

static int msg_args(struct dp_comm *c, const char *what, const void *buf, int64_t bytes, int peer,
                    int any_ok, int tag, struct dp_comm_msg **msg) {
    if (msg) *msg = NULL;
    if (!c) return dp_seterr(DP_EINVAL, "comm: %s on a NULL communicator", what);
    if (!msg) return dp_seterr(DP_EINVAL, "comm: %s: NULL message pointer", what);
    if (bytes < 0) return dp_seterr(DP_EINVAL, "comm: %s: negative length %lld", what, (long long)bytes);
    if (bytes > 0 && !buf) return dp_seterr(DP_EINVAL, "comm: %s: NULL buffer", what);
    if (bytes > INT32_MAX)
        return dp_seterr(DP_EINVAL, "comm: %s: %lld bytes (at most 2^31 - 1 per message)", what,
                         (long long)bytes);
    if (!(any_ok && peer == DP_ANY_SOURCE) && (peer < 0 || peer >= c->nranks))
        return dp_seterr(DP_EINVAL, "comm: %s: rank %d out of range 0..%d", what, peer, c->nranks - 1);
    if (tag < 0 || tag > DP_COMM_TAG_MAX)
        return dp_seterr(DP_EINVAL, "comm: %s: tag %d out of range 0..%d", what, tag, DP_COMM_TAG_MAX);
    if (!c->ops->isend)
        return dp_seterr(DP_ENOTSUP, "comm: %s: the %s backend has no point-to-point messages", what,
                         c->ops->name);
    return 0;
}

int dp_comm_isend(struct dp_comm *c, const void *buf, int64_t bytes, int dest, int tag,
                  struct dp_comm_msg **msg) {
    int rc = msg_args(c, "send", buf, bytes, dest, 0, tag, msg);
    return rc ? rc : c->ops->isend(c, buf, bytes, dest, tag, msg);
}
int dp_comm_irecv(struct dp_comm *c, void *buf, int64_t bytes, int src, int tag,
                  struct dp_comm_msg **msg) {
    int rc = msg_args(c, "recv", buf, bytes, src, 1, tag, msg);
    return rc ? rc : c->ops->irecv(c, buf, bytes, src, tag, msg);
}
int dp_comm_msg_test(struct dp_comm *c, struct dp_comm_msg *msg, int *done) {
    if (!c || !msg || !done) return dp_seterr(DP_EINVAL, "comm: msg_test: NULL argument");
    return c->ops->msg_test(c, msg, done);
}
int dp_comm_msg_wait(struct dp_comm *c, struct dp_comm_msg *msg, int *src, int64_t *bytes) {
    if (!c || !msg) return dp_seterr(DP_EINVAL, "comm: msg_wait: NULL argument");
    return c->ops->msg_wait(c, msg, src, bytes);
}
int dp_comm_msg_cancel(struct dp_comm *c, struct dp_comm_msg *msg) {
    if (!c || !msg) return dp_seterr(DP_EINVAL, "comm: msg_cancel: NULL argument");
    return c->ops->msg_cancel(c, msg);
}
int dp_comm_send(struct dp_comm *c, const void *buf, int64_t bytes, int dest, int tag) {
    struct dp_comm_msg *m;
    int rc = dp_comm_isend(c, buf, bytes, dest, tag, &m);
    return rc ? rc : c->ops->msg_wait(c, m, NULL, NULL);
}
int dp_comm_recv(struct dp_comm *c, void *buf, int64_t bytes, int src, int tag, int *from,
                 int64_t *got) {
    struct dp_comm_msg *m;
    int rc = dp_comm_irecv(c, buf, bytes, src, tag, &m);
    return rc ? rc : c->ops->msg_wait(c, m, from, got);
}
