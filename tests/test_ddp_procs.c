/* Several processes × several worker threads (the layout of an MPI job):
 * the trainer with a process-level communicator (dp_train_params.dp.inter).
 * The processes are simulated by threads, each running its own trainer,
 * whose `inter` is a rank of a separate thread world: everything above the
 * communicator (global ranks, sharding, the hierarchical all-reduce,
 * agreement checks, rank-0-only outputs, failures) is what an MPI job runs;
 * tests/mpi and tests/netns run the same over real MPI processes. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dp/comm.h"
#include "dp/train.h"
#include "test.h"

#include "ddp_util.h"

struct proc {
    pthread_t th;
    struct dp_comm_world *iw;
    int p;
    struct dp_train_params tp;
    struct dp_fault fault; /* armed after dp_trainer_init (kind 0: none) */
    int rc;
    char err[512];
    float *params; /* params then buffers (caller frees) */
    int64_t n;
    int64_t gathers; /* worker 0's ZeRO range all-gathers (dp_trainer_zero_counts) */
    const char *save; /* after the run: dp_trainer_save here; its code and message: */
    int save_rc;
    char save_err[512];
};

static void *proc_main(void *a) {
    struct proc *pr = a;
    struct dp_comm *inter;
    ASSERT_OK(dp_comm_thread_init(&inter, pr->iw, pr->p));
    pr->tp.dp.inter = inter;
    struct dp_trainer *t = NULL;
    pr->rc = init_faulty(&t, &pr->tp, &pr->fault);
    if (!pr->rc) pr->rc = dp_trainer_run(t);
    if (pr->rc) {
        snprintf(pr->err, sizeof pr->err, "%s", dp_errmsg());
        /* as the CLI's dp_comm_kill_job would: the other processes must not wait for this one */
        dp_comm_abort(inter, pr->err);
    } else {
        const struct dp_model *m = dp_trainer_model(t);
        pr->n = m->num_params + m->num_buffers;
        pr->params = malloc(sizeof(float) * (size_t)pr->n);
        memcpy(pr->params, dp_trainer_replica(t)->params, sizeof(float) * (size_t)m->num_params);
        memcpy(pr->params + m->num_params, dp_trainer_replica(t)->buffers, sizeof(float) * (size_t)m->num_buffers);
        struct dp_zero_counts zc;
        if (dp_trainer_zero_counts(t, 0, &zc) == DP_OK) pr->gathers = zc.gathers;
        if (pr->save) {
            pr->save_rc = dp_trainer_save(t, pr->save);
            snprintf(pr->save_err, sizeof pr->save_err, "%s", pr->save_rc ? dp_errmsg() : "");
        }
    }
    dp_trainer_free(t);
    dp_comm_free(inter);
    return NULL;
}

/* Runs R simulated processes with parameters tp[p]; inter timeout 0 = none. */
static void run_procs(int R, struct proc *pr, double inter_timeout) {
    struct dp_comm_params cp = dp_comm_default_params();
    cp.timeout_s = inter_timeout;
    struct dp_comm_world *iw;
    ASSERT_OK(dp_comm_thread_world_init(&iw, R, &cp));
    for (int p = 0; p < R; p++) {
        pr[p].iw = iw, pr[p].p = p;
        ASSERT_EQ(pthread_create(&pr[p].th, NULL, proc_main, &pr[p]), 0);
    }
    for (int p = 0; p < R; p++) pthread_join(pr[p].th, NULL);
    dp_comm_thread_world_free(iw);
}

/* R processes × T workers against one process with R*T workers. */
static void hybrid_equivalence(const char *model, int R, int T, int64_t steps, float lr, int det) {
    require_data();
    struct dp_train_params p = base(model, R * T);
    p.sched.base_lr = lr;
    p.run.max_steps = steps;
    p.dp.deterministic = det;
    int64_t n;
    float *ref = train(&p, &n);
    struct proc pr[4];
    memset(pr, 0, sizeof pr);
    for (int k = 0; k < R; k++) {
        pr[k].tp = p;
        pr[k].tp.dp.workers = T;
        pr[k].tp.dp.check_replicas = det ? 0 : 1; /* all R*T replicas stay bit-identical */
    }
    run_procs(R, pr, 0);
    for (int k = 0; k < R; k++) {
        if (pr[k].rc) dp_test_fail(__FILE__, __LINE__, "process %d: %s", k, pr[k].err);
        ASSERT_EQ(pr[k].n, n);
        double d = rel_diff(ref, pr[k].params, n);
        if (k == 0)
            fprintf(stderr, "    %s %d processes x %d workers vs 1 x %d: max relative difference %.2e%s\n", model,
                    R, T, R * T, d, det ? " (deterministic)" : "");
        if (det) ASSERT_EQ(memcmp(ref, pr[k].params, sizeof(float) * (size_t)n), 0);
        else ASSERT_TRUE(d <= 1e-5);
        free(pr[k].params);
    }
    free(ref);
}

