/* conv2d through oneDNN's direct convolution kernels in their blocked layout (nChw16c and
 * its weight forms), for the layers where they beat im2col + GEMM: C >= 16 input channels
 * (bench/conv_layers.sh measures each layer, the reorders included).  The layer keeps
 * dptrain's NCHW tensors; each call reorders in and out around the library's kernels.
 *
 * The batch is cut into groups of GROUP samples (the last one shorter), a cut that depends on
 * B alone.  Every primitive runs on one thread, one group at a time, and the threads share
 * out the groups, so no result depends on the thread count:
 *   forward:   y[g] = conv(x[g], W) + b          (the fused ReLU after, as dp__relu)
 *   backward:  dW  += sum_g dW_g,  dW_g = corr(dY'[g], x[g])   (partials added in group order)
 *              db  += sum_g sum dY'[g]            (double, per group, added in order)
 *              dx[g] = conv^T(dY'[g], W)
 * with dY' = dy [y > 0] when the ReLU is fused.  A sample's y and dx depend on its group's
 * size only through the primitive chosen for that size.
 *
 * Primitives are created per group size and kept in the layer (a few sizes per run: the
 * group, the remainders of the training and evaluation batches), under a mutex, since the
 * workers share the layer.  They run with a user scratchpad from the caller's arena, which
 * is what lets two workers execute one primitive at once. */
#include <pthread.h>
#include <string.h>

#include "nn/layers_impl.h"

#ifdef DP_WITH_DNNL
#include <dnnl.h>

#define GROUP 16 /* samples per primitive call: at 16, 62-70% of the peak (bench/conv_layers) */
#define NSIZES 8 /* group sizes kept per layer */

/* The arguments a layer call moves between dptrain's layout and the primitives'. */
enum { R_SRC_F, R_WTS_F, R_DST_F, R_DDST_D, R_WTS_D, R_DSRC_D, R_SRC_W, R_DDST_W, R_DWTS_W, NR };

/* One group size's primitives: forward, backward-data, backward-weights, and the reorders
 * to and from the plain layouts (NULL where the primitive takes the plain layout itself). */
struct csize {
    int64_t n;
    dnnl_primitive_t fwd, bwd_d, bwd_w, r[NR];
    dnnl_memory_desc_t md[NR]; /* the primitive's side of each reorder */
    size_t bytes[NR];          /* its size (0 where there is no reorder) */
    size_t scratch;            /* the largest scratchpad of the primitives */
    int same_ddst;             /* both backward primitives take dY' in one layout */
    dnnl_memory_desc_t bias;   /* forward's bias argument (its second weights) */
};

struct dp__conv_dnnl {
    pthread_mutex_t mu;
    int nsizes;
    struct csize sz[NSIZES];
};

static dnnl_engine_t engine;
static pthread_once_t engine_once = PTHREAD_ONCE_INIT;
static void engine_make(void) {
    if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) engine = NULL;
}

static int dnnl_fail(dnnl_status_t st, const char *what) {
    return dp_seterr(DP_EINTERNAL,
                     "conv2d: oneDNN %s failed (status %d); --gemm blas or --gemm ref runs the convolutions "
                     "as im2col + GEMM instead",
                     what, (int)st);
}
#define CK(call, what)                                                                             \
    do {                                                                                           \
        dnnl_status_t st_ = (call);                                                                \
        if (st_ != dnnl_success) return dnnl_fail(st_, what);                                      \
    } while (0)

static size_t scratch_of(const_dnnl_primitive_desc_t pd) {
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    return md ? dnnl_memory_desc_get_size(md) : 0;
}

/* A primitive from pd (kept) and its scratchpad size into *scratch (the largest so far). */
static int prim_of(dnnl_primitive_t *out, const_dnnl_primitive_desc_t pd, size_t *scratch) {
    size_t s = scratch_of(pd);
    if (s > *scratch) *scratch = s;
    CK(dnnl_primitive_create(out, pd), "primitive creation");
    return DP_OK;
}

