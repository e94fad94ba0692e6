/* Agreement between ranks: the configuration hashed and compared before the
 * first step, the replicas compared (--check-replicas), and a stop request. */
#include "trainer.h"

/* Every rank's k 64-bit hashes: on return (*all)[r * k + j] is rank r's hash
 * j (caller frees).  They travel as exact 32-bit halves in doubles through
 * one all-gather, whose size depends only on the job's rank count. */
static int gather_hashes(struct worker *w, const uint64_t *mine, int k, uint64_t **all) {
    struct dp_trainer *t = w->t;
    size_t n = (size_t)t->G * (size_t)k;
    double *h = dp_calloc(2 * n, sizeof(double));
    *all = dp_malloc(n * sizeof(uint64_t));
    if (!h || !*all) {
        dp_free(h), dp_free(*all), *all = NULL;
        return dp_seterr(DP_ENOMEM, "out of memory");
    }
    double *slot = h + 2 * (size_t)w->grank * (size_t)k;
    for (int j = 0; j < k; j++) slot[2 * j] = (double)(mine[j] >> 32), slot[2 * j + 1] = (double)(mine[j] & 0xffffffffu);
    int rc = dp_comm_allgather(w->comm, h, (int64_t)(2 * n), DP_DTYPE_F64, DP_ALGO_AUTO);
    for (size_t i = 0; i < n; i++) (*all)[i] = (uint64_t)h[2 * i] << 32 | (uint64_t)h[2 * i + 1];
    dp_free(h);
    if (rc) dp_free(*all), *all = NULL;
    return rc;
}

/* Compares every replica's parameter hash with rank 0's (a pipeline: each worker's span with its
 * stage's first worker's; every worker of a stage, replica or tensor rank, holds the same). */
int dp__check_replicas(struct worker *w) {
    /* dp_replica_hash's bytes; ZeRO 3 hashes its ranges as they are gathered, one at a time */
    uint64_t mine = DP_FNV1A64_INIT, *h;
    const int R = w->pipe ? w->t->pp_R : w->t->G; /* (the workers that hold the same: a stage's, or all) */
    int rc = DP_OK;
    if (w->pipe) {
        int64_t off[2], len[2];
        (void)dp__pipe_held(w, off, len);
        mine = dp_fnv1a64(w->rep.params + off[0], sizeof(float) * (size_t)len[0], mine);
    } else {
        if ((rc = dp_sync_gather(&w->sync, 0, &mine))) return rc;
        mine = dp_fnv1a64(w->rep.buffers, sizeof(float) * (size_t)w->t->model->num_buffers, mine);
    }
    rc = gather_hashes(w, &mine, 1, &h);
    for (int r = 1; !rc && r < w->t->G; r++)
        if (h[r] != h[r / R * R])
            rc = dp_seterr(DP_EMISMATCH, "step %lld: the replica of worker %d diverged from worker %d "
                           "(parameter hash %016llx, expected %016llx)", (long long)w->step + 1, r, r / R * R,
                           (unsigned long long)h[r], (unsigned long long)h[r / R * R]);
    dp_free(h);
    return rc;
}

/* A requested stop (dp_train_params.io.stop), checked before each step: *stop = 1 when every
 * rank stops before step `step`.  The ranks must agree on the step, or one would wait
 * forever in a collective the others never start.
 *   One process: the first worker to see the request, before step s, sets stop_at = s + lead,
 *   once (compare-and-swap), and every worker stops before that step.  No worker has begun
 *   it: a synchronous worker cannot finish step s before this one takes part in it (the
 *   step's reduction needs every rank), so lead = 1; a backup worker runs at most
 *   BACKUP_DEPTH steps ahead of the latest, so lead = BACKUP_DEPTH + 1.
 *   Several processes: one all-reduce of one double per step sums the ranks' views of
 *   their process's request; every rank gets the same sum, so all stop at the same step
 *   (measured in docs/results.md "A stop on request").  Backup workers across processes
 *   run no per-step collective (that would wait for the late ranks they exist to drop): a
 *   request there ends the run as a failure of the step. */
int dp__stop_agreed(struct worker *w, int64_t step, int *stop) {
    struct dp_trainer *t = w->t;
    *stop = 0;
    if (!t->p.io.stop) return DP_OK;
    if (t->p.dp.inter) {
        if (t->bk_on)
            return atomic_load(t->p.io.stop) ? dp_seterr(DP_ECANCELED, "stopped on request (--backup-workers across "
                                                     "processes cannot agree on a step to stop at)") : DP_OK;
        double v = atomic_load(t->p.io.stop) != 0;
        int rc = dp_comm_allreduce(w->comm, &v, 1, DP_DTYPE_F64, DP_ALGO_AUTO);
        *stop = !rc && v > 0;
        return rc;
    }
    long long at = atomic_load(&t->stop_at);
    if (at == INT64_MAX && atomic_load(t->p.io.stop)) {
        atomic_compare_exchange_strong(&t->stop_at, &at, (long long)step + (t->bk_on ? BACKUP_DEPTH + 1 : 1));
        at = atomic_load(&t->stop_at); /* (ours, or the one another worker set first) */
    }
    *stop = step >= at;
    return DP_OK;
}

