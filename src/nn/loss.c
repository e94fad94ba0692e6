/* Softmax cross-entropy over rows of logits, numerically stable.
 *
 * exp is dp__expf (2e-7 relative error, vectorised).
 *
 * Rows are independent: a row is a sample's logits (V), or one position of a
 * sequence model's (T, V) output.  The per-row losses are summed in fixed
 * chunks whose partial sums are added in order, so the result does not depend
 * on the number of threads.
 *
 * Letters: R rows, V classes. */
#include <math.h>
#include <string.h>

#include "nn/layers_impl.h"

#define XENT_CHUNKS 256

/* Forward:  loss_r = log sum_j exp(z_rj - m_r) + m_r - z_r[t_r],   m_r = max_j z_rj
 * Backward: dz_rj = scale * (softmax(z_r)_j - [j == t_r])
 * One row; returns its loss and sets *hit when the first argmax equals t. */
static double xent_row(float *dz, const float *z, int32_t t, int64_t V, float scale, int *hit) {
    /* max over 16 independent lanes: vectorises without fast-math */
    float m16[16];
    for (int k = 0; k < 16; k++)
        m16[k] = z[0];
    int64_t j0 = 0;
    for (; j0 + 16 <= V; j0 += 16)
        for (int k = 0; k < 16; k++)
            m16[k] = z[j0 + k] > m16[k] ? z[j0 + k] : m16[k];
    for (; j0 < V; j0++)
        m16[0] = z[j0] > m16[0] ? z[j0] : m16[0];
    float mx = m16[0];
    for (int k = 1; k < 16; k++)
        mx = m16[k] > mx ? m16[k] : mx;
    const float zt = z[t];
    /* the prediction is the first argmax, as torch.argmax */
    int h = zt == mx;
    for (int64_t j = 0; h && j < t; j++)
        if (z[j] == mx) h = 0;
    *hit = h;
    double sum = 0.0;
    if (dz) {
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < V; j++) {
            float e = dp__expf(z[j] - mx);
            dz[j] = e;
            sum += e;
        }
        const float k = (float)((double)scale / sum);
#pragma omp simd
        for (int64_t j = 0; j < V; j++)
            dz[j] *= k;
        dz[t] -= scale;
    } else {
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < V; j++)
            sum += dp__expf(z[j] - mx);
    }
    return log(sum) + (double)mx - (double)zt;
}

int dp_softmax_xent(float *dlogits, double *loss_sum, int64_t *correct, const float *logits,
                    const int32_t *targets, int64_t R, int64_t V, float scale) {
    if (R < 0 || V <= 0)
        return dp_seterr(DP_EINVAL, "softmax_xent: %lld rows of %lld classes", (long long)R,
                         (long long)V);
    if (R > 0 && (!logits || !targets))
        return dp_seterr(DP_EINVAL, "softmax_xent: no %s", logits ? "targets" : "logits");
    for (int64_t r = 0; r < R; r++)
        if (targets[r] < 0 || targets[r] >= V)
            return dp_seterr(DP_EINVAL, "softmax_xent: row %lld: target %d outside [0, %lld)",
                             (long long)r, (int)targets[r], (long long)V);
    double part[XENT_CHUNKS];
    int64_t hits[XENT_CHUNKS];
    const int64_t nchunk = R < XENT_CHUNKS ? R : XENT_CHUNKS;
    const int64_t per = nchunk ? (R + nchunk - 1) / nchunk : 0;
#pragma omp parallel for schedule(static) if (R * V >= DP__OMP_MIN)
    for (int64_t k = 0; k < nchunk; k++) {
        int64_t r0 = k * per, r1 = r0 + per < R ? r0 + per : R;
        double ls = 0.0;
        int64_t hc = 0;
        for (int64_t r = r0; r < r1; r++) {
            int h;
            ls += xent_row(dlogits ? dlogits + r * V : NULL, logits + r * V, targets[r], V, scale,
                           &h);
            hc += h;
        }
        part[k] = ls;
        hits[k] = hc;
    }
    double total = 0.0;
    int64_t nhit = 0;
    for (int64_t k = 0; k < nchunk; k++) {
        total += part[k];
        nhit += hits[k];
    }
    if (loss_sum) *loss_sum = total;
    if (correct) *correct = nhit;
    return DP_OK;
}

void dp_tp_slice(int64_t N, int size, int rank, int64_t *v0, int64_t *n) {
    const int64_t q = N / size, extra = N % size;
    *v0 = rank * q + (rank < extra ? rank : extra);
    *n = q + (rank < extra);
}

