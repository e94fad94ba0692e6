/*
 * The thread backend: P ranks are threads of one process sharing memory.
 *
 * Shared state (struct dp_comm_world, one per job):
 *   - one slot per rank, on its own cache lines: the rank's progress word
 *     (prog = seq << 24 | mark, see comm_impl.h), the descriptor of its current
 *     operation (count, dtype, algorithm, root, buffer), and a mutex/condvar
 *     pair on which peers sleep while they wait for that rank's progress;
 *   - the abort flag and message.
 * Per rank (struct thread_comm):
 *   - a FIFO of requests and a communication thread that executes them in
 *     issue order, so the worker thread keeps computing (backward) while a
 *     bucket is being reduced.  dp_comm_wait() on a request that has not
 *     started runs it on the calling thread instead (the blocking calls pay no
 *     thread hand-off).  `running` guarantees one operation at a time.
 *
 * Waiting.  A rank waiting for a peer's mark spins for spin_us (checking the
 * abort flag and the deadline; default 10 µs, 1 µs when there are more ranks
 * than CPUs), then sleeps on the peer's condvar.  With caller progress and
 * spin_us left to auto (the trainer's default where the workers fill the
 * cores: each rank's thread has a core of its own and nothing else to run),
 * it spins up to LONG_SPIN_S instead while the thread has its core to itself
 * (core_own): sleeping there leaves the core idle and costs the wake-up, about
 * 90 µs a wait on the 2-core VM (schedstat's run-queue time of a worker over
 * its wake-ups), at 3 to 6 waits a step.  Where other processes want the
 * cores, a spinning rank burns its share of the CPU, so it sleeps at once
 * again.  A rank that
 * sets a mark wakes sleepers only when the slot's waiter count is non-zero.
 * Lost wake-ups are impossible: the waiter increments the count and re-reads
 * prog under the slot mutex (both seq_cst), the setter stores prog and reads
 * the count (both seq_cst), so one of them sees the other; a setter that sees
 * a waiter takes the mutex before broadcasting, i.e. after the waiter slept.
 *
 * Data: buffers are read and written by peers between a mark's release store
 * and the acquire load that observes it; the algorithms' protocols (algo_*.c)
 * say which marks order which accesses.  No OpenMP here.
 *
 * Aborts and peers' buffers.  Once the world is aborted a rank's wait returns
 * at once, possibly while a peer is still summing from that rank's buffer (a
 * peer's reads are bounded by marks only on the success path).  So each rank
 * counts, in its slot's `busy`, the stretches in which it touches peers'
 * buffers, entering them only after raising the count and then finding the
 * world not aborted (both seq_cst); and an operation that ends on an abort,
 * and dp_comm_free, return only once every peer's count is 0 (quiesce).  With
 * the abort flag set first (seq_cst) either the peer sees the abort and never
 * enters, or the waiter sees its count: no peer reads a buffer whose owner
 * has been told its operation is over.
 *
 * Caller progress (params.progress = DP_PROGRESS_CALLER).  A direct
 * all-reduce of a flat world (nonblocking or blocking: all of a world's
 * direct all-reduces take this path, so the ranks of one operation agree on
 * it) is never handed to the communication thread: the rank's own thread
 * advances it inside dp_comm_iallreduce, dp_comm_test and dp_comm_wait, so on a machine with one core per rank the
 * reduction no longer comes from a third thread that preempts a compute
 * thread (which also made the two ranks' compute uneven: whichever core the
 * progress threads ran on fell behind).  The protocol is the direct
 * all-reduce's with owned blocks instead of claimed chunks, cut in phases
 * that never block unless the caller waits:
 *   phase 0 -> 1  publish the descriptor and mark 1 (arrived); at once on start;
 *   phase 1 -> 2  once every rank has mark 1: sum block r (dp_comm_split of the
 *                 count in P; rank order, as every direct all-reduce sums) from
 *                 all P buffers into all P buffers, then mark 2;
 *   phase 2 -> done  once every rank has mark 2 (the end rule: nobody touches
 *                 this rank's buffer any more).
 * Owned blocks, not claims: the rank that arrives second at a bucket would
 * otherwise claim every chunk while its peer computes, and fall behind by the
 * whole reduction; with blocks each rank pays its half, at its own next call.
 * Requests still complete in issue order, one at a time (a rank arrives at
 * operation k+1 only after k is done, which is what keeps the descriptor and
 * peer_buf valid and the world's marks monotonic); the communication thread
 * runs whatever other request is queued once the caller requests before it
 * are done, and a waiter drives the caller requests ahead of its own.  The
 * sum of every element is the same expression as with claims, so the bits
 * are those of the thread-progress path.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/core_impl.h"
#include "comm_impl.h"
#include "dp/core.h"

#define MSG_LEN 512
#define MAX_RANKS 1024

/* ---- shared state --------------------------------------------------------------------------- */

/* A point-to-point message in the receiver's mailbox: the bytes, copied by
 * the sender (eager), so a send completes as soon as it is posted. */
struct envelope {
    struct envelope *next;
    int src, tag;
    int64_t bytes;
    char data[];
};

struct slot {
    /* The two words every peer polls get 128 bytes to themselves (a pair of
     * cache lines, as adjacent-line prefetchers see them); dp_calloc gives
     * 64-byte alignment. */
    _Alignas(64) atomic_uint_least64_t prog; /* seq << 24 | mark; 0 before the first op */
    atomic_int nwait;                        /* sleepers on cv */
    char pad[128 - sizeof(atomic_uint_least64_t) - sizeof(atomic_int)];
    struct dp__op desc[2];                    /* of request n in desc[n & 1] (desc_of): written
                                                 before mark 1, by the owner only */
    atomic_int busy;                          /* this rank's threads inside a stretch that
                                                 touches peers' buffers ("Aborts and peers'
                                                 buffers") */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int present;                              /* rank initialised (under world mu) */
    /* point-to-point: the messages sent to this rank and not yet received,
     * in arrival order (under mb_mu; mb_cv: a message arrived, or abort) */
    pthread_mutex_t mb_mu;
    pthread_cond_t mb_cv;
    struct envelope *mb_head, *mb_tail;
};

struct dp_comm_world {
    int nranks;            /* ranks (threads) of this process */
    struct dp_comm *inter; /* hierarchical world: the process-level communicator, else NULL */
    int proc, nprocs;      /* this process's rank in inter and their number (0, 1 if flat) */
    struct dp_comm_params params;
    double spin_s;
    int long_spin;         /* spin up to LONG_SPIN_S while the core is the thread's own */
    atomic_int aborted;    /* 0, then 1 once; abort_msg is final before it is set */
    _Alignas(64) atomic_uint_least64_t claim; /* dp__coll_claim: seq << 32 | next chunk */
    char claim_pad[64 - sizeof(atomic_uint_least64_t)];
    pthread_mutex_t mu;    /* abort_msg (first writer), presence */
    char abort_msg[MSG_LEN];
    int nlive;             /* ranks initialised and not freed (under mu) */
    struct slot *slots;    /* (P) */
};

