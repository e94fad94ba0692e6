/*
 * Ring collectives over shared memory.  Vocabulary and marks: see comm_impl.h.
 *
 * The buffer is cut into P blocks (dp_comm_split).  In every step each rank
 * works on one block and reads only from its left neighbour l = r-1: what a
 * network ring sends to the right, the right neighbour here reads in place
 * from the left neighbour's buffer once the left has set the mark of the step
 * that produced it.  Each rank moves 2(P-1)/P·n bytes "over the link", the
 * bandwidth-optimal figure of docs/architecture.md §4; here that is the cost model of a
 * message-passing ring, kept so that it can be compared and tested.
 *
 * Block indices are taken mod P: at reduce-scatter step s (0..P-2) rank r
 * adds the left's partial of block (r-2-s) into its own, so after the last
 * step rank r holds the full sum of block r (the owner convention of
 * reduce-scatter); at all-gather step t (0..P-2) it copies block (r-1-t) from
 * the left, which holds it final.
 */
#include <string.h>

#include "comm_impl.h"

static int mod(int a, int p) { return ((a % p) + p) % p; }

/* Reduce-scatter steps, marks 2 .. P (mark 2+s after step s).
 *   step s: wait l:1+s (the left finished step s-1, or arrived), then
 *           mine[b] += left[b] with b = r-2-s.
 * The left's block b is final for this step: the left wrote it at its step
 * s-1 and writes block l-2-s' at later steps s' (never b again here). */
static int ring_rs_steps(struct dp__coll *op, const char *left) {
    int P = op->nranks, r = op->rank, l = mod(r - 1, P);
    char *mine = op->d.buf;
    for (int s = 0; s < P - 1; s++) {
        int rc = s ? dp__coll_wait(op, l, 1 + (unsigned)s) : 0;
        if (rc) return rc;
        size_t off, len;
        dp__block(op, P, mod(r - 2 - s, P), &off, &len);
        dp__reduce_add(mine + off, left + off, (int64_t)(len / op->esize), op->d.dtype);
        dp__coll_mark(op, 2 + (unsigned)s);
    }
    return 0;
}

/*
 * dp__allreduce_ring
 *
 * Function:    all-reduce (sum): ring reduce-scatter, then ring all-gather
 * Inputs:      op: buffer (count elements), dtype; mark 1 set
 * Returns:     0, DP_ECANCELED or DP_EMISMATCH
 * Steps:       2(P-1), each dependent on the left neighbour's previous step
 * Limitations: latency grows with P; in shared memory it moves about 2.5×
 *              the bytes of dp__allreduce_direct.  bf16 is rounded once per
 *              reduce-scatter step: P-1 times on the way of each block.
 *
 * Protocol.  Marks: 1 arrived; 2+s after reduce-scatter step s; P+1+t after
 * all-gather step t; 2P-1 is the last.
 *   RS step s (0..P-2): wait l:1+s; mine[r-2-s] += left[r-2-s]; mark 2+s.
 *   AG step t (0..P-2): wait l:P+t (the left holds block r-1-t final: its own
 *       block after its RS, or copied at its AG step t-1), and wait rr:2+t
 *       (the right has finished its RS step t, the last read of block r-1-t of
 *       my buffer: a write-after-read guard); mine[r-1-t] = left[r-1-t];
 *       mark P+1+t.
 *   End: wait rr:2P-1 (the right has read everything it needs from me).
 *
 * Example, 3 ranks; block b of rank r's input is x_r[b]; S[b] = sum over r.
 *
 *   step   rank 0                  rank 1                  rank 2
 *   RS 0   [1] += x2[1]            [2] += x0[2]            [0] += x1[0]
 *   RS 1   [0] += r2's [0]         [1] += r0's [1]         [2] += r1's [2]
 *          = S[0]                  = S[1]                  = S[2]
 *   AG 0   [2] = r2's [2] = S[2]   [0] = S[0]              [1] = S[1]
 *   AG 1   [1] = r2's [1] = S[1]   [2] = S[2]              [0] = S[0]
 */
int dp__allreduce_ring(struct dp__coll *op) {
    int P = op->nranks, r = op->rank;
    if (P == 1 || op->d.count == 0) return 0;
    int l = mod(r - 1, P), rr = mod(r + 1, P);
    char *left, *mine = op->d.buf;
    int rc = dp__coll_peer(op, l, &left);
    if (!rc) rc = ring_rs_steps(op, left);
    for (int t = 0; !rc && t < P - 1; t++) {
        rc = dp__coll_wait(op, l, (unsigned)(P + t));
        if (!rc) rc = dp__coll_wait(op, rr, 2 + (unsigned)t);
        if (rc) break;
        size_t off, len;
        dp__block(op, P, mod(r - 1 - t, P), &off, &len);
        if (len) memcpy(mine + off, left + off, len);
        dp__coll_mark(op, (unsigned)(P + 1 + t));
    }
    if (!rc) rc = dp__coll_wait(op, rr, (unsigned)(2 * P - 1));
    return rc;
}

