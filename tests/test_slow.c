/* Slow workers on purpose (--simulate-slow, --simulate-jitter): the spec
 * parsers, the results unchanged (timing only), the recorded sleep against
 * the recorded compute (a ratio with generous bounds, not a speed target),
 * the jitter's replay by seed, and the per-step last arriver and wait. */
#include <stdio.h>
#include <sys/stat.h>

#include "dp/core.h"
#include "dp/train.h"
#include "test.h"

#include "ddp_util.h"

TEST(slow_parse_specs) {
    double f[4];
    ASSERT_OK(dp_parse_simulate_slow("1:2", 4, f));
    ASSERT_TRUE(f[0] == 1 && f[1] == 2 && f[2] == 1 && f[3] == 1);
    ASSERT_OK(dp_parse_simulate_slow("3:1.5,0:4", 4, f));
    ASSERT_TRUE(f[0] == 4 && f[1] == 1 && f[2] == 1 && f[3] == 1.5);
    ASSERT_OK(dp_parse_simulate_slow("7:2", 0, NULL)); /* syntax only: the job size is not known */
    ASSERT_ERR(dp_parse_simulate_slow("4:2", 4, f), DP_EINVAL, "rank 4 is out of range 0..3");
    ASSERT_ERR(dp_parse_simulate_slow("-1:2", 4, f), DP_EINVAL, "out of range");
    ASSERT_ERR(dp_parse_simulate_slow("1:0.5", 4, f), DP_EINVAL, "factor 0.5 must be in 1..1000");
    ASSERT_ERR(dp_parse_simulate_slow("1:2,1:3", 4, f), DP_EINVAL, "rank 1 is given twice");
    ASSERT_ERR(dp_parse_simulate_slow("1", 4, f), DP_EINVAL, "expected RANK:FACTOR");
    ASSERT_ERR(dp_parse_simulate_slow("1:2x", 4, f), DP_EINVAL, "expected RANK:FACTOR");
    ASSERT_ERR(dp_parse_simulate_slow("1:2,", 4, f), DP_EINVAL, "expected RANK:FACTOR");
    ASSERT_ERR(dp_parse_simulate_slow("", 4, f), DP_EINVAL, "expected RANK:FACTOR");

    struct dp_jitter j;
    ASSERT_OK(dp_parse_simulate_jitter("p=0.05,ms=50", &j));
    ASSERT_TRUE(j.p == 0.05 && j.ms == 50 && j.sigma == 0);
    ASSERT_OK(dp_parse_simulate_jitter("lognormal=0.3", &j));
    ASSERT_TRUE(j.p == 0 && j.ms == 0 && j.sigma == 0.3);
    ASSERT_OK(dp_parse_simulate_jitter("ms=5,lognormal=1,p=1", &j));
    ASSERT_TRUE(j.p == 1 && j.ms == 5 && j.sigma == 1);
    ASSERT_ERR(dp_parse_simulate_jitter("p=1.5,ms=5", &j), DP_EINVAL, "p must be in [0, 1]");
    ASSERT_ERR(dp_parse_simulate_jitter("p=-0.1,ms=5", &j), DP_EINVAL, "p must be in [0, 1]");
    ASSERT_ERR(dp_parse_simulate_jitter("p=0.1,ms=-1", &j), DP_EINVAL, "ms must be in 0..");
    ASSERT_ERR(dp_parse_simulate_jitter("p=0.1,ms=5,speed=2", &j), DP_EINVAL, "unknown key 'speed'");
    ASSERT_ERR(dp_parse_simulate_jitter("p=0.1", &j), DP_EINVAL, "p and ms go together");
    ASSERT_ERR(dp_parse_simulate_jitter("p=0.1,p=0.2,ms=1", &j), DP_EINVAL, "given twice");
    ASSERT_ERR(dp_parse_simulate_jitter("lognormal=x", &j), DP_EINVAL, "not KEY=NUMBER");
    ASSERT_ERR(dp_parse_simulate_jitter("lognormal", &j), DP_EINVAL, "KEY=VALUE");
}

