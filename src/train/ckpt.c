/* Checkpoints: a fixed header with its own CRC, then the payload.
 *
 * Writing is atomic (dp__atomic_open/commit, src/core/file.c): the bytes go to
 * "<path>.tmp.<pid>.<n>", which is fsync'ed and renamed over path (rename is
 * atomic on POSIX file systems), then the directory is fsync'ed so the rename
 * itself survives a crash.  A crash at any point leaves either the old
 * checkpoint or the new one, never a mix. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core_impl.h"
#include "dp/train.h"

_Static_assert(sizeof(struct dp_ckpt_header) % 8 == 0, "header is 8-byte aligned");
_Static_assert(sizeof(struct dp_ckpt_section) == 24, "section header is 24 bytes");

int dp_ckpt_write(const char *path, struct dp_ckpt_header *h, const float *params,
                  const float *buffers, const float *optim_state) {
    return dp_ckpt_write_section(path, h, params, buffers, optim_state, NULL, NULL, 0);
}

/* The streamed form.  The header's CRCs and sizes depend on the whole
 * payload, so a zeroed header goes first and the real one is written over
 * it (pwrite at 0) once the last payload byte has been put; the payload CRC
 * and the FNV-1a of the params and buffers run over the bytes as they come,
 * so the bytes must come in file order. */
struct dp_ckpt_writer {
    struct dp__atomic a;
    uint64_t want, put, hash_len; /* payload bytes expected, put so far; the params' and buffers' */
    uint32_t crc;
    uint64_t hash;
    int rc; /* the first error (the temporary file is gone then) */
};

int dp_ckpt_writer_open(struct dp_ckpt_writer **out, const char *path, const struct dp_ckpt_header *h) {
    struct dp_ckpt_writer *w = *out = dp_calloc(1, sizeof *w);
    if (!w) return dp_seterr(DP_ENOMEM, "checkpoint: out of memory");
    w->want = 4u * (uint64_t)(h->num_params + h->num_buffers + h->optim_state_len);
    w->hash_len = 4u * (uint64_t)(h->num_params + h->num_buffers);
    w->hash = DP_FNV1A64_INIT;
    struct dp_ckpt_header zero;
    memset(&zero, 0, sizeof zero);
    int rc = dp__atomic_open(&w->a, path, "checkpoint");
    if (!rc) rc = dp__atomic_write(&w->a, &zero, sizeof zero);
    if (rc) dp_free(w), *out = NULL;
    return rc;
}

int dp_ckpt_writer_put(struct dp_ckpt_writer *w, const void *data, size_t n) {
    if (w->rc) return w->rc;
    if (n > w->want - w->put) {
        dp__atomic_abort(&w->a);
        return w->rc = dp_seterr(DP_EINTERNAL, "checkpoint: %zu bytes more than the header's payload", n);
    }
    if (w->put < w->hash_len) {
        uint64_t k = w->hash_len - w->put < n ? w->hash_len - w->put : n;
        w->hash = dp_fnv1a64(data, (size_t)k, w->hash);
    }
    w->crc = dp_crc32(w->crc, data, n);
    w->put += n;
    return w->rc = dp__atomic_write(&w->a, data, n);
}

uint64_t dp_ckpt_writer_hash(const struct dp_ckpt_writer *w) { return w->hash; }

/* A payload written by several writers (each its pieces, with pwrite at their offsets, into
 * the temporary file `tmp`: a ZeRO snapshot, snapshot.c) becomes a writer here, as if put
 * in order: its CRC and the params' and buffers' FNV-1a are read back from the file, which is
 * cut to the header and payload (an earlier attempt's longer file leaves no tail), and the
 * writer stands after the payload: sections and close go on as usual (close renames tmp to
 * path).  A file shorter than that misses a piece: an error, and tmp is removed. */
