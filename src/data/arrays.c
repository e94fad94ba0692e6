/* Datasets whose samples stay in a memory-mapped NumPy array: `--data X.npy
 * --labels y.npy` (and CSV, which becomes such a pair in the cache).
 *
 * The features are never copied whole.  Sample i is converted when the loader
 * (or evaluation) reads it, from the mapping, straight into the batch:
 *
 *     r        = rows ? rows[i] : i           (a split keeps a list of rows)
 *     element  = the array's row r, element e (C order)
 *     (C, H, W): NCHW as stored, or from NHWC: dst[c][h][w] = src[h][w][c]
 *     dst      = (float(element) - mean[g]) * inv_std[g]     (per channel, or per
 *                                                           feature of an (N, D) array)
 *
 * so a file larger than memory trains: the kernel pages the rows in as
 * batches read them, and drops them again under pressure (clean pages of a
 * file).  The labels are small and read into memory once. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "dp/core.h"
#include "dp/data.h"

/* The mapping, shared by the splits made of one array (a val split reads the
 * same file): freed with its last user. */
struct npy_ref {
    struct dp_npy a;
    int refs;
};

struct dp_dataset_src {
    struct npy_ref *arr;
    int64_t *rows;       /* (n) the array's row of each sample, or NULL: row i */
    int nhwc;            /* stored (N, H, W, C) */
    float *mean, *inv;   /* (dp_dataset_norm_groups) normalisation applied as read; NULL: none */
};

static void src_free(struct dp_dataset_src *s) {
    if (!s) return;
    if (s->arr && --s->arr->refs == 0) {
        dp_npy_close(&s->arr->a);
        dp_free(s->arr);
    }
    dp_free(s->rows);
    dp_free(s->mean);
    dp_free(s->inv);
    dp_free(s);
}

/* How the mapping will be read: in order (the statistics' pass: read ahead) or in a shuffled
 * order (training: read only the pages asked for; the kernel's read-ahead around each fault
 * would otherwise read many rows for one, and under memory pressure evict the rows it needs). */
static void advise(const struct dp_dataset *ds, int sequential) {
    const struct dp_npy *a = ds->src ? &ds->src->arr->a : NULL;
    if (a && a->map) (void)madvise(a->map, a->map_len, sequential ? MADV_SEQUENTIAL : MADV_RANDOM);
}

/* ---- reading a sample ------------------------------------------------------------------- */

/* Element k of a row, as a float, for one dtype: the switch sits outside the loop. */
/* (memcpy: a file's data need not be aligned for T; compilers make it a plain load) */
#define CONVERT(T, EXPR)                                                                       \
    do {                                                                                       \
        for (int64_t k = 0; k < per; k++) {                                                    \
            T q;                                                                               \
            memcpy(&q, row + (size_t)k * sizeof(T), sizeof(T));                                \
            v[k] = (float)(EXPR);                                                              \
        }                                                                                      \
    } while (0)

static void row_to_float(const struct dp_npy *a, const uint8_t *row, int64_t per, float *v) {
    switch (a->dtype) {
    case DP_NPY_F32: memcpy(v, row, (size_t)per * sizeof(float)); break;
    case DP_NPY_F64: CONVERT(double, q); break;
    case DP_NPY_U8: CONVERT(uint8_t, q); break;
    case DP_NPY_I8: CONVERT(int8_t, q); break;
    case DP_NPY_I16: CONVERT(int16_t, q); break;
    case DP_NPY_I32: CONVERT(int32_t, q); break;
    case DP_NPY_I64: CONVERT(int64_t, q); break;
    case DP_NPY_BOOL: CONVERT(uint8_t, q != 0); break;
    }
}

/* Sample i of ds as C*H*W floats (C, H, W order), normalised, into dst. */
void dp_dataset_read(const struct dp_dataset *ds, int64_t i, float *dst) {
    const int64_t per = ds->C * ds->H * ds->W, HW = ds->H * ds->W, C = ds->C;
    const struct dp_dataset_src *s = ds->src;
    if (!s) {
        memcpy(dst, ds->x + i * per, (size_t)per * sizeof(float));
        return;
    }
    const struct dp_npy *a = &s->arr->a;
    int64_t r = s->rows ? s->rows[i] : i;
    const uint8_t *row = (const uint8_t *)a->data + (size_t)(r * per) * a->item;
    if (s->nhwc && C > 1) {
        /* convert in place at the end of dst's range would alias; go element by element */
        for (int64_t p = 0; p < HW; p++)
            for (int64_t c = 0; c < C; c++) {
                float v = (float)dp_npy_get(a, r * per + p * C + c);
                dst[c * HW + p] = s->mean ? (v - s->mean[c]) * s->inv[c] : v;
            }
        return;
    }
    row_to_float(a, row, per, dst);
    if (s->mean) {
        const int64_t G = dp_dataset_norm_groups(ds), gs = per / G;
        for (int64_t g = 0; g < G; g++) {
            const float m = s->mean[g], k = s->inv[g];
            float *d = dst + g * gs;
            for (int64_t p = 0; p < gs; p++) d[p] = (d[p] - m) * k;
        }
    }
}

