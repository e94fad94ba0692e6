/* dp_trainer_init: the data, the model, the workers and what each mode needs
 * (backup workers, the parameter server), and a resume's starting state. */
#include "trainer.h"

/* A pipeline's worker holds its stage's span and a tied copy only (dp__pipe_partial): drawn
 * from the seed (counter-based: the values one worker draws), or, where --init-from filled
 * worker 0's whole slab, copied from there, and the rest of worker 0's given back. */
static int held_params(struct dp_trainer *t, int filled) {
    const struct dp_model *m = t->model;
    const float *w0 = t->w[0].rep.params;
    for (int r = t->P - 1; r >= 0; r--) { /* (worker 0's last: the others copy from its slab) */
        struct worker *w = &t->w[r];
        int64_t off[2], len[2];
        const int n = dp__pipe_held(w, off, len);
        if (!filled) {
            for (int i = 0; i < n; i++) dp_model_init_slice(m, 0, w->rep.params + off[i], off[i], len[i], t->p.run.seed);
            continue;
        }
        if (r > 0) {
            for (int i = 0; i < n; i++) memcpy(w->rep.params + off[i], w0 + off[i], sizeof(float) * (size_t)len[i]);
            continue;
        }
        float *tie = n > 1 ? dp_malloc(sizeof(float) * (size_t)len[1]) : NULL;
        if (n > 1 && !tie) return dp_seterr(DP_ENOMEM, "--init-from: out of memory");
        if (tie) memcpy(tie, w->rep.params + off[1], sizeof(float) * (size_t)len[1]);
        const int64_t end = off[0] + len[0];
        dp_slab_release(w->rep.params, sizeof(float) * (size_t)off[0]);
        dp_slab_release(w->rep.params + end, sizeof(float) * (size_t)(m->num_params - end));
        if (tie) memcpy(w->rep.params + off[1], tie, sizeof(float) * (size_t)len[1]);
        dp_free(tie);
    }
    return DP_OK;
}

