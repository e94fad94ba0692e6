/* Pipeline parallelism (--pp S): the model's layer sequence cut into S stages,
 * one worker each, and each replica's share of a batch cut into M micro-batches
 * that flow through them (dp/par.h: the schedules).  With P workers there are
 * R = P / S replicas of the pipeline, which train data-parallel: job rank g is
 * stage g / R of replica g mod R.
 *
 *   stage s, F(k)   receive micro-batch k's activations from stage s - 1 (stage
 *                   0: the batch's tokens or inputs), run layers
 *                   [first[s], first[s+1]) forward, send the output on (the last
 *                   stage: the loss, and its gradient)
 *   stage s, B(k)   receive the output's gradient from stage s + 1 (the last
 *                   stage: the loss's), run backward accumulating the stage's
 *                   parameter gradients, send the input's gradient back
 *
 * Every stage's gradient sums its micro-batches in order, and after the last
 * one the stage's replicas all-reduce it (their own world, bucketed and
 * overlapped with the last backward as in plain data parallelism: dp_sync over
 * the stage's span).  The mean, the checks and the update are then each
 * stage's on its span; the stages agree on three numbers through the job's
 * world: whether any gradient is not finite, the loss, and the squared norm
 * for --clip.  So the step is the one-worker step with the same global batch:
 *
 *   g = (1/N) sum over replicas r, micro-batches k, samples i of g_rki
 *
 * the same sum as one worker's, to float rounding (the order of the sums).
 * With --deterministic the micro-batches are the fixed chunks, each chunk's
 * gradient converted to fixed point as backward reports it (dp_sync), and the
 * stage's replicas add the integers once per step: one worker's bits for any
 * layout (a chunk's gradient is the same bits on whichever stage runs its
 * layers: dp_model_forward_range and dp_model_backward_range are dp_model_run
 * in halves).
 *
 * Tensor parallelism (--tp T, tp.c) within the stages: each stage of each replica is a tensor
 * group of T neighbouring workers (job rank g: stage g / (R T), member g mod (R T) of the stage,
 * replica member / T, tensor rank member mod T).  A group's ranks send and receive their
 * activations each to and from the same tensor rank of the neighbouring stage (after the group's
 * sums they hold the same ones), reduce over all the stage's R T members (the replicated gradient
 * counted once per group, tp.c), and count the loss once (tensor rank 0).  Below, "replica" is a
 * member of a stage: its index in the stage's world.
 *
 * Processes.  On threads the stages' messages go through the job's world and
 * each stage's replicas have a world of their own; under mpirun (one worker per
 * process) the messages go through the processes' communicator and each stage's
 * replicas through a group split from it (dp_comm_split_group).
 *
 * Tied parameters.  A layer may read an earlier layer's parameters (the gpt's
 * head reads the embedding's tok.weight).  When the two are on different
 * stages, the owner's stage holds and updates them; the reader holds a copy:
 * after its last backward (deterministic: each chunk's) it sends the gradient it
 * added into the copy to the owner, which adds it in before its own backward of
 * that micro-batch (so the owner's bucket reduces the whole gradient, and with
 * one micro-batch in one worker's order), and after the update the owner sends
 * the new values back (Megatron-LM's embedding group, with one owner).
 *
 * Each stage holds its share.  A worker holds its span's parameters, gradient
 * and optimizer state (and the tied copy below); the rest of the model's slabs
 * is mapped and never touched (setup.c: drawn, loaded or copied range by
 * range).  Evaluation runs through the stages (dp__pipe_evaluate, below).  A
 * checkpoint is written in the whole slab's layout, each stage's parameters and
 * optimizer state at their offsets (dp__state_part_each; across processes each
 * stage's replica 0 sends its span to rank 0 in blocks: dp__pipe_serve), so a
 * pipelined run resumes unpipelined and the reverse; the epoch's hash and the
 * run's result stream the spans by broadcast (pipe_whole). */
#include "dp/par.h"
#include "trainer.h"

/* Message tags of the pipeline's protocol (the world's messages are apart from its collectives):
 * micro-batch k's activations and gradient carry a tag of their own (k mod TAG_RING), so that
 * the receives posted ahead for several micro-batches match the same on either backend. */
enum { TAG_RING = 4096, TAG_ACT = 20000, TAG_GRAD = TAG_ACT + TAG_RING, TAG_TIE_GRAD = 30003, TAG_TIE_PARAM = 30004,
       TAG_STATE = 30005 /* (a checkpoint's optimizer state, to rank 0) */, TAG_EVAL = 30006 };
enum { TIE_NONE = 0, TIE_OWNER = 1, TIE_READER = 2 };

