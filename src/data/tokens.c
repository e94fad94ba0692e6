/* Token files (format in dp/data.h, docs/text.md): a 32-byte little-endian header (magic,
 * version, vocab, count, crc, reserved), then count uint16 tokens.  The reader treats the
 * file as untrusted input: every header field is checked, in file order, before anything is
 * allocated for the tokens, and the only allocation is bounded by the bytes actually present
 * (count must match the file size exactly), so a 32-byte file claiming 2^63 tokens costs
 * nothing.  One parser serves the file reader and the fuzzer.
 *
 * Other projects' token files (dp/tokenizer.h) are read here too: nanoGPT's raw uint16
 * arrays (named by the caller: nothing in them says what they are) and llm.c's shards,
 * which dp_tokens_read also recognises by their magic. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core_impl.h"
#include "dp/core.h"
#include "dp/data.h"
#include "dp/tokenizer.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#define TEXT_BIG_ENDIAN 1
#endif

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }
static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i);
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> 8 * i);
}

/* ---- token files: reader ------------------------------------------------------ */


/* The magic is checked before the header's length, on the bytes there are,
 * so that a short file that is no token file at all (a line of text) is
 * called that, not a truncated token file; a cut token file (its bytes a
 * prefix of the magic, or none) stays "truncated". */
static int not_token_file(const char *name, const uint8_t *buf, size_t len) {
    if (len == 0 || memcmp(buf, DP_TOKENS_MAGIC, len < 8 ? len : 8) == 0) return 0;
    char start[128];
    dp__describe_start(start, sizeof start, buf, len);
    return dp_seterr(DP_EFORMAT, "tokens: %s is not a token file (%s, not \"%s\")", name, start,
                     DP_TOKENS_MAGIC);
}

static int tokens_parse(const char *name, const uint8_t *buf, size_t len, struct dp_tokens *t) {
    memset(t, 0, sizeof *t);
    if (!buf) len = 0;
    if (not_token_file(name, buf, len)) return DP_EFORMAT;
    if (len < DP_TOKENS_HEADER_BYTES)
        return dp_seterr(DP_EFORMAT, "tokens: %s: truncated header: %zu bytes, expected %d", name,
                         len, DP_TOKENS_HEADER_BYTES);
    uint32_t version = le32(buf + 8);
    if (version != DP_TOKENS_VERSION)
        return dp_seterr(DP_EFORMAT, "tokens: %s: unsupported version %u (expected %d)", name,
                         version, DP_TOKENS_VERSION);
    uint32_t vocab = le32(buf + 12);
    if (vocab < 2 || vocab > DP_TOKENS_VOCAB_MAX)
        return dp_seterr(DP_EFORMAT, "tokens: %s: vocab %u out of range 2..%d", name, vocab,
                         DP_TOKENS_VOCAB_MAX);
    uint64_t count = le64(buf + 16);
    uint32_t crc = le32(buf + 24), reserved = le32(buf + 28);
    if (count == 0)
        return dp_seterr(DP_EFORMAT, "tokens: %s: count 0 (a token file holds at least one token)",
                         name);
    /* count against the size without computing 2*count (it may overflow):
     * the payload must be exactly 2*count bytes. */
    size_t payload = len - DP_TOKENS_HEADER_BYTES;
    if (count > payload / 2)
        return dp_seterr(DP_EFORMAT,
                         "tokens: %s: truncated: count %llu needs %llu token bytes, file has %zu",
                         name, (unsigned long long)count,
                         count > UINT64_MAX / 2 ? UINT64_MAX : (unsigned long long)(2 * count),
                         payload);
    if (payload != 2 * count)
        return dp_seterr(DP_EFORMAT,
                         "tokens: %s: count %llu does not match the file size: %zu bytes after "
                         "%llu tokens",
                         name, (unsigned long long)count, payload - (size_t)(2 * count),
                         (unsigned long long)count);
    if (reserved != 0)
        return dp_seterr(DP_EFORMAT, "tokens: %s: reserved field 0x%08x, expected 0", name,
                         reserved);
    const uint8_t *p = buf + DP_TOKENS_HEADER_BYTES;
    uint32_t got = dp_crc32(0, p, payload);
    if (got != crc)
        return dp_seterr(DP_EFORMAT,
                         "tokens: %s: crc mismatch: header 0x%08x, tokens 0x%08x (corrupt file)",
                         name, crc, got);
    uint16_t *tok = dp_malloc(payload ? payload : 1);
    if (!tok) return dp_seterr(DP_ENOMEM, "tokens: %s: cannot allocate %zu bytes", name, payload);
    for (uint64_t i = 0; i < count; i++) {
        uint16_t v = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
        if (v >= vocab) {
            dp_free(tok);
            return dp_seterr(DP_EFORMAT, "tokens: %s: token %u at index %llu >= vocab %u", name,
                             v, (unsigned long long)i, vocab);
        }
        tok[i] = v;
    }
    t->tok = tok;
    t->n = (int64_t)count;
    t->vocab = vocab;
    return DP_OK;
}

