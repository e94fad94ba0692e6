/* The tokenizer file of byte-level BPE (dp/tokenizer.h): its text, written and parsed, and the
 * file beside a token file. */
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core_impl.h"
#include "dp/common.h"
#include "bpe_impl.h"

/* ---- the tokenizer file ------------------------------------------------------------ */

int dp_bpe_serialize(const struct dp_bpe *b, uint8_t **buf, size_t *len) {
    if (!b || !buf || !len) return dp_seterr(DP_EINVAL, "bpe: NULL argument");
    *buf = NULL;
    *len = 0;
    size_t cap = 64 + 12 * (size_t)b->nmerges; /* "65535 65535\n" is 12 bytes */
    char *s = dp_malloc(cap);
    if (!s) return dp_seterr(DP_ENOMEM, "bpe: out of memory");
    size_t o = (size_t)snprintf(s, cap, "%s %d\nvocab %lld\nsplit %s\n", DP_BPE_MAGIC, DP_BPE_VERSION,
                                (long long)b->vocab, dp__bpe_split_names[b->split]);
    for (int64_t m = 0; m < b->nmerges; m++) o += (size_t)snprintf(s + o, cap - o, "%u %u\n", b->ma[m], b->mb[m]);
    *buf = (uint8_t *)s;
    *len = o;
    return DP_OK;
}

int dp_bpe_save(const struct dp_bpe *b, const char *path) {
    if (!b || !path) return dp_seterr(DP_EINVAL, "bpe: NULL argument");
    /* the atomic writer would name its temporary file; name the folder */
    char dir[4096];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir)
        return dp_seterr(DP_EINVAL, "bpe: path too long: %s", path);
    struct stat st;
    const char *d = dirname(dir);
    if (stat(d, &st) != 0 || !S_ISDIR(st.st_mode))
        return dp_seterr(DP_ENOENT, "bpe: cannot write %s: folder %s does not exist", path, d);
    uint8_t *buf;
    size_t len;
    int rc = dp_bpe_serialize(b, &buf, &len);
    if (rc) return rc;
    struct dp__wpart part = {buf, len};
    rc = dp__write_file_atomic(path, &part, 1, "bpe");
    dp_free(buf);
    return rc;
}

/* A reader of lines, each ended by '\n'. */
struct lines {
    const uint8_t *buf;
    size_t len, pos;
    int64_t no; /* the number of the line last read */
    const char *what;
};

/* The next line into *s, *n bytes (without its '\n'): 1, 0 at the end, or DP_EFORMAT for a
 * last line with no '\n'. */
static int next_line(struct lines *l, const char **s, size_t *n) {
    if (l->pos >= l->len) return 0;
    const uint8_t *p = l->buf + l->pos, *e = memchr(p, '\n', l->len - l->pos);
    l->no++;
    if (!e)
        return dp_seterr(DP_EFORMAT, "bpe: %s:%lld: the last line has no newline (a cut file?)", l->what,
                         (long long)l->no);
    *s = (const char *)p;
    *n = (size_t)(e - p);
    l->pos += *n + 1;
    return 1;
}

/* A number in the file's one spelling: decimal digits, no sign, no leading zero (but "0"),
 * at most 5 digits; the digits read go to *used.  -1 when there is none. */
static int64_t read_num(const char *s, size_t n, size_t *used) {
    size_t k = 0;
    int64_t v = 0;
    while (k < n && k < 6 && s[k] >= '0' && s[k] <= '9') v = 10 * v + (s[k++] - '0');
    *used = k;
    if (k == 0 || k > 5 || (k > 1 && s[0] == '0') || (k < n && s[k] >= '0' && s[k] <= '9')) return -1;
    return v;
}

/* Whether line s[0..n) is `word` then one space and a number; the number to *v. */
static int keyword_num(const char *s, size_t n, const char *word, int64_t *v) {
    size_t w = strlen(word), used;
    if (n <= w + 1 || memcmp(s, word, w) != 0 || s[w] != ' ') return 0;
    *v = read_num(s + w + 1, n - w - 1, &used);
    return *v >= 0 && w + 1 + used == n;
}


