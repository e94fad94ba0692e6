/* Pipeline parallelism through the trainer (issue 31, Q1 and Q3): every layout
 * trains the one-worker model (bit for bit with one micro-batch, where the sums
 * are the same; to float rounding with several), gpipe and 1f1b give the same
 * bits, the gradient agrees layer by layer, checkpoints resume across layouts,
 * a failing stage is named, and what --pp does not combine with is refused. */
#include <math.h>
#include <stdio.h>

#include "dp/optim.h"
#include "dp/par.h"
#include "dp/plan.h"
#include "dp/train.h"
#include "test.h"

#include "ddp_util.h"

#define GPT2 "gpt:layers=2,heads=2,dim=16,ctx=8" /* 5 layers: tok+pos, blocks.0, blocks.1, ln_f, lm_head */

/* ddp_util.h's recipe for the split-model tests, --pp pp with `micro` micro-batches of schedule kind. */
static struct dp_train_params pipe_params(int workers, int pp, int micro, int kind, int64_t epochs) {
    struct dp_train_params p = gpt_split_params(GPT2, workers, epochs);
    p.dp.pp = pp;
    p.dp.micro_batches = micro;
    p.dp.pp_schedule = kind;
    return p;
}

static int same_bits(const float *a, const float *b, int64_t n) { return memcmp(a, b, sizeof(float) * (size_t)n) == 0; }

/* One micro-batch: the pipeline sums exactly what one worker sums, in the same order (the
 * tied head's gradient reaches the embedding's stage before the embedding adds its own), so
 * 1 x 2 and 1 x 4 give one worker's bits, and 2 x 2 two plain data-parallel workers' bits,
 * after 13 epochs (52 AdamW steps). */
TEST_T(pipe_one_microbatch_same_bits_as_data_parallel, 300) {
    int64_t n1, n2, n;
    struct dp_train_params p = pipe_params(1, 1, 0, DP_PIPE_1F1B, 13);
    float *one = train(&p, &n1);
    p.dp.workers = 2;
    float *two = train(&p, &n2);
    ASSERT_EQ(n1, n2);
    static const struct {
        int workers, pp;
    } lay[] = {{2, 2}, {4, 4}, {4, 2}};
    for (size_t i = 0; i < sizeof lay / sizeof lay[0]; i++) {
        struct dp_train_params q = pipe_params(lay[i].workers, lay[i].pp, 1, DP_PIPE_1F1B, 13);
        q.dp.check_replicas = 4;
        float *got = train(&q, &n);
        ASSERT_EQ(n, n1);
        const float *want = lay[i].workers / lay[i].pp == 1 ? one : two;
        fprintf(stderr, "    dp %d x pp %d, 1 micro-batch: %s the %d-worker run (%.2e)\n", lay[i].workers / lay[i].pp,
                lay[i].pp, same_bits(want, got, n) ? "the bits of" : "DIFFERS from", lay[i].workers / lay[i].pp,
                rel_diff(want, got, n));
        ASSERT_TRUE(same_bits(want, got, n));
        free(got);
    }
    free(one), free(two);
}

/* Several micro-batches: gpipe and 1f1b run the backwards in the same order (the same bits),
 * the stage count does not change the sums (1 x 2 and 1 x 4 the same bits), and every layout
 * is within 1e-5 of one worker after 52 AdamW steps (the micro-batches' partial sums
 * round differently); with --clip too, whose norm the stages add up. */
