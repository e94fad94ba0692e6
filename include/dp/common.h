/*
 * dp/common.h — status codes, error messages, the allocation hook and asserts.
 *
 * Every fallible library function returns an int: 0 (DP_OK) on success or a
 * negative DP_E* code.  The function that fails first also records a message
 * with detail ("idx: train-images: magic 0x00000802, expected 0x00000803"),
 * which the caller reads with dp_errmsg().  The message buffer is per thread,
 * so each worker thread of the thread backend keeps its own.  Library code
 * never prints and never exits; only tools/ may.
 *
 *     int rc = dp_idx_load(&ds, path);
 *     if (rc) fprintf(stderr, "error: %s\n", dp_errmsg());
 */
#ifndef DP_COMMON_H
#define DP_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* X-macro table: name, value, default text.  It also generates dp_strerror(). */
#define DP_STATUS_MAP(X)                                               \
    X(DP_OK, 0, "success")                                             \
    X(DP_EINVAL, -1, "invalid argument")                               \
    X(DP_ENOMEM, -2, "out of memory")                                  \
    X(DP_EIO, -3, "input/output error")                                \
    X(DP_EFORMAT, -4, "bad file format")                               \
    X(DP_ENOTSUP, -5, "not supported")                                 \
    X(DP_ENOENT, -6, "no such file")                                   \
    X(DP_EMISMATCH, -7, "mismatch")                                    \
    X(DP_ENONFINITE, -8, "non-finite value")                           \
    X(DP_ECANCELED, -9, "canceled")                                    \
    X(DP_EINTERNAL, -10, "internal error")                             \
    X(DP_EEXIST, -11, "already exists")

enum dp_status {
#define DP__ENUM(name, val, text) name = val,
    DP_STATUS_MAP(DP__ENUM)
#undef DP__ENUM
    DP_STATUS_COUNT = 12
};

/* Default text for a status code (never NULL). */
const char *dp_strerror(int status);

/* The detailed message of the last failure on this thread ("" if none). */
const char *dp_errmsg(void);

/* Records a formatted message for this thread and returns `status`, so that
 * library code can write `return dp_seterr(DP_EINVAL, "bad %s", x);`. */
int dp_seterr(int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Prepends context to this thread's message: "ctx: old message". */
int dp_adderr(int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

void dp_clearerr(void);

/* ---- allocation hook ---------------------------------------------------- */

/* All library allocations go through these, so tests can count them or make
 * them fail.  Alignment is at least 64 bytes.  dp_free(NULL) is a no-op. */
struct dp_allocator {
    void *(*alloc)(size_t size, void *user); /* returns 64-byte aligned memory or NULL */
    void (*free)(void *p, void *user);
    void *user;
};
/* Replaces the allocator (NULL restores the default). Not thread-safe: call
 * before any worker starts. */
void dp_set_allocator(const struct dp_allocator *a);
void *dp_malloc(size_t size);
void *dp_calloc(size_t n, size_t size);
void dp_free(void *p);
/* Large buffers (parameter slabs, arenas): asks for transparent huge pages and
 * touches every page now, so that the first training step does not pay for
 * page faults (see docs/architecture.md §3: a fresh 4 KiB page costs ~12 µs here). */
void *dp_malloc_big(size_t size);
/* A slab that is given back and faulted in again by parts (ZeRO's gradient
 * and parameter slabs, src/ddp/zero.c): address space mapped privately, so it
 * reads as zeros and holds no memory until touched, aligned to 2 MiB and a
 * whole number of 2 MiB units long, so that every unit of it, the last one
 * included, belongs to the slab alone and can be given back whole.  The
 * one allocation outside the hook: what it holds is its resident pages,
 * counted by dp_resident_bytes (mincore), not the reserved size.  NULL on
 * failure; dp_slab_unmap takes the size given to dp_slab_map. */
#define DP_SLAB_UNIT ((size_t)2 << 20)
void *dp_slab_map(size_t size);
void dp_slab_unmap(void *p, size_t size);
/* Gives back the whole pages inside [p, p + bytes) of a dp_slab_map slab: they read as zeros
 * afterwards (the bytes around them keep their values). */
void dp_slab_release(void *p, size_t bytes);
/* The same in units of `unit` bytes (a power of two: a page, or DP_SLAB_UNIT): the whole units
 * inside [p, p + bytes) given back; zero: the bytes of the partial units at the edges set to 0
 * too, so the whole range reads as zeros; tail: p + bytes ends a slab of whole units, so its
 * last unit goes whole. */
void dp_slab_give_back(void *p, size_t bytes, size_t unit, int zero, int tail);
char *dp_strdup(const char *s);

/* ---- asserts: programmer errors only ------------------------------------ */

typedef void (*dp_abort_fn)(const char *file, int line, const char *msg);
void dp_set_abort(dp_abort_fn fn);
void dp__abort(const char *file, int line, const char *msg);
#define DP_ASSERT(x)                                  \
    do {                                              \
        if (!(x)) dp__abort(__FILE__, __LINE__, #x); \
    } while (0)

#define DP_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#ifdef __cplusplus
}
#endif
#endif
