/*
 * `dptrain prepare-text [FILES or DIRS] --out FILE [--vocab V]`: concatenates
 * text files and writes their tokens as a token file (format:
 * include/dp/data.h, docs/text.md).  With no inputs it reads the default
 * corpus, the plain-text files of /usr/share/games/fortunes (Debian packages
 * fortunes + fortunes-min; *.dat and *.u8 left out).  The validation split
 * is not stored: it is taken when the file is used (the last 5% of the
 * tokens by default).
 *
 * Tokens.  Without --vocab they are byte-level (vocabulary 256), and one
 * summary line is printed.  With --vocab V a byte-level BPE of V tokens
 * (include/dp/tokenizer.h, pre-split "space") is learned on the text's
 * training part only, the first 1 - DP_TEXT_VAL_FRAC of its bytes: the split
 * the trainer takes is on tokens, which do not exist before the BPE, so the
 * BPE learns on the first 95% of the bytes and then the whole text is
 * encoded with it.  The validation part, the last 5% of the tokens, is then
 * about the last 5% of the text: a little less, as text the BPE never saw
 * compresses less; the second line says how many bytes it covers and
 * whether any of them was in the BPE's part.  The tokenizer is written
 * beside the token file, as OUT.bpe (OUT with DP_BPE_SUFFIX appended:
 * tokens.bin -> tokens.bin.bpe), where dp_bpe_find_for finds it.  Without
 * --vocab, an OUT.bpe that an earlier --vocab run left is removed, so a
 * token file never has a tokenizer beside it that is not its own.
 */
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dp/core.h"
#include "dp/data.h"
#include "dp/tokenizer.h"
#include "cli.h"


static const char *help_prepare_text =
    "usage: dptrain prepare-text [FILE or DIR ...] --out FILE [--vocab V]\n"
    "\n"
    "Writes the byte-level tokens (vocabulary 256) of the inputs, concatenated, as a\n"
    "token file (docs/text.md): a header with magic, version, vocabulary size, token\n"
    "count and CRC-32, then uint16 tokens.  A DIR means its regular files in name order\n"
    "(symlinks and subfolders inside it are skipped); a FILE is read as given.  With no\n"
    "inputs: the plain-text files of " DP_TEXT_DEFAULT_CORPUS " (Debian packages\n"
    "fortunes and fortunes-min; *.dat and *.u8 left out), in name order.\n"
    "\n"
    "  --out FILE   the token file to write (replaced atomically)\n"
    "  --vocab V    learn a byte-level BPE of V tokens (257..65536) on the first 95% of\n"
    "               the text (the rest is the validation part) and write its tokens, and the\n"
    "               tokenizer as FILE.bpe [byte-level: 256, and no FILE.bpe]\n";

#define die dptrain_die

/* --vocab V: the BPE's tokens of the corpus, and its tokenizer beside them. */
static void prepare_bpe(const char *const *inputs, int n, const char *out, long long vocab) {
    /* OUT's folder before the learning: the same words as the byte-level path's error */
    char dir[4096];
    struct stat st;
    snprintf(dir, sizeof dir, "%s", out);
    const char *d = dirname(dir);
    if (stat(d, &st) != 0 || !S_ISDIR(st.st_mode)) die("tokens: cannot write %s: folder %s does not exist", out, d);
    struct dp_text_corpus c;
    if (dp_text_corpus_load(&c, inputs, n)) die("%s", dp_errmsg());
    char bpe_path[4096];
    if (dp_bpe_find_for(out, bpe_path, sizeof bpe_path) < 0) die("%s", dp_errmsg());
    /* the BPE learns on the bytes of the training part, as the trainer splits the tokens */
    struct dp_text_split bs;
    if (dp_text_split_init(&bs, (int64_t)c.len, DP_TEXT_VAL_FRAC)) die("%s", dp_errmsg());
    struct dp_bpe *b;
    double t0 = dp_time();
    if (dp_bpe_train(&b, c.bytes, (size_t)bs.train_n, vocab, DP_BPE_SPLIT_SPACE)) die("%s", dp_errmsg());
    double t1 = dp_time();
    uint16_t *tok;
    int64_t nt;
    if (dp_bpe_encode(b, c.bytes, c.len, &tok, &nt)) die("%s", dp_errmsg());
    double t2 = dp_time();
    if (dp_bpe_save(b, bpe_path)) die("%s", dp_errmsg());
    if (dp_tokens_write(out, tok, nt, vocab)) {
        unlink(bpe_path); /* no tokenizer without its tokens */
        die("%s", dp_errmsg());
    }
    /* where the validation tokens fall in the text */
    struct dp_text_split ts;
    if (dp_text_split_init(&ts, nt, DP_TEXT_VAL_FRAC)) die("%s", dp_errmsg());
    size_t val_bytes = 0;
    for (int64_t i = ts.train_n; i < nt; i++) {
        const uint8_t *p;
        size_t len;
        if (dp_bpe_token_bytes(b, tok[i], &p, &len)) die("%s", dp_errmsg());
        val_bytes += len;
    }
    size_t held_out = c.len - (size_t)bs.train_n;
    printf("prepare-text: %d file%s, %zu bytes, %lld tokens (vocab %lld, %.3f bytes/token) -> %s\n", c.nfiles,
           c.nfiles == 1 ? "" : "s", c.len, (long long)nt, vocab, (double)c.len / (double)nt, out);
    char overlap[128] = "the BPE learned on none of them";
    if (val_bytes > held_out)
        snprintf(overlap, sizeof overlap, "%zu of them in the part the BPE learned on", val_bytes - held_out);
    printf("prepare-text: BPE learned on the first %lld bytes (%.0f%%) in %.2f s, text encoded in %.2f s -> %s; "
           "validation: the last %lld tokens, the last %zu bytes (%s)\n",
           (long long)bs.train_n, 100.0 * (double)bs.train_n / (double)c.len, t1 - t0, t2 - t1, bpe_path,
           (long long)ts.val_n, val_bytes, overlap);
    dp_free(tok);
    dp_bpe_free(b);
    dp_text_corpus_free(&c);
}

