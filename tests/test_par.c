/* Pipeline schedules and the stage split (dp/par.h). */
#include <stdlib.h>

#include "dp/core.h"
#include "dp/par.h"
#include "test.h"

/* Runs S stages' schedules against each other with forward and backward of unit cost
 * (a stage's op waits for what it needs: F(s, k) for F(s-1, k); B(s, k) for B(s+1, k) and its
 * own F(s, k)).  Returns the makespan, or -1 on a deadlock; *held: the most micro-batches a
 * stage held at once (forwarded, not yet backwarded), over all stages. */
static int simulate(int kind, int S, int M, int *held) {
    struct dp_pipe_op *ops = malloc(sizeof *ops * (size_t)(2 * M) * (size_t)S);
    int *pc = calloc((size_t)S, sizeof(int)), *fdone = malloc(sizeof(int) * (size_t)(S * M)),
        *bdone = malloc(sizeof(int) * (size_t)(S * M));
    for (int s = 0; s < S; s++) ASSERT_OK(dp_pipe_schedule(kind, S, M, s, ops + (size_t)s * 2 * M));
    for (int i = 0; i < S * M; i++) fdone[i] = bdone[i] = -1; /* the time it finished */
    int t = 0, left = 2 * S * M;
    *held = 0;
    while (left > 0 && t < 4 * S * M + 8) {
        int progress = 0;
        for (int s = 0; s < S; s++) { /* each stage tries its next op at time t */
            if (pc[s] == 2 * M) continue;
            struct dp_pipe_op op = ops[(size_t)s * 2 * M + (size_t)pc[s]];
            int k = op.micro, ready;
            if (op.kind == 'F') ready = s == 0 || (fdone[(s - 1) * M + k] >= 0 && fdone[(s - 1) * M + k] <= t);
            else ready = fdone[s * M + k] >= 0 && fdone[s * M + k] <= t &&
                         (s == S - 1 || (bdone[(s + 1) * M + k] >= 0 && bdone[(s + 1) * M + k] <= t));
            if (!ready) continue;
            (op.kind == 'F' ? fdone : bdone)[s * M + k] = t + 1;
            pc[s]++, left--, progress = 1;
            int h = 0;
            for (int j = 0; j < M; j++) h += fdone[s * M + j] >= 0 && bdone[s * M + j] < 0;
            if (h > *held) *held = h;
        }
        (void)progress;
        t++;
    }
    int end = left > 0 ? -1 : 0;
    for (int i = 0; end >= 0 && i < S * M; i++) end = bdone[i] > end ? bdone[i] : end;
    free(ops), free(pc), free(fdone), free(bdone);
    return end;
}

/* Every stage's 2M ops are each micro-batch's F once and B once, F before B, the B's in
 * micro-batch order; the schedules never deadlock and end at 2(M + S - 1) unit steps (the
 * bubble (S-1)/(M+S-1)); gpipe holds M micro-batches, 1f1b at most min(S - s, M) on stage s. */
TEST(pipe_schedules_complete_in_order_with_their_bubble) {
    for (int kind = 0; kind < DP_PIPE_SCHEDULE_COUNT; kind++)
        for (int S = 1; S <= 5; S++)
            for (int M = 1; M <= 9; M++) {
                struct dp_pipe_op ops[18];
                for (int s = 0; s < S; s++) {
                    ASSERT_OK(dp_pipe_schedule(kind, S, M, s, ops));
                    int nf = 0, nb = 0, live = 0, most = 0;
                    for (int i = 0; i < 2 * M; i++) {
                        if (ops[i].kind == 'F') {
                            ASSERT_EQ(ops[i].micro, nf++);
                            live++;
                        } else {
                            ASSERT_EQ(ops[i].micro, nb++);
                            live--;
                        }
                        ASSERT_TRUE(nb <= nf);
                        if (live > most) most = live;
                    }
                    ASSERT_EQ(nf, M);
                    ASSERT_EQ(nb, M);
                    ASSERT_EQ(most, dp_pipe_max_inflight(kind, S, M, s));
                    ASSERT_EQ(most, kind == DP_PIPE_GPIPE ? M : (S - s < M ? S - s : M));
                }
                int held;
                ASSERT_EQ(simulate(kind, S, M, &held), 2 * (M + S - 1));
                ASSERT_TRUE(held <= (kind == DP_PIPE_GPIPE ? M : (S < M ? S : M)));
            }
    ASSERT_FEQ(dp_pipe_bubble(2, 4), 0.2);
    ASSERT_EQ(dp_pipe_schedule_parse("1f1b"), DP_PIPE_1F1B);
    ASSERT_EQ(dp_pipe_schedule_parse("gpipe"), DP_PIPE_GPIPE);
    ASSERT_EQ(dp_pipe_schedule_parse("interleaved"), -1);
    ASSERT_TRUE(strcmp(dp_pipe_schedule_name(DP_PIPE_1F1B), "1f1b") == 0);
    struct dp_pipe_op ops[4];
    ASSERT_ERR(dp_pipe_schedule(DP_PIPE_1F1B, 2, 2, 2, ops), DP_EINVAL, "stage 2");
    ASSERT_ERR(dp_pipe_schedule(7, 2, 2, 0, ops), DP_EINVAL, "schedule 7");
}

/* The split minimises the most expensive stage, every stage gets a layer, and ties put the
 * layers on the earlier stages; bad input is refused. */
TEST(pipe_split_balances_stages) {
    int f[8];
    const double even[6] = {1, 1, 1, 1, 1, 1};
    ASSERT_OK(dp_pipe_split(even, 6, 2, f));
    ASSERT_EQ(f[0], 0);
    ASSERT_EQ(f[1], 3);
    ASSERT_EQ(f[2], 6);
    ASSERT_OK(dp_pipe_split(even, 6, 4, f)); /* bound 2: 2 + 2 + 1 + 1 */
    ASSERT_EQ(f[1], 2);
    ASSERT_EQ(f[2], 4);
    ASSERT_EQ(f[3], 5);
    ASSERT_EQ(f[4], 6);
    /* a gpt's shape: a cheap embedding, 4 blocks, a cheap norm and a head worth half a block */
    const double gpt[7] = {0, 10, 10, 10, 10, 0.1, 5};
    ASSERT_OK(dp_pipe_split(gpt, 7, 2, f));
    ASSERT_EQ(f[1], 3); /* [emb, b0, b1] 20 | [b2, b3, ln, head] 25.1: the least bottleneck */
    ASSERT_OK(dp_pipe_split(gpt, 7, 7, f));
    for (int s = 0; s <= 7; s++) ASSERT_EQ(f[s], s);
    const double one[1] = {3};
    ASSERT_OK(dp_pipe_split(one, 1, 1, f));
    ASSERT_EQ(f[0], 0);
    ASSERT_EQ(f[1], 1);
    ASSERT_ERR(dp_pipe_split(even, 6, 7, f), DP_EINVAL, "7 stages for 6 layers");
    const double bad[2] = {1, NAN};
    ASSERT_ERR(dp_pipe_split(bad, 2, 1, f), DP_EINVAL, "layer 1's cost");
}
