/* NumPy's .npy arrays (numpy/lib/format.py's version 1.0, 2.0 and 3.0), read
 * without Python and without ever unpickling anything.
 *
 *   bytes 0-5   "\x93NUMPY"
 *   6, 7        major, minor version (1.0, 2.0 or 3.0)
 *   8..         the header's length: uint16 LE (1.0) or uint32 LE (2.0, 3.0)
 *   then        the header, an ASCII (3.0: UTF-8) Python dict literal ending in
 *               '\n', padded with spaces so the data starts 64-aligned:
 *               {'descr': '<f4', 'fortran_order': False, 'shape': (60000, 784), }
 *   then        the elements, C order, prod(shape) of them.
 *
 * The header is untrusted: this reads exactly those three keys, each once, in
 * any order, with the literal forms numpy writes ('...' or "..." strings, True
 * or False, a tuple of non-negative integers with an optional trailing comma),
 * and refuses everything else by name: Fortran order, big-endian or
 * byte-order-less multibyte types, object ('O') and structured dtypes (the
 * ones numpy pickles), another key, a shape whose element count or byte size
 * overflows.  The data must hold exactly the elements the shape says.
 *
 * dp_npy_write writes version 1.0 of float32, int64 and uint8 arrays, as numpy
 * would (its dict, then spaces and '\n' up to a multiple of 64 bytes), so
 * numpy.load and dp_npy_open both read the result. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core_impl.h"
#include "data/data_impl.h"
#include "dp/data.h"

static const struct {
    const char *descr;
    enum dp_npy_dtype dtype;
    size_t size;
} dtypes[] = {
    {"<f4", DP_NPY_F32, 4}, {"<f8", DP_NPY_F64, 8}, {"|u1", DP_NPY_U8, 1},  {"|i1", DP_NPY_I8, 1},
    {"<i2", DP_NPY_I16, 2}, {"<i4", DP_NPY_I32, 4}, {"<i8", DP_NPY_I64, 8}, {"|b1", DP_NPY_BOOL, 1},
};

const char *dp_npy_dtype_name(enum dp_npy_dtype t) {
    static const char *const names[] = {"float32", "float64", "uint8", "int8", "int16", "int32", "int64", "bool"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}

/* The header's dict, parsed from s[0..n). */
struct hp {
    const char *s, *start, *end, *what;
};

static void skip_ws(struct hp *p) {
    while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n')) p->s++;
}
static int eat(struct hp *p, char c) {
    skip_ws(p);
    if (p->s < p->end && *p->s == c) {
        p->s++;
        return 1;
    }
    return 0;
}
static int bad(const struct hp *p, const char *expected) {
    char shown[61]; /* the header's start, one line of printable characters (it has no NUL) */
    size_t n = 0;
    for (const char *c = p->start; c < p->end && n < sizeof shown - 1; c++)
        shown[n++] = *c >= 32 && *c < 127 ? *c : ' ';
    shown[n] = 0;
    return dp_seterr(DP_EFORMAT, "%s: header: expected %s at character %ld of '%s'", p->what, expected,
                     (long)(p->s - p->start) + 1, shown);
}

/* A quoted string ('...' or "...", no escapes) into out (cap bytes). */
static int str(struct hp *p, char *out, size_t cap) {
    skip_ws(p);
    if (p->s >= p->end || (*p->s != '\'' && *p->s != '"')) return bad(p, "a quoted string");
    char q = *p->s++;
    size_t n = 0;
    while (p->s < p->end && *p->s != q) {
        if (*p->s == '\\' || *p->s < 32 || *p->s >= 127 || n + 1 >= cap)
            return bad(p, "a short printable string without escapes");
        out[n++] = *p->s++;
    }
    if (p->s >= p->end) return bad(p, "the string's closing quote");
    p->s++;
    out[n] = 0;
    return DP_OK;
}