int dp__ckpt_writer_adopt(struct dp_ckpt_writer **out, const char *tmp, const char *path,
                          const struct dp_ckpt_header *h) {
    struct dp_ckpt_writer *w = *out = dp_calloc(1, sizeof *w);
    uint8_t *buf = dp_malloc(1 << 20);
    if (!w || !buf) {
        dp_free(w), dp_free(buf), *out = NULL;
        return dp_seterr(DP_ENOMEM, "checkpoint: out of memory");
    }
    w->want = w->put = 4u * (uint64_t)(h->num_params + h->num_buffers + h->optim_state_len);
    w->hash_len = 4u * (uint64_t)(h->num_params + h->num_buffers);
    w->hash = DP_FNV1A64_INIT;
    w->a.path = path, w->a.what = "checkpoint";
    snprintf(w->a.tmp, sizeof w->a.tmp, "%s", tmp);
    const uint64_t end = sizeof *h + w->want;
    struct stat st;
    int rc = DP_OK;
    if ((w->a.fd = open(tmp, O_RDWR | O_CLOEXEC)) < 0)
        rc = dp_seterr(DP_EIO, "checkpoint: cannot open %s: %s", tmp, strerror(errno));
    else if (fstat(w->a.fd, &st) != 0 || (uint64_t)st.st_size < end)
        rc = dp_seterr(DP_EIO, "checkpoint: %s holds %lld bytes, less than the header and payload's %llu (a piece "
                       "missing)", tmp, (long long)st.st_size, (unsigned long long)end);
    else if (ftruncate(w->a.fd, (off_t)end) != 0 || lseek(w->a.fd, (off_t)sizeof *h, SEEK_SET) < 0)
        rc = dp_seterr(DP_EIO, "checkpoint: %s: %s", tmp, strerror(errno));
    for (uint64_t at = 0; !rc && at < w->want;) {
        size_t n = w->want - at < (1u << 20) ? (size_t)(w->want - at) : (size_t)1 << 20;
        ssize_t got = read(w->a.fd, buf, n);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            rc = dp_seterr(DP_EIO, "checkpoint: cannot read %s back: %s", tmp, got < 0 ? strerror(errno) : "short");
            break;
        }
        if (at < w->hash_len) w->hash = dp_fnv1a64(buf, (size_t)(w->hash_len - at < (uint64_t)got ? w->hash_len - at
                                                                                               : (uint64_t)got), w->hash);
        w->crc = dp_crc32(w->crc, buf, (size_t)got);
        at += (uint64_t)got;
    }
    dp_free(buf);
    if (rc) {
        if (w->a.fd >= 0) dp__atomic_abort(&w->a);
        else unlink(tmp);
        dp_free(w), *out = NULL;
    }
    return rc;
}

int dp_ckpt_writer_section(struct dp_ckpt_writer *w, const char *tag, const void *data, uint64_t size) {
    if (w->rc) return w->rc;
    if (w->put != w->want) {
        dp__atomic_abort(&w->a);
        return w->rc = dp_seterr(DP_EINTERNAL, "checkpoint: section %.8s before the payload's end", tag);
    }
    struct dp_ckpt_section sec;
    memset(&sec, 0, sizeof sec);
    memcpy(sec.tag, tag, strnlen(tag, 8));
    sec.size = size;
    sec.data_crc = dp_crc32(0, data, (size_t)size);
    sec.header_crc = dp_crc32(0, &sec, sizeof sec);
    if (!(w->rc = dp__atomic_write(&w->a, &sec, sizeof sec))) w->rc = dp__atomic_write(&w->a, data, (size_t)size);
    return w->rc;
}

int dp_ckpt_writer_close(struct dp_ckpt_writer *w, struct dp_ckpt_header *h, const char *tag, const void *data,
                         uint64_t size) {
    int rc = w->rc;
    if (!rc && w->put != w->want)
        rc = dp_seterr(DP_EINTERNAL, "checkpoint: %llu payload bytes put, the header says %llu",
                       (unsigned long long)w->put, (unsigned long long)w->want);
    if (!rc) {
        memcpy(h->magic, DP_CKPT_MAGIC, 8);
        h->version = DP_CKPT_VERSION;
        h->header_size = sizeof *h;
        h->payload_size = w->want;
        h->payload_crc = w->crc;
        h->header_crc = 0;
        h->header_crc = dp_crc32(0, h, sizeof *h);
        if (tag) rc = dp_ckpt_writer_section(w, tag, data, size);
        if (!rc && !(rc = dp__atomic_pwrite(&w->a, h, sizeof *h, 0))) rc = dp__atomic_commit(&w->a);
    }
    if (rc) dp__atomic_abort(&w->a); /* (a no-op where a failed write has already) */
    dp_free(w);
    return rc;
}

int dp_ckpt_write_section(const char *path, struct dp_ckpt_header *h, const float *params,
                          const float *buffers, const float *optim_state, const char *tag, const void *data,
                          uint64_t size) {
    struct dp_ckpt_writer *w;
    int rc = dp_ckpt_writer_open(&w, path, h);
    if (rc) return rc;
    /* (an error is kept by the writer, and close returns it) */
    dp_ckpt_writer_put(w, params, (size_t)h->num_params * 4);
    dp_ckpt_writer_put(w, buffers, (size_t)h->num_buffers * 4);
    dp_ckpt_writer_put(w, optim_state, (size_t)h->optim_state_len * 4);
    return dp_ckpt_writer_close(w, h, tag, data, size);
}

