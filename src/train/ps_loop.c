/* The parameter server's loops (--mode async, --staleness): on threads
 * (ps_loop) and across processes (ps_net_loop). */
#include "trainer.h"

/* ---- the parameter server's workers (--mode async, --staleness) --------------------------------
 * The server and its protocol are src/ddp/ps.c.  A worker loops
 *
 *     [SSP: pull for clock c (waits until the slowest is at most s behind)]
 *     read its batch -> forward -> backward (its own batch, see below) -> push
 *
 * and never takes part in a collective until the epoch ends: every worker
 * has pushed its last batch there (a barrier), pulls the server's
 * parameters (all replicas are then equal), and the epoch ends as in sync
 * mode (end_epoch: totals, the shared evaluation, rank 0's report and
 * checkpoint of the server's state).
 *
 * Which batch.  Plain async: the epoch is cut into K = ceil(n / b) batches
 * of b = ceil(batch / P) samples, and the workers claim them from one atomic
 * counter, so a fast worker simply takes more of them (a worker may get none:
 * it waits at the epoch's barrier).  Its gradient is its batch's mean (loss
 * scale 1 / (B x positions)), applied by the server as one update.  SSP and
 * the deterministic replay: worker r's clock c is its share of global batch
 * c, as in sync mode (static: the comparison with sync is exact); SSP's
 * gradient is scaled by 1 / (samples of the global batch x positions), so
 * the server's sum of a clock's P pushes is the global-batch gradient.
 *
 * Clocks: the c-th batch of epoch e is clock e x steps_per_epoch + c (the
 * replay applies push (clock, r) at version clock x P + r). */
/* The parameter server (after the model and any checkpoint are loaded; its
 * state is set from worker 0's when the run starts).  Default shards:
 * min(P, 4): a push holds one shard at a time, so up to S workers apply at
 * once (bench/ps_shards.sh measures it).  Schedule: async applies about P
 * updates per global batch, so lr = sched(version / P) spans the same
 * epochs as sync; SSP's version counts clocks (global batches). */
static int ps_init(struct dp_trainer *t) {
    const struct dp_train_params *p = &t->p;
    struct dp_ps_params pp = {.shards = p->dp.servers ? p->dp.servers : (t->P < 4 ? t->P : 4), .workers = t->P,
                              .staleness = p->dp.staleness, .staleness_lr = p->dp.staleness_lr,
                              .share_batch = p->dp.share_lr ? p->run.batch : 0,
                              .implicit_momentum = p->dp.implicit_momentum,
                              .ordered = p->dp.deterministic && p->dp.staleness < 0,
                              .exact = p->dp.deterministic, .timeout_s = p->dp.comm_timeout, .optim = p->optim,
                              .sched = p->sched, .lr_div = p->dp.staleness < 0 ? t->P : 1};
    if (p->dp.servers > t->model->num_params)
        return dp_seterr(DP_EINVAL, "--servers must be in 1..%lld (the parameters of '%s'; got %d)",
                         (long long)t->model->num_params, t->model->spec, p->dp.servers);
    if (t->step_in_epoch != 0)
        return dp_seterr(DP_ENOTSUP, "the parameter server resumes only from an epoch boundary (the checkpoint "
                         "is at step %lld of epoch %lld)", (long long)t->step_in_epoch, (long long)t->epoch + 1);
    t->ps_div = pp.lr_div;
    t->ps_on = 1;
    atomic_init(&t->ps_next, 0);
    atomic_init(&t->ps_samples, 0);
    if (p->dp.inter) { /* server ranks: the last S processes; one shard each (src/ddp/ps_mpi.c) */
        struct dp_ps_net_params np = {.c = p->dp.inter, .servers = t->ps_servers, .n = t->model->num_params,
                                      .batches = t->ps_batches, .ps = pp};
        np.ps.workers = pp.workers = t->ps_W;
        if (p->dp.staleness < 0) np.ps.lr_div = t->ps_div = t->ps_W;
        np.slow = t->slow_factor ? t->slow_factor[t->base] : 1;
        float mu; /* every rank refuses what the servers' dp_ps_init would */
        int rc = dp_ps_momentum(&np.ps, &mu);
        return rc ? rc : dp_ps_net_init(&t->psn, &np);
    }
    t->ps_servers = pp.shards;
    return dp_ps_init(&t->ps, &pp, t->model->num_params);
}

