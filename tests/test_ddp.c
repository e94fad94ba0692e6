/* Data parallelism: P workers train the same model as one worker (the
 * central invariant), replicas stay equal, failures stop every worker. */
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dp/comm.h"
#include "dp/ddp.h"
#include "dp/train.h"
#include "test.h"

#include "ddp_util.h"

static void equivalence(const char *model, int64_t steps, float lr) {
    require_data();
    struct dp_train_params p = base(model, 1);
    p.sched.base_lr = lr;
    p.max_steps = steps;
    int64_t n1, n;
    float *ref = train(&p, &n1);
    for (int P = 2; P <= 4; P++) {
        p.workers = P;
        p.check_replicas = 1; /* every step: all replicas stay bit-identical */
        float *got = train(&p, &n);
        ASSERT_EQ(n, n1);
        double d = rel_diff(ref, got, n);
        fprintf(stderr, "    %s P=%d: max relative difference to P=1 after %lld steps: %.2e\n", model, P,
                (long long)steps, d);
        ASSERT_TRUE(d <= 1e-5);
        free(got);
    }
    free(ref);
}

TEST_T(ddp_equivalence_mlp, 300) { equivalence("mlp", 17, 0.05f); } /* a whole epoch, uneven last batch */
TEST_T(ddp_equivalence_cnn, 300) { equivalence("cnn", 6, 0.05f); }
/* BatchNorm statistics are synchronised across workers (SyncBatchNorm), so
 * resnet is equivalent too, running statistics included.  Early in training
 * this BatchNorm net amplifies rounding differences quickly: one worker with
 * OpenBLAS instead of oneDNN (a change of summation order only) already
 * differs by 1.3e-4 after 3 steps at lr 0.05, but by less than 1e-6 at lr
 * 0.01.  So resnet is checked at lr 0.01, where the comparison measures the
 * reduction and not the chaos of the first steps. */
TEST_T(ddp_equivalence_resnet, 300) { equivalence("resnet", 3, 0.01f); }

TEST_T(ddp_accumulation_equals_big_batch, 300) {
    require_data();
    /* 2 micro-batches of 30 = one batch of 60: the same samples in the same
     * step (the epoch permutation does not depend on the batch size). */
    struct dp_train_params p = base("mlp", 2);
    p.max_steps = 8;
    int64_t n;
    float *ref = train(&p, &n);
    p.batch = 30;
    p.accum = 2;
    float *got = train(&p, &n);
    double d = rel_diff(ref, got, n);
    fprintf(stderr, "    accum 2 x 30 vs batch 60: %.2e\n", d);
    ASSERT_TRUE(d <= 1e-5);
    free(ref), free(got);
}

TEST_T(ddp_overlap_off_and_tiny_buckets_same_result, 300) {
    require_data();
    struct dp_train_params p = base("cnn", 2);
    p.max_steps = 4;
    int64_t n;
    float *ref = train(&p, &n);
    p.overlap = 0;
    float *a = train(&p, &n);
    p.overlap = 1;
    p.bucket_cap_bytes = 4096, p.first_bucket_bytes = 64; /* one bucket per layer */
    float *b = train(&p, &n);
    /* the all-reduce of each element is the same sum of two values */
    ASSERT_TRUE(memcmp(ref, a, sizeof(float) * (size_t)n) == 0);
    ASSERT_TRUE(memcmp(ref, b, sizeof(float) * (size_t)n) == 0);
    free(ref), free(a), free(b);
}

TEST(ddp_buckets_plan) {
    struct dp_model *m;
    ASSERT_OK(dp_model_from_spec(&m, "cnn", 1, 28, 28));
    struct dp_reducer r;
    struct dp_reducer_params rp = dp_reducer_default_params();
    rp.first_bucket_bytes = 4 * 2000; /* fc2 (1290 floats) alone */
    rp.bucket_cap_bytes = 4 * 410000; /* fc1 (401536) alone, then both convs (18816) */
    ASSERT_OK(dp_reducer_init(&r, m, NULL, NULL, &rp));
    ASSERT_EQ(r.nb, 3);
    /* contiguous, from the end of the slab, covering it exactly */
    ASSERT_EQ(r.b[0].off + r.b[0].count, m->num_params);
    for (int i = 1; i < r.nb; i++) ASSERT_EQ(r.b[i].off + r.b[i].count, r.b[i - 1].off);
    ASSERT_EQ(r.b[r.nb - 1].off, 0);
    ASSERT_EQ(r.b[0].count, 1290);
    ASSERT_EQ(r.b[1].count, 401536);
    ASSERT_EQ(r.b[2].count, 18816);
    dp_reducer_free(&r);
    dp_model_free(m);
}