struct worker_pipe {
    int stage, replica, S, R, kind; /* (R: the stage's members, replicas x tensor ranks) */
    int data_rank;               /* the replica whose share this member reads (replica / --tp) */
    int M;                       /* this step's micro-batches (--deterministic: its chunks) */
    int M_max;                   /* the most micro-batches a step has (the schedule's and views' room) */
    int det;                     /* --deterministic: the micro-batches are the fixed chunks */
    struct dp_span span;
    int64_t buf_off, buf_count;  /* the stage's layers' buffers (BatchNorm's running statistics) */
    struct dp_comm *scomm;       /* the stage's replicas (their gradient's all-reduce) */
    struct dp_comm *pcomm;       /* the messages between stages: the job's world on threads, the
                                    processes' communicator under mpirun (one worker each) */
    int prev, next;              /* job ranks of this replica's neighbouring stages (-1: none) */
    int64_t in_n, out_n;         /* floats per sample of the stage's input and output */
    int64_t micro_max;           /* the largest micro-batch */
    int nviews;                  /* micro-batches held at once (dp_pipe_max_inflight) */
    struct dp_replica *views;    /* micro-batch k's activations: views[k mod nviews] */
    struct dp_pass *pass;        /* ... its pass */
    int *reducing;               /* ... whether its backward reduces (the last micro-batch's) */
    float **xin;                 /* ... its input, received from the stage before */
    float **dyb;                 /* ... its output's gradient, received from the stage after */
    struct dp_comm_msg **xreq;   /* ... the receive of its input, posted ahead (NULL: none) */
    struct dp_comm_msg **dyreq;  /* ... the receive of its output's gradient, posted ahead */
    struct dp_comm_msg **sent;   /* ... its last message sent (activations, then the input's gradient) */
    struct dp_pipe_op *ops;      /* this stage's schedule (2M; room for 2 M_max) */
    struct dp__tp_hook *tp_hooks; /* --tp: each view's pass's gradient hook (tp.c) */
    int tie;                     /* TIE_* */
    int tie_peer;                /* the job rank at the other end of the tie */
    int64_t tie_off, tie_count;  /* the tied range of the slab */
    float *tie_buf;              /* the owner: the reader's gradient, received */
    double loss, seen;           /* this step's loss sum and samples (the last stage's) */
};

/* ---- the plan ------------------------------------------------------------------------ */

int dp__pipe_plan(struct dp_trainer *t) {
    const struct dp_train_params *p = &t->p;
    const struct dp_model *m = t->model;
    t->pp = p->dp.pp, t->pp_R = t->G / t->pp, t->pp_M = p->dp.micro_batches ? p->dp.micro_batches : t->pp;
    if (m->nlayers < t->pp)
        return dp_seterr(DP_EINVAL, "--pp %d: model '%s' has %d layers, fewer than the stages", t->pp, m->spec,
                         m->nlayers);
    /* Each stage's cost: its layers' counted forward FLOPs (backward is about twice forward
     * for each, so the proportions hold), plus one unit per layer so that layers without
     * FLOPs (norms, activations) still spread. */
    double *cost = dp_malloc(sizeof(double) * (size_t)m->nlayers);
    t->pp_first = dp_malloc(sizeof(int) * (size_t)(t->pp + 1));
    t->pp_worlds = dp_calloc((size_t)t->pp, sizeof *t->pp_worlds);
    if (!cost || !t->pp_first || !t->pp_worlds) {
        dp_free(cost);
        return dp_seterr(DP_ENOMEM, "--pp: out of memory");
    }
    for (int i = 0; i < m->nlayers; i++) cost[i] = (double)m->layers[i]->flops_fwd + 1.0;
    int rc = dp_pipe_split(cost, m->nlayers, t->pp, t->pp_first);
    double total = 0;
    for (int i = 0; i < m->nlayers; i++) total += cost[i];
    /* the layout, for the caller to show: each stage's layers, parameters and share of the FLOPs */
    char micro[64], groups[64] = "";
    if (p->dp.deterministic) /* (the micro-batches are the fixed chunks) */
        snprintf(micro, sizeof micro, "micro-batches of %lld (--det-chunk)", (long long)p->dp.det_chunk);
    else snprintf(micro, sizeof micro, "%d micro-batch%s", t->pp_M, t->pp_M > 1 ? "es" : "");
    const int reps = t->pp_R / p->dp.tp;
    if (p->dp.tp > 1) snprintf(groups, sizeof groups, " of %d-way tensor groups", p->dp.tp);
    int n = snprintf(t->layout, sizeof t->layout, "pipeline: %d stage%s x %d replica%s%s, %s, %s:", t->pp,
                     t->pp > 1 ? "s" : "", reps, reps > 1 ? "s" : "", groups, micro, dp_pipe_schedule_name(p->dp.pp_schedule));
    for (int s = 0; !rc && s < t->pp && n > 0 && (size_t)n < sizeof t->layout; s++) {
        int a = t->pp_first[s], b = t->pp_first[s + 1];
        double c = 0;
        for (int i = a; i < b; i++) c += cost[i];
        struct dp_span sp;
        (void)dp_model_span(m, a, b, &sp);
        n += snprintf(t->layout + n, sizeof t->layout - (size_t)n, " stage %d %s%s%s (%lld parameters, %.0f%%)%s",
                      s, m->layers[a]->name, b - a > 1 ? ".." : "", b - a > 1 ? m->layers[b - 1]->name : "",
                      (long long)sp.param_count, 100.0 * c / total, s + 1 < t->pp ? ";" : "");
    }
    dp_free(cost);
    if (rc) return rc;
    struct dp_comm_params cp = dp_comm_default_params();
    cp.timeout_s = p->dp.comm_timeout;
    cp.progress = t->comm_progress;
    cp.spin_us = p->dp.comm_spin_us;
    for (int s = 0; s < t->pp && !p->dp.inter; s++) /* (processes: each rank splits the job's, pipe_worker_init) */
        if ((rc = dp_comm_thread_world_init(&t->pp_worlds[s], t->pp_R, &cp))) return rc;
    return DP_OK;
}

void dp__pipe_free(struct dp_trainer *t) {
    for (int s = 0; t->pp_worlds && s < t->pp; s++) dp_comm_thread_world_free(t->pp_worlds[s]);
    dp_free(t->pp_worlds);
    dp_free(t->pp_first);
    t->pp_worlds = NULL, t->pp_first = NULL;
}

/* ---- a worker's stage ------------------------------------------------------------------ */

/* Broadcast blocks: at most this many floats in flight (a worker holds one beyond its slabs). */
#define PBLOCK ((int64_t)1 << 20)