TEST_T(pipe_microbatches_match_one_worker, 300) {
    for (int clip = 0; clip < 2; clip++) {
        int64_t n1, n;
        struct dp_train_params p = pipe_params(1, 1, 0, DP_PIPE_1F1B, 13);
        if (clip) p.run.clip_norm = 0.05;
        float *one = train(&p, &n1);
        float *first = NULL;
        static const struct {
            int workers, pp, micro, kind;
        } lay[] = {{2, 2, 4, DP_PIPE_1F1B}, {2, 2, 4, DP_PIPE_GPIPE}, {4, 4, 4, DP_PIPE_1F1B},
                   {4, 2, 2, DP_PIPE_1F1B}, {3, 3, 8, DP_PIPE_GPIPE}};
        for (size_t i = 0; i < sizeof lay / sizeof lay[0]; i++) {
            struct dp_train_params q = pipe_params(lay[i].workers, lay[i].pp, lay[i].micro, lay[i].kind, 13);
            q.run.clip_norm = p.run.clip_norm;
            float *got = train(&q, &n);
            ASSERT_EQ(n, n1);
            double d = rel_diff(one, got, n);
            fprintf(stderr, "    %sdp %d x pp %d, %d micro-batches, %s: %.2e to one worker\n", clip ? "--clip, " : "",
                    lay[i].workers / lay[i].pp, lay[i].pp, lay[i].micro, dp_pipe_schedule_name(lay[i].kind), d);
            ASSERT_TRUE(d <= 1e-5);
            if (i < 3 && first) ASSERT_TRUE(same_bits(first, got, n)); /* (M = 4 on one replica) */
            if (i == 0) first = got;
            else free(got);
        }
        free(first), free(one);
    }
}

/* One SGD step of lr 1 from the same start: params - gradient.  Each parameter tensor (each
 * layer's weights and biases, the tied embedding included) of the 1 x 2 pipeline against
 * one worker's: the same bits with one micro-batch, within 1e-5 with four. */
TEST_T(pipe_gradients_layer_by_layer, 300) {
    struct dp_train_params p = pipe_params(1, 1, 0, DP_PIPE_1F1B, 1);
    one_sgd_step(&p);
    int64_t n1, n;
    float *one = train(&p, &n1);
    struct dp_trainer *t;
    ASSERT_OK(dp_trainer_init(&t, &p));
    const struct dp_model *m = dp_trainer_model(t);
    for (int micro = 1; micro <= 4; micro *= 4) {
        struct dp_train_params q = p;
        q.dp.workers = 2, q.dp.pp = 2, q.dp.micro_batches = micro;
        float *got = train(&q, &n);
        ASSERT_EQ(n, n1);
        for (int i = 0; i < m->nparams; i++) {
            const struct dp_param_info *pi = &m->params[i];
            if (pi->is_buffer) continue;
            double d = rel_diff(one + pi->offset, got + pi->offset, pi->count);
            if (micro == 1) ASSERT_TRUE(same_bits(one + pi->offset, got + pi->offset, pi->count));
            else ASSERT_TRUE(d <= 1e-5);
            if (micro > 1) fprintf(stderr, "    %-22s %.2e\n", pi->name, d);
        }
        free(got);
    }
    dp_trainer_free(t);
    free(one);
}

/* A pipelined run's checkpoint (each stage's AdamW state in the whole slab's layout) resumes
 * on one worker, and one worker's resumes pipelined: both end with the straight run's bits
 * (one micro-batch: the same sums). */
TEST_T(pipe_checkpoint_resumes_across_layouts, 300) {
    char dir[512], ck[600];
    int64_t n1, n;
    struct dp_train_params p = pipe_params(1, 1, 0, DP_PIPE_1F1B, 2);
    float *straight = train(&p, &n1);
    for (int from_pipe = 1; from_pipe >= 0; from_pipe--) {
        snprintf(dir, sizeof dir, "%s/run%d", dp_test_tmpdir(), from_pipe);
        snprintf(ck, sizeof ck, "%s/checkpoint.bin", dir);
        struct dp_train_params a = pipe_params(from_pipe ? 2 : 1, from_pipe ? 2 : 1, from_pipe ? 1 : 0,
                                               DP_PIPE_1F1B, 2);
        a.io.out_dir = dir;
        a.run.max_steps = 3;
        free(train(&a, &n));
        struct dp_ckpt_header h;
        ASSERT_OK(dp_ckpt_read_header(ck, &h));
        ASSERT_EQ(h.step, 3);
        ASSERT_EQ(h.optim_state_len, 2 * h.num_params); /* AdamW's m and v, the whole model's */
        struct dp_train_params b = pipe_params(from_pipe ? 1 : 2, from_pipe ? 1 : 2, from_pipe ? 0 : 1,
                                               DP_PIPE_1F1B, 2);
        b.io.resume = ck;
        float *got = train(&b, &n);
        ASSERT_EQ(n, n1);
        fprintf(stderr, "    %s at step 3, resumed %s: %s\n", from_pipe ? "pipelined" : "one worker",
                from_pipe ? "on one worker" : "pipelined", same_bits(straight, got, n) ? "the same bits" : "DIFFERENT");
        ASSERT_TRUE(same_bits(straight, got, n));
        free(got);
    }
    free(straight);
}

