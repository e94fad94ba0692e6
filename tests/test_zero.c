/* ZeRO stage 1 (--zero 1; src/ddp/zero.c): each worker keeps the optimizer
 * state of its 1/P shard, and the run trains the same model as plain data
 * parallelism (the same bits under --deterministic); checkpoints keep the
 * whole-slab format, so any stage and worker count resumes them. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/comm.h"
#include "dp/ddp.h"
#include "dp/plan.h"
#include "dp/train.h"
#include "test.h"

#include "ddp_util.h"

/* The same recipe with ZeRO off and on (both reductions) at P = 1..maxP: the
 * parameters and buffers agree to 1e-6 relative.  mlp has 669706
 * parameters: shards of 223236/223235 at P = 3 and 167427/167426 at P = 4.
 * The all-reduce form sums exactly as plain does (the same buckets), so it
 * differs only through the clipping norm's summation order; the
 * reduce-scatter form also sums in another order. */
static void equivalence(struct dp_train_params p, int minP, int maxP, const char *what) {
    require_data();
    for (int P = minP; P <= maxP; P++) {
        p.dp.workers = P;
        p.dp.zero = 0, p.dp.zero_scatter = 0, p.dp.zero_gather = DP_ZERO_GATHER_AUTO;
        p.dp.check_replicas = 0;
        int64_t n0, n;
        float *ref = train(&p, &n0);
        /* --zero 1 in both reductions (one worker reduces nothing: no scatter
         * form), then --zero 2 and --zero 3, then --zero 1 with the all-gather
         * left in flight for the next forward (--zero-gather ahead), in both
         * reductions (scatter: each bucket reduce-scattered during backward) */
        for (int form = 0; form < 6; form++) {
            if ((form == 1 || form >= 4) && P == 1) continue;
            p.dp.zero = form < 2 || form >= 4 ? 1 : form, p.dp.zero_scatter = form == 1 || form == 5;
            p.dp.zero_gather = form >= 4 ? DP_ZERO_GATHER_AHEAD : DP_ZERO_GATHER_AUTO;
            p.dp.check_replicas = 1; /* the all-gather leaves every replica the same bits */
            float *got = train(&p, &n);
            ASSERT_EQ(n, n0);
            double d = rel_diff(ref, got, n);
            fprintf(stderr, "    %s P=%d --zero %d%s vs --zero 0: %.2e\n", what, P, p.dp.zero,
                    form == 0 ? " (allreduce)" : form == 1 ? " (scatter)" : form == 4 ? " (gather ahead)" : form == 5 ? " (scatter, gather ahead)" : "", d);
            ASSERT_TRUE(d <= 1e-6);
            free(got);
        }
        free(ref);
    }
}

/* AdamW with clipping (the shard-norm path) on a cosine schedule. */
TEST_T(zero_equivalence_mlp_adamw_clip, 300) {
    struct dp_train_params p = base("mlp", 1);
    p.optim.kind = DP_OPTIM_ADAMW;
    p.optim.weight_decay = 0.01f;
    p.sched.base_lr = 1e-3f;
    p.sched.kind = DP_SCHED_COSINE;
    p.sched.warmup_steps = 3;
    p.run.clip_norm = 0.5; /* below the gradient's norm: every step clips */
    p.run.max_steps = 4;
    equivalence(p, 1, 4, "mlp adamw clip");
}
/* Nesterov SGD with accumulation (the reduced sum scaled after the reduction). */
TEST_T(zero_equivalence_mlp_nesterov_accum, 300) {
    struct dp_train_params p = base("mlp", 1);
    p.optim.nesterov = 1;
    p.run.batch = 30;
    p.dp.accum = 2;
    p.run.max_steps = 4;
    equivalence(p, 3, 4, "mlp nesterov accum");
}
TEST_T(zero_equivalence_cnn, 300) {
    struct dp_train_params p = base("cnn", 1);
    p.run.max_steps = 2;
    equivalence(p, 2, 3, "cnn");
}
/* SyncBatchNorm: the buffers are compared too (lr 0.01: see test_ddp.c). */
TEST_T(zero_equivalence_resnet, 300) {
    struct dp_train_params p = base("resnet", 1);
    p.sched.base_lr = 0.01f;
    p.run.max_steps = 2;
    equivalence(p, 3, 3, "resnet");
}

/* Deterministic mode: exact sums give exact shards, so --zero 1, 2 and 3
 * are the same bits as plain deterministic training at P = 1, for P = 1..4
 * (AdamW and clipping included; stages 2 and 3 from P = 2, where they cut
 * bucket-aligned pieces). */
TEST_T(zero_deterministic_bit_identical, 300) {
    require_data();
    struct dp_train_params p = base("mlp", 1);
    p.optim.kind = DP_OPTIM_ADAMW;
    p.sched.base_lr = 1e-3f;
    p.run.clip_norm = 0.5;
    p.dp.deterministic = 1;
    p.run.max_steps = 3;
    int64_t n0;
    float *ref = train(&p, &n0);
    for (int P = 1; P <= 4; P++)
        for (int z = 1; z <= (P > 1 ? 4 : 1); z++) { /* 4: --zero 1 --zero-gather ahead */
            p.dp.workers = P;
            p.dp.zero = z == 4 ? 1 : z;
            p.dp.zero_gather = z == 4 ? DP_ZERO_GATHER_AHEAD : DP_ZERO_GATHER_AUTO;
            expect_same_bits(&p, ref, n0, z == 4 ? "deterministic, gather ahead" : "deterministic");
        }
    free(ref);
}

/* A checkpoint written by --zero 1 at P = 2 holds the whole optimizer state
 * (today's format): resumed at P = 3 --zero 0, at P = 1, and at P = 3
 * --zero 1, the run ends with the very bits of an uninterrupted plain run
 * (deterministic mode, AdamW: both moments must come back in place). */
static void checkpoint_any_stage(int save_zero, size_t unit) {
    struct dp_train_params p = base("mlp", 1);
    p.dp.zero_unit_bytes = unit; /* (every run alike: the unit fixes the bits) */
    p.optim.kind = DP_OPTIM_ADAMW;
    p.sched.base_lr = 1e-3f;
    p.dp.deterministic = 1;
    p.data.train_limit = 480; /* 8 steps */
    int64_t n0, n;
    float *ref = train(&p, &n0); /* the whole epoch, plain */
    char dir[512], ck[600];
    snprintf(dir, sizeof dir, "%s/zero", dp_test_tmpdir());
    snprintf(ck, sizeof ck, "%s/checkpoint.bin", dir);
    struct dp_train_params a = p;
    a.dp.workers = 2, a.dp.zero = save_zero, a.run.max_steps = 5, a.io.out_dir = dir;
    a.io.overwrite = 1; /* (the folder is scratch, reused for each stage) */
    struct dp_trainer *t;
    ASSERT_OK(dp_trainer_init(&t, &a));
    ASSERT_OK(dp_trainer_run(t));
    dp_trainer_free(t);
    struct dp_ckpt_header h;
    float *payload;
    ASSERT_OK(dp_ckpt_read(ck, &h, &payload));
    ASSERT_EQ(h.step, 5);
    ASSERT_EQ(h.optim_state_len, 2 * h.num_params); /* m and v of the whole slab */
    dp_free(payload);
    const int workers[3] = {3, 1, 3}, zero[3] = {0, 0, save_zero};
    for (int k = 0; k < 3; k++) {
        struct dp_train_params b = p;
        b.dp.workers = workers[k], b.dp.zero = zero[k], b.io.resume = ck;
        float *got = train(&b, &n);
        ASSERT_EQ(n, n0);
        fprintf(stderr, "    saved P=2 --zero %d%s, resumed P=%d --zero %d: %s\n", save_zero, unit ? " (a unit)" : "",
                workers[k], zero[k], memcmp(ref, got, sizeof(float) * (size_t)n) ? "differs" : "same bits as uninterrupted");
        ASSERT_TRUE(memcmp(ref, got, sizeof(float) * (size_t)n) == 0);
        free(got);
    }
    free(ref);
}
TEST_T(zero_checkpoint_any_stage_any_workers, 300) {
    require_data();
    checkpoint_any_stage(1, 0);
}
/* Stages 2 and 3: the state is gathered piece by piece into the same
 * whole-slab format (and, stage 3, the parameters materialised first). */
