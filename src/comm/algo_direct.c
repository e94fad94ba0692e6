/*
 * Direct shared-memory collectives: every rank reads (and, for all-reduce,
 * writes) its peers' buffers itself, in one pass, between two
 * synchronisations.  Vocabulary and marks: see comm_impl.h.
 *
 * Why this is the default on one machine: an in-place all-reduce must read
 * every rank's input once (P·n bytes) and write the result into every rank's
 * buffer once (P·n bytes).  The direct all-reduce moves exactly that: rank r
 * reads block r of all P buffers and writes the sum back into all P buffers,
 * so each rank reads n and writes n bytes, where ring and rhd move about
 * 2.5 times as much.  The price is that each rank waits for all P ranks twice.
 */
#include <string.h>

#include "comm_impl.h"

/* Gets every peer's buffer into op->peer_buf (waits for all to arrive). */
static int all_peers(struct dp__coll *op) {
    for (int k = 1; k < op->nranks; k++) {
        char *b;
        int rc = dp__coll_peer(op, (op->rank + k) % op->nranks, &b);
        if (rc) return rc;
    }
    return 0;
}

/*
 * dp__allreduce_direct
 *
 * Function:    all-reduce (sum): the ranks share the reduction chunk by chunk,
 *              each chunk summed from all P buffers and stored into all P
 * Inputs:      op: this rank's buffer (count elements), dtype; mark 1 set
 * Returns:     0, DP_ECANCELED (abort, timeout) or DP_EMISMATCH
 * Steps:       1 pass over the data; 2 synchronisations (all arrived, all done)
 * Limitations: shared memory only.  Each synchronisation waits for all P
 *              ranks: O(P) per rank, so for many ranks and small messages rhd
 *              is cheaper (see dp_comm_choose_algo).
 *
 * Vocabulary: the buffer is cut into C chunks (dp_comm_split(count, C, c)),
 * C = max(P, bytes / 512 KiB), at most count.  Measured on the 2-core VM
 * (64 MiB, 2 ranks, kernel alone): halves 30.5 GB/s busbw, 1 MiB chunks 29.6,
 * 64 KiB chunks 23.9 (each switch of chunk restarts the hardware prefetch
 * streams); 512 KiB is ~20 µs of work per chunk, fine enough to rebalance.
 *
 * Protocol.  Mark 1: arrived (buffer published).  Every rank waits until all
 * ranks have arrived, then claims chunks from a shared counter
 * (dp__coll_claim) until none is left; for a chunk it computes s = buf_0 +
 * buf_1 + ... + buf_{P-1} (in rank order, fp32 for bf16) and stores s into
 * that chunk of every buffer, its own included.  It sets mark 2 and waits for
 * mark 2 of all ranks (the end rule: nobody reads or writes its buffer any
 * more).  A chunk of any buffer is touched by its claimer alone, so the pass
 * needs no other ordering.  bf16 is rounded once.  With a post hook
 * (dp_comm_iallreduce_post) the claimer hands each chunk to it after the
 * stores and before its mark 2, so every hook has run when any rank returns.
 *
 * Compared with "rank r reduces block r into its own buffer, then every rank
 * copies every block" this writes each result once where it is needed:
 * per rank n bytes read and n written instead of (2P-1)/P·n read, so for P = 2
 * 4n bytes of memory traffic in all instead of 5n.  Claiming chunks instead of
 * owning block r keeps both cores busy when one rank arrives late or loses its
 * CPU for a while; the result does not depend on who reduced a chunk.
 *
 * Example, 3 ranks, count 6, C = 3 chunks of 2; x_r = rank r's input:
 *
 *   step        rank 0                  rank 1                  rank 2
 *   arrive      mark 1, wait all 1      mark 1, wait all 1      mark 1, wait all 1
 *   claim       chunk 0: [0,2)          chunk 1: [2,4)          chunk 2: [4,6)
 *   reduce      s = x0+x1+x2 on [0,2)   s = x0+x1+x2 on [2,4)   s = x0+x1+x2 on [4,6)
 *               -> [0,2) of all 3 bufs  -> [2,4) of all 3 bufs  -> [4,6) of all 3 bufs
 *   claim       none left               none left               none left
 *   finish      mark 2, wait all 2      mark 2, wait all 2      mark 2, wait all 2
 *   result      every buffer = x0+x1+x2
 * (a rank that is faster may claim two chunks and another none).
 */
int dp__allreduce_direct(struct dp__coll *op) {
    int P = op->nranks;
    if (op->d.count == 0) return 0;
    if (P == 1) {
        if (op->d.post) op->d.post(op->d.post_arg, 0, op->d.count);
        return 0;
    }
    int rc = all_peers(op);
    if (rc) return rc;
    int64_t C = (int64_t)((size_t)op->d.count * op->esize >> 19);
    if (C < P) C = P;
    if (C > op->d.count) C = op->d.count;
    if (C > (1 << 20)) C = 1 << 20;
    for (int64_t c; (c = dp__coll_claim(op, C)) >= 0;) {
        int64_t o, n;
        dp_comm_split(op->d.count, (int)C, (int)c, &o, &n);
        dp__reduce_sum_to(op->peer_buf, P, op->peer_buf, P, (size_t)o * op->esize, n, op->d.dtype);
        if (op->d.post) op->d.post(op->d.post_arg, o, n); /* before mark 2: done before anyone returns */
    }
    dp__coll_mark(op, 2);
    return dp__coll_wait_all(op, 2);
}

