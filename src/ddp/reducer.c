/* The gradient reducer: bucket planning, starting buckets from backward, and
 * waiting for them.  The rule is in dp/ddp.h. */
#include <stdio.h>
#include <string.h>

#include "ddp/compress_impl.h"
#include "dp/ddp.h"

struct dp_reducer_params dp_reducer_default_params(void) {
    struct dp_reducer_params p = {.bucket_cap_bytes = 0 /* auto */, .first_bucket_bytes = 1u << 20,
                                  .overlap = 1, .algo = DP_ALGO_AUTO};
    return p;
}

/* Plans buckets from the last top-level layer backwards: a bucket closes when
 * adding the next layer would push it past its cap (a layer larger than the
 * cap gets a bucket of its own).  A layer the unit cut (dp_model_set_unit:
 * slices, or a composite's parts) gets a bucket per range of its own
 * (dp_layer_ranges, highest first: the order its backward reports them in),
 * which nothing merges with, so that ZeRO-3 gathers one range at a time.
 * Returns the bucket count, or < 0. */
static struct dp_bucket *add(struct dp_reducer *r, int64_t off, int64_t count) {
    struct dp_bucket *b = &r->b[r->nb++];
    b->off = off - r->base, b->count = count, b->nlayers = 1, b->owner = r;
    return b;
}

static int plan(struct dp_reducer *r, const struct dp_model *m) {
    int cap = 0, l0 = r->p.span.layer0, l1 = r->p.span.layer1;
    for (int i = l0; i < l1; i++) cap += dp_layer_ranges(m->layers[i], NULL, NULL, 0) + 1;
    r->b = dp_calloc((size_t)(cap ? cap : 1), sizeof *r->b);
    int64_t *ro = dp_malloc(sizeof(int64_t) * (size_t)(2 * cap + 2));
    if (!r->b || !ro) {
        dp_free(ro);
        return dp_seterr(DP_ENOMEM, "reducer: out of memory");
    }
    int64_t *rc = ro + cap + 1;
    r->nb = 0;
    struct dp_bucket *cur = NULL;
    for (int i = l1 - 1; i >= l0; i--) {
        const struct dp_layer *l = m->layers[i];
        if (l->param_count == 0) continue;
        if (l->slice_rows > 0 || l->parts) {
            int n = dp_layer_ranges(l, ro, rc, cap + 1);
            for (int k = 0; k < n; k++) add(r, ro[k], rc[k]);
            cur = NULL;
            continue;
        }
        size_t limit = cur == r->b ? r->p.first_bucket_bytes : r->p.bucket_cap_bytes;
        if (cur && (size_t)(cur->count + l->param_count) * sizeof(float) > limit) cur = NULL;
        if (!cur) cur = add(r, l->param_off + l->param_count, 0), cur->nlayers = 0;
        /* layers are contiguous and visited in decreasing offset order */
        cur->off = l->param_off - r->base;
        cur->count += l->param_count;
        cur->nlayers++;
    }
    dp_free(ro);
    return r->nb;
}

/* A bucket's part of the reduced slab, to the reducer's post hook in slab offsets. */
static void bucket_post(void *arg, int64_t off, int64_t n) {
    struct dp_bucket *b = arg;
    b->owner->post(b->owner->post_arg, b->off + off, n);
}

int dp_reducer_init(struct dp_reducer *r, const struct dp_model *m, struct dp_comm *comm, float *grads,
                    const struct dp_reducer_params *p) {
    memset(r, 0, sizeof *r);
    r->p = p ? *p : dp_reducer_default_params();
    if (r->p.span.layer1 == 0) dp_model_span(m, 0, m->nlayers, &r->p.span);
    r->base = r->p.span.param_off;
    if (r->p.bucket_cap_bytes == 0) { /* auto: total / 4, clamped to [1 MiB, 25 MiB] */
        size_t q = (size_t)r->p.span.param_count * sizeof(float) / 4;
        r->p.bucket_cap_bytes = q < (1u << 20) ? 1u << 20 : q > (25u << 20) ? 25u << 20 : q;
    }
    if (r->p.unit_bytes) { /* no bucket above the unit */
        if (r->p.bucket_cap_bytes > r->p.unit_bytes) r->p.bucket_cap_bytes = r->p.unit_bytes;
        if (r->p.first_bucket_bytes > r->p.unit_bytes) r->p.first_bucket_bytes = r->p.unit_bytes;
    }
    if (r->p.bucket_cap_bytes < sizeof(float) || r->p.first_bucket_bytes < sizeof(float))
        return dp_seterr(DP_EINVAL, "reducer: bucket sizes must be at least 4 bytes");
    r->comm = comm;
    r->grads = grads;
    r->grad_unit = 1.0f;
    int n = plan(r, m);
    if (n < 0) return n;
    return dp__compress_init(&r->cz, m, comm, &r->p.compress, r->b, r->nb);
}

void dp_reducer_free(struct dp_reducer *r) {
    if (!r) return;
    dp__compress_free(r->cz);
    dp_free(r->b);
    memset(r, 0, sizeof *r);
}