/* Checks every header field that can be checked without the payload. */
static int check_header(const struct dp_ckpt_header *hin, uint64_t file_size, const char *what) {
    struct dp_ckpt_header h = *hin;
    if (memcmp(h.magic, DP_CKPT_MAGIC, 8) != 0)
        return dp_seterr(DP_EFORMAT, "%s: not a dptrain checkpoint (bad magic)", what);
    if (h.version != DP_CKPT_VERSION)
        return dp_seterr(DP_EFORMAT, "%s: checkpoint version %u, this build reads version %u", what,
                         h.version, DP_CKPT_VERSION);
    if (h.header_size != sizeof h)
        return dp_seterr(DP_EFORMAT, "%s: header size %u, expected %zu", what, h.header_size, sizeof h);
    uint32_t want = h.header_crc;
    h.header_crc = 0;
    if (dp_crc32(0, &h, sizeof h) != want)
        return dp_seterr(DP_EFORMAT, "%s: header checksum mismatch (corrupt file)", what);
    if (memchr(h.model_spec, 0, sizeof h.model_spec) == NULL || !h.model_spec[0])
        return dp_seterr(DP_EFORMAT, "%s: bad model spec", what);
    const int64_t lim = (int64_t)1 << 36; /* 64 Gi floats: far beyond any model here */
    if (h.num_params <= 0 || h.num_params > lim || h.num_buffers < 0 || h.num_buffers > lim ||
        h.optim_state_len < 0 || h.optim_state_len > 2 * lim)
        return dp_seterr(DP_EFORMAT, "%s: implausible tensor sizes in header", what);
    if (h.step < 0 || h.epoch < 0 || h.step_in_epoch < 0 || h.batch <= 0 || h.optim_step < 0)
        return dp_seterr(DP_EFORMAT, "%s: negative position or batch in header", what);
    if (h.optim_kind >= DP_OPTIM_KIND_COUNT || h.sched_kind >= DP_SCHED_KIND_COUNT)
        return dp_seterr(DP_EFORMAT, "%s: unknown optimizer or schedule id", what);
    uint64_t want_payload = 4u * (uint64_t)(h.num_params + h.num_buffers + h.optim_state_len);
    if (h.payload_size != want_payload)
        return dp_seterr(DP_EFORMAT, "%s: payload size %llu does not match the tensor sizes (%llu)",
                         what, (unsigned long long)h.payload_size, (unsigned long long)want_payload);
    if (file_size < sizeof h + h.payload_size)
        return dp_seterr(DP_EFORMAT, "%s: file is %llu bytes, header says %llu (truncated?)", what,
                         (unsigned long long)file_size,
                         (unsigned long long)(sizeof h + h.payload_size));
    /* the rest, if any, is sections: check_sections reads them */
    return DP_OK;
}

/* The bytes after the payload: whole sections, each with valid CRCs.  With
 * tag non-NULL, *found points at that section's data (NULL if absent). */
static int check_sections(const uint8_t *p, size_t n, const char *what, const char *tag, const uint8_t **found,
                          uint64_t *found_size) {
    if (found) *found = NULL, *found_size = 0;
    while (n > 0) {
        struct dp_ckpt_section s;
        if (n < sizeof s)
            return dp_seterr(DP_EFORMAT, "%s: %zu bytes after the payload, too short for a section (extra bytes?)",
                             what, n);
        memcpy(&s, p, sizeof s);
        uint32_t want = s.header_crc;
        s.header_crc = 0;
        if (dp_crc32(0, &s, sizeof s) != want)
            return dp_seterr(DP_EFORMAT, "%s: %zu bytes after the payload are not a valid section (bad checksum)",
                             what, n);
        if (s.size > n - sizeof s)
            return dp_seterr(DP_EFORMAT, "%s: section %.8s of %llu bytes is truncated", what, s.tag,
                             (unsigned long long)s.size);
        if (dp_crc32(0, p + sizeof s, (size_t)s.size) != s.data_crc)
            return dp_seterr(DP_EFORMAT, "%s: section %.8s checksum mismatch (corrupt file)", what, s.tag);
        if (tag && found && !memcmp(s.tag, tag, 8)) *found = p + sizeof s, *found_size = s.size;
        p += sizeof s + s.size, n -= sizeof s + (size_t)s.size;
    }
    return DP_OK;
}

