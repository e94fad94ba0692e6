/* The single-worker training loop.
 *
 * One step:  loader.next -> zero grads -> model forward+backward (mean loss
 * over the batch) -> [clip] -> lr = schedule(step) -> optimizer step.
 * The position (epoch, step in epoch) and the seed determine the data order
 * exactly, so a checkpoint resumes the very same sequence of batches. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "dp/train.h"

struct dp_trainer {
    struct dp_train_params p;
    struct dp_dataset train, test;
    struct dp_model *model;
    struct dp_replica rep;
    struct dp_optim opt;
    struct dp_loader *loader;
    int64_t step, epoch, step_in_epoch, steps_per_epoch, max_batch;
    FILE *metrics;
};

struct dp_train_params dp_train_default_params(void) {
    struct dp_train_params p;
    memset(&p, 0, sizeof p);
    p.data_dir = "/usr/share/datasets/fashion-mnist";
    p.model = "mlp";
    p.epochs = 1;
    p.batch = 128;
    p.optim = dp_optim_default_params();
    p.sched.kind = DP_SCHED_CONSTANT;
    p.sched.base_lr = 0.05f;
    p.sched.gamma = 0.1f;
    p.seed = 1;
    p.threads = 1;
    p.prefetch = 2;
    /* Fashion-MNIST pixel statistics (train set, after /255). */
    p.norm_mean = 0.2860f;
    p.norm_std = 0.3530f;
    return p;
}

const struct dp_model *dp_trainer_model(const struct dp_trainer *t) { return t->model; }
struct dp_replica *dp_trainer_replica(struct dp_trainer *t) { return &t->rep; }
uint64_t dp_trainer_param_hash(const struct dp_trainer *t) { return dp_replica_hash(&t->rep); }

void dp_trainer_free(struct dp_trainer *t) {
    if (!t) return;
    dp_loader_free(t->loader);
    dp_optim_free(&t->opt);
    dp_replica_free(&t->rep);
    dp_model_free(t->model);
    dp_dataset_free(&t->train);
    dp_dataset_free(&t->test);
    if (t->metrics) fclose(t->metrics);
    dp_free(t);
}

static int check_params(const struct dp_train_params *p) {
    if (p->epochs < 0) return dp_seterr(DP_EINVAL, "--epochs must be >= 0 (got %lld)", (long long)p->epochs);
    if (p->batch <= 0 || p->batch > (1 << 20))
        return dp_seterr(DP_EINVAL, "--batch must be in 1..1048576 (got %lld)", (long long)p->batch);
    if (!(p->sched.base_lr > 0.0f) || !isfinite(p->sched.base_lr))
        return dp_seterr(DP_EINVAL, "--lr must be a positive number (got %g)", (double)p->sched.base_lr);
    if (p->threads < 1 || p->threads > 256)
        return dp_seterr(DP_EINVAL, "--threads must be in 1..256 (got %d)", p->threads);
    if (p->clip_norm < 0) return dp_seterr(DP_EINVAL, "--clip must be >= 0 (got %g)", p->clip_norm);
    if (!(p->norm_std > 0)) return dp_seterr(DP_EINVAL, "normalisation std must be > 0");
    if (p->max_steps < 0) return dp_seterr(DP_EINVAL, "--max-steps must be >= 0");
    int rc = dp_optim_check(&p->optim);
    if (rc) return rc;
    /* total_steps may still be 0 here: it is filled from the epoch count later. */
    struct dp_sched s = p->sched;
    if (s.total_steps <= 0) s.total_steps = s.warmup_steps + 1;
    return dp_sched_check(&s);
}

/* Restores the state saved by dp_trainer_save.  Every field that must agree
 * with this run is checked first, so nothing is half-loaded on error. */
