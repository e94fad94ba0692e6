/* libFuzzer harness for the BPE tokenizer file parser (dp_bpe_parse).
 *
 * Beyond "no crash, no sanitizer report", it checks the parser's contract on every input.
 * Failure means no tokenizer and a one-line, non-empty message.  Success means a
 * vocabulary in 257..65536, a file in its one spelling (dp_bpe_serialize gives back the
 * input's bytes exactly), every token 1..DP_BPE_TOKEN_BYTES_MAX bytes, and a tokenizer
 * that works on adversarial merge tables: the input's own bytes encode to tokens below V
 * that decode back to them.  A violated contract aborts, which libFuzzer reports like a
 * crash.
 *
 * Built by tests/fuzz/run_bpe.sh.  With -DDP_FUZZ_GEN it is instead a small program that
 * trains a tokenizer on a fixed text and writes it to argv[1] (argv[2]: "none" or
 * "space", the pre-split). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/common.h"
#include "dp/tokenizer.h"
#include "fuzz_check.h"

#ifndef DP_FUZZ_GEN
int LLVMFuzzerTestOneInput(const uint8_t *buf, size_t len);
int LLVMFuzzerTestOneInput(const uint8_t *buf, size_t len) {
    struct dp_bpe *b = (struct dp_bpe *)1; /* poison: must be overwritten */
    dp_clearerr();
    int rc = dp_bpe_parse(&b, buf, len, "fuzz");
    if (rc != 0) {
        CHECK(rc < 0);
        CHECK(b == NULL);
        const char *m = dp_errmsg();
        CHECK(m[0] != '\0' && strchr(m, '\n') == NULL);
        return 0;
    }
    int64_t V = dp_bpe_vocab(b);
    CHECK(V >= DP_BPE_VOCAB_MIN && V <= DP_BPE_VOCAB_MAX);
    uint8_t *s;
    size_t slen;
    CHECK(dp_bpe_serialize(b, &s, &slen) == 0);
    CHECK(slen == len && memcmp(s, buf, len) == 0);
    dp_free(s);
    for (int64_t t = 0; t < V; t++) {
        const uint8_t *p;
        size_t n;
        CHECK(dp_bpe_token_bytes(b, t, &p, &n) == 0);
        CHECK(n >= 1 && n <= DP_BPE_TOKEN_BYTES_MAX);
        CHECK(t >= 256 || (n == 1 && p[0] == t));
    }
    uint16_t *tok;
    int64_t nt;
    CHECK(dp_bpe_encode(b, buf, len, &tok, &nt) == 0);
    CHECK(nt <= (int64_t)len && (len == 0 || nt >= 1));
    for (int64_t i = 0; i < nt; i++) CHECK(tok[i] < V);
    uint8_t *back;
    size_t blen;
    CHECK(dp_bpe_decode(b, tok, nt, &back, &blen) == 0);
    CHECK(blen == len && memcmp(back, buf, len) == 0);
    dp_free(back);
    dp_free(tok);
    dp_bpe_free(b);
    return 0;
}
#else
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    static const char text[] =
        "the cat sat on the mat\n  and the dog sat on the log\n\nthe end\naaaaaaa  bbbb\n%\n";
    struct dp_bpe *b;
    enum dp_bpe_split split = strcmp(argv[2], "none") ? DP_BPE_SPLIT_SPACE : DP_BPE_SPLIT_NONE;
    if (dp_bpe_train(&b, (const uint8_t *)text, sizeof text - 1, 290, split) || dp_bpe_save(b, argv[1])) {
        fprintf(stderr, "fuzz_bpe: %s\n", dp_errmsg());
        return 1;
    }
    dp_bpe_free(b);
    return 0;
}
#endif
