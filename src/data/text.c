/* Text data: the corpus, preparing token files (and their cache), the validation split
 * and windows (the token file itself: tokens.c).
 *
 * Windows.  A training window is ctx + 1 consecutive tokens of the training
 * part: the first ctx are the inputs, the last ctx the targets (each
 * position predicts the next token).  Its start is drawn from the
 * counter-based RNG keyed by (seed, DP_RNG_TEXT) at counter (epoch, global
 * sample index), so it depends on nothing else: not on the worker that fills
 * it, nor on how a global batch is cut into per-worker parts, nor on the
 * order in which windows are filled.  That is what keeps the equivalence and
 * determinism guarantees of the image path (docs/ddp.md) for text.
 * Windows are drawn with replacement; with N = train_n - ctx possible starts
 * the draw is r mod N for a 64-bit r, biased by less than N / 2^64. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core_impl.h"
#include "data/data_impl.h"
#include "dp/core.h"
#include "dp/data.h"

/* ---- the corpus ------------------------------------------------------------------- */

struct namelist {
    char **v;
    int n, cap;
};

static int names_add(struct namelist *l, const char *dir, const char *name) {
    if (l->n == l->cap) {
        int ncap = l->cap ? 2 * l->cap : 64;
        char **nv = dp_malloc(sizeof *nv * (size_t)ncap);
        if (!nv) return dp_seterr(DP_ENOMEM, "text: out of memory");
        if (l->n) memcpy(nv, l->v, sizeof *nv * (size_t)l->n);
        dp_free(l->v);
        l->v = nv;
        l->cap = ncap;
    }
    size_t need = (dir ? strlen(dir) + 1 : 0) + strlen(name) + 1;
    char *s = dp_malloc(need);
    if (!s) return dp_seterr(DP_ENOMEM, "text: out of memory");
    if (dir) snprintf(s, need, "%s/%s", dir, name);
    else snprintf(s, need, "%s", name);
    l->v[l->n++] = s;
    return DP_OK;
}

static void names_free(struct namelist *l) {
    for (int i = 0; i < l->n; i++) dp_free(l->v[i]);
    dp_free(l->v);
    memset(l, 0, sizeof *l);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* What list_dir leaves out by name besides non-regular entries. */
enum {
    SKIP_FORTUNE_INDEX = 1, /* *.dat and *.u8 */
    SKIP_TOKEN_FILE = 2,    /* DP_TEXT_DIR_TOKENS and its writer's temporaries */
};

/* Appends the regular files of dir to l, in strcmp order of their names.
 * Entries are examined without following symlinks: a link inside the folder
 * may point outside it or at a file already listed (the fortunes packages
 * ship every "x.u8" as a link to "x"), so only the folder's own regular
 * files count.  skip (SKIP_*) drops more by name. */
static int list_dir(struct namelist *l, const char *dir, int skip) {
    DIR *dh = opendir(dir);
    if (!dh) return dp_seterr(DP_EIO, "text: %s: cannot list: %s", dir, strerror(errno));
    struct namelist here = {0};
    int rc = DP_OK;
    struct dirent *e;
    while ((e = readdir(dh))) {
        if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2])))
            continue;
        if ((skip & SKIP_FORTUNE_INDEX) &&
            (dp__ends_with(e->d_name, ".dat") || dp__ends_with(e->d_name, ".u8")))
            continue;
        /* the token file, and "tokens.bin.tmp.<pid>.<n>" that a writer
         * (dp__write_file_atomic) killed before its rename left behind */
        if ((skip & SKIP_TOKEN_FILE) &&
            (!strcmp(e->d_name, DP_TEXT_DIR_TOKENS) ||
             !strncmp(e->d_name, DP_TEXT_DIR_TOKENS ".tmp.", strlen(DP_TEXT_DIR_TOKENS ".tmp."))))
            continue;
        struct stat st;
        if (fstatat(dirfd(dh), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        if ((rc = names_add(&here, NULL, e->d_name))) break;
    }
    closedir(dh);
    if (!rc && here.n) qsort(here.v, (size_t)here.n, sizeof *here.v, cmp_str);
    for (int i = 0; !rc && i < here.n; i++) rc = names_add(l, dir, here.v[i]);
    names_free(&here);
    return rc;
}