/*
 * dp__reduce_scatter_direct
 *
 * Function:    reduce-scatter (sum): rank r gets the sum of block r
 * Inputs:      op: buffer (count elements), dtype; mark 1 set
 * Returns:     0, DP_ECANCELED or DP_EMISMATCH
 * Steps:       1 pass; 2 synchronisations (all arrived, all done)
 * Limitations: shared memory only; O(P) waits per rank.
 *
 * Protocol.  As dp__allreduce_direct, but rank r stores the sum of block r
 * into its own buffer only; the other blocks of its buffer stay as they were.
 * Mark 2 = "finished reading my peers' block r"; each rank waits for all
 * marks 2 before returning, because its buffer is read until then.
 *
 *   3 ranks:    rank 0                  rank 1                  rank 2
 *   reduce      [0,2) = x0+x1+x2        [2,4) = x0+x1+x2        [4,6) = x0+x1+x2
 *               (own buffer)            (own buffer)            (own buffer)
 */
int dp__reduce_scatter_direct(struct dp__coll *op) {
    int P = op->nranks, r = op->rank;
    if (P == 1 || op->d.count == 0) return 0;
    int rc = all_peers(op);
    if (rc) return rc;
    size_t off, len;
    dp__block(op, P, r, &off, &len);
    dp__reduce_sum_to(&op->peer_buf[r], 1, op->peer_buf, P, off, (int64_t)(len / op->esize),
                      op->d.dtype);
    dp__coll_mark(op, 2);
    return dp__coll_wait_all(op, 2);
}

/*
 * dp__allgather_direct
 *
 * Function:    all-gather: every rank copies every other rank's block
 * Inputs:      op: buffer (count elements) holding block r on rank r; mark 1 set
 * Returns:     0, DP_ECANCELED or DP_EMISMATCH
 * Steps:       P-1 copies in 1 phase; 2 synchronisations
 * Limitations: shared memory only; O(P) waits per rank.
 *
 * Protocol.  After all marks 1, rank r copies block j of rank j's buffer into
 * block j of its own, for every j != r (j = r+1, r+2, ... so ranks start on
 * different sources).  Rank j's block j is only read, never written, by the
 * others; block j of rank r's buffer is written only by rank r.  Mark 2 =
 * "finished reading"; wait for all marks 2 before returning.
 *
 *   3 ranks:    rank 0                  rank 1                  rank 2
 *   copy        [2,4) <- rank 1         [4,6) <- rank 2         [0,2) <- rank 0
 *               [4,6) <- rank 2         [0,2) <- rank 0         [2,4) <- rank 1
 */
int dp__allgather_direct(struct dp__coll *op) {
    int P = op->nranks, r = op->rank;
    if (P == 1 || op->d.count == 0) return 0;
    int rc = all_peers(op);
    if (rc) return rc;
    char *mine = op->d.buf;
    for (int k = 1; k < P; k++) {
        int j = (r + k) % P;
        size_t off, len;
        dp__block(op, P, j, &off, &len);
        if (len) memcpy(mine + off, op->peer_buf[j] + off, len);
    }
    dp__coll_mark(op, 2);
    return dp__coll_wait_all(op, 2);
}

/*
 * dp__broadcast_direct
 *
 * Function:    broadcast: every rank copies the root's buffer
 * Inputs:      op: buffer (count elements), root; mark 1 set
 * Returns:     0, DP_ECANCELED or DP_EMISMATCH
 * Steps:       1 copy per non-root rank; the root waits for all of them
 * Limitations: shared memory only; P-1 ranks read the root's memory at once.
 *
 * Protocol.  A non-root rank waits for the root's mark 1, copies its whole
 * buffer, sets mark 2 and returns.  The root waits for every mark 2.
 *
 *   3 ranks, root 0:  rank 0                 rank 1               rank 2
 *                     mark 1                 wait 0:1, copy       wait 0:1, copy
 *                     wait 1:2, 2:2          mark 2               mark 2
 */
int dp__broadcast_direct(struct dp__coll *op) {
    int P = op->nranks, r = op->rank, root = op->d.root;
    if (P == 1 || op->d.count == 0) return 0;
    if (r == root) return dp__coll_wait_all(op, 2);
    char *src;
    int rc = dp__coll_peer(op, root, &src);
    if (rc) return rc;
    memcpy(op->d.buf, src, (size_t)op->d.count * op->esize);
    dp__coll_mark(op, 2);
    return 0;
}

/*
 * dp__barrier_direct
 *
 * Function:    barrier
 * Inputs:      op; mark 1 set
 * Returns:     0 or DP_ECANCELED
 * Steps:       1: wait for mark 1 of every rank
 * Limitations: O(P) waits per rank (a central counter would be the same here).
 *
 *   3 ranks:   each rank sets mark 1 and waits for marks 1 of the two others.
 */
int dp__barrier_direct(struct dp__coll *op) {
    if (op->nranks == 1) return 0;
    return dp__coll_wait_all(op, DP__MARK_ARRIVED);
}
