/* The test runner: one forked child per test, with a timeout.
 *
 * A child's exit status is its verdict: 0 passed, SKIP_STATUS skipped (the
 * reason comes back through a pipe), anything else (a failed assertion's
 * _exit(1), a signal, the alarm) failed.  A skip without a reason on the pipe
 * counts as failed, so a stray exit(77) cannot pass for a skip. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

enum { SKIP_STATUS = 77 };

struct entry {
    const char *name;
    dp_test_fn fn;
    int timeout_s;
};
/* The table grows with the registrations (constructors, before main); a
 * failed allocation is remembered and fails the run at start. */
static struct entry *tests;
static int ntests, cap_tests, lost_tests;
static char tmpdir[256];
static int skip_fd = -1; /* the child's end of the skip-reason pipe */

void dp_test_register(const char *name, dp_test_fn fn, int timeout_s) {
    if (ntests == cap_tests) {
        int cap = cap_tests ? 2 * cap_tests : 256;
        struct entry *t = realloc(tests, sizeof *t * (size_t)cap);
        if (!t) {
            lost_tests++;
            return;
        }
        tests = t, cap_tests = cap;
    }
    tests[ntests++] = (struct entry){name, fn, timeout_s};
}

void dp_test_fail(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "    %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    _exit(1);
}

int dp_test_files_in(const char *dir) {
    DIR *dh = opendir(dir);
    if (!dh) dp_test_fail(__FILE__, __LINE__, "cannot list %s: %s", dir, strerror(errno));
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dh)))
        if (e->d_name[0] != '.') n++;
    closedir(dh);
    return n;
}

char *dp_test_read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) dp_test_fail(__FILE__, __LINE__, "cannot open %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, len = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0)
        if ((len += got) == cap) buf = realloc(buf, cap *= 2);
    int bad = !buf || ferror(f);
    fclose(f);
    if (bad) dp_test_fail(__FILE__, __LINE__, "cannot read %s", path);
    *n = len;
    return buf;
}

void dp_test_write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) dp_test_fail(__FILE__, __LINE__, "cannot create %s: %s", path, strerror(errno));
    if (n && fwrite(p, 1, n, f) != n) dp_test_fail(__FILE__, __LINE__, "cannot write %s", path);
    if (fclose(f) != 0) dp_test_fail(__FILE__, __LINE__, "cannot close %s", path);
}

char *dp_test_path(char *out, const char *name) {
    snprintf(out, 512, "%s/%s", dp_test_tmpdir(), name);
    return out;
}

void dp_test_skip(const char *fmt, ...) {
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    fflush(stdout);
    fflush(stderr);
    /* one write below PIPE_BUF: atomic, and the parent reads it after waitpid */
    size_t n = strlen(why);
    if (n == 0) why[0] = '?', n = 1;
    if (skip_fd < 0 || write(skip_fd, why, n) != (ssize_t)n) {
        fprintf(stderr, "    skip outside the runner: %s\n", why);
        _exit(1);
    }
    _exit(SKIP_STATUS);
}

const char *dp_test_tmpdir(void) { return tmpdir; }

/* The source tree: the binary's directory's parent (build/dptest,
 * build-asan/dptest), or the binary's own directory, whichever holds
 * tests/test.h.  Found once, before the first fork. */
static char srcdir[PATH_MAX];
static int srcdir_known;
const char *dp_test_source_dir(void) {
    if (!srcdir_known) {
        srcdir_known = 1;
        char exe[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n <= 0) return NULL;
        exe[n] = 0;
        for (int up = 1; up <= 2; up++) {
            char *slash = strrchr(exe, '/');
            if (!slash) break;
            *slash = 0; /* up 1: the binary's directory; up 2: its parent */
            char probe[PATH_MAX + 32];
            snprintf(probe, sizeof probe, "%s/tests/test.h", exe[0] ? exe : "/");
            if (access(probe, R_OK) == 0) {
                snprintf(srcdir, sizeof srcdir, "%s", exe[0] ? exe : "/");
                break;
            }
        }
    }
    return srcdir[0] ? srcdir : NULL;
}

const char *dp_test_fixtures(void) {
    static char dir[PATH_MAX + 32];
    const char *d = getenv("DP_TEST_FIXTURES");
    if (d && *d) return d;
    const char *src = dp_test_source_dir();
    /* no source tree: a path that names the problem when a test reports it */
    snprintf(dir, sizeof dir, "%s/tests/fixtures", src ? src : "(source tree not found from /proc/self/exe)");
    return dir;
}

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const struct entry *)a)->name, ((const struct entry *)b)->name);
}

