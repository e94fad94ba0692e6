/* The test runner: one forked child per test, with a timeout. */
#include <signal.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

struct entry {
    const char *name;
    dp_test_fn fn;
    int timeout_s;
};
static struct entry tests[1024];
static int ntests;
static char tmpdir[256];

void dp_test_register(const char *name, dp_test_fn fn, int timeout_s) {
    if (ntests < (int)(sizeof tests / sizeof tests[0]))
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

const char *dp_test_tmpdir(void) { return tmpdir; }

const char *dp_test_fixtures(void) {
    const char *d = getenv("DP_TEST_FIXTURES");
    return d ? d : "tests/fixtures";
}

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const struct entry *)a)->name, ((const struct entry *)b)->name);
}

static int selected(const char *name, int argc, char **argv) {
    if (argc <= 1) return 1;
    for (int i = 1; i < argc; i++)
        if (strstr(name, argv[i])) return 1;
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--list") == 0) {
        qsort(tests, ntests, sizeof tests[0], cmp_entry);
        for (int i = 0; i < ntests; i++) printf("%s\n", tests[i].name);
        return 0;
    }
    qsort(tests, ntests, sizeof tests[0], cmp_entry);
    int passed = 0, failed = 0;
    for (int i = 0; i < ntests; i++) {
        if (!selected(tests[i].name, argc, argv)) continue;
        snprintf(tmpdir, sizeof tmpdir, "/tmp/dptest.%d.%s", (int)getpid(), tests[i].name);
        mkdir(tmpdir, 0700);
        fflush(stdout);
        double t0 = 0;
        {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            t0 = ts.tv_sec + 1e-9 * ts.tv_nsec;
        }
        pid_t pid = fork();
        if (pid == 0) {
            alarm((unsigned)tests[i].timeout_s);
            tests[i].fn();
            fflush(stdout);
            _exit(0);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double dt = ts.tv_sec + 1e-9 * ts.tv_nsec - t0;
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", tmpdir);
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
            printf("ok   %-44s %7.2fs\n", tests[i].name, dt);
            passed++;
        } else {
            if (WIFSIGNALED(st))
                printf("FAIL %-44s (signal %d%s)\n", tests[i].name, WTERMSIG(st),
                       WTERMSIG(st) == SIGALRM ? ", timeout" : "");
            else
                printf("FAIL %-44s\n", tests[i].name);
            failed++;
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
