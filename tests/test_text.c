/* Text data: token files (round trip, every header field, truncation, bad
 * tokens; other projects' files: nanoGPT's raw uint16, llm.c's shards), the corpus (folders, name order, the default fortunes corpus),
 * the validation split and the training / validation windows. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dp/core.h"
#include "dp/data.h"
#include "dp/tokenizer.h"
#include "test.h"

/* ---- helpers ------------------------------------------------------------------ */


/* Reads a whole file into buf (cap bytes); returns its length. */
static size_t read_raw(const char *path, uint8_t *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    ASSERT_TRUE(f != NULL);
    size_t n = fread(buf, 1, cap, f);
    ASSERT_EQ(fclose(f), 0);
    return n;
}

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i);
}
static void wr64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> 8 * i);
}

/* tok[i] = (i * 37 + 11) % vocab */
static void fill_tokens(uint16_t *tok, int64_t n, int64_t vocab) {
    for (int64_t i = 0; i < n; i++) tok[i] = (uint16_t)((i * 37 + 11) % vocab);
}

/* ---- token files ------------------------------------------------------------- */

TEST(text_tokens_round_trip) {
    enum { N = 1000 };
    static uint16_t tok[N];
    fill_tokens(tok, N, 300);
    char p[512];
    ASSERT_OK(dp_tokens_write(dp_test_path(p, "t.bin"), tok, N, 300));
    /* The layout on disk, byte by byte. */
    static uint8_t raw[DP_TOKENS_HEADER_BYTES + 2 * N + 16];
    size_t len = read_raw(p, raw, sizeof raw);
    ASSERT_EQ(len, DP_TOKENS_HEADER_BYTES + 2 * N);
    ASSERT_TRUE(memcmp(raw, "DPTOKENS", 8) == 0);
    ASSERT_EQ(rd32(raw + 8), 1);
    ASSERT_EQ(rd32(raw + 12), 300);
    ASSERT_EQ(rd32(raw + 16), N);
    ASSERT_EQ(rd32(raw + 20), 0);
    ASSERT_EQ(rd32(raw + 24), dp_crc32(0, raw + 32, 2 * N));
    ASSERT_EQ(rd32(raw + 28), 0);
    ASSERT_EQ(raw[32 + 2 * 7], tok[7] & 255); /* little-endian */
    ASSERT_EQ(raw[33 + 2 * 7], tok[7] >> 8);

    struct dp_tokens t;
    ASSERT_OK(dp_tokens_read(p, &t));
    ASSERT_EQ(t.n, N);
    ASSERT_EQ(t.vocab, 300);
    for (int i = 0; i < N; i++) ASSERT_EQ(t.tok[i], tok[i]);
    dp_tokens_free(&t);
    ASSERT_TRUE(t.tok == NULL && t.n == 0);
    dp_tokens_free(NULL);

    /* The largest vocabulary keeps token 65535; byte-level tokens. */
    uint16_t big[3] = {0, 65535, 1234};
    ASSERT_OK(dp_tokens_write(p, big, 3, 65536));
    ASSERT_OK(dp_tokens_read(p, &t));
    ASSERT_EQ(t.vocab, 65536);
    ASSERT_EQ(t.tok[1], 65535);
    dp_tokens_free(&t);
    const uint8_t text[] = "hi\xff";
    ASSERT_OK(dp_tokens_from_bytes(&t, text, 3));
    ASSERT_EQ(t.vocab, 256);
    ASSERT_EQ(t.n, 3);
    ASSERT_EQ(t.tok[0], 'h');
    ASSERT_EQ(t.tok[2], 255);
    ASSERT_OK(dp_tokens_write(p, t.tok, t.n, t.vocab));
    dp_tokens_free(&t);
    ASSERT_OK(dp_tokens_read(p, &t));
    ASSERT_EQ(t.tok[2], 255);
    dp_tokens_free(&t);
}

/* Each header field corrupted in turn: DP_EFORMAT naming that field. */
TEST(text_tokens_header_fields_rejected) {
    enum { N = 64 };
    uint16_t tok[N];
    fill_tokens(tok, N, 300);
    char p[512], q[512];
    ASSERT_OK(dp_tokens_write(dp_test_path(p, "good.bin"), tok, N, 300));
    uint8_t good[DP_TOKENS_HEADER_BYTES + 2 * N + 8], b[sizeof good + 8];
    size_t len = read_raw(p, good, sizeof good);
    ASSERT_EQ(len, sizeof good - 8);
    dp_test_path(q, "bad.bin");
    struct dp_tokens t;
#define CASE(edit, needle)                                          \
    do {                                                            \
        size_t n_ = len;                                            \
        memcpy(b, good, len);                                       \
        edit;                                                       \
        dp_test_write_file(q, b, n_);                                        \
        ASSERT_ERR(dp_tokens_read(q, &t), DP_EFORMAT, needle);      \
        ASSERT_TRUE(t.tok == NULL && t.n == 0);                     \
        ASSERT_TRUE(strstr(dp_errmsg(), q) != NULL);                \
        ASSERT_ERR(dp_tokens_parse(b, n_, &t), DP_EFORMAT, needle); \
    } while (0)
    CASE(b[0] = 'X', "is not a token file (it starts with \"XPTOKENS\\x01\\x00");
    CASE(b[7] = 0, "is not a token file");
    CASE(wr32(b + 8, 2), "unsupported version 2");
    CASE(wr32(b + 8, 0), "unsupported version 0");
    CASE(wr32(b + 12, 1), "vocab 1 out of range");
    CASE(wr32(b + 12, 0), "vocab 0 out of range");
    CASE(wr32(b + 12, 65537), "vocab 65537 out of range");
    CASE(wr64(b + 16, 0), "count 0");
    CASE(wr64(b + 16, N + 1), "truncated: count 65");
    CASE(wr64(b + 16, UINT64_MAX), "truncated: count");
    CASE(wr64(b + 16, N - 1), "count 63 does not match the file size");
    CASE(b[n_++] = 0; b[n_++] = 0, "count 64 does not match the file size"); /* a token too many */
    CASE(b[24] ^= 1, "crc mismatch");
    CASE(b[28] = 1, "reserved field");
    CASE(b[40] ^= 0x10, "crc mismatch"); /* a token byte: the checksum catches it */
    /* A token >= vocab with a correct checksum: the token check catches it. */
    CASE(b[32 + 2 * 5] = 44; b[33 + 2 * 5] = 1; wr32(b + 24, dp_crc32(0, b + 32, 2 * N)),
         "token 300 at index 5 >= vocab 300");
    /* A smaller vocabulary than the tokens use. */
    CASE(wr32(b + 12, 2), ">= vocab 2");
#undef CASE
    /* The good file still reads. */
    ASSERT_OK(dp_tokens_read(p, &t));
    dp_tokens_free(&t);
}

