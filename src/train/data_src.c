/* The training data of an image-or-feature model: which source --data names,
 * its test set (its own, --test-data, or --val-split held out), the limits,
 * and the input normalisation (docs/data.md).
 *
 *   --data DIR               IDX files (train-*, t10k-*): Fashion-MNIST's layout, test set included
 *   --data X.npy --labels Y  a NumPy pair, features mapped (src/data/arrays.c)
 *
 * The normalisation is per channel (per feature of an (N, D) table: dp_dataset_norm_groups),
 * x' = (x - mean[c]) / std[c]; its values
 * are the run's (t->norm_mean/std), stored in the checkpoint (DPNORMIN) so that
 * a resume and `dptrain eval` use the very same numbers. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "trainer.h"

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* A normalisation's text ("mean M0 ...\nstd S0 ...\n", C values each) into mean and std. */
static int parse_norm(const char *s, int64_t C, float *mean, float *std, const char *what) {
    char *end;
    int rc = DP_OK;
    for (int which = 0; which < 2 && !rc; which++) {
        const char *key = which ? "std" : "mean";
        float *out = which ? std : mean;
        while (*s == '\n') s++;
        if (strncmp(s, key, strlen(key))) {
            rc = DP_EFORMAT;
            break;
        }
        s += strlen(key);
        for (int64_t c = 0; c < C && !rc; c++) {
            double v = strtod(s, &end);
            if (end == s) rc = DP_EFORMAT;
            out[c] = (float)v, s = end;
        }
        while (!rc && *s == ' ') s++;
        if (!rc && *s != '\n') rc = DP_EFORMAT; /* another channel count */
    }
    if (rc) return dp_seterr(DP_EMISMATCH, "%s: its input normalisation is not for %lld channels or features "
                             "(another data source?)", what, (long long)C);
    return DP_OK;
}

/* The normalisation stored in a checkpoint: C values of each, or *found = 0 when it has none. */
static int ckpt_norm(const char *path, int64_t C, float *mean, float *std, int *found) {
    void *data;
    uint64_t size;
    *found = 0;
    int rc = dp_ckpt_read_section(path, DP_CKPT_NORM_TAG, &data, &size);
    if (rc || !data) return rc;
    ((char *)data)[size] = 0;
    rc = parse_norm(data, C, mean, std, path);
    dp_free(data);
    *found = !rc;
    return rc;
}

/* The normalisation section's text, for the checkpoint writer (NULL: none applied). */
char *dp__norm_text(const struct dp_trainer *t) {
    if (!t->norm_C) return NULL;
    size_t cap = (size_t)t->norm_C * 64 + 32, len = 0;
    char *s = dp_malloc(cap);
    if (!s) return NULL;
    for (int which = 0; which < 2; which++) {
        len += (size_t)snprintf(s + len, cap - len, "%s", which ? "std" : "mean");
        for (int64_t c = 0; c < t->norm_C; c++)
            len += (size_t)snprintf(s + len, cap - len, " %.9g", (double)(which ? t->norm_std : t->norm_mean)[c]);
        len += (size_t)snprintf(s + len, cap - len, "\n");
    }
    return s;
}

/* Decides the normalisation (the checkpoint's when resuming, else per p->normalize) and
 * applies it to both splits. */
static int normalize(struct dp_trainer *t, int idx) {
    const struct dp_train_params *p = &t->p;
    int64_t C = dp_dataset_norm_groups(&t->train); /* channels, or a table's features */
    int mode = p->normalize ? p->normalize : idx ? DP_NORM_FIXED : DP_NORM_AUTO;
    t->norm_mean = dp_malloc(sizeof(float) * (size_t)C);
    t->norm_std = dp_malloc(sizeof(float) * (size_t)C);
    double *m = dp_malloc(sizeof(double) * (size_t)C), *sd = dp_malloc(sizeof(double) * (size_t)C);
    int rc = DP_OK, found = 0;
    if (!t->norm_mean || !t->norm_std || !m || !sd) {
        rc = dp_seterr(DP_ENOMEM, "trainer: out of memory");
        goto out;
    }
    if (p->resume && (rc = ckpt_norm(p->resume, C, t->norm_mean, t->norm_std, &found))) goto out;
    if (!found && p->norm_text && (rc = parse_norm(p->norm_text, C, t->norm_mean, t->norm_std, "the weights' metadata")))
        goto out;
    found |= p->norm_text != NULL;
    if (!found && mode == DP_NORM_NONE) goto out; /* norm_C stays 0 */
    if (!found && mode == DP_NORM_FIXED)
        for (int64_t c = 0; c < C; c++) t->norm_mean[c] = p->norm_mean, t->norm_std[c] = p->norm_std;
    if (!found && mode == DP_NORM_AUTO) {
        if ((rc = dp_dataset_channel_stats(&t->train, m, sd))) goto out;
        for (int64_t c = 0; c < C; c++) t->norm_mean[c] = (float)m[c], t->norm_std[c] = (float)sd[c];
    }
    t->norm_C = C;
    if ((rc = dp_dataset_normalize_channels(&t->train, t->norm_mean, t->norm_std))) goto out;
    if (t->test.n) rc = dp_dataset_normalize_channels(&t->test, t->norm_mean, t->norm_std);
out:
    dp_free(m), dp_free(sd);
    return rc;
}

