/* Each convolution of cnn and resnet, one thread, batch 128: dptrain's conv2d layer, on the path
 * it takes (im2col + GEMM per chunk with its epilogue, or, where C >= 16 and K >= 2, oneDNN's
 * blocked kernels in groups of 16 samples: src/nn/conv_dnnl.c), against oneDNN's convolution
 * primitives on the same shape, forward and backward (data and weights), so that the step's
 * convolution time can be read against what the library's direct kernels reach.  Issue 32, S2:
 * "measure each layer".
 *
 *   ./build/bench/conv_layers [reps]          (bench/conv_layers.sh keeps the output)
 *
 * oneDNN runs in two layouts:
 *   nchw  the tensors in dptrain's own layout (NCHW, OIHW): what a drop-in replacement gets;
 *   any   the library's choice (blocked, e.g. nChw16c), the reorders left out: the best case
 *         for a chain of convolutions kept in the blocked layout;
 *   any + reorders   the same with the reorders to and from NCHW/OIHW added: what one layer
 *         in dptrain's layout would get from the blocked kernels.
 * Each figure is the median of reps timed runs after one untimed run, in milliseconds per batch;
 * "bwd" is backward data plus backward weights (with the bias gradient). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "dp/core.h"
#include "dp/nn.h"

#ifdef DP_WITH_DNNL
#include <dnnl.h>
#endif

#define B 128

struct shape {
    const char *what;
    int64_t C, H, W, OC;
    int K, S, P, bias;
};

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return v[n / 2];
}

static void fill(float *x, int64_t n, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) x[i] = 2.0f * dp_rng_uniform(seed, DP_RNG_USER, 1, (uint64_t)i) - 1.0f;
}

/* dptrain's conv2d layer alone: ms forward and backward (median of reps) into t[0], t[1]. */
static int time_ours(const struct shape *s, int reps, double t[2]) {
    struct dp_model *m;
    struct dp_shape in = {3, {s->C, s->H, s->W, 0}};
    int rc = dp_model_init(&m, "conv", &in);
    if (!rc) rc = dp_conv2d(m, "conv", s->OC, s->K, s->S, s->P, s->bias);
    if (!rc) rc = dp_flatten(m, "flat");
    if (!rc) rc = dp_model_finalize(m);
    if (rc) return rc;
    struct dp_replica r;
    if ((rc = dp_replica_init(&r, m, B))) return rc;
    dp_model_init_params(m, &r, 1);
    struct dp_layer *l = m->layers[0];
    const int64_t nin = B * dp_shape_numel(&l->in_shape), nout = B * dp_shape_numel(&l->out_shape);
    float *x = malloc(sizeof(float) * (size_t)nin), *dx = malloc(sizeof(float) * (size_t)nin);
    float *dy = malloc(sizeof(float) * (size_t)nout);
    double tf[101], tb[101];
    fill(x, nin, 2), fill(dy, nout, 3);
    for (int k = -1; k < reps; k++) {
        dp_arena_reset(&r.arena);
        struct dp_ctx c = {.params = r.params, .grads = r.grads, .buffers = r.buffers, .arena = &r.arena,
                           .saved = r.saved, .training = 1, .loss_scale = 1.0f};
        float *y = dp_arena_alloc(&r.arena, sizeof(float) * (size_t)nout);
        double t0 = dp_time();
        if ((rc = l->ops->forward(l, &c, y, x, B))) break;
        double t1 = dp_time();
        if ((rc = l->ops->backward(l, &c, dx, dy, x, y, B))) break;
        double t2 = dp_time();
        if (k >= 0) tf[k] = 1e3 * (t1 - t0), tb[k] = 1e3 * (t2 - t1);
    }
    t[0] = median(tf, reps), t[1] = median(tb, reps);
    free(x), free(dx), free(dy);
    dp_replica_free(&r);
    dp_model_free(m);
    return rc;
}

