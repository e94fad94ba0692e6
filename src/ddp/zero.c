/* ZeRO: the optimizer state (stage 1), the gradients (stage 2) and the
 * parameters (stage 3) sharded over the workers.  The contract is in
 * dp/ddp.h; docs/ddp.md "ZeRO" has the memory accounting.
 *
 * The shard.  The slab is cut into RANGES that every rank plans alike: stage
 * 1 with the all-gather within the step has one, the whole slab [0, n);
 * stage 1 with the all-gather ahead (`ahead`, below) and stages 2 and 3
 * (with G > 1 workers) use the reducer's buckets.  Worker r's PIECE of range k is its block
 * dp_comm_split(count_k, G, r) at off_k, which is exactly the block that a
 * reduce-scatter (or an all-gather) of the range gives rank r.  So a bucket's
 * gradient is reduced by dp_comm_ireduce_scatter on its range and its
 * parameters gathered by dp_comm_iallgather on it: no other collective.
 * Worker r's pieces, in range order, are stored contiguously:
 *
 *       range k:   [off_k ......................... off_k + count_k)
 *       rank:        0          1          2        (dp_comm_split)
 *       piece:                [off, off + len)      -> shard [soff, soff + len)
 *
 *     gshard[soff + i]  the reduced gradient of slab element off + i (stage 2, 3)
 *     pshard[soff + i]  its master parameter (stage 3)
 *     optimizer state   parts slabs per piece: piece p's part k starts at
 *                       parts x soff + k x len (one piece: dp_optim's layout)
 *
 * One step on worker r:
 *
 *     reduction         stage 1: the slab (all-reduce or reduce-scatter);
 *                       stage 2, 3: bucket k reduce-scattered as soon as it is
 *                       ready, its own block copied to gshard, and its pages
 *                       of the gradient slab given back (release, below)
 *     sumsq             s_r = sum over the shard of g^2; all-reduce(s) = ||g||^2
 *     clip (optional)   shard g *= min(1, c / (||g|| + 1e-6))
 *     optimizer         per piece: dp_optim_step on a view of the state
 *     all-gather        stage 1: every range, started and left in flight
 *                       (ahead), else the slab; stage 2: every range; stage 3: none (each layer's range is
 *                       gathered before it runs, dp_zero_layer_begin)
 *
 * Ahead (stage 1, G > 1, --zero-gather ahead: by default across
 * processes).  The all-gather of the
 * updated shards is issued range by range in the order forward reads them
 * (the last range, at the slab's start, first) and not waited for: the next
 * forward waits, before each top-level layer, only for the ranges holding
 * that layer's parameters (dp_zero_layer_begin), so the gather of the later
 * layers travels while the first ones compute.  Whatever else reads the
 * parameters first waits for all of them (dp_zero_settle: the evaluation,
 * --check-replicas, the hashes and checkpoints through
 * dp_zero_gather_params, deterministic steps through dp_zero_materialize).
 * The all-gather copies bits, so the parameters are the same whenever they
 * arrive.
 *
 * The optimizer kernels are elementwise (the AdamW bias correction is a
 * scalar of the step count), so the piece-by-piece update is the bits of
 * the whole-slab update on the same elements: exact gradient sums
 * (deterministic mode) give exactly the plain run's parameters.
 *
 * Release.  The slabs keep their address space (layers write gradients
 * into, and read parameters from, slab offsets), but the whole UNITS inside
 * a released range are returned to the kernel with madvise(MADV_DONTNEED):
 * a private anonymous page comes back zero-filled when next touched.  For
 * the gradient that is also the zeroing the next step needs, so the floats
 * of the range outside whole units are zeroed by hand.  Parameter pages need
 * no zeroing (the next gather overwrites them).  The units are whole units
 * of the slab's own block, so nothing else lives there.
 *
 * The unit is 2 MiB, a transparent huge page (dp_malloc_big asks for them),
 * not a 4 KiB page: on VMs a 4 KiB page faulted back costs far more than
 * writing it, while a huge page comes back at about twice the cost of
 * writing it (docs/ddp.md "ZeRO" has the measurements).  So the gradient is given
 * back from the top of the slab down as buckets complete (they complete in
 * order, b[0] the highest): after bucket k, every whole unit above b[k].off
 * goes, a unit shared by two buckets too once both are reduced; the slab is
 * whole units of its own (dp_slab_map), so its end units go too and nothing
 * of it stays resident between steps.  The price is one fault per unit and
 * step (docs/ddp.md "ZeRO"). */
