/*
 * Optimizer front end: default parameters, names, validation, the state slab
 * and dispatch to the kernels (sgd.c, adamw.c).
 */
#include <math.h>
#include <string.h>

#include "optim_impl.h"

/* ============================================================================
 * Parameters and names
 * ========================================================================= */

static const char *const kind_names[DP_OPTIM_KIND_COUNT] = {
    [DP_OPTIM_SGD] = "sgd",
    [DP_OPTIM_ADAMW] = "adamw",
};

struct dp_optim_params dp_optim_default_params(void) {
    return (struct dp_optim_params){
        .kind = DP_OPTIM_SGD,
        .momentum = 0.0f,
        .nesterov = 0,
        .dampening = 0.0f,
        .weight_decay = 0.0f,
        .beta1 = 0.9f,
        .beta2 = 0.999f,
        .eps = 1e-8f,
    };
}

const char *dp_optim_kind_name(enum dp_optim_kind k) {
    return (unsigned)k < DP_OPTIM_KIND_COUNT ? kind_names[k] : "unknown";
}

int dp_optim_kind_parse(const char *s) {
    for (int k = 0; s && k < DP_OPTIM_KIND_COUNT; k++)
        if (strcmp(s, kind_names[k]) == 0) return k;
    return -1;
}

/* The comparisons are written so that NaN fails them. */
int dp_optim_check(const struct dp_optim_params *p) {
    DP_ASSERT(p != NULL);
    if ((unsigned)p->kind >= DP_OPTIM_KIND_COUNT)
        return dp_seterr(DP_EINVAL, "optim: unknown kind %d", (int)p->kind);
    const char *name = kind_names[p->kind];
    if (!(p->weight_decay >= 0.0f && p->weight_decay < INFINITY))
        return dp_seterr(DP_EINVAL, "%s: weight_decay %g must be finite and >= 0", name,
                         (double)p->weight_decay);
    if (p->kind == DP_OPTIM_SGD) {
        if (!(p->momentum >= 0.0f && p->momentum < 1.0f))
            return dp_seterr(DP_EINVAL, "sgd: momentum %g must be in [0, 1)", (double)p->momentum);
        if (!(p->dampening >= 0.0f && p->dampening <= 1.0f))
            return dp_seterr(DP_EINVAL, "sgd: dampening %g must be in [0, 1]",
                             (double)p->dampening);
        if (p->nesterov != 0 && p->nesterov != 1)
            return dp_seterr(DP_EINVAL, "sgd: nesterov %d must be 0 or 1", p->nesterov);
        if (p->nesterov && (p->momentum <= 0.0f || p->dampening != 0.0f))
            return dp_seterr(DP_EINVAL,
                             "sgd: nesterov momentum requires momentum > 0 and dampening 0 "
                             "(momentum %g, dampening %g)",
                             (double)p->momentum, (double)p->dampening);
    } else {
        if (!(p->beta1 >= 0.0f && p->beta1 < 1.0f))
            return dp_seterr(DP_EINVAL, "adamw: beta1 %g must be in [0, 1)", (double)p->beta1);
        if (!(p->beta2 >= 0.0f && p->beta2 < 1.0f))
            return dp_seterr(DP_EINVAL, "adamw: beta2 %g must be in [0, 1)", (double)p->beta2);
        if (!(p->eps > 0.0f && p->eps < INFINITY))
            return dp_seterr(DP_EINVAL, "adamw: eps %g must be finite and > 0", (double)p->eps);
    }
    return DP_OK;
}

/* ============================================================================
 * Lifetime and step
 * ========================================================================= */

int dp_optim_init(struct dp_optim *o, const struct dp_optim_params *p, int64_t n) {
    DP_ASSERT(o != NULL && p != NULL);
    memset(o, 0, sizeof *o);
    int rc = dp_optim_check(p);
    if (rc) return rc;
    if (n < 0) return dp_seterr(DP_EINVAL, "%s: negative slab size %lld", kind_names[p->kind],
                                (long long)n);

    int64_t per = p->kind == DP_OPTIM_ADAMW ? 2 : p->momentum != 0.0f ? 1 : 0;
    if (n > (int64_t)(SIZE_MAX / sizeof(float) / 2))
        return dp_seterr(DP_ENOMEM, "%s: slab of %lld floats is too large", kind_names[p->kind],
                         (long long)n);
    int64_t len = per * n;
    float *state = NULL;
    if (len > 0) {
        size_t bytes = (size_t)len * sizeof(float);
        state = dp_malloc_big(bytes);
        if (!state)
            return dp_seterr(DP_ENOMEM, "%s: cannot allocate %zu bytes of state",
                             kind_names[p->kind], bytes);
        memset(state, 0, bytes);
    }
    o->p = *p;
    o->n = n;
    o->step = 0;
    o->state = state;
    o->state_len = len;
    return DP_OK;
}

void dp_optim_free(struct dp_optim *o) {
    if (!o) return;
    dp_free(o->state);
    memset(o, 0, sizeof *o);
}

int dp_optim_step(struct dp_optim *o, float *params, const float *grads, int64_t n, float lr) {
    DP_ASSERT(o != NULL);
    if (n != o->n)
        return dp_seterr(DP_EINVAL, "%s: step over %lld floats, but initialised for %lld",
                         dp_optim_kind_name(o->p.kind), (long long)n, (long long)o->n);
    DP_ASSERT(n == 0 || (params != NULL && grads != NULL));
    switch (o->p.kind) {
    case DP_OPTIM_SGD: dp__sgd_step(o, params, grads, lr); break;
    case DP_OPTIM_ADAMW: dp__adamw_step(o, params, grads, lr); break;
    default: DP_ASSERT(!"unknown optimizer kind");
    }
    o->step++;
    return DP_OK;
}
