/* --ckpt-every-steps in the background: a snapshot in memory at the step
 * boundary, written by a thread while training goes on.
 *
 * At the boundary (every worker has settled, and a multi-process job has
 * brought the error-feedback state to rank 0: dp__step_checkpoint) rank 0
 * copies what a checkpoint holds:
 *
 *     header          position (epoch, step, step in epoch), optimizer step
 *     payload         parameters | buffers | optimizer state (one block)
 *     ef              every worker's error-feedback state
 *     metrics_bytes   metrics.jsonl's length now (every record is flushed)
 *
 * and hands the copy to the writer thread, which writes the usual file
 * with the atomic writer (temporary file, fsync, rename, directory fsync)
 * and keeps the previous checkpoint as checkpoint.prev.bin.  The step pays
 * the copy, a memcpy of the model state; the write, its CRC and hash, and
 * the fsyncs run beside training.  The file is the one a synchronous save
 * at that step writes, byte for byte (what the run was built from is fixed
 * for the run, and the writer reads it from the trainer).
 *
 * One snapshot in flight: one due while the previous is still being
 * written waits for it first (the wait is counted in wait_s).  A write's
 * error is kept and returned at the next snapshot, the next synchronous
 * checkpoint (epoch ends, the run's end: they wait for the write in flight
 * first, so checkpoints reach the folder in step order) or the run's end.
 * The checkpoint event of a background write is emitted from rank 0's
 * thread when it next waits for the writer, never from the writer.
 *
 * ZeRO keeps the synchronous path: its state is in shards that the owners
 * stream to rank 0 (checkpointing.c), and a copy of the whole state on
 * rank 0 is what ZeRO exists to avoid. */
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/core_impl.h"
#include "trainer.h"

struct dp_snapshot {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int busy;               /* a snapshot is handed over and not written yet */
    int quit;
    int rc;                 /* the last write's status, and its message */
    char err[512];
    int event;              /* a write finished whose event is still to emit */
    double write_s, write_cpu_s; /* the writer's wall and CPU time, all writes */
    const struct dp_trainer *t;
    struct dp_ckpt_header h;
    float *payload;         /* params | buffers | optimizer state */
    size_t payload_len, payload_cap; /* floats */
    char *ef;               /* dp__ckpt_ef_image's block, or NULL */
    size_t ef_size;
    int64_t metrics_bytes;  /* -1: no metrics.jsonl */
    char path[4096];
};

/* Writes the snapshot held: the body of the writer thread's loop. */
static int write_snapshot(struct dp_snapshot *s) {
    int rc = dp__ckpt_keep_previous(s->path);
    struct dp_ckpt_writer *out = NULL;
    if (!rc) rc = dp_ckpt_writer_open(&out, s->path, &s->h);
    if (rc) return rc;
    dp_ckpt_writer_put(out, s->payload, sizeof(float) * s->payload_len);
    s->h.param_hash = dp_ckpt_writer_hash(out);
    dp__ckpt_put_sections(s->t, out, s->ef, s->ef_size, s->metrics_bytes);
    return dp_ckpt_writer_close(out, &s->h, NULL, NULL, 0);
}

static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *writer_main(void *arg) {
    struct dp_snapshot *s = arg;
    /* below the workers: the write yields the cores to the step (Linux: per-thread nice) */
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10);
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->busy && !s->quit) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->busy) break;
        pthread_mutex_unlock(&s->mu);
        double t0 = dp_time(), c0 = thread_cpu_s();
        int rc = write_snapshot(s);
        double dt = dp_time() - t0, dc = thread_cpu_s() - c0;
        pthread_mutex_lock(&s->mu);
        s->write_s += dt, s->write_cpu_s += dc;
        s->rc = rc;
        if (rc) snprintf(s->err, sizeof s->err, "%s", dp_errmsg());
        s->event = !rc;
        s->busy = 0;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int dp__snapshot_on(const struct dp_trainer *t) {
    return t->p.io.out_dir && !t->p.dp.zero && !t->p.io.ckpt_sync;
}