static int concat_files(struct dp_text_corpus *c, const struct namelist *files);

int dp_text_corpus_load(struct dp_text_corpus *c, const char *const *inputs, int n) {
    memset(c, 0, sizeof *c);
    struct namelist files = {0};
    int rc = DP_OK;
    if (n == 0) {
        struct stat st;
        if (stat(DP_TEXT_DEFAULT_CORPUS, &st) != 0 || !S_ISDIR(st.st_mode))
            return dp_seterr(DP_ENOENT,
                             "text: default corpus %s not found (install the Debian packages "
                             "fortunes fortunes-min: scripts/install-deps.sh)",
                             DP_TEXT_DEFAULT_CORPUS);
        rc = list_dir(&files, DP_TEXT_DEFAULT_CORPUS, SKIP_FORTUNE_INDEX);
        if (!rc && files.n == 0)
            rc = dp_seterr(DP_EINVAL, "text: empty input: no files in %s", DP_TEXT_DEFAULT_CORPUS);
    }
    for (int i = 0; !rc && i < n; i++) {
        struct stat st;
        if (stat(inputs[i], &st) != 0) {
            if (errno == ENOENT)
                rc = dp_seterr(DP_ENOENT, "text: %s: no such file or directory", inputs[i]);
            else
                rc = dp_seterr(DP_EIO, "text: %s: %s", inputs[i], strerror(errno));
        } else if (S_ISDIR(st.st_mode)) {
            int before = files.n;
            rc = list_dir(&files, inputs[i], 0);
            if (!rc && files.n == before)
                rc = dp_seterr(DP_EINVAL, "text: empty input: no regular files in %s", inputs[i]);
        } else if (S_ISREG(st.st_mode)) {
            rc = names_add(&files, NULL, inputs[i]);
        } else {
            rc = dp_seterr(DP_EINVAL, "text: %s: not a regular file or folder", inputs[i]);
        }
    }
    if (rc) {
        names_free(&files);
        return rc;
    }
    rc = concat_files(c, &files);
    names_free(&files);
    return rc;
}

/* c = the files of the list, concatenated in the order listed. */
static int concat_files(struct dp_text_corpus *c, const struct namelist *files) {
    int rc = DP_OK;
    uint8_t *all = NULL;
    size_t len = 0, cap = 0;
    for (int i = 0; !rc && i < files->n; i++) {
        int fd;
        size_t size;
        uint8_t *b;
        size_t blen;
        if ((rc = dp__open_regular("text", files->v[i], &fd, &size))) break;
        rc = dp__read_fd(fd, "text", files->v[i], size, &b, &blen);
        close(fd);
        if (rc) break;
        if (len + blen > cap) {
            size_t ncap = cap ? cap : 1 << 16;
            while (ncap < len + blen) ncap *= 2;
            uint8_t *na = dp_malloc(ncap);
            if (!na) {
                dp_free(b);
                rc = dp_seterr(DP_ENOMEM, "text: cannot allocate %zu bytes", ncap);
                break;
            }
            if (len) memcpy(na, all, len);
            dp_free(all);
            all = na;
            cap = ncap;
        }
        if (blen) memcpy(all + len, b, blen);
        len += blen;
        dp_free(b);
    }
    if (!rc && len == 0)
        rc = dp_seterr(DP_EINVAL, "text: empty input: %d file%s, 0 bytes", files->n,
                       files->n == 1 ? "" : "s");
    if (rc) {
        dp_free(all);
        return rc;
    }
    c->bytes = all;
    c->len = len;
    c->nfiles = files->n;
    return DP_OK;
}

void dp_text_corpus_free(struct dp_text_corpus *c) {
    if (!c) return;
    dp_free(c->bytes);
    memset(c, 0, sizeof *c);
}

/* ---- preparing a token file ------------------------------------------------------ */

static void prepared_set(struct dp_text_prepared *info, int built, const struct dp_text_corpus *c,
                         int64_t tokens, const char *why) {
    if (!info) return;
    memset(info, 0, sizeof *info);
    info->built = built;
    info->nfiles = c->nfiles;
    info->tokens = tokens;
    snprintf(info->why, sizeof info->why, "%s", why);
}

