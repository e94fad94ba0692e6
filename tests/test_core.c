/* Core: errors, arena, RNG, GEMM backends against the reference. */
#include "dp/core.h"
#include "core/core_impl.h"
#include "test.h"

TEST(core_error_messages) {
    ASSERT_EQ(dp_seterr(DP_EINVAL, "bad %d", 7), DP_EINVAL);
    ASSERT_TRUE(strcmp(dp_errmsg(), "bad 7") == 0);
    dp_adderr(DP_EINVAL, "ctx");
    ASSERT_TRUE(strcmp(dp_errmsg(), "ctx: bad 7") == 0);
    ASSERT_TRUE(strcmp(dp_strerror(DP_ENOMEM), "out of memory") == 0);
    ASSERT_TRUE(strcmp(dp_strerror(12345), "unknown error") == 0);
}

TEST(core_arena_grows_then_merges) {
    struct dp_arena a;
    ASSERT_OK(dp_arena_init(&a, 4096));
    char *p = dp_arena_alloc(&a, 100);
    ASSERT_TRUE(p && ((uintptr_t)p % 64) == 0);
    char *q = dp_arena_alloc(&a, 10000); /* forces a second block */
    ASSERT_TRUE(q != NULL);
    memset(q, 1, 10000);
    size_t hw = a.high_water;
    ASSERT_TRUE(hw >= 10100);
    dp_arena_reset(&a);
    ASSERT_EQ(a.capacity_total, hw); /* merged into one block */
    char *r1 = dp_arena_alloc(&a, 100);
    char *r2 = dp_arena_alloc(&a, 10000);
    ASSERT_TRUE(r1 && r2 && r2 > r1); /* same block now */
    dp_arena_free(&a);
}

/* A released scope gives its bytes back: the next allocation reuses them,
 * blocks chained inside the scope are freed, and the high water keeps the
 * scope's peak (the next reset sizes the arena by it). */
TEST(core_arena_mark_release) {
    struct dp_arena a;
    ASSERT_OK(dp_arena_init(&a, 4096));
    char *keep = dp_arena_alloc(&a, 1000);
    ASSERT_TRUE(keep != NULL);
    struct dp_arena_mark m = dp_arena_mark(&a);
    char *s1 = dp_arena_alloc(&a, 1000);
    ASSERT_TRUE(s1 != NULL);
    dp_arena_release(&a, m);
    ASSERT_TRUE(dp_arena_alloc(&a, 1000) == s1); /* same bytes again */
    ASSERT_EQ(a.used_total, 2048);
    m = dp_arena_mark(&a);
    size_t cap = a.capacity_total;
    ASSERT_TRUE(dp_arena_alloc(&a, 100000) != NULL); /* chains a block */
    ASSERT_TRUE(a.capacity_total > cap);
    dp_arena_release(&a, m);
    ASSERT_EQ(a.capacity_total, cap);
    ASSERT_EQ(a.used_total, 2048);
    ASSERT_TRUE(a.high_water >= 2048 + 100000);
    memset(keep, 7, 1000); /* what was allocated before the mark is still there */
    dp_arena_reset(&a);
    ASSERT_TRUE(a.capacity_total >= 2048 + 100000);
    dp_arena_free(&a);
}

TEST(core_rng_is_counter_based) {
    float u1 = dp_rng_uniform(42, DP_RNG_DROPOUT, 7, 3);
    float u2 = dp_rng_uniform(42, DP_RNG_DROPOUT, 7, 3);
    ASSERT_TRUE(u1 == u2);
    ASSERT_TRUE(u1 >= 0.0f && u1 < 1.0f);
    ASSERT_TRUE(dp_rng_uniform(43, DP_RNG_DROPOUT, 7, 3) != u1);
    ASSERT_TRUE(dp_rng_uniform(42, DP_RNG_SHUFFLE, 7, 3) != u1);
    /* Moments of 100k uniforms and normals. */
    double s = 0, s2 = 0, ns = 0, ns2 = 0;
    int n = 100000;
    for (int i = 0; i < n; i++) {
        double u = dp_rng_uniform(1, DP_RNG_USER, 0, (uint64_t)i);
        s += u, s2 += u * u;
        double z = dp_rng_normal(1, DP_RNG_USER, 1, (uint64_t)i);
        ns += z, ns2 += z * z;
    }
    ASSERT_NEAR(s / n, 0.5, 0.005);
    ASSERT_NEAR(s2 / n - (s / n) * (s / n), 1.0 / 12, 0.002);
    ASSERT_NEAR(ns / n, 0.0, 0.02);
    ASSERT_NEAR(ns2 / n, 1.0, 0.02);
}

