/* The discrete-event simulator of training steps (dp/plan.h).
 *
 * What is simulated.  P workers, each with a compute time per step drawn
 * from (seed, worker, step) by counter-based RNG, so a draw does not depend
 * on the order in which the simulation visits workers.  Communication is a
 * fixed time (comm_s) that a worker spends transferring, and the parameter
 * server is a FIFO queue.  No network contention beyond that: the analytic
 * model (plan.c) says what comm_s a given network and model give.
 *
 * The four modes and their cost (P workers, K steps):
 *   sync    step k takes max_w c(w, k) + comm: one pass with a running max,
 *           O(K P) time, O(P) memory.
 *   backup  step k closes at the (P - b)-th earliest gradient; the others are
 *           dropped and their workers join the next step when free.  One
 *           quickselect per step: O(K P) expected time.
 *   ssp     worker w starts step k when its own step k-1 is committed and
 *           every worker has committed step k-1-s (the bound).  That start
 *           depends only on steps < k, so the steps are visited in order (all
 *           workers of step k, then k+1) with a ring of the last s+1 "all
 *           committed" times M_j: O(K P log s) time (a binary search in the
 *           ring for the staleness), O(P + s) memory.  s = 0 is exactly sync.
 *   async   pushes reach the server in time order through a binary heap of
 *           the P next arrivals: O(K P log P) time, O(P) memory.
 * 20,000 workers x 1,000 steps is 2e7 worker-steps: 1.4 s (sync) to 4.3 s
 * (async) of CPU on one core here (bench/simulate_speed.sh, docs/plan.md). */
#include <math.h>
#include <string.h>

#include "dp/core.h"
#include "dp/plan.h"

static const char *const mode_names[DP_SIM_MODE_COUNT] = {"sync", "ssp", "async", "backup"};

const char *dp_sim_mode_name(enum dp_sim_mode m) {
    return (unsigned)m < DP_SIM_MODE_COUNT ? mode_names[m] : "?";
}

int dp_sim_mode_parse(const char *name) {
    for (int i = 0; name && i < DP_SIM_MODE_COUNT; i++)
        if (!strcmp(name, mode_names[i])) return i;
    return dp_seterr(DP_EINVAL, "unknown mode '%s' (expected sync, ssp, async or backup)", name ? name : "");
}

struct dp_sim_params dp_sim_default_params(void) {
    struct dp_sim_params p = {.mode = DP_SIM_SYNC, .workers = 1, .steps = 100, .batch = 1, .compute_mean_s = 0.1,
                              .shards = 1, .seed = 1};
    return p;
}

void dp_sim_result_free(struct dp_sim_result *r) {
    if (!r) return;
    dp_free(r->idle);
    dp_free(r->stale_hist);
    memset(r, 0, sizeof *r);
}

/* ---- draws -------------------------------------------------------------------- */

/* The compute time of worker w in its step k (see dp_sim_params). */
static double draw(const struct dp_sim_params *p, int w, int64_t k) {
    double base;
    if (p->trace) {
        base = p->trace[dp_rng_u32(p->seed, DP_RNG_SIM, (uint64_t)w, (uint64_t)k) % (uint64_t)p->trace_len];
    } else {
        base = p->compute_mean_s;
        if (p->compute_sd_s > 0) base += p->compute_sd_s * (double)dp_rng_normal(p->seed, DP_RNG_SIM, (uint64_t)w, (uint64_t)k);
        if (base < 0) base = 0;
    }
    double m = p->slow ? p->slow[w] : 1;
    uint64_t a = (uint64_t)w, b = 2 * (uint64_t)k;
    if (p->sigma > 0) { /* the trainer's lognormal slowdown: only factors above 1 apply */
        double f = exp(p->sigma * (double)dp_rng_normal(p->seed, DP_RNG_SLOW, a, b + 1));
        if (f > 1) m *= f;
    }
    double c = base * m;
    if (p->stall_p > 0 && (double)dp_rng_uniform(p->seed, DP_RNG_SLOW, a, b) < p->stall_p) c += p->stall_s;
    return c;
}

/* ---- staleness histogram ------------------------------------------------------------ */

enum { HIST_MAX = 1 << 20 }; /* bins; larger staleness counts in the last bin (the max stays exact) */

struct hist {
    int64_t *n;
    int64_t len, cap, count, max;
    double sum;
};

