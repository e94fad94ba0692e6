/* The GEMM wrapper: one entry point, three backends.
 *
 * Measured here (docs/architecture.md §3): oneDNN's dnnl_sgemm reaches ~199 GFLOP/s on
 * one core (AVX-512), Debian's OpenBLAS ~107 GFLOP/s (held to its AVX2
 * kernels by OPENBLAS_CORETYPE=Haswell).  bench/gemm re-measures; the
 * default is oneDNN when it was built in. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

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

void dp_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
             int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) { /* C = beta C */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
        return;
    }
    switch (backend) {
#ifdef DP_WITH_DNNL
    case DP_GEMM_DNNL: {
        dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B,
                                      ldb, beta, C, ldc);
        if (st == dnnl_success) return;
        /* a library error: the reference computes the call, and that is
         * recorded for the caller (dp_gemm_fallback_note) */
        record_fallback(st, ta, tb, M, N, K, lda, ldb, ldc);
        break;
    }
#endif
#ifdef DP_WITH_BLAS
    case DP_GEMM_BLAS:
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
        return;
#endif
    default: break;
    }
    dp_gemm_ref(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static _Thread_local int nthreads = 1;

void dp_set_num_threads(int n) {
    if (n < 1) n = 1;
    nthreads = n;
#ifdef _OPENMP
    omp_set_num_threads(n); /* the calling thread's team size (dnnl and our loops) */
#endif
}

int dp_get_num_threads(void) { return nthreads; }
