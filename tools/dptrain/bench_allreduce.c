/*
 * `dptrain bench allreduce`: all-reduce time, algorithm bandwidth and bus
 * bandwidth of the thread backend, or with --backend mpi of the mpi backend
 * (one rank per process, under mpirun), for message sizes from 4 KiB to
 * 256 MiB.
 *
 *   algbw = bytes / time;  busbw = algbw · 2(P-1)/P  (DESIGN.md §4; the figure
 *   that compares across P and with nccl-tests / Open MPI)
 *
 * Method.  P worker threads, one rank each, each with one buffer of the
 * largest size, allocated and touched once (dp_malloc_big: huge pages, no
 * first-touch faults in the timed loop) and reused for every size.  Per size:
 * one checked all-reduce (every rank fills rank+1, the sum must be
 * P(P+1)/2), warm-up, then `iters` timed all-reduces, each preceded by a
 * barrier; an iteration's time is the slowest rank's; the figure is the
 * median over iterations.  The values keep growing by P per call and may
 * reach inf, which costs nothing on this hardware.
 *
 * --backend mpi: the same per process (`mpirun -np P dptrain bench allreduce
 * --backend mpi`); the ranks' times are gathered with dp_comm_allgather at
 * the end and rank 0 prints the table.  mpirun binds the processes itself.
 *
 * With --membw (on by default when the largest size is >= 16 MiB) it also
 * measures the memory bound: P threads each stream over their own buffer
 * reading and writing it in place (a[i] += 1: n bytes read, n written, the
 * per-rank traffic of the direct all-reduce).  An in-place all-reduce must
 * read every input once and write every output once, 2·P·n bytes in all, so
 * at B bytes/s: time >= 2Pn/B, algbw <= B/(2P), busbw <= B·(P-1)/P².
 *
 * The only part of dptrain besides main.c that prints; errors are one line
 * "dptrain: error: ..." and exit status 1.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/comm.h"
#include "dp/core.h"

int dptrain_cmd_bench_allreduce(int argc, char **argv);

static const char *help_bench_allreduce =
    "usage: dptrain bench allreduce [options]\n"
    "\n"
    "All-reduce (sum) speed of a communicator backend: for each size from --min-bytes\n"
    "to --max-bytes (x4 steps) prints the median time, algbw = bytes/time and\n"
    "busbw = algbw * 2(P-1)/P.\n"
    "\n"
    "  --backend NAME    thread | mpi [thread]; mpi runs one rank per process:\n"
    "                    mpirun -np P dptrain bench allreduce --backend mpi\n"
    "  --workers P       ranks (threads) of the thread backend [2]\n"
    "  --algo NAME       auto | ring | rhd | direct | native [auto]\n"
    "  --dtype NAME      f32 | bf16 | f64 [f32]\n"
    "  --min-bytes N     smallest message, suffixes K, M, G (binary) [4K]\n"
    "  --max-bytes N     largest message [256M]\n"
    "  --iters N         timed iterations per size [auto: about 0.3 s per size, 5..500]\n"
    "  --warmup N        untimed iterations per size [2]\n"
    "  --spin-us N       busy-wait before sleeping in a wait [auto]\n"
    "  --comm-thread     mpi: make the calls from a second thread, as dptrain's\n"
    "                    communication thread does\n"
    "  --timeout S       the communicator's timeout_s [thread: 120; mpi: 0, so that a\n"
    "                    blocking native all-reduce is MPI_Allreduce itself; with a\n"
    "                    timeout it is MPI_Iallreduce, polled]\n"
    "  --pin, --no-pin   pin worker r to the r-th allowed CPU, as mpirun binds its\n"
    "                    processes [on when the workers fit on the CPUs]\n"
    "  --membw, --no-membw  measure the memory-bandwidth bound [on when max >= 16M]\n";

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "dptrain: error: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

static long long parse_num(const char *opt, const char *s, long long lo, long long hi, int bytes) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || errno) die("%s: '%s' is not a number", opt, s);
    if (bytes && *end) {
        int shift = 0;
        switch (*end) {
        case 'k': case 'K': shift = 10; break;
        case 'm': case 'M': shift = 20; break;
        case 'g': case 'G': shift = 30; break;
        default: die("%s: bad suffix in '%s' (K, M or G)", opt, s);
        }
        end++;
        if (*end == 'i') end++;
        if (*end == 'B' || *end == 'b') end++;
        if (v > (hi >> shift)) die("%s: %s is out of range", opt, s);
        v <<= shift;
    }
    if (*end) die("%s: '%s' is not a number", opt, s);
    if (v < lo || v > hi) die("%s: %s is out of range %lld..%lld", opt, s, lo, hi);
    return v;
}

/* ---- the workers ---------------------------------------------------------------- */