int dp__snapshot_wait(struct dp_trainer *t) {
    struct dp_snapshot *s = t->snap;
    if (!s) return DP_OK;
    double t0 = dp_time();
    pthread_mutex_lock(&s->mu);
    while (s->busy) pthread_cond_wait(&s->cv, &s->mu);
    int rc = s->rc, event = s->event;
    s->rc = DP_OK, s->event = 0;
    pthread_mutex_unlock(&s->mu);
    t->snap_wait_s += dp_time() - t0;
    if (rc) return dp_seterr(rc, "%s", s->err);
    if (event) {
        struct dp_event ev = {.kind = DP_EVENT_CHECKPOINT, .step = s->h.step, .epoch = s->h.epoch, .path = s->path};
        dp__emit_event(t, &ev);
    }
    return DP_OK;
}

/* Starts the writer on the first snapshot: a run that takes none has no thread. */
static int snapshot_new(struct dp_trainer *t) {
    struct dp_snapshot *s = dp_calloc(1, sizeof *s);
    if (!s) return dp_seterr(DP_ENOMEM, "checkpoint: out of memory for the snapshot");
    s->t = t;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    snprintf(s->path, sizeof s->path, "%s/checkpoint.bin", t->p.io.out_dir);
    if (dp__thread_start(&s->thread, "dp-ckpt-writer", writer_main, s) != 0) {
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        dp_free(s);
        return dp_seterr(DP_ENOMEM, "checkpoint: cannot start the writer thread");
    }
    t->snap = s;
    return DP_OK;
}

int dp__snapshot_take(struct dp_trainer *t) {
    int rc = t->snap ? dp__snapshot_wait(t) : snapshot_new(t);
    if (rc) return rc;
    struct dp_snapshot *s = t->snap;
    double t0 = dp_time();
    const struct worker *w = &t->w[0];
    /* the writer is idle (waited for above): the copy is ours to fill */
    dp__fill_header(t, &s->h);
    const size_t np = (size_t)s->h.num_params, nb = (size_t)s->h.num_buffers, ns = (size_t)s->h.optim_state_len;
    s->payload_len = np + nb + ns;
    if (s->payload_len > s->payload_cap) {
        dp_free(s->payload);
        s->payload_cap = 0;
        if (!(s->payload = dp_malloc_big(sizeof(float) * s->payload_len)))
            return dp_seterr(DP_ENOMEM, "checkpoint: out of memory for the snapshot (%zu floats)", s->payload_len);
        s->payload_cap = s->payload_len;
    }
    memcpy(s->payload, w->rep.params, sizeof(float) * np);
    memcpy(s->payload + np, w->rep.buffers, sizeof(float) * nb);
    if (ns) memcpy(s->payload + np + nb, w->sync.opt.state, sizeof(float) * ns);
    dp_free(s->ef);
    s->ef = NULL;
    if ((rc = dp__ckpt_ef_image(t, &s->ef, &s->ef_size))) return rc;
    s->metrics_bytes = t->metrics ? (int64_t)ftell(t->metrics) : -1;
    t->snap_copy_s += dp_time() - t0;
    t->snap_taken++;
    pthread_mutex_lock(&s->mu);
    s->busy = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return DP_OK;
}

void dp_trainer_snapshot_stats(const struct dp_trainer *t, struct dp_snapshot_stats *st) {
    *st = (struct dp_snapshot_stats){.taken = t->snap_taken, .copy_s = t->snap_copy_s, .wait_s = t->snap_wait_s};
    struct dp_snapshot *s = t->snap;
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    st->write_s = s->write_s, st->write_cpu_s = s->write_cpu_s;
    pthread_mutex_unlock(&s->mu);
}

void dp__snapshot_free(struct dp_trainer *t) {
    struct dp_snapshot *s = t->snap;
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->quit = 1; /* (a write in flight finishes first: the loop ends when it is idle) */
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    dp_free(s->payload);
    dp_free(s->ef);
    dp_free(s);
    t->snap = NULL;
}
