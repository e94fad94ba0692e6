/* One synchronous training step: forward and backward over the micro-batches,
 * the bucketed all-reduce overlapped with backward (or ZeRO's reduce-scatter),
 * the non-finite check, clipping and the optimizer update. */
#include "trainer.h"

/* BatchNorm statistics summed over the workers (SyncBatchNorm).  Timed:
 * the all-reduce is mostly a wait for the slowest worker, which --balance
 * must not count as this worker's compute. */
/* The model's pass on b, or, on the worker, step and batch a test armed (fault.h), its fault in
 * the pass's place: an allocation or data error, or a NaN in one input (forward, loss and
 * gradients all turn NaN).  last: the step's last batch (micro-batch, or chunk). */
int dp__model_run(struct worker *w, const struct dp_batch *b, struct dp_pass *pass, int last) {
    const struct dp_trainer *t = w->t;
    const struct dp_model *m = t->model;
    int fault = t->fault.kind && w->grank == t->fault.worker && w->step == t->fault.step && last;
    if (fault && t->fault.kind == DP_FAULT_ALLOC) return dp_seterr(DP_ENOMEM, "injected allocation failure");
    if (fault && t->fault.kind == DP_FAULT_DATA) return dp_seterr(DP_EIO, "injected data error");
    if (!fault || t->fault.kind != DP_FAULT_NAN || b->B == 0) return dp_model_run(m, &w->rep, b, pass);
    size_t n = (size_t)(b->B * dp_shape_numel(&m->in_shape));
    float *x = dp_malloc(n * sizeof(float));
    if (!x) return dp_seterr(DP_ENOMEM, "out of memory");
    memcpy(x, b->x, n * sizeof(float));
    x[0] = NAN;
    struct dp_batch nb = *b;
    nb.x = x;
    int rc = dp_model_run(m, &w->rep, &nb, pass);
    dp_free(x);
    return rc;
}

static int stat_sync(void *arg, double *buf, int64_t n) {
    struct worker *w = arg;
    double t0 = dp_time();
    int rc = dp_comm_allreduce(w->comm, buf, n, DP_DTYPE_F64, DP_ALGO_AUTO);
    w->stat_s += dp_time() - t0;
    return rc;
}

/* The check for non-finite values inside the reduction.  After an
 * all-reduce every worker holds the same sum, and each worker used to read
 * all of it again to look for an Inf or a NaN: one more pass over the whole
 * gradient per worker and step (about 35 µs of mlp's 2.2 ms step on the
 * 2-core VM, docs/results.md "The check inside the reduction").  On threads
 * in one process the direct all-reduce hands each range to the worker that
 * summed it, while the sum is in that core's cache (dp_comm_iallreduce_post),
 * and that worker looks at it there: every element is looked at once, by one
 * worker.  A worker that finds one records the step in red_bad; every range
 * is looked at before any worker's all-reduce completes (the hook runs before
 * the summer's completion mark, which every rank waits for), so after the
 * reduction every worker reads the same verdict.  The decision that follows
 * (fail, or skip with --skip-nonfinite) is the one the full pass made: the
 * scaling after accumulation (by 1 / N <= 1) keeps finite values finite.
 * Only where the reduction is a plain all-reduce of every replica in this
 * process (not processes, ZeRO, compression, deterministic mode, backup
 * workers or the parameter server), with the direct algorithm for every
 * bucket. */
int dp__red_check_possible(const struct dp_trainer *t) {
    const struct dp_train_params *p = &t->p;
    if (t->G < 2 || t->G != t->P || p->dp.inter || p->dp.deterministic || p->dp.async || t->bk_on || p->dp.zero ||
        p->dp.pp > 1 ||
        p->dp.compress.kind != DP_COMPRESS_NONE)
        return 0;
    return dp_sync_post_supported(&t->w[0].sync);
}