/* Corpus -> byte-level tokens -> token file (atomic). */
static int write_corpus(const struct dp_text_corpus *c, const char *out) {
    struct dp_tokens t;
    int rc = dp_tokens_from_bytes(&t, c->bytes, c->len);
    if (rc) return rc;
    rc = dp_tokens_write(out, t.tok, t.n, t.vocab);
    dp_tokens_free(&t);
    return rc;
}

int dp_text_prepare(const char *const *inputs, int n, const char *out, struct dp_text_prepared *info) {
    if (info) memset(info, 0, sizeof *info);
    if (!out || !*out) return dp_seterr(DP_EINVAL, "text: no token file to write");
    struct dp_text_corpus c;
    int rc = dp_text_corpus_load(&c, inputs, n);
    if (rc) return rc;
    if (!(rc = write_corpus(&c, out))) prepared_set(info, 1, &c, (int64_t)c.len, "");
    dp_text_corpus_free(&c);
    return rc;
}

/* Why a folder's token file at path cannot be reused, into why[0..cap) (""
 * when it can); label names it in the reason ("tokens.bin", "the cached
 * token file").  It must be a valid token file (every check of
 * dp_tokens_read) of byte level tokens, hold as many tokens as the sources
 * have bytes (a source removed, or truncated, shows here: a removal touches
 * no source's mtime), and be strictly newer than every source (a source
 * written in the same clock tick as the token file counts as newer:
 * rebuilding is the safe side of a tie). */
static int stale_reason(const char *path, const char *label, const struct namelist *src, char *why,
                        size_t cap, int64_t *tokens) {
    why[0] = 0;
    *tokens = 0;
    struct stat tst;
    if (stat(path, &tst) != 0) {
        if (errno != ENOENT && errno != ENOTDIR && errno != EACCES)
            return dp_seterr(DP_EIO, "text: %s: %s", path, strerror(errno));
        snprintf(why, cap, "no %s yet", label);
        return DP_OK;
    }
    int64_t bytes = 0;
    for (int i = 0; i < src->n; i++) {
        struct stat st;
        if (stat(src->v[i], &st) != 0)
            return dp_seterr(DP_EIO, "text: %s: %s", src->v[i], strerror(errno));
        bytes += (int64_t)st.st_size;
        if (!why[0] && !dp__ts_after(&tst.st_mtim, &st.st_mtim))
            snprintf(why, cap, "%s is newer than %s", src->v[i], label);
    }
    if (why[0]) return DP_OK;
    struct dp_tokens t;
    if (dp_tokens_read(path, &t) != DP_OK) {
        snprintf(why, cap, "%s", dp_errmsg());
        return DP_OK;
    }
    if (t.vocab != DP_TOKENS_VOCAB_BYTES)
        snprintf(why, cap, "%s has vocab %lld, not byte-level", label, (long long)t.vocab);
    else if (t.n != bytes)
        snprintf(why, cap, "%s holds %lld tokens, the sources %lld bytes", label, (long long)t.n,
                 (long long)bytes);
    *tokens = t.n;
    dp_tokens_free(&t);
    return DP_OK;
}

/* ---- preparing a folder: its token file in the cache ------------------------------ */

/* Where dp_text_prepare_dir keeps what it prepares, and why not in the
 * folder itself: the folder is the user's (a checkout, a read-only mount, a
 * shared data set), and a file written into it is a surprise at best and a
 * failure at worst.  Each folder's token file is
 *
 *     CACHE/NAME-P-C.tokens
 *
 * NAME the folder's own name (for a person listing the cache), P a 64-bit
 * FNV-1a hash of its absolute path (symlinks resolved), C one of its
 * sources (each one's name, size and mtime, in name order).  A changed
 * source is then a new file name, even where the validity checks alone
 * would not notice (a file replaced by one of the same size with an older
 * mtime, as cp -p or a checkout may leave); the checks of stale_reason still
 * apply to the file found.  When a new file is written, the folder's older
 * ones (same NAME-P-, other C) are removed, so the cache holds one file per
 * folder.  The cache folder and its naming are shared with csv.c (cache.c,
 * data_impl.h). */

