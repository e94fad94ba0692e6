/* The next-token sampler of dptrain sample (dp_sample_token, dp_sample_uniform):
 * greedy decoding, top-k, the seed, and the temperature's effect on the
 * frequencies, checked statistically at a fixed seed. */
#include <math.h>

#include "dp/core.h"
#include "dp/nn.h"
#include "test.h"

/* z: V logits drawn N(0, 2^2) from the given seed. */
static void random_logits(float *z, int64_t V, uint64_t seed) {
    for (int64_t i = 0; i < V; i++) z[i] = 2.0f * dp_rng_normal(seed, DP_RNG_USER, 0, (uint64_t)i);
}

static int64_t argmax(const float *z, int64_t V) {
    int64_t b = 0;
    for (int64_t i = 1; i < V; i++)
        if (z[i] > z[b]) b = i;
    return b;
}

/* Temperature 0 is the argmax whatever the draw; among equal maxima the
 * lowest index. */
TEST(sample_greedy_is_argmax) {
    float z[300];
    for (uint64_t s = 1; s <= 20; s++) {
        random_logits(z, 300, s);
        int64_t want = argmax(z, 300);
        for (int k = 0; k < 10; k++) {
            double u = dp_sample_uniform(s, k);
            ASSERT_EQ(dp_sample_token(z, 300, 0.0, 0, u), want);
            ASSERT_EQ(dp_sample_token(z, 300, 0.0, 17, u), want);
        }
    }
    float tie[5] = {1, 3, -2, 3, 0};
    ASSERT_EQ(dp_sample_token(tie, 5, 0.0, 0, 0.99), 1);
    ASSERT_EQ(dp_sample_token(tie, 5, 2.0, 1, 0.99), 1);
}

/* Top-k = 1 keeps only the argmax: greedy at any temperature and draw. */
TEST(sample_top1_is_argmax_at_any_temperature) {
    float z[256];
    const double temps[] = {1e-3, 0.5, 1.0, 3.0, 100.0};
    for (uint64_t s = 1; s <= 10; s++) {
        random_logits(z, 256, s);
        int64_t want = argmax(z, 256);
        for (size_t t = 0; t < sizeof temps / sizeof temps[0]; t++)
            for (int k = 0; k < 20; k++)
                ASSERT_EQ(dp_sample_token(z, 256, temps[t], 1, dp_sample_uniform(s, k)), want);
    }
}

/* The same seed gives the same sequence; on a flat distribution two seeds
 * give different ones (each of 200 draws agrees with probability 1/256). */
TEST(sample_seed_keys_the_sequence) {
    float flat[256] = {0};
    int a[200], b[200], c[200];
    for (int k = 0; k < 200; k++) {
        a[k] = dp_sample_token(flat, 256, 1.0, 0, dp_sample_uniform(7, k));
        b[k] = dp_sample_token(flat, 256, 1.0, 0, dp_sample_uniform(7, k));
        c[k] = dp_sample_token(flat, 256, 1.0, 0, dp_sample_uniform(8, k));
        ASSERT_TRUE(a[k] >= 0 && a[k] < 256 && c[k] >= 0 && c[k] < 256);
    }
    int same_ab = 0, same_ac = 0, distinct = 0;
    int seen[256] = {0};
    for (int k = 0; k < 200; k++) {
        same_ab += a[k] == b[k];
        same_ac += a[k] == c[k];
        if (!seen[a[k]]++) distinct++;
    }
    ASSERT_EQ(same_ab, 200);
    ASSERT_TRUE(same_ac < 10);  /* expected 200/256 < 1 */
    ASSERT_TRUE(distinct > 100); /* 200 draws from 256 equal weights: ~137 distinct */
    /* the draw is a pure function of (seed, step), in [0, 1) */
    for (int k = 0; k < 1000; k++) {
        double u = dp_sample_uniform(3, k);
        ASSERT_TRUE(u >= 0 && u < 1);
        ASSERT_FEQ(u, dp_sample_uniform(3, k));
    }
}

/* Frequencies over N draws at a fixed seed against softmax(z / T): every
 * token within 5 standard deviations sqrt(p (1 - p) / N) of its p.  Returns
 * the frequency of the most likely token. */
static double check_freqs(const float *z, int64_t V, double T, int64_t top_k, uint64_t seed) {
    enum { N = 40000 };
    int64_t count[16] = {0};
    for (int64_t k = 0; k < N; k++) {
        int tok = dp_sample_token(z, V, T, top_k, dp_sample_uniform(seed, k));
        ASSERT_TRUE(tok >= 0 && tok < V);
        count[tok]++;
    }
    /* the expected p: softmax of z / T over the top k (ties absent here) */
    double w[16], W = 0, zmax = z[argmax(z, V)];
    for (int64_t i = 0; i < V; i++) {
        int64_t above = 0;
        for (int64_t j = 0; j < V; j++) above += z[j] > z[i];
        w[i] = top_k == 0 || above < top_k ? exp((z[i] - zmax) / T) : 0;
        W += w[i];
    }
    for (int64_t i = 0; i < V; i++) {
        double p = w[i] / W, f = (double)count[i] / N, sd = sqrt(p * (1 - p) / N);
        if (p == 0) ASSERT_EQ(count[i], 0);
        else if (!(fabs(f - p) <= 5 * sd + 1e-12))
            dp_test_fail(__FILE__, __LINE__, "T %g top-k %lld token %lld: frequency %.4f, expected %.4f (sd %.4f)",
                         T, (long long)top_k, (long long)i, f, p, sd);
    }
    return (double)count[argmax(z, V)] / N;
}

