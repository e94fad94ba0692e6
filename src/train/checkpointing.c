/* Checkpoint I/O: reading a checkpoint into a trainer (load_checkpoint), writing
 * one (dp_trainer_save; ZeRO's pieces streamed by the workers that hold them),
 * and the cadence of the writes (end of epoch, --ckpt-every-steps). */
#include <sys/stat.h>
#include <unistd.h>

#include "trainer.h"

/* The error-feedback state of a resumed run (a "DPEFSTAT" section, see
 * dp_trainer_save): worker r takes job rank r's state when the checkpoint
 * holds the same scheme, worker count and length; otherwise the residuals
 * start at zero and t->note says why (a different worker count splits the
 * batch differently, so the old per-worker residuals would not fit). */
static int load_ef_state(struct dp_trainer *t, const char *path) {
    int64_t len = dp_sync_ef_len(&t->w[0].sync);
    if (len == 0) return DP_OK;
    void *data;
    uint64_t size;
    int rc = dp_ckpt_read_section(path, DP_CKPT_EF_TAG, &data, &size);
    if (rc) return rc;
    struct dp_ckpt_ef ef;
    if (!data) {
        snprintf(t->note, sizeof t->note, "%s has no error-feedback state for --compress %s: the residuals start "
                 "at zero", path, dp_compress_name(t->p.dp.compress.kind));
        return DP_OK;
    }
    memcpy(&ef, data, size >= sizeof ef ? sizeof ef : 0);
    if (size < sizeof ef || ef.len < 0 || size != sizeof ef + 4u * (uint64_t)ef.len * ef.workers) {
        dp_free(data);
        return dp_seterr(DP_EFORMAT, "%s: the error-feedback section is malformed", path);
    }
    if (ef.kind != (uint32_t)t->p.dp.compress.kind || ef.len != len)
        snprintf(t->note, sizeof t->note, "%s holds error-feedback state of --compress %s, this run uses %s: the "
                 "residuals start at zero", path, dp_compress_name((enum dp_compress)ef.kind),
                 dp_compress_name(t->p.dp.compress.kind));
    else if ((int)ef.workers != t->G)
        snprintf(t->note, sizeof t->note, "%s was saved by %u workers, this run has %d: the error-feedback "
                 "residuals are reset to zero", path, ef.workers, t->G);
    else
        for (int r = 0; r < t->P; r++)
            dp_sync_ef_set(&t->w[r].sync, (const float *)(const void *)((const char *)data + sizeof ef) +
                                              (size_t)len * (size_t)t->w[r].grank);
    dp_free(data);
    return DP_OK;
}

/* The public helpers that build a checkpoint's model: here, not in ckpt.c, so that the
 * file format stays apart from src/nn (its fuzzer builds it alone). */
int dp_ckpt_build_model(const char *path, const struct dp_ckpt_header *h, struct dp_model **m) {
    *m = NULL;
    char *text;
    int rc = dp_ckpt_model_text(path, &text);
    if (rc) return rc;
    if (!text) return dp_model_from_spec(m, h->model_spec, h->in_shape[0], h->in_shape[1], h->in_shape[2]);
    const char *name = strncmp(h->model_spec, "file:", 5) ? h->model_spec : h->model_spec + 5;
    rc = dp_model_from_text(m, text, name);
    dp_free(text);
    if (rc) return dp_adderr(rc, "%s: its model", path);
    snprintf((*m)->spec, sizeof (*m)->spec, "%s", h->model_spec); /* the name the run gave it */
    return DP_OK;
}

int dp_ckpt_reads_tokens(const char *path, const struct dp_ckpt_header *h) {
    char *text;
    if (dp_ckpt_model_text(path, &text)) return 0;
    int r = text ? dp_model_text_reads_tokens(text) : dp_model_spec_reads_tokens(h->model_spec);
    dp_free(text);
    return r;
}

/* Two model files' canonical texts (one statement a line): the first statement that
 * differs, as "the checkpoint has 'A' where this run has 'B'", into msg; "" when equal. */