static int worker_init(struct dp_trainer *t, struct worker *w, int rank) {
    const struct dp_train_params *p = &t->p;
    w->t = t;
    w->rank = rank;
    w->grank = t->base + rank;
    /* ZeRO 2 and 3 (sharded): the slabs a worker holds only parts of are
     * mapped, never touched as a whole (the gradient; stage 3, the parameters) */
    int lazy = p->dp.zero >= 2 && t->G > 1 ? DP_REPLICA_LAZY_GRADS | (p->dp.zero == 3 ? DP_REPLICA_LAZY_PARAMS : 0) : 0;
    /* --pp: a worker holds its stage's parameters and gradient (and a tied copy), the rest mapped
     * and never touched (dp__pipe_partial); its passes run in views, so the replica's arena grows
     * only if it is used (dp_trainer_evaluate after the run) */
    const int pipe_lazy = dp__pipe_partial(t) ? DP_REPLICA_LAZY_GRADS | DP_REPLICA_LAZY_PARAMS | DP_REPLICA_LAZY_ARENA : 0;
    int rc = dp_replica_init_lazy(&w->rep, t->model, t->max_batch, lazy | pipe_lazy);
    if (rc) return rc;
    if ((rc = dp_comm_thread_init(&w->comm, t->world, rank))) return rc;
    struct dp_loader_params lp = dp_loader_default_params();
    lp.batch = p->run.batch;
    lp.shuffle = 1;
    lp.seed = p->run.seed;
    lp.aug = p->data.aug;
    lp.prefetch = p->data.prefetch;
    lp.rank = w->grank;
    lp.world = t->ps_W; /* G, but for the parameter server's ranks under mpirun */
    if (lp.rank >= t->ps_W) lp.rank = 0, lp.prefetch = 0; /* a server rank: its loader is not read */
    lp.align = p->dp.deterministic && !p->dp.async ? p->dp.det_chunk : 1;
    lp.uneven = t->balance;
    if (t->pp > 1 && (rc = dp__pipe_worker_init(w, &lp))) return rc; /* (its stage's replica's share) */
    if ((rc = dp__tp_worker_init(w, &lp))) return rc;                  /* (its tensor group's share) */
    if (t->ps_dynamic) {
        /* plain async: this worker reads whichever batch k of ceil(batch / P)
         * samples it claims (dp_loader_seek, then next); no prefetch, as the
         * next batch it will read is not known in advance (ps_loop) */
        lp.batch = (p->run.batch + t->ps_W - 1) / t->ps_W;
        lp.rank = 0, lp.world = 1, lp.prefetch = 0;
    }
    if (t->text) {
        rc = dp_loader_init_text(&w->loader, &t->tokens, &t->split, t->ctx, t->windows, &lp);
        if (!rc) {
            size_t n = (size_t)(t->eval_chunk * t->ctx);
            w->etok = dp_malloc(n * sizeof(int32_t));
            w->etgt = dp_malloc(n * sizeof(int32_t));
            if (!w->etok || !w->etgt) rc = dp_seterr(DP_ENOMEM, "trainer: out of memory");
        }
    } else {
        rc = dp_loader_init(&w->loader, &t->train, &lp);
        if (!rc && t->test.src &&
            !(w->ex = dp_malloc_big(sizeof(float) * (size_t)(t->eval_chunk * t->test.C * t->test.H * t->test.W))))
            rc = dp_seterr(DP_ENOMEM, "trainer: out of memory");
    }
    if (rc) return rc;
    /* ~10 events per step: 200k covers long runs; later events are counted, not kept */
    if ((rc = dp_timeline_init(&w->tl, p->io.timeline ? 200000 : 0))) return rc;
    if (p->dp.skip_nonfinite && t->model->num_buffers > 0) {
        w->buf_save = dp_malloc(sizeof(float) * (size_t)t->model->num_buffers);
        if (!w->buf_save) return dp_seterr(DP_ENOMEM, "--skip-nonfinite: out of memory");
    }
    /* the step's synchronisation (dp/ddp.h dp_sync): the reducer, ZeRO, the optimizer */
    struct dp_sync_params sp = dp_sync_default_params();
    sp.reducer.bucket_cap_bytes = p->dp.bucket_cap_bytes;
    sp.reducer.first_bucket_bytes = p->dp.first_bucket_bytes;
    sp.reducer.unit_bytes = p->dp.zero_unit_bytes;
    sp.reducer.overlap = p->dp.overlap;
    sp.reducer.algo = (enum dp_comm_algo)p->dp.algo;
    sp.reducer.compress = p->dp.compress;
    sp.reducer.compress.seed = p->run.seed;
    if (p->optim.kind == DP_OPTIM_SGD && !p->optim.nesterov && p->optim.dampening == 0)
        sp.reducer.compress.momentum = p->optim.momentum;
    sp.optim = p->optim;
    sp.zero = p->dp.zero, sp.zero_scatter = p->dp.zero_scatter, sp.lazy = lazy;
    /* ZeRO 1: the all-gather ahead (src/ddp/zero.c "Ahead"): asked for, or by default across processes */
    sp.zero_ahead = p->dp.zero == 1 && t->G > 1 &&
                    (p->dp.zero_gather == DP_ZERO_GATHER_AHEAD || (p->dp.zero_gather == DP_ZERO_GATHER_AUTO && t->G > t->P));
    sp.deterministic = p->dp.deterministic;
    sp.positions = (double)t->pos;
    /* --pp: the stage's span, reduced among the stage's replicas */
    struct dp_comm *comm = w->pipe ? dp__pipe_sync_params(w, &sp) : w->comm;
    if ((rc = dp_sync_init(&w->sync, t->model, comm, &w->rep, &sp))) return rc;
    w->arrival = dp_calloc((size_t)w->sync.red.nb + 1, sizeof(double));
    w->waits = dp_calloc((size_t)t->G, sizeof(double));
    if (!w->arrival || !w->waits) return dp_seterr(DP_ENOMEM, "trainer: out of memory");
    if (t->bk_on && !(w->dropped = dp_calloc((size_t)t->G, 1))) return dp_seterr(DP_ENOMEM, "trainer: out of memory");
    if (t->balance) {
        w->bal_rate = dp_calloc((size_t)t->G, sizeof(int64_t));
        w->bal_fix = dp_calloc((size_t)t->G, sizeof(int64_t));
        w->bal_fixu = dp_calloc((size_t)t->G, sizeof(int64_t));
        w->bal_new = dp_calloc((size_t)t->G, sizeof(int64_t));
        w->bal_buf = dp_calloc(3 * (size_t)t->G, sizeof(double));
        if (!w->bal_rate || !w->bal_fix || !w->bal_fixu || !w->bal_new || !w->bal_buf)
            return dp_seterr(DP_ENOMEM, "trainer: out of memory");
    }
    return DP_OK;
}

