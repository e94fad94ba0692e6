/* The loader: sampler (epoch permutation, global batches, split by rank),
 * batch assembly (gather + augmentation) and a prefetch thread.
 *
 * Vocabulary.  A *position* counts global batches from the start of training:
 * pos = epoch * steps_per_epoch + step.  Global batch `step` of an epoch
 * covers permutation entries [step * batch, min((step + 1) * batch, n)); its
 * size G is `batch` except maybe for the last one.  Rank r of `world` takes a
 * contiguous part of it:
 *
 *     base = G / world, rem = G % world
 *     size(r)  = base + (r < rem)
 *     start(r) = r * base + min(r, rem)
 *
 *     G = 10, world = 3:   rank 0: [0, 4)   rank 1: [4, 7)   rank 2: [7, 10)
 *
 * so the ranks' parts, concatenated in rank order, are exactly the global
 * batch; a rank may get 0 samples when G < world.  With --balance the
 * trainer replaces the equal split by per-rank shares (dp_loader_set_shares,
 * dp_loader_split): still contiguous parts in rank order.  The permutation is
 * dp_rng_permutation(seed, DP_RNG_SHUFFLE, epoch) (identity without shuffle),
 * so every rank derives the same global batches without communicating.
 *
 * Text.  A text loader (dp_loader_init_text) has no dataset: its "samples"
 * are the windows of an epoch, numbered 0 .. windows-1, and window i of
 * epoch e is drawn by dp_text_window_start(seed, e, i, ...).  No permutation
 * is needed (the draw is already random), and the rank's part of a global
 * batch is the same contiguous range of window indices as above, filled by
 * dp_text_fill_train: which rank fills a window never changes the window.
 *
 * Threading.  Batches are numbered k = 0, 1, ... since the last (re)start at
 * position start_pos, and batch k lives in ring slot k % nslots.  Three
 * counters, all guarded by `mu`:
 *
 *     produced  batches the producer has finished (slots < produced are ready)
 *     consumed  batches handed to the consumer by dp_loader_next
 *     released  batches the consumer is done with (= consumed, or consumed - 1
 *               while it still holds the last one returned)
 *
 * The producer may fill batch k only when k - released < nslots, i.e. when
 * the slot's previous occupant has been released.  With nslots = prefetch + 1
 * that keeps `prefetch` batches ready while the consumer works on one.  Slot
 * contents are written without the lock (only the producer touches an
 * unpublished slot) and published by incrementing `produced` under it.
 * Shutdown sets `stop` under the lock and broadcasts; the producer checks it
 * before every batch, so joining it takes at most one batch assembly.
 */
#include <pthread.h>
#include <string.h>

#include "core/core_impl.h"
#include "dp/core.h"
#include "dp/data.h"

struct slot {
    struct dp_loader_batch b;
};

struct dp_loader {
    const struct dp_dataset *ds; /* borrowed; must outlive the loader (NULL: text) */
    const struct dp_tokens *tok; /* text: borrowed tokens, split and window length */
    const struct dp_text_split *split;
    int64_t ctx;
    struct dp_loader_params p;
    int64_t n;               /* samples in the dataset */
    int64_t sample;          /* floats per sample: C * H * W */
    int64_t steps_per_epoch;
    int64_t max_B;           /* largest part any rank can get: ceil(batch / world), or with
                                uneven the whole batch (in whole align units) */
    int64_t *shares;         /* (world) units per rank of a full batch (dp_loader_set_shares),
                                NULL: the equal split; read by the filler, changed only while
                                no producer runs */

    /* Filler state: touched only by whoever assembles batches (the producer
     * thread while it runs, otherwise the consumer). */
    int64_t *perm;           /* (n) permutation of the current epoch */
    float *scratch;          /* (sample) one converted sample, for augmentation of a mapped source */
    int64_t perm_epoch;      /* epoch perm holds, -1 if none */

