/* Backup workers across processes: the gather-based step (dp/ddp.h,
 * dp_backup_star_*; docs/ddp.md "Backup workers").
 *
 * An all-reduce needs every rank, so a step that takes only the first
 * G - b gradients cannot be one.  Instead the step goes through rank 0, in
 * a star of point-to-point messages (dp_comm_isend/irecv):
 *
 *   rank r > 0, step s:  send [s, n_r | g_r] to rank 0 (tag GRAD), then
 *                        receive step s's update from rank 0 (tag UPD)
 *   rank 0's worker:     hands [s, n_0 | g_0] to the collector thread in
 *                        memory, then waits for step s's update
 *   the collector        (a thread of rank 0's process, the only user of
 *                        the messages there) accepts, for the open step s,
 *                        the first G - b arrivals, whoever they are; when the
 *                        last one is in it sums the accepted g_r in rank
 *                        order, scales by 1 / (sum of their n_r x positions),
 *                        and sends [s, n_acc, bad, accepted set | u] to every
 *                        rank (dropped ones included), then opens s + 1
 *
 * A late rank's gradient for a closed step is received and discarded; the
 * late rank then takes the update that is already waiting for it and starts
 * s + 1 from the new parameters, as on threads.  Each rank has at most one
 * gradient in flight (it sends s + 1 only after it has received update s),
 * and one sender's messages arrive in order, so no step number is needed in
 * the tags.  Updates live in a ring of DP_BACKUP_DEPTH slots: slot s % D is
 * reused only once every send of step s - D has completed (the ranks that
 * close steps run at most D steps ahead of the latest).  Which ranks are
 * accepted depends on timing; the sum over a given accepted set does not
 * (rank order), so with b = 0 the result is the bits of the thread slot's.
 *
 * Failure.  A timeout (the communicator's) on a remote rank's wait names
 * rank 0; the collector's own wait for the open step names the ranks that
 * have not arrived.  dp_backup_star_abort wakes rank 0's worker and stops
 * the collector; at the end (dp_backup_star_free) the collector withdraws
 * the receives that nobody will answer, after every update was delivered. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/core_impl.h"
#include "dp/ddp.h"

enum { TAG_GRAD = 101, TAG_UPD = 102 };

/* [header | floats]: the header is two 8-byte words (gradient) or
 * 3 words + the accepted set (update), padded to 8 bytes. */
struct grad_hdr {
    int64_t step;
    double n;
};
struct upd_hdr {
    int64_t step;
    double n_acc;
    int64_t bad;
};

struct dp_backup_star {
    struct dp_comm *c;
    int G, rank, need;
    int64_t n;                 /* floats per gradient */
    double pos;                /* loss terms per sample */
    double timeout_s;
    size_t grad_bytes, upd_bytes, set_off, upd_data_off;
    /* every rank: its send buffer (rank > 0) and the update it receives */
    char *sendbuf, *recvbuf;
    /* rank 0 */
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int sync_init;
    int failed, stop;
    char why[400];
    /* the local worker's arrival (under mu) */
    int64_t local_step;        /* the step it arrived at (-1: none pending) */
    const float *local_g;
    double local_n;
    /* the collector's state */
    char **rbuf;               /* (G) receive buffers of the remote ranks */
    struct dp_comm_msg **rmsg; /* (G) the posted receive, or NULL while its buffer is held */
    int *held;                 /* (G) 1: rbuf[r] holds an accepted gradient of the open step */
    int64_t *arrived;          /* (G) the last step each rank arrived at (-1) */
    int local_held;
    int64_t open;
    int count;
    char *upd[DP_BACKUP_DEPTH];            /* [upd_hdr | set | floats] */
    int64_t upd_step[DP_BACKUP_DEPTH];     /* -1: free */
    struct dp_comm_msg **usend[DP_BACKUP_DEPTH]; /* (G) the update's sends in flight */
    int consumed[DP_BACKUP_DEPTH];         /* rank 0's worker took it */
    double t_open;             /* when the open step opened (timeouts) */
};

static size_t round8(size_t x) { return (x + 7) & ~(size_t)7; }