static void model_text_diff(const char *a, const char *b, char *msg, size_t cap) {
    msg[0] = 0;
    for (;;) {
        int la = (int)strcspn(a, "\n"), lb = (int)strcspn(b, "\n");
        if (la != lb || memcmp(a, b, (size_t)la)) {
            if (!la) snprintf(msg, cap, "this run has '%.150s' after the checkpoint's last statement", b);
            else if (!lb) snprintf(msg, cap, "the checkpoint has '%.*s' after this run's last statement", la > 150 ? 150 : la, a);
            else snprintf(msg, cap, "the checkpoint has '%.*s' where this run has '%.*s'", la > 150 ? 150 : la, a,
                          lb > 150 ? 150 : lb, b);
            return;
        }
        if (!a[la]) return;
        a += la + 1, b += lb + 1;
    }
}

/* Restores the state saved by dp_trainer_save into every worker.  Every
 * field that must agree with this run is checked first, so nothing is
 * half-loaded on error.  The checkpoint does not depend on the worker count:
 * any P can resume it.  No worker holds the whole payload: the reader's
 * pass (which checks it) puts the parameters and buffers into worker 0's
 * replica (stage 3: only the buffers), the others copy them from there, and
 * each worker reads its own pieces of the optimizer state (stage 3: of the
 * parameters too) at their offsets in the whole-slab layout. */
