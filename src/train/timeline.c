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

int dp_timeline_write(const char *path, const struct dp_timeline *tl, int P, double t_origin) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return dp_seterr(DP_EIO, "timeline: cannot create %s: %s", tmp, strerror(errno));
    fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    int first = 1;
    for (int r = 0; r < P; r++) {
        /* track names */
        fprintf(f, "%s{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": {\"name\": \"worker %d compute\"}}",
                first ? "" : ",\n", 2 * r, r);
        first = 0;
        fprintf(f, ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": {\"name\": \"worker %d all-reduce\"}}",
                2 * r + 1, r);
        for (int64_t i = 0; i < tl[r].n; i++) {
            const struct dp_tl_event *e = &tl[r].ev[i];
            fprintf(f, ",\n{\"name\": \"%s\", \"ph\": \"X\", \"pid\": 0, \"tid\": %d, \"ts\": %.1f, \"dur\": %.1f, "
                    "\"args\": {\"%s\": %lld}}",
                    e->name, 2 * r + e->track, (e->t0 - t_origin) * 1e6, (e->t1 - e->t0) * 1e6,
                    e->track ? "bucket" : "step", (long long)e->arg);
        }
    }
    fprintf(f, "\n]}\n");
    int bad = ferror(f);
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
        remove(tmp);
        return dp_seterr(DP_EIO, "timeline: cannot write %s", path);
    }
    return DP_OK;
}
