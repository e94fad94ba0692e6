/* dp_sync: one worker's synchronisation of a training step, behind one
 * interface (the contract and a step's calls are in dp/ddp.h).  Three
 * reductions live here, chosen once at init:
 *
 *   reducer   buckets of the gradient slab all-reduced (or compressed) as
 *             backward finishes them, overlapped with the rest of backward;
 *   ZeRO      the same buckets reduce-scattered (stages 2, 3), the update on
 *             this worker's shard and the parameters all-gathered (zero.c);
 *   fixed     the deterministic step: each chunk's gradient converted to
 *             fixed point as backward reports it, one all-reduce of the
 *             integer sums per step, so any worker count gives the same bits.
 *
 * The math of the mean.  Worker r's backward sums, over its samples i, the
 * per-sample gradients times the loss scale; the reduction sums over the
 * workers.  With N = (samples of the global batch) x positions:
 *
 *     one micro-batch:   loss scale 1/N      -> sum_r sum_i g_i / N  = the mean
 *     k micro-batches:   loss scale 1        -> (sum_r sum_i g_i) x 1/N  (dp_sync_mean)
 *
 * either way the gradient of the mean loss over the global batch, whatever
 * the split over workers.  Every replica then holds the same reduced
 * gradient, so every replica takes the same decision (dp_sync_check) and
 * applies the same update (dp_sync_update) without talking to the others. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dp/ddp.h"

struct dp_sync_params dp_sync_default_params(void) {
    return (struct dp_sync_params){.reducer = dp_reducer_default_params(), .positions = 1};
}

/* ---- init, free -------------------------------------------------------------------------- */

int dp_sync_init(struct dp_sync *s, const struct dp_model *m, struct dp_comm *comm, struct dp_replica *r,
                 const struct dp_sync_params *p) {
    memset(s, 0, sizeof *s);
    s->p = *p;
    s->comm = comm, s->m = m;
    if (s->p.span.layer1 == 0) dp_model_span(m, 0, m->nlayers, &s->p.span);
    else if (p->zero >= 2 || p->reducer.compress.kind != DP_COMPRESS_NONE)
        return dp_seterr(DP_ENOTSUP, "a pipeline stage's reduction supports ZeRO 0 and 1 without compression");
    s->base = s->p.span.param_off;
    float *params = r->params + s->base, *grads = r->grads + s->base;
    s->params = params, s->grads = grads, s->buffers = r->buffers, s->n = s->p.span.param_count;
    s->G = comm ? dp_comm_world(comm) : 1;
    int rc = dp_zero_init(&s->zero, comm, s->n, p->zero, &p->optim);
    if (rc) return rc;
    s->zero.padded = p->lazy;
    /* ZeRO 1 ahead: the shard is cut along the buckets, so --zero-reduce
     * scatter reduce-scatters each bucket during backward (the reducer's
     * shard form, as stages 2 and 3) instead of the slab after it */
    s->zero.ahead = p->zero_ahead;
    if (p->deterministic &&
        !(s->acc = dp_malloc_big(sizeof(double) * (size_t)(s->n ? s->n : 1))))
        return dp_seterr(DP_ENOMEM, "deterministic mode: cannot allocate the accumulator");
    if (p->deterministic && m->num_buffers > 0 &&
        !(s->stat_acc = dp_malloc(sizeof(double) * (size_t)m->num_buffers)))
        return dp_seterr(DP_ENOMEM, "--deterministic: out of memory");
    struct dp_reducer_params rp = p->reducer;
    rp.span = s->p.span;
    rp.scatter = p->zero && p->zero_scatter && !p->zero_ahead;
    rp.shard = (p->zero >= 2 && s->G > 1) || (p->zero_ahead && p->zero_scatter);
    if ((rc = dp_reducer_init(&s->red, m, comm, grads, &rp))) return rc;
    /* ZeRO 2, 3: each reduced bucket's piece kept in gshard, its pages given
     * back (stage 1: the sums stay in the slab) */
    if (p->zero >= 2) s->red.done = dp_zero_bucket_done, s->red.done_arg = &s->zero;
    /* ZeRO: the optimizer state of this worker's shard only (the memory win);
     * stages 2 and 3 cut the shard along the reducer's buckets */
    if ((rc = dp_zero_plan(&s->zero, s->red.b, s->red.nb, params, grads))) return rc;
    return dp_optim_init(&s->opt, &p->optim, s->zero.len);
}