/* Channels of an image, features of a (N, D) array (C = H = 1): each group is a contiguous
 * run of per / G values of a sample. */
int64_t dp_dataset_norm_groups(const struct dp_dataset *ds) { return ds->C == 1 && ds->H == 1 ? ds->W : ds->C; }

/* ---- opening --------------------------------------------------------------------------- */

/* Labels from a (N) or (N, 1) integer array (classes), or, with regression, a (N) or (N, K)
 * array of any dtype (targets). */
static int read_labels(struct dp_dataset *ds, const struct dp_npy *y, const char *ypath, int regression) {
    int64_t n = y->ndim ? y->shape[0] : 0, K = y->ndim == 2 ? y->shape[1] : 1;
    if (y->ndim < 1 || y->ndim > 2 || K < 1)
        return dp_seterr(DP_EFORMAT, "%s: labels must be an array of shape (N,)%s, got %d dimensions", ypath,
                         regression ? " or (N, K)" : " or (N, 1)", y->ndim);
    if (!regression && K != 1)
        return dp_seterr(DP_EFORMAT, "%s: class labels must have shape (N,) or (N, 1), got (%lld, %lld) "
                         "(several targets per sample: --loss mse)", ypath, (long long)n, (long long)K);
    if (regression) {
        if (!(ds->target = dp_malloc(sizeof(float) * (size_t)(n * K) + 1)))
            return dp_seterr(DP_ENOMEM, "%s: out of memory", ypath);
        for (int64_t i = 0; i < n * K; i++) {
            double v = dp_npy_get(y, i);
            if (!isfinite(v))
                return dp_seterr(DP_EINVAL, "%s: target %lld is %g: targets must be finite", ypath, (long long)i, v);
            ds->target[i] = (float)v;
        }
        ds->num_classes = K;
        return DP_OK;
    }
    if (y->dtype == DP_NPY_F32 || y->dtype == DP_NPY_F64)
        return dp_seterr(DP_EFORMAT, "%s: labels are %s: classes are integers (int8..int64, uint8, bool); "
                         "float targets are a regression (--loss mse)", ypath, dp_npy_dtype_name(y->dtype));
    if (!(ds->y = dp_malloc(sizeof(int32_t) * (size_t)n + 1))) return dp_seterr(DP_ENOMEM, "%s: out of memory", ypath);
    double maxy = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = dp_npy_get(y, i);
        if (v < 0 || v >= DP_DATASET_MAX_CLASSES)
            return dp_seterr(DP_EINVAL, "%s: label %lld is %.0f: classes are 0 .. %d", ypath, (long long)i, v,
                             DP_DATASET_MAX_CLASSES - 1);
        ds->y[i] = (int32_t)v;
        if (v > maxy) maxy = v;
    }
    ds->num_classes = (int64_t)maxy + 1;
    return DP_OK;
}

/* The per-sample shape of an array of ndim dimensions (after N). */
static int sample_shape(struct dp_dataset *ds, const struct dp_npy *a, const char *xpath, int nhwc) {
    const int64_t *d = a->shape + 1;
    switch (a->ndim) {
    case 2: ds->C = 1, ds->H = 1, ds->W = d[0]; break;            /* (N, D) */
    case 3: ds->C = 1, ds->H = d[0], ds->W = d[1]; break;         /* (N, H, W) */
    case 4:
        if (nhwc) ds->H = d[0], ds->W = d[1], ds->C = d[2];       /* (N, H, W, C) */
        else ds->C = d[0], ds->H = d[1], ds->W = d[2];            /* (N, C, H, W) */
        break;
    default:
        return dp_seterr(DP_EFORMAT, "%s: features must have shape (N, D), (N, H, W) or (N, C, H, W) "
                         "((N, H, W, C) with --layout nhwc), got %d dimensions", xpath, a->ndim);
    }
    if (nhwc && a->ndim != 4)
        return dp_seterr(DP_EINVAL, "%s: --layout nhwc needs a 4-dimensional array (N, H, W, C), got %d "
                         "dimensions", xpath, a->ndim);
    if (a->shape[0] < 1 || ds->C < 1 || ds->H < 1 || ds->W < 1)
        return dp_seterr(DP_EFORMAT, "%s: an empty array (a dimension is 0)", xpath);
    return DP_OK;
}

