/*
 * Recursive halving-doubling (Rabenseifner) over shared memory, and the
 * binomial-tree broadcast.  Vocabulary and marks: see comm_impl.h.
 *
 * Vocabulary of this file:
 *   P'      the largest power of two <= P; L = log2(P'); rem = P - P'.
 *   fold    when P is not a power of two, the first 2·rem ranks pair up: even
 *           rank e = 2i hands its whole buffer to odd rank e+1, which adds it
 *           into its own and takes part in the halving-doubling as new rank i;
 *           rank e waits.  Ranks r >= 2·rem take part as new rank r - rem.
 *           At the end the odd rank writes the result back into e's buffer.
 *           (The fold of MPICH and Open MPI, for any P.)
 *   new rank nr in 0..P'-1 of a participant; orig(nr) maps it back.
 *   units   the buffer is cut into U units with dp_comm_split(count, U, u):
 *           U = P' for all-reduce (so the halves are even), U = P for
 *           reduce-scatter and all-gather (so that units are the P blocks).
 *   level k (0..L-1) of the halving pairs nr with nr XOR (P' >> (k+1)); both
 *           partners hold the same unit range, split at its middle unit;
 *           the one with that bit clear keeps the lower half.  After L levels
 *           new rank nr holds the leaf range of units, in nr order (one unit
 *           for U = P', one or two for U = P).  The doubling runs the levels
 *           backwards: at its step k, nr pairs with nr XOR (1 << k) and copies
 *           the partner's range.
 *
 * Zero copy: "sending" a half is the partner reading it in place from this
 * rank's buffer once the mark of the step that produced it is set.
 */
#include <string.h>

#include "comm_impl.h"

struct rhd {
    int P, Pp, L, rem; /* P' = Pp */
    int nr;            /* this rank's new rank; -1 if folded out (an even rank < 2·rem) */
    int U;             /* units */
};

static void rhd_setup(struct rhd *h, const struct dp__coll *op, int units_per_rank) {
    h->P = op->nranks;
    h->Pp = 1, h->L = 0;
    while (h->Pp * 2 <= h->P) h->Pp *= 2, h->L++;
    h->rem = h->P - h->Pp;
    int r = op->rank;
    h->nr = r < 2 * h->rem ? (r % 2 ? r / 2 : -1) : r - h->rem;
    h->U = units_per_rank ? h->P : h->Pp;
}

static int orig(const struct rhd *h, int nr) { return nr < h->rem ? 2 * nr + 1 : nr + h->rem; }

/* Units [*lo, *hi) that new rank nr holds after `levels` halving levels. */
static void unit_range(const struct rhd *h, int nr, int levels, int *lo, int *hi) {
    int a = 0, b = h->U;
    for (int k = 0; k < levels; k++) {
        int mid = a + (b - a) / 2;
        if (nr & (h->Pp >> (k + 1))) a = mid;
        else b = mid;
    }
    *lo = a, *hi = b;
}

/* The new rank whose leaf range holds unit u. */
static int leaf_of(const struct rhd *h, int u) {
    int a = 0, b = h->U, nr = 0;
    for (int k = 0; k < h->L; k++) {
        int mid = a + (b - a) / 2;
        if (u >= mid) nr |= h->Pp >> (k + 1), a = mid;
        else b = mid;
    }
    return nr;
}

/* Byte range of units [lo, hi). */
static void unit_bytes(const struct dp__coll *op, const struct rhd *h, int lo, int hi, size_t *off,
                       size_t *len) {
    size_t o1, n1, o2, n2;
    dp__block(op, h->U, lo, &o1, &n1);
    if (hi <= lo) {
        *off = o1, *len = 0;
        return;
    }
    dp__block(op, h->U, hi - 1, &o2, &n2);
    *off = o1, *len = o2 + n2 - o1;
}

/* Halving levels: marks base+k after level k.  Before level k, waits for the
 * partner's mark base+k-1 (for k = 0: `first`, its fold or arrival). */
static int halving(struct dp__coll *op, const struct rhd *h, unsigned first, unsigned base) {
    char *mine = op->d.buf;
    for (int k = 0; k < h->L; k++) {
        int po = orig(h, h->nr ^ (h->Pp >> (k + 1)));
        char *pb;
        int rc = dp__coll_peer(op, po, &pb);
        if (!rc) rc = dp__coll_wait(op, po, k ? base + (unsigned)k - 1 : first);
        if (rc) return rc;
        int lo, hi;
        size_t off, len;
        unit_range(h, h->nr, k + 1, &lo, &hi);
        unit_bytes(op, h, lo, hi, &off, &len);
        dp__reduce_add(mine + off, pb + off, (int64_t)(len / op->esize), op->d.dtype);
        dp__coll_mark(op, base + (unsigned)k);
    }
    return 0;
}

