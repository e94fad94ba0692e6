/* libFuzzer harness for the token-file parser (dp_tokens_parse).
 *
 * Beyond "no crash, no sanitizer report", it checks the parser's contract on
 * every input: success means a sane header (vocab 2..65536, count >= 1), a
 * file of exactly 32 + 2*count bytes, a matching CRC-32 and every token <
 * vocab, read back equal to the input's bytes; failure means no buffer and a
 * one-line, non-empty message.  A violated contract aborts, which libFuzzer
 * reports like a crash.
 *
 * Built by tests/fuzz/run_tokens.sh.  With -DDP_FUZZ_GEN it is instead a
 * small program that writes a valid seed token file to argv[1] with the
 * library's own writer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/core.h"
#include "dp/data.h"
#include "fuzz_check.h"

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

#ifndef DP_FUZZ_GEN
int LLVMFuzzerTestOneInput(const uint8_t *buf, size_t len);
int LLVMFuzzerTestOneInput(const uint8_t *buf, size_t len) {
    struct dp_tokens t;
    memset(&t, 0x5a, sizeof t); /* poison: must be overwritten */
    dp_clearerr();
    int rc = dp_tokens_parse(buf, len, &t);
    if (rc != 0) {
        CHECK(rc < 0);
        CHECK(t.tok == NULL && t.n == 0 && t.vocab == 0);
        const char *m = dp_errmsg();
        CHECK(m[0] != '\0' && strchr(m, '\n') == NULL);
        return 0;
    }
    CHECK(len >= DP_TOKENS_HEADER_BYTES);
    CHECK(memcmp(buf, DP_TOKENS_MAGIC, 8) == 0 && rd32(buf + 8) == DP_TOKENS_VERSION);
    CHECK(t.vocab >= 2 && t.vocab <= DP_TOKENS_VOCAB_MAX && t.vocab == rd32(buf + 12));
    CHECK(t.n >= 1 && len == DP_TOKENS_HEADER_BYTES + 2 * (size_t)t.n);
    CHECK(rd32(buf + 16) == (uint32_t)t.n && rd32(buf + 20) == (uint32_t)((uint64_t)t.n >> 32));
    CHECK(rd32(buf + 24) == dp_crc32(0, buf + DP_TOKENS_HEADER_BYTES, 2 * (size_t)t.n));
    CHECK(rd32(buf + 28) == 0);
    const uint8_t *p = buf + DP_TOKENS_HEADER_BYTES;
    for (int64_t i = 0; i < t.n; i++) { /* reads every token (ASan checks the bounds) */
        CHECK(t.tok[i] < t.vocab);
        CHECK(t.tok[i] == (p[2 * i] | p[2 * i + 1] << 8));
    }
    dp_tokens_free(&t);
    return 0;
}
#else
/* Writes a valid token file (vocab 300, 40 tokens) to argv[1]. */
int main(int argc, char **argv) {
    if (argc != 2) return 2;
    uint16_t tok[40];
    for (int i = 0; i < 40; i++) tok[i] = (uint16_t)((i * 37 + 11) % 300);
    if (dp_tokens_write(argv[1], tok, 40, 300)) {
        fprintf(stderr, "fuzz_tokens: %s\n", dp_errmsg());
        return 1;
    }
    return 0;
}
#endif