TEST(text_tokens_truncated) {
    enum { N = 20 };
    uint16_t tok[N];
    fill_tokens(tok, N, 256);
    char p[512], q[512];
    ASSERT_OK(dp_tokens_write(dp_test_path(p, "t.bin"), tok, N, 256));
    uint8_t raw[DP_TOKENS_HEADER_BYTES + 2 * N];
    size_t len = read_raw(p, raw, sizeof raw);
    ASSERT_EQ(len, sizeof raw);
    struct dp_tokens t;
    for (size_t cut = 0; cut < len; cut++) {
        dp_test_write_file(dp_test_path(q, "cut.bin"), raw, cut);
        ASSERT_ERR(dp_tokens_read(q, &t), DP_EFORMAT, "truncated");
        ASSERT_TRUE(t.tok == NULL);
        ASSERT_ERR(dp_tokens_parse(raw, cut, &t), DP_EFORMAT, "truncated");
    }
    ASSERT_ERR(dp_tokens_parse(NULL, 100, &t), DP_EFORMAT, "truncated header");
}

/* What a user passes where a token file belongs (a line of text, a long
 * text, an empty file): "not a token file", with its first bytes, from the
 * reader (also for a file shorter than a header) and from dp_tokens_probe,
 * which reads no more than those bytes. */
TEST(text_tokens_not_a_token_file) {
    char p[512], start[128];
    struct dp_tokens t;
    dp_test_write_file(dp_test_path(p, "line.txt"), "hello\n", 6);
    ASSERT_ERR(dp_tokens_read(p, &t), DP_EFORMAT, "line.txt is not a token file (it starts with \"hello\\n\"");
    ASSERT_ERR(dp_tokens_probe(p, start, sizeof start), DP_EFORMAT, "line.txt is not a token file");
    ASSERT_TRUE(strcmp(start, "it starts with \"hello\\n\"") == 0);
    dp_test_write_file(p, "It was a dark and stormy night", 30);
    ASSERT_ERR(dp_tokens_probe(p, start, sizeof start), DP_EFORMAT, "not a token file");
    ASSERT_TRUE(strcmp(start, "it starts with \"It was a dark an...\"") == 0);
    dp_test_write_file(p, "", 0);
    ASSERT_ERR(dp_tokens_probe(p, start, sizeof start), DP_EFORMAT, "not a token file");
    ASSERT_TRUE(strcmp(start, "it is empty") == 0);
    ASSERT_ERR(dp_tokens_read(p, &t), DP_EFORMAT, "truncated header: 0 bytes"); /* a cut token file */
    uint16_t tok[4] = {1, 2, 3, 4};
    ASSERT_OK(dp_tokens_write(dp_test_path(p, "t.bin"), tok, 4, 256));
    ASSERT_OK(dp_tokens_probe(p, start, sizeof start));
    ASSERT_TRUE(start[0] == 0);
    ASSERT_ERR(dp_tokens_probe(dp_test_path(p, "missing.bin"), NULL, 0), DP_ENOENT, "no such file");
    ASSERT_ERR(dp_tokens_probe(dp_test_tmpdir(), NULL, 0), DP_EIO, "not a regular file");
}

TEST(text_tokens_io_errors) {
    char p[512];
    struct dp_tokens t;
    ASSERT_ERR(dp_tokens_read(dp_test_path(p, "missing.bin"), &t), DP_ENOENT, "no such file");
    ASSERT_ERR(dp_tokens_read(dp_test_tmpdir(), &t), DP_EIO, "not a regular file");
    uint16_t tok[4] = {1, 2, 3, 4};
    ASSERT_ERR(dp_tokens_write(dp_test_path(p, "nodir/t.bin"), tok, 4, 256), DP_ENOENT, "does not exist");
    ASSERT_ERR(dp_tokens_write(dp_test_path(p, "t.bin"), tok, 4, 4), DP_EINVAL, "token 4 at index 3");
    ASSERT_ERR(dp_tokens_write(p, tok, 4, 1), DP_EINVAL, "vocab 1");
    ASSERT_ERR(dp_tokens_write(p, tok, 4, 65537), DP_EINVAL, "vocab 65537");
    ASSERT_ERR(dp_tokens_write(p, tok, 0, 256), DP_EINVAL, "no tokens");
    ASSERT_TRUE(access(p, F_OK) != 0); /* nothing written by a refused call */
    /* A failed write keeps the old file. */
    ASSERT_OK(dp_tokens_write(p, tok, 4, 256));
    ASSERT_ERR(dp_tokens_write(p, tok, 4, 3), DP_EINVAL, "vocab 3");
    ASSERT_OK(dp_tokens_read(p, &t));
    ASSERT_EQ(t.n, 4);
    dp_tokens_free(&t);
}

/* ---- corpus --------------------------------------------------------------------- */

