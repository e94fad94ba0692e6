/* Backup workers on the threads of one process: the step slot (dp/ddp.h,
 * dp_backup_slot_*; docs/ddp.md "Backup workers").  The same step as
 * backup_star.c's across processes, through shared memory.
 *
 * Each synchronous step takes the gradients of the first P - b workers to
 * finish their compute and drops the others'.  No collective is involved
 * (an all-reduce needs every rank): the P workers meet in the slot under one
 * mutex.  Every worker runs every step, in order:
 *
 *   compute its gradient sum g_r over its n_r samples (loss scale 1)
 *   arrive at step s:  if s is still open and fewer than P - b ranks were
 *       accepted, it is accepted (the slot keeps a pointer to g_r, which
 *       it leaves untouched until s is published); else it is dropped
 *   the (P - b)-th accepted rank closes s: once ring slot s % D is free
 *       (every worker took step s - D), it writes
 *           u = (sum over accepted r, in rank order, of g_r) / (sum n_r x pos)
 *       the mean gradient over the accepted samples, whatever the arrival
 *       order within the accepted set, marks the others dropped, and opens
 *       s + 1
 *   every worker, accepted or late, waits for step s's u, copies it, and
 *   applies it with its own optimizer: the same bits on every replica
 *
 * So a late worker finishes its (dropped) compute, applies the step's update
 * and starts step s + 1 from the new parameters.  The ranks that close steps
 * run at most D = DP_BACKUP_DEPTH steps ahead of the latest one (the ring),
 * and since every worker runs the same sequence of steps, the collectives
 * between steps stay matched.  No step ends half-done: a worker that fails
 * calls dp_backup_slot_abort and every waiter returns DP_ECANCELED; a wait
 * longer than the timeout fails the run naming the ranks that did not
 * arrive.  A step whose accepted ranks had no samples (empty shares) applies
 * no update (n_acc 0), on every replica alike. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "dp/ddp.h"

#define D DP_BACKUP_DEPTH

struct dp_backup_slot {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int init;                 /* mu and cv initialised */
    int P, base, need;        /* workers, the job rank of worker 0, P - b gradients accepted per step */
    int64_t np;               /* floats per gradient */
    double positions, timeout_s;
    int64_t open;             /* the step collecting gradients; all before it are published */
    int count;                /* gradients accepted for `open` so far */
    const float **src;        /* (P) the accepted ranks' gradient sums for `open`, else NULL */
    double *n;                /* (P) their sample counts */
    int64_t *arrived;         /* (P) the last step each rank arrived at (-1: none) */
    float *upd[D];            /* step s's gradient (the accepted samples' mean) */
    int64_t upd_step[D];      /* the step a slot holds (-1: none) */
    int consumed[D];          /* workers that have taken it: the slot is free again at P */
    double upd_n[D];          /* samples accepted (0: no update to apply) */
    int upd_bad[D];           /* the gradient is not finite */
    unsigned char *acc[D];    /* (P) 1: the rank's gradient was accepted */
    int failed;               /* a worker failed: every wait returns DP_ECANCELED */
    char why[400];
};

int dp_backup_slot_init(struct dp_backup_slot **out, int P, int base, int64_t num_params, int backup,
                        double positions, double timeout_s) {
    struct dp_backup_slot *bs = dp_calloc(1, sizeof *bs);
    *out = bs;
    if (!bs) return dp_seterr(DP_ENOMEM, "--backup-workers: out of memory");
    size_t np = (size_t)(num_params ? num_params : 1);
    bs->P = P, bs->base = base, bs->need = P - backup, bs->np = num_params;
    bs->positions = positions, bs->timeout_s = timeout_s;
    bs->src = dp_calloc((size_t)P, sizeof *bs->src);
    bs->n = dp_calloc((size_t)P, sizeof(double));
    bs->arrived = dp_calloc((size_t)P, sizeof(int64_t));
    int bad = !bs->src || !bs->n || !bs->arrived;
    for (int k = 0; k < D; k++) {
        bs->upd[k] = dp_malloc_big(sizeof(float) * np);
        bs->acc[k] = dp_calloc((size_t)P, 1);
        bad |= !bs->upd[k] || !bs->acc[k];
    }
    if (bad) return dp_seterr(DP_ENOMEM, "--backup-workers: out of memory");
    if (pthread_mutex_init(&bs->mu, NULL) != 0) return dp_seterr(DP_ENOMEM, "--backup-workers: cannot create a mutex");
    if (dp_cond_init_monotonic(&bs->cv) != 0) {
        pthread_mutex_destroy(&bs->mu);
        return dp_seterr(DP_ENOMEM, "--backup-workers: cannot create a condition variable");
    }
    bs->init = 1;
    return DP_OK;
}

void dp_backup_slot_start(struct dp_backup_slot *bs, int64_t first_step) {
    bs->open = first_step, bs->count = 0, bs->failed = 0;
    for (int r = 0; r < bs->P; r++) bs->arrived[r] = -1;
    for (int k = 0; k < D; k++) bs->upd_step[k] = -1, bs->consumed[k] = 0;
}