/* The stages' assembly (dp_sync's `whole` hook, at dp_sync_settle and dp_sync_gather): each
 * stage's buffers (small: every worker keeps them whole) broadcast from its replica 0, and, for
 * dp_sync_gather, its span in blocks, folded into *hash as they pass, kept only where keep (the
 * run's end, after the gradient's pages are given back: its result, dp_trainer_replica).
 * (keep is the worker's own; whether the spans pass is the call's, the same on every worker:
 * dp_sync_gather's keep 0 or 1, not dp_sync_settle's -1.) */
static int pipe_whole(void *arg, int keep, uint64_t *hash) {
    struct worker *w = arg;
    struct worker_pipe *pp = w->pipe;
    const struct dp_trainer *t = w->t;
    const int stream = keep >= 0;
    keep = keep > 0;
    float *blk = stream && !keep ? dp_malloc(sizeof(float) * (size_t)PBLOCK) : NULL;
    if (stream && !keep && !blk) return dp_seterr(DP_ENOMEM, "pipeline: out of memory for a block of the parameters");
    if (keep) dp_slab_release(w->sync.grads, sizeof(float) * (size_t)w->sync.n); /* (no step after) */
    int rc = DP_OK;
    for (int s = 0; s < pp->S && !rc; s++) {
        struct dp_span sp;
        (void)dp_model_span(t->model, t->pp_first[s], t->pp_first[s + 1], &sp);
        const struct dp_layer *a = t->model->layers[sp.layer0], *z = t->model->layers[sp.layer1 - 1];
        int64_t boff = a->buffer_off, bn = z->buffer_off + z->buffer_count - boff;
        const int root = s * pp->R;
        for (int64_t o = 0; stream && o < sp.param_count && !rc; o += PBLOCK) {
            const int64_t c = sp.param_count - o < PBLOCK ? sp.param_count - o : PBLOCK;
            float *x = keep || w->grank == root ? w->rep.params + sp.param_off + o : blk;
            rc = dp_comm_broadcast(w->comm, x, c, DP_DTYPE_F32, root, DP_ALGO_AUTO);
            if (!rc && hash) *hash = dp_fnv1a64(x, sizeof(float) * (size_t)c, *hash);
        }
        if (!rc && bn > 0)
            rc = dp_comm_broadcast(w->comm, w->rep.buffers + boff, bn, DP_DTYPE_F32, root, DP_ALGO_AUTO);
    }
    dp_free(blk);
    return rc;
}

/* The tied range a stage's layers read outside their span, and the stage that owns it:
 * at most one such range in the model (DP_ENOTSUP otherwise). */
static int find_tie(const struct dp_trainer *t, int *reader, int *owner, int64_t *off, int64_t *count) {
    *reader = *owner = -1, *off = *count = 0;
    for (int s = 0; s < t->pp; s++) {
        struct dp_span sp;
        (void)dp_model_span(t->model, t->pp_first[s], t->pp_first[s + 1], &sp);
        for (int i = sp.layer0; i < sp.layer1; i++) {
            const struct dp_layer *l = t->model->layers[i];
            if (!l->tied_count || (l->tied_off >= sp.param_off && l->tied_off < sp.param_off + sp.param_count))
                continue;
            if (*reader >= 0 && (*reader != s || *off != l->tied_off))
                return dp_seterr(DP_ENOTSUP, "--pp: model '%s' ties more than one parameter across stages",
                                 t->model->spec);
            *reader = s, *off = l->tied_off, *count = l->tied_count;
        }
    }
    for (int s = 0; *reader >= 0 && s < t->pp; s++) {
        struct dp_span sp;
        (void)dp_model_span(t->model, t->pp_first[s], t->pp_first[s + 1], &sp);
        if (*off >= sp.param_off && *off + *count <= sp.param_off + sp.param_count) *owner = s;
    }
    if (*reader >= 0 && *owner < 0)
        return dp_seterr(DP_ENOTSUP, "--pp: a tied parameter of model '%s' spans stages", t->model->spec);
    return DP_OK;
}

