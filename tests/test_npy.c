/* NumPy .npy arrays (issue 29, N1): every dtype read back, the shapes numpy
 * writes, version 2.0, a mapped file, and each refusal named (Fortran order,
 * big-endian, object and structured dtypes, a size that does not match). */
#include <stdio.h>
#include <string.h>

#include "dp/data.h"
#include "test.h"

/* A .npy in buf: magic, version, the header dict padded to 64 bytes with '\n', then `data`. */
static size_t npy_bytes(uint8_t *buf, int major, const char *dict, const void *data, size_t n) {
    size_t pre = major == 1 ? 10 : 12, dl = strlen(dict);
    size_t hlen = ((pre + dl + 1 + 63) / 64) * 64 - pre;
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (uint8_t)major, buf[7] = 0;
    for (size_t i = 0; i < pre - 8; i++) buf[8 + i] = (uint8_t)(hlen >> (8 * i));
    memcpy(buf + pre, dict, dl);
    memset(buf + pre + dl, ' ', hlen - dl - 1);
    buf[pre + hlen - 1] = '\n';
    if (n) memcpy(buf + pre + hlen, data, n);
    return pre + hlen + n;
}

TEST(npy_dtypes_and_shapes) {
    static uint8_t buf[4096];
    struct dp_npy a;
    float f[6] = {1.5f, -2, 3, 4, 5, 6.25f};
    size_t n = npy_bytes(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", f, sizeof f);
    ASSERT_OK(dp_npy_parse(buf, n, "x.npy", &a));
    ASSERT_TRUE(a.dtype == DP_NPY_F32 && a.ndim == 2 && a.shape[0] == 2 && a.shape[1] == 3 && a.count == 6);
    ASSERT_TRUE(dp_npy_get(&a, 0) == 1.5 && dp_npy_get(&a, 5) == 6.25);
    double d[2] = {-1e300, 0.125};
    n = npy_bytes(buf, 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", d, sizeof d);
    ASSERT_OK(dp_npy_parse(buf, n, "x.npy", &a));
    ASSERT_TRUE(a.ndim == 1 && dp_npy_get(&a, 0) == -1e300 && dp_npy_get(&a, 1) == 0.125);
    int64_t l[3] = {-5, 0, (int64_t)1 << 40};
    n = npy_bytes(buf, 1, "{\"descr\": \"<i8\", \"shape\": (3,), \"fortran_order\": False}", l, sizeof l);
    ASSERT_OK(dp_npy_parse(buf, n, "y.npy", &a)); /* any key order, double quotes, no trailing comma */
    ASSERT_TRUE(a.dtype == DP_NPY_I64 && dp_npy_get(&a, 0) == -5 && dp_npy_get(&a, 2) == 1099511627776.0);
    int32_t i32[2] = {-7, 9};
    n = npy_bytes(buf, 2, "{'descr': '<i4', 'fortran_order': False, 'shape': (1, 2), }", i32, sizeof i32);
    ASSERT_OK(dp_npy_parse(buf, n, "v2.npy", &a)); /* version 2.0: a 4-byte header length */
    ASSERT_TRUE(a.dtype == DP_NPY_I32 && dp_npy_get(&a, 0) == -7 && dp_npy_get(&a, 1) == 9);
    int16_t i16[1] = {-300};
    n = npy_bytes(buf, 1, "{'descr': '<i2', 'fortran_order': False, 'shape': (1, 1, 1, 1), }", i16, sizeof i16);
    ASSERT_OK(dp_npy_parse(buf, n, "x.npy", &a));
    ASSERT_TRUE(a.ndim == 4 && dp_npy_get(&a, 0) == -300);
    uint8_t b[3] = {0, 255, 7};
    n = npy_bytes(buf, 1, "{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }", b, 3);
    ASSERT_OK(dp_npy_parse(buf, n, "x.npy", &a));
    ASSERT_TRUE(a.dtype == DP_NPY_U8 && dp_npy_get(&a, 1) == 255);
    n = npy_bytes(buf, 1, "{'descr': '|i1', 'fortran_order': False, 'shape': (3,), }", b, 3);
    ASSERT_OK(dp_npy_parse(buf, n, "x.npy", &a));
    ASSERT_TRUE(a.dtype == DP_NPY_I8 && dp_npy_get(&a, 1) == -1);
    n = npy_bytes(buf, 1, "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", b, 3);
    ASSERT_OK(dp_npy_parse(buf, n, "x.npy", &a));
    ASSERT_TRUE(a.dtype == DP_NPY_BOOL && dp_npy_get(&a, 0) == 0 && dp_npy_get(&a, 2) == 1);
    n = npy_bytes(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", f, 4);
    ASSERT_OK(dp_npy_parse(buf, n, "x.npy", &a)); /* a scalar: one element */
    ASSERT_TRUE(a.ndim == 0 && a.count == 1);
    n = npy_bytes(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 5), }", NULL, 0);
    ASSERT_OK(dp_npy_parse(buf, n, "x.npy", &a));
    ASSERT_TRUE(a.count == 0);
    ASSERT_TRUE(strcmp(dp_npy_dtype_name(DP_NPY_I16), "int16") == 0);
}

TEST(npy_refusals_named) {
    static uint8_t buf[4096];
    float f[4] = {0};
    static const struct {
        const char *dict;
        size_t data;
        int rc;
        const char *needle;
    } bad[] = {
        {"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16, DP_ENOTSUP, "Fortran order"},
        {"{'descr': '>f4', 'fortran_order': False, 'shape': (2, 2), }", 16, DP_ENOTSUP, "big-endian dtype '>f4'"},
        {"{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", 16, DP_ENOTSUP, "nothing is unpickled"},
        {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", 8, DP_ENOTSUP, "structured dtype"},
        {"{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", 16, DP_ENOTSUP, "dtype '<c8' is not read"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), 'extra': 1}", 16, DP_EFORMAT, "unknown key 'extra'"},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (4,)}", 16, DP_EFORMAT, "given twice"},
        {"{'descr': '<f4', 'fortran_order': False}", 16, DP_EFORMAT, "missing 'shape'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", 12, DP_EFORMAT, "cut short?"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", 16 + 4, DP_EFORMAT, "trailing bytes"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4), }", 16, DP_EFORMAT, "(n,)"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (-4,), }", 16, DP_EFORMAT, "a dimension"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }", 16, DP_EFORMAT, "overflows"},
        {"{'descr': '<f4', 'fortran_order': Maybe, 'shape': (4,), }", 16, DP_EFORMAT, "True or False"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4,), } x", 16, DP_EFORMAT, "the end of the header"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t data[32] = {0};
        size_t n = npy_bytes(buf, 1, bad[i].dict, data, bad[i].data);
        struct dp_npy a;
        dp_clearerr();
        int rc = dp_npy_parse(buf, n, "z.npy", &a);
        if (rc != bad[i].rc || !strstr(dp_errmsg(), bad[i].needle) || !strstr(dp_errmsg(), "z.npy") || a.data)
            dp_test_fail(__FILE__, __LINE__, "case %zu: rc %d '%s', expected %d '%s'", i, rc, dp_errmsg(), bad[i].rc,
                         bad[i].needle);
    }
    struct dp_npy a;
    size_t n = npy_bytes(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", f, 16);
    buf[0] = 'X';
    ASSERT_ERR(dp_npy_parse(buf, n, "m.npy", &a), DP_EFORMAT, "not a .npy file");
    buf[0] = 0x93, buf[6] = 4;
    ASSERT_ERR(dp_npy_parse(buf, n, "m.npy", &a), DP_EFORMAT, "version 4.0");
    buf[6] = 1, buf[9] = 0x7f; /* a header length past the end */
    ASSERT_ERR(dp_npy_parse(buf, n, "m.npy", &a), DP_EFORMAT, "the header says");
    ASSERT_ERR(dp_npy_parse(buf, 8, "m.npy", &a), DP_EFORMAT, "not a .npy file");
    ASSERT_ERR(dp_npy_open("/nonexistent/x.npy", &a), DP_ENOENT, "no such file");
    ASSERT_ERR(dp_npy_open("/tmp", &a), DP_EIO, "not a regular file");
}

/* A file, mapped: the elements are read from the mapping. */
TEST(npy_open_maps_file) {
    static uint8_t buf[4096];
    float f[8];
    for (int i = 0; i < 8; i++) f[i] = (float)i * 0.5f;
    size_t n = npy_bytes(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4), }", f, sizeof f);
    char path[] = "/tmp/dptest-npy-XXXXXX";
    int fd = mkstemp(path);
    ASSERT_TRUE(fd >= 0);
    FILE *fp = fdopen(fd, "wb");
    ASSERT_TRUE(fwrite(buf, 1, n, fp) == n);
    fclose(fp);
    struct dp_npy a;
    ASSERT_OK(dp_npy_open(path, &a));
    ASSERT_TRUE(a.map != NULL && a.map_len == n && a.count == 8 && dp_npy_get(&a, 7) == 3.5);
    ASSERT_TRUE((const uint8_t *)a.data == (const uint8_t *)a.map + (n - sizeof f)); /* in the mapping */
    ASSERT_TRUE((n - sizeof f) % 64 == 0);
    dp_npy_close(&a);
    ASSERT_TRUE(a.map == NULL);
    remove(path);
}

