/*
 * The mpi backend: one rank per process of MPI_COMM_WORLD (docs/mpi.md).
 *
 * Compiled only with DP_WITH_MPI (the Makefile defines it when it finds
 * mpicc); otherwise this file is empty and dp_comm_init(.., "mpi", ..)
 * returns DP_ENOTSUP from comm.c.
 *
 * State (struct mpi_comm, one per dp_comm_init):
 *   - three duplicates of MPI_COMM_WORLD, all with MPI_ERRORS_RETURN:
 *       coll   the native collectives (MPI_Iallreduce, ...);
 *       p2p    the project's ring and rhd, written over MPI_Isend/Irecv;
 *       side   the timeout diagnosis (one message per rank, see timed_out);
 *     separate communicators keep the three kinds of traffic from matching
 *     each other's messages;
 *   - the requests not yet released, in issue order (a FIFO);
 *   - the scratch the point-to-point reductions receive into (WINDOW
 *     segments, allocated once);
 *   - which ranks are on another host (their messages are cut finer);
 *   - the abort flag and message (dp_comm_abort may come from any thread).
 *
 * Execution and order.  A native operation is handed to MPI when it is
 * issued (MPI_I* returns at once) and progresses inside MPI; a blocking one
 * with no timeout and nothing pending before it is simply MPI's blocking
 * call (MPI_Allreduce, ...).  A ring or rhd operation is a schedule of steps
 * (built when it is issued) that runs only inside dp_comm_wait and
 * dp_comm_test, one operation at a time, in issue order: a wait on a later
 * request first runs and completes the earlier ones.  Requests are marked
 * done in issue order.  All ranks issue the same sequence, so every rank
 * runs the point-to-point schedules in the same order, and a native
 * operation, already started everywhere, cannot be blocked by them:
 * whatever a rank waits on, its MPI calls progress every started operation.
 *
 * Waiting polls (MPI_Test / MPI_Testall): it spins for spin_us after the
 * last progress (and at first for as long as the operation's bytes take at
 * 2 GB/s, see spin_budget), then sleeps with nanosleep, 2 µs doubling to
 * 256 µs, so a rank that waits for a late peer does not eat a core that the
 * peer, or this process's compute thread, may need.  With timeout_s > 0
 * each operation gets timeout_s from the moment a wait starts working on
 * it.
 *
 * Thread level.  MPI_THREAD_SERIALIZED at least: one thread at a time uses
 * the communicator, not always the one that created it (dptrain's trainer
 * issues from a communication thread).  dp_comm_abort and dp_comm_status
 * make no MPI call and may come from any thread.
 */
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

/* ---- process-wide: who initialised MPI ------------------------------------------------------ */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_we_init;  /* dp_comm_init called MPI_Init_thread */
static int g_live;     /* communicators not yet freed */
static int g_orphans;  /* some MPI operation was abandoned unfinished: no MPI_Finalize */

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
    atomic_int aborted;
    pthread_mutex_t mu;       /* abort_msg */
    char abort_msg[MSG_LEN];
};

/* ---- errors and abort ---------------------------------------------------------------------- */

static int mpi_fail(const struct mpi_comm *m, int err, const char *call) {
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(err, s, &n) != MPI_SUCCESS) snprintf(s, sizeof s, "error %d", err);
    return dp_seterr(DP_EIO, "comm: rank %d: %s failed: %s", m ? m->base.rank : -1, call, s);
}

/* Marks the communicator aborted with `msg` (the first message is kept). */
static void set_aborted(struct mpi_comm *m, const char *msg) {
    pthread_mutex_lock(&m->mu);
    if (!atomic_load(&m->aborted)) {
        snprintf(m->abort_msg, sizeof m->abort_msg, "%s", msg);
        atomic_store(&m->aborted, 1);
    }
    pthread_mutex_unlock(&m->mu);
}

static int aborted_status(struct mpi_comm *m) {
    if (!atomic_load_explicit(&m->aborted, memory_order_acquire)) return 0;
    pthread_mutex_lock(&m->mu);
    int rc = dp_seterr(DP_ECANCELED, "%s", m->abort_msg);
    pthread_mutex_unlock(&m->mu);
    return rc;
}

/* Ends rq with status rc and this thread's message. */
static void finish(struct dp_comm_req *rq, int rc) {
    rq->done = 1;
    rq->rc = rc;
    if (rc) snprintf(rq->msg, sizeof rq->msg, "%s", dp_errmsg()[0] ? dp_errmsg() : dp_strerror(rc));
}

/* An operation that fails ends the communicator: its message becomes the
 * abort message, so every later operation fails with it. */
static void fail_op(struct mpi_comm *m, struct dp_comm_req *rq, int rc) {
    if (rq->inflight) {
        /* MPI still owns this operation's requests.  The receives of a
         * point-to-point step are cancelled where MPI still can, so that
         * they do not write into the buffer later; sends and native
         * collectives cannot be taken back.  MPI_Finalize is skipped. */
        for (int i = 0; rq->kind == KIND_P2P && i < 2; i++) {
            struct stream *s = &rq->rs[i];
            for (int64_t k = s->done; k < s->posted; k++) {
                MPI_Request *q = &s->req[k % s->win];
                int flag = 0;
                MPI_Cancel(q);
                MPI_Test(q, &flag, MPI_STATUS_IGNORE);
                if (!flag) MPI_Request_free(q);
            }
            s->done = s->posted;
        }
        pthread_mutex_lock(&g_mu);
        g_orphans = 1;
        pthread_mutex_unlock(&g_mu);
        rq->inflight = 0;
    }
    finish(rq, rc);
    set_aborted(m, rq->msg);
}

/* ---- native collectives ---------------------------------------------------------------------- */

static MPI_Datatype mpi_type(enum dp_dtype t) {
    return t == DP_DTYPE_F32 ? MPI_FLOAT : t == DP_DTYPE_F64 ? MPI_DOUBLE : MPI_UINT16_T;
}

/* The bf16 sum for MPI: inout[i] = in[i] + inout[i] in fp32, rounded once
 * (commutative, as MPI_Op_create is told). */
static void bf16_sum_fn(void *in, void *inout, int *len, MPI_Datatype *type) {
    (void)type;
    dp__reduce_add(inout, in, *len, DP_DTYPE_BF16);
}

static int native_poll(struct mpi_comm *m, struct dp_comm_req *rq, int *done);

/* Starts rq's native collective: MPI_I* (nonblocking: libnbc in Open MPI),
 * or with `now` the blocking MPI call, which completes it (Open MPI's tuned
 * algorithms: several times faster than libnbc's at large sizes here, see
 * docs/mpi.md). */