int dp__pipe_worker_init(struct worker *w, struct dp_loader_params *lp) {
    struct dp_trainer *t = w->t;
    const struct dp_model *m = t->model;
    struct worker_pipe *pp = w->pipe = dp_calloc(1, sizeof *pp);
    if (!pp) return dp_seterr(DP_ENOMEM, "--pp: out of memory");
    pp->S = t->pp, pp->R = t->pp_R, pp->M = t->pp_M, pp->kind = t->p.dp.pp_schedule;
    pp->stage = w->grank / pp->R, pp->replica = w->grank % pp->R;
    pp->prev = pp->stage > 0 ? w->grank - pp->R : -1;
    pp->next = pp->stage + 1 < pp->S ? w->grank + pp->R : -1;
    int l0 = t->pp_first[pp->stage], l1 = t->pp_first[pp->stage + 1];
    int rc = dp_model_span(m, l0, l1, &pp->span);
    if (rc) return rc;
    pp->buf_off = m->layers[l0]->buffer_off;
    pp->buf_count = m->layers[l1 - 1]->buffer_off + m->layers[l1 - 1]->buffer_count - pp->buf_off;
    pp->in_n = dp_shape_numel(&m->layers[l0]->in_shape);
    pp->out_n = dp_shape_numel(&m->layers[l1 - 1]->out_shape);
    /* the loader: replica r of R reads the share R data-parallel workers' rank r would (in whole
     * chunks when deterministic: lp->align) */
    const int T = t->p.dp.tp, reps = pp->R / T;
    pp->data_rank = pp->replica / T;
    lp->rank = pp->data_rank, lp->world = reps;
    int64_t share = (t->p.run.batch + reps - 1) / reps, C = t->p.dp.det_chunk;
    pp->det = t->p.dp.deterministic;
    if (pp->det) share = (share + C - 1) / C * C; /* (whole chunks) */
    pp->M_max = pp->det ? (int)((share + C - 1) / C) : pp->M;
    pp->micro_max = pp->det ? C : (share + pp->M - 1) / pp->M;
    pp->nviews = dp_pipe_max_inflight(pp->kind, pp->S, pp->M_max, pp->stage);
    pp->views = dp_calloc((size_t)pp->nviews, sizeof *pp->views);
    pp->pass = dp_calloc((size_t)pp->nviews, sizeof *pp->pass);
    pp->reducing = dp_calloc((size_t)pp->nviews, sizeof *pp->reducing);
    pp->xin = dp_calloc((size_t)pp->nviews, sizeof *pp->xin);
    pp->dyb = dp_calloc((size_t)pp->nviews, sizeof *pp->dyb);
    pp->xreq = dp_calloc((size_t)pp->nviews, sizeof *pp->xreq);
    pp->dyreq = dp_calloc((size_t)pp->nviews, sizeof *pp->dyreq);
    pp->sent = dp_calloc((size_t)pp->nviews, sizeof *pp->sent);
    pp->tp_hooks = dp_calloc((size_t)pp->nviews, sizeof *pp->tp_hooks);
    pp->ops = dp_malloc(sizeof *pp->ops * (size_t)(2 * pp->M_max));
    if (!pp->views || !pp->pass || !pp->reducing || !pp->xin || !pp->dyb || !pp->xreq || !pp->dyreq || !pp->sent ||
        !pp->ops || !pp->tp_hooks)
        return dp_seterr(DP_ENOMEM, "--pp: out of memory");
    for (int v = 0; v < pp->nviews; v++) {
        if ((rc = dp_replica_init_view(&pp->views[v], &w->rep, l0, l1, pp->micro_max))) return rc;
        if ((pp->prev >= 0 && !(pp->xin[v] = dp_malloc_big(sizeof(float) * (size_t)(pp->micro_max * pp->in_n)))) ||
            (pp->next >= 0 && !(pp->dyb[v] = dp_malloc_big(sizeof(float) * (size_t)(pp->micro_max * pp->out_n)))))
            return dp_seterr(DP_ENOMEM, "--pp: out of memory");
    }
    int reader, owner;
    if ((rc = find_tie(t, &reader, &owner, &pp->tie_off, &pp->tie_count))) return rc;
    if (reader >= 0 && (pp->stage == reader || pp->stage == owner)) {
        pp->tie = pp->stage == owner ? TIE_OWNER : TIE_READER;
        pp->tie_peer = (pp->stage == owner ? reader : owner) * pp->R + pp->replica;
        if (pp->tie == TIE_OWNER && !(pp->tie_buf = dp_malloc_big(sizeof(float) * (size_t)pp->tie_count)))
            return dp_seterr(DP_ENOMEM, "--pp: out of memory");
    }
    pp->pcomm = t->p.dp.inter ? t->p.dp.inter : w->comm; /* (one worker per process: job rank = process rank) */
    return t->p.dp.inter ? dp_comm_split_group(t->p.dp.inter, pp->stage, pp->replica, &pp->scomm)
                         : dp_comm_thread_init(&pp->scomm, t->pp_worlds[pp->stage], pp->replica);
}

struct dp_comm *dp__pipe_sync_params(struct worker *w, struct dp_sync_params *sp) {
    sp->span = w->pipe->span;
    sp->zero_ahead = 0; /* (ZeRO 1: the stage's gather within the step, before the tied values are sent) */
    sp->whole = pipe_whole, sp->whole_arg = w;
    return w->pipe->scomm;
}

void dp__pipe_worker_free(struct worker *w) {
    struct worker_pipe *pp = w->pipe;
    if (!pp) return;
    for (int v = 0; v < pp->nviews; v++) { /* (a failed step's messages: the sends done, the receives withdrawn) */
        if (pp->sent && pp->sent[v]) (void)dp_comm_msg_wait(pp->pcomm, pp->sent[v], NULL, NULL);
        if (pp->xreq && pp->xreq[v]) (void)dp_comm_msg_cancel(pp->pcomm, pp->xreq[v]);
        if (pp->dyreq && pp->dyreq[v]) (void)dp_comm_msg_cancel(pp->pcomm, pp->dyreq[v]);
        if (pp->views) dp_replica_free(&pp->views[v]);
        if (pp->xin) dp_free(pp->xin[v]);
        if (pp->dyb) dp_free(pp->dyb[v]);
    }
    dp_free(pp->views), dp_free(pp->pass), dp_free(pp->reducing), dp_free(pp->xin), dp_free(pp->dyb);
    dp_free(pp->xreq), dp_free(pp->dyreq), dp_free(pp->sent), dp_free(pp->ops), dp_free(pp->tie_buf);
    dp_free(pp->tp_hooks);
    dp_comm_free(pp->scomm);
    dp_free(pp);
    w->pipe = NULL;
}

void dp__pipe_abort(struct dp_trainer *t, const char *msg) {
    for (int r = 0; r < t->P; r++)
        if (t->w[r].pipe && t->w[r].pipe->scomm) dp_comm_abort(t->w[r].pipe->scomm, msg);
}

/* ---- one step ---------------------------------------------------------------------------- */