/* (d0, d1, ...) with an optional trailing comma; () is a scalar. */
static int shape(struct hp *p, struct dp_npy *a) {
    if (!eat(p, '(')) return bad(p, "the shape's '('");
    a->ndim = 0;
    for (;;) {
        if (eat(p, ')')) return DP_OK;
        skip_ws(p);
        if (p->s >= p->end || *p->s < '0' || *p->s > '9') return bad(p, "a dimension (a non-negative integer)");
        int64_t d = 0;
        while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
            if (d > (INT64_MAX - 9) / 10) return dp_seterr(DP_EFORMAT, "%s: header: a dimension is too large", p->what);
            d = d * 10 + (*p->s++ - '0');
        }
        if (a->ndim == DP_NPY_MAX_DIMS)
            return dp_seterr(DP_EFORMAT, "%s: more than %d dimensions", p->what, DP_NPY_MAX_DIMS);
        a->shape[a->ndim++] = d;
        if (!eat(p, ',')) {
            if (!eat(p, ')')) return bad(p, "',' or ')' in the shape");
            return a->ndim == 1 ? bad(p, "a one-dimensional shape written (n,)") : DP_OK;
        }
    }
}

/* The header dict into a (dtype, shape); Fortran order and unknown dtypes refused. */
static int parse_dict(struct hp *p, struct dp_npy *a) {
    int have[3] = {0, 0, 0};
    char descr[32] = "";
    if (!eat(p, '{')) return bad(p, "'{'");
    for (;;) {
        if (eat(p, '}')) break;
        char key[32];
        int rc = str(p, key, sizeof key);
        if (rc) return rc;
        if (!eat(p, ':')) return bad(p, "':' after a key");
        int k = !strcmp(key, "descr") ? 0 : !strcmp(key, "fortran_order") ? 1 : !strcmp(key, "shape") ? 2 : -1;
        if (k < 0) return dp_seterr(DP_EFORMAT, "%s: header: unknown key '%s' (a .npy has descr, fortran_order, shape)",
                                    p->what, key);
        if (have[k]++) return dp_seterr(DP_EFORMAT, "%s: header: key '%s' given twice", p->what, key);
        if (k == 0) {
            skip_ws(p);
            if (p->s < p->end && (*p->s == '[' || *p->s == '{'))
                return dp_seterr(DP_ENOTSUP, "%s: a structured dtype (record fields): only plain numeric arrays are read",
                                 p->what);
            if ((rc = str(p, descr, sizeof descr))) return rc;
        } else if (k == 1) {
            skip_ws(p);
            if ((size_t)(p->end - p->s) >= 4 && !memcmp(p->s, "True", 4))
                return dp_seterr(DP_ENOTSUP, "%s: Fortran order (column-major): save it C-ordered "
                                 "(np.save(f, np.ascontiguousarray(x)))", p->what);
            if ((size_t)(p->end - p->s) < 5 || memcmp(p->s, "False", 5)) return bad(p, "True or False");
            p->s += 5;
        } else if ((rc = shape(p, a)))
            return rc;
        if (!eat(p, ',')) {
            if (!eat(p, '}')) return bad(p, "',' or '}'");
            break;
        }
    }
    skip_ws(p);
    if (p->s != p->end) return bad(p, "the end of the header after '}'");
    if (!have[0] || !have[1] || !have[2])
        return dp_seterr(DP_EFORMAT, "%s: header: missing '%s'", p->what,
                         !have[0] ? "descr" : !have[1] ? "fortran_order" : "shape");
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (!strcmp(descr, dtypes[i].descr)) {
            a->dtype = dtypes[i].dtype, a->item = dtypes[i].size;
            return DP_OK;
        }
    if (descr[0] == '>')
        return dp_seterr(DP_ENOTSUP, "%s: big-endian dtype '%s': save it little-endian (x.astype(x.dtype.newbyteorder('<')))",
                         p->what, descr);
    if (strchr(descr, 'O'))
        return dp_seterr(DP_ENOTSUP, "%s: an object array ('%s'): numpy pickles those, and nothing is unpickled here",
                         p->what, descr);
    return dp_seterr(DP_ENOTSUP, "%s: dtype '%s' is not read (float32, float64, uint8, int8, int16, int32, int64, bool)",
                     p->what, descr);
}

