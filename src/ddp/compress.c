/* Gradient compression: the schemes behind --compress, called by the reducer
 * per bucket (compress -> collective -> decompress into the gradient slab)
 * or, for PowerSGD, once per step after backward.
 *
 * Units.  The slab the reducer sums holds each worker's share of the
 * global-batch gradient (its samples' gradients times 1/N; with accumulation
 * the plain sums, scaled after the reduction), so the SUM over ranks is the
 * gradient.  Every scheme below therefore puts the SUM over ranks of the
 * decompressed contributions into the slab, and a residual e is what this
 * worker has not yet sent of its own share: summed over steps and workers,
 * (applied sums) + (final residuals) = (gradients), to rounding
 * (tests/test_compress.c checks it).
 *
 * The byte transport.  The sparse and packed schemes (fp16, topk, sign)
 * exchange byte payloads by all-gather, in equal blocks (every rank sends the
 * same number of bytes).  The communicator's all-gather is typed, and in a
 * hierarchical world with several threads per process its local stage is a
 * sum of zero-padded blocks (dp/comm.h): raw bytes reinterpreted as floats
 * would not survive (x + 0 turns -0.0 into +0.0 and quiets signalling NaNs).  So the payload
 * travels 3 bytes per fp32 word, as the integer b0 + 256 b1 + 65536 b2
 * (< 2^24, exact in fp32, never -0, NaN or subnormal): exact under a copy or
 * a sum with zeros, at 4/3 the bytes.  The accounting counts the words.
 *
 * This file: the compressor and its schemes; compress_codec.c: the names and
 * specs, and the pure encoders (fp16, the wire packing, top-k selection, sign
 * bits, Gram-Schmidt) that the schemes and the tests share. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/compress_impl.h"

/* ---- the compressor ---- */

struct cz_seg {                /* topk, sign: one tensor of a bucket */
    int64_t off, count;        /* elements, from the bucket's start */
    int64_t k;                 /* topk: elements kept */
    int dense;                 /* 1-D (bias, norm): sent as fp32, no residual */
};

struct cz_bucket {
    int64_t off, count;
    float unit;                /* this step's slab unit (bucket_start -> bucket_end) */
    int64_t k;                 /* topk: pairs sent (the sum of the segments' k) */
    struct cz_seg *seg;        /* (nseg) the tensors, in slab order, covering the bucket */
    int nseg;
    int64_t nhead;             /* topk, sign: fp32 values before the pairs or bits (dense
                                  segments' values; sign: and one scale per other segment) */
    size_t payload;            /* bytes each rank sends (fp16, topk, sign) */
    int64_t words;             /* wire words per rank block */
    float *wire;               /* (P x words) all-gather buffer, or bf16: (count) uint16 */
};

struct pz_tensor {             /* powersgd: one compressed matrix (n, m), row-major in the slab */
    int64_t off, n, m, r;
    int64_t qoff, poff;        /* its Q (m, r) in q, its P (n, r) in abuf */
    int64_t pidx;              /* parameter index (the RNG key of Q's initial values) */
};

struct dp_compressor {
    struct dp_compress_params p;
    struct dp_comm *comm;
    int P, me;
    int64_t num_params;
    struct cz_bucket *b;
    int nb;
    float *e;                  /* (num_params) residual (topk, sign, powersgd), else NULL */
    uint8_t *bytes;            /* (max payload) encode/decode scratch, compute thread only */
    uint32_t *idx;             /* (max bucket count) topk scratch */
    /* powersgd */
    struct pz_tensor *t;
    int nt;
    int64_t (*plain)[2];       /* (np) the slab's uncompressed ranges (off, count) */
    int np;
    float *q;                  /* (nq) every tensor's Q, warm-started step to step */
    int64_t nq;
    float *abuf;               /* (na) P's then the uncompressed gradients */
    float beta;                /* local momentum (topk, sign; 0: off), see ef_begin */
    float *mw;                 /* (num_params) this worker's momentum of its own gradients */
    float *sprev;              /* (num_params) the last step's decompressed sum, optimizer units */
    int64_t na, nplain;
};

static void ring_bytes(const struct dp_compressor *c, double bytes, int allgather, double *sent, double *recv) {
    /* all-reduce of B bytes: 2 (P-1)/P B each way; all-gather of B bytes in
     * all: (P-1)/P B (ring and rhd move the same volume) */
    double v = (allgather ? 1.0 : 2.0) * (c->P - 1) / c->P * bytes;
    *sent += v, *recv += v;
}