static int native_start(struct mpi_comm *m, struct dp_comm_req *rq, int now) {
    const struct dp__op *d = &rq->d;
    MPI_Datatype t = mpi_type(d->dtype);
    MPI_Op op = d->dtype == DP_DTYPE_BF16 ? m->bf16_sum : MPI_SUM;
    size_t es = dp_dtype_size(d->dtype);
    int P = m->base.nranks, err = MPI_SUCCESS;
    const char *call = "MPI_Ibarrier";
    rq->nmreq = 0;
    switch (d->coll) {
    case DP_COLL_ALLREDUCE:
    case DP_COLL_BROADCAST:
        call = d->coll == DP_COLL_ALLREDUCE ? "MPI_Iallreduce" : "MPI_Ibcast";
        for (int64_t o = 0; err == MPI_SUCCESS && (o < d->count || o == 0); o += NATIVE_PART) {
            int n = (int)(d->count - o < NATIVE_PART ? d->count - o : NATIVE_PART);
            char *p = (char *)d->buf + (size_t)o * es;
            MPI_Request *q = &rq->mreq[rq->nmreq];
            if (d->coll == DP_COLL_ALLREDUCE)
                err = now ? MPI_Allreduce(MPI_IN_PLACE, p, n, t, op, m->coll)
                          : MPI_Iallreduce(MPI_IN_PLACE, p, n, t, op, m->coll, q);
            else
                err = now ? MPI_Bcast(p, n, t, d->root, m->coll)
                          : MPI_Ibcast(p, n, t, d->root, m->coll, q);
            if (err == MPI_SUCCESS && !now) rq->nmreq++;
        }
        break;
    case DP_COLL_REDUCE_SCATTER:
    case DP_COLL_ALLGATHER:
        for (int q = 0; q < P; q++) {
            int64_t off, len;
            dp_comm_split(d->count, P, q, &off, &len);
            rq->counts[q] = (int)len;
            rq->displs[q] = (int)off;
        }
        if (d->coll == DP_COLL_REDUCE_SCATTER) {
            /* In place, MPI takes the whole vector from buf and leaves this
             * rank's block at the start of buf; native_poll moves it. */
            call = "MPI_Ireduce_scatter";
            err = now ? MPI_Reduce_scatter(MPI_IN_PLACE, d->buf, rq->counts, t, op, m->coll)
                      : MPI_Ireduce_scatter(MPI_IN_PLACE, d->buf, rq->counts, t, op, m->coll,
                                            &rq->mreq[0]);
        } else {
            call = "MPI_Iallgatherv";
            err = now ? MPI_Allgatherv(MPI_IN_PLACE, 0, t, d->buf, rq->counts, rq->displs, t,
                                       m->coll)
                      : MPI_Iallgatherv(MPI_IN_PLACE, 0, t, d->buf, rq->counts, rq->displs, t,
                                        m->coll, &rq->mreq[0]);
        }
        if (err == MPI_SUCCESS && !now) rq->nmreq = 1;
        break;
    default:
        err = now ? MPI_Barrier(m->coll) : MPI_Ibarrier(m->coll, &rq->mreq[0]);
        if (err == MPI_SUCCESS && !now) rq->nmreq = 1;
        break;
    }
    rq->inflight = rq->nmreq > 0;
    if (err != MPI_SUCCESS) return mpi_fail(m, err, call);
    if (now) {
        int done;
        native_poll(m, rq, &done); /* the reduce-scatter's move; nmreq = 0 */
        finish(rq, 0);
    }
    return 0;
}

/* Tests a started native operation once; *done when it has completed. */
static int native_poll(struct mpi_comm *m, struct dp_comm_req *rq, int *done) {
    int flag = 0, err = MPI_Testall(rq->nmreq, rq->mreq, &flag, MPI_STATUSES_IGNORE);
    if (err != MPI_SUCCESS) return mpi_fail(m, err, "MPI_Testall");
    *done = flag;
    if (!flag) return 0;
    rq->inflight = 0;
    if (rq->d.coll == DP_COLL_REDUCE_SCATTER) {
        int r = m->base.rank;
        size_t es = dp_dtype_size(rq->d.dtype);
        if (rq->displs[r] && rq->counts[r])
            memmove((char *)rq->d.buf + (size_t)rq->displs[r] * es, rq->d.buf,
                    (size_t)rq->counts[r] * es);
    }
    return 0;
}

/* ---- point-to-point schedules ---------------------------------------------------------------
 *
 * Vocabulary as in comm_impl.h and algo_ring.c / algo_rhd.c: P ranks, this
 * rank r, l = r-1 and rr = r+1 mod P; blk(b) = block b of
 * dp_comm_split(count, P, b).  "send X to q" and "recv X from q" are
 * MPI_Isend / MPI_Irecv of the bytes of X on the p2p communicator with the
 * operation's tag (its issue number mod MPI_TAG_UB+1).  Between two ranks
 * the messages of one operation are matched in the order they were posted
 * (MPI's non-overtaking rule), and both sides cut every transfer into the
 * same segments, so no message needs more than the operation's tag.  A
 * transfer of length 0 is skipped by both sides. */

static int mod(int a, int p) { return ((a % p) + p) % p; }

static void blk(const struct dp__op *d, int P, int b, size_t *off, size_t *len) {
    int64_t o, n;
    dp_comm_split(d->count, P, b, &o, &n);
    size_t es = dp_dtype_size(d->dtype);
    *off = (size_t)o * es, *len = (size_t)n * es;
}

/* Appends an empty step; NULL when out of memory. */
static struct step *add_step(struct dp_comm_req *rq) {
    if (rq->nsteps == rq->cap) {
        int cap = rq->cap ? 2 * rq->cap : 16;
        struct step *s = dp_malloc(sizeof *s * (size_t)cap);
        if (!s) return NULL;
        if (rq->nsteps) memcpy(s, rq->steps, sizeof *s * (size_t)rq->nsteps);
        dp_free(rq->steps);
        rq->steps = s, rq->cap = cap;
    }
    struct step *st = &rq->steps[rq->nsteps++];
    memset(st, 0, sizeof *st);
    return st;
}
static void add_send(struct step *st, int peer, size_t off, size_t len) {
    st->send[st->nsend++] = (struct xfer){peer, off, len};
}
static void add_recv(struct step *st, int peer, size_t off, size_t len) {
    st->recv[st->nrecv++] = (struct xfer){peer, off, len};
}

#define STEP(st)                                  \
    struct step *st = add_step(rq);               \
    if (!st) return DP_ENOMEM

/*
 * Ring all-reduce, reduce-scatter and all-gather over MPI.
 *
 * Protocol (the one of dp__allreduce_ring, with messages instead of reads of
 * the left neighbour's buffer).  P-1 reduce-scatter steps, then P-1
 * all-gather steps; in each, every rank sends one block to the right and
 * receives one from the left:
 *   RS step s (0..P-2): send blk(r-1-s) to rr; recv blk(r-2-s) from l and add
 *       it into mine.  (At s = 0 the block sent is this rank's input; later,
 *       the partial sum it completed at step s-1.)  After step P-2, block r
 *       holds the full sum.
 *   AG step t (0..P-2): send blk(r-t) to rr (final: my own block at t = 0,
 *       else the one received at step t-1); recv blk(r-1-t) from l into mine.
 * Reduce-scatter is the RS steps, all-gather the AG steps.  Each rank sends
 * and receives 2(P-1)/P of the buffer in all: bandwidth-optimal.  Inside a
 * step the block is pipelined in segments, each received segment added into
 * the buffer while later ones are in flight.
 *
 *   3 ranks, all-reduce     rank 0              rank 1              rank 2
 *   RS 0                    send [2], +=[1]     send [0], +=[2]     send [1], +=[0]
 *   RS 1                    send [1], +=[0]     send [2], +=[1]     send [0], +=[2]
 *                           [0] = S[0]          [1] = S[1]          [2] = S[2]
 *   AG 0                    send [0], =[2]      send [1], =[0]      send [2], =[1]
 *   AG 1                    send [2], =[1]      send [0], =[2]      send [1], =[0]
 */
static int sched_ring(struct dp_comm_req *rq, int P, int r, int rs, int ag) {
    const struct dp__op *d = &rq->d;
    int l = mod(r - 1, P), rr = mod(r + 1, P);
    size_t o, n;
    for (int s = 0; rs && s < P - 1; s++) {
        STEP(st);
        blk(d, P, mod(r - 1 - s, P), &o, &n);
        add_send(st, rr, o, n);
        blk(d, P, mod(r - 2 - s, P), &o, &n);
        add_recv(st, l, o, n);
        st->reduce = 1;
    }
    for (int t = 0; ag && t < P - 1; t++) {
        STEP(st);
        blk(d, P, mod(r - t, P), &o, &n);
        add_send(st, rr, o, n);
        blk(d, P, mod(r - 1 - t, P), &o, &n);
        add_recv(st, l, o, n);
    }
    return 0;
}

