/* The mpi backend's internals, shared by its files (comm_mpi.c: state, errors, native
 * collectives, the ops table and init; comm_mpi_sched.c: the point-to-point schedules;
 * comm_mpi_run.c: running them, the queue, timeouts; comm_mpi_msg.c: point-to-point
 * messages).  See comm_mpi.c's comment for the design. */
#ifndef DP_COMM_MPI_IMPL_H
#define DP_COMM_MPI_IMPL_H
#ifdef DP_WITH_MPI

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "comm_impl.h"
#include "dp/core.h"

#define MSG_LEN 512
/* Point-to-point messages are cut into segments of SEG_BYTES; at most WINDOW
 * segments of one stream are in flight.  Received segments that are reduced
 * land in one of WINDOW scratch slots and are added into the buffer as soon
 * as they arrive, so the slot is still in cache. */
#ifndef SEG_BYTES /* -D overrides, for tuning; 1 MiB x 4 measured best of 64 KiB..32 MiB */
#define SEG_BYTES ((size_t)1 << 20)
#endif
#ifndef WINDOW
#define WINDOW 4
#endif
/* Segments to and from a rank on another host: NET_SEG_BYTES, NET_WINDOW of
 * them in flight.
 *
 * Why.  Over TCP (Open MPI's ob1 with the tcp BTL: the link between
 * machines) a message above the eager limit (64 KiB with its header, the
 * default) is a rendezvous: the sender announces it and sends the bulk only
 * once the receiver has acknowledged.  That acknowledgement leaves through
 * the receiver's own outgoing link (between two ranks, on the very TCP
 * connection of the receiver's own sends) behind whatever the receiver is
 * already sending: socket buffer and the link's queue, milliseconds at
 * 1 Gbit/s.  Every ring and rhd step sends and receives at once, so a rank
 * whose bulk has started holds back the acknowledgement its peer waits for;
 * at P = 2 the two directions then run one after the other, twice the link
 * time (docs/mpi.md has the measurement: about twice the link time before
 * this change, the link time after).  An eager message needs no acknowledgement, so
 * across hosts the segments are eager-sized: 64 KiB less 128 bytes for
 * ob1's match header (MPICH's TCP eager limit, 128 KiB, is larger); more of
 * them are in flight, NET_WINDOW * NET_SEG_BYTES = 2 MB, milliseconds of
 * link time, so the link stays busy while a waiting rank sleeps between
 * polls.  Within a host (shared memory) the large segments stay: single-copy
 * transfers, measured best there.  Both ends of a transfer make the same
 * choice (the pair is on one host or not), so they cut
 * it into the same segments. */
#ifndef NET_SEG_BYTES
#define NET_SEG_BYTES ((size_t)65408)
#endif
#ifndef NET_WINDOW
#define NET_WINDOW 32
#endif
#define MAX_WINDOW (WINDOW > NET_WINDOW ? WINDOW : NET_WINDOW)
#define SCRATCH_BYTES \
    (WINDOW * SEG_BYTES > NET_WINDOW * NET_SEG_BYTES ? WINDOW * SEG_BYTES : NET_WINDOW * NET_SEG_BYTES)
/* Native collectives take an int count: larger all-reduces and broadcasts
 * are issued in parts of NATIVE_PART elements (at most NATIVE_PARTS). */
#define NATIVE_PART ((int64_t)1 << 30)
#define NATIVE_PARTS 16
/* How long a timed-out rank waits for the others' answers. */
#define GRACE_S 2.0
#define SLEEP_MIN_NS 2000L
#define SLEEP_MAX_NS 256000L

/* ---- requests and schedules ----------------------------------------------------------------- */

/* One transfer of a step: `len` bytes at byte offset `off` of the buffer,
 * to or from rank `peer`. */
struct xfer {
    int peer;
    size_t off, len;
};

/* One step of a point-to-point schedule.  Every transfer of the step is in
 * flight at once; the step ends when all have completed.  With `reduce`,
 * recv[0] arrives in scratch slots and is added into buf[off..off+len);
 * otherwise receives land in the buffer.  With `forward` (the broadcast
 * chain), send[0] sends on each segment of recv[0] as soon as it arrived. */
