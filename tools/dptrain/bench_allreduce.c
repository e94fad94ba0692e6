/*
 * `dptrain bench allreduce`: all-reduce time, algorithm bandwidth and bus
 * bandwidth of the thread backend, or with --backend mpi of the mpi backend
 * (one rank per process, under mpirun), for message sizes from 4 KiB to
 * 256 MiB.
 *
 *   algbw = bytes / time;  busbw = algbw · 2(P-1)/P  (docs/architecture.md §4; the figure
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
 * The bound (thread backend; --no-membw turns it off).  An in-place
 * all-reduce must read every rank's input once and write the result into
 * every rank's buffer once: 2·P·n bytes of traffic at the least, however it
 * is organised.  The bound kernel does exactly that and nothing else: after
 * each timed all-reduce, after a barrier, the same P pinned threads claim
 * chunks of the same P buffers (the ones just reduced: same size, touched,
 * same cache state, same chunking as the direct all-reduce) from a shared
 * counter, and for each chunk read it from all P buffers and store the
 * combination into all P, with no synchronisation around it.  The combine is
 * a bitwise OR, cheaper than any sum; since the buffers are equal after an
 * all-reduce it leaves them as they are, so the all-reduce that follows sees
 * the values it would have seen.  It is timed like the all-reduce (slowest
 * rank per iteration), KPASS passes per all-reduce iteration, and
 * bound_busbw is its fastest pass's busbw: an all-reduce moves at least this
 * traffic and also synchronises, so its busbw (median) must not exceed
 * bound_busbw.  If it does, the run says so loudly (a table whose bound is
 * beaten says nothing about bounds).  Why best_busbw is not held to it: see
 * print_table.
 *
 * Why the earlier bound was beaten (busbw 16.3 GB/s against a "bound" of
 * 9.12 on the same run).  Its formula was right (2Pn bytes at B bytes/s gives
 * busbw <= B(P-1)/P²) but B was not the rate this traffic runs at: B was one
 * streaming read+write pass (a[i] += 1) over 64 MiB per thread, a DRAM rate,
 * applied to every size, while up to a few MiB per rank the P buffers stay in
 * the caches between iterations and the all-reduce runs at cache speed; it
 * was measured once, best of 3, by other threads than the workers (unpinned),
 * on other buffers, at another moment of a shared machine; and one stream per
 * thread is not the all-reduce's 2P streams with chunks claimed dynamically.
 * Measuring the same traffic with the same threads on the same buffers, per
 * size and interleaved with the all-reduce's own iterations, removes every
 * one of those differences.
 *
 * The only part of dptrain besides main.c that prints; errors are one line
 * "dptrain: error: ..." and exit status 1.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/comm.h"
#include "dp/core.h"
#include "cli.h"


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
    "  --coll NAME       allreduce | reduce_scatter | allgather [allreduce]: the\n"
    "                    collective timed (one buffer of each size; reduce-scatter and\n"
    "                    all-gather: busbw = algbw * (P-1)/P, no bound kernel)\n"
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
    "  --membw, --no-membw  thread backend: after each all-reduce also time the bound\n"
    "                    kernel, the same threads reading all P buffers and writing\n"
    "                    all P once (an all-reduce's least memory traffic, without\n"
    "                    synchronisation), and print its busbw as bound_busbw [on]\n";

#define die dptrain_die

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
    enum dp_comm_coll coll; /* allreduce, reduce_scatter or allgather */
    enum dp_comm_algo algo;
    enum dp_dtype dtype;
    size_t min_bytes, max_bytes;
    int nsizes;
    size_t sizes[64];
    int iters[64];
    struct dp_comm_world *w;
    double *times; /* [rank][size][iter], iters capped at 500 */
    /* the bound (thread backend, bound = 1): each worker's buffer, the chunk
     * counters of the bound kernel (kernel iteration k uses next[k & 1]; see
     * worker_main) and the kernel's times, laid out like `times` */
    int bound;
    void *bufs[64];
    struct {
        _Alignas(64) atomic_llong v; /* a line of its own, like the library's claim counter */
    } next[2];
    double *ktimes;
    int failed_rank;
    char err[512];
    pthread_mutex_t mu;
};
#define MAX_ITERS 500
#define KPASS 2 /* bound-kernel passes per all-reduce iteration */

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

