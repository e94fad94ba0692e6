/* train's options by name (dp/train.h "train's options by name"): the mechanism over the
 * table of option_table.c.  Each entry says how its text becomes a field of
 * struct dp_train_params, when the field is part of the run's stored configuration, and
 * which setting it needs. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/ddp.h"
#include "options.h"

struct dp_train_params *dp_train_params_new(void) {
    struct dp_train_params *p = malloc(sizeof *p);
    if (p) *p = dp_train_default_params();
    return p;
}
void dp_train_params_free(struct dp_train_params *p) { free(p); }

const struct dp_train_option *dp_train_option_at(int i) {
    return i >= 0 && i < dp__nopts ? &dp__opts[i].pub : NULL;
}
const char *dp_train_option_name(int i) { return i >= 0 && i < dp__nopts ? dp__opts[i].pub.name : NULL; }

/* The entry of NAME: "--" optional, '_' the same as '-' */
static const struct dp__opt *find(const char *name) {
    if (!name) return NULL;
    if (!strncmp(name, "--", 2)) name += 2;
    for (int i = 0; i < dp__nopts; i++) {
        const char *a = dp__opts[i].pub.name, *b = name;
        while (*a && (*a == *b || (*a == '-' && *b == '_'))) a++, b++;
        if (!*a && !*b) return &dp__opts[i];
    }
    return NULL;
}
const struct dp_train_option *dp_train_option_find(const char *name) {
    const struct dp__opt *o = find(name);
    return o ? &o->pub : NULL;
}

const char *dp__flt(char *out, size_t n, float x) {
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(out, n, "%.*g", prec, (double)x);
        if (strtof(out, NULL) == x) break;
    }
    return out;
}

static void *field(struct dp_train_params *p, const struct dp__opt *o) { return (char *)p + o->off; }
static const void *cfield(const struct dp_train_params *p, const struct dp__opt *o) {
    return (const char *)p + o->off;
}

/* "a|b|c" -> "a, b or c" */
static void choice_list(const char *choices, char *out, size_t n) {
    size_t k = 0, words = 1;
    for (const char *c = choices; *c; c++) words += *c == '|';
    size_t w = 0;
    for (const char *c = choices; *c && k + 4 < n; c++) {
        if (*c != '|') {
            out[k++] = *c;
            continue;
        }
        const char *sep = ++w == words - 1 ? " or " : ", ";
        for (; *sep && k + 1 < n; sep++) out[k++] = *sep;
    }
    out[k] = 0;
}

