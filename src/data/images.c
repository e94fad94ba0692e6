/* Folders of images, DIR/<class>/<image>.png|.jpg|.jpeg, turned into two
 * .npy arrays and a list of class names in the cache (dp/data.h, "image
 * folders", has the format, the options and every message):
 *
 *     CACHE/NAME-P-K.x.npy        (N, C, H, W) uint8
 *     CACHE/NAME-P-K.y.npy        (N) int64, the class of each image
 *     CACHE/NAME-P-K.classes.txt  the class names, one a line, in class order
 *
 * The listing: DIR's subfolders in strcmp order are the classes, each
 * one's image files in strcmp order its images (scandir).  K hashes every
 * image's path, size and mtime, so any change to the set is a new K.
 *
 * The build decodes (image.c) in two passes over the listing, each split
 * into contiguous blocks of images, one per thread:
 *   1. headers only: each image's size and whether it has colour (what the
 *      default C and the check that all sizes agree need), and the bad ones;
 *   2. the pixels: the good images of pass 1 are the slots of x, and each
 *      thread writes its images' C x H x W bytes into x's temporary file at
 *      their slot (pwrite), holding one image at a time: a set larger than
 *      memory builds.  The images that fail only now (skip_bad) leave
 *      holes, closed by moving the ones after them down; the header,
 *      written last, was sized for the larger count and is padded to it.
 *      The file is then truncated, fsync'ed and renamed over the target
 *      (dp__atomic_*).
 * What a thread writes depends only on its images, and the error reported
 * is the first in image order, so the result is the same for any number of
 * threads. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core_impl.h"
#include "data/data_impl.h"
#include "dp/core.h"
#include "dp/data.h"

/* Bumped when the arrays' layout or the decoding changes: it is part of K. */
#define IMAGES_CACHE_VERSION 1

struct dp_images_opts dp_images_default_opts(void) {
    return (struct dp_images_opts){0};
}

/* ---- the folder's listing --------------------------------------------------------- */

struct item {
    int64_t name;           /* its path under DIR, "class/file", at L->names + name */
    int32_t cls;
    int bad;                /* skipped (skip_bad) */
    int64_t size, mtime_s, mtime_ns;
    int64_t h, w;           /* pass 1 */
    int colour;
};

struct listing {
    const char *dir;        /* as given */
    char *names;            /* (nnames) NUL-terminated strings */
    size_t nnames, cnames;
    int64_t *classes;       /* (nclasses) the class names' offsets into names */
    int64_t nclasses;
    struct item *it;        /* (n) images, class by class, each class's in strcmp order */
    int64_t n, cap;
};

/* Appends s[0..len) and a NUL to L->names: its offset, or -1 out of memory. */
static int64_t add_name(struct listing *L, const char *s, size_t len) {
    if (L->nnames + len + 1 > L->cnames) {
        size_t cap = L->cnames ? 2 * L->cnames : 1 << 16;
        while (cap < L->nnames + len + 1) cap *= 2;
        char *b = dp_malloc(cap);
        if (!b) return -1;
        if (L->nnames) memcpy(b, L->names, L->nnames);
        dp_free(L->names);
        L->names = b, L->cnames = cap;
    }
    memcpy(L->names + L->nnames, s, len);
    L->names[L->nnames + len] = 0;
    L->nnames += len + 1;
    return (int64_t)(L->nnames - len - 1);
}

static int by_name(const struct dirent **a, const struct dirent **b) {
    return strcmp((*a)->d_name, (*b)->d_name);
}
static int not_hidden(const struct dirent *e) { return e->d_name[0] != '.'; }

/* An image by its name: not hidden, ending in .png, .jpg or .jpeg (any case). */
static int image_name(const struct dirent *e) {
    const char *x = strrchr(e->d_name, '.');
    return e->d_name[0] != '.' && x &&
           (!strcasecmp(x, ".png") || !strcasecmp(x, ".jpg") || !strcasecmp(x, ".jpeg"));
}

