/*
 * src/optim/optim_impl.h — internal interface of the optimizer subsystem.
 *
 * optim.c validates parameters, owns the state slab and dispatches each step
 * to one kernel file per optimizer (sgd.c, adamw.c).  The kernels assume a
 * validated optimizer and non-overlapping slabs; they never fail.
 */
#ifndef DP_OPTIM_IMPL_H
#define DP_OPTIM_IMPL_H

#include <math.h>

#include "dp/optim.h"

/* `#pragma omp simd` on the update loops.  GCC at -O2 vectorises only loops
 * whose vector code needs no scalar epilogue (the "very cheap" cost model),
 * which excludes every loop over an arbitrary n; the pragma asks for the
 * vector loop regardless.  It is empty when OpenMP is off, so that
 * -Wunknown-pragmas stays quiet. */
#ifdef _OPENMP
#define DP__SIMD _Pragma("omp simd")
#else
#define DP__SIMD
#endif

/* a*b + c.  PyTorch's vectorised CPU kernels compute add(x, y, alpha=a) as
 * fmadd(y, a, x), rounded once; using fmaf at the same places makes our
 * results equal PyTorch's bit for bit.  Without hardware FMA, fmaf is a slow
 * library call, so there it is a*b + c (the last bit may then differ).
 * Elsewhere the kernels keep each product in its own statement, so that a
 * compiler that contracts within expressions (Clang) cannot fuse what
 * PyTorch rounds twice. */
#if defined(__FMA__) || defined(FP_FAST_FMAF) || defined(__aarch64__)
#define DP__FMA(a, b, c) fmaf((a), (b), (c))
#else
#define DP__FMA(a, b, c) ((a) * (b) + (c))
#endif

/* One step of each optimizer over o->n floats.  o->step is the number of
 * steps taken before this one; the caller increments it afterwards. */
void dp__sgd_step(struct dp_optim *o, float *params, const float *grads, float lr);
void dp__adamw_step(struct dp_optim *o, float *params, const float *grads, float lr);

#endif
