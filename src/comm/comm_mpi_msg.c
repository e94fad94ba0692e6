/* The mpi backend's point-to-point messages (dp_comm_isend and the rest). */
#ifdef DP_WITH_MPI

#include "comm_mpi_impl.h"

/* ---- point-to-point messages ----------------------------------------------------------------- */

/* MPI_Isend / MPI_Irecv of bytes on their own communicator (msgc), so that
 * they never match the ring and rhd schedules' messages on p2p.  A wait
 * polls MPI_Test, spinning, then sleeping (2 µs doubling to 256 µs), checks
 * the abort flag, and gives up after timeout_s: a receive is then
 * cancelled, and MPI_Finalize skipped (a send cannot be taken back). */
struct dp_comm_msg {
    MPI_Request req;
    int send, done, rc;
    int peer, tag, from;
    int64_t cap, got;
    char err[MSG_LEN];
};

/* Gives a message up: a receive is cancelled (it must not write the buffer
 * later; a send cannot be taken back); one MPI still holds is released to
 * it, and MPI_Finalize is then skipped (it could wait for the peer). */
static void abandon(struct dp_comm_msg *g) {
    int flag = 0;
    if (!g->send) MPI_Cancel(&g->req);
    MPI_Test(&g->req, &flag, MPI_STATUS_IGNORE);
    if (!flag) {
        MPI_Request_free(&g->req);
        dp__mpi_note_orphan();
    }
}

static int m_post(struct mpi_comm *m, int send, void *buf, int64_t bytes, int peer, int tag,
                  struct dp_comm_msg **msg) {
    int rc = dp__mpi_aborted_status(m);
    if (rc) return rc;
    /* messages may come from a thread other than the collectives' one */
    if (m->provided < MPI_THREAD_MULTIPLE)
        return dp_seterr(DP_ENOTSUP, "comm: mpi: point-to-point messages need MPI_THREAD_MULTIPLE (MPI "
                                     "provides thread level %d)", m->provided);
    struct dp_comm_msg *g = dp_calloc(1, sizeof *g);
    if (!g) return dp_seterr(DP_ENOMEM, "comm: mpi: out of memory");
    g->send = send, g->peer = peer, g->tag = tag, g->cap = bytes, g->from = -1;
    int err = send ? MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, m->msgc, &g->req)
                   : MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer == DP_ANY_SOURCE ? MPI_ANY_SOURCE : peer,
                               tag, m->msgc, &g->req);
    if (err != MPI_SUCCESS) {
        dp_free(g);
        return dp__mpi_fail(m, err, send ? "MPI_Isend" : "MPI_Irecv");
    }
    *msg = g;
    return 0;
}

int dp__mpi_isend(struct dp_comm *c, const void *buf, int64_t bytes, int dest, int tag,
                   struct dp_comm_msg **msg) {
    return m_post((struct mpi_comm *)c, 1, (void *)buf, bytes, dest, tag, msg);
}
int dp__mpi_irecv(struct dp_comm *c, void *buf, int64_t bytes, int src, int tag,
                   struct dp_comm_msg **msg) {
    return m_post((struct mpi_comm *)c, 0, buf, bytes, src, tag, msg);
}

static void msg_poll(struct mpi_comm *m, struct dp_comm_msg *g) {
    if (g->done) return;
    int flag = 0;
    MPI_Status st;
    int err = MPI_Test(&g->req, &flag, &st);
    if (err == MPI_SUCCESS && !flag) return;
    g->done = 1;
    if (err == MPI_SUCCESS && !g->send) {
        int n = 0;
        MPI_Get_count(&st, MPI_BYTE, &n);
        g->from = st.MPI_SOURCE, g->got = n;
    } else if (err == MPI_SUCCESS) {
        g->got = g->cap;
    }
    if (err == MPI_SUCCESS) return;
    int cls = 0;
    MPI_Error_class(err, &cls);
    if (cls == MPI_ERR_TRUNCATE) {
        g->rc = DP_EINVAL;
        snprintf(g->err, sizeof g->err, "comm: recv on rank %d: a message from rank %d (tag %d) does "
                 "not fit the %lld-byte buffer", m->base.rank, st.MPI_SOURCE, g->tag, (long long)g->cap);
    } else {
        g->rc = dp__mpi_fail(m, err, "MPI_Test");
        snprintf(g->err, sizeof g->err, "%s", dp_errmsg());
    }
}

int dp__mpi_msg_test(struct dp_comm *c, struct dp_comm_msg *g, int *done) {
    msg_poll((struct mpi_comm *)c, g);
    *done = g->done;
    return 0;
}

int dp__mpi_msg_wait(struct dp_comm *c, struct dp_comm_msg *g, int *src, int64_t *bytes) {
    struct mpi_comm *m = (struct mpi_comm *)c;
    double t0 = dp_time(), spin_end = t0 + m->spin_s;
    long sleep_ns = SLEEP_MIN_NS;
    int rc = 0;
    for (msg_poll(m, g); !g->done; msg_poll(m, g)) {
        double now = dp_time();
        if ((rc = dp__mpi_aborted_status(m)) == 0 && m->timeout_s > 0 && now - t0 >= m->timeout_s) {
            char msg[MSG_LEN], peer[32] = "any rank";
            if (g->peer != DP_ANY_SOURCE) snprintf(peer, sizeof peer, "rank %d", g->peer);
            if (g->send)
                snprintf(msg, sizeof msg, "comm: timeout after %.3g s in send on rank %d: %s did not "
                         "take the message with tag %d", m->timeout_s, c->rank, peer, g->tag);
            else
                snprintf(msg, sizeof msg, "comm: timeout after %.3g s in recv on rank %d: no message "
                         "from %s with tag %d", m->timeout_s, c->rank, peer, g->tag);
            dp__mpi_set_aborted(m, msg);
            rc = dp__mpi_aborted_status(m);
        }
        if (rc) { /* abandon it: a receive must not write the buffer later */
            abandon(g);
            break;
        }
        if (now >= spin_end) {
            dp__mpi_nap(sleep_ns);
            if (sleep_ns < SLEEP_MAX_NS) sleep_ns *= 2;
        }
    }
    if (!rc && g->rc) rc = dp_seterr(g->rc, "%s", g->err);
    if (!rc) {
        if (src) *src = g->send ? c->rank : g->from;
        if (bytes) *bytes = g->got;
    }
    dp_free(g);
    return rc;
}

int dp__mpi_msg_cancel(struct dp_comm *c, struct dp_comm_msg *g) {
    (void)c;
    if (!g->done) abandon(g);
    dp_free(g);
    return 0;
}

#endif /* DP_WITH_MPI */
