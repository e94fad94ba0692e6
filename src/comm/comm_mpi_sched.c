/* The mpi backend's point-to-point schedules: the steps of the project's ring, rhd
 * (recursive halving and doubling), the broadcast chain and the binomial tree, built when an
 * operation is issued (comm_mpi_run.c runs them; comm_mpi.c has the design). */
#ifdef DP_WITH_MPI

#include "comm_mpi_impl.h"

/* ---- point-to-point schedules ---------------------------------------------------------------
 *
 * Vocabulary as in comm_impl.h and algo_ring.c / algo_rhd.c: P ranks, this
 * rank r, l = r-1 and rr = r+1 mod P; blk(b) = block b of
 * dp_comm_split(count, P, b).  "send X to q" and "recv X from q" are
 * MPI_Isend / MPI_Irecv of the bytes of X on the p2p communicator with the
 * operation's tag (its issue number mod MPI_TAG_UB+1).  Between two ranks
 * the messages of one operation are matched in the order they were posted
 * (MPI's non-overtaking rule), and both sides cut every transfer into the
 * same segments, so no message needs more than the operation's tag.  A
 * transfer of length 0 is skipped by both sides. */

static int mod(int a, int p) { return ((a % p) + p) % p; }

static void blk(const struct dp__op *d, int P, int b, size_t *off, size_t *len) {
    int64_t o, n;
    dp_comm_split(d->count, P, b, &o, &n);
    size_t es = dp_dtype_size(d->dtype);
    *off = (size_t)o * es, *len = (size_t)n * es;
}

/* Appends an empty step; NULL when out of memory. */
static struct step *add_step(struct dp_comm_req *rq) {
    if (rq->nsteps == rq->cap) {
        int cap = rq->cap ? 2 * rq->cap : 16;
        struct step *s = dp_malloc(sizeof *s * (size_t)cap);
        if (!s) return NULL;
        if (rq->nsteps) memcpy(s, rq->steps, sizeof *s * (size_t)rq->nsteps);
        dp_free(rq->steps);
        rq->steps = s, rq->cap = cap;
    }
    struct step *st = &rq->steps[rq->nsteps++];
    memset(st, 0, sizeof *st);
    return st;
}
static void add_send(struct step *st, int peer, size_t off, size_t len) {
    st->send[st->nsend++] = (struct xfer){peer, off, len};
}
static void add_recv(struct step *st, int peer, size_t off, size_t len) {
    st->recv[st->nrecv++] = (struct xfer){peer, off, len};
}

#define STEP(st)                                  \
    struct step *st = add_step(rq);               \
    if (!st) return DP_ENOMEM

/*
 * Ring all-reduce, reduce-scatter and all-gather over MPI.
 *
 * Protocol (the one of dp__allreduce_ring, with messages instead of reads of
 * the left neighbour's buffer).  P-1 reduce-scatter steps, then P-1
 * all-gather steps; in each, every rank sends one block to the right and
 * receives one from the left:
 *   RS step s (0..P-2): send blk(r-1-s) to rr; recv blk(r-2-s) from l and add
 *       it into mine.  (At s = 0 the block sent is this rank's input; later,
 *       the partial sum it completed at step s-1.)  After step P-2, block r
 *       holds the full sum.
 *   AG step t (0..P-2): send blk(r-t) to rr (final: my own block at t = 0,
 *       else the one received at step t-1); recv blk(r-1-t) from l into mine.
 * Reduce-scatter is the RS steps, all-gather the AG steps.  Each rank sends
 * and receives 2(P-1)/P of the buffer in all: bandwidth-optimal.  Inside a
 * step the block is pipelined in segments, each received segment added into
 * the buffer while later ones are in flight.
 *
 *   3 ranks, all-reduce     rank 0              rank 1              rank 2
 *   RS 0                    send [2], +=[1]     send [0], +=[2]     send [1], +=[0]
 *   RS 1                    send [1], +=[0]     send [2], +=[1]     send [0], +=[2]
 *                           [0] = S[0]          [1] = S[1]          [2] = S[2]
 *   AG 0                    send [0], =[2]      send [1], =[0]      send [2], =[1]
 *   AG 1                    send [2], =[1]      send [0], =[2]      send [1], =[0]
 */
static int sched_ring(struct dp_comm_req *rq, int P, int r, int rs, int ag) {
    const struct dp__op *d = &rq->d;
    int l = mod(r - 1, P), rr = mod(r + 1, P);
    size_t o, n;
    for (int s = 0; rs && s < P - 1; s++) {
        STEP(st);
        blk(d, P, mod(r - 1 - s, P), &o, &n);
        add_send(st, rr, o, n);
        blk(d, P, mod(r - 2 - s, P), &o, &n);
        add_recv(st, l, o, n);
        st->reduce = 1;
    }
    for (int t = 0; ag && t < P - 1; t++) {
        STEP(st);
        blk(d, P, mod(r - t, P), &o, &n);
        add_send(st, rr, o, n);
        blk(d, P, mod(r - 1 - t, P), &o, &n);
        add_recv(st, l, o, n);
    }
    return 0;
}

