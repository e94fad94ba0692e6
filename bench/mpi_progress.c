/*
 * Which way makes a nonblocking all-reduce progress while the worker
 * computes?  (docs/mpi.md, "Progress")
 *
 *   make && mpirun -np 2 build/bench/mpi_progress [--bytes 8M] [--reps 9] [--compute gemm|mem|sleep]
 *
 * Each rank starts an all-reduce of --bytes (fp32 sum), computes for about
 * as long as MPI_Allreduce of that size takes alone, then waits.  Variants:
 *
 *   mpi-nopoll       MPI_Iallreduce; compute; MPI_Wait
 *   mpi-test         MPI_Iallreduce; compute, calling MPI_Test every ~0.5 ms; MPI_Wait
 *   mpi-thread       a communication thread calls MPI_Allreduce (blocking) while
 *                    the main thread computes; join
 *   dp-thread-native a communication thread calls dp_comm_allreduce (native,
 *                    no timeout: MPI_Allreduce underneath) -- what dptrain does
 *   dp-thread-polled the same with a timeout set: MPI_Iallreduce polled by the
 *                    backend's wait (spin 50 us, then sleeps up to 256 us)
 *   dp-thread-ring   the same thread, the project's ring over MPI point-to-point
 *   dp-test-ring     dp_comm_iallreduce (ring); compute, calling dp_comm_test
 *                    every ~0.5 ms (it runs the ring's steps); dp_comm_wait
 *
 * Per variant: t_comm = its communication alone (no compute), t_compute = the
 * compute alone, t_total = both as above; each the median over --reps of the
 * slowest rank's time (a barrier before each).  overlap = (t_comm + t_compute
 * - t_total) / min(t_comm, t_compute): 1 = the shorter one hid completely, 0 =
 * no better than one after the other, < 0 = worse.
 *
 * Memory: the malloc settings of dptrain's main() (freed memory stays in the
 * heap), without which Open MPI's per-call temporary buffers are fresh pages
 * every call and a 32 MiB MPI_Allreduce takes 85 ms instead of 4 here.
 *
 * Compute: --compute gemm (default) is a loop of 128x128x128 dp_gemm calls on
 * one thread (compute-bound, in cache); mem streams over 64 MiB (a[i] =
 * 0.999 a[i] + b[i], memory-bound, competing with the all-reduce's copies);
 * sleep sleeps in 20 µs naps (the CPU idle while "compute" runs elsewhere,
 * as when a GPU computes: the case where a network transfer, or here the
 * copies, can hide behind compute at all).
 *
 * The Makefile builds every C file in bench/ with the project's flags, which
 * carry the MPI ones when mpicc was found; without MPI this is a stub.
 */
#ifndef DP_WITH_MPI
#include <stdio.h>

int main(void) {
    fprintf(stderr, "mpi_progress: built without MPI (apt-get install openmpi-bin "
                    "libopenmpi-dev, then make)\n");
    return 1;
}
#else
#include <malloc.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dp/comm.h"
#include "dp/core.h"

#define MAX_REPS 51

static int rank, P;
static float *abuf;      /* the all-reduce buffer */
static int64_t acount;
static float *ga, *gb, *gc; /* GEMM operands, 128x128 */
static float *ma, *mb;      /* memory-bound operands */
static size_t mn;
static int use_mem, use_sleep;
static struct dp_comm *c_native, *c_polled;

/* ---- compute ------------------------------------------------------------------------------- */

/* One unit of compute: a 128^3 GEMM (~4 MFLOP) or a pass over 1/64 of the
 * memory-bound arrays. */
static void compute_unit(int k) {
    if (use_sleep) {
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
        return;
    }
    if (!use_mem) {
        dp_gemm(0, 0, 128, 128, 128, 1.0f, ga, 128, gb, 128, 0.5f, gc, 128);
        return;
    }
    size_t chunk = mn / 64, lo = (size_t)(k % 64) * chunk;
    for (size_t i = lo; i < lo + chunk; i++) ma[i] = 0.999f * ma[i] + mb[i];
}

/* ---- the communication thread --------------------------------------------------------------- */

enum { JOB_NONE, JOB_MPI, JOB_DP_NATIVE, JOB_DP_POLLED, JOB_DP_RING, JOB_QUIT };
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int job = JOB_NONE, job_done = 1;

