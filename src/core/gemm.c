/* The GEMM wrapper: one entry point, three backends (and our own kernel for the small
 * products, gemm_small.c).
 *
 * Measured here (docs/architecture.md §3): oneDNN's dnnl_sgemm reaches ~199 GFLOP/s on
 * one core (AVX-512), Debian's OpenBLAS ~107 GFLOP/s (held to its AVX2
 * kernels by OPENBLAS_CORETYPE=Haswell).  bench/gemm re-measures; the
 * default is oneDNN when it was built in. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/core_impl.h"
#include "dp/core.h"

#ifdef DP_WITH_DNNL
#include <dnnl.h>
#include <dnnl_debug.h>
#endif
#ifdef DP_WITH_BLAS
#include <cblas.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(DP_WITH_DNNL)
static enum dp_gemm_backend backend = DP_GEMM_DNNL;
#elif defined(DP_WITH_BLAS)
static enum dp_gemm_backend backend = DP_GEMM_BLAS;
#else
static enum dp_gemm_backend backend = DP_GEMM_REF;
#endif

static const char *backend_names[DP_GEMM_BACKEND_COUNT] = {"ref", "blas", "dnnl"};

const char *dp_gemm_backend_name(enum dp_gemm_backend b) {
    return (unsigned)b < DP_GEMM_BACKEND_COUNT ? backend_names[b] : "?";
}

int dp_gemm_backend_parse(const char *name) {
    for (int i = 0; i < DP_GEMM_BACKEND_COUNT; i++)
        if (strcmp(name, backend_names[i]) == 0) return i;
    return -1;
}

int dp_gemm_backend_available(enum dp_gemm_backend b) {
    switch (b) {
    case DP_GEMM_REF: return 1;
#ifdef DP_WITH_BLAS
    case DP_GEMM_BLAS: return 1;
#endif
#ifdef DP_WITH_DNNL
    case DP_GEMM_DNNL: return 1;
#endif
    default: return 0;
    }
}

/* ---- the fallback record --------------------------------------------------------- */

/* Calls that fell back to the reference, and the note about the first.  The
 * caller whose increment took the count from 0 writes the note, then
 * publishes it with a release store; readers load the flag with acquire, so
 * they see either NULL or the finished text, and the text is written once. */
static atomic_llong fallback_calls;
static atomic_int fallback_ready;
static char fallback_msg[256];

const char *dp_gemm_fallback_note(void) {
    return atomic_load_explicit(&fallback_ready, memory_order_acquire) ? fallback_msg : NULL;
}

int64_t dp_gemm_fallback_count(void) { return (int64_t)atomic_load(&fallback_calls); }

#ifdef DP_WITH_DNNL
static void record_fallback(dnnl_status_t st, int ta, int tb, int64_t M, int64_t N, int64_t K,
                            int64_t lda, int64_t ldb, int64_t ldc) {
    if (atomic_fetch_add(&fallback_calls, 1) != 0) return;
    snprintf(fallback_msg, sizeof fallback_msg,
             "oneDNN's dnnl_sgemm failed (%s) on M=%lld N=%lld K=%lld, op(A)=%c op(B)=%c, "
             "lda=%lld ldb=%lld ldc=%lld; the reference GEMM computed it instead (slower)",
             dnnl_status2str(st), (long long)M, (long long)N, (long long)K, ta ? 'T' : 'N',
             tb ? 'T' : 'N', (long long)lda, (long long)ldb, (long long)ldc);
    atomic_store_explicit(&fallback_ready, 1, memory_order_release);
}
#endif

int dp_gemm_set_backend(enum dp_gemm_backend b) {
    if (!dp_gemm_backend_available(b))
        return dp_seterr(DP_ENOTSUP, "gemm backend '%s' was not built in", dp_gemm_backend_name(b));
    backend = b;
    return DP_OK;
}

enum dp_gemm_backend dp_gemm_get_backend(void) { return backend; }