/* Samples per evaluation chunk: images, and text windows.  Both are fixed
 * (never derived from the worker count: see eval.c).  A window
 * costs T positions of activations, O(T^2) per head in attention, so text
 * chunks are small. */
#define EVAL_CHUNK 256
#define TEXT_EVAL_CHUNK 16

/* Where the model comes from: a spec string, or a model file's text (origin: its path). */
struct model_src {
    const char *spec;
    char *text;
    const char *origin;
};

/* Builds t->model from src before the data is read, where the model declares its own input:
 * the caller's builder, a model file's text (a checkpoint's too, under its spec's name).  A
 * spec string waits for the data's shape (build_model). */
static int build_declared(struct dp_trainer *t, const struct model_src *src) {
    const struct dp_train_params *p = &t->p;
    int rc = DP_OK;
    if (p->run.model_build) {
        if ((rc = p->run.model_build(&t->model, p->run.model_build_arg)))
            return dp_adderr(rc, "the caller's model_build");
        if (!t->model) return dp_seterr(DP_EINVAL, "the caller's model_build returned no model");
        if (!t->model->finalized && (rc = dp_model_finalize(t->model))) return rc;
    } else if (src->text) {
        if ((rc = dp_model_from_text(&t->model, src->text, src->origin))) return rc;
        snprintf(t->model->spec, sizeof t->model->spec, "%s", src->spec);
    }
    return rc;
}

/* t->model for ds's samples (C, H, W) and classes: from the spec, or the one built already,
 * which must take them.  (A token model's ds is NULL.) */
static int build_model(struct dp_trainer *t, const struct model_src *src, const struct dp_dataset *ds) {
    int64_t C = ds ? ds->C : 1, H = ds ? ds->H : 1, W = ds ? ds->W : 1;
    /* the IDX sets keep the ten outputs they always had, whatever classes a limit leaves */
    int64_t K = ds && ds->src ? ds->num_classes : 10;
    if (!t->model) return dp_model_from_spec_outputs(&t->model, src->spec, C, H, W, K);
    const struct dp_shape *in = &t->model->in_shape;
    if (!t->text && (in->ndim != 3 || in->d[0] != C || in->d[1] != H || in->d[2] != W))
        return dp_seterr(DP_EMISMATCH, "model %s declares input %lld %lld %lld, the data's samples are %lld x %lld "
                         "x %lld (C x H x W)", src->origin ? src->origin : t->model->spec, (long long)in->d[0],
                         (long long)in->d[1], (long long)in->d[2], (long long)C, (long long)H, (long long)W);
    return DP_OK;
}

/* The BPE tokenizer beside the token file (prepare-text --vocab writes FILE.bpe), if any: each
 * token's length in bytes (the validation's bits per byte) and the file's bytes (the checkpoint
 * keeps them, so that `sample` decodes with the tokenizer the model learned). */
