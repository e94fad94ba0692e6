/* train's options: one entry each, in the order `dptrain train --help` shows them (the
 * everyday ones first, then one group per subject, the research and tuning knobs last).
 * The mechanism that reads the table is options.c. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "dp/comm.h"
#include "dp/core.h"
#include "dp/ddp.h"
#include "dp/optim.h"
#include "dp/par.h"
#include "options.h"

#define F(field) offsetof(struct dp_train_params, field)

/* ---- the options whose text is not one number or word ----------------------------------- */

static int set_model_file(struct dp_train_params *p, const char *v) {
    p->run.model_file = v, p->run.model = NULL; /* (replaces a --model given before it) */
    return DP_OK;
}
static int set_optim(struct dp_train_params *p, const char *v) {
    int k = dp_optim_kind_parse(v);
    if (k < 0) return dp_seterr(DP_EINVAL, "--optim: unknown optimizer '%s' (expected sgd or adamw)", v);
    p->optim.kind = (enum dp_optim_kind)k;
    return DP_OK;
}
static int get_optim(const struct dp_train_params *p, char *out, size_t n) {
    return snprintf(out, n, "%s", dp_optim_kind_name(p->optim.kind)) > 0;
}
static int set_schedule(struct dp_train_params *p, const char *v) {
    int k = dp_sched_kind_parse(v);
    if (k < 0) return dp_seterr(DP_EINVAL, "--schedule: unknown schedule '%s' (expected constant, step or cosine)", v);
    p->sched.kind = (enum dp_sched_kind)k;
    return DP_OK;
}
static int get_schedule(const struct dp_train_params *p, char *out, size_t n) {
    return snprintf(out, n, "%s", dp_sched_kind_name(p->sched.kind)) > 0;
}
static int set_algo(struct dp_train_params *p, const char *v) {
    int k = dp_comm_algo_parse(v);
    if (k < 0)
        return dp_seterr(DP_EINVAL, "--algo: unknown algorithm '%s' (expected auto, ring, rhd, direct or native)", v);
    p->dp.algo = k;
    return DP_OK;
}
static int get_algo(const struct dp_train_params *p, char *out, size_t n) {
    return snprintf(out, n, "%s", dp_comm_algo_name((enum dp_comm_algo)p->dp.algo)) > 0;
}
static int set_pp_schedule(struct dp_train_params *p, const char *v) {
    int k = dp_pipe_schedule_parse(v);
    if (k < 0) return dp_seterr(DP_EINVAL, "--pp-schedule: unknown schedule '%s' (expected gpipe or 1f1b)", v);
    p->dp.pp_schedule = k;
    return DP_OK;
}
static int get_pp_schedule(const struct dp_train_params *p, char *out, size_t n) {
    return snprintf(out, n, "%s", dp_pipe_schedule_name(p->dp.pp_schedule)) > 0;
}
static int set_compress(struct dp_train_params *p, const char *v) { return dp_compress_parse(v, &p->dp.compress); }
static int get_compress(const struct dp_train_params *p, char *out, size_t n) {
    dp_compress_format(&p->dp.compress, out, n);
    return 1;
}
static int set_gemm(struct dp_train_params *p, const char *v) {
    (void)p; /* the process's backend, not the run's */
    int k = dp_gemm_backend_parse(v);
    if (k < 0) return dp_seterr(DP_EINVAL, "--gemm: unknown backend '%s' (expected dnnl, blas or ref)", v);
    return dp_gemm_set_backend((enum dp_gemm_backend)k);
}
/* MiB in the text, bytes in the field */
static int set_mib(size_t *field, const char *name, const char *v) {
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !(x >= 1e-5 && x <= 1e5))
        return dp_seterr(DP_EINVAL, "--%s: '%s' is not a number in 1e-05..100000", name, v);
    *field = (size_t)(x * 1048576.0);
    return DP_OK;
}
static int set_bucket_cap(struct dp_train_params *p, const char *v) {
    return set_mib(&p->dp.bucket_cap_bytes, "bucket-cap-mb", v);
}
static int get_bucket_cap(const struct dp_train_params *p, char *out, size_t n) {
    return p->dp.bucket_cap_bytes && snprintf(out, n, "%.17g", (double)p->dp.bucket_cap_bytes / 1048576.0) > 0;
}
static int set_first_bucket(struct dp_train_params *p, const char *v) {
    return set_mib(&p->dp.first_bucket_bytes, "first-bucket-mb", v);
}
static int get_first_bucket(const struct dp_train_params *p, char *out, size_t n) {
    return p->dp.first_bucket_bytes && snprintf(out, n, "%.17g", (double)p->dp.first_bucket_bytes / 1048576.0) > 0;
}
static int set_zero_unit(struct dp_train_params *p, const char *v) {
    return set_mib(&p->dp.zero_unit_bytes, "zero-unit-mb", v);
}
static int get_zero_unit(const struct dp_train_params *p, char *out, size_t n) {
    return p->dp.zero_unit_bytes && snprintf(out, n, "%.17g", (double)p->dp.zero_unit_bytes / 1048576.0) > 0;
}
static int set_simulate_slow(struct dp_train_params *p, const char *v) {
    int rc = dp_parse_simulate_slow(v, 0, NULL); /* the syntax now; the ranks against the job's size in the trainer */
    if (!rc) p->sim.simulate_slow = v;
    return rc;
}
static int set_simulate_jitter(struct dp_train_params *p, const char *v) {
    struct dp_jitter j;
    int rc = dp_parse_simulate_jitter(v, &j);
    if (!rc) p->sim.simulate_jitter = v;
    return rc;
}
static int set_backup_workers(struct dp_train_params *p, const char *v) {
    char *end;
    long x = strtol(v, &end, 10); /* the upper bound (< workers) is the trainer's check */
    if (end == v || *end || x < 0 || x > 255)
        return dp_seterr(DP_EINVAL, "--backup-workers: '%s' is not an integer in 0..255", v);
    p->dp.backup = 1, p->dp.backup_workers = (int)x;
    return DP_OK;
}
static int get_backup_workers(const struct dp_train_params *p, char *out, size_t n) {
    return p->dp.backup && snprintf(out, n, "%d", p->dp.backup_workers) > 0;
}
static int get_mode(const struct dp_train_params *p, char *out, size_t n) {
    return snprintf(out, n, "%s", p->dp.async || p->dp.staleness >= 0 ? "async" : "sync") > 0;
}
static int set_mode(struct dp_train_params *p, const char *v) {
    if (strcmp(v, "async") && strcmp(v, "sync")) return dp_seterr(DP_EINVAL, "--mode: expected sync or async, got '%s'", v);
    p->dp.async = !strcmp(v, "async");
    return DP_OK;
}
static int set_balance(struct dp_train_params *p, const char *v) {
    char *end;
    long long x = v ? strtoll(v, &end, 10) : 10; /* the value is optional */
    if (v && (end == v || *end || x < 1 || x > 1000000))
        return dp_seterr(DP_EINVAL, "--balance: '%s' is not an integer in 1..1000000", v);
    p->dp.balance = x;
    return DP_OK;
}
static int get_balance(const struct dp_train_params *p, char *out, size_t n) {
    return p->dp.balance && snprintf(out, n, "%lld", (long long)p->dp.balance) > 0;
}
static int set_prefetch(struct dp_train_params *p, const char *v) {
    char *end;
    long x = strtol(v, &end, 10);
    if (!strcmp(v, "auto")) x = -1;
    else if (end == v || *end || x < 0 || x > 64)
        return dp_seterr(DP_EINVAL, "--prefetch: '%s' is not an integer in 0..64 (or auto)", v);
    p->data.prefetch = (int)x;
    return DP_OK;
}
static int set_image_size(struct dp_train_params *p, const char *v) {
    char *end;
    long long h = strtoll(v, &end, 10), w = *end == ',' ? strtoll(end + 1, &end, 10) : 0;
    if (*end || h < 1 || w < 1 || h > 16384 || w > 16384)
        return dp_seterr(DP_EINVAL, "--image-size %s: expected H,W (each 1..16384), e.g. --image-size 64,64", v);
    p->data.image_h = h, p->data.image_w = w;
    return DP_OK;
}
static int get_image_size(const struct dp_train_params *p, char *out, size_t n) {
    return p->data.image_h && snprintf(out, n, "%lld,%lld", (long long)p->data.image_h, (long long)p->data.image_w) > 0;
}
static int set_normalize(struct dp_train_params *p, const char *v) {
    char *end;
    if (!strcmp(v, "auto")) p->data.normalize = DP_NORM_AUTO;
    else if (!strcmp(v, "none")) p->data.normalize = DP_NORM_NONE;
    else {
        double m = strtod(v, &end), sd = *end == ',' ? strtod(end + 1, &end) : 0;
        if (end == v || *end || !(sd > 0) || !isfinite(m) || !isfinite(sd))
            return dp_seterr(DP_EINVAL, "--normalize %s: expected auto, none or MEAN,STD (STD > 0), e.g. "
                             "--normalize 0.5,0.25", v);
        p->data.normalize = DP_NORM_FIXED, p->data.norm_mean = (float)m, p->data.norm_std = (float)sd;
    }
    return DP_OK;
}
static int get_normalize(const struct dp_train_params *p, char *out, size_t n) {
    char a[32], b[32];
    if (p->data.normalize == DP_NORM_AUTO || p->data.normalize == DP_NORM_NONE)
        return snprintf(out, n, "%s", p->data.normalize == DP_NORM_AUTO ? "auto" : "none") > 0;
    return p->data.normalize == DP_NORM_FIXED &&
           snprintf(out, n, "%s,%s", dp__flt(a, sizeof a, p->data.norm_mean), dp__flt(b, sizeof b, p->data.norm_std)) > 0;
}