TEST_T(zero23_checkpoint_any_stage_any_workers, 300) {
    require_data();
    checkpoint_any_stage(2, 0);
    checkpoint_any_stage(3, 0);
    checkpoint_any_stage(3, 100 << 10); /* --zero-unit-mb 0.1: the pieces are the layers' slices' */
}

/* Compression composes with the all-reduce form (the reducer still hands
 * every worker the whole reduced gradient): --zero 1 --compress bf16 trains
 * the model of --compress bf16. */
TEST_T(zero_with_bf16_compression, 300) {
    require_data();
    struct dp_train_params p = base("mlp", 2);
    p.run.max_steps = 6;
    p.dp.compress.kind = DP_COMPRESS_BF16;
    int64_t n0, n;
    float *ref = train(&p, &n0);
    p.dp.zero = 1;
    float *got = train(&p, &n);
    double d = rel_diff(ref, got, n);
    fprintf(stderr, "    bf16 --zero 1 vs --zero 0: %.2e\n", d);
    ASSERT_TRUE(d <= 1e-6);
    free(ref), free(got);
}

/* Builds and runs a trainer on p with fault f (NULL: none); returns the run's status. */
static int run_status(const struct dp_train_params *p, const struct dp_fault *f) {
    struct dp_trainer *t;
    ASSERT_OK(init_faulty(&t, p, f));
    int rc = dp_trainer_run(t);
    dp_trainer_free(t);
    return rc;
}

/* --check-replicas still catches a replica that drifts after the all-gather. */
TEST_T(zero_check_replicas_names_diverged_worker, 120) {
    require_data();
    /* stage 2 too: its replicas hold whole parameters after the all-gathers (stage 3's do not:
     * its check gathers the pieces first, so there is no replica to drift) */
    for (int z = 1; z <= 3; z++) { /* 3: --zero 1 with the gather ahead (the fault lands after it) */
        struct dp_train_params p = base("mlp", 3);
        p.dp.zero = z == 3 ? 1 : z;
        p.dp.zero_gather = z == 3 ? DP_ZERO_GATHER_AHEAD : DP_ZERO_GATHER_AUTO;
        struct dp_fault f = {DP_FAULT_DIVERGE, 1, 2};
        p.dp.check_replicas = 3;
        ASSERT_EQ(run_status(&p, &f), DP_EMISMATCH);
        ASSERT_TRUE(strstr(dp_errmsg(), "replica of worker 1 diverged") != NULL);
    }
}

/* The memory win, counted by the allocator: with AdamW (two moments of 4
 * bytes) the P workers of --zero 1 hold 8 (n - n / P) x P bytes of optimizer
 * state less than plain workers (n = parameters). */
static size_t live_bytes, peak_bytes; /* (atomic: the workers allocate from their threads) */
static void *count_alloc(size_t size, void *user) {
    (void)user;
    char *p = NULL;
    if (posix_memalign((void **)&p, 64, size + 64) != 0) return NULL;
    memcpy(p, &size, sizeof size);
    size_t live = __atomic_add_fetch(&live_bytes, size, __ATOMIC_RELAXED);
    size_t peak = __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED);
    while (live > peak && !__atomic_compare_exchange_n(&peak_bytes, &peak, live, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return p + 64;
}
static void count_free(void *q, void *user) {
    (void)user;
    char *p = (char *)q - 64;
    size_t size;
    memcpy(&size, p, sizeof size);
    __atomic_sub_fetch(&live_bytes, size, __ATOMIC_RELAXED);
    free(p);
}
/* The bytes a trainer holds after dp_trainer_init, counted by the hook;
 * with peak, also the most it held during the init. */
static size_t live_after_init(struct dp_train_params p, size_t *peak) {
    struct dp_allocator a = {count_alloc, count_free, NULL};
    dp_set_allocator(&a);
    size_t before = __atomic_load_n(&live_bytes, __ATOMIC_RELAXED);
    __atomic_store_n(&peak_bytes, before, __ATOMIC_RELAXED);
    struct dp_trainer *t;
    ASSERT_OK(dp_trainer_init(&t, &p));
    size_t live = __atomic_load_n(&live_bytes, __ATOMIC_RELAXED) - before;
    if (peak) *peak = __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED) - before;
    dp_trainer_free(t);
    dp_set_allocator(NULL);
    return live;
}
TEST_T(zero_optimizer_state_is_sharded, 120) {
    require_data();
    struct dp_train_params p = base("mlp", 4);
    p.optim.kind = DP_OPTIM_ADAMW;
    size_t plain = live_after_init(p, NULL);
    p.dp.zero = 1;
    size_t zero = live_after_init(p, NULL);
    double n = 669706, saved = 8.0 * (n - n / 4) * 4;
    fprintf(stderr, "    live bytes after init, P=4 adamw: --zero 0 %zu, --zero 1 %zu (saved %.0f, expected %.0f)\n",
            plain, zero, (double)plain - (double)zero, saved);
    ASSERT_TRUE(fabs(((double)plain - (double)zero) - saved) < 1024.0); /* allocation rounding only */
}

TEST(zero_refusals_one_line) {
    require_data();
    struct dp_train_params p = base("mlp", 2);
    struct dp_trainer *t;
    p.dp.zero = 4;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "--zero must be in 0..3");
    p.dp.zero = 1;
    p.dp.async = 1;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "--mode async");
    p.dp.async = 0;
    p.dp.backup = 1, p.dp.backup_workers = 1;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_ENOTSUP, "--backup-workers");
    p.dp.backup = 0, p.dp.backup_workers = 0;
    p.dp.zero_scatter = 1;
    p.dp.compress.kind = DP_COMPRESS_BF16;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_ENOTSUP, "--zero-reduce allreduce");
    /* stages 2 and 3: each bucket is reduce-scattered */
    for (int z = 2; z <= 3; z++) {
        p.dp.zero = z;
        p.dp.zero_scatter = 0;
        ASSERT_ERR(dp_trainer_init(&t, &p), DP_ENOTSUP, "use --zero 1");
        p.dp.compress.kind = DP_COMPRESS_NONE;
        p.dp.zero_scatter = 1;
        ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "--zero-reduce is --zero 1's option");
        p.dp.compress.kind = DP_COMPRESS_BF16;
    }
    /* the all-gather left in flight: stage 1 with the all-reduce only */
    p.dp.compress.kind = DP_COMPRESS_NONE, p.dp.zero_scatter = 0; /* (p.dp.zero is 3) */
    p.dp.zero_gather = DP_ZERO_GATHER_AHEAD;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "--zero-gather is --zero 1's option (this run is --zero 3)");
    p.dp.zero = 1, p.dp.zero_gather = 7;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "zero_gather must be auto, step or ahead");
}

/* The non-finite check comes from the all-reduced shard sums of squares
 * (with --zero-reduce scatter only the shard holds the sum): a NaN in one
 * worker's input stops the run at that step, naming the worker. */
static void nonfinite_named(int zero, int scatter) {
    struct dp_train_params p = base("mlp", 3);
    p.dp.zero = zero, p.dp.zero_scatter = scatter;
    struct dp_fault f = {DP_FAULT_NAN, 2, 3};
    ASSERT_EQ(run_status(&p, &f), DP_ENONFINITE);
    fprintf(stderr, "    --zero %d: %s\n", zero, dp_errmsg());
    ASSERT_TRUE(strstr(dp_errmsg(), "step 3 ") != NULL);
    ASSERT_TRUE(strstr(dp_errmsg(), "worker 2") != NULL);
    /* with --skip-nonfinite every worker skips that step alike: the run ends, replicas equal */
    p.dp.skip_nonfinite = 1;
    p.dp.check_replicas = 1;
    p.run.max_steps = 5;
    ASSERT_OK(run_status(&p, &f));
}
TEST_T(zero_nonfinite_gradient_named, 120) {
    require_data();
    nonfinite_named(1, 1);
}
/* stages 2 and 3: the same check from gshard's sums of squares */
TEST_T(zero23_nonfinite_gradient_named, 120) {
    require_data();
    nonfinite_named(2, 0);
    nonfinite_named(3, 0);
}

