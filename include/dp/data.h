/*
 * dp/data.h — datasets (IDX files), normalisation, the sampler, prefetch and
 * augmentation.
 *
 * IDX is the MNIST / Fashion-MNIST layout: a big-endian header (two zero
 * bytes, a type byte 0x08 = uint8, the number of dimensions, then each
 * dimension as uint32) followed by the data.  Files may be gzip-compressed
 * (read through zlib) or plain.
 *
 *     struct dp_dataset train;
 *     if (dp_dataset_load_idx(&train, "train-images-idx3-ubyte.gz",
 *                             "train-labels-idx1-ubyte.gz")) { ... dp_errmsg() ... }
 *     dp_dataset_normalize(&train, mean, std);
 */
#ifndef DP_DATA_H
#define DP_DATA_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A classification dataset held in memory as normalised floats. */
struct dp_dataset {
    int64_t n;            /* samples */
    int64_t C, H, W;      /* per-sample shape (C = 1 for IDX images) */
    float *x;             /* (n, C, H, W) */
    int32_t *y;           /* (n) labels */
    int64_t num_classes;  /* max label + 1 */
};

/* Reads one IDX file (plain or .gz).  On success *data holds the raw bytes
 * (caller frees with dp_free), dims[0..*ndim) the dimensions.  Validates the
 * magic, the type (uint8 only), ndim (1..4), that the dimensions are
 * positive and that the payload holds exactly prod(dims) bytes. */
int dp_idx_read(const char *path, uint8_t **data, int *ndim, int64_t dims[4]);
/* Same, from a memory buffer (already decompressed).  Used by the fuzzer. */
int dp_idx_parse(const uint8_t *buf, size_t len, uint8_t **data, int *ndim, int64_t dims[4]);

/* Loads images (n, H, W) and labels (n) and checks they agree; pixels are
 * scaled to [0, 1]. */
int dp_dataset_load_idx(struct dp_dataset *ds, const char *images_path, const char *labels_path);
/* Finds train/test files in dir ("train-images-idx3-ubyte[.gz]" etc.). */
int dp_dataset_load_dir(struct dp_dataset *train, struct dp_dataset *test, const char *dir);
/* x = (x - mean) / std */
void dp_dataset_normalize(struct dp_dataset *ds, float mean, float std);
void dp_dataset_free(struct dp_dataset *ds);

/* ---- augmentation ------------------------------------------------------------ */

struct dp_augment {
    int crop_pad;   /* random crop with this zero padding (0 = off) */
    int hflip;      /* random horizontal flip with p = 0.5 */
};
/* Writes the augmented sample `src` (C, H, W) into dst.  Random choices are a
 * function of (seed, global sample index, epoch) only. */
void dp_augment_sample(float *dst, const float *src, int64_t C, int64_t H, int64_t W,
                       const struct dp_augment *a, uint64_t seed, int64_t sample_idx,
                       int64_t epoch);

/* ---- loader: sampler + batch assembly + prefetch thread -------------------- */

/* The loader produces the batches of an epoch in the order given by a
 * permutation of the dataset (a pure function of seed and epoch when
 * shuffling), assembling each batch (gather + augmentation) on a background
 * thread one or more batches ahead of the consumer. */
struct dp_loader_params {
    int64_t batch;          /* global batch size */
    int shuffle;
    uint64_t seed;
    int drop_last;          /* 0: the last batch of an epoch may be smaller */
    struct dp_augment aug;
    int prefetch;           /* batches prepared ahead (0 = synchronous) */
    /* Data parallelism: this loader yields the part of each global batch that
     * belongs to `rank` of `world` (contiguous split, remainder to the first
     * ranks).  world = 1 for one worker. */
    int rank, world;
    /* Split unit: with align > 1 each rank's part is a run of whole chunks of
     * `align` samples (the last chunk of a batch may be short); deterministic
     * mode uses it so that chunk boundaries do not depend on world.  0 or 1:
     * split by samples. */
    int64_t align;
};
struct dp_loader_params dp_loader_default_params(void);

struct dp_loader_batch {
    int64_t B;              /* samples in this part of the batch (0 when global_B < world) */
    int64_t global_B;       /* samples in the whole global batch */
    float *x;               /* (B, C, H, W) */
    int32_t *y;             /* (B) */
    int64_t *idx;           /* (B) dataset indices (keys the RNG) */
    int64_t epoch, step_in_epoch;
};

struct dp_loader;
int dp_loader_init(struct dp_loader **l, const struct dp_dataset *ds,
                   const struct dp_loader_params *p);
/* Batches per epoch. */
int64_t dp_loader_steps_per_epoch(const struct dp_loader *l);
/* Positions the loader at (epoch, step within the epoch); used by resume. */
int dp_loader_seek(struct dp_loader *l, int64_t epoch, int64_t step);
/* Returns the next batch (valid until the next call).  Moves to the next
 * epoch after the last batch of the current one. */
int dp_loader_next(struct dp_loader *l, const struct dp_loader_batch **b);
/* Seconds the consumer spent waiting inside dp_loader_next so far. */
double dp_loader_wait_time(const struct dp_loader *l);
void dp_loader_free(struct dp_loader *l);

#ifdef __cplusplus
}
#endif
#endif