int dp_train_option_set(struct dp_train_params *p, const char *name, const char *value) {
    const struct dp__opt *o = find(name);
    if (!o) return dp_seterr(DP_EINVAL, "unknown option '%s'", name ? name : "(null)");
    const char *nm = o->pub.name;
    if (!value && o->pub.arg && !o->pub.optional) return dp_seterr(DP_EINVAL, "option --%s needs a value", nm);
    char *end;
    errno = 0;
    switch (o->kind) {
    case DP__OPT_FLAG: {
        int on;
        if (!value || !*value || !strcmp(value, "1") || !strcmp(value, "true") || !strcmp(value, "yes") ||
            !strcmp(value, "on"))
            on = 1;
        else if (!strcmp(value, "0") || !strcmp(value, "false") || !strcmp(value, "no") || !strcmp(value, "off"))
            on = 0;
        else return dp_seterr(DP_EINVAL, "option --%s is a flag: expected no value, or 1/0, true/false", nm);
        *(int *)field(p, o) = on ? o->flag_on : !o->flag_on;
        return DP_OK;
    }
    case DP__OPT_INT:
    case DP__OPT_I64:
    case DP__OPT_U64: {
        long long x = strtoll(value, &end, 10);
        if (errno || end == value || *end || x < o->ilo || x > o->ihi)
            return dp_seterr(DP_EINVAL, "--%s: '%s' is not an integer in %lld..%lld", nm, value, o->ilo, o->ihi);
        if (o->kind == DP__OPT_INT) *(int *)field(p, o) = (int)x;
        else if (o->kind == DP__OPT_I64) *(int64_t *)field(p, o) = x;
        else *(uint64_t *)field(p, o) = (uint64_t)x;
        return DP_OK;
    }
    case DP__OPT_F32:
    case DP__OPT_F64: {
        double x = strtod(value, &end);
        if (errno || end == value || *end || !isfinite(x) || !(x >= o->lo && x <= o->hi))
            return dp_seterr(DP_EINVAL, "--%s: '%s' is not a number in %g..%g", nm, value, o->lo, o->hi);
        if (o->kind == DP__OPT_F32) *(float *)field(p, o) = (float)x;
        else *(double *)field(p, o) = x;
        return DP_OK;
    }
    case DP__OPT_STR:
    case DP__OPT_PATH:
        *(const char **)field(p, o) = value;
        return DP_OK;
    case DP__OPT_CHOICE: {
        int i = 0;
        for (const char *c = o->choices; *c; i++) {
            size_t len = strcspn(c, "|");
            if (strlen(value) == len && !strncmp(c, value, len)) {
                *(int *)field(p, o) = o->vals[i];
                return DP_OK;
            }
            c += len + (c[len] == '|');
        }
        char list[160];
        choice_list(o->choices, list, sizeof list);
        return dp_seterr(DP_EINVAL, "--%s: expected %s, got '%s'", nm, list, value);
    }
    case DP__OPT_CUSTOM:
        return o->set(p, value);
    }
    return dp_seterr(DP_EINVAL, "option --%s: no reader", nm);
}

/* Whether the setting option o is for is p's (and if not, why, into why) */
static int applies(const struct dp_train_params *p, const struct dp__opt *o, char *why, size_t n) {
    const char *nm = o->pub.name;
    int kind = p->dp.compress.kind;
    switch (o->need) {
    case DP__NEED_ANY: return 1;
    case DP__NEED_SGD:
        if (p->optim.kind == DP_OPTIM_SGD) return 1;
        snprintf(why, n, "--%s applies to --optim sgd only (AdamW's momentum is --beta1)", nm);
        return 0;
    case DP__NEED_ADAMW:
        if (p->optim.kind == DP_OPTIM_ADAMW) return 1;
        snprintf(why, n, "--%s applies to --optim adamw only (this run's optimizer is %s)", nm,
                 dp_optim_kind_name(p->optim.kind));
        return 0;
    case DP__NEED_COSINE:
    case DP__NEED_STEP: {
        int cos = o->need == DP__NEED_COSINE;
        if (p->sched.kind == (cos ? DP_SCHED_COSINE : DP_SCHED_STEP)) return 1;
        snprintf(why, n, "--%s applies to --schedule %s only (this run's schedule is %s)", nm, cos ? "cosine" : "step",
                 dp_sched_kind_name(p->sched.kind));
        return 0;
    }
    case DP__NEED_ZERO1:
        if (p->dp.zero == 1) return 1;
        snprintf(why, n, "--%s applies to --zero 1 only", nm);
        return 0;
    case DP__NEED_DET:
        if (p->dp.deterministic) return 1;
        snprintf(why, n, "--%s applies to --deterministic runs only", nm);
        return 0;
    case DP__NEED_POWERSGD:
        if (kind == DP_COMPRESS_POWERSGD) return 1;
        snprintf(why, n, "--%s applies to --compress powersgd:RANK only (this run's is %s)", nm,
                 dp_compress_name(p->dp.compress.kind));
        return 0;
    case DP__NEED_RESIDUAL:
        if (kind == DP_COMPRESS_TOPK || kind == DP_COMPRESS_SIGN || kind == DP_COMPRESS_POWERSGD) return 1;
        snprintf(why, n, "--%s applies to --compress topk, sign and powersgd only (%s keeps no residual)", nm,
                 dp_compress_name(p->dp.compress.kind));
        return 0;
    }
    return 1;
}

