/* A pipeline's step in the cost model: the formulas are in dp/plan.h (dp_plan_pipeline). */
#include <math.h>
#include <string.h>

#include "dp/par.h"
#include "dp/plan.h"

void dp_plan_pipe_free(struct dp_plan_pipe *r) {
    if (!r) return;
    dp_free(r->first), dp_free(r->f_s), dp_free(r->b_s), dp_free(r->mem_bytes), dp_free(r->act_bytes);
    memset(r, 0, sizeof *r);
}

/* The fastest all-reduce of `bytes` over w workers of p's network (or the one p forces). */
static double allreduce_s(const struct dp_plan_params *p, double bytes, int w) {
    if (w < 2 || bytes <= 0) return 0;
    struct dp_plan_net net = p->net;
    net.workers = w;
    if (p->algo >= 0) return dp_plan_allreduce_s(p->algo, bytes, &net);
    double best = INFINITY;
    for (int a = 0; a < DP_PLAN_ALGO_COUNT; a++) {
        double t = dp_plan_allreduce_s(a, bytes, &net);
        if (t < best) best = t;
    }
    return best;
}

/* A tensor group's all-reduce of n bytes over T threads: a ring on the intra-host link. */
static double group_allreduce_s(const struct dp_plan_params *p, double n, int T) {
    if (T < 2 || n <= 0) return 0;
    return 2.0 * (T - 1) * (p->net.intra_alpha_s + n / T * p->net.intra_beta_s) + (T - 1.0) / T * n * p->net.gamma_s;
}

int dp_plan_pipeline(const struct dp_plan_params *p, int S, int M, int schedule, int zero, struct dp_plan_pipe *r) {
    return dp_plan_layout(p, S, 1, M, schedule, zero, r);
}

int dp_plan_layout(const struct dp_plan_params *p, int S, int T, int M, int schedule, int zero, struct dp_plan_pipe *r) {
    memset(r, 0, sizeof *r);
    const int P = p->net.workers, L = p->nlayers;
    if (S < 1 || P % S || S > L)
        return dp_seterr(DP_EINVAL, "plan: %d stages for %d workers and %d layers (S must divide the workers, "
                         "each stage needs a layer)", S, P, L);
    if (T < 1 || P % (S * T) || (T > 1 && !p->layer_tp_calls))
        return dp_seterr(DP_EINVAL, "plan: %d stages x %d tensor ranks for %d workers%s", S, T, P,
                         T > 1 && !p->layer_tp_calls ? " (the model's layers do not split)" : "");
    if (M < 1 || M > 65536 || schedule < 0 || schedule >= DP_PIPE_SCHEDULE_COUNT || zero < 0 || zero > 1)
        return dp_seterr(DP_EINVAL, "plan: %d micro-batches, schedule %d, ZeRO %d", M, schedule, zero);
    const int R = P / (S * T), W = P / S; /* (W: a stage's workers, its replicas' tensor ranks) */
    if (p->batch < (int64_t)R * M)
        return dp_seterr(DP_EINVAL, "plan: global batch %lld is smaller than %d replicas x %d micro-batches",
                         (long long)p->batch, R, M);
    /* the whole model's compute for one replica's share, from the data-parallel model at R workers */
    struct dp_plan_params q = *p;
    q.net.workers = R;
    struct dp_plan_result whole;
    int rc = dp_plan_run(&q, &whole);
    if (rc) return rc;
    r->stages = S, r->replicas = R, r->micro = M, r->tensor = T;
    r->first = dp_malloc(sizeof(int) * (size_t)(S + 1));
    r->f_s = dp_calloc((size_t)S, sizeof(double)), r->b_s = dp_calloc((size_t)S, sizeof(double));
    r->mem_bytes = dp_calloc((size_t)S, sizeof(double)), r->act_bytes = dp_calloc((size_t)S, sizeof(double));
    double *cost = dp_malloc(sizeof(double) * (size_t)L), *lp = dp_malloc(sizeof(double) * (size_t)L);
    if (!r->first || !r->f_s || !r->b_s || !r->mem_bytes || !r->act_bytes || !cost || !lp) {
        dp_free(cost), dp_free(lp), dp_plan_result_free(&whole), dp_plan_pipe_free(r);
        return dp_seterr(DP_ENOMEM, "plan: out of memory");
    }
    double flops = 0;
    for (int i = 0; i < L; i++) {
        lp[i] = p->layers ? (double)p->layers[i] : (double)(p->params / L + (i < p->params % L));
        cost[i] = p->layer_flops ? p->layer_flops[i] : 2.0 * lp[i] * p->tokens;
        flops += cost[i];
        cost[i] += 1.0; /* (the trainer's split: FLOPs + 1 per layer) */
    }
    rc = dp_pipe_split(cost, L, S, r->first);
    double b = (double)p->batch / ((double)R * M); /* samples per micro-batch */
    /* the whole model's forward and backward of one micro-batch: calibrated at its size, or the
     * replica's share's over M (FLOPs or a time per sample: no size effect) */
    double fwd_m = whole.fwd_s / M, bwd_m = whole.bwd_s / M;
    if (p->fwd_sample_s > 0) {
        double fps, bps;
        dp_plan_sample_times(p, b, &fps, &bps);
        fwd_m = fps * b, bwd_m = bps * b;
    }
    double fmax = 0, sum = 0, cmax = 0, tail = 0;
    for (int s = 0; !rc && s < S; s++) {
        double fl = 0, ps = 0, act = 0, most = 0, tp = 0;
        for (int i = r->first[s]; i < r->first[s + 1]; i++) {
            fl += cost[i] - 1.0, ps += lp[i], act += p->layer_act ? p->layer_act[i] : 0;
            if (p->layer_scratch && p->layer_scratch[i] > most) most = p->layer_scratch[i];
            if (T > 1) tp += p->layer_tp_calls[i] * group_allreduce_s(p, b * p->layer_tp_floats[i] * 4.0, T);
        }
        act += most;
        double share = flops > 0 ? fl / flops : 1.0 / S;
        r->f_s[s] = fwd_m * share / T + tp / 2;
        r->b_s[s] = bwd_m * share / T + tp / 2;
        if (r->f_s[s] + r->b_s[s] > fmax) fmax = r->f_s[s] + r->b_s[s], r->tp_s = tp;
        sum += r->f_s[s] + r->b_s[s];
        /* the boundary after stage s: one micro-batch's output */
        if (s + 1 < S && p->layer_out) {
            double c = p->net.alpha_s[DP_PLAN_RING] + b * p->layer_out[r->first[s + 1] - 1] * 4.0 * p->net.beta_s[DP_PLAN_RING];
            if (c > cmax) cmax = c;
        }
        /* the stage's reduction over its W workers, from its last backward; and its update */
        double ar = allreduce_s(p, ps * p->bytes_per_elem / p->compress, W);
        double exposed = ar > r->b_s[s] ? ar - r->b_s[s] : 0;
        double opt = p->opt_s + ps * p->opt_param_s / (zero ? W : 1);
        if (ar > r->comm_s) r->comm_s = ar;
        if (exposed + opt > tail) tail = exposed + opt, r->exposed_s = exposed, r->opt_s = opt;
        r->act_bytes[s] = dp_pipe_max_inflight(schedule, S, M, s) * b * act;
        /* the span's parameters and gradient (the rest of the slabs is mapped, never touched;
         * a tied copy, the gpt's embedding on the last stage, is not counted), its optimizer
         * state (over the stage's W with ZeRO 1), the activations held */
        r->mem_bytes[s] = 8.0 * ps + p->opt_state_bytes * ps / (zero ? W : 1) + r->act_bytes[s];
    }
    dp_free(cost), dp_free(lp);
    if (rc) {
        dp_plan_result_free(&whole), dp_plan_pipe_free(r);
        return rc;
    }
    r->p2p_s = cmax;
    r->pipe_s = sum + 2.0 * (S - 1) * cmax + (M - 1) * (fmax > cmax ? fmax : cmax);
    r->bubble = r->pipe_s > 0 ? 1 - M * fmax / r->pipe_s : 0;
    if (S > 1 && p->tie_bytes > 0)
        r->tie_s = 2 * (p->net.alpha_s[DP_PLAN_RING] + p->tie_bytes * p->net.beta_s[DP_PLAN_RING]);
    r->agree_s = allreduce_s(p, 32, P);
    r->step_s = whole.data_s + whole.zero_s / S + r->pipe_s + tail + r->tie_s + r->agree_s;
    r->samples_per_s = r->step_s > 0 ? (double)p->batch / r->step_s : INFINITY;
    dp_plan_result_free(&whole);
    return DP_OK;
}