TEST(text_corpus_folder_in_name_order) {
    char d[512], p[512], sub[512];
    dp_test_path(d, "corpus");
    ASSERT_EQ(mkdir(d, 0755), 0);
    dp_test_write_file(dp_test_path(p, "corpus/b"), "BB", 2);
    dp_test_write_file(dp_test_path(p, "corpus/a"), "A", 1);
    dp_test_write_file(dp_test_path(p, "corpus/B"), "upper", 5); /* 'B' < 'a' in strcmp order */
    dp_test_write_file(dp_test_path(p, "corpus/c.dat"), "cc", 2); /* .dat is dropped only from the default corpus */
    ASSERT_EQ(mkdir(dp_test_path(sub, "corpus/sub"), 0755), 0);
    dp_test_write_file(dp_test_path(p, "corpus/sub/x"), "nested", 6);
    ASSERT_EQ(symlink("a", dp_test_path(p, "corpus/link")), 0); /* links inside a folder are skipped */

    struct dp_text_corpus c;
    const char *in1[] = {d};
    ASSERT_OK(dp_text_corpus_load(&c, in1, 1));
    ASSERT_EQ(c.nfiles, 4);
    ASSERT_EQ(c.len, 10);
    ASSERT_TRUE(memcmp(c.bytes, "upperABBcc", 10) == 0);
    dp_text_corpus_free(&c);
    dp_text_corpus_free(NULL);

    /* Files in the order given, a link named explicitly is followed, and a
     * folder expands where it stands. */
    char a[512], l[512];
    dp_test_path(a, "corpus/a");
    dp_test_path(l, "corpus/link");
    const char *in2[] = {l, sub, a};
    ASSERT_OK(dp_text_corpus_load(&c, in2, 3));
    ASSERT_EQ(c.nfiles, 3);
    ASSERT_EQ(c.len, 8);
    ASSERT_TRUE(memcmp(c.bytes, "AnestedA", 8) == 0);
    dp_text_corpus_free(&c);

    /* Bad inputs. */
    char e[512], z[512];
    dp_test_path(e, "empty");
    ASSERT_EQ(mkdir(e, 0755), 0);
    const char *in3[] = {e};
    ASSERT_ERR(dp_text_corpus_load(&c, in3, 1), DP_EINVAL, "no regular files in");
    ASSERT_TRUE(c.bytes == NULL && c.len == 0);
    dp_test_write_file(dp_test_path(z, "zero.txt"), "", 0);
    const char *in4[] = {z};
    ASSERT_ERR(dp_text_corpus_load(&c, in4, 1), DP_EINVAL, "empty input: 1 file, 0 bytes");
    const char *in5[] = {a, "/nonexistent/x.txt"};
    ASSERT_ERR(dp_text_corpus_load(&c, in5, 2), DP_ENOENT, "/nonexistent/x.txt: no such file");
    ASSERT_TRUE(c.bytes == NULL);
}

/* ---- preparing a folder on first use --------------------------------------------- */

static void set_mtime(const char *path, time_t sec) {
    struct timespec ts[2] = {{sec, 0}, {sec, 0}};
    ASSERT_EQ(utimensat(AT_FDCWD, path, ts, 0), 0);
}
static struct timespec mtime_of(const char *path) {
    struct stat st;
    ASSERT_EQ(stat(path, &st), 0);
    return st.st_mtim;
}
static int same_time(struct timespec a, struct timespec b) {
    return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}
/* The tokens of path as bytes into buf; returns the count. */
static int64_t token_bytes(const char *path, char *buf, int64_t cap) {
    struct dp_tokens t;
    ASSERT_OK(dp_tokens_read(path, &t));
    ASSERT_EQ(t.vocab, 256);
    ASSERT_TRUE(t.n <= cap);
    for (int64_t i = 0; i < t.n; i++) buf[i] = (char)t.tok[i];
    int64_t n = t.n;
    dp_tokens_free(&t);
    return n;
}

/* dp_text_prepare_dir_in: the first use writes the folder's token file into
 * the cache (not into the folder) from the text files in name order (not
 * tokens.bin, nor a writer's temporary, nor *.dat / *.u8); the next use
 * reuses it untouched; a source newer than it, a removed source and a
 * corrupt token file each rebuild it, and the cache keeps one file per
 * folder. */
