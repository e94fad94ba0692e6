/* Pipeline schedules and the balanced stage split; the rules are in dp/par.h. */
#include <math.h>
#include <string.h>

#include "dp/core.h"
#include "dp/par.h"

static const char *const names[DP_PIPE_SCHEDULE_COUNT] = {"gpipe", "1f1b"};

int dp_pipe_schedule_parse(const char *name) {
    for (int k = 0; name && k < DP_PIPE_SCHEDULE_COUNT; k++)
        if (!strcmp(name, names[k])) return k;
    return -1;
}

const char *dp_pipe_schedule_name(int kind) {
    return kind >= 0 && kind < DP_PIPE_SCHEDULE_COUNT ? names[kind] : "?";
}

/* 1f1b's warm-up on stage s: the forwards in flight before its first backward can come
 * back, one per stage after it. */
static int warmup(int S, int M, int s) { return S - s - 1 < M ? S - s - 1 : M; }

int dp_pipe_schedule(int kind, int S, int M, int s, struct dp_pipe_op *ops) {
    if (kind < 0 || kind >= DP_PIPE_SCHEDULE_COUNT || S < 1 || M < 1 || S > 65536 || M > 65536 || s < 0 ||
        s >= S)
        return dp_seterr(DP_EINVAL, "pipeline schedule %d: %d stages, %d micro-batches, stage %d", kind, S, M, s);
    int n = 0;
    if (kind == DP_PIPE_GPIPE) {
        for (int k = 0; k < M; k++) ops[n++] = (struct dp_pipe_op){'F', k};
        for (int k = 0; k < M; k++) ops[n++] = (struct dp_pipe_op){'B', k};
        return DP_OK;
    }
    int w = warmup(S, M, s);
    for (int k = 0; k < w; k++) ops[n++] = (struct dp_pipe_op){'F', k};
    for (int k = 0; k < M - w; k++) { /* steady state: F(w + k) then B(k) */
        ops[n++] = (struct dp_pipe_op){'F', w + k};
        ops[n++] = (struct dp_pipe_op){'B', k};
    }
    for (int k = M - w; k < M; k++) ops[n++] = (struct dp_pipe_op){'B', k};
    return DP_OK;
}

int dp_pipe_max_inflight(int kind, int S, int M, int s) {
    return kind == DP_PIPE_GPIPE ? M : S - s < M ? S - s : M; /* (1f1b: the warm-up's, plus the steady state's one) */
}

double dp_pipe_bubble(int S, int M) { return (double)(S - 1) / (double)(M + S - 1); }

/* The minimal bottleneck by dynamic programming over prefixes: best[j][i] is the least
 * possible most expensive stage when layers [0, i) form j stages; O(S L^2) on L <= a few
 * hundred layers.  The cut is then read back from the last stage to the first, taking the
 * latest feasible start for each (so earlier stages get the layers a tie leaves over). */
int dp_pipe_split(const double *cost, int L, int S, int *first) {
    if (S < 1 || L < 1 || S > L)
        return dp_seterr(DP_EINVAL, "pipeline: %d stages for %d layers (each stage needs a layer)", S, L);
    for (int i = 0; i < L; i++)
        if (!(cost[i] >= 0) || !isfinite(cost[i]))
            return dp_seterr(DP_EINVAL, "pipeline: layer %d's cost is %g", i, cost[i]);
    double *pre = dp_malloc(sizeof(double) * (size_t)(L + 1));
    double *best = dp_malloc(sizeof(double) * (size_t)(S + 1) * (size_t)(L + 1));
    if (!pre || !best) {
        dp_free(pre), dp_free(best);
        return dp_seterr(DP_ENOMEM, "pipeline split: out of memory");
    }
    pre[0] = 0;
    for (int i = 0; i < L; i++) pre[i + 1] = pre[i] + cost[i];
#define BEST(j, i) best[(size_t)(j) * (size_t)(L + 1) + (size_t)(i)]
    for (int j = 0; j <= S; j++)
        for (int i = 0; i <= L; i++) BEST(j, i) = INFINITY;
    BEST(0, 0) = 0;
    for (int j = 1; j <= S; j++)
        for (int i = j; i <= L; i++)
            for (int a = j - 1; a < i; a++) { /* the j-th stage is layers [a, i) */
                double v = fmax(BEST(j - 1, a), pre[i] - pre[a]);
                if (v < BEST(j, i)) BEST(j, i) = v;
            }
    double bound = BEST(S, L);
    first[S] = L;
    for (int j = S; j >= 1; j--) { /* the latest start a of stage j that keeps the bound */
        int i = first[j], a = i - 1;
        while (a > j - 1 && !(fmax(BEST(j - 1, a), pre[i] - pre[a]) <= bound)) a--;
        first[j - 1] = a;
    }
    first[0] = 0;
#undef BEST
    dp_free(pre), dp_free(best);
    return DP_OK;
}
