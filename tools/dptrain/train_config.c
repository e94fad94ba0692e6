/* train's configuration in its checkpoints, so that --resume remembers the
 * run (docs/checkpoint.md "What a resume restores").
 *
 * The configuration is train's own options, one per line as "--flag=value"
 * or "--flag", rendered from the parsed parameters (so each option has one
 * spelling, whatever the user typed) and stored by the library as the
 * checkpoint's DPCONFIG section.  A resume puts the stored lines in front of
 * the command line's options and parses both with train's one parser: an
 * option given again overrides its stored value.  Rendering the result and
 * comparing it line by line with the stored lines names each override.
 *
 * Stored: what decides the numbers a run computes and how it is recorded
 * (data, model, optimizer, schedule, batch, epochs, seed, clipping, the
 * data-parallel options that change the arithmetic or its failure modes,
 * checkpoint and evaluation cadence).  Not stored: where and how fast this
 * invocation runs (--workers, --threads, --backend, pinning, progress
 * threads, prefetch, gemm), this invocation's own stop and outputs
 * (--max-steps, --out, --resume, --overwrite, --init-from, --timeline,
 * --progress) and the slowness simulations. */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/train.h"
#include "cli.h"

struct buf {
    char *p;
    size_t n, cap;
};

static void put(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct buf *b, const char *fmt, ...) {
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = (b->cap ? 2 * b->cap : 4096) + (size_t)k;
        char *q = realloc(b->p, cap);
        if (!q) dptrain_die("out of memory");
        b->p = q, b->cap = cap;
    }
}

/* A float's shortest rendering that reads back as the same float ("0.01", not "0.00999999978") */
static const char *flt(char *out, size_t n, float x) {
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(out, n, "%.*g", prec, (double)x);
        if (strtof(out, NULL) == x) break;
    }
    return out;
}