/*
 * Ring broadcast: a pipelined chain root -> root+1 -> ... -> root-1.
 *
 * Protocol.  v = (r - root) mod P.  One step per rank: the root sends the
 * whole buffer to its successor; a middle rank receives it from its
 * predecessor and forwards every segment to its successor as soon as it has
 * arrived (so all links carry segments at once); the last rank only
 * receives.  Time about (n + (P-2)·segment)/bandwidth.
 *
 *   root 0, 3 ranks, segments c0 c1 c2:
 *   time   0: 0->1 c0;   1: 0->1 c1, 1->2 c0;   2: 0->1 c2, 1->2 c1;   3: 1->2 c2
 */
static int sched_chain(struct dp_comm_req *rq, int P, int r) {
    const struct dp__op *d = &rq->d;
    int v = mod(r - d->root, P);
    size_t n = (size_t)d->count * dp_dtype_size(d->dtype);
    STEP(st);
    if (v > 0) add_recv(st, mod(r - 1, P), 0, n);
    if (v < P - 1) add_send(st, mod(r + 1, P), 0, n);
    st->forward = v > 0 && v < P - 1;
    return 0;
}

/* Recursive halving-doubling: the fold and unit ranges of algo_rhd.c
 * (vocabulary there: P' = the largest power of two <= P, L = log2 P',
 * rem = P - P', new rank nr, units). */
struct rhd {
    int P, Pp, L, rem, nr, U;
};

static void rhd_setup(struct rhd *h, int P, int r, int units_are_blocks) {
    h->P = P, h->Pp = 1, h->L = 0;
    while (h->Pp * 2 <= P) h->Pp *= 2, h->L++;
    h->rem = P - h->Pp;
    h->nr = r < 2 * h->rem ? (r % 2 ? r / 2 : -1) : r - h->rem;
    h->U = units_are_blocks ? P : h->Pp;
}
static int rhd_orig(const struct rhd *h, int nr) { return nr < h->rem ? 2 * nr + 1 : nr + h->rem; }
/* Units [*lo, *hi) new rank nr holds after `levels` halving levels. */
static void rhd_units(const struct rhd *h, int nr, int levels, int *lo, int *hi) {
    int a = 0, b = h->U;
    for (int k = 0; k < levels; k++) {
        int mid = a + (b - a) / 2;
        if (nr & (h->Pp >> (k + 1))) a = mid;
        else b = mid;
    }
    *lo = a, *hi = b;
}
/* The original rank whose leaf range holds unit u. */
static int rhd_holder(const struct rhd *h, int u) {
    int a = 0, b = h->U, nr = 0;
    for (int k = 0; k < h->L; k++) {
        int mid = a + (b - a) / 2;
        if (u >= mid) nr |= h->Pp >> (k + 1), a = mid;
        else b = mid;
    }
    return rhd_orig(h, nr);
}
/* Byte range of units [lo, hi). */
static void rhd_bytes(const struct dp__op *d, const struct rhd *h, int lo, int hi, size_t *off,
                      size_t *len) {
    size_t o1, n1, o2, n2;
    blk(d, h->U, lo, &o1, &n1);
    if (hi <= lo) {
        *off = o1, *len = 0;
        return;
    }
    blk(d, h->U, hi - 1, &o2, &n2);
    *off = o1, *len = o2 + n2 - o1;
}

/* Halving level k: partner p = orig(nr ^ P'>>(k+1)); our common range splits
 * at its middle unit, the rank with that bit clear keeps the lower half.
 * Send p's half, recv mine into scratch and add it. */
static int rhd_halving(struct dp_comm_req *rq, const struct rhd *h) {
    for (int k = 0; k < h->L; k++) {
        int pn = h->nr ^ (h->Pp >> (k + 1)), lo, hi;
        size_t o, n;
        STEP(st);
        rhd_units(h, pn, k + 1, &lo, &hi);
        rhd_bytes(&rq->d, h, lo, hi, &o, &n);
        add_send(st, rhd_orig(h, pn), o, n);
        rhd_units(h, h->nr, k + 1, &lo, &hi);
        rhd_bytes(&rq->d, h, lo, hi, &o, &n);
        add_recv(st, rhd_orig(h, pn), o, n);
        st->reduce = 1;
    }
    return 0;
}

