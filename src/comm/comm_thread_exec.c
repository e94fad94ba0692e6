/* The thread backend's step-flag layer and the communication thread that executes the
 * queued operations (comm_thread.c has the design). */
#include "comm_thread_impl.h"

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

/* Global rank of local slot r. */
int dp__thread_grank(const struct dp_comm_world *w, int r) { return w->proc * w->nranks + r; }

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
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%d", missing ? ", " : "", dp__thread_grank(w, r));
        missing++;
    }
    if (missing)
        snprintf(msg, sizeof msg, "comm: timeout after %.3g s in %s #%llu on rank %d: rank%s %s "
                 "did not arrive", w->params.timeout_s, dp_comm_coll_name(op->d.coll),
                 (unsigned long long)(op->seq / SUBOPS), dp__thread_grank(w, op->rank), missing > 1 ? "s" : "",
                 list);
    else
        snprintf(msg, sizeof msg, "comm: timeout after %.3g s in %s #%llu on rank %d: rank %d "
                 "did not reach step %u", w->params.timeout_s, dp_comm_coll_name(op->d.coll),
                 (unsigned long long)(op->seq / SUBOPS), dp__thread_grank(w, op->rank), dp__thread_grank(w, peer), mark);
    return dp__thread_world_abort(w, msg);
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
        if (atomic_load_explicit(&w->aborted, memory_order_relaxed)) return dp__thread_world_status(w);
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
    if (atomic_load(&w->aborted)) return dp__thread_world_status(w);
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
                 "issued %s", (unsigned long long)(op->seq / SUBOPS), dp__thread_grank(op->world, op->rank), mine,
                 dp__thread_grank(op->world, peer), theirs);
        dp__thread_world_abort(op->world, msg);
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
    int rc = dp__thread_touch_begin(w, tc->local);
    if (rc) return rc;
    if (timed && w->params.timeout_s > 0) op.deadline = dp_time() + w->params.timeout_s;
    *desc_of(w, tc->local, seq) = *d;
    tc->peer_buf[tc->local] = d->buf;
    dp__coll_mark(&op, DP__MARK_ARRIVED);
    rc = algos[d->coll][d->algo](&op);
    dp__thread_touch_end(w, tc->local);
    return rc;
}

/* The leader's stage on `inter`: a failure there aborts this process's
 * world too, so the local ranks waiting for the leader return at once. */
static int inter_stage(struct thread_comm *tc, int rc) {
    if (!rc) return 0;
    char msg[MSG_LEN];
    snprintf(msg, sizeof msg, "%s", dp_errmsg()[0] ? dp_errmsg() : dp_strerror(rc));
    dp__thread_world_abort(tc->w, msg);
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
void dp__thread_execute(struct thread_comm *tc, struct dp_comm_req *rq) {
    dp_clearerr();
    int rc = tc->w->inter ? hier_execute(tc, rq) : local_stage(tc, rq->seq * SUBOPS, &rq->d, 1);
    rq->rc = rc;
    if (rc) snprintf(rq->msg, sizeof rq->msg, "%s", dp_errmsg()[0] ? dp_errmsg() : dp_strerror(rc));
}

/* Marks rq done; called with tc->mu held. */
void dp__thread_finish(struct thread_comm *tc, struct dp_comm_req *rq) {
    rq->state = REQ_DONE;
    tc->running = 0;
    pthread_cond_broadcast(&tc->cv_done);
    if (tc->head) pthread_cond_signal(&tc->cv_work);
}

struct dp_comm_req *dp__thread_pop(struct thread_comm *tc) {
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

void *dp__thread_main(void *arg) {
    struct thread_comm *tc = arg;
    core_watch.off = 1; /* it shares a core with its rank's compute: no long spin */
    pthread_mutex_lock(&tc->mu);
    for (;;) {
        while (!tc->stop && !runnable(tc)) pthread_cond_wait(&tc->cv_work, &tc->mu);
        if (!runnable(tc)) break; /* stop, nothing runnable */
        struct dp_comm_req *rq = dp__thread_pop(tc);
        pthread_mutex_unlock(&tc->mu);
        dp__thread_execute(tc, rq);
        pthread_mutex_lock(&tc->mu);
        dp__thread_finish(tc, rq);
    }
    pthread_mutex_unlock(&tc->mu);
    return NULL;
}
