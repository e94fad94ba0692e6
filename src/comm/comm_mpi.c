/*
 * The mpi backend: one rank per process of MPI_COMM_WORLD (docs/mpi.md).
 * This file: the state, errors and abort, the native collectives, the ops
 * table and init; comm_mpi_sched.c builds the point-to-point schedules,
 * comm_mpi_run.c runs them (and diagnoses timeouts), comm_mpi_msg.c has the
 * point-to-point messages; comm_mpi_impl.h their shared types.
 *
 * Compiled only with DP_WITH_MPI (the Makefile defines it when it finds
 * mpicc); otherwise this file is empty and dp_comm_init(.., "mpi", ..)
 * returns DP_ENOTSUP from comm.c.
 *
 * State (struct mpi_comm, one per dp_comm_init):
 *   - three duplicates of MPI_COMM_WORLD, all with MPI_ERRORS_RETURN:
 *       coll   the native collectives (MPI_Iallreduce, ...);
 *       p2p    the project's ring and rhd, written over MPI_Isend/Irecv;
 *       side   the timeout diagnosis (one message per rank, see timed_out);
 *     separate communicators keep the three kinds of traffic from matching
 *     each other's messages;
 *   - the requests not yet released, in issue order (a FIFO);
 *   - the scratch the point-to-point reductions receive into (WINDOW
 *     segments, allocated once);
 *   - which ranks are on another host (their messages are cut finer);
 *   - the abort flag and message (dp_comm_abort may come from any thread).
 *
 * Execution and order.  A native operation is handed to MPI when it is
 * issued (MPI_I* returns at once) and progresses inside MPI; a blocking one
 * with no timeout and nothing pending before it is simply MPI's blocking
 * call (MPI_Allreduce, ...).  A ring or rhd operation is a schedule of steps
 * (built when it is issued) that runs only inside dp_comm_wait and
 * dp_comm_test, one operation at a time, in issue order: a wait on a later
 * request first runs and completes the earlier ones.  Requests are marked
 * done in issue order.  All ranks issue the same sequence, so every rank
 * runs the point-to-point schedules in the same order, and a native
 * operation, already started everywhere, cannot be blocked by them:
 * whatever a rank waits on, its MPI calls progress every started operation.
 *
 * Waiting polls (MPI_Test / MPI_Testall): it spins for spin_us after the
 * last progress (and at first for as long as the operation's bytes take at
 * 2 GB/s, see spin_budget), then sleeps with nanosleep, 2 µs doubling to
 * 256 µs, so a rank that waits for a late peer does not eat a core that the
 * peer, or this process's compute thread, may need.  With timeout_s > 0
 * each operation gets timeout_s from the moment a wait starts working on
 * it.
 *
 * Thread level.  MPI_THREAD_SERIALIZED at least: one thread at a time uses
 * the communicator, not always the one that created it (dptrain's trainer
 * issues from a communication thread).  dp_comm_abort and dp_comm_status
 * make no MPI call and may come from any thread.
 */
#ifdef DP_WITH_MPI

#include "comm_mpi_impl.h"

/* ---- process-wide: who initialised MPI ------------------------------------------------------ */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_we_init;  /* dp_comm_init called MPI_Init_thread */
static int g_live;     /* communicators not yet freed */
static int g_orphans;  /* some MPI operation was abandoned unfinished: no MPI_Finalize */

void dp__mpi_note_orphan(void) {
    pthread_mutex_lock(&g_mu);
    g_orphans = 1;
    pthread_mutex_unlock(&g_mu);
}

/* ---- errors and abort ---------------------------------------------------------------------- */

int dp__mpi_fail(const struct mpi_comm *m, int err, const char *call) {
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(err, s, &n) != MPI_SUCCESS) snprintf(s, sizeof s, "error %d", err);
    return dp_seterr(DP_EIO, "comm: rank %d: %s failed: %s", m ? m->base.rank : -1, call, s);
}

/* Marks the communicator aborted with `msg` (the first message is kept). */
void dp__mpi_set_aborted(struct mpi_comm *m, const char *msg) {
    pthread_mutex_lock(&m->mu);
    if (!atomic_load(&m->aborted)) {
        snprintf(m->abort_msg, sizeof m->abort_msg, "%s", msg);
        atomic_store(&m->aborted, 1);
    }
    pthread_mutex_unlock(&m->mu);
}

