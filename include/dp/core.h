/*
 * dp/core.h — arena, counter-based RNG, timers, the CPU's measured peak and the
 * GEMM wrapper.
 *
 *     struct dp_arena a;
 *     dp_arena_init(&a, 1 << 20);
 *     float *x = dp_arena_alloc(&a, n * sizeof(float));   // NULL + message on failure
 *     dp_arena_reset(&a);                                 // every step
 *     dp_arena_free(&a);
 *
 *     float u = dp_rng_uniform(seed, DP_RNG_DROPOUT, sample_index, element);
 */
#ifndef DP_CORE_H
#define DP_CORE_H

#include <pthread.h>

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- arena: per-step activations ---------------------------------------- */

/* A bump allocator.  Allocations are 64-byte aligned and live until the next
 * dp_arena_reset().  When a step needs more than the arena holds, extra blocks
 * are chained; the next reset replaces them with one block of the high-water
 * size, so from the second step on no allocation reaches the system.  The
 * reset block's pages are touched at once (it will all be used); a chained
 * block's are left to first use, so that an oversized one costs address
 * space, not memory. */
struct dp_arena_block;
struct dp_arena {
    struct dp_arena_block *head; /* current block (most recent) */
    size_t used_total;           /* bytes handed out since the last reset */
    size_t high_water;           /* max of used_total over all steps */
    size_t capacity_total;       /* bytes held in all blocks */
};
int dp_arena_init(struct dp_arena *a, size_t initial_bytes);
void *dp_arena_alloc(struct dp_arena *a, size_t bytes);
/* Like dp_arena_alloc, zero-filled. */
void *dp_arena_calloc(struct dp_arena *a, size_t bytes);
void dp_arena_reset(struct dp_arena *a);
void dp_arena_free(struct dp_arena *a);
/* A scope inside a step: everything allocated after dp_arena_mark() is given
 * back by dp_arena_release() (blocks chained since are freed), so scratch
 * that dies early (one layer's backward temporaries) does not stack up over
 * the step.  Marks nest like a stack; releasing an older mark drops the newer. */
struct dp_arena_mark {
    struct dp_arena_block *block;
    size_t used, used_total;
};
struct dp_arena_mark dp_arena_mark(const struct dp_arena *a);
void dp_arena_release(struct dp_arena *a, struct dp_arena_mark m);

/* ---- counter-based RNG --------------------------------------------------- */

/* Philox4x32-10 (Salmon et al., SC'11): a keyed bijection of a 128-bit
 * counter.  Random numbers are a pure function of (seed, stream, a, b), so
 * the value used for sample i does not depend on which worker processes it
 * or in what order.  `stream` separates uses (initialisation, shuffle,
 * dropout, augmentation). */
enum dp_rng_stream {
    DP_RNG_INIT = 1,    /* a = parameter index, b = element */
    DP_RNG_SHUFFLE = 2, /* a = epoch, b = position */
    DP_RNG_DROPOUT = 3, /* a = global sample index, b = layer id << 32 | element */
    DP_RNG_AUGMENT = 4, /* a = global sample index, b = epoch << 8 | what */
    DP_RNG_TEXT = 5,    /* a = epoch, b = global sample index: a text window's start */
    DP_RNG_SAMPLE = 6,  /* a = generated token's index, b = 0: dptrain sample's draws */
    DP_RNG_SLOW = 7,    /* a = job rank, b = 2 * step (+1): --simulate-jitter's draws */
    DP_RNG_POWERSGD = 8, /* a = parameter index, b = element: PowerSGD's initial Q */
    DP_RNG_VALSPLIT = 9, /* a = 0, b = position: --val-split's held-out samples */
    DP_RNG_USER = 16
};
/* Four 32-bit random words for counter (a, b) under key (seed, stream). */
void dp_rng_philox(uint64_t seed, uint32_t stream, uint64_t a, uint64_t b, uint32_t out[4]);
uint32_t dp_rng_u32(uint64_t seed, uint32_t stream, uint64_t a, uint64_t b);
/* Uniform in [0, 1), 24 bits of precision. */
float dp_rng_uniform(uint64_t seed, uint32_t stream, uint64_t a, uint64_t b);
/* Standard normal (Box-Muller on two words of one Philox call). */
float dp_rng_normal(uint64_t seed, uint32_t stream, uint64_t a, uint64_t b);
/* Fills perm[0..n) with a uniformly random permutation of 0..n-1, a pure
 * function of (seed, stream, a). */
void dp_rng_permutation(uint64_t seed, uint32_t stream, uint64_t a, int64_t *perm, int64_t n);

/* ---- timers --------------------------------------------------------------- */

/* Monotonic time in seconds. */
double dp_time(void);
/* Timed waits on dp_time()'s clock.  dp_cond_init_monotonic makes a condition
 * variable whose timed waits use CLOCK_MONOTONIC (so a deadline does not move
 * with the wall clock); 0 or -1.  dp_cond_wait_until waits on cv (mu held)
 * until it is signalled or dp_time() passes deadline: ETIMEDOUT past it (at
 * once if it already has), else 0.  cv must come from dp_cond_init_monotonic. */
int dp_cond_init_monotonic(pthread_cond_t *cv);
int dp_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, double deadline);

/* ---- exact sums ---------------------------------------------------------------- */

/* Fixed point for float sums whose bits must not depend on their order (the
 * deterministic mode, the parameter server's exact SSP sum): x becomes
 * round(x * 2^32), an integer held exactly in a double, and integers below
 * 2^53 add exactly in any order and grouping. */
