/* safetensors import/export (the format of Hugging Face's safetensors):
 *   u64 little-endian N | N bytes of JSON header | raw tensor data
 * The header maps each tensor name to {"dtype": "F32", "shape": [...],
 * "data_offsets": [begin, end]} (offsets relative to the data section), plus
 * an optional "__metadata__" object of strings.  Names and layouts are
 * PyTorch's state_dict ones, so torch can load the file with
 * safetensors.torch or with the small reader in tests/torch/. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int dp_safetensors_save(const char *path, const struct dp_model *m, const struct dp_replica *r) {
    size_t cap = 4096, len = 0;
    char *json = dp_malloc(cap);
    if (!json) return dp_seterr(DP_ENOMEM, "safetensors: out of memory");
    int bad = append(&json, &len, &cap, "{\"__metadata__\":{\"format\":\"pt\",\"dptrain_model\":\"%s\"}", m->spec);
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
    if (bad) {
        dp_free(json);
        return dp_seterr(DP_ENOMEM, "safetensors: out of memory");
    }
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        dp_free(json);
        return dp_seterr(DP_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    }
    uint64_t n = len;
    int ok = fwrite(&n, 8, 1, f) == 1 && fwrite(json, 1, len, f) == len;
    for (int i = 0; i < m->nparams && ok; i++) {
        const struct dp_param_info *p = &m->params[i];
        const float *src = (p->is_buffer ? r->buffers : r->params) + p->offset;
        ok = fwrite(src, 4, (size_t)p->count, f) == (size_t)p->count;
    }
    dp_free(json);
    if (fclose(f) != 0 || !ok || rename(tmp, path) != 0) {
        remove(tmp);
        return dp_seterr(DP_EIO, "%s: cannot write: %s", path, strerror(errno));
    }
    return DP_OK;
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
static int str(struct js *j, char *out, size_t cap) {
    if (expect(j, '"')) return DP_EFORMAT;
    size_t n = 0;
    while (j->s < j->end && *j->s != '"') {
        if (*j->s == '\\') return dp_seterr(DP_EFORMAT, "%s: escapes in header strings are not supported", j->path);
        if (n + 1 < cap) out[n++] = *j->s;
        j->s++;
    }
    out[n] = 0;
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

int dp_safetensors_load(const char *path, const struct dp_model *m, struct dp_replica *r) {
    FILE *f = fopen(path, "rb");
    if (!f) return dp_seterr(errno == ENOENT ? DP_ENOENT : DP_EIO, "%s: cannot open: %s", path, strerror(errno));
    int rc = DP_OK;
    char *hdr = NULL;
    char *seen = dp_calloc((size_t)m->nparams + 1, 1);
    uint64_t n;
    fseek(f, 0, SEEK_END);
    long fsz = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (!seen) {
        rc = dp_seterr(DP_ENOMEM, "safetensors: out of memory");
        goto out;
    }
    if (fsz < 8 || fread(&n, 8, 1, f) != 1 || n > (uint64_t)fsz - 8 || n > (100u << 20)) {
        rc = dp_seterr(DP_EFORMAT, "%s: not a safetensors file (bad header length)", path);
        goto out;
    }
    hdr = dp_malloc(n + 1);
    if (!hdr || fread(hdr, 1, n, f) != n) {
        rc = dp_seterr(DP_EIO, "%s: cannot read header", path);
        goto out;
    }
    uint64_t data_size = (uint64_t)fsz - 8 - n;
    struct js j = {hdr, hdr + n, path};
    if ((rc = expect(&j, '{'))) goto out;
    int first = 1;
    while (!peek(&j, '}')) {
        if (!first && (rc = expect(&j, ','))) goto out;
        first = 0;
        char name[128], key[32], dtype[16] = "";
        uint64_t shape[8], offs[2];
        int ndim = -1, noffs = -1;
        if ((rc = str(&j, name, sizeof name)) || (rc = expect(&j, ':')) || (rc = expect(&j, '{'))) goto out;
        int is_meta = strcmp(name, "__metadata__") == 0, f2 = 1;
        while (!peek(&j, '}')) {
            if (!f2 && (rc = expect(&j, ','))) goto out;
            f2 = 0;
            if ((rc = str(&j, key, sizeof key)) || (rc = expect(&j, ':'))) goto out;
            if (is_meta) {
                char val[256];
                if ((rc = str(&j, val, sizeof val))) goto out;
            } else if (strcmp(key, "dtype") == 0) {
                if ((rc = str(&j, dtype, sizeof dtype))) goto out;
            } else if (strcmp(key, "shape") == 0) {
                if ((rc = num_array(&j, shape, 8, &ndim))) goto out;
            } else if (strcmp(key, "data_offsets") == 0) {
                if ((rc = num_array(&j, offs, 2, &noffs))) goto out;
            } else {
                rc = dp_seterr(DP_EFORMAT, "%s: unknown key '%s' in header", path, key);
                goto out;
            }
        }
        if ((rc = expect(&j, '}'))) goto out;
        if (is_meta) continue;
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
        float *dst = (p->is_buffer ? r->buffers : r->params) + p->offset;
        if (fseek(f, (long)(8 + n + offs[0]), SEEK_SET) != 0 || fread(dst, 4, (size_t)p->count, f) != (size_t)p->count) {
            rc = dp_seterr(DP_EIO, "%s: cannot read tensor '%s'", path, name);
            goto out;
        }
    }
    for (int i = 0; i < m->nparams; i++)
        if (!seen[i]) {
            rc = dp_seterr(DP_EMISMATCH, "%s: tensor '%s' of model '%s' is missing", path, m->params[i].name, m->spec);
            goto out;
        }
out:
    dp_free(seen);
    dp_free(hdr);
    fclose(f);
    return rc;
}