/* Doubling steps: marks base+k after step k; before step k waits for the
 * partner's mark base+k-1 (for k = 0: `first`). */
static int doubling(struct dp__coll *op, const struct rhd *h, unsigned first, unsigned base) {
    char *mine = op->d.buf;
    for (int k = 0; k < h->L; k++) {
        int pn = h->nr ^ (1 << k), po = orig(h, pn);
        char *pb;
        int rc = dp__coll_peer(op, po, &pb);
        if (!rc) rc = dp__coll_wait(op, po, k ? base + (unsigned)k - 1 : first);
        if (rc) return rc;
        int lo, hi;
        size_t off, len;
        unit_range(h, pn, h->L - k, &lo, &hi);
        unit_bytes(op, h, lo, hi, &off, &len);
        if (len) memcpy(mine + off, pb + off, len);
        dp__coll_mark(op, base + (unsigned)k);
    }
    return 0;
}

/* End rule for the pairwise levels: every partner has set `mark`. */
static int wait_partners(struct dp__coll *op, const struct rhd *h, unsigned mark) {
    for (int k = 0; k < h->L; k++) {
        int rc = dp__coll_wait(op, orig(h, h->nr ^ (1 << k)), mark);
        if (rc) return rc;
    }
    return 0;
}

/*
 * dp__allreduce_rhd
 *
 * Function:    all-reduce (sum), Rabenseifner: reduce-scatter by recursive
 *              halving, all-gather by recursive doubling, with the fold for
 *              P not a power of two
 * Inputs:      op: buffer (count elements), dtype; mark 1 set
 * Returns:     0, DP_ECANCELED or DP_EMISMATCH
 * Steps:       2·L, plus fold and unfold when P != P' (L = floor(log2 P))
 * Limitations: with a fold, the 2·rem paired ranks move a whole buffer twice
 *              and the even ones idle.  bf16 is rounded once per halving
 *              level, plus once at the fold.
 *
 * Protocol.  Marks: 1 arrived; 2 fold done (set at once by ranks without a
 * fold partner); 3+k after halving level k; 3+L+k after doubling step k;
 * 3+2L after the unfold (the last).
 *   fold (odd r < 2rem): wait (r-1):1; mine += buf_{r-1} (all of it).
 *   halving level k: partner p; wait p:2+k (p finished level k-1 or its fold);
 *       mine[keep] += p[keep] (keep = my half of our common range); mark 3+k.
 *       p never writes my keep half of its buffer again before I have read it:
 *       its later levels stay inside its own half, and it writes my half only
 *       at the doubling, after waiting for my marks.
 *   doubling step k: partner p; wait p:2+L+k (p finished step k-1, or its
 *       last level); mine[p's range] = p[p's range]; mark 3+L+k.
 *   unfold (odd r < 2rem): buf_{r-1} = mine (all); mark 3+2L.
 *   End: wait every partner's mark 2+2L (their last reads of my buffer).
 *   Even r < 2rem: set mark 1 only, and wait (r+1):3+2L.
 *
 * Example, 3 ranks (P' = 2, rem = 1), two units (halves) A | B:
 *
 *   step     rank 0 (folded)      rank 1 (new 0)           rank 2 (new 1)
 *   fold     arrive               all += x0                mark 2
 *   halve 0  .                    A += x2[A] -> S[A]       B += r1's B -> S[B]
 *   double 0 .                    B = r2's B               A = r1's A
 *   unfold   wait 1:5             buf_0 = mine (all)       .
 *
 * and 4 ranks (no fold), four units a b c d, partners 0-2, 1-3 then 0-1, 2-3:
 *
 *   halve 0  r0: ab += r2's ab   r1: ab += r3's   r2: cd += r0's   r3: cd += r1's
 *   halve 1  r0: a += r1's a     r1: b += r0's b  r2: c += r3's c  r3: d += r2's d
 *   double 0 r0: b = r1's b      r1: a = r0's a   r2: d = r3's d   r3: c = r2's c
 *   double 1 r0: cd = r2's cd    r1: cd = r3's    r2: ab = r0's    r3: ab = r1's
 */
