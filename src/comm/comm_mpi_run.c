/* The mpi backend running its schedules: segments in flight per transfer, one step at a
 * time, the queue in issue order, and the diagnosis of an operation that timed out
 * (comm_mpi.c has the design). */
#ifdef DP_WITH_MPI

#include "comm_mpi_impl.h"

/* ---- running a schedule ------------------------------------------------------------------- */

/* A stream for transfer x (NULL: none): the segments for its peer's host. */
static struct stream stream_of(const struct mpi_comm *m, const struct xfer *x) {
    struct stream s = {0};
    int net = x && m->remote[x->peer];
    s.seg = net ? NET_SEG_BYTES : SEG_BYTES;
    s.win = net ? NET_WINDOW : WINDOW;
    s.nseg = x ? (int64_t)((x->len + s.seg - 1) / s.seg) : 0;
    return s;
}
static void seg_of(const struct xfer *x, const struct stream *s, int64_t k, size_t *off,
                   size_t *len) {
    size_t o = (size_t)k * s->seg;
    *off = x->off + o;
    *len = x->len - o < s->seg ? x->len - o : s->seg;
}

/* Posts what the windows allow and tests what is in flight, in segment
 * order, until nothing moves.  *step_done when every transfer of the step
 * has completed; *moved when anything completed.
 *
 * Order matters.  Open MPI moves a large message inside the receiver's
 * MPI_Test (a single-copy read from the sender's memory once the sender's
 * MPI_Isend has announced it), so a test may take as long as a copy.  Sends
 * are therefore posted first, and after every received segment (and its
 * addition) the sends are serviced again before the next receive is tested:
 * a peer never waits for a send this rank could have posted while it was
 * busy receiving. */
static int step_poll(struct mpi_comm *m, struct dp_comm_req *rq, int *step_done, int *moved) {
    const struct step *st = &rq->steps[rq->cur];
    char *buf = rq->d.buf;
    int tag = (int)(rq->seq % ((uint64_t)m->tag_ub + 1)), err, again = 1;
    if (!rq->begun) {
        for (int i = 0; i < 2; i++) {
            rq->ss[i] = stream_of(m, i < st->nsend ? &st->send[i] : NULL);
            rq->rs[i] = stream_of(m, i < st->nrecv ? &st->recv[i] : NULL);
        }
        rq->begun = 1;
    }
    while (again) {
        again = 0;
        /* sends: post, then retire the completed ones (in order) */
        for (int i = 0; i < st->nsend; i++) {
            struct stream *s = &rq->ss[i];
            const struct xfer *x = &st->send[i];
            int64_t ready = s->nseg;
            if (st->forward && i == 0) {
                /* the segments whose bytes have all arrived: recv[0] is the
                 * same range, perhaps cut differently (its peer's host) */
                const struct stream *in = &rq->rs[0];
                size_t got = in->done == in->nseg ? x->len : (size_t)in->done * in->seg;
                ready = got >= x->len ? s->nseg : (int64_t)(got / s->seg);
            }
            for (int more = 1; more;) {
                more = 0;
                for (; s->posted < ready && s->posted - s->done < s->win; s->posted++) {
                    size_t o, n;
                    seg_of(x, s, s->posted, &o, &n);
                    err = MPI_Isend(buf + o, (int)n, MPI_BYTE, x->peer, tag, m->p2p,
                                    &s->req[s->posted % s->win]);
                    if (err != MPI_SUCCESS) return dp__mpi_fail(m, err, "MPI_Isend");
                    rq->inflight = 1;
                }
                while (s->done < s->posted) {
                    int flag = 0;
                    err = MPI_Test(&s->req[s->done % s->win], &flag, MPI_STATUS_IGNORE);
                    if (err != MPI_SUCCESS) return dp__mpi_fail(m, err, "MPI_Test");
                    if (!flag) break;
                    s->done++;
                    *moved = more = 1;
                }
            }
        }
        /* receives: post, then take at most one completed segment per
         * stream before servicing the sends again */
        for (int i = 0; i < st->nrecv; i++) {
            struct stream *s = &rq->rs[i];
            const struct xfer *x = &st->recv[i];
            int scratch = st->reduce && i == 0;
            for (; s->posted < s->nseg && s->posted - s->done < s->win; s->posted++) {
                size_t o, n;
                seg_of(x, s, s->posted, &o, &n);
                char *dst = scratch ? m->scratch + (size_t)(s->posted % s->win) * s->seg : buf + o;
                err = MPI_Irecv(dst, (int)n, MPI_BYTE, x->peer, tag, m->p2p,
                                &s->req[s->posted % s->win]);
                if (err != MPI_SUCCESS) return dp__mpi_fail(m, err, "MPI_Irecv");
                rq->inflight = 1;
            }
            if (s->done < s->posted) {
                int flag = 0;
                err = MPI_Test(&s->req[s->done % s->win], &flag, MPI_STATUS_IGNORE);
                if (err != MPI_SUCCESS) return dp__mpi_fail(m, err, "MPI_Test");
                if (!flag) continue;
                if (scratch) {
                    size_t o, n;
                    seg_of(x, s, s->done, &o, &n);
                    dp__reduce_add(buf + o, m->scratch + (size_t)(s->done % s->win) * s->seg,
                                   (int64_t)(n / dp_dtype_size(rq->d.dtype)), rq->d.dtype);
                }
                s->done++;
                *moved = again = 1;
            }
        }
    }
    int done = 1;
    for (int i = 0; i < 2; i++)
        done &= rq->ss[i].done == rq->ss[i].nseg && rq->rs[i].done == rq->rs[i].nseg;
    *step_done = done;
    return 0;
}