static void star_fail(struct dp_backup_star *bs, const char *fmt, const char *arg) {
    pthread_mutex_lock(&bs->mu);
    if (!bs->failed) {
        bs->failed = 1;
        snprintf(bs->why, sizeof bs->why, fmt, arg);
    }
    pthread_cond_broadcast(&bs->cv);
    pthread_mutex_unlock(&bs->mu);
}

/* The update of step open into ring slot k: the accepted gradients summed
 * in rank order, scaled to the mean over their samples x positions. */
static void close_step(struct dp_backup_star *bs, int k) {
    char *u = bs->upd[k];
    float *out = (float *)(u + bs->upd_data_off);
    unsigned char *set = (unsigned char *)(u + bs->set_off);
    double n_acc = 0;
    int first = 1;
    for (int r = 0; r < bs->G; r++) {
        const float *g = NULL;
        double n = 0;
        if (r == 0 && bs->local_held) g = bs->local_g, n = bs->local_n;
        else if (r > 0 && bs->held[r]) {
            const struct grad_hdr *h = (const struct grad_hdr *)bs->rbuf[r];
            g = (const float *)(bs->rbuf[r] + sizeof *h), n = h->n;
        }
        set[r] = g != NULL;
        if (!g) continue;
        n_acc += n;
        if (first) {
            memcpy(out, g, sizeof(float) * (size_t)bs->n), first = 0;
        } else {
#pragma omp simd
            for (int64_t i = 0; i < bs->n; i++) out[i] += g[i];
        }
    }
    float scale = n_acc > 0 ? (float)(1.0 / (n_acc * bs->pos)) : 0.0f;
    int bad = 0;
    for (int64_t i = 0; i < bs->n; i++) {
        out[i] *= scale;
        bad |= !isfinite(out[i]);
    }
    struct upd_hdr *h = (struct upd_hdr *)u;
    h->step = bs->open, h->n_acc = n_acc, h->bad = n_acc > 0 && bad;
}

/* A remote rank's receive for its next gradient. */
static int post(struct dp_backup_star *bs, int r) {
    return dp_comm_irecv(bs->c, bs->rbuf[r], (int64_t)bs->grad_bytes, r, TAG_GRAD, &bs->rmsg[r]);
}