int dp__allreduce_rhd(struct dp__coll *op) {
    if (op->nranks == 1 || op->d.count == 0) return 0;
    struct rhd h;
    rhd_setup(&h, op, 0);
    int r = op->rank;
    unsigned m_fold = 2, m_half = 3, m_double = 3 + (unsigned)h.L, m_last = 3 + 2 * (unsigned)h.L;
    if (h.nr < 0) return dp__coll_wait(op, r + 1, m_last);
    char *mine = op->d.buf, *even = NULL;
    size_t bytes = (size_t)op->d.count * op->esize;
    int rc = 0;
    if (r < 2 * h.rem) {
        rc = dp__coll_peer(op, r - 1, &even);
        if (rc) return rc;
        dp__reduce_add(mine, even, op->d.count, op->d.dtype);
    }
    dp__coll_mark(op, m_fold);
    rc = halving(op, &h, m_fold, m_half);
    if (!rc) rc = doubling(op, &h, m_double - 1, m_double);
    if (rc) return rc;
    if (even) memcpy(even, mine, bytes);
    dp__coll_mark(op, m_last);
    return wait_partners(op, &h, m_last - 1);
}

/*
 * dp__reduce_scatter_rhd
 *
 * Function:    reduce-scatter (sum) by recursive halving over the P blocks
 * Inputs:      op: buffer (count elements), dtype; mark 1 set
 * Returns:     0, DP_ECANCELED or DP_EMISMATCH
 * Steps:       L halving levels, plus the fold and a final copy when P != P'
 * Limitations: P != P': a leaf holds one or two blocks, so some new ranks
 *              reduce twice as much at the last level; the folded ranks idle.
 *
 * Protocol.  Units are the P blocks.  Marks: 1 arrived; 2 fold done; 3+k
 * after halving level k; 3+L after the final copy (the last).
 *   fold, halving: as in dp__allreduce_rhd.
 *   final copy (every rank, folded ones too): the holder h of block r is
 *       orig(leaf_of(r)); if h != r: wait h:2+L (h finished halving; that
 *       also orders every earlier read of my block r by the ranks whose
 *       partial sums flowed into h) and copy block r from h.  Mark 3+L.
 *   End: wait every partner's mark 2+L; for every block u != r in my leaf,
 *       wait u:3+L (rank u has copied it); a folded rank waits (r+1):2 (its
 *       buffer was read at the fold).
 *
 *   3 ranks (leaves: new 0 = rank 1 holds block 0; new 1 = rank 2 holds 1, 2):
 *   step     rank 0 (folded)     rank 1 (new 0)          rank 2 (new 1)
 *   fold     arrive              all += x0               mark 2
 *   halve 0  .                   [0] += r2's [0] = S[0]  [1,2] += r1's = S[1], S[2]
 *   copy     [0] = r1's S[0]     [1] = r2's S[1]         .
 */
int dp__reduce_scatter_rhd(struct dp__coll *op) {
    if (op->nranks == 1 || op->d.count == 0) return 0;
    struct rhd h;
    rhd_setup(&h, op, 1);
    int r = op->rank, rc = 0;
    unsigned m_fold = 2, m_half = 3, m_last = 3 + (unsigned)h.L;
    char *mine = op->d.buf;
    if (h.nr >= 0) {
        if (r < 2 * h.rem) {
            char *even;
            rc = dp__coll_peer(op, r - 1, &even);
            if (rc) return rc;
            dp__reduce_add(mine, even, op->d.count, op->d.dtype);
        }
        dp__coll_mark(op, m_fold);
        if ((rc = halving(op, &h, m_fold, m_half))) return rc;
    }
    int holder = orig(&h, leaf_of(&h, r));
    if (holder != r) {
        char *hb;
        rc = dp__coll_peer(op, holder, &hb);
        if (!rc) rc = dp__coll_wait(op, holder, m_last - 1);
        if (rc) return rc;
        size_t off, len;
        dp__block(op, h.P, r, &off, &len);
        if (len) memcpy(mine + off, hb + off, len);
    }
    dp__coll_mark(op, m_last);
    if (h.nr < 0) return dp__coll_wait(op, r + 1, m_fold);
    if ((rc = wait_partners(op, &h, m_last - 1))) return rc;
    int lo, hi;
    unit_range(&h, h.nr, h.L, &lo, &hi);
    for (int u = lo; u < hi && !rc; u++)
        if (u != r) rc = dp__coll_wait(op, u, m_last);
    return rc;
}

