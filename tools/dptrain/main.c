/* dptrain — the command-line interface.  The only code that prints or exits. */
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dp/comm.h"
#include "dp/train.h"
#include "cli.h"

#define DEFAULT_DATA DPTRAIN_DEFAULT_DATA

static const char *prog = "dptrain";
#define die dptrain_die
#define die_rc dptrain_die_rc

/* ---- option parsing ------------------------------------------------------------- */

struct args {
    int argc, i;
    char **argv;
    const char *cmd;
};

/* Matches "--name" or "--name=value"; *val gets the value (next argument if
 * not attached) when want_value. */
static int opt(struct args *a, const char *name, const char **val) {
    const char *s = a->argv[a->i];
    size_t n = strlen(name);
    if (strncmp(s, name, n) != 0) return 0;
    if (s[n] == '=') {
        if (!val) die("option %s takes no value", name);
        *val = s + n + 1;
        return 1;
    }
    if (s[n] != 0) return 0;
    if (val) {
        if (a->i + 1 >= a->argc) die("option %s needs a value (see '%s %s --help')", name, prog, a->cmd);
        *val = a->argv[++a->i];
    }
    return 1;
}

static int64_t parse_int(const char *name, const char *v, int64_t lo, int64_t hi) {
    return dptrain_int_arg(name, v, lo, hi);
}
static double parse_float(const char *name, const char *v, double lo, double hi) {
    return dptrain_num_arg(name, v, lo, hi);
}

/* argv[a->i] as one of the library's train options ("--name", "--name=value" or "--name
 * value"; src/train/option_table.c): the option, with *val its value (NULL for a flag, or for
 * an optional value left out); NULL when it is none of them. */
static const struct dp_train_option *table_opt(struct args *a, const char **val) {
    const char *s = a->argv[a->i];
    char name[64];
    size_t n = strcspn(s + 2, "=");
    if (strncmp(s, "--", 2) || n >= sizeof name) return NULL;
    memcpy(name, s + 2, n);
    name[n] = 0;
    const struct dp_train_option *o = strchr(name, '_') ? NULL : dp_train_option_find(name);
    if (!o) return NULL;
    *val = NULL;
    if (s[2 + n] == '=') {
        if (!o->arg) die("option --%s takes no value", name);
        *val = s + 3 + n;
    } else if (o->arg && !o->optional) {
        if (a->i + 1 >= a->argc) die("option --%s needs a value (see '%s %s --help')", name, prog, a->cmd);
        *val = a->argv[++a->i];
    }
    return o;
}

/* eval: the options of one's own data (docs/data.md) that train takes too: 1 when argv[i] is
 * one of them (set in tp) */
static int eval_data_opt(struct args *a, struct dp_train_params *tp) {
    static const char *const names[] = {"labels", "test-data", "test-labels", "npz-keys", "label-column",
                                        "data-format", "skip-bad-images", "image-channels", "image-size",
                                        "csv-header", "val-split", "loss", "layout", "normalize"};
    const char *s = a->argv[a->i], *v;
    size_t n = strcspn(s, "=");
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if (n == strlen(names[k]) + 2 && !strncmp(s + 2, names[k], n - 2) && table_opt(a, &v)) {
            if (dp_train_option_set(tp, names[k], v)) die("%s", dp_errmsg());
            return 1;
        }
    return 0;
}

/* ---- commands ------------------------------------------------------------------- */

/* 1 if an MPI launcher started this process: mpirun/mpiexec (Open MPI,
 * MPICH's hydra), or srun with several tasks. */
static int launched_by_mpi(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    const char *n = getenv("SLURM_NTASKS");
    return getenv("SLURM_PROCID") && n && atoi(n) > 1;
}

/* SIGINT and SIGTERM during training: the first asks the trainer to stop
 * after its current step, with a checkpoint (dp_train_params.io.stop); a second,
 * or one before training starts, ends the process as the signal's default
 * would.
 *   Neither may run a handler on a thread that computes: oneDNN's GEMM
 * (Debian 12's libdnnl 2.7) points rsp into a heap buffer while it runs, and a
 * handler on that thread writes its signal frame over the heap (oneDNN#4845;
 * here 1 stop in ~30 aborted with "corrupted size vs. prev_size").  So
 * cmd_train blocks both before it starts any thread (MPI's, the workers',
 * OpenMP's inherit the mask) and one thread takes them with sigwait.  Threads
 * that libraries started before main (OpenBLAS's pool, idle) still have them
 * unblocked, and the kernel may pick one: the handler there does the same. */
static _Atomic int stop_signal, stop_armed;
static const char *stop_msg = "\ndptrain: stopping after this step, with a checkpoint (again to abort now)\n";
static sigset_t stop_set;
/* The default action of sig: this thread alone unblocks it, and raises it on itself.
 * Async-signal-safe. */
static void die_of_signal(int sig) {
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    signal(sig, SIG_DFL);
    pthread_sigmask(SIG_UNBLOCK, &one, NULL);
    raise(sig);
    _exit(128 + sig);
}

/* async-signal-safe: from the handler or the sigwait thread */
static void on_stop_signal(int sig) {
    int first = 0;
    if (!atomic_load(&stop_armed) || !atomic_compare_exchange_strong(&stop_signal, &first, sig)) die_of_signal(sig);
    ssize_t n = write(2, stop_msg, strlen(stop_msg));
    (void)n;
}
static void *stop_signal_thread(void *arg) {
    (void)arg;
    for (;;) {
        int sig;
        if (sigwait(&stop_set, &sig) == 0) on_stop_signal(sig);
    }
    return NULL;
}
/* Before any thread: SIGINT and SIGTERM blocked here (and so in every thread
 * started from now on), and the thread that waits for them. */
