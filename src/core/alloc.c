/* The allocation hook: every library allocation goes through dp_malloc. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "dp/common.h"

/* A small header in front of each block remembers the hook that made it, so a
 * block is freed by the allocator that produced it even if the hook changed. */
static void *default_alloc(size_t size, void *user) {
    (void)user;
    void *p = NULL;
    if (size == 0) size = 1;
    /* Round up: aligned_alloc requires a multiple of the alignment. */
    size = (size + 63) & ~(size_t)63;
    if (posix_memalign(&p, 64, size) != 0) return NULL;
    return p;
}
static void default_free(void *p, void *user) {
    (void)user;
    free(p);
}

static struct dp_allocator current = {default_alloc, default_free, NULL};

void dp_set_allocator(const struct dp_allocator *a) {
    if (a)
        current = *a;
    else
        current = (struct dp_allocator){default_alloc, default_free, NULL};
}

void *dp_malloc(size_t size) { return current.alloc(size, current.user); }

void *dp_calloc(size_t n, size_t size) {
    if (size && n > SIZE_MAX / size) return NULL;
    void *p = dp_malloc(n * size);
    if (p) memset(p, 0, n * size);
    return p;
}

void dp_free(void *p) {
    if (p) current.free(p, current.user);
}

void *dp_malloc_big(size_t size) {
    void *p = dp_malloc(size);
    if (!p) return NULL;
#ifdef MADV_HUGEPAGE
    /* Only whole 2 MiB pages inside the block can be huge; advise that part. */
    uintptr_t lo = ((uintptr_t)p + (2u << 20) - 1) & ~(uintptr_t)((2u << 20) - 1);
    uintptr_t hi = ((uintptr_t)p + size) & ~(uintptr_t)((2u << 20) - 1);
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#endif
    /* Touch every page once now (first-touch faults are slow on these VMs). */
    long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0) pg = 4096;
    for (size_t i = 0; i < size; i += (size_t)pg) ((volatile char *)p)[i] = 0;
    return p;
}

/* mmap gives page alignment only: map one unit more, then unmap the head
 * before the first unit boundary and the tail after the rounded length. */
void *dp_slab_map(size_t size) {
    size_t len = (size + DP_SLAB_UNIT - 1) & ~(DP_SLAB_UNIT - 1);
    if (len == 0) len = DP_SLAB_UNIT;
    char *raw = mmap(NULL, len + DP_SLAB_UNIT, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
    if (raw == MAP_FAILED) return NULL;
    char *p = (char *)(((uintptr_t)raw + DP_SLAB_UNIT - 1) & ~(uintptr_t)(DP_SLAB_UNIT - 1));
    if (p > raw) munmap(raw, (size_t)(p - raw));
    if (raw + len + DP_SLAB_UNIT > p + len) munmap(p + len, (size_t)(raw + len + DP_SLAB_UNIT - (p + len)));
#ifdef MADV_HUGEPAGE
    madvise(p, len, MADV_HUGEPAGE);
#endif
    return p;
}

void dp_slab_unmap(void *p, size_t size) {
    if (!p) return;
    size_t len = (size + DP_SLAB_UNIT - 1) & ~(DP_SLAB_UNIT - 1);
    munmap(p, len ? len : DP_SLAB_UNIT);
}

void dp_slab_give_back(void *p, size_t bytes, size_t unit, int zero, int tail) {
    if (!bytes) return;
    uintptr_t a = (uintptr_t)p, e = a + bytes, u = unit;
    uintptr_t lo = (a + u - 1) & ~(u - 1), hi = tail ? (e + u - 1) & ~(u - 1) : e & ~(u - 1);
    if (hi <= lo) {
        if (zero) memset(p, 0, bytes);
        return;
    }
    if (zero) memset(p, 0, lo - a), memset((void *)hi, 0, e > hi ? e - hi : 0);
    /* a failure only leaves the memory in place: the data is zeroed by hand */
    if (madvise((void *)lo, hi - lo, MADV_DONTNEED) != 0 && zero) memset((void *)lo, 0, hi - lo);
}

void dp_slab_release(void *p, size_t bytes) {
    long pg = sysconf(_SC_PAGESIZE);
    dp_slab_give_back(p, bytes, pg > 0 ? (size_t)pg : 4096, 0, 0);
}

char *dp_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = dp_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}
