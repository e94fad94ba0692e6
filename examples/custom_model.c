/* Builds a model through the C API and trains it for one epoch on
 * Fashion-MNIST with AdamW, without the trainer: the whole loop in view.
 *
 *   make && ./build/examples/custom_model [DATA_DIR] [MAX_STEPS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/data.h"
#include "dp/nn.h"
#include "dp/optim.h"

static int fail(int rc) {
    fprintf(stderr, "custom_model: %s\n", dp_errmsg()[0] ? dp_errmsg() : dp_strerror(rc));
    return 1;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
    struct dp_dataset train, test;
    int rc = dp_dataset_load_dir(&train, &test, dir);
    if (rc) return fail(rc);
    dp_dataset_normalize(&train, 0.2860f, 0.3530f);
    dp_dataset_normalize(&test, 0.2860f, 0.3530f);

    /* conv 1->16 5x5 stride 2 (14x14), LayerNorm-free MLP head with GELU and dropout. */
    struct dp_shape in = {3, {1, 28, 28, 0}};
    struct dp_model *m;
    if ((rc = dp_model_init(&m, "custom", &in))) return fail(rc);
    if ((rc = dp_conv2d(m, "conv", 16, 5, 2, 2, 1)) || (rc = dp_relu(m, "act0")) ||
        (rc = dp_flatten(m, "flatten")) || (rc = dp_linear(m, "fc1", 256, 1)) ||
        (rc = dp_gelu(m, "act1")) || (rc = dp_dropout(m, "drop", 0.1f)) ||
        (rc = dp_linear(m, "fc2", 10, 1)) || (rc = dp_model_finalize(m)))
        return fail(rc);
    printf("model: %d layers, %lld parameters\n", m->nlayers, (long long)m->num_params);

    const int64_t batch = 128;
    struct dp_replica r;
    if ((rc = dp_replica_init(&r, m, batch))) return fail(rc);
    dp_model_init_params(m, &r, 42);
    struct dp_optim_params op = dp_optim_default_params();
    op.kind = DP_OPTIM_ADAMW;
    op.weight_decay = 0.01f;
    struct dp_optim opt;
    if ((rc = dp_optim_init(&opt, &op, m->num_params))) return fail(rc);

    struct dp_loader_params lp = dp_loader_default_params();
    lp.batch = batch;
    lp.shuffle = 1;
    lp.seed = 42;
    struct dp_loader *loader;
    if ((rc = dp_loader_init(&loader, &train, &lp))) return fail(rc);
    int64_t steps = dp_loader_steps_per_epoch(loader);
    if (argc > 2 && atoll(argv[2]) > 0 && atoll(argv[2]) < steps) steps = atoll(argv[2]);
    for (int64_t s = 0; s < steps; s++) {
        const struct dp_loader_batch *lb;
        if ((rc = dp_loader_next(loader, &lb))) return fail(rc);
        struct dp_batch b = {.B = lb->B, .x = lb->x, .targets = lb->y, .sample_idx = lb->idx};
        memset(r.grads, 0, sizeof(float) * (size_t)m->num_params);
        struct dp_pass pass = {.training = 1, .backward = 1, .seed = 42};
        if ((rc = dp_model_run(m, &r, &b, &pass))) return fail(rc);
        if ((rc = dp_optim_step(&opt, r.params, r.grads, m->num_params, 1e-3f))) return fail(rc);
        if (s % 100 == 0) printf("step %4lld  loss %.4f\n", (long long)s, pass.loss_sum / (double)b.B);
    }

    int64_t correct = 0;
    for (int64_t i = 0; i < test.n; i += batch) {
        int64_t B = test.n - i < batch ? test.n - i : batch;
        struct dp_batch b = {.B = B, .x = test.x + i * 784, .targets = test.y + i};
        struct dp_pass pass = {.training = 0};
        if ((rc = dp_model_run(m, &r, &b, &pass))) return fail(rc);
        correct += pass.correct;
    }
    printf("test accuracy after %lld steps: %.2f%%\n", (long long)steps, 100.0 * (double)correct / (double)test.n);

    dp_loader_free(loader);
    dp_optim_free(&opt);
    dp_replica_free(&r);
    dp_model_free(m);
    dp_dataset_free(&train);
    dp_dataset_free(&test);
    return 0;
}
