/* Status codes, per-thread error messages and the abort hook. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/common.h"

static _Thread_local char errbuf[512];

const char *dp_strerror(int status) {
    switch (status) {
#define DP__CASE(name, val, text) \
    case val: return text;
        DP_STATUS_MAP(DP__CASE)
#undef DP__CASE
    default: return "unknown error";
    }
}

const char *dp_errmsg(void) { return errbuf; }

void dp_clearerr(void) { errbuf[0] = '\0'; }

int dp_seterr(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, sizeof errbuf, fmt, ap);
    va_end(ap);
    return status;
}

int dp_adderr(int status, const char *fmt, ...) {
    char prefix[256], old[sizeof errbuf];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, errbuf, sizeof old);
    const char *rest = old[0] ? old : dp_strerror(status);
    /* Truncation is fine here: the message is for people. */
    size_t np = strlen(prefix);
    memcpy(errbuf, prefix, np);
    size_t pos = np;
    if (pos + 2 < sizeof errbuf) errbuf[pos++] = ':', errbuf[pos++] = ' ';
    size_t nr = strlen(rest);
    if (nr > sizeof errbuf - 1 - pos) nr = sizeof errbuf - 1 - pos;
    memcpy(errbuf + pos, rest, nr);
    errbuf[pos + nr] = '\0';
    return status;
}

static void default_abort(const char *file, int line, const char *msg) {
    fprintf(stderr, "dptrain: assertion failed at %s:%d: %s\n", file, line, msg);
    abort();
}

static dp_abort_fn abort_fn = default_abort;

void dp_set_abort(dp_abort_fn fn) { abort_fn = fn ? fn : default_abort; }

void dp__abort(const char *file, int line, const char *msg) {
    abort_fn(file, line, msg);
    abort(); /* the hook must not return */
}