static void listing_free(struct listing *L) {
    dp_free(L->names);
    dp_free(L->classes);
    dp_free(L->it);
    memset(L, 0, sizeof *L);
}

static void free_names(struct dirent **e, int n) {
    for (int i = 0; i < n; i++) free(e[i]);
    free(e);
}

/* Lists DIR's classes and images (symlinks followed, hidden names, other
 * files and nested folders left out). */
static int list_folder(const char *dir, struct listing *L) {
    struct stat st;
    if (stat(dir, &st) != 0)
        return dp_seterr(errno == ENOENT ? DP_ENOENT : DP_EIO, "%s: %s", dir,
                         errno == ENOENT ? "no such folder" : strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return dp_seterr(DP_EINVAL, "%s: not a folder (expected DIR/<class>/<image>.png|.jpg|.jpeg)", dir);
    struct dirent **sub;
    int nsub = scandir(dir, &sub, not_hidden, by_name), rc = DP_OK;
    if (nsub < 0) return dp_seterr(DP_EIO, "%s: cannot list: %s", dir, strerror(errno));
    char path[8192], empty[4096] = "";
    int nclasses = 0;
    for (int s = 0; s < nsub; s++) { /* the folders (the classes) kept, the rest dropped */
        snprintf(path, sizeof path, "%s/%s", dir, sub[s]->d_name);
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) nclasses++;
        else free(sub[s]), sub[s] = NULL;
    }
    if (nclasses > DP_DATASET_MAX_CLASSES)
        rc = dp_seterr(DP_EINVAL, "%s: more than %d classes (subfolders)", dir, DP_DATASET_MAX_CLASSES);
    else if (!(L->classes = dp_malloc(sizeof *L->classes * (size_t)(nclasses + 1))))
        rc = dp_seterr(DP_ENOMEM, "%s: out of memory", dir);
    for (int s = 0; s < nsub && !rc; s++) {
        if (!sub[s]) continue;
        snprintf(path, sizeof path, "%s/%s", dir, sub[s]->d_name);
        if (strpbrk(sub[s]->d_name, "\n\r")) {
            rc = dp_seterr(DP_EINVAL, "%s: a class folder name with a line break", path);
            break;
        }
        struct dirent **f;
        int nf = scandir(path, &f, image_name, by_name), got = 0;
        if (nf < 0) {
            rc = dp_seterr(DP_EIO, "%s: cannot list: %s", path, strerror(errno));
            break;
        }
        int64_t cname = add_name(L, sub[s]->d_name, strlen(sub[s]->d_name));
        int oom = cname < 0;
        for (int i = 0; i < nf && !oom; i++) {
            int n = snprintf(path, sizeof path, "%s/%s/%s", dir, sub[s]->d_name, f[i]->d_name);
            if (n >= (int)sizeof path || stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
            if (L->n == L->cap) {
                int64_t cap = L->cap ? 2 * L->cap : 1024;
                struct item *it = dp_malloc(sizeof *it * (size_t)cap);
                if (!(oom = !it)) {
                    if (L->n) memcpy(it, L->it, sizeof *it * (size_t)L->n);
                    dp_free(L->it);
                    L->it = it, L->cap = cap;
                }
            }
            int64_t name = oom ? -1 : add_name(L, path + strlen(dir) + 1, (size_t)n - strlen(dir) - 1);
            if ((oom = name < 0)) break;
            L->it[L->n++] = (struct item){name, (int32_t)L->nclasses, 0, (int64_t)st.st_size,
                                          (int64_t)st.st_mtim.tv_sec, (int64_t)st.st_mtim.tv_nsec, 0, 0, 0};
            got++;
        }
        if (oom) rc = dp_seterr(DP_ENOMEM, "%s: out of memory listing it", dir);
        free_names(f, nf);
        if (!rc && !got && !empty[0]) snprintf(empty, sizeof empty, "%s/%s", dir, sub[s]->d_name);
        if (!rc) L->classes[L->nclasses++] = cname;
    }
    free_names(sub, nsub);
    if (!rc && L->n == 0)
        rc = dp_seterr(DP_EINVAL,
                       "%s: no images: expected %s/<class>/<image>.png|.jpg|.jpeg (a subfolder per class)", dir,
                       dir);
    if (!rc && empty[0])
        rc = dp_seterr(DP_EINVAL,
                       "%s: a class folder with no images (*.png, *.jpg, *.jpeg): remove it or add images "
                       "(an empty class would shift the class numbers)",
                       empty);
    return rc;
}

/* ---- the two passes, over threads -------------------------------------------------- */

struct job {
    const struct listing *L;
    const struct dp_images_opts *o;
    int pass;                 /* 1: headers, 2: pixels */
    /* pass 2 */
    int C;
    int64_t H, W;
    const int64_t *slot_item; /* (slots) the image of each slot of x */
    int fd;                   /* x's temporary file, its data from byte `data` on */
    const char *tmp;
    size_t data;
};

/* A contiguous block of a pass: items (pass 1) or slots (pass 2) [lo, hi). */
struct worker {
    struct job *J;
    int64_t lo, hi;
    int rc;                   /* the failure that stops the build, at item err_at */
    int64_t err_at, bad_at;   /* bad_at: the first image skipped (skip_bad), -1 if none */
    char err[512], bad[512];
};

static int pwrite_all(int fd, const uint8_t *p, size_t n, size_t off) {
    while (n) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        p += w, n -= (size_t)w, off += (size_t)w;
    }
    return 0;
}

