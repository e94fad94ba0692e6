/* The training parameters: their defaults and the checks on their combinations
 * (one clear line each), and the automatic settings derived from the machine. */
#include "dp/par.h"
#include "trainer.h"

struct dp_train_params dp_train_default_params(void) {
    struct dp_train_params p;
    memset(&p, 0, sizeof p);
    p.data.data_dir = "/usr/share/datasets/fashion-mnist";
    p.run.model = "mlp";
    p.dp.workers = 1;
    p.dp.accum = 1;
    p.dp.pp = 1;
    p.dp.tp = 1;
    p.dp.pp_schedule = DP_PIPE_1F1B;
    p.dp.bucket_cap_bytes = 0; /* auto (dp/ddp.h) */
    p.dp.first_bucket_bytes = 1u << 20;
    p.dp.overlap = 1;
    p.dp.comm_spin_us = -1; /* auto */
    p.dp.comm_progress = DP_PROGRESS_AUTO;
    p.dp.algo = DP_ALGO_AUTO;
    p.dp.det_chunk = 0; /* auto: dp_det_chunk_auto(batch) */
    p.run.epochs = 1;
    p.run.batch = 128;
    p.optim = dp_optim_default_params();
    p.sched.kind = DP_SCHED_CONSTANT;
    p.sched.base_lr = 0.05f;
    p.sched.gamma = 0.1f;
    p.run.seed = 1;
    p.dp.staleness = -1;
    p.run.threads = 1;
    p.data.prefetch = -1; /* auto */
    p.data.csv_header = -1; /* detect */
    /* Fashion-MNIST pixel statistics (train set, after /255). */
    p.data.norm_mean = 0.2860f;
    p.data.norm_std = 0.3530f;
    return p;
}

/* The parameter server's settings, and what it does not combine with (one
 * line each; see ps_loop). */
int dp__check_ps(const struct dp_train_params *p) {
    int async = p->dp.async || p->dp.staleness >= 0;
    if (p->dp.servers < 0) return dp_seterr(DP_EINVAL, "--servers must be >= 1 (got %d)", p->dp.servers);
    if (!async && (p->dp.servers || p->dp.staleness_lr))
        return dp_seterr(DP_EINVAL, "%s needs --mode async or --staleness S (the parameter server)",
                         p->dp.servers ? "--servers" : "--staleness-lr");
    if (!async && (p->dp.share_lr || p->dp.implicit_momentum))
        return dp_seterr(DP_EINVAL, "%s needs --mode async (the parameter server)",
                         p->dp.share_lr ? "--share-lr" : "--implicit-momentum");
    if (!async) return DP_OK;
    const char *mode = p->dp.staleness >= 0 ? "--staleness" : "--mode async";
    if (p->dp.share_lr && p->dp.staleness >= 0)
        return dp_seterr(DP_EINVAL, "--share-lr does not work with --staleness: a clock's pushes are summed into "
                         "one update, each weighted by its samples already");
    /* across processes: async, SSP or the replay over --servers S dedicated ranks (ps_net_loop) */
    if (p->dp.inter && p->dp.workers > 1)
        return dp_seterr(DP_ENOTSUP, "--mode async across processes needs one worker per process (--workers 1 "
                         "under mpirun; got %d)", p->dp.workers);
    if (p->dp.inter && (p->dp.servers ? p->dp.servers : 1) >= dp_comm_world(p->dp.inter))
        return dp_seterr(DP_EINVAL, "--servers %d leaves no worker: under mpirun the last S of the %d processes "
                         "serve and the others work, so S must be below %d", p->dp.servers ? p->dp.servers : 1,
                         dp_comm_world(p->dp.inter), dp_comm_world(p->dp.inter));
    if (p->dp.staleness > DP_PS_MAX_STALENESS)
        return dp_seterr(DP_EINVAL, "--staleness must be in 0..%d (got %d); for no bound use --mode async",
                         DP_PS_MAX_STALENESS, p->dp.staleness);
    if (p->dp.backup) return dp_seterr(DP_EINVAL, "--backup-workers does not work with %s: no worker waits for another "
                                    "there, so there is nothing to drop", mode);
    if (p->dp.balance) return dp_seterr(DP_EINVAL, "--balance does not work with %s: %s", mode, p->dp.staleness >= 0 ?
                                     "its clocks take static shares" : "async workers already take batches at "
                                     "their own pace");
    if (p->dp.compress.kind != DP_COMPRESS_NONE)
        return dp_seterr(DP_ENOTSUP, "--compress does not work with %s: pushes go to the server uncompressed "
                         "(compression is a strategy of the all-reduce path)", mode);
    if (p->dp.accum > 1) return dp_seterr(DP_ENOTSUP, "--accum > 1 is not supported with %s", mode);
    if (p->run.max_steps) return dp_seterr(DP_ENOTSUP, "--max-steps is not supported with %s: it stops at epoch "
                                       "boundaries only (where every push is applied)", mode);
    if (p->dp.check_replicas) return dp_seterr(DP_EINVAL, "--check-replicas does not work with %s: the replicas "
                                            "differ by design between pulls", mode);
    if (p->dp.skip_nonfinite) return dp_seterr(DP_ENOTSUP, "--skip-nonfinite is not supported with %s", mode);
    if (p->dp.staleness >= 0 && p->run.clip_norm > 0)
        return dp_seterr(DP_ENOTSUP, "--clip does not work with --staleness: a clock's update is summed shard by "
                         "shard, and clipping needs the norm of the whole gradient (plain --mode async clips each push)");
    if (p->dp.staleness > 0 && p->dp.deterministic)
        return dp_seterr(DP_ENOTSUP, "--staleness %d with --deterministic is not built: which version a worker "
                         "pulls depends on timing (--staleness 0 and --mode async are deterministic)", p->dp.staleness);
    return DP_OK;
}