struct bench {
    int P, warmup, iters_opt, pin, mpi, comm_thread;
    enum dp_comm_algo algo;
    enum dp_dtype dtype;
    size_t min_bytes, max_bytes;
    int nsizes;
    size_t sizes[64];
    int iters[64];
    struct dp_comm_world *w;
    double *times; /* [rank][size][iter], iters capped at 500 */
    int failed_rank;
    char err[512];
    pthread_mutex_t mu;
};
#define MAX_ITERS 500

struct worker {
    struct bench *b;
    int rank;
};

static void fill(void *buf, size_t count, enum dp_dtype t, double v) {
    for (size_t i = 0; i < count; i++) {
        if (t == DP_DTYPE_F32) ((float *)buf)[i] = (float)v;
        else if (t == DP_DTYPE_F64) ((double *)buf)[i] = v;
        else ((uint16_t *)buf)[i] = dp_bf16_from_f32((float)v);
    }
}
static double get(const void *buf, size_t i, enum dp_dtype t) {
    if (t == DP_DTYPE_F32) return ((const float *)buf)[i];
    if (t == DP_DTYPE_F64) return ((const double *)buf)[i];
    return dp_bf16_to_f32(((const uint16_t *)buf)[i]);
}

static void fail(struct bench *b, struct dp_comm *c, int rank, const char *what) {
    pthread_mutex_lock(&b->mu);
    if (b->failed_rank < 0) {
        b->failed_rank = rank;
        snprintf(b->err, sizeof b->err, "rank %d: %s", rank, what);
    }
    pthread_mutex_unlock(&b->mu);
    if (c) dp_comm_abort(c, what);
}

/* Pins the calling thread to the r-th CPU it may run on (best effort). */
static void pin_to(int r) {
    cpu_set_t allowed, one;
    if (sched_getaffinity(0, sizeof allowed, &allowed)) return;
    for (int cpu = 0, k = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &allowed)) continue;
        if (k++ == r % CPU_COUNT(&allowed)) {
            CPU_ZERO(&one);
            CPU_SET(cpu, &one);
            pthread_setaffinity_np(pthread_self(), sizeof one, &one);
            return;
        }
    }
}

static void *worker_main(void *p) {
    struct worker *wk = p;
    struct bench *b = wk->b;
    int r = wk->rank, P = b->P;
    if (b->pin) pin_to(r);
    struct dp_comm *c = NULL;
    void *buf = NULL;
    int rc = dp_comm_thread_init(&c, b->w, r);
    if (rc) {
        fail(b, NULL, r, dp_errmsg());
        return NULL;
    }
    size_t esize = dp_dtype_size(b->dtype);
    if (!(buf = dp_malloc_big(b->max_bytes))) {
        fail(b, c, r, "out of memory for the buffer");
        goto out;
    }
    for (int s = 0; s < b->nsizes; s++) {
        size_t count = b->sizes[s] / esize;
        /* one checked call */
        fill(buf, count, b->dtype, r + 1);
        if ((rc = dp_comm_allreduce(c, buf, (int64_t)count, b->dtype, b->algo))) {
            fail(b, c, r, dp_errmsg());
            goto out;
        }
        double want = P * (P + 1) / 2.0;
        size_t probe[3] = {0, count / 2, count - 1};
        for (int k = 0; k < 3; k++)
            if (get(buf, probe[k], b->dtype) != want) {
                char msg[160];
                snprintf(msg, sizeof msg,
                         "wrong result at %zu bytes: element %zu is %g, expected %g", b->sizes[s],
                         probe[k], get(buf, probe[k], b->dtype), want);
                fail(b, c, r, msg);
                goto out;
            }
        for (int i = 0; i < b->warmup + b->iters[s]; i++) {
            if ((rc = dp_comm_barrier(c))) {
                fail(b, c, r, dp_errmsg());
                goto out;
            }
            double t0 = dp_time();
            if ((rc = dp_comm_allreduce(c, buf, (int64_t)count, b->dtype, b->algo))) {
                fail(b, c, r, dp_errmsg());
                goto out;
            }
            double t1 = dp_time();
            if (i >= b->warmup)
                b->times[((size_t)r * 64 + (size_t)s) * MAX_ITERS + (size_t)(i - b->warmup)] =
                    t1 - t0;
        }
    }
out:
    dp_free(buf);
    dp_comm_free(c);
    return NULL;
}

