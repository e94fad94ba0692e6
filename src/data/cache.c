/* The cache folder shared by the prepared data (data_impl.h): where it is
 * (dp_text_cache_dir), how its files are named after their source
 * (dp__cache_prefix), and the other versions of a source's files, found
 * (dp__cache_newest_other) or removed (dp__cache_remove_others). */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/data_impl.h"
#include "dp/core.h"
#include "dp/data.h"

int dp_text_cache_dir(char *out, size_t cap) {
    if (!out || cap == 0) return dp_seterr(DP_EINVAL, "text: NULL argument");
    const char *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    int n;
    /* The XDG base directory rule: a relative XDG_CACHE_HOME is ignored. */
    if (x && x[0] == '/') n = snprintf(out, cap, "%s/dptrain", x);
    else if (h && h[0]) n = snprintf(out, cap, "%s/.cache/dptrain", h);
    else return dp_seterr(DP_ENOENT, "text: no cache folder: neither XDG_CACHE_HOME nor HOME is set");
    if (n < 0 || (size_t)n >= cap) return dp_seterr(DP_EINVAL, "text: cache folder path too long");
    return DP_OK;
}

int dp__cache_prefix(const char *what, const char *path, char *prefix, size_t cap) {
    char abs[PATH_MAX];
    if (!realpath(path, abs)) return dp_seterr(DP_EIO, "%s: %s: %s", what, path, strerror(errno));
    const char *base = strrchr(abs, '/');
    base = base && base[1] ? base + 1 : "root";
    char name[49];
    size_t k = 0;
    for (; base[k] && k < sizeof name - 1; k++) {
        char c = base[k];
        int keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                   c == '_' || (c == '.' && k > 0);
        name[k] = keep ? c : '_';
    }
    name[k] = 0;
    uint64_t ph = dp_fnv1a64(abs, strlen(abs), DP_FNV1A64_INIT);
    if (snprintf(prefix, cap, "%s-%016llx-", name, (unsigned long long)ph) >= (int)cap)
        return dp_seterr(DP_EINVAL, "%s: cache name too long", what);
    return DP_OK;
}

/* Calls fn on each file of cache named prefix*suffix other than own, with its path. */
static void each_other(const char *cache, const char *prefix, const char *suffix, const char *own,
                       void (*fn)(const char *path, void *arg), void *arg) {
    DIR *dh = opendir(cache);
    if (!dh) return;
    char path[4096];
    struct dirent *e;
    while ((e = readdir(dh))) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) || !dp__ends_with(e->d_name, suffix) ||
            !strcmp(e->d_name, own))
            continue;
        if (snprintf(path, sizeof path, "%s/%s", cache, e->d_name) >= (int)sizeof path) continue;
        fn(path, arg);
    }
    closedir(dh);
}

struct newest {
    struct timespec t;
    char *path;
    size_t cap;
    int found;
};

/* Strictly newer only: of files with the same mtime the first listed wins. */
static void keep_newest(const char *path, void *arg) {
    struct newest *n = arg;
    struct stat st;
    if (stat(path, &st) != 0 || !dp__ts_after(&st.st_mtim, &n->t)) return;
    if (snprintf(n->path, n->cap, "%s", path) >= (int)n->cap) return;
    n->t = st.st_mtim;
    n->found = 1;
}

int dp__cache_newest_other(const char *cache, const char *prefix, const char *suffix, const char *own,
                           char *path, size_t cap) {
    struct newest n = {{0, 0}, path, cap, 0};
    each_other(cache, prefix, suffix, own, keep_newest, &n);
    return n.found;
}

static void remove_one(const char *path, void *arg) {
    (void)arg;
    unlink(path);
}

void dp__cache_remove_others(const char *cache, const char *prefix, const char *suffix, const char *own) {
    each_other(cache, prefix, suffix, own, remove_one, NULL);
}