static void take_stop_signals(void) {
    sigemptyset(&stop_set);
    sigaddset(&stop_set, SIGINT);
    sigaddset(&stop_set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_set, NULL);
    pthread_t th;
    if (pthread_create(&th, NULL, stop_signal_thread, NULL) == 0) {
        pthread_setname_np(th, "dp-signals");
        pthread_detach(th);
    }
}
/* From here a signal asks for the stop. */
static void arm_stop_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;
    sigfillset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    atomic_store(&stop_armed, 1);
}

/* SIGPIPE in a rank of an MPI job: a write to a peer whose process died, its kernel having
 * closed the socket.  The default kills this rank at once, often before mpirun hears of the
 * peer's own death; mpirun names only the first rank to die, so `dptrain launch` blamed this
 * rank's host for the peer's loss (1 kill of rank 0 in 3 on the emulated cluster).  So the
 * rank lets the peer's death be reported first: it waits 2 s (mpirun, having seen that death,
 * ends the job meanwhile), then dies of SIGPIPE as the default would.  The writer is MPI's
 * (a communication thread), never a GEMM thread (see above).  Async-signal-safe. */
static void on_sigpipe(int sig) {
    struct timespec ts = {2, 0};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
    die_of_signal(sig);
}
static void defer_sigpipe(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigpipe;
    sigaction(SIGPIPE, &sa, NULL);
}

/* 1 when the run's model reads token ids: its model file's, its spec's, or the resumed
 * checkpoint's (the library reports a file or checkpoint it cannot read). */
static int train_reads_tokens(const struct dp_train_params *tp) {
    if (tp->run.model_text) return dp_model_text_reads_tokens(tp->run.model_text);
    if (tp->run.model_file) {
        char *text;
        if (dp_model_read_file(tp->run.model_file, &text)) return 0;
        int r = dp_model_text_reads_tokens(text);
        dp_free(text);
        return r;
    }
    struct dp_ckpt_header h;
    if (tp->run.model) return dp_model_spec_reads_tokens(tp->run.model);
    return tp->io.resume && dp_ckpt_read_header(tp->io.resume, &h) == 0 && dp_ckpt_reads_tokens(tp->io.resume, &h);
}