/* The cache file of folder dir with sources src (listed as "dir/name"):
 * prefix = "NAME-P-" (the folder's files, whatever their C), file =
 * cache/prefix C.tokens. */
static int cache_file(const char *dir, const char *cache, const struct namelist *src, char *prefix,
                      size_t pcap, char *file, size_t fcap) {
    int rc = dp__cache_prefix("text", dir, prefix, pcap);
    if (rc) return rc;
    uint64_t ch = DP_FNV1A64_INIT;
    size_t dlen = strlen(dir);
    for (int i = 0; i < src->n; i++) {
        struct stat st;
        if (stat(src->v[i], &st) != 0) return dp_seterr(DP_EIO, "text: %s: %s", src->v[i], strerror(errno));
        const char *nm = src->v[i] + dlen + 1; /* list_dir's "dir/name" */
        int64_t v[3] = {(int64_t)st.st_size, (int64_t)st.st_mtim.tv_sec, (int64_t)st.st_mtim.tv_nsec};
        ch = dp_fnv1a64(nm, strlen(nm) + 1, ch);
        ch = dp_fnv1a64(v, sizeof v, ch);
    }
    if (snprintf(file, fcap, "%s/%s%016llx.tokens", cache, prefix, (unsigned long long)ch) >= (int)fcap)
        return dp_seterr(DP_EINVAL, "text: cache path too long: %s", cache);
    return DP_OK;
}

/* The folder's other token files in the cache (prefix, not file): why the
 * one for these sources is missing, from the newest of them ("" when there
 * is none); with remove, they are deleted instead. */
static void cache_siblings(const char *cache, const char *prefix, const char *file,
                           const struct namelist *src, char *why, size_t cap, int remove) {
    if (why) why[0] = 0;
    const char *own = strrchr(file, '/') + 1;
    char path[4096];
    int64_t have;
    if (remove)
        dp__cache_remove_others(cache, prefix, ".tokens", own);
    else if (dp__cache_newest_other(cache, prefix, ".tokens", own, path, sizeof path) &&
             stale_reason(path, "the cached token file", src, why, cap, &have) == DP_OK && !why[0])
        snprintf(why, cap, "a source was renamed or replaced since the cached token file was written");
}

int dp_text_prepare_dir(const char *dir, char *path, size_t cap, struct dp_text_prepared *info) {
    return dp_text_prepare_dir_in(dir, NULL, path, cap, info);
}