static int load_tokenizer(struct dp_trainer *t) {
    char path[4096];
    int rc = dp_bpe_find_for(t->p.data.data_dir, path, sizeof path);
    if (rc <= 0) return rc;
    struct dp_bpe *b;
    if ((rc = dp_bpe_load(&b, path))) return rc;
    if (dp_bpe_vocab(b) != t->tokens.vocab)
        rc = dp_seterr(DP_EMISMATCH, "%s has %lld tokens, its token file %s a vocabulary of %lld: not its tokenizer "
                       "(prepare the text again)", path, (long long)dp_bpe_vocab(b), t->p.data.data_dir,
                       (long long)t->tokens.vocab);
    if (!rc && !(t->tok_len = dp_malloc(sizeof(uint16_t) * (size_t)t->tokens.vocab)))
        rc = dp_seterr(DP_ENOMEM, "out of memory");
    for (int64_t k = 0; !rc && k < t->tokens.vocab; k++) {
        const uint8_t *bytes;
        size_t len;
        if (!(rc = dp_bpe_token_bytes(b, k, &bytes, &len))) t->tok_len[k] = (uint16_t)len; /* <= 1024 */
    }
    if (!rc) rc = dp_bpe_serialize(b, &t->bpe, &t->bpe_len);
    dp_bpe_free(b);
    return rc;
}

/* A token model's data: the token file named by --data, its fixed split
 * (the last DP_TEXT_VAL_FRAC of the tokens validate), and the model.
 *
 * An epoch is floor(train_n / (ctx + 1)) windows, as many as fit side by
 * side in the training part: an epoch reads about as many tokens as the part
 * holds (windows are drawn with replacement, so not each one exactly once).
 * train_limit caps the windows per epoch, test_limit the validation windows. */
static int load_text(struct dp_trainer *t, const struct model_src *src) {
    const struct dp_train_params *p = &t->p;
    const char *spec = src->spec;
    struct stat st;
    if (!p->data.data_dir || (stat(p->data.data_dir, &st) == 0 && S_ISDIR(st.st_mode)))
        return dp_seterr(DP_EINVAL, "model '%s' trains on a token file, and --data %s is a folder: run "
                         "'dptrain prepare-text %s --out tokens.bin' first, then train with --data tokens.bin",
                         spec, p->data.data_dir ? p->data.data_dir : "(none)", p->data.data_dir ? p->data.data_dir : "DIR");
    /* (raw tokens name no vocabulary: the model's, which is then built first) */
    int rc = p->data.tokens_raw_u16 ? build_model(t, src, NULL) : dp_tokens_read(p->data.data_dir, &t->tokens);
    if (!rc && p->data.tokens_raw_u16) rc = dp_tokens_read_raw_u16(p->data.data_dir, dp_model_num_classes(t->model), &t->tokens);
    if (rc || (rc = load_tokenizer(t))) return rc;
    if (!p->data.tokens_raw_u16 && (rc = build_model(t, src, NULL))) return rc;
    t->ctx = t->model->in_shape.d[0];
    if (t->tokens.vocab > dp_model_num_classes(t->model))
        return dp_seterr(DP_EMISMATCH, "%s has a vocabulary of %lld tokens, model '%s' outputs %lld",
                         p->data.data_dir, (long long)t->tokens.vocab, spec,
                         (long long)dp_model_num_classes(t->model));
    if ((rc = dp_text_split_init(&t->split, t->tokens.n, DP_TEXT_VAL_FRAC))) return rc;
    if (t->split.train_n < t->ctx + 1)
        return dp_seterr(DP_EINVAL, "%s: the training part holds %lld tokens, a window of ctx %lld needs %lld",
                         p->data.data_dir, (long long)t->split.train_n, (long long)t->ctx, (long long)(t->ctx + 1));
    t->windows = t->split.train_n / (t->ctx + 1);
    if (p->data.train_limit > 0 && p->data.train_limit < t->windows) t->windows = p->data.train_limit;
    t->eval_chunk = TEXT_EVAL_CHUNK;
    return DP_OK;
}