/* Split over a tensor group: z is this rank's classes [v0, v0 + Vl) of each row.
 *   m_r = max over ranks of max_j z_rj         (the ranks' maxima: slot r T + rank of one sum)
 *   S_r = sum over ranks of sum_j exp(z_rj - m_r),  z_r[t_r] from the rank that holds t_r,
 *   the first argmax from the first rank whose maximum is m_r   (one sum of 3 R)
 *   loss_r = log S_r + m_r - z_r[t_r],   dz_rj = scale (exp(z_rj - m_r) / S_r - [v0 + j == t_r]) */
int dp_softmax_xent_split(float *dlogits, double *loss_sum, int64_t *correct, const float *logits,
                          const int32_t *targets, int64_t R, int64_t V, int64_t v0, int64_t Vl, float scale,
                          const struct dp_tp *tp) {
    const int T = tp->size;
    for (int64_t r = 0; r < R; r++)
        if (targets[r] < 0 || targets[r] >= V)
            return dp_seterr(DP_EINVAL, "softmax_xent: row %lld: target %d outside [0, %lld)", (long long)r,
                             (int)targets[r], (long long)V);
    float *mx = dp_calloc((size_t)(R * T + 3 * R + 1), sizeof(float)), *agg = mx + R * T;
    int64_t *arg = dp_malloc(sizeof(int64_t) * (size_t)(R + 1));
    if (!mx || !arg) {
        dp_free(mx), dp_free(arg);
        return dp_seterr(DP_ENOMEM, "softmax_xent: out of memory");
    }
    for (int64_t r = 0; r < R; r++) { /* this rank's maximum and its first argmax */
        const float *z = logits + r * Vl;
        int64_t a = 0;
        for (int64_t j = 1; j < Vl; j++)
            if (z[j] > z[a]) a = j;
        arg[r] = v0 + a;
        mx[r * T + tp->rank] = Vl > 0 ? z[a] : -INFINITY;
    }
    int rc = tp->allreduce(tp->arg, mx, R * T);
    for (int64_t r = 0; !rc && r < R; r++) {
        float m = mx[r * T];
        int owner = 0;
        for (int k = 1; k < T; k++)
            if (mx[r * T + k] > m) m = mx[r * T + k], owner = k;
        const float *z = logits + r * Vl;
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < Vl; j++)
            s += dp__expf(z[j] - m);
        mx[r * T] = m; /* (kept for below) */
        agg[r] = (float)s;
        agg[R + r] = targets[r] >= v0 && targets[r] < v0 + Vl ? z[targets[r] - v0] : 0.0f;
        agg[2 * R + r] = owner == tp->rank ? (float)arg[r] : 0.0f;
    }
    if (!rc) rc = tp->allreduce(tp->arg, agg, 3 * R);
    double total = 0.0;
    int64_t hits = 0;
    for (int64_t r = 0; !rc && r < R; r++) {
        const float m = mx[r * T], S = agg[r];
        total += log((double)S) + (double)m - (double)agg[R + r];
        hits += (int64_t)agg[2 * R + r] == targets[r];
        if (!dlogits) continue;
        const float *z = logits + r * Vl;
        float *dz = dlogits + r * Vl;
        const float k = scale / S;
#pragma omp simd
        for (int64_t j = 0; j < Vl; j++)
            dz[j] = dp__expf(z[j] - m) * k;
        if (targets[r] >= v0 && targets[r] < v0 + Vl) dz[targets[r] - v0] -= scale;
    }
    dp_free(mx), dp_free(arg);
    if (rc) return rc;
    if (loss_sum) *loss_sum = total;
    if (correct) *correct = hits;
    return DP_OK;
}

/* One pass per row, in row order: the sums are the same bits for any thread count. */
int dp_mse(float *dout, double *loss_sum, double *abs_sum, const float *out, const float *target, int64_t R,
           int64_t K, float scale) {
    if (R < 0 || K <= 0) return dp_seterr(DP_EINVAL, "mse: %lld rows of %lld outputs", (long long)R, (long long)K);
    if (R > 0 && (!out || !target)) return dp_seterr(DP_EINVAL, "mse: no %s", out ? "targets" : "outputs");
    double ls = 0, as = 0;
    const float g = scale * 2.0f / (float)K;
    for (int64_t r = 0; r < R; r++) {
        double sq = 0, ab = 0;
        for (int64_t k = 0; k < K; k++) {
            float d = out[r * K + k] - target[r * K + k];
            sq += (double)d * d, ab += fabs((double)d);
            if (dout) dout[r * K + k] = g * d;
        }
        ls += sq / (double)K, as += ab / (double)K;
    }
    if (loss_sum) *loss_sum = ls;
    if (abs_sum) *abs_sum = as;
    return DP_OK;
}