/* Stages 2 and 3 give memory back for real: after each step, worker 0's
 * resident model state (dp_trainer_live_bytes: mincore over its gradient and
 * parameter slabs, plus its shards and optimizer state) is within the
 * formula, AdamW: 4 psi + 12 psi / P (stage 2: the parameters stay whole) and
 * 16 psi / P (stage 3), plus 64 KiB (mincore's pages at the blocks' ends):
 * the released slabs are whole 2 MiB units (dp_slab_map), so no partial unit
 * stays at their ends (with them, 2.3 MB per slab did); plain keeps 16 psi.  A wide mlp (psi = 5824522, 23 MB slabs) so that the units are
 * small beside the slab: with the madvise of either slab left out, the count
 * is 4 psi = 23 MB more and fails. */
struct live_probe {
    struct dp_trainer *t;
    int64_t max, steps;
};
static void live_on_event(void *arg, const struct dp_event *ev) {
    struct live_probe *lp = arg;
    if (ev->kind != DP_EVENT_STEP) return;
    int64_t b = dp_trainer_live_bytes(lp->t, 0);
    ASSERT_TRUE(b >= 0);
    if (b > lp->max) lp->max = b;
    lp->steps++;
}
TEST_T(zero23_memory_given_back, 120) {
    require_data();
    float *ref = NULL;
    for (int z = 0; z <= 3; z++) {
        struct dp_train_params p = base("mlp:784,2048,2048,10", 4);
        p.optim.kind = DP_OPTIM_ADAMW;
        p.sched.base_lr = 1e-3f;
        p.dp.zero = z;
        p.run.max_steps = 2;
        struct live_probe lp = {0};
        p.io.on_event = live_on_event, p.io.event_arg = &lp;
        ASSERT_OK(dp_trainer_init(&lp.t, &p));
        ASSERT_OK(dp_trainer_run(lp.t));
        /* and the pages given back mid-step were not needed: the same model as plain */
        const struct dp_replica *r = dp_trainer_replica(lp.t);
        int64_t n = dp_trainer_model(lp.t)->num_params;
        if (!ref) {
            ref = malloc(sizeof(float) * (size_t)n);
            memcpy(ref, r->params, sizeof(float) * (size_t)n);
        }
        double d = rel_diff(ref, r->params, n);
        dp_trainer_free(lp.t);
        ASSERT_TRUE(d <= 1e-6);
        double psi = 5824522, P = 4, f = z == 0 ? 16 * psi : z == 1 ? 8 * psi + 8 * psi / P
                                        : z == 2 ? 4 * psi + 12 * psi / P : 16 * psi / P;
        double slack = 65536;
        fprintf(stderr, "    P=4 --zero %d: live %lld bytes after a step, formula %.0f (%.3f of it); vs plain %.2e\n",
                z, (long long)lp.max, f, (double)lp.max / f, d);
        ASSERT_EQ(lp.steps, 2);
        ASSERT_TRUE((double)lp.max <= f + slack);
        ASSERT_TRUE((double)lp.max >= 0.95 * f); /* the count sees what is there */
    }
    free(ref);
}

/* Stage 3 gathers no range twice in a row: forward's range 1 is kept for
 * backward, whose first prefetch it is, instead of being given back as
 * forward enters range 0 and gathered again a layer later.  mlp (buckets of
 * 1 MiB: fc3, fc2, fc1; a slab of 2.7 MB, two 2 MiB units, fc2 across the
 * boundary) at P = 2: a step gathers forward's 3 ranges and backward's 1
 * (range 2; 0 and 1 are held), 4 = 2 x 3 - 2, and no unit of the parameter
 * slab is given back and faulted in again within the pass (giving back
 * range 1 took unit 0, which fc1 shares with fc2, and backward wrote it
 * again: 5 gathers and 1 refault a step). */
struct count_probe {
    struct dp_trainer *t;
    int n;
    struct dp_zero_counts c[4];
};
static void count_on_event(void *arg, const struct dp_event *ev) {
    struct count_probe *cp = arg;
    if (ev->kind == DP_EVENT_STEP && cp->n < 4) ASSERT_EQ(dp_trainer_zero_counts(cp->t, 0, &cp->c[cp->n++]), 0);
}
TEST_T(zero3_backward_regathers_nothing_forward_held, 120) {
    require_data();
    struct dp_train_params p = base("mlp", 2);
    p.dp.zero = 3;
    p.dp.first_bucket_bytes = p.dp.bucket_cap_bytes = 1u << 20;
    p.run.max_steps = 4;
    struct count_probe cp = {0};
    p.io.on_event = count_on_event, p.io.event_arg = &cp;
    ASSERT_OK(dp_trainer_init(&cp.t, &p));
    ASSERT_OK(dp_trainer_run(cp.t));
    ASSERT_EQ(cp.n, 4);
    for (int s = 1; s < 4; s++) {
        int64_t g = cp.c[s].gathers - cp.c[s - 1].gathers, f = cp.c[s].refaults - cp.c[s - 1].refaults;
        fprintf(stderr, "    step %d: %lld gathers, %lld units faulted back\n", s + 1, (long long)g, (long long)f);
        ASSERT_EQ(g, 4);
        ASSERT_EQ(f, 0);
    }
    dp_trainer_free(cp.t);
}

/* Stage 2's gradient in flight stays two buckets (dp_reducer_grad_ready
 * waits, before backward writes on, for every started bucket but the last),
 * even for a worker far ahead of its peer: worker 1 sleeps 20 ms at the
 * start of every step (DP_FAULT_SLOW), so worker 0 runs its whole backward
 * before worker 1 starts any reduce-scatter.  Each layer a bucket (4 KiB
 * caps): fc1 100480 floats, fc2..fc4 16512, fc5 1290; the two adjacent
 * buckets hold at most 116992 floats (fc1 + fc2, dp_trainer_inflight_bytes),
 * all five 151306, which is what worker 0 held without the wait. */
TEST_T(zero2_gradient_in_flight_two_buckets, 120) {
    require_data();
    struct dp_train_params p = base("mlp:784,128,128,128,128,10", 2);
    p.dp.zero = 2;
    p.dp.bucket_cap_bytes = p.dp.first_bucket_bytes = 4096;
    p.run.max_steps = 3;
    struct dp_fault f = {DP_FAULT_SLOW, 1, 0};
    struct dp_trainer *t;
    ASSERT_OK(init_faulty(&t, &p, &f));
    ASSERT_OK(dp_trainer_run(t));
    int64_t pair = dp_trainer_inflight_bytes(t);
    ASSERT_EQ(pair, 4 * 116992);
    /* the plan's memory figure counts the same units (dptrain plan: "units in flight") */
    const int64_t layers[5] = {100480, 16512, 16512, 16512, 1290};
    struct dp_plan_params pp = dp_plan_default_params();
    pp.layers = layers, pp.nlayers = 5, pp.params = 151306, pp.batch = 2;
    pp.bucket_cap_bytes = pp.first_bucket_bytes = 4096;
    memset(&pp.net, 0, sizeof pp.net);
    pp.net.workers = 2, pp.net.shards = 1;
    dp_plan_net_link(&pp.net, 0, 1e9);
    struct dp_plan_result pr;
    ASSERT_OK(dp_plan_run(&pp, &pr));
    ASSERT_NEAR(pr.mem_inflight[2], (double)pair, 1e-9);
    ASSERT_NEAR(pr.mem_inflight[3], 2.0 * (double)pair + 2.0 * (double)DP_SLAB_UNIT, 1e-9);
    dp_plan_result_free(&pr);
    for (int r = 0; r < 2; r++) {
        struct dp_zero_counts c;
        ASSERT_EQ(dp_trainer_zero_counts(t, r, &c), 0);
        fprintf(stderr, "    worker %d: gradient in flight at most %lld bytes (two buckets: %lld)\n", r,
                (long long)c.grad_hw_bytes, (long long)pair);
        ASSERT_TRUE(c.grad_hw_bytes > 0 && c.grad_hw_bytes <= pair);
    }
    dp_trainer_free(t);
}

/* A small model cut into several buckets (4 KiB caps: fc1 alone, the
 * others together; uneven pieces), P = 3, --accum 2: stages 2 and 3 (and 1)
 * with their per-bucket reduce-scatters, prefetched gathers and releases
 * give plain's model.  Short enough for the TSan build (the compute thread
 * zeroes and gives back buckets while the progress thread reduces the next
 * ones). */
TEST_T(zero23_buckets_small_model, 120) {
    require_data();
    struct dp_train_params p = base("mlp:784,32,16,10", 3);
    p.dp.bucket_cap_bytes = 4096, p.dp.first_bucket_bytes = 4096;
    p.run.max_steps = 3;
    p.data.train_limit = 360;
    p.dp.accum = 2; /* each micro-batch reduce-scattered, the second added into gshard */
    equivalence(p, 3, 3, "mlp:784,32,16,10, 4 KiB buckets, accum 2");
}

