/* Byte-level BPE (dp/tokenizer.h): training, encoding, decoding (the tokenizer file: bpe_file.c).
 *
 * Vocabulary.  Tokens 0..255 are the bytes; merge m (0-based) makes token 256 + m from the
 * pair (a, b), a and b both below 256 + m.  A token's bytes are a's then b's.
 *
 * Training: incremental pair counts.  The text is a doubly linked list of symbols, one
 * node per byte position (nx / pv link the live ones; a merge keeps its left node and
 * unlinks the right one).  Every live position i with a right neighbour j holds the pair
 * (sym[i], sym[j]) when that pair may be merged (see "allowed" below), and each pair keeps:
 *
 *     count   the number of positions holding it (overlaps count: "aaa" holds (a, a) twice);
 *     list    those positions, as a doubly linked list threaded through the positions
 *             themselves (ln / lp; pp[i] is the pair position i holds, -1 for none).
 *
 * Pairs are found by a hash table on the key a << 16 | b.  Merging pair P = (a, b) into t
 * visits only P's positions: at each i (with right neighbour j, left h, and k after j) the
 * pairs at h, i and j are removed from their lists, i becomes t, j is unlinked, and the new
 * pairs (sym[h], t) at h and (t, sym[k]) at i are added.  P's positions are visited in text
 * order when a == b (the only case where occurrences overlap: "aaaa" -> "ZZ", as a left to
 * right pass gives); otherwise their order changes nothing.
 *
 * The most frequent pair comes from a binary heap with lazy deletion.  An entry is
 * (count, key), ordered by count, then by the smaller key (the tie rule).  Whenever a merge
 * raises a pair's count the pair is pushed with its new count; a decrease pushes nothing,
 * so a pair's newest entry may overstate its count.  Invariant: every pair with count > 0
 * has an entry >= its count.  Popping an entry whose count is the pair's count gives the
 * best pair (any other pair's count is at most its own entry, which is at most the top);
 * an entry above the pair's count is stale: it is re-pushed with the pair's count (when
 * still > 0) and the next one is taken.
 *
 * Cost.  With n text bytes and M = V - 256 merges: O(n) to build the counts; each merge
 * costs O(c log c) for its c occurrences (the log only when a == b, for the sort) plus
 * O(log H) per heap push and pop.  A merge removes c symbols, so the c over all merges
 * add up to at most n, and every push follows an occurrence: O(n log n + M log n) in all,
 * against O(n M) for recounting the text at every merge.  Memory: 22 bytes per text byte
 * (sym 2, nx, pv, pp, ln, lp 4 each) plus the pair table and the heap.
 *
 * Encoding applies the merges in rank order, each left to right, with one heap of
 * (rank, position) entries over a linked list of the text's symbols: popping the least
 * rank, then the leftmost position, merges exactly where a pass per merge would, because
 * every pair a merge creates holds the new token and so has a larger rank.  An entry is
 * stale when its position no longer holds that merge's pair (a position's pair never comes
 * back once changed: its tokens only get newer).  O(n log n), whatever the vocabulary; with
 * a pre-split, chunk by chunk (O(n log w) for chunks of w bytes).
 *
 * Allowed pairs.  A pair (a, b) is never counted nor merged when the result would be longer
 * than DP_BPE_TOKEN_BYTES_MAX bytes, or, with DP_BPE_SPLIT_SPACE, when b's first byte is a
 * space or a newline and a's last byte is another byte (the boundary of the pre-split,
 * dp/tokenizer.h).  Merged tokens never straddle a boundary, so the rule on the pair's end
 * bytes is exactly "the pair does not cross a boundary". */
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core_impl.h"
#include "dp/common.h"
#include "dp/tokenizer.h"

#include "bpe_impl.h"

/* A position or a count fits an int32: texts are below 2^31 bytes. */
#define TEXT_MAX ((size_t)INT32_MAX)

const char *const dp__bpe_split_names[DP_BPE_SPLIT_COUNT] = {"none", "space"};

/* ---- small pieces -------------------------------------------------------------- */

static uint32_t pair_key(uint32_t a, uint32_t b) { return a << 16 | b; }

