/* Backup workers (--backup-workers b): each step takes the gradients of the
 * first P - b workers to finish. */
#include "trainer.h"

/* ---- backup workers (--backup-workers b) ---------------------------------------------------
 * Each synchronous step takes the gradients of the first P - b workers to
 * finish their compute and drops the others'.  No collective is involved
 * (an all-reduce needs every rank): the P workers of this process meet in
 * t->bk under one mutex.  Every worker runs every step, in order:
 *
 *   compute its gradient sum g_r over its n_r samples (loss scale 1)
 *   arrive at step s:  if s is still open and fewer than P - b ranks were
 *       accepted, it is accepted (the slot keeps a pointer to g_r, which
 *       it leaves untouched until s is published); else it is dropped
 *   the (P - b)-th accepted rank closes s: once ring slot s % D is free
 *       (every worker took step s - D), it writes
 *           u = (sum over accepted r, in rank order, of g_r) / (sum n_r x pos)
 *       the mean gradient over the accepted samples, whatever the arrival
 *       order within the accepted set, marks the others dropped, and opens
 *       s + 1
 *   every worker, accepted or late, waits for step s's u, copies it, and
 *   applies it with its own optimizer: the same bits on every replica
 *
 * So a late worker finishes its (dropped) compute, applies the step's update
 * and starts step s + 1 from the new parameters.  The ranks that close steps
 * run at most D steps ahead of the latest one (the ring), and since every
 * worker runs the same sequence of steps, the collectives between steps
 * (--check-replicas, the epoch's totals, --balance) stay matched.  No step
 * ends half-done: a worker that fails sets bk.failed (backup_abort, from
 * worker_main) and every waiter returns DP_ECANCELED; a wait longer than
 * --comm-timeout fails the run naming the ranks that did not arrive.  A step
 * whose accepted ranks had no samples (empty shares) applies no update, on
 * every replica alike. */

/* Wakes every waiter of the slot with an error (idempotent; any thread). */
void dp__backup_abort(struct dp_trainer *t, const char *why) {
    struct backup *bk = &t->bk;
    if (t->star) dp_backup_star_abort(t->star, why);
    if (!t->bk_on || !bk->init) return;
    pthread_mutex_lock(&bk->mu);
    if (!bk->failed) {
        bk->failed = 1;
        snprintf(bk->why, sizeof bk->why, "%.300s", why);
    }
    pthread_cond_broadcast(&bk->cv);
    pthread_mutex_unlock(&bk->mu);
}

/* One wait on the slot (mu held) until deadline (dp_time; 0 = none).  At
 * the deadline it marks the slot failed with a message naming the ranks
 * that have not arrived at the open step, and returns 1 (the caller then
 * aborts the communicator too, as a collective's timeout does). */
static int backup_wait(struct worker *w, double deadline) {
    struct backup *bk = &w->t->bk;
    if (deadline <= 0) {
        pthread_cond_wait(&bk->cv, &bk->mu);
        return 0;
    }
    if (dp_cond_wait_until(&bk->cv, &bk->mu, deadline) != ETIMEDOUT) return 0;
    if (bk->failed) return 0;
    char who[200] = "";
    size_t len = 0;
    for (int r = 0; r < w->t->P && len + 16 < sizeof who; r++)
        if (bk->arrived[r] < bk->open) len += (size_t)snprintf(who + len, sizeof who - len, "%s%d", len ? ", " : "", w->t->base + r);
    snprintf(bk->why, sizeof bk->why, "comm: timeout after %.1f s in backup-workers step %lld on rank %d: %s",
             w->t->p.comm_timeout, (long long)bk->open, w->grank,
             len ? "rank(s) did not arrive: " : "a rank did not take the previous update");
    if (len) snprintf(bk->why + strlen(bk->why), sizeof bk->why - strlen(bk->why), "%s", who);
    bk->failed = 1;
    pthread_cond_broadcast(&bk->cv);
    return 1;
}

/* Worker w's arrival at its step w->step with its gradient sum in
 * w->rep.grads over n_local samples; on return w->rep.grads holds the step's
 * gradient (see above), *n_acc the accepted samples (0: apply nothing) and
 * *bad whether it is not finite; w->dropped the dropped ranks. */
