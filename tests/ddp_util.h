/* Helpers shared by the data-parallel tests (test_ddp.c, test_ddp_procs.c):
 * the data check (a skip when it is missing), the small recipe they all
 * train, training to a copy of the parameters, and the relative difference
 * they compare by. */
#ifndef DP_TESTS_DDP_UTIL_H
#define DP_TESTS_DDP_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "dp/train.h"
#include "test.h"
#include "train/fault.h" /* fault injection: the tests' own interface */

#define DATA "/usr/share/datasets/fashion-mnist"

/* Skips the test (never passes it) when the data set is not installed. */
static inline void require_data(void) {
    if (access(DATA "/train-images-idx3-ubyte.gz", R_OK) != 0)
        SKIP("%s missing (bash scripts/install-deps.sh installs it)", DATA);
}

/* mlp/cnn/resnet on 1000 samples in batches of 60 (17 batches, the last one
 * of 40), momentum SGD, `workers` workers. */
static inline struct dp_train_params base(const char *model, int workers) {
    struct dp_train_params p = dp_train_default_params();
    p.data.data_dir = DATA;
    p.run.model = model;
    p.dp.workers = workers;
    p.run.batch = 60;
    p.run.epochs = 1;
    p.data.train_limit = 1000;
    p.data.test_limit = 100;
    p.sched.base_lr = 0.05f;
    p.optim.momentum = 0.9f;
    p.data.prefetch = 1;
    p.run.seed = 3;
    return p;
}

/* dp_trainer_init, then the fault f armed (f NULL or kind 0: none) */
static inline int init_faulty(struct dp_trainer **t, const struct dp_train_params *p, const struct dp_fault *f) {
    int rc = dp_trainer_init(t, p);
    if (!rc && f && f->kind && (rc = dp__trainer_set_fault(*t, f))) dp_trainer_free(*t), *t = NULL;
    return rc;
}

/* Trains with fault f (NULL: none) and returns a copy of the parameters then
 * the buffers (caller frees). */
static inline float *train_faulty(const struct dp_train_params *p, const struct dp_fault *f, int64_t *n) {
    struct dp_trainer *t;
    ASSERT_OK(init_faulty(&t, p, f));
    ASSERT_OK(dp_trainer_run(t));
    const struct dp_model *m = dp_trainer_model(t);
    *n = m->num_params + m->num_buffers;
    float *out = malloc(sizeof(float) * (size_t)*n);
    memcpy(out, dp_trainer_replica(t)->params, sizeof(float) * (size_t)m->num_params);
    memcpy(out + m->num_params, dp_trainer_replica(t)->buffers, sizeof(float) * (size_t)m->num_buffers);
    dp_trainer_free(t);
    return out;
}
static inline float *train(const struct dp_train_params *p, int64_t *n) { return train_faulty(p, NULL, n); }

/* A token file for the text tests: 6000 tokens of words drawn by an LCG from `seed` (text with some
 * structure to learn), written into the test's tmpdir; its path (until the next call). */
static inline const char *words_token_file(uint32_t seed) {
    static char path[512];
    static const char *words[] = {"the ", "cat ", "sat ", "on ", "a ", "mat. ", "dog ", "ran ", "far ", "away. "};
    enum { N = 6000 };
    uint16_t *tok = malloc(N * sizeof *tok);
    uint32_t s = seed;
    int64_t n = 0;
    while (n < N) {
        s = s * 1664525u + 1013904223u;
        for (const char *w = words[(s >> 16) % 10]; *w && n < N; w++) tok[n++] = (uint8_t)*w;
    }
    snprintf(path, sizeof path, "%s/tokens.bin", dp_test_tmpdir());
    ASSERT_OK(dp_tokens_write(path, tok, N, 256));
    free(tok);
    return path;
}

/* The text tests' data and shape: gpt `model` on words_token_file(seed), 4 steps of 8 windows per
 * epoch, 40 validation windows, `workers` workers, `epochs` epochs (the recipe is the caller's). */