/* The reorder from `from` to `to`, or none (*out NULL) when they are the same layout. */
static int reorder_of(dnnl_primitive_t *out, const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to,
                      const_dnnl_primitive_attr_t attr, size_t *scratch) {
    *out = NULL;
    if (dnnl_memory_desc_equal(from, to)) return DP_OK;
    dnnl_primitive_desc_t pd;
    CK(dnnl_reorder_primitive_desc_create(&pd, from, engine, to, engine, attr), "reorder");
    int rc = prim_of(out, pd, scratch);
    dnnl_primitive_desc_destroy(pd);
    return rc;
}

static void csize_free(struct csize *s) {
    dnnl_primitive_t *ps[3] = {&s->fwd, &s->bwd_d, &s->bwd_w};
    for (int i = 0; i < 3; i++)
        if (*ps[i]) dnnl_primitive_destroy(*ps[i]), *ps[i] = NULL;
    for (int i = 0; i < NR; i++)
        if (s->r[i]) dnnl_primitive_destroy(s->r[i]), s->r[i] = NULL;
}

/* Creates the primitives of group size n. */
static int csize_make(struct csize *s, const struct dp__conv_dims *d, int bias, int64_t n) {
    memset(s, 0, sizeof *s);
    s->n = n;
    dnnl_dims_t sd = {n, d->C, d->H, d->W}, wd = {d->OC, d->C, d->K, d->K}, bd = {d->OC},
                dd = {n, d->OC, d->OH, d->OW}, strides = {d->S, d->S}, pad = {d->P, d->P};
    dnnl_memory_desc_t any_s, any_w, any_d, bmd, plain_s, plain_w, plain_d;
    CK(dnnl_memory_desc_init_by_tag(&any_s, 4, sd, dnnl_f32, dnnl_format_tag_any), "memory desc");
    CK(dnnl_memory_desc_init_by_tag(&any_w, 4, wd, dnnl_f32, dnnl_format_tag_any), "memory desc");
    CK(dnnl_memory_desc_init_by_tag(&any_d, 4, dd, dnnl_f32, dnnl_format_tag_any), "memory desc");
    CK(dnnl_memory_desc_init_by_tag(&bmd, 1, bd, dnnl_f32, dnnl_x), "memory desc");
    CK(dnnl_memory_desc_init_by_tag(&plain_s, 4, sd, dnnl_f32, dnnl_nchw), "memory desc");
    CK(dnnl_memory_desc_init_by_tag(&plain_w, 4, wd, dnnl_f32, dnnl_oihw), "memory desc");
    CK(dnnl_memory_desc_init_by_tag(&plain_d, 4, dd, dnnl_f32, dnnl_nchw), "memory desc");
    dnnl_convolution_desc_t fd, bdd, bwd;
    CK(dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct, &any_s, &any_w,
                                          bias ? &bmd : NULL, &any_d, strides, pad, pad),
       "forward desc");
    CK(dnnl_convolution_backward_data_desc_init(&bdd, dnnl_convolution_direct, &any_s, &any_w, &any_d, strides,
                                                pad, pad),
       "backward-data desc");
    CK(dnnl_convolution_backward_weights_desc_init(&bwd, dnnl_convolution_direct, &any_s, &any_w, NULL, &any_d,
                                                   strides, pad, pad),
       "backward-weights desc");
    dnnl_primitive_attr_t attr;
    CK(dnnl_primitive_attr_create(&attr), "attributes");
    dnnl_status_t st = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    dnnl_primitive_desc_t fpd = NULL, dpd = NULL, wpd = NULL;
    if (st == dnnl_success) st = dnnl_primitive_desc_create(&fpd, &fd, attr, engine, NULL);
    if (st == dnnl_success) st = dnnl_primitive_desc_create(&dpd, &bdd, attr, engine, fpd);
    if (st == dnnl_success) st = dnnl_primitive_desc_create(&wpd, &bwd, attr, engine, fpd);
    int rc = st == dnnl_success ? DP_OK : dnnl_fail(st, "convolution primitive descriptors");
    if (!rc) rc = prim_of(&s->fwd, fpd, &s->scratch);
    if (!rc) rc = prim_of(&s->bwd_d, dpd, &s->scratch);
    if (!rc) rc = prim_of(&s->bwd_w, wpd, &s->scratch);
    /* each reorder: (the primitive's side, the plain side, into the primitive?) */
    const struct {
        const_dnnl_primitive_desc_t pd;
        dnnl_query_t q;
        const dnnl_memory_desc_t *plain;
        int in;
    } ports[NR] = {
        [R_SRC_F] = {fpd, dnnl_query_src_md, &plain_s, 1},       [R_WTS_F] = {fpd, dnnl_query_weights_md, &plain_w, 1},
        [R_DST_F] = {fpd, dnnl_query_dst_md, &plain_d, 0},       [R_DDST_D] = {dpd, dnnl_query_diff_dst_md, &plain_d, 1},
        [R_WTS_D] = {dpd, dnnl_query_weights_md, &plain_w, 1},   [R_DSRC_D] = {dpd, dnnl_query_diff_src_md, &plain_s, 0},
        [R_SRC_W] = {wpd, dnnl_query_src_md, &plain_s, 1},       [R_DDST_W] = {wpd, dnnl_query_diff_dst_md, &plain_d, 1},
        [R_DWTS_W] = {wpd, dnnl_query_diff_weights_md, &plain_w, 0},
    };
    for (int i = 0; i < NR && !rc; i++) {
        s->md[i] = *dnnl_primitive_desc_query_md(ports[i].pd, ports[i].q, 0);
        rc = ports[i].in ? reorder_of(&s->r[i], ports[i].plain, &s->md[i], attr, &s->scratch)
                         : reorder_of(&s->r[i], &s->md[i], ports[i].plain, attr, &s->scratch);
        s->bytes[i] = s->r[i] ? dnnl_memory_desc_get_size(&s->md[i]) : 0;
    }
    s->same_ddst = !rc && dnnl_memory_desc_equal(&s->md[R_DDST_D], &s->md[R_DDST_W]);
    if (!rc && bias) s->bias = *dnnl_primitive_desc_query_md(fpd, dnnl_query_weights_md, 1);
    if (fpd) dnnl_primitive_desc_destroy(fpd);
    if (dpd) dnnl_primitive_desc_destroy(dpd);
    if (wpd) dnnl_primitive_desc_destroy(wpd);
    dnnl_primitive_attr_destroy(attr);
    if (rc) csize_free(s);
    return rc;
}