static int backup_step(struct worker *w, double n_local, double *n_acc, int *bad) {
    struct dp_trainer *t = w->t;
    struct backup *bk = &t->bk;
    const int64_t s = w->step, np = t->model->num_params;
    const int k = (int)(s % BACKUP_DEPTH), P = t->P;
    double deadline = t->p.comm_timeout > 0 ? dp_time() + t->p.comm_timeout : 0;
    int timed = 0;
    pthread_mutex_lock(&bk->mu);
    bk->arrived[w->rank] = s;
    pthread_cond_broadcast(&bk->cv); /* a timeout message reads `arrived` */
    if (bk->open == s && bk->count < bk->need) {
        bk->src[w->rank] = w->rep.grads, bk->n[w->rank] = n_local;
        if (++bk->count == bk->need) {
            /* the closer: ring slot k must be free (every worker took step s - D) */
            while (!bk->failed && bk->upd_step[k] >= 0 && bk->consumed[k] < P) timed |= backup_wait(w, deadline);
            if (!bk->failed) {
                float *u = bk->upd[k];
                double n = 0;
                int first = 1;
                for (int r = 0; r < P; r++) {
                    bk->acc[k][r] = bk->src[r] != NULL;
                    if (!bk->src[r]) continue;
                    n += bk->n[r];
                    if (first) memcpy(u, bk->src[r], sizeof(float) * (size_t)np), first = 0;
                    else {
                        const float *g = bk->src[r];
#pragma omp simd
                        for (int64_t i = 0; i < np; i++) u[i] += g[i];
                    }
                    bk->src[r] = NULL;
                }
                /* sum -> mean over the accepted samples x positions */
                float scale = n > 0 ? (float)(1.0 / (n * (double)t->pos)) : 0.0f;
#pragma omp simd
                for (int64_t i = 0; i < np; i++) u[i] *= scale;
                bk->upd_n[k] = n;
                bk->upd_bad[k] = n > 0 && dp_any_nonfinite(u, np);
                bk->upd_step[k] = s;
                bk->consumed[k] = 0;
                bk->open = s + 1;
                bk->count = 0;
                pthread_cond_broadcast(&bk->cv);
            }
        }
    }
    while (!bk->failed && bk->upd_step[k] != s) timed |= backup_wait(w, deadline);
    if (bk->failed) {
        char why[sizeof bk->why];
        snprintf(why, sizeof why, "%s", bk->why);
        pthread_mutex_unlock(&bk->mu);
        if (timed) dp_comm_abort(w->comm, why); /* wake the ranks blocked in collectives */
        return dp_seterr(DP_ECANCELED, "%s", why);
    }
    *n_acc = bk->upd_n[k], *bad = bk->upd_bad[k];
    w->ndropped = 0;
    for (int r = 0; r < P; r++) w->dropped[r] = !bk->acc[k][r], w->ndropped += !bk->acc[k][r];
    pthread_mutex_unlock(&bk->mu);
    /* the slot is not rewritten before every worker has taken it (consumed) */
    memcpy(w->rep.grads, bk->upd[k], sizeof(float) * (size_t)np);
    pthread_mutex_lock(&bk->mu);
    if (++bk->consumed[k] == P) pthread_cond_broadcast(&bk->cv);
    pthread_mutex_unlock(&bk->mu);
    return DP_OK;
}

/* The same step across processes, through rank 0 (src/ddp/backup_star.c). */
static int backup_star(struct worker *w, double n_local, double *n_acc, int *bad) {
    struct dp_trainer *t = w->t;
    int rc = dp_backup_star_step(t->star, w->step, w->rep.grads, n_local, n_acc, bad, w->dropped);
    if (rc) return rc;
    w->ndropped = 0;
    for (int r = 0; r < t->G; r++) w->dropped[r] = !w->dropped[r], w->ndropped += w->dropped[r];
    return DP_OK;
}