/*
 * Ring broadcast: a pipelined chain root -> root+1 -> ... -> root-1.
 *
 * Protocol.  v = (r - root) mod P.  One step per rank: the root sends the
 * whole buffer to its successor; a middle rank receives it from its
 * predecessor and forwards every segment to its successor as soon as it has
 * arrived (so all links carry segments at once); the last rank only
 * receives.  Time about (n + (P-2)·segment)/bandwidth.
 *
 *   root 0, 3 ranks, segments c0 c1 c2:
 *   time   0: 0->1 c0;   1: 0->1 c1, 1->2 c0;   2: 0->1 c2, 1->2 c1;   3: 1->2 c2
 */
static int sched_chain(struct dp_comm_req *rq, int P, int r) {
    const struct dp__op *d = &rq->d;
    int v = mod(r - d->root, P);
    size_t n = (size_t)d->count * dp_dtype_size(d->dtype);
    STEP(st);
    if (v > 0) add_recv(st, mod(r - 1, P), 0, n);
    if (v < P - 1) add_send(st, mod(r + 1, P), 0, n);
    st->forward = v > 0 && v < P - 1;
    return 0;
}

/* Recursive halving-doubling: the fold and unit ranges of algo_rhd.c
 * (vocabulary there: P' = the largest power of two <= P, L = log2 P',
 * rem = P - P', new rank nr, units). */
struct rhd {
    int P, Pp, L, rem, nr, U;
};

static void rhd_setup(struct rhd *h, int P, int r, int units_are_blocks) {
    h->P = P, h->Pp = 1, h->L = 0;
    while (h->Pp * 2 <= P) h->Pp *= 2, h->L++;
    h->rem = P - h->Pp;
    h->nr = r < 2 * h->rem ? (r % 2 ? r / 2 : -1) : r - h->rem;
    h->U = units_are_blocks ? P : h->Pp;
}
static int rhd_orig(const struct rhd *h, int nr) { return nr < h->rem ? 2 * nr + 1 : nr + h->rem; }
/* Units [*lo, *hi) new rank nr holds after `levels` halving levels. */
static void rhd_units(const struct rhd *h, int nr, int levels, int *lo, int *hi) {
    int a = 0, b = h->U;
    for (int k = 0; k < levels; k++) {
        int mid = a + (b - a) / 2;
        if (nr & (h->Pp >> (k + 1))) a = mid;
        else b = mid;
    }
    *lo = a, *hi = b;
}
/* The original rank whose leaf range holds unit u. */
static int rhd_holder(const struct rhd *h, int u) {
    int a = 0, b = h->U, nr = 0;
    for (int k = 0; k < h->L; k++) {
        int mid = a + (b - a) / 2;
        if (u >= mid) nr |= h->Pp >> (k + 1), a = mid;
        else b = mid;
    }
    return rhd_orig(h, nr);
}
/* Byte range of units [lo, hi). */
static void rhd_bytes(const struct dp__op *d, const struct rhd *h, int lo, int hi, size_t *off,
                      size_t *len) {
    size_t o1, n1, o2, n2;
    blk(d, h->U, lo, &o1, &n1);
    if (hi <= lo) {
        *off = o1, *len = 0;
        return;
    }
    blk(d, h->U, hi - 1, &o2, &n2);
    *off = o1, *len = o2 + n2 - o1;
}

/* Halving level k: partner p = orig(nr ^ P'>>(k+1)); our common range splits
 * at its middle unit, the rank with that bit clear keeps the lower half.
 * Send p's half, recv mine into scratch and add it. */
static int rhd_halving(struct dp_comm_req *rq, const struct rhd *h) {
    for (int k = 0; k < h->L; k++) {
        int pn = h->nr ^ (h->Pp >> (k + 1)), lo, hi;
        size_t o, n;
        STEP(st);
        rhd_units(h, pn, k + 1, &lo, &hi);
        rhd_bytes(&rq->d, h, lo, hi, &o, &n);
        add_send(st, rhd_orig(h, pn), o, n);
        rhd_units(h, h->nr, k + 1, &lo, &hi);
        rhd_bytes(&rq->d, h, lo, hi, &o, &n);
        add_recv(st, rhd_orig(h, pn), o, n);
        st->reduce = 1;
    }
    return 0;
}

/* Doubling step k: partner p = orig(nr ^ 1<<k); send my range (after L-k
 * levels), recv p's into place.  Afterwards both hold the union. */
static int rhd_doubling(struct dp_comm_req *rq, const struct rhd *h) {
    for (int k = 0; k < h->L; k++) {
        int pn = h->nr ^ (1 << k), lo, hi;
        size_t o, n;
        STEP(st);
        rhd_units(h, h->nr, h->L - k, &lo, &hi);
        rhd_bytes(&rq->d, h, lo, hi, &o, &n);
        add_send(st, rhd_orig(h, pn), o, n);
        rhd_units(h, pn, h->L - k, &lo, &hi);
        rhd_bytes(&rq->d, h, lo, hi, &o, &n);
        add_recv(st, rhd_orig(h, pn), o, n);
    }
    return 0;
}

/*
 * Recursive halving-doubling all-reduce (Rabenseifner) over MPI.
 *
 * Protocol (dp__allreduce_rhd's, with messages).  Units: P' parts of the
 * buffer.
 *   fold (P not a power of two): even r < 2rem sends its whole buffer to
 *       r+1 and waits; odd r < 2rem receives it and adds it into its own.
 *   halving level k (0..L-1): partner p = orig(nr ^ P'>>(k+1)); send p's
 *       half of our common unit range, recv mine and add it.  After L levels
 *       new rank nr holds the full sum of unit nr.
 *   doubling step k (0..L-1): partner p = orig(nr ^ 1<<k); send the range I
 *       hold, recv p's.  After L steps every participant holds everything.
 *   unfold: odd r < 2rem sends the whole result to r-1, which receives it.
 * 2L steps of n/2, n/4, ... bytes each way, plus 2 whole-buffer steps with a
 * fold.
 *
 *   4 ranks, units a b c d   rank 0          rank 1          rank 2          rank 3
 *   halve 0 (0-2, 1-3)       +=ab, send cd   +=ab, send cd   +=cd, send ab   +=cd, send ab
 *   halve 1 (0-1, 2-3)       +=a, send b     +=b, send a     +=c, send d     +=d, send c
 *   double 0 (0-1, 2-3)      send a, =b      send b, =a      send c, =d      send d, =c
 *   double 1 (0-2, 1-3)      send ab, =cd    send ab, =cd    send cd, =ab    send cd, =ab
 */
static int sched_rhd_allreduce(struct dp_comm_req *rq, int P, int r) {
    struct rhd h;
    rhd_setup(&h, P, r, 0);
    size_t n = (size_t)rq->d.count * dp_dtype_size(rq->d.dtype);
    if (h.nr < 0) {
        STEP(a);
        add_send(a, r + 1, 0, n);
        STEP(b);
        add_recv(b, r + 1, 0, n);
        return 0;
    }
    if (r < 2 * h.rem) {
        STEP(st);
        add_recv(st, r - 1, 0, n);
        st->reduce = 1;
    }
    int rc = rhd_halving(rq, &h);
    if (!rc) rc = rhd_doubling(rq, &h);
    if (!rc && r < 2 * h.rem) {
        STEP(st);
        add_send(st, r - 1, 0, n);
    }
    return rc;
}

/*
 * Recursive-halving reduce-scatter over MPI.
 *
 * Protocol (dp__reduce_scatter_rhd's).  Units are the P blocks.
 *   fold and halving levels as in the all-reduce; afterwards participant nr
 *       holds the full sums of its leaf (one or two blocks).
 *   final step (every rank): send each block u of my leaf (u != r) to rank
 *       u; recv blk(r) from its holder when that is not me.
 *
 *   3 ranks (P' = 2): rank 1 = new 0 holds block 0, rank 2 = new 1 holds 1, 2
 *   fold     rank 0 -> rank 1 (whole buffer; rank 1 adds)
 *   halve 0  rank 1 sends [1,2] to rank 2, rank 2 sends [0] to rank 1 (both add)
 *   final    rank 1 sends [0] to rank 0; rank 2 sends [1] to rank 1
 */