TEST(text_prepare_dir_first_use_then_reuse) {
    char d[512], p[512], tok[512], cache[512], buf[64];
    dp_test_path(d, "prep");
    dp_test_path(cache, "cache/a/b"); /* made as mkdir -p would */
    ASSERT_EQ(mkdir(d, 0755), 0);
    dp_test_write_file(dp_test_path(p, "prep/b.txt"), "world", 5);
    set_mtime(p, 1000000000);
    dp_test_write_file(dp_test_path(p, "prep/a.txt"), "hello ", 6);
    set_mtime(p, 1000000000);
    dp_test_write_file(dp_test_path(p, "prep/a.dat"), "index", 5);
    dp_test_write_file(dp_test_path(p, "prep/a.u8"), "alias", 5);
    dp_test_write_file(dp_test_path(p, "prep/tokens.bin.tmp.99.0"), "stale", 5);

    struct dp_text_prepared info;
    ASSERT_OK(dp_text_prepare_dir_in(d, cache, tok, sizeof tok, &info));
    /* CACHE/prep-<16 hex>-<16 hex>.tokens */
    ASSERT_TRUE(strncmp(tok, cache, strlen(cache)) == 0);
    ASSERT_TRUE(strncmp(tok + strlen(cache), "/prep-", 6) == 0);
    ASSERT_EQ(strlen(tok + strlen(cache)), strlen("/prep-") + 16 + 1 + 16 + strlen(".tokens"));
    ASSERT_EQ(info.built, 1);
    ASSERT_EQ(info.in_dir, 0);
    ASSERT_EQ(info.nfiles, 2);
    ASSERT_EQ(info.tokens, 11);
    ASSERT_TRUE(strstr(info.why, "in the cache yet") != NULL);
    ASSERT_EQ(token_bytes(tok, buf, sizeof buf), 11);
    ASSERT_TRUE(memcmp(buf, "hello world", 11) == 0);
    ASSERT_EQ(dp_test_files_in(d), 5); /* nothing written into the folder */
    ASSERT_EQ(dp_test_files_in(cache), 1);

    /* reused: not written again (same mtime), the same count and file */
    char first[512];
    snprintf(first, sizeof first, "%s", tok);
    struct timespec t0 = mtime_of(tok);
    ASSERT_OK(dp_text_prepare_dir_in(d, cache, tok, sizeof tok, &info));
    ASSERT_EQ(info.built, 0);
    ASSERT_EQ(info.tokens, 11);
    ASSERT_EQ(info.nfiles, 2);
    ASSERT_TRUE(strcmp(tok, first) == 0);
    ASSERT_TRUE(same_time(t0, mtime_of(tok)));

    /* a source newer than the token file: rebuilt with the new text, under
     * a new name (its mtime is part of it), the old file removed */
    dp_test_write_file(dp_test_path(p, "prep/b.txt"), "there", 5);
    set_mtime(p, t0.tv_sec + 10);
    ASSERT_OK(dp_text_prepare_dir_in(d, cache, tok, sizeof tok, &info));
    ASSERT_EQ(info.built, 1);
    ASSERT_TRUE(strstr(info.why, "b.txt is newer than the cached token file") != NULL);
    ASSERT_TRUE(strcmp(tok, first) != 0);
    ASSERT_TRUE(access(first, F_OK) != 0);
    ASSERT_EQ(dp_test_files_in(cache), 1);
    ASSERT_EQ(token_bytes(tok, buf, sizeof buf), 11);
    ASSERT_TRUE(memcmp(buf, "hello there", 11) == 0);
    /* the token file is now newer than both sources (its own mtime is now,
     * b.txt's t0 + 10 s): make sure, then check it is reused */
    set_mtime(tok, t0.tv_sec + 20);
    ASSERT_OK(dp_text_prepare_dir_in(d, cache, tok, sizeof tok, &info));
    ASSERT_EQ(info.built, 0);

    /* a removed source changes no remaining mtime: the count tells */
    ASSERT_EQ(unlink(dp_test_path(p, "prep/a.txt")), 0);
    ASSERT_OK(dp_text_prepare_dir_in(d, cache, tok, sizeof tok, &info));
    ASSERT_EQ(info.built, 1);
    ASSERT_TRUE(strstr(info.why, "holds 11 tokens, the sources 5 bytes") != NULL);
    ASSERT_EQ(token_bytes(tok, buf, sizeof buf), 5);
    ASSERT_TRUE(memcmp(buf, "there", 5) == 0);

    /* a source replaced by one of the same size and an older mtime (as cp -p
     * leaves it): the validity checks alone would reuse the old tokens, the
     * name keyed by the sources' sizes and mtimes does not */
    set_mtime(tok, t0.tv_sec + 30);
    dp_test_write_file(dp_test_path(p, "prep/b.txt"), "THERE", 5);
    set_mtime(p, t0.tv_sec + 5);
    ASSERT_OK(dp_text_prepare_dir_in(d, cache, tok, sizeof tok, &info));
    ASSERT_EQ(info.built, 1);
    ASSERT_TRUE(strstr(info.why, "renamed or replaced") != NULL);
    ASSERT_EQ(token_bytes(tok, buf, sizeof buf), 5);
    ASSERT_TRUE(memcmp(buf, "THERE", 5) == 0);

    /* a corrupt token file, newer than the sources: rebuilt */
    dp_test_write_file(tok, "DPTOKENS", 8);
    set_mtime(tok, t0.tv_sec + 30);
    ASSERT_OK(dp_text_prepare_dir_in(d, cache, tok, sizeof tok, NULL));
    ASSERT_EQ(token_bytes(tok, buf, sizeof buf), 5);
    ASSERT_EQ(dp_test_files_in(cache), 1);
    ASSERT_EQ(dp_test_files_in(d), 4);

    /* refusals: no text files (only what does not count), not a folder, no
     * such folder */
    char e[512];
    dp_test_path(e, "prep_empty");
    ASSERT_EQ(mkdir(e, 0755), 0);
    dp_test_write_file(dp_test_path(p, "prep_empty/x.dat"), "x", 1);
    dp_test_write_file(dp_test_path(p, "prep_empty/tokens.bin"), "x", 1);
    ASSERT_ERR(dp_text_prepare_dir_in(e, cache, tok, sizeof tok, &info), DP_EINVAL, "no text files in");
    ASSERT_ERR(dp_text_prepare_dir_in(dp_test_path(p, "prep/b.txt"), cache, tok, sizeof tok, &info), DP_EINVAL,
               "is not a folder");
    ASSERT_ERR(dp_text_prepare_dir_in(dp_test_path(p, "nope"), cache, tok, sizeof tok, &info), DP_ENOENT,
               "nope: no such file or folder");
}

/* The cache folder: $XDG_CACHE_HOME/dptrain (made with its parents), else
 * $HOME/.cache/dptrain (a relative XDG_CACHE_HOME is ignored, as the XDG
 * rule says); dp_text_prepare_dir writes there and not into the folder. */
TEST(text_prepare_dir_default_cache_folder) {
    char d[512], p[512], tok[512], want[512], home[512];
    dp_test_path(d, "src");
    ASSERT_EQ(mkdir(d, 0755), 0);
    dp_test_write_file(dp_test_path(p, "src/a.txt"), "some text", 9);
    set_mtime(p, 1000000000);

    ASSERT_EQ(setenv("XDG_CACHE_HOME", dp_test_path(p, "xdg/deeper"), 1), 0);
    ASSERT_OK(dp_text_cache_dir(tok, sizeof tok));
    ASSERT_TRUE(strcmp(tok, dp_test_path(want, "xdg/deeper/dptrain")) == 0);
    struct dp_text_prepared info;
    ASSERT_OK(dp_text_prepare_dir(d, tok, sizeof tok, &info));
    ASSERT_EQ(info.built, 1);
    ASSERT_TRUE(strncmp(tok, want, strlen(want)) == 0);
    struct stat st;
    ASSERT_EQ(stat(want, &st), 0);
    ASSERT_EQ(st.st_mode & 0777, 0700); /* the XDG rule for a folder it makes */
    ASSERT_EQ(dp_test_files_in(d), 1);

    ASSERT_EQ(setenv("XDG_CACHE_HOME", "relative/cache", 1), 0);
    ASSERT_EQ(setenv("HOME", dp_test_path(home, "home"), 1), 0);
    ASSERT_OK(dp_text_cache_dir(tok, sizeof tok));
    ASSERT_TRUE(strcmp(tok, dp_test_path(want, "home/.cache/dptrain")) == 0);
    ASSERT_EQ(unsetenv("XDG_CACHE_HOME"), 0);
    ASSERT_OK(dp_text_prepare_dir(d, tok, sizeof tok, &info));
    ASSERT_EQ(info.built, 1);
    ASSERT_TRUE(strncmp(tok, want, strlen(want)) == 0);
    ASSERT_EQ(dp_test_files_in(d), 1);

    ASSERT_EQ(unsetenv("HOME"), 0);
    ASSERT_ERR(dp_text_cache_dir(tok, sizeof tok), DP_ENOENT, "neither XDG_CACHE_HOME nor HOME");
}

