/*
 * Tests of the communicator's mpi backend: one program run under mpirun by
 * tests/mpi/run.sh for P = 1..4 processes (not part of dptest, which runs
 * without mpirun).
 *
 *   mpirun -np P build/dptest_mpi [NAME...]     the tests whose names contain a NAME
 *   mpirun -np 3 build/dptest_mpi --case timeout-sleep|timeout-stop|timeout-elsewhere [TAG]
 *
 * tests/test.h forks a child per test, which does not mix with MPI, so this
 * file has its own small in-process harness: every test runs on every rank,
 * a failed CHECK prints the rank and the values and the test goes on (so the
 * ranks keep issuing the same operations and nobody hangs); after each test
 * the ranks agree on the verdict (MPI_Allreduce) and rank 0 prints
 * "ok   NAME" or "FAIL NAME".  The last line reads "N passed, N failed".
 * Every communicator has a 60 s timeout, so a hang turns into a failure.
 *
 * Oracle (Gloo's, as in test_comm.c): rank r's input is r + ((i + salt) % 7),
 * whose sum over ranks is P(P-1)/2 + P·((i + salt) % 7): exact in f32, f64
 * and bf16 (integers below 256) whatever the order of the additions.
 *
 * The --case runs are the timeout tests: rank 2 does not take part in an
 * operation (it sleeps, stops itself with SIGSTOP, or waits in another
 * operation); ranks 0 and 1 must return DP_ECANCELED within the timeout plus
 * the grace period with a message naming rank 2, print one verdict line
 * each, and then end the job with dp_comm_kill_job (which also takes the
 * stopped rank down).
 */
#include <mpi.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <pthread.h>
#include <math.h>

#include "comm/comm_impl.h" /* dp__comm_mpi_fake_hosts */
#include "dp/comm.h"
#include "dp/core.h"

#define BIG_COUNT ((1 << 20) + 3)
#define GUARD 16
#define TIMEOUT_S 60.0

static int g_rank, g_P;
static int g_failures; /* on this rank, in the running test */

static void fail_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail_at(const char *file, int line, const char *fmt, ...) {
    if (g_failures++ >= 5) return; /* the first few are enough */
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "    [rank %d] %s:%d: %s\n", g_rank, file, line, msg);
    fflush(stderr);
}

static int has_needle(const char *msg, const char *needle) {
    return !needle || strstr(msg, needle) != NULL;
}

