/* safetensors import/export (the format of Hugging Face's safetensors):
 *   u64 little-endian N | N bytes of JSON header | raw tensor data
 * The header maps each tensor name to {"dtype": "F32", "shape": [...],
 * "data_offsets": [begin, end]} (offsets relative to the data section), plus
 * an optional "__metadata__" object of strings.  Names and layouts are
 * PyTorch's state_dict ones, so torch can load the file with
 * safetensors.torch or with the small reader in tests/torch/. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/core_impl.h"
#include "dp/train.h"

/* ---- writer --------------------------------------------------------------- */

static int append(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#include <stdarg.h>
static int append(char **buf, size_t *len, size_t *cap, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(*buf + *len, *cap - *len, fmt, ap);
        va_end(ap);
        if (n < 0) return -1;
        if ((size_t)n < *cap - *len) {
            *len += (size_t)n;
            return 0;
        }
        size_t ncap = *cap * 2 + (size_t)n;
        char *nb = dp_malloc(ncap);
        if (!nb) return -1;
        memcpy(nb, *buf, *len);
        dp_free(*buf);
        *buf = nb;
        *cap = ncap;
    }
}

/* Metadata keys and values go into the JSON header verbatim: refuse the
 * characters that would need escaping (the reader does not take escapes). */
static int plain_string(const char *s) {
    for (; *s; s++)
        if (*s == '"' || *s == '\\' || (unsigned char)*s < 0x20) return 0;
    return 1;
}

int dp_safetensors_save(const char *path, const struct dp_model *m, const struct dp_replica *r) {
    return dp_safetensors_save_meta(path, m, r, NULL, 0);
}