static int sched_rhd_reduce_scatter(struct dp_comm_req *rq, int P, int r) {
    struct rhd h;
    rhd_setup(&h, P, r, 1);
    size_t n = (size_t)rq->d.count * dp_dtype_size(rq->d.dtype), o, len;
    int rc = 0;
    if (r < 2 * h.rem) {
        STEP(st);
        if (h.nr < 0) add_send(st, r + 1, 0, n);
        else add_recv(st, r - 1, 0, n), st->reduce = 1;
    }
    if (h.nr >= 0 && (rc = rhd_halving(rq, &h))) return rc;
    STEP(st);
    if (h.nr >= 0) {
        int lo, hi;
        rhd_units(&h, h.nr, h.L, &lo, &hi);
        for (int u = lo; u < hi; u++) {
            if (u == r) continue;
            blk(&rq->d, P, u, &o, &len);
            add_send(st, u, o, len);
        }
    }
    int holder = rhd_holder(&h, r);
    if (holder != r) {
        blk(&rq->d, P, r, &o, &len);
        add_recv(st, holder, o, len);
    }
    return 0;
}

/*
 * Recursive-doubling all-gather over MPI.
 *
 * Protocol (dp__allgather_rhd's).  Units are the P blocks.
 *   gather (every rank): send blk(r) to its holder when that is not me; a
 *       participant receives every block u != r of its leaf from rank u.
 *   doubling steps as in the all-reduce: afterwards every participant holds
 *       every block.
 *   unfold: odd r < 2rem sends the whole buffer to r-1, which receives it.
 *
 *   3 ranks: gather   rank 0 sends [0] to rank 1; rank 1 sends [1] to rank 2
 *            double 0 rank 1 <-> rank 2 ([0] one way, [1,2] the other)
 *            unfold   rank 1 sends everything to rank 0
 */
static int sched_rhd_allgather(struct dp_comm_req *rq, int P, int r) {
    struct rhd h;
    rhd_setup(&h, P, r, 1);
    size_t n = (size_t)rq->d.count * dp_dtype_size(rq->d.dtype), o, len;
    int holder = rhd_holder(&h, r), rc = 0;
    STEP(st);
    if (holder != r) {
        blk(&rq->d, P, r, &o, &len);
        add_send(st, holder, o, len);
    }
    if (h.nr >= 0) {
        int lo, hi;
        rhd_units(&h, h.nr, h.L, &lo, &hi);
        for (int u = lo; u < hi; u++) {
            if (u == r) continue;
            blk(&rq->d, P, u, &o, &len);
            add_recv(st, u, o, len);
        }
        if ((rc = rhd_doubling(rq, &h))) return rc;
    }
    if (r < 2 * h.rem) {
        STEP(u);
        if (h.nr < 0) add_recv(u, r + 1, 0, n);
        else add_send(u, r - 1, 0, n);
    }
    return 0;
}

/*
 * Binomial-tree broadcast over MPI (the rhd algorithm's broadcast).
 *
 * Protocol (dp__broadcast_rhd's).  v = (r - root) mod P; the parent of v > 0
 * is v with its highest set bit cleared; the children of v are v + 2^k for
 * every 2^k > v with v + 2^k < P.  Rank v > 0 receives the whole buffer from
 * its parent, then every rank sends it to its children, smallest 2^k first
 * (one step each: round k of the tree).  ceil(log2 P) rounds.
 *
 *   4 ranks, root 0:  round 0: 0 -> 1;  round 1: 0 -> 2, 1 -> 3
 */
static int sched_binomial(struct dp_comm_req *rq, int P, int r) {
    int root = rq->d.root, v = mod(r - root, P);
    size_t n = (size_t)rq->d.count * dp_dtype_size(rq->d.dtype);
    if (v > 0) {
        int top = 1;
        while (top * 2 <= v) top *= 2;
        STEP(st);
        add_recv(st, (v - top + root) % P, 0, n);
    }
    int k = 1;
    while (k <= v) k *= 2;
    for (; v + k < P; k *= 2) {
        STEP(st);
        add_send(st, (v + k + root) % P, 0, n);
    }
    return 0;
}

/* Builds rq's schedule; an empty one for P = 1 or count = 0. */
static int build_schedule(struct mpi_comm *m, struct dp_comm_req *rq) {
    int P = m->base.nranks, r = m->base.rank, ring = rq->d.algo == DP_ALGO_RING;
    rq->nsteps = rq->cur = rq->begun = 0;
    if (P == 1 || rq->d.count == 0) return 0;
    int rc;
    switch (rq->d.coll) {
    case DP_COLL_ALLREDUCE:
        rc = ring ? sched_ring(rq, P, r, 1, 1) : sched_rhd_allreduce(rq, P, r);
        break;
    case DP_COLL_REDUCE_SCATTER:
        rc = ring ? sched_ring(rq, P, r, 1, 0) : sched_rhd_reduce_scatter(rq, P, r);
        break;
    case DP_COLL_ALLGATHER:
        rc = ring ? sched_ring(rq, P, r, 0, 1) : sched_rhd_allgather(rq, P, r);
        break;
    default:
        rc = ring ? sched_chain(rq, P, r) : sched_binomial(rq, P, r);
        break;
    }
    return rc ? dp_seterr(DP_ENOMEM, "comm: rank %d: out of memory for a schedule", r) : 0;
}

/* ---- running a schedule ------------------------------------------------------------------- */

/* A stream for transfer x (NULL: none): the segments for its peer's host. */
static struct stream stream_of(const struct mpi_comm *m, const struct xfer *x) {
    struct stream s = {0};
    int net = x && m->remote[x->peer];
    s.seg = net ? NET_SEG_BYTES : SEG_BYTES;
    s.win = net ? NET_WINDOW : WINDOW;
    s.nseg = x ? (int64_t)((x->len + s.seg - 1) / s.seg) : 0;
    return s;
}
static void seg_of(const struct xfer *x, const struct stream *s, int64_t k, size_t *off,
                   size_t *len) {
    size_t o = (size_t)k * s->seg;
    *off = x->off + o;
    *len = x->len - o < s->seg ? x->len - o : s->seg;
}

/* Posts what the windows allow and tests what is in flight, in segment
 * order, until nothing moves.  *step_done when every transfer of the step
 * has completed; *moved when anything completed.
 *
 * Order matters.  Open MPI moves a large message inside the receiver's
 * MPI_Test (a single-copy read from the sender's memory once the sender's
 * MPI_Isend has announced it), so a test may take as long as a copy.  Sends
 * are therefore posted first, and after every received segment (and its
 * addition) the sends are serviced again before the next receive is tested:
 * a peer never waits for a send this rank could have posted while it was
 * busy receiving. */