int dp__load_checkpoint(struct dp_trainer *t, const char *path) {
    struct dp_ckpt_header h;
    int rc = dp_ckpt_read_header(path, &h);
    if (rc) return rc;
    const struct dp_model *m = t->model;
    /* the whole-slab layout whatever the stage: with ZeRO each worker takes its shard */
    int64_t full_state = dp_sync_state_len(&t->w[0].sync);
    char *text = NULL, diff[400] = "";
    if ((rc = dp_ckpt_model_text(path, &text))) return rc;
    if (text && m->desc) model_text_diff(text, m->desc, diff, sizeof diff);
    dp_free(text);
    if (diff[0] && strcmp(h.model_spec, m->spec))
        rc = dp_seterr(DP_EMISMATCH, "%s: checkpoint is for model '%s', this run builds '%s' (%s)", path, h.model_spec,
                       m->spec, diff);
    else if (diff[0])
        rc = dp_seterr(DP_EMISMATCH, "%s: checkpoint is for another architecture: %s", path, diff);
    else if ((!text || !m->desc) && strcmp(h.model_spec, m->spec) != 0)
        rc = dp_seterr(DP_EMISMATCH, "%s: checkpoint is for model '%s', this run builds '%s'", path,
                       h.model_spec, m->spec);
    else if (h.num_params != m->num_params || h.num_buffers != m->num_buffers)
        rc = dp_seterr(DP_EMISMATCH, "%s: checkpoint has %lld parameters, model '%s' has %lld", path,
                       (long long)h.num_params, m->spec, (long long)m->num_params);
    else if (h.in_shape[0] != m->in_shape.d[0] || h.in_shape[1] != m->in_shape.d[1] ||
             h.in_shape[2] != m->in_shape.d[2])
        rc = dp_seterr(DP_EMISMATCH, "%s: checkpoint input shape differs from the data's", path);
    else if ((int)h.optim_kind != (int)t->p.optim.kind)
        rc = dp_seterr(DP_EMISMATCH, "%s: checkpoint's optimizer is %s, this run's is %s (--optim)", path,
                       dp_optim_kind_name((enum dp_optim_kind)h.optim_kind), dp_optim_kind_name(t->p.optim.kind));
    else if (h.optim_state_len != full_state && h.optim_kind == DP_OPTIM_SGD)
        /* SGD keeps a velocity only with momentum */
        rc = dp_seterr(DP_EMISMATCH, "%s: checkpoint's SGD %s momentum state (--momentum %g), this run's %s "
                       "(--momentum %g): give --momentum %g, or leave it out to take the checkpoint's", path,
                       h.momentum > 0 ? "keeps" : "has no", (double)h.momentum, t->p.optim.momentum > 0 ? "needs it" : "has none",
                       (double)t->p.optim.momentum, (double)h.momentum);
    else if (h.optim_state_len != full_state)
        rc = dp_seterr(DP_EMISMATCH, "%s: checkpoint's optimizer state has %lld floats, this run's %s needs %lld", path,
                       (long long)h.optim_state_len, dp_optim_kind_name(t->p.optim.kind), (long long)full_state);
    else if (h.batch != t->p.run.batch)
        rc = dp_seterr(DP_EMISMATCH, "%s: checkpoint was trained with batch %lld, this run uses %lld "
                       "(the data order would differ)", path, (long long)h.batch, (long long)t->p.run.batch);
    else if (h.seed != t->p.run.seed)
        rc = dp_seterr(DP_EMISMATCH, "%s: checkpoint seed %llu differs from --seed %llu", path,
                       (unsigned long long)h.seed, (unsigned long long)t->p.run.seed);
    struct dp_ckpt_reader *rd = NULL;
    /* a corrupt file is reported as corrupt, not as a setting that differs: on a mismatch the
     * whole file's checksums are checked first (a pass that loads nothing) */
    if (rc) {
        char why[1024];
        snprintf(why, sizeof why, "%s", dp_errmsg());
        struct dp_ckpt_header h2;
        int crc = dp_ckpt_reader_open(&rd, path, &h2, NULL, NULL);
        dp_ckpt_reader_close(rd);
        return crc ? crc : dp_seterr(rc, "%s", why);
    }
    const int p3 = dp_sync_sharded_params(&t->w[0].sync); /* ZeRO 3: no whole parameters */
    const int held = dp__pipe_partial(t);                  /* a pipeline: each worker its stage's */
    if (!rc) rc = dp_ckpt_reader_open(&rd, path, &h, p3 || held ? NULL : t->w[0].rep.params, t->w[0].rep.buffers);
    for (int r = 0; !rc && r < t->P; r++) {
        struct worker *w = &t->w[r];
        int64_t off[2], len[2];
        for (int i = 0, n = held ? dp__pipe_held(w, off, len) : 0; i < n && !rc; i++)
            rc = dp_ckpt_reader_read(rd, off[i], len[i], w->rep.params + off[i]);
        if (r > 0 && !p3 && !held) memcpy(w->rep.params, t->w[0].rep.params, sizeof(float) * (size_t)h.num_params);
        if (r > 0) memcpy(w->rep.buffers, t->w[0].rep.buffers, sizeof(float) * (size_t)h.num_buffers);
        /* piece i's part k (k = -1: stage 3's parameters) lies at k n + off in
         * the state (after the params and buffers), at off in the params */
        for (int i = 0; !rc && i < dp_sync_npieces(&w->sync); i++)
            for (int k = p3 ? -1 : 0; !rc && k < dp_sync_state_parts(&w->sync); k++) {
                struct dp_zero_piece pc;
                float *data = dp_sync_piece(&w->sync, i, k, &pc);
                int64_t at = k < 0 ? pc.off : h.num_params + h.num_buffers + k * h.num_params + pc.off;
                rc = dp_ckpt_reader_read(rd, at, pc.len, data);
            }
        w->sync.opt.step = h.optim_step;
    }
    dp_ckpt_reader_close(rd);
    if (!rc) {
        t->step = h.step;
        t->epoch = h.epoch;
        t->step_in_epoch = h.step_in_epoch;
    }
    if (!rc) rc = load_ef_state(t, path);
    return rc;
}

/* At an epoch boundary the position in the schedule follows from the epoch,
 * and each mode counts it its own way: synchronous and SSP in global batches
 * (steps_per_epoch per epoch), plain async in pushes (ps_batches per epoch:
 * batches of batch / P), the replay in clock x P + r (steps_per_epoch x P).
 * The checkpoint's step is its own mode's count; one saved by another mode,
 * worker count or --train-limit would put this run at a wrong point of its
 * schedule, so it continues from this mode's count for the epoch, and says
 * so.  (The optimizer's own step, AdamW's bias correction, is kept.) */