/* topk and sign work per tensor, not per bucket: a bucket holds tensors whose
 * gradients differ by orders of magnitude (cnn: fc1's 401 408 weights and
 * its 128 biases; conv1 beside conv2), and one top-k or one scale over all of
 * them starves the small ones (their residual grows for many steps, then
 * lands at once).  1-D tensors (biases, norms: a few hundred floats) go
 * dense, as fp32, and keep no residual.  The segments cover the bucket in
 * slab order (a range no parameter names, if any, is a segment of its own). */
static int plan_segments(struct cz_bucket *z, const struct dp_model *m, double fraction) {
    z->seg = dp_calloc((size_t)(2 * m->nparams + 2), sizeof *z->seg);
    if (!z->seg) return dp_seterr(DP_ENOMEM, "compress: out of memory");
    int64_t at = 0; /* bucket-relative: [0, at) has segments */
    for (int i = 0; i < m->nparams; i++) {
        const struct dp_param_info *pi = &m->params[i];
        int64_t o = pi->offset - z->off, n = pi->count;
        if (pi->is_buffer || o < at || o >= z->count) continue;
        if (o > at) z->seg[z->nseg++] = (struct cz_seg){.off = at, .count = o - at};
        if (o + n > z->count) n = z->count - o;
        z->seg[z->nseg++] = (struct cz_seg){.off = o, .count = n, .dense = pi->shape.ndim < 2};
        at = o + n;
    }
    if (at < z->count) z->seg[z->nseg++] = (struct cz_seg){.off = at, .count = z->count - at};
    z->k = z->nhead = 0;
    for (int s = 0; s < z->nseg; s++) {
        struct cz_seg *g = &z->seg[s];
        if (g->dense) {
            z->nhead += g->count;
            continue;
        }
        z->nhead++; /* (sign: the scale; topk does not count it, below) */
        g->k = (int64_t)ceil(fraction * (double)g->count);
        if (g->k < 1) g->k = 1;
        if (g->k > g->count) g->k = g->count;
        z->k += g->k;
    }
    return DP_OK;
}

static int powersgd_plan(struct dp_compressor *c, const struct dp_model *m) {
    int cap = m->nparams + 1;
    c->t = dp_calloc((size_t)cap, sizeof *c->t);
    c->plain = dp_calloc((size_t)cap + 1, sizeof *c->plain);
    if (!c->t || !c->plain) return dp_seterr(DP_ENOMEM, "powersgd: out of memory");
    int64_t at = 0; /* the slab below `at` is planned */
    for (int i = 0; i < m->nparams; i++) {
        const struct dp_param_info *pi = &m->params[i];
        if (pi->is_buffer || pi->shape.ndim < 2) continue;
        /* a layer's weight (out, in) or conv weight (out, in, kh, kw) as (out, in kh kw) */
        int64_t n = pi->shape.d[0], mm = pi->count / (n ? n : 1);
        int64_t r = c->p.rank < (n < mm ? n : mm) ? c->p.rank : (n < mm ? n : mm);
        /* worth it when r (n + m) is at least 2x smaller than n m */
        if (!c->p.compress_all && 2 * r * (n + mm) > n * mm) continue;
        if (pi->offset < at) continue; /* (params are registered in slab order) */
        if (pi->offset > at) c->plain[c->np][0] = at, c->plain[c->np][1] = pi->offset - at, c->np++;
        c->t[c->nt++] = (struct pz_tensor){.off = pi->offset, .n = n, .m = mm, .r = r, .qoff = c->nq,
                                           .poff = c->na, .pidx = i};
        c->nq += mm * r, c->na += n * r;
        at = pi->offset + pi->count;
    }
    if (at < c->num_params) c->plain[c->np][0] = at, c->plain[c->np][1] = c->num_params - at, c->np++;
    for (int i = 0; i < c->np; i++) c->nplain += c->plain[i][1];
    c->q = dp_malloc(sizeof(float) * (size_t)(c->nq + 1));
    c->abuf = dp_malloc_big(sizeof(float) * (size_t)(c->na + c->nplain + 1));
    if (!c->q || !c->abuf) return dp_seterr(DP_ENOMEM, "powersgd: out of memory");
    return DP_OK;
}