/* --deterministic: the micro-batches are the fixed chunks, each chunk's gradient (the tied head's
 * share sent to the embedding's stage chunk by chunk) converted to fixed point as backward reports
 * it, so every layout trains one worker's deterministic bits: dp x pp in {1 x 2 (gpipe and 1f1b),
 * 2 x 2, 1 x 4, 3 x 1 (plain data parallelism)}, chunks of 2 windows (4 per replica's share, or
 * uneven shares of whole chunks at 3 replicas); and a BatchNorm model, resnet, 2 x 2. */
TEST_T(pipe_deterministic_same_bits_any_layout, 300) {
    int64_t n1, n;
    struct dp_train_params p = pipe_params(1, 1, 0, DP_PIPE_1F1B, 3);
    p.dp.deterministic = 1, p.dp.det_chunk = 2, p.run.clip_norm = 0.05;
    float *one = train(&p, &n1);
    static const struct {
        int workers, pp, kind;
    } lay[] = {{2, 2, DP_PIPE_1F1B}, {2, 2, DP_PIPE_GPIPE}, {4, 2, DP_PIPE_1F1B}, {4, 4, DP_PIPE_1F1B},
               {3, 1, DP_PIPE_1F1B}, {6, 2, DP_PIPE_GPIPE}};
    for (size_t i = 0; i < sizeof lay / sizeof lay[0]; i++) {
        struct dp_train_params q = pipe_params(lay[i].workers, lay[i].pp, 0, lay[i].kind, 3);
        q.dp.deterministic = 1, q.dp.det_chunk = 2, q.run.clip_norm = 0.05;
        float *got = train(&q, &n);
        ASSERT_EQ(n, n1);
        fprintf(stderr, "    --deterministic dp %d x pp %d, %s: %s\n", lay[i].workers / lay[i].pp, lay[i].pp,
                dp_pipe_schedule_name(lay[i].kind), same_bits(one, got, n) ? "one worker's bits" : "DIFFERENT");
        ASSERT_TRUE(same_bits(one, got, n));
        free(got);
    }
    free(one);
    /* BatchNorm: each stage's layers' chunk statistics summed in fixed point over its replicas and
     * applied once per step (the other stages' layers have no batch on this stage: left alone);
     * a narrow resnet's parameters and running statistics, 2 x 2 against one worker (2 steps:
     * the running statistics move at each) */
    require_data();
    p = base("resnet:8,4", 1);
    p.dp.deterministic = 1, p.dp.det_chunk = 15, p.run.max_steps = 2;
    one = train(&p, &n1);
    p.dp.workers = 4, p.dp.pp = 2;
    float *got = train(&p, &n);
    ASSERT_EQ(n, n1);
    ASSERT_TRUE(same_bits(one, got, n));
    free(one), free(got);
}

/* ZeRO 1 within each stage: the stage's replicas shard its optimizer state, update their shards
 * and gather the span: 2 x 2 with --zero 1 (all-reduce, and --zero-reduce scatter) and --clip
 * trains plain 2 x 2's bits, and its checkpoint (each stage's pieces in the whole slab's layout)
 * resumes unpipelined as plain's does. */
