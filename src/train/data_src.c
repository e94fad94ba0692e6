/* The training data of an image-or-feature model: which source --data names,
 * its test set (its own, --test-data, or --val-split held out), the limits,
 * and the input normalisation (docs/data.md).
 *
 *   --data DIR               IDX files (train-*, t10k-*): Fashion-MNIST's layout, test set included
 *   --data X.npy --labels Y  a NumPy pair, features mapped (src/data/arrays.c)
 *   --data data.npz          its arrays x, y (or --npz-keys), extracted into the cache (npz.c)
 *   --data data.csv          parsed once into two arrays in the cache (csv.c), --label-column
 *   --data DIR (<class>/<image>.png) decoded once into two arrays in the cache (images.c), --image-size
 *
 * The normalisation is per channel (per feature of an (N, D) table: dp_dataset_norm_groups),
 * x' = (x - mean[c]) / std[c]; its values
 * are the run's (t->norm_mean/std), stored in the checkpoint (DPNORMIN) so that
 * a resume and `dptrain eval` use the very same numbers. */
#include <stdarg.h>
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

/* Decides the normalisation (the checkpoint's when resuming, else per p->data.normalize) and
 * applies it to both splits. */
static int normalize(struct dp_trainer *t, int idx) {
    const struct dp_train_params *p = &t->p;
    int64_t C = dp_dataset_norm_groups(&t->train); /* channels, or a table's features */
    int mode = p->data.normalize ? p->data.normalize : idx ? DP_NORM_FIXED : DP_NORM_AUTO;
    t->norm_mean = dp_malloc(sizeof(float) * (size_t)C);
    t->norm_std = dp_malloc(sizeof(float) * (size_t)C);
    double *m = dp_malloc(sizeof(double) * (size_t)C), *sd = dp_malloc(sizeof(double) * (size_t)C);
    int rc = DP_OK, found = 0;
    if (!t->norm_mean || !t->norm_std || !m || !sd) {
        rc = dp_seterr(DP_ENOMEM, "trainer: out of memory");
        goto out;
    }
    if (p->io.resume && (rc = ckpt_norm(p->io.resume, C, t->norm_mean, t->norm_std, &found))) goto out;
    if (!found && p->data.norm_text && (rc = parse_norm(p->data.norm_text, C, t->norm_mean, t->norm_std, "the weights' metadata")))
        goto out;
    found |= p->data.norm_text != NULL;
    /* none: the identity, recorded as such (so that eval and the export apply no other) */
    if (!found && mode == DP_NORM_NONE)
        for (int64_t c = 0; c < C; c++) t->norm_mean[c] = 0, t->norm_std[c] = 1;
    if (!found && mode == DP_NORM_FIXED)
        for (int64_t c = 0; c < C; c++) t->norm_mean[c] = p->data.norm_mean, t->norm_std[c] = p->data.norm_std;
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

/* Where a source's two arrays are: X.npy and its --labels, two members of an .npz (extracted
 * into the cache folder), or a CSV's features and labels (parsed into the cache folder).
 * `test`: the test set's source (--test-data, --test-labels). */
struct pair {
    char x[4096], y[4096];
    char what[4200]; /* the source as the user named it, for messages */
};

/* The keys of an .npz's two arrays: --npz-keys X,Y, or by default x,y, else Keras's layout
 * x_train,y_train (whose x_test,y_test are then the test set: *keras = 1). */
static int npz_keys(const struct dp_train_params *p, const char *npz, char *kx, char *ky, size_t cap, int *keras) {
    *keras = 0;
    const char *k = p->data.npz_keys ? p->data.npz_keys : "x,y", *comma = strchr(k, ',');
    if (!comma || comma == k || !comma[1] || strchr(comma + 1, ',') || (size_t)(comma - k) >= cap ||
        strlen(comma + 1) >= cap)
        return dp_seterr(DP_EINVAL, "--npz-keys %s: expected two array names, X,Y (e.g. x_train,y_train)", k);
    snprintf(kx, cap, "%.*s", (int)(comma - k), k);
    snprintf(ky, cap, "%s", comma + 1);
    if (p->data.npz_keys) return DP_OK;
    char names[16384];
    int rc = dp_npz_keys(npz, names, sizeof names);
    if (rc) return rc;
    /* the list is "a, b, c": ", NAME, " is in ", " + list + ", " when NAME is one of them */
    char all[16400];
    snprintf(all, sizeof all, ", %s, ", names);
    if (!strstr(all, ", x, ") && strstr(all, ", x_train, ") && strstr(all, ", y_train, ")) {
        snprintf(kx, cap, "x_train"), snprintf(ky, cap, "y_train");
        *keras = strstr(all, ", x_test, ") && strstr(all, ", y_test, ");
    }
    return DP_OK;
}

static int npz_pair(const char *npz, const char *kx, const char *ky, struct pair *pr) {
    int rc = dp_npz_extract(npz, kx, NULL, pr->x, sizeof pr->x, NULL);
    if (!rc) rc = dp_npz_extract(npz, ky, NULL, pr->y, sizeof pr->y, NULL);
    snprintf(pr->what, sizeof pr->what, "%s (arrays %s, %s)", npz, kx, ky);
    return rc;
}

/* Appends a sentence to the trainer's note on its data. */
static void note(struct dp_trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(struct dp_trainer *t, const char *fmt, ...) {
    size_t len = strlen(t->data_note);
    if (len && len + 2 < sizeof t->data_note) strcat(t->data_note, "; "), len += 2;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->data_note + len, sizeof t->data_note - len, fmt, ap);
    va_end(ap);
}

/* Whether dir holds Fashion-MNIST's IDX files (else a folder is one of images, a subfolder
 * per class). */
static int is_idx_dir(const char *dir) {
    static const char *const names[] = {"train-images-idx3-ubyte", "train-images-idx3-ubyte.gz"};
    char path[4200];
    struct stat st;
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (stat(path, &st) == 0) return 1;
    }
    return 0;
}

