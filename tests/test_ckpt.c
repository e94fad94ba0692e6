/* Checkpoints: round trip, every validation, atomic replacement. */
#include <dirent.h>
#include <stdio.h>
#include <sys/stat.h>

#include "dp/train.h"
#include "test.h"

static void make_header(struct dp_ckpt_header *h, int64_t np, int64_t nb, int64_t ns) {
    memset(h, 0, sizeof *h);
    snprintf(h->model_spec, sizeof h->model_spec, "mlp");
    h->in_shape[0] = 1, h->in_shape[1] = 28, h->in_shape[2] = 28;
    h->num_params = np, h->num_buffers = nb, h->optim_state_len = ns;
    h->batch = 128, h->seed = 7, h->step = 3, h->epoch = 1, h->step_in_epoch = 2;
    h->optim_kind = DP_OPTIM_SGD, h->momentum = 0.9f;
}

static size_t file_size(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 ? (size_t)st.st_size : 0;
}

static char *read_file(const char *p, size_t *n) {
    FILE *f = fopen(p, "rb");
    *n = file_size(p);
    char *b = malloc(*n);
    ASSERT_TRUE(f && fread(b, 1, *n, f) == *n);
    fclose(f);
    return b;
}
static void write_file(const char *p, const void *b, size_t n) {
    FILE *f = fopen(p, "wb");
    ASSERT_TRUE(f && fwrite(b, 1, n, f) == n);
    fclose(f);
}

TEST(ckpt_round_trip) {
    float params[10], bufs[3], st[10];
    for (int i = 0; i < 10; i++) params[i] = (float)i * 0.5f, st[i] = -(float)i;
    for (int i = 0; i < 3; i++) bufs[i] = 100.0f + (float)i;
    struct dp_ckpt_header h, r;
    make_header(&h, 10, 3, 10);
    char path[512];
    snprintf(path, sizeof path, "%s/c.bin", dp_test_tmpdir());
    ASSERT_OK(dp_ckpt_write(path, &h, params, bufs, st));
    ASSERT_EQ(file_size(path), sizeof h + 4 * 23);
    float *payload;
    ASSERT_OK(dp_ckpt_read(path, &r, &payload));
    ASSERT_TRUE(strcmp(r.model_spec, "mlp") == 0);
    ASSERT_EQ(r.step, 3);
    ASSERT_EQ(r.step_in_epoch, 2);
    ASSERT_EQ(r.seed, 7);
    ASSERT_TRUE(memcmp(payload, params, sizeof params) == 0);
    ASSERT_TRUE(memcmp(payload + 10, bufs, sizeof bufs) == 0);
    ASSERT_TRUE(memcmp(payload + 13, st, sizeof st) == 0);
    dp_free(payload);
    /* No temporary file is left behind. */
    DIR *d = opendir(dp_test_tmpdir());
    struct dirent *e;
    int files = 0;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') files++;
    closedir(d);
    ASSERT_EQ(files, 1);
}

TEST(ckpt_rejects_every_corruption) {
    float params[10] = {0}, bufs[1] = {0};
    struct dp_ckpt_header h, r;
    make_header(&h, 10, 1, 0);
    char path[512], bad[512];
    snprintf(path, sizeof path, "%s/c.bin", dp_test_tmpdir());
    snprintf(bad, sizeof bad, "%s/bad.bin", dp_test_tmpdir());
    ASSERT_OK(dp_ckpt_write(path, &h, params, bufs, NULL));
    size_t n;
    char *img = read_file(path, &n);
    float *payload = NULL;
    /* Flipping any single byte anywhere is detected (magic, version, sizes,
     * header CRC or payload CRC). */
    for (size_t i = 0; i < n; i += 7) {
        img[i] ^= 0x5a;
        write_file(bad, img, n);
        int rc = dp_ckpt_read(bad, &r, &payload);
        ASSERT_TRUE(rc == DP_EFORMAT);
        ASSERT_TRUE(payload == NULL);
        img[i] ^= 0x5a;
    }
    /* Truncation and trailing bytes. */
    write_file(bad, img, n - 1);
    ASSERT_ERR(dp_ckpt_read(bad, &r, &payload), DP_EFORMAT, "truncated");
    write_file(bad, img, sizeof h - 1);
    ASSERT_ERR(dp_ckpt_read(bad, &r, &payload), DP_EFORMAT, "too short");
    char *longer = calloc(1, n + 4);
    memcpy(longer, img, n);
    write_file(bad, longer, n + 4);
    ASSERT_ERR(dp_ckpt_read(bad, &r, &payload), DP_EFORMAT, "bytes");
    /* A wrong version with a valid CRC is named as such. */
    struct dp_ckpt_header v = h;
    v.version = 99;
    v.header_crc = 0;
    v.header_crc = dp_crc32(0, &v, sizeof v);
    memcpy(img, &v, sizeof v);
    write_file(bad, img, n);
    ASSERT_ERR(dp_ckpt_read(bad, &r, &payload), DP_EFORMAT, "version 99");
    ASSERT_ERR(dp_ckpt_read("/nonexistent/c.bin", &r, &payload), DP_ENOENT, "cannot open");
    free(longer);
    free(img);
}

TEST(ckpt_write_failure_keeps_old_file) {
    float params[4] = {1, 2, 3, 4};
    struct dp_ckpt_header h;
    make_header(&h, 4, 0, 0);
    char path[512];
    snprintf(path, sizeof path, "%s/c.bin", dp_test_tmpdir());
    ASSERT_OK(dp_ckpt_write(path, &h, params, NULL, NULL));
    /* Writing into a missing folder fails cleanly and names the path. */
    ASSERT_ERR(dp_ckpt_write("/nonexistent-dir/c.bin", &h, params, NULL, NULL), DP_EIO, "nonexistent-dir");
    struct dp_ckpt_header r;
    float *payload;
    ASSERT_OK(dp_ckpt_read(path, &r, &payload));
    ASSERT_TRUE(payload[3] == 4.0f);
    dp_free(payload);
}