/* --zero-unit-mb's line in the layout (after --pp's and --tp's): the layers it cuts. */
static void unit_layout(struct dp_trainer *t) {
    if (!t->p.dp.zero_unit_bytes) return;
    size_t at = strlen(t->layout);
    int n = snprintf(t->layout + at, sizeof t->layout - at, "%szero unit: %.4g MiB ranges", at ? "\n" : "",
                     (double)t->p.dp.zero_unit_bytes / 1048576.0);
    int cut = 0;
    for (int i = 0; i < t->model->nlayers && n > 0 && at + (size_t)n < sizeof t->layout; i++) {
        const struct dp_layer *l = t->model->layers[i];
        if (l->slice_rows > 0)
            n += snprintf(t->layout + at + n, sizeof t->layout - at - (size_t)n, "%s %s in %lld slices of %lld rows",
                          cut++ ? "," : ";", l->name, (long long)((l->rows + l->slice_rows - 1) / l->slice_rows),
                          (long long)l->slice_rows);
        else if (l->parts)
            n += snprintf(t->layout + at + n, sizeof t->layout - at - (size_t)n, "%s %s in %d ranges", cut++ ? "," : ";",
                          l->name, dp_layer_ranges(l, NULL, NULL, 0));
    }
    if (!cut && n > 0 && at + (size_t)n < sizeof t->layout)
        n += snprintf(t->layout + at + n, sizeof t->layout - at - (size_t)n, "; no layer larger than it that it can cut");
    if ((t->p.dp.zero < 2 || t->G == 1) && n > 0 && at + (size_t)n < sizeof t->layout)
        snprintf(t->layout + at + n, sizeof t->layout - at - (size_t)n,
                 " (it saves memory with --zero 2 or 3 on several workers; here it only keeps their bits)");
}

