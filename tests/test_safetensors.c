/* safetensors: the export's metadata, the reader's rejections of malformed
 * files (crafted byte by byte here), and the writer's atomic replacement. */
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dp/train.h"
#include "test.h"

/* mlp:4,3,2 on a 1x2x2 input: fc1.weight (3,4) 48 bytes, fc1.bias (3) 12,
 * fc2.weight (2,3) 24, fc2.bias (2) 8: 92 data bytes in all. */
struct tiny {
    struct dp_model *m;
    struct dp_replica r;
};
static void tiny_init(struct tiny *t, const char *spec, int64_t side) {
    ASSERT_OK(dp_model_from_spec(&t->m, spec, 1, side, side));
    ASSERT_OK(dp_replica_init(&t->r, t->m, 4));
    dp_model_init_params(t->m, &t->r, 5);
}
static void tiny_free(struct tiny *t) {
    dp_replica_free(&t->r);
    dp_model_free(t->m);
}

static char *slurp(const char *p, size_t *n) {
    FILE *f = fopen(p, "rb");
    ASSERT_TRUE(f != NULL);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(*n + 1);
    ASSERT_TRUE(fread(b, 1, *n, f) == *n);
    b[*n] = 0;
    fclose(f);
    return b;
}

/* A file with the JSON header `json` (declared length = strlen, so any
 * padding is part of json) followed by `data_len` data bytes 0, 1, 2, ... */
static void craft(const char *path, const char *json, size_t data_len) {
    FILE *f = fopen(path, "wb");
    ASSERT_TRUE(f != NULL);
    uint64_t n = strlen(json);
    ASSERT_TRUE(fwrite(&n, 8, 1, f) == 1 && fwrite(json, 1, n, f) == n);
    for (size_t i = 0; i < data_len; i++) fputc((int)(i & 0x7f), f);
    ASSERT_TRUE(fclose(f) == 0);
}

/* The header of the tiny model with the given offsets of its four tensors. */
static void tiny_json(char *buf, size_t cap, const uint64_t off[8], const char *tail) {
    snprintf(buf, cap,
             "{\"__metadata__\":{\"format\":\"pt\"},"
             "\"fc1.weight\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[%llu,%llu]},"
             "\"fc1.bias\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[%llu,%llu]},"
             "\"fc2.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[%llu,%llu]},"
             "\"fc2.bias\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[%llu,%llu]}}%s",
             (unsigned long long)off[0], (unsigned long long)off[1], (unsigned long long)off[2],
             (unsigned long long)off[3], (unsigned long long)off[4], (unsigned long long)off[5],
             (unsigned long long)off[6], (unsigned long long)off[7], tail);
}

static const uint64_t GOOD[8] = {0, 48, 48, 60, 60, 84, 84, 92};

TEST(safetensors_export_metadata_and_round_trip) {
    struct tiny t, u;
    tiny_init(&t, "mlp:4,3,2", 2);
    tiny_init(&u, "mlp:4,3,2", 2);
    char path[600];
    snprintf(path, sizeof path, "%s/m.safetensors", dp_test_tmpdir());
    const struct dp_st_meta meta[] = {{"input_mean", "0.286"}, {"input_std", "0.353"}};
    ASSERT_OK(dp_safetensors_save_meta(path, t.m, &t.r, meta, 2));
    size_t n;
    char *b = slurp(path, &n);
    uint64_t hl;
    memcpy(&hl, b, 8);
    ASSERT_EQ(hl % 8, 0);
    ASSERT_EQ(n, 8 + hl + 92);
    b[8 + hl] = 0; /* the header as a string */
    ASSERT_TRUE(strstr(b + 8, "\"dptrain_model\":\"mlp:4,3,2\"") != NULL);
    ASSERT_TRUE(strstr(b + 8, "\"input_shape\":\"1,2,2\"") != NULL);
    ASSERT_TRUE(strstr(b + 8, "\"input_mean\":\"0.286\"") != NULL);
    ASSERT_TRUE(strstr(b + 8, "\"input_std\":\"0.353\"") != NULL);
    free(b);
    ASSERT_OK(dp_safetensors_load(path, u.m, &u.r));
    ASSERT_TRUE(memcmp(t.r.params, u.r.params, sizeof(float) * (size_t)t.m->num_params) == 0);
    /* A value that would need escaping, and a key the writer owns, are refused. */
    const struct dp_st_meta q[] = {{"note", "say \"hi\""}};
    ASSERT_ERR(dp_safetensors_save_meta(path, t.m, &t.r, q, 1), DP_EINVAL, "note");
    const struct dp_st_meta own[] = {{"dptrain_model", "cnn"}};
    ASSERT_ERR(dp_safetensors_save_meta(path, t.m, &t.r, own, 1), DP_EINVAL, "dptrain_model");
    tiny_free(&t);
    tiny_free(&u);
}

