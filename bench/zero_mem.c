/* ZeRO's memory per worker, counted by the library's allocator hook and by
 * the pages really resident (docs/ddp.md "ZeRO").
 *
 *   ./build/bench/zero_mem MODEL WORKERS ZERO [DATA_DIR]
 *
 * Installs a counting allocator (dp_set_allocator), builds the trainer with
 * AdamW for WORKERS thread workers and --zero ZERO, trains 3 steps, and
 * prints one tab-separated line:
 *     model  P  zero  params  live_init  peak  data  per_worker  per_param  state_step  state_per_param  rss_peak
 * live_init: the library's live bytes after dp_trainer_init; peak: the most
 * live at any time during init and the steps; data: the bytes the data set
 * itself holds (loaded alone, the same way); per_worker = (peak - data) / P,
 * the bytes one worker holds at its peak (parameters, gradients, optimizer
 * state, activations, loader buffers); per_param = per_worker / params.
 * The allocator counts what was allocated, and ZeRO 2 and 3 keep their slabs
 * allocated but give their pages back, so: state_step = the most worker 0
 * held resident of its model state after any step (dp_trainer_live_bytes:
 * gradient and parameter pages by mincore, shards, optimizer state), and
 * state_per_param = state_step / params; rss_peak = the process's peak
 * resident set (getrusage; all P workers, the data set, the code). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "dp/data.h"
#include "dp/train.h"

static size_t live, peak;
static void *count_alloc(size_t size, void *user) {
    (void)user;
    char *p = NULL;
    if (posix_memalign((void **)&p, 64, size + 64) != 0) return NULL;
    memcpy(p, &size, sizeof size);
    live += size;
    if (live > peak) peak = live;
    return p + 64;
}
static void count_free(void *q, void *user) {
    (void)user;
    char *p = (char *)q - 64;
    size_t size;
    memcpy(&size, p, sizeof size);
    live -= size;
    free(p);
}

static struct dp_trainer *trainer;
static int64_t state_step;
static void on_event(void *arg, const struct dp_event *ev) {
    (void)arg;
    if (ev->kind != DP_EVENT_STEP) return;
    int64_t b = dp_trainer_live_bytes(trainer, 0);
    if (b > state_step) state_step = b;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL WORKERS ZERO [DATA_DIR]\n", argv[0]);
        return 2;
    }
    struct dp_train_params p = dp_train_default_params();
    if (argc > 4) p.data_dir = argv[4];
    p.model = argv[1];
    p.workers = atoi(argv[2]);
    p.zero = atoi(argv[3]);
    p.optim.kind = DP_OPTIM_ADAMW;
    p.sched.base_lr = 1e-3f;
    p.batch = 128;
    p.max_steps = 3;
    p.test_limit = 256;
    p.on_event = on_event;
    /* the data set alone, as the trainer loads it (its images as floats) */
    struct dp_allocator a = {count_alloc, count_free, NULL};
    dp_set_allocator(&a);
    struct dp_dataset tr, te;
    if (dp_dataset_load_dir(&tr, &te, p.data_dir)) {
        fprintf(stderr, "zero_mem: %s\n", dp_errmsg());
        return 1;
    }
    size_t data = live;
    dp_dataset_free(&tr);
    dp_dataset_free(&te);
    live = peak = 0;
    struct dp_trainer *t;
    int rc = dp_trainer_init(&t, &p);
    trainer = t;
    size_t init = live;
    if (!rc) rc = dp_trainer_run(t);
    if (rc) {
        fprintf(stderr, "zero_mem: %s\n", dp_errmsg());
        return 1;
    }
    int64_t n = dp_trainer_model(t)->num_params;
    dp_trainer_free(t);
    dp_set_allocator(NULL);
    double per = (double)(peak - data) / p.workers;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("%s\t%d\t%d\t%lld\t%zu\t%zu\t%zu\t%.0f\t%.2f\t%lld\t%.2f\t%lld\n", p.model, p.workers, p.zero,
           (long long)n, init, peak, data, per, per / (double)n, (long long)state_step,
           (double)state_step / (double)n, (long long)ru.ru_maxrss * 1024);
    return 0;
}
