/* The analytic α-β-γ cost model of one data-parallel step (dp/plan.h,
 * DESIGN §4): the collectives' formulas, the reducer's bucket plan, and the
 * overlap of bucket all-reduces with backward.
 *
 * The step, per worker, with b = batch / p samples:
 *
 *   0 ──forward──► F ──backward: layers L-1 .. 0──► F + B ──exposed──► + opt
 *                     │ layer i ends at F + (backward of layers L-1..i)
 *                     └─ bucket k is ready when its lowest layer ends; the
 *                        buckets' all-reduces run one after another (one
 *                        progress thread): start_k = max(ready_k, done_k-1)
 *
 * exposed = max(0, done_last - (F + B)).  Backward costs twice forward per
 * layer (dense layers: 2Ψ FLOPs per sample forward, 4Ψ backward), and a
 * layer's forward is layer_flops[i] (from the model) or 2 x its parameters
 * x tokens per sample; measured forward and backward seconds per sample
 * (fwd_sample_s, bwd_sample_s) replace both and are shared out over the
 * layers in proportion to their FLOPs.
 *
 * The whole step, as the trainer times it (src/train/step.c sync_step):
 *
 *   step = zero + data + F + B + steal + straggle + exposed + opt + gather
 *
 *   zero   Ψ zero_param_s                 the gradient slab set to 0
 *   opt    opt_s + Ψ opt_param_s           finite check + optimizer update
 *   steal  comm_cpu x overlap              overlap = Σ_k |[start_k, done_k] ∩ [F, F + B]|:
 *                                          an all-reduce running beside backward takes
 *                                          comm_cpu of its time from the compute (the
 *                                          thread backend's copies and sums when every core
 *                                          computes: about 1; a wait on a network link: 0)
 *   data   D = b data_sample_s, made by the loader's prefetch thread during the
 *          previous step's rest R = step - data: max(0, D - R) is waited for,
 *          and the part beside compute costs comm_cpu as the all-reduce does:
 *          data = max(0, D - R) + comm_cpu min(D, R).  (Where the workers fill
 *          the cores there is no prefetch thread, --prefetch auto: the batch
 *          is gathered in the step, and comm_cpu, about 1 there, gives D.)
 *   straggle  the wait for the slowest worker: every worker's F + B + steal
 *          (mean C) varies from step to step, and the last bucket's all-reduce
 *          starts when the slowest one ends, E[max_w c_w] - C after the mean
 *          one.  At the calibrated p, the measured straggle_cv x C; at other
 *          p, the normal order statistic: e_p x compute_cv x C, e_p = E[max
 *          of p standard normals] (dp_plan_normal_max; e_2 = 0.564, e_8 =
 *          1.42, e_1000 = 3.24: the wait grows like sqrt(2 ln p) sigma).
 *          Added after backward (the buckets before the last are not moved:
 *          first order, as the steal).  `dptrain simulate --mode sync` draws
 *          the same max from normal compute times: the two agree.
 *   gather gathers x ((p-1)α + (p-1)/p 8p β + gather_wait)  the trainer's all-gather of
 *                                          every rank's wait (p doubles) after each step when
 *                                          it records metrics: a ring all-gather on the ring's
 *                                          link, and a second sync point of the step: its
 *                                          measured wait beyond the formula (the slowest
 *                                          worker's update, the wake-up; calibrate --run)
 *
 * The schedule of the buckets is not moved by the steal (a first-order
 * model: the backward's stretch and the buckets' delay are small beside the
 * step where the formula matters).  Left out: the reducer's polling
 * resolution (one layer) and network contention beyond the formulas. */
#include <math.h>
#include <string.h>

#include "dp/ddp.h"
#include "dp/plan.h"

static const char *const algo_names[DP_PLAN_ALGO_COUNT] = {"ring", "rhd", "tree", "hier", "ps"};

const char *dp_plan_algo_name(int algo) {
    return algo >= 0 && algo < DP_PLAN_ALGO_COUNT ? algo_names[algo] : "best";
}

