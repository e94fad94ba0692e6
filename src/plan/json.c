/* A reader of flat JSON objects, one per metrics.jsonl line (dp/plan.h).
 *
 * Grammar accepted (RFC 8259, restricted to what the trainer writes):
 *   object := '{' [ pair (',' pair)* ] '}'      pair := string ':' value
 *   value  := number | string | true | false | null | '[' [ number (',' number)* ] ']'
 *           | '[' string (',' string)* ']'
 * Numbers follow JSON's grammar exactly (no "inf", "nan", hex or leading '+').
 * Every read is bounds-checked against len, so a truncated or mutated line
 * fails with DP_EFORMAT and a column, never reads past its end. */
#include <stdlib.h>
#include <string.h>

#include "dp/plan.h"

struct cur {
    const char *s;
    size_t i, n;
};

static int fail(const struct cur *c, const char *what) {
    return dp_seterr(DP_EFORMAT, "json: column %zu: %s", c->i + 1, what);
}
static void ws(struct cur *c) {
    while (c->i < c->n && (c->s[c->i] == ' ' || c->s[c->i] == '\t' || c->s[c->i] == '\n' || c->s[c->i] == '\r')) c->i++;
}
static int peek(const struct cur *c) { return c->i < c->n ? (unsigned char)c->s[c->i] : -1; }
static int isdig(int ch) { return ch >= '0' && ch <= '9'; }

/* A JSON number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static int number(struct cur *c, double *out) {
    size_t b = c->i;
    if (peek(c) == '-') c->i++;
    if (peek(c) == '0') c->i++;
    else if (isdig(peek(c))) while (isdig(peek(c))) c->i++;
    else return fail(c, "expected a number");
    if (peek(c) == '.') {
        c->i++;
        if (!isdig(peek(c))) return fail(c, "expected a digit after '.'");
        while (isdig(peek(c))) c->i++;
    }
    if (peek(c) == 'e' || peek(c) == 'E') {
        c->i++;
        if (peek(c) == '+' || peek(c) == '-') c->i++;
        if (!isdig(peek(c))) return fail(c, "expected a digit in the exponent");
        while (isdig(peek(c))) c->i++;
    }
    char buf[64];
    size_t len = c->i - b;
    if (len >= sizeof buf) return fail(c, "number too long");
    memcpy(buf, c->s + b, len);
    buf[len] = 0;
    *out = strtod(buf, NULL); /* the grammar was checked above; overflow gives +-HUGE_VAL */
    return DP_OK;
}

