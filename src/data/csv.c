/* CSV files of numbers, turned into a pair of .npy arrays in the cache
 * (dp/data.h, "CSV", has the format, the options and every message).
 *
 * Tokenising (separators, quotes, "" inside quotes, line ends) is libcsv's,
 * in strict mode: it calls on_field with each field's bytes (unquoted,
 * spaces around an unquoted field dropped) and on_row at each row's end, and
 * skips blank lines itself.  This file does the rest:
 *
 *     bytes --split at '\n'--> csv_parse --on_field--> the row's fields (trimmed copies)
 *                                         --on_row---> first row: ncols, header?, the label column
 *                                                      any data row: numbers into x, y
 *
 * Positions.  The input is fed to csv_parse one line at a time, so every
 * callback happens while `line` is the line of the bytes being parsed: a
 * field ends on that line, and starts as many lines earlier as it holds
 * '\n' bytes (a quoted field may span lines).  Messages name the line where
 * the field (or the row: its first field) starts, and the field's 1-based
 * index in its row.
 *
 * Memory.  One pass: the input (the file, read whole) and the arrays, which
 * are allocated once the first row gives the column count, for the most
 * rows len bytes can hold.  Every data field is at least one byte, so a row
 * of C fields takes at least 2C - 1 bytes plus a line end: at most
 * (len + 1) / (2C) rows.  The pages past the last row are never touched.
 *
 * The cache.  dp_csv_prepare keeps the arrays as CACHE/NAME-P-K.{x,y}.npy
 * (data_impl.h): K changes with the CSV's size, its mtime and the options,
 * so an edited CSV or other options make new arrays, and the older ones of
 * the same CSV are removed once the new ones are written. */
#include <csv.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core_impl.h"
#include "data/data_impl.h"
#include "dp/core.h"
#include "dp/data.h"

/* Bumped when the arrays' layout changes: it is part of K. */
#define CSV_CACHE_VERSION 1

struct dp_csv_opts dp_csv_default_opts(void) {
    return (struct dp_csv_opts){.header = -1};
}

/* ---- the parser ------------------------------------------------------------------ */

struct field {
    size_t off, len;  /* the trimmed bytes, at row_bytes + off (NUL-terminated there) */
    int64_t line;     /* the line it starts on */
};

struct parser {
    const char *what;
    const struct dp_csv_opts *o;
    size_t len;              /* the input's bytes: bounds the rows */
    int first_row_only;      /* stop after the first row (the label's name for reused arrays) */
    struct csv_parser p;
    int64_t line;            /* the line of the bytes being parsed, 1-based */
    int rc;                  /* the first error (its message set): stops the parse */
    /* the row being read */
    char *bytes;             /* (nbytes) its fields' bytes, each followed by a NUL */
    size_t nbytes, cbytes;
    struct field *f;         /* (nf) its fields, up to ncols once that is known */
    int64_t nf, cf;
    int64_t nfields;         /* its fields counted (a data row's beyond ncols too) */
    /* from the first row on */
    int64_t ncols;           /* 0 until the first row ends */
    int64_t bound;           /* rows x and y have room for */
    struct dp_csv_data *d;
};

static int64_t count_nl(const char *s, size_t n) {
    int64_t k = 0;
    for (const char *e = s + n; (s = memchr(s, '\n', (size_t)(e - s))); s++) k++;
    return k;
}

/* s[0..n) for a message, into out[0..cap): control bytes as \xNN (so the
 * message stays one line), cut with "..." when it does not fit. */
static const char *show(char *out, size_t cap, const char *s, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (o + 4 + 4 > cap) { /* room for this byte's 4 and "...\0" */
            memcpy(out + o, "...", 3), o += 3;
            break;
        }
        if (c < 32 || c == 127) o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
        else out[o++] = (char)c;
    }
    out[o] = 0;
    return out;
}

