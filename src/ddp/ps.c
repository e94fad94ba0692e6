/* The parameter server on the thread backend: S shards, each under its own
 * lock, applying the workers' pushes (dp/ps.h).
 *
 * Protocol, per shard i (slice [off_i, off_i + len_i) of the slab), all of
 * it under shard i's mutex; a push visits every shard once, holding one lock
 * at a time (in any order, taking free shards first: next_shard), so
 * workers pushing at once work on different shards and nothing waits on a
 * global lock.
 *
 *   version_i     updates applied to the shard (async: pushes; SSP: clocks)
 *   pulled[r][i]  the version_i rank r last copied out of the shard
 *
 * async push of rank r:
 *     [ordered: wait until version_i == clock * P + r]
 *     staleness_i = version_i - pulled[r][i]
 *     lr = sched(version_i / lr_div) [x 1 / (1 + staleness_i) with staleness_lr]
 *          [x n / share_batch with share_batch: the push's share of the
 *          global batch, so P pushes of N / P samples move the parameters
 *          as far as one sync step (lr / N per sample), not P times as far]
 *     optimizer step on the slice with g (skipped for an empty push)
 *     version_i += 1
 *     copy the fresh slice into the worker's replica; pulled[r][i] = version_i
 *   The push's staleness is max_i staleness_i.  In ordered mode pushes are
 *   applied in the order clock * P + rank, so a worker's pull right after
 *   its own push sees exactly the P - 1 pushes of the others in between:
 *   staleness P - 1 every time (the first clock: r), and the same bits on
 *   every run.
 *
 * SSP push of rank r for clock c (bound s): the clock's sum lives in ring
 * slot c % (s + 1) of the shard's accumulator (doubles):
 *     first push of clock c: zero the slot (its last occupant, clock
 *         c - s - 1, was applied: the pusher pulled version >= c - s)
 *     add g [exact: round(g 2^32) as an integer held in a double, so the
 *         sum does not depend on the arrival order]; add c - pulled[r][i]
 *         to the clock's staleness sum
 *     the P-th push of clock c: every rank pushed c - 1 before c, so clock
 *         c - 1 is applied and version_i == c; apply u = float(sum) with
 *         lr = sched(c) [x 1 / (1 + mean staleness of the clock's pushes)],
 *         version_i = c + 1, wake the waiting pullers
 *   pull for clock c: wait until version_i >= c - s, copy the slice,
 *   pulled[r][i] = version_i.  With s = 0 a worker starts clock c only once
 *   clock c - 1 is applied everywhere: synchronous training, whose update
 *   is the sum of the P workers' 1/N-scaled gradients (the all-reduce's). */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "dp/core.h"
#include "dp/comm.h"
#include "dp/ps.h"


struct shard {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t off, len;
    int64_t version;
    struct dp_optim opt;
    /* SSP */
    double *acc;               /* ((s + 1) x len) per clock slot */
    int64_t *acc_clock;        /* (s + 1) the clock a slot holds, -1: none */
    int *count;                /* (s + 1) pushes added */
    double *stale_sum;         /* (s + 1) their staleness summed */
    float *u;                  /* (len) the clock's update as floats */
};

struct dp_ps {
    struct dp_ps_params p;
    int64_t n;
    int S, P;
    float *params;             /* (n) the master parameters; slice i under shard i's lock */
    struct shard *sh;
    int64_t *pulled;           /* (P x S) pulled[r * S + i] */
    unsigned char *done;       /* (P x S) a push's shards done so far (next_shard) */
    struct dp_ps_hist *hist;   /* (P) each written only by its rank's pushes */
    atomic_int failed;
    pthread_mutex_t why_mu;
    char why[400];
};

/* ---- histogram ---------------------------------------------------------------------- */

