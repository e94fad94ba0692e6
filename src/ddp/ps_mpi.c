/* The parameter server across processes: S server ranks, W worker ranks,
 * point-to-point messages (dp/ps.h "across processes"; docs/ddp.md "The
 * parameter server under MPI").
 *
 * Layout: job ranks 0..W-1 are workers (rank 0 keeps writing metrics and
 * checkpoints, as in every other mode), ranks W..W+S-1 the servers; server
 * i = rank W + i holds shard i = dp_comm_split(n, S, i) in a struct dp_ps of
 * one shard (ps.c applies the push: optimizer, version, lr schedule,
 * staleness).  Server 0 also hands out the epoch's batches (the atomic
 * counter of the thread backend).
 *
 * Messages (tag REQ to a server, tag REP back), one request in flight per
 * worker, so one sender's requests arrive in the order sent:
 *
 *   CLAIM            worker -> server 0     [hdr]            the first batch
 *       reply        [hdr: next = k or -1]
 *   PUSH             worker -> every server [hdr: n | g's slice of shard i]
 *       server i:    dp_ps_push(its shard): staleness = version at apply -
 *                    the version this worker pulled from the shard (its
 *                    last push's reply, or the epoch start), then
 *       reply        [hdr: staleness, next (server 0: the next claim) |
 *                    the fresh shard]; the worker posts its receives before
 *                    it sends, so a server's reply never waits for a buffer
 *   END              worker -> every server [hdr]            after its last push
 *   CLOSE            server 0 -> every worker (tag CLOSE)   once all W ended
 *
 * SSP (--staleness s) and the replay (--deterministic) take static shares:
 * worker r pushes its share of global batch c as clock c (no CLAIM; hdr
 * carries the clock), and the reply may wait:
 *   SSP:     the push is added to clock c's sum on the server's dp_ps (the
 *            P-th applies it: ps.c), and the reply [staleness | the fresh
 *            shard] is held until the shard's version >= c + 1 - s, the
 *            bound for the worker's next clock (ssp_release after each
 *            push).  A worker waits for every server's reply, so it starts
 *            clock c + 1 only once every shard allows it.  s = 0: each clock
 *            waits for all P pushes, synchronous training.
 *   replay:  push (c, r) is applied at version c x P + r: it is held (its
 *            request copied aside) until the version gets there, then
 *            applied and answered at once (replay_drain after each push).
 *            One push in flight per worker, so the held push of the rank
 *            whose turn it is, is for the right clock.
 *
 * A server serves requests in arrival order (DP_ANY_SOURCE) until all W
 * workers sent END; a worker sends END only once server 0 answered -1 (or,
 * static shares, after its last clock's reply), so every batch has been
 * pushed by then.  Then every rank takes part
 * in the trainer's epoch end (collectives over all W + S ranks): the sum of
 * dp_ps_net_collect's parts is the server's state on every rank, for the
 * evaluation and rank 0's checkpoint.  At the epoch's start every worker
 * holds that state, so the server resets the pulled versions to its own.
 *
 * Failure.  A worker's wait for a reply times out through the
 * communicator (naming the server rank and the tag); a server's wait for
 * requests past the timeout names the workers that have not ended the epoch.
 * Either way the process fails and the launcher kills the job. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "dp/core.h"
#include "dp/comm.h"
#include "dp/ps.h"

enum { TAG_REQ = 111, TAG_REP = 112, TAG_CLOSE = 113 };
enum { REQ_CLAIM = 1, REQ_PUSH = 2, REQ_END = 3 };

/* 8-byte words, so the floats after it are aligned */
struct req_hdr {
    int64_t type;
    double n;
    int64_t clock;      /* a push's clock (SSP, replay; async: 0) */
};
struct rep_hdr {
    int64_t staleness;
    int64_t next;
};

