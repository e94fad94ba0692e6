/* train's options by name (src/train/options.c over option_table.c): every kind of value set
 * and refused with its one line, the names' spellings, the checks of options the run's mode
 * would ignore, and the stored configuration rendered and read back to the same parameters. */
#include <stdlib.h>
#include <string.h>

#include "dp/ddp.h"
#include "dp/train.h"
#include "test.h"

static struct dp_train_params *fresh(void) {
    struct dp_train_params *p = dp_train_params_new();
    ASSERT_TRUE(p != NULL);
    return p;
}

TEST(options_set_each_kind) {
    struct dp_train_params *p = fresh();
    ASSERT_EQ(dp_train_option_set(p, "lr", "0.125"), DP_OK);
    ASSERT_FEQ(p->sched.base_lr, 0.125f);
    ASSERT_EQ(dp_train_option_set(p, "--epochs", "7"), DP_OK); /* the CLI's spelling */
    ASSERT_EQ(p->run.epochs, 7);
    ASSERT_EQ(dp_train_option_set(p, "zero_gather", "ahead"), DP_OK); /* Python's */
    ASSERT_EQ(p->dp.zero_gather, DP_ZERO_GATHER_AHEAD);
    ASSERT_EQ(dp_train_option_set(p, "seed", "9007199254740993"), DP_OK);
    ASSERT_TRUE(p->run.seed == 9007199254740993ull);
    ASSERT_EQ(dp_train_option_set(p, "deterministic", NULL), DP_OK);
    ASSERT_EQ(p->dp.deterministic, 1);
    ASSERT_EQ(dp_train_option_set(p, "deterministic", "false"), DP_OK);
    ASSERT_EQ(p->dp.deterministic, 0);
    ASSERT_EQ(dp_train_option_set(p, "no-overlap", "1"), DP_OK); /* an inverted flag */
    ASSERT_EQ(p->dp.overlap, 0);
    ASSERT_EQ(dp_train_option_set(p, "balance", NULL), DP_OK); /* an optional value */
    ASSERT_EQ(p->dp.balance, 10);
    ASSERT_EQ(dp_train_option_set(p, "backup-workers", "1"), DP_OK); /* two fields */
    ASSERT_TRUE(p->dp.backup == 1 && p->dp.backup_workers == 1);
    ASSERT_EQ(dp_train_option_set(p, "bucket-cap-mb", "0.5"), DP_OK);
    ASSERT_EQ((long long)p->dp.bucket_cap_bytes, 524288);
    ASSERT_EQ(dp_train_option_set(p, "compress", "topk:0.1"), DP_OK);
    ASSERT_EQ(p->dp.compress.kind, DP_COMPRESS_TOPK);
    ASSERT_EQ(dp_train_option_set(p, "image-size", "32,48"), DP_OK);
    ASSERT_TRUE(p->data.image_h == 32 && p->data.image_w == 48);
    ASSERT_EQ(dp_train_option_set(p, "normalize", "0.5,0.25"), DP_OK);
    ASSERT_TRUE(p->data.normalize == DP_NORM_FIXED && p->data.norm_mean == 0.5f && p->data.norm_std == 0.25f);
    ASSERT_EQ(dp_train_option_set(p, "model", "mlp"), DP_OK);
    ASSERT_EQ(dp_train_option_set(p, "model-file", "m.txt"), DP_OK); /* replaces the spec */
    ASSERT_TRUE(p->run.model == NULL && !strcmp(p->run.model_file, "m.txt"));
    dp_train_params_free(p);
}