int dp_plan_algo_parse(const char *name, int *algo) {
    if (name && !strcmp(name, "best")) return *algo = -1, DP_OK;
    for (int i = 0; name && i < DP_PLAN_ALGO_COUNT; i++)
        if (!strcmp(name, algo_names[i])) return *algo = i, DP_OK;
    return dp_seterr(DP_EINVAL, "unknown algorithm '%s' (expected ring, rhd, tree, hier, ps or best)",
                     name ? name : "");
}

void dp_plan_net_link(struct dp_plan_net *n, double latency_s, double bytes_per_s) {
    for (int a = 0; a < DP_PLAN_ALGO_COUNT; a++) n->alpha_s[a] = latency_s, n->beta_s[a] = 1 / bytes_per_s;
}

static int ilog2_floor(int p) {
    int l = 0;
    while ((2 << l) <= p) l++;
    return l;
}
static int ilog2_ceil(int p) {
    int l = 0;
    while ((1 << l) < p) l++;
    return l;
}

/* The ring's three terms for `bytes` over p workers with link (a, b). */
static double ring_s(double n, int p, double a, double b, double g) {
    if (p <= 1) return 0;
    double f = (double)(p - 1) / p;
    return 2 * (p - 1) * a + 2 * f * n * b + f * n * g;
}

/* The measured table (dp_plan_net): interpolated, floored, extrapolated. */
static double table_s(const double *x, const double *t, int m, double n) {
    if (n <= x[0] || m == 1) return t[0];
    int k = 1;
    while (k < m - 1 && x[k] < n) k++;
    double slope = (t[k] - t[k - 1]) / (x[k] - x[k - 1]);
    if (n > x[m - 1] && slope < 0) slope = 0; /* noise must not make large messages cheaper */
    return t[k - 1] + (n - x[k - 1]) * slope;
}

double dp_plan_allreduce_s(int algo, double n, const struct dp_plan_net *net) {
    int p = net->workers;
    if (p <= 1) return 0;
    if (algo >= 0 && algo < DP_PLAN_ALGO_COUNT && net->tab_n > 0 && net->tab_s[algo] && p == net->tab_workers)
        return table_s(net->tab_bytes, net->tab_s[algo], net->tab_n, n);
    double a = net->alpha_s[algo < 0 || algo >= DP_PLAN_ALGO_COUNT ? 0 : algo];
    double b = net->beta_s[algo < 0 || algo >= DP_PLAN_ALGO_COUNT ? 0 : algo], g = net->gamma_s;
    switch (algo) {
    case DP_PLAN_RING: return ring_s(n, p, a, b, g);
    case DP_PLAN_RHD: {
        int l = ilog2_floor(p), q = 1 << l;
        double f = (double)(q - 1) / q;
        double t = 2 * l * a + 2 * f * n * b + f * n * g;
        if (q != p) t += 2 * (a + n * b) + n * g; /* fold the p - q extra ranks in and out */
        return t;
    }
    case DP_PLAN_TREE: {
        int l = ilog2_ceil(p);
        return 2 * l * (a + n * b) + l * n * g;
    }
    case DP_PLAN_HIER: {
        int gsz = net->per_host;
        if (gsz < 2 || p % gsz) return INFINITY;
        int H = p / gsz;
        double slice = n / gsz, fi = (double)(gsz - 1);
        double intra = fi * (net->intra_alpha_s + slice * net->intra_beta_s);
        return intra + fi / gsz * n * g + ring_s(slice, H, a, b, g) + intra;
    }
    case DP_PLAN_PS: {
        int S = net->shards < 1 ? 1 : net->shards;
        /* a shard receives and answers p/S messages: their per-message costs
         * queue there (incast), so the latency term is 2 max(1, p/S) α */
        double worker = 2 * n, server = 2 * (double)p * n / S, q = (double)p / S;
        return 2 * (q > 1 ? q : 1) * a + (worker > server ? worker : server) * b + (double)p * n / S * g;
    }
    default: return INFINITY;
    }
}