int dp_train_option_check(const struct dp_train_params *p, const char *name) {
    const struct dp__opt *o = find(name);
    if (!o) return dp_seterr(DP_EINVAL, "unknown option '%s'", name ? name : "(null)");
    char why[256];
    return applies(p, o, why, sizeof why) ? DP_OK : dp_seterr(DP_EINVAL, "%s", why);
}

/* Option o's value as the configuration stores it, into out; 0 when it is not stored */
static int render_one(const struct dp_train_params *p, const struct dp__opt *o, char *out, size_t n) {
    const struct dp_train_params d = dp_train_default_params();
    char why[8];
    if (o->store == DP__STORE_NO || !applies(p, o, why, sizeof why)) return 0;
    int always = o->store == DP__STORE_ALWAYS;
    const void *f = cfield(p, o), *g = cfield(&d, o);
    out[0] = 0;
    switch (o->kind) {
    case DP__OPT_FLAG:
        /* (a flag is stored by its presence) */
        return *(const int *)f == o->flag_on && (always || *(const int *)f != *(const int *)g);
    case DP__OPT_INT:
        return (always || *(const int *)f != *(const int *)g) && snprintf(out, n, "%d", *(const int *)f) > 0;
    case DP__OPT_I64:
        return (always || *(const int64_t *)f != *(const int64_t *)g) &&
               snprintf(out, n, "%lld", (long long)*(const int64_t *)f) > 0;
    case DP__OPT_U64:
        return (always || *(const uint64_t *)f != *(const uint64_t *)g) &&
               snprintf(out, n, "%llu", (unsigned long long)*(const uint64_t *)f) > 0;
    case DP__OPT_F32:
        return (always || *(const float *)f != *(const float *)g) && dp__flt(out, n, *(const float *)f);
    case DP__OPT_F64:
        return (always || *(const double *)f != *(const double *)g) &&
               snprintf(out, n, "%.17g", *(const double *)f) > 0;
    case DP__OPT_STR:
    case DP__OPT_PATH: {
        const char *s = *(const char *const *)f;
        if (!s) return 0;
        char *abs = o->kind == DP__OPT_PATH ? realpath(s, NULL) : NULL;
        snprintf(out, n, "%s", abs ? abs : s);
        free(abs);
        return 1;
    }
    case DP__OPT_CHOICE: {
        int v = *(const int *)f, i = 0;
        if (!always && v == *(const int *)g) return 0;
        for (const char *c = o->choices; *c; i++) {
            size_t len = strcspn(c, "|");
            if (o->vals[i] == v) return snprintf(out, n, "%.*s", (int)len, c) > 0;
            c += len + (c[len] == '|');
        }
        return 0;
    }
    case DP__OPT_CUSTOM:
        return o->get && o->get(p, out, n);
    }
    return 0;
}

char *dp_train_options_render(const struct dp_train_params *p) {
    size_t cap = 4096, len = 0;
    char *text = malloc(cap);
    if (!text) return NULL;
    text[0] = 0;
    for (int i = 0; i < dp__nopts; i++) {
        const struct dp__opt *o = &dp__opts[i];
        char v[4200];
        if (!render_one(p, o, v, sizeof v)) continue;
        size_t need = strlen(o->pub.name) + strlen(v) + 5;
        if (len + need >= cap) {
            char *q = realloc(text, cap = 2 * cap + need);
            if (!q) return free(text), NULL;
            text = q;
        }
        /* a flag renders as "--name", a value as "--name=value" */
        len += (size_t)snprintf(text + len, cap - len, o->kind == DP__OPT_FLAG ? "--%s\n" : "--%s=%s\n", o->pub.name, v);
    }
    return text;
}
