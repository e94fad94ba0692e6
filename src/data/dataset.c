/* Classification datasets from IDX files: images (n, H, W) uint8 and labels
 * (n) uint8, converted to floats in [0, 1] and int32 labels.
 *
 * Fashion-MNIST and MNIST ship as four files in one directory:
 *
 *     train-images-idx3-ubyte[.gz]  (60000, 28, 28)
 *     train-labels-idx1-ubyte[.gz]  (60000)
 *     t10k-images-idx3-ubyte[.gz]   (10000, 28, 28)
 *     t10k-labels-idx1-ubyte[.gz]   (10000)
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "dp/data.h"

/* ---- one dataset from two files ------------------------------------------- */

/* Loads images (n, H, W) and labels (n) into ds, which is overwritten (it is
 * not freed first).  Pixels become x = byte / 255 with C = 1; labels are the
 * bytes as int32 and num_classes = max label + 1.  Errors: those of
 * dp_idx_read, DP_EFORMAT if the images are not 3-D or the labels not 1-D,
 * DP_EMISMATCH if the counts differ; ds is left zeroed on failure.  On
 * success the caller releases ds with dp_dataset_free.  first > 0 keeps the
 * first `first` samples and reads no image past them (the labels are read
 * whole: the count check and num_classes stay those of the files). */
static int load_idx_first(struct dp_dataset *ds, const char *images_path, const char *labels_path,
                          int64_t first) {
    memset(ds, 0, sizeof *ds);
    uint8_t *img = NULL, *lab = NULL;
    int ind = 0, lnd = 0;
    int64_t idims[4], ldims[4];
    int rc = dp_idx_read_first(images_path, first, &img, &ind, idims);
    if (rc) goto fail;
    rc = dp_idx_read(labels_path, &lab, &lnd, ldims);
    if (rc) goto fail;
    if (ind != 3) {
        rc = dp_seterr(DP_EFORMAT, "dataset: %s: images must have 3 dimensions (n, H, W), got %d",
                       images_path, ind);
        goto fail;
    }
    if (lnd != 1) {
        rc = dp_seterr(DP_EFORMAT, "dataset: %s: labels must have 1 dimension (n), got %d",
                       labels_path, lnd);
        goto fail;
    }
    if (idims[0] != ldims[0]) {
        rc = dp_seterr(DP_EMISMATCH, "dataset: sample count mismatch: %s has %lld images, %s has %lld labels",
                       images_path, (long long)idims[0], labels_path, (long long)ldims[0]);
        goto fail;
    }
    int64_t n = first > 0 && first < idims[0] ? first : idims[0], H = idims[1], W = idims[2];
    /* n*H*W <= 2^33 (dp_idx_read's limit), so the float buffer fits size_t. */
    size_t count = (size_t)(n * H * W);
    /* The float images are the largest buffer of a run and are read every
     * epoch: take huge pages and fault them in once, here. */
    ds->x = dp_malloc_big(count * sizeof(float));
    ds->y = dp_malloc((size_t)n * sizeof(int32_t));
    if (!ds->x || !ds->y) {
        rc = dp_seterr(DP_ENOMEM, "dataset: %s: cannot allocate %zu floats", images_path, count);
        goto fail;
    }
    const float scale = 1.0f / 255.0f;
    for (size_t i = 0; i < count; i++) ds->x[i] = (float)img[i] * scale;
    int32_t maxy = 0;
    for (int64_t i = 0; i < ldims[0]; i++) /* every label: the classes of the whole file */
        if (lab[i] > maxy) maxy = lab[i];
    for (int64_t i = 0; i < n; i++) ds->y[i] = lab[i]; /* uint8, hence always < 256 */
    ds->n = n;
    ds->C = 1;
    ds->H = H;
    ds->W = W;
    ds->num_classes = maxy + 1;
    dp_free(img);
    dp_free(lab);
    return 0;

fail:
    dp_free(img);
    dp_free(lab);
    dp_dataset_free(ds);
    return rc;
}

int dp_dataset_load_idx(struct dp_dataset *ds, const char *images_path, const char *labels_path) {
    return load_idx_first(ds, images_path, labels_path, 0);
}

/* ---- the standard four-file directory ------------------------------------- */

static const char *const dir_files[4] = {
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
};

/* Finds dir/base or dir/base.gz (the plain file wins if both exist) and
 * writes its path to out.  Returns 1 if found. */