struct dp_ps_net {
    struct dp_ps_net_params p;
    struct dp_comm *c;
    int rank, ranks, W, S, server;  /* server: this rank's shard, or -1 */
    int64_t off, len, maxlen;       /* the server's shard; the largest shard */
    struct dp_ps *ps;               /* server */
    char *buf;                      /* server: one request; worker: unused */
    char **sbuf, **rbuf;            /* worker: per server, a request and a reply */
    struct dp_comm_msg **smsg, **rmsg;
    unsigned char *ended;           /* server: (W) who ended the epoch */
    int64_t next;                   /* server 0: the epoch's next batch */
    struct dp_ps_hist hist;         /* worker: this epoch's pushes */
    float *tmp;                     /* server: its slice of the optimizer state (set/get) */
    /* server, SSP and replay: the reply each worker awaits (held[r]: a request is held) */
    unsigned char *held;            /* (W) */
    int64_t *want, *hstale;         /* (W) SSP: the clock the reply allows, the push's staleness */
    char **hbuf;                    /* (W) replay: the held push (request as received) */
    char *rep;                      /* a deferred reply */
};

static size_t req_bytes(int64_t len) { return sizeof(struct req_hdr) + sizeof(float) * (size_t)len; }
static size_t rep_bytes(int64_t len) { return sizeof(struct rep_hdr) + sizeof(float) * (size_t)len; }

int dp_ps_net_is_server(const struct dp_ps_net *net) { return net->server >= 0; }

void dp_ps_net_free(struct dp_ps_net *net) {
    if (!net) return;
    dp_ps_free(net->ps);
    dp_free(net->buf);
    for (int i = 0; net->sbuf && i < net->S; i++) dp_free(net->sbuf[i]);
    for (int i = 0; net->rbuf && i < net->S; i++) dp_free(net->rbuf[i]);
    dp_free(net->sbuf), dp_free(net->rbuf), dp_free(net->smsg), dp_free(net->rmsg);
    dp_free(net->ended);
    dp_free(net->tmp);
    for (int r = 0; net->hbuf && r < net->W; r++) dp_free(net->hbuf[r]);
    dp_free(net->hbuf), dp_free(net->held), dp_free(net->want), dp_free(net->hstale), dp_free(net->rep);
    dp_free(net);
}