/* DIR/tokens.bin as older versions wrote it: reused while valid, and read
 * only (the cache gets nothing); once stale it is left as it is and the
 * cache gets the new file.  Where the cache cannot be made, the token file
 * goes into the folder (and is reused from there); where neither can be
 * written, one error names both places. */
TEST(text_prepare_dir_old_tokens_bin_and_no_cache) {
    char d[512], p[512], tok[512], cache[512], legacy[512], buf[64];
    dp_test_path(d, "old");
    dp_test_path(cache, "cache");
    ASSERT_EQ(mkdir(d, 0755), 0);
    dp_test_write_file(dp_test_path(p, "old/a.txt"), "abc", 3);
    set_mtime(p, 1000000000);
    const char *in[] = {p};
    ASSERT_OK(dp_text_prepare(in, 1, dp_test_path(legacy, "old/tokens.bin"), NULL));
    struct timespec t0 = mtime_of(legacy);

    struct dp_text_prepared info;
    ASSERT_OK(dp_text_prepare_dir_in(d, cache, tok, sizeof tok, &info));
    ASSERT_EQ(info.built, 0);
    ASSERT_EQ(info.in_dir, 1);
    ASSERT_TRUE(strcmp(tok, legacy) == 0);
    ASSERT_TRUE(same_time(t0, mtime_of(legacy)));
    ASSERT_TRUE(access(cache, F_OK) != 0); /* nothing made in the cache */

    /* stale: built into the cache, tokens.bin left as it was */
    dp_test_write_file(p, "abcd", 4);
    set_mtime(p, t0.tv_sec + 10);
    ASSERT_OK(dp_text_prepare_dir_in(d, cache, tok, sizeof tok, &info));
    ASSERT_EQ(info.built, 1);
    ASSERT_EQ(info.in_dir, 0);
    ASSERT_TRUE(strstr(info.why, "a.txt is newer than tokens.bin") != NULL);
    ASSERT_TRUE(strncmp(tok, cache, strlen(cache)) == 0);
    ASSERT_EQ(token_bytes(tok, buf, sizeof buf), 4);
    ASSERT_TRUE(same_time(t0, mtime_of(legacy)));
    ASSERT_EQ(token_bytes(legacy, buf, sizeof buf), 3);
    ASSERT_EQ(unlink(legacy), 0);

    /* a cache that cannot be made (under a file): into the folder, and
     * the reason kept for the report; reused from there next time */
    char nocache[512];
    dp_test_path(nocache, "old/a.txt/cache");
    ASSERT_OK(dp_text_prepare_dir_in(d, nocache, tok, sizeof tok, &info));
    ASSERT_EQ(info.built, 1);
    ASSERT_EQ(info.in_dir, 1);
    ASSERT_TRUE(strcmp(tok, legacy) == 0);
    ASSERT_TRUE(strstr(info.cache_error, "cannot create") != NULL);
    ASSERT_TRUE(strstr(info.cache_error, nocache) != NULL);
    set_mtime(legacy, t0.tv_sec + 20); /* newer than a.txt's t0 + 10 */
    ASSERT_OK(dp_text_prepare_dir_in(d, nocache, tok, sizeof tok, &info));
    ASSERT_EQ(info.built, 0);
    ASSERT_EQ(info.in_dir, 1);

    /* neither place writable (tokens.bin a folder: refused even to root,
     * which a read-only mode is not) */
    ASSERT_EQ(unlink(legacy), 0);
    ASSERT_EQ(mkdir(legacy, 0755), 0);
    dp_test_write_file(dp_test_path(p, "old/tokens.bin/x"), "x", 1);
    ASSERT_ERR(dp_text_prepare_dir_in(d, nocache, tok, sizeof tok, &info), DP_EIO,
               "neither in the cache (cannot create");
    ASSERT_TRUE(strstr(dp_errmsg(), nocache) != NULL);
    ASSERT_TRUE(strstr(dp_errmsg(), legacy) != NULL);
}

/* dp_text_prepare, the core of prepare-text: inputs -> token file. */
TEST(text_prepare_inputs_to_token_file) {
    char a[512], out[512], buf[16];
    dp_test_write_file(dp_test_path(a, "in.txt"), "abc", 3);
    const char *in[] = {a, a};
    struct dp_text_prepared info;
    ASSERT_OK(dp_text_prepare(in, 2, dp_test_path(out, "in.bin"), &info));
    ASSERT_EQ(info.built, 1);
    ASSERT_EQ(info.nfiles, 2);
    ASSERT_EQ(info.tokens, 6);
    ASSERT_EQ(token_bytes(out, buf, sizeof buf), 6);
    ASSERT_TRUE(memcmp(buf, "abcabc", 6) == 0);
    ASSERT_ERR(dp_text_prepare(in, 2, "/nonexistent/dir/x.bin", &info), DP_ENOENT, "does not exist");
}

/* The default corpus: the plain-text files of Debian's fortunes +
 * fortunes-min (1:1.99.1-7.3): 43 files, 2,576,674 bytes as issue 10 states,
 * starting with "art" and ending with "zippy" (name order). */