void dp_reducer_begin(struct dp_reducer *r) {
    r->next = 0;
    r->rc = 0;
    r->shard_done = 0;
    r->t_begin = dp_time();
    r->t_backward_end = 0;
    r->bytes_sent = r->bytes_recv = r->bytes_fp32 = r->t_compress = r->t_decompress = 0;
    for (int i = 0; i < r->nb; i++) {
        struct dp_bucket *b = &r->b[i];
        b->req = NULL, b->t_ready = b->t_done = b->t_c0 = b->t_c1 = b->t_d0 = b->t_d1 = 0;
    }
}

/* Starts bucket b: a plain fp32 all-reduce in place, or (per-bucket
 * compression) the compressed form's collective on its wire buffer; the
 * compression runs here, on the compute thread, so t_ready (the
 * collective's start) follows it. */
static void start(struct dp_reducer *r, struct dp_bucket *b) {
    if (r->rc) return;
    int P = r->comm ? dp_comm_world(r->comm) : 1, rc;
    r->bytes_fp32 += 2.0 * (P - 1) / P * 4.0 * (double)b->count;
    if (dp__compress_mode(r->cz, r->step) == 1) {
        b->t_c0 = dp_time();
        rc = dp__compress_bucket_start(r->cz, (int)(b - r->b), r->grads, r->grad_unit, r->p.algo, &b->req, &r->bytes_sent,
                                       &r->bytes_recv);
        b->t_c1 = b->t_ready = dp_time();
        r->t_compress += b->t_c1 - b->t_c0;
    } else if (r->p.shard) { /* ZeRO 2, 3: half an all-reduce's bytes */
        b->t_ready = dp_time();
        double v = (double)(P - 1) / P * 4.0 * (double)b->count;
        r->bytes_sent += v, r->bytes_recv += v;
        rc = dp_comm_ireduce_scatter(r->comm, r->grads + b->off, b->count, DP_DTYPE_F32, r->p.algo, &b->req);
    } else {
        b->t_ready = dp_time();
        double v = 2.0 * (P - 1) / P * 4.0 * (double)b->count;
        r->bytes_sent += v, r->bytes_recv += v;
        rc = r->post ? dp_comm_iallreduce_post(r->comm, r->grads + b->off, b->count, DP_DTYPE_F32, r->p.algo,
                                               bucket_post, b, &b->req)
                     : dp_comm_iallreduce(r->comm, r->grads + b->off, b->count, DP_DTYPE_F32, r->p.algo, &b->req);
    }
    if (rc) {
        r->rc = rc;
        snprintf(r->err, sizeof r->err, "%s", dp_errmsg());
    }
}

/* p.shard: bucket i's reduce-scatter waited for (at once if it completed)
 * and its memory given back now, during backward (an error is kept for
 * finish). */
static void reduced(struct dp_reducer *r, int i) {
    struct dp_bucket *b = &r->b[i];
    int w = dp_comm_wait(r->comm, b->req);
    b->req = NULL;
    if (b->t_done == 0) b->t_done = dp_time();
    if (w && !r->rc) r->rc = w, snprintf(r->err, sizeof r->err, "%s", dp_errmsg());
    if (!w && r->done) r->done(r->done_arg, i), r->shard_done += b->count;
}

/* Notes when started buckets complete, by polling between layers: that is
 * the resolution of the communication timings (one layer's backward). */
static void poll(struct dp_reducer *r) {
    for (int i = 0; i < r->next; i++) {
        struct dp_bucket *b = &r->b[i];
        if (!b->req || b->t_done > 0) continue;
        int done = 0;
        if (dp_comm_test(r->comm, b->req, &done) == DP_OK && done) b->t_done = dp_time();
        else break; /* buckets complete in order */
        if (r->p.shard) reduced(r, i);
    }
}

void dp_reducer_grad_ready(void *arg, int64_t offset, int64_t count) {
    struct dp_reducer *r = arg;
    (void)count;
    offset -= r->base;
    if (!r->p.overlap || r->p.scatter || dp__compress_mode(r->cz, r->step) == 2) return;
    if (r->p.shard && r->nb) { /* written from the slab's top down to offset, less what was reduced */
        int64_t held = r->b[0].off + r->b[0].count - offset - r->shard_done;
        if (held > r->shard_hw) r->shard_hw = held;
    }
    poll(r);
    /* Every bucket whose lowest offset has been reached is complete. */
    while (r->next < r->nb && offset <= r->b[r->next].off) start(r, &r->b[r->next++]);
    /* p.shard: before backward writes on, every started bucket but the last
     * is reduced (waited for, in order), so the gradient pages resident are
     * at most two buckets': the one being written and the one in flight
     * (dp_zero_inflight_bytes).  Without this, a worker ahead of its peers
     * (a slower peer, or a loaded machine: reductions lagging backward)
     * held every bucket it had written until the peers caught up: up to 28 of
     * the deep mlp's 33 MB at P = 4 (docs/ddp.md "ZeRO").  The wait costs
     * nothing a step does not pay anyway: the step's end waits for every
     * bucket, and the peer the wait is for is the one the all-gather after
     * the update waits for too. */
    if (r->p.shard)
        for (int i = 0; i < r->next - 1; i++)
            if (r->b[i].req) reduced(r, i);
}