    int nslots;
    struct slot *slots;      /* (nslots) */

    /* Consumer state (the thread calling next/seek/free). */
    int64_t start_pos;       /* position of batch k = 0 */
    double wait_s;
    int async;               /* a producer thread is running */

    pthread_mutex_t mu;
    pthread_cond_t ready;    /* produced grew, signalled to the consumer */
    pthread_cond_t space;    /* released grew or stop set, to the producer */
    int64_t produced, consumed, released; /* guarded by mu */
    int stop;                             /* guarded by mu */
    pthread_t thread;
};

/* ---- parameters ------------------------------------------------------------ */

/* Batch 64, shuffled with seed 0, last batch kept, no augmentation, two
 * batches prefetched, one worker. */
struct dp_loader_params dp_loader_default_params(void) {
    return (struct dp_loader_params){
        .batch = 64, .shuffle = 1, .seed = 0, .drop_last = 0, .aug = {0, 0},
        .prefetch = 2, .rank = 0, .world = 1,
    };
}

/* ---- the split of a global batch ------------------------------------------------ */

/* Rank `rank`'s part [*off, *off + *B) of a global batch of G samples (G <=
 * batch), in units of `align` samples (align <= 1: samples; the last unit of
 * a batch may be short).  shares NULL: the equal split of the header comment
 * (remainder units to the first ranks).  Otherwise shares[r] units of a full
 * batch go to rank r (they sum to U = ceil(batch / align)); a shorter batch of
 * u < U units is split at the scaled boundaries floor(cum[r] * u / U), where
 * cum[r] is the sum of the shares of the ranks before r: integer arithmetic,
 * the same on every rank, the parts still contiguous and concatenating to
 * the batch, and exactly the shares when u = U. */
void dp_loader_split(int64_t G, int64_t batch, int64_t align, int world, int rank, const int64_t *shares,
                     int64_t *off, int64_t *B) {
    int64_t a = align > 1 ? align : 1, units = (G + a - 1) / a, u0, u1;
    if (!shares) {
        int64_t base = units / world, rem = units % world;
        u0 = rank * base + (rank < rem ? rank : rem), u1 = u0 + base + (rank < rem);
    } else {
        int64_t U = (batch + a - 1) / a, cum = 0;
        for (int r = 0; r < rank; r++) cum += shares[r];
        u0 = cum * units / U;
        u1 = (cum + shares[rank]) * units / U;
    }
    *off = u0 * a;
    *B = (u1 * a < G ? u1 * a : G) - u0 * a;
    if (*B < 0) *B = 0;
}

/* ---- batch assembly ---------------------------------------------------------- */

/* Fills slot s with the rank's part of the global batch at position pos.
 * Cannot fail: every buffer was allocated by dp_loader_init. */