int dp_ckpt_parse(const uint8_t *buf, size_t len, struct dp_ckpt_header *h, const float **payload) {
    if (len < sizeof *h) return dp_seterr(DP_EFORMAT, "checkpoint: %zu bytes, too short for a header", len);
    memcpy(h, buf, sizeof *h);
    int rc = check_header(h, len, "checkpoint");
    if (rc) return rc;
    if (dp_crc32(0, buf + sizeof *h, (size_t)h->payload_size) != h->payload_crc)
        return dp_seterr(DP_EFORMAT, "checkpoint: payload checksum mismatch (corrupt file)");
    size_t base = sizeof *h + (size_t)h->payload_size;
    if ((rc = check_sections(buf + base, len - base, "checkpoint", NULL, NULL, NULL))) return rc;
    if (payload) *payload = (const float *)(const void *)(buf + sizeof *h);
    return DP_OK;
}

static int open_checked(const char *path, struct dp_ckpt_header *h, FILE **out) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return dp_seterr(errno == ENOENT ? DP_ENOENT : DP_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return dp_seterr(DP_EIO, "%s: not a regular file", path);
    }
    if ((size_t)st.st_size < sizeof *h || fread(h, sizeof *h, 1, f) != 1) {
        fclose(f);
        return dp_seterr(DP_EFORMAT, "%s: too short for a checkpoint header", path);
    }
    int rc = check_header(h, (uint64_t)st.st_size, path);
    if (rc) {
        fclose(f);
        return rc;
    }
    *out = f;
    return DP_OK;
}

int dp_ckpt_read_header(const char *path, struct dp_ckpt_header *h) {
    FILE *f;
    int rc = open_checked(path, h, &f);
    if (!rc) fclose(f);
    return rc;
}

/* The bytes after the payload of an open file (positioned there), checked;
 * with tag, that section's data copied into *data. */
static int read_sections(FILE *f, const char *path, const char *tag, void **data, uint64_t *size) {
    long at = ftell(f);
    if (at < 0 || fseek(f, 0, SEEK_END) != 0) return dp_seterr(DP_EIO, "%s: cannot seek", path);
    long end = ftell(f);
    if (end < at || fseek(f, at, SEEK_SET) != 0) return dp_seterr(DP_EIO, "%s: cannot seek", path);
    size_t n = (size_t)(end - at);
    if (n == 0) return DP_OK;
    uint8_t *buf = dp_malloc(n);
    if (!buf) return dp_seterr(DP_ENOMEM, "%s: cannot allocate %zu bytes", path, n);
    if (fread(buf, 1, n, f) != n) {
        dp_free(buf);
        return dp_seterr(DP_EIO, "%s: short read", path);
    }
    const uint8_t *found;
    uint64_t fsize;
    int rc = check_sections(buf, n, path, tag, &found, &fsize);
    if (!rc && tag && found) {
        if (!(*data = dp_malloc((size_t)fsize + 1))) rc = dp_seterr(DP_ENOMEM, "%s: out of memory", path);
        else memcpy(*data, found, (size_t)fsize), *size = fsize;
    }
    dp_free(buf);
    return rc;
}

int dp_ckpt_read_section(const char *path, const char *tag, void **data, uint64_t *size) {
    *data = NULL, *size = 0;
    struct dp_ckpt_header h;
    FILE *f;
    int rc = open_checked(path, &h, &f);
    if (rc) return rc;
    if (fseek(f, (long)(sizeof h + h.payload_size), SEEK_SET) != 0) rc = dp_seterr(DP_EIO, "%s: cannot seek", path);
    else rc = read_sections(f, path, tag, data, size);
    fclose(f);
    return rc;
}

int dp_ckpt_read(const char *path, struct dp_ckpt_header *h, float **payload) {
    *payload = NULL;
    FILE *f;
    int rc = open_checked(path, h, &f);
    if (rc) return rc;
    float *p = dp_malloc((size_t)h->payload_size);
    if (!p) {
        fclose(f);
        return dp_seterr(DP_ENOMEM, "%s: cannot allocate %llu bytes", path, (unsigned long long)h->payload_size);
    }
    size_t got = fread(p, 1, (size_t)h->payload_size, f);
    if (got == h->payload_size && (rc = read_sections(f, path, NULL, NULL, NULL))) {
        fclose(f);
        dp_free(p);
        return rc;
    }
    fclose(f);
    if (got != h->payload_size) {
        dp_free(p);
        return dp_seterr(DP_EIO, "%s: short read", path);
    }
    if (dp_crc32(0, p, (size_t)h->payload_size) != h->payload_crc) {
        dp_free(p);
        return dp_seterr(DP_EFORMAT, "%s: payload checksum mismatch (corrupt file)", path);
    }
    *payload = p;
    return DP_OK;
}

