/*
 * `dptrain launch`: the supervisor above a training job (issue 33, E1).
 *
 *   dptrain launch [--hosts FILE] [--min-nodes A] [--max-nodes B] [--max-restarts K]
 *                  [--mpirun-opt ARG]... -- train ARGS... --out DIR ...
 *
 * It runs the job (with FILE, or --hosts-cmd CMD: `mpirun -np N --host h1,...,hN`,
 * one process per host, threads inside; without: `dptrain train` itself), passes its output
 * through, and watches it:
 *
 *   the job ends 0            done
 *   the job fails             which hosts failed is read from the failure
 *                             records the job's processes leave in DIR (each
 *                             names the ranks its --comm-timeout found silent;
 *                             a vote settles a cut link) and from mpirun's
 *                             output (the rank killed by a signal); rank r ran
 *                             on the r-th host; those
 *                             hosts are excluded for --cooldown-s, and the job
 *                             is relaunched on the others from DIR/checkpoint.bin
 *                             once at least A hosts are left; at most K such
 *                             restarts.  A job that failed before its first
 *                             step without a named rank (a configuration error,
 *                             not a lost machine) is not restarted.
 *   the hosts grow            re-read every --poll-s: with more usable hosts
 *                             than the job runs on (up to B), the job is asked
 *                             to stop at a step boundary (SIGTERM: it writes its
 *                             checkpoint) and relaunched larger; not a restart.
 *   the launcher is signalled one SIGINT or SIGTERM is passed to the job (which
 *                             stops cleanly with its checkpoint), then it ends.
 *
 * Exact resume at any layout and, in deterministic mode, the same bits at any
 * worker count make a relaunch lose only the steps since the checkpoint, with
 * no sample skipped or repeated.  Every event is one line on stderr and one
 * record in DIR/launch.jsonl.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dp/core.h"
#include "dp/plan.h"
#include "dp/train.h"
#include "cli.h"

#define die dptrain_die
#define MAX_HOSTS 4096

static const char *help_launch =
    "usage: dptrain launch [options] -- train ARGS...\n"
    "\n"
    "Runs a training job and keeps it going: when it fails it is relaunched from the\n"
    "newest checkpoint in train's --out DIR (required), without the hosts that failed;\n"
    "when the hosts file grows, the job stops at a step boundary and is relaunched larger.\n"
    "Each event: one line on stderr and one record in DIR/launch.jsonl (docs/cluster.md).\n"
    "\n"
    "  --hosts FILE          one host per line (# comments): mpirun runs one process per\n"
    "                        host; re-read while the job runs [none: train on this machine]\n"
    "  --hosts-cmd CMD       or a discovery command (sh -c) that prints them, run as often\n"
    "  --min-nodes A         fewest hosts to run on [1]\n"
    "  --max-nodes B         most hosts to run on [all]\n"
    "  --max-restarts K      relaunches after failures (scale-ups do not count) [3]\n"
    "  --cooldown-s S        how long a failed host stays excluded [60]\n"
    "  --poll-s S            how often the hosts file is re-read (the command run) [1]\n"
    "  --wait-s S            how long to wait for A usable hosts after a failure [300]\n"
    "  --stop-grace-s S      mpirun's pause between SIGCONT, SIGTERM and SIGKILL when it ends\n"
    "                        a job (odls_base_sigkill_timeout): after a failure the job ends\n"
    "                        about 2 S later; a stop from mpirun gives the ranks S for their\n"
    "                        step and checkpoint (launch signals a rank on this machine\n"
    "                        directly where it can) [3]\n"
    "  --mpirun PATH         [mpirun]\n"
    "  --mpirun-opt ARG      an option for every mpirun (repeatable), e.g. --allow-run-as-root\n";

struct host {
    char name[256];
};

struct exclusion {
    char name[256];
    double until; /* dp_time() */
};

struct launch {
    const char *hosts_file, *hosts_cmd, *mpirun, *out; /* hosts_file: FILE, or the command's text */
    int min_nodes, max_nodes, max_restarts;
    double cooldown_s, poll_s, wait_s, grace_s;
    char **mpi_opts;
    int nmpi;
    char **train; /* "train" ARGS..., NULL-terminated */
    int ntrain;
    struct host hosts[MAX_HOSTS];  /* the file's (the command's) hosts now, in its order */
    int nhosts;
    struct exclusion excluded[MAX_HOSTS]; /* failed hosts, by name: whether or not the file still lists them */
    int nexcluded;
    FILE *log;
    double t0;
};