/* A filter selects the tests whose name contains it; "^comm_" only those
 * whose name starts with "comm_" (so that a stage's filter does not pick up
 * ddp_evaluation_within_comm_timeout by accident). */
static int matches(const char *name, const char *filter) {
    if (filter[0] == '^') return strncmp(name, filter + 1, strlen(filter + 1)) == 0;
    return strstr(name, filter) != NULL;
}

static int selected(const char *name, int argc, char **argv) {
    if (argc <= 1) return 1;
    for (int i = 1; i < argc; i++)
        if (matches(name, argv[i])) return 1;
    return 0;
}

/* CI (CI=true, as CI services and scripts/test.sh set it) installs every dependency,
 * so there a skipped test is a failure. */
static int ci_strict(void) {
    const char *ci = getenv("CI");
    return ci && *ci && strcmp(ci, "0") != 0 && strcasecmp(ci, "false") != 0;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (lost_tests) {
        fprintf(stderr, "dptest: out of memory registering tests: %d not registered\n", lost_tests);
        return 2;
    }
    qsort(tests, (size_t)ntests, sizeof tests[0], cmp_entry);
    if (argc > 1 && strcmp(argv[1], "--list") == 0) {
        for (int i = 0; i < ntests; i++) printf("%s\n", tests[i].name);
        return 0;
    }
    /* Every filter must select something: a typo is an error, not a green run. */
    int unmatched = 0;
    for (int a = 1; a < argc; a++) {
        int hits = 0;
        for (int i = 0; i < ntests && !hits; i++) hits = matches(tests[i].name, argv[a]);
        if (!hits) {
            fprintf(stderr, "dptest: no test matches '%s' (dptest --list lists them)\n", argv[a]);
            unmatched++;
        }
    }
    if (unmatched) return 2;
    dp_test_source_dir(); /* resolved once, before the children */
    int passed = 0, failed = 0, skipped = 0;
    for (int i = 0; i < ntests; i++) {
        if (!selected(tests[i].name, argc, argv)) continue;
        snprintf(tmpdir, sizeof tmpdir, "/tmp/dptest.%d.%s", (int)getpid(), tests[i].name);
        mkdir(tmpdir, 0700);
        int pfd[2];
        if (pipe2(pfd, O_CLOEXEC) != 0) {
            fprintf(stderr, "dptest: pipe: %s\n", strerror(errno));
            return 2;
        }
        fflush(stdout);
        fflush(stderr);
        double t0 = now();
        pid_t pid = fork();
        if (pid == 0) {
            close(pfd[0]);
            skip_fd = pfd[1];
            alarm((unsigned)tests[i].timeout_s);
            tests[i].fn();
            fflush(stdout);
            _exit(0);
        }
        close(pfd[1]);
        int st = 0;
        waitpid(pid, &st, 0);
        double dt = now() - t0;
        /* the reason, if any: written before the child exited; a descendant
         * that still holds the pipe must not block this read */
        char why[512];
        fcntl(pfd[0], F_SETFL, O_NONBLOCK);
        ssize_t nw = read(pfd[0], why, sizeof why - 1);
        close(pfd[0]);
        why[nw > 0 ? nw : 0] = 0;
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", tmpdir);
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
            printf("ok   %-44s %7.2fs\n", tests[i].name, dt);
            passed++;
        } else if (WIFEXITED(st) && WEXITSTATUS(st) == SKIP_STATUS && nw > 0) {
            printf("skip %-44s (%s)\n", tests[i].name, why);
            skipped++;
        } else {
            if (WIFSIGNALED(st))
                printf("FAIL %-44s (signal %d%s)\n", tests[i].name, WTERMSIG(st),
                       WTERMSIG(st) == SIGALRM ? ", timeout" : "");
            else
                printf("FAIL %-44s (exit %d)\n", tests[i].name, WEXITSTATUS(st));
            failed++;
        }
    }
    int strict = ci_strict() && skipped > 0;
    if (strict)
        printf("CI=%s: %d skipped test%s fail%s the run (CI installs everything the tests need)\n",
               getenv("CI"), skipped, skipped == 1 ? "" : "s", skipped == 1 ? "s" : "");
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed || strict ? 1 : 0;
}