int dp_plan_pipe_spans(const struct dp_plan_pipe *r, int schedule, struct dp_plan_span **out) {
    const int S = r->stages, M = r->micro, n = 2 * S * M;
    *out = NULL;
    struct dp_plan_span *sp = dp_calloc((size_t)n, sizeof *sp);
    struct dp_pipe_op *ops = dp_malloc(sizeof *ops * (size_t)n);
    double *fend = dp_malloc(sizeof(double) * (size_t)(S * M)), *bend = dp_malloc(sizeof(double) * (size_t)(S * M));
    int *pc = dp_calloc((size_t)S, sizeof(int));
    double *free_at = dp_calloc((size_t)S, sizeof(double));
    int rc = !sp || !ops || !fend || !bend || !pc || !free_at ? dp_seterr(DP_ENOMEM, "plan: out of memory") : DP_OK;
    for (int s = 0; !rc && s < S; s++) rc = dp_pipe_schedule(schedule, S, M, s, ops + (size_t)s * 2 * M);
    for (int i = 0; !rc && i < S * M; i++) fend[i] = bend[i] = -1; /* (not yet run) */
    /* each round runs every stage's next op whose input is there; the schedules never deadlock
     * (tests/test_par.c), so every round runs at least one */
    for (int left = n, ran = 1; !rc && left > 0 && ran;) {
        ran = 0;
        for (int s = 0; s < S; s++) {
            if (pc[s] == 2 * M) continue;
            const struct dp_pipe_op op = ops[(size_t)s * 2 * M + (size_t)pc[s]];
            const int k = op.micro, B = op.kind == 'B';
            double ready = 0; /* when its input has come */
            if (!B && s > 0) ready = fend[(s - 1) * M + k] < 0 ? -1 : fend[(s - 1) * M + k] + r->p2p_s;
            if (B && s + 1 < S) ready = bend[(s + 1) * M + k] < 0 ? -1 : bend[(s + 1) * M + k] + r->p2p_s;
            if (ready < 0) continue;
            double t0 = ready > free_at[s] ? ready : free_at[s], t1 = t0 + (B ? r->b_s[s] : r->f_s[s]);
            (B ? bend : fend)[s * M + k] = free_at[s] = t1;
            sp[(size_t)s * 2 * M + (size_t)pc[s]] = (struct dp_plan_span){s, k, B, t0, t1};
            pc[s]++, left--, ran = 1;
        }
        if (!ran && left) rc = dp_seterr(DP_EINTERNAL, "plan: the pipeline schedule stalled");
    }
    dp_free(ops), dp_free(fend), dp_free(bend), dp_free(pc), dp_free(free_at);
    if (rc) {
        dp_free(sp);
        return rc;
    }
    *out = sp;
    return n;
}