/* ---- the table ----------------------------------------------------------------------------- */

#define G_BASICS "basics"
#define G_DATA "data and model"
#define G_OPTIM "optimisation"
#define G_CKPT "checkpoints and evaluation"
#define G_DDP "data parallelism"
#define G_SLOW "slow workers (docs/ddp.md)"
#define G_COMPRESS "gradient compression (docs/ddp.md)"
#define G_ZERO "memory (ZeRO, docs/ddp.md)"
#define G_SPLIT "splitting the model (docs/parallel.md)"
#define G_TUNE "diagnostics, simulation and tuning"

/* An entry: name, value, group, help; then how it is read */
#define OPT(name, arg, group, help) {name, arg, group, help, 0}
#define OPT_OPTIONAL(name, arg, group, help) {name, arg, group, help, 1}
#define NUM(k, field, a, b) .kind = k, .off = F(field), .ilo = (a), .ihi = (b)
#define FNUM(k, field, a, b) .kind = k, .off = F(field), .lo = (a), .hi = (b)
#define FLAG(field) .kind = DP__OPT_FLAG, .off = F(field), .flag_on = 1
#define CUSTOM(s, g) .kind = DP__OPT_CUSTOM, .set = s, .get = g

const struct dp__opt dp__opts[] = {
    {OPT("data", "DIR", G_BASICS,
         "IDX files train-*/t10k-* (plain or .gz) [/usr/share/datasets/\n"
         "fashion-mnist]; X.npy with --labels y.npy, data.npz, data.csv, a folder\n"
         "of images (docs/data.md); gpt: a token file (dptrain prepare-text;\n"
         "docs/text.md), or a\n"
         "folder of text files, prepared on first use into ~/.cache/dptrain\n"
         "($XDG_CACHE_HOME) and reused while valid"),
     .kind = DP__OPT_PATH, .off = F(data.data_dir), .store = DP__STORE_SET},
    {OPT("model", "SPEC", G_BASICS,
         "mlp | cnn | resnet | mlp:784,W1,...,10[,dropout=P] | mlp:hidden=W1,... |\n"
         "cnn:C1,C2[,F] | resnet:DEPTH[,WIDTH] (DEPTH 6n+2: 8, 14, 20, ...) |\n"
         "gpt:layers=L,heads=H,dim=D,ctx=T[,vocab=V] [mlp]"),
     .kind = DP__OPT_STR, .off = F(run.model), .store = DP__STORE_SET},
    {OPT("epochs", "N", G_BASICS, "passes over the training set [1]"), NUM(DP__OPT_I64, run.epochs, 1, 1000000),
     .store = DP__STORE_ALWAYS},
    {OPT("batch", "N", G_BASICS, "global batch size, split over the workers [128]"),
     NUM(DP__OPT_I64, run.batch, 1, 1 << 20), .store = DP__STORE_ALWAYS},
    {OPT("lr", "F", G_BASICS, "learning rate [0.05]"), FNUM(DP__OPT_F32, sched.base_lr, 1e-12, 1e6),
     .store = DP__STORE_ALWAYS},
    {OPT("out", "DIR", G_BASICS, "write metrics.jsonl and checkpoint.bin there"), .kind = DP__OPT_STR,
     .off = F(io.out_dir)},
    {OPT("resume", "FILE", G_BASICS, "continue exactly from a checkpoint (same --batch, --seed)"),
     .kind = DP__OPT_STR, .off = F(io.resume)},
    {OPT("workers", "P", G_BASICS,
         "data-parallel workers (threads, one replica each) per process\n"
         "[cores / processes on this host]"),
     NUM(DP__OPT_INT, dp.workers, 1, 256)},

    {OPT("model-file", "FILE", G_DATA,
         "a model declared in a file, one layer per line (docs/models.md;\n"
         "models/*.txt are the built-in ones); it travels in the checkpoint"),
     CUSTOM(set_model_file, NULL)},
    {OPT("labels", "FILE", G_DATA, "with --data X.npy: y.npy, a class per sample (float targets with --loss mse)"),
     .kind = DP__OPT_PATH, .off = F(data.labels), .store = DP__STORE_SET},
    {OPT("test-data", "FILE", G_DATA, "with --data X.npy: the test set's X.npy"), .kind = DP__OPT_PATH,
     .off = F(data.test_data), .store = DP__STORE_SET},
    {OPT("test-labels", "FILE", G_DATA, "with --test-data: the test set's y.npy"), .kind = DP__OPT_PATH,
     .off = F(data.test_labels), .store = DP__STORE_SET},
    {OPT("npz-keys", "X,Y", G_DATA,
         "--data data.npz: its features' and labels' arrays [x,y, or Keras's\n"
         "x_train,y_train with x_test,y_test as the test set]"),
     .kind = DP__OPT_STR, .off = F(data.npz_keys), .store = DP__STORE_SET},
    {OPT("label-column", "C", G_DATA,
         "--data data.csv: the labels' column, a header name or a 0-based index\n"
         "[the last]; the CSV is parsed once into the cache folder"),
     .kind = DP__OPT_STR, .off = F(data.label_column), .store = DP__STORE_SET},
    {OPT("csv-header", "H", G_DATA, "auto | yes | no: whether the CSV's first row names the columns [auto]"),
     .kind = DP__OPT_CHOICE, .off = F(data.csv_header), .choices = "auto|yes|no", .vals = {-1, 1, 0},
     .store = DP__STORE_SET},
    {OPT("image-size", "H,W", G_DATA,
         "--data DIR of images (DIR/<class>/*.png|jpg): resize each (shorter\n"
         "side) and centre-crop it to H x W [their own size, all equal]"),
     CUSTOM(set_image_size, get_image_size), .store = DP__STORE_SET},
    {OPT("image-channels", "N", G_DATA, "1 (grey) or 3 (RGB) [3 if any image has colour, else 1]"),
     NUM(DP__OPT_INT, data.image_channels, 1, 3), .store = DP__STORE_SET},
    {OPT("skip-bad-images", NULL, G_DATA, "skip and count corrupt images instead of stopping at the first"),
     FLAG(data.skip_bad_images), .store = DP__STORE_SET},
    {OPT("val-split", "F", G_DATA, "hold out the fraction F of --data X.npy as the test set (seed-keyed) [none]"),
     FNUM(DP__OPT_F64, data.val_split, 0, 0.99), .store = DP__STORE_SET},
    {OPT("layout", "L", G_DATA, "nchw | nhwc: how X.npy's 4-D samples are stored [nchw]"),
     .kind = DP__OPT_CHOICE, .off = F(data.layout_nhwc), .choices = "nchw|nhwc", .vals = {0, 1},
     .store = DP__STORE_SET},
    {OPT("normalize", "MODE", G_DATA,
         "auto | none | MEAN,STD; auto: each channel's mean and std over the\n"
         "training split [IDX: 0.2860,0.3530 (Fashion-MNIST's); X.npy: auto]"),
     CUSTOM(set_normalize, get_normalize), .store = DP__STORE_SET},
    {OPT("loss", "NAME", G_DATA, "cross_entropy | mse (a regression: RMSE and MAE reported) [cross_entropy]"),
     .kind = DP__OPT_CHOICE, .off = F(run.loss), .choices = "cross_entropy|mse", .vals = {DP_LOSS_XENT, DP_LOSS_MSE},
     .store = DP__STORE_SET},
    {OPT("data-format", "F", G_DATA,
         "gpt: tokens (dptrain's token file, or an llm.c shard) | u16 (raw uint16\n"
         "tokens, nanoGPT's train.bin; the vocabulary is the model's) [tokens]"),
     .kind = DP__OPT_CHOICE, .off = F(data.tokens_raw_u16), .choices = "tokens|u16", .vals = {0, 1},
     .store = DP__STORE_SET},
    {OPT("train-limit", "N", G_DATA,
         "use only the first N training samples [all], and read no image\n"
         "past them; gpt: N windows per epoch [training tokens / (ctx + 1)]"),
     NUM(DP__OPT_I64, data.train_limit, 1, INT64_MAX / 2), .store = DP__STORE_SET},
    {OPT("test-limit", "N", G_DATA,
         "evaluate on the first N test samples [all] (read no image past\n"
         "them); gpt: validation windows"),
     NUM(DP__OPT_I64, data.test_limit, 1, INT64_MAX / 2), .store = DP__STORE_SET},
    {OPT("crop-pad", "N", G_DATA, "augmentation: random crop with N pixels of zero padding [0]"),
     NUM(DP__OPT_INT, data.aug.crop_pad, 0, 64), .store = DP__STORE_SET},
    {OPT("hflip", NULL, G_DATA, "augmentation: random horizontal flip"), FLAG(data.aug.hflip), .store = DP__STORE_SET},
    {OPT("init-from", "FILE", G_DATA, "initial weights from a safetensors file (PyTorch names)"),
     .kind = DP__OPT_STR, .off = F(io.init_from)},
    {OPT("seed", "N", G_DATA, "seed for initialisation, shuffling, dropout, augmentation [1]"),
     NUM(DP__OPT_U64, run.seed, 0, INT64_MAX), .store = DP__STORE_ALWAYS},

    {OPT("optim", "NAME", G_OPTIM, "sgd | adamw [sgd]"), CUSTOM(set_optim, get_optim), .store = DP__STORE_ALWAYS},
    {OPT("momentum", "F", G_OPTIM, "SGD's momentum [0]"), FNUM(DP__OPT_F32, optim.momentum, 0, 0.999999),
     .store = DP__STORE_ALWAYS, .need = DP__NEED_SGD},
    {OPT("nesterov", NULL, G_OPTIM, "SGD: Nesterov momentum"), FLAG(optim.nesterov), .store = DP__STORE_SET,
     .need = DP__NEED_SGD},
    {OPT("beta1", "F", G_OPTIM, "AdamW's first-moment decay [0.9]"), FNUM(DP__OPT_F32, optim.beta1, 0, 0.999999),
     .store = DP__STORE_ALWAYS, .need = DP__NEED_ADAMW},
    {OPT("beta2", "F", G_OPTIM, "AdamW's second-moment decay [0.999]"),
     FNUM(DP__OPT_F32, optim.beta2, 0, 0.999999999), .store = DP__STORE_ALWAYS, .need = DP__NEED_ADAMW},
    {OPT("eps", "F", G_OPTIM, "AdamW's epsilon [1e-8]"), FNUM(DP__OPT_F32, optim.eps, 1e-30, 1),
     .store = DP__STORE_ALWAYS, .need = DP__NEED_ADAMW},
    {OPT("weight-decay", "F", G_OPTIM, "weight decay (AdamW: decoupled) [0]"),
     FNUM(DP__OPT_F32, optim.weight_decay, 0, 10), .store = DP__STORE_ALWAYS},
    {OPT("schedule", "NAME", G_OPTIM, "constant | step | cosine [constant]"), CUSTOM(set_schedule, get_schedule),
     .store = DP__STORE_ALWAYS},
    {OPT("warmup", "N", G_OPTIM, "cosine: linear warmup steps [0]"),
     NUM(DP__OPT_I64, sched.warmup_steps, 0, INT64_MAX / 2), .store = DP__STORE_ALWAYS, .need = DP__NEED_COSINE},
    {OPT("min-lr", "F", G_OPTIM, "cosine: final learning rate [0]"), FNUM(DP__OPT_F32, sched.min_lr, 0, 1e6),
     .store = DP__STORE_ALWAYS, .need = DP__NEED_COSINE},
    {OPT("step-size", "N", G_OPTIM, "step: decay every N steps"),
     NUM(DP__OPT_I64, sched.step_size, 1, INT64_MAX / 2), .store = DP__STORE_ALWAYS, .need = DP__NEED_STEP},
    {OPT("gamma", "F", G_OPTIM, "step: the factor [0.1]"), FNUM(DP__OPT_F32, sched.gamma, 0, 1),
     .store = DP__STORE_ALWAYS, .need = DP__NEED_STEP},
    {OPT("clip", "F", G_OPTIM, "clip the global gradient norm to F [off]"), FNUM(DP__OPT_F64, run.clip_norm, 0, 1e12),
     .store = DP__STORE_SET},
    {OPT("max-steps", "N", G_OPTIM, "stop after N steps in total [off]"),
     NUM(DP__OPT_I64, run.max_steps, 0, INT64_MAX / 2)},

    {OPT("ckpt-every", "N", G_CKPT, "checkpoint every N epochs [only at the end]"),
     NUM(DP__OPT_INT, io.ckpt_every, 0, 1000000), .store = DP__STORE_ALWAYS},
    {OPT("ckpt-every-steps", "N", G_CKPT,
         "checkpoint every N optimizer steps, written in the background\n"
         "while training goes on (with ZeRO: in the step) [off]"),
     NUM(DP__OPT_I64, io.ckpt_every_steps, 0, INT64_MAX / 2), .store = DP__STORE_SET},
    {OPT("ckpt-sync", NULL, G_CKPT, "write the --ckpt-every-steps checkpoints in the step instead (a\n"
                                     "pipeline across processes always does: each stage streams its span)"),
     FLAG(io.ckpt_sync)},
    {OPT("overwrite", NULL, G_CKPT,
         "replace the run an --out folder already holds (checkpoint.bin,\n"
         "metrics.jsonl); without it train refuses such a folder unless resuming it"),
     FLAG(io.overwrite)},
    {OPT("eval-every", "N", G_CKPT,
         "evaluate on the test set every N steps too; the figures go to the\n"
         "step records of metrics.jsonl [only at the end of each epoch]"),
     NUM(DP__OPT_I64, io.eval_every, 0, INT64_MAX / 2), .store = DP__STORE_SET},

    {OPT("threads", "N", G_DDP, "compute threads per worker [1]"), NUM(DP__OPT_INT, run.threads, 1, 256)},
    {OPT("accum", "K", G_DDP, "gradient accumulation: K global batches per optimizer step [1]"),
     NUM(DP__OPT_INT, dp.accum, 1, 65536), .store = DP__STORE_ALWAYS},
    {OPT("bucket-cap-mb", "F", G_DDP, "gradient bucket cap in MiB [auto: a quarter of the gradient,\n1..25 MiB]"),
     CUSTOM(set_bucket_cap, get_bucket_cap), .store = DP__STORE_SET},
    {OPT("first-bucket-mb", "F", G_DDP, "the first (output-side) bucket in MiB [1]"),
     CUSTOM(set_first_bucket, get_first_bucket), .store = DP__STORE_ALWAYS},
    {OPT("no-overlap", NULL, G_DDP, "all-reduce only after backward (for comparison)"), .kind = DP__OPT_FLAG,
     .off = F(dp.overlap), .flag_on = 0, .store = DP__STORE_SET},
    {OPT("algo", "NAME", G_DDP,
         "all-reduce algorithm: auto | ring | rhd | direct | native [auto];\n"
         "with mpi it applies between processes (native = MPI's own)"),
     CUSTOM(set_algo, get_algo), .store = DP__STORE_ALWAYS},
    {OPT("deterministic", NULL, G_DDP, "bit-identical results for any --workers (fixed chunks, exact sums)"),
     FLAG(dp.deterministic), .store = DP__STORE_SET},
    {OPT("det-chunk", "N", G_DDP, "deterministic mode: samples per chunk [batch/4, within 8..32]"),
     NUM(DP__OPT_I64, dp.det_chunk, 1, 1 << 20), .store = DP__STORE_SET, .need = DP__NEED_DET},
    {OPT("check-replicas", "N", G_DDP, "compare every replica's parameter hash every N steps [off]"),
     NUM(DP__OPT_I64, dp.check_replicas, 0, INT64_MAX / 2), .store = DP__STORE_SET},
    {OPT("skip-nonfinite", NULL, G_DDP, "skip steps whose loss or gradient is NaN/Inf instead of stopping"),
     FLAG(dp.skip_nonfinite), .store = DP__STORE_SET},
    {OPT("comm-timeout", "S", G_DDP, "fail a collective that blocks longer than S seconds [off]"),
     FNUM(DP__OPT_F64, dp.comm_timeout, 0, 1e6), .store = DP__STORE_SET},

    {OPT_OPTIONAL("balance", "[=K]", G_SLOW,
         "heterogeneity-aware batches: every K steps [10] re-split the global\n"
         "batch by each rank's measured throughput and update time, so that\n"
         "their steps end together (the same gradient; whole --det-chunk\n"
         "chunks when deterministic) [off]"),
     CUSTOM(set_balance, get_balance), .store = DP__STORE_SET},
    {OPT("backup-workers", "B", G_SLOW,
         "each step takes the gradients of the first workers - B ranks to finish\n"
         "(their samples' mean) and drops the late ones' [off]; under mpirun\n"
         "with --workers 1 (through rank 0); no BatchNorm"),
     CUSTOM(set_backup_workers, get_backup_workers), .store = DP__STORE_SET},
    {OPT("mode", "NAME", G_SLOW,
         "sync | async [sync]: async trains through a parameter server; each\n"
         "worker loops pull, forward/backward on its own batch of batch/workers,\n"
         "push, never waiting for another (no BatchNorm); under mpirun with\n"
         "--workers 1, the last --servers ranks serve and the others work"),
     CUSTOM(set_mode, get_mode), .store = DP__STORE_ALWAYS},
    {OPT("servers", "S", G_SLOW,
         "parameter-server shards, each with its own lock [min(workers, 4)];\n"
         "under mpirun: server ranks, one shard each [1]"),
     NUM(DP__OPT_INT, dp.servers, 1, INT32_MAX), .store = DP__STORE_SET},
    {OPT("staleness", "S", G_SLOW,
         "stale-synchronous (implies async): a clock's pushes make one update,\n"
         "a worker at most S clocks ahead of the slowest (0 = synchronous)"),
     NUM(DP__OPT_INT, dp.staleness, 0, 1000), .store = DP__STORE_SET},
    {OPT("staleness-lr", NULL, G_SLOW,
         "scale each update's lr by 1 / (1 + its staleness) [off]\n"
         "(epoch lines and metrics.jsonl report the staleness)"),
     FLAG(dp.staleness_lr), .store = DP__STORE_SET},
    {OPT("share-lr", NULL, G_SLOW,
         "async: scale each push's lr by its share of the batch (its samples /\n"
         "--batch), so a global batch's pushes move as far as one sync step [off]"),
     FLAG(dp.share_lr), .store = DP__STORE_SET},
    {OPT("implicit-momentum", NULL, G_SLOW,
         "async SGD: asynchrony acts like momentum 1 - 1/workers; the server runs\n"
         "at momentum 1 - workers x (1 - --momentum), so the two compose to it [off]"),
     FLAG(dp.implicit_momentum), .store = DP__STORE_SET},

    {OPT("compress", "SPEC", G_COMPRESS,
         "none | bf16 | fp16 | powersgd:RANK | topk:FRACTION | sign [none];\n"
         "topk, sign and powersgd keep an error-feedback residual per worker\n"
         "(saved in checkpoints)"),
     CUSTOM(set_compress, get_compress), .store = DP__STORE_ALWAYS},
    {OPT("powersgd-start", "N", G_COMPRESS, "powersgd: plain all-reduce before optimizer step N [0]"),
     NUM(DP__OPT_I64, dp.compress.powersgd_start, 0, INT64_MAX / 2), .store = DP__STORE_ALWAYS,
     .need = DP__NEED_POWERSGD},
    {OPT("no-error-feedback", NULL, G_COMPRESS,
         "topk, sign, powersgd: drop the residual instead of adding it to the\n"
         "next step's gradient (to measure what error feedback buys)"),
     FLAG(dp.compress.no_ef), .store = DP__STORE_SET, .need = DP__NEED_RESIDUAL},

    {OPT("zero", "N", G_ZERO,
         "ZeRO stage: 0 off | 1 each worker keeps the optimizer state of its 1/P\n"
         "shard, updates it and all-gathers the parameters | 2 and the gradient:\n"
         "each bucket reduce-scattered, its memory given back | 3 and the\n"
         "parameters: each bucket gathered before its layers run, then freed [0]"),
     NUM(DP__OPT_INT, dp.zero, 0, 3), .store = DP__STORE_ALWAYS},
    {OPT("zero-reduce", "HOW", G_ZERO,
         "--zero 1's gradient reduction: allreduce (bucketed, overlapped with\n"
         "backward) | scatter (half the bytes: each bucket reduce-scattered during\n"
         "backward with the gather ahead, else the slab after backward) [allreduce]"),
     .kind = DP__OPT_CHOICE, .off = F(dp.zero_scatter), .choices = "allreduce|scatter", .vals = {0, 1},
     .store = DP__STORE_ALWAYS, .need = DP__NEED_ZERO1},
    {OPT("zero-gather", "WHEN", G_ZERO,
         "--zero 1's parameter all-gather: step (within the step) | ahead (bucket\n"
         "by bucket, waited for by the next forward layer by layer) | auto (ahead\n"
         "when the workers span processes, else step) [auto]"),
     .kind = DP__OPT_CHOICE, .off = F(dp.zero_gather), .choices = "auto|step|ahead",
     .vals = {DP_ZERO_GATHER_AUTO, DP_ZERO_GATHER_STEP, DP_ZERO_GATHER_AHEAD}, .store = DP__STORE_ALWAYS,
     .need = DP__NEED_ZERO1},
    {OPT("zero-unit-mb", "MB", G_ZERO,
         "the most a ZeRO range holds, in MiB: buckets no larger, a linear\n"
         "layer larger than it runs in slices of output features, and a\n"
         "transformer block child by child, each gathered, computed and\n"
         "reduce-scattered alone, so --zero 2 and 3 hold a few units in flight,\n"
         "not whole layers (the slices fix the order of the input gradient's\n"
         "sum: the same bits with the same unit) [none]"),
     CUSTOM(set_zero_unit, get_zero_unit), .store = DP__STORE_SET},

    {OPT("pp", "S", G_SPLIT,
         "pipeline parallelism: the model's layers cut into S stages (balanced\n"
         "by counted cost), one worker each; --workers / S replicas of the\n"
         "pipeline train data-parallel [1: off]"),
     NUM(DP__OPT_INT, dp.pp, 1, 256)},
    {OPT("micro-batches", "M", G_SPLIT, "--pp: each replica's share of a batch cut into M micro-batches [S]"),
     NUM(DP__OPT_INT, dp.micro_batches, 1, 4096)},
    {OPT("pp-schedule", "NAME", G_SPLIT,
         "--pp: gpipe (every forward, then every backward: M micro-batches'\n"
         "activations held) | 1f1b (one forward, one backward in turn: at\n"
         "most S held) [1f1b]"),
     CUSTOM(set_pp_schedule, get_pp_schedule)},
    {OPT("tp", "T", G_SPLIT,
         "tensor parallelism: T workers split each transformer block (attention\n"
         "by heads, the MLP column then row; a gpt); --workers / T replicas\n"
         "train data-parallel [1: off]"),
     NUM(DP__OPT_INT, dp.tp, 1, 256)},

    {OPT("timeline", "FILE", G_TUNE,
         "write a Chrome trace (Perfetto, chrome://tracing): one compute and one\n"
         "all-reduce track per worker"),
     .kind = DP__OPT_STR, .off = F(io.timeline)},
    {OPT("simulate-slow", "RANK:FACTOR[,RANK:FACTOR...]", G_TUNE,
         "make job rank RANK's compute FACTOR (>= 1) times slower by sleeping\n"
         "(FACTOR - 1) x its measured compute of each step [off]"),
     CUSTOM(set_simulate_slow, NULL)},
    {OPT("simulate-jitter", "SPEC", G_TUNE,
         "random stalls per (rank, step), replayed by --seed: p=P,ms=MS (a\n"
         "stall of MS ms with probability P) and/or lognormal=SIGMA (compute x\n"
         "exp(SIGMA z) when that is > 1) [off]; docs/ddp.md"),
     CUSTOM(set_simulate_jitter, NULL)},
    {OPT("comm-progress", "WHO", G_TUNE,
         "who runs the buckets' all-reduces on threads: thread (each worker's\n"
         "communication thread) | caller (the workers themselves, between\n"
         "layers; no third thread) | auto (caller when the workers' threads\n"
         "fill the process's cores with none left for a communication\n"
         "thread each, else thread) [auto]"),
     .kind = DP__OPT_CHOICE, .off = F(dp.comm_progress), .choices = "auto|thread|caller",
     .vals = {DP_PROGRESS_AUTO, DP_PROGRESS_THREAD, DP_PROGRESS_CALLER}},
    {OPT("comm-spin-us", "N", G_TUNE,
         "a worker waiting for another spins N microseconds before it sleeps\n"
         "[auto: 10, 1 with more workers than cores; with caller progress\n"
         "up to 2000 while the worker has its core to itself]"),
     NUM(DP__OPT_INT, dp.comm_spin_us, 0, 1000000)},
    {OPT("pin-threads", NULL, G_TUNE,
         "worker r runs only on the r-th core this process may use (its\n"
         "affinity: give each process on a host its own cores) [off]"),
     FLAG(dp.pin_threads)},
    {OPT("prefetch", "N|auto", G_TUNE,
         "batches a loader thread prepares ahead; 0: each worker assembles its\n"
         "own [auto: 0 where the compute threads fill the CPUs, else 2]"),
     CUSTOM(set_prefetch, NULL)},
    {OPT("gemm", "NAME", G_TUNE, "dnnl | blas | ref [dnnl when built]"), CUSTOM(set_gemm, NULL)},
};
const int dp__nopts = (int)(sizeof dp__opts / sizeof dp__opts[0]);