static int cmd_train(int argc, char **argv) {
    take_stop_signals(); /* first: before any thread starts */
    struct dp_train_params tp = dp_train_default_params();
    tp.data.data_dir = DEFAULT_DATA;
    tp.run.model = NULL;
    /* One worker per core this process may run on (its affinity: under mpirun,
     * taskset or a cgroup cpuset that is fewer than the machine's cores). */
    int ncpu = dp_cpus_allowed();
    tp.dp.workers = ncpu > 256 ? 256 : ncpu;
    struct progress prog_state = {.mode = PROG_AUTO, .last_test_acc = NAN, .last_test_loss = NAN, .slow_rank = -1};
    const char *v, *backend = "auto";
    int model_given = 0, workers_given = 0, data_given = 0;
    const char *user_model = NULL, *user_file = NULL; /* --model and --model-file as typed */
    /* --resume: the checkpoint's configuration goes first, the command line's
     * options after it override (tools/dptrain/train_config.c) */
    const char *resume = NULL;
    int help = 0, from_header = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) help = 1;
        if (!strncmp(argv[i], "--resume=", 9)) resume = argv[i] + 9;
        else if (!strcmp(argv[i], "--resume") && i + 1 < argc) resume = argv[i + 1];
    }
    char *stored = resume && !help ? dptrain_config_stored(resume, &from_header) : NULL;
    int nstored = 0;
    for (const char *c = stored; c && *c; c++) nstored += *c == '\n';
    char **all = malloc(sizeof(char *) * (size_t)(argc + nstored + 1));
    if (!all) die("out of memory");
    all[0] = argv[0];
    int nall = 1;
    char *lines = stored ? strdup(stored) : NULL;
    for (char *l = lines, *e; l && *l; l = e + 1) {
        e = strchr(l, '\n');
        *e = 0;
        all[nall++] = l;
    }
    for (int i = 1; i < argc; i++) all[nall++] = argv[i];
    all[nall] = NULL;
    argc = nall, argv = all;
    /* the options the user gave (not the stored ones), checked once all are in: an option
     * the run's mode would ignore is an error naming the mode it needs (dp_train_option_check) */
    const char **given = malloc(sizeof(char *) * (size_t)argc);
    int ngiven = 0;
    if (!given) die("out of memory");
    struct args a = {argc, 0, argv, "train"};
    for (a.i = 1; a.i < argc; a.i++) {
        if (opt(&a, "--help", NULL) || opt(&a, "-h", NULL)) {
            dptrain_print_train_help(stdout);
            free(stored), free(lines), free(all), free(given);
            return 0;
        } else if (opt(&a, "--backend", &v)) backend = v;
        else if (opt(&a, "--progress", &v)) {
            if (!strcmp(v, "auto")) prog_state.mode = PROG_AUTO;
            else if (!strcmp(v, "bar")) prog_state.mode = PROG_BAR;
            else if (!strcmp(v, "lines")) prog_state.mode = PROG_LINES;
            else if (!strcmp(v, "none")) prog_state.mode = PROG_NONE;
            else die("--progress: expected auto, bar, lines or none, got '%s'", v);
        } else {
            /* the library's options (src/train/option_table.c): one table for every caller */
            const struct dp_train_option *o = table_opt(&a, &v);
            if (!o) die("unknown option '%s' for train (see '%s train --help')", argv[a.i], prog);
            if (dp_train_option_set(&tp, o->name, v)) die("%s", dp_errmsg());
            int user = a.i > nstored;
            if (user) given[ngiven++] = o->name;
            if (!strcmp(o->name, "data")) data_given = 1;
            else if (!strcmp(o->name, "workers")) workers_given = 1;
            else if (!strcmp(o->name, "model")) model_given = 1, user_model = user ? v : user_model;
            else if (!strcmp(o->name, "model-file")) model_given = 1, user_file = user ? v : user_file;
        }
    }
    if (user_model && user_file) die("--model %s and --model-file %s: give one", user_model, user_file);
    if (!model_given && !tp.io.resume) tp.run.model = "mlp";
    int lm = train_reads_tokens(&tp);
    /* (a folder given with --data is refused by the library with the same advice) */
    if (lm && !data_given)
        die("model %s trains on a token file: run 'dptrain prepare-text [FILES or DIR] --out tokens.bin' "
            "first, then pass --data tokens.bin (or pass --data DIR, a folder of text files, prepared on first use)",
            tp.run.model_file ? tp.run.model_file : tp.run.model);
    if (tp.sched.kind == DP_SCHED_STEP && tp.sched.step_size == 0)
        die("--schedule step needs --step-size N");
    /* (--skip-nonfinite with --deterministic is refused by the library) */
    for (int i = 0; i < ngiven; i++)
        if (dp_train_option_check(&tp, given[i])) die("%s", dp_errmsg());
    free(given);
    /* the configuration every checkpoint of this run stores, and what this resume changes */
    char *config = dp_train_options_render(&tp);
    if (!config) die("out of memory");
    tp.io.config = config;
    if (prog_state.mode == PROG_AUTO) prog_state.mode = isatty(2) ? PROG_BAR : PROG_LINES;
    prog_state.max_steps = tp.run.max_steps;
    tp.io.on_event = dptrain_on_event;
    tp.io.stop = &stop_signal;
    tp.io.event_arg = &prog_state;

    /* Backend: a multi-process job over MPI, or threads in this process. */
    if (!strcmp(backend, "auto")) backend = launched_by_mpi() && dp_comm_backend_available("mpi") ? "mpi" : "thread";
    else if (strcmp(backend, "thread") && strcmp(backend, "mpi"))
        die("--backend: expected auto, thread or mpi, got '%s'", backend);
    int nprocs = 1, me = 0;
    struct dp_comm *job = NULL;
    if (!strcmp(backend, "mpi")) {
        defer_sigpipe();
        struct dp_comm_params cp = dp_comm_default_params();
        cp.timeout_s = tp.dp.comm_timeout;
        job = dptrain_job_start(&cp);
        nprocs = dp_comm_world(job), me = dp_comm_rank(job);
        int host_rank, host_size;
        if (!workers_given && dp_comm_host_ranks(job, &host_rank, &host_size) == 0 && host_size > 0)
            tp.dp.workers = ncpu / host_size < 1 ? 1 : ncpu / host_size > 256 ? 256 : (int)(ncpu / host_size);
        tp.dp.inter = job;
        if (me != 0) prog_state.mode = PROG_NONE; /* rank 0 reports for the job */
    }

    /* a language model's folder of text: its token file, prepared on first
     * use (every process of a job runs this on its own file system; where
     * they share one, each writes the same bytes atomically) */
    if (lm && data_given && !tp.data.tokens_raw_u16) tp.data.data_dir = dptrain_prepared_text_data(tp.data.data_dir, me == 0);

    /* every worker needs a sample of each global batch (the library runs empty shares, for
     * --balance; a user asking for them has mistyped --batch or --workers) */
    int64_t job_workers = (int64_t)tp.dp.workers * nprocs - (tp.dp.async && nprocs > 1 ? (tp.dp.servers ? tp.dp.servers : 1) : 0);
    if (tp.run.batch < job_workers)
        die("global batch %lld is smaller than the %lld workers: each worker needs at least one sample per step "
            "(raise --batch or lower --workers)", (long long)tp.run.batch, (long long)job_workers);
    struct dp_trainer *t;
    int rc = dp_trainer_init(&t, &tp);
    if (rc) die_rc(rc);
    const struct dp_model *m = dp_trainer_model(t);
    if (me == 0 && stored) {
        if (from_header)
            printf("resume: %s predates stored configurations: its model, batch, seed, optimizer and schedule "
                   "kind come from its header, the rest from this command line\n", resume);
        else printf("resume: the configuration of %s, with this command line's changes:\n", resume);
        if (!dptrain_config_overrides(stored, config, stdout) && !from_header) printf("resume: (none)\n");
    }
    if (me == 0 && dp_trainer_note(t)) printf("note: %s\n", dp_trainer_note(t));
    int ranks = tp.dp.workers * nprocs; /* data-parallel ranks in the job */
    char procs[64] = "";
    if (job) snprintf(procs, sizeof procs, "%d process%s (mpi) x ", nprocs, nprocs > 1 ? "es" : "");
    char det[64] = ""; /* the chunk decides the bits, so the header names it */
    if (tp.dp.deterministic && !tp.dp.async && tp.dp.staleness < 0)
        snprintf(det, sizeof det, ", deterministic in chunks of %lld",
                 (long long)(tp.dp.det_chunk ? tp.dp.det_chunk : dp_det_chunk_auto(tp.run.batch)));
    if (me == 0)
        printf("dptrain: model %s (%lld parameters, %.1f MFLOP/sample forward), global batch %lld, %s lr %g, "
               "%s%d worker%s x %d thread%s, gemm %s%s\n",
               m->spec, (long long)m->num_params, (double)m->flops_fwd / 1e6, (long long)tp.run.batch,
               dp_optim_kind_name(tp.optim.kind), (double)tp.sched.base_lr, procs, tp.dp.workers,
               tp.dp.workers > 1 ? "s" : "", tp.run.threads, tp.run.threads > 1 ? "s" : "",
               dp_gemm_backend_name(dp_gemm_get_backend()), det);
    if (me == 0 && dp_trainer_data_note(t)[0]) printf("data: %s\n", dp_trainer_data_note(t));
    if (me == 0 && dp_trainer_layout(t)[0]) printf("%s\n", dp_trainer_layout(t));
    if (me == 0 && tp.dp.workers > 1 && dp_trainer_comm_progress(t) == DP_PROGRESS_CALLER && !tp.dp.async)
        printf("reduction: by the workers between layers (--comm-progress caller%s)\n",
               tp.dp.comm_progress == DP_PROGRESS_AUTO ? ", auto: no core left for a communication thread" : "");
    if (me == 0 && tp.data.prefetch < 0 && dp_trainer_prefetch(t) == 0 && !tp.dp.async)
        printf("loader: each worker assembles its own batches (--prefetch auto: no core left for a loader thread)\n");
    fflush(stdout);
    /* The MFU's denominator, measured now (~10 ms, before the workers load
     * the cores): 0 where it cannot be measured, and then no MFU is printed. */
    double peak = me == 0 ? dp_cpu_peak_flops() : 0;
    double t0 = dp_time();
    if (tp.dp.async || tp.dp.staleness >= 0) /* the parameter server stops at epoch ends (src/train/ps_loop.c ps_stop_note) */
        stop_msg = "\ndptrain: stopping at the end of this epoch (--mode async and --staleness stop where every "
                   "push is applied), with a checkpoint (again to abort now)\n";
    arm_stop_signals();
    rc = dp_trainer_run(t);
    if (rc) {
        if (prog_state.mode == PROG_BAR) fprintf(stderr, "\n");
        dp_trainer_free(t);
        die_rc(rc);
    }
    double dt = dp_time() - t0;
    dptrain_warn_gemm_fallback();
    if (me == 0) dptrain_progress_summary(&prog_state, t, &tp, dt, peak, ranks); /* rank 0 reports for the job */
    if (me == 0 && tp.dp.pp > 1 && nprocs == 1) { /* each stage's activations at their most (its replica 0's) */
        printf("pipeline: activations held at most:");
        for (int s = 0; s < tp.dp.pp; s++)
            printf(" stage %d %.2f MB%s", s, (double)dp_trainer_activation_bytes(t, s * (tp.dp.workers / tp.dp.pp)) / 1e6,
                   s + 1 < tp.dp.pp ? "," : "\n");
    }
    /* a stop on request: one line naming the checkpoint, and the shell's status for the signal */
    int sig = atomic_load(&stop_signal), status = 0;
    int64_t stopped = dp_trainer_stopped(t);
    if (sig) status = 128 + sig;
    /* under mpirun or srun the stop is agreed by every process (one all-reduce
     * per step), so rank 0 may stop on a signal another process received */
    const char *by = sig == SIGINT ? "by SIGINT" : sig ? "by SIGTERM" : "on another process's signal";
    if (me == 0 && stopped >= 0 && tp.io.out_dir)
        printf("stopped %s after step %lld: checkpoint %s/checkpoint.bin (continue with --resume "
               "%s/checkpoint.bin --out %s)\n", by, (long long)stopped, tp.io.out_dir, tp.io.out_dir, tp.io.out_dir);
    else if (me == 0 && stopped >= 0)
        printf("stopped %s after step %lld (no --out: nothing saved)\n", by, (long long)stopped);
    fflush(stdout);
    free(config);
    free(stored);
    free(lines);
    free(all);
    dp_trainer_free(t);
    dptrain_job_free();
    return status;
}