void dp_sync_free(struct dp_sync *s) {
    if (!s) return;
    dp_reducer_free(&s->red);
    dp_optim_free(&s->opt);
    dp_zero_free(&s->zero);
    dp_free(s->acc), dp_free(s->stat_acc);
    s->acc = NULL, s->stat_acc = NULL;
}

/* ---- the deterministic reduction ----------------------------------------------------------
 * The global batch is cut into fixed chunks (the loader hands every worker
 * whole chunks), each chunk's gradient computed on its own with the same
 * shapes, so it is the same bits on any worker.  Each is converted to fixed
 * point, round(g x 2^32) held exactly in a double, and added to acc:
 *
 *     acc = sum over chunks c of round(g_c x 2^32)       (integers < 2^53: exact)
 *     all-reduce(acc) = the same integers on any worker count and order
 *     g = acc x 1 / (2^32 x N)                           (dp_sync_mean)
 *
 * The conversion runs range by range as backward reports each top-level
 * layer (det_grad_ready), while its gradient is in cache, and zeroes the
 * range for the next chunk's backward, which accumulates into it. */
static int det_accumulate(double *acc, float *g, int64_t n, int store) { return dp_fixed_take(acc, g, n, store); }

/* det_done counts the floats converted, so that dp_sync_micro_end can tell
 * that every range came (the top-level ranges tile the slab; if they ever
 * did not, a pass over the whole slab adds the rest, and the ranges already
 * converted hold zeros, which add nothing). */
static void det_grad_ready(void *arg, int64_t off, int64_t count) {
    struct dp_sync *s = arg;
    off -= s->base;
    s->det_bad |= det_accumulate(s->acc + off, s->grads + off, count, s->det_first && s->det_tiles);
    s->det_done += count;
}

/* ---- one step ------------------------------------------------------------------------------ */

int dp_sync_step_begin(struct dp_sync *s, int64_t step) {
    s->step = step;
    s->sumsq = 0;
    if (s->p.deterministic) {
        /* the first chunk stores into acc where backward's ranges tile the slab (learned at the
         * first chunk ever, which adds into a zeroed acc); a worker without a chunk zeroes it
         * in dp_sync_finish */
        s->det_first = 1;
        if (!s->det_tiles) memset(s->acc, 0, sizeof(double) * (size_t)s->n);
        if (s->stat_acc) memset(s->stat_acc, 0, sizeof(double) * (size_t)s->m->num_buffers);
        /* ZeRO 3: the chunks run on the whole parameters, gathered for the
         * step (deterministic mode holds full-size sums anyway: no memory win) */
        int rc = dp_zero_materialize(&s->zero);
        if (rc) return rc;
        memset(s->grads, 0, sizeof(float) * (size_t)s->n); /* then each conversion zeroes what it read */
        return DP_OK;
    }
    /* ZeRO 2, 3: the last reduction gave the slab back zeroed (dp_zero_bucket_done) */
    if (!s->zero.sharded) memset(s->grads, 0, sizeof(float) * (size_t)s->n);
    return DP_OK;
}

