/* Atomic file replacement (core_impl.h), shared by every writer of a file
 * that must never be seen half written: checkpoints, safetensors exports,
 * token files.
 *
 * The bytes go to "<path>.tmp.<pid>.<n>", which is fsync'ed and renamed over
 * path (rename is atomic on POSIX file systems), then the directory is
 * fsync'ed so the rename itself survives a crash.  A crash at any point
 * leaves either the old file or the new one, never a mix. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core_impl.h"
#include "dp/common.h"

static int write_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The temporary file gets a name no other writer uses at the same time: the
 * pid tells processes apart, the counter calls within one process (threads,
 * or two files written to the same path), and O_EXCL refuses a name that
 * exists already (a stale file of a dead process with the same pid, or a
 * symlink planted there) instead of writing through it. */
int dp__atomic_open(struct dp__atomic *a, const char *path, const char *what) {
    static unsigned counter;
    a->fd = -1, a->path = path, a->what = what;
    for (int attempt = 0; a->fd < 0 && attempt < 100; attempt++) {
        unsigned n = __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
        if (snprintf(a->tmp, sizeof a->tmp, "%s.tmp.%d.%u", path, (int)getpid(), n) >= (int)sizeof a->tmp)
            return dp_seterr(DP_EINVAL, "%s: path too long: %s", what, path);
        a->fd = open(a->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (a->fd < 0 && errno != EEXIST) break;
    }
    if (a->fd < 0) return dp_seterr(DP_EIO, "%s: cannot create %s: %s", what, a->tmp, strerror(errno));
    return DP_OK;
}

static int write_failed(struct dp__atomic *a) {
    int e = errno;
    dp__atomic_abort(a);
    return dp_seterr(DP_EIO, "%s: cannot write %s: %s", a->what, a->tmp, strerror(e));
}

int dp__atomic_write(struct dp__atomic *a, const void *data, size_t len) {
    return write_all(a->fd, data, len) ? write_failed(a) : DP_OK;
}

int dp__atomic_pwrite(struct dp__atomic *a, const void *data, size_t len, uint64_t off) {
    const char *c = data;
    while (len) {
        ssize_t w = pwrite(a->fd, c, len, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return write_failed(a);
        c += w, len -= (size_t)w, off += (uint64_t)w;
    }
    return DP_OK;
}

void dp__atomic_abort(struct dp__atomic *a) {
    if (a->fd < 0) return;
    close(a->fd);
    unlink(a->tmp);
    a->fd = -1;
}

int dp__atomic_commit(struct dp__atomic *a) {
    if (fsync(a->fd) != 0) return write_failed(a);
    int fd = a->fd;
    a->fd = -1;
    if (close(fd) != 0 || rename(a->tmp, a->path) != 0) {
        int e = errno;
        unlink(a->tmp);
        return dp_seterr(DP_EIO, "%s: cannot rename %s to %s: %s", a->what, a->tmp, a->path, strerror(e));
    }
    /* fsync the directory so the rename is durable */
    char dirbuf[4096];
    snprintf(dirbuf, sizeof dirbuf, "%s", a->path);
    int dfd = open(dirname(dirbuf), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return DP_OK;
}

int dp__write_file_atomic(const char *path, const struct dp__wpart *parts, int nparts, const char *what) {
    struct dp__atomic a;
    int rc = dp__atomic_open(&a, path, what);
    for (int i = 0; i < nparts && !rc; i++) rc = dp__atomic_write(&a, parts[i].data, parts[i].len);
    return rc ? rc : dp__atomic_commit(&a);
}

int dp__mkdir_p(const char *path, unsigned mode) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) {
        errno = n ? ENAMETOOLONG : ENOENT;
        return -1;
    }
    memcpy(buf, path, n + 1);
    /* each prefix that ends at a '/', then the whole path; one that exists already is fine
     * (as long as the last one is a folder) */
    for (size_t i = 1; i <= n; i++) {
        if (i < n && buf[i] != '/') continue;
        char c = buf[i];
        buf[i] = 0;
        if (mkdir(buf, (mode_t)mode) != 0 && errno != EEXIST) return -1;
        buf[i] = c;
    }
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

/* Reads the whole of an open file; *buf (dp_malloc'd) and *len.  Grows as
 * data arrives, so the size stat reported is a hint, not a promise. */
int dp__read_fd(int fd, const char *what, const char *path, size_t hint, uint8_t **buf, size_t *len) {
    size_t cap = hint + 1, n = 0;
    uint8_t *b = dp_malloc(cap);
    if (!b) return dp_seterr(DP_ENOMEM, "%s: %s: cannot allocate %zu bytes", what, path, cap);
    for (;;) {
        if (n == cap) {
            size_t ncap = cap * 2;
            uint8_t *nb = dp_malloc(ncap);
            if (!nb) {
                dp_free(b);
                return dp_seterr(DP_ENOMEM, "%s: %s: cannot allocate %zu bytes", what, path, ncap);
            }
            memcpy(nb, b, n);
            dp_free(b);
            b = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, b + n, cap - n);
        if (r < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            dp_free(b);
            return dp_seterr(DP_EIO, "%s: %s: read failed: %s", what, path, strerror(e));
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    *buf = b;
    *len = n;
    return DP_OK;
}

/* Opens path for reading: DP_ENOENT when missing, DP_EIO when it cannot be
 * opened or is not a regular file (a folder, a fifo). */
int dp__open_regular(const char *what, const char *path, int *fd, size_t *size) {
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd < 0) {
        if (errno == ENOENT)
            return dp_seterr(DP_ENOENT, "%s: %s: no such file or directory", what, path);
        return dp_seterr(DP_EIO, "%s: %s: cannot open: %s", what, path, strerror(errno));
    }
    struct stat st;
    if (fstat(*fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(*fd);
        *fd = -1;
        return dp_seterr(DP_EIO, "%s: %s: not a regular file", what, path);
    }
    *size = (size_t)st.st_size;
    return DP_OK;
}

/* The first bytes of a file, for a message: "it starts with \"...\"" with
 * up to 16 bytes, C escapes for what is not printable ASCII; "it is empty"
 * for no bytes.  A user who passed a text file, an image file or a
 * checkpoint where a token file was expected recognises it from them. */
void dp__describe_start(char *out, size_t cap, const uint8_t *buf, size_t len) {
    if (len == 0) {
        snprintf(out, cap, "it is empty");
        return;
    }
    size_t o = (size_t)snprintf(out, cap, "it starts with \"");
    for (size_t i = 0; i < len && i < 16 && o + 8 < cap; i++) {
        uint8_t c = buf[i];
        if (c == '\n') o += (size_t)snprintf(out + o, cap - o, "\\n");
        else if (c == '\t') o += (size_t)snprintf(out + o, cap - o, "\\t");
        else if (c == '"' || c == '\\') o += (size_t)snprintf(out + o, cap - o, "\\%c", c);
        else if (c >= 0x20 && c < 0x7f) out[o++] = (char)c, out[o] = 0;
        else o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    }
    snprintf(out + o, cap - o, "%s\"", len > 16 ? "..." : "");
}