static inline struct dp_train_params gpt_words_params(const char *model, uint32_t seed, int workers, int64_t epochs) {
    struct dp_train_params p = dp_train_default_params();
    p.data.data_dir = words_token_file(seed);
    p.run.model = model;
    p.dp.workers = workers;
    p.run.batch = 8;
    p.data.train_limit = 32;
    p.data.test_limit = 40;
    p.run.epochs = epochs;
    return p;
}

/* The split-model tests' recipe (test_pipe.c, test_tp.c): gpt_words_params on words_token_file(777),
 * AdamW with weight decay, cosine with warm-up. */
static inline struct dp_train_params gpt_split_params(const char *model, int workers, int64_t epochs) {
    struct dp_train_params p = gpt_words_params(model, 777u, workers, epochs);
    p.optim = dp_optim_default_params();
    p.optim.kind = DP_OPTIM_ADAMW;
    p.optim.weight_decay = 0.01f;
    p.sched.kind = DP_SCHED_COSINE;
    p.sched.base_lr = 3e-3f;
    p.sched.warmup_steps = 2;
    p.data.prefetch = 0;
    p.run.seed = 11;
    return p;
}

/* p made one plain SGD step of lr 1 (its parameters after it: the start less the gradient), for
 * the tests that compare gradients layer by layer. */
static inline void one_sgd_step(struct dp_train_params *p) {
    p->optim = dp_optim_default_params();
    p->sched = (struct dp_sched){.kind = DP_SCHED_CONSTANT, .base_lr = 1.0f};
    p->run.max_steps = 1;
}

/* Trains p (train) and asserts the parameters are ref's n0 floats, bit for bit; `what` names the
 * run in the line printed. */
static inline void expect_same_bits(const struct dp_train_params *p, const float *ref, int64_t n0, const char *what) {
    int64_t n;
    float *got = train(p, &n);
    int same = n == n0 && memcmp(ref, got, sizeof(float) * (size_t)n) == 0;
    fprintf(stderr, "    %s, P=%d --zero %d: %s\n", what, p->dp.workers, p->dp.zero, same ? "same bits" : "differs");
    free(got);
    ASSERT_TRUE(same);
}

/* The library's comparison (dp_rel_diff: NaN or Inf counts as a difference),
 * the same one `dptrain ckpt diff` uses. */
static inline double rel_diff(const float *a, const float *b, int64_t n) { return dp_rel_diff(a, b, n); }

/* Deterministic mode on recipe p (its det_chunk set): the parameters (and buffers) are the
 * same bits for every worker count 1..max_workers (also counts that do not divide the
 * batch), and within `tol` of ordinary training: float rounding (1e-5), or more for a model
 * whose deterministic mode trains differently (BatchNorm: per chunk).  `what` names the run
 * in the printed difference. */
static inline void expect_deterministic_within(struct dp_train_params p, int max_workers, const char *what,
                                               double tol) {
    p.dp.workers = 1;
    p.dp.deterministic = 1;
    int64_t n1, n;
    float *ref = train(&p, &n1);
    for (int P = 2; P <= max_workers; P++) {
        p.dp.workers = P;
        float *got = train(&p, &n);
        ASSERT_EQ(n, n1);
        ASSERT_TRUE(memcmp(ref, got, sizeof(float) * (size_t)n) == 0);
        free(got);
    }
    p.dp.workers = 1;
    p.dp.deterministic = 0;
    float *plain = train(&p, &n);
    double d = rel_diff(plain, ref, n);
    fprintf(stderr, "    %s deterministic vs ordinary: %.2e\n", what, d);
    ASSERT_TRUE(d <= tol);
    free(plain), free(ref);
}
static inline void expect_deterministic(struct dp_train_params p, int max_workers, const char *what) {
    expect_deterministic_within(p, max_workers, what, 1e-5);
}

/* The bytes of a file (caller frees). */
static inline char *read_whole_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    ASSERT_TRUE(f != NULL);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    ASSERT_TRUE(b && fread(b, 1, (size_t)len, f) == (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

#endif