#ifdef DP_WITH_DNNL
#define CK(call)                                                                                   \
    do {                                                                                           \
        dnnl_status_t st_ = (call);                                                                \
        if (st_ != dnnl_success) {                                                                 \
            fprintf(stderr, "conv_layers: %s failed (oneDNN status %d)\n", #call, (int)st_);      \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* A memory of the primitive's chosen descriptor for `what`, filled with data in that layout
 * (the values do not matter for the timing). */
static int mem_of(dnnl_memory_t *out, const_dnnl_primitive_desc_t pd, dnnl_query_t what, dnnl_engine_t eng) {
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, what, 0);
    CK(dnnl_memory_create(out, md, eng, DNNL_MEMORY_ALLOCATE));
    void *h;
    CK(dnnl_memory_get_data_handle(*out, &h));
    fill(h, (int64_t)(dnnl_memory_desc_get_size(md) / sizeof(float)), 5);
    return 0;
}

static double run_prim(dnnl_primitive_t p, dnnl_stream_t st, int nargs, const dnnl_exec_arg_t *args, int reps) {
    double v[101];
    for (int k = -1; k < reps; k++) {
        double t0 = dp_time();
        if (dnnl_primitive_execute(p, st, nargs, args) != dnnl_success || dnnl_stream_wait(st) != dnnl_success)
            return -1.0;
        if (k >= 0) v[k] = 1e3 * (dp_time() - t0);
    }
    return median(v, reps);
}

/* The time of a reorder from `from` to `to` (0 when they are the same layout), ms. */
static double time_reorder(const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to, dnnl_engine_t eng,
                           dnnl_stream_t st, int reps) {
    if (dnnl_memory_desc_equal(from, to)) return 0.0;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t p;
    dnnl_memory_t a, b;
    if (dnnl_reorder_primitive_desc_create(&pd, from, eng, to, eng, NULL) != dnnl_success) return -1.0;
    if (dnnl_primitive_create(&p, pd) != dnnl_success) return -1.0;
    if (dnnl_memory_create(&a, from, eng, DNNL_MEMORY_ALLOCATE) != dnnl_success ||
        dnnl_memory_create(&b, to, eng, DNNL_MEMORY_ALLOCATE) != dnnl_success)
        return -1.0;
    void *h;
    dnnl_memory_get_data_handle(a, &h);
    fill(h, (int64_t)(dnnl_memory_desc_get_size(from) / sizeof(float)), 7);
    dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, a}, {DNNL_ARG_TO, b}};
    double v = run_prim(p, st, 2, ra, reps);
    dnnl_memory_destroy(a), dnnl_memory_destroy(b);
    dnnl_primitive_destroy(p), dnnl_primitive_desc_destroy(pd);
    return v;
}

/* oneDNN's forward, backward-data and backward-weights primitives: ms into t[0] (forward),
 * t[1] (both backward), in the layout `tag` (any = 0: dnnl_nchw; 1: dnnl_format_tag_any;
 * 2: dnnl_format_tag_any with the reorders from and to NCHW/OIHW that a layer in dptrain's
 * layout would pay added: forward src, weights, dst; backward diff_dst (once per layout the
 * two backward primitives chose), diff_src, diff_weights.  The src in the blocked layout is
 * kept from forward for backward-weights. */
