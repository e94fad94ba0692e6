/* The fuzz harnesses' contract check: a violated contract aborts, which libFuzzer reports
 * like a crash (the input saved under tests/fuzz/findings-*). */
#ifndef DP_FUZZ_CHECK_H
#define DP_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(c)                                                                 \
    do {                                                                         \
        if (!(c)) {                                                              \
            fprintf(stderr, "%s: contract violated: %s\n", __FILE__, #c);        \
            abort();                                                             \
        }                                                                        \
    } while (0)

#endif
