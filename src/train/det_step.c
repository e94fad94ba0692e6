/* The deterministic step (--deterministic): gradients summed in fixed-point
 * per fixed chunk of the global batch, so any worker count gives the same bits. */
#include "trainer.h"

/* Deterministic mode: the same optimizer step as the synchronous one,
 * computed so that the result does not depend on the number of workers.
 *
 * The global batch is cut into fixed chunks of det_chunk samples (the loader
 * hands every worker whole chunks).  Each chunk's gradient is computed on its
 * own, always with the same shapes, so it is the same bits on any worker; the
 * sync (dp_sync with `deterministic`, src/ddp/sync.c) converts it to fixed
 * point, round(g * 2^32) held exactly in a double, as backward reports each
 * range, and adds it to its accumulator.  Integer addition is associative, so
 * its one all-reduce of the accumulators (sums of integers below 2^53 are
 * exact in double) gives the same bits whatever the number of workers and
 * the order of the sums.  Cost: smaller GEMMs (chunk-sized), one conversion
 * pass per chunk (vectorised, fused with the zeroing, while the range is in
 * cache), and an all-reduce of doubles (twice the bytes) that starts only
 * after the last chunk (no overlap with backward).  A non-finite sum is an
 * error here: the fixed-point sums cannot hold it.
 *
 * BatchNorm normalises each chunk with the chunk's own statistics, which do not depend on
 * the worker that holds it (ghost batch normalisation; src/nn/batchnorm.c), and its running
 * statistics move once per step, after a second all-reduce of fixed-point sums (dp_sync_finish): the chunks'
 * means and variances (num_buffers doubles). */
static int det_step(struct worker *w, int64_t nmicro, int64_t *skipped, double *n_step, double *loss_step) {
    (void)skipped;
    struct dp_trainer *t = w->t;
    const struct dp_model *m = t->model;
    const int64_t C = t->p.dp.det_chunk;
    int rc = dp_sync_step_begin(&w->sync, w->step); /* ZeRO 3: the whole parameters, gathered for the chunks */
    if (rc) return rc;
    double n_total = 0, loss_sum = 0, n_local = 0, compute = 0;
    for (int64_t k = 0; k < nmicro; k++) {
        const struct dp_loader_batch *lb;
        if ((rc = dp_loader_next(w->loader, &lb))) return rc;
        int64_t per = dp_shape_numel(&m->in_shape);
        for (int64_t c0 = 0; c0 < lb->B; c0 += C) {
            int64_t B = lb->B - c0 < C ? lb->B - c0 : C;
            struct dp_batch b = dp__batch_of(lb, c0, B, per, t->pos, dp_model_num_classes(m));
            struct dp_pass pass = {.training = 1, .backward = 1, .seed = t->p.run.seed, .loss_scale = 1.0f};
            (void)dp_sync_micro_begin(&w->sync, &pass, k, nmicro, n_total, (double)lb->global_B);
            rc = dp__model_run(w, &b, &pass, k == nmicro - 1 && c0 + B >= lb->B);
            if ((rc = dp_sync_micro_end(&w->sync, &pass, 0, rc))) { /* the chunk, in fixed point */
                if (rc != DP_ENONFINITE) return rc;
                char msg[512]; /* (non-finite errors name the worker and step themselves: dp__step_loop) */
                snprintf(msg, sizeof msg, "%s", dp_errmsg());
                return dp_seterr(rc, "step %lld (epoch %lld): worker %d: %s; try a lower --lr or --clip",
                                 (long long)w->step, (long long)w->epoch + 1, w->grank, msg);
            }
            loss_sum += pass.loss_sum;
            w->loss_sum += pass.loss_sum;
            w->correct += pass.correct;
            w->t_fwd += pass.t_forward;
            w->t_bwd += pass.t_backward;
            compute += pass.t_forward + pass.t_backward;
        }
        w->seen += lb->B;
        n_local += (double)lb->B;
        n_total += (double)lb->global_B;
    }
    /* the simulated slowness, all paid before the step's one reduction (the
     * chunks' compute as c; timing only: the sums are the same bits) */
    w->step_slow = 0;
    if (t->simulate) {
        double mult, stall;
        dp__pace_plan(w, &mult, &stall);
        dp__pace_start(w, mult, stall, dp_time() - compute);
        dp__pace_sleep(w);
        w->step_slow = w->pace_slept;
    }
    w->bal_n += n_local, w->bal_s += compute + w->step_slow; /* --balance: as in train_step */
    double tc = dp_time();
    w->arrival[0] += tc - w->t_step0; /* one reduction per step: "bucket" 0 */
    w->arrival_steps++;
    rc = dp_sync_finish(&w->sync, 1); /* the accumulators' all-reduce (and BatchNorm's statistics') */
    double t1 = dp_time();
    w->step_wait = t->G > 1 ? t1 - tc : 0;
    w->t_wait += w->step_wait, w->t_slow += w->step_slow;
    if (t->G > 1) dp_timeline_add(&w->tl, "wait", 0, w->step, tc, t1);
    if (rc) return rc;
    *n_step = n_total;
    *loss_step = n_local > 0 ? loss_sum / (n_local * (double)t->pos) : 0;
    dp_sync_mean(&w->sync, n_total); /* back to float: the gradient of the mean loss (samples x positions) */
    int bad;
    if ((rc = dp_sync_check(&w->sync, &bad))) return rc;
    if (bad) return dp_seterr(DP_ENONFINITE, "step %lld: the gradient is not finite", (long long)w->step);
    /* [clip the whole gradient: the plain run's norm] -> the plain update, or ZeRO's shard update */
    rc = dp_sync_update(&w->sync, dp_sched_lr(&t->p.sched, w->step), t->p.run.clip_norm);
    if (w->sync.t_gather1 > w->sync.t_gather0)
        dp_timeline_add(&w->tl, "gather", 0, w->step, w->sync.t_gather0, w->sync.t_gather1);
    dp__update_done(w, dp_time() - t1);
    return rc;
}

const struct dp__mode dp__mode_det = {.name = "deterministic", .loop = dp__step_loop, .step = det_step};
