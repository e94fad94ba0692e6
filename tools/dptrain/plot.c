/*
 * `dptrain plot --out DIR INPUT...`: SVG plots of runs (metrics.jsonl) and of
 * plan and simulate outputs (their --json lines), written by the library's
 * own SVG writer (dp_svg_write, src/plan/svg.c).  Each input is read record by
 * record and sorted by its "kind": step and epoch records are a run's;
 * "simulate", "plan" and "plan_sweep" come from `dptrain simulate --json`,
 * `dptrain plan --json` and `dptrain plan --sweep MAX --json`.  A plot whose
 * data no input carries is skipped with a note, never an error.
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dp/plan.h"
#include "cli.h"

#define die dptrain_die

struct vec {
    double *v;
    int64_t n, cap;
};
static void push(struct vec *a, double x) {
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 64;
        a->v = realloc(a->v, sizeof(double) * (size_t)a->cap);
        if (!a->v) die("out of memory");
    }
    a->v[a->n++] = x;
}
static void copy_arr(struct vec *a, const struct dp_json_field *f) {
    a->n = 0;
    for (int64_t i = 0; f && f->type == DP_JSON_ARR && i < f->n; i++) push(a, f->arr[i]);
}

/* What one input holds. */
struct input {
    char name[64];
    /* step records */
    struct vec step, loss, time, data, fwd, bwd, exposed, opt;
    double t;
    /* epoch records */
    struct vec e_step, e_time, acc, arrival;
    double et, workers, rate;
    /* simulate */
    struct vec idle, stale;
    /* plan: buckets; plan_sweep: the curve; plan_pipeline: the schedule's operations */
    struct vec b_ready, b_start, b_done, sw_workers, sw_rate;
    struct vec pp_stage, pp_bwd, pp_t0, pp_t1;
    /* launch.jsonl: the job's size from each event on (0 while it is down) */
    struct vec l_time, l_size;
};

static double num(const struct dp_json_obj *o, const char *k) { return dp_json_num(o, k, NAN); }

static void take_record(const struct dp_json_obj *o, void *arg) {
    struct input *in = arg;
    if (dp_json_str_is(o, "kind", "step")) {
        double st = num(o, "step_s");
        in->t += isfinite(st) ? st : 0;
        push(&in->step, num(o, "step")), push(&in->loss, num(o, "loss")), push(&in->time, in->t);
        push(&in->data, 1e3 * num(o, "data_wait_s")), push(&in->fwd, 1e3 * num(o, "forward_s"));
        push(&in->bwd, 1e3 * num(o, "backward_s")), push(&in->exposed, 1e3 * num(o, "comm_exposed_s"));
        push(&in->opt, 1e3 * num(o, "optimizer_s"));
    } else if (dp_json_str_is(o, "kind", "epoch")) {
        double et = num(o, "epoch_time_s");
        in->et += isfinite(et) ? et : 0;
        push(&in->e_step, num(o, "step")), push(&in->e_time, in->et), push(&in->acc, 100 * num(o, "test_acc"));
        copy_arr(&in->arrival, dp_json_get(o, "rank_arrival_s"));
        in->workers = num(o, "workers"), in->rate = num(o, "samples_per_s");
        /* a parameter-server run: the epoch's staleness histogram (the last epoch's is drawn) */
        if (dp_json_get(o, "stale_hist")) copy_arr(&in->stale, dp_json_get(o, "stale_hist"));
    } else if (dp_json_str_is(o, "kind", "simulate")) {
        copy_arr(&in->idle, dp_json_get(o, "idle"));
        copy_arr(&in->stale, dp_json_get(o, "stale_hist"));
    } else if (dp_json_str_is(o, "kind", "plan")) {
        copy_arr(&in->b_ready, dp_json_get(o, "bucket_ready_s"));
        copy_arr(&in->b_start, dp_json_get(o, "bucket_start_s"));
        copy_arr(&in->b_done, dp_json_get(o, "bucket_done_s"));
    } else if (dp_json_str_is(o, "kind", "launch") || dp_json_str_is(o, "kind", "failure") ||
               dp_json_str_is(o, "kind", "done") || dp_json_str_is(o, "kind", "stopped") ||
               dp_json_str_is(o, "kind", "gave_up")) {
        /* dptrain launch's records: a launch runs `size` hosts until the next failure (down:
         * 0) or the next launch (a scale-up's stop runs at the old size until then); the last
         * record closes the line */
        double t = num(o, "time_s"), last = in->l_size.n ? in->l_size.v[in->l_size.n - 1] : 0;
        if (!isfinite(t)) return;
        double y = dp_json_str_is(o, "kind", "launch") ? num(o, "size")
                 : dp_json_str_is(o, "kind", "failure") ? 0 : last;
        if (in->l_time.n) push(&in->l_time, t), push(&in->l_size, last); /* (a step, not a ramp) */
        push(&in->l_time, t), push(&in->l_size, y);
    } else if (dp_json_str_is(o, "kind", "plan_pipeline")) {
        copy_arr(&in->pp_stage, dp_json_get(o, "span_stage"));
        copy_arr(&in->pp_bwd, dp_json_get(o, "span_backward"));
        copy_arr(&in->pp_t0, dp_json_get(o, "span_t0_s"));
        copy_arr(&in->pp_t1, dp_json_get(o, "span_t1_s"));
    } else if (dp_json_str_is(o, "kind", "plan_sweep")) {
        push(&in->sw_workers, num(o, "workers")), push(&in->sw_rate, num(o, "samples_per_s"));
    }
}