int dp_tokens_parse(const uint8_t *buf, size_t len, struct dp_tokens *t) {
    return tokens_parse("<memory>", buf, len, t);
}

/* The whole file at path into *buf (dp_malloc'd), *len bytes. */
static int read_file(const char *path, uint8_t **buf, size_t *len) {
    if (!path) return dp_seterr(DP_EINVAL, "tokens: NULL path");
    int fd;
    size_t size;
    int rc = dp__open_regular("tokens", path, &fd, &size);
    if (rc) return rc;
    rc = dp__read_fd(fd, "tokens", path, size, buf, len);
    close(fd);
    return rc;
}

static int llmc_parse(const char *name, const uint8_t *buf, size_t len, int64_t vocab, struct dp_tokens *t);

static int is_llmc(const uint8_t *buf, size_t len) { return len >= 4 && le32(buf) == DP_LLMC_MAGIC; }

int dp_tokens_read(const char *path, struct dp_tokens *t) {
    memset(t, 0, sizeof *t);
    uint8_t *buf;
    size_t len;
    int rc = read_file(path, &buf, &len);
    if (rc) return rc;
    /* llm.c's shards are told apart by their magic (dp/tokenizer.h) */
    rc = is_llmc(buf, len) ? llmc_parse(path, buf, len, 0, t) : tokens_parse(path, buf, len, t);
    dp_free(buf);
    return rc;
}

