/* The deterministic step (--deterministic): gradients summed in fixed-point
 * per fixed chunk of the global batch, so any worker count gives the same bits. */
#include "trainer.h"

/* Deterministic mode: the same optimizer step as train_step, computed so
 * that the result does not depend on the number of workers.
 *
 * The global batch is cut into fixed chunks of det_chunk samples (the loader
 * hands every worker whole chunks).  Each chunk's gradient is computed on its
 * own, always with the same shapes, so it is the same bits on any worker; it
 * is then converted to fixed point (round(g * 2^32), held exactly in a double)
 * and added to the worker's accumulator.  Integer addition is associative, so
 * the all-reduce of the accumulators (sums of integers below 2^53 are exact
 * in double) gives the same bits whatever the number of workers and the
 * order of the sums.  Cost: smaller GEMMs (chunk-sized), one conversion pass
 * per chunk (vectorised, fused with the zeroing, and done layer by layer as
 * backward reports each range, while it is in cache), and an all-reduce of
 * doubles (twice the bytes) that starts only after the last chunk (no
 * overlap with backward). */
/* acc += the fixed point of g (dp_fixed_add), then g = 0 for the next
 * chunk's backward, which accumulates into it (the range is in cache). */
static int det_accumulate(double *acc, float *g, int64_t n) {
    int bad = dp_fixed_add(acc, g, n);
    memset(g, 0, sizeof(float) * (size_t)n);
    return bad;
}

/* The chunk's grad_ready: a top-level layer's range is final once it is
 * reported, so it is converted at once, while the gradient its backward
 * just wrote is still in cache.  done counts the floats converted, so the
 * caller can tell that every range came (the top-level ranges tile the slab;
 * if they ever did not, a pass over the whole slab adds the rest, and the
 * ranges already converted hold zeros, which add nothing). */
struct det_conv {
    double *acc;
    float *g;
    int64_t done;
    int bad;
};
static void det_grad_ready(void *arg, int64_t off, int64_t count) {
    struct det_conv *dc = arg;
    dc->bad |= det_accumulate(dc->acc + off, dc->g + off, count);
    dc->done += count;
}

static int det_step(struct worker *w, int64_t nmicro, int64_t *skipped, double *n_step, double *loss_step) {
    (void)skipped; /* (a non-finite sum is an error here: the fixed-point sums cannot hold it) */
    struct dp_trainer *t = w->t;
    const struct dp_model *m = t->model;
    int64_t np = m->num_params, C = t->p.det_chunk;
    memset(w->acc, 0, sizeof(double) * (size_t)np);
    /* ZeRO 3: the chunks run on the whole parameters, gathered for the step
     * (deterministic mode holds full-size sums anyway: no memory win) */
    int zrc = dp_zero_materialize(&w->zero);
    if (zrc) return zrc;
    memset(w->rep.grads, 0, sizeof(float) * (size_t)np); /* then each conversion zeroes what it read */
    double n_total = 0, loss_sum = 0, n_local = 0, compute = 0;
    for (int64_t k = 0; k < nmicro; k++) {
        const struct dp_loader_batch *lb;
        int rc = dp_loader_next(w->loader, &lb);
        if (rc) return rc;
        int64_t per = dp_shape_numel(&m->in_shape);
        for (int64_t c0 = 0; c0 < lb->B; c0 += C) {
            int64_t B = lb->B - c0 < C ? lb->B - c0 : C;
            struct dp_batch b = dp__batch_of(lb, c0, B, per, t->pos, dp_model_num_classes(m));
            struct det_conv dc = {.acc = w->acc, .g = w->rep.grads};
            struct dp_pass pass = {.training = 1, .backward = 1, .seed = t->p.seed, .loss_scale = 1.0f,
                                   .grad_ready = det_grad_ready, .grad_ready_arg = &dc};
            if ((rc = dp_model_run(m, &w->rep, &b, &pass))) return rc;
            if (dc.done != np) dc.bad |= det_accumulate(w->acc, w->rep.grads, np);
            if (dc.bad)
                return dp_seterr(DP_ENONFINITE, "deterministic mode: a gradient is not finite or too large "
                                 "for fixed-point accumulation (|g| >= 2^20)");
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
    int rc = dp_comm_allreduce(w->comm, w->acc, np, DP_DTYPE_F64, (enum dp_comm_algo)t->p.algo);
    double t1 = dp_time();
    w->t_comm += t1 - tc;
    w->t_exposed += t1 - tc;
    w->step_wait = t->G > 1 ? t1 - tc : 0;
    w->t_wait += w->step_wait, w->t_slow += w->step_slow;
    if (t->G > 1) dp_timeline_add(&w->tl, "wait", 0, w->step, tc, t1);
    if (rc) return rc;
    *n_step = n_total;
    *loss_step = n_local > 0 ? loss_sum / (n_local * (double)t->pos) : 0;
    /* back to float: the gradient of the mean loss (over samples x positions) */
    double scale = 1.0 / (DP_FIXED_SCALE * n_total * (double)t->pos);
    float *g = w->rep.grads;
    for (int64_t i = 0; i < np; i++) g[i] = (float)(w->acc[i] * scale);
    if (dp_any_nonfinite(g, np))
        return dp_seterr(DP_ENONFINITE, "step %lld: the gradient is not finite", (long long)w->step);
    /* the whole gradient is here (the accumulators were all-reduced): the
     * norm is the plain run's, and ZeRO's shard update then gives its bits */
    if (t->p.clip_norm > 0) dp_clip_grad_norm(g, np, t->p.clip_norm);
    dp_zero_take_grad(&w->zero, g); /* ZeRO 2, 3: the shard's pieces, the slab given back */
    rc = dp__update_params(w, g, dp_sched_lr(&t->p.sched, w->step), 0, 0);
    zrc = dp_zero_release_params(&w->zero);
    if (!rc) rc = zrc;
    double t2 = dp_time();
    dp__update_done(w, t2 - t1);
    return rc;
}

const struct dp__mode dp__mode_det = {.name = "deterministic", .loop = dp__step_loop, .step = det_step};