void dp__resume_position(struct dp_trainer *t) {
    const struct dp_train_params *p = &t->p;
    int64_t per = t->steps_per_epoch;
    const char *mode = "synchronous";
    if (p->dp.staleness >= 0) mode = "--staleness";
    else if (p->dp.async && p->dp.deterministic) per = t->steps_per_epoch * (p->dp.inter ? t->ps_W : t->P), mode = "the replay";
    else if (p->dp.async) per = t->ps_batches, mode = "--mode async";
    int64_t want = t->epoch * per;
    if (t->step == want) return;
    size_t len = strlen(t->note);
    snprintf(t->note + len, sizeof t->note - len, "%sthe checkpoint's step %lld (its mode's count at the start of "
             "epoch %lld) is %lld in this run (%s, %d worker%s): the schedule continues from there", len ? "; " : "",
             (long long)t->step, (long long)t->epoch + 1, (long long)want, mode, t->G, t->G > 1 ? "s" : "");
    t->step = want;
}

void dp__fill_header(const struct dp_trainer *t, struct dp_ckpt_header *h) {
    const struct worker *w = &t->w[0];
    memset(h, 0, sizeof *h);
    const struct dp_model *m = t->model;
    snprintf(h->model_spec, sizeof h->model_spec, "%s", m->spec);
    for (int i = 0; i < m->in_shape.ndim && i < 4; i++) h->in_shape[i] = m->in_shape.d[i];
    h->num_params = m->num_params;
    h->num_buffers = m->num_buffers;
    h->seed = t->p.run.seed;
    h->step = t->step;
    h->epoch = t->epoch;
    h->step_in_epoch = t->step_in_epoch;
    h->batch = t->p.run.batch;
    h->optim_kind = (uint32_t)t->p.optim.kind;
    h->nesterov = (uint32_t)t->p.optim.nesterov;
    h->momentum = t->p.optim.momentum;
    h->dampening = t->p.optim.dampening;
    h->weight_decay = t->p.optim.weight_decay;
    h->beta1 = t->p.optim.beta1;
    h->beta2 = t->p.optim.beta2;
    h->eps = t->p.optim.eps;
    h->lr = t->p.sched.base_lr;
    h->sched_kind = (uint32_t)t->p.sched.kind;
    h->optim_step = w->sync.opt.step;
    /* the whole slab's state whatever the ZeRO stage (zero_stream writes it from the shards) or the
     * pipeline stage (dp__state_part_each) */
    h->optim_state_len = dp_sync_state_len(&w->sync);
}

/* ---- ZeRO checkpoints, streamed from the shards --------------------------------------------
 * A ZeRO checkpoint is today's file (the whole-slab layout, so any stage
 * and worker count resumes it, and ckpt info/diff/export read it), but no
 * process gathers the whole state: rank 0 writes the payload in file order
 * and each piece comes from its owner as it is written:
 *
 *     params        stage 3: range by range from the slab's start, in each
 *                   range the ranks' pieces in rank order (their pshard);
 *                   else rank 0's slab
 *     buffers       rank 0's (replicated)
 *     state part k  the ranges and pieces in the same order, each piece's
 *                   part k (dp_sync_piece)
 *
 * One process (G == P): rank 0 reads the other workers' pieces in place;
 * they are idle (waiting at the epoch's barrier, or the run is over), so
 * the save holds nothing beyond the shards.  Several processes: every
 * worker of the job runs the same loop, and each piece travels in blocks of
 * at most ZBLOCK floats (4 MiB), broadcast by its owner, so a process holds
 * one block per worker beyond its shards.  (dp_comm has no gather to one
 * root: the broadcast delivers a block to every rank, as the all-gather of
 * the whole state it replaces did.)  docs/ddp.md "ZeRO" says why one file
 * rather than a file per shard. */
#define ZBLOCK ((int64_t)1 << 20)