/* Pipeline parallelism's settings, and what it does not combine with (yet). */
static int check_pipeline(const struct dp_train_params *p) {
    const struct dp_train_dp *d = &p->dp;
    const int G = d->inter ? d->workers * dp_comm_world(d->inter) : d->workers;
    if ((d->pp < 1 || d->pp > G || G % d->pp) && d->inter)
        return dp_seterr(DP_EINVAL, "--pp must divide the job's %d workers (processes x --workers) into stages "
                         "(got --pp %d)", G, d->pp);
    if (d->pp < 1 || d->pp > G || G % d->pp)
        return dp_seterr(DP_EINVAL, "--pp must divide --workers into stages (got --pp %d with %d workers)", d->pp, G);
    if (d->pp > 1 && d->inter && d->workers > 1)
        return dp_seterr(DP_ENOTSUP, "--pp across processes needs one worker per process (--workers 1 under "
                         "mpirun; got %d): the stages' messages go between processes", d->workers);
    if (d->micro_batches < 0 || d->micro_batches > 4096)
        return dp_seterr(DP_EINVAL, "--micro-batches must be in 1..4096 (got %d)", d->micro_batches);
    if (d->pp_schedule < 0 || d->pp_schedule >= DP_PIPE_SCHEDULE_COUNT)
        return dp_seterr(DP_EINVAL, "unknown pipeline schedule %d", d->pp_schedule);
    if (d->pp == 1) return d->micro_batches > 1 ? dp_seterr(DP_EINVAL, "--micro-batches is --pp's option (a pipeline's "
                                                             "micro-batches; without one, --accum)")
                                                : DP_OK;
    if (d->accum > 1)
        return dp_seterr(DP_EINVAL, "--pp takes --micro-batches, not --accum: a pipeline accumulates the gradients "
                         "of its micro-batches (for a larger step, raise --batch)");
    const char *no = d->zero && d->inter ? "--zero 1 across processes"
                     : d->balance ? "--balance"
                     : d->zero_unit_bytes ? "--zero-unit-mb"
                     : d->compress.kind != DP_COMPRESS_NONE ? "--compress"
                     : d->backup ? "--backup-workers"
                     : d->async || d->staleness >= 0 ? "the parameter server"
                     : NULL;
    if (d->zero >= 2)
        return dp_seterr(DP_ENOTSUP, "--pp does not work with --zero %d: each stage would reduce-scatter its gradient "
                         "and gather its parameters once per micro-batch; --zero 1 shards each stage's optimizer "
                         "state over its replicas", d->zero);
    if (no) return dp_seterr(DP_ENOTSUP, "--pp does not work with %s yet", no);
    return DP_OK;
}