int dp_trainer_init(struct dp_trainer **out, const struct dp_train_params *p) {
    *out = NULL;
    char spec[128] = "";
    struct model_src src = {.spec = spec};
    int rc = dp__check_params(p);
    if (rc) return rc;
    struct dp_trainer *t = dp_calloc(1, sizeof *t);
    if (!t) return dp_seterr(DP_ENOMEM, "trainer: out of memory");
    t->p = *p;
    if (p->dp.staleness >= 0) t->p.dp.async = 1; /* --staleness implies the parameter server */
    if (p->data.prefetch < 0) t->p.data.prefetch = dp_train_prefetch_auto(p->dp.workers, p->run.threads, dp_cpus_allowed());
    if (p->dp.deterministic && !p->dp.det_chunk) t->p.dp.det_chunk = dp_det_chunk_auto(p->run.batch);
    p = &t->p;
    t->P = p->dp.workers;
    t->G = p->dp.inter ? t->P * dp_comm_world(p->dp.inter) : t->P;
    t->base = p->dp.inter ? t->P * dp_comm_rank(p->dp.inter) : 0;
    t->slow_rank = -1;
    /* the parameter server under mpirun: the last S ranks serve (check_ps: one worker each) */
    t->ps_servers = p->dp.inter && p->dp.async ? (p->dp.servers ? p->dp.servers : 1) : 0;
    t->ps_W = t->G - t->ps_servers;
    t->efstate_step = -1;
    t->stopped = -1;
    atomic_init(&t->eval_next, 0);
    atomic_init(&t->stop_at, INT64_MAX);
    dp_set_num_threads(p->run.threads);

    /* A folder that holds another run is refused before anything is loaded. */
    if (p->io.out_dir && t->base == 0 && (rc = dp__run_folder_check(p->io.out_dir, p->io.resume, p->io.overwrite))) goto fail;
    /* The model: the caller's builder, a model file (--model-file), a spec (--model), or,
     * resuming without any, the checkpoint's (its canonical text; its spec string where it
     * predates the text). */
    snprintf(spec, sizeof spec, "%s", p->run.model ? p->run.model : "");
    if (p->run.model_build) {
        snprintf(spec, sizeof spec, "(the caller's model_build)");
    } else if (p->run.model_text) {
        if (!(src.text = dp_strdup(p->run.model_text))) {
            rc = dp_seterr(DP_ENOMEM, "trainer: out of memory");
            goto fail;
        }
        snprintf(spec, sizeof spec, "%s", p->run.model ? p->run.model : "custom");
        src.origin = spec;
    } else if (p->run.model_file) {
        if ((rc = dp_model_read_file(p->run.model_file, &src.text))) goto fail;
        src.origin = p->run.model_file;
        const char *base = strrchr(p->run.model_file, '/');
        snprintf(spec, sizeof spec, "file:%s", base ? base + 1 : p->run.model_file);
    } else if (p->io.resume && !p->run.model) {
        struct dp_ckpt_header h;
        if ((rc = dp_ckpt_read_header(p->io.resume, &h)) || (rc = dp_ckpt_model_text(p->io.resume, &src.text))) goto fail;
        snprintf(spec, sizeof spec, "%s", h.model_spec);
        src.origin = strncmp(spec, "file:", 5) ? spec : spec + 5;
    }
    if (!spec[0]) {
        rc = dp_seterr(DP_EINVAL, "no model given (--model or --model-file)");
        goto fail;
    }
    if ((rc = build_declared(t, &src))) goto fail;
    if (t->model) snprintf(spec, sizeof spec, "%s", t->model->spec);
    /* A language model (gpt:..., or a file's "input tokens T") reads token ids: its data is a token file. */
    t->text = t->model ? dp_model_reads_tokens(t->model) : dp_model_spec_reads_tokens(spec);
    if (t->text) {
        if ((rc = load_text(t, &src))) goto fail;
    } else {
        if (p->run.loss == DP_LOSS_MSE && t->model && (rc = dp_model_set_loss(t->model, DP_LOSS_MSE))) goto fail;
        t->regression = p->run.loss == DP_LOSS_MSE || (t->model && t->model->loss == DP_LOSS_MSE);
        if ((rc = dp__data_load(t))) goto fail; /* data_src.c */
        if ((rc = build_model(t, &src, &t->train))) goto fail;
        if (t->regression && (rc = dp_model_set_loss(t->model, DP_LOSS_MSE))) goto fail;
        t->eval_chunk = EVAL_CHUNK;
    }
    dp_free(src.text);
    src.text = NULL;
    dp_model_set_unit(t->model, p->dp.zero_unit_bytes); /* (the bits are the unit's, whatever the stage) */
    {
        struct dp_shape os = dp_model_cur_shape(t->model);
        t->pos = dp_shape_numel(&os) / os.d[os.ndim - 1];
    }
    if (t->regression && t->train.num_classes != dp_model_num_classes(t->model)) {
        rc = dp_seterr(DP_EMISMATCH, "the data has %lld target%s per sample, model '%s' outputs %lld",
                       (long long)t->train.num_classes, t->train.num_classes > 1 ? "s" : "", spec,
                       (long long)dp_model_num_classes(t->model));
        goto fail;
    }
    if (!t->text && t->train.num_classes > dp_model_num_classes(t->model)) {
        rc = dp_seterr(DP_EMISMATCH, "the data has %lld classes, model '%s' outputs %lld",
                       (long long)t->train.num_classes, spec, (long long)dp_model_num_classes(t->model));
        goto fail;
    }
    if (p->dp.backup && t->model->num_buffers > 0) {
        rc = dp_seterr(DP_ENOTSUP, "--backup-workers does not support models with BatchNorm ('%s'): their "
                       "statistics are synchronised across every worker in forward", spec);
        goto fail;
    }
    if (p->dp.async && t->model->num_buffers > 0) {
        rc = dp_seterr(DP_ENOTSUP, "%s does not support models with BatchNorm ('%s'): their statistics are "
                       "synchronised across every worker in forward", p->dp.staleness >= 0 ? "--staleness" : "--mode async",
                       spec);
        goto fail;
    }
    /* plain async claims batches as it goes; SSP and the replay take static shares */
    t->ps_dynamic = p->dp.async && p->dp.staleness < 0 && !p->dp.deterministic;
    /* --backup-workers 0 with --deterministic is plain deterministic sync */
    t->bk_on = p->dp.backup && !p->dp.deterministic;
    t->mode = dp__mode_for(t);
    /* A worker's share is at most ceil(batch / P); evaluation uses up to
     * eval_chunk samples. */
    int64_t share = (p->run.batch + t->ps_W - 1) / t->ps_W;
    const int reps = t->G / (p->dp.pp * p->dp.tp); /* (--pp, --tp: a replica of the split model reads one share) */
    if (reps < t->G) share = (p->run.batch + reps - 1) / reps;
    t->balance = p->dp.balance > 0 && t->G > 1;
    t->bal_align = p->dp.deterministic ? p->dp.det_chunk : 1;
    if (t->balance) share = p->run.batch; /* a balanced share may be the whole batch */
    if (p->dp.deterministic && !p->dp.async) share = p->dp.det_chunk; /* one chunk at a time */
    t->max_batch = share > t->eval_chunk ? share : t->eval_chunk;
    struct dp_comm_params cp = dp_comm_default_params();
    cp.timeout_s = p->dp.comm_timeout;
    /* (a hierarchical world, with processes, reduces on its threads whatever is asked) */
    cp.progress = p->dp.comm_progress == DP_PROGRESS_AUTO ? dp_train_progress_auto(t->P, p->run.threads, dp_cpus_allowed())
                                                       : p->dp.comm_progress;
    t->comm_progress = p->dp.inter ? DP_PROGRESS_THREAD : cp.progress;
    cp.spin_us = p->dp.comm_spin_us;
    rc = p->dp.inter ? dp_comm_thread_world_init_hier(&t->world, t->P, &cp, p->dp.inter)
                  : dp_comm_thread_world_init(&t->world, t->P, &cp);
    if (rc) goto fail;
    if (p->dp.pp > 1 && (rc = dp__pipe_plan(t))) goto fail; /* (pipe_step.c) */
    if ((rc = dp__tp_plan(t))) goto fail;                   /* (tp.c) */
    if (p->sim.simulate_slow) {
        t->slow_factor = dp_malloc(sizeof(double) * (size_t)t->G);
        if (!t->slow_factor) {
            rc = dp_seterr(DP_ENOMEM, "trainer: out of memory");
            goto fail;
        }
        /* the ranks are known now: a rank out of range is an error here */
        if ((rc = dp_parse_simulate_slow(p->sim.simulate_slow, t->G, t->slow_factor))) goto fail;
    }
    if (p->sim.simulate_jitter) (void)dp_parse_simulate_jitter(p->sim.simulate_jitter, &t->jit); /* checked above */
    t->simulate = p->sim.simulate_slow || p->sim.simulate_jitter;
    /* (not with backup workers: a per-step all-gather would wait for the late) */
    t->gather_waits = t->G > 1 && (p->io.out_dir || t->simulate) && !t->bk_on && !p->dp.async;
    t->last_count = dp_calloc((size_t)t->G, sizeof(int64_t));
    t->rank_samples = dp_calloc((size_t)t->G, sizeof(int64_t));
    t->share_samples = dp_calloc((size_t)t->G, sizeof(int64_t));
    t->w = dp_calloc((size_t)t->P, sizeof *t->w);
    if (!t->w || !t->last_count || !t->rank_samples || !t->share_samples) {
        rc = dp_seterr(DP_ENOMEM, "trainer: out of memory");
        goto fail;
    }
    for (int r = 0; r < t->P; r++)
        if ((rc = worker_init(t, &t->w[r], r))) {
            dp_adderr(rc, "worker %d", t->base + r);
            goto fail;
        }
    t->red_check = dp__red_check_possible(t);
    for (int r = 0; t->red_check && r < t->P; r++) dp_sync_set_post(&t->w[r].sync, dp__reduced_check, &t->w[r]);
    /* Rank 0 initialises; the others receive its parameters by broadcast
     * when the run starts.  (Every rank could draw the same values from the
     * seed; the broadcast makes "all replicas start equal" hold for any
     * initialisation, including --init-from on rank 0 only.)  ZeRO 3
     * (sharded) builds no replica: each worker draws its own pieces from the
     * seed, below, and rank 0 only its buffers. */
    int zero3 = p->dp.zero == 3 && t->G > 1;
    if ((zero3 || dp__pipe_partial(t)) && !p->io.init_from)
        dp_model_init_slice(t->model, 1, t->w[0].rep.buffers, 0, t->model->num_buffers, p->run.seed);
    else dp_model_init_params(t->model, &t->w[0].rep, p->run.seed);
    if (p->io.init_from && (rc = dp_safetensors_load(p->io.init_from, t->model, &t->w[0].rep))) goto fail;
    if (dp__pipe_partial(t) && (rc = held_params(t, p->io.init_from != NULL))) goto fail;
    t->batches_per_epoch = dp_loader_steps_per_epoch(t->w[0].loader);
    if (t->ps_dynamic) { /* the loader's batches are batch / P: the schedule counts global batches */
        int64_t n = t->text ? t->windows : t->train.n;
        t->ps_batches = t->batches_per_epoch;
        t->batches_per_epoch = (n + p->run.batch - 1) / p->run.batch;
    }
    t->steps_per_epoch = (t->batches_per_epoch + p->dp.accum - 1) / p->dp.accum;
    if (t->p.sched.total_steps <= 0) t->p.sched.total_steps = t->steps_per_epoch * p->run.epochs;
    if ((rc = dp__check_schedule(t))) goto fail;

    if (p->io.resume && (rc = dp__load_checkpoint(t, p->io.resume))) goto fail;
    if (p->io.resume && t->step_in_epoch == 0) dp__resume_position(t);
    /* ZeRO 3: each worker's pieces, drawn from the seed, or copied from rank
     * 0's slab where --init-from filled it, which is then given back; a
     * checkpoint has put them in place already (load_checkpoint).  Every
     * process of an MPI job computes the same pieces (the same seed, the
     * same files), so the parameters need no broadcast. */
    if (zero3) {
        const float *whole = p->io.init_from ? t->w[0].rep.params : NULL;
        for (int r = 0; r < t->P && !rc && !p->io.resume; r++)
            rc = dp_sync_shard_init(&t->w[r].sync, t->model, p->run.seed, whole);
        if (rc || (whole && (rc = dp_sync_release(&t->w[0].sync)))) goto fail;
    }
    if (t->mode->setup && (rc = t->mode->setup(t))) goto fail;
    /* Only the job's rank 0 writes metrics and checkpoints (src/train/run_folder.c). */
    if (p->io.out_dir && t->base == 0 &&
        (rc = dp__run_folder_open(p->io.out_dir, p->io.resume, p->io.overwrite, &t->metrics, t->metrics_path,
                                  sizeof t->metrics_path, t->note, sizeof t->note)))
        goto fail;
    if (p->io.out_dir && t->base == 0) dp__zsnap_clean(p->io.out_dir); /* (a failed run's ZeRO snapshot files) */
    unit_layout(t);
    *out = t;
    return DP_OK;
fail:
    dp_free(src.text);
    dp_trainer_free(t);
    return rc;
}