enum { REQ_QUEUED, REQ_RUNNING, REQ_DONE };

struct dp_comm_req {
    struct dp_comm_req *next;     /* queue or free list */
    struct dp_comm_req *all_next; /* every request this rank allocated */
    struct dp__op d;
    uint64_t seq;
    int state; /* under the rank's mu */
    int caller;      /* advanced by the owner's calls ("Caller progress"); fixed at start */
    int phase;       /* caller: 0 queued, 1 arrived, 2 own block summed, 3 finished (rc
                        set; owner only) */
    double deadline; /* caller: the timeout's deadline, from arrival; 0 = none */
    int rc;
    char msg[MSG_LEN];
};

struct thread_comm {
    struct dp_comm base;
    struct dp_comm_world *w;
    pthread_t thread;
    pthread_mutex_t mu;       /* everything below */
    pthread_cond_t cv_work;   /* comm thread: queue non-empty and nothing running, or stop */
    pthread_cond_t cv_done;   /* waiters: a request finished or `running` dropped */
    struct dp_comm_req *head, *tail, *freelist, *all;
    int running, stop, npending;
    uint64_t next_seq;        /* issue order, from 1 */
    int local;                /* this rank's slot (thread index in this process) */
    char **peer_buf;          /* (P) scratch for the executing operation */
};

/* ---- abort ---------------------------------------------------------------------------------- */

/* Sets the abort message (first caller wins), raises the flag, wakes every
 * sleeper of every slot.  Returns DP_ECANCELED with the world's message set on
 * this thread. */
static int world_abort(struct dp_comm_world *w, const char *msg) {
    pthread_mutex_lock(&w->mu);
    if (!atomic_load(&w->aborted)) {
        snprintf(w->abort_msg, sizeof w->abort_msg, "%s", msg);
        atomic_store(&w->aborted, 1);
    }
    pthread_mutex_unlock(&w->mu);
    for (int r = 0; r < w->nranks; r++) {
        pthread_mutex_lock(&w->slots[r].mu);
        pthread_cond_broadcast(&w->slots[r].cv);
        pthread_mutex_unlock(&w->slots[r].mu);
        pthread_mutex_lock(&w->slots[r].mb_mu);
        pthread_cond_broadcast(&w->slots[r].mb_cv);
        pthread_mutex_unlock(&w->slots[r].mb_mu);
    }
    return dp_seterr(DP_ECANCELED, "%s", w->abort_msg);
}

static int world_status(const struct dp_comm_world *w) {
    if (!atomic_load_explicit(&w->aborted, memory_order_acquire)) return 0;
    return dp_seterr(DP_ECANCELED, "%s", w->abort_msg);
}

/* Enters a stretch that touches peers' buffers: 0, or the abort's error
 * (then not entered).  seq_cst both ways, see the file comment. */
static int touch_begin(struct dp_comm_world *w, int local) {
    atomic_fetch_add(&w->slots[local].busy, 1);
    if (!atomic_load(&w->aborted)) return 0;
    atomic_fetch_sub(&w->slots[local].busy, 1);
    return world_status(w);
}

static void touch_end(struct dp_comm_world *w, int local) {
    atomic_fetch_sub(&w->slots[local].busy, 1);
}

/* After an abort: returns once no other rank of the world is inside a
 * stretch that touches peers' buffers.  None can enter one any more, and the
 * ones inside leave within a bounded time (their waits fail at once on the
 * abort), so this ends. */
static void quiesce(struct dp_comm_world *w, int local) {
    if (!atomic_load(&w->aborted)) return;
    for (int r = 0; r < w->nranks; r++)
        while (r != local && atomic_load(&w->slots[r].busy) > 0) sched_yield();
}

/* ---- the step-flag layer ------------------------------------------------------------------ */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* The long spin ("Waiting" in the file comment).  core_own: 1 while the
 * calling thread waited in the run queue for less than CORE_BUSY of the
 * last CORE_WINDOW_S (measured at most once a window, from the kernel's
 * schedstat, per thread): a thread alone on its core waits there only for its
 * wake-ups and the odd kernel or loader thread (about 12% measured on the
 * 2-core VM while sleeping at every wait, 0.3 to 10% while spinning), one
 * sharing its core with a busy process for 31 to 57% of most windows.  0 until the first
 * window has been measured, on a communication thread (it shares its rank's
 * core), and where the kernel does not say. */
#define LONG_SPIN_S 2e-3
#define CORE_WINDOW_S 0.05
#define CORE_BUSY 0.25
static _Thread_local struct { double t, runq; int own, off; } core_watch;

int dp__comm_core_own(double now) {
    if (core_watch.off) return 0;
    if (core_watch.t == 0 || now - core_watch.t >= CORE_WINDOW_S) {
        double run, runq;
        if (dp_thread_sched_times(&run, &runq)) {
            core_watch.off = 1;
            return 0;
        }
        if (core_watch.t > 0) core_watch.own = runq - core_watch.runq < CORE_BUSY * (now - core_watch.t);
        core_watch.t = now, core_watch.runq = runq;
    }
    return core_watch.own;
}

/* Step-flag sequence numbers per request: stage k of request n uses
 * n * SUBOPS + k (the hierarchical world runs up to two local stages). */
#define SUBOPS 4u

/* Global rank of local slot r. */
static int grank(const struct dp_comm_world *w, int r) { return w->proc * w->nranks + r; }

/* After a timeout: names the ranks that have not arrived at this operation
 * (or, if all have, the one this rank waited for), then aborts the world. */
static int timed_out(struct dp__coll *op, int peer, unsigned mark) {
    struct dp_comm_world *w = op->world;
    char msg[MSG_LEN], list[MSG_LEN] = "";
    size_t n = 0;
    int missing = 0;
    uint64_t arrived = op->seq << 24 | DP__MARK_ARRIVED;
    for (int r = 0; r < w->nranks && n < sizeof list - 16; r++) {
        if (atomic_load(&w->slots[r].prog) >= arrived) continue;
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%d", missing ? ", " : "", grank(w, r));
        missing++;
    }
    if (missing)
        snprintf(msg, sizeof msg, "comm: timeout after %.3g s in %s #%llu on rank %d: rank%s %s "
                 "did not arrive", w->params.timeout_s, dp_comm_coll_name(op->d.coll),
                 (unsigned long long)(op->seq / SUBOPS), grank(w, op->rank), missing > 1 ? "s" : "",
                 list);
    else
        snprintf(msg, sizeof msg, "comm: timeout after %.3g s in %s #%llu on rank %d: rank %d "
                 "did not reach step %u", w->params.timeout_s, dp_comm_coll_name(op->d.coll),
                 (unsigned long long)(op->seq / SUBOPS), grank(w, op->rank), grank(w, peer), mark);
    return world_abort(w, msg);
}