/* Tensor parallelism's settings, and what it does not combine with (yet). */
static int check_tensor(const struct dp_train_params *p) {
    const struct dp_train_dp *d = &p->dp;
    if (d->tp < 1 || d->tp > d->workers || d->workers % d->tp)
        return dp_seterr(DP_EINVAL, "--tp must divide %s into tensor groups (got --tp %d with %d worker%s)",
                         d->inter ? "each process's --workers (a group is threads of one process)" : "--workers", d->tp,
                         d->workers, d->workers > 1 ? "s" : "");
    if (d->tp == 1) return DP_OK;
    if (d->pp > 1 && d->workers % (d->pp * d->tp))
        return dp_seterr(DP_EINVAL, "--pp %d x --tp %d must divide --workers (got %d): each stage of each replica is "
                         "a tensor group", d->pp, d->tp, d->workers);
    if (d->deterministic)
        return dp_seterr(DP_ENOTSUP, "--tp does not work with --deterministic: a split layer's output sums %d partial "
                         "products (one per tensor rank) where one worker sums one, so no layout gives one worker's "
                         "bits (without --deterministic the runs agree within float rounding)", d->tp);
    if (d->zero >= 2)
        return dp_seterr(DP_ENOTSUP, "--tp does not work with --zero %d yet: every worker holds the whole model; "
                         "--zero 1 shards the optimizer state", d->zero);
    const char *no = d->inter && d->pp > 1 ? "--pp under mpirun (a stage per process; tensor groups are threads)"
                     : d->balance ? "--balance"
                     : d->zero_unit_bytes ? "--zero-unit-mb"
                     : d->compress.kind != DP_COMPRESS_NONE ? "--compress"
                     : d->backup ? "--backup-workers"
                     : d->async || d->staleness >= 0 ? "the parameter server"
                     : NULL;
    if (no) return dp_seterr(DP_ENOTSUP, "--tp does not work with %s yet", no);
    return DP_OK;
}

