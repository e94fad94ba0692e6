/* Evaluation on the test split (or a token file's validation windows), shared
 * by the workers in chunks and summed in a fixed order. */
#include "trainer.h"

/* ---- evaluation ----------------------------------------------------------------------------
 * The test set (or, for text, the validation windows) is cut into chunks of
 * t->eval_chunk samples (every replica's arena holds at least that many, see
 * max_batch).  Chunk c's correct count and loss sum go to slot[2c],
 * slot[2c + 1]; the totals are the slots summed in chunk order.  The chunks
 * do not depend on the worker count, so the result is the same bits whoever
 * evaluates which chunk. */

/* Samples evaluated: the first `limit` (0 = all) of ds, or with ds NULL of
 * the text validation windows. */
static int64_t eval_count(const struct dp_trainer *t, const struct dp_dataset *ds, int64_t limit) {
    int64_t n = ds ? ds->n : dp_text_val_windows(&t->split, t->ctx);
    return limit > 0 && limit < n ? limit : n;
}

/* Chunk c's samples of the first n of ds (NULL: the text validation windows, filled into w's
 * scratch) as a batch; a chunk past the end is an empty one that reads from valid pointers. */
int dp__eval_batch(const struct dp_trainer *t, struct worker *w, const struct dp_dataset *ds, int64_t n, int64_t c,
                   struct dp_batch *b) {
    const int64_t E = t->eval_chunk;
    int64_t i = c * E, B = n - i < E ? n - i : E;
    *b = (struct dp_batch){.B = B > 0 ? B : 0};
    if (B <= 0) i = 0;
    if (ds) {
        const int64_t per = ds->C * ds->H * ds->W;
        if (ds->src) { /* a mapped source: its samples converted into the worker's chunk */
            for (int64_t k = 0; k < B; k++) dp_dataset_read(ds, i + k, w->ex + k * per);
            b->x = w->ex;
        } else {
            b->x = ds->x + i * per;
        }
        if (ds->y) b->targets = ds->y + i;
        if (ds->target) b->target = ds->target + i * ds->num_classes;
        return DP_OK;
    }
    int rc = B > 0 ? dp_text_fill_val(&t->tokens, &t->split, t->ctx, i, B, w->etok, w->etgt) : DP_OK;
    if (rc) return dp_adderr(rc, "evaluate");
    b->tokens = w->etok, b->targets = w->etgt;
    return DP_OK;
}

/* Chunk c's result, from its pass: the correct count (a regression's: its absolute errors, the
 * MAE's numerator) and the loss sum. */
void dp__eval_record(const struct dp_trainer *t, const struct dp_pass *pass, int64_t B, int64_t c, double *slot) {
    if (B <= 0) return;
    slot[2 * c] = t->model->loss == DP_LOSS_MSE ? pass->abs_sum : (double)pass->correct;
    slot[2 * c + 1] = pass->loss_sum;
}

/* Evaluates chunks [c0, c1) of the first n samples of ds on replica w->rep
 * (ds NULL: the text validation windows, filled into w's scratch). */
/* gather: ZeRO 3 (sharded), the layers' ranges gathered as in training
 * (collective: evaluate_shared); a chunk past the end is then an empty pass
 * that takes part in the gathers. */
static int eval_chunks(struct dp_trainer *t, struct worker *w, const struct dp_dataset *ds, int64_t n,
                       int64_t c0, int64_t c1, double *slot, int gather) {
    for (int64_t c = c0; c < c1; c++) {
        struct dp_batch b;
        int rc = dp__eval_batch(t, w, ds, n, c, &b);
        if (rc) return rc;
        struct dp_pass pass = {.training = 0, .seed = t->p.run.seed};
        if (gather) dp_sync_eval_hooks(&w->sync, &pass);
        rc = dp_model_run(t->model, &w->rep, &b, &pass);
        if (rc) return dp_adderr(rc, "evaluate");
        dp__eval_record(t, &pass, b.B, c, slot);
    }
    return DP_OK;
}

/* Accuracy and loss per term: n samples of t->pos terms each. */
static void eval_totals(const struct dp_trainer *t, const double *slot, int64_t nchunks, int64_t n,
                        double *acc, double *loss) {
    double correct = 0, loss_sum = 0;
    for (int64_t c = 0; c < nchunks; c++) correct += slot[2 * c], loss_sum += slot[2 * c + 1];
    double terms = (double)n * (double)t->pos;
    *acc = n ? correct / terms : NAN;
    *loss = n ? loss_sum / terms : NAN;
}

double dp_trainer_bits_per_byte(const struct dp_trainer *t, double loss, int64_t limit) {
    if (!t->text || isnan(loss)) return NAN;
    const int64_t n = eval_count(t, NULL, limit), T = t->ctx;
    double bytes = 0;
    /* window k's targets are the validation tokens train_n + k T + 1 .. train_n + (k + 1) T */
    for (int64_t k = 0; k < n; k++)
        for (int64_t j = 1; j <= T; j++) {
            uint16_t tok = t->tokens.tok[t->split.train_n + k * T + j];
            bytes += t->tok_len ? t->tok_len[tok] : 1;
        }
    return bytes > 0 ? loss * (double)(n * T) / bytes / M_LN2 : NAN;
}