int dptrain_cmd_prepare_text(int argc, char **argv) {
    const char *out = NULL, *v;
    long long vocab = 0;
    const char **inputs = calloc((size_t)argc + 1, sizeof *inputs);
    int n = 0;
    if (!inputs) die("out of memory");
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            fputs(help_prepare_text, stdout);
            free(inputs);
            return 0;
        } else if (!strcmp(s, "--out")) {
            if (i + 1 >= argc) die("option --out needs a value (see 'dptrain prepare-text --help')");
            out = argv[++i];
        } else if (!strncmp(s, "--out=", 6)) {
            out = s + 6;
        } else if (dptrain_take(argc, argv, &i, "--vocab", &v)) {
            vocab = dptrain_int_arg("--vocab", v, DP_BPE_VOCAB_MIN, DP_BPE_VOCAB_MAX);
        } else if (s[0] == '-' && s[1]) {
            die("unknown option '%s' for prepare-text (see 'dptrain prepare-text --help')", s);
        } else {
            inputs[n++] = s;
        }
    }
    if (!out || !*out) die("prepare-text needs --out FILE (see 'dptrain prepare-text --help')");
    if (vocab) {
        prepare_bpe(inputs, n, out, vocab);
        free(inputs);
        return 0;
    }

    struct dp_text_prepared info;
    if (dp_text_prepare(inputs, n, out, &info)) die("%s", dp_errmsg());
    /* an earlier --vocab run's tokenizer is not this token file's */
    char bpe_path[4096];
    if (dp_bpe_find_for(out, bpe_path, sizeof bpe_path) == 1 && unlink(bpe_path) != 0)
        die("cannot remove %s, the tokenizer of an earlier --vocab run: %s", bpe_path, strerror(errno));
    printf("prepare-text: %d file%s, %lld bytes, %lld tokens (vocab %d) -> %s\n", info.nfiles,
           info.nfiles == 1 ? "" : "s", (long long)info.tokens, (long long)info.tokens,
           DP_TOKENS_VOCAB_BYTES, out);
    free(inputs);
    return 0;
}

/* A language model's --data: a token file, or a folder of text files whose
 * token file is prepared on first use into the cache folder
 * ($XDG_CACHE_HOME/dptrain, else ~/.cache/dptrain; an older dptrain's
 * DIR/tokens.bin is still read while valid) and reused while valid
 * (dp_text_prepare_dir: the core of prepare-text).  One line on stderr says
 * which, and where the file is, when report.  Returns the token file to
 * read.
 *
 * What the user passed is checked here, where --data is known by its name,
 * so that a mistake is one line saying what --data takes: a missing path
 * (not "tokens: ... " as if it were a token file), or a file that is no
 * token file (a text file, the image data set's file; its first bytes
 * shown), instead of the reader's "bad magic". */
const char *dptrain_prepared_text_data(const char *data, int report) {
    struct stat st;
    if (stat(data, &st) != 0) {
        if (errno == ENOENT) die("--data %s: no such file or folder", data);
        die("--data %s: %s", data, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode)) {
        char start[128];
        if (dp_tokens_probe(data, start, sizeof start) == DP_EFORMAT)
            die("--data %s is not a token file (%s): --data takes a token file written by 'dptrain prepare-text "
                "FILES --out tokens.bin', or a folder of text files",
                data, start);
        return data; /* a token file, or one the trainer's reader will name the trouble of */
    }
    static char path[4096];
    struct dp_text_prepared info;
    int rc = dp_text_prepare_dir(data, path, sizeof path, &info);
    if (rc) die("%s", dp_errmsg()[0] ? dp_errmsg() : dp_strerror(rc));
    if (report && info.built && info.cache_error[0])
        fprintf(stderr, "dptrain: prepared %s from %d file%s of %s (%lld tokens): %s; in the folder, as the cache failed: %s\n", path,
                info.nfiles, info.nfiles == 1 ? "" : "s", data, (long long)info.tokens, info.why, info.cache_error);
    else if (report && info.built)
        fprintf(stderr, "dptrain: prepared %s from %d file%s of %s (%lld tokens): %s\n", path, info.nfiles,
                info.nfiles == 1 ? "" : "s", data, (long long)info.tokens, info.why);
    else if (report)
        fprintf(stderr, "dptrain: reusing %s (%lld tokens, newer than its %d source file%s)\n", path,
                (long long)info.tokens, info.nfiles, info.nfiles == 1 ? "" : "s");
    return path;
}