static int time_dnnl(const struct shape *s, int reps, int any, double t[2]) {
    dnnl_engine_t eng;
    dnnl_stream_t st;
    CK(dnnl_engine_create(&eng, dnnl_cpu, 0));
    CK(dnnl_stream_create(&st, eng, dnnl_stream_default_flags));
    const int64_t OH = (s->H + 2 * s->P - s->K) / s->S + 1, OW = (s->W + 2 * s->P - s->K) / s->S + 1;
    dnnl_dims_t sd = {B, s->C, s->H, s->W}, wd = {s->OC, s->C, s->K, s->K}, bd = {s->OC}, dd = {B, s->OC, OH, OW};
    dnnl_dims_t strides = {s->S, s->S}, pad = {s->P, s->P};
    dnnl_memory_desc_t smd, wmd, bmd, dmd;
    CK(dnnl_memory_desc_init_by_tag(&smd, 4, sd, dnnl_f32, any ? dnnl_format_tag_any : dnnl_nchw));
    CK(dnnl_memory_desc_init_by_tag(&wmd, 4, wd, dnnl_f32, any ? dnnl_format_tag_any : dnnl_oihw));
    CK(dnnl_memory_desc_init_by_tag(&bmd, 1, bd, dnnl_f32, dnnl_x));
    CK(dnnl_memory_desc_init_by_tag(&dmd, 4, dd, dnnl_f32, any ? dnnl_format_tag_any : dnnl_nchw));
    const dnnl_memory_desc_t *bp = s->bias ? &bmd : NULL;
    dnnl_convolution_desc_t fd, bdd, bwd;
    CK(dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct, &smd, &wmd, bp, &dmd,
                                          strides, pad, pad));
    CK(dnnl_convolution_backward_data_desc_init(&bdd, dnnl_convolution_direct, &smd, &wmd, &dmd, strides, pad, pad));
    CK(dnnl_convolution_backward_weights_desc_init(&bwd, dnnl_convolution_direct, &smd, &wmd, bp, &dmd, strides,
                                                   pad, pad));
    dnnl_primitive_desc_t fpd, dpd, wpd;
    CK(dnnl_primitive_desc_create(&fpd, &fd, NULL, eng, NULL));
    CK(dnnl_primitive_desc_create(&dpd, &bdd, NULL, eng, fpd));
    CK(dnnl_primitive_desc_create(&wpd, &bwd, NULL, eng, fpd));
    dnnl_primitive_t fp, dp, wp;
    CK(dnnl_primitive_create(&fp, fpd));
    CK(dnnl_primitive_create(&dp, dpd));
    CK(dnnl_primitive_create(&wp, wpd));
    dnnl_memory_t src, wts, bia = NULL, dst, dsrc, ddst, dwts, dbia = NULL;
    if (mem_of(&src, fpd, dnnl_query_src_md, eng) || mem_of(&wts, fpd, dnnl_query_weights_md, eng) ||
        mem_of(&dst, fpd, dnnl_query_dst_md, eng) || mem_of(&dsrc, dpd, dnnl_query_diff_src_md, eng) ||
        mem_of(&ddst, wpd, dnnl_query_diff_dst_md, eng) || mem_of(&dwts, wpd, dnnl_query_diff_weights_md, eng))
        return 1;
    if (s->bias) {
        CK(dnnl_memory_create(&bia, &bmd, eng, DNNL_MEMORY_ALLOCATE));
        CK(dnnl_memory_create(&dbia, &bmd, eng, DNNL_MEMORY_ALLOCATE));
    }
    dnnl_exec_arg_t fa[4] = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wts}, {DNNL_ARG_DST, dst}, {DNNL_ARG_BIAS, bia}};
    dnnl_exec_arg_t da[3] = {{DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_WEIGHTS, wts}, {DNNL_ARG_DIFF_SRC, dsrc}};
    dnnl_exec_arg_t wa[4] = {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_DIFF_WEIGHTS, dwts},
                             {DNNL_ARG_DIFF_BIAS, dbia}};
    t[0] = run_prim(fp, st, s->bias ? 4 : 3, fa, reps);
    double tdd = run_prim(dp, st, 3, da, reps), tdw = run_prim(wp, st, s->bias ? 4 : 3, wa, reps);
    t[1] = tdd < 0 || tdw < 0 ? -1.0 : tdd + tdw;
    if (any == 2 && t[0] >= 0 && t[1] >= 0) {
        dnnl_memory_desc_t psmd, pwmd, pdmd; /* dptrain's layouts */
        CK(dnnl_memory_desc_init_by_tag(&psmd, 4, sd, dnnl_f32, dnnl_nchw));
        CK(dnnl_memory_desc_init_by_tag(&pwmd, 4, wd, dnnl_f32, dnnl_oihw));
        CK(dnnl_memory_desc_init_by_tag(&pdmd, 4, dd, dnnl_f32, dnnl_nchw));
#define MD(pd, q) dnnl_primitive_desc_query_md(pd, q, 0)
        const dnnl_memory_desc_t *dd_d = MD(dpd, dnnl_query_diff_dst_md), *dd_w = MD(wpd, dnnl_query_diff_dst_md);
        double r[7] = {time_reorder(&psmd, MD(fpd, dnnl_query_src_md), eng, st, reps),
                       time_reorder(&pwmd, MD(fpd, dnnl_query_weights_md), eng, st, reps),
                       time_reorder(MD(fpd, dnnl_query_dst_md), &pdmd, eng, st, reps),
                       time_reorder(&pdmd, dd_d, eng, st, reps),
                       dnnl_memory_desc_equal(dd_d, dd_w) ? 0.0 : time_reorder(&pdmd, dd_w, eng, st, reps),
                       time_reorder(MD(dpd, dnnl_query_diff_src_md), &psmd, eng, st, reps),
                       time_reorder(MD(wpd, dnnl_query_diff_weights_md), &pwmd, eng, st, reps)};
#undef MD
        for (int i = 0; i < 7; i++)
            if (r[i] < 0) t[0] = -1.0;
        t[0] += r[0] + r[1] + r[2];
        t[1] += r[3] + r[4] + r[5] + r[6];
    }
    dnnl_memory_t ms[8] = {src, wts, bia, dst, dsrc, ddst, dwts, dbia};
    for (int i = 0; i < 8; i++)
        if (ms[i]) dnnl_memory_destroy(ms[i]);
    dnnl_primitive_destroy(fp), dnnl_primitive_destroy(dp), dnnl_primitive_destroy(wp);
    dnnl_primitive_desc_destroy(fpd), dnnl_primitive_desc_destroy(dpd), dnnl_primitive_desc_destroy(wpd);
    dnnl_stream_destroy(st);
    dnnl_engine_destroy(eng);
    return t[0] < 0 || t[1] < 0;
}
#endif

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 7;
    if (reps < 1 || reps > 101) {
        fprintf(stderr, "usage: conv_layers [reps 1..101]\n");
        return 2;
    }
    dp_set_num_threads(1);
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    /* what, C, H, W, OC, K, S, P, bias: every convolution of cnn and resnet (resnet:8,32) */
    const struct shape shapes[] = {
        {"cnn conv1", 1, 28, 28, 32, 3, 1, 1, 1},
        {"cnn conv2", 32, 14, 14, 64, 3, 1, 1, 1},
        {"resnet conv1", 1, 28, 28, 32, 3, 1, 1, 0},
        {"resnet layer1 conv1, conv2", 32, 28, 28, 32, 3, 1, 1, 0},
        {"resnet layer2.0.conv1 (s2)", 32, 28, 28, 64, 3, 2, 1, 0},
        {"resnet layer2 downsample (1x1 s2)", 32, 28, 28, 64, 1, 2, 0, 0},
        {"resnet layer2.0.conv2", 64, 14, 14, 64, 3, 1, 1, 0},
        {"resnet layer3.0.conv1 (s2)", 64, 14, 14, 128, 3, 2, 1, 0},
        {"resnet layer3 downsample (1x1 s2)", 64, 14, 14, 128, 1, 2, 0, 0},
        {"resnet layer3.0.conv2", 128, 7, 7, 128, 3, 1, 1, 0},
    };
    double peak = dp_cpu_peak_flops() / 1e9;
    printf("batch %d, 1 thread, median of %d; ms per batch (GFLOP/s, %% of the measured %.0f GFLOP/s %s peak)\n", B,
           reps, peak, dp_cpu_peak_isa());
    printf("%-34s %9s %9s | %-25s | %-25s | %-25s | %-25s\n", "layer", "fwd GFLOP", "", "dptrain fwd / bwd",
           "oneDNN nchw fwd / bwd", "oneDNN any fwd / bwd", "any + reorders fwd / bwd");
    int bad = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const struct shape *s = &shapes[i];
        const int64_t OH = (s->H + 2 * s->P - s->K) / s->S + 1, OW = (s->W + 2 * s->P - s->K) / s->S + 1;
        const double gf = 2.0 * B * s->OC * s->C * s->K * s->K * OH * OW / 1e9; /* forward; backward is 2x */
        double o[2], n[2] = {-1, -1}, a[2] = {-1, -1}, ar[2] = {-1, -1};
        if (time_ours(s, reps, o)) {
            fprintf(stderr, "conv_layers: %s: %s\n", s->what, dp_errmsg());
            return 1;
        }