/* A resumed run's classes must be its checkpoint's (the same names in the same order). */
static int same_classes(const struct dp_trainer *t) {
    void *data;
    uint64_t size;
    int rc = dp_ckpt_read_section(t->p.io.resume, DP_CKPT_CLASSES_TAG, &data, &size);
    if (rc || !data) return rc;
    ((char *)data)[size] = 0;
    if (strcmp(data, t->class_names))
        rc = dp_seterr(DP_EMISMATCH, "%s was trained on other classes than --data %s has (its class folders differ)",
                       t->p.io.resume, t->p.data.data_dir);
    dp_free(data);
    return rc;
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* An image folder: decoded once into the cache (src/data/images.c); its class names must be
 * those of the training folder's (a test set) or become the run's. */
static int image_pair(struct dp_trainer *t, int test, const char *dir, struct pair *pr) {
    const struct dp_train_params *p = &t->p;
    struct dp_images_opts o = dp_images_default_opts();
    o.channels = test ? (int)t->train.C : p->data.image_channels;
    o.height = test ? t->train.H : p->data.image_h, o.width = test ? t->train.W : p->data.image_w;
    o.skip_bad = p->data.skip_bad_images;
    struct dp_images_info info;
    int rc = dp_images_prepare(dir, &o, &info);
    char *names = NULL;
    if (rc || (rc = dp_images_class_names(&info, &names))) return rc;
    if (test && strcmp(names, t->class_names ? t->class_names : "")) {
        rc = dp_seterr(DP_EMISMATCH, "--test-data %s: its classes (subfolders) are not those of --data %s: each "
                       "folder needs the same class subfolders", dir, p->data.data_dir);
        dp_free(names);
        return rc;
    }
    if (test) dp_free(names);
    else t->class_names = names;
    note(t, "%s: %lld images in %lld classes, %lld x %lld x %lld (%s)", dir, (long long)info.images,
         (long long)info.classes, (long long)info.channels, (long long)info.height, (long long)info.width,
         info.built ? "decoded now into the cache folder" : "its arrays in the cache folder reused");
    if (info.skipped)
        note(t, "skipped %lld bad image%s%s%s%s%s", (long long)info.skipped, info.skipped > 1 ? "s" : "",
             info.first_bad[0] ? ", the first " : "", info.first_bad, info.first_bad_error[0] ? ": " : "",
             info.first_bad_error);
    snprintf(pr->x, sizeof pr->x, "%s", info.x_path);
    snprintf(pr->y, sizeof pr->y, "%s", info.y_path);
    return DP_OK;
}

static int resolve(struct dp_trainer *t, int test, struct pair *pr, int *keras) {
    const struct dp_train_params *p = &t->p;
    const char *data = test ? p->data.test_data : p->data.data_dir, *labels = test ? p->data.test_labels : p->data.labels;
    const char *xopt = test ? "--test-data" : "--data", *yopt = test ? "--test-labels" : "--labels";
    *keras = 0;
    snprintf(pr->what, sizeof pr->what, "%s", data);
    if (is_dir(data)) {
        if (labels)
            return dp_seterr(DP_EINVAL, "%s %s: a folder of images holds its labels (a subfolder per class), not "
                             "%s %s", xopt, data, yopt, labels);
        return image_pair(t, test, data, pr);
    }
    if (ends_with(data, ".npz")) {
        if (labels)
            return dp_seterr(DP_EINVAL, "%s %s: an .npz holds its labels (array y, or --npz-keys X,Y), not %s %s",
                             xopt, data, yopt, labels);
        char kx[256], ky[256];
        int rc = npz_keys(p, data, kx, ky, sizeof kx, keras);
        if (!rc && test && *keras) snprintf(kx, sizeof kx, "x_test"), snprintf(ky, sizeof ky, "y_test");
        if (!rc && !(rc = npz_pair(data, kx, ky, pr))) note(t, "%s: arrays %s, %s", data, kx, ky);
        return rc;
    }
    if (ends_with(data, ".csv")) { /* parsed once into two arrays in the cache (src/data/csv.c) */
        if (labels)
            return dp_seterr(DP_EINVAL, "%s %s: a CSV holds its labels (a column: --label-column NAME|INDEX, the "
                             "last by default), not %s %s", xopt, data, yopt, labels);
        struct dp_csv_opts o = dp_csv_default_opts();
        o.header = p->data.csv_header, o.label_column = p->data.label_column, o.regression = t->regression;
        struct dp_csv_info info;
        int rc = dp_csv_prepare(data, &o, &info);
        if (rc) return rc;
        int named = strncmp(info.label_name, "column ", 7) != 0; /* a header's name, else "column K" */
        note(t, "%s: %lld rows, %lld features, labels from %s%s%s (%s)", data, (long long)info.rows,
             (long long)info.features, named ? "column '" : "", info.label_name, named ? "'" : "",
             info.built ? "parsed now into the cache folder" : "its arrays in the cache folder reused");
        snprintf(pr->x, sizeof pr->x, "%s", info.x_path);
        snprintf(pr->y, sizeof pr->y, "%s", info.y_path);
        return DP_OK;
    }
    if (!ends_with(data, ".npy"))
        return dp_seterr(DP_EINVAL, "%s %s: expected an .npy (with %s), an .npz, a .csv or a folder of images",
                         xopt, data, yopt);
    if (!labels)
        return dp_seterr(DP_EINVAL, "%s %s needs its labels: %s y.npy (the class of each sample, shape (N,))", xopt,
                         data, yopt);
    if (!ends_with(labels, ".npy"))
        return dp_seterr(DP_EINVAL, "%s %s: labels are read from an .npy file", yopt, labels);
    snprintf(pr->x, sizeof pr->x, "%s", data);
    snprintf(pr->y, sizeof pr->y, "%s", labels);
    return DP_OK;
}

/* Opens a source's pair; an error in an array the cache holds names the source first. */
static int open_pair(struct dp_dataset *ds, const struct pair *pr, const struct dp_data_opts *o) {
    int rc = dp_dataset_open_npy(ds, pr->x, pr->y, o);
    if (rc && strcmp(pr->what, pr->x)) return dp_adderr(rc, "%s", pr->what);
    return rc;
}

static int same_shape(const struct dp_trainer *t, const char *what) {
    if (t->test.C == t->train.C && t->test.H == t->train.H && t->test.W == t->train.W) return DP_OK;
    return dp_seterr(DP_EMISMATCH, "the test set %s: its samples are %lld x %lld x %lld, %s%s's %lld x "
                     "%lld x %lld (C x H x W)", what, (long long)t->test.C, (long long)t->test.H,
                     (long long)t->test.W, t->p.data.train_x.data ? "" : "--data ", t->p.data.train_x.data ? "X" : t->p.data.data_dir,
                     (long long)t->train.C, (long long)t->train.H,
                     (long long)t->train.W);
}

/* Every source but Fashion-MNIST's IDX folder: arrays, a CSV, or a folder of images. */
static int is_arrays(const char *data) {
    return ends_with(data, ".npy") || ends_with(data, ".npz") || ends_with(data, ".csv") ||
           (is_dir(data) && !is_idx_dir(data));
}

int dp__data_load(struct dp_trainer *t) {
    const struct dp_train_params *p = &t->p;
    const int mem = p->data.train_x.data != NULL; /* arrays in memory (dp_train_params.data.train_x) */
    const char *data = mem ? "X" : p->data.data_dir ? p->data.data_dir : "";
    int arrays = mem || is_arrays(data), rc, keras = 0;
    struct dp_data_opts o = {.nhwc = p->data.layout_nhwc, .regression = t->regression};
    if (!arrays && t->regression)
        return dp_seterr(DP_EINVAL, "a regression (--loss mse) needs float targets: --data X.npy --labels y.npy "
                         "or a CSV (an IDX folder holds classes)");
    if (!arrays) {
        /* IDX: the folder holds its test split */
        const char *own = p->data.labels ? "--labels" : p->data.test_data ? "--test-data" : p->data.test_labels ? "--test-labels"
                        : p->data.val_split > 0 ? "--val-split" : p->data.layout_nhwc ? "--layout nhwc"
                        : p->data.npz_keys ? "--npz-keys" : p->data.label_column ? "--label-column"
                        : p->data.csv_header != -1 ? "--csv-header" : p->data.image_h ? "--image-size"
                        : p->data.skip_bad_images ? "--skip-bad-images" : p->data.image_channels ? "--image-channels" : NULL;
        struct stat st;
        if (own && stat(data, &st) == 0 && S_ISDIR(st.st_mode))
            return dp_seterr(DP_EINVAL, "%s does not apply to --data %s, a folder of IDX files (it holds its "
                             "labels and its test split); it goes with --data X.npy", own, data);
        if ((rc = dp_dataset_load_dir_first(&t->train, &t->test, data, p->data.train_limit > 0 ? p->data.train_limit : 0,
                                            p->data.test_limit > 0 ? p->data.test_limit : 0)))
            return rc;
        return normalize(t, 1);
    }
    struct pair pr;
    if (mem) {
        if (p->data.labels || p->data.test_data || p->data.test_labels || p->data.npz_keys || p->data.label_column)
            return dp_seterr(DP_EINVAL, "%s does not apply to arrays in memory (it names a file's part)",
                             p->data.labels ? "--labels" : p->data.test_data ? "--test-data" : p->data.test_labels ? "--test-labels"
                             : p->data.npz_keys ? "--npz-keys" : "--label-column");
        if ((rc = dp_dataset_open_arrays(&t->train, &p->data.train_x, &p->data.train_y, "X", "y", &o))) return rc;
        if (p->data.test_x.data && p->data.val_split > 0)
            return dp_seterr(DP_EINVAL, "test arrays and --val-split: give one (the test set, or the fraction of "
                             "the training arrays to hold out)");
        if (p->data.test_x.data && ((rc = dp_dataset_open_arrays(&t->test, &p->data.test_x, &p->data.test_y, "the test X",
                                                            "the test y", &o)) ||
                               (rc = same_shape(t, "(arrays)"))))
            return rc;
    } else if ((rc = resolve(t, 0, &pr, &keras)) || (rc = open_pair(&t->train, &pr, &o))) {
        return rc;
    }
    if (p->io.resume && t->class_names && (rc = same_classes(t))) return rc;
    if (p->data.test_labels && !p->data.test_data)
        return dp_seterr(DP_EINVAL, "--test-labels %s without --test-data X.npy", p->data.test_labels);
    if (p->data.test_data && p->data.val_split > 0)
        return dp_seterr(DP_EINVAL, "--test-data and --val-split: give one (the test set, or the fraction of "
                         "--data to hold out)");
    if (mem) {
        if (p->data.val_split > 0 && (rc = dp_dataset_split(&t->train, &t->test, p->data.val_split, p->run.seed))) return rc;
    } else if (p->data.test_data) {
        if ((rc = resolve(t, 1, &pr, &keras)) || (rc = open_pair(&t->test, &pr, &o)) || (rc = same_shape(t, pr.what)))
            return rc;
    } else if (keras && p->data.val_split <= 0) { /* Keras's layout: its own test arrays */
        note(t, "its x_test, y_test are the test set");
        if ((rc = npz_pair(data, "x_test", "y_test", &pr)) || (rc = open_pair(&t->test, &pr, &o)) ||
            (rc = same_shape(t, pr.what)))
            return rc;
    } else if (p->data.val_split > 0 && (rc = dp_dataset_split(&t->train, &t->test, p->data.val_split, p->run.seed))) {
        return rc;
    }
    dp_dataset_limit(&t->train, p->data.train_limit);
    /* a regression's targets per sample must agree; classes are those either split names */
    if (t->regression && t->test.n && t->test.num_classes != t->train.num_classes)
        return dp_seterr(DP_EMISMATCH, "the test set has %lld target%s per sample, --data %s has %lld",
                         (long long)t->test.num_classes, t->test.num_classes > 1 ? "s" : "", data,
                         (long long)t->train.num_classes);
    if (t->test.num_classes > t->train.num_classes) t->train.num_classes = t->test.num_classes;
    return normalize(t, 0);
}
