/* The runner's own tests, run by tests/harness.sh.  They register only with
 * DP_TEST_SELFTEST=1 (so the normal suite never sees the skip and the failure
 * below):
 *   selftest_passes        passes
 *   selftest_skips         skips, with a reason
 *   selftest_fails         fails an assertion
 *   selftest_exit77        exits with the skip status but gives no reason: a
 *                          failure, not a skip
 *   selftest_feq_fraction  ASSERT_FEQ(2.25f, 2): must fail (ASSERT_EQ truncated
 *                          it to 2 == 2)
 *   selftest_feq_nan       ASSERT_FEQ(NaN, NaN): must fail
 *   selftest_fixture       opens tests/fixtures/optim_ref.bin through
 *                          dp_test_fixtures() (harness.sh runs it from /tmp)
 *   selftest_many_NNNN     1100 tests, more than the runner's old fixed table
 *                          of 1024 held (harness.sh counts them in --list) */
#include <unistd.h>

#include "test.h"

static void selftest_passes(void) { ASSERT_EQ(1 + 1, 2); }
static void selftest_skips(void) { SKIP("selftest: this test always skips"); }
static void selftest_fails(void) { ASSERT_EQ(1 + 1, 3); }
static void selftest_exit77(void) { _exit(77); }
static void selftest_feq_fraction(void) {
    volatile float x = 2.25f;
    ASSERT_FEQ(x, 2);
}
static void selftest_feq_nan(void) {
    volatile float x = NAN;
    ASSERT_FEQ(x, x);
}
static void selftest_fixture(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/optim_ref.bin", dp_test_fixtures());
    FILE *f = fopen(path, "rb");
    if (!f) dp_test_fail(__FILE__, __LINE__, "cannot open %s", path);
    fclose(f);
}
static void selftest_many(void) {}

enum { SELFTEST_MANY = 1100 };
static char many_names[SELFTEST_MANY][24];

__attribute__((constructor)) static void selftest_register(void) {
    const char *on = getenv("DP_TEST_SELFTEST");
    if (!on || strcmp(on, "1") != 0) return;
    dp_test_register("selftest_passes", selftest_passes, 10);
    dp_test_register("selftest_skips", selftest_skips, 10);
    dp_test_register("selftest_fails", selftest_fails, 10);
    dp_test_register("selftest_exit77", selftest_exit77, 10);
    dp_test_register("selftest_feq_fraction", selftest_feq_fraction, 10);
    dp_test_register("selftest_feq_nan", selftest_feq_nan, 10);
    dp_test_register("selftest_fixture", selftest_fixture, 10);
    for (int i = 0; i < SELFTEST_MANY; i++) {
        snprintf(many_names[i], sizeof many_names[i], "selftest_many_%04d", i);
        dp_test_register(many_names[i], selftest_many, 10);
    }
}