TEST_T(ddp_procs_hybrid_equals_flat_mlp, 300) { hybrid_equivalence("mlp", 2, 2, 17, 0.05f, 0); }
TEST_T(ddp_procs_hybrid_equals_flat_resnet_syncbn, 300) { hybrid_equivalence("resnet", 2, 2, 3, 0.01f, 0); }
TEST_T(ddp_procs_three_procs_uneven_batch, 300) { hybrid_equivalence("mlp", 3, 1, 17, 0.05f, 0); }
TEST_T(ddp_procs_deterministic_bit_identical, 300) {
    hybrid_equivalence("mlp", 2, 2, 8, 0.05f, 1);
    hybrid_equivalence("mlp", 3, 1, 8, 0.05f, 1);
}

/* A process started with other options: every process stops before the
 * first step with the rank and the part named. */
TEST_T(ddp_procs_disagreement_named, 120) {
    require_data();
    struct proc pr[2];
    memset(pr, 0, sizeof pr);
    pr[0].tp = base("mlp", 2), pr[1].tp = base("mlp", 2);
    pr[1].tp.optim.momentum = 0.5f;
    pr[0].tp.run.max_steps = pr[1].tp.run.max_steps = 3;
    run_procs(2, pr, 0);
    for (int k = 0; k < 2; k++) {
        ASSERT_EQ(pr[k].rc, DP_EMISMATCH);
        ASSERT_TRUE(strstr(pr[k].err, "rank 2 disagrees with rank 0 on the configuration") != NULL);
    }
    /* a different model: named as such */
    memset(pr, 0, sizeof pr);
    pr[0].tp = base("mlp", 1), pr[1].tp = base("mlp:784,64,10", 1);
    run_procs(2, pr, 0);
    for (int k = 0; k < 2; k++) ASSERT_TRUE(strstr(pr[k].err, "rank 1 disagrees with rank 0 on the model") != NULL);
    /* a different number of worker threads per process */
    memset(pr, 0, sizeof pr);
    pr[0].tp = base("mlp", 2), pr[1].tp = base("mlp", 1);
    run_procs(2, pr, 0);
    for (int k = 0; k < 2; k++) {
        ASSERT_EQ(pr[k].rc, DP_EMISMATCH);
        ASSERT_TRUE(strstr(pr[k].err, "worker thread") != NULL);
    }
}

/* An allocation failure on rank 3 (process 1): process 1 names it; process
 * 0, blocked on the process-level communicator, is cancelled (here by the
 * abort of `inter` that proc_main does as the CLI's dp_comm_kill_job would,
 * or else by the inter timeout). */
TEST_T(ddp_procs_failure_in_one_process, 120) {
    require_data();
    struct proc pr[2];
    memset(pr, 0, sizeof pr);
    for (int k = 0; k < 2; k++) {
        pr[k].tp = base("mlp", 2);
        pr[k].fault = (struct dp_fault){DP_FAULT_ALLOC, 3, 2};
    }
    double t0 = dp_time();
    run_procs(2, pr, 2.0);
    ASSERT_TRUE(dp_time() - t0 < 30);
    ASSERT_EQ(pr[1].rc, DP_ENOMEM);
    ASSERT_TRUE(strstr(pr[1].err, "worker 3") != NULL && strstr(pr[1].err, "allocation") != NULL);
    ASSERT_EQ(pr[0].rc, DP_ECANCELED);
}