int dp__coll_wait(struct dp__coll *op, int peer, unsigned mark) {
    struct dp_comm_world *w = op->world;
    struct slot *s = &w->slots[peer];
    uint64_t want = op->seq << 24 | mark;
    if (atomic_load_explicit(&s->prog, memory_order_acquire) >= want) return 0;
    /* Spin for spin_s, then sleep.  Spinning is kept short on purpose: CPU
     * time burnt here is charged to this thread by the scheduler (CFS), so on
     * a shared machine long spins get the rank preempted in the middle of its
     * next reduction (one measurement: 64 MiB, 2 ranks, a busy neighbour
     * process: median 14 GB/s busbw with 0 µs spins, 11 with 20, 8 with 50), and the
     * communication thread of a rank shares a core with its compute thread. */
    double now = dp_time();
    double spin_end = now + (w->long_spin && dp__comm_core_own(now) ? LONG_SPIN_S : w->spin_s);
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(&s->prog, memory_order_acquire) >= want) return 0;
        if (atomic_load_explicit(&w->aborted, memory_order_relaxed)) return world_status(w);
        if ((i & 31) == 0) {
            now = dp_time();
            if (op->deadline > 0 && now >= op->deadline) return timed_out(op, peer, mark);
            if (now >= spin_end) break;
        }
        cpu_relax();
    }
    /* Sleep. */
    int late = 0;
    pthread_mutex_lock(&s->mu);
    atomic_fetch_add(&s->nwait, 1);
    while (atomic_load(&s->prog) < want && !atomic_load(&w->aborted)) {
        if (op->deadline > 0) {
            if (dp_cond_wait_until(&s->cv, &s->mu, op->deadline) == ETIMEDOUT &&
                atomic_load(&s->prog) < want) {
                late = 1;
                break;
            }
        } else {
            pthread_cond_wait(&s->cv, &s->mu);
        }
    }
    atomic_fetch_sub(&s->nwait, 1);
    pthread_mutex_unlock(&s->mu);
    /* Acquire what the peer published (the loads above under the mutex are
     * seq_cst, which includes acquire; re-read for clarity). */
    if (atomic_load_explicit(&s->prog, memory_order_acquire) >= want) return 0;
    if (atomic_load(&w->aborted)) return world_status(w);
    if (late) return timed_out(op, peer, mark);
    return dp_seterr(DP_EINTERNAL, "comm: spurious end of wait");
}

int dp__coll_wait_all(struct dp__coll *op, unsigned mark) {
    for (int k = 1; k < op->nranks; k++) {
        int rc = dp__coll_wait(op, (op->rank + k) % op->nranks, mark);
        if (rc) return rc;
    }
    return 0;
}

