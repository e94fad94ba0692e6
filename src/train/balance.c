/* Heterogeneity-aware batches (--balance): every K steps the global batch is
 * re-split in proportion to each rank's measured throughput. */
#include "trainer.h"

/* ---- heterogeneity-aware batches (--balance) ------------------------------------------------
 * Each rank measures its throughput: samples over compute seconds (forward
 * + backward, plus its simulated slowness; not the data wait nor its waits
 * in collectives, the reduction's and SyncBatchNorm's, which measure the
 * others), and its fixed part: the update's seconds per step, the same work
 * whatever its share (not with ZeRO, whose update waits in its gather).
 * Every `balance` steps the ranks all-gather (samples, seconds, update
 * seconds per step) since the last re-plan, one G x 3 doubles collective at
 * those steps only, and every rank updates the same EMAs and computes the
 * same plan from the same gathered numbers:
 *
 *   rate_r = round(1024 n_r / s_r)          (integer, clamped to 1..2^30)
 *   fix_r  = round(1e6 a_r)                 (µs, clamped to 1..2^23)
 *   ema    = the first value, else (ema + value) / 2  (integers, each)
 *   share  = dp_balance_plan(ema_rate, ema_rate ema_fix / (1e6 align), G, U)
 *                                           U = ceil(batch / align) units
 *
 * so that a_r + n_r / s_r, each rank's step, is the same for all (a core
 * that is slower at the memory-bound update as well as at compute, as one
 * of the 2-core VM's often is, gets fewer samples for both reasons).
 * From the gathered doubles on, everything is integer arithmetic, so no
 * rank (nor a rank built by another compiler) can round differently.  A
 * rank with an empty share measures nothing and keeps its EMA.  The plan is
 * adopted only when some rank's share moves by max(1, U / 32) units or more:
 * each change discards the prefetched batches and gives the GEMMs new
 * shapes, not worth it for a sample or two of noise.  The split itself is
 * dp_loader_split; the gradient does not depend on it (docs/ddp.md). */
#define BAL_RATE_MAX ((int64_t)1 << 30)
#define BAL_FIX_MAX ((int64_t)1 << 40) /* 1/1024 units */

/* Rank r's plan with fixed parts.  Its step lasts a_r + n_r / v_r (a_r: the
 * update, the same work whatever its share; v_r: its units per second), and
 * the shares that end every rank's step together are n_r = v_r (T - a_r)
 * with sum n_r = U.  In units: f_r = v_r a_r (what r could have computed
 * during its fixed part) and n_r = (U + sum f) v_r / sum v - f_r.  With the
 * one unit each reserved first (min), the free units are apportioned that
 * way; a rank whose n_r would fall below 0 (its fixed part alone outlasts
 * the others' steps) keeps min and leaves the sum (water-filling).  Exact
 * fractions: n_r = num_r / (Q 1024), num_r = (free 1024 + F) q_r - f_r Q,
 * f in 1/1024 units; |num_r| < 2^127. */
typedef __int128 bal_wide; /* gcc and clang */
static bal_wide bal_num(int64_t free, int64_t F, int64_t Q, int64_t q, int64_t f) {
    return ((bal_wide)free * 1024 + F) * q - (bal_wide)f * Q;
}