/* An error at field c (0-based) of the row: "WHAT:LINE:COL: ...". */
__attribute__((format(printf, 4, 5))) static int field_err(struct parser *P, int status, int64_t c,
                                                              const char *fmt, ...) {
    char m[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    return dp_seterr(status, "%s:%lld:%lld: %s", P->what, (long long)P->f[c].line, (long long)(c + 1), m);
}

/* Field c's text, shown. */
#define SHOWN(P, c, buf) show(buf, sizeof buf, (P)->bytes + (P)->f[c].off, (P)->f[c].len)

/* Whether s[0..n) (NUL-terminated) is a number strtod reads whole; *v its value. */
static int is_number(const char *s, size_t n, double *v) {
    if (n == 0 || isspace((unsigned char)s[0])) return 0; /* strtod would skip a leading '\n' */
    char *end;
    *v = strtod(s, &end);
    return end == s + n;
}

/* libcsv's field callback: the field, trimmed, appended to the row. */
static void on_field(void *s, size_t n, void *arg) {
    struct parser *P = arg;
    if (P->rc) return;
    const char *c = n ? s : "";
    int64_t line = P->line - count_nl(c, n);
    while (n && (*c == ' ' || *c == '\t')) c++, n--;
    while (n && (c[n - 1] == ' ' || c[n - 1] == '\t')) n--;
    if (P->nfields == DP_CSV_MAX_COLUMNS) {
        P->rc = dp_seterr(DP_EFORMAT, "%s:%lld: more than %d fields in a row", P->what,
                          (long long)P->f[0].line, DP_CSV_MAX_COLUMNS);
        return;
    }
    P->nfields++;
    if (P->ncols && P->nf == P->ncols) return; /* a data row too long: counted for its message only */
    if (P->nf == P->cf) {
        int64_t ncap = P->cf ? 2 * P->cf : 64;
        struct field *nf = dp_malloc(sizeof *nf * (size_t)ncap);
        if (!nf) {
            P->rc = dp_seterr(DP_ENOMEM, "%s:%lld: out of memory", P->what, (long long)line);
            return;
        }
        if (P->nf) memcpy(nf, P->f, sizeof *nf * (size_t)P->nf);
        dp_free(P->f);
        P->f = nf, P->cf = ncap;
    }
    if (P->nbytes + n + 1 > P->cbytes) {
        size_t ncap = P->cbytes ? 2 * P->cbytes : 4096;
        while (ncap < P->nbytes + n + 1) ncap *= 2;
        char *nb = dp_malloc(ncap);
        if (!nb) {
            P->rc = dp_seterr(DP_ENOMEM, "%s:%lld: out of memory (a field of %zu bytes)", P->what,
                              (long long)line, n);
            return;
        }
        if (P->nbytes) memcpy(nb, P->bytes, P->nbytes);
        dp_free(P->bytes);
        P->bytes = nb, P->cbytes = ncap;
    }
    if (n) memcpy(P->bytes + P->nbytes, c, n);
    P->bytes[P->nbytes + n] = 0;
    P->f[P->nf++] = (struct field){P->nbytes, n, line};
    P->nbytes += n + 1;
}

/* The label column from the first row (its fields' names when header):
 * d->label and d->label_name. */
static int find_label(struct parser *P, int header) {
    const char *lc = P->o->label_column;
    int64_t n = P->ncols, L = -1;
    char a[64];
    if (!lc) {
        L = n - 1;
    } else {
        for (int64_t c = 0; header && c < n; c++) {
            if (P->f[c].len != strlen(lc) || memcmp(P->bytes + P->f[c].off, lc, P->f[c].len)) continue;
            if (L >= 0)
                return dp_seterr(DP_EINVAL,
                                 "%s: the header names two columns '%s' (%lld and %lld, 0-based): give the "
                                 "label column by its index",
                                 P->what, show(a, sizeof a, lc, strlen(lc)), (long long)L, (long long)c);
            L = c;
        }
        if (L < 0) {
            size_t k = strspn(lc, "0123456789");
            if (k > 0 && k <= 9 && !lc[k]) {
                L = atoll(lc);
                if (L >= n)
                    return dp_seterr(DP_EINVAL,
                                     "%s: label column %lld is out of range: the CSV has %lld columns "
                                     "(0-based indices 0..%lld)",
                                     P->what, (long long)L, (long long)n, (long long)n - 1);
            } else if (header) {
                char names[220], one[64];
                size_t o = 0;
                for (int64_t c = 0; c < n && o < 200; c++)
                    o += (size_t)snprintf(names + o, sizeof names - o, "%s%s", c ? ", " : "",
                                          SHOWN(P, c, one));
                if (o >= 200) snprintf(names + 196, sizeof names - 196, " ...");
                return dp_seterr(DP_EINVAL,
                                 "%s: no column named '%s' in the header (%s); give a name or a "
                                 "0-based index",
                                 P->what, show(a, sizeof a, lc, strlen(lc)), names);
            } else {
                return dp_seterr(DP_EINVAL,
                                 "%s: label column '%s' is not a 0-based index, and the CSV has no "
                                 "header row (%s)",
                                 P->what, show(a, sizeof a, lc, strlen(lc)),
                                 P->o->header == 0 ? "header = 0" : "its first row is all numbers");
            }
        }
    }
    P->d->label = L;
    if (header && P->f[L].len) SHOWN(P, L, P->d->label_name);
    else snprintf(P->d->label_name, sizeof P->d->label_name, "column %lld", (long long)L);
    return DP_OK;
}

static int data_row(struct parser *P);

/* The first row: the column count, whether it is a header, the label
 * column; then room for the rows, and the row itself when it is data. */
static int first_row(struct parser *P) {
    struct dp_csv_data *d = P->d;
    P->ncols = P->nfields;
    if (P->ncols < 2)
        return dp_seterr(DP_EFORMAT,
                         "%s:%lld: one column only: a CSV needs a label column and at least one "
                         "feature column (are the fields separated by ','?)",
                         P->what, (long long)P->f[0].line);
    int header = P->o->header == 1;
    for (int64_t c = 0; P->o->header == -1 && c < P->ncols && !header; c++) {
        double v;
        header = P->f[c].len && !is_number(P->bytes + P->f[c].off, P->f[c].len, &v);
    }
    int rc = find_label(P, header);
    if (rc) return rc;
    d->header = header;
    d->features = P->ncols - 1;
    if (P->first_row_only) return DP_OK;
    P->bound = (int64_t)((P->len + 1) / (2 * (size_t)P->ncols)) + 1;
    size_t xb = sizeof(float) * (size_t)P->bound * (size_t)d->features;
    size_t yb = (P->o->regression ? sizeof(float) : sizeof(int64_t)) * (size_t)P->bound;
    d->x = dp_malloc(xb);
    d->y = dp_malloc(yb);
    if (!d->x || !d->y)
        return dp_seterr(DP_ENOMEM,
                         "%s: out of memory: room for up to %lld rows of %lld features needs %zu bytes",
                         P->what, (long long)P->bound, (long long)d->features, xb + yb);
    return header ? DP_OK : data_row(P);
}

/* A data row: every field a number, into x (the features, in order) and y. */
static int data_row(struct parser *P) {
    struct dp_csv_data *d = P->d;
    if (P->nfields != P->ncols)
        return dp_seterr(DP_EFORMAT, "%s:%lld: %lld field%s, %s has %lld", P->what, (long long)P->f[0].line,
                         (long long)P->nfields, P->nfields == 1 ? "" : "s",
                         d->header ? "the header" : "the first row", (long long)P->ncols);
    if (d->rows == P->bound) /* cannot happen: see "Memory" at the top */
        return dp_seterr(DP_EINTERNAL, "%s: more rows than the file's size allows", P->what);
    float *x = d->x + d->rows * d->features;
    char a[64];
    for (int64_t c = 0; c < P->ncols; c++) {
        const char *s = P->bytes + P->f[c].off;
        double v;
        if (P->f[c].len == 0) return field_err(P, DP_EFORMAT, c, "a missing value (an empty field)");
        int num = is_number(s, P->f[c].len, &v);
        if (c == d->label && !P->o->regression) {
            if (!num || !(v >= 0 && v <= 65535 && v == floor(v)))
                return field_err(P, DP_EFORMAT, c,
                                 "label '%s' is not a class (an integer 0..65535); "
                                 "for a regression use --loss mse",
                                 SHOWN(P, c, a));
            ((int64_t *)d->y)[d->rows] = (int64_t)v;
            continue;
        }
        if (!num) return field_err(P, DP_EFORMAT, c, "'%s' is not a number", SHOWN(P, c, a));
        if (!isfinite(v)) return field_err(P, DP_EFORMAT, c, "'%s' is not a finite number", SHOWN(P, c, a));
        float f = (float)v;
        if (!isfinite(f))
            return field_err(P, DP_EFORMAT, c, "'%s' is out of float32's range", SHOWN(P, c, a));
        if (c == d->label) ((float *)d->y)[d->rows] = f;
        else *x++ = f;
    }
    d->rows++;
    return DP_OK;
}

/* libcsv's row callback. */
static void on_row(int term, void *arg) {
    (void)term;
    struct parser *P = arg;
    if (P->rc) return;
    P->rc = P->ncols ? data_row(P) : first_row(P);
    P->nf = P->nfields = 0;
    P->nbytes = 0;
}

static int parser_init(struct parser *P, const char *what, const struct dp_csv_opts *o, size_t len,
                       int first_row_only, struct dp_csv_data *d) {
    memset(P, 0, sizeof *P);
    memset(d, 0, sizeof *d);
    P->what = what, P->o = o, P->len = len, P->first_row_only = first_row_only, P->d = d;
    P->line = 1;
    if (csv_init(&P->p, CSV_STRICT | CSV_STRICT_FINI) != 0)
        return dp_seterr(DP_ENOMEM, "%s: out of memory", what);
    return DP_OK;
}

static int parser_done(const struct parser *P) {
    return P->rc || (P->first_row_only && P->ncols);
}

/* Feeds buf[0..n) to libcsv, one line at a time (see "Positions"). */
static void feed(struct parser *P, const uint8_t *buf, size_t n) {
    while (n && !parser_done(P)) {
        const uint8_t *nl = memchr(buf, '\n', n);
        size_t k = nl ? (size_t)(nl - buf) + 1 : n;
        size_t done = csv_parse(&P->p, buf, k, on_field, on_row, P);
        int e = csv_error(&P->p);
        if (!P->rc && e == CSV_EPARSE)
            P->rc = dp_seterr(DP_EFORMAT,
                              "%s:%lld:%lld: a stray quote (a quote inside an unquoted field, or text "
                              "after a closing quote): quote the whole field and double each quote "
                              "inside it",
                              P->what, (long long)P->line, (long long)P->nfields + 1);
        else if (!P->rc && (done < k || e != CSV_SUCCESS))
            P->rc = dp_seterr(DP_ENOMEM, "%s:%lld: out of memory (%s)", P->what, (long long)P->line,
                              csv_strerror(e));
        if (nl) P->line++;
        buf += k, n -= k;
    }
}

/* The end of the input: the last row when it has no line end, then the
 * checks on the whole. */
static int finish(struct parser *P) {
    if (!parser_done(P) && csv_fini(&P->p, on_field, on_row, P) != 0 && !P->rc)
        /* an open quote: the field so far is in libcsv's buffer (csv.h's documented fields) */
        P->rc = dp_seterr(DP_EFORMAT,
                          "%s:%lld:%lld: a quoted field is not closed before the end of the file",
                          P->what,
                          (long long)(P->line - count_nl((const char *)P->p.entry_buf, P->p.entry_pos)),
                          (long long)P->nfields + 1);
    if (!P->rc && !P->ncols) P->rc = dp_seterr(DP_EFORMAT, "%s: empty: no rows", P->what);
    if (!P->rc && !P->first_row_only && P->d->header && P->d->rows == 0)
        P->rc = dp_seterr(DP_EFORMAT, "%s: a header row and no data rows", P->what);
    return P->rc;
}

/* Frees the parser; on failure d too. */
static int parser_free(struct parser *P, int rc) {
    csv_free(&P->p);
    dp_free(P->bytes);
    dp_free(P->f);
    if (rc) dp_csv_data_free(P->d);
    return rc;
}

static int check_opts(const char *what, const struct dp_csv_opts *o) {
    if (o->header < -1 || o->header > 1)
        return dp_seterr(DP_EINVAL, "%s: header must be -1 (detect), 0 or 1, not %d", what, o->header);
    if (o->regression != 0 && o->regression != 1)
        return dp_seterr(DP_EINVAL, "%s: regression must be 0 or 1, not %d", what, o->regression);
    if (o->label_column && !o->label_column[0]) return dp_seterr(DP_EINVAL, "%s: empty label column", what);
    return DP_OK;
}

/* A UTF-8 byte order mark (spreadsheets write one) is not part of the first field. */
static size_t bom(const uint8_t *buf, size_t len) {
    return len >= 3 && buf[0] == 0xef && buf[1] == 0xbb && buf[2] == 0xbf ? 3 : 0;
}

int dp_csv_parse(const uint8_t *buf, size_t len, const char *what, const struct dp_csv_opts *o,
                 struct dp_csv_data *d) {
    if (!d) return dp_seterr(DP_EINVAL, "csv: NULL argument");
    memset(d, 0, sizeof *d);
    if (!what) what = "csv";
    if (!buf && len) return dp_seterr(DP_EINVAL, "%s: NULL buffer", what);
    struct dp_csv_opts def = dp_csv_default_opts();
    if (!o) o = &def;
    int rc = check_opts(what, o);
    if (rc) return rc;
    struct parser P;
    if ((rc = parser_init(&P, what, o, len, 0, d))) return rc;
    if (len) {
        size_t skip = bom(buf, len);
        feed(&P, buf + skip, len - skip);
    }
    return parser_free(&P, finish(&P));
}

void dp_csv_data_free(struct dp_csv_data *d) {
    if (!d) return;
    dp_free(d->x);
    dp_free(d->y);
    memset(d, 0, sizeof *d);
}

/* ---- the cache ------------------------------------------------------------------- */

/* The first row of the open file fd (read in blocks, up to that row's end):
 * d's label, label_name, header and features, for arrays reused. */
static int read_first_row(int fd, const char *csv, const struct dp_csv_opts *o, struct dp_csv_data *d) {
    struct parser P;
    int rc = parser_init(&P, csv, o, 0, 1, d);
    if (rc) return rc;
    const size_t cap = 1 << 16;
    uint8_t *buf = dp_malloc(cap);
    if (!buf) P.rc = dp_seterr(DP_ENOMEM, "%s: out of memory", csv);
    for (int first = 1; !parser_done(&P);) {
        ssize_t r = read(fd, buf, cap);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) P.rc = dp_seterr(DP_EIO, "csv: %s: read failed: %s", csv, strerror(errno));
        if (r <= 0) break;
        size_t skip = first ? bom(buf, (size_t)r) : 0;
        feed(&P, buf + skip, (size_t)r - skip);
        first = 0;
    }
    dp_free(buf);
    return parser_free(&P, finish(&P));
}

