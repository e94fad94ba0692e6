/* libFuzzer harness for the .npy reader (dp_npy_parse).
 *
 * Beyond "no crash, no sanitizer report", it checks the reader's contract on
 * every input: success means a known dtype, 0..8 dimensions whose product is
 * the element count, and data that lies inside the input and fills it to the
 * end exactly (every element is then read once); failure means no data
 * pointer and a one-line, non-empty message naming the array.  A violated
 * contract aborts, which libFuzzer reports like a crash.
 *
 * Built by tests/fuzz/run_npy.sh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/data.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *buf, size_t len);
int LLVMFuzzerTestOneInput(const uint8_t *buf, size_t len) {
    struct dp_npy a;
    memset(&a, 0x5a, sizeof a); /* poison: must be overwritten */
    dp_clearerr();
    int rc = dp_npy_parse(buf, len, "fuzz.npy", &a);
    if (rc) {
        const char *m = dp_errmsg();
        CHECK(rc < 0 && a.data == NULL && a.count == 0);
        CHECK(m[0] != '\0' && strchr(m, '\n') == NULL && strstr(m, "fuzz.npy"));
        return 0;
    }
    CHECK(a.dtype >= DP_NPY_F32 && a.dtype <= DP_NPY_BOOL && a.ndim >= 0 && a.ndim <= DP_NPY_MAX_DIMS);
    int64_t count = 1;
    for (int i = 0; i < a.ndim; i++) count *= a.shape[i];
    CHECK(count == a.count);
    const uint8_t *d = a.data;
    CHECK(d >= buf && d <= buf + len && (size_t)(buf + len - d) == (size_t)a.count * a.item);
    double sum = 0;
    for (int64_t i = 0; i < a.count; i++) sum += dp_npy_get(&a, i);
    (void)sum;
    return 0;
}