/* One call of the collective timed, on buf (count elements). */
static int coll_run(const struct bench *b, struct dp_comm *c, void *buf, size_t count) {
    if (b->coll == DP_COLL_REDUCE_SCATTER)
        return dp_comm_reduce_scatter(c, buf, (int64_t)count, b->dtype, b->algo);
    if (b->coll == DP_COLL_ALLGATHER)
        return dp_comm_allgather(c, buf, (int64_t)count, b->dtype, b->algo);
    return dp_comm_allreduce(c, buf, (int64_t)count, b->dtype, b->algo);
}

/* The checked call of size s on rank r: fills buf (all-reduce and
 * reduce-scatter: r+1 everywhere; all-gather: r+1 in block r, 0 elsewhere),
 * runs the collective once and probes the result (the first, middle and
 * last element of what the rank must hold: the whole buffer = P(P+1)/2; block
 * r = P(P+1)/2; block q = q+1 for every q).  0, or the message in msg. */
static int coll_check(const struct bench *b, struct dp_comm *c, void *buf, int s, char *msg,
                      size_t cap) {
    int r = dp_comm_rank(c), P = dp_comm_world(c);
    size_t count = b->sizes[s] / dp_dtype_size(b->dtype);
    int64_t o, n;
    dp_comm_split((int64_t)count, P, r, &o, &n);
    fill(buf, count, b->dtype, b->coll == DP_COLL_ALLGATHER ? 0 : r + 1);
    if (b->coll == DP_COLL_ALLGATHER) fill((char *)buf + (size_t)o * dp_dtype_size(b->dtype), (size_t)n, b->dtype, r + 1);
    if (coll_run(b, c, buf, count)) {
        snprintf(msg, cap, "%s", dp_errmsg());
        return -1;
    }
    for (int q = 0; q < P; q++) {
        if (b->coll != DP_COLL_ALLGATHER && q != (b->coll == DP_COLL_ALLREDUCE ? 0 : r)) continue;
        if (b->coll == DP_COLL_ALLREDUCE) o = 0, n = (int64_t)count;
        else dp_comm_split((int64_t)count, P, q, &o, &n);
        double want = b->coll == DP_COLL_ALLGATHER ? q + 1 : P * (P + 1) / 2.0;
        size_t probe[3] = {(size_t)o, (size_t)(o + n / 2), (size_t)(o + n - 1)};
        for (int k = 0; k < 3 && n > 0; k++)
            if (get(buf, probe[k], b->dtype) != want) {
                snprintf(msg, cap, "wrong %s result at %zu bytes: element %zu is %g, expected %g",
                         dp_comm_coll_name(b->coll), b->sizes[s], probe[k],
                         get(buf, probe[k], b->dtype), want);
                return -1;
            }
    }
    return 0;
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

static void bound_kernel(const struct bench *b, int s, atomic_llong *next);

static void *worker_main(void *p) {
    struct worker *wk = p;
    struct bench *b = wk->b;
    int r = wk->rank;
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
    b->bufs[r] = buf; /* read by the others after the barriers below; freed by main */
    long long kit = 0; /* bound-kernel iterations so far, all sizes */
    for (int s = 0; s < b->nsizes; s++) {
        size_t count = b->sizes[s] / esize;
        /* one checked call */
        char msg[400];
        if (coll_check(b, c, buf, s, msg, sizeof msg)) {
            fail(b, c, r, msg);
            goto out;
        }
        for (int i = 0; i < b->warmup + b->iters[s]; i++) {
            if ((rc = dp_comm_barrier(c))) {
                fail(b, c, r, dp_errmsg());
                goto out;
            }
            double t0 = dp_time();
            if ((rc = coll_run(b, c, buf, count))) {
                fail(b, c, r, dp_errmsg());
                goto out;
            }
            double t1 = dp_time();
            if (i >= b->warmup)
                b->times[((size_t)r * 64 + (size_t)s) * MAX_ITERS + (size_t)(i - b->warmup)] =
                    t1 - t0;
            if (!b->bound) continue;
            /* The bound kernel, interleaved so that both see the same moment of
             * the machine.  Its counter next[kit & 1] was reset by rank 0 after
             * the previous iteration's kernel barrier; after this barrier
             * rank 0 resets the other one, which nobody uses until the next
             * kernel barrier (everyone finished the kernel of iteration kit-1
             * before the all-reduce barrier above). */
            for (int pass = 0; pass < KPASS; pass++) {
                if ((rc = dp_comm_barrier(c))) {
                    fail(b, c, r, dp_errmsg());
                    goto out;
                }
                if (r == 0) atomic_store(&b->next[(kit + 1) & 1].v, 0);
                t0 = dp_time();
                bound_kernel(b, s, &b->next[kit & 1].v);
                t1 = dp_time();
                kit++;
                if (i >= b->warmup)
                    b->ktimes[((size_t)r * 64 + (size_t)s) * MAX_ITERS * KPASS +
                              (size_t)(i - b->warmup) * KPASS + (size_t)pass] = t1 - t0;
            }
        }
    }
out:
    /* buf is freed by the main thread after every worker has ended: a peer
     * may still be reading it in its last bound kernel, which no
     * synchronisation follows */
    dp_comm_free(c);
    return NULL;
}

/* ---- the bound kernel ----------------------------------------------------------------- */

/* These vectors are passed and returned only between static inline functions of
 * this file, so the compiler's note that a 64-byte vector's calling convention differs
 * without AVX-512 (-Wpsabi) concerns no interface: on a CPU without AVX-512,
 * -march=native would turn it into a build error. */
#pragma GCC diagnostic ignored "-Wpsabi" /* (gcc and clang) */
typedef uint32_t v16u __attribute__((vector_size(64)));
static inline v16u ld(const char *p) {
    v16u v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void st(char *p, v16u v) { memcpy(p, &v, sizeof v); }

/* bytes [off, off+len) of all P buffers := their bitwise OR: reads each
 * buffer's range once and writes it once, the loop shape of the library's
 * reduction (dp__reduce_sum_to: two vectors per step for P = 2). */
static void or_to_all(char *const *bufs, int P, size_t off, size_t len) {
    size_t i = 0;
    if (P == 2) {
        char *x = bufs[0] + off, *y = bufs[1] + off;
        for (; i + 128 <= len; i += 128) {
            v16u s0 = ld(x + i) | ld(y + i), s1 = ld(x + i + 64) | ld(y + i + 64);
            st(x + i, s0), st(x + i + 64, s1);
            st(y + i, s0), st(y + i + 64, s1);
        }
    }
    for (; i + 64 <= len; i += 64) {
        v16u v = ld(bufs[0] + off + i);
        for (int q = 1; q < P; q++) v |= ld(bufs[q] + off + i);
        for (int q = 0; q < P; q++) st(bufs[q] + off + i, v);
    }
    for (; i < len; i++) {
        char v = bufs[0][off + i];
        for (int q = 1; q < P; q++) v |= bufs[q][off + i];
        for (int q = 0; q < P; q++) bufs[q][off + i] = v;
    }
}

/* One pass of the bound kernel over size s, chunks claimed from *next: the
 * direct all-reduce's chunking (C = max(P, bytes / 512 KiB) chunks, at most
 * count and 2^20, cut by dp_comm_split), so neither side gains by its
 * granularity or by load balancing the other lacks. */
static void bound_kernel(const struct bench *b, int s, atomic_llong *next) {
    char *bufs[64]; /* local: the claims write the counter's line, not this */
    for (int q = 0; q < b->P; q++) bufs[q] = b->bufs[q];
    size_t esize = dp_dtype_size(b->dtype);
    int64_t count = (int64_t)(b->sizes[s] / esize);
    int64_t C = (int64_t)(b->sizes[s] >> 19);
    if (C < b->P) C = b->P;
    if (C > count) C = count;
    if (C > (1 << 20)) C = 1 << 20;
    for (long long c; (c = atomic_fetch_add_explicit(next, 1, memory_order_relaxed)) < C;) {
        int64_t o, n;
        dp_comm_split(count, (int)C, (int)c, &o, &n);
        or_to_all(bufs, b->P, (size_t)o * esize, (size_t)n * esize);
    }
}

/* ---- the command ------------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void print_head(int bound, enum dp_comm_coll coll) {
    printf("# time = median over iterations of the slowest rank; busbw = algbw * %s(P-1)/P;\n"
           "# best_busbw from the fastest iteration\n", coll == DP_COLL_ALLREDUCE ? "2" : "");
    if (bound)
        printf("# bound_busbw: busbw of the bound kernel's fastest pass (%d per iteration): the same\n"
               "# threads reading all P buffers once and writing all P once, no synchronisation;\n"
               "# busbw cannot exceed it.  best_busbw, a single iteration, is not held to it: it can\n"
               "# equal it within noise where the all-reduce moves exactly those bytes (direct)\n",
               KPASS);
    printf("%12s %12s %6s %8s %12s %12s %12s %12s", "bytes", "count", "iters", "algo", "time_us",
           "algbw_GB/s", "busbw_GB/s", "best_busbw");
    printf(bound ? " %12s\n" : "\n", "bound_busbw");
    fflush(stdout);
}

/* The slowest rank's time of each of the n iterations of size s, sorted,
 * into it[]; times is [rank][size][cap]. */
static void iter_times(const struct bench *b, const double *times, size_t cap, int s, int n, double *it) {
    for (int i = 0; i < n; i++) {
        double worst = 0;
        for (int r = 0; r < b->P; r++) {
            double t = times[((size_t)r * 64 + (size_t)s) * cap + (size_t)i];
            if (t > worst) worst = t;
        }
        it[i] = worst;
    }
    qsort(it, (size_t)n, sizeof(double), cmp_double);
}

/* One line per size from b->times ([rank][size][iter]), with the bound from
 * b->ktimes when it was measured.  A row whose busbw beats its bound is
 * marked "!" and counted; returns the count.
 *
 * What is compared with what.  busbw comes from the all-reduce's median
 * iteration, bound_busbw from the kernel's fastest: the typical all-reduce
 * against the best the least traffic ever did, a comparison that noise can
 * only make looser.  best_busbw is deliberately not checked against it: at
 * the sizes where the direct all-reduce is the kernel plus two
 * synchronisations (well under 1% of the time from a few MiB up), the two
 * fastest single iterations measure the same thing, and on this 2-core VM
 * either was ahead by up to 5% (once 34%, while other jobs ran) in about a
 * third of the runs.  A check that fails on noise says nothing either. */
static int print_table(const struct bench *b, const char *backend) {
    size_t esize = dp_dtype_size(b->dtype);
    double *it = malloc(sizeof(double) * MAX_ITERS * KPASS);
    if (!it) die("out of memory");
    int beaten = 0;
    /* busbw / algbw: what each rank sends at the least, per byte of buffer */
    double f = (b->coll == DP_COLL_ALLREDUCE ? 2.0 : 1.0) * (b->P - 1) / b->P;
    for (int s = 0; s < b->nsizes; s++) {
        iter_times(b, b->times, MAX_ITERS, s, b->iters[s], it);
        int n = b->iters[s];
        double med = n % 2 ? it[n / 2] : 0.5 * (it[n / 2 - 1] + it[n / 2]);
        double algbw = (double)b->sizes[s] / med;
        double busbw = algbw * f;
        enum dp_comm_algo shown =
            b->algo != DP_ALGO_AUTO
                ? b->algo
                : dp_comm_choose_algo(backend, b->coll, b->P, b->sizes[s]);
        double best = (double)b->sizes[s] / it[0] * f;
        printf("%12zu %12zu %6d %8s %12.2f %12.3f %12.3f %12.3f", b->sizes[s],
               b->sizes[s] / esize, b->iters[s], dp_comm_algo_name(shown), med * 1e6,
               algbw / 1e9, busbw / 1e9, best / 1e9);
        if (b->bound) {
            iter_times(b, b->ktimes, MAX_ITERS * KPASS, s, b->iters[s] * KPASS, it);
            double bound = (double)b->sizes[s] / it[0] * f;
            int over = busbw > bound;
            beaten += over;
            printf(" %12.3f%s", bound / 1e9, over ? " !" : "");
        }
        printf("\n");
    }
    free(it);
    fflush(stdout);
    return beaten;
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
    int r = dp_comm_rank(c);
    size_t esize = dp_dtype_size(b->dtype);
    for (int s = 0; s < b->nsizes; s++) {
        size_t count = b->sizes[s] / esize;
        char msg[512];
        if (coll_check(b, c, buf, s, msg, sizeof msg)) mpi_die(c, "%s", msg);
        for (int i = 0; i < b->warmup + b->iters[s]; i++) {
            if (dp_comm_barrier(c)) mpi_die(c, "%s", dp_errmsg());
            double t0 = dp_time();
            if (coll_run(b, c, buf, count)) mpi_die(c, "%s", dp_errmsg());
            double t1 = dp_time();
            if (i >= b->warmup)
                b->times[((size_t)r * 64 + (size_t)s) * MAX_ITERS + (size_t)(i - b->warmup)] =
                    t1 - t0;
        }
    }
    return NULL;
}

/* The times array and the buffer of one rank.  The buffer starts on a
 * 2 MiB boundary, so that even the small sizes (which use its start) sit on
 * huge pages: dp_malloc_big advises only the whole 2 MiB pages inside its
 * block, and the kernel's single-copy transfer between processes (CMA) pins
 * 4 KiB pages one by one (measured: 1 MiB took 190 us instead of 120 when the
 * buffer's start was not).  *raw is what to dp_free. */
static void *mpi_setup(struct bench *b, struct dp_comm *c, char **raw) {
    b->P = dp_comm_world(c);
    b->times = calloc((size_t)b->P * 64 * MAX_ITERS, sizeof(double));
    size_t huge = (size_t)2 << 20;
    *raw = dp_malloc_big(b->max_bytes + huge);
    void *buf = *raw ? *raw + (huge - (uintptr_t)*raw % huge) % huge : NULL;
    if (!b->times || !buf) mpi_die(c, "out of memory for the buffers");
    return buf;
}

/* Every rank's times to every rank: rank q's block of P*iters is its own. */
static void mpi_gather_times(struct bench *b, struct dp_comm *c) {
    int r = dp_comm_rank(c), P = b->P;
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
}

/* Every process is one rank; rank 0 prints.  The method is worker_main's. */
static int run_mpi(struct bench *b, const struct dp_comm_params *cp, int membw) {
    struct dp_comm *c;
    if (dp_comm_init(&c, "mpi", cp)) die("%s", dp_errmsg());
    int r = dp_comm_rank(c), P = dp_comm_world(c);
    char *raw;
    void *buf = mpi_setup(b, c, &raw);
    if (r == 0) {
        int lr, ls;
        dp_comm_host_ranks(c, &lr, &ls);
        printf("# dptrain bench allreduce: %s, backend mpi, %d processes (%d on this host), algo %s, "
               "dtype %s, timeout %g s%s\n", dp_comm_coll_name(b->coll), P, ls, dp_comm_algo_name(b->algo),
               dp_dtype_name(b->dtype), cp->timeout_s,
               b->comm_thread ? ", calls from a second thread" : "");
        print_head(0, b->coll);
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
    mpi_gather_times(b, c);
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
        } else if (!strcmp(a, "--coll")) {
            NEEDV();
            if (!strcmp(v, "allreduce")) b.coll = DP_COLL_ALLREDUCE;
            else if (!strcmp(v, "reduce_scatter")) b.coll = DP_COLL_REDUCE_SCATTER;
            else if (!strcmp(v, "allgather")) b.coll = DP_COLL_ALLGATHER;
            else die("--coll: unknown collective '%s' (allreduce, reduce_scatter, allgather)", v);
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
    if (membw < 0) membw = 1;
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
    /* one rank moves nothing: no bound; the kernel is an all-reduce's traffic */
    b.bound = membw && b.P > 1 && b.coll == DP_COLL_ALLREDUCE;
    if (b.bound) b.ktimes = calloc((size_t)b.P * 64 * MAX_ITERS * KPASS, sizeof(double));
    if (!b.times || (b.bound && !b.ktimes)) die("out of memory");
    pthread_mutex_init(&b.mu, NULL);
    if (dp_comm_thread_world_init(&b.w, b.P, &cp)) die("%s", dp_errmsg());

    printf("# dptrain bench allreduce: %s, backend thread, %d workers%s, algo %s, dtype %s\n",
           dp_comm_coll_name(b.coll), b.P, b.pin ? " (pinned)" : "", dp_comm_algo_name(b.algo),
           dp_dtype_name(b.dtype));
    print_head(b.bound, b.coll);

    pthread_t th[64];
    struct worker wk[64];
    for (int r = 0; r < b.P; r++) {
        wk[r] = (struct worker){&b, r};
        if (pthread_create(&th[r], NULL, worker_main, &wk[r])) die("cannot start worker threads");
    }
    for (int r = 0; r < b.P; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < b.P; r++) dp_free(b.bufs[r]);
    dp_comm_thread_world_free(b.w);
    if (b.failed_rank >= 0) die("%s", b.err);

    int beaten = print_table(&b, "thread");
    if (b.bound) {
        /* the largest size's bound, in the line that bench/allreduce_vs_mpi.sh quotes */
        double *it = malloc(sizeof(double) * MAX_ITERS * KPASS);
        if (!it) die("out of memory");
        int s = b.nsizes - 1;
        double f = 2.0 * (b.P - 1) / b.P;
        iter_times(&b, b.ktimes, MAX_ITERS * KPASS, s, b.iters[s] * KPASS, it);
        double bound = (double)b.sizes[s] / it[0] * f;
        iter_times(&b, b.times, MAX_ITERS, s, b.iters[s], it);
        int n = b.iters[s];
        double med = n % 2 ? it[n / 2] : 0.5 * (it[n / 2 - 1] + it[n / 2]);
        double busbw = (double)b.sizes[s] / med * f;
        printf("# memory bound at %zu bytes: bound_busbw %.2f GB/s (%d threads reading all %d "
               "buffers once and writing all %d once); the all-reduce's busbw %.2f GB/s is %.0f%% "
               "of it\n", b.sizes[s], bound / 1e9, b.P, b.P, b.P, busbw / 1e9, 100 * busbw / bound);
        free(it);
    }
    if (beaten) {
        /* Not expected: the all-reduce does the kernel's traffic and more.
         * Say it where nobody can miss it. */
        printf("# WARNING: the all-reduce's busbw beat its bound at %d size%s (marked !): this "
               "run's bound_busbw is not a bound\n", beaten, beaten > 1 ? "s" : "");
        fprintf(stderr, "dptrain: warning: bench allreduce: the all-reduce's busbw beat its own "
                "bound at %d size%s (rows marked !); the bound column of this run is not a bound\n",
                beaten, beaten > 1 ? "s" : "");
    }
    fflush(stdout);
    free(b.times);
    free(b.ktimes);
    pthread_mutex_destroy(&b.mu);
    return 0;
}

/* ---- for dptrain calibrate -------------------------------------------------------------- */

/* The thread backend's all-reduce of each size in sizes[0..n) (bytes, f32,
 * ascending, n <= 64) on P pinned-if-they-fit workers with algorithm algo:
 * into med[s] the median over `iters` iterations of the slowest rank's time,
 * measured exactly as `bench allreduce` measures it (worker_main, iter_times;
 * no bound kernel).  Ends the program with one error line on a failure. */
static void medians_setup(struct bench *b, int P, enum dp_comm_algo algo, const size_t *sizes, int n, int iters) {
    b->P = P, b->warmup = 2, b->algo = algo, b->dtype = DP_DTYPE_F32, b->failed_rank = -1;
    if (P < 1 || P > 64 || n < 1 || n > 64 || iters < 1 || iters > MAX_ITERS) die("allreduce medians: bad arguments");
    for (int s = 0; s < n; s++) b->sizes[s] = sizes[s] / 4 * 4, b->iters[s] = iters;
    b->nsizes = n, b->min_bytes = b->sizes[0], b->max_bytes = b->sizes[n - 1];
}
static void medians_of(const struct bench *b, double *med) {
    double *it = malloc(sizeof(double) * MAX_ITERS);
    if (!it) die("out of memory");
    for (int s = 0; s < b->nsizes; s++) {
        int iters = b->iters[s];
        iter_times(b, b->times, MAX_ITERS, s, iters, it);
        med[s] = iters % 2 ? it[iters / 2] : 0.5 * (it[iters / 2 - 1] + it[iters / 2]);
    }
    free(it);
}

/* (cli.h) The processes of an MPI job: run_mpi's loop and gather, every
 * rank gets the medians. */
void dptrain_allreduce_medians_comm(struct dp_comm *c, enum dp_comm_algo algo, const size_t *sizes, int n, int iters,
                                    double *med) {
    struct bench b = {0};
    medians_setup(&b, dp_comm_world(c), algo, sizes, n, iters);
    char *raw;
    struct mpi_loop lp = {&b, c, mpi_setup(&b, c, &raw)};
    mpi_loop_main(&lp);
    dp_free(raw);
    mpi_gather_times(&b, c);
    medians_of(&b, med);
    free(b.times);
}

void dptrain_allreduce_medians(int P, enum dp_comm_algo algo, const size_t *sizes, int n, int iters,
                               double *med) {
    struct bench b = {0};
    medians_setup(&b, P, algo, sizes, n, iters);
    cpu_set_t allowed;
    b.pin = !sched_getaffinity(0, sizeof allowed, &allowed) && b.P <= CPU_COUNT(&allowed);
    struct dp_comm_params cp = dp_comm_default_params();
    cp.timeout_s = 120;
    b.times = calloc((size_t)b.P * 64 * MAX_ITERS, sizeof(double));
    if (!b.times) die("out of memory");
    pthread_mutex_init(&b.mu, NULL);
    if (dp_comm_thread_world_init(&b.w, b.P, &cp)) die("%s", dp_errmsg());
    pthread_t th[64];
    struct worker wk[64];
    for (int r = 0; r < b.P; r++) {
        wk[r] = (struct worker){&b, r};
        if (pthread_create(&th[r], NULL, worker_main, &wk[r])) die("cannot start worker threads");
    }
    for (int r = 0; r < b.P; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < b.P; r++) dp_free(b.bufs[r]);
    dp_comm_thread_world_free(b.w);
    if (b.failed_rank >= 0) die("%s", b.err);
    medians_of(&b, med);
    free(b.times);
    pthread_mutex_destroy(&b.mu);
}
