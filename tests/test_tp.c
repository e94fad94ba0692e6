/* Tensor parallelism through the trainer (issue 31, Q2 and Q3): every layout dp x tp trains
 * the one-worker model to float rounding (a split layer sums T partial products where one
 * worker sums one), the gradient agrees parameter by parameter, checkpoints resume across
 * layouts, a failing worker is named without a hang, and what --tp does not combine with is
 * refused. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>

#include "dp/optim.h"
#include "dp/train.h"
#include "test.h"

#include "ddp_util.h"

#define GPT4 "gpt:layers=2,heads=4,dim=16,ctx=8" /* 4 heads: splits 2 and 4 ways */

/* ddp_util.h's recipe for the split-model tests, --tp tp. */
static struct dp_train_params tp_params(int workers, int tp, int64_t epochs) {
    struct dp_train_params p = gpt_split_params(GPT4, workers, epochs);
    p.dp.tp = tp;
    return p;
}

/* dp x pp x tp in {1 x 1 x 2, 2 x 1 x 2, 1 x 1 x 4, 1 x 2 x 2, 2 x 2 x 2} within 1e-5 of one
 * worker after 13 epochs (52 AdamW steps), with and without --clip; 2 x 1 x 2 with --zero 1 too
 * (the pipeline's with 2 micro-batches: the tied head's gradient crossing from the last stage's
 * tensor ranks to the first's, each to its own).  Plain data parallelism (2 x 1,
 * 4 x 1) alongside, for the scale: its sums round differently from one worker's as well, and
 * AdamW carries the difference on (on a gpt of width 32 both reach 2e-5 after 52 steps). */
TEST_T(tp_layouts_match_one_worker, 300) {
    for (int clip = 0; clip < 2; clip++) {
        int64_t n1, n;
        struct dp_train_params p = tp_params(1, 1, 13);
        if (clip) p.run.clip_norm = 0.05;
        float *one = train(&p, &n1);
        static const struct {
            int workers, pp, tp, zero;
        } lay[] = {{2, 1, 1, 0}, {4, 1, 1, 0}, {2, 1, 2, 0}, {4, 1, 2, 0}, {4, 1, 4, 0},
                   {4, 1, 2, 1}, {4, 2, 2, 0}, {8, 2, 2, 0}};
        for (size_t i = 0; i < sizeof lay / sizeof lay[0]; i++) {
            struct dp_train_params q = tp_params(lay[i].workers, lay[i].tp, 13);
            q.run.clip_norm = p.run.clip_norm;
            q.dp.zero = lay[i].zero;
            q.dp.pp = lay[i].pp;
            if (lay[i].pp > 1) q.dp.micro_batches = 2;
            q.dp.check_replicas = 4;
            float *got = train(&q, &n);
            ASSERT_EQ(n, n1);
            double d = rel_diff(one, got, n);
            fprintf(stderr, "    %sdp %d x pp %d x tp %d%s: %.2e to one worker\n", clip ? "--clip, " : "",
                    lay[i].workers / lay[i].tp / lay[i].pp, lay[i].pp, lay[i].tp, lay[i].zero ? ", --zero 1" : "", d);
            ASSERT_TRUE(d <= 1e-5);
            free(got);
        }
        free(one);
    }
}

/* One SGD step of lr 1 from the same start: params - gradient.  Each parameter tensor of the
 * 2-way and 4-way split, and of 2 stages x 2-way (2 micro-batches), against one worker's: the split ones (qkv, proj, fc, fc_out), the
 * replicated ones (norms, a row-parallel layer's bias: counted once per group) and the tied
 * embedding, each within 1e-5, and each gradient not zero. */
TEST_T(tp_gradients_layer_by_layer, 300) {
    struct dp_train_params p = tp_params(1, 1, 1);
    one_sgd_step(&p);
    int64_t n1, n;
    float *one = train(&p, &n1);
    struct dp_trainer *t;
    ASSERT_OK(dp_trainer_init(&t, &p));
    const struct dp_model *m = dp_trainer_model(t);
    /* the start, for the gradient's size: zero steps */
    struct dp_train_params z = p;
    z.run.max_steps = 0, z.run.epochs = 0;
    float *start = train(&z, &n);
    ASSERT_EQ(n, n1);
    for (int tp = 2; tp <= 8; tp *= 2) {
        struct dp_train_params q = p;
        q.dp.workers = tp, q.dp.tp = tp;
        if (tp == 8) q.dp.workers = 4, q.dp.tp = 2, q.dp.pp = 2, q.dp.micro_batches = 2; /* (1 x 2 x 2) */
        float *got = train(&q, &n);
        ASSERT_EQ(n, n1);
        int split = 0;
        for (int i = 0; i < m->nparams; i++) {
            const struct dp_param_info *pi = &m->params[i];
            if (pi->is_buffer) continue;
            double d = rel_diff(one + pi->offset, got + pi->offset, pi->count);
            double g = rel_diff(start + pi->offset, one + pi->offset, pi->count);
            split += pi->tp_split != DP_TP_REPLICATED;
            if (tp == 2) fprintf(stderr, "    %-22s %-10s %.2e\n", pi->name, pi->tp_split ? "split" : "replicated", d);
            ASSERT_TRUE(d <= 1e-5);
            ASSERT_TRUE(g > 0);
        }
        /* per block: qkv's weight and bias, proj's weight, fc's weight and bias, fc_out's weight; and
         * the token table (by token, as the tied head) */
        ASSERT_EQ(split, 2 * 6 + 1);
        free(got);
    }
    dp_trainer_free(t);
    free(start), free(one);
}