int dp__compress_init(struct dp_compressor **out, const struct dp_model *m, struct dp_comm *comm,
                      const struct dp_compress_params *p, const struct dp_bucket *b, int nb) {
    *out = NULL;
    if ((unsigned)p->kind >= DP_COMPRESS_COUNT) return dp_seterr(DP_EINVAL, "compress: unknown scheme");
    if (p->kind == DP_COMPRESS_NONE) return DP_OK;
    if (p->kind == DP_COMPRESS_TOPK && !(p->fraction > 0 && p->fraction <= 1))
        return dp_seterr(DP_EINVAL, "--compress topk:FRACTION needs 0 < FRACTION <= 1 (got %g)", p->fraction);
    if (p->kind == DP_COMPRESS_POWERSGD && p->rank < 1)
        return dp_seterr(DP_EINVAL, "--compress powersgd:RANK needs RANK >= 1 (got %d)", p->rank);
    if (p->powersgd_start < 0) return dp_seterr(DP_EINVAL, "--powersgd-start must be >= 0");
    struct dp_compressor *c = dp_calloc(1, sizeof *c);
    if (!c) return dp_seterr(DP_ENOMEM, "compress: out of memory");
    c->p = *p;
    c->comm = comm;
    c->P = comm ? dp_comm_world(comm) : 1;
    c->me = comm ? dp_comm_rank(comm) : 0;
    c->num_params = m->num_params;
    int rc = DP_OK;
    int ef = p->kind == DP_COMPRESS_TOPK || p->kind == DP_COMPRESS_SIGN || p->kind == DP_COMPRESS_POWERSGD;
    if (ef && !(c->e = dp_malloc_big(sizeof(float) * (size_t)(m->num_params + 1)))) {
        rc = dp_seterr(DP_ENOMEM, "compress: out of memory");
        goto fail;
    }
    c->beta = p->kind == DP_COMPRESS_TOPK || p->kind == DP_COMPRESS_SIGN ? p->momentum : 0;
    if (c->beta > 0 && (!(c->mw = dp_malloc_big(sizeof(float) * (size_t)(m->num_params + 1))) ||
                        !(c->sprev = dp_malloc_big(sizeof(float) * (size_t)(m->num_params + 1))))) {
        rc = dp_seterr(DP_ENOMEM, "compress: out of memory");
        goto fail;
    }
    if (p->kind == DP_COMPRESS_POWERSGD) {
        if ((rc = powersgd_plan(c, m))) goto fail;
    } else {
        c->b = dp_calloc((size_t)(nb ? nb : 1), sizeof *c->b);
        if (!c->b) {
            rc = dp_seterr(DP_ENOMEM, "compress: out of memory");
            goto fail;
        }
        c->nb = nb;
        size_t maxpay = 1;
        int64_t maxcount = 1;
        for (int i = 0; i < nb; i++) {
            struct cz_bucket *z = &c->b[i];
            z->off = b[i].off, z->count = b[i].count;
            if (z->count > (int64_t)UINT32_MAX) {
                rc = dp_seterr(DP_EINVAL, "compress: a bucket of %lld floats is too large (max 2^32 - 1)",
                               (long long)z->count);
                goto fail;
            }
            if (z->count > maxcount) maxcount = z->count;
            size_t nwire;
            if (p->kind == DP_COMPRESS_BF16) {
                nwire = (size_t)(z->count + 1) / 2; /* uint16 values in float-sized storage */
            } else {
                if (p->kind == DP_COMPRESS_FP16) {
                    z->payload = 4 + 2 * (size_t)z->count;
                } else {
                    if ((rc = plan_segments(z, m, p->fraction))) goto fail;
                    if (p->kind == DP_COMPRESS_SIGN) {
                        z->payload = 4 * (size_t)z->nhead + (size_t)(z->count + 7) / 8;
                    } else {
                        for (int s = 0; s < z->nseg; s++) z->nhead -= !z->seg[s].dense; /* no scales */
                        z->payload = 4 * (size_t)z->nhead + 8 * (size_t)z->k;
                    }
                }
                z->words = (int64_t)dp__wire_words(z->payload);
                nwire = (size_t)(z->words * c->P);
                if (z->payload > maxpay) maxpay = z->payload;
            }
            if (!(z->wire = dp_malloc_big(sizeof(float) * (nwire + 1)))) {
                rc = dp_seterr(DP_ENOMEM, "compress: out of memory");
                goto fail;
            }
        }
        c->bytes = dp_malloc_big(maxpay + 8);
        if (p->kind == DP_COMPRESS_TOPK) c->idx = dp_malloc_big(sizeof(uint32_t) * (size_t)maxcount);
        if (!c->bytes || (p->kind == DP_COMPRESS_TOPK && !c->idx)) {
            rc = dp_seterr(DP_ENOMEM, "compress: out of memory");
            goto fail;
        }
    }
    dp__compress_reset(c);
    *out = c;
    return DP_OK;
fail:
    dp__compress_free(c);
    return rc;
}

