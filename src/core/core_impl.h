/* src/core internals shared with the layers above (data, train): atomic file
 * replacement, used by the checkpoint, safetensors and token-file writers
 * (implemented in file.c).  It lives in core, the lowest layer, so that
 * src/data can write token files without depending on src/train. */
#ifndef DP_CORE_IMPL_H
#define DP_CORE_IMPL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* One piece of the file, written in order. */
struct dp__wpart {
    const void *data;
    size_t len;
};

/* Writes the parts to a new, uniquely named file beside path
 * ("<path>.tmp.<pid>.<n>", created with O_EXCL), fsyncs it, renames it over
 * path and fsyncs the folder.  On any error the temporary file is removed and
 * path keeps its old contents.  `what` prefixes the error message. */
int dp__write_file_atomic(const char *path, const struct dp__wpart *parts, int nparts, const char *what);

/* The same in steps, for a writer that streams (a ZeRO checkpoint written
 * range by range, src/train/ckpt.c): open creates the temporary file; write
 * appends, pwrite writes at an offset (a header filled in last); commit
 * fsyncs and renames; abort removes the temporary file.  A failed write or
 * commit has already aborted. */
struct dp__atomic {
    int fd;
    const char *path, *what;
    char tmp[4096];
};
int dp__atomic_open(struct dp__atomic *a, const char *path, const char *what);
int dp__atomic_write(struct dp__atomic *a, const void *data, size_t len);
int dp__atomic_pwrite(struct dp__atomic *a, const void *data, size_t len, uint64_t off);
int dp__atomic_commit(struct dp__atomic *a);
void dp__atomic_abort(struct dp__atomic *a);
/* s as the inside of a JSON string (quote and backslash escaped, control characters as
 * \u00XX) into out[cap], NUL-terminated, cut before the first character that does not fit
 * whole; returns the length the whole of s needs (>= cap: cut), as snprintf does. */
size_t dp__json_escape(char *out, size_t cap, const char *s);
/* mkdir -p: path and its missing parents (mode for the ones made); 0, or -1 with errno. */
int dp__mkdir_p(const char *path, unsigned mode);
/* pthread_create with every asynchronous signal blocked in the new thread (the
 * synchronous ones, a fault in the thread itself, stay deliverable): a
 * process-directed signal then goes to one of the caller's threads, never
 * onto a library thread in the middle of a kernel.  oneDNN's GEMM (Debian
 * 12's libdnnl 2.7) points rsp into a heap buffer while it runs, so a
 * handler run on a thread inside it writes its signal frame over the heap
 * (oneDNN#4845).  `name` (at most 15 characters) names the thread for
 * ps, top and gdb.  Returns pthread_create's result. */
int dp__thread_start(pthread_t *th, const char *name, void *(*fn)(void *), void *arg);

/* Reads the whole of an open file into *buf (dp_malloc'd), *len bytes; hint: the size
 * expected (it grows past it).  `what: path:` prefixes the errors. */
int dp__read_fd(int fd, const char *what, const char *path, size_t hint, uint8_t **buf, size_t *len);
/* Opens path for reading: DP_ENOENT when missing, DP_EIO when it cannot be opened or is not
 * a regular file (a folder, a fifo); *size from fstat. */
int dp__open_regular(const char *what, const char *path, int *fd, size_t *size);
/* The first bytes of a file, for a message: "it starts with \"...\"" with up to 16 bytes in C
 * escapes where not printable ASCII, or "it is empty" (src/core/file.c). */
void dp__describe_start(char *out, size_t cap, const uint8_t *buf, size_t len);

/* dp_gemm with a post-op on C: fn(arg, c, ldc, i0, j0, m, n) runs on each tile of C right
 * after the GEMM wrote it, on the thread that wrote it, while the tile is in that core's cache
 * (dp_gemm's tiles, gemm.c; the whole of C for a small product and on the reference backend).
 * c is the tile, rows i0..i0+m-1 and columns j0..j0+n-1 of C, row stride ldc.  fn must be elementwise: what it makes
 * of an element depends only on the element's value and position, never on the tile, so the
 * result keeps dp_gemm's guarantee (the same bits for any thread count).  fn runs inside the
 * tiles' parallel region: it opens none of its own. */
struct dp__gemm_post {
    void (*fn)(void *arg, float *c, int64_t ldc, int64_t i0, int64_t j0, int64_t m, int64_t n);
    void *arg;
};
void dp__gemm_post(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc, const struct dp__gemm_post *post);

/* The small products' GEMM (gemm_small.c): C = alpha op(A) B + beta C, B not transposed, on
 * this thread, in register blocks; every element one fused multiply-add chain over k in order.
 * dp_gemm takes it for the products of at most DP__GEMM_SMALL multiply-adds on the library
 * backends, B transposed first where it is transposed and holds at most DP__GEMM_SMALL_BT floats. */
#define DP__GEMM_SMALL ((int64_t)1 << 17)
#define DP__GEMM_SMALL_BT 4096
void dp__gemm_small(int ta, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                    const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

#endif