static void free_input(struct input *in) {
    struct vec *v[] = {&in->step, &in->loss, &in->time, &in->data, &in->fwd, &in->bwd, &in->exposed, &in->opt,
                       &in->e_step, &in->e_time, &in->acc, &in->arrival, &in->idle, &in->stale, &in->b_ready,
                       &in->b_start, &in->b_done, &in->sw_workers, &in->sw_rate, &in->l_time, &in->l_size,
                       &in->pp_stage, &in->pp_bwd, &in->pp_t0, &in->pp_t1};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) free(v[i]->v);
}

static const char *out_dir;
static int written;

static void emit(const char *file, const struct dp_svg_plot *p, const struct dp_svg_series *s, int ns) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", out_dir, file);
    FILE *f = fopen(path, "w");
    if (!f) die("%s: %s", path, strerror(errno));
    int rc = dp_svg_write(f, p, s, ns);
    if (fclose(f) != 0 && !rc) die("%s: %s", path, strerror(errno));
    if (rc) die("%s: %s", path, dp_errmsg());
    printf("wrote %s\n", path);
    written++;
}

static void skip(const char *file, const char *why) { printf("skipped %s: %s\n", file, why); }

/* One series per input that has `y` (and x of the same length). */
static int gather(struct dp_svg_series *s, const struct input *in, int nin, size_t xoff, size_t yoff) {
    int ns = 0;
    for (int i = 0; i < nin && ns < 10; i++) {
        const struct vec *x = (const struct vec *)((const char *)&in[i] + xoff);
        const struct vec *y = (const struct vec *)((const char *)&in[i] + yoff);
        if (y->n && x->n == y->n) s[ns++] = (struct dp_svg_series){in[i].name, x->v, y->v, y->n, NULL};
    }
    return ns;
}