/* Only rank 0 writes; the epoch record names the job's size and straggler. */
TEST_T(ddp_procs_outputs_from_rank0, 120) {
    require_data();
    char dir[] = "/tmp/dptrain-procs-XXXXXX";
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    char out0[256], out1[256], path[300];
    snprintf(out0, sizeof out0, "%s/p0", dir);
    snprintf(out1, sizeof out1, "%s/p1", dir);
    struct proc pr[2];
    memset(pr, 0, sizeof pr);
    for (int k = 0; k < 2; k++) pr[k].tp = base("mlp", 2), pr[k].tp.io.out_dir = k ? out1 : out0;
    run_procs(2, pr, 0);
    ASSERT_OK(pr[0].rc);
    ASSERT_OK(pr[1].rc);
    snprintf(path, sizeof path, "%s/checkpoint.bin", out0);
    ASSERT_EQ(access(path, R_OK), 0);
    ASSERT_TRUE(access(out1, F_OK) != 0); /* process 1 wrote nothing */
    snprintf(path, sizeof path, "%s/metrics.jsonl", out0);
    FILE *f = fopen(path, "r");
    ASSERT_TRUE(f != NULL);
    char line[8192];
    int epoch_lines = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "\"kind\": \"epoch\"")) {
            epoch_lines++;
            ASSERT_TRUE(strstr(line, "\"workers\": 4") != NULL);
            ASSERT_TRUE(strstr(line, "\"slowest_rank\": ") != NULL);
            ASSERT_TRUE(strstr(line, "\"rank_arrival_s\": [") != NULL);
        }
    fclose(f);
    ASSERT_EQ(epoch_lines, 1);
    for (int k = 0; k < 2; k++) free(pr[k].params);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ASSERT_EQ(system(cmd), 0);
}

/* A fresh folder under /tmp (dir: a "/tmp/dptrain-procs-XXXXXX" array) and
 * the checkpoint path in it; remove_dir takes it away at the test's end. */
static void make_dir(char *dir, char *ck, size_t cap) {
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    snprintf(ck, cap, "%s/checkpoint.bin", dir);
}
static void remove_dir(const char *dir) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ASSERT_EQ(system(cmd), 0);
}

/* A checkpoint of a 2-process run resumed by 3 processes, then by one
 * process with 2 threads: in deterministic mode the same bits as an
 * uninterrupted single-worker run. */
TEST_T(ddp_procs_resume_on_other_world_sizes, 300) {
    require_data();
    char dir[] = "/tmp/dptrain-procs-XXXXXX", ck[300];
    make_dir(dir, ck, sizeof ck);
    struct dp_train_params p = base("mlp", 1);
    p.dp.deterministic = 1;
    p.run.epochs = 3;
    int64_t n;
    float *ref = train(&p, &n);
    struct proc pr[3];
    memset(pr, 0, sizeof pr);
    for (int k = 0; k < 2; k++) pr[k].tp = p, pr[k].tp.run.epochs = 1, pr[k].tp.io.out_dir = dir;
    run_procs(2, pr, 0);
    ASSERT_OK(pr[0].rc);
    free(pr[0].params), free(pr[1].params);
    memset(pr, 0, sizeof pr);
    for (int k = 0; k < 3; k++) pr[k].tp = p, pr[k].tp.run.epochs = 2, pr[k].tp.io.out_dir = dir, pr[k].tp.io.resume = ck;
    run_procs(3, pr, 0);
    for (int k = 0; k < 3; k++) {
        if (pr[k].rc) dp_test_fail(__FILE__, __LINE__, "process %d: %s", k, pr[k].err);
        free(pr[k].params);
    }
    struct dp_train_params q = p;
    q.dp.workers = 2, q.io.resume = ck, q.io.out_dir = dir;
    float *got = train(&q, &n);
    ASSERT_EQ(memcmp(ref, got, sizeof(float) * (size_t)n), 0);
    free(ref), free(got);
    remove_dir(dir);
}

/* A ZeRO checkpoint of a multi-process job: rank 0 writes it while every
 * other worker broadcasts its pieces block by block (zero_stream), and the
 * file is byte for byte a plain one-worker run's (deterministic mode: the
 * same parameters and state).  Stages 1-3 at 2 processes x 2 workers and 3 x
 * 1 (mlp:784,48,10, 38170 parameters: uneven pieces of ten 16 KiB buckets),
 * AdamW; and a piece longer than the 1M-float block (stage 1, 2 x 1 on a
 * 2146510-parameter mlp: two blocks a piece), momentum SGD. */
