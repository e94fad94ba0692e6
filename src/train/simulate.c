/* Slow workers on purpose: --simulate-slow and --simulate-jitter, and the
 * pacing that makes a worker's compute take the time they ask for. */
#include "trainer.h"

/* ---- slow workers on purpose (--simulate-slow, --simulate-jitter) --------------------------
 * A slowed rank sleeps (nanosleep: it never spins, so it leaves the core to
 * the others and a 2-core machine can emulate a cluster with one slow host)
 * (m - 1) x c per micro-batch, where c is the compute the rank really spent
 * on it (wall time from the end of its data wait, less the sleep) and
 * m = FACTOR x max(1, exp(SIGMA z)): a log-normal factor below 1 does
 * nothing (sleep cannot speed a worker up).  A jitter stall of MS ms is added
 * once per step, in the last micro-batch.
 *
 * Where the sleep goes.  With overlap the reducer starts a bucket's
 * all-reduce as soon as backward has finished its layers, so sleeping only
 * after backward would let the slowed rank's buckets start at full speed
 * (all but the last would not wait for it) and the wait would show up one
 * step late.  Instead the debt is paid at every grad_ready callback, before
 * the bucket is handed to the reducer: each bucket becomes ready at
 * t0 + m x (compute up to it), exactly when an m-times slower host's would,
 * and the rest (forward's share too when backward reports nothing) is paid
 * after backward, before the reduction is waited for.  Without a reduction
 * in the micro-batch (accumulation, one worker) it is all paid at its end;
 * deterministic mode reduces once after the last chunk, so it pays once,
 * before that all-reduce.  The draws are (seed, DP_RNG_SLOW, rank, 2 step)
 * for the stall and (..., 2 step + 1) for z: a run replays exactly. */
static int slow_err(const char *opt, const char *spec, const char *what) {
    return dp_seterr(DP_EINVAL, "%s '%s': %s", opt, spec, what);
}

int dp_parse_simulate_slow(const char *spec, int world, double *factor) {
    const char *o = "--simulate-slow";
    if (!spec || !*spec) return slow_err(o, spec ? spec : "", "expected RANK:FACTOR[,RANK:FACTOR...]");
    if (factor)
        for (int r = 0; r < world; r++) factor[r] = 0; /* 0: not named yet */
    char msg[160];
    for (const char *s = spec;;) {
        char *end;
        errno = 0;
        long r = strtol(s, &end, 10);
        if (end == s || *end != ':' || errno || (s[0] != '-' && (s[0] < '0' || s[0] > '9')))
            return slow_err(o, spec, "expected RANK:FACTOR[,RANK:FACTOR...]");
        const char *fs = end + 1;
        double f = strtod(fs, &end);
        if (end == fs || (*end && *end != ',') || (fs[0] != '.' && (fs[0] < '0' || fs[0] > '9')))
            return slow_err(o, spec, "expected RANK:FACTOR[,RANK:FACTOR...]");
        if (r < 0 || (world > 0 && r >= world)) {
            if (world > 0) snprintf(msg, sizeof msg, "rank %ld is out of range 0..%d (the job has %d rank%s)", r,
                                    world - 1, world, world > 1 ? "s" : "");
            else snprintf(msg, sizeof msg, "rank %ld is out of range (ranks count from 0)", r);
            return slow_err(o, spec, msg);
        }
        if (!(f >= 1 && f <= 1000)) {
            snprintf(msg, sizeof msg, "rank %ld: factor %g must be in 1..1000 (1 = full speed)", r, f);
            return slow_err(o, spec, msg);
        }
        if (factor) {
            if (factor[r] != 0) {
                snprintf(msg, sizeof msg, "rank %ld is given twice", r);
                return slow_err(o, spec, msg);
            }
            factor[r] = f;
        }
        if (!*end) break;
        s = end + 1;
    }
    if (factor)
        for (int r = 0; r < world; r++)
            if (factor[r] == 0) factor[r] = 1;
    return DP_OK;
}