/* A tensor-parallel run's checkpoint resumes on one worker, and one worker's resumes
 * tensor-parallel: every worker held the whole model, so the file is the plain one, and each
 * ends within 1e-5 of the straight run. */
TEST_T(tp_checkpoint_resumes_across_layouts, 300) {
    char dir[512], ck[600];
    int64_t n1, n;
    struct dp_train_params p = tp_params(1, 1, 2);
    float *straight = train(&p, &n1);
    for (int from_tp = 1; from_tp >= 0; from_tp--) {
        snprintf(dir, sizeof dir, "%s/run%d", dp_test_tmpdir(), from_tp);
        snprintf(ck, sizeof ck, "%s/checkpoint.bin", dir);
        struct dp_train_params a = tp_params(from_tp ? 2 : 1, from_tp ? 2 : 1, 2);
        a.io.out_dir = dir;
        a.run.max_steps = 3;
        free(train(&a, &n));
        struct dp_ckpt_header h;
        ASSERT_OK(dp_ckpt_read_header(ck, &h));
        ASSERT_EQ(h.step, 3);
        struct dp_train_params b = tp_params(from_tp ? 1 : 2, from_tp ? 1 : 2, 2);
        b.io.resume = ck;
        float *got = train(&b, &n);
        ASSERT_EQ(n, n1);
        double d = rel_diff(straight, got, n);
        fprintf(stderr, "    %s at step 3, resumed %s: %.2e to the straight run\n", from_tp ? "tp 2" : "one worker",
                from_tp ? "on one worker" : "at tp 2", d);
        ASSERT_TRUE(d <= 1e-5);
        free(got);
    }
    free(straight);
}

/* ---- the vocabulary-split cross-entropy against the whole one ----------------------------- */

/* A group of T threads whose sum is a barrier, each rank adding its buffer into a shared one in
 * rank order, a barrier, and a copy back. */
struct fake_group {
    int T;
    pthread_barrier_t bar;
    float sum[4096];
};
struct fake_rank {
    struct fake_group *g;
    struct dp_tp tp;
    const float *logits;
    const int32_t *targets;
    int64_t R, V;
    float dz[1024];
    double loss;
    int64_t correct;
    int rc;
};
static int fake_allreduce(void *arg, float *buf, int64_t n) {
    struct fake_rank *k = arg;
    struct fake_group *g = k->g;
    if (k->tp.rank == 0) memset(g->sum, 0, sizeof(float) * (size_t)n);
    pthread_barrier_wait(&g->bar);
    for (int r = 0; r < g->T; r++) {
        if (r == k->tp.rank)
            for (int64_t i = 0; i < n; i++) g->sum[i] += buf[i];
        pthread_barrier_wait(&g->bar);
    }
    memcpy(buf, g->sum, sizeof(float) * (size_t)n);
    pthread_barrier_wait(&g->bar);
    return DP_OK;
}
static void *fake_run(void *arg) {
    struct fake_rank *k = arg;
    int64_t v0, Vl;
    dp_tp_slice(k->V, k->tp.size, k->tp.rank, &v0, &Vl);
    float z[1024];
    for (int64_t r = 0; r < k->R; r++) memcpy(z + r * Vl, k->logits + r * k->V + v0, sizeof(float) * (size_t)Vl);
    k->rc = dp_softmax_xent_split(k->dz, &k->loss, &k->correct, z, k->targets, k->R, k->V, v0, Vl, 0.25f, &k->tp);
    return NULL;
}

/* 6 rows of 10 classes split 3 ways (slices of 4, 3, 3): the loss, the correct count and every
 * rank's slice of the gradient are the whole loss's, to float rounding; rows whose maximum is
 * tied across ranks count the first argmax, as the whole one (torch.argmax) does. */