/* ds over the features ref->a (ds takes ref) and the labels y (y NULL: every label 0), named
 * xname and yname in messages. */
static int open_pair(struct dp_dataset *ds, struct npy_ref *ref, const struct dp_npy *y, const char *xname,
                     const char *yname, const struct dp_data_opts *o) {
    struct dp_dataset_src *s = dp_calloc(1, sizeof *s);
    if (!s) {
        dp_npy_close(&ref->a), dp_free(ref);
        return dp_seterr(DP_ENOMEM, "dataset: out of memory");
    }
    ref->refs = 1, s->arr = ref, s->nhwc = o && o->nhwc;
    ds->src = s;
    int rc = sample_shape(ds, &ref->a, xname, s->nhwc);
    if (rc) goto fail;
    ds->n = ref->a.shape[0];
    advise(ds, 0);
    if (!y) { /* no labels: class 0 for every sample */
        if (!(ds->y = dp_calloc((size_t)ds->n + 1, sizeof(int32_t)))) {
            rc = dp_seterr(DP_ENOMEM, "dataset: out of memory");
            goto fail;
        }
        ds->num_classes = 1;
        return DP_OK;
    }
    if ((rc = read_labels(ds, y, yname, o && o->regression))) goto fail;
    int64_t ny = y->ndim ? y->shape[0] : 0;
    if (ny != ds->n) {
        rc = dp_seterr(DP_EMISMATCH, "dataset: %s holds %lld samples, %s %lld labels", xname, (long long)ds->n,
                       yname, (long long)ny);
        goto fail;
    }
    return DP_OK;
fail:
    dp_dataset_free(ds);
    return rc;
}

int dp_dataset_open_npy(struct dp_dataset *ds, const char *xpath, const char *ypath,
                        const struct dp_data_opts *o) {
    memset(ds, 0, sizeof *ds);
    struct dp_npy y;
    struct npy_ref *ref = dp_calloc(1, sizeof *ref);
    if (!ref) return dp_seterr(DP_ENOMEM, "dataset: out of memory");
    int rc = dp_npy_open(xpath, &ref->a);
    if (rc) {
        dp_free(ref);
        return rc;
    }
    if ((rc = dp_npy_open(ypath, &y))) {
        dp_npy_close(&ref->a), dp_free(ref);
        return rc;
    }
    rc = open_pair(ds, ref, &y, xpath, ypath, o);
    dp_npy_close(&y);
    return rc;
}

/* A caller's array as an unmapped struct dp_npy (nothing to close), checked as a header is. */
static int from_memory(struct dp_npy *a, const struct dp_array *m, const char *what) {
    static const size_t item[] = {4, 8, 1, 1, 2, 4, 8, 1}; /* enum dp_npy_dtype's sizes */
    memset(a, 0, sizeof *a);
    if (!m || !m->data) return dp_seterr(DP_EINVAL, "%s: no array given", what);
    if (m->dtype < 0 || m->dtype > DP_NPY_BOOL)
        return dp_seterr(DP_EINVAL, "%s: dtype code %d is none of float32, float64, uint8, int8, int16, int32, "
                         "int64, bool", what, m->dtype);
    if (m->ndim < 1 || m->ndim > DP_NPY_MAX_DIMS)
        return dp_seterr(DP_EINVAL, "%s: %d dimensions (1 .. %d)", what, m->ndim, DP_NPY_MAX_DIMS);
    a->dtype = (enum dp_npy_dtype)m->dtype, a->item = item[m->dtype], a->ndim = m->ndim, a->count = 1;
    for (int d = 0; d < m->ndim; d++) {
        if (m->shape[d] < 0 || (m->shape[d] && a->count > INT64_MAX / 16 / m->shape[d]))
            return dp_seterr(DP_EINVAL, "%s: dimension %d is %lld", what, d, (long long)m->shape[d]);
        a->shape[d] = m->shape[d], a->count *= m->shape[d];
    }
    a->data = m->data;
    return DP_OK;
}