/* Part `part` (-1: stage 3's parameters) in file order.  out: rank 0's
 * writer (NULL on the others, or where rank 0 could not open the file: it
 * still sends its pieces); buf: ZBLOCK floats for the broadcasts, NULL to
 * read in place.  A write error stays in out (sticky) and the loop goes on,
 * so that no rank waits for a broadcast that never comes. */
static int zero_stream_part(struct worker *w, struct dp_ckpt_writer *out, float *buf, int part) {
    struct dp_trainer *t = w->t;
    int rc = DP_OK;
    /* the groups that shard a range: the job's workers, or a pipeline's stages (threads), each
     * stage's R replicas sharding its span; the groups in slab order */
    const int groups = t->pp > 1 ? t->pp : 1, R = t->G / groups;
    for (int g = 0; g < groups && !rc; g++) {
        const struct worker *lead = groups > 1 ? &t->w[g * R] : w;
        for (int i = dp_sync_npieces(&lead->sync) - 1; i >= 0 && !rc; i--) /* piece 0 is the highest range */
            for (int q = g * R; q < (g + 1) * R && !rc; q++) {
                int64_t off, len;
                struct dp_zero_piece pc;
                (void)dp_sync_piece(&lead->sync, i, part, &pc);
                dp_comm_split(pc.rcount, R, q - g * R, &off, &len);
                const struct worker *o = buf ? (w->grank == q ? w : NULL) : &t->w[q];
                const float *src = o ? dp_sync_piece(&o->sync, i, part, NULL) : NULL;
                for (int64_t b = 0; b < len && !rc; b += ZBLOCK) {
                    const int64_t c = len - b < ZBLOCK ? len - b : ZBLOCK;
                    const float *x = src ? src + b : NULL;
                    if (buf) {
                        if (src) memcpy(buf, x, sizeof(float) * (size_t)c);
                        rc = dp_comm_broadcast(w->comm, buf, c, DP_DTYPE_F32, q, DP_ALGO_AUTO);
                        x = buf;
                    }
                    if (out && !rc) dp_ckpt_writer_put(out, x, sizeof(float) * (size_t)c);
                }
            }
    }
    return rc;
}

/* The payload of a ZeRO checkpoint: rank 0 with its writer; in a
 * multi-process job also every other worker (out NULL), at the same point. */
int dp__zero_stream(struct worker *w, struct dp_ckpt_writer *out) {
    struct dp_trainer *t = w->t;
    const struct dp_model *m = t->model;
    float *buf = NULL;
    if (t->G > t->P) {
        int64_t most = 1;
        for (int i = 0; i < dp_sync_npieces(&w->sync); i++) {
            struct dp_zero_piece pc;
            (void)dp_sync_piece(&w->sync, i, 0, &pc);
            int64_t c = (pc.rcount + t->G - 1) / t->G;
            if (c > most) most = c;
        }
        if (!(buf = dp_malloc(sizeof(float) * (size_t)(most < ZBLOCK ? most : ZBLOCK))))
            return dp_seterr(DP_ENOMEM, "checkpoint: out of memory for a block of the ZeRO state");
    }
    int rc = DP_OK;
    if (dp_sync_sharded_params(&w->sync)) rc = zero_stream_part(w, out, buf, -1);
    else if (out) dp_ckpt_writer_put(out, w->rep.params, sizeof(float) * (size_t)m->num_params);
    if (out && !rc) dp_ckpt_writer_put(out, w->rep.buffers, sizeof(float) * (size_t)m->num_buffers);
    for (int k = 0; k < dp_sync_state_parts(&w->sync) && !rc; k++) rc = zero_stream_part(w, out, buf, k);
    dp_free(buf);
    return rc;
}

/* Rank 0 writes a checkpoint now (checkpoint() below): in a multi-process job whose state is
 * spread over the processes (ZeRO's pieces, a pipeline's stages) every other worker sends its
 * part meanwhile. */