TEST(text_default_corpus) {
    struct stat st;
    if (stat(DP_TEXT_DEFAULT_CORPUS, &st) != 0)
        SKIP("%s absent (Debian packages fortunes fortunes-min: scripts/install-deps.sh)",
             DP_TEXT_DEFAULT_CORPUS);
    struct dp_text_corpus c;
    ASSERT_OK(dp_text_corpus_load(&c, NULL, 0));
    ASSERT_EQ(c.nfiles, 43);
    ASSERT_EQ(c.len, 2576674);
    /* First and last file, read here directly. */
    static uint8_t buf[1 << 18];
    size_t n = read_raw(DP_TEXT_DEFAULT_CORPUS "/art", buf, sizeof buf);
    ASSERT_TRUE(n > 0 && n < sizeof buf);
    ASSERT_TRUE(memcmp(c.bytes, buf, n) == 0);
    n = read_raw(DP_TEXT_DEFAULT_CORPUS "/zippy", buf, sizeof buf);
    ASSERT_TRUE(n > 0 && n < sizeof buf);
    ASSERT_TRUE(memcmp(c.bytes + c.len - n, buf, n) == 0);
    /* Byte-level tokens of it, split 95 / 5. */
    struct dp_tokens t;
    ASSERT_OK(dp_tokens_from_bytes(&t, c.bytes, c.len));
    struct dp_text_split s;
    ASSERT_OK(dp_text_split_init(&s, t.n, DP_TEXT_VAL_FRAC));
    ASSERT_EQ(s.val_n, 128833); /* floor(2576674 * 0.05) */
    ASSERT_EQ(s.train_n + s.val_n, 2576674);
    dp_tokens_free(&t);
    dp_text_corpus_free(&c);
}

/* ---- split and windows ----------------------------------------------------------- */

TEST(text_split_sizes) {
    struct dp_text_split s;
    ASSERT_OK(dp_text_split_init(&s, 1000, DP_TEXT_VAL_FRAC));
    ASSERT_EQ(s.train_n, 950);
    ASSERT_EQ(s.val_n, 50);
    ASSERT_OK(dp_text_split_init(&s, 1019, 0.05)); /* floor(50.95) */
    ASSERT_EQ(s.val_n, 50);
    ASSERT_EQ(s.train_n, 969);
    ASSERT_OK(dp_text_split_init(&s, 1000, 0.1));
    ASSERT_EQ(s.val_n, 100);
    ASSERT_OK(dp_text_split_init(&s, 19, 0.05)); /* too small for any validation token */
    ASSERT_EQ(s.val_n, 0);
    ASSERT_EQ(s.train_n, 19);
    ASSERT_OK(dp_text_split_init(&s, 1000, 0));
    ASSERT_EQ(s.val_n, 0);
    ASSERT_ERR(dp_text_split_init(&s, 1000, 1.0), DP_EINVAL, "fraction");
    ASSERT_ERR(dp_text_split_init(&s, 1000, -0.1), DP_EINVAL, "fraction");
    ASSERT_ERR(dp_text_split_init(&s, 1000, NAN), DP_EINVAL, "fraction");
    ASSERT_ERR(dp_text_split_init(&s, 0, 0.05), DP_EINVAL, "split");
    /* Validation windows: (val_n - 1) / ctx. */
    ASSERT_OK(dp_text_split_init(&s, 1000, 0.05));
    ASSERT_EQ(dp_text_val_windows(&s, 7), 7);  /* 49 / 7 */
    ASSERT_EQ(dp_text_val_windows(&s, 49), 1);
    ASSERT_EQ(dp_text_val_windows(&s, 50), 0);
}

/* A window is a pure function of (seed, epoch, index): filling 0..7 at once,
 * as 0..3 + 4..7 (two workers), one by one in reverse order, or in a fresh
 * copy of the tokens gives the same windows. */
TEST(text_windows_pure_and_split_independent) {
    enum { N = 5000, CTX = 16, B = 8 };
    static uint16_t tok[N];
    fill_tokens(tok, N, 251);
    struct dp_tokens t = {.tok = tok, .n = N, .vocab = 251};
    struct dp_text_split s;
    ASSERT_OK(dp_text_split_init(&s, N, DP_TEXT_VAL_FRAC));
    int32_t x1[B * CTX], y1[B * CTX], x2[B * CTX], y2[B * CTX], x3[B * CTX], y3[B * CTX];
    ASSERT_OK(dp_text_fill_train(&t, &s, CTX, 42, 3, 0, B, x1, y1));
    ASSERT_OK(dp_text_fill_train(&t, &s, CTX, 42, 3, 0, B / 2, x2, y2));
    ASSERT_OK(dp_text_fill_train(&t, &s, CTX, 42, 3, B / 2, B / 2, x2 + B / 2 * CTX, y2 + B / 2 * CTX));
    for (int i = B - 1; i >= 0; i--)
        ASSERT_OK(dp_text_fill_train(&t, &s, CTX, 42, 3, i, 1, x3 + i * CTX, y3 + i * CTX));
    ASSERT_TRUE(memcmp(x1, x2, sizeof x1) == 0 && memcmp(y1, y2, sizeof y1) == 0);
    ASSERT_TRUE(memcmp(x1, x3, sizeof x1) == 0 && memcmp(y1, y3, sizeof y1) == 0);
    /* Each window is the ctx + 1 tokens at its start: inputs then targets
     * shifted by one. */
    for (int i = 0; i < B; i++) {
        int64_t st = dp_text_window_start(42, 3, i, CTX, s.train_n);
        ASSERT_TRUE(st >= 0 && st + CTX + 1 <= s.train_n);
        for (int j = 0; j < CTX; j++) {
            ASSERT_EQ(x1[i * CTX + j], tok[st + j]);
            ASSERT_EQ(y1[i * CTX + j], tok[st + j + 1]);
        }
        ASSERT_EQ(st, dp_text_window_start(42, 3, i, CTX, s.train_n)); /* again: same */
    }
    /* The key matters: another seed, epoch or index moves (almost) every window. */
    int same_seed = 0, same_epoch = 0, same_index = 0;
    for (int i = 0; i < 100; i++) {
        int64_t st = dp_text_window_start(42, 3, i, CTX, s.train_n);
        same_seed += st == dp_text_window_start(43, 3, i, CTX, s.train_n);
        same_epoch += st == dp_text_window_start(42, 4, i, CTX, s.train_n);
        same_index += st == dp_text_window_start(42, 3, i + 100, CTX, s.train_n);
    }
    ASSERT_TRUE(same_seed < 5 && same_epoch < 5 && same_index < 5);
    /* Too little text for a window. */
    ASSERT_EQ(dp_text_window_start(1, 0, 0, CTX, CTX), -1);
    struct dp_text_split tiny = {.train_n = CTX, .val_n = 0};
    ASSERT_ERR(dp_text_fill_train(&t, &tiny, CTX, 1, 0, 0, 1, x1, y1), DP_EINVAL, "ctx + 1 = 17");
    ASSERT_ERR(dp_text_fill_train(&t, &s, 0, 1, 0, 0, 1, x1, y1), DP_EINVAL, "ctx 0");
}