/* Reference: C = alpha op(A) op(B) + beta C, in the i-k-j order so that the
 * inner loop runs over contiguous rows of B and C when B is not transposed. */
void dp_gemm_ref(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                 int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    for (int64_t i = 0; i < M; i++) {
        float *c = C + i * ldc;
        if (beta == 0.0f)
            for (int64_t j = 0; j < N; j++) c[j] = 0.0f;
        else if (beta != 1.0f)
            for (int64_t j = 0; j < N; j++) c[j] *= beta;
        for (int64_t k = 0; k < K; k++) {
            float a = alpha * (ta ? A[k * lda + i] : A[i * lda + k]);
            if (a == 0.0f) continue;
            if (!tb) {
                const float *b = B + k * ldb;
                for (int64_t j = 0; j < N; j++) c[j] += a * b[j];
            } else {
                for (int64_t j = 0; j < N; j++) c[j] += a * B[j * ldb + k];
            }
        }
    }
}

static _Thread_local int nthreads = 1; /* dp_set_num_threads */

#if defined(DP_WITH_DNNL) || defined(DP_WITH_BLAS)
#ifdef DP_WITH_BLAS
/* OpenBLAS's own (the Makefile links -lopenblas), declared here since not every cblas.h has it */
void openblas_set_num_threads(int num_threads);
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static void blas_one_thread(void) { openblas_set_num_threads(1); }
#endif

/* The libraries' GEMMs give the same bits for the same call on one thread, but
 * not across thread counts: with several threads oneDNN may split the sum over
 * K between them, and its kernel depends on the shape (oneDNN 2.6 on an AVX2
 * CPU: C differs between 1 and 2 threads for 16x16x4096, and between one call
 * and the same rows in two calls); Debian's OpenBLAS runs a pool of its own,
 * one thread per core, whatever the caller asked.  So C is cut into tiles
 * chosen from the shape alone, never from the thread count, each tile one
 * single-threaded library call over the whole K, and the caller's threads
 * (dp_set_num_threads) share the tiles: the same bits for any count.
 *   A GEMM of at most TILE_WORK multiply-adds is one tile (the library's own
 *   call, as unthreaded); a larger one is cut into bands of rows (or of
 *   columns when it has few rows) of about TILE_WORK each, a multiple of 64,
 *   so each band re-packs the other operand: a few percent of the work in
 *   memory traffic, and enough bands for the threads. */
#define TILE_WORK ((int64_t)1 << 22)

/* Tile t of the grid of bm x bn tiles (tn per row of tiles): one library call on
 * this thread; a call the library refuses is computed by the reference (C is
 * untouched by the failed call).  Returns the library's status. */
static int gemm_tile(enum dp_gemm_backend be, int ta, int tb, int64_t M, int64_t N, int64_t K, int64_t bm, int64_t bn,
                     int64_t tn, int64_t t, float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                     float beta, float *C, int64_t ldc, const struct dp__gemm_post *post) {
    const int64_t i0 = (t / tn) * bm, j0 = (t % tn) * bn;
    const int64_t m = M - i0 < bm ? M - i0 : bm, n = N - j0 < bn ? N - j0 : bn;
    const float *a = ta ? A + i0 : A + i0 * lda, *b = tb ? B + j0 * ldb : B + j0;
    float *c = C + i0 * ldc + j0;
    int s = 0;
#ifdef DP_WITH_DNNL
    if (be == DP_GEMM_DNNL)
        s = (int)dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, K, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
#ifdef DP_WITH_BLAS
    if (be == DP_GEMM_BLAS)
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)m, (int)n,
                    (int)K, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
