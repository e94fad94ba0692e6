/* Fault injection, for the tests of failure handling only: not part of the
 * public API, not installed.  A test includes this header (tests/ has src/
 * on its include path) and arms a trainer between dp_trainer_init and
 * dp_trainer_run. */
#ifndef DP_TRAIN_FAULT_H
#define DP_TRAIN_FAULT_H

#include <stdint.h>

struct dp_trainer;

enum dp_fault_kind {
    DP_FAULT_NONE = 0,
    DP_FAULT_NAN,     /* a NaN in one input of the worker's last micro-batch */
    DP_FAULT_ALLOC,   /* an allocation failure in the step */
    DP_FAULT_DATA,    /* a data error in the step */
    DP_FAULT_DIVERGE, /* the replica silently drifts: one parameter changed after its update
                         (for --check-replicas) */
    DP_FAULT_SLOW,    /* from the step on, the worker sleeps 20 ms at the start of every step
                         (a straggler, for the slowest-rank report) */
    DP_FAULT_KIND_COUNT
};

/* At optimizer step `step`, job rank `worker` fails the way `kind` says. */
struct dp_fault {
    enum dp_fault_kind kind;
    int worker;
    int64_t step;
};

/* Arms t with f; DP_ENOTSUP for a NaN fault on a token model (it has no float
 * inputs), DP_EINVAL for an unknown kind. */
int dp__trainer_set_fault(struct dp_trainer *t, const struct dp_fault *f);

#endif