/* View v's last message sent, completed (before the view's memory is written again). */
static int sent_wait(struct worker *w, int v) {
    struct worker_pipe *pp = w->pipe;
    if (!pp->sent[v]) return DP_OK;
    int rc = dp_comm_msg_wait(pp->pcomm, pp->sent[v], NULL, NULL);
    pp->sent[v] = NULL;
    return rc;
}

/* BatchNorm's statistics summed over the stage's replicas (SyncBatchNorm within the stage) */
static int stage_stat_sync(void *arg, double *buf, int64_t n) {
    struct worker *w = arg;
    return dp_comm_allreduce(w->pipe->scomm, buf, n, DP_DTYPE_F64, DP_ALGO_AUTO);
}

/* A receive posted ahead, waited for: n floats expected. */
static int recv_wait(struct worker *w, struct dp_comm_msg **req, int64_t n, int src) {
    int64_t got = 0;
    int rc = dp_comm_msg_wait(w->pipe->pcomm, *req, NULL, &got);
    *req = NULL;
    if (!rc && got != n * (int64_t)sizeof(float))
        rc = dp_seterr(DP_EINTERNAL, "pipeline: %lld bytes from rank %d, expected %lld", (long long)got, src,
                       (long long)(n * (int64_t)sizeof(float)));
    return rc;
}

/* n floats from src with tag, now. */
static int recv_floats(struct worker *w, float *buf, int64_t n, int src, int tag) {
    struct dp_comm_msg *req;
    int rc = dp_comm_irecv(w->pipe->pcomm, buf, n * (int64_t)sizeof(float), src, tag, &req);
    return rc ? rc : recv_wait(w, &req, n, src);
}

/* Micro-batch k's rows [*c0, *c0 + *B) of the loader's batch: M equal cuts, or the fixed chunks. */
static void micro_rows(const struct dp_trainer *t, const struct worker_pipe *pp, const struct dp_loader_batch *lb,
                       int k, int64_t *c0, int64_t *B) {
    const int64_t C = t->p.dp.det_chunk;
    if (pp->det) *c0 = (int64_t)k * C, *B = lb->B - *c0 < C ? lb->B - *c0 : C;
    else dp_comm_split(lb->B, pp->M, k, c0, B);
}

/* Micro-batch k's input, received ahead into its view's buffer: posted when the view is free
 * (the step's start for the first ones, or after the backward of the micro-batch before it on the
 * view), so its transfer overlaps the compute of the micro-batches before it. */
static int post_input(struct worker *w, const struct dp_loader_batch *lb, int k) {
    struct worker_pipe *pp = w->pipe;
    if (pp->prev < 0 || k >= pp->M) return DP_OK;
    int64_t c0, B;
    micro_rows(w->t, pp, lb, k, &c0, &B);
    int v = k % pp->nviews;
    return dp_comm_irecv(pp->pcomm, pp->xin[v], B * pp->in_n * (int64_t)sizeof(float), pp->prev, TAG_ACT + k % TAG_RING,
                         &pp->xreq[v]);
}

/* F(k): the input (received, or the batch's), the stage's layers, the output sent on (or,
 * on the last stage, the loss counted); the receive of its output's gradient posted. */
static int pipe_forward(struct worker *w, const struct dp_loader_batch *lb, const struct dp_batch *b, int k) {
    struct dp_trainer *t = w->t;
    struct worker_pipe *pp = w->pipe;
    int v = k % pp->nviews, rc = sent_wait(w, v);
    if (rc) return rc;
    struct dp_pass *pass = &pp->pass[v];
    *pass = (struct dp_pass){.training = 1, .backward = 1, .seed = t->p.run.seed, .loss_scale = 1.0f};
    pp->reducing[v] = dp_sync_micro_begin(&w->sync, pass, k, pp->M, 0, (double)lb->global_B);
    if (pp->R > 1) pass->stat_sync = stage_stat_sync, pass->stat_sync_arg = w;
    dp__tp_begin(w, pass, &pp->tp_hooks[v]); /* --tp: the group's sums, the replicated gradient counted once */
    const float *x = NULL;
    double t0 = dp_time();
    if (pp->prev >= 0 && (rc = recv_wait(w, &pp->xreq[v], b->B * pp->in_n, pp->prev))) return rc;
    if (pp->prev >= 0) x = pp->xin[v];
    double ta = dp_time();
    struct dp_replica *r = &pp->views[v];
    if (t->fault.kind == DP_FAULT_ALLOC && w->grank == t->fault.worker && w->step == t->fault.step && k == pp->M - 1)
        return dp_seterr(DP_ENOMEM, "injected allocation failure");
    rc = dp_model_forward_range(t->model, r, b, pp->span.layer0, pp->span.layer1, x, pass);
    if (rc) return rc;
    struct dp_tl_event *e = dp_timeline_push(&w->tl, "forward", 0, w->step, ta, ta + pass->t_forward);
    if (e) e->micro = k;
    if (ta > t0) dp_timeline_add(&w->tl, "pipe-wait", 0, w->step, t0, ta);
    w->t_fwd += pass->t_forward;
    if (pp->next >= 0) {
        const int64_t bytes = b->B * pp->out_n * (int64_t)sizeof(float);
        rc = dp_comm_irecv(pp->pcomm, pp->dyb[v], bytes, pp->next, TAG_GRAD + k % TAG_RING, &pp->dyreq[v]);
        return rc ? rc : dp_comm_isend(pp->pcomm, r->acts[pp->span.layer1], bytes, pp->next, TAG_ACT + k % TAG_RING,
                                       &pp->sent[v]);
    }
    if (w->tp.rank) return DP_OK; /* (a tensor group's loss: its rank 0's) */
    w->loss_sum += pass->loss_sum; /* (the last stage's: the epoch's loss and accuracy) */
    w->correct += pass->correct;
    w->seen += b->B;
    return DP_OK;
}

