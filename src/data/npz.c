/* NumPy's .npz archives (numpy.savez and savez_compressed): a zip file of .npy
 * members, one per array, named KEY.npy.  Debian's libzip reads the zip (stored
 * and deflated members alike); nothing here parses zip structures.
 *
 * A member cannot be memory-mapped where it lies (it may be compressed, and
 * libzip does not give its offset), so dp_npz_extract writes it once, as the
 * .npy it is, into the cache folder (data_impl.h):
 *
 *     CACHE/NAME-P-K.KEY.npy      K a hash of the archive's size and mtime
 *
 * and the dataset maps that (dp_dataset_open_npy): the same reader, the same
 * checks, and a member larger than memory still trains.  The copy is reused
 * while it is newer than the archive and the archive's size and mtime are
 * unchanged; older copies of the member are removed. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <zip.h>

#include "core/core_impl.h"
#include "data/data_impl.h"
#include "dp/core.h"
#include "dp/data.h"

/* At most this many members are listed in a message. */
#define NAMES_CAP 512

static int zip_err(const char *what, int code) {
    zip_error_t e;
    zip_error_init_with_code(&e, code);
    int rc = dp_seterr(code == ZIP_ER_NOENT ? DP_ENOENT : code == ZIP_ER_OPEN || code == ZIP_ER_READ ? DP_EIO
                                                                                                       : DP_EFORMAT,
                       "%s: %s", what, code == ZIP_ER_NOZIP ? "not an .npz (zip) archive"
                                       : code == ZIP_ER_NOENT ? "no such file" : zip_error_strerror(&e));
    zip_error_fini(&e);
    return rc;
}

/* The members named *.npy, without the suffix, comma-separated, into names;
 * a name's control characters (a zip's names are any bytes) shown as '?', so
 * the message stays one line. */
static void list_keys(zip_t *z, char *names, size_t cap) {
    size_t len = 0;
    names[0] = 0;
    zip_int64_t n = zip_get_num_entries(z, 0);
    for (zip_int64_t i = 0; i < n && len + 1 < cap; i++) {
        const char *nm = zip_get_name(z, (zip_uint64_t)i, 0);
        if (!nm || !dp__ends_with(nm, ".npy")) continue;
        int w = snprintf(names + len, cap - len, "%s%.*s", len ? ", " : "", (int)(strlen(nm) - 4), nm);
        if (w < 0 || (size_t)w >= cap - len) {
            names[len] = 0; /* (no name cut short: "xylophone" must not read as "x") */
            break;
        }
        for (size_t k = len; k < len + (size_t)w; k++)
            if ((unsigned char)names[k] < 0x20 || names[k] == 0x7f) names[k] = '?';
        len += (size_t)w;
    }
}

/* Member KEY.npy of z, its index into *idx and uncompressed size into *size. */
static int find_member(zip_t *z, const char *what, const char *key, zip_uint64_t *idx, zip_uint64_t *size) {
    char name[512];
    if (snprintf(name, sizeof name, "%s.npy", key) >= (int)sizeof name)
        return dp_seterr(DP_EINVAL, "%s: array name too long", what);
    zip_int64_t i = zip_name_locate(z, name, 0);
    if (i < 0) {
        char keys[NAMES_CAP];
        list_keys(z, keys, sizeof keys);
        return dp_seterr(DP_ENOENT, "%s: no array '%s' (it holds: %s)", what, key, keys[0] ? keys : "no .npy member");
    }
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat_index(z, (zip_uint64_t)i, 0, &st) != 0 || !(st.valid & ZIP_STAT_SIZE))
        return dp_seterr(DP_EFORMAT, "%s: member %s: %s", what, name, zip_strerror(z));
    *idx = (zip_uint64_t)i, *size = st.size;
    return DP_OK;
}

/* Reads member idx (size bytes once inflated) through fn(chunk) in pieces. */
static int read_member(zip_t *z, const char *what, const char *key, zip_uint64_t idx, zip_uint64_t size,
                       int (*fn)(void *arg, const void *p, size_t n), void *arg) {
    zip_file_t *f = zip_fopen_index(z, idx, 0);
    if (!f) return dp_seterr(DP_EFORMAT, "%s: array '%s': %s", what, key, zip_strerror(z));
    static const size_t CHUNK = 1 << 20;
    uint8_t *buf = dp_malloc(CHUNK);
    int rc = buf ? DP_OK : dp_seterr(DP_ENOMEM, "%s: out of memory", what);
    zip_uint64_t got = 0;
    while (!rc) {
        zip_int64_t n = zip_fread(f, buf, CHUNK);
        if (n < 0) rc = dp_seterr(DP_EFORMAT, "%s: array '%s': %s (a corrupt archive?)", what, key, zip_file_strerror(f));
        else if (n == 0) break;
        else if ((got += (zip_uint64_t)n) > size) rc = dp_seterr(DP_EFORMAT, "%s: array '%s' is longer than its entry says", what, key);
        else rc = fn(arg, buf, (size_t)n);
    }
    if (!rc && got != size)
        rc = dp_seterr(DP_EFORMAT, "%s: array '%s' holds %llu bytes, its entry says %llu (cut short?)", what, key,
                       (unsigned long long)got, (unsigned long long)size);
    dp_free(buf);
    zip_fclose(f);
    return rc;
}

/* ---- from a buffer: the fuzzer's entry point ------------------------------------------------ */

