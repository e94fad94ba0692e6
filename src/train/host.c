/* The trainer from another language: what a binding over the shared library (the Python
 * package, python/dptrain) needs and cannot reach without mirroring the library's structs.
 *
 *   params     arrays in memory as the data (dp_train_params_set_array), the callback, the
 *              stop flag and the job's communicator (dp_train_params_set_hooks), a
 *              checkpoint's settings (dp_train_params_from_ckpt)
 *   events     each event as the JSON record metrics.jsonl would hold (dp_event_json)
 *   the model  outputs for new inputs (dp_trainer_predict), evaluation on arrays, the
 *              safetensors export, and each parameter's name, shape and floats
 *
 * Nothing here prints or keeps state of its own: a binding's objects own what they pass in. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/core_impl.h"
#include "trainer.h"

/* ---- parameters --------------------------------------------------------------------------- */

int dp_train_params_set_array(struct dp_train_params *p, const char *which, const struct dp_array *a) {
    struct dp_array *dst = !which ? NULL
                         : !strcmp(which, "x") ? &p->data.train_x
                         : !strcmp(which, "y") ? &p->data.train_y
                         : !strcmp(which, "test_x") ? &p->data.test_x
                         : !strcmp(which, "test_y") ? &p->data.test_y : NULL;
    if (!dst) return dp_seterr(DP_EINVAL, "arrays: '%s' is none of x, y, test_x, test_y", which ? which : "(null)");
    if (a) *dst = *a;
    else memset(dst, 0, sizeof *dst);
    return DP_OK;
}

void dp_train_params_set_hooks(struct dp_train_params *p, dp_event_fn on_event, void *event_arg, void *stop,
                               struct dp_comm *inter) {
    p->io.on_event = on_event, p->io.event_arg = event_arg;
    p->io.stop = stop; /* (an int the caller owns; the library reads it atomically) */
    p->dp.inter = inter;
}

int dp_train_params_from_ckpt(struct dp_train_params *p, const char *path, int64_t *epoch, int64_t *in_shape,
                              int64_t *outputs, int *regression) {
    struct dp_ckpt_header h;
    int rc = dp_ckpt_read_header(path, &h);
    if (rc) return rc;
    if (outputs || regression) {
        struct dp_model *m;
        if ((rc = dp_ckpt_build_model(path, &h, &m))) return rc;
        if (outputs) *outputs = dp_model_num_classes(m);
        if (regression) *regression = m->loss == DP_LOSS_MSE;
        dp_model_free(m);
    }
    p->io.resume = path;
    p->run.model = NULL, p->run.model_file = NULL, p->run.model_text = NULL;
    p->run.batch = h.batch;
    p->run.seed = h.seed;
    p->optim.kind = (enum dp_optim_kind)h.optim_kind;
    p->optim.momentum = h.momentum;
    p->optim.nesterov = (int)h.nesterov;
    p->optim.dampening = h.dampening;
    p->optim.weight_decay = h.weight_decay;
    p->optim.beta1 = h.beta1, p->optim.beta2 = h.beta2, p->optim.eps = h.eps;
    p->sched.base_lr = h.lr;
    p->sched.kind = (enum dp_sched_kind)h.sched_kind;
    if (epoch) *epoch = h.epoch;
    for (int d = 0; in_shape && d < 3; d++) in_shape[d] = h.in_shape[d];
    return DP_OK;
}

/* ---- events as JSON ----------------------------------------------------------------------- */

struct out {
    char *buf;
    size_t cap, len;
    int full;
};

static void put(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct out *o, const char *fmt, ...) {
    if (o->full) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= o->cap - o->len) o->full = 1;
    else o->len += (size_t)n;
}

