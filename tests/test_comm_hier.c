/*
 * Hierarchical (hybrid) worlds: R processes × T threads.  The processes are
 * simulated here by R groups of threads whose process-level communicator is
 * a rank of a separate thread world (the stage on `inter` is then a
 * thread-backend collective instead of an MPI one; the layering is the same).
 * Every collective, with exact integer data, for R ∈ {1, 2, 3} × T ∈ {1, 2, 3};
 * a worker-count mismatch between processes; a failure in one process
 * reaching the others through the inter timeout.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "dp/comm.h"
#include "dp/core.h"
#include "test.h"

typedef void (*hier_fn)(struct dp_comm *c, int local, void *arg);

struct proc {
    struct dp_comm_world *inter_world, *w;
    int p, T;
    hier_fn fn;
    void *arg;
    struct dp_comm_params cp, inter_cp;
    int init_rc;
};
struct thr {
    struct proc *pr;
    int t;
};

static void *thr_main(void *a) {
    struct thr *th = a;
    struct dp_comm *c;
    ASSERT_OK(dp_comm_thread_init(&c, th->pr->w, th->t));
    ASSERT_EQ(dp_comm_rank(c), th->pr->p * th->pr->T + th->t);
    th->pr->fn(c, th->t, th->pr->arg);
    dp_comm_free(c);
    return NULL;
}

static void *proc_main(void *a) {
    struct proc *pr = a;
    struct dp_comm *inter;
    ASSERT_OK(dp_comm_thread_init(&inter, pr->inter_world, pr->p));
    pr->init_rc = dp_comm_thread_world_init_hier(&pr->w, pr->T, &pr->cp, inter);
    if (pr->init_rc == 0) {
        pthread_t tid[8];
        struct thr th[8];
        for (int t = 0; t < pr->T; t++) {
            th[t] = (struct thr){pr, t};
            ASSERT_EQ(pthread_create(&tid[t], NULL, thr_main, &th[t]), 0);
        }
        for (int t = 0; t < pr->T; t++) pthread_join(tid[t], NULL);
        dp_comm_thread_world_free(pr->w);
    }
    dp_comm_free(inter);
    return NULL;
}

/* Runs fn on R simulated processes of T[p] threads each; init_rc[p] gets
 * each process's dp_comm_thread_world_init_hier status (NULL: must be 0). */
static void run_hier(int R, const int *T, double inter_timeout, hier_fn fn, void *arg, int *init_rc) {
    struct dp_comm_params icp = dp_comm_default_params();
    icp.timeout_s = inter_timeout;
    struct dp_comm_world *iw;
    ASSERT_OK(dp_comm_thread_world_init(&iw, R, &icp));
    struct proc pr[4];
    pthread_t tid[4];
    ASSERT_TRUE(R <= 4);
    for (int p = 0; p < R; p++) {
        pr[p] = (struct proc){.inter_world = iw, .p = p, .T = T[p], .fn = fn, .arg = arg};
        pr[p].cp = dp_comm_default_params();
        ASSERT_EQ(pthread_create(&tid[p], NULL, proc_main, &pr[p]), 0);
    }
    for (int p = 0; p < R; p++) pthread_join(tid[p], NULL);
    for (int p = 0; p < R; p++) {
        if (init_rc) init_rc[p] = pr[p].init_rc;
        else ASSERT_EQ(pr[p].init_rc, 0);
    }
    dp_comm_thread_world_free(iw);
}

/* ---- every collective, exact values ------------------------------------------------------ */

struct exact_arg {
    enum dp_comm_algo algo;
};