/* B(k): the output's gradient (received, or the loss's), the stage's backward (the tied
 * gradient added in first on the owner's last), the input's gradient sent back. */
static int pipe_backward(struct worker *w, const struct dp_loader_batch *lb, const struct dp_batch *b, int k) {
    struct dp_trainer *t = w->t;
    struct worker_pipe *pp = w->pipe;
    int v = k % pp->nviews, last = k == pp->M - 1, rc = sent_wait(w, v);
    /* the tied gradient crosses once per step, or per chunk when deterministic (each chunk's is
     * converted as backward reports it: the reader's share must be in before the owner's) */
    const int tie_now = last || pp->det;
    if (rc) return rc;
    struct dp_pass *pass = &pp->pass[v];
    double t0 = dp_time();
    if (pp->next >= 0 && (rc = recv_wait(w, &pp->dyreq[v], b->B * pp->out_n, pp->next))) return rc;
    if (pp->det) { /* (the chunk's conversion counts from here: gpipe runs the forwards first) */
        (void)dp_sync_micro_begin(&w->sync, pass, k, pp->M, 0, 0);
        if (pp->tie == TIE_READER) memset(w->rep.grads + pp->tie_off, 0, sizeof(float) * (size_t)pp->tie_count);
    }
    if (tie_now && pp->tie == TIE_OWNER) { /* the reader's share of the tied gradient, before this backward */
        if ((rc = recv_floats(w, pp->tie_buf, pp->tie_count, pp->tie_peer, TAG_TIE_GRAD))) return rc;
        float *g = w->rep.grads + pp->tie_off;
        for (int64_t i = 0; i < pp->tie_count; i++) g[i] += pp->tie_buf[i];
    }
    double ta = dp_time();
    if (ta > t0) dp_timeline_add(&w->tl, "pipe-wait", 0, w->step, t0, ta);
    struct dp_replica *r = &pp->views[v];
    const float *dx = NULL;
    rc = dp_model_backward_range(t->model, r, b, pp->span.layer0, pp->span.layer1, pp->next >= 0 ? pp->dyb[v] : NULL,
                                 &dx, pass);
    if ((rc = dp_sync_micro_end(&w->sync, pass, pp->reducing[v], rc))) return rc;
    struct dp_tl_event *e = dp_timeline_push(&w->tl, "backward", 0, w->step, ta, ta + pass->t_backward);
    if (e) e->micro = k;
    w->t_bwd += pass->t_backward;
    if (pp->prev >= 0 && ((rc = dp_comm_isend(pp->pcomm, dx, b->B * pp->in_n * (int64_t)sizeof(float), pp->prev,
                                              TAG_GRAD + k % TAG_RING, &pp->sent[v])) ||
                          (rc = post_input(w, lb, k + pp->nviews)))) /* (the view is free for the next) */
        return rc;
    if (tie_now && pp->tie == TIE_READER)
        rc = dp_comm_send(pp->pcomm, w->rep.grads + pp->tie_off, pp->tie_count * (int64_t)sizeof(float), pp->tie_peer,
                          TAG_TIE_GRAD);
    if (!rc && last && pp->reducing[v]) { /* the stage's all-reduce, overlapped with this backward */
        rc = dp_sync_finish(&w->sync, 1);
        const struct dp_reducer *red = &w->sync.red;
        w->step_wait += red->t_end - red->t_backward_end;
        dp_timeline_add(&w->tl, "wait", 0, w->step, red->t_backward_end, red->t_end);
    }
    return rc;
}

/* The stages' agreement after their reductions: [0] a gradient that is not finite anywhere,
 * [1] the loss summed and [2] the samples (the last stage's), [3] the squared norm of the
 * whole gradient (each stage's span once: its replica 0's). */
static int agree(struct worker *w, int bad, double out[4]) {
    struct worker_pipe *pp = w->pipe;
    const int last = pp->next < 0;
    out[0] = bad;
    out[1] = last ? pp->loss : 0;
    out[2] = last ? pp->seen : 0;
    out[3] = 0;
    if (w->t->p.run.clip_norm > 0 && pp->replica == 0) /* (ZeRO: the stage's, from dp_sync_check) */
        out[3] = w->t->p.dp.zero ? w->sync.sumsq : pow(dp_grad_norm(w->sync.grads, w->sync.n), 2);
    return dp_comm_allreduce(w->comm, out, 4, DP_DTYPE_F64, DP_ALGO_AUTO);
}