static void *work(void *arg) {
    struct worker *k = arg;
    const struct job *J = k->J;
    const struct listing *L = J->L;
    const size_t chw = (size_t)(J->C * J->H * J->W);
    uint8_t *buf = J->pass == 2 ? dp_malloc(chw) : NULL;
    char path[8192];
    if (J->pass == 2 && !buf) k->rc = dp_seterr(DP_ENOMEM, "%s: out of memory", L->dir), k->err_at = k->lo;
    for (int64_t s = k->lo; s < k->hi && !k->rc; s++) {
        int64_t i = J->pass == 1 ? s : J->slot_item[s];
        struct item *t = &L->it[i];
        snprintf(path, sizeof path, "%s/%s", L->dir, L->names + t->name);
        FILE *f = fopen(path, "rb");
        int rc = f ? DP_OK : dp_seterr(errno == ENOENT ? DP_ENOENT : DP_EIO, "%s: %s", path, strerror(errno));
        if (f && J->pass == 1) {
            rc = dp__image_header(f, path, &t->h, &t->w, &t->colour);
        } else if (f && !(rc = dp__image_decode_file(f, path, J->C, J->H, J->W, buf)) &&
                   pwrite_all(J->fd, buf, chw, J->data + (size_t)s * chw)) {
            rc = dp_seterr(DP_EIO, "images: cannot write %s: %s", J->tmp, strerror(errno));
        }
        if (f) fclose(f);
        if (rc == DP_EFORMAT && J->o->skip_bad) {
            if (k->bad_at < 0) k->bad_at = i, snprintf(k->bad, sizeof k->bad, "%s", dp_errmsg());
            t->bad = 1;
        } else if (rc) {
            k->rc = rc, k->err_at = i;
        }
    }
    if (k->rc) snprintf(k->err, sizeof k->err, "%s", dp_errmsg());
    dp_free(buf);
    return NULL;
}

/* Runs pass J->pass over [0, count) in up to `threads` contiguous blocks:
 * the first failure in image order (its message set), or 0; info's first
 * skipped image updated. */
