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
 *
 * Formulas follow PyTorch 1.13 (torch.optim.SGD, torch.optim.AdamW, single-
 * tensor path) and are written above each kernel in src/optim/.  A checkpoint
 * saves o->step and o->state[0..state_len); restoring both into an optimizer
 * initialised with the same params and n continues bit for bit.
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
/* Defaults as PyTorch: kind SGD, momentum 0, nesterov 0, dampening 0,
 * weight_decay 0; for AdamW beta1 0.9, beta2 0.999, eps 1e-8 (note PyTorch's
 * AdamW defaults weight_decay to 0.01; set it explicitly). */
struct dp_optim_params dp_optim_default_params(void);
/* "sgd", "adamw" <-> kind (name returns "unknown" out of range; parse returns
 * -1 if unknown or NULL). */
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
/* Validates p without allocating: kind known; weight_decay >= 0; SGD:
 * momentum in [0, 1), dampening in [0, 1], nesterov 0 or 1 and, if 1,
 * momentum > 0 and dampening 0; AdamW: beta1 and beta2 in [0, 1), eps > 0.
 * Fields of the other optimizer are ignored.  Returns 0 or DP_EINVAL with a
 * message naming the field.  The learning rate is not checked here. */
int dp_optim_check(const struct dp_optim_params *p);
/* Validates p (dp_optim_check) and allocates the zeroed state slab for n
 * floats with dp_malloc_big: SGD n floats if momentum != 0, else none
 * (state NULL); AdamW 2n.  step starts at 0.  Returns 0, DP_EINVAL or
 * DP_ENOMEM; on failure *o is zeroed, so dp_optim_free(o) is still safe.
 * The optimizer owns o->state until dp_optim_free. */
int dp_optim_init(struct dp_optim *o, const struct dp_optim_params *p, int64_t n);
/* Frees the state and zeroes *o.  NULL-safe; safe on a zeroed or already
 * freed optimizer. */
void dp_optim_free(struct dp_optim *o);
/* One update of params[0..n) with gradient grads[0..n) at learning rate lr,
 * then o->step += 1.  params, grads and o->state must not overlap.  Returns
 * DP_EINVAL (nothing updated) if n != o->n, else 0.  Not thread-safe for one
 * optimizer; distinct optimizers may step concurrently. */
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
/* Learning rate at step t (0-based; t < 0 counts as 0), computed in double:
 *   constant: base_lr
 *   step:     base_lr * gamma^floor(t / step_size)   (step_size <= 0: base_lr)
 *   cosine:   t < warmup:  base_lr * (t+1) / warmup
 *             t < total:   min_lr + (base_lr - min_lr) * 0.5 *
 *                                   (1 + cos(pi * (t-warmup) / (total-warmup)))
 *             t >= total:  min_lr
 * Fields another kind uses are ignored.  s->kind must be valid (assert). */
float dp_sched_lr(const struct dp_sched *s, int64_t t);
/* Validates a schedule: kind known, base_lr >= 0; step: step_size > 0,
 * gamma > 0; cosine: total_steps > 0, 0 <= warmup_steps <= total_steps,
 * 0 <= min_lr <= base_lr.  Returns 0 or DP_EINVAL with a message. */
int dp_sched_check(const struct dp_sched *s);
/* "constant", "step", "cosine" <-> kind (name returns "unknown" out of range;
 * parse returns -1 if unknown or NULL). */
const char *dp_sched_kind_name(enum dp_sched_kind k);
int dp_sched_kind_parse(const char *s);

/* ---- clipping ---------------------------------------------------------------- */

/* Global L2 norm of g[0..n), accumulated in double. */
double dp_grad_norm(const float *g, int64_t n);
/* PyTorch clip_grad_norm_ (L2): coef = max_norm / (norm + 1e-6), and g is
 * scaled by coef only if coef < 1.  Returns the norm before clipping.  If
 * that norm is not finite (inf/NaN in g), g is left unchanged; the caller
 * decides what to do with the step. */
double dp_clip_grad_norm(float *g, int64_t n, double max_norm);

#ifdef __cplusplus
}
#endif
#endif