#define CHECK(c)                                                                 \
    do {                                                                         \
        if (!(c)) fail_at(__FILE__, __LINE__, "expected true: %s", #c);          \
    } while (0)
#define CHECK_EQ(a, b)                                                                      \
    do {                                                                                    \
        long long a_ = (long long)(a), b_ = (long long)(b);                                 \
        if (a_ != b_) fail_at(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b, a_, b_); \
    } while (0)
#define CHECK_OK(expr)                                                                     \
    do {                                                                                   \
        int rc_ = (expr);                                                                  \
        if (rc_) fail_at(__FILE__, __LINE__, "%s returned %d (%s): %s", #expr, rc_,        \
                         dp_strerror(rc_), dp_errmsg());                                   \
    } while (0)
#define CHECK_ERR(expr, code, needle)                                                       \
    do {                                                                                    \
        dp_clearerr();                                                                      \
        int rc_ = (expr);                                                                   \
        if (rc_ != (code))                                                                  \
            fail_at(__FILE__, __LINE__, "%s returned %d (%s), expected %d: %s", #expr, rc_, \
                    dp_strerror(rc_), (code), dp_errmsg());                                 \
        else if (!has_needle(dp_errmsg(), (needle)))                                        \
            fail_at(__FILE__, __LINE__, "message '%s' lacks '%s'", dp_errmsg(),             \
                    (const char *)(needle));                                                \
    } while (0)

static struct dp_comm *new_comm(double timeout_s) {
    struct dp_comm_params cp = dp_comm_default_params();
    cp.timeout_s = timeout_s;
    struct dp_comm *c = NULL;
    int rc = dp_comm_init(&c, "mpi", &cp);
    if (rc) {
        fprintf(stderr, "[rank %d] dp_comm_init failed: %s\n", g_rank, dp_errmsg());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return c;
}

/* ---- element access -------------------------------------------------------------------------- */

static void put(void *buf, enum dp_dtype t, int64_t i, double v) {
    if (t == DP_DTYPE_F32) ((float *)buf)[i] = (float)v;
    else if (t == DP_DTYPE_F64) ((double *)buf)[i] = v;
    else ((uint16_t *)buf)[i] = dp_bf16_from_f32((float)v);
}
static double get(const void *buf, enum dp_dtype t, int64_t i) {
    if (t == DP_DTYPE_F32) return ((const float *)buf)[i];
    if (t == DP_DTYPE_F64) return ((const double *)buf)[i];
    return dp_bf16_to_f32(((const uint16_t *)buf)[i]);
}
static double pattern(int r, int64_t i, int salt) { return r + (double)((i + salt) % 7); }
static double pattern_sum(int P, int64_t i, int salt) {
    return P * (P - 1) / 2.0 + P * (double)((i + salt) % 7);
}

static const enum dp_comm_algo algos3[] = {DP_ALGO_NATIVE, DP_ALGO_RING, DP_ALGO_RHD};
static const enum dp_dtype dtypes3[] = {DP_DTYPE_F32, DP_DTYPE_BF16, DP_DTYPE_F64};

/* ---- every collective x algorithm x dtype x count ------------------------------------------- */

/* One collective `coll` (not barrier) on count elements; checks every element
 * this rank can check and the guard past the end.  Returns the number of
 * wrong elements. */
static int one_case(struct dp_comm *c, char *buf, enum dp_comm_coll coll, enum dp_comm_algo algo,
                    enum dp_dtype t, int64_t n, int root, int salt) {
    int P = dp_comm_world(c), r = dp_comm_rank(c), bad = 0;
    int64_t off, len;
    dp_comm_split(n, P, r, &off, &len);
    for (int64_t i = 0; i < n; i++) {
        double v = pattern(r, i, salt);
        if (coll == DP_COLL_ALLGATHER && (i < off || i >= off + len)) v = -1;
        if (coll == DP_COLL_BROADCAST && r != root) v = -1;
        put(buf, t, i, v);
    }
    for (int g = 0; g < GUARD; g++) put(buf, t, n + g, -77);
    int rc;
    switch (coll) {
    case DP_COLL_ALLREDUCE: rc = dp_comm_allreduce(c, buf, n, t, algo); break;
    case DP_COLL_REDUCE_SCATTER: rc = dp_comm_reduce_scatter(c, buf, n, t, algo); break;
    case DP_COLL_ALLGATHER: rc = dp_comm_allgather(c, buf, n, t, algo); break;
    default: rc = dp_comm_broadcast(c, buf, n, t, root, algo); break;
    }
    if (rc) {
        fail_at(__FILE__, __LINE__, "P=%d %s %s %s count %lld root %d: %s", P,
                dp_comm_coll_name(coll), dp_comm_algo_name(algo), dp_dtype_name(t), (long long)n,
                root, dp_errmsg());
        return 1;
    }
    int64_t lo = coll == DP_COLL_REDUCE_SCATTER ? off : 0;
    int64_t hi = coll == DP_COLL_REDUCE_SCATTER ? off + len : n;
    for (int64_t i = lo; i < hi; i++) {
        double want;
        if (coll == DP_COLL_ALLREDUCE || coll == DP_COLL_REDUCE_SCATTER)
            want = pattern_sum(P, i, salt);
        else if (coll == DP_COLL_BROADCAST)
            want = pattern(root, i, salt);
        else {
            int q = 0;
            for (; q < P - 1; q++) {
                int64_t qo, ql;
                dp_comm_split(n, P, q, &qo, &ql);
                if (i < qo + ql) break;
            }
            want = pattern(q, i, salt);
        }
        double got = get(buf, t, i);
        if (got != want && bad++ < 3)
            fail_at(__FILE__, __LINE__, "P=%d %s %s %s count %lld root %d: x[%lld] = %g, expected %g",
                    P, dp_comm_coll_name(coll), dp_comm_algo_name(algo), dp_dtype_name(t),
                    (long long)n, root, (long long)i, got, want);
    }
    for (int g = 0; g < GUARD; g++)
        if (get(buf, t, n + g) != -77 && bad++ < 3)
            fail_at(__FILE__, __LINE__, "P=%d %s %s %s count %lld: wrote past the end (x[%lld])",
                    P, dp_comm_coll_name(coll), dp_comm_algo_name(algo), dp_dtype_name(t),
                    (long long)n, (long long)(n + g));
    return bad;
}

static void matrix(enum dp_comm_coll coll) {
    struct dp_comm *c = new_comm(TIMEOUT_S);
    int P = g_P, salt = 0;
    char *buf = dp_malloc_big(sizeof(double) * (BIG_COUNT + GUARD));
    CHECK(buf != NULL);
    const int64_t counts[] = {0, 1, P - 1, P + 1, 1000, BIG_COUNT};
    for (size_t a = 0; a < DP_ARRAY_LEN(algos3); a++)
        for (size_t t = 0; t < DP_ARRAY_LEN(dtypes3); t++)
            for (size_t k = 0; k < DP_ARRAY_LEN(counts); k++) {
                /* broadcast: every root, but only the last one for the big count */
                int r0 = coll == DP_COLL_BROADCAST && counts[k] == BIG_COUNT ? P - 1 : 0;
                int r1 = coll == DP_COLL_BROADCAST ? P : 1;
                for (int root = r0; root < r1; root++)
                    one_case(c, buf, coll, algos3[a], dtypes3[t], counts[k], root, salt++);
            }
    /* AUTO: rhd at this size (ring from 1 MiB; broadcast and barrier native) */
    one_case(c, buf, coll, DP_ALGO_AUTO, DP_DTYPE_F32, 1000, 0, salt++);
    dp_free(buf);
    dp_comm_free(c);
}

/* ---- message segments across hosts ------------------------------------------------------------ */

/* The largest MPI_Isend (bytes) while g_track is set: this program's
 * MPI_Isend stands in front of MPI's (the profiling interface, PMPI), so it
 * also sees the library's calls; only this file's main thread sets g_track,
 * while no other thread runs. */
static int g_track;
static long long g_max_isend;
int MPI_Isend(const void *buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm,
              MPI_Request *req) {
    int size = 0;
    if (g_track && PMPI_Type_size(type, &size) == MPI_SUCCESS && (long long)count * size > g_max_isend)
        g_max_isend = (long long)count * size;
    return PMPI_Isend(buf, count, type, dest, tag, comm, req);
}

/* Ring and rhd between hosts send eager-sized segments (comm_mpi.c,
 * NET_SEG_BYTES: over TCP a rendezvous' acknowledgement waits behind the
 * peer's own data, which ran the two directions of a link one after the
 * other), within a host the large ones; and every collective stays right
 * with the hosts faked: one rank per host, then two (P = 3, 4: transfers cut
 * both ways in one schedule, and the broadcast chain forwarding between
 * them).  The limit checked is Open MPI's default eager limit for TCP, 64 KiB
 * including ob1's header (16 bytes here). */
static void test_segments_across_hosts(void) {
    char *buf = dp_malloc_big(sizeof(double) * (BIG_COUNT + GUARD));
    CHECK(buf != NULL);
    const enum dp_comm_algo algos[] = {DP_ALGO_RING, DP_ALGO_RHD};
    const int64_t counts[] = {g_P + 1, 100000, BIG_COUNT};
    int salt = 0;
    /* 0: the real hosts (run.sh: one; tests/netns: one rank each) */
    for (int per_host = 0; per_host <= 2; per_host++) {
        struct dp_comm *c = new_comm(TIMEOUT_S);
        if (per_host) dp__comm_mpi_fake_hosts(c, per_host);
        g_max_isend = 0, g_track = 1;
        for (int coll = 0; coll < DP_COLL_BARRIER; coll++)
            for (size_t a = 0; a < DP_ARRAY_LEN(algos); a++)
                for (size_t k = 0; k < DP_ARRAY_LEN(counts); k++)
                    one_case(c, buf, (enum dp_comm_coll)coll, algos[a],
                             k == 1 ? DP_DTYPE_BF16 : DP_DTYPE_F32, counts[k], g_P - 1, salt++);
        g_track = 0;
        if (g_P > 1 && per_host == 1) CHECK(g_max_isend > 0 && g_max_isend <= 65536 - 16);
        /* one host: 1 MiB segments on every rank (each sends a block of 1 MiB
         * or more); two per host: some rank sends 1 MiB ones to the rank
         * beside it (a rank alone on its host has none) */
        long long most = g_max_isend;
        MPI_Allreduce(&g_max_isend, &most, 1, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
        int lr, ls;
        dp_comm_host_ranks(c, &lr, &ls);
        if (g_P > 1 && per_host == 0 && ls == g_P) CHECK_EQ(g_max_isend, 1 << 20);
        if (g_P > 1 && per_host == 0 && ls == 1) CHECK(g_max_isend > 0 && g_max_isend <= 65536 - 16);
        if (g_P > 1 && per_host == 2) CHECK_EQ(most, 1 << 20);
        dp_comm_free(c);
    }
    dp_free(buf);
}

static void test_allreduce_matrix(void) { matrix(DP_COLL_ALLREDUCE); }
static void test_reduce_scatter_matrix(void) { matrix(DP_COLL_REDUCE_SCATTER); }
static void test_allgather_matrix(void) { matrix(DP_COLL_ALLGATHER); }
static void test_broadcast_matrix(void) { matrix(DP_COLL_BROADCAST); }

/* The path of `dptrain train --backend mpi --workers 1`: a hierarchical world
 * of one thread per process over the mpi communicator.  Its all-gather must
 * be the mpi backend's own (MPI_Allgatherv with native; ring, rhd), not an
 * all-reduce of zero-padded blocks (twice the bytes): checked by the bits,
 * which a sum with zeros would change (-0.0 becomes +0.0, a signalling NaN
 * is quieted). */
static uint32_t gather_bits(int r, int64_t i) {
    return i % 3 == 0 ? 0x80000000u : i % 3 == 1 ? 0x7f800001u + (uint32_t)r : 0xbf800000u + (uint32_t)i;
}
static void test_hier_allgather_bits(void) {
    struct dp_comm *inter = new_comm(TIMEOUT_S), *c = NULL;
    struct dp_comm_world *w = NULL;
    CHECK_OK(dp_comm_thread_world_init_hier(&w, 1, NULL, inter));
    if (w) CHECK_OK(dp_comm_thread_init(&c, w, 0));
    int P = g_P, r = g_rank;
    const int64_t counts[] = {0, 1, P + 1, 1000};
    uint32_t *x = dp_malloc(sizeof(uint32_t) * 1000);
    for (size_t a = 0; c && a < DP_ARRAY_LEN(algos3); a++)
        for (size_t k = 0; k < DP_ARRAY_LEN(counts); k++) {
            int64_t n = counts[k], off, len;
            dp_comm_split(n, P, r, &off, &len);
            for (int64_t i = 0; i < n; i++) x[i] = i >= off && i < off + len ? gather_bits(r, i) : 0x3f800000u;
            CHECK_OK(dp_comm_allgather(c, x, n, DP_DTYPE_F32, algos3[a]));
            for (int q = 0, bad = 0; q < P; q++) {
                dp_comm_split(n, P, q, &off, &len);
                for (int64_t i = off; i < off + len; i++)
                    if (x[i] != gather_bits(q, i) && bad++ < 3)
                        fail_at(__FILE__, __LINE__, "%s count %lld: x[%lld] = %08x, rank %d sent %08x",
                                dp_comm_algo_name(algos3[a]), (long long)n, (long long)i, x[i], q, gather_bits(q, i));
            }
        }
    dp_free(x);
    dp_comm_free(c);
    if (w) dp_comm_thread_world_free(w);
    dp_comm_free(inter);
}

/* ---- bf16 rounding --------------------------------------------------------------------------- */

/* Random bf16 inputs against the fp64 sum, within k·2^-8·sum|x| where k is
 * the documented number of roundings (comm.h): ring P-1; rhd log2 P' (+1
 * with a fold); native at most P-1. */
static void test_bf16_rounding(void) {
    struct dp_comm *c = new_comm(TIMEOUT_S);
    int P = g_P, r = g_rank, L = 0;
    while ((2 << L) <= P) L++;
    const int64_t counts[] = {1, P + 1, 1000, 100003};
    uint16_t *x = dp_malloc(sizeof(uint16_t) * 100003);
    for (size_t a = 0; a < DP_ARRAY_LEN(algos3); a++) {
        int k = algos3[a] == DP_ALGO_RHD ? L + ((1 << L) != P) : P - 1;
        for (size_t j = 0; j < DP_ARRAY_LEN(counts); j++) {
            int64_t n = counts[j];
            for (int64_t i = 0; i < n; i++)
                x[i] = dp_bf16_from_f32(
                    2.0f * dp_rng_uniform(7, DP_RNG_USER, (uint64_t)r, (uint64_t)i) - 1.0f);
            CHECK_OK(dp_comm_allreduce(c, x, n, DP_DTYPE_BF16, algos3[a]));
            int bad = 0;
            for (int64_t i = 0; i < n && bad < 3; i++) {
                double exact = 0, mag = 0;
                for (int q = 0; q < P; q++) {
                    double v = dp_bf16_to_f32(dp_bf16_from_f32(
                        2.0f * dp_rng_uniform(7, DP_RNG_USER, (uint64_t)q, (uint64_t)i) - 1.0f));
                    exact += v, mag += fabs(v);
                }
                double got = dp_bf16_to_f32(x[i]), tol = k * ldexp(mag, -8) + 1e-30;
                if (!(fabs(got - exact) <= tol)) {
                    bad++;
                    fail_at(__FILE__, __LINE__, "%s count %lld: x[%lld] = %.9g, exact %.9g, tol %.3g",
                            dp_comm_algo_name(algos3[a]), (long long)n, (long long)i, got, exact, tol);
                }
            }
        }
    }
    dp_free(x);
    dp_comm_free(c);
}

/* ---- nonblocking ------------------------------------------------------------------------------ */

#define NB_OPS 7

static void test_nonblocking_in_order(void) {
    struct dp_comm *c = new_comm(TIMEOUT_S);
    int P = g_P, r = g_rank;
    const int64_t sizes[NB_OPS] = {1000, 1, 300000, 77, 65536, 5, 1 << 20};
    const enum dp_comm_algo al[NB_OPS] = {DP_ALGO_RING,   DP_ALGO_NATIVE, DP_ALGO_RHD,
                                          DP_ALGO_NATIVE, DP_ALGO_RING,   DP_ALGO_RHD,
                                          DP_ALGO_NATIVE};
    float *x[NB_OPS];
    struct dp_comm_req *req[NB_OPS];
    for (int round = 0; round < 3; round++) {
        for (int k = 0; k < NB_OPS; k++) {
            x[k] = dp_malloc(sizeof(float) * (size_t)sizes[k]);
            for (int64_t i = 0; i < sizes[k]; i++) x[k][i] = (float)pattern(r, i, k);
        }
        for (int k = 0; k < NB_OPS; k++)
            CHECK_OK(dp_comm_iallreduce(c, x[k], sizes[k], DP_DTYPE_F32, al[k], &req[k]));
        if (round == 0) {
            /* waited in issue order */
            for (int k = 0; k < NB_OPS; k++) CHECK_OK(dp_comm_wait(c, req[k]));
        } else if (round == 1) {
            /* waited in reverse: the last wait runs and completes the others */
            for (int k = NB_OPS - 1; k >= 0; k--) CHECK_OK(dp_comm_wait(c, req[k]));
        } else {
            /* polled with test (which runs ring and rhd too): a later request
             * done implies every earlier one done */
            int all = 0;
            double t0 = dp_time();
            while (!all && dp_time() - t0 < 30) {
                int later = 0;
                all = 1;
                for (int k = NB_OPS - 1; k >= 0; k--) {
                    int done = 0;
                    CHECK_OK(dp_comm_test(c, req[k], &done));
                    if (later) CHECK(done);
                    later |= done;
                    all &= done;
                }
            }
            CHECK(all);
            for (int k = 0; k < NB_OPS; k++) CHECK_OK(dp_comm_wait(c, req[k]));
        }
        for (int k = 0; k < NB_OPS; k++) {
            int bad = 0;
            for (int64_t i = 0; i < sizes[k] && bad < 3; i++)
                if (x[k][i] != (float)pattern_sum(P, i, k)) {
                    bad++;
                    fail_at(__FILE__, __LINE__, "round %d op %d (%s): x[%lld] = %g", round, k,
                            dp_comm_algo_name(al[k]), (long long)i, x[k][i]);
                }
            dp_free(x[k]);
        }
    }
    /* mixed kinds in flight */
    float a[1000], b[1000];
    for (int i = 0; i < 1000; i++) a[i] = (float)r, b[i] = r == 1 % P ? (float)i : 0.0f;
    struct dp_comm_req *ra, *rb, *rc, *rd;
    CHECK_OK(dp_comm_iallreduce(c, a, 1000, DP_DTYPE_F32, DP_ALGO_RING, &ra));
    CHECK_OK(dp_comm_ibroadcast(c, b, 1000, DP_DTYPE_F32, 1 % P, DP_ALGO_NATIVE, &rb));
    CHECK_OK(dp_comm_ibarrier(c, &rc));
    CHECK_OK(dp_comm_ibarrier(c, &rd));
    CHECK_OK(dp_comm_wait(c, rc));
    CHECK_OK(dp_comm_wait(c, rb));
    CHECK_OK(dp_comm_wait(c, ra));
    CHECK_OK(dp_comm_wait(c, rd));
    for (int i = 0; i < 1000; i++) CHECK(a[i] == P * (P - 1) / 2 && b[i] == i);
    dp_comm_free(c);
}

/* A communication thread issues blocking all-reduces on a communicator that
 * the main thread created (MPI_THREAD_SERIALIZED use), while the main thread
 * computes; then the main thread uses the communicator again. */
struct comm_thread_arg {
    struct dp_comm *c;
    float *x;
    int64_t n;
    int rc;
    char msg[512];
};
static void *comm_thread_main(void *p) {
    struct comm_thread_arg *a = p;
    for (int k = 0; k < 4 && !a->rc; k++) {
        a->rc = dp_comm_allreduce(a->c, a->x, a->n, DP_DTYPE_F32, k % 2 ? DP_ALGO_RING : DP_ALGO_NATIVE);
        if (a->rc) snprintf(a->msg, sizeof a->msg, "%s", dp_errmsg());
    }
    return NULL;
}

static void test_comm_thread(void) {
    struct dp_comm *c = new_comm(TIMEOUT_S);
    int P = g_P, r = g_rank;
    int64_t n = 1 << 18;
    float *x = dp_malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(r + (i % 3));
    struct comm_thread_arg a = {c, x, n, 0, ""};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, comm_thread_main, &a), 0);
    volatile double acc = 0;
    for (int i = 0; i < 2000000; i++) acc = acc + i * 1e-9; /* "backward" */
    pthread_join(th, NULL);
    if (a.rc) fail_at(__FILE__, __LINE__, "comm thread: %s", a.msg);
    /* four all-reduces: x_i = P^3 * sum_r (r + i%3) */
    for (int64_t i = 0; i < n; i++) {
        float want = (float)((double)P * P * P * (P * (P - 1) / 2.0 + P * (double)(i % 3)));
        if (x[i] != want) {
            fail_at(__FILE__, __LINE__, "x[%lld] = %g, expected %g", (long long)i, x[i], want);
            break;
        }
    }
    CHECK_OK(dp_comm_barrier(c));
    dp_free(x);
    dp_comm_free(c);
}

/* ---- arguments, names, host ranks, several communicators ------------------------------------ */

static void test_arguments(void) {
    struct dp_comm *c = new_comm(TIMEOUT_S);
    int P = g_P;
    float x[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    struct dp_comm_req *q = (struct dp_comm_req *)1;
    CHECK_ERR(dp_comm_allreduce(c, x, -1, DP_DTYPE_F32, DP_ALGO_AUTO), DP_EINVAL, "negative");
    CHECK_ERR(dp_comm_allreduce(c, NULL, 8, DP_DTYPE_F32, DP_ALGO_AUTO), DP_EINVAL, "NULL");
    CHECK_ERR(dp_comm_allreduce(c, x, 8, (enum dp_dtype)9, DP_ALGO_AUTO), DP_EINVAL, "dtype");
    CHECK_ERR(dp_comm_iallreduce(c, x, 8, DP_DTYPE_F32, (enum dp_comm_algo)17, &q), DP_EINVAL,
              "algorithm");
    CHECK(q == NULL);
    CHECK_ERR(dp_comm_allreduce(c, x, 8, DP_DTYPE_F32, DP_ALGO_DIRECT), DP_EINVAL,
              "'direct' needs shared memory");
    CHECK_ERR(dp_comm_broadcast(c, x, 8, DP_DTYPE_F32, P, DP_ALGO_AUTO), DP_EINVAL, "root");
    CHECK_ERR(dp_comm_wait(c, NULL), DP_EINVAL, "NULL");
    CHECK_ERR(dp_comm_kill_job(NULL, 1), DP_EINVAL, "NULL");
    int lr, ls;
    CHECK_ERR(dp_comm_host_ranks(c, NULL, &ls), DP_EINVAL, "NULL");
    CHECK_ERR(dp_comm_host_ranks(NULL, &lr, &ls), DP_EINVAL, "NULL");
    struct dp_comm_params bad = dp_comm_default_params();
    bad.timeout_s = -1;
    struct dp_comm *c2 = (struct dp_comm *)1;
    CHECK_ERR(dp_comm_init(&c2, "mpi", &bad), DP_EINVAL, "timeout_s");
    CHECK(c2 == NULL);
    /* nothing was started: the next operation still matches across ranks */
    CHECK_OK(dp_comm_allreduce(c, x, 8, DP_DTYPE_F32, DP_ALGO_AUTO));
    CHECK(x[7] == (float)P);
    CHECK(strcmp(dp_comm_backend_name(c), "mpi") == 0);
    CHECK(dp_comm_backend_available("mpi"));
    CHECK_EQ(dp_comm_world(c), P);
    CHECK_EQ(dp_comm_rank(c), g_rank);
    CHECK_OK(dp_comm_status(c));
    CHECK_EQ(dp_comm_choose_algo("mpi", DP_COLL_ALLREDUCE, P, 1 << 20), DP_ALGO_RING);
    CHECK_EQ(dp_comm_choose_algo("mpi", DP_COLL_BROADCAST, P, 1 << 20), DP_ALGO_NATIVE);
    CHECK_EQ(dp_comm_algo_parse("native"), DP_ALGO_NATIVE);
    int provided = 0;
    MPI_Query_thread(&provided);
    CHECK(provided >= MPI_THREAD_SERIALIZED);
    dp_comm_free(c);
}

static void test_host_ranks(void) {
    struct dp_comm *c = new_comm(TIMEOUT_S);
    int lr = -1, ls = -1;
    CHECK_OK(dp_comm_host_ranks(c, &lr, &ls));
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
    int want_r, want_s;
    MPI_Comm_rank(local, &want_r);
    MPI_Comm_size(local, &want_s);
    MPI_Comm_free(&local);
    CHECK_EQ(lr, want_r);
    CHECK_EQ(ls, want_s);
    CHECK(lr >= 0 && lr < ls && ls <= g_P);
    /* the thread backend: every rank on one host */
    struct dp_comm_world *w;
    struct dp_comm *t;
    CHECK_OK(dp_comm_thread_world_init(&w, 1, NULL));
    CHECK_OK(dp_comm_thread_init(&t, w, 0));
    CHECK_OK(dp_comm_host_ranks(t, &lr, &ls));
    CHECK(lr == 0 && ls == 1);
    CHECK_ERR(dp_comm_kill_job(t, 3), DP_ECANCELED, "job killed (code 3)");
    dp_comm_free(t);
    dp_comm_thread_world_free(w);
    dp_comm_free(c);
}

static void test_two_communicators(void) {
    struct dp_comm *a = new_comm(TIMEOUT_S), *b = new_comm(TIMEOUT_S);
    int P = g_P, r = g_rank;
    double x[100], y[100];
    for (int i = 0; i < 100; i++) x[i] = r, y[i] = 2 * r + i;
    struct dp_comm_req *qa, *qb;
    CHECK_OK(dp_comm_iallreduce(a, x, 100, DP_DTYPE_F64, DP_ALGO_RING, &qa));
    CHECK_OK(dp_comm_iallreduce(b, y, 100, DP_DTYPE_F64, DP_ALGO_RHD, &qb));
    CHECK_OK(dp_comm_wait(b, qb));
    CHECK_OK(dp_comm_wait(a, qa));
    for (int i = 0; i < 100; i++) CHECK(x[i] == P * (P - 1) / 2.0 && y[i] == P * (P - 1) + P * i);
    dp_comm_free(b);
    dp_comm_free(a);
}

/* ---- point-to-point messages ----------------------------------------------------------------- */

/* As comm_p2p_order_tags_any_source in tests/test_comm.c: 3 messages to every
 * other rank (tags 1, 2, 1) around a collective, received by source and tag
 * out of sending order, then from any source (one sender's tag-1 messages in
 * sending order); a 4 MiB ring shift (past the eager limit: the send
 * completes only once the receiver takes it); an empty message to itself. */
static void test_p2p(void) {
    struct dp_comm *c = new_comm(TIMEOUT_S);
    int r = g_rank, P = g_P;
    struct dp_comm_msg **sent = calloc((size_t)(3 * P), sizeof *sent);
    int32_t(*out)[3][4] = calloc((size_t)P, sizeof *out);
    int ns = 0;
    for (int q = 0; q < P; q++) {
        if (q == r) continue;
        for (int k = 0; k < 3; k++) {
            for (int i = 0; i < 4; i++) out[q][k][i] = 1000 * r + 100 * q + 10 * k + i;
            CHECK_OK(dp_comm_isend(c, out[q][k], (int64_t)sizeof out[q][k], q, k == 1 ? 2 : 1, &sent[ns++]));
        }
    }
    double x = 1;
    CHECK_OK(dp_comm_allreduce(c, &x, 1, DP_DTYPE_F64, DP_ALGO_AUTO));
    CHECK(x == P);
    int32_t in[4] = {0};
    int from = -2;
    int64_t got = -1;
    for (int q = 0; q < P; q++) {
        if (q == r) continue;
        CHECK_OK(dp_comm_recv(c, in, sizeof in, q, 2, &from, &got));
        CHECK_EQ(from, q);
        CHECK_EQ(got, (int64_t)sizeof in);
        CHECK_EQ(in[3], 1000 * q + 100 * r + 10 * 1 + 3);
    }
    int *seen = calloc((size_t)P, sizeof *seen);
    for (int n = 0; n < 2 * (P - 1); n++) {
        CHECK_OK(dp_comm_recv(c, in, sizeof in, DP_ANY_SOURCE, 1, &from, &got));
        if (from < 0 || from >= P || from == r) {
            CHECK(0);
            break;
        }
        int k = seen[from]++ == 0 ? 0 : 2;
        CHECK_EQ(in[0], 1000 * from + 100 * r + 10 * k);
    }
    for (int q = 0; q < P; q++) CHECK_EQ(seen[q], q == r ? 0 : 2);
    for (int i = 0; i < ns; i++) CHECK_OK(dp_comm_msg_wait(c, sent[i], NULL, NULL));
    /* 4 MiB to the next rank, from the previous one */
    int64_t n = 1 << 20;
    float *big = malloc(sizeof(float) * (size_t)n), *back = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) big[i] = (float)(r * 7 + i % 1000);
    struct dp_comm_msg *m;
    int done = 0;
    CHECK_OK(dp_comm_isend(c, big, (int64_t)sizeof(float) * n, (r + 1) % P, 5, &m));
    CHECK_OK(dp_comm_msg_test(c, m, &done));
    CHECK_OK(dp_comm_recv(c, back, (int64_t)sizeof(float) * n, (r + P - 1) % P, 5, &from, &got));
    CHECK_OK(dp_comm_msg_wait(c, m, NULL, NULL));
    CHECK_EQ(from, (r + P - 1) % P);
    CHECK_EQ(got, (int64_t)sizeof(float) * n);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) bad += back[i] != (float)(from * 7 + i % 1000);
    CHECK_EQ(bad, 0);
    CHECK_OK(dp_comm_send(c, NULL, 0, r, 7));
    CHECK_OK(dp_comm_recv(c, NULL, 0, r, 7, &from, &got));
    CHECK_EQ(from, r);
    CHECK_EQ(got, 0);
    /* a receive withdrawn before any message: the next receive takes it */
    char c8[8] = {0};
    CHECK_OK(dp_comm_irecv(c, c8, 8, (r + 1) % P, 4, &m));
    CHECK_OK(dp_comm_msg_cancel(c, m));
    CHECK_OK(dp_comm_barrier(c));
    CHECK_OK(dp_comm_isend(c, r % 2 ? "BBBBBBBB" : "AAAAAAAA", 8, (r + P - 1) % P, 4, &m));
    CHECK_OK(dp_comm_recv(c, c8, 8, (r + 1) % P, 4, NULL, NULL));
    CHECK_OK(dp_comm_msg_wait(c, m, NULL, NULL));
    CHECK(c8[0] == (((r + 1) % P) % 2 ? 'B' : 'A'));
    /* too long for the buffer: the receive fails and says so */
    char b4[4];
    if (P > 1 && r == 0) CHECK_OK(dp_comm_send(c, "12345678", 8, 1, 3));
    if (P > 1 && r == 1) CHECK_ERR(dp_comm_recv(c, b4, 4, 0, 3, NULL, NULL), DP_EINVAL, "does not fit the 4-byte buffer");
    CHECK_OK(dp_comm_barrier(c));
    free(big), free(back), free(seen), free(out), free(sent);
    dp_comm_free(c);
}

