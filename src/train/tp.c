/* Tensor parallelism (--tp T): T workers that see the same samples split each transformer
 * block between them (Megatron-LM's layout, dp/nn.h struct dp_tp): rank r of a tensor group
 * computes attention heads [r H/T, (r+1) H/T) and the MLP's hidden features [r 4D/T, ...),
 * and the group sums its partial outputs (2 all-reduces in forward, 2 in backward per block,
 * through the group's own world of threads); the token table and the tied head are split by
 * vocabulary, and the loss reads the split logits (dp_softmax_xent_split).  With P workers there
 * are P / T data-parallel
 * replicas: job rank g is tensor rank g mod T of replica g / T, whose loader reads the share a
 * data-parallel worker of rank g / T among P / T would.  Under mpirun the groups are threads of
 * each process (--workers a multiple of T), and the replicas span the processes.
 *
 * The gradient.  Every worker holds the whole model (with --pp, its stage's: pipe_step.c).
 * After a group's backward, a split
 * parameter's gradient is in its slices, each on the rank that computed it (zero on the
 * others); a replicated parameter's (the norms, the embeddings, a row-parallel layer's bias) is
 * the same on every rank of the group.  So the ranks other than 0 zero the replicated ranges as
 * backward reports them, before they reach the reduction, and the ordinary all-reduce over all
 * P workers then sums
 *
 *     sum over replicas q, tensor ranks r of g_qr = sum over replicas q of g_q
 *
 * each element from exactly one rank of each group: the data-parallel sum, which the step
 * divides by the global batch as always.  Every worker then holds the whole reduced gradient
 * and takes the same update, so evaluation, checkpoints and resume are the plain ones (a run
 * resumes at any --tp).  The loss and the samples are counted once per group (its rank 0). */
#include "trainer.h"

int dp__tp_plan(struct dp_trainer *t) {
    const struct dp_model *m = t->model;
    t->tp = t->p.dp.tp;
    if (t->tp <= 1) return DP_OK;
    int rc = dp_model_tp_check(m, t->tp);
    if (rc) return rc;
    /* the replicated parameters' ranges, merged where they touch (parameters lie in offset order) */
    t->tp_rep = dp_malloc(sizeof(int64_t) * 2 * (size_t)(m->nparams + 1));
    t->tp_worlds = dp_calloc((size_t)(t->P / t->tp), sizeof *t->tp_worlds); /* (this process's groups) */
    if (!t->tp_rep || !t->tp_worlds) return dp_seterr(DP_ENOMEM, "--tp: out of memory");
    int64_t split = 0;
    t->tp_nrep = 0;
    for (int i = 0; i < m->nparams; i++) {
        const struct dp_param_info *pi = &m->params[i];
        if (pi->is_buffer) continue;
        if (pi->tp_split) {
            split += pi->count;
            continue;
        }
        int64_t *last = t->tp_nrep ? t->tp_rep + 2 * (t->tp_nrep - 1) : NULL;
        if (last && last[0] + last[1] == pi->offset) last[1] += pi->count;
        else t->tp_rep[2 * t->tp_nrep] = pi->offset, t->tp_rep[2 * t->tp_nrep + 1] = pi->count, t->tp_nrep++;
    }
    const size_t at = strlen(t->layout); /* (after the pipeline's line, with --pp) */
    const int reps = t->G / (t->tp * (t->pp > 1 ? t->pp : 1));
    char order[96];
    if (t->pp > 1)
        snprintf(order, sizeof order, "stage g / %d, replica (g mod %d) / %d, tensor rank g mod %d", t->G / t->pp,
                 t->G / t->pp, t->tp, t->tp);
    else snprintf(order, sizeof order, "replica g / %d, tensor rank g mod %d", t->tp, t->tp);
    snprintf(t->layout + at, sizeof t->layout - at,
             "%stensor: %d-way groups x %d replica%s%s (job rank g: %s): attention heads, MLP features and the "
             "vocabulary split %d ways (%lld of %lld parameters; the rest whole on every worker)",
             at ? "\n" : "", t->tp, reps, reps > 1 ? "s" : "", t->pp > 1 ? " in each stage" : "", order, t->tp,
             (long long)split, (long long)m->num_params);
    struct dp_comm_params cp = dp_comm_default_params();
    cp.timeout_s = t->p.dp.comm_timeout;
    cp.progress = DP_PROGRESS_CALLER; /* (a group's all-reduces are waited for at once, inside the pass) */
    cp.spin_us = t->p.dp.comm_spin_us;
    for (int q = 0; q < t->P / t->tp; q++)
        if ((rc = dp_comm_thread_world_init(&t->tp_worlds[q], t->tp, &cp))) return rc;
    return DP_OK;
}

