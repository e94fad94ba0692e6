/*
 * AdamW (decoupled weight decay), step for step the single-tensor path of
 * PyTorch 1.13's torch.optim.AdamW (amsgrad off).
 *
 * The state is m (n floats) followed by v (n floats).  With t = step + 1:
 *     p = p * (1 - lr*wd)
 *     m = b1*m + (1-b1)*g
 *     v = b2*v + (1-b2)*g*g
 *     p = p - (lr / (1-b1^t)) * m / (sqrt(v) / sqrt(1-b2^t) + eps)
 * which is p -= lr * mhat / (sqrt(vhat) + eps) with PyTorch's rounding: the
 * scalars (bias corrections, step size) are computed in double and rounded
 * to float once, as PyTorch does with Python floats, and the element-wise
 * operations round where PyTorch's vectorised kernels do (see DP__FMA).
 *
 * The slab is processed in blocks of BLOCK floats, three passes per block
 * (moments, square root, update), so that each pass is a loop the compiler
 * vectorises; the block's temporaries stay in L1.  The square root has its
 * own pass because sqrtf() may set errno, and neither GCC nor Clang will
 * vectorise it unless -fno-math-errno is given.
 */
#include <math.h>

#if !defined(__NO_MATH_ERRNO__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#endif

#include "optim_impl.h"

enum { BLOCK = 512 };

/* x = sqrt(x) for x >= 0, correctly rounded (as sqrtf).  The SSE/AVX square
 * root instructions are IEEE correctly rounded too, so every path gives the
 * same bits; they only skip the errno handling. */
static void sqrt_inplace(float *restrict x, int64_t n) {
    int64_t i = 0;
#if defined(__NO_MATH_ERRNO__)
    DP__SIMD
    for (i = 0; i < n; i++) x[i] = sqrtf(x[i]);
#else
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_sqrt_ps(_mm512_loadu_ps(x + i)));
#elif defined(__AVX__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
#elif defined(__SSE__)
    for (; i + 4 <= n; i += 4) _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
#endif
    for (; i < n; i++) x[i] = sqrtf(x[i]);
#endif
}

/* Moments, and a copy of v for the square-root pass:
 *     m = b1*m + c1*g            (c1 = 1-b1; mul_ then add_ = one FMA)
 *     v = b2*v + (c2*g)*g        (c2 = 1-b2; mul_ then addcmul_ = one FMA)
 *     s = v                                                                 */
static void adamw_moments(float *restrict m, float *restrict v, float *restrict s,
                          const float *restrict g, int64_t n, float b1, float c1, float b2,
                          float c2) {
    DP__SIMD
    for (int64_t i = 0; i < n; i++) {
        float mb = b1 * m[i];
        m[i] = DP__FMA(c1, g[i], mb);
        float vb = b2 * v[i];
        v[i] = DP__FMA(c2 * g[i], g[i], vb);
        s[i] = v[i];
    }
}

/* Update, with s = sqrt(v) (mul_, then addcdiv_, no FMA):
 *     p = p*decay - (step_size*m) / (s/bc2_sqrt + eps)
 * decay = 1 - lr*wd, step_size = lr/(1-b1^t), bc2_sqrt = sqrt(1-b2^t).     */
static void adamw_apply(float *restrict p, const float *restrict m, const float *restrict s,
                        int64_t n, float decay, float step_size, float bc2_sqrt, float eps) {
    DP__SIMD
    for (int64_t i = 0; i < n; i++) {
        float denom = s[i] / bc2_sqrt + eps;
        float pd = p[i] * decay;
        p[i] = pd - step_size * m[i] / denom;
    }
}

void dp__adamw_step(struct dp_optim *o, float *params, const float *grads, float lr) {
    const struct dp_optim_params *hp = &o->p;
    const double t = (double)(o->step + 1);
    const double bc1 = 1.0 - pow((double)hp->beta1, t);
    const double bc2 = 1.0 - pow((double)hp->beta2, t);
    const float decay = (float)(1.0 - (double)lr * (double)hp->weight_decay);
    const float step_size = (float)((double)lr / bc1);
    const float bc2_sqrt = (float)sqrt(bc2);
    const float b1 = hp->beta1, c1 = (float)(1.0 - (double)hp->beta1);
    const float b2 = hp->beta2, c2 = (float)(1.0 - (double)hp->beta2);
    float *m = o->state, *v = o->state + o->n;
    _Alignas(64) float s[BLOCK];

    for (int64_t i0 = 0; i0 < o->n; i0 += BLOCK) {
        int64_t len = o->n - i0 < BLOCK ? o->n - i0 : BLOCK;
        adamw_moments(m + i0, v + i0, s, grads + i0, len, b1, c1, b2, c2);
        sqrt_inplace(s, len);
        adamw_apply(params + i0, m + i0, s, len, decay, step_size, bc2_sqrt, hp->eps);
    }
}