/* The test figures as report.c writes them: none without a test set (NaN is not JSON). */
static void test_fields(struct out *o, const struct dp_event *ev) {
    if (isnan(ev->test_loss)) return;
    if (!isnan(ev->val_bpb))
        put(o, ", \"test_loss\": %.6f, \"test_acc\": %.6f, \"val_bpb\": %.6f", ev->test_loss, ev->test_acc,
            ev->val_bpb);
    else if (ev->regression)
        put(o, ", \"test_loss\": %.6g, \"test_rmse\": %.6g, \"test_mae\": %.6g", ev->test_loss, sqrt(ev->test_loss),
            ev->test_acc);
    else
        put(o, ", \"test_loss\": %.6f, \"test_acc\": %.6f", ev->test_loss, ev->test_acc);
}

/* A double that may be NaN (an epoch without samples), as JSON. */
static void num(struct out *o, const char *key, double v) {
    if (isfinite(v)) put(o, ", \"%s\": %.6f", key, v);
    else put(o, ", \"%s\": null", key);
}

int dp_event_json(const struct dp_event *ev, char *buf, size_t cap) {
    if (!buf || cap < 2) return dp_seterr(DP_EINVAL, "event json: no room");
    struct out o = {buf, cap, 0, 0};
    switch (ev->kind) {
    case DP_EVENT_EPOCH:
        put(&o, "{\"kind\": \"epoch\", \"epoch\": %lld, \"step\": %lld, \"lr\": %.6g", (long long)ev->epoch,
            (long long)ev->step, (double)ev->lr);
        num(&o, "train_loss", ev->loss);
        num(&o, "train_acc", ev->train_acc);
        test_fields(&o, ev);
        put(&o, ", \"samples_per_s\": %.1f, \"epoch_time_s\": %.3f, \"data_wait_s\": %.3f, \"forward_s\": %.3f, "
            "\"backward_s\": %.3f, \"comm_s\": %.3f, \"comm_exposed_s\": %.3f, \"optimizer_s\": %.3f, "
            "\"skipped_steps\": %lld, \"slowest_rank\": %d, \"slowest_lag_s\": %.6f, \"bytes_sent\": %.0f, "
            "\"bytes_recv\": %.0f, \"compress_ratio\": %.4g, \"compress_s\": %.4f, \"decompress_s\": %.4f}",
            ev->samples_per_s, ev->epoch_time, ev->t_data, ev->t_fwd, ev->t_bwd, ev->t_comm, ev->t_comm_exposed,
            ev->t_opt, (long long)ev->skipped, ev->slow_rank, ev->slow_lag, ev->bytes_sent, ev->bytes_recv,
            ev->bytes_sent > 0 ? ev->bytes_fp32 / ev->bytes_sent : 1.0, ev->t_compress, ev->t_decompress);
        break;
    case DP_EVENT_STEP:
        put(&o, "{\"kind\": \"step\", \"step\": %lld, \"epoch\": %lld, \"step_in_epoch\": %lld, "
            "\"steps_per_epoch\": %lld, \"epochs\": %lld, \"lr\": %.6g, \"samples\": %lld", (long long)ev->step,
            (long long)ev->epoch + 1, (long long)ev->step_in_epoch, (long long)ev->steps_per_epoch,
            (long long)ev->epochs, (double)ev->lr, (long long)ev->samples);
        num(&o, "loss", ev->loss);
        put(&o, "}");
        break;
    case DP_EVENT_EVAL:
        put(&o, "{\"kind\": \"eval\", \"step\": %lld, \"epoch\": %lld", (long long)ev->step, (long long)ev->epoch + 1);
        test_fields(&o, ev);
        put(&o, "}");
        break;
    case DP_EVENT_CHECKPOINT: {
        put(&o, "{\"kind\": \"checkpoint\", \"step\": %lld, \"path\": \"", (long long)ev->step);
        if (!o.full) { /* (a path is JSON-escaped) */
            size_t need = dp__json_escape(o.buf + o.len, o.cap - o.len, ev->path ? ev->path : "");
            if (need >= o.cap - o.len) o.full = 1;
            else o.len += need;
        }
        put(&o, "\"}");
        break;
    }
    default:
        put(&o, "{\"kind\": \"unknown\"}");
    }
    if (o.full) return dp_seterr(DP_EINVAL, "event json: %zu bytes are not enough", cap);
    return (int)o.len;
}