static int step_poll(struct mpi_comm *m, struct dp_comm_req *rq, int *step_done, int *moved) {
    const struct step *st = &rq->steps[rq->cur];
    char *buf = rq->d.buf;
    int tag = (int)(rq->seq % ((uint64_t)m->tag_ub + 1)), err, again = 1;
    if (!rq->begun) {
        for (int i = 0; i < 2; i++) {
            rq->ss[i] = stream_of(m, i < st->nsend ? &st->send[i] : NULL);
            rq->rs[i] = stream_of(m, i < st->nrecv ? &st->recv[i] : NULL);
        }
        rq->begun = 1;
    }
    while (again) {
        again = 0;
        /* sends: post, then retire the completed ones (in order) */
        for (int i = 0; i < st->nsend; i++) {
            struct stream *s = &rq->ss[i];
            const struct xfer *x = &st->send[i];
            int64_t ready = s->nseg;
            if (st->forward && i == 0) {
                /* the segments whose bytes have all arrived: recv[0] is the
                 * same range, perhaps cut differently (its peer's host) */
                const struct stream *in = &rq->rs[0];
                size_t got = in->done == in->nseg ? x->len : (size_t)in->done * in->seg;
                ready = got >= x->len ? s->nseg : (int64_t)(got / s->seg);
            }
            for (int more = 1; more;) {
                more = 0;
                for (; s->posted < ready && s->posted - s->done < s->win; s->posted++) {
                    size_t o, n;
                    seg_of(x, s, s->posted, &o, &n);
                    err = MPI_Isend(buf + o, (int)n, MPI_BYTE, x->peer, tag, m->p2p,
                                    &s->req[s->posted % s->win]);
                    if (err != MPI_SUCCESS) return mpi_fail(m, err, "MPI_Isend");
                    rq->inflight = 1;
                }
                while (s->done < s->posted) {
                    int flag = 0;
                    err = MPI_Test(&s->req[s->done % s->win], &flag, MPI_STATUS_IGNORE);
                    if (err != MPI_SUCCESS) return mpi_fail(m, err, "MPI_Test");
                    if (!flag) break;
                    s->done++;
                    *moved = more = 1;
                }
            }
        }
        /* receives: post, then take at most one completed segment per
         * stream before servicing the sends again */
        for (int i = 0; i < st->nrecv; i++) {
            struct stream *s = &rq->rs[i];
            const struct xfer *x = &st->recv[i];
            int scratch = st->reduce && i == 0;
            for (; s->posted < s->nseg && s->posted - s->done < s->win; s->posted++) {
                size_t o, n;
                seg_of(x, s, s->posted, &o, &n);
                char *dst = scratch ? m->scratch + (size_t)(s->posted % s->win) * s->seg : buf + o;
                err = MPI_Irecv(dst, (int)n, MPI_BYTE, x->peer, tag, m->p2p,
                                &s->req[s->posted % s->win]);
                if (err != MPI_SUCCESS) return mpi_fail(m, err, "MPI_Irecv");
                rq->inflight = 1;
            }
            if (s->done < s->posted) {
                int flag = 0;
                err = MPI_Test(&s->req[s->done % s->win], &flag, MPI_STATUS_IGNORE);
                if (err != MPI_SUCCESS) return mpi_fail(m, err, "MPI_Test");
                if (!flag) continue;
                if (scratch) {
                    size_t o, n;
                    seg_of(x, s, s->done, &o, &n);
                    dp__reduce_add(buf + o, m->scratch + (size_t)(s->done % s->win) * s->seg,
                                   (int64_t)(n / dp_dtype_size(rq->d.dtype)), rq->d.dtype);
                }
                s->done++;
                *moved = again = 1;
            }
        }
    }
    int done = 1;
    for (int i = 0; i < 2; i++)
        done &= rq->ss[i].done == rq->ss[i].nseg && rq->rs[i].done == rq->rs[i].nseg;
    *step_done = done;
    return 0;
}

/* Runs rq's schedule as far as it goes without blocking. */
static int p2p_poll(struct mpi_comm *m, struct dp_comm_req *rq, int *done, int *moved) {
    while (rq->cur < rq->nsteps) {
        int step_done = 0, rc = step_poll(m, rq, &step_done, moved);
        if (rc) return rc;
        if (!step_done) {
            *done = 0;
            return 0;
        }
        rq->cur++, rq->begun = 0;
        rq->inflight = 0;
        *moved = 1;
    }
    *done = 1;
    return 0;
}

/* ---- the queue ------------------------------------------------------------------------------- */

/* Advances the pending operations in issue order without blocking: the
 * first unfinished one is polled (for ring and rhd, run as far as it goes),
 * and while it finishes, the next.  Native operations further back progress
 * inside MPI meanwhile.  Returns the first unfinished request (NULL if none). */
static struct dp_comm_req *poll_queue(struct mpi_comm *m, int *moved) {
    for (struct dp_comm_req *rq = m->head; rq; rq = rq->next) {
        if (rq->done) continue;
        int rc = aborted_status(m), done = 0;
        if (rc) {
            fail_op(m, rq, rc);
            continue;
        }
        dp_clearerr();
        rc = rq->kind == KIND_NATIVE ? native_poll(m, rq, &done) : p2p_poll(m, rq, &done, moved);
        if (rc) {
            fail_op(m, rq, rc);
            *moved = 1;
            continue;
        }
        if (!done) return rq;
        finish(rq, 0);
        *moved = 1;
    }
    return NULL;
}

/* ---- timeouts --------------------------------------------------------------------------------- */

/* rq has waited timeout_s.  Asks every other rank, over the side
 * communicator, which operation it is stuck in: this rank sends (seq, coll)
 * to all and listens for GRACE_S for the same from the others (they send it
 * when they time out themselves, so the ranks that reached this operation
 * answer within about the grace period).  The ranks that neither answered
 * nor reached this operation are named.  Every MPI call here is nonblocking
 * and polled against the grace deadline, so a stalled or dead peer costs
 * GRACE_S, never a hang.  Fails rq with DP_ECANCELED and aborts the
 * communicator with the message. */