char *dptrain_config_render(const struct dp_train_params *tp) {
    char f1[32], f2[32], f3[32];
    struct buf b = {0};
    char path[PATH_MAX];
    /* the data as an absolute path: a resume may run from another folder */
    const char *data = tp->data_dir && realpath(tp->data_dir, path) ? path : tp->data_dir;
    if (data) put(&b, "--data=%s\n", data);
    const char *const paths[][2] = {{"labels", tp->labels}, {"test-data", tp->test_data}, {"test-labels", tp->test_labels}};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++)
        if (paths[i][1]) put(&b, "--%s=%s\n", paths[i][0], realpath(paths[i][1], path) ? path : paths[i][1]);
    if (tp->npz_keys) put(&b, "--npz-keys=%s\n", tp->npz_keys);
    if (tp->label_column) put(&b, "--label-column=%s\n", tp->label_column);
    if (tp->csv_header != -1) put(&b, "--csv-header=%s\n", tp->csv_header ? "yes" : "no");
    if (tp->image_h) put(&b, "--image-size=%lld,%lld\n", (long long)tp->image_h, (long long)tp->image_w);
    if (tp->image_channels) put(&b, "--image-channels=%d\n", tp->image_channels);
    if (tp->skip_bad_images) put(&b, "--skip-bad-images\n");
    if (tp->tokens_raw_u16) put(&b, "--data-format=u16\n");
    if (tp->val_split > 0) put(&b, "--val-split=%.17g\n", tp->val_split);
    if (tp->layout_nhwc) put(&b, "--layout=nhwc\n");
    if (tp->loss == DP_LOSS_MSE) put(&b, "--loss=mse\n");
    if (tp->normalize == DP_NORM_AUTO || tp->normalize == DP_NORM_NONE)
        put(&b, "--normalize=%s\n", tp->normalize == DP_NORM_AUTO ? "auto" : "none");
    if (tp->normalize == DP_NORM_FIXED)
        put(&b, "--normalize=%s,%s\n", flt(f1, sizeof f1, tp->norm_mean), flt(f2, sizeof f2, tp->norm_std));
    if (tp->model) put(&b, "--model=%s\n", tp->model);
    if (tp->train_limit) put(&b, "--train-limit=%lld\n", (long long)tp->train_limit);
    if (tp->test_limit) put(&b, "--test-limit=%lld\n", (long long)tp->test_limit);
    if (tp->aug.crop_pad) put(&b, "--crop-pad=%d\n", tp->aug.crop_pad);
    if (tp->aug.hflip) put(&b, "--hflip\n");
    put(&b, "--epochs=%lld\n--batch=%lld\n--seed=%llu\n", (long long)tp->epochs, (long long)tp->batch,
        (unsigned long long)tp->seed);
    put(&b, "--lr=%s\n--optim=%s\n", flt(f1, sizeof f1, tp->sched.base_lr), dp_optim_kind_name(tp->optim.kind));
    if (tp->optim.kind == DP_OPTIM_SGD) {
        put(&b, "--momentum=%s\n", flt(f1, sizeof f1, tp->optim.momentum));
        if (tp->optim.nesterov) put(&b, "--nesterov\n");
    } else
        put(&b, "--beta1=%s\n--beta2=%s\n--eps=%s\n", flt(f1, sizeof f1, tp->optim.beta1),
            flt(f2, sizeof f2, tp->optim.beta2), flt(f3, sizeof f3, tp->optim.eps));
    put(&b, "--weight-decay=%s\n--schedule=%s\n", flt(f1, sizeof f1, tp->optim.weight_decay),
        dp_sched_kind_name(tp->sched.kind));
    if (tp->sched.kind == DP_SCHED_COSINE)
        put(&b, "--warmup=%lld\n--min-lr=%s\n", (long long)tp->sched.warmup_steps, flt(f1, sizeof f1, tp->sched.min_lr));
    if (tp->sched.kind == DP_SCHED_STEP)
        put(&b, "--step-size=%lld\n--gamma=%s\n", (long long)tp->sched.step_size, flt(f1, sizeof f1, tp->sched.gamma));
    if (tp->clip_norm > 0) put(&b, "--clip=%.17g\n", tp->clip_norm);
    put(&b, "--accum=%d\n", tp->accum);
    if (tp->bucket_cap_bytes) put(&b, "--bucket-cap-mb=%.17g\n", (double)tp->bucket_cap_bytes / 1048576.0);
    if (tp->first_bucket_bytes) put(&b, "--first-bucket-mb=%.17g\n", (double)tp->first_bucket_bytes / 1048576.0);
    if (!tp->overlap) put(&b, "--no-overlap\n");
    put(&b, "--algo=%s\n", dp_comm_algo_name((enum dp_comm_algo)tp->algo));
    char cz[64];
    dp_compress_format(&tp->compress, cz, sizeof cz);
    put(&b, "--compress=%s\n", cz);
    if (tp->compress.kind == DP_COMPRESS_POWERSGD) put(&b, "--powersgd-start=%lld\n", (long long)tp->compress.powersgd_start);
    if (tp->compress.no_ef) put(&b, "--no-error-feedback\n");
    if (tp->check_replicas) put(&b, "--check-replicas=%lld\n", (long long)tp->check_replicas);
    if (tp->skip_nonfinite) put(&b, "--skip-nonfinite\n");
    if (tp->comm_timeout > 0) put(&b, "--comm-timeout=%.17g\n", tp->comm_timeout);
    if (tp->deterministic) put(&b, "--deterministic\n");
    if (tp->deterministic && tp->det_chunk) put(&b, "--det-chunk=%lld\n", (long long)tp->det_chunk);
    put(&b, "--zero=%d\n", tp->zero);
    if (tp->zero == 1)
        put(&b, "--zero-reduce=%s\n--zero-gather=%s\n", tp->zero_scatter ? "scatter" : "allreduce",
            tp->zero_gather == DP_ZERO_GATHER_STEP ? "step" : tp->zero_gather == DP_ZERO_GATHER_AHEAD ? "ahead" : "auto");
    if (tp->balance) put(&b, "--balance=%lld\n", (long long)tp->balance);
    if (tp->backup) put(&b, "--backup-workers=%d\n", tp->backup_workers);
    put(&b, "--mode=%s\n", tp->async || tp->staleness >= 0 ? "async" : "sync");
    if (tp->servers) put(&b, "--servers=%d\n", tp->servers);
    if (tp->staleness >= 0) put(&b, "--staleness=%d\n", tp->staleness);
    if (tp->staleness_lr) put(&b, "--staleness-lr\n");
    if (tp->share_lr) put(&b, "--share-lr\n");
    if (tp->implicit_momentum) put(&b, "--implicit-momentum\n");
    put(&b, "--ckpt-every=%d\n", tp->ckpt_every);
    if (tp->ckpt_every_steps) put(&b, "--ckpt-every-steps=%lld\n", (long long)tp->ckpt_every_steps);
    if (tp->eval_every) put(&b, "--eval-every=%lld\n", (long long)tp->eval_every);
    return b.p;
}