int dp_ps_net_init(struct dp_ps_net **out, const struct dp_ps_net_params *p) {
    *out = NULL;
    int ranks = dp_comm_world(p->c);
    if (p->servers < 1 || p->servers >= ranks)
        return dp_seterr(DP_EINVAL, "--servers must be in 1..%d under mpirun: %d process%s, of which at least one "
                         "must be a worker (got %d)", ranks - 1, ranks, ranks > 1 ? "es" : "", p->servers);
    if (p->servers > p->n)
        return dp_seterr(DP_EINVAL, "--servers must be at most the parameter count %lld (got %d)", (long long)p->n,
                         p->servers);
    struct dp_ps_net *net = dp_calloc(1, sizeof *net);
    if (!net) return dp_seterr(DP_ENOMEM, "parameter server: out of memory");
    net->p = *p;
    net->c = p->c;
    net->rank = dp_comm_rank(p->c), net->ranks = ranks;
    net->S = p->servers, net->W = ranks - p->servers;
    net->server = net->rank >= net->W ? net->rank - net->W : -1;
    net->maxlen = (p->n + net->S - 1) / net->S;
    int rc = DP_OK;
    if (net->server >= 0) {
        dp_comm_split(p->n, net->S, net->server, &net->off, &net->len);
        struct dp_ps_params pp = p->ps;
        pp.shards = 1, pp.workers = net->W;
        if ((rc = dp_ps_init(&net->ps, &pp, net->len))) goto fail;
        net->buf = dp_malloc_big(req_bytes(net->maxlen) > rep_bytes(net->maxlen) ? req_bytes(net->maxlen)
                                                                                 : rep_bytes(net->maxlen));
        net->ended = dp_calloc((size_t)net->W, 1);
        net->held = dp_calloc((size_t)net->W, 1);
        net->want = dp_calloc((size_t)net->W, sizeof(int64_t));
        net->hstale = dp_calloc((size_t)net->W, sizeof(int64_t));
        net->rep = dp_malloc_big(rep_bytes(net->len));
        if (!net->buf || !net->ended || !net->held || !net->want || !net->hstale || !net->rep) goto oom;
        if (pp.ordered) {
            if (!(net->hbuf = dp_calloc((size_t)net->W, sizeof(char *)))) goto oom;
            for (int r = 0; r < net->W; r++)
                if (!(net->hbuf[r] = dp_malloc_big(req_bytes(net->len)))) goto oom;
        }
    } else {
        net->sbuf = dp_calloc((size_t)net->S, sizeof(char *));
        net->rbuf = dp_calloc((size_t)net->S, sizeof(char *));
        net->smsg = dp_calloc((size_t)net->S, sizeof *net->smsg);
        net->rmsg = dp_calloc((size_t)net->S, sizeof *net->rmsg);
        if (!net->sbuf || !net->rbuf || !net->smsg || !net->rmsg) goto oom;
        for (int i = 0; i < net->S; i++) {
            net->sbuf[i] = dp_malloc_big(req_bytes(net->maxlen));
            net->rbuf[i] = dp_malloc_big(rep_bytes(net->maxlen));
            if (!net->sbuf[i] || !net->rbuf[i]) goto oom;
        }
    }
    *out = net;
    return DP_OK;
oom:
    rc = dp_seterr(DP_ENOMEM, "parameter server: out of memory");
fail:
    dp_ps_net_free(net);
    return rc;
}

/* ---- server ------------------------------------------------------------------------------- */

/* The optimizer state's whole-slab layout (dp_optim: state_len / n slabs)
 * against the shard's own (slabs of len). */
static int64_t slabs_of(const struct dp_ps_net *net) {
    const struct dp_optim_params *o = &net->p.ps.optim;
    struct dp_optim probe;
    if (dp_optim_init(&probe, o, 1)) return 0;
    int64_t k = probe.state_len;
    dp_optim_free(&probe);
    return k;
}

int dp_ps_net_set_state(struct dp_ps_net *net, const float *params, const float *state, int64_t step,
                        int64_t version) {
    if (net->server < 0) return DP_OK;
    int64_t slabs = slabs_of(net);
    float *mine = NULL;
    if (slabs && state) {
        if (!net->tmp && !(net->tmp = dp_malloc_big(sizeof(float) * (size_t)(slabs * net->len + 1))))
            return dp_seterr(DP_ENOMEM, "parameter server: out of memory");
        for (int64_t j = 0; j < slabs; j++)
            memcpy(net->tmp + j * net->len, state + j * net->p.n + net->off, sizeof(float) * (size_t)net->len);
        mine = net->tmp;
    }
    dp_ps_set_state(net->ps, params + net->off, mine, step, version);
    dp_ps_hist_reset(net->ps);
    return DP_OK;
}

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    nanosleep(&ts, NULL);
}

/* The workers that have not ended the epoch, as "1, 3". */
static void not_ended(const struct dp_ps_net *net, char *out, size_t cap) {
    size_t used = 0;
    out[0] = 0;
    for (int r = 0; r < net->W && used + 16 < cap; r++)
        if (!net->ended[r]) used += (size_t)snprintf(out + used, cap - used, "%s%d", used ? ", " : "", r);
}

/* Waits for a posted receive by polling, with its own timeout (0: none),
 * so that the message can say what was awaited.  Returns 0, DP_ETIMEDOUT
 * (the receive withdrawn; the caller sets the message) or the error. */