static int hist_add(struct hist *h, int64_t v) {
    h->count++, h->sum += (double)v;
    if (v > h->max) h->max = v;
    int64_t bin = v < HIST_MAX - 1 ? v : HIST_MAX - 1;
    if (bin >= h->cap) {
        int64_t cap = h->cap ? h->cap : 64;
        while (cap <= bin) cap *= 2;
        if (cap > HIST_MAX) cap = HIST_MAX;
        int64_t *n = dp_calloc((size_t)cap, sizeof *n);
        if (!n) return dp_seterr(DP_ENOMEM, "simulate: out of memory");
        if (h->n) memcpy(n, h->n, (size_t)h->len * sizeof *n);
        dp_free(h->n);
        h->n = n, h->cap = cap;
    }
    if (bin >= h->len) h->len = bin + 1;
    h->n[bin]++;
    return DP_OK;
}

/* The smallest v with at least q of the counts at or below it. */
static int64_t hist_quantile(const struct hist *h, double q) {
    if (!h->count) return 0;
    double need = q * (double)h->count, acc = 0;
    for (int64_t i = 0; i < h->len; i++)
        if ((acc += (double)h->n[i]) >= need) return i == HIST_MAX - 1 ? h->max : i;
    return h->max;
}

/* ---- the modes ---------------------------------------------------------------------- */

static void run_sync(const struct dp_sim_params *p, double *busy, double *T) {
    double t = 0;
    for (int64_t k = 0; k < p->steps; k++) {
        double mx = 0;
        for (int w = 0; w < p->workers; w++) {
            double c = draw(p, w, k);
            busy[w] += c + p->comm_s;
            if (c > mx) mx = c;
        }
        t += mx + p->comm_s;
    }
    *T = t;
}

/* The k-th smallest of a[0..n) (0-based), reordering a: Hoare's quickselect
 * with a median-of-three pivot, O(n) expected. */
static double select_kth(double *a, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        double x = a[lo], y = a[mid], z = a[hi];
        double piv = x < y ? (y < z ? y : x < z ? z : x) : (x < z ? x : y < z ? z : y);
        int i = lo, j = hi;
        while (i <= j) {
            while (a[i] < piv) i++;
            while (a[j] > piv) j--;
            if (i <= j) {
                double tmp = a[i];
                a[i] = a[j], a[j] = tmp;
                i++, j--;
            }
        }
        if (k <= j) hi = j;
        else if (k >= i) lo = i;
        else return a[k];
    }
    return a[k];
}

static int run_backup(const struct dp_sim_params *p, double *busy, double *T) {
    int P = p->workers;
    double *fin = dp_malloc(sizeof(double) * (size_t)P), *tmp = dp_malloc(sizeof(double) * (size_t)P),
           *freeat = dp_calloc((size_t)P, sizeof(double));
    if (!fin || !tmp || !freeat) {
        dp_free(fin), dp_free(tmp), dp_free(freeat);
        return dp_seterr(DP_ENOMEM, "simulate: out of memory");
    }
    double S = 0; /* the start of the current step: its parameters are published */
    for (int64_t k = 0; k < p->steps; k++) {
        for (int w = 0; w < P; w++) {
            double st = freeat[w] > S ? freeat[w] : S; /* a dropped worker joins when free */
            double c = draw(p, w, k);
            fin[w] = st + c;
            busy[w] += c;
        }
        memcpy(tmp, fin, sizeof(double) * (size_t)P);
        double F = select_kth(tmp, P, P - p->backup - 1);
        double next = F + p->comm_s;
        for (int w = 0; w < P; w++) {
            if (fin[w] <= F) busy[w] += p->comm_s, freeat[w] = next; /* its gradient is in */
            else freeat[w] = fin[w];                                 /* dropped: busy until fin */
        }
        S = next;
    }
    /* compute still running at the end is not part of the simulated time */
    for (int w = 0; w < P; w++)
        if (freeat[w] > S) busy[w] -= freeat[w] - S;
    *T = S;
    dp_free(fin), dp_free(tmp), dp_free(freeat);
    return DP_OK;
}

