/*
 * SGD with momentum, dampening, Nesterov momentum and L2 weight decay, step
 * for step the single-tensor path of PyTorch 1.13's torch.optim.SGD.
 *
 * The state is the momentum buffer b (n floats), present only when
 * momentum != 0.  PyTorch creates b as a copy of the first direction d; here
 * b starts zeroed, and the first step uses the coefficients (0, 1) instead of
 * (momentum, 1 - dampening), which gives b = 0*0 + 1*d = d exactly.
 *
 * Rounding follows PyTorch's vectorised kernels: every "x.add(y, alpha=a)"
 * is one fused multiply-add (DP__FMA), every mul_ is rounded on its own.
 */
#include "optim_impl.h"

/* Without momentum:
 *     d = g + wd*p
 *     p = p - lr*d                                                          */
static void sgd_plain(float *restrict p, const float *restrict g, int64_t n, float lr, float wd) {
    DP__SIMD
    for (int64_t i = 0; i < n; i++) {
        float d = DP__FMA(wd, p[i], g[i]);
        p[i] = DP__FMA(-lr, d, p[i]);
    }
}

/* With momentum mu (keep = mu, mix = 1 - dampening; keep = 0, mix = 1 on the
 * first step):
 *     d = g + wd*p
 *     b = keep*b + mix*d
 *     u = nesterov ? d + mu*b : b
 *     p = p - lr*u                                                          */
static void sgd_momentum(float *restrict p, const float *restrict g, float *restrict b, int64_t n,
                         float lr, float wd, float keep, float mix, float mu, int nesterov) {
    DP__SIMD
    for (int64_t i = 0; i < n; i++) {
        float d = DP__FMA(wd, p[i], g[i]);
        float kept = keep * b[i];
        float bi = DP__FMA(mix, d, kept);
        b[i] = bi;
        float u = nesterov ? DP__FMA(mu, bi, d) : bi;
        p[i] = DP__FMA(-lr, u, p[i]);
    }
}

void dp__sgd_step(struct dp_optim *o, float *params, const float *grads, float lr) {
    const struct dp_optim_params *hp = &o->p;
    if (hp->momentum == 0.0f) {
        sgd_plain(params, grads, o->n, lr, hp->weight_decay);
        return;
    }
    int first = o->step == 0;
    /* PyTorch passes 1 - dampening as a Python float; round it once. */
    float keep = first ? 0.0f : hp->momentum;
    float mix = first ? 1.0f : (float)(1.0 - (double)hp->dampening);
    sgd_momentum(params, grads, o->state, o->n, lr, hp->weight_decay, keep, mix, hp->momentum,
                 hp->nesterov != 0);
}