/* The reader: one pass over the payload in blocks of RBLOCK bytes checks its
 * CRC and the params' and buffers' FNV-1a (param_hash), copying those two
 * where the caller wants them; the sections are checked after it.  The
 * optimizer state is then read by pread, range by range, into whatever
 * holds it (a ZeRO worker's pieces), so no reader holds the whole payload. */
#define RBLOCK ((size_t)1 << 20)
struct dp_ckpt_reader {
    FILE *f;
    uint64_t payload_size;
};

int dp_ckpt_reader_open(struct dp_ckpt_reader **out, const char *path, struct dp_ckpt_header *h, float *params,
                        float *buffers) {
    *out = NULL;
    FILE *f;
    int rc = open_checked(path, h, &f);
    if (rc) return rc;
    struct dp_ckpt_reader *r = dp_calloc(1, sizeof *r);
    uint8_t *buf = dp_malloc(RBLOCK);
    if (!r || !buf) {
        dp_free(r), dp_free(buf), fclose(f);
        return dp_seterr(DP_ENOMEM, "%s: out of memory", path);
    }
    const uint64_t np = 4u * (uint64_t)h->num_params, nb = 4u * (uint64_t)h->num_buffers;
    uint32_t crc = 0;
    uint64_t hash = DP_FNV1A64_INIT;
    for (uint64_t at = 0; at < h->payload_size && !rc;) {
        size_t n = h->payload_size - at < RBLOCK ? (size_t)(h->payload_size - at) : RBLOCK;
        if (fread(buf, 1, n, f) != n) {
            rc = dp_seterr(DP_EIO, "%s: short read", path);
            break;
        }
        crc = dp_crc32(crc, buf, n);
        /* the part of [at, at + n) inside the params, then inside the buffers */
        for (int s = 0; s < 2; s++) {
            uint64_t lo = s ? np : 0, hi = s ? np + nb : np, a = at > lo ? at : lo, e = at + n < hi ? at + n : hi;
            if (a >= e) continue;
            hash = dp_fnv1a64(buf + (a - at), (size_t)(e - a), hash);
            char *dst = (char *)(s ? (void *)buffers : (void *)params);
            if (dst) memcpy(dst + (a - lo), buf + (a - at), (size_t)(e - a));
        }
        at += n;
    }
    dp_free(buf);
    if (!rc && crc != h->payload_crc) rc = dp_seterr(DP_EFORMAT, "%s: payload checksum mismatch (corrupt file)", path);
    if (!rc && hash != h->param_hash) rc = dp_seterr(DP_EFORMAT, "%s: parameter hash mismatch", path);
    if (!rc) rc = read_sections(f, path, NULL, NULL, NULL);
    if (rc) {
        fclose(f), dp_free(r);
        return rc;
    }
    r->f = f, r->payload_size = h->payload_size;
    *out = r;
    return DP_OK;
}

int dp_ckpt_reader_read(struct dp_ckpt_reader *r, int64_t at, int64_t count, float *dst) {
    uint64_t off = 4u * (uint64_t)at, left = 4u * (uint64_t)count;
    if (at < 0 || count < 0 || off + left > r->payload_size)
        return dp_seterr(DP_EINVAL, "checkpoint: floats [%lld, %lld) are outside the payload", (long long)at,
                         (long long)(at + count));
    char *d = (char *)dst;
    off += sizeof(struct dp_ckpt_header);
    while (left) {
        ssize_t got = pread(fileno(r->f), d, (size_t)left, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return dp_seterr(DP_EIO, "checkpoint: short read: %s", got < 0 ? strerror(errno) : "end of file");
        d += got, off += (uint64_t)got, left -= (uint64_t)got;
    }
    return DP_OK;
}

void dp_ckpt_reader_close(struct dp_ckpt_reader *r) {
    if (!r) return;
    fclose(r->f);
    dp_free(r);
}

int dp_ckpt_model_text(const char *path, char **text) {
    void *data;
    uint64_t size;
    *text = NULL;
    int rc = dp_ckpt_read_section(path, DP_CKPT_MODEL_TAG, &data, &size);
    if (rc || !data) return rc;
    char *t = dp_malloc(size + 1);
    if (!t) {
        dp_free(data);
        return dp_seterr(DP_ENOMEM, "%s: out of memory", path);
    }
    memcpy(t, data, size);
    t[size] = 0;
    dp_free(data);
    if (strlen(t) != size) {
        dp_free(t);
        return dp_seterr(DP_EFORMAT, "%s: the model section holds a NUL byte", path);
    }
    *text = t;
    return DP_OK;
}