/* ---- the memory-bandwidth probe ------------------------------------------------------ */

typedef float v16f __attribute__((vector_size(64)));

struct probe {
    float *a;
    size_t n; /* floats, a multiple of 16 */
    pthread_barrier_t *bar;
    double dt;
};

static void *probe_main(void *p) {
    struct probe *pr = p;
    const v16f one = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    double best = 1e30;
    for (int rep = 0; rep < 4; rep++) {
        pthread_barrier_wait(pr->bar);
        double t0 = dp_time();
        for (size_t i = 0; i < pr->n; i += 16) {
            v16f v;
            memcpy(&v, pr->a + i, sizeof v);
            v += one;
            memcpy(pr->a + i, &v, sizeof v);
        }
        double dt = dp_time() - t0;
        pthread_barrier_wait(pr->bar);
        if (rep && dt < best) best = dt; /* the first pass warms up */
    }
    pr->dt = best;
    return NULL;
}

/* In-place read+write bandwidth of P threads over `bytes` each, in bytes/s
 * counting both directions. */
static double measure_membw(int P, size_t bytes) {
    struct probe pr[64];
    pthread_t th[64];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)P);
    size_t n = bytes / sizeof(float) / 16 * 16;
    for (int r = 0; r < P; r++) {
        pr[r] = (struct probe){dp_malloc_big(n * sizeof(float)), n, &bar, 0};
        if (!pr[r].a) die("out of memory for the bandwidth probe");
        memset(pr[r].a, 0, n * sizeof(float));
    }
    for (int r = 0; r < P; r++)
        if (pthread_create(&th[r], NULL, probe_main, &pr[r])) die("cannot start a thread");
    double slowest = 0;
    for (int r = 0; r < P; r++) {
        pthread_join(th[r], NULL);
        if (pr[r].dt > slowest) slowest = pr[r].dt;
        dp_free(pr[r].a);
    }
    pthread_barrier_destroy(&bar);
    return 2.0 * (double)P * (double)(n * sizeof(float)) / slowest;
}

/* ---- the command ------------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void print_head(void) {
    printf("# time = median over iterations of the slowest rank; busbw = algbw * 2(P-1)/P;\n"
           "# best_busbw from the fastest iteration\n");
    printf("%12s %12s %6s %8s %12s %12s %12s %12s\n", "bytes", "count", "iters", "algo", "time_us",
           "algbw_GB/s", "busbw_GB/s", "best_busbw");
    fflush(stdout);
}

/* One line per size from b->times ([rank][size][iter]). */
static void print_table(const struct bench *b, const char *backend) {
    size_t esize = dp_dtype_size(b->dtype);
    double *it = malloc(sizeof(double) * MAX_ITERS);
    if (!it) die("out of memory");
    for (int s = 0; s < b->nsizes; s++) {
        for (int i = 0; i < b->iters[s]; i++) {
            double worst = 0;
            for (int r = 0; r < b->P; r++) {
                double t = b->times[((size_t)r * 64 + (size_t)s) * MAX_ITERS + (size_t)i];
                if (t > worst) worst = t;
            }
            it[i] = worst;
        }
        qsort(it, (size_t)b->iters[s], sizeof(double), cmp_double);
        int n = b->iters[s];
        double med = n % 2 ? it[n / 2] : 0.5 * (it[n / 2 - 1] + it[n / 2]);
        double algbw = (double)b->sizes[s] / med;
        double busbw = algbw * 2.0 * (b->P - 1) / b->P;
        enum dp_comm_algo shown =
            b->algo != DP_ALGO_AUTO
                ? b->algo
                : dp_comm_choose_algo(backend, DP_COLL_ALLREDUCE, b->P, b->sizes[s]);
        double best = (double)b->sizes[s] / it[0] * 2.0 * (b->P - 1) / b->P;
        printf("%12zu %12zu %6d %8s %12.2f %12.3f %12.3f %12.3f\n", b->sizes[s],
               b->sizes[s] / esize, b->iters[s], dp_comm_algo_name(shown), med * 1e6,
               algbw / 1e9, busbw / 1e9, best / 1e9);
    }
    free(it);
    fflush(stdout);
}