int dp__mpi_aborted_status(struct mpi_comm *m) {
    if (!atomic_load_explicit(&m->aborted, memory_order_acquire)) return 0;
    pthread_mutex_lock(&m->mu);
    int rc = dp_seterr(DP_ECANCELED, "%s", m->abort_msg);
    pthread_mutex_unlock(&m->mu);
    return rc;
}

/* Ends rq with status rc and this thread's message. */
void dp__mpi_finish(struct dp_comm_req *rq, int rc) {
    rq->done = 1;
    rq->rc = rc;
    if (rc) snprintf(rq->msg, sizeof rq->msg, "%s", dp_errmsg()[0] ? dp_errmsg() : dp_strerror(rc));
}

/* An operation that fails ends the communicator: its message becomes the
 * abort message, so every later operation fails with it. */
void dp__mpi_fail_op(struct mpi_comm *m, struct dp_comm_req *rq, int rc) {
    if (rq->inflight) {
        /* MPI still owns this operation's requests.  The receives of a
         * point-to-point step are cancelled where MPI still can, so that
         * they do not write into the buffer later; sends and native
         * collectives cannot be taken back.  MPI_Finalize is skipped. */
        for (int i = 0; rq->kind == KIND_P2P && i < 2; i++) {
            struct stream *s = &rq->rs[i];
            for (int64_t k = s->done; k < s->posted; k++) {
                MPI_Request *q = &s->req[k % s->win];
                int flag = 0;
                MPI_Cancel(q);
                MPI_Test(q, &flag, MPI_STATUS_IGNORE);
                if (!flag) MPI_Request_free(q);
            }
            s->done = s->posted;
        }
        pthread_mutex_lock(&g_mu);
        g_orphans = 1;
        pthread_mutex_unlock(&g_mu);
        rq->inflight = 0;
    }
    dp__mpi_finish(rq, rc);
    dp__mpi_set_aborted(m, rq->msg);
}

/* ---- native collectives ---------------------------------------------------------------------- */

static MPI_Datatype mpi_type(enum dp_dtype t) {
    return t == DP_DTYPE_F32 ? MPI_FLOAT : t == DP_DTYPE_F64 ? MPI_DOUBLE : MPI_UINT16_T;
}

/* The bf16 sum for MPI: inout[i] = in[i] + inout[i] in fp32, rounded once
 * (commutative, as MPI_Op_create is told). */
static void bf16_sum_fn(void *in, void *inout, int *len, MPI_Datatype *type) {
    (void)type;
    dp__reduce_add(inout, in, *len, DP_DTYPE_BF16);
}

/* Starts rq's native collective: MPI_I* (nonblocking: libnbc in Open MPI),
 * or with `now` the blocking MPI call, which completes it (Open MPI's tuned
 * algorithms: several times faster than libnbc's at large sizes here, see
 * docs/mpi.md). */
