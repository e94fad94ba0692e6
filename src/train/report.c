/* What a run reports: events to the caller, metrics.jsonl records, the epoch
 * totals and report, the slowest rank, and the end of an epoch. */
#include "trainer.h"

void dp__emit_event(struct dp_trainer *t, struct dp_event *ev) {
    ev->steps_per_epoch = t->steps_per_epoch;
    ev->epochs = t->p.run.epochs;
    if (t->p.io.on_event) t->p.io.on_event(t->p.io.event_arg, ev);
}

/* After a step: every rank's wait gathered into waits[0..G), and the last
 * arriver.  The rank that arrives last at a reduction finds the others
 * there and waits least (only for the transfer), so the last arriver is the
 * rank with the smallest wait: no clock is compared across ranks (MPI hosts
 * share none).  One all-gather of G doubles per step (a latency-bound
 * collective, not yet benchmarked), only when gather_waits (docs/ddp.md).
 * Exposed (dp/train.h) so that `dptrain calibrate` times this very call. */
int dp_train_gather_waits(struct dp_comm *comm, int G, int rank, double wait, double *waits, int *last) {
    memset(waits, 0, sizeof(double) * (size_t)G);
    waits[rank] = wait;
    int rc = dp_comm_allgather(comm, waits, G, DP_DTYPE_F64, DP_ALGO_AUTO);
    *last = 0;
    for (int r = 1; r < G; r++)
        if (waits[r] < waits[*last]) *last = r;
    return rc;
}
int dp__gather_waits(struct worker *w, int *last) {
    return dp_train_gather_waits(w->comm, w->t->G, w->grank, w->step_wait, w->waits, last);
}

/* Epoch totals over all workers: out[0..4) = loss, correct, seen, skipped;
 * then, per rank r, out[4 + r] = its mean time per step from the step's
 * start to the start of its buckets' reductions (the mean over buckets),
 * and out[4 + G + r] = the samples it took (its shares, as observed). */
static int epoch_totals(struct worker *w, double *out) {
    struct dp_trainer *t = w->t;
    memset(out, 0, sizeof(double) * (size_t)(4 + 2 * t->G));
    out[4 + t->G + w->grank] = (double)w->seen;
    out[0] = w->loss_sum, out[1] = (double)w->correct, out[2] = (double)w->seen, out[3] = (double)w->skipped;
    if (w->tp.rank) out[0] = out[1] = out[2] = out[3] = 0; /* (--tp: a tensor group's samples, counted by its rank 0) */
    int nb = t->p.dp.deterministic || t->bk_on ? 1 : w->sync.red.nb;
    double a = 0;
    for (int i = 0; i < nb; i++) a += w->arrival[i];
    if (nb > 0 && w->arrival_steps > 0) out[4 + w->grank] = a / nb / (double)w->arrival_steps;
    memset(w->arrival, 0, sizeof(double) * (size_t)(w->sync.red.nb + 1));
    w->arrival_steps = 0;
    return dp_comm_allreduce(w->comm, out, 4 + 2 * t->G, DP_DTYPE_F64, DP_ALGO_AUTO);
}

/* The straggler: the rank whose reductions start latest after its step's
 * start, on average, and its lag behind the earliest rank (s per step).
 * Every rank waits for the last one in each collective, so this lag is what
 * the job loses to its slowest rank per step. */
static void straggler(const struct dp_trainer *t, const double *arr, int *rank, double *lag) {
    int slow = 0, fast = 0;
    for (int r = 1; r < t->G; r++) {
        if (arr[r] > arr[slow]) slow = r;
        if (arr[r] < arr[fast]) fast = r;
    }
    *rank = t->G > 1 ? slow : -1;
    *lag = t->G > 1 ? arr[slow] - arr[fast] : 0;
}

/* A failed write to metrics.jsonl (a full disk, an I/O error): an error of
 * the run, not silently lost metrics.  Called right after the failing call,
 * so errno is its reason. */
int dp__metrics_error(const struct dp_trainer *t) {
    int e = errno;
    return dp_seterr(DP_EIO, "metrics: cannot write %s: %s", t->metrics_path, e ? strerror(e) : "I/O error");
}

/* The end of a metrics record: its closing brace and newline, then the flush that hands the
 * whole record to the file in one write (src/train/run_folder.c). */
static int metrics_end(const struct dp_trainer *t) {
    errno = 0;
    if (fputs("}\n", t->metrics) < 0 || fflush(t->metrics) != 0) return dp__metrics_error(t);
    return DP_OK;
}

