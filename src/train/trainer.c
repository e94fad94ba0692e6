/* The training loop: one or P data-parallel workers.
 *
 * Each worker is a thread holding a full replica (parameters, gradients,
 * optimizer state) and its own loader that yields its share of every global
 * batch.  One optimizer step:
 *
 *   for each of the `accum` micro-batches:
 *       loader.next -> forward -> backward: sum over the worker's samples of
 *       the per-sample gradients, each times 1/N (N = samples in the global
 *       batch, all workers; with accumulation the 1/N is applied at the end)
 *       on the last micro-batch the reducer all-reduces (sums) gradient buckets
 *       as backward finishes them, overlapping the rest of backward
 *   wait for all buckets -> non-finite check -> [clip] -> lr = schedule(step)
 *   -> optimizer step
 *
 * Summing over workers what each computed as (1/N) * its per-sample sum
 * gives the gradient of the mean loss over the global batch whatever the
 * split: P workers with global batch N train the
 * same model as one worker with batch N, to float rounding.  The position
 * (epoch, step in epoch) and the seed fix the data order, so a checkpoint
 * resumes the very same sequence of batches.  With P = 1 the single worker
 * runs in the caller's thread and no collective does any work.
 *
 * Positions.  A classifier's loss has one term per sample; a language
 * model's has one per position, T per window (the model's output is (T, V)).
 * The loss is the mean over every term of the global batch, so N above is
 * samples x positions per sample (t->pos, 1 for classifiers: their scale is
 * the same bits as before), and every reported loss is per term.
 *
 * Text.  A gpt model trains on a token file (--data tokens.bin): the loader
 * draws training windows by (seed, epoch, global index), and the end-of-epoch
 * evaluation runs on the fixed validation windows (docs/text.md). */
#include "core/core_impl.h"
#include "run_folder.h"
#include "trainer.h"

const struct dp_model *dp_trainer_model(const struct dp_trainer *t) { return t->model; }

const struct dp_dataset *dp_trainer_test_set(const struct dp_trainer *t) { return &t->test; }

const char *dp_trainer_data_note(const struct dp_trainer *t) { return t->data_note; }
const char *dp_trainer_layout(const struct dp_trainer *t) { return t->layout; }
int64_t dp_trainer_activation_bytes(const struct dp_trainer *t, int worker) {
    if (worker < 0 || worker >= t->P) return -1;
    const struct worker *w = &t->w[worker];
    return w->pipe ? dp__pipe_activation_bytes(w) : (int64_t)w->rep.arena.high_water;
}

int64_t dp_trainer_slab_bytes(const struct dp_trainer *t, int worker) {
    if (worker < 0 || worker >= t->P) return -1;
    const struct worker *w = &t->w[worker];
    const size_t n = sizeof(float) * (size_t)t->model->num_params;
    const int64_t a = dp_resident_bytes(w->rep.params, n), b = dp_resident_bytes(w->rep.grads, n);
    return a < 0 || b < 0 ? -1 : a + b;
}

int dp_trainer_stages(const struct dp_trainer *t, const int **first) {
    *first = t->pp > 1 ? t->pp_first : NULL;
    return t->pp > 1 ? t->pp : 0;
}

int dp_trainer_comm_progress(const struct dp_trainer *t) { return t->comm_progress; }
int dp_trainer_prefetch(const struct dp_trainer *t) { return t->p.data.prefetch; }
struct dp_replica *dp_trainer_replica(struct dp_trainer *t) { return &t->w[0].rep; }
int64_t dp_trainer_live_bytes(const struct dp_trainer *t, int worker) {
    if (worker < 0 || worker >= t->P) return -1;
    return dp_sync_live_bytes(&t->w[worker].sync);
}
int64_t dp_trainer_inflight_bytes(const struct dp_trainer *t) { return dp_sync_inflight_bytes(&t->w[0].sync); }
int dp_trainer_zero_counts(const struct dp_trainer *t, int worker, struct dp_zero_counts *c) {
    if (worker < 0 || worker >= t->P) return -1;
    *c = dp_sync_zero_counts(&t->w[worker].sync);
    return 0;
}
uint64_t dp_trainer_param_hash(const struct dp_trainer *t) { return dp_replica_hash(&t->w[0].rep); }
const char *dp_trainer_note(const struct dp_trainer *t) { return t->note[0] ? t->note : NULL; }
int64_t dp_trainer_stopped(const struct dp_trainer *t) { return t->stopped; }