/* A receive nobody answers fails after the timeout, naming the rank and tag
 * (the receive is cancelled: nothing is left in flight). */
static void test_p2p_timeout(void) {
    struct dp_comm *c = new_comm(0.3);
    char b[4];
    if (g_rank == 0 && g_P > 1) {
        double t0 = dp_time();
        CHECK_ERR(dp_comm_recv(c, b, 4, 1, 9, NULL, NULL), DP_ECANCELED,
                  "timeout after 0.3 s in recv on rank 0: no message from rank 1 with tag 9");
        double dt = dp_time() - t0;
        CHECK(dt >= 0.25 && dt < 5);
        CHECK_ERR(dp_comm_send(c, b, 4, 1, 9), DP_ECANCELED, "no message from rank 1");
    }
    dp_comm_free(c);
    MPI_Barrier(MPI_COMM_WORLD);
}

/* ---- abort ------------------------------------------------------------------------------------ */

static void test_abort_is_local_and_final(void) {
    struct dp_comm *c = new_comm(TIMEOUT_S);
    int r = g_rank;
    float x[64] = {0};
    struct dp_comm_req *q[3];
    /* queued ring and rhd operations (they have not run: they run in wait) */
    CHECK_OK(dp_comm_iallreduce(c, x, 64, DP_DTYPE_F32, DP_ALGO_RING, &q[0]));
    CHECK_OK(dp_comm_iallreduce(c, x + 32, 16, DP_DTYPE_F32, DP_ALGO_RHD, &q[1]));
    char expect[64];
    snprintf(expect, sizeof expect, "rank %d aborted: loss is NaN", r);
    CHECK_ERR(dp_comm_abort(c, "loss is NaN at step 7"), DP_ECANCELED, expect);
    CHECK_ERR(dp_comm_wait(c, q[1]), DP_ECANCELED, expect); /* out of order: fine */
    CHECK_ERR(dp_comm_wait(c, q[0]), DP_ECANCELED, expect);
    CHECK_ERR(dp_comm_barrier(c), DP_ECANCELED, expect);
    CHECK_ERR(dp_comm_status(c), DP_ECANCELED, "loss is NaN at step 7");
    q[2] = (struct dp_comm_req *)1;
    CHECK_ERR(dp_comm_iallreduce(c, x, 64, DP_DTYPE_F32, DP_ALGO_NATIVE, &q[2]), DP_ECANCELED,
              expect);
    CHECK(q[2] == NULL);
    /* the first message is kept */
    CHECK_ERR(dp_comm_abort(c, "second"), DP_ECANCELED, "loss is NaN");
    dp_comm_free(c);
    /* a communicator freed with a queued operation: no hang, no leak of state */
    c = new_comm(TIMEOUT_S);
    CHECK_OK(dp_comm_iallreduce(c, x, 64, DP_DTYPE_F32, DP_ALGO_RING, &q[0]));
    dp_comm_free(c);
    /* and MPI is still fine for new communicators */
    c = new_comm(TIMEOUT_S);
    for (int i = 0; i < 64; i++) x[i] = 1;
    CHECK_OK(dp_comm_allreduce(c, x, 64, DP_DTYPE_F32, DP_ALGO_RING));
    CHECK(x[63] == (float)g_P);
    dp_comm_free(c);
}

