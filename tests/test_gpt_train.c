/* gpt on text through the trainer (issue 10, F3 and the data-parallel part
 * of F5): the loss is the mean over every position, P workers train the
 * same model as one (to float rounding; bit for bit in deterministic mode),
 * accumulation, checkpoints and resume, validation on the fixed windows,
 * and the refusals (a folder as data, the NaN fault). */
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>

#include "dp/optim.h"
#include "dp/train.h"
#include "test.h"

#include "ddp_util.h"

#define GPT "gpt:layers=1,heads=2,dim=16,ctx=8"

/* Batches of 8 windows of ctx 8, 32 windows per epoch (4 steps). */
static struct dp_train_params gpt_params(int workers) {
    struct dp_train_params p = gpt_words_params(GPT, 12345u, workers, 2);
    p.sched.base_lr = 0.1f;
    p.optim.momentum = 0.9f;
    p.data.prefetch = 1;
    p.run.seed = 5;
    return p;
}

struct losses {
    int n;
    double test[8], train[8];
    int64_t positions;
};
static void on_epoch(void *arg, const struct dp_event *ev) {
    struct losses *l = arg;
    if (ev->kind != DP_EVENT_EPOCH || l->n >= 8) return;
    l->test[l->n] = ev->test_loss, l->train[l->n] = ev->loss;
    l->positions = ev->positions;
    l->n++;
}

/* Trains a, then b: the relative difference of their parameters and buffers. */
static double trained_diff(const struct dp_train_params *a, const struct dp_train_params *b) {
    int64_t na, nb;
    float *x = train(a, &na), *y = train(b, &nb);
    ASSERT_EQ(na, nb);
    double d = rel_diff(x, y, na);
    free(x), free(y);
    return d;
}

/* The 1/N of the mean counts positions: one SGD step of the trainer equals
 * a step by hand with the gradient of the mean over all B x T positions
 * (dp_model_run's default scale) on the same windows. */
TEST(gpt_train_loss_scale_is_mean_over_positions) {
    struct dp_train_params p = gpt_params(1);
    p.optim.momentum = 0;
    p.run.max_steps = 1;
    struct dp_trainer *t;
    ASSERT_OK(dp_trainer_init(&t, &p));
    const struct dp_model *m = dp_trainer_model(t);
    struct dp_replica r;
    ASSERT_OK(dp_replica_init(&r, m, 8));
    dp_model_init_params(m, &r, p.run.seed);
    ASSERT_OK(dp_trainer_run(t));
    /* windows 0..7 of epoch 0 */
    struct dp_tokens tk;
    ASSERT_OK(dp_tokens_read(p.data.data_dir, &tk));
    struct dp_text_split sp;
    ASSERT_OK(dp_text_split_init(&sp, tk.n, DP_TEXT_VAL_FRAC));
    int32_t x[64], y[64];
    ASSERT_OK(dp_text_fill_train(&tk, &sp, 8, p.run.seed, 0, 0, 8, x, y));
    struct dp_batch b = {.B = 8, .tokens = x, .targets = y};
    struct dp_pass pass = {.training = 1, .backward = 1, .seed = p.run.seed}; /* scale 1/(B T) */
    memset(r.grads, 0, sizeof(float) * (size_t)m->num_params);
    ASSERT_OK(dp_model_run(m, &r, &b, &pass));
    for (int64_t i = 0; i < m->num_params; i++) r.params[i] -= p.sched.base_lr * r.grads[i];
    double d = rel_diff(r.params, dp_trainer_replica(t)->params, m->num_params);
    fprintf(stderr, "    trainer step vs step by hand: %.2e\n", d);
    ASSERT_TRUE(d <= 1e-6);
    dp_replica_free(&r);
    dp_tokens_free(&tk);
    dp_trainer_free(t);
}

/* One layer's backward scratch is given back when the layer is done
 * (dp_arena_mark/release in dp_model_run): what a training step needs on top
 * of its forward is then the same for 2 blocks as for 6 (one layer's scratch
 * plus the gradient buffers), where it used to grow with every block. */
static size_t arena_peak(const char *spec, int backward) {
    struct dp_model *m;
    if (dp_model_from_spec(&m, spec, 1, 1, 1)) return 0;
    struct dp_replica r;
    if (dp_replica_init(&r, m, 4)) return 0;
    dp_model_init_params(m, &r, 1);
    int32_t x[4 * 32], y[4 * 32];
    for (int i = 0; i < 4 * 32; i++) x[i] = (i * 7) % 64, y[i] = (i * 5) % 64;
    struct dp_batch b = {.B = 4, .tokens = x, .targets = y};
    struct dp_pass pass = {.training = 1, .backward = backward, .seed = 1};
    size_t hw = dp_model_run(m, &r, &b, &pass) ? 0 : r.arena.high_water;
    dp_replica_free(&r);
    dp_model_free(m);
    return hw;
}

