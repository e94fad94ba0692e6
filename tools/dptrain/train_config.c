/* train's configuration in its checkpoints, so that --resume remembers the
 * run (docs/checkpoint.md "What a resume restores").
 *
 * The configuration is train's own options, one per line as "--flag=value"
 * or "--flag", rendered from the parsed parameters by the library's option
 * table (dp_train_options_render: each option has one spelling, whatever the
 * user typed) and stored by the library as the checkpoint's DPCONFIG section.  A resume puts the stored lines in front of
 * the command line's options and parses both with train's one parser: an
 * option given again overrides its stored value.  Rendering the result and
 * comparing it line by line with the stored lines names each override.
 *
 * Stored: what decides the numbers a run computes and how it is recorded
 * (data, model, optimizer, schedule, batch, epochs, seed, clipping, the
 * data-parallel options that change the arithmetic or its failure modes,
 * checkpoint and evaluation cadence).  Not stored: where and how fast this
 * invocation runs (--workers, --threads, --backend, pinning, progress
 * threads, prefetch, gemm), this invocation's own stop and outputs
 * (--max-steps, --out, --resume, --overwrite, --init-from, --timeline,
 * --progress) and the slowness simulations. */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/train.h"
#include "cli.h"

/* A checkpoint written before configurations were stored: what its header
 * holds (model, batch, seed, the optimizer and the schedule's kind). */
static char *from_header(const struct dp_ckpt_header *h) {
    /* the same lines as dp_train_options_render's for these fields */
    struct dp_train_params tp = dp_train_default_params();
    tp.run.model = h->model_spec, tp.run.batch = h->batch, tp.run.seed = h->seed, tp.sched.base_lr = h->lr;
    tp.optim.kind = (enum dp_optim_kind)h->optim_kind, tp.optim.momentum = h->momentum;
    tp.optim.nesterov = (int)h->nesterov, tp.optim.beta1 = h->beta1, tp.optim.beta2 = h->beta2, tp.optim.eps = h->eps;
    tp.optim.weight_decay = h->weight_decay, tp.sched.kind = (enum dp_sched_kind)h->sched_kind;
    char *all = dp_train_options_render(&tp), *keep = all, *out = all;
    if (!all) dptrain_die("out of memory");
    /* only the header's fields: drop the defaults rendered for the others */
    static const char *const fields[] = {"--model=", "--batch=", "--seed=", "--lr=", "--optim=", "--momentum=",
                                         "--nesterov", "--beta1=", "--beta2=", "--eps=", "--weight-decay=",
                                         "--schedule="};
    while (*keep) {
        char *e = strchr(keep, '\n');
        size_t len = (size_t)(e - keep) + 1;
        int take = 0;
        for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
            take |= !strncmp(keep, fields[i], strlen(fields[i]));
        if (take) memmove(out, keep, len), out += len;
        keep += len;
    }
    *out = 0;
    return all;
}

char *dptrain_config_stored(const char *ckpt, int *from_hdr) {
    struct dp_ckpt_header h;
    void *data;
    uint64_t size;
    *from_hdr = 0;
    /* the whole file's checksums first: a corrupt checkpoint is reported as
     * corrupt, never as a configuration that differs */
    if (dp_ckpt_read_header(ckpt, &h) || dp_ckpt_read_section(ckpt, DP_CKPT_CONFIG_TAG, &data, &size))
        dptrain_die("%s", dp_errmsg());
    if (!data) {
        *from_hdr = 1;
        return from_header(&h);
    }
    char *text = data; /* (dp_ckpt_read_section allocates one byte more) */
    text[size] = 0;
    char *copy = strdup(text);
    dp_free(data);
    if (!copy) dptrain_die("out of memory");
    return copy;
}

/* The value of option `flag` in a rendered configuration ("" for a flag without a value), or
 * NULL if absent; into out. */
static const char *lookup(const char *cfg, const char *flag, char *out, size_t n) {
    size_t k = strlen(flag);
    for (const char *l = cfg; l && *l;) {
        const char *e = strchr(l, '\n');
        size_t len = e ? (size_t)(e - l) : strlen(l);
        if (len >= k && !strncmp(l, flag, k) && (len == k || l[k] == '=')) {
            size_t v = len > k ? len - k - 1 : 0;
            if (v >= n) v = n - 1;
            memcpy(out, l + k + (len > k), v);
            out[v] = 0;
            return out;
        }
        l = e ? e + 1 : NULL;
    }
    return NULL;
}

int dptrain_config_overrides(const char *stored, const char *now, FILE *f) {
    int count = 0;
    /* every option in either, once: the stored ones in order, then the new ones */
    const char *lists[2] = {stored, now};
    for (int which = 0; which < 2; which++)
        for (const char *l = lists[which]; l && *l;) {
            const char *e = strchr(l, '\n');
            size_t len = e ? (size_t)(e - l) : strlen(l);
            char flag[64];
            size_t k = strcspn(l, "=\n");
            if (k > len) k = len;
            snprintf(flag, sizeof flag, "%.*s", (int)k, l);
            char a[4096], b[4096];
            const char *va = lookup(stored, flag, a, sizeof a), *vb = lookup(now, flag, b, sizeof b);
            /* (the second pass adds the options the checkpoint's run did not have) */
            if ((which == 0 || !va) && (!va != !vb || (va && vb && strcmp(va, vb)))) {
                count++;
                if (!vb)
                    fprintf(f, "resume: %s%s%s from the checkpoint no longer applies\n", flag, *va ? " " : "", va);
                else if (!va)
                    fprintf(f, "resume: %s%s%s (not in the checkpoint's run)\n", flag, *vb ? " " : "", vb);
                else
                    fprintf(f, "resume: %s %s overrides the checkpoint's %s\n", flag, vb, va);
            }
            l = e ? e + 1 : NULL;
        }
    return count;
}
