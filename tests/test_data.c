/* Data: IDX parsing and validation, datasets, augmentation, the loader
 * (sampler, rank split, seek, prefetch), and the real Fashion-MNIST files. */
#include <zlib.h>

#include "dp/core.h"
#include "dp/data.h"
#include "test.h"

/* ---- helpers: writing IDX files ------------------------------------------- */

/* Writes bytes to path, through gzip when gz is set. */
static void write_bytes(const char *path, const uint8_t *p, size_t n, int gz) {
    if (gz) {
        gzFile f = gzopen(path, "wb");
        ASSERT_TRUE(f != NULL);
        if (n) ASSERT_EQ(gzwrite(f, p, (unsigned)n), (long long)n);
        ASSERT_EQ(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        ASSERT_TRUE(f != NULL);
        ASSERT_EQ(fwrite(p, 1, n, f), (long long)n);
        ASSERT_EQ(fclose(f), 0);
    }
}

/* Builds an IDX image in buf: header (type, ndim, dims) + `payload` bytes
 * valued (i * 7 + 3) & 255.  Returns the total length. */
static size_t make_idx(uint8_t *buf, uint8_t type, int ndim, const uint32_t *dims,
                       size_t payload) {
    size_t k = 0;
    buf[k++] = 0, buf[k++] = 0, buf[k++] = type, buf[k++] = (uint8_t)ndim;
    for (int i = 0; i < ndim; i++) {
        buf[k++] = (uint8_t)(dims[i] >> 24), buf[k++] = (uint8_t)(dims[i] >> 16);
        buf[k++] = (uint8_t)(dims[i] >> 8), buf[k++] = (uint8_t)dims[i];
    }
    for (size_t i = 0; i < payload; i++) buf[k++] = (uint8_t)(i * 7 + 3);
    return k;
}

static char *tmp_path(char *out, const char *name) {
    snprintf(out, 512, "%s/%s", dp_test_tmpdir(), name);
    return out;
}

/* ---- IDX ---------------------------------------------------------------------- */

static void check_roundtrip(int gz) {
    uint8_t buf[256];
    uint32_t dims[3] = {3, 2, 5};
    size_t len = make_idx(buf, 0x08, 3, dims, 30);
    char path[512];
    tmp_path(path, gz ? "a.idx.gz" : "a.idx");
    write_bytes(path, buf, len, gz);
    uint8_t *data;
    int nd;
    int64_t d[4];
    ASSERT_OK(dp_idx_read(path, &data, &nd, d));
    ASSERT_EQ(nd, 3);
    ASSERT_EQ(d[0], 3);
    ASSERT_EQ(d[1], 2);
    ASSERT_EQ(d[2], 5);
    ASSERT_EQ(d[3], 0);
    for (int i = 0; i < 30; i++) ASSERT_EQ(data[i], (uint8_t)(i * 7 + 3));
    dp_free(data);
    /* The same bytes through the memory parser. */
    ASSERT_OK(dp_idx_parse(buf, len, &data, &nd, d));
    ASSERT_EQ(nd, 3);
    ASSERT_EQ(data[29], (uint8_t)(29 * 7 + 3));
    dp_free(data);
}

TEST(data_idx_roundtrip_plain) { check_roundtrip(0); }
TEST(data_idx_roundtrip_gz) { check_roundtrip(1); }

/* Checks that buf[0..len) fails with `code` and `needle` in the message, both
 * in memory and as a plain and a gzip file (whose messages name the path). */
static void check_bad(const uint8_t *buf, size_t len, int code, const char *needle) {
    uint8_t *data = (uint8_t *)1;
    int nd = -1;
    int64_t d[4];
    ASSERT_ERR(dp_idx_parse(buf, len, &data, &nd, d), code, needle);
    ASSERT_TRUE(data == NULL && nd == 0);
    ASSERT_TRUE(strchr(dp_errmsg(), '\n') == NULL);
    char path[512];
    for (int gz = 0; gz < 2; gz++) {
        tmp_path(path, gz ? "bad.gz" : "bad");
        write_bytes(path, buf, len, gz);
        ASSERT_ERR(dp_idx_read(path, &data, &nd, d), code, needle);
        ASSERT_TRUE(strstr(dp_errmsg(), path) != NULL);
        ASSERT_TRUE(data == NULL);
    }
}

TEST(data_idx_validation_errors) {
    uint8_t buf[512];
    uint32_t dims[5] = {2, 3, 1, 1, 1};
    size_t len = make_idx(buf, 0x08, 2, dims, 6);
    buf[0] = 1; /* bad magic */
    check_bad(buf, len, DP_EFORMAT, "magic");
    len = make_idx(buf, 0x0D, 2, dims, 6); /* float type */
    check_bad(buf, len, DP_EFORMAT, "type 0x0d");
    len = make_idx(buf, 0x08, 0, dims, 6);
    check_bad(buf, len, DP_EFORMAT, "ndim 0");
    len = make_idx(buf, 0x08, 5, dims, 6);
    check_bad(buf, len, DP_EFORMAT, "ndim 5");
    uint32_t zero[2] = {2, 0};
    len = make_idx(buf, 0x08, 2, zero, 0);
    check_bad(buf, len, DP_EFORMAT, "dimension 1 is 0");
    len = make_idx(buf, 0x08, 2, dims, 5);
    check_bad(buf, len, DP_EFORMAT, "truncated: expected 6 bytes, got 5");
    len = make_idx(buf, 0x08, 2, dims, 8);
    check_bad(buf, len, DP_EFORMAT, "trailing");
    len = make_idx(buf, 0x08, 2, dims, 0);
    check_bad(buf, 6, DP_EFORMAT, "truncated header"); /* cut inside dims */
    check_bad(buf, 2, DP_EFORMAT, "truncated header");
    check_bad(buf, 0, DP_EFORMAT, "truncated header");
    /* 4 x (2^32 - 1) elements: refused by the size limit, not attempted. */
    uint32_t huge[4] = {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu};
    len = make_idx(buf, 0x08, 4, huge, 4);
    check_bad(buf, len, DP_EFORMAT, "limit");

    uint8_t *data;
    int nd;
    int64_t d[4];
    char path[512];
    tmp_path(path, "does-not-exist.idx");
    const char *needle = path; /* a pointer, so the macro's NULL check compiles */
    ASSERT_ERR(dp_idx_read(path, &data, &nd, d), DP_ENOENT, needle);
    ASSERT_ERR(dp_idx_read(dp_test_tmpdir(), &data, &nd, d), DP_EIO, "not a regular file");
}

/* A gzip file cut in the middle, and one with a corrupted CRC. */
TEST(data_idx_broken_gzip) {
    uint8_t buf[4096];
    uint32_t dims[1] = {4000};
    size_t len = make_idx(buf, 0x08, 1, dims, 4000);
    char path[512];
    tmp_path(path, "x.gz");
    write_bytes(path, buf, len, 1);
    FILE *f = fopen(path, "rb");
    uint8_t z[8192];
    size_t zn = fread(z, 1, sizeof z, f);
    fclose(f);
    ASSERT_TRUE(zn > 20);
    uint8_t *data;
    int nd;
    int64_t d[4];
    write_bytes(path, z, zn / 2, 0);
    ASSERT_ERR(dp_idx_read(path, &data, &nd, d), DP_EFORMAT, "truncated");
    write_bytes(path, z, zn - 4, 0); /* payload complete, trailer cut */
    ASSERT_ERR(dp_idx_read(path, &data, &nd, d), DP_EFORMAT, "truncated gzip");
    z[zn - 6] ^= 0xFF; /* CRC-32 of the trailer */
    write_bytes(path, z, zn, 0);
    ASSERT_ERR(dp_idx_read(path, &data, &nd, d), DP_EFORMAT, "gzip");
}

/* Records the largest allocation, to show a huge claim is not allocated. */
static size_t max_alloc;
static void *counting_alloc(size_t n, void *u) {
    (void)u;
    if (n > max_alloc) max_alloc = n;
    void *p = NULL;
    return posix_memalign(&p, 64, n ? (n + 63) & ~(size_t)63 : 64) ? NULL : p;
}
static void counting_free(void *p, void *u) {
    (void)u;
    free(p);
}

TEST(data_idx_huge_claim_not_allocated) {
    uint8_t buf[64];
    uint32_t dims[3] = {1u << 20, 1u << 10, 4}; /* 4 GiB claimed, 10 bytes present */
    size_t len = make_idx(buf, 0x08, 3, dims, 10);
    char path[512];
    tmp_path(path, "huge");
    write_bytes(path, buf, len, 0);
    struct dp_allocator a = {counting_alloc, counting_free, NULL};
    dp_set_allocator(&a);
    uint8_t *data;
    int nd;
    int64_t d[4];
    ASSERT_ERR(dp_idx_parse(buf, len, &data, &nd, d), DP_EFORMAT, "truncated");
    ASSERT_ERR(dp_idx_read(path, &data, &nd, d), DP_EFORMAT, "got 10");
    dp_set_allocator(NULL);
    ASSERT_TRUE(max_alloc <= (2u << 20));
}

/* ---- datasets ---------------------------------------------------------------- */

/* Writes n images of H x W with pixel (i, p) = (i * 31 + p) & 255 and labels
 * i % classes, under dir with the standard prefix (train or t10k). */
static void write_split(const char *dir, const char *prefix, uint32_t n, uint32_t H, uint32_t W,
                        int classes, int gz) {
    size_t npix = (size_t)n * H * W;
    uint8_t *buf = malloc(16 + npix);
    uint32_t idims[3] = {n, H, W};
    size_t len = make_idx(buf, 0x08, 3, idims, 0);
    for (size_t i = 0; i < npix; i++) buf[len + i] = (uint8_t)((i / (H * W)) * 31 + i % (H * W));
    char path[512];
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte%s", dir, prefix, gz ? ".gz" : "");
    write_bytes(path, buf, len + npix, gz);
    uint32_t ldims[1] = {n};
    len = make_idx(buf, 0x08, 1, ldims, 0);
    for (uint32_t i = 0; i < n; i++) buf[len + i] = (uint8_t)(i % (uint32_t)classes);
    snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte%s", dir, prefix, gz ? ".gz" : "");
    write_bytes(path, buf, len + n, gz);
    free(buf);
}

TEST(data_dataset_load_and_normalize) {
    const char *dir = dp_test_tmpdir();
    write_split(dir, "train", 7, 3, 4, 5, 0);
    char ip[512], lp[512];
    struct dp_dataset ds;
    ASSERT_OK(dp_dataset_load_idx(&ds, tmp_path(ip, "train-images-idx3-ubyte"),
                                  tmp_path(lp, "train-labels-idx1-ubyte")));
    ASSERT_EQ(ds.n, 7);
    ASSERT_EQ(ds.C, 1);
    ASSERT_EQ(ds.H, 3);
    ASSERT_EQ(ds.W, 4);
    ASSERT_EQ(ds.num_classes, 5);
    for (int i = 0; i < 7; i++) {
        ASSERT_EQ(ds.y[i], i % 5);
        for (int p = 0; p < 12; p++)
            ASSERT_NEAR(ds.x[i * 12 + p], ((i * 31 + p) & 255) / 255.0, 1e-7);
    }
    float x5 = ds.x[5];
    dp_dataset_normalize(&ds, 0.25f, 0.5f);
    ASSERT_NEAR(ds.x[5], (x5 - 0.25f) / 0.5f, 1e-6);
    dp_dataset_free(&ds);
    ASSERT_TRUE(ds.x == NULL && ds.n == 0);
    dp_dataset_free(&ds); /* twice is fine */
    dp_dataset_free(NULL);

    /* Count mismatch: 7 images, 6 labels. */
    uint8_t buf[64];
    uint32_t six[1] = {6};
    write_bytes(lp, buf, make_idx(buf, 0x08, 1, six, 6), 0);
    ASSERT_ERR(dp_dataset_load_idx(&ds, ip, lp), DP_EMISMATCH, "count mismatch");
    ASSERT_TRUE(ds.x == NULL);
    /* Images that are not 3-D. */
    ASSERT_ERR(dp_dataset_load_idx(&ds, lp, lp), DP_EFORMAT, "3 dimensions");
}

TEST(data_dataset_load_dir) {
    const char *dir = dp_test_tmpdir();
    struct dp_dataset tr, te;
    ASSERT_ERR(dp_dataset_load_dir(&tr, &te, dir), DP_ENOENT, "train-images-idx3-ubyte[.gz]");
    write_split(dir, "train", 20, 5, 6, 10, 1); /* gzip */
    write_split(dir, "t10k", 8, 5, 6, 10, 0);   /* plain */
    ASSERT_OK(dp_dataset_load_dir(&tr, &te, dir));
    ASSERT_EQ(tr.n, 20);
    ASSERT_EQ(te.n, 8);
    ASSERT_EQ(tr.num_classes, 10);
    ASSERT_EQ(te.num_classes, 8); /* labels 0..7 */
    ASSERT_NEAR(te.x[30 + 2], ((31 + 2) & 255) / 255.0, 1e-7);
    dp_dataset_free(&tr);
    dp_dataset_free(&te);
    char p[512];
    remove(tmp_path(p, "t10k-labels-idx1-ubyte"));
    ASSERT_ERR(dp_dataset_load_dir(&tr, &te, dir), DP_ENOENT, "t10k-labels-idx1-ubyte[.gz]");
    ASSERT_OK(dp_dataset_load_dir(&tr, NULL, dir)); /* train only */
    dp_dataset_free(&tr);
}

/* A path that is no folder, as a user may pass it to --data: missing ("no
 * such file or folder", not the four files missing from it), or a file
 * (the message says what the folder holds; for one of the IDX files
 * themselves, to give its folder).  Nothing is left allocated. */
TEST(data_dataset_load_dir_not_a_folder) {
    struct dp_dataset tr, te;
    char p[512];
    ASSERT_ERR(dp_dataset_load_dir(&tr, &te, tmp_path(p, "nope")), DP_ENOENT, "nope: no such file or folder");
    ASSERT_TRUE(strstr(dp_errmsg(), "missing") == NULL);
    ASSERT_TRUE(tr.x == NULL && te.x == NULL);
    uint8_t text[] = "some text";
    write_bytes(tmp_path(p, "notes.txt"), text, sizeof text - 1, 0);
    ASSERT_ERR(dp_dataset_load_dir(&tr, &te, p), DP_EINVAL, "notes.txt is not a folder: an image model");
    ASSERT_TRUE(strstr(dp_errmsg(), "train-images-idx3-ubyte, train-labels-idx1-ubyte") != NULL);
    ASSERT_TRUE(strstr(dp_errmsg(), "give its folder") == NULL);
    write_split(dp_test_tmpdir(), "train", 4, 5, 6, 10, 1);
    ASSERT_ERR(dp_dataset_load_dir_first(&tr, NULL, tmp_path(p, "train-images-idx3-ubyte.gz"), 2, 0), DP_EINVAL,
               "(that is one of them: give its folder)");
    ASSERT_TRUE(tr.x == NULL);
}

/* --train-limit / --test-limit read only the samples they keep: the first
 * ones are those of the full load, the classes are the whole label file's,
 * and the images past them are not read (a file cut after them still loads
 * with the limit, and fails without). */
TEST(data_dataset_load_first_samples_only) {
    const char *dir = dp_test_tmpdir();
    write_split(dir, "train", 20, 5, 6, 10, 1); /* gzip */
    write_split(dir, "t10k", 8, 5, 6, 10, 0);   /* plain */
    struct dp_dataset tr, te, tr3, te2;
    ASSERT_OK(dp_dataset_load_dir(&tr, &te, dir));
    ASSERT_OK(dp_dataset_load_dir_first(&tr3, &te2, dir, 3, 2));
    ASSERT_EQ(tr3.n, 3);
    ASSERT_EQ(te2.n, 2);
    ASSERT_EQ(tr3.num_classes, 10); /* labels 0..9 over the 20, though the first 3 are 0..2 */
    ASSERT_EQ(te2.num_classes, 8);
    ASSERT_TRUE(memcmp(tr3.x, tr.x, sizeof(float) * 3 * 30) == 0);
    ASSERT_TRUE(memcmp(te2.y, te.y, sizeof(int32_t) * 2) == 0);
    dp_dataset_free(&tr3), dp_dataset_free(&te2);
    ASSERT_OK(dp_dataset_load_dir_first(&tr3, NULL, dir, 50, 0)); /* a limit past n: all */
    ASSERT_EQ(tr3.n, 20);
    dp_dataset_free(&tr3), dp_dataset_free(&tr), dp_dataset_free(&te);

    /* a plain image file cut after 4 of its 8 records */
    char p[512];
    tmp_path(p, "t10k-images-idx3-ubyte");
    FILE *f = fopen(p, "rb");
    uint8_t buf[16 + 8 * 30];
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    ASSERT_EQ(len, (size_t)(16 + 8 * 30));
    write_bytes(p, buf, 16 + 4 * 30, 0);
    uint8_t *data;
    int nd;
    int64_t d[4];
    ASSERT_ERR(dp_idx_read(p, &data, &nd, d), DP_EFORMAT, "truncated");
    ASSERT_OK(dp_idx_read_first(p, 4, &data, &nd, d));
    ASSERT_EQ(d[0], 8); /* the file's count */
    ASSERT_TRUE(memcmp(data, buf + 16, 4 * 30) == 0);
    dp_free(data);
    ASSERT_ERR(dp_idx_read_first(p, 5, &data, &nd, d), DP_EFORMAT, "truncated");
}

/* ---- augmentation -------------------------------------------------------------- */

TEST(data_augment_deterministic_and_shape_preserving) {
    enum { C = 2, H = 5, W = 6 };
    float src[C * H * W], a1[C * H * W], a2[C * H * W];
    for (int i = 0; i < C * H * W; i++) src[i] = (float)(i + 1); /* all nonzero */
    struct dp_augment aug = {.crop_pad = 2, .hflip = 1};
    int flips = 0, differs_by_epoch = 0;
    for (int s = 0; s < 200; s++) {
        dp_augment_sample(a1, src, C, H, W, &aug, 9, s, 3);
        dp_augment_sample(a2, src, C, H, W, &aug, 9, s, 3);
        ASSERT_TRUE(memcmp(a1, a2, sizeof a1) == 0);
        dp_augment_sample(a2, src, C, H, W, &aug, 9, s, 4);
        differs_by_epoch += memcmp(a1, a2, sizeof a1) != 0;
        /* Recover the shift: every output pixel is 0 or src at one common
         * (dy, dx), possibly mirrored, in both channels. */
        int found = 0;
        for (int f = 0; f < 2 && !found; f++)
            for (int dy = -2; dy <= 2 && !found; dy++)
                for (int dx = -2; dx <= 2 && !found; dx++) {
                    int ok = 1;
                    for (int c = 0; c < C && ok; c++)
                        for (int i = 0; i < H && ok; i++)
                            for (int j = 0; j < W && ok; j++) {
                                int jj = f ? W - 1 - j : j, si = i + dy, sj = jj + dx;
                                float want = (si >= 0 && si < H && sj >= 0 && sj < W)
                                                 ? src[(c * H + si) * W + sj] : 0.0f;
                                ok = a1[(c * H + i) * W + j] == want;
                            }
                    if (ok) found = 1, flips += f;
                }
        ASSERT_TRUE(found);
    }
    ASSERT_TRUE(flips > 60 && flips < 140);
    ASSERT_TRUE(differs_by_epoch > 150);
    /* Off: a copy.  A padding larger than the image must not overrun. */
    struct dp_augment off = {0, 0};
    dp_augment_sample(a1, src, C, H, W, &off, 9, 1, 1);
    ASSERT_TRUE(memcmp(a1, src, sizeof a1) == 0);
    struct dp_augment big = {.crop_pad = 20, .hflip = 1};
    for (int s = 0; s < 50; s++) dp_augment_sample(a1, src, C, H, W, &big, 1, s, 0);
}

/* ---- the loader ---------------------------------------------------------------- */

/* A dataset where sample i is the 2x3 image filled with i and label i % 7. */
static void make_ds(struct dp_dataset *ds, int64_t n) {
    memset(ds, 0, sizeof *ds);
    ds->n = n, ds->C = 1, ds->H = 2, ds->W = 3, ds->num_classes = 7;
    ds->x = dp_malloc((size_t)n * 6 * sizeof(float));
    ds->y = dp_malloc((size_t)n * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++) {
        for (int k = 0; k < 6; k++) ds->x[i * 6 + k] = (float)i;
        ds->y[i] = (int32_t)(i % 7);
    }
}

static struct dp_loader_params params(int64_t batch, int shuffle, int prefetch) {
    struct dp_loader_params p = dp_loader_default_params();
    p.batch = batch, p.shuffle = shuffle, p.prefetch = prefetch, p.seed = 1234;
    return p;
}

/* Reads `count` batches and appends their indices to idx, batch sizes to
 * sizes (if not NULL), and checks x and y against the index. */
static int64_t take(struct dp_loader *l, const struct dp_dataset *ds, int count, int64_t *idx,
                    int64_t *sizes) {
    int64_t k = 0;
    for (int s = 0; s < count; s++) {
        const struct dp_loader_batch *b;
        ASSERT_OK(dp_loader_next(l, &b));
        if (sizes) sizes[s] = b->B;
        for (int64_t i = 0; i < b->B; i++) {
            ASSERT_EQ(b->y[i], ds->y[b->idx[i]]);
            ASSERT_TRUE(b->x[i * 6 + 5] == (float)b->idx[i]);
            idx[k++] = b->idx[i];
        }
    }
    return k;
}

TEST(data_loader_epoch_covers_every_sample_once) {
    struct dp_dataset ds;
    make_ds(&ds, 10);
    for (int pf = 0; pf <= 2; pf++) {
        struct dp_loader_params p = params(4, 1, pf);
        struct dp_loader *l;
        ASSERT_OK(dp_loader_init(&l, &ds, &p));
        ASSERT_EQ(dp_loader_steps_per_epoch(l), 3);
        int64_t idx[64], sizes[9];
        ASSERT_EQ(take(l, &ds, 9, idx, sizes), 30); /* three epochs */
        for (int e = 0; e < 3; e++) {
            ASSERT_EQ(sizes[3 * e], 4);
            ASSERT_EQ(sizes[3 * e + 1], 4);
            ASSERT_EQ(sizes[3 * e + 2], 2);
            int seen[10] = {0};
            for (int i = 0; i < 10; i++) seen[idx[10 * e + i]]++;
            for (int i = 0; i < 10; i++) ASSERT_EQ(seen[i], 1);
        }
        /* Epochs are shuffled differently, and as dp_rng_permutation says. */
        ASSERT_TRUE(memcmp(idx, idx + 10, 10 * sizeof idx[0]) != 0);
        int64_t perm[10];
        dp_rng_permutation(1234, DP_RNG_SHUFFLE, 1, perm, 10);
        ASSERT_TRUE(memcmp(perm, idx + 10, sizeof perm) == 0);
        ASSERT_TRUE(dp_loader_wait_time(l) >= 0.0);
        dp_loader_free(l);
    }
    dp_dataset_free(&ds);
}

TEST(data_loader_order_reproducible_and_drop_last) {
    struct dp_dataset ds;
    make_ds(&ds, 10);
    struct dp_loader_params p = params(4, 1, 1);
    int64_t a[40], b[40], c[40];
    struct dp_loader *l;
    ASSERT_OK(dp_loader_init(&l, &ds, &p));
    take(l, &ds, 12, a, NULL);
    dp_loader_free(l);
    ASSERT_OK(dp_loader_init(&l, &ds, &p));
    take(l, &ds, 12, b, NULL);
    dp_loader_free(l);
    ASSERT_TRUE(memcmp(a, b, sizeof a) == 0);
    p.seed = 99;
    ASSERT_OK(dp_loader_init(&l, &ds, &p));
    take(l, &ds, 12, c, NULL);
    dp_loader_free(l);
    ASSERT_TRUE(memcmp(a, c, sizeof a) != 0);
    /* No shuffle: identity order. */
    p = params(4, 0, 2);
    ASSERT_OK(dp_loader_init(&l, &ds, &p));
    ASSERT_EQ(take(l, &ds, 6, a, NULL), 20);
    for (int i = 0; i < 20; i++) ASSERT_EQ(a[i], i % 10);
    dp_loader_free(l);
    /* drop_last: two full batches per epoch. */
    p = params(4, 1, 2);
    p.drop_last = 1;
    int64_t sizes[4];
    ASSERT_OK(dp_loader_init(&l, &ds, &p));
    ASSERT_EQ(dp_loader_steps_per_epoch(l), 2);
    ASSERT_EQ(take(l, &ds, 4, a, sizes), 16);
    for (int i = 0; i < 4; i++) ASSERT_EQ(sizes[i], 4);
    dp_loader_free(l);
    /* Bad parameters. */
    p = params(0, 1, 0);
    ASSERT_ERR(dp_loader_init(&l, &ds, &p), DP_EINVAL, "batch");
    ASSERT_TRUE(l == NULL);
    p = params(4, 1, 0);
    p.rank = 3, p.world = 3;
    ASSERT_ERR(dp_loader_init(&l, &ds, &p), DP_EINVAL, "rank 3");
    p = params(11, 1, 0);
    p.drop_last = 1;
    ASSERT_ERR(dp_loader_init(&l, &ds, &p), DP_EINVAL, "drop_last");
    dp_dataset_free(&ds);
}

/* With world = 3 each global batch is split contiguously; the parts in rank
 * order rebuild the single-worker batch exactly. */
static void check_world_split(int64_t n, int64_t batch, int world, int prefetch) {
    struct dp_dataset ds;
    make_ds(&ds, n);
    struct dp_loader_params p = params(batch, 1, prefetch);
    p.aug.hflip = 1;
    struct dp_loader *one, *part[8];
    ASSERT_OK(dp_loader_init(&one, &ds, &p));
    for (int r = 0; r < world; r++) {
        struct dp_loader_params q = p;
        q.rank = r, q.world = world;
        ASSERT_OK(dp_loader_init(&part[r], &ds, &q));
        ASSERT_EQ(dp_loader_steps_per_epoch(part[r]), dp_loader_steps_per_epoch(one));
    }
    int64_t steps = 3 * dp_loader_steps_per_epoch(one);
    for (int64_t s = 0; s < steps; s++) {
        const struct dp_loader_batch *g, *b;
        ASSERT_OK(dp_loader_next(one, &g));
        int64_t k = 0, G = g->B;
        for (int r = 0; r < world; r++) {
            ASSERT_OK(dp_loader_next(part[r], &b));
            ASSERT_EQ(b->global_B, G);
            ASSERT_EQ(b->B, G / world + (r < G % world));
            ASSERT_EQ(b->epoch, g->epoch);
            ASSERT_EQ(b->step_in_epoch, g->step_in_epoch);
            for (int64_t i = 0; i < b->B; i++, k++) {
                ASSERT_EQ(b->idx[i], g->idx[k]);
                ASSERT_TRUE(memcmp(b->x + i * 6, g->x + k * 6, 6 * sizeof(float)) == 0);
            }
        }
        ASSERT_EQ(k, G);
    }
    dp_loader_free(one);
    for (int r = 0; r < world; r++) dp_loader_free(part[r]);
    dp_dataset_free(&ds);
}

TEST(data_loader_world_split_rebuilds_global_batch) {
    check_world_split(10, 4, 3, 0); /* global 4, 4, 2: the last gives rank 2 nothing */
    check_world_split(10, 4, 3, 2);
    check_world_split(23, 7, 3, 1);
    check_world_split(5, 8, 4, 3);  /* batch larger than the dataset */
}

TEST(data_loader_seek_matches_straight_run) {
    struct dp_dataset ds;
    make_ds(&ds, 13);
    for (int pf = 0; pf <= 3; pf += 3) {
        struct dp_loader_params p = params(3, 1, pf); /* 5 steps per epoch */
        struct dp_loader *l, *m;
        int64_t all[200], got[200];
        ASSERT_OK(dp_loader_init(&l, &ds, &p));
        int64_t na = take(l, &ds, 15, all, NULL); /* 3 epochs */
        ASSERT_EQ(na, 39);
        /* A fresh loader seeking to (1, 2): batch 7 of the straight run. */
        ASSERT_OK(dp_loader_init(&m, &ds, &p));
        ASSERT_OK(dp_loader_seek(m, 1, 2));
        int64_t ng = take(m, &ds, 8, got, NULL);
        ASSERT_TRUE(memcmp(got, all + 13 + 6, (size_t)ng * sizeof(int64_t)) == 0);
        /* Seeking back mid-stream on the same loader, and to a step past the
         * end of an epoch (carries into the next). */
        ASSERT_OK(dp_loader_seek(m, 0, 0));
        ng = take(m, &ds, 15, got, NULL);
        ASSERT_TRUE(memcmp(got, all, 39 * sizeof(int64_t)) == 0);
        ASSERT_OK(dp_loader_seek(m, 0, 6));
        const struct dp_loader_batch *b;
        ASSERT_OK(dp_loader_next(m, &b));
        ASSERT_EQ(b->epoch, 1);
        ASSERT_EQ(b->step_in_epoch, 1);
        ASSERT_EQ(b->idx[0], all[13 + 3]);
        ASSERT_ERR(dp_loader_seek(m, -1, 0), DP_EINVAL, "seek");
        dp_loader_free(l);
        dp_loader_free(m);
    }
    dp_dataset_free(&ds);
}

TEST(data_loader_prefetch_matches_synchronous) {
    struct dp_dataset ds;
    make_ds(&ds, 37);
    for (int i = 0; i < 37 * 6; i++) ds.x[i] += 0.01f * (float)(i % 6); /* asymmetric rows */
    struct dp_loader_params p = params(5, 1, 0);
    p.aug.crop_pad = 1, p.aug.hflip = 1;
    struct dp_loader *sync, *pre[3];
    ASSERT_OK(dp_loader_init(&sync, &ds, &p));
    int pfs[3] = {1, 2, 5};
    for (int j = 0; j < 3; j++) {
        struct dp_loader_params q = p;
        q.prefetch = pfs[j];
        ASSERT_OK(dp_loader_init(&pre[j], &ds, &q));
    }
    for (int s = 0; s < 40; s++) {
        const struct dp_loader_batch *a, *b;
        ASSERT_OK(dp_loader_next(sync, &a));
        for (int j = 0; j < 3; j++) {
            ASSERT_OK(dp_loader_next(pre[j], &b));
            ASSERT_EQ(b->B, a->B);
            ASSERT_EQ(b->epoch, a->epoch);
            ASSERT_TRUE(memcmp(a->idx, b->idx, (size_t)a->B * sizeof(int64_t)) == 0);
            ASSERT_TRUE(memcmp(a->y, b->y, (size_t)a->B * sizeof(int32_t)) == 0);
            ASSERT_TRUE(memcmp(a->x, b->x, (size_t)a->B * 6 * sizeof(float)) == 0);
        }
    }
    dp_loader_free(sync);
    for (int j = 0; j < 3; j++) dp_loader_free(pre[j]);
    dp_dataset_free(&ds);
}

/* Shutdown at every stage never hangs; many seeks and frees under load (the
 * test TSan is pointed at). */
TEST_T(data_loader_stress_shutdown_and_seek, 60) {
    struct dp_dataset ds;
    make_ds(&ds, 101);
    struct dp_loader_params p = params(4, 1, 3);
    p.aug.hflip = 1; /* work in the producer; a constant image flips to itself */
    for (int round = 0; round < 50; round++) {
        struct dp_loader *l;
        ASSERT_OK(dp_loader_init(&l, &ds, &p));
        int64_t idx[64];
        take(l, &ds, round % 7, idx, NULL);
        if (round % 3 == 0) ASSERT_OK(dp_loader_seek(l, round, round % 5));
        take(l, &ds, round % 4, idx, NULL);
        dp_loader_free(l);
    }
    dp_loader_free(NULL);
    dp_dataset_free(&ds);
}

/* ---- the real dataset ---------------------------------------------------------- */

TEST(data_fashion_mnist) {
    const char *dir = "/usr/share/datasets/fashion-mnist";
    FILE *f = fopen("/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz", "rb");
    if (!f) SKIP("%s absent (package dataset-fashion-mnist)", dir);
    fclose(f);
    struct dp_dataset tr, te;
    double t0 = dp_time();
    ASSERT_OK(dp_dataset_load_dir(&tr, &te, dir));
    double t_load = dp_time() - t0;
    ASSERT_EQ(tr.n, 60000);
    ASSERT_EQ(te.n, 10000);
    ASSERT_EQ(tr.C, 1);
    ASSERT_EQ(tr.H, 28);
    ASSERT_EQ(tr.W, 28);
    ASSERT_EQ(tr.num_classes, 10);
    ASSERT_EQ(te.num_classes, 10);
    int count[10] = {0};
    for (int64_t i = 0; i < tr.n; i++) count[tr.y[i]]++;
    for (int c = 0; c < 10; c++) ASSERT_EQ(count[c], 6000); /* balanced classes */
    double sum = 0;
    for (int64_t i = 0; i < tr.n * 784; i++) {
        ASSERT_TRUE(tr.x[i] >= 0.0f && tr.x[i] <= 1.0f);
        sum += tr.x[i];
    }
    ASSERT_NEAR(sum / (double)(tr.n * 784), 0.2860, 0.001); /* the published mean */
    /* One epoch through the loader with prefetch and augmentation. */
    struct dp_loader_params p = dp_loader_default_params();
    p.batch = 256, p.aug.crop_pad = 2, p.aug.hflip = 1;
    struct dp_loader *l;
    ASSERT_OK(dp_loader_init(&l, &tr, &p));
    ASSERT_EQ(dp_loader_steps_per_epoch(l), 235);
    int64_t total = 0;
    t0 = dp_time();
    for (int s = 0; s < 235; s++) {
        const struct dp_loader_batch *b;
        ASSERT_OK(dp_loader_next(l, &b));
        total += b->B;
    }
    ASSERT_EQ(total, 60000);
    fprintf(stderr, "    load %.2fs, one epoch of batches %.3fs (waited %.3fs)\n", t_load,
            dp_time() - t0, dp_loader_wait_time(l));
    dp_loader_free(l);
    dp_dataset_free(&tr);
    dp_dataset_free(&te);
}
