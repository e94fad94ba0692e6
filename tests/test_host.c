/* The trainer from another language (src/train/host.c; the Python package's door): arrays in
 * memory read as the same arrays in an .npy are, their refusals, the events as JSON, and a run
 * on arrays whose predictions, evaluation, parameters and checkpoint agree. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dp/train.h"
#include "test.h"

/* X: (N, 2, 3) float32 ramps; y: (N) int64 classes 0..2 */
enum { N = 6 };
static void fill(float *x, int64_t *y) {
    for (int i = 0; i < N * 6; i++) x[i] = (float)i * 0.25f - 2;
    for (int i = 0; i < N; i++) y[i] = i % 3;
}

static struct dp_array arr(const void *data, int dtype, int ndim, int64_t d0, int64_t d1, int64_t d2) {
    struct dp_array a = {.data = data, .dtype = dtype, .ndim = ndim, .shape = {d0, d1, d2}};
    return a;
}

TEST(host_arrays_like_npy) {
    float x[N * 6];
    int64_t y[N];
    fill(x, y);
    char xp[512], yp[512];
    int64_t xs[] = {N, 2, 3}, ys[] = {N};
    ASSERT_OK(dp_npy_write(dp_test_path(xp, "x.npy"), DP_NPY_F32, 3, xs, x));
    ASSERT_OK(dp_npy_write(dp_test_path(yp, "y.npy"), DP_NPY_I64, 1, ys, y));
    struct dp_dataset a, b;
    ASSERT_OK(dp_dataset_open_npy(&a, xp, yp, NULL));
    struct dp_array ax = arr(x, DP_NPY_F32, 3, N, 2, 3), ay = arr(y, DP_NPY_I64, 1, N, 0, 0);
    ASSERT_OK(dp_dataset_open_arrays(&b, &ax, &ay, "X", "y", NULL));
    ASSERT_TRUE(a.n == b.n && a.C == b.C && a.H == b.H && a.W == b.W && a.num_classes == b.num_classes);
    float mean[] = {0.5f}, std[] = {2.0f};
    ASSERT_OK(dp_dataset_normalize_channels(&a, mean, std));
    ASSERT_OK(dp_dataset_normalize_channels(&b, mean, std));
    for (int64_t i = 0; i < N; i++) {
        float sa[6], sb[6];
        dp_dataset_read(&a, i, sa), dp_dataset_read(&b, i, sb);
        ASSERT_TRUE(memcmp(sa, sb, sizeof sa) == 0);
        ASSERT_EQ(a.y[i], b.y[i]);
    }
    dp_dataset_free(&a), dp_dataset_free(&b);
    /* no labels: every sample class 0 (a prediction's inputs) */
    ASSERT_OK(dp_dataset_open_arrays(&b, &ax, NULL, "X", "y", NULL));
    ASSERT_TRUE(b.y && b.y[N - 1] == 0 && b.num_classes == 1);
    dp_dataset_free(&b);
}

TEST(host_arrays_refused) {
    float x[N * 6];
    int64_t y[N];
    fill(x, y);
    struct dp_dataset ds;
    struct dp_array ax = arr(x, DP_NPY_F32, 3, N, 2, 3), ay = arr(y, DP_NPY_I64, 1, N, 0, 0);
    struct dp_array bad = ax;
    bad.dtype = 42;
    ASSERT_ERR(dp_dataset_open_arrays(&ds, &bad, &ay, "X", "y", NULL), DP_EINVAL, "dtype code 42");
    bad = ax, bad.ndim = 0;
    ASSERT_ERR(dp_dataset_open_arrays(&ds, &bad, &ay, "X", "y", NULL), DP_EINVAL, "0 dimensions");
    bad = ax, bad.ndim = 5, bad.shape[3] = 1, bad.shape[4] = 1;
    ASSERT_ERR(dp_dataset_open_arrays(&ds, &bad, &ay, "X", "y", NULL), DP_EINVAL, "X: features must have shape");
    struct dp_array short_y = arr(y, DP_NPY_I64, 1, N - 1, 0, 0);
    ASSERT_ERR(dp_dataset_open_arrays(&ds, &ax, &short_y, "X", "y", NULL), DP_EINVAL, "5 labels");
    struct dp_array fy = arr(x, DP_NPY_F32, 1, N, 0, 0);
    ASSERT_ERR(dp_dataset_open_arrays(&ds, &ax, &fy, "X", "y", NULL), DP_EINVAL, "regression");
    y[2] = -4;
    ASSERT_ERR(dp_dataset_open_arrays(&ds, &ax, &ay, "X", "y", NULL), DP_EINVAL, "y: label 2 is -4");
}