static size_t membw_bytes(const struct bench *b) {
    return b->max_bytes < ((size_t)64 << 20) ? b->max_bytes : (size_t)64 << 20;
}
static void print_membw(int P, double bw, size_t pb) {
    printf("# memory: %d threads reading+writing %zu MiB each in place: %.1f GB/s -> "
           "bound for an in-place all-reduce: busbw <= B(P-1)/P^2 = %.2f GB/s\n",
           P, pb >> 20, bw / 1e9, bw * (P - 1) / ((double)P * P) / 1e9);
}

/* ---- the mpi backend -------------------------------------------------------------------- */

/* A failure on one rank: the message, then the whole job ends (the other
 * processes would otherwise wait for this one until their timeout). */
static void mpi_die(struct dp_comm *c, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void mpi_die(struct dp_comm *c, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "dptrain: error: rank %d: ", dp_comm_rank(c));
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    dp_comm_kill_job(c, 1);
    exit(1);
}

struct mpi_loop {
    struct bench *b;
    struct dp_comm *c;
    void *buf;
};

/* The timed loop of one rank. */
static void *mpi_loop_main(void *arg) {
    struct mpi_loop *lp = arg;
    struct bench *b = lp->b;
    struct dp_comm *c = lp->c;
    void *buf = lp->buf;
    int r = dp_comm_rank(c), P = dp_comm_world(c);
    size_t esize = dp_dtype_size(b->dtype);
    for (int s = 0; s < b->nsizes; s++) {
        size_t count = b->sizes[s] / esize;
        fill(buf, count, b->dtype, r + 1);
        if (dp_comm_allreduce(c, buf, (int64_t)count, b->dtype, b->algo))
            mpi_die(c, "%s", dp_errmsg());
        double want = P * (P + 1) / 2.0;
        size_t probe[3] = {0, count / 2, count - 1};
        for (int k = 0; k < 3; k++)
            if (get(buf, probe[k], b->dtype) != want)
                mpi_die(c, "wrong result at %zu bytes: element %zu is %g, expected %g",
                        b->sizes[s], probe[k], get(buf, probe[k], b->dtype), want);
        for (int i = 0; i < b->warmup + b->iters[s]; i++) {
            if (dp_comm_barrier(c)) mpi_die(c, "%s", dp_errmsg());
            double t0 = dp_time();
            if (dp_comm_allreduce(c, buf, (int64_t)count, b->dtype, b->algo))
                mpi_die(c, "%s", dp_errmsg());
            double t1 = dp_time();
            if (i >= b->warmup)
                b->times[((size_t)r * 64 + (size_t)s) * MAX_ITERS + (size_t)(i - b->warmup)] =
                    t1 - t0;
        }
    }
    return NULL;
}