static void nap(long ns) {
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

/* The collector: rank 0's thread that runs the steps (see the top). */
static void *collector(void *arg) {
    struct dp_backup_star *bs = arg;
    char msg[400];
    int rc = 0;
    long sleep_ns = 2000;
    for (int r = 1; r < bs->G && !rc; r++) rc = post(bs, r);
    bs->t_open = dp_time();
    while (!rc) {
        int moved = 0;
        pthread_mutex_lock(&bs->mu);
        int stop = bs->stop || bs->failed;
        /* rank 0's own arrival */
        if (!stop && bs->local_step == bs->open && !bs->local_held && bs->count < bs->need) {
            bs->local_held = 1, bs->count++, moved = 1;
        }
        if (bs->local_step >= 0) bs->arrived[0] = bs->local_step;
        pthread_mutex_unlock(&bs->mu);
        if (stop) break;
        /* remote arrivals */
        for (int r = 1; r < bs->G && !rc; r++) {
            int done = 0;
            if (!bs->rmsg[r] || (rc = dp_comm_msg_test(bs->c, bs->rmsg[r], &done)) || !done) continue;
            struct dp_comm_msg *m = bs->rmsg[r];
            bs->rmsg[r] = NULL;
            if ((rc = dp_comm_msg_wait(bs->c, m, NULL, NULL))) break;
            moved = 1;
            int64_t s = ((const struct grad_hdr *)bs->rbuf[r])->step;
            bs->arrived[r] = s;
            if (s == bs->open && bs->count < bs->need) bs->held[r] = 1, bs->count++;
            else if (s > bs->open) {
                snprintf(msg, sizeof msg, "backup workers: rank %d sent step %lld while step %lld is open "
                         "(the ranks disagree on the run)", r, (long long)s, (long long)bs->open);
                rc = dp_seterr(DP_EMISMATCH, "%s", msg);
            } else
                rc = post(bs, r); /* late: dropped, the next one posted */
        }
        if (rc) break;
        /* updates delivered: free ring slots */
        for (int k = 0; k < DP_BACKUP_DEPTH && !rc; k++) {
            if (bs->upd_step[k] < 0) continue;
            int all = 1;
            for (int r = 1; r < bs->G && !rc; r++) {
                int done = 0;
                if (!bs->usend[k][r]) continue;
                if ((rc = dp_comm_msg_test(bs->c, bs->usend[k][r], &done))) break;
                if (!done) { all = 0; continue; }
                rc = dp_comm_msg_wait(bs->c, bs->usend[k][r], NULL, NULL);
                bs->usend[k][r] = NULL;
                moved = 1;
            }
            pthread_mutex_lock(&bs->mu);
            if (all && bs->consumed[k]) bs->upd_step[k] = -1;
            pthread_mutex_unlock(&bs->mu);
        }
        if (rc) break;
        /* close the open step once G - b are in and its ring slot is free */
        int k = (int)(bs->open % DP_BACKUP_DEPTH);
        if (bs->count == bs->need && bs->upd_step[k] < 0) {
            close_step(bs, k);
            for (int r = 1; r < bs->G && !rc; r++)
                rc = dp_comm_isend(bs->c, bs->upd[k], (int64_t)bs->upd_bytes, r, TAG_UPD, &bs->usend[k][r]);
            if (rc) break;
            pthread_mutex_lock(&bs->mu);
            bs->upd_step[k] = bs->open;
            bs->consumed[k] = 0;
            bs->local_held = 0; /* rank 0's worker copies the update, not its own g */
            bs->open++, bs->count = 0;
            pthread_cond_broadcast(&bs->cv);
            pthread_mutex_unlock(&bs->mu);
            for (int r = 1; r < bs->G && !rc; r++)
                if (bs->held[r]) bs->held[r] = 0, rc = post(bs, r);
            bs->t_open = dp_time();
            moved = 1;
        }
        if (rc) break;
        if (moved) {
            sleep_ns = 2000;
            continue;
        }
        if (bs->timeout_s > 0 && dp_time() - bs->t_open > bs->timeout_s) {
            char who[200] = "";
            size_t len = 0;
            for (int r = 0; r < bs->G && len + 16 < sizeof who; r++)
                if (bs->arrived[r] < bs->open)
                    len += (size_t)snprintf(who + len, sizeof who - len, "%s%d", len ? ", " : "", r);
            snprintf(msg, sizeof msg, "comm: timeout after %.1f s in backup-workers step %lld on rank 0: %s%s",
                     bs->timeout_s, (long long)bs->open,
                     len ? "rank(s) did not arrive: " : "a rank did not take an update", who);
            rc = dp_seterr(DP_ECANCELED, "%s", msg);
            break;
        }
        nap(sleep_ns);
        if (sleep_ns < 256000) sleep_ns *= 2;
    }
    if (rc) {
        snprintf(msg, sizeof msg, "%s", dp_errmsg());
        star_fail(bs, "%s", msg);
        dp_comm_abort(bs->c, msg);
        return NULL;
    }
    /* stopped: every update must reach its rank before the receives that
     * nobody will answer are withdrawn */
    int failed;
    pthread_mutex_lock(&bs->mu);
    failed = bs->failed;
    pthread_mutex_unlock(&bs->mu);
    for (int k = 0; k < DP_BACKUP_DEPTH; k++)
        for (int r = 1; r < bs->G; r++)
            if (bs->usend[k][r]) {
                if (failed) dp_comm_msg_cancel(bs->c, bs->usend[k][r]);
                else dp_comm_msg_wait(bs->c, bs->usend[k][r], NULL, NULL);
                bs->usend[k][r] = NULL;
            }
    for (int r = 1; r < bs->G; r++)
        if (bs->rmsg[r]) dp_comm_msg_cancel(bs->c, bs->rmsg[r]), bs->rmsg[r] = NULL;
    return NULL;
}

int dp_backup_star_init(struct dp_backup_star **out, struct dp_comm *c, int64_t n, int backup, double positions,
                        double timeout_s) {
    *out = NULL;
    int G = dp_comm_world(c), rank = dp_comm_rank(c);
    if (backup < 0 || backup >= G)
        return dp_seterr(DP_EINVAL, "--backup-workers must be in 0..%d (got %d)", G - 1, backup);
    struct dp_backup_star *bs = dp_calloc(1, sizeof *bs);
    if (!bs) return dp_seterr(DP_ENOMEM, "backup workers: out of memory");
    bs->c = c, bs->G = G, bs->rank = rank, bs->need = G - backup, bs->n = n, bs->pos = positions;
    bs->timeout_s = timeout_s;
    bs->grad_bytes = sizeof(struct grad_hdr) + sizeof(float) * (size_t)n;
    bs->set_off = sizeof(struct upd_hdr);
    bs->upd_data_off = round8(bs->set_off + (size_t)G);
    bs->upd_bytes = bs->upd_data_off + sizeof(float) * (size_t)n;
    bs->local_step = -1;
    int bad = 0;
    if (rank > 0) {
        bs->sendbuf = dp_malloc_big(bs->grad_bytes);
        bs->recvbuf = dp_malloc_big(bs->upd_bytes);
        bad = !bs->sendbuf || !bs->recvbuf;
    } else {
        bs->rbuf = dp_calloc((size_t)G, sizeof *bs->rbuf);
        bs->rmsg = dp_calloc((size_t)G, sizeof *bs->rmsg);
        bs->held = dp_calloc((size_t)G, sizeof *bs->held);
        bs->arrived = dp_calloc((size_t)G, sizeof *bs->arrived);
        bad = !bs->rbuf || !bs->rmsg || !bs->held || !bs->arrived;
        for (int r = 1; !bad && r < G; r++) bad = !(bs->rbuf[r] = dp_malloc_big(bs->grad_bytes));
        for (int r = 0; !bad && r < G; r++) bs->arrived[r] = -1;
        for (int k = 0; !bad && k < DP_BACKUP_DEPTH; k++) {
            bs->upd[k] = dp_malloc_big(bs->upd_bytes);
            bs->usend[k] = dp_calloc((size_t)G, sizeof *bs->usend[k]);
            bs->upd_step[k] = -1;
            bad = !bs->upd[k] || !bs->usend[k];
        }
    }
    if (bad) {
        dp_backup_star_free(bs);
        return dp_seterr(DP_ENOMEM, "backup workers: out of memory");
    }
    *out = bs;
    return DP_OK;
}

int dp_backup_star_start(struct dp_backup_star *bs, int64_t first_step) {
    if (bs->rank != 0) return DP_OK;
    bs->open = first_step;
    if (pthread_mutex_init(&bs->mu, NULL)) return dp_seterr(DP_ENOMEM, "backup workers: cannot create a mutex");
    if (dp_cond_init_monotonic(&bs->cv)) {
        pthread_mutex_destroy(&bs->mu);
        return dp_seterr(DP_ENOMEM, "backup workers: cannot create a condition variable");
    }
    bs->sync_init = 1;
    if (dp__thread_start(&bs->thread, "dp-backup", collector, bs))
        return dp_seterr(DP_ENOMEM, "backup workers: cannot start the collector thread");
    bs->started = 1;
    return DP_OK;
}

int dp_backup_star_step(struct dp_backup_star *bs, int64_t step, float *g, double n_local, double *n_acc, int *bad,
                        unsigned char *accepted) {
    const struct upd_hdr *h;
    const char *u;
    if (bs->rank > 0) {
        struct grad_hdr gh = {step, n_local};
        memcpy(bs->sendbuf, &gh, sizeof gh);
        memcpy(bs->sendbuf + sizeof gh, g, sizeof(float) * (size_t)bs->n);
        struct dp_comm_msg *m, *um;
        int rc = dp_comm_isend(bs->c, bs->sendbuf, (int64_t)bs->grad_bytes, 0, TAG_GRAD, &m);
        if (rc) return rc;
        if ((rc = dp_comm_irecv(bs->c, bs->recvbuf, (int64_t)bs->upd_bytes, 0, TAG_UPD, &um))) {
            dp_comm_msg_cancel(bs->c, m);
            return rc;
        }
        /* Wait for the update by polling, up to twice the timeout: rank 0's
         * collector names a stalled rank after one timeout, and that message
         * (the cause) should end the job before this rank's (which could
         * only name rank 0). */
        double t0 = dp_time();
        long sleep_ns = 2000;
        int done = 0;
        while (!rc && !(rc = dp_comm_msg_test(bs->c, um, &done)) && !done) {
            if ((rc = dp_comm_status(bs->c))) break;
            if (bs->timeout_s > 0 && dp_time() - t0 > 2 * bs->timeout_s) {
                rc = dp_seterr(DP_ECANCELED, "backup workers: rank %d received no update of step %lld from rank 0 "
                               "within %.1f s", bs->rank, (long long)step, 2 * bs->timeout_s);
                break;
            }
            nap(sleep_ns);
            if (sleep_ns < 256000) sleep_ns *= 2;
        }
        if (rc) {
            char msg[400];
            snprintf(msg, sizeof msg, "%s", dp_errmsg());
            dp_comm_msg_cancel(bs->c, um), dp_comm_msg_cancel(bs->c, m);
            return dp_seterr(rc, "%s", msg);
        }
        if ((rc = dp_comm_msg_wait(bs->c, um, NULL, NULL))) {
            dp_comm_msg_cancel(bs->c, m);
            return rc;
        }
        /* the gradient was taken before its update was sent */
        if ((rc = dp_comm_msg_wait(bs->c, m, NULL, NULL))) return rc;
        u = bs->recvbuf;
        h = (const struct upd_hdr *)u;
        if (h->step != step)
            return dp_seterr(DP_EMISMATCH, "backup workers: rank %d at step %lld received the update of step %lld",
                             bs->rank, (long long)step, (long long)h->step);
    } else {
        int k = (int)(step % DP_BACKUP_DEPTH);
        double deadline = bs->timeout_s > 0 ? dp_time() + 2 * bs->timeout_s : 0;
        pthread_mutex_lock(&bs->mu);
        bs->local_step = step, bs->local_g = g, bs->local_n = n_local;
        while (!bs->failed && bs->upd_step[k] != step) {
            /* the collector names a stalled rank after timeout_s; this is a backstop */
            if (deadline > 0 && dp_time() > deadline) {
                bs->failed = 1;
                snprintf(bs->why, sizeof bs->why, "backup workers: step %lld on rank 0 did not close in %.1f s",
                         (long long)step, 2 * bs->timeout_s);
                break;
            }
            dp_cond_wait_until(&bs->cv, &bs->mu, dp_time() + 0.05);
        }
        if (bs->failed) {
            char why[sizeof bs->why];
            snprintf(why, sizeof why, "%s", bs->why);
            pthread_mutex_unlock(&bs->mu);
            return dp_seterr(DP_ECANCELED, "%s", why);
        }
        pthread_mutex_unlock(&bs->mu);
        u = bs->upd[k];
        h = (const struct upd_hdr *)u;
    }
    *n_acc = h->n_acc, *bad = (int)h->bad;
    memcpy(accepted, u + bs->set_off, (size_t)bs->G);
    memcpy(g, u + bs->upd_data_off, sizeof(float) * (size_t)bs->n);
    if (bs->rank == 0) {
        pthread_mutex_lock(&bs->mu);
        bs->consumed[step % DP_BACKUP_DEPTH] = 1;
        pthread_mutex_unlock(&bs->mu);
    }
    return DP_OK;
}

void dp_backup_star_abort(struct dp_backup_star *bs, const char *why) {
    if (!bs || bs->rank != 0 || !bs->sync_init) return;
    star_fail(bs, "%s", why);
}

void dp_backup_star_free(struct dp_backup_star *bs) {
    if (!bs) return;
    if (bs->started) {
        pthread_mutex_lock(&bs->mu);
        bs->stop = 1;
        pthread_mutex_unlock(&bs->mu);
        pthread_join(bs->thread, NULL);
    }
    if (bs->sync_init) pthread_mutex_destroy(&bs->mu), pthread_cond_destroy(&bs->cv);
    dp_free(bs->sendbuf), dp_free(bs->recvbuf);
    for (int r = 0; bs->rbuf && r < bs->G; r++) dp_free(bs->rbuf[r]);
    dp_free(bs->rbuf), dp_free(bs->rmsg), dp_free(bs->held), dp_free(bs->arrived);
    for (int k = 0; k < DP_BACKUP_DEPTH; k++) dp_free(bs->upd[k]), dp_free(bs->usend[k]);
    dp_free(bs);
}