static int dp__omp_max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}
static void dp__omp_set_threads(int n) {
#ifdef _OPENMP
    omp_set_num_threads(n);
#else
    (void)n;
#endif
}

/* The primitives of group size n, made on first use (by a caller whose team is one thread:
 * a primitive fixes its thread decomposition when it is made, and backward-weights waits at
 * barriers of its own for the threads it planned on, so it must be made for the one it runs on). */
static int csize_get(struct dp__conv_dnnl *c, const struct dp__conv_dims *d, int bias, int64_t n,
                     const struct csize **out) {
    int rc = DP_OK;
    pthread_mutex_lock(&c->mu);
    int i = 0;
    while (i < c->nsizes && c->sz[i].n != n) i++;
    if (i == c->nsizes) {
        if (i == NSIZES) { /* full: drop the last made (the run's main sizes came first) */
            csize_free(&c->sz[--i]);
            c->nsizes--;
        }
        if (!(rc = csize_make(&c->sz[i], d, bias, n))) c->nsizes++;
    }
    *out = rc ? NULL : &c->sz[i];
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- one group ---------------------------------------------------------------------- */

/* A thread's buffers for one group: the blocked tensors and the scratchpad. */
struct gbuf {
    float *src, *dst, *ddst_w, *dsrc, *dwts, *dyt; /* (dyt: dY' in NCHW, when masked) */
    void *scratch;
};

static int run(dnnl_primitive_t p, dnnl_stream_t st, int nargs, const int *keys, void *const *ptrs,
               const dnnl_memory_desc_t *const *mds, void *scratch, const dnnl_memory_desc_t *smd) {
    dnnl_memory_t mem[6] = {0};
    dnnl_exec_arg_t args[6];
    dnnl_status_t s = dnnl_success;
    int k = 0;
    for (; k < nargs && s == dnnl_success; k++) {
        s = dnnl_memory_create(&mem[k], mds[k], engine, ptrs[k]);
        args[k] = (dnnl_exec_arg_t){keys[k], mem[k]};
    }
    if (s == dnnl_success && smd && dnnl_memory_desc_get_size(smd) > 0) {
        s = dnnl_memory_create(&mem[k], smd, engine, scratch);
        args[k] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, mem[k]};
        k++;
    }
    if (s == dnnl_success) s = dnnl_primitive_execute(p, st, k, args);
    if (s == dnnl_success) s = dnnl_stream_wait(st);
    for (int i = 0; i < 6; i++)
        if (mem[i]) dnnl_memory_destroy(mem[i]);
    return s == dnnl_success ? DP_OK : dnnl_fail(s, "execution");
}