int dp_text_prepare_dir_in(const char *dir, const char *cache, char *path, size_t cap,
                           struct dp_text_prepared *info) {
    if (info) memset(info, 0, sizeof *info);
    if (!dir || !path || cap == 0) return dp_seterr(DP_EINVAL, "text: NULL argument");
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno == ENOENT) return dp_seterr(DP_ENOENT, "text: %s: no such file or folder", dir);
        return dp_seterr(DP_EIO, "text: %s: %s", dir, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode)) return dp_seterr(DP_EINVAL, "text: %s is not a folder", dir);
    char legacy[4096], cdir[4096], cpath[4096], prefix[128];
    if (snprintf(legacy, sizeof legacy, "%s/%s", dir, DP_TEXT_DIR_TOKENS) >= (int)sizeof legacy)
        return dp_seterr(DP_EINVAL, "text: path too long: %s/%s", dir, DP_TEXT_DIR_TOKENS);
    struct namelist src = {0};
    int rc = list_dir(&src, dir, SKIP_FORTUNE_INDEX | SKIP_TOKEN_FILE);
    if (!rc && src.n == 0)
        rc = dp_seterr(DP_EINVAL, "text: empty input: no text files in %s (%s, *.dat and *.u8 do not count)",
                       dir, DP_TEXT_DIR_TOKENS);
    /* No cache folder (no HOME) is no error yet: the folder itself may do. */
    char cerr[512] = "";
    int have_cache = 0;
    if (!rc) {
        if (cache && snprintf(cdir, sizeof cdir, "%s", cache) >= (int)sizeof cdir)
            rc = dp_seterr(DP_EINVAL, "text: cache path too long: %s", cache);
        else if (cache) have_cache = 1;
        else if (dp_text_cache_dir(cdir, sizeof cdir) == DP_OK) have_cache = 1;
        else snprintf(cerr, sizeof cerr, "%s", dp_errmsg());
        if (have_cache) rc = cache_file(dir, cdir, &src, prefix, sizeof prefix, cpath, sizeof cpath);
    }
    char why[sizeof info->why] = "", whyl[sizeof info->why];
    int64_t have = 0;
    const char *found = NULL; /* the token file reused */
    /* 1. the folder's token file in the cache, for these sources */
    if (!rc && have_cache) {
        rc = stale_reason(cpath, "the cached token file", &src, why, sizeof why, &have);
        if (!rc && !why[0]) found = cpath;
        else if (!rc && access(cpath, F_OK) != 0)
            cache_siblings(cdir, prefix, cpath, &src, why, sizeof why, 0);
    }
    /* 2. DIR/tokens.bin, as an older dptrain wrote it (or step 3 when the
     * cache could not be written): read while valid, never written here
     * when the cache can be */
    if (!rc && !found && access(legacy, F_OK) == 0) {
        rc = stale_reason(legacy, DP_TEXT_DIR_TOKENS, &src, whyl, sizeof whyl, &have);
        if (!rc && !whyl[0]) found = legacy;
        else if (!rc && !why[0]) snprintf(why, sizeof why, "%s", whyl);
    }
    if (rc || found) {
        if (!rc && snprintf(path, cap, "%s", found) >= (int)cap)
            rc = dp_seterr(DP_EINVAL, "text: path too long: %s", found);
        if (!rc) {
            struct dp_text_corpus none = {.nfiles = src.n};
            prepared_set(info, 0, &none, have, "");
            if (info) info->in_dir = found == legacy;
        }
        names_free(&src);
        return rc;
    }
    if (!why[0]) snprintf(why, sizeof why, "no token file of %s in the cache yet", dir);
    /* 3. build: into the cache, else into the folder */
    struct dp_text_corpus c;
    rc = concat_files(&c, &src);
    if (rc) {
        names_free(&src);
        return rc;
    }
    const char *out = NULL;
    if (have_cache) {
        if (dp__mkdir_p(cdir, 0700) != 0) /* (0700: the XDG rule for a cache folder) */
            snprintf(cerr, sizeof cerr, "cannot create %.400s: %s", cdir, strerror(errno));
        else if (write_corpus(&c, cpath) != DP_OK)
            snprintf(cerr, sizeof cerr, "%s", dp_errmsg());
        else
            out = cpath, cache_siblings(cdir, prefix, cpath, &src, NULL, 0, 1);
    }
    if (!out) {
        char lerr[512] = "";
        if (write_corpus(&c, legacy) == DP_OK) out = legacy;
        else snprintf(lerr, sizeof lerr, "%s", dp_errmsg());
        if (!out)
            rc = dp_seterr(DP_EIO,
                           "text: cannot write the token file of %s, neither in the cache (%s) nor in the "
                           "folder (%s): set XDG_CACHE_HOME to a writable folder, or run 'dptrain "
                           "prepare-text %s --out FILE' and pass --data FILE",
                           dir, cerr, lerr, dir);
    }
    if (!rc && snprintf(path, cap, "%s", out) >= (int)cap)
        rc = dp_seterr(DP_EINVAL, "text: path too long: %s", out);
    if (!rc) {
        prepared_set(info, 1, &c, (int64_t)c.len, why);
        if (info) {
            info->in_dir = out == legacy;
            if (out == legacy) snprintf(info->cache_error, sizeof info->cache_error, "%s", cerr);
        }
    }
    dp_text_corpus_free(&c);
    names_free(&src);
    return rc;
}

/* ---- split and windows ---------------------------------------------------------- */