static uint32_t hash_slot(uint32_t key, uint32_t mask) {
    return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

/* Whether a pair whose left part ends with byte `last` and right part starts with byte
 * `first` crosses a boundary of the pre-split. */
static int crosses(enum dp_bpe_split split, uint8_t last, uint8_t first) {
    return split == DP_BPE_SPLIT_SPACE && (first == ' ' || first == '\n') && last != first;
}

/* *p (cap elements of elem bytes, the first `used` in use) grown to at least need. */
static int grow(void **p, size_t *cap, size_t used, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *q = dp_malloc(nc * elem);
    if (!q) return -1;
    if (used) memcpy(q, *p, used * elem);
    dp_free(*p);
    *p = q;
    *cap = nc;
    return 0;
}

/* A binary min-heap of uint64 entries. */
struct heap {
    uint64_t *v;
    size_t n, cap;
};

static void heap_down(uint64_t *v, size_t n, size_t i) {
    uint64_t x = v[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && v[c + 1] < v[c]) c++;
        if (v[c] >= x) break;
        v[i] = v[c];
        i = c;
    }
    v[i] = x;
}

static int heap_push(struct heap *h, uint64_t x) {
    if (grow((void **)&h->v, &h->cap, h->n, h->n + 1, sizeof *h->v)) return -1;
    size_t i = h->n++;
    while (i > 0 && h->v[(i - 1) / 2] > x) {
        h->v[i] = h->v[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->v[i] = x;
    return 0;
}

static uint64_t heap_pop(struct heap *h) {
    uint64_t top = h->v[0];
    h->v[0] = h->v[--h->n];
    if (h->n) heap_down(h->v, h->n, 0);
    return top;
}

static void heap_build(struct heap *h) {
    for (size_t i = h->n / 2; i-- > 0;) heap_down(h->v, h->n, i);
}

/* ---- the tokenizer from its merges ----------------------------------------------- */

void dp_bpe_free(struct dp_bpe *b) {
    if (!b) return;
    dp_free(b->ma);
    dp_free(b->mb);
    dp_free(b->off);
    dp_free(b->pool);
    dp_free(b->hkey);
    dp_free(b->hrank);
    dp_free(b);
}

static int32_t rank_of(const struct dp_bpe *b, uint32_t a, uint32_t c) {
    uint32_t key = pair_key(a, c);
    for (uint32_t s = hash_slot(key, b->hmask);; s = (s + 1) & b->hmask) {
        if (b->hrank[s] < 0) return -1;
        if (b->hkey[s] == key) return b->hrank[s];
    }
}

/* Builds the tokenizer of the merges ma/mb[0..nm), which it takes over (freed on
 * failure too), validating each: its parts exist before it, it repeats no earlier merge,
 * it crosses no boundary of split, its token is at most DP_BPE_TOKEN_BYTES_MAX bytes.
 * Errors are DP_EFORMAT "bpe: WHAT:LINE: merge M ..." with merge m on line line0 + m. */
int dp__bpe_make(struct dp_bpe **out, enum dp_bpe_split split, uint16_t *ma, uint16_t *mb, int64_t nm,
                 const char *what, int64_t line0) {
    *out = NULL;
    int rc = DP_OK;
    struct dp_bpe *b = dp_calloc(1, sizeof *b);
    int64_t V = NBYTES + nm;
    uint32_t hsize = 1;
    while (hsize < 2 * (uint32_t)nm + 2) hsize *= 2;
    uint32_t *len = dp_malloc(sizeof *len * (size_t)V);
    if (!b || !len) goto nomem;
    b->vocab = V, b->split = split, b->nmerges = nm, b->ma = ma, b->mb = mb, ma = mb = NULL;
    b->hmask = hsize - 1;
    b->hkey = dp_malloc(sizeof *b->hkey * hsize);
    b->hrank = dp_malloc(sizeof *b->hrank * hsize);
    b->off = dp_malloc(sizeof *b->off * (size_t)(V + 1));
    if (!b->hkey || !b->hrank || !b->off) goto nomem;
    memset(b->hrank, 0xff, sizeof *b->hrank * hsize);
    /* lengths and validation; the first and last byte of a token come from the pool,
     * which is filled as we go (a merge's parts are earlier tokens) */
    size_t total = NBYTES;
    for (int t = 0; t < NBYTES; t++) len[t] = 1;
    for (int64_t m = 0; m < nm; m++) {
        uint32_t a = b->ma[m], c = b->mb[m];
        int64_t t = NBYTES + m;
        if (a >= (uint64_t)t || c >= (uint64_t)t) {
            rc = dp_seterr(DP_EFORMAT,
                           "bpe: %s:%lld: merge %lld (token %lld) uses token %u, which does not exist "
                           "yet (tokens 0..%lld so far)",
                           what, (long long)(line0 + m), (long long)m, (long long)t,
                           a >= (uint64_t)t ? a : c, (long long)(t - 1));
            goto fail;
        }
        if (len[a] + len[c] > DP_BPE_TOKEN_BYTES_MAX) {
            rc = dp_seterr(DP_EFORMAT, "bpe: %s:%lld: merge %lld (token %lld) is %u bytes long, more than %d",
                           what, (long long)(line0 + m), (long long)m, (long long)t, len[a] + len[c],
                           DP_BPE_TOKEN_BYTES_MAX);
            goto fail;
        }
        len[t] = len[a] + len[c];
        total += len[t];
    }
    b->pool = dp_malloc(total);
    if (!b->pool) goto nomem;
    size_t o = 0;
    for (int t = 0; t < NBYTES; t++) b->off[t] = (uint32_t)o, b->pool[o++] = (uint8_t)t;
    for (int64_t m = 0; m < nm; m++) {
        uint32_t a = b->ma[m], c = b->mb[m];
        uint8_t last = b->pool[b->off[a] + len[a] - 1], first = b->pool[b->off[c]];
        if (crosses(split, last, first)) {
            rc = dp_seterr(DP_EFORMAT,
                           "bpe: %s:%lld: merge %lld (%u %u) crosses a boundary of split %s (a token "
                           "ending in 0x%02x followed by one starting with 0x%02x)",
                           what, (long long)(line0 + m), (long long)m, a, c, dp__bpe_split_names[split], last, first);
            goto fail;
        }
        uint32_t key = pair_key(a, c), s = hash_slot(key, b->hmask);
        for (; b->hrank[s] >= 0; s = (s + 1) & b->hmask)
            if (b->hkey[s] == key) {
                rc = dp_seterr(DP_EFORMAT, "bpe: %s:%lld: merge %lld (%u %u) repeats merge %d (line %lld)", what,
                               (long long)(line0 + m), (long long)m, a, c, b->hrank[s],
                               (long long)(line0 + b->hrank[s]));
                goto fail;
            }
        b->hkey[s] = key;
        b->hrank[s] = (int32_t)m;
        b->off[NBYTES + m] = (uint32_t)o;
        memcpy(b->pool + o, b->pool + b->off[a], len[a]);
        memcpy(b->pool + o + len[a], b->pool + b->off[c], len[c]);
        o += len[a] + len[c];
    }
    b->off[V] = (uint32_t)o;
    dp_free(len);
    *out = b;
    return DP_OK;
nomem:
    rc = dp_seterr(DP_ENOMEM, "bpe: out of memory for %lld merges", (long long)nm);
fail:
    dp_free(ma);
    dp_free(mb);
    dp_free(len);
    dp_bpe_free(b);
    return rc;
}

int64_t dp_bpe_vocab(const struct dp_bpe *b) { return b ? b->vocab : 0; }

enum dp_bpe_split dp_bpe_split_rule(const struct dp_bpe *b) { return b ? b->split : DP_BPE_SPLIT_NONE; }

int dp_bpe_token_bytes(const struct dp_bpe *b, int64_t token, const uint8_t **bytes, size_t *len) {
    if (!b || !bytes || !len) return dp_seterr(DP_EINVAL, "bpe: NULL argument");
    if (token < 0 || token >= b->vocab)
        return dp_seterr(DP_EINVAL, "bpe: token %lld outside the vocabulary 0..%lld", (long long)token,
                         (long long)(b->vocab - 1));
    *bytes = b->pool + b->off[token];
    *len = b->off[token + 1] - b->off[token];
    return DP_OK;
}

/* ---- training ------------------------------------------------------------------ */

/* The trainer's state: the text as a linked list of symbols, and the pairs. */
struct pair {
    uint32_t key;  /* a << 16 | b */
    int32_t count; /* positions holding it */
    int32_t head;  /* first of them, -1 for none */
    int32_t stamp; /* the last merge that raised count (to push it once per merge) */
};

struct trainer {
    enum dp_bpe_split split;
    uint16_t *sym;                      /* (n) token at each position (dead ones: stale) */
    int32_t *nx, *pv;                   /* (n) next / previous live position, -1 at the ends */
    int32_t *pp;                        /* (n) pair held by the position, -1 for none */
    int32_t *ln, *lp;                   /* (n) next / previous position in the same pair's list */
    struct pair *pairs;                 /* (npairs) */
    size_t npairs, cap_pairs;
    int32_t *slot;                      /* hash: key -> pair index, -1 empty */
    uint32_t smask;
    int32_t *raised;                    /* pairs raised during the current merge */
    size_t nraised, cap_raised;
    struct heap heap;
    uint8_t first[DP_BPE_VOCAB_MAX], last[DP_BPE_VOCAB_MAX];
    uint16_t len[DP_BPE_VOCAB_MAX];
};

static int allowed(const struct trainer *tr, uint32_t a, uint32_t b) {
    return tr->len[a] + tr->len[b] <= DP_BPE_TOKEN_BYTES_MAX && !crosses(tr->split, tr->last[a], tr->first[b]);
}

/* Heap entry of pair p: least first = highest count, then smallest key. */
static uint64_t entry(uint32_t key, int32_t count) { return (uint64_t)(INT32_MAX - count) << 32 | key; }

static int rehash(struct trainer *tr, uint32_t size) {
    int32_t *s = dp_malloc(sizeof *s * size);
    if (!s) return -1;
    memset(s, 0xff, sizeof *s * size);
    for (size_t p = 0; p < tr->npairs; p++) {
        uint32_t i = hash_slot(tr->pairs[p].key, size - 1);
        while (s[i] >= 0) i = (i + 1) & (size - 1);
        s[i] = (int32_t)p;
    }
    dp_free(tr->slot);
    tr->slot = s;
    tr->smask = size - 1;
    return 0;
}

/* The index of pair (a, b), made (count 0) when new; -1 when out of memory. */
static int32_t pair_get(struct trainer *tr, uint32_t a, uint32_t b) {
    uint32_t key = pair_key(a, b), i = hash_slot(key, tr->smask);
    for (; tr->slot[i] >= 0; i = (i + 1) & tr->smask)
        if (tr->pairs[tr->slot[i]].key == key) return tr->slot[i];
    if (grow((void **)&tr->pairs, &tr->cap_pairs, tr->npairs, tr->npairs + 1, sizeof *tr->pairs)) return -1;
    int32_t p = (int32_t)tr->npairs++;
    tr->pairs[p] = (struct pair){key, 0, -1, -1};
    tr->slot[i] = p;
    if (2 * tr->npairs > tr->smask + 1 && rehash(tr, 2 * (tr->smask + 1))) return -1;
    return p;
}

static int32_t pair_find(const struct trainer *tr, uint32_t key) {
    for (uint32_t i = hash_slot(key, tr->smask); tr->slot[i] >= 0; i = (i + 1) & tr->smask)
        if (tr->pairs[tr->slot[i]].key == key) return tr->slot[i];
    return -1;
}

static void unlink_pos(struct trainer *tr, int32_t x) {
    struct pair *p = &tr->pairs[tr->pp[x]];
    if (tr->lp[x] >= 0) tr->ln[tr->lp[x]] = tr->ln[x];
    else p->head = tr->ln[x];
    if (tr->ln[x] >= 0) tr->lp[tr->ln[x]] = tr->lp[x];
    p->count--;
    tr->pp[x] = -1;
}

/* Position x now holds pair (a, b), when allowed.  stamp: the current merge. */
static int link_pos(struct trainer *tr, int32_t x, uint32_t a, uint32_t b, int32_t stamp) {
    if (!allowed(tr, a, b)) return 0;
    int32_t pi = pair_get(tr, a, b);
    if (pi < 0) return -1;
    struct pair *p = &tr->pairs[pi];
    tr->ln[x] = p->head;
    tr->lp[x] = -1;
    if (p->head >= 0) tr->lp[p->head] = x;
    p->head = x;
    p->count++;
    tr->pp[x] = pi;
    if (p->stamp != stamp) {
        p->stamp = stamp;
        if (grow((void **)&tr->raised, &tr->cap_raised, tr->nraised, tr->nraised + 1, sizeof *tr->raised))
            return -1;
        tr->raised[tr->nraised++] = pi;
    }
    return 0;
}

static void trainer_free(struct trainer *tr) {
    if (!tr) return;
    dp_free(tr->sym);
    dp_free(tr->nx);
    dp_free(tr->pv);
    dp_free(tr->pp);
    dp_free(tr->ln);
    dp_free(tr->lp);
    dp_free(tr->pairs);
    dp_free(tr->slot);
    dp_free(tr->raised);
    dp_free(tr->heap.v);
    dp_free(tr);
}

/* The best pair (most frequent, then smallest), or -1 when no pair is left. */
static int32_t pop_best(struct trainer *tr) {
    while (tr->heap.n) {
        uint64_t e = heap_pop(&tr->heap);
        int32_t want = INT32_MAX - (int32_t)(e >> 32);
        int32_t p = pair_find(tr, (uint32_t)e);
        int32_t have = tr->pairs[p].count;
        if (have == want) return p;
        /* stale: the pair fell since (re-push its count) or rose (a newer entry holds it) */
        if (have > 0 && have < want && heap_push(&tr->heap, entry(tr->pairs[p].key, have))) return -2;
    }
    return -1;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int dp_bpe_train(struct dp_bpe **out, const uint8_t *text, size_t len, int64_t vocab,
                 enum dp_bpe_split split) {
    if (!out) return dp_seterr(DP_EINVAL, "bpe: NULL argument");
    *out = NULL;
    if (!text && len) return dp_seterr(DP_EINVAL, "bpe: NULL text");
    if (vocab < DP_BPE_VOCAB_MIN || vocab > DP_BPE_VOCAB_MAX)
        return dp_seterr(DP_EINVAL, "bpe: vocab %lld out of range %d..%d", (long long)vocab, DP_BPE_VOCAB_MIN,
                         DP_BPE_VOCAB_MAX);
    if ((unsigned)split >= DP_BPE_SPLIT_COUNT) return dp_seterr(DP_EINVAL, "bpe: unknown split %d", (int)split);
    if (len >= TEXT_MAX)
        return dp_seterr(DP_EINVAL, "bpe: a text of %zu bytes is too long to train on (less than 2^31)", len);
    int64_t nm = vocab - NBYTES;
    int32_t n = (int32_t)len;
    int rc = DP_OK;
    int32_t *occ = NULL;
    size_t cap_occ = 0;
    uint16_t *ma = dp_malloc(sizeof *ma * (size_t)nm), *mb = dp_malloc(sizeof *mb * (size_t)nm);
    struct trainer *tr = dp_calloc(1, sizeof *tr);
    if (!ma || !mb || !tr) goto nomem;
    tr->split = split;
    size_t nn = len ? len : 1;
    tr->sym = dp_malloc(sizeof *tr->sym * nn);
    tr->nx = dp_malloc(sizeof *tr->nx * nn);
    tr->pv = dp_malloc(sizeof *tr->pv * nn);
    tr->pp = dp_malloc(sizeof *tr->pp * nn);
    tr->ln = dp_malloc(sizeof *tr->ln * nn);
    tr->lp = dp_malloc(sizeof *tr->lp * nn);
    if (!tr->sym || !tr->nx || !tr->pv || !tr->pp || !tr->ln || !tr->lp || rehash(tr, 1 << 17)) goto nomem;
    for (int t = 0; t < NBYTES; t++) tr->first[t] = tr->last[t] = (uint8_t)t, tr->len[t] = 1;
    for (int32_t i = 0; i < n; i++) {
        tr->sym[i] = text[i];
        tr->nx[i] = i + 1 < n ? i + 1 : -1;
        tr->pv[i] = i - 1;
        tr->pp[i] = -1;
    }
    for (int32_t i = n - 2; i >= 0; i--) /* backwards: each list then starts in text order */
        if (link_pos(tr, i, text[i], text[i + 1], -1)) goto nomem;
    for (size_t p = 0; p < tr->npairs; p++)
        if (heap_push(&tr->heap, entry(tr->pairs[p].key, tr->pairs[p].count))) goto nomem;
    heap_build(&tr->heap);

    for (int64_t m = 0; m < nm; m++) {
        int32_t best = pop_best(tr);
        if (best == -2) goto nomem;
        if (best < 0) {
            rc = dp_seterr(DP_EINVAL,
                           "bpe: the text runs out of pairs to merge after %lld merges (vocab %lld): "
                           "it cannot give vocab %lld; use a vocab of at most %lld, or more text",
                           (long long)m, (long long)(NBYTES + m), (long long)vocab, (long long)(NBYTES + m));
            goto fail;
        }
        uint32_t key = tr->pairs[best].key, a = key >> 16, b = key & 0xffff;
        uint32_t t = (uint32_t)(NBYTES + m);
        ma[m] = (uint16_t)a, mb[m] = (uint16_t)b;
        tr->first[t] = tr->first[a], tr->last[t] = tr->last[b];
        tr->len[t] = (uint16_t)(tr->len[a] + tr->len[b]);
        /* the occurrences, before any changes; in text order when they can overlap */
        size_t c = 0;
        if (grow((void **)&occ, &cap_occ, 0, (size_t)tr->pairs[best].count, sizeof *occ)) goto nomem;
        for (int32_t x = tr->pairs[best].head; x >= 0; x = tr->ln[x]) occ[c++] = x;
        if (a == b) qsort(occ, c, sizeof *occ, cmp_i32);
        tr->nraised = 0;
        for (size_t o = 0; o < c; o++) {
            int32_t i = occ[o];
            if (tr->pp[i] != best) continue; /* swallowed by the merge on its left (a == b) */
            int32_t j = tr->nx[i], h = tr->pv[i], k = tr->nx[j];
            if (h >= 0 && tr->pp[h] >= 0) unlink_pos(tr, h);
            unlink_pos(tr, i);
            if (tr->pp[j] >= 0) unlink_pos(tr, j);
            tr->sym[i] = (uint16_t)t;
            tr->nx[i] = k;
            if (k >= 0) tr->pv[k] = i;
            if (h >= 0 && link_pos(tr, h, tr->sym[h], t, (int32_t)m)) goto nomem;
            if (k >= 0 && link_pos(tr, i, t, tr->sym[k], (int32_t)m)) goto nomem;
        }
        for (size_t r = 0; r < tr->nraised; r++) {
            const struct pair *p = &tr->pairs[tr->raised[r]];
            if (p->count > 0 && heap_push(&tr->heap, entry(p->key, p->count))) goto nomem;
        }
    }
    dp_free(occ);
    trainer_free(tr);
    rc = dp__bpe_make(out, split, ma, mb, nm, "<training>", 0);
    return rc == DP_EFORMAT ? dp_adderr(DP_EINTERNAL, "bpe: training made an invalid merge") : rc;
nomem:
    rc = dp_seterr(DP_ENOMEM, "bpe: out of memory training on %zu bytes", len);
fail:
    dp_free(occ);
    dp_free(ma);
    dp_free(mb);
    trainer_free(tr);
    return rc;
}

/* ---- encoding and decoding ------------------------------------------------------- */

/* Merges the symbols of positions s..e-1 (linked by nx / pv, nx[e-1] = -1), with heap h
 * (emptied first); the text's chunk [s, e).  -1 when out of memory. */
static int encode_chunk(const struct dp_bpe *b, uint16_t *sym, int32_t *nx, int32_t *pv, struct heap *h,
                        int32_t s, int32_t e) {
    h->n = 0;
    /* entries (rank << 32 | position): least rank first, then leftmost */
    for (int32_t i = s; i + 1 < e; i++) {
        int32_t r = rank_of(b, sym[i], sym[i + 1]);
        if (r >= 0 && heap_push(h, (uint64_t)r << 32 | (uint32_t)i)) return -1;
    }
    heap_build(h);
    while (h->n) {
        uint64_t en = heap_pop(h);
        uint32_t r = (uint32_t)(en >> 32);
        int32_t i = (int32_t)(uint32_t)en, j = nx[i];
        /* stale: i was swallowed (nx -2) or its pair changed */
        if (j < 0 || sym[i] != b->ma[r] || sym[j] != b->mb[r]) continue;
        uint16_t t = (uint16_t)(NBYTES + r);
        int32_t k = nx[j], hh = pv[i], r2;
        sym[i] = t;
        nx[i] = k;
        if (k >= 0) pv[k] = i;
        nx[j] = -2;
        if (hh >= 0 && (r2 = rank_of(b, sym[hh], t)) >= 0 && heap_push(h, (uint64_t)r2 << 32 | (uint32_t)hh))
            return -1;
        if (k >= 0 && (r2 = rank_of(b, t, sym[k])) >= 0 && heap_push(h, (uint64_t)r2 << 32 | (uint32_t)i))
            return -1;
    }
    return 0;
}

/* With a pre-split the text is encoded chunk by chunk, between boundaries (no merge
 * crosses one): the same tokens as one pass over the whole text, with small heaps that
 * stay in cache. */
int dp_bpe_encode(const struct dp_bpe *b, const uint8_t *text, size_t len, uint16_t **tokens, int64_t *n) {
    if (!b || !tokens || !n || (!text && len)) return dp_seterr(DP_EINVAL, "bpe: NULL argument");
    *tokens = NULL;
    *n = 0;
    if (len >= TEXT_MAX)
        return dp_seterr(DP_EINVAL, "bpe: a text of %zu bytes is too long to encode at once (less than 2^31)",
                         len);
    size_t nn = len ? len : 1;
    uint16_t *sym = dp_malloc(sizeof *sym * nn);
    int32_t *nx = dp_malloc(sizeof *nx * nn), *pv = dp_malloc(sizeof *pv * nn);
    struct heap h = {0};
    if (!sym || !nx || !pv) goto nomem;
    int32_t N = (int32_t)len, c = 0;
    for (int32_t s = 0, e; s < N; s = e) {
        e = s + 1;
        if (b->split != DP_BPE_SPLIT_NONE)
            while (e < N && !crosses(b->split, text[e - 1], text[e])) e++;
        else
            e = N;
        for (int32_t i = s; i < e; i++) sym[i] = text[i], nx[i] = i + 1 < e ? i + 1 : -1, pv[i] = i - 1;
        pv[s] = -1;
        if (encode_chunk(b, sym, nx, pv, &h, s, e)) goto nomem;
        for (int32_t i = s; i >= 0; i = nx[i]) sym[c++] = sym[i]; /* c <= i: compacts in place */
    }
    dp_free(nx);
    dp_free(pv);
    dp_free(h.v);
    *tokens = sym;
    *n = c;
    return DP_OK;
nomem:
    dp_free(sym);
    dp_free(nx);
    dp_free(pv);
    dp_free(h.v);
    return dp_seterr(DP_ENOMEM, "bpe: out of memory encoding %zu bytes", len);
}

int dp_bpe_decode(const struct dp_bpe *b, const uint16_t *tokens, int64_t n, uint8_t **text, size_t *len) {
    if (!b || !text || !len || n < 0 || (!tokens && n)) return dp_seterr(DP_EINVAL, "bpe: NULL argument");
    *text = NULL;
    *len = 0;
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (tokens[i] >= b->vocab)
            return dp_seterr(DP_EINVAL, "bpe: token %u at index %lld is outside the vocabulary of %lld", tokens[i],
                             (long long)i, (long long)b->vocab);
        total += b->off[tokens[i] + 1] - b->off[tokens[i]];
    }
    uint8_t *out = dp_malloc(total ? total : 1);
    if (!out) return dp_seterr(DP_ENOMEM, "bpe: out of memory decoding %lld tokens", (long long)n);
    size_t o = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t s = b->off[tokens[i]], l = b->off[tokens[i] + 1] - s;
        memcpy(out + o, b->pool + s, l);
        o += l;
    }
    *text = out;
    *len = total;
    return DP_OK;
}