int dp__ckpt_serves(const struct dp_trainer *t) {
    return (t->p.dp.zero || t->pp > 1) && t->p.io.out_dir && t->G > t->P;
}
int dp__ckpt_serve(struct worker *w) { return w->pipe ? dp__pipe_serve(w) : dp__zero_stream(w, NULL); }

/* The compressor's per-worker state (residuals, PowerSGD's Q), every
 * worker's in rank order, as the section after the payload: this process's
 * workers' when it holds every worker, else (a multi-process job) the
 * states ef_gather_state brought to rank 0 at this step; a multi-process
 * save at another step writes none (its resume starts the residuals at
 * zero, with a note).  *data: NULL where there is none. */
int dp__ckpt_ef_image(const struct dp_trainer *t, char **data, size_t *size) {
    const struct worker *w = &t->w[0];
    int64_t len = dp_sync_ef_len(&w->sync);
    int gathered = t->G != t->P && t->efstate && t->efstate_step == w->sync.opt.step;
    *data = NULL, *size = 0;
    if (!len || (t->G != t->P && !gathered)) return DP_OK;
    size_t n = sizeof(struct dp_ckpt_ef) + sizeof(float) * (size_t)len * (size_t)t->G;
    char *d = dp_malloc_big(n);
    if (!d) return dp_seterr(DP_ENOMEM, "checkpoint: out of memory for the error-feedback state");
    struct dp_ckpt_ef ef = {.kind = (uint32_t)t->p.dp.compress.kind, .workers = (uint32_t)t->G, .len = len};
    memcpy(d, &ef, sizeof ef);
    if (gathered) memcpy(d + sizeof ef, t->efstate, sizeof(float) * (size_t)len * (size_t)t->G);
    for (int r = 0; !gathered && r < t->P; r++)
        dp_sync_ef_get(&t->w[r].sync, (float *)(void *)(d + sizeof ef) + (size_t)len * (size_t)r);
    *data = d, *size = n;
    return DP_OK;
}

/* The sections after the payload: the error-feedback state (ef, NULL for
 * none), the length of metrics.jsonl when the state was taken (a resume
 * cuts the file back to it: load_metrics; < 0 for none) and what the run
 * was built from (configuration, model, tokenizer, classes, normalisation:
 * fixed for the run, so a background writer reads them too). */
void dp__ckpt_put_sections(const struct dp_trainer *t, struct dp_ckpt_writer *out, const char *ef, size_t ef_size,
                           int64_t metrics_bytes) {
    if (ef) dp_ckpt_writer_section(out, DP_CKPT_EF_TAG, ef, ef_size);
    if (metrics_bytes >= 0) {
        struct dp_ckpt_metrics mb = {.bytes = metrics_bytes};
        dp_ckpt_writer_section(out, DP_CKPT_METRICS_TAG, &mb, sizeof mb);
    }
    if (t->p.io.config) dp_ckpt_writer_section(out, DP_CKPT_CONFIG_TAG, t->p.io.config, strlen(t->p.io.config));
    if (t->model->desc) dp_ckpt_writer_section(out, DP_CKPT_MODEL_TAG, t->model->desc, strlen(t->model->desc));
    if (t->bpe) dp_ckpt_writer_section(out, DP_CKPT_BPE_TAG, t->bpe, t->bpe_len);
    if (t->class_names) dp_ckpt_writer_section(out, DP_CKPT_CLASSES_TAG, t->class_names, strlen(t->class_names));
    char *norm = dp__norm_text(t);
    if (norm) dp_ckpt_writer_section(out, DP_CKPT_NORM_TAG, norm, strlen(norm));
    dp_free(norm);
}

static void put_floats(void *arg, const float *p, int64_t n) {
    if (arg) dp_ckpt_writer_put(arg, p, sizeof(float) * (size_t)n);
}