/* ---- timeout cases (one per mpirun, see run.sh) ----------------------------------------------- */

static int timeout_case(const char *name) {
    int r = g_rank;
    if (g_P != 3) {
        if (!r) fprintf(stderr, "--case %s needs 3 processes\n", name);
        return 2;
    }
    /* ranks 0 and 1 meet here after the test, without rank 2 */
    MPI_Comm pair;
    MPI_Comm_split(MPI_COMM_WORLD, r < 2 ? 0 : MPI_UNDEFINED, r, &pair);
    const double timeout = 1.0, grace = 2.0;
    struct dp_comm *c = new_comm(timeout);
    float x[1000];
    for (int i = 0; i < 1000; i++) x[i] = 1;
    /* two healthy operations first: the stalled one is #3 */
    CHECK_OK(dp_comm_allreduce(c, x, 1000, DP_DTYPE_F32, DP_ALGO_RING));
    CHECK_OK(dp_comm_barrier(c));
    int elsewhere = strcmp(name, "timeout-elsewhere") == 0;
    enum dp_comm_algo algo = strcmp(name, "timeout-stop") == 0 ? DP_ALGO_RING : DP_ALGO_NATIVE;
    if (elsewhere) algo = DP_ALGO_RHD;
    if (r == 2) {
        if (strcmp(name, "timeout-sleep") == 0) {
            sleep(30); /* stuck in compute; killed long before */
        } else if (strcmp(name, "timeout-stop") == 0) {
            raise(SIGSTOP); /* stalled: no MPI progress, no answers */
        } else {
            /* alive, but waiting in another operation (#3 is a barrier here) */
            dp_clearerr();
            int rc = dp_comm_barrier(c);
            const char *m = dp_errmsg();
            int ok = rc == DP_ECANCELED && strstr(m, "barrier #3 on rank 2") &&
                     strstr(m, "rank 0 is waiting in allreduce #3") &&
                     strstr(m, "rank 1 is waiting in allreduce #3");
            printf("%s mpi_%s (rank 2): %s\n", ok ? "ok  " : "FAIL", name, m);
            fflush(stdout);
            sleep(30);
        }
        return 0;
    }
    double t0 = dp_time();
    dp_clearerr();
    int rc = dp_comm_allreduce(c, x, 1000, DP_DTYPE_F32, algo);
    double dt = dp_time() - t0;
    const char *m = dp_errmsg();
    char want[128];
    snprintf(want, sizeof want, "timeout after 1 s in allreduce #3 on rank %d: ", r);
    const char *who = elsewhere ? "rank 2 is waiting in barrier #3"
                                : "rank 2 did not respond (stalled or lost)";
    int ok = rc == DP_ECANCELED && strstr(m, want) && strstr(m, who) &&
             !strstr(m, "rank 0 did") && !strstr(m, "rank 1 did") && dt >= timeout &&
             dt < timeout + grace + 3.0;
    /* the failure record's list: rank 2 alone when it did not respond, none when it answered */
    int lost[4] = {-1, -1, -1, -1}, nlost = dp_comm_lost_ranks(c, lost, 4);
    ok = ok && (elsewhere ? nlost == 0 : nlost == 1 && lost[0] == 2);
    /* and the communicator stays failed */
    ok = ok && dp_comm_barrier(c) == DP_ECANCELED && dp_comm_status(c) == DP_ECANCELED;
    printf("%s mpi_%s (rank %d, %.1f s): %s\n", ok ? "ok  " : "FAIL", name, r, dt, m);
    fflush(stdout);
    MPI_Barrier(pair);
    if (r == 0) {
        /* end the job: the launcher's error path (rank 2 sleeps or is stopped) */
        if (elsewhere) sleep(1); /* let rank 2 print its line */
        dp_comm_kill_job(c, 0);
    }
    sleep(30);
    return 1; /* not reached: killed */
}