void dp__compress_free(struct dp_compressor *c) {
    if (!c) return;
    for (int i = 0; c->b && i < c->nb; i++) dp_free(c->b[i].wire), dp_free(c->b[i].seg);
    dp_free(c->b);
    dp_free(c->e);
    dp_free(c->mw);
    dp_free(c->sprev);
    dp_free(c->bytes);
    dp_free(c->idx);
    dp_free(c->t);
    dp_free(c->plain);
    dp_free(c->q);
    dp_free(c->abuf);
    dp_free(c);
}

int dp__compress_mode(const struct dp_compressor *c, int64_t step) {
    if (!c || c->p.kind == DP_COMPRESS_NONE || c->P < 2) return 0;
    if (c->p.kind == DP_COMPRESS_POWERSGD) return step >= c->p.powersgd_start ? 2 : 0;
    return 1;
}

/* ---- per-bucket schemes ---- */

/* The residual is kept in the units of the gradient the optimizer sees:
 * the slab times `unit` (1 when the slab is already the mean; with
 * accumulation the slab holds sums and the caller scales after the
 * reduction, and the last step of an epoch may have fewer samples).  These
 * two convert a range of e to this step's slab units and back. */
static void e_to_slab(float *e, int64_t n, float unit) {
    if (unit == 1.0f) return;
    const float inv = 1.0f / unit;
    for (int64_t j = 0; j < n; j++) e[j] *= inv;
}
static void e_from_slab(float *e, int64_t n, float unit) {
    if (unit == 1.0f) return;
    for (int64_t j = 0; j < n; j++) e[j] *= unit;
}

/* Local momentum (topk, sign; c->beta = the optimizer's SGD momentum):
 * what is compressed is this worker's momentum, not its gradient, as in
 * DGC's momentum correction (Lin et al. 2018) and EF-SGDM (Zheng et al.
 * 2019):
 *     u = beta u + g;   p = u + e;   send C(p);   e = p - C(p)
 * and the step applies S = sum over ranks of C(p) with no further momentum.
 * The optimizer still runs its own momentum m = beta m + G, so the slab
 * gets G = S_t - beta S_{t-1}: then m_t = S_t exactly (m_0 = 0 = S_{-1}), and
 * the update is lr S_t.  Without it (the optimizer's momentum on the
 * compressed gradient) an element's delayed residual is sent at once and
 * then echoed by the momentum for ~1/(1-beta) steps (measured: topk:0.01
 * and sign on the cnn, docs/results.md).  u, e and S_{t-1} are kept in
 * optimizer units (see e_to_slab) and saved with the residual.  The trainer
 * sets beta only for SGD without Nesterov or dampening (else 0: the plain
 * form); weight decay and --clip act on G as on any slab.  topk's masking
 * means that at F = 1 (everything sent) u restarts each step: plain SGD. */
/* Forms p (in e, slab units) and puts the dense segments' p at the head of
 * the payload pay, which every topk and sign payload starts with; returns
 * where the rest of the payload goes. */
static uint8_t *ef_begin(struct dp_compressor *c, struct cz_bucket *z, float *e, const float *g, float unit,
                         uint8_t *pay) {
    const int64_t n = z->count;
    z->unit = unit;
    if (c->p.no_ef) memset(e, 0, sizeof(float) * (size_t)n); /* no feedback: p = g (or u) */
    e_to_slab(e, n, unit);
    if (c->beta > 0) {
        float *u = c->mw + z->off;
        e_to_slab(u, n, unit);
        for (int64_t j = 0; j < n; j++) u[j] = c->beta * u[j] + g[j], e[j] += u[j];
    } else {
        for (int64_t j = 0; j < n; j++) e[j] += g[j];
    }
    for (int s = 0; s < z->nseg; s++) { /* 1-D: p whole, no residual */
        const struct cz_seg *sg = &z->seg[s];
        if (!sg->dense) continue;
        memcpy(pay, e + sg->off, 4 * (size_t)sg->count);
        memset(e + sg->off, 0, 4 * (size_t)sg->count);
        pay += 4 * sg->count;
    }
    return pay;
}
static void ef_end(struct dp_compressor *c, struct cz_bucket *z, float *e) {
    e_from_slab(e, z->count, z->unit);
    if (c->beta > 0) e_from_slab(c->mw + z->off, z->count, z->unit);
}

