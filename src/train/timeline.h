/* Per-worker event recording for --timeline (Chrome trace-event format,
 * viewable in Perfetto or chrome://tracing).  Internal to src/train. */
#ifndef DP_TRAIN_TIMELINE_H
#define DP_TRAIN_TIMELINE_H

#include "dp/common.h"

struct dp_tl_event {
    const char *name;   /* static string */
    int track;          /* 0 = compute, 1 = communication */
    int64_t arg;        /* step, or bucket index */
    int64_t bytes;      /* a bucket's gradient bytes (0: not a bucket) */
    int micro;          /* a pipeline's micro-batch (-1: none) */
    double t0, t1;      /* dp_time() seconds */
};

struct dp_timeline {
    struct dp_tl_event *ev;
    int64_t n, cap;
    int64_t dropped;    /* events not recorded once cap was reached */
};

/* cap = 0 disables recording (every add is a no-op). */
int dp_timeline_init(struct dp_timeline *tl, int64_t cap);
void dp_timeline_free(struct dp_timeline *tl);
/* Records one event; NULL when recording is off or the buffer is full. */
static inline struct dp_tl_event *dp_timeline_push(struct dp_timeline *tl, const char *name, int track,
                                                   int64_t arg, double t0, double t1) {
    if (!tl->cap) return NULL;
    if (tl->n == tl->cap) {
        tl->dropped++;
        return NULL;
    }
    struct dp_tl_event *e = &tl->ev[tl->n++];
    e->name = name, e->track = track, e->arg = arg, e->bytes = 0, e->micro = -1, e->t0 = t0, e->t1 = t1;
    return e;
}
static inline void dp_timeline_add(struct dp_timeline *tl, const char *name, int track, int64_t arg,
                                   double t0, double t1) {
    (void)dp_timeline_push(tl, name, track, arg, t0, t1);
}
/* A bucket's all-reduce on the communication track, with its size (tools
 * such as bench/netns_overlap_ceiling.sh compute link times from it). */
static inline void dp_timeline_add_bucket(struct dp_timeline *tl, int64_t bucket, int64_t bytes, double t0,
                                          double t1) {
    struct dp_tl_event *e = dp_timeline_push(tl, "all-reduce", 1, bucket, t0, t1);
    if (e) e->bytes = bytes;
}
/* Writes the P workers' events to path (atomically), times relative to
 * t_origin; tl[i] is job rank rank0 + i.  A non-empty `note` (for example the
 * straggler) is written as an instant event at the end and in the trace's
 * metadata. */
int dp_timeline_write(const char *path, const struct dp_timeline *tl, int P, int rank0, double t_origin,
                      const char *note);

#endif
