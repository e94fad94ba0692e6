/*
 * dp/par.h — splitting the model: pipeline schedules and the stage split.
 *
 * Pipeline parallelism cuts a model's layer sequence into S stages, one per
 * worker, and each global batch's share into M micro-batches that flow through
 * them: stage s runs F(k), forward of micro-batch k on what stage s - 1 sent,
 * and B(k), backward on the gradient stage s + 1 sent back.  A schedule is the
 * order of a stage's 2M operations:
 *
 *   gpipe  F(0) .. F(M-1), then B(0) .. B(M-1): every micro-batch's
 *          activations are held at once (M);
 *   1f1b   min(S - s - 1, M) forwards to fill the pipe, then one forward and
 *          one backward in turn, then the backwards left: at most
 *          min(S - s, M) micro-batches held (PipeDream-Flush, Megatron-LM's
 *          non-interleaved schedule).
 *
 * Both run every B in micro-batch order, so a stage's gradient sums the
 * micro-batches in the same order under either schedule: the same bits.
 * With F and B of equal cost t per stage, both take (M + S - 1) x 2t: the
 * idle share of each stage, the bubble, is (S - 1) / (M + S - 1).
 */
#ifndef DP_PAR_H
#define DP_PAR_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

enum dp_pipe_schedule { DP_PIPE_GPIPE = 0, DP_PIPE_1F1B = 1, DP_PIPE_SCHEDULE_COUNT };
/* "gpipe" or "1f1b" -> the enum, or -1. */
int dp_pipe_schedule_parse(const char *name);
const char *dp_pipe_schedule_name(int kind);

/* One operation of a stage's schedule: forward ('F') or backward ('B') of a micro-batch. */
struct dp_pipe_op {
    char kind;
    int micro;
};
/* Stage s's 2M operations (ops: room for 2M) in order, for S stages and M micro-batches
 * (1 <= S, M <= 65536, 0 <= s < S), or DP_EINVAL. */
int dp_pipe_schedule(int kind, int S, int M, int s, struct dp_pipe_op *ops);
/* The most micro-batches stage s holds activations for at once under the schedule. */
int dp_pipe_max_inflight(int kind, int S, int M, int s);
/* The bubble's share of a stage's time with equal forward and backward costs: (S-1)/(M+S-1). */
double dp_pipe_bubble(int S, int M);

/* Cuts L layers of costs cost[0..L) into S contiguous non-empty stages that minimise the most
 * expensive stage: stage s is layers [first[s], first[s+1]) (first: S + 1 entries, first[0] = 0,
 * first[S] = L).  Ties go to the split that puts layers on the earlier stages.  DP_EINVAL when
 * S < 1 or S > L, or a cost is negative or not finite. */
int dp_pipe_split(const double *cost, int L, int S, int *first);

#ifdef __cplusplus
}
#endif
#endif