static int cmd_eval(int argc, char **argv) {
    struct dp_train_params tp = dp_train_default_params();
    tp.data.data_dir = DEFAULT_DATA;
    tp.run.model = NULL;
    tp.run.epochs = 0;
    tp.data.prefetch = 0;
    const char *v, *ckpt = NULL, *weights = NULL, *model = NULL, *model_file = NULL;
    int data_given = 0;
    struct args a = {argc, 0, argv, "eval"};
    /* A checkpoint's run read its data with options (the CSV's label column, the layout, the
     * images' size, ...): they apply here too, before the user's own, which override them.  Not
     * the data's paths, nor the split or the normalisation (the checkpoint's is used). */
    static const char *const replay[] = {"--label-column=", "--csv-header=", "--layout=", "--npz-keys=",
                                         "--image-size=", "--image-channels=", "--data-format=",
                                         "--skip-bad-images"};
    char *stored = NULL;
    for (a.i = 1; a.i < argc && !stored; a.i++) {
        const char *c = !strcmp(argv[a.i], "--ckpt") && a.i + 1 < argc ? argv[a.i + 1]
                        : !strncmp(argv[a.i], "--ckpt=", 7) ? argv[a.i] + 7 : NULL;
        int from_header;
        if (c && access(c, R_OK) == 0) stored = dptrain_config_stored(c, &from_header);
    }
    for (char *l = stored, *e; l && *l; l = e ? e + 1 : NULL) {
        if ((e = strchr(l, '\n'))) *e = 0;
        for (size_t k = 0; k < sizeof replay / sizeof replay[0]; k++)
            if (!strncmp(l, replay[k], strlen(replay[k]))) {
                char *one[2] = {NULL, l};
                struct args s = {2, 1, one, "eval"};
                eval_data_opt(&s, &tp);
            }
    }
    for (a.i = 1; a.i < argc; a.i++) {
        if (opt(&a, "--help", NULL) || opt(&a, "-h", NULL)) {
            fputs(dptrain_help_eval, stdout);
            return 0;
        } else if (opt(&a, "--ckpt", &v)) ckpt = v;
        else if (opt(&a, "--safetensors", &v)) weights = v;
        else if (opt(&a, "--model", &v)) model = v;
        else if (opt(&a, "--model-file", &v)) model_file = v;
        else if (opt(&a, "--data", &v)) tp.data.data_dir = v, data_given = 1;
        else if (eval_data_opt(&a, &tp)) continue;
        else if (opt(&a, "--threads", &v)) tp.run.threads = (int)parse_int("--threads", v, 1, 256);
        else if (opt(&a, "--test-limit", &v)) tp.data.test_limit = parse_int("--test-limit", v, 1, INT64_MAX / 2);
        else if (a.argv[a.i][0] != '-' && !ckpt) ckpt = a.argv[a.i];
        else die("unknown option '%s' for eval (see '%s eval --help')", argv[a.i], prog);
    }
    if (!ckpt == !weights) die("eval needs either --ckpt FILE or --safetensors FILE");
    /* the model of a safetensors file dptrain wrote is in its metadata (dptrain_model) */
    static char meta_model[1024];
    if (model && model_file) die("--model %s and --model-file %s: give one", model, model_file);
    char *meta_text = NULL; /* the model's canonical text, where the file has it */
    if (weights && !model && !model_file) {
        int rc = dp_safetensors_meta(weights, "dptrain_model", meta_model, sizeof meta_model);
        if (rc == DP_ENOENT) die("%s; pass --model SPEC (the model the weights are for)", dp_errmsg());
        if (rc) die_rc(rc);
        model = meta_model;
        enum { TEXT_CAP = 1 << 20 };
        if (!(meta_text = malloc(TEXT_CAP))) die("out of memory");
        rc = dp_safetensors_meta(weights, "dptrain_model_text", meta_text, TEXT_CAP);
        if (rc == DP_ENOENT) {
            free(meta_text);
            meta_text = NULL;
            if (!strncmp(meta_model, "file:", 5))
                die("%s holds the weights of a model declared in a model file (%s), and not its text: pass "
                    "--model-file FILE", weights, meta_model + 5);
        } else if (rc) die_rc(rc);
    }
    /* the weights' normalisation (their metadata's input_mean, input_std: comma lists, one value per
     * channel or feature) in the checkpoint section's form, for the trainer to apply */
    char *norm = NULL;
    if (weights) {
        enum { CAP = 1 << 22 }; /* 4 MiB: a table of 65,536 features at 17 characters a value */
        char *mean = malloc(CAP), *std = malloc(CAP);
        if (!mean || !std || !(norm = malloc(2 * (size_t)CAP + 16))) die("out of memory");
        int rm = dp_safetensors_meta(weights, "input_mean", mean, CAP);
        int rs = rm ? rm : dp_safetensors_meta(weights, "input_std", std, CAP);
        if (rm && rm != DP_ENOENT) die_rc(rm);
        if (rs && rs != DP_ENOENT) die_rc(rs);
        if (!rm && !rs) {
            for (char *c = mean; *c; c++) if (*c == ',') *c = ' ';
            for (char *c = std; *c; c++) if (*c == ',') *c = ' ';
            snprintf(norm, 2 * (size_t)CAP + 16, "mean %s\nstd %s\n", mean, std);
            tp.data.norm_text = norm;
        }
        free(mean), free(std);
    }
    if (ckpt && (model || model_file)) die("eval --ckpt takes the model from the checkpoint, not --model or --model-file");
    struct dp_ckpt_header h = {.step = -1};
    int rc;
    if (weights) { /* the trainer loads them as it does for train --init-from */
        tp.run.model = model;
        tp.run.model_file = model_file;
        tp.run.model_text = meta_text;
        tp.io.init_from = weights;
    } else if ((rc = dp_ckpt_read_header(ckpt, &h))) die_rc(rc);
    if (ckpt) { /* the run's settings come from the checkpoint header */
        tp.io.resume = ckpt;
        tp.run.batch = h.batch;
        tp.run.seed = h.seed;
        tp.optim.kind = (enum dp_optim_kind)h.optim_kind;
        tp.optim.momentum = h.momentum;
        tp.optim.nesterov = (int)h.nesterov;
        tp.optim.dampening = h.dampening;
        tp.optim.weight_decay = h.weight_decay;
        tp.optim.beta1 = h.beta1, tp.optim.beta2 = h.beta2, tp.optim.eps = h.eps;
    }
    if (ckpt ? dp_ckpt_reads_tokens(ckpt, &h) : train_reads_tokens(&tp)) { /* the default data is images */
        if (!data_given)
            die("model %s evaluates on text: pass --data tokens.bin (a token file) or --data DIR (a folder of "
                "text files)", ckpt ? h.model_spec : model_file ? model_file : model);
        if (!tp.data.tokens_raw_u16) tp.data.data_dir = dptrain_prepared_text_data(tp.data.data_dir, 1);
    }
    /* --data X.npy --labels y.npy (or data.npz, data.csv): those samples are the ones evaluated */
    size_t dl = strlen(tp.data.data_dir);
    const char *ext = dl > 4 ? tp.data.data_dir + dl - 4 : "";
    struct stat dst;
    char idx[4200];
    snprintf(idx, sizeof idx, "%s/train-images-idx3-ubyte", tp.data.data_dir);
    int images = stat(tp.data.data_dir, &dst) == 0 && S_ISDIR(dst.st_mode) && access(idx, F_OK) != 0 &&
                 (snprintf(idx, sizeof idx, "%s/train-images-idx3-ubyte.gz", tp.data.data_dir), access(idx, F_OK) != 0);
    /* (with --val-split: the part of --data the run held out, which the split keyed by the
     * checkpoint's seed finds again) */
    if ((!strcmp(ext, ".npy") || !strcmp(ext, ".npz") || !strcmp(ext, ".csv") || images) && !tp.data.test_data &&
        !(tp.data.val_split > 0))
        tp.data.test_data = tp.data.data_dir, tp.data.test_labels = tp.data.labels; /* (an .npz of Keras's layout: its x_test, y_test) */
    struct dp_trainer *t;
    if ((rc = dp_trainer_init(&t, &tp))) die_rc(rc);
    double acc, loss;
    const char *spec = dp_trainer_model(t)->spec;
    if (dp_model_reads_tokens(dp_trainer_model(t))) { /* --data is a token file: its validation windows */
        if ((rc = dp_trainer_evaluate(t, NULL, tp.data.test_limit, &acc, &loss))) die_rc(rc);
        printf("model %s  val loss %.4f  val ppl %.2f  val bpb %.4f  token acc %.2f%%\n", spec, loss, exp(loss),
               dp_trainer_bits_per_byte(t, loss, tp.data.test_limit), 100 * acc);
        dp_trainer_free(t);
        free(meta_text);
        free(norm);
        free(stored);
        return 0;
    }
    const struct dp_dataset *test = dp_trainer_test_set(t); /* normalised as the run was */
    if (!test->n) die("no test set to evaluate: pass --data X.npy --labels y.npy (the samples to evaluate)");
    rc = dp_trainer_evaluate(t, test, tp.data.test_limit, &acc, &loss);
    if (rc) die_rc(rc);
    char step[32] = "";
    if (ckpt) snprintf(step, sizeof step, "  step %lld", (long long)h.step);
    char fig[96];
    if (dp_trainer_model(t)->loss == DP_LOSS_MSE) /* a regression: acc is the mean absolute error */
        snprintf(fig, sizeof fig, "test rmse %.4g  test mae %.4g", sqrt(loss), acc);
    else
        snprintf(fig, sizeof fig, "test acc %.2f%%  test loss %.4f", 100 * acc, loss);
    printf("model %s%s  %s  (%lld samples)\n", dp_trainer_model(t)->spec, step, fig,
           (long long)(tp.data.test_limit && tp.data.test_limit < test->n ? tp.data.test_limit : test->n));
    dptrain_warn_gemm_fallback();
    dp_trainer_free(t);
    free(meta_text);
    free(norm);
    free(stored);
    return 0;
}