#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "dp/ddp.h"

#define UNIT ((uintptr_t)DP_SLAB_UNIT)

static size_t page_size(void) {
    long pg = sysconf(_SC_PAGESIZE);
    return pg > 0 ? (size_t)pg : 4096;
}

/* Gives back the whole units (of `unit` bytes) inside x[0, n) (dp_slab_give_back: zero, the
 * partial edges zeroed too; tail, the slab's last unit whole). */
static void release_in(float *x, int64_t n, int zero, int tail, uintptr_t unit) {
    if (n > 0) dp_slab_give_back(x, sizeof(float) * (size_t)n, (size_t)unit, zero, tail);
}

static void release_to(float *x, int64_t n, int zero, int tail) { release_in(x, n, zero, tail, UNIT); }

/* The parameter slab's units, counted from the unit its start lies in. */
static int64_t unit_of(const struct dp_zero *z, uintptr_t a) { return (int64_t)((a - ((uintptr_t)z->params & ~(UNIT - 1))) / UNIT); }
static int64_t nunits(const struct dp_zero *z) { return unit_of(z, (uintptr_t)(z->params + z->n) + UNIT - 1) + 1; }

int dp_zero_init(struct dp_zero *z, struct dp_comm *comm, int64_t n, int stage, const struct dp_optim_params *op) {
    memset(z, 0, sizeof *z);
    if (stage < 0 || stage > 3) return dp_seterr(DP_EINVAL, "ZeRO stage must be in 0..3 (got %d)", stage);
    z->stage = stage;
    z->comm = comm;
    z->n = n;
    z->cur = z->xcur = z->keep = -1;
    z->parts = op->kind == DP_OPTIM_ADAMW ? 2 : op->momentum != 0.0f ? 1 : 0;
    int G = comm && stage ? dp_comm_world(comm) : 1;
    dp_comm_split(n, G, G > 1 ? dp_comm_rank(comm) : 0, &z->off, &z->len);
    z->piece = dp_calloc(1, sizeof *z->piece);
    if (!z->piece) return dp_seterr(DP_ENOMEM, "ZeRO: out of memory");
    z->npieces = 1;
    z->piece[0] = (struct dp_zero_piece){.roff = 0, .rcount = n, .off = z->off, .len = z->len, .soff = 0};
    return DP_OK;
}