static int run_pass(struct job *J, int64_t count, int threads, struct dp_images_info *info,
                    int64_t *first_bad) {
    int T = (int)(threads < count ? threads : count);
    struct worker *k = dp_calloc((size_t)T, sizeof *k);
    pthread_t *th = dp_calloc((size_t)T, sizeof *th);
    char *started = dp_calloc((size_t)T, 1);
    if (!k || !th || !started) {
        dp_free(k), dp_free(th), dp_free(started);
        return dp_seterr(DP_ENOMEM, "%s: out of memory", J->L->dir);
    }
    for (int t = 0; t < T; t++) {
        k[t] = (struct worker){J, count * t / T, count * (t + 1) / T, 0, -1, -1, "", ""};
        /* block 0 runs here, after the others started; a thread that cannot start runs here too */
        started[t] = t > 0 && dp__thread_start(&th[t], "dp-images", work, &k[t]) == 0;
    }
    for (int t = 0; t < T; t++)
        if (!started[t]) work(&k[t]);
    int rc = DP_OK, first = -1;
    for (int t = 0; t < T; t++) {
        if (started[t]) pthread_join(th[t], NULL);
        if (k[t].rc && first < 0) first = t, rc = k[t].rc; /* blocks are in image order */
        if (k[t].bad_at >= 0 && (*first_bad < 0 || k[t].bad_at < *first_bad)) {
            *first_bad = k[t].bad_at;
            snprintf(info->first_bad, sizeof info->first_bad, "%s/%s", J->L->dir,
                     J->L->names + J->L->it[k[t].bad_at].name);
            snprintf(info->first_bad_error, sizeof info->first_bad_error, "%s", k[t].bad);
        }
    }
    if (rc) dp_seterr(rc, "%s", k[first].err);
    dp_free(k);
    dp_free(th);
    dp_free(started);
    return rc;
}

/* ---- the cache ------------------------------------------------------------------- */

struct cache_names {
    char dir[4096], prefix[128], own[3][256]; /* own: x's, y's, the classes' base names */
};
static const char *const suffix[3] = {".x.npy", ".y.npy", ".classes.txt"};

/* The cache's paths for the listing under o: K hashes the options that
 * change the arrays and every image's path, size and mtime. */
static int cache_names(const struct listing *L, const struct dp_images_opts *o, struct cache_names *c,
                       struct dp_images_info *info) {
    int rc;
    if (o->cache_dir) {
        if (snprintf(c->dir, sizeof c->dir, "%s", o->cache_dir) >= (int)sizeof c->dir)
            return dp_seterr(DP_EINVAL, "images: cache folder path too long: %s", o->cache_dir);
    } else if ((rc = dp_text_cache_dir(c->dir, sizeof c->dir))) {
        if (rc == DP_ENOENT)
            dp_seterr(rc,
                      "images: %s: no cache folder for its arrays: neither XDG_CACHE_HOME nor HOME is set",
                      L->dir);
        return rc;
    }
    if ((rc = dp__cache_prefix("images", L->dir, c->prefix, sizeof c->prefix))) return rc;
    int64_t head[5] = {IMAGES_CACHE_VERSION, o->channels, o->height, o->width, o->skip_bad};
    uint64_t k = dp_fnv1a64(head, sizeof head, DP_FNV1A64_INIT);
    for (int64_t i = 0; i < L->n; i++) {
        const struct item *t = &L->it[i];
        int64_t v[3] = {t->size, t->mtime_s, t->mtime_ns};
        k = dp_fnv1a64(L->names + t->name, strlen(L->names + t->name) + 1, k);
        k = dp_fnv1a64(v, sizeof v, k);
    }
    char *out[3] = {info->x_path, info->y_path, info->classes_path};
    for (int i = 0; i < 3; i++) {
        snprintf(c->own[i], sizeof c->own[i], "%s%016llx%s", c->prefix, (unsigned long long)k, suffix[i]);
        if (snprintf(out[i], sizeof info->x_path, "%s/%s", c->dir, c->own[i]) >= (int)sizeof info->x_path)
            return dp_seterr(DP_EINVAL, "images: cache path too long: %s", c->dir);
    }
    return DP_OK;
}

