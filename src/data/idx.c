/* IDX files (the MNIST / Fashion-MNIST container), plain or gzip-compressed.
 *
 * Layout, all integers big-endian:
 *
 *     offset  size    field
 *     0       2       zero bytes
 *     2       1       element type (0x08 = uint8, the only one accepted here)
 *     3       1       ndim (1..4 accepted here)
 *     4       4*ndim  dimensions, uint32 each, all > 0
 *     4+4*nd  prod    payload: exactly prod(dims) elements, nothing after it
 *
 * One parser serves both the file reader and the in-memory entry point used
 * by the fuzzer: it pulls bytes from a small `src` that is either a zlib
 * gzFile (which reads plain files transparently) or a memory buffer, so the
 * validation logic exists exactly once.
 *
 * A header is untrusted input: it may claim 4 x 2^32-1 elements.  We refuse
 * products above DP_IDX_MAX_BYTES (which also rules out overflow, since the
 * check happens after every multiplication), and for files we never allocate
 * the claimed size up front; the buffer grows as data actually arrives, so a
 * 30-byte file claiming 8 GiB costs a few KiB before "truncated" is reported.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "dp/data.h"

/* Largest payload accepted (8 GiB): far above any dataset this project reads,
 * far below what would overflow size_t or the float conversion (x4). */
#define DP_IDX_MAX_BYTES ((uint64_t)1 << 33)
/* Read granularity for gzread, whose length argument is an unsigned int. */
#define IDX_CHUNK ((size_t)1 << 24)

/* ---- byte source: a gzFile or a memory buffer ------------------------------ */

struct src {
    const char *name; /* for messages: the path, or "<memory>" */
    gzFile gz;        /* NULL for a memory source */
    const uint8_t *buf;
    size_t len, pos;
    size_t size_hint; /* on-disk size of the file (0 if unknown) */
};

/* zlib's message without the "<fd:3>: " prefix gzdopen gives it (the path
 * is already in ours). */
static const char *zmsg_text(gzFile gz, int *zerr) {
    const char *m = gzerror(gz, zerr);
    if (m && strncmp(m, "<fd:", 4) == 0) {
        const char *p = strstr(m, ": ");
        if (p) m = p + 2;
    }
    return m ? m : "";
}

/* Reads up to n bytes into dst.  Returns the count read (short only at the
 * end of the data), or a negative DP_E* code with the message set. */
static int64_t src_read(struct src *s, uint8_t *dst, size_t n) {
    if (!s->gz) {
        size_t left = s->len - s->pos;
        if (n > left) n = left;
        if (n) memcpy(dst, s->buf + s->pos, n);
        s->pos += n;
        return (int64_t)n;
    }
    size_t got = 0;
    while (got < n) {
        size_t want = n - got < IDX_CHUNK ? n - got : IDX_CHUNK;
        int r = gzread(s->gz, dst + got, (unsigned)want);
        if (r > 0) {
            got += (size_t)r;
            continue;
        }
        int zerr = Z_OK;
        const char *zmsg = zmsg_text(s->gz, &zerr);
        /* Z_BUF_ERROR is zlib's "unexpected end of file" for a cut gzip
         * stream: report it as a short read and let the caller name what is
         * missing (header or payload). */
        if (zerr == Z_OK || zerr == Z_BUF_ERROR) break;
        if (zerr == Z_ERRNO)
            return dp_seterr(DP_EIO, "idx: %s: read failed: %s", s->name, strerror(errno));
        return dp_seterr(DP_EFORMAT, "idx: %s: corrupt gzip data: %s", s->name, zmsg);
    }
    return (int64_t)got;
}

/* After the payload: 1 if the source still holds data, 0 if it ended cleanly,
 * or a negative code (e.g. the gzip trailer is cut off or its CRC is wrong,
 * which zlib only notices once it reaches the end of the stream). */
static int src_has_more(struct src *s) {
    uint8_t b;
    int64_t r = src_read(s, &b, 1);
    if (r < 0) return (int)r;
    if (r > 0) return 1;
    if (s->gz) {
        int zerr = Z_OK;
        const char *zmsg = zmsg_text(s->gz, &zerr);
        if (zerr == Z_BUF_ERROR)
            return dp_seterr(DP_EFORMAT, "idx: %s: truncated gzip stream: %s", s->name, zmsg);
    }
    return 0;
}

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* ---- the parser ------------------------------------------------------------ */