static const dnnl_memory_desc_t *scratch_md(dnnl_primitive_t p) {
    const_dnnl_primitive_desc_t pd;
    if (dnnl_primitive_get_primitive_desc(p, &pd) != dnnl_success) return NULL;
    return dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
}

static const dnnl_memory_desc_t *md_of(dnnl_primitive_t p, dnnl_query_t q) {
    const_dnnl_primitive_desc_t pd;
    if (dnnl_primitive_get_primitive_desc(p, &pd) != dnnl_success) return NULL;
    return dnnl_primitive_desc_query_md(pd, q, 0);
}

/* Reorder `from` into `to` with reorder primitive r (its own descriptors). */
static int reorder(dnnl_primitive_t r, dnnl_stream_t st, const void *from, void *to, void *scratch) {
    const int keys[2] = {DNNL_ARG_FROM, DNNL_ARG_TO};
    void *ptrs[2] = {(void *)from, to};
    const dnnl_memory_desc_t *mds[2] = {md_of(r, dnnl_query_src_md), md_of(r, dnnl_query_dst_md)};
    return run(r, st, 2, keys, ptrs, mds, scratch, scratch_md(r));
}

/* In `s`'s layout for port i: the plain tensor itself, or its reorder into buf. */
static int into(const struct csize *s, int i, dnnl_stream_t st, const float *plain, float *buf, void *scratch,
                const float **out) {
    *out = plain;
    if (!s->r[i]) return DP_OK;
    *out = buf;
    return reorder(s->r[i], st, plain, buf, scratch);
}

/* The weights in each group size's layouts, reordered once per call: w[0] for the full
 * groups, w[1] for the last when it is shorter. */
struct wts {
    const float *w[2];
};