int dp_sync_micro_begin(struct dp_sync *s, struct dp_pass *pass, int64_t k, int64_t nmicro, double n_before,
                        double n_batch) {
    if (s->p.deterministic) {
        s->det_done = 0, s->det_bad = 0;
        pass->grad_ready = det_grad_ready, pass->grad_ready_arg = s;
        pass->stat_acc = s->stat_acc; /* BatchNorm: the chunk's own statistics, summed in fixed point */
        return 0;
    }
    /* with one worker there is nothing to reduce: no reducer, no progress
     * thread to wake */
    int last = k == nmicro - 1 && s->G > 1;
    /* ZeRO 2, 3: every micro-batch is reduce-scattered, and its pieces added
     * into gshard (dp_zero_bucket_done), so no whole gradient stays alive
     * from one micro-batch to the next (k times the traffic) */
    if (s->zero.sharded && s->G > 1) last = 1, s->zero.accumulate = k > 0;
    /* one micro-batch: the global batch is known before backward, so the 1/N
     * of the mean goes into the loss gradient (no extra pass); with
     * accumulation the sum is scaled at the end (dp_sync_mean) */
    s->folded = nmicro == 1;
    if (nmicro == 1) pass->loss_scale = (float)(1.0 / (n_batch * s->p.positions));
    if ((s->zero.sharded && s->zero.stage == 3) || s->zero.ahead) /* ZeRO 3: gather; 1: wait for the gather */
        pass->layer_begin = dp_zero_layer_begin, pass->layer_begin_arg = &s->zero;
    if (last) {
        pass->grad_ready = dp_reducer_grad_ready, pass->grad_ready_arg = &s->red;
        s->red.step = s->step;
        /* the scale applied after the reduction: 1 when folded into the loss
         * (compression keeps its residuals in gradient units) */
        s->red.grad_unit = nmicro == 1 ? 1.0f : (float)(1.0 / ((n_before + n_batch) * s->p.positions));
        dp_reducer_begin(&s->red);
    }
    return last;
}

int dp_sync_micro_end(struct dp_sync *s, const struct dp_pass *pass, int reducing, int rc) {
    if (s->p.deterministic) {
        if (rc) return rc;
        /* (ranges that did not tile: the rest added; the ranges converted hold zeros, which add nothing) */
        if (s->det_done != s->n && s->det_first && s->det_tiles)
            return dp_seterr(DP_EINTERNAL, "deterministic mode: backward's ranges tiled the slab before and do not now");
        if (s->det_done != s->n) s->det_bad |= det_accumulate(s->acc, s->grads, s->n, 0);
        else if (s->det_first) s->det_tiles = 1;
        s->det_first = 0;
        if (s->det_bad)
            return dp_seterr(DP_ENONFINITE, "deterministic mode: a gradient is not finite or too large "
                             "for fixed-point accumulation (|g| >= 2^20)");
        return DP_OK;
    }
    /* ZeRO 3's last bucket (and any prefetch) given back */
    int rrc = pass->layer_begin ? dp_zero_release_params(&s->zero) : DP_OK;
    if (!rc) rc = rrc;
    if (rc && reducing) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", dp_errmsg());
        dp_reducer_finish(&s->red);
        dp_seterr(rc, "%s", msg);
    }
    return rc;
}

int dp_sync_finish(struct dp_sync *s, int last_micro) {
    struct dp_sync_stats *st = &s->stats;
    if (s->p.deterministic) { /* the integer sums: exact, in any order */
        if (s->det_first) memset(s->acc, 0, sizeof(double) * (size_t)s->n); /* (no chunk this step) */
        s->det_first = 0;
        double t0 = dp_time();
        int rc = dp_comm_allreduce(s->comm, s->acc, s->n, DP_DTYPE_F64, s->p.reducer.algo);
        double dt = dp_time() - t0;
        st->t_comm += dt, st->t_exposed += dt; /* (after the last chunk: nothing to hide behind) */
        /* BatchNorm's chunk statistics, fixed-point integers too: their all-reduce is the same
         * bits on any worker count, and every replica moves its running statistics alike */
        if (!rc && s->stat_acc && s->G > 1)
            rc = dp_comm_allreduce(s->comm, s->stat_acc, s->m->num_buffers, DP_DTYPE_F64, s->p.reducer.algo);
        if (!rc && s->stat_acc) dp_model_apply_stats(s->m, s->buffers, s->stat_acc);
        return rc;
    }
    int rc = dp_reducer_finish(&s->red);
    const struct dp_reducer *r = &s->red;
    s->last = (struct dp_sync_stats){.t_comm = r->comm_total, .t_exposed = r->comm_exposed,
                                     .bytes_sent = r->bytes_sent, .bytes_recv = r->bytes_recv,
                                     .bytes_fp32 = r->bytes_fp32, .t_compress = r->t_compress,
                                     .t_decompress = r->t_decompress, .reduce_steps = last_micro};
    st->t_comm += r->comm_total, st->t_exposed += r->comm_exposed;
    st->bytes_sent += r->bytes_sent, st->bytes_recv += r->bytes_recv, st->bytes_fp32 += r->bytes_fp32;
    st->t_compress += r->t_compress, st->t_decompress += r->t_decompress;
    st->reduce_steps += last_micro; /* the bytes are per optimizer step */
    return rc;
}

