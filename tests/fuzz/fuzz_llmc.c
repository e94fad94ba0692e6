/* libFuzzer harness for the readers of other projects' token files: llm.c's shards
 * (dp_tokens_parse_llmc) and nanoGPT's raw uint16 arrays (dp_tokens_parse_raw_u16).
 *
 * Beyond "no crash, no sanitizer report", it checks each parser's contract on every
 * input, against what the format says it must accept:
 *   - llm.c, vocab 0: success exactly when the input has the magic and version 1, a count
 *     >= 1, and exactly 1024 + 2 * count bytes; then the tokens are the input's and the
 *     vocabulary is the largest + 1 (at least 2).  With a vocab of 1000: the same, and
 *     every token below it;
 *   - raw, vocab 50257: success exactly when the input is a non-empty, even number of bytes
 *     of tokens below 50257; then the tokens are the input's.
 * Failure means no buffer, a zeroed result and a one-line, non-empty message.  A violated
 * contract aborts, which libFuzzer reports like a crash.
 *
 * Built by tests/fuzz/run_llmc.sh.  With -DDP_FUZZ_GEN it is instead a small program that
 * writes a valid shard of argv[2] tokens to argv[1], in llm.c's layout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/common.h"
#include "dp/data.h"
#include "dp/tokenizer.h"
#include "fuzz_check.h"

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

#ifndef DP_FUZZ_GEN
static void check_failed(int rc, const struct dp_tokens *t) {
    CHECK(rc < 0);
    CHECK(t->tok == NULL && t->n == 0 && t->vocab == 0);
    const char *m = dp_errmsg();
    CHECK(m[0] != '\0' && strchr(m, '\n') == NULL);
}

/* Whether the input is a valid shard whose tokens are all below vocab (0: any); the largest
 * token to *max. */
static int valid_shard(const uint8_t *buf, size_t len, int64_t vocab, uint32_t *max) {
    if (len < DP_LLMC_HEADER_BYTES || rd32(buf) != DP_LLMC_MAGIC || rd32(buf + 4) != DP_LLMC_VERSION) return 0;
    int32_t count = (int32_t)rd32(buf + 8);
    if (count < 1 || len - DP_LLMC_HEADER_BYTES != 2 * (size_t)count) return 0;
    *max = 0;
    for (int32_t i = 0; i < count; i++) {
        uint16_t v = rd16(buf + DP_LLMC_HEADER_BYTES + 2 * i);
        if (vocab && v >= vocab) return 0;
        if (v > *max) *max = v;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *buf, size_t len);
int LLVMFuzzerTestOneInput(const uint8_t *buf, size_t len) {
    struct dp_tokens t;
    const int64_t vocabs[2] = {0, 1000};
    for (int k = 0; k < 2; k++) {
        memset(&t, 0x5a, sizeof t); /* poison: must be overwritten */
        dp_clearerr();
        int rc = dp_tokens_parse_llmc(buf, len, vocabs[k], &t);
        uint32_t max;
        int valid = valid_shard(buf, len, vocabs[k], &max);
        CHECK((rc == 0) == valid);
        if (rc != 0) {
            check_failed(rc, &t);
            continue;
        }
        CHECK(t.n == (int32_t)rd32(buf + 8));
        CHECK(t.vocab == (vocabs[k] ? vocabs[k] : max + 1 < 2 ? 2 : max + 1));
        for (int64_t i = 0; i < t.n; i++) CHECK(t.tok[i] == rd16(buf + DP_LLMC_HEADER_BYTES + 2 * i));
        dp_tokens_free(&t);
    }
    memset(&t, 0x5a, sizeof t);
    dp_clearerr();
    int rc = dp_tokens_parse_raw_u16(buf, len, 50257, &t);
    int valid = len > 0 && len % 2 == 0;
    for (size_t i = 0; valid && i < len / 2; i++) valid = rd16(buf + 2 * i) < 50257;
    CHECK((rc == 0) == valid);
    if (rc != 0) {
        check_failed(rc, &t);
        return 0;
    }
    CHECK(t.n == (int64_t)(len / 2) && t.vocab == 50257);
    for (int64_t i = 0; i < t.n; i++) CHECK(t.tok[i] == rd16(buf + 2 * i));
    dp_tokens_free(&t);
    return 0;
}
#else
/* Writes a shard of argv[2] tokens ((i * 7919) % 50257) to argv[1]. */
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    int n = atoi(argv[2]);
    FILE *f = fopen(argv[1], "wb");
    if (!f || n < 0) return 1;
    uint8_t h[DP_LLMC_HEADER_BYTES] = {0};
    int32_t hv[3] = {DP_LLMC_MAGIC, DP_LLMC_VERSION, n};
    for (int k = 0; k < 3; k++)
        for (int b = 0; b < 4; b++) h[4 * k + b] = (uint8_t)((uint32_t)hv[k] >> 8 * b);
    fwrite(h, 1, sizeof h, f);
    for (int i = 0; i < n; i++) {
        uint16_t v = (uint16_t)((i * 7919) % 50257);
        uint8_t le[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
        fwrite(le, 1, 2, f);
    }
    return fclose(f) != 0;
}
#endif