void dp__tp_free(struct dp_trainer *t) {
    for (int q = 0; t->tp_worlds && q < t->P / t->tp; q++) dp_comm_thread_world_free(t->tp_worlds[q]);
    dp_free(t->tp_worlds), dp_free(t->tp_rep);
    t->tp_worlds = NULL, t->tp_rep = NULL;
}

/* The group's sum of a layer's partial output, or of its input's gradient (struct dp_tp). */
static int tp_allreduce(void *arg, float *buf, int64_t n) {
    struct worker *w = arg;
    return dp_comm_allreduce(w->tp_comm, buf, n, DP_DTYPE_F32, DP_ALGO_AUTO);
}

int dp__tp_worker_init(struct worker *w, struct dp_loader_params *lp) {
    struct dp_trainer *t = w->t;
    if (t->tp <= 1) return DP_OK;
    /* (a group's ranks are threads of one process: T divides each process's workers) */
    const int q = w->grank / t->tp, r = w->grank % t->tp;
    if (t->pp <= 1) lp->rank = q, lp->world = t->G / t->tp; /* (the group's shared share; a pipeline's: its replica's) */
    w->tp = (struct dp_tp){.rank = r, .size = t->tp, .allreduce = tp_allreduce, .arg = w};
    return dp_comm_thread_init(&w->tp_comm, t->tp_worlds[w->rank / t->tp], r);
}

void dp__tp_worker_free(struct worker *w) {
    dp_comm_free(w->tp_comm);
    w->tp_comm = NULL;
}

void dp__tp_abort(struct dp_trainer *t, const char *msg) {
    for (int r = 0; t->w && r < t->P; r++)
        if (t->w[r].tp_comm) dp_comm_abort(t->w[r].tp_comm, msg);
}

/* A failed pass: its group's other ranks may wait for it in a sum inside their pass, and this
 * rank is about to take part in the job's reduction (dp_sync_micro_end), where they would be
 * awaited: so the group's world is aborted now, and their passes fail at once. */
void dp__tp_failed(struct worker *w, int rc) {
    if (!w->tp_comm || rc == DP_ECANCELED) return;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", dp_errmsg());
    (void)dp_comm_abort(w->tp_comm, msg);
    dp_seterr(rc, "%s", msg); /* (the abort sets its own) */
}

/* A range of the gradient finished by backward: on ranks other than 0 its replicated parts
 * are zeroed (rank 0's stand for the group), then it goes on to the reduction. */
static void tp_grad_ready(void *arg, int64_t off, int64_t count) {
    const struct dp__tp_hook *h = arg;
    struct worker *w = h->w;
    const struct dp_trainer *t = w->t;
    for (int i = 0; w->tp.rank && i < t->tp_nrep; i++) {
        int64_t a = t->tp_rep[2 * i], b = a + t->tp_rep[2 * i + 1];
        a = a > off ? a : off, b = b < off + count ? b : off + count;
        if (a < b) memset(w->rep.grads + a, 0, sizeof(float) * (size_t)(b - a));
    }
    if (h->ready) h->ready(h->arg, off, count);
}

void dp__tp_begin(struct worker *w, struct dp_pass *pass, struct dp__tp_hook *h) {
    if (!w->tp_comm) return;
    pass->tp = &w->tp;
    *h = (struct dp__tp_hook){w, pass->grad_ready, pass->grad_ready_arg};
    pass->grad_ready = tp_grad_ready, pass->grad_ready_arg = h;
}