/* A small text file read whole, NUL-terminated. */
static int read_text(const char *path, char **text, size_t *len) {
    int fd;
    size_t size;
    uint8_t *buf;
    int rc = dp__open_regular("images", path, &fd, &size);
    if (rc) return rc;
    rc = dp__read_fd(fd, "images", path, size + 1, &buf, len);
    close(fd);
    if (rc) return rc;
    if (!(*text = dp_malloc(*len + 1))) rc = dp_seterr(DP_ENOMEM, "images: %s: out of memory", path);
    else memcpy(*text, buf, *len), (*text)[*len] = 0;
    dp_free(buf);
    return rc;
}

/* Whether the three files can be reused for the listing under o: 0 yes
 * (info's counts filled in), 1 one is missing, 2 not (why says why). */
static int reusable(const struct listing *L, const struct dp_images_opts *o, struct dp_images_info *info,
                    char *why, size_t cap) {
    if (access(info->x_path, F_OK) || access(info->y_path, F_OK) || access(info->classes_path, F_OK))
        return 1;
    struct dp_npy x, y;
    char *text = NULL;
    size_t len = 0;
    int rx = dp_npy_open(info->x_path, &x), ry = rx ? -1 : dp_npy_open(info->y_path, &y), ok = 0;
    if (rx || ry || read_text(info->classes_path, &text, &len)) {
        snprintf(why, cap, "the cached arrays are unreadable: %s", dp_errmsg());
    } else {
        int64_t lines = 0, N = x.shape[0];
        for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
        ok = x.dtype == DP_NPY_U8 && x.ndim == 4 && N >= 1 && N <= L->n && (o->skip_bad || N == L->n) &&
             (x.shape[1] == 1 || x.shape[1] == 3) && (!o->channels || x.shape[1] == o->channels) &&
             x.shape[2] >= 1 && x.shape[3] >= 1 &&
             (!o->height || (x.shape[2] == o->height && x.shape[3] == o->width)) &&
             y.dtype == DP_NPY_I64 && y.ndim == 1 && y.shape[0] == N && lines == L->nclasses;
        if (!ok) snprintf(why, cap, "the cached arrays are not the (N, C, H, W) and (N) arrays expected");
        info->images = N, info->classes = L->nclasses, info->channels = x.shape[1];
        info->height = x.ndim == 4 ? x.shape[2] : 0, info->width = x.ndim == 4 ? x.shape[3] : 0;
        info->skipped = L->n - N;
    }
    if (!rx) dp_npy_close(&x);
    if (!ry) dp_npy_close(&y);
    dp_free(text);
    return ok ? 0 : 2;
}

static int all_bad(const struct listing *L, const struct dp_images_info *info) {
    return dp_seterr(DP_EFORMAT, "%s: no image could be read: all %lld were skipped (the first: %s)", L->dir,
                     (long long)L->n, info->first_bad_error);
}

/* Moves the pixels of slot s to slot N (N < s) in the file, read through
 * *rfd (opened here: a->fd is write-only). */
