/*
 * Learning-rate schedules: constant, step decay, and cosine decay with linear
 * warmup.  All arithmetic is in double; the result is rounded to float once.
 */
#include <math.h>
#include <string.h>

#include "dp/optim.h"

static const char *const kind_names[DP_SCHED_KIND_COUNT] = {
    [DP_SCHED_CONSTANT] = "constant",
    [DP_SCHED_STEP] = "step",
    [DP_SCHED_COSINE] = "cosine",
};

const char *dp_sched_kind_name(enum dp_sched_kind k) {
    return (unsigned)k < DP_SCHED_KIND_COUNT ? kind_names[k] : "unknown";
}

int dp_sched_kind_parse(const char *s) {
    for (int k = 0; s && k < DP_SCHED_KIND_COUNT; k++)
        if (strcmp(s, kind_names[k]) == 0) return k;
    return -1;
}

/* The comparisons are written so that NaN fails them. */
int dp_sched_check(const struct dp_sched *s) {
    DP_ASSERT(s != NULL);
    if ((unsigned)s->kind >= DP_SCHED_KIND_COUNT)
        return dp_seterr(DP_EINVAL, "sched: unknown kind %d", (int)s->kind);
    if (!(s->base_lr >= 0.0f && s->base_lr < INFINITY))
        return dp_seterr(DP_EINVAL, "sched: base_lr %g must be finite and >= 0", (double)s->base_lr);
    if (s->kind == DP_SCHED_STEP) {
        if (s->step_size <= 0)
            return dp_seterr(DP_EINVAL, "sched step: step_size %lld must be > 0",
                             (long long)s->step_size);
        if (!(s->gamma > 0.0f && s->gamma < INFINITY))
            return dp_seterr(DP_EINVAL, "sched step: gamma %g must be finite and > 0",
                             (double)s->gamma);
    } else if (s->kind == DP_SCHED_COSINE) {
        if (s->total_steps <= 0)
            return dp_seterr(DP_EINVAL, "sched cosine: total_steps %lld must be > 0",
                             (long long)s->total_steps);
        if (s->warmup_steps < 0 || s->warmup_steps > s->total_steps)
            return dp_seterr(DP_EINVAL, "sched cosine: warmup_steps %lld must be in [0, %lld]",
                             (long long)s->warmup_steps, (long long)s->total_steps);
        if (!(s->min_lr >= 0.0f && s->min_lr <= s->base_lr))
            return dp_seterr(DP_EINVAL, "sched cosine: min_lr %g must be in [0, base_lr %g]",
                             (double)s->min_lr, (double)s->base_lr);
    }
    return DP_OK;
}

float dp_sched_lr(const struct dp_sched *s, int64_t t) {
    DP_ASSERT(s != NULL && (unsigned)s->kind < DP_SCHED_KIND_COUNT);
    const double base = s->base_lr;
    if (t < 0) t = 0;
    switch (s->kind) {
    case DP_SCHED_STEP:
        if (s->step_size <= 0) return s->base_lr;
        return (float)(base * pow((double)s->gamma, (double)(t / s->step_size)));
    case DP_SCHED_COSINE: {
        const double lo = s->min_lr;
        const int64_t warm = s->warmup_steps, total = s->total_steps;
        if (t < warm) return (float)(base * (double)(t + 1) / (double)warm);
        if (t >= total) return s->min_lr;
        /* Here warm <= t < total, so total - warm > 0. */
        const double pi = 3.14159265358979323846;
        double progress = (double)(t - warm) / (double)(total - warm);
        return (float)(lo + (base - lo) * 0.5 * (1.0 + cos(pi * progress)));
    }
    default: return s->base_lr;
    }
}