int dp__compress_bucket_start(struct dp_compressor *c, int i, float *grads, float unit, enum dp_comm_algo algo,
                              struct dp_comm_req **req, double *sent, double *recv) {
    struct cz_bucket *z = &c->b[i];
    float *g = grads + z->off;
    const int64_t n = z->count;
    if (c->p.kind == DP_COMPRESS_BF16) {
        /* bf16: the wire is the bucket rounded to bf16 (round to nearest
         * even), all-reduced by the comm with fp32 partial sums, rounded to
         * bf16 once per hop (dp/comm.h); 2 bytes per element.  No residual:
         * the rounding error is below 2^-8 relative and unbiased. */
        uint16_t *h = (uint16_t *)(void *)z->wire;
        for (int64_t j = 0; j < n; j++) h[j] = dp_bf16_from_f32(g[j]);
        ring_bytes(c, 2.0 * (double)n, 0, sent, recv);
        return dp_comm_iallreduce(c->comm, h, n, DP_DTYPE_BF16, algo, req);
    }
    uint8_t *pay = c->bytes;
    if (c->p.kind == DP_COMPRESS_FP16) {
        /* fp16: this rank's bucket times 2^s, s chosen from its own
         * max |g| so that the largest value lands in [2^14, 2^15): no
         * overflow (fp16 max 65504), and everything above 2^-24 of the
         * largest stays representable (2^-39 relative with subnormals).
         * Wire per rank: int32 s | count x fp16; the receivers decode each
         * rank's block with its own s and sum in fp32 in rank order.  The
         * comm has no fp16 sum, so this is an all-gather: (P-1) x 2 bytes
         * per element received, less than fp32's all-reduce (2 (P-1)/P x 4)
         * for P < 4 only (with the 4/3 transport, P < 3).  No residual. */
        float mx = 0;
        for (int64_t j = 0; j < n; j++) {
            float a = fabsf(g[j]);
            if (!(a <= mx)) mx = a; /* NaN wins: it stays NaN through the wire */
        }
        int32_t s = 0, ex;
        if (mx > 0 && isfinite(mx)) (void)frexpf(mx, &ex), s = 15 - ex;
        if (s > 127) s = 127; /* (2^s must be a normal float: below 2^-112 values underflow anyway) */
        memcpy(pay, &s, 4);
        const float sc = ldexpf(1.0f, s); /* a power of two: the product is exact */
        for (int64_t j = 0; j < n; j++) {
            uint16_t h = dp__f16_from_f32(g[j] * sc);
            memcpy(pay + 4 + 2 * j, &h, 2);
        }
    } else if (c->p.kind == DP_COMPRESS_TOPK) {
        /* topk with error feedback, per tensor (plan_segments), on the local
         * momentum (ef_begin: p = u + e, or g + e without momentum): in
         * each segment of count c keep the k = ceil(f c) largest |p|
         * (quickselect, not a sort) and send them as (uint32 index in the
         * bucket, fp32 value) pairs; e = p - sent (the kept entries become
         * exactly 0, and so does their u: DGC's momentum factor masking, so a
         * sent element's momentum is not sent again).  Dense (1-D) segments
         * send every value and keep no residual (nor mask u: it is the
         * momentum).  Wire per rank: the dense values (nhead fp32), then
         * k x 8 bytes; every rank sends the same bytes, so the all-gather's
         * blocks are equal.  The slab gets the sum over ranks, in rank order. */
        float *e = c->e + z->off;
        uint32_t *idx = c->idx;
        uint8_t *pairs = ef_begin(c, z, e, g, unit, pay);
        for (int s = 0; s < z->nseg; s++) {
            const struct cz_seg *sg = &z->seg[s];
            float *es = e + sg->off;
            if (sg->dense) continue;
            for (int64_t j = 0; j < sg->count; j++) idx[j] = (uint32_t)j;
            dp__topk_select(es, idx, sg->count, sg->k);
            for (int64_t j = 0; j < sg->k; j++, pairs += 8) {
                uint32_t at = (uint32_t)sg->off + idx[j];
                memcpy(pairs, &at, 4);
                memcpy(pairs + 4, &e[at], 4);
                e[at] = 0;
                if (c->beta > 0) c->mw[z->off + at] = 0; /* DGC's momentum factor masking */
            }
        }
        ef_end(c, z, e);
    } else { /* DP_COMPRESS_SIGN */
        /* EF-signSGD (Karimireddy et al. 2019), per tensor (plan_segments),
         * on the local momentum as in EF-SGDM (Zheng et al. 2019; ef_begin:
         * p = u + e, or g + e without momentum; kept in e); for each segment
         * of count c, its scale s = |p|_2 / sqrt(c) (dp__sign_scale), and
         * e = p - s sign(p) (sign(0) = +1).  Dense (1-D) segments send p
         * itself and keep no residual.  Wire per rank: the dense segments'
         * values, then each other segment's scale (fp32: nhead in all), then
         * the sign bits of the whole bucket (1 = negative, LSB first,
         * ceil(count/8) bytes; a dense segment's bits are unused).  The slab
         * gets sum over ranks of s_r sign_r, in rank order.  One scale per
         * tensor: with one per bucket a tensor whose |p| sits above the
         * bucket's mean (cnn: fc1's biases beside its weights) is sent less
         * than its gradient every step and its residual grows without bound.
         * Why |p|_2 / sqrt(c) and not the paper's |p|_1 / c (the least-squares
         * scale of one step): the sent vector's norm is s sqrt(c), a fraction
         * sqrt(delta) of |p| with delta = |p|_1^2 / (c |p|_2^2), and the
         * gradients here are heavy-tailed (cnn fc1's momentum: delta 0.02 to
         * 0.04; ReLU inputs that are often zero).  With |p|_1 / c each step
         * sent ~10% of |p| and the residual held ~20 steps of momentum
         * (|e| ~ 20 |u| on fc1): the large entries arrived late.  The
         * norm-preserving scale (|s sign(p)| = |p|, as 1-bit Adam's
         * compressed all-reduce) drains them ~1/sqrt(delta) times faster;
         * small entries overshoot by at most s and are corrected the next
         * step.  Measured (cnn, docs/results.md): see "sign's scale". */
        float *e = c->e + z->off;
        uint8_t *head = ef_begin(c, z, e, g, unit, pay);
        dp__sign_pack(e, n, pay + 4 * z->nhead);
        for (int s = 0; s < z->nseg; s++) {
            const struct cz_seg *sg = &z->seg[s];
            float *es = e + sg->off;
            if (sg->dense) continue;
            const float scale = dp__sign_scale(es, sg->count);
            memcpy(head, &scale, 4), head += 4;
            for (int64_t j = 0; j < sg->count; j++) es[j] -= es[j] < 0 ? -scale : scale;
        }
        ef_end(c, z, e);
    }
    float *blk = z->wire + z->words * c->me;
    dp__wire_pack(pay, z->payload, blk);
    ring_bytes(c, 4.0 * (double)(z->words * c->P), 1, sent, recv);
    return dp_comm_iallgather(c->comm, z->wire, z->words * c->P, DP_DTYPE_F32, algo, req);
}

