/*
 * tests/test.h — a small test harness.
 *
 *     TEST(arena_reuses_memory) {
 *         ASSERT_EQ(1 + 1, 2);
 *         ASSERT_NEAR(x, 1.0, 1e-6);
 *         ASSERT_OK(dp_arena_init(&a, 100));
 *     }
 *
 * Tests register themselves (a constructor per TEST), so a new test file
 * needs no list.  The runner (test_main.c) forks one child per test with a
 * timeout; `dptest NAME...` runs the tests whose names contain any NAME (a
 * NAME that matches no test is an error).  A test that cannot run here (a
 * missing data set, fixture or tool) calls SKIP("why"): it is reported as
 * "skip", never as "ok".  The exit status is the verdict; the last line reads
 * "N passed, N failed, N skipped".  With CI set (CI=true), a skip fails the
 * run: CI installs everything the tests need.
 */
#ifndef DP_TEST_H
#define DP_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/common.h"

typedef void (*dp_test_fn)(void);
void dp_test_register(const char *name, dp_test_fn fn, int timeout_s);
void dp_test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
/* Ends the test as skipped, with the reason (printf format) the runner prints. */
void dp_test_skip(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
#define SKIP(...) dp_test_skip(__VA_ARGS__)
/* The entries of folder dir not starting with '.' (what a run left there); fails the test when
 * dir cannot be listed. */
int dp_test_files_in(const char *dir);
/* The bytes of path (caller frees; *n their number); fails the test on any error. */
char *dp_test_read_file(const char *path, size_t *n);
/* Writes n bytes of p to path (created or truncated); fails the test on any error. */
void dp_test_write_file(const char *path, const void *p, size_t n);
/* dp_test_tmpdir()/name into out (512 bytes), returned. */
char *dp_test_path(char *out, const char *name);

#define TEST_T(name, timeout_s)                                             \
    static void test_##name(void);                                          \
    __attribute__((constructor)) static void test_register_##name(void) {   \
        dp_test_register(#name, test_##name, timeout_s);                    \
    }                                                                       \
    static void test_##name(void)
#define TEST(name) TEST_T(name, 120)

#define ASSERT_TRUE(c)                                                            \
    do {                                                                          \
        if (!(c)) dp_test_fail(__FILE__, __LINE__, "expected true: %s", #c);      \
    } while (0)
/* ASSERT_EQ/ASSERT_NE compare integers (as long long).  A floating operand
 * would be truncated (0.5 == 0.9 would pass), so it does not compile: use
 * ASSERT_FEQ (exact) or ASSERT_NEAR. */
#define DP_TEST_IS_FLOAT(x) _Generic((x), float: 1, double: 1, long double: 1, default: 0)
#define ASSERT_EQ(a, b)                                                                     \
    do {                                                                                    \
        _Static_assert(!DP_TEST_IS_FLOAT(a) && !DP_TEST_IS_FLOAT(b),                        \
                       "ASSERT_EQ on a floating value: use ASSERT_FEQ or ASSERT_NEAR");     \
        long long a_ = (long long)(a), b_ = (long long)(b);                                 \
        if (a_ != b_) dp_test_fail(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b, a_, b_); \
    } while (0)
#define ASSERT_NE(a, b)                                                                     \
    do {                                                                                    \
        _Static_assert(!DP_TEST_IS_FLOAT(a) && !DP_TEST_IS_FLOAT(b),                        \
                       "ASSERT_NE on a floating value: compare floats with ASSERT_FEQ/NEAR"); \
        long long a_ = (long long)(a), b_ = (long long)(b);                                 \
        if (a_ == b_) dp_test_fail(__FILE__, __LINE__, "%s != %s: both %lld", #a, #b, a_);  \
    } while (0)
/* Exact floating equality (as double, so a float compares exactly too); NaN
 * equals nothing, itself included.  %.9g shows every float digit. */
#define ASSERT_FEQ(a, b)                                                                    \
    do {                                                                                    \
        double a_ = (double)(a), b_ = (double)(b);                                          \
        if (!(a_ == b_))                                                                    \
            dp_test_fail(__FILE__, __LINE__, "%s == %s: %.9g != %.9g", #a, #b, a_, b_);     \
    } while (0)
#define ASSERT_NEAR(a, b, tol)                                                            \
    do {                                                                                  \
        double a_ = (double)(a), b_ = (double)(b), t_ = (double)(tol);                    \
        if (!(fabs(a_ - b_) <= t_))                                                       \
            dp_test_fail(__FILE__, __LINE__, "%s ~ %s: %.9g vs %.9g (|diff| %.3g > %.3g)", \
                         #a, #b, a_, b_, fabs(a_ - b_), t_);                              \
    } while (0)
/* Status 0 expected; prints the library's message otherwise. */
#define ASSERT_OK(expr)                                                                  \
    do {                                                                                 \
        int rc_ = (expr);                                                                \
        if (rc_ != 0)                                                                    \
            dp_test_fail(__FILE__, __LINE__, "%s returned %d (%s): %s", #expr, rc_,      \
                         dp_strerror(rc_), dp_errmsg());                                 \
    } while (0)
/* A specific failure code expected, and a message containing `needle`. */
#define ASSERT_ERR(expr, code, needle)                                                   \
    do {                                                                                 \
        dp_clearerr();                                                                   \
        int rc_ = (expr);                                                                \
        if (rc_ != (code))                                                               \
            dp_test_fail(__FILE__, __LINE__, "%s returned %d (%s), expected %d: %s", #expr, \
                         rc_, dp_strerror(rc_), (code), dp_errmsg());                    \
        if ((needle) && !strstr(dp_errmsg(), (needle)))                                  \
            dp_test_fail(__FILE__, __LINE__, "message '%s' lacks '%s'", dp_errmsg(),     \
                         (const char *)(needle));                                        \
    } while (0)

/* A scratch directory for this test (created; removed by the runner). */
const char *dp_test_tmpdir(void);
/* Directory holding the test fixtures: $DP_TEST_FIXTURES, else tests/fixtures
 * of the source tree the binary was built in (never the working directory). */
const char *dp_test_fixtures(void);
/* The source tree's root, found from the binary (build/dptest -> ..): the
 * directory holding tests/test.h; NULL when there is none. */
const char *dp_test_source_dir(void);

#endif