int dp_dataset_open_arrays(struct dp_dataset *ds, const struct dp_array *x, const struct dp_array *y,
                           const char *xname, const char *yname, const struct dp_data_opts *o) {
    memset(ds, 0, sizeof *ds);
    xname = xname ? xname : "X", yname = yname ? yname : "y";
    struct dp_npy ya;
    int has_y = y && y->data;
    struct npy_ref *ref = dp_calloc(1, sizeof *ref);
    if (!ref) return dp_seterr(DP_ENOMEM, "dataset: out of memory");
    int rc = from_memory(&ref->a, x, xname);
    if (!rc && has_y) rc = from_memory(&ya, y, yname);
    if (rc) {
        dp_free(ref);
        return rc;
    }
    /* a shape or dtype the caller chose is an invalid argument, not a file's bad format */
    rc = open_pair(ds, ref, has_y ? &ya : NULL, xname, yname, o);
    return rc == DP_EFORMAT || rc == DP_EMISMATCH ? DP_EINVAL : rc;
}

/* ---- subsets: a split, a limit ------------------------------------------------------------ */

/* Keeps the samples rows[0..n) of ds, in that order, in out (labels copied, features by row
 * for a mapped source, copied for an in-memory one). */
static int take_rows(struct dp_dataset *out, const struct dp_dataset *ds, const int64_t *rows, int64_t n) {
    memset(out, 0, sizeof *out);
    out->n = n, out->C = ds->C, out->H = ds->H, out->W = ds->W, out->num_classes = ds->num_classes;
    const int64_t per = ds->C * ds->H * ds->W, K = ds->num_classes;
    int rc = DP_OK;
    if (ds->y && !(out->y = dp_malloc(sizeof(int32_t) * (size_t)n + 1))) rc = DP_ENOMEM;
    if (ds->target && !(out->target = dp_malloc(sizeof(float) * (size_t)(n * K) + 1))) rc = DP_ENOMEM;
    if (ds->src) {
        struct dp_dataset_src *s = dp_calloc(1, sizeof *s);
        if (!s || !(s->rows = dp_malloc(sizeof(int64_t) * (size_t)n + 1))) {
            dp_free(s);
            rc = DP_ENOMEM;
        } else {
            s->arr = ds->src->arr, s->arr->refs++, s->nhwc = ds->src->nhwc;
            for (int64_t i = 0; i < n; i++) s->rows[i] = ds->src->rows ? ds->src->rows[rows[i]] : rows[i];
            out->src = s;
        }
    } else if (!(out->x = dp_malloc_big(sizeof(float) * (size_t)(n * per) + 1))) {
        rc = DP_ENOMEM;
    }
    if (rc) {
        dp_dataset_free(out);
        return dp_seterr(DP_ENOMEM, "dataset: out of memory");
    }
    for (int64_t i = 0; i < n; i++) {
        if (out->y) out->y[i] = ds->y[rows[i]];
        if (out->target) memcpy(out->target + i * K, ds->target + rows[i] * K, sizeof(float) * (size_t)K);
        if (out->x) memcpy(out->x + i * per, ds->x + rows[i] * per, sizeof(float) * (size_t)per);
    }
    return DP_OK;
}

/* The held-out rows: a permutation keyed by (seed, DP_RNG_VALSPLIT); its first
 * floor(n * frac) entries validate, the rest train, each part in the order of the source. */
int dp_dataset_split(struct dp_dataset *ds, struct dp_dataset *val, double frac, uint64_t seed) {
    memset(val, 0, sizeof *val);
    if (!(frac > 0 && frac < 1)) return dp_seterr(DP_EINVAL, "--val-split %g: a fraction in (0, 1)", frac);
    if (ds->src && ds->src->mean) return dp_seterr(DP_EINVAL, "dataset: split before normalising");
    int64_t n = ds->n, nv = (int64_t)floor((double)n * frac);
    if (nv < 1 || nv >= n)
        return dp_seterr(DP_EINVAL, "--val-split %g of %lld samples leaves %s", frac, (long long)n,
                         nv < 1 ? "no validation sample" : "no training sample");
    int64_t *perm = dp_malloc(sizeof(int64_t) * (size_t)n);
    char *held = dp_calloc((size_t)n, 1);
    int64_t *tr = dp_malloc(sizeof(int64_t) * (size_t)n), *va = dp_malloc(sizeof(int64_t) * (size_t)n);
    int rc = DP_OK;
    if (!perm || !held || !tr || !va) {
        rc = dp_seterr(DP_ENOMEM, "dataset: out of memory");
        goto out;
    }
    dp_rng_permutation(seed, DP_RNG_VALSPLIT, 0, perm, n);
    for (int64_t i = 0; i < nv; i++) held[perm[i]] = 1;
    int64_t a = 0, b = 0;
    for (int64_t i = 0; i < n; i++) {
        if (held[i]) va[b++] = i;
        else tr[a++] = i;
    }
    struct dp_dataset train;
    if ((rc = take_rows(val, ds, va, b))) goto out;
    if ((rc = take_rows(&train, ds, tr, a))) {
        dp_dataset_free(val);
        goto out;
    }
    dp_dataset_free(ds);
    *ds = train;
out:
    dp_free(perm), dp_free(held), dp_free(tr), dp_free(va);
    return rc;
}