/* Adds the dense segments' values at the head of a topk or sign payload to
 * the slab g; returns what follows them. */
static const uint8_t *add_dense(const struct cz_bucket *z, const uint8_t *head, float *g) {
    for (int s = 0; s < z->nseg; s++) {
        const struct cz_seg *sg = &z->seg[s];
        for (int64_t j = sg->off; sg->dense && j < sg->off + sg->count; j++, head += 4) {
            float v;
            memcpy(&v, head, 4);
            g[j] += v;
        }
    }
    return head;
}

void dp__compress_bucket_end(struct dp_compressor *c, int i, float *grads) {
    struct cz_bucket *z = &c->b[i];
    float *g = grads + z->off;
    const int64_t n = z->count;
    if (c->p.kind == DP_COMPRESS_BF16) {
        const uint16_t *h = (const uint16_t *)(const void *)z->wire;
        for (int64_t j = 0; j < n; j++) g[j] = dp_bf16_to_f32(h[j]);
        return;
    }
    uint8_t *pay = c->bytes;
    memset(g, 0, sizeof(float) * (size_t)n);
    for (int r = 0; r < c->P; r++) {
        dp__wire_unpack(z->wire + z->words * r, z->payload, pay);
        if (c->p.kind == DP_COMPRESS_FP16) {
            int32_t s;
            memcpy(&s, pay, 4);
            const float inv = ldexpf(1.0f, -s); /* exact: 2^-s is at least 2^-127 */
            for (int64_t j = 0; j < n; j++) {
                uint16_t h;
                memcpy(&h, pay + 4 + 2 * j, 2);
                g[j] += dp__f16_to_f32(h) * inv;
            }
        } else if (c->p.kind == DP_COMPRESS_TOPK) {
            const uint8_t *pairs = pay + 4 * z->nhead;
            add_dense(z, pay, g);
            for (int64_t j = 0; j < z->k; j++) {
                uint32_t at;
                float v;
                memcpy(&at, pairs + 8 * j, 4);
                memcpy(&v, pairs + 8 * j + 4, 4);
                if (at < (uint64_t)n) g[at] += v;
            }
        } else {
            const uint8_t *head = add_dense(z, pay, g), *bits = pay + 4 * z->nhead;
            for (int s = 0; s < z->nseg; s++) {
                const struct cz_seg *sg = &z->seg[s];
                float v;
                if (sg->dense) continue;
                memcpy(&v, head, 4), head += 4;
                for (int64_t j = sg->off; j < sg->off + sg->count; j++) g[j] += (bits[j >> 3] >> (j & 7)) & 1 ? -v : v;
            }
        }
    }
    if (c->beta > 0) { /* G = S_t - beta S_{t-1} (ef_begin), S kept in optimizer units */
        float *sp = c->sprev + z->off;
        const float b = c->beta, inv = 1.0f / z->unit;
        for (int64_t j = 0; j < n; j++) {
            const float st = g[j];
            g[j] = st - b * sp[j] * inv;
            sp[j] = st * z->unit;
        }
    }
}