void dp_sync_mean(struct dp_sync *s, double n_total) {
    if (s->p.deterministic) { /* back to float: acc / 2^32 / N */
        const double scale = 1.0 / (DP_FIXED_SCALE * n_total * s->p.positions);
        const double *restrict acc = s->acc;
        float *restrict g = s->grads;
        int bad = 0; /* (dp_sync_check's answer, from this pass: no second one over g) */
#pragma omp simd reduction(| : bad)
        for (int64_t i = 0; i < s->n; i++) {
            float v = (float)(acc[i] * scale);
            bad |= !(fabsf(v) <= FLT_MAX);
            g[i] = v;
        }
        s->det_mean_bad = bad;
        return;
    }
    if (s->folded) return;
    float scale = (float)(1.0 / (n_total * s->p.positions));
    float *g = s->zero.sharded ? s->zero.gshard : s->grads; /* ZeRO 2, 3: only the shard is reduced */
    int64_t len = s->zero.sharded ? s->zero.len : s->n;
#pragma omp simd
    for (int64_t i = 0; i < len; i++) g[i] *= scale;
}

/* Plain: the whole slab is looked at.  ZeRO: only this worker's shard of g
 * holds the sum (with --zero-reduce scatter, and stages 2, 3), so the check
 * comes from ||g||^2 = all-reduce(sum over each shard of g^2): a NaN or Inf
 * anywhere makes it non-finite on every worker. */
int dp_sync_check(struct dp_sync *s, int *bad) {
    s->sumsq = 0;
    if (s->p.deterministic) { /* (the whole gradient is here; dp_sync_mean looked at it) */
        *bad = s->det_mean_bad;
        return DP_OK;
    }
    if (!s->p.zero) {
        *bad = dp_any_nonfinite(s->grads, s->n);
        return DP_OK;
    }
    int rc = dp_zero_sumsq(&s->zero, s->grads, &s->sumsq);
    *bad = !isfinite(s->sumsq);
    return rc;
}

/* [clip] -> the optimizer: the whole slab, or ZeRO's shard update (clip
 * coefficient min(1, c / (sqrt(sumsq) + 1e-6)), as dp_clip_grad_norm's)
 * and the all-gather. */
static int optim_update(struct dp_sync *s, float lr, double clip_norm, double sumsq) {
    float *g = s->grads;
    if (!s->p.zero) {
        if (clip_norm > 0) dp_clip_grad_norm(g, s->n, clip_norm);
        return dp_optim_step(&s->opt, s->params, g, s->n, lr);
    }
    int rc = dp_zero_step(&s->zero, &s->opt, s->params, g, lr, clip_norm, sumsq);
    s->t_gather0 = s->zero.t_g0, s->t_gather1 = s->zero.t_g1;
    return rc;
}

int dp_sync_update(struct dp_sync *s, float lr, double clip_norm) {
    if (!s->p.deterministic) return optim_update(s, lr, clip_norm, s->sumsq);
    /* the whole gradient is here (the accumulators were all-reduced): the
     * norm is the plain run's, and ZeRO's shard update then gives its bits */
    if (clip_norm > 0) dp_clip_grad_norm(s->grads, s->n, clip_norm);
    dp_zero_take_grad(&s->zero, s->grads); /* ZeRO 2, 3: the shard's pieces, the slab given back */
    int rc = optim_update(s, lr, 0, 0);
    int zrc = dp_zero_release_params(&s->zero);
    return rc ? rc : zrc;
}

/* ---- between steps --------------------------------------------------------------------- */

