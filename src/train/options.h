/* train's option table (options.c: the mechanism; option_table.c: the table).  Not installed. */
#ifndef DP_TRAIN_OPTIONS_H
#define DP_TRAIN_OPTIONS_H

#include <stddef.h>
#include "dp/train.h"

/* How an option's text becomes its field */
enum dp__opt_kind {
    DP__OPT_FLAG,   /* int: flag_on when given (1, or 0 for a "--no-..." option), else !flag_on */
    DP__OPT_INT,    /* int in [lo, hi] */
    DP__OPT_I64,    /* int64_t in [lo, hi] */
    DP__OPT_U64,    /* uint64_t in [lo, hi] */
    DP__OPT_F32,    /* float in [lo, hi] */
    DP__OPT_F64,    /* double in [lo, hi] */
    DP__OPT_STR,    /* const char *, borrowed */
    DP__OPT_PATH,   /* the same, stored in the configuration as an absolute path */
    DP__OPT_CHOICE, /* int: vals[i] for the i-th word of choices ("a|b|c") */
    DP__OPT_CUSTOM  /* set and get below */
};
/* When the run's stored configuration (dp_train_options_render) holds the option */
enum dp__opt_store {
    DP__STORE_NO,     /* where and how fast this invocation runs, its own outputs and stop */
    DP__STORE_ALWAYS, /* whenever it applies */
    DP__STORE_SET     /* when it applies and differs from the default (a string: when set) */
};
/* The setting an option is for: given while p has another, dp_train_option_check refuses it */
enum dp__opt_need {
    DP__NEED_ANY,
    DP__NEED_SGD,
    DP__NEED_ADAMW,
    DP__NEED_COSINE,
    DP__NEED_STEP,
    DP__NEED_ZERO1,
    DP__NEED_DET,
    DP__NEED_POWERSGD,
    DP__NEED_RESIDUAL /* a compression that keeps an error-feedback residual */
};

struct dp__opt {
    struct dp_train_option pub; /* name, value placeholder, help group and text */
    enum dp__opt_kind kind;
    size_t off;                 /* the field: offsetof(struct dp_train_params, ...) */
    double lo, hi;              /* DP__OPT_F32, F64 */
    long long ilo, ihi;         /* DP__OPT_INT, I64, U64 */
    const char *choices;        /* DP__OPT_CHOICE */
    int vals[4];
    int flag_on;                /* DP__OPT_FLAG */
    enum dp__opt_store store;
    enum dp__opt_need need;
    /* DP__OPT_CUSTOM: set from the text (a one-line error through dp_seterr), and the
     * rendering for the configuration (0: nothing to store) */
    int (*set)(struct dp_train_params *p, const char *v);
    int (*get)(const struct dp_train_params *p, char *out, size_t n);
};

extern const struct dp__opt dp__opts[];
extern const int dp__nopts;

/* The shortest rendering of x that reads back as the same float ("0.01", not "0.00999999978") */
const char *dp__flt(char *out, size_t n, float x);

#endif