static const char *help_plot =
    "usage: dptrain plot --out DIR INPUT...\n"
    "\n"
    "SVG plots (self-contained, no dependency) of training runs and of plan and simulate outputs.\n"
    "An INPUT is a run folder (its metrics.jsonl) or a file of JSON lines: a metrics.jsonl, or\n"
    "what `dptrain simulate --json [--per-worker]`, `dptrain plan --json` and\n"
    "`dptrain plan --sweep MAX --json` print.  Runs are overlaid (up to 10).  Writes to DIR:\n"
    "  loss_step.svg, loss_time.svg          training loss against step and time\n"
    "  accuracy_step.svg, accuracy_time.svg  test accuracy at each epoch's end\n"
    "  breakdown.svg     per-step data, forward, backward, exposed comm, optimizer (first run)\n"
    "  wait.svg          per-rank wait for the slowest rank per step (runs with several ranks)\n"
    "  idle.svg          per-worker idle fraction (simulate --json --per-worker)\n"
    "  staleness.svg     staleness histogram (simulate --json of ssp or async, or the last\n"
    "                    epoch of a --mode async / --staleness run)\n"
    "  scaling.svg       predicted samples/s against workers (plan --sweep --json), and each\n"
    "                    run's measured rate at its worker count\n"
    "  timeline.svg      the buckets of one planned step (plan --json)\n"
    "  pipeline.svg      a pipeline's planned schedule: stages x time, each micro-batch's forward\n"
    "                    and backward (plan --pp --json; a run's own: train --timeline, in Perfetto)\n"
    "  world_size.svg    the hosts the job ran on over time, 0 while it was down (a run folder\n"
    "                    of dptrain launch, or its launch.jsonl)\n"
    "A plot whose data no input holds is skipped with a note.\n";

int dptrain_cmd_plot(int argc, char **argv) {
    const char *out = NULL;
    int nin = 0;
    struct input *in = calloc((size_t)(argc > 1 ? argc : 1), sizeof *in);
    if (!in) die("out of memory");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(help_plot, stdout);
            free(in);
            return 0;
        }
        if (!strcmp(a, "--out")) {
            if (i + 1 >= argc) die("option --out needs a value");
            out = argv[++i];
        } else if (!strncmp(a, "--out=", 6)) out = a + 6;
        else if (a[0] == '-' && a[1] == '-') die("unknown option '%s' (see 'dptrain plot --help')", a);
        else {
            const char *base = strrchr(a, '/');
            base = base && base[1] ? base + 1 : a;
            if (!strcmp(base, "metrics.jsonl") && base != a) { /* name a run's file by its folder */
                const char *e = base - 1, *b = e;
                while (b > a && b[-1] != '/') b--;
                snprintf(in[nin].name, sizeof in[nin].name, "%.*s", (int)(e - b), b);
            } else snprintf(in[nin].name, sizeof in[nin].name, "%s", base);
            dptrain_each_record(a, take_record, &in[nin]);
            /* a run folder that dptrain launch ran: its events too */
            struct stat st;
            char lpath[4096];
            snprintf(lpath, sizeof lpath, "%s/launch.jsonl", a);
            if (stat(a, &st) == 0 && S_ISDIR(st.st_mode) && access(lpath, R_OK) == 0)
                dptrain_each_record(lpath, take_record, &in[nin]);
            nin++;
        }
    }
    if (!out) die("give --out DIR (see 'dptrain plot --help')");
    if (!nin) die("give at least one input: a run folder or a JSON-lines file");
    if (mkdir(out, 0777) != 0 && errno != EEXIST) die("%s: %s", out, strerror(errno));
    out_dir = out;
    struct dp_svg_series s[10];
    int ns;