struct membuf {
    uint8_t *p;
    size_t len, cap;
};
static int to_mem(void *arg, const void *p, size_t n) {
    struct membuf *m = arg;
    if (m->len + n > m->cap) return dp_seterr(DP_EFORMAT, "npz: a member longer than its entry");
    memcpy(m->p + m->len, p, n);
    m->len += n;
    return DP_OK;
}

int dp_npz_parse(const uint8_t *buf, size_t len, const char *key, uint8_t **npy, size_t *npy_len) {
    *npy = NULL, *npy_len = 0;
    zip_error_t e;
    zip_error_init(&e);
    zip_source_t *src = zip_source_buffer_create(buf, len, 0, &e);
    zip_t *z = src ? zip_open_from_source(src, ZIP_RDONLY, &e) : NULL;
    if (!z) {
        int code = zip_error_code_zip(&e);
        if (src) zip_source_free(src);
        zip_error_fini(&e);
        return zip_err("npz", code);
    }
    zip_error_fini(&e);
    zip_uint64_t idx, size;
    int rc = find_member(z, "npz", key, &idx, &size);
    struct membuf m = {0};
    /* a member claims its size: no more than the archive could inflate to, bounded here */
    if (!rc && size > (zip_uint64_t)64 << 20) rc = dp_seterr(DP_EFORMAT, "npz: member too large for a buffer");
    if (!rc && !(m.p = dp_malloc((size_t)size + 1), m.cap = (size_t)size, m.p))
        rc = dp_seterr(DP_ENOMEM, "npz: out of memory");
    if (!rc) rc = read_member(z, "npz", key, idx, size, to_mem, &m);
    zip_discard(z); /* (frees src too) */
    if (rc) {
        dp_free(m.p);
        return rc;
    }
    *npy = m.p, *npy_len = m.len;
    return DP_OK;
}

/* ---- from a file, into the cache --------------------------------------------------------- */

static int to_file(void *arg, const void *p, size_t n) { return dp__atomic_write(arg, p, n); }

int dp_npz_extract(const char *npz, const char *key, const char *cache_dir, char *path, size_t cap, int *built) {
    if (built) *built = 0;
    struct stat st;
    if (stat(npz, &st) != 0)
        return dp_seterr(errno == ENOENT ? DP_ENOENT : DP_EIO, "%s: %s", npz,
                         errno == ENOENT ? "no such file" : strerror(errno));
    char cache[4096], prefix[80];
    int rc = cache_dir ? (snprintf(cache, sizeof cache, "%s", cache_dir), DP_OK) : dp_text_cache_dir(cache, sizeof cache);
    if (rc || (rc = dp__cache_prefix("npz", npz, prefix, sizeof prefix))) return rc;
    /* K: what the contents depend on, the archive's size and mtime */
    int64_t kv[3] = {(int64_t)st.st_size, (int64_t)st.st_mtim.tv_sec, (int64_t)st.st_mtim.tv_nsec};
    uint64_t k = dp_fnv1a64(kv, sizeof kv, DP_FNV1A64_INIT);
    /* the key in the file's name: as it is when made of [A-Za-z0-9_-] (numpy's usual keys), else
     * those characters and a hash of the whole key ("sub/x" must not reach another folder) */
    char safe[80];
    size_t kl = strlen(key), n = 0;
    int plain = kl > 0 && kl < 64;
    for (size_t i = 0; i < kl && n + 1 < 48; i++) {
        char c = key[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
        safe[n++] = ok ? c : '_';
        plain &= ok;
    }
    safe[n] = 0;
    if (!plain)
        snprintf(safe + n, sizeof safe - n, "-%08llx",
                 (unsigned long long)(dp_fnv1a64(key, kl, DP_FNV1A64_INIT) & 0xffffffffu));
    char own[256], suffix[300];
    snprintf(suffix, sizeof suffix, ".%s.npy", safe);
    if (snprintf(own, sizeof own, "%s%016llx%s", prefix, (unsigned long long)k, suffix) >= (int)sizeof own ||
        snprintf(path, cap, "%s/%s", cache, own) >= (int)cap)
        return dp_seterr(DP_EINVAL, "%s: cache path too long", npz);
    struct stat cs;
    if (stat(path, &cs) == 0 && S_ISREG(cs.st_mode) && dp__ts_after(&cs.st_mtim, &st.st_mtim)) return DP_OK;
    int err = 0;
    zip_t *z = zip_open(npz, ZIP_RDONLY, &err);
    if (!z) return zip_err(npz, err);
    zip_uint64_t idx, size;
    rc = find_member(z, npz, key, &idx, &size);
    if (!rc && dp__mkdir_p(cache, 0700) != 0) /* (0700: the XDG rule for a cache folder) */
        rc = dp_seterr(DP_EIO, "%s: cannot make the cache folder %s: %s", npz, cache, strerror(errno));
    struct dp__atomic a;
    if (!rc && !(rc = dp__atomic_open(&a, path, "npz"))) {
        rc = read_member(z, npz, key, idx, size, to_file, &a);
        rc = rc ? (dp__atomic_abort(&a), rc) : dp__atomic_commit(&a);
    }
    zip_discard(z);
    if (rc) return rc;
    dp__cache_remove_others(cache, prefix, suffix, own);
    if (built) *built = 1;
    return DP_OK;
}

int dp_npz_keys(const char *npz, char *names, size_t cap) {
    int err = 0;
    names[0] = 0;
    zip_t *z = zip_open(npz, ZIP_RDONLY, &err);
    if (!z) return zip_err(npz, err);
    list_keys(z, names, cap);
    zip_discard(z);
    return DP_OK;
}