/* The test figures of a metrics record, "" where there is no test set (NaN is not JSON). */
static const char *test_fields(char *buf, size_t cap, double loss, double acc, int regression, double bpb) {
    if (isnan(loss)) return "";
    if (!isnan(bpb)) /* a language model: its loss also in bits per byte */
        snprintf(buf, cap, "\"test_loss\": %.6f, \"test_acc\": %.6f, \"val_bpb\": %.6f, ", loss, acc, bpb);
    else if (regression) /* acc holds the mean absolute error (eval.c) */
        snprintf(buf, cap, "\"test_loss\": %.6g, \"test_rmse\": %.6g, \"test_mae\": %.6g, ", loss, sqrt(loss), acc);
    else
        snprintf(buf, cap, "\"test_loss\": %.6f, \"test_acc\": %.6f, ", loss, acc);
    return buf;
}

/* Rank 0: an evaluation outside the epoch's end (a run --max-steps stopped mid-epoch): its
 * event and an "eval" record. */
int dp__report_eval(struct worker *w, int64_t step, int64_t epoch, double acc, double loss) {
    struct dp_trainer *t = w->t;
    struct dp_event ev = {.kind = DP_EVENT_EVAL, .step = step, .epoch = epoch, .test_acc = acc, .test_loss = loss,
                          .positions = t->pos, .step_in_epoch = (t->step_in_epoch + t->p.dp.accum - 1) / t->p.dp.accum,
                          .regression = t->regression, .val_bpb = dp_trainer_bits_per_byte(t, loss, t->p.data.test_limit)};
    dp__emit_event(t, &ev);
    if (!t->metrics || isnan(loss)) return DP_OK;
    errno = 0;
    char tf[160];
    test_fields(tf, sizeof tf, loss, acc, t->regression, ev.val_bpb);
    tf[strlen(tf) - 2] = 0; /* (the record's last fields: no ", ") */
    if (fprintf(t->metrics, "{\"kind\": \"eval\", \"step\": %lld, \"epoch\": %lld, %s", (long long)step,
                (long long)epoch + 1, tf) < 0)
        return dp__metrics_error(t);
    return metrics_end(t);
}

/* Rank 0 at the end of an epoch: the event, the metrics record and the
 * checkpoint.  dt: the epoch's training time (evaluation excluded); tot as
 * epoch_totals gives it; test_acc and test_loss as evaluate_shared gives
 * them; st: the epoch's reductions (dp_sync_stats_take). */