/* Parses one IDX stream from s.  On success *data (dp_malloc'd), *ndim and
 * dims[] are set; on failure they are NULL / 0 and the message is set.
 * first > 0 reads only the first min(first, dims[0]) records: the header is
 * checked whole and dims[] are the file's, but the rest of the file is
 * neither read nor checked (so a smoke run on a few samples of a large file
 * does not decompress all of it). */
static int idx_parse_src(struct src *s, int64_t first, uint8_t **data, int *ndim, int64_t dims[4]) {
    *data = NULL;
    *ndim = 0;
    for (int i = 0; i < 4; i++) dims[i] = 0;

    uint8_t hdr[4 + 4 * 4];
    int64_t r = src_read(s, hdr, 4);
    if (r < 0) return (int)r;
    if (r < 4)
        return dp_seterr(DP_EFORMAT, "idx: %s: truncated header: expected 4 bytes, got %lld",
                         s->name, (long long)r);
    if (hdr[0] != 0 || hdr[1] != 0)
        return dp_seterr(DP_EFORMAT,
                         "idx: %s: bad magic: first bytes 0x%02x 0x%02x, expected 0x00 0x00",
                         s->name, hdr[0], hdr[1]);
    if (hdr[2] != 0x08)
        return dp_seterr(DP_EFORMAT,
                         "idx: %s: unsupported element type 0x%02x (only 0x08 = uint8)",
                         s->name, hdr[2]);
    int nd = hdr[3];
    if (nd < 1 || nd > 4)
        return dp_seterr(DP_EFORMAT, "idx: %s: bad ndim %d (expected 1..4)", s->name, nd);

    size_t dlen = 4 * (size_t)nd;
    r = src_read(s, hdr + 4, dlen);
    if (r < 0) return (int)r;
    if ((size_t)r < dlen)
        return dp_seterr(DP_EFORMAT,
                         "idx: %s: truncated header: expected %zu bytes, got %lld",
                         s->name, 4 + dlen, (long long)(4 + r));

    /* Product of the dimensions, checked against the limit after each factor
     * (each factor is < 2^32 and the running product <= 2^33, so no uint64
     * multiplication here can overflow). */
    uint64_t total = 1;
    for (int i = 0; i < nd; i++) {
        uint32_t d = be32(hdr + 4 + 4 * i);
        if (d == 0)
            return dp_seterr(DP_EFORMAT, "idx: %s: dimension %d is 0", s->name, i);
        dims[i] = d;
        total *= d;
        if (total > DP_IDX_MAX_BYTES)
            return dp_seterr(DP_EFORMAT,
                             "idx: %s: dimensions claim more than %llu bytes (limit)",
                             s->name, (unsigned long long)DP_IDX_MAX_BYTES);
    }
    size_t expected = (size_t)total;
    int partial = first > 0 && first < dims[0];
    if (partial) expected = (size_t)(total / (uint64_t)dims[0] * (uint64_t)first);

    /* A memory source knows its length: check before allocating anything. */
    if (!s->gz) {
        size_t avail = s->len - s->pos;
        if (avail < expected)
            return dp_seterr(DP_EFORMAT, "idx: %s: truncated: expected %zu bytes, got %zu",
                             s->name, expected, avail);
        if (avail > expected && !partial)
            return dp_seterr(DP_EFORMAT,
                             "idx: %s: trailing data: %zu bytes after the %zu-byte payload",
                             s->name, avail - expected, expected);
    }

    /* Start from what the file can plausibly hold (gzip of real images is
     * rarely better than 16:1) and double as data arrives.  The buffer never
     * exceeds twice the bytes actually read, whatever the header claims. */
    size_t cap = expected;
    if (s->gz) {
        size_t hint = s->size_hint ? s->size_hint * 16 : 0;
        if (hint < ((size_t)1 << 20)) hint = (size_t)1 << 20;
        if (cap > hint) cap = hint;
    }
    uint8_t *buf = dp_malloc(cap);
    if (!buf)
        return dp_seterr(DP_ENOMEM, "idx: %s: cannot allocate %zu bytes", s->name, cap);
    size_t got = 0;
    int rc = 0;
    for (;;) {
        r = src_read(s, buf + got, cap - got);
        if (r < 0) {
            rc = (int)r;
            goto fail;
        }
        got += (size_t)r;
        if (got < cap || cap == expected) break; /* short read = end of data */
        size_t ncap = cap * 2 < expected ? cap * 2 : expected;
        uint8_t *nbuf = dp_malloc(ncap);
        if (!nbuf) {
            rc = dp_seterr(DP_ENOMEM, "idx: %s: cannot allocate %zu bytes", s->name, ncap);
            goto fail;
        }
        memcpy(nbuf, buf, got);
        dp_free(buf);
        buf = nbuf;
        cap = ncap;
    }
    if (got < expected) {
        rc = dp_seterr(DP_EFORMAT, "idx: %s: truncated: expected %zu bytes, got %zu", s->name,
                       expected, got);
        goto fail;
    }
    int more = partial ? 0 : src_has_more(s);
    if (more < 0) {
        rc = more;
        goto fail;
    }
    if (more) {
        rc = dp_seterr(DP_EFORMAT, "idx: %s: trailing data after the %zu-byte payload", s->name,
                       expected);
        goto fail;
    }
    *data = buf;
    *ndim = nd;
    return 0;

fail:
    dp_free(buf);
    for (int i = 0; i < 4; i++) dims[i] = 0;
    return rc;
}

