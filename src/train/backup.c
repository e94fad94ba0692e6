/* Backup workers (--backup-workers b): the mode's setup and step. */
#include "trainer.h"

/* Each synchronous step takes the
 * gradients of the first P - b workers to finish their compute and drops the
 * others'; every worker, accepted or late, applies the accepted samples' mean
 * gradient.  The protocol lives in src/ddp/: backup_slot.c on the threads of
 * one process, backup_star.c through rank 0 across processes (one worker
 * each); both give, for a given accepted set, the same bits. */

/* Wakes every waiter of the slot (or rank 0's star) with an error (idempotent; any thread). */
void dp__backup_abort(struct dp_trainer *t, const char *why) {
    if (t->star) dp_backup_star_abort(t->star, why);
    if (t->slot) dp_backup_slot_abort(t->slot, why);
}

/* The mode's setup: the step slot on threads, rank 0's collector across processes */
static int backup_setup(struct dp_trainer *t) {
    const struct dp_train_params *p = &t->p;
    if (!(t->dropped_count = dp_calloc((size_t)t->G, sizeof(int64_t))))
        return dp_seterr(DP_ENOMEM, "--backup-workers: out of memory");
    if (!p->dp.inter)
        return dp_backup_slot_init(&t->slot, t->P, t->base, t->model->num_params, p->dp.backup_workers, (double)t->pos,
                                   p->dp.comm_timeout);
    return dp_backup_star_init(&t->star, p->dp.inter, t->model->num_params, p->dp.backup_workers, (double)t->pos,
                               p->dp.comm_timeout);
}

/* One step: the compute (no reduction hooks: the gradient sums stay local),
 * then the first P - b ranks' mean gradient (the slot, or the star across
 * processes), the decision on it, the update. */
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
    /* w->rep.grads: this rank's gradient sum in, the step's mean gradient out; w->dropped: the accepted */
    rc = t->star ? dp_backup_star_step(t->star, w->step, w->rep.grads, c.n_local, &n_acc, &bad, w->dropped)
                 : dp_backup_slot_step(t->slot, w->rank, w->comm, w->step, w->rep.grads, c.n_local, &n_acc, &bad,
                                       w->dropped);
    w->ndropped = 0;
    for (int r = 0; !rc && r < (t->star ? t->G : t->P); r++) w->dropped[r] = !w->dropped[r], w->ndropped += w->dropped[r];
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
        if (t->p.dp.skip_nonfinite) {
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