static int report_epoch(struct worker *w, double dt, const double *tot, double test_acc, double test_loss,
                        const struct dp_sync_stats *st) {
    struct dp_trainer *t = w->t;
    int rc;
    t->epoch++;
    t->step_in_epoch = 0;
    int64_t sstep = t->ps_on ? t->step / t->ps_div : t->step; /* the server's version counts pushes */
    struct dp_event ev = {.kind = DP_EVENT_EPOCH, .step = t->step, .epoch = t->epoch,
                          .lr = dp_sched_lr(&t->p.sched, sstep > 0 ? sstep - 1 : 0)};
    ev.positions = t->pos;
    ev.regression = t->regression;
    ev.val_bpb = dp_trainer_bits_per_byte(t, test_loss, t->p.data.test_limit);
    ev.loss = tot[2] > 0 ? tot[0] / (tot[2] * (double)t->pos) : NAN;
    ev.train_acc = tot[2] > 0 ? tot[1] / (tot[2] * (double)t->pos) : NAN;
    ev.samples_per_s = dt > 0 ? tot[2] / dt : 0;
    ev.skipped = (int64_t)tot[3];
    ev.epoch_time = dt;
    ev.t_data = dp_loader_wait_time(w->loader) - w->wait0;
    ev.t_fwd = w->t_fwd, ev.t_bwd = w->t_bwd, ev.t_opt = w->t_opt;
    ev.t_comm = w->t_comm + st->t_comm, ev.t_comm_exposed = w->t_exposed + st->t_exposed;
    if (st->reduce_steps > 0) { /* per reducing step */
        double k = (double)st->reduce_steps;
        ev.bytes_sent = st->bytes_sent / k, ev.bytes_recv = st->bytes_recv / k, ev.bytes_fp32 = st->bytes_fp32 / k;
    }
    ev.t_compress = st->t_compress, ev.t_decompress = st->t_decompress;
    straggler(t, tot + 4, &ev.slow_rank, &ev.slow_lag);
    t->slow_rank = ev.slow_rank, t->slow_lag = ev.slow_lag;
    ev.test_acc = test_acc, ev.test_loss = test_loss;
    if (t->balance) {
        /* the plan in force, as samples of a full global batch */
        for (int r = 0; r < t->G; r++) {
            int64_t off;
            dp_loader_split(t->p.run.batch, t->p.run.batch, t->bal_align, t->G, r, w->bal_share, &off, &t->share_samples[r]);
        }
        for (int r = 0; r < t->G; r++) t->rank_samples[r] = (int64_t)tot[4 + t->G + r];
        ev.shares = t->share_samples, ev.rank_samples = t->rank_samples, ev.nshares = t->G;
    }
    if (t->bk_on) ev.dropped_steps = t->dropped_count, ev.nshares = t->G;
    if (t->ps_on) { /* plain async: a faster worker takes more batches (server ranks: 0) */
        for (int r = 0; r < t->G; r++) t->rank_samples[r] = (int64_t)tot[4 + t->G + r];
        ev.rank_samples = t->rank_samples, ev.nshares = t->G;
    }
    const struct dp_ps_hist *sh = &t->ps_hist;
    if (t->ps_on) {
        ev.pushes = sh->count, ev.stale_max = sh->max;
        ev.stale_mean = sh->count ? sh->sum / (double)sh->count : 0;
        ev.stale_p50 = dp_ps_hist_quantile(sh, 0.5), ev.stale_p99 = dp_ps_hist_quantile(sh, 0.99);
    }
    if (t->metrics) {
        char tf[160];
        errno = 0;
        if (fprintf(t->metrics,
                "{\"kind\": \"epoch\", \"epoch\": %lld, \"step\": %lld, \"workers\": %d, \"lr\": %.6g, "
                "\"train_loss\": %.6f, \"train_acc\": %.6f, %s"
                "\"samples_per_s\": %.1f, \"epoch_time_s\": %.3f, \"data_wait_s\": %.3f, "
                "\"forward_s\": %.3f, \"backward_s\": %.3f, \"comm_s\": %.3f, \"comm_exposed_s\": %.3f, "
                "\"optimizer_s\": %.3f, \"skipped_steps\": %lld, \"slowest_rank\": %d, "
                "\"slowest_lag_s\": %.6f, \"param_hash\": \"%016llx\", \"rank_arrival_s\": [",
                (long long)ev.epoch, (long long)ev.step, t->G, (double)ev.lr, ev.loss, ev.train_acc,
                test_fields(tf, sizeof tf, ev.test_loss, ev.test_acc, t->regression, ev.val_bpb), ev.samples_per_s, dt, ev.t_data, ev.t_fwd, ev.t_bwd, ev.t_comm,
                ev.t_comm_exposed, ev.t_opt, (long long)ev.skipped, ev.slow_rank, ev.slow_lag,
                (unsigned long long)(dp_sync_params_partial(&w->sync) ? w->zhash : dp_replica_hash(&w->rep))) < 0)
            return dp__metrics_error(t);
        for (int r = 0; r < t->G; r++)
            if (fprintf(t->metrics, "%s%.6f", r ? ", " : "", tot[4 + r]) < 0) return dp__metrics_error(t);
        /* rank 0's wait and simulated sleep in the epoch; with gather_waits,
         * the steps in which each rank arrived last */
        if (fprintf(t->metrics, "], \"wait_s\": %.3f, \"slow_s\": %.3f", w->t_wait, w->t_slow) < 0)
            return dp__metrics_error(t);
        /* gradient traffic per reducing step (rank 0) and compression */
        if (fprintf(t->metrics, ", \"compress\": \"%s\", \"bytes_sent\": %.0f, \"bytes_recv\": %.0f, "
                    "\"compress_ratio\": %.4g, \"compress_s\": %.4f, \"decompress_s\": %.4f",
                    dp_compress_name(t->p.dp.compress.kind), ev.bytes_sent, ev.bytes_recv,
                    ev.bytes_sent > 0 ? ev.bytes_fp32 / ev.bytes_sent : 1.0, ev.t_compress, ev.t_decompress) < 0)
            return dp__metrics_error(t);
        for (int r = 0; t->gather_waits && r < t->G; r++)
            if (fprintf(t->metrics, "%s%lld%s", r ? ", " : ", \"last_rank_steps\": [", (long long)t->last_count[r],
                        r == t->G - 1 ? "]" : "") < 0)
                return dp__metrics_error(t);
        /* --balance: the plan at the epoch's end and the samples each rank took */
        for (int r = 0; t->balance && r < t->G; r++)
            if (fprintf(t->metrics, "%s%lld%s", r ? ", " : ", \"shares\": [", (long long)t->share_samples[r],
                        r == t->G - 1 ? "]" : "") < 0)
                return dp__metrics_error(t);
        for (int r = 0; (t->balance || t->ps_on) && r < t->G; r++)
            if (fprintf(t->metrics, "%s%lld%s", r ? ", " : ", \"rank_samples\": [", (long long)t->rank_samples[r],
                        r == t->G - 1 ? "]" : "") < 0)
                return dp__metrics_error(t);
        /* backup workers: the steps in which each rank's gradient was dropped */
        for (int r = 0; t->bk_on && r < t->G; r++)
            if (fprintf(t->metrics, "%s%lld%s", r ? ", " : ", \"dropped_steps\": [", (long long)t->dropped_count[r],
                        r == t->G - 1 ? "]" : "") < 0)
                return dp__metrics_error(t);
        /* parameter server: the epoch's staleness histogram (bucket k: pushes of staleness k, up to
         * the largest nonempty one; overflow: staleness >= DP_PS_HIST_BUCKETS; max exact) */
        if (t->ps_on) {
            /* flat keys: metrics.jsonl lines are flat objects (dptrain plot reads them) */
            if (fprintf(t->metrics, ", \"mode\": \"%s\", \"servers\": %d, \"stale_pushes\": %lld, "
                        "\"stale_mean\": %.4f, \"stale_p50\": %lld, \"stale_p99\": %lld, \"stale_max\": %lld, "
                        "\"stale_overflow\": %lld, \"stale_hist\": [",
                        t->p.dp.staleness >= 0 ? "ssp" : "async", t->ps_servers, (long long)ev.pushes,
                        ev.stale_mean, (long long)ev.stale_p50, (long long)ev.stale_p99, (long long)ev.stale_max,
                        (long long)sh->overflow) < 0)
                return dp__metrics_error(t);
            int top = 0;
            for (int k = 0; k < DP_PS_HIST_BUCKETS; k++)
                if (sh->bucket[k]) top = k + 1;
            for (int k = 0; k < top; k++)
                if (fprintf(t->metrics, "%s%lld", k ? ", " : "", (long long)sh->bucket[k]) < 0) return dp__metrics_error(t);
            if (fprintf(t->metrics, "]") < 0) return dp__metrics_error(t);
        }
        /* text: the test set is the validation windows; perplexity exp(loss) */
        if (t->text && fprintf(t->metrics, ", \"val_loss\": %.6f, \"val_ppl\": %.4f, \"tokens_per_s\": %.1f",
                               ev.test_loss, exp(ev.test_loss), ev.samples_per_s * (double)t->pos) < 0)
            return dp__metrics_error(t);
        if ((rc = metrics_end(t))) return rc;
    }
    dp__emit_event(t, &ev);
    int last = t->epoch == t->p.run.epochs;
    if (last || (t->p.io.ckpt_every > 0 && t->epoch % t->p.io.ckpt_every == 0) || w->ckpt_due)
        if ((rc = dp__checkpoint_write(t))) return rc;
    return DP_OK;
}