/* ---- the harness ----------------------------------------------------------------------------- */

struct test {
    const char *name;
    void (*fn)(void);
};
static const struct test tests[] = {
    {"mpi_arguments", test_arguments},
    {"mpi_host_ranks", test_host_ranks},
    {"mpi_allreduce_matrix", test_allreduce_matrix},
    {"mpi_reduce_scatter_matrix", test_reduce_scatter_matrix},
    {"mpi_allgather_matrix", test_allgather_matrix},
    {"mpi_hier_allgather_bits", test_hier_allgather_bits},
    {"mpi_broadcast_every_root_matrix", test_broadcast_matrix},
    {"mpi_bf16_rounding", test_bf16_rounding},
    {"mpi_nonblocking_in_order", test_nonblocking_in_order},
    {"mpi_comm_thread", test_comm_thread},
    {"mpi_two_communicators", test_two_communicators},
    {"mpi_p2p", test_p2p},
    {"mpi_p2p_timeout", test_p2p_timeout},
    {"mpi_abort_is_local_and_final", test_abort_is_local_and_final},
    {"mpi_segments_across_hosts", test_segments_across_hosts},
};

int main(int argc, char **argv) {
    /* The first communicator initialises MPI (the path dptrain takes) and
     * is freed last, which finalizes it. */
    struct dp_comm *anchor = NULL;
    if (dp_comm_init(&anchor, "mpi", NULL)) {
        fprintf(stderr, "dptest_mpi: %s\n", dp_errmsg());
        return 1;
    }
    g_rank = dp_comm_rank(anchor), g_P = dp_comm_world(anchor);
    /* --case NAME [TAG]: TAG only marks the processes for run.sh's check */
    if (argc >= 3 && strcmp(argv[1], "--case") == 0) return timeout_case(argv[2]);
    int passed = 0, failed = 0;
    for (size_t i = 0; i < DP_ARRAY_LEN(tests); i++) {
        int selected = argc <= 1;
        for (int a = 1; a < argc; a++) selected |= strstr(tests[i].name, argv[a]) != NULL;
        if (!selected) continue;
        g_failures = 0;
        double t0 = dp_time();
        tests[i].fn();
        int any = 0;
        MPI_Allreduce(&g_failures, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (g_rank == 0) {
            printf("%s %-40s np %d %7.2fs\n", any ? "FAIL" : "ok  ", tests[i].name, g_P,
                   dp_time() - t0);
            fflush(stdout);
        }
        if (any) failed++;
        else passed++;
    }
    if (g_rank == 0) printf("np %d: %d passed, %d failed\n", g_P, passed, failed);
    dp_comm_free(anchor);
    return failed ? 1 : 0;
}
