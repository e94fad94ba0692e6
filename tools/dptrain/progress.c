/* dptrain train's progress: the bar or lines while it runs (from the
 * trainer's events), the epoch lines, and the summary at the end. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dp/train.h"
#include "cli.h"

/* ---- the time left ------------------------------------------------------------- */

/* Records step ev->step done at time now, and writes the run's time left into buf as
 * "  ETA 1m05s": the steps left of the whole run (every epoch, or up to --max-steps) at the
 * rate of the last DPTRAIN_ETA_RING steps.  Writes "" while fewer than two steps are known. */
static void eta(struct progress *p, const struct dp_event *ev, double now, char *buf, size_t len) {
    int k = p->eta_n % DPTRAIN_ETA_RING;
    p->eta_t[k] = now, p->eta_step[k] = ev->step;
    p->eta_n++;
    buf[0] = 0;
    int old = p->eta_n > DPTRAIN_ETA_RING ? p->eta_n % DPTRAIN_ETA_RING : 0; /* the oldest step kept */
    double dt = now - p->eta_t[old];
    int64_t dsteps = ev->step - p->eta_step[old];
    if (p->eta_n < 2 || dt <= 0 || dsteps <= 0) return;
    int64_t total = ev->epochs * ev->steps_per_epoch;
    if (p->max_steps > 0 && p->max_steps < total) total = p->max_steps;
    int64_t left = total > ev->step ? total - ev->step : 0;
    double s = (double)left * dt / (double)dsteps;
    if (s < 59.5) snprintf(buf, len, "  ETA %.0fs", s);
    else if (s < 3599.5) snprintf(buf, len, "  ETA %dm%02ds", (int)(s + 0.5) / 60, (int)(s + 0.5) % 60);
    else snprintf(buf, len, "  ETA %lldh%02dm", (long long)(s + 30) / 3600, (int)((long long)(s + 30) % 3600 / 60));
}

/* ---- the events ------------------------------------------------------------------- */