int dp_npy_parse(const uint8_t *buf, size_t len, const char *what, struct dp_npy *a) {
    memset(a, 0, sizeof *a);
    if (!what) what = "npy";
    if (len < 10 || memcmp(buf, "\x93NUMPY", 6))
        return dp_seterr(DP_EFORMAT, "%s: not a .npy file (no \\x93NUMPY magic)", what);
    int major = buf[6], minor = buf[7];
    if ((major != 1 && major != 2 && major != 3) || minor != 0)
        return dp_seterr(DP_EFORMAT, "%s: .npy version %d.%d (1.0, 2.0 and 3.0 are read)", what, major, minor);
    size_t pre = major == 1 ? 10 : 12;
    if (len < pre) return dp_seterr(DP_EFORMAT, "%s: cut short in its header", what);
    size_t hlen = major == 1 ? (size_t)buf[8] | (size_t)buf[9] << 8
                             : (size_t)buf[8] | (size_t)buf[9] << 8 | (size_t)buf[10] << 16 | (size_t)buf[11] << 24;
    if (hlen > len - pre) return dp_seterr(DP_EFORMAT, "%s: the header says %zu bytes, the file has %zu", what, hlen,
                                           len - pre);
    const char *h = (const char *)buf + pre;
    if (memchr(h, 0, hlen)) return dp_seterr(DP_EFORMAT, "%s: a NUL byte in the header", what);
    struct hp p = {h, h, h + hlen, what};
    int rc = parse_dict(&p, a);
    if (rc) {
        memset(a, 0, sizeof *a);
        return rc;
    }
    int64_t count = 1;
    for (int i = 0; i < a->ndim; i++) {
        if (a->shape[i] && count > INT64_MAX / a->shape[i]) {
            memset(a, 0, sizeof *a);
            return dp_seterr(DP_EFORMAT, "%s: the shape's element count overflows", what);
        }
        count *= a->shape[i];
    }
    size_t data = len - pre - hlen;
    if ((uint64_t)count > (uint64_t)SIZE_MAX / a->item || (size_t)count * a->item != data) {
        size_t want = (uint64_t)count > (uint64_t)SIZE_MAX / a->item ? 0 : (size_t)count * a->item;
        memset(a, 0, sizeof *a);
        return dp_seterr(DP_EFORMAT, "%s: the shape needs %zu data bytes, the file has %zu (%s)", what, want, data,
                         data < want ? "cut short?" : "trailing bytes");
    }
    a->count = count;
    a->data = buf + pre + hlen;
    return DP_OK;
}

int dp_npy_open(const char *path, struct dp_npy *a) {
    memset(a, 0, sizeof *a);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dp_seterr(errno == ENOENT ? DP_ENOENT : DP_EIO, "%s: %s", path,
                         errno == ENOENT ? "no such file" : strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return dp_seterr(DP_EIO, "%s: not a regular file", path);
    }
    size_t len = (size_t)st.st_size;
    /* mapped, not read: a file larger than memory trains, the kernel paging it in as batches
     * are read (and out again under pressure: clean pages of a file) */
    void *map = len ? mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    int e = errno;
    close(fd);
    if (len && map == MAP_FAILED) return dp_seterr(DP_EIO, "%s: cannot map: %s", path, strerror(e));
    int rc = dp_npy_parse(map, len, path, a);
    if (rc) {
        if (map) munmap(map, len);
        return rc;
    }
    a->map = map, a->map_len = len;
    return DP_OK;
}

void dp_npy_close(struct dp_npy *a) {
    if (a->map) munmap(a->map, a->map_len);
    memset(a, 0, sizeof *a);
}

