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
