/* Deterministic mode's BatchNorm (dp_ctx.stat_acc, src/nn/batchnorm.c): each chunk normalised
 * with its own statistics, the running statistics untouched while the chunks run, the chunks'
 * fixed-point sums the same bits in any order, and dp_model_apply_stats moving every
 * BatchNorm (those inside residual blocks too) once towards their mean. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dp/nn.h"
#include "test.h"

/* resnet:8,4 on 1 x 8 x 8: a stem BatchNorm and residual blocks with BatchNorms and a
 * downsampling shortcut */
static void build(struct dp_model **m, struct dp_replica *r, int64_t B) {
    ASSERT_OK(dp_model_from_spec(m, "resnet:8,4", 1, 8, 8));
    ASSERT_OK(dp_replica_init(r, *m, B));
    dp_model_init_params(*m, r, 7);
}

static void fill_batch(float *x, int32_t *tg, int64_t *idx, int64_t B, int64_t per) {
    uint64_t s = 12345;
    for (int64_t i = 0; i < B * per; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    for (int64_t b = 0; b < B; b++) tg[b] = (int32_t)(b % 10), idx[b] = b;
}

/* Runs chunk [c0, c0 + n) of the batch, its statistics into acc */
static void run_chunk(const struct dp_model *m, struct dp_replica *r, const float *x, const int32_t *tg,
                      const int64_t *idx, int64_t c0, int64_t n, int64_t per, double *acc) {
    struct dp_batch b = {.B = n, .x = x + c0 * per, .targets = tg + c0, .sample_idx = idx + c0};
    struct dp_pass pass = {.training = 1, .backward = 1, .seed = 1, .stat_acc = acc};
    ASSERT_OK(dp_model_run(m, r, &b, &pass));
}

TEST(det_bn_chunk_sums_any_order_then_applied) {
    struct dp_model *m;
    struct dp_replica r;
    const int64_t B = 8, per = 64;
    build(&m, &r, B);
    const int64_t nb = m->num_buffers;
    ASSERT_TRUE(nb > 0);
    float *x = malloc(sizeof(float) * (size_t)(B * per)), *before = malloc(sizeof(float) * (size_t)nb);
    int32_t tg[8];
    int64_t idx[8];
    fill_batch(x, tg, idx, B, per);
    memcpy(before, r.buffers, sizeof(float) * (size_t)nb);
    double *a1 = calloc((size_t)nb, sizeof(double)), *a2 = calloc((size_t)nb, sizeof(double));
    /* chunks {0..3} then {4..7}; then the other order, as another worker split would give */
    run_chunk(m, &r, x, tg, idx, 0, 4, per, a1);
    run_chunk(m, &r, x, tg, idx, 4, 4, per, a1);
    ASSERT_TRUE(memcmp(before, r.buffers, sizeof(float) * (size_t)nb) == 0); /* untouched while the chunks run */
    run_chunk(m, &r, x, tg, idx, 4, 4, per, a2);
    run_chunk(m, &r, x, tg, idx, 0, 4, per, a2);
    ASSERT_TRUE(memcmp(a1, a2, sizeof(double) * (size_t)nb) == 0);
    /* every BatchNorm: its count slot holds 2 chunks, its sums integers */
    int bns = 0;
    for (int i = 0; i < m->nparams; i++) {
        const struct dp_param_info *p = &m->params[i];
        if (!p->is_buffer || !strstr(p->name, "num_batches_tracked")) continue;
        ASSERT_TRUE(a1[p->offset] == 2.0);
        bns++;
    }
    ASSERT_TRUE(bns >= 4);
    for (int64_t i = 0; i < nb; i++) ASSERT_TRUE(a1[i] == nearbyint(a1[i]));
    /* applied: running = (1 - 0.1) running + 0.1 mean over the chunks, the counter one step on */
    dp_model_apply_stats(m, r.buffers, a1);
    const struct dp_param_info *rm = dp_model_find_param(m, "bn1.running_mean");
    const struct dp_param_info *rv = dp_model_find_param(m, "bn1.running_var");
    const struct dp_param_info *nt = dp_model_find_param(m, "bn1.num_batches_tracked");
    ASSERT_TRUE(rm && rv && nt);
    for (int64_t c = 0; c < rm->count; c++) {
        double mean = a1[rm->offset + c] / (DP_STAT_FIXED_SCALE * 2);
        double var = a1[rv->offset + c] / (DP_STAT_FIXED_SCALE * 2);
        ASSERT_NEAR(r.buffers[rm->offset + c], 0.1 * mean, 1e-6);
        ASSERT_NEAR(r.buffers[rv->offset + c], 0.9 + 0.1 * var, 1e-6);
        ASSERT_TRUE(var > 0);
    }
    ASSERT_TRUE(r.buffers[nt->offset] == 1.0f);
    /* the BatchNorms inside the residual blocks moved too */
    int moved = 0;
    for (int i = 0; i < m->nparams; i++) {
        const struct dp_param_info *p = &m->params[i];
        if (p->is_buffer && strstr(p->name, "layer") && strstr(p->name, "running_mean"))
            moved += memcmp(before + p->offset, r.buffers + p->offset, sizeof(float) * (size_t)p->count) != 0;
    }
    ASSERT_TRUE(moved >= 2);
    free(x), free(before), free(a1), free(a2);
    dp_replica_free(&r);
    dp_model_free(m);
}

/* A chunk's gradient with stat_acc is the gradient of that chunk run alone (its own
 * statistics): the same bits, whatever a stat_sync would have summed. */
static int never_called(void *arg, double *buf, int64_t n) {
    (void)arg, (void)buf, (void)n;
    return DP_EINVAL;
}

TEST(det_bn_chunk_uses_its_own_statistics) {
    struct dp_model *m;
    struct dp_replica r;
    const int64_t B = 4, per = 64;
    build(&m, &r, B);
    float *x = malloc(sizeof(float) * (size_t)(B * per));
    int32_t tg[4];
    int64_t idx[4];
    fill_batch(x, tg, idx, B, per);
    struct dp_batch b = {.B = B, .x = x, .targets = tg, .sample_idx = idx};
    const size_t ng = sizeof(float) * (size_t)m->num_params;
    memset(r.grads, 0, ng);
    struct dp_pass plain = {.training = 1, .backward = 1, .seed = 1};
    ASSERT_OK(dp_model_run(m, &r, &b, &plain));
    float *g = malloc(ng);
    memcpy(g, r.grads, ng);
    memset(r.grads, 0, ng);
    double *acc = calloc((size_t)m->num_buffers, sizeof(double));
    struct dp_pass det = {.training = 1, .backward = 1, .seed = 1, .stat_acc = acc, .stat_sync = never_called};
    ASSERT_OK(dp_model_run(m, &r, &b, &det));
    ASSERT_TRUE(memcmp(g, r.grads, ng) == 0 && det.loss_sum == plain.loss_sum);
    free(x), free(g), free(acc);
    dp_replica_free(&r);
    dp_model_free(m);
}