/* A ZeRO-3 worker draws only its pieces of the initial parameters
 * (dp_model_init_slice): any slice, across tensor boundaries and of the
 * buffer slab too, is the bits of the same elements of the whole
 * initialisation (mlp: uniform weights; resnet: constant BN weights and
 * running variances). */
TEST(zero3_init_slice_is_the_whole_init) {
    const char *specs[2] = {"mlp", "resnet"};
    for (int s = 0; s < 2; s++) {
        struct dp_model *m;
        ASSERT_OK(dp_model_from_spec(&m, specs[s], 1, 28, 28));
        struct dp_replica r;
        ASSERT_OK(dp_replica_init(&r, m, 1));
        dp_model_init_params(m, &r, 7);
        for (int buf = 0; buf < 2; buf++) {
            int64_t n = buf ? m->num_buffers : m->num_params;
            const float *whole = buf ? r.buffers : r.params;
            if (n < 5) continue; /* (mlp has no buffers) */
            float *got = malloc(sizeof(float) * (size_t)(n + 1));
            const int64_t cuts[4][2] = {{0, n}, {1, n / 3}, {n / 3, n / 3 + 1}, {n - n / 5, n / 5}};
            for (int c = 0; c < 4; c++) {
                memset(got, 0xff, sizeof(float) * (size_t)(n + 1));
                dp_model_init_slice(m, buf, got, cuts[c][0], cuts[c][1], 7);
                ASSERT_TRUE(memcmp(got, whole + cuts[c][0], sizeof(float) * (size_t)cuts[c][1]) == 0);
                uint32_t past;
                memcpy(&past, got + cuts[c][1], sizeof past);
                ASSERT_EQ(past, 0xffffffffu); /* nothing written past the slice */
            }
            free(got);
        }
        dp_replica_free(&r);
        dp_model_free(m);
    }
}

/* Start-up without whole replicas: right after dp_trainer_init, a stage-2
 * worker holds its parameters, its gradient shard and its optimizer state
 * but no page of its gradient slab, and a stage-3 worker its pieces and
 * their state only (16 psi / P with AdamW): the slabs are mapped, never
 * touched as a whole, and the initial pieces are drawn from the seed.  (A
 * replica allocated and touched as before holds 8 psi more.)  The run then
 * trains plain's model (the equivalence tests), from the same start. */
TEST_T(zero23_startup_holds_no_replica, 120) {
    require_data();
    for (int P = 2; P <= 4; P++)
        for (int z = 2; z <= 3; z++) {
            struct dp_train_params p = base("mlp", P);
            p.optim.kind = DP_OPTIM_ADAMW;
            p.dp.zero = z;
            struct dp_trainer *t;
            ASSERT_OK(dp_trainer_init(&t, &p));
            double psi = (double)dp_trainer_model(t)->num_params;
            double f = z == 2 ? 4 * psi + 12 * psi / P : 16 * psi / P;
            for (int r = 0; r < P; r++) {
                int64_t b = dp_trainer_live_bytes(t, r);
                fprintf(stderr, "    P=%d --zero %d worker %d: %lld bytes after init, formula %.0f\n", P, z, r,
                        (long long)b, f);
                /* uneven pieces; mincore's pages at the ends of the blocks it counts */
                ASSERT_TRUE(b >= 0 && (double)b <= f + 4 * P + 16384.0);
            }
            dp_trainer_free(t);
        }
}

/* The end of an epoch at stage 3 builds no whole replica where none is
 * read: at the first epoch's event (no output folder: no checkpoint, no
 * metrics hash) every worker's slabs are given back, the evaluation having
 * gathered layer by layer; after the last epoch only worker 0 holds the
 * whole parameters (the run's result, dp_trainer_replica), the others their
 * pieces and state, and every worker's gradient shard is given back, so the
 * workers together hold no more than the formula's P x 16 psi / P.  The
 * evaluation gives plain's accuracy and loss. */
struct epoch_probe {
    struct dp_trainer *t;
    int P, epochs;
    int64_t live[4];
    double acc[2], loss[2];
};
static void epoch_on_event(void *arg, const struct dp_event *ev) {
    struct epoch_probe *ep = arg;
    if (ev->kind != DP_EVENT_EPOCH) return;
    if (ep->epochs < 2) ep->acc[ep->epochs] = ev->test_acc, ep->loss[ep->epochs] = ev->test_loss;
    if (ep->epochs++ == 0)
        for (int r = 0; r < ep->P && ep->t; r++) ep->live[r] = dp_trainer_live_bytes(ep->t, r);
}
TEST_T(zero3_epoch_end_holds_no_replica, 120) {
    require_data();
    struct dp_train_params p = base("mlp", 3);
    p.optim.kind = DP_OPTIM_ADAMW;
    p.sched.base_lr = 1e-3f;
    p.data.train_limit = 240, p.data.test_limit = 600; /* 4 steps an epoch; 3 evaluation chunks of 256, 256, 88 */
    p.run.epochs = 2;
    struct epoch_probe ref = {0};
    p.io.on_event = epoch_on_event, p.io.event_arg = &ref;
    int64_t n;
    float *want = train(&p, &n);
    struct epoch_probe ep = {.P = 3};
    p.dp.zero = 3;
    p.io.on_event = epoch_on_event, p.io.event_arg = &ep;
    ASSERT_OK(dp_trainer_init(&ep.t, &p));
    ASSERT_OK(dp_trainer_run(ep.t));
    const struct dp_model *m = dp_trainer_model(ep.t);
    double psi = (double)m->num_params, shard = 16 * psi / 3 + 12, total = 0;
    ASSERT_EQ(ep.epochs, 2);
    for (int r = 0; r < 3; r++) {
        int64_t after = dp_trainer_live_bytes(ep.t, r);
        fprintf(stderr, "    worker %d: %lld bytes at the first epoch's end, %lld after the run (shard state %.0f)\n",
                r, (long long)ep.live[r], (long long)after, shard);
        ASSERT_TRUE(ep.live[r] > 0 && (double)ep.live[r] <= shard + 8192); /* (gshard's end pages) */
        /* after: pieces and state (12 psi / P); the gradient shard (4 psi / P) given back but for its
         * partial pages; worker 0 also the whole slab */
        double want_r = 12 * psi / 3 + (r == 0 ? 4 * psi : 0);
        ASSERT_TRUE((double)after >= want_r && (double)after <= want_r + 16384);
        total += (double)after;
    }
    /* the formula's P x 16 psi / P (and mincore's end pages): the result took the gradient shards' place */
    ASSERT_TRUE(total <= 16 * psi + 3 * 16384);
    /* worker 0's slab is the result: plain's model, and the evaluations were plain's */
    ASSERT_TRUE(rel_diff(want, dp_trainer_replica(ep.t)->params, m->num_params) <= 1e-6);
    for (int e = 0; e < 2; e++) {
        fprintf(stderr, "    epoch %d: test acc %.6f loss %.6f (plain %.6f %.6f)\n", e + 1, ep.acc[e], ep.loss[e],
                ref.acc[e], ref.loss[e]);
        ASSERT_TRUE(fabs(ep.acc[e] - ref.acc[e]) <= 2.0 / 600 && fabs(ep.loss[e] - ref.loss[e]) <= 1e-5 * ref.loss[e]);
    }
    dp_trainer_free(ep.t);
    free(want);
}

/* With an output folder, the same end of an epoch still builds no whole
 * replica: the metrics' parameter hash is folded range by range as the
 * ranges pass (and is the whole result's hash at the end), and the
 * checkpoint is written from the pieces.  So worker 0, which writes both,
 * holds its shard state only at the first epoch's event (measured from its
 * own thread: the others may still be giving back their last range); it
 * used to keep the whole parameters for the hash and the checkpoint. */