struct step {
    struct xfer send[2], recv[2];
    int nsend, nrecv;
    int reduce, forward;
};

/* The segments of one transfer of the running step: nseg of seg bytes (the
 * last one shorter), at most win in flight. */
struct stream {
    int64_t nseg, posted, done;
    size_t seg;
    int win;
    MPI_Request req[MAX_WINDOW]; /* segment k in req[k % win] */
};

enum { KIND_NATIVE, KIND_P2P };

struct dp_comm_req {
    struct dp_comm_req *next; /* issue order, or the free list */
    struct dp__op d;
    uint64_t seq;             /* issue number, from 1 */
    int kind, done, rc;
    int inflight;             /* MPI requests of this operation are outstanding */
    /* native */
    MPI_Request mreq[NATIVE_PARTS];
    int nmreq;
    int *counts, *displs;     /* (P) reduce-scatter and all-gather */
    /* point-to-point */
    struct step *steps;       /* (cap) */
    int nsteps, cap, cur, begun;
    struct stream ss[2], rs[2];
    double deadline;          /* set by the wait working on it; 0 = none yet */
    char msg[MSG_LEN];
};

struct mpi_comm {
    struct dp_comm base;
    MPI_Comm coll, p2p, side, msgc; /* msgc: dp_comm_isend/irecv, apart from the schedules' p2p */
    MPI_Op bf16_sum;
    int tag_ub;
    int provided;             /* MPI's thread level */
    int local_rank, local_size;
    unsigned char *remote;    /* (P) rank q is on another host: NET_SEG_BYTES segments */
    double timeout_s, spin_s;
    struct dp_comm_req *head, *tail, *freelist;
    int npending;
    uint64_t next_seq;
    char *scratch;            /* SCRATCH_BYTES: win slots of seg bytes */
    uint64_t *diag_out;       /* the timeout message; leaked if its sends never complete */
    int diag_sent;
    unsigned char *lost;      /* (P) or NULL: rank q did not respond to a timeout's question */
    atomic_int aborted;
    pthread_mutex_t mu;       /* abort_msg */
    char abort_msg[MSG_LEN];
};

/* comm_mpi.c */
int dp__mpi_fail(const struct mpi_comm *m, int err, const char *call);
void dp__mpi_set_aborted(struct mpi_comm *m, const char *msg);
int dp__mpi_aborted_status(struct mpi_comm *m);
void dp__mpi_finish(struct dp_comm_req *rq, int rc);
void dp__mpi_fail_op(struct mpi_comm *m, struct dp_comm_req *rq, int rc);
int dp__mpi_native_poll(struct mpi_comm *m, struct dp_comm_req *rq, int *done);
void dp__mpi_nap(long ns);
void dp__mpi_note_orphan(void); /* an operation abandoned unfinished: MPI_Finalize is skipped */
/* comm_mpi_sched.c: the steps of a ring, rhd, chain or binomial operation */
int dp__mpi_build_schedule(struct mpi_comm *m, struct dp_comm_req *rq);
/* comm_mpi_run.c: runs the queue's operations in issue order; a timed-out one diagnosed */
struct dp_comm_req *dp__mpi_poll_queue(struct mpi_comm *m, int *moved);
void dp__mpi_timed_out(struct mpi_comm *m, struct dp_comm_req *rq);
/* comm_mpi_msg.c: the dp_comm_ops message entries */
int dp__mpi_isend(struct dp_comm *c, const void *buf, int64_t bytes, int dest, int tag, struct dp_comm_msg **msg);
int dp__mpi_irecv(struct dp_comm *c, void *buf, int64_t bytes, int src, int tag, struct dp_comm_msg **msg);
int dp__mpi_msg_test(struct dp_comm *c, struct dp_comm_msg *g, int *done);
int dp__mpi_msg_wait(struct dp_comm *c, struct dp_comm_msg *g, int *src, int64_t *bytes);
int dp__mpi_msg_cancel(struct dp_comm *c, struct dp_comm_msg *g);

#endif /* DP_WITH_MPI */
#endif
