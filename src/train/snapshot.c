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
 * ZeRO: no process holds the whole state, so each writes its own shards.
 * At the boundary every worker copies its pieces (dp_sync_piece: its block
 * of each range of the optimizer state, stage 3 of the parameters too),
 * rank 0 also what only it writes (the header, the replicated parameters
 * below stage 3, the buffers, the sections).  Each process's writer thread
 * then writes its workers' pieces straight to their places in one shared
 * temporary file, <path>.zsnap.<step>.tmp, the usual whole-slab layout:
 *
 *     header | params | buffers | state part 0 | part 1     (each part: the slab)
 *     the piece of worker q in range i, part k, at
 *         header + 4 (np + nb) + 4 k np + 4 off_q,i     (off: its slab offset)
 *
 * and rank 0 finishes it once every process has written: it reads the
 * payload back for the CRC and the parameter hash (FNV-1a runs in file
 * order: the shards cannot hash their parts alone), writes the sections and
 * the header, and renames it over checkpoint.bin.  One process learns that
 * every other has written from one all-reduce of a flag per step while a
 * snapshot is pending (dp__zsnap_poll); a snapshot still pending at the next
 * one, an epoch's end or the run's end is waited for (dp__zsnap_drain).  In
 * one process the writer writes every worker's pieces and finishes at once.
 * The file is byte for byte the one rank 0 streams in the step
 * (checkpointing.c), which a ZeRO run with --ckpt-sync still writes. */
#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/core_impl.h"
#include "trainer.h"

enum { TASK_WRITE = 1, TASK_PIECES = 2, TASK_FINISH = 4 };

/* A worker's copy of its ZeRO pieces, in the order the writer walks them */
struct zbuf {
    float *data;
    size_t cap;
};

struct dp_snapshot {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int busy;               /* the task handed over (TASK_*), 0 when idle */
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
    /* ZeRO */
    int copied;             /* this process's workers that copied their pieces for the snapshot in hand */
    int written;            /* this process's pieces of the snapshot in hand are on disk */
    struct zbuf *zb;        /* (P) per worker of this process */
    int64_t zstep;
    char tmp[4200];         /* the shared temporary file */
};

static pthread_mutex_t g_create = PTHREAD_MUTEX_INITIALIZER; /* (the first of a process's workers makes it) */

/* The walk over a worker's pieces in one order, for the copy and the write: stage 3's
 * parameters (part -1), then each part of the optimizer state; in each, range by range. */
#define EACH_PIECE(sync, k, i, first)                                                              \
    for (int k = (first); k < dp_sync_state_parts(sync); k++)                                     \
        for (int i = 0; i < dp_sync_npieces(sync); i++)

static int first_part(const struct dp_sync *sync) { return dp_sync_sharded_params(sync) ? -1 : 0; }

static int64_t pieces_len(const struct dp_sync *sync) {
    int64_t n = 0;
    EACH_PIECE(sync, k, i, first_part(sync)) {
        struct dp_zero_piece pc;
        (void)dp_sync_piece(sync, i, k, &pc);
        n += pc.len;
    }
    return n;
}