int dp__end_epoch(struct worker *w, double t_start) {
    struct dp_trainer *t = w->t;
    int zrc = dp__zsnap_drain(w); /* (a ZeRO snapshot still pending: its file before the epoch's) */
    if (zrc) return zrc;
    double *tot = dp_malloc(sizeof(double) * (size_t)(4 + 2 * t->G));
    if (!tot) return dp_seterr(DP_ENOMEM, "out of memory");
    double test_acc = NAN, test_loss = NAN;
    struct dp_sync_stats st = dp_sync_stats_take(&w->sync); /* the epoch's reductions; zeroed for the next */
    int rc = epoch_totals(w, tot);
    double dt = dp_time() - t_start;
    /* the epoch count after this one, as report_epoch will see it: a checkpoint then? */
    int64_t e = w->epoch + 1;
    /* ZeRO 3: the evaluation gathers layer by layer (evaluate_shared); the
     * whole parameters only where they are read: after the last epoch, the
     * run's result (dp_trainer_replica: each process's worker 0).  The other
     * workers pass their pieces on range by range (dp_sync_gather),
     * and the last epoch first gives back the gradient shards, so the whole
     * replica takes no more than the step did.  Given back after the
     * barrier.  With an output folder, the report's hash is folded range by
     * range as they pass (zhash), and the checkpoint streams the pieces
     * (zero_stream): neither needs the whole parameters. */
    int last = e == t->p.run.epochs, ckpt = last || (t->p.io.ckpt_every > 0 && e % t->p.io.ckpt_every == 0) || w->ckpt_due;
    if (!rc) rc = dp__evaluate_shared(w, &test_acc, &test_loss);
    if (!rc && last) dp_sync_drop_grads(&w->sync);
    if (!rc && (last || t->p.io.out_dir)) {
        uint64_t h = DP_FNV1A64_INIT;
        rc = dp_sync_gather(&w->sync, w->rank == 0 && last, dp_sync_params_partial(&w->sync) ? &h : NULL);
        w->zhash = dp_fnv1a64(w->rep.buffers, sizeof(float) * (size_t)t->model->num_buffers, h);
    }
    if (!rc && ckpt) rc = dp__ef_gather_state(w);
    if (!rc && w->grank == 0) rc = report_epoch(w, dt, tot, test_acc, test_loss, &st);
    else if (!rc && ckpt && dp__ckpt_serves(t)) rc = dp__ckpt_serve(w); /* while rank 0 writes */
    dp_free(tot);
    w->ckpt_due = 0;
    if (rc) return rc;
    /* The others wait while rank 0 writes the metrics and the checkpoint: a
     * short write, under --comm-timeout like any collective (a hung file
     * system on rank 0 is a stall the timeout is there to catch). */
    rc = dp_comm_barrier(w->comm);
    return rc || e == t->p.run.epochs ? rc : dp_sync_release(&w->sync);
}