/* ---- PowerSGD (Vogels, Karimireddy, Jaggi 2019) ----
 * For each matrix-shaped gradient (n, m) of this worker, with its residual e
 * and the warm-started Q (m, r):
 *     M = g + e
 *     P = M Q                  (n, r)    all-reduce (sum) P
 *     P = orthonormalise(P)              (same bits on every rank)
 *     Q = M^T P                (m, r)    all-reduce (sum) Q: Q = (sum_w M_w)^T P
 *     M^ = P Q^T               (n, m)    = P P^T sum_w M_w, the rank-r projection of the sum
 *     slab = M^   (a sum over ranks, as the plain all-reduce gives)
 *     e = M - M^ / W           (this worker's share of what was not sent)
 * Q stays for the next step (warm start).  Tensors where r (n + m) is not
 * at least 2x smaller than n m, and 1-D ones (biases, norms), travel
 * uncompressed in the same all-reduce as the P's, after them.  Wire per
 * step: all-reduce of sum(n r) + uncompressed floats, then of sum(m r).
 * This runs after backward (in dp_reducer_finish), not overlapped. */
int dp__compress_powersgd(struct dp_compressor *c, float *grads, float unit, enum dp_comm_algo algo, double *sent,
                          double *recv, double *tc, double *td, double t[4]) {
    t[0] = dp_time();
    float *A = c->abuf, *U = c->abuf + c->na;
    for (int k = 0; k < c->nt; k++) {
        const struct pz_tensor *x = &c->t[k];
        float *M = c->e + x->off;
        const float *g = grads + x->off;
        if (c->p.no_ef) memset(M, 0, sizeof(float) * (size_t)(x->n * x->m)); /* no feedback: M = g */
        e_to_slab(M, x->n * x->m, unit);
        for (int64_t j = 0; j < x->n * x->m; j++) M[j] += g[j];
        dp_gemm(0, 0, x->n, x->r, x->m, 1.0f, M, x->m, c->q + x->qoff, x->r, 0.0f, A + x->poff, x->r);
    }
    for (int64_t k = 0, u = 0; k < c->np; u += c->plain[k][1], k++)
        memcpy(U + u, grads + c->plain[k][0], sizeof(float) * (size_t)c->plain[k][1]);
    double c0 = dp_time() - t[0];
    int rc = dp_comm_allreduce(c->comm, A, c->na + c->nplain, DP_DTYPE_F32, algo);
    ring_bytes(c, 4.0 * (double)(c->na + c->nplain), 0, sent, recv);
    if (rc) return rc;
    double t1 = dp_time();
    for (int k = 0; k < c->nt; k++) {
        const struct pz_tensor *x = &c->t[k];
        dp__gram_schmidt(A + x->poff, x->n, x->r);
        dp_gemm(1, 0, x->m, x->r, x->n, 1.0f, c->e + x->off, x->m, A + x->poff, x->r, 0.0f, c->q + x->qoff, x->r);
    }
    t[1] = dp_time();
    *tc += c0 + (t[1] - t1);
    if (c->nq > 0) {
        rc = dp_comm_allreduce(c->comm, c->q, c->nq, DP_DTYPE_F32, algo);
        ring_bytes(c, 4.0 * (double)c->nq, 0, sent, recv);
        if (rc) return rc;
    }
    t[2] = dp_time();
    const float invW = 1.0f / (float)c->P;
    for (int k = 0; k < c->nt; k++) {
        const struct pz_tensor *x = &c->t[k];
        float *g = grads + x->off, *M = c->e + x->off;
        dp_gemm(0, 1, x->n, x->m, x->r, 1.0f, A + x->poff, x->r, c->q + x->qoff, x->r, 0.0f, g, x->m);
        for (int64_t j = 0; j < x->n * x->m; j++) M[j] -= g[j] * invW;
        e_from_slab(M, x->n * x->m, unit);
    }
    for (int64_t k = 0, u = 0; k < c->np; u += c->plain[k][1], k++)
        memcpy(grads + c->plain[k][0], U + u, sizeof(float) * (size_t)c->plain[k][1]);
    t[3] = dp_time();
    *td += t[3] - t[2];
    return DP_OK;
}