void dp__coll_mark(struct dp__coll *op, unsigned mark) {
    DP_ASSERT(mark >= 1 && mark <= DP__MARK_MAX);
    struct slot *s = &op->world->slots[op->rank];
    atomic_store(&s->prog, op->seq << 24 | mark); /* seq_cst: see the file comment */
    if (atomic_load(&s->nwait) > 0) {
        pthread_mutex_lock(&s->mu);
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
}

int64_t dp__coll_claim(struct dp__coll *op, int64_t nchunks) {
    atomic_uint_least64_t *c = &op->world->claim;
    uint64_t seq = op->seq & 0xffffffffu;
    uint64_t v = atomic_load_explicit(c, memory_order_relaxed);
    for (;;) {
        /* A counter left by an earlier operation (older seq) means chunk 0. */
        uint64_t next = (v >> 32) == seq ? (v & 0xffffffffu) : 0;
        if ((int64_t)next >= nchunks) return -1;
        if (atomic_compare_exchange_weak_explicit(c, &v, seq << 32 | (next + 1),
                                                  memory_order_relaxed, memory_order_relaxed))
            return (int64_t)next;
    }
}

static void describe(char *out, size_t n, const struct dp__op *d) {
    int k = snprintf(out, n, "%s(count %lld, %s, %s", dp_comm_coll_name(d->coll),
                     (long long)d->count, dp_dtype_name(d->dtype), dp_comm_algo_name(d->algo));
    if (k > 0 && (size_t)k < n && d->coll == DP_COLL_BROADCAST)
        k += snprintf(out + k, n - (size_t)k, ", root %d", d->root);
    if (k > 0 && (size_t)k < n) snprintf(out + k, n - (size_t)k, ")");
}

/* Rank r's descriptor of the operation with step-flag sequence number seq:
 * two per rank, by the request number's parity, because with caller progress
 * a rank publishes request n+1 while its peers may still be reading request
 * n's (never n-1's: n+1 arrives only once n-1 is complete). */
static struct dp__op *desc_of(struct dp_comm_world *w, int r, uint64_t seq) {
    return &w->slots[r].desc[(seq / SUBOPS) & 1];
}

int dp__coll_peer(struct dp__coll *op, int peer, char **buf) {
    int rc = dp__coll_wait(op, peer, DP__MARK_ARRIVED);
    if (rc) return rc;
    /* The peer wrote desc before its mark 1 and rewrites it only for its next
     * operation, which it starts after this rank's last access to its buffer
     * (the end rule), so this read is ordered both ways. */
    const struct dp__op *pd = desc_of(op->world, peer, op->seq);
    if (pd->coll != op->d.coll || pd->count != op->d.count || pd->dtype != op->d.dtype ||
        pd->algo != op->d.algo || pd->root != op->d.root) {
        char mine[160], theirs[160], msg[MSG_LEN];
        describe(mine, sizeof mine, &op->d);
        describe(theirs, sizeof theirs, pd);
        snprintf(msg, sizeof msg,
                 "comm: operation #%llu differs between ranks: rank %d issued %s but rank %d "
                 "issued %s", (unsigned long long)(op->seq / SUBOPS), grank(op->world, op->rank), mine,
                 grank(op->world, peer), theirs);
        world_abort(op->world, msg);
        return dp_seterr(DP_EMISMATCH, "%s", msg);
    }
    *buf = pd->buf;
    op->peer_buf[peer] = pd->buf;
    return 0;
}

/* ---- executing one operation ---------------------------------------------------------------- */

static const dp__algo_fn algos[DP_COLL_COUNT][DP_ALGO_COUNT] = {
    [DP_COLL_ALLREDUCE] = {NULL, dp__allreduce_ring, dp__allreduce_rhd, dp__allreduce_direct},
    [DP_COLL_REDUCE_SCATTER] = {NULL, dp__reduce_scatter_ring, dp__reduce_scatter_rhd,
                                dp__reduce_scatter_direct},
    [DP_COLL_ALLGATHER] = {NULL, dp__allgather_ring, dp__allgather_rhd, dp__allgather_direct},
    [DP_COLL_BROADCAST] = {NULL, dp__broadcast_ring, dp__broadcast_rhd, dp__broadcast_direct},
    [DP_COLL_BARRIER] = {NULL, dp__barrier_direct, dp__barrier_direct, dp__barrier_direct},
};

/* One collective among this process's ranks: step-flag sequence number
 * `seq`, operation d (this rank's buffer).  With `timed` the world's timeout
 * applies. */
static int local_stage(struct thread_comm *tc, uint64_t seq, const struct dp__op *d, int timed) {
    struct dp_comm_world *w = tc->w;
    struct dp__coll op = {w, tc->local, w->nranks, seq, *d, dp_dtype_size(d->dtype), 0, tc->peer_buf};
    int rc = touch_begin(w, tc->local);
    if (rc) return rc;
    if (timed && w->params.timeout_s > 0) op.deadline = dp_time() + w->params.timeout_s;
    *desc_of(w, tc->local, seq) = *d;
    tc->peer_buf[tc->local] = d->buf;
    dp__coll_mark(&op, DP__MARK_ARRIVED);
    rc = algos[d->coll][d->algo](&op);
    touch_end(w, tc->local);
    return rc;
}

/* The leader's stage on `inter`: a failure there aborts this process's
 * world too, so the local ranks waiting for the leader return at once. */
static int inter_stage(struct thread_comm *tc, int rc) {
    if (!rc) return 0;
    char msg[MSG_LEN];
    snprintf(msg, sizeof msg, "%s", dp_errmsg()[0] ? dp_errmsg() : dp_strerror(rc));
    world_abort(tc->w, msg);
    return dp_seterr(rc, "%s", msg);
}

/* A request in a hierarchical world (see dp_comm_thread_world_init_hier in
 * comm.h): local stage 0 (timed), the leader's stage on `inter` (timed by
 * inter's own timeout), local stage 1.  Stage 1 has no timeout of its own:
 * the ranks there wait only for their leader, whose inter stage either
 * completes or fails and aborts this world. */
static int hier_execute(struct thread_comm *tc, const struct dp_comm_req *rq) {
    struct dp_comm_world *w = tc->w;
    struct dp__op d = rq->d, loc = rq->d;
    uint64_t s = rq->seq * SUBOPS;
    int T = w->nranks, leader = tc->local == 0, rc = 0, gather = 0;
    enum dp_comm_algo ia = d.algo == DP_ALGO_DIRECT ? DP_ALGO_AUTO : d.algo;
    loc.algo = DP_ALGO_DIRECT;
    switch (d.coll) {
    case DP_COLL_ALLGATHER: {
        /* only this rank's block is non-zero; the local sum assembles this
         * process's blocks in the leader's buffer */
        int64_t off, len, poff, plen;
        size_t es = dp_dtype_size(d.dtype);
        int G = tc->base.nranks, R = G / T;
        dp_comm_split(d.count, G, tc->base.rank, &off, &len);
        memset(d.buf, 0, (size_t)off * es);
        memset((char *)d.buf + (size_t)(off + len) * es, 0, (size_t)(d.count - off - len) * es);
        /* When each process's blocks together are exactly inter's block of
         * that process (always with one rank per process, the flat MPI job;
         * with T ranks when the split lines up, e.g. count a multiple of the
         * world), the leaders' stage is inter's own all-gather: each process
         * moves (R-1)/R of the bytes each way, as an all-gather is accounted,
         * and the bits of the other processes' blocks arrive as sent.
         * Otherwise the leaders all-reduce the zero-padded vector: twice
         * those bytes. */
        gather = 1;
        for (int p = 0; gather && p < R; p++) {
            dp_comm_split(d.count, G, p * T, &off, &len);
            dp_comm_split(d.count, R, p, &poff, &plen);
            gather = off == poff;
        }
    } /* fall through */
    case DP_COLL_ALLREDUCE:
    case DP_COLL_REDUCE_SCATTER:
        loc.coll = DP_COLL_ALLREDUCE;
        if (T > 1) rc = local_stage(tc, s, &loc, 1);
        if (!rc && leader)
            rc = inter_stage(tc, gather ? dp_comm_allgather(w->inter, d.buf, d.count, d.dtype, ia)
                                        : dp_comm_allreduce(w->inter, d.buf, d.count, d.dtype, ia));
        loc.coll = DP_COLL_BROADCAST, loc.root = 0;
        if (!rc && T > 1) rc = local_stage(tc, s + 1, &loc, 0);
        return rc;
    case DP_COLL_BROADCAST: {
        int rp = d.root / T;
        loc.root = d.root % T; /* in the root's process, from the root thread to its leader */
        if (T > 1 && w->proc == rp) rc = local_stage(tc, s, &loc, 1);
        if (!rc && leader)
            rc = inter_stage(tc, dp_comm_broadcast(w->inter, d.buf, d.count, d.dtype, rp, ia));
        loc.root = 0;
        if (!rc && T > 1 && w->proc != rp) rc = local_stage(tc, s + 1, &loc, 0);
        return rc;
    }
    case DP_COLL_BARRIER:
    default:
        if (T > 1) rc = local_stage(tc, s, &loc, 1);
        if (!rc && leader) rc = inter_stage(tc, dp_comm_barrier(w->inter));
        if (!rc && T > 1) rc = local_stage(tc, s + 1, &loc, 0);
        return rc;
    }
}

/* Runs rq on the calling thread (comm thread or a waiter); only one thread per
 * rank gets here at a time (`running`). */
static void execute(struct thread_comm *tc, struct dp_comm_req *rq) {
    dp_clearerr();
    int rc = tc->w->inter ? hier_execute(tc, rq) : local_stage(tc, rq->seq * SUBOPS, &rq->d, 1);
    rq->rc = rc;
    if (rc) snprintf(rq->msg, sizeof rq->msg, "%s", dp_errmsg()[0] ? dp_errmsg() : dp_strerror(rc));
}

/* Marks rq done; called with tc->mu held. */
static void finish(struct thread_comm *tc, struct dp_comm_req *rq) {
    rq->state = REQ_DONE;
    tc->running = 0;
    pthread_cond_broadcast(&tc->cv_done);
    if (tc->head) pthread_cond_signal(&tc->cv_work);
}

static struct dp_comm_req *pop(struct thread_comm *tc) {
    struct dp_comm_req *rq = tc->head;
    tc->head = rq->next;
    if (!tc->head) tc->tail = NULL;
    rq->next = NULL;
    rq->state = REQ_RUNNING;
    tc->running = 1;
    return rq;
}

/* The communication thread may take the head request (caller requests are the owner's). */
static int runnable(const struct thread_comm *tc) { return tc->head && !tc->running && !tc->head->caller; }

static void *comm_thread_main(void *arg) {
    struct thread_comm *tc = arg;
    core_watch.off = 1; /* it shares a core with its rank's compute: no long spin */
    pthread_mutex_lock(&tc->mu);
    for (;;) {
        while (!tc->stop && !runnable(tc)) pthread_cond_wait(&tc->cv_work, &tc->mu);
        if (!runnable(tc)) break; /* stop, nothing runnable */
        struct dp_comm_req *rq = pop(tc);
        pthread_mutex_unlock(&tc->mu);
        execute(tc, rq);
        pthread_mutex_lock(&tc->mu);
        finish(tc, rq);
    }
    pthread_mutex_unlock(&tc->mu);
    return NULL;
}

/* ---- caller progress (see the file comment) ------------------------------------------------- */

/* 1 when every peer's progress word has reached `mark` of op, or when the
 * world is aborted or the deadline has passed (then the blocking wait that
 * follows returns the error at once). */
static int all_marked(const struct dp__coll *op, unsigned mark) {
    struct dp_comm_world *w = op->world;
    if (atomic_load_explicit(&w->aborted, memory_order_relaxed)) return 1;
    if (op->deadline > 0 && dp_time() >= op->deadline) return 1;
    uint64_t want = op->seq << 24 | mark;
    for (int k = 1; k < op->nranks; k++)
        if (atomic_load_explicit(&w->slots[(op->rank + k) % op->nranks].prog, memory_order_acquire) < want)
            return 0;
    return 1;
}

/* Moves caller request rq on as far as it goes without blocking, but not
 * past phase `upto` (2: its own block summed; 3: finished); with `block`, to
 * the end.  Runs on the owner's thread without tc->mu, with tc->running set.
 * Returns 1 when rq is finished (rq->rc set), else 0. */
static int caller_step(struct thread_comm *tc, struct dp_comm_req *rq, int upto, int block) {
    struct dp_comm_world *w = tc->w;
    struct dp__coll op = {w, tc->local, w->nranks, rq->seq * SUBOPS, rq->d, dp_dtype_size(rq->d.dtype),
                          rq->deadline, tc->peer_buf};
    int rc = 0;
    if (rq->phase == 3) return 1;
    if (rq->phase == 0) {
        if ((rc = world_status(w))) goto out;
        if (w->params.timeout_s > 0) op.deadline = rq->deadline = dp_time() + w->params.timeout_s;
        *desc_of(w, tc->local, op.seq) = rq->d;
        tc->peer_buf[tc->local] = rq->d.buf;
        dp__coll_mark(&op, DP__MARK_ARRIVED);
        rq->phase = 1;
    }
    if (rq->phase == 1) {
        if (!block && !all_marked(&op, DP__MARK_ARRIVED)) return 0;
        if ((rc = touch_begin(w, tc->local))) goto out;
        for (int k = 1; k < op.nranks && !rc; k++) {
            char *b;
            rc = dp__coll_peer(&op, (op.rank + k) % op.nranks, &b);
        }
        if (!rc) {
            size_t off, len;
            dp__block(&op, op.nranks, op.rank, &off, &len);
            if (len && op.nranks > 1)
                dp__reduce_sum_to(op.peer_buf, op.nranks, op.peer_buf, op.nranks, off,
                                  (int64_t)(len / op.esize), op.d.dtype);
            if (len && op.d.post) op.d.post(op.d.post_arg, (int64_t)(off / op.esize), (int64_t)(len / op.esize));
            dp__coll_mark(&op, 2);
            rq->phase = 2;
        }
        touch_end(w, tc->local);
        if (rc) goto out;
    }
    if (upto < 3 || (!block && !all_marked(&op, 2))) return 0;
    rc = dp__coll_wait_all(&op, 2);
out:
    rq->rc = rc;
    rq->phase = 3;
    if (rc) snprintf(rq->msg, sizeof rq->msg, "%s", dp_errmsg());
    return 1;
}

/* Advances the caller requests at the head of the queue, in issue order: as
 * far as they go without blocking, or (until != NULL) to the end of each one
 * up to `until` or the first request that is not a caller request.  Once the
 * head has summed its block, the request after it may arrive and sum its own
 * (phases 0-2) before the head completes, so a rank that waits for the end of
 * bucket k has already published bucket k+1: one round of waiting per bucket
 * instead of two.  A request completes only at the head.  Called by the
 * owner's thread with tc->mu held. */
static void caller_advance(struct thread_comm *tc, const struct dp_comm_req *until) {
    while (tc->head && tc->head->caller && !tc->running) {
        struct dp_comm_req *rq = tc->head, *nx = rq->next;
        tc->running = 1;
        pthread_mutex_unlock(&tc->mu);
        int done = caller_step(tc, rq, 3, 0);
        if (!done && rq->phase == 2 && nx && nx->caller) caller_step(tc, nx, 2, 0);
        if (!done && until) done = caller_step(tc, rq, 3, 1);
        pthread_mutex_lock(&tc->mu);
        if (!done) {
            tc->running = 0;
            break;
        }
        tc->head = rq->next;
        if (!tc->head) tc->tail = NULL;
        rq->next = NULL;
        finish(tc, rq); /* wakes the communication thread if a request of its own is next */
        if (rq == until) break;
    }
}

/* ---- the ops table -------------------------------------------------------------------------- */

static int t_start(struct dp_comm *c, const struct dp__op *d, int blocking,
                   struct dp_comm_req **req) {
    struct thread_comm *tc = (struct thread_comm *)c;
    int rc = world_status(tc->w);
    if (rc) return rc;
    if (d->post && tc->w->inter) /* the local stage's result is not yet the world's sum */
        return dp_seterr(DP_ENOTSUP, "comm: allreduce with a post hook in a hierarchical (processes x "
                         "threads) world");
    pthread_mutex_lock(&tc->mu);
    struct dp_comm_req *rq = tc->freelist;
    if (rq) {
        tc->freelist = rq->next;
    } else {
        rq = dp_malloc(sizeof *rq);
        if (!rq) {
            pthread_mutex_unlock(&tc->mu);
            return dp_seterr(DP_ENOMEM, "comm: rank %d: out of memory for a request", c->rank);
        }
        rq->all_next = tc->all;
        tc->all = rq;
    }
    struct dp_comm_req *all_next = rq->all_next;
    memset(rq, 0, sizeof *rq);
    rq->all_next = all_next;
    rq->d = *d;
    rq->seq = ++tc->next_seq;
    rq->state = REQ_QUEUED;
    /* blocking ones too: one op's ranks must all sum owned blocks (a rank
     * that claimed chunks could re-add a block its peer already summed) */
    rq->caller = tc->w->params.progress == DP_PROGRESS_CALLER && !tc->w->inter &&
                 d->coll == DP_COLL_ALLREDUCE && d->algo == DP_ALGO_DIRECT;
    if (tc->tail) tc->tail->next = rq;
    else tc->head = rq;
    tc->tail = rq;
    tc->npending++;
    /* A blocking caller runs the operation itself in t_wait when it is first in
     * line; a caller request arrives now (and sums its block if every peer is
     * there); otherwise hand it to the communication thread now. */
    if (rq->caller) caller_advance(tc, NULL);
    else if (!tc->running && !(blocking && tc->head == rq)) pthread_cond_signal(&tc->cv_work);
    pthread_mutex_unlock(&tc->mu);
    *req = rq;
    return 0;
}

static int t_test(struct dp_comm *c, struct dp_comm_req *req, int *done) {
    struct thread_comm *tc = (struct thread_comm *)c;
    pthread_mutex_lock(&tc->mu);
    caller_advance(tc, NULL);
    *done = req->state == REQ_DONE;
    pthread_mutex_unlock(&tc->mu);
    return 0;
}

static int t_wait(struct dp_comm *c, struct dp_comm_req *req) {
    struct thread_comm *tc = (struct thread_comm *)c;
    pthread_mutex_lock(&tc->mu);
    while (req->state != REQ_DONE) {
        /* the caller requests ahead of req (or req itself) run on this thread */
        if (tc->head && tc->head->caller && !tc->running) {
            caller_advance(tc, req);
            continue;
        }
        if (req->state == REQ_QUEUED && tc->head == req && !tc->running) {
            pop(tc);
            pthread_mutex_unlock(&tc->mu);
            execute(tc, req);
            pthread_mutex_lock(&tc->mu);
            finish(tc, req);
            break;
        }
        pthread_cond_wait(&tc->cv_done, &tc->mu);
    }
    int rc = req->rc;
    if (rc) dp_seterr(rc, "%s", req->msg);
    req->next = tc->freelist;
    tc->freelist = req;
    tc->npending--;
    pthread_mutex_unlock(&tc->mu);
    if (rc) quiesce(tc->w, tc->local); /* the caller may free the buffer once this returns */
    return rc;
}

static int t_abort(struct dp_comm *c, const char *msg) {
    struct thread_comm *tc = (struct thread_comm *)c;
    char full[MSG_LEN];
    snprintf(full, sizeof full, "rank %d aborted: %s", c->rank, msg);
    return world_abort(tc->w, full);
}

static int t_status(const struct dp_comm *c) {
    return world_status(((const struct thread_comm *)c)->w);
}

static void t_free(struct dp_comm *c) {
    struct thread_comm *tc = (struct thread_comm *)c;
    struct dp_comm_world *w = tc->w;
    pthread_mutex_lock(&tc->mu);
    int pending = tc->npending;
    pthread_mutex_unlock(&tc->mu);
    if (pending) {
        char msg[MSG_LEN];
        snprintf(msg, sizeof msg, "rank %d aborted: communicator freed with %d operation%s pending",
                 c->rank, pending, pending > 1 ? "s" : "");
        world_abort(w, msg);
    }
    pthread_mutex_lock(&tc->mu);
    tc->stop = 1;
    pthread_cond_broadcast(&tc->cv_work);
    pthread_mutex_unlock(&tc->mu);
    pthread_join(tc->thread, NULL);
    /* Requests not waited for: their buffers may go once this returns. */
    quiesce(w, tc->local);
    /* The comm thread has run (and, aborted, failed fast) every queued
     * operation; release every request, waited for or not. */
    for (struct dp_comm_req *rq = tc->all, *nx; rq; rq = nx) nx = rq->all_next, dp_free(rq);
    pthread_mutex_destroy(&tc->mu);
    pthread_cond_destroy(&tc->cv_work);
    pthread_cond_destroy(&tc->cv_done);
    pthread_mutex_lock(&w->mu);
    w->slots[tc->local].present = 0;
    w->nlive--;
    pthread_mutex_unlock(&w->mu);
    dp_free(tc->peer_buf);
    dp_free(tc);
}

/* The ranks of this host: this process's threads, times the processes of
 * `inter` on this host in a hierarchical world. */
static void t_host_ranks(const struct dp_comm *c, int *local_rank, int *local_size) {
    const struct thread_comm *tc = (const struct thread_comm *)c;
    int pr = 0, ps = 1;
    if (tc->w->inter) dp_comm_host_ranks(tc->w->inter, &pr, &ps);
    *local_rank = pr * tc->w->nranks + tc->local;
    *local_size = ps * tc->w->nranks;
}

/* kill_job: NULL, i.e. dp_comm_abort (the process's ranks are all there is). */
/* ---- point-to-point messages --------------------------------------------------------------- */

/* Protocol: a send copies its bytes into an envelope and appends it to the
 * destination slot's mailbox (mb_mu), waking the receiver (mb_cv); it is
 * complete at once.  A receive scans its own mailbox for the first envelope
 * from src (or any rank) with its tag: arrival order per mailbox keeps the
 * messages of one sender and tag in sending order.  Aborts broadcast every
 * mb_cv, so a blocked receive never outlives an abort. */
struct dp_comm_msg {
    int send, done, rc;
    void *buf;
    int64_t cap, got;
    int src, tag, from;
    char err[MSG_LEN];
};

static struct dp_comm_msg *new_msg(int send, void *buf, int64_t cap, int src, int tag) {
    struct dp_comm_msg *m = dp_calloc(1, sizeof *m);
    if (m) m->send = send, m->buf = buf, m->cap = cap, m->src = src, m->tag = tag, m->from = -1;
    return m;
}

static int t_isend(struct dp_comm *c, const void *buf, int64_t bytes, int dest, int tag,
                   struct dp_comm_msg **msg) {
    struct thread_comm *tc = (struct thread_comm *)c;
    struct dp_comm_world *w = tc->w;
    if (w->inter)
        return dp_seterr(DP_ENOTSUP, "comm: send: point-to-point messages are not available in a "
                                     "hierarchical (processes x threads) world");
    int rc = world_status(w);
    if (rc) return rc;
    struct dp_comm_msg *m = new_msg(1, (void *)buf, bytes, dest, tag);
    struct envelope *e = dp_malloc(sizeof *e + (size_t)bytes);
    if (!m || !e) {
        dp_free(m), dp_free(e);
        return dp_seterr(DP_ENOMEM, "comm: send: out of memory for %lld bytes", (long long)bytes);
    }
    e->next = NULL, e->src = c->rank, e->tag = tag, e->bytes = bytes;
    if (bytes) memcpy(e->data, buf, (size_t)bytes);
    struct slot *s = &w->slots[dest];
    pthread_mutex_lock(&s->mb_mu);
    if (s->mb_tail) s->mb_tail->next = e;
    else s->mb_head = e;
    s->mb_tail = e;
    pthread_cond_broadcast(&s->mb_cv);
    pthread_mutex_unlock(&s->mb_mu);
    m->done = 1, m->got = bytes, m->from = c->rank;
    *msg = m;
    return 0;
}

static int t_irecv(struct dp_comm *c, void *buf, int64_t bytes, int src, int tag,
                   struct dp_comm_msg **msg) {
    struct thread_comm *tc = (struct thread_comm *)c;
    if (tc->w->inter)
        return dp_seterr(DP_ENOTSUP, "comm: recv: point-to-point messages are not available in a "
                                     "hierarchical (processes x threads) world");
    int rc = world_status(tc->w);
    if (rc) return rc;
    struct dp_comm_msg *m = new_msg(0, buf, bytes, src, tag);
    if (!m) return dp_seterr(DP_ENOMEM, "comm: recv: out of memory");
    *msg = m;
    return 0;
}

/* Takes the first matching envelope out of the mailbox (mb_mu held) and
 * completes m with it.  1 if one was found. */
static int take(struct thread_comm *tc, struct slot *s, struct dp_comm_msg *m) {
    struct envelope *prev = NULL, *e = s->mb_head;
    while (e && !((m->src == DP_ANY_SOURCE || e->src == m->src) && e->tag == m->tag)) prev = e, e = e->next;
    if (!e) return 0;
    if (prev) prev->next = e->next;
    else s->mb_head = e->next;
    if (s->mb_tail == e) s->mb_tail = prev;
    m->done = 1, m->from = e->src, m->got = e->bytes;
    if (e->bytes > m->cap) {
        m->rc = DP_EINVAL;
        snprintf(m->err, sizeof m->err, "comm: recv on rank %d: a message of %lld bytes from rank %d "
                 "(tag %d) does not fit the %lld-byte buffer", tc->base.rank, (long long)e->bytes, e->src,
                 e->tag, (long long)m->cap);
    } else if (e->bytes) {
        memcpy(m->buf, e->data, (size_t)e->bytes);
    }
    dp_free(e);
    return 1;
}

static int t_msg_test(struct dp_comm *c, struct dp_comm_msg *m, int *done) {
    struct thread_comm *tc = (struct thread_comm *)c;
    if (!m->done) {
        struct slot *s = &tc->w->slots[tc->local];
        pthread_mutex_lock(&s->mb_mu);
        take(tc, s, m);
        pthread_mutex_unlock(&s->mb_mu);
    }
    *done = m->done;
    return 0;
}

static int t_msg_wait(struct dp_comm *c, struct dp_comm_msg *m, int *src, int64_t *bytes) {
    struct thread_comm *tc = (struct thread_comm *)c;
    struct dp_comm_world *w = tc->w;
    int rc = 0, late = 0;
    if (!m->done) {
        struct slot *s = &w->slots[tc->local];
        double deadline = w->params.timeout_s > 0 ? dp_time() + w->params.timeout_s : 0;
        pthread_mutex_lock(&s->mb_mu);
        while (!take(tc, s, m)) {
            if ((rc = world_status(w))) break;
            if (deadline > 0) {
                if (dp_cond_wait_until(&s->mb_cv, &s->mb_mu, deadline) == ETIMEDOUT && !take(tc, s, m)) {
                    late = 1;
                    break;
                }
                if (m->done) break;
            } else {
                pthread_cond_wait(&s->mb_cv, &s->mb_mu);
            }
        }
        pthread_mutex_unlock(&s->mb_mu);
        if (late) {
            char msg[MSG_LEN], from[32] = "any rank";
            if (m->src != DP_ANY_SOURCE) snprintf(from, sizeof from, "rank %d", m->src);
            snprintf(msg, sizeof msg, "comm: timeout after %.3g s in recv on rank %d: no message from %s "
                     "with tag %d", w->params.timeout_s, c->rank, from, m->tag);
            rc = world_abort(w, msg);
        }
    }
    if (!rc && m->rc) rc = dp_seterr(m->rc, "%s", m->err);
    if (!rc) {
        if (src) *src = m->from;
        if (bytes) *bytes = m->got;
    }
    dp_free(m);
    return rc;
}

/* A receive not yet matched is simply forgotten (a send completed at once). */
static int t_msg_cancel(struct dp_comm *c, struct dp_comm_msg *m) {
    (void)c;
    dp_free(m);
    return 0;
}

static const struct dp_comm_ops thread_ops = {
    "thread", t_start,  t_test,  t_wait,     t_abort,    t_status,   t_free,
    NULL,     t_host_ranks, t_isend, t_irecv, t_msg_test, t_msg_wait, t_msg_cancel,
};

/* ---- world and rank lifetime ---------------------------------------------------------------- */

int dp_comm_thread_world_init(struct dp_comm_world **wp, int nranks,
                              const struct dp_comm_params *params) {
    if (!wp) return dp_seterr(DP_EINVAL, "comm: NULL world pointer");
    *wp = NULL;
    if (nranks < 1 || nranks > MAX_RANKS)
        return dp_seterr(DP_EINVAL, "comm: %d ranks (1..%d)", nranks, MAX_RANKS);
    struct dp_comm_params p = params ? *params : dp_comm_default_params();
    if (!(p.timeout_s >= 0)) return dp_seterr(DP_EINVAL, "comm: timeout_s %g < 0", p.timeout_s);
    struct dp_comm_world *w = dp_calloc(1, sizeof *w);
    if (!w) return dp_seterr(DP_ENOMEM, "comm: out of memory for the world");
    w->slots = dp_calloc((size_t)nranks, sizeof *w->slots);
    if (!w->slots) {
        dp_free(w);
        return dp_seterr(DP_ENOMEM, "comm: out of memory for %d ranks", nranks);
    }
    w->nranks = nranks;
    w->nprocs = 1;
    w->params = p;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int spin_us = p.spin_us >= 0 ? p.spin_us : (ncpu > 0 && nranks <= ncpu ? 10 : 1);
    w->spin_s = 1e-6 * spin_us;
    /* caller progress, auto spin, a CPU per rank: the ranks' threads are
     * the only ones meant to run on these cores ("Waiting") */
    w->long_spin = p.spin_us < 0 && p.progress == DP_PROGRESS_CALLER && nranks <= dp_cpus_allowed();
    atomic_init(&w->aborted, 0);
    atomic_init(&w->claim, 0);
    pthread_mutex_init(&w->mu, NULL);
    int r = 0;
    for (; r < nranks; r++) {
        struct slot *s = &w->slots[r];
        atomic_init(&s->prog, 0);
        atomic_init(&s->nwait, 0);
        pthread_mutex_init(&s->mu, NULL);
        pthread_mutex_init(&s->mb_mu, NULL);
        if (dp_cond_init_monotonic(&s->cv)) {
            pthread_mutex_destroy(&s->mu);
            pthread_mutex_destroy(&s->mb_mu);
            break;
        }
        if (dp_cond_init_monotonic(&s->mb_cv)) {
            pthread_mutex_destroy(&s->mu);
            pthread_mutex_destroy(&s->mb_mu);
            pthread_cond_destroy(&s->cv);
            break;
        }
    }
    if (r < nranks) {
        while (r-- > 0) {
            pthread_mutex_destroy(&w->slots[r].mu);
            pthread_cond_destroy(&w->slots[r].cv);
            pthread_mutex_destroy(&w->slots[r].mb_mu);
            pthread_cond_destroy(&w->slots[r].mb_cv);
        }
        pthread_mutex_destroy(&w->mu);
        dp_free(w->slots);
        dp_free(w);
        return dp_seterr(DP_EINTERNAL, "comm: pthread_cond_init failed");
    }
    *wp = w;
    return 0;
}

void dp_comm_thread_world_free(struct dp_comm_world *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    int nlive = w->nlive;
    pthread_mutex_unlock(&w->mu);
    DP_ASSERT(nlive == 0 && "every rank must free its communicator first");
    for (int r = 0; r < w->nranks; r++) {
        pthread_mutex_destroy(&w->slots[r].mu);
        pthread_cond_destroy(&w->slots[r].cv);
        /* messages sent and never received */
        for (struct envelope *e = w->slots[r].mb_head, *nx; e; e = nx) nx = e->next, dp_free(e);
        pthread_mutex_destroy(&w->slots[r].mb_mu);
        pthread_cond_destroy(&w->slots[r].mb_cv);
    }
    pthread_mutex_destroy(&w->mu);
    dp_free(w->slots);
    dp_free(w);
}

int dp_comm_thread_init(struct dp_comm **cp, struct dp_comm_world *w, int rank) {
    if (!cp) return dp_seterr(DP_EINVAL, "comm: NULL communicator pointer");
    *cp = NULL;
    if (!w) return dp_seterr(DP_EINVAL, "comm: NULL world");
    if (rank < 0 || rank >= w->nranks)
        return dp_seterr(DP_EINVAL, "comm: rank %d out of range 0..%d", rank, w->nranks - 1);
    struct thread_comm *tc = dp_calloc(1, sizeof *tc);
    char **peer_buf = dp_calloc((size_t)w->nranks, sizeof *peer_buf);
    if (!tc || !peer_buf) {
        dp_free(tc), dp_free(peer_buf);
        return dp_seterr(DP_ENOMEM, "comm: rank %d: out of memory", rank);
    }
    pthread_mutex_lock(&w->mu);
    int taken = w->slots[rank].present;
    if (!taken) w->slots[rank].present = 1, w->nlive++;
    pthread_mutex_unlock(&w->mu);
    if (taken) {
        dp_free(tc), dp_free(peer_buf);
        return dp_seterr(DP_EINVAL, "comm: rank %d was already initialised", rank);
    }
    tc->base.ops = &thread_ops;
    tc->base.rank = grank(w, rank);
    tc->base.nranks = w->nprocs * w->nranks;
    tc->local = rank;
    tc->w = w;
    tc->peer_buf = peer_buf;
    pthread_mutex_init(&tc->mu, NULL);
    pthread_cond_init(&tc->cv_work, NULL);
    pthread_cond_init(&tc->cv_done, NULL);
    int rc = dp__thread_start(&tc->thread, "dp-comm", comm_thread_main, tc);
    if (rc) {
        pthread_mutex_destroy(&tc->mu);
        pthread_cond_destroy(&tc->cv_work);
        pthread_cond_destroy(&tc->cv_done);
        pthread_mutex_lock(&w->mu);
        w->slots[rank].present = 0, w->nlive--;
        pthread_mutex_unlock(&w->mu);
        dp_free(tc), dp_free(peer_buf);
        return dp_seterr(DP_EINTERNAL, "comm: rank %d: cannot start its thread: %s", rank,
                         strerror(rc));
    }
    *cp = &tc->base;
    return 0;
}

int dp_comm_thread_world_init_hier(struct dp_comm_world **wp, int nlocal,
                                   const struct dp_comm_params *params, struct dp_comm *inter) {
    if (!wp) return dp_seterr(DP_EINVAL, "comm: NULL world pointer");
    *wp = NULL;
    if (!inter) return dp_seterr(DP_EINVAL, "comm: hierarchical world without a process communicator");
    int P = dp_comm_world(inter), me = dp_comm_rank(inter);
    if ((int64_t)P * nlocal > INT32_MAX / 2)
        return dp_seterr(DP_EINVAL, "comm: %d processes x %d ranks is too many", P, nlocal);
    /* Every process must have as many ranks as this one. */
    double *n = dp_calloc((size_t)P, sizeof *n);
    if (!n) return dp_seterr(DP_ENOMEM, "comm: out of memory");
    n[me] = nlocal;
    int rc = dp_comm_allreduce(inter, n, P, DP_DTYPE_F64, DP_ALGO_AUTO);
    for (int p = 0; !rc && p < P; p++)
        if (n[p] != nlocal)
            rc = dp_seterr(DP_EMISMATCH, "comm: process %d has %g worker thread%s but process %d has %d "
                           "(every process must run the same number)", p, n[p], n[p] == 1 ? "" : "s",
                           me, nlocal);
    dp_free(n);
    if (rc) return rc;
    if ((rc = dp_comm_thread_world_init(wp, nlocal, params))) return rc;
    (*wp)->inter = inter;
    (*wp)->proc = me;
    (*wp)->nprocs = P;
    return 0;
}