/* PowerSGD: the whole gradient after backward (dp__compress_powersgd);
 * bucket 0 carries the phase times for the timeline. */
static int finish_powersgd(struct dp_reducer *r) {
    int P = dp_comm_world(r->comm);
    r->bytes_fp32 = 2.0 * (P - 1) / P * 4.0 * (double)(r->nb ? r->b[0].off + r->b[0].count : 0);
    double t[4] = {0, 0, 0, 0};
    int rc = dp__compress_powersgd(r->cz, r->grads, r->grad_unit, r->p.algo, &r->bytes_sent, &r->bytes_recv, &r->t_compress,
                                   &r->t_decompress, t);
    r->t_end = dp_time();
    if (r->nb) {
        struct dp_bucket *b = &r->b[0];
        b->t_c0 = t[0], b->t_c1 = t[1], b->t_d0 = t[2], b->t_d1 = t[3];
    }
    /* all of it after backward: the communication is exposed */
    r->comm_total = r->comm_exposed = r->t_end - r->t_backward_end - r->t_compress - r->t_decompress;
    if (r->comm_total < 0) r->comm_total = r->comm_exposed = 0;
    return rc;
}

/* ZeRO (p.scatter): one reduce-scatter of the whole slab after backward.
 * The ring/rhd reduce-scatter moves (P-1)/P of the bytes each way, half an
 * all-reduce's; it is not overlapped with backward.  Bucket 0 carries the
 * timing (the timeline shows one "bucket"). */
static int finish_scatter(struct dp_reducer *r) {
    int P = dp_comm_world(r->comm);
    int64_t n = r->nb ? r->b[0].off + r->b[0].count : 0;
    double v = (double)(P - 1) / P * 4.0 * (double)n;
    r->bytes_fp32 = 2 * v, r->bytes_sent = r->bytes_recv = v;
    double t0 = dp_time();
    int rc = dp_comm_reduce_scatter(r->comm, r->grads, n, DP_DTYPE_F32, r->p.algo);
    r->t_end = dp_time();
    if (r->nb) r->b[0].t_ready = t0, r->b[0].t_done = r->t_end;
    r->comm_total = r->comm_exposed = r->t_end - t0;
    return rc;
}

int dp_reducer_finish(struct dp_reducer *r) {
    r->t_backward_end = dp_time();
    if (r->p.scatter) return finish_scatter(r);
    if (dp__compress_mode(r->cz, r->step) == 2) return finish_powersgd(r);
    int cmode = dp__compress_mode(r->cz, r->step);
    while (r->next < r->nb) start(r, &r->b[r->next++]);
    /* Wait for every started bucket, even after an error, so that no
     * request is left in flight. */
    poll(r);
    int rc = r->rc;
    if (rc) dp_seterr(rc, "%s", r->err);
    for (int i = 0; i < r->nb; i++) {
        struct dp_bucket *b = &r->b[i];
        if (!b->req) continue;
        int w = dp_comm_wait(r->comm, b->req);
        b->req = NULL;
        if (b->t_done == 0) b->t_done = dp_time();
        if (w && !rc) rc = w;
        if (!w && r->p.shard && r->done) r->done(r->done_arg, i);
        if (!w && cmode == 1) {
            b->t_d0 = dp_time();
            dp__compress_bucket_end(r->cz, i, r->grads);
            b->t_d1 = dp_time();
            r->t_decompress += b->t_d1 - b->t_d0;
        }
    }
    r->t_end = dp_time();
    /* Communication time: the buckets run one after the other on the
     * progress thread, so bucket i is busy from max(its start, the end of
     * bucket i-1) to its completion.  Exposed: the wait after backward. */
    double total = 0, prev_done = 0;
    for (int i = 0; i < r->nb; i++) {
        const struct dp_bucket *b = &r->b[i];
        if (b->t_ready == 0) continue;
        double from = b->t_ready > prev_done ? b->t_ready : prev_done;
        if (b->t_done > from) total += b->t_done - from;
        prev_done = b->t_done;
    }
    r->comm_total = total;
    r->comm_exposed = r->t_end - r->t_backward_end - r->t_decompress; /* decompress is compute */
    return rc;
}

int64_t dp_reducer_state_len(const struct dp_reducer *r) { return dp__compress_state_len(r->cz); }
void dp_reducer_state_get(const struct dp_reducer *r, float *out) { dp__compress_state_get(r->cz, out); }
void dp_reducer_state_set(struct dp_reducer *r, const float *in) { dp__compress_state_set(r->cz, in); }
void dp_reducer_reset_state(struct dp_reducer *r) { dp__compress_reset(r->cz); }
const float *dp_reducer_residual(const struct dp_reducer *r) { return dp__compress_residual(r->cz); }
