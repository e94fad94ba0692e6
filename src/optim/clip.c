/*
 * Global gradient norm and clipping by norm (PyTorch clip_grad_norm_, L2).
 */
#include <math.h>

#include "optim_impl.h"

/* sum g^2 in double.  The simd reduction keeps one partial sum per vector
 * lane, so the order of additions depends on the vector width; the result is
 * the same on every rank of one build on one kind of machine. */
double dp_grad_norm(const float *g, int64_t n) {
    DP_ASSERT(n == 0 || g != NULL);
    double acc = 0.0;
#ifdef _OPENMP
#pragma omp simd reduction(+ : acc)
#endif
    for (int64_t i = 0; i < n; i++) acc += (double)g[i] * (double)g[i];
    return sqrt(acc);
}

/* coef = max_norm / (norm + 1e-6); g *= coef only when coef < 1.  PyTorch
 * keeps coef in a float32 tensor; it is rounded to float here as well. */
double dp_clip_grad_norm(float *g, int64_t n, double max_norm) {
    double norm = dp_grad_norm(g, n);
    double coef = max_norm / (norm + 1e-6);
    if (!isfinite(norm) || !(coef < 1.0)) return norm;
    const float c = (float)coef;
    DP__SIMD
    for (int64_t i = 0; i < n; i++) g[i] *= c;
    return norm;
}
