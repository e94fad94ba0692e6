/* --timeline: Chrome trace-event JSON.  Each worker gets two tracks (thread
 * ids): its compute phases (data, forward, backward, wait, optimizer) and its
 * gradient buckets' all-reduces, so the overlap of communication with
 * backward is visible at a glance. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "timeline.h"

int dp_timeline_init(struct dp_timeline *tl, int64_t cap) {
    memset(tl, 0, sizeof *tl);
    if (cap <= 0) return DP_OK;
    tl->ev = dp_malloc(sizeof *tl->ev * (size_t)cap);
    if (!tl->ev) return dp_seterr(DP_ENOMEM, "timeline: cannot allocate %lld events", (long long)cap);
    tl->cap = cap;
    return DP_OK;
}

void dp_timeline_free(struct dp_timeline *tl) {
    dp_free(tl->ev);
    memset(tl, 0, sizeof *tl);
}

int dp_timeline_write(const char *path, const struct dp_timeline *tl, int P, int rank0, double t_origin,
                      const char *note) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return dp_seterr(DP_EIO, "timeline: cannot create %s: %s", tmp, strerror(errno));
    errno = 0; /* a failed write below leaves its reason here (ferror keeps only the flag) */
    fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    double t_last = 0;
    for (int i = 0; i < P; i++) {
        int r = rank0 + i;
        /* track names */
        fprintf(f, "%s{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": {\"name\": \"worker %d compute\"}}",
                i ? ",\n" : "", 2 * r, r);
        fprintf(f, ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": {\"name\": \"worker %d all-reduce\"}}",
                2 * r + 1, r);
        for (int64_t k = 0; k < tl[i].n; k++) {
            const struct dp_tl_event *e = &tl[i].ev[k];
            fprintf(f, ",\n{\"name\": \"%s\", \"ph\": \"X\", \"pid\": 0, \"tid\": %d, \"ts\": %.1f, \"dur\": %.1f, "
                    "\"args\": {\"%s\": %lld",
                    e->name, 2 * r + e->track, (e->t0 - t_origin) * 1e6, (e->t1 - e->t0) * 1e6,
                    e->track ? "bucket" : "step", (long long)e->arg);
            if (e->bytes > 0) fprintf(f, ", \"bytes\": %lld", (long long)e->bytes);
            if (e->micro >= 0) fprintf(f, ", \"micro\": %d", e->micro);
            fprintf(f, "}}");
            if (e->t1 > t_last) t_last = e->t1;
        }
    }
    if (note && note[0]) /* a global instant event, and the trace's metadata */
        fprintf(f, ",\n{\"name\": \"%s\", \"ph\": \"i\", \"s\": \"g\", \"pid\": 0, \"tid\": 0, \"ts\": %.1f}",
                note, (t_last > t_origin ? t_last - t_origin : 0) * 1e6);
    fprintf(f, "\n]");
    if (note && note[0]) fprintf(f, ", \"metadata\": {\"note\": \"%s\"}", note);
    fprintf(f, "}\n");
    int bad = ferror(f), e = errno;
    if (fclose(f) != 0) bad = 1, e = errno;
    if (bad || rename(tmp, path) != 0) {
        if (!bad) e = errno;
        remove(tmp);
        return dp_seterr(DP_EIO, "timeline: cannot write %s: %s", path, e ? strerror(e) : "I/O error");
    }
    return DP_OK;
}