int dp_parse_simulate_jitter(const char *spec, struct dp_jitter *j) {
    const char *o = "--simulate-jitter";
    memset(j, 0, sizeof *j);
    if (!spec || !*spec) return slow_err(o, spec ? spec : "", "expected p=P,ms=MS and/or lognormal=SIGMA");
    int have_p = 0, have_ms = 0, have_ln = 0;
    char msg[160];
    for (const char *s = spec;;) {
        const char *eq = strchr(s, '='), *comma = strchr(s, ',');
        if (!comma) comma = s + strlen(s);
        if (!eq || eq > comma) return slow_err(o, spec, "expected KEY=VALUE items (p, ms, lognormal)");
        size_t kl = (size_t)(eq - s);
        char *end;
        errno = 0;
        double v = strtod(eq + 1, &end);
        if (end == eq + 1 || end != comma || errno || !isfinite(v)) {
            snprintf(msg, sizeof msg, "'%.*s' is not KEY=NUMBER", (int)(comma - s), s);
            return slow_err(o, spec, msg);
        }
        if (kl == 1 && !strncmp(s, "p", 1)) {
            if (!(v >= 0 && v <= 1)) return slow_err(o, spec, "p must be in [0, 1]");
            j->p = v, have_p++;
        } else if (kl == 2 && !strncmp(s, "ms", 2)) {
            if (!(v >= 0 && v <= 1e6)) return slow_err(o, spec, "ms must be in 0..1000000");
            j->ms = v, have_ms++;
        } else if (kl == 9 && !strncmp(s, "lognormal", 9)) {
            if (!(v >= 0 && v <= 10)) return slow_err(o, spec, "lognormal SIGMA must be in 0..10");
            j->sigma = v, have_ln++;
        } else {
            snprintf(msg, sizeof msg, "unknown key '%.*s' (expected p, ms or lognormal)", (int)kl, s);
            return slow_err(o, spec, msg);
        }
        if (!*comma) break;
        s = comma + 1;
    }
    if (have_p > 1 || have_ms > 1 || have_ln > 1) return slow_err(o, spec, "a key is given twice");
    if (have_p != have_ms) return slow_err(o, spec, "p and ms go together (p=P,ms=MS)");
    return DP_OK;
}

/* This step's compute multiplier and stall (s) for worker w. */
void dp__pace_plan(const struct worker *w, double *mult, double *stall) {
    const struct dp_trainer *t = w->t;
    uint64_t a = (uint64_t)w->grank, b = 2 * (uint64_t)w->step;
    *mult = t->slow_factor ? t->slow_factor[w->grank] : 1;
    *stall = 0;
    if (t->jit.sigma > 0) {
        double f = exp(t->jit.sigma * (double)dp_rng_normal(t->p.run.seed, DP_RNG_SLOW, a, b + 1));
        if (f > 1) *mult *= f;
    }
    if (t->jit.p > 0 && (double)dp_rng_uniform(t->p.run.seed, DP_RNG_SLOW, a, b) < t->jit.p) *stall = t->jit.ms * 1e-3;
}

/* Starts pacing one micro-batch whose compute starts at t0. */
void dp__pace_start(struct worker *w, double mult, double stall, double t0) {
    w->pace_mult = mult, w->pace_stall = stall, w->pace_t0 = t0, w->pace_slept = 0;
}

/* Sleeps what this micro-batch owes so far: (m - 1) x its compute up to
 * now, plus the stall, less what it slept already (an oversleep is paid
 * back at the next point).  Debts under 50 us wait for the next point. */
void dp__pace_sleep(struct worker *w) {
    if (!w->t->simulate) return;
    double now = dp_time();
    double owed = (w->pace_mult - 1) * (now - w->pace_t0 - w->pace_slept) + w->pace_stall - w->pace_slept;
    if (owed < 50e-6) return;
    struct timespec ts = {(time_t)owed, (long)((owed - floor(owed)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    double t1 = dp_time();
    dp_timeline_add(&w->tl, "slow", 0, w->step, now, t1);
    w->pace_slept += t1 - now;
}

/* The grad_ready callback of a paced worker: pay the debt, then hand the
 * layer to the hook it stands in front of (the sync's: see above). */
void dp__paced_grad_ready(void *arg, int64_t offset, int64_t count) {
    struct worker *w = arg;
    dp__pace_sleep(w);
    w->pace_ready(w->pace_ready_arg, offset, count);
}