/* ---- the trained model -------------------------------------------------------------------- */

/* x as a dataset normalised as the run's data is, checked against the model's input. */
static int open_like_run(struct dp_trainer *t, struct dp_dataset *ds, const struct dp_array *x,
                         const struct dp_array *y) {
    if (t->text) return dp_seterr(DP_ENOTSUP, "a language model reads token windows, not arrays");
    struct dp_data_opts o = {.nhwc = t->p.data.layout_nhwc, .regression = t->regression};
    int rc = dp_dataset_open_arrays(ds, x, y, "X", "y", &o);
    if (rc) return rc;
    if (ds->C != t->train.C || ds->H != t->train.H || ds->W != t->train.W) {
        rc = dp_seterr(DP_EINVAL, "X: samples of %lld x %lld x %lld, the model's are %lld x %lld x %lld (C x H x W)",
                       (long long)ds->C, (long long)ds->H, (long long)ds->W, (long long)t->train.C,
                       (long long)t->train.H, (long long)t->train.W);
    } else if (t->norm_C && dp_dataset_norm_groups(ds) == t->norm_C) {
        rc = dp_dataset_normalize_channels(ds, t->norm_mean, t->norm_std);
    } else if (t->norm_C) {
        rc = dp_seterr(DP_EINVAL, "X: %lld channels or features, the run normalised %lld",
                       (long long)dp_dataset_norm_groups(ds), (long long)t->norm_C);
    }
    if (rc) dp_dataset_free(ds);
    return rc;
}

/* ZeRO 3 on several workers: each replica holds its shard of the parameters only, until the
 * run's end gathers them whole into worker 0's (and keeps them there). */
static int sharded(const struct dp_trainer *t) { return !dp_sync_params_whole(&t->w[0].sync); }

static int whole_replica(const struct dp_trainer *t) {
    if (sharded(t))
        return dp_seterr(DP_ENOTSUP, "ZeRO 3: the workers hold shards of the parameters until the run ends (train "
                         "first, or load a checkpoint)");
    return DP_OK;
}

int64_t dp_trainer_outputs(const struct dp_trainer *t) { return dp_model_num_classes(t->model); }
int dp_trainer_regression(const struct dp_trainer *t) { return t->regression; }

int dp_trainer_predict(struct dp_trainer *t, const struct dp_array *x, float *out, int64_t cap) {
    struct dp_dataset ds;
    int rc = whole_replica(t);
    if (rc || (rc = open_like_run(t, &ds, x, NULL))) return rc;
    const int64_t K = dp_trainer_outputs(t), per = ds.C * ds.H * ds.W, E = t->eval_chunk;
    if (ds.n * K > cap) {
        dp_dataset_free(&ds);
        return dp_seterr(DP_EINVAL, "predict: %lld samples x %lld outputs do not fit %lld floats", (long long)ds.n,
                         (long long)K, (long long)cap);
    }
    struct dp_replica *r = &t->w[0].rep;
    float *xb = dp_malloc_big(sizeof(float) * (size_t)(E * per) + 1);
    float *tg = dp_calloc((size_t)(E * K) + 1, sizeof(float)); /* a regression's targets: unused */
    int32_t *cls = dp_calloc((size_t)E + 1, sizeof(int32_t));   /* the classes: unused */
    if (!xb || !tg || !cls) rc = dp_seterr(DP_ENOMEM, "predict: out of memory");
    for (int64_t i = 0; !rc && i < ds.n; i += E) {
        int64_t B = ds.n - i < E ? ds.n - i : E;
        for (int64_t k = 0; k < B; k++) dp_dataset_read(&ds, i + k, xb + k * per);
        struct dp_batch b = {.B = B, .x = xb};
        if (t->regression) b.target = tg;
        else b.targets = cls;
        struct dp_pass pass = {.training = 0, .seed = t->p.run.seed};
        if ((rc = dp_model_run(t->model, r, &b, &pass))) rc = dp_adderr(rc, "predict");
        else memcpy(out + i * K, r->acts[t->model->nlayers], sizeof(float) * (size_t)(B * K));
    }
    dp_free(xb), dp_free(tg), dp_free(cls);
    dp_dataset_free(&ds);
    return rc;
}