/* ---- public entry points --------------------------------------------------- */

/* Parses an already decompressed IDX image held in buf[0..len).  On success
 * *data is a new dp_malloc'd copy of the payload (the caller frees it with
 * dp_free), *ndim the number of dimensions and dims[0..ndim) their sizes
 * (the rest are 0).  On failure returns DP_EFORMAT (or DP_ENOMEM) with a
 * one-line message, and *data is NULL.  Never allocates more than len. */
int dp_idx_parse(const uint8_t *buf, size_t len, uint8_t **data, int *ndim, int64_t dims[4]) {
    struct src s = {.name = "<memory>", .buf = buf, .len = buf ? len : 0};
    return idx_parse_src(&s, 0, data, ndim, dims);
}

/* Reads the IDX file at path, gzip-compressed or plain (zlib tells them apart
 * by the 1f 8b magic).  Same outputs as dp_idx_parse.  Errors: DP_ENOENT if
 * the file does not exist, DP_EIO if it cannot be opened or read, DP_EFORMAT
 * for anything wrong with the content; the message names the path. */
int dp_idx_read(const char *path, uint8_t **data, int *ndim, int64_t dims[4]) {
    return dp_idx_read_first(path, 0, data, ndim, dims);
}

int dp_idx_read_first(const char *path, int64_t first, uint8_t **data, int *ndim, int64_t dims[4]) {
    *data = NULL;
    *ndim = 0;
    for (int i = 0; i < 4; i++) dims[i] = 0;
    if (!path) return dp_seterr(DP_EINVAL, "idx: NULL path");

    /* open() first so that "missing" and "unreadable" are told apart by errno
     * (gzopen hides it), and directories are refused before zlib sees them. */
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return dp_seterr(DP_ENOENT, "idx: %s: no such file", path);
        return dp_seterr(DP_EIO, "idx: %s: cannot open: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
        close(fd);
        return dp_seterr(DP_EIO, "idx: %s: not a regular file", path);
    }
    gzFile gz = gzdopen(fd, "rb");
    if (!gz) {
        close(fd);
        return dp_seterr(DP_ENOMEM, "idx: %s: cannot set up zlib", path);
    }
    gzbuffer(gz, 1 << 18); /* larger than the 8 KiB default: fewer syscalls */
    struct src s = {.name = path, .gz = gz,
                    .size_hint = S_ISREG(st.st_mode) ? (size_t)st.st_size : 0};
    int rc = idx_parse_src(&s, first, data, ndim, dims);
    gzclose(gz); /* also closes fd */
    return rc;
}
