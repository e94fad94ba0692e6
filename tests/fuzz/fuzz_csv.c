/* libFuzzer harness for the CSV reader (dp_csv_parse), each input parsed
 * under four sets of options (header detected, forced on and off; label by
 * default, index and name; classes and regression).
 *
 * Beyond "no crash, no sanitizer report", it checks the reader's contract on
 * every input: success means at least one row and one feature, a label
 * column inside the row, no more rows than the input's size allows (a row of
 * C fields takes at least 2C - 1 bytes and a line end), finite features,
 * classes in 0..65535 or finite targets, and a one-line label name; failure
 * means nothing left allocated (d zeroed) and a one-line, non-empty message
 * that starts with the input's name.  A violated contract aborts, which
 * libFuzzer reports like a crash.
 *
 * Built by tests/fuzz/run_csv.sh. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/data.h"
#include "fuzz_check.h"

static void one(const uint8_t *buf, size_t len, int header, const char *label, int regression) {
    struct dp_csv_opts o = dp_csv_default_opts();
    o.header = header, o.label_column = label, o.regression = regression;
    struct dp_csv_data d;
    memset(&d, 0x5a, sizeof d); /* poison: must be overwritten */
    dp_clearerr();
    int rc = dp_csv_parse(buf, len, "fuzz.csv", &o, &d);
    if (rc) {
        const char *m = dp_errmsg();
        CHECK(rc < 0 && d.x == NULL && d.y == NULL && d.rows == 0 && d.features == 0);
        CHECK(m[0] != '\0' && strchr(m, '\n') == NULL && strncmp(m, "fuzz.csv", 8) == 0);
        return;
    }
    CHECK(d.rows >= 1 && d.features >= 1 && d.features < DP_CSV_MAX_COLUMNS && d.x && d.y);
    CHECK(d.label >= 0 && d.label <= d.features && (d.header == 0 || d.header == 1));
    CHECK((uint64_t)d.rows * (uint64_t)(2 * (d.features + 1)) <= (uint64_t)len + 1);
    CHECK(memchr(d.label_name, 0, sizeof d.label_name) && d.label_name[0] && !strchr(d.label_name, '\n'));
    for (int64_t i = 0; i < d.rows * d.features; i++) CHECK(isfinite(d.x[i]));
    for (int64_t i = 0; i < d.rows; i++) {
        if (regression) CHECK(isfinite(((const float *)d.y)[i]));
        else CHECK(((const int64_t *)d.y)[i] >= 0 && ((const int64_t *)d.y)[i] <= 65535);
    }
    dp_csv_data_free(&d);
    CHECK(d.x == NULL && d.y == NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *buf, size_t len);
int LLVMFuzzerTestOneInput(const uint8_t *buf, size_t len) {
    one(buf, len, -1, NULL, 0);
    one(buf, len, 1, "0", 1);
    one(buf, len, 0, "1", 0);
    one(buf, len, -1, "b", 1);
    return 0;
}