TEST(options_refuse_with_one_line) {
    struct dp_train_params *p = fresh();
    const struct {
        const char *name, *value, *msg;
    } bad[] = {
        {"epochs", "0", "--epochs: '0' is not an integer in 1..1000000"},
        {"epochs", "3x", "--epochs: '3x' is not an integer in 1..1000000"},
        {"lr", "nan", "--lr: 'nan' is not a number in 1e-12..1e+06"},
        {"zero-gather", "later", "--zero-gather: expected auto, step or ahead, got 'later'"},
        {"mode", "fast", "--mode: expected sync or async, got 'fast'"},
        {"optim", "lion", "--optim: unknown optimizer 'lion' (expected sgd or adamw)"},
        {"hflip", "maybe", "option --hflip is a flag: expected no value, or 1/0, true/false"},
        {"batch", NULL, "option --batch needs a value"},
        {"batchsize", "1", "unknown option 'batchsize'"},
        {"image-size", "32", "--image-size 32: expected H,W"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ASSERT_EQ(dp_train_option_set(p, bad[i].name, bad[i].value), DP_EINVAL);
        if (strncmp(dp_errmsg(), bad[i].msg, strlen(bad[i].msg))) {
            fprintf(stderr, "%s %s: got '%s'\n", bad[i].name, bad[i].value ? bad[i].value : "(null)", dp_errmsg());
            ASSERT_TRUE(0);
        }
    }
    /* nothing was changed by a refusal */
    struct dp_train_params d = dp_train_default_params();
    ASSERT_EQ(p->run.epochs, d.run.epochs);
    ASSERT_EQ(p->dp.zero_gather, d.dp.zero_gather);
    dp_train_params_free(p);
}

TEST(options_check_names_the_mode_needed) {
    struct dp_train_params *p = fresh();
    ASSERT_EQ(dp_train_option_set(p, "momentum", "0.9"), DP_OK);
    ASSERT_EQ(dp_train_option_check(p, "momentum"), DP_OK);
    ASSERT_EQ(dp_train_option_set(p, "optim", "adamw"), DP_OK);
    ASSERT_EQ(dp_train_option_check(p, "momentum"), DP_EINVAL);
    ASSERT_TRUE(strstr(dp_errmsg(), "--momentum applies to --optim sgd only") != NULL);
    ASSERT_EQ(dp_train_option_check(p, "beta1"), DP_OK);
    ASSERT_EQ(dp_train_option_check(p, "warmup"), DP_EINVAL);
    ASSERT_TRUE(strstr(dp_errmsg(), "applies to --schedule cosine only (this run's schedule is constant)") != NULL);
    ASSERT_EQ(dp_train_option_check(p, "zero-reduce"), DP_EINVAL);
    ASSERT_EQ(dp_train_option_set(p, "zero", "1"), DP_OK);
    ASSERT_EQ(dp_train_option_check(p, "zero-reduce"), DP_OK);
    ASSERT_EQ(dp_train_option_check(p, "no-error-feedback"), DP_EINVAL);
    ASSERT_TRUE(strstr(dp_errmsg(), "(none keeps no residual)") != NULL);
    dp_train_params_free(p);
}

/* Every option has a name the table finds again, a group and help; a value placeholder for
 * each that takes one; names unique. */
TEST(options_table_complete) {
    int n = 0;
    for (const struct dp_train_option *o; (o = dp_train_option_at(n)); n++) {
        ASSERT_TRUE(o->name && o->group && o->help && *o->help);
        ASSERT_TRUE(dp_train_option_find(o->name) == o);
        ASSERT_TRUE(!strcmp(dp_train_option_name(n), o->name));
    }
    ASSERT_TRUE(n >= 80);
    ASSERT_TRUE(dp_train_option_name(n) == NULL && dp_train_option_at(-1) == NULL);
}

/* The configuration rendered, set again line by line into fresh parameters, renders the same
 * text: what a resume does with a checkpoint's stored lines. */
TEST(options_render_round_trip) {
    struct dp_train_params *p = fresh();
    static const char *const set[][2] = {
        {"model", "cnn"},       {"epochs", "3"},          {"batch", "96"},       {"lr", "0.01"},
        {"optim", "adamw"},     {"beta2", "0.98"},        {"schedule", "cosine"}, {"warmup", "5"},
        {"zero", "1"},          {"zero-reduce", "scatter"}, {"compress", "powersgd:2"},
        {"powersgd-start", "4"}, {"deterministic", NULL}, {"det-chunk", "16"},   {"balance", "5"},
        {"csv-header", "no"},   {"normalize", "auto"},    {"no-overlap", NULL},  {"staleness", "0"},
        {"workers", "3"},       {"clip", "1.5"},
    };
    for (size_t i = 0; i < sizeof set / sizeof set[0]; i++) ASSERT_EQ(dp_train_option_set(p, set[i][0], set[i][1]), DP_OK);
    char *a = dp_train_options_render(p);
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(strstr(a, "--zero-reduce=scatter\n") && strstr(a, "--det-chunk=16\n") && strstr(a, "--no-overlap\n"));
    ASSERT_TRUE(strstr(a, "--momentum=") == NULL); /* AdamW's run: SGD's options are not its */
    ASSERT_TRUE(strstr(a, "--workers") == NULL);   /* where it runs is not the run */
    ASSERT_TRUE(strstr(a, "--staleness=0\n") && strstr(a, "--mode=async\n"));
    struct dp_train_params *q = fresh();
    char *copy = strdup(a);
    for (char *l = copy, *e; l && *l; l = e + 1) {
        e = strchr(l, '\n');
        *e = 0;
        char *eq = strchr(l, '=');
        if (eq) *eq = 0;
        ASSERT_EQ(dp_train_option_set(q, l, eq ? eq + 1 : NULL), DP_OK);
    }
    char *b = dp_train_options_render(q);
    ASSERT_TRUE(b && !strcmp(a, b));
    free(a), free(b), free(copy);
    dp_train_params_free(p), dp_train_params_free(q);
}