/* Runs rq's schedule as far as it goes without blocking. */
static int p2p_poll(struct mpi_comm *m, struct dp_comm_req *rq, int *done, int *moved) {
    while (rq->cur < rq->nsteps) {
        int step_done = 0, rc = step_poll(m, rq, &step_done, moved);
        if (rc) return rc;
        if (!step_done) {
            *done = 0;
            return 0;
        }
        rq->cur++, rq->begun = 0;
        rq->inflight = 0;
        *moved = 1;
    }
    *done = 1;
    return 0;
}

/* ---- the queue ------------------------------------------------------------------------------- */

/* Advances the pending operations in issue order without blocking: the
 * first unfinished one is polled (for ring and rhd, run as far as it goes),
 * and while it finishes, the next.  Native operations further back progress
 * inside MPI meanwhile.  Returns the first unfinished request (NULL if none). */
struct dp_comm_req *dp__mpi_poll_queue(struct mpi_comm *m, int *moved) {
    for (struct dp_comm_req *rq = m->head; rq; rq = rq->next) {
        if (rq->done) continue;
        int rc = dp__mpi_aborted_status(m), done = 0;
        if (rc) {
            dp__mpi_fail_op(m, rq, rc);
            continue;
        }
        dp_clearerr();
        rc = rq->kind == KIND_NATIVE ? dp__mpi_native_poll(m, rq, &done) : p2p_poll(m, rq, &done, moved);
        if (rc) {
            dp__mpi_fail_op(m, rq, rc);
            *moved = 1;
            continue;
        }
        if (!done) return rq;
        dp__mpi_finish(rq, 0);
        *moved = 1;
    }
    return NULL;
}

/* ---- timeouts --------------------------------------------------------------------------------- */

/* rq has waited timeout_s.  Asks every other rank, over the side
 * communicator, which operation it is stuck in: this rank sends (seq, coll)
 * to all and listens for GRACE_S for the same from the others (they send it
 * when they time out themselves, so the ranks that reached this operation
 * answer within about the grace period).  The ranks that neither answered
 * nor reached this operation are named.  Every MPI call here is nonblocking
 * and polled against the grace deadline, so a stalled or dead peer costs
 * GRACE_S, never a hang.  Fails rq with DP_ECANCELED and aborts the
 * communicator with the message. */