TEST(safetensors_reader_rejects_malformed_files) {
    struct tiny t;
    tiny_init(&t, "mlp:4,3,2", 2);
    char path[600], json[2048];
    snprintf(path, sizeof path, "%s/c.safetensors", dp_test_tmpdir());
    float *before = malloc(sizeof(float) * (size_t)t.m->num_params);
    memcpy(before, t.r.params, sizeof(float) * (size_t)t.m->num_params);

    /* The well-formed file, padded with spaces, loads. */
    tiny_json(json, sizeof json, GOOD, "    ");
    craft(path, json, 92);
    ASSERT_OK(dp_safetensors_load(path, t.m, &t.r));
    memcpy(t.r.params, before, sizeof(float) * (size_t)t.m->num_params);

    /* Trailing header bytes: the JSON ends before the declared length, and
     * what follows is not space padding. */
    tiny_json(json, sizeof json, GOOD, "  x ");
    craft(path, json, 92);
    ASSERT_ERR(dp_safetensors_load(path, t.m, &t.r), DP_EFORMAT, "not space padding");
    tiny_json(json, sizeof json, GOOD, "{}");
    craft(path, json, 92);
    ASSERT_ERR(dp_safetensors_load(path, t.m, &t.r), DP_EFORMAT, "not space padding");

    /* Overlapping data_offsets: fc1.bias starts inside fc1.weight (every
     * tensor still has its own size and lies inside the data). */
    const uint64_t overlap[8] = {0, 48, 40, 52, 52, 76, 76, 84};
    tiny_json(json, sizeof json, overlap, "");
    craft(path, json, 84);
    ASSERT_ERR(dp_safetensors_load(path, t.m, &t.r), DP_EFORMAT, "overlaps");
    /* Two tensors on the very same bytes. */
    const uint64_t same[8] = {0, 48, 48, 60, 60, 84, 48, 56};
    tiny_json(json, sizeof json, same, "");
    craft(path, json, 84);
    ASSERT_ERR(dp_safetensors_load(path, t.m, &t.r), DP_EFORMAT, "overlaps");
    /* A hole between two tensors. */
    const uint64_t hole[8] = {0, 48, 52, 64, 64, 88, 88, 96};
    tiny_json(json, sizeof json, hole, "");
    craft(path, json, 96);
    ASSERT_ERR(dp_safetensors_load(path, t.m, &t.r), DP_EFORMAT, "gap");
    /* Data bytes that no tensor covers, after the last one. */
    tiny_json(json, sizeof json, GOOD, "");
    craft(path, json, 100);
    ASSERT_ERR(dp_safetensors_load(path, t.m, &t.r), DP_EFORMAT, "cover 92 of the 100");
    /* No rejected file loaded anything. */
    ASSERT_TRUE(memcmp(t.r.params, before, sizeof(float) * (size_t)t.m->num_params) == 0);

    /* A folder is not a file: a clear error, not a size from a failed seek. */
    ASSERT_ERR(dp_safetensors_load(dp_test_tmpdir(), t.m, &t.r), DP_EIO, "not a regular file");
    /* A header length beyond the file. */
    tiny_json(json, sizeof json, GOOD, "");
    craft(path, json, 92);
    FILE *f = fopen(path, "r+b");
    uint64_t huge = 1u << 20;
    ASSERT_TRUE(f && fwrite(&huge, 8, 1, f) == 1 && fclose(f) == 0);
    ASSERT_ERR(dp_safetensors_load(path, t.m, &t.r), DP_EFORMAT, "header length");
    free(before);
    tiny_free(&t);
}

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    ASSERT_TRUE(d != NULL);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

