/* Parameter-server pushes per second against the shard count (docs/ddp.md
 * "Parameter server and bounded staleness").
 *
 *   ./build/bench/ps_shards [workers] [reps] [pushes per worker] [model]
 *
 * P threads push compute-free gradients of the model's size (cnn by
 * default) to a server of S = 1, 2, 4 shards with AdamW, async, as fast as
 * they can: each push is the optimizer step on every shard plus the copy of
 * the fresh slice back (dp_ps_push).  Prints, per S, the median over reps of
 * pushes/s (all workers together) and every repetition; the S values are
 * interleaved within each repetition so that a change of machine load hits
 * them alike. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/core.h"
#include "dp/nn.h"
#include "dp/ps.h"

struct arg {
    struct dp_ps *ps;
    int rank;
    int64_t n, pushes;
    float *g, *rep;
    int rc;
};

static void *worker(void *p) {
    struct arg *a = p;
    int64_t st;
    a->rc = dp_ps_pull(a->ps, a->rank, 0, a->rep);
    for (int64_t k = 0; !a->rc && k < a->pushes; k++) a->rc = dp_ps_push(a->ps, a->rank, a->g, 1, k, a->rep, &st);
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One timed run: P threads, `pushes` each; returns pushes/s or < 0. */
static double run(int P, int S, int64_t n, int64_t pushes, const float *init, float *g, float **rep) {
    struct dp_ps_params pp = {.shards = S, .workers = P, .staleness = -1, .optim = dp_optim_default_params(),
                              .lr_div = P};
    pp.optim.kind = DP_OPTIM_ADAMW;
    pp.sched.kind = DP_SCHED_CONSTANT;
    pp.sched.base_lr = 1e-4f;
    struct dp_ps *ps;
    if (dp_ps_init(&ps, &pp, n)) return -1;
    dp_ps_set_state(ps, init, NULL, 0, 0);
    struct arg a[64];
    pthread_t th[64];
    double t0 = dp_time();
    for (int r = 0; r < P; r++) {
        a[r] = (struct arg){.ps = ps, .rank = r, .n = n, .pushes = pushes, .g = g, .rep = rep[r]};
        pthread_create(&th[r], NULL, worker, &a[r]);
    }
    int bad = 0;
    for (int r = 0; r < P; r++) pthread_join(th[r], NULL), bad |= a[r].rc != 0;
    double dt = dp_time() - t0;
    dp_ps_free(ps);
    return bad ? -1 : (double)(P * pushes) / dt;
}

int main(int argc, char **argv) {
    int P = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 2 ? atoi(argv[2]) : 5;
    int64_t pushes = argc > 3 ? atoll(argv[3]) : 200;
    const char *spec = argc > 4 ? argv[4] : "cnn";
    if (P < 1 || P > 64 || reps < 1 || reps > 101 || pushes < 1) {
        fprintf(stderr, "usage: ps_shards [workers 1..64] [reps 1..101] [pushes per worker] [model]\n");
        return 2;
    }
    struct dp_model *m;
    if (dp_model_from_spec(&m, spec, 1, 28, 28)) {
        fprintf(stderr, "ps_shards: %s\n", dp_errmsg());
        return 1;
    }
    int64_t n = m->num_params;
    dp_model_free(m);
    float *init = dp_malloc_big(sizeof(float) * (size_t)n), *g = dp_malloc_big(sizeof(float) * (size_t)n);
    float *rep[64];
    for (int r = 0; r < P; r++) rep[r] = dp_malloc_big(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) init[i] = 0.01f * (float)(i % 97), g[i] = 1e-3f * (float)(i % 13) - 6e-3f;
    enum { NS = 3 };
    const int shards[NS] = {1, 2, 4};
    double v[NS][101];
    printf("model %s (%lld parameters, %.1f MB), %d workers, %lld pushes each, AdamW, %d reps\n", spec,
           (long long)n, 4e-6 * (double)n, P, (long long)pushes, reps);
    run(P, 1, n, pushes / 4 + 1, init, g, rep); /* warm-up: fault the pages in */
    for (int k = 0; k < reps; k++)
        for (int s = 0; s < NS; s++)
            if ((v[s][k] = run(P, shards[s], n, pushes, init, g, rep)) < 0) {
                fprintf(stderr, "ps_shards: %s\n", dp_errmsg());
                return 1;
            }
    printf("shards\tpushes/s (median)\tvs 1 shard\trepetitions\n");
    double base = 0;
    for (int s = 0; s < NS; s++) {
        double sorted[101];
        memcpy(sorted, v[s], sizeof(double) * (size_t)reps);
        qsort(sorted, (size_t)reps, sizeof(double), cmp);
        double med = sorted[reps / 2];
        if (s == 0) base = med;
        printf("%d\t%.0f\t%.2fx\t", shards[s], med, med / base);
        for (int k = 0; k < reps; k++) printf("%s%.0f", k ? " " : "", v[s][k]);
        printf("\n");
    }
    for (int r = 0; r < P; r++) dp_free(rep[r]);
    dp_free(init), dp_free(g);
    return 0;
}