TEST_T(pipe_zero1_within_stages_same_bits, 300) {
    char dir[2][512], ck[2][600];
    int64_t n0, n;
    float *trained[2] = {NULL, NULL}, *resumed[2] = {NULL, NULL};
    for (int z = 0; z < 2; z++) {
        snprintf(dir[z], sizeof dir[z], "%s/z%d", dp_test_tmpdir(), z);
        snprintf(ck[z], sizeof ck[z], "%s/checkpoint.bin", dir[z]);
        struct dp_train_params p = pipe_params(4, 2, 2, DP_PIPE_1F1B, 3);
        p.run.clip_norm = 0.05;
        p.dp.zero = z;
        p.io.out_dir = dir[z];
        trained[z] = train(&p, z ? &n : &n0);
        if (z) {
            ASSERT_TRUE(same_bits(trained[0], trained[1], n0));
            p.dp.zero_scatter = 1, p.io.out_dir = NULL;
            float *sc = train(&p, &n);
            ASSERT_TRUE(same_bits(trained[0], sc, n0));
            free(sc);
        }
        struct dp_train_params q = pipe_params(2, 1, 0, DP_PIPE_1F1B, 4);
        q.run.clip_norm = 0.05;
        q.io.resume = ck[z];
        resumed[z] = train(&q, z ? &n : &n0);
    }
    fprintf(stderr, "    --zero 1 within stages: %s\n",
            same_bits(resumed[0], resumed[1], n0) ? "plain's bits, and its checkpoint resumes alike" : "DIFFERENT");
    ASSERT_TRUE(same_bits(resumed[0], resumed[1], n0));
    for (int z = 0; z < 2; z++) free(trained[z]), free(resumed[z]);
}

/* Evaluation runs through the stages (each its own layers on each chunk, pipe_step.c): with one
 * micro-batch, where the layouts train one worker's bits (1 x 2, 1 x 4) or two plain workers'
 * (2 x 2), every epoch's test loss and accuracy are those runs' bits too; 40 windows are 3
 * chunks of 16, 16 and 8, so the stages' members take unequal numbers of them.  With --tp 2
 * inside the stages (each member a chain of its own, whole layers) the loss is one worker's to
 * float rounding. */
struct evals {
    int n;
    double loss[8], acc[8];
};
static void on_epoch_eval(void *arg, const struct dp_event *e) {
    struct evals *v = arg;
    if (e->kind == DP_EVENT_EPOCH && v->n < 8) v->loss[v->n] = e->test_loss, v->acc[v->n] = e->test_acc, v->n++;
}
/* ... and after the run, dp_trainer_evaluate on worker 0's replica (the whole parameters, kept
 * there at the end) gives the last epoch's figures */
static struct evals run_evals(int workers, int pp, int tp) {
    struct dp_train_params p = pipe_params(workers, pp, 1, DP_PIPE_1F1B, 3);
    p.dp.tp = tp;
    struct evals v = {0};
    p.io.on_event = on_epoch_eval, p.io.event_arg = &v;
    struct dp_trainer *t;
    ASSERT_OK(dp_trainer_init(&t, &p));
    ASSERT_OK(dp_trainer_run(t));
    double acc, loss;
    ASSERT_OK(dp_trainer_evaluate(t, NULL, p.data.test_limit, &acc, &loss));
    ASSERT_TRUE(v.n > 0 && loss == v.loss[v.n - 1] && acc == v.acc[v.n - 1]);
    dp_trainer_free(t);
    return v;
}
TEST_T(pipe_evaluation_through_the_stages, 300) {
    const struct evals one = run_evals(1, 1, 1), two = run_evals(2, 1, 1);
    ASSERT_EQ(one.n, 3);
    static const struct {
        int workers, pp, tp;
    } lay[] = {{2, 2, 1}, {4, 4, 1}, {4, 2, 1}, {4, 2, 2}};
    for (size_t i = 0; i < sizeof lay / sizeof lay[0]; i++) {
        const struct evals got = run_evals(lay[i].workers, lay[i].pp, lay[i].tp);
        const struct evals *want = lay[i].workers / (lay[i].pp * lay[i].tp) == 1 ? &one : &two;
        ASSERT_EQ(got.n, want->n);
        for (int e = 0; e < got.n; e++) {
            fprintf(stderr, "    dp %d x pp %d x tp %d, epoch %d: test loss %.9f (%.9f), accuracy %.6f (%.6f)\n",
                    lay[i].workers / (lay[i].pp * lay[i].tp), lay[i].pp, lay[i].tp, e + 1, got.loss[e], want->loss[e],
                    got.acc[e], want->acc[e]);
            if (lay[i].tp > 1) {
                ASSERT_TRUE(fabs(got.loss[e] - want->loss[e]) <= 1e-5 * fabs(want->loss[e]));
            } else {
                ASSERT_TRUE(got.loss[e] == want->loss[e]);
                ASSERT_TRUE(got.acc[e] == want->acc[e]);
            }
        }
    }
}