#define DP_FIXED_SCALE 4294967296.0 /* 2^32 */
/* acc[i] += round(g[i] * 2^32) for i < n, vectorised.  Returns 1 when some
 * |g[i]| * 2^32 reaches 2^52 (|g| >= 2^20) or is NaN: beyond that a sum of
 * many could leave the exact range, so the caller fails the step. */
int dp_fixed_add(double *restrict acc, const float *restrict g, int64_t n);
/* The same in one pass that also zeroes g (the deterministic step's chunks: the next chunk's
 * backward accumulates into g); with `store`, acc[i] = 0.0 + round(g[i] * 2^32) instead (the
 * step's first chunk: no zeroing pass over acc first; 0.0 + v is the bits of adding to a zeroed
 * acc, -0.0 included). */
int dp_fixed_take(double *restrict acc, float *restrict g, int64_t n, int store);

/* ---- the CPU's peak ---------------------------------------------------------- */

/* The fp32 peak of one core in FLOP/s, measured on the first call (about
 * 10 ms: a loop of independent FMAs on the widest ISA the CPU has, AVX-512 or
 * AVX2+FMA, best of many repetitions) and cached for the process; thread-safe.
 * Single-threaded, so a figure for T cores is T times this.  0 where it
 * cannot be measured (not x86, no AVX2+FMA, or the loop's result is not
 * sane): then there is no peak to compare against, not a guess. */
double dp_cpu_peak_flops(void);
/* The ISA the peak was measured with ("avx512f", "avx2+fma"), or NULL when
 * dp_cpu_peak_flops() is 0. */
const char *dp_cpu_peak_isa(void);

/* ---- GEMM ----------------------------------------------------------------- */

/* Row-major single-precision GEMM:
 *     C (M, N) = alpha * op(A) (M, K) · op(B) (K, N) + beta * C
 * op(X) = X or X^T.  lda/ldb/ldc are row strides of A, B, C as stored.
 * beta == 0 means C is not read (it may hold NaNs). */
enum dp_gemm_backend {
    DP_GEMM_REF = 0,  /* plain C, the reference the tests compare against */
    DP_GEMM_BLAS,     /* OpenBLAS cblas_sgemm */
    DP_GEMM_DNNL,     /* oneDNN dnnl_sgemm (AVX-512 here) */
    DP_GEMM_BACKEND_COUNT
};
void dp_gemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
             const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
             int64_t ldc);
/* The plain reference, always available. */
void dp_gemm_ref(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                 int64_t ldc);
/* Selects the backend for the calling process.  DP_ENOTSUP if not built in. */
int dp_gemm_set_backend(enum dp_gemm_backend b);
enum dp_gemm_backend dp_gemm_get_backend(void);
/* "ref", "blas", "dnnl"; parses the same names (returns -1 if unknown). */
const char *dp_gemm_backend_name(enum dp_gemm_backend b);
int dp_gemm_backend_parse(const char *name);
int dp_gemm_backend_available(enum dp_gemm_backend b);
/* When the oneDNN backend's dnnl_sgemm fails (it rejects arguments the
 * reference accepts, e.g. lda < K, or runs out of memory), dp_gemm computes
 * the call with the reference instead, correct but slower.  That is recorded,
 * never silent: dp_gemm_fallback_note() is NULL while no call has fallen
 * back, and afterwards a message about the first failure (its status and
 * shape; static, never changes again), for the caller to print.
 * dp_gemm_fallback_count() is the number of calls that fell back so far.
 * Per process, thread-safe. */
const char *dp_gemm_fallback_note(void);
int64_t dp_gemm_fallback_count(void);

/* Compute threads used by the calling thread's kernels (OpenMP team size for
 * its parallel loops and for the GEMM library).  Per calling thread, so each
 * data-parallel worker thread can set its own. */
void dp_set_num_threads(int n);
int dp_get_num_threads(void);
/* The CPUs the calling thread may run on: its affinity (taskset, a cgroup
 * cpuset or an MPI binding narrow it), else the online CPUs; at least 1. */
int dp_cpus_allowed(void);
/* The calling thread's seconds on a CPU and seconds runnable but waiting for
 * one (the run queue: another thread had its core, or it was being woken),
 * since the thread started, from the kernel's /proc/thread-self/schedstat.
 * Returns 0, or -1 where the kernel does not say (not Linux, no schedstat). */
int dp_thread_sched_times(double *run_s, double *runq_s);

/* ---- small helpers --------------------------------------------------------- */

/* FNV-1a 64 over bytes; the parameter hash that runs are compared by. */
uint64_t dp_fnv1a64(const void *data, size_t n, uint64_t h);
#define DP_FNV1A64_INIT 0xcbf29ce484222325ULL
/* CRC-32 (IEEE, zlib's polynomial) */
uint32_t dp_crc32(uint32_t crc, const void *data, size_t n);
/* How far b is from a: max_i |a_i - b_i| / max_i |a_i| over n floats, the
 * one comparison `dptrain ckpt diff` and the tests use.  0 when a == b
 * (all-zero arrays too), INFINITY when b differs from an all-zero a, and
 * INFINITY when any element of a or b is NaN or Inf: a non-finite value is
 * never "within tolerance", even in both arrays at the same place. */
double dp_rel_diff(const float *a, const float *b, int64_t n);
/* 1 if any of x[0..n) is NaN or Inf (one vectorised read pass: the
 * trainer's check of every reduced gradient), else 0. */
int dp_any_nonfinite(const float *x, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