void dp_ps_hist_add(struct dp_ps_hist *h, int64_t st) {
    if (st < DP_PS_HIST_BUCKETS) h->bucket[st < 0 ? 0 : st]++;
    else h->overflow++;
    if (h->count == 0 || st > h->max) h->max = st;
    h->count++;
    h->sum += (double)st;
}

void dp_ps_hist_merge(struct dp_ps_hist *into, const struct dp_ps_hist *h) {
    for (int k = 0; k < DP_PS_HIST_BUCKETS; k++) into->bucket[k] += h->bucket[k];
    into->overflow += h->overflow;
    if (h->count && (into->count == 0 || h->max > into->max)) into->max = h->max;
    into->count += h->count;
    into->sum += h->sum;
}

int64_t dp_ps_hist_quantile(const struct dp_ps_hist *h, double q) {
    if (h->count == 0) return 0;
    int64_t need = (int64_t)ceil(q * (double)h->count), seen = 0;
    if (need < 1) need = 1;
    for (int k = 0; k < DP_PS_HIST_BUCKETS; k++)
        if ((seen += h->bucket[k]) >= need) return k;
    return h->max;
}

/* ---- setup ---------------------------------------------------------------------------- */

/* Implicit momentum (Mitliagkas et al. 2016, "Asynchrony begets momentum"):
 * with P asynchronous workers (staleness about P - 1 pushes) the expected
 * update behaves like momentum SGD with mu_i = 1 - 1/P.  Two momentum
 * filters compose as 1 - mu = (1 - mu_e)(1 - mu_i), so for the run's total
 * momentum mu the server keeps mu_e = 1 - (1 - mu) / (1 - mu_i) = 1 - P (1 - mu).
 * Counted per sample, plain async has P^2 times sync's gain lr / (N (1 - mu)):
 * P from P steps per N samples at sync's lr (share_batch takes it off), P
 * from the implicit filter's gain 1 / (1 - mu_i) (this takes it off: the
 * composed gain is 1 / ((1 - mu_e)(1 - mu_i)) = 1 / (1 - mu)). */
int dp_ps_momentum(const struct dp_ps_params *p, float *momentum) {
    *momentum = p->optim.momentum;
    if (!p->implicit_momentum) return DP_OK;
    if (p->staleness >= 0)
        return dp_seterr(DP_EINVAL, "--implicit-momentum does not work with --staleness: it models plain async, "
                         "whose pushes are about P - 1 pushes stale");
    if (p->optim.kind != DP_OPTIM_SGD)
        return dp_seterr(DP_EINVAL, "--implicit-momentum needs SGD (it lowers SGD's --momentum)");
    double mu = 1.0 - (double)p->workers * (1.0 - (double)p->optim.momentum);
    if (!(mu > 0))
        return dp_seterr(DP_EINVAL, "--implicit-momentum: %d asynchronous workers bring momentum 1 - 1/%d = %.3g, "
                         "which is already at least --momentum %g: nothing is left for the optimizer (raise "
                         "--momentum or leave the option off)", p->workers, p->workers, 1.0 - 1.0 / p->workers,
                         (double)p->optim.momentum);
    *momentum = (float)mu;
    return DP_OK;
}

int dp_ps_shards(const struct dp_ps *ps) { return ps->S; }

int64_t dp_ps_version(const struct dp_ps *ps) { return ps->sh[0].version; }

void dp_ps_free(struct dp_ps *ps) {
    if (!ps) return;
    for (int i = 0; ps->sh && i < ps->S; i++) {
        struct shard *sh = &ps->sh[i];
        dp_optim_free(&sh->opt);
        dp_free(sh->acc), dp_free(sh->acc_clock), dp_free(sh->count), dp_free(sh->stale_sum), dp_free(sh->u);
        pthread_mutex_destroy(&sh->mu);
        pthread_cond_destroy(&sh->cv);
    }
    pthread_mutex_destroy(&ps->why_mu);
    dp_free(ps->sh);
    dp_free(ps->params);
    dp_free(ps->pulled);
    dp_free(ps->done);
    dp_free(ps->hist);
    dp_free(ps);
}

