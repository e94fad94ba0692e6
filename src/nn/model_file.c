/* Model files: a model declared in text, one statement per line (docs/models.md).
 *
 *   # a comment, to the end of the line
 *   input 1 28 28                   the per-sample input: C H W, or "tokens T"
 *   conv2d conv1 out=32 kernel=3 pad=1
 *   relu relu1
 *   ...
 *   loss cross_entropy              optional: or "loss mse" (a regression)
 *
 * Statements may also share a line, separated by ';' (the safetensors
 * metadata's form, "input 1 28 28; flatten f; ...").
 *
 * A layer line is KIND NAME [KEY=VALUE]...; NAME is the PyTorch module name
 * (the prefix of its parameters' names).  Each kind's keys, their defaults and
 * their ranges are the table `kinds` below; a missing required key, an unknown
 * or repeated one, or a bad value is refused with FILE:LINE and what was
 * expected.  The layer constructors write the model's canonical text (every
 * key spelled out, comments and spacing dropped) into m->desc, whoever calls
 * them: it is what a checkpoint stores, and two models are the same
 * architecture when their canonical texts are equal. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/nn.h"
#include "layers_impl.h"

enum { MAX_KEYS = 5, MAX_LINE = 1024, MAX_TOKENS = 16 };
enum key_type { K_INT, K_FLOAT, K_NAME };

struct key {
    const char *name;
    enum key_type type;
    const char *def;  /* default as written, NULL: required; "=NAME": the value of key NAME */
    double lo, hi;    /* numeric range, inclusive (K_FLOAT: an end exclusive when open says) */
    int open;         /* K_FLOAT: 1 = (lo, hi], 2 = [lo, hi) */
};

struct val {
    int64_t i;
    double f;
    const char *s;
};

struct kind {
    const char *name;
    struct key keys[MAX_KEYS];
    int (*build)(struct dp_model *m, const char *name, const struct val *v);
};

/* Value ranges, and the bounds layer_line checks after each layer: with a sample of at most
 * 2^28 values entering a layer, no layer's sizes or FLOPs overflow 64 bits. */
#define BIG (1 << 20)
#define WIDE (1 << 16)
#define MAX_NUMEL ((int64_t)1 << 28)
#define MAX_PARAMS ((int64_t)1 << 36)
#define MAX_FLOPS ((int64_t)1 << 56)

static int b_linear(struct dp_model *m, const char *n, const struct val *v) {
    return dp_linear(m, n, v[0].i, (int)v[1].i);
}
static int b_conv2d(struct dp_model *m, const char *n, const struct val *v) {
    return dp_conv2d(m, n, v[0].i, (int)v[1].i, (int)v[2].i, (int)v[3].i, (int)v[4].i);
}
static int b_maxpool(struct dp_model *m, const char *n, const struct val *v) {
    return dp_maxpool2d(m, n, (int)v[0].i, (int)v[1].i);
}
static int b_gap(struct dp_model *m, const char *n, const struct val *v) {
    (void)v;
    return dp_global_avgpool(m, n);
}
static int b_relu(struct dp_model *m, const char *n, const struct val *v) {
    (void)v;
    return dp_relu(m, n);
}
static int b_gelu(struct dp_model *m, const char *n, const struct val *v) {
    (void)v;
    return dp_gelu(m, n);
}
static int b_gelu_erf(struct dp_model *m, const char *n, const struct val *v) {
    (void)v;
    return dp_gelu_erf(m, n);
}
static int b_flatten(struct dp_model *m, const char *n, const struct val *v) {
    (void)v;
    return dp_flatten(m, n);
}
static int b_dropout(struct dp_model *m, const char *n, const struct val *v) {
    return dp_dropout(m, n, (float)v[0].f);
}
static int b_batchnorm(struct dp_model *m, const char *n, const struct val *v) {
    return dp_batchnorm2d(m, n, (float)v[0].f, (float)v[1].f);
}
static int b_layernorm(struct dp_model *m, const char *n, const struct val *v) {
    return dp_layernorm(m, n, (float)v[0].f);
}
static int b_resblock(struct dp_model *m, const char *n, const struct val *v) {
    return dp_resblock(m, n, v[0].i, (int)v[1].i);
}
static int b_attention(struct dp_model *m, const char *n, const struct val *v) {
    return dp_attention(m, n, (int)v[0].i);
}
static int b_block(struct dp_model *m, const char *n, const struct val *v) {
    return dp_transformer_block(m, n, (int)v[0].i);
}
static int b_embedding(struct dp_model *m, const char *n, const struct val *v) {
    return dp_tokpos_embedding(m, n, v[0].s, v[1].i, v[3].i, v[2].i);
}
static int b_lm_head(struct dp_model *m, const char *n, const struct val *v) {
    return dp_tied_lm_head(m, n, v[0].s);
}