static volatile sig_atomic_t got_signal;
static void on_signal(int sig) { got_signal = sig; }

/* ---- the hosts file ------------------------------------------------------------------- */

/* Re-reads the file, or runs the discovery command and reads its output; a missing file
 * or a failed command keeps the list. */
static void read_hosts(struct launch *L) {
    FILE *f = L->hosts_cmd ? popen(L->hosts_cmd, "r") : fopen(L->hosts_file, "r");
    if (!f) return;
    int nold = L->nhosts;
    struct host *old = malloc(sizeof(struct host) * (size_t)(nold ? nold : 1));
    if (!old) die("out of memory");
    memcpy(old, L->hosts, sizeof(struct host) * (size_t)nold);
    L->nhosts = 0;
    char line[512];
    while (fgets(line, sizeof line, f) && L->nhosts < MAX_HOSTS) {
        char *h = line + strspn(line, " \t");
        h[strcspn(h, " \t\r\n#")] = 0;
        if (!*h) continue;
        snprintf(L->hosts[L->nhosts++].name, sizeof L->hosts[0].name, "%s", h);
    }
    int failed = L->hosts_cmd ? pclose(f) != 0 : fclose(f) != 0;
    if (failed) { /* (a discovery command that failed said nothing new) */
        memcpy(L->hosts, old, sizeof(struct host) * (size_t)nold);
        L->nhosts = nold;
    }
    free(old);
}

/* Excludes the host named `name` until dp_time() reaches `until`. */
static void exclude(struct launch *L, const char *name, double until) {
    int i = 0;
    while (i < L->nexcluded && strcmp(L->excluded[i].name, name)) i++;
    if (i == L->nexcluded) {
        if (L->nexcluded == MAX_HOSTS) i = 0; /* (full: the oldest entry goes) */
        else L->nexcluded++;
        snprintf(L->excluded[i].name, sizeof L->excluded[i].name, "%s", name);
    }
    L->excluded[i].until = until;
}

static int is_excluded(const struct launch *L, const char *name, double now) {
    for (int i = 0; i < L->nexcluded; i++)
        if (!strcmp(L->excluded[i].name, name)) return L->excluded[i].until > now;
    return 0;
}

/* The usable hosts now (at most max_nodes), copied into out (NULL: counted only). */
static int usable_hosts(const struct launch *L, struct host *out) {
    int n = 0;
    double now = dp_time();
    for (int i = 0; i < L->nhosts && n < L->max_nodes; i++)
        if (!is_excluded(L, L->hosts[i].name, now)) {
            if (out) out[n] = L->hosts[i];
            n++;
        }
    return n;
}

/* ---- the run folder ------------------------------------------------------------------- */

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The last step record's step in DIR/metrics.jsonl (read from its last 64 KiB,
 * which hold it), or -1; -1 too when the file was last written before `since`
 * (wall clock): a relaunched job first cuts the records after its checkpoint,
 * then appends. */
static long long last_step_since(const struct launch *L, double since) {
    char path[PATH_MAX + 32], line[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", L->out);
    struct stat st;
    if (stat(path, &st) || (double)st.st_mtim.tv_sec + 1e-9 * (double)st.st_mtim.tv_nsec < since) return -1;
    FILE *f = fopen(path, "r");
    long long s = -1, v;
    if (!f) return -1;
    int partial = st.st_size > 65536 && fseeko(f, st.st_size - 65536, SEEK_SET) == 0; /* (a line cut short first) */
    while (fgets(line, sizeof line, f)) {
        if (partial) partial = 0;
        else if (sscanf(line, "{\"kind\": \"step\", \"step\": %lld,", &v) == 1) s = v;
    }
    fclose(f);
    return s;
}
static long long last_step(const struct launch *L) { return last_step_since(L, 0); }

/* The step of DIR/checkpoint.bin, or -1. */
static long long checkpoint_step(const struct launch *L) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/checkpoint.bin", L->out);
    struct dp_ckpt_header h;
    return access(path, R_OK) == 0 && dp_ckpt_read_header(path, &h) == DP_OK ? (long long)h.step : -1;
}