/* Memory per worker: a stage holds its span's parameters and gradient (and the last stage the
 * tied embedding's copy), the rest of the slabs mapped and never touched.  A 12.7M-parameter gpt
 * in 2 stages: after 2 steps worker 1's resident slabs are its span's 8 bytes a parameter (within
 * 2 MiB a range boundary: the slabs may be huge pages), where a replica holds 8 bytes for the
 * whole model; at the end worker 0 holds the whole parameters (the run's result), no gradient. */
TEST_T(pipe_stage_holds_its_share, 120) {
    struct dp_train_params p = pipe_params(2, 2, 2, DP_PIPE_1F1B, 1);
    p.run.model = "gpt:layers=4,heads=2,dim=512,ctx=8";
    p.run.max_steps = 2;
    struct dp_trainer *t;
    ASSERT_OK(dp_trainer_init(&t, &p));
    const struct dp_model *m = dp_trainer_model(t);
    const int *first;
    int64_t held[2];
    ASSERT_EQ(dp_trainer_stages(t, &first), 2);
    for (int s = 0; s < 2; s++) {
        struct dp_span sp;
        ASSERT_OK(dp_model_span(m, first[s], first[s + 1], &sp));
        held[s] = 8 * sp.param_count;
    }
    held[1] += 8 * m->layers[m->nlayers - 1]->tied_count; /* (the tied copy, tok.weight: its value and gradient) */
    ASSERT_OK(dp_trainer_run(t));
    const double whole = 8.0 * (double)m->num_params, unit = 2.0 * 1048576;
    for (int s = 0; s < 2; s++) {
        int64_t got = dp_trainer_slab_bytes(t, s);
        fprintf(stderr, "    stage %d: %.2f MB resident of its slabs, %.2f MB its share, %.2f MB the whole model's\n",
                s, got / 1e6, held[s] / 1e6, whole / 1e6);
        if (s == 0) ASSERT_TRUE(fabs((double)got - whole / 2) <= 4 * unit); /* (the end: whole parameters, no gradient) */
        else ASSERT_TRUE(fabs((double)(got - held[s])) <= 4 * unit);
    }
    dp_trainer_free(t);
}

/* The activations each stage holds, as the run measures them (dp_trainer_activation_bytes: its
 * micro-batches' arenas at their most) and as the plan predicts them from the layers' measured
 * bytes (dp_model_layer_bytes, dp_plan_pipeline): within 5%, gpipe and 1f1b, M = 1, 4, 8. */
TEST_T(pipe_activations_as_planned, 300) {
    static const int kinds[2] = {DP_PIPE_GPIPE, DP_PIPE_1F1B}, micros[3] = {1, 4, 8};
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 3; j++) {
            struct dp_train_params p = pipe_params(2, 2, micros[j], kinds[k], 1);
            p.run.max_steps = 2;
            struct dp_trainer *t;
            ASSERT_OK(dp_trainer_init(&t, &p));
            ASSERT_OK(dp_trainer_run(t));
            const struct dp_model *m = dp_trainer_model(t);
            double *out = malloc(sizeof(double) * 3 * (size_t)m->nlayers), *flops = malloc(sizeof(double) * (size_t)m->nlayers);
            int64_t *lay = malloc(sizeof(int64_t) * (size_t)m->nlayers);
            ASSERT_OK(dp_model_layer_bytes(m, out, out + m->nlayers, out + 2 * m->nlayers));
            for (int i = 0; i < m->nlayers; i++) lay[i] = m->layers[i]->param_count, flops[i] = (double)m->layers[i]->flops_fwd;
            struct dp_plan_params q = dp_plan_default_params();
            q.layers = lay, q.layer_flops = flops, q.nlayers = m->nlayers, q.batch = p.run.batch, q.net.workers = 2;
            q.layer_out = out, q.layer_act = out + m->nlayers, q.layer_scratch = out + 2 * m->nlayers;
            struct dp_plan_pipe r;
            ASSERT_OK(dp_plan_pipeline(&q, 2, micros[j], kinds[k], 0, &r));
            for (int s = 0; s < 2; s++) {
                double got = (double)dp_trainer_activation_bytes(t, s), d = r.act_bytes[s] / got - 1;
                fprintf(stderr, "    %s M=%d stage %d: %.0f bytes measured, %.0f planned (%+.1f%%)\n",
                        dp_pipe_schedule_name(kinds[k]), micros[j], s, got, r.act_bytes[s], 100 * d);
                ASSERT_TRUE(fabs(d) <= 0.05);
            }
            dp_plan_pipe_free(&r);
            free(out), free(flops), free(lay);
            dp_trainer_free(t);
        }
}