int dp_trainer_evaluate_arrays(struct dp_trainer *t, const struct dp_array *x, const struct dp_array *y,
                               double *acc, double *loss) {
    if (!y || !y->data) return dp_seterr(DP_EINVAL, "evaluate: no labels y");
    struct dp_dataset ds;
    int rc = whole_replica(t);
    if (rc || (rc = open_like_run(t, &ds, x, y))) return rc;
    if (!t->regression && ds.num_classes > dp_trainer_outputs(t))
        rc = dp_seterr(DP_EINVAL, "y: label %lld, but the model has %lld classes (0 .. %lld)",
                       (long long)ds.num_classes - 1, (long long)dp_trainer_outputs(t),
                       (long long)dp_trainer_outputs(t) - 1);
    else if (t->regression && ds.num_classes != dp_trainer_outputs(t))
        rc = dp_seterr(DP_EINVAL, "y: %lld targets per sample, the model predicts %lld", (long long)ds.num_classes,
                       (long long)dp_trainer_outputs(t));
    if (!rc) rc = dp_trainer_evaluate(t, &ds, 0, acc, loss);
    dp_dataset_free(&ds);
    return rc;
}

/* values as a comma list into a new string (dp_free it). */
static char *comma_list(const float *v, int64_t n) {
    size_t cap = (size_t)n * 20 + 2, len = 0;
    char *s = dp_malloc(cap);
    if (!s) return NULL;
    s[0] = 0;
    for (int64_t i = 0; i < n; i++) len += (size_t)snprintf(s + len, cap - len, "%s%.9g", i ? "," : "", (double)v[i]);
    return s;
}

int dp_trainer_export(struct dp_trainer *t, const char *path) {
    int rc = whole_replica(t);
    if (rc) return rc;
    if (t->text) return dp_safetensors_save(path, t->model, &t->w[0].rep);
    char *mean = comma_list(t->norm_mean, t->norm_C), *std = comma_list(t->norm_std, t->norm_C);
    if (!mean || !std) {
        dp_free(mean), dp_free(std);
        return dp_seterr(DP_ENOMEM, "export: out of memory");
    }
    const struct dp_st_meta meta[] = {
        {"input_mean", mean},
        {"input_std", std},
        {"input_preprocessing", "x = (value - input_mean[g]) / input_std[g] for each group g: the channels of an "
                                "image, or the features of a table (C = H = 1); value is the array's element as "
                                "float; float32, batches NCHW"},
        {"output", t->regression ? "K values, the regression's predictions (loss mse)"
                                 : "logits, one per class; the prediction is the argmax"},
    };
    rc = dp_safetensors_save_meta(path, t->model, &t->w[0].rep, meta, (int)(sizeof meta / sizeof meta[0]));
    dp_free(mean), dp_free(std);
    return rc;
}

int dp_trainer_param_count(const struct dp_trainer *t) { return t->model->nparams; }

int dp_trainer_param_info(struct dp_trainer *t, int i, const char **name, int *ndim, int64_t *shape, float **data,
                          int *is_buffer) {
    const struct dp_model *m = t->model;
    if (i < 0 || i >= m->nparams) return dp_seterr(DP_EINVAL, "parameter %d of %d", i, m->nparams);
    const struct dp_param_info *pi = &m->params[i];
    const struct dp_replica *r = &t->w[0].rep;
    *name = pi->name, *ndim = pi->shape.ndim, *is_buffer = pi->is_buffer;
    for (int d = 0; d < pi->shape.ndim; d++) shape[d] = pi->shape.d[d];
    *data = sharded(t) ? NULL : (pi->is_buffer ? r->buffers : r->params) + pi->offset;
    return DP_OK;
}