/* One record in launch.jsonl (flushed) and, with text, one line on stderr. */
static void record(struct launch *L, const char *text, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void record(struct launch *L, const char *text, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(L->log, "{\"time_s\": %.3f, ", dp_time() - L->t0);
    vfprintf(L->log, fmt, ap);
    fprintf(L->log, "}\n");
    fflush(L->log);
    va_end(ap);
    if (text) fprintf(stderr, "dptrain launch: %s\n", text);
}

/* ---- one run of the job --------------------------------------------------------------- */

struct attempt {
    struct host hosts[MAX_HOSTS]; /* rank order (mpirun's --host order); copies: the file may change */
    int nhosts;
    int failed[MAX_HOSTS];        /* per rank: named as failed: killed (mpirun's output), or silent by
                                     the failure records' vote */
    int silent[MAX_HOSTS];        /* per rank: named by a "did not respond" line of the output */
    char scan[2][8192];           /* the partial last line of stdout, stderr */
    size_t scan_len[2];
};

/* The job's output names a lost rank: mpirun's "process rank R ... exited on
 * signal" (killed: the OOM killer, a lost machine), the trainer's "rank R did
 * not respond" (--comm-timeout: stalled, or its link cut).  A rank that exited
 * with an error of its own (mpirun's "Process name: [[J,1],R] ... Exit code")
 * names no lost host: the job is relaunched on the same ones.  Nor does a rank that
 * died of SIGPIPE (signal 13): it wrote to a peer that had died, the peer is the loss
 * (a rank of dptrain train defers that death by 2 s, so mpirun names the peer first). */
static void scan_line(struct attempt *a, const char *line) {
    const char *p, *sig;
    int r = -1, *mark = a->failed;
    if ((p = strstr(line, "process rank ")) && (sig = strstr(p, "exited on signal")) &&
        atoi(sig + strlen("exited on signal")) != SIGPIPE)
        r = atoi(p + strlen("process rank "));
    else if ((p = strstr(line, " did not respond")) && p - line >= 6) {
        const char *q = p;
        while (q > line && q[-1] >= '0' && q[-1] <= '9') q--;
        if (q < p && q - line >= 5 && !strncmp(q - 5, "rank ", 5)) r = atoi(q), mark = a->silent;
    }
    if (r >= 0 && r < a->nhosts) mark[r] = 1;
}

/* The failure records the job's processes left in DIR (failure.p<P>.json, written by the
 * trainer when a run fails: src/train/run_folder.h).  remove: delete them (before an
 * attempt, so that only its own are read).  Else, for each record, votes[q] += 1 for each
 * process q it names as lost; returns the number of records that name any. */
static int failure_records(const struct launch *L, int nprocs, int *votes, int remove) {
    DIR *d = opendir(L->out);
    struct dirent *e;
    int naming = 0, p;
    char tail[8];
    while (d && (e = readdir(d))) {
        if (sscanf(e->d_name, "failure.p%d%7s", &p, tail) != 2 || strcmp(tail, ".json")) continue;
        char path[PATH_MAX + 300], buf[8192];
        snprintf(path, sizeof path, "%s/%s", L->out, e->d_name);
        if (remove) {
            unlink(path);
            continue;
        }
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        struct dp_json_obj o = {0};
        const struct dp_json_field *lost;
        if (dp_json_parse(buf, n, &o) == DP_OK && dp_json_str_is(&o, "kind", "failure") &&
            (lost = dp_json_get(&o, "lost_processes")) && lost->type == DP_JSON_ARR && lost->n > 0) {
            naming++;
            for (int64_t i = 0; i < lost->n; i++)
                if (lost->arr[i] >= 0 && lost->arr[i] < nprocs) votes[(int)lost->arr[i]]++;
        }
        dp_json_obj_free(&o);
    }
    if (d) closedir(d);
    return naming;
}

/* The processes lost by the records' vote: named by more than half of the records that
 * name any.  A process cut off from the others names them all while they name it; a real
 * loss gets every survivor's vote.  (Two processes that name each other are a tie: neither
 * is named.)  Without records (a folder the ranks cannot reach), the "did not respond"
 * lines of the output name them.  Marks them in a->failed; returns how many records
 * named any. */
static int vote_failed(const struct launch *L, struct attempt *a) {
    int *votes = calloc((size_t)a->nhosts + 1, sizeof *votes);
    if (!votes) die("out of memory");
    int naming = failure_records(L, a->nhosts, votes, 0);
    for (int q = 0; q < a->nhosts; q++)
        if (naming ? 2 * votes[q] > naming : a->silent[q]) a->failed[q] = 1;
    free(votes);
    return naming;
}

/* A stop at a step boundary: a signal to any one rank is enough (the ranks
 * agree on the stop in the step's all-reduce), so SIGTERM goes to a rank on
 * this machine, a child of mpirun, where there is one; else to mpirun, which
 * passes it to the ranks after its odls_base_sigkill_timeout (--stop-grace-s,
 * which is also the ranks' time for a step and a checkpoint before SIGKILL). */
static void stop_job(pid_t job) {
    DIR *d = opendir("/proc");
    struct dirent *e;
    pid_t rank = 0;
    while (d && !rank && (e = readdir(d))) {
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        char *close_paren = strrchr(buf, ')'); /* pid (comm) state ppid ... */
        int ppid;
        if (close_paren && strstr(buf, "(dptrain)") && sscanf(close_paren + 1, " %*c %d", &ppid) == 1 && ppid == job)
            rank = (pid_t)atoi(e->d_name);
    }
    if (d) closedir(d);
    kill(rank ? rank : job, SIGTERM);
}

/* Passes fd's bytes to out and scans them line by line; 0 at the end of the stream. */
static int pass_through(struct attempt *a, int which, int fd, FILE *out) {
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) return n < 0 && errno == EINTR;
    fwrite(buf, 1, (size_t)n, out);
    fflush(out);
    for (ssize_t i = 0; i < n; i++) {
        size_t *len = &a->scan_len[which];
        if (buf[i] == '\n' || *len == sizeof a->scan[which] - 1) {
            a->scan[which][*len] = 0;
            scan_line(a, a->scan[which]);
            *len = 0;
        } else a->scan[which][(*len)++] = buf[i];
    }
    return 1;
}