void dp_trainer_free(struct dp_trainer *t) {
    if (!t) return;
    dp__snapshot_free(t); /* (first: its writer reads the trainer) */
    for (int r = 0; t->w && r < t->P; r++) {
        struct worker *w = &t->w[r];
        dp_timeline_free(&w->tl);
        dp_free(w->buf_save);
        dp_free(w->arrival);
        dp_free(w->waits);
        dp_free(w->bal_rate);
        dp_free(w->bal_fix);
        dp_free(w->bal_fixu);
        dp_free(w->bal_share);
        dp_free(w->bal_new);
        dp_free(w->bal_buf);
        dp_free(w->dropped);
        dp_free(w->etok);
        dp_free(w->etgt);
        dp_free(w->ex);
        dp__pipe_worker_free(w); /* (its messages in flight released on the comm first) */
        dp__tp_worker_free(w);
        dp_comm_free(w->comm);
        dp_loader_free(w->loader);
        dp_sync_free(&w->sync); /* (after the comm: nothing left in flight writes into its buffers) */
        dp_replica_free(&w->rep);
    }
    dp_free(t->w);
    dp_free(t->slow_factor);
    dp_free(t->last_count);
    dp_free(t->rank_samples);
    dp_free(t->share_samples);
    dp_free(t->dropped_count);
    dp_free(t->efstate);
    dp_backup_star_free(t->star); /* stops rank 0's collector */
    dp_ps_free(t->ps);
    dp_ps_net_free(t->psn);
    dp_backup_slot_free(t->slot);
    dp_comm_thread_world_free(t->world);
    dp__pipe_free(t);
    dp__tp_free(t);
    dp_model_free(t->model);
    dp_dataset_free(&t->train);
    dp_dataset_free(&t->test);
    dp_free(t->norm_mean);
    dp_free(t->norm_std);
    dp_free(t->tok_len);
    dp_free(t->bpe);
    dp_free(t->class_names);
    dp_tokens_free(&t->tokens);
    if (t->metrics) fclose(t->metrics);
    dp_free(t);
}

int dp__trainer_set_fault(struct dp_trainer *t, const struct dp_fault *f) {
    if ((int)f->kind < 0 || f->kind >= DP_FAULT_KIND_COUNT) return dp_seterr(DP_EINVAL, "unknown fault kind %d", (int)f->kind);
    if (t->text && f->kind == DP_FAULT_NAN) /* the fault puts a NaN into the float inputs; a token model has none */
        return dp_seterr(DP_ENOTSUP, "the NaN fault injects into float inputs; model '%s' reads token ids",
                         t->model->spec);
    t->fault = *f;
    return DP_OK;
}

/* The mode of a trainer's parameters (struct dp__mode). */
const struct dp__mode *dp__mode_for(const struct dp_trainer *t) {
    if (t->p.dp.pp > 1) return &dp__mode_pipe;                                /* pipe_step.c */
    if (t->p.dp.async) return t->p.dp.inter ? &dp__mode_ps_net : &dp__mode_ps; /* ps_loop.c */
    if (t->bk_on) return &dp__mode_backup;                                 /* backup.c */
    if (t->p.dp.deterministic) return &dp__mode_det;                          /* det_step.c */
    return &dp__mode_sync;                                                 /* step.c */
}

/* The synchronous family's worker loop: epochs of steps from the resume
 * position, each step the mode's; stops, evaluations, reports and
 * checkpoints between them. */