double dp_plan_sent_bytes(int algo, double n, const struct dp_plan_net *net) {
    int p = net->workers;
    if (p <= 1) return 0;
    switch (algo) {
    case DP_PLAN_RING: return 2.0 * (p - 1) / p * n;
    case DP_PLAN_RHD: {
        int q = 1 << ilog2_floor(p);
        return 2.0 * (q - 1) / q * n + (q != p ? n : 0);
    }
    case DP_PLAN_TREE: return p > 2 ? 3 * n : n; /* an inner node: n up, n to each of two children */
    case DP_PLAN_HIER: {
        int gsz = net->per_host;
        if (gsz < 2 || p % gsz) return INFINITY;
        int H = p / gsz;
        return 2.0 * (gsz - 1) / gsz * n + 2.0 * (H - 1) / H * n / gsz;
    }
    case DP_PLAN_PS: return n;
    default: return INFINITY;
    }
}

/* ---- buckets ------------------------------------------------------------------------ */

size_t dp_plan_auto_cap(int64_t num_params) {
    size_t q = (size_t)num_params * sizeof(float) / 4;
    return q < (1u << 20) ? 1u << 20 : q > (25u << 20) ? 25u << 20 : q;
}

int dp_plan_buckets(const int64_t *layers, int nlayers, size_t cap_bytes, size_t first_bytes,
                    struct dp_plan_bucket **out) {
    *out = NULL;
    if (nlayers < 1) return dp_seterr(DP_EINVAL, "plan: no layers");
    if (cap_bytes < sizeof(float) || first_bytes < sizeof(float))
        return dp_seterr(DP_EINVAL, "plan: bucket sizes must be at least 4 bytes");
    struct dp_plan_bucket *b = dp_calloc((size_t)nlayers, sizeof *b);
    if (!b) return dp_seterr(DP_ENOMEM, "plan: out of memory");
    int64_t off = 0;
    for (int i = 0; i < nlayers; i++) off += layers[i];
    int nb = 0;
    struct dp_plan_bucket *cur = NULL;
    for (int i = nlayers - 1; i >= 0; i--) { /* off: the end of layer i */
        int64_t c = layers[i];
        off -= c;
        if (c == 0) continue;
        size_t limit = cur == b ? first_bytes : cap_bytes;
        if (cur && (size_t)(cur->count + c) * sizeof(float) > limit) cur = NULL;
        if (!cur) cur = &b[nb++];
        cur->off = off, cur->count += c;
        cur->first_layer = i, cur->nlayers++;
    }
    *out = b;
    return nb;
}

/* The floats of the largest two adjacent ranges under a unit: the reducer's buckets with both
 * caps lowered to the unit, and each layer the unit cut its ranges, which nothing merges with
 * (src/ddp/reducer.c plan). */
static int64_t unit_pair(const struct dp_plan_params *p, const int64_t *layers, size_t cap) {
    const size_t u = p->unit_bytes, first = p->first_bucket_bytes ? p->first_bucket_bytes : 1u << 20;
    if (cap > u) cap = u;
    int64_t pair = 0, prev = 0, cur = -1; /* cur: the open bucket's floats (-1: none) */
    int nb = 0, at = 0;
    for (int i = 0; p->unit_nranges && i < p->nlayers; i++) at += p->unit_nranges[i];
#define EMIT(x) (pair = (x) + prev > pair ? (x) + prev : pair, prev = (x), nb++)
    for (int i = p->nlayers - 1; i >= 0; i--) {
        int64_t c = layers[i];
        int nr = p->unit_nranges ? p->unit_nranges[i] : 0;
        at -= nr;
        if (c == 0) continue;
        if (nr > 0) {
            if (cur >= 0) EMIT(cur), cur = -1;
            for (int k = 0; k < nr; k++) EMIT(p->unit_ranges[at + k]);
            continue;
        }
        size_t limit = nb == 0 ? (first < u ? first : u) : cap;
        if (cur >= 0 && (size_t)(cur + c) * sizeof(float) > limit) EMIT(cur), cur = -1;
        cur = cur < 0 ? c : cur + c;
    }
    if (cur >= 0) EMIT(cur);
#undef EMIT
    return pair;
}

/* ---- one step ------------------------------------------------------------------------ */

struct dp_plan_params dp_plan_default_params(void) {
    struct dp_plan_params p = {.tokens = 1, .bytes_per_elem = 4, .compress = 1, .first_bucket_bytes = 1u << 20,
                               .overlap = 1, .algo = -1, .opt_state_bytes = 8, .batch = 1};
    p.net.workers = 1, p.net.shards = 1;
    dp_plan_net_link(&p.net, 5e-6, 100e9 / 8);
    p.net.intra_alpha_s = 1e-6, p.net.intra_beta_s = 1 / 100e9;
    p.flops = 1e12;
    return p;
}