/* An .npy pair: X and its labels. */
static int open_pair(struct dp_dataset *ds, const char *x, const char *y, const char *xopt, const char *yopt,
                     const struct dp_data_opts *o) {
    if (!y)
        return dp_seterr(DP_EINVAL, "%s %s needs its labels: %s y.npy (the class of each sample, shape (N,))", xopt,
                         x, yopt);
    if (!ends_with(y, ".npy"))
        return dp_seterr(DP_EINVAL, "%s %s: labels are read from an .npy file", yopt, y);
    return dp_dataset_open_npy(ds, x, y, o);
}

int dp__data_load(struct dp_trainer *t) {
    const struct dp_train_params *p = &t->p;
    const char *data = p->data_dir ? p->data_dir : "";
    int npy = ends_with(data, ".npy"), rc;
    struct dp_data_opts o = {.nhwc = p->layout_nhwc, .regression = t->regression};
    if (!npy && t->regression)
        return dp_seterr(DP_EINVAL, "a regression (--loss mse) needs float targets: --data X.npy --labels y.npy "
                         "(an IDX folder holds classes)");
    if (!npy) {
        /* IDX: the folder holds its test split */
        const char *own = p->labels ? "--labels" : p->test_data ? "--test-data" : p->test_labels ? "--test-labels"
                        : p->val_split > 0 ? "--val-split" : p->layout_nhwc ? "--layout nhwc" : NULL;
        struct stat st;
        if (own && stat(data, &st) == 0 && S_ISDIR(st.st_mode))
            return dp_seterr(DP_EINVAL, "%s does not apply to --data %s, a folder of IDX files (it holds its "
                             "labels and its test split); it goes with --data X.npy", own, data);
        if ((rc = dp_dataset_load_dir_first(&t->train, &t->test, data, p->train_limit > 0 ? p->train_limit : 0,
                                            p->test_limit > 0 ? p->test_limit : 0)))
            return rc;
        return normalize(t, 1);
    }
    if ((rc = open_pair(&t->train, data, p->labels, "--data", "--labels", &o))) return rc;
    if (p->test_labels && !p->test_data)
        return dp_seterr(DP_EINVAL, "--test-labels %s without --test-data X.npy", p->test_labels);
    if (p->test_data && p->val_split > 0)
        return dp_seterr(DP_EINVAL, "--test-data and --val-split: give one (the test set, or the fraction of "
                         "--data to hold out)");
    if (p->test_data) {
        if (!ends_with(p->test_data, ".npy"))
            return dp_seterr(DP_EINVAL, "--test-data %s: with --data X.npy the test set is an .npy too",
                             p->test_data);
        if ((rc = open_pair(&t->test, p->test_data, p->test_labels, "--test-data", "--test-labels", &o))) return rc;
        if (t->test.C != t->train.C || t->test.H != t->train.H || t->test.W != t->train.W)
            return dp_seterr(DP_EMISMATCH, "--test-data %s: its samples are %lld x %lld x %lld, --data %s's %lld x "
                             "%lld x %lld (C x H x W)", p->test_data, (long long)t->test.C, (long long)t->test.H,
                             (long long)t->test.W, data, (long long)t->train.C, (long long)t->train.H,
                             (long long)t->train.W);
    } else if (p->val_split > 0 && (rc = dp_dataset_split(&t->train, &t->test, p->val_split, p->seed))) {
        return rc;
    }
    dp_dataset_limit(&t->train, p->train_limit);
    /* the classes are those either split names */
    if (t->test.num_classes > t->train.num_classes) t->train.num_classes = t->test.num_classes;
    return normalize(t, 0);
}