/* Training windows never read a validation token, and every possible start
 * is drawn (about uniformly). */
TEST(text_windows_stay_in_training_part) {
    enum { N = 60, CTX = 5, DRAWS = 20000 };
    uint16_t tok[N];
    struct dp_tokens t = {.tok = tok, .n = N, .vocab = 256};
    struct dp_text_split s;
    ASSERT_OK(dp_text_split_init(&s, N, 0.5)); /* train 30, val 30 */
    ASSERT_EQ(s.train_n, 30);
    for (int i = 0; i < N; i++) tok[i] = (uint16_t)(i < s.train_n ? i : 200);
    static int32_t x[DRAWS * CTX], y[DRAWS * CTX];
    ASSERT_OK(dp_text_fill_train(&t, &s, CTX, 7, 0, 0, DRAWS, x, y));
    int64_t nstarts = s.train_n - CTX; /* 25: starts 0..24 */
    int hits[64] = {0};
    for (int i = 0; i < DRAWS; i++) {
        for (int j = 0; j < CTX; j++) ASSERT_TRUE(x[i * CTX + j] < 200 && y[i * CTX + j] < 200);
        int st = x[i * CTX];
        ASSERT_TRUE(st >= 0 && st < nstarts);
        ASSERT_EQ(y[i * CTX + CTX - 1], st + CTX); /* the last target: token start + ctx */
        hits[st]++;
    }
    /* 800 expected per start; a 30% band is > 10 standard deviations. */
    for (int st = 0; st < nstarts; st++) ASSERT_TRUE(hits[st] > 560 && hits[st] < 1040);
}

TEST(text_val_windows_fixed_consecutive) {
    enum { N = 1000, CTX = 7 };
    static uint16_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (uint16_t)(i % 1000);
    struct dp_tokens t = {.tok = tok, .n = N, .vocab = 1000};
    struct dp_text_split s;
    ASSERT_OK(dp_text_split_init(&s, N, DP_TEXT_VAL_FRAC)); /* val = tokens 950..999 */
    int64_t nw = dp_text_val_windows(&s, CTX);
    ASSERT_EQ(nw, 7);
    int32_t x[7 * CTX], y[7 * CTX], x2[7 * CTX], y2[7 * CTX];
    ASSERT_OK(dp_text_fill_val(&t, &s, CTX, 0, nw, x, y));
    /* Inputs 950..998 in order, targets 951..999: every validation token but
     * the first is a target exactly once. */
    for (int k = 0; k < nw * CTX; k++) {
        ASSERT_EQ(x[k], 950 + k);
        ASSERT_EQ(y[k], 951 + k);
    }
    /* Filling in parts gives the same windows. */
    ASSERT_OK(dp_text_fill_val(&t, &s, CTX, 0, 3, x2, y2));
    ASSERT_OK(dp_text_fill_val(&t, &s, CTX, 3, 4, x2 + 3 * CTX, y2 + 3 * CTX));
    ASSERT_TRUE(memcmp(x, x2, sizeof x) == 0 && memcmp(y, y2, sizeof y) == 0);
    ASSERT_ERR(dp_text_fill_val(&t, &s, CTX, 5, 3, x2, y2), DP_EINVAL, "only 7 exist");
    struct dp_text_split over = {.train_n = 990, .val_n = 50};
    ASSERT_ERR(dp_text_fill_val(&t, &over, CTX, 0, 1, x2, y2), DP_EINVAL, "exceeds");
}

/* ---- other projects' token files ------------------------------------------------- */

/* nanoGPT's train.bin: np.array(ids, dtype=np.uint16).tofile(), nothing else. */
TEST(text_tokens_raw_u16_nanogpt) {
    const uint16_t ids[5] = {15496, 11, 995, 0, 50256}; /* GPT-2's "Hello, world" ... <|endoftext|> */
    uint8_t raw[10];
    for (int i = 0; i < 5; i++) raw[2 * i] = (uint8_t)ids[i], raw[2 * i + 1] = (uint8_t)(ids[i] >> 8);
    char p[512];
    dp_test_write_file(dp_test_path(p, "train.bin"), raw, sizeof raw);
    struct dp_tokens t;
    ASSERT_OK(dp_tokens_read_raw_u16(p, 50257, &t));
    ASSERT_EQ(t.n, 5);
    ASSERT_EQ(t.vocab, 50257);
    for (int i = 0; i < 5; i++) ASSERT_EQ(t.tok[i], ids[i]);
    dp_tokens_free(&t);
    /* the generic reader cannot know it: "not a token file" */
    ASSERT_ERR(dp_tokens_read(p, &t), DP_EFORMAT, "is not a token file");
    ASSERT_ERR(dp_tokens_read_raw_u16(p, 50256, &t), DP_EFORMAT, "token 50256 at index 4 >= vocab 50256");
    ASSERT_TRUE(t.tok == NULL && t.n == 0);
    ASSERT_ERR(dp_tokens_read_raw_u16(p, 1, &t), DP_EINVAL, "vocab 1 out of range 2..65536");
    ASSERT_ERR(dp_tokens_read_raw_u16(p, 65537, &t), DP_EINVAL, "vocab 65537");
    dp_test_write_file(p, raw, 9);
    ASSERT_ERR(dp_tokens_read_raw_u16(p, 50257, &t), DP_EFORMAT, "9 bytes, an odd count");
    dp_test_write_file(p, raw, 0);
    ASSERT_ERR(dp_tokens_read_raw_u16(p, 50257, &t), DP_EFORMAT, "empty");
    ASSERT_ERR(dp_tokens_read_raw_u16(dp_test_path(p, "missing.bin"), 50257, &t), DP_ENOENT, "no such file");
    ASSERT_OK(dp_tokens_parse_raw_u16(raw, 2, 65536, &t));
    ASSERT_EQ(t.n, 1);
    ASSERT_EQ(t.tok[0], 15496);
    dp_tokens_free(&t);
}