void dp__reduced_check(void *arg, int64_t off, int64_t n) {
    struct worker *w = arg;
    if (dp_any_nonfinite(w->rep.grads + off, n))
        atomic_store_explicit(&w->t->red_bad, w->step + 1, memory_order_relaxed);
}

/* The update phase's seconds of one step (from the reduced gradient to the
 * updated parameters): the optimizer total, and --balance's fixed part
 * (not with ZeRO, whose update waits in its gather). */
void dp__update_done(struct worker *w, double s) {
    w->t_opt += s;
    if (!w->t->p.dp.zero) w->bal_a += s, w->bal_k++;
}

/* ---- a step's compute, shared by the modes that reduce gradients ----------------------
 * Each micro-batch: data -> [the mode's begin: the pass's hooks] -> forward and
 * backward -> [after_run: what the hooks left in flight when the run failed] ->
 * the simulated slowness -> [finish: the reduction's end and its accounting]. */
int dp__compute(struct worker *w, int64_t nmicro, const struct dp__micro_hooks *h, struct dp__sums *c) {
    struct dp_trainer *t = w->t;
    const struct dp_model *m = t->model;
    if (t->fault.kind == DP_FAULT_SLOW && w->grank == t->fault.worker && w->step >= t->fault.step)
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    int rc = dp_sync_step_begin(&w->sync, w->step); /* the gradient slab zeroed */
    if (rc) return rc;
    /* Forward in training mode updates the BatchNorm running statistics
     * before anyone knows whether this step will be skipped, and with
     * SyncBatchNorm one worker's NaN reaches every replica's statistics.
     * So with --skip-nonfinite the buffer slab (3 floats per BN channel:
     * 1353 floats for resnet, 0.4% of its parameters) is saved here and put back
     * if the step is skipped: a skipped step leaves parameters, buffers and
     * optimizer state exactly as they were.  (Deferring the update into
     * the layer would need a commit call through every layer for a copy
     * this small.) */
    if (w->buf_save) memcpy(w->buf_save, w->rep.buffers, sizeof(float) * (size_t)m->num_buffers);
    memset(c, 0, sizeof *c);
    double mult = 1, stall = 0;
    if (t->simulate) dp__pace_plan(w, &mult, &stall);
    w->step_wait = w->step_slow = 0;
    for (int64_t k = 0; k < nmicro; k++) {
        const struct dp_loader_batch *lb;
        double td = dp_time();
        rc = dp_loader_next(w->loader, &lb);
        if (rc) return rc;
        double ta = dp_time();
        dp_timeline_add(&w->tl, "data", 0, w->step, td, ta);
        int last_micro = k == nmicro - 1;
        struct dp_batch b = dp__batch_of(lb, 0, lb->B, 0, t->pos, dp_model_num_classes(m));
        struct dp_pass pass = {.training = 1, .backward = 1, .seed = t->p.run.seed, .loss_scale = 1.0f};
        int reducing = h->begin ? h->begin(w, &pass, k, nmicro, lb, c->n_total) : 0;
        dp__pace_start(w, mult, last_micro ? stall : 0, ta);
        double stat_before = w->stat_s;
        rc = dp__model_run(w, &b, &pass, last_micro);
        if (h->after_run) rc = h->after_run(w, &pass, reducing, rc);
        if (rc) return rc;
        /* the sleep paid inside backward (grad_ready) is not compute; the
         * rest of the debt is paid now, before the reduction is waited for */
        double slept_in_run = w->pace_slept;
        dp__pace_sleep(w);
        w->step_slow += w->pace_slept;
        /* --balance: this rank's compute, its simulated slowness included
         * (a slowed rank is a slower host); the wait for others is not, nor
         * SyncBatchNorm's all-reduces inside forward and backward (there a
         * faster rank waits for the slower one) */
        w->bal_n += (double)b.B;
        w->bal_s += pass.t_forward + pass.t_backward + (w->pace_slept - slept_in_run) - (w->stat_s - stat_before);
        dp_timeline_add(&w->tl, "forward", 0, w->step, ta, ta + pass.t_forward);
        dp_timeline_add(&w->tl, "backward", 0, w->step, ta + pass.t_forward, ta + pass.t_forward + pass.t_backward);
        if (reducing && (rc = h->finish(w, last_micro))) return rc;
        c->n_total += (double)lb->global_B;
        c->loss_sum += pass.loss_sum;
        c->local_bad |= !isfinite(pass.loss_sum);
        w->loss_sum += pass.loss_sum;
        w->correct += pass.correct;
        w->seen += b.B;
        c->n_local += (double)b.B;
        w->t_fwd += pass.t_forward;
        w->t_bwd += pass.t_backward - slept_in_run;
    }
    return DP_OK;
}