/* A write that fails part-way (the file-size limit: write() returns EFBIG,
 * a real failed write without a hook in the library) leaves the old file as
 * it was and no temporary file. */
TEST(safetensors_failed_export_keeps_old_file) {
    struct tiny small, big;
    tiny_init(&small, "mlp:4,3,2", 2);
    tiny_init(&big, "mlp:784,64,10", 28); /* ~200 KB */
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/out", dp_test_tmpdir());
    ASSERT_TRUE(mkdir(dir, 0755) == 0);
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    ASSERT_OK(dp_safetensors_save(path, small.m, &small.r));
    size_t n0;
    char *old = slurp(path, &n0);
    ASSERT_TRUE(n0 < 4096);
    /* This test runs in its own forked child: the limit ends with it. */
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {65536, 65536};
    ASSERT_TRUE(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    ASSERT_ERR(dp_safetensors_save(path, big.m, &big.r), DP_EIO, "cannot write");
    size_t n1;
    char *now = slurp(path, &n1);
    ASSERT_TRUE(n1 == n0 && memcmp(old, now, n0) == 0);
    ASSERT_EQ(count_files(dir), 1);
    free(old);
    free(now);
    tiny_free(&small);
    tiny_free(&big);
}

/* The temporary file is unique and created, never opened through an
 * existing name: a symlink planted at "<path>.tmp" (the name the writer used
 * to write through) or at the first unique name must not be followed. */
TEST(safetensors_export_temp_file_is_unique) {
    struct tiny t;
    tiny_init(&t, "mlp:4,3,2", 2);
    char dir[600], path[700], victim[700], link1[800], link2[800];
    snprintf(dir, sizeof dir, "%s/out", dp_test_tmpdir());
    ASSERT_TRUE(mkdir(dir, 0755) == 0);
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    snprintf(victim, sizeof victim, "%s/victim", dp_test_tmpdir());
    FILE *f = fopen(victim, "wb");
    ASSERT_TRUE(f && fputs("keep me", f) >= 0 && fclose(f) == 0);
    snprintf(link1, sizeof link1, "%s.tmp", path);
    snprintf(link2, sizeof link2, "%s.tmp.%d.0", path, (int)getpid());
    ASSERT_TRUE(symlink(victim, link1) == 0 && symlink(victim, link2) == 0);
    ASSERT_OK(dp_safetensors_save(path, t.m, &t.r));
    size_t n;
    char *v = slurp(victim, &n);
    ASSERT_TRUE(n == 7 && memcmp(v, "keep me", 7) == 0);
    free(v);
    struct stat st;
    ASSERT_TRUE(lstat(path, &st) == 0 && S_ISREG(st.st_mode));
    ASSERT_TRUE(lstat(link1, &st) == 0 && S_ISLNK(st.st_mode)); /* left alone */
    ASSERT_EQ(count_files(dir), 3); /* the file and the two links: no temporary left */
    struct tiny u;
    tiny_init(&u, "mlp:4,3,2", 2);
    ASSERT_OK(dp_safetensors_load(path, u.m, &u.r));
    ASSERT_TRUE(memcmp(t.r.params, u.r.params, sizeof(float) * (size_t)t.m->num_params) == 0);
    tiny_free(&u);
    tiny_free(&t);
}