TEST(gpt_backward_scratch_does_not_grow_with_depth) {
    size_t f2 = arena_peak("gpt:layers=2,heads=2,dim=32,ctx=32,vocab=64", 0);
    size_t t2 = arena_peak("gpt:layers=2,heads=2,dim=32,ctx=32,vocab=64", 1);
    size_t f6 = arena_peak("gpt:layers=6,heads=2,dim=32,ctx=32,vocab=64", 0);
    size_t t6 = arena_peak("gpt:layers=6,heads=2,dim=32,ctx=32,vocab=64", 1);
    ASSERT_TRUE(f2 > 0 && t2 > f2 && f6 > f2 && t6 > f6);
    fprintf(stderr, "    backward on top of forward: %zu bytes (2 blocks), %zu bytes (6 blocks)\n",
            t2 - f2, t6 - f6);
    ASSERT_EQ(t6 - f6, t2 - f2);
}

/* P workers train the same gpt as one, to float rounding: momentum SGD
 * over 2 epochs (8 steps), and AdamW with warmup + cosine. */
TEST_T(gpt_ddp_equivalence, 300) {
    for (int k = 0; k < 2; k++) {
        struct dp_train_params p = gpt_params(1);
        if (k == 1) {
            p.optim = dp_optim_default_params();
            p.optim.kind = DP_OPTIM_ADAMW;
            p.optim.weight_decay = 0.01f;
            p.sched.kind = DP_SCHED_COSINE;
            p.sched.base_lr = 1e-3f;
            p.sched.warmup_steps = 2;
        }
        int64_t n1, n;
        float *ref = train(&p, &n1);
        for (int P = 2; P <= 3; P++) {
            p.dp.workers = P;
            p.dp.check_replicas = 1;
            float *got = train(&p, &n);
            ASSERT_EQ(n, n1);
            double d = rel_diff(ref, got, n);
            fprintf(stderr, "    gpt %s P=%d: max relative difference to P=1: %.2e\n", k ? "adamw+cosine" : "sgd",
                    P, d);
            ASSERT_TRUE(d <= 1e-5);
            free(got);
        }
        free(ref);
    }
}

/* Deterministic mode: bit for bit for any P (3 does not divide 8 windows in
 * chunks of 2), and the same model as ordinary training. */
TEST_T(gpt_ddp_deterministic_bit_identical, 300) {
    struct dp_train_params p = gpt_params(1);
    p.dp.det_chunk = 2;
    expect_deterministic(p, 3, "gpt");
}

/* ZeRO on gpt: --zero 2 and 3 train the same model as plain data
 * parallelism at P = 2 and 3, to 1e-6 relative.  4 KiB buckets cut the
 * 2-block model into four ranges (ln_f | blocks.1 | blocks.0 | tok+pos), so
 * at stage 3 the tied head, which runs after ln_f, reads tok.weight from the
 * lowest range: the layer_begin hook must gather that range too (the
 * head's dp_layer.tied_off), and the head's share of tok.weight's gradient
 * must be in before the embedding reports the range.  SGD over 2 epochs,
 * then AdamW with clipping and --accum 2 (every range gathered for each
 * micro-batch, the second's gradient added into gshard); --check-replicas
 * hashes the gathered parameters. */
TEST_T(gpt_zero23_equivalence, 300) {
    for (int k = 0; k < 2; k++) {
        struct dp_train_params p = gpt_params(2);
        p.dp.bucket_cap_bytes = 4096, p.dp.first_bucket_bytes = 4096;
        p.run.model = "gpt:layers=2,heads=2,dim=16,ctx=8";
        if (k == 1) {
            p.optim = dp_optim_default_params();
            p.optim.kind = DP_OPTIM_ADAMW;
            p.sched.base_lr = 3e-3f;
            p.run.clip_norm = 0.5;
            p.run.batch = 4, p.dp.accum = 2, p.run.epochs = 1;
        }
        for (int P = 2; P <= 3; P++) {
            p.dp.workers = P;
            p.dp.zero = 0, p.dp.check_replicas = 0;
            int64_t n0, n;
            float *ref = train(&p, &n0);
            for (int z = 2; z <= 3; z++) {
                p.dp.zero = z, p.dp.check_replicas = 1;
                float *got = train(&p, &n);
                ASSERT_EQ(n, n0);
                double d = rel_diff(ref, got, n);
                fprintf(stderr, "    gpt %s P=%d --zero %d vs --zero 0: %.2e\n", k ? "adamw clip accum" : "sgd", P, z, d);
                ASSERT_TRUE(d <= 1e-6);
                free(got);
            }
            free(ref);
        }
    }
}