static int cmd_ckpt_diff(int argc, char **argv) {
    const char *file[2] = {NULL, NULL}, *v;
    double tol = 1e-5;
    struct args a = {argc, 0, argv, "ckpt diff"};
    int nfile = 0;
    for (a.i = 1; a.i < argc; a.i++) {
        if (opt(&a, "--help", NULL)) {
            fputs(dptrain_help_ckpt_sub("diff"), stdout);
            return 0;
        } else if (opt(&a, "--tol", &v)) tol = parse_float("--tol", v, 0, 1e30);
        else if (argv[a.i][0] != '-' && nfile < 2) file[nfile++] = argv[a.i];
        else die("unexpected argument '%s' for ckpt diff", argv[a.i]);
    }
    if (nfile < 2) die("ckpt diff needs two checkpoint files");
    struct dp_ckpt_header h[2];
    float *pl[2];
    for (int k = 0; k < 2; k++) {
        int rc = dp_ckpt_read(file[k], &h[k], &pl[k]);
        if (rc) {
            if (k) dp_free(pl[0]);
            die_rc(rc);
        }
    }
    if (strcmp(h[0].model_spec, h[1].model_spec) || h[0].num_params != h[1].num_params ||
        h[0].num_buffers != h[1].num_buffers) {
        dp_free(pl[0]), dp_free(pl[1]);
        die("ckpt diff: %s is model %s (%lld parameters), %s is model %s (%lld parameters)", file[0],
            h[0].model_spec, (long long)h[0].num_params, file[1], h[1].model_spec, (long long)h[1].num_params);
    }
    /* dp_rel_diff: NaN or Inf anywhere counts as a difference */
    double dp_ = dp_rel_diff(pl[0], pl[1], h[0].num_params);
    double db = dp_rel_diff(pl[0] + h[0].num_params, pl[1] + h[0].num_params, h[0].num_buffers);
    dp_free(pl[0]), dp_free(pl[1]);
    int same = h[0].param_hash == h[1].param_hash;
    printf("parameters: max |A-B| / max |A| = %.3g\n", dp_);
    if (h[0].num_buffers) printf("buffers:    max |A-B| / max |A| = %.3g\n", db);
    printf("steps:      %lld and %lld; param hashes %s\n", (long long)h[0].step, (long long)h[1].step,
           same ? "equal (bit-identical)" : "differ");
    if (!(dp_ <= tol && db <= tol)) {
        printf("differ by more than %g\n", tol);
        return 1;
    }
    printf("within %g\n", tol);
    return 0;
}