double dp_npy_get(const struct dp_npy *a, int64_t i) {
    const uint8_t *p = (const uint8_t *)a->data + (size_t)i * a->item;
    switch (a->dtype) { /* (little-endian: memcpy is the element) */
    case DP_NPY_F32: { float v; memcpy(&v, p, 4); return v; }
    case DP_NPY_F64: { double v; memcpy(&v, p, 8); return v; }
    case DP_NPY_U8: return *p;
    case DP_NPY_I8: return (int8_t)*p;
    case DP_NPY_I16: { int16_t v; memcpy(&v, p, 2); return v; }
    case DP_NPY_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    case DP_NPY_I64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
    case DP_NPY_BOOL: return *p != 0;
    }
    return 0;
}

/* ---- writing ------------------------------------------------------------------ */

static size_t write_item(enum dp_npy_dtype t) { return t == DP_NPY_U8 ? 1 : t == DP_NPY_F32 ? 4 : 8; }

size_t dp__npy_header(const char *path, enum dp_npy_dtype dtype, int ndim, const int64_t *shape,
                      size_t min_total, uint8_t *pre, size_t cap) {
    if (dtype != DP_NPY_F32 && dtype != DP_NPY_I64 && dtype != DP_NPY_U8) {
        dp_seterr(DP_EINVAL, "npy: %s: writing %s arrays is not supported (float32, int64, uint8 are)", path,
                  dp_npy_dtype_name(dtype));
        return 0;
    }
    if (ndim < 0 || ndim > DP_NPY_MAX_DIMS) {
        dp_seterr(DP_EINVAL, "npy: %s: %d dimensions (0..%d)", path, ndim, DP_NPY_MAX_DIMS);
        return 0;
    }
    const size_t item = write_item(dtype);
    /* the dict, as numpy writes it: a 1-tuple keeps its comma, "(5,)" */
    char h[512];
    size_t n = (size_t)snprintf(h, sizeof h, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                                dtype == DP_NPY_F32 ? "<f4" : dtype == DP_NPY_U8 ? "|u1" : "<i8");
    uint64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || (shape[i] && count > (uint64_t)SIZE_MAX / item / (uint64_t)shape[i])) {
            dp_seterr(DP_EINVAL, "npy: %s: bad shape (dimension %d is %lld)", path, i, (long long)shape[i]);
            return 0;
        }
        count *= (uint64_t)shape[i];
        n += (size_t)snprintf(h + n, sizeof h - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    }
    n += (size_t)snprintf(h + n, sizeof h - n, "%s), }", ndim == 1 ? "," : "");
    /* pad with spaces so that the 10 bytes before the dict, the dict and its '\n' make a multiple of 64
     * (at most 8 dimensions of 20 digits: the dict is far below sizeof h), or min_total's bytes */
    size_t total = (10 + n + 1 + 63) / 64 * 64;
    if (min_total > total) total = (min_total + 63) / 64 * 64;
    if (total > cap || total - 10 > 65535) {
        dp_seterr(DP_EINVAL, "npy: %s: header of %zu bytes too long", path, total);
        return 0;
    }
    memcpy(pre, "\x93NUMPY\x01\x00", 8);
    size_t hlen = total - 10;
    pre[8] = (uint8_t)hlen, pre[9] = (uint8_t)(hlen >> 8);
    memcpy(pre + 10, h, n);
    memset(pre + 10 + n, ' ', hlen - n - 1);
    pre[total - 1] = '\n';
    return total;
}

int dp_npy_write(const char *path, enum dp_npy_dtype dtype, int ndim, const int64_t *shape,
                 const void *data) {
    if (!path || (ndim > 0 && !shape)) return dp_seterr(DP_EINVAL, "npy: NULL argument");
    uint8_t pre[DP__NPY_HEADER_MAX];
    size_t total = dp__npy_header(path, dtype, ndim, shape, 0, pre, sizeof pre);
    if (!total) return DP_EINVAL;
    uint64_t count = 1;
    for (int i = 0; i < ndim; i++) count *= (uint64_t)shape[i];
    if (count && !data) return dp_seterr(DP_EINVAL, "npy: NULL argument");
    struct dp__wpart parts[2] = {{pre, total}, {data, (size_t)count * write_item(dtype)}};
    return dp__write_file_atomic(path, parts, count ? 2 : 1, "npy");
}
