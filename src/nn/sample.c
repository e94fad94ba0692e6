/* Sampling the next token of a language model from one row of logits
 * (dptrain sample, issue 10 F3).
 *
 * With temperature T the distribution is softmax(z / T): T < 1 sharpens it,
 * T > 1 flattens it, and T -> 0 tends to the argmax, which T = 0 takes
 * exactly (greedy decoding).  Top-k keeps the k largest logits and
 * renormalises over them; k = 1 is greedy at any temperature.
 *
 * The draw is inverse-CDF: with weights w_i = exp((z_i - max z) / T) (the
 * max subtracted so that the largest weight is 1 and nothing overflows;
 * softmax is invariant to the shift) and W = sum w_i, token i is chosen
 * when its interval [w_0 + .. + w_{i-1}, .. + w_i) of [0, W) holds u * W,
 * which happens with probability w_i / W for u uniform in [0, 1).  The walk
 * is in index order over the kept tokens, so the token a given u picks does
 * not depend on how the top k were found, and k = 0 and k = V agree bit for
 * bit.  Sums are in double: with V = 65536 weights the rounding of W is far
 * below the 2^-53 resolution that matters for u.
 *
 * Letters: V vocabulary size, T temperature, k top-k. */
#include <math.h>
#include <stdlib.h>

#include "nn/layers_impl.h"

struct cand {
    float z;
    int32_t i;
};

/* Larger logit first; among equal logits the lower index first, so the
 * order is total and the top k well defined with ties. */
static int cand_cmp(const void *pa, const void *pb) {
    const struct cand *a = pa, *b = pb;
    if (a->z != b->z) return a->z > b->z ? -1 : 1;
    return (a->i > b->i) - (a->i < b->i);
}

int dp_sample_token(const float *z, int64_t V, double temperature, int64_t top_k, double u) {
    if (!z) return dp_seterr(DP_EINVAL, "sample: NULL logits");
    if (V < 1 || V > INT32_MAX)
        return dp_seterr(DP_EINVAL, "sample: vocabulary of %lld tokens", (long long)V);
    if (!(temperature >= 0) || !isfinite(temperature))
        return dp_seterr(DP_EINVAL, "sample: temperature %g is not a finite number >= 0", temperature);
    if (top_k < 0 || top_k > V)
        return dp_seterr(DP_EINVAL, "sample: top-k %lld outside 0..%lld", (long long)top_k, (long long)V);
    if (!(u >= 0 && u < 1)) return dp_seterr(DP_EINVAL, "sample: uniform draw %g outside [0, 1)", u);
    int64_t best = 0;
    for (int64_t i = 0; i < V; i++) {
        if (isnan(z[i]) || z[i] == INFINITY)
            return dp_seterr(DP_EINVAL, "sample: logit %lld is %g", (long long)i, (double)z[i]);
        if (z[i] > z[best]) best = i;
    }
    if (z[best] == -INFINITY) return dp_seterr(DP_EINVAL, "sample: every logit is -inf");
    if (temperature == 0 || top_k == 1) return (int)best;

    /* The k-th largest in (logit desc, index asc) order is the threshold:
     * token i is kept when it comes no later than that one. */
    float zt = -INFINITY;
    int64_t it = V;
    if (top_k > 0 && top_k < V) {
        struct cand *c = dp_malloc(sizeof *c * (size_t)V);
        if (!c) return dp_seterr(DP_ENOMEM, "sample: cannot allocate %lld candidates", (long long)V);
        for (int64_t i = 0; i < V; i++) c[i].z = z[i], c[i].i = (int32_t)i;
        qsort(c, (size_t)V, sizeof *c, cand_cmp);
        zt = c[top_k - 1].z, it = c[top_k - 1].i;
        dp_free(c);
    }
#define KEPT(i) (z[i] > zt || (z[i] == zt && (i) <= it))
    const double zmax = z[best], inv_t = 1.0 / temperature;
    double W = 0;
    for (int64_t i = 0; i < V; i++)
        if (KEPT(i)) W += exp(((double)z[i] - zmax) * inv_t);
    /* W >= 1: the argmax is kept and its weight is exp(0) */
    const double target = u * W;
    double acc = 0;
    int64_t last = best;
    for (int64_t i = 0; i < V; i++) {
        if (!KEPT(i)) continue;
        double w = exp(((double)z[i] - zmax) * inv_t);
        if (w == 0) continue; /* never drawn, not even by rounding below */
        acc += w;
        last = i;
        if (acc > target) return (int)i;
    }
#undef KEPT
    /* Only rounding gets here (the running sum fell a few ulps short of
     * u * W for u close to 1): the last token with a weight. */
    return (int)last;
}

double dp_sample_uniform(uint64_t seed, int64_t step) {
    uint32_t o[4];
    dp_rng_philox(seed, DP_RNG_SAMPLE, (uint64_t)step, 0, o);
    uint64_t r = ((uint64_t)o[0] << 32 | o[1]) >> 11; /* the top 53 bits */
    return (double)r * 0x1p-53;
}