static int cmd_ckpt(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(dptrain_help_ckpt, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *sub = argv[1];
    if (!strcmp(sub, "diff")) return cmd_ckpt_diff(argc - 1, argv + 1);
    if (strcmp(sub, "info") && strcmp(sub, "export"))
        die("unknown ckpt command '%s' (expected info, export or diff)", sub);
    const char *file = NULL, *out = NULL, *v;
    struct args a = {argc, 0, argv, "ckpt"};
    for (a.i = 2; a.i < argc; a.i++) {
        if (opt(&a, "--help", NULL)) {
            fputs(dptrain_help_ckpt_sub(sub), stdout);
            return 0;
        } else if (!strcmp(sub, "export") && opt(&a, "--safetensors", &v)) out = v;
        else if (argv[a.i][0] != '-' && !file) file = argv[a.i];
        else die("unexpected argument '%s' for ckpt %s", argv[a.i], sub);
    }
    if (!file) die("ckpt %s needs a checkpoint FILE", sub);
    struct dp_ckpt_header h;
    float *payload;
    int rc = dp_ckpt_read(file, &h, &payload);
    if (rc) die_rc(rc);
    if (!strcmp(sub, "info")) {
        printf("file:            %s\n", file);
        printf("format:          %.8s version %u\n", h.magic, h.version);
        printf("model:           %s\n", h.model_spec);
        printf("input shape:     (%lld, %lld, %lld)\n", (long long)h.in_shape[0], (long long)h.in_shape[1],
               (long long)h.in_shape[2]);
        printf("parameters:      %lld\n", (long long)h.num_params);
        printf("buffers:         %lld\n", (long long)h.num_buffers);
        printf("step:            %lld (epoch %lld, step %lld in epoch)\n", (long long)h.step, (long long)h.epoch,
               (long long)h.step_in_epoch);
        printf("batch:           %lld\n", (long long)h.batch);
        printf("seed:            %llu\n", (unsigned long long)h.seed);
        printf("optimizer:       %s (momentum %g, nesterov %u, weight decay %g, betas %g/%g, eps %g), %lld steps, state %lld floats\n",
               dp_optim_kind_name((enum dp_optim_kind)h.optim_kind), (double)h.momentum, h.nesterov,
               (double)h.weight_decay, (double)h.beta1, (double)h.beta2, (double)h.eps, (long long)h.optim_step,
               (long long)h.optim_state_len);
        printf("learning rate:   %g (%s)\n", (double)h.lr, dp_sched_kind_name((enum dp_sched_kind)h.sched_kind));
        printf("payload crc32:   %08x\n", h.payload_crc);
        printf("param hash:      %016" PRIx64 " (FNV-1a 64 of parameters then buffers)\n", h.param_hash);
        dp_free(payload);
        return 0;
    }
    if (!out) die("ckpt export needs --safetensors OUT");
    struct dp_model *m;
    if ((rc = dp_ckpt_build_model(file, &h, &m))) die_rc(rc);
    if (m->num_params != h.num_params || m->num_buffers != h.num_buffers)
        die("%s: checkpoint sizes do not match model %s", file, h.model_spec);
    struct dp_replica r;
    if ((rc = dp_replica_init(&r, m, 1))) die_rc(rc);
    memcpy(r.params, payload, sizeof(float) * (size_t)h.num_params);
    memcpy(r.buffers, payload + h.num_params, sizeof(float) * (size_t)h.num_buffers);
    dp_free(payload);
    /* What a PyTorch user needs besides the weights (docs/checkpoint.md has
     * the loader): the library writes the model spec and input shape; the
     * preprocessing is the trainer's, which the CLI always uses (the
     * checkpoint does not store it because no option changes it). */
    struct dp_train_params defaults = dp_train_default_params();
    void *norm = NULL;
    uint64_t nlen = 0;
    int own = !dp_ckpt_read_section(file, DP_CKPT_NORM_TAG, &norm, &nlen) && norm;
    size_t ncap = own ? (size_t)nlen + 32 : 32;
    char *mean = malloc(ncap), *std = malloc(ncap);
    if (!mean || !std) die("out of memory");
    snprintf(mean, ncap, "%.9g", (double)defaults.data.norm_mean);
    snprintf(std, ncap, "%.9g", (double)defaults.data.norm_std);
    /* the run's own normalisation, where the checkpoint stores it (section DPNORMIN: "mean M0 M1
     * ...\nstd S0 S1 ...\n", per channel): a checkpoint of an IDX run holds Fashion-MNIST's */
    if (own) {
        char *txt = norm;
        txt[nlen] = 0; /* (dp_ckpt_read_section allocates one byte more) */
        char *sd = strstr(txt, "\nstd ");
        if (strncmp(txt, "mean ", 5) || !sd) die("%s: a malformed normalisation section", file);
        *sd = 0;
        snprintf(mean, ncap, "%s", txt + 5);
        snprintf(std, ncap, "%s", sd + 5);
        for (char *c = mean; *c; c++) if (*c == ' ') *c = ',';
        for (char *c = std; *c; c++) if (*c == ' ' || *c == '\n') *c = *c == ' ' ? ',' : 0;
        dp_free(norm);
    }
    int reg = m->loss == DP_LOSS_MSE;
    /* a run on a folder of images: its class names, in class order, comma-separated, each
     * percent-encoded where it holds ',', '%', '"', '\\' or a control character (the metadata's
     * strings take no escapes) */
    void *cls = NULL;
    uint64_t clen = 0;
    char *classes = NULL;
    if (!dp_ckpt_read_section(file, DP_CKPT_CLASSES_TAG, &cls, &clen) && cls) {
        if (!(classes = malloc(3 * (size_t)clen + 1))) die("out of memory");
        char *o = classes;
        for (const unsigned char *c = cls; c < (const unsigned char *)cls + clen; c++) {
            if (*c == '\n') *o++ = c + 1 < (const unsigned char *)cls + clen ? ',' : 0;
            else if (*c == ',' || *c == '%' || *c == '"' || *c == '\\' || *c < 0x20)
                o += sprintf(o, "%%%02X", *c);
            else *o++ = (char)*c;
        }
        *o = 0;
        dp_free(cls);
    }
    const struct dp_st_meta meta[] = {
        {"input_mean", mean},
        {"input_std", std},
        {"input_preprocessing", own ? "x = (value - input_mean[g]) / input_std[g] for each group g: the channels "
                                      "of an image, or the features of a table (C = H = 1); one value applies "
                                      "to all; value is the pixel / 255 for Fashion-MNIST's IDX files, else the "
                                      "array's element as float; float32, batches NCHW"
                                    : "x = (pixel / 255 - input_mean) / input_std, float32, batches NCHW"},
        {"output", reg ? "K values, the regression's predictions (loss mse)"
                       : "logits, one per class; the prediction is the argmax"},
        {"torch_loader", "docs/checkpoint.md of dptrain (tests/torch/eval_safetensors.py)"},
        {"class_names", classes ? classes : ""},
    };
    /* a language model: token ids in, no normalisation (docs/text.md) */
    const struct dp_st_meta meta_lm[] = {
        {"input_preprocessing", "token ids (byte-level: token = byte value), batches (B, T), T <= ctx"},
        {"output", "logits (B, T, vocab) of the next token = ln_f(x) @ tok.weight.T (tied head, no bias)"},
    };
    int lm = dp_model_reads_tokens(m);
    if ((rc = dp_safetensors_save_meta(out, m, &r, lm ? meta_lm : meta,
                                       lm ? (int)(sizeof meta_lm / sizeof meta_lm[0])
                                          : (int)(sizeof meta / sizeof meta[0]) - !classes)))
        die_rc(rc); /* (class_names, last, only where the run had them) */
    free(classes);
    free(mean), free(std);
    printf("wrote %s (%d tensors)\n", out, m->nparams);
    dp_replica_free(&r);
    dp_model_free(m);
    return 0;
}

static int cmd_bench(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs("usage: dptrain bench allreduce [options]   (dptrain bench allreduce --help)\n",
              argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "allreduce")) return dptrain_cmd_bench_allreduce(argc - 1, argv + 1);
    die("unknown benchmark '%s' (expected allreduce)", argv[1]);
}

