/*
 * `dptrain prepare-text [FILES or DIRS] --out FILE`: concatenates text files
 * and writes their byte-level tokens (vocabulary 256) as a token file
 * (format: include/dp/data.h, docs/text.md).  With no inputs it reads the
 * default corpus, the plain-text files of /usr/share/games/fortunes (Debian
 * packages fortunes + fortunes-min; *.dat and *.u8 left out).  Prints one
 * summary line.  The validation split is not stored: it is taken when the
 * file is used (the last 5% of the tokens by default).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dp/data.h"
#include "cli.h"


static const char *help_prepare_text =
    "usage: dptrain prepare-text [FILE or DIR ...] --out FILE\n"
    "\n"
    "Writes the byte-level tokens (vocabulary 256) of the inputs, concatenated, as a\n"
    "token file (docs/text.md): a header with magic, version, vocabulary size, token\n"
    "count and CRC-32, then uint16 tokens.  A DIR means its regular files in name order\n"
    "(symlinks and subfolders inside it are skipped); a FILE is read as given.  With no\n"
    "inputs: the plain-text files of " DP_TEXT_DEFAULT_CORPUS " (Debian packages\n"
    "fortunes and fortunes-min; *.dat and *.u8 left out), in name order.\n"
    "\n"
    "  --out FILE   the token file to write (replaced atomically)\n";

#define die dptrain_die

int dptrain_cmd_prepare_text(int argc, char **argv) {
    const char *out = NULL;
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
        } else if (s[0] == '-' && s[1]) {
            die("unknown option '%s' for prepare-text (see 'dptrain prepare-text --help')", s);
        } else {
            inputs[n++] = s;
        }
    }
    if (!out || !*out) die("prepare-text needs --out FILE (see 'dptrain prepare-text --help')");

    struct dp_text_prepared info;
    if (dp_text_prepare(inputs, n, out, &info)) die("%s", dp_errmsg());
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