TEST_T(zero3_epoch_end_with_outputs_holds_no_replica, 120) {
    require_data();
    struct dp_train_params p = base("mlp", 3);
    p.optim.kind = DP_OPTIM_ADAMW;
    p.sched.base_lr = 1e-3f;
    p.data.train_limit = 240, p.data.test_limit = 60;
    p.run.epochs = 2;
    p.dp.zero = 3;
    struct epoch_probe ep = {.P = 1};
    p.io.on_event = epoch_on_event, p.io.event_arg = &ep;
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/z3epoch", dp_test_tmpdir());
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    p.io.out_dir = dir;
    ASSERT_OK(dp_trainer_init(&ep.t, &p));
    ASSERT_OK(dp_trainer_run(ep.t));
    double shard = 16 * (double)dp_trainer_model(ep.t)->num_params / 3 + 12;
    fprintf(stderr, "    worker 0: %lld bytes at the first epoch's end (shard state %.0f)\n", (long long)ep.live[0],
            shard);
    ASSERT_TRUE(ep.live[0] > 0 && (double)ep.live[0] <= shard + 8192);
    /* the last epoch record's hash, folded from the ranges, is the whole result's */
    FILE *f = fopen(path, "r");
    ASSERT_TRUE(f != NULL);
    char line[16384], want_hash[64], *at;
    int records = 0;
    snprintf(want_hash, sizeof want_hash, "\"param_hash\": \"%016llx\"",
             (unsigned long long)dp_trainer_param_hash(ep.t));
    while (fgets(line, sizeof line, f))
        if (strstr(line, "\"kind\": \"epoch\"") && (at = strstr(line, "\"param_hash\"")) != NULL) {
            records++;
            if (records == 2) ASSERT_TRUE(strncmp(at, want_hash, strlen(want_hash)) == 0);
        }
    fclose(f);
    ASSERT_EQ(records, 2);
    dp_trainer_free(ep.t);
}

/* Runs p with an output folder under the test's tmpdir and returns its checkpoint's bytes. */
static char *checkpoint_bytes(struct dp_train_params p, const char *name, size_t *n) {
    char dir[512], ck[600];
    snprintf(dir, sizeof dir, "%s/%s", dp_test_tmpdir(), name);
    snprintf(ck, sizeof ck, "%s/checkpoint.bin", dir);
    p.io.out_dir = dir;
    p.io.overwrite = 1; /* (a scratch folder, one per call's name, reused) */
    ASSERT_OK(run_status(&p, NULL));
    return read_whole_file(ck, n);
}

/* A checkpoint written from the shards (zero_stream: rank 0 reads every
 * worker's pieces in place, range by range) is byte for byte the file a
 * plain run writes from its whole state, the format the whole-state gather
 * used to produce: deterministic mode gives the same parameters and state
 * bits, so the two files are equal, header (CRCs, parameter hash) included.
 * Stages 1-3, P = 2..4 (mlp:784,48,10 has 38170 parameters: uneven shards
 * at P = 3 and 4; stages 2 and 3 with ten buckets of 16 KiB), momentum SGD
 * and AdamW. */
TEST_T(zero_checkpoint_streamed_equals_whole_save, 300) {
    require_data();
    for (int adam = 0; adam < 2; adam++) {
        struct dp_train_params p = base("mlp:784,48,10", 1);
        if (adam) p.optim.kind = DP_OPTIM_ADAMW, p.sched.base_lr = 1e-3f;
        p.dp.deterministic = 1;
        p.run.max_steps = 2;
        p.data.train_limit = 240, p.data.test_limit = 60;
        p.dp.bucket_cap_bytes = 16 << 10, p.dp.first_bucket_bytes = 16 << 10;
        size_t n0, n;
        char *ref = checkpoint_bytes(p, "zplain", &n0);
        for (int P = 2; P <= 4; P++)
            for (int z = 1; z <= 3; z++) {
                p.dp.workers = P, p.dp.zero = z;
                char *got = checkpoint_bytes(p, "zstream", &n);
                /* the header and payload (the sections after them hold each folder's own
                 * metrics.jsonl length, DPMETRIC) */
                struct dp_ckpt_header h0;
                memcpy(&h0, ref, n0 >= sizeof h0 ? sizeof h0 : 0);
                size_t body = sizeof h0 + (size_t)h0.payload_size;
                int same = n >= body && n0 >= body && memcmp(ref, got, body) == 0;
                fprintf(stderr, "    %s P=%d --zero %d: %zu bytes, %s\n", adam ? "adamw" : "momentum", P, z, n,
                        same ? "the same bytes as plain" : "differs");
                ASSERT_TRUE(same);
                free(got);
                p.dp.workers = 1, p.dp.zero = 0;
            }
        free(ref);
    }
}

/* The save holds no whole state: after the last step (whose event resets
 * the allocator's high-water mark to the live bytes), the --max-steps
 * checkpoint of a P = 4 AdamW run allocates less than an eighth of the
 * whole optimizer state (8 psi bytes), at every stage: rank 0 writes the
 * other workers' pieces from where they lie.  (Gathering the state into one
 * buffer first, as the save used to, allocates the whole 8 psi.) */
static size_t live_at_step;
static void peak_from_step(void *arg, const struct dp_event *ev) {
    (void)arg;
    if (ev->kind != DP_EVENT_STEP) return;
    live_at_step = __atomic_load_n(&live_bytes, __ATOMIC_RELAXED);
    __atomic_store_n(&peak_bytes, live_at_step, __ATOMIC_RELAXED);
}
TEST_T(zero_checkpoint_save_holds_no_whole_state, 120) {
    require_data();
    for (int z = 1; z <= 3; z++) {
        struct dp_train_params p = base("mlp", 4);
        p.optim.kind = DP_OPTIM_ADAMW;
        p.sched.base_lr = 1e-3f;
        p.dp.zero = z;
        p.run.max_steps = 2, p.data.train_limit = 480, p.data.test_limit = 60;
        p.io.on_event = peak_from_step;
        char dir[512];
        snprintf(dir, sizeof dir, "%s/zmem", dp_test_tmpdir());
        p.io.out_dir = dir;
        p.io.overwrite = 1; /* (a scratch folder, reused for each worker count) */
        struct dp_allocator a = {count_alloc, count_free, NULL};
        dp_set_allocator(&a);
        struct dp_trainer *t;
        ASSERT_OK(dp_trainer_init(&t, &p));
        ASSERT_OK(dp_trainer_run(t));
        double state = 8.0 * (double)dp_trainer_model(t)->num_params;
        double extra = (double)peak_bytes - (double)live_at_step;
        dp_trainer_free(t);
        dp_set_allocator(NULL);
        fprintf(stderr, "    P=4 --zero %d: the save allocated %.0f bytes at its peak (whole state %.0f)\n", z, extra,
                state);
        ASSERT_TRUE(extra < state / 8);
    }
}

/* The resume holds no whole payload either: the allocator's peak during
 * dp_trainer_init with --resume is within a quarter of the payload (the
 * reader's 1 MiB block) of the same init without it, at P = 4 with AdamW
 * at every stage (plain too: its workers read the whole state, each into its
 * own); reading the whole file into memory first, as the resume used to,
 * adds the payload (12 psi bytes).  The resumed runs themselves are checked
 * by zero_checkpoint_any_stage_any_workers. */
TEST_T(zero_resume_reads_pieces_not_the_whole_file, 120) {
    require_data();
    struct dp_train_params p = base("mlp", 4);
    p.optim.kind = DP_OPTIM_ADAMW;
    p.sched.base_lr = 1e-3f;
    p.run.max_steps = 1, p.data.train_limit = 240, p.data.test_limit = 60;
    char dir[512], ck[600];
    snprintf(dir, sizeof dir, "%s/zres", dp_test_tmpdir());
    snprintf(ck, sizeof ck, "%s/checkpoint.bin", dir);
    p.io.out_dir = dir;
    ASSERT_OK(run_status(&p, NULL));
    p.io.out_dir = NULL, p.run.max_steps = 0;
    struct dp_ckpt_header h;
    ASSERT_OK(dp_ckpt_read_header(ck, &h));
    for (int z = 0; z <= 3; z++) {
        p.dp.zero = z;
        size_t fresh, resumed;
        p.io.resume = NULL;
        live_after_init(p, &fresh);
        p.io.resume = ck;
        live_after_init(p, &resumed);
        double extra = (double)resumed - (double)fresh;
        fprintf(stderr, "    P=4 --zero %d: init's peak %zu bytes, %zu with --resume (%.0f more; payload %llu)\n", z,
                fresh, resumed, extra, (unsigned long long)h.payload_size);
        ASSERT_TRUE(extra < (double)h.payload_size / 4);
    }
}