TEST(tp_split_cross_entropy_is_the_whole) {
    enum { R = 6, V = 10, T = 3 };
    float logits[R * V], dz[R * V];
    int32_t targets[R] = {0, 9, 4, 5, 3, 5};
    for (int i = 0; i < R * V; i++) logits[i] = (float)sin(0.37 * i) * 3.0f;
    logits[2 * V + 1] = logits[2 * V + 4] = logits[2 * V + 8] = 9.0f; /* row 2: its maximum on ranks 0, 1, 2 (1 first), target 4 */
    logits[3 * V + 7] = logits[3 * V + 5] = 9.0f;                      /* row 3: on ranks 1 and 2, 5 first: its target */
    double loss;
    int64_t correct;
    ASSERT_OK(dp_softmax_xent(dz, &loss, &correct, logits, targets, R, V, 0.25f));
    struct fake_group g = {.T = T};
    pthread_barrier_init(&g.bar, NULL, T);
    struct fake_rank k[T];
    pthread_t th[T];
    for (int r = 0; r < T; r++) {
        k[r] = (struct fake_rank){.g = &g, .logits = logits, .targets = targets, .R = R, .V = V};
        k[r].tp = (struct dp_tp){.rank = r, .size = T, .allreduce = fake_allreduce, .arg = &k[r]};
        pthread_create(&th[r], NULL, fake_run, &k[r]);
    }
    for (int r = 0; r < T; r++) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&g.bar);
    for (int r = 0; r < T; r++) {
        ASSERT_OK(k[r].rc);
        ASSERT_NEAR(k[r].loss, loss, 1e-5 * fabs(loss));
        ASSERT_EQ(k[r].correct, correct);
        int64_t v0, Vl;
        dp_tp_slice(V, T, r, &v0, &Vl);
        for (int64_t i = 0; i < R; i++)
            for (int64_t j = 0; j < Vl; j++) ASSERT_NEAR(k[r].dz[i * Vl + j], dz[i * V + v0 + j], 1e-6);
    }
    fprintf(stderr, "    loss %.6f (whole %.6f), %lld correct of %d\n", k[0].loss, loss, (long long)correct, R);
}

/* A worker that fails inside its step ends the run with its name and step, and its group's
 * other rank, waiting in the group's sum inside forward, does not hang: 2 x 1 x 2, and
 * 1 x 2 x 2 (its pipeline's stage named too). */
TEST_T(tp_failing_worker_named, 120) {
    for (int k = 0; k < 4; k++) {
        const int who = k % 2 ? 3 : 0, pp = k < 2 ? 1 : 2;
        struct dp_train_params p = tp_params(4, 2, 1);
        p.dp.pp = pp;
        struct dp_trainer *t;
        ASSERT_OK(init_faulty(&t, &p, &(struct dp_fault){DP_FAULT_ALLOC, who, 2}));
        int rc = dp_trainer_run(t);
        ASSERT_EQ(rc, DP_ENOMEM);
        char want[128];
        snprintf(want, sizeof want, "worker %d, step 2: %s", who, pp > 1 ? "pipeline stage" : "injected allocation failure");
        fprintf(stderr, "    %s\n", dp_errmsg());
        ASSERT_TRUE(strstr(dp_errmsg(), want) != NULL);
        dp_trainer_free(t);
    }
}

/* What --tp refuses, each with one clear line. */
TEST(tp_refusals) {
    struct dp_trainer *t;
    struct dp_train_params p = tp_params(3, 2, 1);
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "--tp must divide --workers into tensor groups (got --tp 2 with 3");
    p = tp_params(1, 2, 1);
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "--tp must divide --workers");
    p = tp_params(2, 2, 1);
    p.run.model = "gpt:layers=2,heads=3,dim=24,ctx=8";
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "--tp 2: layer blocks.0 has 3 heads, not a multiple of 2");
    p = tp_params(2, 2, 1);
    p.data.data_dir = "/usr/share/datasets/fashion-mnist";
    p.run.model = "mlp";
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_ENOTSUP, "--tp 2: model 'mlp' has no layer that splits");
    p = tp_params(2, 2, 1);
    p.dp.deterministic = 1;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_ENOTSUP, "--tp does not work with --deterministic: a split layer's");
    p = tp_params(2, 2, 1);
    p.dp.zero = 3;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_ENOTSUP, "--tp does not work with --zero 3 yet");
    p = tp_params(4, 2, 1);
    p.dp.pp = 4;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "--pp 4 x --tp 2 must divide --workers (got 4)");
}