static int ps_batch(struct worker *w, int64_t epoch, int64_t k, double *n, double *loss) {
    struct dp_trainer *t = w->t;
    const struct dp_model *m = t->model;
    int rc;
    const struct dp_loader_batch *lb;
    double td = dp_time();
    if (t->ps_dynamic && (rc = dp_loader_seek(w->loader, epoch, k))) return rc;
    if ((rc = dp_loader_next(w->loader, &lb))) return rc;
    double ta = dp_time();
    dp_timeline_add(&w->tl, "data", 0, w->step, td, ta);
    memset(w->rep.grads, 0, sizeof(float) * (size_t)m->num_params);
    *n = (double)lb->B, *loss = 0;
    w->step_slow = 0;
    if (lb->B == 0) return DP_OK; /* an empty share: an empty push */
    double denom = (double)(t->p.dp.staleness >= 0 ? lb->global_B : lb->B) * (double)t->pos;
    struct dp_batch b = dp__batch_of(lb, 0, lb->B, 0, t->pos, dp_model_num_classes(t->model));
    struct dp_pass pass = {.training = 1, .backward = 1, .seed = t->p.run.seed, .loss_scale = (float)(1.0 / denom)};
    double mult = 1, stall = 0;
    if (t->simulate) dp__pace_plan(w, &mult, &stall);
    dp__pace_start(w, mult, stall, ta);
    if ((rc = dp_model_run(m, &w->rep, &b, &pass))) return rc;
    dp__pace_sleep(w); /* the simulated slowness, all after backward (no bucket to time) */
    w->step_slow = w->pace_slept;
    w->t_slow += w->step_slow;
    dp_timeline_add(&w->tl, "forward", 0, w->step, ta, ta + pass.t_forward);
    dp_timeline_add(&w->tl, "backward", 0, w->step, ta + pass.t_forward, ta + pass.t_forward + pass.t_backward);
    w->t_fwd += pass.t_forward, w->t_bwd += pass.t_backward;
    w->loss_sum += pass.loss_sum, w->correct += pass.correct, w->seen += lb->B;
    *loss = pass.loss_sum / ((double)lb->B * (double)t->pos);
    if (!isfinite(pass.loss_sum) || dp_any_nonfinite(w->rep.grads, m->num_params))
        return dp_seterr(DP_ENONFINITE, "worker %d, epoch %lld: the loss or gradient of its batch is not finite; "
                         "try a lower --lr or --clip", w->grank, (long long)epoch + 1);
    if (t->p.run.clip_norm > 0) dp_clip_grad_norm(w->rep.grads, m->num_params, t->p.run.clip_norm);
    return DP_OK;
}

/* ps_stop_note: in the parameter server's modes a stop request (a signal)
 * ends the run at the end of the epoch it arrives in, where every push is
 * applied and the checkpoint is exact; a position inside an epoch of async
 * claims could not be resumed.  Across processes the ranks agree through
 * stop_agreed's all-reduce, servers included.  Among threads rank 0 reads
 * the flag before the epoch's barrier and the others read its decision
 * (stop_at) after it; rank 0 writes again only after end_epoch's barrier,
 * which nobody passes before reading. */