static void zero_procs_file(const char *model, int R, int T, int z, int adam) {
    char dir[] = "/tmp/dptrain-procs-XXXXXX";
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    char d0[300], d1[300], ck[400];
    snprintf(d0, sizeof d0, "%s/plain", dir), snprintf(d1, sizeof d1, "%s/zero", dir);
    struct dp_train_params p = base(model, 1);
    if (adam) p.optim.kind = DP_OPTIM_ADAMW, p.sched.base_lr = 1e-3f;
    p.dp.deterministic = 1;
    p.run.max_steps = 2, p.data.train_limit = 240, p.data.test_limit = 60;
    p.dp.bucket_cap_bytes = 16 << 10, p.dp.first_bucket_bytes = 16 << 10;
    p.io.out_dir = d0;
    int64_t n;
    free(train(&p, &n));
    struct proc pr[3];
    memset(pr, 0, sizeof pr);
    for (int k = 0; k < R; k++) pr[k].tp = p, pr[k].tp.dp.workers = T, pr[k].tp.dp.zero = z, pr[k].tp.io.out_dir = d1;
    run_procs(R, pr, 0);
    for (int k = 0; k < R; k++) {
        if (pr[k].rc) dp_test_fail(__FILE__, __LINE__, "process %d: %s", k, pr[k].err);
        free(pr[k].params);
    }
    size_t n0, n1;
    snprintf(ck, sizeof ck, "%s/checkpoint.bin", d0);
    char *want = read_whole_file(ck, &n0);
    snprintf(ck, sizeof ck, "%s/checkpoint.bin", d1);
    char *got = read_whole_file(ck, &n1);
    /* the header and payload: the sections after them hold each run folder's own metrics.jsonl
     * length (DPMETRIC), which differs with the ranks' record fields */
    struct dp_ckpt_header h0;
    memcpy(&h0, want, n0 >= sizeof h0 ? sizeof h0 : 0);
    size_t body = sizeof h0 + (size_t)h0.payload_size;
    int same = n0 >= body && n1 >= body && memcmp(want, got, body) == 0;
    fprintf(stderr, "    %s %d processes x %d workers --zero %d: %zu bytes, %s\n", model, R, T, z, n1,
            same ? "the same bytes as one plain worker's" : "differs");
    ASSERT_TRUE(same);
    free(want), free(got);
    remove_dir(dir);
}
TEST_T(ddp_procs_zero_checkpoint_streamed, 300) {
    require_data();
    for (int z = 1; z <= 3; z++) {
        zero_procs_file("mlp:784,48,10", 2, 2, z, 1);
        zero_procs_file("mlp:784,48,10", 3, 1, z, 1);
    }
    zero_procs_file("mlp:784,2700,10", 2, 1, 1, 0);
}

/* --zero 1 across processes: by default (auto) the parameters' all-gather
 * is left in flight bucket by bucket for the next forward (src/ddp/zero.c
 * "Ahead"), which with --zero-gather step it is not; the all-gather copies
 * bits, so both end with the same bits.  With --zero-reduce scatter each
 * bucket is then reduce-scattered during backward: the same model within
 * 1e-6.  2 processes x 1 worker and 2 x 2, mlp:784,48,10 in 16 KiB
 * buckets, normal mode, --check-replicas. */
TEST_T(ddp_procs_zero1_gathers_ahead, 300) {
    require_data();
    for (int T = 1; T <= 2; T++) {
        float *got[3];
        int64_t gathers[3], n = 0;
        for (int g = 0; g < 3; g++) { /* auto, step, auto with scatter */
            struct proc pr[2];
            memset(pr, 0, sizeof pr);
            for (int k = 0; k < 2; k++) {
                pr[k].tp = base("mlp:784,48,10", T);
                pr[k].tp.dp.zero = 1, pr[k].tp.run.max_steps = 5, pr[k].tp.dp.check_replicas = 1;
                pr[k].tp.dp.zero_gather = g == 1 ? DP_ZERO_GATHER_STEP : DP_ZERO_GATHER_AUTO;
                pr[k].tp.dp.zero_scatter = g == 2;
                pr[k].tp.dp.bucket_cap_bytes = 16 << 10, pr[k].tp.dp.first_bucket_bytes = 16 << 10;
            }
            run_procs(2, pr, 0);
            for (int k = 0; k < 2; k++)
                if (pr[k].rc) dp_test_fail(__FILE__, __LINE__, "process %d: %s", k, pr[k].err);
            got[g] = pr[0].params, gathers[g] = pr[0].gathers, n = pr[0].n;
            free(pr[1].params);
        }
        double d = rel_diff(got[0], got[2], n);
        fprintf(stderr, "    2 processes x %d: range all-gathers %lld (auto), %lld (step), %lld (scatter); auto and "
                "step %s; scatter %.2e\n", T, (long long)gathers[0], (long long)gathers[1], (long long)gathers[2],
                memcmp(got[0], got[1], sizeof(float) * (size_t)n) ? "differ" : "same bits", d);
        ASSERT_TRUE(gathers[0] >= 5 * 2 && gathers[2] == gathers[0]); /* two ranges or more a step, ahead */
        ASSERT_EQ(gathers[1], 0);
        ASSERT_EQ(memcmp(got[0], got[1], sizeof(float) * (size_t)n), 0);
        ASSERT_TRUE(d <= 1e-6);
        free(got[0]), free(got[1]), free(got[2]);
    }
}