static int native_start(struct mpi_comm *m, struct dp_comm_req *rq, int now) {
    const struct dp__op *d = &rq->d;
    MPI_Datatype t = mpi_type(d->dtype);
    MPI_Op op = d->dtype == DP_DTYPE_BF16 ? m->bf16_sum : MPI_SUM;
    size_t es = dp_dtype_size(d->dtype);
    int P = m->base.nranks, err = MPI_SUCCESS;
    const char *call = "MPI_Ibarrier";
    rq->nmreq = 0;
    switch (d->coll) {
    case DP_COLL_ALLREDUCE:
    case DP_COLL_BROADCAST:
        call = d->coll == DP_COLL_ALLREDUCE ? "MPI_Iallreduce" : "MPI_Ibcast";
        for (int64_t o = 0; err == MPI_SUCCESS && (o < d->count || o == 0); o += NATIVE_PART) {
            int n = (int)(d->count - o < NATIVE_PART ? d->count - o : NATIVE_PART);
            char *p = (char *)d->buf + (size_t)o * es;
            MPI_Request *q = &rq->mreq[rq->nmreq];
            if (d->coll == DP_COLL_ALLREDUCE)
                err = now ? MPI_Allreduce(MPI_IN_PLACE, p, n, t, op, m->coll)
                          : MPI_Iallreduce(MPI_IN_PLACE, p, n, t, op, m->coll, q);
            else
                err = now ? MPI_Bcast(p, n, t, d->root, m->coll)
                          : MPI_Ibcast(p, n, t, d->root, m->coll, q);
            if (err == MPI_SUCCESS && !now) rq->nmreq++;
        }
        break;
    case DP_COLL_REDUCE_SCATTER:
    case DP_COLL_ALLGATHER:
        for (int q = 0; q < P; q++) {
            int64_t off, len;
            dp_comm_split(d->count, P, q, &off, &len);
            rq->counts[q] = (int)len;
            rq->displs[q] = (int)off;
        }
        if (d->coll == DP_COLL_REDUCE_SCATTER) {
            /* In place, MPI takes the whole vector from buf and leaves this
             * rank's block at the start of buf; native_poll moves it. */
            call = "MPI_Ireduce_scatter";
            err = now ? MPI_Reduce_scatter(MPI_IN_PLACE, d->buf, rq->counts, t, op, m->coll)
                      : MPI_Ireduce_scatter(MPI_IN_PLACE, d->buf, rq->counts, t, op, m->coll,
                                            &rq->mreq[0]);
        } else {
            call = "MPI_Iallgatherv";
            err = now ? MPI_Allgatherv(MPI_IN_PLACE, 0, t, d->buf, rq->counts, rq->displs, t,
                                       m->coll)
                      : MPI_Iallgatherv(MPI_IN_PLACE, 0, t, d->buf, rq->counts, rq->displs, t,
                                        m->coll, &rq->mreq[0]);
        }
        if (err == MPI_SUCCESS && !now) rq->nmreq = 1;
        break;
    default:
        err = now ? MPI_Barrier(m->coll) : MPI_Ibarrier(m->coll, &rq->mreq[0]);
        if (err == MPI_SUCCESS && !now) rq->nmreq = 1;
        break;
    }
    rq->inflight = rq->nmreq > 0;
    if (err != MPI_SUCCESS) return dp__mpi_fail(m, err, call);
    if (now) {
        int done;
        dp__mpi_native_poll(m, rq, &done); /* the reduce-scatter's move; nmreq = 0 */
        dp__mpi_finish(rq, 0);
    }
    return 0;
}

/* Tests a started native operation once; *done when it has completed. */
int dp__mpi_native_poll(struct mpi_comm *m, struct dp_comm_req *rq, int *done) {
    int flag = 0, err = MPI_Testall(rq->nmreq, rq->mreq, &flag, MPI_STATUSES_IGNORE);
    if (err != MPI_SUCCESS) return dp__mpi_fail(m, err, "MPI_Testall");
    *done = flag;
    if (!flag) return 0;
    rq->inflight = 0;
    if (rq->d.coll == DP_COLL_REDUCE_SCATTER) {
        int r = m->base.rank;
        size_t es = dp_dtype_size(rq->d.dtype);
        if (rq->displs[r] && rq->counts[r])
            memmove((char *)rq->d.buf + (size_t)rq->displs[r] * es, rq->d.buf,
                    (size_t)rq->counts[r] * es);
    }
    return 0;
}

/* ---- the ops table ---------------------------------------------------------------------------- */

