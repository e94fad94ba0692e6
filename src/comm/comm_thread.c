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
/* This file: abort, caller progress and the ops table; comm_thread_exec.c the step-flag
 * layer and the communication thread, comm_thread_msg.c point-to-point messages,
 * comm_thread_world.c the world's lifetime; comm_thread_impl.h their shared types. */
#include "comm_thread_impl.h"

/* ---- abort ---------------------------------------------------------------------------------- */

/* Sets the abort message (first caller wins), raises the flag, wakes every
 * sleeper of every slot.  Returns DP_ECANCELED with the world's message set on
 * this thread. */
int dp__thread_world_abort(struct dp_comm_world *w, const char *msg) {
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

int dp__thread_world_status(const struct dp_comm_world *w) {
    if (!atomic_load_explicit(&w->aborted, memory_order_acquire)) return 0;
    return dp_seterr(DP_ECANCELED, "%s", w->abort_msg);
}

/* Enters a stretch that touches peers' buffers: 0, or the abort's error
 * (then not entered).  seq_cst both ways, see the file comment. */
int dp__thread_touch_begin(struct dp_comm_world *w, int local) {
    atomic_fetch_add(&w->slots[local].busy, 1);
    if (!atomic_load(&w->aborted)) return 0;
    atomic_fetch_sub(&w->slots[local].busy, 1);
    return dp__thread_world_status(w);
}

void dp__thread_touch_end(struct dp_comm_world *w, int local) {
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
        if ((rc = dp__thread_world_status(w))) goto out;
        if (w->params.timeout_s > 0) op.deadline = rq->deadline = dp_time() + w->params.timeout_s;
        *desc_of(w, tc->local, op.seq) = rq->d;
        tc->peer_buf[tc->local] = rq->d.buf;
        dp__coll_mark(&op, DP__MARK_ARRIVED);
        rq->phase = 1;
    }
    if (rq->phase == 1) {
        if (!block && !all_marked(&op, DP__MARK_ARRIVED)) return 0;
        if ((rc = dp__thread_touch_begin(w, tc->local))) goto out;
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
        dp__thread_touch_end(w, tc->local);
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
        dp__thread_finish(tc, rq); /* wakes the communication thread if a request of its own is next */
        if (rq == until) break;
    }
}

/* ---- the ops table -------------------------------------------------------------------------- */

static int t_start(struct dp_comm *c, const struct dp__op *d, int blocking,
                   struct dp_comm_req **req) {
    struct thread_comm *tc = (struct thread_comm *)c;
    int rc = dp__thread_world_status(tc->w);
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
            dp__thread_pop(tc);
            pthread_mutex_unlock(&tc->mu);
            dp__thread_execute(tc, req);
            pthread_mutex_lock(&tc->mu);
            dp__thread_finish(tc, req);
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
    return dp__thread_world_abort(tc->w, full);
}

static int t_status(const struct dp_comm *c) {
    return dp__thread_world_status(((const struct thread_comm *)c)->w);
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
        dp__thread_world_abort(w, msg);
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
const struct dp_comm_ops dp__thread_ops = {
    "thread", t_start,  t_test,  t_wait,     t_abort,    t_status,   t_free,
    NULL,     t_host_ranks, dp__thread_isend, dp__thread_irecv, dp__thread_msg_test, dp__thread_msg_wait, dp__thread_msg_cancel,
    NULL,
};