TEST(host_event_json) {
    struct dp_event ev = {.kind = DP_EVENT_EPOCH, .epoch = 2, .step = 40, .lr = 0.05f, .loss = 0.5,
                          .train_acc = 0.75, .test_loss = NAN, .test_acc = NAN, .val_bpb = NAN, .slow_rank = -1};
    char buf[2048];
    int n = dp_event_json(&ev, buf, sizeof buf);
    ASSERT_TRUE(n > 0 && (size_t)n == strlen(buf));
    ASSERT_TRUE(strstr(buf, "{\"kind\": \"epoch\", \"epoch\": 2, \"step\": 40, \"lr\": 0.05") == buf);
    ASSERT_TRUE(strstr(buf, "\"train_acc\": 0.750000") && !strstr(buf, "test_acc"));
    ev.test_loss = 0.25, ev.test_acc = 0.5;
    ASSERT_TRUE(dp_event_json(&ev, buf, sizeof buf) > 0 && strstr(buf, "\"test_loss\": 0.250000, \"test_acc\": 0.500000"));
    ASSERT_ERR(dp_event_json(&ev, buf, 40), DP_EINVAL, "not enough");
    struct dp_event ck = {.kind = DP_EVENT_CHECKPOINT, .step = 3, .path = "a\"b"};
    ASSERT_TRUE(dp_event_json(&ck, buf, sizeof buf) > 0 && strstr(buf, "\"path\": \"a\\\"b\"}"));
}

/* A run on arrays: 2 workers, the predictions' argmax scores what evaluate scores, the
 * parameters are the replica's, a checkpoint of it loads with the same hash. */
/* The host tests' table: M samples of D features, class 1 where the first two sum above 0. */
enum { M = 128, D = 4 };
static void host_table(float *x, int32_t *y) {
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < D; j++) x[i * D + j] = (float)((i * 7 + j * 13) % 17) - 8;
        y[i] = x[i * D] + x[i * D + 1] > 0;
    }
}

/* mlp:hidden=8 on the table (ax, ay), batches of 16, 2 workers, deterministic, `epochs` epochs,
 * --zero `zero`. */
static struct dp_train_params *host_params(const char *epochs, const char *zero, const struct dp_array *ax,
                                           const struct dp_array *ay) {
    struct dp_train_params *p = dp_train_params_new();
    ASSERT_TRUE(p != NULL);
    ASSERT_OK(dp_train_option_set(p, "model", "mlp:hidden=8"));
    ASSERT_OK(dp_train_option_set(p, "epochs", epochs));
    ASSERT_OK(dp_train_option_set(p, "batch", "16"));
    ASSERT_OK(dp_train_option_set(p, "workers", "2"));
    ASSERT_OK(dp_train_option_set(p, "zero", zero));
    ASSERT_OK(dp_train_option_set(p, "deterministic", NULL));
    ASSERT_OK(dp_train_params_set_array(p, "x", ax));
    ASSERT_OK(dp_train_params_set_array(p, "y", ay));
    return p;
}