#ifdef DP_WITH_DNNL
        bad |= time_dnnl(s, reps, 0, n);
        bad |= time_dnnl(s, reps, 1, a);
        bad |= time_dnnl(s, reps, 2, ar);
#endif
        char c0[64], c1[64], c2[64], c3[64];
        snprintf(c0, sizeof c0, "%6.2f / %6.2f (%3.0f%%)", o[0], o[1], 100 * 3 * gf / ((o[0] + o[1]) / 1e3) / peak);
        snprintf(c1, sizeof c1, n[0] > 0 ? "%6.2f / %6.2f (%3.0f%%)" : "n/a", n[0], n[1],
                 100 * 3 * gf / ((n[0] + n[1]) / 1e3) / peak);
        snprintf(c2, sizeof c2, a[0] > 0 ? "%6.2f / %6.2f (%3.0f%%)" : "n/a", a[0], a[1],
                 100 * 3 * gf / ((a[0] + a[1]) / 1e3) / peak);
        snprintf(c3, sizeof c3, ar[0] > 0 ? "%6.2f / %6.2f (%3.0f%%)" : "n/a", ar[0], ar[1],
                 100 * 3 * gf / ((ar[0] + ar[1]) / 1e3) / peak);
        printf("%-34s %9.3f %9s | %-25s | %-25s | %-25s | %-25s\n", s->what, gf, "", c0, c1, c2, c3);
    }
    printf("(%%: the training FLOPs, 3 x forward, over forward + backward time, against the peak)\n");
    return bad;
}
