/* libFuzzer harness for the image decoders (dp_image_decode: libpng and
 * libjpeg behind this project's error handling, conversion and resize).
 *
 * Beyond "no crash, no sanitizer report, nothing printed", it checks the
 * contract on every input, decoded twice: at its own size and channels, and
 * converted to one or three channels (by the input's length) and resized to
 * 5 x 7.  Success means 1 or 3 channels, a positive size (the one asked for
 * in the second call), and pixels whose every byte is read; failure means no
 * pixels and a one-line, non-empty message naming the input.  Both calls
 * must agree on success or failure and its code (the options only shape the
 * output).  A violated contract aborts, which libFuzzer reports like a crash.
 *
 * Built by tests/fuzz/run_image.sh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/data.h"
#include "fuzz_check.h"

static int decode(const uint8_t *buf, size_t len, int channels, int64_t H, int64_t W) {
    uint8_t *px = (uint8_t *)buf; /* poison: must be overwritten */
    int64_t c = -1, h = -1, w = -1;
    dp_clearerr();
    int rc = dp_image_decode(buf, len, "fuzz.img", channels, H, W, &px, &c, &h, &w);
    if (rc) {
        const char *m = dp_errmsg();
        CHECK(rc < 0 && px == NULL && c == 0 && h == 0 && w == 0);
        CHECK(m[0] != '\0' && strchr(m, '\n') == NULL && strstr(m, "fuzz.img"));
        return rc;
    }
    CHECK(px != NULL && (c == 1 || c == 3) && h >= 1 && w >= 1 && h * w <= DP_IMAGE_MAX_PIXELS);
    CHECK(!channels || c == channels);
    CHECK(!H || (h == H && w == W));
    unsigned sum = 0;
    for (int64_t i = 0; i < c * h * w; i++) sum += px[i];
    (void)sum;
    dp_free(px);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *buf, size_t len);
int LLVMFuzzerTestOneInput(const uint8_t *buf, size_t len) {
    int a = decode(buf, len, 0, 0, 0);
    int b = decode(buf, len, len % 2 ? 3 : 1, 5, 7);
    CHECK(a == b);
    return 0;
}