int dp_zero_plan(struct dp_zero *z, const struct dp_bucket *b, int nb, float *params, float *grads) {
    z->params = params, z->grads = grads;
    if (!z->stage || !z->comm || dp_comm_world(z->comm) == 1 || (z->stage == 1 && !z->ahead)) {
        z->ahead = 0; /* one worker, or stage 1 gathering within the step: the one contiguous shard */
        return DP_OK;
    }
    int G = dp_comm_world(z->comm), r = dp_comm_rank(z->comm);
    struct dp_zero_piece *pc = dp_calloc((size_t)(nb ? nb : 1), sizeof *pc);
    z->greq = dp_calloc((size_t)(nb ? nb : 1), sizeof *z->greq);
    z->have = dp_calloc((size_t)(nb ? nb : 1), 1);
    if (!pc || !z->greq || !z->have) {
        dp_free(pc);
        return dp_seterr(DP_ENOMEM, "ZeRO: out of memory");
    }
    dp_free(z->piece);
    z->piece = pc, z->npieces = nb, z->sharded = z->stage >= 2;
    int64_t soff = 0;
    for (int k = 0; k < nb; k++) {
        pc[k].roff = b[k].off, pc[k].rcount = b[k].count, pc[k].soff = soff;
        dp_comm_split(b[k].count, G, r, &pc[k].off, &pc[k].len);
        pc[k].off += b[k].off;
        soff += pc[k].len;
    }
    z->len = soff, z->off = -1; /* no contiguous slab shard */
    if (!z->sharded) return DP_OK; /* stage 1 ahead: the gradient stays in the slab */
    size_t bytes = sizeof(float) * (size_t)(soff ? soff : 1);
    z->gshard = dp_malloc_big(bytes);
    if (z->stage == 3) z->pshard = dp_malloc_big(bytes), z->gone = dp_calloc((size_t)nunits(z), 1);
    if (!z->gshard || (z->stage == 3 && (!z->pshard || !z->gone)))
        return dp_seterr(DP_ENOMEM, "ZeRO: out of memory for the shard");
    memset(z->gshard, 0, bytes);
    release_to(grads, z->n, 1, z->padded & DP_REPLICA_LAZY_GRADS); /* zero until backward writes: nothing resident */
    return DP_OK;
}

/* (a gather still in flight after an error is released by dp_comm_free) */
void dp_zero_free(struct dp_zero *z) {
    if (!z) return;
    dp_free(z->piece), dp_free(z->greq), dp_free(z->have), dp_free(z->gshard), dp_free(z->pshard), dp_free(z->gone);
    memset(z, 0, sizeof *z);
}

/* Piece k's reduced gradient: in gshard (sharded), else in the slab g. */
static float *piece_grad(const struct dp_zero *z, float *g, int k) {
    return z->sharded ? z->gshard + z->piece[k].soff : g + z->piece[k].off;
}

/* Bucket k's floats outside [lo, hi) zeroed, and [lo, hi) (whole units,
 * everything in it reduced) given back. */
void dp_zero_bucket_done(void *arg, int k) {
    struct dp_zero *z = arg;
    const struct dp_zero_piece *p = &z->piece[k];
    if (!z->accumulate) memcpy(z->gshard + p->soff, z->grads + p->off, sizeof(float) * (size_t)p->len);
    else {
        float *restrict dst = z->gshard + p->soff;
        const float *restrict src = z->grads + p->off;
#pragma omp simd
        for (int64_t i = 0; i < p->len; i++) dst[i] += src[i];
    }
    uintptr_t a = (uintptr_t)(z->grads + p->roff), e = (uintptr_t)(z->grads + p->roff + p->rcount);
    if (k == 0) { /* a new step: nothing given back yet (a whole-unit slab: its last unit too) */
        uintptr_t top = (uintptr_t)(z->grads + z->n);
        z->grel = z->padded & DP_REPLICA_LAZY_GRADS ? (top + UNIT - 1) & ~(UNIT - 1) : top & ~(UNIT - 1);
    }
    uintptr_t lo = (a + UNIT - 1) & ~(UNIT - 1), hi = z->grel;
    if (lo >= hi) { /* no new whole unit: zero the bucket */
        memset((void *)a, 0, e - a);
        return;
    }
    memset((void *)a, 0, lo - a);
    if (e > hi) memset((void *)hi, 0, e - hi); /* the top bucket's partial unit */
    if (madvise((void *)lo, hi - lo, MADV_DONTNEED) != 0) memset((void *)lo, 0, hi - lo);
    z->grel = lo;
}

void dp_zero_take_grad(struct dp_zero *z, float *g) {
    if (!z->sharded) return;
    for (int k = 0; k < z->npieces; k++) {
        const struct dp_zero_piece *p = &z->piece[k];
        memcpy(z->gshard + p->soff, g + p->off, sizeof(float) * (size_t)p->len);
    }
    release_to(g, z->n, 1, z->padded & DP_REPLICA_LAZY_GRADS);
}