TEST(core_rng_permutation) {
    int64_t p[1000], q[1000];
    int seen[1000] = {0};
    dp_rng_permutation(5, DP_RNG_SHUFFLE, 0, p, 1000);
    dp_rng_permutation(5, DP_RNG_SHUFFLE, 0, q, 1000);
    int moved = 0;
    for (int i = 0; i < 1000; i++) {
        ASSERT_TRUE(p[i] >= 0 && p[i] < 1000);
        seen[p[i]]++;
        ASSERT_EQ(p[i], q[i]);
        moved += p[i] != i;
    }
    for (int i = 0; i < 1000; i++) ASSERT_EQ(seen[i], 1);
    ASSERT_TRUE(moved > 900);
    dp_rng_permutation(5, DP_RNG_SHUFFLE, 1, q, 1000); /* another epoch */
    int same = 0;
    for (int i = 0; i < 1000; i++) same += p[i] == q[i];
    ASSERT_TRUE(same < 20);
}

TEST(core_hashes) {
    /* FNV-1a 64 of "a" and CRC-32 of "123456789" (standard check values). */
    ASSERT_TRUE(dp_fnv1a64("a", 1, DP_FNV1A64_INIT) == 0xaf63dc4c8601ec8cULL);
    ASSERT_EQ(dp_crc32(0, "123456789", 9), 0xCBF43926u);
}

static void fill(float *x, int64_t n, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) x[i] = dp_rng_uniform(seed, DP_RNG_USER, 0, (uint64_t)i) - 0.5f;
}

TEST(core_gemm_backends_match_reference) {
    const int64_t shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {64, 33, 17}, {128, 256, 100}, {3, 500, 784}};
    for (int be = 0; be < DP_GEMM_BACKEND_COUNT; be++) {
        if (!dp_gemm_backend_available(be)) continue;
        ASSERT_OK(dp_gemm_set_backend(be));
        for (size_t s = 0; s < DP_ARRAY_LEN(shapes); s++)
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++) {
                    int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                    float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N);
                    float *C = malloc(sizeof(float) * M * N), *R = malloc(sizeof(float) * M * N);
                    fill(A, M * K, 1), fill(B, K * N, 2), fill(C, M * N, 3);
                    memcpy(R, C, sizeof(float) * M * N);
                    int64_t lda = ta ? M : K, ldb = tb ? K : N;
                    dp_gemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 0.25f, C, N);
                    /* double-precision oracle */
                    for (int64_t i = 0; i < M; i++)
                        for (int64_t j = 0; j < N; j++) {
                            double acc = 0;
                            for (int64_t k = 0; k < K; k++)
                                acc += (double)(ta ? A[k * lda + i] : A[i * lda + k]) *
                                       (tb ? B[j * ldb + k] : B[k * ldb + j]);
                            double ref = 0.5 * acc + 0.25 * R[i * N + j];
                            ASSERT_NEAR(C[i * N + j], ref, 1e-5 + 1e-5 * K);
                        }
                    free(A), free(B), free(C), free(R);
                }
    }
    ASSERT_OK(dp_gemm_set_backend(DP_GEMM_REF));
    ASSERT_ERR(dp_gemm_set_backend((enum dp_gemm_backend)99), DP_ENOTSUP, "not built");
}