static int pipe_step(struct worker *w, int64_t nmicro, int64_t *skipped, double *n_step, double *loss_step) {
    (void)nmicro; /* (one global batch: --accum is refused with --pp) */
    struct dp_trainer *t = w->t;
    struct worker_pipe *pp = w->pipe;
    const struct dp_model *m = t->model;
    int rc = dp_sync_step_begin(&w->sync, w->step); /* the span's gradient zeroed */
    if (rc) return rc;
    if (pp->tie == TIE_READER) memset(w->rep.grads + pp->tie_off, 0, sizeof(float) * (size_t)pp->tie_count);
    if (w->buf_save) memcpy(w->buf_save, w->rep.buffers, sizeof(float) * (size_t)m->num_buffers);
    w->step_wait = w->step_slow = 0;
    const struct dp_loader_batch *lb;
    double td = dp_time();
    if ((rc = dp_loader_next(w->loader, &lb))) return rc;
    dp_timeline_add(&w->tl, "data", 0, w->step, td, dp_time());
    double loss0 = w->loss_sum, seen0 = (double)w->seen;
    const int64_t per = dp_shape_numel(&m->in_shape), C = t->p.dp.det_chunk;
    /* the micro-batches: M equal cuts of the share, or its fixed chunks (every stage of a replica
     * reads the same share, so all agree on M) */
    if (pp->det) pp->M = lb->B > 0 ? (int)((lb->B + C - 1) / C) : 1;
    if ((rc = dp_pipe_schedule(pp->kind, pp->S, pp->M, pp->stage, pp->ops))) return rc;
    for (int k = 0; k < pp->nviews && !rc; k++) rc = post_input(w, lb, k); /* (every view is free) */
    for (int i = 0; i < 2 * pp->M && !rc; i++) {
        const struct dp_pipe_op op = pp->ops[i];
        int64_t c0, B;
        micro_rows(t, pp, lb, op.micro, &c0, &B);
        struct dp_batch b = dp__batch_of(lb, c0, B, per, t->pos, dp_model_num_classes(m));
        rc = op.kind == 'F' ? pipe_forward(w, lb, &b, op.micro) : pipe_backward(w, lb, &b, op.micro);
    }
    for (int v = 0; v < pp->nviews && !rc; v++) rc = sent_wait(w, v);
    if (!rc && pp->det) rc = dp_sync_finish(&w->sync, 1); /* the chunks' fixed-point sums over the stage's replicas */
    if (rc) return rc;
    pp->loss = w->loss_sum - loss0, pp->seen = (double)w->seen - seen0;
    double t1 = dp_time();
    dp_sync_mean(&w->sync, (double)lb->global_B); /* sum -> mean over the global batch */
    int bad;
    double ag[4];
    if ((rc = dp_sync_check(&w->sync, &bad)) || (rc = agree(w, bad || dp_any_nonfinite(w->rep.buffers + pp->buf_off,
                                                                                            pp->buf_count), ag)))
        return rc;
    *n_step = (double)lb->global_B;
    *loss_step = ag[2] > 0 ? ag[1] / (ag[2] * (double)t->pos) : 0;
    if (ag[0] != 0) {
        if (t->p.dp.skip_nonfinite) {
            if (w->buf_save) memcpy(w->rep.buffers, w->buf_save, sizeof(float) * (size_t)m->num_buffers);
            (*skipped)++;
            return DP_OK;
        }
        return dp_seterr(DP_ENONFINITE, "step %lld (epoch %lld): the loss or the gradient is not finite; try a "
                         "lower --lr, --clip, or --skip-nonfinite", (long long)w->step, (long long)w->epoch + 1);
    }
    /* --clip over the whole model: coef = c / (||g|| + 1e-6) when below 1 (dp_clip_grad_norm's) */
    double c = t->p.run.clip_norm > 0 ? t->p.run.clip_norm / (sqrt(ag[3]) + 1e-6) : 1.0;
    if (c < 1.0) {
        const float cf = (float)c;
        for (int64_t i = 0; i < w->sync.n; i++) w->sync.grads[i] *= cf;
    }
    rc = dp_sync_update(&w->sync, dp_sched_lr(&t->p.sched, w->step), 0);
    if (!rc && t->fault.kind == DP_FAULT_DIVERGE && w->grank == t->fault.worker && w->step == t->fault.step)
        w->sync.params[w->sync.n / 2] += 1e-3f; /* (a test's replica that drifts: --check-replicas finds it) */
    /* the tied parameters' new values, from the owner to the reader */
    if (!rc && pp->tie == TIE_OWNER)
        rc = dp_comm_send(pp->pcomm, w->rep.params + pp->tie_off, pp->tie_count * (int64_t)sizeof(float), pp->tie_peer,
                          TAG_TIE_PARAM);
    if (!rc && pp->tie == TIE_READER)
        rc = recv_floats(w, w->rep.params + pp->tie_off, pp->tie_count, pp->tie_peer, TAG_TIE_PARAM);
    double t2 = dp_time();
    dp__update_done(w, t2 - t1);
    dp_timeline_add(&w->tl, "optimizer", 0, w->step, t1, t2);
    return rc;
}

/* A failure names the stage (the worker and step are added by the loop). */
static int pipe_step_named(struct worker *w, int64_t nmicro, int64_t *skipped, double *n_step, double *loss_step) {
    int rc = pipe_step(w, nmicro, skipped, n_step, loss_step);
    if (!rc || rc == DP_ENONFINITE || rc == DP_ECANCELED) return rc;
    const struct worker_pipe *pp = w->pipe;
    const struct dp_model *m = w->t->model;
    const int a = pp->span.layer0, b = pp->span.layer1;
    return dp_adderr(rc, "pipeline stage %d (%s%s%s)", pp->stage, m->layers[a]->name, b - a > 1 ? ".." : "",
                     b - a > 1 ? m->layers[b - 1]->name : "");
}

const struct dp__mode dp__mode_pipe = {.name = "pipeline", .loop = dp__step_loop, .step = pipe_step_named};

int64_t dp__pipe_activation_bytes(const struct worker *w) {
    const struct worker_pipe *pp = w->pipe;
    int64_t n = 0;
    for (int v = 0; v < pp->nviews; v++) n += (int64_t)pp->views[v].arena.high_water;
    return n;
}

/* ---- evaluation ----------------------------------------------------------------------------- */