int dp__step_loop(struct worker *w) {
    struct dp_trainer *t = w->t;
    const struct dp_model *m = t->model;
    /* Every worker advances its own copy of the position; they stay equal
     * because every worker runs the same sequence of steps.  Only rank 0
     * writes the shared fields, and only rank 0 reads them for reporting. */
    int64_t step = w->step, epoch = w->epoch, in_epoch = w->in_epoch;
    int rc = dp_loader_seek(w->loader, epoch, in_epoch);
    if (rc) return rc;
    if (t->G > 1 && (rc = dp__agree_config(w))) return rc;
    /* All replicas start from rank 0's parameters and buffers (ZeRO 3: each
     * worker holds its pieces already, dp_trainer_init, and the slab is
     * gathered bucket by bucket from here on; a pipeline: each its span). */
    int partial = dp_sync_params_partial(&w->sync);
    if ((!partial && (rc = dp_comm_broadcast(w->comm, w->rep.params, m->num_params, DP_DTYPE_F32, 0, DP_ALGO_AUTO))) ||
        (m->num_buffers &&
         (rc = dp_comm_broadcast(w->comm, w->rep.buffers, m->num_buffers, DP_DTYPE_F32, 0, DP_ALGO_AUTO))))
        return rc;
    while (epoch < t->p.run.epochs) {
        double t_start = dp_time();
        w->wait0 = dp_loader_wait_time(w->loader);
        w->loss_sum = w->t_fwd = w->t_bwd = w->t_opt = w->t_comm = w->t_exposed = w->t_wait = w->t_slow = 0;
        if (w->grank == 0) memset(t->last_count, 0, sizeof(int64_t) * (size_t)t->G);
        if (w->grank == 0 && t->bk_on) memset(t->dropped_count, 0, sizeof(int64_t) * (size_t)t->G);
        w->correct = w->seen = w->skipped = 0;
        while (in_epoch < t->batches_per_epoch) {
            int stop = 0;
            if ((t->p.run.max_steps && step >= t->p.run.max_steps) || (rc = dp__stop_agreed(w, step, &stop)) || stop) {
                if (rc) return dp_adderr(rc, "worker %d, step %lld: the stop request", w->grank, (long long)step);
                /* the run's end: as end_epoch's last epoch; --max-steps mid-epoch evaluates first
                 * (a requested stop does not: it is to end soon) */
                double acc = NAN, loss = NAN;
                if ((rc = dp__zsnap_drain(w))) return rc; /* (the last snapshot's file before this one) */
                if (!stop && in_epoch > 0 && (rc = dp__evaluate_shared(w, &acc, &loss))) return rc;
                dp_sync_drop_grads(&w->sync);
                if ((rc = dp_sync_gather(&w->sync, w->rank == 0, NULL)) || (rc = dp__ef_gather_state(w)))
                    return rc;
                if (w->grank == 0) {
                    if (stop) t->stopped = step;
                    if (!isnan(acc)) rc = dp__report_eval(w, step, epoch, acc, loss);
                    if (!rc) rc = dp__checkpoint_write(t);
                } else if (dp__ckpt_serves(t)) rc = dp__ckpt_serve(w); /* while rank 0 writes */
                return rc ? rc : dp_comm_barrier(w->comm);
            }
            int64_t nmicro = t->batches_per_epoch - in_epoch < t->p.dp.accum ? t->batches_per_epoch - in_epoch
                                                                          : t->p.dp.accum;
            int64_t skipped_before = w->skipped;
            double n_step = 0, loss_step = 0;
            w->step = step, w->epoch = epoch;
            double s0[6], ts = dp_time();
            dp__phase_sums(w, s0); /* for the per-step record */
            w->t_step0 = ts;
            rc = t->mode->step(w, nmicro, &w->skipped, &n_step, &loss_step);
            if (rc)
                /* non-finite errors already name the worker and step that caused them */
                return rc == DP_ENONFINITE ? rc : dp_adderr(rc, "worker %d, step %lld", w->grank, (long long)step);
            int last_rank = -1;
            if (t->gather_waits && (rc = dp__gather_waits(w, &last_rank)))
                return dp_adderr(rc, "worker %d, step %lld", w->grank, (long long)step);
            step++;
            in_epoch += nmicro;
            /* every rank re-plans after the same steps (the step count is agreed) */
            if (t->balance && step % t->p.dp.balance == 0 && (rc = dp__rebalance(w)))
                return dp_adderr(rc, "worker %d, step %lld: --balance", w->grank, (long long)step);
            /* --eval-every: every rank evaluates (a collective), rank 0 reports with the step */
            double eacc = NAN, eloss = NAN, step_s = dp_time() - ts;
            if (t->p.io.eval_every && step % t->p.io.eval_every == 0 && (rc = dp__evaluate_shared(w, &eacc, &eloss)))
                return dp_adderr(rc, "worker %d, step %lld: --eval-every", w->grank, (long long)step);
            if (w->grank == 0) {
                if (last_rank >= 0) t->last_count[last_rank]++;
                for (int r = 0; t->bk_on && r < t->G; r++) t->dropped_count[r] += w->dropped[r];
                t->step = step;
                t->step_in_epoch = in_epoch;
                struct dp_event ev = {.kind = DP_EVENT_STEP, .step = step, .epoch = epoch,
                                      .step_in_epoch = (in_epoch + t->p.dp.accum - 1) / t->p.dp.accum,
                                      .lr = dp_sched_lr(&t->p.sched, step - 1),
                                      .samples = (int64_t)n_step, .loss = loss_step,
                                      .skipped = w->skipped - skipped_before,
                                      .last_rank = last_rank, .wait_s = w->step_wait, .slow_s = w->step_slow,
                                      .ndropped = t->bk_on ? w->ndropped : 0};
                dp__emit_event(t, &ev);
                if (t->metrics && (rc = dp__step_record(w, step, epoch, loss_step, n_step, step_s, s0, last_rank, eacc,
                                                    eloss)))
                    return rc;
                if (!isnan(eacc)) {
                    struct dp_event eev = {.kind = DP_EVENT_EVAL, .step = step, .epoch = epoch,
                                           .step_in_epoch = ev.step_in_epoch, .test_acc = eacc, .test_loss = eloss,
                                           .positions = t->pos,
                                           .val_bpb = dp_trainer_bits_per_byte(t, eloss, t->p.data.test_limit)};
                    dp__emit_event(t, &eev);
                }
            }
            if (t->p.dp.check_replicas && step % t->p.dp.check_replicas == 0 && (rc = dp__check_replicas(w))) return rc;
            if ((rc = dp__step_checkpoint(w, step, in_epoch >= t->batches_per_epoch)))
                return dp_adderr(rc, "worker %d, step %lld: --ckpt-every-steps", w->grank, (long long)step);
        }
        if ((rc = dp__end_epoch(w, t_start))) return rc;
        epoch++;
        in_epoch = 0;
    }
    return DP_OK;
}

