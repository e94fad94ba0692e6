/*
 * dp/tokenizer.h — a byte-level BPE tokenizer (src/data/bpe.c), and the
 * token files of other projects (nanoGPT's raw uint16 arrays, llm.c's
 * shards; src/data/tokens.c).
 *
 * Byte-level BPE (as GPT-2 and minbpe's BasicTokenizer do it).  The base
 * vocabulary is the 256 byte values: token b < 256 is the byte b.  Training
 * repeatedly replaces the most frequent adjacent pair of tokens (a, b) by a
 * new token 256 + m (merge m) until the vocabulary has V tokens; encoding
 * applies the learned merges to new text in the order they were learned;
 * decoding concatenates each token's bytes, so decode(encode(x)) == x for
 * any bytes x.
 *
 *     struct dp_bpe *b;
 *     if (dp_bpe_train(&b, text, len, 4096, DP_BPE_SPLIT_SPACE)) { ... dp_errmsg() ... }
 *     dp_bpe_save(b, "tokens.bin.bpe");
 *     uint16_t *tok; int64_t n;
 *     dp_bpe_encode(b, text, len, &tok, &n);        // tok: dp_malloc'd, n tokens
 *     uint8_t *back; size_t blen;
 *     dp_bpe_decode(b, tok, n, &back, &blen);       // back == text
 *     dp_free(tok); dp_free(back); dp_bpe_free(b);
 *
 * Counting.  A pair's count is the number of positions i where token i is
 * a and token i+1 is b: overlapping occurrences count ("aaa" holds (a, a)
 * twice, as minbpe counts), and a merge replaces them left to right ("aaa"
 * becomes "Za").  The most frequent pair wins; ties go to the smallest pair
 * (a, b), compared by a first, then b.  Training is deterministic: the same
 * text and V give the same merges.
 *
 * Pre-split (enum dp_bpe_split).  DP_BPE_SPLIT_NONE merges any adjacent
 * pair (minbpe's BasicTokenizer).  DP_BPE_SPLIT_SPACE, the one prepare-text
 * uses, never merges across a boundary, and a boundary lies before every
 * space (0x20) or newline (0x0a) byte that does not follow the same byte.
 * So a word takes its leading space (" the"), runs of spaces or of
 * newlines stay together ("    ", "\n\n"), and no token holds a word, then
 * a space and more text ("the cat" is at least " cat" after "the").  As a
 * rule on pairs: (a, b) is never merged when b's first byte is a space or a
 * newline and a's last byte is another byte.  It is GPT-2's regex
 * pre-split reduced to what costs nothing: it is a property of the pair
 * alone, so training and encoding apply it with no separate splitting pass.
 *
 * Either way a token holds at most DP_BPE_TOKEN_BYTES_MAX bytes: training
 * never makes a longer one (such a pair is not counted), and a file with
 * one is refused, so a file's tokens take at most 64 MiB.
 *
 * Tokenizer file (text, ASCII, one item per line, every line ended by '\n'):
 *
 *     dptrain-bpe 1          magic and version
 *     vocab 4096             V, 257..65536
 *     split space            the pre-split: "none" or "space"
 *     116 104                merge 0: token 256 = token 116 then token 104
 *     32 97                  merge 1: token 257, ...
 *     ...                    V - 256 merge lines in all, merge m makes token 256 + m
 *
 * Numbers are decimal, without sign or leading zeros, separated by one
 * space; nothing else may appear (no blank line, no '\r', nothing after the
 * last merge line), so a file has one spelling and dp_bpe_serialize of what
 * dp_bpe_parse read gives back the same bytes.  Reading validates all of
 * it: each merge's parts must exist before it (a, b < 256 + m), no pair
 * repeats an earlier merge, no merge crosses a boundary of the file's
 * split, no token exceeds DP_BPE_TOKEN_BYTES_MAX bytes.  A bad file is one
 * DP_EFORMAT error naming the line ("bpe: FILE:7: ...").  Writing is atomic
 * (a crash leaves the old file or the whole new one).
 *
 * Where it lives.  prepare-text --vocab V writes the token file OUT and its
 * tokenizer beside it, OUT with DP_BPE_SUFFIX appended (tokens.bin ->
 * tokens.bin.bpe); dp_bpe_find_for finds it from the token file's path.
 */
#ifndef DP_TOKENIZER_H
#define DP_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- byte-level BPE ------------------------------------------------------------ */

#define DP_BPE_MAGIC "dptrain-bpe"
#define DP_BPE_VERSION 1
#define DP_BPE_VOCAB_MIN 257
#define DP_BPE_VOCAB_MAX 65536
#define DP_BPE_TOKEN_BYTES_MAX 1024
/* The tokenizer beside a token file: its path with this appended. */
#define DP_BPE_SUFFIX ".bpe"

enum dp_bpe_split {
    DP_BPE_SPLIT_NONE,  /* merge any adjacent pair ("none" in the file) */
    DP_BPE_SPLIT_SPACE, /* never across a space/newline boundary ("space") */
    DP_BPE_SPLIT_COUNT
};

struct dp_bpe; /* opaque; immutable once made, so it may be shared by threads */