/*
 * dp__reduce_scatter_ring
 *
 * Function:    reduce-scatter (sum): the first half of dp__allreduce_ring
 * Inputs:      op: buffer (count elements), dtype; mark 1 set
 * Returns:     0, DP_ECANCELED or DP_EMISMATCH
 * Steps:       P-1
 * Limitations: the blocks other than block r are left holding partial sums.
 *
 * Protocol.  RS steps as in dp__allreduce_ring (marks 2..P); end: wait rr:P
 * (the right's last read of my buffer is at its step P-2).
 *
 *   4 ranks    rank 0        rank 1        rank 2        rank 3
 *   RS 0       [2] += x3     [3] += x0     [0] += x1     [1] += x2
 *   RS 1       [1] += r3's   [2] += r0's   [3] += r1's   [0] += r2's
 *   RS 2       [0] = S[0]    [1] = S[1]    [2] = S[2]    [3] = S[3]
 */
int dp__reduce_scatter_ring(struct dp__coll *op) {
    int P = op->nranks, r = op->rank;
    if (P == 1 || op->d.count == 0) return 0;
    char *left;
    int rc = dp__coll_peer(op, mod(r - 1, P), &left);
    if (!rc) rc = ring_rs_steps(op, left);
    if (!rc) rc = dp__coll_wait(op, mod(r + 1, P), (unsigned)P);
    return rc;
}

/*
 * dp__allgather_ring
 *
 * Function:    all-gather: the second half of dp__allreduce_ring
 * Inputs:      op: buffer (count elements) with block r on rank r; mark 1 set
 * Returns:     0, DP_ECANCELED or DP_EMISMATCH
 * Steps:       P-1
 * Limitations: latency grows with P.
 *
 * Protocol.  Marks: 1 arrived; 2+t after step t.
 *   step t (0..P-2): wait l:1+t (the left holds block r-1-t: its own at t=0,
 *       else copied at its step t-1); mine[r-1-t] = left[r-1-t]; mark 2+t.
 *   No write-after-read guard is needed: the right reads block r-1-t of my
 *   buffer at its step t+1, after I wrote it.  End: wait rr:P.
 *
 *   3 ranks    rank 0             rank 1             rank 2
 *   step 0     [2] <- rank 2      [0] <- rank 0      [1] <- rank 1
 *   step 1     [1] <- rank 2      [2] <- rank 0      [0] <- rank 1
 */
int dp__allgather_ring(struct dp__coll *op) {
    int P = op->nranks, r = op->rank;
    if (P == 1 || op->d.count == 0) return 0;
    int l = mod(r - 1, P);
    char *left, *mine = op->d.buf;
    int rc = dp__coll_peer(op, l, &left);
    for (int t = 0; !rc && t < P - 1; t++) {
        if (t && (rc = dp__coll_wait(op, l, 1 + (unsigned)t))) break;
        size_t off, len;
        dp__block(op, P, mod(r - 1 - t, P), &off, &len);
        if (len) memcpy(mine + off, left + off, len);
        dp__coll_mark(op, 2 + (unsigned)t);
    }
    if (!rc) rc = dp__coll_wait(op, mod(r + 1, P), (unsigned)P);
    return rc;
}

/*
 * dp__broadcast_ring
 *
 * Function:    broadcast along a pipelined chain root -> root+1 -> ... -> root-1
 * Inputs:      op: buffer (count elements), root; mark 1 set
 * Returns:     0, DP_ECANCELED or DP_EMISMATCH
 * Steps:       C + P - 2 chunk times for C chunks (C = bytes / 256 KiB, 1..4096):
 *              every rank copies chunk c while its successor copies chunk c-1
 * Limitations: P-1 hops of latency for a small message.
 *
 * Protocol.  v = (r - root) mod P is the position in the chain.  The root sets
 * mark 1+C at once (all its chunks are ready).  Rank v > 0, for each chunk c:
 * wait (v-1):2+c, copy chunk c from rank v-1's buffer, mark 2+c.  End: a rank
 * with a successor waits for the successor's mark 1+C.  Chunks are the blocks
 * of dp_comm_split(count, C, c).
 *
 *   root 0, 3 ranks, 3 chunks:
 *   time   rank 0        rank 1           rank 2
 *   0      mark 4        copy c0 <- 0
 *   1                    copy c1 <- 0     copy c0 <- 1
 *   2                    copy c2 <- 0     copy c1 <- 1
 *   3      wait 1:4                       copy c2 <- 1
 */
int dp__broadcast_ring(struct dp__coll *op) {
    int P = op->nranks, r = op->rank;
    if (P == 1 || op->d.count == 0) return 0;
    int v = mod(r - op->d.root, P);
    size_t bytes = (size_t)op->d.count * op->esize;
    int64_t C = (int64_t)(bytes >> 18) + 1;
    if (C > 4096) C = 4096;
    if (C > op->d.count) C = op->d.count;
    unsigned last = 1 + (unsigned)C;
    int rc = 0;
    if (v == 0) {
        dp__coll_mark(op, last);
    } else {
        int prev = mod(r - 1, P);
        char *src, *mine = op->d.buf;
        rc = dp__coll_peer(op, prev, &src);
        for (int64_t c = 0; !rc && c < C; c++) {
            if ((rc = dp__coll_wait(op, prev, 2 + (unsigned)c))) break;
            int64_t o, n;
            dp_comm_split(op->d.count, (int)C, (int)c, &o, &n);
            size_t ob = (size_t)o * op->esize;
            memcpy(mine + ob, src + ob, (size_t)n * op->esize);
            dp__coll_mark(op, 2 + (unsigned)c);
        }
    }
    if (!rc && v < P - 1) rc = dp__coll_wait(op, mod(r + 1, P), last);
    return rc;
}