/* The same with a table wide enough that giving a range back matters: the
 * parameter pages are released in whole 2 MiB units (src/ddp/zero.c), so
 * in the small model above a released range still holds its values.  Here
 * tok.weight is 8192 x 128 floats (4 MiB): its range (tok+pos, a bucket of
 * its own with the default caps) is given back when forward moves on to the
 * block, and the head, without that range gathered again, reads zeros. */
TEST_T(gpt_zero3_tied_head_reads_gathered_table, 300) {
    struct dp_train_params p = gpt_params(2);
    p.run.model = "gpt:layers=1,heads=2,dim=128,ctx=8,vocab=8192";
    p.run.epochs = 1, p.run.max_steps = 3;
    p.sched.base_lr = 0.05f;
    struct dp_train_params z = p;
    z.dp.zero = 3, z.dp.check_replicas = 1;
    double d = trained_diff(&p, &z);
    fprintf(stderr, "    gpt dim 128 vocab 8192 P=2 --zero 3 vs --zero 0: %.2e\n", d);
    ASSERT_TRUE(d <= 1e-6);
}

/* Deterministic mode: --zero 2 and 3 on gpt are the bits of plain
 * deterministic training at P = 1, for P = 2 and 3 (the same 4 KiB buckets). */
TEST_T(gpt_zero23_deterministic_bit_identical, 300) {
    struct dp_train_params p = gpt_params(1);
    p.dp.bucket_cap_bytes = 4096, p.dp.first_bucket_bytes = 4096;
    p.run.model = "gpt:layers=2,heads=2,dim=16,ctx=8";
    p.dp.det_chunk = 2;
    p.dp.deterministic = 1;
    int64_t n0, n;
    float *ref = train(&p, &n0);
    for (int P = 2; P <= 3; P++)
        for (int z = 2; z <= 3; z++) {
            p.dp.workers = P, p.dp.zero = z;
            float *got = train(&p, &n);
            ASSERT_EQ(n, n0);
            int same = memcmp(ref, got, sizeof(float) * (size_t)n) == 0;
            fprintf(stderr, "    gpt deterministic P=%d --zero %d: %s\n", P, z, same ? "same bits" : "differs");
            ASSERT_TRUE(same);
            free(got);
        }
    free(ref);
}

/* 2 micro-batches of 4 windows = one batch of 8: the window indices are
 * global sample indices, the same in both. */
TEST_T(gpt_ddp_accumulation_equals_big_batch, 300) {
    struct dp_train_params p = gpt_params(2), q = p;
    q.run.batch = 4;
    q.dp.accum = 2;
    double d = trained_diff(&p, &q);
    fprintf(stderr, "    gpt accum 2 x 4 vs batch 8: %.2e\n", d);
    ASSERT_TRUE(d <= 1e-5);
}

/* The epoch's validation loss is per token, on the fixed windows, the same
 * bits for any P (shared evaluation in fixed chunks), and what
 * dp_trainer_evaluate computes alone; AdamW lowers it. */
TEST_T(gpt_validation_loss_per_token, 300) {
    struct dp_train_params p = gpt_params(1);
    p.optim = dp_optim_default_params();
    p.optim.kind = DP_OPTIM_ADAMW;
    p.sched.base_lr = 3e-3f;
    p.run.epochs = 4;
    double ref[4];
    for (int P = 1; P <= 3; P++) {
        struct losses l = {0};
        p.dp.workers = P;
        p.io.on_event = on_epoch, p.io.event_arg = &l;
        struct dp_trainer *t;
        ASSERT_OK(dp_trainer_init(&t, &p));
        ASSERT_OK(dp_trainer_run(t));
        ASSERT_EQ(l.n, 4);
        ASSERT_EQ(l.positions, 8);
        double acc, loss;
        ASSERT_OK(dp_trainer_evaluate(t, NULL, p.data.test_limit, &acc, &loss));
        ASSERT_TRUE(loss == l.test[3]);
        dp_trainer_free(t);
        fprintf(stderr, "    P=%d val loss by epoch: %.4f %.4f %.4f %.4f\n", P, l.test[0], l.test[1], l.test[2],
                l.test[3]);
        /* per token: about ln 256 = 5.55 at the start, not 8 x that */
        ASSERT_TRUE(l.test[0] > 2 && l.test[0] < 6);
        ASSERT_TRUE(l.test[3] < l.test[0] - 0.3);
        if (P == 1) memcpy(ref, l.test, sizeof ref);
        else
            for (int e = 0; e < 4; e++) ASSERT_TRUE(fabs(l.test[e] - ref[e]) <= 1e-5 * ref[e]);
    }
}