int dp_zero_sumsq(struct dp_zero *z, const float *g, double *sumsq) {
    double acc = 0.0;
    for (int k = 0; k < z->npieces; k++) {
        const float *s = piece_grad(z, (float *)g, k); /* (only read) */
        const int64_t len = z->piece[k].len;
#pragma omp simd reduction(+ : acc)
        for (int64_t i = 0; i < len; i++) acc += (double)s[i] * (double)s[i];
    }
    *sumsq = acc;
    if (!z->stage || dp_comm_world(z->comm) == 1) return DP_OK;
    return dp_comm_allreduce(z->comm, sumsq, 1, DP_DTYPE_F64, DP_ALGO_AUTO);
}

/* Starts the all-gather of range k into the parameter slab (stage 3: its
 * own piece first comes from pshard).  Ranges are gathered in place, so the
 * other ranks' pieces land straight where the layers read them. */
static int gather_start(struct dp_zero *z, int k) {
    const struct dp_zero_piece *p = &z->piece[k];
    z->gathers++;
    if (z->gone) /* its units given back earlier in this pass come back now, zero-filled */
        for (int64_t u = unit_of(z, (uintptr_t)(z->params + p->roff)),
                     e = unit_of(z, (uintptr_t)(z->params + p->roff + p->rcount) - 1);
             u <= e; u++)
            z->refaults += z->gone[u], z->gone[u] = 0;
    if (z->pshard) memcpy(z->params + p->off, z->pshard + p->soff, sizeof(float) * (size_t)p->len);
    return dp_comm_iallgather(z->comm, z->params + p->roff, p->rcount, DP_DTYPE_F32, DP_ALGO_AUTO, &z->greq[k]);
}

static int gather_wait(struct dp_zero *z, int k) {
    if (!z->greq[k]) return DP_OK;
    int rc = dp_comm_wait(z->comm, z->greq[k]);
    z->greq[k] = NULL;
    if (!rc) z->have[k] = 1;
    return rc;
}

int dp_zero_settle(struct dp_zero *z) {
    int rc = DP_OK;
    for (int k = 0; z->greq && k < z->npieces; k++) {
        int w = gather_wait(z, k);
        if (!rc) rc = w;
    }
    return rc;
}

/* Every range gathered (those in flight waited for, the others started
 * then waited for: the waits in range order, all started first). */
static int gather_all(struct dp_zero *z) {
    int rc = DP_OK;
    for (int k = 0; k < z->npieces && !rc; k++)
        if (!z->have[k] && !z->greq[k]) rc = gather_start(z, k);
    for (int k = 0; k < z->npieces; k++) {
        int w = gather_wait(z, k);
        if (!rc) rc = w;
    }
    return rc;
}

int dp_zero_step(struct dp_zero *z, struct dp_optim *o, float *params, float *g, float lr, double clip_norm,
                 double sumsq) {
    int rc = dp_zero_settle(z); /* (nothing in flight after a forward; a caller without one) */
    if (rc) return rc;
    if (clip_norm > 0) { /* dp_clip_grad_norm's rule on the global norm */
        double norm = sqrt(sumsq), coef = clip_norm / (norm + 1e-6);
        if (isfinite(norm) && coef < 1.0) {
            const float c = (float)coef;
            for (int k = 0; k < z->npieces; k++) {
                float *gs = piece_grad(z, g, k);
                const int64_t len = z->piece[k].len;
#pragma omp simd
                for (int64_t i = 0; i < len; i++) gs[i] *= c;
            }
        }
    }
    /* piece by piece, each on a view of the optimizer: n and state narrowed
     * to the piece (the state layout above), the step count shared */
    for (int k = 0; k < z->npieces && !rc; k++) {
        const struct dp_zero_piece *p = &z->piece[k];
        struct dp_optim v = *o;
        v.n = p->len, v.state_len = (int64_t)z->parts * p->len;
        v.state = o->state ? o->state + (size_t)z->parts * (size_t)p->soff : NULL;
        float *x = z->pshard ? z->pshard + p->soff : params + p->off;
        rc = dp_optim_step(&v, x, piece_grad(z, g, k), p->len, lr);
    }
    if (rc) return rc;
    o->step++;
    z->t_g0 = z->t_g1 = dp_time();
    if (!z->stage || dp_comm_world(z->comm) == 1 || z->stage == 3) return DP_OK;
    if (z->ahead) { /* issued in forward's order, waited for by forward (above) */
        for (int k = z->npieces - 1; k >= 0 && !rc; k--) rc = gather_start(z, k);
        return rc;
    }
    if (!z->sharded) rc = dp_comm_allgather(z->comm, params, z->n, DP_DTYPE_F32, DP_ALGO_AUTO);
    else {
        memset(z->have, 0, (size_t)z->npieces);
        rc = gather_all(z);
    }
    z->t_g1 = dp_time();
    return rc;
}