int dp_ps_init(struct dp_ps **out, const struct dp_ps_params *p, int64_t n) {
    *out = NULL;
    if (p->workers < 1) return dp_seterr(DP_EINVAL, "parameter server: %d workers", p->workers);
    if (p->shards < 1 || p->shards > n)
        return dp_seterr(DP_EINVAL, "--servers must be in 1..%lld (the parameter count; got %d)", (long long)n,
                         p->shards);
    if (p->staleness > DP_PS_MAX_STALENESS)
        return dp_seterr(DP_EINVAL, "--staleness must be in 0..%d (got %d): for no bound use --mode async",
                         DP_PS_MAX_STALENESS, p->staleness);
    if (p->lr_div < 1) return dp_seterr(DP_EINVAL, "parameter server: lr_div %lld < 1", (long long)p->lr_div);
    struct dp_optim_params op = p->optim;
    int rc = dp_ps_momentum(p, &op.momentum);
    if (rc) return rc;
    if (p->share_batch < 0 || (p->share_batch && p->staleness >= 0))
        return dp_seterr(DP_EINVAL, "parameter server: share_batch %lld needs async (SSP weights its pushes by "
                         "their samples already)", (long long)p->share_batch);
    struct dp_ps *ps = dp_calloc(1, sizeof *ps);
    if (!ps) return dp_seterr(DP_ENOMEM, "parameter server: out of memory");
    ps->p = *p;
    ps->n = n, ps->S = p->shards, ps->P = p->workers;
    atomic_init(&ps->failed, 0);
    pthread_mutex_init(&ps->why_mu, NULL);
    ps->params = dp_malloc_big(sizeof(float) * (size_t)n);
    ps->sh = dp_calloc((size_t)ps->S, sizeof *ps->sh);
    ps->pulled = dp_calloc((size_t)ps->S * (size_t)ps->P, sizeof(int64_t));
    ps->done = dp_calloc((size_t)ps->S * (size_t)ps->P, 1);
    ps->hist = dp_calloc((size_t)ps->P, sizeof *ps->hist);
    if (!ps->params || !ps->sh || !ps->pulled || !ps->done || !ps->hist) {
        dp_ps_free(ps);
        return dp_seterr(DP_ENOMEM, "parameter server: out of memory");
    }
    int slots = p->staleness >= 0 ? p->staleness + 1 : 0;
    for (int i = 0; i < ps->S; i++) {
        struct shard *sh = &ps->sh[i];
        pthread_mutex_init(&sh->mu, NULL);
        if (dp_cond_init_monotonic(&sh->cv) && !rc) rc = dp_seterr(DP_EINTERNAL, "parameter server: pthread_cond_init failed");
        dp_comm_split(n, ps->S, i, &sh->off, &sh->len);
        if (!rc) rc = dp_optim_init(&sh->opt, &op, sh->len);
        if (!rc && slots) {
            sh->acc = dp_malloc_big(sizeof(double) * (size_t)slots * (size_t)sh->len);
            sh->acc_clock = dp_malloc(sizeof(int64_t) * (size_t)slots);
            sh->count = dp_calloc((size_t)slots, sizeof(int));
            sh->stale_sum = dp_calloc((size_t)slots, sizeof(double));
            sh->u = dp_malloc_big(sizeof(float) * (size_t)sh->len);
            if (!sh->acc || !sh->acc_clock || !sh->count || !sh->stale_sum || !sh->u)
                rc = dp_seterr(DP_ENOMEM, "--staleness %d: out of memory for %d clock sums", p->staleness, slots);
            for (int k = 0; !rc && k < slots; k++) sh->acc_clock[k] = -1;
        }
    }
    if (rc) {
        dp_ps_free(ps);
        return rc;
    }
    *out = ps;
    return DP_OK;
}