/* Every process is one rank; rank 0 prints.  The method is worker_main's. */
static int run_mpi(struct bench *b, const struct dp_comm_params *cp, int membw) {
    struct dp_comm *c;
    if (dp_comm_init(&c, "mpi", cp)) die("%s", dp_errmsg());
    int r = dp_comm_rank(c), P = dp_comm_world(c);
    b->P = P;
    b->times = calloc((size_t)P * 64 * MAX_ITERS, sizeof(double));
    /* The buffer starts on a 2 MiB boundary, so that even the small sizes
     * (which use its start) sit on huge pages: dp_malloc_big advises only the
     * whole 2 MiB pages inside its block, and the kernel's single-copy
     * transfer between processes (CMA) pins 4 KiB pages one by one (measured:
     * 1 MiB took 190 us instead of 120 when the buffer's start was not). */
    size_t huge = (size_t)2 << 20;
    char *raw = dp_malloc_big(b->max_bytes + huge);
    void *buf = raw ? raw + (huge - (uintptr_t)raw % huge) % huge : NULL;
    if (!b->times || !buf) mpi_die(c, "out of memory for the buffers");
    if (r == 0) {
        int lr, ls;
        dp_comm_host_ranks(c, &lr, &ls);
        printf("# dptrain bench allreduce: backend mpi, %d processes (%d on this host), algo %s, "
               "dtype %s, timeout %g s%s\n", P, ls, dp_comm_algo_name(b->algo),
               dp_dtype_name(b->dtype), cp->timeout_s,
               b->comm_thread ? ", calls from a second thread" : "");
        print_head();
    }
    struct mpi_loop lp = {b, c, buf};
    if (b->comm_thread) {
        /* the calls come from another thread than the one that made the
         * communicator, as from dptrain's communication thread */
        pthread_t th;
        if (pthread_create(&th, NULL, mpi_loop_main, &lp)) mpi_die(c, "cannot start a thread");
        pthread_join(th, NULL);
    } else {
        mpi_loop_main(&lp);
    }
    dp_free(raw);
    /* every rank's times to every rank: rank q's block of P*iters is its own */
    for (int s = 0; s < b->nsizes; s++) {
        int n = b->iters[s];
        double *g = malloc(sizeof(double) * (size_t)P * (size_t)n);
        if (!g) mpi_die(c, "out of memory");
        memcpy(g + (size_t)r * n, b->times + ((size_t)r * 64 + (size_t)s) * MAX_ITERS,
               sizeof(double) * (size_t)n);
        if (dp_comm_allgather(c, g, (int64_t)P * n, DP_DTYPE_F64, DP_ALGO_AUTO))
            mpi_die(c, "%s", dp_errmsg());
        for (int q = 0; q < P; q++)
            memcpy(b->times + ((size_t)q * 64 + (size_t)s) * MAX_ITERS, g + (size_t)q * n,
                   sizeof(double) * (size_t)n);
        free(g);
    }
    /* No memory-bound probe here: mpirun binds each process to a core, so
     * rank 0's probe threads would share one (the thread backend's run
     * measures it). */
    (void)membw;
    if (dp_comm_barrier(c)) mpi_die(c, "%s", dp_errmsg());
    if (r == 0) print_table(b, "mpi");
    free(b->times);
    dp_comm_free(c);
    return 0;
}

int dptrain_cmd_bench_allreduce(int argc, char **argv) {
    struct bench b = {0};
    b.P = 2, b.warmup = 2, b.iters_opt = 0, b.algo = DP_ALGO_AUTO, b.dtype = DP_DTYPE_F32;
    b.min_bytes = 4 << 10, b.max_bytes = (size_t)256 << 20;
    b.failed_rank = -1;
    int membw = -1, spin_us = -1;
    double timeout_s = -1;
    b.pin = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV() \
    if (!v) die("%s needs a value", a); \
    i++
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(help_bench_allreduce, stdout);
            return 0;
        } else if (!strcmp(a, "--backend")) {
            NEEDV();
            if (!strcmp(v, "mpi")) b.mpi = 1;
            else if (strcmp(v, "thread")) die("--backend: '%s' is not thread or mpi", v);
        } else if (!strcmp(a, "--workers")) {
            NEEDV();
            b.P = (int)parse_num(a, v, 1, 64, 0);
        } else if (!strcmp(a, "--algo")) {
            NEEDV();
            int x = dp_comm_algo_parse(v);
            if (x < 0) die("--algo: unknown algorithm '%s' (auto, ring, rhd, direct, native)", v);
            b.algo = (enum dp_comm_algo)x;
        } else if (!strcmp(a, "--dtype")) {
            NEEDV();
            int x = dp_dtype_parse(v);
            if (x < 0) die("--dtype: unknown type '%s' (f32, bf16, f64)", v);
            b.dtype = (enum dp_dtype)x;
        } else if (!strcmp(a, "--min-bytes")) {
            NEEDV();
            b.min_bytes = (size_t)parse_num(a, v, 8, 1LL << 34, 1);
        } else if (!strcmp(a, "--max-bytes")) {
            NEEDV();
            b.max_bytes = (size_t)parse_num(a, v, 8, 1LL << 34, 1);
        } else if (!strcmp(a, "--iters")) {
            NEEDV();
            b.iters_opt = (int)parse_num(a, v, 1, MAX_ITERS, 0);
        } else if (!strcmp(a, "--warmup")) {
            NEEDV();
            b.warmup = (int)parse_num(a, v, 0, 1000, 0);
        } else if (!strcmp(a, "--timeout")) {
            NEEDV();
            timeout_s = (double)parse_num(a, v, 0, 1000000, 0);
        } else if (!strcmp(a, "--spin-us")) {
            NEEDV();
            spin_us = (int)parse_num(a, v, 0, 10000000, 0);
        } else if (!strcmp(a, "--comm-thread")) {
            b.comm_thread = 1;
        } else if (!strcmp(a, "--pin")) {
            b.pin = 1;
        } else if (!strcmp(a, "--no-pin")) {
            b.pin = 0;
        } else if (!strcmp(a, "--membw")) {
            membw = 1;
        } else if (!strcmp(a, "--no-membw")) {
            membw = 0;
        } else {
            die("unknown option '%s' for bench allreduce (see 'dptrain bench allreduce --help')",
                a);
        }