int dp_safetensors_save_meta(const char *path, const struct dp_model *m, const struct dp_replica *r,
                             const struct dp_st_meta *meta, int nmeta) {
    if (!plain_string(m->spec)) return dp_seterr(DP_EINVAL, "safetensors: model spec '%s' needs escaping", m->spec);
    for (int i = 0; i < nmeta; i++)
        if (!plain_string(meta[i].key) || !plain_string(meta[i].value) || !strcmp(meta[i].key, "format") ||
            !strcmp(meta[i].key, "dptrain_model") || !strcmp(meta[i].key, "input_shape") ||
            !strcmp(meta[i].key, "dptrain_model_text"))
            return dp_seterr(DP_EINVAL, "safetensors: bad metadata entry '%s'", meta[i].key);
    /* The model's canonical text, its statements joined by "; " (a model file may say it
     * so): what `dptrain eval --safetensors` rebuilds the model from. */
    char *text = NULL;
    if (m->desc) {
        if (!(text = dp_malloc(2 * strlen(m->desc) + 1))) return dp_seterr(DP_ENOMEM, "safetensors: out of memory");
        char *o = text;
        for (const char *c = m->desc; *c; c++)
            if (*c != '\n') *o++ = *c;
            else if (c[1]) *o++ = ';', *o++ = ' ';
        *o = 0;
        if (!plain_string(text)) {
            dp_free(text);
            return dp_seterr(DP_EINVAL, "safetensors: the model text needs escaping");
        }
    }
    size_t cap = 4096, len = 0;
    char *json = dp_malloc(cap);
    if (!json) {
        dp_free(text);
        return dp_seterr(DP_ENOMEM, "safetensors: out of memory");
    }
    /* Metadata (strings only, as the format requires): the model spec and the
     * per-sample input shape (C,H,W, NCHW batches) rebuild the model; the
     * caller adds the input preprocessing. */
    int bad = append(&json, &len, &cap, "{\"__metadata__\":{\"format\":\"pt\",\"dptrain_model\":\"%s\",\"input_shape\":\"",
                     m->spec);
    for (int d = 0; d < m->in_shape.ndim && !bad; d++)
        bad |= append(&json, &len, &cap, "%s%lld", d ? "," : "", (long long)m->in_shape.d[d]);
    bad |= append(&json, &len, &cap, "\"");
    if (text && !bad) bad |= append(&json, &len, &cap, ",\"dptrain_model_text\":\"%s\"", text);
    dp_free(text);
    for (int i = 0; i < nmeta && !bad; i++)
        bad |= append(&json, &len, &cap, ",\"%s\":\"%s\"", meta[i].key, meta[i].value);
    bad |= append(&json, &len, &cap, "}");
    uint64_t off = 0;
    for (int i = 0; i < m->nparams && !bad; i++) {
        const struct dp_param_info *p = &m->params[i];
        bad |= append(&json, &len, &cap, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[", p->name);
        for (int d = 0; d < p->shape.ndim && !bad; d++)
            bad |= append(&json, &len, &cap, "%s%lld", d ? "," : "", (long long)p->shape.d[d]);
        bad |= append(&json, &len, &cap, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                      (unsigned long long)(off + 4u * (uint64_t)p->count));
        off += 4u * (uint64_t)p->count;
    }
    bad |= append(&json, &len, &cap, "}");
    /* Pad the header with spaces to a multiple of 8 so the data is aligned. */
    while (!bad && len % 8) bad |= append(&json, &len, &cap, " ");
    struct dp__wpart *parts = bad ? NULL : dp_malloc(sizeof *parts * (size_t)(m->nparams + 2));
    if (!parts) {
        dp_free(json);
        return dp_seterr(DP_ENOMEM, "safetensors: out of memory");
    }
    /* Written like a checkpoint (core/core_impl.h): a unique temporary file beside
     * path, fsync, rename, so path holds the old file or the whole new one. */
    uint64_t n = len; /* the header length, u64 little-endian (x86-64 is) */
    parts[0] = (struct dp__wpart){&n, 8};
    parts[1] = (struct dp__wpart){json, len};
    for (int i = 0; i < m->nparams; i++) {
        const struct dp_param_info *p = &m->params[i];
        parts[i + 2] = (struct dp__wpart){(p->is_buffer ? r->buffers : r->params) + p->offset, 4 * (size_t)p->count};
    }
    int rc = dp__write_file_atomic(path, parts, m->nparams + 2, "safetensors");
    dp_free(parts);
    dp_free(json);
    return rc;
}

/* ---- reader: a small JSON parser for the header's fixed structure ---------- */

struct js {
    const char *s, *end;
    const char *path;
};

static void ws(struct js *j) {
    while (j->s < j->end && (*j->s == ' ' || *j->s == '\n' || *j->s == '\t' || *j->s == '\r')) j->s++;
}
static int expect(struct js *j, char c) {
    ws(j);
    if (j->s < j->end && *j->s == c) {
        j->s++;
        return 0;
    }
    return dp_seterr(DP_EFORMAT, "%s: bad safetensors header near byte %ld (expected '%c')", j->path,
                     (long)(j->end - j->s), c);
}
/* Reads a JSON string without escapes (names here never need them). */
/* A string into out (cap bytes with its NUL; out NULL: skipped); one longer than that is an
 * error where it is kept, so no value is ever cut short silently. */
static int str(struct js *j, char *out, size_t cap) {
    if (expect(j, '"')) return DP_EFORMAT;
    size_t n = 0;
    while (j->s < j->end && *j->s != '"') {
        if (*j->s == '\\') return dp_seterr(DP_EFORMAT, "%s: escapes in header strings are not supported", j->path);
        if (out && n + 1 >= cap) return dp_seterr(DP_EFORMAT, "%s: a header string longer than %zu bytes", j->path, cap - 1);
        if (out) out[n] = *j->s;
        n++, j->s++;
    }
    if (out) out[n] = 0;
    if (j->s >= j->end) return dp_seterr(DP_EFORMAT, "%s: unterminated string in header", j->path);
    j->s++;
    return 0;
}
static int num(struct js *j, uint64_t *v) {
    ws(j);
    if (j->s >= j->end || *j->s < '0' || *j->s > '9') return dp_seterr(DP_EFORMAT, "%s: expected a number in header", j->path);
    uint64_t x = 0;
    while (j->s < j->end && *j->s >= '0' && *j->s <= '9') {
        if (x > (UINT64_MAX - 9) / 10) return dp_seterr(DP_EFORMAT, "%s: number too large in header", j->path);
        x = x * 10 + (uint64_t)(*j->s++ - '0');
    }
    *v = x;
    return 0;
}
static int peek(struct js *j, char c) {
    ws(j);
    return j->s < j->end && *j->s == c;
}
static int num_array(struct js *j, uint64_t *v, int cap, int *n) {
    if (expect(j, '[')) return DP_EFORMAT;
    *n = 0;
    if (peek(j, ']')) return expect(j, ']');
    for (;;) {
        uint64_t x = 0;
        if (num(j, &x)) return DP_EFORMAT;
        if (*n >= cap) return dp_seterr(DP_EFORMAT, "%s: too many dimensions in header", j->path);
        v[(*n)++] = x;
        if (peek(j, ',')) {
            j->s++;
            continue;
        }
        return expect(j, ']');
    }
}

/* One entry's object: a tensor's dtype, shape and data offsets, or the metadata's string
 * values (the one named want_key copied into want_val, *found = 1). */
struct st_entry {
    char dtype[16];
    uint64_t shape[8], offs[2];
    int ndim, noffs;
};
static int entry(struct js *j, int is_meta, struct st_entry *e, const char *want_key, char *want_val, size_t cap) {
    memset(e, 0, sizeof *e);
    e->ndim = e->noffs = -1;
    char key[32];
    int rc = expect(j, '{'), first = 1;
    while (!rc && !peek(j, '}')) {
        if (!first && (rc = expect(j, ','))) break;
        first = 0;
        if ((rc = str(j, key, sizeof key)) || (rc = expect(j, ':'))) break;
        if (is_meta) rc = want_key && !strcmp(key, want_key) ? str(j, want_val, cap) : str(j, NULL, 0); else if (strcmp(key, "dtype") == 0) rc = str(j, e->dtype, sizeof e->dtype);
        else if (strcmp(key, "shape") == 0) rc = num_array(j, e->shape, 8, &e->ndim);
        else if (strcmp(key, "data_offsets") == 0) rc = num_array(j, e->offs, 2, &e->noffs);
        else rc = dp_seterr(DP_EFORMAT, "%s: unknown key '%s' in header", j->path, key);
    }
    return rc ? rc : expect(j, '}');
}

/* One tensor of the file: the model parameter it fills and its bytes in the
 * data section. */
struct st_ent {
    int idx;
    uint64_t begin, end;
};
static int cmp_ent(const void *a, const void *b) {
    const struct st_ent *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Reads the whole header and checks it before any tensor is read, so a bad
 * file loads nothing. */
/* The header's JSON (n bytes, *hdr: dp_free) of an open file of fsz bytes. */
static int read_header(FILE *f, const char *path, uint64_t fsz, char **hdr, uint64_t *n) {
    *hdr = NULL;
    if (fsz < 8 || fread(n, 8, 1, f) != 1 || *n > fsz - 8 || *n > (100u << 20))
        return dp_seterr(DP_EFORMAT, "%s: not a safetensors file (bad header length)", path);
    *hdr = dp_malloc(*n + 1);
    if (!*hdr || fread(*hdr, 1, *n, f) != *n) return dp_seterr(DP_EIO, "%s: cannot read header", path);
    return DP_OK;
}

int dp_safetensors_meta(const char *path, const char *key, char *val, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return dp_seterr(errno == ENOENT ? DP_ENOENT : DP_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    char *hdr = NULL;
    uint64_t n = 0;
    int rc = fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) ? dp_seterr(DP_EIO, "%s: not a regular file", path)
                                                                 : read_header(f, path, (uint64_t)st.st_size, &hdr, &n);
    val[0] = 0;
    struct js j = {hdr, hdr + n, path};
    if (!rc) rc = expect(&j, '{');
    for (int first = 1; !rc && !peek(&j, '}'); first = 0) {
        char name[128];
        struct st_entry e;
        if ((!first && (rc = expect(&j, ','))) || (rc = str(&j, name, sizeof name)) || (rc = expect(&j, ':'))) break;
        rc = entry(&j, strcmp(name, "__metadata__") == 0, &e, key, val, cap);
    }
    if (!rc && !val[0]) rc = dp_seterr(DP_ENOENT, "%s: no \"%s\" in its metadata", path, key);
    dp_free(hdr);
    fclose(f);
    return rc;
}

int dp_safetensors_load(const char *path, const struct dp_model *m, struct dp_replica *r) {
    FILE *f = fopen(path, "rb");
    if (!f) return dp_seterr(errno == ENOENT ? DP_ENOENT : DP_EIO, "%s: cannot open: %s", path, strerror(errno));
    int rc = DP_OK;
    char *hdr = NULL;
    struct st_ent *ent = dp_calloc((size_t)m->nparams + 1, sizeof *ent);
    char *seen = dp_calloc((size_t)m->nparams + 1, 1);
    int nent = 0;
    uint64_t n;
    struct stat st;
    if (!seen || !ent) {
        rc = dp_seterr(DP_ENOMEM, "safetensors: out of memory");
        goto out;
    }
    /* The size from fstat of a regular file (not fseek/ftell on whatever
     * path names: a pipe or a folder has no size to seek to). */
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = dp_seterr(DP_EIO, "%s: not a regular file", path);
        goto out;
    }
    uint64_t fsz = (uint64_t)st.st_size;
    if ((rc = read_header(f, path, fsz, &hdr, &n))) goto out;
    uint64_t data_size = fsz - 8 - n;
    struct js j = {hdr, hdr + n, path};
    if ((rc = expect(&j, '{'))) goto out;
    int first = 1;
    while (!peek(&j, '}')) {
        if (!first && (rc = expect(&j, ','))) goto out;
        first = 0;
        char name[128];
        struct st_entry e;
        if ((rc = str(&j, name, sizeof name)) || (rc = expect(&j, ':'))) goto out;
        int is_meta = strcmp(name, "__metadata__") == 0;
        if ((rc = entry(&j, is_meta, &e, NULL, NULL, 0))) goto out;
        if (is_meta) continue;
        char *dtype = e.dtype;
        uint64_t *shape = e.shape, *offs = e.offs;
        int ndim = e.ndim, noffs = e.noffs;
        /* A tensor: check it against the model. */
        const struct dp_param_info *p = dp_model_find_param(m, name);
        if (!p) {
            rc = dp_seterr(DP_EMISMATCH, "%s: tensor '%s' does not exist in model '%s'", path, name, m->spec);
            goto out;
        }
        if (strcmp(dtype, "F32") != 0) {
            rc = dp_seterr(DP_EMISMATCH, "%s: tensor '%s' has dtype %s, only F32 is supported", path, name, dtype);
            goto out;
        }
        int shape_ok = ndim == p->shape.ndim;
        for (int d = 0; shape_ok && d < ndim; d++) shape_ok = shape[d] == (uint64_t)p->shape.d[d];
        if (!shape_ok) {
            rc = dp_seterr(DP_EMISMATCH, "%s: tensor '%s' has a different shape than in model '%s'", path, name, m->spec);
            goto out;
        }
        if (noffs != 2 || offs[1] < offs[0] || offs[1] - offs[0] != 4u * (uint64_t)p->count || offs[1] > data_size) {
            rc = dp_seterr(DP_EFORMAT, "%s: tensor '%s' has bad data offsets", path, name);
            goto out;
        }
        size_t idx = (size_t)(p - m->params);
        if (seen[idx]) {
            rc = dp_seterr(DP_EFORMAT, "%s: tensor '%s' appears twice", path, name);
            goto out;
        }
        seen[idx] = 1;
        ent[nent++] = (struct st_ent){(int)idx, offs[0], offs[1]};
    }
    j.s++; /* the closing '}' */
    /* The JSON may be padded with spaces (0x20) to the declared length, and
     * with nothing else: other bytes mean a corrupt or misread header. */
    while (j.s < j.end && *j.s == ' ') j.s++;
    if (j.s != j.end) {
        rc = dp_seterr(DP_EFORMAT, "%s: %ld bytes after the header's JSON that are not space padding", path,
                       (long)(j.end - j.s));
        goto out;
    }
    /* The tensors tile the data section: sorted by begin, each starts where
     * the previous one ends, from 0 to the end of the file.  An overlap (two
     * tensors sharing bytes), a hole or trailing bytes is a corrupt file. */
    qsort(ent, (size_t)nent, sizeof *ent, cmp_ent);
    uint64_t at = 0;
    for (int i = 0; i < nent; i++) {
        if (ent[i].begin != at) {
            rc = dp_seterr(DP_EFORMAT, "%s: tensor '%s' %s (data_offsets begin at %llu, expected %llu)", path,
                           m->params[ent[i].idx].name, ent[i].begin < at ? "overlaps another tensor" : "leaves a gap",
                           (unsigned long long)ent[i].begin, (unsigned long long)at);
            goto out;
        }
        at = ent[i].end;
    }
    if (at != data_size) {
        rc = dp_seterr(DP_EFORMAT, "%s: the tensors cover %llu of the %llu data bytes", path, (unsigned long long)at,
                       (unsigned long long)data_size);
        goto out;
    }
    for (int i = 0; i < m->nparams; i++)
        if (!seen[i]) {
            rc = dp_seterr(DP_EMISMATCH, "%s: tensor '%s' of model '%s' is missing", path, m->params[i].name, m->spec);
            goto out;
        }
    /* Every check passed: read the tensors, in file order. */
    for (int i = 0; i < nent; i++) {
        const struct dp_param_info *p = &m->params[ent[i].idx];
        float *dst = (p->is_buffer ? r->buffers : r->params) + p->offset;
        uint64_t pos = 8 + n + ent[i].begin;
        if (pos > (uint64_t)LONG_MAX || fseek(f, (long)pos, SEEK_SET) != 0 ||
            fread(dst, 4, (size_t)p->count, f) != (size_t)p->count) {
            rc = dp_seterr(DP_EIO, "%s: cannot read tensor '%s'", path, p->name);
            goto out;
        }
    }
out:
    dp_free(ent);
    dp_free(seen);
    dp_free(hdr);
    fclose(f);
    return rc;
}