static int move_slot(struct dp__atomic *a, int *rfd, uint8_t *buf, size_t chw, size_t data, int64_t s,
                     int64_t N) {
    size_t got = 0;
    if (*rfd < 0 && (*rfd = open(a->tmp, O_RDONLY | O_CLOEXEC)) < 0)
        return dp_seterr(DP_EIO, "images: cannot read %s back: %s", a->tmp, strerror(errno));
    while (got < chw) {
        ssize_t r = pread(*rfd, buf + got, chw - got, (off_t)(data + (size_t)s * chw + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return dp_seterr(DP_EIO, "images: cannot read %s back: %s", a->tmp, r ? strerror(errno) : "EOF");
        got += (size_t)r;
    }
    return dp__atomic_pwrite(a, buf, chw, data + (size_t)N * chw);
}

/* Pass 1, the output's shape, pass 2 into x's temporary file, then the
 * three files committed (see the top of the file). */
static int build(struct listing *L, const struct dp_images_opts *o, const struct cache_names *c,
                 struct dp_images_info *info) {
    const int threads = o->threads ? o->threads : dp_cpus_allowed();
    int64_t first_bad = -1, good = 0, ref = -1, N = 0;
    int colour = 0;
    struct job J = {.L = L, .o = o, .pass = 1, .fd = -1};
    int rc = run_pass(&J, L->n, threads, info, &first_bad);
    for (int64_t i = 0; i < L->n && !rc; i++) {
        const struct item *t = &L->it[i], *r = ref < 0 ? t : &L->it[ref];
        if (t->bad) continue;
        if (!o->height && (t->h != r->h || t->w != r->w))
            return dp_seterr(DP_EMISMATCH,
                             "%s/%s is %lldx%lld (HxW) but %s/%s is %lldx%lld: the images differ in size; give "
                             "--image-size H,W to resize and centre-crop them all to H x W",
                             L->dir, L->names + t->name, (long long)t->h, (long long)t->w, L->dir,
                             L->names + r->name, (long long)r->h, (long long)r->w);
        ref = ref < 0 ? i : ref, good++, colour |= t->colour;
    }
    if (rc || !good) return rc ? rc : all_bad(L, info);
    J.C = o->channels ? o->channels : colour ? 3 : 1;
    J.H = o->height ? o->height : L->it[ref].h, J.W = o->height ? o->width : L->it[ref].w;
    const size_t chw = (size_t)(J.C * J.H * J.W);
    int64_t shape[4] = {good, J.C, J.H, J.W}, *slot_item = dp_malloc(sizeof *slot_item * (size_t)good);
    int64_t *y = dp_malloc(sizeof *y * (size_t)good);
    uint8_t pre[DP__NPY_HEADER_MAX], *buf = dp_malloc(chw);
    char *names = dp_malloc(L->nnames);
    size_t total = dp__npy_header(info->x_path, DP_NPY_U8, 4, shape, 0, pre, sizeof pre), nn = 0;
    if (!slot_item || !y || !buf || !names) rc = dp_seterr(DP_ENOMEM, "%s: out of memory", L->dir);
    else if (!total) rc = DP_EINVAL;
    else if (dp__mkdir_p(c->dir, 0700) != 0) /* (0700: the XDG rule for a cache folder) */
        rc = dp_seterr(DP_EIO, "images: cannot create the cache folder %s: %s", c->dir, strerror(errno));
    struct dp__atomic a = {.fd = -1};
    if (!rc && !(rc = dp__atomic_open(&a, info->x_path, "images"))) {
        for (int64_t i = 0, s = 0; i < L->n; i++)
            if (!L->it[i].bad) slot_item[s++] = i;
        J.pass = 2, J.slot_item = slot_item, J.fd = a.fd, J.tmp = a.tmp, J.data = total;
        rc = run_pass(&J, good, threads, info, &first_bad);
        /* the images that failed only now (skip_bad) leave holes: the ones after move down */
        int rfd = -1;
        for (int64_t s = 0; s < good && !rc; s++) {
            const struct item *t = &L->it[slot_item[s]];
            if (t->bad) continue;
            if (N != s) rc = move_slot(&a, &rfd, buf, chw, total, s, N);
            y[N++] = t->cls;
        }
        if (rfd >= 0) close(rfd);
        shape[0] = N;
        if (!rc && !N) rc = all_bad(L, info);
        /* the header for N images, padded to the room reserved for `good` */
        if (!rc && dp__npy_header(info->x_path, DP_NPY_U8, 4, shape, total, pre, sizeof pre) != total)
            rc = dp_seterr(DP_EINTERNAL, "images: %s: the header grew", info->x_path);
        if (!rc && ftruncate(a.fd, (off_t)(total + (size_t)N * chw)) != 0)
            rc = dp_seterr(DP_EIO, "images: cannot write %s: %s", a.tmp, strerror(errno));
        if (!rc && !(rc = dp__atomic_pwrite(&a, pre, total, 0))) rc = dp__atomic_commit(&a);
        if (rc) dp__atomic_abort(&a);
    }
    /* y, then the class names; the folder's other versions removed */
    for (int64_t k = 0; !rc && k < L->nclasses; k++) {
        size_t n = strlen(L->names + L->classes[k]);
        memcpy(names + nn, L->names + L->classes[k], n);
        names[nn + n] = '\n', nn += n + 1;
    }
    struct dp__wpart part = {names, nn};
    if (!rc && ((rc = dp_npy_write(info->y_path, DP_NPY_I64, 1, &N, y)) ||
                (rc = dp__write_file_atomic(info->classes_path, &part, 1, "images")))) {
        char m[400];
        snprintf(m, sizeof m, "%s", dp_errmsg());
        rc = dp_seterr(DP_EIO, "images: cannot write the arrays of %s into the cache folder %s: %s", L->dir,
                       c->dir, m);
    }
    for (int i = 0; i < 3 && !rc; i++) dp__cache_remove_others(c->dir, c->prefix, suffix[i], c->own[i]);
    for (int64_t i = 0; i < L->n; i++) info->skipped += L->it[i].bad;
    info->built = 1, info->images = N, info->classes = L->nclasses;
    info->channels = J.C, info->height = J.H, info->width = J.W;
    dp_free(slot_item), dp_free(y), dp_free(buf), dp_free(names);
    return rc;
}

static int check_opts(const char *dir, const struct dp_images_opts *o) {
    if (o->channels != 0 && o->channels != 1 && o->channels != 3)
        return dp_seterr(DP_EINVAL, "images: %s: channels must be 0 (from the images), 1 or 3, not %d", dir,
                         o->channels);
    if (o->skip_bad != 0 && o->skip_bad != 1)
        return dp_seterr(DP_EINVAL, "images: %s: skip_bad must be 0 or 1, not %d", dir, o->skip_bad);
    if (o->threads < 0 || o->threads > 4096)
        return dp_seterr(DP_EINVAL, "images: %s: threads must be 0 (the CPUs) .. 4096, not %d", dir,
                         o->threads);
    return dp__image_check_size(dir, o->height, o->width);
}

int dp_images_prepare(const char *dir, const struct dp_images_opts *o, struct dp_images_info *info) {
    if (!dir || !info) return dp_seterr(DP_EINVAL, "images: NULL argument");
    memset(info, 0, sizeof *info);
    struct dp_images_opts op = o ? *o : dp_images_default_opts();
    char d[4096];
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--; /* "DIR/" names its images DIR/a/1.png, not DIR//a/1.png */
    if (n >= sizeof d) return dp_seterr(DP_EINVAL, "images: folder path too long: %s", dir);
    memcpy(d, dir, n), d[n] = 0;
    struct listing L = {.dir = d};
    struct cache_names c;
    char why[sizeof info->why] = "";
    int rc = check_opts(d, &op);
    if (!rc) rc = list_folder(d, &L);
    if (!rc) rc = cache_names(&L, &op, &c, info);
    int r = rc ? -1 : reusable(&L, &op, info, why, sizeof why);
    if (r == 1) {
        /* another K: an image was changed, added or removed, or the options changed */
        char other[4096];
        if (dp__cache_newest_other(c.dir, c.prefix, suffix[0], c.own[0], other, sizeof other))
            snprintf(why, sizeof why, "%s's images or the options changed since its arrays were cached", d);
        else
            snprintf(why, sizeof why, "no cached arrays of %s yet", d);
    }
    if (r > 0) {
        memset(info, 0, sizeof *info);
        if (!(rc = cache_names(&L, &op, &c, info)) && !(rc = build(&L, &op, &c, info)))
            snprintf(info->why, sizeof info->why, "%s", why);
    }
    listing_free(&L);
    if (rc) memset(info, 0, sizeof *info);
    return rc;
}

int dp_images_class_names(const struct dp_images_info *info, char **names) {
    if (!info || !names) return dp_seterr(DP_EINVAL, "images: NULL argument");
    size_t len;
    *names = NULL;
    return read_text(info->classes_path, names, &len);
}