static void fill_batch(struct dp_loader *l, struct slot *s, int64_t pos) {
    const struct dp_loader_params *p = &l->p;
    int64_t epoch = pos / l->steps_per_epoch, step = pos % l->steps_per_epoch;
    if (p->shuffle && l->perm && l->perm_epoch != epoch) {
        dp_rng_permutation(p->seed, DP_RNG_SHUFFLE, (uint64_t)epoch, l->perm, l->n);
        l->perm_epoch = epoch;
    }
    int64_t g0 = step * p->batch;
    int64_t G = l->n - g0 < p->batch ? l->n - g0 : p->batch;
    /* Split in units of `align` samples (align = 1: samples), so that with
     * align > 1 every rank's part is made of whole fixed-size chunks. */
    int64_t off, B;
    dp_loader_split(G, p->batch, p->align, p->world, p->rank, l->shares, &off, &B);
    off += g0;

    struct dp_loader_batch *b = &s->b;
    if (l->tok) {
        /* Cannot fail: the arguments were checked by dp_loader_init_text
         * (off + B <= n, train_n >= ctx + 1). */
        (void)dp_text_fill_train(l->tok, l->split, l->ctx, p->seed, epoch, off, B, b->tokens, b->y);
        for (int64_t i = 0; i < B; i++) b->idx[i] = off + i;
        b->B = B;
        b->global_B = G;
        b->epoch = epoch;
        b->step_in_epoch = step;
        return;
    }
    int augment = p->aug.crop_pad > 0 || p->aug.hflip;
    const struct dp_dataset *ds = l->ds;
    const int64_t K = ds->num_classes;
    for (int64_t i = 0; i < B; i++) {
        int64_t idx = l->perm[off + i];
        float *dst = b->x + i * l->sample;
        if (augment) {
            /* in memory: augment from the sample itself; mapped: from its converted copy */
            const float *src = ds->x && !ds->src ? ds->x + idx * l->sample : l->scratch;
            if (src == l->scratch) dp_dataset_read(ds, idx, l->scratch);
            dp_augment_sample(dst, src, ds->C, ds->H, ds->W, &p->aug, p->seed, idx, epoch);
        } else {
            dp_dataset_read(ds, idx, dst);
        }
        if (ds->y) b->y[i] = ds->y[idx];
        if (ds->target) memcpy(b->target + i * K, ds->target + idx * K, sizeof(float) * (size_t)K);
        b->idx[i] = idx;
    }
    b->B = B;
    b->global_B = G;
    b->epoch = epoch;
    b->step_in_epoch = step;
}

/* ---- the producer thread ------------------------------------------------------ */

static void *producer_main(void *arg) {
    struct dp_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->stop && l->produced - l->released >= l->nslots)
            pthread_cond_wait(&l->space, &l->mu);
        if (l->stop) break;
        int64_t k = l->produced;
        /* Slot k % nslots is free (its previous batch was released) and the
         * consumer will not read it before `produced` passes k. */
        pthread_mutex_unlock(&l->mu);
        fill_batch(l, &l->slots[k % l->nslots], l->start_pos + k);
        pthread_mutex_lock(&l->mu);
        l->produced = k + 1;
        pthread_cond_signal(&l->ready);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* Stops and joins the producer, if any.  Returns promptly: the producer is
 * either waiting for space (woken by the broadcast) or finishing one batch. */
static void producer_stop(struct dp_loader *l) {
    if (!l->async) return;
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_broadcast(&l->space);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    l->async = 0;
}

/* Resets the counters to start at position pos and, with prefetch > 0,
 * starts a producer.  The producer must not be running. */
static int producer_start(struct dp_loader *l, int64_t pos) {
    l->start_pos = pos;
    /* No other thread exists here, but take the lock anyway so the counters
     * are only ever touched under it. */
    pthread_mutex_lock(&l->mu);
    l->produced = l->consumed = l->released = 0;
    l->stop = 0;
    pthread_mutex_unlock(&l->mu);
    if (l->p.prefetch == 0) return 0;
    if (dp__thread_start(&l->thread, "dp-loader", producer_main, l) != 0)
        return dp_seterr(DP_EINTERNAL, "loader: cannot start the prefetch thread");
    l->async = 1;
    return 0;
}

/* ---- public API ----------------------------------------------------------- */

static void loader_release(struct dp_loader *l) {
    if (l->slots) {
        for (int i = 0; i < l->nslots; i++) {
            dp_free(l->slots[i].b.x);
            dp_free(l->slots[i].b.tokens);
            dp_free(l->slots[i].b.y);
            dp_free(l->slots[i].b.idx);
            dp_free(l->slots[i].b.target);
        }
    }
    dp_free(l->slots);
    dp_free(l->perm);
    dp_free(l->scratch);
    dp_free(l->shares);
    pthread_cond_destroy(&l->ready);
    pthread_cond_destroy(&l->space);
    pthread_mutex_destroy(&l->mu);
    dp_free(l);
}

/* The checks and the setup common to both kinds of loader: n samples of
 * `sample` floats (image) or `ctx` token ids (text) each. */