/* --pin-threads: the calling thread onto the (rank mod n)-th of the n cores
 * in `allowed` (the process's affinity, read once before any worker pins
 * itself).  One compute thread per core and no migrations.  Unpinned, on a
 * 2-core VM, one worker ended backward later at nearly every step of a run
 * (identical work: placement, not noise), and the other waited for it at the
 * step's end; pinned, cnn and resnet came 5-6 points closer to the machine's
 * ceiling (docs/results.md "Pinned workers").  A failure leaves the thread
 * unpinned. */
static void pin_to_core(const cpu_set_t *allowed, int rank) {
    int n = CPU_COUNT(allowed), want = n > 0 ? rank % n : 0, k = 0;
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE && n > 0; c++)
        if (CPU_ISSET(c, allowed) && k++ == want) {
            CPU_SET(c, &one);
            break;
        }
    if (CPU_COUNT(&one)) pthread_setaffinity_np(pthread_self(), sizeof one, &one);
}

void *dp__worker_main(void *arg) {
    struct worker *w = arg;
    cpu_set_t before;
    int pinned = w->t->p.dp.pin_threads && pthread_getaffinity_np(pthread_self(), sizeof before, &before) == 0;
    if (pinned) pin_to_core(&w->t->cpus, w->rank);
    dp_set_num_threads(w->t->p.run.threads);
    w->rc = w->t->mode->loop(w);
    if (pinned) pthread_setaffinity_np(pthread_self(), sizeof before, &before); /* (the caller's, for worker 0) */
    if (w->rc) {
        snprintf(w->err, sizeof w->err, "%s", dp_errmsg());
        /* Unblock every other worker: their pending and future collectives
         * fail at once, so a failure never hangs the run. */
        if (w->rc != DP_ECANCELED) dp_comm_abort(w->comm, w->err);
        dp__backup_abort(w->t, w->err); /* and the backup workers' step slot */
        if (w->rc != DP_ECANCELED) dp__pipe_abort(w->t, w->err); /* and the pipeline stages' reductions */
        if (w->rc != DP_ECANCELED) dp__tp_abort(w->t, w->err);   /* and the tensor groups' sums */
        if (w->t->ps && w->rc != DP_ECANCELED) dp_ps_abort(w->t->ps, w->err); /* and the server's waits */
    }
    return NULL;
}