void dp_plan_sample_times(const struct dp_plan_params *p, double b, double *fwd, double *bwd) {
    *fwd = p->fwd_sample_s, *bwd = p->bwd_sample_s;
    int n = p->cal_n;
    if (n < 1 || !(b > 0)) return;
    if (b <= p->cal_batch[0] || n == 1) {
        *fwd = p->cal_fwd[0], *bwd = p->cal_bwd[0];
        return;
    }
    if (b >= p->cal_batch[n - 1]) {
        *fwd = p->cal_fwd[n - 1], *bwd = p->cal_bwd[n - 1];
        return;
    }
    int i = 0;
    while (i + 2 < n && b > p->cal_batch[i + 1]) i++;
    double u = log(b / p->cal_batch[i]) / log(p->cal_batch[i + 1] / p->cal_batch[i]); /* (in log b) */
    *fwd = p->cal_fwd[i] + u * (p->cal_fwd[i + 1] - p->cal_fwd[i]);
    *bwd = p->cal_bwd[i] + u * (p->cal_bwd[i + 1] - p->cal_bwd[i]);
}

void dp_plan_result_free(struct dp_plan_result *r) {
    if (!r) return;
    dp_free(r->b);
    memset(r, 0, sizeof *r);
}

static int check(const struct dp_plan_params *p) {
#define BAD(...) return dp_seterr(DP_EINVAL, "plan: " __VA_ARGS__)
    const struct dp_plan_net *n = &p->net;
    if (n->workers < 1 || n->workers > 100000000) BAD("workers %d: expected 1..1e8", n->workers);
    if (n->per_host < 0 || (n->per_host > 1 && n->workers % n->per_host))
        BAD("workers %d is not a multiple of %d per host", n->workers, n->per_host);
    if (n->shards < 1) BAD("shards %d: expected >= 1", n->shards);
    for (int a = 0; a < DP_PLAN_ALGO_COUNT; a++)
        if (!(n->alpha_s[a] >= 0 && n->alpha_s[a] < 1e3 && n->beta_s[a] >= 0 && n->beta_s[a] < 1e3))
            BAD("%s: latency %g s, %g s per byte", algo_names[a], n->alpha_s[a], n->beta_s[a]);
    if (!(n->intra_alpha_s >= 0 && n->intra_beta_s >= 0 && n->gamma_s >= 0 && n->gamma_s < 1e3))
        BAD("bad intra-host link or reduction rate");
    if (n->tab_n < 0 || (n->tab_n > 0 && !n->tab_bytes)) BAD("measured table: %d sizes", n->tab_n);
    for (int i = 0; i < n->tab_n; i++) {
        if (!(n->tab_bytes[i] > 0) || (i && !(n->tab_bytes[i] > n->tab_bytes[i - 1])))
            BAD("measured table: sizes must be > 0 and ascending (size %d: %g)", i, n->tab_bytes[i]);
        for (int a = 0; a < DP_PLAN_ALGO_COUNT; a++)
            if (n->tab_s[a] && !(n->tab_s[a][i] > 0 && n->tab_s[a][i] < 1e6))
                BAD("measured table: %s at %g bytes: %g s", algo_names[a], n->tab_bytes[i], n->tab_s[a][i]);
    }
    if (!p->layers && !(p->params >= 1 && p->params <= (int64_t)1 << 50)) BAD("params %lld: expected 1..2^50", (long long)p->params);
    if (p->nlayers < 1 || p->nlayers > 10000000) BAD("layers %d: expected 1..1e7", p->nlayers);
    if (!(p->tokens >= 1 && p->tokens < 1e9)) BAD("tokens per sample %g", p->tokens);
    if (!(p->flops > 0 && p->flops < 1e20) && !(p->sample_s > 0)) BAD("flops %g: expected > 0", p->flops);
    if (!(p->sample_s >= 0 && p->sample_s < 1e6)) BAD("seconds per sample %g", p->sample_s);
    if (p->batch < n->workers) BAD("global batch %lld is smaller than the %d workers", (long long)p->batch, n->workers);
    if (p->bytes_per_elem != 2 && p->bytes_per_elem != 4) BAD("bytes per element %d: expected 2 or 4", p->bytes_per_elem);
    if (!(p->compress >= 1 && p->compress <= 1e6)) BAD("compression ratio %g: expected >= 1", p->compress);
    if (p->algo < -1 || p->algo >= DP_PLAN_ALGO_COUNT) BAD("algorithm %d", p->algo);
    if (p->algo == DP_PLAN_HIER && n->per_host < 2) BAD("hier needs workers per host >= 2");
    if (!(p->opt_s >= 0 && p->opt_s < 1e6) || !(p->opt_state_bytes >= 0 && p->opt_state_bytes <= 64))
        BAD("bad optimizer time or state bytes");
    if (!(p->fwd_sample_s >= 0 && p->fwd_sample_s < 1e6 && p->bwd_sample_s >= 0 && p->bwd_sample_s < 1e6) ||
        (p->fwd_sample_s > 0) != (p->bwd_sample_s > 0))
        BAD("forward %g s, backward %g s per sample: give both (> 0) or neither", p->fwd_sample_s, p->bwd_sample_s);
    if (!(p->opt_param_s >= 0 && p->opt_param_s < 1) || !(p->zero_param_s >= 0 && p->zero_param_s < 1) ||
        !(p->data_sample_s >= 0 && p->data_sample_s < 1e6))
        BAD("optimizer %g s and zeroing %g s per parameter, data %g s per sample: expected >= 0",
            p->opt_param_s, p->zero_param_s, p->data_sample_s);
    if (!(p->comm_cpu >= 0 && p->comm_cpu <= 1)) BAD("comm_cpu %g: expected 0..1", p->comm_cpu);
    if (p->gathers < 0 || p->gathers > 1000) BAD("gathers per step %d: expected 0..1000", p->gathers);
    if (!(p->gather_wait_s >= 0 && p->gather_wait_s < 1e3)) BAD("gather wait %g s: expected >= 0", p->gather_wait_s);
    if (!(p->compute_cv >= 0 && p->compute_cv <= 10 && p->straggle_cv >= 0 && p->straggle_cv <= 10) ||
        p->straggle_workers < 0)
        BAD("compute spread %g, straggle %g at %d workers: expected 0..10", p->compute_cv, p->straggle_cv,
            p->straggle_workers);
#undef BAD
    return DP_OK;
}