int dp_text_split_init(struct dp_text_split *s, int64_t n, double val_frac) {
    memset(s, 0, sizeof *s);
    if (n < 1) return dp_seterr(DP_EINVAL, "text: split of %lld tokens", (long long)n);
    if (!(val_frac >= 0 && val_frac < 1))
        return dp_seterr(DP_EINVAL, "text: validation fraction %g not in [0, 1)", val_frac);
    /* floor(n * f) < n since f < 1 (and n < 2^53 is exact in a double) */
    int64_t v = (int64_t)floor((double)n * val_frac);
    if (v >= n) v = n - 1;
    s->val_n = v;
    s->train_n = n - v;
    return DP_OK;
}

int64_t dp_text_window_start(uint64_t seed, int64_t epoch, int64_t index, int64_t ctx,
                             int64_t train_n) {
    if (ctx < 1 || train_n < ctx + 1) return -1;
    uint64_t starts = (uint64_t)(train_n - ctx); /* 0 .. train_n - ctx - 1 */
    uint32_t o[4];
    dp_rng_philox(seed, DP_RNG_TEXT, (uint64_t)epoch, (uint64_t)index, o);
    uint64_t r = (uint64_t)o[0] << 32 | o[1];
    return (int64_t)(r % starts);
}

/* x[i] = tok[s .. s+ctx), y[i] = tok[s+1 .. s+ctx+1) */
static void copy_window(const uint16_t *tok, int64_t s, int64_t ctx, int32_t *x, int32_t *y) {
    for (int64_t j = 0; j < ctx; j++) {
        x[j] = tok[s + j];
        y[j] = tok[s + j + 1];
    }
}

static int check_args(const struct dp_tokens *t, const struct dp_text_split *s, int64_t ctx,
                      int64_t first, int64_t count, const int32_t *x, const int32_t *y) {
    if (!t || !s || !t->tok || (count > 0 && (!x || !y)))
        return dp_seterr(DP_EINVAL, "text: NULL argument");
    if (ctx < 1) return dp_seterr(DP_EINVAL, "text: ctx %lld < 1", (long long)ctx);
    if (first < 0 || count < 0)
        return dp_seterr(DP_EINVAL, "text: windows %lld + %lld", (long long)first, (long long)count);
    if (s->train_n < 0 || s->val_n < 0 || s->train_n + s->val_n > t->n)
        return dp_seterr(DP_EINVAL, "text: split %lld + %lld exceeds the %lld tokens",
                         (long long)s->train_n, (long long)s->val_n, (long long)t->n);
    return DP_OK;
}

int dp_text_fill_train(const struct dp_tokens *t, const struct dp_text_split *s, int64_t ctx,
                       uint64_t seed, int64_t epoch, int64_t first, int64_t count, int32_t *x,
                       int32_t *y) {
    int rc = check_args(t, s, ctx, first, count, x, y);
    if (rc) return rc;
    if (s->train_n < ctx + 1)
        return dp_seterr(DP_EINVAL,
                         "text: the training part holds %lld tokens, a window needs ctx + 1 = %lld",
                         (long long)s->train_n, (long long)(ctx + 1));
    for (int64_t i = 0; i < count; i++) {
        int64_t st = dp_text_window_start(seed, epoch, first + i, ctx, s->train_n);
        copy_window(t->tok, st, ctx, x + i * ctx, y + i * ctx);
    }
    return DP_OK;
}

int64_t dp_text_val_windows(const struct dp_text_split *s, int64_t ctx) {
    if (ctx < 1 || s->val_n < 1) return 0;
    return (s->val_n - 1) / ctx;
}

int dp_text_fill_val(const struct dp_tokens *t, const struct dp_text_split *s, int64_t ctx,
                     int64_t first, int64_t count, int32_t *x, int32_t *y) {
    int rc = check_args(t, s, ctx, first, count, x, y);
    if (rc) return rc;
    int64_t nw = dp_text_val_windows(s, ctx);
    if (first + count > nw)
        return dp_seterr(DP_EINVAL, "text: validation windows %lld..%lld, only %lld exist",
                         (long long)first, (long long)(first + count - 1), (long long)nw);
    for (int64_t i = 0; i < count; i++)
        copy_window(t->tok, s->train_n + (first + i) * ctx, ctx, x + i * ctx, y + i * ctx);
    return DP_OK;
}