/* lr = schedule(step) -> [clip] -> the optimizer step (dp_sync_update), timed
 * from t1 (the reduced gradient's arrival); shared by the modes. */
int dp__apply_update(struct worker *w, double t1) {
    struct dp_trainer *t = w->t;
    int rc = dp_sync_update(&w->sync, dp_sched_lr(&t->p.sched, w->step), t->p.run.clip_norm);
    if (w->sync.t_gather1 > w->sync.t_gather0)
        dp_timeline_add(&w->tl, "gather", 0, w->step, w->sync.t_gather0, w->sync.t_gather1);
    if (t->fault.kind == DP_FAULT_DIVERGE && w->grank == t->fault.worker && w->step == t->fault.step &&
        !(rc = rc ? rc : dp_sync_settle(&w->sync))) /* (after the gather, which would write over it) */
        w->rep.params[t->model->num_params / 2] += 1e-3f;
    double t2 = dp_time();
    dp__update_done(w, t2 - t1);
    dp_timeline_add(&w->tl, "optimizer", 0, w->step, t1, t2);
    return rc;
}

/* ---- the synchronous mode: the reducer (buckets all-reduced as backward
 * finishes them, compression) or ZeRO's reduce-scatter ----------------------------------- */

/* Micro-batch k's hooks: dp_sync's (the reduction's grad_ready, ZeRO's
 * layer_begin, the loss scale), SyncBatchNorm's statistics, and the
 * simulated slowness paid inside backward before each range is handed on. */
static int sync_begin(struct worker *w, struct dp_pass *pass, int64_t k, int64_t nmicro,
                      const struct dp_loader_batch *lb, double n_before) {
    struct dp_trainer *t = w->t;
    int reducing = dp_sync_micro_begin(&w->sync, pass, k, nmicro, n_before, (double)lb->global_B);
    if (t->G > 1) pass->stat_sync = stat_sync, pass->stat_sync_arg = w;
    if (reducing && t->simulate) { /* the sleep in front of the sync's hook */
        w->pace_ready = pass->grad_ready, w->pace_ready_arg = pass->grad_ready_arg;
        pass->grad_ready = dp__paced_grad_ready, pass->grad_ready_arg = w;
    }
    dp__tp_begin(w, pass, &w->tp_hook); /* --tp: the group's sums, the replicated gradient counted once (tp.c) */
    return reducing;
}

static int sync_after_run(struct worker *w, const struct dp_pass *pass, int reducing, int rc) {
    if (rc) dp__tp_failed(w, rc); /* --tp: the group's other ranks, waiting in its sums, stop too */
    return dp_sync_micro_end(&w->sync, pass, reducing, rc);
}

/* The reduction's end (its cost goes to the sync's stats), and its
 * timeline: the wait, the buckets, the compression. */