/* Whether the arrays at xp, yp can be reused for the CSV with stat st: 0 yes,
 * 1 they are missing, 2 not (why says why).  *rows, *features: theirs. */
static int reusable(const char *xp, const char *yp, const char *csv, const struct stat *st, int regression,
                    char *why, size_t cap, int64_t *rows, int64_t *features) {
    struct stat xs, ys;
    if (stat(xp, &xs) != 0 || stat(yp, &ys) != 0) return 1;
    if (!dp__ts_after(&xs.st_mtim, &st->st_mtim) || !dp__ts_after(&ys.st_mtim, &st->st_mtim)) {
        snprintf(why, cap, "%s is newer than its cached arrays", csv);
        return 2;
    }
    struct dp_npy x, y;
    if (dp_npy_open(xp, &x) != DP_OK) {
        snprintf(why, cap, "the cached array is unreadable: %s", dp_errmsg());
        return 2;
    }
    int ok = 0;
    if (dp_npy_open(yp, &y) != DP_OK) {
        snprintf(why, cap, "the cached array is unreadable: %s", dp_errmsg());
    } else {
        ok = x.dtype == DP_NPY_F32 && x.ndim == 2 && x.shape[0] >= 1 && x.shape[1] >= 1 && y.ndim == 1 &&
             y.dtype == (regression ? DP_NPY_F32 : DP_NPY_I64) && y.shape[0] == x.shape[0];
        if (!ok)
            snprintf(why, cap, "the cached arrays are not the (rows, features) and (rows) arrays expected");
        *rows = x.shape[0], *features = x.ndim == 2 ? x.shape[1] : 0;
        dp_npy_close(&y);
    }
    dp_npy_close(&x);
    return ok ? 0 : 2;
}