void dp_backup_slot_free(struct dp_backup_slot *bs) {
    if (!bs) return;
    dp_free(bs->src), dp_free(bs->n), dp_free(bs->arrived);
    for (int k = 0; k < D; k++) dp_free(bs->upd[k]), dp_free(bs->acc[k]);
    if (bs->init) pthread_mutex_destroy(&bs->mu), pthread_cond_destroy(&bs->cv);
    dp_free(bs);
}

void dp_backup_slot_abort(struct dp_backup_slot *bs, const char *why) {
    if (!bs || !bs->init) return;
    pthread_mutex_lock(&bs->mu);
    if (!bs->failed) {
        bs->failed = 1;
        snprintf(bs->why, sizeof bs->why, "%.300s", why);
    }
    pthread_cond_broadcast(&bs->cv);
    pthread_mutex_unlock(&bs->mu);
}

/* One wait on the slot (mu held) until deadline (dp_time; 0 = none).  At
 * the deadline it marks the slot failed with a message naming the ranks
 * that have not arrived at the open step, and returns 1 (the caller then
 * aborts the communicator too, as a collective's timeout does). */
static int slot_wait(struct dp_backup_slot *bs, int rank, double deadline) {
    if (deadline <= 0) {
        pthread_cond_wait(&bs->cv, &bs->mu);
        return 0;
    }
    if (dp_cond_wait_until(&bs->cv, &bs->mu, deadline) != ETIMEDOUT) return 0;
    if (bs->failed) return 0;
    char who[200] = "";
    size_t len = 0;
    for (int r = 0; r < bs->P && len + 16 < sizeof who; r++)
        if (bs->arrived[r] < bs->open) len += (size_t)snprintf(who + len, sizeof who - len, "%s%d", len ? ", " : "", bs->base + r);
    snprintf(bs->why, sizeof bs->why, "comm: timeout after %.1f s in backup-workers step %lld on rank %d: %s",
             bs->timeout_s, (long long)bs->open, bs->base + rank,
             len ? "rank(s) did not arrive: " : "a rank did not take the previous update");
    if (len) snprintf(bs->why + strlen(bs->why), sizeof bs->why - strlen(bs->why), "%s", who);
    bs->failed = 1;
    pthread_cond_broadcast(&bs->cv);
    return 1;
}

int dp_backup_slot_step(struct dp_backup_slot *bs, int rank, struct dp_comm *comm, int64_t s, float *g,
                        double n_local, double *n_acc, int *bad, unsigned char *accepted) {
    const int64_t np = bs->np;
    const int k = (int)(s % D), P = bs->P;
    double deadline = bs->timeout_s > 0 ? dp_time() + bs->timeout_s : 0;
    int timed = 0;
    pthread_mutex_lock(&bs->mu);
    bs->arrived[rank] = s;
    pthread_cond_broadcast(&bs->cv); /* a timeout message reads `arrived` */
    if (bs->open == s && bs->count < bs->need) {
        bs->src[rank] = g, bs->n[rank] = n_local;
        if (++bs->count == bs->need) {
            /* the closer: ring slot k must be free (every worker took step s - D) */
            while (!bs->failed && bs->upd_step[k] >= 0 && bs->consumed[k] < P) timed |= slot_wait(bs, rank, deadline);
            if (!bs->failed) {
                float *u = bs->upd[k];
                double n = 0;
                int first = 1;
                for (int r = 0; r < P; r++) {
                    bs->acc[k][r] = bs->src[r] != NULL;
                    if (!bs->src[r]) continue;
                    n += bs->n[r];
                    if (first) memcpy(u, bs->src[r], sizeof(float) * (size_t)np), first = 0;
                    else {
                        const float *gr = bs->src[r];
#pragma omp simd
                        for (int64_t i = 0; i < np; i++) u[i] += gr[i];
                    }
                    bs->src[r] = NULL;
                }
                /* sum -> mean over the accepted samples x positions */
                float scale = n > 0 ? (float)(1.0 / (n * bs->positions)) : 0.0f;
#pragma omp simd
                for (int64_t i = 0; i < np; i++) u[i] *= scale;
                bs->upd_n[k] = n;
                bs->upd_bad[k] = n > 0 && dp_any_nonfinite(u, np);
                bs->upd_step[k] = s;
                bs->consumed[k] = 0;
                bs->open = s + 1;
                bs->count = 0;
                pthread_cond_broadcast(&bs->cv);
            }
        }
    }
    while (!bs->failed && bs->upd_step[k] != s) timed |= slot_wait(bs, rank, deadline);
    if (bs->failed) {
        char why[sizeof bs->why];
        snprintf(why, sizeof why, "%s", bs->why);
        pthread_mutex_unlock(&bs->mu);
        if (timed) dp_comm_abort(comm, why); /* wake the ranks blocked in collectives */
        return dp_seterr(DP_ECANCELED, "%s", why);
    }
    *n_acc = bs->upd_n[k], *bad = bs->upd_bad[k];
    memcpy(accepted, bs->acc[k], (size_t)P);
    pthread_mutex_unlock(&bs->mu);
    /* the slot is not rewritten before every worker has taken it (consumed) */
    memcpy(g, bs->upd[k], sizeof(float) * (size_t)np);
    pthread_mutex_lock(&bs->mu);
    if (++bs->consumed[k] == P) pthread_cond_broadcast(&bs->cv);
    pthread_mutex_unlock(&bs->mu);
    return DP_OK;
}