int dp_bpe_parse(struct dp_bpe **out, const uint8_t *buf, size_t len, const char *what) {
    if (!out) return dp_seterr(DP_EINVAL, "bpe: NULL argument");
    *out = NULL;
    if (!buf) len = 0;
    if (!what) what = "<memory>";
    struct lines l = {buf, len, 0, 0, what};
    const char *s;
    size_t n;
    int rc;
    size_t ml = strlen(DP_BPE_MAGIC);
    if (len < ml + 1 || memcmp(buf, DP_BPE_MAGIC " ", ml + 1) != 0) {
        char start[128];
        dp__describe_start(start, sizeof start, buf, len);
        return dp_seterr(DP_EFORMAT, "bpe: %s is not a BPE tokenizer file (%s, not \"%s %d\")", what, start,
                         DP_BPE_MAGIC, DP_BPE_VERSION);
    }
    int64_t version, vocab;
    if ((rc = next_line(&l, &s, &n)) < 0) return rc;
    if (!keyword_num(s, n, DP_BPE_MAGIC, &version))
        return dp_seterr(DP_EFORMAT, "bpe: %s:1: expected \"%s %d\" (magic and version)", what, DP_BPE_MAGIC,
                         DP_BPE_VERSION);
    if (version != DP_BPE_VERSION)
        return dp_seterr(DP_EFORMAT, "bpe: %s:1: unsupported version %lld (this dptrain reads version %d)", what,
                         (long long)version, DP_BPE_VERSION);
    if ((rc = next_line(&l, &s, &n)) < 0) return rc;
    if (rc == 0 || !keyword_num(s, n, "vocab", &vocab))
        return dp_seterr(DP_EFORMAT, "bpe: %s:2: expected \"vocab V\"", what);
    if (vocab < DP_BPE_VOCAB_MIN || vocab > DP_BPE_VOCAB_MAX)
        return dp_seterr(DP_EFORMAT, "bpe: %s:2: vocab %lld out of range %d..%d", what, (long long)vocab,
                         DP_BPE_VOCAB_MIN, DP_BPE_VOCAB_MAX);
    if ((rc = next_line(&l, &s, &n)) < 0) return rc;
    int split = -1;
    for (int k = 0; rc == 1 && k < DP_BPE_SPLIT_COUNT; k++)
        if (n == 6 + strlen(dp__bpe_split_names[k]) && !memcmp(s, "split ", 6) && !memcmp(s + 6, dp__bpe_split_names[k], n - 6))
            split = k;
    if (split < 0) return dp_seterr(DP_EFORMAT, "bpe: %s:3: expected \"split none\" or \"split space\"", what);
    int64_t nm = vocab - NBYTES;
    uint16_t *ma = dp_malloc(sizeof *ma * (size_t)nm), *mb = dp_malloc(sizeof *mb * (size_t)nm);
    if (!ma || !mb) {
        dp_free(ma);
        dp_free(mb);
        return dp_seterr(DP_ENOMEM, "bpe: out of memory for %lld merges", (long long)nm);
    }
    /* The merge lines: only their spelling here; bpe_make checks what they mean. */
    for (int64_t m = 0; m < nm; m++) {
        if ((rc = next_line(&l, &s, &n)) <= 0) {
            if (rc == 0)
                rc = dp_seterr(DP_EFORMAT, "bpe: %s: truncated: %lld merge lines, vocab %lld needs %lld", what,
                               (long long)m, (long long)vocab, (long long)nm);
            goto fail;
        }
        size_t u1, u2 = 0;
        int64_t a = read_num(s, n, &u1), c = -1;
        if (a >= 0 && u1 + 1 < n && s[u1] == ' ') c = read_num(s + u1 + 1, n - u1 - 1, &u2);
        if (a < 0 || c < 0 || u1 + 1 + u2 != n) {
            rc = dp_seterr(DP_EFORMAT, "bpe: %s:%lld: merge %lld: expected two token numbers \"A B\"", what,
                           (long long)l.no, (long long)m);
            goto fail;
        }
        if (a > 65535 || c > 65535) {
            rc = dp_seterr(DP_EFORMAT, "bpe: %s:%lld: merge %lld uses token %lld, which does not exist yet (tokens "
                           "0..%lld so far)", what, (long long)l.no, (long long)m, (long long)(a > c ? a : c),
                           (long long)(NBYTES + m - 1));
            goto fail;
        }
        ma[m] = (uint16_t)a, mb[m] = (uint16_t)c;
    }
    if (l.pos != len) {
        rc = dp_seterr(DP_EFORMAT, "bpe: %s:%lld: more after the %lld merges of vocab %lld", what,
                       (long long)(l.no + 1), (long long)nm, (long long)vocab);
        goto fail;
    }
    return dp__bpe_make(out, (enum dp_bpe_split)split, ma, mb, nm, what, 4);
fail:
    dp_free(ma);
    dp_free(mb);
    return rc;
}

int dp_bpe_load(struct dp_bpe **out, const char *path) {
    if (!out || !path) return dp_seterr(DP_EINVAL, "bpe: NULL argument");
    *out = NULL;
    int fd;
    size_t size;
    int rc = dp__open_regular("bpe", path, &fd, &size);
    if (rc) return rc;
    uint8_t *buf;
    size_t len;
    rc = dp__read_fd(fd, "bpe", path, size, &buf, &len);
    close(fd);
    if (rc) return rc;
    rc = dp_bpe_parse(out, buf, len, path);
    dp_free(buf);
    return rc;
}

int dp_bpe_find_for(const char *tokens_path, char *bpe_path, size_t cap) {
    if (!tokens_path || !bpe_path || cap == 0) return dp_seterr(DP_EINVAL, "bpe: NULL argument");
    if (snprintf(bpe_path, cap, "%s%s", tokens_path, DP_BPE_SUFFIX) >= (int)cap)
        return dp_seterr(DP_EINVAL, "bpe: path too long: %s%s", tokens_path, DP_BPE_SUFFIX);
    struct stat st;
    return stat(bpe_path, &st) == 0 && S_ISREG(st.st_mode);
}