/*
 * dp__allgather_rhd
 *
 * Function:    all-gather by recursive doubling over the P blocks
 * Inputs:      op: buffer (count elements) with block r on rank r; mark 1 set
 * Returns:     0, DP_ECANCELED or DP_EMISMATCH
 * Steps:       L doubling steps, plus a gather into the leaves and the unfold
 *              when P != P'
 * Limitations: P != P': the folded ranks receive the whole buffer in one copy
 *              at the end.
 *
 * Protocol.  Units are the P blocks.  Marks: 1 arrived; 2 leaf gathered; 3+k
 * after doubling step k; 3+L after the unfold (the last).
 *   gather (participants): for each block u != r of my leaf, read block u
 *       from rank u (it arrived, mark 1) into mine.  Mark 2.
 *   doubling: as in dp__allreduce_rhd, waiting p:2 before step 0.
 *   unfold (odd r < 2rem): buf_{r-1} = mine; mark 3+L.
 *   End: wait every partner's 2+L; the holder h of my block (if h != r) must
 *       have gathered it: wait h:2.  Folded ranks wait (r+1):3+L and h:2.
 *
 *   3 ranks (leaves: rank 1 holds block 0, rank 2 holds blocks 1, 2):
 *   step      rank 0 (folded)     rank 1 (new 0)          rank 2 (new 1)
 *   gather    arrive              [0] = x0's [0]          [1] = x1's [1]
 *   double 0  .                   [1,2] = r2's [1,2]      [0] = r1's [0]
 *   unfold    wait 1:4            buf_0 = mine            .
 */
int dp__allgather_rhd(struct dp__coll *op) {
    if (op->nranks == 1 || op->d.count == 0) return 0;
    struct rhd h;
    rhd_setup(&h, op, 1);
    int r = op->rank, rc = 0;
    unsigned m_gather = 2, m_double = 3, m_last = 3 + (unsigned)h.L;
    char *mine = op->d.buf;
    int holder = orig(&h, leaf_of(&h, r));
    if (h.nr < 0) {
        rc = dp__coll_wait(op, r + 1, m_last);
        if (!rc) rc = dp__coll_wait(op, holder, m_gather);
        return rc;
    }
    int lo, hi;
    unit_range(&h, h.nr, h.L, &lo, &hi);
    for (int u = lo; u < hi; u++) {
        if (u == r) continue;
        char *ub;
        if ((rc = dp__coll_peer(op, u, &ub))) return rc;
        size_t off, len;
        dp__block(op, h.P, u, &off, &len);
        if (len) memcpy(mine + off, ub + off, len);
    }
    dp__coll_mark(op, m_gather);
    if ((rc = doubling(op, &h, m_gather, m_double))) return rc;
    if (r < 2 * h.rem) {
        char *even;
        if ((rc = dp__coll_peer(op, r - 1, &even))) return rc;
        memcpy(even, mine, (size_t)op->d.count * op->esize);
    }
    dp__coll_mark(op, m_last);
    rc = wait_partners(op, &h, m_last - 1);
    if (!rc && holder != r) rc = dp__coll_wait(op, holder, m_gather);
    return rc;
}

/*
 * dp__broadcast_rhd
 *
 * Function:    broadcast along a binomial tree (recursive doubling of the set
 *              of ranks that hold the data)
 * Inputs:      op: buffer (count elements), root; mark 1 set
 * Returns:     0, DP_ECANCELED or DP_EMISMATCH
 * Steps:       ceil(log2 P) rounds of whole-buffer copies
 * Limitations: not pipelined: each round copies the whole buffer, so large
 *              messages take log2(P)·n/β (the ring chain takes about n/β).
 *
 * Protocol.  v = (r - root) mod P.  The parent of v > 0 is v with its highest
 * set bit cleared; its children are v + 2^k for every 2^k > v (v + 2^k < P).
 * The root sets mark 2 at once; rank v > 0 waits parent:2, copies the whole
 * buffer from the parent, sets mark 2.  End: wait for every child's mark 2.
 *
 *   4 ranks, root 0:  round 0: 1 <- 0;  round 1: 2 <- 0, 3 <- 1
 */
int dp__broadcast_rhd(struct dp__coll *op) {
    int P = op->nranks, r = op->rank;
    if (P == 1 || op->d.count == 0) return 0;
    int v = (r - op->d.root + P) % P, rc = 0;
    if (v == 0) {
        dp__coll_mark(op, 2);
    } else {
        int top = 1;
        while (top * 2 <= v) top *= 2;
        int parent = (v - top + op->d.root) % P;
        char *pb;
        rc = dp__coll_peer(op, parent, &pb);
        if (!rc) rc = dp__coll_wait(op, parent, 2);
        if (rc) return rc;
        memcpy(op->d.buf, pb, (size_t)op->d.count * op->esize);
        dp__coll_mark(op, 2);
    }
    int k = 1;
    while (k <= v) k *= 2; /* the smallest power of two above v */
    for (; v + k < P && !rc; k *= 2) rc = dp__coll_wait(op, (v + k + op->d.root) % P, 2);
    return rc;
}