/* The optimizer state's whole-slab layout has state_len / n slabs (SGD
 * momentum: 1; AdamW m, v: 2); shard i holds the slice of each slab. */
void dp_ps_set_state(struct dp_ps *ps, const float *params, const float *state, int64_t step, int64_t version) {
    memcpy(ps->params, params, sizeof(float) * (size_t)ps->n);
    for (int i = 0; i < ps->S; i++) {
        struct shard *sh = &ps->sh[i];
        int64_t slabs = sh->len ? sh->opt.state_len / sh->len : 0;
        for (int64_t j = 0; j < slabs; j++) {
            float *d = sh->opt.state + j * sh->len;
            if (state) memcpy(d, state + j * ps->n + sh->off, sizeof(float) * (size_t)sh->len);
            else memset(d, 0, sizeof(float) * (size_t)sh->len);
        }
        sh->opt.step = step;
        sh->version = version;
        int slots = ps->p.staleness >= 0 ? ps->p.staleness + 1 : 0;
        for (int k = 0; k < slots; k++) sh->acc_clock[k] = -1, sh->count[k] = 0;
    }
    for (int64_t k = 0; k < (int64_t)ps->P * ps->S; k++) ps->pulled[k] = version;
    atomic_store(&ps->failed, 0);
}

void dp_ps_get_state(const struct dp_ps *ps, float *params, float *state, int64_t *step, int64_t *version) {
    memcpy(params, ps->params, sizeof(float) * (size_t)ps->n);
    for (int i = 0; i < ps->S; i++) {
        const struct shard *sh = &ps->sh[i];
        int64_t slabs = sh->len ? sh->opt.state_len / sh->len : 0;
        for (int64_t j = 0; state && j < slabs; j++)
            memcpy(state + j * ps->n + sh->off, sh->opt.state + j * sh->len, sizeof(float) * (size_t)sh->len);
    }
    *step = ps->sh[0].opt.step;
    *version = ps->sh[0].version;
}

void dp_ps_hist_get(const struct dp_ps *ps, struct dp_ps_hist *out) {
    memset(out, 0, sizeof *out);
    for (int r = 0; r < ps->P; r++) dp_ps_hist_merge(out, &ps->hist[r]);
}

void dp_ps_hist_reset(struct dp_ps *ps) { memset(ps->hist, 0, sizeof *ps->hist * (size_t)ps->P); }

/* ---- failure ---------------------------------------------------------------------------- */

void dp_ps_abort(struct dp_ps *ps, const char *why) {
    if (!ps) return;
    pthread_mutex_lock(&ps->why_mu);
    if (!atomic_load(&ps->failed)) snprintf(ps->why, sizeof ps->why, "%.390s", why);
    atomic_store(&ps->failed, 1);
    pthread_mutex_unlock(&ps->why_mu);
    /* under each lock: a waiter checks `failed` under it before sleeping */
    for (int i = 0; i < ps->S; i++) {
        pthread_mutex_lock(&ps->sh[i].mu);
        pthread_cond_broadcast(&ps->sh[i].cv);
        pthread_mutex_unlock(&ps->sh[i].mu);
    }
}

static int canceled(struct dp_ps *ps) {
    pthread_mutex_lock(&ps->why_mu);
    char why[sizeof ps->why];
    snprintf(why, sizeof why, "%s", ps->why);
    pthread_mutex_unlock(&ps->why_mu);
    return dp_seterr(DP_ECANCELED, "%s", why);
}

/* Waits on shard i (its lock held) until done(...) holds or the run fails;
 * past the deadline (dp_time; 0 = none) the run fails with a message naming
 * what was awaited.  Returns 0 or DP_ECANCELED (the lock still held). */