static int load_checkpoint(struct dp_trainer *t, const char *path) {
    struct dp_ckpt_header h;
    float *payload = NULL;
    int rc = dp_ckpt_read(path, &h, &payload);
    if (rc) return rc;
    const struct dp_model *m = t->model;
    if (strcmp(h.model_spec, m->spec) != 0)
        rc = dp_seterr(DP_EMISMATCH, "%s: checkpoint is for model '%s', this run builds '%s'", path,
                       h.model_spec, m->spec);
    else if (h.num_params != m->num_params || h.num_buffers != m->num_buffers)
        rc = dp_seterr(DP_EMISMATCH, "%s: checkpoint has %lld parameters, model '%s' has %lld", path,
                       (long long)h.num_params, m->spec, (long long)m->num_params);
    else if (h.in_shape[0] != m->in_shape.d[0] || h.in_shape[1] != m->in_shape.d[1] ||
             h.in_shape[2] != m->in_shape.d[2])
        rc = dp_seterr(DP_EMISMATCH, "%s: checkpoint input shape differs from the data's", path);
    else if ((int)h.optim_kind != (int)t->p.optim.kind || h.optim_state_len != t->opt.state_len)
        rc = dp_seterr(DP_EMISMATCH, "%s: checkpoint optimizer is %s (state %lld floats), this run uses %s (%lld)",
                       path, dp_optim_kind_name((enum dp_optim_kind)h.optim_kind), (long long)h.optim_state_len,
                       dp_optim_kind_name(t->p.optim.kind), (long long)t->opt.state_len);
    else if (h.batch != t->p.batch)
        rc = dp_seterr(DP_EMISMATCH, "%s: checkpoint was trained with batch %lld, this run uses %lld "
                       "(the data order would differ)", path, (long long)h.batch, (long long)t->p.batch);
    else if (h.seed != t->p.seed)
        rc = dp_seterr(DP_EMISMATCH, "%s: checkpoint seed %llu differs from --seed %llu", path,
                       (unsigned long long)h.seed, (unsigned long long)t->p.seed);
    if (!rc) {
        memcpy(t->rep.params, payload, sizeof(float) * (size_t)h.num_params);
        memcpy(t->rep.buffers, payload + h.num_params, sizeof(float) * (size_t)h.num_buffers);
        if (h.optim_state_len)
            memcpy(t->opt.state, payload + h.num_params + h.num_buffers,
                   sizeof(float) * (size_t)h.optim_state_len);
        t->opt.step = h.optim_step;
        t->step = h.step;
        t->epoch = h.epoch;
        t->step_in_epoch = h.step_in_epoch;
        if (dp_replica_hash(&t->rep) != h.param_hash)
            rc = dp_seterr(DP_EFORMAT, "%s: parameter hash mismatch", path);
    }
    dp_free(payload);
    return rc;
}