/* The command of this attempt: [mpirun ...] dptrain train ARGS, with --resume
 * of the folder's checkpoint after the first attempt.  argv owns nothing but
 * its array and the host list. */
static char **command(struct launch *L, struct attempt *a, int first, char **hostlist) {
    char **v = calloc((size_t)(L->ntrain + L->nmpi + 16), sizeof *v);
    if (!v) die("out of memory");
    int n = 0;
    static char exe[PATH_MAX], np[32], resume[PATH_MAX + 32], grace[32];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k <= 0) die("launch: cannot find this program (/proc/self/exe): %s", strerror(errno));
    exe[k] = 0;
    *hostlist = NULL;
    if (L->hosts_file) {
        size_t len = 1;
        for (int i = 0; i < a->nhosts; i++) len += strlen(a->hosts[i].name) + 1;
        char *hl = calloc(1, len);
        if (!hl) die("out of memory");
        for (int i = 0; i < a->nhosts; i++) {
            if (i) strcat(hl, ",");
            strcat(hl, a->hosts[i].name);
        }
        *hostlist = hl;
        snprintf(np, sizeof np, "%d", a->nhosts);
        v[n++] = (char *)L->mpirun;
        v[n++] = "-np", v[n++] = np, v[n++] = "--host", v[n++] = hl;
        /* mpirun's pause before each step of tearing a job down (SIGCONT, SIGTERM, SIGKILL):
         * after a rank died, the others are stuck in a collective, and the job ends only after
         * two of them; after a requested stop, mpirun still waits them out */
        snprintf(grace, sizeof grace, "%g", L->grace_s);
        v[n++] = "--mca", v[n++] = "odls_base_sigkill_timeout", v[n++] = grace;
        for (int i = 0; i < L->nmpi; i++) v[n++] = L->mpi_opts[i];
    }
    v[n++] = exe;
    for (int i = 0; i < L->ntrain; i++) {
        const char *s = L->train[i];
        if (!first && !strcmp(s, "--overwrite")) continue; /* never again: the folder holds our run */
        if (!first && !strcmp(s, "--resume")) {
            i++;
            continue;
        }
        if (!first && !strncmp(s, "--resume=", 9)) continue;
        v[n++] = L->train[i];
    }
    if (!first) {
        snprintf(resume, sizeof resume, "%s/checkpoint.bin", L->out);
        /* (no checkpoint yet: the failed attempt's records go; a checkpoint there, even one
         * that does not read, is never overwritten: train says what is wrong with it) */
        if (access(resume, F_OK) == 0) v[n++] = "--resume", v[n++] = resume;
        else v[n++] = "--overwrite";
    }
    v[n] = NULL;
    return v;
}