/* Evaluation through the stages: member m of every stage takes chunks m, m + R, m + 2R, ...
 * (R: the stage's members), stage 0 runs its layers on the chunk's samples and sends the output
 * on, each stage after it receives, runs its own and sends on, and the last one records the
 * chunk's loss and correct count.  Each stage holds its own layers' activations only, for one
 * chunk at a time (a view of eval_chunk samples, made for the evaluation and given back after
 * it), and reads no parameter outside its span (the reader's tied copy is kept current by the
 * step).  The chunks' slots are then all-reduced as in plain evaluation: each has one non-zero
 * contributor, and the range passes are the whole pass's bits (model_range_halves_same_bits),
 * so the totals are one worker's.  A tensor group's members evaluate whole layers (no tp in the
 * pass), as separate chains: every member holds its span's whole parameters. */
int dp__pipe_evaluate(struct worker *w, const struct dp_dataset *ds, int64_t n, int64_t nchunks, double *slot) {
    const struct dp_trainer *t = w->t;
    struct worker_pipe *pp = w->pipe;
    const int64_t E = t->eval_chunk;
    struct dp_replica view;
    int rc = dp_replica_init_view(&view, &w->rep, pp->span.layer0, pp->span.layer1, E);
    float *x = rc || pp->prev < 0 ? NULL : dp_malloc_big(sizeof(float) * (size_t)(E * pp->in_n));
    if (!rc && pp->prev >= 0 && !x) rc = dp_seterr(DP_ENOMEM, "evaluate: out of memory for stage %d's input", pp->stage);
    for (int64_t c = pp->replica; !rc && c < nchunks; c += pp->R) {
        struct dp_batch b;
        if ((rc = dp__eval_batch(t, w, ds, n, c, &b))) break; /* (stage 0 reads the samples, the last the targets) */
        struct dp_pass pass = {.training = 0, .seed = t->p.run.seed};
        if (pp->prev >= 0 && (rc = recv_floats(w, x, b.B * pp->in_n, pp->prev, TAG_EVAL))) break;
        if ((rc = dp_model_forward_range(t->model, &view, &b, pp->span.layer0, pp->span.layer1, x, &pass))) break;
        if (pp->next >= 0)
            rc = dp_comm_send(pp->pcomm, view.acts[pp->span.layer1], b.B * pp->out_n * (int64_t)sizeof(float), pp->next,
                              TAG_EVAL);
        else dp__eval_record(t, &pass, b.B, c, slot);
    }
    dp_free(x);
    dp_replica_free(&view);
    return rc ? dp_adderr(rc, "evaluate, pipeline stage %d", pp->stage) : DP_OK;
}

/* ---- checkpoints --------------------------------------------------------------------------- */

int dp__pipe_partial(const struct dp_trainer *t) { return t->pp > 1; }

int dp__pipe_held(const struct worker *w, int64_t off[2], int64_t len[2]) {
    const struct worker_pipe *pp = w->pipe;
    off[0] = pp->span.param_off, len[0] = pp->span.param_count;
    off[1] = pp->tie == TIE_READER ? pp->tie_off : 0, len[1] = pp->tie == TIE_READER ? pp->tie_count : 0;
    return len[1] ? 2 : 1;
}

int dp__state_part_each(const struct dp_trainer *t, int k, void (*put)(void *arg, const float *p, int64_t n),
                        void *arg) {
    const struct dp_sync *s0 = &t->w[0].sync;
    if (t->pp <= 1) {
        put(arg, k < 0 ? s0->params : s0->opt.state + (size_t)k * (size_t)s0->n, s0->n);
        return DP_OK;
    }
    int rc = DP_OK;
    float *buf = NULL;
    for (int s = 0; s < t->pp && !rc; s++) {
        if (t->G == t->P || s == 0) { /* (stage s's replica 0 is worker s R of this process; stage 0's, rank 0) */
            const struct dp_sync *sy = &t->w[t->G == t->P ? s * t->pp_R : 0].sync;
            put(arg, k < 0 ? sy->params : sy->opt.state + (size_t)k * (size_t)sy->n, sy->n);
            continue;
        }
        struct dp_span sp;
        (void)dp_model_span(t->model, t->pp_first[s], t->pp_first[s + 1], &sp);
        if (!buf && !(buf = dp_malloc(sizeof(float) * (size_t)PBLOCK)))
            return dp_seterr(DP_ENOMEM, "checkpoint: out of memory for a block of stage %d's state", s);
        for (int64_t o = 0; o < sp.param_count && !rc; o += PBLOCK) { /* (dp__pipe_serve's blocks) */
            const int64_t c = sp.param_count - o < PBLOCK ? sp.param_count - o : PBLOCK;
            if (!(rc = recv_floats(&t->w[0], buf, c, s * t->pp_R, TAG_STATE))) put(arg, buf, c);
        }
    }
    dp_free(buf);
    return rc;
}

int dp__pipe_serve(struct worker *w) {
    const struct worker_pipe *pp = w->pipe;
    int rc = DP_OK;
    if (pp->replica || !pp->stage) return DP_OK; /* (stage 0's is rank 0's own) */
    /* the span's parameters, then each part of its state, in blocks of PBLOCK floats
     * (dp__state_part_each receives them in this order) */
    for (int k = -1; k < dp_sync_state_parts(&w->sync) && !rc; k++) {
        const float *x = k < 0 ? w->sync.params : w->sync.opt.state + (size_t)k * (size_t)w->sync.n;
        for (int64_t o = 0; o < w->sync.n && !rc; o += PBLOCK) {
            const int64_t c = w->sync.n - o < PBLOCK ? w->sync.n - o : PBLOCK;
            rc = dp_comm_send(pp->pcomm, x + o, c * (int64_t)sizeof(float), 0, TAG_STATE);
        }
    }
    return rc;
}