int dp__check_params(const struct dp_train_params *p) {
    int rc;
    if (p->run.epochs < 0) return dp_seterr(DP_EINVAL, "--epochs must be >= 0 (got %lld)", (long long)p->run.epochs);
    if (p->run.batch <= 0 || p->run.batch > (1 << 20))
        return dp_seterr(DP_EINVAL, "--batch must be in 1..1048576 (got %lld)", (long long)p->run.batch);
    if (p->dp.workers < 1 || p->dp.workers > 256)
        return dp_seterr(DP_EINVAL, "--workers must be in 1..256 (got %d)", p->dp.workers);
    if (p->dp.accum < 1 || p->dp.accum > 1 << 16) return dp_seterr(DP_EINVAL, "--accum must be in 1..65536 (got %d)", p->dp.accum);
    if (!(p->sched.base_lr > 0.0f) || !isfinite(p->sched.base_lr))
        return dp_seterr(DP_EINVAL, "--lr must be a positive number (got %g)", (double)p->sched.base_lr);
    if (p->dp.comm_progress < DP_PROGRESS_THREAD || p->dp.comm_progress > DP_PROGRESS_AUTO)
        return dp_seterr(DP_EINVAL, "comm_progress must be thread, caller or auto (got %d)", p->dp.comm_progress);
    if (p->run.threads < 1 || p->run.threads > 256)
        return dp_seterr(DP_EINVAL, "--threads must be in 1..256 (got %d)", p->run.threads);
    if (p->run.clip_norm < 0) return dp_seterr(DP_EINVAL, "--clip must be >= 0 (got %g)", p->run.clip_norm);
    if (!(p->data.norm_std > 0)) return dp_seterr(DP_EINVAL, "normalisation std must be > 0");
    if (p->run.max_steps < 0) return dp_seterr(DP_EINVAL, "--max-steps must be >= 0");
    if (p->dp.check_replicas < 0) return dp_seterr(DP_EINVAL, "--check-replicas must be >= 0");
    if (p->dp.balance < 0 || p->dp.balance > 1000000)
        return dp_seterr(DP_EINVAL, "--balance must be in 1..1000000 steps between re-plans (got %lld)",
                         (long long)p->dp.balance);
    if (p->dp.comm_timeout < 0) return dp_seterr(DP_EINVAL, "--comm-timeout must be >= 0");
    int G = p->dp.inter ? p->dp.workers * dp_comm_world(p->dp.inter) : p->dp.workers;
    if (p->dp.backup && (p->dp.backup_workers < 0 || p->dp.backup_workers >= G))
        return dp_seterr(DP_EINVAL, "--backup-workers must be in 0..%d (fewer than the %d worker%s; got %d)",
                         G - 1, G, G > 1 ? "s" : "", p->dp.backup_workers);
    /* across processes the step goes through rank 0 (dp_backup_star): one
     * worker per process, as a slot shared by threads and messages between
     * processes would make two protocols of one step */
    if (p->dp.backup && p->dp.inter && p->dp.workers > 1)
        return dp_seterr(DP_ENOTSUP, "--backup-workers across processes needs one worker per process "
                         "(--workers 1 under mpirun; got %d)", p->dp.workers);
    /* which ranks are accepted depends on timing: not deterministic */
    if (p->dp.backup && p->dp.deterministic && p->dp.backup_workers > 0)
        return dp_seterr(DP_EINVAL, "--backup-workers %d does not work with --deterministic: which ranks are "
                         "dropped depends on timing (only --backup-workers 0 does)", p->dp.backup_workers);
    if ((rc = dp__check_ps(p))) return rc;
    if ((rc = check_pipeline(p)) || (rc = check_tensor(p))) return rc;
    if (p->dp.zero < 0 || p->dp.zero > 3) return dp_seterr(DP_EINVAL, "--zero must be in 0..3 (got %d)", p->dp.zero);
    /* stages 2 and 3 reduce-scatter each bucket: the compressed forms are all-reduces or all-gathers */
    if (p->dp.zero >= 2 && p->dp.compress.kind != DP_COMPRESS_NONE)
        return dp_seterr(DP_ENOTSUP, "--compress does not work with --zero %d (it reduce-scatters each bucket; "
                         "the compressed forms are all-reduces): use --zero 1", p->dp.zero);
    if (p->dp.zero >= 2 && p->dp.zero_scatter)
        return dp_seterr(DP_EINVAL, "--zero-reduce is --zero 1's option (--zero %d always reduce-scatters each "
                         "bucket)", p->dp.zero);
    if (p->dp.zero && (p->dp.async || p->dp.staleness >= 0))
        return dp_seterr(DP_EINVAL, "--zero does not work with %s: the parameter server already holds the only "
                         "optimizer state", p->dp.staleness >= 0 ? "--staleness" : "--mode async");
    if (p->dp.zero && p->dp.backup)
        return dp_seterr(DP_ENOTSUP, "--zero does not work with --backup-workers (their steps do not go through "
                         "the reducer)");
    if (p->dp.zero_gather < DP_ZERO_GATHER_AUTO || p->dp.zero_gather > DP_ZERO_GATHER_AHEAD)
        return dp_seterr(DP_EINVAL, "zero_gather must be auto, step or ahead (got %d)", p->dp.zero_gather);
    if (p->dp.zero_gather && p->dp.zero != 1)
        return dp_seterr(DP_EINVAL, "--zero-gather is --zero 1's option (this run is --zero %d)", p->dp.zero);
    if (p->dp.zero_scatter && p->dp.compress.kind != DP_COMPRESS_NONE)
        return dp_seterr(DP_ENOTSUP, "--compress does not work with --zero-reduce scatter (the compressed forms "
                         "are all-reduces): use --zero-reduce allreduce");
    if (p->dp.algo < 0 || p->dp.algo >= DP_ALGO_COUNT) return dp_seterr(DP_EINVAL, "unknown all-reduce algorithm");
    /* Deterministic mode promises the same bits for any worker count.  Every
     * compression scheme rounds (bf16, fp16), selects (topk, sign) or
     * projects (powersgd) each worker's partial gradient, which depends on
     * how the batch is split, so none can keep that promise; for a fixed
     * worker count they are all reproducible (sums in a fixed order). */
    if (p->dp.compress.kind != DP_COMPRESS_NONE && p->dp.deterministic)
        return dp_seterr(DP_EINVAL, "--compress %s does not work with --deterministic: the compressed gradient "
                         "depends on how the batch is split across workers (runs with a fixed --workers are "
                         "reproducible without --deterministic)", dp_compress_name(p->dp.compress.kind));
    if (p->dp.compress.kind != DP_COMPRESS_NONE && p->dp.backup)
        return dp_seterr(DP_EINVAL, "--compress does not work with --backup-workers (their steps do not go "
                         "through the reducer)");
    if (p->dp.deterministic && (p->dp.det_chunk < 0 || p->dp.det_chunk > p->run.batch))
        return dp_seterr(DP_EINVAL, "--det-chunk must be in 1..batch (got %lld)", (long long)p->dp.det_chunk);
    /* Deterministic mode stops at the first non-finite chunk gradient (it
     * cannot be turned into fixed point); a request to skip such steps
     * would be silently ignored. */
    if (p->dp.deterministic && p->dp.skip_nonfinite)
        return dp_seterr(DP_EINVAL, "--skip-nonfinite does not work with --deterministic (a non-finite "
                         "gradient always stops a deterministic run): use one or the other");
    rc = dp_optim_check(&p->optim);
    if (rc) return rc;
    struct dp_jitter j;
    if (p->sim.simulate_slow && (rc = dp_parse_simulate_slow(p->sim.simulate_slow, 0, NULL))) return rc;
    if (p->sim.simulate_jitter && (rc = dp_parse_simulate_jitter(p->sim.simulate_jitter, &j))) return rc;
    /* total_steps may still be 0 here: it is filled from the epoch count
     * once the data is loaded, and checked again then (dp_trainer_init). */
    struct dp_sched s = p->sched;
    if (s.total_steps <= 0) s.total_steps = s.warmup_steps + 1;
    return dp_sched_check(&s);
}