/* Stage 1 ahead (src/ddp/zero.c "Ahead"): the update's all-gather is issued
 * range by range and left in flight; forward's layer hook waits only for
 * the ranges its layer reads, and dp_zero_settle for the rest.  Two thread
 * ranks, three buckets of a 1000-float slab (b[0] the highest), momentum
 * SGD on the same reduced gradient: after the step every range's gather is
 * still pending; a layer in the lowest range waits for that one alone; after
 * settling, each rank's slab is the bits of a plain whole-slab step. */
#define AHEAD_N 1000
static struct dp_comm_world *ahead_world;
static float ahead_out[2][AHEAD_N];

static void *ahead_rank(void *arg) {
    int r = (int)(intptr_t)arg;
    struct dp_comm *c;
    ASSERT_OK(dp_comm_thread_init(&c, ahead_world, r));
    struct dp_optim_params op = dp_optim_default_params();
    op.momentum = 0.9f;
    float *params = dp_malloc_big(sizeof(float) * AHEAD_N), *grads = dp_malloc_big(sizeof(float) * AHEAD_N);
    ASSERT_TRUE(params && grads);
    for (int i = 0; i < AHEAD_N; i++) params[i] = 1.0f + 0.001f * (float)i, grads[i] = 0.01f * (float)(i % 37);
    struct dp_bucket b[3] = {{.off = 600, .count = 400}, {.off = 250, .count = 350}, {.off = 0, .count = 250}};
    struct dp_zero z;
    struct dp_optim o;
    ASSERT_OK(dp_zero_init(&z, c, AHEAD_N, 1, &op));
    z.ahead = 1;
    ASSERT_OK(dp_zero_plan(&z, b, 3, params, grads));
    ASSERT_EQ(z.npieces, 3);
    ASSERT_TRUE(z.ahead && !z.sharded);
    ASSERT_OK(dp_optim_init(&o, &op, z.len));
    ASSERT_OK(dp_zero_step(&z, &o, params, grads, 0.1f, 0.0, 0.0));
    for (int k = 0; k < 3; k++) ASSERT_TRUE(z.greq[k] != NULL); /* issued, none waited for */
    struct dp_layer l = {.param_off = 10, .param_count = 200}; /* in range 2 = [0, 250) */
    ASSERT_OK(dp_zero_layer_begin(&z, DP_PHASE_FORWARD, 0, &l));
    ASSERT_TRUE(z.greq[2] == NULL && z.greq[1] != NULL && z.greq[0] != NULL);
    ASSERT_OK(dp_zero_settle(&z));
    for (int k = 0; k < 3; k++) ASSERT_TRUE(z.greq[k] == NULL);
    memcpy(ahead_out[r], params, sizeof ahead_out[r]);
    dp_optim_free(&o);
    dp_zero_free(&z);
    dp_comm_free(c);
    dp_free(params), dp_free(grads);
    return NULL;
}

TEST(zero1_ahead_gather_waits_per_layer) {
    struct dp_comm_params cp = dp_comm_default_params();
    ASSERT_OK(dp_comm_thread_world_init(&ahead_world, 2, &cp));
    pthread_t th[2];
    for (int r = 0; r < 2; r++) ASSERT_EQ(pthread_create(&th[r], NULL, ahead_rank, (void *)(intptr_t)r), 0);
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    dp_comm_thread_world_free(ahead_world);
    /* the plain step on the whole slab */
    struct dp_optim_params op = dp_optim_default_params();
    op.momentum = 0.9f;
    float params[AHEAD_N], grads[AHEAD_N];
    for (int i = 0; i < AHEAD_N; i++) params[i] = 1.0f + 0.001f * (float)i, grads[i] = 0.01f * (float)(i % 37);
    struct dp_optim o;
    ASSERT_OK(dp_optim_init(&o, &op, AHEAD_N));
    ASSERT_OK(dp_optim_step(&o, params, grads, AHEAD_N, 0.1f));
    dp_optim_free(&o);
    for (int r = 0; r < 2; r++) ASSERT_TRUE(memcmp(ahead_out[r], params, sizeof params) == 0);
}

/* ---- --zero-unit-mb: layers larger than the unit in slices of output features ---------- */

/* The plan's ZeRO-2 figure in flight for model m under unit (dptrain plan's way: the cut
 * layers' ranges from dp_layer_ranges), P = 2. */
static double plan_inflight2(struct dp_model *m, size_t unit) {
    dp_model_set_unit(m, unit);
    int64_t layers[64], ranges[256];
    int nr[64], at = 0;
    for (int i = 0; i < m->nlayers; i++) {
        const struct dp_layer *l = m->layers[i];
        layers[i] = l->param_count;
        nr[i] = l->slice_rows > 0 || l->parts ? dp_layer_ranges(l, NULL, ranges + at, 256 - at) : 0;
        at += nr[i];
    }
    struct dp_plan_params pp = dp_plan_default_params();
    pp.layers = layers, pp.nlayers = m->nlayers, pp.params = m->num_params, pp.batch = 2;
    pp.unit_bytes = unit, pp.unit_nranges = nr, pp.unit_ranges = ranges;
    pp.net.workers = 2;
    struct dp_plan_result pr;
    ASSERT_OK(dp_plan_run(&pp, &pr));
    double v = pr.mem_inflight[2];
    dp_plan_result_free(&pr);
    return v;
}
/* The reducer's largest two adjacent buckets under unit, in bytes (ZeRO 2's units in flight). */
static int64_t reducer_pair_bytes(struct dp_model *m, size_t unit) {
    dp_model_set_unit(m, unit);
    struct dp_reducer_params rp = dp_reducer_default_params();
    rp.unit_bytes = unit;
    struct dp_reducer r;
    ASSERT_OK(dp_reducer_init(&r, m, NULL, NULL, &rp));
    int64_t pair = r.nb ? r.b[0].count : 0;
    for (int k = 0; k + 1 < r.nb; k++)
        if (r.b[k].count + r.b[k + 1].count > pair) pair = r.b[k].count + r.b[k + 1].count;
    dp_reducer_free(&r);
    return 4 * pair;
}

/* The model's slices and the reducer's ranges: with a 1 MiB unit, mlp:784,2048,2048,10's fc1
 * (2048 x 784 weights, 6.4 MB; 334 rows fit the unit) runs in 7 equal slices of 293 rows (the
 * last 290) and fc2 (16.8 MB) in 16 of 128; fc3
 * (82 kB) stays whole.  Every range is at most the unit, the ranges tile the slab from its top
 * down, and a sliced layer's ranges are its bias, then its slices from the last. */
TEST(zero_unit_cuts_layers_into_slices) {
    struct dp_model *m;
    ASSERT_OK(dp_model_from_spec(&m, "mlp:784,2048,2048,10", 1, 28, 28));
    ASSERT_EQ(dp_model_set_unit(m, 1u << 20), 2);
    const struct dp_layer *fc1 = NULL, *fc2 = NULL;
    for (int i = 0; i < m->nlayers; i++)
        if (m->layers[i]->param_count) {
            if (!fc1) fc1 = m->layers[i];
            else if (!fc2) fc2 = m->layers[i];
            else ASSERT_EQ(m->layers[i]->slice_rows, 0);
        }
    ASSERT_EQ(fc1->slice_rows, 293);
    ASSERT_EQ(fc2->slice_rows, 128);
    struct dp_reducer_params rp = dp_reducer_default_params();
    rp.unit_bytes = 1u << 20;
    struct dp_reducer r;
    ASSERT_OK(dp_reducer_init(&r, m, NULL, NULL, &rp));
    /* fc3 (1 bucket), fc2's bias and 16 slices, fc1's bias and 7 slices (6 x 293 + 290) */
    ASSERT_EQ(r.nb, 1 + 17 + 8);
    int64_t top = m->num_params;
    for (int k = 0; k < r.nb; k++) {
        ASSERT_TRUE((size_t)r.b[k].count * sizeof(float) <= (1u << 20));
        ASSERT_EQ(r.b[k].off + r.b[k].count, top);
        top = r.b[k].off;
    }
    ASSERT_EQ(top, 0);
    ASSERT_EQ(r.b[1].count, 2048);                         /* fc2's bias */
    ASSERT_EQ(r.b[2].off, fc2->param_off + 1920 * 2048);   /* its last slice first */
    ASSERT_EQ(r.b[19].count, 290 * 784);                   /* fc1's last slice: the remainder */
    ASSERT_EQ(r.b[25].off, fc1->param_off);
    dp_reducer_free(&r);
    /* and the plan counts the same ranges in flight */
    ASSERT_NEAR(plan_inflight2(m, 1u << 20), 4.0 * (128 + 128) * 2048, 1e-9); /* two of fc2's slices */
    ASSERT_NEAR(plan_inflight2(m, 1u << 20), (double)reducer_pair_bytes(m, 1u << 20), 1e-9);
    dp_model_free(m);
}