void dptrain_on_event(void *arg, const struct dp_event *ev) {
    struct progress *p = arg;
    char left[32] = "";
    if (ev->kind == DP_EVENT_STEP) {
        double now_s = dp_time();
        if (++p->run_steps == 5) p->tp_t0 = now_s;
        else if (p->run_steps > 5) p->tp_samples += ev->samples, p->tp_t1 = now_s;
        if (p->mode == PROG_BAR || p->mode == PROG_LINES) eta(p, ev, now_s, left, sizeof left);
    }
    if (ev->kind == DP_EVENT_STEP) {
        p->sum_loss += ev->loss;
        p->nloss++;
        if (p->mode == PROG_LINES) {
            /* a plain line at every tenth of an epoch, for logs */
            int64_t tenth = ev->steps_per_epoch >= 10 ? ev->steps_per_epoch / 10 : 1;
            if (ev->step_in_epoch % tenth == 0 && ev->step_in_epoch != ev->steps_per_epoch) {
                printf("  epoch %lld step %lld/%lld  loss %.4f  lr %.4g%s\n", (long long)ev->epoch + 1,
                       (long long)ev->step_in_epoch, (long long)ev->steps_per_epoch,
                       p->sum_loss / (double)p->nloss, (double)ev->lr, left);
                fflush(stdout);
            }
        }
        if (p->mode != PROG_BAR) return;
        double now = dp_time();
        if (now - p->last_draw < 0.1 && ev->step_in_epoch != ev->steps_per_epoch) return;
        p->last_draw = now;
        int width = 30, done = (int)(width * ev->step_in_epoch / (ev->steps_per_epoch ? ev->steps_per_epoch : 1));
        char bar[64];
        for (int i = 0; i < width; i++) bar[i] = i < done ? '#' : '.';
        bar[width] = 0;
        /* \033[K: clear what a longer line left to the right */
        fprintf(stderr, "\repoch %lld/%lld [%s] %lld/%lld  loss %.4f  lr %.4g%s\033[K", (long long)ev->epoch + 1,
                (long long)ev->epochs, bar, (long long)ev->step_in_epoch, (long long)ev->steps_per_epoch,
                p->sum_loss / (double)p->nloss, (double)ev->lr, left);
        fflush(stderr);
    } else if (ev->kind == DP_EVENT_EPOCH) {
        if (p->mode == PROG_BAR) fprintf(stderr, "\r\033[K");
        p->sum_loss = 0, p->nloss = 0;
        /* exposed communication is the wait after backward: it is part of
         * the step time; the rest of the communication hid behind backward */
        double other = ev->epoch_time - ev->t_fwd - ev->t_bwd - ev->t_comm_exposed - ev->t_opt - ev->t_data;
        if (ev->positions > 1) /* a language model: per-token losses on the validation windows */
            printf("epoch %lld/%lld  train loss %.4f  val loss %.4f  val ppl %.2f  val bpb %.4f  %.0f tokens/s  ",
                   (long long)ev->epoch, (long long)ev->epochs, ev->loss, ev->test_loss, exp(ev->test_loss),
                   ev->val_bpb, ev->samples_per_s * (double)ev->positions);
        else if (ev->regression) { /* --loss mse: root mean squared and mean absolute errors */
            printf("epoch %lld/%lld  train loss %.4g  train rmse %.4g  ", (long long)ev->epoch, (long long)ev->epochs,
                   ev->loss, sqrt(ev->loss));
            if (isnan(ev->test_loss)) printf("(no test set)  ");
            else printf("test rmse %.4g  test mae %.4g  ", sqrt(ev->test_loss), ev->test_acc);
            printf("%.0f samples/s  ", ev->samples_per_s);
        } else if (isnan(ev->test_loss)) /* no test set: --data X.npy without --test-data or --val-split */
            printf("epoch %lld/%lld  train loss %.4f  train acc %.2f%%  (no test set)  %.0f samples/s  ",
                   (long long)ev->epoch, (long long)ev->epochs, ev->loss, 100 * ev->train_acc, ev->samples_per_s);
        else
            printf("epoch %lld/%lld  train loss %.4f  train acc %.2f%%  test loss %.4f  test acc %.2f%%  "
                   "%.0f samples/s  ", (long long)ev->epoch, (long long)ev->epochs, ev->loss, 100 * ev->train_acc,
                   ev->test_loss, 100 * ev->test_acc, ev->samples_per_s);
        printf("%.1fs (data %.2f fwd %.2f bwd %.2f comm %.2f exposed %.2f opt %.2f other %.2f)%s",
               ev->epoch_time, ev->t_data, ev->t_fwd, ev->t_bwd, ev->t_comm, ev->t_comm_exposed, ev->t_opt,
               other > 0 ? other : 0, ev->skipped ? "  [skipped non-finite steps]" : "");
        /* gradient compression: wire bytes per step and the ratio to fp32 */
        if (ev->bytes_sent > 0 && ev->bytes_fp32 != ev->bytes_sent)
            printf("  wire %.3g MB/step (%.1fx less than fp32, compress %.2fs decompress %.2fs)",
                   ev->bytes_sent / 1e6, ev->bytes_fp32 / ev->bytes_sent, ev->t_compress, ev->t_decompress);
        p->sum_sent += ev->bytes_sent, p->sum_recv += ev->bytes_recv, p->sum_fp32 += ev->bytes_fp32;
        p->sum_cz += ev->t_compress, p->sum_dz += ev->t_decompress, p->nepochs++;
        /* --balance: the shares, when they fit on the line */
        for (int r = 0; ev->shares && ev->nshares <= 8 && r < ev->nshares; r++)
            printf("%s%lld", r ? "/" : "  shares ", (long long)ev->shares[r]);
        /* --backup-workers: the steps each rank was dropped */
        for (int r = 0; ev->dropped_steps && ev->nshares <= 8 && r < ev->nshares; r++)
            printf("%s%lld", r ? "/" : "  dropped ", (long long)ev->dropped_steps[r]);
        /* the parameter server: the staleness of the epoch's pushes */
        if (ev->pushes)
            printf("  staleness mean %.2f p50 %lld p99 %lld max %lld", ev->stale_mean, (long long)ev->stale_p50,
                   (long long)ev->stale_p99, (long long)ev->stale_max);
        printf("\n");
        p->sum_data += ev->t_data, p->sum_fwd += ev->t_fwd, p->sum_bwd += ev->t_bwd;
        p->sum_comm += ev->t_comm, p->sum_exposed += ev->t_comm_exposed, p->sum_opt += ev->t_opt;
        p->sum_time += ev->epoch_time;
        fflush(stdout);
        p->last_test_acc = ev->test_acc;
        p->last_test_loss = ev->test_loss;
        p->positions = ev->positions;
        p->last_sps = ev->samples_per_s;
        p->slow_rank = ev->slow_rank, p->slow_lag = ev->slow_lag;
    } else if (ev->kind == DP_EVENT_CHECKPOINT) {
        if (p->mode == PROG_BAR) fprintf(stderr, "\r\033[K");
        printf("checkpoint %s (step %lld)\n", ev->path, (long long)ev->step);
        fflush(stdout);
    } else if (ev->kind == DP_EVENT_EVAL && !isnan(ev->test_loss)) { /* --eval-every, or a --max-steps stop mid-epoch */
        if (p->mode == PROG_BAR) fprintf(stderr, "\r\033[K");
        if (ev->positions > 1)
            printf("eval step %lld  val loss %.4f  val ppl %.2f  val bpb %.4f\n", (long long)ev->step, ev->test_loss,
                   exp(ev->test_loss), ev->val_bpb);
        else if (ev->regression)
            printf("eval step %lld  test rmse %.4g  test mae %.4g\n", (long long)ev->step, sqrt(ev->test_loss),
                   ev->test_acc);
        else
            printf("eval step %lld  test loss %.4f  test acc %.2f%%\n", (long long)ev->step, ev->test_loss,
                   100 * ev->test_acc);
        fflush(stdout);
        p->last_test_acc = ev->test_acc;
        p->last_test_loss = ev->test_loss;
    }
}


