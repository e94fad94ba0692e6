/* Checkpoints: a fixed header with its own CRC, then the payload.
 *
 * Writing is atomic (dp__write_file_atomic, src/core/file.c): the bytes go to
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

int dp_ckpt_write(const char *path, struct dp_ckpt_header *h, const float *params,
                  const float *buffers, const float *optim_state) {
    size_t np = (size_t)h->num_params * 4, nb = (size_t)h->num_buffers * 4,
           no = (size_t)h->optim_state_len * 4;
    memcpy(h->magic, DP_CKPT_MAGIC, 8);
    h->version = DP_CKPT_VERSION;
    h->header_size = sizeof *h;
    h->payload_size = np + nb + no;
    uint32_t crc = dp_crc32(0, params, np);
    crc = dp_crc32(crc, buffers, nb);
    crc = dp_crc32(crc, optim_state, no);
    h->payload_crc = crc;
    h->header_crc = 0;
    h->header_crc = dp_crc32(0, h, sizeof *h);
    const struct dp__wpart parts[] = {{h, sizeof *h}, {params, np}, {buffers, nb}, {optim_state, no}};
    return dp__write_file_atomic(path, parts, 4, "checkpoint");
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
    if (file_size != sizeof h + h.payload_size)
        return dp_seterr(DP_EFORMAT, "%s: file is %llu bytes, header says %llu (truncated?)", what,
                         (unsigned long long)file_size,
                         (unsigned long long)(sizeof h + h.payload_size));
    return DP_OK;
}

int dp_ckpt_parse(const uint8_t *buf, size_t len, struct dp_ckpt_header *h, const float **payload) {
    if (len < sizeof *h) return dp_seterr(DP_EFORMAT, "checkpoint: %zu bytes, too short for a header", len);
    memcpy(h, buf, sizeof *h);
    int rc = check_header(h, len, "checkpoint");
    if (rc) return rc;
    if (dp_crc32(0, buf + sizeof *h, (size_t)h->payload_size) != h->payload_crc)
        return dp_seterr(DP_EFORMAT, "checkpoint: payload checksum mismatch (corrupt file)");
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