int dp_sync_settle(struct dp_sync *s) {
    int rc = dp_zero_settle(&s->zero);
    return rc || !s->p.whole ? rc : s->p.whole(s->p.whole_arg, -1, NULL);
}
int dp_sync_sharded_params(const struct dp_sync *s) { return s->zero.stage == 3 && s->zero.sharded; }
int dp_sync_params_whole(const struct dp_sync *s) { return !dp_sync_sharded_params(s) || dp_zero_params_whole(&s->zero); }
int dp_sync_params_partial(const struct dp_sync *s) {
    return dp_sync_sharded_params(s) || s->p.whole;
}
void dp_sync_eval_hooks(struct dp_sync *s, struct dp_pass *pass) {
    if (dp_sync_sharded_params(s)) pass->layer_begin = dp_zero_layer_begin, pass->layer_begin_arg = &s->zero;
}
int dp_sync_gather(struct dp_sync *s, int keep, uint64_t *hash) {
    if (!s->p.whole) return dp_zero_gather_params(&s->zero, keep, hash);
    /* a pipeline stage (ZeRO 0, or 1 with its gather in the step): the stages' assembly */
    return s->p.whole(s->p.whole_arg, keep, hash);
}
int dp_sync_release(struct dp_sync *s) { return dp_zero_release_params(&s->zero); }
void dp_sync_drop_grads(struct dp_sync *s) { dp_zero_drop_grad_shard(&s->zero); }
int dp_sync_shard_init(struct dp_sync *s, const struct dp_model *m, uint64_t seed, const float *whole) {
    return dp_zero_shard_init(&s->zero, m, seed, whole);
}

struct dp_sync_stats dp_sync_stats_take(struct dp_sync *s) {
    struct dp_sync_stats st = s->stats;
    memset(&s->stats, 0, sizeof s->stats);
    return st;
}

/* ---- checkpoint state, the post hook, memory ---------------------------------------------- */

int64_t dp_sync_state_len(const struct dp_sync *s) { return (int64_t)s->zero.parts * s->m->num_params; }
int dp_sync_state_parts(const struct dp_sync *s) { return s->zero.parts; }
int dp_sync_npieces(const struct dp_sync *s) { return s->zero.npieces; }
float *dp_sync_piece(const struct dp_sync *s, int i, int k, struct dp_zero_piece *pc) {
    if (pc) *pc = s->zero.piece[i], pc->off += s->base, pc->roff += s->base; /* (in the model's slab) */
    if (k >= s->zero.parts || (k < 0 && !s->zero.pshard)) return NULL; /* (no such part: its range only) */
    return (float *)dp_zero_piece_data(&s->zero, &s->opt, i, k);
}
int64_t dp_sync_ef_len(const struct dp_sync *s) { return dp_reducer_state_len(&s->red); }
void dp_sync_ef_get(const struct dp_sync *s, float *out) { dp_reducer_state_get(&s->red, out); }
void dp_sync_ef_set(struct dp_sync *s, const float *in) { dp_reducer_state_set(&s->red, in); }

int dp_sync_post_supported(const struct dp_sync *s) {
    if (s->p.zero || s->p.deterministic || s->p.reducer.compress.kind != DP_COMPRESS_NONE) return 0;
    for (int i = 0; i < s->red.nb; i++)
        if (!dp_comm_post_supported(s->red.comm, s->red.b[i].count, DP_DTYPE_F32, s->red.p.algo)) return 0;
    return 1;
}
void dp_sync_set_post(struct dp_sync *s, dp_comm_post_fn post, void *arg) { s->red.post = post, s->red.post_arg = arg; }

int64_t dp_sync_live_bytes(const struct dp_sync *s) { return dp_zero_live_bytes(&s->zero, &s->opt); }
int64_t dp_sync_inflight_bytes(const struct dp_sync *s) { return dp_zero_inflight_bytes(&s->zero); }
struct dp_zero_counts dp_sync_zero_counts(const struct dp_sync *s) {
    return (struct dp_zero_counts){s->zero.gathers, s->zero.refaults, (int64_t)sizeof(float) * s->red.shard_hw,
                                   (int64_t)sizeof(float) * s->zero.held_hw};
}