TEST(host_train_predict) {
    float *x = malloc(sizeof(float) * M * D), *out = malloc(sizeof(float) * M * 2);
    int32_t *y = malloc(sizeof(int32_t) * M);
    ASSERT_TRUE(x && y && out);
    host_table(x, y);
    struct dp_array ax = arr(x, DP_NPY_F32, 2, M, D, 0), ay = arr(y, DP_NPY_I32, 1, M, 0, 0);
    struct dp_train_params *p = host_params("3", "0", &ax, &ay);
    ASSERT_ERR(dp_train_params_set_array(p, "z", &ay), DP_EINVAL, "'z'");
    struct dp_trainer *t;
    ASSERT_OK(dp_trainer_init(&t, p));
    ASSERT_OK(dp_trainer_run(t));
    ASSERT_EQ(dp_trainer_outputs(t), 2);
    ASSERT_EQ(dp_trainer_regression(t), 0);
    ASSERT_ERR(dp_trainer_predict(t, &ax, out, M), DP_EINVAL, "do not fit");
    ASSERT_OK(dp_trainer_predict(t, &ax, out, M * 2));
    int correct = 0;
    for (int i = 0; i < M; i++) correct += (out[2 * i + 1] > out[2 * i]) == y[i];
    double acc, loss;
    ASSERT_OK(dp_trainer_evaluate_arrays(t, &ax, &ay, &acc, &loss));
    ASSERT_FEQ(acc, (double)correct / M);
    ASSERT_TRUE(isfinite(loss));
    struct dp_array wrong = arr(x, DP_NPY_F32, 2, M / 2, 2 * D, 0);
    ASSERT_ERR(dp_trainer_predict(t, &wrong, out, M * 2), DP_EINVAL, "the model's are");
    /* the parameters: fc1.weight (8, D) first, views into the replica */
    ASSERT_EQ(dp_trainer_param_count(t), 4);
    const char *name;
    int ndim, is_buffer;
    int64_t shape[4];
    float *data;
    ASSERT_OK(dp_trainer_param_info(t, 0, &name, &ndim, shape, &data, &is_buffer));
    ASSERT_TRUE(!strcmp(name, "fc1.weight") && ndim == 2 && shape[0] == 8 && shape[1] == D && !is_buffer);
    ASSERT_TRUE(data == dp_trainer_replica(t)->params);
    ASSERT_ERR(dp_trainer_param_info(t, 4, &name, &ndim, shape, &data, &is_buffer), DP_EINVAL, "parameter 4");
    char ck[512];
    ASSERT_OK(dp_trainer_save(t, dp_test_path(ck, "m.ckpt")));
    uint64_t hash = dp_trainer_param_hash(t);
    dp_trainer_free(t);
    dp_train_params_free(p);
    /* the checkpoint's settings and model, as Model.load takes them */
    p = dp_train_params_new();
    int64_t epoch, in[3], outputs;
    int reg;
    ASSERT_OK(dp_train_params_from_ckpt(p, ck, &epoch, in, &outputs, &reg));
    ASSERT_TRUE(epoch == 3 && in[0] == 1 && in[1] == 1 && in[2] == D && outputs == 2 && reg == 0);
    ASSERT_TRUE(p->run.batch == 16 && p->run.model == NULL && !strcmp(p->io.resume, ck));
    ASSERT_OK(dp_train_option_set(p, "epochs", "3"));
    ASSERT_OK(dp_train_params_set_array(p, "x", &ax));
    ASSERT_OK(dp_trainer_init(&t, p));
    ASSERT_TRUE(dp_trainer_param_hash(t) == hash);
    double acc2, loss2;
    ASSERT_OK(dp_trainer_evaluate_arrays(t, &ax, &ay, &acc2, &loss2));
    ASSERT_FEQ(acc2, acc);
    ASSERT_FEQ(loss2, loss);
    dp_trainer_free(t);
    dp_train_params_free(p);
    free(x), free(y), free(out);
}

/* ZeRO 3 on 2 workers: before the run each worker holds shards, so predict and the parameters
 * are refused; the run's end gathers them whole into worker 0, and then predict, evaluate and
 * the parameter views give the plain run's bits (deterministic mode: the same model). */
TEST(host_zero3_predict_after_run) {
    float *x = malloc(sizeof(float) * M * D), *out[2] = {malloc(sizeof(float) * M * 2), malloc(sizeof(float) * M * 2)};
    int32_t *y = malloc(sizeof(int32_t) * M);
    ASSERT_TRUE(x && y && out[0] && out[1]);
    host_table(x, y);
    struct dp_array ax = arr(x, DP_NPY_F32, 2, M, D, 0), ay = arr(y, DP_NPY_I32, 1, M, 0, 0);
    double acc[2], loss[2];
    float *w0[2] = {NULL, NULL};
    for (int z = 0; z < 2; z++) {
        struct dp_train_params *p = host_params("2", z ? "3" : "0", &ax, &ay);
        struct dp_trainer *t;
        ASSERT_OK(dp_trainer_init(&t, p));
        const char *name;
        int ndim, is_buffer;
        int64_t shape[4];
        float *data;
        if (z) {
            ASSERT_ERR(dp_trainer_predict(t, &ax, out[z], M * 2), DP_ENOTSUP, "until the run ends");
            ASSERT_OK(dp_trainer_param_info(t, 0, &name, &ndim, shape, &data, &is_buffer));
            ASSERT_TRUE(data == NULL);
        }
        ASSERT_OK(dp_trainer_run(t));
        ASSERT_OK(dp_trainer_predict(t, &ax, out[z], M * 2));
        ASSERT_OK(dp_trainer_evaluate_arrays(t, &ax, &ay, &acc[z], &loss[z]));
        ASSERT_OK(dp_trainer_param_info(t, 0, &name, &ndim, shape, &data, &is_buffer));
        ASSERT_TRUE(data != NULL);
        w0[z] = malloc(sizeof(float) * 8 * D);
        memcpy(w0[z], data, sizeof(float) * 8 * D);
        dp_trainer_free(t);
        dp_train_params_free(p);
    }
    ASSERT_TRUE(memcmp(out[0], out[1], sizeof(float) * M * 2) == 0);
    ASSERT_TRUE(memcmp(w0[0], w0[1], sizeof(float) * 8 * D) == 0);
    ASSERT_TRUE(acc[0] == acc[1] && loss[0] == loss[1]);
    free(x), free(y), free(out[0]), free(out[1]), free(w0[0]), free(w0[1]);
}