/* The trainer checks the ranks against the job's size, and the syntax. */
TEST(slow_trainer_rejects_bad_specs) {
    require_data();
    struct dp_trainer *t;
    struct dp_train_params p = base("mlp", 2);
    p.sim.simulate_slow = "2:3";
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "rank 2 is out of range 0..1 (the job has 2 ranks)");
    p.sim.simulate_slow = NULL, p.sim.simulate_jitter = "p=0.5";
    ASSERT_ERR(dp_trainer_init(&t, &p), DP_EINVAL, "p and ms go together");
}

/* Sleep changes the timing only: a deterministic run with rank 1 three
 * times slower (and jitter) trains the very same bits. */
TEST_T(slow_deterministic_same_hash, 120) {
    require_data();
    struct dp_train_params p = base("mlp", 2);
    p.dp.deterministic = 1;
    p.run.max_steps = 5;
    int64_t n;
    float *ref = train(&p, &n);
    p.sim.simulate_slow = "1:3";
    p.sim.simulate_jitter = "p=0.5,ms=2,lognormal=0.5";
    float *got = train(&p, &n);
    ASSERT_TRUE(memcmp(ref, got, sizeof(float) * (size_t)n) == 0);
    free(ref), free(got);
}

struct steps {
    int n;
    int last[64];
    double wait[64], slow[64];
};
static void on_step(void *arg, const struct dp_event *ev) {
    struct steps *s = arg;
    if (ev->kind != DP_EVENT_STEP || s->n >= 64) return;
    s->last[s->n] = ev->last_rank, s->wait[s->n] = ev->wait_s, s->slow[s->n] = ev->slow_s;
    s->n++;
}

/* Sums rank 0's forward_s + backward_s and slow_s over the step records of
 * dir/metrics.jsonl; returns the number of step records with last_rank and
 * wait_s. */
static int metrics_sums(const char *dir, double *compute, double *slow) {
    char path[600], line[2048];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    ASSERT_TRUE(f != NULL);
    int n = 0;
    *compute = *slow = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strstr(line, "\"kind\": \"step\"")) continue;
        const char *fw = strstr(line, "\"forward_s\": "), *bw = strstr(line, "\"backward_s\": ");
        const char *sl = strstr(line, "\"slow_s\": "), *lr = strstr(line, "\"last_rank\": ");
        const char *ws = strstr(line, "\"wait_s\": ");
        ASSERT_TRUE(fw && bw && sl && lr && ws);
        *compute += atof(fw + 13) + atof(bw + 14);
        *slow += atof(sl + 10);
        n++;
    }
    fclose(f);
    return n;
}

/* Rank 0 made 8x slower: the sleep it records is about 7 times the compute
 * it records (generous bounds: 0.6 to 2 times that ratio, not a speed
 * target), and it is the rank that arrives last at most reductions, while
 * the other rank waits.  Then rank 1 slowed: it is the last arriver.
 * 8x, not 3x: the slowed rank's lead is (8 - 1) x its compute, about 30 ms
 * a step (an mlp step computes for about 4 ms here), well beyond the
 * scheduler slice or so for which a CPU-bound process beside the test takes
 * the other rank's core now and then.  At 3x the lead was 2 x 4 ms, within
 * such a slice: rank 1 was last in only 8 of 12 steps once in 5 runs with 2
 * busy loops beside it (9 of 12 asked).  The bounds asked are unchanged:
 * the ratio's, relative to SLOW_F - 1, and 9 of 12 steps. */