/* ---- stage 3: the parameters ---------------------------------------------------------- */

int dp_zero_shard_init(struct dp_zero *z, const struct dp_model *m, uint64_t seed, const float *whole) {
    if (z->stage != 3 || !z->sharded) return DP_OK;
    for (int k = 0; k < z->npieces; k++) {
        const struct dp_zero_piece *p = &z->piece[k];
        if (whole) memcpy(z->pshard + p->soff, whole + p->off, sizeof(float) * (size_t)p->len);
        else dp_model_init_slice(m, 0, z->pshard + p->soff, p->off, p->len, seed);
    }
    return DP_OK;
}

int dp_zero_materialize(struct dp_zero *z) {
    if (z->stage != 3 || !z->sharded) return dp_zero_settle(z);
    double t0 = dp_time();
    int rc = gather_all(z);
    z->t_g0 = t0, z->t_g1 = dp_time();
    return rc;
}

int dp_zero_release_params(struct dp_zero *z) {
    if (z->stage != 3 || !z->sharded) return DP_OK;
    int rc = DP_OK;
    for (int k = 0; k < z->npieces; k++) {
        int w = gather_wait(z, k); /* nothing may still write into a released range */
        if (!rc) rc = w;
        z->have[k] = 0;
    }
    release_to(z->params, z->n, 0, z->padded & DP_REPLICA_LAZY_PARAMS);
    z->cur = z->xcur = z->keep = -1;
    if (z->gone) memset(z->gone, 0, (size_t)nunits(z)); /* a new pass: faulting back in is its price */
    return rc;
}

/* Range j is held: its parameters are in the slab, being gathered, or in use. */
static int range_held(const struct dp_zero *z, int j) { return z->have[j] || z->greq[j] || j == z->cur || j == z->xcur; }

/* Gives back range k's parameters: its whole units, and also a unit it
 * shares with the ranges below (k + 1, ...) or above (k - 1, ...) when none
 * of those is held (a gather writes its range after, so a range about to be
 * gathered does not count).  A range's partial units so go with the last
 * range to leave them, instead of staying to the pass's end, one per
 * boundary. */
static void release_range(struct dp_zero *z, int k) {
    const struct dp_zero_piece *p = &z->piece[k];
    uintptr_t s0 = (uintptr_t)z->params, s1 = (uintptr_t)(z->params + z->n);
    uintptr_t a = (uintptr_t)(z->params + p->roff), e = (uintptr_t)(z->params + p->roff + p->rcount);
    uintptr_t lo = (a + UNIT - 1) & ~(UNIT - 1), hi = e & ~(UNIT - 1);
    uintptr_t dn = a & ~(UNIT - 1), up = (e + UNIT - 1) & ~(UNIT - 1);
    int ok = dn >= s0; /* the unit below a: inside the slab, no range in it held */
    for (int j = k + 1; ok && j < z->npieces && (uintptr_t)(z->params + z->piece[j].roff + z->piece[j].rcount) > dn; j++)
        ok = !range_held(z, j);
    if (ok) lo = dn;
    ok = up <= s1 || (z->padded & DP_REPLICA_LAZY_PARAMS); /* past the slab's end: its own padding only */
    for (int j = k - 1; ok && j >= 0 && (uintptr_t)(z->params + z->piece[j].roff) < up; j--) ok = !range_held(z, j);
    if (ok) hi = up;
    if (hi <= lo) return;
    madvise((void *)lo, hi - lo, MADV_DONTNEED); /* (a failure leaves the pages in place) */
    for (int64_t u = unit_of(z, lo); u < unit_of(z, hi); u++) z->gone[u] = 1;
}