static void timed_out(struct mpi_comm *m, struct dp_comm_req *rq) {
    int P = m->base.nranks, r = m->base.rank;
    char msg[MSG_LEN], silent[MSG_LEN] = "", elsewhere[MSG_LEN] = "";
    int nsilent = 0, nelse = 0, ok = 0;
    uint64_t *in = dp_calloc((size_t)P, 2 * sizeof *in);
    MPI_Request *rin = dp_malloc(sizeof *rin * (size_t)P), *rout = dp_malloc(sizeof *rout * (size_t)P);
    int *got = dp_calloc((size_t)P, sizeof *got);
    if (in && rin && rout && got && !m->diag_sent) {
        ok = 1;
        m->diag_out[0] = rq->seq, m->diag_out[1] = (uint64_t)rq->d.coll;
        m->diag_sent = 1;
        for (int q = 0; q < P; q++) {
            rin[q] = rout[q] = MPI_REQUEST_NULL;
            if (q == r) continue;
            if (MPI_Irecv(in + 2 * q, 2, MPI_UINT64_T, q, 1, m->side, &rin[q]) != MPI_SUCCESS ||
                MPI_Isend(m->diag_out, 2, MPI_UINT64_T, q, 1, m->side, &rout[q]) != MPI_SUCCESS)
                ok = 0;
        }
        double end = dp_time() + GRACE_S;
        int pending = P - 1;
        while (ok && pending > 0 && dp_time() < end) {
            for (int q = 0; q < P; q++) {
                int flag = 0;
                if (q == r || got[q]) continue;
                if (MPI_Test(&rin[q], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) ok = 0;
                if (flag) got[q] = 1, pending--;
            }
            struct timespec ts = {0, 1000000L};
            if (pending) nanosleep(&ts, NULL);
        }
        /* Unanswered receives are cancelled (local for receives); sends still
         * queued to a silent rank are let go, with diag_out kept alive. */
        for (int q = 0; q < P; q++) {
            int flag = 0;
            if (q == r) continue;
            if (!got[q] && rin[q] != MPI_REQUEST_NULL) {
                MPI_Cancel(&rin[q]);
                MPI_Status st;
                MPI_Wait(&rin[q], &st);
                MPI_Test_cancelled(&st, &flag);
                if (!flag) got[q] = 1; /* it arrived after all */
            }
            if (rout[q] != MPI_REQUEST_NULL) {
                MPI_Test(&rout[q], &flag, MPI_STATUS_IGNORE);
                if (!flag) MPI_Request_free(&rout[q]), m->diag_sent = 2;
            }
        }
        size_t ns = 0, ne = 0;
        for (int q = 0; ok && q < P; q++) {
            if (q == r) continue;
            if (!got[q]) {
                if (ns < sizeof silent - 16)
                    ns += (size_t)snprintf(silent + ns, sizeof silent - ns, "%s%d",
                                           nsilent ? ", " : "", q);
                nsilent++;
            } else if (in[2 * q] != rq->seq || in[2 * q + 1] != (uint64_t)rq->d.coll) {
                if (ne < sizeof elsewhere - 64)
                    ne += (size_t)snprintf(elsewhere + ne, sizeof elsewhere - ne,
                                           "%srank %d is waiting in %s #%llu", nelse ? "; " : "",
                                           q, dp_comm_coll_name((enum dp_comm_coll)in[2 * q + 1]),
                                           (unsigned long long)in[2 * q]);
                nelse++;
            }
        }
    }
    dp_free(in), dp_free(rin), dp_free(rout), dp_free(got);
    int k = snprintf(msg, sizeof msg, "comm: timeout after %.3g s in %s #%llu on rank %d: ",
                     m->timeout_s, dp_comm_coll_name(rq->d.coll), (unsigned long long)rq->seq, r);
    size_t rest = k > 0 && (size_t)k < sizeof msg ? sizeof msg - (size_t)k : 0;
    if (!ok)
        snprintf(msg + k, rest, "could not ask the other ranks where they are");
    else if (nsilent && nelse)
        snprintf(msg + k, rest, "rank%s %s did not respond (stalled or lost); %s",
                 nsilent > 1 ? "s" : "", silent, elsewhere);
    else if (nsilent)
        snprintf(msg + k, rest, "rank%s %s did not respond (stalled or lost)",
                 nsilent > 1 ? "s" : "", silent);
    else if (nelse)
        snprintf(msg + k, rest, "%s", elsewhere);
    else
        snprintf(msg + k, rest, "every rank reached this operation and timed out in it");
    dp_seterr(DP_ECANCELED, "%s", msg);
    fail_op(m, rq, DP_ECANCELED);
}

/* ---- the ops table ---------------------------------------------------------------------------- */

static int m_start(struct dp_comm *c, const struct dp__op *d, int blocking,
                   struct dp_comm_req **req) {
    struct mpi_comm *m = (struct mpi_comm *)c;
    if (d->algo == DP_ALGO_DIRECT && d->coll != DP_COLL_BARRIER)
        return dp_seterr(DP_EINVAL, "comm: %s: algorithm 'direct' needs shared memory (the thread "
                                    "backend); the mpi backend has native, ring and rhd",
                         dp_comm_coll_name(d->coll));
    int rc = aborted_status(m);
    if (rc) return rc;
    /* A blocking native operation with nothing before it and no timeout to
     * enforce is MPI's blocking call (it cannot be interrupted by an abort
     * from another thread; with a timeout, the operation is polled). */
    int now = blocking && m->timeout_s == 0;
    for (struct dp_comm_req *p = m->head; now && p; p = p->next) now = p->done;
    struct dp_comm_req *rq = m->freelist;
    if (rq) {
        m->freelist = rq->next;
    } else {
        rq = dp_calloc(1, sizeof *rq);
        int *arr = dp_malloc(2 * sizeof *arr * (size_t)c->nranks);
        if (!rq || !arr) {
            dp_free(rq), dp_free(arr);
            return dp_seterr(DP_ENOMEM, "comm: rank %d: out of memory for a request", c->rank);
        }
        rq->counts = arr, rq->displs = arr + c->nranks;
    }
    rq->next = NULL;
    rq->d = *d;
    rq->seq = ++m->next_seq;
    rq->done = rq->rc = rq->inflight = 0;
    rq->deadline = 0;
    rq->msg[0] = '\0';
    int native = d->algo == DP_ALGO_NATIVE || d->coll == DP_COLL_BARRIER;
    /* int-sized displacements: larger gathers and scatters take the ring */
    if (native && (d->coll == DP_COLL_REDUCE_SCATTER || d->coll == DP_COLL_ALLGATHER) &&
        d->count > INT32_MAX)
        native = 0, rq->d.algo = DP_ALGO_RING;
    if (native && d->count > NATIVE_PART * NATIVE_PARTS) native = 0, rq->d.algo = DP_ALGO_RING;
    rq->kind = native ? KIND_NATIVE : KIND_P2P;
    dp_clearerr();
    rc = native ? native_start(m, rq, now) : build_schedule(m, rq);
    if (rc) {
        /* a failed MPI call leaves the communicator unusable: abort it;
         * a schedule that could not be built started nothing */
        if (native) fail_op(m, rq, rc);
        else m->next_seq--;
        rq->next = m->freelist;
        m->freelist = rq;
        return rc; /* with its message */
    }
    if (m->tail) m->tail->next = rq;
    else m->head = rq;
    m->tail = rq;
    m->npending++;
    *req = rq;
    return 0;
}

static int m_test(struct dp_comm *c, struct dp_comm_req *req, int *done) {
    struct mpi_comm *m = (struct mpi_comm *)c;
    int moved = 0;
    poll_queue(m, &moved);
    *done = req->done;
    return 0;
}

static void unlink_req(struct mpi_comm *m, struct dp_comm_req *rq) {
    struct dp_comm_req **pp = &m->head, *prev = NULL;
    while (*pp && *pp != rq) prev = *pp, pp = &(*pp)->next;
    if (!*pp) return;
    *pp = rq->next;
    if (m->tail == rq) m->tail = prev;
    rq->next = m->freelist;
    m->freelist = rq;
    m->npending--;
}

static void nap(long ns) {
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

/* Waiting: spin while things move, then sleep (2 µs doubling to 256 µs).
 * "Moving" is visible for ring and rhd (every segment), not inside a native
 * operation, which MPI advances only during our MPI_Testall calls (Open MPI
 * has no progress thread here): sleeping then stalls it (measured: a polled
 * 256 KiB all-reduce took 530 µs instead of 90).  So the first poller of an
 * operation also spins for as long as its bytes take at 2 GB/s (at most
 * 20 ms) before it may sleep. */
static double spin_budget(const struct mpi_comm *m, const struct dp_comm_req *rq) {
    double t = (double)rq->d.count * (double)dp_dtype_size(rq->d.dtype) / 2e9;
    return m->spin_s + (t < 0.02 ? t : 0.02);
}

static int m_wait(struct dp_comm *c, struct dp_comm_req *req) {
    struct mpi_comm *m = (struct mpi_comm *)c;
    double spin_end = dp_time() + m->spin_s;
    long sleep_ns = SLEEP_MIN_NS;
    struct dp_comm_req *last = NULL;
    while (!req->done) {
        int moved = 0;
        struct dp_comm_req *cur = poll_queue(m, &moved);
        if (req->done || !cur) break;
        double now = dp_time();
        if (cur != last) { /* a new operation at the head */
            last = cur;
            spin_end = now + spin_budget(m, cur);
            sleep_ns = SLEEP_MIN_NS;
        }
        if (m->timeout_s > 0) {
            if (cur->deadline == 0) cur->deadline = now + m->timeout_s;
            else if (now >= cur->deadline) {
                timed_out(m, cur);
                continue;
            }
        }
        if (moved) {
            if (now + m->spin_s > spin_end) spin_end = now + m->spin_s;
            sleep_ns = SLEEP_MIN_NS;
        } else if (now >= spin_end) {
            nap(sleep_ns);
            if (sleep_ns < SLEEP_MAX_NS) sleep_ns *= 2;
        }
    }
    int rc = req->rc;
    if (rc) dp_seterr(rc, "%s", req->msg);
    unlink_req(m, req);
    return rc;
}

static int m_abort(struct dp_comm *c, const char *msg) {
    struct mpi_comm *m = (struct mpi_comm *)c;
    char full[MSG_LEN];
    snprintf(full, sizeof full, "rank %d aborted: %s", c->rank, msg);
    set_aborted(m, full);
    return aborted_status(m);
}

static int m_status(const struct dp_comm *c) { return aborted_status((struct mpi_comm *)c); }

static int m_kill_job(struct dp_comm *c, int code) {
    (void)c;
    MPI_Abort(MPI_COMM_WORLD, code);
    return dp_seterr(DP_EINTERNAL, "comm: MPI_Abort returned");
}

static void m_host_ranks(const struct dp_comm *c, int *local_rank, int *local_size) {
    const struct mpi_comm *m = (const struct mpi_comm *)c;
    *local_rank = m->local_rank;
    *local_size = m->local_size;
}

static void free_req(struct dp_comm_req *rq) {
    dp_free(rq->counts);
    dp_free(rq->steps);
    dp_free(rq);
}

static void m_free(struct dp_comm *c) {
    struct mpi_comm *m = (struct mpi_comm *)c;
    if (m->npending) {
        char msg[MSG_LEN];
        snprintf(msg, sizeof msg, "rank %d aborted: communicator freed with %d operation%s pending",
                 c->rank, m->npending, m->npending > 1 ? "s" : "");
        set_aborted(m, msg);
        for (struct dp_comm_req *rq = m->head; rq; rq = rq->next)
            if (!rq->done) fail_op(m, rq, DP_ECANCELED);
    }
    for (struct dp_comm_req *rq = m->head, *nx; rq; rq = nx) nx = rq->next, free_req(rq);
    for (struct dp_comm_req *rq = m->freelist, *nx; rq; rq = nx) nx = rq->next, free_req(rq);
    /* MPI_Comm_free and MPI_Op_free are local in Open MPI: an operation that
     * never finished keeps its communicator alive inside MPI, not here. */
    MPI_Op_free(&m->bf16_sum);
    MPI_Comm_free(&m->coll);
    MPI_Comm_free(&m->p2p);
    MPI_Comm_free(&m->side);
    MPI_Comm_free(&m->msgc);
    dp_free(m->scratch), dp_free(m->remote);
    if (m->diag_sent != 2) dp_free(m->diag_out); /* else MPI may still read it */
    pthread_mutex_destroy(&m->mu);
    dp_free(m);
    pthread_mutex_lock(&g_mu);
    int last = --g_live == 0 && g_we_init;
    /* MPI_Finalize waits for every process; after an operation was abandoned
     * (timeout, abort) a stalled peer would hang it, so it is skipped: the
     * process should exit, which makes mpirun end the job, or call
     * dp_comm_kill_job. */
    if (last && !g_orphans) {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin) MPI_Finalize();
        g_we_init = 0;
    }
    pthread_mutex_unlock(&g_mu);
}

/* ---- point-to-point messages ----------------------------------------------------------------- */

/* MPI_Isend / MPI_Irecv of bytes on their own communicator (msgc), so that
 * they never match the ring and rhd schedules' messages on p2p.  A wait
 * polls MPI_Test, spinning, then sleeping (2 µs doubling to 256 µs), checks
 * the abort flag, and gives up after timeout_s: a receive is then
 * cancelled, and MPI_Finalize skipped (a send cannot be taken back). */
struct dp_comm_msg {
    MPI_Request req;
    int send, done, rc;
    int peer, tag, from;
    int64_t cap, got;
    char err[MSG_LEN];
};

/* Gives a message up: a receive is cancelled (it must not write the buffer
 * later; a send cannot be taken back); one MPI still holds is released to
 * it, and MPI_Finalize is then skipped (it could wait for the peer). */
static void abandon(struct dp_comm_msg *g) {
    int flag = 0;
    if (!g->send) MPI_Cancel(&g->req);
    MPI_Test(&g->req, &flag, MPI_STATUS_IGNORE);
    if (!flag) {
        MPI_Request_free(&g->req);
        pthread_mutex_lock(&g_mu);
        g_orphans = 1;
        pthread_mutex_unlock(&g_mu);
    }
}

static int m_post(struct mpi_comm *m, int send, void *buf, int64_t bytes, int peer, int tag,
                  struct dp_comm_msg **msg) {
    int rc = aborted_status(m);
    if (rc) return rc;
    /* messages may come from a thread other than the collectives' one */
    if (m->provided < MPI_THREAD_MULTIPLE)
        return dp_seterr(DP_ENOTSUP, "comm: mpi: point-to-point messages need MPI_THREAD_MULTIPLE (MPI "
                                     "provides thread level %d)", m->provided);
    struct dp_comm_msg *g = dp_calloc(1, sizeof *g);
    if (!g) return dp_seterr(DP_ENOMEM, "comm: mpi: out of memory");
    g->send = send, g->peer = peer, g->tag = tag, g->cap = bytes, g->from = -1;
    int err = send ? MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, m->msgc, &g->req)
                   : MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer == DP_ANY_SOURCE ? MPI_ANY_SOURCE : peer,
                               tag, m->msgc, &g->req);
    if (err != MPI_SUCCESS) {
        dp_free(g);
        return mpi_fail(m, err, send ? "MPI_Isend" : "MPI_Irecv");
    }
    *msg = g;
    return 0;
}