int main(int argc, char **argv) {
    /* Keep freed memory in the heap instead of returning it to the kernel:
     * libraries (oneDNN's GEMM packing buffers) allocate and free scratch
     * every call, and a fresh page costs ~12 us to fault in on these VMs
     * (docs/architecture.md §3), so mmap/munmap per call showed up as 15% of an mlp
     * step in kernel page clearing.  A process-wide policy: it belongs to
     * the program, not the library. */
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    if (argc < 2) {
        fputs(dptrain_help_main, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        fputs(dptrain_help_main, stdout);
        dptrain_print_backends(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V")) {
        dptrain_print_version(stdout);
        return 0;
    }
    if (!strcmp(cmd, "help")) {
        const char *what = argc > 2 ? argv[2] : "";
        if (!strcmp(what, "prepare-text")) {
            char *h[] = {"prepare-text", "--help", NULL};
            return dptrain_cmd_prepare_text(2, h);
        }
        if (!strcmp(what, "plan")) {
            char *h[] = {"plan", "--help", NULL};
            return dptrain_cmd_plan(2, h);
        }
        if (!strcmp(what, "calibrate")) {
            char *h[] = {"calibrate", "--help", NULL};
            return dptrain_cmd_calibrate(2, h);
        }
        if (!strcmp(what, "plot")) {
            char *h[] = {"plot", "--help", NULL};
            return dptrain_cmd_plot(2, h);
        }
        if (!strcmp(what, "simulate")) {
            char *h[] = {"simulate", "--help", NULL};
            return dptrain_cmd_simulate(2, h);
        }
        if (!strcmp(what, "sample")) {
            char *h[] = {"sample", "--help", NULL};
            return dptrain_cmd_sample(2, h);
        }
        if (!strcmp(what, "launch")) {
            char *h[] = {"launch", "--help", NULL};
            return dptrain_cmd_launch(2, h);
        }
        if (!strcmp(what, "train")) {
            dptrain_print_train_help(stdout);
            return 0;
        }
        fputs(!strcmp(what, "eval") ? dptrain_help_eval
              : !strcmp(what, "ckpt") ? dptrain_help_ckpt_sub(argc > 3 ? argv[3] : NULL)
                                       : dptrain_help_main, stdout);
        return 0;
    }
    if (!strcmp(cmd, "train")) return cmd_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval")) return cmd_eval(argc - 1, argv + 1);
    if (!strcmp(cmd, "ckpt")) return cmd_ckpt(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "prepare-text")) return dptrain_cmd_prepare_text(argc - 1, argv + 1);
    if (!strcmp(cmd, "sample")) return dptrain_cmd_sample(argc - 1, argv + 1);
    if (!strcmp(cmd, "plan")) return dptrain_cmd_plan(argc - 1, argv + 1);
    if (!strcmp(cmd, "calibrate")) return dptrain_cmd_calibrate(argc - 1, argv + 1);
    if (!strcmp(cmd, "plot")) return dptrain_cmd_plot(argc - 1, argv + 1);
    if (!strcmp(cmd, "simulate")) return dptrain_cmd_simulate(argc - 1, argv + 1);
    if (!strcmp(cmd, "launch")) return dptrain_cmd_launch(argc - 1, argv + 1);
    fprintf(stderr, "%s: error: unknown command '%s' (see '%s --help')\n", prog, cmd, prog);
    return 2;
}