/* Ranges from the slab's start up (b[0] is the highest), one at a time:
 * gathered (or waited for, if a prefetch has it in flight), folded into the
 * hash in slab order, and, without keep, given back before the next: this
 * worker then holds at most one range, and at the end the partial units too
 * go (the whole slab released). */
int dp_zero_gather_params(struct dp_zero *z, int keep, uint64_t *hash) {
    if (z->stage != 3 || !z->sharded) {
        int rc = dp_zero_settle(z);
        if (!rc && hash) *hash = dp_fnv1a64(z->params, sizeof(float) * (size_t)z->n, *hash);
        return rc;
    }
    int rc = DP_OK;
    for (int k = z->npieces - 1; k >= 0 && !rc; k--) {
        const struct dp_zero_piece *p = &z->piece[k];
        if (!z->have[k] && !z->greq[k]) rc = gather_start(z, k);
        if (!rc) rc = gather_wait(z, k);
        if (rc) break;
        if (hash) *hash = dp_fnv1a64(z->params + p->roff, sizeof(float) * (size_t)p->rcount, *hash);
        if (!keep) z->have[k] = 0, release_range(z, k);
    }
    if (!keep) {
        int w = dp_zero_release_params(z);
        if (!rc) rc = w;
    }
    return rc;
}

int dp_zero_params_whole(const struct dp_zero *z) {
    for (int k = 0; k < z->npieces; k++)
        if (!z->have[k] || z->greq[k]) return 0;
    return 1;
}

/* Whole 4 KiB pages: once, at the end, so no fault cost recurs per step. */
void dp_zero_drop_grad_shard(struct dp_zero *z) {
    if (z->gshard) release_in(z->gshard, z->len, 1, 0, (uintptr_t)page_size());
}

/* The range holding slab offset off (ranges are disjoint; b[0] the highest). */
static int range_of(const struct dp_zero *z, int64_t off) {
    for (int k = 0; k < z->npieces; k++)
        if (off >= z->piece[k].roff && off < z->piece[k].roff + z->piece[k].rcount) return k;
    return -1;
}

/* Range k's parameters given back (nothing in flight: it was waited for). */
static void drop(struct dp_zero *z, int k) {
    z->have[k] = 0;
    if (z->cur == k) z->cur = -1; /* no longer held, so a unit it shares with the other can go too */
    if (z->xcur == k) z->xcur = -1;
    if (z->keep == k) z->keep = -1;
    release_range(z, k);
}

/* 1 when range k and the floats [off, off + count) of the slab overlap. */
static int overlaps(const struct dp_zero *z, int k, int64_t off, int64_t count) {
    return count > 0 && off < z->piece[k].roff + z->piece[k].rcount && z->piece[k].roff < off + count;
}

/* Stage 1 ahead: forward waits for the ranges the layer reads (its own
 * parameters and a tied weight, wherever the buckets cut them), backward
 * for anything still in flight. */
static int ahead_wait(struct dp_zero *z, int phase, const struct dp_layer *l) {
    if (phase != DP_PHASE_FORWARD) return dp_zero_settle(z);
    int rc = DP_OK;
    for (int k = 0; k < z->npieces && !rc; k++)
        if (z->greq[k] && (overlaps(z, k, l->param_off, l->param_count) || overlaps(z, k, l->tied_off, l->tied_count)))
            rc = gather_wait(z, k);
    return rc;
}