static int m_start(struct dp_comm *c, const struct dp__op *d, int blocking,
                   struct dp_comm_req **req) {
    struct mpi_comm *m = (struct mpi_comm *)c;
    if (d->algo == DP_ALGO_DIRECT && d->coll != DP_COLL_BARRIER)
        return dp_seterr(DP_EINVAL, "comm: %s: algorithm 'direct' needs shared memory (the thread "
                                    "backend); the mpi backend has native, ring and rhd",
                         dp_comm_coll_name(d->coll));
    int rc = dp__mpi_aborted_status(m);
    if (rc) return rc;
    /* A blocking native operation with nothing before it and no timeout to
     * enforce is MPI's blocking call (it cannot be interrupted by an abort
     * from another thread; with a timeout, the operation is polled). */
    int now = blocking && m->timeout_s == 0;
    for (struct dp_comm_req *p = m->head; now && p; p = p->next) now = p->done;
    struct dp_comm_req *rq = m->freelist;
    if (rq) {
        m->freelist = rq->next;
    } else {
        rq = dp_calloc(1, sizeof *rq);
        int *arr = dp_malloc(2 * sizeof *arr * (size_t)c->nranks);
        if (!rq || !arr) {
            dp_free(rq), dp_free(arr);
            return dp_seterr(DP_ENOMEM, "comm: rank %d: out of memory for a request", c->rank);
        }
        rq->counts = arr, rq->displs = arr + c->nranks;
    }
    rq->next = NULL;
    rq->d = *d;
    rq->seq = ++m->next_seq;
    rq->done = rq->rc = rq->inflight = 0;
    rq->deadline = 0;
    rq->msg[0] = '\0';
    int native = d->algo == DP_ALGO_NATIVE || d->coll == DP_COLL_BARRIER;
    /* int-sized displacements: larger gathers and scatters take the ring */
    if (native && (d->coll == DP_COLL_REDUCE_SCATTER || d->coll == DP_COLL_ALLGATHER) &&
        d->count > INT32_MAX)
        native = 0, rq->d.algo = DP_ALGO_RING;
    if (native && d->count > NATIVE_PART * NATIVE_PARTS) native = 0, rq->d.algo = DP_ALGO_RING;
    rq->kind = native ? KIND_NATIVE : KIND_P2P;
    dp_clearerr();
    rc = native ? native_start(m, rq, now) : dp__mpi_build_schedule(m, rq);
    if (rc) {
        /* a failed MPI call leaves the communicator unusable: abort it;
         * a schedule that could not be built started nothing */
        if (native) dp__mpi_fail_op(m, rq, rc);
        else m->next_seq--;
        rq->next = m->freelist;
        m->freelist = rq;
        return rc; /* with its message */
    }
    if (m->tail) m->tail->next = rq;
    else m->head = rq;
    m->tail = rq;
    m->npending++;
    *req = rq;
    return 0;
}

static int m_test(struct dp_comm *c, struct dp_comm_req *req, int *done) {
    struct mpi_comm *m = (struct mpi_comm *)c;
    int moved = 0;
    dp__mpi_poll_queue(m, &moved);
    *done = req->done;
    return 0;
}

static void unlink_req(struct mpi_comm *m, struct dp_comm_req *rq) {
    struct dp_comm_req **pp = &m->head, *prev = NULL;
    while (*pp && *pp != rq) prev = *pp, pp = &(*pp)->next;
    if (!*pp) return;
    *pp = rq->next;
    if (m->tail == rq) m->tail = prev;
    rq->next = m->freelist;
    m->freelist = rq;
    m->npending--;
}