int dp_trainer_init(struct dp_trainer **out, const struct dp_train_params *p) {
    *out = NULL;
    int rc = check_params(p);
    if (rc) return rc;
    struct dp_trainer *t = dp_calloc(1, sizeof *t);
    if (!t) return dp_seterr(DP_ENOMEM, "trainer: out of memory");
    t->p = *p;
    dp_set_num_threads(p->threads);

    /* A checkpoint names its model; --model may be omitted when resuming. */
    char spec[128];
    snprintf(spec, sizeof spec, "%s", p->model ? p->model : "");
    if (p->resume) {
        struct dp_ckpt_header h;
        if ((rc = dp_ckpt_read_header(p->resume, &h))) goto fail;
        if (!p->model) snprintf(spec, sizeof spec, "%s", h.model_spec);
    }
    if (!spec[0]) {
        rc = dp_seterr(DP_EINVAL, "no model given (--model)");
        goto fail;
    }
    if ((rc = dp_dataset_load_dir(&t->train, &t->test, p->data_dir))) goto fail;
    if (p->train_limit > 0 && p->train_limit < t->train.n) t->train.n = p->train_limit;
    dp_dataset_normalize(&t->train, p->norm_mean, p->norm_std);
    dp_dataset_normalize(&t->test, p->norm_mean, p->norm_std);
    if ((rc = dp_model_from_spec(&t->model, spec, t->train.C, t->train.H, t->train.W))) goto fail;
    if (t->train.num_classes > dp_model_num_classes(t->model)) {
        rc = dp_seterr(DP_EMISMATCH, "the data has %lld classes, model '%s' outputs %lld",
                       (long long)t->train.num_classes, spec, (long long)dp_model_num_classes(t->model));
        goto fail;
    }
    t->max_batch = p->batch > 256 ? p->batch : 256;
    if ((rc = dp_replica_init(&t->rep, t->model, t->max_batch))) goto fail;
    dp_model_init_params(t->model, &t->rep, p->seed);
    if (p->init_from && (rc = dp_safetensors_load(p->init_from, t->model, &t->rep))) goto fail;
    if ((rc = dp_optim_init(&t->opt, &p->optim, t->model->num_params))) goto fail;

    struct dp_loader_params lp = dp_loader_default_params();
    lp.batch = p->batch;
    lp.shuffle = 1;
    lp.seed = p->seed;
    lp.aug = p->aug;
    lp.prefetch = p->prefetch;
    if ((rc = dp_loader_init(&t->loader, &t->train, &lp))) goto fail;
    t->steps_per_epoch = dp_loader_steps_per_epoch(t->loader);
    if (t->p.sched.total_steps <= 0) t->p.sched.total_steps = t->steps_per_epoch * p->epochs;

    if (p->resume && (rc = load_checkpoint(t, p->resume))) goto fail;
    if (p->out_dir) {
        if (mkdir(p->out_dir, 0755) != 0 && errno != EEXIST) {
            rc = dp_seterr(DP_EIO, "cannot create output folder %s: %s", p->out_dir, strerror(errno));
            goto fail;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/metrics.jsonl", p->out_dir);
        /* Appending keeps the history of a resumed run in one file. */
        t->metrics = fopen(path, p->resume ? "a" : "w");
        if (!t->metrics) {
            rc = dp_seterr(DP_EIO, "cannot write %s: %s", path, strerror(errno));
            goto fail;
        }
    }
    *out = t;
    return DP_OK;
fail:
    dp_trainer_free(t);
    return rc;
}

int dp_trainer_save(struct dp_trainer *t, const char *path) {
    struct dp_ckpt_header h;
    memset(&h, 0, sizeof h);
    const struct dp_model *m = t->model;
    snprintf(h.model_spec, sizeof h.model_spec, "%s", m->spec);
    for (int i = 0; i < m->in_shape.ndim && i < 4; i++) h.in_shape[i] = m->in_shape.d[i];
    h.num_params = m->num_params;
    h.num_buffers = m->num_buffers;
    h.seed = t->p.seed;
    h.step = t->step;
    h.epoch = t->epoch;
    h.step_in_epoch = t->step_in_epoch;
    h.batch = t->p.batch;
    h.optim_kind = (uint32_t)t->p.optim.kind;
    h.nesterov = (uint32_t)t->p.optim.nesterov;
    h.momentum = t->p.optim.momentum;
    h.dampening = t->p.optim.dampening;
    h.weight_decay = t->p.optim.weight_decay;
    h.beta1 = t->p.optim.beta1;
    h.beta2 = t->p.optim.beta2;
    h.eps = t->p.optim.eps;
    h.lr = t->p.sched.base_lr;
    h.sched_kind = (uint32_t)t->p.sched.kind;
    h.optim_step = t->opt.step;
    h.optim_state_len = t->opt.state_len;
    h.param_hash = dp_replica_hash(&t->rep);
    return dp_ckpt_write(path, &h, t->rep.params, t->rep.buffers, t->opt.state);
}

int dp_trainer_evaluate(struct dp_trainer *t, const struct dp_dataset *ds, int64_t limit,
                        double *acc, double *loss) {
    int64_t n = limit > 0 && limit < ds->n ? limit : ds->n;
    int64_t per = ds->C * ds->H * ds->W, correct = 0;
    double loss_sum = 0;
    for (int64_t i = 0; i < n; i += t->max_batch) {
        int64_t B = n - i < t->max_batch ? n - i : t->max_batch;
        struct dp_batch b = {.B = B, .x = ds->x + i * per, .targets = ds->y + i};
        struct dp_pass pass = {.training = 0, .seed = t->p.seed};
        int rc = dp_model_run(t->model, &t->rep, &b, &pass);
        if (rc) return dp_adderr(rc, "evaluate");
        correct += pass.correct;
        loss_sum += pass.loss_sum;
    }
    *acc = n ? (double)correct / (double)n : NAN;
    *loss = n ? loss_sum / (double)n : NAN;
    return DP_OK;
}

static void emit(struct dp_trainer *t, struct dp_event *ev) {
    ev->steps_per_epoch = t->steps_per_epoch;
    ev->epochs = t->p.epochs;
    if (t->p.on_event) t->p.on_event(t->p.event_arg, ev);
}

static int checkpoint(struct dp_trainer *t) {
    if (!t->p.out_dir) return DP_OK;
    char path[4096];
    snprintf(path, sizeof path, "%s/checkpoint.bin", t->p.out_dir);
    int rc = dp_trainer_save(t, path);
    if (rc) return rc;
    struct dp_event ev = {.kind = DP_EVENT_CHECKPOINT, .step = t->step, .epoch = t->epoch, .path = path};
    emit(t, &ev);
    return DP_OK;
}

/* 1 if any x[i] is NaN or infinite: an all-ones exponent.  Integer tests so
 * the loop vectorises (a float sum would be a serial dependency chain). */
static int any_nonfinite(const float *x, int64_t n) {
    const uint32_t *u = (const uint32_t *)(const void *)x;
    uint32_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad |= (u[i] & 0x7f800000u) == 0x7f800000u;
    return bad != 0;
}

int dp_trainer_run(struct dp_trainer *t) {
    const struct dp_model *m = t->model;
    int rc = dp_loader_seek(t->loader, t->epoch, t->step_in_epoch);
    if (rc) return rc;
    while (t->epoch < t->p.epochs) {
        double t_start = dp_time(), w0 = dp_loader_wait_time(t->loader);
        double tf = 0, tb = 0, to = 0, loss_sum = 0;
        int64_t correct = 0, seen = 0;
        while (t->step_in_epoch < t->steps_per_epoch) {
            if (t->p.max_steps && t->step >= t->p.max_steps) return checkpoint(t);
            const struct dp_loader_batch *lb;
            if ((rc = dp_loader_next(t->loader, &lb))) return rc;
            struct dp_batch b = {.B = lb->B, .x = lb->x, .targets = lb->y, .sample_idx = lb->idx,
                                 .epoch = lb->epoch};
            memset(t->rep.grads, 0, sizeof(float) * (size_t)m->num_params);
            struct dp_pass pass = {.training = 1, .backward = 1, .seed = t->p.seed};
            if ((rc = dp_model_run(m, &t->rep, &b, &pass)))
                return dp_adderr(rc, "step %lld", (long long)t->step);
            if (!isfinite(pass.loss_sum) || any_nonfinite(t->rep.grads, m->num_params))
                return dp_seterr(DP_ENONFINITE, "step %lld (epoch %lld): the %s is not finite; "
                                 "try a lower --lr or --clip", (long long)t->step, (long long)t->epoch + 1,
                                 isfinite(pass.loss_sum) ? "gradient" : "loss");
            double t1 = dp_time();
            if (t->p.clip_norm > 0) dp_clip_grad_norm(t->rep.grads, m->num_params, t->p.clip_norm);
            float lr = dp_sched_lr(&t->p.sched, t->step);
            if ((rc = dp_optim_step(&t->opt, t->rep.params, t->rep.grads, m->num_params, lr))) return rc;
            to += dp_time() - t1;
            tf += pass.t_forward;
            tb += pass.t_backward;
            loss_sum += pass.loss_sum;
            correct += pass.correct;
            seen += b.B;
            t->step++;
            t->step_in_epoch++;
            struct dp_event ev = {.kind = DP_EVENT_STEP, .step = t->step, .epoch = t->epoch,
                                  .step_in_epoch = t->step_in_epoch, .lr = lr, .samples = b.B,
                                  .loss = pass.loss_sum / (double)b.B};
            emit(t, &ev);
        }
        double dt = dp_time() - t_start;
        struct dp_event ev = {.kind = DP_EVENT_EPOCH, .step = t->step, .epoch = t->epoch + 1,
                              .step_in_epoch = t->step_in_epoch,
                              .lr = dp_sched_lr(&t->p.sched, t->step > 0 ? t->step - 1 : 0)};
        ev.loss = seen ? loss_sum / (double)seen : NAN;
        ev.train_acc = seen ? (double)correct / (double)seen : NAN;
        ev.samples_per_s = dt > 0 ? (double)seen / dt : 0;
        ev.epoch_time = dt;
        ev.t_data = dp_loader_wait_time(t->loader) - w0;
        ev.t_fwd = tf, ev.t_bwd = tb, ev.t_opt = to;
        t->epoch++;
        t->step_in_epoch = 0;
        if ((rc = dp_trainer_evaluate(t, &t->test, t->p.test_limit, &ev.test_acc, &ev.test_loss))) return rc;
        if (t->metrics) {
            fprintf(t->metrics,
                    "{\"epoch\": %lld, \"step\": %lld, \"lr\": %.6g, \"train_loss\": %.6f, "
                    "\"train_acc\": %.6f, \"test_loss\": %.6f, \"test_acc\": %.6f, "
                    "\"samples_per_s\": %.1f, \"epoch_time_s\": %.3f, \"data_wait_s\": %.3f, "
                    "\"forward_s\": %.3f, \"backward_s\": %.3f, \"optimizer_s\": %.3f, "
                    "\"param_hash\": \"%016llx\"}\n",
                    (long long)ev.epoch, (long long)ev.step, (double)ev.lr, ev.loss, ev.train_acc,
                    ev.test_loss, ev.test_acc, ev.samples_per_s, dt, ev.t_data, tf, tb, to,
                    (unsigned long long)dp_replica_hash(&t->rep));
            fflush(t->metrics);
        }
        emit(t, &ev);
        int last = t->epoch == t->p.epochs;
        if (last || (t->p.ckpt_every > 0 && t->epoch % t->p.ckpt_every == 0))
            if ((rc = checkpoint(t))) return rc;
    }
    return DP_OK;
}