int dp_trainer_save(struct dp_trainer *t, const char *path) {
    struct worker *w = &t->w[0];
    if ((t->p.dp.zero || t->pp > 1) && t->G > t->P && !t->zsaving)
        return dp_seterr(DP_ENOTSUP, "checkpoint: a multi-process %s job writes its checkpoints during the run "
                         "(every rank sends its pieces), at epoch ends and --max-steps", t->pp > 1 ? "pipeline" : "ZeRO");
    struct dp_ckpt_header h;
    dp__fill_header(t, &h);
    char *data;
    size_t size;
    int rc = dp__ckpt_ef_image(t, &data, &size);
    struct dp_ckpt_writer *out = NULL;
    if (!rc) rc = dp_ckpt_writer_open(&out, path, &h);
    int src = DP_OK;
    if (!t->p.dp.zero) {
        if (dp__pipe_partial(t)) /* (the stages' spans; across processes received even where the file failed) */
            src = dp__state_part_each(t, -1, put_floats, out);
        else if (out)
            dp_ckpt_writer_put(out, w->rep.params, sizeof(float) * (size_t)h.num_params);
        if (out) dp_ckpt_writer_put(out, w->rep.buffers, sizeof(float) * (size_t)h.num_buffers);
        /* (a pipeline across processes: the stages' parts received even where the file failed) */
        for (int k = 0; k < dp_sync_state_parts(&w->sync) && !src; k++)
            src = dp__state_part_each(t, k, put_floats, out);
    } else
        src = dp__zero_stream(w, out); /* (the others wait for the pieces even where the file failed) */
    if (out) {
        h.param_hash = dp_ckpt_writer_hash(out); /* (ZeRO: of what it wrote) */
        dp__ckpt_put_sections(t, out, data, size, t->metrics ? (int64_t)ftell(t->metrics) : -1); /* (flushed) */
        int crc = dp_ckpt_writer_close(out, &h, NULL, NULL, 0);
        if (!src) src = crc;
    }
    if (!rc) rc = src;
    dp_free(data);
    return rc;
}

/* The run folder keeps the latest two checkpoints: before a new
 * checkpoint.bin replaces the old one, the old one becomes
 * checkpoint.prev.bin (a second name for the same file, made under a
 * temporary name and renamed into place, so at every instant both names
 * hold a whole checkpoint).  A folder without a checkpoint yet has nothing
 * to keep. */
int dp__ckpt_keep_previous(const char *path) {
    char prev[4200], tmp[4300];
    size_t n = strlen(path);
    if (n < 4 || strcmp(path + n - 4, ".bin") != 0) return DP_OK;
    snprintf(prev, sizeof prev, "%.*s.prev.bin", (int)(n - 4), path);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", prev, (long)getpid());
    struct stat st;
    /* (something else in checkpoint.bin's place is no checkpoint to keep: the write's rename names it) */
    if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode)) return DP_OK;
    unlink(tmp);
    if (link(path, tmp) != 0) {
        if (errno == ENOENT) return DP_OK;
        return dp_seterr(DP_EIO, "checkpoint: cannot keep %s as %s: %s", path, prev, strerror(errno));
    }
    if (rename(tmp, prev) != 0) {
        int e = errno;
        unlink(tmp);
        return dp_seterr(DP_EIO, "checkpoint: cannot keep %s as %s: %s", path, prev, strerror(e));
    }
    return DP_OK;
}

int dp__checkpoint_write(struct dp_trainer *t) {
    if (!t->p.io.out_dir) return DP_OK;
    char path[4096];
    snprintf(path, sizeof path, "%s/checkpoint.bin", t->p.io.out_dir);
    int rc = dp__snapshot_wait(t); /* (a background write first: the files keep their order) */
    if (!rc) rc = dp__ckpt_keep_previous(path);
    if (rc) return rc;
    t->zsaving = 1;
    rc = dp_trainer_save(t, path);
    t->zsaving = 0;
    if (rc) return rc;
    struct dp_event ev = {.kind = DP_EVENT_CHECKPOINT, .step = t->step, .epoch = t->epoch, .path = path};
    dp__emit_event(t, &ev);
    return DP_OK;
}