static int fwd_group(const struct csize *s, const struct dp__conv_dims *d, int relu, const float *wts,
                     const float *bias, float *y, const float *x, const struct gbuf *gb, dnnl_stream_t st) {
    const float *src;
    int rc = into(s, R_SRC_F, st, x, gb->src, gb->scratch, &src);
    if (rc) return rc;
    float *dst = s->r[R_DST_F] ? gb->dst : y;
    const int keys[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
    void *ptrs[4] = {(void *)src, (void *)wts, dst, (void *)bias};
    const dnnl_memory_desc_t *mds[4] = {&s->md[R_SRC_F], &s->md[R_WTS_F], &s->md[R_DST_F], &s->bias};
    if ((rc = run(s->fwd, st, bias ? 4 : 3, keys, ptrs, mds, gb->scratch, scratch_md(s->fwd)))) return rc;
    if (s->r[R_DST_F] && (rc = reorder(s->r[R_DST_F], st, dst, y, gb->scratch))) return rc;
    if (relu) dp__relu(y, y, s->n * d->OC * d->OH * d->OW); /* (the ReLU layer's own expression) */
    return DP_OK;
}

/* dwp (OC, C, K, K) = this group's dW; dbp (OC) += its bias sums (when dbp); dx (when dx). */
static int bwd_group(const struct csize *s, const struct dp__conv_dims *d, int relu, const float *wts_d,
                     float *dwp, double *dbp, float *dx, const float *dy, const float *y, const float *x,
                     const struct gbuf *gb, dnnl_stream_t st) {
    const int64_t n = s->n, OHW = d->OH * d->OW;
    const float *g = dy; /* dY' (n, OC, OH, OW) */
    if (relu) {
        dp__relu_mask(gb->dyt, dy, y, n * d->OC * OHW);
        g = gb->dyt;
    }
    if (dbp)
        for (int64_t b = 0; b < n; b++)
            for (int64_t oc = 0; oc < d->OC; oc++) {
                const float *row = g + (b * d->OC + oc) * OHW;
                double acc = 0.0;
#pragma omp simd reduction(+ : acc)
                for (int64_t i = 0; i < OHW; i++)
                    acc += row[i];
                dbp[oc] += acc;
            }
    const float *src, *gw;
    int rc = into(s, R_SRC_W, st, x, gb->src, gb->scratch, &src);
    if (!rc) rc = into(s, R_DDST_W, st, g, gb->ddst_w, gb->scratch, &gw);
    if (rc) return rc;
    float *dwts = s->r[R_DWTS_W] ? gb->dwts : dwp;
    {
        const int keys[3] = {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS};
        void *ptrs[3] = {(void *)src, (void *)gw, dwts};
        const dnnl_memory_desc_t *mds[3] = {&s->md[R_SRC_W], &s->md[R_DDST_W], &s->md[R_DWTS_W]};
        if ((rc = run(s->bwd_w, st, 3, keys, ptrs, mds, gb->scratch, scratch_md(s->bwd_w)))) return rc;
    }
    if (s->r[R_DWTS_W] && (rc = reorder(s->r[R_DWTS_W], st, dwts, dwp, gb->scratch))) return rc;
    if (!dx) return DP_OK;
    const float *gd = gw; /* dY' for backward-data: backward-weights' copy when the layouts agree */
    if (!s->same_ddst && (rc = into(s, R_DDST_D, st, g, gb->dst, gb->scratch, &gd))) return rc;
    float *dsrc = s->r[R_DSRC_D] ? gb->dsrc : dx;
    const int keys[3] = {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC};
    void *ptrs[3] = {(void *)gd, (void *)wts_d, dsrc};
    const dnnl_memory_desc_t *mds[3] = {&s->md[R_DDST_D], &s->md[R_WTS_D], &s->md[R_DSRC_D]};
    if ((rc = run(s->bwd_d, st, 3, keys, ptrs, mds, gb->scratch, scratch_md(s->bwd_d)))) return rc;
    if (s->r[R_DSRC_D] && (rc = reorder(s->r[R_DSRC_D], st, dsrc, dx, gb->scratch))) return rc;
    return DP_OK;
}

/* ---- the layer's calls ------------------------------------------------------------ */

static int enabled = 1;
void dp__conv2d_set_dnnl(int on) { enabled = on != 0; }

int dp__conv_dnnl_fits(const struct dp__conv_dims *d) { return d->C >= 16 && d->K >= 2; }

int dp__conv_dnnl_usable(const struct dp__conv_dims *d) {
    if (!enabled || !dp__conv_dnnl_fits(d) || dp_gemm_get_backend() != DP_GEMM_DNNL) return 0;
    pthread_once(&engine_once, engine_make);
    return engine != NULL;
}

struct dp__conv_dnnl *dp__conv_dnnl_new(void) {
    struct dp__conv_dnnl *c = dp_calloc(1, sizeof *c);
    if (c && pthread_mutex_init(&c->mu, NULL)) dp_free(c), c = NULL;
    return c;
}

void dp__conv_dnnl_free(struct dp__conv_dnnl *c) {
    if (!c) return;
    for (int i = 0; i < c->nsizes; i++) csize_free(&c->sz[i]);
    pthread_mutex_destroy(&c->mu);
    dp_free(c);
}

/* A call's plan: the group sizes' primitives, the threads, and each thread's buffers. */
struct call {
    const struct csize *s[2]; /* full groups, the shorter last one (or NULL) */
    int64_t ngroups;
    int T, outer;
    struct gbuf *gb; /* (T) */
};

static int call_begin(struct call *cl, struct dp__conv_dnnl *c, struct dp_ctx *ctx, const struct dp__conv_dims *d,
                      int bias, int relu, int64_t B) {
    memset(cl, 0, sizeof *cl);
    const int64_t full = B < GROUP ? B : GROUP, last = B % GROUP && B > GROUP ? B % GROUP : 0;
    cl->ngroups = (B + GROUP - 1) / GROUP;
    int rc = csize_get(c, d, bias, full, &cl->s[0]);
    if (!rc && last) rc = csize_get(c, d, bias, last, &cl->s[1]);
    if (rc) return rc;
    const int T = dp_get_num_threads();
    cl->outer = T > 1 && cl->ngroups > 1;
    cl->T = cl->outer ? T : 1;
    cl->gb = dp_arena_alloc(ctx->arena, sizeof *cl->gb * (size_t)cl->T);
    if (!cl->gb) return DP_ENOMEM;
    const struct csize *s = cl->s[0]; /* the largest group: its sizes bound the last one's */
    size_t most[NR], scratch = s->scratch;
    memcpy(most, s->bytes, sizeof most);
    if (cl->s[1]) {
        for (int i = 0; i < NR; i++)
            if (cl->s[1]->bytes[i] > most[i]) most[i] = cl->s[1]->bytes[i];
        if (cl->s[1]->scratch > scratch) scratch = cl->s[1]->scratch;
    }
    const size_t src = most[R_SRC_F] > most[R_SRC_W] ? most[R_SRC_F] : most[R_SRC_W];
    const size_t dst = most[R_DST_F] > most[R_DDST_D] ? most[R_DST_F] : most[R_DDST_D];
    for (int t = 0; t < cl->T; t++) {
        struct gbuf *g = &cl->gb[t];
        g->src = dp_arena_alloc(ctx->arena, src + 64);
        g->dst = dp_arena_alloc(ctx->arena, dst + 64);
        g->ddst_w = dp_arena_alloc(ctx->arena, most[R_DDST_W] + 64);
        g->dsrc = dp_arena_alloc(ctx->arena, most[R_DSRC_D] + 64);
        g->dwts = dp_arena_alloc(ctx->arena, most[R_DWTS_W] + 64);
        g->dyt = relu ? dp__arena_floats(ctx, full * d->OC * d->OH * d->OW) : NULL;
        g->scratch = dp_arena_alloc(ctx->arena, scratch + 64);
        if (!g->src || !g->dst || !g->ddst_w || !g->dsrc || !g->dwts || (relu && !g->dyt) || !g->scratch)
            return DP_ENOMEM;
    }
    return DP_OK;
}

/* The weights in each group size's layout for port i (R_WTS_F or R_WTS_D). */
static int weights_for(struct wts *out, const struct call *cl, struct dp_ctx *ctx, int i, const float *w) {
    dnnl_stream_t st;
    CK(dnnl_stream_create(&st, engine, dnnl_stream_default_flags), "stream");
    int rc = DP_OK;
    for (int k = 0; k < 2 && !rc; k++) {
        const struct csize *s = cl->s[k];
        out->w[k] = w;
        if (!s || !s->r[i]) continue;
        float *buf = dp_arena_alloc(ctx->arena, s->bytes[i] + 64);
        if (!buf) rc = DP_ENOMEM;
        else rc = reorder(s->r[i], st, w, buf, cl->gb[0].scratch), out->w[k] = buf;
    }
    dnnl_stream_destroy(st);
    return rc;
}

/* Runs body (group k) over the groups, shared out over the call's threads; the caller has set
 * its team to one thread (one_thread), so each library call runs on the thread that makes it. */
#define FOR_GROUPS(cl, body)                                                                       \
    do {                                                                                           \
        const int T_ = (cl)->T, outer_ = (cl)->outer;                                              \
        _Pragma("omp parallel num_threads(T_) if (outer_)")                                        \
        {                                                                                          \
            const int t_ = dp__thread_id();                                                       \
            if (outer_) dp__omp_set_threads(1); /* (this thread's own setting, as in dp_gemm) */  \
            dnnl_stream_t st_;                                                                     \
            int rc_t = dnnl_stream_create(&st_, engine, dnnl_stream_default_flags) == dnnl_success \
                           ? DP_OK                                                                 \
                           : dp_seterr(DP_EINTERNAL, "conv2d: oneDNN stream creation failed");    \
            _Pragma("omp for schedule(static)")                                                    \
            for (int64_t k = 0; k < (cl)->ngroups; k++) {                                          \
                if (rc_t) continue;                                                                \
                const struct gbuf *gb = &(cl)->gb[t_];                                             \
                dnnl_stream_t st = st_;                                                            \
                body                                                                               \
            }                                                                                      \
            if (!rc_t) dnnl_stream_destroy(st_);                                                   \
            if (rc_t) {                                                                            \
                _Pragma("omp critical(dp_conv_dnnl)") rc = rc ? rc : rc_t;                         \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* The calling thread's team to one thread for a layer call (returns the size to restore). */
static int one_thread(void) {
    const int was = dp__omp_max_threads();
    if (was > 1) dp__omp_set_threads(1);
    return was;
}
static void threads_back(int was) {
    if (was > 1) dp__omp_set_threads(was);
}

static int conv_forward(struct dp__conv_dnnl *c, struct dp_ctx *ctx, const struct dp__conv_dims *d, int relu,
                        const float *w, const float *bias, float *y, const float *x, int64_t B) {
    struct dp_arena_mark mk = dp_arena_mark(ctx->arena);
    struct call cl;
    struct wts wf;
    int rc = call_begin(&cl, c, ctx, d, bias != NULL, 0, B);
    if (!rc) rc = weights_for(&wf, &cl, ctx, R_WTS_F, w);
    if (!rc) {
        const int64_t CHW = d->C * d->H * d->W, OUT = d->OC * d->OH * d->OW;
        FOR_GROUPS(&cl, {
            const int l = k == cl.ngroups - 1 && cl.s[1];
            rc_t = fwd_group(cl.s[l], d, relu, wf.w[l], bias, y + k * GROUP * OUT, x + k * GROUP * CHW, gb, st);
        });
    }
    dp_arena_release(ctx->arena, mk);
    return rc;
}

static int conv_backward(struct dp__conv_dnnl *c, struct dp_ctx *ctx, const struct dp__conv_dims *d, int relu,
                         const float *w, float *dw, float *db, float *dx, const float *dy, const float *x,
                         const float *y, int64_t B) {
    struct dp_arena_mark mk = dp_arena_mark(ctx->arena);
    struct call cl;
    struct wts wd = {{w, w}};
    const int64_t NW = d->OC * d->C * d->K * d->K, OC = d->OC;
    int rc = call_begin(&cl, c, ctx, d, db != NULL, relu, B);
    if (!rc && dx) rc = weights_for(&wd, &cl, ctx, R_WTS_D, w);
    const int64_t G = cl.ngroups;
    float *part = rc ? NULL : dp__arena_floats(ctx, G * NW);                               /* (G, OC, C, K, K) */
    double *dbp = rc || !db ? NULL : dp_arena_calloc(ctx->arena, sizeof(double) * (size_t)(G * OC)); /* (G, OC) */
    if (!rc && (!part || (db && !dbp))) rc = DP_ENOMEM;
    if (!rc) {
        const int64_t CHW = d->C * d->H * d->W, OUT = d->OC * d->OH * d->OW;
        FOR_GROUPS(&cl, {
            const int l = k == cl.ngroups - 1 && cl.s[1];
            const int64_t b0 = k * GROUP;
            rc_t = bwd_group(cl.s[l], d, relu, wd.w[l], part + k * NW, dbp ? dbp + k * OC : NULL,
                             dx ? dx + b0 * CHW : NULL, dy + b0 * OUT, y ? y + b0 * OUT : NULL, x + b0 * CHW, gb,
                             st);
        });
    }
    if (!rc) { /* the partials, in group order */
#pragma omp parallel for schedule(static) if (cl.outer) num_threads(cl.T)
        for (int64_t i = 0; i < NW; i++) {
            float acc = part[i];
            for (int64_t g = 1; g < G; g++)
                acc += part[g * NW + i];
            dw[i] += acc;
        }
        for (int64_t oc = 0; dbp && oc < OC; oc++) {
            double acc = dbp[oc];
            for (int64_t g = 1; g < G; g++)
                acc += dbp[g * OC + oc];
            db[oc] += (float)acc;
        }
    }
    dp_arena_release(ctx->arena, mk);
    return rc;
}
int dp__conv_dnnl_forward(struct dp__conv_dnnl *c, struct dp_ctx *ctx, const struct dp__conv_dims *d, int relu,
                          const float *w, const float *bias, float *y, const float *x, int64_t B) {
    if (B == 0) return DP_OK;
    const int was = one_thread();
    int rc = conv_forward(c, ctx, d, relu, w, bias, y, x, B);
    threads_back(was);
    return rc;
}

int dp__conv_dnnl_backward(struct dp__conv_dnnl *c, struct dp_ctx *ctx, const struct dp__conv_dims *d, int relu,
                           const float *w, float *dw, float *db, float *dx, const float *dy, const float *x,
                           const float *y, int64_t B) {
    if (B == 0) return DP_OK;
    const int was = one_thread();
    int rc = conv_backward(c, ctx, d, relu, w, dw, db, dx, dy, x, y, B);
    threads_back(was);
    return rc;
}
#else /* built without oneDNN: every layer takes im2col + GEMM */
void dp__conv2d_set_dnnl(int on) { (void)on; }
int dp__conv_dnnl_fits(const struct dp__conv_dims *d) {
    (void)d;
    return 0;
}
int dp__conv_dnnl_usable(const struct dp__conv_dims *d) {
    (void)d;
    return 0;
}
struct dp__conv_dnnl *dp__conv_dnnl_new(void) { return NULL; }
void dp__conv_dnnl_free(struct dp__conv_dnnl *c) { (void)c; }
int dp__conv_dnnl_forward(struct dp__conv_dnnl *c, struct dp_ctx *ctx, const struct dp__conv_dims *d, int relu,
                          const float *w, const float *bias, float *y, const float *x, int64_t B) {
    (void)c, (void)ctx, (void)d, (void)relu, (void)w, (void)bias, (void)y, (void)x, (void)B;
    return dp_seterr(DP_EINTERNAL, "conv2d: built without oneDNN");
}
int dp__conv_dnnl_backward(struct dp__conv_dnnl *c, struct dp_ctx *ctx, const struct dp__conv_dims *d, int relu,
                           const float *w, float *dw, float *db, float *dx, const float *dy, const float *x,
                           const float *y, int64_t B) {
    (void)c, (void)ctx, (void)d, (void)relu, (void)w, (void)dw, (void)db, (void)dx, (void)dy, (void)x, (void)y,
        (void)B;
    return dp_seterr(DP_EINTERNAL, "conv2d: built without oneDNN");
}
#endif