/* The cache's paths for the CSV with stat st under o: the folder, "NAME-P-",
 * the arrays' base names and info's paths. */
struct cache_names {
    char dir[4096], prefix[128], own[2][256]; /* own: x's, y's */
};

static int cache_names(const char *csv, const struct dp_csv_opts *o, const struct stat *st,
                       struct cache_names *c, struct dp_csv_info *info) {
    int rc;
    if (o->cache_dir) {
        if (snprintf(c->dir, sizeof c->dir, "%s", o->cache_dir) >= (int)sizeof c->dir)
            return dp_seterr(DP_EINVAL, "csv: cache folder path too long: %s", o->cache_dir);
    } else if ((rc = dp_text_cache_dir(c->dir, sizeof c->dir))) {
        if (rc == DP_ENOENT)
            dp_seterr(rc, "csv: %s: no cache folder for its arrays: neither XDG_CACHE_HOME nor HOME is set",
                      csv);
        return rc;
    }
    if ((rc = dp__cache_prefix("csv", csv, c->prefix, sizeof c->prefix))) return rc;
    /* K: what the arrays depend on */
    int64_t key[6] = {CSV_CACHE_VERSION, (int64_t)st->st_size, (int64_t)st->st_mtim.tv_sec,
                      (int64_t)st->st_mtim.tv_nsec, o->header, o->regression};
    uint64_t k = dp_fnv1a64(key, sizeof key, DP_FNV1A64_INIT);
    if (o->label_column) k = dp_fnv1a64(o->label_column, strlen(o->label_column) + 1, k);
    for (int i = 0; i < 2; i++)
        snprintf(c->own[i], sizeof c->own[i], "%s%016llx.%c.npy", c->prefix, (unsigned long long)k, "xy"[i]);
    if (snprintf(info->x_path, sizeof info->x_path, "%s/%s", c->dir, c->own[0]) >= (int)sizeof info->x_path ||
        snprintf(info->y_path, sizeof info->y_path, "%s/%s", c->dir, c->own[1]) >= (int)sizeof info->y_path)
        return dp_seterr(DP_EINVAL, "csv: cache path too long: %s", c->dir);
    return DP_OK;
}