int dp_plan_run(const struct dp_plan_params *p, struct dp_plan_result *r) {
    memset(r, 0, sizeof *r);
    int rc = check(p);
    if (rc) return rc;
    int L = p->nlayers, P = p->net.workers;
    int64_t *own = NULL;
    const int64_t *layers = p->layers;
    if (!layers) { /* nlayers equal layers (the first ones take the remainder) */
        if (p->params < L) return dp_seterr(DP_EINVAL, "plan: %d layers of %lld parameters", L, (long long)p->params);
        own = dp_malloc(sizeof *own * (size_t)L);
        if (!own) return dp_seterr(DP_ENOMEM, "plan: out of memory");
        for (int i = 0; i < L; i++) own[i] = p->params / L + (i < p->params % L);
        layers = own;
    }
    double psi = 0, fwd_flops = 0;
    for (int i = 0; i < L; i++) {
        psi += (double)layers[i];
        fwd_flops += p->layer_flops ? p->layer_flops[i] : 2.0 * (double)layers[i] * p->tokens;
    }
    double b_local = (double)p->batch / P, fps, bps;
    dp_plan_sample_times(p, b_local, &fps, &bps);
    /* seconds per forward FLOP of this worker's share, and backward's
     * seconds per (forward) FLOP of its layers: twice, unless measured */
    double sec_per_flop = p->fwd_sample_s > 0 ? fps * b_local / fwd_flops
                          : p->sample_s > 0   ? p->sample_s * b_local / (3 * fwd_flops)
                                              : b_local / p->flops;
    double bwd_per_flop = p->fwd_sample_s > 0 ? bps * b_local / fwd_flops : 2 * sec_per_flop;
    r->compute = p->fwd_sample_s > 0 ? DP_PLAN_COMPUTE_CALIBRATED
                 : p->sample_s > 0   ? DP_PLAN_COMPUTE_SAMPLE
                                     : DP_PLAN_COMPUTE_FLOPS;
    r->fwd_s = fwd_flops * sec_per_flop;
    r->bwd_s = fwd_flops * bwd_per_flop;
    r->opt_s = p->opt_s + psi * p->opt_param_s;
    r->zero_s = psi * p->zero_param_s;

    size_t cap = p->bucket_cap_bytes ? p->bucket_cap_bytes : dp_plan_auto_cap((int64_t)psi);
    int nb = dp_plan_buckets(layers, L, cap, p->first_bucket_bytes ? p->first_bucket_bytes : 1u << 20, &r->b);
    if (nb < 0) {
        dp_free(own);
        return nb;
    }
    r->nb = nb;
    /* the backward end time of each layer, visited from the last */
    double t = r->fwd_s, prev_done = 0, bwd_end = r->fwd_s + r->bwd_s;
    int k = 0;
    for (int i = L - 1; i >= 0 && k < nb; i--) {
        double lf = p->layer_flops ? p->layer_flops[i] : 2.0 * (double)layers[i] * p->tokens;
        t += lf * bwd_per_flop;
        if (i != r->b[k].first_layer) continue;
        struct dp_plan_bucket *b = &r->b[k++];
        b->bytes = (double)b->count * p->bytes_per_elem / p->compress;
        b->ready_s = p->overlap ? t : bwd_end;
        int best = 0;
        for (int a = 0; a < DP_PLAN_ALGO_COUNT; a++) {
            b->algo_s[a] = dp_plan_allreduce_s(a, b->bytes, &p->net);
            if (b->algo_s[a] < b->algo_s[best]) best = a;
        }
        b->algo = p->algo >= 0 ? p->algo : best;
        b->start_s = b->ready_s > prev_done ? b->ready_s : prev_done;
        b->done_s = prev_done = b->start_s + b->algo_s[b->algo];
        r->comm_s += b->algo_s[b->algo];
        double o0 = b->start_s > r->fwd_s ? b->start_s : r->fwd_s, o1 = b->done_s < bwd_end ? b->done_s : bwd_end;
        if (o1 > o0) r->overlap_s += o1 - o0;
        r->sent_bytes += dp_plan_sent_bytes(b->algo, b->bytes, &p->net);
        r->grad_bytes += b->bytes;
    }
    r->exposed_s = prev_done > bwd_end ? prev_done - bwd_end : 0;
    r->steal_s = p->comm_cpu * r->overlap_s;
    double spread = P < 2 ? 0 : P == p->straggle_workers && p->straggle_cv > 0 ? p->straggle_cv
                                                         : p->compute_cv > 0 ? dp_plan_normal_max(P) * p->compute_cv : 0;
    r->straggle_s = spread * (r->fwd_s + r->bwd_s + r->steal_s);
    double ng = 8.0 * P;
    r->gather_s = P > 1 ? p->gathers * ((P - 1) * p->net.alpha_s[DP_PLAN_RING] + (P - 1) * ng / P * p->net.beta_s[DP_PLAN_RING] +
                                        p->gather_wait_s)
                        : 0;
    double rest = r->zero_s + bwd_end + r->steal_s + r->straggle_s + r->exposed_s + r->opt_s + r->gather_s, D = b_local * p->data_sample_s;
    r->data_s = (D > rest ? D - rest : 0) + p->comm_cpu * (D < rest ? D : rest);
    r->step_s = r->data_s + rest;
    r->efficiency = r->step_s > 0 ? (r->data_s + r->zero_s + r->fwd_s + r->bwd_s + r->opt_s) / r->step_s : 1;
    r->samples_per_s = r->step_s > 0 ? (double)p->batch / r->step_s : INFINITY;
    /* fp32 weights and gradients (4 bytes each) and S bytes of optimizer
     * state per parameter; ZeRO shards the state (1), the gradients (2) and
     * the weights (3) over the P workers */
    double S = p->opt_state_bytes;
    r->mem_bytes[0] = (8 + S) * psi;
    r->mem_bytes[1] = 8 * psi + S * psi / P;
    r->mem_bytes[2] = 4 * psi + (4 + S) * psi / P;
    r->mem_bytes[3] = (8 + S) * psi / P;
    /* The units in flight: the library's rule (dp_zero_inflight_of_pair) on the largest two
     * adjacent buckets, when the state is sharded (P > 1). */
    int64_t pair = r->nb ? r->b[0].count : 0;
    for (int j = 0; j + 1 < r->nb; j++)
        if (r->b[j].count + r->b[j + 1].count > pair) pair = r->b[j].count + r->b[j + 1].count;
    if (p->unit_bytes) pair = unit_pair(p, layers, cap);
    memset(r->mem_inflight, 0, sizeof r->mem_inflight);
    if (P > 1) {
        r->mem_inflight[2] = (double)dp_zero_inflight_of_pair(2, pair);
        r->mem_inflight[3] = (double)dp_zero_inflight_of_pair(3, pair);
    }
    dp_free(own);
    return DP_OK;
}