/* Before a top-level layer runs (forward: layers in increasing order, so
 * ranges from the last to 0; backward: the reverse).  The layer reads its
 * own range k (a layer without parameters runs in the current range) and
 * its tied range x, if any: another layer's parameters (GPT's head reads
 * tok.weight, which lies in the lowest range, the embedding's).  Ranges
 * are whole top-level layers, so a tied weight lies in one range.
 * Entering: the ranges held for the layer before that this one does not
 * read are released (forward and backward alike: the layers of one range
 * run together), k's and x's gathers are waited for (started now if no
 * prefetch did: both started, then both waited), and the range after k in
 * the pass's direction is started (prefetch) so that it travels while the
 * layer computes.  The range forward ends in (0), the head's tied range,
 * and the range before 0 (1, the keep) are kept for backward, which starts
 * with them: 1 would otherwise be given back as forward enters 0 and
 * gathered again by backward's first prefetch, one layer later (a second
 * all-gather, and on a small model the units it shares with its
 * neighbours faulted back: mlp's 2.7 MB slab is two units).  Holding 1
 * instead of prefetching nothing at forward's end keeps two ranges held,
 * as everywhere else in the pass.  Backward's last range is released by
 * dp_zero_release_params after the pass.  So a tied range is held only
 * while its reader runs: GPT's tok+pos range is gathered three times a
 * step (embedding forward; head forward through head backward; embedding
 * backward), and from the head's forward until ln_f's backward, three
 * ranges are resident (0, the tied one, 1).
 *
 * The tied weight's gradient needs nothing here: the head adds its dW
 * first (it is the last layer), but it reports no range, and the bucket
 * holding the weight is reduce-scattered only once the owner (an earlier
 * layer, so a later backward) has added its own and reported the range
 * (src/nn/embedding.c, "Tied gradient and the reducer"). */
int dp_zero_layer_begin(void *arg, int phase, int layer, const struct dp_layer *l) {
    struct dp_zero *z = arg;
    (void)layer;
    if (z->ahead) return ahead_wait(z, phase, l);
    if (z->stage != 3 || !z->sharded) return DP_OK;
    /* a layer in slices or parts: each slice or child comes here itself (a slice as a layer
     * whose parameters are its rows and whose tied range is the layer's bias in forward:
     * dp__layer_slice_begin, dp__kid_forward), so only one range (and the next, prefetched) is
     * gathered at a time */
    if (l->slice_rows > 0 || l->parts) return DP_OK;
    int k = l->param_count > 0 ? range_of(z, l->param_off) : z->cur;
    int x = l->tied_count > 0 ? range_of(z, l->tied_off) : -1;
    if (x >= 0 && range_of(z, l->tied_off + l->tied_count - 1) != x)
        return dp_seterr(DP_EINTERNAL, "ZeRO-3: layer %s's tied parameters cross a bucket boundary", l->name);
    if (x == k) x = -1;
    if (k < 0 && x < 0) return DP_OK;
    int fwd = phase == DP_PHASE_FORWARD, next = fwd ? k - 1 : k + 1;
    /* forward's last range (0): the one before it (1) is the one backward
     * prefetches first, so it is kept, not given back and gathered again;
     * it is let go as a plain prefetch once backward starts (or dropped if
     * a new forward pass starts: the evaluation's passes have no backward) */
    if (fwd && k == 0 && z->cur == 1 && x != 1) z->keep = 1, z->cur = -1;
    if (z->keep >= 0 && z->keep != k && z->keep != x && (fwd ? k != 0 : z->keep != next)) drop(z, z->keep);
    if (!fwd || k != 0) z->keep = -1; /* (kept and read now: held as k, x or the prefetch) */
    if (z->cur >= 0 && z->cur != k && z->cur != x) drop(z, z->cur);
    if (z->xcur >= 0 && z->xcur != k && z->xcur != x) drop(z, z->xcur);
    z->cur = k, z->xcur = x;
    int rc = DP_OK;
    if (k >= 0 && !z->have[k] && !z->greq[k]) rc = gather_start(z, k);
    if (!rc && x >= 0 && !z->have[x] && !z->greq[x]) rc = gather_start(z, x);
    if (!rc && k >= 0) rc = gather_wait(z, k);
    if (!rc && x >= 0) rc = gather_wait(z, x);
    if (!rc && k >= 0 && next >= 0 && next < z->npieces && !z->have[next] && !z->greq[next])
        rc = gather_start(z, next);
    int64_t held = 0; /* (the counter of dp_zero_counts.param_hw_bytes) */
    for (int j = 0; j < z->npieces; j++) held += z->have[j] || z->greq[j] ? z->piece[j].rcount : 0;
    if (held > z->held_hw) z->held_hw = held;
    return rc;
}