#define POLL_TIMEOUT 1
static int poll_recv(struct dp_ps_net *net, struct dp_comm_msg *m, double timeout, int *from, int64_t *got) {
    double t0 = dp_time();
    long nap_ns = 2000;
    int rc;
    for (;;) {
        int done = 0;
        if ((rc = dp_comm_msg_test(net->c, m, &done))) break;
        if (done) return dp_comm_msg_wait(net->c, m, from, got);
        if ((rc = dp_comm_status(net->c))) break;
        if (timeout > 0 && dp_time() - t0 >= timeout) {
            rc = POLL_TIMEOUT;
            break;
        }
        struct timespec ts = {0, nap_ns};
        nanosleep(&ts, NULL);
        if (nap_ns < 200000) nap_ns *= 2; /* at most 0.2 ms late to a message */
    }
    (void)dp_comm_msg_cancel(net->c, m);
    return rc;
}

/* Waits for the next request; past the timeout it names the workers that
 * have not ended the epoch rather than "any rank". */
static int next_request(struct dp_ps_net *net, int *from, int64_t *got) {
    struct dp_comm_msg *m;
    int rc = dp_comm_irecv(net->c, net->buf, (int64_t)req_bytes(net->maxlen), DP_ANY_SOURCE, TAG_REQ, &m);
    if (rc) return rc;
    double timeout = net->p.ps.timeout_s;
    if ((rc = poll_recv(net, m, timeout, from, got)) != POLL_TIMEOUT) return rc;
    char who[256];
    not_ended(net, who, sizeof who);
    return dp_seterr(DP_ECANCELED, "comm: timeout after %.1f s on parameter-server rank %d: no push from rank(s) %s, "
                     "which have not ended the epoch (stalled or lost)", timeout, net->rank, who);
}

/* Sends rank r the reply to its push: the header and the fresh shard
 * (dp_ps_pull for `clock`, whose bound the caller has checked, so it does
 * not wait; r's pulled version becomes the server's). */
static int reply_shard(struct dp_ps_net *net, int r, int64_t clock, int64_t staleness) {
    struct rep_hdr rh = {staleness, -1};
    memcpy(net->rep, &rh, sizeof rh);
    int rc = dp_ps_pull(net->ps, r, clock, (float *)(net->rep + sizeof rh));
    return rc ? rc : dp_comm_send(net->c, net->rep, (int64_t)rep_bytes(net->len), r, TAG_REP);
}

/* SSP: the pushes whose reply the bound now allows (the worker's next
 * clock c + 1 needs version >= c + 1 - s) get it. */
static int ssp_release(struct dp_ps_net *net) {
    const int64_t v = dp_ps_version(net->ps), s = net->p.ps.staleness;
    int rc = DP_OK;
    for (int r = 0; r < net->W && !rc; r++)
        if (net->held[r] && v >= net->want[r] - s) {
            net->held[r] = 0;
            rc = reply_shard(net, r, net->want[r], net->hstale[r]);
        }
    return rc;
}

/* The replay: applies held pushes while the one whose turn it is (version
 * v: clock v / W of rank v % W) is here, replying to each at once (its
 * fresh shard, as in async). */
static int replay_drain(struct dp_ps_net *net) {
    for (;;) {
        const int64_t v = dp_ps_version(net->ps), c = v / net->W;
        const int r = (int)(v % net->W);
        if (!net->held[r]) return DP_OK;
        net->held[r] = 0;
        const struct req_hdr *h = (const struct req_hdr *)net->hbuf[r];
        /* r pushes clock c + 1 only after the reply to c: what it holds is clock c */
        if (h->clock != c)
            return dp_seterr(DP_EMISMATCH, "parameter server rank %d: rank %d pushed clock %lld at version %lld "
                             "(the replay expects clock %lld)", net->rank, r, (long long)h->clock, (long long)v,
                             (long long)c);
        struct rep_hdr rh = {0, -1};
        float *g = (float *)(net->hbuf[r] + sizeof *h);
        int rc = dp_ps_push(net->ps, r, g, h->n, c, g, &rh.staleness);
        if (rc) return rc;
        memmove(net->hbuf[r] + sizeof rh, g, sizeof(float) * (size_t)net->len);
        memcpy(net->hbuf[r], &rh, sizeof rh);
        if ((rc = dp_comm_send(net->c, net->hbuf[r], (int64_t)rep_bytes(net->len), r, TAG_REP))) return rc;
    }
}

