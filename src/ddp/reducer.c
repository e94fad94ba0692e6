/* The gradient reducer: bucket planning, starting buckets from backward, and
 * waiting for them.  The rule is in dp/ddp.h. */
#include <stdio.h>
#include <string.h>

#include "dp/ddp.h"

struct dp_reducer_params dp_reducer_default_params(void) {
    struct dp_reducer_params p = {.bucket_cap_bytes = 0 /* auto */, .first_bucket_bytes = 1u << 20,
                                  .overlap = 1, .algo = DP_ALGO_AUTO};
    return p;
}

/* Plans buckets from the last top-level layer backwards: a bucket closes when
 * adding the next layer would push it past its cap (a layer larger than the
 * cap gets a bucket of its own).  Returns the bucket count, or < 0. */
static int plan(struct dp_reducer *r, const struct dp_model *m) {
    int cap = 0;
    for (int i = 0; i < m->nlayers; i++) cap += m->layers[i]->param_count > 0;
    r->b = dp_calloc((size_t)(cap ? cap : 1), sizeof *r->b);
    if (!r->b) return dp_seterr(DP_ENOMEM, "reducer: out of memory");
    r->nb = 0;
    struct dp_bucket *cur = NULL;
    for (int i = m->nlayers - 1; i >= 0; i--) {
        const struct dp_layer *l = m->layers[i];
        if (l->param_count == 0) continue;
        size_t limit = cur == r->b ? r->p.first_bucket_bytes : r->p.bucket_cap_bytes;
        if (cur && (size_t)(cur->count + l->param_count) * sizeof(float) > limit) cur = NULL;
        if (!cur) {
            cur = &r->b[r->nb++];
            cur->off = l->param_off + l->param_count;
            cur->count = 0;
        }
        /* layers are contiguous and visited in decreasing offset order */
        cur->off = l->param_off;
        cur->count += l->param_count;
        cur->nlayers++;
    }
    return r->nb;
}

int dp_reducer_init(struct dp_reducer *r, const struct dp_model *m, struct dp_comm *comm, float *grads,
                    const struct dp_reducer_params *p) {
    memset(r, 0, sizeof *r);
    r->p = p ? *p : dp_reducer_default_params();
    if (r->p.bucket_cap_bytes == 0) { /* auto: total / 4, clamped to [1 MiB, 25 MiB] */
        size_t q = (size_t)m->num_params * sizeof(float) / 4;
        r->p.bucket_cap_bytes = q < (1u << 20) ? 1u << 20 : q > (25u << 20) ? 25u << 20 : q;
    }
    if (r->p.bucket_cap_bytes < sizeof(float) || r->p.first_bucket_bytes < sizeof(float))
        return dp_seterr(DP_EINVAL, "reducer: bucket sizes must be at least 4 bytes");
    r->comm = comm;
    r->grads = grads;
    int n = plan(r, m);
    return n < 0 ? n : DP_OK;
}

void dp_reducer_free(struct dp_reducer *r) {
    if (!r) return;
    dp_free(r->b);
    memset(r, 0, sizeof *r);
}

void dp_reducer_begin(struct dp_reducer *r) {
    r->next = 0;
    r->rc = 0;
    r->t_begin = dp_time();
    r->t_backward_end = 0;
    for (int i = 0; i < r->nb; i++) r->b[i].req = NULL, r->b[i].t_ready = r->b[i].t_done = 0;
}

static void start(struct dp_reducer *r, struct dp_bucket *b) {
    if (r->rc) return;
    b->t_ready = dp_time();
    int rc = dp_comm_iallreduce(r->comm, r->grads + b->off, b->count, DP_DTYPE_F32, r->p.algo, &b->req);
    if (rc) {
        r->rc = rc;
        snprintf(r->err, sizeof r->err, "%s", dp_errmsg());
    }
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
    }
}

void dp_reducer_grad_ready(void *arg, int64_t offset, int64_t count) {
    struct dp_reducer *r = arg;
    (void)count;
    if (!r->p.overlap) return;
    poll(r);
    /* Every bucket whose lowest offset has been reached is complete. */
    while (r->next < r->nb && offset <= r->b[r->next].off) start(r, &r->b[r->next++]);
}

int dp_reducer_finish(struct dp_reducer *r) {
    r->t_backward_end = dp_time();
    while (r->next < r->nb) start(r, &r->b[r->next++]);
    int rc = r->rc;
    if (rc) dp_seterr(rc, "%s", r->err);
    /* Wait for every started bucket, even after an error, so that no
     * request is left in flight. */
    poll(r);
    for (int i = 0; i < r->nb; i++) {
        struct dp_bucket *b = &r->b[i];
        if (!b->req) continue;
        int w = dp_comm_wait(r->comm, b->req);
        b->req = NULL;
        if (b->t_done == 0) b->t_done = dp_time();
        if (w && !rc) rc = w;
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
    r->comm_exposed = r->t_end - r->t_backward_end;
    return rc;
}