/* Temperature: softmax(z / T) is matched at T = 0.5, 1, 2 and 10, and the
 * likeliest token's share falls as T rises (sharper below 1, flatter above). */
TEST(sample_temperature_scales_frequencies) {
    const float z[4] = {0.0f, 1.0f, 2.0f, -1.0f};
    double f05 = check_freqs(z, 4, 0.5, 0, 11);
    double f1 = check_freqs(z, 4, 1.0, 0, 12);
    double f2 = check_freqs(z, 4, 2.0, 0, 13);
    double f10 = check_freqs(z, 4, 10.0, 0, 14);
    fprintf(stderr, "    share of the likeliest token: T 0.5 %.3f, 1 %.3f, 2 %.3f, 10 %.3f\n", f05, f1, f2, f10);
    ASSERT_TRUE(f05 > f1 && f1 > f2 && f2 > f10);
    ASSERT_TRUE(f10 < 0.35); /* near uniform: 0.25 + a little */
}

/* Top-k: only the k largest are ever drawn, renormalised among themselves;
 * k = 0 and k = V are the same sampler, draw for draw. */
TEST(sample_top_k_restricts_and_renormalises) {
    const float z[6] = {0.5f, 2.0f, -1.0f, 1.5f, 1.0f, 0.0f};
    check_freqs(z, 6, 1.0, 2, 21);
    check_freqs(z, 6, 1.0, 3, 22);
    check_freqs(z, 6, 0.7, 6, 23);
    float r[256];
    random_logits(r, 256, 5);
    for (int k = 0; k < 500; k++) {
        double u = dp_sample_uniform(9, k);
        ASSERT_EQ(dp_sample_token(r, 256, 1.3, 0, u), dp_sample_token(r, 256, 1.3, 256, u));
    }
    /* ties at the k-th value go to the lower index */
    const float t[4] = {1, 2, 1, 1};
    for (int k = 0; k < 200; k++) {
        int tok = dp_sample_token(t, 4, 1.0, 2, dp_sample_uniform(4, k));
        ASSERT_TRUE(tok == 0 || tok == 1);
    }
    /* a -inf logit is never drawn, even with u just below 1 */
    const float m[3] = {0.0f, -INFINITY, 0.0f};
    ASSERT_EQ(dp_sample_token(m, 3, 1.0, 0, 0.9999999999), 2);
    ASSERT_EQ(dp_sample_token(m, 3, 1.0, 0, 0.25), 0);
}

TEST(sample_rejects_bad_arguments) {
    float z[4] = {0, 1, 2, 3};
    ASSERT_EQ(dp_sample_token(z, 4, -0.5, 0, 0.5), DP_EINVAL);
    ASSERT_EQ(dp_sample_token(z, 4, NAN, 0, 0.5), DP_EINVAL);
    ASSERT_EQ(dp_sample_token(z, 4, INFINITY, 0, 0.5), DP_EINVAL);
    ASSERT_EQ(dp_sample_token(z, 4, 1.0, -1, 0.5), DP_EINVAL);
    ASSERT_EQ(dp_sample_token(z, 4, 1.0, 5, 0.5), DP_EINVAL);
    ASSERT_EQ(dp_sample_token(z, 4, 1.0, 0, 1.0), DP_EINVAL);
    ASSERT_EQ(dp_sample_token(z, 4, 1.0, 0, -0.1), DP_EINVAL);
    ASSERT_EQ(dp_sample_token(z, 0, 1.0, 0, 0.5), DP_EINVAL);
    ASSERT_EQ(dp_sample_token(NULL, 4, 1.0, 0, 0.5), DP_EINVAL);
    z[2] = NAN;
    ASSERT_EQ(dp_sample_token(z, 4, 1.0, 0, 0.5), DP_EINVAL);
    ASSERT_TRUE(strstr(dp_errmsg(), "logit 2") != NULL);
    z[2] = INFINITY;
    ASSERT_EQ(dp_sample_token(z, 4, 0.0, 0, 0.5), DP_EINVAL);
    float all_ninf[2] = {-INFINITY, -INFINITY};
    ASSERT_EQ(dp_sample_token(all_ninf, 2, 1.0, 0, 0.5), DP_EINVAL);
}
