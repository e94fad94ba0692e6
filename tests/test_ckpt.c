/* Checkpoints: round trip, every validation, atomic replacement. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

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
    /* small (header + 12 bytes), so that every byte can be tried */
    float params[2] = {0.5f, -2.0f}, bufs[1] = {3.0f};
    struct dp_ckpt_header h, r;
    make_header(&h, 2, 1, 0);
    char path[512], bad[512];
    snprintf(path, sizeof path, "%s/c.bin", dp_test_tmpdir());
    snprintf(bad, sizeof bad, "%s/bad.bin", dp_test_tmpdir());
    ASSERT_OK(dp_ckpt_write(path, &h, params, bufs, NULL));
    size_t n;
    char *img = read_file(path, &n);
    float *payload = NULL;
    /* the unchanged image reads: each rejection below is the change's doing */
    write_file(bad, img, n);
    ASSERT_OK(dp_ckpt_read(bad, &r, &payload));
    ASSERT_TRUE(memcmp(payload, params, sizeof params) == 0 && payload[2] == bufs[0]);
    dp_free(payload);
    payload = NULL;
    /* Changing any single byte anywhere is detected (magic, version, sizes,
     * header CRC or payload CRC; CRC-32 catches every error burst of up to 32
     * bits, so any change within one byte): every byte, each with its lowest
     * bit and with all of its bits flipped. */
    static const unsigned char flips[] = {0x01, 0xff};
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < sizeof flips; k++) {
            img[i] ^= (char)flips[k];
            write_file(bad, img, n);
            int rc = dp_ckpt_read(bad, &r, &payload);
            if (rc != DP_EFORMAT || payload != NULL)
                dp_test_fail(__FILE__, __LINE__, "byte %zu of %zu ^ 0x%02x: read returned %d (%s)", i, n,
                             flips[k], rc, dp_errmsg());
            img[i] ^= (char)flips[k];
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

/* The number of entries in dir other than the two named (and dot entries),
 * each printed: a temporary file left behind shows up here. */
static int count_entries(const char *dir, const char *except1, const char *except2) {
    DIR *d = opendir(dir);
    ASSERT_TRUE(d != NULL);
    struct dirent *e;
    int others = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || strcmp(e->d_name, except1) == 0 || strcmp(e->d_name, except2) == 0)
            continue;
        fprintf(stderr, "    unexpected file: %s/%s\n", dir, e->d_name);
        others++;
    }
    closedir(d);
    return others;
}

/* A write that fails beside the old checkpoint, on a full file system: a
 * small tmpfs mounted in a mount namespace of this test process alone (it
 * disappears with the process, whatever happens), the old checkpoint
 * written, the rest of the space filled, then the new checkpoint written over
 * the old one.  The write must fail (ENOSPC, named), leave the old file
 * byte for byte, and leave no temporary file.  Once space is freed the same
 * write succeeds: the failure was the full disk, nothing else. */
TEST(ckpt_write_failure_keeps_old_file) {
    /* Writing into a missing folder fails cleanly and names the path. */
    float p0[4] = {1, 2, 3, 4};
    struct dp_ckpt_header h0;
    make_header(&h0, 4, 0, 0);
    ASSERT_ERR(dp_ckpt_write("/nonexistent-dir/c.bin", &h0, p0, NULL, NULL), DP_EIO, "nonexistent-dir");

    char dir[512], path[600], filler[600];
    snprintf(dir, sizeof dir, "%s/fs", dp_test_tmpdir());
    ASSERT_EQ(mkdir(dir, 0700), 0);
    /* the test runs in a forked, single-threaded child: unshare works */
    if (unshare(CLONE_NEWNS) != 0) SKIP("unshare(CLONE_NEWNS): %s (needs root / CAP_SYS_ADMIN)", strerror(errno));
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        SKIP("making / private in the new mount namespace: %s", strerror(errno));
    if (mount("tmpfs", dir, "tmpfs", 0, "size=64k") != 0)
        SKIP("mount -t tmpfs -o size=64k %s: %s (needs root / CAP_SYS_ADMIN)", dir, strerror(errno));
    snprintf(path, sizeof path, "%s/c.bin", dir);
    snprintf(filler, sizeof filler, "%s/filler", dir);

    enum { NOLD = 16, NNEW = 4096 }; /* the new one needs 4 pages of 4 KiB */
    float old_params[NOLD], *new_params = malloc(sizeof(float) * NNEW);
    ASSERT_TRUE(new_params != NULL);
    for (int i = 0; i < NOLD; i++) old_params[i] = 0.25f * (float)i;
    for (int i = 0; i < NNEW; i++) new_params[i] = -1.0f - (float)i;
    struct dp_ckpt_header h_old, h_new, r;
    make_header(&h_old, NOLD, 0, 0);
    make_header(&h_new, NNEW, 0, 0);
    h_new.step = 99;
    ASSERT_OK(dp_ckpt_write(path, &h_old, old_params, NULL, NULL));
    size_t n_old;
    char *old_img = read_file(path, &n_old);

    /* fill the file system: write until ENOSPC */
    int fd = open(filler, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_TRUE(fd >= 0);
    char block[4096];
    memset(block, 0x33, sizeof block);
    size_t filled = 0;
    for (;;) {
        ssize_t w = write(fd, block, sizeof block);
        if (w < 0) break;
        filled += (size_t)w;
        ASSERT_TRUE(filled <= (size_t)64 << 10);
    }
    ASSERT_EQ(errno, ENOSPC);
    ASSERT_EQ(close(fd), 0);

    ASSERT_ERR(dp_ckpt_write(path, &h_new, new_params, NULL, NULL), DP_EIO, strerror(ENOSPC));
    size_t n_now;
    char *now_img = read_file(path, &n_now);
    ASSERT_EQ(n_now, n_old);
    ASSERT_TRUE(memcmp(now_img, old_img, n_old) == 0);
    free(now_img);
    ASSERT_EQ(count_entries(dir, "c.bin", "filler"), 0);
    float *payload;
    ASSERT_OK(dp_ckpt_read(path, &r, &payload));
    ASSERT_TRUE(r.step == 3 && memcmp(payload, old_params, sizeof old_params) == 0);
    dp_free(payload);

    /* space again: the same write now replaces the old file */
    ASSERT_EQ(unlink(filler), 0);
    ASSERT_OK(dp_ckpt_write(path, &h_new, new_params, NULL, NULL));
    ASSERT_OK(dp_ckpt_read(path, &r, &payload));
    ASSERT_TRUE(r.step == 99 && memcmp(payload, new_params, sizeof(float) * NNEW) == 0);
    dp_free(payload);
    ASSERT_EQ(count_entries(dir, "c.bin", "c.bin"), 0);
    free(old_img);
    free(new_params);
}