#define SLOW_F 8
static void slow_rank_is_last(int overlap) {
    require_data();
    struct dp_train_params p = base("mlp", 2);
    p.dp.overlap = overlap;
    p.run.max_steps = 12;
    char spec[32];
    snprintf(spec, sizeof spec, "0:%d", SLOW_F);
    p.sim.simulate_slow = spec;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/slow%d", dp_test_tmpdir(), overlap);
    p.io.out_dir = dir;
    struct steps s = {0};
    p.io.on_event = on_step, p.io.event_arg = &s;
    int64_t n;
    free(train(&p, &n));
    double compute, slow;
    ASSERT_EQ(metrics_sums(dir, &compute, &slow), 12);
    fprintf(stderr, "    overlap %d, rank 0 at %dx: compute %.4f s, slept %.4f s (ratio %.2f)\n", overlap, SLOW_F,
            compute, slow, slow / compute);
    ASSERT_TRUE(slow > 0.6 * (SLOW_F - 1) * compute && slow < 2.0 * (SLOW_F - 1) * compute);
    int last0 = 0;
    for (int i = 0; i < s.n; i++) last0 += s.last[i] == 0;
    ASSERT_EQ(s.n, 12);
    ASSERT_TRUE(last0 >= 9);

    snprintf(spec, sizeof spec, "1:%d", SLOW_F);
    p.io.out_dir = NULL; /* read from the events; dir holds the first run (refused as another run's) */
    memset(&s, 0, sizeof s);
    free(train(&p, &n));
    int last1 = 0;
    double wait0 = 0;
    for (int i = 0; i < s.n; i++) {
        last1 += s.last[i] == 1, wait0 += s.wait[i];
        ASSERT_TRUE(s.slow[i] == 0); /* rank 0 is not slowed */
    }
    fprintf(stderr, "    rank 1 at %dx: last in %d of %d steps; rank 0 waited %.4f s\n", SLOW_F, last1, s.n, wait0);
    ASSERT_TRUE(last1 >= 9);
    ASSERT_TRUE(wait0 > 0);
}
TEST_T(slow_rank_is_last_overlap, 120) { slow_rank_is_last(1); }
TEST_T(slow_rank_is_last_no_overlap, 120) { slow_rank_is_last(0); }

/* Jitter p=0.3, ms=5: rank 0's stalls fall exactly on the steps that the
 * Philox draws (seed, DP_RNG_SLOW, rank 0, 2 step) name; the same seed
 * replays them, another seed stalls other steps. */
static uint32_t stalled_steps(uint64_t seed, int deterministic) {
    struct dp_train_params p = base("mlp", 2);
    p.run.seed = seed;
    p.run.max_steps = 16;
    p.dp.deterministic = deterministic;
    p.sim.simulate_jitter = "p=0.3,ms=5";
    struct steps s = {0};
    p.io.on_event = on_step, p.io.event_arg = &s;
    int64_t n;
    free(train(&p, &n));
    ASSERT_EQ(s.n, 16);
    uint32_t mask = 0;
    for (int i = 0; i < s.n; i++) {
        ASSERT_TRUE(s.slow[i] == 0 || s.slow[i] >= 0.005);
        if (s.slow[i] > 0) mask |= 1u << i;
    }
    return mask;
}
static uint32_t predicted(uint64_t seed) {
    uint32_t mask = 0;
    for (int i = 0; i < 16; i++)
        if (dp_rng_uniform(seed, DP_RNG_SLOW, 0, 2 * (uint64_t)i) < 0.3f) mask |= 1u << i;
    return mask;
}
TEST_T(slow_jitter_replays_by_seed, 120) {
    require_data();
    uint32_t a = stalled_steps(3, 0), b = stalled_steps(3, 1), c = stalled_steps(5, 0);
    fprintf(stderr, "    stalled steps: seed 3 %04x (deterministic %04x), seed 5 %04x\n", a, b, c);
    ASSERT_TRUE(predicted(3) != predicted(5) && predicted(3) != 0 && predicted(5) != 0);
    ASSERT_EQ(a, predicted(3));
    ASSERT_EQ(b, a);
    ASSERT_EQ(c, predicted(5));
}
