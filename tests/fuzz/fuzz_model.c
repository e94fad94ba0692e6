/* libFuzzer harness for the model-file parser (dp_model_from_text).
 *
 * Beyond "no crash, no sanitizer report", it checks the parser's contract on
 * every input: failure means no model and a one-line, non-empty message that
 * names the origin; success means a finalized model whose canonical text
 * (m->desc) parses again to the same text and the same parameter count.  A
 * violated contract aborts, which libFuzzer reports like a crash.
 *
 * Built by tests/fuzz/run_model.sh (the seeds: models/*.txt). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/nn.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *buf, size_t len);
int LLVMFuzzerTestOneInput(const uint8_t *buf, size_t len) {
    char *text = malloc(len + 1);
    if (!text) return 0;
    memcpy(text, buf, len);
    text[len] = 0; /* (a NUL inside ends the text, as dp_model_read_file refuses such files) */
    struct dp_model *m = (struct dp_model *)&m;
    dp_clearerr();
    int rc = dp_model_from_text(&m, text, "fuzz.txt");
    free(text);
    if (rc) {
        CHECK(rc < 0 && m == NULL);
        const char *e = dp_errmsg();
        CHECK(e[0] != '\0' && strchr(e, '\n') == NULL && strstr(e, "fuzz.txt"));
        return 0;
    }
    CHECK(m && m->finalized && m->desc && m->nlayers > 0);
    struct dp_model *c;
    CHECK(dp_model_from_text(&c, m->desc, "canonical") == 0);
    CHECK(strcmp(c->desc, m->desc) == 0 && c->num_params == m->num_params && c->num_buffers == m->num_buffers);
    CHECK(dp_model_reads_tokens(c) == dp_model_reads_tokens(m));
    dp_model_free(c);
    dp_model_free(m);
    return 0;
}
