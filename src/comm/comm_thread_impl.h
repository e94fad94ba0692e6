/* The thread backend's internals, shared by its files (comm_thread.c: abort, caller
 * progress, the ops table; comm_thread_exec.c: the step-flag layer and the communication
 * thread executing operations; comm_thread_msg.c: point-to-point messages;
 * comm_thread_world.c: the world and its ranks).  comm_thread.c's comment has the design. */
#ifndef DP_COMM_THREAD_IMPL_H
#define DP_COMM_THREAD_IMPL_H

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/core_impl.h"
#include "comm_impl.h"
#include "dp/core.h"

#define MSG_LEN 512
#define MAX_RANKS 1024
/* Step-flag sequence numbers per request: stage k of request n uses
 * n * SUBOPS + k (the hierarchical world runs up to two local stages). */
#define SUBOPS 4u

/* ---- shared state --------------------------------------------------------------------------- */

/* A point-to-point message in the receiver's mailbox: the bytes, copied by
 * the sender (eager), so a send completes as soon as it is posted. */
struct envelope {
    struct envelope *next;
    int src, tag;
    int64_t bytes;
    char data[];
};

struct slot {
    /* The two words every peer polls get 128 bytes to themselves (a pair of
     * cache lines, as adjacent-line prefetchers see them); dp_calloc gives
     * 64-byte alignment. */
    _Alignas(64) atomic_uint_least64_t prog; /* seq << 24 | mark; 0 before the first op */
    atomic_int nwait;                        /* sleepers on cv */
    char pad[128 - sizeof(atomic_uint_least64_t) - sizeof(atomic_int)];
    struct dp__op desc[2];                    /* of request n in desc[n & 1] (desc_of): written
                                                 before mark 1, by the owner only */
    atomic_int busy;                          /* this rank's threads inside a stretch that
                                                 touches peers' buffers ("Aborts and peers'
                                                 buffers") */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int present;                              /* rank initialised (under world mu) */
    /* point-to-point: the messages sent to this rank and not yet received,
     * in arrival order (under mb_mu; mb_cv: a message arrived, or abort) */
    pthread_mutex_t mb_mu;
    pthread_cond_t mb_cv;
    struct envelope *mb_head, *mb_tail;
};

struct dp_comm_world {
    int nranks;            /* ranks (threads) of this process */
    struct dp_comm *inter; /* hierarchical world: the process-level communicator, else NULL */
    int proc, nprocs;      /* this process's rank in inter and their number (0, 1 if flat) */
    struct dp_comm_params params;
    double spin_s;
    int long_spin;         /* spin up to LONG_SPIN_S while the core is the thread's own */
    atomic_int aborted;    /* 0, then 1 once; abort_msg is final before it is set */
    _Alignas(64) atomic_uint_least64_t claim; /* dp__coll_claim: seq << 32 | next chunk */
    char claim_pad[64 - sizeof(atomic_uint_least64_t)];
    pthread_mutex_t mu;    /* abort_msg (first writer), presence */
    char abort_msg[MSG_LEN];
    int nlive;             /* ranks initialised and not freed (under mu) */
    struct slot *slots;    /* (P) */
};

enum { REQ_QUEUED, REQ_RUNNING, REQ_DONE };

struct dp_comm_req {
    struct dp_comm_req *next;     /* queue or free list */
    struct dp_comm_req *all_next; /* every request this rank allocated */
    struct dp__op d;
    uint64_t seq;
    int state; /* under the rank's mu */
    int caller;      /* advanced by the owner's calls ("Caller progress"); fixed at start */
    int phase;       /* caller: 0 queued, 1 arrived, 2 own block summed, 3 finished (rc
                        set; owner only) */
    double deadline; /* caller: the timeout's deadline, from arrival; 0 = none */
    int rc;
    char msg[MSG_LEN];
};

struct thread_comm {
    struct dp_comm base;
    struct dp_comm_world *w;
    pthread_t thread;
    pthread_mutex_t mu;       /* everything below */
    pthread_cond_t cv_work;   /* comm thread: queue non-empty and nothing running, or stop */
    pthread_cond_t cv_done;   /* waiters: a request finished or `running` dropped */
    struct dp_comm_req *head, *tail, *freelist, *all;
    int running, stop, npending;
    uint64_t next_seq;        /* issue order, from 1 */
    int local;                /* this rank's slot (thread index in this process) */
    char **peer_buf;          /* (P) scratch for the executing operation */
};

/* Rank r's descriptor of the operation with step-flag sequence number seq:
 * two per rank, by the request number's parity, because with caller progress
 * a rank publishes request n+1 while its peers may still be reading request
 * n's (never n-1's: n+1 arrives only once n-1 is complete). */
static inline struct dp__op *desc_of(struct dp_comm_world *w, int r, uint64_t seq) {
    return &w->slots[r].desc[(seq / SUBOPS) & 1];
}

/* comm_thread.c */
int dp__thread_world_abort(struct dp_comm_world *w, const char *msg);
int dp__thread_world_status(const struct dp_comm_world *w);
int dp__thread_touch_begin(struct dp_comm_world *w, int local);
void dp__thread_touch_end(struct dp_comm_world *w, int local);
extern const struct dp_comm_ops dp__thread_ops;
/* comm_thread_exec.c */
int dp__thread_grank(const struct dp_comm_world *w, int r);
void dp__thread_execute(struct thread_comm *tc, struct dp_comm_req *rq);
void dp__thread_finish(struct thread_comm *tc, struct dp_comm_req *rq);
struct dp_comm_req *dp__thread_pop(struct thread_comm *tc);
void *dp__thread_main(void *arg);
/* comm_thread_msg.c */
int dp__thread_isend(struct dp_comm *c, const void *buf, int64_t bytes, int dest, int tag, struct dp_comm_msg **msg);
int dp__thread_irecv(struct dp_comm *c, void *buf, int64_t bytes, int src, int tag, struct dp_comm_msg **msg);
int dp__thread_msg_test(struct dp_comm *c, struct dp_comm_msg *m, int *done);
int dp__thread_msg_wait(struct dp_comm *c, struct dp_comm_msg *m, int *src, int64_t *bytes);
int dp__thread_msg_cancel(struct dp_comm *c, struct dp_comm_msg *m);

#endif