static int loader_check(const struct dp_loader_params *p, int64_t n) {
    if (p->batch < 1) return dp_seterr(DP_EINVAL, "loader: batch %lld < 1", (long long)p->batch);
    if (p->world < 1 || p->rank < 0 || p->rank >= p->world)
        return dp_seterr(DP_EINVAL, "loader: rank %d not in [0, world = %d)", p->rank, p->world);
    if (p->prefetch < 0 || p->prefetch > 1024)
        return dp_seterr(DP_EINVAL, "loader: prefetch %d not in [0, 1024]", p->prefetch);
    if (p->aug.crop_pad < 0)
        return dp_seterr(DP_EINVAL, "loader: crop_pad %d < 0", p->aug.crop_pad);
    if (p->drop_last && n < p->batch)
        return dp_seterr(DP_EINVAL, "loader: drop_last with %lld samples and batch %lld leaves no batch",
                         (long long)n, (long long)p->batch);
    return DP_OK;
}

/* Allocates the loader for n samples; text: ctx > 0 (token buffers instead
 * of float ones, no permutation).  Does not start the producer. */
static struct dp_loader *loader_alloc(const struct dp_loader_params *p, int64_t n, int64_t sample, int64_t ctx) {
    struct dp_loader *l = dp_calloc(1, sizeof *l);
    if (!l) return NULL;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->ready, NULL);
    pthread_cond_init(&l->space, NULL);
    l->p = *p;
    l->n = n;
    l->sample = sample;
    l->ctx = ctx;
    l->steps_per_epoch = p->drop_last ? n / p->batch : (n + p->batch - 1) / p->batch;
    int64_t bmax = p->batch < n ? p->batch : n;
    int64_t al = p->align > 1 ? p->align : 1;
    l->max_B = ((bmax + al - 1) / al + p->world - 1) / p->world * al;
    if (p->uneven) l->max_B = (bmax + al - 1) / al * al; /* any share, up to the whole batch */
    l->perm_epoch = -1;
    l->nslots = p->prefetch + 1;
    l->slots = dp_calloc((size_t)l->nslots, sizeof(struct slot));
    if (!l->slots) goto nomem;
    if (!ctx) {
        l->perm = dp_malloc((size_t)l->n * sizeof(int64_t));
        if (!l->perm) goto nomem;
        for (int64_t i = 0; i < l->n; i++) l->perm[i] = i; /* stays so without shuffle */
    }
    for (int i = 0; i < l->nslots; i++) {
        struct dp_loader_batch *b = &l->slots[i].b;
        /* Batch buffers are reused every step: fault them in now (big). */
        if (ctx) {
            b->tokens = dp_malloc_big((size_t)(l->max_B * ctx) * sizeof(int32_t));
            b->y = dp_malloc_big((size_t)(l->max_B * ctx) * sizeof(int32_t));
        } else {
            b->x = dp_malloc_big((size_t)(l->max_B * l->sample) * sizeof(float));
            b->y = dp_malloc((size_t)l->max_B * sizeof(int32_t));
        }
        b->idx = dp_malloc((size_t)l->max_B * sizeof(int64_t));
        if ((ctx ? !b->tokens : !b->x) || !b->y || !b->idx) goto nomem;
    }
    return l;
nomem:
    loader_release(l);
    return NULL;
}

static int loader_start(struct dp_loader *l, struct dp_loader **out) {
    int rc = producer_start(l, 0);
    if (rc) {
        loader_release(l);
        return rc;
    }
    *out = l;
    return 0;
}

/* Creates a loader over ds (borrowed: it must stay alive and unchanged until
 * dp_loader_free) positioned at epoch 0, step 0, and starts prefetching.
 * Errors: DP_EINVAL for bad parameters (batch < 1, rank not in [0, world),
 * prefetch < 0, crop_pad < 0, an empty dataset, or drop_last with fewer
 * samples than one batch), DP_ENOMEM, DP_EINTERNAL if the thread cannot
 * start.  On failure *out is NULL. */
