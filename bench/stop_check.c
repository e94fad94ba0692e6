/* What the clean stop costs a multi-process step (issue 27, R2; docs/cluster.md
 * "Stopping a job cleanly"): with dp_train_params.stop set, every step adds
 * one 1-double all-reduce through which the ranks agree to stop.
 *
 *   mpirun -np 2 ./build/bench/stop_check [REPS [STEPS [MODEL [DATA_DIR]]]]
 *
 * Each repetition trains MODEL (default mlp; one worker per process, global
 * batch 128, SGD) for 10 + STEPS steps twice in this process, once without
 * the stop flag and once with it, the order alternating from one repetition
 * to the next, and times steps 10 .. 10 + STEPS of each.  Then it times
 * 2000 bare 1-double all-reduces (the check alone).  Rank 0 prints one
 * tab-separated line per repetition and the medians:
 *     rep  ms_step_off  ms_step_on  on/off
 *     allreduce_1_double_us  <median of 5 blocks of 2000>
 * Only the public API: the same file builds against an older tree. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/comm.h"
#include "dp/train.h"

static const int64_t WARM = 10;
static int64_t steps = 300;
static double t_warm, t_end;

static void on_event(void *arg, const struct dp_event *ev) {
    (void)arg;
    if (ev->kind != DP_EVENT_STEP) return;
    if (ev->step == WARM) t_warm = dp_time();
    if (ev->step == WARM + steps) t_end = dp_time();
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* one run of WARM + steps steps; the milliseconds per timed step, or -1 */
static double run(struct dp_comm *job, const char *model, const char *data, const _Atomic int *stop) {
    struct dp_train_params p = dp_train_default_params();
    p.run.model = model;
    if (data) p.data.data_dir = data;
    p.dp.inter = job;
    p.dp.workers = 1;
    p.run.batch = 128;
    p.run.epochs = 1000; /* max_steps ends the run */
    p.run.max_steps = WARM + steps;
    p.data.test_limit = 256;
    p.io.stop = stop;
    p.io.on_event = on_event;
    struct dp_trainer *t;
    t_warm = t_end = 0;
    if (dp_trainer_init(&t, &p) || dp_trainer_run(t)) {
        fprintf(stderr, "stop_check: %s\n", dp_errmsg());
        return -1;
    }
    dp_trainer_free(t);
    return 1e3 * (t_end - t_warm) / (double)steps;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 7;
    if (argc > 2) steps = atoll(argv[2]);
    const char *model = argc > 3 ? argv[3] : "mlp", *data = argc > 4 ? argv[4] : NULL;
    if (reps < 1 || steps < 1) {
        fprintf(stderr, "usage: mpirun -np P %s [REPS [STEPS [MODEL [DATA_DIR]]]]\n", argv[0]);
        return 2;
    }
    struct dp_comm *job;
    struct dp_comm_params cp = dp_comm_default_params();
    if (dp_comm_init(&job, "mpi", &cp)) {
        fprintf(stderr, "stop_check: %s\n", dp_errmsg());
        return 1;
    }
    int me = dp_comm_rank(job);
    static _Atomic int never; /* the flag of a run that is never stopped */
    double *off = calloc((size_t)reps, sizeof *off), *on = calloc((size_t)reps, sizeof *on), ratio[64];
    if (!off || !on) return 1;
    if (me == 0) printf("rep\tms_step_off\tms_step_on\ton/off\n");
    for (int r = 0; r < reps; r++) {
        for (int k = 0; k < 2; k++) { /* off first in even repetitions, on first in odd ones */
            int with = (k + r) % 2;
            double ms = run(job, model, data, with ? &never : NULL);
            if (ms < 0) return 1;
            (with ? on : off)[r] = ms;
        }
        if (me == 0) printf("%d\t%.4f\t%.4f\t%.4f\n", r, off[r], on[r], on[r] / off[r]);
        if (r < 64) ratio[r] = on[r] / off[r];
        fflush(stdout);
    }
    double us[5];
    for (int b = 0; b < 5; b++) {
        dp_comm_barrier(job);
        double t0 = dp_time();
        for (int i = 0; i < 2000; i++) {
            double v = 0;
            if (dp_comm_allreduce(job, &v, 1, DP_DTYPE_F64, DP_ALGO_AUTO)) return 1;
        }
        us[b] = 1e6 * (dp_time() - t0) / 2000;
    }
    if (me == 0) {
        int n = reps < 64 ? reps : 64;
        double mr = median(ratio, n), moff = median(off, reps), mon = median(on, reps);
        printf("median\t%.4f\t%.4f\t%.4f\n", moff, mon, mr);
        printf("allreduce_1_double_us\t%.2f\n", median(us, 5));
    }
    free(off), free(on);
    dp_comm_free(job);
    return 0;
}