static int ps_loop(struct worker *w) {
    struct dp_trainer *t = w->t;
    struct dp_ps *ps = t->ps;
    const int64_t spe = t->steps_per_epoch;
    int64_t epoch = w->epoch, pushes = 0, reported = 0;
    double last_loss = 0;
    int rc = t->ps_dynamic ? DP_OK : dp_loader_seek(w->loader, epoch, 0);
    if (!rc) rc = dp_ps_pull(ps, w->rank, epoch * spe, w->rep.params);
    /* nobody pushes before everyone has pulled the starting version (the
     * replay's pulls must not depend on timing) */
    if (!rc) rc = dp_comm_barrier(w->comm);
    while (!rc && epoch < t->p.run.epochs) {
        double t_start = dp_time();
        w->wait0 = dp_loader_wait_time(w->loader);
        w->loss_sum = w->t_fwd = w->t_bwd = w->t_opt = w->t_comm = w->t_exposed = w->t_wait = w->t_slow = 0;
        w->correct = w->seen = w->skipped = 0;
        for (int64_t c = 0;; c++) {
            int64_t k = t->ps_dynamic ? atomic_fetch_add(&t->ps_next, 1) : c;
            if (k >= (t->ps_dynamic ? t->ps_batches : t->batches_per_epoch)) break;
            int64_t clock = epoch * spe + c;
            double s0[6], ts = dp_time(), n, loss;
            dp__phase_sums(w, s0);
            w->step = pushes; /* the simulated slowness is drawn per (rank, push) */
            if (t->p.dp.staleness >= 0 && (rc = dp_ps_pull(ps, w->rank, clock, w->rep.params))) break;
            double tw = dp_time();
            w->t_wait += tw - ts;
            if ((rc = ps_batch(w, epoch, k, &n, &loss))) break;
            double tp = dp_time();
            rc = dp_ps_push(ps, w->rank, w->rep.grads, n, clock, w->rep.params, &w->ps_stale);
            double te = dp_time();
            w->t_comm += te - tp, w->t_exposed += te - tp;
            dp_timeline_add(&w->tl, "push", 0, w->step, tp, te);
            if (rc) break;
            pushes++;
            long long done = atomic_fetch_add(&t->ps_samples, (long long)n) + (long long)n;
            if (w->grank == 0) {
                /* rank 0's pushes stand for all: samples = what every worker pushed since its last event */
                int64_t in_epoch = t->ps_dynamic ? ((k + 1) * spe + t->ps_batches - 1) / t->ps_batches : c + 1;
                int64_t since = done - reported;
                struct dp_event ev = {.kind = DP_EVENT_STEP, .step = epoch * spe + in_epoch, .epoch = epoch,
                                      .step_in_epoch = in_epoch, .samples = since, .loss = loss,
                                      .lr = dp_sched_lr(&t->p.sched, epoch * spe + in_epoch - 1),
                                      .last_rank = -1, .slow_s = w->step_slow, .staleness = w->ps_stale};
                reported = done, last_loss = loss;
                dp__emit_event(t, &ev);
                /* the record's samples too (so samples / step_s over the records is the job's rate) */
                if (t->metrics && (rc = dp__step_record(w, epoch * spe + in_epoch, epoch, loss, (double)since, te - ts, s0, -1, NAN, NAN)))
                    break;
            }
        }
        if (rc) break;
        /* every push of the epoch is applied once all are here */
        double s0[6], tb = dp_time();
        dp__phase_sums(w, s0);
        /* A stop request ends the run at this epoch's end (ps_stop_note) */
        if (w->rank == 0 && t->p.io.stop && atomic_load(t->p.io.stop)) atomic_store(&t->stop_at, (long long)epoch);
        if ((rc = dp_comm_barrier(w->comm))) break;
        int stop = atomic_load(&t->stop_at) != INT64_MAX; /* (read before end_epoch's barrier) */
        w->ckpt_due |= stop;
        /* The pushes the others made after rank 0's last one: one more step
         * event and record, whose time is rank 0's wait for them, so that
         * the records' samples add up to the epoch and samples / step_s over
         * them is the job's training rate. */
        int64_t tail = (int64_t)atomic_load(&t->ps_samples) - reported;
        if (w->grank == 0 && tail > 0) {
            double te = dp_time();
            w->t_wait += te - tb;
            struct dp_event ev = {.kind = DP_EVENT_STEP, .step = (epoch + 1) * spe, .epoch = epoch,
                                  .step_in_epoch = spe, .samples = tail, .loss = last_loss,
                                  .lr = dp_sched_lr(&t->p.sched, (epoch + 1) * spe - 1), .last_rank = -1,
                                  .staleness = w->ps_stale};
            reported += tail;
            dp__emit_event(t, &ev);
            if (t->metrics && (rc = dp__step_record(w, (epoch + 1) * spe, epoch, last_loss, (double)tail, te - tb, s0, -1, NAN, NAN)))
                break;
        }
        if ((rc = dp_ps_pull(ps, w->rank, (epoch + 1) * spe, w->rep.params))) break;
        if (w->rank == 0) {
            int64_t version;
            dp_ps_get_state(ps, w->rep.params, w->sync.opt.state, &w->sync.opt.step, &version);
            t->step = version;
            dp_ps_hist_get(ps, &t->ps_hist);
            dp_ps_hist_reset(ps);
            atomic_store(&t->ps_next, 0); /* nobody claims before end_epoch's barrier */
        }
        if ((rc = dp__end_epoch(w, t_start))) break;
        epoch++;
        if (stop) {
            if (w->rank == 0) t->stopped = t->step;
            break;
        }
    }
    return rc;
}

