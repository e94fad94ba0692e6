/* The thread backend's world: its slots and ranks, created and freed (the flat world, and
 * the hierarchical one of processes x threads). */
#include "comm_thread_impl.h"

/* ---- world and rank lifetime ---------------------------------------------------------------- */

int dp_comm_thread_world_init(struct dp_comm_world **wp, int nranks,
                              const struct dp_comm_params *params) {
    if (!wp) return dp_seterr(DP_EINVAL, "comm: NULL world pointer");
    *wp = NULL;
    if (nranks < 1 || nranks > MAX_RANKS)
        return dp_seterr(DP_EINVAL, "comm: %d ranks (1..%d)", nranks, MAX_RANKS);
    struct dp_comm_params p = params ? *params : dp_comm_default_params();
    if (!(p.timeout_s >= 0)) return dp_seterr(DP_EINVAL, "comm: timeout_s %g < 0", p.timeout_s);
    struct dp_comm_world *w = dp_calloc(1, sizeof *w);
    if (!w) return dp_seterr(DP_ENOMEM, "comm: out of memory for the world");
    w->slots = dp_calloc((size_t)nranks, sizeof *w->slots);
    if (!w->slots) {
        dp_free(w);
        return dp_seterr(DP_ENOMEM, "comm: out of memory for %d ranks", nranks);
    }
    w->nranks = nranks;
    w->nprocs = 1;
    w->params = p;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int spin_us = p.spin_us >= 0 ? p.spin_us : (ncpu > 0 && nranks <= ncpu ? 10 : 1);
    w->spin_s = 1e-6 * spin_us;
    /* caller progress, auto spin, a CPU per rank: the ranks' threads are
     * the only ones meant to run on these cores ("Waiting") */
    w->long_spin = p.spin_us < 0 && p.progress == DP_PROGRESS_CALLER && nranks <= dp_cpus_allowed();
    atomic_init(&w->aborted, 0);
    atomic_init(&w->claim, 0);
    pthread_mutex_init(&w->mu, NULL);
    int r = 0;
    for (; r < nranks; r++) {
        struct slot *s = &w->slots[r];
        atomic_init(&s->prog, 0);
        atomic_init(&s->nwait, 0);
        pthread_mutex_init(&s->mu, NULL);
        pthread_mutex_init(&s->mb_mu, NULL);
        if (dp_cond_init_monotonic(&s->cv)) {
            pthread_mutex_destroy(&s->mu);
            pthread_mutex_destroy(&s->mb_mu);
            break;
        }
        if (dp_cond_init_monotonic(&s->mb_cv)) {
            pthread_mutex_destroy(&s->mu);
            pthread_mutex_destroy(&s->mb_mu);
            pthread_cond_destroy(&s->cv);
            break;
        }
    }
    if (r < nranks) {
        while (r-- > 0) {
            pthread_mutex_destroy(&w->slots[r].mu);
            pthread_cond_destroy(&w->slots[r].cv);
            pthread_mutex_destroy(&w->slots[r].mb_mu);
            pthread_cond_destroy(&w->slots[r].mb_cv);
        }
        pthread_mutex_destroy(&w->mu);
        dp_free(w->slots);
        dp_free(w);
        return dp_seterr(DP_EINTERNAL, "comm: pthread_cond_init failed");
    }
    *wp = w;
    return 0;
}

void dp_comm_thread_world_free(struct dp_comm_world *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    int nlive = w->nlive;
    pthread_mutex_unlock(&w->mu);
    DP_ASSERT(nlive == 0 && "every rank must free its communicator first");
    for (int r = 0; r < w->nranks; r++) {
        pthread_mutex_destroy(&w->slots[r].mu);
        pthread_cond_destroy(&w->slots[r].cv);
        /* messages sent and never received */
        for (struct envelope *e = w->slots[r].mb_head, *nx; e; e = nx) nx = e->next, dp_free(e);
        pthread_mutex_destroy(&w->slots[r].mb_mu);
        pthread_cond_destroy(&w->slots[r].mb_cv);
    }
    pthread_mutex_destroy(&w->mu);
    dp_free(w->slots);
    dp_free(w);
}