static int sync_finish(struct worker *w, int last_micro) {
    int rc = dp_sync_finish(&w->sync, last_micro);
    const struct dp_reducer *r = &w->sync.red;
    /* wait: from the end of this rank's compute (backward and its
     * simulated sleep) to the completion of its last bucket */
    w->step_wait += r->t_end - r->t_backward_end;
    dp_timeline_add(&w->tl, "wait", 0, w->step, r->t_backward_end, r->t_end);
    for (int i = 0; i < r->nb; i++)
        if (r->b[i].t_ready > 0) {
            dp_timeline_add_bucket(&w->tl, i, (int64_t)sizeof(float) * r->b[i].count, r->b[i].t_ready,
                                   r->b[i].t_done);
            w->arrival[i] += r->b[i].t_ready - w->t_step0;
        }
    w->arrival_steps++;
    /* compression: its own phase on the compute track */
    for (int i = 0; i < r->nb; i++) {
        const struct dp_bucket *bk = &r->b[i];
        if (bk->t_c1 > 0) dp_timeline_add(&w->tl, "compress", 0, w->step, bk->t_c0, bk->t_c1);
        if (bk->t_d1 > 0) dp_timeline_add(&w->tl, "decompress", 0, w->step, bk->t_d0, bk->t_d1);
    }
    return rc;
}

static const struct dp__micro_hooks sync_hooks = {sync_begin, sync_after_run, sync_finish};

/* One optimizer step on worker w: `accum` micro-batches, the reduction,
 * the non-finite decision, the update.  Returns 0, or an error (already
 * with its context). */
static int sync_step(struct worker *w, int64_t nmicro, int64_t *skipped, double *n_step, double *loss_step) {
    struct dp_trainer *t = w->t;
    const struct dp_model *m = t->model;
    struct dp__sums c;
    int rc = dp__compute(w, nmicro, &sync_hooks, &c);
    if (rc) return rc;
    w->t_wait += w->step_wait, w->t_slow += w->step_slow;
    *n_step = c.n_total;
    *loss_step = c.n_local > 0 ? c.loss_sum / (c.n_local * (double)t->pos) : 0;
    double t1 = dp_time();
    dp_sync_mean(&w->sync, c.n_total); /* sum -> mean over the global batch */
    /* Every replica holds the same reduced gradient, and the same buffers
     * (the BatchNorm statistics are synchronised), so every worker takes
     * the same decision here without talking to the others.  The buffers
     * are checked too: a running statistic must not become non-finite even
     * when the gradient stays finite. */
    int gbad = 0;
    if (t->red_check) /* looked at range by range inside the reduction */
        gbad = atomic_load_explicit(&t->red_bad, memory_order_relaxed) == w->step + 1;
    else if ((rc = dp_sync_check(&w->sync, &gbad)))
        return rc;
    if (gbad || dp_any_nonfinite(w->rep.buffers, m->num_buffers)) {
        /* Which worker? Each contributes a flag for its own loss. */
        double *flags = dp_calloc((size_t)t->G, sizeof(double));
        if (!flags) return dp_seterr(DP_ENOMEM, "out of memory");
        flags[w->grank] = c.local_bad;
        rc = dp_comm_allreduce(w->comm, flags, t->G, DP_DTYPE_F64, DP_ALGO_AUTO);
        int who = -1;
        for (int r = 0; !rc && r < t->G && who < 0; r++)
            if (flags[r] != 0) who = r;
        dp_free(flags);
        if (rc) return rc;
        if (t->p.dp.skip_nonfinite) {
            if (w->buf_save) memcpy(w->rep.buffers, w->buf_save, sizeof(float) * (size_t)m->num_buffers);
            (*skipped)++;
            return DP_OK;
        }
        if (who >= 0)
            return dp_seterr(DP_ENONFINITE, "step %lld (epoch %lld): worker %d: the loss is not finite; "
                             "try a lower --lr, --clip, or --skip-nonfinite", (long long)w->step,
                             (long long)w->epoch + 1, who);
        return dp_seterr(DP_ENONFINITE, "step %lld (epoch %lld): the gradient (or a BatchNorm running "
                         "statistic) is not finite; try a lower --lr, --clip, or --skip-nonfinite",
                         (long long)w->step, (long long)w->epoch + 1);
    }
    return dp__apply_update(w, t1);
}

const struct dp__mode dp__mode_sync = {.name = "sync", .loop = dp__step_loop, .step = sync_step};