/* A gpt's blocks cut into their children's ranges (parts), the children larger than the unit
 * in slices: gpt:layers=2,heads=4,dim=256,ctx=32 at 0.5 MiB, each block (3.2 MB) ln1, qkv (its
 * bias and 2 slices of 384 rows), proj, ln2, fc (bias, 2 of 512), fc_out (bias, 2 of 128): 12
 * ranges; the ranges tile the slab from the top down, none above the unit; the plan's figure is
 * the reducer's. */
TEST(zero_unit_cuts_blocks_into_parts) {
    struct dp_model *m;
    ASSERT_OK(dp_model_from_spec(&m, "gpt:layers=2,heads=4,dim=256,ctx=32", 1, 1, 1));
    ASSERT_EQ(dp_model_set_unit(m, 512 << 10), 2);
    int64_t off[16], cnt[16];
    const struct dp_layer *b0 = m->layers[1];
    ASSERT_TRUE(b0->parts && b0->nkids == 6);
    ASSERT_EQ(dp_layer_ranges(b0, off, cnt, 16), 12);
    int64_t top = b0->param_off + b0->param_count;
    for (int k = 0; k < 12; k++) {
        ASSERT_EQ(off[k] + cnt[k], top);
        ASSERT_TRUE((size_t)cnt[k] * sizeof(float) <= (512 << 10));
        top = off[k];
    }
    ASSERT_EQ(top, b0->param_off);
    ASSERT_EQ(b0->kids[3]->slice_rows, 512); /* fc: 1024 rows of 256 */
    ASSERT_EQ(b0->kids[1]->parts, 1);        /* attention, cut into qkv and proj */
    ASSERT_EQ(dp_layer_ranges(m->layers[0], NULL, NULL, 0), 1); /* tok+pos: whole */
    ASSERT_NEAR(plan_inflight2(m, 512 << 10), (double)reducer_pair_bytes(m, 512 << 10), 1e-9);
    ASSERT_TRUE(plan_inflight2(m, 512 << 10) <= 2.0 * (512 << 10));
    dp_model_set_unit(m, 0); /* and back: whole layers */
    ASSERT_EQ(dp_layer_ranges(b0, NULL, NULL, 0), 1);
    ASSERT_TRUE(!b0->parts && !b0->kids[3]->slice_rows && !b0->kids[1]->parts);
    dp_model_free(m);
}

/* One pass of a model in slices, seen through its hooks: backward reports every parameter once,
 * range by range from the slab's top down (the bias, then each slice from the last; never the
 * whole layer again), and the views it passes to layer_begin are its slices in the pass's order,
 * forward with the bias as the tied range; the gradients are the unsliced pass's to rounding. */
struct slice_log {
    int64_t next_top;  /* where the next reported range must end */
    int64_t reported;  /* floats reported */
    int bad_order;     /* a range reported out of order, or twice */
    int views[2];      /* layer_begin calls with a slice's view (no slice_rows), forward and backward */
    int64_t last_off[2];
    int bad_view;
};
static void slice_ready(void *arg, int64_t off, int64_t count) {
    struct slice_log *g = arg;
    if (off + count != g->next_top) g->bad_order = 1;
    g->next_top = off, g->reported += count;
}
static int slice_begin(void *arg, int phase, int layer, const struct dp_layer *l) {
    struct slice_log *g = arg;
    if (layer >= 0) return DP_OK; /* (a top-level layer) */
    if (l->slice_rows != 0) g->bad_view = 1;
    /* forward: slices upwards, the bias tied; backward: the bias, then slices downwards */
    if (phase == DP_PHASE_FORWARD && (l->tied_count == 0 || (g->views[0] && l->param_off < g->last_off[0])))
        g->bad_view = 1;
    if (phase == DP_PHASE_BACKWARD && (l->tied_count != 0 || (g->views[1] && l->param_off > g->last_off[1])))
        g->bad_view = 1;
    g->views[phase]++, g->last_off[phase] = l->param_off;
    return DP_OK;
}
/* One training pass of m on batch b (parameters drawn from seed 7) through the recorder g with
 * `begin` as its layer_begin: every parameter reported once, top-down, the begins in order; the
 * gradient copied into *grads if grads is set. */
static void logged_pass(const struct dp_model *m, const struct dp_batch *b, int (*begin)(void *, int, int, const struct dp_layer *),
                        struct slice_log *g, float **grads) {
    const int64_t n = m->num_params;
    struct dp_replica r;
    ASSERT_OK(dp_replica_init(&r, m, b->B));
    dp_model_init_params(m, &r, 7);
    *g = (struct slice_log){.next_top = n};
    struct dp_pass pass = {.training = 1, .backward = 1, .seed = 1, .grad_ready = slice_ready, .grad_ready_arg = g,
                           .layer_begin = begin, .layer_begin_arg = g};
    memset(r.grads, 0, sizeof(float) * (size_t)n);
    ASSERT_OK(dp_model_run(m, &r, b, &pass));
    fprintf(stderr, "    %lld floats reported (of %lld), %d forward and %d backward begins\n", (long long)g->reported,
            (long long)n, g->views[0], g->views[1]);
    ASSERT_EQ(g->reported, n);
    ASSERT_EQ(g->next_top, 0);
    ASSERT_EQ(g->bad_order, 0);
    ASSERT_EQ(g->bad_view, 0);
    if (grads) {
        *grads = malloc(sizeof(float) * (size_t)n);
        memcpy(*grads, r.grads, sizeof(float) * (size_t)n);
    }
    dp_replica_free(&r);
}
TEST(zero_unit_pass_reports_each_range_once) {
    float *grads[2];
    int64_t n = 0;
    for (int u = 0; u < 2; u++) {
        struct dp_model *m;
        ASSERT_OK(dp_model_from_spec(&m, "mlp:784,2048,2048,10", 1, 28, 28));
        ASSERT_EQ(dp_model_set_unit(m, u ? 1u << 20 : 0), u ? 2 : 0);
        n = m->num_params;
        float x[4 * 784];
        int32_t y[4] = {1, 3, 5, 7};
        int64_t idx[4] = {0, 1, 2, 3};
        for (int i = 0; i < 4 * 784; i++) x[i] = (float)((i * 37) % 101) / 101.0f;
        struct dp_batch b = {.B = 4, .x = x, .targets = y, .sample_idx = idx};
        struct slice_log g;
        fprintf(stderr, "    unit %s:\n", u ? "1 MiB" : "none");
        logged_pass(m, &b, slice_begin, &g, &grads[u]);
        ASSERT_EQ(g.views[0], u ? 7 + 16 : 0);     /* fc1's 7 slices and fc2's 16 */
        ASSERT_EQ(g.views[1], u ? 8 + 17 : 0);     /* and each one's bias first */
        dp_model_free(m);
    }
    double d = rel_diff(grads[0], grads[1], n);
    fprintf(stderr, "    gradient, sliced against whole: %.2e\n", d);
    ASSERT_TRUE(d <= 1e-6);
    free(grads[0]), free(grads[1]);
}

/* The same model at every stage and worker count with the same unit: --deterministic gives
 * one set of bits for P = 1..3 and --zero 0..3 (stage 3 gathers, computes and reduce-scatters
 * slice by slice); in ordinary mode the stages agree to 1e-6.  Without the unit the bits
 * differ only by rounding (the order of the input gradient's sum over output features): 1e-5. */