static int wait_for(struct dp_ps *ps, struct shard *sh, int i, int rank, int64_t want, int exact, double deadline) {
    while (!atomic_load(&ps->failed) && (exact ? sh->version != want : sh->version < want)) {
        if (deadline <= 0) {
            pthread_cond_wait(&sh->cv, &sh->mu);
            continue;
        }
        if (dp_cond_wait_until(&sh->cv, &sh->mu, deadline) != ETIMEDOUT) continue;
        char why[300];
        snprintf(why, sizeof why, "comm: timeout after %.1f s: rank %d waited for version %lld of parameter-server "
                 "shard %d, which is at %lld (a slower worker has not pushed)", ps->p.timeout_s, rank,
                 (long long)want, i, (long long)sh->version);
        pthread_mutex_unlock(&sh->mu);
        dp_ps_abort(ps, why);
        pthread_mutex_lock(&sh->mu);
    }
    return atomic_load(&ps->failed) ? DP_ECANCELED : DP_OK;
}

/* ---- pull and push ------------------------------------------------------------------------ */

int dp_ps_pull(struct dp_ps *ps, int rank, int64_t clock, float *dst) {
    double deadline = ps->p.timeout_s > 0 ? dp_time() + ps->p.timeout_s : 0;
    int64_t want = ps->p.staleness >= 0 ? clock - ps->p.staleness : 0;
    for (int i = 0; i < ps->S; i++) {
        struct shard *sh = &ps->sh[i];
        pthread_mutex_lock(&sh->mu);
        if (wait_for(ps, sh, i, rank, want, 0, deadline)) {
            pthread_mutex_unlock(&sh->mu);
            return canceled(ps);
        }
        memcpy(dst + sh->off, ps->params + sh->off, sizeof(float) * (size_t)sh->len);
        ps->pulled[(size_t)rank * (size_t)ps->S + (size_t)i] = sh->version;
        pthread_mutex_unlock(&sh->mu);
    }
    return DP_OK;
}

/* The lr of an update: the schedule's, [/ (1 + staleness)] [x share, the
 * async push's samples / share_batch; 1 otherwise]. */
static float lr_at(const struct dp_ps *ps, int64_t version, double staleness, double share) {
    double lr = dp_sched_lr(&ps->p.sched, version / ps->p.lr_div) * share;
    return (float)(ps->p.staleness_lr ? lr / (1.0 + staleness) : lr);
}

/* One shard of an async push (lock held). */
static int push_async(struct dp_ps *ps, struct shard *sh, int rank, const float *g, double n, int64_t *st) {
    int64_t *pulled = &ps->pulled[(size_t)rank * (size_t)ps->S + (size_t)(sh - ps->sh)];
    *st = sh->version - *pulled;
    int rc = DP_OK;
    double share = ps->p.share_batch > 0 ? n / (double)ps->p.share_batch : 1.0;
    if (n > 0)
        rc = dp_optim_step(&sh->opt, ps->params + sh->off, g + sh->off, sh->len,
                           lr_at(ps, sh->version, (double)*st, share));
    sh->version++;
    *pulled = sh->version;
    return rc;
}