int dp_tokens_probe(const char *path, char *start, size_t cap) {
    if (start && cap) start[0] = 0;
    if (!path) return dp_seterr(DP_EINVAL, "tokens: NULL path");
    int fd;
    size_t size;
    int rc = dp__open_regular("tokens", path, &fd, &size);
    if (rc) return rc;
    /* 17 bytes: the magic, and enough of anything else to recognise it by
     * (16 shown, the 17th says there is more) */
    uint8_t head[17];
    size_t n = 0;
    while (n < sizeof head) {
        ssize_t r = read(fd, head + n, sizeof head - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            return dp_seterr(DP_EIO, "tokens: %s: read failed: %s", path, strerror(e));
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    if ((n >= 8 && memcmp(head, DP_TOKENS_MAGIC, 8) == 0) || is_llmc(head, n)) return DP_OK;
    char desc[128];
    dp__describe_start(desc, sizeof desc, head, n);
    if (start && cap) snprintf(start, cap, "%s", desc);
    return dp_seterr(DP_EFORMAT, "tokens: %s is not a token file (%s)", path, desc);
}

void dp_tokens_free(struct dp_tokens *t) {
    if (!t) return;
    dp_free(t->tok);
    memset(t, 0, sizeof *t);
}

int dp_tokens_from_bytes(struct dp_tokens *t, const uint8_t *bytes, size_t len) {
    memset(t, 0, sizeof *t);
    uint16_t *tok = dp_malloc(len ? 2 * len : 1);
    if (!tok) return dp_seterr(DP_ENOMEM, "tokens: cannot allocate %zu tokens", len);
    for (size_t i = 0; i < len; i++) tok[i] = bytes[i];
    t->tok = tok;
    t->n = (int64_t)len;
    t->vocab = DP_TOKENS_VOCAB_BYTES;
    return DP_OK;
}

/* ---- token files: writer ------------------------------------------------------- */

int dp_tokens_write(const char *path, const uint16_t *tok, int64_t n, int64_t vocab) {
    if (!path || (!tok && n > 0)) return dp_seterr(DP_EINVAL, "tokens: NULL argument");
    if (vocab < 2 || vocab > DP_TOKENS_VOCAB_MAX)
        return dp_seterr(DP_EINVAL, "tokens: vocab %lld out of range 2..%d", (long long)vocab,
                         DP_TOKENS_VOCAB_MAX);
    if (n < 1) return dp_seterr(DP_EINVAL, "tokens: %s: no tokens to write", path);
    for (int64_t i = 0; i < n; i++)
        if (tok[i] >= vocab)
            return dp_seterr(DP_EINVAL, "tokens: token %u at index %lld >= vocab %lld", tok[i],
                             (long long)i, (long long)vocab);
    /* The atomic writer would report a missing folder as "cannot create
     * <path>.tmp.<pid>.<n>"; name the folder instead. */
    char dir[4096];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir)
        return dp_seterr(DP_EINVAL, "tokens: path too long: %s", path);
    struct stat st;
    const char *d = dirname(dir);
    if (stat(d, &st) != 0 || !S_ISDIR(st.st_mode))
        return dp_seterr(DP_ENOENT, "tokens: cannot write %s: folder %s does not exist", path, d);

    size_t bytes = 2 * (size_t)n;
    const uint8_t *payload = (const uint8_t *)tok;
#ifdef TEXT_BIG_ENDIAN
    uint8_t *le = dp_malloc(bytes);
    if (!le) return dp_seterr(DP_ENOMEM, "tokens: cannot allocate %zu bytes", bytes);
    for (int64_t i = 0; i < n; i++) le[2 * i] = (uint8_t)tok[i], le[2 * i + 1] = (uint8_t)(tok[i] >> 8);
    payload = le;
#endif
    uint8_t h[DP_TOKENS_HEADER_BYTES] = {0};
    memcpy(h, DP_TOKENS_MAGIC, 8);
    put32(h + 8, DP_TOKENS_VERSION);
    put32(h + 12, (uint32_t)vocab);
    put64(h + 16, (uint64_t)n);
    put32(h + 24, dp_crc32(0, payload, bytes));
    /* h + 28: reserved, 0 */
    struct dp__wpart parts[2] = {{h, sizeof h}, {payload, bytes}};
    int rc = dp__write_file_atomic(path, parts, 2, "tokens");
#ifdef TEXT_BIG_ENDIAN
    dp_free(le);
#endif
    return rc;
}

/* ---- other projects' token files (dp/tokenizer.h) ---------------------------------- */

static int vocab_arg(int64_t vocab, int zero_ok) {
    if ((vocab == 0 && zero_ok) || (vocab >= 2 && vocab <= DP_TOKENS_VOCAB_MAX)) return DP_OK;
    return dp_seterr(DP_EINVAL, "tokens: vocab %lld out of range 2..%d%s", (long long)vocab, DP_TOKENS_VOCAB_MAX,
                     zero_ok ? " (or 0: the largest token + 1)" : "");
}

/* t = the count little-endian uint16 tokens at p, each below vocab (vocab 0: any, and
 * then t->vocab = the largest + 1, at least 2).  The caller has checked the size. */
static int take_u16(const char *name, const uint8_t *p, uint64_t count, int64_t vocab, struct dp_tokens *t) {
    uint16_t *tok = dp_malloc(count ? 2 * count : 1);
    if (!tok) return dp_seterr(DP_ENOMEM, "tokens: %s: cannot allocate %llu tokens", name, (unsigned long long)count);
    uint32_t max = 0;
    for (uint64_t i = 0; i < count; i++) {
        uint16_t v = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
        if (vocab && v >= vocab) {
            dp_free(tok);
            return dp_seterr(DP_EFORMAT, "tokens: %s: token %u at index %llu >= vocab %lld", name, v,
                             (unsigned long long)i, (long long)vocab);
        }
        if (v > max) max = v;
        tok[i] = v;
    }
    t->tok = tok;
    t->n = (int64_t)count;
    t->vocab = vocab ? vocab : max + 1 < 2 ? 2 : max + 1;
    return DP_OK;
}

/* nanoGPT's raw arrays: nothing to check but the size and the tokens. */
static int raw_parse(const char *name, const uint8_t *buf, size_t len, int64_t vocab, struct dp_tokens *t) {
    memset(t, 0, sizeof *t);
    if (!buf) len = 0;
    int rc = vocab_arg(vocab, 0);
    if (rc) return rc;
    if (len == 0) return dp_seterr(DP_EFORMAT, "tokens: %s: empty (raw uint16 tokens: at least one)", name);
    if (len % 2)
        return dp_seterr(DP_EFORMAT, "tokens: %s: %zu bytes, an odd count: raw uint16 tokens take 2 bytes each",
                         name, len);
    return take_u16(name, buf, len / 2, vocab, t);
}

int dp_tokens_parse_raw_u16(const uint8_t *buf, size_t len, int64_t vocab, struct dp_tokens *t) {
    return raw_parse("<memory>", buf, len, vocab, t);
}

/* The readers of other projects' files: the vocabulary checked (0 allowed when the format
 * can derive it), the file read whole, then parsed under its own name. */
typedef int (*parse_fn)(const char *name, const uint8_t *buf, size_t len, int64_t vocab, struct dp_tokens *t);
static int read_with(parse_fn parse, int vocab_zero_ok, const char *path, int64_t vocab, struct dp_tokens *t) {
    memset(t, 0, sizeof *t);
    int rc = vocab_arg(vocab, vocab_zero_ok);
    if (rc) return rc;
    uint8_t *buf;
    size_t len;
    if ((rc = read_file(path, &buf, &len))) return rc;
    rc = parse(path, buf, len, vocab, t);
    dp_free(buf);
    return rc;
}

int dp_tokens_read_raw_u16(const char *path, int64_t vocab, struct dp_tokens *t) {
    return read_with(raw_parse, 0, path, vocab, t);
}

/* llm.c's shards: 256 int32 of header (magic, version, count, unused), count uint16. */
static int llmc_parse(const char *name, const uint8_t *buf, size_t len, int64_t vocab, struct dp_tokens *t) {
    memset(t, 0, sizeof *t);
    if (!buf) len = 0;
    int rc = vocab_arg(vocab, 1);
    if (rc) return rc;
    if (!is_llmc(buf, len)) {
        char start[128];
        dp__describe_start(start, sizeof start, buf, len);
        return dp_seterr(DP_EFORMAT, "tokens: %s is not an llm.c token shard (%s, not the magic %d)", name, start,
                         DP_LLMC_MAGIC);
    }
    if (len < DP_LLMC_HEADER_BYTES)
        return dp_seterr(DP_EFORMAT, "tokens: %s: truncated llm.c header: %zu bytes, expected %d", name, len,
                         DP_LLMC_HEADER_BYTES);
    int32_t version = (int32_t)le32(buf + 4), count = (int32_t)le32(buf + 8);
    if (version != DP_LLMC_VERSION)
        return dp_seterr(DP_EFORMAT, "tokens: %s: unsupported llm.c version %d (expected %d)", name, version,
                         DP_LLMC_VERSION);
    if (count < 1)
        return dp_seterr(DP_EFORMAT, "tokens: %s: llm.c token count %d (a shard holds at least one token)", name,
                         count);
    size_t payload = len - DP_LLMC_HEADER_BYTES, need = 2 * (size_t)count;
    if (payload < need)
        return dp_seterr(DP_EFORMAT, "tokens: %s: truncated: llm.c count %d needs %zu token bytes, file has %zu",
                         name, count, need, payload);
    if (payload > need)
        return dp_seterr(DP_EFORMAT,
                         "tokens: %s: llm.c count %d does not match the file size: %zu bytes after %d tokens",
                         name, count, payload - need, count);
    return take_u16(name, buf + DP_LLMC_HEADER_BYTES, (uint64_t)count, vocab, t);
}

int dp_tokens_parse_llmc(const uint8_t *buf, size_t len, int64_t vocab, struct dp_tokens *t) {
    return llmc_parse("<memory>", buf, len, vocab, t);
}

int dp_tokens_read_llmc(const char *path, int64_t vocab, struct dp_tokens *t) {
    return read_with(llmc_parse, 1, path, vocab, t);
}