/* The parameter server across processes (src/ddp/ps_mpi.c): every process
 * runs this with its one worker thread.  Worker ranks claim batches from
 * server 0 and push-and-pull as ps_loop does (SSP and the replay: static
 * shares, one push per clock, whose reply the server sends when the bound
 * or the turn allows: ps_mpi.c); server ranks serve until
 * every worker has ended the epoch.  Then all ranks, servers included, end
 * the epoch together: the server's parameters, optimizer state and version
 * and the workers' staleness counters are summed over the job (each rank
 * contributes its part, zeros elsewhere: x + 0 = x exactly), so every rank
 * holds the server's state for end_epoch's shared evaluation and rank 0's
 * report and checkpoint (today's format).  The server ranks take part in
 * end_epoch with zero totals (their rank_samples are 0). */
static int ps_net_loop(struct worker *w) {
    struct dp_trainer *t = w->t;
    struct dp_ps_net *net = t->psn;
    const struct dp_model *m = t->model;
    const int64_t spe = t->steps_per_epoch;
    const int server = dp_ps_net_is_server(net);
    int64_t epoch = w->epoch, pushes = 0, reported = 0, nmeta = DP_PS_NET_META(t->G);
    double *meta = dp_malloc(sizeof(double) * (size_t)nmeta);
    if (!meta) return dp_seterr(DP_ENOMEM, "trainer: out of memory");
    /* every rank starts from rank 0's parameters (a resume loaded the same
     * checkpoint everywhere); the servers take their shard of them */
    int rc = dp_comm_broadcast(w->comm, w->rep.params, m->num_params, DP_DTYPE_F32, 0, DP_ALGO_AUTO);
    if (!rc && !server && !t->ps_dynamic) rc = dp_loader_seek(w->loader, epoch, 0); /* static shares */
    if (!rc && server) rc = dp_ps_net_set_state(net, w->rep.params, w->sync.opt.state, w->sync.opt.step, t->step);
    while (!rc && epoch < t->p.run.epochs) {
        double t_start = dp_time();
        w->wait0 = dp_loader_wait_time(w->loader);
        w->loss_sum = w->t_fwd = w->t_bwd = w->t_opt = w->t_comm = w->t_exposed = w->t_wait = w->t_slow = 0;
        w->correct = w->seen = w->skipped = 0;
        if (server) rc = dp_ps_net_serve(net);
        else {
            /* plain async: batch k as claimed from server 0, until -1; SSP and the replay: clock c
             * is this worker's share of global batch c (the loader's static split over the W) */
            int64_t k = 0;
            if (t->ps_dynamic) rc = dp_ps_net_claim(net, &k);
            for (int64_t c = 0; !rc && (t->ps_dynamic ? k >= 0 : c < t->batches_per_epoch); c++) {
                double s0[6], ts = dp_time(), n, loss;
                dp__phase_sums(w, s0);
                w->step = pushes; /* the simulated slowness is drawn per (rank, push) */
                if (!t->ps_dynamic) k = c;
                if ((rc = ps_batch(w, epoch, k, &n, &loss))) break;
                double tp = dp_time();
                int64_t done_k = k;
                rc = dp_ps_net_push(net, w->rep.grads, n, epoch * spe + c, w->rep.params, &w->ps_stale, &k);
                double te = dp_time();
                w->t_comm += te - tp, w->t_exposed += te - tp;
                dp_timeline_add(&w->tl, "push", 0, w->step, tp, te);
                if (rc) break;
                pushes++;
                long long done = atomic_fetch_add(&t->ps_samples, (long long)n) + (long long)n;
                if (w->grank == 0) { /* rank 0's own pushes (the others' are not seen here) */
                    int64_t in_epoch = t->ps_dynamic ? ((done_k + 1) * spe + t->ps_batches - 1) / t->ps_batches
                                                     : c + 1;
                    struct dp_event ev = {.kind = DP_EVENT_STEP, .step = epoch * spe + in_epoch, .epoch = epoch,
                                          .step_in_epoch = in_epoch, .samples = done - reported, .loss = loss,
                                          .lr = dp_sched_lr(&t->p.sched, epoch * spe + in_epoch - 1),
                                          .last_rank = -1, .slow_s = w->step_slow, .staleness = w->ps_stale};
                    reported = done;
                    dp__emit_event(t, &ev);
                    if (t->metrics && (rc = dp__step_record(w, epoch * spe + in_epoch, epoch, loss, n, te - ts, s0, -1, NAN, NAN)))
                        break;
                }
            }
            if (!rc) rc = dp_ps_net_end(net);
        }
        if (rc) break;
        /* a stop request ends the run at this epoch's end (ps_stop_note): agreed by all ranks */
        int stop = 0;
        if ((rc = dp__stop_agreed(w, epoch, &stop))) break;
        w->ckpt_due |= stop;
        /* the server's state on every rank */
        dp_ps_net_collect(net, w->rep.params, w->sync.opt.state, w->sync.opt.state_len, meta);
        if ((rc = dp_comm_allreduce(w->comm, w->rep.params, m->num_params, DP_DTYPE_F32, DP_ALGO_AUTO)) ||
            (w->sync.opt.state_len &&
             (rc = dp_comm_allreduce(w->comm, w->sync.opt.state, w->sync.opt.state_len, DP_DTYPE_F32, DP_ALGO_AUTO))) ||
            (rc = dp_comm_allreduce(w->comm, meta, nmeta, DP_DTYPE_F64, DP_ALGO_AUTO)))
            break;
        int64_t version;
        dp_ps_net_hist(meta, t->G, &t->ps_hist, &version, &w->sync.opt.step);
        t->step = version;
        if ((rc = dp__end_epoch(w, t_start))) break;
        epoch++;
        if (stop) {
            if (w->grank == 0) t->stopped = t->step;
            break;
        }
    }
    dp_free(meta);
    return rc;
}

const struct dp__mode dp__mode_ps = {.name = "parameter server", .setup = ps_init, .loop = ps_loop};
const struct dp__mode dp__mode_ps_net = {.name = "parameter server (processes)", .setup = ps_init, .loop = ps_net_loop};