void dp_balance_plan(const int64_t *rate, const int64_t *fixed, int world, int64_t units, int64_t *share) {
    int64_t known = 0, sum = 0;
    for (int r = 0; r < world; r++)
        if (rate[r] > 0) known++, sum += rate[r] < BAL_RATE_MAX ? rate[r] : BAL_RATE_MAX;
    int64_t fill = known ? sum / known : 1; /* an unmeasured rank counts as the mean */
    if (fill < 1) fill = 1;
#define BAL_Q(r) (rate[r] > 0 ? (rate[r] < BAL_RATE_MAX ? rate[r] : BAL_RATE_MAX) : fill)
#define BAL_F(r) (fixed && fixed[r] > 0 ? (fixed[r] < BAL_FIX_MAX ? fixed[r] : BAL_FIX_MAX) : 0)
    /* One unit each first (when there are enough): a rank with no work
     * measures nothing, so the plan could never see it speed up again. */
    int64_t min = units >= world ? 1 : 0, free = units - min * world, Q, F;
    /* share[r] = -1: out of the apportioning (keeps min) */
    for (int r = 0; r < world; r++) share[r] = 0;
    for (int changed = 1; changed;) {
        changed = 0, Q = 0, F = 0;
        for (int r = 0; r < world; r++)
            if (share[r] == 0) Q += BAL_Q(r), F += BAL_F(r);
        for (int r = 0; r < world; r++)
            if (share[r] == 0 && bal_num(free, F, Q, BAL_Q(r), BAL_F(r)) < 0) share[r] = -1, changed = 1;
    }
    /* Largest remainders: floor(n_r) each, then one more unit to the ranks
     * with the largest remainders (ties: the lower rank).  Without fixed
     * parts this is floor(free q_r / Q) and the remainders of free q_r / Q. */
    const int64_t den = Q * 1024;
    int64_t given = 0;
    for (int r = 0; r < world; r++) {
        int64_t n = share[r] < 0 ? 0 : (int64_t)(bal_num(free, F, Q, BAL_Q(r), BAL_F(r)) / den);
        share[r] = min + n;
        given += n;
    }
    for (int64_t left = free - given; left > 0; left--) {
        int best = -1;
        bal_wide best_rem = -1;
        for (int r = 0; r < world; r++) {
            bal_wide num = bal_num(free, F, Q, BAL_Q(r), BAL_F(r));
            /* out of the apportioning, or already given its extra unit */
            if (num < 0 || share[r] > min + (int64_t)(num / den)) continue;
            if (num % den > best_rem) best = r, best_rem = num % den;
        }
        share[best]++;
    }
#undef BAL_Q
#undef BAL_F
}

/* The re-plan, on every rank after the same steps (see above). */
int dp__rebalance(struct worker *w) {
    struct dp_trainer *t = w->t;
    int G = t->G;
    memset(w->bal_buf, 0, 3 * sizeof(double) * (size_t)G);
    double *mine = w->bal_buf + 3 * w->grank;
    mine[0] = w->bal_n, mine[1] = w->bal_s, mine[2] = w->bal_k > 0 ? w->bal_a / (double)w->bal_k : 0;
    w->bal_n = w->bal_s = w->bal_a = 0, w->bal_k = 0;
    int rc = dp_comm_allgather(w->comm, w->bal_buf, 3 * G, DP_DTYPE_F64, DP_ALGO_AUTO);
    if (rc) return rc;
    for (int r = 0; r < G; r++) {
        double n = w->bal_buf[3 * r], sec = w->bal_buf[3 * r + 1], fix = w->bal_buf[3 * r + 2];
        if (fix > 0) { /* the update's µs per step, within 1 µs .. 2^23 µs */
            double us = fix * 1e6;
            int64_t f = !(us < (double)(1 << 23)) ? 1 << 23 : us < 1 ? 1 : (int64_t)llround(us);
            w->bal_fix[r] = w->bal_fix[r] > 0 ? (w->bal_fix[r] + f) / 2 : f;
        }
        if (!(n > 0 && sec > 0)) continue;
        double x = n * 1024.0 / sec;
        int64_t rate = !(x < (double)BAL_RATE_MAX) ? BAL_RATE_MAX : x < 1 ? 1 : (int64_t)llround(x);
        w->bal_rate[r] = w->bal_rate[r] > 0 ? (w->bal_rate[r] + rate) / 2 : rate;
    }
    int64_t a = t->bal_align, U = (t->p.run.batch + a - 1) / a, move = 0;
    /* the fixed parts in 1/1024 units: rate (1024 samples/s) x µs / 1e6 / align
     * (< 2^53: rate <= 2^30, µs <= 2^23); a rank not measured yet has none */
    for (int r = 0; r < G; r++)
        w->bal_fixu[r] = w->bal_rate[r] > 0 ? w->bal_rate[r] * w->bal_fix[r] / (1000000 * a) : 0;
    dp_balance_plan(w->bal_rate, w->bal_fixu, G, U, w->bal_new);
    for (int r = 0; r < G; r++) {
        int64_t cur = w->bal_share ? w->bal_share[r] : U / G + (r < U % G); /* NULL: the equal split */
        int64_t d = w->bal_new[r] - cur;
        if (d < 0) d = -d;
        if (d > move) move = d;
    }
    if (move < (U / 32 > 1 ? U / 32 : 1)) return DP_OK;
    if (!w->bal_share && !(w->bal_share = dp_malloc(sizeof(int64_t) * (size_t)G)))
        return dp_seterr(DP_ENOMEM, "trainer: out of memory");
    memcpy(w->bal_share, w->bal_new, sizeof(int64_t) * (size_t)G);
    return dp_loader_set_shares(w->loader, w->bal_share);
}