static int m_isend(struct dp_comm *c, const void *buf, int64_t bytes, int dest, int tag,
                   struct dp_comm_msg **msg) {
    return m_post((struct mpi_comm *)c, 1, (void *)buf, bytes, dest, tag, msg);
}
static int m_irecv(struct dp_comm *c, void *buf, int64_t bytes, int src, int tag,
                   struct dp_comm_msg **msg) {
    return m_post((struct mpi_comm *)c, 0, buf, bytes, src, tag, msg);
}

static void msg_poll(struct mpi_comm *m, struct dp_comm_msg *g) {
    if (g->done) return;
    int flag = 0;
    MPI_Status st;
    int err = MPI_Test(&g->req, &flag, &st);
    if (err == MPI_SUCCESS && !flag) return;
    g->done = 1;
    if (err == MPI_SUCCESS && !g->send) {
        int n = 0;
        MPI_Get_count(&st, MPI_BYTE, &n);
        g->from = st.MPI_SOURCE, g->got = n;
    } else if (err == MPI_SUCCESS) {
        g->got = g->cap;
    }
    if (err == MPI_SUCCESS) return;
    int cls = 0;
    MPI_Error_class(err, &cls);
    if (cls == MPI_ERR_TRUNCATE) {
        g->rc = DP_EINVAL;
        snprintf(g->err, sizeof g->err, "comm: recv on rank %d: a message from rank %d (tag %d) does "
                 "not fit the %lld-byte buffer", m->base.rank, st.MPI_SOURCE, g->tag, (long long)g->cap);
    } else {
        g->rc = mpi_fail(m, err, "MPI_Test");
        snprintf(g->err, sizeof g->err, "%s", dp_errmsg());
    }
}

static int m_msg_test(struct dp_comm *c, struct dp_comm_msg *g, int *done) {
    msg_poll((struct mpi_comm *)c, g);
    *done = g->done;
    return 0;
}

static int m_msg_wait(struct dp_comm *c, struct dp_comm_msg *g, int *src, int64_t *bytes) {
    struct mpi_comm *m = (struct mpi_comm *)c;
    double t0 = dp_time(), spin_end = t0 + m->spin_s;
    long sleep_ns = SLEEP_MIN_NS;
    int rc = 0;
    for (msg_poll(m, g); !g->done; msg_poll(m, g)) {
        double now = dp_time();
        if ((rc = aborted_status(m)) == 0 && m->timeout_s > 0 && now - t0 >= m->timeout_s) {
            char msg[MSG_LEN], peer[32] = "any rank";
            if (g->peer != DP_ANY_SOURCE) snprintf(peer, sizeof peer, "rank %d", g->peer);
            if (g->send)
                snprintf(msg, sizeof msg, "comm: timeout after %.3g s in send on rank %d: %s did not "
                         "take the message with tag %d", m->timeout_s, c->rank, peer, g->tag);
            else
                snprintf(msg, sizeof msg, "comm: timeout after %.3g s in recv on rank %d: no message "
                         "from %s with tag %d", m->timeout_s, c->rank, peer, g->tag);
            set_aborted(m, msg);
            rc = aborted_status(m);
        }
        if (rc) { /* abandon it: a receive must not write the buffer later */
            abandon(g);
            break;
        }
        if (now >= spin_end) {
            nap(sleep_ns);
            if (sleep_ns < SLEEP_MAX_NS) sleep_ns *= 2;
        }
    }
    if (!rc && g->rc) rc = dp_seterr(g->rc, "%s", g->err);
    if (!rc) {
        if (src) *src = g->send ? c->rank : g->from;
        if (bytes) *bytes = g->got;
    }
    dp_free(g);
    return rc;
}