/* Every layer the engine builds; the keys in the order the canonical text writes them. */
static const struct kind kinds[] = {
    {"linear", {{"out", K_INT, NULL, 1, WIDE, 0}, {"bias", K_INT, "1", 0, 1, 0}}, b_linear},
    {"conv2d",
     {{"out", K_INT, NULL, 1, WIDE, 0},
      {"kernel", K_INT, NULL, 1, 15, 0},
      {"stride", K_INT, "1", 1, 15, 0},
      {"pad", K_INT, "0", 0, 15, 0},
      {"bias", K_INT, "1", 0, 1, 0}},
     b_conv2d},
    {"maxpool", {{"kernel", K_INT, NULL, 1, 15, 0}, {"stride", K_INT, "=kernel", 1, 15, 0}}, b_maxpool},
    {"global_avgpool", {{0}}, b_gap},
    {"relu", {{0}}, b_relu},
    {"gelu", {{0}}, b_gelu},
    {"gelu_erf", {{0}}, b_gelu_erf},
    {"flatten", {{0}}, b_flatten},
    {"dropout", {{"p", K_FLOAT, NULL, 0, 1, 2}}, b_dropout},
    {"batchnorm", {{"eps", K_FLOAT, "1e-05", 0, 1, 1}, {"momentum", K_FLOAT, "0.1", 0, 1, 0}}, b_batchnorm},
    {"layernorm", {{"eps", K_FLOAT, "1e-05", 0, 1, 1}}, b_layernorm},
    {"resblock", {{"out", K_INT, NULL, 1, WIDE, 0}, {"stride", K_INT, "1", 1, 15, 0}}, b_resblock},
    {"attention", {{"heads", K_INT, NULL, 1, 4096, 0}}, b_attention},
    {"transformer_block", {{"heads", K_INT, NULL, 1, 4096, 0}}, b_block},
    {"embedding",
     {{"pos", K_NAME, NULL, 0, 0, 0},
      {"vocab", K_INT, NULL, 1, BIG, 0},
      {"dim", K_INT, NULL, 1, WIDE, 0},
      {"ctx", K_INT, "=T", 1, WIDE, 0}},
     b_embedding},
    {"lm_head", {{"tied", K_NAME, NULL, 0, 0, 0}}, b_lm_head},
};

/* The parse: the text's origin for messages, the line being read. */
struct parse {
    const char *origin;
    int line;
    int64_t T; /* the token input's length (input tokens T), for embedding's ctx default */
};