/* The schedule against the run's real length, known only once the data is
 * loaded (check_params could only use a placeholder): epochs x
 * steps_per_epoch optimizer steps.  A cosine warmup that is not shorter
 * than the run would end the run before the rate decays at all.  A run of
 * 0 epochs takes no step, so its schedule is never used. */
int dp__check_schedule(const struct dp_trainer *t) {
    const struct dp_sched *s = &t->p.sched;
    if (t->p.run.epochs == 0) return DP_OK;
    if (s->kind == DP_SCHED_COSINE && s->warmup_steps >= s->total_steps) {
        if (s->total_steps == t->steps_per_epoch * t->p.run.epochs)
            return dp_seterr(DP_EINVAL, "--warmup %lld must be shorter than the run, which has %lld optimizer "
                             "steps (%lld epoch%s x %lld steps): the learning rate would never decay",
                             (long long)s->warmup_steps, (long long)s->total_steps, (long long)t->p.run.epochs,
                             t->p.run.epochs > 1 ? "s" : "", (long long)t->steps_per_epoch);
        return dp_seterr(DP_EINVAL, "cosine schedule: warmup_steps %lld must be shorter than total_steps %lld",
                         (long long)s->warmup_steps, (long long)s->total_steps);
    }
    return dp_sched_check(s);
}

/* Chunks cost two ways (measured, docs/results.md "What deterministic mode
 * costs"): a small chunk means GEMMs of few rows and one conversion pass over
 * the gradient per few samples (mlp at P = 2: 0.44x of ordinary training with
 * chunks of 8, 0.72x with 32); a large chunk leaves fewer chunks than workers
 * (a worker with no chunk idles).  A quarter of the batch keeps 4 workers busy
 * at any batch and is 32 at the default batch of 128; beyond 32 rows the
 * GEMMs gain little, and below 8 they lose much. */
int64_t dp_det_chunk_auto(int64_t batch) {
    int64_t c = batch / 4;
    if (c > 32) c = 32;
    if (c < 8) c = 8;
    return c < batch ? c : batch;
}

/* Measured on 2 cores with 2 workers of 1 thread (docs/results.md, the
 * quiet runs of caller progress and of pinned workers): without a third
 * thread per worker mlp ran 1.12-1.15x as fast and cnn and resnet within a
 * few percent either way, the same bits.  With a spare core per worker the
 * communication thread reduces beside the compute instead of between its
 * layers; with more compute threads than cores the thread path is the one
 * measured and tested under load. */
/* The process's compute threads, what the auto rules below weigh against its CPUs. */
static int64_t compute_threads(int workers, int threads) { return (int64_t)workers * (threads > 0 ? threads : 1); }

int dp_train_progress_auto(int workers, int threads, int cpus) {
    int64_t busy = compute_threads(workers, threads);
    return workers > 1 && busy <= cpus && cpus < busy + workers ? DP_PROGRESS_CALLER : DP_PROGRESS_THREAD;
}

int dp_train_prefetch_auto(int workers, int threads, int cpus) { return compute_threads(workers, threads) >= cpus ? 0 : 2; }