#undef NEEDV
    }
    if (b.min_bytes > b.max_bytes) die("--min-bytes is larger than --max-bytes");
    size_t esize = dp_dtype_size(b.dtype);
    for (size_t s = b.min_bytes; s <= b.max_bytes && b.nsizes < 64; s *= 4) {
        size_t bytes = s / esize * esize;
        if (!bytes) continue;
        b.sizes[b.nsizes] = bytes;
        int it = b.iters_opt;
        if (!it) { /* about 0.3 s at 10 GB/s, 5..500 */
            double guess = 0.3 * 10e9 / (double)bytes;
            it = guess > MAX_ITERS ? MAX_ITERS : guess < 5 ? 5 : (int)guess;
        }
        b.iters[b.nsizes++] = it;
    }
    b.max_bytes = b.sizes[b.nsizes - 1];
    if (membw < 0) membw = b.max_bytes >= ((size_t)16 << 20);
    if (b.pin < 0) {
        cpu_set_t allowed;
        b.pin = !sched_getaffinity(0, sizeof allowed, &allowed) && b.P <= CPU_COUNT(&allowed);
    }

    struct dp_comm_params cp = dp_comm_default_params();
    /* a hang is a bug: fail loudly (mpi: see --timeout) */
    cp.timeout_s = timeout_s >= 0 ? timeout_s : b.mpi ? 0 : 120;
    cp.spin_us = spin_us;
    if (b.mpi) return run_mpi(&b, &cp, membw);

    b.times = calloc((size_t)b.P * 64 * MAX_ITERS, sizeof(double));
    if (!b.times) die("out of memory");
    pthread_mutex_init(&b.mu, NULL);
    if (dp_comm_thread_world_init(&b.w, b.P, &cp)) die("%s", dp_errmsg());

    printf("# dptrain bench allreduce: backend thread, %d workers%s, algo %s, dtype %s\n", b.P,
           b.pin ? " (pinned)" : "", dp_comm_algo_name(b.algo), dp_dtype_name(b.dtype));
    print_head();

    pthread_t th[64];
    struct worker wk[64];
    for (int r = 0; r < b.P; r++) {
        wk[r] = (struct worker){&b, r};
        if (pthread_create(&th[r], NULL, worker_main, &wk[r])) die("cannot start worker threads");
    }
    for (int r = 0; r < b.P; r++) pthread_join(th[r], NULL);
    dp_comm_thread_world_free(b.w);
    if (b.failed_rank >= 0) die("%s", b.err);

    print_table(&b, "thread");
    free(b.times);
    pthread_mutex_destroy(&b.mu);
    if (membw && b.P > 1) print_membw(b.P, measure_membw(b.P, membw_bytes(&b)), membw_bytes(&b));
    return 0;
}