int dp_ps_net_serve(struct dp_ps_net *net) {
    if (net->server < 0) return dp_seterr(DP_EINVAL, "dp_ps_net_serve on a worker rank");
    memset(net->ended, 0, (size_t)net->W);
    memset(net->held, 0, (size_t)net->W);
    net->next = 0;
    const int ssp = net->p.ps.staleness >= 0, ordered = net->p.ps.ordered;
    int left = net->W, rc;
    while (left > 0) {
        int from = -1;
        int64_t got = 0;
        if ((rc = next_request(net, &from, &got))) return rc;
        const struct req_hdr *h = (const struct req_hdr *)net->buf;
        if (from < 0 || from >= net->W || got < (int64_t)sizeof *h)
            return dp_seterr(DP_EMISMATCH, "parameter server rank %d: a bad request from rank %d", net->rank, from);
        if (h->type == REQ_END) {
            if (!net->ended[from]) net->ended[from] = 1, left--;
            continue;
        }
        const int64_t type = h->type; /* (the reply header overwrites the request's) */
        struct rep_hdr rh = {0, -1};
        int64_t bytes = sizeof rh;
        double t0 = dp_time();
        if (h->type == REQ_PUSH) {
            if (got != (int64_t)req_bytes(net->len))
                return dp_seterr(DP_EMISMATCH, "parameter server rank %d: rank %d pushed %lld bytes, the shard takes %lld",
                                 net->rank, from, (long long)got, (long long)req_bytes(net->len));
            float *g = (float *)(net->buf + sizeof *h);
            if (ssp) { /* added to its clock's sum (applied with the clock's last push); the reply waits */
                net->held[from] = 1, net->want[from] = h->clock + 1;
                if ((rc = dp_ps_push(net->ps, from, g, h->n, h->clock, g, &net->hstale[from])) ||
                    (rc = ssp_release(net)))
                    return rc;
            } else if (ordered) { /* held until its turn */
                memcpy(net->hbuf[from], net->buf, (size_t)got);
                net->held[from] = 1;
                if ((rc = replay_drain(net))) return rc;
            }
            if (ssp || ordered) { /* (--simulate-slow on a server rank: as below) */
                if (net->p.slow > 1) sleep_s((net->p.slow - 1) * (dp_time() - t0));
                continue;
            }
            /* the fresh shard goes in place of the gradient, after the reply header */
            float *dst = (float *)(net->buf + sizeof rh);
            if ((rc = dp_ps_push(net->ps, from, g, h->n, 0, g, &rh.staleness))) return rc;
            memmove(dst, g, sizeof(float) * (size_t)net->len);
            bytes = (int64_t)rep_bytes(net->len);
        } else if (h->type != REQ_CLAIM)
            return dp_seterr(DP_EMISMATCH, "parameter server rank %d: request type %lld from rank %d", net->rank,
                             (long long)h->type, from);
        if (net->server == 0 && net->next < net->p.batches) rh.next = net->next++;
        memcpy(net->buf, &rh, sizeof rh);
        if ((rc = dp_comm_send(net->c, net->buf, bytes, from, TAG_REP))) return rc;
        /* --simulate-slow on a server rank: its handling of a push (apply and reply) takes F x as
         * long; the sleep holds up the next request */
        if (net->p.slow > 1 && type == REQ_PUSH) sleep_s((net->p.slow - 1) * (dp_time() - t0));
    }
    /* server 0 closes the epoch: the workers may enter the epoch-end collectives */
    for (int r = 0; net->server == 0 && r < net->W && !rc; r++) {
        int64_t word = 0;
        rc = dp_comm_send(net->c, &word, sizeof word, r, TAG_CLOSE);
    }
    /* every worker takes the full state at the epoch's end: its next pull is this version */
    for (int r = 0; r < net->W && !rc; r++) rc = dp_ps_pull(net->ps, r, 0, (float *)(net->buf + sizeof(struct rep_hdr)));
    return rc;
}