/* ---- agreement before the first step ----------------------------------------------------
 * Every rank hashes what must be equal everywhere, in five parts, and the
 * hashes are all-gathered (one collective whose size depends only on the
 * job's rank count, which the launcher fixes).  A rank that differs from
 * rank 0 is named, with the part, before any collective whose size depends
 * on those settings could hang or mix up data. */
enum { AGREE_MODEL, AGREE_BUCKETS, AGREE_DATA, AGREE_CONFIG, AGREE_POSITION, AGREE_PARTS };
#define AGREE_CONFIG_NAME \
    "configuration (batch, optimizer, schedule, seed, epochs, workers per process, data parallelism options)"
static const char *const agree_names[AGREE_PARTS] = {
    "model (spec and parameter count)", "gradient bucket layout", "training data (sample count and shape)",
    AGREE_CONFIG_NAME, "starting position (the checkpoint resumed)"};

#define H(x) (h = dp_fnv1a64(&(x), sizeof(x), h))
static void agree_hashes(const struct worker *w, uint64_t out[AGREE_PARTS]) {
    const struct dp_trainer *t = w->t;
    const struct dp_train_params *p = &t->p;
    const struct dp_model *m = t->model;
    uint64_t h = 0xcbf29ce484222325ull;
    h = dp_fnv1a64(m->spec, strlen(m->spec), h);
    H(m->num_params), H(m->num_buffers);
    out[AGREE_MODEL] = h;
    h = 0xcbf29ce484222325ull;
    const struct dp_reducer *red = &w->sync.red;
    H(red->nb);
    for (int i = 0; i < red->nb; i++) H(red->b[i].off), H(red->b[i].count);
    out[AGREE_BUCKETS] = h;
    h = 0xcbf29ce484222325ull;
    H(t->train.n), H(t->train.C), H(t->train.H), H(t->train.W), H(p->data.norm_mean), H(p->data.norm_std);
    H(p->data.test_limit), H(p->data.aug.crop_pad), H(p->data.aug.hflip);
    H(t->tokens.n), H(t->tokens.vocab), H(t->split.train_n), H(t->windows); /* text (0 otherwise) */
    out[AGREE_DATA] = h;
    h = 0xcbf29ce484222325ull;
    H(p->run.batch), H(p->dp.accum), H(p->run.seed), H(p->run.epochs), H(p->run.max_steps), H(p->run.clip_norm), H(p->dp.workers);
    H(p->optim.kind), H(p->optim.momentum), H(p->optim.nesterov), H(p->optim.dampening);
    H(p->optim.weight_decay), H(p->optim.beta1), H(p->optim.beta2), H(p->optim.eps);
    H(p->sched.kind), H(p->sched.base_lr), H(p->sched.total_steps), H(p->sched.warmup_steps);
    H(p->sched.step_size), H(p->sched.gamma), H(p->sched.min_lr);
    H(p->dp.deterministic), H(p->dp.det_chunk), H(p->dp.algo), H(p->dp.overlap), H(p->dp.skip_nonfinite);
    H(p->dp.check_replicas), H(p->dp.accum), H(t->gather_waits), H(p->dp.balance), H(p->dp.backup), H(p->dp.backup_workers);
    H(p->dp.compress.kind), H(p->dp.compress.rank), H(p->dp.compress.fraction), H(p->dp.compress.powersgd_start);
    H(p->dp.async), H(p->dp.staleness), H(p->dp.staleness_lr), H(p->dp.servers), H(p->dp.zero), H(p->dp.zero_scatter), H(p->dp.zero_gather), H(p->dp.zero_unit_bytes);
    H(p->dp.share_lr), H(p->dp.implicit_momentum); /* (not pin_threads: where a process's workers run is its own) */
    H(p->dp.pp), H(p->dp.micro_batches), H(p->dp.pp_schedule), H(p->dp.tp);
    out[AGREE_CONFIG] = h;
    h = 0xcbf29ce484222325ull;
    H(w->step), H(w->epoch), H(w->in_epoch);
    out[AGREE_POSITION] = h;
}
#undef H

int dp__agree_config(struct worker *w) {
    uint64_t mine[AGREE_PARTS], *all;
    agree_hashes(w, mine);
    int rc = gather_hashes(w, mine, AGREE_PARTS, &all);
    const int R = w->t->pp > 1 ? w->t->pp_R : w->t->G;
    for (int r = 1; !rc && r < w->t->G; r++)
        for (int k = 0; k < AGREE_PARTS; k++) {
            /* (a pipeline's stages each have their own buckets: each rank agrees with its stage's first) */
            const int ref = k == AGREE_BUCKETS ? r / R * R : 0;
            if (all[(size_t)r * AGREE_PARTS + (size_t)k] != all[(size_t)ref * AGREE_PARTS + (size_t)k]) {
                rc = dp_seterr(DP_EMISMATCH, "rank %d disagrees with rank %d on the %s: every rank must be "
                               "started with the same options%s", r, ref, agree_names[k],
                               k == AGREE_POSITION ? " and checkpoint" : "");
                break;
            }
        }
    dp_free(all);
    return rc;
}