/* The backup workers' step slot (the protocol is at backup_step). */
static int backup_slot_init(struct dp_trainer *t) {
    struct backup *bk = &t->bk;
    size_t np = (size_t)(t->model->num_params ? t->model->num_params : 1);
    bk->need = t->P - t->p.backup_workers;
    bk->src = dp_calloc((size_t)t->P, sizeof *bk->src);
    bk->n = dp_calloc((size_t)t->P, sizeof(double));
    bk->arrived = dp_calloc((size_t)t->P, sizeof(int64_t));
    t->dropped_count = dp_calloc((size_t)t->G, sizeof(int64_t));
    int bad = !bk->src || !bk->n || !bk->arrived || !t->dropped_count;
    for (int k = 0; k < BACKUP_DEPTH; k++) {
        bk->upd[k] = dp_malloc_big(sizeof(float) * np);
        bk->acc[k] = dp_calloc((size_t)t->P, 1);
        bad |= !bk->upd[k] || !bk->acc[k];
    }
    if (bad) return dp_seterr(DP_ENOMEM, "--backup-workers: out of memory");
    if (pthread_mutex_init(&bk->mu, NULL) != 0) return dp_seterr(DP_ENOMEM, "--backup-workers: cannot create a mutex");
    if (dp_cond_init_monotonic(&bk->cv) != 0) {
        pthread_mutex_destroy(&bk->mu);
        return dp_seterr(DP_ENOMEM, "--backup-workers: cannot create a condition variable");
    }
    bk->init = 1;
    return DP_OK;
}

/* The mode's setup: the step slot on threads, rank 0's collector across processes */
static int backup_setup(struct dp_trainer *t) {
    const struct dp_train_params *p = &t->p;
    if (!p->inter) return backup_slot_init(t);
    if (!(t->dropped_count = dp_calloc((size_t)t->G, sizeof(int64_t))))
        return dp_seterr(DP_ENOMEM, "--backup-workers: out of memory");
    return dp_backup_star_init(&t->star, p->inter, t->model->num_params, p->backup_workers, (double)t->pos,
                               p->comm_timeout);
}

/* One step: the compute (no reduction hooks: the gradient sums stay local),
 * then the first P - b ranks' mean gradient (backup_step, or backup_star
 * across processes), the decision on it, the update. */
static const struct dp__micro_hooks backup_hooks = {0};
static int backup_mode_step(struct worker *w, int64_t nmicro, int64_t *skipped, double *n_step, double *loss_step) {
    struct dp_trainer *t = w->t;
    struct dp__sums c;
    int rc = dp__compute(w, nmicro, &backup_hooks, &c);
    if (rc) return rc;
    /* the wait runs from the end of this rank's compute to the update */
    double n_acc = 0, tw = dp_time();
    int bad = 0;
    w->arrival[0] += tw - w->t_step0; /* one arrival per step: "bucket" 0, as in det_step */
    w->arrival_steps++;
    rc = t->star ? backup_star(w, c.n_local, &n_acc, &bad) : backup_step(w, c.n_local, &n_acc, &bad);
    double te = dp_time();
    w->step_wait = t->G > 1 ? te - tw : 0;
    w->t_comm += te - tw, w->t_exposed += te - tw;
    if (t->G > 1) dp_timeline_add(&w->tl, "wait", 0, w->step, tw, te);
    if (rc) return rc;
    w->t_wait += w->step_wait, w->t_slow += w->step_slow;
    *n_step = c.n_total;
    *loss_step = c.n_local > 0 ? c.loss_sum / (c.n_local * (double)t->pos) : 0;
    double t1 = dp_time();
    /* every replica has the same update, n_acc and flag: the same decision */
    if (bad) {
        if (t->p.skip_nonfinite) {
            (*skipped)++;
            return DP_OK;
        }
        return dp_seterr(DP_ENONFINITE, "step %lld (epoch %lld): the gradient of the accepted workers is not "
                         "finite; try a lower --lr, --clip, or --skip-nonfinite", (long long)w->step,
                         (long long)w->epoch + 1);
    }
    if (n_acc == 0) return DP_OK; /* the accepted ranks had no samples: no update */
    return dp__apply_update(w, t1);
}

const struct dp__mode dp__mode_backup = {.name = "backup workers", .setup = backup_setup, .loop = dp__step_loop,
                                         .step = backup_mode_step};