/* Doubling step k: partner p = orig(nr ^ 1<<k); send my range (after L-k
 * levels), recv p's into place.  Afterwards both hold the union. */
static int rhd_doubling(struct dp_comm_req *rq, const struct rhd *h) {
    for (int k = 0; k < h->L; k++) {
        int pn = h->nr ^ (1 << k), lo, hi;
        size_t o, n;
        STEP(st);
        rhd_units(h, h->nr, h->L - k, &lo, &hi);
        rhd_bytes(&rq->d, h, lo, hi, &o, &n);
        add_send(st, rhd_orig(h, pn), o, n);
        rhd_units(h, pn, h->L - k, &lo, &hi);
        rhd_bytes(&rq->d, h, lo, hi, &o, &n);
        add_recv(st, rhd_orig(h, pn), o, n);
    }
    return 0;
}

/*
 * Recursive halving-doubling all-reduce (Rabenseifner) over MPI.
 *
 * Protocol (dp__allreduce_rhd's, with messages).  Units: P' parts of the
 * buffer.
 *   fold (P not a power of two): even r < 2rem sends its whole buffer to
 *       r+1 and waits; odd r < 2rem receives it and adds it into its own.
 *   halving level k (0..L-1): partner p = orig(nr ^ P'>>(k+1)); send p's
 *       half of our common unit range, recv mine and add it.  After L levels
 *       new rank nr holds the full sum of unit nr.
 *   doubling step k (0..L-1): partner p = orig(nr ^ 1<<k); send the range I
 *       hold, recv p's.  After L steps every participant holds everything.
 *   unfold: odd r < 2rem sends the whole result to r-1, which receives it.
 * 2L steps of n/2, n/4, ... bytes each way, plus 2 whole-buffer steps with a
 * fold.
 *
 *   4 ranks, units a b c d   rank 0          rank 1          rank 2          rank 3
 *   halve 0 (0-2, 1-3)       +=ab, send cd   +=ab, send cd   +=cd, send ab   +=cd, send ab
 *   halve 1 (0-1, 2-3)       +=a, send b     +=b, send a     +=c, send d     +=d, send c
 *   double 0 (0-1, 2-3)      send a, =b      send b, =a      send c, =d      send d, =c
 *   double 1 (0-2, 1-3)      send ab, =cd    send ab, =cd    send cd, =ab    send cd, =ab
 */
static int sched_rhd_allreduce(struct dp_comm_req *rq, int P, int r) {
    struct rhd h;
    rhd_setup(&h, P, r, 0);
    size_t n = (size_t)rq->d.count * dp_dtype_size(rq->d.dtype);
    if (h.nr < 0) {
        STEP(a);
        add_send(a, r + 1, 0, n);
        STEP(b);
        add_recv(b, r + 1, 0, n);
        return 0;
    }
    if (r < 2 * h.rem) {
        STEP(st);
        add_recv(st, r - 1, 0, n);
        st->reduce = 1;
    }
    int rc = rhd_halving(rq, &h);
    if (!rc) rc = rhd_doubling(rq, &h);
    if (!rc && r < 2 * h.rem) {
        STEP(st);
        add_send(st, r - 1, 0, n);
    }
    return rc;
}

/*
 * Recursive-halving reduce-scatter over MPI.
 *
 * Protocol (dp__reduce_scatter_rhd's).  Units are the P blocks.
 *   fold and halving levels as in the all-reduce; afterwards participant nr
 *       holds the full sums of its leaf (one or two blocks).
 *   final step (every rank): send each block u of my leaf (u != r) to rank
 *       u; recv blk(r) from its holder when that is not me.
 *
 *   3 ranks (P' = 2): rank 1 = new 0 holds block 0, rank 2 = new 1 holds 1, 2
 *   fold     rank 0 -> rank 1 (whole buffer; rank 1 adds)
 *   halve 0  rank 1 sends [1,2] to rank 2, rank 2 sends [0] to rank 1 (both add)
 *   final    rank 1 sends [0] to rank 0; rank 2 sends [1] to rank 1
 */
static int sched_rhd_reduce_scatter(struct dp_comm_req *rq, int P, int r) {
    struct rhd h;
    rhd_setup(&h, P, r, 1);
    size_t n = (size_t)rq->d.count * dp_dtype_size(rq->d.dtype), o, len;
    int rc = 0;
    if (r < 2 * h.rem) {
        STEP(st);
        if (h.nr < 0) add_send(st, r + 1, 0, n);
        else add_recv(st, r - 1, 0, n), st->reduce = 1;
    }
    if (h.nr >= 0 && (rc = rhd_halving(rq, &h))) return rc;
    STEP(st);
    if (h.nr >= 0) {
        int lo, hi;
        rhd_units(&h, h.nr, h.L, &lo, &hi);
        for (int u = lo; u < hi; u++) {
            if (u == r) continue;
            blk(&rq->d, P, u, &o, &len);
            add_send(st, u, o, len);
        }
    }
    int holder = rhd_holder(&h, r);
    if (holder != r) {
        blk(&rq->d, P, r, &o, &len);
        add_recv(st, holder, o, len);
    }
    return 0;
}