/* Checkpoint and resume: 2 epochs straight, or 3 steps (mid-epoch, the
 * run stops at --max-steps and writes a checkpoint) then resumed, the second
 * part on another worker count, give the same model; the exported
 * safetensors file has the PyTorch names and loads back. */
TEST_T(gpt_checkpoint_resume_round_trip, 300) {
    char dir[512], ck[600], st[600];
    snprintf(dir, sizeof dir, "%s/run", dp_test_tmpdir());
    snprintf(ck, sizeof ck, "%s/checkpoint.bin", dir);
    snprintf(st, sizeof st, "%s/gpt.safetensors", dp_test_tmpdir());
    struct dp_train_params p = gpt_params(2);
    int64_t n;
    float *ref = train(&p, &n);
    p.io.out_dir = dir;
    p.run.max_steps = 3;
    float *part = train(&p, &n);
    free(part);
    struct dp_ckpt_header h;
    ASSERT_OK(dp_ckpt_read_header(ck, &h));
    ASSERT_EQ(h.step, 3);
    ASSERT_TRUE(strcmp(h.model_spec, GPT) == 0);
    ASSERT_EQ(h.in_shape[0], 8);
    for (int P = 2; P >= 1; P--) {
        struct dp_train_params q = gpt_params(P);
        q.io.resume = ck;
        q.run.model = NULL; /* from the checkpoint */
        float *got = train(&q, &n);
        double d = rel_diff(ref, got, n);
        fprintf(stderr, "    resumed at step 3 on %d worker%s: %.2e to the straight run\n", P, P > 1 ? "s" : "", d);
        if (P == 2) ASSERT_TRUE(memcmp(ref, got, sizeof(float) * (size_t)n) == 0);
        else ASSERT_TRUE(d <= 1e-5);
        free(got);
    }
    /* export: PyTorch names; the tied head adds no tensor */
    struct dp_trainer *t;
    struct dp_train_params q = gpt_params(1);
    q.run.epochs = 0;
    ASSERT_OK(dp_trainer_init(&t, &q));
    const struct dp_model *m = dp_trainer_model(t);
    static const char *names[] = {"tok.weight", "pos.weight", "blocks.0.ln1.weight", "blocks.0.qkv.weight",
                                  "blocks.0.proj.bias", "blocks.0.fc.weight", "blocks.0.fc_out.weight",
                                  "ln_f.weight"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) ASSERT_TRUE(dp_model_find_param(m, names[i]));
    ASSERT_TRUE(!dp_model_find_param(m, "lm_head.weight"));
    memcpy(dp_trainer_replica(t)->params, ref, sizeof(float) * (size_t)m->num_params);
    ASSERT_OK(dp_safetensors_save(st, m, dp_trainer_replica(t)));
    struct dp_replica r;
    ASSERT_OK(dp_replica_init(&r, m, 1));
    ASSERT_OK(dp_safetensors_load(st, m, &r));
    ASSERT_TRUE(memcmp(r.params, ref, sizeof(float) * (size_t)m->num_params) == 0);
    dp_replica_free(&r);
    dp_trainer_free(t);
    free(ref);
}

TEST(gpt_train_refuses_folder_and_nan_fault) {
    struct dp_train_params p = gpt_params(1);
    struct dp_trainer *t;
    p.data.data_dir = dp_test_tmpdir();
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "prepare-text");
    p = gpt_params(2);
    ASSERT_OK(dp_trainer_init(&t, &p));
    ASSERT_ERR(dp__trainer_set_fault(t, &(struct dp_fault){DP_FAULT_NAN, 0, 0}), DP_ENOTSUP, "token ids");
    dp_trainer_free(t);
    /* a vocabulary larger than the model's */
    p = gpt_params(1);
    p.run.model = GPT ",vocab=100";
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EMISMATCH, "vocabulary");
}
