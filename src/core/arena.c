/* Bump allocator for per-step activations. */
#include <string.h>

#include "dp/core.h"

struct dp_arena_block {
    struct dp_arena_block *prev;
    size_t size, used;
    char *data;
};

/* touch: fault every page in now (dp_malloc_big), else on first use. */
static struct dp_arena_block *block_new(size_t size, int touch) {
    struct dp_arena_block *b = dp_malloc(sizeof *b);
    if (!b) return NULL;
    b->data = touch ? dp_malloc_big(size) : dp_malloc(size);
    if (!b->data) {
        dp_free(b);
        return NULL;
    }
    b->prev = NULL;
    b->size = size;
    b->used = 0;
    return b;
}

static void blocks_free(struct dp_arena_block *b) {
    while (b) {
        struct dp_arena_block *p = b->prev;
        dp_free(b->data);
        dp_free(b);
        b = p;
    }
}

int dp_arena_init(struct dp_arena *a, size_t initial_bytes) {
    memset(a, 0, sizeof *a);
    if (initial_bytes < 4096) initial_bytes = 4096;
    a->head = block_new(initial_bytes, 1);
    if (!a->head) return dp_seterr(DP_ENOMEM, "arena: cannot allocate %zu bytes", initial_bytes);
    a->capacity_total = initial_bytes;
    return DP_OK;
}

void *dp_arena_alloc(struct dp_arena *a, size_t bytes) {
    bytes = (bytes + 63) & ~(size_t)63;
    struct dp_arena_block *b = a->head;
    if (!b || b->size - b->used < bytes) {
        /* Chain a new block: at least double the capacity, so a growing step
         * needs few blocks; the next reset merges them into one. */
        size_t sz = a->capacity_total > bytes ? a->capacity_total : bytes;
        struct dp_arena_block *nb = block_new(sz, 0);
        if (!nb) {
            dp_seterr(DP_ENOMEM, "arena: cannot allocate %zu bytes", sz);
            return NULL;
        }
        nb->prev = b;
        a->head = nb;
        a->capacity_total += sz;
        b = nb;
    }
    void *p = b->data + b->used;
    b->used += bytes;
    a->used_total += bytes;
    if (a->used_total > a->high_water) a->high_water = a->used_total;
    return p;
}

void *dp_arena_calloc(struct dp_arena *a, size_t bytes) {
    void *p = dp_arena_alloc(a, bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

void dp_arena_reset(struct dp_arena *a) {
    if (a->head && (a->head->prev || a->capacity_total < a->high_water)) {
        /* More than one block, or one smaller than the step's peak (a block
         * chained inside a released scope is gone again): replace all by one
         * of the high-water size. */
        blocks_free(a->head);
        a->head = block_new(a->high_water, 1);
        a->capacity_total = a->head ? a->high_water : 0;
    } else if (a->head) {
        a->head->used = 0;
    }
    a->used_total = 0;
}

struct dp_arena_mark dp_arena_mark(const struct dp_arena *a) {
    struct dp_arena_mark m = {a->head, a->head ? a->head->used : 0, a->used_total};
    return m;
}

void dp_arena_release(struct dp_arena *a, struct dp_arena_mark m) {
    /* blocks chained after the mark hold only what was allocated since */
    while (a->head && a->head != m.block) {
        struct dp_arena_block *b = a->head;
        a->head = b->prev;
        a->capacity_total -= b->size;
        dp_free(b->data);
        dp_free(b);
    }
    if (a->head) a->head->used = m.used;
    a->used_total = m.used_total;
}

void dp_arena_free(struct dp_arena *a) {
    blocks_free(a->head);
    memset(a, 0, sizeof *a);
}