static void expect_failure(int kind, int worker, const char *needle) {
    require_data();
    struct dp_train_params p = base("mlp", 3);
    p.epochs = 3;
    p.fault_kind = kind;
    p.fault_worker = worker;
    p.fault_step = 20; /* in the second epoch: the first epoch's checkpoint exists */
    char dir[512], ck[600];
    snprintf(dir, sizeof dir, "%s/run", dp_test_tmpdir());
    snprintf(ck, sizeof ck, "%s/checkpoint.bin", dir);
    p.out_dir = dir;
    p.ckpt_every = 1;
    struct dp_trainer *t;
    ASSERT_OK(dp_trainer_init(&t, &p));
    double t0 = dp_time();
    int rc = dp_trainer_run(t);
    double dt = dp_time() - t0;
    dp_trainer_free(t);
    ASSERT_TRUE(rc != 0);
    ASSERT_TRUE(rc != DP_ECANCELED); /* the cause, not a cancelled bystander */
    fprintf(stderr, "    %s (%.2fs)\n", dp_errmsg(), dt);
    char want[64];
    snprintf(want, sizeof want, "worker %d", worker);
    ASSERT_TRUE(strstr(dp_errmsg(), want) != NULL);
    ASSERT_TRUE(strstr(dp_errmsg(), "step 20") != NULL);
    ASSERT_TRUE(strstr(dp_errmsg(), needle) != NULL);
    ASSERT_TRUE(dt < 30);
    /* the last checkpoint (end of epoch 1, step 17) is intact */
    struct dp_ckpt_header h;
    float *payload;
    ASSERT_OK(dp_ckpt_read(ck, &h, &payload));
    ASSERT_EQ(h.step, 17);
    dp_free(payload);
}

TEST_T(ddp_failure_nan_names_worker_and_step, 120) { expect_failure(DP_FAULT_NAN, 2, "not finite"); }
TEST_T(ddp_failure_alloc_stops_all_workers, 120) { expect_failure(DP_FAULT_ALLOC, 1, "allocation"); }
TEST_T(ddp_failure_data_stops_all_workers, 120) { expect_failure(DP_FAULT_DATA, 0, "data error"); }

TEST_T(ddp_skip_nonfinite_goes_on, 120) {
    require_data();
    struct dp_train_params p = base("mlp", 2);
    p.fault_kind = DP_FAULT_NAN;
    p.fault_worker = 1;
    p.fault_step = 5;
    p.skip_nonfinite = 1;
    p.check_replicas = 1;
    int64_t n;
    float *got = train(&p, &n);
    for (int64_t i = 0; i < n; i++) ASSERT_TRUE(isfinite(got[i]));
    free(got);
}

static void deterministic(const char *model, int64_t steps) {
    require_data();
    struct dp_train_params p = base(model, 1);
    p.max_steps = steps;
    p.deterministic = 1;
    p.det_chunk = 8;
    int64_t n1, n;
    float *ref = train(&p, &n1);
    for (int P = 2; P <= 4; P++) {
        p.workers = P;
        float *got = train(&p, &n);
        ASSERT_EQ(n, n1);
        /* bit for bit, for every P (also P = 3, which does not divide 60) */
        ASSERT_TRUE(memcmp(ref, got, sizeof(float) * (size_t)n) == 0);
        free(got);
    }
    /* and the same model as ordinary training, to float rounding */
    p.workers = 1;
    p.deterministic = 0;
    float *plain = train(&p, &n);
    double d = rel_diff(plain, ref, n);
    fprintf(stderr, "    %s deterministic vs ordinary: %.2e\n", model, d);
    ASSERT_TRUE(d <= 1e-5);
    free(plain), free(ref);
}

TEST_T(ddp_deterministic_mlp_bit_identical, 300) { deterministic("mlp", 17); }
TEST_T(ddp_deterministic_cnn_bit_identical, 300) { deterministic("cnn", 4); }

TEST(ddp_deterministic_rejects_batchnorm) {
    require_data();
    struct dp_train_params p = base("resnet", 2);
    p.deterministic = 1;
    struct dp_trainer *t;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_ENOTSUP, "BatchNorm");
}

TEST_T(ddp_check_replicas_names_diverged_worker, 120) {
    require_data();
    struct dp_train_params p = base("mlp", 3);
    p.fault_kind = DP_FAULT_DIVERGE;
    p.fault_worker = 2;
    p.fault_step = 6;
    p.check_replicas = 4; /* checked after steps 4, 8, ...: caught at 8 */
    struct dp_trainer *t;
    ASSERT_OK(dp_trainer_init(&t, &p));
    int rc = dp_trainer_run(t);
    dp_trainer_free(t);
    ASSERT_EQ(rc, DP_EMISMATCH);
    fprintf(stderr, "    %s\n", dp_errmsg());
    ASSERT_TRUE(strstr(dp_errmsg(), "replica of worker 2 diverged") != NULL);
    ASSERT_TRUE(strstr(dp_errmsg(), "step 8") != NULL);
}

/* A last batch smaller than the number of workers: some workers get no
 * sample at all and still take part (SyncBatchNorm included). */
static void empty_shares(const char *model) {
    require_data();
    struct dp_train_params p = base(model, 1);
    p.batch = 6;
    p.train_limit = 20; /* batches 6, 6, 6, 2: with 4 workers two get nothing */
    p.sched.base_lr = 0.01f; /* see ddp_equivalence_resnet */
    int64_t n;
    float *ref = train(&p, &n);
    p.workers = 4;
    p.check_replicas = 1;
    float *got = train(&p, &n);
    double d = rel_diff(ref, got, n);
    fprintf(stderr, "    %s, 4 workers, batches of 6 and 2: %.2e\n", model, d);
    ASSERT_TRUE(d <= 1e-5);
    free(ref), free(got);
}
TEST_T(ddp_empty_shares_mlp, 120) { empty_shares("mlp"); }
TEST_T(ddp_empty_shares_resnet, 120) { empty_shares("resnet"); }
