/* Byte-level BPE (src/data/bpe.c): training against a plain reference (recount every
 * pair, merge left to right) on random texts in both pre-split modes, the tie rule on
 * Wikipedia's example, determinism, compression, the pre-split's boundaries, encode /
 * decode round trips (random bytes, the fortunes corpus), the tokenizer file (round trip
 * and every error of the reader). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dp/core.h"
#include "dp/data.h"
#include "dp/tokenizer.h"
#include "test.h"

/* ---- helpers ------------------------------------------------------------------ */


static uint64_t rng_state;
static uint32_t rnd(void) { /* xorshift64*: the tests' own, fixed sequence */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

/* The file's bytes of b, NUL-terminated (free with dp_free). */
static char *serialized(const struct dp_bpe *b) {
    uint8_t *buf;
    size_t len;
    ASSERT_OK(dp_bpe_serialize(b, &buf, &len));
    char *s = dp_malloc(len + 1);
    ASSERT_TRUE(s != NULL);
    memcpy(s, buf, len);
    s[len] = 0;
    dp_free(buf);
    return s;
}

/* decode(encode(text)) == text; the token count to *n. */
static void assert_round_trip(const struct dp_bpe *b, const uint8_t *text, size_t len, int64_t *n) {
    uint16_t *tok;
    int64_t nt;
    ASSERT_OK(dp_bpe_encode(b, text, len, &tok, &nt));
    ASSERT_TRUE(tok != NULL);
    ASSERT_TRUE(nt <= (int64_t)len);
    for (int64_t i = 0; i < nt; i++) ASSERT_TRUE(tok[i] < dp_bpe_vocab(b));
    uint8_t *back;
    size_t blen;
    ASSERT_OK(dp_bpe_decode(b, tok, nt, &back, &blen));
    ASSERT_EQ(blen, len);
    ASSERT_TRUE(len == 0 || memcmp(back, text, len) == 0);
    dp_free(back);
    dp_free(tok);
    if (n) *n = nt;
}

/* The opening of A Tale of Two Cities (public domain). */
static const char paragraph[] =
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the "
    "age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the "
    "season of Light, it was the season of Darkness, it was the spring of hope, it was the winter "
    "of despair, we had everything before us, we had nothing before us, we were all going direct "
    "to Heaven, we were all going direct the other way--in short, the period was so far like the "
    "present period, that some of its noisiest authorities insisted on its being received, for "
    "good or for evil, in the superlative degree of comparison only.\n"
    "There were a king with a large jaw and a queen with a plain face, on the throne of England; "
    "there were a king with a large jaw and a queen with a fair face, on the throne of France. In "
    "both countries it was clearer than crystal to the lords of the State preserves of loaves and "
    "fishes, that things in general were settled for ever.\n"
    "It was the year of Our Lord one thousand seven hundred and seventy-five. Spiritual "
    "revelations were conceded to England at that favoured period, as at this.\n";

/* The paragraph repeated to len bytes. */
static uint8_t *english(size_t len) {
    uint8_t *t = dp_malloc(len);
    ASSERT_TRUE(t != NULL);
    size_t p = strlen(paragraph);
    for (size_t i = 0; i < len; i++) t[i] = (uint8_t)paragraph[i % p];
    return t;
}

/* len bytes of made-up English: words of 1 to 4 common syllables, spaces, commas,
 * full stops and newlines, with a seed (far more distinct words than the paragraph, so
 * a pre-split text still has thousands of merges to learn). */
static uint8_t *babble(size_t len, uint64_t seed) {
    static const char *syl[] = {"th", "e",  "an", "re", "on", "at", "en", "nd", "ti", "es", "or", "te", "of", "ed",
                                "is", "it", "al", "ar", "st", "to", "nt", "ng", "se", "ha", "as", "ou", "io", "le",
                                "ve", "co", "me", "de", "hi", "ri", "ro", "ic", "ne", "ea", "ra", "ce", "w",  "b"};
    const size_t ns = sizeof syl / sizeof *syl;
    uint8_t *t = dp_malloc(len + 16);
    ASSERT_TRUE(t != NULL);
    rng_state = seed;
    size_t o = 0;
    while (o < len) {
        for (uint32_t k = 1 + rnd() % 4; k-- > 0 && o < len;)
            for (const char *c = syl[rnd() % ns]; *c && o < len; c++) t[o++] = (uint8_t)*c;
        uint32_t r = rnd() % 20;
        const char *sep = r == 0 ? ".\n" : r == 1 ? ", " : r == 2 ? ". " : " ";
        for (const char *c = sep; *c && o < len; c++) t[o++] = (uint8_t)*c;
    }
    return t;
}

/* ---- the reference: BPE as its definition reads ---------------------------------- */

struct ref {
    int64_t nm;
    uint16_t ma[2048], mb[2048];
    uint8_t first[2304], last[2304];
    int len[2304];
};

static int ref_allowed(const struct ref *r, enum dp_bpe_split split, int a, int b) {
    if (r->len[a] + r->len[b] > DP_BPE_TOKEN_BYTES_MAX) return 0;
    uint8_t f = r->first[b];
    return !(split == DP_BPE_SPLIT_SPACE && (f == ' ' || f == '\n') && r->last[a] != f);
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Replaces every (a, b) in seq[0..*n), left to right, by t. */
static void ref_merge(int *seq, int64_t *n, int a, int b, int t) {
    int64_t o = 0;
    for (int64_t i = 0; i < *n; i++) {
        if (i + 1 < *n && seq[i] == a && seq[i + 1] == b) seq[o++] = t, i++;
        else seq[o++] = seq[i];
    }
    *n = o;
}

/* Learns up to nm merges: recounts every pair at every merge, takes the most frequent,
 * ties to the smallest (a, b).  Returns how many it learned (fewer when out of pairs). */
static int64_t ref_train(struct ref *r, const uint8_t *text, int64_t len, int64_t nm, enum dp_bpe_split split) {
    ASSERT_TRUE(nm <= 2048);
    int *seq = malloc(sizeof *seq * (size_t)(len + 1));
    uint32_t *keys = malloc(sizeof *keys * (size_t)(len + 1));
    ASSERT_TRUE(seq && keys);
    for (int t = 0; t < 256; t++) r->first[t] = r->last[t] = (uint8_t)t, r->len[t] = 1;
    int64_t n = len;
    for (int64_t i = 0; i < len; i++) seq[i] = text[i];
    r->nm = 0;
    for (int64_t m = 0; m < nm; m++) {
        int64_t k = 0;
        for (int64_t i = 0; i + 1 < n; i++)
            if (ref_allowed(r, split, seq[i], seq[i + 1])) keys[k++] = (uint32_t)seq[i] << 16 | (uint32_t)seq[i + 1];
        if (k == 0) break;
        qsort(keys, (size_t)k, sizeof *keys, cmp_u32);
        uint32_t best = 0;
        int64_t best_c = 0;
        for (int64_t i = 0; i < k;) {
            int64_t j = i;
            while (j < k && keys[j] == keys[i]) j++;
            if (j - i > best_c) best_c = j - i, best = keys[i]; /* ascending keys: the first of a tie wins */
            i = j;
        }
        int a = (int)(best >> 16), b = (int)(best & 0xffff), t = 256 + (int)m;
        r->ma[m] = (uint16_t)a, r->mb[m] = (uint16_t)b;
        r->first[t] = r->first[a], r->last[t] = r->last[b], r->len[t] = r->len[a] + r->len[b];
        ref_merge(seq, &n, a, b, t);
        r->nm = m + 1;
    }
    free(seq);
    free(keys);
    return r->nm;
}

/* The reference's encoding: each merge in order, left to right over the whole text. */
static int64_t ref_encode(const struct ref *r, const uint8_t *text, int64_t len, int *seq) {
    int64_t n = len;
    for (int64_t i = 0; i < len; i++) seq[i] = text[i];
    for (int64_t m = 0; m < r->nm; m++) ref_merge(seq, &n, r->ma[m], r->mb[m], 256 + (int)m);
    return n;
}

/* A random text over a small alphabet (many repeats and overlapping runs). */
static void random_text(uint8_t *t, size_t len, const char *alphabet) {
    size_t k = strlen(alphabet);
    for (size_t i = 0; i < len; i++) t[i] = (uint8_t)alphabet[rnd() % k];
}

/* ---- training ------------------------------------------------------------------ */

/* Wikipedia's example: "aaabdaaabac".  aa (4 times, overlapping) first; then ab and Za
 * tie at 2 and ab = (97, 98) is the smaller pair; then ZY; then four pairs of one, of
 * which ac = (97, 99) is the smallest.  After that the text "XdXW" has three pairs left,
 * so 7 merges at most. */
TEST(bpe_wikipedia_example_and_tie_rule) {
    const uint8_t *text = (const uint8_t *)"aaabdaaabac";
    struct dp_bpe *b;
    ASSERT_OK(dp_bpe_train(&b, text, 11, 260, DP_BPE_SPLIT_NONE));
    char *s = serialized(b);
    ASSERT_TRUE(strcmp(s, "dptrain-bpe 1\nvocab 260\nsplit none\n97 97\n97 98\n256 257\n97 99\n") == 0);
    dp_free(s);
    const uint8_t *bytes;
    size_t len;
    ASSERT_OK(dp_bpe_token_bytes(b, 256, &bytes, &len));
    ASSERT_TRUE(len == 2 && memcmp(bytes, "aa", 2) == 0);
    ASSERT_OK(dp_bpe_token_bytes(b, 258, &bytes, &len));
    ASSERT_TRUE(len == 4 && memcmp(bytes, "aaab", 4) == 0);
    uint16_t *tok;
    int64_t n;
    ASSERT_OK(dp_bpe_encode(b, text, 11, &tok, &n));
    ASSERT_EQ(n, 4);
    ASSERT_EQ(tok[0], 258);
    ASSERT_EQ(tok[1], 'd');
    ASSERT_EQ(tok[2], 258);
    ASSERT_EQ(tok[3], 259);
    dp_free(tok);
    dp_bpe_free(b);
    /* 7 merges exist; the 8th is refused, saying how far it got */
    ASSERT_OK(dp_bpe_train(&b, text, 11, 263, DP_BPE_SPLIT_NONE));
    dp_bpe_free(b);
    ASSERT_ERR(dp_bpe_train(&b, text, 11, 264, DP_BPE_SPLIT_NONE), DP_EINVAL, "runs out of pairs to merge after 7 merges (vocab 263)");
    ASSERT_TRUE(b == NULL);
    /* Overlapping runs merge left to right: "aaaaa" -> Z Z a; then (Z, Z) and (Z, a)
     * tie at 1, and (256, 97) is the smaller. */
    ASSERT_OK(dp_bpe_train(&b, (const uint8_t *)"aaaaa", 5, 258, DP_BPE_SPLIT_NONE));
    s = serialized(b);
    ASSERT_TRUE(strcmp(s, "dptrain-bpe 1\nvocab 258\nsplit none\n97 97\n256 97\n") == 0);
    dp_free(s);
    ASSERT_OK(dp_bpe_encode(b, (const uint8_t *)"aaaaaaa", 7, &tok, &n)); /* Z Z Z a -> Z Z W */
    ASSERT_EQ(n, 3);
    ASSERT_EQ(tok[0], 256);
    ASSERT_EQ(tok[1], 256);
    ASSERT_EQ(tok[2], 257);
    dp_free(tok);
    dp_bpe_free(b);
}

/* The incremental trainer against the reference that recounts the text at every merge,
 * on random texts (small alphabets: long runs, overlaps, many ties), both pre-splits:
 * the same merges, and the same tokens from encode. */
TEST(bpe_training_matches_reference) {
    static struct ref r;
    static int seq[4096];
    static uint8_t text[4096], other[4096];
    const char *alphabets[] = {"ab", "aab ", "ab \n", "the cat  sat\n\n", "xy\n "};
    rng_state = 0x9e3779b97f4a7c15ull;
    for (int trial = 0; trial < 40; trial++) {
        const char *alpha = alphabets[trial % 5];
        size_t len = 200 + rnd() % 1800;
        random_text(text, len, alpha);
        random_text(other, 1000, alpha);
        enum dp_bpe_split split = trial % 2 ? DP_BPE_SPLIT_SPACE : DP_BPE_SPLIT_NONE;
        int64_t want = 20 + rnd() % 200;
        int64_t got = ref_train(&r, text, (int64_t)len, want, split);
        struct dp_bpe *b;
        if (got < want) {
            ASSERT_ERR(dp_bpe_train(&b, text, len, 256 + want, split), DP_EINVAL, "runs out of pairs");
            if (got == 0) continue;
        }
        ASSERT_OK(dp_bpe_train(&b, text, len, 256 + got, split));
        ASSERT_EQ(dp_bpe_vocab(b), 256 + got);
        ASSERT_EQ(dp_bpe_split_rule(b), split);
        char *s = serialized(b);
        /* the merge lines, one by one */
        const char *p = strchr(strchr(strchr(s, '\n') + 1, '\n') + 1, '\n') + 1;
        for (int64_t m = 0; m < got; m++) {
            unsigned a, c;
            ASSERT_EQ(sscanf(p, "%u %u", &a, &c), 2);
            if (a != r.ma[m] || c != r.mb[m])
                dp_test_fail(__FILE__, __LINE__, "trial %d merge %lld: (%u %u), the reference (%u %u)", trial,
                             (long long)m, a, c, r.ma[m], r.mb[m]);
            p = strchr(p, '\n') + 1;
        }
        dp_free(s);
        for (int w = 0; w < 2; w++) {
            const uint8_t *t = w ? other : text;
            int64_t tl = w ? 1000 : (int64_t)len;
            int64_t rn = ref_encode(&r, t, tl, seq);
            uint16_t *tok;
            int64_t n;
            ASSERT_OK(dp_bpe_encode(b, t, (size_t)tl, &tok, &n));
            ASSERT_EQ(n, rn);
            for (int64_t i = 0; i < n; i++) ASSERT_EQ(tok[i], seq[i]);
            dp_free(tok);
            assert_round_trip(b, t, (size_t)tl, NULL);
        }
        dp_bpe_free(b);
    }
}

/* The same text twice gives the same merges; the vocabulary is exactly what was asked;
 * encoding the training text compresses it.  The paragraph repeated: as minbpe's
 * BasicTokenizer (no pre-split) at 512, and with the pre-split at 300. */
TEST(bpe_deterministic_vocab_exact_and_compresses) {
    size_t len = 20000;
    uint8_t *t = english(len);
    for (int split = 0; split < DP_BPE_SPLIT_COUNT; split++) {
        int64_t V = split == DP_BPE_SPLIT_NONE ? 512 : 300;
        struct dp_bpe *b1, *b2;
        ASSERT_OK(dp_bpe_train(&b1, t, len, V, (enum dp_bpe_split)split));
        ASSERT_OK(dp_bpe_train(&b2, t, len, V, (enum dp_bpe_split)split));
        ASSERT_EQ(dp_bpe_vocab(b1), V);
        char *s1 = serialized(b1), *s2 = serialized(b2);
        ASSERT_TRUE(strcmp(s1, s2) == 0);
        dp_free(s1);
        dp_free(s2);
        int64_t n;
        assert_round_trip(b1, t, len, &n);
        double bpt = (double)len / (double)n;
        if (!(bpt > 1.5)) dp_test_fail(__FILE__, __LINE__, "split %d: %.3f bytes per token, expected > 1.5", split, bpt);
        /* one paragraph alone compresses too (it was seen in training) */
        assert_round_trip(b1, (const uint8_t *)paragraph, strlen(paragraph), &n);
        ASSERT_TRUE((double)strlen(paragraph) / (double)n > 1.5);
        dp_bpe_free(b1);
        dp_bpe_free(b2);
    }
    struct dp_bpe *b;
    dp_free(t);
    /* a larger vocabulary on made-up English: exact too */
    t = babble(100000, 3);
    ASSERT_OK(dp_bpe_train(&b, t, 100000, 2000, DP_BPE_SPLIT_SPACE));
    ASSERT_EQ(dp_bpe_vocab(b), 2000);
    int64_t n;
    assert_round_trip(b, t, 100000, &n);
    ASSERT_TRUE(100000.0 / (double)n > 2.5);
    dp_bpe_free(b);
    dp_free(t);
}

/* DP_BPE_SPLIT_SPACE: a space or newline inside a token follows the same byte, never
 * another (a token is at most one word with its leading space, or a run). */
TEST(bpe_split_space_boundaries) {
    size_t len = 40000;
    uint8_t *t = babble(len, 7);
    struct dp_bpe *b;
    ASSERT_OK(dp_bpe_train(&b, t, len, 600, DP_BPE_SPLIT_SPACE));
    int words = 0;
    for (int64_t tk = 256; tk < 600; tk++) {
        const uint8_t *p;
        size_t n;
        ASSERT_OK(dp_bpe_token_bytes(b, tk, &p, &n));
        ASSERT_TRUE(n >= 2);
        for (size_t i = 1; i < n; i++)
            if ((p[i] == ' ' || p[i] == '\n') && p[i - 1] != p[i])
                dp_test_fail(__FILE__, __LINE__, "token %lld \"%.*s\" crosses a boundary", (long long)tk, (int)n,
                             (const char *)p);
        words += n >= 3 && p[0] == ' ' && p[1] >= 'a' && p[1] <= 'z';
    }
    ASSERT_TRUE(words > 20); /* words with their leading space */
    dp_bpe_free(b);
    /* without the pre-split, pairs across words are merged: "s, " or "of t"-like tokens */
    ASSERT_OK(dp_bpe_train(&b, t, len, 600, DP_BPE_SPLIT_NONE));
    int crossing = 0;
    for (int64_t tk = 256; tk < 600; tk++) {
        const uint8_t *p;
        size_t n;
        ASSERT_OK(dp_bpe_token_bytes(b, tk, &p, &n));
        for (size_t i = 1; i < n; i++) crossing += p[i] == ' ' && p[i - 1] != ' ';
    }
    ASSERT_TRUE(crossing > 0);
    dp_bpe_free(b);
    dp_free(t);
}

/* Any bytes, whatever the text trained on: every byte value, empty input. */
TEST(bpe_round_trip_random_bytes) {
    size_t len = 30000;
    uint8_t *t = babble(len, 8);
    struct dp_bpe *b;
    ASSERT_OK(dp_bpe_train(&b, t, len, 700, DP_BPE_SPLIT_SPACE));
    static uint8_t r[65536];
    rng_state = 12345;
    for (size_t i = 0; i < sizeof r; i++) r[i] = (uint8_t)rnd();
    assert_round_trip(b, r, sizeof r, NULL);
    for (size_t n = 0; n < 40; n++) assert_round_trip(b, r + 3 * n, n, NULL);
    /* English with random bytes in it */
    for (size_t i = 0; i < len; i += 1 + rnd() % 50) t[i] = (uint8_t)rnd();
    assert_round_trip(b, t, len, NULL);
    uint16_t *tok;
    int64_t n;
    ASSERT_OK(dp_bpe_encode(b, NULL, 0, &tok, &n));
    ASSERT_TRUE(tok != NULL && n == 0);
    dp_free(tok);
    dp_bpe_free(b);
    dp_free(t);
}

/* The real corpus: learn on a part, round-trip the whole. */
TEST(bpe_fortunes_corpus_round_trip) {
    struct dp_text_corpus c;
    if (access(DP_TEXT_DEFAULT_CORPUS, F_OK) != 0)
        SKIP("the fortunes corpus %s is not installed (scripts/install-deps.sh)", DP_TEXT_DEFAULT_CORPUS);
    ASSERT_OK(dp_text_corpus_load(&c, NULL, 0));
    struct dp_bpe *b;
    size_t part = c.len < 400000 ? c.len : 400000;
    ASSERT_OK(dp_bpe_train(&b, c.bytes, part, 1024, DP_BPE_SPLIT_SPACE));
    int64_t n;
    assert_round_trip(b, c.bytes, c.len, &n);
    ASSERT_TRUE((double)c.len / (double)n > 2.0);
    dp_bpe_free(b);
    dp_text_corpus_free(&c);
}

TEST(bpe_train_and_codec_errors) {
    struct dp_bpe *b = (struct dp_bpe *)1;
    const uint8_t *t = (const uint8_t *)"hello world";
    ASSERT_ERR(dp_bpe_train(&b, t, 11, 256, DP_BPE_SPLIT_NONE), DP_EINVAL, "vocab 256 out of range 257..65536");
    ASSERT_TRUE(b == NULL);
    ASSERT_ERR(dp_bpe_train(&b, t, 11, 65537, DP_BPE_SPLIT_NONE), DP_EINVAL, "vocab 65537");
    ASSERT_ERR(dp_bpe_train(&b, t, 11, 300, DP_BPE_SPLIT_COUNT), DP_EINVAL, "split");
    ASSERT_ERR(dp_bpe_train(&b, t, 1, 257, DP_BPE_SPLIT_NONE), DP_EINVAL, "after 0 merges");
    ASSERT_ERR(dp_bpe_train(&b, NULL, 0, 257, DP_BPE_SPLIT_NONE), DP_EINVAL, "after 0 merges");
    ASSERT_ERR(dp_bpe_train(NULL, t, 11, 257, DP_BPE_SPLIT_NONE), DP_EINVAL, "NULL");
    /* split space: both pairs of "a \n" cross a boundary */
    ASSERT_ERR(dp_bpe_train(&b, (const uint8_t *)"a \n", 3, 257, DP_BPE_SPLIT_SPACE), DP_EINVAL, "after 0 merges");
    ASSERT_OK(dp_bpe_train(&b, t, 11, 258, DP_BPE_SPLIT_NONE));
    uint16_t bad[3] = {104, 257, 258};
    uint8_t *out;
    size_t len;
    ASSERT_ERR(dp_bpe_decode(b, bad, 3, &out, &len), DP_EINVAL, "token 258 at index 2");
    ASSERT_TRUE(out == NULL);
    ASSERT_OK(dp_bpe_decode(b, bad, 2, &out, &len));
    dp_free(out);
    ASSERT_OK(dp_bpe_decode(b, NULL, 0, &out, &len));
    ASSERT_TRUE(out != NULL && len == 0);
    dp_free(out);
    const uint8_t *p;
    ASSERT_ERR(dp_bpe_token_bytes(b, 258, &p, &len), DP_EINVAL, "outside the vocabulary 0..257");
    ASSERT_ERR(dp_bpe_token_bytes(b, -1, &p, &len), DP_EINVAL, "token -1");
    ASSERT_OK(dp_bpe_token_bytes(b, 255, &p, &len));
    ASSERT_TRUE(len == 1 && p[0] == 255);
    dp_bpe_free(b);
    dp_bpe_free(NULL);
}

/* ---- the tokenizer file ----------------------------------------------------------- */

TEST(bpe_save_load_and_find) {
    size_t len = 20000;
    uint8_t *t = babble(len, 9);
    struct dp_bpe *b, *c;
    ASSERT_OK(dp_bpe_train(&b, t, len, 400, DP_BPE_SPLIT_SPACE));
    char tokens[512], path[512], found[512];
    dp_test_path(tokens, "tokens.bin");
    ASSERT_EQ(dp_bpe_find_for(tokens, found, sizeof found), 0);
    ASSERT_TRUE(strcmp(found, strcat(strcpy(path, tokens), ".bpe")) == 0);
    ASSERT_OK(dp_bpe_save(b, path));
    ASSERT_EQ(dp_bpe_find_for(tokens, found, sizeof found), 1);
    char small[8];
    ASSERT_ERR(dp_bpe_find_for(tokens, small, sizeof small), DP_EINVAL, "too long");
    ASSERT_OK(dp_bpe_load(&c, found));
    char *s1 = serialized(b), *s2 = serialized(c);
    ASSERT_TRUE(strcmp(s1, s2) == 0);
    ASSERT_TRUE(strncmp(s1, "dptrain-bpe 1\nvocab 400\nsplit space\n", 36) == 0);
    dp_free(s1);
    dp_free(s2);
    uint16_t *t1, *t2;
    int64_t n1, n2;
    ASSERT_OK(dp_bpe_encode(b, t, len, &t1, &n1));
    ASSERT_OK(dp_bpe_encode(c, t, len, &t2, &n2));
    ASSERT_EQ(n1, n2);
    ASSERT_TRUE(memcmp(t1, t2, 2 * (size_t)n1) == 0);
    dp_free(t1);
    dp_free(t2);
    ASSERT_ERR(dp_bpe_save(b, dp_test_path(path, "nodir/x.bpe")), DP_ENOENT, "does not exist");
    dp_bpe_free(b);
    dp_bpe_free(c);
    dp_free(t);
}

/* Each way a file can be wrong: one DP_EFORMAT naming the line. */
TEST(bpe_load_errors) {
    struct {
        const char *text, *needle;
    } cases[] = {
        {"", "is not a BPE tokenizer file (it is empty"},
        {"hello\n", "is not a BPE tokenizer file (it starts with \"hello\\n\""},
        {"dptrain-bpe", "not a BPE tokenizer file"},
        {"dptrain-bpe 1", ":1: the last line has no newline"},
        {"dptrain-bpe 2\nvocab 257\nsplit none\n97 97\n", ":1: unsupported version 2"},
        {"dptrain-bpe x\n", ":1: expected \"dptrain-bpe 1\""},
        {"dptrain-bpe 1\n", ":2: expected \"vocab V\""},
        {"dptrain-bpe 1\nvocab\n", ":2: expected \"vocab V\""},
        {"dptrain-bpe 1\nvocab 256\nsplit none\n", ":2: vocab 256 out of range"},
        {"dptrain-bpe 1\nvocab 65537\nsplit none\n", ":2: vocab 65537 out of range"},
        {"dptrain-bpe 1\nvocab 999999\nsplit none\n", ":2: expected \"vocab V\""},
        {"dptrain-bpe 1\nvocab 257\n", ":3: expected \"split none\" or \"split space\""},
        {"dptrain-bpe 1\nvocab 257\nsplit regex\n97 97\n", ":3: expected \"split none\""},
        {"dptrain-bpe 1\nvocab 258\nsplit none\n97 97\n", "truncated: 1 merge lines, vocab 258 needs 2"},
        {"dptrain-bpe 1\nvocab 257\nsplit none\n97 97", ":4: the last line has no newline"},
        {"dptrain-bpe 1\nvocab 257\nsplit none\n97 97\n\n", ":5: more after the 1 merges"},
        {"dptrain-bpe 1\nvocab 257\nsplit none\n97 97\n98 98\n", ":5: more after the 1 merges"},
        {"dptrain-bpe 1\nvocab 257\nsplit none\n097 97\n", ":4: merge 0: expected two token numbers"},
        {"dptrain-bpe 1\nvocab 257\nsplit none\n97  97\n", ":4: merge 0: expected two token numbers"},
        {"dptrain-bpe 1\nvocab 257\nsplit none\n97 97\r\n", ":4: merge 0: expected two token numbers"},
        {"dptrain-bpe 1\nvocab 257\nsplit none\n-1 97\n", ":4: merge 0: expected two token numbers"},
        {"dptrain-bpe 1\nvocab 257\nsplit none\n97\n", ":4: merge 0: expected two token numbers"},
        {"dptrain-bpe 1\nvocab 257\nsplit none\n70000 97\n", ":4: merge 0 uses token 70000"},
        {"dptrain-bpe 1\nvocab 257\nsplit none\n256 97\n", ":4: merge 0 (token 256) uses token 256, which does not exist yet"},
        {"dptrain-bpe 1\nvocab 258\nsplit none\n97 98\n257 97\n", ":5: merge 1 (token 257) uses token 257"},
        {"dptrain-bpe 1\nvocab 258\nsplit none\n97 98\n97 98\n", ":5: merge 1 (97 98) repeats merge 0 (line 4)"},
        {"dptrain-bpe 1\nvocab 257\nsplit space\n104 32\n", ":4: merge 0 (104 32) crosses a boundary of split space"},
        {"dptrain-bpe 1\nvocab 257\nsplit space\n97 10\n", "crosses a boundary"},
    };
    char p[512];
    dp_test_path(p, "t.bpe");
    struct dp_bpe *b = (struct dp_bpe *)1;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        dp_test_write_file(p, cases[i].text, strlen(cases[i].text));
        dp_clearerr();
        int rc = dp_bpe_load(&b, p);
        if (rc != DP_EFORMAT || !strstr(dp_errmsg(), cases[i].needle) || !strstr(dp_errmsg(), p))
            dp_test_fail(__FILE__, __LINE__, "case %zu: rc %d, message '%s', expected '%s'", i, rc, dp_errmsg(),
                         cases[i].needle);
        ASSERT_TRUE(b == NULL);
        ASSERT_TRUE(strchr(dp_errmsg(), '\n') == NULL);
        ASSERT_ERR(dp_bpe_parse(&b, (const uint8_t *)cases[i].text, strlen(cases[i].text), "buf"), DP_EFORMAT,
                   cases[i].needle);
    }
    /* what split space allows: a run of spaces, a space starting a word */
    const char *ok = "dptrain-bpe 1\nvocab 259\nsplit space\n32 32\n32 97\n10 10\n";
    ASSERT_OK(dp_bpe_parse(&b, (const uint8_t *)ok, strlen(ok), NULL));
    dp_bpe_free(b);
    /* a token longer than DP_BPE_TOKEN_BYTES_MAX: doubling 'a' 11 times reaches 2048 */
    char big[512];
    int o = snprintf(big, sizeof big, "dptrain-bpe 1\nvocab 267\nsplit none\n97 97\n");
    for (int m = 1; m < 11; m++) o += snprintf(big + o, sizeof big - (size_t)o, "%d %d\n", 255 + m, 255 + m);
    ASSERT_ERR(dp_bpe_parse(&b, (const uint8_t *)big, (size_t)o, "big"), DP_EFORMAT,
               "big:14: merge 10 (token 266) is 2048 bytes long, more than 1024");
    ASSERT_ERR(dp_bpe_load(&b, dp_test_path(p, "missing.bpe")), DP_ENOENT, "no such file");
    ASSERT_ERR(dp_bpe_load(&b, dp_test_tmpdir()), DP_EIO, "not a regular file");
}