/* Runs one attempt to its end.  Returns the wait status; *stopped_for_more: the
 * launcher stopped it to grow; recovery: the failure's time (dp_time), to report
 * the first step after resume_step (< 0: none). */
static int run_attempt(struct launch *L, struct attempt *a, int first, int *stopped_for_more, double recovery,
                       long long resume_step) {
    const double started = wall_now();
    char *hostlist;
    char **argv = command(L, a, first, &hostlist);
    int out[2], err[2];
    if (pipe(out) || pipe(err)) die("launch: pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) die("launch: fork: %s", strerror(errno));
    if (pid == 0) {
        setpgid(0, 0); /* the terminal's Ctrl-C reaches the launcher only, which passes one on */
        dup2(out[1], 1), dup2(err[1], 2);
        close(out[0]), close(out[1]), close(err[0]), close(err[1]);
        signal(SIGINT, SIG_DFL), signal(SIGTERM, SIG_DFL);
        execvp(argv[0], argv);
        fprintf(stderr, "dptrain launch: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(out[1]), close(err[1]);
    *stopped_for_more = 0;
    int open_fds = 2, status = 0, signalled = 0, exited = 0, killed = 0;
    double last_poll = dp_time(), named_at = -1;
    struct pollfd pf[2] = {{.fd = out[0], .events = POLLIN}, {.fd = err[0], .events = POLLIN}};
    while (!exited || open_fds) {
        int rc = poll(pf, 2, 100);
        for (int i = 0; rc > 0 && i < 2; i++)
            if (pf[i].fd >= 0 && (pf[i].revents & (POLLIN | POLLHUP | POLLERR)) &&
                !pass_through(a, i, pf[i].fd, i ? stderr : stdout)) {
                close(pf[i].fd);
                pf[i].fd = -1;
                open_fds--;
            }
        if (!exited && waitpid(pid, &status, WNOHANG) == pid) exited = 1;
        /* A rank named as lost, and the job still running well after mpirun's teardown
         * should have ended it: mpirun cannot reach a host whose link is cut, and waits for
         * it.  The job is over (its ranks aborted): end mpirun and what it started here. */
        for (int r = 0; named_at < 0 && r < a->nhosts; r++)
            if (a->failed[r] || a->silent[r]) named_at = dp_time();
        if (!exited && !killed && named_at >= 0 && dp_time() - named_at > 2 * L->grace_s + 10) {
            record(L, "the job named a lost rank but did not end: ending mpirun", "\"kind\": \"killed\"");
            kill(-pid, SIGKILL); /* (its process group: mpirun and the ranks of this machine) */
            killed = 1;
        }
        if (exited && open_fds && rc == 0) break; /* (a grandchild holding the pipes: not ours to wait for) */
        if (got_signal && !signalled) {
            kill(pid, got_signal == SIGINT ? SIGINT : SIGTERM);
            signalled = 1;
        }
        long long now_step;
        if (recovery >= 0 && (now_step = last_step_since(L, started)) > resume_step) {
            char text[160];
            snprintf(text, sizeof text, "recovered: step %lld done %.1f s after the failure", now_step,
                     dp_time() - recovery);
            record(L, text, "\"kind\": \"recovered\", \"step\": %lld, \"recovery_s\": %.3f", now_step,
                   dp_time() - recovery);
            recovery = -1;
        }
        /* grow: more usable hosts than the job runs on */
        if (L->hosts_file && !exited && !signalled && !*stopped_for_more && dp_time() - last_poll >= L->poll_s) {
            last_poll = dp_time();
            read_hosts(L);
            int n = usable_hosts(L, NULL);
            if (n > a->nhosts) {
                record(L, "more hosts: stopping the job at a step boundary to relaunch it larger",
                       "\"kind\": \"scale_up\", \"from\": %d, \"to\": %d", a->nhosts, n);
                if (L->hosts_file) stop_job(pid);
                else kill(pid, SIGTERM);
                *stopped_for_more = 1;
            }
        }
    }
    for (int i = 0; i < 2; i++)
        if (pf[i].fd >= 0) close(pf[i].fd);
    if (!exited) waitpid(pid, &status, 0);
    free(hostlist);
    free(argv);
    return status;
}

/* ---- the supervisor ------------------------------------------------------------------- */

static void json_hosts(struct launch *L, const struct attempt *a, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < a->nhosts && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s\"%s\"", i ? ", " : "", a->hosts[i].name);
    if (k < n) snprintf(buf + k, n - k, "]");
}

int dptrain_cmd_launch(int argc, char **argv) {
    static struct launch L;
    L = (struct launch){.min_nodes = 1, .max_nodes = MAX_HOSTS, .max_restarts = 3, .cooldown_s = 60,
                        .poll_s = 1, .wait_s = 300, .grace_s = 3, .mpirun = "mpirun"};
    const char *v;
    int i = 1;
    L.mpi_opts = calloc((size_t)argc, sizeof *L.mpi_opts);
    if (!L.mpi_opts) die("out of memory");
    for (; i < argc && strcmp(argv[i], "--"); i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(help_launch, stdout);
            return 0;
        }
        if (dptrain_take(argc, argv, &i, "--hosts", &v)) L.hosts_file = v;
        else if (dptrain_take(argc, argv, &i, "--hosts-cmd", &v)) L.hosts_file = L.hosts_cmd = v;
        else if (dptrain_take(argc, argv, &i, "--min-nodes", &v)) L.min_nodes = (int)dptrain_int_arg(a, v, 1, MAX_HOSTS);
        else if (dptrain_take(argc, argv, &i, "--max-nodes", &v)) L.max_nodes = (int)dptrain_int_arg(a, v, 1, MAX_HOSTS);
        else if (dptrain_take(argc, argv, &i, "--max-restarts", &v)) L.max_restarts = (int)dptrain_int_arg(a, v, 0, 1000000);
        else if (dptrain_take(argc, argv, &i, "--cooldown-s", &v)) L.cooldown_s = dptrain_num_arg(a, v, 0, 1e9);
        else if (dptrain_take(argc, argv, &i, "--poll-s", &v)) L.poll_s = dptrain_num_arg(a, v, 0.05, 1e6);
        else if (dptrain_take(argc, argv, &i, "--wait-s", &v)) L.wait_s = dptrain_num_arg(a, v, 0, 1e9);
        else if (dptrain_take(argc, argv, &i, "--stop-grace-s", &v)) L.grace_s = (double)dptrain_int_arg(a, v, 1, 3600);
        else if (dptrain_take(argc, argv, &i, "--mpirun", &v)) L.mpirun = v;
        else if (dptrain_take(argc, argv, &i, "--mpirun-opt", &v)) L.mpi_opts[L.nmpi++] = (char *)v;
        else die("launch: unknown option '%s' (see 'dptrain launch --help')", a);
    }
    if (i + 1 >= argc || strcmp(argv[i + 1], "train"))
        die("launch: give the job after '--': dptrain launch [options] -- train ARGS...");
    L.train = argv + i + 1, L.ntrain = argc - i - 1;
    for (int k = 1; k < L.ntrain; k++) {
        if (!strcmp(L.train[k], "--out") && k + 1 < L.ntrain) L.out = L.train[k + 1];
        else if (!strncmp(L.train[k], "--out=", 6)) L.out = L.train[k] + 6;
    }
    if (!L.out) die("launch: train needs --out DIR: the checkpoint a relaunch continues from, and launch.jsonl");
    if (L.min_nodes > L.max_nodes) die("launch: --min-nodes %d is above --max-nodes %d", L.min_nodes, L.max_nodes);
    if (L.hosts_file) {
        if (!L.hosts_cmd && access(L.hosts_file, R_OK)) die("launch: --hosts %s: %s", L.hosts_file, strerror(errno));
        read_hosts(&L);
        if (L.nhosts < L.min_nodes)
            die("launch: %s %s lists %d host%s, fewer than --min-nodes %d", L.hosts_cmd ? "--hosts-cmd" : "--hosts",
                L.hosts_file, L.nhosts, L.nhosts == 1 ? "" : "s", L.min_nodes);
    }
    char path[PATH_MAX + 32];
    mkdir(L.out, 0755); /* (train makes missing parents; an error shows when the log cannot open) */
    snprintf(path, sizeof path, "%s/launch.jsonl", L.out);
    if (!(L.log = fopen(path, "a"))) die("launch: cannot write %s: %s", path, strerror(errno));
    L.t0 = dp_time();
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL), sigaction(SIGTERM, &sa, NULL);

    static struct attempt a;
    int restarts = 0, first = 1, status = 0;
    double failed_at = -1;
    char hosts_json[65536], line[512];
    for (;;) {
        memset(&a, 0, sizeof a);
        if (L.hosts_file) {
            /* wait for A usable hosts (after a failure, the cooldown may have to pass) */
            double since = dp_time();
            for (;;) {
                read_hosts(&L);
                a.nhosts = usable_hosts(&L, a.hosts);
                if (a.nhosts >= L.min_nodes || got_signal) break;
                if (dp_time() - since > L.wait_s) {
                    record(&L, NULL, "\"kind\": \"gave_up\", \"reason\": \"hosts\", \"usable\": %d", a.nhosts);
                    die("launch: %d usable hosts after %.0f s, fewer than --min-nodes %d", a.nhosts, L.wait_s,
                        L.min_nodes);
                }
                usleep(200000);
            }
        } else a.nhosts = 1;
        if (got_signal) break;
        /* where this attempt starts: the folder's checkpoint after the first */
        long long resume_step = first ? last_step(&L) : checkpoint_step(&L);
        failure_records(&L, 0, NULL, 1); /* (an earlier attempt's, or an earlier run's) */
        json_hosts(&L, &a, hosts_json, sizeof hosts_json);
        snprintf(line, sizeof line, "%s on %d host%s (%s)", first ? "starting" : "relaunching", a.nhosts,
                 a.nhosts == 1 ? "" : "s", L.hosts_file ? "mpirun" : "this machine");
        record(&L, line, "\"kind\": \"launch\", \"attempt\": %d, \"size\": %d, \"hosts\": %s, \"resume_step\": %lld",
               restarts, a.nhosts, L.hosts_file ? hosts_json : "[]", first ? -1 : resume_step);
        int grow;
        const double attempt_wall = wall_now();
        status = run_attempt(&L, &a, first, &grow, failed_at, resume_step);
        first = 0, failed_at = -1;
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (got_signal) {
            record(&L, "stopped on request", "\"kind\": \"stopped\", \"status\": %d", code);
            break;
        }
        if (grow) continue;
        if (code == 0) {
            record(&L, "the job finished", "\"kind\": \"done\", \"step\": %lld, \"restarts\": %d", last_step(&L), restarts);
            break;
        }
        /* a failure: which hosts (the job's failure records, and mpirun's output), how far it got */
        int records = vote_failed(&L, &a);
        long long done = last_step(&L), ckpt = checkpoint_step(&L);
        char failed[4096] = "[";
        size_t fl = 1;
        int nfailed = 0;
        double until = dp_time() + L.cooldown_s;
        for (int r = 0; L.hosts_file && r < a.nhosts; r++)
            if (a.failed[r]) {
                struct host *h = &a.hosts[r];
                exclude(&L, h->name, until);
                fl += (size_t)snprintf(failed + fl, sizeof failed - fl, "%s\"%s\"", nfailed++ ? ", " : "", h->name);
                if (fl >= sizeof failed - 2) break;
            }
        snprintf(failed + fl, sizeof failed - fl, "]");
        snprintf(line, sizeof line, "the job failed (status %d) after step %lld, checkpoint at step %lld; failed hosts: %s",
                 code, done, ckpt, failed);
        record(&L, line, "\"kind\": \"failure\", \"status\": %d, \"step\": %lld, \"checkpoint_step\": %lld, "
                         "\"steps_lost\": %lld, \"failed_hosts\": %s, \"records\": %d, \"cooldown_s\": %.3f",
               code, done, ckpt, done - (ckpt > 0 ? ckpt : 0), failed, records, L.cooldown_s);
        /* (this attempt's own steps: a relaunch that failed before cutting metrics.jsonl back
         * to its checkpoint leaves the failed attempt's steps there) */
        if (last_step_since(&L, attempt_wall) <= resume_step && !nfailed) {
            record(&L, NULL, "\"kind\": \"gave_up\", \"reason\": \"no step\"");
            die("launch: the job failed before its first step, naming no lost rank: not restarted (see its error "
                "above)");
        }
        if (++restarts > L.max_restarts) {
            record(&L, NULL, "\"kind\": \"gave_up\", \"reason\": \"restarts\", \"restarts\": %d", L.max_restarts);
            die("launch: the job failed after %d restart%s (--max-restarts %d)", L.max_restarts,
                L.max_restarts == 1 ? "" : "s", L.max_restarts);
        }
        failed_at = dp_time();
    }
    fclose(L.log);
    free(L.mpi_opts);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