/* ---- worker ------------------------------------------------------------------------------- */

/* Posts the replies' receives, sends the requests, waits for all of them.
 * push: every server gets its slice of g; else a header to server 0 only. */
static int exchange(struct dp_ps_net *net, int type, const float *g, double n, int64_t clock, int all) {
    int rc = DP_OK, nsrv = all ? net->S : 1;
    for (int i = 0; i < nsrv; i++) net->rmsg[i] = net->smsg[i] = NULL;
    for (int i = 0; i < nsrv && !rc; i++) {
        int64_t off = 0, len = 0;
        if (type == REQ_PUSH) dp_comm_split(net->p.n, net->S, i, &off, &len);
        rc = dp_comm_irecv(net->c, net->rbuf[i], (int64_t)rep_bytes(net->maxlen), net->W + i, TAG_REP, &net->rmsg[i]);
        if (rc) break;
        struct req_hdr h = {type, n, clock};
        memcpy(net->sbuf[i], &h, sizeof h);
        if (len) memcpy(net->sbuf[i] + sizeof h, g + off, sizeof(float) * (size_t)len);
        rc = dp_comm_isend(net->c, net->sbuf[i], (int64_t)req_bytes(len), net->W + i, TAG_REQ, &net->smsg[i]);
    }
    for (int i = 0; i < nsrv; i++) {
        if (net->smsg[i]) {
            int r2 = dp_comm_msg_wait(net->c, net->smsg[i], NULL, NULL);
            if (!rc) rc = r2;
        }
        if (net->rmsg[i]) {
            int r2 = rc ? dp_comm_msg_cancel(net->c, net->rmsg[i]) : dp_comm_msg_wait(net->c, net->rmsg[i], NULL, NULL);
            if (!rc) rc = r2;
        }
    }
    return rc;
}

int dp_ps_net_claim(struct dp_ps_net *net, int64_t *k) {
    int rc = exchange(net, REQ_CLAIM, NULL, 0, 0, 0);
    if (rc) return dp_adderr(rc, "worker %d: claiming a batch from parameter-server rank %d", net->rank, net->W);
    *k = ((const struct rep_hdr *)net->rbuf[0])->next;
    return DP_OK;
}

int dp_ps_net_push(struct dp_ps_net *net, const float *g, double n, int64_t clock, float *params, int64_t *staleness,
                   int64_t *k) {
    int rc = exchange(net, REQ_PUSH, g, n, clock, 1);
    if (rc)
        return dp_adderr(rc, "worker %d: push to the parameter servers (ranks %d..%d)", net->rank, net->W,
                         net->ranks - 1);
    int64_t smax = 0;
    for (int i = 0; i < net->S; i++) {
        int64_t off, len;
        dp_comm_split(net->p.n, net->S, i, &off, &len);
        const struct rep_hdr *h = (const struct rep_hdr *)net->rbuf[i];
        if (h->staleness > smax) smax = h->staleness;
        memcpy(params + off, net->rbuf[i] + sizeof *h, sizeof(float) * (size_t)len);
    }
    *k = ((const struct rep_hdr *)net->rbuf[0])->next;
    *staleness = smax;
    if (n > 0) dp_ps_hist_add(&net->hist, smax);
    return DP_OK;
}