/* Writes a .npy of `dict` and `data` to a temporary file; its path into path. */
static void npy_file(char *path, const char *dict, const void *data, size_t n) {
    static uint8_t buf[1 << 16];
    size_t len = npy_bytes(buf, 1, dict, data, n);
    strcpy(path, "/tmp/dptest-npy-XXXXXX");
    int fd = mkstemp(path);
    FILE *fp = fdopen(fd, "wb");
    fwrite(buf, 1, len, fp);
    fclose(fp);
}

/* A dataset over a mapped (N, H, W, C) uint8 array: samples read as (C, H, W) floats, a
 * held-out split that is a partition keyed by the seed, per-channel statistics, and the
 * normalisation applied as read. */
TEST(npy_dataset_read_split_normalise) {
    enum { N = 10, H = 2, W = 3, C = 2 };
    uint8_t x[N * H * W * C];
    int64_t y[N];
    for (int i = 0; i < N; i++) {
        y[i] = i % 3;
        for (int p = 0; p < H * W; p++)
            for (int c = 0; c < C; c++) x[(i * H * W + p) * C + c] = (uint8_t)(i * 10 + p + 100 * c);
    }
    char xp[64], yp[64];
    npy_file(xp, "{'descr': '|u1', 'fortran_order': False, 'shape': (10, 2, 3, 2), }", x, sizeof x);
    npy_file(yp, "{'descr': '<i8', 'fortran_order': False, 'shape': (10,), }", y, sizeof y);
    struct dp_dataset ds, val;
    struct dp_data_opts o = {.nhwc = 1};
    ASSERT_OK(dp_dataset_open_npy(&ds, xp, yp, &o));
    ASSERT_TRUE(ds.n == N && ds.C == C && ds.H == H && ds.W == W && ds.num_classes == 3 && !ds.x && ds.src);
    float s[C * H * W];
    dp_dataset_read(&ds, 4, s);
    for (int c = 0; c < C; c++)
        for (int p = 0; p < H * W; p++) ASSERT_TRUE(s[c * H * W + p] == (float)(40 + p + 100 * c));
    /* statistics per channel: channel 1 is channel 0 + 100, the same spread */
    double mean[C], sd[C];
    ASSERT_OK(dp_dataset_channel_stats(&ds, mean, sd));
    ASSERT_NEAR(mean[0], 45 + 2.5, 1e-9);
    ASSERT_NEAR(mean[1], mean[0] + 100, 1e-9);
    ASSERT_NEAR(sd[0], sd[1], 1e-9);
    /* the split: 3 held out, a partition, the same rows for the same seed, others for another */
    ASSERT_OK(dp_dataset_split(&ds, &val, 0.3, 42));
    ASSERT_TRUE(ds.n == 7 && val.n == 3);
    int seen[N] = {0};
    for (int64_t i = 0; i < ds.n + val.n; i++) {
        dp_dataset_read(i < ds.n ? &ds : &val, i < ds.n ? i : i - ds.n, s);
        int row = (int)s[0] / 10;
        ASSERT_TRUE(row >= 0 && row < N && !seen[row]);
        seen[row] = 1;
        ASSERT_TRUE((i < ds.n ? ds.y[i] : val.y[i - ds.n]) == row % 3); /* labels follow their rows */
    }
    dp_dataset_read(&val, 0, s);
    int first = (int)s[0] / 10;
    dp_dataset_free(&ds), dp_dataset_free(&val);
    ASSERT_OK(dp_dataset_open_npy(&ds, xp, yp, &o));
    ASSERT_OK(dp_dataset_split(&ds, &val, 0.3, 42));
    dp_dataset_read(&val, 0, s);
    ASSERT_TRUE((int)s[0] / 10 == first);
    /* normalised as read: (x - mean) / std per channel */
    float m[C] = {40, 140}, st[C] = {2, 4};
    ASSERT_OK(dp_dataset_normalize_channels(&ds, m, st));
    dp_dataset_read(&ds, 0, s);
    float raw0[C * H * W];
    int row0 = (int)(s[0] * 2 + 40) / 10;
    for (int c = 0; c < C; c++)
        for (int p = 0; p < H * W; p++) raw0[c * H * W + p] = (float)(row0 * 10 + p + 100 * c);
    for (int c = 0; c < C; c++)
        for (int p = 0; p < H * W; p++) ASSERT_NEAR(s[c * H * W + p], (raw0[c * H * W + p] - m[c]) / st[c], 1e-6);
    float bad[C] = {0, 0};
    ASSERT_ERR(dp_dataset_normalize_channels(&ds, m, bad), DP_EINVAL, "std must be > 0");
    dp_dataset_free(&ds), dp_dataset_free(&val);
    /* a split that would leave a part empty */
    ASSERT_OK(dp_dataset_open_npy(&ds, xp, yp, &o));
    ASSERT_ERR(dp_dataset_split(&ds, &val, 0.05, 1), DP_EINVAL, "no validation sample");
    dp_dataset_free(&ds);
    /* float labels are a regression's: refused as classes, read as targets with regression */
    float yf[N];
    for (int i = 0; i < N; i++) yf[i] = (float)i * 0.5f;
    char yfp[64];
    npy_file(yfp, "{'descr': '<f4', 'fortran_order': False, 'shape': (10,), }", yf, sizeof yf);
    ASSERT_ERR(dp_dataset_open_npy(&ds, xp, yfp, &o), DP_EFORMAT, "float targets are a regression");
    o.regression = 1;
    ASSERT_OK(dp_dataset_open_npy(&ds, xp, yfp, &o));
    ASSERT_TRUE(!ds.y && ds.target && ds.num_classes == 1 && ds.target[9] == 4.5f);
    ASSERT_EQ(dp_dataset_norm_groups(&ds), C); /* an image: its channels */
    dp_dataset_free(&ds);
    /* a table (N, D): each feature its own mean and std, as StandardScaler does */
    float tab[N * 3];
    for (int i = 0; i < N; i++) tab[i * 3] = (float)i, tab[i * 3 + 1] = 100.0f + 2 * i, tab[i * 3 + 2] = 7;
    char tp[64];
    npy_file(tp, "{'descr': '<f4', 'fortran_order': False, 'shape': (10, 3), }", tab, sizeof tab);
    o.regression = 0, o.nhwc = 0;
    ASSERT_OK(dp_dataset_open_npy(&ds, tp, yp, &o));
    ASSERT_TRUE(ds.C == 1 && ds.H == 1 && ds.W == 3 && dp_dataset_norm_groups(&ds) == 3);
    double m3[3], s3[3];
    ASSERT_OK(dp_dataset_channel_stats(&ds, m3, s3));
    ASSERT_NEAR(m3[0], 4.5, 1e-12);
    ASSERT_NEAR(m3[1], 109, 1e-12);
    ASSERT_NEAR(s3[1], 2 * s3[0], 1e-9);
    ASSERT_TRUE(m3[2] == 7 && s3[2] == 1); /* a constant feature: std 1 */
    dp_dataset_free(&ds);
    remove(tp);
    remove(xp), remove(yp), remove(yfp);
}
