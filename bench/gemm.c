/* GEMM backends measured side by side: the numbers behind the default choice
 * of dp_gemm's backend (docs/architecture.md §3, issue A2).
 *
 *   ./build/bench/gemm [threads] [reps]
 * For square sizes and for the shapes the mlp and cnn layers use, prints
 * GFLOP/s per backend (median of reps) and the ratio to the fp32 peak of this
 * CPU, measured at start (dp_cpu_peak_flops: an FMA loop, per core). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/core.h"

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    int reps = argc > 2 ? atoi(argv[2]) : 7;
    if (threads < 1 || reps < 1 || reps > 101) {
        fprintf(stderr, "usage: gemm [threads>=1] [reps 1..101]\n");
        return 2;
    }
    dp_set_num_threads(threads);
    /* M, N, K, trans_a, trans_b, label */
    struct { int64_t M, N, K; int ta, tb; const char *what; } shapes[] = {
        {1024, 1024, 1024, 0, 0, "square 1024"},
        {2048, 2048, 2048, 0, 0, "square 2048"},
        {128, 512, 784, 0, 1, "mlp fc1 forward  (x W^T)"},
        {512, 784, 128, 1, 0, "mlp fc1 dW       (dy^T x)"},
        {128, 512, 512, 0, 1, "mlp fc2 forward"},
        {128, 512, 512, 0, 0, "mlp fc2 dx       (dy W)"},
        {64, 1568, 288, 0, 0, "cnn conv2 fwd chunk (W col)"},
        {64, 288, 1568, 0, 1, "cnn conv2 dW chunk  (dy col^T)"},
        {288, 1568, 64, 1, 0, "cnn conv2 dcol chunk (W^T dy)"},
    };
    double peak = dp_cpu_peak_flops() / 1e9; /* per core; 0 when it cannot be measured */
    if (peak > 0)
        printf("threads %d, median of %d; GFLOP/s (%% of %d x %.0f GFLOP/s, the measured %s peak)\n", threads,
               reps, threads, peak, dp_cpu_peak_isa());
    else
        printf("threads %d, median of %d; GFLOP/s (no peak measured on this CPU)\n", threads, reps);
    printf("%-34s", "shape (M N K)");
    for (int b = 0; b < DP_GEMM_BACKEND_COUNT; b++)
        if (dp_gemm_backend_available(b)) printf(" %18s", dp_gemm_backend_name(b));
    printf("\n");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t M = shapes[s].M, N = shapes[s].N, K = shapes[s].K;
        float *A = dp_malloc_big(sizeof(float) * M * K), *B = dp_malloc_big(sizeof(float) * K * N);
        float *C = dp_malloc_big(sizeof(float) * M * N);
        for (int64_t i = 0; i < M * K; i++) A[i] = dp_rng_uniform(1, DP_RNG_USER, 0, i) - 0.5f;
        for (int64_t i = 0; i < K * N; i++) B[i] = dp_rng_uniform(1, DP_RNG_USER, 1, i) - 0.5f;
        char label[64];
        snprintf(label, sizeof label, "%s %lldx%lldx%lld", shapes[s].what, (long long)M, (long long)N, (long long)K);
        printf("%-34.34s", label);
        double flops = 2.0 * M * N * K;
        for (int b = 0; b < DP_GEMM_BACKEND_COUNT; b++) {
            if (!dp_gemm_backend_available(b)) continue;
            if (b == DP_GEMM_REF && M * N * K > 300000000LL) {
                printf(" %18s", "(skipped)");
                continue;
            }
            dp_gemm_set_backend(b);
            double t[101];
            /* enough calls per sample for ~20 ms */
            int inner = (int)(4e9 / flops) + 1;
            if (b == DP_GEMM_REF) inner = 1;
            for (int r = 0; r < reps + 1; r++) {
                double t0 = dp_time();
                for (int i = 0; i < inner; i++)
                    dp_gemm(shapes[s].ta, shapes[s].tb, M, N, K, 1.0f, A, shapes[s].ta ? M : K, B,
                            shapes[s].tb ? K : N, 0.0f, C, N);
                t[r] = (dp_time() - t0) / inner;
            }
            qsort(t + 1, (size_t)reps, sizeof(double), cmp); /* first run is warm-up */
            double g = flops / t[1 + reps / 2] / 1e9;
            char cell[32];
            if (peak > 0)
                snprintf(cell, sizeof cell, "%6.1f (%3.0f%%)", g, 100 * g / (peak * threads));
            else
                snprintf(cell, sizeof cell, "%6.1f", g);
            printf(" %18s", cell);
        }
        printf("\n");
        dp_free(A), dp_free(B), dp_free(C);
    }
    return 0;
}