/* ---- checkpoints and accounting -------------------------------------------------------- */

int64_t dp_resident_bytes(const void *p, size_t bytes) {
    if (!p || !bytes) return 0;
    size_t pg = page_size();
    uintptr_t lo = (uintptr_t)p & ~(uintptr_t)(pg - 1), hi = ((uintptr_t)p + bytes + pg - 1) & ~(uintptr_t)(pg - 1);
    size_t npages = (hi - lo) / pg;
    unsigned char vec[256];
    int64_t res = 0;
    for (size_t i = 0; i < npages; i += sizeof vec) {
        size_t m = npages - i < sizeof vec ? npages - i : sizeof vec;
        if (mincore((void *)(lo + i * pg), m * pg, vec) != 0) return -1;
        for (size_t j = 0; j < m; j++) res += vec[j] & 1;
    }
    return res * (int64_t)pg;
}

int64_t dp_zero_live_bytes(const struct dp_zero *z, const struct dp_optim *o) {
    size_t slab = sizeof(float) * (size_t)z->n;
    int64_t g = z->grads ? dp_resident_bytes(z->grads, slab) : 0, p = z->params ? dp_resident_bytes(z->params, slab) : 0;
    if (g < 0 || p < 0) return -1;
    /* (the gradient shard by its pages too: dp_zero_drop_grad_shard gives them back at the end) */
    int64_t gs = z->gshard ? dp_resident_bytes(z->gshard, sizeof(float) * (size_t)z->len) : 0;
    if (gs < 0) return -1;
    int64_t shard = (int64_t)sizeof(float) * z->len * (z->pshard != NULL);
    return g + p + gs + shard + (int64_t)sizeof(float) * o->state_len;
}

/* Backward at range k holds k's gradient (being written) and k - 1's (its
 * reduce-scatter in flight; dp_reducer_grad_ready waits for the older
 * ones before backward writes on), and stage 3 also k's parameters and the
 * prefetched next range's: two adjacent ranges of each, and the units
 * those share with their neighbours (release_range). */
int64_t dp_zero_inflight_bytes(const struct dp_zero *z) {
    if (!z->sharded) return 0;
    int64_t pair = z->npieces ? z->piece[0].rcount : 0;
    for (int k = 0; k + 1 < z->npieces; k++)
        if (z->piece[k].rcount + z->piece[k + 1].rcount > pair) pair = z->piece[k].rcount + z->piece[k + 1].rcount;
    return dp_zero_inflight_of_pair(z->stage, pair);
}

/* Piece i's floats in this worker's memory: part k of its optimizer state
 * (the layout at the top), or with k = -1 its stage-3 parameters (pshard).
 * For a checkpoint written from the shards (src/train/checkpointing.c zero_stream). */
const float *dp_zero_piece_data(const struct dp_zero *z, const struct dp_optim *o, int i, int k) {
    const struct dp_zero_piece *p = &z->piece[i];
    if (k < 0) return z->pshard + p->soff;
    return o->state + (size_t)z->parts * (size_t)p->soff + (size_t)k * (size_t)p->len;
}