static int pwrite_all(int fd, const void *data, size_t n, uint64_t off) {
    const char *c = data;
    while (n) {
        ssize_t w = pwrite(fd, c, n, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        c += w, n -= (size_t)w, off += (uint64_t)w;
    }
    return 0;
}

/* This process's part of a ZeRO snapshot: its workers' pieces at their offsets (rank 0's
 * process: also the parameters below stage 3 and the buffers), then fsync.  The file is
 * created by whichever process comes first, never truncated here (the finish cuts it). */
static int write_pieces(struct dp_snapshot *s) {
    const struct dp_trainer *t = s->t;
    const struct dp_sync *sy = &t->w[0].sync;
    const uint64_t np = (uint64_t)t->model->num_params, nb = (uint64_t)t->model->num_buffers;
    const uint64_t base = sizeof(struct dp_ckpt_header), state = base + 4 * (np + nb);
    const int parts = dp_sync_state_parts(sy);
    const uint64_t part_len = parts ? (uint64_t)dp_sync_state_len(sy) / (uint64_t)parts : 0;
    int fd = open(s->tmp, O_WRONLY | O_CREAT | O_CLOEXEC, 0644), bad = fd < 0;
    if (!bad && t->base == 0) { /* rank 0: the replicated parameters (below stage 3) and the buffers */
        size_t off = 0;
        if (!dp_sync_sharded_params(sy)) bad = pwrite_all(fd, s->payload, 4 * np, base), off = np;
        if (!bad && nb) bad = pwrite_all(fd, s->payload + off, 4 * nb, base + 4 * np);
    }
    for (int r = 0; !bad && r < t->P; r++) {
        const struct dp_sync *ws = &t->w[r].sync;
        const float *src = s->zb[r].data;
        EACH_PIECE(ws, k, i, first_part(ws)) {
            struct dp_zero_piece pc;
            (void)dp_sync_piece(ws, i, k, &pc);
            uint64_t at = (k < 0 ? base : state + 4 * (uint64_t)k * part_len) + 4 * (uint64_t)pc.off;
            if (!bad && pc.len) bad = pwrite_all(fd, src, 4 * (size_t)pc.len, at);
            src += pc.len;
        }
    }
    if (!bad) bad = fsync(fd) != 0;
    int e = errno;
    if (fd >= 0 && close(fd) != 0 && !bad) bad = 1, e = errno;
    return bad ? dp_seterr(DP_EIO, "checkpoint: cannot write this process's shards to %s: %s", s->tmp, strerror(e))
               : DP_OK;
}

/* Rank 0, once every process wrote its pieces: the CRC and hash read back, the sections,
 * the header, the rename (keeping the previous checkpoint). */
static int finish_pieces(struct dp_snapshot *s) {
    int rc = dp__ckpt_keep_previous(s->path);
    struct dp_ckpt_writer *out = NULL;
    if (!rc) rc = dp__ckpt_writer_adopt(&out, s->tmp, s->path, &s->h);
    if (rc) return rc;
    s->h.param_hash = dp_ckpt_writer_hash(out);
    dp__ckpt_put_sections(s->t, out, s->ef, s->ef_size, s->metrics_bytes);
    return dp_ckpt_writer_close(out, &s->h, NULL, NULL, 0);
}

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
        const int task = s->busy;
        pthread_mutex_unlock(&s->mu);
        double t0 = dp_time(), c0 = thread_cpu_s();
        int rc = task & TASK_WRITE ? write_snapshot(s) : DP_OK;
        if (!rc && (task & TASK_PIECES)) rc = write_pieces(s);
        if (!rc && (task & TASK_FINISH)) rc = finish_pieces(s);
        double dt = dp_time() - t0, dc = thread_cpu_s() - c0;
        pthread_mutex_lock(&s->mu);
        s->write_s += dt, s->write_cpu_s += dc;
        if (rc && !s->rc) { /* (the first error is kept until it is returned) */
            s->rc = rc;
            snprintf(s->err, sizeof s->err, "%s", dp_errmsg());
        }
        if (task & TASK_PIECES) s->written = !rc;
        if (task & (TASK_WRITE | TASK_FINISH)) s->event = !rc;
        s->busy = 0;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* A pipeline across processes writes in the step, as with --ckpt-sync (each stage streams its span
 * to rank 0 in blocks, checkpointing.c): no process holds the whole state, and a snapshot would
 * copy all of it into rank 0's memory, the memory the stages were split to save. */
int dp__snapshot_on(const struct dp_trainer *t) {
    return t->p.io.out_dir && !t->p.io.ckpt_sync && !(t->pp > 1 && t->G > t->P);
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
    if (s) s->zb = dp_calloc((size_t)t->P, sizeof *s->zb);
    if (!s || !s->zb) {
        if (s) dp_free(s);
        return dp_seterr(DP_ENOMEM, "checkpoint: out of memory for the snapshot");
    }
    s->t = t;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    snprintf(s->path, sizeof s->path, "%s/checkpoint.bin", t->p.io.out_dir);
    if (dp__thread_start(&s->thread, "dp-ckpt-writer", writer_main, s) != 0) {
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        dp_free(s->zb), dp_free(s);
        return dp_seterr(DP_ENOMEM, "checkpoint: cannot start the writer thread");
    }
    t->snap = s;
    return DP_OK;
}

/* *buf holds at least n floats (*cap: what it holds), kept from one snapshot to the next. */
static int reserve(float **buf, size_t *cap, size_t n, const char *what) {
    if (n <= *cap) return DP_OK;
    dp_free(*buf);
    *cap = 0;
    if (!(*buf = dp_malloc_big(sizeof(float) * (n ? n : 1))))
        return dp_seterr(DP_ENOMEM, "checkpoint: out of memory for %s (%zu floats)", what, n);
    *cap = n;
    return DP_OK;
}

struct copy_at {
    float *p;
};
static void copy_floats(void *arg, const float *p, int64_t n) {
    struct copy_at *at = arg;
    memcpy(at->p, p, sizeof(float) * (size_t)n);
    at->p += n;
}

/* Rank 0's part of a snapshot (its writer idle): the header, then np parameters, the
 * buffers and ns floats of optimizer state copied into the payload, the error-feedback
 * state, metrics.jsonl's length; the copy's time since t0 counted. */
static int copy_rank0(struct dp_trainer *t, size_t np, size_t ns, double t0) {
    struct dp_snapshot *s = t->snap;
    const struct worker *w = &t->w[0];
    dp__fill_header(t, &s->h);
    const size_t nb = (size_t)s->h.num_buffers;
    s->payload_len = np + nb + ns;
    int rc = reserve(&s->payload, &s->payload_cap, s->payload_len, "the snapshot");
    if (rc) return rc;
    struct copy_at at0 = {s->payload};
    if (np && dp__pipe_partial(t)) rc = dp__state_part_each(t, -1, copy_floats, &at0); /* (the stages' spans) */
    else if (np) memcpy(s->payload, w->rep.params, sizeof(float) * np);
    if (rc) return rc;
    if (nb) memcpy(s->payload + np, w->rep.buffers, sizeof(float) * nb);
    struct copy_at at = {s->payload + np + nb};
    for (int k = 0; ns && k < dp_sync_state_parts(&w->sync) && !rc; k++) rc = dp__state_part_each(t, k, copy_floats, &at);
    if (rc) return rc;
    dp_free(s->ef);
    s->ef = NULL;
    if ((rc = dp__ckpt_ef_image(t, &s->ef, &s->ef_size))) return rc;
    s->metrics_bytes = t->metrics ? (int64_t)ftell(t->metrics) : -1;
    t->snap_copy_s += dp_time() - t0;
    t->snap_taken++;
    return DP_OK;
}

int dp__snapshot_take(struct dp_trainer *t) {
    int rc = t->snap ? dp__snapshot_wait(t) : snapshot_new(t);
    if (rc) return rc;
    struct dp_snapshot *s = t->snap;
    /* the writer is idle (waited for above): the copy is ours to fill */
    if ((rc = copy_rank0(t, (size_t)t->model->num_params, (size_t)dp_sync_state_len(&t->w[0].sync), dp_time())))
        return rc;
    pthread_mutex_lock(&s->mu);
    s->busy = TASK_WRITE;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return DP_OK;
}

/* ---- ZeRO: every process writes its shards ------------------------------------------------ */

/* Waits until this process's writer is idle; its error, if it failed (kept for rank 0's wait
 * to return too). */
static int zwait_idle(struct dp_trainer *t) {
    struct dp_snapshot *s = t->snap;
    pthread_mutex_lock(&s->mu);
    while (s->busy) pthread_cond_wait(&s->cv, &s->mu);
    int rc = s->rc;
    pthread_mutex_unlock(&s->mu);
    return rc ? dp_seterr(rc, "%s", s->err) : DP_OK;
}

/* One round of the question "has every process written its pieces?": the sum over the job's
 * workers of 1 where this process's writer is idle having written (wait: after waiting for
 * it).  Every worker asks the same rounds (it is a collective), so all see the same answer;
 * then rank 0 hands the finish to its writer. */
static int zsnap_round(struct worker *w, int wait) {
    struct dp_trainer *t = w->t;
    struct dp_snapshot *s = t->snap;
    int rc = wait ? zwait_idle(t) : DP_OK;
    if (rc) return rc;
    pthread_mutex_lock(&s->mu);
    float done = !s->busy && s->written;
    rc = s->rc;
    pthread_mutex_unlock(&s->mu);
    if (rc) return dp_seterr(rc, "%s", s->err);
    if ((rc = dp_comm_allreduce(w->comm, &done, 1, DP_DTYPE_F32, DP_ALGO_AUTO))) return rc;
    if (done < (float)t->G) return DP_OK;
    w->zsnap_pending = 0;
    if (w->grank == 0) {
        pthread_mutex_lock(&s->mu);
        s->busy = TASK_FINISH;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
    return DP_OK;
}

int dp__zsnap_poll(struct worker *w) { return w->zsnap_pending ? zsnap_round(w, 0) : DP_OK; }

int dp__zsnap_drain(struct worker *w) {
    int rc = w->zsnap_pending ? zsnap_round(w, 1) : DP_OK;
    if (!rc && w->zsnap_pending) rc = dp_seterr(DP_EINTERNAL, "checkpoint: the shards of step %lld are still "
                                                "pending after every process waited", (long long)w->t->snap->zstep);
    return rc;
}

int dp__zsnap_take(struct worker *w) {
    struct dp_trainer *t = w->t;
    int rc = DP_OK;
    pthread_mutex_lock(&g_create);
    if (!t->snap) rc = snapshot_new(t);
    pthread_mutex_unlock(&g_create);
    if (!rc) rc = dp__zsnap_drain(w); /* the one before: every process has written it, rank 0 finishes it */
    if (!rc && w->grank == 0) rc = dp__snapshot_wait(t); /* (its finish, and its event) */
    if (!rc) rc = zwait_idle(t);
    if (rc) return rc;
    struct dp_snapshot *s = t->snap;
    double t0 = dp_time();
    /* the writer is idle, and stays so until the last of this process's workers hands it the copies */
    struct zbuf *b = &s->zb[w->rank];
    if ((rc = reserve(&b->data, &b->cap, (size_t)pieces_len(&w->sync), "the snapshot of a worker's shards"))) return rc;
    float *dst = b->data;
    EACH_PIECE(&w->sync, k, i, first_part(&w->sync)) {
        struct dp_zero_piece pc;
        const float *src = dp_sync_piece(&w->sync, i, k, &pc);
        if (pc.len) memcpy(dst, src, sizeof(float) * (size_t)pc.len);
        dst += pc.len;
    }
    /* rank 0: the header and what only it writes (the parameters below stage 3, the buffers) */
    if (w->grank == 0 &&
        (rc = copy_rank0(t, dp_sync_sharded_params(&w->sync) ? 0 : (size_t)t->model->num_params, 0, t0)))
        return rc;
    pthread_mutex_lock(&s->mu);
    if (++s->copied == t->P) { /* the last copy of this process: the writer's turn */
        s->copied = 0;
        s->zstep = t->w[0].step + 1; /* (the step count after the step just done, as every worker has it) */
        snprintf(s->tmp, sizeof s->tmp, "%s.zsnap.%lld.tmp", s->path, (long long)s->zstep);
        s->written = 0;
        s->busy = TASK_PIECES | (t->G == t->P ? TASK_FINISH : 0);
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    w->zsnap_pending = t->G > t->P; /* (one process: its writer finishes the file itself) */
    return DP_OK;
}

void dp__zsnap_clean(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    long long step;
    char tail[8];
    while (d && (e = readdir(d)))
        if (sscanf(e->d_name, "checkpoint.bin.zsnap.%lld%7s", &step, tail) == 2 && !strcmp(tail, ".tmp")) {
            char path[4600];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    if (d) closedir(d);
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
    for (int r = 0; r < t->P; r++) dp_free(s->zb[r].data);
    dp_free(s->zb);
    dp_free(s);
    t->snap = NULL;
}