/* END to every server, then the wait for server 0's CLOSE (every worker has
 * ended).  That wait allows twice the timeout: a stalled worker is then
 * named by the servers (after one timeout) rather than by the other
 * workers' epoch-end collective, which would also name the servers (they
 * are not in it yet). */
int dp_ps_net_end(struct dp_ps_net *net) {
    struct dp_comm_msg *m;
    int64_t word;
    int rc = dp_comm_irecv(net->c, &word, sizeof word, net->W, TAG_CLOSE, &m);
    if (rc) return dp_adderr(rc, "worker %d: ending the epoch", net->rank);
    for (int i = 0; i < net->S && !rc; i++) {
        struct req_hdr h = {REQ_END, 0, 0};
        memcpy(net->sbuf[i], &h, sizeof h);
        rc = dp_comm_send(net->c, net->sbuf[i], sizeof h, net->W + i, TAG_REQ);
    }
    if (rc) {
        (void)dp_comm_msg_cancel(net->c, m);
        return dp_adderr(rc, "worker %d: ending the epoch at the parameter servers", net->rank);
    }
    double timeout = 2 * net->p.ps.timeout_s;
    if ((rc = poll_recv(net, m, timeout, NULL, NULL)) == POLL_TIMEOUT)
        return dp_seterr(DP_ECANCELED, "comm: timeout after %.1f s on rank %d: parameter-server rank %d did not "
                         "close the epoch (stalled or lost)", timeout, net->rank, net->W);
    return rc ? dp_adderr(rc, "worker %d: ending the epoch", net->rank) : DP_OK;
}

/* ---- epoch end ---------------------------------------------------------------------------- */

void dp_ps_net_collect(struct dp_ps_net *net, float *params, float *state, int64_t state_len, double *meta) {
    memset(params, 0, sizeof(float) * (size_t)net->p.n);
    if (state_len) memset(state, 0, sizeof(float) * (size_t)state_len);
    memset(meta, 0, sizeof(double) * (size_t)DP_PS_NET_META(net->ranks));
    if (net->server >= 0) {
        int64_t slabs = slabs_of(net), step, version;
        float *mine = slabs ? net->tmp : NULL;
        if (slabs && !mine) mine = net->tmp = dp_malloc_big(sizeof(float) * (size_t)(slabs * net->len + 1));
        /* (no memory for the state: it is lost from the checkpoint; set_state allocated it already
         * whenever a state existed, so this does not happen after a successful start) */
        dp_ps_get_state(net->ps, params + net->off, mine, &step, &version);
        for (int64_t j = 0; mine && j < slabs && (j + 1) * net->p.n <= state_len; j++)
            memcpy(state + j * net->p.n + net->off, mine + j * net->len, sizeof(float) * (size_t)net->len);
        if (net->server == 0) meta[0] = (double)version, meta[1] = (double)step;
        return;
    }
    struct dp_ps_hist *h = &net->hist;
    meta[2] = (double)h->count, meta[3] = h->sum, meta[4] = (double)h->overflow;
    for (int k = 0; k < DP_PS_HIST_BUCKETS; k++) meta[5 + k] = (double)h->bucket[k];
    meta[5 + DP_PS_HIST_BUCKETS + net->rank] = (double)h->max;
    memset(h, 0, sizeof *h);
}

void dp_ps_net_hist(const double *meta, int ranks, struct dp_ps_hist *h, int64_t *version, int64_t *step) {
    memset(h, 0, sizeof *h);
    *version = (int64_t)meta[0], *step = (int64_t)meta[1];
    h->count = (int64_t)meta[2], h->sum = meta[3], h->overflow = (int64_t)meta[4];
    for (int k = 0; k < DP_PS_HIST_BUCKETS; k++) h->bucket[k] = (int64_t)meta[5 + k];
    for (int r = 0; r < ranks; r++) {
        int64_t m = (int64_t)meta[5 + DP_PS_HIST_BUCKETS + r];
        if (m > h->max) h->max = m;
    }
}
