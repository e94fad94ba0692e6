/*
 * dp/optim.h — optimizers over flat slabs, learning-rate schedules, clipping.
 *
 * An optimizer updates the whole parameter slab (or, later, a contiguous
 * shard of it for ZeRO) from the gradient slab of the same layout.  Its state
 * (momentum; Adam's m and v) is one more slab of the same layout.
 *
 *     struct dp_optim_params op = dp_optim_default_params();
 *     op.kind = DP_OPTIM_SGD; op.momentum = 0.9f;
 *     struct dp_optim o;
 *     dp_optim_init(&o, &op, n);
 *     dp_optim_step(&o, params, grads, n, lr);     // after each backward
 *     dp_optim_free(&o);
 */
#ifndef DP_OPTIM_H
#define DP_OPTIM_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

enum dp_optim_kind { DP_OPTIM_SGD = 0, DP_OPTIM_ADAMW, DP_OPTIM_KIND_COUNT };

struct dp_optim_params {
    enum dp_optim_kind kind;
    float momentum;      /* SGD */
    int nesterov;        /* SGD */
    float dampening;     /* SGD, as PyTorch (default 0) */
    float weight_decay;  /* SGD: L2 added to the gradient (PyTorch); AdamW: decoupled */
    float beta1, beta2, eps; /* AdamW */
};
struct dp_optim_params dp_optim_default_params(void);
/* "sgd", "adamw" <-> kind (parse returns -1 if unknown) */
const char *dp_optim_kind_name(enum dp_optim_kind k);
int dp_optim_kind_parse(const char *s);

struct dp_optim {
    struct dp_optim_params p;
    int64_t n;           /* floats in the slab this optimizer updates */
    int64_t step;        /* steps taken (Adam bias correction; SGD first-step buffer init) */
    float *state;        /* SGD: momentum buffer (n) (absent if momentum == 0);
                            AdamW: m (n) then v (n) */
    int64_t state_len;   /* floats in state */
};
int dp_optim_init(struct dp_optim *o, const struct dp_optim_params *p, int64_t n);
void dp_optim_free(struct dp_optim *o);
/* One update of params[0..n) with gradient grads[0..n) at learning rate lr.
 * Formulas follow PyTorch 1.13's torch.optim.SGD and torch.optim.AdamW. */
int dp_optim_step(struct dp_optim *o, float *params, const float *grads, int64_t n, float lr);

/* ---- learning-rate schedules ---------------------------------------------- */

enum dp_sched_kind { DP_SCHED_CONSTANT = 0, DP_SCHED_STEP, DP_SCHED_COSINE, DP_SCHED_KIND_COUNT };
struct dp_sched {
    enum dp_sched_kind kind;
    float base_lr;
    int64_t total_steps;   /* cosine: steps to decay over (including warmup) */
    int64_t warmup_steps;  /* cosine: linear warmup from 0 */
    int64_t step_size;     /* step: multiply by gamma every step_size steps */
    float gamma;           /* step */
    float min_lr;          /* cosine: floor */
};
/* Learning rate at step t (0-based). */
float dp_sched_lr(const struct dp_sched *s, int64_t t);
const char *dp_sched_kind_name(enum dp_sched_kind k);
int dp_sched_kind_parse(const char *s);

/* ---- clipping ---------------------------------------------------------------- */

/* Global L2 norm of g[0..n), accumulated in double. */
double dp_grad_norm(const float *g, int64_t n);
/* If the global norm exceeds max_norm, scales g by max_norm / (norm + 1e-6)
 * (PyTorch clip_grad_norm_).  Returns the norm before clipping. */
double dp_clip_grad_norm(float *g, int64_t n, double max_norm);

#ifdef __cplusplus
}
#endif
#endif