/* Evaluation runs on rank 0's replica (all replicas are equal). */
int dp_trainer_evaluate(struct dp_trainer *t, const struct dp_dataset *ds, int64_t limit,
                        double *acc, double *loss) {
    if (!ds && !t->text) return dp_seterr(DP_EINVAL, "evaluate: no data set (only a text model has its own)");
    if (ds && t->text) return dp_seterr(DP_EINVAL, "evaluate: a text model evaluates its validation windows (ds NULL)");
    int64_t n = eval_count(t, ds, limit), nchunks = (n + t->eval_chunk - 1) / t->eval_chunk;
    if (ds && (ds->C != t->train.C || ds->H != t->train.H || ds->W != t->train.W))
        return dp_seterr(DP_EMISMATCH, "evaluate: samples of %lld x %lld x %lld, the model's are %lld x %lld x %lld",
                         (long long)ds->C, (long long)ds->H, (long long)ds->W, (long long)t->train.C,
                         (long long)t->train.H, (long long)t->train.W);
    struct worker *w = &t->w[0];
    /* a mapped set other than the run's test set: its chunk's samples need a buffer of their own */
    float *ex = w->ex, *own = NULL;
    if (ds && ds->src && !w->ex) {
        if (!(own = dp_malloc_big(sizeof(float) * (size_t)(t->eval_chunk * ds->C * ds->H * ds->W))))
            return dp_seterr(DP_ENOMEM, "evaluate: out of memory");
        w->ex = own;
    }
    double *slot = dp_calloc((size_t)(2 * nchunks + 1), sizeof(double));
    int rc = slot ? eval_chunks(t, w, ds, n, 0, nchunks, slot, 0) : dp_seterr(DP_ENOMEM, "evaluate: out of memory");
    if (!rc) eval_totals(t, slot, nchunks, n, acc, loss);
    dp_free(slot);
    w->ex = ex;
    dp_free(own);
    return rc;
}

/* A replica's share of evaluate_shared's chunks: this process's block [c0, c0 + len), claimed
 * one at a time by its workers, or with ZeRO 3 every G-th chunk (below). */
static int eval_replicas(struct worker *w, const struct dp_dataset *ds, int64_t n, int64_t nchunks, int64_t c0,
                         int64_t len, double *slot) {
    struct dp_trainer *t = w->t;
    int rc = dp_sync_settle(&w->sync); /* ZeRO 1: the last step's all-gather, left in flight */
    if (dp_sync_sharded_params(&w->sync)) {
        /* ZeRO 3: each pass gathers the layers' ranges in turn (collectives),
         * so every rank runs as many passes: chunk c is rank c mod G's, and a
         * rank short of a chunk in the last round runs an empty one.  No
         * whole replica is built; the totals are the same bits. */
        for (int64_t c = w->grank; !rc && c - w->grank < nchunks; c += t->G)
            rc = eval_chunks(t, w, ds, n, c, c + 1, slot, 1);
        int rr = dp_sync_release(&w->sync);
        if (!rc) rc = rr;
    } else
        for (int64_t k; !rc && (k = atomic_fetch_add(&t->eval_next, 1)) < len;)
            rc = eval_chunks(t, w, ds, n, c0 + k, c0 + k + 1, slot, 0);
    return rc;
}

/* The end-of-epoch evaluation, on every rank of the job at once (all
 * replicas are equal).  Each process takes its block of the chunks
 * (dp_comm_split over the processes), and its worker threads claim the
 * block's chunks one at a time from a shared counter, so a worker that
 * gets less CPU simply evaluates fewer chunks.  One all-reduce gathers the
 * slots: each slot has one nonzero contributor and x + 0 = x exactly, so
 * the totals are the bits dp_trainer_evaluate computes alone, whoever
 * evaluated which chunk.
 *
 * Sharing the work matters beyond speed: with rank 0 evaluating alone, the
 * others waited in a collective for the whole evaluation, and
 * --comm-timeout (meant for a stalled peer) fired whenever evaluation took
 * longer than the timeout.  Now the ranks of a process reach the
 * all-reduce within about one chunk of each other, and processes compute
 * equal blocks, as in a training step.
 *
 * The counter: every local worker has finished claiming once it enters the
 * all-reduce, so when local rank 0 leaves it no claim is in flight; it
 * resets the counter then, before the end-of-epoch barrier that every local
 * worker passes before the next evaluation. */
int dp__evaluate_shared(struct worker *w, double *acc, double *loss) {
    struct dp_trainer *t = w->t;
    const struct dp_dataset *ds = t->text ? NULL : &t->test;
    int64_t n = eval_count(t, ds, t->p.data.test_limit), nchunks = (n + t->eval_chunk - 1) / t->eval_chunk;
    int64_t c0, len;
    dp_comm_split(nchunks, t->G / t->P, t->base / t->P, &c0, &len);
    double *slot = dp_calloc((size_t)(2 * nchunks + 1), sizeof(double));
    if (!slot) return dp_seterr(DP_ENOMEM, "evaluate: out of memory");
    /* (a pipeline: each stage its own layers, pipe_step.c; no whole replica anywhere) */
    int rc = w->pipe ? dp__pipe_evaluate(w, ds, n, nchunks, slot) : eval_replicas(w, ds, n, nchunks, c0, len, slot);
    if (!rc && t->G > 1 && nchunks > 0) rc = dp_comm_allreduce(w->comm, slot, 2 * nchunks, DP_DTYPE_F64, DP_ALGO_AUTO);
    if (w->rank == 0) atomic_store(&t->eval_next, 0);
    if (!rc) eval_totals(t, slot, nchunks, n, acc, loss);
    dp_free(slot);
    return rc;
}
