/* Builds a model through the C API and trains it data-parallel with the
 * library's trainer: P worker threads, one replica each, gradients averaged
 * every step, deterministic (the same bits for any P).  The run folder gets
 * what `dptrain train --out` writes: `dptrain eval --ckpt OUT/checkpoint.bin`
 * and `dptrain ckpt export` rebuild the model from the checkpoint alone.
 *
 *   make && ./build/examples/custom_model [DATA_DIR] [MAX_STEPS] [WORKERS] [OUT_DIR]
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "dp/data.h"
#include "dp/nn.h"
#include "dp/train.h"

static int fail(int rc) {
    fprintf(stderr, "custom_model: %s\n", dp_errmsg()[0] ? dp_errmsg() : dp_strerror(rc));
    return 1;
}

/* One replica: conv 1->16 5x5 stride 2 (14x14), then an MLP head with GELU
 * and dropout.  Every process calls it once; its workers share the layers. */
static int build(struct dp_model **out, void *arg) {
    (void)arg;
    struct dp_shape in = {3, {1, 28, 28, 0}};
    struct dp_model *m;
    int rc = dp_model_init(&m, "custom", &in);
    if (rc) return rc;
    if ((rc = dp_conv2d(m, "conv", 16, 5, 2, 2, 1)) || (rc = dp_relu(m, "act0")) ||
        (rc = dp_flatten(m, "flatten")) || (rc = dp_linear(m, "fc1", 256, 1)) ||
        (rc = dp_gelu(m, "act1")) || (rc = dp_dropout(m, "drop", 0.1f)) ||
        (rc = dp_linear(m, "fc2", 10, 1)) || (rc = dp_model_finalize(m))) {
        dp_model_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* Every 100th step's loss, from the trainer's events; *arg counts the steps. */
static void on_event(void *arg, const struct dp_event *ev) {
    if (ev->kind != DP_EVENT_STEP) return;
    *(int64_t *)arg = ev->step;
    if ((ev->step - 1) % 100 == 0) printf("step %4lld  loss %.4f\n", (long long)(ev->step - 1), ev->loss);
}

int main(int argc, char **argv) {
    struct dp_train_params tp = dp_train_default_params();
    tp.data.data_dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
    tp.run.max_steps = argc > 2 ? atoll(argv[2]) : 0;
    tp.dp.workers = argc > 3 ? atoi(argv[3]) : 2;
    tp.io.out_dir = argc > 4 ? argv[4] : NULL;
    tp.io.overwrite = 1;
    tp.run.model = NULL;
    tp.run.model_build = build;
    tp.run.epochs = 1;
    tp.run.batch = 128;
    tp.dp.deterministic = 1;
    tp.optim.kind = DP_OPTIM_ADAMW;
    tp.optim.weight_decay = 0.01f;
    tp.sched.base_lr = 1e-3f;
    int64_t steps = 0;
    tp.io.on_event = on_event;
    tp.io.event_arg = &steps;

    struct dp_trainer *t;
    int rc = dp_trainer_init(&t, &tp);
    if (rc) return fail(rc);
    const struct dp_model *m = dp_trainer_model(t);
    printf("model: %d layers, %lld parameters\n", m->nlayers, (long long)m->num_params);
    if ((rc = dp_trainer_run(t))) return fail(rc);

    struct dp_dataset train, test;
    double acc, loss;
    if ((rc = dp_dataset_load_dir(&train, &test, tp.data.data_dir))) return fail(rc);
    dp_dataset_normalize(&test, tp.data.norm_mean, tp.data.norm_std);
    if ((rc = dp_trainer_evaluate(t, &test, 0, &acc, &loss))) return fail(rc);
    printf("test accuracy after %lld steps: %.2f%%\n", (long long)steps, 100 * acc);
    printf("workers: %d, param hash %016" PRIx64 "\n", tp.dp.workers, dp_trainer_param_hash(t));
    dp_dataset_free(&train);
    dp_dataset_free(&test);
    dp_trainer_free(t);
    return 0;
}