static void exact_member(struct dp_comm *c, int local, void *arg) {
    enum dp_comm_algo algo = ((struct exact_arg *)arg)->algo;
    int G = dp_comm_world(c), g = dp_comm_rank(c);
    int64_t counts[] = {0, 1, G - 1, G + 1, 1000};
    float *x = dp_malloc(sizeof(float) * 1001);
    ASSERT_TRUE(x != NULL);
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        int64_t n = counts[k];
        /* allreduce: rank g holds (g+1)*(i%7+1); the sum is G(G+1)/2*(i%7+1) */
        for (int64_t i = 0; i < n; i++) x[i] = (float)((g + 1) * (i % 7 + 1));
        ASSERT_OK(dp_comm_allreduce(c, x, n, DP_DTYPE_F32, algo));
        for (int64_t i = 0; i < n; i++) ASSERT_FEQ(x[i], G * (G + 1) / 2 * (i % 7 + 1));
        /* reduce-scatter: this rank's block holds the sum */
        for (int64_t i = 0; i < n; i++) x[i] = (float)((g + 1) * (i % 5 + 1));
        ASSERT_OK(dp_comm_reduce_scatter(c, x, n, DP_DTYPE_F32, algo));
        int64_t off, len;
        dp_comm_split(n, G, g, &off, &len);
        for (int64_t i = off; i < off + len; i++) ASSERT_FEQ(x[i], G * (G + 1) / 2 * (i % 5 + 1));
        /* allgather: block b comes from rank b; the rest of the input is junk */
        for (int64_t i = 0; i < n; i++) x[i] = -1e6f;
        for (int64_t i = off; i < off + len; i++) x[i] = (float)(g * 10000 + i);
        ASSERT_OK(dp_comm_allgather(c, x, n, DP_DTYPE_F32, algo));
        for (int b = 0; b < G; b++) {
            int64_t bo, bl;
            dp_comm_split(n, G, b, &bo, &bl);
            for (int64_t i = bo; i < bo + bl; i++) ASSERT_FEQ(x[i], b * 10000 + i);
        }
        /* broadcast from every root */
        for (int root = 0; root < G; root++) {
            for (int64_t i = 0; i < n; i++) x[i] = (float)(g == root ? root * 100 + i : -7);
            ASSERT_OK(dp_comm_broadcast(c, x, n, DP_DTYPE_F32, root, algo));
            for (int64_t i = 0; i < n; i++) ASSERT_FEQ(x[i], root * 100 + i);
        }
        ASSERT_OK(dp_comm_barrier(c));
    }
    /* nonblocking: several in flight, waited in order; f64 */
    double d[3][4];
    struct dp_comm_req *rq[3];
    for (int j = 0; j < 3; j++) {
        for (int i = 0; i < 4; i++) d[j][i] = (double)(g + j + i);
        ASSERT_OK(dp_comm_iallreduce(c, d[j], 4, DP_DTYPE_F64, algo, &rq[j]));
    }
    for (int j = 0; j < 3; j++) {
        ASSERT_OK(dp_comm_wait(c, rq[j]));
        for (int i = 0; i < 4; i++) ASSERT_FEQ(d[j][i], G * (G - 1) / 2 + G * (j + i));
    }
    (void)local;
    dp_free(x);
}

TEST(comm_hier_every_collective_exact) {
    const int layouts[][4] = {{1, 1}, {1, 2}, {2, 1}, {2, 2}, {2, 3}, {3, 1}, {3, 2}};
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) {
        int R = layouts[k][0], T[4] = {layouts[k][1], layouts[k][1], layouts[k][1], layouts[k][1]};
        enum dp_comm_algo algos[] = {DP_ALGO_AUTO, DP_ALGO_RING, DP_ALGO_RHD};
        for (int a = 0; a < 3; a++) {
            struct exact_arg ea = {algos[a]};
            run_hier(R, T, 0, exact_member, &ea, NULL);
        }
    }
}

/* ---- all-gather bits with one thread per process ------------------------------------------ */

/* With one rank per process (the flat MPI job) the leaders' stage is inter's
 * own all-gather, not an all-reduce of zero-padded blocks: every bit of
 * every block arrives as sent, -0.0 and a signalling NaN's payload included
 * (a sum with zeros would turn -0.0 into +0.0 and quiet the NaN). */
static uint32_t gather_bits(int g, int64_t i) {
    return i % 3 == 0 ? 0x80000000u : i % 3 == 1 ? 0x7f800001u + (uint32_t)g : 0xbf800000u + (uint32_t)i;
}
static void gather_bits_member(struct dp_comm *c, int local, void *arg) {
    int G = dp_comm_world(c), g = dp_comm_rank(c);
    int64_t counts[] = {0, 1, G + 1, 1000};
    uint32_t x[1000];
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        int64_t n = counts[k], off, len;
        dp_comm_split(n, G, g, &off, &len);
        for (int64_t i = 0; i < n; i++) x[i] = i >= off && i < off + len ? gather_bits(g, i) : 0x3f800000u;
        ASSERT_OK(dp_comm_allgather(c, x, n, DP_DTYPE_F32, *(enum dp_comm_algo *)arg));
        for (int b = 0; b < G; b++) {
            dp_comm_split(n, G, b, &off, &len);
            for (int64_t i = off; i < off + len; i++) ASSERT_EQ(x[i], gather_bits(b, i));
        }
    }
    (void)local;
}