/* A checkpoint written before configurations were stored: what its header
 * holds (model, batch, seed, the optimizer and the schedule's kind). */
static char *from_header(const struct dp_ckpt_header *h) {
    /* the same lines as dptrain_config_render's for these fields */
    struct dp_train_params tp = dp_train_default_params();
    tp.model = h->model_spec, tp.batch = h->batch, tp.seed = h->seed, tp.sched.base_lr = h->lr;
    tp.optim.kind = (enum dp_optim_kind)h->optim_kind, tp.optim.momentum = h->momentum;
    tp.optim.nesterov = (int)h->nesterov, tp.optim.beta1 = h->beta1, tp.optim.beta2 = h->beta2, tp.optim.eps = h->eps;
    tp.optim.weight_decay = h->weight_decay, tp.sched.kind = (enum dp_sched_kind)h->sched_kind;
    char *all = dptrain_config_render(&tp), *keep = all, *out = all;
    /* only the header's fields: drop the defaults rendered for the others */
    static const char *const fields[] = {"--model=", "--batch=", "--seed=", "--lr=", "--optim=", "--momentum=",
                                         "--nesterov", "--beta1=", "--beta2=", "--eps=", "--weight-decay=",
                                         "--schedule="};
    while (*keep) {
        char *e = strchr(keep, '\n');
        size_t len = (size_t)(e - keep) + 1;
        int take = 0;
        for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
            take |= !strncmp(keep, fields[i], strlen(fields[i]));
        if (take) memmove(out, keep, len), out += len;
        keep += len;
    }
    *out = 0;
    return all;
}

char *dptrain_config_stored(const char *ckpt, int *from_hdr) {
    struct dp_ckpt_header h;
    void *data;
    uint64_t size;
    *from_hdr = 0;
    /* the whole file's checksums first: a corrupt checkpoint is reported as
     * corrupt, never as a configuration that differs */
    if (dp_ckpt_read_header(ckpt, &h) || dp_ckpt_read_section(ckpt, DP_CKPT_CONFIG_TAG, &data, &size))
        dptrain_die("%s", dp_errmsg());
    if (!data) {
        *from_hdr = 1;
        return from_header(&h);
    }
    char *text = data; /* (dp_ckpt_read_section allocates one byte more) */
    text[size] = 0;
    char *copy = strdup(text);
    dp_free(data);
    if (!copy) dptrain_die("out of memory");
    return copy;
}

/* The value of option `flag` in a rendered configuration ("" for a flag without a value), or
 * NULL if absent; into out. */
static const char *lookup(const char *cfg, const char *flag, char *out, size_t n) {
    size_t k = strlen(flag);
    for (const char *l = cfg; l && *l;) {
        const char *e = strchr(l, '\n');
        size_t len = e ? (size_t)(e - l) : strlen(l);
        if (len >= k && !strncmp(l, flag, k) && (len == k || l[k] == '=')) {
            size_t v = len > k ? len - k - 1 : 0;
            if (v >= n) v = n - 1;
            memcpy(out, l + k + (len > k), v);
            out[v] = 0;
            return out;
        }
        l = e ? e + 1 : NULL;
    }
    return NULL;
}

int dptrain_config_overrides(const char *stored, const char *now, FILE *f) {
    int count = 0;
    /* every option in either, once: the stored ones in order, then the new ones */
    const char *lists[2] = {stored, now};
    for (int which = 0; which < 2; which++)
        for (const char *l = lists[which]; l && *l;) {
            const char *e = strchr(l, '\n');
            size_t len = e ? (size_t)(e - l) : strlen(l);
            char flag[64];
            size_t k = strcspn(l, "=\n");
            if (k > len) k = len;
            snprintf(flag, sizeof flag, "%.*s", (int)k, l);
            char a[4096], b[4096];
            const char *va = lookup(stored, flag, a, sizeof a), *vb = lookup(now, flag, b, sizeof b);
            /* (the second pass adds the options the checkpoint's run did not have) */
            if ((which == 0 || !va) && (!va != !vb || (va && vb && strcmp(va, vb)))) {
                count++;
                if (!vb)
                    fprintf(f, "resume: %s%s%s from the checkpoint no longer applies\n", flag, *va ? " " : "", va);
                else if (!va)
                    fprintf(f, "resume: %s%s%s (not in the checkpoint's run)\n", flag, *vb ? " " : "", vb);
                else
                    fprintf(f, "resume: %s %s overrides the checkpoint's %s\n", flag, vb, va);
            }
            l = e ? e + 1 : NULL;
        }
    return count;
}