static int hexval(int ch) {
    return isdig(ch) ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

/* A string, decoded into a new buffer *out (dp_malloc). */
static int string(struct cur *c, char **out) {
    *out = NULL;
    if (peek(c) != '"') return fail(c, "expected '\"'");
    c->i++;
    size_t b = c->i;
    while (c->i < c->n && c->s[c->i] != '"') c->i += c->s[c->i] == '\\' ? 2 : 1;
    if (c->i >= c->n) return fail(c, "unterminated string");
    size_t e = c->i;
    char *d = dp_malloc(e - b + 1);
    if (!d) return dp_seterr(DP_ENOMEM, "json: out of memory");
    size_t k = 0;
    for (size_t i = b; i < e; i++) {
        unsigned char ch = (unsigned char)c->s[i];
        if (ch < 0x20) {
            dp_free(d);
            c->i = i;
            return fail(c, "control character in a string");
        }
        if (ch != '\\') {
            d[k++] = (char)ch;
            continue;
        }
        char esc = c->s[++i]; /* i < e: the scan above stepped over each pair, so the quote at e is not escaped */
        const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t", *hit = strchr(from, esc);
        if (esc && hit) {
            d[k++] = to[hit - from];
        } else if (esc == 'u' && i + 4 < e && hexval(c->s[i + 1]) >= 0 && hexval(c->s[i + 2]) >= 0 &&
                   hexval(c->s[i + 3]) >= 0 && hexval(c->s[i + 4]) >= 0) {
            int v = hexval(c->s[i + 1]) << 12 | hexval(c->s[i + 2]) << 8 | hexval(c->s[i + 3]) << 4 | hexval(c->s[i + 4]);
            d[k++] = v > 0 && v < 128 ? (char)v : '?';
            i += 4;
        } else {
            dp_free(d);
            c->i = i;
            return fail(c, "bad escape in a string");
        }
    }
    d[k] = 0;
    c->i = e + 1;
    *out = d;
    return DP_OK;
}

static int literal(struct cur *c, const char *word) {
    size_t n = strlen(word);
    if (c->n - c->i < n || memcmp(c->s + c->i, word, n)) return fail(c, "expected a value");
    c->i += n;
    return DP_OK;
}

static int array(struct cur *c, struct dp_json_field *f) {
    c->i++; /* '[' */
    int64_t cap = 0;
    ws(c);
    if (peek(c) == ']') {
        c->i++;
        return DP_OK;
    }
    /* the first element decides: an array of numbers (arr) or of strings (strs) */
    if (peek(c) == '"') f->type = DP_JSON_STRS;
    for (;;) {
        ws(c);
        if (peek(c) == '[' || peek(c) == '{') return fail(c, "only arrays of numbers or of strings are supported");
        if ((peek(c) == '"') != (f->type == DP_JSON_STRS)) return fail(c, "an array mixes numbers and strings");
        double v = 0;
        char *str = NULL;
        int rc = f->type == DP_JSON_STRS ? string(c, &str) : number(c, &v);
        if (rc) return rc;
        if (f->n == cap) {
            cap = cap ? 2 * cap : 16;
            size_t el = f->type == DP_JSON_STRS ? sizeof(char *) : sizeof(double);
            void *a = dp_malloc(el * (size_t)cap), **old = f->type == DP_JSON_STRS ? (void **)&f->strs : (void **)&f->arr;
            if (!a) {
                dp_free(str);
                return dp_seterr(DP_ENOMEM, "json: out of memory");
            }
            if (*old) memcpy(a, *old, el * (size_t)f->n);
            dp_free(*old);
            *old = a;
        }
        if (f->type == DP_JSON_STRS) f->strs[f->n++] = str;
        else f->arr[f->n++] = v;
        ws(c);
        if (peek(c) == ',') {
            c->i++;
            continue;
        }
        if (peek(c) == ']') {
            c->i++;
            return DP_OK;
        }
        return fail(c, "expected ',' or ']' in an array");
    }
}

static int value(struct cur *c, struct dp_json_field *f) {
    int ch = peek(c);
    if (ch == '"') return f->type = DP_JSON_STR, string(c, &f->str);
    if (ch == '[') return f->type = DP_JSON_ARR, array(c, f);
    if (ch == 't') return f->type = DP_JSON_BOOL, f->num = 1, literal(c, "true");
    if (ch == 'f') return f->type = DP_JSON_BOOL, f->num = 0, literal(c, "false");
    if (ch == 'n') return f->type = DP_JSON_NULL, literal(c, "null");
    if (ch == '{') return fail(c, "nested objects are not supported");
    return f->type = DP_JSON_NUM, number(c, &f->num);
}

void dp_json_obj_free(struct dp_json_obj *o) {
    if (!o) return;
    for (int i = 0; i < o->n; i++) {
        for (int64_t k = 0; o->f[i].strs && k < o->f[i].n; k++) dp_free(o->f[i].strs[k]);
        dp_free(o->f[i].key), dp_free(o->f[i].str), dp_free(o->f[i].arr), dp_free(o->f[i].strs);
    }
    dp_free(o->f);
    memset(o, 0, sizeof *o);
}

int dp_json_parse(const char *s, size_t len, struct dp_json_obj *o) {
    memset(o, 0, sizeof *o);
    struct cur c = {s, 0, s ? len : 0};
    ws(&c);
    if (peek(&c) != '{') return fail(&c, "expected '{'");
    c.i++;
    ws(&c);
    if (peek(&c) == '}') {
        c.i++;
    } else {
        for (;;) {
            ws(&c);
            if (o->n == o->cap) {
                int cap = o->cap ? 2 * o->cap : 16;
                if (cap > 4096) return fail(&c, "more than 4096 keys");
                struct dp_json_field *f = dp_calloc((size_t)cap, sizeof *f);
                if (!f) return dp_seterr(DP_ENOMEM, "json: out of memory");
                if (o->f) memcpy(f, o->f, sizeof *f * (size_t)o->n);
                dp_free(o->f);
                o->f = f, o->cap = cap;
            }
            struct dp_json_field *f = &o->f[o->n++];
            int rc = string(&c, &f->key);
            if (rc) return rc;
            ws(&c);
            if (peek(&c) != ':') return fail(&c, "expected ':'");
            c.i++;
            ws(&c);
            if ((rc = value(&c, f))) return rc;
            ws(&c);
            if (peek(&c) == ',') {
                c.i++;
                continue;
            }
            if (peek(&c) == '}') {
                c.i++;
                break;
            }
            return fail(&c, "expected ',' or '}'");
        }
    }
    ws(&c);
    if (c.i != c.n) return fail(&c, "text after the object");
    return DP_OK;
}

const struct dp_json_field *dp_json_get(const struct dp_json_obj *o, const char *key) {
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->f[i].key, key)) return &o->f[i];
    return NULL;
}

double dp_json_num(const struct dp_json_obj *o, const char *key, double dflt) {
    const struct dp_json_field *f = dp_json_get(o, key);
    return f && f->type == DP_JSON_NUM ? f->num : dflt;
}

int dp_json_str_is(const struct dp_json_obj *o, const char *key, const char *val) {
    const struct dp_json_field *f = dp_json_get(o, key);
    return f && f->type == DP_JSON_STR && !strcmp(f->str, val);
}