/* A stage that fails ends the job with the worker, the step and the stage named; the other
 * stages, blocked on its messages or in their stage's all-reduce, do not hang. */
TEST_T(pipe_failing_stage_named, 120) {
    struct dp_train_params p = pipe_params(4, 2, 2, DP_PIPE_1F1B, 1);
    for (int who = 0; who < 4; who += 3) {
        struct dp_trainer *t;
        ASSERT_OK(init_faulty(&t, &p, &(struct dp_fault){DP_FAULT_ALLOC, who, 2}));
        int rc = dp_trainer_run(t);
        ASSERT_EQ(rc, DP_ENOMEM);
        char want[128];
        snprintf(want, sizeof want, "worker %d, step 2: pipeline stage %d (%s", who, who / 2,
                 who ? "" : "tok+pos..");
        fprintf(stderr, "    %s\n", dp_errmsg());
        ASSERT_TRUE(strstr(dp_errmsg(), want) != NULL);
        ASSERT_TRUE(strstr(dp_errmsg(), "injected allocation failure") != NULL);
        dp_trainer_free(t);
    }
}

/* --check-replicas within the stages: each worker's span hashed against its stage's first
 * worker's (the workers hold their spans only); a stage-1 replica that drifts at step 1 is
 * named at the check after step 2. */
TEST_T(pipe_check_replicas_names_diverged_worker, 120) {
    struct dp_train_params p = pipe_params(4, 2, 2, DP_PIPE_1F1B, 2);
    p.dp.check_replicas = 2;
    struct dp_trainer *t;
    ASSERT_OK(init_faulty(&t, &p, &(struct dp_fault){DP_FAULT_DIVERGE, 3, 1}));
    int rc = dp_trainer_run(t);
    dp_trainer_free(t);
    fprintf(stderr, "    %s\n", dp_errmsg());
    ASSERT_EQ(rc, DP_EMISMATCH);
    ASSERT_TRUE(strstr(dp_errmsg(), "step 2: the replica of worker 3 diverged from worker 2") != NULL);
    p.dp.check_replicas = 1; /* and without the drift, every check agrees */
    free(train(&p, &(int64_t){0}));
}

/* What --pp refuses, each with one clear line. */
TEST(pipe_refusals) {
    struct dp_trainer *t;
    struct dp_train_params p = pipe_params(3, 2, 0, DP_PIPE_1F1B, 1);
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "--pp must divide --workers into stages (got --pp 2 with 3");
    p = pipe_params(2, 1, 4, DP_PIPE_1F1B, 1);
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "--micro-batches is --pp's option");
    p = pipe_params(8, 8, 0, DP_PIPE_1F1B, 1);
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "has 5 layers, fewer than the stages");
    p = pipe_params(2, 2, 0, DP_PIPE_1F1B, 1);
    p.dp.zero = 2;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_ENOTSUP, "--pp does not work with --zero 2: each stage would");
    p = pipe_params(2, 2, 0, DP_PIPE_1F1B, 1);
    p.dp.accum = 2;
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "--pp takes --micro-batches, not --accum");
    p = pipe_params(2, 2, 0, 5, 1);
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "unknown pipeline schedule 5");
}