int dp_comm_thread_init(struct dp_comm **cp, struct dp_comm_world *w, int rank) {
    if (!cp) return dp_seterr(DP_EINVAL, "comm: NULL communicator pointer");
    *cp = NULL;
    if (!w) return dp_seterr(DP_EINVAL, "comm: NULL world");
    if (rank < 0 || rank >= w->nranks)
        return dp_seterr(DP_EINVAL, "comm: rank %d out of range 0..%d", rank, w->nranks - 1);
    struct thread_comm *tc = dp_calloc(1, sizeof *tc);
    char **peer_buf = dp_calloc((size_t)w->nranks, sizeof *peer_buf);
    if (!tc || !peer_buf) {
        dp_free(tc), dp_free(peer_buf);
        return dp_seterr(DP_ENOMEM, "comm: rank %d: out of memory", rank);
    }
    pthread_mutex_lock(&w->mu);
    int taken = w->slots[rank].present;
    if (!taken) w->slots[rank].present = 1, w->nlive++;
    pthread_mutex_unlock(&w->mu);
    if (taken) {
        dp_free(tc), dp_free(peer_buf);
        return dp_seterr(DP_EINVAL, "comm: rank %d was already initialised", rank);
    }
    tc->base.ops = &dp__thread_ops;
    tc->base.rank = dp__thread_grank(w, rank);
    tc->base.nranks = w->nprocs * w->nranks;
    tc->local = rank;
    tc->w = w;
    tc->peer_buf = peer_buf;
    pthread_mutex_init(&tc->mu, NULL);
    pthread_cond_init(&tc->cv_work, NULL);
    pthread_cond_init(&tc->cv_done, NULL);
    int rc = dp__thread_start(&tc->thread, "dp-comm", dp__thread_main, tc);
    if (rc) {
        pthread_mutex_destroy(&tc->mu);
        pthread_cond_destroy(&tc->cv_work);
        pthread_cond_destroy(&tc->cv_done);
        pthread_mutex_lock(&w->mu);
        w->slots[rank].present = 0, w->nlive--;
        pthread_mutex_unlock(&w->mu);
        dp_free(tc), dp_free(peer_buf);
        return dp_seterr(DP_EINTERNAL, "comm: rank %d: cannot start its thread: %s", rank,
                         strerror(rc));
    }
    *cp = &tc->base;
    return 0;
}

int dp_comm_thread_world_init_hier(struct dp_comm_world **wp, int nlocal,
                                   const struct dp_comm_params *params, struct dp_comm *inter) {
    if (!wp) return dp_seterr(DP_EINVAL, "comm: NULL world pointer");
    *wp = NULL;
    if (!inter) return dp_seterr(DP_EINVAL, "comm: hierarchical world without a process communicator");
    int P = dp_comm_world(inter), me = dp_comm_rank(inter);
    if ((int64_t)P * nlocal > INT32_MAX / 2)
        return dp_seterr(DP_EINVAL, "comm: %d processes x %d ranks is too many", P, nlocal);
    /* Every process must have as many ranks as this one. */
    double *n = dp_calloc((size_t)P, sizeof *n);
    if (!n) return dp_seterr(DP_ENOMEM, "comm: out of memory");
    n[me] = nlocal;
    int rc = dp_comm_allreduce(inter, n, P, DP_DTYPE_F64, DP_ALGO_AUTO);
    for (int p = 0; !rc && p < P; p++)
        if (n[p] != nlocal)
            rc = dp_seterr(DP_EMISMATCH, "comm: process %d has %g worker thread%s but process %d has %d "
                           "(every process must run the same number)", p, n[p], n[p] == 1 ? "" : "s",
                           me, nlocal);
    dp_free(n);
    if (rc) return rc;
    if ((rc = dp_comm_thread_world_init(wp, nlocal, params))) return rc;
    (*wp)->inter = inter;
    (*wp)->proc = me;
    (*wp)->nprocs = P;
    return 0;
}
