/* The thread backend's point-to-point messages (dp_comm_isend and the rest): eager
 * envelopes in the receiver's mailbox. */
#include "comm_thread_impl.h"

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

int dp__thread_isend(struct dp_comm *c, const void *buf, int64_t bytes, int dest, int tag,
                   struct dp_comm_msg **msg) {
    struct thread_comm *tc = (struct thread_comm *)c;
    struct dp_comm_world *w = tc->w;
    if (w->inter)
        return dp_seterr(DP_ENOTSUP, "comm: send: point-to-point messages are not available in a "
                                     "hierarchical (processes x threads) world");
    int rc = dp__thread_world_status(w);
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

int dp__thread_irecv(struct dp_comm *c, void *buf, int64_t bytes, int src, int tag,
                   struct dp_comm_msg **msg) {
    struct thread_comm *tc = (struct thread_comm *)c;
    if (tc->w->inter)
        return dp_seterr(DP_ENOTSUP, "comm: recv: point-to-point messages are not available in a "
                                     "hierarchical (processes x threads) world");
    int rc = dp__thread_world_status(tc->w);
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

int dp__thread_msg_test(struct dp_comm *c, struct dp_comm_msg *m, int *done) {
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

int dp__thread_msg_wait(struct dp_comm *c, struct dp_comm_msg *m, int *src, int64_t *bytes) {
    struct thread_comm *tc = (struct thread_comm *)c;
    struct dp_comm_world *w = tc->w;
    int rc = 0, late = 0;
    if (!m->done) {
        struct slot *s = &w->slots[tc->local];
        double deadline = w->params.timeout_s > 0 ? dp_time() + w->params.timeout_s : 0;
        pthread_mutex_lock(&s->mb_mu);
        while (!take(tc, s, m)) {
            if ((rc = dp__thread_world_status(w))) break;
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
            rc = dp__thread_world_abort(w, msg);
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
int dp__thread_msg_cancel(struct dp_comm *c, struct dp_comm_msg *m) {
    (void)c;
    dp_free(m);
    return 0;
}