static int run_ssp(const struct dp_sim_params *p, double *busy, double *T, struct hist *h) {
    int P = p->workers;
    int64_t s = p->bound < p->steps ? p->bound : p->steps, R = s + 1;
    double *d = dp_calloc((size_t)P, sizeof(double));  /* worker w's last commit */
    double *M = dp_calloc((size_t)R, sizeof(double));  /* M[j mod R]: every worker committed step j */
    if (!d || !M) {
        dp_free(d), dp_free(M);
        return dp_seterr(DP_ENOMEM, "simulate: out of memory");
    }
    int rc = DP_OK;
    double tmax = 0;
    for (int64_t k = 0; k < p->steps && !rc; k++) {
        int64_t gate = k - 1 - s; /* the step everyone must have committed; < 0: none */
        double mk = 0;
        for (int w = 0; w < P && !rc; w++) {
            double start = d[w];
            if (gate >= 0 && M[gate % R] > start) start = M[gate % R];
            /* staleness: k - 1 - j*, j* the last step with M_j <= start (M is
             * nondecreasing in j); j* >= gate, so search (gate, k-1] */
            int64_t lo = gate, hi = k - 1; /* invariant: M_lo <= start (lo = gate < 0: none), answer in [lo, hi] */
            if (lo < -1) lo = -1;
            while (lo < hi) {
                int64_t mid = lo + (hi - lo + 1) / 2;
                if (M[mid % R] <= start) lo = mid;
                else hi = mid - 1;
            }
            rc = hist_add(h, k - 1 - lo);
            double c = draw(p, w, k);
            d[w] = start + c + p->comm_s;
            busy[w] += c + p->comm_s;
            if (d[w] > mk) mk = d[w];
        }
        M[k % R] = mk;
        if (mk > tmax) tmax = mk;
    }
    *T = tmax;
    dp_free(d), dp_free(M);
    return rc;
}

/* The heap of next arrivals at the server, ordered by (time, worker): ties
 * go to the lower worker, so the order is a pure function of the times. */
struct arrival {
    double t;
    int w;
};
static int before(const struct arrival *a, const struct arrival *b) {
    return a->t < b->t || (a->t == b->t && a->w < b->w);
}
static void sift_down(struct arrival *hp, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, m = i;
        if (l < n && before(&hp[l], &hp[m])) m = l;
        if (l + 1 < n && before(&hp[l + 1], &hp[m])) m = l + 1;
        if (m == i) return;
        struct arrival t = hp[i];
        hp[i] = hp[m], hp[m] = t, i = m;
    }
}

/* Each of the S shards holds 1/S of the parameters and every push carries a
 * slice for every shard, so the S queues see the same arrivals with the same
 * service time server_s / S and stay in lockstep: one queue stands for all.
 * The transfer comm_s is split: half to push (before the arrival), half to
 * pull (after the service).  The run ends when the server has applied P x
 * steps pushes, whoever sent them: a slow worker sends fewer, as it would. */
static int run_async(const struct dp_sim_params *p, double *busy, double *T, struct hist *h) {
    int P = p->workers;
    struct arrival *hp = dp_malloc(sizeof *hp * (size_t)P);
    int64_t *read = dp_calloc((size_t)P, sizeof *read), *done = dp_calloc((size_t)P, sizeof *done);
    if (!hp || !read || !done) {
        dp_free(hp), dp_free(read), dp_free(done);
        return dp_seterr(DP_ENOMEM, "simulate: out of memory");
    }
    double half = p->comm_s / 2, svc = p->server_s / p->shards, freeat = 0, back = 0;
    for (int w = 0; w < P; w++) {
        double c = draw(p, w, 0);
        busy[w] += c + p->comm_s;
        hp[w] = (struct arrival){c + half, w};
    }
    for (int i = P / 2 - 1; i >= 0; i--) sift_down(hp, P, i);
    int rc = DP_OK;
    int64_t total = p->steps * P;
    for (int64_t version = 0; version < total && !rc; version++) {
        struct arrival a = hp[0];
        double start = a.t > freeat ? a.t : freeat;
        freeat = start + svc;
        rc = hist_add(h, version - read[a.w]);
        read[a.w] = version + 1; /* the pull returns the parameters with this push in */
        back = freeat + half;    /* nondecreasing: the queue is FIFO */
        double c = draw(p, a.w, ++done[a.w]);
        busy[a.w] += c + p->comm_s;
        hp[0] = (struct arrival){back + c + half, a.w};
        sift_down(hp, P, 0);
    }
    /* The run ends with the last pull (back); work past it is not counted.
     * Each worker's pending round was counted whole (c + comm): past the end
     * lie its compute and push beyond back, and its pull. */
    for (int i = 0; i < P; i++) {
        double over = (hp[i].t > back ? hp[i].t - back : 0) + half;
        busy[hp[i].w] -= over < busy[hp[i].w] ? over : busy[hp[i].w];
    }
    *T = back;
    dp_free(hp), dp_free(read), dp_free(done);
    return rc;
}

/* ---- entry ----------------------------------------------------------------------- */

