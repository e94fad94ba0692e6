/* Gradient compression, internal to src/ddp (the reducer calls it; the tests
 * call the pure helpers).  The public side is in dp/ddp.h. */
#ifndef DP_DDP_COMPRESS_IMPL_H
#define DP_DDP_COMPRESS_IMPL_H

#include "dp/ddp.h"

/* Lifetime.  b[0..nb) are the reducer's buckets (per-bucket schemes size
 * their wire buffers from them). */
int dp__compress_init(struct dp_compressor **out, const struct dp_model *m, struct dp_comm *comm,
                      const struct dp_compress_params *p, const struct dp_bucket *b, int nb);
void dp__compress_free(struct dp_compressor *c);

/* What the reducer does at optimizer step `step`: 0 = plain fp32 buckets
 * (no scheme, or powersgd before powersgd_start), 1 = per-bucket
 * compression (bucket_start/bucket_end), 2 = the whole gradient at once
 * after backward (powersgd). */
int dp__compress_mode(const struct dp_compressor *c, int64_t step);

/* Per-bucket schemes.  bucket_start (on the compute thread, as the bucket
 * becomes ready): compresses bucket i of grads, starts its collective on the
 * wire buffer and adds the wire bytes to *sent and *recv.  bucket_end (after
 * the request completed): decompresses the collective's result into
 * grads[b.off, b.off + b.count).  unit: see dp_reducer.grad_unit. */
int dp__compress_bucket_start(struct dp_compressor *c, int i, float *grads, float unit, enum dp_comm_algo algo,
                              struct dp_comm_req **req, double *sent, double *recv);
void dp__compress_bucket_end(struct dp_compressor *c, int i, float *grads);

/* PowerSGD over the whole gradient slab (blocking: two all-reduces).
 * Times the compression and decompression compute into *tc and *td
 * (seconds) and the phases into t[0..4): compress start, compress end,
 * decompress start, decompress end (dp_time). */
int dp__compress_powersgd(struct dp_compressor *c, float *grads, float unit, enum dp_comm_algo algo, double *sent,
                          double *recv, double *tc, double *td, double t[4]);

int64_t dp__compress_state_len(const struct dp_compressor *c);
void dp__compress_state_get(const struct dp_compressor *c, float *out);
void dp__compress_state_set(struct dp_compressor *c, const float *in);
void dp__compress_reset(struct dp_compressor *c);
const float *dp__compress_residual(const struct dp_compressor *c);

/* ---- pure helpers (exposed for the tests) ---- */

/* fp32 <-> IEEE binary16, round to nearest even, subnormals kept, overflow
 * to infinity, NaN stays NaN. */
uint16_t dp__f16_from_f32(float f);
float dp__f16_to_f32(uint16_t h);
/* The byte transport: `bytes` payload bytes travel as ceil(bytes / 3) fp32
 * words, each an integer 0 .. 2^24 - 1 (exact in fp32).  See compress.c for
 * why not the raw bits. */
size_t dp__wire_words(size_t bytes);
void dp__wire_pack(const uint8_t *src, size_t bytes, float *words);
void dp__wire_unpack(const float *words, size_t bytes, uint8_t *dst);
/* Reorders idx[0..n) (any permutation of 0..n-1 on entry) so that idx[0..k)
 * name k elements of largest |v| (NaN counts as the largest): a quickselect
 * with three-way partitions, O(n) expected, deterministic for given input. */
void dp__topk_select(const float *v, uint32_t *idx, int64_t n, int64_t k);
/* sign's scale of p[0..n): |p|_2 / sqrt(n), in double (0 for n = 0): the
 * scaled sign s sign(p) has p's norm (see compress.c). */
float dp__sign_scale(const float *p, int64_t n);
/* bit i of bits (LSB first) = 1 when p[i] < 0 (ceil(n/8) bytes). */
void dp__sign_pack(const float *p, int64_t n, uint8_t *bits);
/* Orthonormalises the r columns of P (n x r, row-major) in place by modified
 * Gram-Schmidt; a column that becomes (numerically) zero is set to zero. */
void dp__gram_schmidt(float *P, int64_t n, int64_t r);

#endif