/* An llm.c shard as its dev/data scripts write it (write_datafile): 256 int32 of header,
 * header[0] = 20240520, [1] = 1, [2] = the token count, then the uint16 tokens. */
static size_t llmc_shard(uint8_t *buf, const uint16_t *tok, int32_t count, int32_t version, int32_t claimed) {
    memset(buf, 0, DP_LLMC_HEADER_BYTES);
    wr32(buf, 20240520);
    wr32(buf + 4, (uint32_t)version);
    wr32(buf + 8, (uint32_t)claimed);
    for (int32_t i = 0; i < count; i++)
        buf[DP_LLMC_HEADER_BYTES + 2 * i] = (uint8_t)tok[i], buf[DP_LLMC_HEADER_BYTES + 2 * i + 1] = (uint8_t)(tok[i] >> 8);
    return DP_LLMC_HEADER_BYTES + 2 * (size_t)count;
}

TEST(text_tokens_llmc_shard) {
    static uint8_t buf[DP_LLMC_HEADER_BYTES + 64];
    const uint16_t tok[6] = {50256, 464, 2068, 7586, 21831, 13};
    ASSERT_EQ(buf[0], 0);
    size_t len = llmc_shard(buf, tok, 6, 1, 6);
    ASSERT_TRUE(buf[0] == 0x88 && buf[1] == 0xd8 && buf[2] == 0x34 && buf[3] == 0x01); /* 0x0134d888 */
    char p[512], start[128];
    dp_test_write_file(dp_test_path(p, "shard_000000.bin"), buf, len);
    struct dp_tokens t;
    /* recognised by dp_tokens_read (so --data takes it) and its probe; vocab = max + 1 */
    ASSERT_OK(dp_tokens_probe(p, start, sizeof start));
    ASSERT_OK(dp_tokens_read(p, &t));
    ASSERT_EQ(t.n, 6);
    ASSERT_EQ(t.vocab, 50257);
    for (int i = 0; i < 6; i++) ASSERT_EQ(t.tok[i], tok[i]);
    dp_tokens_free(&t);
    ASSERT_OK(dp_tokens_read_llmc(p, 50304, &t)); /* the caller's vocab (GPT-2's, padded) */
    ASSERT_EQ(t.vocab, 50304);
    dp_tokens_free(&t);
    ASSERT_ERR(dp_tokens_read_llmc(p, 50000, &t), DP_EFORMAT, "token 50256 at index 0 >= vocab 50000");
    ASSERT_ERR(dp_tokens_read_llmc(p, 1, &t), DP_EINVAL, "vocab 1 out of range");
    /* vocab 0 with only token 0: at least 2 */
    const uint16_t zero = 0;
    ASSERT_OK(dp_tokens_parse_llmc(buf, llmc_shard(buf, &zero, 1, 1, 1), 0, &t));
    ASSERT_EQ(t.vocab, 2);
    dp_tokens_free(&t);

    /* errors, each naming the field */
    len = llmc_shard(buf, tok, 6, 1, 6);
    buf[0] ^= 1;
    ASSERT_ERR(dp_tokens_parse_llmc(buf, len, 0, &t), DP_EFORMAT, "is not an llm.c token shard");
    dp_test_write_file(p, buf, len); /* and no DPTOKENS file either */
    ASSERT_ERR(dp_tokens_read(p, &t), DP_EFORMAT, "is not a token file");
    ASSERT_ERR(dp_tokens_read_llmc(p, 0, &t), DP_EFORMAT, "not the magic 20240520");
    len = llmc_shard(buf, tok, 6, 2, 6);
    dp_test_write_file(p, buf, len);
    ASSERT_ERR(dp_tokens_read(p, &t), DP_EFORMAT, "unsupported llm.c version 2");
    len = llmc_shard(buf, tok, 6, 1, 7); /* claims more than there is */
    dp_test_write_file(p, buf, len);
    ASSERT_ERR(dp_tokens_read(p, &t), DP_EFORMAT, "truncated: llm.c count 7 needs 14 token bytes, file has 12");
    len = llmc_shard(buf, tok, 6, 1, 5); /* trailing bytes */
    ASSERT_ERR(dp_tokens_parse_llmc(buf, len, 0, &t), DP_EFORMAT, "count 5 does not match the file size: 2 bytes");
    len = llmc_shard(buf, tok, 6, 1, 6);
    ASSERT_ERR(dp_tokens_parse_llmc(buf, len + 1, 0, &t), DP_EFORMAT, "does not match the file size: 1 bytes");
    ASSERT_ERR(dp_tokens_parse_llmc(buf, len - 1, 0, &t), DP_EFORMAT, "truncated");
    len = llmc_shard(buf, tok, 0, 1, 0);
    ASSERT_ERR(dp_tokens_parse_llmc(buf, len, 0, &t), DP_EFORMAT, "count 0");
    len = llmc_shard(buf, tok, 0, 1, -5);
    ASSERT_ERR(dp_tokens_parse_llmc(buf, len, 0, &t), DP_EFORMAT, "count -5");
    len = llmc_shard(buf, tok, 0, 1, 0x7fffffff); /* 2^31 - 1 tokens claimed, none there */
    ASSERT_ERR(dp_tokens_parse_llmc(buf, len, 0, &t), DP_EFORMAT, "truncated");
    for (size_t cut = 4; cut < DP_LLMC_HEADER_BYTES; cut += 97) {
        dp_test_write_file(p, buf, cut);
        ASSERT_ERR(dp_tokens_read(p, &t), DP_EFORMAT, "truncated llm.c header");
    }
    ASSERT_ERR(dp_tokens_parse_llmc(buf, 3, 0, &t), DP_EFORMAT, "not an llm.c token shard");
    ASSERT_ERR(dp_tokens_parse_llmc(NULL, 0, 0, &t), DP_EFORMAT, "it is empty");
    ASSERT_TRUE(t.tok == NULL && t.n == 0 && t.vocab == 0);
}