/* The error-feedback state of a multi-process job, for dp_trainer_save:
 * rank 0 writes the file, so every rank's state (len floats) comes to it.
 * One file with every rank's state, as a single-process job writes it,
 * rather than one file per rank: a resume reads one path (any rank count
 * that matches can resume, and the same file resumes on threads), and no
 * rank's disk has to be shared.  Through the worker's communicator in
 * rounds: round k all-gathers G blocks of B floats, block r = rank r's
 * state[k B, (k+1) B), so no rank holds more than G B floats besides rank
 * 0's G x len (B: about 1M / G).  Called by every worker where rank 0
 * then writes a checkpoint. */
int dp__ef_gather_state(struct worker *w) {
    struct dp_trainer *t = w->t;
    const int64_t len = dp_sync_ef_len(&w->sync), G = t->G;
    if (!t->p.io.out_dir || len == 0 || t->G == t->P) return DP_OK;
    int64_t B = ((int64_t)1 << 20) / G;
    if (B < 1) B = 1;
    if (B > len) B = len;
    float *mine = dp_malloc_big(sizeof(float) * (size_t)len), *buf = dp_malloc_big(sizeof(float) * (size_t)(G * B));
    if (w->grank == 0 && !t->efstate) t->efstate = dp_malloc_big(sizeof(float) * (size_t)(G * len));
    if (!mine || !buf || (w->grank == 0 && !t->efstate)) {
        dp_free(mine), dp_free(buf);
        return dp_seterr(DP_ENOMEM, "checkpoint: out of memory for the error-feedback state");
    }
    dp_sync_ef_get(&w->sync, mine);
    int rc = DP_OK;
    for (int64_t k0 = 0; !rc && k0 < len; k0 += B) {
        const int64_t n = len - k0 < B ? len - k0 : B;
        memcpy(buf + w->grank * B, mine + k0, sizeof(float) * (size_t)n);
        rc = dp_comm_allgather(w->comm, buf, G * B, DP_DTYPE_F32, DP_ALGO_AUTO);
        for (int64_t q = 0; !rc && w->grank == 0 && q < G; q++)
            memcpy(t->efstate + q * len + k0, buf + q * B, sizeof(float) * (size_t)n);
    }
    if (!rc && w->grank == 0) t->efstate_step = w->sync.opt.step;
    dp_free(mine), dp_free(buf);
    return rc;
}

/* --ckpt-every-steps within an epoch: as end_epoch's checkpoint (every worker: ZeRO's last
 * all-gather settled, the error-feedback state brought to rank 0, which writes while the
 * others stream their pieces where ZeRO spans processes; then a barrier) with --ckpt-sync.
 * Else a snapshot, written by a thread while training goes on (snapshot.c): rank 0 takes it
 * (the barrier holds the others until the copy is taken, since it reads their
 * error-feedback state), or with ZeRO every worker its own pieces. */
static int step_checkpoint(struct worker *w) {
    struct dp_trainer *t = w->t;
    int rc = dp_sync_settle(&w->sync);
    if (!rc) rc = dp__ef_gather_state(w);
    if (!rc && t->p.dp.zero && dp__snapshot_on(t)) rc = dp__zsnap_take(w);
    else if (!rc && w->grank == 0) rc = dp__snapshot_on(t) ? dp__snapshot_take(t) : dp__checkpoint_write(t);
    else if (!rc && dp__ckpt_serves(t)) rc = dp__ckpt_serve(w);
    return rc ? rc : dp_comm_barrier(w->comm);
}

int dp__step_checkpoint(struct worker *w, int64_t step, int epoch_ends) {
    struct dp_trainer *t = w->t;
    if (!t->p.io.out_dir) return DP_OK;
    int rc = dp__zsnap_poll(w); /* (a ZeRO snapshot of several processes still to finish) */
    if (rc || !t->p.io.ckpt_every_steps || step % t->p.io.ckpt_every_steps) return rc;
    if (epoch_ends) { /* with the epoch's end */
        w->ckpt_due = 1;
        return DP_OK;
    }
    return step_checkpoint(w);
}