static int perr(const struct parse *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int perr(const struct parse *ps, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dp_seterr(DP_EINVAL, "%s:%d: %s", ps->origin, ps->line, msg);
}

static int parse_int(const struct parse *ps, const char *what, const char *s, double lo, double hi, int64_t *v) {
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (end == s || *end || errno || x < lo || x > hi)
        return perr(ps, "%s: expected an integer in %.0f..%.0f, got '%s'", what, lo, hi, s);
    *v = x;
    return DP_OK;
}

/* A layer or parameter name: letters, digits, '_' and '.', starting with a letter or '_'. */
static int check_name(const struct parse *ps, const char *what, const char *s) {
    return dp__model_name_ok(s, strlen(s)) ? DP_OK
              : perr(ps, "%s: expected a name of letters, digits, '_' and '.' (at most 63), got '%.80s'", what, s);
}

static int parse_value(const struct parse *ps, const struct kind *k, const struct key *key, const char *s,
                       struct val *v) {
    char what[64];
    snprintf(what, sizeof what, "%s %s=", k->name, key->name);
    if (key->type == K_INT) return parse_int(ps, what, s, key->lo, key->hi, &v->i);
    if (key->type == K_NAME) {
        v->s = s;
        return check_name(ps, what, s);
    }
    char *end;
    double x = strtod(s, &end);
    if (end == s || *end || !isfinite(x) || x > key->hi || x < key->lo || (key->open == 1 && x == key->lo) ||
        (key->open == 2 && x == key->hi))
        return perr(ps, "%s: expected a number in %s%g, %g%s, got '%s'", what, key->open == 1 ? "(" : "[", key->lo,
                    key->hi, key->open == 2 ? ")" : "]", s);
    v->f = x;
    return DP_OK;
}

/* One layer statement, tokens tok[0] (the kind) .. tok[n - 1]. */
static int layer_line(struct parse *ps, struct dp_model *m, char **tok, int n) {
    const struct kind *k = NULL;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (!strcmp(kinds[i].name, tok[0])) k = &kinds[i];
    if (!k) {
        char list[512] = "";
        for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", kinds[i].name);
        return perr(ps, "unknown layer '%.80s' (expected input, loss, or a layer: %s)", tok[0], list);
    }
    if (n < 2) return perr(ps, "%s: expected a name after the kind (%s NAME ...)", k->name, k->name);
    int rc = check_name(ps, k->name, tok[1]);
    if (rc) return rc;
    int nk = 0;
    while (nk < MAX_KEYS && k->keys[nk].name) nk++;
    struct val v[MAX_KEYS] = {{0}};
    int given[MAX_KEYS] = {0};
    for (int t = 2; t < n; t++) {
        char *eq = strchr(tok[t], '=');
        if (!eq) return perr(ps, "%s %s: expected KEY=VALUE, got '%.80s'", k->name, tok[1], tok[t]);
        *eq = 0;
        int j = 0;
        while (j < nk && strcmp(k->keys[j].name, tok[t])) j++;
        if (j == nk) {
            char list[128] = "";
            for (int i = 0; i < nk; i++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", k->keys[i].name);
            return perr(ps, "%s: unknown key '%.40s' (%s takes %s)", k->name, tok[t], k->name, nk ? list : "none");
        }
        if (given[j]) return perr(ps, "%s: key '%s' given twice", k->name, tok[t]);
        given[j] = 1;
        if ((rc = parse_value(ps, k, &k->keys[j], eq + 1, &v[j]))) return rc;
    }
    for (int j = 0; j < nk; j++) {
        const struct key *key = &k->keys[j];
        if (given[j]) continue;
        if (!key->def) return perr(ps, "%s %s: missing %s=", k->name, tok[1], key->name);
        if (!strcmp(key->def, "=T")) {
            if (!ps->T) return perr(ps, "%s: needs the token input (input tokens T)", k->name);
            v[j].i = ps->T;
        } else if (key->def[0] == '=') {
            for (int i = 0; i < nk; i++)
                if (!strcmp(k->keys[i].name, key->def + 1)) v[j] = v[i];
        } else if (key->type == K_INT) v[j].i = strtoll(key->def, NULL, 10);
        else v[j].f = strtod(key->def, NULL);
    }
    if ((rc = k->build(m, tok[1], v))) { /* (the constructors' messages name the layer, mostly) */
        if (strstr(dp_errmsg(), tok[1])) return dp_adderr(rc, "%s:%d", ps->origin, ps->line);
        return dp_adderr(rc, "%s:%d: %s %s", ps->origin, ps->line, k->name, tok[1]);
    }
    struct dp_shape cur = dp_model_cur_shape(m);
    if (dp_shape_numel(&cur) > MAX_NUMEL)
        return perr(ps, "%s %s: %lld values a sample come out, more than 2^28", k->name, tok[1],
                    (long long)dp_shape_numel(&cur));
    if (m->num_params + m->num_buffers > MAX_PARAMS || m->flops_fwd > MAX_FLOPS)
        return perr(ps, "%s %s: the model reaches %lld parameters and %lld FLOPs a sample, more than 2^36 and 2^56",
                    k->name, tok[1], (long long)(m->num_params + m->num_buffers), (long long)m->flops_fwd);
    return DP_OK; /* (the constructor wrote the layer's canonical line) */
}

/* Splits a statement (modified) at blanks into at most MAX_TOKENS tokens. */
static int tokenize(const struct parse *ps, char *line, char **tok) {
    int n = 0;
    for (char *s = strtok(line, " \t\r"); s; s = strtok(NULL, " \t\r")) {
        if (n == MAX_TOKENS) return perr(ps, "more than %d words on one line", MAX_TOKENS);
        tok[n++] = s;
    }
    return n;
}

/* The input statement: "input C H W" or "input tokens T". */
static int input_line(struct parse *ps, char **tok, int n, struct dp_shape *in) {
    if (n == 3 && !strcmp(tok[1], "tokens")) {
        int64_t T;
        int rc = parse_int(ps, "input tokens T", tok[2], 1, WIDE, &T);
        if (rc) return rc;
        *in = (struct dp_shape){1, {T, 0, 0, 0}};
        ps->T = T;
        return DP_OK;
    }
    if (n != 4) return perr(ps, "input: expected 'input C H W' (e.g. input 1 28 28) or 'input tokens T'");
    *in = (struct dp_shape){3, {0, 0, 0, 0}};
    static const char *dims[] = {"input C", "input H", "input W"};
    for (int i = 0; i < 3; i++) {
        int rc = parse_int(ps, dims[i], tok[1 + i], 1, WIDE, &in->d[i]);
        if (rc) return rc;
    }
    if (in->d[0] * in->d[1] * in->d[2] > MAX_NUMEL)
        return perr(ps, "input: %lld x %lld x %lld values a sample, more than 2^28", (long long)in->d[0],
                    (long long)in->d[1], (long long)in->d[2]);
    return DP_OK;
}

/* One statement (modified in place): the input, a layer, or the loss. */
static int statement(struct parse *ps, struct dp_model **mp, char *st, int *seen_loss) {
    char *tok[MAX_TOKENS];
    int n = tokenize(ps, st, tok), rc = DP_OK;
    if (n <= 0) return n;
    struct dp_model *m = *mp;
    if (*seen_loss) return perr(ps, "'%.80s' after the loss: the loss statement is the last", tok[0]);
    if (!strcmp(tok[0], "input")) {
        struct dp_shape in;
        if (m) return perr(ps, "a second input statement (a model has one input)");
        if ((rc = input_line(ps, tok, n, &in))) return rc;
        char spec[128];
        const char *base = strrchr(ps->origin, '/');
        snprintf(spec, sizeof spec, "file:%s", base ? base + 1 : ps->origin);
        return dp_model_init(mp, spec, &in);
    }
    if (!m)
        return perr(ps, "'%.80s' before the input statement (a model file starts with 'input C H W' or "
                    "'input tokens T')", tok[0]);
    if (!strcmp(tok[0], "loss")) {
        if (n != 2 || (strcmp(tok[1], "cross_entropy") && strcmp(tok[1], "mse")))
            return perr(ps, "loss: expected 'loss cross_entropy' (softmax cross-entropy, for classes) or "
                        "'loss mse' (mean squared error, for a regression)");
        m->loss = strcmp(tok[1], "mse") ? DP_LOSS_XENT : DP_LOSS_MSE;
        *seen_loss = 1;
        return DP_OK;
    }
    return layer_line(ps, m, tok, n);
}

int dp_model_from_text(struct dp_model **out, const char *text, const char *origin) {
    *out = NULL;
    struct parse ps = {.origin = origin ? origin : "model"};
    struct dp_model *m = NULL;
    int rc = DP_OK, seen_loss = 0;
    char line[MAX_LINE + 2];
    const char *s = text ? text : "";
    while (*s && !rc) {
        ps.line++;
        const char *nl = strchr(s, '\n');
        size_t len = nl ? (size_t)(nl - s) : strlen(s);
        if (len > MAX_LINE) {
            rc = perr(&ps, "line longer than %d characters", MAX_LINE);
            break;
        }
        memcpy(line, s, len);
        line[len] = 0;
        s += len + (nl != NULL);
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        /* a line holds one statement, or several separated by ';' */
        for (char *st = line, *next; st && !rc; st = next) {
            next = strchr(st, ';');
            if (next) *next++ = 0;
            rc = statement(&ps, &m, st, &seen_loss);
        }
    }
    if (!rc && !m) rc = dp_seterr(DP_EINVAL, "%s: no input line: the model is empty", ps.origin);
    if (!rc && m->nlayers == 0) rc = dp_seterr(DP_EINVAL, "%s: no layers after the input line", ps.origin);
    if (!rc && (rc = dp_model_finalize(m))) rc = dp_adderr(rc, "%s", ps.origin);
    if (rc) {
        dp_model_free(m);
        return rc;
    }
    *out = m; /* (m->desc: its canonical text, written by the constructors and dp_model_finalize) */
    return DP_OK;
}

int dp_model_read_file(const char *path, char **text) {
    *text = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return dp_seterr(errno == ENOENT ? DP_ENOENT : DP_EIO, "model file %s: %s", path, strerror(errno));
    enum { CAP = 1 << 20 }; /* a model file is a few hundred bytes; 1 MiB is not one */
    char *buf = dp_malloc(CAP + 1);
    if (!buf) {
        fclose(f);
        return dp_seterr(DP_ENOMEM, "model file %s: out of memory", path);
    }
    size_t n = fread(buf, 1, CAP + 1, f);
    int err = ferror(f);
    fclose(f);
    int rc = err ? dp_seterr(DP_EIO, "model file %s: read error", path)
             : n > CAP ? dp_seterr(DP_EINVAL, "model file %s: larger than 1 MiB (not a model file?)", path)
             : memchr(buf, 0, n) ? dp_seterr(DP_EINVAL, "model file %s: holds a NUL byte (not a text file)", path)
                                 : DP_OK;
    if (rc) {
        dp_free(buf);
        return rc;
    }
    buf[n] = 0;
    *text = buf;
    return DP_OK;
}

int dp_model_from_file(struct dp_model **out, const char *path) {
    *out = NULL;
    char *text;
    int rc = dp_model_read_file(path, &text);
    if (rc) return rc;
    rc = dp_model_from_text(out, text, path);
    dp_free(text);
    return rc;
}

int dp_model_text_reads_tokens(const char *text) {
    /* the first statement: "input tokens T" */
    const char *s = text ? text : "";
    for (;;) {
        s += strspn(s, " \t\r\n");
        if (*s != '#') break;
        s += strcspn(s, "\n");
    }
    if (strncmp(s, "input", 5) || (s[5] != ' ' && s[5] != '\t')) return 0;
    s += 5 + strspn(s + 5, " \t");
    return !strncmp(s, "tokens", 6) && (s[6] == ' ' || s[6] == '\t');
}

int dp_model_reads_tokens(const struct dp_model *m) { return m->in_shape.ndim == 1; }
