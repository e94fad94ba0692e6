/* The GEMM for small products, where a library call's fixed cost is most of its time: the
 * attention's per-head products (T x T x dh at T = 64, dh = 32: 32 x 64 x 32 in causal
 * blocks; docs/results.md has what each costs on dnnl_sgemm and here).
 *
 *     C (M, N) = alpha op(A) (M, K) B (K, N) + beta C        op(A) = A or A^T, B not transposed
 *
 * Register blocks of MR rows x NV vectors of columns: per k, NV loads of B's row k, MR
 * broadcasts of op(A)'s column k, MR NV fused multiply-adds into accumulators that stay in
 * registers.  Every element is the same chain, whatever block or tail it falls in:
 *     acc = 0;  acc = fma(op(A)[i][k], B[k][j], acc) for k = 0 .. K-1 in order;
 *     C[i][j] = alpha acc                     (beta = 0: C is not read)
 *     C[i][j] = fma(alpha, acc, beta C[i][j]) (otherwise)
 * so the bits depend on the shape only (not on the blocking, nor on the vector width's
 * tails), and the scalar path below gives the vector paths' bits. */
#include <math.h>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include "core/core_impl.h"

enum { MR = 4, NV = 2 };

/* One element's chain (the tails, and the whole product without vectors). */
static inline float chain(int ta, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb, int64_t i,
                          int64_t j) {
    float acc = 0.0f;
    for (int64_t k = 0; k < K; k++) acc = fmaf(ta ? A[k * lda + i] : A[i * lda + k], B[k * ldb + j], acc);
    return acc;
}

static inline void put(float *c, float acc, float alpha, float beta) {
    *c = beta == 0.0f ? alpha * acc : fmaf(alpha, acc, beta * *c);
}

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#if defined(__AVX512F__)
typedef __m512 vf;
#define VW 16
#define vzero _mm512_setzero_ps
#define vload _mm512_loadu_ps
#define vstore _mm512_storeu_ps
#define vset1 _mm512_set1_ps
#define vfma _mm512_fmadd_ps
#define vmul _mm512_mul_ps
#else
typedef __m256 vf;
#define VW 8
#define vzero _mm256_setzero_ps
#define vload _mm256_loadu_ps
#define vstore _mm256_storeu_ps
#define vset1 _mm256_set1_ps
#define vfma _mm256_fmadd_ps
#define vmul _mm256_mul_ps
#endif

/* Rows i0 .. i0+mr-1, columns j0 .. j0+nv VW-1 (mr <= MR, nv <= NV, constants where inlined). */
__attribute__((always_inline)) static inline void block(int mr, int nv, int ta, int64_t K, const float *A,
                                                        int64_t lda, const float *B, int64_t ldb, float *C,
                                                        int64_t ldc, int64_t i0, int64_t j0, float alpha,
                                                        float beta) {
    vf acc[MR][NV];
    /* (the loops over r and v unrolled, so that acc and b live in registers) */
#pragma GCC unroll 4
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++) acc[r][v] = vzero();
    for (int64_t k = 0; k < K; k++) {
        vf b[NV];
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++) b[v] = vload(B + k * ldb + j0 + v * VW);
#pragma GCC unroll 4
        for (int r = 0; r < mr; r++) {
            const vf a = vset1(ta ? A[k * lda + i0 + r] : A[(i0 + r) * lda + k]);
#pragma GCC unroll 2
            for (int v = 0; v < nv; v++) acc[r][v] = vfma(a, b[v], acc[r][v]);
        }
    }
    const vf va = vset1(alpha), vb = vset1(beta);
#pragma GCC unroll 4
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++) {
            float *c = C + (i0 + r) * ldc + j0 + v * VW;
            vstore(c, beta == 0.0f ? vmul(va, acc[r][v]) : vfma(va, acc[r][v], vmul(vb, vload(c))));
        }
}

/* Rows i0 .. i0+mr-1 across all of N: blocks of NV vectors, then one vector, then the scalar
 * chains. */
__attribute__((always_inline)) static inline void rows(int mr, int ta, int64_t N, int64_t K, const float *A,
                                                       int64_t lda, const float *B, int64_t ldb, float *C,
                                                       int64_t ldc, int64_t i0, float alpha, float beta) {
    int64_t j = 0;
    for (; j + NV * VW <= N; j += NV * VW) block(mr, NV, ta, K, A, lda, B, ldb, C, ldc, i0, j, alpha, beta);
    for (; j + VW <= N; j += VW) block(mr, 1, ta, K, A, lda, B, ldb, C, ldc, i0, j, alpha, beta);
    for (; j < N; j++)
        for (int r = 0; r < mr; r++)
            put(C + (i0 + r) * ldc + j, chain(ta, K, A, lda, B, ldb, i0 + r, j), alpha, beta);
}

void dp__gemm_small(int ta, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                    const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    int64_t i = 0;
    for (; i + MR <= M; i += MR) rows(MR, ta, N, K, A, lda, B, ldb, C, ldc, i, alpha, beta);
    switch (M - i) {
    case 3: rows(3, ta, N, K, A, lda, B, ldb, C, ldc, i, alpha, beta); break;
    case 2: rows(2, ta, N, K, A, lda, B, ldb, C, ldc, i, alpha, beta); break;
    case 1: rows(1, ta, N, K, A, lda, B, ldb, C, ldc, i, alpha, beta); break;
    default: break;
    }
}

#else /* no vector path: the chains one by one (the compiler may vectorise them) */

void dp__gemm_small(int ta, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                    const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) put(C + i * ldc + j, chain(ta, K, A, lda, B, ldb, i, j), alpha, beta);
}

#endif