/*
 * Recursive-doubling all-gather over MPI.
 *
 * Protocol (dp__allgather_rhd's).  Units are the P blocks.
 *   gather (every rank): send blk(r) to its holder when that is not me; a
 *       participant receives every block u != r of its leaf from rank u.
 *   doubling steps as in the all-reduce: afterwards every participant holds
 *       every block.
 *   unfold: odd r < 2rem sends the whole buffer to r-1, which receives it.
 *
 *   3 ranks: gather   rank 0 sends [0] to rank 1; rank 1 sends [1] to rank 2
 *            double 0 rank 1 <-> rank 2 ([0] one way, [1,2] the other)
 *            unfold   rank 1 sends everything to rank 0
 */
static int sched_rhd_allgather(struct dp_comm_req *rq, int P, int r) {
    struct rhd h;
    rhd_setup(&h, P, r, 1);
    size_t n = (size_t)rq->d.count * dp_dtype_size(rq->d.dtype), o, len;
    int holder = rhd_holder(&h, r), rc = 0;
    STEP(st);
    if (holder != r) {
        blk(&rq->d, P, r, &o, &len);
        add_send(st, holder, o, len);
    }
    if (h.nr >= 0) {
        int lo, hi;
        rhd_units(&h, h.nr, h.L, &lo, &hi);
        for (int u = lo; u < hi; u++) {
            if (u == r) continue;
            blk(&rq->d, P, u, &o, &len);
            add_recv(st, u, o, len);
        }
        if ((rc = rhd_doubling(rq, &h))) return rc;
    }
    if (r < 2 * h.rem) {
        STEP(u);
        if (h.nr < 0) add_recv(u, r + 1, 0, n);
        else add_send(u, r - 1, 0, n);
    }
    return 0;
}

/*
 * Binomial-tree broadcast over MPI (the rhd algorithm's broadcast).
 *
 * Protocol (dp__broadcast_rhd's).  v = (r - root) mod P; the parent of v > 0
 * is v with its highest set bit cleared; the children of v are v + 2^k for
 * every 2^k > v with v + 2^k < P.  Rank v > 0 receives the whole buffer from
 * its parent, then every rank sends it to its children, smallest 2^k first
 * (one step each: round k of the tree).  ceil(log2 P) rounds.
 *
 *   4 ranks, root 0:  round 0: 0 -> 1;  round 1: 0 -> 2, 1 -> 3
 */
static int sched_binomial(struct dp_comm_req *rq, int P, int r) {
    int root = rq->d.root, v = mod(r - root, P);
    size_t n = (size_t)rq->d.count * dp_dtype_size(rq->d.dtype);
    if (v > 0) {
        int top = 1;
        while (top * 2 <= v) top *= 2;
        STEP(st);
        add_recv(st, (v - top + root) % P, 0, n);
    }
    int k = 1;
    while (k <= v) k *= 2;
    for (; v + k < P; k *= 2) {
        STEP(st);
        add_send(st, (v + k + root) % P, 0, n);
    }
    return 0;
}

/* Builds rq's schedule; an empty one for P = 1 or count = 0. */
int dp__mpi_build_schedule(struct mpi_comm *m, struct dp_comm_req *rq) {
    int P = m->base.nranks, r = m->base.rank, ring = rq->d.algo == DP_ALGO_RING;
    rq->nsteps = rq->cur = rq->begun = 0;
    if (P == 1 || rq->d.count == 0) return 0;
    int rc;
    switch (rq->d.coll) {
    case DP_COLL_ALLREDUCE:
        rc = ring ? sched_ring(rq, P, r, 1, 1) : sched_rhd_allreduce(rq, P, r);
        break;
    case DP_COLL_REDUCE_SCATTER:
        rc = ring ? sched_ring(rq, P, r, 1, 0) : sched_rhd_reduce_scatter(rq, P, r);
        break;
    case DP_COLL_ALLGATHER:
        rc = ring ? sched_ring(rq, P, r, 0, 1) : sched_rhd_allgather(rq, P, r);
        break;
    default:
        rc = ring ? sched_chain(rq, P, r) : sched_binomial(rq, P, r);
        break;
    }
    return rc ? dp_seterr(DP_ENOMEM, "comm: rank %d: out of memory for a schedule", r) : 0;
}

#endif /* DP_WITH_MPI */
