/* Timers, hashes and checksums. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "core_impl.h"
#include "dp/core.h"

double dp_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int dp_cpus_allowed(void) {
    cpu_set_t s;
    if (sched_getaffinity(0, sizeof s, &s) == 0 && CPU_COUNT(&s) > 0) return CPU_COUNT(&s);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int dp_thread_sched_times(double *run_s, double *runq_s) {
    /* "run_ns runq_ns timeslices" (Documentation/scheduler/sched-stats.rst) */
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    if (!f) return -1;
    unsigned long long run = 0, runq = 0;
    int n = fscanf(f, "%llu %llu", &run, &runq);
    fclose(f);
    if (n != 2) return -1;
    *run_s = 1e-9 * (double)run, *runq_s = 1e-9 * (double)runq;
    return 0;
}

int dp_cond_init_monotonic(pthread_cond_t *cv) {
    pthread_condattr_t a;
    if (pthread_condattr_init(&a)) return -1;
    int rc = pthread_condattr_setclock(&a, CLOCK_MONOTONIC); /* dp_time()'s clock */
    if (!rc) rc = pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
    return rc ? -1 : 0;
}

int dp_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, double deadline) {
    if (dp_time() >= deadline) return ETIMEDOUT;
    struct timespec ts;
    ts.tv_sec = (time_t)deadline;
    ts.tv_nsec = (long)((deadline - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    return pthread_cond_timedwait(cv, mu, &ts) == ETIMEDOUT ? ETIMEDOUT : 0;
}

/* 1 if any x[i] is NaN or infinite: an all-ones exponent.  Integer tests so
 * the loop vectorises (a float sum would be a serial dependency chain).  The
 * bits are read with memcpy, not through a uint32_t pointer (which would
 * break strict aliasing); a 4-byte memcpy compiles to the same plain load. */
int dp_any_nonfinite(const float *x, int64_t n) {
    uint32_t bad = 0;
    /* (gcc 12 at -O2 only vectorises this with the explicit simd request) */
#pragma omp simd reduction(| : bad)
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        bad |= (u & 0x7f800000u) == 0x7f800000u; /* exponent all ones: Inf or NaN */
    }
    return bad != 0;
}

int dp_fixed_add(double *restrict acc, const float *restrict g, int64_t n) {
    int bad = 0;
#pragma omp simd reduction(| : bad)
    for (int64_t i = 0; i < n; i++) {
        double v = nearbyint((double)g[i] * DP_FIXED_SCALE);
        bad |= !(fabs(v) < 4503599627370496.0); /* 2^52: NaN fails too */
        acc[i] += v;
    }
    return bad;
}

int dp_fixed_take(double *restrict acc, float *restrict g, int64_t n, int store) {
    int bad = 0;
    if (store) {
#pragma omp simd reduction(| : bad)
        for (int64_t i = 0; i < n; i++) {
            double v = nearbyint((double)g[i] * DP_FIXED_SCALE);
            bad |= !(fabs(v) < 4503599627370496.0);
            acc[i] = 0.0 + v;
            g[i] = 0;
        }
    } else {
#pragma omp simd reduction(| : bad)
        for (int64_t i = 0; i < n; i++) {
            double v = nearbyint((double)g[i] * DP_FIXED_SCALE);
            bad |= !(fabs(v) < 4503599627370496.0);
            acc[i] += v;
            g[i] = 0;
        }
    }
    return bad;
}

size_t dp__json_escape(char *out, size_t cap, const char *s) {
    size_t need = 0, k = 0;
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        char piece[8];
        int n = ch == '"' || ch == '\\' ? snprintf(piece, sizeof piece, "\\%c", ch)
              : ch < 0x20            ? snprintf(piece, sizeof piece, "\\u%04x", ch)
                                     : snprintf(piece, sizeof piece, "%c", ch);
        if (need == k && k + (size_t)n < cap) memcpy(out + k, piece, (size_t)n), k += (size_t)n;
        need += (size_t)n;
    }
    if (cap) out[k] = 0;
    return need;
}

uint64_t dp_fnv1a64(const void *data, size_t n, uint64_t h) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* CRC-32 with the reflected IEEE polynomial 0xEDB88320 (zip's, PNG's): zlib's,
 * about ten times a byte-wise table's rate (3.4 MB in 0.8 ms against 8 ms
 * here), which every checkpoint write and load pays; crc32_z takes a size_t
 * length.  (zlib answers a NULL buffer with the initial value 0, not crc: an
 * empty piece returns crc itself.) */
uint32_t dp_crc32(uint32_t crc, const void *data, size_t n) {
    return n ? (uint32_t)crc32_z(crc, data, n) : crc;
}

/* NaN fails every comparison, so a running maximum updated by `d > max`
 * (or overwritten by `!(d <= max)`) loses a NaN at the next finite element:
 * non-finite inputs are caught up front instead, before any arithmetic. */
double dp_rel_diff(const float *a, const float *b, int64_t n) {
    double dmax = 0, amax = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) return INFINITY;
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > dmax) dmax = d;
        if (fabs((double)a[i]) > amax) amax = fabs((double)a[i]);
    }
    return dmax == 0 ? 0 : amax > 0 ? dmax / amax : INFINITY;
}

int dp__thread_start(pthread_t *th, const char *name, void *(*fn)(void *), void *arg) {
    /* the new thread inherits the creating thread's mask: block, create, restore */
    sigset_t all, old;
    sigfillset(&all);
    static const int sync[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT};
    for (size_t i = 0; i < sizeof sync / sizeof sync[0]; i++) sigdelset(&all, sync[i]);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(th, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc == 0) pthread_setname_np(*th, name); /* (a name too long is refused: the thread runs unnamed) */
    return rc;
}