int dp_loader_init(struct dp_loader **out, const struct dp_dataset *ds,
                   const struct dp_loader_params *p) {
    *out = NULL;
    if (!ds || !p) return dp_seterr(DP_EINVAL, "loader: NULL dataset or parameters");
    if (ds->n < 1 || !(ds->x || ds->src) || !(ds->y || ds->target))
        return dp_seterr(DP_EINVAL, "loader: the dataset is empty");
    int rc = loader_check(p, ds->n);
    if (rc) return rc;
    struct dp_loader *l = loader_alloc(p, ds->n, ds->C * ds->H * ds->W, 0);
    if (!l) return dp_seterr(DP_ENOMEM, "loader: cannot allocate batch buffers");
    l->ds = ds;
    int nomem = !(l->scratch = dp_malloc(sizeof(float) * (size_t)l->sample));
    for (int i = 0; ds->target && i < l->nslots; i++)
        nomem |= !(l->slots[i].b.target = dp_malloc(sizeof(float) * (size_t)(l->max_B * ds->num_classes)));
    if (nomem) {
        loader_release(l);
        return dp_seterr(DP_ENOMEM, "loader: cannot allocate batch buffers");
    }
    return loader_start(l, out);
}

int dp_loader_init_text(struct dp_loader **out, const struct dp_tokens *t, const struct dp_text_split *s,
                        int64_t ctx, int64_t windows, const struct dp_loader_params *p) {
    *out = NULL;
    if (!t || !s || !p || !t->tok) return dp_seterr(DP_EINVAL, "loader: NULL tokens, split or parameters");
    if (ctx < 1 || windows < 1)
        return dp_seterr(DP_EINVAL, "loader: ctx %lld, %lld windows per epoch", (long long)ctx, (long long)windows);
    if (s->train_n < ctx + 1 || s->train_n + s->val_n > t->n)
        return dp_seterr(DP_EINVAL, "loader: the training part holds %lld tokens, a window needs ctx + 1 = %lld",
                         (long long)s->train_n, (long long)(ctx + 1));
    int rc = loader_check(p, windows);
    if (rc) return rc;
    struct dp_loader *l = loader_alloc(p, windows, 0, ctx);
    if (!l) return dp_seterr(DP_ENOMEM, "loader: cannot allocate batch buffers");
    l->tok = t;
    l->split = s;
    return loader_start(l, out);
}

/* Global batches per epoch: ceil(n / batch), or floor(n / batch) with
 * drop_last.  The same on every rank. */
int64_t dp_loader_steps_per_epoch(const struct dp_loader *l) { return l->steps_per_epoch; }

/* Positions the loader so that the next dp_loader_next returns step `step`
 * of epoch `epoch` (a step >= steps_per_epoch carries into later epochs).
 * Batches prefetched for the old position are discarded; the batch returned
 * last becomes invalid.  Errors: DP_EINVAL for negative arguments,
 * DP_EINTERNAL if the prefetch thread cannot restart (the loader then stays
 * usable and works synchronously). */
int dp_loader_seek(struct dp_loader *l, int64_t epoch, int64_t step) {
    if (epoch < 0 || step < 0)
        return dp_seterr(DP_EINVAL, "loader: cannot seek to epoch %lld, step %lld",
                         (long long)epoch, (long long)step);
    producer_stop(l);
    int rc = producer_start(l, epoch * l->steps_per_epoch + step);
    if (rc) l->p.prefetch = 0; /* fall back to assembling in dp_loader_next */
    return rc;
}