/* One shard of an SSP push for clock c (lock held). */
static int push_ssp(struct dp_ps *ps, struct shard *sh, int rank, const float *g, double n, int64_t c, int64_t *st) {
    const int64_t len = sh->len, k = c % (ps->p.staleness + 1);
    double *acc = sh->acc + k * len;
    *st = c - ps->pulled[(size_t)rank * (size_t)ps->S + (size_t)(sh - ps->sh)];
    if (sh->acc_clock[k] != c) {
        DP_ASSERT(sh->version > c - ps->p.staleness - 1); /* the slot's last clock is applied */
        memset(acc, 0, sizeof(double) * (size_t)len);
        sh->acc_clock[k] = c, sh->count[k] = 0, sh->stale_sum[k] = 0;
    }
    const float *gs = g + sh->off;
    if (n > 0 && ps->p.exact) {
        if (dp_fixed_add(acc, gs, len))
            return dp_seterr(DP_ENONFINITE, "parameter server: rank %d's gradient for clock %lld is not finite or "
                             "too large for the exact sum (|g| >= 2^20)", rank, (long long)c);
    } else if (n > 0) {
#pragma omp simd
        for (int64_t j = 0; j < len; j++) acc[j] += (double)gs[j];
    }
    sh->stale_sum[k] += (double)*st;
    if (++sh->count[k] < ps->P) return DP_OK;
    /* the clock is complete: every rank pushed c - 1 before c, so c - 1 was applied */
    DP_ASSERT(sh->version == c);
    double scale = ps->p.exact ? 1.0 / DP_FIXED_SCALE : 1.0;
    int bad = 0;
    for (int64_t j = 0; j < len; j++) {
        sh->u[j] = (float)(acc[j] * scale);
        bad |= !isfinite(sh->u[j]);
    }
    if (bad) return dp_seterr(DP_ENONFINITE, "parameter server: the update of clock %lld is not finite; try a "
                              "lower --lr", (long long)c);
    int rc = dp_optim_step(&sh->opt, ps->params + sh->off, sh->u, len, lr_at(ps, c, sh->stale_sum[k] / ps->P, 1.0));
    sh->acc_clock[k] = -1;
    sh->version = c + 1;
    pthread_cond_broadcast(&sh->cv);
    return rc;
}

/* Which shard next.  The replay walks the shards in order (each waits for
 * its turn anyway).  Otherwise the order does not matter (every shard's
 * update is independent), so the walk is work-conserving: starting at a
 * rank-dependent shard, it takes any shard not yet done whose lock is free
 * (trylock), and blocks only when every shard left is busy, on the first of
 * them.  Workers then rarely queue behind one another on the same lock.
 * Returns the shard, its lock held. */
static int next_shard(struct dp_ps *ps, int rank, unsigned char *done, int k) {
    const int S = ps->S;
    if (ps->p.ordered || S == 1) {
        pthread_mutex_lock(&ps->sh[k].mu);
        return k;
    }
    int start = (int)((int64_t)rank * S / ps->P), first = -1;
    for (int j = 0; j < S; j++) {
        int i = (start + j) % S;
        if (done[i]) continue;
        if (first < 0) first = i;
        if (pthread_mutex_trylock(&ps->sh[i].mu) == 0) return i;
    }
    pthread_mutex_lock(&ps->sh[first].mu);
    return first;
}

int dp_ps_push(struct dp_ps *ps, int rank, const float *g, double n, int64_t clock, float *dst, int64_t *staleness) {
    double deadline = ps->p.timeout_s > 0 ? dp_time() + ps->p.timeout_s : 0;
    int ssp = ps->p.staleness >= 0, rc = DP_OK;
    int64_t smax = 0;
    unsigned char *done = ps->done + (size_t)rank * (size_t)ps->S;
    memset(done, 0, (size_t)ps->S);
    for (int k = 0; k < ps->S && !rc; k++) {
        int i = next_shard(ps, rank, done, k);
        struct shard *sh = &ps->sh[i];
        int64_t st = 0;
        done[i] = 1;
        if (atomic_load(&ps->failed)) rc = DP_ECANCELED;
        else if (ssp) rc = push_ssp(ps, sh, rank, g, n, clock, &st);
        else if (ps->p.ordered && (rc = wait_for(ps, sh, i, rank, clock * ps->P + rank, 1, deadline))) {
        } else {
            rc = push_async(ps, sh, rank, g, n, &st);
            memcpy(dst + sh->off, ps->params + sh->off, sizeof(float) * (size_t)sh->len);
            if (ps->p.ordered) pthread_cond_broadcast(&sh->cv); /* the next in order may go */
        }
        pthread_mutex_unlock(&sh->mu);
        if (st > smax) smax = st;
    }
    if (rc == DP_ECANCELED) return canceled(ps);
    if (rc) return rc;
    *staleness = smax;
    if (n > 0) dp_ps_hist_add(&ps->hist[rank], smax);
    return DP_OK;
}