/* e_p = ∫ x p φ(x) Φ(x)^(p-1) dx by Simpson's rule on [-10, 10] (the
 * integrand is below 1e-20 outside for p <= 1e8: the max of 1e8 normals
 * lies near 5.6), Φ^(p-1) as exp((p-1) log Φ) with log Φ from erfc so that
 * it does not round to 0 in the upper tail. */
double dp_plan_normal_max(int p) {
    if (p <= 1) return 0;
    const int n = 8000;
    const double a = -10, h = 20.0 / n;
    double s = 0;
    for (int i = 0; i <= n; i++) {
        double x = a + i * h;
        double logphi = x > 0 ? log1p(-0.5 * erfc(x / sqrt(2.0))) : log(0.5 * erfc(-x / sqrt(2.0))); /* log Φ(x) */
        double f = x * p * exp(-0.5 * x * x) / sqrt(2 * M_PI) * exp((p - 1) * logphi);
        s += f * (i == 0 || i == n ? 1 : i % 2 ? 4 : 2);
    }
    return s * h / 3;
}

/* ---- calibration ----------------------------------------------------------------------- */

int dp_plan_fit(int algo, int p, double gamma_s, const double *bytes, const double *t, int n, double *alpha_s,
                double *beta_s) {
    if (algo < 0 || algo == DP_PLAN_HIER || algo >= DP_PLAN_ALGO_COUNT || p < 2 || n < 2)
        return dp_seterr(DP_EINVAL, "fit: needs ring, rhd, tree or ps, p >= 2 and two sizes or more");
    /* the coefficients of α, β and the γ term at each size, from the model itself */
    struct dp_plan_net unit = {.workers = p, .shards = 1};
    double saa = 0, sab = 0, sbb = 0, say = 0, sby = 0;
    for (int i = 0; i < n; i++) {
        if (!(t[i] > 0 && bytes[i] > 0)) return dp_seterr(DP_EINVAL, "fit: size %d: time %g s, %g bytes", i, t[i], bytes[i]);
        unit.alpha_s[algo] = 1, unit.beta_s[algo] = 0, unit.gamma_s = 0;
        double A = dp_plan_allreduce_s(algo, bytes[i], &unit);
        unit.alpha_s[algo] = 0, unit.beta_s[algo] = 1;
        double B = dp_plan_allreduce_s(algo, bytes[i], &unit);
        unit.beta_s[algo] = 0, unit.gamma_s = gamma_s;
        double y = t[i] - dp_plan_allreduce_s(algo, bytes[i], &unit), w = 1 / (t[i] * t[i]);
        saa += w * A * A, sab += w * A * B, sbb += w * B * B, say += w * A * y, sby += w * B * y;
    }
    double det = saa * sbb - sab * sab;
    if (!(fabs(det) > 1e-300 * (saa * sbb)) || !(sbb > 0)) return dp_seterr(DP_EINVAL, "fit: the sizes do not separate α from β");
    double a = (say * sbb - sab * sby) / det, b = (saa * sby - sab * say) / det;
    if (a < 0) a = 0, b = sby / sbb; /* β alone */
    if (b < 0) b = 0;
    *alpha_s = a, *beta_s = b;
    return DP_OK;
}
