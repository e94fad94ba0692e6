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
int dp__write_file_atomic(const char *path, const struct dp__wpart *parts, int nparts, const char *what) {
    static unsigned counter;
    char tmp[4096];
    int fd = -1;
    for (int attempt = 0; fd < 0 && attempt < 100; attempt++) {
        unsigned n = __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
        if (snprintf(tmp, sizeof tmp, "%s.tmp.%d.%u", path, (int)getpid(), n) >= (int)sizeof tmp)
            return dp_seterr(DP_EINVAL, "%s: path too long: %s", what, path);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) return dp_seterr(DP_EIO, "%s: cannot create %s: %s", what, tmp, strerror(errno));
    int bad = 0;
    for (int i = 0; i < nparts && !bad; i++) bad = write_all(fd, parts[i].data, parts[i].len);
    if (bad || fsync(fd) != 0) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return dp_seterr(DP_EIO, "%s: cannot write %s: %s", what, tmp, strerror(e));
    }
    if (close(fd) != 0 || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return dp_seterr(DP_EIO, "%s: cannot rename %s to %s: %s", what, tmp, path, strerror(e));
    }
    /* fsync the directory so the rename is durable */
    char dirbuf[4096];
    snprintf(dirbuf, sizeof dirbuf, "%s", path);
    int dfd = open(dirname(dirbuf), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return DP_OK;
}