static int find_file(char *out, size_t outsz, const char *dir, const char *base) {
    struct stat st;
    snprintf(out, outsz, "%s/%s", dir, base);
    if (stat(out, &st) == 0 && !S_ISDIR(st.st_mode)) return 1;
    snprintf(out, outsz, "%s/%s.gz", dir, base);
    if (stat(out, &st) == 0 && !S_ISDIR(st.st_mode)) return 1;
    return 0;
}

/* dir must be a folder.  A missing path or a file is the usual slip of a
 * user (a typo, a token file meant for a gpt model, one of the IDX files
 * instead of their folder); said as such, with what is expected, rather than
 * "missing train-images-idx3-ubyte" (which reads as if the folder existed). */
static int check_dir(const char *dir) {
    struct stat st;
    if (!dir) return dp_seterr(DP_EINVAL, "dataset: NULL folder");
    if (stat(dir, &st) != 0) {
        if (errno == ENOENT) return dp_seterr(DP_ENOENT, "dataset: %s: no such file or folder", dir);
        return dp_seterr(DP_EIO, "dataset: %s: %s", dir, strerror(errno));
    }
    if (S_ISDIR(st.st_mode)) return DP_OK;
    const char *base = strrchr(dir, '/');
    base = base ? base + 1 : dir;
    const char *hint = "";
    for (int i = 0; i < 4; i++)
        if (!strncmp(base, dir_files[i], strlen(dir_files[i]))) hint = " (that is one of them: give its folder)";
    return dp_seterr(DP_EINVAL,
                     "dataset: %s is not a folder: an image model (mlp, cnn, resnet) reads a folder holding "
                     "the IDX files %s, %s, %s and %s (each plain or .gz), as Fashion-MNIST ships%s",
                     dir, dir_files[0], dir_files[1], dir_files[2], dir_files[3], hint);
}

/* Loads the train and test splits from dir (see the list at the top; each
 * file plain or .gz).  test may be NULL to load only the training split.
 * Errors: DP_ENOENT for a missing dir, DP_EINVAL for a dir that is not a
 * folder, DP_ENOENT naming every missing file, or the errors of
 * dp_dataset_load_idx.  On failure both datasets are left zeroed. */
int dp_dataset_load_dir(struct dp_dataset *train, struct dp_dataset *test, const char *dir) {
    return dp_dataset_load_dir_first(train, test, dir, 0, 0);
}

int dp_dataset_load_dir_first(struct dp_dataset *train, struct dp_dataset *test, const char *dir,
                              int64_t max_train, int64_t max_test) {
    memset(train, 0, sizeof *train);
    if (test) memset(test, 0, sizeof *test);
    int rc = check_dir(dir);
    if (rc) return rc;
    char paths[4][4096];
    char missing[512] = "";
    int nfiles = test ? 4 : 2;
    for (int i = 0; i < nfiles; i++) {
        if (find_file(paths[i], sizeof paths[i], dir, dir_files[i])) continue;
        size_t used = strlen(missing);
        snprintf(missing + used, sizeof missing - used, "%s%s[.gz]", used ? ", " : "",
                 dir_files[i]);
    }
    if (missing[0])
        return dp_seterr(DP_ENOENT, "dataset: %s: missing %s", dir, missing);
    rc = load_idx_first(train, paths[0], paths[1], max_train);
    if (rc) return rc;
    if (test) {
        rc = load_idx_first(test, paths[2], paths[3], max_test);
        if (rc) {
            dp_dataset_free(train);
            return rc;
        }
        /* The splits must describe the same kind of sample. */
        if (test->H != train->H || test->W != train->W) {
            rc = dp_seterr(DP_EMISMATCH, "dataset: %s: train images are %lldx%lld, test %lldx%lld",
                           dir, (long long)train->H, (long long)train->W, (long long)test->H,
                           (long long)test->W);
            dp_dataset_free(train);
            dp_dataset_free(test);
            return rc;
        }
    }
    return 0;
}

/* ---- normalisation and release --------------------------------------------- */

/* x = (x - mean) / std over every element.  std must not be 0. */
void dp_dataset_normalize(struct dp_dataset *ds, float mean, float std) {
    DP_ASSERT(std != 0.0f);
    if (!ds || !ds->x) return;
    size_t count = (size_t)(ds->n * ds->C * ds->H * ds->W);
    const float inv = 1.0f / std;
    for (size_t i = 0; i < count; i++) ds->x[i] = (ds->x[i] - mean) * inv;
}