void dp__mpi_timed_out(struct mpi_comm *m, struct dp_comm_req *rq) {
    int P = m->base.nranks, r = m->base.rank;
    char msg[MSG_LEN], silent[MSG_LEN] = "", elsewhere[MSG_LEN] = "";
    int nsilent = 0, nelse = 0, ok = 0;
    uint64_t *in = dp_calloc((size_t)P, 2 * sizeof *in);
    MPI_Request *rin = dp_malloc(sizeof *rin * (size_t)P), *rout = dp_malloc(sizeof *rout * (size_t)P);
    int *got = dp_calloc((size_t)P, sizeof *got);
    if (in && rin && rout && got && !m->diag_sent) {
        ok = 1;
        m->diag_out[0] = rq->seq, m->diag_out[1] = (uint64_t)rq->d.coll;
        m->diag_sent = 1;
        for (int q = 0; q < P; q++) {
            rin[q] = rout[q] = MPI_REQUEST_NULL;
            if (q == r) continue;
            if (MPI_Irecv(in + 2 * q, 2, MPI_UINT64_T, q, 1, m->side, &rin[q]) != MPI_SUCCESS ||
                MPI_Isend(m->diag_out, 2, MPI_UINT64_T, q, 1, m->side, &rout[q]) != MPI_SUCCESS)
                ok = 0;
        }
        double end = dp_time() + GRACE_S;
        int pending = P - 1;
        while (ok && pending > 0 && dp_time() < end) {
            for (int q = 0; q < P; q++) {
                int flag = 0;
                if (q == r || got[q]) continue;
                if (MPI_Test(&rin[q], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) ok = 0;
                if (flag) got[q] = 1, pending--;
            }
            struct timespec ts = {0, 1000000L};
            if (pending) nanosleep(&ts, NULL);
        }
        /* Unanswered receives are cancelled (local for receives); sends still
         * queued to a silent rank are let go, with diag_out kept alive. */
        for (int q = 0; q < P; q++) {
            int flag = 0;
            if (q == r) continue;
            if (!got[q] && rin[q] != MPI_REQUEST_NULL) {
                MPI_Cancel(&rin[q]);
                MPI_Status st;
                MPI_Wait(&rin[q], &st);
                MPI_Test_cancelled(&st, &flag);
                if (!flag) got[q] = 1; /* it arrived after all */
            }
            if (rout[q] != MPI_REQUEST_NULL) {
                MPI_Test(&rout[q], &flag, MPI_STATUS_IGNORE);
                if (!flag) MPI_Request_free(&rout[q]), m->diag_sent = 2;
            }
        }
        size_t ns = 0, ne = 0;
        for (int q = 0; ok && q < P; q++) {
            if (q == r) continue;
            if (!got[q]) {
                m->lost[q] = 1;
                if (ns < sizeof silent - 16)
                    ns += (size_t)snprintf(silent + ns, sizeof silent - ns, "%s%d",
                                           nsilent ? ", " : "", q);
                nsilent++;
            } else if (in[2 * q] != rq->seq || in[2 * q + 1] != (uint64_t)rq->d.coll) {
                if (ne < sizeof elsewhere - 64)
                    ne += (size_t)snprintf(elsewhere + ne, sizeof elsewhere - ne,
                                           "%srank %d is waiting in %s #%llu", nelse ? "; " : "",
                                           q, dp_comm_coll_name((enum dp_comm_coll)in[2 * q + 1]),
                                           (unsigned long long)in[2 * q]);
                nelse++;
            }
        }
    }
    dp_free(in), dp_free(rin), dp_free(rout), dp_free(got);
    int k = snprintf(msg, sizeof msg, "comm: timeout after %.3g s in %s #%llu on rank %d: ",
                     m->timeout_s, dp_comm_coll_name(rq->d.coll), (unsigned long long)rq->seq, r);
    size_t rest = k > 0 && (size_t)k < sizeof msg ? sizeof msg - (size_t)k : 0;
    if (!ok)
        snprintf(msg + k, rest, "could not ask the other ranks where they are");
    else if (nsilent && nelse)
        snprintf(msg + k, rest, "rank%s %s did not respond (stalled or lost); %s",
                 nsilent > 1 ? "s" : "", silent, elsewhere);
    else if (nsilent)
        snprintf(msg + k, rest, "rank%s %s did not respond (stalled or lost)",
                 nsilent > 1 ? "s" : "", silent);
    else if (nelse)
        snprintf(msg + k, rest, "%s", elsewhere);
    else
        snprintf(msg + k, rest, "every rank reached this operation and timed out in it");
    dp_seterr(DP_ECANCELED, "%s", msg);
    dp__mpi_fail_op(m, rq, DP_ECANCELED);
}

#endif /* DP_WITH_MPI */