/* ---- error-feedback state: residual (num_params), then Q (nq), then with
 * local momentum u and S_{t-1} (num_params each) ---- */

int64_t dp__compress_state_len(const struct dp_compressor *c) {
    if (!c || !c->e) return 0;
    return c->num_params + c->nq + (c->mw ? 2 * c->num_params : 0);
}

void dp__compress_state_get(const struct dp_compressor *c, float *out) {
    if (!c || !c->e) return;
    const size_t np = (size_t)c->num_params;
    memcpy(out, c->e, sizeof(float) * np);
    if (c->nq) memcpy(out + np, c->q, sizeof(float) * (size_t)c->nq);
    if (c->mw) memcpy(out + np + c->nq, c->mw, sizeof(float) * np), memcpy(out + 2 * np + c->nq, c->sprev, sizeof(float) * np);
}

void dp__compress_state_set(struct dp_compressor *c, const float *in) {
    if (!c || !c->e) return;
    const size_t np = (size_t)c->num_params;
    memcpy(c->e, in, sizeof(float) * np);
    if (c->nq) memcpy(c->q, in + np, sizeof(float) * (size_t)c->nq);
    if (c->mw) memcpy(c->mw, in + np + c->nq, sizeof(float) * np), memcpy(c->sprev, in + 2 * np + c->nq, sizeof(float) * np);
}

void dp__compress_reset(struct dp_compressor *c) {
    if (!c) return;
    if (c->e) memset(c->e, 0, sizeof(float) * (size_t)c->num_params);
    if (c->mw) memset(c->mw, 0, sizeof(float) * (size_t)c->num_params);
    if (c->sprev) memset(c->sprev, 0, sizeof(float) * (size_t)c->num_params);
    /* Q's first values: N(0, 1) from (seed, DP_RNG_POWERSGD, parameter
     * index, element), the same on every rank without a broadcast */
    for (int k = 0; k < c->nt; k++) {
        const struct pz_tensor *x = &c->t[k];
        for (int64_t j = 0; j < x->m * x->r; j++)
            c->q[x->qoff + j] = dp_rng_normal(c->p.seed, DP_RNG_POWERSGD, (uint64_t)x->pidx, (uint64_t)j);
    }
}

const float *dp__compress_residual(const struct dp_compressor *c) { return c ? c->e : NULL; }