void dptrain_progress_summary(const struct progress *p, const struct dp_trainer *t, const struct dp_train_params *tp,
                              double dt, double peak, int ranks) {
    const struct dp_model *m = dp_trainer_model(t);
    /* Steady-state throughput (after 5 warm-up steps) and model FLOP
     * utilisation: a training step costs ~3x the forward FLOPs (forward, and
     * two GEMMs of the same size per layer in backward), over the fp32 peak of
     * one core measured at start (dp_cpu_peak_flops) times the cores in use,
     * threads x ranks (each process of an mpi job on a CPU like rank 0's). */
    double sps = p->tp_t1 > p->tp_t0
                     ? (double)p->tp_samples / (p->tp_t1 - p->tp_t0) : p->last_sps;
    double mfu = peak > 0 ? sps * 3.0 * (double)m->flops_fwd / (peak * tp->run.threads * ranks) : 0;
    char acc[64] = "n/a (no epoch finished)";
    if (p->nepochs && isnan(p->last_test_acc)) snprintf(acc, sizeof acc, "n/a (no test set)");
    int reg = m->loss == DP_LOSS_MSE;
    if (!isnan(p->last_test_acc)) snprintf(acc, sizeof acc, "%.2f%%", 100 * p->last_test_acc);
    if (reg && !isnan(p->last_test_acc))
        snprintf(acc, sizeof acc, "%.4g (mae %.4g)", sqrt(p->last_test_loss), p->last_test_acc);
    int lm = dp_model_reads_tokens(m); /* a language model reports its validation loss */
    if (lm && !isnan(p->last_test_loss))
        snprintf(acc, sizeof acc, "%.4f (perplexity %.2f)", p->last_test_loss,
                 exp(p->last_test_loss));
    printf("done: %.1fs, %s %s, param hash %016" PRIx64 "\n", dt,
           lm ? "val loss" : reg ? "test rmse" : "test acc", acc, dp_trainer_param_hash(t));
    if (p->run_steps > 5) {
        /* the headline: the job's samples/s (tokens/s for a language model) and MFU */
        printf("throughput: %.1f samples/s (training steps after the 5th, %lld steps)", sps,
               (long long)p->run_steps - 5);
        if (lm) printf(", %.0f tokens/s", sps * (double)m->in_shape.d[0]);
        if (peak > 0)
            printf(", MFU %.1f%% of %d x %.0f GFLOP/s (measured, %s)", 100 * mfu, tp->run.threads * ranks, peak / 1e9,
                   dp_cpu_peak_isa());
        printf("\n");
    }
    struct dp_snapshot_stats ss;
    dp_trainer_snapshot_stats(t, &ss);
    if (ss.taken) /* what E5's failure model calls C (the copy, and any wait) and the write */
        printf("checkpoints in the background: %lld, per checkpoint: the step paid %.3g ms (copy %.3g, waiting for "
               "the previous write %.3g); the writer took %.3g ms (%.3g ms of CPU)\n",
               (long long)ss.taken, 1e3 * (ss.copy_s + ss.wait_s) / ss.taken, 1e3 * ss.copy_s / ss.taken,
               1e3 * ss.wait_s / ss.taken, 1e3 * ss.write_s / ss.taken, 1e3 * ss.write_cpu_s / ss.taken);
    if (p->sum_time > 0) {
        /* Worker 0's training time, phase by phase, adding up to 100%: exposed communication is
         * the wait after backward (the rest of the communication hid behind backward, inside
         * its share); other is what no phase measures (waiting for the other workers at the
         * step's end, the step's bookkeeping).  Where the phases overlap by a little more than
         * the time measured (rounding), they are the 100%. */
        const char *name[] = {"data", "forward", "backward", "exposed communication", "optimizer", "other"};
        double sec[6] = {p->sum_data, p->sum_fwd, p->sum_bwd, p->sum_exposed, p->sum_opt, 0};
        double tot = 0;
        for (int k = 0; k < 5; k++) tot += sec[k];
        sec[5] = p->sum_time > tot ? p->sum_time - tot : 0;
        tot = tot + sec[5];
        int w[6];
        printf("%-14s", "time per phase");
        for (int k = 0; k < 6; k++) {
            w[k] = (int)strlen(name[k]) > 6 ? (int)strlen(name[k]) : 6; /* "100.0%" fits */
            printf("  %*s", w[k], name[k]);
        }
        printf("  %7s\n%-14s", "total", "(worker 0)");
        for (int k = 0; k < 6; k++) printf("  %*.1f%%", w[k] - 1, 100 * sec[k] / tot);
        printf("  %6.2fs\n", tot);
        if (p->sum_comm > 0)
            printf("communication (worker 0): %.2fs, %.0f%% of it hidden behind backward\n", p->sum_comm,
                   p->sum_comm > p->sum_exposed ? 100 * (1 - p->sum_exposed / p->sum_comm) : 0.0);
    }
    /* the bytes on the wire, when compression changes them */
    if (p->nepochs > 0 && p->sum_sent > 0 && tp->dp.compress.kind != DP_COMPRESS_NONE) {
        const struct progress *q = p;
        char cspec[64];
        dp_compress_format(&tp->dp.compress, cspec, sizeof cspec);
        printf("gradient traffic (worker 0, --compress %s): %.3g MB sent and %.3g MB received per step, "
               "%.2fx less than fp32; compress %.2fs, decompress %.2fs\n",
               cspec, q->sum_sent / q->nepochs / 1e6, q->sum_recv / q->nepochs / 1e6, q->sum_fp32 / q->sum_sent,
               q->sum_cz, q->sum_dz);
    }
    if (p->slow_rank >= 0)
        printf("slowest rank (last epoch): %d, its reductions start %.3g ms per step after the earliest rank's\n",
               p->slow_rank, 1e3 * p->slow_lag);
}