void dp__mpi_nap(long ns) {
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

/* Waiting: spin while things move, then sleep (2 µs doubling to 256 µs).
 * "Moving" is visible for ring and rhd (every segment), not inside a native
 * operation, which MPI advances only during our MPI_Testall calls (Open MPI
 * has no progress thread here): sleeping then stalls it (measured: a polled
 * 256 KiB all-reduce took 530 µs instead of 90).  So the first poller of an
 * operation also spins for as long as its bytes take at 2 GB/s (at most
 * 20 ms) before it may sleep. */
static double spin_budget(const struct mpi_comm *m, const struct dp_comm_req *rq) {
    double t = (double)rq->d.count * (double)dp_dtype_size(rq->d.dtype) / 2e9;
    return m->spin_s + (t < 0.02 ? t : 0.02);
}

static int m_wait(struct dp_comm *c, struct dp_comm_req *req) {
    struct mpi_comm *m = (struct mpi_comm *)c;
    double spin_end = dp_time() + m->spin_s;
    long sleep_ns = SLEEP_MIN_NS;
    struct dp_comm_req *last = NULL;
    while (!req->done) {
        int moved = 0;
        struct dp_comm_req *cur = dp__mpi_poll_queue(m, &moved);
        if (req->done || !cur) break;
        double now = dp_time();
        if (cur != last) { /* a new operation at the head */
            last = cur;
            spin_end = now + spin_budget(m, cur);
            sleep_ns = SLEEP_MIN_NS;
        }
        if (m->timeout_s > 0) {
            if (cur->deadline == 0) cur->deadline = now + m->timeout_s;
            else if (now >= cur->deadline) {
                dp__mpi_timed_out(m, cur);
                continue;
            }
        }
        if (moved) {
            if (now + m->spin_s > spin_end) spin_end = now + m->spin_s;
            sleep_ns = SLEEP_MIN_NS;
        } else if (now >= spin_end) {
            dp__mpi_nap(sleep_ns);
            if (sleep_ns < SLEEP_MAX_NS) sleep_ns *= 2;
        }
    }
    int rc = req->rc;
    if (rc) dp_seterr(rc, "%s", req->msg);
    unlink_req(m, req);
    return rc;
}

static int m_abort(struct dp_comm *c, const char *msg) {
    struct mpi_comm *m = (struct mpi_comm *)c;
    char full[MSG_LEN];
    snprintf(full, sizeof full, "rank %d aborted: %s", c->rank, msg);
    dp__mpi_set_aborted(m, full);
    return dp__mpi_aborted_status(m);
}

static int m_status(const struct dp_comm *c) { return dp__mpi_aborted_status((struct mpi_comm *)c); }

static int m_kill_job(struct dp_comm *c, int code) {
    (void)c;
    MPI_Abort(MPI_COMM_WORLD, code);
    return dp_seterr(DP_EINTERNAL, "comm: MPI_Abort returned");
}

static void m_host_ranks(const struct dp_comm *c, int *local_rank, int *local_size) {
    const struct mpi_comm *m = (const struct mpi_comm *)c;
    *local_rank = m->local_rank;
    *local_size = m->local_size;
}

static void free_req(struct dp_comm_req *rq) {
    dp_free(rq->counts);
    dp_free(rq->steps);
    dp_free(rq);
}

static void m_free(struct dp_comm *c) {
    struct mpi_comm *m = (struct mpi_comm *)c;
    if (m->npending) {
        char msg[MSG_LEN];
        snprintf(msg, sizeof msg, "rank %d aborted: communicator freed with %d operation%s pending",
                 c->rank, m->npending, m->npending > 1 ? "s" : "");
        dp__mpi_set_aborted(m, msg);
        for (struct dp_comm_req *rq = m->head; rq; rq = rq->next)
            if (!rq->done) dp__mpi_fail_op(m, rq, DP_ECANCELED);
    }
    for (struct dp_comm_req *rq = m->head, *nx; rq; rq = nx) nx = rq->next, free_req(rq);
    for (struct dp_comm_req *rq = m->freelist, *nx; rq; rq = nx) nx = rq->next, free_req(rq);
    /* MPI_Comm_free and MPI_Op_free are local in Open MPI: an operation that
     * never finished keeps its communicator alive inside MPI, not here. */
    MPI_Op_free(&m->bf16_sum);
    MPI_Comm_free(&m->coll);
    MPI_Comm_free(&m->p2p);
    MPI_Comm_free(&m->side);
    MPI_Comm_free(&m->msgc);
    dp_free(m->scratch), dp_free(m->remote), dp_free(m->lost);
    if (m->diag_sent != 2) dp_free(m->diag_out); /* else MPI may still read it */
    pthread_mutex_destroy(&m->mu);
    dp_free(m);
    pthread_mutex_lock(&g_mu);
    int last = --g_live == 0 && g_we_init;
    /* MPI_Finalize waits for every process; after an operation was abandoned
     * (timeout, abort) a stalled peer would hang it, so it is skipped: the
     * process should exit, which makes mpirun end the job, or call
     * dp_comm_kill_job. */
    if (last && !g_orphans) {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin) MPI_Finalize();
        g_we_init = 0;
    }
    pthread_mutex_unlock(&g_mu);
}

static int m_lost_ranks(const struct dp_comm *c, int *ranks, int max) {
    const struct mpi_comm *m = (const struct mpi_comm *)c;
    int n = 0;
    for (int q = 0; m->lost && q < c->nranks; q++)
        if (m->lost[q]) {
            if (n < max) ranks[n] = q;
            n++;
        }
    return n;
}

static const struct dp_comm_ops mpi_ops = {
    "mpi",   m_start,      m_test,  m_wait,  m_abort,    m_status,   m_free,
    m_kill_job, m_host_ranks, dp__mpi_isend, dp__mpi_irecv, dp__mpi_msg_test, dp__mpi_msg_wait, dp__mpi_msg_cancel,
    m_lost_ranks,
};