/* Sets the split of the global batches (dp_loader_split): shares[r] units of
 * `align` samples of a full batch for rank r, summing to ceil(batch / align),
 * or NULL for the equal split.  Needs a loader made with p->uneven (its
 * buffers hold any share).  It applies from the next batch dp_loader_next
 * returns: batches prefetched with the old split are discarded and the
 * producer restarts at the same position (as dp_loader_seek does); the batch
 * returned last becomes invalid.  Errors: DP_EINVAL (not uneven, a negative
 * share, a wrong sum), DP_ENOMEM, DP_EINTERNAL as for dp_loader_seek. */
int dp_loader_set_shares(struct dp_loader *l, const int64_t *shares) {
    const struct dp_loader_params *p = &l->p;
    int64_t a = p->align > 1 ? p->align : 1, U = (p->batch + a - 1) / a, sum = 0;
    if (shares && !p->uneven) return dp_seterr(DP_EINVAL, "loader: shares need a loader made with uneven = 1");
    for (int r = 0; shares && r < p->world; r++) {
        if (shares[r] < 0) return dp_seterr(DP_EINVAL, "loader: share %lld of rank %d < 0", (long long)shares[r], r);
        sum += shares[r];
    }
    if (shares && sum != U)
        return dp_seterr(DP_EINVAL, "loader: the shares sum to %lld units, a batch has %lld", (long long)sum,
                         (long long)U);
    /* The producer reads l->shares (the pointer and the array): both change
     * only after it has stopped. */
    int64_t *sh = NULL;
    if (shares && !(sh = dp_malloc(sizeof(int64_t) * (size_t)p->world)))
        return dp_seterr(DP_ENOMEM, "loader: out of memory");
    if (sh) memcpy(sh, shares, sizeof(int64_t) * (size_t)p->world);
    int64_t pos;
    pthread_mutex_lock(&l->mu);
    pos = l->start_pos + l->consumed; /* the next batch to hand out */
    pthread_mutex_unlock(&l->mu);
    producer_stop(l);
    dp_free(l->shares);
    l->shares = sh;
    int rc = producer_start(l, pos);
    if (rc) l->p.prefetch = 0; /* as in dp_loader_seek: work synchronously */
    return rc;
}

/* Returns in *b the rank's part of the next global batch, in order, epoch
 * after epoch without end.  The batch and its buffers belong to the loader
 * and stay valid until the next call to dp_loader_next, dp_loader_seek or
 * dp_loader_free.  Time spent here waiting for the batch is added to
 * dp_loader_wait_time.  Never fails once the loader is initialised. */
int dp_loader_next(struct dp_loader *l, const struct dp_loader_batch **b) {
    if (!l->async) {
        /* Synchronous: the whole assembly is time the consumer waits. */
        double t0 = dp_time();
        struct slot *s = &l->slots[0];
        fill_batch(l, s, l->start_pos + l->consumed);
        l->consumed++; /* no other thread: counters need no lock here */
        l->released = l->consumed;
        l->wait_s += dp_time() - t0;
        *b = &s->b;
        return 0;
    }
    pthread_mutex_lock(&l->mu);
    /* The batch returned by the previous call is no longer in use. */
    l->released = l->consumed;
    pthread_cond_signal(&l->space);
    if (l->produced <= l->consumed) {
        double t0 = dp_time();
        while (l->produced <= l->consumed) pthread_cond_wait(&l->ready, &l->mu);
        l->wait_s += dp_time() - t0;
    }
    int64_t k = l->consumed++;
    pthread_mutex_unlock(&l->mu);
    *b = &l->slots[k % l->nslots].b;
    return 0;
}

/* Seconds the consumer has spent waiting inside dp_loader_next (including,
 * with prefetch = 0, the time to assemble each batch). */
double dp_loader_wait_time(const struct dp_loader *l) { return l->wait_s; }

/* Stops the prefetch thread (at most one batch assembly later) and frees
 * everything.  NULL is a no-op.  Batches returned earlier become invalid. */
void dp_loader_free(struct dp_loader *l) {
    if (!l) return;
    producer_stop(l);
    loader_release(l);
}