#endif
    if (s) dp_gemm_ref(ta, tb, m, n, K, alpha, a, lda, b, ldb, beta, c, ldc);
    if (post) post->fn(post->arg, c, ldc, i0, j0, m, n); /* the tile is still in this core's cache */
    return s;
}
static int gemm_tiled(enum dp_gemm_backend be, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                      const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc,
                      const struct dp__gemm_post *post) {
    int64_t bm = M, bn = N; /* the tile */
    if (M * N * K > TILE_WORK) {
        if (M >= 128) bm = (TILE_WORK / (N * K) + 63) / 64 * 64;
        else bn = (TILE_WORK / (M * K) + 63) / 64 * 64;
        if (bm < 64) bm = 64 < M ? 64 : M;
        if (bn < 64) bn = 64 < N ? 64 : N;
    }
    const int64_t tm = (M + bm - 1) / bm, tn = (N + bn - 1) / bn, nt = tm * tn;
    const int nth = nthreads < nt ? nthreads : (int)nt;
    int st = 0;
#ifdef DP_WITH_BLAS
    if (be == DP_GEMM_BLAS) pthread_once(&blas_once, blas_one_thread);
#endif
    if (nth == 1) {
        /* one thread for all the tiles: no parallel region on this (the common) path; the
         * library runs on this thread only (a caller with more threads than tiles included) */
#ifdef _OPENMP
        const int was = omp_get_max_threads();
        if (was > 1) omp_set_num_threads(1);
#endif
        for (int64_t t = 0; t < nt; t++) {
            int s = gemm_tile(be, ta, tb, M, N, K, bm, bn, tn, t, alpha, A, lda, B, ldb, beta, C, ldc, post);
            if (s) st = s;
        }
#ifdef _OPENMP
        if (was > 1) omp_set_num_threads(was);
#endif
        return st;
    }
#pragma omp parallel for num_threads(nth) schedule(static)
    for (int64_t t = 0; t < nt; t++) {
#ifdef _OPENMP
        omp_set_num_threads(1); /* (this task's own setting: the library runs the tile on this thread) */
#endif
        int s = gemm_tile(be, ta, tb, M, N, K, bm, bn, tn, t, alpha, A, lda, B, ldb, beta, C, ldc, post);
        if (s) {
#pragma omp critical(dp_gemm_status)
            st = s;
        }
    }
    return st;
}
#endif

void dp__gemm_post(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc, const struct dp__gemm_post *post) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) { /* C = beta C */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    } else if (backend != DP_GEMM_REF && M * N * K <= DP__GEMM_SMALL && (!tb || K * N <= DP__GEMM_SMALL_BT)) {
        /* a small product: our own kernel, no library call (its fixed cost is most of the time);
         * a transposed B first transposed here, on the stack */
        float bt[DP__GEMM_SMALL_BT];
        if (tb) {
            for (int64_t k = 0; k < K; k++)
                for (int64_t j = 0; j < N; j++) bt[k * N + j] = B[j * ldb + k];
            B = bt, ldb = N;
        }
        dp__gemm_small(ta, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    } else {
        switch (backend) {
#ifdef DP_WITH_DNNL
        case DP_GEMM_DNNL: {
            dnnl_status_t st =
                (dnnl_status_t)gemm_tiled(DP_GEMM_DNNL, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, post);
            /* a library error: the reference computed the tiles it failed (gemm_tiled), and that
             * is recorded for the caller (dp_gemm_fallback_note) */
            if (st != dnnl_success) record_fallback(st, ta, tb, M, N, K, lda, ldb, ldc);
            return;
        }
#endif
#ifdef DP_WITH_BLAS
        case DP_GEMM_BLAS:
            gemm_tiled(DP_GEMM_BLAS, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, post);
            return;
#endif
        default: break;
        }
        dp_gemm_ref(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    }
    if (post) post->fn(post->arg, C, ldc, 0, 0, M, N); /* (one tile: a small product, the reference, K = 0) */
}

void dp_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
             const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    dp__gemm_post(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL);
}

void dp_set_num_threads(int n) {
    if (n < 1) n = 1;
    nthreads = n;
#ifdef _OPENMP
    omp_set_num_threads(n); /* the calling thread's team size (dnnl and our loops) */
#endif
}

int dp_get_num_threads(void) { return nthreads; }