/* ---- init ---------------------------------------------------------------------------------------- */

/* A communicator of its own over `base`'s ranks (base: MPI_COMM_WORLD, or a group split from it). */
static int dup_world(struct mpi_comm *m, MPI_Comm base, MPI_Comm *out) {
    int err = MPI_Comm_dup(base, out);
    if (err != MPI_SUCCESS) return dp__mpi_fail(m, err, "MPI_Comm_dup");
    err = MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
    if (err != MPI_SUCCESS) return dp__mpi_fail(m, err, "MPI_Comm_set_errhandler");
    return 0;
}

/* m->remote: every rank of coll that is not in `local` (this host's ranks). */
static int find_remote(struct mpi_comm *m, MPI_Comm local) {
    int P = m->base.nranks, n = m->local_size, err = MPI_SUCCESS;
    int *in = dp_malloc(2 * sizeof *in * (size_t)n);
    m->remote = dp_malloc((size_t)P);
    if (!in || !m->remote) {
        dp_free(in);
        return dp_seterr(DP_ENOMEM, "comm: mpi: out of memory");
    }
    memset(m->remote, 1, (size_t)P);
    MPI_Group gl = MPI_GROUP_NULL, gc = MPI_GROUP_NULL;
    for (int k = 0; k < n; k++) in[k] = k;
    if ((err = MPI_Comm_group(local, &gl)) == MPI_SUCCESS &&
        (err = MPI_Comm_group(m->coll, &gc)) == MPI_SUCCESS &&
        (err = MPI_Group_translate_ranks(gl, n, in, gc, in + n)) == MPI_SUCCESS)
        for (int k = 0; k < n; k++)
            if (in[n + k] >= 0 && in[n + k] < P) m->remote[in[n + k]] = 0;
    if (gl != MPI_GROUP_NULL) MPI_Group_free(&gl);
    if (gc != MPI_GROUP_NULL) MPI_Group_free(&gc);
    dp_free(in);
    return err == MPI_SUCCESS ? 0 : dp__mpi_fail(m, err, "MPI_Group_translate_ranks");
}

/* (comm_impl.h; tests) Takes ranks q and r to be on one host iff
 * q / per_host == r / per_host, whatever MPI says. */
void dp__comm_mpi_fake_hosts(struct dp_comm *c, int per_host) {
    struct mpi_comm *m = (struct mpi_comm *)c;
    for (int q = 0; q < c->nranks && per_host > 0; q++)
        m->remote[q] = q / per_host != c->rank / per_host;
}

static int mpi_new(struct dp_comm **cp, MPI_Comm base, int provided, const struct dp_comm_params *params);

int dp__comm_mpi_init(struct dp_comm **cp, const struct dp_comm_params *params) {
    int inited = 0, fin = 0, provided = 0, err;
    pthread_mutex_lock(&g_mu);
    MPI_Finalized(&fin);
    if (fin) {
        pthread_mutex_unlock(&g_mu);
        return dp_seterr(DP_ENOTSUP, "comm: mpi: MPI was already finalized");
    }
    MPI_Initialized(&inited);
    if (!inited) {
        err = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (err != MPI_SUCCESS) {
            pthread_mutex_unlock(&g_mu);
            return dp__mpi_fail(NULL, err, "MPI_Init_thread");
        }
        g_we_init = 1;
    } else {
        MPI_Query_thread(&provided);
    }
    pthread_mutex_unlock(&g_mu);
    if (provided < MPI_THREAD_SERIALIZED)
        return dp_seterr(DP_ENOTSUP, "comm: mpi: MPI provides thread level %d; the communicator "
                                     "needs at least MPI_THREAD_SERIALIZED", provided);
    return mpi_new(cp, MPI_COMM_WORLD, provided, params);
}