TEST_T(zero_unit_same_model_any_stage, 300) {
    require_data();
    struct dp_train_params p = base("mlp:784,2048,2048,10", 1);
    p.optim.kind = DP_OPTIM_ADAMW;
    p.sched.base_lr = 1e-3f;
    p.run.clip_norm = 0.5;
    p.run.max_steps = 3;
    p.dp.zero_unit_bytes = 1u << 20;
    p.dp.deterministic = 1;
    int64_t n0, n;
    float *ref = train(&p, &n0);
    for (int P = 1; P <= 3; P++)
        for (int z = P > 1 ? 0 : 3; z <= 3; z++) {
            p.dp.workers = P, p.dp.zero = z;
            expect_same_bits(&p, ref, n0, "unit 1 MiB, deterministic");
        }
    p.dp.deterministic = 0, p.dp.workers = 2, p.dp.zero = 0;
    float *plain = train(&p, &n);
    for (int z = 1; z <= 3; z++) {
        p.dp.zero = z;
        float *got = train(&p, &n);
        double d = rel_diff(plain, got, n);
        fprintf(stderr, "    unit 1 MiB, P=2 --zero %d vs --zero 0: %.2e\n", z, d);
        ASSERT_TRUE(d <= 1e-6);
        free(got);
    }
    /* (with momentum SGD: AdamW's m / (sqrt(v) + eps) turns a rounding of a near-zero gradient
     * into a few percent of a step, 6e-4 here, as much as between 1 and 2 workers without the
     * unit) */
    p.dp.zero = 0, p.run.clip_norm = 0, p.optim.kind = DP_OPTIM_SGD, p.sched.base_lr = 0.05f;
    float *sliced = train(&p, &n);
    p.dp.zero_unit_bytes = 0;
    float *whole = train(&p, &n);
    double d = rel_diff(sliced, whole, n);
    fprintf(stderr, "    P=2, unit 1 MiB vs none: %.2e\n", d);
    ASSERT_TRUE(d > 0 && d <= 1e-5);
    free(whole), free(sliced), free(plain), free(ref);
}

/* What a stage-3 worker holds at once within a step: with a 1 MiB unit, at most a few ranges
 * of parameters (the range computing, the one prefetched, a bias: under 4 MiB) and two of
 * gradients, where the whole layers are 16.8 MB each; the same model as without it. */
TEST_T(zero3_unit_holds_slices_not_layers, 120) {
    require_data();
    int64_t held[2], grad[2];
    for (int u = 0; u < 2; u++) {
        struct dp_train_params p = base("mlp:784,2048,2048,10", 2);
        p.optim.kind = DP_OPTIM_ADAMW;
        p.sched.base_lr = 1e-3f;
        p.dp.zero = 3;
        p.dp.zero_unit_bytes = u ? 1u << 20 : 0;
        p.run.max_steps = 2;
        struct dp_trainer *t;
        ASSERT_OK(dp_trainer_init(&t, &p));
        ASSERT_OK(dp_trainer_run(t));
        held[u] = grad[u] = 0;
        for (int r = 0; r < 2; r++) {
            struct dp_zero_counts c;
            ASSERT_EQ(dp_trainer_zero_counts(t, r, &c), 0);
            if (c.param_hw_bytes > held[u]) held[u] = c.param_hw_bytes;
            if (c.grad_hw_bytes > grad[u]) grad[u] = c.grad_hw_bytes;
        }
        fprintf(stderr, "    --zero 3, unit %s: parameters held at most %lld bytes, gradients in flight %lld\n",
                u ? "1 MiB" : "none", (long long)held[u], (long long)grad[u]);
        if (u) ASSERT_TRUE(dp_trainer_inflight_bytes(t) <= 4 * (1 << 20) + 2 * (int64_t)DP_SLAB_UNIT);
        dp_trainer_free(t);
    }
    ASSERT_TRUE(held[0] >= 4 * (2048 * 2049 + 2048 * 785)); /* whole layers: fc2 with fc1 */
    ASSERT_TRUE(held[1] > 0 && held[1] <= 3 * (1 << 20));
    ASSERT_TRUE(grad[1] > 0 && grad[1] <= 2 * (1 << 20));
}

/* A gpt whose blocks the unit cuts into their children (gpt:layers=2,heads=4,dim=256,ctx=32,
 * 0.5 MiB: 12 ranges a block, qkv, fc and fc_out in slices): --deterministic gives one set of
 * bits for P = 1, 2, 3 and --zero 0 and 3; ordinary stage 3 is stage 0's model with the same
 * unit (1e-6), and that one worker's without the unit to rounding (one SGD step: 1e-5); a
 * stage-3 worker holds at most a few of those ranges of parameters at once, never a block. */
TEST_T(zero_unit_gpt_in_parts, 300) {
    const char *gpt = "gpt:layers=2,heads=4,dim=256,ctx=32";
    struct dp_train_params p = gpt_split_params(gpt, 1, 1);
    p.dp.zero_unit_bytes = 512 << 10;
    p.dp.deterministic = 1;
    int64_t n0, n;
    float *ref = train(&p, &n0);
    for (int P = 2; P <= 3; P++)
        for (int z = 0; z <= 3; z += 3) {
            p.dp.workers = P, p.dp.zero = z;
            expect_same_bits(&p, ref, n0, "gpt, unit 0.5 MiB, deterministic");
        }
    free(ref);
    p.dp.deterministic = 0, p.dp.workers = 2, p.dp.zero = 0;
    float *plain = train(&p, &n0);
    p.dp.zero = 3;
    struct dp_trainer *t;
    ASSERT_OK(dp_trainer_init(&t, &p));
    ASSERT_OK(dp_trainer_run(t));
    double d = rel_diff(plain, dp_trainer_replica(t)->params, n0);
    int64_t held = 0;
    for (int r = 0; r < 2; r++) {
        struct dp_zero_counts c;
        ASSERT_EQ(dp_trainer_zero_counts(t, r, &c), 0);
        if (c.param_hw_bytes > held) held = c.param_hw_bytes;
    }
    const int64_t block = 4 * dp_trainer_model(t)->layers[1]->param_count;
    dp_trainer_free(t);
    fprintf(stderr, "    gpt, unit 0.5 MiB, P=2 --zero 3 vs --zero 0: %.2e; parameters held at most %lld bytes (a block: "
            "%lld)\n", d, (long long)held, (long long)block);
    ASSERT_TRUE(d <= 1e-6);
    ASSERT_TRUE(held > 0 && held <= 4 * (512 << 10) && held < block);
    free(plain);
    one_sgd_step(&p);
    p.dp.zero = 0;
    float *a = train(&p, &n0);
    p.dp.zero_unit_bytes = 0;
    float *b = train(&p, &n);
    d = rel_diff(a, b, n0);
    fprintf(stderr, "    gpt, one SGD step, unit 0.5 MiB vs none: %.2e\n", d);
    ASSERT_TRUE(d > 0 && d <= 1e-5);
    free(a), free(b);
}

/* The gpt's pass in parts, seen through its hooks: backward reports every parameter once, range
 * by range from the slab's top down (each child, or its bias and slices), forward begins the
 * children upwards and backward downwards; without the unit, each block once, whole. */
/* (the same recorder as the slices' test: slice_log, slice_ready) */
static int part_begin(void *arg, int phase, int layer, const struct dp_layer *l) {
    struct slice_log *g = arg;
    if (layer >= 0 || l->param_count == 0 || l->slice_rows > 0 || l->parts) return DP_OK; /* (what ZeRO passes over) */
    if (g->views[phase] && (phase == DP_PHASE_FORWARD ? l->param_off < g->last_off[phase] : l->param_off > g->last_off[phase]))
        g->bad_view = 1;
    g->views[phase]++, g->last_off[phase] = l->param_off;
    return DP_OK;
}
TEST(zero_unit_gpt_pass_reports_each_range_once) {
    for (int u = 0; u < 2; u++) {
        struct dp_model *m;
        ASSERT_OK(dp_model_from_spec(&m, "gpt:layers=2,heads=4,dim=256,ctx=32", 1, 1, 1));
        dp_model_set_unit(m, u ? 512 << 10 : 0);
        int32_t tok[2 * 32], tgt[2 * 32];
        int64_t idx[2] = {0, 1};
        for (int i = 0; i < 64; i++) tok[i] = (i * 7) % 256, tgt[i] = (i * 11) % 256;
        struct dp_batch b = {.B = 2, .tokens = tok, .targets = tgt, .sample_idx = idx};
        struct slice_log g;
        fprintf(stderr, "    gpt, unit %s:\n", u ? "0.5 MiB" : "none");
        logged_pass(m, &b, part_begin, &g, NULL);
        /* each block: ln1, qkv's 2 slices, proj, ln2, fc's 2, fc_out's 2 forward; and each bias first backward */
        ASSERT_EQ(g.views[0], u ? 2 * 9 : 0);
        ASSERT_EQ(g.views[1], u ? 2 * 12 : 0);
        dp_model_free(m);
    }
}