static void do_comm(int kind) {
    int rc = 0;
    switch (kind) {
    case JOB_MPI:
        MPI_Allreduce(MPI_IN_PLACE, abuf, (int)acount, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case JOB_DP_NATIVE: rc = dp_comm_allreduce(c_native, abuf, acount, DP_DTYPE_F32, DP_ALGO_NATIVE); break;
    case JOB_DP_POLLED: rc = dp_comm_allreduce(c_polled, abuf, acount, DP_DTYPE_F32, DP_ALGO_NATIVE); break;
    case JOB_DP_RING: rc = dp_comm_allreduce(c_native, abuf, acount, DP_DTYPE_F32, DP_ALGO_RING); break;
    default: break;
    }
    if (rc) {
        fprintf(stderr, "mpi_progress: rank %d: %s\n", rank, dp_errmsg());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

static void *comm_thread(void *arg) {
    (void)arg;
    pthread_mutex_lock(&mu);
    for (;;) {
        while (job == JOB_NONE) pthread_cond_wait(&cv, &mu);
        int k = job;
        if (k == JOB_QUIT) break;
        pthread_mutex_unlock(&mu);
        do_comm(k);
        pthread_mutex_lock(&mu);
        job = JOB_NONE, job_done = 1;
        pthread_cond_broadcast(&cv);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}
static void thread_start(int k) {
    pthread_mutex_lock(&mu);
    job = k, job_done = 0;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}
static void thread_join(void) {
    pthread_mutex_lock(&mu);
    while (!job_done) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

/* ---- the variants ------------------------------------------------------------------------------ */

enum { V_NOPOLL, V_TEST, V_THREAD, V_DP_NATIVE, V_DP_POLLED, V_DP_RING, V_DP_TEST, V_COUNT };
static const char *const vnames[V_COUNT] = {"mpi-nopoll",       "mpi-test",
                                            "mpi-thread",       "dp-thread-native",
                                            "dp-thread-polled", "dp-thread-ring",
                                            "dp-test-ring"};
static int units, poll_every;

/* One run of variant v: with_comm / with_compute select what runs. */
static void run_once(int v, int with_comm, int with_compute) {
    MPI_Request q = MPI_REQUEST_NULL;
    struct dp_comm_req *dq = NULL;
    int thread_kind = v == V_THREAD      ? JOB_MPI
                      : v == V_DP_NATIVE ? JOB_DP_NATIVE
                      : v == V_DP_POLLED ? JOB_DP_POLLED
                      : v == V_DP_RING   ? JOB_DP_RING
                                         : JOB_NONE;
    if (with_comm) {
        if (v == V_NOPOLL || v == V_TEST)
            MPI_Iallreduce(MPI_IN_PLACE, abuf, (int)acount, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q);
        else if (v == V_DP_TEST)
            dp_comm_iallreduce(c_native, abuf, acount, DP_DTYPE_F32, DP_ALGO_RING, &dq);
        else
            thread_start(thread_kind);
    }
    for (int k = 0; with_compute && k < units; k++) {
        compute_unit(k);
        if (with_comm && (k + 1) % poll_every == 0) {
            int flag;
            if (v == V_TEST) MPI_Test(&q, &flag, MPI_STATUS_IGNORE);
            if (v == V_DP_TEST) dp_comm_test(c_native, dq, &flag);
        }
    }
    if (with_comm) {
        if (v == V_NOPOLL || v == V_TEST) MPI_Wait(&q, MPI_STATUS_IGNORE);
        else if (v == V_DP_TEST) {
            if (dp_comm_wait(c_native, dq)) {
                fprintf(stderr, "mpi_progress: rank %d: %s\n", rank, dp_errmsg());
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
        } else
            thread_join();
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median over reps of the slowest rank's time of run_once(v, comm, compute). */
static double timed(int v, int with_comm, int with_compute, int reps) {
    double t[MAX_REPS];
    for (int i = 0; i < reps; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = dp_time();
        run_once(v, with_comm, with_compute);
        double dt = dp_time() - t0, worst;
        MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        t[i] = worst;
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
    return t[reps / 2];
}

static long long parse_bytes(const char *s) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end == 'K' || *end == 'k') v <<= 10;
    else if (*end == 'M' || *end == 'm') v <<= 20;
    return v;
}

int main(int argc, char **argv) {
    long long bytes = 8 << 20;
    int reps = 9;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--bytes")) bytes = parse_bytes(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--compute")) {
            use_mem = !strcmp(argv[i + 1], "mem");
            use_sleep = !strcmp(argv[i + 1], "sleep");
        }
    }
    if (reps < 1 || reps > MAX_REPS || bytes < 1024 || bytes > (1LL << 31)) {
        fprintf(stderr, "mpi_progress: bad options\n");
        return 1;
    }
    /* dptrain's malloc settings (tools/dptrain/main.c): Open MPI's per-call
     * temporary buffers stay in the heap instead of being fresh pages */
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    struct dp_comm_params cp = dp_comm_default_params();
    if (dp_comm_init(&c_native, "mpi", &cp)) { /* initialises MPI */
        fprintf(stderr, "mpi_progress: %s\n", dp_errmsg());
        return 1;
    }
    cp.timeout_s = 600;
    if (dp_comm_init(&c_polled, "mpi", &cp)) {
        fprintf(stderr, "mpi_progress: %s\n", dp_errmsg());
        return 1;
    }
    rank = dp_comm_rank(c_native), P = dp_comm_world(c_native);
    dp_set_num_threads(1);
    acount = bytes / 4;
    abuf = dp_malloc_big((size_t)acount * 4);
    ga = dp_malloc_big(3 * 128 * 128 * 4);
    gb = ga + 128 * 128, gc = gb + 128 * 128;
    mn = (size_t)32 << 20 >> 2;
    ma = dp_malloc_big(2 * mn * 4);
    mb = ma + mn;
    for (int i = 0; i < 3 * 128 * 128; i++) ga[i] = 0.001f * (float)(i % 97);
    for (size_t i = 0; i < 2 * mn; i++) ma[i] = 1.0f;
    for (int64_t i = 0; i < acount; i++) abuf[i] = 0;
    pthread_t th;
    pthread_create(&th, NULL, comm_thread, NULL);

    /* calibrate: compute as long as MPI_Allreduce alone takes; poll every ~0.5 ms */
    units = 1;
    double t_ref = timed(V_THREAD, 1, 0, reps);
    for (int k = 0; k < 64; k++) compute_unit(k); /* warm: GEMM library set-up, caches */
    double t0 = dp_time();
    for (int k = 0; k < 256; k++) compute_unit(k);
    double t_unit = (dp_time() - t0) / 256;
    MPI_Allreduce(MPI_IN_PLACE, &t_unit, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    units = (int)(t_ref / t_unit + 0.5);
    if (units < 1) units = 1;
    poll_every = (int)(0.5e-3 / t_unit + 0.5);
    if (poll_every < 1) poll_every = 1;
    double t_compute = timed(V_NOPOLL, 0, 1, reps);

    if (rank == 0) {
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        int len;
        MPI_Get_library_version(lib, &len);
        char *nl = strchr(lib, '\n');
        if (nl) *nl = '\0';
        printf("# mpi_progress: %s; %d processes; all-reduce %lld bytes fp32; compute %s "
               "(%d units of %.1f us, poll every %d); median of %d\n",
               lib, P, bytes, use_sleep ? "sleep" : use_mem ? "mem" : "gemm", units, t_unit * 1e6,
               poll_every, reps);
        printf("%-18s %10s %10s %10s %8s\n", "variant", "t_comm_ms", "t_comp_ms", "t_total_ms",
               "overlap");
        fflush(stdout);
    }
    for (int v = 0; v < V_COUNT; v++) {
        double tc = timed(v, 1, 0, reps), tt = timed(v, 1, 1, reps);
        double lo = tc < t_compute ? tc : t_compute;
        if (rank == 0) {
            printf("%-18s %10.3f %10.3f %10.3f %8.2f\n", vnames[v], tc * 1e3, t_compute * 1e3,
                   tt * 1e3, (tc + t_compute - tt) / lo);
            fflush(stdout);
        }
    }
    pthread_mutex_lock(&mu);
    job = JOB_QUIT;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    pthread_join(th, NULL);
    dp_free(abuf), dp_free(ga), dp_free(ma);
    dp_comm_free(c_polled);
    dp_comm_free(c_native);
    return 0;
}
#endif
