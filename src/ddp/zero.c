/* ZeRO stage 1: the optimizer state sharded over the workers.  The contract
 * is in dp/ddp.h; docs/ddp.md "ZeRO" has the memory accounting.
 *
 * One step, on worker r of G (shard [off, off + len) = dp_comm_split(n, G, r)):
 *
 *     reduction         g[off, off + len) = the global-batch gradient
 *     sumsq             s_r = sum over the shard of g^2; all-reduce(s) = ||g||^2
 *     clip (optional)   g[shard] *= min(1, c / (||g|| + 1e-6))
 *     optimizer         params[shard], state (len floats per part) <- g[shard]
 *     all-gather        params: block q from worker q, for every q
 *
 *       rank:    0        1        2          (n = 10, G = 3: blocks 4, 3, 3)
 *     update   [0..4)   [4..7)   [7..10)
 *     gather   [0..10)  [0..10)  [0..10)
 *
 * The optimizer kernels are elementwise (the AdamW bias correction is a
 * scalar of the step count), so the shard update is the bits of the
 * whole-slab update on the same elements: exact gradient sums (deterministic
 * mode) give exactly the plain run's parameters. */
#include <math.h>
#include <string.h>

#include "dp/ddp.h"

int dp_zero_init(struct dp_zero *z, struct dp_comm *comm, int64_t n, int stage, const struct dp_optim_params *op) {
    memset(z, 0, sizeof *z);
    if (stage < 0 || stage > 1)
        return dp_seterr(DP_ENOTSUP, "ZeRO stage %d is not built yet (--zero 0 or 1)", stage);
    z->stage = stage;
    z->comm = comm;
    z->n = n;
    z->parts = op->kind == DP_OPTIM_ADAMW ? 2 : op->momentum != 0.0f ? 1 : 0;
    int G = comm && stage ? dp_comm_world(comm) : 1;
    dp_comm_split(n, G, G > 1 ? dp_comm_rank(comm) : 0, &z->off, &z->len);
    return DP_OK;
}

int dp_zero_sumsq(struct dp_zero *z, const float *g, double *sumsq) {
    const float *s = g + z->off;
    double acc = 0.0;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < z->len; i++) acc += (double)s[i] * (double)s[i];
    *sumsq = acc;
    if (!z->stage || dp_comm_world(z->comm) == 1) return DP_OK;
    return dp_comm_allreduce(z->comm, sumsq, 1, DP_DTYPE_F64, DP_ALGO_AUTO);
}

int dp_zero_step(struct dp_zero *z, struct dp_optim *o, float *params, float *g, float lr, double clip_norm,
                 double sumsq) {
    float *gs = g + z->off;
    if (clip_norm > 0) { /* dp_clip_grad_norm's rule on the global norm */
        double norm = sqrt(sumsq), coef = clip_norm / (norm + 1e-6);
        if (isfinite(norm) && coef < 1.0) {
            const float c = (float)coef;
#pragma omp simd
            for (int64_t i = 0; i < z->len; i++) gs[i] *= c;
        }
    }
    int rc = dp_optim_step(o, params + z->off, gs, z->len, lr);
    z->t_g0 = z->t_g1 = dp_time();
    if (rc || !z->stage || dp_comm_world(z->comm) == 1) return rc;
    rc = dp_comm_allgather(z->comm, params, z->n, DP_DTYPE_F32, DP_ALGO_AUTO);
    z->t_g1 = dp_time();
    return rc;
}

int dp_zero_state_gather(struct dp_zero *z, const struct dp_optim *o, float *scratch, float *full) {
    for (int k = 0; k < z->parts; k++) {
        memcpy(scratch + z->off, o->state + (size_t)k * (size_t)z->len, sizeof(float) * (size_t)z->len);
        int rc = z->stage && dp_comm_world(z->comm) > 1
                     ? dp_comm_allgather(z->comm, scratch, z->n, DP_DTYPE_F32, DP_ALGO_AUTO)
                     : DP_OK;
        if (rc) return rc;
        if (full) memcpy(full + (size_t)k * (size_t)z->n, scratch, sizeof(float) * (size_t)z->n);
    }
    return DP_OK;
}

void dp_zero_state_take(const struct dp_zero *z, struct dp_optim *o, const float *full) {
    for (int k = 0; k < z->parts; k++)
        memcpy(o->state + (size_t)k * (size_t)z->len, full + (size_t)k * (size_t)z->n + z->off,
               sizeof(float) * (size_t)z->len);
}