/* Learns vocab - 256 merges on text[0..len) (vocab in 257..65536) with the
 * given pre-split.  *out gets the tokenizer (dp_bpe_free it).  DP_EINVAL
 * for a vocab out of range, a text of 2^31 bytes or more, or a text that
 * runs out of pairs before vocab tokens (every chunk already one token: the
 * message says how many merges it held; use a smaller vocab).  Takes about
 * 22 bytes of memory per text byte. */
int dp_bpe_train(struct dp_bpe **out, const uint8_t *text, size_t len, int64_t vocab,
                 enum dp_bpe_split split);
/* The tokenizer file's bytes (format above) into *buf (dp_malloc'd, free
 * with dp_free), *len bytes.  The form a checkpoint can embed. */
int dp_bpe_serialize(const struct dp_bpe *b, uint8_t **buf, size_t *len);
/* Writes the tokenizer file to path, atomically; DP_ENOENT when path's
 * folder does not exist. */
int dp_bpe_save(const struct dp_bpe *b, const char *path);
/* Reads and validates a tokenizer file (DP_EFORMAT naming the line, DP_ENOENT
 * / DP_EIO for a missing or unreadable file). */
int dp_bpe_load(struct dp_bpe **out, const char *path);
/* The same from the file's bytes in memory (an embedded copy, the fuzzer's
 * entry point); `what` names it in messages (NULL: "<memory>").  On failure
 * *out is NULL. */
int dp_bpe_parse(struct dp_bpe **out, const uint8_t *buf, size_t len, const char *what);
void dp_bpe_free(struct dp_bpe *b);

/* The vocabulary size V (256 + merges), and the pre-split. */
int64_t dp_bpe_vocab(const struct dp_bpe *b);
enum dp_bpe_split dp_bpe_split_rule(const struct dp_bpe *b);

/* Tokens of text[0..len) into *tokens (dp_malloc'd, never NULL on success;
 * free with dp_free), *n of them: the merges applied in the order learned,
 * each left to right, as training applied them (the training text encodes
 * to the sequence training ended with).  O(len log len).  DP_EINVAL for a
 * text of 2^31 bytes or more. */
int dp_bpe_encode(const struct dp_bpe *b, const uint8_t *text, size_t len, uint16_t **tokens,
                  int64_t *n);
/* The bytes of tokens[0..n) into *text (dp_malloc'd, never NULL on success),
 * *len bytes.  DP_EINVAL for a token >= V (naming it and its index). */
int dp_bpe_decode(const struct dp_bpe *b, const uint16_t *tokens, int64_t n, uint8_t **text,
                  size_t *len);
/* Token `token`'s bytes: *bytes points into b (valid until dp_bpe_free),
 * *len of them (1..DP_BPE_TOKEN_BYTES_MAX).  DP_EINVAL for a token outside
 * 0..V-1. */
int dp_bpe_token_bytes(const struct dp_bpe *b, int64_t token, const uint8_t **bytes, size_t *len);

/* The tokenizer file beside the token file tokens_path (tokens_path
 * DP_BPE_SUFFIX) into bpe_path[0..cap): 1 when it exists as a regular file,
 * 0 when it does not (bpe_path holds the name it would have), DP_EINVAL when
 * cap is too small.  It is not read: a caller checks that its vocabulary
 * equals the token file's (a token file written later without --vocab may
 * sit beside an older tokenizer). */
int dp_bpe_find_for(const char *tokens_path, char *bpe_path, size_t cap);

/* ---- other projects' token files (src/data/tokens.c) -------------------------- */

struct dp_tokens;

/* nanoGPT's train.bin / val.bin: raw little-endian uint16 tokens, no header
 * (prepare.py's np.uint16 array .tofile()).  Nothing in such a file says what
 * it is, so the caller names the format and gives the vocabulary (50257 for
 * GPT-2's), 2..65536.  DP_EFORMAT for an odd byte count, an empty file, or a
 * token >= vocab (naming its index).  On failure t is zeroed. */
int dp_tokens_read_raw_u16(const char *path, int64_t vocab, struct dp_tokens *t);
int dp_tokens_parse_raw_u16(const uint8_t *buf, size_t len, int64_t vocab, struct dp_tokens *t);

/* llm.c's shards (the .bin files of its dev/data scripts): a header of 256 little-endian int32,
 *
 *     header[0] = 20240520 (DP_LLMC_MAGIC), header[1] = 1 (version),
 *     header[2] = number of tokens (>= 1), the rest unused (not checked),
 *
 * then that many uint16 tokens and nothing after: the file is exactly
 * 1024 + 2 * count bytes.  llm.c does not store the vocabulary: vocab > 0
 * gives it (2..65536; every token must be below it), vocab 0 takes the
 * least that holds every token, max token + 1 (at least 2).  dp_tokens_read
 * recognises a shard by its magic and reads it with vocab 0, so `--data
 * shard.bin` takes one as it is; the model's vocab= (50257 for GPT-2's
 * tokens) must then be at least the largest token + 1.  DP_EFORMAT naming
 * the field for a bad magic or version, a count that does not match the
 * file size (truncated or trailing bytes), a token >= vocab. */
#define DP_LLMC_MAGIC 20240520
#define DP_LLMC_VERSION 1
#define DP_LLMC_HEADER_BYTES 1024
int dp_tokens_read_llmc(const char *path, int64_t vocab, struct dp_tokens *t);
int dp_tokens_parse_llmc(const uint8_t *buf, size_t len, int64_t vocab, struct dp_tokens *t);

#ifdef __cplusplus
}
#endif
#endif