/* Keeps the first n samples. */
int dp_dataset_limit(struct dp_dataset *ds, int64_t n) {
    if (n > 0 && n < ds->n) ds->n = n; /* the samples past n are never read */
    return DP_OK;
}

/* ---- normalisation ----------------------------------------------------------------------- */

/* Each group's mean and standard deviation (groups: dp_dataset_norm_groups, the channels of
 * an image or the features of a table) over every sample of ds as read, in one pass in
 * sample order (so the same bits on every rank): mean[g] = S1 / m, std[g] = sqrt(S2 / m -
 * mean^2), S1 and S2 summed in double over the m = n * (values per group) values.  A group
 * that never varies gets std 1 (as scikit-learn's StandardScaler does), so it maps to 0. */
int dp_dataset_channel_stats(const struct dp_dataset *ds, double *mean, double *std) {
    const int64_t per = ds->C * ds->H * ds->W, G = dp_dataset_norm_groups(ds), gs = per / G;
    float *buf = dp_malloc(sizeof(float) * (size_t)per);
    double *s1 = dp_calloc((size_t)G, sizeof(double)), *s2 = dp_calloc((size_t)G, sizeof(double));
    if (!buf || !s1 || !s2) {
        dp_free(buf), dp_free(s1), dp_free(s2);
        return dp_seterr(DP_ENOMEM, "dataset: out of memory");
    }
    advise(ds, 1);
    for (int64_t i = 0; i < ds->n; i++) {
        dp_dataset_read(ds, i, buf);
        for (int64_t g = 0; g < G; g++)
            for (int64_t p = 0; p < gs; p++) {
                double v = buf[g * gs + p];
                s1[g] += v, s2[g] += v * v;
            }
    }
    advise(ds, 0);
    double m = (double)ds->n * (double)gs;
    for (int64_t g = 0; g < G; g++) {
        mean[g] = m > 0 ? s1[g] / m : 0;
        double var = m > 0 ? s2[g] / m - mean[g] * mean[g] : 0;
        std[g] = var > 1e-12 * (1 + mean[g] * mean[g]) ? sqrt(var) : 1.0;
    }
    dp_free(buf), dp_free(s1), dp_free(s2);
    return DP_OK;
}

/* x = (x - mean[g]) / std[g] per group: in place for samples in memory, as read for a mapped
 * source. */
int dp_dataset_normalize_channels(struct dp_dataset *ds, const float *mean, const float *std) {
    const int64_t per = ds->C * ds->H * ds->W, G = dp_dataset_norm_groups(ds), gs = per / G;
    for (int64_t g = 0; g < G; g++)
        if (!(std[g] > 0) || !isfinite(std[g]) || !isfinite(mean[g]))
            return dp_seterr(DP_EINVAL, "normalisation of %s %lld: mean %g, std %g (std must be > 0)",
                             G == ds->C ? "channel" : "feature", (long long)g, (double)mean[g], (double)std[g]);
    if (!ds->src) {
        for (int64_t i = 0; i < ds->n; i++)
            for (int64_t g = 0; g < G; g++) {
                float *d = ds->x + i * per + g * gs;
                const float k = 1.0f / std[g];
                for (int64_t p = 0; p < gs; p++) d[p] = (d[p] - mean[g]) * k;
            }
        return DP_OK;
    }
    struct dp_dataset_src *s = ds->src;
    float *m = dp_malloc(sizeof(float) * (size_t)G), *inv = dp_malloc(sizeof(float) * (size_t)G);
    if (!m || !inv) {
        dp_free(m), dp_free(inv); /* (the source keeps its former normalisation, whole) */
        return dp_seterr(DP_ENOMEM, "dataset: out of memory");
    }
    for (int64_t g = 0; g < G; g++) m[g] = mean[g], inv[g] = 1.0f / std[g];
    dp_free(s->mean), dp_free(s->inv);
    s->mean = m, s->inv = inv;
    return DP_OK;
}

void dp_dataset_free(struct dp_dataset *ds) {
    if (!ds) return;
    dp_free(ds->x);
    dp_free(ds->y);
    dp_free(ds->target);
    src_free(ds->src);
    memset(ds, 0, sizeof *ds);
}