#define OFF(f) offsetof(struct input, f)
    ns = gather(s, in, nin, OFF(step), OFF(loss));
    if (ns) {
        emit("loss_step.svg", &(struct dp_svg_plot){DP_SVG_LINES, "Training loss", "step (steps)", "loss (nats)", 0, 0, 0}, s, ns);
        ns = gather(s, in, nin, OFF(time), OFF(loss));
        emit("loss_time.svg", &(struct dp_svg_plot){DP_SVG_LINES, "Training loss", "time (s)", "loss (nats)", 0, 0, 0}, s, ns);
    } else skip("loss_*.svg", "no step records");
    ns = gather(s, in, nin, OFF(e_step), OFF(acc));
    if (ns) {
        emit("accuracy_step.svg", &(struct dp_svg_plot){DP_SVG_LINES, "Test accuracy", "step (steps)", "accuracy (%)", 0, 0, 1}, s, ns);
        ns = gather(s, in, nin, OFF(e_time), OFF(acc));
        emit("accuracy_time.svg", &(struct dp_svg_plot){DP_SVG_LINES, "Test accuracy", "time (s)", "accuracy (%)", 0, 0, 1}, s, ns);
    } else skip("accuracy_*.svg", "no epoch records");
    const struct input *r0 = NULL;
    for (int i = 0; i < nin && !r0; i++)
        if (in[i].step.n) r0 = &in[i];
    if (r0) {
        const struct vec *parts[] = {&r0->data, &r0->fwd, &r0->bwd, &r0->exposed, &r0->opt};
        const char *names[] = {"data wait", "forward", "backward", "exposed comm", "optimizer"};
        for (int k = 0; k < 5; k++) s[k] = (struct dp_svg_series){names[k], r0->step.v, parts[k]->v, r0->step.n, NULL};
        char title[128];
        snprintf(title, sizeof title, "Step breakdown: %s", r0->name);
        emit("breakdown.svg", &(struct dp_svg_plot){DP_SVG_STACKED, title, "step (steps)", "time per step (ms)", 0, 0, 0}, s, 5);
    } else skip("breakdown.svg", "no step records");
    /* the straggler profile: each rank's mean wait for the last to arrive,
     * max(arrival) - arrival(r) per step, from the last epoch record */
    struct vec wx[10] = {{0}}, wy[10] = {{0}};
    ns = 0;
    for (int i = 0; i < nin && ns < 10; i++) {
        if (in[i].arrival.n < 2) continue;
        double mx = -INFINITY;
        for (int64_t r = 0; r < in[i].arrival.n; r++) mx = fmax(mx, in[i].arrival.v[r]);
        for (int64_t r = 0; r < in[i].arrival.n; r++) push(&wx[ns], (double)r), push(&wy[ns], 1e3 * (mx - in[i].arrival.v[r]));
        s[ns] = (struct dp_svg_series){in[i].name, wx[ns].v, wy[ns].v, wx[ns].n, NULL};
        ns++;
    }
    if (ns) emit("wait.svg", &(struct dp_svg_plot){DP_SVG_BARS, "Straggler profile (last epoch)", "rank (index)", "wait for the slowest per step (ms)", 0, 0, 0}, s, ns);
    else skip("wait.svg", "no epoch record with rank_arrival_s of 2 or more ranks");
    for (int i = 0; i < 10; i++) free(wx[i].v), free(wy[i].v);
    /* simulate: idle fraction per worker and the staleness histogram */
    struct vec ix = {0}, iy = {0}, hx = {0};
    const struct input *si = NULL, *sh = NULL;
    for (int i = 0; i < nin; i++) {
        if (!si && in[i].idle.n) si = &in[i];
        if (!sh && in[i].stale.n) sh = &in[i];
    }
    if (si) {
        for (int64_t w = 0; w < si->idle.n; w++) push(&ix, (double)w), push(&iy, 100 * si->idle.v[w]);
        s[0] = (struct dp_svg_series){si->name, ix.v, iy.v, ix.n, NULL};
        emit("idle.svg", &(struct dp_svg_plot){DP_SVG_BARS, "Idle time per worker (simulated)", "worker (index)", "idle (% of time)", 0, 0, 0}, s, 1);
    } else skip("idle.svg", "no simulate --json --per-worker output");
    if (sh) {
        for (int64_t k = 0; k < sh->stale.n; k++) push(&hx, (double)k);
        s[0] = (struct dp_svg_series){sh->name, hx.v, sh->stale.v, hx.n, NULL};
        emit("staleness.svg", &(struct dp_svg_plot){DP_SVG_BARS, "Staleness histogram", "staleness (updates)", "updates (count)", 0, 0, 0}, s, 1);
    } else skip("staleness.svg", "no staleness in the inputs (simulate --json of ssp or async, or an async run)");
    free(ix.v), free(iy.v), free(hx.v);
    /* scaling: predicted curves and measured points (one per run: its last epoch) */
    int npred = ns = gather(s, in, nin, OFF(sw_workers), OFF(sw_rate));
    struct vec mx = {0}, my = {0};
    for (int i = 0; i < nin; i++)
        if (isfinite(in[i].workers) && in[i].workers > 0 && isfinite(in[i].rate) && in[i].e_step.n)
            push(&mx, in[i].workers), push(&my, in[i].rate);
    for (int64_t a = 1; a < mx.n; a++) /* sort the measured points by workers (insertion: a handful) */
        for (int64_t b = a; b > 0 && mx.v[b - 1] > mx.v[b]; b--) {
            double t = mx.v[b]; mx.v[b] = mx.v[b - 1], mx.v[b - 1] = t;
            t = my.v[b]; my.v[b] = my.v[b - 1], my.v[b - 1] = t;
        }
    if (mx.n && ns < 10) s[ns++] = (struct dp_svg_series){"measured", mx.v, my.v, mx.n, NULL};
    if (npred)
        emit("scaling.svg", &(struct dp_svg_plot){DP_SVG_LINES, "Scaling: predicted and measured", "workers (count)", "throughput (samples/s)", 0, 0, 1}, s, ns);
    else skip("scaling.svg", "no plan --sweep --json output");
    free(mx.v), free(my.v);
    const struct input *pl = NULL;
    for (int i = 0; i < nin && !pl; i++)
        if (in[i].b_done.n && in[i].b_start.n == in[i].b_done.n && in[i].b_ready.n == in[i].b_done.n) pl = &in[i];
    if (pl) {
        struct vec a = {0}, b = {0}, c = {0};
        for (int64_t k = 0; k < pl->b_done.n; k++)
            push(&a, 1e3 * pl->b_ready.v[k]), push(&b, 1e3 * pl->b_start.v[k]), push(&c, 1e3 * pl->b_done.v[k]);
        s[0] = (struct dp_svg_series){"queued (ready to start)", a.v, b.v, a.n, NULL};
        s[1] = (struct dp_svg_series){"all-reduce", b.v, c.v, b.n, NULL};
        emit("timeline.svg", &(struct dp_svg_plot){DP_SVG_SPANS, "Buckets of one step (planned)", "time from the step's start (ms)", "bucket (index)", 0, 0, 0}, s, 2);
        free(a.v), free(b.v), free(c.v);
    } else skip("timeline.svg", "no plan --json output");
    /* the pipeline's planned schedule: stages x time, each micro-batch's forward and backward */
    const struct input *pq = NULL;
    for (int i = 0; i < nin && !pq; i++)
        if (in[i].pp_t0.n && in[i].pp_t1.n == in[i].pp_t0.n && in[i].pp_stage.n == in[i].pp_t0.n &&
            in[i].pp_bwd.n == in[i].pp_t0.n)
            pq = &in[i];
    if (pq) {
        struct vec x[2] = {{0}}, y[2] = {{0}}, r[2] = {{0}};
        for (int64_t k = 0; k < pq->pp_t0.n; k++) {
            int b = pq->pp_bwd.v[k] != 0;
            push(&x[b], 1e3 * pq->pp_t0.v[k]), push(&y[b], 1e3 * pq->pp_t1.v[k]), push(&r[b], pq->pp_stage.v[k]);
        }
        s[0] = (struct dp_svg_series){"forward", x[0].v, y[0].v, x[0].n, r[0].v};
        s[1] = (struct dp_svg_series){"backward", x[1].v, y[1].v, x[1].n, r[1].v};
        emit("pipeline.svg", &(struct dp_svg_plot){DP_SVG_SPANS, "Pipeline schedule of one step (planned)", "time from the step's start (ms)", "stage (index)", 0, 0, 0}, s, 2);
        for (int b = 0; b < 2; b++) free(x[b].v), free(y[b].v), free(r[b].v);
    } else skip("pipeline.svg", "no plan --pp --json output");
    ns = gather(s, in, nin, OFF(l_time), OFF(l_size));
    if (ns) emit("world_size.svg", &(struct dp_svg_plot){DP_SVG_LINES, "World size under dptrain launch", "time (s)", "hosts running (count)", 0, 0, 0}, s, ns);
    else skip("world_size.svg", "no launch.jsonl records");
#undef OFF
    for (int i = 0; i < nin; i++) free_input(&in[i]);
    free(in);
    return 0;
}