static int run_workers(struct dp_trainer *t) {
    t->t_origin = dp_time();
    if (t->p.dp.pin_threads && sched_getaffinity(0, sizeof t->cpus, &t->cpus) != 0) CPU_ZERO(&t->cpus);
    for (int r = 0; r < t->P; r++) t->w[r].step = t->step, t->w[r].epoch = t->epoch, t->w[r].in_epoch = t->step_in_epoch;
    if (t->star) { /* rank 0's collector opens the first step */
        int rc = dp_backup_star_start(t->star, t->step);
        if (rc) return rc;
    } else if (t->slot) { /* the step slot opens at the first step */
        dp_backup_slot_start(t->slot, t->step);
    }
    if (t->ps) { /* the server starts from worker 0's state (initial, or the checkpoint's) */
        dp_ps_set_state(t->ps, t->w[0].rep.params, t->w[0].sync.opt.state, t->w[0].sync.opt.step, t->step);
        dp_ps_hist_reset(t->ps);
        atomic_store(&t->ps_next, 0);
    }
    for (int r = 1; r < t->P; r++) {
        if (dp__thread_start(&t->w[r].thread, "dp-worker", dp__worker_main, &t->w[r]) != 0) {
            dp_comm_abort(t->w[0].comm, "cannot start worker threads");
            for (int q = 1; q < r; q++) pthread_join(t->w[q].thread, NULL);
            return dp_seterr(DP_ENOMEM, "cannot start worker thread %d", r);
        }
        t->w[r].started = 1;
    }
    dp__worker_main(&t->w[0]);
    for (int r = 1; r < t->P; r++)
        if (t->w[r].started) pthread_join(t->w[r].thread, NULL), t->w[r].started = 0;
    if (t->p.io.timeline) {
        struct dp_timeline *tls = dp_malloc(sizeof *tls * (size_t)t->P);
        if (!tls) return dp_seterr(DP_ENOMEM, "timeline: out of memory");
        for (int r = 0; r < t->P; r++) tls[r] = t->w[r].tl;
        char path[4096], note[160] = "";
        if (t->base == 0) snprintf(path, sizeof path, "%s", t->p.io.timeline);
        else snprintf(path, sizeof path, "%s.p%d", t->p.io.timeline, t->base / t->P);
        if (t->slow_rank >= 0)
            snprintf(note, sizeof note, "slowest rank: %d, %.3g ms per step behind the earliest", t->slow_rank,
                     t->slow_lag * 1e3);
        int rc = dp_timeline_write(path, tls, t->P, t->base, t->t_origin, note);
        dp_free(tls);
        if (rc && !t->w[0].rc) return rc;
    }
    /* A background checkpoint still in flight (the run's final checkpoint waits for it, so only
     * where a worker failed before that) */
    int snap_rc = dp__snapshot_wait(t);
    char snap_err[512];
    snprintf(snap_err, sizeof snap_err, "%s", snap_rc ? dp_errmsg() : "");
    /* The last step records (after the last epoch's flush, or all of them
     * when --max-steps stops mid-epoch) reach the file here. */
    errno = 0;
    if (t->metrics && !t->w[0].rc && (fflush(t->metrics) != 0 || ferror(t->metrics))) return dp__metrics_error(t);
    /* Report the worker that failed first, not the ones it cancelled. */
    for (int r = 0; r < t->P; r++)
        if (t->w[r].rc && t->w[r].rc != DP_ECANCELED) return dp_seterr(t->w[r].rc, "%s", t->w[r].err);
    for (int r = 0; r < t->P; r++)
        if (t->w[r].rc) return dp_seterr(t->w[r].rc, "%s", t->w[r].err);
    return snap_rc ? dp_seterr(snap_rc, "%s", snap_err) : DP_OK;
}

/* A failed run leaves its failure record in the run folder (run_folder.h):
 * each process writes its own, naming the processes its --comm-timeout
 * found silent, for the supervisor that relaunches the job.  The record is
 * best effort: a folder it cannot reach (not shared with this host) keeps
 * the run's own error in front. */
int dp_trainer_run(struct dp_trainer *t) {
    int rc = run_workers(t);
    if (!rc || !t->p.io.out_dir) return rc;
    char err[2048];
    snprintf(err, sizeof err, "%s", dp_errmsg());
    struct dp_comm *inter = t->p.dp.inter;
    int lost[64], nlost = inter ? dp_comm_lost_ranks(inter, lost, 64) : 0;
    if (nlost > 64) nlost = 64;
    (void)dp__run_folder_failure(t->p.io.out_dir, inter ? dp_comm_rank(inter) : 0, t->w[0].step, err, lost,
                                 nlost < 0 ? 0 : nlost);
    return dp_seterr(rc, "%s", err);
}