static int check(const struct dp_sim_params *p) {
#define BAD(...) return dp_seterr(DP_EINVAL, "simulate: " __VA_ARGS__)
    if ((unsigned)p->mode >= DP_SIM_MODE_COUNT) BAD("unknown mode %d", (int)p->mode);
    if (p->workers < 1 || p->workers > 10000000) BAD("workers %d: expected 1..10000000", p->workers);
    if (p->steps < 1 || p->steps > 100000000) BAD("steps %lld: expected 1..100000000", (long long)p->steps);
    if ((double)p->steps * p->workers > 1e10) BAD("workers x steps is over 1e10");
    if (p->batch < 1) BAD("batch %lld: expected >= 1", (long long)p->batch);
    if (!(p->compute_mean_s >= 0 && p->compute_mean_s < 1e6)) BAD("compute mean %g s: expected 0..1e6", p->compute_mean_s);
    if (!(p->compute_sd_s >= 0 && p->compute_sd_s < 1e6)) BAD("compute sd %g s: expected 0..1e6", p->compute_sd_s);
    if (!(p->stall_p >= 0 && p->stall_p <= 1)) BAD("stall probability %g: expected 0..1", p->stall_p);
    if (!(p->stall_s >= 0 && p->stall_s < 1e6)) BAD("stall %g s: expected 0..1e6", p->stall_s);
    if (!(p->sigma >= 0 && p->sigma <= 10)) BAD("lognormal sigma %g: expected 0..10", p->sigma);
    if (!(p->comm_s >= 0 && p->comm_s < 1e6)) BAD("comm %g s: expected 0..1e6", p->comm_s);
    if (p->bound < 0) BAD("ssp bound %d: expected >= 0", p->bound);
    if (p->backup < 0 || p->backup >= p->workers) BAD("backup %d: expected 0..P-1 = %d", p->backup, p->workers - 1);
    if (p->shards < 1) BAD("shards %d: expected >= 1", p->shards);
    if (!(p->server_s >= 0 && p->server_s < 1e6)) BAD("server time %g s: expected 0..1e6", p->server_s);
    for (int w = 0; p->slow && w < p->workers; w++)
        if (!(p->slow[w] >= 0 && p->slow[w] <= 1e6)) BAD("worker %d: slow factor %g", w, p->slow[w]);
    if (p->trace) {
        if (p->trace_len < 1) BAD("the trace is empty");
        for (int64_t i = 0; i < p->trace_len; i++)
            if (!(p->trace[i] >= 0 && p->trace[i] < 1e6)) BAD("trace entry %lld: %g s", (long long)i, p->trace[i]);
    }
#undef BAD
    return DP_OK;
}

int dp_sim_run(const struct dp_sim_params *p, struct dp_sim_result *r) {
    memset(r, 0, sizeof *r);
    int rc = check(p);
    if (rc) return rc;
    int P = p->workers;
    r->idle = dp_calloc((size_t)P, sizeof(double)); /* busy time first, idle fraction after */
    if (!r->idle) return dp_seterr(DP_ENOMEM, "simulate: out of memory");
    struct hist h = {0};
    double T = 0;
    switch (p->mode) {
    case DP_SIM_SYNC: run_sync(p, r->idle, &T); break;
    case DP_SIM_BACKUP: rc = run_backup(p, r->idle, &T); break;
    case DP_SIM_SSP: rc = run_ssp(p, r->idle, &T, &h); break;
    default: rc = run_async(p, r->idle, &T, &h); break;
    }
    if (rc) {
        dp_free(h.n);
        dp_sim_result_free(r);
        return rc;
    }
    r->time_s = T;
    r->updates = p->mode == DP_SIM_ASYNC ? p->steps * P : p->steps;
    int contrib = p->mode == DP_SIM_BACKUP ? P - p->backup : P;
    if (T > 0) {
        r->steps_per_s = (double)p->steps / T;
        r->samples_per_s = (double)p->steps * contrib * (double)p->batch / T;
    } else {
        r->steps_per_s = r->samples_per_s = INFINITY; /* nothing takes time */
    }
    r->idle_min = 1, r->idle_max = -1;
    double sum = 0;
    for (int w = 0; w < P; w++) {
        double f = T > 0 ? 1 - r->idle[w] / T : 0;
        if (f < 0) f = 0; /* rounding: busy can exceed T by an ulp */
        r->idle[w] = f, sum += f;
        if (f < r->idle_min) r->idle_min = f;
        if (f > r->idle_max) r->idle_max = f, r->idle_max_worker = w;
    }
    r->idle_mean = sum / P;
    if (h.count) {
        r->stale_mean = h.sum / (double)h.count;
        r->stale_p50 = hist_quantile(&h, 0.5), r->stale_p99 = hist_quantile(&h, 0.99), r->stale_max = h.max;
    }
    r->stale_hist = h.n, r->stale_hist_len = h.len;
    return DP_OK;
}
