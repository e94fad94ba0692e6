/* Byte-level BPE's internals, shared by bpe.c (training, encoding, decoding) and bpe_file.c
 * (the tokenizer file).  Not installed. */
#ifndef DP_DATA_BPE_IMPL_H
#define DP_DATA_BPE_IMPL_H

#include <stdint.h>
#include "dp/tokenizer.h"

#define NBYTES 256

struct dp_bpe {
    int64_t vocab;
    enum dp_bpe_split split;
    int64_t nmerges;
    uint16_t *ma, *mb; /* (nmerges) merge m = (ma[m], mb[m]) makes token 256 + m */
    uint32_t *off;     /* (vocab + 1) token t's bytes are pool[off[t] .. off[t+1]) */
    uint8_t *pool;
    /* pair -> rank: open addressing, hkey[s] = a << 16 | b, hrank[s] = -1 when empty */
    uint32_t *hkey;
    int32_t *hrank;
    uint32_t hmask;
};

extern const char *const dp__bpe_split_names[DP_BPE_SPLIT_COUNT];
/* The tokenizer of the merges ma/mb[0..nm), taken over (freed on failure too), each
 * validated; errors are DP_EFORMAT "bpe: WHAT:LINE: merge M ..." (bpe.c) */
int dp__bpe_make(struct dp_bpe **out, enum dp_bpe_split split, uint16_t *ma, uint16_t *mb, int64_t nm,
                 const char *what, int64_t line0);

#endif