static int m_msg_cancel(struct dp_comm *c, struct dp_comm_msg *g) {
    (void)c;
    if (!g->done) abandon(g);
    dp_free(g);
    return 0;
}

static const struct dp_comm_ops mpi_ops = {
    "mpi",   m_start,      m_test,  m_wait,  m_abort,    m_status,   m_free,
    m_kill_job, m_host_ranks, m_isend, m_irecv, m_msg_test, m_msg_wait, m_msg_cancel,
};

/* ---- init ---------------------------------------------------------------------------------------- */

static int dup_world(struct mpi_comm *m, MPI_Comm *out) {
    int err = MPI_Comm_dup(MPI_COMM_WORLD, out);
    if (err != MPI_SUCCESS) return mpi_fail(m, err, "MPI_Comm_dup");
    err = MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
    if (err != MPI_SUCCESS) return mpi_fail(m, err, "MPI_Comm_set_errhandler");
    return 0;
}

/* m->remote: every rank of coll that is not in `local` (this host's ranks). */
static int find_remote(struct mpi_comm *m, MPI_Comm local) {
    int P = m->base.nranks, n = m->local_size, err = MPI_SUCCESS;
    int *in = dp_malloc(2 * sizeof *in * (size_t)n);
    m->remote = dp_malloc((size_t)P);
    if (!in || !m->remote) {
        dp_free(in);
        return dp_seterr(DP_ENOMEM, "comm: mpi: out of memory");
    }
    memset(m->remote, 1, (size_t)P);
    MPI_Group gl = MPI_GROUP_NULL, gc = MPI_GROUP_NULL;
    for (int k = 0; k < n; k++) in[k] = k;
    if ((err = MPI_Comm_group(local, &gl)) == MPI_SUCCESS &&
        (err = MPI_Comm_group(m->coll, &gc)) == MPI_SUCCESS &&
        (err = MPI_Group_translate_ranks(gl, n, in, gc, in + n)) == MPI_SUCCESS)
        for (int k = 0; k < n; k++)
            if (in[n + k] >= 0 && in[n + k] < P) m->remote[in[n + k]] = 0;
    if (gl != MPI_GROUP_NULL) MPI_Group_free(&gl);
    if (gc != MPI_GROUP_NULL) MPI_Group_free(&gc);
    dp_free(in);
    return err == MPI_SUCCESS ? 0 : mpi_fail(m, err, "MPI_Group_translate_ranks");
}

/* (comm_impl.h; tests) Takes ranks q and r to be on one host iff
 * q / per_host == r / per_host, whatever MPI says. */
void dp__comm_mpi_fake_hosts(struct dp_comm *c, int per_host) {
    struct mpi_comm *m = (struct mpi_comm *)c;
    for (int q = 0; q < c->nranks && per_host > 0; q++)
        m->remote[q] = q / per_host != c->rank / per_host;
}

int dp__comm_mpi_init(struct dp_comm **cp, const struct dp_comm_params *params) {
    int inited = 0, fin = 0, provided = 0, err;
    pthread_mutex_lock(&g_mu);
    MPI_Finalized(&fin);
    if (fin) {
        pthread_mutex_unlock(&g_mu);
        return dp_seterr(DP_ENOTSUP, "comm: mpi: MPI was already finalized");
    }
    MPI_Initialized(&inited);
    if (!inited) {
        err = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (err != MPI_SUCCESS) {
            pthread_mutex_unlock(&g_mu);
            return mpi_fail(NULL, err, "MPI_Init_thread");
        }
        g_we_init = 1;
    } else {
        MPI_Query_thread(&provided);
    }
    pthread_mutex_unlock(&g_mu);
    if (provided < MPI_THREAD_SERIALIZED)
        return dp_seterr(DP_ENOTSUP, "comm: mpi: MPI provides thread level %d; the communicator "
                                     "needs at least MPI_THREAD_SERIALIZED", provided);
    struct mpi_comm *m = dp_calloc(1, sizeof *m);
    if (!m) return dp_seterr(DP_ENOMEM, "comm: mpi: out of memory");
    m->coll = m->p2p = m->side = m->msgc = MPI_COMM_NULL;
    m->bf16_sum = MPI_OP_NULL;
    pthread_mutex_init(&m->mu, NULL);
    atomic_init(&m->aborted, 0);
    m->base.ops = &mpi_ops;
    m->provided = provided;
    MPI_Comm_rank(MPI_COMM_WORLD, &m->base.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &m->base.nranks);
    m->timeout_s = params->timeout_s;
    m->spin_s = 1e-6 * (params->spin_us >= 0 ? params->spin_us : 50);
    pthread_mutex_lock(&g_mu);
    g_live++;
    pthread_mutex_unlock(&g_mu);
    int rc = dup_world(m, &m->coll);
    if (!rc) rc = dup_world(m, &m->p2p);
    if (!rc) rc = dup_world(m, &m->side);
    if (!rc) rc = dup_world(m, &m->msgc);
    if (!rc) {
        int *ub = NULL, flag = 0;
        MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
        m->tag_ub = flag && ub && *ub > 0 ? *ub : 32767;
        MPI_Comm local;
        err = MPI_Comm_split_type(m->coll, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
        if (err != MPI_SUCCESS) {
            rc = mpi_fail(m, err, "MPI_Comm_split_type");
        } else {
            MPI_Comm_rank(local, &m->local_rank);
            MPI_Comm_size(local, &m->local_size);
            rc = find_remote(m, local);
            MPI_Comm_free(&local);
        }
    }
    if (!rc && (err = MPI_Op_create(bf16_sum_fn, 1, &m->bf16_sum)) != MPI_SUCCESS)
        rc = mpi_fail(m, err, "MPI_Op_create");
    if (!rc) {
        m->scratch = dp_malloc_big(SCRATCH_BYTES);
        m->diag_out = dp_calloc(2, sizeof *m->diag_out);
        if (!m->scratch || !m->diag_out) rc = dp_seterr(DP_ENOMEM, "comm: mpi: out of memory");
    }
    if (rc) {
        /* the dups are collective: a failure is very likely on every rank */
        char msg[MSG_LEN];
        snprintf(msg, sizeof msg, "%s", dp_errmsg());
        if (m->bf16_sum != MPI_OP_NULL) MPI_Op_free(&m->bf16_sum);
        if (m->coll != MPI_COMM_NULL) MPI_Comm_free(&m->coll);
        if (m->p2p != MPI_COMM_NULL) MPI_Comm_free(&m->p2p);
        if (m->side != MPI_COMM_NULL) MPI_Comm_free(&m->side);
        if (m->msgc != MPI_COMM_NULL) MPI_Comm_free(&m->msgc);
        dp_free(m->scratch), dp_free(m->diag_out), dp_free(m->remote);
        pthread_mutex_destroy(&m->mu);
        dp_free(m);
        pthread_mutex_lock(&g_mu);
        g_live--;
        pthread_mutex_unlock(&g_mu);
        return dp_seterr(rc, "%s", msg);
    }
    *cp = &m->base;
    return 0;
}

#else
typedef int dp__comm_mpi_not_built; /* ISO C wants a declaration in every file */
#endif /* DP_WITH_MPI */
