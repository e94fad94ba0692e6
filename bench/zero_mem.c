/* ZeRO's memory per worker, counted by the library's allocator hook and by
 * the pages really resident (docs/ddp.md "ZeRO").
 *
 *   ./build/bench/zero_mem MODEL WORKERS ZERO [DATA_DIR [UNIT_MB]]
 *
 * Installs a counting allocator (dp_set_allocator), builds the trainer with
 * AdamW for WORKERS thread workers and --zero ZERO, trains 3 steps, and
 * prints one tab-separated line:
 *     model  P  zero  params  live_init  peak  data  per_worker  per_param  state_step  state_per_param  rss_peak
 *     formula  act  inflight  rss_base  rss_per_worker  rss/bound  lib  grad_hw  unit_mb
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
 * resident set (getrusage; all P workers, the data set, the code).
 * formula: the model state per worker, AdamW: 16 psi (zero 0 or P = 1),
 * 8 psi + 8 psi / P (1), 4 psi + 12 psi / P (2), 16 psi / P (3), in bytes;
 * act: what else a worker holds, allocated and touched at init (activation
 * arena, loader buffers): (live_init - data) / P less worker 0's model state
 * after init (dp_trainer_live_bytes); inflight: the slab bytes a sharded
 * worker holds at once during a step (dp_trainer_inflight_bytes: stage 2 two
 * ranges of gradients, stage 3 also two of parameters); rss_base: the RSS
 * before dp_trainer_init (code, libraries), after a few GEMMs of each
 * transposition the layers use (warm_gemm), so that it also holds what the
 * GEMM library keeps once used, per process: oneDNN's code pages, its
 * JIT-compiled kernels and buffers (lib: what the warm-up added, ~10 MB);
 * rss_per_worker = (rss_peak - rss_base - data) / P, the model-state part of
 * the peak RSS per worker, set beside bound = formula + act + inflight
 * (rss/bound); grad_hw: the most gradient bytes a worker's backward had
 * written and not yet seen reduced at a layer's end, over the workers
 * (dp_trainer_zero_counts; 0 unless sharded); unit_mb: --zero-unit-mb (0: none). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "dp/core.h"
#include "dp/ddp.h"

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

/* VmRSS of /proc/self/status in bytes (0 if unreadable). */
static long long vm_rss(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0) kb = atoll(line + 6);
    if (f) fclose(f);
    return kb * 1024;
}

/* dp_gemm NN, NT and TN (a linear layer's forward and backward) on mapped
 * buffers, given back after (mapped, so that the C library's heap is left
 * as it was). */
static void warm_gemm(void) {
    const int64_t M = 128, N = 1024, K = 1024;
    size_t bytes = sizeof(float) * (size_t)(M * K + K * N + M * N);
    float *a = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) return;
    float *b = a + M * K, *c = b + K * N;
    for (int t = 0; t < 3; t++)
        dp_gemm(t == 2, t == 1, M, N, K, 1.0f, a, t == 2 ? M : K, b, t == 1 ? K : N, 0.0f, c, N);
    munmap(a, bytes);
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
        fprintf(stderr, "usage: %s MODEL WORKERS ZERO [DATA_DIR [UNIT_MB]]\n", argv[0]);
        return 2;
    }
    struct dp_train_params p = dp_train_default_params();
    if (argc > 4) p.data.data_dir = argv[4];
    double unit_mb = argc > 5 ? atof(argv[5]) : 0;
    p.dp.zero_unit_bytes = (size_t)(unit_mb * 1048576.0);
    p.run.model = argv[1];
    p.dp.workers = atoi(argv[2]);
    p.dp.zero = atoi(argv[3]);
    p.optim.kind = DP_OPTIM_ADAMW;
    p.sched.base_lr = 1e-3f;
    p.run.batch = 128;
    p.run.max_steps = 3;
    p.data.test_limit = 256;
    p.io.on_event = on_event;
    /* the data set alone, as the trainer loads it (its images as floats) */
    struct dp_allocator a = {count_alloc, count_free, NULL};
    dp_set_allocator(&a);
    struct dp_dataset tr, te;
    if (dp_dataset_load_dir(&tr, &te, p.data.data_dir)) {
        fprintf(stderr, "zero_mem: %s\n", dp_errmsg());
        return 1;
    }
    size_t data = live;
    dp_dataset_free(&tr);
    dp_dataset_free(&te);
    live = peak = 0;
    long long rss0 = vm_rss();
    warm_gemm();
    long long rss_base = vm_rss();
    struct dp_trainer *t;
    int rc = dp_trainer_init(&t, &p);
    trainer = t;
    size_t init = live;
    int64_t state_init = rc ? 0 : dp_trainer_live_bytes(t, 0), inflight = rc ? 0 : dp_trainer_inflight_bytes(t);
    if (!rc) rc = dp_trainer_run(t);
    if (rc) {
        fprintf(stderr, "zero_mem: %s\n", dp_errmsg());
        return 1;
    }
    int64_t n = dp_trainer_model(t)->num_params, grad_hw = 0;
    for (int r = 0; r < p.dp.workers; r++) {
        struct dp_zero_counts c;
        if (dp_trainer_zero_counts(t, r, &c) == 0 && c.grad_hw_bytes > grad_hw) grad_hw = c.grad_hw_bytes;
    }
    dp_trainer_free(t);
    dp_set_allocator(NULL);
    double per = (double)(peak - data) / p.dp.workers;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double psi = (double)n, P = p.dp.workers, z = P > 1 ? p.dp.zero : 0;
    double f = z == 0 ? 16 * psi : z == 1 ? 8 * psi + 8 * psi / P : z == 2 ? 4 * psi + 12 * psi / P : 16 * psi / P;
    double act = ((double)init - (double)data) / P - (double)state_init;
    double rss_w = ((double)ru.ru_maxrss * 1024 - (double)rss_base - (double)data) / P;
    printf("%s\t%d\t%d\t%lld\t%zu\t%zu\t%zu\t%.0f\t%.2f\t%lld\t%.2f\t%lld\t%.0f\t%.0f\t%lld\t%lld\t%.0f\t%.3f\t%lld\t%lld\t%g\n",
           p.run.model, p.dp.workers, p.dp.zero, (long long)n, init, peak, data, per, per / (double)n, (long long)state_step,
           (double)state_step / (double)n, (long long)ru.ru_maxrss * 1024, f, act, (long long)inflight, rss_base,
           rss_w, rss_w / (f + act + (double)inflight), rss_base - rss0, (long long)grad_hw, unit_mb);
    return 0;
}