TEST(comm_hier_allgather_one_thread_per_process_keeps_bits) {
    const int T[4] = {1, 1, 1, 1};
    enum dp_comm_algo algos[] = {DP_ALGO_AUTO, DP_ALGO_RING, DP_ALGO_RHD};
    for (int R = 2; R <= 4; R++)
        for (int a = 0; a < 3; a++) run_hier(R, T, 0, gather_bits_member, &algos[a], NULL);
}

/* ---- the same sums as a flat world ------------------------------------------------------- */

/* Deterministic-mode style data (integers in doubles): the hierarchical sum
 * is bit-identical to the flat one. */
static void flat_vs_hier_member(struct dp_comm *c, int local, void *arg) {
    double *out = arg;
    int g = dp_comm_rank(c);
    double x[64];
    for (int i = 0; i < 64; i++) x[i] = (double)(((uint64_t)(g + 1) * 2654435761u * (uint64_t)(i + 1)) % 1000003u);
    ASSERT_OK(dp_comm_allreduce(c, x, 64, DP_DTYPE_F64, DP_ALGO_AUTO));
    if (g == 0) memcpy(out, x, sizeof x);
    (void)local;
}
static void flat_member(struct dp_comm *c, void *arg) { flat_vs_hier_member(c, 0, arg); }

static void *flat_thread(void *a) {
    void **aa = a;
    struct dp_comm *c;
    ASSERT_OK(dp_comm_thread_init(&c, aa[0], (int)(intptr_t)aa[1]));
    flat_member(c, aa[2]);
    dp_comm_free(c);
    return NULL;
}

TEST(comm_hier_matches_flat_world) {
    double flat[64], hier[64];
    struct dp_comm_world *w;
    ASSERT_OK(dp_comm_thread_world_init(&w, 6, NULL));
    pthread_t tid[6];
    void *args[6][3];
    for (int r = 0; r < 6; r++) {
        args[r][0] = w, args[r][1] = (void *)(intptr_t)r, args[r][2] = flat;
        ASSERT_EQ(pthread_create(&tid[r], NULL, flat_thread, args[r]), 0);
    }
    for (int r = 0; r < 6; r++) pthread_join(tid[r], NULL);
    dp_comm_thread_world_free(w);
    int T[3] = {2, 2, 2};
    run_hier(3, T, 0, flat_vs_hier_member, hier, NULL);
    ASSERT_EQ(memcmp(flat, hier, sizeof flat), 0);
}

/* ---- errors ------------------------------------------------------------------------------ */

static void never_called(struct dp_comm *c, int local, void *arg) {
    (void)c, (void)local, (void)arg;
    ASSERT_TRUE(0 && "no rank may start when the layouts differ");
}

TEST_T(comm_hier_worker_count_mismatch, 20) {
    int T[2] = {2, 1}, rc[2];
    run_hier(2, T, 0, never_called, NULL, rc);
    ASSERT_EQ(rc[0], DP_EMISMATCH);
    ASSERT_EQ(rc[1], DP_EMISMATCH);
}

/* Process 1's thread 1 fails.  Its own process stops at once (abort); the
 * other process, blocked in the stage on `inter`, gets out through the inter
 * timeout (an MPI launcher would kill it sooner: dp_comm_kill_job). */
static atomic_int n_cancelled;
static void fail_member(struct dp_comm *c, int local, void *arg) {
    (void)arg;
    float x[8] = {0};
    if (dp_comm_rank(c) == 3) {
        ASSERT_EQ(dp_comm_abort(c, "injected failure"), DP_ECANCELED);
        return;
    }
    int rc = dp_comm_allreduce(c, x, 8, DP_DTYPE_F32, DP_ALGO_AUTO);
    ASSERT_EQ(rc, DP_ECANCELED);
    ASSERT_TRUE(strstr(dp_errmsg(), "injected failure") || strstr(dp_errmsg(), "timeout"));
    atomic_fetch_add(&n_cancelled, 1);
    (void)local;
}

TEST_T(comm_hier_failure_reaches_every_process, 30) {
    int T[2] = {2, 2};
    double t0 = dp_time();
    run_hier(2, T, 1.0, fail_member, NULL, NULL);
    ASSERT_EQ(atomic_load(&n_cancelled), 3);
    ASSERT_TRUE(dp_time() - t0 < 10);
}