/* The arrays of the CSV open as fd: reused, or built. */
static int prepare_fd(int fd, const char *csv, const struct dp_csv_opts *o, struct dp_csv_info *info) {
    struct stat st;
    if (fstat(fd, &st) != 0) return dp_seterr(DP_EIO, "csv: %s: %s", csv, strerror(errno));
    struct cache_names c;
    int rc = cache_names(csv, o, &st, &c, info);
    if (rc) return rc;
    struct dp_csv_data d;

    /* reused: only the first row is read, for the label's name */
    int64_t rows = 0, features = 0;
    char why[sizeof info->why] = "";
    int r = reusable(info->x_path, info->y_path, csv, &st, o->regression, why, sizeof why, &rows, &features);
    if (r == 0) {
        if ((rc = read_first_row(fd, csv, o, &d))) return rc;
        info->built = 0, info->rows = rows, info->features = features;
        snprintf(info->label_name, sizeof info->label_name, "%s", d.label_name);
        dp_csv_data_free(&d);
        return DP_OK;
    }
    if (r == 1) {
        /* arrays of this CSV under another K: its size or mtime changed, or the options did (an mtime
         * cannot tell which: cp -p and checkouts set older ones) */
        char other[4096];
        if (dp__cache_newest_other(c.dir, c.prefix, ".x.npy", c.own[0], other, sizeof other))
            snprintf(why, sizeof why, "%s or the options changed since its arrays were cached", csv);
        else
            snprintf(why, sizeof why, "no cached arrays of %s yet", csv);
    }

    /* built: the file read whole, parsed and freed; then the arrays written, and the others of this
     * CSV removed */
    uint8_t *buf;
    size_t len;
    if ((rc = dp__read_fd(fd, "csv", csv, (size_t)st.st_size, &buf, &len))) return rc;
    rc = dp_csv_parse(buf, len, csv, o, &d);
    dp_free(buf);
    if (rc) return rc;
    int64_t shape[2] = {d.rows, d.features};
    if (dp__mkdir_p(c.dir, 0700) != 0) { /* (0700: the XDG rule for a cache folder) */
        rc = dp_seterr(DP_EIO, "csv: cannot create the cache folder %s: %s", c.dir, strerror(errno));
    } else if ((rc = dp_npy_write(info->x_path, DP_NPY_F32, 2, shape, d.x)) ||
               (rc = dp_npy_write(info->y_path, o->regression ? DP_NPY_F32 : DP_NPY_I64, 1, shape, d.y))) {
        char m[400];
        snprintf(m, sizeof m, "%s", dp_errmsg());
        rc = dp_seterr(DP_EIO, "csv: cannot write the arrays of %s into the cache folder %s: %s", csv, c.dir,
                       m);
    } else {
        for (int i = 0; i < 2; i++)
            dp__cache_remove_others(c.dir, c.prefix, i ? ".y.npy" : ".x.npy", c.own[i]);
        info->built = 1, info->rows = d.rows, info->features = d.features;
        snprintf(info->label_name, sizeof info->label_name, "%s", d.label_name);
        snprintf(info->why, sizeof info->why, "%s", why);
    }
    dp_csv_data_free(&d);
    return rc;
}

int dp_csv_prepare(const char *csv, const struct dp_csv_opts *o, struct dp_csv_info *info) {
    if (!csv || !info) return dp_seterr(DP_EINVAL, "csv: NULL argument");
    memset(info, 0, sizeof *info);
    struct dp_csv_opts op = o ? *o : dp_csv_default_opts();
    int rc = check_opts(csv, &op), fd;
    size_t size;
    if (rc || (rc = dp__open_regular("csv", csv, &fd, &size))) return rc;
    rc = prepare_fd(fd, csv, &op, info);
    close(fd);
    if (rc) memset(info, 0, sizeof *info);
    return rc;
}