/* The worker's running phase sums: data wait, forward, backward, comm,
 * exposed comm, optimizer. */
void dp__phase_sums(const struct worker *w, double out[6]) {
    out[0] = dp_loader_wait_time(w->loader), out[1] = w->t_fwd, out[2] = w->t_bwd;
    out[3] = w->t_comm + w->sync.stats.t_comm, out[4] = w->t_exposed + w->sync.stats.t_exposed, out[5] = w->t_opt;
}

/* One "step" line of metrics.jsonl (rank 0): the step's phase times are the
 * differences of the phase sums before (s0) and after it. */
int dp__step_record(const struct worker *w, int64_t step, int64_t epoch, double loss, double samples,
                    double step_s, const double s0[6], int last_rank, double test_acc, double test_loss) {
    double s1[6];
    dp__phase_sums(w, s1);
    errno = 0;
    int n = fprintf(w->t->metrics,
            "{\"kind\": \"step\", \"step\": %lld, \"epoch\": %lld, \"loss\": %.6f, \"samples\": %lld, "
            "\"step_s\": %.6f, \"data_wait_s\": %.6f, \"forward_s\": %.6f, \"backward_s\": %.6f, "
            "\"comm_s\": %.6f, \"comm_exposed_s\": %.6f, \"optimizer_s\": %.6f, \"wait_s\": %.6f, "
            "\"slow_s\": %.6f, \"last_rank\": %d, \"bytes_sent\": %.0f, \"bytes_recv\": %.0f, "
            "\"compress_ratio\": %.4g, \"compress_s\": %.6f, \"decompress_s\": %.6f",
            (long long)step, (long long)epoch + 1, loss, (long long)samples, step_s, s1[0] - s0[0],
            s1[1] - s0[1], s1[2] - s0[2], s1[3] - s0[3], s1[4] - s0[4], s1[5] - s0[5], w->step_wait,
            w->step_slow, last_rank, w->sync.last.bytes_sent, w->sync.last.bytes_recv,
            w->sync.last.bytes_sent > 0 ? w->sync.last.bytes_fp32 / w->sync.last.bytes_sent : 1.0,
            w->sync.last.t_compress, w->sync.last.t_decompress);
    /* backup workers: the ranks whose gradient this step dropped */
    if (n >= 0 && w->t->bk_on) {
        n = fprintf(w->t->metrics, ", \"dropped\": [");
        for (int r = 0, k = 0; n >= 0 && r < w->t->G; r++)
            if (w->dropped[r]) n = fprintf(w->t->metrics, "%s%d", k++ ? ", " : "", r);
        if (n >= 0) n = fprintf(w->t->metrics, "]");
    }
    /* parameter server: the staleness of rank 0's push */
    if (n >= 0 && w->t->ps_on) n = fprintf(w->t->metrics, ", \"staleness\": %lld", (long long)w->ps_stale);
    /* --eval-every: this step's evaluation */
    if (n >= 0 && !isnan(test_acc))
        n = fprintf(w->t->metrics, ", \"test_loss\": %.6f, \"test_acc\": %.6f", test_loss, test_acc);
    return n < 0 ? dp__metrics_error(w->t) : metrics_end(w->t);
}
