/* What a training step costs beyond its compute (docs/ddp.md "ZeRO",
 * "Giving memory back"): time, page faults and kernel time per step.
 *
 *   ./build/bench/zero_steps MODEL WORKERS ZERO [STEPS [DATA_DIR]]
 *
 * Trains MODEL with WORKERS thread workers, --zero ZERO, AdamW, batches of
 * 128, for 10 + STEPS steps (default 200) and prints one tab-separated line
 * over steps 10 .. 10 + STEPS (the first ten warm up: the loader, the
 * arena, the first faults of every slab):
 *     model  P  zero  steps  ms_step  minflt_step  sys_ms_step  user_ms_step
 * minflt: minor page faults of the process (all threads; a 2 MiB unit of a
 * slab given back and touched again is one); sys and user: the process's
 * CPU time.  Only the library's public API, so the same file builds
 * against an older tree for a side-by-side comparison (bench/zero.sh
 * BASE=DIR). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "dp/train.h"

static const int64_t WARM = 10;
static int64_t steps = 200;
static struct rusage r0;
static double t0;

static double secs(struct timeval tv) { return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec; }

static void on_event(void *arg, const struct dp_event *ev) {
    const struct dp_train_params *p = arg;
    if (ev->kind != DP_EVENT_STEP) return;
    if (ev->step == WARM) getrusage(RUSAGE_SELF, &r0), t0 = dp_time();
    if (ev->step != WARM + steps) return;
    struct rusage r1;
    getrusage(RUSAGE_SELF, &r1);
    double n = (double)steps, t = dp_time() - t0;
    printf("%s\t%d\t%d\t%lld\t%.3f\t%.2f\t%.3f\t%.3f\n", p->run.model, p->dp.workers, p->dp.zero, (long long)steps, 1e3 * t / n,
           (double)(r1.ru_minflt - r0.ru_minflt) / n, 1e3 * (secs(r1.ru_stime) - secs(r0.ru_stime)) / n,
           1e3 * (secs(r1.ru_utime) - secs(r0.ru_utime)) / n);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL WORKERS ZERO [STEPS [DATA_DIR]]\n", argv[0]);
        return 2;
    }
    struct dp_train_params p = dp_train_default_params();
    p.run.model = argv[1];
    p.dp.workers = atoi(argv[2]);
    p.dp.zero = atoi(argv[3]);
    if (argc > 4) steps = atoll(argv[4]);
    if (argc > 5) p.data.data_dir = argv[5];
    if (steps < 1) steps = 1;
    p.optim.kind = DP_OPTIM_ADAMW;
    p.sched.base_lr = 1e-3f;
    p.run.batch = 128;
    p.run.epochs = 1000; /* max_steps ends the run */
    p.run.max_steps = WARM + steps;
    p.data.test_limit = 256;
    p.io.on_event = on_event, p.io.event_arg = &p;
    struct dp_trainer *t;
    if (dp_trainer_init(&t, &p) || dp_trainer_run(t)) {
        fprintf(stderr, "zero_steps: %s\n", dp_errmsg());
        return 1;
    }
    dp_trainer_free(t);
    return 0;
}