/* The measured peak: a sane figure, computed once, and a real peak: no GEMM
 * may beat it.  oneDNN reaches ~85-90% of the peak on a large square GEMM,
 * so a peak that is 0, a guess from another CPU that is too low, or a
 * measurement that went wrong (a loop on narrower vectors than the CPU has,
 * too few chains to hide the FMA latency) fails the second check.  The 1.1
 * leaves room for the GEMM's clock to be a little higher than the loop's. */
TEST(core_peak_flops_measured) {
    double p = dp_cpu_peak_flops();
#if defined(__x86_64__) || defined(__i386__)
    ASSERT_TRUE(isfinite(p));
    ASSERT_TRUE(p >= 1e9 && p <= 2e12); /* 1-2000 GFLOP/s per core */
    ASSERT_TRUE(dp_cpu_peak_isa() != NULL);
#else
    if (p == 0) { /* not measurable here: no figure, no ISA */
        ASSERT_TRUE(dp_cpu_peak_isa() == NULL);
        return;
    }
#endif
    /* cached: a second measurement would differ in the last bits */
    ASSERT_TRUE(dp_cpu_peak_flops() == p);
    dp_set_num_threads(1);
    const int64_t n = 512;
    float *A = malloc(sizeof(float) * n * n), *B = malloc(sizeof(float) * n * n);
    float *C = malloc(sizeof(float) * n * n);
    ASSERT_TRUE(A && B && C);
    fill(A, n * n, 1), fill(B, n * n, 2);
    for (int be = 0; be < DP_GEMM_BACKEND_COUNT; be++) {
        if (be == DP_GEMM_REF || !dp_gemm_backend_available(be)) continue;
        ASSERT_OK(dp_gemm_set_backend(be));
        double best = INFINITY;
        for (int rep = 0; rep < 8; rep++) {
            double t = dp_time();
            dp_gemm(0, 0, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
            t = dp_time() - t;
            if (t < best) best = t;
        }
        double achieved = 2.0 * n * n * n / best;
        if (!(achieved <= 1.1 * p))
            dp_test_fail(__FILE__, __LINE__, "gemm %s reached %.1f GFLOP/s, above 1.1 x the measured peak %.1f",
                         dp_gemm_backend_name(be), achieved / 1e9, p / 1e9);
    }
    free(A), free(B), free(C);
}

/* The small products' kernel (gemm_small.c): every element is the chain acc = fma(a_ik, b_kj, acc)
 * over k in order, then alpha acc (beta = 0: C not read, NaNs there stay unread) or
 * fma(alpha, acc, beta c).  Bit for bit, on shapes with row and column tails of every size
 * (M = 1..9, N across one, two and three vector widths and between), A plain and transposed,
 * strides wider than the rows; and dp_gemm routes a small product there. */
TEST(core_gemm_small_is_one_chain_per_element) {
    const int64_t Ns[] = {1, 5, 8, 15, 16, 17, 31, 32, 33, 47, 64, 70}, K = 19, ldb = 80, ldc = 75;
    float *A = malloc(sizeof(float) * 40 * 40), *B = malloc(sizeof(float) * K * ldb);
    float *C = malloc(sizeof(float) * 10 * ldc), *want = malloc(sizeof(float) * 10 * ldc);
    fill(A, 40 * 40, 3), fill(B, K * ldb, 4);
    for (int ta = 0; ta < 2; ta++)
        for (int64_t M = 1; M <= 9; M++)
            for (size_t n = 0; n < sizeof Ns / sizeof Ns[0]; n++)
                for (int beta_on = 0; beta_on < 2; beta_on++) {
                    const int64_t N = Ns[n], lda = 40;
                    const float alpha = 0.75f, beta = beta_on ? -1.5f : 0.0f;
                    fill(C, 10 * ldc, 5);
                    if (!beta_on)
                        for (int64_t i = 0; i < M; i++)
                            for (int64_t j = 0; j < N; j++) C[i * ldc + j] = NAN;
                    memcpy(want, C, sizeof(float) * 10 * ldc);
                    for (int64_t i = 0; i < M; i++)
                        for (int64_t j = 0; j < N; j++) {
                            float acc = 0.0f;
                            for (int64_t k = 0; k < K; k++)
                                acc = fmaf(ta ? A[k * lda + i] : A[i * lda + k], B[k * ldb + j], acc);
                            float *w = want + i * ldc + j;
                            *w = beta_on ? fmaf(alpha, acc, beta * *w) : alpha * acc;
                        }
                    dp__gemm_small(ta, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
                    ASSERT_TRUE(!memcmp(C, want, sizeof(float) * 10 * ldc)); /* (and nothing past N) */
                }
    /* dp_gemm takes it for a small product on a library backend */
    const enum dp_gemm_backend was = dp_gemm_get_backend();
    for (int b = DP_GEMM_BLAS; b < DP_GEMM_BACKEND_COUNT; b++) {
        if (!dp_gemm_backend_available(b)) continue;
        ASSERT_OK(dp_gemm_set_backend(b));
        dp__gemm_small(1, 9, 70, K, 1.0f, A, 40, B, ldb, 0.0f, want, ldc);
        dp_gemm(1, 0, 9, 70, K, 1.0f, A, 40, B, ldb, 0.0f, C, ldc);
        ASSERT_TRUE(!memcmp(C, want, sizeof(float) * 9 * ldc));
        /* and B transposed: Bt (N, K) with row stride 23 holds B */
        float *Bt = malloc(sizeof(float) * 70 * 23);
        for (int64_t j = 0; j < 70; j++)
            for (int64_t k = 0; k < K; k++) Bt[j * 23 + k] = B[k * ldb + j];
        dp_gemm(0, 1, 9, 70, K, 1.0f, A, 40, Bt, 23, 0.0f, C, ldc);
        dp__gemm_small(0, 9, 70, K, 1.0f, A, 40, B, ldb, 0.0f, want, ldc);
        ASSERT_TRUE(!memcmp(C, want, sizeof(float) * 9 * ldc));
        free(Bt);
    }
    ASSERT_OK(dp_gemm_set_backend(was));
    free(A), free(B), free(C), free(want);
}

/* A oneDNN failure falls back to the reference, correctly, and is recorded
 * once: the note is about the first failure and does not change, the count
 * counts every call.  dnnl_sgemm rejects lda < K (invalid arguments); the
 * reference reads the overlapping rows of A as they are, which is a valid
 * (Toeplitz) matrix, so the result is checked against an oracle.  K is large enough that the
 * products go to the library (DP__GEMM_SMALL multiply-adds and fewer run in our own kernel). */
TEST(core_gemm_fallback_noted) {
    if (!dp_gemm_backend_available(DP_GEMM_DNNL)) SKIP("oneDNN not built in (libdnnl-dev): no fallback to test");
    ASSERT_OK(dp_gemm_set_backend(DP_GEMM_DNNL));
    ASSERT_TRUE(dp_gemm_fallback_note() == NULL);
    ASSERT_EQ(dp_gemm_fallback_count(), 0);
    const int64_t M = 2, N = 3, K = 1 << 15, lda = 1; /* lda < K: dnnl refuses */
    ASSERT_TRUE(M * N * K > DP__GEMM_SMALL);
    /* A: 2 rows of stride K, or 2 overlapping rows of stride 1 */
    float *A = malloc(sizeof(float) * (size_t)(M * K)), *B = malloc(sizeof(float) * (size_t)(K * N)), C[6];
    fill(A, M * K, 1), fill(B, K * N, 2);
    dp_gemm(0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N); /* valid: no note */
    ASSERT_TRUE(dp_gemm_fallback_note() == NULL);
    for (int call = 0; call < 3; call++) {
        dp_gemm(0, 0, M, N, K, 1.0f, A, lda, B, N, 0.0f, C, N);
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double acc = 0, mag = 0; /* (a float sum's rounding grows with the terms' magnitudes) */
                for (int64_t k = 0; k < K; k++) {
                    acc += (double)A[i * lda + k] * B[k * N + j];
                    mag += fabs((double)A[i * lda + k] * B[k * N + j]);
                }
                ASSERT_NEAR(C[i * N + j], acc, 1e-6 * mag);
            }
        const char *note = dp_gemm_fallback_note();
        ASSERT_TRUE(note != NULL);
        ASSERT_TRUE(strstr(note, "dnnl_sgemm failed") && strstr(note, "lda=1"));
        ASSERT_EQ(dp_gemm_fallback_count(), call + 1);
    }
    /* a later failure of another shape leaves the first note as it was */
    const char *first = dp_gemm_fallback_note();
    dp_gemm(0, 0, M, N, K, 1.0f, A, K, B, 2, 0.0f, C, N); /* ldb < N */
    ASSERT_EQ(dp_gemm_fallback_count(), 4);
    ASSERT_TRUE(dp_gemm_fallback_note() == first && strstr(first, "lda=1") && !strstr(first, "ldb=2"));
    free(A), free(B);
}

/* dp_rel_diff (ckpt diff and the tests compare by it): a NaN or Inf anywhere
 * is a difference.  The old CLI copy kept a running max with
 * `if (!(d <= dmax)) dmax = d`, so a finite element after a NaN overwrote it. */
TEST(core_rel_diff_nonfinite_is_a_difference) {
    enum { N = 1000 };
    static float a[N], b[N];
    for (int i = 0; i < N; i++) a[i] = b[i] = 0.5f + 0.001f * (float)i;
    ASSERT_TRUE(dp_rel_diff(a, b, N) == 0);                  /* equal */
    b[0] = NAN;                                              /* NaN first, finite after */
    ASSERT_TRUE(!(dp_rel_diff(a, b, N) <= 1e-5));
    ASSERT_TRUE(isinf(dp_rel_diff(a, b, N)));
    ASSERT_TRUE(isinf(dp_rel_diff(b, a, N)));                /* either side */
    b[0] = a[0];
    b[N / 2] = INFINITY;                                     /* Inf in the middle */
    ASSERT_TRUE(isinf(dp_rel_diff(a, b, N)));
    b[N / 2] = a[N / 2];
    a[3] = b[3] = NAN;                                       /* both NaN at the same place */
    ASSERT_TRUE(isinf(dp_rel_diff(a, b, N)));
    a[3] = b[3] = -INFINITY;                                 /* both the same Inf */
    ASSERT_TRUE(isinf(dp_rel_diff(a, b, N)));
    a[3] = b[3] = 1.0f;
    b[7] += 0.001f;                                          /* finite: max |a-b| / max |a| */
    ASSERT_NEAR(dp_rel_diff(a, b, N), (double)(b[7] - a[7]) / (double)a[N - 1], 1e-12);
    static float z[N], z2[N];                                /* all zeros */
    ASSERT_TRUE(dp_rel_diff(z, z2, N) == 0);
    z2[N - 1] = 1e-30f;                                      /* differs from all zeros */
    ASSERT_TRUE(isinf(dp_rel_diff(z, z2, N)));
    ASSERT_TRUE(dp_rel_diff(a, b, 0) == 0);                  /* empty */
}

/* dp__json_escape: quote, backslash and control characters escaped; a buffer too small is cut
 * before the first escape that does not fit whole, and the length needed is returned. */
TEST(core_json_escape) {
    char buf[64];
    ASSERT_EQ(dp__json_escape(buf, sizeof buf, "a\"b\\c\nd"), strlen("a\\\"b\\\\c\\u000ad"));
    ASSERT_TRUE(!strcmp(buf, "a\\\"b\\\\c\\u000ad"));
    ASSERT_EQ(dp__json_escape(buf, 4, "a\"b"), 4); /* a \" b: 4 bytes, one too many for 4 */
    ASSERT_TRUE(!strcmp(buf, "a\\\""));
    ASSERT_EQ(dp__json_escape(buf, 3, "a\"b"), 4);
    ASSERT_TRUE(!strcmp(buf, "a")); /* (never half an escape) */
}
