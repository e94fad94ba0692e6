/* libFuzzer harness for the IDX parser (dp_idx_parse).
 *
 * Beyond "no crash, no sanitizer report", it checks the parser's contract on
 * every input: success means the header is sane and the payload is exactly
 * prod(dims) bytes of the input; failure means no buffer and a one-line,
 * non-empty message.  A violated contract aborts, which libFuzzer reports
 * like a crash.
 *
 * Built by tests/fuzz/run.sh.  With -DDP_FUZZ_STANDALONE it is an ordinary
 * program instead, replaying the files given as arguments (to reproduce a
 * finding without libFuzzer):
 *
 *     cc -std=c11 -D_GNU_SOURCE -DDP_FUZZ_STANDALONE -Iinclude tests/fuzz/fuzz_idx.c \
 *        src/core/error.c src/core/alloc.c src/data/idx.c -lz -o fuzz_idx && ./fuzz_idx crash-*
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/data.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *buf, size_t len);

int LLVMFuzzerTestOneInput(const uint8_t *buf, size_t len) {
    uint8_t *data = (uint8_t *)&data; /* poison: must be overwritten */
    int nd = -1;
    int64_t dims[4] = {-1, -1, -1, -1};
    dp_clearerr();
    int rc = dp_idx_parse(buf, len, &data, &nd, dims);
    if (rc != 0) {
        CHECK(rc < 0);
        CHECK(data == NULL && nd == 0);
        const char *m = dp_errmsg();
        CHECK(m[0] != '\0' && strchr(m, '\n') == NULL);
        return 0;
    }
    CHECK(nd >= 1 && nd <= 4);
    CHECK(len >= 4 + 4 * (size_t)nd);
    size_t total = 1;
    for (int i = 0; i < nd; i++) {
        CHECK(dims[i] > 0);
        total *= (size_t)dims[i];
    }
    CHECK(total == len - 4 - 4 * (size_t)nd);
    CHECK(memcmp(data, buf + 4 + 4 * nd, total) == 0); /* reads every byte */
    dp_free(data);
    return 0;
}

#ifdef DP_FUZZ_STANDALONE
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f) {
            fprintf(stderr, "fuzz_idx: cannot open %s\n", argv[i]);
            return 2;
        }
        size_t cap = 1 << 16, len = 0;
        uint8_t *buf = malloc(cap);
        size_t r;
        while (buf && (r = fread(buf + len, 1, cap - len, f)) > 0) {
            len += r;
            if (len == cap) buf = realloc(buf, cap *= 2);
        }
        fclose(f);
        if (!buf) return 2;
        LLVMFuzzerTestOneInput(buf, len);
        printf("%s: ok (%zu bytes)\n", argv[i], len);
        free(buf);
    }
    return 0;
}
#endif
