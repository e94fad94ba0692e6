/* The CLI's shared helpers (cli.h): the one error exit, the job's
 * communicator it ends, warnings, and the option value parsers. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/comm.h"
#include "dp/core.h"
#include "cli.h"

static const char *prog = "dptrain";
/* The process-level communicator of a multi-process job (MPI), once made. */
static struct dp_comm *job;

void dptrain_die(const char *fmt, ...) {
    /* the line in one write: under mpirun every process may die at once, and
     * a line written in pieces comes out interleaved with the others' */
    char line[4096];
    int n = snprintf(line, sizeof line, "%s: error: ", prog);
    if (job && dp_comm_world(job) > 1) n += snprintf(line + n, sizeof line - (size_t)n, "process %d: ", dp_comm_rank(job));
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    fflush(stdout);
    fwrite(line, 1, (size_t)n, stderr);
    fflush(stderr);
    /* The other processes may be waiting in a collective for this one: end
     * the whole job (MPI_Abort) instead of leaving them to time out. */
    if (job && dp_comm_world(job) > 1) dp_comm_kill_job(job, 1);
    dp_comm_free(job);
    exit(1);
}

void dptrain_die_rc(int rc) { dptrain_die("%s", dp_errmsg()[0] ? dp_errmsg() : dp_strerror(rc)); }

struct dp_comm *dptrain_job_start(const struct dp_comm_params *cp) {
    if (!job && dp_comm_init(&job, "mpi", cp)) dptrain_die_rc(DP_EINVAL);
    return job;
}
struct dp_comm *dptrain_job_init(void) {
    struct dp_comm_params cp = dp_comm_default_params();
    return dptrain_job_start(&cp);
}
void dptrain_job_free(void) {
    dp_comm_free(job);
    job = NULL;
}

void dptrain_warn_gemm_fallback(void) {
    const char *note = dp_gemm_fallback_note();
    if (!note) return;
    fprintf(stderr, "%s: warning: ", prog);
    if (job && dp_comm_world(job) > 1) fprintf(stderr, "process %d: ", dp_comm_rank(job));
    fprintf(stderr, "%s; %lld GEMM call%s fell back so far\n", note, (long long)dp_gemm_fallback_count(),
            dp_gemm_fallback_count() == 1 ? "" : "s");
    fflush(stderr);
}

int dptrain_take(int argc, char **argv, int *i, const char *name, const char **val) {
    size_t n = strlen(name);
    const char *s = argv[*i];
    if (strncmp(s, name, n) != 0) return 0;
    if (s[n] == '=') {
        *val = s + n + 1;
        return 1;
    }
    if (s[n] != 0) return 0;
    if (*i + 1 >= argc) dptrain_die("option %s needs a value (see 'dptrain %s --help')", name, argv[0]);
    *val = argv[++*i];
    return 1;
}

long long dptrain_int_arg(const char *name, const char *v, long long lo, long long hi) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        dptrain_die("%s: '%s' is not an integer in %lld..%lld", name, v, lo, hi);
    return x;
}

double dptrain_num_arg(const char *name, const char *v, double lo, double hi) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x) || !(x >= lo && x <= hi))
        dptrain_die("%s: '%s' is not a number in %g..%g", name, v, lo, hi);
    return x;
}