/* Saving through the library after a multi-process ZeRO run: the shards
 * live in processes whose trainers may be gone, so dp_trainer_save refuses
 * with one line (the run writes its checkpoints itself, during the run) and
 * writes no file; a plain multi-process run saves. */
TEST_T(ddp_procs_zero_save_after_run_refused, 120) {
    require_data();
    char dir[] = "/tmp/dptrain-procs-XXXXXX", ck[300];
    make_dir(dir, ck, sizeof ck);
    for (int z = 0; z <= 1; z++) {
        struct proc pr[2];
        memset(pr, 0, sizeof pr);
        for (int k = 0; k < 2; k++) {
            pr[k].tp = base("mlp:784,48,10", 1);
            pr[k].tp.dp.zero = z, pr[k].tp.run.max_steps = 2;
        }
        pr[0].save = ck;
        run_procs(2, pr, 0);
        for (int k = 0; k < 2; k++) {
            if (pr[k].rc) dp_test_fail(__FILE__, __LINE__, "process %d: %s", k, pr[k].err);
            free(pr[k].params);
        }
        fprintf(stderr, "    --zero %d: dp_trainer_save: %s\n", z, pr[0].save_rc ? pr[0].save_err : "saved");
        if (z) {
            ASSERT_EQ(pr[0].save_rc, DP_ENOTSUP);
            ASSERT_TRUE(strstr(pr[0].save_err, "multi-process ZeRO job writes its checkpoints during the run") != NULL);
            ASSERT_TRUE(access(ck, F_OK) != 0);
        } else {
            ASSERT_OK(pr[0].save_rc);
            ASSERT_EQ(access(ck, F_OK), 0);
            ASSERT_EQ(unlink(ck), 0);
        }
    }
    remove_dir(dir);
}

/* A ZeRO checkpoint that cannot be written (a folder named checkpoint.bin
 * in the way of the rename) fails rank 0 with one clear error after the
 * pieces have passed, and the other process is released (no hang). */
TEST_T(ddp_procs_zero_checkpoint_write_failure, 120) {
    require_data();
    char dir[] = "/tmp/dptrain-procs-XXXXXX", ck[300];
    make_dir(dir, ck, sizeof ck);
    ASSERT_EQ(mkdir(ck, 0755), 0);
    struct proc pr[2];
    memset(pr, 0, sizeof pr);
    for (int k = 0; k < 2; k++) {
        pr[k].tp = base("mlp:784,48,10", 1);
        pr[k].tp.dp.zero = 2, pr[k].tp.run.max_steps = 2, pr[k].tp.io.out_dir = dir;
        pr[k].tp.dp.bucket_cap_bytes = 16 << 10, pr[k].tp.dp.first_bucket_bytes = 16 << 10;
    }
    run_procs(2, pr, 0);
    fprintf(stderr, "    process 0: %s\n    process 1: %s\n", pr[0].err, pr[1].rc ? pr[1].err : "ok");
    ASSERT_EQ(pr[0].rc, DP_EIO);
    ASSERT_TRUE(strstr(pr[0].err, "cannot rename") != NULL);
    for (int k = 0; k < 2; k++) free(pr[k].params);
    remove_dir(dir);
}

/* A straggler (rank 2 sleeps 20 ms a step) is named, with its lag, in the
 * epoch record and the event. */
static int slow_rank_seen = -2;
static double slow_lag_seen;
static void on_epoch(void *arg, const struct dp_event *ev) {
    (void)arg;
    if (ev->kind == DP_EVENT_EPOCH) slow_rank_seen = ev->slow_rank, slow_lag_seen = ev->slow_lag;
}
TEST_T(ddp_procs_straggler_named, 120) {
    require_data();
    struct proc pr[2];
    memset(pr, 0, sizeof pr);
    for (int k = 0; k < 2; k++) {
        pr[k].tp = base("mlp", 2);
        pr[k].fault = (struct dp_fault){DP_FAULT_SLOW, 2, 0};
        pr[k].tp.io.on_event = on_epoch;
    }
    run_procs(2, pr, 0);
    ASSERT_OK(pr[0].rc);
    ASSERT_OK(pr[1].rc);
    fprintf(stderr, "    slowest rank %d, %.1f ms per step behind\n", slow_rank_seen, 1e3 * slow_lag_seen);
    ASSERT_EQ(slow_rank_seen, 2);
    ASSERT_TRUE(slow_lag_seen > 0.015 && slow_lag_seen < 0.2);
    for (int k = 0; k < 2; k++) free(pr[k].params);
}
