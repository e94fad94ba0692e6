/* libFuzzer harness for the .npz glue (dp_npz_parse over Debian's libzip, then
 * dp_npy_parse on the member).
 *
 * Contract on every input: success means a member buffer of the length
 * returned, which the .npy reader then takes or refuses like any .npy;
 * failure means no buffer and a one-line, non-empty message.  A violated
 * contract aborts, which libFuzzer reports like a crash.
 *
 * Built by tests/fuzz/run_npz.sh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/data.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *buf, size_t len);
int LLVMFuzzerTestOneInput(const uint8_t *buf, size_t len) {
    uint8_t *npy = (uint8_t *)1;
    size_t n = 1;
    dp_clearerr();
    int rc = dp_npz_parse(buf, len, "x", &npy, &n);
    if (rc) {
        const char *m = dp_errmsg();
        CHECK(rc < 0 && npy == NULL && n == 0);
        CHECK(m[0] != '\0' && strchr(m, '\n') == NULL);
        return 0;
    }
    CHECK(npy != NULL);
    struct dp_npy a;
    if (dp_npy_parse(npy, n, "x.npy", &a) == 0) {
        const uint8_t *d = a.data;
        CHECK(d >= npy && (size_t)(npy + n - d) == (size_t)a.count * a.item);
        double sum = 0;
        for (int64_t i = 0; i < a.count; i++) sum += dp_npy_get(&a, i);
        (void)sum;
    }
    dp_free(npy);
    return 0;
}