int dp__comm_mpi_split(struct dp_comm *parent, int color, int key, struct dp_comm **cp) {
    struct mpi_comm *pm = (struct mpi_comm *)parent;
    MPI_Comm sub = MPI_COMM_NULL;
    int err = MPI_Comm_split(pm->side, color, key, &sub);
    if (err != MPI_SUCCESS) return dp__mpi_fail(pm, err, "MPI_Comm_split");
    struct dp_comm_params params = {.timeout_s = pm->timeout_s, .spin_us = (int)(pm->spin_s * 1e6 + 0.5)};
    int rc = mpi_new(cp, sub, pm->provided, &params);
    MPI_Comm_free(&sub); /* (the new communicator holds duplicates of it) */
    return rc;
}

/* The communicator over base's ranks: four duplicates of base (collectives, their schedules'
 * messages, the side channel, dp_comm_isend's messages), this host's ranks, the bf16 sum. */
static int mpi_new(struct dp_comm **cp, MPI_Comm base, int provided, const struct dp_comm_params *params) {
    int err;
    struct mpi_comm *m = dp_calloc(1, sizeof *m);
    if (!m) return dp_seterr(DP_ENOMEM, "comm: mpi: out of memory");
    m->coll = m->p2p = m->side = m->msgc = MPI_COMM_NULL;
    m->bf16_sum = MPI_OP_NULL;
    pthread_mutex_init(&m->mu, NULL);
    atomic_init(&m->aborted, 0);
    m->base.ops = &mpi_ops;
    m->provided = provided;
    MPI_Comm_rank(base, &m->base.rank);
    MPI_Comm_size(base, &m->base.nranks);
    m->timeout_s = params->timeout_s;
    m->spin_s = 1e-6 * (params->spin_us >= 0 ? params->spin_us : 50);
    pthread_mutex_lock(&g_mu);
    g_live++;
    pthread_mutex_unlock(&g_mu);
    int rc = dup_world(m, base, &m->coll);
    if (!rc) rc = dup_world(m, base, &m->p2p);
    if (!rc) rc = dup_world(m, base, &m->side);
    if (!rc) rc = dup_world(m, base, &m->msgc);
    if (!rc) {
        int *ub = NULL, flag = 0;
        MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
        m->tag_ub = flag && ub && *ub > 0 ? *ub : 32767;
        MPI_Comm local;
        err = MPI_Comm_split_type(m->coll, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
        if (err != MPI_SUCCESS) {
            rc = dp__mpi_fail(m, err, "MPI_Comm_split_type");
        } else {
            MPI_Comm_rank(local, &m->local_rank);
            MPI_Comm_size(local, &m->local_size);
            rc = find_remote(m, local);
            MPI_Comm_free(&local);
        }
    }
    if (!rc && (err = MPI_Op_create(bf16_sum_fn, 1, &m->bf16_sum)) != MPI_SUCCESS)
        rc = dp__mpi_fail(m, err, "MPI_Op_create");
    if (!rc) {
        m->scratch = dp_malloc_big(SCRATCH_BYTES);
        m->diag_out = dp_calloc(2, sizeof *m->diag_out);
        m->lost = dp_calloc((size_t)m->base.nranks, 1);
        if (!m->scratch || !m->diag_out || !m->lost) rc = dp_seterr(DP_ENOMEM, "comm: mpi: out of memory");
    }
    if (rc) {
        /* the dups are collective: a failure is very likely on every rank */
        char msg[MSG_LEN];
        snprintf(msg, sizeof msg, "%s", dp_errmsg());
        if (m->bf16_sum != MPI_OP_NULL) MPI_Op_free(&m->bf16_sum);
        if (m->coll != MPI_COMM_NULL) MPI_Comm_free(&m->coll);
        if (m->p2p != MPI_COMM_NULL) MPI_Comm_free(&m->p2p);
        if (m->side != MPI_COMM_NULL) MPI_Comm_free(&m->side);
        if (m->msgc != MPI_COMM_NULL) MPI_Comm_free(&m->msgc);
        dp_free(m->scratch), dp_free(m->diag_out), dp_free(m->remote), dp_free(m->lost);
        pthread_mutex_destroy(&m->mu);
        dp_free(m);
        pthread_mutex_lock(&g_mu);
        g_live--;
        pthread_mutex_unlock(&g_mu);
        return dp_seterr(rc, "%s", msg);
    }
    *cp = &m->base;
    return 0;
}

#else
typedef int dp__comm_mpi_not_built; /* ISO C wants a declaration in every file */
#endif /* DP_WITH_MPI */
